//! Maps, load-time settings and the per-socket state machine shared by
//! every hook.
//!
//! State lives in socket-local storage (`BPF_MAP_TYPE_SK_STORAGE`, 5.2+;
//! usable from BTF tracing programs since 5.11): it is created with the
//! socket's first event and freed by the kernel with the socket, so a
//! reallocated socket never inherits another's state. Every hook that
//! changes it runs under the socket's lock (process context holds
//! `lock_sock`, softirq holds the spinlock and defers to the owner), so a
//! request is resolved exactly once.
//!
//! Definitions follow TCP sequence state, not syscall returns:
//! - a **request** is outstanding from our first write after the last
//!   byte we received (`req_snd_seq` = `write_seq`, `req_rcv_seq` =
//!   `rcv_nxt` at that write) until any byte arrives beyond `req_rcv_seq`;
//! - a **reuse** is a request written after at least `MIN_IDLE_NS` with no
//!   data either way;
//! - a byte that arrived before the request write (a server's goodbye
//!   line read only now) is not a response;
//! - a write after the application read the peer's EOF is no request
//!   (`tcp_recvmsg` moves `copied_seq` past the FIN when it returns the
//!   end of stream): it answers the close (a `close_notify`);
//! - a small write and our close right after it are part of the close
//!   (`close_notify`), unless the write went out with the peer's FIN
//!   still unread and the application read the EOF only after it: that
//!   was a request, and it failed.
//!
//! Split by concern: [`bits`] (the leaf every other file imports), [`maps`], [`arrival`], [`bytes`], [`clock`], [`kernel`], [`sock`], [`emit`], [`first_bytes`], [`death`], [`requests`], [`closes`].

mod arrival;
mod bits;
mod bytes;
mod clock;
mod closes;
mod death;
mod emit;
mod first_bytes;
mod kernel;
mod maps;
mod requests;
mod sock;

pub(crate) use arrival::{on_reset_arrived, on_synack};
pub(crate) use bits::last_activity;
pub(crate) use clock::{busy_write_time, now, receive_time, receive_time_cast, start_busy_write};
pub(crate) use closes::{on_local_close, on_peer_fin, on_peer_rst};
pub(crate) use death::{on_destroy, on_failed_write, write_fails};
pub(crate) use first_bytes::{first_write, second_flight, HELLO_FIRST, HELLO_TLS_AFTER_CCS, HELLO_TLS_NEXT};
pub(crate) use kernel::{direct, exe_file, field, is_full_close, sk_protocol};
pub(crate) use maps::{global, storage_map, FILES_OF, MAPPED_SCRATCH, OFFSETS};
pub(crate) use requests::{on_closed, on_read, on_send};
pub(crate) use sock::{
    adopt, enter_listener, is_own_process, listening, netns_read, on_established, on_retransmit, on_send_reset,
    set_process, stopped_listening, storage,
};

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
//! Split by concern: [`maps`], [`bytes`], [`clock`], [`kernel`], [`sock`], [`emit`], [`hello`], [`death`], [`requests`], [`closes`].

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_SK_STORAGE_GET_F_CREATE,
    btf_maps::SkStorage,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_boot_ns, bpf_ktime_get_ns,
        bpf_probe_read_kernel, bpf_probe_read_user,
        generated::{
            bpf_get_current_cgroup_id, bpf_get_current_comm as bpf_get_current_comm_raw, bpf_jiffies64,
            bpf_probe_read_kernel as bpf_probe_read_kernel_raw, bpf_probe_read_user as bpf_probe_read_user_raw,
            bpf_sk_storage_get, bpf_skc_to_tcp_sock,
        },
    },
    macros::{btf_map, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use observer_common::{
    busy, counter, dead, flags, how, kind, outcome, role, watch, ClosedIdle, DoomedRecord, Event, Hello, Offsets,
    SockState, TupleKey, AF_INET, AF_INET6, CONTROL_FRAME_BYTES, HELLO_BYTES,
};

mod bytes;
mod clock;
mod closes;
mod death;
mod emit;
mod hello;
mod kernel;
mod maps;
mod requests;
mod sock;

#[allow(clippy::wildcard_imports, unused_imports, reason = "the probes name these as `common::...`")]
pub use bytes::*;
#[allow(clippy::wildcard_imports, unused_imports, reason = "the probes name these as `common::...`")]
pub use clock::*;
#[allow(clippy::wildcard_imports, unused_imports, reason = "the probes name these as `common::...`")]
pub use closes::*;
#[allow(clippy::wildcard_imports, unused_imports, reason = "the probes name these as `common::...`")]
pub use death::*;
#[allow(clippy::wildcard_imports, unused_imports, reason = "the probes name these as `common::...`")]
pub use emit::*;
#[allow(clippy::wildcard_imports, unused_imports, reason = "the probes name these as `common::...`")]
pub use hello::*;
#[allow(clippy::wildcard_imports, unused_imports, reason = "the probes name these as `common::...`")]
pub use kernel::*;
#[allow(clippy::wildcard_imports, unused_imports, reason = "the probes name these as `common::...`")]
pub use maps::*;
#[allow(clippy::wildcard_imports, unused_imports, reason = "the probes name these as `common::...`")]
pub use requests::*;
#[allow(clippy::wildcard_imports, unused_imports, reason = "the probes name these as `common::...`")]
pub use sock::*;

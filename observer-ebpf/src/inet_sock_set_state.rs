//! `tp_btf/inet_sock_set_state` (4.16+; args `sk`, `oldstate`,
//! `newstate`): establishment (role), the peer's FIN (`ESTABLISHED ->
//! CLOSE_WAIT`), our close, and the final `CLOSE`; `connect()` (`CLOSE ->
//! SYN_SENT`) records the connecting process and its cgroup, and whether
//! it runs the daemon's own executable (`observer probe`); `listen()`
//! and a listener's close keep the table of listening ports. Addresses come from
//! `struct sock_common` at BTF offsets, once per connection, by direct
//! loads from the hook's BTF `struct sock *` (no helper call).

use core::ffi::c_void;

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use observer_common::{how, tcp_state as S, IPPROTO_TCP, PROBE_THREAD_COMM};

use crate::common::{
    adopt, is_full_close, is_own_process, listening, now, on_closed, on_established, on_local_close, on_peer_fin,
    set_process, sk_protocol, stopped_listening, storage,
};

observer_common::named_as!(inet_sock_set_state, INET_SOCK_SET_STATE);

#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn inet_sock_set_state(ctx: BtfTracePointContext) -> i32 {
    let sk: *mut c_void = ctx.arg(0);
    let old: i32 = ctx.arg(1);
    let new: i32 = ctx.arg(2);
    if sk.is_null() || sk_protocol(sk) != IPPROTO_TCP {
        return 0;
    }
    // The clock is read only by the transitions that use it (not by
    // `connect()`, `FIN_WAIT1 -> FIN_WAIT2` or `TIME_WAIT`).
    if old == S::CLOSE && new == S::SYN_SENT {
        // `connect()` runs in the connecting process: record it (and its
        // cgroup) now, so a pooled connection that is closed before its
        // first write still has an owner. The addresses are not final yet;
        // `on_established` fills them in.
        if let Some(st) = storage(sk, true) {
            set_process(st);
            // `observer probe`'s own connection, told by its executable;
            // only a thread named as the probe's pays the check.
            if st.comm == PROBE_THREAD_COMM {
                st.own = u8::from(is_own_process());
            }
        }
    } else if new == S::ESTABLISHED && (old == S::SYN_SENT || old == S::SYN_RECV) {
        on_established(sk, old == S::SYN_SENT, now());
    } else if old == S::ESTABLISHED && new == S::CLOSE_WAIT {
        if let Some(st) = adopt(sk) {
            on_peer_fin(sk, st, now());
        }
    } else if (old == S::ESTABLISHED && new == S::FIN_WAIT1 && is_full_close(sk))
        || (old == S::CLOSE_WAIT && new == S::LAST_ACK)
    {
        if let Some(st) = adopt(sk) {
            on_local_close(sk, st, now(), how::LOCAL_CLOSE);
        }
    } else if new == S::CLOSE && old != S::LISTEN && old != S::SYN_SENT && old != S::SYN_RECV {
        if let Some(st) = storage(sk, false) {
            on_closed(sk, st, old, now());
        }
    } else if new == S::LISTEN {
        listening(sk);
    } else if old == S::LISTEN && new == S::CLOSE {
        // Not `LISTEN -> SYN_RECV`: that is a connection the listener
        // accepted, cloned from it with its state.
        stopped_listening(sk);
    }
    0
}

//! Raw tracepoint `tcp_sendmsg_locked` (kernel 6.5+; args: `sk`, `msg`,
//! `skb`, `size_goal`): fires inside `tcp_sendmsg_locked` as payload is
//! queued, *before* it is pushed to the wire. Hooking here rather than at
//! `sock:sock_send_length` (which fires when the syscall returns) matters:
//! on a fast path the peer's RST to the write can arrive, and close the
//! socket, before `sendmsg` returns.
//!
//! Hot path: one map lookup and a timestamp; state only, never an event.

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};
use observer_common::counter;

use crate::common::{adopt, count, last_activity, min_idle_ns, now, set_process, sk_family, SOCKS};

#[raw_tracepoint(tracepoint = "tcp_sendmsg_locked")]
pub fn tcp_sendmsg_locked(ctx: RawTracePointContext) -> i32 {
    let sk: u64 = ctx.arg(0);
    if sk == 0 {
        return 0;
    }
    let now = now();
    let p = if let Some(p) = SOCKS.get_ptr_mut(sk) {
        p
    } else {
        // A socket established before the probes attached.
        match adopt(sk, sk_family(sk)) {
            Some(p) => p,
            None => return 0,
        }
    };
    // SAFETY: pointer from a successful map lookup.
    let st = unsafe { &mut *p };
    let last = last_activity(st);
    let idle = if last != 0 { now.saturating_sub(last) } else { 0 };
    if last != 0 && idle >= min_idle_ns() {
        if st.reuse_ns != 0 {
            // The previous reuse never saw an outcome (a one-way write).
            count(counter::REUSE_UNRESOLVED);
        }
        st.reuse_ns = now;
        st.reuse_idle_ns = idle;
        st.retransmits = 0;
        set_process(st);
    } else if st.tgid == 0 {
        set_process(st);
    }
    st.last_send_ns = now;
    0
}

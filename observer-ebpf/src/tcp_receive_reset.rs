//! `tcp:tcp_receive_reset` (kernel 4.16+): an RST arrived. Resolves a pending
//! reuse as `reset`, or reports a peer reset on an idle socket.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use observer_common::{how, kind, outcome};

use crate::common::{emit, last_activity, min_idle_ns, now, resolve_reuse, SOCKS, ST_PEER_RST};

#[tracepoint(category = "tcp", name = "tcp_receive_reset")]
pub fn tcp_receive_reset(ctx: TracePointContext) -> u32 {
    // SAFETY: offset from /sys/kernel/tracing/events/tcp/tcp_receive_reset/format.
    let sk = unsafe { ctx.read_at::<u64>(8).unwrap_or(0) };
    let Some(p) = SOCKS.get_ptr_mut(sk) else {
        return 0;
    };
    // SAFETY: pointer from a successful map lookup.
    let st = unsafe { &mut *p };
    let now = now();
    st.flags |= ST_PEER_RST;
    if st.reuse_ns != 0 {
        resolve_reuse(sk, st, now, outcome::RESET, how::RST);
        return 0;
    }
    let last = last_activity(st);
    if st.peer_fin_ns == 0 && last != 0 && now.saturating_sub(last) >= min_idle_ns() {
        emit(sk, st, kind::PEER_CLOSE, now, |e| e.how = how::RST);
    }
    0
}

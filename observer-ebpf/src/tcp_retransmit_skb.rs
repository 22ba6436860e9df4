//! `tcp:tcp_retransmit_skb` (kernel 4.16+): counts retransmits of a pending
//! reuse write; the count decides whether an unanswered reuse is a stall.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};

use crate::common::SOCKS;

#[tracepoint(category = "tcp", name = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb(ctx: TracePointContext) -> u32 {
    // SAFETY: offset from /sys/kernel/tracing/events/tcp/tcp_retransmit_skb/format.
    let sk = unsafe { ctx.read_at::<u64>(16).unwrap_or(0) };
    if let Some(p) = SOCKS.get_ptr_mut(sk) {
        // SAFETY: pointer from a successful map lookup.
        let st = unsafe { &mut *p };
        if st.reuse_ns != 0 {
            st.retransmits += 1;
        }
    }
    0
}

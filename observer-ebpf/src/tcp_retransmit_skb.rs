//! `tp_btf/tcp_retransmit_skb` (4.16+; args `sk`, `skb`): counts
//! retransmits of an outstanding request; a reuse is a `stall` only if its
//! bytes were retransmitted and are still unacknowledged at the end.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

use crate::common::{on_retransmit, storage};

observer_common::named_as!(tcp_retransmit_skb, TCP_RETRANSMIT_SKB);

#[btf_tracepoint(function = "tcp_retransmit_skb")]
pub fn tcp_retransmit_skb(ctx: BtfTracePointContext) -> i32 {
    if let Some(st) = storage(ctx.arg(0), false) {
        on_retransmit(st);
    }
    0
}

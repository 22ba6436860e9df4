//! `tp_btf/tcp_receive_reset` (4.16+; arg `sk`): an RST arrived. Decides a
//! pending request by sequence state: data beyond the request first = `ok`
//! (closed after the response), otherwise a failed reuse or an aborted
//! request; on an idle socket, a peer reset.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

use crate::common::{now, on_peer_rst, storage};

observer_common::named_as!(tcp_receive_reset, TCP_RECEIVE_RESET);

#[btf_tracepoint(function = "tcp_receive_reset")]
pub fn tcp_receive_reset(ctx: BtfTracePointContext) -> i32 {
    let sk = ctx.arg(0);
    if let Some(st) = storage(sk, false) {
        on_peer_rst(sk, st, now());
    }
    0
}

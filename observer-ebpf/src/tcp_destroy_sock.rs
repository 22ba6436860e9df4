//! `tp_btf/tcp_destroy_sock` (5.3+; arg `sk`): a TCP socket is destroyed.
//! A socket reset or timed out while idle is already `CLOSE`, so the
//! application's `close()` changes no state; it destroys the socket here,
//! in the closing process. If nothing was written on it since it died, the
//! pool discarded a dead socket (`discarded_dead`) instead of failing on
//! it. Once per connection, never on the hot path.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

use crate::common::{now, on_destroy, storage};

observer_common::named_as!(tcp_destroy_sock, TCP_DESTROY_SOCK);

#[btf_tracepoint(function = "tcp_destroy_sock")]
pub fn tcp_destroy_sock(ctx: BtfTracePointContext) -> i32 {
    let sk = ctx.arg(0);
    if let Some(st) = storage(sk, false) {
        on_destroy(sk, st, now());
    }
    0
}

//! `fexit/tcp_finish_connect` (args `sk`, `skb`: the peer's SYN-ACK, NULL
//! in repair mode; `fexit` on `x86_64` 5.5+, arm64 6.4+): a client's
//! connection is established. After the state hook set the socket up, it
//! records how far the peer's SYN-ACK came (its TTL, by loopback or not):
//! the reference a later RST is compared with. Once per connection.

use aya_ebpf::{macros::fexit, programs::FExitContext};

use crate::common::{on_synack, storage};

observer_common::named_as!(fexit_tcp_finish_connect, FEXIT_TCP_FINISH_CONNECT);

#[fexit(function = "tcp_finish_connect")]
pub fn fexit_tcp_finish_connect(ctx: FExitContext) -> i32 {
    let sk = ctx.arg(0);
    if let Some(st) = storage(sk, false) {
        on_synack(st, ctx.arg(1));
    }
    0
}

//! `fentry/tcp_reset` (5.13+: args `sk`, `skb`; `fentry` on `x86_64` 5.5+,
//! arm64 6.4+): an RST arrived and the kernel is about to act on it. Runs
//! before the `tcp_receive_reset` tracepoint inside the same function and
//! records how the RST arrived (its TTL, by loopback or not), so the
//! events the reset causes say who sent it. Once per received RST.

use aya_ebpf::{macros::fentry, programs::FEntryContext};

use crate::common::{on_reset_arrived, storage};

observer_common::named_as!(fentry_tcp_reset, FENTRY_TCP_RESET);

#[fentry(function = "tcp_reset")]
pub fn fentry_tcp_reset(ctx: FEntryContext) -> i32 {
    let sk = ctx.arg(0);
    if let Some(st) = storage(sk, false) {
        on_reset_arrived(st, ctx.arg(1));
    }
    0
}

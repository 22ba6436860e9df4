//! `tp_btf/tcp_send_reset` (4.16+; args `sk`, `skb`, and a reason from
//! 6.10): the kernel answers a segment with an RST. When `sk` (a full or
//! time-wait socket) is a connection our server side closed idle, a client
//! wrote on it after our close: `late_reuse`, the race seen from the
//! server. With no socket left at all (`sk` NULL) nothing is reported.
//!
//! Before 6.9 the tracepoint skips time-wait sockets, so the `fentry` probe
//! set hooks `tcp_v4_send_reset`/`tcp_v6_send_reset` (their `sk` is the
//! same) with the same body.

use core::ffi::c_void;

use aya_ebpf::{
    macros::{btf_tracepoint, fentry},
    programs::{BtfTracePointContext, FEntryContext},
};

use crate::common::{now, on_send_reset};

observer_common::named_as!(tcp_send_reset, TCP_SEND_RESET);

#[btf_tracepoint(function = "tcp_send_reset")]
pub fn tcp_send_reset(ctx: BtfTracePointContext) -> i32 {
    let sk: *const c_void = ctx.arg(0);
    if !sk.is_null() {
        on_send_reset(sk, now());
    }
    0
}

observer_common::named_as!(fentry_tcp_v4_send_reset, FENTRY_TCP_V4_SEND_RESET);

#[fentry(function = "tcp_v4_send_reset")]
pub fn fentry_tcp_v4_send_reset(ctx: FEntryContext) -> i32 {
    let sk: *const c_void = ctx.arg(0);
    if !sk.is_null() {
        on_send_reset(sk, now());
    }
    0
}

observer_common::named_as!(fentry_tcp_v6_send_reset, FENTRY_TCP_V6_SEND_RESET);

#[fentry(function = "tcp_v6_send_reset")]
pub fn fentry_tcp_v6_send_reset(ctx: FEntryContext) -> i32 {
    let sk: *const c_void = ctx.arg(0);
    if !sk.is_null() {
        on_send_reset(sk, now());
    }
    0
}

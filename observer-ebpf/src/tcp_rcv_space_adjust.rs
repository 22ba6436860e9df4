//! Receive hook, hot path: `tp_btf/tcp_rcv_space_adjust` (4.16+) fires in
//! `tcp_recvmsg` under the socket lock each time data is copied to the
//! application; a zero-length read or an end-of-stream read does not fire
//! it, so neither can pass for a response or an EOF.
//!
//! Cost: one socket-local storage lookup (no create) and one load
//! (`tcp_clock_cache`, the arrival time) per read, no clock call; one field
//! read (`rcv_nxt`) while a request is outstanding after a quiet spell. On
//! 6.2+ `tcp_rcv_space_adjust_cast` reaches `tcp_sock` through the
//! `bpf_rdonly_cast` kfunc (inlined by the verifier) instead of the
//! `bpf_skc_to_tcp_sock` helper: one helper call fewer per read.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

use crate::common::{on_read, receive_time, receive_time_cast, storage};

observer_common::named_as!(tcp_rcv_space_adjust, TCP_RCV_SPACE_ADJUST);

#[btf_tracepoint(function = "tcp_rcv_space_adjust")]
pub fn tcp_rcv_space_adjust(ctx: BtfTracePointContext) -> i32 {
    let sk = ctx.arg(0);
    if let Some(st) = storage(sk, false) {
        on_read(sk, st, receive_time(sk));
    }
    0
}

observer_common::named_as!(tcp_rcv_space_adjust_cast, TCP_RCV_SPACE_ADJUST_CAST);

#[btf_tracepoint(function = "tcp_rcv_space_adjust")]
pub fn tcp_rcv_space_adjust_cast(ctx: BtfTracePointContext) -> i32 {
    let sk = ctx.arg(0);
    if let Some(st) = storage(sk, false) {
        on_read(sk, st, receive_time_cast(sk));
    }
    0
}

//! `sock:inet_sk_error_report` (kernel 5.14+): remembers the last TCP error on
//! this CPU, so the `CLOSE` that `tcp_write_err` causes right after can tell a
//! kernel timeout (`ETIMEDOUT`) from a local abort. The record has no socket
//! pointer; ports and a 1 ms window identify the socket.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use observer_common::IPPROTO_TCP;

use crate::common::{now, LAST_ERROR};

#[tracepoint(category = "sock", name = "inet_sk_error_report")]
pub fn inet_sk_error_report(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets from /sys/kernel/tracing/events/sock/inet_sk_error_report/format.
    let (error, sport, dport, protocol) = unsafe {
        (
            ctx.read_at::<i32>(8).unwrap_or(0),
            ctx.read_at::<u16>(12).unwrap_or(0),
            ctx.read_at::<u16>(14).unwrap_or(0),
            ctx.read_at::<u16>(18).unwrap_or(0),
        )
    };
    if protocol != IPPROTO_TCP {
        return 0;
    }
    if let Some(slot) = LAST_ERROR.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        unsafe {
            (*slot).ts_ns = now();
            (*slot).error = error;
            (*slot).sport = sport;
            (*slot).dport = dport;
        }
    }
    0
}

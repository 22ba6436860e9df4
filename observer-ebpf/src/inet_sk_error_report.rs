//! `sock:inet_sk_error_report` (kernel 5.14+): tells a kernel timeout
//! (`ETIMEDOUT`, or the soft error that replaced it) from a local abort when
//! a socket with a pending reuse reaches `CLOSE`. Before 6.10 the report
//! comes just before the `CLOSE` (remembered here for it); from 6.10 on,
//! `tcp_done_with_error` reports just after it (resolved here). The record
//! has no socket pointer; the CPU, the ports and a 1 ms window identify the
//! socket.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use observer_common::IPPROTO_TCP;

use crate::common::{now, resolve_on_end, LAST_ERROR, PENDING_CLOSE, SOCKS, ST_CLOSE_PENDING, ST_LOCAL_CLOSED};
use observer_common::how;

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
    let now = now();
    if let Some(slot) = LAST_ERROR.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        unsafe {
            (*slot).ts_ns = now;
            (*slot).error = error;
            (*slot).sport = sport;
            (*slot).dport = dport;
        }
    }
    let Some(pending) = PENDING_CLOSE.get_ptr_mut(0) else { return 0 };
    // SAFETY: per-CPU slot.
    let [sk, ts] = unsafe { *pending };
    if sk == 0 || error == 0 || now.saturating_sub(ts) >= 1_000_000 {
        return 0;
    }
    if let Some(p) = SOCKS.get_ptr_mut(sk) {
        // SAFETY: pointer from a successful map lookup.
        let st = unsafe { &mut *p };
        if st.flags & ST_CLOSE_PENDING != 0 && st.sport == sport && st.dport == dport {
            st.flags = (st.flags & !ST_CLOSE_PENDING) | ST_LOCAL_CLOSED;
            resolve_on_end(sk, st, now, how::TIMEOUT);
            // SAFETY: per-CPU slot.
            unsafe { *pending = [0, 0] };
        }
    }
    0
}

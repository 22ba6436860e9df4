//! `tcp:tcp_destroy_sock` (kernel 4.16+): the socket is gone. Resolves a
//! pending reuse that never saw an outcome and frees the socket's map entry.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use observer_common::{flags, how, kind};

use crate::common::{emit, now, resolve_on_end, SOCKS, ST_CLOSE_PENDING};

#[tracepoint(category = "tcp", name = "tcp_destroy_sock")]
pub fn tcp_destroy_sock(ctx: TracePointContext) -> u32 {
    // SAFETY: offset from /sys/kernel/tracing/events/tcp/tcp_destroy_sock/format.
    let sk = unsafe { ctx.read_at::<u64>(8).unwrap_or(0) };
    if let Some(p) = SOCKS.get_ptr_mut(sk) {
        // SAFETY: pointer from a successful map lookup.
        let st = unsafe { &mut *p };
        let now = now();
        if st.flags & ST_CLOSE_PENDING != 0 {
            // A CLOSE nobody explained (no error report followed) was a
            // local abort (SO_LINGER 0, or close with unread data).
            resolve_on_end(sk, st, now, how::LOCAL_CLOSE);
            emit(sk, st, kind::LOCAL_CLOSE, now, |e| e.flags |= flags::REQUEST_OUTSTANDING);
        } else {
            resolve_on_end(sk, st, now, how::DESTROYED);
        }
        let _ = SOCKS.remove(sk);
    }
    0
}

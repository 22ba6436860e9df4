//! `tcp:tcp_destroy_sock` (kernel 4.16+): the socket is gone. Resolves a
//! pending reuse that never saw an outcome and frees the socket's map entry.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use observer_common::how;

use crate::common::{now, resolve_on_end, SOCKS, ST_CLOSE_PENDING};

#[tracepoint(category = "tcp", name = "tcp_destroy_sock")]
pub fn tcp_destroy_sock(ctx: TracePointContext) -> u32 {
    // SAFETY: offset from /sys/kernel/tracing/events/tcp/tcp_destroy_sock/format.
    let sk = unsafe { ctx.read_at::<u64>(8).unwrap_or(0) };
    if let Some(p) = SOCKS.get_ptr_mut(sk) {
        // SAFETY: pointer from a successful map lookup.
        let st = unsafe { &mut *p };
        // A CLOSE nobody explained (no error report followed) was a local abort.
        let ended = if st.flags & ST_CLOSE_PENDING != 0 { how::LOCAL_CLOSE } else { how::DESTROYED };
        resolve_on_end(sk, st, now(), ended);
        let _ = SOCKS.remove(sk);
    }
    0
}

//! Raw tracepoint `sock_recv_length` (kernel 6.3+; args: `sk`, `ret`,
//! `flags`): every receive on every socket, when the syscall returns.
//! Hot path: one map lookup (only sockets in the table are TCP sockets we
//! follow) and a timestamp; an event only when it resolves a pending reuse
//! (payload = `ok`, end of stream = `eof`).

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};
use observer_common::{how, outcome};

use crate::common::{now, resolve_reuse, stall_after_ns, SOCKS};

#[raw_tracepoint(tracepoint = "sock_recv_length")]
pub fn sock_recv_length(ctx: RawTracePointContext) -> i32 {
    // `ret` is an int; the raw argument carries it in the low 32 bits.
    // Errors (EAGAIN from non-blocking reads above all) leave before the
    // map lookup.
    let raw: u64 = ctx.arg(1);
    let ret = (raw as u32).cast_signed();
    if ret < 0 {
        return 0;
    }
    let sk: u64 = ctx.arg(0);
    let Some(p) = SOCKS.get_ptr_mut(sk) else { return 0 };
    let now = now();
    // SAFETY: pointer from a successful map lookup.
    let st = unsafe { &mut *p };
    if ret > 0 {
        if st.reuse_ns != 0 {
            if st.retransmits > 0 && now.saturating_sub(st.reuse_ns) >= stall_after_ns() {
                resolve_reuse(sk, st, now, outcome::STALL, how::RESPONSE);
            } else {
                resolve_reuse(sk, st, now, outcome::OK, how::NONE);
            }
        }
        st.last_recv_ns = now;
    } else if st.reuse_ns != 0 {
        // The application read end of stream after its reuse write.
        resolve_reuse(sk, st, now, outcome::EOF, how::FIN);
    }
    0
}

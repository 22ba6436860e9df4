//! `sock:sock_recv_length` (kernel 6.3+): every receive on every socket.
//! Hot path: one map lookup and a timestamp; an event only when it resolves
//! a pending reuse (payload = `ok`, end of stream = `eof`).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use observer_common::{how, outcome, IPPROTO_TCP};

use crate::common::{adopt, now, resolve_reuse, stall_after_ns, SOCKS};

#[tracepoint(category = "sock", name = "sock_recv_length")]
pub fn sock_recv_length(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets from /sys/kernel/tracing/events/sock/sock_recv_length/format.
    let (protocol, ret) = unsafe {
        (
            ctx.read_at::<u16>(18).unwrap_or(0),
            ctx.read_at::<i32>(20).unwrap_or(0),
        )
    };
    if protocol != IPPROTO_TCP || ret < 0 {
        return 0;
    }
    // SAFETY: as above.
    let sk = unsafe { ctx.read_at::<u64>(8).unwrap_or(0) };
    let now = now();
    let p = match SOCKS.get_ptr_mut(sk) {
        Some(p) => p,
        None if ret > 0 => {
            // SAFETY: as above.
            let family = unsafe { ctx.read_at::<u16>(16).unwrap_or(0) };
            match adopt(sk, family, now) {
                Some(p) => p,
                None => return 0,
            }
        }
        None => return 0,
    };
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

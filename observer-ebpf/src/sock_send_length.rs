//! `sock:sock_send_length` (kernel 6.3+): every successful send on every
//! socket. Hot path: one map lookup and a timestamp; an event only when a
//! write follows at least `min_idle` of silence (a reuse).

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use observer_common::{counter, IPPROTO_TCP};

use crate::common::{adopt, count, last_activity, min_idle_ns, now, set_process, SOCKS};

#[tracepoint(category = "sock", name = "sock_send_length")]
pub fn sock_send_length(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets from /sys/kernel/tracing/events/sock/sock_send_length/format.
    let (protocol, ret) = unsafe {
        (
            ctx.read_at::<u16>(18).unwrap_or(0),
            ctx.read_at::<i32>(20).unwrap_or(0),
        )
    };
    if protocol != IPPROTO_TCP || ret <= 0 {
        return 0;
    }
    // SAFETY: as above.
    let sk = unsafe { ctx.read_at::<u64>(8).unwrap_or(0) };
    let now = now();
    let p = if let Some(p) = SOCKS.get_ptr_mut(sk) {
        p
    } else {
        // SAFETY: as above.
        let family = unsafe { ctx.read_at::<u16>(16).unwrap_or(0) };
        match adopt(sk, family, now) {
            Some(p) => p,
            None => return 0,
        }
    };
    // SAFETY: pointer from a successful map lookup.
    let st = unsafe { &mut *p };
    let last = last_activity(st);
    let idle = if last != 0 {
        now.saturating_sub(last)
    } else {
        0
    };
    if last != 0 && idle >= min_idle_ns() {
        if st.reuse_ns != 0 {
            // The previous reuse never saw an outcome (a one-way write).
            count(counter::REUSE_UNRESOLVED);
        }
        st.reuse_ns = now;
        st.reuse_idle_ns = idle;
        st.retransmits = 0;
        set_process(st);
    } else if st.tgid == 0 {
        set_process(st);
    }
    st.last_send_ns = now;
    0
}

//! `sock:inet_sock_set_state` (kernel 4.16+): connection establishment (role),
//! the peer's FIN (`ESTABLISHED -> CLOSE_WAIT`), local closes and the final
//! `CLOSE`. The record carries the 4-tuple, so no struct reads are needed.

use aya_ebpf::{macros::tracepoint, programs::TracePointContext};
use observer_common::{counter, flags, how, kind, outcome, role, tcp_state as S, SockState, IPPROTO_TCP};

use crate::common::{
    emit, last_activity, min_idle_ns, now, read_tuple, resolve_on_end, resolve_reuse, track, TupleOffsets, LAST_ERROR,
    PENDING_CLOSE, SOCKS, ST_CLOSE_PENDING, ST_LOCAL_CLOSED, ST_PEER_RST,
};

const OFF: TupleOffsets =
    TupleOffsets { sport: 24, dport: 26, family: 28, saddr: 32, daddr: 36, saddr_v6: 40, daddr_v6: 56 };

#[tracepoint(category = "sock", name = "inet_sock_set_state")]
pub fn inet_sock_set_state(ctx: TracePointContext) -> u32 {
    // SAFETY: offsets from /sys/kernel/tracing/events/sock/inet_sock_set_state/format.
    let (protocol, sk, old, new) = unsafe {
        (
            ctx.read_at::<u16>(30).unwrap_or(0),
            ctx.read_at::<u64>(8).unwrap_or(0),
            ctx.read_at::<i32>(16).unwrap_or(0),
            ctx.read_at::<i32>(20).unwrap_or(0),
        )
    };
    if protocol != IPPROTO_TCP || sk == 0 {
        return 0;
    }
    let now = now();
    if new == S::ESTABLISHED && (old == S::SYN_SENT || old == S::SYN_RECV) {
        established(&ctx, sk, old, now);
    } else if old == S::ESTABLISHED && new == S::CLOSE_WAIT {
        peer_fin(&ctx, sk, now);
    } else if (old == S::ESTABLISHED && new == S::FIN_WAIT1) || (old == S::CLOSE_WAIT && new == S::LAST_ACK) {
        local_close(&ctx, sk, now, how::LOCAL_CLOSE);
    } else if new == S::CLOSE {
        closed(&ctx, sk, old, now);
    }
    0
}

fn established(ctx: &TracePointContext, sk: u64, old: i32, now: u64) {
    let mut st = SockState::ZERO;
    if !read_tuple(ctx, &OFF, &mut st) {
        return;
    }
    st.role = if old == S::SYN_SENT { role::CLIENT } else { role::SERVER };
    // Establishment counts as activity: a connection opened and then left
    // idle in a pool ages from here.
    st.last_recv_ns = now;
    if SOCKS.insert(sk, st, 0).is_err() {
        crate::common::count(counter::MAP_FULL);
    }
    emit(sk, &st, kind::ESTABLISHED, now, |e| e.idle_ns = 0);
}

fn state_for(ctx: &TracePointContext, sk: u64) -> Option<*mut SockState> {
    if let Some(p) = SOCKS.get_ptr_mut(sk) {
        return Some(p);
    }
    // The record carries the addresses: no struct reads needed.
    let mut st = SockState::ZERO;
    if !read_tuple(ctx, &OFF, &mut st) {
        return None;
    }
    st.flags = flags::PREEXISTING;
    track(sk, &st)
}

fn peer_fin(ctx: &TracePointContext, sk: u64, now: u64) {
    let Some(p) = state_for(ctx, sk) else {
        return;
    };
    // SAFETY: pointer from a successful map lookup.
    let st = unsafe { &mut *p };
    st.peer_fin_ns = now;
    if st.reuse_ns != 0 {
        resolve_reuse(sk, st, now, outcome::EOF, how::FIN);
        return;
    }
    let last = last_activity(st);
    if last != 0 && now.saturating_sub(last) >= min_idle_ns() {
        emit(sk, st, kind::PEER_CLOSE, now, |e| e.how = how::FIN);
    }
}

fn local_close(ctx: &TracePointContext, sk: u64, now: u64, ended: u8) {
    let Some(p) = state_for(ctx, sk) else {
        return;
    };
    // SAFETY: pointer from a successful map lookup.
    let st = unsafe { &mut *p };
    if st.flags & ST_LOCAL_CLOSED != 0 {
        return;
    }
    st.flags |= ST_LOCAL_CLOSED;
    let outstanding = st.reuse_ns != 0;
    resolve_on_end(sk, st, now, ended);
    let last = last_activity(st);
    if outstanding || (last != 0 && now.saturating_sub(last) >= min_idle_ns()) {
        let peer_first = st.peer_fin_ns != 0 || st.flags & ST_PEER_RST != 0;
        emit(sk, st, kind::LOCAL_CLOSE, now, |e| {
            if outstanding {
                e.flags |= flags::REQUEST_OUTSTANDING;
            }
            if peer_first {
                e.flags |= flags::PEER_CLOSED_FIRST;
            }
        });
    }
}

fn closed(ctx: &TracePointContext, sk: u64, old: i32, now: u64) {
    if old == S::LISTEN || old == S::SYN_SENT || old == S::SYN_RECV {
        return;
    }
    let mut fallback = SockState::ZERO;
    let st: &mut SockState = if let Some(p) = SOCKS.get_ptr_mut(sk) {
        // SAFETY: pointer from a successful map lookup.
        unsafe { &mut *p }
    } else {
        if !read_tuple(ctx, &OFF, &mut fallback) {
            return;
        }
        &mut fallback
    };
    let mut keep = false;
    if (old == S::ESTABLISHED || old == S::CLOSE_WAIT) && st.flags & (ST_PEER_RST | ST_LOCAL_CLOSED) == 0 {
        // Not a reset and not a FIN-first close: either the kernel gave up
        // (its error report came just before on this CPU on kernels before
        // 6.10, or comes right after from 6.10 on) or a local abort.
        let timed_out = LAST_ERROR.get(0).is_some_and(|le| {
            le.error != 0 && le.sport == st.sport && le.dport == st.dport && now.saturating_sub(le.ts_ns) < 1_000_000
        });
        if timed_out {
            st.flags |= ST_LOCAL_CLOSED;
            resolve_on_end(sk, st, now, how::TIMEOUT);
        } else if st.reuse_ns != 0 {
            // Let the error report (or the destroy) tell how this ended;
            // the entry stays until the socket is destroyed.
            st.flags |= ST_CLOSE_PENDING;
            if let Some(slot) = PENDING_CLOSE.get_ptr_mut(0) {
                // SAFETY: per-CPU slot.
                unsafe { *slot = [sk, now] };
            }
            keep = true;
        } else {
            local_close(ctx, sk, now, how::LOCAL_CLOSE);
        }
    }
    let role = st.role;
    emit(sk, st, kind::CLOSED, now, |e| e.role = role);
    if !keep {
        let _ = SOCKS.remove(sk);
    }
}

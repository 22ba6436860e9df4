//! Events to userspace: one ring-buffer record built in place from a
//! socket's state, and when it wakes the reader.

use core::ffi::c_void;

use observer_common::{counter, flags, kind, Event, SockState};

use super::{
    bits::{last_activity, st},
    bytes::{copy16, zero},
    kernel::{keepalive, request_bytes},
    maps::{count, global, EVENTS, RING_BYTES, UNWOKEN},
};

/// Emit one event built from the socket's state. The record is written in
/// place in the ring buffer (no copy on the 512-byte BPF stack).
#[inline(always)]
pub fn emit(sk: *const c_void, st: &SockState, kind: u8, now: u64, fill: impl FnOnce(&mut Event)) {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(counter::RINGBUF_FULL);
        return;
    };
    let p = entry.as_mut_ptr();
    // SAFETY: the reserved slot is valid for one Event.
    let e = unsafe { header(p, sk, st, kind, now) };
    fill(e);
    submit(entry, kind);
}

/// Commit a record, waking the reader as [`wakeup`] says. A record sent
/// without a wakeup marks [`UNWOKEN`] only once it is committed: a mark
/// set before the commit could be taken by evidence on another CPU whose
/// wakeup finds this record still busy, the reader would stop at it, and
/// no later record would wake it (the kernel's default flag wakes only
/// for the first unread record, and this one committed silently).
#[inline(always)]
pub(crate) fn submit<T>(entry: aya_ebpf::maps::ring_buf::RingBufEntry<T>, kind: u8) {
    let flags = wakeup(kind);
    entry.submit(flags);
    if flags == u64::from(aya_ebpf::bindings::BPF_RB_NO_WAKEUP) {
        if let Some(unwoken) = UNWOKEN.get_ptr_mut(0) {
            // Written only when it changes: one slot shared by every CPU,
            // read on each connection, stays in every CPU's cache.
            // SAFETY: an array slot, valid for the program's run.
            unsafe {
                if core::ptr::read_volatile(unwoken) == 0 {
                    core::ptr::write_volatile(unwoken, 1);
                }
            }
        }
    }
}

/// Write an event's header from the socket's state into a reserved slot.
///
/// # Safety
/// `p` must be valid for writes of one `Event`.
#[inline(always)]
pub(crate) unsafe fn header<'a>(p: *mut Event, sk: *const c_void, st: &SockState, kind: u8, now: u64) -> &'a mut Event {
    zero(p);
    // SAFETY: every byte of the slot was just written.
    let e = unsafe { &mut *p };
    e.ts_ns = now;
    e.sock_id = st.id;
    e.kind = kind;
    copy16(&raw mut e.saddr, &raw const st.saddr);
    copy16(&raw mut e.daddr, &raw const st.daddr);
    e.sport = st.sport;
    e.dport = st.dport;
    e.family = st.family;
    e.role = st.role;
    e.tgid = st.tgid;
    copy16(&raw mut e.comm, &raw const st.comm);
    e.cgroup_id = st.cgroup_id;
    e.netns = st.netns;
    e.flags = st.event_flags;
    e.own = st.own;
    e.peer_ttl = st.peer_ttl;
    e.reset_ttl = st.reset_ttl;
    e.ttl_flags = st.ttl_flags;
    if !sk.is_null() && kind != kind::ESTABLISHED && kind != kind::CLOSED && kind != kind::HELLO {
        let (on, jiffies) = keepalive(sk);
        if on {
            e.flags |= flags::KEEPALIVE;
            e.keepalive_jiffies = jiffies;
        }
    }
    let last = last_activity(st);
    if last != 0 && now > last {
        e.idle_ns = now - last;
    }
    e
}

/// How a record wakes the reader.
///
/// A connection's `established`, `closed` and first-bytes records wake it
/// only once an eighth of the ring is waiting: the daemon drains the ring
/// every second anyway, and a wakeup is an `irq_work` interrupt, most of
/// what a connection cost the state-change hook (measured: `cargo xtask
/// bench`, kernel cost under churn).
///
/// Evidence wakes it at once. The ring buffer's default flag wakes the
/// reader only when the record is the first one unread, so behind one
/// unwoken record every later one would stay unread until the daemon's
/// one-second tick: at 50,000 reuses/s that filled the ring and lost
/// 27,000 events a second. So a record sent without a wakeup marks
/// [`UNWOKEN`] once committed ([`submit`]), and the next evidence record
/// forces one and clears the mark; otherwise evidence keeps the default,
/// which wakes a reader that has caught up and spares one that is still
/// reading. Two CPUs racing on the mark cost at most one extra wakeup, or
/// one record read at the next tick when no evidence follows it.
#[inline(always)]
fn wakeup(kind: u8) -> u64 {
    use aya_ebpf::bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP};
    let Some(unwoken) = UNWOKEN.get_ptr_mut(0) else {
        return u64::from(BPF_RB_FORCE_WAKEUP);
    };
    if kind != kind::ESTABLISHED && kind != kind::CLOSED && kind != kind::HELLO {
        // SAFETY: an array slot, valid for the program's run.
        if unsafe { core::ptr::read_volatile(unwoken) } == 0 {
            return 0;
        }
        // SAFETY: as above.
        unsafe { core::ptr::write_volatile(unwoken, 0) };
        return u64::from(BPF_RB_FORCE_WAKEUP);
    }
    let waiting = EVENTS.query(u64::from(BPF_RB_AVAIL_DATA));
    if waiting > global(&raw const RING_BYTES) / 8 {
        // SAFETY: as above.
        unsafe {
            if core::ptr::read_volatile(unwoken) != 0 {
                core::ptr::write_volatile(unwoken, 0);
            }
        }
        u64::from(BPF_RB_FORCE_WAKEUP)
    } else {
        u64::from(BPF_RB_NO_WAKEUP)
    }
}

/// Emit the outcome of the outstanding request if it was a reuse.
#[inline(always)]
pub(crate) fn reuse_outcome(sk: *const c_void, st: &SockState, now: u64, result: u8, how: u8) {
    if st.flags & st::REUSE == 0 {
        return;
    }
    let (req_ns, idle, retrans) = (st.req_ns, st.req_idle_ns, st.retransmits);
    let fin_before = st.flags & st::FIN_BEFORE_REQ != 0;
    // Read once per reuse, not per write: a control-frame-sized exchange
    // answered is a ping (userspace names the lower bound's basis by it).
    let bytes = request_bytes(sk, st);
    emit(sk, st, kind::REUSE, now, |e| {
        e.idle_ns = idle;
        e.elapsed_ns = now.saturating_sub(req_ns);
        e.outcome = result;
        e.how = how;
        e.retransmits = retrans;
        e.bytes = bytes;
        if fin_before {
            e.flags |= flags::FIN_BEFORE_WRITE;
        }
    });
}

/// Emit a request event (`request_aborted`/`request_timeout`).
#[inline(always)]
pub(crate) fn request_event(sk: *const c_void, st: &SockState, now: u64, kind: u8, how: u8, bytes: u32) {
    let (req_ns, idle, retrans) = (st.req_ns, st.req_idle_ns, st.retransmits);
    let reuse = st.flags & st::REUSE != 0;
    emit(sk, st, kind, now, |e| {
        e.idle_ns = idle;
        e.elapsed_ns = now.saturating_sub(req_ns);
        e.how = how;
        e.retransmits = retrans;
        e.bytes = bytes;
        e.flags |= flags::REQUEST_OUTSTANDING;
        if reuse {
            e.flags |= flags::REUSE;
        }
    });
}

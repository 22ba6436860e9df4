//! Dead sockets: a socket the peer or the kernel ended while idle, the
//! write that then fails before a byte leaves (a failed reuse), a pool
//! that discards it unwritten, and the `DOOMED` table of those still held.

#[allow(
    clippy::wildcard_imports,
    reason = "one state machine split by concern: the parent's imports and siblings' items"
)]
use super::*;

/// The socket died with nothing outstanding (`kind`: `dead::FIN`, `RST`
/// or `TIMEOUT`); `idle_close` when that was an idle close (a
/// `peer_close_while_idle` was emitted). A later kind replaces an earlier
/// one (a FIN, then an RST: the socket is closed now); what the
/// application did stays.
#[inline(always)]
pub(crate) fn mark_dead(st: &mut SockState, kind: u8, idle_close: bool) {
    let mut d = (st.dead & !dead::KIND) | kind;
    if idle_close {
        d |= dead::IDLE;
    }
    st.dead = d;
    if unused_death(st) != dead::NONE {
        list_doomed(st, kind);
    }
}

/// Enter the socket in the `DOOMED` table of dead sockets a process still
/// holds (`how`: `dead::FIN`, `RST`, `TIMEOUT`, or `dead::STALLED` for a
/// connection whose reuse stalled and that the application keeps).
#[inline(always)]
pub(crate) fn list_doomed(st: &mut SockState, how: u8) {
    if st.id == 0 {
        return;
    }
    let mut rec = core::mem::MaybeUninit::<DoomedRecord>::uninit();
    let p = rec.as_mut_ptr();
    // SAFETY: every field is written before the record is read.
    let rec = unsafe {
        (&raw mut (*p).id).write(st.id);
        (&raw mut (*p).last_ns).write(last_activity(st));
        (&raw mut (*p).cgroup_id).write(st.cgroup_id);
        copy16(&raw mut (*p).saddr, &raw const st.saddr);
        copy16(&raw mut (*p).daddr, &raw const st.daddr);
        (&raw mut (*p).netns).write(st.netns);
        (&raw mut (*p).tgid).write(st.tgid);
        (&raw mut (*p).sport).write(st.sport);
        (&raw mut (*p).dport).write(st.dport);
        (&raw mut (*p).family).write(st.family);
        (&raw mut (*p).role).write(st.role);
        (&raw mut (*p).how).write(how);
        copy16(&raw mut (*p).comm, &raw const st.comm);
        rec.assume_init()
    };
    if DOOMED.insert(st.id, rec, 0).is_ok() {
        st.dead |= dead::LISTED;
    } else {
        count(counter::DOOMED_FULL);
    }
}

/// The application acted on a dead socket (wrote on it or closed it): it
/// is no longer held dead.
#[inline(always)]
pub(crate) fn undoom(st: &mut SockState) {
    if st.dead & dead::LISTED != 0 {
        st.dead &= !dead::LISTED;
        let _ = DOOMED.remove(st.id);
    }
}

/// The kind of death the application has not acted on yet, on a socket
/// whose writes are requests (a client); `dead::NONE` otherwise.
#[inline(always)]
pub fn unused_death(st: &SockState) -> u8 {
    if st.dead & dead::USED != 0 || !tracks_requests(st) {
        return dead::NONE;
    }
    st.dead & dead::KIND
}

/// The socket was reset or timed out while idle: every write on it fails
/// in the kernel before a byte leaves the host (`tcp_sendmsg_locked` sees a
/// `CLOSE` socket and returns the pending error, then `EPIPE`).
#[inline(always)]
pub fn write_fails(st: &SockState) -> bool {
    matches!(st.dead & dead::KIND, dead::RST | dead::TIMEOUT)
}

/// The application wrote on a socket that the kernel had already failed
/// while idle, and the write failed before a byte was sent. The first such
/// write after at least `MIN_IDLE_NS` is a failed reuse (`reset` or
/// `timed_out`, `failed_before_send`, safe to retry); reported once.
#[inline(always)]
pub fn on_failed_write(sk: *const c_void, st: &mut SockState, now: u64) {
    let death = unused_death(st);
    if death != dead::RST && death != dead::TIMEOUT {
        return;
    }
    st.dead |= dead::USED;
    undoom(st);
    let last = last_activity(st);
    if last == 0 || now.saturating_sub(last) < min_idle_ns() {
        return;
    }
    set_process(st);
    emit(sk, st, kind::REUSE, now, |e| {
        e.outcome = if death == dead::RST { outcome::RESET } else { outcome::TIMED_OUT };
        e.how = if death == dead::RST { how::RST } else { how::TIMEOUT };
        e.flags |= flags::FAILED_BEFORE_SEND | flags::FIN_BEFORE_WRITE;
    });
}

/// The application closed a client socket that died idle, without
/// writing on it since: `discarded_dead`, once. `since` is when it died
/// (0 = unknown).
#[inline(always)]
pub(crate) fn discarded(sk: *const c_void, st: &mut SockState, now: u64, since: u64) {
    let death = unused_death(st);
    undoom(st);
    if death == dead::NONE || st.dead & dead::IDLE == 0 {
        return;
    }
    st.dead |= dead::USED;
    emit(sk, st, kind::DISCARDED_DEAD, now, |e| {
        e.how = match death {
            dead::FIN => how::FIN,
            dead::RST => how::RST,
            _ => how::TIMEOUT,
        };
        if since != 0 {
            e.elapsed_ns = now.saturating_sub(since);
        }
    });
}

/// The socket is being destroyed (`tcp_destroy_sock`): for a socket reset
/// or timed out while idle, the application's `close()` (no state change
/// is left to see).
#[inline(always)]
pub fn on_destroy(sk: *const c_void, st: &mut SockState, now: u64) {
    if write_fails(st) {
        discarded(sk, st, now, 0);
    }
    undoom(st);
}

/// The kernel killed an idle socket whose keep-alive probes went
/// unanswered: the path dropped the flow while it was silent. Reported as
/// a `peer_close_while_idle` with `how` = `timeout`, its idle age the time
/// since the last segment received (the last data or answered probe; the
/// first unanswered probe went out one keep-alive idle time after it) and
/// `elapsed_ns` the time since the last data. Without keep-alive, or with
/// the tick unknown, nothing is reported.
#[inline(always)]
pub(crate) fn keepalive_death(sk: *const c_void, st: &SockState, now: u64, last: u64) {
    let tick = global(&raw const TICK_NS);
    if tick == 0 || last == 0 || !keepalive(sk).0 {
        return;
    }
    let rcv: u32 = field(sk, &raw const OFFSETS.rcv_tstamp);
    // SAFETY: helper without preconditions.
    let jiffies = unsafe { bpf_jiffies64() } as u32;
    let silent = u64::from(jiffies.wrapping_sub(rcv)) * tick;
    emit(sk, st, kind::PEER_CLOSE, now, |e| {
        e.idle_ns = silent;
        e.elapsed_ns = now.saturating_sub(last);
        e.how = how::TIMEOUT;
    });
}

//! Dead sockets: a socket the peer or the kernel ended while idle, the
//! write that then fails before a byte leaves (a failed reuse), a pool
//! that discards it unwritten, and the `DOOMED` table of those still held.

use core::ffi::c_void;

use observer_common::{counter, dead, flags, how, kind, outcome, watch, DoomedRecord, SockState};

use super::{
    bits::{last_activity, tracks_requests},
    bytes::copy16,
    clock::{now, since_field},
    emit::emit,
    kernel::{app_limited, keepalive, sk_err},
    maps::{atomic_add, count, global, min_idle_ns, undoom, DOOMED, FAILED_WRITE_HOOK, FAILED_WRITE_WATCH, OFFSETS},
    sock::set_process,
};

/// The socket died with nothing outstanding (`kind`: `dead::FIN`, `RST`
/// or `TIMEOUT`); `idle_close` when that was an idle close (a
/// `peer_close_while_idle` was emitted). A later kind replaces an earlier
/// one (a FIN, then an RST: the socket is closed now); what the
/// application did stays.
#[inline(always)]
pub(crate) fn mark_dead(sk: *const c_void, st: &mut SockState, kind: u8, idle_close: bool) {
    let mut d = (st.dead & !dead::KIND) | kind;
    if idle_close {
        d |= dead::IDLE;
    }
    st.dead = d;
    if unused_death(st) != dead::NONE {
        list_doomed(st, kind);
    }
    if write_fails(st) && unused_death(st) != dead::NONE {
        await_write(sk, st);
    }
}

/// A client socket whose next write fails in the kernel waits for the
/// application: count it in `FAILED_WRITE_WATCH`, so the failed-write hook
/// stays attached while it waits. If the hook is not attached, a write
/// before it comes goes unseen: mark the socket and wake userspace to
/// attach it (a `WATCH` record), and note what [`on_destroy`] needs to
/// settle such a write: when it died, and whether `app_limited` was 0.
/// Once per death, never on the hot path.
#[inline(always)]
fn await_write(sk: *const c_void, st: &mut SockState) {
    if global(&raw const FAILED_WRITE_HOOK) == 0 || st.watch & watch::PENDING != 0 {
        return;
    }
    let Some(pending) = FAILED_WRITE_WATCH.get_ptr_mut(0) else { return };
    atomic_add(pending, 1);
    st.watch |= watch::PENDING;
    // The count went up before this read: userspace clears the flag, then
    // looks at the count a tick later before it detaches, so a socket
    // that saw the flag set is always watched.
    let watching = FAILED_WRITE_WATCH.get(1).copied().unwrap_or(0);
    if watching == 0 {
        let now = now();
        st.died_ns = now;
        st.watch |= watch::UNWATCHED;
        if app_limited(sk) == Some(0) {
            st.watch |= watch::NO_WRITE_MARK;
        }
        emit(core::ptr::null(), st, kind::WATCH, now, |_| {});
    }
}

/// The application acted on a socket [`await_write`] counted (wrote on
/// it, closed it): it no longer needs the hook.
#[inline(always)]
fn done_waiting(st: &mut SockState) {
    if st.watch & watch::PENDING == 0 {
        return;
    }
    st.watch &= !watch::PENDING;
    if let Some(pending) = FAILED_WRITE_WATCH.get_ptr_mut(0) {
        // Adding u64::MAX takes one away.
        atomic_add(pending, u64::MAX);
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
    done_waiting(st);
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
        if st.watch & watch::UNWATCHED != 0 && unused_death(st) != dead::NONE && sk_err(sk) == 0 {
            settle_unwatched(sk, st, now);
        } else {
            discarded(sk, st, now, 0);
        }
    }
    done_waiting(st);
    undoom(st);
}

/// A socket that died before the failed-write hook was attached, whose
/// error a syscall took, unused as far as the hook saw: a write before the
/// hook came (a failed reuse) or a read (the pool found it dead). A write
/// set `app_limited` if it was 0 at the death: then it is a failed reuse,
/// dated at the death (the write came after it, by less than the hook's
/// attach), and with it still 0 a discard. Without that mark neither is
/// claimed and the loss is counted.
#[inline(always)]
fn settle_unwatched(sk: *const c_void, st: &mut SockState, now: u64) {
    let mark = if st.watch & watch::NO_WRITE_MARK != 0 { app_limited(sk) } else { None };
    match mark {
        Some(0) => discarded(sk, st, now, st.died_ns),
        Some(_) => on_failed_write(sk, st, st.died_ns),
        None => {
            st.dead |= dead::USED;
            count(counter::FAILED_WRITE_UNSEEN);
        }
    }
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
    if last == 0 || !keepalive(sk).0 {
        return;
    }
    let Some(silent) = since_field(sk, &raw const OFFSETS.rcv_tstamp) else {
        return;
    };
    emit(sk, st, kind::PEER_CLOSE, now, |e| {
        e.idle_ns = silent;
        e.elapsed_ns = now.saturating_sub(last);
        e.how = how::TIMEOUT;
    });
}

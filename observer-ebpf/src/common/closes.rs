//! How a connection's close is told: the peer's close (FIN or RST, and
//! the goodbye that may come before it: a TLS `close_notify`, an HTTP/2
//! `GOAWAY`), our close (a pool's idle close, or our own goodbye and the
//! close), and what each does to an outstanding request.

use core::ffi::c_void;

use observer_common::{dead, flags, how, kind, outcome, role, SockState};

use super::{
    bits::{last_activity, rd, st, CONTROL_BYTES, CONTROL_NS, GOODBYE_GRACE_NS},
    clock::since_field,
    death::{discarded, mark_dead},
    emit::emit,
    kernel::{after, copied_seq, rcv_nxt, request_bytes, snd_una, write_seq},
    maps::{min_idle_ns, undoom, OFFSETS},
    requests::{
        acked, answered, clear_request, end_stalled, eof_read, expire_request, local_ended_request, peer_ended_request,
        read_all, resolve_answered,
    },
    sock::remember_idle_close,
};

/// The connection's idle age is not known since a late read that may
/// have been the peer's goodbye ([`rd::LATE_TO_REACTION`]): the peer's
/// close is dated neither from that read nor from before it.
#[inline(always)]
fn idle_unknown(st: &SockState) -> bool {
    st.read_flags & rd::LATE_TO_REACTION != 0
}

/// The peer's FIN arrived (`ESTABLISHED -> CLOSE_WAIT`).
#[inline(always)]
pub fn on_peer_fin(sk: *const c_void, st: &mut SockState, now: u64) {
    st.peer_fin_ns = now;
    if st.dead & dead::STALLED != 0 {
        end_stalled(st, dead::FIN);
        return;
    }
    expire_request(st, now);
    // The peer's goodbye (close_notify, GOAWAY), then at most a goodbye of
    // ours in reply, then its FIN: its idle close, not a request of ours.
    let goodbye = peer_goodbye(sk, st, now, true);
    if goodbye != 0 {
        let idle_close = goodbye_close(sk, st, now, goodbye, how::FIN);
        mark_dead(sk, st, dead::FIN, idle_close);
        return;
    }
    if st.req_ns != 0 {
        if answered(sk, st, true) {
            resolve_answered(sk, st, now, how::CLOSED_AFTER_RESPONSE);
        } else if is_small_fresh_request(sk, st, now) && acked(sk, st) {
            // The peer received a small write of ours and closed at once:
            // the answer to our close_notify, or a real failure. Our close
            // tells which.
            st.flags |= st::FIN_DEFERRED;
        } else {
            peer_ended_request(sk, st, now, outcome::EOF, how::FIN);
        }
        return;
    }
    let anchor = last_activity(st);
    let idle_close = anchor != 0 && now.saturating_sub(anchor) >= min_idle_ns() && !idle_unknown(st);
    mark_dead(sk, st, dead::FIN, idle_close);
    if idle_close {
        emit(sk, st, kind::PEER_CLOSE, now, |e| {
            e.idle_ns = now - anchor;
            e.how = how::FIN;
        });
    }
}

/// An RST arrived.
#[inline(always)]
pub fn on_peer_rst(sk: *const c_void, st: &mut SockState, now: u64) {
    // A connect the peer refused (`SYN_SENT`: the state hook keeps its
    // process, but it was never established, so it has no id): no
    // connection died, and nothing waits for a write.
    if st.id == 0 {
        return;
    }
    let first = st.flags & (st::PEER_RST | st::LOCAL_CLOSED) == 0;
    st.flags |= st::PEER_RST;
    if !first {
        return;
    }
    if st.dead & dead::STALLED != 0 {
        end_stalled(st, dead::RST);
        return;
    }
    expire_request(st, now);
    // The peer's goodbye, at most a goodbye of ours in reply, then its RST
    // (it closed with our reply unread): its idle close.
    let goodbye = if st.peer_fin_ns == 0 { peer_goodbye(sk, st, now, false) } else { 0 };
    if goodbye != 0 {
        let idle_close = goodbye_close(sk, st, now, goodbye, how::RST);
        mark_dead(sk, st, dead::RST, idle_close);
        return;
    }
    if st.req_ns != 0 {
        // A FIN after the request was resolved by the FIN itself, so any
        // advance of rcv_nxt here is data.
        let fin_counted = st.flags & st::FIN_BEFORE_REQ == 0 && st.peer_fin_ns != 0;
        if answered(sk, st, fin_counted) {
            resolve_answered(sk, st, now, how::CLOSED_AFTER_RESPONSE);
        } else {
            peer_ended_request(sk, st, now, outcome::RESET, how::RST);
        }
        return;
    }
    let last = last_activity(st);
    let idle_close = st.peer_fin_ns == 0 && last != 0 && now.saturating_sub(last) >= min_idle_ns() && !idle_unknown(st);
    // After an idle FIN the RST ends a socket that was already an idle
    // close: it stays one.
    mark_dead(sk, st, dead::RST, idle_close || st.dead & dead::IDLE != 0);
    if idle_close {
        emit(sk, st, kind::PEER_CLOSE, now, |e| e.how = how::RST);
    }
}

/// Our side closed (`close()`: `ESTABLISHED -> FIN_WAIT1`, `CLOSE_WAIT ->
/// LAST_ACK`, or an abort straight to `CLOSE`). `stall_how` says how a
/// stalled reuse ended.
#[inline(always)]
pub fn on_local_close(sk: *const c_void, st: &mut SockState, now: u64, stall_how: u8) {
    if st.flags & st::LOCAL_CLOSED != 0 {
        return;
    }
    st.flags |= st::LOCAL_CLOSED;
    if st.dead & dead::STALLED != 0 {
        // Closing a connection whose reuse stalled is the application
        // giving up on it (its stall was reported), never a pool idle close.
        clear_request(st);
        undoom(st);
        return;
    }
    if st.dead & dead::KIND == dead::FIN {
        // The peer closed it idle and nothing was written since but, at
        // most, an answer to its close (`close_notify` after the EOF).
        discarded(sk, st, now, st.peer_fin_ns);
    }
    undoom(st);
    expire_request(st, now);
    // Our own close_notify/GOAWAY and then the close: part of the close.
    // Not a reuse written blind after the peer's FIN (the FIN unread), the
    // EOF read only after it: the application tried a request and found
    // the connection closed. Its close follows at once whenever the
    // peer's RST is slower than the application (any real round trip).
    let blind = st.flags & (st::REUSE | st::FIN_BEFORE_REQ) == st::REUSE | st::FIN_BEFORE_REQ && eof_read(sk);
    // A reuse written while the peer's goodbye waited unread: if the
    // application read it before this close, the write was a request the
    // goodbye failed (`after_goodbye`), not a control write of ours; if
    // not, the peer still closed first.
    let unread_goodbye = st.flags & st::UNREAD_BEFORE_REQ != 0;
    let past_goodbye = unread_goodbye && read_all(sk, st);
    let control = !blind && !past_goodbye && is_control_write(sk, st, now);
    let deferred = st.flags & st::FIN_DEFERRED != 0;
    // The peer's FIN answered our close_notify: we closed first.
    let we_first = control && (deferred || (st.peer_fin_ns != 0 && st.peer_fin_ns >= st.wburst_ns));
    if deferred && !control && st.req_ns != 0 {
        // A FIN right after a small request, and no close of ours at once:
        // decide it as of the FIN.
        let at = st.peer_fin_ns;
        st.flags &= !st::FIN_DEFERRED;
        if answered(sk, st, true) {
            resolve_answered(sk, st, at, how::CLOSED_AFTER_RESPONSE);
        } else {
            peer_ended_request(sk, st, at, outcome::EOF, how::FIN);
        }
    }
    // The peer's goodbye (close_notify, GOAWAY), its last part read just
    // now, and our close in answer to it (nothing written since but our
    // own goodbye): the peer closed, at the idle age before its goodbye.
    let goodbye_at = if we_first
        || st.peer_fin_ns != 0
        || st.flags & st::PEER_RST != 0
        || now.saturating_sub(st.last_recv_ns) >= CONTROL_NS
    {
        0
    } else {
        goodbye_idle(sk, st, now, GOODBYE_GRACE_NS)
    };
    let goodbye = goodbye_at != 0;
    if goodbye {
        goodbye_close(sk, st, now, goodbye_at, how::FIN);
    }
    let peer_first = !we_first && (goodbye || unread_goodbye || st.peer_fin_ns != 0 || st.flags & st::PEER_RST != 0);
    if control {
        clear_request(st);
    }
    if st.req_ns != 0 {
        let fin_counted = st.flags & st::FIN_BEFORE_REQ == 0 && st.peer_fin_ns != 0;
        if answered(sk, st, fin_counted) {
            resolve_answered(sk, st, now, how::NONE);
        } else {
            local_ended_request(sk, st, now, stall_how, peer_first, request_bytes(sk, st));
            return;
        }
    }
    let anchor = if control { st.wburst_anchor_ns } else { last_activity(st) };
    let idle = now.saturating_sub(anchor);
    if anchor == 0 || idle < min_idle_ns() {
        return;
    }
    if st.role == role::SERVER && !peer_first {
        remember_idle_close(st, now, idle);
    }
    emit(sk, st, kind::LOCAL_CLOSE, now, |e| {
        e.idle_ns = idle;
        if peer_first {
            e.flags |= flags::PEER_CLOSED_FIRST;
        }
        if control {
            e.flags |= flags::CONTROL_WRITE;
        }
    });
}

/// The outstanding request is small and was written less than
/// `CONTROL_NS` ago (it may yet turn out to be a `close_notify`).
#[inline(always)]
pub(crate) fn is_small_fresh_request(sk: *const c_void, st: &SockState, now: u64) -> bool {
    st.flags & st::SEQ != 0
        && now.saturating_sub(st.req_ns) < CONTROL_NS
        && write_seq(sk).wrapping_sub(st.req_snd_seq) <= CONTROL_BYTES
}

/// The idle age at a peer's goodbye (an unsolicited read after a quiet
/// spell, less than `within` ago: `close_notify`, GOAWAY), if we wrote at
/// most a goodbye of our own since; else 0 (never 0 for a goodbye: it
/// came after at least `CONTROL_NS` of quiet).
#[inline(always)]
pub(crate) fn goodbye_idle(sk: *const c_void, st: &SockState, now: u64, within: u64) -> u64 {
    if idle_unknown(st) || st.burst_ns == 0 || st.burst_anchor_ns == 0 || now.saturating_sub(st.burst_ns) >= within {
        return 0;
    }
    if st.last_send_ns > st.burst_ns && write_seq(sk).wrapping_sub(st.burst_wseq) > CONTROL_BYTES {
        return 0;
    }
    // A push stream (more than a goodbye's bytes after its first read) is
    // no goodbye. `rcv_nxt` counts the FIN once it has arrived.
    let fin = u32::from(st.peer_fin_ns != 0);
    if rcv_nxt(sk).wrapping_sub(fin).wrapping_sub(st.burst_rseq) > CONTROL_BYTES {
        return 0;
    }
    st.burst_ns - st.burst_anchor_ns
}

/// The peer's goodbye before its FIN or RST (`fin`), read or still unread:
/// the idle age before it; 0 if there was none.
#[inline(always)]
fn peer_goodbye(sk: *const c_void, st: &SockState, now: u64, fin: bool) -> u64 {
    match goodbye_idle(sk, st, now, GOODBYE_GRACE_NS) {
        0 => unread_goodbye_idle(sk, st, now, fin),
        read => read,
    }
}

/// The peer's goodbye still unread at its FIN or RST (`fin`: `rcv_nxt`
/// counts the FIN): a lazy reader reads only when it waits for an answer,
/// so the goodbye was never read and [`goodbye_idle`] cannot date it. The
/// idle age before it arrived, dated by the kernel's stamp of the last
/// data segment received (`icsk_ack.lrcvtime`; a bare FIN or RST leaves it
/// alone), not by the close. Only a goodbye's few bytes (at most
/// [`CONTROL_BYTES`] unread), with nothing of ours outstanding or written
/// since, that arrived at least [`CONTROL_NS`] before the close (data with
/// the close is part of it: the close dates it, as before) and within
/// [`GOODBYE_GRACE_NS`] of it; 0 otherwise. A goodbye in several parts
/// (a `GOAWAY`, then a `close_notify` with the FIN) is dated by its last.
#[inline(always)]
fn unread_goodbye_idle(sk: *const c_void, st: &SockState, now: u64, fin: bool) -> u64 {
    if idle_unknown(st) || st.req_ns != 0 {
        return 0;
    }
    let unread = rcv_nxt(sk).wrapping_sub(u32::from(fin)).wrapping_sub(copied_seq(sk));
    if unread == 0 || unread > CONTROL_BYTES {
        return 0;
    }
    let Some(since) = since_field(sk, &raw const OFFSETS.lrcvtime) else {
        return 0;
    };
    if !(CONTROL_NS..GOODBYE_GRACE_NS).contains(&since) {
        return 0;
    }
    let arrived = now.saturating_sub(since);
    let anchor = last_activity(st);
    if anchor == 0 || arrived <= anchor || st.last_send_ns > arrived {
        return 0;
    }
    arrived - anchor
}

/// The peer closed after its goodbye, `idle` into the quiet spell before
/// it: the outstanding request (at most a goodbye of ours) is no request,
/// and an idle close is reported. True if it was one.
#[inline(always)]
pub(crate) fn goodbye_close(sk: *const c_void, st: &mut SockState, now: u64, idle: u64, how: u8) -> bool {
    clear_request(st);
    let idle_close = idle >= min_idle_ns();
    if idle_close {
        emit(sk, st, kind::PEER_CLOSE, now, |e| {
            e.idle_ns = idle;
            e.how = how;
        });
    }
    idle_close
}

/// A small write after a quiet spell, with nothing received since (a
/// server: nothing but the client's own goodbye before its FIN), just
/// before our close, and everything written before it acknowledged (a
/// goodbye behind stuck bytes is a cancel: the stuck request decides).
#[inline(always)]
pub(crate) fn is_control_write(sk: *const c_void, st: &SockState, now: u64) -> bool {
    st.wburst_ns != 0
        && st.wburst_anchor_ns != 0
        && st.last_send_ns >= st.wburst_ns
        && (st.last_recv_ns <= st.wburst_ns || (st.role == role::SERVER && st.peer_fin_ns >= st.wburst_ns))
        && now.saturating_sub(st.wburst_ns) < CONTROL_NS
        && write_seq(sk).wrapping_sub(st.wburst_seq) <= CONTROL_BYTES
        && !after(st.wburst_seq, snd_una(sk))
}

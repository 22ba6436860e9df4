//! The request state machine: a request from our first write after the
//! last byte received until an answer, and its end by an answer, the
//! peer's FIN or RST, our close, a stall, or the kernel giving up.

use core::ffi::c_void;

use observer_common::{counter, dead, how, is_h2_control, kind, outcome, SockState};

use super::{
    bits::{last_activity, rd, st, tracks_requests, CONTROL_NS, GOODBYE_GRACE_NS, MAX_JOINED, RACE_NS},
    clock::refresh_clocks,
    closes::{goodbye_idle, on_local_close},
    death::{keepalive_death, list_doomed, mark_dead},
    emit::{emit, request_event, reuse_outcome},
    first_bytes::{h2_starts_call, write_len, HELLO_H2C},
    kernel::{after, copied_seq, rcv_nxt, request_bytes, sk_err, snd_una, write_seq},
    maps::{count, global, min_idle_ns, stall_after_ns, undoom, ANSWER_WITHIN_NS, EMIT_CLOSED},
    sock::set_process,
};

/// The outstanding request is no reuse and was written right after a
/// read (within `CONTROL_NS`): the next request of a busy exchange, or a
/// write in reaction to what was read (an acknowledgement, or our
/// `close_notify` in answer to the last response).
#[inline(always)]
pub(crate) fn is_reaction(st: &SockState) -> bool {
    st.flags & st::REUSE == 0 && st.last_recv_ns != 0 && st.req_ns.saturating_sub(st.last_recv_ns) < CONTROL_NS
}

/// Forget the outstanding request.
#[inline(always)]
pub(crate) fn clear_request(st: &mut SockState) {
    st.req_ns = 0;
    st.retransmits = 0;
    st.joined = 0;
    st.flags &= !(st::REUSE | st::FIN_BEFORE_REQ | st::FIN_DEFERRED | st::SEQ | st::UNREAD_BEFORE_REQ);
}

/// Drop a request unanswered for longer than the bound. True if one was dropped.
#[inline(always)]
pub fn expire_request(st: &mut SockState, now: u64) -> bool {
    if st.req_ns != 0 && now.saturating_sub(st.req_ns) > global(&raw const ANSWER_WITHIN_NS) {
        if st.flags & st::REUSE != 0 {
            count(counter::REUSE_UNRESOLVED);
        }
        clear_request(st);
        return true;
    }
    false
}

/// Data arrived beyond what had arrived at the request write (`fin`: the
/// peer's FIN is already counted in `rcv_nxt`). Without snapshots, data
/// the application has not read yet counts.
#[inline(always)]
pub(crate) fn answered(sk: *const c_void, st: &SockState, fin: bool) -> bool {
    if st.flags & st::SEQ == 0 {
        // Data short of the FIN is unread; `copied_seq` passes the FIN
        // itself (one past the data) once the application reads the EOF.
        let rcv = rcv_nxt(sk).wrapping_sub(u32::from(fin || st.peer_fin_ns != 0));
        return after(rcv, copied_seq(sk));
    }
    let rcv = rcv_nxt(sk).wrapping_sub(u32::from(fin));
    rcv != st.req_rcv_seq && after(rcv, st.req_rcv_seq)
}

/// The application has read everything that arrived, the peer's FIN
/// included (`tcp_recvmsg` moves `copied_seq` past the FIN when it returns
/// the end of stream).
#[inline(always)]
pub(crate) fn eof_read(sk: *const c_void) -> bool {
    copied_seq(sk) == rcv_nxt(sk)
}

/// The application has read every byte that arrived (short of the
/// peer's FIN, read or not).
#[inline(always)]
pub(crate) fn read_all(sk: *const c_void, st: &SockState) -> bool {
    !after(rcv_nxt(sk).wrapping_sub(u32::from(st.peer_fin_ns != 0)), copied_seq(sk))
}

/// The request's bytes were acknowledged (unknown without snapshots: no).
#[inline(always)]
pub(crate) fn acked(sk: *const c_void, st: &SockState) -> bool {
    st.flags & st::SEQ != 0 && after(snd_una(sk), st.req_snd_seq)
}

/// The outstanding request was answered: `ok` for a reuse; the idle clock
/// restarts at the answer.
#[inline(always)]
pub fn resolve_answered(sk: *const c_void, st: &mut SockState, now: u64, how: u8) {
    reuse_outcome(sk, st, now, outcome::OK, how);
    clear_request(st);
    st.last_recv_ns = now;
}

/// A write by the application (send hook; `msg` is its `struct msghdr *`).
#[inline(always)]
pub fn on_send(sk: *const c_void, msg: *const c_void, st: &mut SockState, now: u64) {
    let last = last_activity(st);
    let idle = if last != 0 { now.saturating_sub(last) } else { 0 };
    // Plain locals, not an Option: kernels before 6.5 reject a read of a
    // stack slot the compiler left unwritten on the `None` path.
    let mut wseq = 0u32;
    let mut have_wseq = false;
    if last == 0 || idle >= CONTROL_NS {
        // First write after a quiet spell: remembered in case our close
        // follows at once (then it was a close_notify, not a request).
        wseq = write_seq(sk);
        have_wseq = true;
        // Off the hot path: after a resume the offset is current before
        // the first request after a quiet spell is answered.
        refresh_clocks(now);
        st.wburst_ns = now;
        st.wburst_anchor_ns = last;
        st.wburst_seq = wseq;
    }
    if tracks_requests(st) && st.dead & dead::STALLED != 0 && on_stalled_write(sk, msg, st, now, idle) {
        st.last_send_ns = now;
        return;
    }
    if tracks_requests(st) {
        expire_request(st, now);
        if st.req_ns != 0 && st.flags & st::REUSE != 0 && idle >= CONTROL_NS && idle < min_idle_ns() {
            // Another call on the channel while the reuse is unanswered
            // (only a reuse's: a busy exchange pays nothing here).
            note_joined(sk, msg, st);
        }
        if st.req_ns != 0 && idle >= min_idle_ns() {
            // A write after a quiet spell while a request is outstanding:
            // the answer is queued unread; or our bytes are still
            // unacknowledged (the request is stuck, and this write, an
            // HTTP/2 cancel or ping, another stream, joins it); or the
            // peer acknowledges and never answers (a one-way writer: a log
            // shipper, a metrics push).
            if answered(sk, st, false) {
                resolve_answered(sk, st, now, how::NONE);
            } else if st.flags & st::SEQ != 0 && !acked(sk, st) {
                if is_stall(st, now) {
                    reuse_outcome(sk, st, now, outcome::STALL, how::APP_WRITE);
                    report_joined(sk, st, now);
                    mark_stalled(sk, st);
                    // This write is a call on the stalled connection too
                    // (unless it is gRPC's cancel of the stalled one).
                    on_stalled_write(sk, msg, st, now, idle);
                    st.last_send_ns = now;
                    return;
                }
            } else {
                if st.flags & st::REUSE != 0 {
                    count(counter::REUSE_UNRESOLVED);
                }
                // An unanswered write made right after a read, and
                // received (everything we wrote is acknowledged), was most
                // likely no request (an HTTP/2 client's acknowledgement):
                // this write after the quiet spell is one, a reuse. A
                // writer that never reads is a one-way writer; bytes still
                // unacknowledged may be a stuck request, and a stall of
                // this write would be dated by a quiet spell that was none.
                let reaction = is_reaction(st) && !after(if have_wseq { wseq } else { write_seq(sk) }, snd_una(sk));
                clear_request(st);
                if !reaction {
                    st.flags |= st::ONE_WAY;
                }
            }
        }
        // A write after the application read the peer's EOF answers the
        // close (Go's `close_notify` from its reader): never a request.
        if st.req_ns == 0 && st.flags & st::ONE_WAY == 0 && last != 0 && (st.peer_fin_ns == 0 || !eof_read(sk)) {
            st.req_ns = now;
            st.req_idle_ns = idle;
            st.retransmits = 0;
            if have_wseq || idle >= min_idle_ns() {
                st.req_snd_seq = if have_wseq { wseq } else { write_seq(sk) };
                st.req_rcv_seq = rcv_nxt(sk);
                st.flags |= st::SEQ;
            }
            if st.peer_fin_ns != 0 {
                st.flags |= st::FIN_BEFORE_REQ;
                // A request written on the closed socket: its outcome
                // reports the failure, never `discarded_dead`.
                st.dead |= dead::USED;
                undoom(st);
            }
            if idle >= min_idle_ns() {
                st.flags |= st::REUSE;
                // Where this write ends: its own later chunks join nothing.
                st.call_end = st.req_snd_seq.wrapping_add(write_len(msg) as u32);
                // Off the hot path: only a reuse reads the receive queue.
                if st.peer_fin_ns == 0 && after(rcv_nxt(sk), copied_seq(sk)) {
                    st.flags |= st::UNREAD_BEFORE_REQ;
                }
                set_process(st);
            }
        }
    }
    if st.tgid == 0 {
        set_process(st);
    }
    st.last_send_ns = now;
}

/// The application read data (receive hook).
#[inline(always)]
pub fn on_read(sk: *const c_void, st: &mut SockState, now: u64) {
    if st.req_ns == 0
        && now.saturating_sub(last_activity(st)) >= CONTROL_NS
        && goodbye_idle(sk, st, now, GOODBYE_GRACE_NS) == 0
    {
        // Unsolicited data after a quiet spell: if the peer's FIN follows
        // soon, it was part of the peer's close. (More of it within the
        // grace, a `close_notify` after a `GOAWAY`, continues the goodbye:
        // the first dates it.)
        st.burst_ns = now;
        st.burst_anchor_ns = last_activity(st);
        st.burst_wseq = write_seq(sk);
        st.burst_rseq = copied_seq(sk);
    }
    st.flags &= !st::ONE_WAY;
    if st.flags & st::FIN_DEFERRED != 0 {
        return;
    }
    if st.req_ns != 0 {
        // Without snapshots the read itself is the answer (a busy exchange).
        if st.flags & st::SEQ == 0 || answered(sk, st, false) {
            st.read_flags = if now.saturating_sub(st.req_ns) >= min_idle_ns() && is_reaction(st) {
                rd::LATE_TO_REACTION
            } else {
                0
            };
            resolve_answered(sk, st, now, how::NONE);
        }
    } else {
        st.last_recv_ns = now;
    }
}

/// The peer's FIN or RST came before any response byte. A reuse the peer
/// never acknowledged, or that the close crossed in flight, failed
/// (`eof`/`reset`); otherwise the peer received the request and gave up
/// on it (`request_aborted`).
#[inline(always)]
pub(crate) fn peer_ended_request(sk: *const c_void, st: &mut SockState, now: u64, result: u8, how: u8) {
    if st.flags & (st::FIN_BEFORE_REQ | st::REUSE) == st::FIN_BEFORE_REQ {
        // Written after the peer had closed (a goodbye of our own, say):
        // no deadline of the peer's.
        clear_request(st);
        return;
    }
    let raced = now.saturating_sub(st.req_ns) < RACE_NS;
    let early = st.flags & (st::FIN_BEFORE_REQ | st::UNREAD_BEFORE_REQ) != 0;
    if st.flags & st::REUSE != 0 && (early || !acked(sk, st) || raced) {
        let how = if st.flags & st::UNREAD_BEFORE_REQ != 0 { how::AFTER_GOODBYE } else { how };
        reuse_outcome(sk, st, now, result, how);
    } else {
        if st.flags & st::REUSE != 0 {
            count(counter::REUSE_UNRESOLVED);
        }
        request_event(sk, st, now, kind::REQUEST_ABORTED, how, request_bytes(sk, st));
    }
    clear_request(st);
}

/// The outstanding request is a reuse whose bytes were retransmitted and
/// have waited at least `stall_after` (the caller checks they are still
/// unacknowledged).
#[inline(always)]
pub(crate) fn is_stall(st: &SockState, now: u64) -> bool {
    st.flags & st::REUSE != 0 && st.retransmits > 0 && now.saturating_sub(st.req_ns) >= stall_after_ns()
}

/// A new call on the connection, and its length: a `sendmsg` that is not
/// the next chunk of the last call (the tracepoint fires once per chunk
/// it queues, and every chunk of one `sendmsg` ends at the same
/// `write_seq` plus the bytes still to copy: [`SockState::call_end`]) and
/// starts a call: on a prior-knowledge HTTP/2 connection, a write holding
/// a `HEADERS` frame ([`h2_starts_call`]); otherwise, or where its frames
/// cannot be read, a write that is not exactly one HTTP/2 control frame
/// ([`is_h2_control`]: a cancel, a ping).
#[inline(always)]
fn new_call(sk: *const c_void, msg: *const c_void, st: &mut SockState) -> Option<u32> {
    let len = write_len(msg) as u32;
    let end = write_seq(sk).wrapping_add(len);
    if len == 0 || end == st.call_end {
        return None;
    }
    st.call_end = end;
    // A prior-knowledge HTTP/2 write tells by its frames (two coalesced
    // `RST_STREAM`s are 26 bytes and no call); any other by its size.
    let frames = if st.hello == HELLO_H2C { h2_starts_call(msg, u64::from(len)) } else { None };
    frames.unwrap_or(!is_h2_control(len)).then_some(len)
}

/// A write while the outstanding reuse is unanswered, a quiet moment (at
/// least `CONTROL_NS`, so an HTTP/1 body written right after its headers
/// is none) after the last: a new call on the same channel joins it.
#[inline(always)]
fn note_joined(sk: *const c_void, msg: *const c_void, st: &mut SockState) {
    if new_call(sk, msg, st).is_some() && st.joined < MAX_JOINED {
        st.joined += 1;
    }
}

/// The calls joined to a reuse that stalled failed with it: one
/// `how::AFTER_STALL` failure each (counted, no evidence: the reuse dates
/// the death), at the reuse's idle age.
#[inline(always)]
fn report_joined(sk: *const c_void, st: &SockState, now: u64) {
    let (n, idle) = (st.joined, st.req_idle_ns);
    for i in 0..MAX_JOINED {
        if i >= n {
            break;
        }
        emit(sk, st, kind::REUSE, now, |e| {
            e.idle_ns = idle;
            e.outcome = outcome::STALL;
            e.how = how::AFTER_STALL;
        });
    }
}

/// The outstanding reuse stalled and the application keeps the
/// connection: remember where its stuck bytes start (`req_snd_seq`), so
/// later requests on it are failures dated by this stall, and where the
/// bytes written so far end (`call_end`: the next call starts past it).
#[inline(always)]
pub(crate) fn mark_stalled(sk: *const c_void, st: &mut SockState) {
    let seq = st.req_snd_seq;
    clear_request(st);
    st.req_snd_seq = seq;
    st.call_end = write_seq(sk);
    st.dead |= dead::STALLED;
    // Every call on it fails until the application drops it: it counts in
    // `doomed_idle_sockets` like a socket the peer closed.
    list_doomed(st, dead::STALLED);
}

/// A write on a stalled connection. While the stalled bytes are still
/// unacknowledged, it starts no request; each new call ([`new_call`]:
/// however soon after the last and however small) fails
/// (`how::AFTER_STALL`, counted, no evidence: the first stall dates the
/// death). True if handled; false once the path came back (the stalled
/// bytes acknowledged): the connection is alive again.
#[inline(always)]
pub(crate) fn on_stalled_write(sk: *const c_void, msg: *const c_void, st: &mut SockState, now: u64, idle: u64) -> bool {
    if after(snd_una(sk), st.req_snd_seq) {
        st.dead &= !dead::STALLED;
        undoom(st);
        return false;
    }
    if let Some(len) = new_call(sk, msg, st) {
        set_process(st);
        emit(sk, st, kind::REUSE, now, |e| {
            e.idle_ns = idle;
            e.outcome = outcome::STALL;
            e.how = how::AFTER_STALL;
            e.bytes = len;
        });
    }
    true
}

/// The stalled connection ended (`kind`: the kernel gave up, or a reset):
/// the stall already reported it, so it is no new death and later failed
/// writes on it are no new evidence.
#[inline(always)]
pub(crate) fn end_stalled(st: &mut SockState, kind: u8) {
    st.dead = (st.dead & !dead::KIND) | kind | dead::USED;
}

/// We closed with a request outstanding and unanswered.
#[inline(always)]
pub(crate) fn local_ended_request(
    sk: *const c_void,
    st: &mut SockState,
    now: u64,
    stall_how: u8,
    peer_first: bool,
    bytes: u32,
) {
    let reuse = st.flags & st::REUSE != 0;
    let acked = acked(sk, st);
    let after_goodbye = st.flags & st::UNREAD_BEFORE_REQ != 0;
    if reuse && st.flags & st::FIN_BEFORE_REQ != 0 {
        // The peer had closed before we wrote: no byte reached a live peer.
        reuse_outcome(sk, st, now, outcome::EOF, how::FIN);
    } else if !acked && is_stall(st, now) {
        reuse_outcome(sk, st, now, outcome::STALL, stall_how);
        report_joined(sk, st, now);
    } else if after_goodbye {
        // Written past the peer's goodbye, and closed by us unanswered (the
        // application read the goodbye then): the peer's close failed it.
        reuse_outcome(sk, st, now, outcome::EOF, how::AFTER_GOODBYE);
    } else if reuse {
        count(counter::REUSE_UNRESOLVED);
    }
    // A write right after a read, closed within `CONTROL_NS`: our own
    // goodbye in answer to the last response (a client's `close_notify` as
    // it exits) as likely as a deadline that short; no deadline is claimed.
    let goodbye = is_reaction(st) && now.saturating_sub(st.req_ns) < CONTROL_NS;
    if !peer_first && !after_goodbye && !goodbye && stall_how == how::LOCAL_CLOSE {
        request_event(sk, st, now, kind::REQUEST_TIMEOUT, how::NONE, bytes);
    }
    clear_request(st);
}

/// The socket reached `CLOSE` from `old` (`tcp_done`, an abort, or the end
/// of an orderly close).
#[inline(always)]
pub fn on_closed(sk: *const c_void, st: &mut SockState, old: i32, now: u64) {
    use observer_common::tcp_state as S;
    if (old == S::ESTABLISHED || old == S::CLOSE_WAIT) && st.flags & (st::PEER_RST | st::LOCAL_CLOSED) == 0 {
        // Neither a reset nor an orderly close: the kernel gave up (it
        // sets sk_err before tcp_done on every kernel) or we aborted
        // (SO_LINGER 0, close with unread data: sk_err still 0).
        if sk_err(sk) != 0 {
            st.flags |= st::LOCAL_CLOSED;
            if st.dead & dead::STALLED != 0 {
                end_stalled(st, dead::TIMEOUT);
            } else if st.req_ns != 0 && !expire_request(st, now) {
                local_ended_request(sk, st, now, how::TIMEOUT, true, request_bytes(sk, st));
            } else if st.req_ns == 0 {
                // Killed idle (keep-alive probes unanswered): the next
                // write fails before a byte is sent.
                let last = last_activity(st);
                mark_dead(sk, st, dead::TIMEOUT, last != 0 && now.saturating_sub(last) >= min_idle_ns());
                keepalive_death(sk, st, now, last);
            }
        } else {
            on_local_close(sk, st, now, how::LOCAL_CLOSE);
        }
    } else if st.req_ns != 0 && st.flags & st::REUSE != 0 {
        count(counter::REUSE_UNRESOLVED);
    }
    clear_request(st);
    if global(&raw const EMIT_CLOSED) != 0 {
        let role = st.role;
        emit(sk, st, kind::CLOSED, now, |e| e.role = role);
    }
}

//! The probes' own vocabulary: the bit sets they keep in `SockState`
//! (`st`, `rd`), the times and sizes that tell a close, a goodbye and a
//! race apart, and what a socket's state says on its own (its last
//! activity, whether its writes are requests). A leaf: every behaviour
//! file imports it, and it imports nothing of `common`, so the behaviour
//! files import each other only where the state machine recurses
//! (`requests` and `closes`).

use observer_common::{role, SockState};

/// A write of at most this many bytes immediately followed by our close
/// (TLS `close_notify`, an HTTP/2 GOAWAY) is part of the close.
pub const CONTROL_BYTES: u32 = 512;

/// "Immediately": a control write and the close, or an unsolicited read
/// and the peer's FIN, within this time.
pub const CONTROL_NS: u64 = 100_000_000;

/// The peer's goodbye (an unsolicited message after a quiet spell: an
/// HTTP/2 `GOAWAY`, a TLS `close_notify`) dates its close when its FIN or
/// RST follows within this time: Go's HTTP/2 server closes a second after
/// its `GOAWAY` (`goAwayTimeout`, for the client's frames in flight), and
/// the FIN must not date the close a second after the goodbye.
pub const GOODBYE_GRACE_NS: u64 = 2_000_000_000;

/// A peer FIN/RST this soon after a reuse write crossed it in flight (the
/// peer closed before it saw the request), even if the request was acked.
pub const RACE_NS: u64 = 100_000_000;

/// Calls joined to one stalled reuse reported at most (each is one event).
pub const MAX_JOINED: u8 = 8;

/// Probes' own `SockState::flags` bits (never on the wire).
pub mod st {
    /// The outstanding request has sequence snapshots (`req_snd_seq`,
    /// `req_rcv_seq`): it came after a quiet spell (a reuse, or maybe a
    /// control write). A request in a busy exchange has none, to keep two
    /// field reads off the hot path; it is answered by any read, or by
    /// unread data at the decision.
    pub const SEQ: u8 = 0x01;
    /// The outstanding request is a reuse.
    pub const REUSE: u8 = 0x02;
    /// Our close was seen (local close logic ran).
    pub const LOCAL_CLOSED: u8 = 0x04;
    /// With `REUSE` only: the peer's bytes were waiting unread when the
    /// reuse was written (a lazy reader wrote past the peer's `GOAWAY` or
    /// `close_notify`); if the peer then ends it unanswered, the peer had
    /// begun its close before our request.
    pub const UNREAD_BEFORE_REQ: u8 = 0x08;
    /// An RST arrived.
    pub const PEER_RST: u8 = 0x10;
    /// A request went unanswered until the next write: a one-way writer.
    /// No requests are tracked until data arrives again.
    pub const ONE_WAY: u8 = 0x20;
    /// The peer's FIN had arrived, unread, when the outstanding request
    /// was written (after the application reads the EOF, a write starts
    /// no request).
    pub const FIN_BEFORE_REQ: u8 = 0x40;
    /// The peer's FIN acknowledged a small write made just before (our
    /// `close_notify`?): decided at our close, which follows at once if so.
    pub const FIN_DEFERRED: u8 = 0x80;
}

/// Probes' own `SockState::read_flags` bits (never on the wire).
pub mod rd {
    /// A read answered, after a quiet spell of at least `min_idle`, a
    /// request written right after the read before it ([`is_reaction`]).
    /// Such a write is often no request at all but an acknowledgement
    /// (HTTP/2 `SETTINGS` or `PING` acks, `WINDOW_UPDATE`), and the late
    /// read then the peer's goodbye (a `GOAWAY`) rather than an answer:
    /// until an exchange is answered again, the connection's idle age is
    /// not known, and no idle close of the peer's is claimed on it.
    pub const LATE_TO_REACTION: u8 = 0x01;
}

/// Later of the last send and receive; 0 when nothing was seen.
#[inline(always)]
pub fn last_activity(st: &SockState) -> u64 {
    if st.last_send_ns > st.last_recv_ns {
        st.last_send_ns
    } else {
        st.last_recv_ns
    }
}

/// Requests are what a client writes; a server's writes are responses.
#[inline(always)]
pub fn tracks_requests(st: &SockState) -> bool {
    st.role != role::SERVER
}

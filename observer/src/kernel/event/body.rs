//! What only its kind says: the body of a [`SockEvent`](super::SockEvent).
//!
//! Every event carries the same header (time, socket, process, idle age);
//! what else it says depends on its kind, and each kind's body holds
//! exactly that: a reuse has an outcome, a local close may have been
//! cleanup after the peer's, a `server_name` carries the name. In JSON the
//! body's fields sit beside the header's, and `kind` names the body (serde's
//! internal tag), so a kind without a field has no such key.
//!
//! [`Body::decode`] turns a wire record's kind-specific fields into a body:
//! one arm per kind, so a kind added to [`EventKind`] without its body does
//! not compile.

use observer_common::{flags, Event};
use serde::{Deserialize, Serialize};

use super::{secs, DecodeError, EventKind, How, Outcome};
use crate::kernel::{
    first_bytes::{Protocol, TlsVersion},
    runtime::ClientRuntime,
};

/// An event's kind and what only that kind says.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Body {
    /// Connection established.
    Established,
    /// Connection reached CLOSE.
    Closed,
    /// The outcome of a reuse (the first write after idle).
    Reuse(Reuse),
    /// The peer closed (FIN or RST) a socket idle with nothing outstanding,
    /// or the kernel killed it after unanswered keep-alive probes.
    PeerCloseWhileIdle(PeerClose),
    /// The local process closed a socket it held idle, or closed after the
    /// peer had.
    LocalClose(LocalClose),
    /// The peer closed or reset after receiving a request and before any
    /// response byte: the peer's request deadline.
    RequestAborted(Request),
    /// We closed with a request outstanding: our own request deadline.
    RequestTimeout(Request),
    /// Server side: a client wrote on a connection we had closed idle.
    LateReuse(LateReuse),
    /// The application closed a client socket that had died idle, without
    /// writing on it.
    DiscardedDead(Discarded),
    /// A client connection's first bytes named the host it was meant for.
    ServerName(FirstBytes),
}

/// `reuse`: how the first request after a quiet spell ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Reuse {
    pub outcome: Outcome,
    /// Seconds from the request write to the outcome.
    #[serde(default)]
    pub elapsed_seconds: f64,
    /// Retransmits of the request before the outcome.
    #[serde(default)]
    pub retransmits: u32,
    /// The peer's FIN came before the write, or the kernel had already
    /// failed the socket: no byte reached a live peer, one retry on a fresh
    /// connection is safe.
    #[serde(default)]
    pub safe_to_retry: bool,
    /// The write failed in the kernel before any byte left the host (the
    /// socket had been reset or timed out while idle).
    #[serde(default)]
    pub failed_before_send: bool,
    /// How it ended, where the outcome alone does not say (see [`How`]).
    #[serde(default)]
    pub how: Option<How>,
    /// Request bytes written (0 = not measured).
    #[serde(default)]
    pub bytes: u32,
    /// Client reuses: the writing process's runtime and pool libraries,
    /// where they can be told (see `kernel::runtime`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_runtime: Option<ClientRuntime>,
}

impl Reuse {
    /// A reuse with this outcome and nothing else known.
    #[must_use]
    pub const fn new(outcome: Outcome) -> Self {
        Self {
            outcome,
            elapsed_seconds: 0.0,
            retransmits: 0,
            safe_to_retry: false,
            failed_before_send: false,
            how: None,
            bytes: 0,
            client_runtime: None,
        }
    }
}

/// `peer_close_while_idle`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PeerClose {
    /// `fin`, `rst`, or `timeout` (a keep-alive death).
    #[serde(default)]
    pub how: Option<How>,
    /// A keep-alive death: seconds from the last activity the probes saw
    /// to the kernel's verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_seconds: Option<f64>,
}

/// `local_close`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[allow(clippy::struct_excessive_bools, reason = "independent facts about one close")]
pub struct LocalClose {
    /// The peer had closed first: cleanup, not a pool idle timeout.
    #[serde(default)]
    pub peer_closed_first: bool,
    /// A small control write (TLS `close_notify`, GOAWAY) just before was
    /// part of the close.
    #[serde(default)]
    pub control_write: bool,
    /// A request was still unanswered (recordings of probes older than
    /// `request_timeout`; today's report that kind instead).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub request_outstanding: bool,
}

impl LocalClose {
    /// The close shows the pool's own idle timeout: our side closed an idle
    /// socket on its own initiative (nothing outstanding, the peer had not
    /// closed first).
    #[must_use]
    pub const fn is_pool_idle_close(&self) -> bool {
        !self.request_outstanding && !self.peer_closed_first
    }
}

/// `request_aborted` and `request_timeout`: a request left unanswered.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Request {
    /// Seconds from the request write to the event.
    #[serde(default)]
    pub elapsed_seconds: f64,
    /// Retransmits of the request before the event.
    #[serde(default)]
    pub retransmits: u32,
    /// The request was a reuse (the first after idle).
    #[serde(default)]
    pub reuse: bool,
    /// Request bytes written (0 = not measured).
    #[serde(default)]
    pub bytes: u32,
    /// `request_aborted`: how the peer ended it (`fin`, `rst`).
    #[serde(default)]
    pub how: Option<How>,
}

/// `late_reuse`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct LateReuse {
    /// Seconds from our close to the client's write.
    #[serde(default)]
    pub elapsed_seconds: f64,
}

/// `discarded_dead`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Discarded {
    /// How the socket had died: `fin`, `rst`, `timeout`.
    #[serde(default)]
    pub how: Option<How>,
    /// Seconds from its death to the close, where the death was dated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub elapsed_seconds: Option<f64>,
}

/// `server_name`: what a client connection's first bytes said. No evidence.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FirstBytes {
    /// The host name (TLS SNI or HTTP `Host`, lower-cased).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_name: Option<String>,
    /// The application protocol (`http1`, `h2`), where the bytes tell it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// The TLS version negotiated (a record of its own, from the client's
    /// second flight).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_version: Option<TlsVersion>,
}

impl Body {
    /// The kind this body belongs to.
    #[must_use]
    pub const fn kind(&self) -> EventKind {
        match self {
            Self::Established => EventKind::Established,
            Self::Closed => EventKind::Closed,
            Self::Reuse(_) => EventKind::Reuse,
            Self::PeerCloseWhileIdle(_) => EventKind::PeerCloseWhileIdle,
            Self::LocalClose(_) => EventKind::LocalClose,
            Self::RequestAborted(_) => EventKind::RequestAborted,
            Self::RequestTimeout(_) => EventKind::RequestTimeout,
            Self::LateReuse(_) => EventKind::LateReuse,
            Self::DiscardedDead(_) => EventKind::DiscardedDead,
            Self::ServerName(_) => EventKind::ServerName,
        }
    }

    /// The body a wire record of `kind` carries. A `server_name`'s first
    /// bytes follow the record; they are parsed by the caller.
    pub fn decode(kind: EventKind, raw: &Event) -> Result<Self, DecodeError> {
        let flag = |f: u8| raw.flags & f != 0;
        let how = How::of_wire(raw.how);
        let elapsed = secs(raw.elapsed_ns);
        let request = Request {
            elapsed_seconds: elapsed,
            retransmits: raw.retransmits,
            reuse: flag(flags::REUSE),
            bytes: raw.bytes,
            how,
        };
        Ok(match kind {
            EventKind::Established => Self::Established,
            EventKind::Closed => Self::Closed,
            EventKind::Reuse => Self::Reuse(Reuse {
                outcome: Outcome::of_wire(raw.outcome).ok_or(DecodeError::Outcome(raw.outcome))?,
                elapsed_seconds: elapsed,
                retransmits: raw.retransmits,
                safe_to_retry: flag(flags::FIN_BEFORE_WRITE),
                failed_before_send: flag(flags::FAILED_BEFORE_SEND),
                how,
                bytes: raw.bytes,
                client_runtime: None,
            }),
            EventKind::PeerCloseWhileIdle => {
                Self::PeerCloseWhileIdle(PeerClose { how, elapsed_seconds: (raw.elapsed_ns != 0).then_some(elapsed) })
            }
            EventKind::LocalClose => Self::LocalClose(LocalClose {
                peer_closed_first: flag(flags::PEER_CLOSED_FIRST),
                control_write: flag(flags::CONTROL_WRITE),
                request_outstanding: flag(flags::REQUEST_OUTSTANDING),
            }),
            EventKind::RequestAborted => Self::RequestAborted(request),
            EventKind::RequestTimeout => Self::RequestTimeout(request),
            EventKind::LateReuse => Self::LateReuse(LateReuse { elapsed_seconds: elapsed }),
            EventKind::DiscardedDead => {
                Self::DiscardedDead(Discarded { how, elapsed_seconds: (raw.elapsed_ns != 0).then_some(elapsed) })
            }
            EventKind::ServerName => Self::ServerName(FirstBytes {
                tls_version: TlsVersion::of_wire(raw.tls_version),
                ..FirstBytes::default()
            }),
        })
    }
}

impl FirstBytes {
    /// The first bytes told neither a name nor a protocol, nor a TLS
    /// version: no event.
    #[must_use]
    pub const fn tells_nothing(&self) -> bool {
        self.server_name.is_none() && self.protocol.is_none() && self.tls_version.is_none()
    }
}

/// A body of this kind with nothing but its kind known (a reuse: `ok`).
impl From<EventKind> for Body {
    fn from(kind: EventKind) -> Self {
        match kind {
            EventKind::Established => Self::Established,
            EventKind::Closed => Self::Closed,
            EventKind::Reuse => Self::Reuse(Reuse::new(Outcome::Ok)),
            EventKind::PeerCloseWhileIdle => Self::PeerCloseWhileIdle(PeerClose::default()),
            EventKind::LocalClose => Self::LocalClose(LocalClose::default()),
            EventKind::RequestAborted => Self::RequestAborted(Request::default()),
            EventKind::RequestTimeout => Self::RequestTimeout(Request::default()),
            EventKind::LateReuse => Self::LateReuse(LateReuse::default()),
            EventKind::DiscardedDead => Self::DiscardedDead(Discarded::default()),
            EventKind::ServerName => Self::ServerName(FirstBytes::default()),
        }
    }
}

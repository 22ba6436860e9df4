//! Typed events: decoding of the kernel's wire records into [`SockEvent`],
//! and their text and JSON renderings.
//!
//! Everything downstream of the bpf module works on [`SockEvent`], so it can
//! be fed from a live ring buffer or from a JSON-lines recording alike.

use std::{
    fmt,
    net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use observer_common::{flags, how, kind, outcome, role, Event, AF_INET, AF_INET6, EVENT_SIZE, HELLO_BYTES, HELLO_SIZE};
use serde::{Deserialize, Serialize};

use crate::{kernel::owner::Owner, named::named};

mod body;
pub(crate) mod clock;
mod reset;
mod views;

pub use body::{Body, Discarded, FirstBytes, LateReuse, LocalClose, PeerClose, Request, Reuse};
pub use clock::{clock_ns, Clock};
pub use reset::{ResetArrival, ResetFrom};
pub use views::{doomed_of, view_of, DoomedView, SocketView};

/// Why a record could not be decoded.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    #[error("event record is {0} bytes, expected {EVENT_SIZE} or {HELLO_SIZE}: the daemon and its eBPF object are out of step; rebuild both")]
    Size(usize),
    #[error("unknown event kind {0}: the eBPF object is newer than this daemon; rebuild both")]
    Kind(u8),
    #[error("reuse record with unknown outcome {0}: the eBPF object is newer than this daemon; rebuild both")]
    Outcome(u8),
    #[error("unknown address family {0}")]
    Family(u16),
}

named! {
    /// Each kind once: its wire value (`observer_common::kind`) and name.
    pub enum EventKind: wire {
        /// Connection established.
        Established = kind::ESTABLISHED => "established",
        /// Connection reached CLOSE.
        Closed = kind::CLOSED => "closed",
        /// Outcome of a reuse (first write after idle).
        Reuse = kind::REUSE => "reuse",
        /// The peer closed (FIN or RST) a socket idle with nothing outstanding.
        PeerCloseWhileIdle = kind::PEER_CLOSE => "peer_close_while_idle",
        /// The local process closed a socket it held idle (a pool idle close),
        /// or closed after the peer had (`peer_closed_first`).
        LocalClose = kind::LOCAL_CLOSE => "local_close",
        /// The peer closed or reset a connection after receiving a request and
        /// before any response byte: the peer's request deadline, observed.
        RequestAborted = kind::REQUEST_ABORTED => "request_aborted",
        /// We closed a connection with a request outstanding: our own request
        /// deadline, observed.
        RequestTimeout = kind::REQUEST_TIMEOUT => "request_timeout",
        /// Server side: a client wrote on a connection we had already closed
        /// idle, and the kernel answered with an RST.
        LateReuse = kind::LATE_REUSE => "late_reuse",
        /// The application closed a client socket the peer had closed or the
        /// kernel had timed out while idle, without writing on it: the pool
        /// (or its reader) discarded a dead socket instead of failing on it.
        DiscardedDead = kind::DISCARDED_DEAD => "discarded_dead",
        /// A client connection's first bytes named the host it was meant
        /// for (TLS SNI, HTTP `Host`): `server_name`. No evidence.
        ServerName = kind::HELLO => "server_name",
    }
}

named! {
    pub enum Role {
        Client => "client",
        Server => "server",
        /// Socket was open before observer started and the ports did not tell.
        Unknown => "unknown",
    }
}

impl Role {
    /// The role a wire value (`observer_common::role`) names.
    #[must_use]
    pub const fn of_wire(v: u8) -> Self {
        match v {
            role::CLIENT => Self::Client,
            role::SERVER => Self::Server,
            _ => Self::Unknown,
        }
    }
}

named! {
    pub enum Outcome: wire {
        Ok = outcome::OK => "ok",
        Eof = outcome::EOF => "eof",
        Reset = outcome::RESET => "reset",
        Stall = outcome::STALL => "stall",
        /// The kernel had timed the socket out while idle (keep-alive or
        /// retransmission timeout): the write failed before a byte was sent.
        TimedOut = outcome::TIMED_OUT => "timed_out",
    }
}

impl Outcome {
    #[must_use]
    pub const fn is_failure(self) -> bool {
        !matches!(self, Self::Ok)
    }
}

named! {
    /// How a peer closed, or how a stall ended.
    pub enum How: wire {
        Fin = how::FIN => "fin",
        Rst = how::RST => "rst",
        Response = how::RESPONSE => "response",
        LocalClose = how::LOCAL_CLOSE => "local_close",
        Timeout = how::TIMEOUT => "timeout",
        Destroyed = how::DESTROYED => "destroyed",
        /// `ok`: the response arrived, then the peer's FIN or RST.
        ClosedAfterResponse = how::CLOSED_AFTER_RESPONSE => "closed_after_response",
        /// `stall`: decided at the application's next write (a cancel, a
        /// ping, another stream), the bytes still unacknowledged.
        AppWrite = how::APP_WRITE => "app_write",
        /// `stall`: a later request on a connection whose earlier reuse
        /// stalled; a failure the client saw, dated by that first stall
        /// (no evidence of the path's timeout).
        AfterStall = how::AFTER_STALL => "after_stall",
        /// `eof`/`reset`: a reuse written while the peer's goodbye (an
        /// HTTP/2 `GOAWAY`, a TLS `close_notify`) waited unread, then
        /// ended unanswered: the client wrote past the drain signal.
        AfterGoodbye = how::AFTER_GOODBYE => "after_goodbye",
        /// Doomed sockets only (no wire value of its own: the doomed table
        /// says it): a reuse on it stalled and the application still holds
        /// it (every call on it fails).
        Stalled => "stalled",
    }
}

/// One decoded event: the header every kind shares, and its [`Body`]
/// (`kind` and what only that kind says). Field names are the JSON
/// interface (`docs/fields.md`): the body's fields sit beside the header's.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SockEvent {
    /// Wall-clock time of the event, ns since the Unix epoch.
    pub ts_unix_ns: u64,
    /// The kind (`kind` in JSON) and its own fields.
    #[serde(flatten)]
    pub body: Body,
    pub role: Role,
    /// Process that wrote on the socket (0 when unknown).
    pub pid: u32,
    /// Name of the thread that wrote (or was current).
    pub comm: String,
    /// Client reuses: the process's name as `ps` shows it (its main
    /// thread's), where the daemon's resolver knows it; `comm` is the
    /// writing thread's (a worker's, in Envoy, grpcio or a JDK client).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// Idle age at the event, seconds (ns precision).
    pub idle_seconds: f64,
    /// Socket was open before observer started.
    #[serde(default)]
    pub preexisting: bool,
    /// Connected by a process running the daemon's own executable (told in
    /// the kernel at `connect()`): `observer probe`'s connection. The
    /// daemon leaves it out of every row and never records it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub observer_own: bool,
    /// TCP keep-alive was on (`SO_KEEPALIVE`).
    #[serde(default)]
    pub keepalive: bool,
    /// Keep-alive idle time in seconds, when keep-alive is on and the
    /// kernel's tick rate is known (absent: the sysctl default applies, or
    /// it could not be converted).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keepalive_idle_seconds: Option<f64>,
    /// Per-boot socket number (never a kernel address).
    #[serde(default)]
    pub sock_id: u64,
    /// Inode of the socket's network namespace (`/proc/PID/ns/net`); 0 = unknown.
    #[serde(default)]
    pub netns: u32,
    /// cgroup v2 id of the process that connected or wrote; 0 = none seen.
    #[serde(default)]
    pub cgroup_id: u64,
    /// What that cgroup says, when resolved: its path below the cgroup v2
    /// root (`cgroup`), and `container`, `runtime`, `pod` and `unit` where
    /// the path tells them. Flattened: the JSON keeps those fields at the
    /// top level, all absent when unresolved.
    #[serde(flatten, default)]
    pub owner: Option<Owner>,
    /// The socket received an RST: its TTL, the peer's SYN-ACK's, and who
    /// sent it where that can be told (`reset_from`, `reset_hops_closer`).
    /// Flattened: all absent when no RST was seen.
    #[serde(flatten, default)]
    pub reset: Option<ResetArrival>,
}

fn addr(family: u16, raw: [u8; 16], port: u16) -> Result<SocketAddr, DecodeError> {
    let ip = match family {
        AF_INET => IpAddr::V4(Ipv4Addr::new(raw[0], raw[1], raw[2], raw[3])),
        AF_INET6 => {
            let v6 = Ipv6Addr::from(raw);
            // v4-mapped addresses on dual-stack sockets read better as IPv4.
            v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4)
        }
        other => return Err(DecodeError::Family(other)),
    };
    Ok(SocketAddr::new(ip, port))
}

#[allow(clippy::cast_precision_loss, reason = "idle ages are far below 2^52 ns")]
fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Decode a raw ring-buffer record. A `server_name` record's first bytes
/// are parsed here and dropped; without a name or a protocol in them, its
/// event carries neither (the reader skips it).
pub fn decode_bytes(bytes: &[u8], clock: Clock) -> Result<SockEvent, DecodeError> {
    if bytes.len() != EVENT_SIZE && bytes.len() != HELLO_SIZE {
        return Err(DecodeError::Size(bytes.len()));
    }
    // SAFETY: length checked; Event is POD with no invalid bit patterns;
    // read_unaligned copes with any alignment of the ring-buffer slice.
    let raw: Event = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Event>()) };
    let mut ev = decode(&raw, clock)?;
    if let Body::ServerName(named) = &mut ev.body {
        let n = usize::try_from(raw.bytes).unwrap_or(0).min(HELLO_BYTES);
        let first = bytes.get(EVENT_SIZE..EVENT_SIZE + n).unwrap_or_default();
        named.server_name = crate::kernel::first_bytes::server_name(first).map(|(name, _)| name);
        named.protocol = crate::kernel::first_bytes::protocol(first);
    }
    Ok(ev)
}

/// Decode a kernel [`Event`]: the header here, the body by its kind
/// ([`Body::decode`]).
pub fn decode(raw: &Event, clock: Clock) -> Result<SockEvent, DecodeError> {
    let kind = EventKind::of_wire(raw.kind).ok_or(DecodeError::Kind(raw.kind))?;
    let local = addr(raw.family, raw.saddr, raw.sport)?;
    let remote = addr(raw.family, raw.daddr, raw.dport)?;
    // A socket first seen established carries no role (or, from older
    // probes, one the ports told): the ports tell it, by the probes' rule.
    let role = match Role::of_wire(raw.role) {
        Role::Unknown => Role::of_wire(role::guess(raw.sport, raw.dport)),
        r => r,
    };
    let comm_len = raw.comm.iter().position(|&b| b == 0).unwrap_or(raw.comm.len());
    let keepalive = raw.flags & flags::KEEPALIVE != 0;
    let keepalive_idle_seconds = match (keepalive, raw.keepalive_jiffies, clock.hz) {
        (true, j, Some(hz)) if j > 0 && hz > 0 => Some(f64::from(j) / f64::from(hz)),
        _ => None,
    };
    Ok(SockEvent {
        ts_unix_ns: clock.to_unix_ns(raw.ts_ns),
        body: Body::decode(kind, raw)?,
        role,
        pid: raw.tgid,
        comm: String::from_utf8_lossy(&raw.comm[..comm_len]).into_owned(),
        process: None,
        local,
        remote,
        idle_seconds: secs(raw.idle_ns),
        preexisting: raw.flags & flags::PREEXISTING != 0,
        observer_own: raw.own != 0,
        keepalive,
        keepalive_idle_seconds,
        sock_id: raw.sock_id,
        netns: raw.netns,
        cgroup_id: raw.cgroup_id,
        owner: None,
        reset: ResetArrival::of_wire(raw.reset_ttl, raw.peer_ttl, raw.ttl_flags),
    })
}

impl SockEvent {
    /// The owner's cgroup path, when resolved (what `--cgroup` filters on).
    #[must_use]
    pub fn cgroup(&self) -> Option<&str> {
        self.owner.as_ref().map(|o| o.cgroup.as_str())
    }

    /// The owner's container id, when its cgroup path names one.
    #[must_use]
    pub fn container(&self) -> Option<&str> {
        self.owner.as_ref().and_then(|o| o.container.as_deref())
    }

    /// An event with the given identity and body and nothing else set
    /// (recordings written by other tools, tests, benchmarks). A bare
    /// [`EventKind`] gives that kind's empty body (a reuse: `ok`).
    #[must_use]
    pub fn new(
        ts_unix_ns: u64,
        body: impl Into<Body>,
        role: Role,
        local: SocketAddr,
        remote: SocketAddr,
        idle_seconds: f64,
    ) -> Self {
        Self {
            ts_unix_ns,
            body: body.into(),
            role,
            pid: 0,
            comm: String::new(),
            process: None,
            local,
            remote,
            idle_seconds,
            preexisting: false,
            observer_own: false,
            keepalive: false,
            keepalive_idle_seconds: None,
            sock_id: 0,
            netns: 0,
            cgroup_id: 0,
            owner: None,
            reset: None,
        }
    }

    /// The event's kind.
    #[must_use]
    pub const fn kind(&self) -> EventKind {
        self.body.kind()
    }

    /// A reuse's body (None: another kind).
    #[must_use]
    pub const fn as_reuse(&self) -> Option<&Reuse> {
        match &self.body {
            Body::Reuse(r) => Some(r),
            _ => None,
        }
    }

    /// A reuse's outcome (None: another kind).
    #[must_use]
    pub fn outcome(&self) -> Option<Outcome> {
        self.as_reuse().map(|r| r.outcome)
    }

    /// How it ended or closed, for the kinds that say (see [`How`]).
    #[must_use]
    pub const fn how(&self) -> Option<How> {
        match &self.body {
            Body::Reuse(Reuse { how, .. })
            | Body::PeerCloseWhileIdle(PeerClose { how, .. })
            | Body::RequestAborted(Request { how, .. })
            | Body::RequestTimeout(Request { how, .. })
            | Body::DiscardedDead(Discarded { how, .. }) => *how,
            _ => None,
        }
    }

    /// Seconds from the request write (reuses, requests), from our close
    /// (`late_reuse`) or from the death (`discarded_dead`, keep-alive
    /// deaths) to the event, for the kinds that time one.
    #[must_use]
    pub fn elapsed_seconds(&self) -> Option<f64> {
        match &self.body {
            Body::Reuse(r) => Some(r.elapsed_seconds),
            Body::RequestAborted(r) | Body::RequestTimeout(r) => Some(r.elapsed_seconds),
            Body::LateReuse(l) => Some(l.elapsed_seconds),
            Body::PeerCloseWhileIdle(PeerClose { elapsed_seconds, .. })
            | Body::DiscardedDead(Discarded { elapsed_seconds, .. }) => *elapsed_seconds,
            _ => None,
        }
    }

    /// Retransmits of the request (reuses, requests).
    #[must_use]
    pub const fn retransmits(&self) -> u32 {
        match &self.body {
            Body::Reuse(Reuse { retransmits, .. })
            | Body::RequestAborted(Request { retransmits, .. })
            | Body::RequestTimeout(Request { retransmits, .. }) => *retransmits,
            _ => 0,
        }
    }

    /// A reuse no byte of which reached a live peer (see [`Reuse`]).
    #[must_use]
    pub fn safe_to_retry(&self) -> bool {
        self.as_reuse().is_some_and(|r| r.safe_to_retry)
    }

    /// A reuse the kernel failed before any byte left the host.
    #[must_use]
    pub fn failed_before_send(&self) -> bool {
        self.as_reuse().is_some_and(|r| r.failed_before_send)
    }

    /// A `request_aborted`/`request_timeout` event's body (None: another kind).
    #[must_use]
    pub const fn as_request(&self) -> Option<&Request> {
        match &self.body {
            Body::RequestAborted(r) | Body::RequestTimeout(r) => Some(r),
            _ => None,
        }
    }

    /// A `local_close` event's body (None: another kind).
    #[must_use]
    pub const fn as_local_close(&self) -> Option<&LocalClose> {
        match &self.body {
            Body::LocalClose(c) => Some(c),
            _ => None,
        }
    }

    /// A `server_name` event's name and protocol (None: another kind).
    #[must_use]
    pub const fn as_server_name(&self) -> Option<&FirstBytes> {
        match &self.body {
            Body::ServerName(n) => Some(n),
            _ => None,
        }
    }

    /// A local close that shows the pool's own idle timeout
    /// ([`LocalClose::is_pool_idle_close`]).
    #[must_use]
    pub const fn is_pool_idle_close(&self) -> bool {
        matches!(&self.body, Body::LocalClose(c) if c.is_pool_idle_close())
    }

    /// Wall-clock time of the event.
    #[must_use]
    pub fn time(&self) -> SystemTime {
        UNIX_EPOCH + Duration::from_nanos(self.ts_unix_ns)
    }

    /// The event as one JSON line (no trailing newline).
    #[must_use]
    pub fn to_json_line(&self) -> String {
        // Serializing plain data with string keys cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// Tests set what a case needs on a body built empty. Each panics on a
/// kind without that field: a test that asks for one has a wrong kind.
#[cfg(test)]
impl SockEvent {
    /// A client socket's event, from 10.0.0.1:40000 to `remote`: the one
    /// way every room's unit tests build events.
    pub(crate) fn client_test(ts_unix_ns: u64, kind: EventKind, remote: &str, idle_seconds: f64) -> Self {
        let local = "10.0.0.1:40000".parse().expect("a test address");
        let remote = remote.parse().unwrap_or_else(|e| panic!("test address {remote}: {e}"));
        Self::new(ts_unix_ns, kind, Role::Client, local, remote, idle_seconds)
    }

    /// Written by `comm`; a reuse with `outcome` answered after 1 ms, a
    /// peer's idle close by FIN: what most tests want of a kind.
    #[must_use]
    pub(crate) fn shaped(mut self, comm: &str, outcome: Option<Outcome>) -> Self {
        comm.clone_into(&mut self.comm);
        if let Some(o) = outcome {
            self.reuse_mut().outcome = o;
            self.set_elapsed(0.001);
        }
        if self.kind() == EventKind::PeerCloseWhileIdle {
            self.set_how(Some(How::Fin));
        }
        self
    }

    pub(crate) fn reuse_mut(&mut self) -> &mut Reuse {
        match &mut self.body {
            Body::Reuse(r) => r,
            other => panic!("not a reuse: {other:?}"),
        }
    }

    pub(crate) fn server_name_mut(&mut self) -> &mut FirstBytes {
        match &mut self.body {
            Body::ServerName(n) => n,
            other => panic!("not a server_name: {other:?}"),
        }
    }

    pub(crate) fn set_how(&mut self, to: Option<How>) {
        match &mut self.body {
            Body::Reuse(Reuse { how, .. })
            | Body::PeerCloseWhileIdle(PeerClose { how, .. })
            | Body::RequestAborted(Request { how, .. })
            | Body::RequestTimeout(Request { how, .. })
            | Body::DiscardedDead(Discarded { how, .. }) => *how = to,
            other => panic!("no how: {other:?}"),
        }
    }

    pub(crate) fn set_elapsed(&mut self, s: f64) {
        match &mut self.body {
            Body::Reuse(Reuse { elapsed_seconds, .. })
            | Body::RequestAborted(Request { elapsed_seconds, .. })
            | Body::RequestTimeout(Request { elapsed_seconds, .. })
            | Body::LateReuse(LateReuse { elapsed_seconds }) => *elapsed_seconds = s,
            Body::PeerCloseWhileIdle(PeerClose { elapsed_seconds, .. })
            | Body::DiscardedDead(Discarded { elapsed_seconds, .. }) => *elapsed_seconds = Some(s),
            other => panic!("no elapsed time: {other:?}"),
        }
    }
}

impl fmt::Display for SockEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {:<21} {:<7} pid={} comm={} {} -> {} idle={:.3}s",
            humantime::format_rfc3339_millis(self.time()),
            self.kind().as_str(),
            self.role.as_str(),
            self.pid,
            if self.comm.is_empty() { "?".to_owned() } else { printable(&self.comm) },
            self.local,
            self.remote,
            self.idle_seconds,
        )?;
        match &self.body {
            Body::Reuse(r) => {
                write!(f, " outcome={} after={:.3}s", r.outcome.as_str(), r.elapsed_seconds)?;
                write!(f, " retransmits={} safe_to_retry={}", r.retransmits, r.safe_to_retry)?;
                if r.failed_before_send {
                    write!(f, " failed_before_send")?;
                }
            }
            Body::ServerName(n) => {
                if let Some(name) = &n.server_name {
                    write!(f, " name={}", printable(name))?;
                }
                if let Some(p) = n.protocol {
                    write!(f, " protocol={}", p.as_str())?;
                }
            }
            Body::LocalClose(c) => {
                if c.request_outstanding {
                    write!(f, " request_outstanding")?;
                }
                if c.peer_closed_first {
                    write!(f, " peer_closed_first")?;
                }
                if c.control_write {
                    write!(f, " control_write")?;
                }
            }
            _ => {
                if let Some(e) = self.elapsed_seconds() {
                    write!(f, " after={e:.3}s")?;
                }
            }
        }
        if let Some(h) = self.how() {
            write!(f, " how={}", h.as_str())?;
        }
        if self.preexisting {
            write!(f, " preexisting")?;
        }
        if self.keepalive {
            match self.keepalive_idle_seconds {
                Some(k) => write!(f, " keepalive={k:.0}s")?,
                None => write!(f, " keepalive")?,
            }
        }
        if let Some(o) = &self.owner {
            if let Some(c) = &o.container {
                write!(f, " container={}", printable(c.get(..12).unwrap_or(c)))?;
            }
            if let Some(p) = &o.pod {
                write!(f, " pod={}", printable(p))?;
            }
            if o.container.is_none() {
                if let Some(u) = &o.unit {
                    write!(f, " unit={}", printable(u))?;
                }
            }
        }
        Ok(())
    }
}

/// A process name as it may be printed: control characters (which a
/// process can put in its own name to reach a terminal) become `\u{..}`
/// escapes.
#[must_use]
pub fn printable(name: &str) -> String {
    name.chars().map(|c| if c.is_control() { c.escape_unicode().to_string() } else { c.to_string() }).collect()
}

#[cfg(test)]
mod tests;

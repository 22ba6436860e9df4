//! The destination table's schema: the row every interface shows (`GET
//! /api/v1/destinations`, `observer status --json`, `observer analyze
//! --json`, the metrics and the report), the destination key and the enums
//! its fields take. No logic beyond naming lives here.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::named::named;

mod select;

pub use select::{describe, Select, SelectError};

use crate::{diagnosis::key::RowId, diagnosis::probed::ProbeEvidence, kernel::event::ResetFrom, kernel::owner::Owner};

named! {
    /// What the evidence says about how the path fails.
    pub enum FailureMode {
        /// A hop closes idle connections with FIN.
        Fin => "fin",
        /// A hop answers a reuse with RST.
        Rst => "rst",
        /// A hop drops idle flows silently: the reuse stalls.
        SilentDrop => "silent_drop",
        None => "none",
    }
}

named! {
    /// The verdict for a row.
    pub enum Verdict {
        /// Client row: the pool keeps sockets idle longer than the path allows.
        Mismatch => "mismatch",
        /// Server row: clients reuse connections longer than we keep them.
        ClientsMismatch => "clients_mismatch",
        /// The idle staircase provably holds.
        Ok => "ok",
        /// Not enough evidence.
        Unknown => "unknown",
    }
}

impl Verdict {
    /// A broken idle staircase, in either role.
    #[must_use]
    pub const fn is_mismatch(self) -> bool {
        matches!(self, Self::Mismatch | Self::ClientsMismatch)
    }
}

named! {
    /// The evidence a verdict rests on.
    pub enum VerdictEvidence {
        /// Reuses that failed at idle ages consistent with the path's timeout.
        Failures => "failures",
        /// A cluster of peer idle closes of pooled connections: the pool kept
        /// them idle past the path's timeout, before any reuse failed.
        PeerCloses => "peer_closes",
        /// The pool's own idle timeout lies at or past the path's.
        PoolIdleTimeout => "pool_idle_timeout",
        /// Server row: clients wrote on connections we had closed idle.
        LateReuses => "late_reuses",
        /// The pool (or the clients' pools) close idle sockets first.
        IdleCloses => "idle_closes",
    }
}

named! {
    /// Which survivals the lower bound rests on.
    pub enum LowerBasis {
        /// Sockets that sent nothing while idle: valid for every hop.
        Silent => "silent",
        /// Only sockets whose TCP keep-alive probes ran while idle: the probes
        /// refresh L4 middleboxes (conntrack, NAT, L4 balancers), so the bound
        /// holds for L7 hops only.
        Keepalive => "keepalive",
        /// Silent sockets, but the longest survivals were pings (answered
        /// exchanges of at most a control frame: HTTP/2 `PING`s, health
        /// checks): valid for every hop, and the connections never went
        /// longer without one, so nothing longer is known.
        Pings => "pings",
        /// `observer probe`'s connections: each kept silent until its one
        /// keep-alive probe, the first packet after its idle age, was
        /// answered (see the row's `probe`): valid for every hop.
        Probe => "probe",
    }
}

/// A change of the path estimate (the path's timeout was changed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub ts_unix_ns: u64,
    #[serde(flatten)]
    pub id: RowId,
    /// Interval before the change `[lower, upper]`.
    pub before_lower_seconds: Option<f64>,
    pub before_upper_seconds: Option<f64>,
    /// Interval after the change.
    pub after_lower_seconds: Option<f64>,
    pub after_upper_seconds: Option<f64>,
}

/// A peer restart: many pooled connections closed by the peer at once.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Restart {
    pub ts_unix_ns: u64,
    #[serde(flatten)]
    pub id: RowId,
    /// Connections the peer closed within the restart's span.
    pub sockets: usize,
    /// Their idle ages, smallest and largest.
    pub min_idle_seconds: f64,
    pub max_idle_seconds: f64,
}

/// One of several idle timeouts behind one address: a cluster of peer
/// idle closes (FIN or RST), or a silent path told by where its failures
/// begin (`lower_seconds`/`upper_seconds` set).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathShare {
    /// A cluster's median; a silent path's upper bound (its first
    /// failure), or its lower bound where none failed past the mix.
    pub idle_timeout_seconds: f64,
    /// Fraction of the peer idle closes in this cluster; for a silent
    /// path, of the flows (the failures among the reuses made at idle
    /// ages between the two paths' timeouts).
    pub share: f64,
    /// A silent path: the largest idle age it kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lower_seconds: Option<f64>,
    /// A silent path: the smallest idle age it failed at (null: none yet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upper_seconds: Option<f64>,
}

/// The resets a client row saw from one source: who sent them, how many
/// hops closer than the peer (a `path` device), and how many.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetShare {
    /// `peer`, `path` or `local`; null: not told (no SYN-ACK seen, a route
    /// change, or a kernel without the hooks that read it).
    pub from: Option<ResetFrom>,
    /// Hops closer than the peer it was made (`path`); 0 for the peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hops_closer: Option<u8>,
    pub resets: u64,
}

impl ResetShare {
    /// Who sent these resets, in words.
    #[must_use]
    pub fn describe(&self) -> String {
        match (self.from, self.hops_closer) {
            (Some(ResetFrom::Peer), _) => "the server itself".to_owned(),
            (Some(ResetFrom::Path), Some(h)) => format!(
                "a device {h} hop{} closer than the server (a firewall, NAT or load balancer on the path)",
                if h == 1 { "" } else { "s" }
            ),
            (Some(ResetFrom::Path), None) => "a device on the path".to_owned(),
            (Some(ResetFrom::Local), _) => "this host itself (its own firewall, conntrack or IPVS)".to_owned(),
            (None, _) => "a source that could not be told".to_owned(),
        }
    }
}

impl DestinationRow {
    /// Who sent the row's resets, in words, with the split where they came
    /// from more than one place (None: no reset seen).
    #[must_use]
    pub fn resets_in_words(&self) -> Option<String> {
        let total: u64 = self.resets.sources.iter().map(|s| s.resets).sum();
        if total == 0 {
            return None;
        }
        let Some(main) = self
            .resets
            .sources
            .iter()
            .find(|s| s.from == self.resets.from && s.hops_closer == self.resets.hops_closer && s.from.is_some())
        else {
            return Some(format!(
                "{total} reset(s); who sent them could not be told (the server's SYN-ACK was not seen, or this kernel does not allow the hooks that read it)"
            ));
        };
        let mut words = format!("the resets come from {}", main.describe());
        if main.from == Some(ResetFrom::Path) {
            words.push_str(", not from the server");
        }
        if self.resets.sources.len() > 1 {
            let others: Vec<String> = self
                .resets
                .sources
                .iter()
                .filter(|s| !std::ptr::eq(*s, main))
                .map(|s| format!("{} ({})", s.describe(), s.resets))
                .collect();
            let _ = write!(words, " ({} of {total}); also from {}", main.resets, others.join(", "));
        }
        Some(words)
    }
}

impl PathShare {
    /// A silent path, told by where its failures begin (not a cluster of
    /// peer closes).
    #[must_use]
    pub fn is_silent(&self) -> bool {
        self.lower_seconds.is_some() || self.upper_seconds.is_some()
    }

    /// A silent path's bracket or a cluster's value, then `unit`:
    /// "[1.950, 2.170] s", "2.000s".
    #[must_use]
    pub fn describe(&self, unit: &str) -> String {
        let s = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |x| format!("{x:.3}"));
        if self.is_silent() {
            format!("[{}, {}]{unit}", s(self.lower_seconds), s(self.upper_seconds))
        } else {
            format!("{:.3}{unit}", self.idle_timeout_seconds)
        }
    }
}

/// Failure ratio for one idle-age bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Upper edge in seconds (`null` = +Inf).
    pub le: Option<f64>,
    pub reuses: u64,
    pub failures: u64,
}

/// A row's estimate of the path's effective idle timeout: the point, the
/// interval and the evidence under each, the probe that narrowed it, a
/// sweep's band and the paths it splits into. Flattened into the row, so
/// the JSON keys are the row's own (`path_idle_timeout_seconds`, ...).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct PathEstimate {
    /// Point estimate from a cluster of peer closes (the smallest, with
    /// mixed paths).
    #[serde(rename = "path_idle_timeout_seconds")]
    pub idle_timeout_seconds: Option<f64>,
    /// Largest idle age proven to survive (0 without evidence).
    #[serde(rename = "path_idle_timeout_lower_seconds")]
    pub lower_seconds: f64,
    /// Smallest idle age proven to fail.
    #[serde(rename = "path_idle_timeout_upper_seconds")]
    pub upper_seconds: Option<f64>,
    #[serde(rename = "path_lower_evidence")]
    pub lower_evidence: usize,
    #[serde(rename = "path_upper_evidence")]
    pub upper_evidence: usize,
    #[serde(rename = "path_point_evidence")]
    pub point_evidence: usize,
    #[serde(rename = "path_outliers")]
    pub outliers: usize,
    /// Which survivals the lower bound rests on (null without one).
    #[serde(default, rename = "path_lower_basis")]
    pub lower_basis: Option<LowerBasis>,
    /// The latest `observer probe` of this destination within the window
    /// (null: none).
    #[serde(default)]
    pub probe: Option<ProbeEvidence>,
    /// The path estimate rests on that probe (its bracket narrowed the
    /// interval); false when the passive evidence already proved as much,
    /// or contradicts it (then it is shown, not used).
    #[serde(default)]
    pub probe_used: bool,
    /// A timeout enforced by a sweep or a coarse clock: the band of its
    /// peer closes, `[earliest, latest]` (null: a sharp timeout). The point
    /// and the recommendation then come from the earliest edge.
    #[serde(default, rename = "path_idle_timeout_spread_seconds")]
    pub spread_seconds: Option<[f64; 2]>,
    /// Two or more distinct clusters of peer idle closes, or two silent
    /// paths failing at different idle ages.
    #[serde(default)]
    pub mixed_paths: Vec<PathShare>,
}

/// Who sent the resets that ended a client row's connections in the
/// window (failed reuses, idle closes, aborted requests by RST), as the
/// row and the report's "our side" show it. Flattened: the JSON keys are
/// `reset_from`, `reset_hops_closer` and `reset_sources`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResetSources {
    /// The most common told source (`peer`, `path`, `local`); null when no
    /// reset was seen or none could be told.
    #[serde(default, rename = "reset_from")]
    pub from: Option<ResetFrom>,
    /// Hops closer than the peer that source is (0: the peer).
    #[serde(default, rename = "reset_hops_closer")]
    pub hops_closer: Option<u8>,
    /// Every source with its count, most first (as `mixed_paths` splits
    /// timeouts): more than one where resets came from several places.
    #[serde(default, rename = "reset_sources")]
    pub sources: Vec<ResetShare>,
}

/// A row's request deadlines: the peer's (it aborted our requests) and
/// ours (we gave up on its answers), each a cluster of the times seen,
/// and how many requests each ended in the window. Flattened into the row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Deadlines {
    /// The peer's request deadline: a cluster of `request_aborted` times.
    #[serde(default)]
    pub peer_request_deadline_seconds: Option<f64>,
    /// Our request timeout: a cluster of `request_timeout` times.
    #[serde(default)]
    pub request_timeout_seconds: Option<f64>,
    #[serde(default)]
    pub requests_aborted_window: u64,
    #[serde(default)]
    pub request_timeouts_window: u64,
}

/// A server row's side: our idle timeout toward clients, and what their
/// pools do (late reuses, the longest reuse age, their idle timeout).
/// Flattened into the row; empty on a client row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerSide {
    /// Our idle timeout toward clients (a cluster of our idle closes).
    #[serde(default)]
    pub server_idle_timeout_seconds: Option<f64>,
    /// Clients that wrote on connections we had closed idle.
    #[serde(default)]
    pub late_reuses: u64,
    /// The longest idle age after which a client reused a
    /// connection (a late reuse counts at the age of its write).
    #[serde(default)]
    pub client_max_reuse_idle_seconds: Option<f64>,
    /// The clients' pool idle timeout (a cluster of their idle closes).
    #[serde(default)]
    pub client_pool_idle_timeout_seconds: Option<f64>,
}

/// Client row: what our pool does with idle connections, from its own
/// closes and reuses. Flattened into the row (and the report's
/// `our_side`), so the keys are `pool_idle_timeout_seconds`, ...
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct OurPool {
    /// The pool's idle timeout, from a cluster of local idle closes.
    #[serde(rename = "pool_idle_timeout_seconds")]
    pub idle_timeout_seconds: Option<f64>,
    /// Longest idle age at which the pool reused a socket.
    #[serde(rename = "pool_max_reuse_idle_seconds")]
    pub max_reuse_idle_seconds: Option<f64>,
}

/// What a row counted: reuses and failed reuses in the last hour, and in
/// the window the failures, peer idle closes and peer restarts. Flattened
/// into the row.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counts {
    /// Reuses and failed reuses in the last hour.
    pub reuses: u64,
    pub failures: u64,
    /// Reuses, failed reuses and peer idle closes in the window.
    pub reuses_window: u64,
    pub failures_window: u64,
    pub peer_closes_window: u64,
    /// Peer restarts in the window, and the failed reuses they explain
    /// (counted in `failures_window`, never used as timeout evidence).
    #[serde(default)]
    pub peer_restarts: u64,
    #[serde(default)]
    pub restart_failures: u64,
    /// Failed reuses in the window that the client wrote while the peer's
    /// goodbye (an HTTP/2 `GOAWAY`, a TLS `close_notify`) waited unread:
    /// it did not honour the drain signal (counted in `failures_window`).
    #[serde(default)]
    pub failures_after_goodbye: u64,
    #[serde(default)]
    pub last_peer_restart_unix_ns: Option<u64>,
}

/// The window's evidence from sockets with TCP keep-alive on: a
/// keep-alive probe can keep a middlebox's idle timer from running out.
/// Flattened into the row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KeepAliveEvidence {
    /// Evidence in the window from sockets with TCP keep-alive on.
    #[serde(rename = "keepalive_evidence")]
    pub evidence: u64,
    /// Smallest keep-alive idle time among them, when known.
    #[serde(rename = "keepalive_idle_seconds")]
    pub idle_seconds: Option<f64>,
}

/// The sockets a row's processes hold now (the kernel's table, refreshed
/// with the at-risk view), and the dead ones the pool discarded in the
/// window. Flattened into the row.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct LiveSockets {
    /// Client row: sockets idle right now past the path's timeout (an
    /// estimate from it): each will likely fail on first use.
    pub at_risk_idle_sockets: u64,
    /// Client row: sockets a process holds now that are already dead (the
    /// peer closed or reset them, or the kernel timed them out, while idle,
    /// and nothing was written since): each fails on first use. Exact, from
    /// the kernel's socket state, refreshed with the at-risk view.
    #[serde(default)]
    pub doomed_idle_sockets: u64,
    /// Who holds them (at most 16).
    #[serde(default)]
    pub doomed_owners: Vec<ProcessOwner>,
    /// Client row: dead sockets the pool closed without writing on them
    /// (its checkout validation or reader saw the peer's close), in the
    /// window: failures it avoided.
    #[serde(default)]
    pub discarded_dead: u64,
}

/// One row of the destination table; the JSON interface of
/// `GET /api/v1/destinations`, `observer status --json` and
/// `observer analyze --json` (see README).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[allow(clippy::struct_excessive_bools, reason = "a flat JSON row")]
pub struct DestinationRow {
    /// Destination, role and network namespace.
    #[serde(flatten)]
    pub id: RowId,
    pub failure_mode: FailureMode,
    /// The path's effective idle timeout: point, bounds and what they rest on.
    #[serde(flatten)]
    pub path: PathEstimate,
    /// Client row: who sent the resets that ended its connections.
    #[serde(flatten)]
    pub resets: ResetSources,
    /// Client row: what our pool does (its idle timeout, its longest reuse).
    #[serde(flatten)]
    pub pool: OurPool,
    /// The verdict and the fix: `verdict`, `evidence`, the recommended
    /// timeouts, the retry rule and the recommendation in words.
    #[serde(flatten)]
    pub judgement: crate::diagnosis::verdict::Judgement,
    /// Reuses, failed reuses, peer closes and restarts, in the last hour
    /// and in the window.
    #[serde(flatten)]
    pub counts: Counts,
    /// Evidence from sockets with TCP keep-alive on.
    #[serde(flatten)]
    pub keepalive: KeepAliveEvidence,
    /// Request deadlines, ours and the peer's, and the requests they ended.
    #[serde(flatten)]
    pub deadlines: Deadlines,
    /// Server row: our idle timeout and what the clients' pools do.
    #[serde(flatten)]
    pub server: ServerSide,
    /// The sockets held now: at risk, already dead, and the dead ones the
    /// pool discarded.
    #[serde(flatten)]
    pub sockets: LiveSockets,
    pub first_failure_unix_ns: Option<u64>,
    pub last_failure_unix_ns: Option<u64>,
    pub processes: Vec<String>,
    /// Who the reusing processes are: name, and container, pod and unit
    /// where the cgroup path says (at most 16).
    #[serde(default)]
    pub owners: Vec<ProcessOwner>,
    pub idle_buckets: Vec<Bucket>,
    pub last_change: Option<Change>,
    /// Memory this row's evidence holds, bytes (bounded by
    /// [`crate::diagnosis::evidence::MAX_BYTES`]).
    #[serde(default)]
    pub evidence_bytes: usize,
    /// The host names clients used for this destination (TLS SNI, HTTP
    /// `Host`), most used first, at most four; empty with `--no-names`.
    #[serde(default)]
    pub server_names: Vec<ServerName>,
    /// Connections whose name did not fit in `server_names`.
    #[serde(default)]
    pub server_names_dropped: u64,
    /// The application protocols the connections' first bytes showed
    /// (`http1`, `h2`), most used first; empty where they told none (TLS
    /// offering both by ALPN, a binary protocol, `--no-names`).
    #[serde(default)]
    pub protocols: Vec<crate::kernel::first_bytes::Protocol>,
    /// Client rows: the TLS versions its connections negotiated (`TLSv1.3`,
    /// `TLSv1.2`, ...), newest first; empty for plain TCP, or where not told
    /// (`--no-names`, a connection older than the daemon).
    #[serde(default)]
    pub tls_versions: Vec<crate::kernel::first_bytes::TlsVersion>,
    /// Client rows: the fix in the reusing clients' own terms, one per
    /// runtime told (the setting, its default, what to set it to, and a
    /// default above the path's timeout as a finding); the generic rule
    /// for clients that could not be told. Empty without a recommendation.
    #[serde(default)]
    pub fix_settings: Vec<crate::diagnosis::clients::FixSetting>,
}

/// A name clients used for a destination, and how many connections used it
/// (since the daemon started, or since the store last had it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerName {
    pub name: String,
    pub connections: u64,
}

/// One process that reused connections to a destination, with what its
/// cgroup says about it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ProcessOwner {
    pub process: String,
    /// Its cgroup's owner (flattened: `cgroup`, `container`, `runtime`,
    /// `pod`, `unit`), absent when the cgroup was not resolved.
    #[serde(flatten, default)]
    pub owner: Option<Owner>,
}

impl ProcessOwner {
    /// The container id, when its cgroup path names one.
    #[must_use]
    pub fn container(&self) -> Option<&str> {
        self.owner.as_ref().and_then(|o| o.container.as_deref())
    }

    /// How reports name it: `api (container 0123456789ab, pod 1f2e…)`,
    /// `nginx (nginx.service)`, or the bare name.
    #[must_use]
    pub fn label(&self) -> String {
        let mut parts = Vec::new();
        let o = self.owner.as_ref();
        if let Some(c) = o.and_then(|o| o.container.as_ref()) {
            parts.push(format!("container {}", c.get(..12).unwrap_or(c)));
        }
        if let Some(p) = o.and_then(|o| o.pod.as_ref()) {
            parts.push(format!("pod {p}"));
        }
        if parts.is_empty() {
            if let Some(u) = o.and_then(|o| o.unit.as_ref()) {
                parts.push(u.clone());
            }
        }
        if parts.is_empty() {
            self.process.clone()
        } else {
            format!("{} ({})", self.process, parts.join(", "))
        }
    }
}

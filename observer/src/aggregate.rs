//! Per-destination diagnosis: turns the typed event stream (live or from a
//! recording) into the destination table: path idle timeout interval and
//! point, failure mode, pool idle timeout, verdict, recommendation, at-risk
//! idle sockets and the failure ratio by idle age. No aya here.
//!
//! A destination is the remote `ip:port` of client-role sockets and the local
//! listening `ip:port` of server-role sockets; sockets whose role is unknown
//! are left out, so ephemeral ports never become destinations. The estimation
//! rules are documented in [`crate::estimate`].
//!
//! Bounded: at most `max_destinations` destinations get their own row (the
//! rest are pooled under `other`), each keeps at most
//! [`MAX_EVIDENCE_PER_DESTINATION`] observations, and evidence older than the
//! window is dropped.

use std::{
    collections::{BTreeMap, HashMap, VecDeque},
    fmt,
    net::SocketAddr,
};

use serde::{Deserialize, Serialize};

use crate::{
    estimate::{self, Cluster, Interval},
    event::{EventKind, How, Outcome, Role, SockEvent, SocketView},
};

/// Observations kept per destination (oldest dropped first).
pub const MAX_EVIDENCE_PER_DESTINATION: usize = 4096;
/// Distinct process names remembered per destination.
const MAX_PROCESSES: usize = 16;
/// Changes of estimate remembered per destination.
const MAX_CHANGES: usize = 16;
/// Contradicting observations that start a new epoch.
const CHANGE_AFTER: usize = 3;
/// Upper edges (seconds) of the idle-age buckets of the low-traffic signature.
pub const IDLE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0, 75.0, 90.0, 120.0, 180.0, 240.0, 300.0, 350.0, 400.0, 600.0, 900.0,
    1200.0, 3600.0,
];
/// Recommended maximum connection lifetime (the seeds' five minutes): a
/// connection is never reused indefinitely, whatever the idle timeouts.
pub const RECOMMENDED_MAX_LIFETIME_SECONDS: f64 = 300.0;
const HOUR_NS: u64 = 3_600_000_000_000;

/// Settings of the aggregation.
#[derive(Debug, Clone)]
pub struct Config {
    /// Evidence older than this is dropped (ns).
    pub window_ns: u64,
    /// Destinations with their own row; the rest go to `other`.
    pub max_destinations: usize,
}

impl Default for Config {
    fn default() -> Self {
        Self { window_ns: 24 * HOUR_NS, max_destinations: 1000 }
    }
}

/// A destination's identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Destination {
    Addr(SocketAddr),
    /// Everything past the destination cap.
    Other,
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Addr(a) => write!(f, "{a}"),
            Self::Other => f.write_str("other"),
        }
    }
}

/// The destination an event belongs to, if any.
#[must_use]
pub fn destination_of(ev: &SockEvent) -> Option<(SocketAddr, Role)> {
    match ev.role {
        Role::Client => Some((ev.remote, Role::Client)),
        Role::Server => Some((ev.local, Role::Server)),
        Role::Unknown => None,
    }
}

/// What the evidence says about how the path fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureMode {
    /// A hop closes idle connections with FIN.
    Fin,
    /// A hop answers a reuse with RST.
    Rst,
    /// A hop drops idle flows silently: the reuse stalls.
    SilentDrop,
    None,
}

impl FailureMode {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Fin => "fin",
            Self::Rst => "rst",
            Self::SilentDrop => "silent_drop",
            Self::None => "none",
        }
    }
}

/// The verdict for a destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The pool keeps sockets idle longer than the path allows.
    Mismatch,
    /// The pool provably closes idle sockets before the path does.
    Ok,
    /// Not enough evidence.
    Unknown,
}

impl Verdict {
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Mismatch => "mismatch",
            Self::Ok => "ok",
            Self::Unknown => "unknown",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Alive,
    Dead(FailureMode),
    /// Our side closed an idle socket on its own initiative.
    LocalClose,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct Obs {
    ts_ns: u64,
    idle: f64,
    kind: Kind,
    /// A reuse (rather than a close).
    reuse: bool,
    /// A peer close while idle.
    peer_close: bool,
    /// The socket had TCP keep-alive on (its probes refresh L4 middleboxes).
    keepalive: bool,
    /// Its keep-alive idle time in seconds, 0 when unknown.
    keepalive_idle: f32,
}

/// A change of the path estimate (the path's timeout was changed).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Change {
    pub ts_unix_ns: u64,
    pub destination: String,
    pub role: Role,
    /// Interval before the change `[lower, upper]`.
    pub before_lower_seconds: Option<f64>,
    pub before_upper_seconds: Option<f64>,
    /// Interval after the change.
    pub after_lower_seconds: Option<f64>,
    pub after_upper_seconds: Option<f64>,
}

#[derive(Debug, Default)]
struct DestState {
    obs: VecDeque<Obs>,
    /// Evidence before this time belongs to an earlier epoch.
    epoch_start_ns: u64,
    /// Timestamps of contradicting observations in the current epoch,
    /// with their direction (true = the timeout looks shorter).
    contradictions: Vec<(u64, bool)>,
    processes: BTreeMap<String, u64>,
    changes: VecDeque<Change>,
    first_failure_ns: Option<u64>,
    last_failure_ns: Option<u64>,
    at_risk: u64,
    /// The interval of the current epoch as of `since_cache` observations ago.
    cached: Option<Interval>,
    since_cache: usize,
}

/// Failure ratio for one idle-age bucket.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bucket {
    /// Upper edge in seconds (`null` = +Inf).
    pub le: Option<f64>,
    pub reuses: u64,
    pub failures: u64,
}

/// One row of the destination table; the JSON interface of
/// `GET /api/v1/destinations`, `observer status --json` and
/// `observer analyze --json` (see README).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DestinationRow {
    pub destination: String,
    pub role: Role,
    pub failure_mode: FailureMode,
    /// Point estimate from a cluster of peer closes.
    pub path_idle_timeout_seconds: Option<f64>,
    /// Largest idle age proven to survive (0 without evidence).
    pub path_idle_timeout_lower_seconds: f64,
    /// Smallest idle age proven to fail.
    pub path_idle_timeout_upper_seconds: Option<f64>,
    pub path_lower_evidence: usize,
    pub path_upper_evidence: usize,
    pub path_point_evidence: usize,
    pub path_outliers: usize,
    /// The pool's idle timeout, from a cluster of local idle closes.
    pub pool_idle_timeout_seconds: Option<f64>,
    /// Longest idle age at which the pool reused a socket.
    pub pool_max_reuse_idle_seconds: Option<f64>,
    pub verdict: Verdict,
    pub recommended_pool_idle_timeout_seconds: Option<f64>,
    pub recommended_max_lifetime_seconds: Option<f64>,
    /// Retry once, only when no request byte reached a live peer.
    pub safe_retry_rule: bool,
    pub recommendation: String,
    /// Reuses and failed reuses in the last hour.
    pub reuses: u64,
    pub failures: u64,
    /// Reuses, failed reuses and peer idle closes in the window.
    pub reuses_window: u64,
    pub failures_window: u64,
    pub peer_closes_window: u64,
    /// Evidence in the window from sockets with TCP keep-alive on: their
    /// probes keep L4 middleboxes (conntrack, NAT) fresh, so they prove
    /// less about an L4 hop's idle timeout than silent sockets.
    pub keepalive_evidence: u64,
    /// Smallest keep-alive idle time among them, when known.
    pub keepalive_idle_seconds: Option<f64>,
    pub at_risk_idle_sockets: u64,
    pub first_failure_unix_ns: Option<u64>,
    pub last_failure_unix_ns: Option<u64>,
    pub processes: Vec<String>,
    pub idle_buckets: Vec<Bucket>,
    pub last_change: Option<Change>,
}

/// The destination table.
#[derive(Debug)]
pub struct Aggregator {
    config: Config,
    dests: HashMap<(Destination, Role), DestState>,
    /// Newest event time seen (the clock of a recording).
    latest_ns: u64,
    changes: Vec<Change>,
}

fn failure_mode(ev: &SockEvent) -> FailureMode {
    match (ev.kind, ev.outcome, ev.how) {
        (EventKind::PeerCloseWhileIdle, _, Some(How::Rst)) => FailureMode::Rst,
        (EventKind::PeerCloseWhileIdle, _, _) => FailureMode::Fin,
        // A reuse written after the peer's FIN failed because of that FIN.
        (_, Some(Outcome::Eof | Outcome::Reset), _) if ev.safe_to_retry => FailureMode::Fin,
        (_, Some(Outcome::Eof), _) => FailureMode::Fin,
        (_, Some(Outcome::Reset), _) => FailureMode::Rst,
        (_, Some(Outcome::Stall), _) => FailureMode::SilentDrop,
        _ => FailureMode::None,
    }
}

impl DestState {
    fn epoch(&self) -> impl Iterator<Item = &Obs> {
        let start = self.epoch_start_ns;
        self.obs.iter().filter(move |o| o.ts_ns >= start)
    }

    fn interval(&self) -> Interval {
        let (mut alive, mut dead) = (Vec::new(), Vec::new());
        for o in self.epoch() {
            match o.kind {
                Kind::Alive => alive.push(o.idle),
                Kind::Dead(_) => dead.push(o.idle),
                Kind::LocalClose => {}
            }
        }
        estimate::interval(&alive, &dead)
    }

    /// The interval, recomputed once the evidence has grown by a sixteenth
    /// since the last computation: change detection and the at-risk view can
    /// work from a slightly older estimate, and this keeps ingestion cheap
    /// (amortised O(log n) instead of O(n log n) per observation).
    fn interval_cached(&mut self) -> Interval {
        let n = self.obs.len();
        match self.cached {
            Some(i) if self.since_cache * 16 < n.max(16) => i,
            _ => {
                let i = self.interval();
                self.cached = Some(i);
                self.since_cache = 0;
                i
            }
        }
    }

    fn point(&self) -> Option<Cluster> {
        let peer: Vec<f64> = self.epoch().filter(|o| o.peer_close).map(|o| o.idle).collect();
        estimate::cluster(&peer)
    }
}

impl DestState {
    /// Change detection: does `obs` contradict the interval the earlier
    /// evidence gave (`before`)? Evidence confirming the old interval on
    /// the side the contradictions questioned clears them.
    fn note_contradiction(&mut self, obs: &Obs, before: &Interval) {
        let contradiction = match obs.kind {
            Kind::Dead(_) => before.lower.filter(|&l| obs.idle < l).map(|_| true),
            Kind::Alive => before.upper.filter(|&u| obs.idle > u).map(|_| false),
            Kind::LocalClose => None,
        };
        if let Some(shorter) = contradiction {
            self.contradictions.retain(|&(_, d)| d == shorter);
            self.contradictions.push((obs.ts_ns, shorter));
            return;
        }
        let confirms = match obs.kind {
            Kind::Alive => self.contradictions.iter().any(|&(_, shorter)| shorter),
            Kind::Dead(_) => self.contradictions.iter().any(|&(_, shorter)| !shorter),
            Kind::LocalClose => false,
        };
        if confirms {
            self.contradictions.clear();
        }
    }
}

impl Aggregator {
    #[must_use]
    pub fn new(config: Config) -> Self {
        Self { config, dests: HashMap::new(), latest_ns: 0, changes: Vec::new() }
    }

    /// Newest event time seen, ns since the epoch.
    #[must_use]
    pub const fn latest_ns(&self) -> u64 {
        self.latest_ns
    }

    /// Changes of estimate reported since the last call.
    pub fn take_changes(&mut self) -> Vec<Change> {
        std::mem::take(&mut self.changes)
    }

    fn slot(&mut self, addr: SocketAddr, role: Role) -> (Destination, Role) {
        let key = (Destination::Addr(addr), role);
        if self.dests.contains_key(&key) {
            return key;
        }
        let own = self.dests.keys().filter(|(d, _)| *d != Destination::Other).count();
        if own < self.config.max_destinations {
            key
        } else {
            (Destination::Other, role)
        }
    }

    /// Feed one event.
    pub fn ingest(&mut self, ev: &SockEvent) {
        self.latest_ns = self.latest_ns.max(ev.ts_unix_ns);
        let Some((addr, role)) = destination_of(ev) else { return };
        #[allow(clippy::cast_possible_truncation, reason = "keep-alive times are far below f32 precision limits")]
        let (keepalive, keepalive_idle) = (ev.keepalive, ev.keepalive_idle_seconds.unwrap_or(0.0) as f32);
        let obs = match ev.kind {
            EventKind::Reuse => match ev.outcome {
                Some(Outcome::Ok) => Obs {
                    ts_ns: ev.ts_unix_ns,
                    idle: ev.idle_seconds,
                    kind: Kind::Alive,
                    reuse: true,
                    peer_close: false,
                    keepalive,
                    keepalive_idle,
                },
                Some(_) => Obs {
                    ts_ns: ev.ts_unix_ns,
                    idle: ev.idle_seconds,
                    kind: Kind::Dead(failure_mode(ev)),
                    reuse: true,
                    peer_close: false,
                    keepalive,
                    keepalive_idle,
                },
                None => return,
            },
            EventKind::PeerCloseWhileIdle => Obs {
                ts_ns: ev.ts_unix_ns,
                idle: ev.idle_seconds,
                kind: Kind::Dead(failure_mode(ev)),
                reuse: false,
                peer_close: true,
                keepalive,
                keepalive_idle,
            },
            EventKind::LocalClose if ev.is_pool_idle_close() => Obs {
                ts_ns: ev.ts_unix_ns,
                idle: ev.idle_seconds,
                kind: Kind::LocalClose,
                reuse: false,
                peer_close: false,
                keepalive,
                keepalive_idle,
            },
            _ => return,
        };
        let key = self.slot(addr, role);
        let window = self.config.window_ns;
        let now = self.latest_ns;
        let st = self.dests.entry(key).or_default();
        if ev.kind == EventKind::Reuse && !ev.comm.is_empty() {
            if let Some(n) = st.processes.get_mut(&ev.comm) {
                *n += 1;
            } else if st.processes.len() < MAX_PROCESSES {
                st.processes.insert(ev.comm.clone(), 1);
            }
        }
        if obs.reuse && matches!(obs.kind, Kind::Dead(_)) {
            st.first_failure_ns.get_or_insert(obs.ts_ns);
            st.last_failure_ns = Some(obs.ts_ns);
        }
        let before = st.interval_cached();
        st.obs.push_back(obs);
        st.since_cache += 1;
        while st.obs.len() > MAX_EVIDENCE_PER_DESTINATION {
            st.obs.pop_front();
        }
        while st.obs.front().is_some_and(|o| o.ts_ns + window < now) {
            st.obs.pop_front();
        }
        st.note_contradiction(&obs, &before);
        if st.contradictions.len() >= CHANGE_AFTER {
            let start = st.contradictions[0].0;
            st.epoch_start_ns = start;
            st.contradictions.clear();
            st.cached = None;
            let after = st.interval();
            let change = Change {
                ts_unix_ns: obs.ts_ns,
                destination: key.0.to_string(),
                role,
                before_lower_seconds: before.lower,
                before_upper_seconds: before.upper,
                after_lower_seconds: after.lower,
                after_upper_seconds: after.upper,
            };
            if st.changes.len() >= MAX_CHANGES {
                st.changes.pop_front();
            }
            st.changes.push_back(change.clone());
            self.changes.push(change);
        }
    }

    /// The `destination` label of an evidence event already ingested: its
    /// address, or `other` past the cap. None for events of no destination.
    #[must_use]
    pub fn label_of(&self, ev: &SockEvent) -> Option<String> {
        let (addr, role) = destination_of(ev)?;
        if self.dests.contains_key(&(Destination::Addr(addr), role)) {
            Some(addr.to_string())
        } else if self.dests.contains_key(&(Destination::Other, role)) {
            Some(Destination::Other.to_string())
        } else {
            None
        }
    }

    /// Replace the at-risk view with the current idle sockets.
    pub fn set_sockets(&mut self, sockets: &[SocketView]) {
        for st in self.dests.values_mut() {
            st.at_risk = 0;
        }
        // Thresholds per destination: past the path timeout (the point, or
        // the largest idle age proven to survive) once a failure bounded it.
        let thresholds: HashMap<(Destination, Role), f64> = self
            .dests
            .iter_mut()
            .filter_map(|(k, st)| {
                let i = st.interval_cached();
                i.upper?;
                Some((*k, st.point().map(|c| c.value).or(i.lower).or(i.upper)?))
            })
            .collect();
        for s in sockets {
            let (addr, role) = match s.role {
                Role::Client => (s.remote, Role::Client),
                Role::Server => (s.local, Role::Server),
                Role::Unknown => continue,
            };
            let key = if self.dests.contains_key(&(Destination::Addr(addr), role)) {
                (Destination::Addr(addr), role)
            } else {
                (Destination::Other, role)
            };
            if let (Some(&th), Some(st)) = (thresholds.get(&key), self.dests.get_mut(&key)) {
                if s.idle_seconds > th {
                    st.at_risk += 1;
                }
            }
        }
    }

    /// The destination table, sorted by destination, as of `now_ns`.
    #[must_use]
    pub fn rows(&self, now_ns: u64) -> Vec<DestinationRow> {
        let mut rows: Vec<DestinationRow> = self.dests.iter().map(|(k, st)| self.row(k, st, now_ns)).collect();
        rows.sort_by(|a, b| (&a.destination, a.role).cmp(&(&b.destination, b.role)));
        rows
    }

    #[allow(clippy::too_many_lines, reason = "one row, field by field")]
    fn row(&self, key: &(Destination, Role), st: &DestState, now_ns: u64) -> DestinationRow {
        let in_window = |o: &&Obs| o.ts_ns + self.config.window_ns >= now_ns;
        let last_hour = |o: &&Obs| o.ts_ns + HOUR_NS >= now_ns;
        let interval = st.interval();
        let point = st.point();
        // Failure mode: the most common among dead evidence of this epoch.
        let mut modes: BTreeMap<&'static str, (usize, FailureMode)> = BTreeMap::new();
        for o in st.epoch() {
            if let Kind::Dead(m) = o.kind {
                modes.entry(m.as_str()).or_insert((0, m)).0 += 1;
            }
        }
        let failure_mode = modes.values().max_by_key(|(n, _)| *n).map_or(FailureMode::None, |(_, m)| *m);
        let local_closes: Vec<f64> =
            st.epoch().filter(|o| matches!(o.kind, Kind::LocalClose)).map(|o| o.idle).collect();
        let pool = estimate::cluster(&local_closes).map(|c| c.value);
        let pool_max_reuse = st.epoch().filter(|o| o.reuse).map(|o| o.idle).reduce(f64::max);
        let path = point.map(|c| c.value).or(interval.lower.filter(|_| interval.upper.is_some())).or(interval.upper);
        let failed_reuses = st.epoch().filter(|o| o.reuse && matches!(o.kind, Kind::Dead(_))).count();
        let verdict = match (interval.upper, interval.lower) {
            (Some(upper), _)
                if failed_reuses > 0
                    || pool.is_some_and(|p| p >= upper)
                    || pool_max_reuse.is_some_and(|m| m >= upper) =>
            {
                Verdict::Mismatch
            }
            (_, Some(lower)) if pool.is_some_and(|p| p <= lower) => Verdict::Ok,
            (Some(upper), _) if pool.is_some_and(|p| p < upper) => Verdict::Ok,
            _ => Verdict::Unknown,
        };
        let recommended = path.map(estimate::recommended_pool_idle);
        let safe_retry_rule = matches!(failure_mode, FailureMode::Fin | FailureMode::Rst);
        let recommendation = match (verdict, recommended) {
            (Verdict::Mismatch, Some(r)) => {
                let mut s = format!(
                    "set the pool idle timeout to at most {r:.3} s (0.8 x the path's {:.3} s) and a maximum connection lifetime of {RECOMMENDED_MAX_LIFETIME_SECONDS:.0} s",
                    path.unwrap_or_default()
                );
                if safe_retry_rule {
                    s.push_str("; retry once on a fresh connection only when no request byte reached a live peer (safe_to_retry)");
                }
                s
            }
            (Verdict::Ok, _) => "none: the pool closes idle sockets before the path does".to_owned(),
            (_, Some(r)) => format!(
                "keep the pool idle timeout at most {r:.3} s (0.8 x the path's {:.3} s)",
                path.unwrap_or_default()
            ),
            _ => "not enough evidence yet".to_owned(),
        };
        let mut buckets: Vec<Bucket> = IDLE_BUCKETS
            .iter()
            .map(|&le| Some(le))
            .chain(std::iter::once(None))
            .map(|le| Bucket { le, reuses: 0, failures: 0 })
            .collect();
        for o in st.obs.iter().filter(in_window).filter(|o| o.reuse) {
            let i = IDLE_BUCKETS.iter().position(|&le| o.idle <= le).unwrap_or(IDLE_BUCKETS.len());
            buckets[i].reuses += 1;
            if matches!(o.kind, Kind::Dead(_)) {
                buckets[i].failures += 1;
            }
        }
        let count = |f: &dyn Fn(&&Obs) -> bool, pred: &dyn Fn(&Obs) -> bool| {
            st.obs.iter().filter(f).filter(|o| pred(o)).count() as u64
        };
        DestinationRow {
            destination: key.0.to_string(),
            role: key.1,
            failure_mode,
            path_idle_timeout_seconds: point.map(|c| c.value),
            path_idle_timeout_lower_seconds: interval.lower.unwrap_or(0.0),
            path_idle_timeout_upper_seconds: interval.upper,
            path_lower_evidence: interval.lower_evidence,
            path_upper_evidence: interval.upper_evidence,
            path_point_evidence: point.map_or(0, |c| c.count),
            path_outliers: interval.outliers,
            pool_idle_timeout_seconds: pool,
            pool_max_reuse_idle_seconds: pool_max_reuse,
            verdict,
            recommended_pool_idle_timeout_seconds: recommended,
            recommended_max_lifetime_seconds: (verdict == Verdict::Mismatch)
                .then_some(RECOMMENDED_MAX_LIFETIME_SECONDS),
            safe_retry_rule,
            recommendation,
            reuses: count(&last_hour, &|o| o.reuse),
            failures: count(&last_hour, &|o| o.reuse && matches!(o.kind, Kind::Dead(_))),
            reuses_window: count(&in_window, &|o| o.reuse),
            failures_window: count(&in_window, &|o| o.reuse && matches!(o.kind, Kind::Dead(_))),
            peer_closes_window: count(&in_window, &|o| o.peer_close),
            keepalive_evidence: count(&in_window, &|o| o.keepalive),
            keepalive_idle_seconds: st
                .obs
                .iter()
                .filter(in_window)
                .filter(|o| o.keepalive && o.keepalive_idle > 0.0)
                .map(|o| f64::from(o.keepalive_idle))
                .reduce(f64::min),
            at_risk_idle_sockets: st.at_risk,
            first_failure_unix_ns: st.first_failure_ns,
            last_failure_unix_ns: st.last_failure_ns,
            processes: st.processes.keys().cloned().collect(),
            idle_buckets: buckets,
            last_change: st.changes.back().cloned(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::float_cmp, reason = "expected values are exact copies of the inputs")]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    fn ev(ts_s: f64, kind: EventKind, remote: &str, idle: f64) -> SockEvent {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "test times are small and positive")]
        let ts = (ts_s * 1e9) as u64 + 1_700_000_000 * S;
        let mut e =
            SockEvent::new(ts, kind, Role::Client, "10.0.0.1:40000".parse().unwrap(), remote.parse().unwrap(), idle);
        e.pid = 7;
        e.comm = "client".into();
        e.sock_id = 1;
        e
    }

    fn reuse(ts: f64, remote: &str, idle: f64, outcome: Outcome) -> SockEvent {
        let mut e = ev(ts, EventKind::Reuse, remote, idle);
        e.outcome = Some(outcome);
        e.elapsed_seconds = Some(0.001);
        e
    }

    fn peer_close(ts: f64, remote: &str, idle: f64) -> SockEvent {
        let mut e = ev(ts, EventKind::PeerCloseWhileIdle, remote, idle);
        e.how = Some(How::Fin);
        e
    }

    fn row<'a>(rows: &'a [DestinationRow], d: &str) -> &'a DestinationRow {
        rows.iter().find(|r| r.destination == d).unwrap()
    }

    /// Reuse outcome after `gap` for a path with timeout `t` and mode `o`.
    fn feed(agg: &mut Aggregator, ts: &mut f64, remote: &str, t: f64, gaps: &[f64], fail: Outcome) {
        for &g in gaps {
            *ts += g;
            agg.ingest(&reuse(*ts, remote, g, if g < t { Outcome::Ok } else { fail }));
        }
    }

    #[test]
    fn mismatch_with_recommendation() {
        let mut agg = Aggregator::new(Config::default());
        let mut ts = 0.0;
        let gaps: Vec<f64> = (0..20).map(|k| 30.0 + f64::from(k) * 3.0).collect(); // 30..87 s
        feed(&mut agg, &mut ts, "10.0.0.2:443", 60.0, &gaps, Outcome::Reset);
        let rows = agg.rows(agg.latest_ns());
        let r = row(&rows, "10.0.0.2:443");
        assert_eq!(r.verdict, Verdict::Mismatch);
        assert_eq!(r.failure_mode, FailureMode::Rst);
        assert_eq!(r.path_idle_timeout_lower_seconds, 57.0);
        assert_eq!(r.path_idle_timeout_upper_seconds, Some(60.0));
        assert_eq!(r.recommended_pool_idle_timeout_seconds, Some(45.6));
        assert!(r.safe_retry_rule);
        assert_eq!((r.reuses, r.failures), (20, 10));
        assert_eq!(r.processes, vec!["client".to_owned()]);
        let b60 = r.idle_buckets.iter().find(|b| b.le == Some(60.0)).unwrap();
        let b75 = r.idle_buckets.iter().find(|b| b.le == Some(75.0)).unwrap();
        assert_eq!((b60.reuses, b60.failures), (5, 1), "(45, 60]: only the reuse at exactly 60 s fails");
        assert_eq!((b75.reuses, b75.failures), (5, 5), "above it everything fails");
    }

    #[test]
    fn peer_close_cluster_gives_point_and_fin_mode() {
        let mut agg = Aggregator::new(Config::default());
        for (k, idle) in [60.01, 60.2, 59.98, 60.05].iter().enumerate() {
            agg.ingest(&peer_close(f64::from(u8::try_from(k).unwrap()) * 100.0, "[fd00::1]:80", *idle));
        }
        let rows = agg.rows(agg.latest_ns());
        let r = row(&rows, "[fd00::1]:80");
        assert_eq!(r.path_idle_timeout_seconds, Some(60.03));
        assert_eq!(r.path_point_evidence, 4);
        assert_eq!(r.failure_mode, FailureMode::Fin);
        assert_eq!(r.path_idle_timeout_upper_seconds, Some(59.98));
        assert_eq!(r.recommended_pool_idle_timeout_seconds, Some(48.024));
        assert_eq!(r.verdict, Verdict::Unknown, "peer closes alone do not show the pool reusing late");
    }

    #[test]
    fn no_failures_is_never_mismatch() {
        let mut agg = Aggregator::new(Config::default());
        let mut ts = 0.0;
        feed(&mut agg, &mut ts, "10.0.0.3:5432", f64::INFINITY, &[1.0, 5.0, 10.0], Outcome::Reset);
        let rows = agg.rows(agg.latest_ns());
        assert_eq!(row(&rows, "10.0.0.3:5432").verdict, Verdict::Unknown);
        // The pool's own idle closes at 8 s, below the 10 s proven alive: ok.
        for k in 0..3 {
            let mut e = ev(100.0 + f64::from(k), EventKind::LocalClose, "10.0.0.3:5432", 8.0 + f64::from(k) * 0.01);
            e.how = None;
            agg.ingest(&e);
        }
        let rows = agg.rows(agg.latest_ns());
        let r = row(&rows, "10.0.0.3:5432");
        assert_eq!(r.pool_idle_timeout_seconds, Some(8.01));
        assert_eq!(r.verdict, Verdict::Ok);
    }

    #[test]
    fn one_stray_reset_is_an_outlier() {
        let mut agg = Aggregator::new(Config::default());
        let mut ts = 0.0;
        let gaps: Vec<f64> = (0..20).map(|k| 30.0 + f64::from(k) * 3.0).collect();
        feed(&mut agg, &mut ts, "10.0.0.2:443", 60.0, &gaps, Outcome::Reset);
        agg.ingest(&reuse(ts + 10.0, "10.0.0.2:443", 4.0, Outcome::Reset));
        let rows = agg.rows(agg.latest_ns());
        let r = row(&rows, "10.0.0.2:443");
        assert_eq!((r.path_idle_timeout_lower_seconds, r.path_idle_timeout_upper_seconds), (57.0, Some(60.0)));
        assert_eq!(r.path_outliers, 1);
        assert!(r.last_change.is_none());
    }

    #[test]
    fn a_timeout_change_is_followed_within_a_few_failures() {
        let mut agg = Aggregator::new(Config::default());
        let mut ts = 0.0;
        let gaps: Vec<f64> = (0..40).map(|k| 30.0 + f64::from(k % 20) * 3.0).collect();
        feed(&mut agg, &mut ts, "10.0.0.2:443", 60.0, &gaps, Outcome::Reset);
        assert!(agg.take_changes().is_empty());
        // The balancer's idle timeout is lowered to 40 s.
        let new_gaps = [45.0, 50.0, 42.0, 35.0, 38.0, 55.0];
        feed(&mut agg, &mut ts, "10.0.0.2:443", 40.0, &new_gaps, Outcome::Reset);
        let changes = agg.take_changes();
        assert_eq!(changes.len(), 1, "{changes:?}");
        assert_eq!(changes[0].before_upper_seconds, Some(60.0));
        let rows = agg.rows(agg.latest_ns());
        let r = row(&rows, "10.0.0.2:443");
        assert_eq!(r.path_idle_timeout_upper_seconds, Some(42.0));
        assert_eq!(r.path_idle_timeout_lower_seconds, 38.0);
        assert!(r.last_change.is_some());
    }

    #[test]
    fn cardinality_is_capped() {
        let mut agg = Aggregator::new(Config { max_destinations: 1000, ..Config::default() });
        for k in 0..1200u32 {
            let remote = format!("10.{}.{}.1:443", k / 250, k % 250);
            agg.ingest(&reuse(f64::from(k), &remote, 2.0, Outcome::Ok));
        }
        let rows = agg.rows(agg.latest_ns());
        assert_eq!(rows.len(), 1001);
        let other = row(&rows, "other");
        assert_eq!(other.reuses_window, 200);
    }

    #[test]
    fn window_and_last_hour() {
        let mut agg = Aggregator::new(Config { window_ns: 2 * HOUR_NS, ..Config::default() });
        agg.ingest(&reuse(0.0, "10.0.0.2:443", 70.0, Outcome::Reset));
        agg.ingest(&reuse(5400.0, "10.0.0.2:443", 30.0, Outcome::Ok));
        let rows = agg.rows(agg.latest_ns());
        let r = row(&rows, "10.0.0.2:443");
        assert_eq!((r.reuses, r.failures, r.reuses_window), (1, 0, 2));
        agg.ingest(&reuse(9000.0, "10.0.0.2:443", 20.0, Outcome::Ok));
        let rows = agg.rows(agg.latest_ns());
        assert_eq!(row(&rows, "10.0.0.2:443").failures_window, 0, "the 0 s failure left the 2 h window");
    }

    #[test]
    fn at_risk_counts_idle_sockets_past_the_timeout() {
        let mut agg = Aggregator::new(Config::default());
        let mut ts = 0.0;
        feed(&mut agg, &mut ts, "10.0.0.2:443", 60.0, &[50.0, 58.0, 62.0, 70.0], Outcome::Eof);
        let view = |idle: f64, remote: &str| SocketView {
            local: "10.0.0.1:40001".parse().unwrap(),
            remote: remote.parse().unwrap(),
            role: Role::Client,
            idle_seconds: idle,
        };
        agg.set_sockets(&[
            view(10.0, "10.0.0.2:443"),
            view(59.0, "10.0.0.2:443"),
            view(300.0, "10.0.0.2:443"),
            view(900.0, "10.0.0.9:1"),
        ]);
        let rows = agg.rows(agg.latest_ns());
        assert_eq!(row(&rows, "10.0.0.2:443").at_risk_idle_sockets, 2);
    }

    #[test]
    fn unknown_roles_never_become_destinations() {
        let mut agg = Aggregator::new(Config::default());
        let mut e = reuse(1.0, "10.0.0.2:51000", 3.0, Outcome::Ok);
        e.role = Role::Unknown;
        agg.ingest(&e);
        assert!(agg.rows(agg.latest_ns()).is_empty());
    }
}

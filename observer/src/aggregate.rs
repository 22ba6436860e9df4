//! Per-destination diagnosis: turns the typed event stream (live or from a
//! recording) into the destination table. It routes each observation to its
//! row ([`crate::table::DestKey`]), keeps it ([`crate::evidence`]), watches
//! for peer restarts and changes of the path's timeout, and asks
//! [`crate::verdict`] for the verdict. No aya here.
//!
//! A destination is the remote `ip:port` of client-role sockets and the local
//! listening `ip:port` of server-role sockets; sockets whose role is unknown
//! are left out, so ephemeral ports never become destinations.
//!
//! Bounded: at most `max_destinations` rows of their own (the rest are
//! pooled under `other`; rows whose evidence has all left the window are
//! removed first, and counted), each holding at most
//! [`crate::evidence::MAX_BYTES`] of evidence.
//!
//! # Peer restarts
//!
//! A backend restart closes every pooled connection at once, each at its own
//! idle age. Peer idle closes are therefore held for [`RESTART_SPAN_NS`]
//! before they become evidence: when at least [`RESTART_MIN_SOCKETS`]
//! sockets of one destination were closed within that span at spread-out
//! idle ages (no cluster holds half of them), it is a restart. Neither those
//! closes nor the failed reuses of sockets that were idle across it, nor the
//! requests it aborted, are timeout or deadline evidence.
//!
//! # Change of timeout
//!
//! Evidence that falls on the wrong side of the current interval is a
//! contradiction. [`CHANGE_AFTER`] of them in one direction, from as many
//! distinct sockets, spread over at least [`CHANGE_SPREAD_NS`], with
//! nothing in between that confirms the old interval, no restart to
//! explain them, and as many observations backing the side of the old
//! interval they question, start a new epoch: later survivals and the dead evidence
//! from the first contradiction on make the new estimate.

use std::{
    collections::{BTreeMap, HashMap, HashSet, VecDeque},
    net::SocketAddr,
};

use crate::{
    estimate::{self, Interval},
    event::{DoomedView, Role, SockEvent, SocketView},
    evidence::{Evidence, Observation, Observed},
    verdict::{self, ClientFindings, ServerFindings},
};
pub use crate::{
    evidence::IDLE_BUCKETS,
    table::{
        Bucket, Change, DestKey, Destination, DestinationRow, FailureMode, LowerBasis, PathShare, ProcessOwner,
        Restart, RowId, Verdict, VerdictEvidence,
    },
    verdict::RECOMMENDED_MAX_LIFETIME_SECONDS,
};

/// Distinct process names remembered per destination.
const MAX_PROCESSES: usize = 16;
/// Changes of estimate and restarts remembered per destination.
const MAX_CHANGES: usize = 16;
/// Contradicting observations that start a new epoch.
pub const CHANGE_AFTER: usize = 3;
/// The contradictions of a new epoch span at least this long.
pub const CHANGE_SPREAD_NS: u64 = 5_000_000_000;
/// Peer closes within this span may form a restart.
pub const RESTART_SPAN_NS: u64 = 1_000_000_000;
/// Sockets a restart closes at least.
pub const RESTART_MIN_SOCKETS: usize = 4;
/// Peer closes held per destination at most (a storm is judged early).
const MAX_PENDING: usize = 4096;
const HOUR_NS: u64 = 3_600_000_000_000;

/// Settings of the aggregation.
#[derive(Debug, Clone)]
pub struct Config {
    /// Evidence older than this is dropped (ns).
    pub window_ns: u64,
    /// Destinations with their own row; the rest go to `other`.
    pub max_destinations: usize,
    /// Inode of the host's network namespace: its sockets' rows carry
    /// no `netns` (0: none known, every namespace is named).
    pub host_netns: u32,
}

impl Default for Config {
    fn default() -> Self {
        Self { window_ns: 24 * HOUR_NS, max_destinations: 1000, host_netns: 0 }
    }
}

/// The destination an event belongs to, if any.
#[must_use]
pub const fn destination_of(ev: &SockEvent) -> Option<(SocketAddr, Role)> {
    match ev.role {
        Role::Client => Some((ev.remote, Role::Client)),
        Role::Server => Some((ev.local, Role::Server)),
        Role::Unknown => None,
    }
}

#[derive(Debug, Clone, Copy)]
struct Contradiction {
    ts_ns: u64,
    /// The timeout looks shorter (a death below the lower bound), else
    /// longer (a silent survival above the upper bound).
    shorter: bool,
    sock_id: u64,
    idle: f64,
    since_ns: u64,
}

#[derive(Debug)]
struct DestState {
    ev: Evidence,
    /// Peer idle closes held back until no restart can include them.
    pending: Vec<Observed>,
    restarts: VecDeque<Restart>,
    contradictions: Vec<Contradiction>,
    processes: BTreeMap<ProcessOwner, u64>,
    changes: VecDeque<Change>,
    first_failure_ns: Option<u64>,
    last_failure_ns: Option<u64>,
    at_risk: u64,
    /// Dead sockets held now, and by whom.
    doomed: u64,
    doomed_owners: BTreeMap<ProcessOwner, u64>,
    /// The interval as of `since_cache` observations ago.
    cached: Option<Interval>,
    since_cache: usize,
    kept: usize,
}

/// The interval and which survivals its lower bound rests on: silent
/// sockets' when there are any, else keep-alive refreshed ones'.
fn interval_of(ev: &Evidence) -> (Interval, Option<LowerBasis>) {
    let dead: Vec<f64> = ev.dead().map(|d| d.idle).collect();
    let closes: Vec<f64> = ev.dead().filter(|d| d.close).map(|d| d.idle).collect();
    let band = estimate::spread(&closes);
    let interval = |alive: &[(f64, u64)]| match band {
        Some(b) => estimate::spread_interval(alive, &dead, b),
        None => estimate::interval_weighted(alive, &dead),
    };
    let silent = interval(&ev.alive(false));
    if silent.lower.is_some() {
        return (silent, Some(LowerBasis::Silent));
    }
    let all = interval(&ev.alive(true));
    if all.lower.is_some() {
        (all, Some(LowerBasis::Keepalive))
    } else {
        (silent, None)
    }
}

impl DestState {
    fn new(window_ns: u64) -> Self {
        Self {
            ev: Evidence::new(window_ns),
            pending: Vec::new(),
            restarts: VecDeque::new(),
            contradictions: Vec::new(),
            processes: BTreeMap::new(),
            changes: VecDeque::new(),
            first_failure_ns: None,
            last_failure_ns: None,
            at_risk: 0,
            doomed: 0,
            doomed_owners: BTreeMap::new(),
            cached: None,
            since_cache: 0,
            kept: 0,
        }
    }

    /// The interval, recomputed once the evidence has grown by a sixteenth
    /// since the last computation: change detection and the at-risk view can
    /// work from a slightly older estimate, and this keeps ingestion cheap.
    fn interval_cached(&mut self) -> Interval {
        match self.cached {
            Some(i) if self.since_cache * 16 < self.kept.max(16) => i,
            _ => {
                let i = interval_of(&self.ev).0;
                self.cached = Some(i);
                self.since_cache = 0;
                i
            }
        }
    }

    fn point(&self) -> Vec<estimate::Cluster> {
        let peer: Vec<f64> = self.ev.dead().filter(|d| d.close).map(|d| d.idle).collect();
        estimate::clusters(&peer)
    }

    /// Does a restart explain this observation?
    fn explained(&self, o: &Observed) -> bool {
        match o.obs {
            Observation::Reuse { failed: Some(_), .. } => self.restarts.iter().any(|r| {
                o.ts_ns + RESTART_SPAN_NS >= r.ts_unix_ns && o.idle_since_ns() <= r.ts_unix_ns + RESTART_SPAN_NS
            }),
            Observation::RequestAborted { .. } => {
                self.restarts.iter().any(|r| o.ts_ns.abs_diff(r.ts_unix_ns) <= RESTART_SPAN_NS)
            }
            _ => false,
        }
    }

    /// Keep an observation; a change of epoch it causes is returned.
    fn commit(&mut self, o: &Observed, key: DestKey) -> Option<Change> {
        let explained = self.explained(o);
        let before = self.interval_cached();
        self.ev.add(o, explained);
        if explained {
            return None;
        }
        self.kept += 1;
        self.since_cache += 1;
        if let Observation::Reuse { failed: Some(_), .. } = o.obs {
            self.first_failure_ns.get_or_insert(o.ts_ns);
            self.last_failure_ns = Some(o.ts_ns);
        }
        self.note_contradiction(o, &before);
        if !self.change_due() {
            return None;
        }
        if self.is_spread() {
            // The "new" timeout is the same band's other edge: a sweep's
            // jitter, not a change.
            self.contradictions.clear();
            self.cached = None;
            return None;
        }
        let start = self.contradictions[0].ts_ns;
        self.contradictions.clear();
        self.ev.new_epoch(start);
        self.cached = None;
        self.kept = 0;
        let after = interval_of(&self.ev).0;
        let change = Change {
            ts_unix_ns: o.ts_ns,
            destination: key.dest.to_string(),
            role: key.role,
            netns: key.netns(),
            before_lower_seconds: before.lower,
            before_upper_seconds: before.upper,
            after_lower_seconds: after.lower,
            after_upper_seconds: after.upper,
        };
        if self.changes.len() >= MAX_CHANGES {
            self.changes.pop_front();
        }
        self.changes.push_back(change.clone());
        Some(change)
    }

    /// Does `o` contradict the interval the earlier evidence gave
    /// (`before`)? Evidence confirming the old interval on the side the
    /// contradictions questioned clears them.
    fn note_contradiction(&mut self, o: &Observed, before: &Interval) {
        let (idle, dead, silent_alive) = match o.obs {
            Observation::Reuse { idle, failed, refreshed } => (idle, failed.is_some(), failed.is_none() && !refreshed),
            Observation::PeerIdleClose { idle, .. } | Observation::KeepaliveDeath { silent: idle } => {
                (idle, true, false)
            }
            _ => return,
        };
        // Inside a spread timeout's band, evidence either way is the sweep's
        // jitter.
        let jitter = before.spread.is_some_and(|b| b.holds(idle));
        let contradiction = if jitter {
            None
        } else if dead {
            before.lower.filter(|&l| idle < l).map(|_| true)
        } else if silent_alive {
            before.upper.filter(|&u| idle > u).map(|_| false)
        } else {
            None
        };
        if let Some(shorter) = contradiction {
            self.contradictions.retain(|c| c.shorter == shorter);
            self.contradictions.push(Contradiction {
                ts_ns: o.ts_ns,
                shorter,
                sock_id: o.sock_id,
                idle,
                since_ns: o.idle_since_ns(),
            });
            return;
        }
        // A survival at or past a "shorter" death refutes it; a death at or
        // below a "longer" survival refutes that.
        let refutes = |c: &Contradiction| if c.shorter { !dead && idle >= c.idle } else { dead && idle <= c.idle };
        if self.contradictions.iter().any(refutes) {
            self.contradictions.clear();
        }
    }

    /// The epoch's peer closes, the contradicting ones included, fill one
    /// band: a spread timeout.
    fn is_spread(&self) -> bool {
        let closes: Vec<f64> = self.ev.dead().filter(|d| d.close).map(|d| d.idle).collect();
        estimate::spread(&closes).is_some()
    }

    fn change_due(&self) -> bool {
        let c = &self.contradictions;
        let sockets: HashSet<u64> = c.iter().map(|c| c.sock_id).collect();
        c.len() >= CHANGE_AFTER
            && sockets.len() >= CHANGE_AFTER
            && c.last().map_or(0, |l| l.ts_ns).saturating_sub(c[0].ts_ns) >= CHANGE_SPREAD_NS
            && self.old_side_backed()
    }

    /// Is the old interval's side that the contradictions question backed
    /// by as many observations as they are? Deaths below the lower bound
    /// must each contradict [`CHANGE_AFTER`] survivals at or past them (a
    /// longer timeout's survivals past the upper bound, as many deaths at
    /// or below them); else one early survival, or one early close, would
    /// outvote three later ones and a sweep's jitter would read as a change.
    fn old_side_backed(&self) -> bool {
        let Some(first) = self.contradictions.first() else { return false };
        let need = u64::try_from(CHANGE_AFTER).unwrap_or(u64::MAX);
        if first.shorter {
            let worst = self.contradictions.iter().map(|c| c.idle).fold(f64::NEG_INFINITY, f64::max);
            self.ev.alive(true).iter().filter(|a| a.0 >= worst).map(|a| a.1).sum::<u64>() >= need
        } else {
            let worst = self.contradictions.iter().map(|c| c.idle).fold(f64::INFINITY, f64::min);
            let deaths = self.ev.dead().filter(|d| d.idle <= worst).count();
            u64::try_from(deaths).unwrap_or(u64::MAX) >= need
        }
    }

    /// Commit held peer closes that no restart can include any more (as of
    /// `now_ns`), or record the restart they form.
    fn flush(&mut self, now_ns: u64, key: DestKey) -> (Vec<Change>, Option<Restart>) {
        let mut changes = Vec::new();
        let mut restart = None;
        while let Some(first) = self.pending.first().copied() {
            if first.ts_ns + RESTART_SPAN_NS >= now_ns {
                break;
            }
            let n = self.pending.iter().take_while(|o| o.ts_ns <= first.ts_ns + RESTART_SPAN_NS).count();
            let group: Vec<Observed> = self.pending.drain(..n).collect();
            if let Some(r) = restart_of(&group, key) {
                self.ev.add_restart(r.ts_unix_ns);
                for o in &group {
                    self.ev.add(o, true);
                }
                self.ev.explain_failures(r.ts_unix_ns, RESTART_SPAN_NS);
                self.contradictions.retain(|c| {
                    !(c.ts_ns + RESTART_SPAN_NS >= r.ts_unix_ns && c.since_ns <= r.ts_unix_ns + RESTART_SPAN_NS)
                });
                self.cached = None;
                if self.restarts.len() >= MAX_CHANGES {
                    self.restarts.pop_front();
                }
                self.restarts.push_back(r.clone());
                restart = Some(r);
            } else {
                changes.extend(group.iter().filter_map(|o| self.commit(o, key)));
            }
        }
        (changes, restart)
    }
}

/// The restart a group of peer closes within one span forms, if any.
fn restart_of(group: &[Observed], key: DestKey) -> Option<Restart> {
    let sockets: HashSet<u64> = group.iter().map(|o| o.sock_id).collect();
    if sockets.len() < RESTART_MIN_SOCKETS {
        return None;
    }
    let ages: Vec<f64> = group
        .iter()
        .filter_map(|o| match o.obs {
            Observation::PeerIdleClose { idle, .. } => Some(idle),
            _ => None,
        })
        .collect();
    // A shared idle timeout closes sockets at one age: a cluster.
    if estimate::cluster(&ages).is_some_and(|c| c.count * 2 >= ages.len()) {
        return None;
    }
    let min = ages.iter().copied().reduce(f64::min)?;
    let max = ages.iter().copied().reduce(f64::max)?;
    if max <= min * (1.0 + 2.0 * estimate::CLUSTER_SPREAD) {
        return None;
    }
    Some(Restart {
        ts_unix_ns: group[0].ts_ns,
        destination: key.dest.to_string(),
        role: key.role,
        netns: key.netns(),
        sockets: sockets.len(),
        min_idle_seconds: min,
        max_idle_seconds: max,
    })
}

/// The destination table.
#[derive(Debug)]
pub struct Aggregator {
    config: Config,
    dests: HashMap<DestKey, DestState>,
    /// Newest event time seen (the clock of a recording).
    latest_ns: u64,
    changes: Vec<Change>,
    restarts: Vec<Restart>,
    evicted: u64,
    gone: Vec<RowId>,
    /// Event time of the last sweep.
    last_tick_ns: u64,
}

impl Aggregator {
    #[must_use]
    pub fn new(config: Config) -> Self {
        Self {
            config,
            dests: HashMap::new(),
            latest_ns: 0,
            changes: Vec::new(),
            restarts: Vec::new(),
            evicted: 0,
            gone: Vec::new(),
            last_tick_ns: 0,
        }
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

    /// Peer restarts detected since the last call.
    pub fn take_restarts(&mut self) -> Vec<Restart> {
        std::mem::take(&mut self.restarts)
    }

    /// Rows removed since the last call (their metric series can go).
    pub fn take_gone(&mut self) -> Vec<RowId> {
        std::mem::take(&mut self.gone)
    }

    /// Rows removed because their evidence left the window, in all.
    #[must_use]
    pub const fn evicted(&self) -> u64 {
        self.evicted
    }

    /// The key's namespace part: 0 for the host's.
    const fn netns_of(&self, netns: u32) -> u32 {
        if netns == self.config.host_netns {
            0
        } else {
            netns
        }
    }

    fn slot(&mut self, addr: SocketAddr, role: Role, netns: u32) -> DestKey {
        let key = DestKey { dest: Destination::Addr(addr), role, netns };
        if self.dests.contains_key(&key) {
            return key;
        }
        let own = |d: &HashMap<DestKey, DestState>| d.keys().filter(|k| k.dest != Destination::Other).count();
        if own(&self.dests) >= self.config.max_destinations && self.latest_ns >= self.last_tick_ns + RESTART_SPAN_NS {
            // Dead rows make room before anything lands in `other` (at most
            // once a second: a flood of new destinations past the cap must
            // not sweep the table on every event).
            self.tick(self.latest_ns);
        }
        if own(&self.dests) < self.config.max_destinations {
            key
        } else {
            DestKey { dest: Destination::Other, role, netns: 0 }
        }
    }

    /// Feed one event.
    pub fn ingest(&mut self, ev: &SockEvent) {
        self.latest_ns = self.latest_ns.max(ev.ts_unix_ns);
        let Some((addr, role)) = destination_of(ev) else { return };
        let Some(o) = Observed::of(ev) else { return };
        let key = self.slot(addr, role, self.netns_of(ev.netns));
        let now = self.latest_ns;
        let window = self.config.window_ns;
        let st = self.dests.entry(key).or_insert_with(|| DestState::new(window));
        let (changes, restart) = st.flush(now, key);
        self.changes.extend(changes);
        self.restarts.extend(restart);
        if matches!(o.obs, Observation::Reuse { .. }) && !ev.comm.is_empty() {
            let who = ProcessOwner {
                process: ev.comm.clone(),
                container: ev.container.clone(),
                pod: ev.pod.clone(),
                unit: ev.unit.clone(),
            };
            if let Some(n) = st.processes.get_mut(&who) {
                *n += 1;
            } else if st.processes.len() < MAX_PROCESSES {
                st.processes.insert(who, 1);
            }
        }
        if matches!(o.obs, Observation::PeerIdleClose { .. }) {
            if st.pending.len() >= MAX_PENDING {
                // A storm of closes: judge the oldest span now.
                let first = st.pending[0].ts_ns;
                let (changes, restart) = st.flush(first + RESTART_SPAN_NS + 1, key);
                self.changes.extend(changes);
                self.restarts.extend(restart);
            }
            let at = st.pending.partition_point(|p| p.ts_ns <= o.ts_ns);
            st.pending.insert(at, o);
        } else if let Some(c) = st.commit(&o, key) {
            self.changes.push(c);
        }
    }

    /// Bring the table to `now_ns`: commit held peer closes, expire
    /// evidence and drop rows that have none left.
    pub fn tick(&mut self, now_ns: u64) {
        let now = now_ns.max(self.latest_ns);
        self.last_tick_ns = now;
        for key in self.keys() {
            self.tick_one(key, now);
        }
    }

    /// [`Self::tick`] for one row; false when the row is gone.
    fn tick_one(&mut self, key: DestKey, now: u64) -> bool {
        let Some(st) = self.dests.get_mut(&key) else { return false };
        let (changes, restart) = st.flush(now, key);
        self.changes.extend(changes);
        self.restarts.extend(restart);
        st.ev.expire(now);
        if !(st.ev.is_empty() && st.pending.is_empty()) {
            return true;
        }
        self.dests.remove(&key);
        self.evicted += 1;
        if self.gone.len() < 4 * self.config.max_destinations.max(1) {
            self.gone.push(key.id());
        }
        false
    }

    /// The keys of the rows, for building the table a row at a time
    /// ([`Self::row_at`]) without holding the aggregator for all of it.
    #[must_use]
    pub fn keys(&self) -> Vec<DestKey> {
        self.dests.keys().copied().collect()
    }

    /// One row as of `now_ns`, brought up to date first like [`Self::tick`]
    /// does; None when it is gone (or left the window just now).
    pub fn row_at(&mut self, key: DestKey, now_ns: u64) -> Option<DestinationRow> {
        let now = now_ns.max(self.latest_ns);
        if !self.tick_one(key, now) {
            return None;
        }
        self.dests.get(&key).map(|st| row(key, st, now))
    }

    /// Sort rows as the table shows them.
    pub fn sort_rows(rows: &mut [DestinationRow]) {
        rows.sort_by(|a, b| (&a.destination, a.role, a.netns).cmp(&(&b.destination, b.role, b.netns)));
    }

    /// The input is complete (a recording): commit or classify every held
    /// peer close now instead of waiting for its span to pass.
    pub fn finish(&mut self) {
        let end = self.latest_ns.saturating_add(RESTART_SPAN_NS + 1);
        for (key, st) in &mut self.dests {
            let (changes, restart) = st.flush(end, *key);
            self.changes.extend(changes);
            self.restarts.extend(restart);
        }
    }

    /// The `destination` label of an evidence event already ingested: its
    /// address, or `other` past the cap. None for events of no destination.
    #[must_use]
    pub fn label_of(&self, ev: &SockEvent) -> Option<RowId> {
        let (addr, role) = destination_of(ev)?;
        let own = DestKey { dest: Destination::Addr(addr), role, netns: self.netns_of(ev.netns) };
        let other = DestKey { dest: Destination::Other, role, netns: 0 };
        [own, other].into_iter().find(|k| self.dests.contains_key(k)).map(|k| k.id())
    }

    /// The idle age past which a client socket is at risk, per client
    /// destination: past the path timeout (the point, or the largest idle
    /// age proven to survive) once a failure bounded it. Server rows have
    /// none: past our idle timeout minus the clients' margin is not ours to
    /// judge.
    fn risk_thresholds(&mut self) -> HashMap<DestKey, f64> {
        self.dests
            .iter_mut()
            .filter(|(k, _)| k.role == Role::Client)
            .filter_map(|(k, st)| {
                let i = st.interval_cached();
                let point = i.spread.map(|b| b.start).or_else(|| st.point().first().map(|c| c.value));
                if point.is_none() {
                    i.upper?;
                }
                Some((*k, point.or(i.lower).or(i.upper)?))
            })
            .collect()
    }

    /// The smallest idle age any socket can be at risk at now (None: no
    /// destination has a threshold). A socket no idler than this cannot be
    /// counted by [`Aggregator::set_sockets`], so the caller need not keep
    /// it.
    pub fn at_risk_floor(&mut self) -> Option<f64> {
        self.risk_thresholds().into_values().reduce(f64::min)
    }

    /// Replace the at-risk view with the current idle sockets.
    pub fn set_sockets(&mut self, sockets: &[SocketView]) {
        for st in self.dests.values_mut() {
            st.at_risk = 0;
        }
        let thresholds = self.risk_thresholds();
        for s in sockets {
            if s.role != Role::Client {
                continue;
            }
            let own = DestKey { dest: Destination::Addr(s.remote), role: Role::Client, netns: self.netns_of(s.netns) };
            let key =
                if self.dests.contains_key(&own) { own } else { DestKey { dest: Destination::Other, netns: 0, ..own } };
            if let (Some(&th), Some(st)) = (thresholds.get(&key), self.dests.get_mut(&key)) {
                if s.idle_seconds > th {
                    st.at_risk += 1;
                }
            }
        }
    }

    /// Replace the doomed-socket view: client sockets that are dead while
    /// their process holds them, each with its owner. A socket whose
    /// destination has no row counts in `other` when that row exists, else
    /// nowhere (no evidence of the destination yet: its peer close, which
    /// made a row, is what killed it, so this is rare and brief).
    pub fn set_doomed(&mut self, doomed: &[(DoomedView, ProcessOwner)]) {
        for st in self.dests.values_mut() {
            st.doomed = 0;
            st.doomed_owners.clear();
        }
        for (d, who) in doomed {
            let own = DestKey { dest: Destination::Addr(d.remote), role: Role::Client, netns: self.netns_of(d.netns) };
            let key =
                if self.dests.contains_key(&own) { own } else { DestKey { dest: Destination::Other, netns: 0, ..own } };
            if let Some(st) = self.dests.get_mut(&key) {
                st.doomed += 1;
                if let Some(n) = st.doomed_owners.get_mut(who) {
                    *n += 1;
                } else if st.doomed_owners.len() < MAX_PROCESSES {
                    st.doomed_owners.insert(who.clone(), 1);
                }
            }
        }
    }

    /// The destination table, sorted by destination, as of `now_ns`.
    pub fn rows(&mut self, now_ns: u64) -> Vec<DestinationRow> {
        self.tick(now_ns);
        let now = now_ns.max(self.latest_ns);
        let mut rows: Vec<DestinationRow> = self.dests.iter().map(|(k, st)| row(*k, st, now)).collect();
        Self::sort_rows(&mut rows);
        rows
    }
}

/// One row from a destination's evidence.
#[allow(clippy::too_many_lines, reason = "one row, field by field")]
fn row(key: DestKey, st: &DestState, now_ns: u64) -> DestinationRow {
    let ev = &st.ev;
    let counts = ev.counts();
    let (reuses, failures) = ev.last_hour(now_ns);
    let buckets = IDLE_BUCKETS
        .iter()
        .map(|&le| Some(le))
        .chain(std::iter::once(None))
        .zip(ev.buckets())
        .map(|(le, (reuses, failures))| Bucket { le, reuses, failures })
        .collect();
    let peer_clusters = st.point();
    let deadline = |v: Vec<f64>| estimate::cluster(&v).map(|c| c.value);
    let mut r = DestinationRow {
        destination: key.dest.to_string(),
        role: key.role,
        netns: key.netns(),
        failure_mode: FailureMode::None,
        path_idle_timeout_seconds: None,
        path_idle_timeout_lower_seconds: 0.0,
        path_idle_timeout_upper_seconds: None,
        path_lower_evidence: 0,
        path_upper_evidence: 0,
        path_point_evidence: 0,
        path_outliers: 0,
        path_lower_basis: None,
        path_idle_timeout_spread_seconds: None,
        mixed_paths: Vec::new(),
        pool_idle_timeout_seconds: None,
        pool_max_reuse_idle_seconds: None,
        verdict: Verdict::Unknown,
        evidence: None,
        recommended_pool_idle_timeout_seconds: None,
        recommended_max_lifetime_seconds: None,
        recommended_server_idle_timeout_seconds: None,
        safe_retry_rule: false,
        recommendation: String::new(),
        reuses,
        failures,
        reuses_window: counts.reuses,
        failures_window: counts.failures,
        peer_closes_window: counts.peer_closes,
        peer_restarts: counts.restarts,
        restart_failures: counts.restart_failures,
        last_peer_restart_unix_ns: st.restarts.back().map(|r| r.ts_unix_ns),
        keepalive_evidence: counts.keepalive,
        keepalive_idle_seconds: ev.min_keepalive_idle(),
        peer_request_deadline_seconds: deadline(ev.aborted()),
        request_timeout_seconds: deadline(ev.timeouts()),
        requests_aborted_window: counts.aborted,
        request_timeouts_window: counts.timeouts,
        server_idle_timeout_seconds: None,
        late_reuses: counts.late_reuses,
        client_max_reuse_idle_seconds: None,
        client_pool_idle_timeout_seconds: None,
        at_risk_idle_sockets: st.at_risk,
        doomed_idle_sockets: st.doomed,
        doomed_owners: st.doomed_owners.keys().cloned().collect(),
        discarded_dead: counts.discarded_dead,
        first_failure_unix_ns: st.first_failure_ns,
        last_failure_unix_ns: st.last_failure_ns,
        processes: st
            .processes
            .keys()
            .map(|p| p.process.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect(),
        owners: st.processes.keys().cloned().collect(),
        idle_buckets: buckets,
        last_change: st.changes.back().cloned(),
        evidence_bytes: ev.bytes(),
    };
    let judgement = if key.role == Role::Server {
        let f = ServerFindings {
            server_idle_timeout: estimate::cluster(&ev.local_closes()).map(|c| c.value),
            late_reuse_idles: ev.late_reuse_idles(),
            client_max_reuse_idle: ev.max_reuse_idle(),
            client_pool_idle_timeout: peer_clusters.first().map(|c| c.value),
        };
        r.server_idle_timeout_seconds = f.server_idle_timeout;
        r.client_max_reuse_idle_seconds = f.client_max_reuse_idle;
        r.client_pool_idle_timeout_seconds = f.client_pool_idle_timeout;
        verdict::judge_server(&f)
    } else {
        let (interval, basis) = interval_of(ev);
        // Failure mode: the most common among dead evidence of this epoch.
        let mut modes: BTreeMap<&'static str, (usize, FailureMode)> = BTreeMap::new();
        for d in ev.dead() {
            modes.entry(d.mode.as_str()).or_insert((0, d.mode)).0 += 1;
        }
        let mode = modes.values().max_by_key(|(n, _)| *n).map(|(_, m)| *m);
        let total_peer: usize = ev.dead().filter(|d| d.close).count();
        // A spread timeout's point is its band's start (what bites), never
        // a chance cluster inside the band.
        let point = match interval.spread {
            Some(b) => Some(estimate::Cluster { value: b.start, count: b.count }),
            None => peer_clusters.first().copied(),
        };
        let f = ClientFindings {
            interval,
            lower_basis: basis,
            point: point.map(|c| c.value),
            point_evidence: point.map_or(0, |c| c.count),
            paths: if interval.spread.is_some() { 1 } else { peer_clusters.len() },
            pool: estimate::cluster(&ev.local_closes()).map(|c| c.value),
            consistent_failures: interval.upper.map_or(0, |u| ev.dead().filter(|d| d.reuse && d.idle >= u).count()),
            failure_mode: mode,
        };
        r.failure_mode = mode.unwrap_or(FailureMode::None);
        r.path_idle_timeout_seconds = f.point;
        r.path_idle_timeout_lower_seconds = interval.lower.unwrap_or(0.0);
        r.path_idle_timeout_upper_seconds = interval.upper;
        r.path_lower_evidence = interval.lower_evidence;
        r.path_upper_evidence = interval.upper_evidence;
        r.path_point_evidence = f.point_evidence;
        r.path_outliers = interval.outliers;
        r.path_lower_basis = basis;
        r.path_idle_timeout_spread_seconds = interval.spread.map(|b| [b.earliest, b.latest]);
        if peer_clusters.len() > 1 && interval.spread.is_none() {
            #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
            let share = |n: usize| (n as f64 / total_peer.max(1) as f64 * 1000.0).round() / 1000.0;
            r.mixed_paths = peer_clusters
                .iter()
                .map(|c| PathShare { idle_timeout_seconds: c.value, share: share(c.count) })
                .collect();
        }
        r.pool_idle_timeout_seconds = f.pool;
        r.pool_max_reuse_idle_seconds = ev.max_reuse_idle();
        verdict::judge_client(&f)
    };
    r.verdict = judgement.verdict;
    r.evidence = judgement.evidence;
    r.recommended_pool_idle_timeout_seconds = judgement.recommended_pool_idle_timeout_seconds;
    r.recommended_max_lifetime_seconds = judgement.recommended_max_lifetime_seconds;
    r.recommended_server_idle_timeout_seconds = judgement.recommended_server_idle_timeout_seconds;
    r.safe_retry_rule = judgement.safe_retry_rule;
    r.recommendation = judgement.recommendation;
    r
}

#[cfg(test)]
mod tests;

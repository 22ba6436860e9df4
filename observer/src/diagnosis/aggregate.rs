//! Per-destination diagnosis: turns the typed event stream (live or from a
//! recording) into the destination table. It routes each observation to its
//! row ([`crate::diagnosis::key::DestKey`]), keeps it ([`crate::diagnosis::evidence`]), watches
//! for peer restarts and changes of the path's timeout, and asks
//! [`crate::diagnosis::verdict`] for the verdict. No aya here.
//!
//! A destination is the remote `ip:port` of client-role sockets and the local
//! listening `ip:port` of server-role sockets; sockets whose role is unknown
//! are left out, so ephemeral ports never become destinations.
//!
//! Bounded: at most `max_destinations` rows of their own (the rest are
//! pooled under `other`; rows whose evidence has all left the window are
//! removed first, and counted), each holding at most
//! [`crate::diagnosis::evidence::MAX_BYTES`] of evidence.
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

use std::{collections::HashMap, net::SocketAddr};

use crate::{
    diagnosis::estimate,
    diagnosis::evidence::{Observation, Observed},
    diagnosis::probed::ProbeEvidence,
    kernel::event::{Body, DoomedView, Role, SockEvent, SocketView},
};
pub use crate::{
    diagnosis::evidence::IDLE_BUCKETS,
    diagnosis::key::{DestKey, Destination, Netns, RowId},
    diagnosis::table::{
        Bucket, Change, DestinationRow, FailureMode, LowerBasis, PathShare, ProcessOwner, Restart, ServerName, Verdict,
        VerdictEvidence,
    },
    diagnosis::verdict::RECOMMENDED_MAX_LIFETIME_SECONDS,
};

mod row;
mod server_names;
mod state;

use row::row;
pub use server_names::MAX_NAMES;
use state::DestState;

/// Distinct process names remembered per destination.
pub(crate) const MAX_PROCESSES: usize = 16;
/// Changes of estimate and restarts remembered per destination.
pub(crate) const MAX_CHANGES: usize = 16;
/// Contradicting observations that start a new epoch.
pub const CHANGE_AFTER: usize = 3;
/// The contradictions of a new epoch span at least this long.
pub const CHANGE_SPREAD_NS: u64 = 5_000_000_000;
/// Peer closes within this span may form a restart.
pub const RESTART_SPAN_NS: u64 = 1_000_000_000;
/// Sockets a restart closes at least.
pub const RESTART_MIN_SOCKETS: usize = 4;
/// Peer closes held per destination at most (a storm is judged early).
pub(crate) const MAX_PENDING: usize = 4096;
/// Contradictions held per destination at most: past [`CHANGE_AFTER`] the
/// oldest decide (the new epoch starts at the first), and a stream of them
/// that never opens an epoch (the old side never backed) cannot grow the
/// table without bound.
pub(crate) const MAX_CONTRADICTIONS: usize = 1024;
pub(crate) const HOUR_NS: u64 = 3_600_000_000_000;

/// An evidence event as the aggregator took it: its row (`other` past the
/// cap) and its observation.
#[derive(Debug, Clone, PartialEq)]
pub struct Ingested {
    pub id: RowId,
    pub observed: Observed,
}

/// What one event did to the table: everything a consumer of the feed
/// needs, from [`Aggregator::feed`], the one way the daemon, the offline
/// exposition and the bench feed events.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Fed {
    /// The event's own row key (its address, never the overflow row; its
    /// namespace settled): what the store files it under.
    pub key: Option<DestKey>,
    /// The event as evidence: its row and what it proves (None: no evidence).
    pub ingested: Option<Ingested>,
    /// The event named its row anew (a name the row had not seen).
    pub fresh_name: bool,
    /// Peer restarts this event let the table judge.
    pub restarts: Vec<Restart>,
    /// Changes of a path estimate it caused.
    pub changes: Vec<Change>,
    /// Rows removed meanwhile (their metric series can go).
    pub gone: Vec<RowId>,
}

impl Fed {
    /// Whether the store keeps the event: evidence, or a name new to its row.
    #[must_use]
    pub const fn stored(&self) -> bool {
        self.ingested.is_some() || self.fresh_name
    }
}

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
    /// The names clients used, per destination (see `names`).
    names: HashMap<DestKey, server_names::Names>,
    /// The last `server_name` event ingested named its row anew.
    fresh_name: bool,
    /// The time of the oldest event still waiting upstream (for its owner,
    /// `daemon::held`): rows are not judged past it, so the peer closes of
    /// one restart are never split by the wait into a restart and timeout
    /// evidence.
    waiting_since_ns: Option<u64>,
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
            names: HashMap::new(),
            fresh_name: false,
            waiting_since_ns: None,
        }
    }

    /// Whether the last event ingested was a name new to its row (the
    /// store keeps those, so names survive a restart); reading clears it.
    pub fn take_fresh_name(&mut self) -> bool {
        std::mem::take(&mut self.fresh_name)
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

    /// The host's network namespace inode the table settles keys against
    /// (0: not known).
    #[must_use]
    pub const fn host_netns(&self) -> u32 {
        self.config.host_netns
    }

    /// The key's namespace part of an event's raw inode.
    const fn netns_of(&self, raw: u32) -> Netns {
        Netns::of(raw, self.config.host_netns)
    }

    /// The row an event of key `key` (its own address) goes to: its own,
    /// or its role's `other` row past the cap.
    fn slot(&mut self, key: DestKey) -> DestKey {
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
            DestKey::other(key.role)
        }
    }

    /// Feed one event and take everything it did: the one feed call.
    pub fn feed(&mut self, ev: &SockEvent) -> Fed {
        let ingested = self.ingest(ev);
        Fed {
            key: DestKey::of_event(ev, self.config.host_netns),
            ingested,
            fresh_name: self.take_fresh_name(),
            restarts: self.take_restarts(),
            changes: self.take_changes(),
            gone: self.take_gone(),
        }
    }

    /// Feed one event; for evidence, the row it went to and what it
    /// proves: the one classification the metrics, the store and the
    /// report use too (through [`Aggregator::feed`]).
    fn ingest(&mut self, ev: &SockEvent) -> Option<Ingested> {
        self.latest_ns = self.latest_ns.max(ev.ts_unix_ns);
        if let Body::ServerName(said) = &ev.body {
            self.fresh_name = self.note_name(ev, said);
            return None;
        }
        let own = DestKey::of_event(ev, self.config.host_netns)?;
        let o = Observed::of(ev)?;
        let key = self.slot(own);
        let now = self.latest_ns;
        let window = self.config.window_ns;
        let st = self.dests.entry(key).or_insert_with(|| DestState::new(window));
        let (changes, restart) = st.flush(now, key);
        self.changes.extend(changes);
        self.restarts.extend(restart);
        if matches!(o.what, Observation::Reuse { .. }) && !ev.comm.is_empty() {
            let process = ev.process.clone().unwrap_or_else(|| ev.comm.clone());
            let who = ProcessOwner { process, owner: ev.owner.clone() };
            if let Some(n) = st.processes.get_mut(&who) {
                *n += 1;
            } else if st.processes.len() < MAX_PROCESSES {
                st.processes.insert(who, 1);
            }
            // `None`: not told yet (or a recording from before runtimes).
            // An unreadable one is kept with the others: the fix says why
            // the runtime is not known.
            match ev.as_reuse().and_then(|r| r.client_runtime.as_ref()) {
                Some(rt) if rt.is_unknown() && !rt.unreadable => st.unknown_runtime = true,
                Some(rt) => {
                    if let Some(n) = st.runtimes.get_mut(rt) {
                        *n += 1;
                    } else if st.runtimes.len() < MAX_PROCESSES {
                        st.runtimes.insert(rt.clone(), 1);
                    }
                }
                None => {}
            }
        }
        if matches!(o.what, Observation::PeerIdleClose { .. }) {
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
        Some(Ingested { id: key.id(), observed: o })
    }

    /// Take what `observer probe` measured for a row (the latest one
    /// counts): the row is made when it has none yet, since the probe's
    /// own connections never make one. A probe older than the window, or
    /// older than the one the row holds, changes nothing.
    pub fn add_probe(&mut self, p: &ProbeEvidence) {
        if p.id.role != Role::Client || p.ts_unix_ns.saturating_add(self.config.window_ns) < self.latest_ns {
            return;
        }
        let Ok(addr) = p.id.destination.parse::<SocketAddr>() else { return };
        // A probe is an event of its row too: the row's clock moves to it.
        self.latest_ns = self.latest_ns.max(p.ts_unix_ns);
        // The probe stores its own namespace's inode: settled here.
        let own = DestKey {
            dest: Destination::Addr(addr),
            role: Role::Client,
            netns: self.netns_of(p.id.netns.inode().unwrap_or(0)),
        };
        let key = self.slot(own);
        if key.dest == Destination::Other {
            return;
        }
        let window = self.config.window_ns;
        let st = self.dests.entry(key).or_insert_with(|| DestState::new(window));
        if st.probe.as_ref().is_none_or(|old| old.ts_unix_ns <= p.ts_unix_ns) {
            st.probe = Some(ProbeEvidence { id: key.id(), ..p.clone() });
        }
    }

    /// Bring the table to `now_ns`: commit held peer closes, expire
    /// evidence and drop rows that have none left.
    pub fn tick(&mut self, now_ns: u64) {
        let now = self.judged_at(now_ns);
        self.last_tick_ns = now;
        self.expire_names(now);
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
        if st.probe.as_ref().is_some_and(|p| p.ts_unix_ns.saturating_add(self.config.window_ns) < now) {
            st.probe = None;
        }
        if !(st.ev.is_empty() && st.pending.is_empty() && st.probe.is_none()) {
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
        let now = self.judged_at(now_ns);
        if !self.tick_one(key, now) {
            return None;
        }
        self.dests.get(&key).map(|st| self.named(row(key, st, now, self.protocols_of(&key)), &key))
    }

    /// A row with its destination's names.
    fn named(&self, mut r: DestinationRow, key: &DestKey) -> DestinationRow {
        (r.server_names, r.server_names_dropped) = self.names_of(key);
        r.tls_versions = self.tls_of(key);
        r
    }

    /// Sort rows as the table shows them.
    pub fn sort_rows(rows: &mut [DestinationRow]) {
        rows.sort_by(|a, b| {
            (&a.id.destination, a.id.role, a.id.netns).cmp(&(&b.id.destination, b.id.role, b.id.netns))
        });
    }

    /// The input is complete (a recording): commit or classify every held
    /// peer close now instead of waiting for its span to pass.
    /// Feed history in order (the store's window at start-up): what it
    /// changed (changes, restarts, rows gone) is dropped, since replayed
    /// history is not news. Returns the events fed.
    pub fn replay<'a>(&mut self, events: impl IntoIterator<Item = &'a SockEvent>) -> usize {
        let mut n = 0;
        for ev in events {
            let _ = self.feed(ev);
            n += 1;
        }
        n
    }

    /// The table a finished recording (or a report's window) gives: every
    /// event fed, then the held peer closes judged as the stream's end.
    #[must_use]
    pub fn of_events<'a>(config: Config, events: impl IntoIterator<Item = &'a SockEvent>) -> Self {
        let mut agg = Self::new(config);
        agg.feed_to_end(events, |_, _| {});
        agg
    }

    /// Feed every event of a finished stream (a recording, a report's
    /// window), each with what it did handed to `each`, then judge the held
    /// peer closes as the stream's end ([`Aggregator::finish`]): "feed
    /// everything, then finish", written once for `observer analyze`,
    /// the exposition of a recording and the report.
    pub fn feed_to_end<E: std::borrow::Borrow<SockEvent>>(
        &mut self,
        events: impl IntoIterator<Item = E>,
        mut each: impl FnMut(E, Fed),
    ) {
        for ev in events {
            let fed = self.feed(ev.borrow());
            each(ev, fed);
        }
        self.finish();
    }

    pub fn finish(&mut self) {
        let end = self.latest_ns.saturating_add(RESTART_SPAN_NS + 1);
        for (key, st) in &mut self.dests {
            let (changes, restart) = st.flush(end, *key);
            self.changes.extend(changes);
            self.restarts.extend(restart);
        }
    }

    /// The idle age past which a client socket is at risk, per client
    /// destination: past the path timeout (the point, or the largest idle
    /// age proven to survive) once a failure bounded it, on the interval
    /// the row shows (a probe's bracket, the smallest of several paths).
    /// Server rows have none: past our idle timeout minus the clients'
    /// margin is not ours to judge.
    fn risk_thresholds(&mut self) -> HashMap<DestKey, f64> {
        self.dests
            .iter_mut()
            .filter(|(k, _)| k.role == Role::Client)
            .filter_map(|(k, st)| {
                let i = st.shown_interval(false).0;
                let point = estimate::point_of(&i, &st.point()).map(|c| c.value);
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
            let key = if self.dests.contains_key(&own) {
                own
            } else {
                DestKey { dest: Destination::Other, netns: Netns::HOST, ..own }
            };
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
            let key = if self.dests.contains_key(&own) {
                own
            } else {
                DestKey { dest: Destination::Other, netns: Netns::HOST, ..own }
            };
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

    /// Events from `oldest` on (their time) may still come: held upstream
    /// while their owner is looked for; `None` when nothing waits.
    pub fn set_waiting(&mut self, oldest: Option<u64>) {
        self.waiting_since_ns = oldest;
    }

    /// The time rows are judged at for a wall clock of `now_ns`: never
    /// before the newest event, never past an event still waiting.
    fn judged_at(&self, now_ns: u64) -> u64 {
        let now = now_ns.max(self.latest_ns);
        self.waiting_since_ns.map_or(now, |w| now.min(w).max(self.latest_ns))
    }

    /// The destination table, sorted by destination, as of `now_ns`.
    pub fn rows(&mut self, now_ns: u64) -> Vec<DestinationRow> {
        self.tick(now_ns);
        let now = self.judged_at(now_ns);
        let mut rows: Vec<DestinationRow> =
            self.dests.iter().map(|(k, st)| self.named(row(*k, st, now, self.protocols_of(k)), k)).collect();
        Self::sort_rows(&mut rows);
        rows
    }
}

#[cfg(test)]
mod tests;

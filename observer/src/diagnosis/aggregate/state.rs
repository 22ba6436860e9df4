//! One row's state: its evidence, the peer closes held back until no
//! restart can include them, the contradictions that may open a new epoch,
//! and the owners seen (the rules are in the parent module's doc).

use std::collections::{BTreeMap, HashSet, VecDeque};

use super::{CHANGE_AFTER, CHANGE_SPREAD_NS, MAX_CHANGES, MAX_CONTRADICTIONS, RESTART_MIN_SOCKETS, RESTART_SPAN_NS};
use crate::{
    diagnosis::estimate::{self, Interval},
    diagnosis::evidence::{Evidence, Observation, Observed},
    diagnosis::key::DestKey,
    diagnosis::probed::{self, Merged, ProbeEvidence},
    diagnosis::table::{Change, LowerBasis, ProcessOwner, Restart},
    kernel::runtime::ClientRuntime,
};

#[derive(Debug, Clone, Copy)]
pub(crate) struct Contradiction {
    pub(crate) ts_ns: u64,
    /// The timeout looks shorter (a death below the lower bound), else
    /// longer (a silent survival above the upper bound).
    pub(crate) shorter: bool,
    pub(crate) sock_id: u64,
    pub(crate) idle: f64,
    pub(crate) since_ns: u64,
}

#[derive(Debug)]
pub(crate) struct DestState {
    pub(crate) ev: Evidence,
    /// Peer idle closes held back until no restart can include them.
    pub(crate) pending: Vec<Observed>,
    pub(crate) restarts: VecDeque<Restart>,
    pub(crate) contradictions: Vec<Contradiction>,
    pub(crate) processes: BTreeMap<ProcessOwner, u64>,
    /// Client runtimes of the reusing processes (at most `MAX_PROCESSES`).
    pub(crate) runtimes: BTreeMap<ClientRuntime, u64>,
    /// A reusing process whose runtime could not be told.
    pub(crate) unknown_runtime: bool,
    pub(crate) changes: VecDeque<Change>,
    pub(crate) first_failure_ns: Option<u64>,
    pub(crate) last_failure_ns: Option<u64>,
    pub(crate) at_risk: u64,
    /// Dead sockets held now, and by whom.
    pub(crate) doomed: u64,
    pub(crate) doomed_owners: BTreeMap<ProcessOwner, u64>,
    /// The interval as of `since_cache` observations ago.
    pub(crate) cached: Option<Interval>,
    pub(crate) since_cache: usize,
    pub(crate) kept: usize,
    /// The latest `observer probe` of this row, until it leaves the window.
    pub(crate) probe: Option<ProbeEvidence>,
}

/// The interval and which survivals its lower bound rests on: silent
/// sockets' when there are any, else keep-alive refreshed ones'.
pub(crate) fn interval_of(ev: &Evidence) -> (Interval, Option<LowerBasis>) {
    let dead: Vec<f64> = ev.dead().map(|d| d.idle).collect();
    let closes: Vec<f64> = ev.dead().filter(|d| d.close).map(|d| d.idle).collect();
    // The closes' cluster is the timeout only where the reuses do not
    // prove deaths below it (see `estimate::spread_below`).
    let silent_alive = ev.alive(false);
    let plain = estimate::interval_weighted(&silent_alive, &dead);
    let band = estimate::spread_below(&closes, plain.upper);
    let interval = |alive: &[(f64, u64)], refreshed: bool| match band {
        Some(b) => estimate::spread_interval(alive, &dead, b),
        None => one_or_two_paths(ev, alive, &dead, refreshed),
    };
    let silent = interval(&silent_alive, false);
    if silent.lower.is_some() {
        return (silent, Some(LowerBasis::Silent));
    }
    // Two silent paths, the shorter one's survivals too few to bound it
    // from below: its first failure still bounds it from above, and that
    // stands. Keep-alive refreshed survivals are never split into paths,
    // so their one-step interval lies past the shorter path's failures (a
    // host run once showed [3.840, 3.900] s, and advised 3.072 s, for
    // paths that forget idle flows at 2 s and 4 s).
    if silent.paths.is_some() {
        return (silent, None);
    }
    let all = interval(&ev.alive(true), true);
    if all.lower.is_some() {
        (all, Some(LowerBasis::Keepalive))
    } else {
        (silent, None)
    }
}

/// The one-step interval, or the shorter path's where more than a stray
/// few failures lie below its cut (see `estimate::two_paths`) and
/// survivals (silent ones: `refreshed` off) went on at the ages where
/// failures began. Where they
/// stopped, the failures are a change of timeout in progress: time
/// tells the two apart where ages alone cannot.
fn one_or_two_paths(ev: &Evidence, alive: &[(f64, u64)], dead: &[f64], refreshed: bool) -> Interval {
    let one = estimate::interval_weighted(alive, dead);
    // Survivals that keep-alive probes kept fresh lie past a NAT's timeout
    // on the one path: beside the failures of unrefreshed flows they would
    // pass for a second, longer path. Two paths are told from silent
    // evidence only.
    if refreshed || one.outliers < estimate::CLUSTER_MIN {
        return one;
    }
    let Some(two) = estimate::two_paths(alive, dead, &ev.flows()) else { return one };
    let Some(p) = two.paths else { return one };
    let hi = p.long_upper.unwrap_or(f64::INFINITY);
    let first_failure = ev.dead().filter(|d| d.idle >= p.short_upper && d.idle < hi).map(|d| d.ts_ns).min();
    match first_failure {
        Some(ts) if ev.survived_after(ts, p.short_upper, hi, refreshed) => two,
        _ => one,
    }
}

impl DestState {
    pub(crate) fn new(window_ns: u64) -> Self {
        Self {
            ev: Evidence::new(window_ns),
            pending: Vec::new(),
            restarts: VecDeque::new(),
            contradictions: Vec::new(),
            processes: BTreeMap::new(),
            runtimes: BTreeMap::new(),
            unknown_runtime: false,
            changes: VecDeque::new(),
            first_failure_ns: None,
            last_failure_ns: None,
            at_risk: 0,
            doomed: 0,
            doomed_owners: BTreeMap::new(),
            cached: None,
            since_cache: 0,
            kept: 0,
            probe: None,
        }
    }

    /// The interval, recomputed once the evidence has grown by a sixteenth
    /// since the last computation: change detection and the at-risk view can
    /// work from a slightly older estimate, and this keeps ingestion cheap.
    pub(crate) fn interval_cached(&mut self) -> Interval {
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

    /// The interval a client row shows, and the at-risk view judges by:
    /// the evidence's ([`interval_of`]), the smallest path's where peer
    /// closes cluster at several timeouts, narrowed by what `observer
    /// probe` measured where the two agree. The basis says what its lower
    /// bound rests on: pings only where the connections speak HTTP/2
    /// (`h2`: elsewhere a small answered exchange is a small request, a
    /// Redis PING, a memcached get).
    pub(crate) fn shown_interval(&self, h2: bool) -> (Interval, Option<LowerBasis>, Option<Merged>) {
        let ev = &self.ev;
        let (mut interval, mut basis) = interval_of(ev);
        if let (Some(LowerBasis::Silent), Some(lower)) = (basis, interval.lower) {
            if h2 && ev.max_unpinged_alive().is_none_or(|m| m < lower) {
                basis = Some(LowerBasis::Pings);
            }
        }
        let peer_clusters = self.point();
        if interval.spread.is_none() && peer_clusters.len() > 1 {
            let alive = ev.alive(basis == Some(LowerBasis::Keepalive));
            let dead: Vec<f64> = ev.dead().map(|d| d.idle).collect();
            interval = estimate::smallest_path_interval(&alive, &dead, peer_clusters[0].value);
        }
        let merged = self.probe.as_ref().map(|p| probed::merge(&mut interval, p));
        if merged == Some(Merged::RaisedLower) {
            basis = Some(LowerBasis::Probe);
        }
        (interval, basis, merged)
    }

    pub(crate) fn point(&self) -> Vec<estimate::Cluster> {
        let peer: Vec<f64> = self.ev.dead().filter(|d| d.close).map(|d| d.idle).collect();
        estimate::clusters(&peer)
    }

    /// Does a restart explain this observation?
    pub(crate) fn explained(&self, o: &Observed) -> bool {
        match o.what {
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
    pub(crate) fn commit(&mut self, o: &Observed, key: DestKey) -> Option<Change> {
        let explained = self.explained(o);
        let before = self.interval_cached();
        self.ev.add(o, explained);
        if explained {
            return None;
        }
        self.kept += 1;
        self.since_cache += 1;
        if let Observation::Reuse { failed: Some(_), .. } = o.what {
            self.first_failure_ns.get_or_insert(o.ts_ns);
            self.last_failure_ns = Some(o.ts_ns);
        }
        self.note_contradiction(o, &before);
        if !self.change_due() {
            return None;
        }
        if self.is_spread_or_mixed() {
            // The "new" timeout is the same band's other edge (a sweep's
            // jitter) or the other of two paths: not a change.
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
            id: key.id(),
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

    /// Memory held beside the evidence: peer closes waiting for the restart
    /// judgement and contradictions waiting for a change (both capped).
    pub(crate) fn held_bytes(&self) -> usize {
        self.pending.capacity() * std::mem::size_of::<Observed>()
            + self.contradictions.capacity() * std::mem::size_of::<Contradiction>()
    }

    /// Does `o` contradict the interval the earlier evidence gave
    /// (`before`)? Evidence confirming the old interval on the side the
    /// contradictions questioned clears them.
    pub(crate) fn note_contradiction(&mut self, o: &Observed, before: &Interval) {
        let (idle, dead, silent_alive) = match o.what {
            Observation::Reuse { after_stall: true, .. } => return,
            Observation::Reuse { idle, failed, refreshed, .. } => {
                (idle, failed.is_some(), failed.is_none() && !refreshed)
            }
            Observation::PeerIdleClose { idle, .. } | Observation::KeepaliveDeath { silent: idle } => {
                (idle, true, false)
            }
            _ => return,
        };
        // Inside a spread timeout's band, evidence either way is the sweep's
        // jitter; inside the mix of two paths, evidence either way is the mix.
        let jitter = before.spread.is_some_and(|b| b.holds(idle)) || before.paths.is_some_and(|p| p.mixes(idle));
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
            if self.contradictions.len() >= MAX_CONTRADICTIONS {
                return;
            }
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
    /// band (a spread timeout), or its evidence shows two paths.
    pub(crate) fn is_spread_or_mixed(&self) -> bool {
        let i = interval_of(&self.ev).0;
        i.spread.is_some() || i.paths.is_some()
    }

    pub(crate) fn change_due(&self) -> bool {
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
    pub(crate) fn old_side_backed(&self) -> bool {
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
    pub(crate) fn flush(&mut self, now_ns: u64, key: DestKey) -> (Vec<Change>, Option<Restart>) {
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
pub(crate) fn restart_of(group: &[Observed], key: DestKey) -> Option<Restart> {
    let sockets: HashSet<u64> = group.iter().map(|o| o.sock_id).collect();
    if sockets.len() < RESTART_MIN_SOCKETS {
        return None;
    }
    let ages: Vec<f64> = group
        .iter()
        .filter_map(|o| match o.what {
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
        id: key.id(),
        sockets: sockets.len(),
        min_idle_seconds: min,
        max_idle_seconds: max,
    })
}

//! The evidence window of one row: what is kept of each observation
//! (binned survivals, exact deaths, timed values, per-minute counts) in
//! time slices, bounded, and the queries the estimators make of it.

use std::collections::{HashMap, VecDeque};

use super::{
    flows::FlowTable, resets::ResetCounts, secs_to_ns, Observation, Observed, IDLE_BUCKETS, MAX_BINS_PER_SLICE,
    MAX_DEAD, MAX_SLICES, MAX_TIMED, MINUTE_NS, N_BUCKETS, SLICES,
};
use crate::diagnosis::{estimate::FlowSurvival, table::FailureMode};

/// A failed reuse or a peer idle close, kept exactly.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Dead {
    pub ts_ns: u64,
    pub idle: f64,
    pub sock_id: u64,
    pub mode: FailureMode,
    /// A failed reuse (else a peer idle close or a keep-alive death).
    pub reuse: bool,
    /// A peer idle close: a direct measurement of a hop's timeout (a point
    /// candidate); a failed reuse or a keep-alive death only bounds it.
    pub close: bool,
    pub epoch: u32,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Timed {
    pub(crate) ts_ns: u64,
    pub(crate) value: f64,
    pub(crate) epoch: u32,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Bin {
    pub(crate) key: i16,
    pub(crate) refreshed: bool,
    pub(crate) count: u32,
    pub(crate) min: f64,
    pub(crate) max: f64,
    /// When the bin last took a survival: whether survivals went on
    /// after failures began at the same ages (two paths) or stopped (a
    /// change of timeout).
    pub(crate) last_ns: u64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Minute {
    pub(crate) index: u64,
    pub(crate) reuses: u32,
    pub(crate) failures: u32,
}

/// Exact counters of a slice.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counts {
    pub reuses: u64,
    pub failures: u64,
    pub peer_closes: u64,
    pub keepalive: u64,
    pub late_reuses: u64,
    pub restarts: u64,
    pub restart_failures: u64,
    /// Failed reuses written past the peer's goodbye (a `GOAWAY` unread).
    pub after_goodbye: u64,
    pub aborted: u64,
    pub timeouts: u64,
    /// Dead sockets the pool discarded without writing on them.
    pub discarded_dead: u64,
    /// Resets that ended this row's connections, by who sent them.
    pub resets: ResetCounts,
}

impl Counts {
    pub(crate) fn add(&mut self, o: &Self) {
        self.reuses += o.reuses;
        self.failures += o.failures;
        self.peer_closes += o.peer_closes;
        self.keepalive += o.keepalive;
        self.late_reuses += o.late_reuses;
        self.restarts += o.restarts;
        self.restart_failures += o.restart_failures;
        self.after_goodbye += o.after_goodbye;
        self.aborted += o.aborted;
        self.timeouts += o.timeouts;
        self.discarded_dead += o.discarded_dead;
        self.resets.add(&o.resets);
    }
}

#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Slice {
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
    pub(crate) epoch: u32,
    pub(crate) bins: Vec<Bin>,
    pub(crate) counts: Counts,
    /// Smallest keep-alive idle time among keep-alive evidence (0 = none).
    pub(crate) min_keepalive_idle: f32,
    /// Longest idle age of any reuse (ok or failed, or a late reuse's write).
    pub(crate) max_reuse_idle: Option<f64>,
    /// Longest idle age survived by silent evidence that was no ping (a
    /// reuse of more than a control frame, or a keep-alive probe's age).
    pub(crate) max_unpinged_alive: Option<f64>,
    /// Pings answered (reuses of at most a control frame) and the sum of
    /// their idle ages: how often the connections were pinged.
    pub(crate) pings: (u32, f64),
    pub(crate) buckets: [(u32, u32); N_BUCKETS],
}

impl Slice {
    pub(crate) fn new(ts_ns: u64, epoch: u32) -> Self {
        Self {
            start_ns: ts_ns,
            end_ns: ts_ns,
            epoch,
            bins: Vec::new(),
            counts: Counts::default(),
            min_keepalive_idle: 0.0,
            max_reuse_idle: None,
            max_unpinged_alive: None,
            pings: (0, 0.0),
            buckets: [(0, 0); N_BUCKETS],
        }
    }

    pub(crate) fn add_alive(&mut self, idle: f64, refreshed: bool, ts_ns: u64) {
        self.absorb(Bin { key: bin_key(idle), refreshed, count: 1, min: idle, max: idle, last_ns: ts_ns });
    }

    /// Take in a bin: the same bin grows; a new one is added while there is
    /// room, else the nearest bin of its kind takes it (bins only ever hold
    /// ages that were really observed).
    pub(crate) fn absorb(&mut self, bin: Bin) {
        let at = match self.bins.iter().position(|b| b.key == bin.key && b.refreshed == bin.refreshed) {
            Some(i) => i,
            None if self.bins.len() < MAX_BINS_PER_SLICE => {
                self.bins.push(Bin { count: 0, ..bin });
                self.bins.len() - 1
            }
            None => {
                let near = self
                    .bins
                    .iter()
                    .enumerate()
                    .filter(|(_, b)| b.refreshed == bin.refreshed)
                    .min_by_key(|(_, b)| (i32::from(b.key) - i32::from(bin.key)).abs())
                    .map(|(i, _)| i);
                let Some(i) = near else {
                    // Full of the other kind only: its oldest bin makes room
                    // (its reuses stay counted).
                    self.bins.remove(0);
                    self.bins.push(bin);
                    return;
                };
                i
            }
        };
        let b = &mut self.bins[at];
        b.count = b.count.saturating_add(bin.count);
        b.min = b.min.min(bin.min);
        b.max = b.max.max(bin.max);
        b.last_ns = b.last_ns.max(bin.last_ns);
    }

    pub(crate) fn merge(&mut self, other: &Self) {
        self.start_ns = self.start_ns.min(other.start_ns);
        self.end_ns = self.end_ns.max(other.end_ns);
        self.epoch = self.epoch.max(other.epoch);
        for b in &other.bins {
            self.absorb(*b);
        }
        self.counts.add(&other.counts);
        self.min_keepalive_idle = min_positive(self.min_keepalive_idle, other.min_keepalive_idle);
        self.max_reuse_idle = max_opt(self.max_reuse_idle, other.max_reuse_idle);
        self.max_unpinged_alive = max_opt(self.max_unpinged_alive, other.max_unpinged_alive);
        self.pings = (self.pings.0.saturating_add(other.pings.0), self.pings.1 + other.pings.1);
        for (a, b) in self.buckets.iter_mut().zip(other.buckets.iter()) {
            a.0 += b.0;
            a.1 += b.1;
        }
    }
}

pub(crate) fn min_positive(a: f32, b: f32) -> f32 {
    match (a > 0.0, b > 0.0) {
        (true, true) => a.min(b),
        (true, false) => a,
        _ => b,
    }
}

pub(crate) fn max_opt(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, None) => x,
        (None, y) => y,
    }
}

/// Bin of an idle age: an eighth of an octave.
#[allow(clippy::cast_possible_truncation, reason = "clamped to the i16 range")]
pub(crate) fn bin_key(idle: f64) -> i16 {
    (idle.max(1e-6).log2() * 8.0).floor().clamp(-32_000.0, 32_000.0) as i16
}

pub(crate) fn bucket_of(idle: f64) -> usize {
    IDLE_BUCKETS.iter().position(|&le| idle <= le).unwrap_or(IDLE_BUCKETS.len())
}

/// One destination's evidence.
#[derive(Debug, Clone)]
pub struct Evidence {
    pub(crate) window_ns: u64,
    pub(crate) slice_ns: u64,
    pub(crate) slices: VecDeque<Slice>,
    pub(crate) dead: VecDeque<Dead>,
    pub(crate) local_closes: VecDeque<Timed>,
    pub(crate) aborted: VecDeque<Timed>,
    pub(crate) timeouts: VecDeque<Timed>,
    pub(crate) late: VecDeque<Timed>,
    pub(crate) minutes: VecDeque<Minute>,
    /// Sockets' longest silent survivals (see [`Self::flows`]).
    pub(crate) flow_table: FlowTable,
    pub(crate) epoch: u32,
    pub(crate) split: bool,
}

pub(crate) fn push_capped<T>(q: &mut VecDeque<T>, x: T, cap: usize) {
    if q.len() >= cap {
        q.pop_front();
    }
    q.push_back(x);
}

impl Evidence {
    #[must_use]
    pub fn new(window_ns: u64) -> Self {
        Self {
            window_ns,
            slice_ns: (window_ns / SLICES as u64).max(1),
            slices: VecDeque::new(),
            dead: VecDeque::new(),
            local_closes: VecDeque::new(),
            aborted: VecDeque::new(),
            timeouts: VecDeque::new(),
            late: VecDeque::new(),
            minutes: VecDeque::new(),
            flow_table: FlowTable::default(),
            epoch: 0,
            split: false,
        }
    }

    pub(crate) fn slice(&mut self, ts_ns: u64) -> &mut Slice {
        let fresh = self.split || self.slices.back().is_none_or(|s| ts_ns >= s.start_ns + self.slice_ns);
        if fresh {
            self.split = false;
            if self.slices.len() >= MAX_SLICES {
                if let (Some(a), Some(b)) = (self.slices.pop_front(), self.slices.front_mut()) {
                    b.merge(&a);
                }
            }
            self.slices.push_back(Slice::new(ts_ns, self.epoch));
        }
        let len = self.slices.len();
        let s = &mut self.slices[len - 1];
        s.end_ns = s.end_ns.max(ts_ns);
        s
    }

    pub(crate) fn minute(&mut self, ts_ns: u64) -> &mut Minute {
        let index = ts_ns / MINUTE_NS;
        if self.minutes.back().is_none_or(|m| m.index < index) {
            push_capped(&mut self.minutes, Minute { index, ..Minute::default() }, 61);
        }
        // An out-of-order event older than the newest minute counts there.
        let len = self.minutes.len();
        &mut self.minutes[len - 1]
    }

    /// Record an observation. `explained` marks one a peer restart explains:
    /// it is counted, never kept as timeout or deadline evidence.
    #[allow(
        clippy::many_single_char_names,
        reason = "o: the observation, s: its slice, m: its minute, d: the dead record"
    )]
    pub fn add(&mut self, o: &Observed, explained: bool) {
        let epoch = self.epoch;
        // The silent age a survival proves: the reuse's, or (refreshed by
        // keep-alive) its first answered probe's.
        if let Observation::Reuse { idle, failed: None, refreshed, .. } = o.what {
            let probe = f64::from(o.keepalive_idle);
            let silent = if refreshed { (probe > 0.0 && probe < idle).then_some(probe) } else { Some(idle) };
            if let Some(age) = silent {
                self.flow_table.survived(o.sock_id, age, o.ts_ns, epoch);
            }
        }
        let s = self.slice(o.ts_ns);
        if o.keepalive {
            s.counts.keepalive += 1;
            s.min_keepalive_idle = min_positive(s.min_keepalive_idle, o.keepalive_idle);
        }
        if let Some(by) = o.reset {
            s.counts.resets.count(by);
        }
        match o.what {
            Observation::Reuse { idle, failed, refreshed, after_stall, after_goodbye, ping } => {
                s.counts.reuses += 1;
                s.max_reuse_idle = max_opt(s.max_reuse_idle, Some(idle));
                let b = bucket_of(idle);
                s.buckets[b].0 += 1;
                if failed.is_some() {
                    s.counts.failures += 1;
                    s.buckets[b].1 += 1;
                    if explained {
                        s.counts.restart_failures += 1;
                    }
                    s.counts.after_goodbye += u64::from(after_goodbye);
                } else {
                    s.add_alive(idle, refreshed, o.ts_ns);
                    if ping && !refreshed {
                        s.pings = (s.pings.0.saturating_add(1), s.pings.1 + idle);
                    } else if !refreshed {
                        s.max_unpinged_alive = max_opt(s.max_unpinged_alive, Some(idle));
                    }
                    // Its first keep-alive probe was answered: the flow was
                    // alive after that long without a packet, which holds
                    // for every hop (silent evidence).
                    let probe = f64::from(o.keepalive_idle);
                    if refreshed && probe > 0.0 && probe < idle {
                        s.add_alive(probe, false, o.ts_ns);
                        s.max_unpinged_alive = max_opt(s.max_unpinged_alive, Some(probe));
                    }
                }
                let m = self.minute(o.ts_ns);
                m.reuses += 1;
                m.failures += u32::from(failed.is_some());
                if let (Some(mode), false) = (failed, explained || after_stall) {
                    let d = Dead { ts_ns: o.ts_ns, idle, sock_id: o.sock_id, mode, reuse: true, close: false, epoch };
                    push_capped(&mut self.dead, d, MAX_DEAD);
                }
            }
            Observation::PeerIdleClose { idle, mode } => {
                s.counts.peer_closes += 1;
                if !explained {
                    let d = Dead { ts_ns: o.ts_ns, idle, sock_id: o.sock_id, mode, reuse: false, close: true, epoch };
                    push_capped(&mut self.dead, d, MAX_DEAD);
                }
            }
            Observation::LocalIdleClose { idle } => {
                push_capped(&mut self.local_closes, Timed { ts_ns: o.ts_ns, value: idle, epoch }, MAX_TIMED);
            }
            Observation::RequestAborted { elapsed } => {
                s.counts.aborted += 1;
                if !explained {
                    push_capped(&mut self.aborted, Timed { ts_ns: o.ts_ns, value: elapsed, epoch }, MAX_TIMED);
                }
            }
            Observation::RequestTimeout { elapsed } => {
                s.counts.timeouts += 1;
                push_capped(&mut self.timeouts, Timed { ts_ns: o.ts_ns, value: elapsed, epoch }, MAX_TIMED);
            }
            Observation::DiscardedDead => s.counts.discarded_dead += 1,
            Observation::KeepaliveDeath { silent } => {
                let mode = FailureMode::SilentDrop;
                let d =
                    Dead { ts_ns: o.ts_ns, idle: silent, sock_id: o.sock_id, mode, reuse: false, close: false, epoch };
                push_capped(&mut self.dead, d, MAX_DEAD);
            }
            Observation::LateReuse { idle, elapsed } => {
                s.counts.late_reuses += 1;
                s.max_reuse_idle = max_opt(s.max_reuse_idle, Some(idle + elapsed));
                push_capped(&mut self.late, Timed { ts_ns: o.ts_ns, value: idle, epoch }, MAX_TIMED);
            }
        }
    }

    /// Count a peer restart at `ts_ns`.
    pub fn add_restart(&mut self, ts_ns: u64) {
        self.slice(ts_ns).counts.restarts += 1;
    }

    /// Set aside the failed reuses a restart at `at_ns` explains (sockets
    /// idle since before it, failing from `span_ns` before it on); they stay
    /// counted as failures. Returns how many.
    pub fn explain_failures(&mut self, at_ns: u64, span_ns: u64) -> usize {
        let before = self.dead.len();
        self.dead.retain(|d| {
            !(d.reuse && d.ts_ns + span_ns >= at_ns && d.ts_ns.saturating_sub(secs_to_ns(d.idle)) <= at_ns + span_ns)
        });
        let n = before - self.dead.len();
        if n > 0 {
            if let Some(s) = self.slices.back_mut() {
                s.counts.restart_failures += n as u64;
            }
        }
        n
    }

    /// Start a new epoch: alive evidence from now on, dead evidence from
    /// `dead_from_ns` on.
    pub fn new_epoch(&mut self, dead_from_ns: u64) {
        self.epoch += 1;
        self.split = true;
        for d in self.dead.iter_mut().filter(|d| d.ts_ns >= dead_from_ns) {
            d.epoch = self.epoch;
        }
    }

    /// Drop what left the window as of `now_ns`.
    pub fn expire(&mut self, now_ns: u64) {
        let w = self.window_ns;
        let old = |ts: u64| ts.saturating_add(w) < now_ns;
        while self.slices.front().is_some_and(|s| old(s.end_ns)) {
            self.slices.pop_front();
        }
        while self.dead.front().is_some_and(|d| old(d.ts_ns)) {
            self.dead.pop_front();
        }
        for q in [&mut self.local_closes, &mut self.aborted, &mut self.timeouts, &mut self.late] {
            while q.front().is_some_and(|t| old(t.ts_ns)) {
                q.pop_front();
            }
        }
        self.flow_table.expire(old);
        let hour_ago = (now_ns / MINUTE_NS).saturating_sub(60);
        while self.minutes.front().is_some_and(|m| m.index < hour_ago) {
            self.minutes.pop_front();
        }
    }

    /// Nothing left in the window.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.slices.is_empty()
            && self.dead.is_empty()
            && self.local_closes.is_empty()
            && self.aborted.is_empty()
            && self.timeouts.is_empty()
            && self.late.is_empty()
    }

    /// Alive evidence of the current epoch as `(age, count)`; keep-alive
    /// refreshed sockets only with `refreshed`.
    #[must_use]
    pub fn alive(&self, refreshed: bool) -> Vec<(f64, u64)> {
        let mut out = Vec::new();
        for s in self.slices.iter().filter(|s| s.epoch == self.epoch) {
            for b in s.bins.iter().filter(|b| refreshed || !b.refreshed) {
                if b.count >= 2 && b.min < b.max {
                    out.push((b.min, 1));
                    out.push((b.max, u64::from(b.count - 1)));
                } else {
                    out.push((b.max, u64::from(b.count)));
                }
            }
        }
        out
    }

    /// Each socket's longest silent survival and earliest kept failed
    /// reuse (current epoch, window): one per flow, where [`Self::alive`]
    /// gives one per reuse.
    #[must_use]
    pub fn flows(&self) -> Vec<FlowSurvival> {
        let mut failed: HashMap<u64, f64> = HashMap::new();
        for d in self.dead().filter(|d| d.reuse) {
            failed.entry(d.sock_id).and_modify(|f| *f = f.min(d.idle)).or_insert(d.idle);
        }
        self.flow_table
            .of_epoch(self.epoch)
            .map(|f| FlowSurvival { survived: f.max_idle, failed: failed.get(&f.sock_id).copied() })
            .collect()
    }

    /// Did a reuse survive at an idle age in `[lo, hi)` after `ts_ns`
    /// (current epoch; keep-alive refreshed ones only with `refreshed`)?
    /// Survivals are binned, so a bin counts when its ages overlap.
    #[must_use]
    pub fn survived_after(&self, ts_ns: u64, lo: f64, hi: f64, refreshed: bool) -> bool {
        self.slices.iter().filter(|s| s.epoch == self.epoch && s.end_ns > ts_ns).any(|s| {
            s.bins.iter().any(|b| (refreshed || !b.refreshed) && b.last_ns > ts_ns && b.max >= lo && b.min < hi)
        })
    }

    /// Dead evidence of the current epoch.
    pub fn dead(&self) -> impl Iterator<Item = &Dead> {
        let e = self.epoch;
        self.dead.iter().filter(move |d| d.epoch == e)
    }

    pub(crate) fn values(q: &VecDeque<Timed>, epoch: Option<u32>) -> Vec<f64> {
        q.iter().filter(|t| epoch.is_none_or(|e| t.epoch == e)).map(|t| t.value).collect()
    }

    /// Idle ages of our own idle closes (current epoch).
    #[must_use]
    pub fn local_closes(&self) -> Vec<f64> {
        Self::values(&self.local_closes, Some(self.epoch))
    }

    /// Elapsed times of requests the peer aborted (window).
    #[must_use]
    pub fn aborted(&self) -> Vec<f64> {
        Self::values(&self.aborted, None)
    }

    /// Elapsed times of our request timeouts (window).
    #[must_use]
    pub fn timeouts(&self) -> Vec<f64> {
        Self::values(&self.timeouts, None)
    }

    /// Idle ages at our close of the late reuses (window).
    #[must_use]
    pub fn late_reuse_idles(&self) -> Vec<f64> {
        Self::values(&self.late, None)
    }

    /// Window counts.
    #[must_use]
    pub fn counts(&self) -> Counts {
        let mut c = Counts::default();
        for s in &self.slices {
            c.add(&s.counts);
        }
        c
    }

    /// Reuses and failed reuses in the last hour as of `now_ns`.
    #[must_use]
    pub fn last_hour(&self, now_ns: u64) -> (u64, u64) {
        let from = (now_ns / MINUTE_NS).saturating_sub(60);
        self.minutes
            .iter()
            .filter(|m| m.index >= from)
            .fold((0, 0), |(r, f), m| (r + u64::from(m.reuses), f + u64::from(m.failures)))
    }

    /// Idle-age buckets over the window: `(reuses, failures)` per bucket of
    /// [`IDLE_BUCKETS`] plus +Inf.
    #[must_use]
    pub fn buckets(&self) -> Vec<(u64, u64)> {
        let mut out = vec![(0, 0); N_BUCKETS];
        for s in &self.slices {
            for (o, b) in out.iter_mut().zip(s.buckets.iter()) {
                o.0 += u64::from(b.0);
                o.1 += u64::from(b.1);
            }
        }
        out
    }

    /// Longest reuse idle age (current epoch).
    #[must_use]
    pub fn max_reuse_idle(&self) -> Option<f64> {
        self.slices.iter().filter(|s| s.epoch == self.epoch).filter_map(|s| s.max_reuse_idle).reduce(f64::max)
    }

    /// Longest idle age survived by silent evidence that was no ping
    /// (current epoch).
    #[must_use]
    pub fn max_unpinged_alive(&self) -> Option<f64> {
        self.slices.iter().filter(|s| s.epoch == self.epoch).filter_map(|s| s.max_unpinged_alive).reduce(f64::max)
    }

    /// The mean idle age at which the connections were pinged (current
    /// epoch), when any ping was answered.
    #[must_use]
    pub fn ping_every(&self) -> Option<f64> {
        let (n, sum) = self
            .slices
            .iter()
            .filter(|s| s.epoch == self.epoch)
            .fold((0u64, 0.0), |(n, sum), s| (n + u64::from(s.pings.0), sum + s.pings.1));
        #[allow(clippy::cast_precision_loss, reason = "a count of pings, far below 2^52")]
        (n > 0).then(|| sum / n as f64)
    }

    /// Smallest keep-alive idle time among keep-alive evidence (window).
    #[must_use]
    pub fn min_keepalive_idle(&self) -> Option<f64> {
        self.slices.iter().map(|s| s.min_keepalive_idle).filter(|&k| k > 0.0).reduce(f32::min).map(f64::from)
    }

    /// Heap memory held, bytes.
    #[must_use]
    pub fn bytes(&self) -> usize {
        self.slices.capacity() * size_of::<Slice>()
            + self.slices.iter().map(|s| s.bins.capacity() * size_of::<Bin>()).sum::<usize>()
            + self.dead.capacity() * size_of::<Dead>()
            + (self.local_closes.capacity() + self.aborted.capacity() + self.timeouts.capacity() + self.late.capacity())
                * size_of::<Timed>()
            + self.minutes.capacity() * size_of::<Minute>()
            + self.flow_table.bytes()
    }
}

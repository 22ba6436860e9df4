//! The estimation math, as pure functions over idle ages (seconds).
//!
//! # Path idle timeout interval
//!
//! Evidence comes in two kinds: **alive** at idle `t` (a reuse after idle `t`
//! got a response, so the path timeout is above `t`) and **dead** at idle `t`
//! (the peer closed an idle socket at `t`, or a reuse after idle `t` failed,
//! so the timeout is at most `t`). In a clean world every alive age lies
//! below every dead age and the interval is `[max alive, min dead]`.
//!
//! Real hosts are not clean: a backend restart resets one pooled socket
//! that was idle for a few seconds, and the naive rule would collapse the
//! interval onto that one reset. The rule used here is the threshold that
//! **misclassifies the fewest observations**: every boundary between
//! sorted idle ages is scored by (alive ages above it) + (dead ages below
//! it), the lowest score wins, and ties go to the *highest* boundary. A
//! single stray reset below many successful reuses then costs one
//! misclassification instead of moving the bounds, and the tie rule trusts a
//! success (which proves the socket was alive) over a failure (which may have
//! had another cause). The interval is `[largest alive age below the
//! boundary, smallest dead age above it]`; the evidence on the wrong side is
//! reported as `outliers`.
//!
//! # Two silent paths
//!
//! Where flows are hashed over two paths (ECMP, two NAT gateways) whose
//! middleboxes forget idle flows at different ages, the failure rate is a
//! staircase with two steps: 0 below the shorter path's timeout, its
//! share of the flows between the two, 1 past the longer. The one-step
//! rule above then puts its boundary near the longer path and sets the
//! shorter path's failures aside as outliers: its recommendation fails on
//! every flow of the shorter path. [`two_paths`] fits the two-step
//! staircase too (Bernoulli likelihood; a stray observation on the wrong
//! side of a step costs as much as a 1 % chance) and keeps it when it
//! explains the evidence better by at least [`TWO_PATHS_GAIN`] nats and at
//! least [`CLUSTER_MIN`] failures lie between the steps: more than a stray
//! few. Flows that survived just below the shorter path's first failure
//! may all have taken the longer path, so its lower bound steps back over
//! as many of them as leave at most a [`LONG_RUN_CHANCE`] that all did,
//! with the share taken at the low end of what the evidence supports (a
//! share fitted from a few dozen flows runs high); for the same reason a
//! failure below the step with no more flows surviving above it than such
//! a run is the shorter path's first, not a stray. These steps count
//! flows (sockets), each at its longest survival, never reuses: a pooled
//! connection keeps its path for life, so its many reuses are one draw,
//! and a flow that survived past the first failure is the longer path's
//! and says nothing of the shorter one's timeout; a flow that failed
//! between the steps is the shorter path's, and its longest survival
//! bounds that path from below by itself. The interval
//! is then the shorter path's, the recommendation comes
//! from it, and evidence between the steps is the mix, never a change of
//! timeout. A single stray reset below many survivals costs the two-step
//! fit more than it gains, so it stays an outlier.
//!
//! # Change of timeout
//!
//! When the path's timeout changes, the old evidence contradicts the new.
//! [`crate::diagnosis::aggregate`] watches for evidence that falls on the wrong side of
//! the current interval; three such observations in the same direction, with
//! nothing in between that confirms the old interval, start a new epoch: the
//! evidence before the first of them is set aside and a change is reported.
//! One stray reset is one contradiction and never starts an epoch.
//!
//! # Point estimates
//!
//! Peer closes while idle measure a hop's timeout directly. When at least
//! three of them lie within 5% of each other they form a cluster and its
//! median is the point estimate. The same rule gives the pool's own idle
//! timeout from local closes of idle sockets.
//!
//! # Spread timeouts
//!
//! Many servers and middleboxes enforce an idle timeout with a periodic
//! sweep or a coarse clock: a server that checks its clients once a second
//! against whole seconds closes a "2 s" connection anywhere between 2 and
//! 3 s. Its peer closes form no cluster; they fill one band, and survivals
//! and failures interleave inside it, so the minimum-misclassification
//! boundary lands anywhere in the band and a chance cluster of three closes
//! would give a point outside the interval. [`spread`] recognises the band
//! from the peer closes alone: at least five, spread over more than twice
//! the cluster tolerance and at most a factor of two, with no gap wider
//! than half the band (two paths leave a gap: those are `mixed_paths`), and
//! no cluster holding half of them (a sharp timeout with a few stragglers
//! is a cluster). The band's start is what bites, and it lies below the
//! earliest close seen: closes spread over the band land on average one
//! spacing after its start. The point is therefore a conservative start,
//! the earliest close less half the band's observed width (for the five or
//! more closes a band needs, at least twice their average spacing), never
//! below half the latest close; the recommendation is 0.8 x it. The
//! interval becomes `[largest survival below that start, earliest close]`,
//! so the point always lies inside it, and evidence inside the band is the
//! sweep's jitter, never a change of timeout.

use serde::{Deserialize, Serialize};

/// Interval estimate of the path idle timeout.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
pub struct Interval {
    /// Largest idle age proven to survive (None without such evidence).
    pub lower: Option<f64>,
    /// Smallest idle age proven to fail (None without such evidence).
    pub upper: Option<f64>,
    /// Alive observations at or below `lower`.
    pub lower_evidence: usize,
    /// Dead observations at or above `upper`.
    pub upper_evidence: usize,
    /// Observations on the wrong side of the chosen boundary.
    pub outliers: usize,
    /// A spread timeout's band (see [`spread`]): the interval ends at its
    /// earliest edge, and evidence inside it is no contradiction.
    #[serde(default)]
    pub spread: Option<Spread>,
    /// Two paths that fail at different idle ages (see [`two_paths`]): the
    /// interval is the shorter one's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paths: Option<TwoPaths>,
}

/// Two paths behind one destination, told apart by a two-step failure
/// staircase (see [`two_paths`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TwoPaths {
    /// The shorter path: the largest survival below its first failure.
    pub short_lower: Option<f64>,
    /// The shorter path's first failure: where the staircase's first step is.
    pub short_upper: f64,
    /// The longer path: the largest survival between the steps.
    pub long_lower: Option<f64>,
    /// The longer path's first failure past the mix (none when every
    /// flow past the first step was a mix of both).
    pub long_upper: Option<f64>,
    /// The fraction of flows on the shorter path: failures among the
    /// observations between the steps.
    pub short_share: f64,
    /// Failures and survivals between the steps.
    pub mixed_failures: usize,
    pub mixed_survivals: usize,
}

/// One flow (socket) as [`two_paths`] counts it: a pooled connection
/// keeps its path for life, so its reuses are one draw of a path.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct FlowSurvival {
    /// The longest idle age it survived silently.
    pub survived: f64,
    /// Its earliest failed reuse, if it failed.
    pub failed: Option<f64>,
}

impl TwoPaths {
    /// Does `t` lie where both paths are seen (between the steps, to the
    /// cluster tolerance)? Evidence there is the mix, not a contradiction.
    #[must_use]
    pub fn mixes(&self, t: f64) -> bool {
        t >= self.short_upper * (1.0 - CLUSTER_SPREAD)
            && self.long_upper.is_none_or(|u| t <= u * (1.0 + CLUSTER_SPREAD))
    }
}

impl Interval {
    /// Does `t` lie inside the interval (open bounds count as unbounded)?
    #[must_use]
    pub fn contains(&self, t: f64) -> bool {
        self.lower.is_none_or(|l| t >= l) && self.upper.is_none_or(|u| t <= u)
    }

    /// `upper - lower` when both are known.
    #[must_use]
    pub fn width(&self) -> Option<f64> {
        Some(self.upper? - self.lower?)
    }
}

/// Minimum-misclassification interval from alive and dead idle ages.
#[must_use]
pub fn interval(alive: &[f64], dead: &[f64]) -> Interval {
    let weighted: Vec<(f64, u64)> = alive.iter().map(|&t| (t, 1)).collect();
    interval_weighted(&weighted, dead)
}

/// The evidence as `(age, alive count, dead count)`, one point per
/// observation (or per weighted alive age), sorted by age.
fn points(alive: &[(f64, u64)], dead: &[f64]) -> Vec<(f64, u64, u64)> {
    let mut pts: Vec<(f64, u64, u64)> = alive
        .iter()
        .map(|&(t, n)| (t, n, 0))
        .chain(dead.iter().map(|&t| (t, 0, 1)))
        .filter(|p| p.0.is_finite() && p.1 + p.2 > 0)
        .collect();
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
    pts
}

/// [`interval`] with alive ages given as `(age, count)`: the bounded
/// evidence of [`crate::diagnosis::evidence`] summarises many successful reuses at one
/// observed age.
#[must_use]
pub fn interval_weighted(alive: &[(f64, u64)], dead: &[f64]) -> Interval {
    // Equal ages are never split.
    let pts = points(alive, dead);
    if pts.is_empty() {
        return Interval::default();
    }
    let total_alive: u64 = pts.iter().map(|p| p.1).sum();
    // Boundaries: before index i, for i at the start of each group of equal
    // ages, plus the end.
    let mut best: Option<(u64, usize)> = None; // (errors, i)
    let mut alive_below = 0;
    let mut dead_below = 0;
    let mut i = 0;
    loop {
        let errors = (total_alive - alive_below) + dead_below;
        if best.is_none_or(|(e, _)| errors <= e) {
            best = Some((errors, i));
        }
        if i == pts.len() {
            break;
        }
        let age = pts[i].0;
        while i < pts.len() && pts[i].0.total_cmp(&age).is_eq() {
            alive_below += pts[i].1;
            dead_below += pts[i].2;
            i += 1;
        }
    }
    let (outliers, cut) = best.unwrap_or((0, 0));
    let (below, above) = pts.split_at(cut);
    let n = |x: u64| usize::try_from(x).unwrap_or(usize::MAX);
    Interval {
        lower: below.iter().rev().find(|p| p.1 > 0).map(|p| p.0),
        upper: above.iter().find(|p| p.2 > 0).map(|p| p.0),
        lower_evidence: n(below.iter().map(|p| p.1).sum()),
        upper_evidence: n(above.iter().map(|p| p.2).sum()),
        outliers: n(outliers),
        spread: None,
        paths: None,
    }
}

/// Negative log-likelihood an observation on the wrong side of a step
/// costs: a 1 % chance (a stray reset, a failover).
const STRAY_COST: f64 = 4.605_170_185_988_091; // -ln(0.01)
/// How much better (nats) the two-step staircase must explain the
/// evidence than the one-step rule: a likelihood ratio of about 20.
pub const TWO_PATHS_GAIN: f64 = 3.0;
/// The chance, at most, that the shorter of two paths' lower bound lies
/// past its timeout (see [`two_paths`]).
pub const LONG_RUN_CHANCE: f64 = 0.01;
/// The shorter path's share the lower bound's step-back assumes at most:
/// a share estimated from a few observations between the steps can come
/// out far too high (0.79 for a true 0.5 once, in CI, from what an epoch
/// change left), and would step back over too few survivals. At half, at
/// least 7.
pub const MAX_SHORT_SHARE: f64 = 0.5;

/// The shorter of two paths, when the evidence shows two (see the module
/// doc): the minimum-misclassification interval of the shorter path with
/// [`Interval::paths`] set, or None when one step explains it as well.
/// `alive` and `dead` are the reuses' evidence, `flows` each socket's
/// longest survival and first failure
/// ([`crate::diagnosis::evidence::Evidence::flows`]): the lower bound
/// rests on flows only, and is None with too few.
#[must_use]
#[allow(
    clippy::many_single_char_names,
    reason = "the staircase's names: m groups, steps at i and j, k survivals, n and f conversions"
)]
pub fn two_paths(alive: &[(f64, u64)], dead: &[f64], flows: &[FlowSurvival]) -> Option<Interval> {
    // Groups of equal ages: (age, alive, dead), sorted; prefix sums.
    let pts = points(alive, dead);
    let mut groups: Vec<(f64, u64, u64)> = Vec::with_capacity(pts.len());
    for p in pts {
        match groups.last_mut() {
            Some(g) if g.0.total_cmp(&p.0).is_eq() => {
                g.1 += p.1;
                g.2 += p.2;
            }
            _ => groups.push(p),
        }
    }
    let m = groups.len();
    let (mut a_pre, mut d_pre) = (vec![0u64; m + 1], vec![0u64; m + 1]);
    for (k, g) in groups.iter().enumerate() {
        a_pre[k + 1] = a_pre[k] + g.1;
        d_pre[k + 1] = d_pre[k] + g.2;
    }
    let (a_tot, d_tot) = (a_pre[m], d_pre[m]);
    #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let f = |x: u64| x as f64;
    // The one-step rule's cost: each misclassification a stray.
    let one_step = (0..=m).map(|j| f(a_tot - a_pre[j] + d_pre[j])).fold(f64::INFINITY, f64::min) * STRAY_COST;
    // Steps start at a failure (moving a step onto a survival never helps).
    let starts: Vec<usize> = (0..m).filter(|&k| groups[k].2 > 0).collect();
    let mut best: Option<(f64, usize, usize)> = None;
    for (x, &i) in starts.iter().enumerate() {
        for &j in starts[x + 1..].iter().chain(std::iter::once(&m)) {
            let (a1, d1) = (a_pre[j] - a_pre[i], d_pre[j] - d_pre[i]);
            if d1 < CLUSTER_MIN as u64 || a1 == 0 {
                continue;
            }
            let r = f(d1) / f(a1 + d1);
            let mixed = -(f(d1) * r.ln() + f(a1) * (1.0 - r).ln());
            let cost = f(d_pre[i] + a_tot - a_pre[j]) * STRAY_COST + mixed;
            if best.is_none_or(|(c, _, _)| cost < c) {
                best = Some((cost, i, j));
            }
        }
    }
    let (cost, i, j) = best?;
    if one_step - cost < TWO_PATHS_GAIN {
        return None;
    }
    let largest_alive = |range: std::ops::Range<usize>| groups[range].iter().rev().find(|g| g.1 > 0).map(|g| g.0);
    let (a1, d1) = (a_pre[j] - a_pre[i], d_pre[j] - d_pre[i]);
    let n = |x: u64| usize::try_from(x).unwrap_or(usize::MAX);
    let share = f(d1) / f(a1 + d1);
    // Flows that survived just below the shorter path's first failure may
    // all have taken the longer path: k of them do so with chance
    // (1 - share)^k, k the smallest for which that chance is at most
    // LONG_RUN_CHANCE. So a failure below the step with at most k flows
    // surviving between it and the step is no stray but the shorter
    // path's first (CI once saw one at 2.276 s for a 2 s path, 12 longer-
    // path survivals above it, taken for a stray: the bound went past
    // 2 s). The lower bound is the k-th largest flow's survival below it.
    let k = (LONG_RUN_CHANCE.ln() / (1.0 - share_lower(d1, a1 + d1).clamp(0.05, MAX_SHORT_SHARE)).ln()).ceil();
    // Counted in flows, not reuses: a pooled connection's survivals all
    // took its one path, and one that survived past an age holds that
    // path's timeout above it (CI once saw a 2 s path bounded below at
    // 2.185 s by the 4 s path's few connections, reused again and again
    // between 2 and 2.6 s). A flow that failed between the steps is the
    // shorter path's (the longer one holds there; a stray is as rare as
    // the run's chance), so its survival bounds that path alone.
    let long_upper = groups.get(j).map_or(f64::INFINITY, |g| g.0);
    let known_short = |fl: &FlowSurvival| fl.failed.is_some_and(|f| f >= groups[i].0 && f < long_upper);
    let mut first = i;
    for g in (0..i).rev().filter(|&g| groups[g].2 > 0) {
        let (lo, hi) = (groups[g].0, groups[first].0);
        let above = || flows.iter().filter(|fl| fl.survived > lo && fl.survived < hi);
        #[allow(clippy::cast_precision_loss, reason = "at most MAX_FLOWS flows")]
        if above().any(known_short) || above().count() as f64 > k {
            break;
        }
        first = g;
    }
    let mut below: Vec<&FlowSurvival> = flows.iter().filter(|fl| fl.survived < groups[first].0).collect();
    below.sort_by(|a, b| b.survived.total_cmp(&a.survived));
    let mut draws = 0.0;
    let short_lower = below.iter().find_map(|fl| {
        draws += 1.0;
        (known_short(fl) || draws >= k).then_some(fl.survived)
    });
    let paths = TwoPaths {
        short_lower,
        short_upper: groups[first].0,
        long_lower: largest_alive(i..j),
        long_upper: groups.get(j).map(|g| g.0),
        short_share: (share * 1000.0).round() / 1000.0,
        mixed_failures: n(d1),
        mixed_survivals: n(a1),
    };
    Some(Interval {
        lower: paths.short_lower,
        upper: Some(paths.short_upper),
        lower_evidence: n(groups[..first].iter().filter(|g| short_lower.is_some_and(|l| g.0 <= l)).map(|g| g.1).sum()),
        upper_evidence: n(d_tot - d_pre[first]),
        outliers: n(d_pre[first] + a_tot - a_pre[j]),
        spread: None,
        paths: Some(paths),
    })
}

/// A share of `hits` in `n` the data supports with 90 % confidence at
/// least (Wilson's lower bound, one-sided). Over 2,000 random mixes of 84
/// reuses (`random_mixes_of_two_paths_miss_the_shorter_timeout_rarely`),
/// the run length taken from the fitted share put the lower bound past
/// the timeout in 4.6 % of them at a quarter of the flows on the shorter
/// path (the fit ran high: 0.45 for 0.25) and 0.9 % at half; from this
/// bound in 0.7 % and 0.2 %, the median lower bound at half 1.554 s (one
/// standard error instead: 1.25 % and 0.3 %). At a quarter, 84 flows bound
/// the shorter path below in 815 of 2,000 mixes only: the interval stays
/// open below in the others.
fn share_lower(hits: u64, n: u64) -> f64 {
    const Z: f64 = 1.282;
    if n == 0 {
        return 0.0;
    }
    #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let (h, n) = (hits as f64, n as f64);
    let p = h / n;
    let z2 = Z * Z;
    ((p + z2 / (2.0 * n)) - Z * ((p * (1.0 - p) + z2 / (4.0 * n)) / n).sqrt()) / (1.0 + z2 / n)
}

/// A cluster of observations within 5% of each other.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Cluster {
    /// Median of the cluster.
    pub value: f64,
    /// Observations in it.
    pub count: usize,
}

/// Minimum members of a cluster.
pub const CLUSTER_MIN: usize = 3;
/// Relative spread of a cluster.
pub const CLUSTER_SPREAD: f64 = 0.05;

/// The largest cluster of at least [`CLUSTER_MIN`] values whose largest is
/// within [`CLUSTER_SPREAD`] of its smallest; ties go to the smaller value
/// (the smallest timeout on a path is the one that bites).
#[must_use]
pub fn cluster(values: &[f64]) -> Option<Cluster> {
    let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
    v.sort_by(f64::total_cmp);
    let mut best: Option<(usize, usize)> = None; // (start, len)
    let mut end = 0;
    for start in 0..v.len() {
        end = end.max(start);
        while end < v.len() && v[end] <= v[start] * (1.0 + CLUSTER_SPREAD) {
            end += 1;
        }
        let len = end - start;
        if len >= CLUSTER_MIN && best.is_none_or(|(_, l)| len > l) {
            best = Some((start, len));
        }
    }
    let (start, len) = best?;
    let members = &v[start..start + len];
    let mid = len / 2;
    let value = if len % 2 == 1 { members[mid] } else { f64::midpoint(members[mid - 1], members[mid]) };
    Some(Cluster { value, count: len })
}

/// Every distinct cluster in `values`, smallest value first: the largest
/// cluster is taken out, then the largest of the rest, and so on. Two
/// clusters are distinct when their medians differ by more than twice
/// [`CLUSTER_SPREAD`]; a smaller one too close to a bigger one is dropped.
/// More than one means several paths (say, backends with different
/// keep-alive timeouts behind one L4 balancer).
#[must_use]
pub fn clusters(values: &[f64]) -> Vec<Cluster> {
    let mut rest: Vec<f64> = values.iter().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
    rest.sort_by(f64::total_cmp);
    let mut found: Vec<Cluster> = Vec::new();
    while let Some(c) = cluster(&rest) {
        // Take out the members: the `count` values nearest the median that
        // lie within the cluster's span.
        let lo = rest.iter().position(|&x| x * (1.0 + CLUSTER_SPREAD) >= c.value && x <= c.value).unwrap_or(0);
        let members: Vec<usize> =
            (lo..rest.len()).filter(|&k| rest[k] <= rest[lo] * (1.0 + CLUSTER_SPREAD)).take(c.count).collect();
        if members.len() < CLUSTER_MIN {
            break;
        }
        for &k in members.iter().rev() {
            rest.remove(k);
        }
        let distinct = found.iter().all(|f| {
            let (a, b) = if f.value < c.value { (f.value, c.value) } else { (c.value, f.value) };
            b > a * (1.0 + 2.0 * CLUSTER_SPREAD)
        });
        if distinct {
            found.push(c);
        }
    }
    found.sort_by(|a, b| a.value.total_cmp(&b.value));
    found
}

/// The band of a timeout enforced by a sweep or a coarse clock.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    /// The band's start, estimated conservatively (the point estimate).
    pub start: f64,
    /// The earliest peer close: below it no socket was closed.
    pub earliest: f64,
    /// The latest peer close.
    pub latest: f64,
    /// Peer closes in the band.
    pub count: usize,
}

impl Spread {
    /// Does `t` lie in the band (its latest edge with the cluster
    /// tolerance: a sweep's last close is no sharper than a cluster)?
    #[must_use]
    pub fn holds(&self, t: f64) -> bool {
        t >= self.start && t <= self.latest * (1.0 + CLUSTER_SPREAD)
    }
}

/// Minimum peer closes to recognise a spread timeout.
pub const SPREAD_MIN: usize = 5;

/// The band of a spread timeout, from the peer idle closes (see the module
/// doc), or None when they do not fill one band.
#[must_use]
pub fn spread(closes: &[f64]) -> Option<Spread> {
    spread_below(closes, None)
}

/// [`spread`], given the smallest idle age the other evidence proves to
/// fail (`upper`): a cluster holding half the closes makes them a sharp
/// timeout only where it does not lie past that age. A cluster above a
/// proven failure, with closes filling the band below it, is a sweep's
/// phase, not the timeout.
#[must_use]
pub fn spread_below(closes: &[f64], upper: Option<f64>) -> Option<Spread> {
    let mut v: Vec<f64> = closes.iter().copied().filter(|x| x.is_finite() && *x > 0.0).collect();
    if v.len() < SPREAD_MIN {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let (earliest, latest) = (v[0], v[v.len() - 1]);
    if latest <= earliest * (1.0 + 2.0 * CLUSTER_SPREAD) || latest > 2.0 * earliest {
        return None;
    }
    let widest_gap = v.windows(2).map(|w| w[1] - w[0]).fold(0.0, f64::max);
    if widest_gap > (latest - earliest) / 2.0 {
        return None;
    }
    if cluster(&v)
        .is_some_and(|c| 2 * c.count >= v.len() && upper.is_none_or(|u| c.value <= u * (1.0 + CLUSTER_SPREAD)))
    {
        return None;
    }
    let start = (earliest - (latest - earliest) / 2.0).max(latest / 2.0);
    Some(Spread { start, earliest, latest, count: v.len() })
}

/// The interval of a spread timeout: from the largest survival below the
/// band's start to its earliest close. Dead ages at or past that close
/// bound it; survivals inside the band are its jitter; survivals past the
/// band's end and deaths below the lower bound are the outliers.
#[must_use]
pub fn spread_interval(alive: &[(f64, u64)], dead: &[f64], band: Spread) -> Interval {
    let n = |x: u64| usize::try_from(x).unwrap_or(usize::MAX);
    let below: Vec<&(f64, u64)> = alive.iter().filter(|a| a.0 < band.start).collect();
    let lower = below.iter().map(|a| a.0).reduce(f64::max);
    let alive_outliers: u64 = alive.iter().filter(|a| !band.holds(a.0) && a.0 >= band.start).map(|a| a.1).sum();
    let dead_outliers = lower.map_or(0, |l| dead.iter().filter(|&&d| d < l).count());
    Interval {
        lower,
        upper: Some(band.earliest),
        lower_evidence: n(below.iter().map(|a| a.1).sum()),
        upper_evidence: dead.iter().filter(|&&d| d >= band.earliest).count(),
        outliers: n(alive_outliers).saturating_add(dead_outliers),
        spread: Some(band),
        paths: None,
    }
}

/// The point estimate an interval and the peer-close clusters (smallest
/// first) give: a spread's band start, else the smallest cluster where it
/// lies inside the interval to the cluster tolerance, clamped into it. A
/// cluster outside the interval by more than the tolerance is no
/// measurement of the path's timeout; the bounds stand alone then. Within
/// it, the bounds win: a request that crossed the peer's FIN in flight
/// proves the timeout at most the upper bound even where the FINs' median
/// lies a millisecond past it, so the point never lies outside the
/// interval it is printed with.
#[must_use]
pub fn point_of(interval: &Interval, clusters: &[Cluster]) -> Option<Cluster> {
    if let Some(b) = interval.spread {
        return Some(Cluster { value: b.start, count: b.count });
    }
    let c = clusters.first().copied().filter(|c| {
        interval.upper.is_none_or(|u| c.value <= u * (1.0 + CLUSTER_SPREAD))
            && interval.lower.is_none_or(|l| c.value >= l * (1.0 - CLUSTER_SPREAD))
    })?;
    let value = interval.upper.map_or(c.value, |u| c.value.min(u));
    let value = interval.lower.map_or(value, |l| value.max(l));
    Some(Cluster { value, count: c.count })
}

/// The interval of the smallest of several paths behind one address
/// (`mixed_paths`: say, an L4 balancer over backends with different
/// keep-alive timeouts), whose peer closes cluster at `smallest`: a
/// survival past that cluster was proven on a longer path and says
/// nothing of the shortest, which every connection may land on.
#[must_use]
pub fn smallest_path_interval(alive: &[(f64, u64)], dead: &[f64], smallest: f64) -> Interval {
    let short: Vec<(f64, u64)> =
        alive.iter().copied().filter(|&(t, _)| t <= smallest * (1.0 + CLUSTER_SPREAD)).collect();
    interval_weighted(&short, dead)
}

/// The seeds' rule: the client's idle timeout should be about 0.8 x the
/// smallest idle timeout on the path.
pub const POOL_FRACTION: f64 = 0.8;

/// Recommended pool idle timeout for a path timeout.
#[must_use]
pub fn recommended_pool_idle(path_timeout: f64) -> f64 {
    (path_timeout * POOL_FRACTION * 1000.0).round() / 1000.0
}

#[cfg(test)]
pub(crate) mod tests;

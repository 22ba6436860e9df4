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

/// [`interval`] with alive ages given as `(age, count)`: the bounded
/// evidence of [`crate::diagnosis::evidence`] summarises many successful reuses at one
/// observed age.
#[must_use]
pub fn interval_weighted(alive: &[(f64, u64)], dead: &[f64]) -> Interval {
    // (age, alive count, dead count), sorted by age; equal ages are never split.
    let mut pts: Vec<(f64, u64, u64)> = alive
        .iter()
        .map(|&(t, n)| (t, n, 0))
        .chain(dead.iter().map(|&t| (t, 0, 1)))
        .filter(|p| p.0.is_finite() && p.1 + p.2 > 0)
        .collect();
    if pts.is_empty() {
        return Interval::default();
    }
    pts.sort_by(|a, b| a.0.total_cmp(&b.0));
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
    }
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
mod tests;

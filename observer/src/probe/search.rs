//! Where to look next, and what was found: the planned idle ages of each
//! round of probe connections and the bracket they leave. Pure logic: the
//! connections themselves are in [`super::conn`].
//!
//! Ages are whole seconds because a keep-alive probe's idle time
//! (`TCP_KEEPIDLE`) is. A round's connections all start together; each
//! gives one [`Outcome`] and is not used again (an answered probe also
//! refreshes a NAT's timer).

use serde::Serialize;

/// The bracket is narrow enough when it is within this fraction of its
/// upper end (or within one second, the keep-alive clock's step).
pub const WITHIN: f64 = 0.05;

/// A probe found dead this close before a hop's own close was racing it.
pub const RACE: f64 = 0.5;

/// How a hop ended an idle connection by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Close {
    Fin,
    Rst,
}

/// What one connection showed.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// A hop closed the idle connection at this idle age, before or
    /// without a keep-alive probe: a direct measure.
    Closed { close: Close, idle_seconds: f64 },
    /// The keep-alive probe sent at the planned age was acknowledged: the
    /// flow was alive at that age.
    Alive,
    /// The keep-alive probe sent at the planned age got no answer (the
    /// kernel gave up: `ETIMEDOUT`) or a reset: the flow was gone by then.
    Dead { reset: bool },
    /// Stopped before its planned age: a shorter age in the same round
    /// already found the flow dead.
    Cancelled,
    /// Nothing usable: the connection failed to open or ended otherwise.
    Failed,
}

/// One connection's plan and result.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Probe {
    pub round: u32,
    /// The planned idle age of its keep-alive probe, seconds.
    pub age_seconds: u32,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// How the path ended idle connections, as far as the probes show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum How {
    Fin,
    Rst,
    SilentDrop,
    /// Nothing closed within `--up-to`.
    None,
}

/// What the probes found: the JSON of `observer probe --format json`
/// without its destination and timing (see `super::Report`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub how: How,
    /// The measured close (`fin`, `rst`): the median of the closes seen.
    pub idle_timeout_seconds: Option<f64>,
    /// `fin`/`rst`: the earliest close seen; `silent_drop`: the largest
    /// age found alive (0 when none was); `none`: the largest alive age.
    pub lower_seconds: f64,
    /// `fin`/`rst`: the latest close seen; `silent_drop`: the smallest age
    /// found dead; `none`: absent.
    pub upper_seconds: Option<f64>,
    /// 0.8 x the measured close, or 0.8 x the lower end of a silent
    /// drop's bracket (the flow is known alive only up to there).
    pub recommended_pool_idle_timeout_seconds: Option<f64>,
    /// Whether a silent drop's bracket is within [`WITHIN`] (or one
    /// second); false when the time budget ended first.
    pub settled: bool,
    /// Connections alive at an age above one found dead: a flow dropped
    /// for another reason (a failover, a full NAT table). Reported, not
    /// used for the bracket.
    pub contradictions: usize,
}

/// The state of a measurement: every connection's result so far.
#[derive(Debug, Clone, Default)]
pub struct Search {
    probes: Vec<Probe>,
}

/// `n` distinct whole-second ages from 1 to `up_to`, spread geometrically
/// (a 5 s backend and a 350 s NAT are both within a round's reach).
#[must_use]
pub fn first_round(up_to: u32, n: usize) -> Vec<u32> {
    let up_to = up_to.max(1);
    if n <= 1 {
        return vec![up_to];
    }
    let mut ages: Vec<u32> = Vec::with_capacity(n);
    for i in 0..n {
        #[allow(clippy::cast_precision_loss, reason = "at most 64 connections")]
        let f = i as f64 / (n - 1) as f64;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "between 1 and up_to")]
        let geometric = f64::from(up_to).powf(f).round() as u32;
        let next = ages.last().map_or(1, |a| a + 1).max(geometric);
        if next > up_to {
            break;
        }
        ages.push(next);
    }
    if ages.last() != Some(&up_to) {
        if let Some(last) = ages.last_mut() {
            *last = up_to;
        }
    }
    ages
}

impl Search {
    pub fn record(&mut self, probe: Probe) {
        self.probes.push(probe);
    }

    #[must_use]
    pub fn probes(&self) -> &[Probe] {
        &self.probes
    }

    fn closes(&self) -> impl Iterator<Item = (Close, f64)> + '_ {
        self.probes.iter().filter_map(|p| match p.outcome {
            Outcome::Closed { close, idle_seconds } => Some((close, idle_seconds)),
            _ => None,
        })
    }

    /// The smallest age found dead.
    fn dead(&self) -> Option<u32> {
        self.probes.iter().filter(|p| matches!(p.outcome, Outcome::Dead { .. })).map(|p| p.age_seconds).min()
    }

    /// The largest age found alive below `below`.
    fn alive_below(&self, below: Option<u32>) -> Option<u32> {
        self.probes
            .iter()
            .filter(|p| p.outcome == Outcome::Alive && below.is_none_or(|d| p.age_seconds < d))
            .map(|p| p.age_seconds)
            .max()
    }

    /// The earliest close a hop made by itself.
    fn earliest_close(&self) -> Option<f64> {
        self.closes().map(|(_, s)| s).min_by(f64::total_cmp)
    }

    /// Whether a silent drop below every close is what ends flows: a
    /// probe found dead at an age before any close was seen. A probe sent
    /// just before a hop's own close at that age races it (its reset is
    /// the close's), so it must be [`RACE`] earlier.
    fn silent_first(&self) -> bool {
        match (self.dead(), self.earliest_close()) {
            (Some(d), Some(c)) => f64::from(d) < c - RACE,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// The next round's ages (at most `n`), or `None` when the search is
    /// done: a hop's own close was measured, a silent drop is bracketed
    /// within [`WITHIN`] or one second, or nothing closed within the ages
    /// tried.
    #[must_use]
    pub fn next_round(&self, n: usize) -> Option<Vec<u32>> {
        if !self.silent_first() {
            return None;
        }
        let dead = self.dead()?;
        let alive = self.alive_below(Some(dead)).unwrap_or(0);
        if narrow(alive, dead) {
            return None;
        }
        let gap = dead - alive;
        let k = usize::try_from(gap - 1).unwrap_or(usize::MAX).min(n.max(1));
        let mut ages: Vec<u32> = (1..=k)
            .map(|j| {
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "within the gap")]
                #[allow(clippy::cast_precision_loss, reason = "at most 64 connections")]
                let step = (f64::from(gap) * j as f64 / (k + 1) as f64).round() as u32;
                alive + step.clamp(1, gap - 1)
            })
            .collect();
        ages.dedup();
        Some(ages)
    }

    /// What the results so far show.
    #[must_use]
    pub fn finding(&self) -> Finding {
        let dead = self.dead();
        let contradictions =
            dead.map_or(0, |d| self.probes.iter().filter(|p| p.outcome == Outcome::Alive && p.age_seconds > d).count());
        if self.silent_first() {
            let upper = dead.unwrap_or_default();
            let lower = self.alive_below(dead).unwrap_or(0);
            return Finding {
                how: How::SilentDrop,
                idle_timeout_seconds: None,
                lower_seconds: f64::from(lower),
                upper_seconds: Some(f64::from(upper)),
                recommended_pool_idle_timeout_seconds: (lower > 0)
                    .then(|| f64::from(lower) * crate::diagnosis::estimate::POOL_FRACTION),
                settled: narrow(lower, upper),
                contradictions,
            };
        }
        if self.earliest_close().is_none() {
            return Finding {
                how: How::None,
                idle_timeout_seconds: None,
                lower_seconds: f64::from(self.alive_below(None).unwrap_or(0)),
                upper_seconds: None,
                recommended_pool_idle_timeout_seconds: None,
                settled: true,
                contradictions,
            };
        }
        // The kind of the earliest close; the closes of that kind make the
        // measure (a FIN and a later RST are two hops, the first one counts).
        let kind = self.closes().min_by(|a, b| a.1.total_cmp(&b.1)).map_or(Close::Fin, |(k, _)| k);
        let mut ages: Vec<f64> = self.closes().filter(|(k, _)| *k == kind).map(|(_, s)| s).collect();
        ages.sort_by(f64::total_cmp);
        let median = ages[ages.len() / 2];
        Finding {
            how: match kind {
                Close::Fin => How::Fin,
                Close::Rst => How::Rst,
            },
            idle_timeout_seconds: Some(median),
            lower_seconds: ages[0],
            upper_seconds: ages.last().copied(),
            recommended_pool_idle_timeout_seconds: Some(median * crate::diagnosis::estimate::POOL_FRACTION),
            settled: true,
            contradictions,
        }
    }

    /// Whether a connection planned at `age` can still tell anything: not
    /// when a shorter age already found the flow dead.
    #[must_use]
    pub fn worth_waiting(&self, age: u32) -> bool {
        self.dead().is_none_or(|d| age < d)
    }
}

/// A silent drop's bracket is narrow enough.
fn narrow(alive: u32, dead: u32) -> bool {
    let gap = f64::from(dead.saturating_sub(alive));
    gap <= 1.0 || gap <= WITHIN * f64::from(dead)
}

#[cfg(test)]
mod tests;

//! Where to look next, and what was found: the planned idle ages of each
//! round of probe connections and the bracket they leave. Pure logic: the
//! connections themselves are in [`super::conn`].
//!
//! A round's connections all start together; each gives one [`Outcome`]
//! and is not used again (an answered probe also refreshes a NAT's timer).

use serde::Serialize;

/// The bracket is narrow enough when it is within this fraction of its
/// upper end, or within [`FLOOR`].
pub const WITHIN: f64 = 0.05;
/// The narrowest bracket worth another round, seconds.
pub const FLOOR: f64 = 0.2;
/// The first round's smallest age, seconds.
pub const SHORTEST: f64 = 1.0;

/// A probe found dead this close before a hop's own close was racing it.
pub const RACE: f64 = 0.5;

/// Connections per idle age in a silent drop's bracket, and survivals the
/// lower bound needs: flows hashed over several paths (ECMP, two NAT
/// gateways) may all take the longer one, and a path carrying a quarter
/// of them goes unseen among 16 with chance 0.75^16 = 1.0 %.
pub const REPEAT: usize = 16;

/// After a connection is found dead, the longer ones of its round are
/// still waited for up to this factor of its age: a connection alive
/// there took a second path, whose bracket the finding names.
pub const SECOND_PATH_REACH: f64 = 2.0;

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
    Closed { close: Close, at_seconds: f64 },
    /// The keep-alive probe was acknowledged: the flow was alive at the
    /// idle age the probe left at.
    Alive { at_seconds: f64 },
    /// The keep-alive probe got no answer (the kernel gave up:
    /// `ETIMEDOUT`) or a reset: the flow was gone by the idle age the
    /// probe left at.
    Dead { reset: bool, at_seconds: f64 },
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
    /// The idle age its keep-alive probe was planned for; results carry
    /// the age measured when the probe left.
    pub planned_seconds: f64,
    #[serde(flatten)]
    pub outcome: Outcome,
}

/// How the path ended idle connections, as far as the probes show (the
/// store and the daemon's rows name it too).
pub use crate::diagnosis::table::FailureMode;

/// What the probes found: the JSON of `observer probe --format json`
/// without its destination and timing (see `super::Report`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Finding {
    pub how: FailureMode,
    /// The measured close (`fin`, `rst`): the median of the closes seen.
    pub idle_timeout_seconds: Option<f64>,
    /// `fin`/`rst`: the earliest close seen; `silent_drop`: the
    /// [`REPEAT`]-th largest age found alive below the smallest found dead
    /// (0 while fewer were), so that a shorter path carrying a quarter of
    /// the flows cannot hide above it (1 % chance); `none`: the largest
    /// alive age.
    pub lower_seconds: f64,
    /// `fin`/`rst`: the latest close seen; `silent_drop`: the smallest age
    /// found dead; `none`: absent.
    pub upper_seconds: Option<f64>,
    /// 0.8 x the measured close, or 0.8 x the lower end of a silent
    /// drop's bracket (the flow is known alive only up to there).
    pub recommended_pool_idle_timeout_seconds: Option<f64>,
    /// Whether a silent drop's bracket is within [`WITHIN`] (or
    /// [`FLOOR`]); false when the time budget ended first.
    pub settled: bool,
    /// Connections alive at an age above one found dead: they took a
    /// longer path than the one that dropped it (ECMP, two NAT gateways),
    /// or the flow was dropped for another reason (a failover, a full NAT
    /// table). Never used for the bracket, which is the shortest path's.
    pub contradictions: usize,
    /// The longer path those connections took: the largest age found
    /// alive, and an age by which it surely dropped them ([`REPEAT`]
    /// connections past that survival found dead; null: not shown).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub longer_path: Option<LongerPath>,
}

/// A second, longer path to the same destination (see
/// [`Finding::longer_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct LongerPath {
    pub lower_seconds: f64,
    pub upper_seconds: Option<f64>,
}

/// The state of a measurement: every connection's result so far.
#[derive(Debug, Clone, Default)]
pub struct Search {
    probes: Vec<Probe>,
}

/// `n` ages from [`SHORTEST`] to `up_to`, spread geometrically (a 5 s
/// backend and a 350 s NAT are both within a round's reach), to the
/// millisecond.
#[must_use]
pub fn first_round(up_to: f64, n: usize) -> Vec<f64> {
    let up_to = up_to.max(SHORTEST);
    if n <= 1 {
        return vec![up_to];
    }
    let mut ages: Vec<f64> = (0..n)
        .map(|i| {
            #[allow(clippy::cast_precision_loss, reason = "at most 64 connections")]
            let f = i as f64 / (n - 1) as f64;
            millis(SHORTEST * (up_to / SHORTEST).powf(f))
        })
        .collect();
    ages.dedup();
    ages
}

/// Rounded to the millisecond (what the output shows).
pub(crate) fn millis(s: f64) -> f64 {
    (s * 1000.0).round() / 1000.0
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
            Outcome::Closed { close, at_seconds } => Some((close, at_seconds)),
            _ => None,
        })
    }

    /// The smallest age found dead.
    fn dead(&self) -> Option<f64> {
        self.first_dead().map(|(at, _)| at)
    }

    /// The smallest age found dead, and whether a reset answered it.
    fn first_dead(&self) -> Option<(f64, bool)> {
        self.probes
            .iter()
            .filter_map(|p| match p.outcome {
                Outcome::Dead { reset, at_seconds } => Some((at_seconds, reset)),
                _ => None,
            })
            .min_by(|a, b| a.0.total_cmp(&b.0))
    }

    /// The ages found alive.
    fn alive(&self) -> impl Iterator<Item = f64> + '_ {
        self.probes.iter().filter_map(|p| match p.outcome {
            Outcome::Alive { at_seconds } => Some(at_seconds),
            _ => None,
        })
    }

    /// The largest age found alive below `below`.
    fn alive_below(&self, below: Option<f64>) -> Option<f64> {
        self.alive().filter(|a| below.is_none_or(|d| *a < d)).max_by(f64::total_cmp)
    }

    /// The [`REPEAT`]-th largest age found alive below `below`: the
    /// shortest path's lower bound, which every path carrying a quarter of
    /// the flows or more kept with chance 99 % or better.
    fn alive_below_surely(&self, below: f64) -> Option<f64> {
        let mut ages: Vec<f64> = self.alive().filter(|a| *a < below).collect();
        ages.sort_by(|a, b| b.total_cmp(a));
        ages.get(REPEAT - 1).copied()
    }

    /// The longer path: connections alive above the smallest age found
    /// dead. It is surely gone by an age only where [`REPEAT`]
    /// connections past its largest survival were found dead (one dead
    /// connection there may have taken the shorter path).
    fn longer_path(&self) -> Option<LongerPath> {
        let dead = self.dead()?;
        let lower = self.alive().filter(|a| *a > dead).max_by(f64::total_cmp)?;
        let mut above: Vec<f64> = self
            .probes
            .iter()
            .filter_map(|p| match p.outcome {
                Outcome::Dead { at_seconds, .. } if at_seconds > lower => Some(at_seconds),
                _ => None,
            })
            .collect();
        above.sort_by(f64::total_cmp);
        Some(LongerPath { lower_seconds: lower, upper_seconds: above.get(REPEAT - 1).copied() })
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
            (Some(d), Some(c)) => d < c - RACE,
            (Some(_), None) => true,
            (None, _) => false,
        }
    }

    /// The next round's planned ages (`n` connections, [`REPEAT`] at each
    /// age, the ages spread evenly inside the bracket), or `None` when the
    /// search is done: a hop's own close was measured, a silent drop is
    /// bracketed within [`WITHIN`] or [`FLOOR`], or nothing closed within
    /// the ages tried.
    #[must_use]
    pub fn next_round(&self, n: usize) -> Option<Vec<f64>> {
        if !self.silent_first() {
            return None;
        }
        let dead = self.dead()?;
        let alive = self.alive_below_surely(dead).unwrap_or(0.0);
        if narrow(alive, dead) {
            return None;
        }
        let n = n.max(1);
        let per_age = n.min(REPEAT);
        let m = (n / per_age).max(1);
        let mut ages: Vec<f64> = (1..=m)
            .map(|j| {
                #[allow(clippy::cast_precision_loss, reason = "at most 64 connections")]
                let f = j as f64 / (m + 1) as f64;
                millis(alive + (dead - alive) * f)
            })
            .filter(|a| *a >= SHORTEST / 2.0)
            .collect();
        ages.dedup();
        let ages: Vec<f64> = ages.iter().flat_map(|&a| std::iter::repeat_n(a, per_age)).collect();
        (!ages.is_empty()).then_some(ages)
    }

    /// What the results so far show.
    #[must_use]
    pub fn finding(&self) -> Finding {
        let dead = self.dead();
        let contradictions = dead.map_or(0, |d| self.alive().filter(|a| *a > d).count());
        if self.silent_first() {
            let upper = dead.unwrap_or_default();
            let lower = self.alive_below_surely(upper).unwrap_or(0.0);
            return Finding {
                how: FailureMode::SilentDrop,
                idle_timeout_seconds: None,
                lower_seconds: lower,
                upper_seconds: Some(upper),
                recommended_pool_idle_timeout_seconds: (lower > 0.0)
                    .then_some(lower * crate::diagnosis::estimate::POOL_FRACTION),
                settled: narrow(lower, upper),
                contradictions,
                longer_path: self.longer_path(),
            };
        }
        if self.earliest_close().is_none() {
            return Finding {
                how: FailureMode::None,
                idle_timeout_seconds: None,
                lower_seconds: self.alive_below(None).unwrap_or(0.0),
                upper_seconds: None,
                recommended_pool_idle_timeout_seconds: None,
                settled: true,
                contradictions,
                longer_path: None,
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
                Close::Fin => FailureMode::Fin,
                Close::Rst => FailureMode::Rst,
            },
            idle_timeout_seconds: Some(median),
            lower_seconds: ages[0],
            upper_seconds: ages.last().copied(),
            recommended_pool_idle_timeout_seconds: Some(median * crate::diagnosis::estimate::POOL_FRACTION),
            settled: true,
            contradictions,
            longer_path: None,
        }
    }

    /// Whether a connection planned at `planned` s can still tell
    /// anything, `elapsed` s into its round. A shorter age found dead
    /// bounds the shortest path; up to [`SECOND_PATH_REACH`] times that
    /// age a longer connection may still show a second, longer path, so
    /// it is waited for; past that it is cancelled. But a reset that met a
    /// probe may be a hop's own close racing it (a server closing idle
    /// connections with RST at the probe's age, under a slow clock): until
    /// [`RACE`] past that age, every longer connection may still see that
    /// close, which tells the two apart ([`Self::finding`]).
    #[must_use]
    pub fn worth_waiting(&self, planned: f64, elapsed: f64) -> bool {
        match self.first_dead() {
            None => true,
            Some((d, _)) if planned < d * SECOND_PATH_REACH => true,
            Some((d, reset)) => reset && elapsed < d + RACE,
        }
    }
}

/// A silent drop's bracket is narrow enough.
fn narrow(alive: f64, dead: f64) -> bool {
    let gap = dead - alive;
    gap <= FLOOR || gap <= WITHIN * dead
}

#[cfg(test)]
mod tests;

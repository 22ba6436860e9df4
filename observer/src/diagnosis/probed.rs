//! A path measured by `observer probe`, as the store keeps it and a row
//! shows it ([`ProbeEvidence`]), and how a client row's interval takes it
//! ([`merge`]). Pure logic: the probe itself is in `crate::probe`.
//!
//! A probe connection's idle time was chosen by the probe, not by the
//! application's pool: its closes are never peer-close evidence of the pool
//! (no `peer_closes` verdict), only a bracket of the path's timeout. The
//! bracket narrows the row's interval where the passive evidence agrees
//! with it; it is left aside where they disagree (the path changed, or the
//! probe's first exchange met another timeout than the application's).

use serde::{Deserialize, Serialize};

use crate::diagnosis::{estimate::Interval, key::RowId, table::FailureMode};

/// The thread name of the probe's connections (see
/// `observer_common::PROBE_THREAD`): it decides nothing by itself.
pub use observer_common::PROBE_THREAD;

/// One `observer probe` result for one row (the address it connected to,
/// as a client, from the probe's network namespace).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProbeEvidence {
    /// When the probe ended, ns since the Unix epoch.
    pub ts_unix_ns: u64,
    #[serde(flatten)]
    pub id: RowId,
    /// The destination as the user wrote it (`api.partner.example:443`).
    pub target: String,
    /// `tcp`, `tls`, `http`, `https`, `request` or `tls+request`.
    pub first_exchange: String,
    /// How the path ended the probe's idle connections (`none`: nothing
    /// closed within its `--up-to`).
    pub how: FailureMode,
    /// The measured close (`fin`, `rst`).
    pub idle_timeout_seconds: Option<f64>,
    /// The largest idle age the path kept (`fin`/`rst`: the earliest close).
    pub lower_seconds: f64,
    /// The smallest idle age the path did not keep (`fin`/`rst`: the
    /// latest close; null for `none`).
    pub upper_seconds: Option<f64>,
    /// A silent drop's bracket is within 5 % (or 0.2 s).
    pub settled: bool,
    pub connections: usize,
    pub elapsed_seconds: f64,
    /// Stopped by Ctrl-C: what was known then.
    pub interrupted: bool,
}

impl ProbeEvidence {
    /// "FIN at 2.001 s", "a silent drop in [2.900, 3.100] s", "nothing
    /// closed within 900.000 s".
    #[must_use]
    pub fn summary(&self) -> String {
        describe(self.how, self.idle_timeout_seconds, self.lower_seconds, self.upper_seconds, |s| format!("{s:.3}"))
    }

    /// The bracket `[lower, upper]` the probe proves for the path.
    #[must_use]
    pub fn bracket(&self) -> (Option<f64>, Option<f64>) {
        ((self.lower_seconds > 0.0).then_some(self.lower_seconds), self.upper_seconds)
    }
}

/// What [`merge`] did with a probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Merged {
    /// It raised the lower bound (the row's lower bound now rests on it).
    RaisedLower,
    /// It bounded or lowered the upper bound only.
    Upper,
    /// It added nothing the passive evidence did not already prove.
    Nothing,
    /// It contradicts the passive evidence: left aside.
    Contradicts,
}

impl Merged {
    /// The row's estimate rests on the probe.
    #[must_use]
    pub const fn used(self) -> bool {
        matches!(self, Self::RaisedLower | Self::Upper)
    }
}

/// Narrow `interval` with the probe's bracket, where the two overlap: the
/// larger lower bound and the smaller upper bound. A probe whose bracket
/// lies wholly outside the interval changes nothing.
pub fn merge(interval: &mut Interval, p: &ProbeEvidence) -> Merged {
    let (lower, upper) = p.bracket();
    let below = upper.zip(interval.lower).is_some_and(|(u, l)| u < l);
    let above = lower.zip(interval.upper).is_some_and(|(l, u)| l > u);
    if below || above {
        return Merged::Contradicts;
    }
    let mut merged = Merged::Nothing;
    if let Some(u) = upper {
        if interval.upper.is_none_or(|old| u < old) {
            interval.upper = Some(u);
            merged = Merged::Upper;
        }
    }
    if let Some(l) = lower {
        if interval.lower.is_none_or(|old| l > old) {
            interval.lower = Some(l);
            merged = Merged::RaisedLower;
        }
    }
    merged
}

/// A probe's finding in words, the one wording every surface uses (the
/// row's probe summary, the hops' declared values against it): "FIN at
/// 2.001 s", "a silent drop in [2.900, 3.100] s", "nothing closed within
/// 900.000 s", each number written by `num` (the unit follows).
#[must_use]
pub fn describe(
    how: FailureMode,
    idle_timeout: Option<f64>,
    lower: f64,
    upper: Option<f64>,
    num: impl Fn(f64) -> String,
) -> String {
    match (how, idle_timeout, upper) {
        (FailureMode::Fin, Some(t), _) => format!("FIN at {} s", num(t)),
        (FailureMode::Rst, Some(t), _) => format!("RST at {} s", num(t)),
        (FailureMode::SilentDrop, _, Some(u)) => format!("a silent drop in [{}, {}] s", num(lower), num(u)),
        _ => format!("nothing closed within {} s", num(lower)),
    }
}

#[cfg(test)]
mod tests {
    use super::{merge, FailureMode, Merged, ProbeEvidence};
    use crate::{diagnosis::estimate::Interval, diagnosis::key::RowId, kernel::event::Role};

    fn probe(how: FailureMode, t: Option<f64>, lower: f64, upper: Option<f64>) -> ProbeEvidence {
        ProbeEvidence {
            ts_unix_ns: 1,
            id: RowId {
                destination: "10.0.0.2:443".to_owned(),
                role: Role::Client,
                netns: crate::diagnosis::key::Netns::HOST,
            },
            target: "api:443".to_owned(),
            first_exchange: "tls".to_owned(),
            how,
            idle_timeout_seconds: t,
            lower_seconds: lower,
            upper_seconds: upper,
            settled: true,
            connections: 8,
            elapsed_seconds: 10.0,
            interrupted: false,
        }
    }

    fn interval(lower: Option<f64>, upper: Option<f64>) -> Interval {
        Interval { lower, upper, ..Interval::default() }
    }

    #[test]
    fn a_probe_alone_gives_its_bracket() {
        let mut i = Interval::default();
        assert_eq!(merge(&mut i, &probe(FailureMode::SilentDrop, None, 2.9, Some(3.1))), Merged::RaisedLower);
        assert_eq!((i.lower, i.upper), (Some(2.9), Some(3.1)));
        let mut i = Interval::default();
        assert_eq!(merge(&mut i, &probe(FailureMode::Fin, Some(2.0), 1.998, Some(2.003))), Merged::RaisedLower);
        assert_eq!((i.lower, i.upper), (Some(1.998), Some(2.003)));
    }

    #[test]
    fn passive_evidence_and_a_probe_narrow_each_other() {
        // Reuses survived 2.5 s, one failed at 4 s; the probe: dropped in [2.9, 3.1].
        let mut i = interval(Some(2.5), Some(4.0));
        assert_eq!(merge(&mut i, &probe(FailureMode::SilentDrop, None, 2.9, Some(3.1))), Merged::RaisedLower);
        assert_eq!((i.lower, i.upper), (Some(2.9), Some(3.1)));
        // A passive bound already tighter keeps its place.
        let mut i = interval(Some(3.0), Some(3.05));
        assert_eq!(merge(&mut i, &probe(FailureMode::SilentDrop, None, 2.9, Some(3.1))), Merged::Nothing);
        assert_eq!((i.lower, i.upper), (Some(3.0), Some(3.05)));
        let mut i = interval(Some(3.0), None);
        assert_eq!(merge(&mut i, &probe(FailureMode::SilentDrop, None, 2.9, Some(3.1))), Merged::Upper);
        assert_eq!((i.lower, i.upper), (Some(3.0), Some(3.1)));
    }

    #[test]
    fn a_probe_that_contradicts_the_passive_evidence_is_left_aside() {
        // Reuses survived 60 s, the probe says dead by 30 s (another path,
        // or the timeout changed): neither is overwritten.
        let mut i = interval(Some(60.0), None);
        assert_eq!(merge(&mut i, &probe(FailureMode::Fin, Some(30.0), 30.0, Some(30.0))), Merged::Contradicts);
        assert_eq!((i.lower, i.upper), (Some(60.0), None));
        let mut i = interval(None, Some(5.0));
        assert_eq!(merge(&mut i, &probe(FailureMode::SilentDrop, None, 9.0, Some(10.0))), Merged::Contradicts);
        assert!(!Merged::Contradicts.used());
    }

    #[test]
    fn nothing_closed_is_a_lower_bound_only() {
        let mut i = Interval::default();
        assert_eq!(merge(&mut i, &probe(FailureMode::None, None, 900.0, None)), Merged::RaisedLower);
        assert_eq!((i.lower, i.upper), (Some(900.0), None));
    }

    #[test]
    fn the_summary_names_the_close() {
        assert_eq!(probe(FailureMode::Fin, Some(2.0014), 2.0, Some(2.0)).summary(), "FIN at 2.001 s");
        assert_eq!(probe(FailureMode::SilentDrop, None, 2.9, Some(3.1)).summary(), "a silent drop in [2.900, 3.100] s");
        assert_eq!(probe(FailureMode::None, None, 900.0, None).summary(), "nothing closed within 900.000 s");
        let json = serde_json::to_value(probe(FailureMode::Rst, Some(3.0), 3.0, Some(3.0))).unwrap();
        assert_eq!(json["how"], "rst");
        assert_eq!(json["destination"], "10.0.0.2:443");
        assert_eq!(json["role"], "client");
    }
}

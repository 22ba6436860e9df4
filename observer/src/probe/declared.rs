//! `observer probe --path FILE`: the path file's declared idle timeouts
//! beside what the probe measured, like `path check --observed`.

use serde::Serialize;

use super::search::{FailureMode, Finding};
use crate::{
    diagnosis::probed::describe,
    path::{close_enough, Hop, Limit},
    units::{fmt_num, fmt_secs},
};

/// How the measured value stands against what the hops declare.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Agreement {
    /// The smallest declared idle timeout is what was measured.
    Matches,
    /// A hop ends idle connections earlier than any hop declares.
    EarlierThanDeclared,
    /// Nothing ended them at the smallest declared timeout: that hop does
    /// not enforce it, or the probe's path does not pass it.
    LaterThanDeclared,
    /// The client pool keeps idle connections longer than the
    /// recommendation (0.8 × the measured timeout).
    PoolAboveRecommended,
    /// The client pool is within the recommendation.
    PoolWithinRecommended,
}

/// One comparison, for the text and the JSON (`path` in `--format json`).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    pub hop: String,
    pub declared_seconds: f64,
    pub agreement: Agreement,
    pub message: String,
}

/// The measured value in words: `FIN at 30 s`, `a silent drop in [340, 352] s`.
fn measured(f: &Finding) -> String {
    describe(f.how, f.idle_timeout_seconds, f.lower_seconds, f.upper_seconds, fmt_num)
}

/// Compare the hops' declared idle timeouts with the finding: the
/// smallest declared by a hop behind the client, and each client pool's
/// own idle timeout against the recommendation.
#[must_use]
pub fn compare(hops: &[Hop], f: &Finding) -> Vec<Comparison> {
    let mut out = Vec::new();
    let smallest = hops
        .iter()
        .filter(|h| !h.client)
        .filter_map(|h| match h.limits.idle_timeout {
            Some(Limit::Seconds(s)) => Some((h, s)),
            _ => None,
        })
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let what = measured(f);
    if let Some((hop, declared)) = smallest {
        let (lo, hi) = match f.how {
            FailureMode::Fin | FailureMode::Rst => {
                let t = f.idle_timeout_seconds.unwrap_or_default();
                (t, t)
            }
            FailureMode::SilentDrop => (f.lower_seconds, f.upper_seconds.unwrap_or_default()),
            FailureMode::None => (f.lower_seconds, f64::INFINITY),
        };
        let agreement = if close_enough(declared, lo) || close_enough(declared, hi) || (lo..=hi).contains(&declared) {
            Agreement::Matches
        } else if hi < declared {
            Agreement::EarlierThanDeclared
        } else {
            Agreement::LaterThanDeclared
        };
        let message = match agreement {
            Agreement::EarlierThanDeclared => format!(
                "declared {} at {}, measured {what}: a hop closes earlier than declared",
                fmt_secs(declared),
                hop.name
            ),
            Agreement::LaterThanDeclared => format!(
                "declared {} at {}, measured {what}: it does not end idle connections at its declared timeout, or the probe's path does not pass it",
                fmt_secs(declared),
                hop.name
            ),
            _ => format!("declared {} at {}, measured {what}: as declared", fmt_secs(declared), hop.name),
        };
        out.push(Comparison { hop: hop.name.clone(), declared_seconds: declared, agreement, message });
    }
    if let Some(rec) = f.recommended_pool_idle_timeout_seconds {
        for hop in hops.iter().filter(|h| h.client) {
            let Some(Limit::Seconds(pool)) = hop.limits.idle_timeout else { continue };
            let above = pool > rec;
            out.push(Comparison {
                hop: hop.name.clone(),
                declared_seconds: pool,
                agreement: if above { Agreement::PoolAboveRecommended } else { Agreement::PoolWithinRecommended },
                message: if above {
                    format!(
                        "the pool at {} keeps idle connections {}, above the recommended {} (0.8 x the measured {what}): set it to at most {}",
                        hop.name,
                        fmt_secs(pool),
                        fmt_secs(rec),
                        fmt_secs(rec)
                    )
                } else {
                    format!(
                        "the pool at {} keeps idle connections {}, within the recommended {}",
                        hop.name,
                        fmt_secs(pool),
                        fmt_secs(rec)
                    )
                },
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{compare, Agreement};
    use crate::probe::search::{FailureMode, Finding};

    fn finding(how: FailureMode, t: Option<f64>, lo: f64, hi: Option<f64>) -> Finding {
        Finding {
            how,
            idle_timeout_seconds: t,
            lower_seconds: lo,
            upper_seconds: hi,
            recommended_pool_idle_timeout_seconds: (how != FailureMode::None).then(|| t.unwrap_or(lo) * 0.8),
            settled: true,
            contradictions: 0,
            longer_path: None,
        }
    }

    const PATH: &str = r#"
[[hop]]
name = "api client"
client = true
idle_timeout = "90s"

[[hop]]
name = "balancer"
idle_timeout = "60s"

[[hop]]
name = "backend"
idle_timeout = "75s"
"#;

    #[test]
    fn a_fin_earlier_than_declared_is_named_with_the_pool_fix() {
        let hops = crate::path::parse(PATH).unwrap();
        let c = compare(&hops, &finding(FailureMode::Fin, Some(30.0), 30.0, Some(30.0)));
        assert_eq!(c[0].agreement, Agreement::EarlierThanDeclared);
        assert_eq!(c[0].message, "declared 60 s at balancer, measured FIN at 30 s: a hop closes earlier than declared");
        assert_eq!(c[1].agreement, Agreement::PoolAboveRecommended);
        assert!(c[1].message.contains("set it to at most 24 s"), "{}", c[1].message);
    }

    #[test]
    fn a_silent_drop_bracketing_the_declared_timeout_matches() {
        let hops = crate::path::parse(PATH).unwrap();
        let c = compare(&hops, &finding(FailureMode::SilentDrop, None, 58.2, Some(61.0)));
        assert_eq!(c[0].agreement, Agreement::Matches, "{c:?}");
        let c = compare(&hops, &finding(FailureMode::None, None, 120.0, None));
        assert_eq!(c[0].agreement, Agreement::LaterThanDeclared, "{c:?}");
        assert_eq!(c.len(), 1, "no recommendation, no pool comparison");
    }
}

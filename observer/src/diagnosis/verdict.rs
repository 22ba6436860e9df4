//! The verdict and recommendation rules, as pure functions of what the
//! evidence established (see README, "Verdicts").
//!
//! Client rows (our pool toward a destination):
//! - `mismatch` when reuses failed at idle ages consistent with the path's
//!   timeout (at or above the interval's cut: outliers never count), or a
//!   cluster of peer idle closes measured the path's timeout (the pool kept
//!   those connections idle past it, so this holds before any reuse fails),
//!   or the pool's own idle timeout is at or past the path's;
//! - `ok` when the pool's idle timeout is proven below the path's (at or
//!   below the largest idle age proven to survive, or below the measured
//!   point);
//! - `unknown` otherwise.
//!
//! Server rows (our listener toward its clients): `clients_mismatch` when
//! clients wrote on connections we had closed idle (late reuses consistent
//! with our idle timeout), `ok` when the clients' pools provably close
//! first, `unknown` otherwise. Their recommendation goes to the clients
//! (pool idle timeout at most 0.8 x ours) or asks us to raise ours; it never
//! tells a server to lower its idle timeout.
//!
//! Numbers come only from proof: the point estimate, else the largest idle
//! age proven to survive, and never above 0.8 x the smallest idle age
//! proven to fail. Failures alone bound the timeout from above but give
//! no safe number. A client row on which no timeout has shown (no failure,
//! no peer idle close, no pool idle close) gives no number at all: 0.8 x
//! the largest idle that survived would shorten a pool for nothing, and
//! defeat the keep-alive pings that kept it alive.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::{
    diagnosis::estimate::{recommended_pool_idle, Interval, CLUSTER_SPREAD, POOL_FRACTION},
    diagnosis::table::{FailureMode, LowerBasis, Verdict, VerdictEvidence},
};

/// Recommended maximum connection lifetime (the seeds' five minutes): a
/// connection is never reused indefinitely, whatever the idle timeouts.
pub const RECOMMENDED_MAX_LIFETIME_SECONDS: f64 = 300.0;

/// What the evidence of a client row established.
#[derive(Debug, Clone, Default)]
pub struct ClientFindings {
    pub interval: Interval,
    pub lower_basis: Option<LowerBasis>,
    /// The mean idle age of the pings answered (see `LowerBasis::Pings`).
    pub ping_every: Option<f64>,
    /// Point estimate (the smallest cluster with mixed paths).
    pub point: Option<f64>,
    pub point_evidence: usize,
    /// Distinct clusters of peer idle closes (more than one: mixed paths).
    pub paths: usize,
    /// Our pool's idle timeout.
    pub pool: Option<f64>,
    /// Failed reuses at or above the interval's cut.
    pub consistent_failures: usize,
    /// The smallest idle age at which a reuse failed (outliers included):
    /// never `ok` for a pool that keeps sockets idle that long.
    pub earliest_failed_reuse: Option<f64>,
    pub failure_mode: Option<FailureMode>,
    /// What `observer probe` measured, when the interval rests on it
    /// ("FIN at 2.001 s").
    pub probe: Option<String>,
}

/// What the evidence of a server row established.
#[derive(Debug, Clone, Default)]
pub struct ServerFindings {
    /// Our idle timeout toward clients.
    pub server_idle_timeout: Option<f64>,
    /// Idle ages at our close of the late reuses.
    pub late_reuse_idles: Vec<f64>,
    pub client_max_reuse_idle: Option<f64>,
    pub client_pool_idle_timeout: Option<f64>,
}

/// A verdict with its recommendation: what a row says and what to do,
/// flattened into the row (`DestinationRow::judgement`: the JSON keys are
/// these fields' own).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Judgement {
    pub verdict: Verdict,
    /// What the verdict rests on (null for `unknown`).
    #[serde(default)]
    pub evidence: Option<VerdictEvidence>,
    pub recommended_pool_idle_timeout_seconds: Option<f64>,
    pub recommended_max_lifetime_seconds: Option<f64>,
    /// Server row: raise our idle timeout to at least this (the clients'
    /// longest reuse / 0.8), the alternative to lowering their pools.
    #[serde(default)]
    pub recommended_server_idle_timeout_seconds: Option<f64>,
    /// Retry once, only when no request byte reached a live peer.
    pub safe_retry_rule: bool,
    pub recommendation: String,
}

impl Judgement {
    /// No verdict yet, nothing recommended.
    #[must_use]
    pub fn unknown() -> Self {
        Self {
            verdict: Verdict::Unknown,
            evidence: None,
            recommended_pool_idle_timeout_seconds: None,
            recommended_max_lifetime_seconds: None,
            recommended_server_idle_timeout_seconds: None,
            safe_retry_rule: false,
            recommendation: String::new(),
        }
    }
}

fn round_ms(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// The rule for client rows.
#[must_use]
#[allow(clippy::many_single_char_names, reason = "f: the findings, i: their interval, p/u/l: pool, upper, lower")]
pub fn judge_client(f: &ClientFindings) -> Judgement {
    let i = &f.interval;
    let upper = f.point.or(i.upper);
    // `ok` says the pool closes first; a reuse that failed below the
    // pool's own timeout says otherwise, whatever the interval's cut.
    let proven_below = |p: f64, l: f64| p <= l && f.earliest_failed_reuse.is_none_or(|e| p < e);
    let (verdict, evidence) = if f.consistent_failures > 0 {
        (Verdict::Mismatch, Some(VerdictEvidence::Failures))
    } else if f.point.is_some() {
        (Verdict::Mismatch, Some(VerdictEvidence::PeerCloses))
    } else if let (Some(p), Some(u)) = (f.pool, upper) {
        if p >= u {
            (Verdict::Mismatch, Some(VerdictEvidence::PoolIdleTimeout))
        } else if i.lower.is_some_and(|l| proven_below(p, l)) {
            (Verdict::Ok, Some(VerdictEvidence::IdleCloses))
        } else {
            (Verdict::Unknown, None)
        }
    } else if let (Some(p), Some(l)) = (f.pool, i.lower) {
        if proven_below(p, l) {
            (Verdict::Ok, Some(VerdictEvidence::IdleCloses))
        } else {
            (Verdict::Unknown, None)
        }
    } else {
        (Verdict::Unknown, None)
    };
    // The number: the measured point, else the largest age proven to
    // survive; none where no timeout has shown at all; never past the
    // earliest proven death.
    let timeout_seen = i.upper.is_some() || f.point.is_some() || f.pool.is_some();
    let (path, basis) = match (f.point, i.lower) {
        (Some(p), _) => (Some(p), None),
        (None, Some(l)) if timeout_seen => (Some(l), f.lower_basis),
        _ => (None, None),
    };
    let path = path.map(|p| i.upper.map_or(p, |u| p.min(u)));
    let recommended = path.map(recommended_pool_idle);
    let safe_retry_rule = matches!(f.failure_mode, Some(FailureMode::Fin | FailureMode::Rst));
    let source = match (f.point, basis) {
        (Some(_), _) if f.paths > 1 => {
            format!(", the smallest of {} idle timeouts measured behind this address (mixed_paths)", f.paths)
        }
        (None, Some(LowerBasis::Silent | LowerBasis::Probe)) if i.paths.is_some() => format!(
            ", the largest idle age proven to survive on the shorter of two paths that drop idle flows silently ({:.0}% of the flows fail from {:.3} s, the rest later: mixed_paths)",
            i.paths.map_or(0.0, |p| p.short_share * 100.0),
            i.paths.map_or(0.0, |p| p.short_upper)
        ),
        (Some(_), _) => format!(", measured by {} peer idle closes", f.point_evidence),
        (None, Some(LowerBasis::Keepalive)) => ", the largest idle age proven to survive, but only by sockets whose TCP keep-alive probes ran while idle: it holds for proxies, not for a NAT, firewall or L4 balancer the probes kept fresh".to_owned(),
        (None, Some(LowerBasis::Pings)) => format!(
            ", the largest idle age proven to survive, by pings only{}: the connections never went longer without one",
            every(f.ping_every)
        ),
        (None, Some(LowerBasis::Probe)) => {
            format!(", measured by observer probe: {}", f.probe.as_deref().unwrap_or("its connections"))
        }
        (None, _) => ", the largest idle age proven to survive".to_owned(),
    };
    let recommendation = match (verdict, recommended, path) {
        (Verdict::Mismatch, Some(r), Some(p)) => {
            let mut s = format!(
                "set the pool idle timeout to at most {r:.3} s (0.8 x the path's {p:.3} s{source}) and a maximum connection lifetime of {RECOMMENDED_MAX_LIFETIME_SECONDS:.0} s"
            );
            if safe_retry_rule {
                s.push_str("; retry once on a fresh connection only when no request byte reached a live peer (safe_to_retry)");
            }
            s
        }
        (Verdict::Mismatch, _, _) if i.paths.is_some() => format!(
            "lower the pool idle timeout below {:.3} s, where reuses on the shorter of two paths that drop idle flows silently begin to fail ({:.0}% of the flows; the rest fail later: mixed_paths); no safe number yet: too few reuses below that age survived to bound the shorter path from below (observer probe can: it runs enough connections at each idle age)",
            upper.unwrap_or_default(),
            i.paths.map_or(0.0, |p| p.short_share * 100.0)
        ),
        (Verdict::Mismatch, _, _) => format!(
            "lower the pool idle timeout below {:.3} s, where reuses fail; no safe number yet: no reuse has survived an idle period and no three peer idle closes agree, so the path's timeout is bounded from above only",
            upper.unwrap_or_default()
        ),
        (Verdict::Ok, _, _) => "none: the pool closes idle sockets before the path does".to_owned(),
        (_, Some(r), Some(p)) => format!("keep the pool idle timeout at most {r:.3} s (0.8 x the path's {p:.3} s{source})"),
        _ if !timeout_seen && f.lower_basis == Some(LowerBasis::Probe) => format!(
            "none: no idle timeout has shown on this path; observer probe's connections survived up to {:.3} s idle",
            i.lower.unwrap_or_default()
        ),
        _ if !timeout_seen && i.lower.is_some() => format!(
            "none: no idle timeout has shown on this path (no failed reuse, no peer idle close, no pool idle close); reuses survived up to {:.3} s idle{}",
            i.lower.unwrap_or_default(),
            match f.lower_basis {
                Some(LowerBasis::Keepalive) => " while TCP keep-alive probes ran".to_owned(),
                Some(LowerBasis::Pings) => format!(" while pinged{}, so nothing longer is known", every(f.ping_every)),
                _ => String::new(),
            }
        ),
        _ => "not enough evidence yet".to_owned(),
    };
    Judgement {
        verdict,
        evidence,
        recommended_pool_idle_timeout_seconds: recommended,
        recommended_max_lifetime_seconds: (verdict == Verdict::Mismatch).then_some(RECOMMENDED_MAX_LIFETIME_SECONDS),
        recommended_server_idle_timeout_seconds: None,
        safe_retry_rule,
        recommendation,
    }
}

/// " about every N s" for a ping cadence, when known.
fn every(ping_every: Option<f64>) -> String {
    ping_every.map(|p| format!(" about every {p:.1} s")).unwrap_or_default()
}

/// The rule for server rows.
#[must_use]
pub fn judge_server(f: &ServerFindings) -> Judgement {
    let s = f.server_idle_timeout;
    // Late reuses consistent with our idle timeout: our close came at it.
    let consistent =
        f.late_reuse_idles.iter().filter(|&&idle| s.is_none_or(|t| idle >= t * (1.0 - CLUSTER_SPREAD))).count();
    let (verdict, evidence) = if consistent > 0 {
        (Verdict::ClientsMismatch, Some(VerdictEvidence::LateReuses))
    } else if let (Some(t), Some(c)) = (s, f.client_pool_idle_timeout) {
        if c < t && f.late_reuse_idles.is_empty() {
            (Verdict::Ok, Some(VerdictEvidence::IdleCloses))
        } else {
            (Verdict::Unknown, None)
        }
    } else {
        (Verdict::Unknown, None)
    };
    let ours = s.or_else(|| f.late_reuse_idles.iter().copied().reduce(f64::min));
    let for_clients = ours.map(recommended_pool_idle);
    let raise_to = match verdict {
        Verdict::ClientsMismatch => f.client_max_reuse_idle.map(|m| round_ms(m / POOL_FRACTION)),
        _ => None,
    };
    let recommendation = match (verdict, for_clients, ours) {
        (Verdict::ClientsMismatch, Some(r), Some(t)) => {
            let mut s = format!(
                "clients: set the pool idle timeout to at most {r:.3} s (0.8 x our {t:.3} s idle timeout) and a maximum connection lifetime of {RECOMMENDED_MAX_LIFETIME_SECONDS:.0} s"
            );
            if let (Some(raise), Some(m)) = (raise_to, f.client_max_reuse_idle) {
                let _ = write!(
                    s,
                    "; or raise our idle timeout to at least {raise:.3} s (clients reuse connections after up to {m:.3} s idle)"
                );
            }
            s
        }
        (Verdict::Ok, _, _) => "none: the clients close idle connections before we do".to_owned(),
        (_, Some(r), Some(t)) => {
            format!("clients should keep their pool idle timeout at most {r:.3} s (0.8 x our {t:.3} s idle timeout)")
        }
        _ => "not enough evidence yet".to_owned(),
    };
    Judgement {
        verdict,
        evidence,
        recommended_pool_idle_timeout_seconds: for_clients,
        recommended_max_lifetime_seconds: (verdict == Verdict::ClientsMismatch)
            .then_some(RECOMMENDED_MAX_LIFETIME_SECONDS),
        recommended_server_idle_timeout_seconds: raise_to,
        safe_retry_rule: false,
        recommendation,
    }
}

#[cfg(test)]
mod tests;

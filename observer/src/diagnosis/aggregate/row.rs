//! One row of the table from its state: estimates, verdict, owners and
//! counts as every interface shows them.

use std::collections::BTreeMap;

use super::state::{interval_of, DestState};
use crate::{
    diagnosis::estimate,
    diagnosis::evidence::IDLE_BUCKETS,
    diagnosis::key::DestKey,
    diagnosis::probed::{self, Merged, ProbeEvidence},
    diagnosis::table::{Bucket, DestinationRow, FailureMode, LowerBasis, PathShare, Verdict},
    diagnosis::verdict::{self, ClientFindings, Judgement, ServerFindings},
    kernel::event::Role,
    kernel::first_bytes::Protocol,
    kernel::runtime::ClientRuntime,
};

/// One row from a destination's evidence: its counts, then the side its
/// role judges (the estimates and the verdict), then the fix in the
/// clients' own terms.
pub(crate) fn row(key: DestKey, st: &DestState, now_ns: u64, protocols: Vec<Protocol>) -> DestinationRow {
    let mut r = counted(key, st, now_ns, protocols);
    let judgement = if key.role == Role::Server { server_side(&mut r, st) } else { client_side(&mut r, st) };
    r.verdict = judgement.verdict;
    r.evidence = judgement.evidence;
    r.recommended_pool_idle_timeout_seconds = judgement.recommended_pool_idle_timeout_seconds;
    r.recommended_max_lifetime_seconds = judgement.recommended_max_lifetime_seconds;
    r.recommended_server_idle_timeout_seconds = judgement.recommended_server_idle_timeout_seconds;
    r.safe_retry_rule = judgement.safe_retry_rule;
    r.recommendation = judgement.recommendation;
    if key.role == Role::Client {
        let runtimes: Vec<ClientRuntime> = st.runtimes.keys().cloned().collect();
        r.fix_settings = crate::diagnosis::clients::fix_settings(
            &runtimes,
            st.unknown_runtime,
            &r.protocols,
            r.path_idle_timeout_seconds.or(r.path_idle_timeout_upper_seconds),
            r.recommended_pool_idle_timeout_seconds,
        );
    }
    r
}

/// The row's identity and counts, every estimate still unknown.
fn counted(key: DestKey, st: &DestState, now_ns: u64, protocols: Vec<Protocol>) -> DestinationRow {
    let ev = &st.ev;
    let counts = ev.counts();
    let (reuses, failures) = ev.last_hour(now_ns);
    let buckets = IDLE_BUCKETS
        .iter()
        .map(|&le| Some(le))
        .chain(std::iter::once(None))
        .zip(ev.buckets())
        .map(|(le, (reuses, failures))| Bucket { le, reuses, failures })
        .collect();
    let deadline = |v: Vec<f64>| estimate::cluster(&v).map(|c| c.value);
    DestinationRow {
        id: key.id(),
        failure_mode: FailureMode::None,
        path_idle_timeout_seconds: None,
        path_idle_timeout_lower_seconds: 0.0,
        path_idle_timeout_upper_seconds: None,
        path_lower_evidence: 0,
        path_upper_evidence: 0,
        path_point_evidence: 0,
        path_outliers: 0,
        path_lower_basis: None,
        probe: st.probe.clone(),
        probe_used: false,
        path_idle_timeout_spread_seconds: None,
        mixed_paths: Vec::new(),
        pool_idle_timeout_seconds: None,
        pool_max_reuse_idle_seconds: None,
        verdict: Verdict::Unknown,
        evidence: None,
        recommended_pool_idle_timeout_seconds: None,
        recommended_max_lifetime_seconds: None,
        recommended_server_idle_timeout_seconds: None,
        safe_retry_rule: false,
        recommendation: String::new(),
        reuses,
        failures,
        reuses_window: counts.reuses,
        failures_window: counts.failures,
        peer_closes_window: counts.peer_closes,
        peer_restarts: counts.restarts,
        restart_failures: counts.restart_failures,
        failures_after_goodbye: counts.after_goodbye,
        last_peer_restart_unix_ns: st.restarts.back().map(|r| r.ts_unix_ns),
        keepalive_evidence: counts.keepalive,
        keepalive_idle_seconds: ev.min_keepalive_idle(),
        peer_request_deadline_seconds: deadline(ev.aborted()),
        request_timeout_seconds: deadline(ev.timeouts()),
        requests_aborted_window: counts.aborted,
        request_timeouts_window: counts.timeouts,
        server_idle_timeout_seconds: None,
        late_reuses: counts.late_reuses,
        client_max_reuse_idle_seconds: None,
        client_pool_idle_timeout_seconds: None,
        at_risk_idle_sockets: st.at_risk,
        doomed_idle_sockets: st.doomed,
        doomed_owners: st.doomed_owners.keys().cloned().collect(),
        discarded_dead: counts.discarded_dead,
        first_failure_unix_ns: st.first_failure_ns,
        last_failure_unix_ns: st.last_failure_ns,
        processes: st
            .processes
            .keys()
            .map(|p| p.process.clone())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect(),
        owners: st.processes.keys().cloned().collect(),
        idle_buckets: buckets,
        last_change: st.changes.back().cloned(),
        evidence_bytes: ev.bytes() + st.held_bytes(),
        server_names: Vec::new(),
        server_names_dropped: 0,
        protocols,
        fix_settings: Vec::new(),
    }
}

/// A server row: our idle timeout, the clients' reuse ages, the verdict.
fn server_side(r: &mut DestinationRow, st: &DestState) -> Judgement {
    let ev = &st.ev;
    let f = ServerFindings {
        server_idle_timeout: estimate::cluster(&ev.local_closes()).map(|c| c.value),
        late_reuse_idles: ev.late_reuse_idles(),
        client_max_reuse_idle: ev.max_reuse_idle(),
        client_pool_idle_timeout: st.point().first().map(|c| c.value),
    };
    r.server_idle_timeout_seconds = f.server_idle_timeout;
    r.client_max_reuse_idle_seconds = f.client_max_reuse_idle;
    r.client_pool_idle_timeout_seconds = f.client_pool_idle_timeout;
    verdict::judge_server(&f)
}

/// A client row: the path's interval and point, the pool's idle timeout,
/// the failure mode, the verdict.
fn client_side(r: &mut DestinationRow, st: &DestState) -> Judgement {
    let ev = &st.ev;
    let peer_clusters = st.point();
    let (mut interval, mut basis) = interval_of(ev);
    // Silent survivals that were all pings: only where the connections
    // speak HTTP/2 is a small answered exchange a PING frame; elsewhere
    // it is a small request (a Redis PING, a memcached get).
    if let (Some(LowerBasis::Silent), Some(lower)) = (basis, interval.lower) {
        if r.protocols.contains(&Protocol::H2) && ev.max_unpinged_alive().is_none_or(|m| m < lower) {
            basis = Some(LowerBasis::Pings);
        }
    }
    if interval.spread.is_none() && peer_clusters.len() > 1 {
        // Mixed paths: every estimate is the smallest path's.
        let alive = ev.alive(basis == Some(LowerBasis::Keepalive));
        let dead: Vec<f64> = ev.dead().map(|d| d.idle).collect();
        interval = estimate::smallest_path_interval(&alive, &dead, peer_clusters[0].value);
    }
    // What `observer probe` measured narrows the interval where the
    // passive evidence agrees with it.
    let merged = st.probe.as_ref().map(|p| probed::merge(&mut interval, p));
    if merged == Some(Merged::RaisedLower) {
        basis = Some(LowerBasis::Probe);
    }
    r.probe_used = merged.is_some_and(Merged::used);
    // Failure mode: the most common among dead evidence of this epoch.
    let mut modes: BTreeMap<&'static str, (usize, FailureMode)> = BTreeMap::new();
    for d in ev.dead() {
        modes.entry(d.mode.as_str()).or_insert((0, d.mode)).0 += 1;
    }
    let mode = modes.values().max_by_key(|(n, _)| *n).map(|(_, m)| *m);
    let total_peer: usize = ev.dead().filter(|d| d.close).count();
    // A spread timeout's point is its band's start (what bites), never
    // a chance cluster inside the band, and never one outside the interval.
    let point = estimate::point_of(&interval, &peer_clusters);
    let f = ClientFindings {
        interval,
        lower_basis: basis,
        ping_every: ev.ping_every(),
        point: point.map(|c| c.value),
        point_evidence: point.map_or(0, |c| c.count),
        paths: if interval.spread.is_some() { 1 } else { peer_clusters.len() },
        pool: estimate::cluster(&ev.local_closes()).map(|c| c.value),
        consistent_failures: interval.upper.map_or(0, |u| ev.dead().filter(|d| d.reuse && d.idle >= u).count()),
        failure_mode: mode,
        probe: st.probe.as_ref().filter(|_| r.probe_used).map(ProbeEvidence::summary),
    };
    r.failure_mode = mode.unwrap_or(FailureMode::None);
    r.path_idle_timeout_seconds = f.point;
    r.path_idle_timeout_lower_seconds = interval.lower.unwrap_or(0.0);
    r.path_idle_timeout_upper_seconds = interval.upper;
    r.path_lower_evidence = interval.lower_evidence;
    r.path_upper_evidence = interval.upper_evidence;
    r.path_point_evidence = f.point_evidence;
    r.path_outliers = interval.outliers;
    r.path_lower_basis = basis;
    r.path_idle_timeout_spread_seconds = interval.spread.map(|b| [b.earliest, b.latest]);
    if peer_clusters.len() > 1 && interval.spread.is_none() {
        #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
        let share = |n: usize| (n as f64 / total_peer.max(1) as f64 * 1000.0).round() / 1000.0;
        r.mixed_paths =
            peer_clusters.iter().map(|c| PathShare { idle_timeout_seconds: c.value, share: share(c.count) }).collect();
    }
    r.pool_idle_timeout_seconds = f.pool;
    r.pool_max_reuse_idle_seconds = ev.max_reuse_idle();
    verdict::judge_client(&f)
}

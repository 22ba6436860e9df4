//! One row of the table from its state: estimates, verdict, owners and
//! counts as every interface shows them.

use std::collections::BTreeMap;

use super::state::DestState;
use crate::{
    diagnosis::estimate,
    diagnosis::evidence::{ResetBy, ResetCounts, IDLE_BUCKETS},
    diagnosis::key::DestKey,
    diagnosis::probed::{Merged, ProbeEvidence},
    diagnosis::table::{
        Bucket, Counts, Deadlines, DestinationRow, FailureMode, KeepAliveEvidence, LiveSockets, OurPool, PathEstimate,
        PathShare, ResetShare, ResetSources, ServerSide,
    },
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
    r.judgement = judgement;
    if key.role == Role::Client {
        reset_sources(&mut r, &st.ev.counts().resets);
        let runtimes: Vec<ClientRuntime> = st.runtimes.keys().cloned().collect();
        r.fix_settings = crate::diagnosis::clients::fix_settings(
            &runtimes,
            st.unknown_runtime,
            &r.protocols,
            r.path.idle_timeout_seconds.or(r.path.upper_seconds),
            r.judgement.recommended_pool_idle_timeout_seconds,
        );
    }
    r
}

/// Who sent the row's resets: every source with its count, and the most
/// common one that was told (never an untold one).
fn reset_sources(r: &mut DestinationRow, counts: &ResetCounts) {
    let sources = counts.sources();
    if let Some(&(by, _)) = sources.iter().find(|(by, _)| *by != ResetBy::Untold) {
        (r.resets.from, r.resets.hops_closer) = by.shown();
    }
    r.resets.sources = sources
        .into_iter()
        .map(|(by, resets)| {
            let (from, hops_closer) = by.shown();
            ResetShare { from, hops_closer, resets }
        })
        .collect();
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
        path: PathEstimate { probe: st.probe.clone(), ..PathEstimate::default() },
        resets: ResetSources::default(),
        pool: OurPool::default(),
        judgement: Judgement::unknown(),
        counts: Counts {
            reuses,
            failures,
            reuses_window: counts.reuses,
            failures_window: counts.failures,
            peer_closes_window: counts.peer_closes,
            peer_restarts: counts.restarts,
            restart_failures: counts.restart_failures,
            failures_after_goodbye: counts.after_goodbye,
            last_peer_restart_unix_ns: st.restarts.back().map(|r| r.ts_unix_ns),
        },
        keepalive: KeepAliveEvidence { evidence: counts.keepalive, idle_seconds: ev.min_keepalive_idle() },
        deadlines: Deadlines {
            peer_request_deadline_seconds: deadline(ev.aborted()),
            request_timeout_seconds: deadline(ev.timeouts()),
            requests_aborted_window: counts.aborted,
            request_timeouts_window: counts.timeouts,
        },
        server: ServerSide { late_reuses: counts.late_reuses, ..ServerSide::default() },
        sockets: LiveSockets {
            at_risk_idle_sockets: st.at_risk,
            doomed_idle_sockets: st.doomed,
            doomed_owners: st.doomed_owners.keys().cloned().collect(),
            discarded_dead: counts.discarded_dead,
        },
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
        tls_versions: Vec::new(),
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
    r.server.server_idle_timeout_seconds = f.server_idle_timeout;
    r.server.client_max_reuse_idle_seconds = f.client_max_reuse_idle;
    r.server.client_pool_idle_timeout_seconds = f.client_pool_idle_timeout;
    verdict::judge_server(&f)
}

/// A client row: the path's interval and point, the pool's idle timeout,
/// the failure mode, the verdict.
fn client_side(r: &mut DestinationRow, st: &DestState) -> Judgement {
    let ev = &st.ev;
    let peer_clusters = st.point();
    let (interval, basis, merged) = st.shown_interval(r.protocols.contains(&Protocol::H2));
    r.path.probe_used = merged.is_some_and(Merged::used);
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
        paths: if interval.spread.is_some() {
            1
        } else if interval.paths.is_some() {
            peer_clusters.len().max(2)
        } else {
            peer_clusters.len()
        },
        earliest_failed_reuse: ev.dead().filter(|d| d.reuse).map(|d| d.idle).reduce(f64::min),
        pool: estimate::cluster(&ev.local_closes()).map(|c| c.value),
        consistent_failures: interval.upper.map_or(0, |u| ev.dead().filter(|d| d.reuse && d.idle >= u).count()),
        failure_mode: mode,
        probe: st.probe.as_ref().filter(|_| r.path.probe_used).map(ProbeEvidence::summary),
    };
    r.failure_mode = mode.unwrap_or(FailureMode::None);
    r.path.idle_timeout_seconds = f.point;
    r.path.lower_seconds = interval.lower.unwrap_or(0.0);
    r.path.upper_seconds = interval.upper;
    r.path.lower_evidence = interval.lower_evidence;
    r.path.upper_evidence = interval.upper_evidence;
    r.path.point_evidence = f.point_evidence;
    r.path.outliers = interval.outliers;
    r.path.lower_basis = basis;
    r.path.spread_seconds = interval.spread.map(|b| [b.earliest, b.latest]);
    if peer_clusters.len() > 1 && interval.spread.is_none() {
        #[allow(clippy::cast_precision_loss, reason = "counts far below 2^52")]
        let share = |n: usize| (n as f64 / total_peer.max(1) as f64 * 1000.0).round() / 1000.0;
        r.path.mixed_paths = peer_clusters
            .iter()
            .map(|c| PathShare {
                idle_timeout_seconds: c.value,
                share: share(c.count),
                lower_seconds: None,
                upper_seconds: None,
            })
            .collect();
    } else if let Some(p) = interval.paths.filter(|_| peer_clusters.len() <= 1) {
        let silent = |lower: Option<f64>, upper: Option<f64>, share: f64| PathShare {
            idle_timeout_seconds: upper.or(lower).unwrap_or_default(),
            share,
            lower_seconds: lower,
            upper_seconds: upper,
        };
        r.path.mixed_paths = vec![
            silent(p.short_lower, Some(p.short_upper), p.short_share),
            silent(p.long_lower, p.long_upper, ((1.0 - p.short_share) * 1000.0).round() / 1000.0),
        ];
    }
    r.pool.idle_timeout_seconds = f.pool;
    r.pool.max_reuse_idle_seconds = ev.max_reuse_idle();
    verdict::judge_client(&f)
}

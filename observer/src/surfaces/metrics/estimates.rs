//! The estimate gauges: rebuilt from the destination table at each scrape,
//! one family per estimate, per row.

use prometheus_client::{
    metrics::{family::Family, gauge::Gauge},
    registry::Unit,
};

use super::{register, BoundLabels, FGauge, MismatchLabels, NameLabels, Registrar, RowGauge, RowLabels};
use crate::diagnosis::aggregate::{DestinationRow, Verdict};

/// Gauges rebuilt from the table at each scrape, per row: a gauge without
/// evidence is absent, not zero.
pub(super) struct EstimateFamilies {
    path_timeout: Family<BoundLabels, FGauge>,
    pool_timeout: RowGauge,
    recommended: RowGauge,
    mismatch: Family<MismatchLabels, Gauge>,
    at_risk: Family<RowLabels, Gauge>,
    doomed: Family<RowLabels, Gauge>,
    peer_deadline: RowGauge,
    our_timeout: RowGauge,
    server_timeout: RowGauge,
    client_max_reuse: RowGauge,
    mixed_paths: Family<RowLabels, Gauge>,
    info: Family<NameLabels, Gauge>,
}

impl EstimateFamilies {
    #[allow(clippy::too_many_lines, reason = "one registration per family")]
    pub(super) fn register(r: &mut Registrar) -> Self {
        let s = Some(Unit::Seconds);
        Self {
            path_timeout: register(
                r,
                "observer_path_idle_timeout",
                "Effective path idle timeout: interval bounds and point estimate",
                s.clone(),
                Family::default(),
            ),
            pool_timeout: register(
                r,
                "observer_pool_idle_timeout",
                "Idle timeout of the local pool, from its idle closes",
                s.clone(),
                Family::default(),
            ),
            recommended: register(
                r,
                "observer_recommended_pool_idle_timeout",
                "Recommended pool idle timeout: 0.8 x the path idle timeout",
                s.clone(),
                Family::default(),
            ),
            mismatch: register(
                r,
                "observer_mismatch",
                "1 when the pool keeps sockets idle longer than the path allows",
                None,
                Family::default(),
            ),
            at_risk: register(
                r,
                "observer_at_risk_idle_sockets",
                "Sockets idle right now past the path idle timeout (they will fail on first use)",
                None,
                Family::default(),
            ),
            info: register(
                r,
                "observer_destination_info",
                "1 for each host name clients used for the destination (TLS SNI, HTTP Host; at most 4 per row), to join on destination",
                None,
                Family::default(),
            ),
            doomed: register(
                r,
                "observer_doomed_idle_sockets",
                "Client sockets held now that are already dead: the peer closed or reset them, or the kernel timed them out, while idle (exact, from the kernel)",
                None,
                Family::default(),
            ),
            peer_deadline: register(
                r,
                "observer_peer_request_deadline",
                "The peer's request deadline, from a cluster of requests it aborted",
                s.clone(),
                Family::default(),
            ),
            our_timeout: register(
                r,
                "observer_request_timeout",
                "Our request timeout, from a cluster of requests we gave up on",
                s.clone(),
                Family::default(),
            ),
            server_timeout: register(
                r,
                "observer_server_idle_timeout",
                "Server rows: our idle timeout toward clients, from a cluster of our idle closes",
                s.clone(),
                Family::default(),
            ),
            client_max_reuse: register(
                r,
                "observer_client_max_reuse_idle",
                "Server rows: the longest idle age after which a client reused a connection",
                s,
                Family::default(),
            ),
            mixed_paths: register(
                r,
                "observer_mixed_paths",
                "Distinct idle timeouts measured behind one address (present when more than one)",
                None,
                Family::default(),
            ),
        }
    }

    pub(super) fn clear(&self) {
        self.path_timeout.clear();
        for g in [
            &self.pool_timeout,
            &self.recommended,
            &self.peer_deadline,
            &self.our_timeout,
            &self.server_timeout,
            &self.client_max_reuse,
        ] {
            g.clear();
        }
        self.mismatch.clear();
        self.at_risk.clear();
        self.doomed.clear();
        self.mixed_paths.clear();
        self.info.clear();
    }

    pub(super) fn set(&self, r: &DestinationRow) {
        let row = RowLabels::from(&r.id);
        let bound = |b: &str| BoundLabels { row: row.clone(), bound: b.to_owned() };
        if r.path.lower_evidence > 0 {
            self.path_timeout.get_or_create(&bound("lower")).set(r.path.lower_seconds);
        }
        if let Some(u) = r.path.upper_seconds {
            self.path_timeout.get_or_create(&bound("upper")).set(u);
        }
        if let Some(p) = r.path.idle_timeout_seconds {
            self.path_timeout.get_or_create(&bound("point")).set(p);
        }
        let gauges = [
            (&self.pool_timeout, r.pool.idle_timeout_seconds),
            (&self.recommended, r.judgement.recommended_pool_idle_timeout_seconds),
            (&self.peer_deadline, r.deadlines.peer_request_deadline_seconds),
            (&self.our_timeout, r.deadlines.request_timeout_seconds),
            (&self.server_timeout, r.server.server_idle_timeout_seconds),
            (&self.client_max_reuse, r.server.client_max_reuse_idle_seconds),
        ];
        for (family, value) in gauges {
            if let Some(v) = value {
                family.get_or_create(&row).set(v);
            }
        }
        let count = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
        if r.path.mixed_paths.len() > 1 {
            self.mixed_paths.get_or_create(&row).set(i64::try_from(r.path.mixed_paths.len()).unwrap_or(i64::MAX));
        }
        if r.judgement.verdict != Verdict::Unknown {
            self.mismatch
                .get_or_create(&MismatchLabels { row: row.clone(), failure_mode: r.failure_mode.as_str().to_owned() })
                .set(i64::from(r.judgement.verdict.is_mismatch()));
        }
        if r.path.upper_seconds.is_some() {
            self.at_risk.get_or_create(&row).set(count(r.sockets.at_risk_idle_sockets));
        }
        if r.id.role == crate::kernel::event::Role::Client {
            self.doomed.get_or_create(&row).set(count(r.sockets.doomed_idle_sockets));
        }
        // At most `MAX_NAMES` per row: the label set stays bounded by the rows.
        for n in &r.server_names {
            self.info.get_or_create(&NameLabels { row: row.clone(), server_name: n.name.clone() }).set(1);
        }
    }
}

//! Prometheus metrics (prometheus-client), served at `GET /metrics`.
//!
//! Histograms and counters are fed event by event; the estimate gauges are
//! rebuilt from the destination table at each scrape, so a gauge without
//! evidence is absent rather than zero. Label values come from bounded sets:
//! `destination` is one of at most `--max-destinations` addresses or
//! `other`, the rest are fixed enumerations.

use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Registry, Unit},
};
use std::sync::atomic::AtomicU64;

use crate::{
    diagnosis::aggregate::{DestinationRow, Ingested, Verdict},
    diagnosis::evidence::Observation,
    diagnosis::table::{netns_label, RowId},
    kernel::event::SockEvent,
};

/// Histogram buckets (seconds): the idle timeouts that matter in practice.
pub const BUCKETS: &[f64] = crate::diagnosis::aggregate::IDLE_BUCKETS;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReuseLabels {
    destination: String,
    role: String,
    netns: String,
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    destination: String,
    role: String,
    netns: String,
    how: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DestLabels {
    destination: String,
    role: String,
    netns: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BoundLabels {
    destination: String,
    role: String,
    netns: String,
    bound: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MismatchLabels {
    destination: String,
    role: String,
    netns: String,
    failure_mode: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BuildLabels {
    version: String,
    probe_set: String,
    kernel: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: String,
}

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;
type FGauge = Gauge<f64, AtomicU64>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS.iter().copied())
}

/// Why events were lost (values of the `reason` label).
pub mod reason {
    /// The kernel's ring buffer was full.
    pub const RING_BUFFER_FULL: &str = "ring_buffer_full";
    /// The kernel's socket table was full (a socket went untracked).
    /// The kernel refused socket-local storage (out of memory); was
    /// `socket_table_full` before the state moved off a table.
    pub const SOCKET_STORAGE_FULL: &str = "socket_storage_full";
    /// The evidence store could not keep up: its queue was full.
    pub const STORE_BACKLOG: &str = "store_backlog";
    /// The evidence store refused a batch (a full disk, a removed or
    /// read-only directory) for a minute, or at shutdown: given up.
    pub const STORE_ERROR: &str = "store_error";
    /// `--record` could not write an event (a full disk): not recorded.
    pub const RECORD_ERROR: &str = "record_error";
    /// The kernel's table of dead sockets held was full: a dead socket is
    /// missing from `observer_doomed_idle_sockets`.
    pub const DOOMED_TABLE_FULL: &str = "doomed_table_full";
    pub const ALL: &[&str] =
        &[RING_BUFFER_FULL, SOCKET_STORAGE_FULL, STORE_BACKLOG, STORE_ERROR, RECORD_ERROR, DOOMED_TABLE_FULL];
}

/// All metrics of the daemon.
pub struct Metrics {
    registry: Registry,
    reuse_idle: HistFamily<ReuseLabels>,
    peer_idle_close: HistFamily<PeerLabels>,
    local_idle_close: HistFamily<DestLabels>,
    path_timeout: Family<BoundLabels, FGauge>,
    pool_timeout: Family<DestLabels, FGauge>,
    recommended: Family<DestLabels, FGauge>,
    mismatch: Family<MismatchLabels, Gauge>,
    at_risk: Family<DestLabels, Gauge>,
    doomed: Family<DestLabels, Gauge>,
    discarded_dead: Family<DestLabels, Counter>,
    peer_deadline: Family<DestLabels, FGauge>,
    our_timeout: Family<DestLabels, FGauge>,
    server_timeout: Family<DestLabels, FGauge>,
    client_max_reuse: Family<DestLabels, FGauge>,
    mixed_paths: Family<DestLabels, Gauge>,
    late_reuses: Family<DestLabels, Counter>,
    restarts: Family<DestLabels, Counter>,
    evicted: Counter,
    build_info: Family<BuildLabels, Gauge>,
    undecodable: Counter,
    events: Family<KindLabels, Counter>,
    lost: Family<ReasonLabels, Counter>,
    unresolved: Counter,
    tracked: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    #[must_use]
    #[allow(clippy::too_many_lines, reason = "one registration per metric")]
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let m = Self {
            reuse_idle: Family::new_with_constructor(histogram),
            peer_idle_close: Family::new_with_constructor(histogram),
            local_idle_close: Family::new_with_constructor(histogram),
            path_timeout: Family::default(),
            pool_timeout: Family::default(),
            recommended: Family::default(),
            mismatch: Family::default(),
            at_risk: Family::default(),
            doomed: Family::default(),
            discarded_dead: Family::default(),
            peer_deadline: Family::default(),
            our_timeout: Family::default(),
            server_timeout: Family::default(),
            client_max_reuse: Family::default(),
            mixed_paths: Family::default(),
            late_reuses: Family::default(),
            restarts: Family::default(),
            evicted: Counter::default(),
            build_info: Family::default(),
            undecodable: Counter::default(),
            events: Family::default(),
            lost: Family::default(),
            unresolved: Counter::default(),
            tracked: Gauge::default(),
            registry: Registry::default(),
        };
        registry.register_with_unit(
            "observer_reuse_idle",
            "Idle age of a socket when it was reused, by outcome",
            Unit::Seconds,
            m.reuse_idle.clone(),
        );
        registry.register_with_unit(
            "observer_peer_idle_close",
            "Idle age of a socket when the peer closed it while idle",
            Unit::Seconds,
            m.peer_idle_close.clone(),
        );
        registry.register_with_unit(
            "observer_local_idle_close",
            "Idle age of a socket when a local process closed it while idle",
            Unit::Seconds,
            m.local_idle_close.clone(),
        );
        registry.register_with_unit(
            "observer_path_idle_timeout",
            "Effective path idle timeout: interval bounds and point estimate",
            Unit::Seconds,
            m.path_timeout.clone(),
        );
        registry.register_with_unit(
            "observer_pool_idle_timeout",
            "Idle timeout of the local pool, from its idle closes",
            Unit::Seconds,
            m.pool_timeout.clone(),
        );
        registry.register_with_unit(
            "observer_recommended_pool_idle_timeout",
            "Recommended pool idle timeout: 0.8 x the path idle timeout",
            Unit::Seconds,
            m.recommended.clone(),
        );
        registry.register(
            "observer_mismatch",
            "1 when the pool keeps sockets idle longer than the path allows",
            m.mismatch.clone(),
        );
        registry.register(
            "observer_at_risk_idle_sockets",
            "Sockets idle right now past the path idle timeout (they will fail on first use)",
            m.at_risk.clone(),
        );
        registry.register(
            "observer_doomed_idle_sockets",
            "Client sockets held now that are already dead: the peer closed or reset them, or the kernel timed them out, while idle (exact, from the kernel)",
            m.doomed.clone(),
        );
        registry.register(
            "observer_discarded_dead",
            "Dead sockets the pool closed without writing on them (failures its validation or reader avoided)",
            m.discarded_dead.clone(),
        );
        registry.register_with_unit(
            "observer_peer_request_deadline",
            "The peer's request deadline, from a cluster of requests it aborted",
            Unit::Seconds,
            m.peer_deadline.clone(),
        );
        registry.register_with_unit(
            "observer_request_timeout",
            "Our request timeout, from a cluster of requests we gave up on",
            Unit::Seconds,
            m.our_timeout.clone(),
        );
        registry.register_with_unit(
            "observer_server_idle_timeout",
            "Server rows: our idle timeout toward clients, from a cluster of our idle closes",
            Unit::Seconds,
            m.server_timeout.clone(),
        );
        registry.register_with_unit(
            "observer_client_max_reuse_idle",
            "Server rows: the longest idle age after which a client reused a connection",
            Unit::Seconds,
            m.client_max_reuse.clone(),
        );
        registry.register(
            "observer_mixed_paths",
            "Distinct idle timeouts measured behind one address (present when more than one)",
            m.mixed_paths.clone(),
        );
        registry.register(
            "observer_late_reuses",
            "Server side: clients that wrote on a connection we had closed idle",
            m.late_reuses.clone(),
        );
        registry.register(
            "observer_peer_restarts",
            "Peer restarts: many pooled connections closed at once at spread-out idle ages",
            m.restarts.clone(),
        );
        registry.register(
            "observer_destinations_evicted",
            "Destination rows removed because their evidence left the window",
            m.evicted.clone(),
        );
        registry.register(
            "observer_build_info",
            "1, labelled with the observer version, the probe set in use and the kernel release",
            m.build_info.clone(),
        );
        registry.register(
            "observer_records_undecodable",
            "Ring-buffer records that did not decode as events (a kernel/userspace mismatch; logged)",
            m.undecodable.clone(),
        );
        registry.register("observer_events", "Events received from the kernel, by kind", m.events.clone());
        registry.register("observer_events_lost", "Events or sockets lost, by reason", m.lost.clone());
        registry.register(
            "observer_reuses_unresolved",
            "Reuses that ended without an outcome (a one-way write, or a close before any response or retransmit)",
            m.unresolved.clone(),
        );
        registry.register("observer_tracked_sockets", "Sockets in the kernel's socket table", m.tracked.clone());
        for r in reason::ALL {
            let _ = m.lost.get_or_create(&ReasonLabels { reason: (*r).to_owned() });
        }
        Self { registry, ..m }
    }

    /// Count one event and, for evidence, observe it in its row's series
    /// (`ingested`: what the aggregator made of it, the capped row
    /// included; None for events that are no evidence).
    pub fn observe(&self, ev: &SockEvent, ingested: Option<&Ingested>) {
        self.events.get_or_create(&KindLabels { kind: ev.kind.as_str().to_owned() }).inc();
        let Some(Ingested { id: row, obs }) = ingested else { return };
        let role = row.role.as_str().to_owned();
        let destination = row.destination.clone();
        let netns = netns_label(row.netns);
        match obs.obs {
            // A reuse is evidence only with its outcome.
            Observation::Reuse { .. } => {
                if let Some(o) = ev.outcome {
                    self.reuse_idle
                        .get_or_create(&ReuseLabels { destination, role, netns, outcome: o.as_str().to_owned() })
                        .observe(ev.idle_seconds);
                }
            }
            Observation::PeerIdleClose { .. } | Observation::KeepaliveDeath { .. } => {
                let how = ev.how.map_or("fin", |h| h.as_str()).to_owned();
                self.peer_idle_close
                    .get_or_create(&PeerLabels { destination, role, netns, how })
                    .observe(ev.idle_seconds);
            }
            Observation::LocalIdleClose { .. } => {
                self.local_idle_close.get_or_create(&DestLabels { destination, role, netns }).observe(ev.idle_seconds);
            }
            Observation::LateReuse { .. } => {
                self.late_reuses.get_or_create(&DestLabels { destination, role, netns }).inc();
            }
            Observation::DiscardedDead => {
                self.discarded_dead.get_or_create(&DestLabels { destination, role, netns }).inc();
            }
            Observation::RequestAborted { .. } | Observation::RequestTimeout { .. } => {}
        }
    }

    /// Set `observer_build_info`.
    pub fn set_build_info(&self, version: &str, probe_set: &str, kernel: &str) {
        self.build_info.clear();
        self.build_info
            .get_or_create(&BuildLabels {
                version: version.to_owned(),
                probe_set: probe_set.to_owned(),
                kernel: kernel.to_owned(),
            })
            .set(1);
    }

    /// Count a record that did not decode.
    pub fn undecodable(&self) {
        self.undecodable.inc();
    }

    /// Count a peer restart.
    pub fn restart(&self, r: &crate::diagnosis::aggregate::Restart) {
        self.restarts
            .get_or_create(&DestLabels {
                destination: r.id.destination.clone(),
                role: r.id.role.as_str().to_owned(),
                netns: netns_label(r.id.netns),
            })
            .inc();
    }

    /// Forget the series of destinations whose rows left the table, so
    /// label sets stay bounded by the rows alive (pod churn would grow them
    /// without end otherwise).
    pub fn forget(&self, gone: &[RowId]) {
        self.evicted.inc_by(gone.len() as u64);
        for g in gone {
            let d = DestLabels {
                destination: g.destination.clone(),
                role: g.role.as_str().to_owned(),
                netns: netns_label(g.netns),
            };
            for o in crate::kernel::event::Outcome::ALL {
                self.reuse_idle.remove(&ReuseLabels {
                    destination: d.destination.clone(),
                    role: d.role.clone(),
                    netns: d.netns.clone(),
                    outcome: o.as_str().to_owned(),
                });
            }
            for how in ["fin", "rst", "timeout"] {
                self.peer_idle_close.remove(&PeerLabels {
                    destination: d.destination.clone(),
                    role: d.role.clone(),
                    netns: d.netns.clone(),
                    how: how.to_owned(),
                });
            }
            self.local_idle_close.remove(&d);
            self.late_reuses.remove(&d);
            self.discarded_dead.remove(&d);
            self.restarts.remove(&d);
        }
    }

    /// Add to a loss counter (deltas of the kernel's counters).
    pub fn lost(&self, reason: &str, n: u64) {
        if n > 0 {
            self.lost.get_or_create(&ReasonLabels { reason: reason.to_owned() }).inc_by(n);
        }
    }

    /// Add to the unresolved-reuse counter (deltas of the kernel's counter).
    pub fn reuses_unresolved(&self, n: u64) {
        self.unresolved.inc_by(n);
    }

    pub fn set_tracked_sockets(&self, n: usize) {
        self.tracked.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Rebuild the estimate gauges from the destination table.
    pub fn set_estimates(&self, rows: &[DestinationRow]) {
        self.path_timeout.clear();
        self.pool_timeout.clear();
        self.recommended.clear();
        self.mismatch.clear();
        self.at_risk.clear();
        self.doomed.clear();
        self.peer_deadline.clear();
        self.our_timeout.clear();
        self.server_timeout.clear();
        self.client_max_reuse.clear();
        self.mixed_paths.clear();
        for r in rows {
            let d = || DestLabels {
                destination: r.id.destination.clone(),
                role: r.id.role.as_str().to_owned(),
                netns: netns_label(r.id.netns),
            };
            let bound = |b: &str| BoundLabels {
                destination: r.id.destination.clone(),
                role: r.id.role.as_str().to_owned(),
                netns: netns_label(r.id.netns),
                bound: b.to_owned(),
            };
            let has_lower = r.path_lower_evidence > 0;
            if has_lower {
                self.path_timeout.get_or_create(&bound("lower")).set(r.path_idle_timeout_lower_seconds);
            }
            if let Some(u) = r.path_idle_timeout_upper_seconds {
                self.path_timeout.get_or_create(&bound("upper")).set(u);
            }
            if let Some(p) = r.path_idle_timeout_seconds {
                self.path_timeout.get_or_create(&bound("point")).set(p);
            }
            if let Some(p) = r.pool_idle_timeout_seconds {
                self.pool_timeout.get_or_create(&d()).set(p);
            }
            if let Some(p) = r.recommended_pool_idle_timeout_seconds {
                self.recommended.get_or_create(&d()).set(p);
            }
            let gauges = [
                (&self.peer_deadline, r.peer_request_deadline_seconds),
                (&self.our_timeout, r.request_timeout_seconds),
                (&self.server_timeout, r.server_idle_timeout_seconds),
                (&self.client_max_reuse, r.client_max_reuse_idle_seconds),
            ];
            for (family, value) in gauges {
                if let Some(v) = value {
                    family.get_or_create(&d()).set(v);
                }
            }
            if r.mixed_paths.len() > 1 {
                self.mixed_paths.get_or_create(&d()).set(i64::try_from(r.mixed_paths.len()).unwrap_or(i64::MAX));
            }
            if r.verdict != Verdict::Unknown {
                self.mismatch
                    .get_or_create(&MismatchLabels {
                        destination: r.id.destination.clone(),
                        role: r.id.role.as_str().to_owned(),
                        netns: netns_label(r.id.netns),
                        failure_mode: r.failure_mode.as_str().to_owned(),
                    })
                    .set(i64::from(r.verdict.is_mismatch()));
            }
            if r.path_idle_timeout_upper_seconds.is_some() {
                self.at_risk.get_or_create(&d()).set(i64::try_from(r.at_risk_idle_sockets).unwrap_or(i64::MAX));
            }
            if r.id.role == crate::kernel::event::Role::Client {
                self.doomed.get_or_create(&d()).set(i64::try_from(r.doomed_idle_sockets).unwrap_or(i64::MAX));
            }
        }
    }

    /// The exposition in the Prometheus text format (0.0.4), which every
    /// Prometheus and `promtool check metrics` read. prometheus-client
    /// writes `OpenMetrics`, whose counter families are named without
    /// `_total`; here HELP and TYPE name the samples (`..._total`), and the
    /// `OpenMetrics`-only lines (`# UNIT`, `# EOF`) are left out.
    #[must_use]
    pub fn encode(&self) -> String {
        let mut open = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut open, &self.registry);
        let counters: std::collections::HashSet<&str> =
            open.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
        let mut out = String::with_capacity(open.len());
        for line in open.lines() {
            if line.starts_with("# UNIT ") || line == "# EOF" {
                continue;
            }
            let meta = ["# HELP ", "# TYPE "].iter().find_map(|p| line.strip_prefix(p).map(|rest| (*p, rest)));
            let renamed = meta.and_then(|(p, rest)| {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                counters.contains(name).then(|| format!("{p}{name}_total {tail}"))
            });
            let line = renamed.as_deref().unwrap_or(line);
            // The host's namespace has an empty `netns`, which Prometheus
            // reads as no label: written so, the host's series look as
            // they always did.
            if line.contains(EMPTY_NETNS) {
                out.push_str(&line.replace(EMPTY_NETNS, ""));
            } else {
                out.push_str(line);
            }
            out.push('\n');
        }
        out
    }
}

/// The `netns` label of the host's namespace as prometheus-client writes it.
const EMPTY_NETNS: &str = ",netns=\"\"";

/// Content type of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

#[cfg(test)]
mod tests;

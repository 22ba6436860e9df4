//! Prometheus metrics (prometheus-client), served at `GET /metrics`.
//!
//! Counters (and, with `--metrics-histograms`, the idle-age histograms)
//! are fed event by event; the estimate gauges are
//! rebuilt from the destination table at each scrape, so a gauge without
//! evidence is absent rather than zero. Label values come from bounded sets:
//! `destination` is one of at most `--max-destinations` addresses or
//! `other`, the rest are fixed enumerations.
//!
//! Three family sets, each declared and registered in one place
//! ([`EvidenceFamilies`], [`estimates::EstimateFamilies`], [`DaemonFamilies`], in the
//! linkerd2-proxy style), and every per-row label set flattens one
//! [`RowLabels`] made from the row's [`RowId`].

use std::fmt::Write as _;

use prometheus_client::{
    encoding::{text::encode, EncodeLabelSet},
    metrics::MetricType,
    metrics::{counter::Counter, family::Family, gauge::Gauge, histogram::Histogram},
    registry::{Metric, Registry, Unit},
};
use std::sync::atomic::AtomicU64;

use crate::{
    diagnosis::aggregate::{Aggregator, Config, DestinationRow, Fed, Ingested},
    diagnosis::evidence::{Observation, ResetBy},
    diagnosis::key::RowId,
    kernel::event::{ResetFrom, SockEvent},
};

/// Histogram buckets (seconds): the idle timeouts that matter in practice.
pub const BUCKETS: &[f64] = crate::diagnosis::aggregate::IDLE_BUCKETS;

/// A row's identity as labels, from its one [`RowId`]: every per-row
/// label set flattens it first, so `destination`, `role` and `netns` are
/// spelled once.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RowLabels {
    destination: String,
    role: String,
    netns: String,
}

impl From<&RowId> for RowLabels {
    fn from(id: &RowId) -> Self {
        Self { destination: id.destination.clone(), role: id.role.as_str().to_owned(), netns: id.netns.label() }
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReuseLabels {
    #[prometheus(flatten)]
    row: RowLabels,
    outcome: String,
    /// Who sent the reset ([`reset_from_labels`]); empty (no label, as
    /// Prometheus reads it) where no reset ended it.
    reset_from: &'static str,
}

/// The values of the `reset_from` label: none, then [`ResetBy::label`]'s.
fn reset_from_labels() -> impl Iterator<Item = &'static str> {
    std::iter::once("").chain(ResetFrom::ALL.iter().map(|f| f.as_str())).chain(std::iter::once("unknown"))
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PeerLabels {
    #[prometheus(flatten)]
    row: RowLabels,
    how: String,
    reset_from: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BoundLabels {
    #[prometheus(flatten)]
    row: RowLabels,
    bound: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct NameLabels {
    #[prometheus(flatten)]
    row: RowLabels,
    server_name: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MismatchLabels {
    #[prometheus(flatten)]
    row: RowLabels,
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

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct SignalLabels {
    signal: String,
}

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;
type FGauge = Gauge<f64, AtomicU64>;
type RowGauge = Family<RowLabels, FGauge>;

fn histogram() -> Histogram {
    Histogram::new(BUCKETS.iter().copied())
}

fn hist_family<L: Clone + std::hash::Hash + Eq>() -> HistFamily<L> {
    Family::new_with_constructor(histogram)
}

/// Register `metric` (a handle: families and counters share their state
/// with their clones) and hand it back.
/// The registry, and the HELP and TYPE lines of every family registered
/// (prometheus-client writes none for a family without series yet).
pub(super) struct Registrar {
    registry: Registry,
    declared: String,
}

fn register<M: Metric + Clone>(r: &mut Registrar, name: &str, help: &str, unit: Option<Unit>, metric: M) -> M {
    let sample = unit.as_ref().map_or_else(|| name.to_owned(), |u| format!("{name}_{}", u.as_str()));
    let (sample, kind) = match metric.metric_type() {
        MetricType::Counter => (format!("{sample}_total"), "counter"),
        MetricType::Gauge => (sample, "gauge"),
        MetricType::Histogram => (sample, "histogram"),
        _ => (sample, "unknown"),
    };
    let _ = writeln!(r.declared, "# HELP {sample} {help}.\n# TYPE {sample} {kind}");
    match unit {
        Some(u) => r.registry.register_with_unit(name, help, u, metric.clone()),
        None => r.registry.register(name, help, metric.clone()),
    }
    metric
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
    /// The kernel's table of listening ports was full: a socket older
    /// than observer on a port not in it took its role from the ports.
    pub const LISTENERS_TABLE_FULL: &str = "listeners_table_full";
    /// The kernel's table of walked network namespaces was full: sockets
    /// older than observer there took their role from the ports.
    pub const NETNS_TABLE_FULL: &str = "netns_table_full";
    /// The kernel's LRU table of a server's idle closes evicted one: a
    /// client writing on that connection late would not be seen.
    pub const CLOSED_IDLE_EVICTED: &str = "closed_idle_evicted";
    /// A probe's run the kernel skipped (`recursion_misses`: the program
    /// was already running on that CPU): whatever it would have seen.
    pub const PROGRAM_RUN_SKIPPED: &str = "program_run_skipped";
    /// `--events` could not write a line (an error other than the reader
    /// closing the pipe, which ends the printing).
    pub const EVENTS_OUTPUT_ERROR: &str = "events_output_error";
    /// `--events`' reader was too slow: its queue of lines was full, and
    /// the line was dropped (the loop never waits on it).
    pub const EVENTS_OUTPUT_BACKLOG: &str = "events_output_backlog";
    /// A client socket reset or timed out while idle, before the
    /// failed-write hook was attached, whose error a syscall took before
    /// the hook came: a failed reuse or the pool discarding it, unknown
    /// which, so neither is counted.
    pub const FAILED_WRITE_UNSEEN: &str = "failed_write_unseen";
    /// Under `--cgroup`, an event whose cgroup was still being looked for
    /// when its wait ended (30 s, or 16,384 events held): it cannot be
    /// shown to belong, so it is left out.
    pub const OWNER_UNRESOLVED: &str = "owner_unresolved";
    /// `--otlp-logs`: a failed reuse's log record found the queue to the
    /// collector full (the collector down or slow), and was dropped.
    pub const OTLP_LOGS_BACKLOG: &str = "otlp_logs_backlog";
    /// `--otlp-logs`: a log record in a batch the collector did not take
    /// (after the exporter's retries).
    pub const OTLP_LOGS_UNSENT: &str = "otlp_logs_unsent";
    pub const ALL: &[&str] = &[
        RING_BUFFER_FULL,
        SOCKET_STORAGE_FULL,
        STORE_BACKLOG,
        STORE_ERROR,
        RECORD_ERROR,
        DOOMED_TABLE_FULL,
        LISTENERS_TABLE_FULL,
        NETNS_TABLE_FULL,
        CLOSED_IDLE_EVICTED,
        PROGRAM_RUN_SKIPPED,
        EVENTS_OUTPUT_ERROR,
        EVENTS_OUTPUT_BACKLOG,
        FAILED_WRITE_UNSEEN,
        OWNER_UNRESOLVED,
        OTLP_LOGS_BACKLOG,
        OTLP_LOGS_UNSENT,
    ];
}

/// Series fed event by event, per row: the evidence counters, and the
/// idle-age histograms when asked for (`--metrics-histograms`): they cost
/// 23 series each per label set, and only a drill into one destination
/// needs them (the daemon's API and the report serve that too).
struct EvidenceFamilies {
    reuses: Family<ReuseLabels, Counter>,
    peer_idle_closes: Family<PeerLabels, Counter>,
    histograms: Option<HistogramFamilies>,
    late_reuses: Family<RowLabels, Counter>,
    discarded_dead: Family<RowLabels, Counter>,
    restarts: Family<RowLabels, Counter>,
}

/// The idle-age histograms (opt-in).
struct HistogramFamilies {
    reuse_idle: HistFamily<ReuseLabels>,
    peer_idle_close: HistFamily<PeerLabels>,
    local_idle_close: HistFamily<RowLabels>,
}

impl HistogramFamilies {
    fn register(r: &mut Registrar) -> Self {
        Self {
            reuse_idle: register(
                r,
                "observer_reuse_idle",
                "Idle age of a socket when it was reused, by outcome",
                Some(Unit::Seconds),
                hist_family(),
            ),
            peer_idle_close: register(
                r,
                "observer_peer_idle_close",
                "Idle age of a socket when the peer closed it while idle",
                Some(Unit::Seconds),
                hist_family(),
            ),
            local_idle_close: register(
                r,
                "observer_local_idle_close",
                "Idle age of a socket when a local process closed it while idle",
                Some(Unit::Seconds),
                hist_family(),
            ),
        }
    }
}

impl EvidenceFamilies {
    fn register(r: &mut Registrar, histograms: bool) -> Self {
        Self {
            reuses: register(
                r,
                "observer_reuses",
                "Reuses of an idle socket, by outcome (every value but ok is a failed reuse)",
                None,
                Family::default(),
            ),
            peer_idle_closes: register(
                r,
                "observer_peer_idle_closes",
                "Idle sockets the peer closed (fin, rst) or the kernel's keep-alive ended (timeout)",
                None,
                Family::default(),
            ),
            histograms: histograms.then(|| HistogramFamilies::register(r)),
            discarded_dead: register(
                r,
                "observer_discarded_dead",
                "Dead sockets the pool closed without writing on them (failures its validation or reader avoided)",
                None,
                Family::default(),
            ),
            late_reuses: register(
                r,
                "observer_late_reuses",
                "Server side: clients that wrote on a connection we had closed idle",
                None,
                Family::default(),
            ),
            restarts: register(
                r,
                "observer_peer_restarts",
                "Peer restarts: many pooled connections closed at once at spread-out idle ages",
                None,
                Family::default(),
            ),
        }
    }

    /// Drop every series of row `id`.
    fn forget(&self, id: &RowId) {
        let row = RowLabels::from(id);
        for reset_from in reset_from_labels() {
            for o in crate::kernel::event::Outcome::ALL {
                let labels = ReuseLabels { row: row.clone(), outcome: o.as_str().to_owned(), reset_from };
                self.reuses.remove(&labels);
                if let Some(h) = &self.histograms {
                    h.reuse_idle.remove(&labels);
                }
            }
            for how in crate::kernel::event::How::ALL {
                let labels = PeerLabels { row: row.clone(), how: how.as_str().to_owned(), reset_from };
                self.peer_idle_closes.remove(&labels);
                if let Some(h) = &self.histograms {
                    h.peer_idle_close.remove(&labels);
                }
            }
        }
        if let Some(h) = &self.histograms {
            h.local_idle_close.remove(&row);
        }
        self.late_reuses.remove(&row);
        self.discarded_dead.remove(&row);
        self.restarts.remove(&row);
    }
}

/// All metrics of the daemon: three family sets, each registered where it
/// is declared, in exposition order.
pub struct Metrics {
    registry: Registry,
    declared: String,
    evidence: EvidenceFamilies,
    estimates: estimates::EstimateFamilies,
    daemon: daemon::DaemonFamilies,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new(false)
    }
}

impl Metrics {
    /// The lean set (about a dozen series per destination and role), and
    /// with `histograms` the idle-age histograms too (`--metrics-histograms`).
    #[must_use]
    pub fn new(histograms: bool) -> Self {
        let mut r = Registrar { registry: Registry::default(), declared: String::new() };
        let evidence = EvidenceFamilies::register(&mut r, histograms);
        let estimates = estimates::EstimateFamilies::register(&mut r);
        let daemon = daemon::DaemonFamilies::register(&mut r);
        Self { registry: r.registry, declared: r.declared, evidence, estimates, daemon }
    }

    /// Count one event and, for evidence, observe it in its row's series
    /// (`ingested`: what the aggregator made of it, the capped row
    /// included; None for events that are no evidence).
    pub fn observe(&self, ev: &SockEvent, ingested: Option<&Ingested>) {
        self.daemon.events.get_or_create(&KindLabels { kind: ev.kind().as_str().to_owned() }).inc();
        let Some(Ingested { id, observed }) = ingested else { return };
        let row = RowLabels::from(id);
        let e = &self.evidence;
        let h = e.histograms.as_ref();
        let reset_from = observed.reset.map_or("", ResetBy::label);
        match observed.what {
            // A reuse is evidence only with its outcome.
            Observation::Reuse { .. } => {
                if let Some(o) = ev.outcome() {
                    let labels = ReuseLabels { row, outcome: o.as_str().to_owned(), reset_from };
                    if let Some(h) = h {
                        h.reuse_idle.get_or_create(&labels).observe(ev.idle_seconds);
                    }
                    e.reuses.get_or_create(&labels).inc();
                }
            }
            Observation::PeerIdleClose { .. } | Observation::KeepaliveDeath { .. } => {
                let how = ev.how().map_or("fin", |h| h.as_str()).to_owned();
                let labels = PeerLabels { row, how, reset_from };
                if let Some(h) = h {
                    h.peer_idle_close.get_or_create(&labels).observe(ev.idle_seconds);
                }
                e.peer_idle_closes.get_or_create(&labels).inc();
            }
            Observation::LocalIdleClose { .. } => {
                if let Some(h) = h {
                    h.local_idle_close.get_or_create(&row).observe(ev.idle_seconds);
                }
            }
            Observation::LateReuse { .. } => {
                e.late_reuses.get_or_create(&row).inc();
            }
            Observation::DiscardedDead => {
                e.discarded_dead.get_or_create(&row).inc();
            }
            Observation::RequestAborted { .. } | Observation::RequestTimeout { .. } => {}
        }
    }

    /// Everything one fed event changes in the series: its counts, the
    /// restarts it let the table judge, and the series of rows gone.
    pub fn fed(&self, ev: &SockEvent, fed: &Fed) {
        self.observe(ev, fed.ingested.as_ref());
        for r in &fed.restarts {
            self.restart(r);
        }
        self.forget(&fed.gone);
    }

    /// Set `observer_build_info`.
    pub fn set_build_info(&self, version: &str, probe_set: &str, kernel: &str) {
        let f = &self.daemon.build_info;
        f.clear();
        f.get_or_create(&BuildLabels {
            version: version.to_owned(),
            probe_set: probe_set.to_owned(),
            kernel: kernel.to_owned(),
        })
        .set(1);
    }

    /// Count an event of `observer probe`'s own connections.
    pub fn probe_event(&self) {
        self.daemon.probe_events.inc();
    }

    /// Count `observer probe` results taken from the store.
    pub fn probe_results(&self, n: u64) {
        self.daemon.probe_results.inc_by(n);
    }

    /// Count a record that did not decode.
    pub fn undecodable(&self) {
        self.daemon.undecodable.inc();
    }

    /// Count a peer restart.
    pub fn restart(&self, r: &crate::diagnosis::aggregate::Restart) {
        self.evidence.restarts.get_or_create(&RowLabels::from(&r.id)).inc();
    }

    /// Forget the series of destinations whose rows left the table, so
    /// label sets stay bounded by the rows alive (pod churn would grow them
    /// without end otherwise).
    pub fn forget(&self, gone: &[RowId]) {
        self.daemon.evicted.inc_by(gone.len() as u64);
        for g in gone {
            self.evidence.forget(g);
        }
    }

    /// Add to a loss counter (deltas of the kernel's counters).
    pub fn lost(&self, reason: &str, n: u64) {
        if n > 0 {
            self.daemon.lost.get_or_create(&ReasonLabels { reason: reason.to_owned() }).inc_by(n);
        }
    }

    /// Add to the unresolved-reuse counter (deltas of the kernel's counter).
    pub fn reuses_unresolved(&self, n: u64) {
        self.daemon.unresolved.inc_by(n);
    }

    /// Set `observer_failed_write_hook_attached`, and bring the attach
    /// counter up to the loader's count.
    pub fn set_failed_write_hook(&self, on: bool, attach_count: u64) {
        self.daemon.failed_write_hook.set(i64::from(on));
        let counted = self.daemon.failed_write_attaches.get();
        self.daemon.failed_write_attaches.inc_by(attach_count.saturating_sub(counted));
    }

    /// Count connection counts or estimate changes the store lost.
    pub fn store_records_lost(&self, reason: &str, n: u64) {
        if n > 0 {
            self.daemon.store_records_lost.get_or_create(&ReasonLabels { reason: reason.to_owned() }).inc_by(n);
        }
    }

    /// Add failed OTLP exports of one signal (`metrics`, `logs`).
    pub fn otlp_failures(&self, signal: &str, n: u64) {
        if n > 0 {
            self.daemon.otlp_failures.get_or_create(&SignalLabels { signal: signal.to_owned() }).inc_by(n);
        }
    }

    /// Set `observer_events_awaiting_owner`.
    pub fn set_owner_wait(&self, held: usize) {
        self.daemon.owner_wait.set(i64::try_from(held).unwrap_or(i64::MAX));
    }

    /// Set `observer_tracked_sockets`.
    pub fn set_tracked_sockets(&self, n: usize) {
        self.daemon.tracked.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// Rebuild the estimate gauges from the destination table.
    pub fn set_estimates(&self, rows: &[DestinationRow]) {
        self.estimates.clear();
        for r in rows {
            self.estimates.set(r);
        }
    }

    /// The HELP and TYPE lines of every family, as [`Metrics::encode`]
    /// names them, whether it has series yet or not.
    #[must_use]
    pub fn declared(&self) -> &str {
        &self.declared
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
            // The host's namespace has an empty `netns`, and evidence no
            // reset ended an empty `reset_from`, which Prometheus reads as
            // no label: written so, those series look as they always did.
            if EMPTY_LABELS.iter().any(|l| line.contains(l)) {
                out.push_str(&EMPTY_LABELS.iter().fold(line.to_owned(), |l, e| l.replace(e, "")));
            } else {
                out.push_str(line);
            }
            out.push('\n');
        }
        out
    }
}

/// The exposition a daemon would serve at the end of a recording: every
/// event fed as the daemon's pipeline feeds it (counters, restarts, rows
/// evicted past the window), then the gauges of the finished table, as
/// `observer analyze` computes it. Fleet simulations serve these.
#[must_use]
pub fn exposition_of(events: &[SockEvent], config: Config, histograms: bool) -> String {
    let metrics = Metrics::new(histograms);
    let mut agg = Aggregator::new(config);
    agg.feed_to_end(events, |ev, fed| metrics.fed(ev, &fed));
    for r in agg.take_restarts() {
        metrics.restart(&r);
    }
    metrics.set_estimates(&agg.rows(agg.latest_ns()));
    metrics.encode()
}

/// Empty labels as prometheus-client writes them: the host's namespace's
/// `netns`, and `reset_from` where no reset ended the evidence.
const EMPTY_LABELS: &[&str] = &[",netns=\"\"", ",reset_from=\"\""];

/// Content type of [`Metrics::encode`].
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

mod daemon;
mod estimates;
#[cfg(test)]
mod tests;

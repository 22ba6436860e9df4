//! The daemon's own series: what it received and lost, what it runs on,
//! and what `observer probe` beside it did.

use prometheus_client::metrics::{counter::Counter, family::Family, gauge::Gauge};

use super::{reason, register, BuildLabels, KindLabels, ReasonLabels, Registrar, SignalLabels};

/// The daemon's own series: what it received, lost and runs on.
pub(super) struct DaemonFamilies {
    pub(super) evicted: Counter,
    pub(super) build_info: Family<BuildLabels, Gauge>,
    pub(super) undecodable: Counter,
    pub(super) events: Family<KindLabels, Counter>,
    pub(super) lost: Family<ReasonLabels, Counter>,
    pub(super) unresolved: Counter,
    pub(super) tracked: Gauge,
    pub(super) failed_write_hook: Gauge,
    pub(super) failed_write_attaches: Counter,
    pub(super) owner_wait: Gauge,
    pub(super) store_records_lost: Family<ReasonLabels, Counter>,
    pub(super) probe_events: Counter,
    pub(super) probe_results: Counter,
    pub(super) otlp_failures: Family<SignalLabels, Counter>,
}

impl DaemonFamilies {
    pub(super) fn register(r: &mut Registrar) -> Self {
        let f = Self {
            evicted: register(
                r,
                "observer_destinations_evicted",
                "Destination rows removed because their evidence left the window",
                None,
                Counter::default(),
            ),
            build_info: register(
                r,
                "observer_build_info",
                "1, labelled with the observer version, the probe set in use and the kernel release",
                None,
                Family::default(),
            ),
            undecodable: register(
                r,
                "observer_records_undecodable",
                "Ring-buffer records that did not decode as events (a kernel/userspace mismatch; logged)",
                None,
                Counter::default(),
            ),
            events: register(r, "observer_events", "Events received from the kernel, by kind", None, Family::default()),
            lost: register(r, "observer_events_lost", "Events or sockets lost, by reason", None, Family::default()),
            unresolved: register(
                r,
                "observer_reuses_unresolved",
                "Reuses that ended without an outcome (a one-way write, or a close before any response or retransmit)",
                None,
                Counter::default(),
            ),
            tracked: register(
                r,
                "observer_tracked_sockets",
                "Sockets in the kernel's socket table",
                None,
                Gauge::default(),
            ),
            failed_write_hook: register(
                r,
                "observer_failed_write_hook_attached",
                "1 while the failed-write hook (sock_send_length, tp_btf probe set) is attached: only while a client socket reset or timed out idle waits for its application",
                None,
                Gauge::default(),
            ),
            failed_write_attaches: register(
                r,
                "observer_failed_write_hook_attaches",
                "Times the failed-write hook was attached",
                None,
                Counter::default(),
            ),
            store_records_lost: register(
                r,
                "observer_store_records_lost",
                "Per-minute connection counts and estimate changes the store could not keep, by reason (store_error, store_backlog; events lost are in observer_events_lost_total)",
                None,
                Family::default(),
            ),
            probe_events: register(
                r,
                "observer_probe_connection_events",
                "Events of observer probe's own connections (connected by a process running the daemon's executable), left out of every row",
                None,
                Counter::default(),
            ),
            probe_results: register(
                r,
                "observer_probe_results",
                "observer probe results read from the evidence store into their rows",
                None,
                Counter::default(),
            ),
            owner_wait: register(
                r,
                "observer_events_awaiting_owner",
                "Under --cgroup, events held until the cgroup of their process is resolved (each waits at most 30 s; 16,384 at most)",
                None,
                Gauge::default(),
            ),
            otlp_failures: register(
                r,
                "observer_otlp_export_failures",
                "OTLP exports the collector did not take after the exporter's retries, by signal (metrics, logs); 0 without an OTLP endpoint",
                None,
                Family::default(),
            ),
        };
        for signal in ["metrics", "logs"] {
            let _ = f.otlp_failures.get_or_create(&SignalLabels { signal: signal.to_owned() });
        }
        // Every loss reason is exported from the start, at 0.
        for reason in reason::ALL {
            let _ = f.lost.get_or_create(&ReasonLabels { reason: (*reason).to_owned() });
        }
        for reason in [reason::STORE_ERROR, reason::STORE_BACKLOG] {
            let _ = f.store_records_lost.get_or_create(&ReasonLabels { reason: reason.to_owned() });
        }
        f
    }
}

//! The event pipeline, three stages in order: [`Enrich`] (owner, runtime,
//! filter, the probe's own sockets left out), the diagnosis (the one feed
//! call, [`diagnose`]), and [`Outputs`] (the store, `--record`,
//! `--events`); beside them the socket table refreshed into the at-risk and
//! doomed views, and the kernel's loss counters reported.

use std::sync::{atomic::Ordering, Arc, PoisonError};

use log::{error, warn};

use super::{api::DaemonState, enrich::Enrich, outputs::Outputs, probe_feed::ProbeFeed};
use crate::{
    diagnosis::aggregate::Fed,
    diagnosis::table::ProcessOwner,
    kernel::bpf::{KernelCounters, Probes},
    kernel::event::{clock_ns, SockEvent},
    surfaces::metrics::{self, Metrics},
};

/// The stages, and what they share.
pub(crate) struct Pipeline {
    pub(crate) enrich: Enrich,
    pub(crate) outputs: Outputs,
    pub(crate) shared: Arc<DaemonState>,
    /// `observer probe`'s results, read from the store.
    pub(crate) probe_feed: ProbeFeed,
    /// The last drain stopped at its cap with records left in the ring.
    pub(crate) more: bool,
    pub(crate) decode_errors: u64,
}

impl Pipeline {
    /// Take one event from the ring through the stages.
    pub(crate) fn handle(&mut self, ev: SockEvent) {
        self.shared.health.events.fetch_add(1, Ordering::Relaxed);
        let Self { enrich, outputs, shared, .. } = self;
        enrich.take(ev, shared, &mut |ev| onward(outputs, shared, &ev));
    }

    /// Hand on the events that waited for their owner and have it now
    /// (`all`: every one, as at shutdown).
    pub(crate) fn release(&mut self, all: bool) {
        let Self { enrich, outputs, shared, .. } = self;
        enrich.release(all, shared, &mut |ev| onward(outputs, shared, &ev));
    }

    /// Take `observer probe`'s new results from the store into the table.
    pub(crate) fn poll_probes(&mut self) {
        let now = clock_ns(libc::CLOCK_REALTIME);
        self.probe_feed.poll(&self.shared, &self.enrich.filter, now);
        self.enrich.probe_sockets.refresh(now);
    }

    /// Whether the run ends (standard output closed under `--events`).
    pub(crate) const fn stop(&self) -> bool {
        self.outputs.stop
    }
}

/// An enriched event on through the last two stages: recorded as it is
/// fed (a replay of the recording feeds the same), diagnosed, and written.
fn onward(outputs: &mut Outputs, shared: &DaemonState, ev: &SockEvent) {
    outputs.record(ev);
    let fed = diagnose(shared, ev);
    outputs.write(ev, &fed, &shared.metrics);
}

/// The diagnosis: the one feed call, its figures counted, and what it
/// judged (peer restarts, changes of a path's timeout) logged.
fn diagnose(shared: &DaemonState, ev: &SockEvent) -> Fed {
    let fed = shared.aggregator.lock().unwrap_or_else(PoisonError::into_inner).feed(ev);
    shared.metrics.fed(ev, &fed);
    for r in &fed.restarts {
        warn!(
            "peer restart at {} ({}): {} connections closed at once, idle {:.3} to {:.3} s; not timeout evidence",
            r.id.destination,
            r.id.role.as_str(),
            r.sockets,
            r.min_idle_seconds,
            r.max_idle_seconds
        );
    }
    for c in &fed.changes {
        warn!(
            "path idle timeout of {} ({}) changed: was [{:?}, {:?}] s, now [{:?}, {:?}] s",
            c.id.destination,
            c.id.role.as_str(),
            c.before_lower_seconds,
            c.before_upper_seconds,
            c.after_lower_seconds,
            c.after_upper_seconds
        );
    }
    fed
}

/// Refresh the at-risk view and the tracked-socket gauge from the kernel.
/// Only client sockets idler than the smallest at-risk threshold are kept
/// (none while no destination has one), so a host with 100k sockets does
/// not copy its table at every refresh. A threshold that drops while the
/// table is read counts its sockets from the next refresh.
pub(crate) fn refresh_sockets(probes: &mut Probes, pipeline: &mut Pipeline) {
    let shared = Arc::clone(&pipeline.shared);
    let enrich = &pipeline.enrich;
    let floor = {
        let mut agg = shared.aggregator.lock().unwrap_or_else(PoisonError::into_inner);
        // Held peer closes become evidence (or a restart) and old
        // evidence expires even when no event arrives.
        agg.tick(clock_ns(libc::CLOCK_REALTIME));
        agg.at_risk_floor()
    };
    let now = clock_ns(libc::CLOCK_BOOTTIME);
    let mut views = Vec::new();
    let counted = probes.for_each_socket(|rec| {
        let Some(floor) = floor else { return };
        let Some(v) = crate::kernel::event::view_of(rec, now) else { return };
        // `--netns`/`--cgroup` keep the at-risk view to their sockets too.
        if v.role == crate::kernel::event::Role::Client
            && v.idle_seconds > floor
            && !enrich.probe_sockets.contains(v.id)
            && (enrich.filter.is_empty() || {
                let owner = enrich.owners.known(v.cgroup_id, 0);
                enrich.filter.keeps(v.netns, owner.as_deref().map(|o| o.cgroup.as_str()))
            })
        {
            views.push(v);
        }
    });
    match counted {
        Ok(n) => {
            shared.metrics.set_tracked_sockets(n);
            shared.aggregator.lock().unwrap_or_else(PoisonError::into_inner).set_sockets(&views);
        }
        Err(e) => warn!("reading the socket table: {e}"),
    }
    let mut doomed = Vec::new();
    let walked = probes.for_each_doomed(|rec| {
        let Some(d) = crate::kernel::event::doomed_of(rec, now) else { return };
        if enrich.probe_sockets.contains(d.sock_id) {
            return;
        }
        let owner = enrich.owners.known(d.cgroup_id, d.pid);
        if !enrich.filter.is_empty() && !enrich.filter.keeps(d.netns, owner.as_deref().map(|o| o.cgroup.as_str())) {
            return;
        }
        let who = ProcessOwner {
            process: match enrich.runtimes.known_name(d.pid) {
                Some(name) => name,
                None if d.comm.is_empty() => "?".to_owned(),
                None => d.comm.clone(),
            },
            owner: owner.as_deref().cloned(),
        };
        doomed.push((d, who));
    });
    match walked {
        Ok(_) => shared.aggregator.lock().unwrap_or_else(PoisonError::into_inner).set_doomed(&doomed),
        Err(e) => warn!("reading the dead sockets: {e}"),
    }
}

/// Records read per drain at most: past it the loop turns to its signals
/// and ticks before it reads on (`Pipeline::more`).
pub(crate) const DRAIN_CAP: usize = 65_536;

pub(crate) fn drain(probes: &mut Probes, pipeline: &mut Pipeline) {
    pipeline.shared.health.heartbeat_ns.store(clock_ns(libc::CLOCK_BOOTTIME), Ordering::Relaxed);
    let read = probes.drain(DRAIN_CAP, |ev| match ev {
        Ok(ev) => pipeline.handle(ev),
        Err(e) => {
            pipeline.decode_errors += 1;
            pipeline.shared.metrics.undecodable();
            error!("undecodable event ({} so far): {e}", pipeline.decode_errors);
        }
    });
    pipeline.more = read == DRAIN_CAP;
    pipeline.outputs.after_drain(&pipeline.shared.metrics);
}

pub(crate) fn report_losses(probes: &Probes, reported: &mut KernelCounters, metrics: &Metrics) {
    match probes.counters() {
        Ok(now) => {
            use metrics::reason;
            for (why, at, before) in [
                (reason::RING_BUFFER_FULL, now.ringbuf_full, reported.ringbuf_full),
                (reason::SOCKET_STORAGE_FULL, now.map_full, reported.map_full),
                (reason::DOOMED_TABLE_FULL, now.doomed_full, reported.doomed_full),
                (reason::LISTENERS_TABLE_FULL, now.listeners_full, reported.listeners_full),
                (reason::NETNS_TABLE_FULL, now.walked_netns_full, reported.walked_netns_full),
                (reason::CLOSED_IDLE_EVICTED, now.closed_idle_evicted, reported.closed_idle_evicted),
                (reason::PROGRAM_RUN_SKIPPED, now.recursion_misses, reported.recursion_misses),
                (reason::FAILED_WRITE_UNSEEN, now.failed_write_unseen, reported.failed_write_unseen),
            ] {
                metrics.lost(why, at.saturating_sub(before));
            }
            if now.recursion_misses > reported.recursion_misses {
                warn!(
                    "the kernel skipped {} runs of observer's programs (already running on that CPU; {} in total): what they would have seen is lost",
                    now.recursion_misses - reported.recursion_misses,
                    now.recursion_misses
                );
            }
            metrics.reuses_unresolved(now.reuse_unresolved.saturating_sub(reported.reuse_unresolved));
            if now.doomed_full > reported.doomed_full {
                warn!(
                    "{} dead sockets could not be counted in doomed_idle_sockets: the kernel's table of them (65,536) was full",
                    now.doomed_full - reported.doomed_full
                );
            }
            if now.listeners_full > reported.listeners_full && reported.listeners_full == 0 {
                warn!(
                    "the kernel's table of listening ports (16,384) is full: sockets older than observer on ports not in it take their role from the ports"
                );
            }
            if now.ringbuf_full > reported.ringbuf_full {
                warn!(
                    "lost {} events because the ring buffer was full ({} in total); raise --ring-buffer",
                    now.ringbuf_full - reported.ringbuf_full,
                    now.ringbuf_full
                );
            }
            if now.map_full > reported.map_full {
                warn!(
                    "{} times the kernel refused socket-local storage for a socket (out of memory; {} in total): those sockets are not observed",
                    now.map_full - reported.map_full,
                    now.map_full
                );
            }
            *reported = now;
        }
        Err(e) => warn!("reading kernel counters: {e}"),
    }
}

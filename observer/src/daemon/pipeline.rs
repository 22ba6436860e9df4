//! The event pipeline: every event from the ring buffer through its sinks
//! in order (the aggregator, the metrics, the store, `--events` and
//! `--record`), the socket table refreshed into the at-risk and doomed
//! views, and the kernel's loss counters reported.

use std::sync::{atomic::Ordering, Arc, PoisonError};

use log::{error, info, warn};

use super::{
    api::Shared,
    held::{Held, Released},
    outputs::{EventsOut, Recording, Stdout},
    probed::{ProbeFeed, ProbeSockets},
};
use crate::{
    cli::EventsFormat,
    diagnosis::probed::PROBE_THREAD,
    diagnosis::table::ProcessOwner,
    kernel::bpf::{KernelCounters, Probes},
    kernel::event::{clock_ns, EventKind, SockEvent},
    kernel::owner::{Filter, Owner, Resolver},
    surfaces::metrics::{self, Metrics},
    surfaces::store::{self, Writer},
};

/// Where decoded events go.
pub(crate) struct Sinks {
    pub(crate) print: Option<EventsFormat>,
    pub(crate) connections: bool,
    pub(crate) record: Option<Recording>,
    /// Events not recorded, as last exported.
    pub(crate) record_lost: u64,
    /// `--events`' writer thread.
    pub(crate) events_out: Option<EventsOut>,
    /// Standard output closed under `--events`: the run ends.
    pub(crate) stop: bool,
    /// The last drain stopped at its cap with records left in the ring.
    pub(crate) more: bool,
    pub(crate) decode_errors: u64,
    pub(crate) shared: Arc<Shared>,
    pub(crate) store: Option<Writer>,
    pub(crate) store_dropped: u64,
    pub(crate) store_failed: u64,
    /// Connection counts and changes the store lost, as last exported.
    pub(crate) store_failed_other: u64,
    pub(crate) store_dropped_other: u64,
    pub(crate) volume: store::Volume,
    pub(crate) owners: Resolver,
    /// Events waiting for their owner, in the kernel's order.
    pub(crate) held: Held,
    /// The oldest held event's time, as last told to the aggregator.
    pub(crate) waiting_since: Option<u64>,
    /// The reusing clients' runtimes, for the fix in their own terms.
    pub(crate) runtimes: crate::kernel::runtime::Runtimes,
    pub(crate) filter: Filter,
    /// `observer probe`'s connections, left out of every row.
    pub(crate) probe_sockets: ProbeSockets,
    /// `observer probe`'s results, read from the store.
    pub(crate) probe_feed: ProbeFeed,
}

impl Sinks {
    /// Take one event from the ring. Under `--cgroup` it waits behind any
    /// held event, and for its own owner if that is still being looked for:
    /// whether it belongs depends on it. Otherwise it goes on at once with
    /// the owner known now (the lookup it starts names the later events):
    /// a wait would keep evidence in memory only, which a `kill -9` loses.
    pub(crate) fn handle(&mut self, mut ev: SockEvent) {
        self.shared.health.events.fetch_add(1, Ordering::Relaxed);
        // The probe chose its connections' idle time, not the application:
        // they are no reuse, no pool close and no at-risk socket of it.
        if self.probe_sockets.take(&ev) {
            self.shared.metrics.probe_event();
            return;
        }
        if self.filter.cgroup.is_none() {
            ev.owner = self.owners.known(ev.cgroup_id, ev.pid).map(|o| Owner::clone(&o));
            self.deliver(ev);
            return;
        }
        self.held.push(ev);
        self.release(false);
    }

    /// Hand on the held events whose owner is settled, in order (`all`:
    /// every one, as at shutdown).
    pub(crate) fn release(&mut self, all: bool) {
        while let Some(Released { event, unresolved }) = self.held.next(&self.owners, all) {
            if unresolved {
                // Only --cgroup holds events: it cannot be shown to belong.
                self.shared.metrics.lost(metrics::reason::OWNER_UNRESOLVED, 1);
                continue;
            }
            self.deliver(event);
        }
        let oldest = self.held.oldest_ns();
        if oldest != self.waiting_since {
            self.waiting_since = oldest;
            self.shared.aggregator.lock().unwrap_or_else(PoisonError::into_inner).set_waiting(oldest);
        }
        self.shared.metrics.set_owner_wait(self.held.len());
    }

    fn deliver(&mut self, mut ev: SockEvent) {
        if !self.filter.keeps(ev.netns, ev.cgroup()) {
            return;
        }
        // A reuse is told its client's runtime (a cache lookup); a
        // connection's establishment and first bytes queue the process for
        // the resolver, while it surely lives and long before its first
        // reuse.
        if ev.role == crate::kernel::event::Role::Client {
            match ev.kind {
                EventKind::Reuse => {
                    if let Some(p) = self.runtimes.of(ev.pid, &ev.comm) {
                        ev.process = Some(p.name);
                        ev.client_runtime = Some(p.runtime);
                    }
                }
                EventKind::ServerName | EventKind::Established => {
                    let _ = self.runtimes.of(ev.pid, &ev.comm);
                }
                _ => {}
            }
        }
        let ev = &ev;
        if let Some(rec) = self.record.as_mut() {
            rec.write_line(&ev.to_json_line());
        }
        {
            let mut agg = self.shared.aggregator.lock().unwrap_or_else(PoisonError::into_inner);
            let fed = agg.feed(ev);
            drop(agg);
            self.shared.metrics.fed(ev, &fed);
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
            if let Some(w) = &self.store {
                store::keep(ev, &fed, &mut self.volume, |r| {
                    let _ = w.send(r);
                });
            }
        }
        let is_connection = matches!(ev.kind, EventKind::Established | EventKind::Closed);
        if is_connection && !self.connections {
            return;
        }
        let line = match self.print {
            Some(EventsFormat::Text) => ev.to_string(),
            Some(EventsFormat::Json) => ev.to_json_line(),
            None => return,
        };
        let Some(out) = self.events_out.as_ref() else { return };
        match out.print(line) {
            Stdout::Open => {}
            Stdout::Closed => self.close_stdout(),
            Stdout::Backlog => self.shared.metrics.lost(metrics::reason::EVENTS_OUTPUT_BACKLOG, 1),
        }
    }

    fn close_stdout(&mut self) {
        if self.print.take().is_some() {
            info!("standard output was closed: stopping, as a pipe's writer does");
            self.stop = true;
        }
    }

    /// Take `observer probe`'s new results from the store into the table.
    pub(crate) fn poll_probes(&mut self) {
        self.probe_feed.poll(&self.shared, &self.filter, clock_ns(libc::CLOCK_REALTIME));
    }

    /// Hand the connection counts of the minute so far to the store (it
    /// adds them up): a `kill -9` loses one second of them, not a minute.
    pub(crate) fn flush_volume(&mut self) {
        let Some(w) = &self.store else { return };
        for r in self.volume.flush() {
            let _ = w.send(r);
        }
    }

    /// Write the recording's buffer and export what it could not write.
    pub(crate) fn flush_record(&mut self) {
        let Some(rec) = self.record.as_mut() else { return };
        rec.flush();
        let lost = rec.lost();
        self.shared.metrics.lost(metrics::reason::RECORD_ERROR, lost.saturating_sub(self.record_lost));
        self.record_lost = lost;
    }

    /// Log and export records the store had to drop since the last call.
    pub(crate) fn report_store_losses(&mut self) {
        let Some(w) = &self.store else { return };
        // The writer logs its own failures, once a minute.
        let state = w.state();
        let failed = state.failed.load(Ordering::Relaxed);
        self.shared.metrics.lost(metrics::reason::STORE_ERROR, failed.saturating_sub(self.store_failed));
        self.store_failed = self.store_failed.max(failed);
        let failed_other = state.failed_other.load(Ordering::Relaxed);
        self.shared
            .metrics
            .store_records_lost(metrics::reason::STORE_ERROR, failed_other.saturating_sub(self.store_failed_other));
        self.store_failed_other = self.store_failed_other.max(failed_other);
        let other = w.dropped_other();
        self.shared
            .metrics
            .store_records_lost(metrics::reason::STORE_BACKLOG, other.saturating_sub(self.store_dropped_other));
        self.store_dropped_other = self.store_dropped_other.max(other);
        let now = w.dropped();
        if now > self.store_dropped {
            let n = now - self.store_dropped;
            self.shared.metrics.lost(metrics::reason::STORE_BACKLOG, n);
            warn!("the evidence store could not keep up: {n} records not stored ({now} in total); check the disk under --data-dir");
            self.store_dropped = now;
        }
    }
}

/// Refresh the at-risk view and the tracked-socket gauge from the kernel.
/// Only client sockets idler than the smallest at-risk threshold are kept
/// (none while no destination has one), so a host with 100k sockets does
/// not copy its table at every refresh. A threshold that drops while the
/// table is read counts its sockets from the next refresh.
pub(crate) fn refresh_sockets(probes: &mut Probes, sinks: &mut Sinks) {
    let shared = Arc::clone(&sinks.shared);
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
            && !sinks.probe_sockets.contains(v.id)
            && (sinks.filter.is_empty() || {
                let owner = sinks.owners.known(v.cgroup_id, 0);
                sinks.filter.keeps(v.netns, owner.as_deref().map(|o| o.cgroup.as_str()))
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
        if d.comm == PROBE_THREAD {
            return;
        }
        let owner = sinks.owners.known(d.cgroup_id, d.pid);
        if !sinks.filter.is_empty() && !sinks.filter.keeps(d.netns, owner.as_deref().map(|o| o.cgroup.as_str())) {
            return;
        }
        let who = ProcessOwner {
            process: match sinks.runtimes.known_name(d.pid) {
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
/// and ticks before it reads on (`Sinks::more`).
pub(crate) const DRAIN_CAP: usize = 65_536;

pub(crate) fn drain(probes: &mut Probes, sinks: &mut Sinks) {
    sinks.shared.health.heartbeat_ns.store(clock_ns(libc::CLOCK_BOOTTIME), Ordering::Relaxed);
    let read = probes.drain(DRAIN_CAP, |ev| match ev {
        Ok(ev) => sinks.handle(ev),
        Err(e) => {
            sinks.decode_errors += 1;
            sinks.shared.metrics.undecodable();
            error!("undecodable event ({} so far): {e}", sinks.decode_errors);
        }
    });
    sinks.more = read == DRAIN_CAP;
    if let Some(out) = sinks.events_out.as_ref() {
        sinks.shared.metrics.lost(metrics::reason::EVENTS_OUTPUT_ERROR, out.take_errors());
        if out.is_closed() {
            sinks.close_stdout();
        }
    }
    if let Some(rec) = sinks.record.as_mut() {
        rec.flush_due();
    }
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

//! The pipeline's first stage: each event from the ring is told its owner
//! (cgroup, container, pod, unit), left out when it is `observer probe`'s
//! own or outside `--netns`/`--cgroup`, and a client's reuse is told its
//! runtime. Under `--cgroup` an event waits, in the kernel's order, until
//! its owner is settled ([`Held`]). What comes out goes to the diagnosis.

use std::sync::PoisonError;

use super::{
    api::DaemonState,
    held::{Held, Released},
    probe_feed::ProbeSockets,
};
use crate::{
    kernel::event::{Body, EventKind, Role, SockEvent},
    kernel::owner::{Filter, Owner, Resolver},
    kernel::runtime::Runtimes,
    surfaces::metrics,
};

/// Owners, runtimes, the filter and the probe's sockets.
pub(crate) struct Enrich {
    pub(crate) owners: Resolver,
    /// Events waiting for their owner, in the kernel's order.
    held: Held,
    /// The oldest held event's time, as last told to the aggregator.
    waiting_since: Option<u64>,
    /// The reusing clients' runtimes, for the fix in their own terms.
    pub(crate) runtimes: Runtimes,
    pub(crate) filter: Filter,
    /// `observer probe`'s connections, left out of every row.
    pub(crate) probe_sockets: ProbeSockets,
}

impl Enrich {
    /// `data_dir`: where running probes announce their connections.
    pub(crate) fn new(owners: Resolver, filter: Filter, data_dir: &std::path::Path) -> Self {
        Self {
            owners,
            held: Held::default(),
            waiting_since: None,
            runtimes: Runtimes::start(),
            filter,
            probe_sockets: ProbeSockets::new(data_dir),
        }
    }

    /// Take one event and hand on to `next` what is ready. Under
    /// `--cgroup` it waits behind any held event, and for its own owner if
    /// that is still being looked for: whether it belongs depends on it.
    /// Otherwise it goes on at once with the owner known now (the lookup it
    /// starts names the later events): a wait would keep evidence in memory
    /// only, which a `kill -9` loses.
    pub(crate) fn take(&mut self, mut ev: SockEvent, shared: &DaemonState, next: &mut impl FnMut(SockEvent)) {
        // The probe chose its connections' idle time, not the application:
        // they are no reuse, no pool close and no at-risk socket of it.
        if self.probe_sockets.take(&ev) {
            shared.metrics.probe_event();
            return;
        }
        if self.filter.cgroup.is_none() {
            ev.owner = self.owners.known(ev.cgroup_id, ev.pid).map(|o| Owner::clone(&o));
            self.pass(ev, next);
            return;
        }
        self.held.push(ev);
        self.release(false, shared, next);
    }

    /// Hand on the held events whose owner is settled, in order (`all`:
    /// every one, as at shutdown).
    pub(crate) fn release(&mut self, all: bool, shared: &DaemonState, next: &mut impl FnMut(SockEvent)) {
        while let Some(Released { event, unresolved }) = self.held.next(&self.owners, all) {
            if unresolved {
                // Only --cgroup holds events: it cannot be shown to belong.
                shared.metrics.lost(metrics::reason::OWNER_UNRESOLVED, 1);
                continue;
            }
            self.pass(event, next);
        }
        let oldest = self.held.oldest_ns();
        if oldest != self.waiting_since {
            self.waiting_since = oldest;
            shared.aggregator.lock().unwrap_or_else(PoisonError::into_inner).set_waiting(oldest);
        }
        shared.metrics.set_owner_wait(self.held.len());
    }

    /// The filter, then the runtime: a reuse is told its client's runtime
    /// (a cache lookup); a connection's establishment and first bytes queue
    /// the process for the resolver, while it surely lives and long before
    /// its first reuse.
    fn pass(&mut self, mut ev: SockEvent, next: &mut impl FnMut(SockEvent)) {
        if !self.filter.keeps(ev.netns, ev.cgroup()) {
            return;
        }
        if ev.role == Role::Client {
            match ev.kind() {
                EventKind::Reuse => {
                    if let Some(p) = self.runtimes.of(ev.pid, &ev.comm) {
                        ev.process = Some(p.name);
                        if let Body::Reuse(r) = &mut ev.body {
                            r.client_runtime = Some(p.runtime);
                        }
                    }
                }
                EventKind::ServerName | EventKind::Established => {
                    let _ = self.runtimes.of(ev.pid, &ev.comm);
                }
                _ => {}
            }
        }
        next(ev);
    }
}

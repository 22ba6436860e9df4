//! `observer probe` beside the daemon: its connections are left out of
//! every row ([`ProbeSockets`]: the kernel names their thread
//! [`PROBE_THREAD`]), and its results come in from the evidence store
//! ([`ProbeFeed`]: new rows of the `probes` table, read every second).

use std::{
    collections::{HashSet, VecDeque},
    path::{Path, PathBuf},
    sync::PoisonError,
};

use log::{info, warn};

use super::DaemonState;
use crate::{
    diagnosis::probed::PROBE_THREAD,
    kernel::event::SockEvent,
    kernel::owner::Filter,
    surfaces::store::{Store, StoreError},
};

/// The probe's sockets seen lately, by socket id, so the at-risk view can
/// leave them out too (its socket records carry no thread name). Bounded:
/// the oldest is forgotten past [`ProbeSockets::MAX`] (a probe opens at most
/// 64 at a time; closes are not reported to the daemon by default).
#[derive(Debug, Default)]
pub(crate) struct ProbeSockets {
    ids: HashSet<u64>,
    order: VecDeque<u64>,
}

impl ProbeSockets {
    pub(crate) const MAX: usize = 4096;

    /// Whether `ev` is of the probe's connections; notes its socket if so.
    pub(crate) fn take(&mut self, ev: &SockEvent) -> bool {
        if ev.comm != PROBE_THREAD {
            return false;
        }
        if ev.sock_id != 0 && self.ids.insert(ev.sock_id) {
            self.order.push_back(ev.sock_id);
            if self.order.len() > Self::MAX {
                if let Some(old) = self.order.pop_front() {
                    self.ids.remove(&old);
                }
            }
        }
        true
    }

    pub(crate) fn contains(&self, sock_id: u64) -> bool {
        self.ids.contains(&sock_id)
    }
}

/// New probe results in the store, read into the aggregator.
pub(crate) struct ProbeFeed {
    dir: PathBuf,
    store: Option<Store>,
    /// The last `probes` row taken.
    last_id: i64,
    window_ns: u64,
    warned: bool,
}

impl ProbeFeed {
    pub(crate) fn new(dir: &Path, window_ns: u64) -> Self {
        Self { dir: dir.to_path_buf(), store: None, last_id: 0, window_ns, warned: false }
    }

    /// Take what came since the last call (at start-up: every probe of the
    /// window) into the table. Returns the results taken.
    pub(crate) fn poll(&mut self, shared: &DaemonState, filter: &Filter, now_ns: u64) -> usize {
        match self.read(now_ns) {
            Ok(got) => {
                let mut taken = 0;
                let mut agg = shared.aggregator.lock().unwrap_or_else(PoisonError::into_inner);
                for p in &got {
                    // A probe's namespace is known, its cgroup is not: a
                    // --cgroup run cannot show it to be its own.
                    if filter.keeps(p.id.netns.inode().unwrap_or(0), None) {
                        agg.add_probe(p);
                        taken += 1;
                    }
                }
                drop(agg);
                if taken > 0 {
                    shared.metrics.probe_results(taken as u64);
                    if let Some(p) = got.last() {
                        info!("observer probe result for {}: {}", p.id.destination, p.summary());
                    }
                }
                taken
            }
            Err(e) => {
                if !self.warned {
                    warn!("reading observer probe results from the store: {e} (tried again every second; logged once)");
                    self.warned = true;
                }
                self.store = None;
                0
            }
        }
    }

    fn read(&mut self, now_ns: u64) -> Result<Vec<crate::diagnosis::probed::ProbeEvidence>, StoreError> {
        let store = match &mut self.store {
            Some(s) => s,
            None => self.store.insert(Store::open_read_only(&self.dir)?),
        };
        let since = now_ns.saturating_sub(self.window_ns);
        let mut out = Vec::new();
        loop {
            let page = store.probes_after(self.last_id, since)?;
            let full = page.len() == Store::MAX_PROBES_READ;
            for (id, p) in page {
                self.last_id = self.last_id.max(id);
                out.push(p);
            }
            if !full {
                return Ok(out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ProbeSockets;
    use crate::kernel::event::{EventKind, Role, SockEvent};

    fn ev(comm: &str, sock_id: u64) -> SockEvent {
        let mut e = SockEvent::new(
            1,
            EventKind::Established,
            Role::Client,
            "10.0.0.1:40000".parse().unwrap(),
            "10.0.0.2:443".parse().unwrap(),
            0.0,
        );
        e.comm = comm.to_owned();
        e.sock_id = sock_id;
        e
    }

    #[test]
    fn the_probes_sockets_are_known_by_their_thread_and_bounded() {
        let mut s = ProbeSockets::default();
        assert!(!s.take(&ev("curl", 1)));
        assert!(!s.contains(1));
        assert!(s.take(&ev("observer-probe", 2)));
        assert!(s.contains(2));
        for id in 3..3 + ProbeSockets::MAX as u64 {
            s.take(&ev("observer-probe", id));
        }
        assert!(!s.contains(2), "the oldest is forgotten past the bound");
        assert_eq!(s.ids.len(), ProbeSockets::MAX);
        assert_eq!(s.order.len(), ProbeSockets::MAX);
    }
}

//! `observer probe` beside the daemon: its connections are left out of
//! every row ([`ProbeSockets`]: the kernel tells, at `connect()`, that the
//! connecting process runs the daemon's own executable; a probe that was
//! running before the daemon started announces them), and its results
//! come in from the evidence store ([`ProbeFeed`]: new rows of the
//! `probes` table, read every second).

use std::{
    collections::{HashMap, HashSet, VecDeque},
    net::SocketAddr,
    path::{Path, PathBuf},
    sync::PoisonError,
};

use log::{info, warn};

use super::DaemonState;
use crate::{
    diagnosis::probed::PROBE_THREAD,
    kernel::event::{clock_ns, SockEvent},
    kernel::owner::Filter,
    probe::announce,
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
    /// This daemon's executable as `stat` shows it (device, inode).
    own_exe: Option<(u64, u64)>,
    /// Processes whose executable was compared with it, by pid (bounded:
    /// cleared past [`ProbeSockets::MAX_PIDS`]).
    checked: HashMap<u32, bool>,
    /// Where running probes announce their connections (the data
    /// directory), and what they announced: (netns, local, remote). For a
    /// daemon that started during a probe, whose sockets it adopted with
    /// no process ([`crate::probe::announce`]).
    dir: PathBuf,
    announced: HashSet<(u32, SocketAddr, SocketAddr)>,
}

/// A file's (device, inode), as `stat` shows them.
fn file_id(path: &str) -> Option<(u64, u64)> {
    use std::os::unix::fs::MetadataExt as _;
    std::fs::metadata(path).ok().map(|m| (m.dev(), m.ino()))
}

impl ProbeSockets {
    pub(crate) const MAX: usize = 4096;
    const MAX_PIDS: usize = 256;

    /// Reads the probes' announcements in `dir` at once: before the first
    /// event, which may be an adopted probe socket's.
    pub(crate) fn new(dir: &Path) -> Self {
        let mut s = Self { own_exe: file_id("/proc/self/exe"), dir: dir.to_path_buf(), ..Self::default() };
        s.refresh(clock_ns(libc::CLOCK_REALTIME));
        s
    }

    /// Read the running probes' announcements again (once a second).
    pub(crate) fn refresh(&mut self, now_unix_ns: u64) {
        self.announced = announce::announced(&self.dir, now_unix_ns);
    }

    /// Whether `ev` is of the probe's connections, and notes its socket if
    /// so: connected by a process running the daemon's own executable, as
    /// the kernel told at `connect()` ([`SockEvent::observer_own`]); or, for
    /// a thread named as the probe's where the kernel did not say so, as
    /// `/proc/PID/exe` shows it where the daemon may read it (run as root;
    /// a file system whose device the kernel numbers otherwise than `stat`,
    /// such as a guest's `virtiofs`). A thread's name alone, which any
    /// process can choose, never decides.
    pub(crate) fn take(&mut self, ev: &SockEvent) -> bool {
        let announced = !self.announced.is_empty() && self.announced.contains(&(ev.netns, ev.local, ev.remote));
        if !(ev.observer_own || announced || ev.comm == PROBE_THREAD && self.runs_our_exe(ev.pid)) {
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

    /// Whether process `pid` runs this daemon's executable, as `/proc`
    /// shows it (false where it may not be read).
    fn runs_our_exe(&mut self, pid: u32) -> bool {
        let Some(own) = self.own_exe else { return false };
        if pid == 0 {
            return false;
        }
        if let Some(&same) = self.checked.get(&pid) {
            return same;
        }
        if self.checked.len() >= Self::MAX_PIDS {
            self.checked.clear();
        }
        let same = file_id(&format!("/proc/{pid}/exe")) == Some(own);
        self.checked.insert(pid, same);
        same
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
    use crate::kernel::event::{clock_ns, EventKind, SockEvent};
    use crate::probe::announce;

    fn ev(comm: &str, own: bool, sock_id: u64) -> SockEvent {
        let mut e = SockEvent::client_test(1, EventKind::Established, "10.0.0.2:443", 0.0);
        e.comm = comm.to_owned();
        e.observer_own = own;
        e.sock_id = sock_id;
        e
    }

    /// The kernel's word decides (the connecting process runs the daemon's
    /// executable), never a thread's name, which any process can choose.
    #[test]
    fn the_probes_sockets_are_known_by_the_kernels_word_and_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let mut s = ProbeSockets::new(dir.path());
        assert!(!s.take(&ev("curl", false, 1)));
        // Named so, in a process that does not run the daemon's executable
        // (pid 1, or one /proc has not): no probe.
        let mut named = ev("observer-probe", false, 1);
        named.pid = 1;
        assert!(!s.take(&named), "a thread named so is no probe");
        named.pid = u32::MAX - 1;
        assert!(!s.take(&named));
        // Named so in this very process (which runs the test binary: here
        // 'the daemon's executable'): the /proc fallback takes it.
        let mut ours = ev("observer-probe", false, 1 << 40);
        ours.pid = std::process::id();
        assert!(s.take(&ours) && s.contains(1 << 40));
        assert!(!s.contains(1));
        assert!(s.take(&ev("observer-probe", true, 2)));
        assert!(s.contains(2));
        for id in 3..3 + ProbeSockets::MAX as u64 {
            s.take(&ev("anything", true, id));
        }
        assert!(!s.contains(2), "the oldest is forgotten past the bound");
        assert_eq!(s.ids.len(), ProbeSockets::MAX);
        assert_eq!(s.order.len(), ProbeSockets::MAX);
    }

    /// A socket the daemon adopted (no process: it opened before the
    /// daemon started) is the probe's when a running probe announced its
    /// addresses in its namespace; in another namespace, or once the probe
    /// has ended, the same addresses are no probe's.
    #[test]
    fn an_adopted_socket_a_running_probe_announced_is_the_probes() {
        let dir = tempfile::tempdir().unwrap();
        let a = announce::Announcer::start(dir.path(), std::time::Duration::from_secs(30)).unwrap();
        a.add("10.0.0.1:40000".parse().unwrap(), "10.0.0.2:443".parse().unwrap());
        let netns =
            u32::try_from(std::os::unix::fs::MetadataExt::ino(&std::fs::metadata("/proc/self/ns/net").unwrap()))
                .unwrap();
        let mut s = ProbeSockets::new(dir.path());
        let mut adopted = ev("", false, 7);
        adopted.pid = 0;
        adopted.netns = netns;
        assert!(s.take(&adopted) && s.contains(7));
        let mut elsewhere = ev("", false, 8);
        elsewhere.netns = netns.wrapping_add(1);
        assert!(!s.take(&elsewhere), "the same addresses in another namespace");
        drop(a);
        s.refresh(clock_ns(libc::CLOCK_REALTIME));
        let mut later = ev("", false, 9);
        later.netns = netns;
        assert!(!s.take(&later), "the probe ended: its addresses are free again");
    }
}

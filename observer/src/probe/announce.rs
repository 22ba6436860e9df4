//! The probe's connections announced to a daemon that starts while the
//! probe runs. A daemon already running is shown each connection by the
//! kernel at `connect()`; one that starts later adopts the open sockets
//! with no process, so the probe names them: a file in the daemon's data
//! directory (`probing-PID.json`), rewritten as connections open and
//! removed when the probe ends. Only root and the daemon's user may write
//! there (the unit's `StateDirectory`), and the daemon takes only files
//! one of them owns: no other process can hide its connections this way.

use std::{
    collections::HashSet,
    io::Read as _,
    net::SocketAddr,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{Mutex, PoisonError},
    time::Duration,
};

use serde::{Deserialize, Serialize};

/// How the files are named: `probing-PID.json`.
const PREFIX: &str = "probing-";
/// Connections one probe announces at most (a probe opens at most a few
/// hundred in a run).
pub const MAX_SOCKETS: usize = 4096;
/// Files read at most, and bytes of each.
const MAX_FILES: usize = 64;
const MAX_FILE_BYTES: u64 = 1 << 20;

/// One probe's announcement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Announced {
    pub pid: u32,
    /// The network namespace the probe's connections are in (its inode).
    pub netns: u32,
    /// Past this (Unix ns) the file is stale: a probe killed before it
    /// could remove it names nothing.
    pub until_unix_ns: u64,
    /// (local, remote) of each connection.
    pub sockets: Vec<(SocketAddr, SocketAddr)>,
}

/// The probe's side: adds each connection and rewrites the file.
#[derive(Debug)]
pub struct Announcer {
    path: PathBuf,
    state: Mutex<Announced>,
}

impl Announcer {
    /// Announce into `data_dir` for a run of at most `budget`; `None` (and
    /// the reason) when the directory cannot take the file: a daemon
    /// started during this probe then counts its connections.
    pub fn start(data_dir: &Path, budget: Duration) -> Result<Self, std::io::Error> {
        let pid = std::process::id();
        let netns = std::fs::metadata("/proc/self/ns/net").map(|m| u32::try_from(m.ino()).unwrap_or(0))?;
        let margin = Duration::from_mins(1);
        let until_unix_ns = crate::kernel::event::clock_ns(libc::CLOCK_REALTIME)
            .saturating_add(u64::try_from((budget + margin).as_nanos()).unwrap_or(u64::MAX));
        let a = Self {
            path: data_dir.join(format!("{PREFIX}{pid}.json")),
            state: Mutex::new(Announced { pid, netns, until_unix_ns, sockets: Vec::new() }),
        };
        a.write(&a.state.lock().unwrap_or_else(PoisonError::into_inner))?;
        Ok(a)
    }

    /// A connection opened: announce it (at most [`MAX_SOCKETS`]).
    pub fn add(&self, local: SocketAddr, remote: SocketAddr) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if s.sockets.len() >= MAX_SOCKETS {
            return;
        }
        s.sockets.push((local, remote));
        // Best effort: the kernel shows a running daemon the connection
        // anyway; only a daemon started later needs the file.
        let _ = self.write(&s);
    }

    /// Replace the file whole: a reader never sees half of it. Under the
    /// lock: connections open on many threads at once, and a write of an
    /// older list must never land after a newer one (one was lost so).
    fn write(&self, s: &Announced) -> std::io::Result<()> {
        let json = serde_json::to_vec(s).map_err(std::io::Error::other)?;
        let tmp = self.path.with_extension("tmp");
        std::fs::write(&tmp, json)?;
        std::fs::rename(&tmp, &self.path)
    }
}

impl Drop for Announcer {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The daemon's side: the connections announced by probes now running,
/// as (netns, local, remote), from files in `data_dir` that root or this
/// process's user owns and that have not expired at `now_unix_ns`.
#[must_use]
pub fn announced(data_dir: &Path, now_unix_ns: u64) -> HashSet<(u32, SocketAddr, SocketAddr)> {
    // SAFETY: geteuid has no preconditions.
    let own = unsafe { libc::geteuid() };
    let mut out = HashSet::new();
    let Ok(dir) = std::fs::read_dir(data_dir) else { return out };
    let files = dir.flatten().filter(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.starts_with(PREFIX) && name.ends_with(".json")
    });
    for entry in files.take(MAX_FILES) {
        let Ok(meta) = entry.metadata() else { continue };
        if !meta.is_file() || (meta.uid() != 0 && meta.uid() != own) {
            continue;
        }
        let mut text = Vec::new();
        let read = std::fs::File::open(entry.path()).and_then(|f| f.take(MAX_FILE_BYTES).read_to_end(&mut text));
        let Ok(a) = read.map_err(|_| ()).and_then(|_| serde_json::from_slice::<Announced>(&text).map_err(|_| ()))
        else {
            continue;
        };
        if a.until_unix_ns < now_unix_ns {
            continue;
        }
        out.extend(a.sockets.iter().take(MAX_SOCKETS).map(|&(l, r)| (a.netns, l, r)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    /// What a probe announces is read back while it runs, and gone when
    /// it ends; a stale file names nothing.
    #[test]
    fn a_probes_connections_are_announced_while_it_runs() {
        let dir = tempfile::tempdir().unwrap();
        let a = Announcer::start(dir.path(), Duration::from_secs(10)).unwrap();
        a.add(addr("10.0.0.1:40000"), addr("10.0.0.2:80"));
        a.add(addr("10.0.0.1:40002"), addr("10.0.0.2:80"));
        let now = crate::kernel::event::clock_ns(libc::CLOCK_REALTIME);
        let seen = announced(dir.path(), now);
        let netns = a.state.lock().unwrap().netns;
        assert_eq!(seen.len(), 2);
        assert!(seen.contains(&(netns, addr("10.0.0.1:40000"), addr("10.0.0.2:80"))));
        assert!(announced(dir.path(), now + 3_600_000_000_000).is_empty(), "expired");
        drop(a);
        assert!(announced(dir.path(), now).is_empty(), "removed at the end");
    }

    /// Files that are not announcements, or that no probe could have
    /// written whole, name nothing and stop nothing.
    #[test]
    fn other_files_are_ignored() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("probing-1.json"), b"{not json").unwrap();
        std::fs::write(dir.path().join("evidence.sqlite"), b"x").unwrap();
        std::fs::create_dir(dir.path().join("probing-2.json")).unwrap();
        let now = crate::kernel::event::clock_ns(libc::CLOCK_REALTIME);
        assert!(announced(dir.path(), now).is_empty());
        assert!(announced(&dir.path().join("missing"), now).is_empty());
    }

    /// Bounded: a probe announces at most `MAX_SOCKETS` connections.
    #[test]
    fn announcements_are_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let a = Announcer::start(dir.path(), Duration::from_secs(10)).unwrap();
        a.state.lock().unwrap().sockets = vec![(addr("10.0.0.1:1000"), addr("10.0.0.2:80")); MAX_SOCKETS - 1];
        a.add(addr("10.0.0.1:1001"), addr("10.0.0.2:80"));
        a.add(addr("10.0.0.1:1002"), addr("10.0.0.2:80"));
        assert_eq!(a.state.lock().unwrap().sockets.len(), MAX_SOCKETS);
        let now = crate::kernel::event::clock_ns(libc::CLOCK_REALTIME);
        assert_eq!(announced(dir.path(), now).len(), 2, "distinct tuples, the last one past the bound left out");
    }
}

//! Processes told off the event path: a resolver thread reads what a
//! process shows ([`super::of_process`]), which may mean a whole
//! executable, and the event path only looks up its cache.

use std::{collections::HashMap, os::unix::fs::MetadataExt as _};

use super::{of_process, process_name, ClientRuntime, KernelFiles};

/// Processes remembered at most (each costs one executable read).
pub const MAX_CACHED: usize = 1024;
/// A cached process is checked against `/proc` at most this often (its
/// executable's inode tells a reused pid).
const RECHECK: std::time::Duration = std::time::Duration::from_secs(1);
/// Processes waiting for the resolver at most (more wait for a later event).
const QUEUE: usize = 1024;

/// A process as the resolver told it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// Its name as `ps` shows it ([`process_name`]), else the writing
    /// thread's when `/proc` no longer has it.
    pub name: String,
    pub runtime: ClientRuntime,
}

#[derive(Debug)]
enum Entry {
    /// Queued for the resolver.
    Pending,
    Known {
        ino: u64,
        process: Process,
        checked: std::time::Instant,
    },
}

type Cache = std::sync::Arc<std::sync::Mutex<HashMap<u32, Entry>>>;

/// Processes (name and runtime) by pid. Telling one may read its whole
/// executable (a Go binary's function names), so a resolver thread does
/// it: the event path only looks up the cache (no syscall), and a process
/// is queued when it connects or first writes, long before its first
/// reuse. Keyed by pid alone (every thread of a process writes under its
/// own name); a reused pid is told anew at the next recheck, by its
/// executable. Bounded: at most [`MAX_CACHED`] processes (a full cache
/// starts over) and [`QUEUE`] waiting.
pub struct Runtimes {
    cache: Cache,
    queue: std::sync::mpsc::SyncSender<Job>,
}

/// What the resolver thread is handed.
enum Job {
    /// Tell process `pid`, whose thread `comm` wrote.
    Tell(u32, String),
    /// From now on, list unreadable processes' mapped files this way.
    Files(KernelFiles),
}

impl Runtimes {
    /// Start the resolver thread; it ends when this is dropped.
    #[must_use]
    pub fn start() -> Self {
        let cache: Cache = std::sync::Arc::default();
        let (queue, rx) = std::sync::mpsc::sync_channel::<Job>(QUEUE);
        let shared = std::sync::Arc::clone(&cache);
        let spawned = std::thread::Builder::new().name("observer-runtime".into()).spawn(move || {
            // Reading an executable is background work: it must not take
            // the CPU from the event reader (a thread's own nice, on Linux).
            // SAFETY: setpriority on the calling thread (who = 0).
            unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
            let mut kernel: Option<KernelFiles> = None;
            for job in rx {
                match job {
                    Job::Tell(pid, comm) => resolve(&shared, pid, &comm, kernel.as_mut()),
                    Job::Files(files) => {
                        kernel = Some(files);
                        // Told before the kernel could list them: anew.
                        let mut c = shared.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        c.retain(|_, e| !matches!(e, Entry::Known { process, .. } if process.runtime.unreadable));
                    }
                }
            }
        });
        if let Err(e) = spawned {
            log::warn!("cannot start the runtime resolver ({e}): fixes will use the generic rule");
        }
        Self { cache, queue }
    }

    /// Process `pid` (whose thread `comm` wrote) as far as it is known
    /// now: `None` while it is being told (the process is queued), else
    /// its name and runtime ([`ClientRuntime::unknown`] when that cannot be
    /// told). A process that exited keeps what it was.
    pub fn of(&self, pid: u32, comm: &str) -> Option<Process> {
        if pid == 0 {
            return None;
        }
        let mut cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let now = std::time::Instant::now();
        match cache.get_mut(&pid) {
            Some(Entry::Known { process, checked, .. }) => {
                if now.duration_since(*checked) >= RECHECK {
                    // Recheck in the resolver; meanwhile the known answer.
                    *checked = now;
                    let _ = self.queue.try_send(Job::Tell(pid, comm.to_owned()));
                }
                return Some(process.clone());
            }
            Some(Entry::Pending) => return None,
            None => {}
        }
        if cache.len() >= MAX_CACHED {
            cache.clear();
        }
        if self.queue.try_send(Job::Tell(pid, comm.to_owned())).is_ok() {
            cache.insert(pid, Entry::Pending);
        }
        None
    }

    /// List the mapped files of processes whose `/proc` the daemon may not
    /// read (the unit's capabilities) with `files` from now on; processes
    /// told unreadable before are told anew. Blocks while the queue is
    /// full (once, at start).
    pub fn use_kernel_files(&self, files: KernelFiles) {
        let _ = self.queue.send(Job::Files(files));
    }

    /// The name of `pid` if the resolver knows it (no queueing: for views
    /// of sockets, whose processes the events queued already).
    pub fn known_name(&self, pid: u32) -> Option<String> {
        let cache = self.cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match cache.get(&pid) {
            Some(Entry::Known { process, .. }) => Some(process.name.clone()),
            _ => None,
        }
    }
}

/// The resolver's step: tell `pid` unless the cache already knows it (the
/// same executable and name, or the process has exited). `comm` is the
/// writing thread's name, used only when `/proc` has no name for it.
fn resolve(cache: &Cache, pid: u32, comm: &str, kernel: Option<&mut KernelFiles>) {
    let ino = std::fs::metadata(format!("/proc/{pid}/exe")).map_or(0, |m| m.ino());
    let name = process_name(pid);
    {
        let mut c = cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Some(Entry::Known { ino: i, process, checked }) = c.get_mut(&pid) {
            if (ino == 0 || ino == *i) && name.as_ref().is_none_or(|n| *n == process.name) {
                *checked = std::time::Instant::now();
                return;
            }
        }
    }
    let name = name.unwrap_or_else(|| comm.to_owned());
    let runtime = of_process(pid, &name, kernel).unwrap_or_else(ClientRuntime::unknown);
    let mut c = cache.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    c.insert(pid, Entry::Known { ino, process: Process { name, runtime }, checked: std::time::Instant::now() });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Told off the event path: first `None` (queued), then the answer.
    /// This test binary is no Go binary: unknown; a pid that does not
    /// exist, named `python3`, is Python by its name; pid 0 is none.
    #[test]
    fn processes_are_told_by_the_resolver() {
        let rt = Runtimes::start();
        let wait = |pid: u32, comm: &str| {
            let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
            loop {
                if let Some(r) = rt.of(pid, comm) {
                    return r;
                }
                assert!(std::time::Instant::now() < until, "pid {pid} never told");
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        // This test runs on a thread named after it; the process is named
        // as `ps` shows it, whatever thread wrote.
        let me = wait(std::process::id(), "wrk:worker_0");
        assert!(me.runtime.is_unknown());
        assert_eq!(Some(me.name.clone()), process_name(std::process::id()));
        assert_ne!(me.name, "wrk:worker_0");
        assert_eq!(rt.known_name(std::process::id()), Some(me.name));
        // Gone from /proc: the writing thread's name is all there is.
        let python = ClientRuntime { runtime: "python".into(), ..ClientRuntime::default() };
        assert_eq!(wait(u32::MAX - 1, "python3"), Process { name: "python3".into(), runtime: python });
        assert_eq!(rt.of(0, "x"), None);
        assert_eq!(rt.known_name(u32::MAX - 2), None);
    }
}

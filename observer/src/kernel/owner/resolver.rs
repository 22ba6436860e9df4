//! Cgroup ids to owners, off the event thread. A lookup never reads a
//! file: it answers from a cache, or says the id is being looked for and
//! asks a thread of its own (`cgroup-walk`) to look. That thread first
//! asks the process the id came with (`/proc/PID/cgroup`, two small
//! reads, checked against the directory's inode, since the process may
//! have moved since its write), and walks the whole cgroup v2 tree (up to
//! [`MAX_SCAN`] directories) only for ids no process could tell, at most
//! once per [`RESCAN_EVERY`]. The event thread learns of new answers by
//! [`Resolver::walked`] and hands its held events on then.

use std::{
    collections::{HashMap, HashSet},
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    sync::{
        mpsc::{self, Receiver, RecvTimeoutError, SyncSender},
        Arc, Mutex, MutexGuard, PoisonError,
    },
    thread,
    time::{Duration, Instant},
};

use log::warn;
use tokio::sync::Notify;

use super::{parse, Owner};

/// Cgroup ids remembered at most (a resolved id costs one path); also the
/// most ids looked for at once and the most remembered as gone.
pub const MAX_CACHED: usize = 16_384;
/// Directories walked at most in one walk of the cgroup tree.
pub const MAX_SCAN: usize = 200_000;
/// A walk of the tree at most this often (an id no process could tell
/// waits for the next).
pub const RESCAN_EVERY: Duration = Duration::from_secs(2);

/// What the resolver knows of a cgroup id now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Its owner.
    Found(Arc<Owner>),
    /// Being looked for: ask again when [`Resolver::walked`] fires.
    Pending,
    /// No owner can be told: id 0, no cgroup v2 tree, too many ids looked
    /// for at once, or a cgroup removed before it was looked for.
    Unknown,
}

/// What the lookups and the walking thread share.
#[derive(Debug, Default)]
struct Known {
    cache: HashMap<u64, Arc<Owner>>,
    /// Ids a walk did not find (a cgroup removed while its sockets live
    /// on): they never start another walk. A cgroup id is never reused
    /// within a boot, so one the walk did not find is gone for good.
    missed: HashSet<u64>,
    /// Ids asked for and not yet found, each with a process that was in it.
    wanted: HashMap<u64, u32>,
    scans: u64,
}

impl Known {
    fn add(&mut self, id: u64, path: &str) {
        if self.cache.len() >= MAX_CACHED {
            // Make room for an id in use now (any other will do: a later
            // lookup of it just looks again).
            let Some(&old) = self.cache.keys().next() else { return };
            self.cache.remove(&old);
        }
        self.cache.insert(id, Arc::new(parse(path)));
    }

    fn miss(&mut self, id: u64) {
        if self.missed.len() >= MAX_CACHED {
            self.missed.clear();
        }
        self.missed.insert(id);
    }
}

fn lock(known: &Mutex<Known>) -> MutexGuard<'_, Known> {
    known.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Resolves cgroup ids to owners (a cgroup's id is its directory's inode
/// number in the cgroup v2 tree). Bounded: at most [`MAX_CACHED`] ids of
/// each kind, at most one walk per [`RESCAN_EVERY`].
#[derive(Debug)]
pub struct Resolver {
    known: Arc<Mutex<Known>>,
    /// Wakes the walking thread (`None`: no tree, ids stay unknown).
    wake: Option<SyncSender<()>>,
    walked: Arc<Notify>,
}

impl Resolver {
    /// A resolver for the cgroup v2 tree at `root`, asking processes
    /// through `/proc` (`None`: ids stay unknown).
    #[must_use]
    pub fn new(root: Option<PathBuf>) -> Self {
        Self::with_proc(root, PathBuf::from("/proc"))
    }

    /// As [`Resolver::new`], with processes under `proc` instead of `/proc`.
    #[must_use]
    pub fn with_proc(root: Option<PathBuf>, proc: PathBuf) -> Self {
        let known = Arc::new(Mutex::new(Known::default()));
        let walked = Arc::new(Notify::new());
        let wake = root.and_then(|root| {
            // One pending wake is enough: the thread reads every wanted id.
            let (tx, rx) = mpsc::sync_channel(1);
            let (k, w) = (Arc::clone(&known), Arc::clone(&walked));
            match thread::Builder::new().name("cgroup-walk".into()).spawn(move || walker(&root, &proc, &k, &rx, &w)) {
                Ok(_) => Some(tx),
                Err(e) => {
                    warn!("cannot start the cgroup walking thread ({e}): owners stay unknown");
                    None
                }
            }
        });
        Self { known, wake, walked }
    }

    /// What is known of cgroup `id`, which process `pid` was in. Never
    /// blocks on a file: an id not known yet is looked for on the walking
    /// thread, and [`Resolver::walked`] fires when that has answered.
    #[must_use]
    pub fn lookup(&self, id: u64, pid: u32) -> Lookup {
        let Some(wake) = self.wake.as_ref().filter(|_| id != 0) else { return Lookup::Unknown };
        let mut k = lock(&self.known);
        if let Some(o) = k.cache.get(&id) {
            return Lookup::Found(Arc::clone(o));
        }
        if k.missed.contains(&id) {
            return Lookup::Unknown;
        }
        let full = k.wanted.len() >= MAX_CACHED;
        match k.wanted.get_mut(&id) {
            // The latest process seen in it: the likeliest to be alive
            // when the thread asks (a lookup without one, the socket
            // table's, must not stand in for a later event's).
            Some(asked) if pid != 0 => *asked = pid,
            Some(_) => {}
            None if full => return Lookup::Unknown,
            None => {
                k.wanted.insert(id, pid);
            }
        }
        drop(k);
        // Full: a wake is already queued, and it reads this id too.
        let _ = wake.try_send(());
        Lookup::Pending
    }

    /// The owner of `id` if it is known now (asking for it otherwise).
    #[must_use]
    pub fn known(&self, id: u64, pid: u32) -> Option<Arc<Owner>> {
        match self.lookup(id, pid) {
            Lookup::Found(o) => Some(o),
            Lookup::Pending | Lookup::Unknown => None,
        }
    }

    /// Fires after the walking thread has answered (a process or a walk).
    #[must_use]
    pub fn walked(&self) -> Arc<Notify> {
        Arc::clone(&self.walked)
    }

    /// Walks of the whole cgroup tree so far.
    #[must_use]
    pub fn scans(&self) -> u64 {
        lock(&self.known).scans
    }
}

/// The walking thread: answers wanted ids until the resolver is dropped.
fn walker(root: &Path, proc: &Path, known: &Mutex<Known>, wake: &Receiver<()>, walked: &Notify) {
    let mut last_walk: Option<Instant> = None;
    // Some wanted id waits for the walk the interval still holds back.
    let mut waiting = false;
    loop {
        let woken = if waiting {
            let wait = last_walk.map_or(Duration::ZERO, |t| RESCAN_EVERY.saturating_sub(t.elapsed()));
            !matches!(wake.recv_timeout(wait), Err(RecvTimeoutError::Disconnected))
        } else {
            wake.recv().is_ok()
        };
        if !woken {
            return;
        }
        let asked: Vec<(u64, u32)> = lock(known).wanted.iter().map(|(&id, &pid)| (id, pid)).collect();
        let told: Vec<(u64, String)> =
            asked.iter().filter_map(|&(id, pid)| Some((id, by_process(root, proc, id, pid)?))).collect();
        let rest: Vec<u64> = {
            let mut k = lock(known);
            for (id, path) in &told {
                k.wanted.remove(id);
                k.add(*id, path);
            }
            k.wanted.keys().copied().collect()
        };
        waiting = !rest.is_empty() && last_walk.is_some_and(|t| t.elapsed() < RESCAN_EVERY);
        if rest.is_empty() || waiting {
            if !told.is_empty() {
                walked.notify_one();
            }
            continue;
        }
        // Only ids asked for before the walk began can be called gone: a
        // cgroup made during the walk may sit where it had already passed.
        last_walk = Some(Instant::now());
        let tree = walk(root);
        let mut k = lock(known);
        k.scans += 1;
        k.cache.retain(|id, _| tree.contains_key(id));
        for id in rest {
            k.wanted.remove(&id);
            match tree.get(&id) {
                Some(path) => k.add(id, path),
                None => k.miss(id),
            }
        }
        for (id, path) in &tree {
            if k.cache.len() >= MAX_CACHED {
                break;
            }
            if !k.cache.contains_key(id) {
                k.add(*id, path);
            }
        }
        drop(k);
        walked.notify_one();
    }
}

/// The cgroup path of `pid`'s cgroup if it is still cgroup `id`: the v2
/// line (`0::PATH`) of `/proc/PID/cgroup`, checked against the inode of
/// that directory under `root` (a process that moved, or a path written
/// from another cgroup namespace, fails the check and is left to a walk).
fn by_process(root: &Path, proc: &Path, id: u64, pid: u32) -> Option<String> {
    if pid == 0 {
        return None;
    }
    // The file is a few lines; more than 4 KiB is not a cgroup file.
    let text = crate::files::read_text(&proc.join(pid.to_string()).join("cgroup"), 4096).ok()?;
    let path = text.lines().find_map(|l| l.strip_prefix("0::"))?.trim_end();
    if !path.starts_with('/') || path.split('/').any(|c| c == "..") {
        return None;
    }
    let ino = std::fs::metadata(root.join(path.trim_start_matches('/'))).ok()?.ino();
    (ino == id).then(|| path.to_owned())
}

/// Every directory of the tree under `root` by inode, as a path relative
/// to it (at most [`MAX_SCAN`]).
fn walk(root: &Path) -> HashMap<u64, String> {
    let mut found = HashMap::new();
    let mut stack = vec![(root.to_owned(), String::from("/"))];
    while let Some((dir, rel)) = stack.pop() {
        if found.len() >= MAX_SCAN {
            break;
        }
        let Ok(meta) = std::fs::metadata(&dir) else { continue };
        found.insert(meta.ino(), rel.clone());
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                let name = entry.file_name().to_string_lossy().into_owned();
                let child = if rel == "/" { format!("/{name}") } else { format!("{rel}/{name}") };
                stack.push((entry.path(), child));
            }
        }
    }
    found
}

//! Which client runtime a process is, where that can be told reliably, so
//! the fix can name the setting in the client's own terms
//! ([`crate::diagnosis::clients`]). No guessing beyond what the process shows:
//!
//! - a Go binary carries its build info (`\xff Go buildinf:`, Go 1.18+
//!   inline format, in its `.go.buildinfo` section: only the ELF headers
//!   of a non-Go executable are read);
//!   the standard library's HTTP pool shows by its function names, which
//!   stay in the binary even when stripped (`pclntab`);
//! - `java`, `node`, `python3`, `nginx`, `haproxy` and `envoy` by the
//!   executable's name; for a JVM, the jar files of the class path it was
//!   started with (`-cp`, `-classpath`, `--class-path`, a `dir/*`
//!   wildcard listed) name the pool libraries (`OkHttp`, Apache
//!   `HttpClient`, `HikariCP`, grpc-java by its `grpc-api` jar), never a
//!   substring of the command line (`-Djdk.httpclient...` names no
//!   library); the JDK's own `java.net.http` client by its threads
//!   (`HttpClient-N-SelectorManager`, one per client, whatever executor it
//!   runs on), and the JDK's major version by the `release` file beside
//!   the executable; for Python, the mapped extension modules (grpcio's
//!   `cygrpc`); a Go binary shows grpc-go by its `ClientConn` functions.
//!   grpc-js in Node cannot be told (no mapping or symbol shows it): the
//!   generic rule.
//!
//! A process's command line, thread names and name are readable by any
//! user. Its executable (`/proc/PID/exe`) and mappings (`/proc/PID/maps`)
//! are not, for another user's process, without `CAP_SYS_PTRACE`, which
//! the shipped unit and `DaemonSet` do not grant: a Go binary, and
//! grpcio in Python, are then not told, and the runtime says so
//! ([`ClientRuntime::unreadable`]) instead of passing for a runtime with
//! no pool library.
//!
//! Rooms: this file says what a process is from what anyone may read
//! (its name, a Python process's mappings) and hands a JVM to [`jvm`]
//! and a Go executable to [`elf`]; [`resolver`] tells processes off the
//! event path and caches them.

mod elf;
mod jvm;
mod resolver;

use std::os::unix::ffi::OsStrExt as _;

use serde::{Deserialize, Serialize};

pub use elf::EXE_CHUNK_BYTES;
pub use resolver::{Process, Runtimes, MAX_CACHED};

/// A client runtime and the pool libraries found in it.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClientRuntime {
    /// `go`, `jvm`, `node`, `python`, `nginx`, `haproxy`, `envoy`.
    pub runtime: String,
    /// Pool libraries seen: `net/http`, `database/sql`, `pgx`, `grpc-go`
    /// (Go); `okhttp`, `httpclient`, `hikaricp`, `grpc-java`,
    /// `java.net.http` (JVM); `grpcio` (Python).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub libraries: Vec<String>,
    /// The runtime's major version where it decides a default (the JDK's:
    /// `17`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<u32>,
    /// What would tell the runtime or its libraries (the executable, the
    /// mappings) was not readable with the daemon's capabilities: another
    /// user's process without `CAP_SYS_PTRACE`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub unreadable: bool,
}

impl ClientRuntime {
    /// What an event carries for a process whose runtime could not be
    /// told (no catalog entry fits: the generic rule applies).
    #[must_use]
    pub fn unknown() -> Self {
        Self { runtime: UNKNOWN.to_owned(), ..Self::default() }
    }

    /// A process whose executable the daemon may not read: its runtime is
    /// unknown for want of capabilities, not because none fits.
    #[must_use]
    pub fn unreadable() -> Self {
        Self { runtime: UNKNOWN.to_owned(), unreadable: true, ..Self::default() }
    }

    #[must_use]
    pub fn is_unknown(&self) -> bool {
        self.runtime == UNKNOWN
    }
}

/// [`ClientRuntime::runtime`] of a process that could not be told.
pub const UNKNOWN: &str = "unknown";

/// Python pool libraries a process's mappings show: (name, what their
/// shared object is called). grpcio's C core is a mapped extension module.
const PYTHON_LIBRARIES: &[(&str, &str)] = &[("grpcio", "cygrpc")];

/// `/proc/PID/maps` read at most this far (a Python process's is a few
/// hundred KiB at most).
const MAX_MAPS_BYTES: u64 = 4 << 20;

/// A process as the kernel lists it (the `iter/task_vma` program) where
/// its `/proc/PID/exe` and `/proc/PID/maps` are closed to the daemon: its
/// executable, and the names of the files it maps.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Listed {
    pub exe: Option<KernelPath>,
    pub mapped: Vec<String>,
}

impl Listed {
    /// From the kernel's records: the executable's (marked
    /// [`observer_common::MappedFile::EXECUTABLE`]) and one name per mapping.
    #[must_use]
    pub fn of(records: &[observer_common::MappedFile]) -> Self {
        let mut listed = Self::default();
        for rec in records {
            if rec.flags & observer_common::MappedFile::EXECUTABLE != 0 {
                listed.exe = listed.exe.or_else(|| KernelPath::of(rec));
            } else if let Some(name) =
                names(rec).and_then(|n| n.first().map(|n| String::from_utf8_lossy(n).into_owned()))
            {
                listed.mapped.push(name);
            }
        }
        listed
    }

    /// Whether the kernel listed anything: a process that exited, or is
    /// not in the daemon's pid namespace, lists nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.exe.is_none() && self.mapped.is_empty()
    }
}

/// A record's names, leaf first, mount crossings (empty names) left out;
/// `None` when a name filled its slot (it may have been cut).
fn names(rec: &observer_common::MappedFile) -> Option<Vec<&[u8]>> {
    let depth = usize::try_from(rec.depth).ok()?;
    let mut out = Vec::new();
    for name in rec.names.get(..depth)? {
        let len = name.iter().position(|&b| b == 0)?;
        if len > 0 {
            out.push(&name[..len]);
        }
    }
    Some(out)
}

/// The executable's path as the kernel walked it, with its device and
/// inode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelPath {
    /// The path from the root of the process's mount namespace.
    pub path: std::path::PathBuf,
    /// The file system's device (major, minor) and the file's inode: the
    /// path is used only if the file the daemon opens there is this one.
    pub dev: (u32, u32),
    pub ino: u64,
}

impl KernelPath {
    /// From the kernel's record of the executable (its names, leaf first,
    /// joined root first); `None` when the walk did not reach the root, or
    /// a name filled its slot (it may have been cut).
    #[must_use]
    pub fn of(rec: &observer_common::MappedFile) -> Option<Self> {
        if rec.flags & observer_common::MappedFile::WHOLE_PATH == 0 {
            return None;
        }
        let names = names(rec)?;
        if names.is_empty() {
            return None;
        }
        let mut path = Vec::new();
        for name in names.iter().rev() {
            path.push(b'/');
            path.extend_from_slice(name);
        }
        Some(Self {
            path: std::path::PathBuf::from(std::ffi::OsStr::from_bytes(&path)),
            // The kernel's own `dev_t`: MAJOR << 20 | MINOR.
            dev: (rec.dev >> 20, rec.dev & 0xf_ffff),
            ino: rec.ino,
        })
    }

    /// The file at this path, if it is the kernel's one (same device and
    /// inode): a path from another mount namespace (a container's) may
    /// name another file, or none, from the daemon's.
    #[must_use]
    pub fn open(&self) -> Option<std::fs::File> {
        use std::os::unix::fs::MetadataExt as _;
        let f = std::fs::File::open(&self.path).ok()?;
        let m = f.metadata().ok()?;
        let dev = (libc::major(m.dev()), libc::minor(m.dev()));
        (dev == self.dev && m.ino() == self.ino).then_some(f)
    }
}

/// Lists a process from the kernel (by pid), for the processes whose
/// `/proc` the daemon may not read.
pub type KernelFiles = Box<dyn FnMut(u32) -> std::io::Result<Listed> + Send>;

/// What a process shows of its executable and mappings: from its `/proc`
/// where that is readable, else from the kernel's list.
struct Shown {
    /// The executable's path, and the file itself when it may be read.
    exe: Option<std::path::PathBuf>,
    exe_file: Option<std::fs::File>,
    /// The mapped files' paths; `None` when neither source could say.
    maps: Option<String>,
    /// The executable could not be read, for want of capabilities.
    refused: bool,
}

impl Shown {
    fn of(pid: u32, comm: &str, kernel: Option<&mut KernelFiles>) -> Self {
        let exe = std::fs::read_link(format!("/proc/{pid}/exe"));
        let refused = exe.as_ref().is_err_and(|e| e.kind() == std::io::ErrorKind::PermissionDenied);
        if !refused {
            return Self {
                exe_file: exe.is_ok().then(|| std::fs::File::open(format!("/proc/{pid}/exe")).ok()).flatten(),
                exe: exe.ok(),
                maps: proc_maps(pid),
                refused: false,
            };
        }
        // Nothing listed (the process exited, or is not in the daemon's
        // pid namespace) tells nothing: never "no library".
        let Some(listed) = kernel.and_then(|k| k(pid).ok()).filter(|l| !l.is_empty()) else {
            return Self { exe: None, exe_file: None, maps: None, refused: true };
        };
        let exe_file = listed.exe.as_ref().and_then(KernelPath::open);
        log::debug!(
            "process {pid} ({comm}): executable {:?} and {} mapped files from the kernel, {}",
            listed.exe.as_ref().map(|e| &e.path),
            listed.mapped.len(),
            if exe_file.is_some() { "opened as the same file" } else { "not opened" }
        );
        Self {
            // A path not verified names nothing: it may be another file.
            exe: listed.exe.filter(|_| exe_file.is_some()).map(|e| e.path),
            refused: exe_file.is_none(),
            exe_file,
            maps: Some(listed.mapped.join("\n")),
        }
    }
}

/// `/proc/PID/maps`; `None` when it is not readable (another user's
/// process without `CAP_SYS_PTRACE`). A process that exited has nothing
/// to read either, and shows no mapping.
fn proc_maps(pid: u32) -> Option<String> {
    use std::io::Read as _;
    let mut maps = Vec::new();
    let read =
        std::fs::File::open(format!("/proc/{pid}/maps")).and_then(|f| f.take(MAX_MAPS_BYTES).read_to_end(&mut maps));
    if let Err(e) = read {
        return (e.kind() != std::io::ErrorKind::PermissionDenied).then(String::new);
    }
    Some(String::from_utf8_lossy(&maps).into_owned())
}

/// The libraries from `table` whose shared objects `maps` lists.
fn mapped(maps: &str, table: &[(&str, &str)]) -> Vec<String> {
    table.iter().filter(|(_, n)| maps.contains(n)).map(|(l, _)| (*l).to_owned()).collect()
}

/// The runtime a process name alone tells.
fn by_name(name: &str) -> Option<&'static str> {
    Some(match name {
        "java" => "jvm",
        "node" | "nodejs" => "node",
        "nginx" => "nginx",
        "haproxy" => "haproxy",
        "envoy" => "envoy",
        n if n == "python" || n.starts_with("python3") || n.starts_with("python2") => "python",
        _ => return None,
    })
}

/// The process's name as `ps` shows it: its main thread's name
/// (`/proc/PID/comm`, readable without `CAP_SYS_PTRACE`). The kernel's
/// events carry the writing thread's, which for a multithreaded client is
/// a worker's (`wrk:worker_0` in Envoy, `event_engine` in grpcio,
/// `HttpClient-1-Wo` in a JDK client).
#[must_use]
pub fn process_name(pid: u32) -> Option<String> {
    let comm = std::fs::read(format!("/proc/{pid}/comm")).ok()?;
    let name = String::from_utf8_lossy(&comm).trim_end_matches('\n').to_owned();
    (!name.is_empty()).then_some(name)
}

/// What a process shows: by its executable's name, its build info, or its
/// command line (`comm`: the process's name). Where its `/proc` is not
/// readable, `kernel` lists its mapped files instead. A process whose
/// executable could still not be read is told by its name where that
/// suffices, and otherwise is [`ClientRuntime::unreadable`].
#[must_use]
pub fn of_process(pid: u32, comm: &str, kernel: Option<&mut KernelFiles>) -> Option<ClientRuntime> {
    let shown = Shown::of(pid, comm, kernel);
    let base = shown.exe.as_ref().and_then(|p| p.file_name()).map(|n| n.to_string_lossy().into_owned());
    let name = base.as_deref().unwrap_or(comm);
    if let Some(runtime) = by_name(name).or_else(|| by_name(comm)) {
        return Some(match runtime {
            "jvm" => jvm::jvm(pid, shown.exe.as_deref()),
            "python" => ClientRuntime {
                runtime: runtime.into(),
                unreadable: shown.maps.is_none(),
                libraries: shown.maps.as_deref().map(|m| mapped(m, PYTHON_LIBRARIES)).unwrap_or_default(),
                version: None,
            },
            _ => ClientRuntime { runtime: runtime.into(), ..ClientRuntime::default() },
        });
    }
    if shown.refused {
        return Some(ClientRuntime::unreadable());
    }
    elf::of_elf(shown.exe_file.as_ref()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_tell_interpreters_and_proxies() {
        for (n, r) in
            [("java", "jvm"), ("node", "node"), ("python3.11", "python"), ("nginx", "nginx"), ("envoy", "envoy")]
        {
            assert_eq!(by_name(n), Some(r), "{n}");
        }
        assert_eq!(by_name("curl"), None);
        assert_eq!(by_name("pythonista"), None);
    }

    fn record(names: &[&[u8]], flags: u32) -> observer_common::MappedFile {
        let mut rec = observer_common::MappedFile {
            tgid: 7,
            flags,
            ino: 1234,
            dev: (259 << 20) | 3,
            depth: u32::try_from(names.len()).unwrap(),
            names: [[0; observer_common::MAPPED_NAME_BYTES]; observer_common::MAPPED_DEPTH],
        };
        for (slot, name) in rec.names.iter_mut().zip(names) {
            slot[..name.len()].copy_from_slice(name);
        }
        rec
    }

    /// The kernel's records: the executable's names leaf first, joined
    /// root first, its `dev_t` split as `stat` splits it; a mapping's name
    /// alone; no path from a walk that did not reach the root, or with a
    /// name that filled its slot (maybe cut).
    #[test]
    fn the_kernels_records_are_a_listed_process() {
        use observer_common::MappedFile;
        let exe = MappedFile::WHOLE_PATH | MappedFile::EXECUTABLE;
        let listed = Listed::of(&[
            record(&[b"gopool", b"bin", b"", b"usr"], exe),
            record(&[b"cygrpc.cpython-311-x86_64-linux-gnu.so"], 0),
            record(&[&[b'a'; 64]], 0),
        ]);
        let e = listed.exe.clone().unwrap();
        assert_eq!(e.path, std::path::Path::new("/usr/bin/gopool"), "a mount crossed between bin and usr");
        assert_eq!((e.dev, e.ino), ((259, 3), 1234));
        assert_eq!(listed.mapped, ["cygrpc.cpython-311-x86_64-linux-gnu.so"], "a name that may be cut is left out");
        assert!(!listed.is_empty() && Listed::of(&[]).is_empty());
        assert_eq!(KernelPath::of(&record(&[b"gopool", b"bin"], MappedFile::EXECUTABLE)), None, "the root not reached");
        assert_eq!(KernelPath::of(&record(&[], exe)), None, "the root itself is no file");
        assert_eq!(KernelPath::of(&record(&[b""], exe)), None, "nor a mount's root");
        assert_eq!(KernelPath::of(&record(&[&[b'a'; 64], b"lib"], exe)), None, "a name that may be cut");
    }

    /// A path is used only if the file opened there is the kernel's one:
    /// the same path in another mount namespace may be another file.
    #[test]
    fn a_kernel_path_opens_only_the_kernels_file() {
        use std::os::unix::fs::MetadataExt as _;
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::write(&a, b"a").unwrap();
        std::fs::write(&b, b"b").unwrap();
        let meta = std::fs::metadata(&a).unwrap();
        let dev = (libc::major(meta.dev()), libc::minor(meta.dev()));
        let same = KernelPath { path: a.clone(), dev, ino: meta.ino() };
        assert!(same.open().is_some());
        let other = KernelPath { path: b, ..same.clone() };
        assert!(other.open().is_none(), "another inode at that path");
        let elsewhere = KernelPath { dev: (dev.0 + 1, dev.1), ..same };
        assert!(elsewhere.open().is_none(), "another device");
    }

    /// The Python libraries a list of mapped files shows, from either
    /// source (`/proc/PID/maps` lines or the kernel's names).
    #[test]
    fn mapped_libraries_come_from_either_source() {
        let proc_line = "7f00-7f10 r-xp 0 08:01 5 /usr/lib/python3/dist-packages/grpc/_cython/cygrpc.cpython-311-x86_64-linux-gnu.so";
        assert_eq!(mapped(proc_line, PYTHON_LIBRARIES), vec!["grpcio"]);
        assert_eq!(mapped("/usr/bin/python3.11\n/usr/lib/libc.so.6\n", PYTHON_LIBRARIES), Vec::<String>::new());
    }
}

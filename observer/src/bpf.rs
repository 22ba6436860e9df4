//! The only module that touches aya: loads the embedded eBPF object, chooses
//! and attaches the probe set for this kernel, and hands out typed events,
//! loss counters and the per-socket table. Dropping [`Probes`] detaches and
//! unloads everything (nothing is pinned).

use std::{io, os::fd::AsFd, path::Path};

use aya::{
    maps::{HashMap as BpfHashMap, MapData, PerCpuArray, RingBuf},
    programs::{RawTracePoint, TracePoint},
    Ebpf, EbpfLoader,
};
use observer_common::{counter, globals, maps, SockState};

use crate::event::{decode_bytes, Clock, DecodeError, SockEvent};

/// The eBPF object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer"));

/// What can go wrong bringing the probes up.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("this observer binary was built with AYA_BUILD_SKIP=1 and carries no eBPF object; build it with `cargo xtask run` (or `cargo build` after `cargo xtask setup`)")]
    NoObject,
    #[error("observer needs root (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN); run it with sudo or as root")]
    NotRoot,
    #[error("the kernel lacks the tracepoint {0}; observer needs Linux 6.5 or newer")]
    MissingTracepoint(String),
    #[error("mounting {what} at {path}: {source}; mount it by hand (`mount -t {what} {what} {path}`)")]
    Mount { what: &'static str, path: &'static str, source: io::Error },
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    #[error("program {name}: {source}")]
    Program { name: &'static str, source: aya::programs::ProgramError },
    #[error("map {0} missing from the eBPF object")]
    MissingMap(&'static str),
    #[error("map {name}: {source}")]
    Map { name: &'static str, source: aya::maps::MapError },
    #[error("invalid setting: {0}")]
    Setting(String),
}

/// Load-time settings for the probes.
#[derive(Debug, Clone)]
pub struct ProbeConfig {
    /// Minimum idle time before a write counts as a reuse.
    pub min_idle_ns: u64,
    /// How long a retransmitted reuse may go unanswered before it is a stall.
    pub stall_after_ns: u64,
    /// Capacity of the per-socket table.
    pub max_sockets: u32,
    /// Ring buffer size in bytes (a power of two, multiple of the page size).
    pub ring_buffer_bytes: u32,
    /// Also attach empty programs on the hot-path hooks (benchmarks).
    pub bench_empty: bool,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            min_idle_ns: 1_000_000_000,
            stall_after_ns: 1_000_000_000,
            max_sockets: 65_536,
            ring_buffer_bytes: 1 << 20,
            bench_empty: false,
        }
    }
}

/// How a program attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookKind {
    /// Classic tracepoint (`category:name`), arguments from the trace record.
    TracePoint,
    /// Raw tracepoint (`name`), arguments are the `TP_PROTO` values; cheaper.
    RawTracePoint,
}

/// A tracepoint the probe set attaches.
#[derive(Debug, Clone, Copy)]
pub struct Hook {
    /// Program name in the object.
    pub program: &'static str,
    pub kind: HookKind,
    pub category: &'static str,
    pub name: &'static str,
}

impl Hook {
    const fn tp(category: &'static str, name: &'static str) -> Self {
        Self { program: name, kind: HookKind::TracePoint, category, name }
    }

    const fn raw(category: &'static str, name: &'static str) -> Self {
        Self { program: name, kind: HookKind::RawTracePoint, category, name }
    }
}

/// Hooks for kernels with the `tcp_sendmsg_locked` and `sock_recv_length`
/// tracepoints (6.5+). A fallback set for older kernels (kprobes on
/// `tcp_sendmsg`/`tcp_recvmsg`) would be a second list chosen in
/// [`ProbeSet::detect`]; nothing downstream depends on which set runs.
const TRACEPOINTS_6_5: &[Hook] = &[
    Hook::tp("sock", "inet_sock_set_state"),
    Hook::raw("tcp", "tcp_sendmsg_locked"),
    Hook::raw("sock", "sock_recv_length"),
    Hook::tp("tcp", "tcp_receive_reset"),
    Hook::tp("tcp", "tcp_retransmit_skb"),
    Hook::tp("tcp", "tcp_destroy_sock"),
    Hook::tp("sock", "inet_sk_error_report"),
];

/// Empty programs for benchmarks (`--bench-empty-probes`).
const BENCH_EMPTY: &[Hook] = &[
    Hook { program: "bench_empty_send", kind: HookKind::RawTracePoint, category: "tcp", name: "tcp_sendmsg_locked" },
    Hook { program: "bench_empty_recv", kind: HookKind::RawTracePoint, category: "sock", name: "sock_recv_length" },
];

/// The set of hooks chosen for the running kernel.
#[derive(Debug, Clone, Copy)]
pub enum ProbeSet {
    /// Tracepoints and raw tracepoints only (kernel 6.5+).
    Tracepoints,
}

const TRACEFS: &str = "/sys/kernel/tracing";
const BPFFS: &str = "/sys/fs/bpf";

impl ProbeSet {
    /// Choose the probe set from what the kernel offers.
    pub fn detect() -> Result<Self, BpfError> {
        for hook in TRACEPOINTS_6_5 {
            let p = format!("{TRACEFS}/events/{}/{}", hook.category, hook.name);
            if !Path::new(&p).exists() {
                return Err(BpfError::MissingTracepoint(format!("{}:{}", hook.category, hook.name)));
            }
        }
        Ok(Self::Tracepoints)
    }

    #[must_use]
    pub const fn hooks(self) -> &'static [Hook] {
        match self {
            Self::Tracepoints => TRACEPOINTS_6_5,
        }
    }
}

/// Kernel-side loss and bookkeeping counters (summed over CPUs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelCounters {
    /// Events lost because the ring buffer was full.
    pub ringbuf_full: u64,
    /// Sockets not tracked because the socket table was full.
    pub map_full: u64,
    /// Reuses that ended without any outcome (one-way writes, early close).
    pub reuse_unresolved: u64,
}

/// One attached probe, for logs and tests.
#[derive(Debug, Clone)]
pub struct Attached {
    pub hook: Hook,
    /// Kernel program id (as `bpftool prog list` shows it).
    pub prog_id: u32,
}

/// Loaded and attached probes.
pub struct Probes {
    ebpf: Ebpf,
    ring: RingBuf<MapData>,
    counters: PerCpuArray<MapData, u64>,
    attached: Vec<Attached>,
    clock: Clock,
}

fn is_mounted(path: &str, fstype: &str) -> bool {
    std::fs::read_to_string("/proc/self/mounts").is_ok_and(|m| {
        m.lines().any(|l| l.split_whitespace().nth(1) == Some(path) && l.split_whitespace().nth(2) == Some(fstype))
    })
}

fn mount(what: &'static str, path: &'static str) -> Result<bool, BpfError> {
    if is_mounted(path, what) {
        return Ok(false);
    }
    let c = |s: &str| std::ffi::CString::new(s).map_err(|e| BpfError::Setting(e.to_string()));
    let (src, target, fstype) = (c(what)?, c(path)?, c(what)?);
    // SAFETY: valid NUL-terminated strings, no data argument.
    let rc = unsafe { libc::mount(src.as_ptr(), target.as_ptr(), fstype.as_ptr(), 0, std::ptr::null()) };
    if rc != 0 {
        return Err(BpfError::Mount { what, path, source: io::Error::last_os_error() });
    }
    Ok(true)
}

/// Mount tracefs and bpffs when missing. Returns what was mounted.
pub fn ensure_filesystems() -> Result<Vec<&'static str>, BpfError> {
    let mut done = Vec::new();
    if mount("tracefs", TRACEFS)? {
        done.push(TRACEFS);
    }
    if mount("bpf", BPFFS)? {
        done.push(BPFFS);
    }
    Ok(done)
}

/// Raise `RLIMIT_MEMLOCK` for kernels that still charge BPF memory to it.
/// Returns false when it could not (harmless on 5.11+ memcg accounting).
#[must_use]
pub fn raise_memlock() -> bool {
    let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: valid rlimit pointer.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const lim) == 0 }
}

impl Probes {
    /// Load the embedded object with `config` and attach the probe set.
    pub fn load(config: &ProbeConfig) -> Result<Self, BpfError> {
        if OBJECT.is_empty() {
            return Err(BpfError::NoObject);
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(BpfError::NotRoot);
        }
        if !config.ring_buffer_bytes.is_power_of_two() || config.ring_buffer_bytes < 4096 {
            return Err(BpfError::Setting(format!(
                "ring buffer size {} must be a power of two and at least 4096 bytes",
                config.ring_buffer_bytes
            )));
        }
        if config.max_sockets == 0 {
            return Err(BpfError::Setting("max sockets must be at least 1".into()));
        }
        ensure_filesystems()?;
        let set = ProbeSet::detect()?;
        let mut ebpf = EbpfLoader::new()
            .override_global(globals::MIN_IDLE_NS, &config.min_idle_ns, true)
            .override_global(globals::STALL_AFTER_NS, &config.stall_after_ns, true)
            .map_max_entries(maps::SOCKS, config.max_sockets)
            .map_max_entries(maps::EVENTS, config.ring_buffer_bytes)
            .load(OBJECT)?;
        let mut attached = Vec::new();
        let empty: &[Hook] = if config.bench_empty { BENCH_EMPTY } else { &[] };
        for hook in set.hooks().iter().chain(empty) {
            let err = |source| BpfError::Program { name: hook.program, source };
            let prog = ebpf.program_mut(hook.program).ok_or(err(aya::programs::ProgramError::NotLoaded))?;
            let prog_id = match hook.kind {
                HookKind::TracePoint => {
                    let prog: &mut TracePoint = prog.try_into().map_err(err)?;
                    prog.load().map_err(err)?;
                    prog.attach(hook.category, hook.name).map_err(err)?;
                    prog.info().map_err(err)?.id()
                }
                HookKind::RawTracePoint => {
                    let prog: &mut RawTracePoint = prog.try_into().map_err(err)?;
                    prog.load().map_err(err)?;
                    prog.attach(hook.name).map_err(err)?;
                    prog.info().map_err(err)?.id()
                }
            };
            attached.push(Attached { hook: *hook, prog_id });
        }
        let ring = RingBuf::try_from(ebpf.take_map(maps::EVENTS).ok_or(BpfError::MissingMap(maps::EVENTS))?)
            .map_err(|source| BpfError::Map { name: maps::EVENTS, source })?;
        let counters =
            PerCpuArray::try_from(ebpf.take_map(maps::COUNTERS).ok_or(BpfError::MissingMap(maps::COUNTERS))?)
                .map_err(|source| BpfError::Map { name: maps::COUNTERS, source })?;
        Ok(Self { ebpf, ring, counters, attached, clock: Clock::now() })
    }

    /// The probes attached, in attach order.
    #[must_use]
    pub fn attached(&self) -> &[Attached] {
        &self.attached
    }

    /// A duplicate of the ring buffer's fd, to wait for readiness on.
    pub fn ring_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        self.ring.as_fd().try_clone_to_owned()
    }

    /// Decode every event waiting in the ring buffer, in order.
    pub fn drain(&mut self, mut f: impl FnMut(Result<SockEvent, DecodeError>)) -> usize {
        let mut n = 0;
        while let Some(item) = self.ring.next() {
            f(decode_bytes(&item, self.clock));
            n += 1;
        }
        n
    }

    /// Kernel counters, summed over CPUs.
    pub fn counters(&self) -> Result<KernelCounters, BpfError> {
        let sum = |i: u32| -> Result<u64, BpfError> {
            let v = self.counters.get(&i, 0).map_err(|source| BpfError::Map { name: maps::COUNTERS, source })?;
            Ok(v.iter().sum())
        };
        Ok(KernelCounters {
            ringbuf_full: sum(counter::RINGBUF_FULL)?,
            map_full: sum(counter::MAP_FULL)?,
            reuse_unresolved: sum(counter::REUSE_UNRESOLVED)?,
        })
    }

    /// Snapshot of the per-socket table: (socket id, state).
    pub fn sockets(&self) -> Result<Vec<(u64, SockState)>, BpfError> {
        let map = self.ebpf.map(maps::SOCKS).ok_or(BpfError::MissingMap(maps::SOCKS))?;
        let table: BpfHashMap<_, u64, SockState> =
            BpfHashMap::try_from(map).map_err(|source| BpfError::Map { name: maps::SOCKS, source })?;
        Ok(table.iter().filter_map(Result::ok).collect())
    }

    /// The clock used to convert kernel timestamps.
    #[must_use]
    pub const fn clock(&self) -> Clock {
        self.clock
    }
}

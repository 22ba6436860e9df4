//! The only module that touches aya: loads the embedded eBPF object with
//! kernel struct offsets resolved from the running kernel's BTF, chooses and
//! attaches the probe set for this kernel, and hands out typed events, loss
//! counters and the socket table. Dropping [`Probes`] detaches and unloads
//! everything (nothing is pinned).
//!
//! [`load`] (bringing the probes up: the object, the probe set, the
//! benchmarks' toggle), [`hooks`] (what attaches where, the probe set),
//! [`kernel`] (inspecting the running kernel), [`iter`] (the iterators aya
//! does not expose), [`files`] (a process's mapped files, listed by the
//! kernel). This file reads what the loaded probes give.

use std::{
    io,
    os::fd::AsFd,
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    Ebpf,
};
use observer_common::{counter, maps, DoomedRecord, SockRecord};

use crate::{
    kernel::btf::BtfError,
    kernel::event::{decode_bytes, Clock, DecodeError, FirstBytes, SockEvent},
};

mod files;
mod hooks;
mod iter;
mod kernel;
mod load;
mod losses;
mod netns;
mod watch;

pub use files::ProcessFiles;
use hooks::HotLink;
pub use hooks::{Hook, HookKind, ProbeSet};
use kernel::set_clock_offset;
pub use kernel::{check_capabilities, raise_memlock, refused_by_seccomp, resolve_offsets};
pub use load::ProbeConfig;

/// What can go wrong bringing the probes up.
#[derive(Debug, thiserror::Error)]
pub enum BpfError {
    #[error("this observer binary was built with AYA_BUILD_SKIP=1 and carries no eBPF object; build it with `cargo xtask run` (or `cargo build` after `cargo xtask setup`)")]
    NoObject,
    #[error("observer lacks {0}; run it as root, or grant CAP_BPF and CAP_PERFMON (e.g. systemd `AmbientCapabilities=CAP_BPF CAP_PERFMON CAP_NET_ADMIN`, or `setcap cap_bpf,cap_perfmon,cap_net_admin+ep` on the binary)")]
    MissingCapability(&'static str),
    #[error("the kernel lacks {0}, which observer needs (Linux 5.15 or newer with BTF)")]
    MissingHook(String),
    /// Neither send hook: no `tcp_sendmsg_locked` tracepoint and `fentry`
    /// refused (`hint` names the fix where one is known).
    #[error(
        "the kernel lacks both the tcp_sendmsg_locked tracepoint (6.16+) and fentry on {function} ({reason}), one of which observer needs{hint}"
    )]
    NoSendHook { function: &'static str, reason: String, hint: &'static str },
    #[error("kernel BTF: {0}")]
    Btf(#[from] BtfError),
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
    /// EPERM with the capabilities held, under a seccomp filter.
    #[error(
        "the kernel refused a call with EPERM although observer holds CAP_BPF and CAP_PERFMON, and this process runs under a seccomp filter that may refuse bpf(2) or perf_event_open(2): allow both (deploy/kubernetes/seccomp-observer.json does: podman/docker `--security-opt seccomp=FILE`, Kubernetes `seccompProfile` of type Localhost; systemd `SystemCallFilter=@system-service bpf perf_event_open`, as deploy/systemd/observer.service does); the refusal: {0}"
    )]
    SeccompRefused(Box<BpfError>),
    #[error("program {name}: {source}")]
    Program { name: &'static str, source: aya::programs::ProgramError },
    #[error("map {0} missing from the eBPF object")]
    MissingMap(&'static str),
    #[error("map {name}: {source}")]
    Map { name: &'static str, source: aya::maps::MapError },
    #[error("reading the socket table: {0}")]
    Iter(io::Error),
    #[error("invalid setting: {0}")]
    Setting(String),
}

/// Kernel-side loss and bookkeeping counters (summed over CPUs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KernelCounters {
    /// Events lost because the ring buffer was full.
    pub ringbuf_full: u64,
    /// Sockets not tracked because the kernel refused socket-local storage.
    pub map_full: u64,
    /// Reuses that ended without an outcome (unanswered within the bound,
    /// one-way writers, sockets that ended without a verdict).
    pub reuse_unresolved: u64,
    /// Dead sockets not entered in the doomed table (full).
    pub doomed_full: u64,
    /// Listening ports not entered in the listeners table (full).
    pub listeners_full: u64,
    /// Network namespaces not entered in the walked table (full).
    pub walked_netns_full: u64,
    /// Server idle closes the `CLOSED_IDLE` LRU map evicted before a late
    /// reuse could be seen on them.
    pub closed_idle_evicted: u64,
    /// Program runs the kernel skipped (`recursion_misses`).
    pub recursion_misses: u64,
    /// Client sockets reset or timed out idle before the failed-write
    /// hook was attached, whose error a syscall took before it came: a
    /// failed reuse or a discard, unknown which.
    pub failed_write_unseen: u64,
}

/// One attached probe, for logs and tests.
#[derive(Debug, Clone)]
pub struct Attached {
    pub hook: Hook,
    /// Loaded, and attached only while it is needed (the failed-write
    /// hook: see `watch`).
    pub on_demand: bool,
    /// Kernel program id (as `bpftool prog list` shows it).
    pub prog_id: u32,
}

/// Loaded and attached probes.
pub struct Probes {
    /// Link of the `iter/tcp` program; each read creates an iterator from it.
    iter_link: std::os::fd::OwnedFd,
    /// The dead sockets processes hold (`DOOMED`: socket id -> record).
    doomed: HashMap<MapData, u64, DoomedRecord>,
    /// Network namespaces whose listeners were walked (`WALKED_NETNS`).
    walked: netns::Walked,
    /// What the `CLOSED_IDLE` LRU map evicted.
    evictions: std::sync::Mutex<losses::Evictions>,
    /// Owns the programs and their links: dropping it detaches everything.
    ebpf: Ebpf,
    /// The failed-write hook, attached on demand (`tp_btf` set).
    failed_writes: Option<watch::FailedWriteWatch>,
    /// Whether the fields the task-VMA iterator reads are known.
    files_known: bool,
    /// The send and receive probes' links, kept only for
    /// [`Probes::toggle_hot_path`]; `None` while detached.
    hot: Vec<(&'static str, HookKind, Option<HotLink>)>,
    ring: RingBuf<MapData>,
    counters: PerCpuArray<MapData, u64>,
    clock_offset: Array<MapData, u64>,
    attached: Vec<Attached>,
    set: ProbeSet,
    clock: Clock,
    clock_sampled: Instant,
}

impl Probes {
    /// The probes attached, in attach order.
    #[must_use]
    pub fn attached(&self) -> &[Attached] {
        &self.attached
    }

    /// The probe set chosen for this kernel.
    #[must_use]
    pub const fn probe_set(&self) -> ProbeSet {
        self.set
    }

    /// A duplicate of the ring buffer's fd, to wait for readiness on.
    pub fn ring_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        self.ring.as_fd().try_clone_to_owned()
    }

    /// Decode every event waiting in the ring buffer, in order. The wall
    /// clock offset is resampled every second, so an NTP step moves later
    /// events with it.
    pub fn drain(&mut self, max: usize, mut f: impl FnMut(Result<SockEvent, DecodeError>)) -> usize {
        if self.clock_sampled.elapsed() >= Duration::from_secs(1) {
            self.clock = Clock::now();
            self.clock_sampled = Instant::now();
            // After a resume: the probes also refresh it, but a host with
            // no new connection and no quiet-spell request would not.
            if let Err(e) = set_clock_offset(&mut self.clock_offset) {
                log::warn!("{e}");
            }
        }
        let mut n = 0;
        while n < max {
            let Some(item) = self.ring.next() else { break };
            if item.get(std::mem::offset_of!(observer_common::Event, kind)) == Some(&observer_common::kind::WATCH) {
                drop(item);
                self.wake_failed_writes();
                continue;
            }
            let ev = decode_bytes(&item, self.clock);
            // First bytes that told nothing: parsed, dropped, no event.
            if matches!(&ev, Ok(e) if e.as_server_name().is_some_and(FirstBytes::tells_nothing)) {
                continue;
            }
            f(ev);
            n += 1;
        }
        n
    }

    /// A client socket whose next write fails waits (a `WATCH` record):
    /// attach the failed-write hook. A failure is logged, and the next
    /// tick tries again.
    fn wake_failed_writes(&mut self) {
        if let Some(w) = self.failed_writes.as_mut() {
            if let Err(e) = w.wake(&mut self.ebpf) {
                log::warn!("attaching the failed-write hook: {e}");
            }
        }
    }

    /// Once a second: attach the failed-write hook if a socket needs it,
    /// detach it once none has for a while.
    pub fn tend_failed_writes(&mut self) -> Result<(), BpfError> {
        match self.failed_writes.as_mut() {
            Some(w) => w.tend(&mut self.ebpf, Instant::now()),
            None => Ok(()),
        }
    }

    /// Whether the failed-write hook is attached now, and how many times
    /// it was; None where the send probe decides those writes (`fentry`).
    #[must_use]
    pub fn failed_write_hook(&self) -> Option<(bool, u64)> {
        self.failed_writes.as_ref().map(|w| (w.attached(), w.attaches()))
    }

    /// Kernel counters, summed over CPUs.
    pub fn counters(&self) -> Result<KernelCounters, BpfError> {
        let sum = |i: u32| -> Result<u64, BpfError> {
            let v = self.counters.get(&i, 0).map_err(|source| BpfError::Map { name: maps::COUNTERS, source })?;
            Ok(v.iter().sum())
        };
        let added = sum(counter::CLOSED_IDLE_ADDED)?;
        let mut evictions = self.evictions.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let closed_idle_evicted = match evictions.live_if_due() {
            Some(live) => evictions.update(added, sum(counter::CLOSED_IDLE_REMOVED)?, live),
            None => evictions.evicted(),
        };
        drop(evictions);
        Ok(KernelCounters {
            ringbuf_full: sum(counter::RINGBUF_FULL)?,
            map_full: sum(counter::MAP_FULL)?,
            reuse_unresolved: sum(counter::REUSE_UNRESOLVED)?,
            doomed_full: sum(counter::DOOMED_FULL)?,
            listeners_full: sum(counter::LISTENERS_FULL)?,
            walked_netns_full: self.walked.full,
            closed_idle_evicted,
            recursion_misses: losses::recursion_misses(&self.ebpf),
            failed_write_unseen: sum(counter::FAILED_WRITE_UNSEEN)?,
        })
    }

    /// Call `f` on every tracked TCP socket now, from the `iter/tcp`
    /// program; returns how many there were. A TCP iterator lists the
    /// network namespace it is created in, so one is created in each
    /// namespace a process uses (entering it takes `CAP_SYS_ADMIN`; without
    /// it only the daemon's own namespace is listed, and that is logged
    /// once). Records are decoded as they are read, 512 at a time: a host
    /// with 100k sockets would otherwise hold two 8 MB copies of the table
    /// at every refresh.
    pub fn for_each_socket(&mut self, mut f: impl FnMut(&SockRecord)) -> Result<usize, BpfError> {
        let mut n =
            iter::stream(iter::create(&self.iter_link).map_err(BpfError::Iter)?, &mut f).map_err(BpfError::Iter)?;
        self.walked.walked(iter::own_netns());
        let others = iter::other_netns();
        if let Some((path, e)) = &others.refused {
            self.walked.refused_once(&format!("reading {}: {e}", path.display()));
        }
        self.walked.forget_gone(&others.found);
        for (ns, inode) in others.found {
            match iter::create_in(&ns, &self.iter_link) {
                Ok(file) => {
                    n += iter::stream(file, &mut f).map_err(BpfError::Iter)?;
                    self.walked.walked(inode);
                }
                Err(e) => {
                    self.walked.refused_once(&format!("entering {}: {e}", ns.display()));
                    break;
                }
            }
        }
        Ok(n)
    }

    /// Call `f` on every client socket that is dead while a process still
    /// holds it (see `observer_common::DoomedRecord`); returns how many.
    /// The map covers every network namespace, reset sockets (which the
    /// TCP hash tables no longer hold) included. An entry removed while
    /// the map is walked is skipped.
    pub fn for_each_doomed(&self, mut f: impl FnMut(&DoomedRecord)) -> Result<usize, BpfError> {
        let mut n = 0;
        for item in &self.doomed {
            match item {
                Ok((_, rec)) => {
                    f(&rec);
                    n += 1;
                }
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(source) => return Err(BpfError::Map { name: maps::DOOMED, source }),
            }
        }
        Ok(n)
    }

    /// The clock used to convert kernel timestamps.
    #[must_use]
    pub const fn clock(&self) -> Clock {
        self.clock
    }
}

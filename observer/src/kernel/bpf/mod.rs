//! The only module that touches aya: loads the embedded eBPF object with
//! kernel struct offsets resolved from the running kernel's BTF, chooses and
//! attaches the probe set for this kernel, and hands out typed events, loss
//! counters and the socket table. Dropping [`Probes`] detaches and unloads
//! everything (nothing is pinned).
//!
//! [`hooks`] (what attaches where, the probe set), [`kernel`] (inspecting
//! the running kernel), [`iter`] (the socket iterator aya does not expose).

use std::{
    io,
    os::fd::AsFd,
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{BtfTracePoint, FEntry, Iter},
    Btf as AyaBtf, Ebpf, EbpfLoader,
};
use observer_common::{counter, globals, maps, DoomedRecord, SockRecord};

use crate::{
    kernel::btf::BtfError,
    kernel::event::{decode_bytes, Clock, DecodeError, FirstBytes, SockEvent},
};

mod hooks;
mod iter;
mod kernel;
mod losses;
mod netns;
mod watch;

pub use hooks::{Hook, HookKind, ProbeSet};
use hooks::{HotLink, BENCH_EMPTY, HOT_HOOKS, RECV, RECV_CAST};
pub use kernel::{check_capabilities, raise_memlock, refused_by_seccomp, resolve_offsets};
use kernel::{inspect_kernel, object_for, set_clock_offset, tick_ns};

/// Take map `name` out of the loaded object as its typed handle.
fn take_map<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
    ebpf: &mut Ebpf,
    name: &'static str,
) -> Result<T, BpfError> {
    T::try_from(ebpf.take_map(name).ok_or(BpfError::MissingMap(name))?).map_err(|source| BpfError::Map { name, source })
}

/// Load `object` with the load-time globals set from `config` and the
/// running kernel's offsets.
fn load_with_globals(
    config: &ProbeConfig,
    set: ProbeSet,
    offsets: &observer_common::Offsets,
    tcp_sock_btf_id: u64,
    object: &[u8],
) -> Result<Ebpf, BpfError> {
    Ok(EbpfLoader::new()
        .override_global(globals::MIN_IDLE_NS, &config.min_idle_ns, true)
        .override_global(globals::STALL_AFTER_NS, &config.stall_after_ns, true)
        .override_global(globals::ANSWER_WITHIN_NS, &config.answer_within_ns, true)
        .override_global(globals::OFFSETS, offsets, true)
        .override_global(globals::EMIT_CLOSED, &u64::from(config.emit_closed), true)
        .override_global(globals::TICK_NS, &tick_ns(), true)
        .override_global(globals::TCP_SOCK_BTF_ID, &tcp_sock_btf_id, true)
        .override_global(globals::RING_BYTES, &u64::from(config.ring_buffer_bytes), true)
        .override_global(globals::FAILED_WRITE_HOOK, &u64::from(set.on_demand().is_some()), true)
        .map_max_entries(maps::EVENTS, config.ring_buffer_bytes)
        .load(object)?)
}

/// The eBPF object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer"));

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

/// Load-time settings for the probes.
#[derive(Debug, Clone)]
#[allow(clippy::struct_excessive_bools, reason = "independent switches, each one command-line flag")]
pub struct ProbeConfig {
    /// Minimum idle time before a write counts as a reuse.
    pub min_idle_ns: u64,
    /// How long a retransmitted reuse may stay unacknowledged before it is a stall.
    pub stall_after_ns: u64,
    /// A request unanswered this long is dropped as unresolved.
    pub answer_within_ns: u64,
    /// Ring buffer size in bytes (a power of two, multiple of the page size).
    pub ring_buffer_bytes: u32,
    /// Emit `closed` events (they are only printed, with `--connections`).
    pub emit_closed: bool,
    /// Also attach empty programs on the hot-path hooks (benchmarks).
    pub bench_empty: bool,
    /// Let [`Probes::toggle_hot_path`] detach and re-attach the send and
    /// receive probes (benchmarks).
    pub bench_toggle: bool,
    /// Read a client connection's first bytes for the name it used (SNI,
    /// `Host`); `--no-names` turns it off and no user memory is read.
    pub names: bool,
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            min_idle_ns: 1_000_000_000,
            stall_after_ns: 1_000_000_000,
            answer_within_ns: 300_000_000_000,
            ring_buffer_bytes: 1 << 20,
            emit_closed: true,
            bench_empty: false,
            bench_toggle: false,
            names: true,
        }
    }
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
    /// Load the embedded object with `config` and attach the probe set.
    pub fn load(config: &ProbeConfig) -> Result<Self, BpfError> {
        Self::load_object(config).map_err(|e| {
            if refused_by_seccomp(&e) {
                BpfError::SeccompRefused(Box::new(e))
            } else {
                e
            }
        })
    }

    fn load_object(config: &ProbeConfig) -> Result<Self, BpfError> {
        if OBJECT.is_empty() {
            return Err(BpfError::NoObject);
        }
        check_capabilities()?;
        if !config.ring_buffer_bytes.is_power_of_two() || config.ring_buffer_bytes < 4096 {
            return Err(BpfError::Setting(format!(
                "ring buffer size {} must be a power of two and at least 4096 bytes",
                config.ring_buffer_bytes
            )));
        }
        let (set, offsets, cast) = inspect_kernel(config.names)?;
        let (object, tcp_sock_btf_id) = object_for(cast);
        // `EbpfLoader::new` parses the kernel's BTF for itself; the programs'
        // loads below need a copy of their own, parsed once the loader's is
        // gone.
        let mut ebpf = load_with_globals(config, set, &offsets, tcp_sock_btf_id, &object)?;
        drop(object);
        let kernel_btf = AyaBtf::from_sys_fs().map_err(|e| BpfError::MissingHook(format!("readable BTF ({e})")))?;
        // Before any probe runs: receive times are `CLOCK_MONOTONIC` plus
        // this offset.
        let mut clock_offset: Array<MapData, u64> = take_map(&mut ebpf, maps::CLOCK_OFFSET)?;
        set_clock_offset(&mut clock_offset)?;
        let mut attached = Vec::new();
        let mut hot = Vec::new();
        let mut iter_link = None;
        let empty: &[Hook] = if config.bench_empty { BENCH_EMPTY } else { &[] };
        // The kfunc variant only once its call is patched.
        let cast = tcp_sock_btf_id != 0;
        let hooks = set.hooks().into_iter().map(|h| if cast && h.program == RECV.program { RECV_CAST } else { h });
        for hook in hooks.chain(empty.iter().copied()) {
            let hook = &hook;
            // The real send and receive probes, not the empty ones beside them.
            let toggled = config.bench_toggle
                && HOT_HOOKS.contains(&hook.name)
                && !empty.iter().any(|e| e.program == hook.program);
            let err = |source| BpfError::Program { name: hook.program, source };
            let prog = ebpf.program_mut(hook.program).ok_or(err(aya::programs::ProgramError::NotLoaded))?;
            let prog_id = match hook.kind {
                HookKind::BtfTracePoint => {
                    let prog: &mut BtfTracePoint = prog.try_into().map_err(err)?;
                    prog.load(hook.name, &kernel_btf).map_err(err)?;
                    let link = prog.attach().map_err(err)?;
                    if toggled {
                        hot.push((hook.program, hook.kind, Some(HotLink::Tp(link))));
                    }
                    prog.info().map_err(err)?.id()
                }
                HookKind::FEntry => {
                    let refused = |e| fentry_refused(hook.name, &e);
                    let prog: &mut FEntry = prog.try_into().map_err(err)?;
                    prog.load(hook.name, &kernel_btf).map_err(refused)?;
                    let link = prog.attach().map_err(refused)?;
                    if toggled {
                        hot.push((hook.program, hook.kind, Some(HotLink::FEntry(link))));
                    }
                    prog.info().map_err(err)?.id()
                }
                HookKind::Iter => {
                    let prog: &mut Iter = prog.try_into().map_err(err)?;
                    prog.load(hook.name, &kernel_btf).map_err(err)?;
                    iter_link = Some(iter::link_create(prog.fd().map_err(err)?.as_fd()).map_err(BpfError::Iter)?);
                    prog.info().map_err(err)?.id()
                }
            };
            attached.push(Attached { hook: *hook, prog_id, on_demand: false });
        }
        let on_demand =
            set.on_demand().map(|h| watch::FailedWriteWatch::load(&mut ebpf, h, &kernel_btf)).transpose()?;
        let failed_writes = on_demand.map(|(watch, loaded)| {
            attached.push(loaded);
            watch
        });
        let iter_link =
            iter_link.ok_or(BpfError::Program { name: "iter_tcp", source: aya::programs::ProgramError::NotLoaded })?;
        let doomed = take_map(&mut ebpf, maps::DOOMED)?;
        let walked = netns::Walked::new(take_map(&mut ebpf, maps::WALKED_NETNS)?);
        let closed_idle = take_map(&mut ebpf, maps::CLOSED_IDLE)?;
        let ring = take_map(&mut ebpf, maps::EVENTS)?;
        let counters = take_map(&mut ebpf, maps::COUNTERS)?;
        Ok(Self {
            iter_link,
            doomed,
            walked,
            evictions: std::sync::Mutex::new(losses::Evictions::new(closed_idle)),
            ebpf,
            failed_writes,
            hot,
            ring,
            counters,
            clock_offset,
            attached,
            set,
            clock: Clock::now(),
            clock_sampled: Instant::now(),
        })
    }

    /// Detach the send and receive probes if they are attached, attach
    /// them again if not (`--bench-toggle`: a benchmark compares round
    /// trips with and without them inside one run). Returns whether they
    /// are attached now. While they are detached the state of busy sockets
    /// goes stale, so a few writes after re-attaching take the slow path.
    pub fn toggle_hot_path(&mut self) -> Result<bool, BpfError> {
        if self.hot.is_empty() {
            return Err(BpfError::Setting("the hot-path probes can be toggled only with --bench-toggle".into()));
        }
        let attach = self.hot.iter().all(|(_, _, link)| link.is_none());
        for (name, kind, link) in &mut self.hot {
            let name: &'static str = name;
            let err = |source| BpfError::Program { name, source };
            let prog = self.ebpf.program_mut(name).ok_or(err(aya::programs::ProgramError::NotLoaded))?;
            match (link.take(), attach) {
                (Some(HotLink::Tp(id)), false) => {
                    let prog: &mut BtfTracePoint = prog.try_into().map_err(err)?;
                    prog.detach(id).map_err(err)?;
                }
                (Some(HotLink::FEntry(id)), false) => {
                    let prog: &mut FEntry = prog.try_into().map_err(err)?;
                    prog.detach(id).map_err(err)?;
                }
                (None, true) if *kind == HookKind::FEntry => {
                    let prog: &mut FEntry = prog.try_into().map_err(err)?;
                    *link = Some(HotLink::FEntry(prog.attach().map_err(err)?));
                }
                (None, true) => {
                    let prog: &mut BtfTracePoint = prog.try_into().map_err(err)?;
                    *link = Some(HotLink::Tp(prog.attach().map_err(err)?));
                }
                (kept, _) => *link = kept,
            }
        }
        Ok(attach)
    }

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

/// `fentry` refused: kernels without BPF trampolines on kernel functions,
/// such as arm64 before 6.4 (no ftrace direct calls; seen on Debian 12's
/// arm64 6.1) and some hardened builds.
fn fentry_refused(function: &'static str, e: &dyn std::fmt::Display) -> BpfError {
    let hint = if cfg!(target_arch = "aarch64") {
        ": on arm64, fentry on a kernel function needs Linux 6.4 or newer (ftrace direct calls); \
         run a 6.4+ kernel, such as Debian 13's 6.12 or Ubuntu 24.04's 6.8"
    } else {
        " (Linux 5.15 or newer with BPF trampolines)"
    };
    BpfError::NoSendHook { function, reason: e.to_string(), hint }
}

#[cfg(test)]
mod tests {
    /// The object holds exactly the programs `observer_common::program`
    /// names, so the loader's names and the probes' functions cannot drift.
    #[test]
    fn the_object_holds_the_programs_named_in_common() {
        if super::OBJECT.is_empty() {
            eprintln!("built with AYA_BUILD_SKIP=1: no eBPF object to check");
            return;
        }
        let obj = aya_obj::Object::parse(super::OBJECT).expect("the embedded object parses");
        let mut found: Vec<&str> = obj.programs.keys().map(String::as_str).collect();
        let mut named: Vec<&str> = observer_common::program::ALL.to_vec();
        found.sort_unstable();
        named.sort_unstable();
        assert_eq!(found, named);
    }

    /// The coarse clocks' resolution is the kernel's `TICK_NSEC`.
    #[test]
    fn tick_is_the_kernels_jiffy() {
        let tick = super::tick_ns();
        assert!((1_000_000..=10_000_000).contains(&tick), "no jiffy length: {tick}");
        if let Some(hz) = crate::kernel::event::clock::kernel_hz() {
            let hz = u64::from(hz);
            assert_eq!(tick, (1_000_000_000 + hz / 2) / hz, "CONFIG_HZ={hz}");
        }
    }
}

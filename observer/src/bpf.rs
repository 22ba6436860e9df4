//! The only module that touches aya: loads the embedded eBPF object with
//! kernel struct offsets resolved from the running kernel's BTF, chooses and
//! attaches the probe set for this kernel, and hands out typed events, loss
//! counters and the socket table. Dropping [`Probes`] detaches and unloads
//! everything (nothing is pinned).

use std::{
    io,
    os::fd::AsFd,
    time::{Duration, Instant},
};

use aya::{
    maps::{Array, HashMap, MapData, PerCpuArray, RingBuf},
    programs::{fentry::FEntryLinkId, tp_btf::BtfTracePointLinkId, BtfTracePoint, FEntry, Iter},
    Btf as AyaBtf, Ebpf, EbpfLoader,
};
use observer_common::{counter, globals, kfunc, maps, DoomedRecord, Offsets, SockRecord};

use crate::{
    btf::{Btf, BtfError},
    event::{clock_ns, decode_bytes, Clock, DecodeError, SockEvent},
};

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
    #[error("kernel BTF: {0}")]
    Btf(#[from] BtfError),
    #[error("loading the eBPF object: {0}")]
    Load(#[from] aya::EbpfError),
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
        }
    }
}

/// How a program attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookKind {
    /// BTF-typed tracepoint (`tp_btf`, 5.5+).
    BtfTracePoint,
    /// `fentry` on a kernel function (5.5+, where the kernel allows it).
    FEntry,
    /// BPF iterator (`iter/tcp`, 5.9+), run on demand.
    Iter,
}

/// A hook the probe set attaches.
#[derive(Debug, Clone, Copy)]
pub struct Hook {
    /// Program name in the object.
    pub program: &'static str,
    pub kind: HookKind,
    /// Tracepoint or kernel function name.
    pub name: &'static str,
}

impl Hook {
    const fn tp(name: &'static str) -> Self {
        Self { program: name, kind: HookKind::BtfTracePoint, name }
    }
}

/// The receive probe: reaches `tcp_sock` by a helper call.
const RECV: Hook = Hook::tp("tcp_rcv_space_adjust");
/// The same on 6.2+, by the `bpf_rdonly_cast` kfunc (no call at all).
const RECV_CAST: Hook =
    Hook { program: "tcp_rcv_space_adjust_cast", kind: HookKind::BtfTracePoint, name: "tcp_rcv_space_adjust" };

/// Hooks every set shares: BTF tracepoints present since 4.16
/// (`tcp_destroy_sock` since 5.3).
const STATE_HOOKS: &[Hook] = &[
    Hook::tp("inet_sock_set_state"),
    RECV,
    Hook::tp("tcp_receive_reset"),
    Hook::tp("tcp_retransmit_skb"),
    Hook::tp("tcp_destroy_sock"),
];

/// Writes the kernel fails before sending, on the `tp_btf` set (6.3+):
/// the `tcp_sendmsg_locked` tracepoint never fires for them.
const SEND_ERROR_TP: Hook = Hook::tp("sock_send_length");

/// `late_reuse` on 6.16+: the `tcp_send_reset` tracepoint, which covers
/// time-wait sockets since 6.9.
const RESET_TP: Hook = Hook::tp("tcp_send_reset");
/// `late_reuse` before that: `fentry` on the functions that send the RST.
const RESET_FENTRY: &[Hook] = &[
    Hook { program: "fentry_tcp_v4_send_reset", kind: HookKind::FEntry, name: "tcp_v4_send_reset" },
    Hook { program: "fentry_tcp_v6_send_reset", kind: HookKind::FEntry, name: "tcp_v6_send_reset" },
];

/// The socket table, every set: `iter/tcp`.
const ITER: Hook = Hook { program: "iter_tcp", kind: HookKind::Iter, name: "tcp" };

/// Send hook on kernels with the `tcp_sendmsg_locked` tracepoint (6.16+).
const SEND_TP: Hook = Hook::tp("tcp_sendmsg_locked");
/// Send hook elsewhere: `fentry` on the same function.
const SEND_FENTRY: Hook =
    Hook { program: "fentry_tcp_sendmsg_locked", kind: HookKind::FEntry, name: "tcp_sendmsg_locked" };

/// The hot-path hooks (`--bench-toggle` detaches and re-attaches them).
const HOT_HOOKS: &[&str] = &["tcp_sendmsg_locked", "tcp_rcv_space_adjust"];

/// A hot-path probe's link, while attached.
enum HotLink {
    Tp(BtfTracePointLinkId),
    FEntry(FEntryLinkId),
}

/// Empty programs for benchmarks (`--bench-empty-probes`).
const BENCH_EMPTY: &[Hook] = &[
    Hook { program: "bench_empty_send", kind: HookKind::BtfTracePoint, name: "tcp_sendmsg_locked" },
    Hook { program: "bench_empty_recv", kind: HookKind::BtfTracePoint, name: "tcp_rcv_space_adjust" },
    Hook { program: "bench_empty_state", kind: HookKind::BtfTracePoint, name: "inet_sock_set_state" },
];

/// The set of hooks chosen for the running kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeSet {
    /// Every hook a BTF tracepoint (6.16+).
    TpBtf,
    /// Send hook by `fentry`, the rest BTF tracepoints (5.15+).
    FEntrySend,
}

impl ProbeSet {
    /// Choose the probe set from what the kernel's BTF offers (a BTF
    /// tracepoint exists as the type `btf_trace_<name>`; no tracefs needed,
    /// so this works without root). The reason is for the log.
    pub fn detect(btf: &Btf) -> Result<(Self, &'static str), BpfError> {
        for hook in STATE_HOOKS.iter().chain(std::iter::once(&RESET_TP)) {
            if !btf.has_type(&format!("btf_trace_{}", hook.name)) {
                return Err(BpfError::MissingHook(format!("the tracepoint {}", hook.name)));
            }
        }
        let tp = |h: &Hook| btf.has_type(&format!("btf_trace_{}", h.name));
        if tp(&SEND_TP) && tp(&SEND_ERROR_TP) {
            Ok((Self::TpBtf, "the tcp_sendmsg_locked tracepoint exists (6.16+)"))
        } else {
            Ok((
                Self::FEntrySend,
                "no tcp_sendmsg_locked tracepoint (before 6.16): fentry on tcp_sendmsg_locked and the RST senders",
            ))
        }
    }

    #[must_use]
    pub fn hooks(self) -> Vec<Hook> {
        let (send, reset): (&[Hook], &[Hook]) = match self {
            Self::TpBtf => (&[SEND_TP, SEND_ERROR_TP], std::slice::from_ref(&RESET_TP)),
            Self::FEntrySend => (std::slice::from_ref(&SEND_FENTRY), RESET_FENTRY),
        };
        send.iter()
            .copied()
            .chain(STATE_HOOKS.iter().copied())
            .chain(reset.iter().copied())
            .chain(std::iter::once(ITER))
            .collect()
    }

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::TpBtf => "tp_btf",
            Self::FEntrySend => "fentry_send",
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
}

/// One attached probe, for logs and tests.
#[derive(Debug, Clone)]
pub struct Attached {
    pub hook: Hook,
    /// Kernel program id (as `bpftool prog list` shows it).
    pub prog_id: u32,
}

/// Resolve every kernel field the programs read from the kernel's BTF.
pub fn resolve_offsets(btf: &Btf) -> Result<Offsets, BtfError> {
    let skc = |f| btf.offset("sock_common", f);
    let shutdown = btf.field("sock", "sk_shutdown")?;
    Ok(Offsets {
        skc_daddr: skc("skc_daddr")?,
        skc_rcv_saddr: skc("skc_rcv_saddr")?,
        skc_dport: skc("skc_dport")?,
        skc_num: skc("skc_num")?,
        skc_family: skc("skc_family")?,
        skc_v6_daddr: skc("skc_v6_daddr")?,
        skc_v6_rcv_saddr: skc("skc_v6_rcv_saddr")?,
        skc_flags: skc("skc_flags")?,
        sock_keepopen_bit: u64::try_from(btf.enum_value("sock_flags", "SOCK_KEEPOPEN")?)
            .map_err(|_| BtfError::NotFound("a non-negative SOCK_KEEPOPEN".into()))?,
        sk_err: btf.offset("sock", "sk_err")?,
        sk_protocol: btf.offset("sock", "sk_protocol")?,
        sk_shutdown: shutdown.byte(),
        sk_shutdown_shift: shutdown.shift(),
        write_seq: btf.offset("tcp_sock", "write_seq")?,
        snd_una: btf.offset("tcp_sock", "snd_una")?,
        rcv_nxt: btf.offset("tcp_sock", "rcv_nxt")?,
        copied_seq: btf.offset("tcp_sock", "copied_seq")?,
        keepalive_time: btf.offset("tcp_sock", "keepalive_time")?,
        // Without CONFIG_NET_NS, `possible_net_t` is empty: every socket
        // is in the one namespace, reported as 0.
        skc_net: match btf.field("possible_net_t", "net") {
            Ok(_) => skc("skc_net")?,
            Err(_) => 0,
        },
        net_ns_inum: match btf.field("possible_net_t", "net") {
            Ok(_) => btf.offset("net", "ns")? + btf.offset("ns_common", "inum")?,
            Err(_) => 0,
        },
        tcp_clock_cache: btf.offset("tcp_sock", "tcp_clock_cache")?,
        rcv_tstamp: btf.offset("tcp_sock", "rcv_tstamp")?,
    })
}

/// The kernel's jiffy in ns (`TICK_NSEC`, the resolution of the coarse
/// clocks), for the send probe's clock-free path; 0 (always read the clock)
/// outside `CONFIG_HZ` 100 to 1000.
fn tick_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid pointer to a timespec.
    if unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &raw mut ts) } != 0 || ts.tv_sec != 0 {
        return 0;
    }
    u64::try_from(ts.tv_nsec).ok().filter(|ns| (1_000_000..=10_000_000).contains(ns)).unwrap_or(0)
}

/// Store the time spent suspended (`CLOCK_BOOTTIME - CLOCK_MONOTONIC`) for
/// the receive probe, which reads the kernel's monotonic segment times.
fn set_clock_offset(map: &mut Array<MapData, u64>) -> Result<(), BpfError> {
    let mono = clock_ns(libc::CLOCK_MONOTONIC);
    let boot = clock_ns(libc::CLOCK_BOOTTIME);
    map.set(0, boot.saturating_sub(mono), 0).map_err(|source| BpfError::Map { name: maps::CLOCK_OFFSET, source })
}

/// Effective capabilities of this process (`CapEff` in /proc/self/status).
fn effective_caps() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("CapEff:").and_then(|v| u64::from_str_radix(v.trim(), 16).ok()))
        })
        .unwrap_or(0)
}

/// Check the capabilities loading needs, before anything else is touched.
pub fn check_capabilities() -> Result<(), BpfError> {
    const CAP_SYS_ADMIN: u32 = 21;
    const CAP_PERFMON: u32 = 38;
    const CAP_BPF: u32 = 39;
    let caps = effective_caps();
    let has = |c: u32| caps & (1 << c) != 0;
    // CAP_SYS_ADMIN implies both on every kernel.
    if has(CAP_SYS_ADMIN) {
        return Ok(());
    }
    if !has(CAP_BPF) {
        return Err(BpfError::MissingCapability("CAP_BPF"));
    }
    if !has(CAP_PERFMON) {
        return Err(BpfError::MissingCapability("CAP_PERFMON (needed for tracing programs)"));
    }
    Ok(())
}

/// Loaded and attached probes.
pub struct Probes {
    /// Link of the `iter/tcp` program; each read creates an iterator from it.
    iter_link: std::os::fd::OwnedFd,
    /// The dead sockets processes hold (`DOOMED`: socket id -> record).
    doomed: HashMap<MapData, u64, DoomedRecord>,
    /// Whether reading other network namespaces' sockets was refused (logged once).
    netns_refused: std::sync::atomic::AtomicBool,
    /// Owns the programs and their links: dropping it detaches everything.
    ebpf: Ebpf,
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

/// Raise `RLIMIT_MEMLOCK` for kernels that still charge BPF memory to it.
/// Returns false when it could not (harmless on 5.11+ memcg accounting).
#[must_use]
pub fn raise_memlock() -> bool {
    let lim = libc::rlimit { rlim_cur: libc::RLIM_INFINITY, rlim_max: libc::RLIM_INFINITY };
    // SAFETY: valid rlimit pointer.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const lim) == 0 }
}

/// BTF IDs of the `bpf_rdonly_cast` kfunc and of `struct tcp_sock`.
type KfuncIds = (u32, u32);

/// What the running kernel's BTF decides: the probe set, the struct
/// offsets, and the IDs of the `bpf_rdonly_cast` kfunc and `struct
/// tcp_sock` where the kernel has that kfunc (6.2+). Logs the choice.
fn inspect_kernel() -> Result<(ProbeSet, Offsets, Option<KfuncIds>), BpfError> {
    // Our BTF reader and aya's each hold a parsed copy of the kernel's
    // types (tens of MB): this one is gone before aya's is made.
    let btf = Btf::from_sys_fs()?;
    let (set, why) = ProbeSet::detect(&btf)?;
    let cast = match (btf.func_id("bpf_rdonly_cast"), btf.struct_id("tcp_sock")) {
        (Some(f), Ok(t)) => Some((f, t)),
        _ => None,
    };
    let recv = if cast.is_some() {
        "the receive probe reaches tcp_sock by the bpf_rdonly_cast kfunc (6.2+)"
    } else {
        "the receive probe reaches tcp_sock by the bpf_skc_to_tcp_sock helper (no bpf_rdonly_cast before 6.2)"
    };
    log::info!("probe set {}: {why}; {recv}", set.name());
    Ok((set, resolve_offsets(&btf)?, cast))
}

/// The object to load, with the kfunc call patched when `cast` is known
/// (see `observer_common::kfunc`: the loader cannot link it), and the
/// `TCP_SOCK_BTF_ID` global (0 when the receive probe uses the helper).
fn object_for(cast: Option<KfuncIds>) -> (Vec<u8>, u64) {
    let mut object = OBJECT.to_vec();
    let tcp_sock = match cast {
        Some((func, tcp_sock)) if kfunc::patch(&mut object, func) > 0 => u64::from(tcp_sock),
        Some(_) => {
            log::warn!("the object has no bpf_rdonly_cast call to patch: the receive probe uses the helper");
            0
        }
        None => 0,
    };
    (object, tcp_sock)
}

impl Probes {
    /// Load the embedded object with `config` and attach the probe set.
    pub fn load(config: &ProbeConfig) -> Result<Self, BpfError> {
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
        let (set, offsets, cast) = inspect_kernel()?;
        let (object, tcp_sock_btf_id) = object_for(cast);
        // `EbpfLoader::new` parses the kernel's BTF for itself; the programs'
        // loads below need a copy of their own, parsed once the loader's is
        // gone.
        let mut ebpf = EbpfLoader::new()
            .override_global(globals::MIN_IDLE_NS, &config.min_idle_ns, true)
            .override_global(globals::STALL_AFTER_NS, &config.stall_after_ns, true)
            .override_global(globals::ANSWER_WITHIN_NS, &config.answer_within_ns, true)
            .override_global(globals::OFFSETS, &offsets, true)
            .override_global(globals::EMIT_CLOSED, &u64::from(config.emit_closed), true)
            .override_global(globals::TICK_NS, &tick_ns(), true)
            .override_global(globals::TCP_SOCK_BTF_ID, &tcp_sock_btf_id, true)
            .override_global(globals::RING_BYTES, &u64::from(config.ring_buffer_bytes), true)
            .map_max_entries(maps::EVENTS, config.ring_buffer_bytes)
            .load(&object)?;
        drop(object);
        let kernel_btf = AyaBtf::from_sys_fs().map_err(|e| BpfError::MissingHook(format!("readable BTF ({e})")))?;
        // Before any probe runs: receive times are `CLOCK_MONOTONIC` plus
        // this offset.
        let mut clock_offset: Array<MapData, u64> =
            Array::try_from(ebpf.take_map(maps::CLOCK_OFFSET).ok_or(BpfError::MissingMap(maps::CLOCK_OFFSET))?)
                .map_err(|source| BpfError::Map { name: maps::CLOCK_OFFSET, source })?;
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
                    // Kernels without BPF trampolines (arm64 before 6.0,
                    // some hardened builds) refuse here: name what is missing.
                    let refused = |e| {
                        BpfError::MissingHook(format!(
                            "both the tcp_sendmsg_locked tracepoint (6.16+) and fentry on {} ({e})",
                            hook.name
                        ))
                    };
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
            attached.push(Attached { hook: *hook, prog_id });
        }
        let iter_link =
            iter_link.ok_or(BpfError::Program { name: "iter_tcp", source: aya::programs::ProgramError::NotLoaded })?;
        let doomed = HashMap::try_from(ebpf.take_map(maps::DOOMED).ok_or(BpfError::MissingMap(maps::DOOMED))?)
            .map_err(|source| BpfError::Map { name: maps::DOOMED, source })?;
        let ring = RingBuf::try_from(ebpf.take_map(maps::EVENTS).ok_or(BpfError::MissingMap(maps::EVENTS))?)
            .map_err(|source| BpfError::Map { name: maps::EVENTS, source })?;
        let counters =
            PerCpuArray::try_from(ebpf.take_map(maps::COUNTERS).ok_or(BpfError::MissingMap(maps::COUNTERS))?)
                .map_err(|source| BpfError::Map { name: maps::COUNTERS, source })?;
        Ok(Self {
            iter_link,
            doomed,
            netns_refused: std::sync::atomic::AtomicBool::new(false),
            ebpf,
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
    pub fn drain(&mut self, mut f: impl FnMut(Result<SockEvent, DecodeError>)) -> usize {
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
            doomed_full: sum(counter::DOOMED_FULL)?,
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
    pub fn for_each_socket(&self, mut f: impl FnMut(&SockRecord)) -> Result<usize, BpfError> {
        let mut n =
            iter::stream(iter::create(&self.iter_link).map_err(BpfError::Iter)?, &mut f).map_err(BpfError::Iter)?;
        for ns in iter::other_netns() {
            match iter::create_in(&ns, &self.iter_link) {
                Ok(file) => n += iter::stream(file, &mut f).map_err(BpfError::Iter)?,
                Err(e) => {
                    if !self.netns_refused.swap(true, std::sync::atomic::Ordering::Relaxed) {
                        log::warn!(
                            "the at-risk view covers this network namespace only: entering {}: {e}",
                            ns.display()
                        );
                    }
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

/// BPF iterator plumbing aya does not expose: the link's fd, and iterators
/// created inside other network namespaces.
mod iter {
    use std::{
        collections::HashSet,
        fs::File,
        io::{self, Read as _},
        os::{
            fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
            unix::fs::MetadataExt as _,
        },
        path::{Path, PathBuf},
    };

    /// `BPF_LINK_CREATE`, `BPF_ITER_CREATE` and `BPF_TRACE_ITER` (uapi, stable).
    const BPF_LINK_CREATE: libc::c_long = 28;
    const BPF_ITER_CREATE: libc::c_long = 33;
    const BPF_TRACE_ITER: u32 = 28;

    fn bpf(cmd: libc::c_long, attr: &mut [u32; 16]) -> io::Result<OwnedFd> {
        // SAFETY: a bpf(2) call with a zero-padded attribute buffer of the
        // size passed; the kernel returns a new fd or -1.
        let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(attr)) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the kernel handed us this fd.
        Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).map_err(io::Error::other)?) })
    }

    /// Attach the iterator program: a link iterators are created from.
    pub fn link_create(prog: BorrowedFd<'_>) -> io::Result<OwnedFd> {
        let mut attr = [0u32; 16];
        attr[0] = u32::try_from(prog.as_raw_fd()).map_err(io::Error::other)?;
        attr[2] = BPF_TRACE_ITER;
        bpf(BPF_LINK_CREATE, &mut attr)
    }

    /// An iterator over the calling thread's network namespace (fixed
    /// when the iterator is created, not when it is read).
    pub fn create(link: &OwnedFd) -> io::Result<File> {
        let mut attr = [0u32; 16];
        attr[0] = u32::try_from(link.as_raw_fd()).map_err(io::Error::other)?;
        Ok(File::from(bpf(BPF_ITER_CREATE, &mut attr)?))
    }

    /// An iterator over the network namespace `ns` (a `/proc/PID/ns/net`
    /// path), created from a short-lived thread that enters it.
    pub fn create_in(ns: &Path, link: &OwnedFd) -> io::Result<File> {
        let file = File::open(ns)?;
        std::thread::scope(|s| {
            s.spawn(|| {
                // SAFETY: setns on a namespace fd; it changes only this thread.
                if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                create(link)
            })
            .join()
            .unwrap_or_else(|_| Err(io::Error::other("iterator thread panicked")))
        })
    }

    /// Read an iterator to its end, calling `f` on each record (a
    /// `#[repr(C)]` POD record without padding, as the program writes it);
    /// returns how many there were.
    pub fn stream<R: aya::Pod>(mut file: File, f: &mut impl FnMut(&R)) -> io::Result<usize> {
        let size = std::mem::size_of::<R>();
        let mut buf = vec![0u8; size * 512];
        let (mut filled, mut n) = (0, 0);
        loop {
            let got = match file.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(got) => got,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            filled += got;
            // A read may end inside a record: keep its start for the next.
            let whole = filled - filled % size;
            for c in buf[..whole].chunks_exact(size) {
                // SAFETY: exact-size chunk of a POD record without padding.
                f(&unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<R>()) });
                n += 1;
            }
            buf.copy_within(whole..filled, 0);
            filled -= whole;
        }
        if filled != 0 {
            return Err(io::Error::other(format!("the socket iterator ended inside a record ({filled} bytes left)")));
        }
        Ok(n)
    }

    /// One `/proc/PID/ns/net` path per network namespace in use, other
    /// than ours.
    pub fn other_netns() -> Vec<PathBuf> {
        let own = std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino());
        let mut seen = HashSet::from([own]);
        let mut out = Vec::new();
        let Ok(dir) = std::fs::read_dir("/proc") else { return out };
        for entry in dir.flatten() {
            if !entry.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
                continue;
            }
            let path = entry.path().join("ns/net");
            if let Ok(m) = std::fs::metadata(&path) {
                if seen.insert(m.ino()) {
                    out.push(path);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    /// The coarse clocks' resolution is the kernel's `TICK_NSEC`.
    #[test]
    fn tick_is_the_kernels_jiffy() {
        let tick = super::tick_ns();
        assert!((1_000_000..=10_000_000).contains(&tick), "no jiffy length: {tick}");
        if let Some(hz) = crate::event::kernel_hz() {
            let hz = u64::from(hz);
            assert_eq!(tick, (1_000_000_000 + hz / 2) / hz, "CONFIG_HZ={hz}");
        }
    }
}

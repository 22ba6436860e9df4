//! Bringing the probes up: the embedded object loaded with the load-time
//! globals (settings and the running kernel's offsets), the probe set
//! attached, the lister of a process's mapped files loaded on demand, and
//! the hot-path probes toggled for benchmarks. What the loaded probes give
//! is read in the parent module.

use std::{os::fd::AsFd as _, time::Instant};

use aya::{
    maps::{Array, MapData},
    programs::{BtfTracePoint, FEntry, FExit, Iter},
    Btf as AyaBtf, Ebpf, EbpfLoader,
};
use observer_common::{globals, maps};

#[cfg(feature = "bench")]
use super::hooks::BENCH_EMPTY;
use super::{
    files::{self, ProcessFiles},
    hooks::{Hook, HookKind, HotLink, ProbeSet, ARRIVAL, HOT_HOOKS, RECV, RECV_CAST},
    iter,
    kernel::{
        check_capabilities, inspect_kernel, object_for, refused_by_seccomp, set_clock_offset, show_own_executable,
        tick_ns,
    },
    losses, netns, watch, Attached, BpfError, Probes,
};
use crate::kernel::event::Clock;

/// The eBPF object built by `build.rs` (empty when built with `AYA_BUILD_SKIP=1`).
pub(super) static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/observer"));

/// Take map `name` out of the loaded object as its typed handle.
pub(super) fn take_map<T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>>(
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
    #[cfg(feature = "bench")]
    pub bench_empty: bool,
    /// Let [`Probes::toggle_hot_path`] detach and re-attach the send and
    /// receive probes (benchmarks).
    #[cfg(feature = "bench")]
    pub bench_toggle: bool,
    /// Read a client connection's first bytes for the name it used (SNI,
    /// `Host`); `--no-names` turns it off and no user memory is read.
    pub names: bool,
}

/// The benchmark's empty programs to attach, and whether the hot-path
/// probes may be toggled: both only in the `bench` build.
#[cfg(feature = "bench")]
fn bench_hooks(config: &ProbeConfig) -> (&'static [Hook], bool) {
    (if config.bench_empty { BENCH_EMPTY } else { &[] }, config.bench_toggle)
}

/// The shipped build has no benchmark harness.
#[cfg(not(feature = "bench"))]
fn bench_hooks(_config: &ProbeConfig) -> (&'static [Hook], bool) {
    (&[], false)
}

impl Default for ProbeConfig {
    fn default() -> Self {
        Self {
            min_idle_ns: 1_000_000_000,
            stall_after_ns: 1_000_000_000,
            answer_within_ns: 300_000_000_000,
            ring_buffer_bytes: 1 << 20,
            emit_closed: true,
            #[cfg(feature = "bench")]
            bench_empty: false,
            #[cfg(feature = "bench")]
            bench_toggle: false,
            names: true,
        }
    }
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
        let (empty, bench_toggle) = bench_hooks(config);
        // The kfunc variant only once its call is patched.
        let cast = tcp_sock_btf_id != 0;
        let hooks = set.hooks().into_iter().map(|h| if cast && h.program == RECV.program { RECV_CAST } else { h });
        for hook in hooks.chain(empty.iter().copied()) {
            let hook = &hook;
            // The real send and receive probes, not the empty ones beside them.
            let toggled =
                bench_toggle && HOT_HOOKS.contains(&hook.name) && !empty.iter().any(|e| e.program == hook.program);
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
                HookKind::FExit => {
                    let prog: &mut FExit = prog.try_into().map_err(err)?;
                    prog.load(hook.name, &kernel_btf).map_err(err)?;
                    prog.attach().map_err(err)?;
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
        attached.extend(attach_arrival(&mut ebpf, &offsets, &kernel_btf));
        let on_demand =
            set.on_demand().map(|h| watch::FailedWriteWatch::load(&mut ebpf, h, &kernel_btf)).transpose()?;
        let failed_writes = on_demand.map(|(watch, loaded)| {
            attached.push(loaded);
            watch
        });
        let iter_link =
            iter_link.ok_or(BpfError::Program { name: "iter_tcp", source: aya::programs::ProgramError::NotLoaded })?;
        let own_exe: Array<MapData, u64> = take_map(&mut ebpf, maps::OWN_EXE)?;
        show_own_executable(&own_exe);
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
            files_known: offsets.vma_vm_file != 0 && offsets.task_mm != 0,
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

    /// Load the lister of a process's mapped files (the runtime
    /// resolver's thread owns it), for a daemon that may not read other
    /// users' `/proc/PID/exe` and `/proc/PID/maps`: loaded only then, and
    /// after the daemon is up (its verification takes seconds under
    /// emulation). `None`, with a warning, on a kernel without the
    /// task-VMA iterator or the fields it reads.
    pub fn load_process_files(&mut self) -> Option<ProcessFiles> {
        if !self.files_known {
            log::warn!("another user's process is told only as far as its /proc is readable: this kernel's task and mapping layout is not known");
            return None;
        }
        let btf = match AyaBtf::from_sys_fs() {
            Ok(btf) => btf,
            Err(e) => {
                log::warn!("another user's process is told only as far as its /proc is readable: kernel BTF: {e}");
                return None;
            }
        };
        let (files, loaded) = files::load(&mut self.ebpf, &btf)?;
        log::info!(
            "loaded iter/task_vma (program {}, id {}): another user's process is told from the kernel's list of its mapped files",
            loaded.hook.program,
            loaded.prog_id
        );
        self.attached.push(loaded);
        Some(files)
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
}

/// The hooks that tell how a received RST and the peer's SYN-ACK
/// arrived ([`ARRIVAL`]), where the kernel allows them: optional, so a
/// refusal is a warning and every reset's source stays unknown.
fn attach_arrival(ebpf: &mut Ebpf, offsets: &observer_common::Offsets, btf: &AyaBtf) -> Vec<Attached> {
    if offsets.skb_head == 0 {
        log::warn!("who sent a reset is not told: this kernel's sk_buff layout is not known");
        return Vec::new();
    }
    let mut attached = Vec::new();
    for hook in ARRIVAL {
        let id = ebpf.program_mut(hook.program).ok_or(aya::programs::ProgramError::NotLoaded).and_then(|prog| {
            if hook.kind == HookKind::FExit {
                let prog: &mut FExit = prog.try_into()?;
                prog.load(hook.name, btf)?;
                prog.attach()?;
                Ok(prog.info()?.id())
            } else {
                let prog: &mut FEntry = prog.try_into()?;
                prog.load(hook.name, btf)?;
                prog.attach()?;
                Ok(prog.info()?.id())
            }
        });
        match id {
            Ok(prog_id) => attached.push(Attached { hook: *hook, prog_id, on_demand: false }),
            Err(e) => {
                log::warn!("who sent a reset is not told: {} on {} refused: {e}", hook.program, hook.name);
                return Vec::new();
            }
        }
    }
    attached
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
}

//! Inspecting the running kernel before loading: struct offsets from its
//! BTF, the jiffy length, the clocks, capabilities and the memlock limit,
//! and the object to load for it.

use std::io;

use aya::maps::{Array, MapData};
use observer_common::{kfunc, maps, Offsets};

use super::{BpfError, ProbeSet, OBJECT};
use crate::{
    kernel::btf::{Btf, BtfError},
    kernel::event::clock_ns,
};

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
        skc_state: skc("skc_state")?,
        app_limited: btf.offset("tcp_sock", "app_limited")?,
        lsndtime: btf.offset("tcp_sock", "lsndtime")?,
        lrcvtime: btf.offset_path("inet_connection_sock", &["icsk_ack", "lrcvtime"])?,
        ..iov_iter(btf).unwrap_or_default()
    })
}

/// Where the send probe finds a write's bytes, for the name a client used
/// ([`crate::kernel::first_bytes`]). `None` (names off) on a layout it does not
/// know: then `msg_iter` stays 0 and the probe never reads user memory.
fn iov_iter(btf: &Btf) -> Option<Offsets> {
    let ptr = ["ubuf", "__iov", "iov"].iter().find_map(|f| btf.offset("iov_iter", f).ok())?;
    let value = |v| btf.enum_value("iter_type", v).ok().and_then(|v| u64::try_from(v).ok());
    // The reader takes `iter_type` as one byte (5.14+; older kernels packed
    // it in an `unsigned int type` with the direction bits).
    btf.field("iov_iter", "iter_type").ok().filter(|f| f.bitfield_size == 0)?;
    Some(Offsets {
        msg_iter: btf.offset("msghdr", "msg_iter").ok()?,
        iter_type: btf.offset("iov_iter", "iter_type").ok()?,
        iov_offset: btf.offset("iov_iter", "iov_offset").ok()?,
        iter_count: btf.offset("iov_iter", "count").ok()?,
        iter_ptr: ptr,
        iter_ubuf: value("ITER_UBUF").unwrap_or(u64::MAX),
        iter_iovec: value("ITER_IOVEC")?,
        ..Offsets::default()
    })
}

/// The kernel's jiffy in ns (`TICK_NSEC`, the resolution of the coarse
/// clocks), for the send probe's clock-free path; 0 (always read the clock)
/// outside `CONFIG_HZ` 100 to 1000.
pub(crate) fn tick_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid pointer to a timespec.
    if unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &raw mut ts) } != 0 || ts.tv_sec != 0 {
        return 0;
    }
    u64::try_from(ts.tv_nsec).ok().filter(|ns| (1_000_000..=10_000_000).contains(ns)).unwrap_or(0)
}

/// Store the time spent suspended (`CLOCK_BOOTTIME - CLOCK_MONOTONIC`) for
/// the receive probe, which reads the kernel's monotonic segment times.
pub(crate) fn set_clock_offset(map: &mut Array<MapData, u64>) -> Result<(), BpfError> {
    let mono = clock_ns(libc::CLOCK_MONOTONIC);
    let boot = clock_ns(libc::CLOCK_BOOTTIME);
    map.set(0, boot.saturating_sub(mono), 0).map_err(|source| BpfError::Map { name: maps::CLOCK_OFFSET, source })
}

/// A field of this process's `/proc/self/status` (`CapEff`, `Seccomp`).
fn own_status(field: &str) -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':').map(|v| v.trim().to_owned()))
}

/// Effective capabilities of this process (`CapEff` in /proc/self/status).
pub(crate) fn effective_caps() -> u64 {
    own_status("CapEff").and_then(|v| u64::from_str_radix(&v, 16).ok()).unwrap_or(0)
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

/// The error comes from an EPERM while this process runs under a seccomp
/// filter (`Seccomp: 2`): a profile refusing `bpf(2)`, since the
/// capabilities were checked first.
pub fn refused_by_seccomp(e: &BpfError) -> bool {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    let mut eperm = false;
    while let Some(s) = source {
        eperm |= s.downcast_ref::<io::Error>().and_then(io::Error::raw_os_error) == Some(libc::EPERM);
        source = s.source();
    }
    eperm && own_status("Seccomp").as_deref() == Some("2")
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
pub(crate) type KfuncIds = (u32, u32);

/// What the running kernel's BTF decides: the probe set, the struct
/// offsets, and the IDs of the `bpf_rdonly_cast` kfunc and `struct
/// tcp_sock` where the kernel has that kfunc (6.2+). Logs the choice.
/// Without `names`, the send probe is told not to read first bytes.
pub(crate) fn inspect_kernel(names: bool) -> Result<(ProbeSet, Offsets, Option<KfuncIds>), BpfError> {
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
    let mut offsets = resolve_offsets(&btf)?;
    let note = match (names, offsets.msg_iter) {
        (false, _) => "names off (--no-names)",
        (true, 0) => "names off: this kernel's iov_iter layout is not one the send probe reads",
        (true, _) => "names from first bytes (TLS SNI, HTTP Host) on",
    };
    if !names {
        offsets.msg_iter = 0;
    }
    log::info!("probe set {}: {why}; {recv}; {note}", set.name());
    Ok((set, offsets, cast))
}

/// The object to load, with the kfunc call patched when `cast` is known
/// (see `observer_common::kfunc`: the loader cannot link it), and the
/// `TCP_SOCK_BTF_ID` global (0 when the receive probe uses the helper).
pub(crate) fn object_for(cast: Option<KfuncIds>) -> (Vec<u8>, u64) {
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

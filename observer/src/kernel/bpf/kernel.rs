//! Inspecting the running kernel before loading: struct offsets from its
//! BTF, the jiffy length, the clocks, capabilities and the memlock limit,
//! and the object to load for it.

use std::io;

use aya::maps::{Array, MapData};
use observer_common::{kfunc, maps, Offsets};

use super::{load::OBJECT, BpfError, ProbeSet};
use crate::{
    kernel::btf::{Btf, BtfError},
    kernel::event::clock_ns,
};

/// Resolve every kernel field the programs read from the kernel's BTF.
pub fn resolve_offsets(btf: &Btf) -> Result<Offsets, BtfError> {
    let skc = |f| btf.offset("sock_common", f);
    let shutdown = btf.field("sock", "sk_shutdown")?;
    let o = Offsets {
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
        ..Offsets::default()
    };
    // Optional groups, each whole or left 0 (its feature off): the first
    // bytes' names; the connecting executable, and on it the mapped files.
    let o = iov_iter(btf, &o).unwrap_or(o);
    let o = segment_arrival(btf, &o).unwrap_or(o);
    Ok(own_process(btf, &o).map_or(o, |o| process_files(btf, &o).unwrap_or(o)))
}

/// The `sk_buff` fields that tell how a received segment arrived (its
/// IP header, so its TTL; its interface), for who sent a reset. `None`
/// on a layout it does not know: then every reset's source is unknown.
fn segment_arrival(btf: &Btf, base: &Offsets) -> Option<Offsets> {
    Some(Offsets {
        skb_head: btf.offset("sk_buff", "head").ok()?,
        skb_network_header: btf.offset("sk_buff", "network_header").ok()?,
        skb_iif: btf.offset("sk_buff", "skb_iif").ok()?,
        ..*base
    })
}

/// The fields that tell a connecting process's executable, and this
/// daemon's process, whose connection at start shows the probes which
/// executable is observer's (see [`super::Probes::load`]). `None` when the
/// kernel's layout is not known: then no connection is taken for
/// observer's own by the kernel, and the probe's connections count like
/// any process's unless `/proc` shows them (never the other way round).
fn own_process(btf: &Btf, base: &Offsets) -> Option<Offsets> {
    Some(Offsets {
        task_mm: btf.offset("task_struct", "mm").ok()?,
        mm_exe_file: btf.offset("mm_struct", "exe_file").ok()?,
        file_inode: btf.offset("file", "f_inode").ok()?,
        own_tgid: u64::from(std::process::id()),
        ..*base
    })
}

/// The fields the `iter/task_vma` program reads to list a process's
/// mapped files ([`super::ProcessFiles`]). `None` when the kernel's layout
/// is not known: the program is then not loaded, and another user's
/// process is told only as far as its `/proc` allows.
fn process_files(btf: &Btf, base: &Offsets) -> Option<Offsets> {
    let f_path = btf.offset("file", "f_path").ok()?;
    Some(Offsets {
        task_tgid: btf.offset("task_struct", "tgid").ok()?,
        vma_vm_file: btf.offset("vm_area_struct", "vm_file").ok()?,
        inode_ino: btf.offset("inode", "i_ino").ok()?,
        inode_sb: btf.offset("inode", "i_sb").ok()?,
        sb_dev: btf.offset("super_block", "s_dev").ok()?,
        file_dentry: f_path + btf.offset("path", "dentry").ok()?,
        file_mnt: f_path + btf.offset("path", "mnt").ok()?,
        dentry_parent: btf.offset("dentry", "d_parent").ok()?,
        dentry_name: btf.offset_path("dentry", &["d_name", "name"]).ok()?,
        vfsmount_root: btf.offset("vfsmount", "mnt_root").ok()?,
        mount_mnt: btf.offset("mount", "mnt").ok()?,
        mount_parent: btf.offset("mount", "mnt_parent").ok()?,
        mount_mountpoint: btf.offset("mount", "mnt_mountpoint").ok()?,
        ..*base
    })
}

/// Show the probes which executable is observer's: connect once from a
/// thread named as the probe's to a loopback port nothing listens on (the
/// kernel refuses it at once: no connection, no event), so the state hook
/// records this process's executable in `OWN_EXE`. Logs how `observer
/// probe`'s connections will be told; true when the kernel knows.
pub(crate) fn show_own_executable(own_exe: &Array<MapData, u64>) -> bool {
    // A port just freed: nothing listens there.
    let target = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr());
    let known = match target {
        Ok(addr) => {
            // Refused, as it should be: only the attempt matters.
            if let Ok(t) = std::thread::Builder::new()
                .name(observer_common::PROBE_THREAD.to_owned())
                .spawn(move || drop(std::net::TcpStream::connect(addr)))
            {
                let _ = t.join();
            }
            own_exe.get(&0, 0).is_ok_and(|inode| inode != 0)
        }
        Err(_) => false,
    };
    if known {
        log::info!("observer probe's connections are told by their executable, as the kernel knows it");
    } else {
        log::warn!(
            "observer probe's connections are told only where /proc/PID/exe is readable (as root): this kernel did not show the daemon's executable; a probe run beside an unprivileged daemon counts as an application"
        );
    }
    known
}

/// Where the send probe finds a write's bytes, for the name a client used
/// ([`crate::kernel::first_bytes`]). `None` (names off) on a layout it does not
/// know: then `msg_iter` stays 0 and the probe never reads user memory.
fn iov_iter(btf: &Btf, base: &Offsets) -> Option<Offsets> {
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
        ..*base
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

#[cfg(test)]
mod tests {
    use super::{resolve_offsets, tick_ns};
    use crate::kernel::btf::Btf;

    /// The coarse clocks' resolution is the kernel's `TICK_NSEC`.
    #[test]
    fn tick_is_the_kernels_jiffy() {
        let tick = tick_ns();
        assert!((1_000_000..=10_000_000).contains(&tick), "no jiffy length: {tick}");
        if let Some(hz) = crate::kernel::event::clock::kernel_hz() {
            let hz = u64::from(hz);
            assert_eq!(tick, (1_000_000_000 + hz / 2) / hz, "CONFIG_HZ={hz}");
        }
    }

    /// On the running kernel: every required field resolved, and each
    /// optional group whole (all its fields) or wholly 0; the mapped-files
    /// group only on top of the connecting-executable one.
    #[test]
    fn optional_offset_groups_are_whole_or_off() {
        let Ok(btf) = Btf::from_sys_fs() else {
            eprintln!("no readable /sys/kernel/btf/vmlinux here: nothing to resolve");
            return;
        };
        let o = resolve_offsets(&btf).expect("this kernel's required fields");
        assert!(o.write_seq != 0 && o.rcv_nxt != 0 && o.skc_dport != 0);
        let whole = |group: &[u64]| group.iter().all(|&f| f != 0) || group.iter().all(|&f| f == 0);
        assert!(whole(&[o.msg_iter, o.iter_count, o.iter_ptr, o.iter_iovec]), "{o:?}");
        assert!(whole(&[o.task_mm, o.mm_exe_file, o.file_inode, o.own_tgid]), "{o:?}");
        let files = [o.task_tgid, o.vma_vm_file, o.inode_sb, o.file_dentry, o.dentry_parent, o.mount_parent];
        assert!(whole(&files), "{o:?}");
        assert!(o.vma_vm_file == 0 || o.task_mm != 0, "mapped files need the executable's fields: {o:?}");
        // `network_header` is a u16 inside `struct_group(headers)` on 5.17+
        // (an anonymous union): found through the anonymous members.
        assert!(o.skb_head != 0 && o.skb_network_header != 0 && o.skb_iif != 0, "{o:?}");
        // This machine's kernel (6.18) has all four.
        eprintln!(
            "names {}, executable {}, mapped files {}, segment arrival {}",
            o.msg_iter != 0,
            o.task_mm != 0,
            o.vma_vm_file != 0,
            o.skb_head != 0
        );
    }
}

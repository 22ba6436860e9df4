//! The maps and load-time globals every hook shares (userspace sets the
//! globals and sizes the ring buffer before loading), and the counters.

use core::ffi::c_void;

use aya_ebpf::{
    btf_maps::SkStorage,
    macros::{btf_map, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use observer_common::{counter, dead, ClosedIdle, DoomedRecord, MappedFile, Offsets, SockState, TupleKey};

/// Events to userspace. Userspace resizes it at load time.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Per-socket state, owned by the socket.
#[btf_map]
pub static SOCKETS: SkStorage<SockState> = SkStorage::new();

/// Loss and bookkeeping counters, indexed by `observer_common::counter`.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Per-CPU sequence for socket ids (`cpu << 48 | n`): unique per boot,
/// never a kernel address.
#[map]
pub static ID_SEQ: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Connections our server side closed idle, by 4-tuple, for `late_reuse`
/// (their full socket is gone by the time the client writes).
#[map]
pub static CLOSED_IDLE: LruHashMap<TupleKey, ClosedIdle> = LruHashMap::with_max_entries(16_384, 0);

/// Client sockets that died idle while a process holds them (socket id ->
/// record), from the death until the application writes on the socket or
/// closes it. Not preallocated: kernel memory only for the entries there
/// are; a full map is counted (`counter::DOOMED_FULL`).
#[map]
pub static DOOMED: HashMap<u64, DoomedRecord> =
    HashMap::with_max_entries(65_536, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// Ports sockets listen on (`role::listener_key(netns, port)` -> 1), for
/// the role of a socket first seen established: entered and removed by
/// the state hook, and entered by the socket iterator for listeners older
/// than the probes (so a port two listeners share, closed by one, is back
/// at the daemon's next walk). Not preallocated; a full map is counted
/// (`counter::LISTENERS_FULL`).
#[map]
pub static LISTENERS: HashMap<u64, u8> = HashMap::with_max_entries(16_384, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// Network namespaces (inode -> 1) whose listeners the daemon walked after
/// the probes were attached: there [`LISTENERS`] is complete. Written by
/// userspace.
#[map]
pub static WALKED_NETNS: HashMap<u32, u8> = HashMap::with_max_entries(4_096, aya_ebpf::bindings::BPF_F_NO_PREALLOC);

/// Clocks: slot 0 is `CLOCK_BOOTTIME - CLOCK_MONOTONIC` (ns spent
/// suspended), to put the kernel's monotonic `tcp_clock_cache` on the boot
/// clock every other timestamp uses (userspace sets it at load and every
/// second; the probes refresh it off the hot path, so after a resume it is
/// current before the first request after a quiet spell). Slot 1 is the
/// monotonic time of jiffy 0 (`mono - jiffies * TICK_NS`), set by the
/// probes, for [`busy_write_time`]. Slot 2 is the boot time the probes
/// last refreshed them at, so they do it at most once a second.
#[map]
pub static CLOCK_OFFSET: Array<u64> = Array::with_max_entries(3, 0);

/// Slot 0 is 1 once our server side has remembered an idle close in
/// [`CLOSED_IDLE`]: until then a new connection has nothing to forget
/// there (an LRU delete takes a lock on every connection otherwise).
#[map]
pub static CLOSED_IDLE_USED: Array<u64> = Array::with_max_entries(1, 0);

/// Slot 0 is 1 once a record went into the ring without waking the
/// reader (see [`wakeup`](crate::common::emit::wakeup)); the next evidence
/// record forces a wakeup and clears it.
#[map]
pub static UNWOKEN: Array<u64> = Array::with_max_entries(1, 0);

/// Slot 0: client sockets whose next write fails in the kernel, not yet
/// acted on (added and taken away atomically by the probes). Slot 1: 1
/// while userspace has the failed-write hook attached. Userspace attaches
/// the hook when slot 0 leaves 0 and detaches it when it has stayed 0; only
/// on the `tp_btf` set ([`FAILED_WRITE_HOOK`]).
#[map]
pub static FAILED_WRITE_WATCH: Array<u64> = Array::with_max_entries(2, 0);

/// The daemon's own executable's inode address (see
/// `observer_common::maps::OWN_EXE`).
#[map]
pub static OWN_EXE: Array<u64> = Array::with_max_entries(1, 0);

/// The process whose mapped files `iter/task_vma` lists (see
/// `observer_common::maps::FILES_OF`).
#[map]
pub static FILES_OF: Array<u32> = Array::with_max_entries(2, 0);

/// The task-VMA iterator's record, built here: it does not fit the BPF
/// stack.
#[map]
pub static MAPPED_SCRATCH: PerCpuArray<MappedFile> = PerCpuArray::with_max_entries(1, 0);

/// 1 = kernel-failed writes are decided by a hook userspace attaches on
/// demand (see [`FAILED_WRITE_WATCH`]); 0 = by the send probe. Set at load time.
#[no_mangle]
pub(crate) static FAILED_WRITE_HOOK: u64 = 0;

/// Size of the ring buffer in bytes, set at load time (read by [`wakeup`]
/// instead of asking the ring on every connection).
#[no_mangle]
pub(crate) static RING_BYTES: u64 = 1 << 20;

/// Length of a jiffy in ns (`clock_getres(CLOCK_MONOTONIC_COARSE)`), set
/// at load time; 0 = unknown, and every write reads the clock.
#[no_mangle]
pub(crate) static TICK_NS: u64 = 0;

/// BTF type ID of `struct tcp_sock` in the running kernel, set at load
/// time for [`rdonly_cast_tcp_sock`].
#[no_mangle]
pub(crate) static TCP_SOCK_BTF_ID: u64 = 0;

/// Minimum idle time before a write counts as a reuse. Set at load time.
#[no_mangle]
pub(crate) static MIN_IDLE_NS: u64 = 1_000_000_000;

/// How long a retransmitted reuse may stay unacknowledged before it is a stall.
#[no_mangle]
pub(crate) static STALL_AFTER_NS: u64 = 1_000_000_000;

/// A request unanswered for this long is dropped (counted unresolved) and
/// never attributed to a later close.
#[no_mangle]
pub(crate) static ANSWER_WITHIN_NS: u64 = 300_000_000_000;

/// 1 = emit `closed` events (userspace only prints them).
#[no_mangle]
pub(crate) static EMIT_CLOSED: u64 = 1;

/// Kernel struct offsets, resolved by userspace from BTF. All zero means
/// "not set": userspace refuses to load without them.
#[no_mangle]
pub(crate) static OFFSETS: Offsets = Offsets {
    skc_daddr: 0,
    skc_rcv_saddr: 0,
    skc_dport: 0,
    skc_num: 0,
    skc_family: 0,
    skc_v6_daddr: 0,
    skc_v6_rcv_saddr: 0,
    skc_flags: 0,
    sock_keepopen_bit: 0,
    sk_err: 0,
    sk_protocol: 0,
    sk_shutdown: 0,
    sk_shutdown_shift: 0,
    write_seq: 0,
    snd_una: 0,
    rcv_nxt: 0,
    copied_seq: 0,
    keepalive_time: 0,
    skc_net: 0,
    net_ns_inum: 0,
    tcp_clock_cache: 0,
    rcv_tstamp: 0,
    msg_iter: 0,
    iter_type: 0,
    iov_offset: 0,
    iter_count: 0,
    iter_ptr: 0,
    iter_ubuf: 0,
    iter_iovec: 0,
    skc_state: 0,
    app_limited: 0,
    lsndtime: 0,
    lrcvtime: 0,
    task_mm: 0,
    mm_exe_file: 0,
    file_inode: 0,
    own_tgid: 0,
    task_tgid: 0,
    vma_vm_file: 0,
    inode_ino: 0,
    inode_sb: 0,
    sb_dev: 0,
    file_dentry: 0,
    file_mnt: 0,
    dentry_parent: 0,
    dentry_name: 0,
    vfsmount_root: 0,
    mount_mnt: 0,
    mount_parent: 0,
    mount_mountpoint: 0,
    skb_head: 0,
    skb_network_header: 0,
    skb_iif: 0,
};

#[inline(always)]
pub(crate) fn global(p: *const u64) -> u64 {
    // SAFETY: a plain read of a rodata global the loader may have rewritten.
    unsafe { core::ptr::read_volatile(p) }
}

#[inline(always)]
pub fn min_idle_ns() -> u64 {
    global(&raw const MIN_IDLE_NS)
}

#[inline(always)]
pub fn stall_after_ns() -> u64 {
    global(&raw const STALL_AFTER_NS)
}

#[inline(always)]
pub fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
}

/// Add `v` to the `u64` at `p` atomically (`BPF_ATOMIC` add, no fetch:
/// the BPF target has no Rust atomics, so the instruction is written).
#[inline(always)]
pub(crate) fn atomic_add(p: *mut u64, v: u64) {
    // SAFETY: `p` is a map value slot (a verifier-checked pointer); the
    // instruction reads and writes only those 8 bytes.
    unsafe {
        core::arch::asm!("lock *(u64 *)({p} + 0) += {v}", p = in(reg) p, v = in(reg) v);
    }
}

/// The socket-local storage map, for helpers called with a socket other
/// programs type differently (`iter/tcp`).
#[inline(always)]
pub fn storage_map() -> *mut c_void {
    (&raw const SOCKETS).cast_mut().cast()
}

/// The application acted on a dead socket (wrote on it or closed it): it
/// is no longer held dead.
#[inline(always)]
pub(crate) fn undoom(st: &mut SockState) {
    if st.dead & dead::LISTED != 0 {
        st.dead &= !dead::LISTED;
        let _ = DOOMED.remove(st.id);
    }
}

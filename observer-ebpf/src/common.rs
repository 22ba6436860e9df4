//! Maps, load-time settings and the per-socket state machine shared by
//! every hook.
//!
//! State lives in socket-local storage (`BPF_MAP_TYPE_SK_STORAGE`, 5.2+;
//! usable from BTF tracing programs since 5.11): it is created with the
//! socket's first event and freed by the kernel with the socket, so a
//! reallocated socket never inherits another's state. Every hook that
//! changes it runs under the socket's lock (process context holds
//! `lock_sock`, softirq holds the spinlock and defers to the owner), so a
//! request is resolved exactly once.
//!
//! Definitions follow TCP sequence state, not syscall returns:
//! - a **request** is outstanding from our first write after the last
//!   byte we received (`req_snd_seq` = `write_seq`, `req_rcv_seq` =
//!   `rcv_nxt` at that write) until any byte arrives beyond `req_rcv_seq`;
//! - a **reuse** is a request written after at least `MIN_IDLE_NS` with no
//!   data either way;
//! - a byte that arrived before the request write (a server's goodbye
//!   line read only now) is not a response;
//! - a write after the application read the peer's EOF is no request
//!   (`tcp_recvmsg` moves `copied_seq` past the FIN when it returns the
//!   end of stream): it answers the close (a `close_notify`);
//! - a small write and our close right after it are part of the close
//!   (`close_notify`), unless the write went out with the peer's FIN
//!   still unread and the application read the EOF only after it: that
//!   was a request, and it failed.

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_SK_STORAGE_GET_F_CREATE,
    btf_maps::SkStorage,
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_ktime_get_boot_ns,
        bpf_ktime_get_ns, bpf_probe_read_kernel,
        generated::{bpf_get_current_cgroup_id, bpf_jiffies64, bpf_sk_storage_get, bpf_skc_to_tcp_sock},
    },
    macros::{btf_map, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray, RingBuf},
};
use observer_common::{
    busy, counter, dead, flags, how, kind, outcome, role, ClosedIdle, DoomedRecord, Event, Offsets, SockState,
    TupleKey, AF_INET, AF_INET6,
};

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

/// Size of the ring buffer in bytes, set at load time (read by [`wakeup`]
/// instead of asking the ring on every connection).
#[no_mangle]
static RING_BYTES: u64 = 1 << 20;

/// Length of a jiffy in ns (`clock_getres(CLOCK_MONOTONIC_COARSE)`), set
/// at load time; 0 = unknown, and every write reads the clock.
#[no_mangle]
static TICK_NS: u64 = 0;

/// BTF type ID of `struct tcp_sock` in the running kernel, set at load
/// time for [`rdonly_cast_tcp_sock`].
#[no_mangle]
static TCP_SOCK_BTF_ID: u64 = 0;

/// Minimum idle time before a write counts as a reuse. Set at load time.
#[no_mangle]
static MIN_IDLE_NS: u64 = 1_000_000_000;

/// How long a retransmitted reuse may stay unacknowledged before it is a stall.
#[no_mangle]
static STALL_AFTER_NS: u64 = 1_000_000_000;

/// A request unanswered for this long is dropped (counted unresolved) and
/// never attributed to a later close.
#[no_mangle]
static ANSWER_WITHIN_NS: u64 = 300_000_000_000;

/// 1 = emit `closed` events (userspace only prints them).
#[no_mangle]
static EMIT_CLOSED: u64 = 1;

/// Kernel struct offsets, resolved by userspace from BTF. All zero means
/// "not set": userspace refuses to load without them.
#[no_mangle]
static OFFSETS: Offsets = Offsets {
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
};

/// A write of at most this many bytes immediately followed by our close
/// (TLS `close_notify`, an HTTP/2 GOAWAY) is part of the close.
pub const CONTROL_BYTES: u32 = 512;
/// "Immediately": a control write and the close, or an unsolicited read
/// and the peer's FIN, within this time.
pub const CONTROL_NS: u64 = 100_000_000;
/// A peer FIN/RST this soon after a reuse write crossed it in flight (the
/// peer closed before it saw the request), even if the request was acked.
pub const RACE_NS: u64 = 100_000_000;

/// Probes' own `SockState::flags` bits (never on the wire).
pub mod st {
    /// The outstanding request has sequence snapshots (`req_snd_seq`,
    /// `req_rcv_seq`): it came after a quiet spell (a reuse, or maybe a
    /// control write). A request in a busy exchange has none, to keep two
    /// field reads off the hot path; it is answered by any read, or by
    /// unread data at the decision.
    pub const SEQ: u8 = 0x01;
    /// The outstanding request is a reuse.
    pub const REUSE: u8 = 0x02;
    /// Our close was seen (local close logic ran).
    pub const LOCAL_CLOSED: u8 = 0x04;
    /// An RST arrived.
    pub const PEER_RST: u8 = 0x10;
    /// A request went unanswered until the next write: a one-way writer.
    /// No requests are tracked until data arrives again.
    pub const ONE_WAY: u8 = 0x20;
    /// The peer's FIN had arrived, unread, when the outstanding request
    /// was written (after the application reads the EOF, a write starts
    /// no request).
    pub const FIN_BEFORE_REQ: u8 = 0x40;
    /// The peer's FIN acknowledged a small write made just before (our
    /// `close_notify`?): decided at our close, which follows at once if so.
    pub const FIN_DEFERRED: u8 = 0x80;
}

/// `sk_shutdown` bit for "no more receives" (a full close, not `SHUT_WR`).
const RCV_SHUTDOWN: u8 = 1;

#[inline(always)]
fn global(p: *const u64) -> u64 {
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
pub fn now() -> u64 {
    // SAFETY: helper without preconditions (5.8+). The boot clock counts
    // suspend, so idle ages across a suspend are not understated.
    unsafe { bpf_ktime_get_boot_ns() }
}

/// `CLOCK_OFFSET` slots.
const SLOT_SUSPENDED: u32 = 0;
const SLOT_JIFFY_EPOCH: u32 = 1;
const SLOT_REFRESHED: u32 = 2;
/// The probes refresh the clock slots at most this often: every
/// connection's establishment would otherwise write one shared cache line
/// from every CPU.
const REFRESH_NS: u64 = 1_000_000_000;

#[inline(always)]
fn clock_slot(slot: u32) -> u64 {
    CLOCK_OFFSET.get(slot).copied().unwrap_or(0)
}

#[inline(always)]
fn set_clock_slot(slot: u32, value: u64) {
    if let Some(p) = CLOCK_OFFSET.get_ptr_mut(slot) {
        // SAFETY: one aligned u64 store; racing writers store values that
        // differ only by clock jitter.
        unsafe { *p = value };
    }
}

/// Store the time spent suspended (`CLOCK_BOOTTIME - CLOCK_MONOTONIC`)
/// and where jiffies stand against the monotonic clock, given the boot
/// clock the caller already read, at most once per [`REFRESH_NS`] (a
/// resume moves the boot clock past that at once). One more clock read:
/// never on a busy exchange's path.
#[inline(always)]
pub fn refresh_clocks(boot: u64) {
    let last = clock_slot(SLOT_REFRESHED);
    if last != 0 && boot >= last && boot - last < REFRESH_NS {
        return;
    }
    set_clock_slot(SLOT_REFRESHED, boot);
    // SAFETY: helpers without preconditions.
    let (mono, jiffies) = unsafe { (bpf_ktime_get_ns(), bpf_jiffies64()) };
    set_clock_slot(SLOT_SUSPENDED, boot.saturating_sub(mono));
    let tick = global(&raw const TICK_NS);
    if tick != 0 {
        set_clock_slot(SLOT_JIFFY_EPOCH, mono.wrapping_sub(jiffies.wrapping_mul(tick)));
    }
}

/// The socket's `tcp_clock_cache`: the monotonic time TCP last processed
/// one of its segments (refreshed as each arrives and as we transmit), by a
/// direct BTF load (no `bpf_probe_read_kernel`, which costs more than the
/// clock). 0 when unknown.
#[inline(always)]
#[allow(
    clippy::cast_ptr_alignment,
    reason = "a u64 field's BTF offset is 8-aligned; the verifier checks the load against the type"
)]
fn clock_cache(sk: *mut c_void) -> u64 {
    // SAFETY: `sk` is the hook's BTF `struct sock *`; the helper checks it
    // is a TCP socket and returns NULL otherwise.
    let tp = unsafe { bpf_skc_to_tcp_sock(sk) };
    if tp.is_null() {
        return 0;
    }
    let off = global(&raw const OFFSETS.tcp_clock_cache) as usize;
    // SAFETY: a BTF-checked load from a `struct tcp_sock`; the offset is a
    // load-time constant the verifier checks against the type.
    unsafe { *tp.cast::<u8>().add(off).cast::<u64>() }
}

/// `bpf_rdonly_cast(sk, TCP_SOCK_BTF_ID)`: the kfunc (6.2+) the verifier
/// turns into a register move, so the receive probe reaches `tcp_sock`
/// without a helper call. aya 0.14 cannot link kfunc calls, so the call
/// is written as a raw instruction (`BPF_CALL` with `src_reg`
/// `BPF_PSEUDO_KFUNC_CALL`) whose immediate, a marker here, userspace
/// replaces with the kfunc's BTF ID before loading (`kfunc::patch`). Only
/// for a hook whose socket is always a full TCP socket: the cast checks
/// nothing, and the loads through it are fault-safe (`PROBE_MEM`) reads.
#[inline(always)]
fn rdonly_cast_tcp_sock(sk: *mut c_void) -> *const u8 {
    let id = global(&raw const TCP_SOCK_BTF_ID);
    let out: *const u8;
    // SAFETY: a kfunc call per the BPF calling convention: arguments in r1
    // and r2, result in r0, r1-r5 clobbered.
    unsafe {
        core::arch::asm!(
            ".quad {insn}",
            insn = const observer_common::kfunc::RDONLY_CAST_CALL,
            inlateout("r1") sk => _,
            inlateout("r2") id => _,
            lateout("r0") out,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
        );
    }
    out
}

/// When the data being read reached TCP, on the boot clock: the wire
/// time, not the syscall's, and no clock call on the hot path.
#[inline(always)]
pub fn receive_time(sk: *mut c_void) -> u64 {
    from_clock_cache(clock_cache(sk))
}

/// [`receive_time`] without a helper call, on 6.2+ (`bpf_rdonly_cast`).
#[inline(always)]
#[allow(
    clippy::cast_ptr_alignment,
    reason = "a u64 field's BTF offset is 8-aligned; the verifier checks the load against the type"
)]
pub fn receive_time_cast(sk: *mut c_void) -> u64 {
    let tp = rdonly_cast_tcp_sock(sk);
    let off = global(&raw const OFFSETS.tcp_clock_cache) as usize;
    // SAFETY: a load from an untrusted BTF pointer of the verifier's own
    // `struct tcp_sock` type: the JIT makes it a fault-safe read.
    from_clock_cache(unsafe { *tp.add(off).cast::<u64>() })
}

#[inline(always)]
fn from_clock_cache(mono: u64) -> u64 {
    match mono {
        0 => now(),
        mono => mono + clock_slot(SLOT_SUSPENDED),
    }
}

/// A write right after the last read, timed without a clock read: a
/// client's next request written right after the answer to its last one,
/// or a server's answer written right after the request (a busy
/// exchange); `None` for every other write, which reads the clock and goes
/// through [`on_send`].
///
/// Only a write surely less than `CONTROL_NS` after the last activity, and
/// so neither a reuse nor a quiet spell, comes here (see
/// `observer_common::busy`). Its time is never late and at most three
/// ticks early, typically microseconds: the later of the data just read's
/// arrival and the jiffies' lower bound. A client request's time only
/// times the request (a `request_aborted` or `request_timeout`); the
/// answer that follows restarts the idle clock from its own arrival. A
/// server's answer is
/// where its side's idle starts, so the server side's idle ages can read
/// up to three ticks long when the server took a few ticks to answer (a
/// server that answers at once is timed from the request's arrival,
/// microseconds early).
#[inline(always)]
pub fn busy_write_time(st: &SockState) -> Option<u64> {
    let tick = global(&raw const TICK_NS);
    if tick == 0
        || min_idle_ns() < CONTROL_NS
        || (tracks_requests(st) && st.req_ns != 0)
        || st.flags & st::ONE_WAY != 0
        || st.peer_fin_ns != 0
        || st.tgid == 0
        || st.last_recv_ns == 0
        || st.last_recv_ns < st.last_send_ns
    {
        return None;
    }
    // SAFETY: helper without preconditions.
    let jiffies = unsafe { bpf_jiffies64() };
    busy::write_start(
        (clock_slot(SLOT_JIFFY_EPOCH), jiffies, tick),
        clock_slot(SLOT_SUSPENDED),
        st.last_recv_ns,
        CONTROL_NS,
    )
}

/// Record the write [`busy_write_time`] admitted: what [`on_send`] does
/// for a write that is neither a reuse nor after a quiet spell.
#[inline(always)]
pub fn start_busy_write(st: &mut SockState, t: u64) {
    if tracks_requests(st) {
        st.req_ns = t;
        st.req_idle_ns = t - st.last_recv_ns;
        st.retransmits = 0;
    }
    st.last_send_ns = t;
}

#[inline(always)]
pub fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
}

/// `a` is after `b` in sequence space.
#[inline(always)]
pub fn after(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a)).cast_signed() < 0
}

/// Read a kernel field at `sk + off`.
#[inline(always)]
fn field<T: Copy + Default>(sk: *const c_void, off: *const u64) -> T {
    let off = global(off) as usize;
    // SAFETY: a probe read; a failure reads as the default.
    unsafe { bpf_probe_read_kernel(sk.cast::<u8>().add(off).cast::<T>()) }.unwrap_or_default()
}

/// Read a field of the hook's own BTF-typed `struct sock *` (or of a
/// pointer loaded from one) at `sk + off` by a direct load: the verifier
/// checks it against the type and makes it fault-safe, and it costs no
/// helper call (the state-change hook runs about eight times per
/// connection). Only for scalar fields of at most 8 bytes.
#[inline(always)]
#[allow(
    clippy::cast_ptr_alignment,
    reason = "a field's BTF offset is aligned for its type; the verifier checks the load against the type"
)]
fn direct<T: Copy>(sk: *const c_void, off: *const u64) -> T {
    let off = global(off) as usize;
    // SAFETY: a BTF-checked load from a kernel object of the verifier's own
    // type, at a load-time constant offset.
    unsafe { core::ptr::read_volatile(sk.cast::<u8>().add(off).cast::<T>()) }
}

#[inline(always)]
pub fn rcv_nxt(sk: *const c_void) -> u32 {
    field(sk, &raw const OFFSETS.rcv_nxt)
}

#[inline(always)]
fn copied_seq(sk: *const c_void) -> u32 {
    field(sk, &raw const OFFSETS.copied_seq)
}

#[inline(always)]
pub fn write_seq(sk: *const c_void) -> u32 {
    field(sk, &raw const OFFSETS.write_seq)
}

#[inline(always)]
pub fn snd_una(sk: *const c_void) -> u32 {
    field(sk, &raw const OFFSETS.snd_una)
}

#[inline(always)]
pub fn sk_err(sk: *const c_void) -> i32 {
    field(sk, &raw const OFFSETS.sk_err)
}

/// `sk_protocol`, by a direct load: `sk` must be a hook's BTF `struct sock *`.
#[inline(always)]
pub fn sk_protocol(sk: *const c_void) -> u16 {
    direct(sk, &raw const OFFSETS.sk_protocol)
}

/// `sk_shutdown` has `RCV_SHUTDOWN` (a `close()`, not `shutdown(SHUT_WR)`).
#[inline(always)]
pub fn rcv_shutdown(sk: *const c_void) -> bool {
    let byte: u8 = field(sk, &raw const OFFSETS.sk_shutdown);
    let shift = global(&raw const OFFSETS.sk_shutdown_shift) as u32 & 7;
    (byte >> shift) & RCV_SHUTDOWN != 0
}

/// Keep-alive on, and its idle time in jiffies (0 = the sysctl default).
#[inline(always)]
fn keepalive(sk: *const c_void) -> (bool, u32) {
    let sk_flags: u64 = field(sk, &raw const OFFSETS.skc_flags);
    let bit = global(&raw const OFFSETS.sock_keepopen_bit) & 63;
    if sk_flags & (1 << bit) == 0 {
        return (false, 0);
    }
    (true, field(sk, &raw const OFFSETS.keepalive_time))
}

/// The socket's state; with `create`, made (and counted when the kernel
/// refuses) if missing.
#[inline(always)]
pub fn storage(sk: *mut c_void, create: bool) -> Option<&'static mut SockState> {
    let flags = if create { u64::from(BPF_SK_STORAGE_GET_F_CREATE) } else { 0 };
    // SAFETY: `sk` is the hook's BTF `struct sock *`; the helper checks it
    // is a full socket and returns NULL otherwise.
    let p = unsafe { bpf_sk_storage_get((&raw const SOCKETS).cast_mut().cast(), sk, core::ptr::null_mut(), flags) }
        .cast::<SockState>();
    if p.is_null() {
        if create {
            count(counter::MAP_FULL);
        }
        return None;
    }
    // SAFETY: non-null storage owned by the socket, valid for this program run.
    Some(unsafe { &mut *p })
}

fn next_id() -> u64 {
    // SAFETY: helper without preconditions.
    let cpu = u64::from(unsafe { bpf_get_smp_processor_id() });
    let n = match ID_SEQ.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        Some(p) => unsafe {
            *p += 1;
            *p
        },
        None => 0,
    };
    ((cpu + 1) << 48) | (n & 0xffff_ffff_ffff)
}

/// Give a fresh state its identity and addresses (read from
/// `struct sock_common` at BTF offsets; `sk` is a hook's BTF `struct sock
/// *`, so the scalar fields are direct loads). False for non-IP families.
#[inline(always)]
pub fn init(sk: *const c_void, st: &mut SockState) -> bool {
    let family: u16 = direct(sk, &raw const OFFSETS.skc_family);
    if family == AF_INET {
        let d: u32 = direct(sk, &raw const OFFSETS.skc_daddr);
        let s: u32 = direct(sk, &raw const OFFSETS.skc_rcv_saddr);
        st.daddr[..4].copy_from_slice(&d.to_ne_bytes());
        st.saddr[..4].copy_from_slice(&s.to_ne_bytes());
    } else if family == AF_INET6 {
        st.daddr = field(sk, &raw const OFFSETS.skc_v6_daddr);
        st.saddr = field(sk, &raw const OFFSETS.skc_v6_rcv_saddr);
    } else {
        return false;
    }
    st.family = family;
    st.dport = u16::from_be(direct(sk, &raw const OFFSETS.skc_dport));
    st.sport = direct(sk, &raw const OFFSETS.skc_num);
    st.netns = netns(sk);
    st.id = next_id();
    true
}

/// Inode of the socket's network namespace (`sk->__sk_common.skc_net.net->ns.inum`).
#[inline(always)]
fn netns(sk: *const c_void) -> u32 {
    if global(&raw const OFFSETS.skc_net) == 0 {
        return 0;
    }
    let net: *const c_void = direct(sk, &raw const OFFSETS.skc_net);
    if net.is_null() {
        return 0;
    }
    direct(net, &raw const OFFSETS.net_ns_inum)
}

/// State of a socket first seen after it was established: its role is
/// guessed from the ports (the side with the ephemeral port is the client).
#[inline(always)]
pub fn adopt(sk: *mut c_void) -> Option<&'static mut SockState> {
    let st = storage(sk, true)?;
    if st.id == 0 {
        if !init(sk, st) {
            return None;
        }
        st.flags |= flags::PREEXISTING;
        st.role = guess_role(st.sport, st.dport);
    }
    Some(st)
}

#[inline(always)]
fn guess_role(local: u16, remote: u16) -> u8 {
    const EPHEMERAL: u16 = 32_768;
    if (local >= EPHEMERAL && remote < EPHEMERAL) || (local >= EPHEMERAL) == (remote >= EPHEMERAL) && local > remote {
        role::CLIENT
    } else {
        role::SERVER
    }
}

/// Later of the last send and receive; 0 when nothing was seen.
#[inline(always)]
pub fn last_activity(st: &SockState) -> u64 {
    if st.last_send_ns > st.last_recv_ns {
        st.last_send_ns
    } else {
        st.last_recv_ns
    }
}

/// Requests are what a client writes; a server's writes are responses.
#[inline(always)]
pub fn tracks_requests(st: &SockState) -> bool {
    st.role != role::SERVER
}

/// Record the writing process on the socket.
#[inline(always)]
pub fn set_process(st: &mut SockState) {
    st.tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    st.comm = bpf_get_current_comm().unwrap_or([0; 16]);
    // SAFETY: a helper with no arguments, allowed in tracing programs.
    st.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
}

/// Emit one event built from the socket's state. The record is written in
/// place in the ring buffer (no copy on the 512-byte BPF stack).
#[inline(always)]
pub fn emit(sk: *const c_void, st: &SockState, kind: u8, now: u64, fill: impl FnOnce(&mut Event)) {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(counter::RINGBUF_FULL);
        return;
    };
    // SAFETY: the reserved slot is valid for writes of one Event; every
    // byte is written (zeroed) before any field is read.
    let e = unsafe {
        let p = entry.as_mut_ptr();
        core::ptr::write_bytes(p, 0, 1);
        &mut *p
    };
    e.ts_ns = now;
    e.sock_id = st.id;
    e.kind = kind;
    e.saddr = st.saddr;
    e.daddr = st.daddr;
    e.sport = st.sport;
    e.dport = st.dport;
    e.family = st.family;
    e.role = st.role;
    e.tgid = st.tgid;
    e.comm = st.comm;
    e.cgroup_id = st.cgroup_id;
    e.netns = st.netns;
    e.flags = st.flags & flags::PREEXISTING;
    if !sk.is_null() && kind != kind::ESTABLISHED && kind != kind::CLOSED {
        let (on, jiffies) = keepalive(sk);
        if on {
            e.flags |= flags::KEEPALIVE;
            e.keepalive_jiffies = jiffies;
        }
    }
    let last = last_activity(st);
    if last != 0 && now > last {
        e.idle_ns = now - last;
    }
    fill(e);
    entry.submit(wakeup(kind));
}

/// How a record wakes the reader. Evidence wakes it as soon as it has
/// caught up (the ring buffer's default). A connection's `established` and
/// `closed` records wake it only once an eighth of the ring is waiting: the
/// daemon drains the ring every second anyway, and a wakeup is an
/// `irq_work` interrupt, most of what a connection cost the state-change
/// hook (measured: `cargo xtask bench`, kernel cost under churn).
#[inline(always)]
fn wakeup(kind: u8) -> u64 {
    use aya_ebpf::bindings::{BPF_RB_AVAIL_DATA, BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP};
    if kind != kind::ESTABLISHED && kind != kind::CLOSED {
        return 0;
    }
    let waiting = EVENTS.query(u64::from(BPF_RB_AVAIL_DATA));
    if waiting > global(&raw const RING_BYTES) / 8 {
        u64::from(BPF_RB_FORCE_WAKEUP)
    } else {
        u64::from(BPF_RB_NO_WAKEUP)
    }
}

/// The socket died with nothing outstanding (`kind`: `dead::FIN`, `RST`
/// or `TIMEOUT`); `idle_close` when that was an idle close (a
/// `peer_close_while_idle` was emitted). A later kind replaces an earlier
/// one (a FIN, then an RST: the socket is closed now); what the
/// application did stays.
#[inline(always)]
fn mark_dead(st: &mut SockState, kind: u8, idle_close: bool) {
    let mut d = (st.dead & !dead::KIND) | kind;
    if idle_close {
        d |= dead::IDLE;
    }
    st.dead = d;
    if unused_death(st) != dead::NONE && st.id != 0 {
        let rec = DoomedRecord {
            id: st.id,
            last_ns: last_activity(st),
            cgroup_id: st.cgroup_id,
            saddr: st.saddr,
            daddr: st.daddr,
            netns: st.netns,
            tgid: st.tgid,
            sport: st.sport,
            dport: st.dport,
            family: st.family,
            role: st.role,
            how: kind,
            comm: st.comm,
        };
        if DOOMED.insert(st.id, rec, 0).is_err() {
            count(counter::DOOMED_FULL);
        }
    }
}

/// The application acted on a dead socket (wrote on it or closed it): it
/// is no longer held dead.
#[inline(always)]
fn undoom(st: &SockState) {
    if st.dead & dead::KIND != dead::NONE {
        let _ = DOOMED.remove(st.id);
    }
}

/// The kind of death the application has not acted on yet, on a socket
/// whose writes are requests (a client); `dead::NONE` otherwise.
#[inline(always)]
pub fn unused_death(st: &SockState) -> u8 {
    if st.dead & dead::USED != 0 || !tracks_requests(st) {
        return dead::NONE;
    }
    st.dead & dead::KIND
}

/// The socket was reset or timed out while idle: every write on it fails
/// in the kernel before a byte leaves the host (`tcp_sendmsg_locked` sees a
/// `CLOSE` socket and returns the pending error, then `EPIPE`).
#[inline(always)]
pub fn write_fails(st: &SockState) -> bool {
    matches!(st.dead & dead::KIND, dead::RST | dead::TIMEOUT)
}

/// The application wrote on a socket that the kernel had already failed
/// while idle, and the write failed before a byte was sent. The first such
/// write after at least `MIN_IDLE_NS` is a failed reuse (`reset` or
/// `timed_out`, `failed_before_send`, safe to retry); reported once.
#[inline(always)]
pub fn on_failed_write(sk: *const c_void, st: &mut SockState, now: u64) {
    let death = unused_death(st);
    if death != dead::RST && death != dead::TIMEOUT {
        return;
    }
    st.dead |= dead::USED;
    undoom(st);
    let last = last_activity(st);
    if last == 0 || now.saturating_sub(last) < min_idle_ns() {
        return;
    }
    set_process(st);
    emit(sk, st, kind::REUSE, now, |e| {
        e.outcome = if death == dead::RST { outcome::RESET } else { outcome::TIMED_OUT };
        e.how = if death == dead::RST { how::RST } else { how::TIMEOUT };
        e.flags |= flags::FAILED_BEFORE_SEND | flags::FIN_BEFORE_WRITE;
    });
}

/// The application closed a client socket that died idle, without
/// writing on it since: `discarded_dead`, once. `since` is when it died
/// (0 = unknown).
#[inline(always)]
fn discarded(sk: *const c_void, st: &mut SockState, now: u64, since: u64) {
    let death = unused_death(st);
    undoom(st);
    if death == dead::NONE || st.dead & dead::IDLE == 0 {
        return;
    }
    st.dead |= dead::USED;
    emit(sk, st, kind::DISCARDED_DEAD, now, |e| {
        e.how = match death {
            dead::FIN => how::FIN,
            dead::RST => how::RST,
            _ => how::TIMEOUT,
        };
        if since != 0 {
            e.elapsed_ns = now.saturating_sub(since);
        }
    });
}

/// The socket is being destroyed (`tcp_destroy_sock`): for a socket reset
/// or timed out while idle, the application's `close()` (no state change
/// is left to see).
#[inline(always)]
pub fn on_destroy(sk: *const c_void, st: &mut SockState, now: u64) {
    if write_fails(st) {
        discarded(sk, st, now, 0);
    }
    undoom(st);
}

/// Forget the outstanding request.
#[inline(always)]
fn clear_request(st: &mut SockState) {
    st.req_ns = 0;
    st.retransmits = 0;
    st.flags &= !(st::REUSE | st::FIN_BEFORE_REQ | st::FIN_DEFERRED | st::SEQ);
}

/// Emit the outcome of the outstanding request if it was a reuse.
#[inline(always)]
fn reuse_outcome(sk: *const c_void, st: &SockState, now: u64, result: u8, how: u8) {
    if st.flags & st::REUSE == 0 {
        return;
    }
    let (req_ns, idle, retrans) = (st.req_ns, st.req_idle_ns, st.retransmits);
    let fin_before = st.flags & st::FIN_BEFORE_REQ != 0;
    emit(sk, st, kind::REUSE, now, |e| {
        e.idle_ns = idle;
        e.elapsed_ns = now.saturating_sub(req_ns);
        e.outcome = result;
        e.how = how;
        e.retransmits = retrans;
        if fin_before {
            e.flags |= flags::FIN_BEFORE_WRITE;
        }
    });
}

/// Emit a request event (`request_aborted`/`request_timeout`).
#[inline(always)]
fn request_event(sk: *const c_void, st: &SockState, now: u64, kind: u8, how: u8, bytes: u32) {
    let (req_ns, idle, retrans) = (st.req_ns, st.req_idle_ns, st.retransmits);
    let reuse = st.flags & st::REUSE != 0;
    emit(sk, st, kind, now, |e| {
        e.idle_ns = idle;
        e.elapsed_ns = now.saturating_sub(req_ns);
        e.how = how;
        e.retransmits = retrans;
        e.bytes = bytes;
        e.flags |= flags::REQUEST_OUTSTANDING;
        if reuse {
            e.flags |= flags::REUSE;
        }
    });
}

/// Drop a request unanswered for longer than the bound. True if one was dropped.
#[inline(always)]
pub fn expire_request(st: &mut SockState, now: u64) -> bool {
    if st.req_ns != 0 && now.saturating_sub(st.req_ns) > global(&raw const ANSWER_WITHIN_NS) {
        if st.flags & st::REUSE != 0 {
            count(counter::REUSE_UNRESOLVED);
        }
        clear_request(st);
        return true;
    }
    false
}

/// Data arrived beyond what had arrived at the request write (`fin`: the
/// peer's FIN is already counted in `rcv_nxt`). Without snapshots, data
/// the application has not read yet counts.
#[inline(always)]
fn answered(sk: *const c_void, st: &SockState, fin: bool) -> bool {
    if st.flags & st::SEQ == 0 {
        // Data short of the FIN is unread; `copied_seq` passes the FIN
        // itself (one past the data) once the application reads the EOF.
        let rcv = rcv_nxt(sk).wrapping_sub(u32::from(fin || st.peer_fin_ns != 0));
        return after(rcv, copied_seq(sk));
    }
    let rcv = rcv_nxt(sk).wrapping_sub(u32::from(fin));
    rcv != st.req_rcv_seq && after(rcv, st.req_rcv_seq)
}

/// The application has read everything that arrived, the peer's FIN
/// included (`tcp_recvmsg` moves `copied_seq` past the FIN when it returns
/// the end of stream).
#[inline(always)]
fn eof_read(sk: *const c_void) -> bool {
    copied_seq(sk) == rcv_nxt(sk)
}

/// The request's bytes were acknowledged (unknown without snapshots: no).
#[inline(always)]
fn acked(sk: *const c_void, st: &SockState) -> bool {
    st.flags & st::SEQ != 0 && after(snd_una(sk), st.req_snd_seq)
}

/// Request bytes written so far (0 = unknown, without snapshots).
#[inline(always)]
fn request_bytes(sk: *const c_void, st: &SockState) -> u32 {
    if st.flags & st::SEQ == 0 {
        return 0;
    }
    write_seq(sk).wrapping_sub(st.req_snd_seq)
}

/// The outstanding request was answered: `ok` for a reuse; the idle clock
/// restarts at the answer.
#[inline(always)]
pub fn resolve_answered(sk: *const c_void, st: &mut SockState, now: u64, how: u8) {
    reuse_outcome(sk, st, now, outcome::OK, how);
    clear_request(st);
    st.last_recv_ns = now;
}

/// A write by the application (send hook).
#[inline(always)]
pub fn on_send(sk: *const c_void, st: &mut SockState, now: u64) {
    let last = last_activity(st);
    let idle = if last != 0 { now.saturating_sub(last) } else { 0 };
    // Plain locals, not an Option: kernels before 6.5 reject a read of a
    // stack slot the compiler left unwritten on the `None` path.
    let mut wseq = 0u32;
    let mut have_wseq = false;
    if last == 0 || idle >= CONTROL_NS {
        // First write after a quiet spell: remembered in case our close
        // follows at once (then it was a close_notify, not a request).
        wseq = write_seq(sk);
        have_wseq = true;
        // Off the hot path: after a resume the offset is current before
        // the first request after a quiet spell is answered.
        refresh_clocks(now);
        st.wburst_ns = now;
        st.wburst_anchor_ns = last;
        st.wburst_seq = wseq;
    }
    if tracks_requests(st) {
        expire_request(st, now);
        if st.req_ns != 0 && idle >= min_idle_ns() {
            // A write after a quiet spell while a request is outstanding:
            // either the answer is queued unread, or nothing answers this
            // peer (a one-way writer: a log shipper, a metrics push).
            if answered(sk, st, false) {
                resolve_answered(sk, st, now, how::NONE);
            } else {
                if st.flags & st::REUSE != 0 {
                    count(counter::REUSE_UNRESOLVED);
                }
                clear_request(st);
                st.flags |= st::ONE_WAY;
            }
        }
        // A write after the application read the peer's EOF answers the
        // close (Go's `close_notify` from its reader): never a request.
        if st.req_ns == 0 && st.flags & st::ONE_WAY == 0 && last != 0 && (st.peer_fin_ns == 0 || !eof_read(sk)) {
            st.req_ns = now;
            st.req_idle_ns = idle;
            st.retransmits = 0;
            if have_wseq || idle >= min_idle_ns() {
                st.req_snd_seq = if have_wseq { wseq } else { write_seq(sk) };
                st.req_rcv_seq = rcv_nxt(sk);
                st.flags |= st::SEQ;
            }
            if st.peer_fin_ns != 0 {
                st.flags |= st::FIN_BEFORE_REQ;
                // A request written on the closed socket: its outcome
                // reports the failure, never `discarded_dead`.
                st.dead |= dead::USED;
                undoom(st);
            }
            if idle >= min_idle_ns() {
                st.flags |= st::REUSE;
                set_process(st);
            }
        }
    }
    if st.tgid == 0 {
        set_process(st);
    }
    st.last_send_ns = now;
}

/// The application read data (receive hook).
#[inline(always)]
pub fn on_read(sk: *const c_void, st: &mut SockState, now: u64) {
    if st.req_ns == 0 && now.saturating_sub(last_activity(st)) >= CONTROL_NS {
        // Unsolicited data after a quiet spell: if the peer's FIN follows
        // at once, it was part of the peer's close.
        st.burst_ns = now;
        st.burst_anchor_ns = last_activity(st);
        st.burst_wseq = write_seq(sk);
    }
    st.flags &= !st::ONE_WAY;
    if st.flags & st::FIN_DEFERRED != 0 {
        return;
    }
    if st.req_ns != 0 {
        // Without snapshots the read itself is the answer (a busy exchange).
        if st.flags & st::SEQ == 0 || answered(sk, st, false) {
            resolve_answered(sk, st, now, how::NONE);
        }
    } else {
        st.last_recv_ns = now;
    }
}

/// The peer's FIN arrived (`ESTABLISHED -> CLOSE_WAIT`).
#[inline(always)]
pub fn on_peer_fin(sk: *const c_void, st: &mut SockState, now: u64) {
    st.peer_fin_ns = now;
    expire_request(st, now);
    // The peer's goodbye (close_notify, GOAWAY), then at most a goodbye of
    // ours in reply, then its FIN: its idle close, not a request of ours.
    let goodbye = goodbye_anchor(sk, st, now);
    if goodbye != 0 {
        clear_request(st);
        let idle_close = now.saturating_sub(goodbye) >= min_idle_ns();
        mark_dead(st, dead::FIN, idle_close);
        if idle_close {
            emit(sk, st, kind::PEER_CLOSE, now, |e| {
                e.idle_ns = now - goodbye;
                e.how = how::FIN;
            });
        }
        return;
    }
    if st.req_ns != 0 {
        if answered(sk, st, true) {
            resolve_answered(sk, st, now, how::CLOSED_AFTER_RESPONSE);
        } else if is_small_fresh_request(sk, st, now) && acked(sk, st) {
            // The peer received a small write of ours and closed at once:
            // the answer to our close_notify, or a real failure. Our close
            // tells which.
            st.flags |= st::FIN_DEFERRED;
        } else {
            peer_ended_request(sk, st, now, outcome::EOF, how::FIN);
        }
        return;
    }
    let anchor = last_activity(st);
    let idle_close = anchor != 0 && now.saturating_sub(anchor) >= min_idle_ns();
    mark_dead(st, dead::FIN, idle_close);
    if idle_close {
        emit(sk, st, kind::PEER_CLOSE, now, |e| {
            e.idle_ns = now - anchor;
            e.how = how::FIN;
        });
    }
}

/// An RST arrived.
#[inline(always)]
pub fn on_peer_rst(sk: *const c_void, st: &mut SockState, now: u64) {
    let first = st.flags & (st::PEER_RST | st::LOCAL_CLOSED) == 0;
    st.flags |= st::PEER_RST;
    if !first {
        return;
    }
    expire_request(st, now);
    // The peer's goodbye, at most a goodbye of ours in reply, then its RST
    // (it closed with our reply unread): its idle close.
    let goodbye = if st.peer_fin_ns == 0 { goodbye_anchor(sk, st, now) } else { 0 };
    if goodbye != 0 {
        clear_request(st);
        let idle_close = now.saturating_sub(goodbye) >= min_idle_ns();
        mark_dead(st, dead::RST, idle_close);
        if idle_close {
            emit(sk, st, kind::PEER_CLOSE, now, |e| {
                e.idle_ns = now - goodbye;
                e.how = how::RST;
            });
        }
        return;
    }
    if st.req_ns != 0 {
        // A FIN after the request was resolved by the FIN itself, so any
        // advance of rcv_nxt here is data.
        let fin_counted = st.flags & st::FIN_BEFORE_REQ == 0 && st.peer_fin_ns != 0;
        if answered(sk, st, fin_counted) {
            resolve_answered(sk, st, now, how::CLOSED_AFTER_RESPONSE);
        } else {
            peer_ended_request(sk, st, now, outcome::RESET, how::RST);
        }
        return;
    }
    let last = last_activity(st);
    let idle_close = st.peer_fin_ns == 0 && last != 0 && now.saturating_sub(last) >= min_idle_ns();
    // After an idle FIN the RST ends a socket that was already an idle
    // close: it stays one.
    mark_dead(st, dead::RST, idle_close || st.dead & dead::IDLE != 0);
    if idle_close {
        emit(sk, st, kind::PEER_CLOSE, now, |e| e.how = how::RST);
    }
}

/// The peer's FIN or RST came before any response byte. A reuse the peer
/// never acknowledged, or that the close crossed in flight, failed
/// (`eof`/`reset`); otherwise the peer received the request and gave up
/// on it (`request_aborted`).
#[inline(always)]
fn peer_ended_request(sk: *const c_void, st: &mut SockState, now: u64, result: u8, how: u8) {
    if st.flags & (st::FIN_BEFORE_REQ | st::REUSE) == st::FIN_BEFORE_REQ {
        // Written after the peer had closed (a goodbye of our own, say):
        // no deadline of the peer's.
        clear_request(st);
        return;
    }
    let raced = now.saturating_sub(st.req_ns) < RACE_NS;
    if st.flags & st::REUSE != 0 && (st.flags & st::FIN_BEFORE_REQ != 0 || !acked(sk, st) || raced) {
        reuse_outcome(sk, st, now, result, how);
    } else {
        if st.flags & st::REUSE != 0 {
            count(counter::REUSE_UNRESOLVED);
        }
        request_event(sk, st, now, kind::REQUEST_ABORTED, how, request_bytes(sk, st));
    }
    clear_request(st);
}

/// Our side closed (`close()`: `ESTABLISHED -> FIN_WAIT1`, `CLOSE_WAIT ->
/// LAST_ACK`, or an abort straight to `CLOSE`). `stall_how` says how a
/// stalled reuse ended.
#[inline(always)]
pub fn on_local_close(sk: *const c_void, st: &mut SockState, now: u64, stall_how: u8) {
    if st.flags & st::LOCAL_CLOSED != 0 {
        return;
    }
    st.flags |= st::LOCAL_CLOSED;
    if st.dead & dead::KIND == dead::FIN {
        // The peer closed it idle and nothing was written since but, at
        // most, an answer to its close (`close_notify` after the EOF).
        discarded(sk, st, now, st.peer_fin_ns);
    }
    undoom(st);
    expire_request(st, now);
    // Our own close_notify/GOAWAY and then the close: part of the close.
    // Not a reuse written blind after the peer's FIN (the FIN unread), the
    // EOF read only after it: the application tried a request and found
    // the connection closed. Its close follows at once whenever the
    // peer's RST is slower than the application (any real round trip).
    let blind = st.flags & (st::REUSE | st::FIN_BEFORE_REQ) == st::REUSE | st::FIN_BEFORE_REQ && eof_read(sk);
    let control = !blind && is_control_write(sk, st, now);
    let deferred = st.flags & st::FIN_DEFERRED != 0;
    // The peer's FIN answered our close_notify: we closed first.
    let we_first = control && (deferred || (st.peer_fin_ns != 0 && st.peer_fin_ns >= st.wburst_ns));
    if deferred && !control && st.req_ns != 0 {
        // A FIN right after a small request, and no close of ours at once:
        // decide it as of the FIN.
        let at = st.peer_fin_ns;
        st.flags &= !st::FIN_DEFERRED;
        if answered(sk, st, true) {
            resolve_answered(sk, st, at, how::CLOSED_AFTER_RESPONSE);
        } else {
            peer_ended_request(sk, st, at, outcome::EOF, how::FIN);
        }
    }
    // The peer's goodbye (close_notify, GOAWAY) read just now and our close
    // in answer to it (nothing written since but our own goodbye): the
    // peer closed, at the idle age before its goodbye.
    let goodbye_at =
        if we_first || st.peer_fin_ns != 0 || st.flags & st::PEER_RST != 0 { 0 } else { goodbye_anchor(sk, st, now) };
    let goodbye = goodbye_at != 0;
    if goodbye {
        let anchor = goodbye_at;
        clear_request(st);
        if now.saturating_sub(anchor) >= min_idle_ns() {
            emit(sk, st, kind::PEER_CLOSE, now, |e| {
                e.idle_ns = now - anchor;
                e.how = how::FIN;
            });
        }
    }
    let peer_first = !we_first && (goodbye || st.peer_fin_ns != 0 || st.flags & st::PEER_RST != 0);
    if control {
        clear_request(st);
    }
    if st.req_ns != 0 {
        let fin_counted = st.flags & st::FIN_BEFORE_REQ == 0 && st.peer_fin_ns != 0;
        if answered(sk, st, fin_counted) {
            resolve_answered(sk, st, now, how::NONE);
        } else {
            local_ended_request(sk, st, now, stall_how, peer_first, request_bytes(sk, st));
            return;
        }
    }
    let anchor = if control { st.wburst_anchor_ns } else { last_activity(st) };
    let idle = now.saturating_sub(anchor);
    if anchor == 0 || idle < min_idle_ns() {
        return;
    }
    if st.role == role::SERVER && !peer_first {
        remember_idle_close(st, now, idle);
    }
    emit(sk, st, kind::LOCAL_CLOSE, now, |e| {
        e.idle_ns = idle;
        if peer_first {
            e.flags |= flags::PEER_CLOSED_FIRST;
        }
        if control {
            e.flags |= flags::CONTROL_WRITE;
        }
    });
}

/// The outstanding request is small and was written less than
/// `CONTROL_NS` ago (it may yet turn out to be a `close_notify`).
#[inline(always)]
fn is_small_fresh_request(sk: *const c_void, st: &SockState, now: u64) -> bool {
    st.flags & st::SEQ != 0
        && now.saturating_sub(st.req_ns) < CONTROL_NS
        && write_seq(sk).wrapping_sub(st.req_snd_seq) <= CONTROL_BYTES
}

/// The activity before an unsolicited read that came just now (a peer's
/// goodbye: `close_notify`, GOAWAY), if we wrote at most a goodbye of our
/// own since; else 0.
#[inline(always)]
fn goodbye_anchor(sk: *const c_void, st: &SockState, now: u64) -> u64 {
    if st.burst_ns == 0 || now.saturating_sub(st.burst_ns) >= CONTROL_NS {
        return 0;
    }
    if st.last_send_ns > st.burst_ns && write_seq(sk).wrapping_sub(st.burst_wseq) > CONTROL_BYTES {
        return 0;
    }
    st.burst_anchor_ns
}

/// A small write after a quiet spell, with nothing received since (a
/// server: nothing but the client's own goodbye before its FIN), just
/// before our close.
#[inline(always)]
fn is_control_write(sk: *const c_void, st: &SockState, now: u64) -> bool {
    st.wburst_ns != 0
        && st.wburst_anchor_ns != 0
        && st.last_send_ns >= st.wburst_ns
        && (st.last_recv_ns <= st.wburst_ns || (st.role == role::SERVER && st.peer_fin_ns >= st.wburst_ns))
        && now.saturating_sub(st.wburst_ns) < CONTROL_NS
        && write_seq(sk).wrapping_sub(st.wburst_seq) <= CONTROL_BYTES
}

/// We closed with a request outstanding and unanswered.
#[inline(always)]
fn local_ended_request(sk: *const c_void, st: &mut SockState, now: u64, stall_how: u8, peer_first: bool, bytes: u32) {
    let reuse = st.flags & st::REUSE != 0;
    let acked = acked(sk, st);
    let elapsed = now.saturating_sub(st.req_ns);
    if reuse && st.flags & st::FIN_BEFORE_REQ != 0 {
        // The peer had closed before we wrote: no byte reached a live peer.
        reuse_outcome(sk, st, now, outcome::EOF, how::FIN);
    } else if reuse && !acked && st.retransmits > 0 && elapsed >= stall_after_ns() {
        reuse_outcome(sk, st, now, outcome::STALL, stall_how);
    } else if reuse {
        count(counter::REUSE_UNRESOLVED);
    }
    if !peer_first && stall_how == how::LOCAL_CLOSE {
        request_event(sk, st, now, kind::REQUEST_TIMEOUT, how::NONE, bytes);
    }
    clear_request(st);
}

/// The kernel killed an idle socket whose keep-alive probes went
/// unanswered: the path dropped the flow while it was silent. Reported as
/// a `peer_close_while_idle` with `how` = `timeout`, its idle age the time
/// since the last segment received (the last data or answered probe; the
/// first unanswered probe went out one keep-alive idle time after it) and
/// `elapsed_ns` the time since the last data. Without keep-alive, or with
/// the tick unknown, nothing is reported.
#[inline(always)]
fn keepalive_death(sk: *const c_void, st: &SockState, now: u64, last: u64) {
    let tick = global(&raw const TICK_NS);
    if tick == 0 || last == 0 || !keepalive(sk).0 {
        return;
    }
    let rcv: u32 = field(sk, &raw const OFFSETS.rcv_tstamp);
    // SAFETY: helper without preconditions.
    let jiffies = unsafe { bpf_jiffies64() } as u32;
    let silent = u64::from(jiffies.wrapping_sub(rcv)) * tick;
    emit(sk, st, kind::PEER_CLOSE, now, |e| {
        e.idle_ns = silent;
        e.elapsed_ns = now.saturating_sub(last);
        e.how = how::TIMEOUT;
    });
}

/// The socket reached `CLOSE` from `old` (`tcp_done`, an abort, or the end
/// of an orderly close).
#[inline(always)]
pub fn on_closed(sk: *const c_void, st: &mut SockState, old: i32, now: u64) {
    use observer_common::tcp_state as S;
    if (old == S::ESTABLISHED || old == S::CLOSE_WAIT) && st.flags & (st::PEER_RST | st::LOCAL_CLOSED) == 0 {
        // Neither a reset nor an orderly close: the kernel gave up (it
        // sets sk_err before tcp_done on every kernel) or we aborted
        // (SO_LINGER 0, close with unread data: sk_err still 0).
        if sk_err(sk) != 0 {
            st.flags |= st::LOCAL_CLOSED;
            if st.req_ns != 0 && !expire_request(st, now) {
                local_ended_request(sk, st, now, how::TIMEOUT, true, request_bytes(sk, st));
            } else if st.req_ns == 0 {
                // Killed idle (keep-alive probes unanswered): the next
                // write fails before a byte is sent.
                let last = last_activity(st);
                mark_dead(st, dead::TIMEOUT, last != 0 && now.saturating_sub(last) >= min_idle_ns());
                keepalive_death(sk, st, now, last);
            }
        } else {
            on_local_close(sk, st, now, how::LOCAL_CLOSE);
        }
    } else if st.req_ns != 0 && st.flags & st::REUSE != 0 {
        count(counter::REUSE_UNRESOLVED);
    }
    clear_request(st);
    if global(&raw const EMIT_CLOSED) != 0 {
        let role = st.role;
        emit(sk, st, kind::CLOSED, now, |e| e.role = role);
    }
}

/// `close()` with `RCV_SHUTDOWN`: a real close. `shutdown(SHUT_WR)` only
/// half-closes and the request stays outstanding.
#[inline(always)]
pub fn is_full_close(sk: *const c_void) -> bool {
    rcv_shutdown(sk)
}

fn tuple_key(st: &SockState) -> TupleKey {
    TupleKey { saddr: st.saddr, daddr: st.daddr, sport: st.sport, dport: st.dport, family: st.family, pad: 0 }
}

/// Server side: remember an idle close, so a client that writes on it
/// later is seen (`late_reuse`).
#[inline(always)]
fn remember_idle_close(st: &SockState, now: u64, idle: u64) {
    let _ = CLOSED_IDLE.insert(tuple_key(st), ClosedIdle { close_ns: now, idle_ns: idle }, 0);
    if let Some(p) = CLOSED_IDLE_USED.get_ptr_mut(0) {
        // SAFETY: one aligned u64 store of a constant.
        unsafe {
            if *p == 0 {
                *p = 1;
            }
        }
    }
}

/// A new connection reuses a 4-tuple: forget an old idle close on it.
#[inline(always)]
pub fn forget_idle_close(st: &SockState) {
    if CLOSED_IDLE_USED.get(0).copied().unwrap_or(1) != 0 {
        let _ = CLOSED_IDLE.remove(tuple_key(st));
    }
}

/// The kernel sent an RST from socket `sk` (full or time-wait): if it is
/// a connection our server side closed idle, the client wrote on it late.
#[inline(always)]
pub fn on_send_reset(sk: *const c_void, now: u64) {
    let mut probe = SockState::ZERO;
    if !init(sk, &mut probe) {
        return;
    }
    let key = tuple_key(&probe);
    let Some(p) = CLOSED_IDLE.get_ptr(key) else { return };
    // SAFETY: pointer from a successful lookup; copied before the removal.
    let closed = unsafe { *p };
    let _ = CLOSED_IDLE.remove(key);
    probe.role = role::SERVER;
    probe.id = 0;
    emit(core::ptr::null(), &probe, kind::LATE_REUSE, now, |e| {
        e.idle_ns = closed.idle_ns;
        e.elapsed_ns = now.saturating_sub(closed.close_ns);
    });
}

/// A retransmission of this socket's data.
#[inline(always)]
pub fn on_retransmit(st: &mut SockState) {
    if st.req_ns != 0 {
        st.retransmits += 1;
    }
}

/// A fresh connection reached `ESTABLISHED`.
#[inline(always)]
pub fn on_established(sk: *mut c_void, client: bool, now: u64) {
    let Some(st) = storage(sk, true) else { return };
    if st.id == 0 && !init(sk, st) {
        return;
    }
    st.role = if client { role::CLIENT } else { role::SERVER };
    // A socket connected again after it died (`connect()` on a closed
    // socket) is alive.
    undoom(st);
    st.dead = dead::NONE;
    refresh_clocks(now);
    // Establishment counts as activity: a connection opened and then left
    // idle in a pool ages from here.
    st.last_recv_ns = now;
    if !client {
        forget_idle_close(st);
    }
    emit(sk, st, kind::ESTABLISHED, now, |e| e.idle_ns = 0);
}

/// The socket-local storage map, for helpers called with a socket other
/// programs type differently (`iter/tcp`).
#[inline(always)]
pub fn storage_map() -> *mut c_void {
    (&raw const SOCKETS).cast_mut().cast()
}

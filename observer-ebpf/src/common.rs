//! Maps, load-time settings and helpers shared by every hook.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::map,
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use observer_common::{counter, flags, outcome, Event, LastError, SockState, AF_INET, AF_INET6};

/// Events to userspace. Userspace resizes it at load time.
#[map]
pub static EVENTS: RingBuf = RingBuf::with_byte_size(256 * 1024, 0);

/// Per-socket state keyed by the socket's kernel address. Userspace sizes it
/// at load time; entries are removed when the socket closes or is destroyed.
#[map]
pub static SOCKS: HashMap<u64, SockState> = HashMap::with_max_entries(65_536, 0);

/// Loss and bookkeeping counters, indexed by `observer_common::counter`.
#[map]
pub static COUNTERS: PerCpuArray<u64> = PerCpuArray::with_max_entries(counter::COUNT, 0);

/// Last `inet_sk_error_report` on this CPU (that tracepoint has no socket
/// pointer, so the `CLOSE` transition that follows matches it by ports).
#[map]
pub static LAST_ERROR: PerCpuArray<LastError> = PerCpuArray::with_max_entries(1, 0);

/// The socket (and when) whose unexplained `CLOSE` awaits an error report on
/// this CPU: `[sock, ts_ns]`.
#[map]
pub static PENDING_CLOSE: PerCpuArray<[u64; 2]> = PerCpuArray::with_max_entries(1, 0);

/// Minimum idle time before a write counts as a reuse. Set at load time.
#[no_mangle]
static MIN_IDLE_NS: u64 = 1_000_000_000;

/// How long a retransmitted reuse may go unanswered before it is a stall.
#[no_mangle]
static STALL_AFTER_NS: u64 = 1_000_000_000;

/// Offsets into `struct sock_common`, used only to learn the addresses of
/// sockets that were open before the probes attached. The defaults are
/// those of `x86_64` kernels 5.x-6.x; userspace may override them from BTF.
#[no_mangle]
static SKC_V6_DADDR_OFF: u64 = 56;
#[no_mangle]
static SKC_V6_RCV_SADDR_OFF: u64 = 72;

#[inline(always)]
pub fn min_idle_ns() -> u64 {
    // SAFETY: a plain read of a rodata global the loader may have rewritten.
    unsafe { core::ptr::read_volatile(&raw const MIN_IDLE_NS) }
}

#[inline(always)]
pub fn stall_after_ns() -> u64 {
    // SAFETY: as above.
    unsafe { core::ptr::read_volatile(&raw const STALL_AFTER_NS) }
}

#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: helper without preconditions.
    unsafe { bpf_ktime_get_ns() }
}

#[inline(always)]
pub fn count(index: u32) {
    if let Some(slot) = COUNTERS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += 1 };
    }
}

/// Offsets of the address fields in a tracepoint record.
pub struct TupleOffsets {
    pub sport: usize,
    pub dport: usize,
    pub family: usize,
    pub saddr: usize,
    pub daddr: usize,
    pub saddr_v6: usize,
    pub daddr_v6: usize,
}

/// Fill the 4-tuple of `st` from a tracepoint record. Returns false for
/// families other than IPv4/IPv6.
#[inline(always)]
pub fn read_tuple(ctx: &TracePointContext, off: &TupleOffsets, st: &mut SockState) -> bool {
    // SAFETY: offsets come from the tracepoint's format file; read_at is a
    // bounds-checked bpf_probe_read of the record.
    unsafe {
        let family: u16 = ctx.read_at(off.family).unwrap_or(0);
        st.family = family;
        st.sport = ctx.read_at(off.sport).unwrap_or(0);
        st.dport = ctx.read_at(off.dport).unwrap_or(0);
        if family == AF_INET {
            let s: [u8; 4] = ctx.read_at(off.saddr).unwrap_or([0; 4]);
            let d: [u8; 4] = ctx.read_at(off.daddr).unwrap_or([0; 4]);
            st.saddr[..4].copy_from_slice(&s);
            st.daddr[..4].copy_from_slice(&d);
            true
        } else if family == AF_INET6 {
            st.saddr = ctx.read_at(off.saddr_v6).unwrap_or([0; 16]);
            st.daddr = ctx.read_at(off.daddr_v6).unwrap_or([0; 16]);
            true
        } else {
            false
        }
    }
}

/// Internal `SockState::flags` bits (not on the wire).
pub const ST_PEER_RST: u8 = 0x40;
/// Reached CLOSE with a reuse pending and no reason yet: the error report
/// that follows (kernel 6.10+ reports after `tcp_done`) or the destroy decides.
pub const ST_CLOSE_PENDING: u8 = 0x20;
pub const ST_LOCAL_CLOSED: u8 = 0x80;

/// Start tracking a socket first seen after it was established. A racing
/// insert is fine (its entry is used); a full table is counted, once per
/// refused insert.
#[inline(always)]
pub fn track(sk: u64, st: &SockState) -> Option<*mut SockState> {
    if SOCKS.insert(sk, st, 1 /* BPF_NOEXIST */).is_err() {
        if let Some(p) = SOCKS.get_ptr_mut(sk) {
            return Some(p);
        }
        count(counter::MAP_FULL);
        return None;
    }
    SOCKS.get_ptr_mut(sk)
}

/// Track a socket first seen on a hook without addresses: read them from
/// `struct sock_common` (only on first sight, not per send).
#[inline(always)]
pub fn adopt(sk: u64, family: u16) -> Option<*mut SockState> {
    if family != AF_INET && family != AF_INET6 {
        return None;
    }
    let mut st = SockState::ZERO;
    st.family = family;
    st.flags = flags::PREEXISTING;
    let base = sk as *const u8;
    // SAFETY: probe reads of kernel memory; failures leave zeros.
    unsafe {
        if family == AF_INET {
            let d: [u8; 4] = bpf_probe_read_kernel(base.cast::<[u8; 4]>()).unwrap_or([0; 4]);
            let s: [u8; 4] = bpf_probe_read_kernel(base.add(4).cast::<[u8; 4]>()).unwrap_or([0; 4]);
            st.daddr[..4].copy_from_slice(&d);
            st.saddr[..4].copy_from_slice(&s);
        } else {
            let d_off = core::ptr::read_volatile(&raw const SKC_V6_DADDR_OFF) as usize;
            let s_off = core::ptr::read_volatile(&raw const SKC_V6_RCV_SADDR_OFF) as usize;
            st.daddr = bpf_probe_read_kernel(base.add(d_off).cast::<[u8; 16]>()).unwrap_or([0; 16]);
            st.saddr = bpf_probe_read_kernel(base.add(s_off).cast::<[u8; 16]>()).unwrap_or([0; 16]);
        }
        // skc_dport (network order) and skc_num (host order), read as bytes
        // because the probe read has no alignment requirement.
        let ports: [u8; 4] = bpf_probe_read_kernel(base.add(12).cast::<[u8; 4]>()).unwrap_or([0; 4]);
        st.dport = u16::from_be_bytes([ports[0], ports[1]]);
        st.sport = u16::from_ne_bytes([ports[2], ports[3]]);
    }
    track(sk, &st)
}

/// `skc_family` of a socket (offset 16 in `struct sock_common`, stable).
#[inline(always)]
pub fn sk_family(sk: u64) -> u16 {
    let base = sk as *const u8;
    // SAFETY: probe read of kernel memory; failure reads as 0.
    unsafe { bpf_probe_read_kernel(base.add(16).cast::<[u8; 2]>()) }.map_or(0, u16::from_ne_bytes)
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

/// Record the writing process on the socket (first write, or a reuse).
#[inline(always)]
pub fn set_process(st: &mut SockState) {
    st.tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    st.comm = bpf_get_current_comm().unwrap_or([0; 16]);
}

/// Emit one event built from the socket's state.
#[inline(always)]
pub fn emit(sk: u64, st: &SockState, kind: u8, now: u64, fill: impl FnOnce(&mut Event)) {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        count(counter::RINGBUF_FULL);
        return;
    };
    let mut e = Event::ZERO;
    e.ts_ns = now;
    e.sock_id = sk;
    e.kind = kind;
    e.saddr = st.saddr;
    e.daddr = st.daddr;
    e.sport = st.sport;
    e.dport = st.dport;
    e.family = st.family;
    e.role = st.role;
    e.tgid = st.tgid;
    e.comm = st.comm;
    e.flags = st.flags & (flags::PREEXISTING);
    let last = last_activity(st);
    if last != 0 && now > last {
        e.idle_ns = now - last;
    }
    fill(&mut e);
    entry.write(e);
    entry.submit(0);
}

/// Emit the outcome of the pending reuse and clear it.
#[inline(always)]
pub fn resolve_reuse(sk: u64, st: &mut SockState, now: u64, result: u8, how: u8) {
    let fin_before = st.peer_fin_ns != 0 && st.peer_fin_ns <= st.reuse_ns;
    let reuse_ns = st.reuse_ns;
    let idle = st.reuse_idle_ns;
    let retrans = st.retransmits;
    emit(sk, st, observer_common::kind::REUSE, now, |e| {
        e.idle_ns = idle;
        e.elapsed_ns = now.saturating_sub(reuse_ns);
        e.outcome = result;
        e.how = how;
        e.retransmits = retrans;
        if fin_before {
            e.flags |= flags::FIN_BEFORE_WRITE;
        }
    });
    st.reuse_ns = 0;
    st.retransmits = 0;
}

/// The outcome of a pending reuse when the socket ends without a response:
/// a stall if it was retransmitted past `stall_after`, an EOF if the peer's
/// FIN came first, otherwise unresolved (counted).
#[inline(always)]
pub fn resolve_on_end(sk: u64, st: &mut SockState, now: u64, how: u8) {
    if st.reuse_ns == 0 {
        return;
    }
    if st.retransmits > 0 && now.saturating_sub(st.reuse_ns) >= stall_after_ns() {
        resolve_reuse(sk, st, now, outcome::STALL, how);
    } else if st.peer_fin_ns != 0 {
        resolve_reuse(sk, st, now, outcome::EOF, observer_common::how::NONE);
    } else {
        count(counter::REUSE_UNRESOLVED);
        st.reuse_ns = 0;
    }
}

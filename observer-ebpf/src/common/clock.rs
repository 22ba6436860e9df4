//! Clocks: the boot clock every timestamp uses, the kernel's monotonic
//! segment times put on it, and the jiffy-based send time of a busy
//! exchange.

use core::ffi::c_void;

use aya_ebpf::helpers::{
    bpf_ktime_get_boot_ns, bpf_ktime_get_ns,
    generated::{bpf_jiffies64, bpf_skc_to_tcp_sock},
};
use observer_common::{busy, SockState};

use super::{
    bits::{st, tracks_requests, CONTROL_NS},
    kernel::field,
    maps::{global, min_idle_ns, CLOCK_OFFSET, OFFSETS, TCP_SOCK_BTF_ID, TICK_NS},
};

#[inline(always)]
pub fn now() -> u64 {
    // SAFETY: helper without preconditions (5.8+). The boot clock counts
    // suspend, so idle ages across a suspend are not understated.
    unsafe { bpf_ktime_get_boot_ns() }
}

/// Nanoseconds since the socket's jiffy stamp at `sk + off` (`lsndtime`,
/// `lrcvtime`, `rcv_tstamp`); `None` where the kernel's jiffy length is
/// not known.
#[inline(always)]
pub(crate) fn since_field(sk: *const c_void, off: *const u64) -> Option<u64> {
    let tick = global(&raw const TICK_NS);
    (tick != 0).then(|| since_stamp(field(sk, off), tick))
}

/// Nanoseconds since a kernel jiffy stamp (`tcp_jiffies32`: `u32`, so
/// counted back from now across a wrap), at `tick` ns a jiffy.
#[inline(always)]
fn since_stamp(stamp: u32, tick: u64) -> u64 {
    // SAFETY: helper without preconditions.
    #[allow(clippy::cast_possible_truncation, reason = "the low 32 bits, as the kernel's u32 stamps keep them")]
    let now = unsafe { bpf_jiffies64() } as u32;
    u64::from(now.wrapping_sub(stamp)) * tick
}

/// `CLOCK_OFFSET` slots.
pub(crate) const SLOT_SUSPENDED: u32 = 0;
pub(crate) const SLOT_JIFFY_EPOCH: u32 = 1;
pub(crate) const SLOT_REFRESHED: u32 = 2;
/// The probes refresh the clock slots at most this often: every
/// connection's establishment would otherwise write one shared cache line
/// from every CPU.
pub(crate) const REFRESH_NS: u64 = 1_000_000_000;

#[inline(always)]
pub(crate) fn clock_slot(slot: u32) -> u64 {
    CLOCK_OFFSET.get(slot).copied().unwrap_or(0)
}

#[inline(always)]
pub(crate) fn set_clock_slot(slot: u32, value: u64) {
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
pub(crate) fn clock_cache(sk: *mut c_void) -> u64 {
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
pub(crate) fn rdonly_cast_tcp_sock(sk: *mut c_void) -> *const u8 {
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
pub(crate) fn from_clock_cache(mono: u64) -> u64 {
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

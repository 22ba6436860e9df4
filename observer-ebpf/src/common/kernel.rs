//! Kernel field readers: `struct sock` and `struct tcp_sock` fields at the
//! BTF offsets userspace resolved (direct loads where the hook's pointer
//! is BTF-typed, `bpf_probe_read_kernel` otherwise).

use core::ffi::c_void;

use aya_ebpf::helpers::{bpf_probe_read_kernel, generated::bpf_probe_read_kernel as bpf_probe_read_kernel_raw};

use observer_common::SockState;

use super::{
    bits::st,
    maps::{global, OFFSETS},
};

/// `sk_shutdown` bit for "no more receives" (a full close, not `SHUT_WR`).
pub(crate) const RCV_SHUTDOWN: u8 = 1;

/// `a` is after `b` in sequence space.
#[inline(always)]
pub fn after(a: u32, b: u32) -> bool {
    (b.wrapping_sub(a)).cast_signed() < 0
}

/// Read a kernel field at `sk + off`.
#[inline(always)]
pub(crate) fn field<T: Copy + Default>(sk: *const c_void, off: *const u64) -> T {
    let off = global(off) as usize;
    // SAFETY: a probe read; a failure reads as the default.
    unsafe { bpf_probe_read_kernel(sk.cast::<u8>().add(off).cast::<T>()) }.unwrap_or_default()
}

/// A task's executable (`task->mm->exe_file`); NULL for a task without
/// one (a kernel thread) or where the kernel's layout is not known.
#[inline(always)]
pub(crate) fn exe_file(task: *const c_void) -> *const c_void {
    if global(&raw const OFFSETS.task_mm) == 0 {
        return core::ptr::null();
    }
    let mm: *const c_void = field(task, &raw const OFFSETS.task_mm);
    if mm.is_null() {
        return core::ptr::null();
    }
    field(mm, &raw const OFFSETS.mm_exe_file)
}

/// Read a 16-byte kernel field at `sk + off` straight into `dst` (no copy
/// through the stack, which would be a `memmove` call); zeroed on failure.
#[inline(always)]
pub(crate) fn field_into(dst: *mut [u8; 16], sk: *const c_void, off: *const u64) {
    let off = global(off) as usize;
    // SAFETY: a probe read into a 16-byte field; the helper zeroes the
    // destination when the read fails.
    unsafe { bpf_probe_read_kernel_raw(dst.cast(), 16, sk.cast::<u8>().add(off).cast()) };
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
pub(crate) fn direct<T: Copy>(sk: *const c_void, off: *const u64) -> T {
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
pub(crate) fn copied_seq(sk: *const c_void) -> u32 {
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

/// `tcp_sock.app_limited`; None if the read failed (never taken for 0).
#[inline(always)]
#[allow(clippy::cast_ptr_alignment, reason = "a probe read, which takes any alignment")]
pub fn app_limited(sk: *const c_void) -> Option<u32> {
    let off = global(&raw const OFFSETS.app_limited) as usize;
    // SAFETY: a probe read of a u32 field.
    unsafe { bpf_probe_read_kernel(sk.cast::<u8>().add(off).cast::<u32>()) }.ok()
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
pub(crate) fn keepalive(sk: *const c_void) -> (bool, u32) {
    let sk_flags: u64 = field(sk, &raw const OFFSETS.skc_flags);
    let bit = global(&raw const OFFSETS.sock_keepopen_bit) & 63;
    if sk_flags & (1 << bit) == 0 {
        return (false, 0);
    }
    (true, field(sk, &raw const OFFSETS.keepalive_time))
}

/// `close()` with `RCV_SHUTDOWN`: a real close. `shutdown(SHUT_WR)` only
/// half-closes and the request stays outstanding.
#[inline(always)]
pub fn is_full_close(sk: *const c_void) -> bool {
    rcv_shutdown(sk)
}

/// Request bytes written so far (0 = unknown, without snapshots).
#[inline(always)]
pub(crate) fn request_bytes(sk: *const c_void, st: &SockState) -> u32 {
    if st.flags & st::SEQ == 0 {
        return 0;
    }
    write_seq(sk).wrapping_sub(st.req_snd_seq)
}

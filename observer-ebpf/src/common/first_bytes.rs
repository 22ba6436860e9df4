//! A client connection's first bytes, once, for the name the client used
//! (userspace parses the TLS SNI or the HTTP `Host` and drops the bytes).
//!
//! Runs in the send probe on the connection's first write, before any
//! byte is copied from the caller (`tcp_sendmsg_locked`'s entry, or its
//! tracepoint's first firing): the write's `msghdr.msg_iter` still points
//! at the start of the user buffer. Only a user buffer (`ITER_UBUF`, or
//! the first segment of an `ITER_IOVEC`) is read, at most `HELLO_BYTES`,
//! and only when its first 8 bytes start like a TLS `ClientHello` record or
//! an HTTP/1.x request line: anything else (a binary protocol, a server's
//! answer) leaves the host's memory unread. Cost: three field reads and an
//! 8-byte user read per client connection; one 640-byte ring record per
//! TLS or HTTP connection.

use core::ffi::c_void;

use aya_ebpf::helpers::{
    bpf_probe_read_kernel, bpf_probe_read_user, generated::bpf_probe_read_user as bpf_probe_read_user_raw,
};
use observer_common::{counter, kind, role, Event, Hello, SockState, HELLO_BYTES};

use super::{
    emit::{header, wakeup},
    maps::{count, global, EVENTS, OFFSETS},
};

/// Read a `T` at `base + off` from kernel memory (the `msghdr`, its
/// `iov_iter` and the `iovec` array are all kernel copies).
#[inline(always)]
fn kread<T: Copy + Default>(base: *const u8, off: u64) -> T {
    // SAFETY: a probe read; a failure reads as the default.
    unsafe { bpf_probe_read_kernel(base.add(off as usize).cast::<T>()) }.unwrap_or_default()
}

/// The first bytes of a TLS `ClientHello` record (handshake, version 3.x,
/// `ClientHello`) or of an HTTP/1.x request line (3 to 7 capitals, a space).
#[inline(always)]
fn looks_like_hello(h: &[u8; 8]) -> bool {
    if h[0] == 0x16 && h[1] == 3 && h[5] == 1 {
        return true;
    }
    let mut n = 0;
    while n < 7 && h[n].is_ascii_uppercase() {
        n += 1;
    }
    n >= 3 && h[n] == b' '
}

/// Look once at a client connection's first write (`msg` is the send
/// probe's `struct msghdr *`) and hand its first bytes to userspace if
/// they may carry a name.
#[inline(always)]
pub fn first_write(sk: *const c_void, msg: *const c_void, st: &mut SockState, now: u64) {
    st.hello = 1;
    let msg_iter = global(&raw const OFFSETS.msg_iter);
    if msg_iter == 0 || msg.is_null() || st.role == role::SERVER {
        return;
    }
    // SAFETY: pointer arithmetic only; every read below is a probe read.
    let it = unsafe { msg.cast::<u8>().add(msg_iter as usize) };
    let ty: u8 = kread(it, global(&raw const OFFSETS.iter_type));
    let skip: u64 = kread(it, global(&raw const OFFSETS.iov_offset));
    let left: u64 = kread(it, global(&raw const OFFSETS.iter_count));
    let ptr: u64 = kread(it, global(&raw const OFFSETS.iter_ptr));
    let (base, len) = if u64::from(ty) == global(&raw const OFFSETS.iter_ubuf) {
        (ptr, left)
    } else if u64::from(ty) == global(&raw const OFFSETS.iter_iovec) {
        // The first `struct iovec { void *iov_base; size_t iov_len; }`.
        let iov = ptr as *const u8;
        let seg: u64 = kread(iov, 8);
        (kread::<u64>(iov, 0), if seg < left { seg } else { left })
    } else {
        return;
    };
    if base == 0 || len <= skip || len - skip < 16 {
        return;
    }
    let src = (base + skip) as *const u8;
    // SAFETY: a probe read of user memory; it fails cleanly on a fault.
    let Ok(head) = (unsafe { bpf_probe_read_user::<[u8; 8]>(src.cast()) }) else { return };
    if !looks_like_hello(&head) {
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<Hello>(0) else {
        count(counter::RINGBUF_FULL);
        return;
    };
    let p = entry.as_mut_ptr();
    let avail = len - skip;
    let n = (if avail > HELLO_BYTES as u64 { HELLO_BYTES as u64 } else { avail }) as u32;
    // SAFETY: the reserved slot is valid for one Hello, whose first part
    // is an Event; the user read writes at most `HELLO_BYTES` into its
    // byte array (the mask keeps the verifier's bound).
    unsafe {
        let e = header(p.cast::<Event>(), sk, st, kind::HELLO, now);
        let bytes = (&raw mut (*p).bytes).cast::<c_void>();
        let n = n & (HELLO_BYTES as u32 * 2 - 1);
        let n = if n > HELLO_BYTES as u32 { HELLO_BYTES as u32 } else { n };
        e.bytes = if bpf_probe_read_user_raw(bytes, n, src.cast()) == 0 { n } else { 0 };
    }
    entry.submit(wakeup(kind::HELLO));
}

/// Bytes of the write `msg` (the send probe's `struct msghdr *`, read
/// before any is copied); 0 when unknown.
#[inline(always)]
pub fn write_len(msg: *const c_void) -> u64 {
    let msg_iter = global(&raw const OFFSETS.msg_iter);
    if msg_iter == 0 || msg.is_null() {
        return 0;
    }
    // SAFETY: pointer arithmetic only; the read is a probe read.
    let it = unsafe { msg.cast::<u8>().add(msg_iter as usize) };
    kread(it, global(&raw const OFFSETS.iter_count))
}

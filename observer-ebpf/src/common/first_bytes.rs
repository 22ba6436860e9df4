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
//! TLS or HTTP connection. On a connection that began with HTTP/2's
//! cleartext preface, a write while a reuse is unanswered or stalled has
//! its frame headers read ([`h2_starts_call`]: a new call, or only
//! control frames).

use core::ffi::c_void;

use aya_ebpf::helpers::{
    bpf_probe_read_kernel, bpf_probe_read_user, generated::bpf_probe_read_user as bpf_probe_read_user_raw,
};
use observer_common::{counter, h2, kind, role, tls, Event, Hello, SockState, HELLO_BYTES};

use super::{
    emit::{emit, header, submit},
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

/// `SockState::hello`: the first write not looked at yet; looked at
/// (and nothing more to see); a TLS `ClientHello` was written, so the next
/// write (the client's second flight) tells the version; that write was a
/// lone `ChangeCipherSpec`, so the one after tells.
pub(crate) const HELLO_FIRST: u8 = 0;
pub(crate) const HELLO_DONE: u8 = 1;
pub(crate) const HELLO_TLS_NEXT: u8 = 2;
pub(crate) const HELLO_TLS_AFTER_CCS: u8 = 3;
/// Looked at: the first write was HTTP/2's cleartext connection preface
/// (`PRI * HTTP/2.0`: prior knowledge, as gRPC without TLS), so later
/// writes are HTTP/2 frames whose types [`h2_starts_call`] reads.
pub(crate) const HELLO_H2C: u8 = 4;

/// The user buffer the write `msg` (the send probe's `struct msghdr *`,
/// before any byte is copied) starts with, and its bytes; `None` for
/// anything but a user buffer (`ITER_UBUF`, or an `ITER_IOVEC`'s first
/// segment) of at least `min` bytes.
#[inline(always)]
fn user_buf(msg: *const c_void, min: u64) -> Option<(*const u8, u64)> {
    let msg_iter = global(&raw const OFFSETS.msg_iter);
    if msg_iter == 0 || msg.is_null() {
        return None;
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
        return None;
    };
    if base == 0 || len <= skip || len - skip < min {
        return None;
    }
    Some(((base + skip) as *const u8, len - skip))
}

/// Look once at a client connection's first write (`msg` is the send
/// probe's `struct msghdr *`) and hand its first bytes to userspace if
/// they may carry a name.
#[inline(always)]
pub fn first_write(sk: *const c_void, msg: *const c_void, st: &mut SockState, now: u64) {
    st.hello = HELLO_DONE;
    if st.role == role::SERVER {
        return;
    }
    let Some((src, avail)) = user_buf(msg, 16) else { return };
    // SAFETY: a probe read of user memory; it fails cleanly on a fault.
    let Ok(head) = (unsafe { bpf_probe_read_user::<[u8; 8]>(src.cast()) }) else { return };
    if head == *b"PRI * HT" {
        st.hello = HELLO_H2C;
    }
    if !looks_like_hello(&head) {
        return;
    }
    let Some(mut entry) = EVENTS.reserve::<Hello>(0) else {
        count(counter::RINGBUF_FULL);
        return;
    };
    let p = entry.as_mut_ptr();
    if head[0] == 0x16 && head[5] == 1 {
        // A `ClientHello`: the client's next write tells the version.
        st.hello = HELLO_TLS_NEXT;
    }
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
    submit(entry, kind::HELLO);
}

/// A TLS client's second flight (a write after its `ClientHello`): the
/// version it negotiated, handed to userspace in a `server_name` record
/// of its own ([`observer_common::tls::second_flight`]). One 16-byte user
/// read per write until it tells, typically the one write after the
/// `ClientHello`.
#[inline(always)]
pub fn second_flight(sk: *const c_void, msg: *const c_void, st: &mut SockState, now: u64) {
    let after_ccs = st.hello == HELLO_TLS_AFTER_CCS;
    st.hello = HELLO_DONE;
    let Some((src, avail)) = user_buf(msg, 5) else { return };
    // A buffer shorter than 16 bytes is read whole only if the page it
    // ends on allows; a read that faults decides nothing.
    // SAFETY: a probe read of user memory; it fails cleanly on a fault.
    let Ok(b) = (unsafe { bpf_probe_read_user::<[u8; 16]>(src.cast()) }) else { return };
    match tls::second_flight(&b, avail as usize, after_ccs) {
        tls::Flight::Version(v) => emit(sk, st, kind::HELLO, now, |e| e.tls_version = v),
        tls::Flight::Next { after_ccs } => {
            st.hello = if after_ccs { HELLO_TLS_AFTER_CCS } else { HELLO_TLS_NEXT };
        }
        tls::Flight::Unknown => {}
    }
}

/// Whether the write `msg` (`len` bytes) on a prior-knowledge HTTP/2
/// connection ([`HELLO_H2C`]) starts a call, by its frames
/// ([`observer_common::h2`]: a `HEADERS` frame among the first few).
/// `None` when the frames cannot all be read here (not a user buffer, a
/// buffer split over `iovec`s, a fault, more frames than walked): the
/// caller decides by the write's size. One 9-byte user read per frame, only
/// for a write while a reuse is unanswered or its connection stalled
/// (`requests::new_call`), never on a busy exchange's write.
#[inline(always)]
pub fn h2_starts_call(msg: *const c_void, len: u64) -> Option<bool> {
    let (src, avail) = user_buf(msg, h2::HEADER)?;
    if avail != len {
        return None;
    }
    h2::walk(len, |off| {
        // SAFETY: a probe read of user memory inside the write's buffer;
        // it fails cleanly on a fault.
        unsafe { bpf_probe_read_user::<[u8; 9]>(src.wrapping_add(off as usize).cast()) }.ok()
    })
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

//! Send hook, hot path: `tp_btf/tcp_sendmsg_locked` (a tracepoint in
//! mainline since 6.16) fires inside `tcp_sendmsg_locked` under the socket
//! lock as payload is queued, *before* it is pushed to the wire and before
//! `write_seq` moves, so an RST that answers the write can never overtake
//! it. On kernels without that tracepoint the same body runs as
//! `fentry/tcp_sendmsg_locked` (5.5+ with BTF).
//!
//! A write on a socket reset or timed out while idle fails in the kernel
//! before it queues a byte. The tracepoint never sees it (it fires only
//! as payload is queued): `sock_send_length` decides it there. `fentry`
//! runs at the function's entry, so on that probe set this probe decides
//! it: the socket is `CLOSE` and the write returns its error.
//!
//! A connection's first write is also looked at once for the name the
//! client used (`common::hello`). A `sendmsg` of no bytes is no write
//! (the tracepoint never sees one; `fentry` skips it by its `size`).
//!
//! Cost: one socket-local storage lookup per run, plus a timestamp except
//! for a write right after the last read, a client's next request or a
//! server's answer (jiffies instead, no helper call); two field reads when
//! a request starts after a quiet spell. Never an event. `fentry` runs
//! once per `sendmsg`; the tracepoint once per chunk it queues (a large
//! write runs it about once per 20 KB: 48 runs per MB in BENCHMARKS.md
//! section 10), each chunk taking the full path.

use core::ffi::c_void;

use aya_ebpf::{
    macros::{btf_tracepoint, fentry},
    programs::{BtfTracePointContext, FEntryContext},
};

use crate::common::{
    adopt, busy_write_time, first_write, now, on_failed_write, on_send, second_flight, start_busy_write, write_fails,
    HELLO_FIRST, HELLO_TLS_AFTER_CCS, HELLO_TLS_NEXT,
};

#[inline(always)]
fn send(sk: *mut c_void, msg: *const c_void) {
    if sk.is_null() {
        return;
    }
    // A socket established before the probes attached is adopted here.
    let Some(st) = adopt(sk) else { return };
    // Once per connection (and once more for a TLS client's version):
    // every later write compares one byte.
    match st.hello {
        HELLO_FIRST => first_write(sk, msg, st, now()),
        HELLO_TLS_NEXT | HELLO_TLS_AFTER_CCS => second_flight(sk, msg, st, now()),
        _ => {}
    }
    if write_fails(st) {
        on_failed_write(sk, st, now());
        return;
    }
    // A write in a busy exchange needs no clock read (the clock is most of
    // this probe's cost).
    if let Some(t) = busy_write_time(st) {
        start_busy_write(st, t);
        return;
    }
    on_send(sk, msg, st, now());
}

observer_common::named_as!(tcp_sendmsg_locked, TCP_SENDMSG_LOCKED);

#[btf_tracepoint(function = "tcp_sendmsg_locked")]
pub fn tcp_sendmsg_locked(ctx: BtfTracePointContext) -> i32 {
    send(ctx.arg(0), ctx.arg(1));
    0
}

observer_common::named_as!(fentry_tcp_sendmsg_locked, FENTRY_TCP_SENDMSG_LOCKED);

#[fentry(function = "tcp_sendmsg_locked")]
pub fn fentry_tcp_sendmsg_locked(ctx: FEntryContext) -> i32 {
    // `size`, the third argument: a write of no bytes (Python's
    // `sendall(b"")` after a read) is no write. It would start a request
    // right after the read, which the peer's unread goodbye then
    // "answers", hiding its idle close. The tracepoint fires only as
    // payload is queued, so it never sees one.
    let size: usize = ctx.arg(2);
    if size != 0 {
        send(ctx.arg(0), ctx.arg(1));
    }
    0
}

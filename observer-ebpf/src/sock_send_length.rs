//! `tp_btf/sock_send_length` (6.3+; args `sk`, `ret`, `flags`): fires as
//! every `sendmsg` on any socket returns. Only a failed write matters: on a
//! TCP socket that was reset or timed out while idle, the write failed in
//! the kernel before a byte left the host (a failed reuse,
//! `failed_before_send`). The `tcp_sendmsg_locked` tracepoint (6.16+)
//! cannot see that write, since it fires only as payload is queued, so
//! the `tp_btf` probe set needs this hook; the `fentry` set decides it at
//! the send probe's entry instead.
//!
//! Attached on demand: only while a client socket whose next write fails
//! waits for its application (`FAILED_WRITE_WATCH`). Every `sendmsg` on the
//! host pays the tracepoint's dispatch while it is attached, for an event
//! that happens only on such a socket, so userspace attaches it when the
//! probes report the first one and detaches it once none has waited for a
//! while. A write made before it came is settled at the socket's destroy
//! (`on_destroy`). While attached: one argument compare per `sendmsg`
//! (`ret >= 0` returns at once); a storage lookup only for a failed write.

use core::ffi::c_void;

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

use crate::common::{now, on_failed_write, storage, write_fails};

observer_common::named_as!(sock_send_length, SOCK_SEND_LENGTH);

#[btf_tracepoint(function = "sock_send_length")]
pub fn sock_send_length(ctx: BtfTracePointContext) -> i32 {
    let ret: i32 = ctx.arg(1);
    if ret >= 0 {
        return 0;
    }
    let sk: *mut c_void = ctx.arg(0);
    if sk.is_null() {
        return 0;
    }
    // Only sockets with our state (TCP sockets we track) have storage.
    if let Some(st) = storage(sk, false) {
        if write_fails(st) {
            on_failed_write(sk, st, now());
        }
    }
    0
}

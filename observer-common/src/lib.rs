//! Types that cross the kernel/userspace boundary.
//!
//! Every type here is `#[repr(C)]`, has no implicit padding (checked by the
//! size asserts below) and is plain old data, so the eBPF side can write it
//! into a ring buffer or map and userspace can read it back byte for byte.
//! The `user` feature adds `aya::Pod` impls for userspace. The map records
//! (`SockRecord`, `DoomedRecord`, `TupleKey`, `ClosedIdle`, `MappedFile`)
//! live in `records`, the kernel field offsets the probes read in
//! `offsets`, the per-socket state in `state`.
#![no_std]

/// `AF_INET`, as the kernel reports it in tracepoint `family` fields.
pub const AF_INET: u16 = 2;
/// `AF_INET6`, as the kernel reports it in tracepoint `family` fields.
pub const AF_INET6: u16 = 10;
/// `IPPROTO_TCP`.
pub const IPPROTO_TCP: u16 = 6;

/// A write of at most this many bytes may be a control frame (an HTTP/2
/// `RST_STREAM` or `WINDOW_UPDATE` of 13 bytes, a `PING` of 17, alone or
/// in one TLS record: up to 29 bytes more); the exact sizes below decide.
pub const CONTROL_FRAME_BYTES: u32 = 48;

/// The thread name of `observer probe`'s connections. It decides nothing
/// by itself: it only spares every other connection the kernel-side check
/// of the connecting executable (see `Event::own`), which a thread so
/// named gets.
pub const PROBE_THREAD: &str = "observer-probe";

/// [`PROBE_THREAD`] as the kernel keeps it (`comm`, NUL padded).
pub const PROBE_THREAD_COMM: [u8; 16] = {
    let mut comm = [0u8; 16];
    let name = PROBE_THREAD.as_bytes();
    let mut i = 0;
    while i < name.len() {
        comm[i] = name[i];
        i += 1;
    }
    comm
};

/// TLS record overhead beside cleartext: none; TLS 1.2 with
/// `ChaCha20-Poly1305` (5 header + 16 tag); TLS 1.3 (5 + 1 content type +
/// 16 tag); TLS 1.2 with AES-GCM (5 + 8 explicit nonce + 16 tag).
const TLS_OVERHEADS: [u32; 4] = [0, 21, 22, 29];

/// Whether `bytes` is exactly an HTTP/2 `PING` (9-byte frame header and 8
/// bytes of data), cleartext or alone in one TLS record: 17, 38, 39 or 46.
/// An answered exchange of that size is a ping (the `pings` basis of a
/// lower bound), never a small request (a Redis `PING` is 14 bytes).
#[must_use]
pub const fn is_h2_ping(bytes: u32) -> bool {
    is_record_of(bytes, 17)
}

/// Whether `bytes` is exactly one lone HTTP/2 control frame a client writes
/// on a connection without starting a call: a `SETTINGS` ack (9 bytes), a
/// `RST_STREAM` or `WINDOW_UPDATE` (13: gRPC's cancel at a call's
/// deadline) or a `PING` (17), cleartext or alone in one TLS record. On a
/// stalled connection every other write is a new call (a request), which
/// fails.
#[must_use]
pub const fn is_h2_control(bytes: u32) -> bool {
    is_record_of(bytes, 9) || is_record_of(bytes, 13) || is_record_of(bytes, 17)
}

const fn is_record_of(bytes: u32, frame: u32) -> bool {
    let mut i = 0;
    while i < TLS_OVERHEADS.len() {
        if bytes == frame + TLS_OVERHEADS[i] {
            return true;
        }
        i += 1;
    }
    false
}

/// Kernel TCP states (`include/net/tcp_states.h`), stable ABI.
pub mod tcp_state {
    pub const ESTABLISHED: i32 = 1;
    pub const SYN_SENT: i32 = 2;
    pub const SYN_RECV: i32 = 3;
    pub const FIN_WAIT1: i32 = 4;
    pub const FIN_WAIT2: i32 = 5;
    pub const TIME_WAIT: i32 = 6;
    pub const CLOSE: i32 = 7;
    pub const CLOSE_WAIT: i32 = 8;
    pub const LAST_ACK: i32 = 9;
    pub const LISTEN: i32 = 10;
    pub const CLOSING: i32 = 11;
}

/// What an [`Event`] reports. Values are part of the wire format.
pub mod kind {
    /// A TCP connection reached ESTABLISHED.
    pub const ESTABLISHED: u8 = 1;
    /// A TCP connection reached CLOSE.
    pub const CLOSED: u8 = 2;
    /// The outcome of a reuse (first request after idle) is known.
    pub const REUSE: u8 = 3;
    /// The peer sent FIN or RST while the socket was idle with nothing outstanding.
    pub const PEER_CLOSE: u8 = 4;
    /// The local process closed a socket that had been idle.
    pub const LOCAL_CLOSE: u8 = 5;
    /// The peer closed or reset after it had received (acknowledged) a
    /// request and before any response byte: the peer's request deadline.
    pub const REQUEST_ABORTED: u8 = 6;
    /// We closed with a request outstanding: our own request deadline.
    pub const REQUEST_TIMEOUT: u8 = 7;
    /// Server side: a client wrote on a connection we had already closed
    /// idle, and the kernel answered with an RST.
    pub const LATE_REUSE: u8 = 8;
    /// The application closed a client socket the peer had closed (FIN or
    /// RST) or the kernel had timed out while idle, without writing on it:
    /// the pool discarded a dead socket instead of failing on it.
    pub const DISCARDED_DEAD: u8 = 9;
    /// A client connection's first write starts like a TLS `ClientHello` or
    /// an HTTP/1.x request: a [`Hello`] record carries its first bytes, for
    /// the name the client used (SNI, `Host`).
    pub const HELLO: u8 = 10;
    /// Not an event: a control record from the probes to the loader. A
    /// client socket's writes now fail in the kernel (it was reset or timed
    /// out while idle) and the failed-write hook is not attached: attach
    /// it. The loader consumes it; it never reaches the event stream.
    pub const WATCH: u8 = 11;
}

/// Role of a socket. Values are part of the wire format.
pub mod role;

/// Outcome of a reuse. Values are part of the wire format.
pub mod outcome {
    pub const NONE: u8 = 0;
    /// A response byte arrived after the reuse write.
    pub const OK: u8 = 1;
    /// The peer's FIN arrived before any response byte.
    pub const EOF: u8 = 2;
    /// An RST arrived before any response byte.
    pub const RESET: u8 = 3;
    /// The reuse's bytes were retransmitted and still unacknowledged
    /// after `stall_after` when the socket ended.
    pub const STALL: u8 = 4;
    /// The kernel had already given up on the socket while it was idle
    /// (keep-alive or retransmission timeout, `ETIMEDOUT`) when the
    /// application wrote: the write failed before a byte left the host.
    pub const TIMED_OUT: u8 = 5;
}

/// How a stall ended, how a peer closed, or how an `ok` reuse ended.
/// Values are part of the wire format.
pub mod how {
    pub const NONE: u8 = 0;
    /// Peer close by FIN.
    pub const FIN: u8 = 1;
    /// Peer close by RST.
    pub const RST: u8 = 2;
    /// (Kept for old recordings: a stall ended by a late response.)
    pub const RESPONSE: u8 = 3;
    /// Stall ended by the local process closing the socket.
    pub const LOCAL_CLOSE: u8 = 4;
    /// Stall ended by the kernel giving up (`ETIMEDOUT`).
    pub const TIMEOUT: u8 = 5;
    /// Stall ended because the socket was destroyed some other way.
    pub const DESTROYED: u8 = 6;
    /// `ok`: the response arrived and the peer's FIN or RST followed it.
    pub const CLOSED_AFTER_RESPONSE: u8 = 7;
    /// Stall decided at the application's next write after a quiet spell
    /// (an HTTP/2 `RST_STREAM` at a deadline, a `PING`, another stream, a
    /// retry), the reuse's bytes still unacknowledged and retransmitted
    /// past `stall_after`.
    pub const APP_WRITE: u8 = 8;
    /// A later request on a connection whose earlier reuse stalled, written
    /// while those bytes were still unacknowledged: the client's call
    /// fails, but the first stall dates the death, so its idle age is no
    /// evidence of the path's timeout.
    pub const AFTER_STALL: u8 = 9;
    /// A reuse written while the peer's unsolicited bytes (an HTTP/2
    /// `GOAWAY`, a TLS `close_notify`) waited unread, and ended unanswered:
    /// the client wrote past the server's drain signal. A failure, dated
    /// by its own idle age (the peer began its close before it).
    pub const AFTER_GOODBYE: u8 = 10;
}

/// Bits of [`Event::flags`].
pub mod flags {
    /// The peer's FIN had arrived before the reuse write: no request byte
    /// reached a live peer, so one retry on a fresh connection is safe.
    pub const FIN_BEFORE_WRITE: u8 = 1;
    /// A request was outstanding (written, not yet answered) at close.
    pub const REQUEST_OUTSTANDING: u8 = 2;
    /// The peer had closed first (local close is cleanup, not a pool timeout).
    pub const PEER_CLOSED_FIRST: u8 = 4;
    /// The socket's state was first seen after it was established.
    pub const PREEXISTING: u8 = 8;
    /// The socket has TCP keep-alive enabled (`SO_KEEPALIVE`).
    pub const KEEPALIVE: u8 = 16;
    /// A small control write (TLS `close_notify`, GOAWAY) came just before
    /// this close and was taken as part of it, not as a request.
    pub const CONTROL_WRITE: u8 = 32;
    /// The request this event is about was a reuse (first after idle).
    pub const REUSE: u8 = 64;
    /// The reuse write failed in the kernel before any byte left the host:
    /// the socket had been reset or timed out while idle.
    pub const FAILED_BEFORE_SEND: u8 = 128;
}

/// [`Event::ttl_flags`] and [`SockState::ttl_flags`]: how the segments
/// whose TTL the probes read arrived (who sent a reset is told by them).
pub mod ttl {
    /// The peer's SYN-ACK arrived by the loopback interface (this host).
    pub const PEER_LOOPBACK: u8 = 1;
    /// The RST arrived by the loopback interface: made by this host's own
    /// stack (its firewall's `reject`, conntrack), never routed.
    pub const RESET_LOOPBACK: u8 = 2;
    /// An RST arrived and was read (its TTL is in `reset_ttl`).
    pub const RESET_SEEN: u8 = 4;
    /// The IP header's TTL (IPv4) or hop limit (IPv6) at `header[..]`'s
    /// version: byte 8 or 7 from the header's start; `None`: neither.
    #[must_use]
    pub const fn offset_for_version(first_byte: u8) -> Option<usize> {
        match first_byte >> 4 {
            4 => Some(8),
            6 => Some(7),
            _ => None,
        }
    }
}

/// [`SockState::dead`]: how the socket died while idle (no request
/// outstanding), in the low bits, and what the application did since.
pub mod dead {
    /// Alive (or it died with a request outstanding, which that request's
    /// outcome reports).
    pub const NONE: u8 = 0;
    /// The peer's FIN arrived (`CLOSE_WAIT`): a write still goes out.
    pub const FIN: u8 = 1;
    /// The peer's RST arrived (`CLOSE`, `sk_err` = `ECONNRESET`).
    pub const RST: u8 = 2;
    /// The kernel gave up (`CLOSE` with `sk_err` set, no RST): keep-alive
    /// probes or a retransmission went unanswered.
    pub const TIMEOUT: u8 = 3;
    /// Mask of the kind.
    pub const KIND: u8 = 0x03;
    /// A reuse on this client connection stalled and the application kept
    /// the connection: while the stalled bytes (from `req_snd_seq`) stay
    /// unacknowledged, no request starts, and each later request written
    /// on it is a failure dated by that stall (`how::AFTER_STALL`).
    pub const STALLED: u8 = 0x04;
    /// The socket has an entry in the `DOOMED` map (the probes' own
    /// bookkeeping: only a listed socket is removed from the map, so a
    /// close costs no hash-table delete when nothing was entered).
    pub const LISTED: u8 = 0x20;
    /// The death was an idle close (it came at least `MIN_IDLE_NS` after
    /// the last data): a `peer_close_while_idle` was emitted for it.
    pub const IDLE: u8 = 0x40;
    /// The application has acted on it: it wrote a request (a failed
    /// reuse) or closed the socket (`discarded_dead`). Reported once.
    pub const USED: u8 = 0x80;
}

/// A dead client socket and the failed-write hook (`SockState::watch`),
/// on the probe set that attaches that hook on demand.
pub mod watch {
    /// The socket is counted in `FAILED_WRITE_WATCH` (slot 0): a client
    /// socket whose next write fails in the kernel, not yet acted on.
    pub const PENDING: u8 = 0x01;
    /// It died while the failed-write hook was not attached: a write made
    /// before the hook came went unseen, and is settled at its destroy.
    pub const UNWATCHED: u8 = 0x02;
    /// `tcp_sock.app_limited` was 0 when it died. `tcp_sendmsg_locked`
    /// sets it (never to 0) before it fails a write on a closed socket,
    /// and nothing else touches it on a closed socket: if it is still 0 at
    /// the destroy, no write was made.
    pub const NO_WRITE_MARK: u8 = 0x04;
}

/// Indices into the `COUNTERS` per-CPU array.
pub mod counter {
    /// `bpf_ringbuf_reserve` failed: the event was lost.
    pub const RINGBUF_FULL: u32 = 0;
    /// Socket-local storage could not be created (kernel memory).
    pub const MAP_FULL: u32 = 1;
    /// A reuse ended with no outcome: unanswered within the bound, a
    /// one-way writer, or the socket ended without a verdict.
    pub const REUSE_UNRESOLVED: u32 = 2;
    /// A dead socket could not be entered in the `DOOMED` map (full): it
    /// is missing from `doomed_idle_sockets`.
    pub const DOOMED_FULL: u32 = 3;
    /// A listening port could not be entered in `LISTENERS` (full): roles
    /// of sockets first seen on it fall back to the ports.
    pub const LISTENERS_FULL: u32 = 4;
    /// A server's idle close entered in `CLOSED_IDLE` (a new key).
    pub const CLOSED_IDLE_ADDED: u32 = 5;
    /// An entry removed from `CLOSED_IDLE` (a late reuse seen, or its
    /// 4-tuple reused). Added - removed - the entries left = the ones the
    /// LRU map evicted: idle closes whose late reuse could no longer be seen.
    pub const CLOSED_IDLE_REMOVED: u32 = 6;
    /// A client socket reset or timed out while idle, before the
    /// failed-write hook was attached, whose error a syscall took before
    /// the hook came (a write, a failed reuse; or a read, the pool finding
    /// it dead): neither is claimed, this counts it.
    pub const FAILED_WRITE_UNSEEN: u32 = 7;
    /// Number of counters.
    pub const COUNT: u32 = 8;
}

/// Names of the load-time globals in the eBPF object. Every `OFF_*` is a
/// byte offset (or bit number) resolved from the running kernel's BTF.
pub mod globals {
    /// `u64`: minimum idle time before a write counts as a reuse.
    pub const MIN_IDLE_NS: &str = "MIN_IDLE_NS";
    /// `u64`: how long a retransmitted reuse goes unacknowledged before it is a stall.
    pub const STALL_AFTER_NS: &str = "STALL_AFTER_NS";
    /// `u64`: a request unanswered this long is dropped as unresolved.
    pub const ANSWER_WITHIN_NS: &str = "ANSWER_WITHIN_NS";
    /// `u64`: length of a jiffy in ns (`clock_getres(CLOCK_MONOTONIC_COARSE)`);
    /// 0 = unknown (every write reads the clock).
    pub const TICK_NS: &str = "TICK_NS";
    /// `u64`: 1 = emit `closed` events (only printed with `--connections`).
    pub const EMIT_CLOSED: &str = "EMIT_CLOSED";
    /// The kernel struct fields the programs read, in the order of
    /// [`crate::Offsets`]; one `u64` global each.
    pub const OFFSETS: &str = "OFFSETS";
    /// `u64`: BTF type ID of `struct tcp_sock` (for `bpf_rdonly_cast`).
    pub const TCP_SOCK_BTF_ID: &str = "TCP_SOCK_BTF_ID";
    /// `u64`: size of the ring buffer in bytes (for the wakeup decision).
    pub const RING_BYTES: &str = "RING_BYTES";
    /// `u64`: 1 = the probe set decides kernel-failed writes with a hook
    /// attached on demand (`sock_send_length`), so the probes count the
    /// sockets that need it in `FAILED_WRITE_WATCH`; 0 = the send probe
    /// decides them itself (`fentry`).
    pub const FAILED_WRITE_HOOK: &str = "FAILED_WRITE_HOOK";
}

pub mod h2;
pub mod kfunc;
pub mod program;
pub mod tls;

/// The send probe's clock-free timing of a write in a busy exchange (a
/// client's next request, a server's answer), here so that it is tested on
/// the host.
pub mod busy {
    /// Time of a write made surely less than `window_ns` after `last_ns`
    /// (the arrival of the data last read), from jiffies instead of a
    /// clock read; `None` when that is not sure or the clocks are unknown.
    ///
    /// `epoch_mono` is the monotonic time of jiffy 0 as last anchored (an
    /// anchor is within a tick of the truth), `suspended_ns` boot minus
    /// monotonic. Every other time is on the boot clock. The estimate from
    /// jiffies is within a tick of now, so the gate keeps two ticks of
    /// margin on each side and the start returned is never late and at
    /// most three ticks early: the later of the last arrival and the
    /// jiffies' lower bound. In a busy exchange the write follows the read
    /// within microseconds, so the start is that arrival, microseconds
    /// early; only a write two or more ticks after it is timed from jiffies.
    #[inline(always)]
    #[must_use]
    #[allow(clippy::inline_always, reason = "called from BPF programs, which must stay one verifier unit")]
    pub fn write_start(
        (epoch_mono, jiffies, tick_ns): (u64, u64, u64),
        suspended_ns: u64,
        last_ns: u64,
        window_ns: u64,
    ) -> Option<u64> {
        if tick_ns == 0 || epoch_mono == 0 || window_ns <= 4 * tick_ns {
            return None;
        }
        let estimate = epoch_mono.wrapping_add(jiffies.wrapping_mul(tick_ns)).wrapping_add(suspended_ns);
        if estimate.wrapping_add(2 * tick_ns).saturating_sub(last_ns) >= window_ns - 2 * tick_ns {
            return None;
        }
        let lower = estimate.saturating_sub(2 * tick_ns);
        Some(if last_ns > lower { last_ns } else { lower })
    }
}

/// Names of maps in the eBPF object.
pub mod maps {
    pub const EVENTS: &str = "EVENTS";
    /// The dead sockets processes still hold: socket id -> `DoomedRecord`.
    pub const DOOMED: &str = "DOOMED";
    pub const COUNTERS: &str = "COUNTERS";
    /// Ports sockets listen on: `role::listener_key(netns, port)` -> 1.
    /// The state hook enters and removes them; the socket iterator enters
    /// those that listened before the probes.
    pub const LISTENERS: &str = "LISTENERS";
    /// Network namespaces (inode -> 1) whose listeners the daemon has
    /// walked with the iterator since the probes were attached: there
    /// [`LISTENERS`] holds every listener.
    pub const WALKED_NETNS: &str = "WALKED_NETNS";
    /// A server's idle closes (`TupleKey` -> `ClosedIdle`), an LRU map:
    /// userspace counts its entries to tell what it evicted.
    pub const CLOSED_IDLE: &str = "CLOSED_IDLE";
    /// Three `u64`: `CLOCK_BOOTTIME - CLOCK_MONOTONIC` in ns (time suspended),
    /// kept current by userspace and by the probes off the hot path; the
    /// probes' own jiffies epoch; and when the probes last refreshed them.
    pub const CLOCK_OFFSET: &str = "CLOCK_OFFSET";
    /// Two `u64`: slot 0, the client sockets whose next write fails in
    /// the kernel, not yet acted on (the probes count them); slot 1, 1
    /// while the failed-write hook is attached and stable (userspace sets
    /// it after attaching, clears it a tick before detaching).
    pub const FAILED_WRITE_WATCH: &str = "FAILED_WRITE_WATCH";
    /// One `u64`: the address of the daemon's own executable's inode
    /// (`task->mm->exe_file->f_inode`), set by the state hook when the
    /// daemon connects from a thread named [`crate::PROBE_THREAD`] at start;
    /// a connection from a thread so named in a process whose executable
    /// is that same inode is `observer probe`'s. An address compared,
    /// never read through; 0 = not known.
    pub const OWN_EXE: &str = "OWN_EXE";
    /// Two `u32`: the process (tgid) whose mapped files the
    /// `iter/task_vma` program lists next (0 = none); and 0 until the
    /// program has written that process's executable (userspace clears it
    /// before each listing).
    pub const FILES_OF: &str = "FILES_OF";
    /// One [`crate::MappedFile`] per CPU: the task-VMA iterator's record,
    /// too large for the BPF stack.
    pub const MAPPED_SCRATCH: &str = "MAPPED_SCRATCH";
}

/// One event sent from the kernel to userspace through the ring buffer.
///
/// Addresses are in network byte order as the kernel stores them; IPv4
/// addresses use the first 4 bytes. Ports are in host byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// `bpf_ktime_get_boot_ns()` when the event was emitted (`CLOCK_BOOTTIME`).
    pub ts_ns: u64,
    /// Per-boot socket number (never a kernel address).
    pub sock_id: u64,
    /// Idle age: time since the last data byte in either direction.
    pub idle_ns: u64,
    /// Reuses, aborted and timed-out requests: time since the request
    /// write; late reuses: time since our close.
    pub elapsed_ns: u64,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// Process (thread group) that did the reuse write, or that was current.
    pub tgid: u32,
    /// Retransmits of the request before the outcome.
    pub retransmits: u32,
    /// `tcp_sock.keepalive_time` in jiffies when keep-alive is on (0 = the
    /// sysctl default).
    pub keepalive_jiffies: u32,
    /// Request bytes written (requests), or 0.
    pub bytes: u32,
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub kind: u8,
    pub role: u8,
    pub outcome: u8,
    pub how: u8,
    pub flags: u8,
    /// 1: the socket was connected by an observer process (its executable
    /// is the daemon's own file, checked in the kernel at `connect()`):
    /// `observer probe`'s connection, never the application's evidence.
    pub own: u8,
    /// IP TTL (hop limit) of the peer's SYN-ACK as it arrived; 0 = not seen.
    pub peer_ttl: u8,
    /// IP TTL (hop limit) of the RST this socket received; 0 = none.
    pub reset_ttl: u8,
    /// [`ttl`] bits: how the SYN-ACK and the RST arrived.
    pub ttl_flags: u8,
    /// A `server_name` record of a TLS connection's second flight: the
    /// negotiated version's minor ([`tls::second_flight`]: 1 = TLS 1.0 …
    /// 4 = TLS 1.3); 0 on every other record.
    pub tls_version: u8,
    /// Command name of `tgid`, NUL padded.
    pub comm: [u8; 16],
    /// cgroup v2 id (the cgroup directory's inode) of `tgid` at its last
    /// request write, or first write; 0 = no write seen yet.
    pub cgroup_id: u64,
    /// Inode of the socket's network namespace (`/proc/PID/ns/net`).
    pub netns: u32,
    /// Explicit padding, always zero.
    pub pad2: u32,
}

/// Size of [`Event`] on the wire.
pub const EVENT_SIZE: usize = 128;
const _: () = assert!(core::mem::size_of::<Event>() == EVENT_SIZE);
const _: () = assert!(core::mem::align_of::<Event>() == 8);

impl Event {
    /// An all-zero event (every field has a meaningful zero).
    pub const ZERO: Self = Self {
        ts_ns: 0,
        sock_id: 0,
        idle_ns: 0,
        elapsed_ns: 0,
        saddr: [0; 16],
        daddr: [0; 16],
        tgid: 0,
        retransmits: 0,
        keepalive_jiffies: 0,
        bytes: 0,
        sport: 0,
        dport: 0,
        family: 0,
        kind: 0,
        role: 0,
        outcome: 0,
        how: 0,
        flags: 0,
        own: 0,
        peer_ttl: 0,
        reset_ttl: 0,
        ttl_flags: 0,
        tls_version: 0,
        comm: [0; 16],
        cgroup_id: 0,
        netns: 0,
        pad2: 0,
    };
}

/// Bytes of a client connection's first write a [`Hello`] record carries.
pub const HELLO_BYTES: usize = 512;

/// A [`kind::HELLO`] record: the event header, then the first
/// `event.bytes` (at most [`HELLO_BYTES`]) bytes of the connection's first
/// write; the rest of `bytes` is undefined and never read.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hello {
    pub event: Event,
    pub bytes: [u8; HELLO_BYTES],
}

/// Size of a [`Hello`] record on the wire.
pub const HELLO_SIZE: usize = EVENT_SIZE + HELLO_BYTES;
const _: () = assert!(core::mem::size_of::<Hello>() == HELLO_SIZE);

mod state;
pub use state::{SockState, SOCK_STATE_SIZE};

mod offsets;
pub use offsets::{Offsets, OFFSETS_COUNT};

mod records;
pub use records::{
    ClosedIdle, DoomedRecord, MappedFile, SockRecord, TupleKey, DOOMED_RECORD_SIZE, MAPPED_DEPTH, MAPPED_FILE_SIZE,
    MAPPED_NAME_BYTES, SOCK_RECORD_SIZE,
};

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of them are repr(C), contain only integers and byte arrays,
    // and have no padding (asserted above), so any byte pattern is valid.
    unsafe impl aya::Pod for super::Event {}
    unsafe impl aya::Pod for super::Hello {}
    unsafe impl aya::Pod for super::SockState {}
    unsafe impl aya::Pod for super::SockRecord {}
    unsafe impl aya::Pod for super::DoomedRecord {}
    unsafe impl aya::Pod for super::TupleKey {}
    unsafe impl aya::Pod for super::ClosedIdle {}
    unsafe impl aya::Pod for super::MappedFile {}
    unsafe impl aya::Pod for super::Offsets {}
}

#[cfg(test)]
mod tests;

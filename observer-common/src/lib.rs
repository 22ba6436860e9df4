//! Types that cross the kernel/userspace boundary.
//!
//! Every type here is `#[repr(C)]`, has no implicit padding (checked by the
//! size asserts below) and is plain old data, so the eBPF side can write it
//! into a ring buffer or map and userspace can read it back byte for byte.
//! The `user` feature adds `aya::Pod` impls for userspace.
#![no_std]

/// `AF_INET`, as the kernel reports it in tracepoint `family` fields.
pub const AF_INET: u16 = 2;
/// `AF_INET6`, as the kernel reports it in tracepoint `family` fields.
pub const AF_INET6: u16 = 10;
/// `IPPROTO_TCP`.
pub const IPPROTO_TCP: u16 = 6;

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
    /// The outcome of a reuse (first write after idle) is known.
    pub const REUSE: u8 = 3;
    /// The peer sent FIN or RST while the socket was idle with nothing outstanding.
    pub const PEER_CLOSE: u8 = 4;
    /// The local process closed a socket that had been idle.
    pub const LOCAL_CLOSE: u8 = 5;
}

/// Role of a socket. Values are part of the wire format.
pub mod role {
    /// Not known: the socket existed before the probes were attached.
    pub const UNKNOWN: u8 = 0;
    /// We connected (`SYN_SENT` -> `ESTABLISHED`).
    pub const CLIENT: u8 = 1;
    /// We accepted (`SYN_RECV` -> `ESTABLISHED`).
    pub const SERVER: u8 = 2;
}

/// Outcome of a reuse. Values are part of the wire format.
pub mod outcome {
    pub const NONE: u8 = 0;
    /// Response payload arrived after the write.
    pub const OK: u8 = 1;
    /// The peer's FIN arrived and no response payload came.
    pub const EOF: u8 = 2;
    /// An RST arrived after the write, before any response payload.
    pub const RESET: u8 = 3;
    /// The write was retransmitted with no response within `stall_after`.
    pub const STALL: u8 = 4;
}

/// How a stall ended, or how a peer closed. Values are part of the wire format.
pub mod how {
    pub const NONE: u8 = 0;
    /// Peer close by FIN.
    pub const FIN: u8 = 1;
    /// Peer close by RST.
    pub const RST: u8 = 2;
    /// Stall ended by a response after all.
    pub const RESPONSE: u8 = 3;
    /// Stall ended by the local process closing the socket.
    pub const LOCAL_CLOSE: u8 = 4;
    /// Stall ended by the kernel giving up (`ETIMEDOUT`).
    pub const TIMEOUT: u8 = 5;
    /// Stall ended because the socket was destroyed some other way.
    pub const DESTROYED: u8 = 6;
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
}

/// Indices into the `COUNTERS` per-CPU array.
pub mod counter {
    /// `bpf_ringbuf_reserve` failed: the event was lost.
    pub const RINGBUF_FULL: u32 = 0;
    /// The per-socket map was full: a socket went untracked.
    pub const MAP_FULL: u32 = 1;
    /// A reuse was superseded by a later one before any outcome was seen.
    pub const REUSE_UNRESOLVED: u32 = 2;
    /// Number of counters.
    pub const COUNT: u32 = 3;
}

/// Names of the load-time globals in the eBPF object.
pub mod globals {
    /// `u64`: minimum idle time before a write counts as a reuse.
    pub const MIN_IDLE_NS: &str = "MIN_IDLE_NS";
    /// `u64`: how long a retransmitted reuse goes unanswered before it is a stall.
    pub const STALL_AFTER_NS: &str = "STALL_AFTER_NS";
}

/// Names of maps in the eBPF object.
pub mod maps {
    pub const EVENTS: &str = "EVENTS";
    pub const SOCKS: &str = "SOCKS";
    pub const COUNTERS: &str = "COUNTERS";
}

/// One event sent from the kernel to userspace through the ring buffer.
///
/// Addresses are in network byte order as the kernel stores them; IPv4
/// addresses use the first 4 bytes. Ports are in host byte order.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Event {
    /// `bpf_ktime_get_ns()` when the event was emitted (`CLOCK_MONOTONIC`).
    pub ts_ns: u64,
    /// Kernel address of the socket, an opaque identity while it lives.
    pub sock_id: u64,
    /// Idle age: time since the last payload in either direction.
    pub idle_ns: u64,
    /// For reuses: time from the reuse write to the outcome.
    pub elapsed_ns: u64,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// Process (thread group) that did the reuse write, or that was current.
    pub tgid: u32,
    /// Retransmits of the reuse write before the outcome.
    pub retransmits: u32,
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub kind: u8,
    pub role: u8,
    pub outcome: u8,
    pub how: u8,
    pub flags: u8,
    /// Explicit padding, always zero.
    pub pad: [u8; 5],
    /// Command name of `tgid`, NUL padded.
    pub comm: [u8; 16],
}

/// Size of [`Event`] on the wire.
pub const EVENT_SIZE: usize = 104;
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
        sport: 0,
        dport: 0,
        family: 0,
        kind: 0,
        role: 0,
        outcome: 0,
        how: 0,
        flags: 0,
        pad: [0; 5],
        comm: [0; 16],
    };
}

/// Per-socket state the probes keep in the `SOCKS` hash map, keyed by the
/// socket's kernel address. Userspace reads it to see current idle ages.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockState {
    /// Last payload written by the application (ns, monotonic); 0 = never.
    pub last_send_ns: u64,
    /// Last payload received by the application (ns, monotonic); 0 = never.
    pub last_recv_ns: u64,
    /// When the pending reuse was written; 0 = no reuse pending.
    pub reuse_ns: u64,
    /// Idle age at the pending reuse.
    pub reuse_idle_ns: u64,
    /// When the peer's FIN arrived; 0 = not yet.
    pub peer_fin_ns: u64,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub tgid: u32,
    pub retransmits: u32,
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub role: u8,
    /// `flags::*` bits that apply to the socket.
    pub flags: u8,
    pub comm: [u8; 16],
}

impl SockState {
    /// A socket nothing is known about yet.
    pub const ZERO: Self = Self {
        last_send_ns: 0,
        last_recv_ns: 0,
        reuse_ns: 0,
        reuse_idle_ns: 0,
        peer_fin_ns: 0,
        saddr: [0; 16],
        daddr: [0; 16],
        tgid: 0,
        retransmits: 0,
        sport: 0,
        dport: 0,
        family: 0,
        role: 0,
        flags: 0,
        comm: [0; 16],
    };
}

/// Size of [`SockState`] in the map.
pub const SOCK_STATE_SIZE: usize = 104;
const _: () = assert!(core::mem::size_of::<SockState>() == SOCK_STATE_SIZE);

/// Scratch written by `inet_sk_error_report` (which carries no socket
/// pointer) and read by the `CLOSE` transition that follows on the same CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LastError {
    pub ts_ns: u64,
    pub error: i32,
    pub sport: u16,
    pub dport: u16,
}

const _: () = assert!(core::mem::size_of::<LastError>() == 16);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all three are repr(C), contain only integers and byte arrays,
    // and have no padding (asserted above), so any byte pattern is valid.
    unsafe impl aya::Pod for super::Event {}
    unsafe impl aya::Pod for super::SockState {}
    unsafe impl aya::Pod for super::LastError {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn event_layout_is_stable() {
        assert_eq!(offset_of!(Event, ts_ns), 0);
        assert_eq!(offset_of!(Event, sock_id), 8);
        assert_eq!(offset_of!(Event, idle_ns), 16);
        assert_eq!(offset_of!(Event, elapsed_ns), 24);
        assert_eq!(offset_of!(Event, saddr), 32);
        assert_eq!(offset_of!(Event, daddr), 48);
        assert_eq!(offset_of!(Event, tgid), 64);
        assert_eq!(offset_of!(Event, retransmits), 68);
        assert_eq!(offset_of!(Event, sport), 72);
        assert_eq!(offset_of!(Event, dport), 74);
        assert_eq!(offset_of!(Event, family), 76);
        assert_eq!(offset_of!(Event, kind), 78);
        assert_eq!(offset_of!(Event, flags), 82);
        assert_eq!(offset_of!(Event, comm), 88);
        assert_eq!(core::mem::size_of::<Event>(), EVENT_SIZE);
    }

    #[test]
    fn sock_state_layout_is_stable() {
        assert_eq!(offset_of!(SockState, saddr), 40);
        assert_eq!(offset_of!(SockState, daddr), 56);
        assert_eq!(offset_of!(SockState, tgid), 72);
        assert_eq!(offset_of!(SockState, sport), 80);
        assert_eq!(offset_of!(SockState, family), 84);
        assert_eq!(offset_of!(SockState, role), 86);
        assert_eq!(offset_of!(SockState, flags), 87);
        assert_eq!(offset_of!(SockState, comm), 88);
        assert_eq!(core::mem::size_of::<SockState>(), SOCK_STATE_SIZE);
    }

    #[test]
    fn last_error_layout_is_stable() {
        assert_eq!(offset_of!(LastError, error), 8);
        assert_eq!(offset_of!(LastError, sport), 12);
        assert_eq!(offset_of!(LastError, dport), 14);
    }
}

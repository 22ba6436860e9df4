//! The records the probes keep in maps and the socket iterator writes:
//! the at-risk view's socket record, a dead socket still held, the key
//! and value of the server side's idle closes. Same rules as the crate
//! root: `#[repr(C)]`, no implicit padding, sizes asserted.

use crate::{Event, SockState};

/// One socket as the `iter/tcp` program writes it (the at-risk view).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockRecord {
    pub id: u64,
    /// Last data either way (ns, boot clock).
    pub last_ns: u64,
    /// Outstanding request since (ns, boot clock); 0 = none.
    pub req_ns: u64,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub role: u8,
    pub flags: u8,
    /// Inode of the socket's network namespace.
    pub netns: u32,
    pub pad: u32,
    /// cgroup v2 id of the socket's recorded process (0 = none yet).
    pub cgroup_id: u64,
}

/// Size of [`SockRecord`].
pub const SOCK_RECORD_SIZE: usize = 80;
const _: () = assert!(core::mem::size_of::<SockRecord>() == SOCK_RECORD_SIZE);

/// A client socket that is dead while a process still holds it, as the
/// probes keep it in the `DOOMED` map (keyed by socket id): the peer closed
/// it (`CLOSE_WAIT`) or reset it, or the kernel timed it out (`CLOSE`, the
/// error pending), with nothing outstanding, and the application has
/// neither written on it nor closed it since; or a reuse on it stalled and
/// the application has neither closed it nor seen the path come back.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DoomedRecord {
    pub id: u64,
    /// Last data either way (ns, boot clock).
    pub last_ns: u64,
    /// cgroup v2 id of the socket's recorded process (0 = none yet).
    pub cgroup_id: u64,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// Inode of the socket's network namespace.
    pub netns: u32,
    /// The socket's recorded process (0 = none yet).
    pub tgid: u32,
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub role: u8,
    /// How it died: `dead::FIN`, `dead::RST` or `dead::TIMEOUT`; or
    /// `dead::STALLED`: a reuse on it stalled and the application keeps it.
    pub how: u8,
    /// Command name of `tgid`, NUL padded.
    pub comm: [u8; 16],
}

/// Size of [`DoomedRecord`].
pub const DOOMED_RECORD_SIZE: usize = 88;
const _: () = assert!(core::mem::size_of::<DoomedRecord>() == DOOMED_RECORD_SIZE);

/// Key of the table of connections our server side closed idle (for
/// `late_reuse`): local and remote address and port.
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TupleKey {
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub pad: u16,
}

const _: () = assert!(core::mem::size_of::<TupleKey>() == 40);

// The probes move these 16-byte fields as two aligned 8-byte words
// (`observer-ebpf` `common::bytes`): each sits at an 8-aligned offset of
// an 8-aligned type.
const _: () = {
    use core::mem::{align_of, offset_of};
    assert!(align_of::<Event>() == 8 && align_of::<SockState>() == 8);
    assert!(align_of::<DoomedRecord>() == 8 && align_of::<TupleKey>() == 8);
    assert!(offset_of!(Event, saddr) % 8 == 0 && offset_of!(Event, daddr) % 8 == 0 && offset_of!(Event, comm) % 8 == 0);
    assert!(offset_of!(SockState, saddr) % 8 == 0 && offset_of!(SockState, daddr) % 8 == 0);
    assert!(offset_of!(SockState, comm) % 8 == 0);
    assert!(offset_of!(DoomedRecord, saddr) % 8 == 0 && offset_of!(DoomedRecord, daddr) % 8 == 0);
    assert!(offset_of!(DoomedRecord, comm) % 8 == 0);
    assert!(offset_of!(TupleKey, saddr) % 8 == 0 && offset_of!(TupleKey, daddr) % 8 == 0);
};

/// What the server side remembers about a connection it closed idle.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClosedIdle {
    /// When we closed (ns, boot clock).
    pub close_ns: u64,
    /// Idle age at our close.
    pub idle_ns: u64,
}

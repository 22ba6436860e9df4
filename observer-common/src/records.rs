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

/// A process's executable or one of its file-backed mappings, as the
/// `iter/task_vma` program writes it: what `/proc/PID/exe` and
/// `/proc/PID/maps` show, read by the kernel for a daemon that may not
/// read another user's (no `CAP_SYS_PTRACE`). The executable's path comes
/// as its names, leaf first, walked up the dentries and mounts by plain
/// reads (no `bpf_d_path`: kernels since 6.13 refuse it a `struct file`
/// reached through an iterator's VMA); a mapping's as its name alone.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MappedFile {
    pub tgid: u32,
    /// [`MappedFile::EXECUTABLE`], [`MappedFile::WHOLE_PATH`].
    pub flags: u32,
    /// The executable's inode; 0 in a mapping's record.
    pub ino: u64,
    /// The executable's file system's device, as the kernel keeps it
    /// (`MAJOR << 20 | MINOR`); 0 in a mapping's record.
    pub dev: u32,
    /// Steps of the walk written in `names`, leaf first (a mapping's
    /// record: its name alone, one step).
    pub depth: u32,
    /// Each NUL-terminated; an empty one is a step from a mount's root to
    /// where it is mounted; a name that fills its slot was cut.
    pub names: [[u8; MAPPED_NAME_BYTES]; MAPPED_DEPTH],
}

impl MappedFile {
    /// This record is the process's executable (`mm->exe_file`, the path
    /// it was started by), written before its mappings.
    pub const EXECUTABLE: u32 = 1;
    /// The walk reached the root of the process's mount tree: `names` is
    /// the whole path.
    pub const WHOLE_PATH: u32 = 2;
}

/// Longest name of one path component a [`MappedFile`] carries.
pub const MAPPED_NAME_BYTES: usize = 64;
/// Most steps of a path's walk a [`MappedFile`] carries: names and mount
/// crossings.
pub const MAPPED_DEPTH: usize = 24;
/// Size of [`MappedFile`].
pub const MAPPED_FILE_SIZE: usize = 24 + MAPPED_NAME_BYTES * MAPPED_DEPTH;
const _: () = assert!(core::mem::size_of::<MappedFile>() == MAPPED_FILE_SIZE);

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

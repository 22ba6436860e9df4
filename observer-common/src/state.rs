//! The per-socket state the probes keep in socket-local storage, one
//! `SockState` per TCP socket. It never crosses to userspace as a record,
//! but its layout is fixed here (same rules as the crate root:
//! `#[repr(C)]`, no implicit padding, size asserted) so the probes and
//! the host-side layout tests agree.

/// Per-socket state the probes keep in socket-local storage
/// (`BPF_MAP_TYPE_SK_STORAGE`): it lives and dies with the socket, so a
/// reallocated socket never inherits it. Sequence numbers are the kernel's
/// (`tcp_sock`), so "answered" and "acknowledged" follow the wire.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SockState {
    /// Per-boot socket number; 0 = not yet initialised.
    pub id: u64,
    /// Last application write (ns, boot clock); 0 = never.
    pub last_send_ns: u64,
    /// Last application read of data, or establishment; 0 = never.
    pub last_recv_ns: u64,
    /// When the outstanding request was first written; 0 = none.
    pub req_ns: u64,
    /// Idle age when the outstanding request was written.
    pub req_idle_ns: u64,
    /// When the peer's FIN arrived; 0 = not yet.
    pub peer_fin_ns: u64,
    /// First read after a quiet spell with nothing outstanding (an
    /// unsolicited message: `close_notify`, GOAWAY, a goodbye line).
    pub burst_ns: u64,
    /// Last activity before that read (the idle clock it would have reset).
    pub burst_anchor_ns: u64,
    /// First write after a quiet spell (a request, or a control write such
    /// as TLS `close_notify` if our close follows at once).
    pub wburst_ns: u64,
    /// Last activity before that write.
    pub wburst_anchor_ns: u64,
    /// When a client socket died idle so that its next write fails in the
    /// kernel (reset or timed out); set only on the probe set that attaches
    /// the failed-write hook on demand; 0 = not dead.
    pub died_ns: u64,
    pub saddr: [u8; 16],
    pub daddr: [u8; 16],
    /// `write_seq` when the outstanding request was first written.
    pub req_snd_seq: u32,
    /// `rcv_nxt` when the outstanding request was first written.
    pub req_rcv_seq: u32,
    pub tgid: u32,
    /// Retransmits since the outstanding request was written.
    pub retransmits: u32,
    /// `write_seq` at `wburst_ns`.
    pub wburst_seq: u32,
    /// `write_seq` at `burst_ns` (what we wrote after the peer's goodbye).
    pub burst_wseq: u32,
    pub sport: u16,
    pub dport: u16,
    pub family: u16,
    pub role: u8,
    /// The probes' own `st::*` bits (all eight in use).
    pub flags: u8,
    pub comm: [u8; 16],
    /// cgroup v2 id of `tgid` when it was recorded.
    pub cgroup_id: u64,
    /// Inode of the socket's network namespace.
    pub netns: u32,
    /// How the socket died while idle, and whether that was acted on
    /// ([`crate::dead`]).
    pub dead: u8,
    /// 0 until the first write was looked at for a name (see
    /// [`crate::Hello`]); 2 or 3 while a TLS client's second flight may
    /// still tell its version ([`crate::tls`]); 1 after.
    pub hello: u8,
    /// The failed-write hook's bookkeeping ([`crate::watch`]).
    pub watch: u8,
    /// `crate::flags` bits every event of this socket carries
    /// (`PREEXISTING`: first seen after it was established). Apart from
    /// `flags`, where `PREEXISTING` once shared a bit with
    /// `st::UNREAD_BEFORE_REQ` and a request's end cleared it.
    pub event_flags: u8,
    /// What the last read was (`rd` bits, the probes' own).
    pub read_flags: u8,
    /// Calls written while the outstanding reuse was unanswered (each a
    /// new `sendmsg`, not exactly a control frame, a quiet moment after the
    /// last write): a busy channel's, which fail with a stalled reuse.
    pub joined: u8,
    /// 1: connected by an observer process ([`crate::Event::own`]).
    pub own: u8,
    /// IP TTL (hop limit) of the peer's SYN-ACK as it arrived here; 0 =
    /// not seen (a server's socket, one older than the probes).
    pub peer_ttl: u8,
    /// Where the last call written ends (`write_seq` plus the bytes its
    /// `sendmsg` had still to copy): the next chunk of the same `sendmsg`
    /// ends there too. Set when a reuse starts (its own write), kept while
    /// calls join it ([`Self::joined`]) and while the connection is
    /// stalled (each further call fails).
    pub call_end: u32,
    /// IP TTL (hop limit) of the last RST received; 0 = none.
    pub reset_ttl: u8,
    /// [`crate::ttl`] bits: how the SYN-ACK and the RST arrived.
    pub ttl_flags: u8,
    /// Explicit padding, always zero.
    pub pad: [u8; 2],
    /// `copied_seq` just after the read at `burst_ns`: more than a
    /// goodbye's bytes arriving after it make the burst a push stream, no
    /// goodbye.
    pub burst_rseq: u32,
}

impl SockState {
    /// A socket nothing is known about yet.
    pub const ZERO: Self = Self {
        id: 0,
        last_send_ns: 0,
        last_recv_ns: 0,
        req_ns: 0,
        req_idle_ns: 0,
        peer_fin_ns: 0,
        burst_ns: 0,
        burst_anchor_ns: 0,
        wburst_ns: 0,
        wburst_anchor_ns: 0,
        died_ns: 0,
        saddr: [0; 16],
        daddr: [0; 16],
        req_snd_seq: 0,
        req_rcv_seq: 0,
        tgid: 0,
        retransmits: 0,
        wburst_seq: 0,
        burst_wseq: 0,
        sport: 0,
        dport: 0,
        family: 0,
        role: 0,
        flags: 0,
        comm: [0; 16],
        cgroup_id: 0,
        netns: 0,
        dead: 0,
        hello: 0,
        watch: 0,
        event_flags: 0,
        read_flags: 0,
        joined: 0,
        own: 0,
        peer_ttl: 0,
        call_end: 0,
        reset_ttl: 0,
        ttl_flags: 0,
        pad: [0; 2],
        burst_rseq: 0,
    };
}

/// Size of [`SockState`] in socket-local storage.
pub const SOCK_STATE_SIZE: usize = 200;
const _: () = assert!(core::mem::size_of::<SockState>() == SOCK_STATE_SIZE);

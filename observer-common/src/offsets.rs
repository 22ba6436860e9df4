//! The byte offsets of the kernel fields the probes read, one load-time
//! global: resolved by userspace from the running kernel's BTF, never
//! compiled in (Rust eBPF has no CO-RE relocations). Same rules as the
//! crate root: `#[repr(C)]`, every field a `u64`, the size asserted.

/// Byte offsets of the kernel fields the probes read, resolved at load time
/// from `/sys/kernel/btf/vmlinux` (never compiled in).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct Offsets {
    /// `sock_common.skc_daddr` (IPv4 remote address).
    pub skc_daddr: u64,
    /// `sock_common.skc_rcv_saddr` (IPv4 local address).
    pub skc_rcv_saddr: u64,
    /// `sock_common.skc_dport` (network order).
    pub skc_dport: u64,
    /// `sock_common.skc_num` (local port, host order).
    pub skc_num: u64,
    /// `sock_common.skc_family`.
    pub skc_family: u64,
    /// `sock_common.skc_v6_daddr`.
    pub skc_v6_daddr: u64,
    /// `sock_common.skc_v6_rcv_saddr`.
    pub skc_v6_rcv_saddr: u64,
    /// `sock_common.skc_flags` (`sock_flag()` bits).
    pub skc_flags: u64,
    /// Bit number of `SOCK_KEEPOPEN` in `skc_flags` (from `enum sock_flags`).
    pub sock_keepopen_bit: u64,
    /// `sock.sk_err`.
    pub sk_err: u64,
    /// `sock.sk_protocol` (a `u16` since 5.6).
    pub sk_protocol: u64,
    /// Byte holding `sock.sk_shutdown` (a bitfield on some kernels).
    pub sk_shutdown: u64,
    /// Bit shift of `sk_shutdown` within that byte.
    pub sk_shutdown_shift: u64,
    /// `tcp_sock.write_seq`: next byte the application writes.
    pub write_seq: u64,
    /// `tcp_sock.snd_una`: first byte not yet acknowledged by the peer.
    pub snd_una: u64,
    /// `tcp_sock.rcv_nxt`: next byte expected from the peer (FIN counts one).
    pub rcv_nxt: u64,
    /// `tcp_sock.copied_seq`: next byte the application reads.
    pub copied_seq: u64,
    /// `tcp_sock.keepalive_time` (jiffies; 0 = the sysctl default).
    pub keepalive_time: u64,
    /// `sock_common.skc_net` (the `struct net *` inside `possible_net_t`);
    /// 0 = a kernel without network namespaces (every event reads netns 0).
    pub skc_net: u64,
    /// `net.ns.inum`: the namespace's inode number, as `/proc/PID/ns/net`
    /// shows it.
    pub net_ns_inum: u64,
    /// `tcp_sock.tcp_clock_cache`: `CLOCK_MONOTONIC` ns of the socket's
    /// latest segment processed (4.20+), read directly as the receive time.
    pub tcp_clock_cache: u64,
    /// `tcp_sock.rcv_tstamp`: jiffies of the last segment received (data,
    /// or the answer to a keep-alive probe).
    pub rcv_tstamp: u64,
    /// `msghdr.msg_iter` (the send probe's `msg` argument); 0 = names off
    /// (`--no-names`, or a kernel whose `iov_iter` was not resolved).
    pub msg_iter: u64,
    /// `iov_iter.iter_type` (a `u8`).
    pub iter_type: u64,
    /// `iov_iter.iov_offset`: bytes of the first segment already consumed.
    pub iov_offset: u64,
    /// `iov_iter.count`: bytes left to send.
    pub iter_count: u64,
    /// The `iov_iter` pointer union: `ubuf` (6.0+) or `__iov`/`iov`.
    pub iter_ptr: u64,
    /// Value of `ITER_UBUF` (`u64::MAX` on kernels without it).
    pub iter_ubuf: u64,
    /// Value of `ITER_IOVEC`.
    pub iter_iovec: u64,
    /// `sock_common.skc_state` (a `u8`): the iterator tells listeners by it.
    pub skc_state: u64,
    /// `tcp_sock.app_limited` (a `u32`): a write on a closed socket sets
    /// it before it fails (see `watch::NO_WRITE_MARK`).
    pub app_limited: u64,
    /// `tcp_sock.lsndtime` (jiffies, a `u32`): the last data segment sent.
    pub lsndtime: u64,
    /// `inet_connection_sock.icsk_ack.lrcvtime` (jiffies, a `u32`): the
    /// last data segment received. With `lsndtime`, a socket older than
    /// the probes gets its idle clock from the kernel when adopted.
    pub lrcvtime: u64,
    /// `task_struct.mm`, `mm_struct.exe_file` and `file.f_inode`: the
    /// connecting process's executable, to tell `observer probe`'s
    /// connections by a property no other process can take (see
    /// `Event::own`).
    pub task_mm: u64,
    pub mm_exe_file: u64,
    pub file_inode: u64,
    /// The daemon's own process (tgid): its connection at start tells the
    /// probes which executable is observer's ([`crate::maps::OWN_EXE`]); 0 = off.
    pub own_tgid: u64,
    /// `task_struct.tgid`, `vm_area_struct.vm_file`, `inode.i_ino`,
    /// `inode.i_sb` and `super_block.s_dev`: a process's mapped files as
    /// the `iter/task_vma` program lists them ([`crate::MappedFile`]);
    /// `vma_vm_file` 0 = that program is not loaded.
    pub task_tgid: u64,
    pub vma_vm_file: u64,
    pub inode_ino: u64,
    pub inode_sb: u64,
    pub sb_dev: u64,
    /// A mapped file's path, walked up: `file.f_path.dentry` and
    /// `.mnt`, `dentry.d_parent` and `.d_name.name`, `vfsmount.mnt_root`,
    /// and `struct mount`'s embedded `mnt`, `mnt_parent` and
    /// `mnt_mountpoint` (to cross from a mount's root to where it is
    /// mounted).
    pub file_dentry: u64,
    pub file_mnt: u64,
    pub dentry_parent: u64,
    pub dentry_name: u64,
    pub vfsmount_root: u64,
    pub mount_mnt: u64,
    pub mount_parent: u64,
    pub mount_mountpoint: u64,
    /// `sk_buff.head`, `.network_header` (a `u16` offset from `head`) and
    /// `.skb_iif` (the interface it arrived on): a received segment's IP
    /// TTL or hop limit, and whether it came by loopback, for the peer's
    /// SYN-ACK and a received RST (who sent the reset, [`crate::ttl`]);
    /// `skb_head` 0 = not read.
    pub skb_head: u64,
    pub skb_network_header: u64,
    pub skb_iif: u64,
}

/// Number of `u64` fields in [`Offsets`].
pub const OFFSETS_COUNT: usize = 53;
const _: () = assert!(core::mem::size_of::<Offsets>() == OFFSETS_COUNT * 8);

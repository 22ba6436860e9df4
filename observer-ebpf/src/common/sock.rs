//! A socket's identity and state: socket-local storage, the id, addresses
//! and role, the owning process, and the server side's memory of idle
//! closes (`late_reuse`).

use core::ffi::c_void;

use aya_ebpf::{
    bindings::BPF_SK_STORAGE_GET_F_CREATE,
    helpers::{
        bpf_get_current_pid_tgid, bpf_get_smp_processor_id,
        generated::{
            bpf_get_current_cgroup_id, bpf_get_current_comm as bpf_get_current_comm_raw, bpf_get_current_task,
            bpf_sk_storage_get,
        },
    },
};
use observer_common::{counter, dead, flags, kind, role, ClosedIdle, SockState, TupleKey, AF_INET, AF_INET6};

use super::{
    bytes::copy16,
    clock::{now, refresh_clocks, since_field},
    emit::emit,
    kernel::{direct, exe_file, field, field_into},
    maps::{
        count, global, undoom, CLOSED_IDLE, CLOSED_IDLE_USED, ID_SEQ, LISTENERS, OFFSETS, OWN_EXE, SOCKETS,
        WALKED_NETNS,
    },
};

/// The socket's state; with `create`, made (and counted when the kernel
/// refuses) if missing.
#[inline(always)]
pub fn storage(sk: *mut c_void, create: bool) -> Option<&'static mut SockState> {
    let flags = if create { u64::from(BPF_SK_STORAGE_GET_F_CREATE) } else { 0 };
    // SAFETY: `sk` is the hook's BTF `struct sock *`; the helper checks it
    // is a full socket and returns NULL otherwise.
    let p = unsafe { bpf_sk_storage_get((&raw const SOCKETS).cast_mut().cast(), sk, core::ptr::null_mut(), flags) }
        .cast::<SockState>();
    if p.is_null() {
        if create {
            count(counter::MAP_FULL);
        }
        return None;
    }
    // SAFETY: non-null storage owned by the socket, valid for this program run.
    Some(unsafe { &mut *p })
}

pub(crate) fn next_id() -> u64 {
    // SAFETY: helper without preconditions.
    let cpu = u64::from(unsafe { bpf_get_smp_processor_id() });
    let n = match ID_SEQ.get_ptr_mut(0) {
        // SAFETY: per-CPU slot.
        Some(p) => unsafe {
            *p += 1;
            *p
        },
        None => 0,
    };
    ((cpu + 1) << 48) | (n & 0xffff_ffff_ffff)
}

/// Give a fresh state its identity and addresses (read from
/// `struct sock_common` at BTF offsets; `sk` is a hook's BTF `struct sock
/// *`, so the scalar fields are direct loads). False for non-IP families.
#[inline(always)]
#[allow(clippy::cast_ptr_alignment, reason = "the address fields are 8-aligned (asserted in observer-common)")]
pub fn init(sk: *const c_void, st: &mut SockState) -> bool {
    let family: u16 = direct(sk, &raw const OFFSETS.skc_family);
    if family == AF_INET {
        let d: u32 = direct(sk, &raw const OFFSETS.skc_daddr);
        let s: u32 = direct(sk, &raw const OFFSETS.skc_rcv_saddr);
        // SAFETY: 4-byte stores at the start of 8-aligned 16-byte fields
        // (a slice copy would be a `memmove` call).
        unsafe {
            (&raw mut st.daddr).cast::<u32>().write_volatile(d);
            (&raw mut st.saddr).cast::<u32>().write_volatile(s);
        }
    } else if family == AF_INET6 {
        field_into(&raw mut st.daddr, sk, &raw const OFFSETS.skc_v6_daddr);
        field_into(&raw mut st.saddr, sk, &raw const OFFSETS.skc_v6_rcv_saddr);
    } else {
        return false;
    }
    st.family = family;
    st.dport = u16::from_be(direct(sk, &raw const OFFSETS.skc_dport));
    st.sport = direct(sk, &raw const OFFSETS.skc_num);
    st.netns = netns(sk);
    st.id = next_id();
    true
}

/// Inode of the socket's network namespace (`sk->__sk_common.skc_net.net->ns.inum`).
#[inline(always)]
pub(crate) fn netns(sk: *const c_void) -> u32 {
    if global(&raw const OFFSETS.skc_net) == 0 {
        return 0;
    }
    let net: *const c_void = direct(sk, &raw const OFFSETS.skc_net);
    if net.is_null() {
        return 0;
    }
    direct(net, &raw const OFFSETS.net_ns_inum)
}

/// [`netns`] by probe reads, for a pointer the verifier has no type for
/// (the socket iterator's `sock_common`).
#[inline(always)]
pub fn netns_read(sk: *const c_void) -> u32 {
    if global(&raw const OFFSETS.skc_net) == 0 {
        return 0;
    }
    let net: u64 = field(sk, &raw const OFFSETS.skc_net);
    if net == 0 {
        return 0;
    }
    field(net as *const c_void, &raw const OFFSETS.net_ns_inum)
}

/// State of a socket first seen after it was established: its role comes
/// from the listeners of its namespace when they are known, else from the
/// ports (`role::of_adopted`).
#[inline(always)]
pub fn adopt(sk: *mut c_void) -> Option<&'static mut SockState> {
    let st = storage(sk, true)?;
    if st.id == 0 {
        if !init(sk, st) {
            return None;
        }
        st.event_flags |= flags::PREEXISTING;
        // SAFETY: lookups of plain keys; only presence is read.
        let listening = unsafe {
            if LISTENERS.get(role::listener_key(st.netns, st.sport)).is_some() {
                Some(true)
            } else if st.netns != 0 && WALKED_NETNS.get(st.netns).is_some() {
                Some(false)
            } else {
                None
            }
        };
        st.role = role::of_adopted(st.sport, st.dport, listening);
        seed_clock(sk, st);
    }
    Some(st)
}

/// An adopted socket's idle clock, from the kernel's own times of its last
/// data segment each way (`lsndtime`, `icsk_ack.lrcvtime`: jiffies, set
/// by data only, never by a keep-alive probe or a bare ACK), so its first
/// write after the probes came (a daemon restart) is timed like any other.
/// Within a tick either way, less any time the machine was suspended
/// since (jiffies do not count it). Left at 0 (this write is no reuse, as
/// before) on a kernel whose tick is not known.
#[inline(always)]
fn seed_clock(sk: *const c_void, st: &mut SockState) {
    if global(&raw const OFFSETS.lsndtime) == 0 || global(&raw const OFFSETS.lrcvtime) == 0 {
        return;
    }
    let (Some(sent), Some(received)) =
        (since_field(sk, &raw const OFFSETS.lsndtime), since_field(sk, &raw const OFFSETS.lrcvtime))
    else {
        return;
    };
    let boot = now();
    st.last_send_ns = boot.saturating_sub(sent).max(1);
    st.last_recv_ns = boot.saturating_sub(received).max(1);
}

/// A socket started listening (`sk`, the state hook's): its port is a
/// server's (see [`LISTENERS`]).
#[inline(always)]
pub fn listening(sk: *const c_void) {
    enter_listener(role::listener_key(netns(sk), direct(sk, &raw const OFFSETS.skc_num)));
}

/// Enter a listening port (`role::listener_key`).
#[inline(always)]
pub fn enter_listener(key: u64) {
    // SAFETY: a lookup of a plain key.
    if unsafe { LISTENERS.get(key) }.is_some() {
        return;
    }
    if LISTENERS.insert(key, 1, u64::from(aya_ebpf::bindings::BPF_NOEXIST)).is_err()
        // SAFETY: as above; another CPU may have entered it meanwhile.
        && unsafe { LISTENERS.get(key) }.is_none()
    {
        count(counter::LISTENERS_FULL);
    }
}

/// A listener closed. Another one may share the port (`SO_REUSEPORT`, or
/// IPv4 and IPv6 apart): the daemon's next walk enters it again.
#[inline(always)]
pub fn stopped_listening(sk: *const c_void) {
    let _ = LISTENERS.remove(role::listener_key(netns(sk), direct(sk, &raw const OFFSETS.skc_num)));
}

/// Record the writing process on the socket.
#[inline(always)]
pub fn set_process(st: &mut SockState) {
    st.tgid = (bpf_get_current_pid_tgid() >> 32) as u32;
    // Straight into the state: the helper zeroes the buffer when it fails.
    // SAFETY: a 16-byte buffer, as the helper's size says.
    unsafe { bpf_get_current_comm_raw((&raw mut st.comm).cast(), 16) };
    // SAFETY: a helper with no arguments, allowed in tracing programs.
    st.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
}

/// Whether the current task runs the daemon's own executable: its
/// `task->mm->exe_file->f_inode` is the inode the daemon's own process
/// showed when it connected at start (kept in [`OWN_EXE`]; that connection
/// is the daemon's, so it is its own too). The same file executed in the
/// same mount is the same inode, whatever the file system numbers it; no
/// other process can take this property without executing that file.
/// Read only at `connect()` of a thread named as the probe's: three
/// pointer reads and a map lookup.
#[inline(always)]
pub fn is_own_process() -> bool {
    // SAFETY: a helper with no arguments, allowed in tracing programs.
    let exe = exe_file(unsafe { bpf_get_current_task() } as *const c_void);
    if exe.is_null() {
        return false;
    }
    let inode: u64 = field(exe, &raw const OFFSETS.file_inode);
    if inode == 0 {
        return false;
    }
    let own_tgid = global(&raw const OFFSETS.own_tgid);
    if own_tgid != 0 && bpf_get_current_pid_tgid() >> 32 == own_tgid {
        if let Some(slot) = OWN_EXE.get_ptr_mut(0) {
            // SAFETY: the array's one slot, a u64.
            unsafe { *slot = inode };
        }
        return true;
    }
    OWN_EXE.get(0).is_some_and(|&own| own == inode)
}

pub(crate) fn tuple_key(st: &SockState) -> TupleKey {
    let mut k = core::mem::MaybeUninit::<TupleKey>::uninit();
    let p = k.as_mut_ptr();
    // SAFETY: every field of the key is written before it is read.
    unsafe {
        copy16(&raw mut (*p).saddr, &raw const st.saddr);
        copy16(&raw mut (*p).daddr, &raw const st.daddr);
        (&raw mut (*p).sport).write(st.sport);
        (&raw mut (*p).dport).write(st.dport);
        (&raw mut (*p).family).write(st.family);
        (&raw mut (*p).pad).write(0);
        k.assume_init()
    }
}

/// Server side: remember an idle close, so a client that writes on it
/// later is seen (`late_reuse`).
#[inline(always)]
pub(crate) fn remember_idle_close(st: &SockState, now: u64, idle: u64) {
    let key = tuple_key(st);
    // Counted so userspace can tell what the LRU map evicted (a server's
    // idle close, off the hot path).
    let new = CLOSED_IDLE.get_ptr(key).is_none();
    if CLOSED_IDLE.insert(key, ClosedIdle { close_ns: now, idle_ns: idle }, 0).is_ok() && new {
        count(counter::CLOSED_IDLE_ADDED);
    }
    if let Some(p) = CLOSED_IDLE_USED.get_ptr_mut(0) {
        // SAFETY: one aligned u64 store of a constant.
        unsafe {
            if *p == 0 {
                *p = 1;
            }
        }
    }
}

/// A new connection reuses a 4-tuple: forget an old idle close on it.
#[inline(always)]
pub fn forget_idle_close(st: &SockState) {
    if CLOSED_IDLE_USED.get(0).copied().unwrap_or(1) != 0 && CLOSED_IDLE.remove(tuple_key(st)).is_ok() {
        count(counter::CLOSED_IDLE_REMOVED);
    }
}

/// The kernel sent an RST from socket `sk` (full or time-wait): if it is
/// a connection our server side closed idle, the client wrote on it late.
#[inline(always)]
pub fn on_send_reset(sk: *const c_void, now: u64) {
    let mut probe = SockState::ZERO;
    if !init(sk, &mut probe) {
        return;
    }
    let key = tuple_key(&probe);
    let Some(p) = CLOSED_IDLE.get_ptr(key) else { return };
    // SAFETY: pointer from a successful lookup; copied before the removal.
    let closed = unsafe { *p };
    if CLOSED_IDLE.remove(key).is_ok() {
        count(counter::CLOSED_IDLE_REMOVED);
    }
    probe.role = role::SERVER;
    probe.id = 0;
    emit(core::ptr::null(), &probe, kind::LATE_REUSE, now, |e| {
        e.idle_ns = closed.idle_ns;
        e.elapsed_ns = now.saturating_sub(closed.close_ns);
    });
}

/// A retransmission of this socket's data.
#[inline(always)]
pub fn on_retransmit(st: &mut SockState) {
    if st.req_ns != 0 {
        st.retransmits += 1;
    }
}

/// A fresh connection reached `ESTABLISHED`.
#[inline(always)]
pub fn on_established(sk: *mut c_void, client: bool, now: u64) {
    let Some(st) = storage(sk, true) else { return };
    if st.id == 0 && !init(sk, st) {
        return;
    }
    st.role = if client { role::CLIENT } else { role::SERVER };
    // A socket connected again after it died (`connect()` on a closed
    // socket) is alive.
    undoom(st);
    st.dead = dead::NONE;
    refresh_clocks(now);
    // Establishment counts as activity: a connection opened and then left
    // idle in a pool ages from here.
    st.last_recv_ns = now;
    if !client {
        forget_idle_close(st);
    }
    emit(sk, st, kind::ESTABLISHED, now, |e| e.idle_ns = 0);
}

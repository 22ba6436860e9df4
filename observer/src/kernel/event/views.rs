//! The socket table's records decoded: an idle socket as the at-risk view
//! sees it, and a dead socket a process still holds.

use std::net::SocketAddr;

use observer_common::{dead, role, DoomedRecord, SockRecord};

use super::{addr, secs, How, Role};

/// One tracked socket as the kernel's table shows it now (the at-risk view).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SocketView {
    /// Per-boot socket number, as events carry it (`sock_id`).
    pub id: u64,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    pub role: Role,
    /// Seconds since the last payload either way.
    pub idle_seconds: f64,
    /// Inode of the socket's network namespace.
    pub netns: u32,
    /// cgroup v2 id of the socket's process (0 = none seen).
    pub cgroup_id: u64,
}

/// Decode a kernel socket record, with its idle age at `now_ns` (boot
/// clock). Sockets with no payload seen yet, and sockets with a request
/// outstanding (not idle), are skipped.
#[must_use]
pub fn view_of(rec: &SockRecord, now_ns: u64) -> Option<SocketView> {
    if rec.last_ns == 0 || rec.req_ns != 0 {
        return None;
    }
    let local = addr(rec.family, rec.saddr, rec.sport).ok()?;
    let remote = addr(rec.family, rec.daddr, rec.dport).ok()?;
    // A socket first seen established carries no role (or, from older
    // probes, one the ports told): the ports tell it, by the probes' rule.
    let role = match Role::of_wire(rec.role) {
        Role::Unknown => Role::of_wire(role::guess(rec.sport, rec.dport)),
        r => r,
    };
    Some(SocketView {
        id: rec.id,
        local,
        remote,
        role,
        idle_seconds: secs(now_ns.saturating_sub(rec.last_ns)),
        netns: rec.netns,
        cgroup_id: rec.cgroup_id,
    })
}

/// A client socket that is dead while its process still holds it (the
/// peer closed or reset it, or the kernel timed it out, with nothing
/// outstanding, and nothing was written since): it fails on first use.
#[derive(Debug, Clone, PartialEq)]
pub struct DoomedView {
    /// Per-boot socket number (never a kernel address).
    pub sock_id: u64,
    pub local: SocketAddr,
    pub remote: SocketAddr,
    /// How it died: `fin`, `rst` or `timeout`; `stalled`: a reuse on it
    /// stalled and the application keeps it.
    pub how: How,
    /// Seconds since the last payload either way.
    pub idle_seconds: f64,
    pub netns: u32,
    pub pid: u32,
    pub comm: String,
    pub cgroup_id: u64,
}

/// Decode a doomed-socket record, with its idle age at `now_ns` (boot clock).
#[must_use]
pub fn doomed_of(rec: &DoomedRecord, now_ns: u64) -> Option<DoomedView> {
    let how = match rec.how {
        dead::FIN => How::Fin,
        dead::RST => How::Rst,
        dead::TIMEOUT => How::Timeout,
        dead::STALLED => How::Stalled,
        _ => return None,
    };
    let comm_len = rec.comm.iter().position(|&b| b == 0).unwrap_or(rec.comm.len());
    Some(DoomedView {
        sock_id: rec.id,
        local: addr(rec.family, rec.saddr, rec.sport).ok()?,
        remote: addr(rec.family, rec.daddr, rec.dport).ok()?,
        how,
        idle_seconds: if rec.last_ns == 0 { 0.0 } else { secs(now_ns.saturating_sub(rec.last_ns)) },
        netns: rec.netns,
        pid: rec.tgid,
        comm: String::from_utf8_lossy(&rec.comm[..comm_len]).into_owned(),
        cgroup_id: rec.cgroup_id,
    })
}

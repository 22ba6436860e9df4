//! The one key of a row, in the table and at every interface: a
//! destination, the role it was seen in, and the network namespace
//! ([`Netns`], which settles once how the host's namespace is written).
//! [`DestKey`] is the table's own (an address or the `other` row),
//! [`RowId`] the same key as rows, changes, restarts, probes and labels
//! name it.

use std::{fmt, net::SocketAddr};

use serde::{Deserialize, Serialize};

use crate::kernel::event::{Role, SockEvent};

/// A network namespace as a row names it: the host's (`null` in JSON, an
/// empty `netns` label, `NULL` in the store's row-keyed tables), or
/// another namespace's inode. Events carry the raw inode; [`Netns::of`]
/// settles it once, against the host's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Netns(Option<u32>);

impl Netns {
    /// The host's network namespace (PID 1's).
    pub const HOST: Self = Self(None);

    /// An event's raw namespace inode, given the host's: the host's, and 0
    /// (not known), are [`Netns::HOST`]. With `host` 0 (not known either)
    /// every other namespace keeps its inode.
    #[must_use]
    pub const fn of(raw: u32, host: u32) -> Self {
        if raw == 0 || raw == host {
            Self::HOST
        } else {
            Self(Some(raw))
        }
    }

    /// The inode, or None for the host's.
    #[must_use]
    pub const fn inode(self) -> Option<u32> {
        self.0
    }

    /// The `netns` label value: empty for the host's namespace (Prometheus
    /// treats an empty label as absent), else the inode.
    #[must_use]
    pub fn label(self) -> String {
        self.0.map(|n| n.to_string()).unwrap_or_default()
    }
}

/// As `--netns INODE` and stored rows give it (None, or 0: the host's).
impl From<Option<u32>> for Netns {
    fn from(inode: Option<u32>) -> Self {
        Self::of(inode.unwrap_or(0), 0)
    }
}

/// A destination's address, or the overflow row past the cap.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Destination {
    Addr(SocketAddr),
    /// Everything past the destination cap.
    Other,
}

impl fmt::Display for Destination {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Addr(a) => write!(f, "{a}"),
            Self::Other => f.write_str("other"),
        }
    }
}

/// The key of one row in the table: a destination seen in one role (the
/// remote `ip:port` of client sockets, the local listening `ip:port` of
/// server sockets) from one network namespace, so the same address in two
/// pods makes two rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DestKey {
    pub dest: Destination,
    pub role: Role,
    pub netns: Netns,
}

/// The destination an event belongs to, if any: the remote address of a
/// client socket, the local listening address of a server socket.
#[must_use]
pub const fn destination_of(ev: &SockEvent) -> Option<(SocketAddr, Role)> {
    match ev.role {
        Role::Client => Some((ev.remote, Role::Client)),
        Role::Server => Some((ev.local, Role::Server)),
        Role::Unknown => None,
    }
}

impl DestKey {
    /// The key of an event's own destination (never the overflow row),
    /// its namespace settled against the host's inode.
    #[must_use]
    pub const fn of_event(ev: &SockEvent, host_netns: u32) -> Option<Self> {
        match destination_of(ev) {
            Some((addr, role)) => {
                Some(Self { dest: Destination::Addr(addr), role, netns: Netns::of(ev.netns, host_netns) })
            }
            None => None,
        }
    }

    /// The overflow row of a role.
    #[must_use]
    pub const fn other(role: Role) -> Self {
        Self { dest: Destination::Other, role, netns: Netns::HOST }
    }

    /// This key as interfaces name it.
    #[must_use]
    pub fn id(&self) -> RowId {
        RowId { destination: self.dest.to_string(), role: self.role, netns: self.netns }
    }
}

/// A row's key as the interfaces name it: the `destination` text (an
/// address or `other`), the role, and the network namespace, which is the
/// metrics' `netns` label. Rows, changes and restarts carry it flattened,
/// so their JSON keeps the three fields.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct RowId {
    pub destination: String,
    pub role: Role,
    /// The network namespace the sockets are in (null: the host's, the
    /// namespace of PID 1). The same address seen from two namespaces (two
    /// pods) is two rows.
    #[serde(default)]
    pub netns: Netns,
}

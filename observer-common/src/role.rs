//! Role of a socket (client or server), and how the probes tell it for a
//! socket older than they are. Values are part of the wire format.

/// Not known: the socket existed before the probes were attached.
pub const UNKNOWN: u8 = 0;
/// We connected (`SYN_SENT` -> `ESTABLISHED`).
pub const CLIENT: u8 = 1;
/// We accepted (`SYN_RECV` -> `ESTABLISHED`).
pub const SERVER: u8 = 2;

/// Linux's default ephemeral port range starts here.
const EPHEMERAL: u16 = 32_768;

/// The role of a socket first seen established (it existed before the
/// probes), the probes' rule. `listening`: whether a socket listens on
/// its local port in its network namespace, `None` when that is not
/// known (a namespace whose listeners were never walked).
///
/// A local port some socket listens on is a server's: an accepted
/// socket keeps its listener's port. With the listeners known and none
/// on the local port, the socket connected, and is a client (a gRPC
/// client talking to port 50051, inside the ephemeral range, whatever
/// its own port), unless it has the plain shape of an accepted socket
/// whose listener has closed since (a server draining: a local port
/// below the ephemeral range, the remote one in it). Without the
/// listeners, the ports alone ([`guess`]).
#[must_use]
pub const fn of_adopted(local: u16, remote: u16, listening: Option<bool>) -> u8 {
    match listening {
        Some(true) => SERVER,
        Some(false) if local < EPHEMERAL && remote >= EPHEMERAL => SERVER,
        Some(false) => CLIENT,
        None => guess(local, remote),
    }
}

/// Key of the probes' table of listening ports: the port in the low 16
/// bits, the network namespace's inode above them.
#[must_use]
pub const fn listener_key(netns: u32, port: u16) -> u64 {
    ((netns as u64) << 16) | port as u64
}

/// The role of a socket first seen established, from its ports: the
/// side with the ephemeral port (32768 and up, Linux's default range
/// start) is the client; with both or neither ephemeral, the higher
/// port; equal ports tell nothing. One rule for the probes and for
/// userspace.
#[must_use]
pub const fn guess(local: u16, remote: u16) -> u8 {
    match (local >= EPHEMERAL, remote >= EPHEMERAL) {
        (true, false) => CLIENT,
        (false, true) => SERVER,
        _ if local > remote => CLIENT,
        _ if local < remote => SERVER,
        _ => UNKNOWN,
    }
}

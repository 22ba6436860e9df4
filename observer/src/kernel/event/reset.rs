//! Who sent a reset, told from how it arrived: its IP TTL (hop limit on
//! IPv6) against the TTL of the peer's own SYN-ACK on the same
//! connection, and whether it came by the loopback interface.
//!
//! A packet leaves its sender with an initial TTL (64 from Linux and
//! macOS, 128 from Windows, 255 from many routers and balancers) and
//! loses one per routed hop, so `initial - ttl` is how many hops it came.
//! An RST that came as far as the peer's SYN-ACK is the peer's; one that
//! came fewer hops was made by a device on the path that many hops closer
//! (a firewall, a NAT, a load balancer that forgot the flow); one that
//! arrived by loopback was made by this host's own stack (its firewall's
//! `reject`, conntrack), never routed. One that came more hops than the
//! peer's (a route change, an asymmetric path) is not told.
//!
//! Where it can be wrong: a middlebox that copies the server's TTL into
//! the resets it forges is taken for the peer; a hop count above 64 from
//! a sender starting at 64 is misread (no real path is that long).

use observer_common::ttl;
use serde::{Deserialize, Serialize};

use crate::named::named;

named! {
    /// Where a reset came from.
    pub enum ResetFrom {
        /// The peer: its RST came as many hops as its SYN-ACK.
        Peer => "peer",
        /// A device on the path, fewer hops away than the peer.
        Path => "path",
        /// This host's own stack (arrived by loopback, never routed).
        Local => "local",
    }
}

/// How a received RST arrived, and who sent it where that can be told.
/// In an event's JSON its fields sit beside the others.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResetArrival {
    /// The RST's TTL (hop limit) as it arrived.
    pub reset_ttl: u8,
    /// The peer's SYN-ACK's TTL as it arrived (absent: not seen, as on a
    /// server's socket or one older than the daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer_ttl: Option<u8>,
    /// Who sent the RST (absent: it cannot be told).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_from: Option<ResetFrom>,
    /// How many hops closer than the peer it was made (0: the peer;
    /// absent for `local`, never routed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reset_hops_closer: Option<u8>,
}

/// The usual initial TTLs, smallest first.
const INITIAL: [u8; 3] = [64, 128, 255];

/// Hops a packet came: from the smallest usual initial TTL at or above
/// what arrived.
fn hops(arrived: u8) -> u8 {
    let initial = INITIAL.iter().copied().find(|&i| i >= arrived).unwrap_or(u8::MAX);
    initial - arrived
}

impl ResetArrival {
    /// From an event's wire fields; `None` when the socket received no RST
    /// (or its TTL was not read).
    #[must_use]
    pub fn of_wire(reset_ttl: u8, peer_ttl: u8, flags: u8) -> Option<Self> {
        if flags & ttl::RESET_SEEN == 0 || reset_ttl == 0 {
            return None;
        }
        let peer = (peer_ttl != 0).then_some(peer_ttl);
        let (from, closer) = Self::told(reset_ttl, peer, flags);
        Some(Self { reset_ttl, peer_ttl: peer, reset_from: from, reset_hops_closer: closer })
    }

    fn told(reset_ttl: u8, peer: Option<u8>, flags: u8) -> (Option<ResetFrom>, Option<u8>) {
        let reset_local = flags & ttl::RESET_LOOPBACK != 0;
        let peer_local = flags & ttl::PEER_LOOPBACK != 0;
        if reset_local && !(peer.is_some() && peer_local) {
            // Made here while the peer's packets came from elsewhere (or
            // were never seen: a loopback RST is this host's either way).
            // No hop count: it was never routed.
            return (Some(ResetFrom::Local), None);
        }
        let Some(peer) = peer else { return (None, None) };
        let (peer_hops, reset_hops) = (hops(peer), hops(reset_ttl));
        match reset_hops.cmp(&peer_hops) {
            std::cmp::Ordering::Equal => (Some(ResetFrom::Peer), Some(0)),
            std::cmp::Ordering::Less => (Some(ResetFrom::Path), Some(peer_hops - reset_hops)),
            std::cmp::Ordering::Greater => (None, None),
        }
    }
}

#[cfg(test)]
mod tests {
    use observer_common::ttl;

    use super::{ResetArrival, ResetFrom};

    fn told(reset: u8, peer: u8, flags: u8) -> (Option<ResetFrom>, Option<u8>) {
        ResetArrival::of_wire(reset, peer, flags | ttl::RESET_SEEN)
            .map_or((None, None), |a| (a.reset_from, a.reset_hops_closer))
    }

    #[test]
    fn a_reset_as_far_as_the_synack_is_the_peers() {
        assert_eq!(told(63, 63, 0), (Some(ResetFrom::Peer), Some(0)));
        // A Windows peer 12 hops away.
        assert_eq!(told(116, 116, 0), (Some(ResetFrom::Peer), Some(0)));
        assert_eq!(told(64, 64, 0), (Some(ResetFrom::Peer), Some(0)));
    }

    #[test]
    fn a_reset_from_fewer_hops_is_the_paths() {
        // The router before a server one hop behind it.
        assert_eq!(told(64, 63, 0), (Some(ResetFrom::Path), Some(1)));
        // A balancer starting at 255, two hops away, before a Linux
        // server nine hops away.
        assert_eq!(told(253, 55, 0), (Some(ResetFrom::Path), Some(7)));
        // A Linux firewall three hops away before a Windows server ten.
        assert_eq!(told(61, 118, 0), (Some(ResetFrom::Path), Some(7)));
    }

    #[test]
    fn a_reset_by_loopback_from_a_peer_elsewhere_is_local() {
        assert_eq!(told(64, 63, ttl::RESET_LOOPBACK), (Some(ResetFrom::Local), None));
        assert_eq!(told(64, 64, ttl::RESET_LOOPBACK), (Some(ResetFrom::Local), None));
        assert_eq!(told(64, 0, ttl::RESET_LOOPBACK), (Some(ResetFrom::Local), None));
        // A peer on this host: loopback tells nothing, the TTLs do.
        assert_eq!(told(64, 64, ttl::RESET_LOOPBACK | ttl::PEER_LOOPBACK), (Some(ResetFrom::Peer), Some(0)));
    }

    #[test]
    fn what_cannot_be_told_is_not_guessed() {
        // No SYN-ACK seen (a server's socket, one older than the daemon).
        assert_eq!(told(60, 0, 0), (None, None));
        // Further than the peer: a route change, an asymmetric path.
        assert_eq!(told(60, 62, 0), (None, None));
        // No RST at all.
        assert_eq!(ResetArrival::of_wire(0, 63, 0), None);
        assert_eq!(ResetArrival::of_wire(63, 63, 0), None);
    }

    #[test]
    fn every_ttl_pair_gives_an_answer_without_panic() {
        for r in 1..=255u8 {
            for p in 0..=255u8 {
                for f in 0..4 {
                    let a = ResetArrival::of_wire(r, p, f | ttl::RESET_SEEN).expect("an RST was seen");
                    if a.reset_from == Some(ResetFrom::Path) {
                        assert!(a.reset_hops_closer.is_some_and(|h| h > 0), "{r} {p} {f}: {a:?}");
                    }
                }
            }
        }
    }
}

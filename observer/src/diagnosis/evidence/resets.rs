//! Who sent the resets that ended a row's connections: one reset's
//! source as the evidence keeps it, and the counts per source a slice
//! keeps (exact, expired with their slice).

use crate::kernel::event::{ResetArrival, ResetFrom};

/// Who sent the reset that ended a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetBy {
    Peer,
    /// A device on the path, this many hops closer than the peer.
    Path(u8),
    Local,
    /// Not told: the peer's SYN-ACK was not seen (a socket older than the
    /// daemon), the RST came further than the peer's packets (a route
    /// change), or the kernel did not allow the hooks that read them.
    Untold,
}

impl ResetBy {
    /// From an event's reading of its RST (`None`: not told).
    #[must_use]
    pub fn of(arrival: Option<ResetArrival>) -> Self {
        match arrival.map(|a| (a.reset_from, a.reset_hops_closer)) {
            Some((Some(ResetFrom::Peer), _)) => Self::Peer,
            Some((Some(ResetFrom::Local), _)) => Self::Local,
            Some((Some(ResetFrom::Path), Some(h))) if h > 0 => Self::Path(h),
            _ => Self::Untold,
        }
    }

    /// The `reset_from` metric label's value (`unknown`: not told).
    #[must_use]
    pub const fn label(self) -> &'static str {
        match self.shown().0 {
            Some(from) => from.as_str(),
            None => "unknown",
        }
    }

    /// The source's name and hops closer, as the row shows them.
    #[must_use]
    pub const fn shown(self) -> (Option<ResetFrom>, Option<u8>) {
        match self {
            Self::Peer => (Some(ResetFrom::Peer), Some(0)),
            Self::Path(h) => (Some(ResetFrom::Path), Some(h)),
            Self::Local => (Some(ResetFrom::Local), None),
            Self::Untold => (None, None),
        }
    }
}

/// Resets counted by who sent them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ResetCounts {
    pub peer: u64,
    pub local: u64,
    /// `path[h - 1]`: made `h` hops closer than the peer (the last also
    /// counts more hops than that).
    pub path: [u64; PATH_HOPS],
    /// Not told (see [`ResetBy::Untold`]).
    pub untold: u64,
}

/// Hops closer than the peer counted apart; more count as the last.
pub const PATH_HOPS: usize = 8;

impl ResetCounts {
    pub(crate) fn count(&mut self, by: ResetBy) {
        match by {
            ResetBy::Peer => self.peer += 1,
            ResetBy::Local => self.local += 1,
            ResetBy::Path(h) => self.path[usize::from(h).clamp(1, PATH_HOPS) - 1] += 1,
            ResetBy::Untold => self.untold += 1,
        }
    }

    pub(crate) fn add(&mut self, o: &Self) {
        self.peer += o.peer;
        self.local += o.local;
        self.untold += o.untold;
        for (a, b) in self.path.iter_mut().zip(o.path) {
            *a += b;
        }
    }

    /// Each source with its count, most first (the peer, then nearer
    /// hops first, on a tie); sources never seen are left out.
    #[must_use]
    pub fn sources(&self) -> Vec<(ResetBy, u64)> {
        let mut all = vec![(ResetBy::Peer, self.peer)];
        #[allow(clippy::cast_possible_truncation, reason = "PATH_HOPS is 8")]
        all.extend(self.path.iter().enumerate().map(|(i, &n)| (ResetBy::Path(i as u8 + 1), n)));
        all.push((ResetBy::Local, self.local));
        all.push((ResetBy::Untold, self.untold));
        all.retain(|&(_, n)| n > 0);
        // Stable: ties keep the order above.
        all.sort_by_key(|&(by, n)| (std::cmp::Reverse(n), by == ResetBy::Untold));
        all
    }
}

//! The network namespaces the socket iterator walks: those walked to their
//! end (`WALKED_NETNS`, which the probes' role rule reads), forgetting the
//! ones no process uses any more, and the one warning when others are out
//! of view.

use std::{collections::HashSet, path::PathBuf};

use aya::maps::{HashMap, MapData};

use super::iter;

/// `WALKED_NETNS` and what the daemon says of it.
pub(super) struct Walked {
    map: HashMap<MapData, u32, u8>,
    /// Namespaces that did not fit the table (the first is logged).
    pub(super) full: u64,
    /// Other namespaces were out of view (said once).
    refused: bool,
}

impl Walked {
    pub(super) fn new(map: HashMap<MapData, u32, u8>) -> Self {
        Self { map, full: 0, refused: false }
    }

    /// Say once that other network namespaces are out of the at-risk
    /// view, and what it takes to see them.
    pub(super) fn refused_once(&mut self, what: &str) {
        if !self.refused {
            self.refused = true;
            log::warn!(
                "the at-risk view may cover this network namespace only: {what} (finding other namespaces in other users' /proc/PID/ns/net takes CAP_SYS_PTRACE, entering them CAP_SYS_ADMIN)"
            );
        }
    }

    /// The iterator walked network namespace `inode` to its end, so every
    /// listener in it is in `LISTENERS` now (see `role::of_adopted`). A
    /// full table leaves the namespace to the ports' rule.
    pub(super) fn walked(&mut self, inode: u64) {
        let Ok(inode) = u32::try_from(inode) else { return };
        if inode == 0 || self.map.get(&inode, 0).is_ok() {
            return;
        }
        if let Err(e) = self.map.insert(inode, 1, 0) {
            if self.full == 0 {
                log::warn!("network namespace {inode}: not entered in the walked table ({e}); its sockets older than observer take their role from the ports");
            }
            self.full += 1;
        }
    }

    /// Namespaces no process uses any more leave the table, so it holds
    /// the namespaces in use, not every one ever seen.
    pub(super) fn forget_gone(&mut self, found: &[(PathBuf, u64)]) {
        let present: HashSet<u64> = found.iter().map(|(_, inode)| *inode).chain([iter::own_netns()]).collect();
        let gone: Vec<u32> =
            self.map.keys().filter_map(Result::ok).filter(|k| !present.contains(&u64::from(*k))).collect();
        for k in gone {
            let _ = self.map.remove(&k);
        }
    }
}

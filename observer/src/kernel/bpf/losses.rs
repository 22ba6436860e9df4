//! Losses the kernel does not count in `COUNTERS` by itself: runs the
//! kernel skipped (`recursion_misses`, 5.12+: a program already running
//! on that CPU, so its evidence was lost before any map), and the server
//! idle closes the `CLOSED_IDLE` LRU map evicted (whose late reuses can no
//! longer be seen).

use std::{
    os::fd::{AsFd as _, AsRawFd as _},
    time::{Duration, Instant},
};

use aya::{
    maps::{HashMap, MapData},
    Ebpf,
};
use observer_common::{ClosedIdle, TupleKey};

/// `BPF_OBJ_GET_INFO_BY_FD`'s part of `union bpf_attr`.
#[repr(C)]
struct InfoByFd {
    bpf_fd: u32,
    info_len: u32,
    info: u64,
}

/// Runs the kernel skipped, summed over observer's programs (0 where the
/// kernel does not report them).
pub(super) fn recursion_misses(ebpf: &Ebpf) -> u64 {
    ebpf.programs().filter_map(|(_, p)| p.fd().ok()).map(|fd| misses(fd.as_fd().as_raw_fd())).sum()
}

fn misses(fd: i32) -> u64 {
    // SAFETY: bpf_prog_info is plain old data; all-zero is a valid value.
    let mut info: aya_obj::generated::bpf_prog_info = unsafe { std::mem::zeroed() };
    let attr = InfoByFd {
        bpf_fd: u32::try_from(fd).unwrap_or(u32::MAX),
        info_len: u32::try_from(size_of_val(&info)).unwrap_or(0),
        info: std::ptr::from_mut(&mut info) as u64,
    };
    // SAFETY: the kernel writes at most `info_len` bytes to `info`, which
    // outlives the call; `attr` is the command's documented layout.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            aya_obj::generated::bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            std::ptr::from_ref(&attr),
            size_of::<InfoByFd>(),
        )
    };
    if rc == 0 {
        info.recursion_misses
    } else {
        0
    }
}

/// Evictions from the `CLOSED_IDLE` LRU map: entries added minus entries
/// removed minus entries left. The entries are counted (one syscall each,
/// at most 16,384) at most every 5 s and only while some are outstanding;
/// a count that races an insert reads low, never high, and the figure only
/// grows.
pub(super) struct Evictions {
    map: HashMap<MapData, TupleKey, ClosedIdle>,
    checked: Option<Instant>,
    evicted: u64,
}

impl Evictions {
    pub(super) fn new(map: HashMap<MapData, TupleKey, ClosedIdle>) -> Self {
        Self { map, checked: None, evicted: 0 }
    }

    /// The entries left, counted when the last count is 5 s old.
    pub(super) fn live_if_due(&mut self) -> Option<u64> {
        if self.checked.is_some_and(|t| t.elapsed() < Duration::from_secs(5)) {
            return None;
        }
        self.checked = Some(Instant::now());
        Some(self.map.keys().flatten().count() as u64)
    }

    /// Evicted so far, given entries added (read before the count of
    /// those left), removed (read after it) and left.
    pub(super) fn update(&mut self, added: u64, removed: u64, live: u64) -> u64 {
        self.evicted = self.evicted.max(added.saturating_sub(removed).saturating_sub(live));
        self.evicted
    }

    pub(super) const fn evicted(&self) -> u64 {
        self.evicted
    }
}

//! The kernel's clocks as events need them: boot-clock nanoseconds to wall
//! time, jiffies to nanoseconds (`CONFIG_HZ`), and a clock read.

/// Converts the kernel's boot-clock timestamps (`CLOCK_BOOTTIME`, which
/// counts suspend) into wall-clock time, and jiffies into seconds.
#[derive(Debug, Clone, Copy)]
pub struct Clock {
    /// realtime - boottime, in ns.
    pub(crate) offset_ns: i128,
    /// The kernel's tick rate (`CONFIG_HZ`), when known.
    pub(crate) hz: Option<u32>,
}

impl Clock {
    /// Sample both clocks now.
    #[must_use]
    pub fn now() -> Self {
        let boot = clock_ns(libc::CLOCK_BOOTTIME);
        let real = clock_ns(libc::CLOCK_REALTIME);
        Self { offset_ns: i128::from(real) - i128::from(boot), hz: kernel_hz() }
    }

    /// A clock with a fixed offset (recordings, tests).
    #[must_use]
    pub const fn with_offset_ns(offset_ns: i128) -> Self {
        Self { offset_ns, hz: Some(250) }
    }

    #[must_use]
    pub fn to_unix_ns(self, mono_ns: u64) -> u64 {
        u64::try_from((i128::from(mono_ns) + self.offset_ns).max(0)).unwrap_or(u64::MAX)
    }
}

/// `CONFIG_HZ` of the running kernel, from `/proc/config.gz` or
/// `/boot/config-<release>`, else from the coarse clock's resolution;
/// `None` when none of them tells.
pub(crate) fn kernel_hz() -> Option<u32> {
    use std::io::Read as _;
    static HZ: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *HZ.get_or_init(|| {
        let mut text = String::new();
        if let Ok(f) = std::fs::File::open("/proc/config.gz") {
            let _ = flate2::read::GzDecoder::new(f).read_to_string(&mut text);
        }
        if text.is_empty() {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
            text = std::fs::read_to_string(format!("/boot/config-{}", release.trim())).unwrap_or_default();
        }
        text.lines()
            .find_map(|l| l.strip_prefix("CONFIG_HZ="))
            .and_then(|v| v.trim().parse().ok())
            .or_else(hz_from_coarse_clock)
    })
}

/// `CONFIG_HZ` from the coarse clock's resolution (`TICK_NSEC`), for a
/// kernel whose config is not readable (a VM, a distribution without
/// `/proc/config.gz` or `/boot/config-*`); None outside HZ 100 to 1000.
pub(crate) fn hz_from_coarse_clock() -> Option<u32> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid pointer to a timespec.
    if unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &raw mut ts) } != 0 || ts.tv_sec != 0 {
        return None;
    }
    let tick = u64::try_from(ts.tv_nsec).ok().filter(|ns| (1_000_000..=10_000_000).contains(ns))?;
    u32::try_from((1_000_000_000 + tick / 2) / tick).ok()
}

/// `clock_gettime` in ns.
#[must_use]
pub fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec; the clocks used always exist.
    unsafe { libc::clock_gettime(clock, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

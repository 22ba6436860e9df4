//! Properties of the send probe's clock-free timing of a busy write
//! (`observer_common::busy::write_start`), against a model of jiffies.

use observer_common::busy::write_start;
use proptest::prelude::*;

const WINDOW: u64 = 100_000_000;
/// `TICK_NSEC` for `CONFIG_HZ` 1000, 300, 250 and 100.
const TICKS: [u64; 4] = [1_000_000, 3_333_333, 4_000_000, 10_000_000];

/// A moment on the model's clocks: jiffy 0 began at monotonic `t0`, the
/// anchor saw it `phase` late (an anchor is within a tick), now is
/// `elapsed` after `t0`, and the host has been suspended `suspended`.
#[derive(Debug, Clone, Copy)]
struct Clocks {
    tick: u64,
    t0: u64,
    phase: u64,
    elapsed: u64,
    suspended: u64,
}

impl Clocks {
    fn epoch(self) -> u64 {
        self.t0 + self.phase
    }
    fn jiffies(self) -> u64 {
        self.elapsed / self.tick
    }
    fn mono_now(self) -> u64 {
        self.t0 + self.elapsed
    }
    fn boot_now(self) -> u64 {
        self.mono_now() + self.suspended
    }
}

fn clocks() -> impl Strategy<Value = Clocks> {
    (
        0..TICKS.len(),
        1_000_000_000u64..1_000_000_000_000_000,
        0u64..1_000,
        1_000_000_000u64..100_000_000_000_000,
        0u64..1_000_000_000_000,
    )
        .prop_map(|(k, t0, phase_per_mille, elapsed, suspended)| {
            let tick = TICKS[k];
            Clocks { tick, t0, phase: tick * phase_per_mille / 1_000, elapsed, suspended }
        })
}

fn start(c: Clocks, last_ns: u64) -> Option<u64> {
    write_start((c.epoch(), c.jiffies(), c.tick), c.suspended, last_ns, WINDOW)
}

proptest! {
    /// Only a write surely inside the window is timed without the clock,
    /// and its start is never late and at most three ticks early.
    #[test]
    fn sure_inside_never_late(c in clocks(), gap in 0u64..300_000_000) {
        let last = c.boot_now() - gap;
        if let Some(t) = start(c, last) {
            prop_assert!(gap < WINDOW, "a write {gap} ns after the answer is not busy");
            prop_assert!(t <= c.boot_now(), "start {t} after now {}", c.boot_now());
            prop_assert!(c.boot_now() - t < 3 * c.tick, "start {} ns early", c.boot_now() - t);
            prop_assert!(t >= last);
        }
    }

    /// A write well inside the window (six ticks of margin) takes the
    /// clock-free path.
    #[test]
    fn well_inside_is_busy(c in clocks(), frac in 0u64..1_000) {
        let gap = (WINDOW - 6 * c.tick) * frac / 1_000;
        prop_assert!(start(c, c.boot_now() - gap).is_some());
    }
}

#[test]
fn unknown_clocks_read_the_clock() {
    let now = 5_000_000_000;
    assert_eq!(write_start((0, 1_000, 4_000_000), 0, now, WINDOW), None, "no anchor yet");
    assert_eq!(write_start((1, 1_000, 0), 0, now, WINDOW), None, "no tick");
    assert_eq!(write_start((1, 1_000, 40_000_000), 0, now, WINDOW), None, "a tick too coarse for the window");
}

#[test]
fn start_is_the_latest_lower_bound() {
    // Jiffy 0 at 1 s, tick 4 ms, now 2.5 s (jiffy 375), answer 1 ms ago.
    let (tick, epoch, jiffies) = (4_000_000, 1_000_000_000, 375);
    let now = 2_500_000_000;
    // The answer came 10 us ago (a busy exchange): the start is that.
    assert_eq!(write_start((epoch, jiffies, tick), 0, now - 10_000, WINDOW), Some(now - 10_000));
    // 1 ms ago: still later than the jiffies' lower bound (two ticks before the estimate).
    assert_eq!(write_start((epoch, jiffies, tick), 0, now - 1_000_000, WINDOW), Some(now - 1_000_000));
    // 20 ms ago: the jiffies' lower bound.
    assert_eq!(write_start((epoch, jiffies, tick), 0, now - 20_000_000, WINDOW), Some(now - 2 * tick));
    // 95 ms after the answer: not surely inside 100 ms.
    assert_eq!(write_start((epoch, jiffies, tick), 0, now - 95_000_000, WINDOW), None);
}

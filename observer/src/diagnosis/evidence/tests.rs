use super::*;

const S: u64 = 1_000_000_000;

fn at(ts_s: u64, sock: u64, obs: Observation) -> Observed {
    Observed {
        ts_ns: 1_700_000_000 * S + ts_s * S,
        sock_id: sock,
        keepalive: false,
        keepalive_idle: 0.0,
        what: obs,
        reset: None,
    }
}

fn ok(idle: f64) -> Observation {
    Observation::Reuse { idle, failed: None, refreshed: false, after_stall: false, after_goodbye: false, ping: false }
}

#[test]
fn the_largest_survival_and_counts_stay_exact() {
    let mut e = Evidence::new(24 * 3600 * S);
    for k in 0..100_000u64 {
        #[allow(clippy::cast_precision_loss, reason = "small")]
        e.add(&at(k / 10, k, ok(1.0 + (k % 997) as f64 * 0.05)), false);
    }
    let max = e.alive(false).iter().map(|p| p.0).reduce(f64::max);
    assert_eq!(max, Some(1.0 + 996.0 * 0.05));
    assert_eq!(e.counts().reuses, 100_000);
    assert_eq!(e.alive(false).iter().map(|p| p.1).sum::<u64>(), 100_000);
    assert!(e.bytes() <= MAX_BYTES, "{} > {MAX_BYTES}", e.bytes());
}

#[test]
fn successes_never_evict_a_failure() {
    let mut e = Evidence::new(24 * 3600 * S);
    for k in 0..8 {
        e.add(
            &at(
                k,
                k,
                Observation::Reuse {
                    idle: 3.0,
                    failed: Some(FailureMode::Rst),
                    refreshed: false,
                    after_stall: false,
                    after_goodbye: false,
                    ping: false,
                },
            ),
            false,
        );
    }
    for k in 0..1_000_000u64 {
        e.add(&at(10 + k / 1000, 100 + k, ok(0.5)), false);
    }
    assert_eq!(e.dead().count(), 8);
    assert_eq!((e.counts().reuses, e.counts().failures), (1_000_008, 8));
    assert!(e.bytes() <= MAX_BYTES);
}

#[test]
fn slices_expire_with_the_window() {
    let mut e = Evidence::new(120 * S);
    e.add(&at(0, 1, ok(5.0)), false);
    e.add(&at(1, 2, Observation::PeerIdleClose { idle: 9.0, mode: FailureMode::Fin }), false);
    e.expire(1_700_000_000 * S + 100 * S);
    assert!(!e.is_empty());
    e.expire(1_700_000_000 * S + 200 * S);
    assert!(e.is_empty(), "{e:?}");
    assert_eq!(e.counts(), Counts::default());
}

#[test]
fn the_last_hour_counts_by_minute() {
    let mut e = Evidence::new(24 * 3600 * S);
    e.add(&at(0, 1, ok(5.0)), false);
    e.add(&at(4000, 2, ok(5.0)), false);
    e.add(
        &at(
            4010,
            3,
            Observation::Reuse {
                idle: 70.0,
                failed: Some(FailureMode::Fin),
                refreshed: false,
                after_stall: false,
                after_goodbye: false,
                ping: false,
            },
        ),
        false,
    );
    assert_eq!(e.last_hour(1_700_000_000 * S + 4020 * S), (2, 1));
    assert_eq!(e.counts().reuses, 3);
}

#[test]
fn full_slices_merge_and_stay_bounded() {
    let mut e = Evidence::new(12 * S);
    // Every slice gets its own epoch split and many bins.
    for k in 0..200u64 {
        for b in 0..100u32 {
            e.add(&at(k, k, ok(f64::from(b).mul_add(1.3, 1.0))), false);
        }
        e.new_epoch(0);
    }
    assert!(e.slices.len() <= MAX_SLICES);
    assert!(e.bytes() <= MAX_BYTES, "{} > {MAX_BYTES}", e.bytes());
    assert_eq!(e.counts().reuses, 200 * 100);
}

#[test]
fn restart_failures_are_counted_not_kept() {
    let mut e = Evidence::new(3600 * S);
    let fail = |idle| Observation::Reuse {
        idle,
        failed: Some(FailureMode::Fin),
        refreshed: false,
        after_stall: false,
        after_goodbye: false,
        ping: false,
    };
    e.add(&at(100, 1, fail(30.0)), false);
    e.add(&at(101, 2, fail(2.0)), false);
    // A restart at 100.5 s: socket 1 was idle since 70 s (across it).
    let n = e.explain_failures(1_700_000_000 * S + 100 * S + S / 2, S);
    assert_eq!(n, 2, "both were idle across it");
    assert_eq!(e.dead().count(), 0);
    assert_eq!((e.counts().failures, e.counts().restart_failures), (2, 2));
}

/// The bound per destination stays under 80 KiB (64 KiB until survivals
/// carried the time of their bin's last one, which tells two paths from
/// a change of timeout; 72 KiB until each flow's longest survival was
/// kept, which two paths' lower bound counts).
const _: () = assert!(MAX_BYTES < 80 * 1024);

fn failed(idle: f64) -> Observation {
    Observation::Reuse {
        idle,
        failed: Some(FailureMode::SilentDrop),
        refreshed: false,
        after_stall: false,
        after_goodbye: false,
        ping: false,
    }
}

/// Each socket is one flow at its longest silent survival, with its
/// earliest failed reuse; a keep-alive refreshed reuse counts at its first
/// answered probe's age; a new epoch starts every flow anew; the window
/// and the cap bound the table.
#[test]
fn flows_keep_each_sockets_longest_survival() {
    let mut e = Evidence::new(120 * S);
    for (t, idle) in [(0, 1.0), (5, 3.0), (10, 2.0)] {
        e.add(&at(t, 1, ok(idle)), false);
    }
    e.add(&at(11, 2, ok(1.5)), false);
    e.add(&at(14, 2, failed(2.5)), false);
    let mut refreshed = at(15, 3, ok(40.0));
    refreshed.what = Observation::Reuse {
        idle: 40.0,
        failed: None,
        refreshed: true,
        after_stall: false,
        after_goodbye: false,
        ping: false,
    };
    refreshed.keepalive_idle = 7.0;
    e.add(&refreshed, false);
    let mut flows = e.flows();
    flows.sort_by(|a, b| a.survived.total_cmp(&b.survived));
    let want = [(1.5, Some(2.5)), (3.0, None), (7.0, None)];
    assert_eq!(flows.iter().map(|f| (f.survived, f.failed)).collect::<Vec<_>>(), want);
    e.new_epoch(1_700_000_000 * S + 20 * S);
    assert!(e.flows().is_empty(), "{:?}", e.flows());
    e.add(&at(21, 1, ok(0.5)), false);
    assert_eq!(e.flows().iter().map(|f| f.survived).collect::<Vec<_>>(), [0.5]);
    e.expire(1_700_000_000 * S + 200 * S);
    assert!(e.flow_table.entries.is_empty());
    for k in 0..(3 * MAX_FLOWS as u64) {
        e.add(&at(300 + k, 100 + k, ok(1.0)), false);
    }
    assert_eq!(e.flows().len(), MAX_FLOWS);
    // The least recently surviving left: the newest sockets remain.
    let kept = &e.flow_table.entries;
    assert!(kept.iter().all(|f| f.sock_id >= 100 + 2 * MAX_FLOWS as u64), "{:?}", &kept[..4]);
    assert!(e.bytes() <= MAX_BYTES, "{} > {MAX_BYTES}", e.bytes());
}

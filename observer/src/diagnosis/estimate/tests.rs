#![allow(clippy::float_cmp, reason = "expected values are exact copies of the inputs")]
#![allow(clippy::cast_precision_loss, reason = "small test indices")]
use super::*;
use std::collections::BTreeMap;

use proptest::prelude::*;

#[test]
fn clean_evidence_gives_max_alive_min_dead() {
    let i = interval(&[1.0, 2.0, 2.9], &[3.1, 4.0]);
    assert_eq!(i.lower, Some(2.9));
    assert_eq!(i.upper, Some(3.1));
    assert_eq!((i.lower_evidence, i.upper_evidence, i.outliers), (3, 2, 0));
}

#[test]
fn one_sided_evidence() {
    let i = interval(&[1.0, 5.0], &[]);
    assert_eq!((i.lower, i.upper), (Some(5.0), None));
    let i = interval(&[], &[7.0, 9.0]);
    assert_eq!((i.lower, i.upper), (None, Some(7.0)));
    assert_eq!(interval(&[], &[]), Interval::default());
}

#[test]
fn a_stray_reset_does_not_collapse_the_interval() {
    // True timeout 60 s; a backend restart reset a socket idle 5 s.
    let alive = [10.0, 20.0, 30.0, 45.0, 55.0, 59.0];
    let dead = [5.0, 61.0, 70.0, 90.0];
    let i = interval(&alive, &dead);
    assert_eq!((i.lower, i.upper), (Some(59.0), Some(61.0)));
    assert_eq!(i.outliers, 1);
}

#[test]
fn ties_trust_successes() {
    // One success above one failure: keep the success.
    let i = interval(&[1.0, 2.0, 5.0], &[3.0, 6.0]);
    assert_eq!((i.lower, i.upper), (Some(5.0), Some(6.0)));
}

#[test]
fn cluster_rule() {
    assert_eq!(cluster(&[60.0, 60.5, 61.0, 200.0]), Some(Cluster { value: 60.5, count: 3 }));
    assert_eq!(cluster(&[60.0, 61.0]), None, "two is not a cluster");
    assert_eq!(cluster(&[10.0, 30.0, 60.0]), None, "spread too wide");
    // Equal-sized clusters: the smaller timeout wins.
    assert_eq!(cluster(&[5.0, 5.0, 5.1, 60.0, 60.0, 60.0]).map(|c| c.value), Some(5.0));
    assert_eq!(cluster(&[2.0, 2.0, 2.002, 2.004]).map(|c| c.value), Some(2.001));
}

#[test]
fn several_clusters_are_mixed_paths() {
    let v = [2.0, 2.01, 2.02, 2.03, 5.0, 5.02, 5.05, 9.0];
    let c = clusters(&v);
    assert_eq!(
        c.iter().map(|c| ((c.value * 1000.0).round(), c.count)).collect::<Vec<_>>(),
        vec![(2015.0, 4), (5020.0, 3)]
    );
    assert_eq!(clusters(&[60.0, 60.2, 60.4, 61.0]).len(), 1);
    assert!(clusters(&[1.0, 30.0]).is_empty());
}

#[test]
fn weights_count_as_many_observations() {
    // 1000 successes at 59 s outweigh two failures below them.
    let i = interval_weighted(&[(30.0, 10), (59.0, 1000)], &[20.0, 25.0, 61.0]);
    assert_eq!((i.lower, i.upper, i.outliers), (Some(59.0), Some(61.0), 2));
    assert_eq!(i.lower_evidence, 1010);
}

#[test]
fn recommendation_is_eighty_percent() {
    assert!((recommended_pool_idle(60.0) - 48.0).abs() < 1e-9);
    assert!((recommended_pool_idle(3.0) - 2.4).abs() < 1e-9);
}

/// Reuse outcome at idle `gap` for a path with timeout `t`.
fn observe(t: f64, gaps: &[f64]) -> (Vec<f64>, Vec<f64>) {
    gaps.iter().partition(|&&g| g < t)
}

proptest! {
    #[test]
    fn interval_always_contains_the_truth(t in 1.0f64..4000.0, gaps in prop::collection::vec(0.01f64..3.0, 1..200)) {
        let gaps: Vec<f64> = gaps.iter().map(|g| g * t).collect();
        let (alive, dead) = observe(t, &gaps);
        let i = interval(&alive, &dead);
        prop_assert!(i.contains(t), "{i:?} excludes {t}");
        prop_assert_eq!(i.outliers, 0);
    }

    #[test]
    fn interval_narrows_as_evidence_grows(t in 1.0f64..4000.0, gaps in prop::collection::vec(0.5f64..1.5, 2..200)) {
        let gaps: Vec<f64> = gaps.iter().map(|g| g * t).collect();
        let half = gaps.len() / 2;
        let (a1, d1) = observe(t, &gaps[..half]);
        let (a2, d2) = observe(t, &gaps);
        let (i1, i2) = (interval(&a1, &d1), interval(&a2, &d2));
        if let (Some(w1), Some(w2)) = (i1.width(), i2.width()) {
            prop_assert!(w2 <= w1 + 1e-9, "width grew from {w1} to {w2}");
        }
        prop_assert!(i2.lower.unwrap_or(0.0) >= i1.lower.unwrap_or(0.0));
        prop_assert!(i2.upper.unwrap_or(f64::INFINITY) <= i1.upper.unwrap_or(f64::INFINITY));
    }

    #[test]
    fn twenty_spread_reuses_pin_the_timeout_to_twenty_percent(t in 1.0f64..4000.0, jitter in prop::collection::vec(0.0f64..1.0, 20)) {
        // Stratified: one gap in each twentieth of [0.5T, 1.5T].
        let gaps: Vec<f64> = jitter.iter().enumerate().map(|(k, j)| (0.5 + (k as f64 + j) / 20.0) * t).collect();
        let (alive, dead) = observe(t, &gaps);
        let i = interval(&alive, &dead);
        prop_assert!(i.contains(t));
        let w = i.width().expect("both bounds");
        prop_assert!(w <= 0.2 * t, "width {w} for T={t}");
    }

    #[test]
    fn one_stray_reset_never_moves_bounds_below_truth(t in 1.0f64..4000.0, jitter in prop::collection::vec(0.0f64..1.0, 20), stray in 0.0f64..1.0) {
        let gaps: Vec<f64> = jitter.iter().enumerate().map(|(k, j)| (0.5 + (k as f64 + j) / 20.0) * t).collect();
        let (alive, mut dead) = observe(t, &gaps);
        dead.push(stray * 0.5 * t);
        let i = interval(&alive, &dead);
        prop_assert!(i.contains(t), "{i:?} excludes {t}");
        prop_assert!(i.upper.is_some_and(|u| u >= t));
    }
}

#[test]
fn a_sweep_fills_one_band() {
    // A once-a-second sweep of a 2 s timeout: closes anywhere in [2, 3].
    let closes = [2.06, 2.9, 2.41, 2.2, 2.75, 2.55];
    let b = spread(&closes).unwrap();
    assert_eq!((b.earliest, b.latest, b.count), (2.06, 2.9, 6));
    assert!((b.start - 1.64).abs() < 1e-9, "2.06 less half of 0.84: {b:?}");
    let alive = [(1.0, 3), (1.5, 1), (1.9, 1), (2.3, 1), (2.8, 1), (3.2, 1)];
    let i = spread_interval(&alive, &[2.06, 2.2, 2.41, 2.55, 2.75, 2.9, 3.5, 4.4], b);
    assert_eq!((i.lower, i.upper), (Some(1.5), Some(2.06)));
    assert_eq!((i.lower_evidence, i.upper_evidence), (4, 8));
    assert_eq!(i.outliers, 1, "only the survival past the band's end (3.2)");
    assert!(b.holds(1.9) && b.holds(2.3) && b.holds(3.0) && !b.holds(1.6) && !b.holds(3.1));
    assert!(i.lower.unwrap() <= b.start && b.start <= i.upper.unwrap(), "the point lies in the interval");
}

#[test]
fn sharp_timeouts_and_mixed_paths_are_no_spread() {
    // A sharp 60 s timeout with jitter: a cluster.
    assert_eq!(spread(&[60.0, 60.1, 59.9, 60.05, 60.2, 59.95]), None);
    // Two backends behind one address: a gap.
    assert_eq!(spread(&[5.0, 5.1, 5.05, 60.0, 60.2, 59.9]), None);
    // A cluster with a few stragglers is the cluster.
    assert_eq!(spread(&[60.0, 60.1, 60.05, 59.9, 45.0, 50.0, 55.0]), None);
    // Too few to tell.
    assert_eq!(spread(&[2.1, 2.5, 2.9, 2.3]), None);
    // Wider than a factor of two is no sweep of one timeout.
    assert_eq!(spread(&[2.0, 2.8, 3.6, 4.4, 5.0]), None);
}

proptest! {
    /// A sweep every `period` s of a timeout `t` (a connection idle past `t`
    /// is closed at the first sweep after that: anywhere in [t, t + period])
    /// seen through enough closes is a spread whose earliest edge is at or
    /// past `t`, and the recommendation from it stays below 0.8 x the
    /// earliest close that ever happens.
    #[test]
    fn a_sweep_is_recognised_and_its_edge_never_overstated(
        t in 1.0f64..300.0,
        frac in 0.3f64..1.0,
        phases in prop::collection::vec(0.0f64..1.0, 8..40),
    ) {
        let period = t * frac;
        let closes: Vec<f64> = phases.iter().map(|p| t + p * period).collect();
        let min = closes.iter().copied().fold(f64::INFINITY, f64::min);
        if let Some(b) = spread(&closes) {
            prop_assert!(b.earliest >= t && b.earliest == min && b.latest <= t + period);
            prop_assert!(b.start <= b.earliest && b.start >= b.latest / 2.0);
            prop_assert!(recommended_pool_idle(b.start) <= 0.8 * min + 0.001);
        }
        // With closes spread evenly enough, the band is always seen.
        let even: Vec<f64> = (0..10).map(|k| t + period * (f64::from(k) + 0.5) / 10.0).collect();
        prop_assert!(spread(&even).is_some(), "{even:?}");
    }
}

/// A sweep whose phase put half the closes within 5% of each other: the
/// cluster sits above failures the reuses proved, with closes filling the
/// band below it, so it is the band, not a sharp timeout (the 6.12 VM's
/// swept run 4: a cluster at 2.59 s above a failure at 2.10 s).
#[test]
fn a_cluster_above_a_proven_failure_is_a_sweeps_phase() {
    let closes = [2.10, 2.2, 2.35, 2.45, 2.57, 2.58, 2.59, 2.59, 2.6, 2.61, 2.62, 2.8, 2.9];
    assert_eq!(spread(&closes), None, "alone, the cluster holds half: sharp");
    let b = spread_below(&closes, Some(2.1005)).expect("a band below the cluster");
    assert!((b.earliest - 2.10).abs() < 1e-9 && b.start <= 2.10, "{b:?}");
    // A sharp timeout whose cluster lies at the proven failure stays sharp.
    assert_eq!(spread_below(&[60.0, 60.1, 60.05, 59.9, 45.0, 50.0, 55.0], Some(60.0)), None);
}

#[test]
fn a_point_never_lies_outside_its_interval() {
    let i = Interval { lower: Some(2.0997), upper: Some(2.1005), ..Interval::default() };
    let far = Cluster { value: 2.59, count: 7 };
    let near = Cluster { value: 2.1, count: 3 };
    assert_eq!(point_of(&i, &[far]), None, "a cluster past the proven failure is no point");
    assert_eq!(point_of(&i, &[near]), Some(Cluster { value: 2.1, count: 3 }));
    let past = Cluster { value: 2.102, count: 3 };
    assert_eq!(point_of(&i, &[past]), Some(Cluster { value: 2.1005, count: 3 }), "clamped to the proven failure");
    let below = Interval { lower: Some(3.0), upper: None, ..Interval::default() };
    assert_eq!(point_of(&below, &[near]), None, "nor one below a proven survival");
}

/// Reuses at idle ages spread over [1, 5.5] s, each flow hashed (by a
/// deterministic sequence) onto a path that forgets idle flows at 2 s or
/// one that forgets them at 4 s, `short_every` of 4 flows on the short one.
fn two_silent_paths(n: usize, short_every: usize) -> (Vec<(f64, u64)>, Vec<f64>) {
    let (mut alive, mut dead) = (Vec::new(), Vec::new());
    for k in 0..n {
        // A low-discrepancy walk over the ages, so both paths see them all.
        let age = 1.0 + 4.5 * ((k as f64 * 0.618_034) % 1.0);
        let timeout = if k % 4 < short_every { 2.0 } else { 4.0 };
        if age < timeout {
            alive.push((age, 1));
        } else {
            dead.push(age);
        }
    }
    (alive, dead)
}

#[test]
fn two_silent_paths_give_the_shorter_ones_interval() {
    for short_every in [1, 2, 3] {
        let (alive, dead) = two_silent_paths(80, short_every);
        let one = interval_weighted(&alive, &dead);
        let i = two_paths_flow_each(&alive, &dead).expect("two paths");
        let p = i.paths.expect("paths");
        // A quarter of 80 flows is too few to bound the short path below
        // with confidence (no lower bound then: open below, still right).
        assert!(short_every == 1 || i.lower.is_some(), "{short_every}/4: {i:?}");
        assert!(
            i.lower.is_none_or(|l| l < 2.0) && 2.0 <= i.upper.unwrap(),
            "{short_every}/4: {i:?} (one step: {one:?})"
        );
        assert!(i.upper.unwrap() < 2.3, "{i:?}");
        // The longer path's bracket: its first failure past the mix may be
        // a short-path flow's, so it lies within a spacing of 4 s.
        assert!((p.long_upper.unwrap() - 4.0).abs() < 0.2 && p.long_lower.unwrap() < 4.0, "{p:?}");
        let share = short_every as f64 / 4.0;
        assert!((p.short_share - share).abs() < 0.15, "share {} for {share}", p.short_share);
        assert!(p.mixes(3.0) && !p.mixes(1.5) && !p.mixes(5.0));
        // The recommendation stands on the short path's lower bound.
        assert!(i.lower.is_none_or(|l| recommended_pool_idle(l) < 0.8 * 2.0));
    }
}

/// Few observations between the steps, most of them failures: the share
/// estimate (6 of 8 between the steps the fit finds) is far above the
/// truth, and with it the lower bound would step back over 4 survivals
/// only, all of the longer path's
/// (2.05 to 2.3 s, past the shorter path's 2 s). Taken as at most half, it
/// steps back over 7 and stays below 2 s.
#[test]
fn an_overestimated_share_does_not_lift_the_lower_bound_past_the_timeout() {
    let mut alive: Vec<(f64, u64)> = (0..10).map(|k| (1.0 + f64::from(k) * 0.1, 1)).collect();
    alive.extend([2.05, 2.12, 2.18, 2.3, 2.7, 3.3].map(|t| (t, 1)));
    let dead = [2.43, 2.5, 2.6, 2.75, 2.9, 3.2, 3.5, 3.8, 4.1, 4.5];
    let i = two_paths_flow_each(&alive, &dead).expect("two paths");
    let p = i.paths.unwrap();
    assert!(p.short_share >= 0.7, "{p:?}");
    assert!(i.lower.unwrap() < 2.0 && i.upper == Some(2.43), "{i:?}");
}

/// What CI's daemon saw of two paths forgetting flows at 2 s and 4 s (84
/// reuses, the recording's idle ages): the shorter path's one failure
/// below 2.8 s came at 2.276 s, and 12 longer-path survivals followed it
/// before its next. That failure is the shorter path's first, not a stray:
/// the bracket holds 2 s.
#[test]
fn a_lone_early_failure_of_the_shorter_path_is_its_first() {
    let alive: Vec<(f64, u64)> = [
        1.001, 1.059, 1.119, 1.156, 1.214, 1.274, 1.311, 1.37, 1.406, 1.465, 1.524, 1.562, 1.621, 1.716, 1.775, 1.812,
        1.873, 1.93, 1.967, 2.026, 2.062, 2.122, 2.181, 2.217, 2.336, 2.372, 2.431, 2.468, 2.527, 2.586, 2.623, 2.683,
        2.779, 2.874, 2.933, 3.125, 3.243, 3.28, 3.339, 3.494, 3.53, 3.685, 3.745, 3.779, 3.841, 3.936, 3.995,
    ]
    .map(|t| (t, 1))
    .to_vec();
    let dead = [
        2.276, 2.837, 2.992, 3.029, 3.088, 3.186, 3.435, 3.591, 3.649, 3.9, 4.055, 4.091, 4.15, 4.186, 4.247, 4.305,
        4.342, 4.404, 4.498, 4.556, 4.594, 4.652, 4.712, 4.749, 4.807, 4.843, 4.903, 4.962, 4.998, 5.058, 5.154, 5.213,
        5.249, 5.309, 5.369, 5.405, 5.463,
    ];
    let i = two_paths_flow_each(&alive, &dead).expect("two paths");
    assert!(i.lower.unwrap() < 2.0 && i.upper == Some(2.276), "{i:?}");
}

#[test]
fn strays_are_no_second_path() {
    // One stray reset below many survivals (the one-step test above).
    let alive = [10.0, 20.0, 30.0, 45.0, 55.0, 59.0].map(|t| (t, 1));
    assert_eq!(two_paths_flow_each(&alive, &[5.0, 61.0, 70.0, 90.0]), None);
    // Three failures scattered among 300 survivals: 1 %, a stray rate.
    let alive: Vec<(f64, u64)> = (0..300).map(|k| (1.0 + f64::from(k) * 0.1, 1)).collect();
    assert_eq!(two_paths_flow_each(&alive, &[3.05, 12.05, 25.05, 31.0, 32.0, 33.0]), None);
    // A clean single path.
    assert_eq!(two_paths_flow_each(&[(1.0, 5), (1.9, 5)], &[2.1, 2.5, 3.0]), None);
}

/// Two paths where every reuse is a flow of its own (each survival one
/// draw of a path): the pure-mix model.
fn two_paths_flow_each(alive: &[(f64, u64)], dead: &[f64]) -> Option<Interval> {
    let flows: Vec<FlowSurvival> = alive
        .iter()
        .flat_map(|&(age, n)| {
            std::iter::repeat_n(FlowSurvival { survived: age, failed: None }, usize::try_from(n).unwrap())
        })
        .collect();
    two_paths(alive, dead, &flows)
}

proptest! {
    /// Whatever the mix (a quarter to three quarters on the short path),
    /// with 60+ reuses the interval shown brackets the shorter timeout.
    #[test]
    fn the_shorter_path_is_bracketed(n in 60usize..300, short_every in 1usize..4) {
        let (alive, dead) = two_silent_paths(n, short_every);
        let i = two_paths_flow_each(&alive, &dead);
        prop_assert!(i.is_some());
        let i = i.unwrap();
        // No lower bound is claimed where too few survivals lie below the
        // first failure to be sure one took the shorter path.
        prop_assert!(i.lower.is_none_or(|l| l < 2.0) && 2.0 <= i.upper.unwrap(), "{:?}", i);
        prop_assert!(n < 150 || i.lower.is_some(), "{:?}", i);
    }
}

/// Reuses at `n` random idle ages over [1, 5.5] s (a seeded generator),
/// each flow on the 2 s path with chance `share`, else on the 4 s path: the
/// live test's topology (two nftables sets split by a port bit) without
/// its clocks.
fn random_two_paths(n: usize, share: f64, seed: u64) -> (Vec<(f64, u64)>, Vec<f64>) {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    let mut next = || {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let (mut alive, mut dead) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let age = 1.0 + 4.5 * next();
        let timeout = if next() < share { 2.0 } else { 4.0 };
        if age < timeout {
            alive.push((age, 1));
        } else {
            dead.push(age);
        }
    }
    (alive, dead)
}

/// Random mixes of 84 reuses (the live test's size), a quarter to 0.7 of
/// the flows on the 2 s path, 2,000 each: the interval shown misses 2 s in
/// at most 1 % of them (the run length's chance, `LONG_RUN_CHANCE`; with
/// the fitted share itself it missed in 4.6 % at a quarter), and at half
/// the median lower bound stays above 1.5 s (the recommendation keeps its
/// use). The figures in `docs/how-it-observes.md` are this test's.
#[test]
fn random_mixes_of_two_paths_miss_the_shorter_timeout_rarely() {
    for share in [0.25, 0.3, 0.5, 0.7] {
        let (mut missed, mut lowers) = (0, Vec::new());
        for seed in 0..2000 {
            let (alive, dead) = random_two_paths(84, share, seed);
            let Some(i) = two_paths_flow_each(&alive, &dead) else { continue };
            if i.lower.is_none_or(|l| l < 2.0) && 2.0 <= i.upper.unwrap() {
                lowers.extend(i.lower);
            } else {
                missed += 1;
            }
        }
        lowers.sort_by(f64::total_cmp);
        let median = lowers.get(lowers.len() / 2).copied();
        eprintln!(
            "MEASURED share {share}: 2 s outside the interval in {missed} of 2000; {} lower bounds, median {median:?}",
            lowers.len()
        );
        assert!(missed <= 20, "share {share}: 2 s outside the interval in {missed} of 2000");
        if share == 0.5 {
            assert!(median.is_some_and(|m| m > 1.5), "median lower bound {median:?}");
        }
    }
}

/// The live test's clients without their clocks: `clients` pooled
/// connections, each reused after random idle ages over [1, 5.5] s until
/// a reuse fails (then a new connection, a new draw of a path: 2 s with
/// chance `share`, else 4 s), `n` reuses in all, as `(age, survived,
/// connection)` in order.
pub(crate) fn pooled_reuses(n: usize, clients: usize, share: f64, seed: u64) -> Vec<(f64, bool, u64)> {
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
    let mut next = || {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut opened = 0u64;
    let mut open = |next: &mut dyn FnMut() -> f64| {
        opened += 1;
        (if next() < share { 2.0 } else { 4.0 }, opened)
    };
    // Each client's connection: (timeout, id).
    let mut conns: Vec<(f64, u64)> = (0..clients).map(|_| open(&mut next)).collect();
    let mut out = Vec::with_capacity(n);
    for k in 0..n {
        let age = 1.0 + 4.5 * next();
        let c = k % clients;
        let ok = age < conns[c].0;
        out.push((age, ok, conns[c].1));
        if !ok {
            conns[c] = open(&mut next);
        }
    }
    out
}

/// [`pooled_reuses`] as the estimator takes it: the reuses' evidence and
/// each connection's longest survival and failure.
fn pooled_two_paths(n: usize, clients: usize, share: f64, seed: u64) -> (Vec<(f64, u64)>, Vec<f64>, Vec<FlowSurvival>) {
    let reuses = pooled_reuses(n, clients, share, seed);
    let alive: Vec<(f64, u64)> = reuses.iter().filter(|r| r.1).map(|r| (r.0, 1)).collect();
    let dead: Vec<f64> = reuses.iter().filter(|r| !r.1).map(|r| r.0).collect();
    let mut flows: BTreeMap<u64, FlowSurvival> = BTreeMap::new();
    for &(age, ok, conn) in &reuses {
        if ok {
            let f = flows.entry(conn).or_insert(FlowSurvival { survived: age, failed: None });
            f.survived = f.survived.max(age);
        } else if let Some(f) = flows.get_mut(&conn) {
            f.failed = Some(age);
        }
    }
    (alive, dead, flows.into_values().collect())
}

/// Pooled connections keep their path for life: the longer path's few
/// connections survive again and again between the two timeouts, and
/// counted as reuses they pass for many independent draws (CI's host run
/// bounded a 2 s path below at 2.185 s so). Over 2,000 random runs of the
/// live test's shape (84 reuses, 6 clients) at each share, the interval
/// counted in flows misses 2 s in at most 1 % (`LONG_RUN_CHANCE`); counted
/// in reuses it misses far more often (measured, printed). The shorter
/// path's flows that failed between the steps bound it below by their own
/// survivals, so most runs still get a lower bound.
#[test]
fn pooled_connections_are_counted_as_flows_not_reuses() {
    for share in [0.25, 0.5, 0.7] {
        let (mut missed, mut missed_by_reuses, mut lowers) = (0, 0, Vec::new());
        for seed in 0..2000 {
            let (alive, dead, flows) = pooled_two_paths(84, 6, share, seed);
            let holds = |i: &Interval| i.lower.is_none_or(|l| l < 2.0) && i.upper.is_some_and(|u| 2.0 <= u);
            if let Some(i) = two_paths(&alive, &dead, &flows) {
                missed += usize::from(!holds(&i));
                lowers.extend(i.lower);
            }
            if let Some(i) = two_paths_flow_each(&alive, &dead) {
                missed_by_reuses += usize::from(!holds(&i));
            }
        }
        lowers.sort_by(f64::total_cmp);
        let median = lowers.get(lowers.len() / 2).copied().unwrap_or_default();
        eprintln!(
            "MEASURED pooled, share {share}: 2 s outside the interval in {missed} of 2000 counted in flows ({} bounded below, median {median:.3} s), {missed_by_reuses} counted in reuses",
            lowers.len()
        );
        assert!(missed <= 20, "share {share}: missed {missed} of 2000");
        assert!(missed_by_reuses > missed, "share {share}: reuses {missed_by_reuses}, flows {missed}");
        // The flows that failed between the steps keep the bound useful.
        if share == 0.5 {
            assert!(lowers.len() > 1500 && median > 1.5, "{} bounded, median {median}", lowers.len());
        }
    }
}

/// A flow that survived past the shorter path's first failure is the
/// longer path's: however often it was reused below, it is no draw. Three
/// such connections reused 20 times between 2.05 and 2.6 s bound nothing;
/// counted as reuses they would lift the bound past 2 s.
#[test]
fn a_long_path_flows_reuses_below_the_step_are_no_draws() {
    let mut alive: Vec<(f64, u64)> = (0..10).map(|k| (1.0 + f64::from(k) * 0.09, 1)).collect();
    alive.extend((0..20).map(|k| (2.05 + f64::from(k) * 0.027, 1)));
    alive.extend([3.0, 3.3, 3.6].map(|t| (t, 1)));
    let dead = [2.62, 2.7, 2.8, 2.95, 3.1, 3.2, 3.4, 4.1, 4.3, 4.5, 4.8, 5.0];
    // Ten short-path flows (one survival each, not yet failed), three
    // long ones.
    let mut flows: Vec<FlowSurvival> =
        (0..10).map(|k| FlowSurvival { survived: 1.0 + f64::from(k) * 0.09, failed: None }).collect();
    flows.extend([3.0, 3.3, 3.6].map(|m| FlowSurvival { survived: m, failed: None }));
    let by_flows = two_paths(&alive, &dead, &flows).expect("two paths");
    assert!(by_flows.lower.is_some_and(|l| l < 2.0) && by_flows.upper == Some(2.62), "{by_flows:?}");
    let by_reuses = two_paths_flow_each(&alive, &dead).expect("two paths");
    assert!(by_reuses.lower.is_some_and(|l| l > 2.0), "the reuse count lifts it: {by_reuses:?}");
}

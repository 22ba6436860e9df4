#![allow(clippy::float_cmp, reason = "expected values are exact copies of the inputs")]
#![allow(clippy::cast_precision_loss, reason = "small test indices")]
use super::*;
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

#![allow(clippy::float_cmp, reason = "ages are rounded to the millisecond, so exact values are expected")]

use proptest::prelude::*;

use super::{first_round, Close, FailureMode, LongerPath, Outcome, Probe, Search, REPEAT};

/// When a probe planned at `planned` s leaves: the command's own timer
/// plus a jiffy or two (`late` in [0, 1): up to 8 ms).
fn sent_at(planned: f64, late: f64) -> f64 {
    planned + 0.008 * late
}

/// A simulated path: a hop that drops a flow silently once idle for
/// `silent` s, and one that closes it (FIN) at `fin` s; rounds as the
/// command runs them, each probe sent late by a fraction from `late`.
fn run(silent: Option<f64>, fin: Option<f64>, up_to: f64, n: usize, late: f64) -> (Search, u32) {
    let mut search = Search::default();
    let mut ages = first_round(up_to, n);
    let mut round = 0;
    loop {
        round += 1;
        for (i, &planned) in ages.iter().enumerate() {
            #[allow(clippy::cast_precision_loss, reason = "a few connections")]
            let at = sent_at(planned, (late + i as f64 * 0.37) % 1.0);
            let fin_first = fin.is_some_and(|f| f <= at && silent.is_none_or(|s| f < s));
            let outcome = if fin_first {
                Outcome::Closed { close: Close::Fin, at_seconds: fin.unwrap_or_default() }
            } else if silent.is_some_and(|s| at >= s) {
                Outcome::Dead { reset: false, at_seconds: at }
            } else {
                Outcome::Alive { at_seconds: at }
            };
            search.record(Probe { round, planned_seconds: planned, outcome });
        }
        match search.next_round(n) {
            Some(next) => ages = next,
            None => return (search, round),
        }
        assert!(round < 40, "the search does not end");
    }
}

#[test]
fn the_first_round_spreads_geometrically_from_one_second_to_up_to() {
    let ages = first_round(900.0, 8);
    assert_eq!(ages.len(), 8);
    assert_eq!((ages[0], ages[7]), (1.0, 900.0));
    assert!(ages.windows(2).all(|w| w[0] < w[1]), "{ages:?}");
    // Each step is the same factor, 900^(1/7) = 2.643.
    assert_eq!(ages[1], 2.643);
    assert_eq!(first_round(60.0, 1), vec![60.0]);
}

#[test]
fn a_fin_hop_is_measured_in_one_round() {
    let (search, rounds) = run(None, Some(60.2), 900.0, 8, 0.0);
    assert_eq!(rounds, 1);
    let f = search.finding();
    assert_eq!(f.how, FailureMode::Fin);
    assert_eq!(f.idle_timeout_seconds, Some(60.2));
    let rec = f.recommended_pool_idle_timeout_seconds.unwrap();
    assert!((rec - 48.16).abs() < 1e-9, "{rec}");
}

#[test]
fn a_silent_drop_at_350_s_is_bracketed_within_5_percent() {
    let (search, rounds) = run(Some(350.0), None, 900.0, 32, 0.5);
    let f = search.finding();
    assert_eq!(f.how, FailureMode::SilentDrop);
    let (lo, hi) = (f.lower_seconds, f.upper_seconds.unwrap());
    assert!(lo < 350.0 && 350.0 <= hi, "[{lo}, {hi}]");
    assert!(hi - lo <= 0.05 * hi, "[{lo}, {hi}]");
    assert!(f.settled);
    assert!(rounds <= 5, "{rounds} rounds");
    assert_eq!(f.recommended_pool_idle_timeout_seconds, Some(lo * 0.8));
    assert_eq!(f.longer_path, None, "one path");
}

#[test]
fn nothing_closing_within_up_to_is_none() {
    let (search, rounds) = run(None, None, 20.0, 8, 0.0);
    assert_eq!(rounds, 1);
    let f = search.finding();
    assert_eq!((f.how, f.upper_seconds), (FailureMode::None, None));
    assert!((20.0..20.01).contains(&f.lower_seconds), "{f:?}");
    assert_eq!(f.recommended_pool_idle_timeout_seconds, None);
}

#[test]
fn a_silent_drop_before_a_fin_hop_is_the_effective_timeout() {
    let (search, _) = run(Some(30.0), Some(60.0), 900.0, 8, 0.2);
    let f = search.finding();
    assert_eq!(f.how, FailureMode::SilentDrop);
    assert!(f.lower_seconds < 30.0 && f.upper_seconds.unwrap() >= 30.0, "{f:?}");
}

/// The bracket holds the ages the probes left at, its lower end where
/// `REPEAT` connections were alive, and the next round spreads evenly
/// inside it, `REPEAT` connections at each age.
#[test]
fn the_next_round_splits_the_bracket_of_measured_ages() {
    let mut s = Search::default();
    for _ in 0..REPEAT {
        s.record(Probe { round: 1, planned_seconds: 40.0, outcome: Outcome::Alive { at_seconds: 40.002 } });
    }
    s.record(Probe { round: 1, planned_seconds: 50.0, outcome: Outcome::Dead { reset: false, at_seconds: 50.004 } });
    let f = s.finding();
    assert_eq!((f.lower_seconds, f.upper_seconds), (40.002, Some(50.004)));
    let next = s.next_round(64).unwrap();
    assert_eq!(next.len(), 64);
    let mut ages = next.clone();
    ages.dedup();
    assert_eq!(ages, vec![42.002, 44.003, 46.003, 48.004]);
    // Within 5 %: done.
    for _ in 0..REPEAT {
        s.record(Probe { round: 2, planned_seconds: 48.0, outcome: Outcome::Alive { at_seconds: 48.0 } });
    }
    assert_eq!(s.next_round(64), None);
    assert!(s.finding().settled);
}

/// One connection alive is no lower bound: a shorter path carrying a
/// quarter of the flows could hide above it.
#[test]
fn fewer_than_repeat_survivals_prove_no_lower_bound() {
    let mut s = Search::default();
    s.record(Probe { round: 1, planned_seconds: 40.0, outcome: Outcome::Alive { at_seconds: 40.0 } });
    s.record(Probe { round: 1, planned_seconds: 50.0, outcome: Outcome::Dead { reset: false, at_seconds: 50.0 } });
    let f = s.finding();
    assert_eq!((f.lower_seconds, f.upper_seconds, f.recommended_pool_idle_timeout_seconds), (0.0, Some(50.0), None));
    assert!(!f.settled);
}

#[test]
fn an_alive_flow_above_a_dead_age_is_a_longer_path_not_the_bracket() {
    let mut s = Search::default();
    for (age, outcome) in [
        (5.0, Outcome::Alive { at_seconds: 5.0 }),
        (10.0, Outcome::Dead { reset: false, at_seconds: 10.0 }),
        (20.0, Outcome::Alive { at_seconds: 20.0 }),
    ] {
        s.record(Probe { round: 1, planned_seconds: age, outcome });
    }
    let f = s.finding();
    assert_eq!((f.upper_seconds, f.contradictions), (Some(10.0), 1));
    assert_eq!(f.longer_path, Some(LongerPath { lower_seconds: 20.0, upper_seconds: None }));
    // Longer connections are waited for up to twice the dead age.
    assert!(s.worth_waiting(19.0, 10.0) && !s.worth_waiting(21.0, 10.0));
    assert_eq!(s.next_round(4), Some(vec![5.0; 4]));
}

/// A probe sent at 2 s meets the RST a hop sends at 2.001 s: that is the
/// hop's close, not a flow forgotten before 2 s.
#[test]
fn a_probe_racing_a_hops_reset_is_the_reset() {
    let mut s = Search::default();
    s.record(Probe { round: 1, planned_seconds: 1.0, outcome: Outcome::Alive { at_seconds: 1.0 } });
    s.record(Probe { round: 1, planned_seconds: 2.0, outcome: Outcome::Dead { reset: true, at_seconds: 2.0 } });
    for age in [3.0, 5.0, 10.0] {
        s.record(Probe {
            round: 1,
            planned_seconds: age,
            outcome: Outcome::Closed { close: Close::Rst, at_seconds: 2.001 },
        });
    }
    assert_eq!(s.next_round(8), None);
    let f = s.finding();
    assert_eq!((f.how, f.idle_timeout_seconds), (FailureMode::Rst, Some(2.001)));
}

/// A reset that met a probe keeps the longer connections waiting until
/// `RACE` past its age (a hop's own RST close racing the probe shows on
/// them: CI's 6.1 guest, where the probe left 20 ms late and met a 2 s
/// server's reset at 1.951 s, once reported a silent drop); a probe that
/// timed out does not.
#[test]
fn longer_connections_wait_out_a_race_with_a_reset() {
    let mut s = Search::default();
    s.record(Probe { round: 1, planned_seconds: 1.931, outcome: Outcome::Dead { reset: true, at_seconds: 1.951 } });
    assert!(s.worth_waiting(10.0, 2.0) && s.worth_waiting(10.0, 2.4), "inside the race");
    assert!(!s.worth_waiting(10.0, 2.46), "past it");
    assert!(s.worth_waiting(2.683, 2.46), "within reach of a second path");
    let mut t = Search::default();
    t.record(Probe { round: 1, planned_seconds: 1.931, outcome: Outcome::Dead { reset: false, at_seconds: 1.951 } });
    assert!(!t.worth_waiting(10.0, 2.0), "a timed-out probe races no close");
}

proptest! {
    /// Any silent timeout within reach is bracketed (alive below, dead at
    /// or above), narrow, and in a few rounds.
    #[test]
    fn every_silent_timeout_is_bracketed(silent in 2.0f64..900.0, n in 16usize..=64, late in 0.0f64..1.0) {
        let (search, rounds) = run(Some(silent), None, 900.0, n, late);
        let f = search.finding();
        let (lo, hi) = (f.lower_seconds, f.upper_seconds.unwrap());
        prop_assert!(lo < silent && silent <= hi, "[{}, {}] for {}", lo, hi, silent);
        prop_assert!(hi - lo <= 0.2 || hi - lo <= 0.05 * hi, "[{}, {}]", lo, hi);
        prop_assert!(rounds <= 12, "{} rounds", rounds);
    }
}

/// Flows hashed over two paths that drop idle flows silently at `short`
/// and `long` s, `quarters` of 4 on the shorter (a hash of the connection
/// and `seed`); rounds as the command runs them, waiting out the longer
/// connections as `worth_waiting` says.
fn run_two_paths(short: f64, long: f64, quarters: u64, n: usize, seed: u64) -> (Search, u32) {
    let mut search = Search::default();
    let mut ages = first_round(8.0, n);
    let mut round = 0;
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    loop {
        round += 1;
        let mut results = Vec::new();
        for &planned in &ages {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let timeout = if x % 4 < quarters { short } else { long };
            let outcome = if planned >= timeout {
                Outcome::Dead { reset: false, at_seconds: planned }
            } else {
                Outcome::Alive { at_seconds: planned }
            };
            results.push(Probe { round, planned_seconds: planned, outcome });
        }
        // Results in the order they come: alive at once, dead 4 s later.
        results.sort_by(|a, b| {
            let end = |p: &Probe| p.planned_seconds + if matches!(p.outcome, Outcome::Dead { .. }) { 4.0 } else { 0.0 };
            end(a).total_cmp(&end(b))
        });
        for p in results {
            let outcome =
                if search.worth_waiting(p.planned_seconds, p.planned_seconds) { p.outcome } else { Outcome::Cancelled };
            search.record(Probe { outcome, ..p });
        }
        match search.next_round(n) {
            Some(next) => ages = next,
            None => return (search, round),
        }
        assert!(round < 40, "the search does not end");
    }
}

/// Two paths, 2 s and 4 s, a quarter or half of the flows on the shorter:
/// the bracket holds the shorter path's timeout in at least 97 % of 200
/// runs (the design allows 1 %), the recommendation stays below 0.8 x 2 s
/// whenever it does, and the longer path is named.
#[test]
fn two_silent_paths_bracket_the_shorter_and_name_the_longer() {
    for quarters in [1, 2] {
        let (mut held, mut named, mut rounds_max) = (0, 0, 0);
        for seed in 0..200 {
            let (search, rounds) = run_two_paths(2.0, 4.0, quarters, 32, seed);
            let f = search.finding();
            rounds_max = rounds_max.max(rounds);
            assert_eq!(f.how, FailureMode::SilentDrop);
            let (lo, hi) = (f.lower_seconds, f.upper_seconds.unwrap());
            if lo < 2.0 && 2.0 <= hi {
                held += 1;
                assert!(f.recommended_pool_idle_timeout_seconds.is_none_or(|r| r <= 1.6), "{f:?}");
            }
            named += usize::from(f.longer_path.is_some_and(|p| p.lower_seconds >= 2.0 && p.lower_seconds < 4.0));
        }
        eprintln!("{quarters}/4 on the short path: bracket held in {held}/200, longer path named in {named}/200, at most {rounds_max} rounds");
        assert!(held >= 194, "{quarters}/4: the bracket held in {held} of 200 runs");
        assert!(named >= 180, "{quarters}/4: the longer path named in {named} of 200 runs");
        assert!(rounds_max <= 8, "{rounds_max} rounds");
    }
}

use proptest::prelude::*;

use super::{first_round, Close, How, Outcome, Probe, Search};

/// A simulated path: a hop that drops a flow silently once idle for
/// `silent` s, and one that closes it (FIN) at `fin` s; one round of
/// connections as the command runs it (cancelled past a dead age).
fn run(silent: Option<u32>, fin: Option<f64>, up_to: u32, n: usize) -> (Search, u32) {
    let mut search = Search::default();
    let mut ages = first_round(up_to, n);
    let mut round = 0;
    loop {
        round += 1;
        for &age in &ages {
            let fin_first = fin.is_some_and(|f| f <= f64::from(age) && silent.is_none_or(|s| f < f64::from(s)));
            let outcome = if fin_first {
                Outcome::Closed { close: Close::Fin, idle_seconds: fin.unwrap_or_default() }
            } else if silent.is_some_and(|s| age >= s) {
                Outcome::Dead { reset: false }
            } else {
                Outcome::Alive
            };
            search.record(Probe { round, age_seconds: age, outcome });
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
    let ages = first_round(900, 8);
    assert_eq!(ages.len(), 8);
    assert_eq!((ages[0], ages[7]), (1, 900));
    assert!(ages.windows(2).all(|w| w[0] < w[1]), "{ages:?}");
    // Each step is about the same factor (900^(1/7) = 2.64).
    assert!(ages[3] > 10 && ages[3] < 25, "{ages:?}");
    assert_eq!(first_round(3, 8), vec![1, 2, 3]);
    assert_eq!(first_round(60, 1), vec![60]);
}

#[test]
fn a_fin_hop_is_measured_in_one_round() {
    let (search, rounds) = run(None, Some(60.2), 900, 8);
    assert_eq!(rounds, 1);
    let f = search.finding();
    assert_eq!(f.how, How::Fin);
    assert_eq!(f.idle_timeout_seconds, Some(60.2));
    let rec = f.recommended_pool_idle_timeout_seconds.unwrap();
    assert!((rec - 48.16).abs() < 1e-9, "{rec}");
}

#[test]
fn a_silent_drop_at_350_s_is_bracketed_within_5_percent() {
    let (search, rounds) = run(Some(350), None, 900, 8);
    let f = search.finding();
    assert_eq!(f.how, How::SilentDrop);
    let (lo, hi) = (f.lower_seconds, f.upper_seconds.unwrap());
    assert!(lo < 350.0 && 350.0 <= hi, "[{lo}, {hi}]");
    assert!(hi - lo <= 0.05 * hi, "[{lo}, {hi}]");
    assert!(f.settled);
    assert!(rounds <= 3, "{rounds} rounds");
    assert_eq!(f.recommended_pool_idle_timeout_seconds, Some(lo * 0.8));
}

#[test]
fn nothing_closing_within_up_to_is_none() {
    let (search, rounds) = run(None, None, 20, 8);
    assert_eq!(rounds, 1);
    let f = search.finding();
    assert_eq!((f.how, f.lower_seconds, f.upper_seconds), (How::None, 20.0, None));
    assert_eq!(f.recommended_pool_idle_timeout_seconds, None);
}

#[test]
fn a_silent_drop_before_a_fin_hop_is_the_effective_timeout() {
    let (search, _) = run(Some(30), Some(60.0), 900, 8);
    let f = search.finding();
    assert_eq!(f.how, How::SilentDrop);
    assert!(f.lower_seconds < 30.0 && f.upper_seconds.unwrap() >= 30.0, "{f:?}");
}

#[test]
fn an_alive_flow_above_a_dead_age_is_a_contradiction_not_the_bracket() {
    let mut s = Search::default();
    for (age, outcome) in [(5, Outcome::Alive), (10, Outcome::Dead { reset: false }), (20, Outcome::Alive)] {
        s.record(Probe { round: 1, age_seconds: age, outcome });
    }
    let f = s.finding();
    assert_eq!((f.lower_seconds, f.upper_seconds, f.contradictions), (5.0, Some(10.0), 1));
    assert!(!s.worth_waiting(10) && s.worth_waiting(9));
    let next = s.next_round(8).unwrap();
    assert_eq!(next, vec![6, 7, 8, 9]);
}

proptest! {
    /// Any silent timeout within reach is bracketed (alive below, dead at
    /// or above), narrow, and in a few rounds.
    #[test]
    fn every_silent_timeout_is_bracketed(silent in 2u32..900, n in 2usize..16) {
        let (search, rounds) = run(Some(silent), None, 900, n);
        let f = search.finding();
        let (lo, hi) = (f.lower_seconds, f.upper_seconds.unwrap());
        prop_assert!(lo < f64::from(silent) && f64::from(silent) <= hi, "[{}, {}] for {}", lo, hi, silent);
        prop_assert!(hi - lo <= 1.0 || hi - lo <= 0.05 * hi);
        prop_assert!(rounds <= 8, "{} rounds", rounds);
    }
}

/// A probe sent at 2 s meets the RST a hop sends at 2.001 s: that is the
/// hop's close, not a flow forgotten before 2 s.
#[test]
fn a_probe_racing_a_hops_reset_is_the_reset() {
    let mut s = Search::default();
    s.record(Probe { round: 1, age_seconds: 1, outcome: Outcome::Alive });
    s.record(Probe { round: 1, age_seconds: 2, outcome: Outcome::Dead { reset: true } });
    for age in [3, 5, 10] {
        s.record(Probe {
            round: 1,
            age_seconds: age,
            outcome: Outcome::Closed { close: Close::Rst, idle_seconds: 2.001 },
        });
    }
    assert_eq!(s.next_round(8), None);
    let f = s.finding();
    assert_eq!((f.how, f.idle_timeout_seconds), (How::Rst, Some(2.001)));
}

use super::*;

fn interval(lower: Option<f64>, upper: Option<f64>) -> Interval {
    Interval { lower, upper, lower_evidence: 1, upper_evidence: 1, outliers: 0, spread: None, paths: None }
}

#[test]
fn failures_alone_give_mismatch_without_a_number() {
    let j = judge_client(&ClientFindings {
        interval: interval(None, Some(3.0)),
        consistent_failures: 4,
        failure_mode: Some(FailureMode::Rst),
        ..ClientFindings::default()
    });
    assert_eq!((j.verdict, j.evidence), (Verdict::Mismatch, Some(VerdictEvidence::Failures)));
    assert_eq!(j.recommended_pool_idle_timeout_seconds, None);
    assert!(j.recommendation.contains("no safe number"), "{}", j.recommendation);
}

#[test]
fn peer_closes_diagnose_before_the_first_failure() {
    let j = judge_client(&ClientFindings {
        interval: interval(Some(1.5), Some(2.0)),
        point: Some(2.0),
        point_evidence: 3,
        paths: 1,
        ..ClientFindings::default()
    });
    assert_eq!((j.verdict, j.evidence), (Verdict::Mismatch, Some(VerdictEvidence::PeerCloses)));
    assert_eq!(j.recommended_pool_idle_timeout_seconds, Some(1.6));
}

#[test]
fn an_outlier_failure_keeps_ok() {
    let j = judge_client(&ClientFindings {
        interval: Interval {
            lower: Some(30.0),
            upper: None,
            lower_evidence: 50,
            upper_evidence: 0,
            outliers: 1,
            spread: None,
            paths: None,
        },
        lower_basis: Some(LowerBasis::Silent),
        pool: Some(20.0),
        consistent_failures: 0,
        failure_mode: Some(FailureMode::Rst),
        ..ClientFindings::default()
    });
    assert_eq!(j.verdict, Verdict::Ok);
}

#[test]
fn a_pool_between_the_bounds_is_not_proven_ok() {
    let j = judge_client(&ClientFindings {
        interval: interval(Some(5.0), Some(10.0)),
        pool: Some(8.0),
        ..ClientFindings::default()
    });
    assert_eq!(j.verdict, Verdict::Unknown);
}

#[test]
fn keepalive_bounds_say_so() {
    let j = judge_client(&ClientFindings {
        interval: interval(Some(40.0), Some(90.0)),
        lower_basis: Some(LowerBasis::Keepalive),
        ..ClientFindings::default()
    });
    assert_eq!(j.recommended_pool_idle_timeout_seconds, Some(32.0));
    assert!(j.recommendation.contains("keep-alive"), "{}", j.recommendation);
}

#[test]
fn no_timeout_seen_gives_no_number() {
    // Survivals only (say, a connection pinged every second): nothing on
    // the path has closed or failed an idle connection, so 0.8 x the
    // largest survival would shorten the pool for nothing.
    for basis in [Some(LowerBasis::Silent), Some(LowerBasis::Keepalive)] {
        let j = judge_client(&ClientFindings {
            interval: interval(Some(1.0), None),
            lower_basis: basis,
            ..ClientFindings::default()
        });
        assert_eq!(j.verdict, Verdict::Unknown);
        assert_eq!(j.recommended_pool_idle_timeout_seconds, None);
        assert!(j.recommendation.starts_with("none: no idle timeout has shown"), "{}", j.recommendation);
        assert!(j.recommendation.contains("1.000 s"), "{}", j.recommendation);
    }
    // A pool idle close is a timeout: the number comes back.
    let j = judge_client(&ClientFindings {
        interval: interval(Some(10.0), None),
        pool: Some(30.0),
        ..ClientFindings::default()
    });
    assert_eq!(j.recommended_pool_idle_timeout_seconds, Some(8.0));
}

#[test]
fn the_number_never_exceeds_0_8_x_the_earliest_proven_death() {
    // A swept timeout's point past its earliest close (pgbouncer: interval
    // [3.020, 3.050], point 3.120 before).
    let j = judge_client(&ClientFindings {
        interval: interval(Some(3.02), Some(3.05)),
        point: Some(3.12),
        point_evidence: 3,
        consistent_failures: 6,
        ..ClientFindings::default()
    });
    assert_eq!(j.recommended_pool_idle_timeout_seconds, Some(2.44));
    assert!(j.recommendation.contains("3.050 s"), "{}", j.recommendation);
}

#[test]
fn servers_are_never_told_to_lower_their_idle_timeout() {
    let j = judge_server(&ServerFindings {
        server_idle_timeout: Some(2.0),
        late_reuse_idles: vec![2.0, 2.001],
        client_max_reuse_idle: Some(3.0),
        client_pool_idle_timeout: None,
    });
    assert_eq!((j.verdict, j.evidence), (Verdict::ClientsMismatch, Some(VerdictEvidence::LateReuses)));
    assert_eq!(j.recommended_pool_idle_timeout_seconds, Some(1.6));
    assert_eq!(j.recommended_server_idle_timeout_seconds, Some(3.75));
    assert!(!j.recommendation.contains("lower our"), "{}", j.recommendation);
    assert!(j.recommendation.starts_with("clients:"), "{}", j.recommendation);
}

#[test]
fn clients_closing_first_is_ok() {
    let j = judge_server(&ServerFindings {
        server_idle_timeout: Some(75.0),
        late_reuse_idles: vec![],
        client_max_reuse_idle: Some(20.0),
        client_pool_idle_timeout: Some(30.0),
    });
    assert_eq!(j.verdict, Verdict::Ok);
}

#[test]
fn never_ok_while_reuses_fail_below_the_pool_timeout() {
    // Survivals up to 3 s prove a pool of 2.5 s below the path's cut, but
    // a reuse failed at 2 s idle: the pool does not close first there.
    let f = ClientFindings {
        interval: interval(Some(3.0), Some(4.0)),
        pool: Some(2.5),
        earliest_failed_reuse: Some(2.0),
        ..ClientFindings::default()
    };
    assert_eq!(judge_client(&f).verdict, Verdict::Unknown);
    let f = ClientFindings { earliest_failed_reuse: Some(3.5), ..f };
    assert_eq!(judge_client(&f).verdict, Verdict::Ok);
}

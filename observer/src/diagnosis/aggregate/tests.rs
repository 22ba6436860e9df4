#![allow(clippy::float_cmp, reason = "expected values are exact copies of the inputs")]
use std::sync::atomic::{AtomicU64, Ordering};

use super::*;
use crate::kernel::{
    event::{EventKind, How, Outcome},
    first_bytes::Protocol,
    runtime::ClientRuntime,
};

static SOCK: AtomicU64 = AtomicU64::new(1);

const S: u64 = 1_000_000_000;

fn ev(ts_s: f64, kind: EventKind, remote: &str, idle: f64) -> SockEvent {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "test times are small and positive")]
    let ts = (ts_s * 1e9) as u64 + 1_700_000_000 * S;
    let mut e = SockEvent::client_test(ts, kind, remote, idle);
    e.pid = 7;
    e.comm = "client".into();
    e.sock_id = SOCK.fetch_add(1, Ordering::Relaxed);
    e
}

fn reuse(ts: f64, remote: &str, idle: f64, outcome: Outcome) -> SockEvent {
    let mut e = ev(ts, EventKind::Reuse, remote, idle);
    e.reuse_mut().outcome = outcome;
    e.set_elapsed(0.001);
    e
}

fn peer_close(ts: f64, remote: &str, idle: f64) -> SockEvent {
    let mut e = ev(ts, EventKind::PeerCloseWhileIdle, remote, idle);
    e.set_how(Some(How::Fin));
    e
}

fn table(agg: &mut Aggregator) -> Vec<DestinationRow> {
    agg.finish();
    let now = agg.latest_ns();
    agg.rows(now)
}

fn row<'a>(rows: &'a [DestinationRow], d: &str) -> &'a DestinationRow {
    rows.iter().find(|r| r.id.destination == d).unwrap()
}

/// Reuse outcome after `gap` for a path with timeout `t` and mode `o`.
fn feed(agg: &mut Aggregator, ts: &mut f64, remote: &str, t: f64, gaps: &[f64], fail: Outcome) {
    for &g in gaps {
        *ts += g;
        agg.ingest(&reuse(*ts, remote, g, if g < t { Outcome::Ok } else { fail }));
    }
}

#[test]
fn mismatch_with_recommendation() {
    let mut agg = Aggregator::new(Config::default());
    let mut ts = 0.0;
    let gaps: Vec<f64> = (0..20).map(|k| 30.0 + f64::from(k) * 3.0).collect(); // 30..87 s
    feed(&mut agg, &mut ts, "10.0.0.2:443", 60.0, &gaps, Outcome::Reset);
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.2:443");
    assert_eq!(r.judgement.verdict, Verdict::Mismatch);
    assert_eq!(r.failure_mode, FailureMode::Rst);
    assert_eq!(r.path.lower_seconds, 57.0);
    assert_eq!(r.path.upper_seconds, Some(60.0));
    assert_eq!(r.judgement.recommended_pool_idle_timeout_seconds, Some(45.6));
    assert!(r.judgement.safe_retry_rule);
    assert_eq!((r.counts.reuses, r.counts.failures), (20, 10));
    assert_eq!(r.processes, vec!["client".to_owned()]);
    let b60 = r.idle_buckets.iter().find(|b| b.le == Some(60.0)).unwrap();
    let b75 = r.idle_buckets.iter().find(|b| b.le == Some(75.0)).unwrap();
    assert_eq!((b60.reuses, b60.failures), (5, 1), "(45, 60]: only the reuse at exactly 60 s fails");
    assert_eq!((b75.reuses, b75.failures), (5, 5), "above it everything fails");
}

#[test]
fn peer_close_cluster_gives_point_and_fin_mode() {
    let mut agg = Aggregator::new(Config::default());
    for (k, idle) in [60.01, 60.2, 59.98, 60.05].iter().enumerate() {
        agg.ingest(&peer_close(f64::from(u8::try_from(k).unwrap()) * 100.0, "[fd00::1]:80", *idle));
    }
    let rows = table(&mut agg);
    let r = row(&rows, "[fd00::1]:80");
    // The closes' median is 60.03, but the close at 59.98 proves the
    // timeout at most that: the point is printed inside its interval.
    assert_eq!(r.path.idle_timeout_seconds, Some(59.98));
    assert_eq!(r.path.point_evidence, 4);
    assert_eq!(r.failure_mode, FailureMode::Fin);
    assert_eq!(r.path.upper_seconds, Some(59.98));
    assert_eq!(r.judgement.recommended_pool_idle_timeout_seconds, Some(47.984));
    assert_eq!(
        (r.judgement.verdict, r.judgement.evidence),
        (Verdict::Mismatch, Some(VerdictEvidence::PeerCloses)),
        "the pool kept those sockets idle past the path's timeout: diagnosed before any reuse failed"
    );
    assert_eq!(r.counts.failures_window, 0);
}

#[test]
fn no_failures_is_never_mismatch() {
    let mut agg = Aggregator::new(Config::default());
    let mut ts = 0.0;
    feed(&mut agg, &mut ts, "10.0.0.3:5432", f64::INFINITY, &[1.0, 5.0, 10.0], Outcome::Reset);
    let rows = table(&mut agg);
    assert_eq!(row(&rows, "10.0.0.3:5432").judgement.verdict, Verdict::Unknown);
    // The pool's own idle closes at 8 s, below the 10 s proven alive: ok.
    for k in 0..3 {
        let e = ev(100.0 + f64::from(k), EventKind::LocalClose, "10.0.0.3:5432", 8.0 + f64::from(k) * 0.01);
        agg.ingest(&e);
    }
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.3:5432");
    assert_eq!(r.pool.idle_timeout_seconds, Some(8.01));
    assert_eq!(r.judgement.verdict, Verdict::Ok);
}

#[test]
fn one_stray_reset_is_an_outlier() {
    let mut agg = Aggregator::new(Config::default());
    let mut ts = 0.0;
    let gaps: Vec<f64> = (0..20).map(|k| 30.0 + f64::from(k) * 3.0).collect();
    feed(&mut agg, &mut ts, "10.0.0.2:443", 60.0, &gaps, Outcome::Reset);
    agg.ingest(&reuse(ts + 10.0, "10.0.0.2:443", 4.0, Outcome::Reset));
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.2:443");
    assert_eq!((r.path.lower_seconds, r.path.upper_seconds), (57.0, Some(60.0)));
    assert_eq!(r.path.outliers, 1);
    assert!(r.last_change.is_none());
}

#[test]
fn a_timeout_change_is_followed_within_a_few_failures() {
    let mut agg = Aggregator::new(Config::default());
    let mut ts = 0.0;
    let gaps: Vec<f64> = (0..40).map(|k| 30.0 + f64::from(k % 20) * 3.0).collect();
    feed(&mut agg, &mut ts, "10.0.0.2:443", 60.0, &gaps, Outcome::Reset);
    assert!(agg.take_changes().is_empty());
    // The balancer's idle timeout is lowered to 40 s.
    let new_gaps = [45.0, 50.0, 42.0, 35.0, 38.0, 55.0];
    feed(&mut agg, &mut ts, "10.0.0.2:443", 40.0, &new_gaps, Outcome::Reset);
    let changes = agg.take_changes();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0].before_upper_seconds, Some(60.0));
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.2:443");
    assert_eq!(r.path.upper_seconds, Some(42.0));
    assert_eq!(r.path.lower_seconds, 38.0);
    assert!(r.last_change.is_some());
}

/// A swept timeout seen early: one survival at 2.38 s and one failure at
/// 2.53 s, then three failures at 2.03 to 2.2 s. One survival does not
/// outvote three deaths: no change of timeout, and the interval moves.
#[test]
fn one_early_survival_is_no_timeout_to_change_from() {
    let d = "10.0.0.2:9050";
    // Survivals at `alive`, a failure at 2.53 s, then three failures at
    // 2.03 to 2.2 s, 3 s apart.
    let run = |alive: &[f64]| {
        let mut agg = Aggregator::new(Config::default());
        let mut ts = 0.0;
        for &g in alive {
            ts += g;
            agg.ingest(&reuse(ts, d, g, Outcome::Ok));
        }
        ts += 2.53;
        agg.ingest(&reuse(ts, d, 2.53, Outcome::Eof));
        for g in [2.03, 2.1, 2.2] {
            ts += 3.0;
            agg.ingest(&reuse(ts, d, g, Outcome::Eof));
        }
        agg
    };
    let mut agg = run(&[1.0, 1.3, 1.6, 1.9, 2.38]);
    assert!(agg.take_changes().is_empty(), "one survival at 2.38 s is no established timeout");
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert!(r.last_change.is_none());
    assert_eq!(r.path.outliers, 1, "the survival at 2.38 s is the outlier: {r:#?}");
    // The same three deaths against three survivals past them are a change.
    assert_eq!(run(&[1.0, 1.3, 1.6, 2.3, 2.35, 2.38]).take_changes().len(), 1);
}

#[test]
fn cardinality_is_capped() {
    let mut agg = Aggregator::new(Config { max_destinations: 1000, ..Config::default() });
    for k in 0..1200u32 {
        let remote = format!("10.{}.{}.1:443", k / 250, k % 250);
        agg.ingest(&reuse(f64::from(k), &remote, 2.0, Outcome::Ok));
    }
    let rows = table(&mut agg);
    assert_eq!(rows.len(), 1001);
    let other = row(&rows, "other");
    assert_eq!(other.counts.reuses_window, 200);
}

#[test]
fn window_and_last_hour() {
    let mut agg = Aggregator::new(Config { window_ns: 2 * HOUR_NS, ..Config::default() });
    agg.ingest(&reuse(0.0, "10.0.0.2:443", 70.0, Outcome::Reset));
    agg.ingest(&reuse(5400.0, "10.0.0.2:443", 30.0, Outcome::Ok));
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.2:443");
    assert_eq!((r.counts.reuses, r.counts.failures, r.counts.reuses_window), (1, 0, 2));
    agg.ingest(&reuse(9000.0, "10.0.0.2:443", 20.0, Outcome::Ok));
    let rows = table(&mut agg);
    assert_eq!(row(&rows, "10.0.0.2:443").counts.failures_window, 0, "the 0 s failure left the 2 h window");
}

/// An idle client socket to `remote`, as the socket table gives it.
fn view(idle: f64, remote: &str) -> SocketView {
    SocketView {
        id: 1,
        local: "10.0.0.1:40001".parse().unwrap(),
        remote: remote.parse().unwrap(),
        role: Role::Client,
        idle_seconds: idle,
        netns: 0,
        cgroup_id: 0,
    }
}

#[test]
fn at_risk_counts_idle_sockets_past_the_timeout() {
    let mut agg = Aggregator::new(Config::default());
    let mut ts = 0.0;
    feed(&mut agg, &mut ts, "10.0.0.2:443", 60.0, &[50.0, 58.0, 62.0, 70.0], Outcome::Eof);
    agg.set_sockets(&[
        view(10.0, "10.0.0.2:443"),
        view(59.0, "10.0.0.2:443"),
        view(300.0, "10.0.0.2:443"),
        view(900.0, "10.0.0.9:1"),
    ]);
    let rows = table(&mut agg);
    assert_eq!(row(&rows, "10.0.0.2:443").sockets.at_risk_idle_sockets, 2);
}

/// The daemon keeps only sockets idler than the floor: the smallest
/// threshold, so dropping the others changes no count.
#[test]
fn at_risk_floor_is_the_smallest_threshold() {
    let mut agg = Aggregator::new(Config::default());
    assert_eq!(agg.at_risk_floor(), None, "no evidence, no threshold");
    let mut ts = 0.0;
    feed(&mut agg, &mut ts, "10.0.0.2:443", 60.0, &[50.0, 58.0, 62.0, 70.0], Outcome::Eof);
    feed(&mut agg, &mut ts, "10.0.0.3:443", 5.0, &[3.0, 4.0, 6.0, 7.0], Outcome::Eof);
    feed(&mut agg, &mut ts, "10.0.0.4:443", 5.0, &[1.0, 2.0], Outcome::Ok);
    let floor = agg.at_risk_floor().expect("two destinations have a threshold");
    // Without a point estimate a threshold is the largest idle age proven
    // to survive: 58 s and 4 s here.
    assert_eq!(floor, 4.0);
    let all: Vec<SocketView> = [1.0, 4.0, 5.5, 30.0, 59.0, 61.0, 300.0]
        .iter()
        .flat_map(|&idle| ["10.0.0.2:443", "10.0.0.3:443", "10.0.0.4:443"].map(|d| view(idle, d)))
        .collect();
    agg.set_sockets(&all);
    let counts =
        |agg: &mut Aggregator| -> Vec<u64> { table(agg).iter().map(|r| r.sockets.at_risk_idle_sockets).collect() };
    let full = counts(&mut agg);
    assert_eq!(full, vec![3, 5, 0], "past 58 s; past 4 s; no failure, no threshold");
    let kept: Vec<SocketView> = all.iter().filter(|v| v.idle_seconds > floor).copied().collect();
    assert!(kept.len() < all.len());
    agg.set_sockets(&kept);
    assert_eq!(counts(&mut agg), full);
}

#[test]
fn unknown_roles_never_become_destinations() {
    let mut agg = Aggregator::new(Config::default());
    let mut e = reuse(1.0, "10.0.0.2:51000", 3.0, Outcome::Ok);
    e.role = Role::Unknown;
    agg.ingest(&e);
    assert!(table(&mut agg).is_empty());
}

fn at_sock(mut e: SockEvent, sock: u64) -> SockEvent {
    e.sock_id = sock;
    e
}

#[test]
fn a_failure_burst_survives_ten_thousand_successes() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.5:80";
    let mut ts = 0.0;
    feed(&mut agg, &mut ts, d, 3.0, &[1.0, 2.0, 2.5, 2.9, 3.1, 3.5, 4.0, 5.0, 3.2, 3.3, 6.0, 2.8], Outcome::Eof);
    let before = table(&mut agg).remove(0);
    assert_eq!(before.judgement.verdict, Verdict::Mismatch);
    for k in 0..10_000 {
        ts += 0.01;
        agg.ingest(&reuse(ts, d, 1.0 + f64::from(k % 10) * 0.1, Outcome::Ok));
    }
    let after = table(&mut agg).remove(0);
    assert_eq!(
        (after.path.lower_seconds, after.path.upper_seconds),
        (before.path.lower_seconds, before.path.upper_seconds)
    );
    assert_eq!((after.judgement.verdict, after.counts.failures_window), (Verdict::Mismatch, 7));
    assert_eq!(after.counts.reuses_window, 10_012);
    assert!(after.evidence_bytes <= crate::diagnosis::evidence::MAX_BYTES, "{}", after.evidence_bytes);
}

#[test]
fn a_stray_reset_is_an_outlier_and_withholds_ok_below_the_pool_timeout() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.6:5432";
    let mut ts = 0.0;
    feed(&mut agg, &mut ts, d, f64::INFINITY, &[5.0, 10.0, 20.0, 30.0, 40.0], Outcome::Reset);
    for k in 0..3 {
        let e = ev(100.0 + f64::from(k), EventKind::LocalClose, d, 15.0 + f64::from(k) * 0.01);
        agg.ingest(&e);
    }
    assert_eq!(row(&table(&mut agg), d).judgement.verdict, Verdict::Ok);
    // A stray reset at 16 s idle (past the pool's 15 s) leaves `ok`.
    agg.ingest(&reuse(150.0, d, 16.0, Outcome::Reset));
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!((r.judgement.verdict, r.path.outliers, r.counts.failures_window), (Verdict::Ok, 1, 1));
    // One at 2 s idle (below it) is no mismatch, but no `ok` either.
    agg.ingest(&reuse(200.0, d, 2.0, Outcome::Reset));
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!((r.judgement.verdict, r.path.outliers, r.counts.failures_window), (Verdict::Unknown, 2, 2));
}

#[test]
fn a_peer_restart_is_no_timeout_evidence() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.7:8080";
    let mut ts = 0.0;
    // The path's timeout is 60 s and well measured.
    let gaps: Vec<f64> = (0..20).map(|k| 30.0 + f64::from(k) * 3.0).collect();
    feed(&mut agg, &mut ts, d, 60.0, &gaps, Outcome::Reset);
    let before = table(&mut agg).remove(0);
    // A restart: 20 idle sockets closed within 0.4 s at ages 1..20 s.
    let r0 = ts + 100.0;
    for k in 0..20u32 {
        agg.ingest(&at_sock(peer_close(r0 + f64::from(k) * 0.02, d, 1.0 + f64::from(k)), 1000 + u64::from(k)));
    }
    // The pool then reuses sockets that were idle across it: they fail.
    for k in 0..5u32 {
        agg.ingest(&at_sock(reuse(r0 + 5.0 + f64::from(k), d, 20.0 + f64::from(k), Outcome::Eof), 2000 + u64::from(k)));
    }
    // Later evidence as before.
    feed(&mut agg, &mut ts.clone(), d, 60.0, &[], Outcome::Reset);
    let restarts = agg.take_restarts();
    assert_eq!(restarts.len(), 1, "{restarts:?}");
    assert_eq!(restarts[0].sockets, 20);
    let after = table(&mut agg).remove(0);
    assert!(agg.take_changes().is_empty(), "a restart is no change of timeout");
    assert_eq!(after.counts.peer_restarts, 1);
    assert_eq!(after.counts.restart_failures, 5);
    assert_eq!(after.path.idle_timeout_seconds, None, "no point estimate from a restart");
    assert_eq!(
        (after.path.lower_seconds, after.path.upper_seconds),
        (before.path.lower_seconds, before.path.upper_seconds)
    );
    assert_eq!(
        after.judgement.recommended_pool_idle_timeout_seconds,
        before.judgement.recommended_pool_idle_timeout_seconds
    );
}

/// Events held upstream while their owner is looked for: a tick in the
/// meantime must not judge a restart's first closes alone (they would be
/// timeout evidence); the held closes join them once they come.
#[test]
fn a_restart_split_by_a_wait_upstream_is_still_one_restart() {
    let d = "10.0.0.7:8080";
    let closes = |agg: &mut Aggregator, range: std::ops::Range<u32>| {
        for k in range {
            agg.ingest(&at_sock(peer_close(100.0 + f64::from(k) * 0.02, d, 1.0 + f64::from(k)), 1000 + u64::from(k)));
        }
    };
    let t0 = 1_700_000_000 * S;
    let later = t0 + 130 * S;
    for waiting in [false, true] {
        let mut agg = Aggregator::new(Config::default());
        closes(&mut agg, 0..10);
        if waiting {
            // The eleventh close waits upstream (its time, 100.2 s).
            agg.set_waiting(Some(t0 + 100 * S + 200_000_000));
        }
        agg.tick(later);
        let early = agg.take_restarts();
        closes(&mut agg, 10..20);
        agg.set_waiting(None);
        agg.tick(later);
        let all: Vec<usize> = early.iter().chain(agg.take_restarts().iter()).map(|r| r.sockets).collect();
        if waiting {
            assert!(early.is_empty(), "nothing judged while a close waits: {early:?}");
            assert_eq!(all, vec![20], "one restart of all 20 closes");
        } else {
            assert_ne!(all, vec![20], "the premise: judged in between, the restart is split");
        }
    }
}

#[test]
fn a_shared_idle_timeout_is_no_restart() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.8:80";
    // Eight sockets that went idle together, closed together at 5 s.
    for k in 0..8u32 {
        agg.ingest(&at_sock(peer_close(10.0 + f64::from(k) * 0.01, d, 5.0 + f64::from(k) * 0.001), 10 + u64::from(k)));
    }
    let rows = table(&mut agg);
    assert!(agg.take_restarts().is_empty());
    assert_eq!(row(&rows, d).path.point_evidence, 8);
}

#[test]
fn rows_expire_with_the_window_and_are_counted() {
    let mut agg = Aggregator::new(Config { window_ns: 60 * S, ..Config::default() });
    agg.ingest(&reuse(0.0, "10.0.0.9:80", 3.0, Outcome::Reset));
    agg.ingest(&reuse(1.0, "10.0.0.9:80", 2.0, Outcome::Ok));
    let now = agg.latest_ns();
    assert_eq!(agg.rows(now).len(), 1);
    assert_eq!(agg.rows(now + 30 * S).len(), 1);
    assert!(agg.rows(now + 200 * S).is_empty());
    assert_eq!(agg.evicted(), 1);
}

#[test]
fn dead_destinations_make_room_before_other() {
    let mut agg = Aggregator::new(Config { window_ns: 60 * S, max_destinations: 10, host_netns: 0 });
    for k in 0..10u32 {
        agg.ingest(&reuse(f64::from(k), &format!("10.1.0.{k}:80"), 2.0, Outcome::Ok));
    }
    // Much later, new destinations arrive: the old ones are gone.
    for k in 0..10u32 {
        agg.ingest(&reuse(1000.0 + f64::from(k), &format!("10.2.0.{k}:80"), 2.0, Outcome::Ok));
    }
    let rows = table(&mut agg);
    assert_eq!(rows.len(), 10);
    assert!(
        rows.iter().all(|r| r.id.destination.starts_with("10.2.")),
        "{:?}",
        rows.iter().map(|r| &r.id.destination).collect::<Vec<_>>()
    );
    assert_eq!(agg.evicted(), 10);
}

fn server_ev(ts: f64, kind: EventKind, idle: f64) -> SockEvent {
    let mut e = ev(ts, kind, "10.0.0.50:51000", idle);
    e.role = Role::Server;
    e.local = "10.0.0.1:8080".parse().unwrap();
    e
}

#[test]
fn the_server_view() {
    let mut agg = Aggregator::new(Config::default());
    for k in 0..4 {
        agg.ingest(&server_ev(f64::from(k) * 10.0, EventKind::LocalClose, 2.0 + f64::from(k) * 0.001));
        let ok = server_ev(f64::from(k) * 10.0 + 1.0, EventKind::Reuse, 1.5);
        agg.ingest(&ok);
    }
    let mut late = server_ev(50.0, EventKind::LateReuse, 2.0);
    late.set_elapsed(1.0);
    agg.ingest(&late);
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.1:8080");
    assert_eq!(r.id.role, Role::Server);
    assert_eq!(r.server.server_idle_timeout_seconds, Some(2.0015));
    assert_eq!(r.server.late_reuses, 1);
    assert_eq!(r.server.client_max_reuse_idle_seconds, Some(3.0));
    assert_eq!(
        (r.judgement.verdict, r.judgement.evidence),
        (Verdict::ClientsMismatch, Some(VerdictEvidence::LateReuses))
    );
    assert_eq!(r.pool.idle_timeout_seconds, None, "our idle closes are no pool timeout");
    assert_eq!(r.judgement.recommended_pool_idle_timeout_seconds, Some(1.601));
    assert_eq!(r.judgement.recommended_server_idle_timeout_seconds, Some(3.75));
}

#[test]
fn observed_deadlines() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.11:80";
    for k in 0..3 {
        let mut a = ev(f64::from(k) * 10.0, EventKind::RequestAborted, d, 0.0);
        a.set_elapsed(3.0 + f64::from(k) * 0.001);
        agg.ingest(&a);
        let mut t = ev(f64::from(k) * 10.0 + 5.0, EventKind::RequestTimeout, d, 0.0);
        t.set_elapsed(2.0 + f64::from(k) * 0.001);
        agg.ingest(&t);
    }
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!(r.deadlines.peer_request_deadline_seconds, Some(3.001));
    assert_eq!(r.deadlines.request_timeout_seconds, Some(2.001));
    assert_eq!((r.deadlines.requests_aborted_window, r.deadlines.request_timeouts_window), (3, 3));
}

#[test]
fn mixed_paths_recommend_from_the_smallest() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.12:80";
    for k in 0..6u32 {
        agg.ingest(&peer_close(f64::from(k) * 20.0, d, 2.0 + f64::from(k) * 0.002));
        agg.ingest(&peer_close(f64::from(k) * 20.0 + 7.0, d, 5.0 + f64::from(k) * 0.002));
    }
    let rows = table(&mut agg);
    let r = row(&rows, d);
    let paths: Vec<f64> = r.path.mixed_paths.iter().map(|p| (p.idle_timeout_seconds * 10.0).round() / 10.0).collect();
    assert_eq!(paths, vec![2.0, 5.0]);
    assert_eq!(r.path.mixed_paths[0].share, 0.5);
    assert_eq!(r.judgement.recommended_pool_idle_timeout_seconds.map(|x| (x * 10.0).round() / 10.0), Some(1.6));
    assert_eq!(r.judgement.verdict, Verdict::Mismatch);
}

#[test]
fn survivals_on_a_longer_backend_do_not_lift_the_smallest_path() {
    // An L4 balancer (4 s) over backends of 2 s and 10 s (the issue's
    // HAProxy case): reuses survive up to 3.8 s on the long backend and
    // fail from 2 s on the short one; the closes cluster at 2.0 and 4.0.
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.14:80";
    let mut ts = 0.0;
    for k in 0..6u32 {
        let j = f64::from(k) * 0.002;
        for (idle, outcome) in
            [(1.0, Outcome::Ok), (1.8, Outcome::Ok), (3.82 - j, Outcome::Ok), (2.5 + j, Outcome::Eof)]
        {
            ts += 10.0;
            agg.ingest(&reuse(ts, d, idle, outcome));
        }
        ts += 10.0;
        agg.ingest(&peer_close(ts, d, 2.0 + j));
        if k % 2 == 0 {
            ts += 10.0;
            agg.ingest(&peer_close(ts, d, 4.0 + j));
        }
    }
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!(r.path.mixed_paths.len(), 2, "{:?}", r.path.mixed_paths);
    assert!(r.path.idle_timeout_seconds.is_some_and(|p| (p - 2.0).abs() < 0.01), "{r:?}");
    assert_eq!(r.path.lower_seconds, 1.8, "survivals past 2.1 s came from the long backend");
    assert!(r.judgement.recommended_pool_idle_timeout_seconds.is_some_and(|x| x <= 1.6), "{r:?}");
    assert_eq!(r.judgement.verdict, Verdict::Mismatch);
}

/// Reuses to `d` with these idle ages, 10 s apart from `start` s.
fn reuses_10s_apart(agg: &mut Aggregator, d: &str, start: f64, idles: &[f64], outcome: Outcome, how: Option<How>) {
    for (k, idle) in idles.iter().enumerate() {
        let mut e = reuse(start + f64::from(u8::try_from(k).unwrap()) * 10.0, d, *idle, outcome);
        e.set_how(how);
        agg.ingest(&e);
    }
}

#[test]
fn failures_after_a_stall_count_but_are_no_evidence() {
    // A gRPC channel kept after its first stall: every later call fails
    // on the dead connection; the first stall dates the death.
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.15:50051";
    reuses_10s_apart(&mut agg, d, 0.0, &[1.0, 2.0, 2.5], Outcome::Ok, None);
    reuses_10s_apart(&mut agg, d, 40.0, &[4.0], Outcome::Stall, Some(How::AppWrite));
    reuses_10s_apart(&mut agg, d, 50.0, &[1.5, 0.5, 2.0], Outcome::Stall, Some(How::AfterStall));
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!((r.counts.reuses, r.counts.failures), (7, 4), "every failed call is counted");
    assert_eq!(r.failure_mode, FailureMode::SilentDrop);
    assert_eq!((r.path.lower_seconds, r.path.upper_seconds), (2.5, Some(4.0)));
    assert_eq!(r.path.upper_evidence, 1, "later failures' idle ages (0.5 s) are no evidence");
    assert_eq!(r.path.outliers, 0);
    assert_eq!(r.judgement.verdict, Verdict::Mismatch);
}

#[test]
fn failures_written_past_a_goodbye_are_counted_apart_and_are_evidence() {
    // A lazy HTTP/2 reader against a server that sends GOAWAY at 2 s and
    // closes a second later: its requests in that second fail.
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.16:8443";
    reuses_10s_apart(&mut agg, d, 0.0, &[1.0, 1.2, 0.8], Outcome::Ok, None);
    reuses_10s_apart(&mut agg, d, 40.0, &[2.5, 2.7, 2.4], Outcome::Eof, Some(How::AfterGoodbye));
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!((r.counts.reuses, r.counts.failures, r.counts.failures_after_goodbye), (6, 3, 3));
    assert_eq!(r.failure_mode, FailureMode::Fin);
    assert_eq!((r.path.lower_seconds, r.path.upper_seconds), (1.2, Some(2.4)));
    assert_eq!(r.judgement.verdict, Verdict::Mismatch);
}

#[test]
fn keepalive_survivals_are_kept_apart() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.13:5432";
    // Probes every 10 s kept these alive through 400 s idle periods.
    for k in 0..5 {
        let mut e = reuse(f64::from(k) * 500.0, d, 400.0, Outcome::Ok);
        e.keepalive = true;
        e.keepalive_idle_seconds = Some(10.0);
        agg.ingest(&e);
    }
    // With the probes' time unknown, nothing is claimed for silent flows.
    let mut other = Aggregator::new(Config::default());
    let mut e = reuse(1.0, d, 400.0, Outcome::Ok);
    e.keepalive = true;
    other.ingest(&e);
    let rows = table(&mut other);
    assert_eq!(row(&rows, d).path.lower_basis, Some(LowerBasis::Keepalive));
    let rows = table(&mut agg);
    let r = row(&rows, d);
    // Each socket's first probe was answered after 10 s without a packet:
    // that much holds for every hop; the 400 s only for proxies.
    assert_eq!((r.path.lower_basis, r.path.lower_seconds), (Some(LowerBasis::Silent), 10.0));
    assert_eq!(r.keepalive.evidence, 5);
    // A silent survival at 30 s becomes the bound the table rests on.
    agg.ingest(&reuse(3000.0, d, 30.0, Outcome::Ok));
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!((r.path.lower_basis, r.path.lower_seconds), (Some(LowerBasis::Silent), 30.0));
}

/// Survivals keep-alive probes kept fresh past a NAT's 2 s, beside
/// unrefreshed flows failing past it, are one path, not two: two paths are
/// told from silent evidence only.
#[test]
fn keepalive_kept_flows_are_no_second_path() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.14:5432";
    let mut ts = 0.0;
    for k in 0..40 {
        let age = 1.0 + 2.5 * ((f64::from(k) * 0.618_034) % 1.0);
        ts += age;
        let mut e = if k % 4 == 0 && age >= 2.0 {
            reuse(ts, d, age, Outcome::TimedOut)
        } else {
            reuse(ts, d, age, Outcome::Ok)
        };
        // The survivals' probes ran (their time unknown: no silent age).
        e.keepalive = e.reuse_mut().outcome == Outcome::Ok;
        agg.ingest(&e);
    }
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!(r.path.lower_basis, Some(LowerBasis::Keepalive), "{r:#?}");
    assert!(r.counts.failures_window >= 3, "{r:#?}");
    assert!(r.path.mixed_paths.is_empty(), "{r:#?}");
}

mod properties {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// A destination that never failed never shows a mismatch, whatever
        /// the pool's reuse ages.
        #[test]
        fn healthy_destinations_show_none(gaps in prop::collection::vec(0.5f64..4000.0, 1..300)) {
            let mut agg = Aggregator::new(Config::default());
            let mut ts = 0.0;
            feed(&mut agg, &mut ts, "10.9.0.1:80", f64::INFINITY, &gaps, Outcome::Reset);
            let rows = table(&mut agg);
            prop_assert_ne!(rows[0].judgement.verdict, Verdict::Mismatch);
            prop_assert_eq!(rows[0].counts.failures_window, 0);
        }

        /// The recommendation never exceeds 0.8 x the true timeout, and the
        /// interval contains it, with a stray reset thrown in.
        #[test]
        fn recommendations_stay_below_the_truth(
            t in 2.0f64..4000.0,
            gaps in prop::collection::vec(0.05f64..3.0, 1..300),
            stray in prop::option::of(0.0f64..0.5),
        ) {
            let gaps: Vec<f64> = gaps.iter().map(|g| g * t).collect();
            let mut agg = Aggregator::new(Config::default());
            let mut ts = 0.0;
            feed(&mut agg, &mut ts, "10.9.0.2:80", t, &gaps, Outcome::Eof);
            if let Some(s) = stray {
                agg.ingest(&reuse(ts + 1.0, "10.9.0.2:80", s * t, Outcome::Reset));
            }
            let rows = table(&mut agg);
            let r = &rows[0];
            if let Some(rec) = r.judgement.recommended_pool_idle_timeout_seconds {
                prop_assert!(rec <= 0.8 * t + 1e-6, "recommended {} for a {} s path", rec, t);
            }
            if gaps.iter().any(|&g| g >= t) {
                prop_assert_eq!(r.judgement.verdict, Verdict::Mismatch);
                // A stray failure below every success-free failure cannot
                // be told apart from the timeout; without one the upper
                // bound holds the truth.
                if stray.is_none() {
                    prop_assert!(r.path.upper_seconds.is_some_and(|u| u >= t));
                }
            }
            prop_assert!(r.path.lower_seconds < t);
        }
    }
}

#[test]
fn a_storm_of_peer_closes_is_judged_early_and_stays_bounded() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.14:80";
    for k in 0..10_000u32 {
        let idle = 1.0 + f64::from(k % 100) * 0.5;
        agg.ingest(&at_sock(peer_close(100.0 + f64::from(k) * 0.00005, d, idle), 50_000 + u64::from(k)));
    }
    let held: usize = agg.dests.values().map(|st| st.pending.len()).max().unwrap_or(0);
    assert!(held <= MAX_PENDING, "{held} closes held");
    let rows = table(&mut agg);
    assert!(agg.take_restarts().len() >= 2, "each full span of spread-out closes is a restart");
    assert_eq!(row(&rows, d).path.point_evidence, 0, "none of it is timeout evidence");
}

#[test]
fn one_address_in_two_namespaces_is_two_rows() {
    let mut agg = Aggregator::new(Config { host_netns: 100, ..Config::default() });
    let mut ts = 0.0;
    let mut send = |agg: &mut Aggregator, netns: u32, idle: f64, outcome: Outcome, who: (&str, Option<&str>)| {
        ts += idle;
        let mut e = reuse(ts, "10.96.0.10:5432", idle, outcome);
        e.netns = netns;
        e.comm = who.0.into();
        e.owner = who.1.map(|c| crate::kernel::owner::Owner {
            container: Some(c.to_owned()),
            ..crate::kernel::owner::Owner::default()
        });
        agg.ingest(&e);
    };
    // The host's pool survives 40 s; a pod's pool (same address, its own
    // namespace and path) fails at 40 s.
    for _ in 0..5 {
        send(&mut agg, 100, 40.0, Outcome::Ok, ("app", None));
        send(&mut agg, 4_026_532_999, 40.0, Outcome::Reset, ("api", Some("c0ffee")));
    }
    let rows = table(&mut agg);
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let host = rows.iter().find(|r| r.id.netns == crate::diagnosis::key::Netns::HOST).unwrap();
    let pod = rows.iter().find(|r| r.id.netns.inode() == Some(4_026_532_999)).unwrap();
    assert_eq!((host.counts.reuses, host.counts.failures), (5, 0));
    assert_eq!((pod.counts.reuses, pod.counts.failures), (5, 5));
    assert_eq!(pod.owners.len(), 1);
    assert_eq!((pod.owners[0].process.as_str(), pod.owners[0].container()), ("api", Some("c0ffee")));
    // The feed names the row an event went to by the same key.
    let mut e = reuse(ts, "10.96.0.10:5432", 1.0, Outcome::Ok);
    e.netns = 4_026_532_999;
    assert_eq!(agg.feed(&e).ingested.unwrap().id.netns.inode(), Some(4_026_532_999));
    assert_eq!(host.owners[0].container(), None);
    assert_eq!(host.processes, vec!["app".to_owned()]);
}

fn dead_view(remote: &str, netns: u32, comm: &str) -> (DoomedView, ProcessOwner) {
    let d = DoomedView {
        sock_id: 0,
        local: "10.0.0.1:40002".parse().unwrap(),
        remote: remote.parse().unwrap(),
        how: How::Rst,
        idle_seconds: 12.0,
        netns,
        pid: 9,
        comm: comm.to_owned(),
        cgroup_id: 0,
    };
    let who = ProcessOwner { process: comm.to_owned(), owner: None };
    (d, who)
}

/// A reuse the kernel failed before sending is a failure like any other at
/// its age, in `rst` mode; a discarded dead socket is counted and is no
/// failure and no timeout evidence.
#[test]
fn failed_before_send_counts_and_discarded_dead_does_not_fail() {
    let mut agg = Aggregator::new(Config::default());
    let mut ts = 0.0;
    for k in 0..4 {
        ts += 3.0;
        agg.ingest(&reuse(ts, "10.0.0.2:5432", 1.0 + f64::from(k) * 0.1, Outcome::Ok));
        ts += 5.0;
        let mut close = peer_close(ts, "10.0.0.2:5432", 2.0);
        close.set_how(Some(How::Rst));
        agg.ingest(&close);
        ts += 3.0;
        let mut failed = reuse(ts, "10.0.0.2:5432", 5.0, Outcome::Reset);
        failed.reuse_mut().failed_before_send = true;
        failed.reuse_mut().safe_to_retry = true;
        agg.ingest(&failed);
    }
    for _ in 0..3 {
        ts += 1.0;
        agg.ingest(&ev(ts, EventKind::DiscardedDead, "10.0.0.2:5432", 4.0));
    }
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.2:5432");
    assert_eq!((r.counts.failures_window, r.counts.reuses_window), (4, 8), "{r:#?}");
    assert_eq!(r.sockets.discarded_dead, 3);
    assert_eq!(r.failure_mode, FailureMode::Rst, "{r:#?}");
    assert_eq!(r.path.idle_timeout_seconds, Some(2.0), "the idle resets measure the timeout: {r:#?}");
    assert!(r.judgement.verdict.is_mismatch(), "{r:#?}");
}

/// A timed-out socket's failed reuse reads as a silent drop.
#[test]
fn timed_out_reuse_is_a_silent_drop() {
    let mut agg = Aggregator::new(Config::default());
    let mut failed = reuse(10.0, "10.0.0.3:80", 8.0, Outcome::TimedOut);
    failed.reuse_mut().failed_before_send = true;
    agg.ingest(&failed);
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.3:80");
    assert_eq!(r.counts.failures_window, 1);
    assert_eq!(r.failure_mode, FailureMode::SilentDrop);
    assert_eq!(r.path.upper_seconds, Some(8.0));
}

/// The doomed view replaces itself: counted into its own row (by
/// namespace), with owners; a destination without a row counts nowhere.
#[test]
fn doomed_sockets_count_in_their_row_and_are_replaced() {
    let mut agg = Aggregator::new(Config { host_netns: 1, ..Config::default() });
    let mut ts = 0.0;
    feed(&mut agg, &mut ts, "10.0.0.2:443", 60.0, &[50.0, 70.0], Outcome::Eof);
    agg.set_doomed(&[
        dead_view("10.0.0.2:443", 1, "api"),
        dead_view("10.0.0.2:443", 1, "api"),
        dead_view("10.0.0.2:443", 1, "worker"),
        dead_view("10.0.0.2:443", 77, "api"),
        dead_view("10.0.0.9:1", 1, "api"),
    ]);
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.2:443");
    assert_eq!(r.sockets.doomed_idle_sockets, 3, "{r:#?}");
    let names: Vec<&str> = r.sockets.doomed_owners.iter().map(|o| o.process.as_str()).collect();
    assert_eq!(names, ["api", "worker"]);
    assert!(rows.iter().all(|r| r.id.destination != "10.0.0.9:1"), "no row is made by the view");
    agg.set_doomed(&[]);
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.2:443");
    assert_eq!((r.sockets.doomed_idle_sockets, r.sockets.doomed_owners.len()), (0, 0));
}

/// A keep-alive death bounds the timeout from above at the first unanswered
/// probe's silent age, and is never a point estimate however many there are.
#[test]
fn keepalive_deaths_bound_the_timeout_but_make_no_point() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.14:7610";
    for k in 0..4 {
        let mut e = ev(f64::from(k) * 10.0, EventKind::PeerCloseWhileIdle, d, 4.0);
        e.set_how(Some(How::Timeout));
        e.keepalive = true;
        e.keepalive_idle_seconds = Some(2.0);
        agg.ingest(&e);
    }
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!(r.path.upper_seconds, Some(2.0), "{r:#?}");
    assert_eq!(r.path.idle_timeout_seconds, None, "no point from deaths found by probes: {r:#?}");
    assert_eq!(r.failure_mode, FailureMode::SilentDrop);
    assert_eq!(r.counts.failures_window, 0, "a death is no failed reuse");
}

/// The 6.12 VM's swept run 4, as evidence: survivals up to 2.0997 s, a
/// failed reuse at 2.1005 s, and 13 peer closes over [2.1, 2.9] with half
/// of them within 5% of 2.59 s. The row is a spread, its point lies in its
/// interval, and no cluster outside the interval is reported as the point.
#[test]
fn a_sweeps_phase_cluster_is_no_point_outside_the_interval() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.2:9050";
    let mut ts = 0.0;
    for g in [1.0, 1.5, 1.8, 2.0, 2.0997] {
        ts += 3.0;
        agg.ingest(&reuse(ts, d, g, Outcome::Ok));
    }
    ts += 3.0;
    agg.ingest(&reuse(ts, d, 2.1005, Outcome::Eof));
    for c in [2.10, 2.2, 2.35, 2.45, 2.57, 2.58, 2.59, 2.59, 2.6, 2.61, 2.62, 2.8, 2.9] {
        ts += 3.0;
        agg.ingest(&peer_close(ts, d, c));
    }
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert!(r.path.spread_seconds.is_some(), "{r:#?}");
    let p = r.path.idle_timeout_seconds.expect("the band's start");
    let upper = r.path.upper_seconds.expect("upper");
    assert!(p >= r.path.lower_seconds && p <= upper, "point {p} outside the interval: {r:#?}");
    assert!(r.last_change.is_none());
}

/// However many contradictions come without opening an epoch, a
/// destination holds a bounded number of them (the oldest, which decide
/// the new epoch's start), and its `evidence_bytes` counts them.
#[test]
fn held_contradictions_are_capped_and_counted() {
    use crate::{
        diagnosis::evidence::{Observation, Observed},
        diagnosis::table::FailureMode,
    };
    let mut st = super::state::DestState::new(Config::default().window_ns);
    let before = crate::diagnosis::estimate::Interval { lower: Some(2.38), upper: Some(2.53), ..Default::default() };
    for k in 0..5_000u64 {
        let death = Observed {
            ts_ns: k * 1_000_000_000,
            sock_id: 7,
            keepalive: false,
            keepalive_idle: 0.0,
            reset: None,
            what: Observation::Reuse {
                idle: 2.0,
                failed: Some(FailureMode::Fin),
                refreshed: false,
                after_stall: false,
                after_goodbye: false,
                ping: false,
            },
        };
        st.note_contradiction(&death, &before);
    }
    assert_eq!(st.contradictions.len(), MAX_CONTRADICTIONS);
    assert_eq!(st.contradictions[0].ts_ns, 0, "the oldest are kept: the epoch would start at the first");
    assert!(st.held_bytes() >= MAX_CONTRADICTIONS * std::mem::size_of::<super::state::Contradiction>());
}

/// The row carries its identity flattened: the JSON keeps `destination`,
/// `role` and `netns` first and at the top level, and a row written before
/// `netns` existed still reads (as the host's).
#[test]
fn row_json_keeps_the_identity_fields_flat() {
    let mut agg = Aggregator::new(Config::default());
    agg.ingest(&reuse(1.0, "10.0.0.2:80", 2.0, Outcome::Ok));
    let r = table(&mut agg).remove(0);
    let text = serde_json::to_string(&r).unwrap();
    assert!(text.starts_with(r#"{"destination":"10.0.0.2:80","role":"client","netns":null,"failure_mode":"#), "{text}");
    let back: DestinationRow = serde_json::from_str(&text).unwrap();
    assert_eq!(back, r);
    let mut v: serde_json::Value = serde_json::from_str(&text).unwrap();
    v.as_object_mut().unwrap().remove("netns");
    let old: DestinationRow = serde_json::from_value(v).unwrap();
    assert_eq!(
        old.id,
        RowId { destination: "10.0.0.2:80".into(), role: Role::Client, netns: crate::diagnosis::key::Netns::HOST }
    );
    let change = crate::diagnosis::table::Change {
        ts_unix_ns: 1,
        id: old.id.clone(),
        before_lower_seconds: None,
        before_upper_seconds: Some(2.0),
        after_lower_seconds: Some(1.0),
        after_upper_seconds: None,
    };
    let text = serde_json::to_string(&change).unwrap();
    assert!(text.starts_with(r#"{"ts_unix_ns":1,"destination":"10.0.0.2:80","role":"client","netns":null,"#), "{text}");
    assert_eq!(serde_json::from_str::<crate::diagnosis::table::Change>(&text).unwrap(), change);
}

fn named(ts: f64, remote: &str, name: &str) -> SockEvent {
    let mut e = ev(ts, EventKind::ServerName, remote, 0.0);
    e.server_name_mut().server_name = Some(name.into());
    e
}

/// Names are counted per row, most used first, at most `MAX_NAMES`; they
/// are no evidence (a named destination without evidence has no row), a
/// name is fresh (stored) only the first time its row sees it, and a name
/// not seen for the window is forgotten.
#[test]
fn names_are_counted_bounded_and_no_evidence() {
    let mut agg = Aggregator::new(Config { window_ns: 100 * S, ..Config::default() });
    assert!(agg.ingest(&named(1.0, "10.0.0.2:443", "api.example")).is_none());
    assert!(agg.take_fresh_name(), "first sighting is fresh");
    agg.ingest(&named(2.0, "10.0.0.2:443", "api.example"));
    assert!(!agg.take_fresh_name(), "a second sighting is not");
    assert!(table(&mut agg).is_empty(), "a name is no evidence");
    for (i, n) in ["b.example", "b.example", "c.example", "d.example", "e.example", "f.example"].iter().enumerate() {
        agg.ingest(&named(3.0 + f64::from(u8::try_from(i).unwrap()), "10.0.0.2:443", n));
    }
    agg.ingest(&named(3.0, "10.0.0.9:443", "other.example"));
    agg.ingest(&reuse(10.0, "10.0.0.2:443", 2.0, Outcome::Ok));
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.2:443");
    let got: Vec<(&str, u64)> = r.server_names.iter().map(|n| (n.name.as_str(), n.connections)).collect();
    assert_eq!(got, vec![("api.example", 2), ("b.example", 2), ("c.example", 1), ("d.example", 1)]);
    assert_eq!(r.server_names_dropped, 2, "e and f did not fit");
    // Past the window without a sighting: forgotten (the reuse at 200 s
    // keeps the row).
    agg.ingest(&reuse(200.0, "10.0.0.2:443", 2.0, Outcome::Ok));
    let rows = table(&mut agg);
    assert!(row(&rows, "10.0.0.2:443").server_names.is_empty());
}

/// The protocols the first bytes showed are kept per row (fresh, so
/// stored, the first time), and the fix speaks the row's protocol: a
/// grpcio client on an h2 row is told gRPC's knob, never urllib3's.
#[test]
fn protocols_name_the_row_and_pick_the_fix() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.16:50051";
    let mut hello = ev(0.0, EventKind::ServerName, d, 0.0);
    hello.server_name_mut().protocol = Some(Protocol::H2);
    agg.ingest(&hello);
    assert!(agg.take_fresh_name(), "a protocol new to its row is stored");
    agg.ingest(&hello);
    assert!(!agg.take_fresh_name(), "and only the first time");
    let grpcio =
        ClientRuntime { runtime: "python".into(), libraries: vec!["grpcio".into()], ..ClientRuntime::default() };
    let mut ts = 1.0;
    for (idle, outcome) in [(1.0, Outcome::Ok), (2.0, Outcome::Ok), (4.0, Outcome::Stall), (4.5, Outcome::Stall)] {
        let mut e = reuse(ts, d, idle, outcome);
        e.reuse_mut().client_runtime = Some(grpcio.clone());
        agg.ingest(&e);
        ts += 10.0;
    }
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!(r.protocols, vec![Protocol::H2]);
    assert_eq!(r.judgement.verdict, Verdict::Mismatch);
    let clients: Vec<&str> = r.fix_settings.iter().map(|f| f.client.as_str()).collect();
    assert_eq!(clients, vec!["gRPC Python (grpcio)"], "{:?}", r.fix_settings);
}

/// An answered reuse of `bytes` request bytes.
fn sized(ts: f64, remote: &str, idle: f64, bytes: u32) -> SockEvent {
    let mut e = reuse(ts, remote, idle, Outcome::Ok);
    e.reuse_mut().bytes = bytes;
    e
}

#[test]
fn a_connection_kept_by_pings_says_so_and_gives_no_number() {
    let (d, plain) = ("10.0.0.9:50051", "10.0.0.11:6379");
    let mut agg = Aggregator::new(Config::default());
    let mut hello = ev(0.0, EventKind::ServerName, d, 0.0);
    hello.server_name_mut().protocol = Some(Protocol::H2);
    agg.ingest(&hello);
    // HTTP/2 PINGs (17 bytes) every second; the calls between them come
    // sooner after a ping than the pings' interval. The same sizes to a
    // destination that does not speak HTTP/2 are small requests.
    let mut ts = 0.0;
    for k in 0..20 {
        ts += 1.0;
        for dest in [d, plain] {
            agg.ingest(&sized(ts, dest, 1.0 + f64::from(k % 3) * 0.001, 17));
            agg.ingest(&sized(ts + 0.4, dest, 0.4, 180));
        }
    }
    let rows = table(&mut agg);
    assert_eq!(row(&rows, plain).path.lower_basis, Some(LowerBasis::Silent), "a small request is no ping");
    let r = row(&rows, d);
    assert_eq!(r.path.lower_basis, Some(LowerBasis::Pings), "{r:#?}");
    assert_eq!(r.judgement.recommended_pool_idle_timeout_seconds, None);
    assert!(
        r.judgement.recommendation.contains("reuses survived up to 1.002 s idle while pinged about every 1.0 s"),
        "{}",
        r.judgement.recommendation
    );
    // A call that survived longer than any ping: the bound is the call's.
    ts += 2.5;
    agg.ingest(&sized(ts, d, 2.5, 180));
    let rows = table(&mut agg);
    assert_eq!(row(&rows, d).path.lower_basis, Some(LowerBasis::Silent));
    // Without a measured size (old recordings, busy exchanges) nothing is
    // taken for a ping.
    let e = "10.0.0.10:50051";
    let mut agg = Aggregator::new(Config::default());
    agg.ingest(&sized(1.0, e, 1.0, 0));
    assert_eq!(row(&table(&mut agg), e).path.lower_basis, Some(LowerBasis::Silent));
}

fn probed(
    ts_s: f64,
    d: &str,
    how: crate::diagnosis::table::FailureMode,
    lower: f64,
    upper: Option<f64>,
) -> ProbeEvidence {
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "test times are small and positive")]
    let ts = (ts_s * 1e9) as u64 + 1_700_000_000 * S;
    ProbeEvidence {
        ts_unix_ns: ts,
        id: RowId { destination: d.to_owned(), role: Role::Client, netns: crate::diagnosis::key::Netns::HOST },
        target: "api.partner.example:443".to_owned(),
        first_exchange: "tls".to_owned(),
        how,
        idle_timeout_seconds: matches!(how, crate::diagnosis::table::FailureMode::Fin).then_some(lower),
        lower_seconds: lower,
        upper_seconds: upper,
        settled: true,
        connections: 8,
        elapsed_seconds: 12.0,
        interrupted: false,
    }
}

#[test]
fn a_probe_alone_makes_a_row_with_its_bracket_but_no_verdict_of_its_own() {
    use crate::diagnosis::table::FailureMode as ProbeHow;
    let mut agg = Aggregator::new(Config::default());
    agg.add_probe(&probed(10.0, "10.0.0.9:443", ProbeHow::Fin, 2.0, Some(2.002)));
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.9:443");
    assert!(r.path.probe_used);
    assert_eq!(r.path.probe.as_ref().map(|p| p.how), Some(ProbeHow::Fin));
    assert_eq!(r.path.lower_basis, Some(LowerBasis::Probe));
    assert_eq!((r.path.lower_seconds, r.path.upper_seconds), (2.0, Some(2.002)));
    // The probe held its connections idle itself: no pool evidence, no
    // peer-close verdict, and no reuse of any application.
    assert_eq!(r.path.idle_timeout_seconds, None);
    assert_eq!(r.judgement.verdict, Verdict::Unknown);
    assert_eq!((r.counts.reuses, r.counts.failures, r.counts.peer_closes_window), (0, 0, 0));
    assert_eq!(r.judgement.recommended_pool_idle_timeout_seconds, Some(1.6));
    assert!(
        r.judgement.recommendation.contains("measured by observer probe: FIN at 2.000 s"),
        "{}",
        r.judgement.recommendation
    );
}

#[test]
fn a_pool_idler_than_the_probed_path_is_a_mismatch_on_its_idle_timeout() {
    use crate::diagnosis::table::FailureMode as ProbeHow;
    let mut agg = Aggregator::new(Config::default());
    for k in 0..5 {
        let e = ev(100.0 + f64::from(k), EventKind::LocalClose, "10.0.0.3:5432", 8.0 + f64::from(k) * 0.01);
        agg.ingest(&e);
    }
    agg.add_probe(&probed(110.0, "10.0.0.3:5432", ProbeHow::SilentDrop, 2.9, Some(3.1)));
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.3:5432");
    assert!(r.pool.idle_timeout_seconds.is_some_and(|p| (8.0..8.05).contains(&p)), "{r:?}");
    assert_eq!(r.judgement.verdict, Verdict::Mismatch);
    assert_eq!(r.judgement.evidence, Some(VerdictEvidence::PoolIdleTimeout));
    assert_eq!(r.judgement.recommended_pool_idle_timeout_seconds, Some(2.32));
    assert!(r.judgement.recommendation.contains("a silent drop in [2.900, 3.100] s"), "{}", r.judgement.recommendation);
}

/// The at-risk view judges by the interval the row shows: a probe's
/// bracket counts a socket idle past it before any reuse failed.
#[test]
fn the_at_risk_view_takes_the_probes_bracket() {
    use crate::diagnosis::table::FailureMode as ProbeHow;
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.3:5432";
    let mut ts = 0.0;
    feed(&mut agg, &mut ts, d, f64::INFINITY, &[1.0, 2.0], Outcome::Reset);
    agg.set_sockets(&[view(10.0, d)]);
    assert_eq!(row(&table(&mut agg), d).sockets.at_risk_idle_sockets, 0, "no timeout known yet");
    agg.add_probe(&probed(ts, d, ProbeHow::SilentDrop, 2.9, Some(3.1)));
    agg.set_sockets(&[view(10.0, d), view(2.5, d)]);
    assert_eq!(row(&table(&mut agg), d).sockets.at_risk_idle_sockets, 1, "idle past the probe's 2.9 s");
}

#[test]
fn a_probe_the_passive_evidence_contradicts_is_shown_not_used() {
    use crate::diagnosis::table::FailureMode as ProbeHow;
    let mut agg = Aggregator::new(Config::default());
    let mut ts = 0.0;
    feed(&mut agg, &mut ts, "10.0.0.2:443", 100.0, &[50.0, 60.0, 70.0], Outcome::Reset);
    agg.add_probe(&probed(ts, "10.0.0.2:443", ProbeHow::Fin, 30.0, Some(30.0)));
    let rows = table(&mut agg);
    let r = row(&rows, "10.0.0.2:443");
    assert!(r.path.probe.is_some());
    assert!(!r.path.probe_used);
    assert_eq!(r.path.lower_seconds, 70.0);
    assert_ne!(r.path.lower_basis, Some(LowerBasis::Probe));
}

#[test]
fn a_probe_leaves_with_the_window_and_an_older_one_never_replaces_a_newer() {
    use crate::diagnosis::table::FailureMode as ProbeHow;
    let config = Config { window_ns: 60 * S, ..Config::default() };
    let mut agg = Aggregator::new(config);
    agg.add_probe(&probed(10.0, "10.0.0.9:443", ProbeHow::Fin, 2.0, Some(2.0)));
    agg.add_probe(&probed(5.0, "10.0.0.9:443", ProbeHow::Fin, 9.0, Some(9.0)));
    let now = agg.latest_ns();
    let rows = agg.rows(now);
    assert_eq!(row(&rows, "10.0.0.9:443").path.probe.as_ref().map(|p| p.lower_seconds), Some(2.0));
    assert!(agg.rows(now + 61 * S).is_empty(), "a probe-only row goes with its probe");
    // One older than the window is not taken at all.
    agg.ingest(&reuse(200.0, "10.0.0.1:80", 1.0, Outcome::Ok));
    agg.add_probe(&probed(100.0, "10.0.0.9:443", ProbeHow::Fin, 2.0, Some(2.0)));
    assert!(agg.rows(agg.latest_ns()).iter().all(|r| r.id.destination != "10.0.0.9:443"));
}

/// The one feed call hands on everything an event did: its evidence, the
/// restart it let the table judge, and nothing twice.
#[test]
fn feed_hands_on_the_evidence_and_the_restart_once() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.7:8080";
    let fed = agg.feed(&reuse(1.0, d, 1.0, Outcome::Ok));
    assert!(fed.ingested.is_some() && fed.stored());
    assert!(fed.restarts.is_empty() && fed.changes.is_empty() && fed.gone.is_empty());
    // 20 idle sockets closed within 0.4 s at ages 1..20 s: a restart, judged
    // by the first event after its span.
    for k in 0..20u32 {
        let fed =
            agg.feed(&at_sock(peer_close(100.0 + f64::from(k) * 0.02, d, 1.0 + f64::from(k)), 1000 + u64::from(k)));
        assert!(fed.restarts.is_empty(), "judged only after its span");
    }
    let fed = agg.feed(&reuse(110.0, d, 1.0, Outcome::Ok));
    assert_eq!(fed.restarts.len(), 1, "{fed:?}");
    assert_eq!(fed.restarts[0].sockets, 20);
    assert!(agg.take_restarts().is_empty(), "handed on once");
    // An event of no destination is no evidence and changes nothing.
    let mut e = ev(111.0, EventKind::Established, d, 0.0);
    e.role = Role::Unknown;
    assert_eq!(agg.feed(&e), Fed::default());
}

/// `flows` reuses of `d` interleaved in time at ages over [1, 5.5] s, a
/// quarter on a path that forgets idle flows silently at 2 s and the rest
/// on one at 4 s, then three local closes at 3 s (the pool's own timeout).
fn two_silent_paths_and_a_pool(agg: &mut Aggregator, d: &str, flows: u32) {
    let mut ts = 0.0;
    for k in 0..flows {
        let age = 1.0 + 4.5 * ((f64::from(k) * 0.618_034) % 1.0);
        let timeout = if k % 4 == 0 { 2.0 } else { 4.0 };
        ts += age;
        agg.ingest(&reuse(ts, d, age, if age < timeout { Outcome::Ok } else { Outcome::TimedOut }));
    }
    for k in 0..3 {
        agg.ingest(&ev(ts + 1.0 + f64::from(k), EventKind::LocalClose, d, 3.0 + f64::from(k) * 0.01));
    }
}

/// Two paths that forget idle flows silently at 2 s and 4 s, a quarter of
/// the flows on the shorter one, reuses interleaved in time at ages over
/// [1, 5.5] s, and a pool whose own idle timeout (3 s) lies between them:
/// both paths in `mixed_paths`, the recommendation from the shorter, the
/// verdict `mismatch` (never `ok`), and no change of timeout.
#[test]
fn two_silent_paths_recommend_for_the_shorter() {
    let d = "10.0.0.8:7400";
    let mut agg = Aggregator::new(Config::default());
    two_silent_paths_and_a_pool(&mut agg, d, 160);
    assert!(agg.take_changes().is_empty(), "the mix is no change of timeout");
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!((r.judgement.verdict, r.failure_mode), (Verdict::Mismatch, FailureMode::SilentDrop), "{r:#?}");
    let upper = r.path.upper_seconds.unwrap();
    assert!(r.path.lower_seconds < 2.0 && (2.0..2.3).contains(&upper), "{r:#?}");
    let rec = r.judgement.recommended_pool_idle_timeout_seconds.unwrap();
    assert!(rec <= 0.8 * 2.0, "recommended {rec}");
    assert_eq!(r.path.mixed_paths.len(), 2, "{r:#?}");
    let (short, long) = (&r.path.mixed_paths[0], &r.path.mixed_paths[1]);
    assert!((short.share - 0.25).abs() < 0.15 && (short.share + long.share - 1.0).abs() < 1e-9, "{r:#?}");
    assert!(long.upper_seconds.is_some_and(|u| (u - 4.0).abs() < 0.2), "{r:#?}");
    assert!(r.judgement.recommendation.contains("shorter of two paths"), "{}", r.judgement.recommendation);
    // A change of timeout looks the same by ages alone: survivals up to
    // 3.9 s, then (after they stopped) failures from 2.1 s. It is a change.
    let d2 = "10.0.0.9:7400";
    let mut ts = 0.0;
    for k in 0..40 {
        let age = 1.0 + 2.9 * f64::from(k % 20) / 19.0;
        ts += age;
        agg.ingest(&reuse(ts, d2, age, Outcome::Ok));
    }
    for age in [2.5, 3.0, 2.1, 3.5, 2.2, 1.5] {
        ts += age;
        agg.ingest(&reuse(ts, d2, age, if age < 2.0 { Outcome::Ok } else { Outcome::TimedOut }));
    }
    assert_eq!(agg.take_changes().len(), 1);
    let rows = table(&mut agg);
    assert!(row(&rows, d2).path.mixed_paths.is_empty(), "{:#?}", row(&rows, d2));
}

/// Two silent paths with too few flows to bound the shorter from below (a
/// quarter of 80; `estimate`'s test of the same mix finds no lower bound):
/// the row keeps the shorter path's upper bound and both paths, gives no
/// number rather than one past the shorter path's failures, and never
/// rests on keep-alive refreshed survivals (there are none). A host run
/// showed [3.840, 3.900] s and 3.072 s advised for paths of 2 s and 4 s.
#[test]
fn two_silent_paths_without_a_lower_bound_keep_the_shorters_upper() {
    let d = "10.0.0.8:7401";
    let mut agg = Aggregator::new(Config::default());
    two_silent_paths_and_a_pool(&mut agg, d, 80);
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!((r.judgement.verdict, r.failure_mode), (Verdict::Mismatch, FailureMode::SilentDrop), "{r:#?}");
    assert_ne!(r.path.lower_basis, Some(LowerBasis::Keepalive), "{r:#?}");
    let upper = r.path.upper_seconds.unwrap();
    assert!(r.path.lower_seconds < 2.0 && (2.0..2.3).contains(&upper), "{r:#?}");
    assert_eq!(r.path.mixed_paths.len(), 2, "{r:#?}");
    assert_eq!(r.judgement.recommended_pool_idle_timeout_seconds, None, "{r:#?}");
    let words = &r.judgement.recommendation;
    assert!(words.contains(&format!("below {upper:.3} s")) && words.contains("shorter of two paths"), "{words}");
}

/// A failed reuse reset by a source read from the wire (`None`: not told).
fn reset_by(ts: f64, remote: &str, idle: f64, ttls: Option<(u8, u8, u8)>) -> SockEvent {
    let mut e = reuse(ts, remote, idle, Outcome::Reset);
    e.reset = ttls.and_then(|(reset, peer, flags)| {
        crate::kernel::event::ResetArrival::of_wire(reset, peer, flags | observer_common::ttl::RESET_SEEN)
    });
    e
}

#[test]
fn resets_are_told_by_who_sent_them_with_the_split() {
    use crate::{diagnosis::table::ResetShare, kernel::event::ResetFrom};
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.2:443";
    // Three from a firewall one hop before the server (TTL 64 against the
    // server's 63), one from the server, one that could not be told.
    for (k, ttls) in
        [Some((64, 63, 0)), Some((63, 63, 0)), Some((64, 63, 0)), None, Some((64, 63, 0))].into_iter().enumerate()
    {
        #[allow(clippy::cast_precision_loss, reason = "small")]
        let ts = 10.0 * (k as f64 + 1.0);
        agg.ingest(&reset_by(ts, d, 5.0, ttls));
    }
    // An ok reuse and a FIN-ended idle close: no reset, no source.
    agg.ingest(&reuse(60.0, d, 1.0, Outcome::Ok));
    agg.ingest(&peer_close(70.0, d, 4.0));
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!((r.resets.from, r.resets.hops_closer), (Some(ResetFrom::Path), Some(1)));
    let share = |from, hops_closer, resets| ResetShare { from, hops_closer, resets };
    assert_eq!(
        r.resets.sources,
        vec![share(Some(ResetFrom::Path), Some(1), 3), share(Some(ResetFrom::Peer), Some(0), 1), share(None, None, 1)]
    );
    let json = serde_json::to_value(r).unwrap();
    assert_eq!(json["reset_from"], "path");
    assert_eq!(json["reset_hops_closer"], 1);
    let words = r.resets_in_words().unwrap();
    assert_eq!(
        words,
        "the resets come from a device 1 hop closer than the server (a firewall, NAT or load balancer on the path), not from the server (3 of 5); also from the server itself (1), a source that could not be told (1)"
    );
}

#[test]
fn resets_never_told_give_no_source() {
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.2:443";
    agg.ingest(&reset_by(10.0, d, 5.0, None));
    agg.ingest(&reset_by(20.0, d, 5.0, Some((60, 62, 0))));
    agg.ingest(&reuse(30.0, "10.0.0.3:443", 5.0, Outcome::Ok));
    let rows = table(&mut agg);
    let r = row(&rows, d);
    assert_eq!((r.resets.from, r.resets.hops_closer), (None, None));
    assert_eq!(r.resets.sources.len(), 1);
    assert_eq!(r.resets.sources[0].resets, 2);
    assert!(r.resets_in_words().unwrap().starts_with("2 reset(s); who sent them could not be told"));
    let quiet = row(&rows, "10.0.0.3:443");
    assert!(quiet.resets.from.is_none() && quiet.resets.sources.is_empty(), "{quiet:?}");
    assert_eq!(quiet.resets_in_words(), None);
}

/// The live test's clients as the daemon sees them: six pooled
/// connections reused after random ages over [1, 5.5] s, each keeping its
/// path (2 s or 4 s, half each, drawn per connection) until a reuse
/// stalls, then a new connection. Over 300 seeded runs the row's interval
/// holds the shorter path's 2 s in all but 1 %, although in some of them
/// the same reuses counted one draw each lift the bound past 2 s (the
/// longer path's connections reused again and again between 2 and 2.6 s:
/// a CI run on the host bounded 2 s below at 2.185 s so).
#[test]
fn pooled_connections_on_two_silent_paths_are_counted_as_flows() {
    let d = "10.0.0.8:7402";
    let (mut missed, mut lifted_by_reuses, mut bounded) = (0, 0, 0);
    for seed in 0..300u64 {
        let mut agg = Aggregator::new(Config::default());
        let (mut alive, mut dead) = (Vec::new(), Vec::new());
        let mut ts = 0.0;
        for (age, ok, conn) in estimate::tests::pooled_reuses(84, 6, 0.5, seed) {
            ts += age;
            let mut e = reuse(ts, d, age, if ok { Outcome::Ok } else { Outcome::TimedOut });
            e.sock_id = 5_000_000 + seed * 1000 + conn;
            agg.ingest(&e);
            if ok {
                alive.push((age, 1));
            } else {
                dead.push(age);
            }
        }
        let per_reuse: Vec<estimate::FlowSurvival> =
            alive.iter().map(|&(a, _)| estimate::FlowSurvival { survived: a, failed: None }).collect();
        if estimate::two_paths(&alive, &dead, &per_reuse).is_some_and(|i| i.lower.is_some_and(|l| l >= 2.0)) {
            lifted_by_reuses += 1;
        }
        let rows = table(&mut agg);
        let r = row(&rows, d);
        if r.path.mixed_paths.len() == 2 {
            let holds = r.path.lower_seconds < 2.0 && r.path.upper_seconds.is_some_and(|u| u >= 2.0);
            missed += usize::from(!holds);
            bounded += usize::from(r.judgement.recommended_pool_idle_timeout_seconds.is_some());
            assert!(
                r.judgement.recommended_pool_idle_timeout_seconds.is_none_or(|rec| rec < 0.8 * 2.0) || !holds,
                "{r:#?}"
            );
        } else {
            missed += usize::from(r.path.lower_seconds >= 2.0);
        }
    }
    eprintln!(
        "MEASURED 300 pooled runs: the row missed 2 s in {missed}, advised a number in {bounded}; counted in reuses the bound passed 2 s in {lifted_by_reuses}"
    );
    assert!(missed <= 3, "missed {missed} of 300");
    assert!(lifted_by_reuses > missed, "reuses {lifted_by_reuses}, rows {missed}");
}

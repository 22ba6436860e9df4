use super::*;
use crate::{
    diagnosis::aggregate::{Aggregator, Config},
    kernel::event::{EventKind, How, Outcome, Role},
};

fn ev(kind: EventKind, idle: f64, outcome: Option<Outcome>, remote: &str) -> SockEvent {
    SockEvent::client_test(1_700_000_000_000_000_000, kind, remote, idle).shaped("curl", outcome)
}

fn feed(m: &Metrics, agg: &mut Aggregator, e: &SockEvent) {
    let ingested = agg.feed(e).ingested;
    m.observe(e, ingested.as_ref());
}

#[test]
fn exposition_lines_for_known_events() {
    let m = Metrics::new(true);
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.2:443";
    feed(&m, &mut agg, &ev(EventKind::Reuse, 30.0, Some(Outcome::Ok), d));
    feed(&m, &mut agg, &ev(EventKind::Reuse, 70.0, Some(Outcome::Reset), d));
    let mut named = ev(EventKind::ServerName, 0.0, None, d);
    named.server_name_mut().server_name = Some("api.partner.example".into());
    feed(&m, &mut agg, &named);
    for idle in [60.0, 60.1, 59.9] {
        feed(&m, &mut agg, &ev(EventKind::PeerCloseWhileIdle, idle, None, d));
    }
    feed(&m, &mut agg, &ev(EventKind::Established, 0.0, None, d));
    m.lost(reason::RING_BUFFER_FULL, 3);
    m.reuses_unresolved(2);
    m.set_tracked_sockets(42);
    agg.finish();
    m.set_estimates(&agg.rows(agg.latest_ns()));
    let text = m.encode();
    for line in [
        "# TYPE observer_reuse_idle_seconds histogram",
        "# HELP observer_events_total Events received from the kernel, by kind.",
        "# TYPE observer_events_total counter",
        r#"observer_reuse_idle_seconds_count{destination="10.0.0.2:443",role="client",outcome="ok"} 1"#,
        r#"observer_reuse_idle_seconds_bucket{le="30.0",destination="10.0.0.2:443",role="client",outcome="ok"} 1"#,
        r#"observer_reuse_idle_seconds_bucket{le="15.0",destination="10.0.0.2:443",role="client",outcome="ok"} 0"#,
        r#"observer_reuse_idle_seconds_bucket{le="75.0",destination="10.0.0.2:443",role="client",outcome="reset",reset_from="unknown"} 1"#,
        r#"observer_reuse_idle_seconds_bucket{le="60.0",destination="10.0.0.2:443",role="client",outcome="reset",reset_from="unknown"} 0"#,
        r#"observer_peer_idle_close_seconds_count{destination="10.0.0.2:443",role="client",how="fin"} 3"#,
        r#"observer_path_idle_timeout_seconds{destination="10.0.0.2:443",role="client",bound="lower"} 30.0"#,
        r#"observer_path_idle_timeout_seconds{destination="10.0.0.2:443",role="client",bound="upper"} 59.9"#,
        r#"observer_path_idle_timeout_seconds{destination="10.0.0.2:443",role="client",bound="point"} 59.9"#,
        r#"observer_recommended_pool_idle_timeout_seconds{destination="10.0.0.2:443",role="client"} 47.92"#,
        r#"observer_mismatch{destination="10.0.0.2:443",role="client",failure_mode="fin"} 1"#,
        r#"observer_at_risk_idle_sockets{destination="10.0.0.2:443",role="client"} 0"#,
        r#"observer_events_total{kind="reuse"} 2"#,
        r#"observer_events_total{kind="peer_close_while_idle"} 3"#,
        r#"observer_events_total{kind="established"} 1"#,
        r#"observer_events_lost_total{reason="ring_buffer_full"} 3"#,
        r#"observer_events_lost_total{reason="socket_storage_full"} 0"#,
        "observer_tracked_sockets 42",
        "observer_reuses_unresolved_total 2",
    ] {
        assert!(text.lines().any(|l| l == line), "missing line {line}\n{text}");
    }
    assert!(!text.contains("observer_pool_idle_timeout_seconds{"), "no pool evidence, no gauge:\n{text}");
    for b in ["1.0", "350.0", "1200.0", "3600.0", "+Inf"] {
        assert!(text.contains(&format!("le=\"{b}\"")), "bucket {b}");
    }
}

#[test]
fn cardinality_cap_holds_with_1200_destinations() {
    let m = Metrics::default();
    let mut agg = Aggregator::new(Config { max_destinations: 1000, ..Config::default() });
    for k in 0..1200u32 {
        let remote = format!("10.{}.{}.1:443", k / 250, k % 250);
        feed(&m, &mut agg, &ev(EventKind::Reuse, 2.0, Some(Outcome::Ok), &remote));
    }
    agg.finish();
    m.set_estimates(&agg.rows(agg.latest_ns()));
    let text = m.encode();
    let dests: std::collections::BTreeSet<&str> = text
        .lines()
        .filter(|l| l.starts_with("observer_reuses_total{"))
        .filter_map(|l| l.split("destination=\"").nth(1)?.split('"').next())
        .collect();
    assert_eq!(dests.len(), 1001, "1000 destinations plus other");
    assert!(dests.contains("other"));
    assert!(text.contains(r#"observer_reuses_total{destination="other",role="client",outcome="ok"} 200"#));
}

#[test]
fn deadlines_server_rows_and_forgetting() {
    let m = Metrics::new(true);
    let mut agg = Aggregator::new(Config { window_ns: 60_000_000_000, ..Config::default() });
    let d = "10.0.0.3:80";
    for k in 0..3u32 {
        let mut a = ev(EventKind::RequestAborted, 0.0, None, d);
        a.set_elapsed(3.0 + f64::from(k) * 0.001);
        feed(&m, &mut agg, &a);
    }
    let mut late = ev(EventKind::LateReuse, 2.0, None, "10.0.0.9:5000");
    late.role = Role::Server;
    late.local = "10.0.0.1:8080".parse().unwrap();
    late.set_elapsed(1.0);
    feed(&m, &mut agg, &late);
    agg.finish();
    m.set_estimates(&agg.rows(agg.latest_ns()));
    let text = m.encode();
    for line in [
        r#"observer_peer_request_deadline_seconds{destination="10.0.0.3:80",role="client"} 3.001"#,
        r#"observer_late_reuses_total{destination="10.0.0.1:8080",role="server"} 1"#,
        r#"observer_client_max_reuse_idle_seconds{destination="10.0.0.1:8080",role="server"} 3.0"#,
        r#"observer_mismatch{destination="10.0.0.1:8080",role="server",failure_mode="none"} 1"#,
        "observer_destinations_evicted_total 0",
    ] {
        assert!(text.lines().any(|l| l == line), "missing line {line}\n{text}");
    }
    // Two minutes later both rows have left the 60 s window.
    let rows = agg.rows(agg.latest_ns() + 120_000_000_000);
    assert!(rows.is_empty());
    m.forget(&agg.take_gone());
    m.set_estimates(&rows);
    let text = m.encode();
    assert!(!text.contains("10.0.0.1:8080"), "{text}");
    assert!(text.lines().any(|l| l == "observer_destinations_evicted_total 2"), "{text}");
}

/// Every exported metric passes `promtool check metrics` (HELP text,
/// naming, units), with every family present.
#[test]
fn promtool_accepts_every_metric() {
    for histograms in [true, false] {
        promtool_accepts(histograms);
    }
}

fn promtool_accepts(histograms: bool) {
    let m = Metrics::new(histograms);
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.2:443";
    feed(&m, &mut agg, &ev(EventKind::Reuse, 70.0, Some(Outcome::Reset), d));
    let mut named = ev(EventKind::ServerName, 0.0, None, d);
    named.server_name_mut().server_name = Some("api.partner.example".into());
    feed(&m, &mut agg, &named);
    for idle in [60.0, 60.1, 59.9] {
        feed(&m, &mut agg, &ev(EventKind::PeerCloseWhileIdle, idle, None, d));
    }
    m.set_build_info("0.1.0", "tp_btf", "6.18.0");
    m.undecodable();
    agg.finish();
    m.set_estimates(&agg.rows(agg.latest_ns()));
    let text = m.encode();
    let child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn();
    let mut child = child.expect("promtool (Debian package `prometheus`; `cargo xtask test` installs it)");
    std::io::Write::write_all(child.stdin.as_mut().unwrap(), text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && said.trim().is_empty(), "promtool check metrics:\n{said}\n{text}");
    for line in [
        "observer_build_info{version=\"0.1.0\",probe_set=\"tp_btf\",kernel=\"6.18.0\"} 1",
        "observer_records_undecodable_total 1",
        "observer_destination_info{destination=\"10.0.0.2:443\",role=\"client\",server_name=\"api.partner.example\"} 1",
    ] {
        assert!(text.lines().any(|l| l == line), "missing {line}\n{text}");
    }
}

#[test]
fn namespaces_label_only_their_own_series() {
    let m = Metrics::default();
    let mut agg = Aggregator::new(Config { host_netns: 7, ..Config::default() });
    let d = "10.0.0.2:443";
    for netns in [7, 4_026_532_001] {
        let mut e = ev(EventKind::Reuse, 30.0, Some(Outcome::Ok), d);
        e.netns = netns;
        feed(&m, &mut agg, &e);
    }
    let text = m.encode();
    assert!(
        text.contains(r#"observer_reuses_total{destination="10.0.0.2:443",role="client",outcome="ok"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(
            r#"observer_reuses_total{destination="10.0.0.2:443",role="client",netns="4026532001",outcome="ok"} 1"#
        ),
        "{text}"
    );
    assert!(!text.contains("netns=\"\""), "{text}");
}

#[test]
fn doomed_and_discarded_dead_are_exported_per_client_row() {
    let m = Metrics::default();
    let mut agg = Aggregator::new(Config::default());
    let d = "10.0.0.2:5432";
    feed(&m, &mut agg, &ev(EventKind::PeerCloseWhileIdle, 2.0, None, d));
    feed(&m, &mut agg, &ev(EventKind::DiscardedDead, 3.0, None, d));
    feed(&m, &mut agg, &ev(EventKind::DiscardedDead, 3.5, None, d));
    let mut failed = ev(EventKind::Reuse, 9.0, Some(Outcome::TimedOut), d);
    failed.reuse_mut().failed_before_send = true;
    feed(&m, &mut agg, &failed);
    let doomed = crate::kernel::event::DoomedView {
        sock_id: 0,
        local: "10.0.0.1:40001".parse().unwrap(),
        remote: d.parse().unwrap(),
        how: How::Fin,
        idle_seconds: 4.0,
        netns: 0,
        pid: 1,
        comm: "api".into(),
        cgroup_id: 0,
    };
    let who = crate::diagnosis::table::ProcessOwner { process: "api".into(), owner: None };
    agg.set_doomed(&[(doomed.clone(), who.clone()), (doomed, who)]);
    agg.finish();
    m.set_estimates(&agg.rows(agg.latest_ns()));
    let text = m.encode();
    for line in [
        "# TYPE observer_doomed_idle_sockets gauge",
        r#"observer_doomed_idle_sockets{destination="10.0.0.2:5432",role="client"} 2"#,
        "# TYPE observer_discarded_dead_total counter",
        r#"observer_discarded_dead_total{destination="10.0.0.2:5432",role="client"} 2"#,
        r#"observer_reuses_total{destination="10.0.0.2:5432",role="client",outcome="timed_out"} 1"#,
    ] {
        assert!(text.contains(line), "missing {line:?} in\n{text}");
    }
    m.forget(&[crate::diagnosis::key::RowId {
        destination: d.into(),
        role: Role::Client,
        netns: crate::diagnosis::key::Netns::HOST,
    }]);
    assert!(!m.encode().contains("observer_discarded_dead_total{"), "forgotten with its row");
}

/// The default exposition is lean: no histogram, a counter per outcome and
/// per peer-close kind, and a client row that failed and saw peer closes
/// costs about a dozen series; `--metrics-histograms` adds the histograms
/// beside the same counters.
#[test]
fn lean_by_default_histograms_on_request() {
    let events = |m: &Metrics, agg: &mut Aggregator| {
        let d = "10.0.0.2:443";
        feed(m, agg, &ev(EventKind::Reuse, 30.0, Some(Outcome::Ok), d));
        feed(m, agg, &ev(EventKind::Reuse, 70.0, Some(Outcome::Reset), d));
        feed(m, agg, &ev(EventKind::Reuse, 75.0, Some(Outcome::Eof), d));
        for idle in [60.0, 60.1, 59.9] {
            feed(m, agg, &ev(EventKind::PeerCloseWhileIdle, idle, None, d));
        }
        feed(m, agg, &ev(EventKind::LocalClose, 20.0, None, d));
        agg.finish();
        m.set_estimates(&agg.rows(agg.latest_ns()));
        m.encode()
    };
    let series =
        |text: &str| text.lines().filter(|l| !l.starts_with('#') && l.contains("destination=\"10.0.0.2:443\"")).count();
    let lean = events(&Metrics::default(), &mut Aggregator::new(Config::default()));
    assert!(!lean.contains("_bucket") && !lean.contains("observer_reuse_idle_seconds"), "{lean}");
    for line in [
        "# TYPE observer_reuses_total counter",
        r#"observer_reuses_total{destination="10.0.0.2:443",role="client",outcome="ok"} 1"#,
        r#"observer_reuses_total{destination="10.0.0.2:443",role="client",outcome="reset",reset_from="unknown"} 1"#,
        r#"observer_reuses_total{destination="10.0.0.2:443",role="client",outcome="eof"} 1"#,
        "# TYPE observer_peer_idle_closes_total counter",
        r#"observer_peer_idle_closes_total{destination="10.0.0.2:443",role="client",how="fin"} 3"#,
    ] {
        assert!(lean.lines().any(|l| l == line), "missing {line}\n{lean}");
    }
    let n = series(&lean);
    assert!((8..=12).contains(&n), "{n} series for one client row:\n{lean}");
    let full = events(&Metrics::new(true), &mut Aggregator::new(Config::default()));
    assert!(full
        .contains(r#"observer_reuse_idle_seconds_count{destination="10.0.0.2:443",role="client",outcome="reset",reset_from="unknown"} 1"#));
    assert!(full.contains(r#"observer_local_idle_close_seconds_count{destination="10.0.0.2:443",role="client"} 1"#));
    assert!(full.contains(r#"observer_reuses_total{destination="10.0.0.2:443",role="client",outcome="ok"} 1"#));
    // Three outcomes, one peer-close kind and the local closes: 5 histograms of 23 series.
    assert_eq!(series(&full), n + 5 * 23, "{full}");
}

/// `observer analyze -o prometheus`: the exposition of a real recording
/// (nginx closing idle connections at 2 s) carries the interval the table
/// gives, in the lean set.
#[test]
fn exposition_of_a_recording_matches_its_table() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fin-nginx-2s.jsonl");
    let events = crate::surfaces::status::read_recording(std::fs::File::open(path).unwrap()).unwrap();
    let rows = crate::surfaces::status::analyze(&events, Config::default());
    let text = exposition_of(&events, Config::default(), false);
    let r = rows.iter().find(|r| r.path.upper_seconds.is_some()).expect("a row with a failure");
    let upper = r.path.upper_seconds.unwrap();
    // The recorded clients ran in a network namespace of their own.
    let netns = r.id.netns.inode().expect("the recording's client namespace");
    let want = format!(
        "observer_path_idle_timeout_seconds{{destination=\"{}\",role=\"client\",netns=\"{netns}\",bound=\"upper\"}} {upper:?}",
        r.id.destination
    );
    assert!(text.lines().any(|l| l == want), "missing {want}\n{text}");
    assert!(!text.contains("_bucket"), "lean by default");
}

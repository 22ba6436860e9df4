use std::{collections::BTreeSet, time::Duration};

use super::{
    parse_headers, resolve,
    series::{families, otel_name, Kind, Snapshot, Value},
    Snapshots, Source, Transport,
};
use crate::{
    diagnosis::aggregate::Config,
    surfaces::{
        metrics::{exposition_of, Metrics},
        status::{analyze, read_recording},
    },
};

fn recording() -> Vec<crate::kernel::event::SockEvent> {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fin-nginx-2s.jsonl");
    read_recording(std::fs::File::open(path).unwrap()).unwrap()
}

fn attr<'a>(p: &'a super::series::Point, k: &str) -> Option<&'a Value> {
    p.attributes.iter().find(|(key, _)| key == k).map(|(_, v)| v)
}

#[test]
fn names_follow_the_prometheus_names_back_and_forth() {
    assert_eq!(otel_name("observer_reuses_total"), ("observer.reuses".to_owned(), ""));
    assert_eq!(otel_name("observer_path_idle_timeout_seconds"), ("observer.path_idle_timeout".to_owned(), "s"));
    assert_eq!(otel_name("observer_mismatch"), ("observer.mismatch".to_owned(), ""));
    // A Collector's Prometheus exporter adds `_seconds` for `s` and
    // `_total` for a monotonic sum: the original names come back.
    assert_eq!(otel_name("observer_otlp_export_failures_total").0, "observer.otlp_export_failures");
}

/// Every family `/metrics` can write is declared, so OTLP has an
/// instrument for it from the start, though prometheus-client writes no
/// HELP or TYPE line for a family without series.
#[test]
fn every_family_the_exposition_writes_is_declared() {
    let events = recording();
    let text = exposition_of(&events, Config::default(), false);
    let declared: BTreeSet<String> =
        families(Metrics::new(false).declared()).into_iter().map(|f| f.prometheus).collect();
    let written: BTreeSet<String> = families(&text).into_iter().map(|f| f.prometheus).collect();
    assert!(written.len() >= 10, "{written:?}");
    assert!(
        written.is_subset(&declared),
        "written but not declared: {:?}",
        written.difference(&declared).collect::<Vec<_>>()
    );
    // The rows' families too, which have no series on an empty registry.
    for f in [
        "observer_reuses_total",
        "observer_path_idle_timeout_seconds",
        "observer_destination_info",
        "observer_events_total",
    ] {
        assert!(declared.contains(f), "{f} declared: {declared:?}");
    }
    let kinds: Vec<(String, Kind)> =
        families(Metrics::new(false).declared()).into_iter().map(|f| (f.name, f.kind)).collect();
    assert!(kinds.contains(&("observer.reuses".to_owned(), Kind::Sum)), "{kinds:?}");
    assert!(kinds.contains(&("observer.path_idle_timeout".to_owned(), Kind::Gauge)), "{kinds:?}");
    // The histograms stay on /metrics: OTLP carries the lean set.
    let with_histograms: Vec<String> = families(Metrics::new(true).declared()).into_iter().map(|f| f.name).collect();
    assert!(Metrics::new(true).declared().contains("observer_reuse_idle_seconds histogram"));
    assert!(!with_histograms.contains(&"observer.reuse_idle".to_owned()), "{with_histograms:?}");
    assert_eq!(with_histograms.len(), kinds.len(), "the same lean set with --metrics-histograms");
}

/// The points of a real recording's exposition carry the row's figures
/// with the peer's semantic-convention attributes.
#[test]
fn a_recordings_points_carry_the_rows_figures_and_the_peer() {
    let events = recording();
    let rows = analyze(&events, Config::default());
    let text = exposition_of(&events, Config::default(), false);
    let snap = Snapshot::read(&text);
    let r = rows.iter().find(|r| r.path.upper_seconds.is_some()).expect("a row with a failure");
    let upper = snap
        .points("observer_path_idle_timeout_seconds")
        .iter()
        .find(|p| attr(p, "observer.bound") == Some(&Value::Str("upper".to_owned())))
        .expect("the upper bound");
    assert_eq!(Some(upper.value), r.path.upper_seconds);
    // The address, though its clients used a name: the names join from
    // `observer.destination_info`, as on /metrics.
    assert_eq!(attr(upper, "server.address"), Some(&Value::Str("10.201.1.1".to_owned())));
    let info = snap.points("observer_destination_info");
    assert!(info
        .iter()
        .any(|p| attr(p, "observer.server_name") == Some(&Value::Str("api.partner.example".to_owned()))));
    let port = r.id.destination.parse::<std::net::SocketAddr>().unwrap().port();
    assert_eq!(attr(upper, "server.port"), Some(&Value::Int(i64::from(port))));
    assert_eq!(attr(upper, "network.type"), Some(&Value::Str("ipv4".to_owned())));
    assert_eq!(attr(upper, "observer.destination"), Some(&Value::Str(r.id.destination.clone())));
    assert_eq!(attr(upper, "observer.role"), Some(&Value::Str("client".to_owned())));
    assert!(attr(upper, "observer.netns").is_some(), "the recording's clients ran in a namespace of their own");
    let failures: f64 = snap
        .points("observer_reuses_total")
        .iter()
        .filter(|p| attr(p, "observer.role") == Some(&Value::Str("client".to_owned())))
        .filter(|p| attr(p, "observer.outcome").is_some_and(|o| *o != Value::Str("ok".to_owned())))
        .map(|p| p.value)
        .sum();
    assert!((failures - 10.0).abs() < 1e-9, "the recording's 10 resets: {failures}");
}

/// An IPv6 row: its address and port as the semantic conventions say;
/// escaped label values are read back whole.
#[test]
fn an_ipv6_row_and_escaped_labels_are_read() {
    let text = "# TYPE observer_destination_info gauge\n\
        observer_destination_info{destination=\"[2001:db8::1]:443\",role=\"client\",server_name=\"api.example.com\"} 1\n\
        # TYPE observer_mismatch gauge\n\
        observer_mismatch{destination=\"[2001:db8::1]:443\",role=\"client\",failure_mode=\"a \\\"quoted\\\" \\\\ mode\"} 1\n\
        observer_mismatch{destination=\"other\",role=\"client\",failure_mode=\"rst\"} 0\n";
    let snap = Snapshot::read(text);
    let points = snap.points("observer_mismatch");
    assert_eq!(points.len(), 2);
    let p = &points[0];
    assert_eq!(attr(p, "server.address"), Some(&Value::Str("2001:db8::1".to_owned())));
    assert!(attr(p, "network.peer.address").is_none());
    assert_eq!(attr(p, "server.port"), Some(&Value::Int(443)));
    assert_eq!(attr(p, "network.type"), Some(&Value::Str("ipv6".to_owned())));
    assert_eq!(attr(p, "observer.failure_mode"), Some(&Value::Str("a \"quoted\" \\ mode".to_owned())));
    // The pooled row has no address: its label alone.
    assert!(attr(&points[1], "server.address").is_none());
    assert_eq!(attr(&points[1], "observer.destination"), Some(&Value::Str("other".to_owned())));
    // Broken lines are skipped, never a panic.
    for bad in ["observer_x{a=\"1} 2", "observer_x{a=1} 2", "observer_x{a=\"1\"} nope", "observer_x"] {
        assert!(Snapshot::read(bad).points("observer_x").is_empty(), "{bad}");
    }
}

#[test]
fn settings_follow_the_otlp_variables() {
    let d = Duration::from_mins(1);
    let t = Duration::from_secs(10);
    assert_eq!(
        resolve(None, None, None, Transport::HttpProtobuf, None, d, t, true).unwrap(),
        None,
        "no endpoint: nothing sent"
    );
    let s = resolve(
        Some("http://collector:4318/"),
        None,
        None,
        Transport::HttpProtobuf,
        Some("a=b, c = d%20e"),
        d,
        t,
        true,
    )
    .unwrap()
    .unwrap();
    assert_eq!(s.metrics_url, "http://collector:4318/v1/metrics");
    assert_eq!(s.logs_url.as_deref(), Some("http://collector:4318/v1/logs"));
    assert_eq!(s.headers, vec![("a".to_owned(), "b".to_owned()), ("c".to_owned(), "d e".to_owned())]);
    // The per-signal variable is taken as it is; gRPC adds no path.
    let s = resolve(Some("http://c:4317"), Some("http://m:9/custom"), None, Transport::Grpc, None, d, t, false)
        .unwrap()
        .unwrap();
    assert_eq!((s.metrics_url.as_str(), s.logs_url), ("http://m:9/custom", None));
    let s = resolve(Some("http://c:4317"), None, None, Transport::Grpc, None, d, t, true).unwrap().unwrap();
    assert_eq!(s.metrics_url, "http://c:4317");
    let e = resolve(Some("collector:4318"), None, None, Transport::HttpProtobuf, None, d, t, false).unwrap_err();
    assert!(e.to_string().contains("http://localhost:4318"), "{e}");
    // No TLS to a collector in this build: said at start, never a
    // failure at every export.
    let e =
        resolve(Some("https://collector:4318"), None, None, Transport::HttpProtobuf, None, d, t, false).unwrap_err();
    assert!(e.to_string().contains("over http://"), "{e}");
    let e = parse_headers("novalue").unwrap_err();
    assert!(e.to_string().contains("k1=v1,k2=v2"), "{e}");
    assert!(Transport::parse("http/json").unwrap_err().contains("http/protobuf"));
    assert_eq!(Transport::parse("grpc"), Ok(Transport::Grpc));
}

/// `docs/metrics.md` maps every family to its OTLP name and type.
#[test]
fn the_reference_maps_every_family() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/metrics.md")).unwrap();
    for f in families(Metrics::new(false).declared()) {
        let kind = if f.kind == Kind::Sum { "sum (cumulative, monotonic)" } else { "gauge" };
        let row = format!("| `{}` | `{}` | {kind} |", f.prometheus, f.name);
        assert!(doc.contains(&row), "docs/metrics.md lacks {row}");
    }
}

/// A full queue to the collector drops log records and counts them; the
/// daemon's loop never waits on it.
#[test]
fn a_full_log_queue_drops_and_counts() {
    use opentelemetry::logs::{LogRecord as _, Logger as _, LoggerProvider as _};
    let (tx, rx) = std::sync::mpsc::sync_channel(4);
    let tally = std::sync::Arc::new(super::Tally::default());
    let provider = opentelemetry_sdk::logs::SdkLoggerProvider::builder()
        .with_log_processor(super::logs::Queue { tx, tally: std::sync::Arc::clone(&tally) })
        .build();
    let logger = provider.logger("test");
    // try_send: a blocking send would hang here, the fifth record on.
    for i in 0..10 {
        let mut r = logger.create_log_record();
        r.set_body(opentelemetry::logs::AnyValue::from(format!("failed reuse {i}")));
        logger.emit(r);
    }
    assert_eq!(tally.logs_dropped.load(std::sync::atomic::Ordering::Relaxed), 6);
    assert_eq!(rx.try_iter().count(), 4, "the first four wait for the sender");
}

/// One collection reads the exposition once; the next reads it again,
/// however short the export interval (a snapshot once outlived a 500 ms
/// interval and the next export carried a counter from before).
#[test]
fn each_collection_reads_the_exposition_anew() {
    use std::sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    };
    use std::time::Instant;
    let reads = Arc::new(AtomicU64::new(0));
    let counter = Arc::clone(&reads);
    let source: Source = Arc::new(move || {
        let n = counter.fetch_add(1, Ordering::Relaxed);
        Some(format!("# TYPE observer_x_total counter\nobserver_x_total {n}\n"))
    });
    let t0 = Instant::now();
    let at = |ms: u64| t0 + Duration::from_millis(ms);
    let default = Snapshots::new(Arc::clone(&source), Duration::from_mins(1));
    default.get_at(at(0));
    default.get_at(at(5));
    assert_eq!(reads.load(Ordering::Relaxed), 1, "one collection's callbacks share one read");
    default.get_at(at(150));
    assert_eq!(reads.load(Ordering::Relaxed), 2, "a collection 150 ms later reads anew");
    let fast = Snapshots::new(source, Duration::from_millis(40));
    fast.get_at(at(0));
    fast.get_at(at(25));
    assert_eq!(reads.load(Ordering::Relaxed), 4, "at a 40 ms interval a snapshot lives under 20 ms");
}

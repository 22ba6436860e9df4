//! Root end-to-end tests of the OTLP export against a real collector:
//! rotel (`rotel-agent`, from `PyPI`), listening on loopback and printing
//! every data point and log record it receives. The daemon is configured
//! only by the standard `OTEL_*` variables (and `OBSERVER_OTLP_LOGS`);
//! HAProxy with `option nolinger` ends idle client connections at 1.5 s.

#[macro_use]
mod common;

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _, Result};
use common::{client_records, metric, script, start_haproxy, start_nginx, Daemon, Killed, Topology, HTTP_RECONNECTING};
use observer::kernel::event::Role;

/// A running rotel collector, killed on drop; its debug log in a file.
struct Collector {
    _proc: Killed,
    log: PathBuf,
}

/// What rotel printed: data points and log records with their
/// attributes, and the resource of the last export.
#[derive(Debug, Default)]
struct Received {
    /// (metric name, attributes, value), in the order received.
    points: Vec<(String, BTreeMap<String, String>, f64)>,
    logs: Vec<BTreeMap<String, String>>,
    resource: BTreeMap<String, String>,
}

fn rotel_agent() -> Result<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import rotel, os; print(os.path.join(os.path.dirname(rotel.__file__), 'rotel-agent'))"])
        .output()?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    ensure!(out.status.success() && path.exists(), "no rotel-agent (PyPI's `rotel`; `cargo xtask test` installs it)");
    Ok(path)
}

fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Collector {
    /// rotel on `http` (OTLP/HTTP) and `grpc` (OTLP/gRPC), both on loopback.
    fn start(dir: &Path, http: u16, grpc: u16) -> Result<Self> {
        static STARTED: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let log = dir.join(format!("rotel-{http}-{n}.log"));
        let file = std::fs::File::create(&log)?;
        let child = Command::new(rotel_agent()?)
            .args(["start", "--exporter", "blackhole", "--debug-log", "metrics", "--debug-log", "logs"])
            .args(["--debug-log-verbosity", "detailed"])
            .args(["--otlp-http-endpoint", &format!("127.0.0.1:{http}")])
            .args(["--otlp-grpc-endpoint", &format!("127.0.0.1:{grpc}")])
            .env("NO_COLOR", "1")
            .stdout(file.try_clone()?)
            .stderr(file)
            .stdin(Stdio::null())
            .spawn()
            .context("starting rotel-agent")?;
        let proc = Killed(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", http)).is_err() {
            ensure!(Instant::now() < deadline, "rotel did not listen on {http}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self { _proc: proc, log })
    }

    fn received(&self) -> Result<Received> {
        let raw = std::fs::read(&self.log)?;
        Ok(parse(&strip_ansi(&String::from_utf8_lossy(&raw))))
    }

    /// Wait until `pred` holds for what was received.
    fn wait(&self, what: &str, secs: f64, pred: impl Fn(&Received) -> bool) -> Result<Received> {
        let deadline = Instant::now() + Duration::from_secs_f64(common::tolerance(secs));
        loop {
            let r = self.received()?;
            if pred(&r) {
                return Ok(r);
            }
            if Instant::now() > deadline {
                let names: std::collections::BTreeSet<&str> = r.points.iter().map(|p| p.0.as_str()).collect();
                let ours: Vec<_> = r
                    .points
                    .iter()
                    .filter(|p| p.0 == "observer.reuses" || p.0 == "observer.path_idle_timeout")
                    .collect();
                bail!(
                    "the collector never received {what}; got {} points ({names:?}; {ours:?}), log records {:?}",
                    r.points.len(),
                    r.logs
                );
            }
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `-> key: Str(value)` (or `Int(..)`, `Double(..)`, `Bool(..)`).
fn attribute(line: &str) -> Option<(String, String)> {
    let rest = line.trim().strip_prefix("-> ")?;
    let (k, v) = rest.split_once(": ")?;
    let v = v.split_once('(').map_or(v, |(_, inner)| inner.strip_suffix(')').unwrap_or(inner));
    Some((k.to_owned(), v.to_owned()))
}

fn parse(text: &str) -> Received {
    #[derive(PartialEq)]
    enum In {
        Nothing,
        Resource,
        Point,
        Log,
    }
    let mut r = Received::default();
    let mut metric = String::new();
    let mut at = In::Nothing;
    let mut resource = BTreeMap::new();
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("Resource attributes") {
            at = In::Resource;
            resource = BTreeMap::new();
        } else if t.starts_with("ScopeMetrics #") || t.starts_with("ScopeLogs #") {
            if at == In::Resource {
                r.resource = std::mem::take(&mut resource);
            }
            at = In::Nothing;
        } else if t.starts_with("Metric #") || t.starts_with("Descriptor:") {
            // A descriptor's `-> Name:`, `-> DataType:` are no point's.
            at = In::Nothing;
        } else if let Some(n) = t.strip_prefix("-> Name: ") {
            n.clone_into(&mut metric);
        } else if t.starts_with("NumberDataPoints #") {
            r.points.push((metric.clone(), BTreeMap::new(), f64::NAN));
            at = In::Point;
        } else if t.starts_with("LogRecord #") {
            r.logs.push(BTreeMap::new());
            at = In::Log;
        } else if let Some(v) = t.strip_prefix("Value: ") {
            if let (In::Point, Some(p)) = (&at, r.points.last_mut()) {
                p.2 = v.parse().unwrap_or(f64::NAN);
            }
        } else if let Some(v) = t.strip_prefix("Body: ") {
            if let (In::Log, Some(l)) = (&at, r.logs.last_mut()) {
                l.insert("body".to_owned(), v.to_owned());
            }
        } else if let Some((k, v)) = attribute(t) {
            match at {
                In::Resource => {
                    resource.insert(k, v);
                }
                In::Point => {
                    if let Some(p) = r.points.last_mut() {
                        p.1.insert(k, v);
                    }
                }
                In::Log => {
                    if let Some(l) = r.logs.last_mut() {
                        l.insert(k, v);
                    }
                }
                In::Nothing => {}
            }
        }
    }
    r
}

impl Received {
    /// The latest value of each series of `metric` whose attributes hold
    /// every pair of `with`.
    fn latest(&self, metric: &str, with: &[(&str, &str)]) -> Vec<(BTreeMap<String, String>, f64)> {
        let mut last: BTreeMap<String, (BTreeMap<String, String>, f64)> = BTreeMap::new();
        for (m, attrs, v) in &self.points {
            if m == metric && with.iter().all(|(k, want)| attrs.get(*k).map(String::as_str) == Some(*want)) {
                last.insert(format!("{attrs:?}"), (attrs.clone(), *v));
            }
        }
        last.into_values().collect()
    }
}

/// The row's figures reach the collector: the failures sum equals the
/// row's count and the client's, the path idle timeout gauge is within
/// 5 % of HAProxy's 1.5 s, the peer's semantic-convention attributes are
/// on the data points, `service.name` and `host.name` on the resource,
/// and (logs on) one log record per failed reuse the client saw.
#[allow(clippy::cast_precision_loss, clippy::float_cmp, reason = "counts of a few, sent as whole numbers")]
fn the_rows_figures_reach_the_collector(protocol: &str) -> Result<()> {
    let topo = Topology::pair(if protocol == "grpc" { "otlpgrpc" } else { "otlphttp" })?;
    let dir = tempfile::tempdir()?;
    let _nginx = start_nginx(&topo, dir.path(), 60)?;
    let _haproxy = start_haproxy(&topo, dir.path(), 1500)?;
    let (http, grpc) = (free_port()?, free_port()?);
    let collector = Collector::start(dir.path(), http, grpc)?;
    let endpoint = format!("http://127.0.0.1:{}", if protocol == "grpc" { grpc } else { http });
    let daemon = Daemon::start_env(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", protocol),
            ("OTEL_METRIC_EXPORT_INTERVAL", "1000"),
            ("OBSERVER_OTLP_LOGS", "1"),
            // As the DaemonSet passes the node's name.
            ("OTEL_RESOURCE_ATTRIBUTES", "k8s.node.name=node-a"),
        ],
        &[],
    )?;
    let py = script(HTTP_RECONNECTING)?;
    let gaps = "1.1,2.2,1.15,2.6,1.2,3.0";
    let out = topo.ns.exec(topo.client, &format!("python3 {} {} 8090 {gaps}", py.display(), topo.server_v4))?;
    let recs = client_records(&out)?;
    let client_failures = recs.iter().filter(|r| r.result != "ok").count();
    ensure!(client_failures == 3, "the client saw {recs:?}");
    let dest = format!("{}:8090", topo.server_v4);
    let deadline = Instant::now() + Duration::from_secs_f64(common::tolerance(10.0));
    let row = loop {
        let rows = daemon.status()?;
        if let Some(r) = rows.iter().find(|r| r.id.destination == dest && r.id.role == Role::Client) {
            if r.path.idle_timeout_seconds.is_some() && r.counts.failures_window == client_failures as u64 {
                break r.clone();
            }
        }
        ensure!(Instant::now() < deadline, "the row of {dest} never showed the failures: {rows:#?}");
        std::thread::sleep(Duration::from_millis(250));
    };
    let port = "8090";
    let failures = |r: &Received| -> f64 {
        r.latest("observer.reuses", &[("server.port", port), ("observer.role", "client")])
            .iter()
            .filter(|(a, _)| a.get("observer.outcome").is_some_and(|o| o != "ok"))
            .map(|(_, v)| v)
            .sum()
    };
    let got = collector.wait("the row's failures and its timeout", 10.0, |r| {
        failures(r) >= client_failures as f64
            && !r.latest("observer.path_idle_timeout", &[("server.port", port), ("observer.bound", "point")]).is_empty()
            && r.logs.iter().filter(|l| l.get("server.port").map(String::as_str) == Some(port)).count()
                >= client_failures
    })?;
    let sum = failures(&got);
    assert_eq!(
        sum,
        row.counts.failures_window as f64,
        "the failures sum equals the row's count: {:#?}",
        got.latest("observer.reuses", &[("server.port", port)])
    );
    let gauge = got.latest("observer.path_idle_timeout", &[("server.port", port), ("observer.bound", "point")]);
    let (attrs, point) = gauge.first().context("a point")?;
    assert!((point - 1.5).abs() <= 0.075, "path idle timeout {point} within 5 % of 1.5 s: {attrs:?}");
    assert_eq!(attrs.get("observer.destination"), Some(&dest), "{attrs:?}");
    assert_eq!(attrs.get("network.type").map(String::as_str), Some("ipv4"), "{attrs:?}");
    assert_eq!(attrs.get("server.address"), Some(&topo.server_v4.clone()), "{attrs:?}");
    assert_eq!(attrs.get("server.port").map(String::as_str), Some(port), "{attrs:?}");
    assert_eq!(got.resource.get("service.name").map(String::as_str), Some("observer"), "{:?}", got.resource);
    assert!(got.resource.get("host.name").is_some_and(|h| !h.is_empty()), "{:?}", got.resource);
    assert!(got.resource.contains_key("service.version"), "{:?}", got.resource);
    assert_eq!(got.resource.get("k8s.node.name").map(String::as_str), Some("node-a"), "{:?}", got.resource);
    let logs: Vec<_> = got.logs.iter().filter(|l| l.get("server.port").map(String::as_str) == Some(port)).collect();
    std::thread::sleep(Duration::from_millis(1500));
    let later = collector.received()?;
    let logs_later = later.logs.iter().filter(|l| l.get("server.port").map(String::as_str) == Some(port)).count();
    assert_eq!(logs_later, client_failures, "one log record per failed reuse the client saw: {logs:#?}");
    for l in &logs {
        assert_eq!(l.get("observer.outcome").map(String::as_str), Some("reset"), "{l:?}");
        assert_eq!(l.get("observer.safe_to_retry").map(String::as_str), Some("true"), "{l:?}");
        let idle: f64 = l.get("observer.idle_seconds").context("idle")?.parse()?;
        assert!(idle > 1.5, "{l:?}");
        assert!(l.contains_key("process.executable.name"), "{l:?}");
    }
    let metrics = daemon.metrics()?;
    assert_eq!(
        metric("observer_otlp_export_failures_total").label("signal", "metrics").value(&metrics),
        Some(0.0),
        "{metrics}"
    );
    eprintln!(
        "MEASURED otlp {protocol}: failures sum {sum} (row {}, client {client_failures}); path idle timeout point {point:.3} s; {logs_later} log records; attributes {attrs:?}; resource {:?}",
        row.counts.failures_window, got.resource
    );
    Ok(())
}

#[test]
fn the_rows_figures_reach_a_collector_over_http() -> Result<()> {
    the_rows_figures_reach_the_collector("http/protobuf")
}

#[test]
fn the_rows_figures_reach_a_collector_over_grpc() -> Result<()> {
    the_rows_figures_reach_the_collector("grpc")
}

/// The collector stopped mid-run, then started again: the daemon keeps
/// serving `/metrics` and `/healthz`, counts the failed exports, and
/// the exports resume.
#[test]
fn a_collector_down_mid_run_is_counted_and_the_export_resumes() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let (http, grpc) = (free_port()?, free_port()?);
    let collector = Collector::start(dir.path(), http, grpc)?;
    let endpoint = format!("http://127.0.0.1:{http}");
    let daemon = Daemon::start_env(
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
            ("OTEL_EXPORTER_OTLP_TIMEOUT", "300"),
        ],
        &[],
    )?;
    collector.wait("a first export", 10.0, |r| !r.latest("observer.build_info", &[]).is_empty())?;
    drop(collector);
    let addr = daemon.http_addr()?;
    let failures = |m: &str| -> f64 {
        m.lines()
            .find_map(|l| l.strip_prefix("observer_otlp_export_failures_total{signal=\"metrics\"} "))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(0.0)
    };
    let deadline = Instant::now() + Duration::from_secs_f64(common::tolerance(15.0));
    let counted = loop {
        let health = observer::surfaces::http::get(&addr, "/healthz").map_err(anyhow::Error::msg)?;
        ensure!(String::from_utf8_lossy(&health).contains("ok"), "healthz while the collector is down: {health:?}");
        let m = daemon.metrics()?;
        if failures(&m) >= 2.0 {
            break failures(&m);
        }
        ensure!(Instant::now() < deadline, "failed exports were never counted: {m}");
        std::thread::sleep(Duration::from_millis(250));
    };
    let again = Collector::start(dir.path(), http, grpc)?;
    let first =
        again.wait("an export after the restart", 15.0, |r| !r.latest("observer.build_info", &[]).is_empty())?;
    // The first export to land may be one collected before the failures
    // reached `/metrics` (they are moved there once a second) that the
    // exporter retried until the collector came back (opentelemetry-otlp
    // retries within its timeout): it carries its collection's values. The
    // exports after it carry the count.
    let failures_of = |r: &Received| r.latest("observer.otlp_export_failures", &[("observer.signal", "metrics")]);
    let got = again.wait("an export carrying the failures", 15.0, |r| failures_of(r).iter().any(|(_, v)| *v >= 2.0))?;
    eprintln!(
        "MEASURED otlp collector down: {counted} failed exports counted while it was down; resumed with {} points, failures as first exported {:?}, then {:?}",
        first.points.len(),
        failures_of(&first),
        failures_of(&got)
    );
    Ok(())
}

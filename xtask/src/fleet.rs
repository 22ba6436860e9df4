//! `cargo xtask fleet-sim --hosts N --destinations M`: the fleet view at
//! scale, on a real Prometheus.
//!
//! Each simulated host gets its own recording of evidence toward the same
//! M destinations (its own survivals, failures and peer closes, so hosts'
//! intervals vary, and at some destinations a few hosts disagree: their
//! interval lies wholly below the others'). `observer analyze -o
//! prometheus` turns each recording into the exposition that host's
//! daemon would serve (the lean default set); N scrape targets on loopback
//! serve them; one Prometheus scrapes them all with
//! `deploy/prometheus/observer-rules.yml` loaded. Measured: Prometheus's
//! active series, its RSS, the scrape duration, the rule group's
//! evaluation time. Checked: for every destination the recorded fleet
//! interval is the intersection of the hosts' intervals (max of the lower
//! bounds, min of the upper bounds and points), exactly.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _, Result};
use serde_json::{json, Value};

use crate::{bench::shipped_bin, workspace_root};

/// How often Prometheus scrapes and evaluates the rules here.
const INTERVAL_S: u64 = 5;
/// Scrapes of every target before the figures are read.
const SCRAPES: u64 = 4;

/// A deterministic number in [0, 1) for (host, destination, salt).
#[allow(clippy::cast_precision_loss, reason = "a fraction from 53 bits")]
fn unit(h: u32, d: u32, salt: u32) -> f64 {
    let mut x = u64::from(h) << 40 ^ u64::from(d) << 8 ^ u64::from(salt);
    // splitmix64
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^= x >> 31;
    (x >> 11) as f64 / (1u64 << 53) as f64
}

/// Destination `d`'s address and its true idle timeout (20 to 215 s).
fn destination(d: u32) -> (String, f64) {
    (format!("198.18.{}.{}:443", d / 250, d % 250 + 1), 20.0 + f64::from(d % 40) * 5.0)
}

/// At some destinations a few hosts disagree: their evidence sits wholly
/// below the others' (a different path behind the same address).
fn disagrees(h: u32, d: u32) -> bool {
    d % 10 == 3 && h.is_multiple_of(7)
}

/// One host's recording: per destination, three survivals, two failures
/// (eof) and, at every other destination, three peer closes near the
/// timeout; one line per event, as `observer run --record` writes them.
fn recording(h: u32, destinations: u32, start_ns: u64) -> String {
    let mut out = String::new();
    let mut ts = start_ns;
    let mut sock = 1u64;
    for d in 0..destinations {
        let (remote, t) = destination(d);
        let (lo, hi) = if disagrees(h, d) { (0.3, 0.5) } else { (0.55, 1.0) };
        let mut events: Vec<(&str, f64, Option<&str>, Option<&str>)> = Vec::new();
        for k in 0..3 {
            events.push(("reuse", t * (lo + (hi - lo - 0.05) * 0.9 * unit(h, d, k)), Some("ok"), None));
        }
        let fail_at = if disagrees(h, d) { 0.5 } else { 1.0 + 0.25 * unit(h, d, 10) };
        events.push(("reuse", t * fail_at, Some("eof"), None));
        events.push(("reuse", t * fail_at + 3.0, Some("eof"), None));
        if d % 2 == 0 {
            for k in 0..3 {
                let at = t * if disagrees(h, d) { 0.5 } else { 1.0 } + 0.05 * unit(h, d, 20 + k);
                events.push(("peer_close_while_idle", at, None, Some("fin")));
            }
        }
        for (kind, idle, outcome, how) in events {
            ts += 1_000_000;
            sock += 1;
            let q = |v: Option<&str>| v.map_or_else(|| "null".to_owned(), |s| format!("\"{s}\""));
            let _ = writeln!(
                out,
                r#"{{"ts_unix_ns":{ts},"kind":"{kind}","role":"client","pid":{pid},"comm":"app","local":"10.9.{}.{}:{port}","remote":"{remote}","idle_seconds":{idle:.6},"outcome":{},"elapsed_seconds":{},"retransmits":0,"safe_to_retry":false,"how":{},"request_outstanding":false,"peer_closed_first":false,"preexisting":false,"sock_id":{sock}}}"#,
                h / 250,
                h % 250 + 1,
                q(outcome),
                if outcome.is_some() { "0.001" } else { "null" },
                q(how),
                pid = 1000 + h,
                port = 30_000 + (sock % 30_000),
            );
        }
    }
    out
}

/// `observer_path_idle_timeout_seconds` of one exposition:
/// destination -> bound -> value.
fn bounds(exposition: &str) -> BTreeMap<String, BTreeMap<String, f64>> {
    let mut out: BTreeMap<String, BTreeMap<String, f64>> = BTreeMap::new();
    for l in exposition.lines().filter(|l| l.starts_with("observer_path_idle_timeout_seconds{")) {
        let label = |name: &str| l.split(&format!("{name}=\"")).nth(1)?.split('"').next().map(str::to_owned);
        let (Some(dest), Some(bound), Some(v)) =
            (label("destination"), label("bound"), l.rsplit(' ').next().and_then(|v| v.parse().ok()))
        else {
            continue;
        };
        out.entry(dest).or_default().insert(bound, v);
    }
    out
}

/// Serve `body` as `/metrics` on a loopback port until `stop`.
fn serve(body: Arc<String>, stop: Arc<AtomicBool>) -> Result<(String, thread::JoinHandle<()>)> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?.to_string();
    listener.set_nonblocking(true)?;
    let handle = thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((s, _)) => {
                    let _ = answer(s, &body);
                }
                Err(_) => thread::sleep(Duration::from_millis(20)),
            }
        }
    });
    Ok((addr, handle))
}

fn answer(mut s: TcpStream, body: &str) -> std::io::Result<()> {
    s.set_nonblocking(false)?;
    s.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = s.read(&mut buf)?;
        if n == 0 || head.len() > 64 * 1024 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
    }
    write!(
        s,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    )?;
    s.write_all(body.as_bytes())
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// Prometheus, killed on drop.
struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A PromQL instant query: each result's labels and value.
fn query(prom: &str, q: &str) -> Result<Vec<(Value, f64)>> {
    let body = crate::bench::http_get(prom, &format!("/api/v1/query?query={}", urlencode(q)))
        .with_context(|| format!("query {q}"))?;
    let v: Value = serde_json::from_str(&body)?;
    ensure!(v["status"] == "success", "query {q}: {v}");
    Ok(v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|r| Some((r["metric"].clone(), r["value"].get(1)?.as_str()?.parse().ok()?)))
        .collect())
}

fn scalar(prom: &str, q: &str) -> Result<f64> {
    query(prom, q)?.first().map(|r| r.1).with_context(|| format!("`{q}` returned nothing"))
}

/// Run the simulation; writes `target/bench/fleet-<N>x<M>.json`.
#[allow(clippy::too_many_lines, reason = "one run, step by step")]
#[allow(clippy::cast_precision_loss, reason = "figures")]
pub fn run(hosts: u32, destinations: u32) -> Result<Value> {
    ensure!(hosts > 0 && destinations > 0, "--hosts and --destinations must be at least 1");
    ensure!(destinations <= 10_000, "--destinations is at most 10000 (the addresses are 198.18.0.0/15)");
    let started = Instant::now();
    let dir = workspace_root().join(format!("target/fleet-sim/{hosts}x{destinations}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let now_ns = u64::try_from(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?.as_nanos())?;
    // The evidence spans the hour before now (inside the 24 h window).
    let start_ns = now_ns - 3_600_000_000_000;
    let mut expositions = Vec::new();
    for h in 0..hosts {
        let path = dir.join(format!("host-{h}.jsonl"));
        std::fs::write(&path, recording(h, destinations, start_ns))?;
        let out = Command::new(shipped_bin()).arg("analyze").arg(&path).args(["-o", "prometheus"]).output()?;
        ensure!(out.status.success(), "observer analyze {}: {}", path.display(), String::from_utf8_lossy(&out.stderr));
        expositions.push(String::from_utf8(out.stdout)?);
    }
    let series_per_host =
        expositions.iter().map(|e| e.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count()).sum::<usize>()
            as f64
            / f64::from(hosts);
    let bytes_per_host = expositions.iter().map(String::len).sum::<usize>() as f64 / f64::from(hosts);
    // What the fleet rules must give: the intersection of the hosts' intervals.
    let mut want: BTreeMap<String, BTreeMap<&str, f64>> = BTreeMap::new();
    for e in &expositions {
        for (dest, b) in bounds(e) {
            let w = want.entry(dest).or_default();
            for (bound, v) in b {
                let (key, better): (&str, fn(f64, f64) -> f64) = match bound.as_str() {
                    "lower" => ("lower", f64::max),
                    "upper" => ("upper", f64::min),
                    "point" => ("point", f64::min),
                    _ => continue,
                };
                w.entry(key).and_modify(|x| *x = better(*x, v)).or_insert(v);
            }
        }
    }
    let empty =
        want.values().filter(|w| matches!((w.get("lower"), w.get("upper")), (Some(l), Some(u)) if l > u)).count();
    ensure!(want.len() == destinations as usize, "{} destinations have bounds, not {destinations}", want.len());
    let stop = Arc::new(AtomicBool::new(false));
    let mut targets = Vec::new();
    let mut servers = Vec::new();
    for e in expositions {
        let (addr, h) = serve(Arc::new(e), Arc::clone(&stop))?;
        targets.push(addr);
        servers.push(h);
    }
    let addr = format!("127.0.0.1:{}", free_port()?);
    let config = dir.join("prometheus.yml");
    let list = targets.iter().map(|t| format!("\"{t}\"")).collect::<Vec<_>>().join(", ");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: {INTERVAL_S}s\n  scrape_timeout: {INTERVAL_S}s\n  evaluation_interval: {INTERVAL_S}s\nrule_files:\n  - {rules}\nscrape_configs:\n  - job_name: prometheus\n    static_configs:\n      - targets: [\"{addr}\"]\n  - job_name: observer\n    static_configs:\n      - targets: [{list}]\n",
            rules = workspace_root().join("deploy/prometheus/observer-rules.yml").display()
        ),
    )?;
    let log = std::fs::File::create(dir.join("prometheus.log"))?;
    let prom = Prometheus(
        Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("tsdb").display()))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .context("starting prometheus (Debian package `prometheus`)")?,
    );
    let pid = prom.0.id();
    // Every target up, then SCRAPES more scrape intervals.
    let deadline = Instant::now() + Duration::from_mins(3);
    loop {
        let up = query(&addr, "sum(up{job=\"observer\"})").ok().and_then(|r| r.first().map(|x| x.1));
        let evaluated = query(&addr, "count(destination:observer_path_idle_timeout_upper_seconds:min)")
            .ok()
            .and_then(|r| r.first().map(|x| x.1));
        if up == Some(f64::from(hosts)) && evaluated == Some(f64::from(destinations)) {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "Prometheus did not scrape all {hosts} targets and evaluate the rules within 3 minutes (up {up:?}, fleet upper bounds {evaluated:?}); see {}",
                dir.join("prometheus.log").display()
            );
        }
        thread::sleep(Duration::from_millis(500));
    }
    thread::sleep(Duration::from_secs(INTERVAL_S * SCRAPES));
    let head_series = scalar(&addr, "prometheus_tsdb_head_series{job=\"prometheus\"}")?;
    let host_series = scalar(&addr, "count({job=\"observer\"})")?;
    let scrape_avg = scalar(&addr, "avg(scrape_duration_seconds{job=\"observer\"})")?;
    let scrape_max = scalar(&addr, "max(max_over_time(scrape_duration_seconds{job=\"observer\"}[1m]))")?;
    let rules_s = scalar(&addr, "max(prometheus_rule_group_last_duration_seconds{rule_group=~\".*;observer-fleet\"})")?;
    let rules_max = scalar(
        &addr,
        "max(max_over_time(prometheus_rule_group_last_duration_seconds{rule_group=~\".*;observer-fleet\"}[1m]))",
    )?;
    let rss = crate::bench::status_kib(pid, "VmRSS:")? as f64 * 1024.0;
    let hwm = crate::bench::status_kib(pid, "VmHWM:")? as f64 * 1024.0;
    // The fleet interval, destination by destination.
    let mut wrong = Vec::new();
    let mut compared = 0usize;
    for (record, key) in [
        ("destination:observer_path_idle_timeout_lower_seconds:max", "lower"),
        ("destination:observer_path_idle_timeout_upper_seconds:min", "upper"),
        ("destination:observer_path_idle_timeout_point_seconds:min", "point"),
    ] {
        let got: BTreeMap<String, f64> = query(&addr, record)?
            .into_iter()
            .filter_map(|(m, v)| Some((m["destination"].as_str()?.to_owned(), v)))
            .collect();
        let expected: BTreeMap<&String, f64> = want.iter().filter_map(|(d, w)| Some((d, *w.get(key)?))).collect();
        if got.len() != expected.len() {
            wrong.push(format!("{record}: {} destinations, expected {}", got.len(), expected.len()));
        }
        for (d, v) in expected {
            compared += 1;
            match got.get(d) {
                Some(g) if (g - v).abs() <= 1e-9 * v.abs().max(1.0) => {}
                g => wrong.push(format!("{record} {d}: {g:?}, expected {v}")),
            }
        }
    }
    drop(prom);
    stop.store(true, Ordering::Relaxed);
    for s in servers {
        let _ = s.join();
    }
    let result = json!({
        "hosts": hosts,
        "destinations": destinations,
        "scrape_interval_seconds": INTERVAL_S,
        "scrapes_before_reading": SCRAPES,
        "series_per_host": series_per_host,
        "exposition_bytes_per_host": bytes_per_host,
        "host_series_in_prometheus": host_series,
        "prometheus_head_series": head_series,
        "prometheus_rss_bytes": rss,
        "prometheus_peak_rss_bytes": hwm,
        "scrape_duration_seconds_avg": scrape_avg,
        "scrape_duration_seconds_max": scrape_max,
        "rule_group_seconds_last": rules_s,
        "rule_group_seconds_max": rules_max,
        "fleet_values_compared": compared,
        "fleet_values_wrong": wrong.len(),
        "destinations_where_hosts_disagree": empty,
        "seconds": started.elapsed().as_secs_f64(),
    });
    println!(
        "fleet-sim {hosts} hosts x {destinations} destinations: {host_series:.0} host series ({series_per_host:.1} per host, {:.1} per destination), head {head_series:.0}; Prometheus RSS {:.1} MiB (peak {:.1}); scrape {:.1} ms avg, {:.1} ms max; fleet rules {:.1} ms (max {:.1}); fleet interval: {compared} values compared, {} wrong, {empty} destinations where hosts disagree (empty intersection)",
        series_per_host / f64::from(destinations),
        rss / 1_048_576.0,
        hwm / 1_048_576.0,
        scrape_avg * 1e3,
        scrape_max * 1e3,
        rules_s * 1e3,
        rules_max * 1e3,
        wrong.len()
    );
    let out = workspace_root().join("target/bench");
    std::fs::create_dir_all(&out)?;
    std::fs::write(out.join(format!("fleet-{hosts}x{destinations}.json")), serde_json::to_string_pretty(&result)?)?;
    if !wrong.is_empty() {
        bail!(
            "the fleet interval is not the intersection of the hosts' intervals at {} of {compared} values: {}",
            wrong.len(),
            wrong.iter().take(10).cloned().collect::<Vec<_>>().join("; ")
        );
    }
    ensure!(empty > 0 || hosts < 7, "no destination where hosts disagree: the simulation lost its disagreeing hosts");
    Ok(result)
}

/// The fleet runs on disk (`target/bench/fleet-*.json`), smallest first.
pub fn results(dir: &Path) -> Vec<Value> {
    let mut out: Vec<Value> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("fleet-")))
        .filter_map(|p: PathBuf| serde_json::from_str(&std::fs::read_to_string(p).ok()?).ok())
        .collect();
    out.sort_by(|a: &Value, b: &Value| {
        let key = |v: &Value| v["host_series_in_prometheus"].as_f64().unwrap_or(0.0);
        key(a).total_cmp(&key(b))
    });
    out
}

//! End-to-end tests of the verdict rules on real traffic (root, real
//! kernel): evidence that survives a flood of successes, expiry with a
//! small `--window`, and observed request deadlines checked by
//! `observer path check --observed`.
#![allow(clippy::float_cmp, reason = "unchanged bounds are the same stored observations")]

mod common;

use std::{process::Command, time::Duration};

use anyhow::{bail, ensure, Context as _, Result};
use common::{
    script, start_nginx, start_server, Daemon, Topology, HTTP_RECONNECTING, KILLING_SERVER, OBSERVER,
    ONE_REQUEST_CLIENT,
};
use observer::{
    diagnosis::aggregate::{DestinationRow, Verdict},
    kernel::event::Role,
};

/// `python3 HTTP_LOAD HOST PORT CONNS COUNT GAP`: CONNS keep-alive
/// connections in parallel, COUNT requests each, GAP s apart; prints the
/// number of answered requests.
/// `python3 HTTP_LOAD HOST PORT CONNS COUNT GAP`: CONNS threads, each
/// COUNT requests GAP apart on one keep-alive connection; prints `answered
/// failed`. A request that fails (a thread starved past nginx's keep-alive
/// under TCG finds the connection closed) is counted, and the thread goes
/// on with a fresh connection.
const HTTP_LOAD: &str = r#"
import http.client, sys, threading, time
host, port, conns, count, gap = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5])
done = []
def run():
    c = http.client.HTTPConnection(host, port, timeout=10)
    n = failed = 0
    for _ in range(count):
        try:
            c.request("GET", "/")
            r = c.getresponse()
            r.read()
            n += 1
        except (OSError, http.client.HTTPException):
            failed += 1
            c.close()
            c = http.client.HTTPConnection(host, port, timeout=10)
        time.sleep(gap)
    c.close()
    done.append((n, failed))
ts = [threading.Thread(target=run) for _ in range(conns)]
for t in ts: t.start()
for t in ts: t.join()
print(sum(d[0] for d in done), sum(d[1] for d in done), flush=True)
"#;

fn client_row(rows: &[DestinationRow], dest: &str) -> Result<DestinationRow> {
    rows.iter()
        .find(|r| r.id.destination == dest && r.id.role == Role::Client)
        .cloned()
        .with_context(|| format!("no client row for {dest}: {rows:#?}"))
}

fn settle(daemon: &Daemon) -> Result<Vec<DestinationRow>> {
    // Held peer closes become evidence after 1 s; the table is read once
    // the daemon has printed its last event (it can lag the traffic by
    // seconds on a loaded guest).
    daemon.caught_up(Duration::from_millis(1500), Duration::from_mins(1))?;
    daemon.status()
}

#[test]
#[allow(clippy::too_many_lines, reason = "one scenario: the burst, the flood, and what must hold after it")]
fn a_failure_burst_survives_ten_thousand_successes() -> Result<()> {
    let topo = Topology::pair("vburst")?;
    let dir = tempfile::tempdir()?;
    let _nginx = start_nginx(&topo, dir.path(), 3)?;
    // Reuses count from 50 ms of silence, so the flood below is reuses.
    let daemon = Daemon::start(&["--min-idle", "50ms"])?;
    let dest = format!("{}:8080", topo.server_v4);
    // The burst: 8 pools reuse once at 2 s (fine) and once at 3.5 s, after
    // nginx's 3 s keep-alive closed the connection.
    let http = script(HTTP_RECONNECTING)?;
    let burst: Vec<_> = (0..8)
        .map(|_| topo.ns.spawn(topo.client, &format!("python3 {} {} 8080 2.0,3.5", http.display(), topo.server_v4)))
        .collect::<Result<_>>()?;
    for c in burst {
        let out = c.wait_with_output()?;
        ensure!(out.status.success(), "burst client: {}", String::from_utf8_lossy(&out.stderr));
    }
    let before = client_row(&settle(&daemon)?, &dest)?;
    ensure!(
        before.counts.failures_window >= 8 && before.judgement.verdict == Verdict::Mismatch,
        "the burst: {before:#?}"
    );
    // The flood: 40 connections x 300 requests, 60 ms apart: 11,960
    // reuses, up to 12,000 when a slow client writes its first request
    // 50 ms or more after connecting (that write is a reuse too). Every one
    // must be counted. (On 6.1 under TCG the daemon drains seconds behind
    // this flood: a table read after a fixed 1.5 s missed up to 19% of the
    // last requests, which is why `settle` waits for the last event.)
    let load = script(HTTP_LOAD)?;
    let out = topo.ns.exec(topo.client, &format!("python3 {} {} 8080 40 300 0.06", load.display(), topo.server_v4))?;
    let counts: Vec<u64> = out.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    let [answered, flood_failed] = counts[..] else { bail!("the load client: {out}") };
    ensure!(answered + flood_failed == 12_000, "every request answered or failed: {out}");
    ensure!(flood_failed <= 120, "the flood itself mostly succeeds: {out}");
    let after = client_row(&settle(&daemon)?, &dest)?;
    eprintln!(
        "MEASURED burst then flood: before [{}, {:?}] point {:?} failures {} verdict {}; after [{}, {:?}] point {:?} failures {} reuses {} verdict {} evidence_bytes {}",
        before.path.lower_seconds,
        before.path.upper_seconds,
        before.path.idle_timeout_seconds,
        before.counts.failures_window,
        before.judgement.verdict.as_str(),
        after.path.lower_seconds,
        after.path.upper_seconds,
        after.path.idle_timeout_seconds,
        after.counts.failures_window,
        after.counts.reuses_window,
        after.judgement.verdict.as_str(),
        after.evidence_bytes
    );
    let flood = after.counts.reuses_window.saturating_sub(before.counts.reuses_window);
    if !(11_960..=12_000).contains(&flood) {
        // What the daemon counted as lost or unresolved, for the message.
        let metrics = observer::surfaces::http::get(&daemon.http_addr()?, "/metrics").map_err(anyhow::Error::msg)?;
        let counts: Vec<String> = String::from_utf8_lossy(&metrics)
            .lines()
            .filter(|l| {
                l.starts_with("observer_events_lost_total")
                    || l.starts_with("observer_reuses_unresolved_total")
                    || l.starts_with("observer_events_total")
            })
            .map(str::to_owned)
            .collect();
        // Per connection of the flood: its reuses, and its other events.
        let mut per: std::collections::BTreeMap<u16, (usize, Vec<String>)> = std::collections::BTreeMap::new();
        for e in daemon.events().iter().filter(|e| e.remote.port() == 8080 && e.role == Role::Client) {
            let slot = per.entry(e.local.port()).or_default();
            if e.kind() == observer::kernel::event::EventKind::Reuse {
                slot.0 += 1;
            } else if slot.1.len() < 6 {
                slot.1.push(format!("{} {:.3}", e.kind().as_str(), e.idle_seconds));
            }
        }
        let few: Vec<_> = per.iter().filter(|(_, (n, _))| (10..299).contains(n)).collect();
        // Runs the kernel skipped because the program was already running
        // on that CPU (`recursion_misses`): evidence lost before any map.
        let misses: Vec<String> = common::sh("bpftool prog show")
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("recursion_misses"))
            .map(str::to_owned)
            .collect();
        bail!(
            "{} reuses after the flood of 11,960 to 12,000 (before {}): {counts:#?}; connections with few reuses: {few:#?}; skipped runs: {misses:#?}; {after:#?}",
            after.counts.reuses_window,
            before.counts.reuses_window
        );
    }
    // No failure evicted, and the flood's own failures (threads starved
    // past nginx's keep-alive under TCG) counted, each of them.
    assert_eq!(after.counts.failures_window, before.counts.failures_window + flood_failed, "no failure evicted");
    // Exactly as before, unless the flood's own failures (more closes at
    // nginx's 3 s) added evidence: then within 2 %.
    let same = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if flood_failed > 0 => (a - b).abs() <= 0.02 * b,
        _ => a == b,
    };
    assert!(
        same(after.path.upper_seconds, before.path.upper_seconds),
        "upper {:?} against {:?}",
        after.path.upper_seconds,
        before.path.upper_seconds
    );
    // The lower bound is the longest idle answered: the flood's requests
    // idle 60 ms or a little more, but a thread starved for seconds on a
    // loaded 2-CPU guest under TCG once reused after 2.30 s, answered (the
    // path allows 3 s). That raises the bound truly; it never passes the
    // failures' upper bound.
    let (lower, upper) = (after.path.lower_seconds, after.path.upper_seconds.unwrap_or(f64::MAX));
    assert!(
        lower >= before.path.lower_seconds && lower < upper,
        "lower bound {lower} against [{}, {upper}]",
        before.path.lower_seconds
    );
    assert!(
        same(after.path.idle_timeout_seconds, before.path.idle_timeout_seconds),
        "point {:?} against {:?}",
        after.path.idle_timeout_seconds,
        before.path.idle_timeout_seconds
    );
    assert_eq!(after.judgement.verdict, Verdict::Mismatch);
    assert!(
        same(
            after.judgement.recommended_pool_idle_timeout_seconds,
            before.judgement.recommended_pool_idle_timeout_seconds
        ),
        "recommended {:?} against {:?}",
        after.judgement.recommended_pool_idle_timeout_seconds,
        before.judgement.recommended_pool_idle_timeout_seconds
    );
    assert!(after.evidence_bytes <= observer::diagnosis::evidence::MAX_BYTES, "{} bytes", after.evidence_bytes);
    Ok(())
}

#[test]
fn rows_and_gauges_expire_with_a_small_window() -> Result<()> {
    let topo = Topology::pair("vwin")?;
    let dir = tempfile::tempdir()?;
    let _nginx = start_nginx(&topo, dir.path(), 2)?;
    let daemon = Daemon::start(&["--window", "6s"])?;
    let dest = format!("{}:8080", topo.server_v4);
    let http = script(HTTP_RECONNECTING)?;
    // Reuses at 1.2 s (fine) and 2.5 s (after nginx's 2 s close).
    topo.ns.exec(topo.client, &format!("python3 {} {} 8080 1.2,2.5,2.5,2.5", http.display(), topo.server_v4))?;
    let rows = settle(&daemon)?;
    let row = client_row(&rows, &dest)?;
    ensure!(row.path.upper_seconds.is_some(), "{row:#?}");
    let addr = daemon.http_addr()?;
    let metrics = || -> Result<String> {
        Ok(String::from_utf8(observer::surfaces::http::get(&addr, "/metrics").map_err(anyhow::Error::msg)?)?)
    };
    let text = metrics()?;
    let gauge = format!("observer_path_idle_timeout_seconds{{destination=\"{dest}\"");
    ensure!(text.contains(&gauge), "{text}");
    // 6 s window plus one slice (0.5 s) and the last events' age.
    std::thread::sleep(Duration::from_secs(8));
    let rows = daemon.status()?;
    assert!(rows.iter().all(|r| r.id.destination != dest), "the row expired: {rows:#?}");
    let text = metrics()?;
    assert!(!text.contains(&gauge), "the gauges went with the row:\n{text}");
    assert!(!text.contains(&format!("destination=\"{dest}\"")), "and every series of the row:\n{text}");
    let evicted = text
        .lines()
        .find_map(|l| l.strip_prefix("observer_destinations_evicted_total "))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .context("observer_destinations_evicted_total")?;
    assert!(evicted >= 1.0, "{evicted}");
    eprintln!("MEASURED small window: row and its series gone 8 s after the last event; evicted_total {evicted}");
    Ok(())
}

#[test]
fn observed_deadlines_and_the_staircase() -> Result<()> {
    let topo = Topology::pair("vdead")?;
    let killing = script(KILLING_SERVER)?;
    let _srv =
        start_server(&topo.ns, topo.server, &format!("python3 -u {} {} 9003 3", killing.display(), topo.server_v4))?;
    let daemon = Daemon::start(&[])?;
    let client = script(ONE_REQUEST_CLIENT)?;
    // Patient clients see the server give up at 3 s; impatient ones give
    // up themselves at 2 s.
    topo.ns.exec(topo.client, &format!("python3 {} {} 9003 3 10", client.display(), topo.server_v4))?;
    topo.ns.exec(topo.client, &format!("python3 {} {} 9003 3 2", client.display(), topo.server_v4))?;
    let dest = format!("{}:9003", topo.server_v4);
    let row = client_row(&settle(&daemon)?, &dest)?;
    eprintln!(
        "MEASURED deadlines: peer_request_deadline {:?} ({} aborted), request_timeout {:?} ({} timed out), verdict {}",
        row.deadlines.peer_request_deadline_seconds,
        row.deadlines.requests_aborted_window,
        row.deadlines.request_timeout_seconds,
        row.deadlines.request_timeouts_window,
        row.judgement.verdict.as_str()
    );
    let peer = row.deadlines.peer_request_deadline_seconds.context("the server's 3 s deadline")?;
    let ours = row.deadlines.request_timeout_seconds.context("our 2 s read timeout")?;
    assert!(common::fired(peer, 3.0, 0.1), "{peer}");
    assert!(common::fired(ours, 2.0, 0.1), "{ours}");
    assert_ne!(row.judgement.verdict, Verdict::Mismatch, "deadlines are no idle evidence: {row:#?}");
    // The path file declares the partner's deadline as 10 s.
    let dir = tempfile::tempdir()?;
    let f = dir.path().join("path.toml");
    std::fs::write(
        &f,
        format!("[[hop]]\nname = \"client\"\nclient = true\ndeadline = \"30s\"\n\n[[hop]]\nname = \"partner\"\ndeadline = \"10s\"\naddress = \"{dest}\"\n"),
    )?;
    let out = Command::new(*OBSERVER)
        .args(["path", "check", "--observed", "--addr", &daemon.http_addr()?])
        .arg(&f)
        .output()?;
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{text}");
    assert!(text.contains("[observed_deadline]") && text.contains("aborted requests after 3"), "{text}");
    assert!(text.contains("[observed_deadline_staircase]") && text.contains("client gives up"), "{text}");
    eprintln!("MEASURED path --observed deadlines:\n{text}");
    Ok(())
}

/// One destination (`ECHO_SERVER`), three clients: a pool reusing after 2, 2.5 and 3 s
/// (fine), a pool that closes its idle connections after 1.5 s (three of
/// them), and one stray reset on a reuse after 1.1 s (below the pool's
/// idle timeout):
/// `python3 HEALTHY_POOLS HOST PORT`.
const HEALTHY_POOLS: &str = r#"
import socket, sys, threading, time
host, port = sys.argv[1], int(sys.argv[2])
def conn():
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(b"hello"); s.recv(100)
    return s
def reuser():
    s = conn()
    for gap in (2.0, 2.5, 3.0, 2.2, 2.8):
        time.sleep(gap)
        s.sendall(b"again"); assert s.recv(100)
    s.close()
def closer():
    s = conn()
    time.sleep(1.5)
    s.close()
ts = [threading.Thread(target=reuser)] + [threading.Thread(target=closer) for _ in range(3)]
for t in ts: t.start()
for t in ts: t.join()
s = conn()
time.sleep(1.1)
s.sendall(b"reset")
try:
    print("stray:", "eof" if not s.recv(100) else "ok", flush=True)
except ConnectionResetError:
    print("stray: reset", flush=True)
"#;

#[test]
fn a_stray_reset_is_no_mismatch_and_withholds_ok() -> Result<()> {
    let topo = Topology::pair("vstray")?;
    let server = script(common::ECHO_SERVER)?;
    let _srv =
        start_server(&topo.ns, topo.server, &format!("python3 -u {} {} 9004", server.display(), topo.server_v4))?;
    let daemon = Daemon::start(&[])?;
    let pools = script(HEALTHY_POOLS)?;
    let out = topo.ns.exec(topo.client, &format!("python3 {} {} 9004", pools.display(), topo.server_v4))?;
    ensure!(out.contains("stray: reset"), "the stray reuse must be reset: {out}");
    let dest = format!("{}:9004", topo.server_v4);
    let row = client_row(&settle(&daemon)?, &dest)?;
    eprintln!(
        "MEASURED stray reset: interval [{}, {:?}] outliers {} pool {:?} failures {} verdict {} evidence {:?}",
        row.path.lower_seconds,
        row.path.upper_seconds,
        row.path.outliers,
        row.pool.idle_timeout_seconds,
        row.counts.failures_window,
        row.judgement.verdict.as_str(),
        row.judgement.evidence
    );
    assert_eq!(row.counts.failures_window, 1, "{row:#?}");
    assert_eq!(row.path.outliers, 1, "{row:#?}");
    // The reset came at 1.1 s idle, below the pool's 1.5 s: one stray is
    // no mismatch, and no `ok` either while a reuse failed at an idle age
    // the pool allows.
    assert_eq!(row.judgement.verdict, Verdict::Unknown, "{row:#?}");
    assert_eq!(row.pool.idle_timeout_seconds.map(|p| (p * 10.0).round()), Some(15.0), "{row:#?}");
    Ok(())
}

/// `python3 HTTP_IDLE HOST PORT N WAIT`: N keep-alive connections, one
/// request each 0.1 s apart, then idle for WAIT s (the peer closes them).
const HTTP_IDLE: &str = r#"
import http.client, sys, time
host, port, n, wait = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
cs = []
for _ in range(n):
    c = http.client.HTTPConnection(host, port, timeout=5)
    c.request("GET", "/"); c.getresponse().read()
    cs.append(c)
    time.sleep(0.1)
time.sleep(wait)
"#;

#[test]
fn an_l4_balancer_over_two_keepalive_timeouts_is_mixed_paths() -> Result<()> {
    let topo = Topology::pair("vmix")?;
    let (d2, d5) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let _short = common::start_nginx_with(&topo, d2.path(), 2, 8081, "")?;
    let _long = common::start_nginx_with(&topo, d5.path(), 5, 8082, "")?;
    // The balancer: port 8080 goes round-robin to the 2 s and the 5 s backend.
    let rules = d2.path().join("lb.nft");
    std::fs::write(
        &rules,
        "table ip lb {\n  chain pre {\n    type nat hook prerouting priority dstnat; policy accept;\n    tcp dport 8080 redirect to numgen inc mod 2 map { 0 : 8081, 1 : 8082 }\n  }\n}\n",
    )?;
    topo.ns.exec(topo.server, &format!("nft -f {}", rules.display()))?;
    let daemon = Daemon::start(&[])?;
    let idle = script(HTTP_IDLE)?;
    topo.ns.exec(topo.client, &format!("python3 {} {} 8080 10 6.5", idle.display(), topo.server_v4))?;
    let dest = format!("{}:8080", topo.server_v4);
    let row = client_row(&settle(&daemon)?, &dest)?;
    let paths: Vec<(f64, f64)> = row.path.mixed_paths.iter().map(|p| (p.idle_timeout_seconds, p.share)).collect();
    eprintln!(
        "MEASURED mixed paths: {paths:?}, point {:?}, verdict {} ({:?}), recommended {:?}",
        row.path.idle_timeout_seconds,
        row.judgement.verdict.as_str(),
        row.judgement.evidence,
        row.judgement.recommended_pool_idle_timeout_seconds
    );
    ensure!(paths.len() == 2, "{row:#?}");
    assert!(common::fired(paths[0].0, 2.0, 0.1), "{paths:?}");
    assert!(common::fired(paths[1].0, 5.0, 0.1), "{paths:?}");
    assert!((paths[0].1 - 0.5).abs() < 0.01 && (paths[1].1 - 0.5).abs() < 0.01, "{paths:?}");
    let rec = row.judgement.recommended_pool_idle_timeout_seconds.context("a number from the smallest")?;
    assert!(common::fired(rec, 1.6, 0.08), "{rec}");
    assert_eq!(row.judgement.verdict, Verdict::Mismatch);
    Ok(())
}

/// A pool that opens `N` connections, exchanges once on each and closes
/// them after `IDLE` s idle: `python3 CLOSING_POOL HOST PORT N IDLE`.
const CLOSING_POOL: &str = r#"
import socket, sys, time
host, port, n, idle = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
cs = []
for _ in range(n):
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(b"hello"); s.recv(100)
    cs.append(s)
time.sleep(idle)
for s in cs: s.close()
"#;

/// How far the kernel's idle ages may lie from a hop's timer (the probes'
/// measurement precision).
const PRECISION: f64 = 0.020;

/// Two paths that forget idle flows silently after 2 s and 4 s
/// ([`Topology::forked`]) to an echo server on `port`; the server (and
/// its script) stop when the second value is dropped.
fn two_silent_paths(tag: &str, port: u16) -> Result<(Topology, (common::Killed, tempfile::TempPath))> {
    let topo = Topology::forked(tag, 2, 4)?;
    let echo = script(common::ECHO_SERVER)?;
    let server =
        start_server(&topo.ns, topo.server, &format!("python3 -u {} {} {port}", echo.display(), topo.server_v4))?;
    Ok((topo, (server, echo)))
}

/// Idle ages spread over [1, 5.5] s by a golden-ratio walk, dealt to
/// `clients` clients: every client sees short and long gaps.
fn walk_gaps(n: u32, clients: usize) -> Vec<String> {
    let all: Vec<f64> = (0..n).map(|k| 1.0 + 4.5 * ((f64::from(k) * 0.618_034) % 1.0)).collect();
    (0..clients)
        .map(|c| all.iter().skip(c).step_by(clients).map(|g| format!("{g:.3}")).collect::<Vec<_>>().join(","))
        .collect()
}

/// Two paths to one destination, as ECMP makes them: half the flows pass
/// a middlebox that forgets idle flows after 2 s, half one that forgets
/// them after 4 s, both silently. Clients reuse after 1 to 5.5 s (read
/// timeout 1.5 s, a new connection after a failure); a pool of the same
/// process closes its idle connections at 3 s, between the two. Every
/// stall the clients saw is counted, both paths are in `mixed_paths`, the
/// interval is the shorter path's, the recommendation at most 0.8 x 2 s
/// (or none, where too few flows below the shorter path's first failure
/// survived to bound it from below), and the verdict `mismatch`, never
/// `ok`.
#[test]
fn two_silent_paths_recommend_for_the_shorter() -> Result<()> {
    let (topo, _server) = two_silent_paths("v2path", 7400)?;
    let host = topo.server_v4.clone();
    let daemon = Daemon::start(&[])?;
    let client = script(common::RECONNECTING_CLIENT)?;
    let pool = script(CLOSING_POOL)?;
    let mut children = Vec::new();
    for g in walk_gaps(84, 6) {
        children.push(topo.ns.spawn(topo.client, &format!("python3 {} {host} 7400 {g} 1.5", client.display()))?);
    }
    let closer = topo.ns.spawn(topo.client, &format!("python3 {} {host} 7400 4 3.0", pool.display()))?;
    let mut records = Vec::new();
    for c in children {
        let out = c.wait_with_output()?;
        ensure!(out.status.success(), "client failed: {}", String::from_utf8_lossy(&out.stderr));
        records.extend(common::client_records(&String::from_utf8_lossy(&out.stdout))?);
    }
    ensure!(closer.wait_with_output()?.status.success(), "the closing pool failed");
    let stalls: Vec<f64> = records.iter().filter(|r| r.result != "ok").map(|r| r.idle).collect();
    let short_stalls = stalls.iter().filter(|&&t| t < 4.0).count();
    ensure!(short_stalls >= 3, "the 2 s path must stall some reuses below 4 s: {records:?}");
    let dest = format!("{host}:7400");
    let r = client_row(&settle(&daemon)?, &dest)?;
    eprintln!(
        "MEASURED two silent paths (2 s, 4 s): clients saw {} stalls in {} reuses ({short_stalls} below 4 s); row: {} failures, interval [{:.3}, {:?}], mixed_paths {:?}, pool {:?}, verdict {}, recommended {:?}, last change {:?}",
        stalls.len(),
        records.len(),
        r.counts.failures_window,
        r.path.lower_seconds,
        r.path.upper_seconds,
        r.path.mixed_paths,
        r.pool.idle_timeout_seconds,
        r.judgement.verdict.as_str(),
        r.judgement.recommended_pool_idle_timeout_seconds,
        r.last_change
    );
    assert_eq!(r.counts.failures_window, u64::try_from(stalls.len())?, "every stall counted: {r:#?}");
    assert_eq!(r.failure_mode, observer::diagnosis::aggregate::FailureMode::SilentDrop, "{r:#?}");
    assert_eq!(r.judgement.verdict, Verdict::Mismatch, "{r:#?}");
    let upper = r.path.upper_seconds.context("an upper bound")?;
    assert!(r.path.lower_seconds - PRECISION <= 2.0 && 2.0 <= upper + PRECISION, "{r:#?}");
    assert_ne!(r.path.lower_basis, Some(observer::diagnosis::table::LowerBasis::Keepalive), "{r:#?}");
    match r.judgement.recommended_pool_idle_timeout_seconds {
        Some(rec) => assert!(rec <= 0.8 * (2.0 + PRECISION), "recommended {rec}"),
        // Which path a flow takes is the router's hash of its port: where
        // too few flows below the shorter path's first failure survived
        // to bound it from below, there is no number, and the words say
        // below which age reuses fail (a host run once advised 3.072 s
        // from the longer path's survivals instead).
        None => assert!(upper < 2.0 + 0.5 && r.judgement.recommendation.contains("shorter of two paths"), "{r:#?}"),
    }
    assert_eq!(r.path.mixed_paths.len(), 2, "{r:#?}");
    let long = &r.path.mixed_paths[1];
    assert!(long.lower_seconds.is_some_and(|l| l > 2.0 && l < 4.0 + PRECISION), "{r:#?}");
    assert!(r.path.mixed_paths.iter().all(|p| p.share > 0.1), "{r:#?}");
    Ok(())
}

/// `observer probe` on the same two silent paths (2 s and 4 s), five
/// runs: each brackets the shorter path's timeout, recommends at most
/// 0.8 x 2 s, and names the longer path (connections alive past the
/// shorter one's first drop). Run as `nobody`: the probe needs no
/// privilege.
#[test]
fn the_probe_brackets_the_shorter_of_two_silent_paths() -> Result<()> {
    let (topo, _server) = two_silent_paths("v2probe", 7401)?;
    let host = topo.server_v4.clone();
    for run in 1..=5 {
        let cmd = format!(
            "setpriv --reuid=nobody --regid=nogroup --clear-groups {} probe {host}:7401 --tcp --up-to 6s --format json --quiet",
            *OBSERVER
        );
        let out = Command::new("ip").args(["netns", "exec", topo.ns.name(topo.client), "sh", "-c", &cmd]).output()?;
        let j: serde_json::Value = serde_json::from_slice(&out.stdout)
            .with_context(|| format!("probe JSON: {}", String::from_utf8_lossy(&out.stderr)))?;
        ensure!(out.status.code() == Some(0), "exit {:?}: {j:#}", out.status.code());
        let lo = j["lower_seconds"].as_f64().context("lower")?;
        let hi = j["upper_seconds"].as_f64().context("upper")?;
        let longer = &j["longer_path"];
        eprintln!(
            "MEASURED probe run {run} on two silent paths (2 s, 4 s): [{lo:.3}, {hi:.3}] s, recommended {}, longer path {longer}, {} connections in {} rounds, {:.1} s",
            j["recommended_pool_idle_timeout_seconds"],
            j["connections"],
            j["rounds"],
            j["elapsed_seconds"].as_f64().unwrap_or_default()
        );
        ensure!(j["how"] == "silent_drop", "{j:#}");
        ensure!(lo - PRECISION <= 2.0 && 2.0 <= hi + PRECISION, "run {run}: [{lo}, {hi}] misses 2 s: {j:#}");
        if let Some(rec) = j["recommended_pool_idle_timeout_seconds"].as_f64() {
            ensure!(rec <= 0.8 * (2.0 + PRECISION), "run {run}: recommended {rec}");
        }
        let l = longer["lower_seconds"].as_f64().with_context(|| format!("run {run}: no longer path named: {j:#}"))?;
        ensure!(l > 2.0 - PRECISION && l < 4.0 + PRECISION, "run {run}: the longer path alive at {l}");
    }
    Ok(())
}

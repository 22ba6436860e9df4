//! End-to-end tests of the per-destination diagnosis (root, real kernel):
//! the FIN, RST and silent-drop paths driven with 20 reuses at gaps spread
//! over [0.5 T, 1.5 T], then `observer status --json` checked against the
//! configured timeout, and `observer analyze` of the daemon's recording
//! checked against the live table.

mod common;

use std::{
    process::{Child, Command},
    time::Duration,
};

use anyhow::{ensure, Context as _, Result};
use common::{
    gaps, script, start_nginx, start_server, Daemon, Killed, Topology, ECHO_SERVER, HTTP_RECONNECTING, IDLE_POOL,
    OBSERVER, RECONNECTING_CLIENT,
};
use observer::{
    diagnosis::aggregate::{Aggregator, Config, DestinationRow, FailureMode, Verdict, VerdictEvidence},
    kernel::event::{EventKind, Outcome, Role, SockEvent},
};

fn wait_all(children: Vec<Child>) -> Result<()> {
    for c in children {
        let out = c.wait_with_output()?;
        ensure!(out.status.success(), "client failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn row<'a>(rows: &'a [DestinationRow], dest: &str) -> Result<&'a DestinationRow> {
    rows.iter()
        .find(|r| r.id.destination == dest && r.id.role == Role::Client)
        .with_context(|| format!("no row for {dest}: {rows:#?}"))
}

/// Idle ages are measured on our side; the hop starts its timer at its own
/// last packet, up to a one-way delay earlier. Containment is checked to the
/// probes' measurement precision (20 ms).
const PRECISION: f64 = 0.020;

/// The diagnosis for a destination whose path times out at `t` seconds.
/// The upper bound is a close or failure the hop's timer caused, seen early
/// only by as much as our client read its last answer late (the idle clock
/// starts at the read), which the time slack widens as it does for
/// `common::fired` (a 6.12 guest under CI's load saw nginx's 2 s close at
/// 1.973 s).
fn check_mismatch(r: &DestinationRow, t: f64, mode: FailureMode) {
    let upper = r.path.upper_seconds.expect("an upper bound");
    assert!(
        r.path.lower_seconds - PRECISION <= t && t <= upper + common::tolerance(PRECISION),
        "interval [{}, {upper}] excludes {t}",
        r.path.lower_seconds
    );
    assert_eq!(r.failure_mode, mode, "{r:#?}");
    assert_eq!(r.judgement.verdict, Verdict::Mismatch, "{r:#?}");
    let rec = r.judgement.recommended_pool_idle_timeout_seconds.expect("a recommendation");
    // Above 0.8 x t by at most 5 % (a close measured late). Below it by
    // what the evidence allows: with no point the recommendation stands on
    // the interval's lower bound, the longest idle a reuse survived, which
    // the clients' gaps put within 5 % of t on the host; under TCG's
    // timing a run once had none past 2.792 s of 3 s (the time slack).
    assert!(rec - 0.8 * t <= 0.05 * 0.8 * t, "recommended {rec}, expected 0.8 x {t}");
    assert!(0.8 * t - rec <= common::tolerance(0.05) * 0.8 * t, "recommended {rec}, expected 0.8 x {t}");
    // The clients make 20 requests after idle. One that meets the hop's
    // close head-on is a failed reuse when the close crosses it, or a
    // `request_aborted` (reuse) when the hop acknowledged it first and
    // closed more than 100 ms later, which emulation (TCG) can stretch to.
    // (A run on the 6.1 VM lost one failed reuse outright: the client read
    // the EOF and closed before nginx's RST was processed, and the write
    // was taken for a `close_notify`. `hooks.rs` now forces that order.)
    assert!(
        r.counts.reuses + r.deadlines.requests_aborted_window >= 20,
        "{} reuses, {} aborted requests",
        r.counts.reuses,
        r.deadlines.requests_aborted_window
    );
}

/// Live table and offline analysis of the recording agree (the at-risk
/// and doomed views are live-only: they come from the kernel's tables).
fn check_analyze_matches(daemon: Daemon, live: &[DestinationRow], recording: &std::path::Path) -> Result<()> {
    let status = daemon.terminate()?;
    ensure!(status.success(), "daemon exit {status}");
    let out = Command::new(*OBSERVER).args(["analyze", "--json"]).arg(recording).output()?;
    ensure!(out.status.success(), "analyze: {}", String::from_utf8_lossy(&out.stderr));
    let mut offline: Vec<DestinationRow> = serde_json::from_slice(&out.stdout)?;
    let mut live = live.to_vec();
    for r in live.iter_mut().chain(offline.iter_mut()) {
        r.sockets.at_risk_idle_sockets = 0;
        r.sockets.doomed_idle_sockets = 0;
        r.sockets.doomed_owners.clear();
    }
    // Server-side rows see the same traffic; compare everything.
    assert_eq!(live, offline, "observer analyze differs from the live daemon");
    for r in live.iter().filter(|r| r.id.role == Role::Client && r.judgement.verdict == Verdict::Mismatch) {
        let n = time_to_diagnosis(recording, &r.id.destination)?;
        eprintln!(
            "MEASURED time to diagnosis for {}: {n} failed reuses before the verdict was mismatch and held",
            r.id.destination
        );
    }
    Ok(())
}

/// Failed reuses the pool suffered until the destination's verdict became
/// `mismatch` and then held to the end, replaying the recording event by
/// event as the live daemon saw it.
fn time_to_diagnosis(recording: &std::path::Path, dest: &str) -> Result<usize> {
    let text = std::fs::read_to_string(recording)?;
    let mut agg = Aggregator::new(Config::default());
    let (mut failures, mut at) = (0, None);
    for line in text.lines() {
        let e: SockEvent = serde_json::from_str(line)?;
        let _ = agg.feed(&e);
        if e.kind() == EventKind::Reuse
            && e.role == Role::Client
            && e.remote.to_string() == dest
            && e.outcome().is_some_and(Outcome::is_failure)
        {
            failures += 1;
        }
        let right = agg
            .rows(e.ts_unix_ns)
            .iter()
            .any(|r| r.id.destination == dest && r.id.role == Role::Client && r.judgement.verdict == Verdict::Mismatch);
        match (right, at) {
            (true, None) => at = Some(failures),
            (false, Some(_)) => at = None,
            _ => {}
        }
    }
    at.with_context(|| format!("{dest} was never diagnosed"))
}

fn summary(name: &str, t: f64, r: &DestinationRow) {
    eprintln!(
        "MEASURED {name}: configured {t} s; interval [{:.3}, {:.3}] s, point {:?}, mode {}, verdict {}, recommended {:?} s, reuses {}, failures {}, aborted requests {}",
        r.path.lower_seconds,
        r.path.upper_seconds.unwrap_or(f64::NAN),
        r.path.idle_timeout_seconds,
        r.failure_mode.as_str(),
        r.judgement.verdict.as_str(),
        r.judgement.recommended_pool_idle_timeout_seconds,
        r.counts.reuses,
        r.counts.failures,
        r.deadlines.requests_aborted_window
    );
}

fn settle(daemon: &Daemon) -> Result<Vec<DestinationRow>> {
    // Held peer closes become evidence after 1 s; the table is read once
    // the daemon has printed its last event (it can lag the traffic by
    // seconds on a loaded guest).
    daemon.caught_up(Duration::from_millis(1500), Duration::from_mins(1))?;
    daemon.status()
}

#[test]
fn fin_path_diagnosed() -> Result<()> {
    // The name the clients send as `Host`, as a partner's would be.
    const NAME: &str = "api.partner.example";
    let topo = Topology::pair("dfin")?;
    let dir = tempfile::tempdir()?;
    let _nginx = start_nginx(&topo, dir.path(), 2)?;
    let echo = script(ECHO_SERVER)?;
    let _echo = start_server(&topo.ns, topo.server, &format!("python3 -u {} {} 9001", echo.display(), topo.server_v4))?;
    let recording = dir.path().join("events.jsonl");
    let daemon = Daemon::start(&["--record", recording.to_str().context("path")?])?;
    let http = script(HTTP_RECONNECTING)?;
    let client = script(RECONNECTING_CLIENT)?;
    let mut children = Vec::new();
    for g in gaps(2.0, 4) {
        children.push(topo.ns.spawn(
            topo.client,
            &format!("env HTTP_HOST={NAME} python3 {} {} 8080 {g}", http.display(), topo.server_v4),
        )?);
    }
    // A second destination the pool reuses well inside any timeout.
    children.push(
        topo.ns
            .spawn(topo.client, &format!("python3 {} {} 9001 1.2,1.2,1.2,1.2 5", client.display(), topo.server_v4))?,
    );
    wait_all(children)?;
    let rows = settle(&daemon)?;
    let r = row(&rows, &format!("{}:8080", topo.server_v4))?;
    summary("fin", 2.0, r);
    check_mismatch(r, 2.0, FailureMode::Fin);
    assert_eq!(r.server_names.first().map(|n| n.name.as_str()), Some(NAME), "the Host header names the row");
    let p = r.path.idle_timeout_seconds.context("peer closes should give a point estimate")?;
    assert!(common::fired(p, 2.0, 0.1), "point {p}");
    assert!(
        matches!(r.judgement.evidence, Some(VerdictEvidence::Failures | VerdictEvidence::PeerCloses)),
        "{:?}",
        r.judgement.evidence
    );
    let other = row(&rows, &format!("{}:9001", topo.server_v4))?;
    assert_ne!(other.judgement.verdict, Verdict::Mismatch, "{other:#?}");
    // nginx's own row: its 2 s keep-alive toward clients that reuse up to 3 s.
    let srv = rows
        .iter()
        .find(|x| x.id.destination == format!("{}:8080", topo.server_v4) && x.id.role == Role::Server)
        .with_context(|| format!("no server row: {rows:#?}"))?;
    eprintln!(
        "MEASURED server row: server_idle_timeout {:?}, late_reuses {}, client_max_reuse_idle {:?}, verdict {}, recommended {:?} / raise to {:?}: {}",
        srv.server.server_idle_timeout_seconds,
        srv.server.late_reuses,
        srv.server.client_max_reuse_idle_seconds,
        srv.judgement.verdict.as_str(),
        srv.judgement.recommended_pool_idle_timeout_seconds,
        srv.judgement.recommended_server_idle_timeout_seconds,
        srv.judgement.recommendation
    );
    let t = srv.server.server_idle_timeout_seconds.context("nginx's idle closes form a cluster")?;
    assert!(common::fired(t, 2.0, 0.1), "server idle timeout {t}");
    assert!(srv.server.late_reuses > 0, "{srv:#?}");
    assert_eq!(srv.judgement.verdict, Verdict::ClientsMismatch, "{srv:#?}");
    let rec = srv.judgement.recommended_pool_idle_timeout_seconds.context("a number for the clients")?;
    assert!(common::fired(rec, 1.6, 0.08), "{rec}");
    assert!(srv.judgement.recommendation.starts_with("clients:"), "{}", srv.judgement.recommendation);
    assert_eq!(srv.pool.idle_timeout_seconds, None, "nginx's idle closes are no pool idle timeout");
    check_path_observed(&daemon, &topo.server_v4)?;
    check_analyze_matches(daemon, &rows, &recording)?;
    // Refresh the report fixture and examples from a real run on request.
    if let Ok(to) = std::env::var("OBSERVER_SAVE_RECORDING") {
        std::fs::copy(&recording, &to)?;
    }
    Ok(())
}

/// `observer path check --observed` flags a declared timeout (60 s) that
/// disagrees with the measurement (2 s), and accepts the right one.
fn check_path_observed(daemon: &Daemon, server: &str) -> Result<()> {
    let dir = tempfile::tempdir()?;
    let run = |declared: &str| -> Result<(i32, String)> {
        let f = dir.path().join("path.toml");
        std::fs::write(
            &f,
            format!("[[hop]]\nname = \"client\"\nkind = \"urllib3\"\n\n[[hop]]\nname = \"backend nginx\"\nidle_timeout = \"{declared}\"\naddress = \"{server}:8080\"\n"),
        )?;
        let out = Command::new(*OBSERVER)
            .args(["path", "check", "--observed", "--addr", &daemon.http_addr()?])
            .arg(&f)
            .output()?;
        Ok((out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned()))
    };
    let (code, out) = run("60s")?;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("[observed]") && out.contains("declared with an idle timeout of 60 s"), "{out}");
    // The measurement printed is the point, which lies inside the interval
    // (under TCG nginx's earliest close came at 1.996 s).
    let measured: f64 = out
        .split("but observer measured ")
        .nth(1)
        .and_then(|r| r.split(" s").next())
        .and_then(|v| v.parse().ok())
        .with_context(|| format!("a measured number: {out}"))?;
    assert!((measured - 2.0).abs() <= 0.1, "measured {measured}: {out}");
    let (_, out) = run("2s")?;
    assert!(!out.contains("[observed]") && out.contains("agree"), "{out}");
    eprintln!("MEASURED path --observed: {}", out.lines().find(|l| l.contains("agree")).unwrap_or_default());
    Ok(())
}

/// Connect, exchange once, then sit idle (a pooled connection nobody uses).
const IDLE_HOLDER: &str = r#"
import socket, sys, time
s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
s.sendall(b"hello")
s.recv(100)
time.sleep(120)
"#;

fn routed_scenario(tag: &str, verdict: &str, v6: bool, t: f64, mode: FailureMode) -> Result<()> {
    let topo = Topology::routed(tag, 3, verdict)?;
    let host = if v6 { topo.server_v6.clone() } else { topo.server_v4.clone() };
    let dest = if v6 { format!("[{host}]:9000") } else { format!("{host}:9000") };
    let dest2 = if v6 { format!("[{host}]:9001") } else { format!("{host}:9001") };
    let echo = script(ECHO_SERVER)?;
    let _s1 = start_server(&topo.ns, topo.server, &format!("python3 -u {} {host} 9000", echo.display()))?;
    let _s2 = start_server(&topo.ns, topo.server, &format!("python3 -u {} {host} 9001", echo.display()))?;
    let dir = tempfile::tempdir()?;
    let recording = dir.path().join("events.jsonl");
    let data = dir.path().join("data");
    let daemon = Daemon::start(&[
        "--record",
        recording.to_str().context("path")?,
        "--data-dir",
        data.to_str().context("path")?,
    ])?;
    let client = script(RECONNECTING_CLIENT)?;
    // A pooled connection left idle through the whole scenario: it sits idle
    // past the path timeout, so the live table must count it as at risk.
    let idle = script(IDLE_HOLDER)?;
    let _holder = Killed(topo.ns.spawn(topo.client, &format!("python3 {} {host} 9000", idle.display()))?);
    let mut children = Vec::new();
    for g in gaps(t, 4) {
        children.push(topo.ns.spawn(topo.client, &format!("python3 {} {host} 9000 {g} 2", client.display()))?);
    }
    children.push(topo.ns.spawn(topo.client, &format!("python3 {} {host} 9001 1.5,1.5,1.5 2", client.display()))?);
    wait_all(children)?;
    let rows = settle(&daemon)?;
    let r = row(&rows, &dest)?;
    summary(tag, t, r);
    check_mismatch(r, t, mode);
    assert!(r.sockets.at_risk_idle_sockets >= 1, "the idle pooled connection is at risk: {r:#?}");
    let other = row(&rows, &dest2)?;
    assert_ne!(other.judgement.verdict, Verdict::Mismatch, "{other:#?}");
    check_analyze_matches(daemon, &rows, &recording)?;
    check_store_matches(&recording, &data)?;
    check_report(&data, &dest, t, mode)
}

/// The store the daemon left holds exactly the evidence the aggregator's
/// feed takes from the daemon's recording, event for event: the store
/// never classifies on its own.
fn check_store_matches(recording: &std::path::Path, data: &std::path::Path) -> Result<()> {
    let keys = |flag: &str, path: &std::path::Path| -> Result<Vec<String>> {
        let out = Command::new(*OBSERVER).args(["debug", "evidence-keys", flag]).arg(path).output()?;
        ensure!(out.status.success(), "evidence-keys: {}", String::from_utf8_lossy(&out.stderr));
        let mut k: Vec<String> = String::from_utf8(out.stdout)?.lines().map(str::to_owned).collect();
        k.sort();
        Ok(k)
    };
    let (taken, stored) = (keys("--recording", recording)?, keys("--data-dir", data)?);
    ensure!(!taken.is_empty(), "the run produced no evidence");
    assert_eq!(taken, stored, "the store's evidence differs from the feed's classification of the recording");
    eprintln!("MEASURED store: {} evidence events, the same as the feed took from the recording", stored.len());
    Ok(())
}

/// `observer report` from the store the daemon left behind states the
/// failure mode and an interval containing the configured timeout.
fn check_report(data: &std::path::Path, dest: &str, t: f64, mode: FailureMode) -> Result<()> {
    let out = Command::new(*OBSERVER)
        .args(["report", "--destination", dest, "--format", "json", "--data-dir"])
        .arg(data)
        .output()?;
    ensure!(out.status.success(), "report: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
    let s = &v["summary"];
    assert_eq!(s["failure_mode"], mode.as_str(), "{s}");
    let lower = s["path_idle_timeout_lower_seconds"].as_f64().context("lower")?;
    let upper = s["path_idle_timeout_upper_seconds"].as_f64().context("upper")?;
    assert!(lower - PRECISION <= t && t <= upper + PRECISION, "report interval [{lower}, {upper}] excludes {t}");
    let text = s["failure_mode_text"].as_str().unwrap_or_default();
    let html = Command::new(*OBSERVER).args(["report", "--destination", dest, "--data-dir"]).arg(data).output()?;
    ensure!(html.status.success());
    eprintln!("MEASURED report {dest}: \"{text}\", [{lower:.3}, {upper:.3}] s, html {} bytes", html.stdout.len());
    Ok(())
}

#[test]
fn rst_path_diagnosed() -> Result<()> {
    routed_scenario("drst", "reject with tcp reset", false, 3.0, FailureMode::Rst)
}

#[test]
fn silent_drop_path_diagnosed() -> Result<()> {
    routed_scenario("ddrop", "drop", true, 3.0, FailureMode::SilentDrop)
}

#[test]
fn a_backend_restart_is_no_timeout_evidence() -> Result<()> {
    let topo = Topology::pair("drst")?;
    let echo = script(ECHO_SERVER)?;
    let serve = format!("python3 -u {} {} 9002", echo.display(), topo.server_v4);
    let server = start_server(&topo.ns, topo.server, &serve)?;
    let daemon = Daemon::start(&[])?;
    let pool = script(IDLE_POOL)?;
    let mut client =
        topo.ns.spawn(topo.client, &format!("python3 {} {} 9002 20 10 0.3", pool.display(), topo.server_v4))?;
    let lines = common::lines_of(&mut client)?;
    // Once all 20 are idle (ages 0.3 s apart), restart the server.
    common::wait_line(&lines, "ready", 30.0)?;
    std::thread::sleep(Duration::from_secs(1));
    drop(server);
    let _server = start_server(&topo.ns, topo.server, &serve)?;
    let results = common::wait_line(&lines, " ", 30.0)?;
    let _ = client.wait();
    ensure!(
        results.contains("eof") || results.contains("error"),
        "the reuses after the restart should fail: {results}"
    );
    let rows = settle(&daemon)?;
    let r = row(&rows, &format!("{}:9002", topo.server_v4))?;
    eprintln!(
        "MEASURED restart row: peer_restarts {}, restart_failures {}, failures_window {}, peer_closes {}, point {:?}, interval [{}, {:?}], verdict {}, recommended {:?}, last_change {:?}",
        r.counts.peer_restarts,
        r.counts.restart_failures,
        r.counts.failures_window,
        r.counts.peer_closes_window,
        r.path.idle_timeout_seconds,
        r.path.lower_seconds,
        r.path.upper_seconds,
        r.judgement.verdict.as_str(),
        r.judgement.recommended_pool_idle_timeout_seconds,
        r.last_change
    );
    assert_eq!(r.counts.peer_restarts, 1, "{r:#?}");
    assert_eq!(r.path.idle_timeout_seconds, None, "no point estimate from a restart: {r:#?}");
    assert_eq!(r.path.upper_seconds, None, "no timeout evidence from a restart: {r:#?}");
    assert_eq!(
        r.counts.restart_failures, r.counts.failures_window,
        "every failure is explained by the restart: {r:#?}"
    );
    assert!(r.last_change.is_none(), "{r:#?}");
    assert_ne!(r.judgement.verdict, Verdict::Mismatch, "{r:#?}");
    assert_eq!(r.judgement.recommended_pool_idle_timeout_seconds, None);
    Ok(())
}

/// An echo server that enforces its idle timeout with a once-a-second
/// sweep, as many servers and balancers' timer wheels do: a client idle
/// 2 s or more at a sweep is closed (FIN), so a "2 s" connection is closed
/// anywhere between 2 and 3 s: `python3 SWEEPING_SERVER HOST PORT IDLE`.
const SWEEPING_SERVER: &str = r#"
import socket, sys, threading, time
host, port, idle = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port)); s.listen(128)
last = {}
lock = threading.Lock()
print("ready", flush=True)
def sweep():
    while True:
        time.sleep(1.0)
        now = time.monotonic()
        with lock:
            for c, t in list(last.items()):
                if now - t >= idle:
                    del last[c]
                    try:
                        c.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
def serve(c):
    with lock:
        last[c] = time.monotonic()
    while True:
        try:
            d = c.recv(65536)
        except OSError:
            break
        if not d:
            break
        c.sendall(d)
        with lock:
            if c in last:
                last[c] = time.monotonic()
    with lock:
        last.pop(c, None)
    c.close()
threading.Thread(target=sweep, daemon=True).start()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// A timeout enforced by a once-a-second sweep closes "2 s" connections
/// anywhere in [2, 3] s: survivals and failures interleave there. Run the
/// same schedule against five sweeping servers at once, each on its own
/// port with its own sweep phase (five rows, each estimated on its own, as
/// five fresh daemons would; at once, so the test takes one run's time):
/// a pool without a reader reusing after 1 to 4.5 s. Every row must give
/// the same kind of answer, a spread within [2, 3.2], a recommendation of
/// at most 1.6 s (0.8 x the earliest close), no point outside the
/// interval, and no change of timeout read from the jitter.
#[test]
fn a_swept_timeout_is_one_band_every_run() -> Result<()> {
    let topo = Topology::pair("swept")?;
    let server = script(SWEEPING_SERVER)?;
    let ports: Vec<u16> = (9050..9055).collect();
    let _servers: Vec<Killed> = ports
        .iter()
        .map(|p| start_server(&topo.ns, topo.server, &format!("python3 {} {} {p} 2", server.display(), topo.server_v4)))
        .collect::<Result<_>>()?;
    let client = script(RECONNECTING_CLIENT)?;
    // 24 gaps evenly over [1, 4.5] s, dealt to 4 clients per server.
    let all: Vec<f64> = (0..24).map(|k| 1.0 + 3.5 * (f64::from(k) + 0.5) / 24.0).collect();
    let daemon = Daemon::start(&[])?;
    let mut children = Vec::new();
    for p in &ports {
        for c in 0..4 {
            let g: Vec<String> = all.iter().skip(c).step_by(4).map(|g| format!("{g:.3}")).collect();
            children.push(topo.ns.spawn(
                topo.client,
                &format!("python3 {} {} {p} {} 5", client.display(), topo.server_v4, g.join(",")),
            )?);
        }
    }
    wait_all(children)?;
    let rows = settle(&daemon)?;
    let mut answers = Vec::new();
    for (run, p) in ports.iter().enumerate() {
        let dest = format!("{}:{p}", topo.server_v4);
        let r = row(&rows, &dest)?;
        let [earliest, latest] = r.path.spread_seconds.with_context(|| format!("run {run}: no spread: {r:#?}"))?;
        assert!(
            earliest >= 2.0 - PRECISION && latest <= 3.2 && earliest < latest,
            "run {run}: spread [{earliest}, {latest}]: {r:#?}"
        );
        let rec = r.judgement.recommended_pool_idle_timeout_seconds.with_context(|| format!("run {run}: {r:#?}"))?;
        let upper = r.path.upper_seconds.context("upper")?;
        let p = r.path.idle_timeout_seconds.with_context(|| format!("run {run}: the band's start: {r:#?}"))?;
        assert!(
            p >= r.path.lower_seconds && p <= upper && upper <= earliest,
            "run {run}: point {p} outside [{}, {upper}]",
            r.path.lower_seconds
        );
        assert!(rec <= 1.6 + PRECISION && (rec - 0.8 * p).abs() < 0.002, "run {run}: recommended {rec}, point {p}");
        assert_eq!(r.last_change, None, "run {run}: the sweep's jitter is no change of timeout: {r:#?}");
        assert_eq!(r.judgement.verdict, Verdict::Mismatch, "run {run}: {r:#?}");
        answers.push(format!(
            "[{earliest:.3}, {latest:.3}] point {:?} interval [{:.3}, {upper:.3}] rec {rec:.3} ({} closes, {} failures of {} reuses)",
            r.path.idle_timeout_seconds,
            r.path.lower_seconds,
            r.path.point_evidence,
            r.counts.failures_window,
            r.counts.reuses_window
        ));
    }
    eprintln!("MEASURED swept 2 s timeout, five runs: {answers:#?}");
    Ok(())
}

/// Two client namespaces reach one server address (a bridge in the
/// server's namespace): one reuses past the server's 2 s idle timeout, the
/// other well inside it. Two rows; a report per namespace with only that
/// namespace's evidence, and an error naming both without `--netns`;
/// `path check --observed` compares the chosen namespace's row, or asks.
#[test]
fn one_address_from_two_namespaces_is_two_rows_and_two_reports() -> Result<()> {
    let ns = common::Netns::create("twons", 3)?;
    let (a, b, s) = (ns.name(0).to_owned(), ns.name(1).to_owned(), ns.name(2).to_owned());
    let sh = common::sh;
    sh(&format!(
        "ip -n {s} link add br0 type bridge && ip -n {s} addr add 10.201.1.1/24 dev br0 && ip -n {s} link set br0 up"
    ))?;
    for (n, ip, port) in [(&a, "10.201.1.2", "pa"), (&b, "10.201.1.3", "pb")] {
        sh(&format!("ip -n {n} link add c0 type veth peer name {port} netns {s}"))?;
        sh(&format!("ip -n {s} link set {port} master br0 && ip -n {s} link set {port} up"))?;
        sh(&format!("ip -n {n} addr add {ip}/24 dev c0 && ip -n {n} link set c0 up"))?;
    }
    let inode = |i: usize| -> Result<u32> { Ok(ns.exec(i, "stat -L -c %i /proc/self/ns/net")?.trim().parse()?) };
    let (ino_a, ino_b) = (inode(0)?, inode(1)?);
    let echo = script(ECHO_SERVER)?;
    let _srv = start_server(&ns, 2, &format!("python3 -u {} 10.201.1.1 9060 2", echo.display()))?;
    let data = tempfile::tempdir()?;
    let daemon = Daemon::start(&["--data-dir", data.path().to_str().context("path")?])?;
    let client = script(RECONNECTING_CLIENT)?;
    let failing: Vec<String> = (0..10).map(|k| format!("{:.2}", 1.0 + 0.25 * f64::from(k))).collect();
    let children = vec![
        ns.spawn(0, &format!("python3 {} 10.201.1.1 9060 {} 5", client.display(), failing.join(",")))?,
        ns.spawn(1, &format!("python3 {} 10.201.1.1 9060 1.0,1.0,1.0,1.0,1.0,1.0 5", client.display()))?,
    ];
    wait_all(children)?;
    let rows = settle(&daemon)?;
    let dest = "10.201.1.1:9060";
    let mine: Vec<&DestinationRow> =
        rows.iter().filter(|r| r.id.destination == dest && r.id.role == Role::Client).collect();
    ensure!(mine.len() == 2, "one row per namespace: {mine:#?}");
    let ra = mine.iter().find(|r| r.id.netns.inode() == Some(ino_a)).context("namespace A's row")?;
    let rb = mine.iter().find(|r| r.id.netns.inode() == Some(ino_b)).context("namespace B's row")?;
    assert!(ra.counts.failures > 0 && ra.judgement.verdict == Verdict::Mismatch, "{ra:#?}");
    assert_eq!(rb.counts.failures, 0, "{rb:#?}");
    assert_ne!(rb.judgement.verdict, Verdict::Mismatch, "{rb:#?}");
    // Let the store's writer flush (every 500 ms), then report per namespace.
    std::thread::sleep(Duration::from_secs(2));
    let report = |extra: &[&str]| -> Result<std::process::Output> {
        Ok(Command::new(*OBSERVER)
            .args(["report", "--destination", dest, "--format", "json", "--data-dir"])
            .arg(data.path())
            .args(extra)
            .output()?)
    };
    let json = |o: std::process::Output| -> Result<serde_json::Value> {
        ensure!(o.status.success(), "report failed: {}", String::from_utf8_lossy(&o.stderr));
        Ok(serde_json::from_slice(&o.stdout)?)
    };
    let (sa, sb) = (ino_a.to_string(), ino_b.to_string());
    let rep_a = json(report(&["--netns", &sa])?)?;
    let rep_b = json(report(&["--role", "client", "--netns", &sb])?)?;
    assert_eq!(rep_a["netns"], serde_json::json!(ino_a));
    assert_eq!(rep_a["summary"]["failures"].as_u64(), Some(ra.counts.failures), "{rep_a:#}");
    assert_eq!(rep_a["summary"]["reuses"].as_u64(), Some(ra.counts.reuses), "{rep_a:#}");
    assert_eq!(rep_b["netns"], serde_json::json!(ino_b));
    assert_eq!(rep_b["summary"]["failures"].as_u64(), Some(0), "only B's evidence: {rep_b:#}");
    assert_eq!(rep_b["summary"]["reuses"].as_u64(), Some(rb.counts.reuses), "{rep_b:#}");
    let asked = report(&[])?;
    let err = String::from_utf8_lossy(&asked.stderr);
    assert!(!asked.status.success() && err.contains(&sa) && err.contains(&sb), "asks which: {err}");
    // path check: a hop declared at 60 s at that address.
    let path = data.path().join("path.toml");
    std::fs::write(
        &path,
        format!("[[hop]]\nname = \"pool\"\nclient = true\n\n[[hop]]\nname = \"server\"\nidle_timeout = \"60s\"\naddress = \"{dest}\"\n"),
    )?;
    let addr = daemon.http_addr()?;
    let check = |extra: &[&str]| -> Result<serde_json::Value> {
        let o = Command::new(*OBSERVER)
            .args(["path", "check", "--observed", "--output", "json", "--addr", &addr])
            .arg(&path)
            .args(extra)
            .output()?;
        ensure!(o.stdout.starts_with(b"{"), "path check: {}", String::from_utf8_lossy(&o.stderr));
        Ok(serde_json::from_slice(&o.stdout)?)
    };
    let observed = |v: &serde_json::Value| {
        v["violations"].as_array().map_or(0, |a| a.iter().filter(|x| x["rule"] == "observed").count())
    };
    let pa = check(&["--netns", &sa])?;
    assert_eq!(observed(&pa), 1, "A measured 2 s against 60 s declared: {pa:#}");
    let pb = check(&["--netns", &sb])?;
    assert_eq!(observed(&pb), 0, "B proved only survivals: {pb:#}");
    let p = check(&[])?;
    assert_eq!(observed(&p), 0, "no row picked by chance: {p:#}");
    let note = p["notes"].to_string();
    assert!(note.contains("not compared") && note.contains(&sa) && note.contains(&sb), "{note}");
    eprintln!(
        "MEASURED two namespaces: A {ino_a}: {} reuses, {} failures, point {:?}; B {ino_b}: {} reuses, 0 failures; report without --netns: {}",
        ra.counts.reuses,
        ra.counts.failures,
        ra.path.idle_timeout_seconds,
        rb.counts.reuses,
        err.trim()
    );
    Ok(())
}

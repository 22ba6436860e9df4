//! `cargo xtask soak --minutes N`: one daemon's store and recording through
//! mixed loopback traffic (pools a server's 2 s idle timeout fails, steady
//! successes, a backend restarted every 40 s), two SIGTERM restarts, one
//! `kill -9`, a scrape storm and a disk-full window (the data directory on
//! a small tmpfs, filled, then freed). At the end it checks:
//!
//! - the live table equals `observer analyze` over the run's recording
//!   (verdict, failure mode, bounds and window counts, per row), up to the
//!   evidence the `kill -9` cost;
//! - the evidence stored plus the losses counted equal the evidence
//!   delivered (the recording's), up to what the `kill -9` cost, all of it
//!   within the README's one-second bound;
//! - the daemon's RSS stayed within 64 MiB.
//!
//! Figures go to `target/bench/soak.json`, which `BENCHMARKS.md` reports.

use std::{
    collections::{BTreeMap, BTreeSet},
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering},
        Arc, Mutex,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _, Result};
use serde_json::{json, Value};

use crate::bench::{http_get, metric_sum, rss_kib, sh, shipped_bin, Observer};

/// The RSS target the soak holds the daemon to.
const RSS_TARGET_KIB: u64 = 64 * 1024;
/// The daemon's `--store-give-up` here: a third of the disk-full window
/// at most, so the window gives records up.
const GIVE_UP: Duration = Duration::from_secs(5);
/// What a `kill -9` may lose (README: the evidence of the last second).
const KILL_BOUND_NS: u64 = 1_000_000_000;

/// The tests' echo server (`python3 ECHO HOST PORT [IDLE_TIMEOUT]`;
/// prints `ready`), one script for both.
const ECHO: &str = include_str!("../../observer/tests/common/echo_server.py");

struct Server(Child);

impl Server {
    fn start(script: &Path, port: u16, idle: Option<f64>) -> Result<Self> {
        let mut cmd = Command::new("python3");
        cmd.arg(script).arg("127.0.0.1").arg(port.to_string());
        if let Some(i) = idle {
            cmd.arg(i.to_string());
        }
        let mut child = cmd.stdout(Stdio::piped()).stderr(Stdio::null()).spawn().context("python3")?;
        let mut out = child.stdout.take().context("stdout")?;
        let mut buf = [0u8; 6];
        out.read_exact(&mut buf).context("the echo server did not get ready")?;
        Ok(Self(child))
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Keep-alive clients of one server: write, read the echo, stay idle the
/// next gap of `gaps`, again; a failed reuse reconnects.
fn clients(port: u16, n: usize, gaps: &'static [f64], stop: &Arc<AtomicBool>) -> Vec<thread::JoinHandle<u64>> {
    (0..n)
        .map(|k| {
            let stop = Arc::clone(stop);
            thread::spawn(move || {
                let mut reuses = 0;
                let mut g = k;
                thread::sleep(Duration::from_millis(97 * k as u64));
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
                        thread::sleep(Duration::from_millis(200));
                        continue;
                    };
                    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                    let mut buf = [0u8; 16];
                    loop {
                        if stop.load(Ordering::Relaxed) {
                            return reuses;
                        }
                        if s.write_all(b"ping").is_err() || !matches!(s.read(&mut buf), Ok(n) if n > 0) {
                            break;
                        }
                        reuses += 1;
                        g += 1;
                        thread::sleep(Duration::from_secs_f64(gaps[g % gaps.len()]));
                    }
                }
                reuses
            })
        })
        .collect()
}

/// A free loopback port below Linux's ephemeral range, as most real
/// servers' are (the daemons started after the connections tell their
/// roles from the listeners they walk, and from the ports where they
/// cannot: there a server on an ephemeral port above its clients' would
/// read as the client).
fn free_port() -> Result<u16> {
    // Each call starts past the last one's: a port just probed is free
    // until its server binds it.
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let turn = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let offset = std::process::id().wrapping_mul(7).wrapping_add(turn * 97);
    (0..10_000u32)
        .filter_map(|i| u16::try_from(20_000 + (offset.wrapping_add(i)) % 10_000).ok())
        .find(|&p| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok())
        .context("no free loopback port in 20000..30000")
}

/// The loss counters a daemon exported so far.
fn losses(o: &Observer) -> Result<BTreeMap<&'static str, u64>> {
    let m = o.metrics()?;
    Ok(["store_error", "store_backlog", "record_error"]
        .into_iter()
        .map(|r| {
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "a counter's value")]
            let n = metric_sum(&m, "observer_events_lost_total", &format!("reason=\"{r}\"")) as u64;
            (r, n)
        })
        .collect())
}

fn add(total: &mut BTreeMap<&'static str, u64>, more: &BTreeMap<&'static str, u64>) {
    for (k, v) in more {
        *total.entry(k).or_default() += v;
    }
}

fn keys(args: &[&str]) -> Result<Vec<(u64, String)>> {
    let out = Command::new(shipped_bin()).args(["debug", "evidence-keys"]).args(args).output()?;
    ensure!(out.status.success(), "evidence-keys: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| Some((l.split(' ').next()?.parse().ok()?, l.to_owned())))
        .collect())
}

/// The fields of a row the soak compares.
fn digest(rows: &Value) -> BTreeMap<String, Value> {
    rows.as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let key = format!("{} {} {}", r["destination"], r["role"], r["netns"]);
            let v = json!({
                "verdict": r["verdict"], "failure_mode": r["failure_mode"],
                "lower": r["path_idle_timeout_lower_seconds"], "upper": r["path_idle_timeout_upper_seconds"],
                "reuses_window": r["reuses_window"], "failures_window": r["failures_window"],
                "peer_closes_window": r["peer_closes_window"],
            });
            (key, v)
        })
        .collect()
}

struct Mount(PathBuf);
impl Drop for Mount {
    fn drop(&mut self) {
        let _ = sh(&format!("umount -l {}", self.0.display()));
    }
}

#[allow(clippy::too_many_lines, reason = "one scenario told in order")]
#[allow(clippy::cast_precision_loss, reason = "KiB shown as MiB")]
pub fn run(minutes: f64) -> Result<()> {
    let total = Duration::from_secs_f64(minutes * 60.0);
    let root = crate::workspace_root().join("target/soak");
    let mnt = root.join("mnt");
    // A soak stopped before its end can leave its tmpfs mounted; the
    // directory then cannot be removed, and its old recording would be read
    // as this run's.
    let mounted = |p: &Path| {
        std::fs::read_to_string("/proc/self/mounts")
            .is_ok_and(|m| m.lines().any(|l| l.split_whitespace().nth(1) == p.to_str()))
    };
    for _ in 0..8 {
        if !mounted(&mnt) {
            break;
        }
        sh(&format!("umount -l {}", mnt.display()))?;
    }
    match std::fs::remove_dir_all(&root) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            return Err(e).with_context(|| format!("clearing {} from an earlier soak", root.display()));
        }
        _ => {}
    }
    std::fs::create_dir_all(&mnt)?;
    sh(&format!("mount -t tmpfs -o size=24m observer-soak {}", mnt.display()))?;
    let _mount = Mount(mnt.clone());
    let data = mnt.join("data");
    let rec = root.join("rec.jsonl");
    let echo = root.join("echo.py");
    std::fs::write(&echo, ECHO)?;
    // The disk stays full longer than the store holds a refused batch, so
    // evidence is given up while the daemon runs and must be counted.
    let give_up_flag = GIVE_UP.as_secs().to_string() + "s";
    let args = ["--record", rec.to_str().context("path")?, "--store-give-up", &give_up_flag];
    let (pa, pb) = (free_port()?, free_port()?);
    let _a = Server::start(&echo, pa, Some(2.0))?;
    let b = Arc::new(Mutex::new(Some(Server::start(&echo, pb, None)?)));
    let stop = Arc::new(AtomicBool::new(false));
    let o = Observer::spawn(&shipped_bin(), &args, &data)?;
    let pid = Arc::new(AtomicU32::new(o.pid()));
    let mut daemon = Some(o);
    // Traffic: reuses past the server's 2 s timeout fail, the others pass.
    let mut traffic = clients(pa, 4, &[1.0, 1.5, 2.6, 3.0], &stop);
    traffic.extend(clients(pb, 8, &[1.2], &stop));
    let restarts = Arc::new(AtomicU64::new(0));
    let restarter = {
        let (b, stop, restarts, echo) = (Arc::clone(&b), Arc::clone(&stop), Arc::clone(&restarts), echo.clone());
        thread::spawn(move || {
            let mut last = Instant::now();
            while !stop.load(Ordering::Relaxed) {
                thread::sleep(Duration::from_millis(200));
                if last.elapsed() >= Duration::from_secs(40) {
                    let mut g = b.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    g.take();
                    *g = Server::start(&echo, pb, None).ok();
                    restarts.fetch_add(1, Ordering::Relaxed);
                    last = Instant::now();
                }
            }
        })
    };
    let peak_rss = Arc::new(AtomicU64::new(0));
    let sampler = {
        let (pid, stop, peak) = (Arc::clone(&pid), Arc::clone(&stop), Arc::clone(&peak_rss));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(kib) = rss_kib(pid.load(Ordering::Relaxed)) {
                    peak.fetch_max(kib, Ordering::Relaxed);
                }
                thread::sleep(Duration::from_millis(250));
            }
        })
    };
    let started = Instant::now();
    let at = |f: f64| total.mul_f64(f);
    let wait_until = |t: Duration| {
        if let Some(left) = t.checked_sub(started.elapsed()) {
            thread::sleep(left);
        }
    };
    let mut lost = BTreeMap::new();
    let restart = |daemon: &mut Option<Observer>, lost: &mut BTreeMap<&'static str, u64>, nine: bool| -> Result<u64> {
        let o = daemon.take().context("a daemon runs")?;
        add(lost, &losses(&o)?);
        let killed_at = if nine {
            sh(&format!("kill -9 {}", o.pid()))?;
            let t = now_ns();
            drop(o);
            t
        } else {
            o.stop()?;
            0
        };
        let o = Observer::spawn(&shipped_bin(), &args, &data)?;
        pid.store(o.pid(), Ordering::Relaxed);
        *daemon = Some(o);
        Ok(killed_at)
    };
    println!("soak: {minutes} min; echo servers on {pa} (2 s idle timeout) and {pb} (restarted every 40 s)");
    wait_until(at(0.2));
    restart(&mut daemon, &mut lost, false)?;
    println!("soak: SIGTERM restart 1 at {:.0} s", started.elapsed().as_secs_f64());
    wait_until(at(0.3));
    let storm_answers: u64 = {
        let http = daemon.as_ref().context("daemon")?.http.clone();
        let storm: Vec<_> = (0..200)
            .map(|k| {
                let http = http.clone();
                thread::spawn(move || {
                    let path = if k % 2 == 0 { "/metrics" } else { "/api/v1/destinations" };
                    (0..3).filter(|_| http_get(&http, path).is_ok()).count() as u64
                })
            })
            .collect();
        let answered = storm.into_iter().filter_map(|t| t.join().ok()).sum();
        println!("soak: scrape storm, {answered} of 600 answered");
        answered
    };
    wait_until(at(0.4));
    let disk_full_s = {
        let filler = mnt.join("filler");
        let _ = sh(&format!("dd if=/dev/zero of={} bs=64k 2>/dev/null || true", filler.display()));
        let hold = at(0.15).min(Duration::from_secs(30)).max(GIVE_UP * 3);
        let t = Instant::now();
        thread::sleep(hold);
        let health = http_get(&daemon.as_ref().context("daemon")?.http, "/healthz")?;
        std::fs::remove_file(&filler)?;
        let full_for = t.elapsed().as_secs_f64();
        println!("soak: disk full for {full_for:.0} s; health then: {}", health.trim());
        full_for
    };
    wait_until(at(0.65));
    let kill_ns = restart(&mut daemon, &mut lost, true)?;
    println!("soak: kill -9 at {:.0} s", started.elapsed().as_secs_f64());
    wait_until(at(0.8));
    restart(&mut daemon, &mut lost, false)?;
    println!("soak: SIGTERM restart 2 at {:.0} s", started.elapsed().as_secs_f64());
    wait_until(at(1.0));
    stop.store(true, Ordering::Relaxed);
    let reuses: u64 = traffic.into_iter().filter_map(|t| t.join().ok()).sum();
    let _ = restarter.join();
    // Held peer closes are judged and the last records written.
    thread::sleep(Duration::from_secs(3));
    let o = daemon.take().context("daemon")?;
    let live: Value = serde_json::from_str(&http_get(&o.http, "/api/v1/destinations")?)?;
    add(&mut lost, &losses(&o)?);
    o.stop()?;
    let _ = sampler.join();
    // 1. The live table against the recording's analysis.
    let out = Command::new(shipped_bin()).args(["analyze", "--json"]).arg(&rec).output()?;
    ensure!(out.status.success(), "observer analyze: {}", String::from_utf8_lossy(&out.stderr));
    let analyzed: Value = serde_json::from_slice(&out.stdout)?;
    // 2. Evidence delivered (the recording's) against stored and counted.
    let delivered = keys(&["--recording", rec.to_str().context("path")?])?;
    let stored: BTreeSet<String> =
        keys(&["--data-dir", data.to_str().context("path")?])?.into_iter().map(|k| k.1).collect();
    let recorded: BTreeSet<&String> = delivered.iter().map(|(_, k)| k).collect();
    // Stored but never recorded: the recording's last 100 ms at the kill.
    let unrecorded = stored.iter().filter(|k| !recorded.contains(k)).count() as u64;
    let (mut at_kill, mut missing) = (0u64, Vec::new());
    for (ts, k) in &delivered {
        if !stored.contains(k) {
            if *ts <= kill_ns && kill_ns - ts <= KILL_BOUND_NS {
                at_kill += 1;
            } else {
                missing.push(k.clone());
            }
        }
    }
    let counted = lost.get("store_error").copied().unwrap_or(0) + lost.get("store_backlog").copied().unwrap_or(0);
    let (live_rows, analyzed_rows) = (digest(&live), digest(&analyzed));
    // A row whose evidence the store gave up (the disk-full window) was
    // rebuilt without it at the next restart: it may differ; name them.
    let given_up_dests: BTreeSet<String> =
        missing.iter().filter_map(|k| k.split(' ').nth(3).map(|d| format!("\"{d}\""))).collect();
    let (mut differ, mut differ_given_up) = (Vec::new(), 0u64);
    for (k, a) in &analyzed_rows {
        match live_rows.get(k) {
            Some(l) if l == a => {}
            Some(_) if given_up_dests.iter().any(|d| k.starts_with(d.as_str())) => differ_given_up += 1,
            Some(l) => differ.push(format!("{k}: live {l} analyze {a}")),
            None => differ.push(format!("{k}: not in the live table (analyze {a})")),
        }
    }
    let peak = peak_rss.load(Ordering::Relaxed);
    let result = json!({
        "minutes": minutes, "reuses_made": reuses, "backend_restarts": restarts.load(Ordering::Relaxed),
        "daemon_restarts": 2, "kill_9": 1, "scrape_storm_answered": storm_answers, "scrape_storm_requests": 600,
        "disk_full_seconds": disk_full_s, "evidence_delivered": delivered.len(), "evidence_stored": stored.len(),
        "losses_counted": lost, "lost_at_kill": at_kill, "unrecorded_at_kill": unrecorded,
        "missing_outside_bound": missing.len(),
        "rows": analyzed_rows.len(), "rows_differing": differ.len(), "rows_differing_by_given_up_evidence": differ_given_up, "differences": differ, "peak_rss_kib": peak,
        "peak_rss_mib": peak as f64 / 1024.0,
    });
    let dir = crate::workspace_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join(if minutes >= 5.0 { "soak.json" } else { "soak-short.json" }),
        serde_json::to_string_pretty(&result)?,
    )?;
    println!("soak: {result}");
    ensure!(
        missing.len() as u64 == counted,
        "{} delivered records neither stored nor within the kill bound, {counted} counted as lost: {:?}",
        missing.len(),
        missing.iter().take(5).collect::<Vec<_>>()
    );
    // The kill may cost the live table the evidence it lost; anything
    // else must agree.
    ensure!(
        differ.len() as u64 <= at_kill + unrecorded,
        "the live table differs from analyze in more rows ({}) than the kill cost records ({at_kill} not stored, {unrecorded} not recorded): {differ:#?}",
        differ.len()
    );
    ensure!(storm_answers == 600, "the scrape storm: {storm_answers} of 600 answered");
    let given_up = lost.get("store_error").copied().unwrap_or(0);
    ensure!(
        given_up > 0,
        "the disk was full for {disk_full_s:.0} s, past the {} s give-up, yet nothing was given up: the count above checked nothing",
        GIVE_UP.as_secs()
    );
    ensure!(peak <= RSS_TARGET_KIB, "peak RSS {peak} KiB over {RSS_TARGET_KIB} KiB");
    ensure!(analyzed_rows.len() >= 2, "the soak made rows: {analyzed_rows:?}");
    Ok(())
}

fn now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

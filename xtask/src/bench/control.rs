//! What the benchmarks run beside the load: an `observer run` they start,
//! scrape and stop, the bpftrace equivalent, and the kernel's per-program
//! run-time statistics.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _, Result};
use serde_json::Value;

use super::sh;

/// A running `observer run`, stopped with SIGTERM on drop.
pub(crate) struct Observer {
    pub(crate) child: Child,
    pub(crate) progs: Vec<(String, u32)>,
    pub(crate) http: String,
    /// The daemon's log lines after it said it runs.
    pub(crate) log: mpsc::Receiver<String>,
    pub(crate) _data: PathBuf,
}

/// The shipped build of the daemon (no benchmark harness): the soak and
/// the fleet run it.
pub(crate) fn shipped_bin() -> PathBuf {
    crate::workspace_root().join("target/release/observer")
}

/// The benchmark's build of the daemon (`--features bench`: the empty
/// programs and the SIGUSR1 toggle), copied aside by [`build_bench_daemon`]
/// so the next plain build cannot replace it under a run.
pub(crate) fn observer_bin() -> PathBuf {
    crate::workspace_root().join("target/bench/observer")
}

/// Build the daemon with the `bench` feature and copy it to
/// [`observer_bin`]; the shipped build (`target/release/observer`) has
/// none of the harness, and the next plain build makes it again.
pub(crate) fn build_bench_daemon(toolchain: &str) -> Result<PathBuf> {
    crate::status(
        crate::cargo()
            .args(["build", "--release", "-p", "observer", "--features", "bench"])
            .env("OBSERVER_EBPF_TOOLCHAIN", toolchain),
    )?;
    let built = shipped_bin();
    let bin = observer_bin();
    if let Some(dir) = bin.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    // Copy beside, then rename: a daemon still running from the old copy
    // keeps its file.
    let part = bin.with_extension("part");
    std::fs::copy(&built, &part).with_context(|| format!("copying {} aside", built.display()))?;
    std::fs::rename(&part, &bin).with_context(|| format!("placing {}", bin.display()))?;
    Ok(bin)
}

impl Observer {
    pub(crate) fn start(extra: &[&str], data: &Path) -> Result<Self> {
        Self::start_bin(&observer_bin(), extra, data)
    }

    /// Start on the store that `data` holds.
    pub(crate) fn start_on(extra: &[&str], data: &Path) -> Result<Self> {
        Self::spawn(&observer_bin(), extra, data)
    }

    /// Start the daemon `bin` (another build of observer) on a fresh store.
    pub(crate) fn start_bin(bin: &Path, extra: &[&str], data: &Path) -> Result<Self> {
        let _ = std::fs::remove_dir_all(data);
        Self::spawn(bin, extra, data)
    }

    pub(crate) fn spawn(bin: &Path, extra: &[&str], data: &Path) -> Result<Self> {
        let mut child = Command::new(bin)
            .args(["run", "--metrics-addr", "127.0.0.1:0", "--data-dir"])
            .arg(data)
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting observer")?;
        let err = child.stderr.take().context("stderr")?;
        let (tx, rx) = mpsc::channel::<String>();
        thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    // Keep draining so the daemon never blocks on stderr.
                }
            }
        });
        let mut progs = Vec::new();
        let mut http = String::new();
        let deadline = Instant::now() + Duration::from_mins(1);
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .context("observer did not start")?;
            if let Some(rest) = line.split("(program ").nth(1) {
                let mut p = rest.trim_end_matches(')').split(", id ");
                if let (Some(name), Some(id)) = (p.next(), p.next()) {
                    // The receive probe's kfunc variant (6.2+) is still the
                    // receive probe.
                    progs.push((name.trim_end_matches("_cast").to_owned(), id.parse()?));
                }
            }
            if let Some(rest) = line.split("serving http://").nth(1) {
                rest.split('/').next().unwrap_or_default().clone_into(&mut http);
            }
            if line.contains("observer running") {
                break;
            }
        }
        Ok(Self { child, progs, http, log: rx, _data: data.to_path_buf() })
    }

    /// Detach (`attached` false) or re-attach the send and receive probes
    /// of a daemon started with `--bench-toggle`, and wait until it says
    /// it did (attaching can take seconds: the kernel may wait for an RCU
    /// grace period after the probes were removed).
    pub(crate) fn toggle(&self, attached: bool) -> Result<()> {
        sh(&format!("kill -USR1 {}", self.pid()))?;
        let want = format!("hot-path probes {}", if attached { "attached" } else { "detached" });
        let deadline = Instant::now() + Duration::from_mins(1);
        loop {
            let line = self
                .log
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .with_context(|| format!("observer did not log `{want}`"))?;
            ensure!(!line.contains("ERROR"), "observer: {line}");
            if line.contains(&want) {
                return Ok(());
            }
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    pub(crate) fn metrics(&self) -> Result<String> {
        http_get(&self.http, "/metrics")
    }

    pub(crate) fn stop(mut self) -> Result<()> {
        sh(&format!("kill -TERM {}", self.child.id()))?;
        let st = self.child.wait()?;
        ensure!(st.success(), "observer exited with {st}");
        Ok(())
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut r = ureq::get(format!("http://{addr}{path}")).call().with_context(|| format!("GET {addr}{path}"))?;
    Ok(r.body_mut().with_config().limit(256 * 1024 * 1024).read_to_string()?)
}

/// Sum of a metric's samples whose line contains `filter`.
pub(crate) fn metric_sum(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A running bpftrace script.
pub(crate) struct Bpftrace {
    pub(crate) child: Child,
    pub(crate) progs: Vec<(String, u32)>,
}

pub(crate) fn loaded_progs() -> Result<BTreeMap<u32, (String, u64, u64)>> {
    let v: Value = serde_json::from_str(&sh("bpftool -j prog show")?)?;
    Ok(v.as_array()
        .map(|a| {
            a.iter()
                .filter_map(|p| {
                    let id = u32::try_from(p["id"].as_u64()?).ok()?;
                    Some((
                        id,
                        (
                            p["name"].as_str().unwrap_or("").to_owned(),
                            p["run_time_ns"].as_u64().unwrap_or(0),
                            p["run_cnt"].as_u64().unwrap_or(0),
                        ),
                    ))
                })
                .collect()
        })
        .unwrap_or_default())
}

impl Bpftrace {
    pub(crate) fn start(script: &Path) -> Result<Self> {
        let before = loaded_progs()?;
        let mut child = Command::new("bpftrace")
            .arg(script)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .context("starting bpftrace (Debian package bpftrace)")?;
        let out = child.stdout.take().context("stdout")?;
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_mins(1);
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .context("bpftrace did not attach")?;
            if line.starts_with("Attaching") {
                break;
            }
        }
        thread::sleep(Duration::from_millis(300));
        let progs = loaded_progs()?
            .into_iter()
            .filter(|(id, _)| !before.contains_key(id))
            .map(|(id, (name, _, _))| (name, id))
            .collect();
        Ok(Self { child, progs })
    }

    pub(crate) fn stop(mut self) -> Result<()> {
        sh(&format!("kill -INT {}", self.child.id()))?;
        // bpftrace 0.17 now and then ignores SIGINT while it tears down;
        // the measurement is over either way.
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.child.try_wait()?.is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }
}

impl Drop for Bpftrace {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// ns per run of each program (`run_time_ns / run_cnt`).
#[allow(clippy::cast_precision_loss, reason = "averages")]
pub(crate) fn per_run(progs: &[(String, u32)]) -> Result<BTreeMap<String, (f64, u64)>> {
    let all = loaded_progs()?;
    Ok(progs
        .iter()
        .filter_map(|(name, id)| {
            let (_, t, n) = all.get(id)?;
            Some((name.clone(), (if *n > 0 { *t as f64 / *n as f64 } else { f64::NAN }, *n)))
        })
        .collect())
}

pub(crate) fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("observer-bench-{}-{name}", std::process::id()))
}

//! `cargo xtask bench`: what observer costs the host, measured side by side
//! (no probes / observer / a bpftrace equivalent) in interleaved runs, with
//! results in `BENCHMARKS.md` and `target/bench/results.json`.
//!
//! [`load`], [`control`], [`phases`] (and [`bulk`], [`failed_write`], [`otlp`], [`state_cost`]), [`report`].

use std::{
    path::{Path, PathBuf},
    process::Command,
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _, Result};
use serde_json::{json, Value};

mod bulk;
mod control;
mod failed_write;
mod load;
mod otlp;
mod phases;
mod report;
mod state_cost;

pub(crate) use control::{build_bench_daemon, http_get, metric_sum, shipped_bin, Observer};
pub(crate) use load::hold;
pub(crate) use phases::{
    churn_phase, hot_path, hot_path_interleaved, kernel_cost, memory_phase, names_phase, pipeline_phase, ringbuf_phase,
    rss_kib, startup_phase, status_kib,
};
pub(crate) use report::markdown;
pub(crate) use state_cost::{baseline_binary, hot_cost, state_cost};

/// Settings of one bench run.
pub(crate) struct Plan {
    pub(crate) smoke: bool,
    pub(crate) rounds: usize,
    pub(crate) duration: Duration,
    /// Ping-pongs per layout in the interleaved hot path (each places its
    /// threads anew), and blocks of four windows in each.
    pub(crate) sessions: usize,
    pub(crate) blocks: usize,
    /// One window of the interleaved hot path.
    pub(crate) window: Duration,
    pub(crate) pipeline_events: usize,
    pub(crate) memory_ports: usize,
    pub(crate) memory_per_port: usize,
    /// Clients reading `/metrics` one byte per 10 ms, and for how long.
    pub(crate) slow_readers: usize,
    pub(crate) slow_for: Duration,
    /// Records in the store a start-up replays.
    pub(crate) startup_records: u64,
}

pub(crate) fn sh(cmd: &str) -> Result<String> {
    let out = Command::new("sh").arg("-c").arg(cmd).output().with_context(|| format!("running {cmd}"))?;
    ensure!(out.status.success(), "`{cmd}` failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A distribution-free interval of at least 95% for the median of `sorted`:
/// its k-th smallest and k-th largest value, k the largest with
/// P(Binomial(n, 1/2) < k) <= 2.5%; `None` below 6 values.
pub(crate) fn median_interval(sorted: &[f64]) -> Option<(f64, f64)> {
    let n = u32::try_from(sorted.len()).ok()?;
    let total = 2f64.powi(i32::try_from(n).ok()?);
    let (mut cdf, mut binom, mut k) = (0.0, 1.0, 0usize);
    for j in 0..n {
        cdf += binom / total;
        if cdf > 0.025 {
            break;
        }
        k += 1;
        binom = binom * f64::from(n - j) / f64::from(j + 1);
    }
    (k > 0).then(|| (sorted[k - 1], sorted[sorted.len() - k]))
}

/// min / median / max, and the median's 95% interval.
pub(crate) fn stats(v: &[f64]) -> Value {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let interval = median_interval(&s).map(|(lo, hi)| json!([lo, hi]));
    let med = if s.is_empty() {
        f64::NAN
    } else if s.len() % 2 == 1 {
        s[s.len() / 2]
    } else {
        f64::midpoint(s[s.len() / 2 - 1], s[s.len() / 2])
    };
    json!({"min": s.first().copied().unwrap_or(f64::NAN), "median": med, "median_interval_95": interval, "max": s.last().copied().unwrap_or(f64::NAN), "n": s.len(), "values": v})
}

pub(crate) fn med(v: &Value) -> f64 {
    v["median"].as_f64().unwrap_or(f64::NAN)
}

pub(crate) fn machine() -> Value {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines().find(|l| l.starts_with("model name")).map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
        })
        .unwrap_or_default();
    json!({
        "cores": thread::available_parallelism().map_or(0, std::num::NonZero::get),
        "cpu": cpu,
        "kernel": sh("uname -r").unwrap_or_default().trim(),
        "date_utc": sh("date -u +%Y-%m-%dT%H:%M:%SZ").unwrap_or_default().trim(),
    })
}

/// Rewrite `BENCHMARKS.md` from the last `target/bench/results.json`.
pub fn report_only() -> Result<()> {
    let root = crate::workspace_root();
    let results: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("target/bench/results.json"))
            .context("no target/bench/results.json: run `cargo xtask bench` first")?,
    )?;
    std::fs::write(root.join("BENCHMARKS.md"), markdown(&results))?;
    Ok(())
}

/// Run one phase, with the full plan or the smoke plan, and write its
/// figures to `target/bench/<phase>.json` (`<phase>-smoke.json`).
pub fn run_phase(phase: &str, smoke: bool, baseline: &[(String, PathBuf)], design: &Design) -> Result<()> {
    let plan = design.apply(plan(smoke));
    let value = match phase {
        "hot_path_interleaved" => hot_path_interleaved(&plan)?,
        "memory" => memory_phase(&plan)?,
        "startup" => startup_phase(&plan)?,
        "kernel_cost" => kernel_cost(&plan, &crate::workspace_root().join("bench/idle-bookkeeping.bt"))?,
        "state_cost" => state_cost(&plan, baseline)?,
        "hot_cost" => hot_cost(&plan, baseline)?,
        "names" => names_phase(&plan)?,
        "ring_buffer" => ringbuf_phase(&plan)?,
        "otlp" => otlp::otlp_phase(&plan)?,
        "bulk" => bulk::bulk_phase(&plan)?,
        "failed_write" => failed_write::failed_write_phase(&plan)?,
        other => {
            anyhow::bail!(
                "no bench phase `{other}`; the phases that run alone are hot_path_interleaved, kernel_cost, state_cost, hot_cost, names, ring_buffer, otlp, bulk, failed_write, memory and startup"
            )
        }
    };
    let dir = crate::workspace_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let name = if smoke { format!("{phase}-smoke.json") } else { format!("{phase}.json") };
    std::fs::write(dir.join(&name), serde_json::to_string_pretty(&value)?)?;
    println!("bench: wrote target/bench/{name}");
    Ok(())
}

/// The interleaved hot path's design, where the command line changes it
/// (`--ping-pongs`, `--blocks`, `--window-ms`): more blocks narrow its
/// intervals, at about 1.4 s a block with 250 ms windows.
#[derive(Debug, Default)]
pub struct Design {
    pub ping_pongs: Option<usize>,
    pub blocks: Option<usize>,
    pub window: Option<Duration>,
}

impl Design {
    fn apply(&self, mut plan: Plan) -> Plan {
        plan.sessions = self.ping_pongs.unwrap_or(plan.sessions).max(1);
        plan.blocks = self.blocks.unwrap_or(plan.blocks).max(1);
        plan.window = self.window.unwrap_or(plan.window).max(Duration::from_millis(50));
        plan
    }
}

pub(crate) fn plan(smoke: bool) -> Plan {
    if smoke {
        Plan {
            smoke,
            rounds: 1,
            duration: Duration::from_millis(700),
            sessions: 1,
            blocks: 1,
            window: Duration::from_millis(200),
            pipeline_events: 100_000,
            memory_ports: 10,
            memory_per_port: 20,
            slow_readers: 20,
            slow_for: Duration::from_secs(2),
            startup_records: 20_000,
        }
    } else {
        Plan {
            smoke,
            rounds: 15,
            duration: Duration::from_secs(3),
            // 160 blocks of four 250 ms windows per layout (about 1.4 s a
            // block): the machine's noise comes in bursts, and short blocks
            // both cancel more of it and come in numbers. Threads free to
            // move, here: 20 blocks of 1 s windows gave an interval 11.5
            // points wide; 80 blocks of 250 ms windows, 1.1.
            sessions: 8,
            blocks: 20,
            window: Duration::from_millis(250),
            pipeline_events: 2_000_000,
            memory_ports: 1000,
            memory_per_port: 50,
            slow_readers: 500,
            slow_for: Duration::from_secs(12),
            startup_records: 2_000_000,
        }
    }
}

/// Run everything; with `smoke`, a few seconds of each and no report.
pub fn run(smoke: bool, design: &Design) -> Result<()> {
    let plan = design.apply(plan(smoke));
    let root = crate::workspace_root();
    let bt = root.join("bench/idle-bookkeeping.bt");
    if !Path::new(TRACEFS_EVENTS).exists() {
        sh("mount -t tracefs tracefs /sys/kernel/tracing")?;
    }
    let started = Instant::now();
    let results = json!({
        "smoke": smoke,
        "machine": machine(),
        "hot_path": hot_path(&plan, &bt)?,
        "hot_path_interleaved": hot_path_interleaved(&plan)?,
        "kernel_cost": kernel_cost(&plan, &bt)?,
        "churn": churn_phase(&plan)?,
        "names": names_phase(&plan)?,
        "pipeline": pipeline_phase(&plan)?,
        "ring_buffer": ringbuf_phase(&plan)?,
        "otlp": otlp::otlp_phase(&plan)?,
        "bulk": bulk::bulk_phase(&plan)?,
        "failed_write": failed_write::failed_write_phase(&plan)?,
        "memory": memory_phase(&plan)?,
        "startup": startup_phase(&plan)?,
        "seconds": started.elapsed().as_secs_f64(),
    });
    let dir = root.join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let name = if smoke { "smoke.json" } else { "results.json" };
    std::fs::write(dir.join(name), serde_json::to_string_pretty(&results)?)?;
    println!("bench: wrote target/bench/{name} in {:.0}s", started.elapsed().as_secs_f64());
    if !smoke {
        std::fs::write(root.join("BENCHMARKS.md"), markdown(&results))?;
        println!("bench: wrote BENCHMARKS.md");
    }
    Ok(())
}

pub(crate) const TRACEFS_EVENTS: &str = "/sys/kernel/tracing/events";

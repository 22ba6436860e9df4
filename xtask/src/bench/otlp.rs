//! What the OTLP export costs the daemon: its CPU time and peak memory
//! under the same load with the export off, on (a real rotel collector on
//! loopback, every second, failed reuses as log records too), and on
//! toward a collector that is down, in interleaved rounds.

use std::{
    net::TcpListener,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _, Result};
use serde_json::{json, Value};

use super::{
    control::{metric_sum, tmp, Observer},
    load::PingPong,
    phases::status_kib,
    stats, Plan,
};

/// The daemon's CPU time so far, ns: every live thread's
/// `/proc/PID/task/TID/schedstat` (ns, where `/proc/PID/stat` counts ticks).
fn cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let s = std::fs::read_to_string(task?.path().join("schedstat")).unwrap_or_default();
        total += s.split_whitespace().next().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    }
    Ok(total)
}

fn rotel_agent() -> Result<PathBuf> {
    let find = || {
        Command::new("python3")
            .args(["-c", "import rotel, os; print(os.path.join(os.path.dirname(rotel.__file__), 'rotel-agent'))"])
            .output()
    };
    let mut out = find()?;
    if !out.status.success() {
        println!("bench: installing rotel from PyPI");
        let ok = Command::new("python3").args(["-m", "pip", "install", "-q", "rotel==0.0.1a15"]).status()?;
        ensure!(ok.success(), "pip install rotel failed");
        out = find()?;
    }
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    ensure!(path.exists(), "no rotel-agent at {}", path.display());
    Ok(path)
}

/// A collector that takes everything and keeps nothing.
struct Collector(Child);

impl Collector {
    fn start(port: u16, grpc: u16) -> Result<Self> {
        let child = Command::new(rotel_agent()?)
            .args(["start", "--exporter", "blackhole"])
            .args(["--otlp-http-endpoint", &format!("127.0.0.1:{port}")])
            .args(["--otlp-grpc-endpoint", &format!("127.0.0.1:{grpc}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("starting rotel-agent")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            ensure!(Instant::now() < deadline, "rotel did not listen on {port}");
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self(child))
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

#[allow(clippy::cast_precision_loss, reason = "ns and KiB as rates")]
pub(crate) fn otlp_phase(plan: &Plan) -> Result<Value> {
    let (port, grpc, closed) = (free_port()?, free_port()?, free_port()?);
    let _collector = Collector::start(port, grpc)?;
    let up = format!("http://127.0.0.1:{port}");
    let down = format!("http://127.0.0.1:{closed}");
    let arms: [(&str, Vec<&str>); 3] = [
        ("off", vec![]),
        ("on", vec!["--otlp-endpoint", &up, "--otlp-interval", "1000", "--otlp-logs"]),
        (
            "collector_down",
            vec!["--otlp-endpoint", &down, "--otlp-interval", "1000", "--otlp-timeout", "500", "--otlp-logs"],
        ),
    ];
    let run_for = plan.duration * 4;
    // 2,000 reuses/s on 4 connections: a busy node's evidence.
    let rate = 500.0;
    let mut cpu: [Vec<f64>; 3] = Default::default();
    let mut peak: [Vec<f64>; 3] = Default::default();
    let mut ratio_on: Vec<f64> = Vec::new();
    let mut ratio_down: Vec<f64> = Vec::new();
    let mut failures = 0.0;
    for round in 0..plan.rounds.clamp(2, 6) {
        let mut this = [0.0; 3];
        for k in 0..3 {
            let arm = (round + k) % 3;
            let (name, args) = &arms[arm];
            let o = Observer::start(&[&["--min-idle", "0s"], args.as_slice()].concat(), &tmp("otlp"))?;
            let load = PingPong::start(4, Some(rate), false)?;
            // Past start-up (BTF, the first walk): the steady state only.
            std::thread::sleep(Duration::from_millis(500));
            let before = cpu_ns(o.pid())?;
            let t = Instant::now();
            std::thread::sleep(run_for);
            let used = (cpu_ns(o.pid())? - before) as f64 / t.elapsed().as_secs_f64();
            let hwm = status_kib(o.pid(), "VmHWM:")? as f64;
            load.stop()?;
            if arm == 2 {
                failures += metric_sum(&o.metrics()?, "observer_otlp_export_failures_total", "metrics");
            }
            o.stop()?;
            println!(
                "bench: otlp round {round} {name}: {:.2} % of a CPU, peak RSS {:.1} MiB",
                used / 1e7,
                hwm / 1024.0
            );
            cpu[arm].push(used / 1e7);
            peak[arm].push(hwm / 1024.0);
            this[arm] = used;
        }
        ratio_on.push(this[1] / this[0]);
        ratio_down.push(this[2] / this[0]);
    }
    Ok(json!({
        "reuses_per_second": rate * 4.0,
        "export_interval_seconds": 1,
        "seconds_per_arm": run_for.as_secs_f64(),
        "cpu_percent": {"off": stats(&cpu[0]), "on": stats(&cpu[1]), "collector_down": stats(&cpu[2])},
        "peak_rss_mib": {"off": stats(&peak[0]), "on": stats(&peak[1]), "collector_down": stats(&peak[2])},
        "cpu_ratio_on_to_off": stats(&ratio_on),
        "cpu_ratio_down_to_off": stats(&ratio_down),
        "failed_exports_counted_while_down": failures,
    }))
}

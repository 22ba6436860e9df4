//! Developer tasks: `setup`, `run`, `build`, `test`, `lint`, `dist`, `image`, `bench`
//! (`build`, `dist` and `image` in `package`; what `setup` installs, and the
//! kernel check, in `prereqs`).
//!
//! `setup` is idempotent: it checks each prerequisite first and installs only
//! what is missing, printing what it did.

use std::{
    env,
    path::{Path, PathBuf},
    process::{Command, ExitCode},
    time::Instant,
};

use anyhow::{bail, ensure, Context as _, Result};
use clap::{Parser, Subcommand};
use prereqs::{apt_install, check_kernel, setup, BENCH_PACKAGES};

mod bench;
mod cross;
mod fleet;
mod host;
mod package;
mod prereqs;
mod soak;
mod vm;

#[derive(Parser)]
#[command(name = "xtask", about = "observer developer tasks")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install what building the eBPF crate and running the tests needs.
    Setup,
    /// Set up, build release, and run `observer` as root (default: `run`).
    Run {
        /// Arguments for `observer` (after `--`).
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, then run all unit tests and all root integration tests on
    /// this kernel, then the root suites in a VM with each other kernel.
    Test {
        /// `all` (this kernel, then every VM kernel), `host`, or one VM
        /// kernel (`debian-6.1`).
        #[arg(long, default_value = "all")]
        kernel: String,
        /// Extra arguments for the test harness (after `--`), e.g. a test name filter.
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// `cargo fmt --check` and clippy for the host crates and the eBPF crate.
    Lint,
    /// Build the release binary, for this machine or cross-built for arm64
    /// (`--target aarch64`, into target/aarch64-unknown-linux-gnu/release).
    Build {
        /// `aarch64` (also `arm64`); default: this machine's architecture.
        #[arg(long)]
        target: Option<String>,
    },
    /// Build the release binary and lay out what a package ships in
    /// target/dist (target/dist-aarch64 for `--target aarch64`): the binary,
    /// shell completions, man pages, the systemd unit, the fleet Prometheus
    /// rules and the dashboards.
    Dist {
        /// `aarch64` (also `arm64`); default: this machine's architecture.
        #[arg(long)]
        target: Option<String>,
    },
    /// Build the container image (deploy/container/Containerfile): FROM
    /// scratch with the release binary and the libraries it links, by podman.
    /// `--target aarch64` builds the arm64 image; `--target all` both, and
    /// a manifest list naming them.
    Image {
        /// `aarch64` (also `arm64`) or `all`; default: this machine's architecture.
        #[arg(long)]
        target: Option<String>,
    },
    /// Measure what observer costs the host; writes BENCHMARKS.md and target/bench/results.json.
    Bench {
        /// A few seconds of each measurement, no report (CI).
        #[arg(long)]
        smoke: bool,
        /// Only rewrite BENCHMARKS.md from target/bench/results.json.
        #[arg(long)]
        report_only: bool,
        /// Run one phase (`hot_path_interleaved`, `kernel_cost`, `state_cost`,
        /// `hot_cost`, `names`, `ring_buffer`, `otlp`, `bulk`, `failed_write`, `memory`, `startup`) and write target/bench/<phase>.json,
        /// not the report (development); with --smoke, the smoke plan's sizes.
        #[arg(long, value_name = "PHASE")]
        only: Option<String>,
        /// With `--only state_cost` or `--only hot_cost`: a git revision (built in a worktree
        /// under target/bench) or an `observer` binary whose probes to
        /// compare with, run interleaved with this tree's (repeatable).
        #[arg(long, value_name = "REV_OR_BINARY")]
        baseline: Vec<std::path::PathBuf>,
        /// The interleaved hot path's design: ping-pongs per layout (each
        /// places its threads anew; default 8).
        #[arg(long, value_name = "N")]
        ping_pongs: Option<usize>,
        /// Blocks of four windows (with / without / without / with) per
        /// ping-pong (default 20).
        #[arg(long, value_name = "N")]
        blocks: Option<usize>,
        /// One window of a block, in milliseconds (default 250).
        #[arg(long, value_name = "MS")]
        window_ms: Option<u64>,
    },
    /// One daemon through mixed traffic, two restarts, a kill -9, a scrape
    /// storm and a disk-full window; checks the live table against the
    /// recording, the store plus counted losses against the evidence
    /// delivered, and RSS (target/bench/soak.json from 5 minutes on).
    Soak {
        #[arg(long, default_value_t = 10.0)]
        minutes: f64,
    },
    /// The fleet view at scale: N simulated hosts, each serving the lean
    /// exposition of its own evidence toward M destinations, scraped by one
    /// real Prometheus with the fleet rules loaded; measures its series,
    /// RSS, scrape and rule times, and checks the fleet interval is the
    /// intersection of the hosts' (target/bench/fleet-NxM.json).
    FleetSim {
        /// Hosts; several sizes comma-separated (`50,100,200`), run in turn.
        #[arg(long, default_value = "20")]
        hosts: String,
        #[arg(long, default_value_t = 20)]
        destinations: u32,
    },
    /// Rewrite the examples a reader meets from the real recording
    /// `observer/tests/fixtures/fin-nginx-2s.jsonl`: the reports in
    /// `docs/examples/` and the README's table sample (the `examples` test
    /// fails when they differ from what observer prints).
    Examples,
    /// (internal) hold loopback connections for the memory benchmark.
    #[command(hide = true)]
    BenchHold {
        /// `port:count` runs, comma separated.
        #[arg(long)]
        runs: String,
        #[arg(long)]
        per_port: usize,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.task {
        Task::Setup => setup(true).map(|_| ()),
        Task::Run { args } => run(&args),
        Task::Test { kernel, args } => test(&kernel, &args),
        Task::Lint => lint(),
        Task::Examples => examples(),
        Task::Build { target } => package::build(target.as_deref()),
        Task::Dist { target } => package::dist(target.as_deref()),
        Task::Image { target } => package::image_task(target.as_deref()),
        Task::Bench { report_only: true, .. } => bench::report_only(),
        Task::Bench { smoke, only, baseline, ping_pongs, blocks, window_ms, .. } => {
            let design = bench::Design { ping_pongs, blocks, window: window_ms.map(std::time::Duration::from_millis) };
            bench_task(smoke, only.as_deref(), &baseline, &design)
        }
        Task::BenchHold { runs, per_port } => bench_hold(&runs, per_port),
        Task::Soak { minutes } => soak_task(minutes),
        Task::FleetSim { hosts, destinations } => fleet_task(&hosts, destinations),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map_or_else(|| PathBuf::from("."), Path::to_path_buf)
}

fn cargo() -> Command {
    let mut c = Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

fn status(cmd: &mut Command) -> Result<()> {
    let st = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed with {st}");
    }
    Ok(())
}

fn output_ok(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

fn is_root() -> bool {
    output_ok(Command::new("id").arg("-u")).is_some_and(|s| s.trim() == "0")
}

fn run(args: &[String]) -> Result<()> {
    let toolchain = setup(false)?;
    status(cargo().args(["build", "--release", "-p", "observer"]).env("OBSERVER_EBPF_TOOLCHAIN", &toolchain))?;
    let bin = workspace_root().join("target/release/observer");
    let args: Vec<String> = if args.is_empty() { vec!["run".into()] } else { args.to_vec() };
    let mut cmd = if is_root() {
        Command::new(&bin)
    } else {
        println!("run: not root; using sudo");
        let mut c = Command::new("sudo");
        c.arg(&bin);
        c
    };
    cmd.args(&args);
    let st = cmd.status().with_context(|| format!("starting {}", bin.display()))?;
    if !st.success() {
        bail!("observer exited with {st}");
    }
    Ok(())
}

/// The one marker of the root suites: `observer/Cargo.toml` gives each
/// suite that needs root `required-features = ["root-tests"]`, so plain
/// `cargo test` leaves them out and every build that runs or lints them
/// names this feature.
pub const ROOT_TESTS: &str = "observer/root-tests";

/// `path` with the directory of the interpreter `python3` runs first.
/// Where `python3` is a version manager's shim (pyenv's is a bash script
/// that starts about 20 more processes to choose a version), every Python
/// server and client of the suites pays for it: 6.0 s a start in a TCG
/// guest against 1.5 s for the same interpreter named directly (five
/// starts each, measured in the 6.1 guest). The interpreter, its modules
/// (grpcio, h2) and its tools stay the ones `python3` chooses.
/// Where `python3` is the interpreter itself (Debian's `/usr/bin`), `path`
/// is left as it is.
#[must_use]
pub fn python_first(path: &str) -> String {
    let found = path.split(':').find(|d| Path::new(d).join("python3").is_file());
    let dir = output_ok(
        Command::new("python3")
            .env("PATH", path)
            .args(["-c", "import os, sys; print(os.path.dirname(os.path.realpath(sys.executable)))"]),
    );
    match (found, dir.map(|d| d.trim().to_owned())) {
        (Some(f), Some(d))
            if !d.is_empty() && Path::new(f).canonicalize().ok() != Path::new(&d).canonicalize().ok() =>
        {
            format!("{d}:{path}")
        }
        _ => path.to_owned(),
    }
}

fn ensure_ok(out: &std::process::Output, what: &str) -> Result<()> {
    if !out.status.success() {
        bail!("{what} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

fn test(kernel: &str, args: &[String]) -> Result<()> {
    if !is_root() {
        bail!("`cargo xtask test` runs real-kernel tests and must run as root (CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN); try `sudo -E cargo xtask test`");
    }
    let started = Instant::now();
    let toolchain = setup(true)?;
    let vms: Vec<&vm::Kernel> = match kernel {
        "all" => vm::KERNELS.iter().collect(),
        "host" => Vec::new(),
        name => vec![vm::kernel(name)?],
    };
    let daemon = release_daemon(&toolchain)?;
    let host = kernel == "all" || kernel == "host";
    let image = if host {
        check_kernel()?;
        // The shipped image, for tests/container.rs.
        Some(package::image(&toolchain)?)
    } else {
        None
    };
    // Every build and download first (host suites, guests' suites, kernels,
    // the arm64 userland): nothing compiles while a suite measures time.
    if host {
        status(
            cargo()
                .args(["test", "--workspace", "--all-targets", "--features", ROOT_TESTS, "--no-run"])
                .env("OBSERVER_EBPF_TOOLCHAIN", &toolchain),
        )?;
    }
    let t = Instant::now();
    let guests = vms.into_iter().map(|k| vm::fetch(k, &toolchain)).collect::<Result<Vec<_>>>()?;
    if !guests.is_empty() {
        println!("test: guests' kernels and packages fetched in {:.0}s", t.elapsed().as_secs_f64());
    }
    // The guests build and boot beside the host suites, at the lowest CPU
    // priority: the host suites mostly wait on idle timers, and their
    // timing keeps the CPU it needs (alone, a guest keeps the CPU too).
    let (host_result, guest_result) =
        std::thread::scope(|scope| {
            let guests = scope.spawn(|| {
                if guests.is_empty() {
                    Ok(())
                } else {
                    vm::run_all(guests, &toolchain, &daemon, args, host)
                }
            });
            let host_result = match &image {
                Some(image) => host::suites(&toolchain, image, &daemon, args, started),
                None => Ok(()),
            };
            (host_result, guests.join().unwrap_or_else(|_| Err(anyhow::anyhow!("the guests' thread panicked"))))
        });
    host_result.context("host suites")?;
    guest_result.context("kernel matrix")?;
    if host {
        // Last, alone on the CPU: they load it. The soak and the fleet run
        // the shipped build; the benchmark's own build (the harness's empty
        // programs and toggle) is made only after them.
        soak::run(2.0).context("the two-minute soak")?;
        // The fleet view at a small size: 20 hosts x 20 destinations on a
        // real Prometheus, the fleet interval checked exactly.
        fleet::run(20, 20).context("the fleet simulation (20 hosts x 20 destinations)")?;
        // A few seconds of every benchmark, so it cannot rot (no targets asserted).
        apt_install(BENCH_PACKAGES)?;
        bench::build_bench_daemon(&toolchain)?;
        bench::run(true, &bench::Design::default()).context("benchmark smoke run")?;
    }
    println!("test: all passed in {:.0}s", started.elapsed().as_secs_f64());
    Ok(())
}

/// Build the release daemon, the binary the root suites drive
/// (`OBSERVER_BIN`); returns its path.
fn release_daemon(toolchain: &str) -> Result<std::path::PathBuf> {
    status(cargo().args(["build", "--release", "-p", "observer"]).env("OBSERVER_EBPF_TOOLCHAIN", toolchain))?;
    Ok(workspace_root().join("target/release/observer"))
}

fn bench_task(smoke: bool, only: Option<&str>, baseline: &[std::path::PathBuf], design: &bench::Design) -> Result<()> {
    if !baseline.is_empty() && !matches!(only, Some("state_cost" | "hot_cost")) {
        bail!("--baseline compares probes side by side: give it with --only state_cost (the state-change hook under churn) or --only hot_cost (the hot path under ping-pong)");
    }
    if !is_root() {
        bail!("`cargo xtask bench` loads probes and must run as root");
    }
    // bpftrace, the comparison, finds tracepoints through tracefs, which a
    // fresh machine may not have mounted.
    check_kernel()?;
    let toolchain = setup(true)?;
    apt_install(BENCH_PACKAGES)?;
    bench::build_bench_daemon(&toolchain)?;
    let baseline = baseline.iter().map(|b| bench::baseline_binary(b, &toolchain)).collect::<Result<Vec<_>>>()?;
    match only {
        Some(phase) => bench::run_phase(phase, smoke, &baseline, design),
        None => bench::run(smoke, design),
    }
}

fn soak_task(minutes: f64) -> Result<()> {
    if !is_root() {
        bail!("`cargo xtask soak` loads probes and mounts a tmpfs, and must run as root");
    }
    ensure!(minutes >= 1.0, "--minutes: at least 1 (the scenario's steps need the time)");
    let toolchain = setup(true)?;
    status(cargo().args(["build", "--release", "-p", "observer"]).env("OBSERVER_EBPF_TOOLCHAIN", &toolchain))?;
    soak::run(minutes)
}

fn fleet_task(hosts: &str, destinations: u32) -> Result<()> {
    let sizes = hosts
        .split(',')
        .map(|h| h.trim().parse::<u32>().with_context(|| format!("--hosts: `{h}` is not a number of hosts")))
        .collect::<Result<Vec<_>>>()?;
    let toolchain = setup(false)?;
    apt_install(&["prometheus"])?;
    status(cargo().args(["build", "--release", "-p", "observer"]).env("OBSERVER_EBPF_TOOLCHAIN", &toolchain))?;
    for h in sizes {
        fleet::run(h, destinations)?;
    }
    Ok(())
}

fn bench_hold(runs: &str, per_port: usize) -> Result<()> {
    let runs = runs
        .split(',')
        .map(|r| {
            let (p, n) = r.split_once(':').context("run is port:count")?;
            Ok((p.parse()?, n.parse()?))
        })
        .collect::<Result<Vec<(u16, u16)>>>()?;
    bench::hold(&runs, per_port)
}

fn examples() -> Result<()> {
    let toolchain = setup(false)?;
    status(
        cargo()
            .args(["test", "-p", "observer", "--test", "examples"])
            .env("OBSERVER_EBPF_TOOLCHAIN", &toolchain)
            .env("OBSERVER_UPDATE_EXAMPLES", "1"),
    )?;
    println!("examples: docs/examples/ and the README's sample rewritten from the recording");
    Ok(())
}

fn lint() -> Result<()> {
    let toolchain = setup(false)?;
    status(cargo().args(["fmt", "--all", "--check"]))?;
    status(
        cargo()
            .args(["clippy", "--workspace", "--all-targets", "--features", ROOT_TESTS, "--", "-D", "warnings"])
            .env("OBSERVER_EBPF_TOOLCHAIN", &toolchain),
    )?;
    // The benchmark's build too (its code is behind the `bench` feature);
    // its eBPF side is linted below, so no object is needed here.
    status(
        cargo()
            .args(["clippy", "-p", "observer", "--all-targets", "--features", "bench", "--", "-D", "warnings"])
            .env("AYA_BUILD_SKIP", "1"),
    )?;
    for features in [&[][..], &["--features", "bench"][..]] {
        let mut ebpf = Command::new("rustup");
        ebpf.current_dir(workspace_root())
            .args([
                "run",
                &toolchain,
                "cargo",
                "clippy",
                "-p",
                "observer-ebpf",
                "--release",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
            ])
            .args(features)
            .args(["--", "-D", "warnings"])
            .env("RUSTC_BOOTSTRAP", "1")
            .env_remove("RUSTC")
            .env_remove("CARGO");
        status(&mut ebpf)?;
    }
    println!("lint: clean");
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::{fs, os::unix::fs::PermissionsExt as _, path::Path, process::Command};

    use super::{output_ok, python_first};

    /// A `python3` that is a wrapper (as pyenv's shim is) puts the real
    /// interpreter's directory first; the real interpreter leaves `PATH`
    /// alone.
    #[test]
    fn python_first_skips_a_shim_and_only_a_shim() {
        let real =
            output_ok(Command::new("python3").args(["-c", "import os, sys; print(os.path.realpath(sys.executable))"]))
                .expect("python3 on PATH");
        let real = real.trim();
        let real_dir = Path::new(real).parent().expect("a directory").to_str().expect("UTF-8").to_owned();
        let shim = std::env::temp_dir().join(format!("observer-xtask-shim-{}", std::process::id()));
        fs::create_dir_all(&shim).expect("shim dir");
        let script = shim.join("python3");
        fs::write(&script, format!("#!/bin/sh\nexec {real} \"$@\"\n")).expect("shim");
        fs::set_permissions(&script, fs::Permissions::from_mode(0o755)).expect("chmod");
        let through_shim = format!("{}:/usr/bin:/bin", shim.display());
        let direct = format!("{real_dir}:/usr/bin:/bin");
        let got_shim = python_first(&through_shim);
        let got_direct = python_first(&direct);
        let _ = fs::remove_dir_all(&shim);
        assert_eq!(got_shim, format!("{real_dir}:{through_shim}"));
        assert_eq!(got_direct, direct);
    }
}

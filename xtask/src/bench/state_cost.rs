//! Probes side by side with older builds: the state-change hook under
//! churn (`state_cost`), the hot path under ping-pong (`hot_cost`), and
//! the builds of the revisions they compare with.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{ensure, Result};
use serde_json::{json, Value};

use super::{
    control::{observer_bin, per_run, tmp, Observer},
    load::{churn, pingpong},
    machine, sh, stats, Plan,
};

/// The state-change hook's cost per run under connection churn, side by
/// side: rounds alternate between this tree's build and each `baseline`
/// binary (other probes), the order rotating each round, so all see the
/// same machine; each run also carries the empty program on the same hook,
/// and the figure to compare across machines is the cost over the empty
/// program's (the hardware's share cancels out of it).
pub(crate) fn state_cost(plan: &Plan, baseline: &[(String, PathBuf)]) -> Result<Value> {
    let mut bins = vec![("current".to_owned(), observer_bin())];
    for (name, b) in baseline {
        ensure!(bins.iter().all(|(n, _)| n != name), "--baseline {}: two binaries named {name}", b.display());
        bins.push((name.clone(), b.clone()));
    }
    sh("sysctl -qw kernel.bpf_stats_enabled=1")?;
    let result = (|| -> Result<Value> {
        let mut gross: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut empty: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut rate: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        for round in 0..plan.rounds.max(2) {
            for k in 0..bins.len() {
                let (name, bin) = &bins[(round + k) % bins.len()];
                let o = Observer::start_bin(bin, &["--bench-empty-probes"], &tmp("state-cost"))?;
                let v = churn(2, plan.duration)?;
                let runs = per_run(&o.progs)?;
                o.stop()?;
                let get = |k: &str| runs.get(k).map_or(f64::NAN, |v| v.0);
                let (g, e) = (get("inet_sock_set_state"), get("bench_empty_state"));
                println!("bench: state cost round {round} {name}: {g:.0} ns/run gross, empty {e:.0} ns, {v:.0} connections/s");
                gross.entry(name).or_default().push(g);
                empty.entry(name).or_default().push(e);
                rate.entry(name).or_default().push(v);
            }
        }
        let mut builds = serde_json::Map::new();
        let current = &gross["current"];
        for (name, bin) in &bins {
            let (g, e) = (&gross[name.as_str()], &empty[name.as_str()]);
            // Builds from before `--bench-empty-probes` covered this hook
            // have no empty program of their own: NaN, left out.
            let over: Vec<f64> = g.iter().zip(e).map(|(g, e)| g / e).filter(|r| r.is_finite()).collect();
            let net: Vec<f64> = g.iter().zip(e).map(|(g, e)| g - e).filter(|r| r.is_finite()).collect();
            // Round by round: the same minutes of the machine.
            let to_current: Vec<f64> = g.iter().zip(current).map(|(g, c)| g / c).collect();
            builds.insert(
                name.clone(),
                json!({"binary": bin.display().to_string(), "gross_ns": stats(g), "empty_ns": stats(&e.iter().copied().filter(|x| x.is_finite()).collect::<Vec<_>>()), "net_ns": stats(&net), "over_empty": stats(&over), "ratio_to_current": stats(&to_current), "connections_per_second": stats(&rate[name.as_str()])}),
            );
        }
        Ok(
            json!({"machine": machine(), "client_threads": 2, "seconds_per_run": plan.duration.as_secs_f64(), "rounds": plan.rounds.max(2), "builds": builds}),
        )
    })();
    sh("sysctl -qw kernel.bpf_stats_enabled=0")?;
    result
}

/// The hot path side by side: rounds of a 4-connection ping-pong with no
/// probes and under each build (this tree's first, then each `baseline`),
/// the order rotating each round, with the kernel's run-time accounting on.
/// Per build: the kernel time of every program that ran, per round trip
/// (the empty benchmark programs are not attached here), and the round
/// trips against the same round's run without probes.
pub(crate) fn hot_cost(plan: &Plan, baseline: &[(String, PathBuf)]) -> Result<Value> {
    let mut modes = vec![("none".to_owned(), None), ("current".to_owned(), Some(observer_bin()))];
    for (name, b) in baseline {
        ensure!(modes.iter().all(|(n, _)| n != name), "--baseline {}: two binaries named {name}", b.display());
        modes.push((name.clone(), Some(b.clone())));
    }
    sh("sysctl -qw kernel.bpf_stats_enabled=1")?;
    let result = (|| -> Result<Value> {
        let mut rate: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut kernel: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
        let mut programs: BTreeMap<&str, BTreeMap<String, f64>> = BTreeMap::new();
        for round in 0..plan.rounds.max(2) {
            for k in 0..modes.len() {
                let (name, bin) = &modes[(round + k) % modes.len()];
                let Some(bin) = bin else {
                    let v = pingpong(4, plan.duration)?;
                    println!("bench: hot cost round {round} none: {v:.0} round trips/s");
                    rate.entry(name).or_default().push(v);
                    continue;
                };
                let o = Observer::start_bin(bin, &[], &tmp("hot-cost"))?;
                let before = per_run(&o.progs)?;
                let v = pingpong(4, plan.duration)?;
                let after = per_run(&o.progs)?;
                o.stop()?;
                // What ran during the ping-pong only: start-up (the socket
                // walk, the daemon's own connections) left out.
                let mut total = 0.0;
                let mut sends = 0.0;
                for (prog, (ns, runs)) in &after {
                    let (ns0, runs0) = before.get(prog).copied().unwrap_or((0.0, 0));
                    #[allow(clippy::cast_precision_loss, reason = "run counts far below 2^52")]
                    let (runs, runs0) = (*runs as f64, runs0 as f64);
                    let time = (if ns.is_finite() { ns * runs } else { 0.0 })
                        - (if ns0.is_finite() { ns0 * runs0 } else { 0.0 });
                    total += time;
                    if prog.ends_with("tcp_sendmsg_locked") {
                        sends += runs - runs0;
                    }
                    if runs > runs0 {
                        *programs.entry(name).or_default().entry(prog.clone()).or_default() += time / (runs - runs0);
                    }
                }
                let per_rt = total / (sends / 2.0);
                println!("bench: hot cost round {round} {name}: {v:.0} round trips/s, {per_rt:.0} ns of probes per round trip");
                rate.entry(name).or_default().push(v);
                kernel.entry(name).or_default().push(per_rt);
            }
        }
        let rounds = plan.rounds.max(2);
        let none = &rate["none"];
        let current = &kernel["current"];
        let mut builds = serde_json::Map::new();
        for (name, bin) in modes.iter().skip(1) {
            let n = name.as_str();
            let to_none: Vec<f64> = rate[n].iter().zip(none).map(|(v, z)| v / z).collect();
            let to_current: Vec<f64> = kernel[n].iter().zip(current).map(|(v, c)| v / c).collect();
            #[allow(clippy::cast_precision_loss, reason = "a handful of rounds")]
            let mean_ns: BTreeMap<&String, f64> = programs[n].iter().map(|(p, t)| (p, t / rounds as f64)).collect();
            builds.insert(
                name.clone(),
                json!({"binary": bin.as_ref().map(|b| b.display().to_string()), "kernel_ns_per_round_trip": stats(&kernel[n]), "kernel_to_current": stats(&to_current), "round_trips_per_second": stats(&rate[n]), "ratio_to_none": stats(&to_none), "ns_per_run_mean": mean_ns}),
            );
        }
        Ok(
            json!({"machine": machine(), "connections": 4, "message_bytes": 32, "seconds_per_run": plan.duration.as_secs_f64(), "rounds": rounds, "none_round_trips_per_second": stats(none), "builds": builds}),
        )
    })();
    sh("sysctl -qw kernel.bpf_stats_enabled=0")?;
    result
}

/// An `observer` binary to compare with: `b` itself when it is a file, else
/// `b` as a git revision, built (once) in a worktree under target/bench.
pub fn baseline_binary(b: &Path, toolchain: &str) -> Result<(String, PathBuf)> {
    if b.is_file() {
        let name = b.file_name().map_or_else(|| b.display().to_string(), |n| n.to_string_lossy().into_owned());
        return Ok((name, b.to_path_buf()));
    }
    let rev = b.to_string_lossy().into_owned();
    let root = crate::workspace_root();
    let out = Command::new("git")
        .args(["rev-parse", "--verify", "--short=7"])
        .arg(format!("{rev}^{{commit}}"))
        .current_dir(&root)
        .output()?;
    if !out.status.success() {
        anyhow::bail!("--baseline {rev}: neither a file nor a git revision of this repository");
    }
    let short = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    let tree = root.join("target/bench").join(format!("rev-{short}"));
    let bin = tree.join("target/release/observer");
    if !bin.is_file() {
        if !tree.join("Cargo.toml").is_file() {
            let _ = std::fs::remove_dir_all(&tree);
            crate::status(
                Command::new("git")
                    .args(["worktree", "add", "--detach", "--force"])
                    .arg(&tree)
                    .arg(&short)
                    .current_dir(&root),
            )?;
        }
        println!("bench: building {short} for the comparison");
        // Since the harness left the shipped build, a revision's empty
        // programs come with its `bench` feature; before, with every build.
        let manifest = std::fs::read_to_string(tree.join("observer/Cargo.toml")).unwrap_or_default();
        let features: &[&str] = if manifest.contains("\nbench = [") { &["--features", "bench"] } else { &[] };
        crate::status(
            crate::cargo()
                .args(["build", "--release", "-p", "observer"])
                .args(features)
                .current_dir(&tree)
                .env("CARGO_TARGET_DIR", tree.join("target"))
                .env("OBSERVER_EBPF_TOOLCHAIN", toolchain),
        )?;
    }
    Ok((short, bin))
}

//! The state-change hook side by side with older probes: the
//! `state_cost` phase, and the builds of the revisions it compares with.

#[allow(
    clippy::wildcard_imports,
    reason = "one benchmark split by concern: the parent's imports and siblings' items"
)]
use super::*;

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
        crate::status(
            crate::cargo()
                .args(["build", "--release", "-p", "observer"])
                .current_dir(&tree)
                .env("CARGO_TARGET_DIR", tree.join("target"))
                .env("OBSERVER_EBPF_TOOLCHAIN", toolchain),
        )?;
    }
    Ok((short, bin))
}

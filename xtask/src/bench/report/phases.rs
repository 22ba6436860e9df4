//! The sections of `BENCHMARKS.md` written from phases run on their own
//! (`cargo xtask bench --only PHASE`, `fleet-sim`, `soak`), each from its
//! `target/bench/<phase>.json`: the side-by-side comparisons, the OTLP
//! export, the soak and the fleet.

use std::fmt::Write as _;

use serde_json::Value;

use super::{mmm, ratio};

/// The OTLP export's cost (`cargo xtask bench --only otlp`), when on record.
pub(super) fn otlp_section(s: &mut String) {
    let Some(o) = side_by_side("otlp") else {
        let _ = writeln!(s, "No measurement of the OTLP export on record: run `cargo xtask bench --only otlp`.\n");
        return;
    };
    let _ = writeln!(
        s,
        "### 9. OTLP export, off against on\n\n`cargo xtask bench --only otlp`: the daemon under {} reuses/s (4 loopback ping-pong connections, `--min-idle 0s`) for {} s per arm, with the export off, on (a real rotel collector on loopback, every {} s, 60 times the default rate, log records on), and on toward a collector that is down (a closed port, 500 ms timeout), the arms' order rotating each round. CPU is the daemon's threads' run time (`schedstat`) per second; median [95% interval of the median].\n\n| | off | on | collector down |\n|---|---|---|---|\n| daemon CPU, % of one CPU | {} | {} | {} |\n| peak RSS, MiB | {} | {} | {} |\n\nCPU on / off, per round: {}; down / off: {}. Failed exports counted while the collector was down: {}.\n",
        o["reuses_per_second"],
        o["seconds_per_arm"],
        o["export_interval_seconds"],
        med_ci(&o["cpu_percent"]["off"], 2),
        med_ci(&o["cpu_percent"]["on"], 2),
        med_ci(&o["cpu_percent"]["collector_down"], 2),
        med_ci(&o["peak_rss_mib"]["off"], 1),
        med_ci(&o["peak_rss_mib"]["on"], 1),
        med_ci(&o["peak_rss_mib"]["collector_down"], 1),
        med_ci(&o["cpu_ratio_on_to_off"], 3),
        med_ci(&o["cpu_ratio_down_to_off"], 3),
        o["failed_exports_counted_while_down"],
    );
}

/// Bulk transfer's cost (`cargo xtask bench --only bulk`, or the full
/// run's), when on record.
pub(super) fn bulk_section(s: &mut String, full: Option<&Value>) {
    let Some(b) = full.filter(|b| b.is_object()).cloned().or_else(|| side_by_side("bulk")) else {
        let _ = writeln!(s, "No measurement of bulk transfer on record: run `cargo xtask bench --only bulk`.\n");
        return;
    };
    let per_mb = b["per_mb"].as_object().map_or_else(String::new, |m| {
        m.iter()
            .map(|(k, v)| {
                format!(
                    "`{k}` {:.1} runs at {:.0} ns",
                    v["runs"].as_f64().unwrap_or(f64::NAN),
                    v["ns_per_run"].as_f64().unwrap_or(f64::NAN)
                )
            })
            .collect::<Vec<_>>()
            .join(", ")
    });
    let _ = writeln!(
        s,
        "### 10. Bulk transfer\n\n`cargo xtask bench --only bulk`: {} loopback streams that never stop, each writing {} KiB at a time into a reader that discards them; one daemon (`--bench-toggle`) whose send and receive probes (in bulk, the only programs that run per byte) are detached and re-attached between {} s windows, in {} blocks of four (with, without, without, with); median [95% interval of the median].\n\n| | with the probes | without |\n|---|---|---|\n| MB/s | {} | {} |\n\nWith / without, per block: {} (target: at least 0.99). Per MB transferred (the shipped daemon, a separate run with the kernel's BPF statistics on, {:.0} MB): {per_mb}; {:.0} ns of probe time per MB in all.\n",
        b["streams"],
        b["write_bytes"].as_u64().unwrap_or(0) / 1024,
        b["seconds_per_window"],
        b["blocks"],
        med_ci(&b["mb_per_second"]["with_probes"], 0),
        med_ci(&b["mb_per_second"]["without"], 0),
        med_ci(&b["ratio_with_to_without"], 4),
        b["mb_counted"].as_f64().unwrap_or(f64::NAN),
        b["probe_ns_per_mb"].as_f64().unwrap_or(f64::NAN),
    );
}

/// The failed-write hook's cost while attached (`cargo xtask bench --only
/// failed_write`, or the full run's), when on record.
pub(super) fn failed_write_section(s: &mut String, full: Option<&Value>) {
    let Some(f) = full.filter(|f| f.is_object()).cloned().or_else(|| side_by_side("failed_write")) else {
        let _ = writeln!(
            s,
            "No measurement of the failed-write hook on record: run `cargo xtask bench --only failed_write`.\n"
        );
        return;
    };
    let _ = writeln!(
        s,
        "### 11. The failed-write hook attached\n\n`cargo xtask bench --only failed_write`: one shipped daemon (`tp_btf` set), {} loopback ping-pong connections that never stop, and a client socket its peer reset after 1.3 s idle, held unused (a pool holding a dead connection until its next use) so the daemon attaches `sock_send_length`, which then runs on every `sendmsg` of the host; then closed, so it detaches it. Blocks of four {} s windows (attached, detached, detached, attached); median [95% interval of the median].\n\n| | attached | detached |\n|---|---|---|\n| round trips/s | {} | {} |\n\nAttached / detached, per block: {}. The hook's own cost: {:.1} ns per run ({} runs, BPF statistics on), on every `sendmsg` of the host while attached. `observer_failed_write_hook_attached` said attached {} s after the reset and detached {} s after the close (the daemon keeps the hook 5 s after the last dead socket is gone; the gauge itself lags by up to a second). It stays attached as long as a pool holds a socket reset while idle, plus those 5 s: by seed 001's numbers (a pool keeping connections 5 minutes idle behind a hop that ends them at 60 s, were that hop to reset them), up to 245 s per death, unless the pool uses or evicts the socket sooner.\n",
        f["connections"],
        f["seconds_per_window"],
        med_ci(&f["round_trips_per_second"]["attached"], 0),
        med_ci(&f["round_trips_per_second"]["detached"], 0),
        med_ci(&f["ratio_attached_to_detached"], 4),
        f["hook_ns_per_run"].as_f64().unwrap_or(f64::NAN),
        f["hook_runs_counted"],
        med_ci(&f["seconds_to_attach_after_the_reset"], 2),
        med_ci(&f["seconds_to_detach_after_the_close"], 2),
    );
}

/// Least squares `y = a + b x`.
fn fit(points: &[(f64, f64)]) -> Option<(f64, f64)> {
    #[allow(clippy::cast_precision_loss, reason = "a handful of points")]
    let n = points.len() as f64;
    let (sx, sy) = points.iter().fold((0.0, 0.0), |(a, b), (x, y)| (a + x, b + y));
    let (mx, my) = (sx / n, sy / n);
    let sxx: f64 = points.iter().map(|(x, _)| (x - mx) * (x - mx)).sum();
    let sxy: f64 = points.iter().map(|(x, y)| (x - mx) * (y - my)).sum();
    (points.len() >= 2 && sxx > 0.0).then(|| (my - sxy / sxx * mx, sxy / sxx))
}

/// The fleet section, from the `cargo xtask fleet-sim` runs on disk
/// (`target/bench/fleet-*.json`).
pub(super) fn fleet_section(s: &mut String) {
    let runs = crate::fleet::results(&crate::workspace_root().join("target/bench"));
    let _ = writeln!(s, "\n## Fleet scale (a real Prometheus)\n");
    if runs.is_empty() {
        let _ = writeln!(s, "No fleet simulation on record: run `cargo xtask fleet-sim --hosts 50,100,200 --destinations 100`, then `cargo xtask bench --report-only`.");
        return;
    }
    let _ = writeln!(s, "`cargo xtask fleet-sim --hosts N --destinations M`: N simulated hosts, each serving the lean exposition (`observer analyze -o prometheus`) of its own evidence toward the same M destinations (survivals, failures and, at every other destination, peer closes; at every tenth destination one host in seven has a different path, its interval wholly below the others'); one Prometheus ({}) scrapes all of them every {} s with `deploy/prometheus/observer-rules.yml` loaded, read after every target was up, the rules had run, and {} more scrapes. *Host series* counts every series of the hosts' job in Prometheus (with `up` and the scrape's own five per target). The fleet check compares, for every destination, the recorded lower, upper and point with the max, min and min over the hosts' expositions: it must be exact.\n", prometheus_version(), runs[0]["scrape_interval_seconds"], runs[0]["scrapes_before_reading"]);
    let _ = writeln!(s, "| hosts x destinations | host series (per destination) | Prometheus head series | Prometheus RSS (peak) | scrape duration avg / max | fleet rule group, last / max | fleet values checked, wrong | destinations where hosts disagree |\n|---|---|---|---|---|---|---|---|");
    let int = |v: &Value| v.as_f64().map_or_else(|| "-".to_owned(), |x| format!("{x:.0}"));
    let mib = |v: &Value| v.as_f64().unwrap_or(f64::NAN) / 1_048_576.0;
    let ms = |v: &Value| v.as_f64().unwrap_or(f64::NAN) * 1e3;
    for r in &runs {
        let hosts = r["hosts"].as_f64().unwrap_or(f64::NAN);
        let dests = r["destinations"].as_f64().unwrap_or(f64::NAN);
        let _ = writeln!(
            s,
            "| {} x {} | {} ({:.1}) | {} | {:.0} MiB ({:.0}) | {:.1} / {:.1} ms | {:.1} / {:.1} ms | {}, {} | {} |",
            r["hosts"],
            r["destinations"],
            int(&r["host_series_in_prometheus"]),
            r["host_series_in_prometheus"].as_f64().unwrap_or(f64::NAN) / hosts / dests,
            int(&r["prometheus_head_series"]),
            mib(&r["prometheus_rss_bytes"]),
            mib(&r["prometheus_peak_rss_bytes"]),
            ms(&r["scrape_duration_seconds_avg"]),
            ms(&r["scrape_duration_seconds_max"]),
            ms(&r["rule_group_seconds_last"]),
            ms(&r["rule_group_seconds_max"]),
            r["fleet_values_compared"],
            r["fleet_values_wrong"],
            r["destinations_where_hosts_disagree"]
        );
    }
    // Extrapolation over the runs with 100 destinations: RSS and rule time
    // against head series, fitted by least squares.
    let big: Vec<&Value> =
        runs.iter().filter(|r| r["destinations"] == 100 && r["hosts"].as_u64() >= Some(50)).collect();
    let pts = |y: &str| -> Vec<(f64, f64)> {
        big.iter().filter_map(|r| Some((r["prometheus_head_series"].as_f64()?, r[y].as_f64()?))).collect()
    };
    let (Some((rss0, rss_per)), Some((rule0, rule_per))) =
        (fit(&pts("prometheus_peak_rss_bytes")), fit(&pts("rule_group_seconds_max")))
    else {
        return;
    };
    let per_host =
        big.iter().filter_map(|r| Some(r["host_series_in_prometheus"].as_f64()? / r["hosts"].as_f64()?)).sum::<f64>()
            / {
                #[allow(clippy::cast_precision_loss, reason = "a handful of runs")]
                let n = big.len() as f64;
                n
            };
    let _ = writeln!(s, "\nFitted over the runs with 100 destinations (peak RSS and the rule group's longest evaluation against head series, least squares): **{:.0} bytes of Prometheus RSS per series** over a base of {:.0} MiB, and **{:.2} ms of fleet-rule evaluation per 10,000 series**. A host with 100 destinations sends {per_host:.0} series. Extrapolated:\n", rss_per, rss0 / 1_048_576.0, rule_per * 1e7);
    let _ = writeln!(s, "| hosts (100 destinations each) | series | Prometheus RSS, extrapolated from this short run | fleet rules per evaluation | what it needs |\n|---|---|---|---|---|");
    for (hosts, needs) in [
        (1_000.0, "one Prometheus with a rule evaluation interval of 30 s or more (the rules take seconds at this size on this 2-core machine; a 4-8 GiB machine leaves room for the head's growth over 2-3 h of samples, which this short run does not hold); or two scraping half the hosts each, the rules evaluated where they meet (Thanos Query or Mimir ruler)"),
        (10_000.0, "past one Prometheus: shard the scrape (hashmod over hosts, 5-10 Prometheus servers of 2 M series each) and evaluate the fleet rules once over all shards, in the Mimir or Thanos ruler; the rules aggregate `by (destination, role)`, so each shard can also pre-aggregate its own max/min and the global rule take max/min of those"),
    ] {
        let series = hosts * per_host;
        let _ = writeln!(s, "| {hosts:.0} | {:.1} M | {:.1} GiB | {:.0} ms | {needs} |", series / 1e6, (rss0 + rss_per * series) / 1_073_741_824.0, (rule0 + rule_per * series) * 1e3);
    }
    let _ = writeln!(s, "\nThe same hosts with `--metrics-histograms` send about 7 times as many series (10 -> 79 for one failing destination, `tests/prometheus.rs`), which is what made the histograms opt-in.");
}

fn prometheus_version() -> String {
    std::process::Command::new("prometheus")
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_owned))
        .unwrap_or_else(|| "Prometheus".to_owned())
}

/// A side-by-side phase's figures (`target/bench/<phase>.json`), if run.
fn side_by_side(phase: &str) -> Option<Value> {
    let path = crate::workspace_root().join(format!("target/bench/{phase}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

/// A median with its 95% interval: `**543** [518, 567]`.
fn med_ci(v: &Value, digits: usize) -> String {
    let f = |x: &Value| x.as_f64().unwrap_or(f64::NAN);
    let ci = &v["median_interval_95"];
    format!("**{:.digits$}** [{:.digits$}, {:.digits$}]", f(&v["median"]), f(&ci[0]), f(&ci[1]))
}

/// The hot path, this tree's probes against older builds side by side
/// (`cargo xtask bench --only hot_cost --baseline REV`), when on record.
pub(super) fn hot_cost_section(s: &mut String) {
    let Some(k) = side_by_side("hot_cost") else {
        let _ = writeln!(s, "No side-by-side comparison of the hot path with an older build on record: run `cargo xtask bench --only hot_cost --baseline REV`, then `cargo xtask bench --report-only`.\n");
        return;
    };
    let Some(builds) = k["builds"].as_object() else { return };
    let m = &k["machine"];
    let _ = writeln!(
        s,
        "**Hot path, before and after, side by side** (`cargo xtask bench --only hot_cost --baseline REV`, {} on {} ({} cores), {} rounds of a {} s ping-pong ({} connections, {}-byte messages) with no probes and under each build, the order rotating each round, the kernel's run-time accounting on; median [95% interval of the median]). *Probe time* is the run time of every program that ran during the ping-pong, per round trip; *to this tree* is each round's probe time over this tree's in the same round; round trips are against the same round's run without probes (separate runs: noisier than 1b):\n\n| probes | probe time per round trip, ns | to this tree | round trips/s to none | mean ns per run, by program |\n|---|---|---|---|---|",
        m["date_utc"].as_str().unwrap_or("?"),
        m["cpu"].as_str().unwrap_or("?"),
        m["cores"],
        k["rounds"],
        k["seconds_per_run"],
        k["connections"],
        k["message_bytes"]
    );
    for (name, b) in builds {
        let label = if name == "current" { "this tree".to_owned() } else { format!("`{name}`") };
        let programs = b["ns_per_run_mean"]
            .as_object()
            .map(|p| {
                p.iter()
                    .map(|(n, v)| format!("`{n}` {:.0}", v.as_f64().unwrap_or(f64::NAN)))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {programs} |",
            med_ci(&b["kernel_ns_per_round_trip"], 0),
            med_ci(&b["kernel_to_current"], 3),
            med_ci(&b["ratio_to_none"], 3)
        );
    }
    let _ = writeln!(s);
}

/// The reliability section, from the last full `cargo xtask soak`
/// (`target/bench/soak.json`), when there is one.
/// The state-change hook, this tree's probes against older ones side by
/// side (`cargo xtask bench --only state_cost --baseline REV`).
pub(super) fn state_cost_section(s: &mut String) {
    let Some(k) = side_by_side("state_cost") else {
        let _ = writeln!(s, "No side-by-side comparison of the state-change hook on record: run `cargo xtask bench --only state_cost --baseline 738a54a`, then `cargo xtask bench --report-only`.\n");
        return;
    };
    let Some(builds) = k["builds"].as_object() else { return };
    let m = &k["machine"];
    let _ = writeln!(
        s,
        "**State change, before and after, side by side** (`cargo xtask bench --only state_cost --baseline REV`, {} on {} ({} cores), {} rounds of {} s of churn each, the builds interleaved and their order rotating each round; ns per run, min / median / max; *to current* is each round's gross cost over this tree's in the same round):\n\n| probes | gross ns/run | empty program ns/run | gross over empty | to current | connections/s |\n|---|---|---|---|---|---|",
        m["date_utc"].as_str().unwrap_or("?"),
        m["cpu"].as_str().unwrap_or("?"),
        m["cores"],
        k["rounds"],
        k["seconds_per_run"]
    );
    let na =
        |v: &Value, f: &dyn Fn(&Value) -> String| if v["n"].as_u64().unwrap_or(0) == 0 { "-".to_owned() } else { f(v) };
    for (name, b) in builds {
        let label = if name == "current" { "this tree".to_owned() } else { format!("`{name}`") };
        let _ = writeln!(
            s,
            "| {label} | {} | {} | {} | {} | {} |",
            mmm(&b["gross_ns"], 1.0, ""),
            na(&b["empty_ns"], &|v| mmm(v, 1.0, "")),
            na(&b["over_empty"], &|v| format!(
                "{:.1} / **{:.1}** / {:.1}",
                v["min"].as_f64().unwrap_or(f64::NAN),
                v["median"].as_f64().unwrap_or(f64::NAN),
                v["max"].as_f64().unwrap_or(f64::NAN)
            )),
            ratio(&b["ratio_to_current"]),
            mmm(&b["connections_per_second"], 1.0, "")
        );
    }
    let _ = writeln!(
        s,
        "\nA `-` is a build whose `--bench-empty-probes` had no empty program on this hook yet. The empty program's cost is the hook's own (the machine's share); the cost over it compares machines, the ratio to this tree compares probes.\n"
    );
}

pub(super) fn soak_section(s: &mut String) {
    let path = crate::workspace_root().join("target/bench/soak.json");
    let Some(k) = std::fs::read_to_string(&path).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok()) else {
        let _ = writeln!(s, "## Reliability (soak)\n\nNo full soak on record: run `cargo xtask soak --minutes 10`, then `cargo xtask bench --report-only`.");
        return;
    };
    let lost = &k["losses_counted"];
    let _ = writeln!(s, "## Reliability (soak)\n\n`cargo xtask soak --minutes {}`: one daemon with `--record`, its data directory on a 24 MiB tmpfs; 4 keep-alive clients of a server that closes idle connections after 2 s (reuses after 1, 1.5, 2.6 and 3 s: successes, failures and peer closes), 8 steady clients of a second server restarted every 40 s (peer restarts); two SIGTERM restarts (at 20% and 80% of the run), one `kill -9` (65%), a scrape storm (200 clients, 600 requests, 30%) and a disk-full window (the tmpfs filled at 40% and freed after 15% of the run, at most 30 s). The checks: the live table equals `observer analyze` of the recording (verdict, failure mode, bounds and window counts per row) but for rows the kill's lost records touch; evidence stored plus losses counted equals the evidence delivered (the recording's), but for the records within 1 s before the kill; peak RSS within 64 MiB.\n", k["minutes"]);
    let _ = writeln!(s, "| | |\n|---|---|\n| reuses the clients made | {} |\n| backend restarts, daemon restarts, kill -9 | {}, {}, {} |\n| scrape storm answered | {} of {} |\n| disk full for | {:.0} s |\n| evidence delivered (recorded) / stored | {} / {} |\n| losses counted: store_error, store_backlog, record_error | {}, {}, {} |\n| evidence recorded but not stored, all within 1 s before the kill | {} |\n| evidence stored but not recorded (the recording's last 100 ms at the kill) | {} |\n| delivered, neither stored nor counted, outside the bound | {} |\n| rows; rows where the live table and analyze differ | {}; {} |\n| peak daemon RSS | {:.1} MiB |\n", k["reuses_made"], k["backend_restarts"], k["daemon_restarts"], k["kill_9"], k["scrape_storm_answered"], k["scrape_storm_requests"], k["disk_full_seconds"].as_f64().unwrap_or(f64::NAN), k["evidence_delivered"], k["evidence_stored"], lost["store_error"], lost["store_backlog"], lost["record_error"], k["lost_at_kill"], k["unrecorded_at_kill"], k["missing_outside_bound"], k["rows"], k["rows_differing"], k["peak_rss_mib"].as_f64().unwrap_or(f64::NAN));
}

//! The benchmark phases, one function each, every one returning its
//! figures as JSON for `results.json`.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    net::{TcpListener, TcpStream},
    path::Path,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _, Result};
use serde_json::{json, Value};

use super::{
    control::{http_get, metric_sum, observer_bin, per_run, tmp, Bpftrace, Observer},
    load::{churn, churn_with, paced_pingpong, pingpong, PingPong, HTTP_REQUEST},
    med, sh, stats, Plan,
};

pub(crate) fn hot_path(plan: &Plan, bt_script: &Path) -> Result<Value> {
    let modes = ["none", "observer", "bpftrace"];
    let mut rt: BTreeMap<&str, Vec<f64>> = BTreeMap::new();
    let (mut r_obs, mut r_bt) = (Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        let mut this = BTreeMap::new();
        for k in 0..3 {
            let mode = modes[(round + k) % 3];
            let v = match mode {
                "observer" => {
                    let o = Observer::start(&[], &tmp("hot"))?;
                    let v = pingpong(4, plan.duration)?;
                    o.stop()?;
                    v
                }
                "bpftrace" => {
                    let b = Bpftrace::start(bt_script)?;
                    let v = pingpong(4, plan.duration)?;
                    b.stop()?;
                    v
                }
                _ => pingpong(4, plan.duration)?,
            };
            println!("bench: hot path round {round} {mode}: {v:.0} round trips/s");
            this.insert(mode, v);
            rt.entry(mode).or_default().push(v);
        }
        r_obs.push(this["observer"] / this["none"]);
        r_bt.push(this["bpftrace"] / this["none"]);
    }
    Ok(json!({
        "connections": 4, "message_bytes": 32, "seconds_per_run": plan.duration.as_secs_f64(),
        "round_trips_per_second": {"none": stats(&rt["none"]), "observer": stats(&rt["observer"]), "bpftrace": stats(&rt["bpftrace"])},
        "ratio_observer_to_none": stats(&r_obs),
        "ratio_bpftrace_to_none": stats(&r_bt),
    }))
}

/// The hot path with and without probes inside one run: one daemon
/// (`--bench-toggle`) and one ping-pong that never stops, the send and
/// receive probes detached and re-attached between windows. Each block is
/// four windows, with, without, without, with, so a drift in the machine's
/// speed cancels out of the block's ratio; the placement of threads on
/// CPUs, which differs from one ping-pong to the next, is the same on
/// both sides. Two layouts: threads free to move (as in the runs above),
/// and each connection's two ends pinned to one CPU, so that no CPU ever
/// waits and every nanosecond of probe time is a round trip lost.
pub(crate) fn hot_path_interleaved(plan: &Plan) -> Result<Value> {
    // The load rests while the probes change: re-attaching right after a
    // detach waits for an RCU grace period, which CPUs saturated by
    // pinned threads can stretch past a minute. Each window starts
    // after the load has run again for a moment.
    let toggle = |o: &Observer, load: &PingPong, attached: bool| -> Result<()> {
        load.pause(true);
        let r = o.toggle(attached);
        load.pause(false);
        thread::sleep(Duration::from_millis(100));
        r
    };
    let mut out = serde_json::Map::new();
    let o = Observer::start(&["--bench-toggle"], &tmp("toggle"))?;
    for (layout, pin) in [("free", false), ("pinned", true)] {
        let (mut with, mut without, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
        for session in 0..plan.sessions {
            let load = PingPong::start(4, None, pin)?;
            thread::sleep(plan.window);
            for block in 0..plan.blocks {
                let on1 = load.rate_over(plan.window);
                toggle(&o, &load, false)?;
                let off1 = load.rate_over(plan.window);
                let off2 = load.rate_over(plan.window);
                toggle(&o, &load, true)?;
                let on2 = load.rate_over(plan.window);
                let r = (on1 + on2) / (off1 + off2);
                println!("bench: interleaved {layout} ping-pong {session} block {block}: with {on1:.0} {on2:.0}, without {off1:.0} {off2:.0} round trips/s: ratio {r:.4}");
                with.extend([on1, on2]);
                without.extend([off1, off2]);
                ratio.push(r);
            }
            load.stop()?;
        }
        out.insert(
            layout.to_owned(),
            json!({
                "round_trips_per_second": {"observer": stats(&with), "none": stats(&without)},
                "ratio_observer_to_none": stats(&ratio),
            }),
        );
    }
    o.stop()?;
    Ok(json!({
        "connections": 4, "message_bytes": 32, "seconds_per_window": plan.window.as_secs_f64(), "ping_pongs": plan.sessions, "blocks_per_ping_pong": plan.blocks,
        "layouts": out,
    }))
}

pub(crate) fn kernel_cost(plan: &Plan, bt_script: &Path) -> Result<Value> {
    sh("sysctl -qw kernel.bpf_stats_enabled=1")?;
    let result = (|| -> Result<Value> {
        let o = Observer::start(&["--bench-empty-probes"], &tmp("cost"))?;
        pingpong(4, plan.duration)?;
        let ours = per_run(&o.progs)?;
        o.stop()?;
        let b = Bpftrace::start(bt_script)?;
        pingpong(4, plan.duration)?;
        let theirs = per_run(&b.progs)?;
        b.stop()?;
        // The state-change hooks, warm: connection churn (every connection
        // runs inet_sock_set_state about eight times between both ends).
        let o = Observer::start(&["--bench-empty-probes"], &tmp("cost-churn"))?;
        churn(2, plan.duration)?;
        let churned = per_run(&o.progs)?;
        o.stop()?;
        let get = |m: &BTreeMap<String, (f64, u64)>, k: &str| m.get(k).map_or(f64::NAN, |v| v.0);
        let state = get(&churned, "inet_sock_set_state");
        let e_state = get(&churned, "bench_empty_state");
        let send = get(&ours, "tcp_sendmsg_locked");
        let recv = get(&ours, "tcp_rcv_space_adjust");
        let e_send = get(&ours, "bench_empty_send");
        let e_recv = get(&ours, "bench_empty_recv");
        Ok(json!({
            "observer_ns_per_run": ours.iter().map(|(k, v)| (k.clone(), json!({"ns": v.0, "runs": v.1}))).collect::<serde_json::Map<_, _>>(),
            "bpftrace_ns_per_run": theirs.iter().map(|(k, v)| (k.clone(), json!({"ns": v.0, "runs": v.1}))).collect::<serde_json::Map<_, _>>(),
            "send_net_ns": send - e_send,
            "recv_net_ns": recv - e_recv,
            "churn_ns_per_run": churned.iter().map(|(k, v)| (k.clone(), json!({"ns": v.0, "runs": v.1}))).collect::<serde_json::Map<_, _>>(),
            "state_gross_ns": state,
            "state_net_ns": state - e_state,
        }))
    })();
    sh("sysctl -qw kernel.bpf_stats_enabled=0")?;
    result
}

/// What names cost a connection: HTTP churn (each first write names its
/// host, so the send probe reads it and hands 640 bytes to the daemon),
/// observer with names and with `--no-names`, interleaved rounds; the
/// connection rates' ratio, and the send probe's ns per run in each.
pub(crate) fn names_phase(plan: &Plan) -> Result<Value> {
    sh("sysctl -qw kernel.bpf_stats_enabled=1")?;
    let result = (|| -> Result<Value> {
        let (mut on, mut off, mut ratio, mut send_on, mut send_off) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for round in 0..plan.rounds.max(2) {
            let mut pair = [0.0; 2];
            for k in 0..2 {
                let names = (round + k) % 2 == 0;
                let args: &[&str] = if names { &[] } else { &["--no-names"] };
                let o = Observer::start(args, &tmp("names"))?;
                let v = churn_with(2, plan.duration, HTTP_REQUEST)?;
                let send = per_run(&o.progs)?.get("tcp_sendmsg_locked").map_or(f64::NAN, |v| v.0);
                o.stop()?;
                println!(
                    "bench: names round {round} {}: {v:.0} connections/s, send probe {send:.0} ns/run",
                    if names { "on" } else { "off" }
                );
                pair[usize::from(names)] = v;
                if names {
                    send_on.push(send);
                } else {
                    send_off.push(send);
                }
            }
            off.push(pair[0]);
            on.push(pair[1]);
            ratio.push(pair[1] / pair[0]);
        }
        Ok(json!({
            "client_threads": 2,
            "request": String::from_utf8_lossy(HTTP_REQUEST),
            "connections_per_second": {"names": stats(&on), "no_names": stats(&off)},
            "ratio_names_to_no_names": stats(&ratio),
            "send_ns_per_run": {"names": stats(&send_on), "no_names": stats(&send_off)},
        }))
    })();
    sh("sysctl -qw kernel.bpf_stats_enabled=0")?;
    result
}

pub(crate) fn churn_phase(plan: &Plan) -> Result<Value> {
    let (mut none, mut obs, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for round in 0..plan.rounds {
        let mut pair = [0.0; 2];
        for k in 0..2 {
            let with = (round + k) % 2 == 1;
            let v = if with {
                let o = Observer::start(&[], &tmp("churn"))?;
                let v = churn(2, plan.duration)?;
                o.stop()?;
                v
            } else {
                churn(2, plan.duration)?
            };
            println!("bench: churn round {round} {}: {v:.0} connections/s", if with { "observer" } else { "none" });
            pair[usize::from(with)] = v;
        }
        none.push(pair[0]);
        obs.push(pair[1]);
        ratio.push(pair[1] / pair[0]);
    }
    Ok(
        json!({"client_threads": 2, "connections_per_second": {"none": stats(&none), "observer": stats(&obs)}, "ratio_observer_to_none": stats(&ratio)}),
    )
}

/// Build the pipeline benchmark (`observer/benches/pipeline.rs`, a bench
/// target: not in the shipped binary) in the release profile; returns its
/// executable.
fn pipeline_bench() -> Result<std::path::PathBuf> {
    let toolchain = crate::setup(false)?;
    let out = crate::cargo()
        .args([
            "bench",
            "-p",
            "observer",
            "--bench",
            "pipeline",
            "--no-run",
            "--message-format=json-render-diagnostics",
        ])
        .env("OBSERVER_EBPF_TOOLCHAIN", &toolchain)
        .stderr(Stdio::inherit())
        .output()?;
    ensure!(out.status.success(), "building the pipeline benchmark failed");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["target"]["name"] == "pipeline")
        .find_map(|v| v["executable"].as_str().map(std::path::PathBuf::from))
        .context("cargo named no executable for the pipeline benchmark")
}

pub(crate) fn pipeline_phase(plan: &Plan) -> Result<Value> {
    let bench = pipeline_bench()?;
    let (mut rates, mut hist_rates) = (Vec::new(), Vec::new());
    let (mut scrape, mut hist_scrape) = (Value::Null, Value::Null);
    // The lean default and `--metrics-histograms`, interleaved: the same
    // events, two expositions.
    for _ in 0..plan.rounds.max(3) {
        for histograms in [false, true] {
            let mut cmd = Command::new(&bench);
            cmd.args(["--events", &plan.pipeline_events.to_string()]);
            if histograms {
                cmd.arg("--metrics-histograms");
            }
            let out = cmd.output()?;
            ensure!(out.status.success(), "pipeline benchmark: {}", String::from_utf8_lossy(&out.stderr));
            let v: Value = serde_json::from_slice(&out.stdout)?;
            let s = json!({"bytes": v["scrape_bytes"], "series": v["scrape_series"], "destinations": v["destinations"], "table_rebuild_seconds": v["table_rebuild_seconds"], "table_row_max_seconds": v["table_row_max_seconds"]});
            let rate = v["events_per_second"].as_f64().unwrap_or(f64::NAN);
            if histograms {
                hist_rates.push(rate);
                hist_scrape = s;
            } else {
                rates.push(rate);
                scrape = s;
            }
        }
    }
    println!(
        "bench: /metrics over {} destinations: {} series ({} bytes) lean, {} series ({} bytes) with --metrics-histograms",
        scrape["destinations"], scrape["series"], scrape["bytes"], hist_scrape["series"], hist_scrape["bytes"]
    );
    println!(
        "bench: pipeline {:.0} events/s (median); one table build over {} destinations: {:.2} ms, the longest row {:.0} us",
        med(&stats(&rates)),
        scrape["destinations"],
        scrape["table_rebuild_seconds"].as_f64().unwrap_or(f64::NAN) * 1e3,
        scrape["table_row_max_seconds"].as_f64().unwrap_or(f64::NAN) * 1e6
    );
    Ok(
        json!({"events_per_run": plan.pipeline_events, "destinations": 1000, "events_per_second_one_core": stats(&rates), "scrape_after_run": scrape, "events_per_second_one_core_histograms": stats(&hist_rates), "scrape_after_run_histograms": hist_scrape}),
    )
}

/// Clients scraping in a loop in the last ring-buffer level.
pub(crate) const SCRAPERS: usize = 10;

#[allow(clippy::cast_precision_loss, reason = "rates")]
pub(crate) fn ringbuf_phase(plan: &Plan) -> Result<Value> {
    let mut levels = Vec::new();
    // Target evidence events/s; None = as fast as 4 connections go.
    let offered: &[Option<f64>] = if plan.smoke {
        &[Some(50_000.0)]
    } else {
        &[Some(25_000.0), Some(50_000.0), Some(100_000.0), Some(200_000.0), None]
    };
    // The last level runs again with 10 clients scraping /metrics and the
    // table in a loop: a scrape must never cost ring-buffer events.
    let runs: Vec<(Option<f64>, usize)> =
        offered.iter().map(|&t| (t, 0)).chain(std::iter::once((Some(50_000.0), SCRAPERS))).collect();
    for (target, scrapers) in runs {
        // min-idle 0: every request is a reuse. Only the client's socket
        // tracks requests (a server's writes are responses), so a round trip
        // offers exactly one event: the client's `reuse`. What is offered is
        // the round trips made, measured, not the target.
        let o = Observer::start(&["--min-idle", "0s"], &tmp("ring"))?;
        let before = o.metrics()?;
        let start = Instant::now();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let storm: Vec<_> = (0..scrapers)
            .map(|k| {
                let (addr, stop) = (o.http.clone(), std::sync::Arc::clone(&stop));
                thread::spawn(move || {
                    let mut n = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        let path = if k % 2 == 0 { "/metrics" } else { "/api/v1/destinations" };
                        if http_get(&addr, path).is_ok() {
                            n += 1;
                        }
                    }
                    n
                })
            })
            .collect();
        let c = 4;
        let round_trips = paced_pingpong(c, plan.duration, target.map(|t| t / c as f64))?;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let scrapes: u64 = storm.into_iter().map(|h| h.join().unwrap_or(0)).sum();
        thread::sleep(Duration::from_millis(1500));
        let after = o.metrics()?;
        let secs = start.elapsed().as_secs_f64() - 1.5;
        // Delivered: the `reuse` events the daemon received (the 4
        // connections' `established` are not evidence of the rate).
        let kind = "kind=\"reuse\"";
        let ev = metric_sum(&after, "observer_events_total", kind) - metric_sum(&before, "observer_events_total", kind);
        let lost = metric_sum(&after, "observer_events_lost_total", "ring_buffer_full")
            - metric_sum(&before, "observer_events_lost_total", "ring_buffer_full");
        let backlog = metric_sum(&after, "observer_events_lost_total", "store_backlog")
            - metric_sum(&before, "observer_events_lost_total", "store_backlog");
        o.stop()?;
        println!(
            "bench: ring buffer target {target:?}/s with {scrapers} scrapers ({scrapes} scrapes): {round_trips:.0} reuses/s offered (round trips), {:.0} delivered, {lost} lost, {backlog} not stored",
            ev / secs
        );
        if scrapers > 0 {
            ensure!(lost == 0.0, "{scrapers} clients scraping in a loop cost {lost} ring-buffer events");
        }
        // 50,000 events/s on 4 connections is well inside what the reader
        // drains: a loss there is a reader that was not woken (it slept
        // until its tick behind an unwoken `established`), not the load.
        if plan.smoke {
            ensure!(lost == 0.0, "{lost} ring-buffer events lost at a paced {target:?}/s");
        }
        levels.push(json!({"target_events_per_second": target, "offered_events_per_second": round_trips, "scrapers": scrapers, "scrapes": scrapes, "events_per_second": ev / secs, "ring_buffer_lost": lost, "store_backlog_dropped": backlog}));
    }
    let best = levels
        .iter()
        .filter(|l| l["ring_buffer_lost"].as_f64() == Some(0.0))
        .filter_map(|l| l["events_per_second"].as_f64())
        .fold(0.0, f64::max);
    Ok(json!({"ring_buffer_bytes": 4_194_304, "levels": levels, "max_zero_loss_events_per_second": best}))
}

#[allow(clippy::cast_precision_loss, reason = "sizes")]
pub(crate) fn memory_phase(plan: &Plan) -> Result<Value> {
    let ports = plan.memory_ports;
    let per_port = plan.memory_per_port + 1;
    // Listeners that never accept: the handshake completes in the kernel, so
    // both ends are established (and tracked) without a server fd each.
    let listeners: Vec<TcpListener> =
        (0..ports).map(|_| TcpListener::bind("127.0.0.1:0")).collect::<std::io::Result<_>>()?;
    let mut port_list: Vec<u16> =
        listeners.iter().map(|l| l.local_addr().map(|a| a.port())).collect::<std::io::Result<_>>()?;
    port_list.sort_unstable();
    let o = Observer::start(&["--min-idle", "0s"], &tmp("mem"))?;
    let rss_idle = rss_kib(o.pid())?;
    // Each helper holds at most ~16,000 sockets (the fd limit here is 20,000).
    let ports_per_helper = (16_000 / per_port).max(1);
    let mut helpers = Vec::new();
    for chunk in port_list.chunks(ports_per_helper) {
        // Ports from bind(0) are not contiguous: one helper per port run.
        let mut runs: Vec<(u16, u16)> = Vec::new();
        for &p in chunk {
            match runs.last_mut() {
                Some((start, n)) if *start + *n == p => *n += 1,
                _ => runs.push((p, 1)),
            }
        }
        let spec = runs.iter().map(|(s, n)| format!("{s}:{n}")).collect::<Vec<_>>().join(",");
        let mut child = Command::new(std::env::current_exe()?)
            .args(["bench-hold", "--runs", &spec, "--per-port", &per_port.to_string()])
            .stdout(Stdio::piped())
            .spawn()?;
        let mut line = String::new();
        BufReader::new(child.stdout.take().context("stdout")?).read_line(&mut line)?;
        ensure!(line.starts_with("ready"), "helper failed: {line}");
        helpers.push(child);
    }
    // One socket-table refresh (every 5 s) must have run.
    thread::sleep(Duration::from_secs(6));
    let metrics = o.metrics()?;
    let tracked = metric_sum(&metrics, "observer_tracked_sockets", "");
    let rows: Value = serde_json::from_str(&http_get(&o.http, "/api/v1/destinations")?)?;
    let destinations = rows.as_array().map_or(0, Vec::len);
    let rss = rss_kib(o.pid())?;
    // The peak (start-up's BTF parsing, a socket-table refresh, a scrape)
    // is what a host must have room for.
    let peak = status_kib(o.pid(), "VmHWM:")?;
    let slow = slow_readers(&o, plan)?;
    let mut map_bytes = 0u64;
    let mut seen = std::collections::BTreeSet::new();
    for (_, id) in &o.progs {
        let p: Value = serde_json::from_str(&sh(&format!("bpftool -j prog show id {id}"))?)?;
        for m in p["map_ids"].as_array().into_iter().flatten().filter_map(Value::as_u64) {
            if seen.insert(m) {
                let mv: Value = serde_json::from_str(&sh(&format!("bpftool -j map show id {m}"))?)?;
                map_bytes += mv["bytes_memlock"].as_u64().unwrap_or(0);
            }
        }
    }
    // Socket-local storage is not a preallocated map: it is kernel slab
    // memory that goes when the map does. Stop the daemon with the sockets
    // still open and see how much unreclaimable slab is given back.
    let slab_with = unreclaimable_slab_kib()?;
    o.stop()?;
    thread::sleep(Duration::from_secs(3));
    let slab_without = unreclaimable_slab_kib()?;
    let storage_bytes = slab_with.saturating_sub(slab_without) * 1024;
    for mut h in helpers {
        let _ = h.kill();
        let _ = h.wait();
    }
    drop(listeners);
    println!(
        "bench: memory: {tracked} tracked sockets, {destinations} destinations, RSS {rss} KiB (peak {peak} KiB), maps {map_bytes} bytes, socket-local storage {storage_bytes} bytes",
    );
    Ok(json!({
        "connections": ports * plan.memory_per_port, "tracked_sockets": tracked, "destinations": destinations,
        "rss_bytes_idle": rss_idle * 1024, "rss_bytes": rss * 1024, "rss_mib": (rss as f64) / 1024.0,
        "peak_rss_bytes": peak * 1024, "peak_rss_mib": (peak as f64) / 1024.0,
        "kernel_map_bytes": map_bytes, "kernel_map_mib": map_bytes as f64 / 1_048_576.0,
        "storage_bytes": storage_bytes, "storage_mib": storage_bytes as f64 / 1_048_576.0,
        "storage_bytes_per_socket": if tracked > 0.0 { storage_bytes as f64 / tracked } else { 0.0 },
        "slow_readers": slow,
    }))
}

/// `plan.slow_readers` clients that each ask for `/metrics` and read it one
/// byte per 10 ms (a 4 KiB receive buffer), while a fast client scrapes
/// both bodies every 300 ms so the table is rebuilt under them: the
/// daemon's RSS and peak with every one of them holding a response.
#[allow(clippy::cast_precision_loss, reason = "KiB shown as MiB")]
fn slow_readers(o: &Observer, plan: &Plan) -> Result<Value> {
    use std::os::fd::AsRawFd as _;
    let stop = Arc::new(AtomicBool::new(false));
    let read = Arc::new(AtomicU64::new(0));
    let mut threads = Vec::new();
    for _ in 0..plan.slow_readers {
        let (addr, stop, read) = (o.http.clone(), Arc::clone(&stop), Arc::clone(&read));
        threads.push(thread::spawn(move || -> Result<()> {
            let mut s = TcpStream::connect(&addr)?;
            let small: libc::c_int = 4096;
            // SAFETY: setsockopt on an open socket with a valid int option.
            unsafe {
                libc::setsockopt(
                    s.as_raw_fd(),
                    libc::SOL_SOCKET,
                    libc::SO_RCVBUF,
                    (&raw const small).cast(),
                    libc::socklen_t::try_from(std::mem::size_of::<libc::c_int>()).unwrap_or(4),
                );
            }
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")?;
            let mut b = [0u8; 1];
            while !stop.load(Ordering::Relaxed) {
                if s.read(&mut b)? == 0 {
                    break;
                }
                read.fetch_add(1, Ordering::Relaxed);
                thread::sleep(Duration::from_millis(10));
            }
            Ok(())
        }));
    }
    let started = Instant::now();
    let mut scrapes = 0u64;
    while started.elapsed() < plan.slow_for {
        http_get(&o.http, "/api/v1/destinations")?;
        http_get(&o.http, "/metrics")?;
        scrapes += 1;
        thread::sleep(Duration::from_millis(300));
    }
    let rss = rss_kib(o.pid())?;
    let peak = status_kib(o.pid(), "VmHWM:")?;
    let body = http_get(&o.http, "/metrics")?.len();
    stop.store(true, Ordering::Relaxed);
    let mut failed = 0;
    for t in threads {
        if !matches!(t.join(), Ok(Ok(()))) {
            failed += 1;
        }
    }
    ensure!(failed == 0, "{failed} slow readers failed");
    println!(
        "bench: memory: {} slow /metrics readers for {:.0} s ({scrapes} fast scrapes meanwhile, body {body} bytes): RSS {rss} KiB, peak {peak} KiB",
        plan.slow_readers,
        plan.slow_for.as_secs_f64()
    );
    Ok(json!({
        "readers": plan.slow_readers, "seconds": plan.slow_for.as_secs_f64(), "fast_scrapes": scrapes,
        "metrics_body_bytes": body, "bytes_read": read.load(Ordering::Relaxed),
        "rss_bytes": rss * 1024, "rss_mib": rss as f64 / 1024.0,
        "peak_rss_bytes": peak * 1024, "peak_rss_mib": peak as f64 / 1024.0,
    }))
}

/// A store holding `plan.startup_records` evidence records over 1,000
/// destinations, written by `observer debug write-evidence`; the daemon
/// started on it: the time until it says it runs (the records replayed,
/// streamed) and its peak RSS.
#[allow(clippy::cast_precision_loss, reason = "KiB shown as MiB")]
pub(crate) fn startup_phase(plan: &Plan) -> Result<Value> {
    let data = tmp("startup");
    let _ = std::fs::remove_dir_all(&data);
    let written = Instant::now();
    sh(&format!(
        "{} debug write-evidence --data-dir {} --records {} --destinations 1000 > /dev/null",
        observer_bin().display(),
        data.display(),
        plan.startup_records
    ))?;
    let write_s = written.elapsed().as_secs_f64();
    let store_bytes = std::fs::read_dir(&data)?.filter_map(|e| e.ok()?.metadata().ok()).map(|m| m.len()).sum::<u64>();
    let started = Instant::now();
    let o = Observer::start_on(&["--max-store-bytes", "4GiB"], &data)?;
    let start_s = started.elapsed().as_secs_f64();
    let peak = status_kib(o.pid(), "VmHWM:")?;
    let rss = rss_kib(o.pid())?;
    let rows: Value = serde_json::from_str(&http_get(&o.http, "/api/v1/destinations")?)?;
    let destinations = rows.as_array().map_or(0, Vec::len);
    o.stop()?;
    let _ = std::fs::remove_dir_all(&data);
    println!(
        "bench: startup: {} stored records ({store_bytes} bytes, written in {write_s:.0} s) replayed in {start_s:.1} s to {destinations} rows: RSS {rss} KiB, peak {peak} KiB",
        plan.startup_records
    );
    Ok(json!({
        "records": plan.startup_records, "store_bytes": store_bytes, "destinations": destinations,
        "seconds_to_running": start_s, "rss_bytes": rss * 1024, "peak_rss_bytes": peak * 1024,
        "peak_rss_mib": peak as f64 / 1024.0,
    }))
}

/// `SUnreclaim` from /proc/meminfo (KiB).
pub(crate) fn unreclaimable_slab_kib() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/meminfo")?;
    s.lines()
        .find(|l| l.starts_with("SUnreclaim:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .context("SUnreclaim missing")
}

pub(crate) fn rss_kib(pid: u32) -> Result<u64> {
    status_kib(pid, "VmRSS:")
}

/// A `/proc/PID/status` figure in KiB (`VmRSS:`, `VmHWM:`).
pub(crate) fn status_kib(pid: u32, key: &str) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .with_context(|| format!("{key} missing from /proc/{pid}/status"))
}

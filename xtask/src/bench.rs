//! `cargo xtask bench`: what observer costs the host, measured side by side
//! (no probes / observer / a bpftrace equivalent) in interleaved runs, with
//! results in `BENCHMARKS.md` and `target/bench/results.json`.

use std::{
    collections::BTreeMap,
    fmt::Write as _,
    io::{BufRead, BufReader, Read, Write},
    net::{Shutdown, TcpListener, TcpStream},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        mpsc, Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{ensure, Context as _, Result};
use serde_json::{json, Value};

/// Settings of one bench run.
struct Plan {
    smoke: bool,
    rounds: usize,
    duration: Duration,
    /// Ping-pongs per layout in the interleaved hot path (each places its
    /// threads anew), and blocks of four windows in each.
    sessions: usize,
    blocks: usize,
    /// One window of the interleaved hot path.
    window: Duration,
    pipeline_events: usize,
    memory_ports: usize,
    memory_per_port: usize,
}

fn sh(cmd: &str) -> Result<String> {
    let out = Command::new("sh").arg("-c").arg(cmd).output().with_context(|| format!("running {cmd}"))?;
    ensure!(out.status.success(), "`{cmd}` failed: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A distribution-free interval of at least 95% for the median of `sorted`:
/// its k-th smallest and k-th largest value, k the largest with
/// P(Binomial(n, 1/2) < k) <= 2.5%; `None` below 6 values.
fn median_interval(sorted: &[f64]) -> Option<(f64, f64)> {
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
fn stats(v: &[f64]) -> Value {
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

fn med(v: &Value) -> f64 {
    v["median"].as_f64().unwrap_or(f64::NAN)
}

// ---------------------------------------------------------------- load

/// Ping-pong round trips per second over `conns` loopback connections.
fn pingpong(conns: usize, dur: Duration) -> Result<f64> {
    paced_pingpong(conns, dur, None)
}

/// Ping-pong, each connection paced to at most `rate` round trips/s.
fn paced_pingpong(conns: usize, dur: Duration, rate: Option<f64>) -> Result<f64> {
    let load = PingPong::start(conns, rate, false)?;
    let rate = load.rate_over(dur);
    load.stop()?;
    Ok(rate)
}

/// Round trips of one client, alone on its cache line (the clients count
/// as they go without slowing each other).
#[repr(align(128))]
#[derive(Default)]
struct Counter(AtomicU64);

/// A running ping-pong: `conns` loopback connections, 32-byte messages,
/// each connection paced to at most `rate` round trips/s; with `pin`, both
/// ends of connection i run on CPU i mod the number of CPUs, so every CPU
/// is busy with whole round trips and none waits on another.
struct PingPong {
    stop: Arc<AtomicBool>,
    /// Clients wait while set (between windows of the interleaved phase).
    paused: Arc<AtomicBool>,
    counts: Vec<Arc<Counter>>,
    clients: Vec<thread::JoinHandle<std::io::Result<()>>>,
    server: thread::JoinHandle<()>,
}

/// Run the calling thread on `cpu` only.
fn pin_to(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and
    // sched_setaffinity get a pointer to it and its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw const set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl PingPong {
    #[allow(clippy::cast_precision_loss, reason = "rates")]
    fn start(conns: usize, rate: Option<f64>, pin: bool) -> Result<Self> {
        let cpus = thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let server = thread::spawn(move || {
            let mut handles = Vec::new();
            for s in listener.incoming().take(conns) {
                let Ok(mut s) = s else { break };
                handles.push(thread::spawn(move || {
                    let _ = s.set_nodelay(true);
                    let mut buf = [0u8; 32];
                    // The first message names the connection, for pinning.
                    if s.read_exact(&mut buf).is_err() {
                        return;
                    }
                    if pin && pin_to(usize::from(buf[0]) % cpus).is_err() {
                        return;
                    }
                    while s.write_all(&buf).is_ok() && s.read_exact(&mut buf).is_ok() {}
                }));
            }
            for h in handles {
                let _ = h.join();
            }
        });
        let counts: Vec<Arc<Counter>> = (0..conns).map(|_| Arc::default()).collect();
        let clients = counts
            .iter()
            .enumerate()
            .map(|(i, count)| {
                let (stop, paused, count) = (Arc::clone(&stop), Arc::clone(&paused), Arc::clone(count));
                thread::spawn(move || -> std::io::Result<()> {
                    if pin {
                        pin_to(i % cpus)?;
                    }
                    let mut s = TcpStream::connect(addr)?;
                    s.set_nodelay(true)?;
                    let mut buf = [u8::try_from(i).unwrap_or(0); 32];
                    let mut n = 0u64;
                    let t0 = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        if paused.load(Ordering::Relaxed) {
                            thread::sleep(Duration::from_millis(1));
                            continue;
                        }
                        if let Some(r) = rate {
                            let due = Duration::from_secs_f64(n as f64 / r);
                            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                                thread::sleep(wait);
                            }
                        }
                        s.write_all(&buf)?;
                        s.read_exact(&mut buf)?;
                        n += 1;
                        count.0.store(n, Ordering::Relaxed);
                    }
                    s.shutdown(Shutdown::Both)
                })
            })
            .collect();
        Ok(Self { stop, paused, counts, clients, server })
    }

    /// Hold the clients (`true`) or let them go on.
    fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// Round trips so far, all connections.
    fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.0.load(Ordering::Relaxed)).sum()
    }

    /// Round trips per second over the next `dur`.
    #[allow(clippy::cast_precision_loss, reason = "rates")]
    fn rate_over(&self, dur: Duration) -> f64 {
        let (n0, t0) = (self.count(), Instant::now());
        thread::sleep(dur);
        (self.count() - n0) as f64 / t0.elapsed().as_secs_f64()
    }

    fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.join().map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        }
        let _ = self.server.join();
        Ok(())
    }
}

/// Short connections per second: connect, one request, one response, close.
#[allow(clippy::cast_precision_loss, reason = "rates")]
fn churn(threads: usize, dur: Duration) -> Result<f64> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_s = Arc::clone(&stop);
    listener.set_nonblocking(true)?;
    // The server closes first, so TIME_WAIT stays on its side.
    let server = thread::spawn(move || {
        while !stop_s.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let mut buf = [0u8; 32];
                    if s.read_exact(&mut buf).is_ok() {
                        let _ = s.write_all(&buf);
                    }
                }
                Err(_) => thread::sleep(Duration::from_micros(50)),
            }
        }
    });
    let count = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let clients: Vec<_> = (0..threads)
        .map(|_| {
            let (stop, count) = (Arc::clone(&stop), Arc::clone(&count));
            thread::spawn(move || -> std::io::Result<()> {
                let mut buf = [1u8; 32];
                let mut rest = [0u8; 1];
                while !stop.load(Ordering::Relaxed) {
                    let mut one = || -> std::io::Result<()> {
                        let mut s = TcpStream::connect(addr)?;
                        s.write_all(&buf)?;
                        s.read_exact(&mut buf)?;
                        let _ = s.read(&mut rest);
                        Ok(())
                    };
                    match one() {
                        Ok(()) => {
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        // The server stops accepting when the run ends.
                        Err(_) if stop.load(Ordering::Relaxed) => break,
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            })
        })
        .collect();
    thread::sleep(dur);
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    for c in clients {
        c.join().map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    }
    let _ = server.join();
    Ok(count.load(Ordering::Relaxed) as f64 / elapsed)
}

// ---------------------------------------------------------------- processes

/// A running `observer run`, stopped with SIGTERM on drop.
struct Observer {
    child: Child,
    progs: Vec<(String, u32)>,
    http: String,
    /// The daemon's log lines after it said it runs.
    log: mpsc::Receiver<String>,
    _data: PathBuf,
}

fn observer_bin() -> PathBuf {
    crate::workspace_root().join("target/release/observer")
}

impl Observer {
    fn start(extra: &[&str], data: &Path) -> Result<Self> {
        let _ = std::fs::remove_dir_all(data);
        let mut child = Command::new(observer_bin())
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
    fn toggle(&self, attached: bool) -> Result<()> {
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

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn metrics(&self) -> Result<String> {
        http_get(&self.http, "/metrics")
    }

    fn stop(mut self) -> Result<()> {
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

fn http_get(addr: &str, path: &str) -> Result<String> {
    let mut r = ureq::get(format!("http://{addr}{path}")).call().with_context(|| format!("GET {addr}{path}"))?;
    Ok(r.body_mut().with_config().limit(256 * 1024 * 1024).read_to_string()?)
}

/// Sum of a metric's samples whose line contains `filter`.
fn metric_sum(text: &str, name: &str, filter: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l.contains(filter))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A running bpftrace script.
struct Bpftrace {
    child: Child,
    progs: Vec<(String, u32)>,
}

fn loaded_progs() -> Result<BTreeMap<u32, (String, u64, u64)>> {
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
    fn start(script: &Path) -> Result<Self> {
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

    fn stop(mut self) -> Result<()> {
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
fn per_run(progs: &[(String, u32)]) -> Result<BTreeMap<String, (f64, u64)>> {
    let all = loaded_progs()?;
    Ok(progs
        .iter()
        .filter_map(|(name, id)| {
            let (_, t, n) = all.get(id)?;
            Some((name.clone(), (if *n > 0 { *t as f64 / *n as f64 } else { f64::NAN }, *n)))
        })
        .collect())
}

// ---------------------------------------------------------------- phases

fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("observer-bench-{}-{name}", std::process::id()))
}

fn hot_path(plan: &Plan, bt_script: &Path) -> Result<Value> {
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
fn hot_path_interleaved(plan: &Plan) -> Result<Value> {
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

fn kernel_cost(plan: &Plan, bt_script: &Path) -> Result<Value> {
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

fn churn_phase(plan: &Plan) -> Result<Value> {
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

fn pipeline_phase(plan: &Plan) -> Result<Value> {
    let mut rates = Vec::new();
    let mut scrape = Value::Null;
    for _ in 0..plan.rounds.max(3) {
        let out = Command::new(observer_bin())
            .args(["debug", "bench-pipeline", "--events", &plan.pipeline_events.to_string()])
            .output()?;
        ensure!(out.status.success(), "bench-pipeline: {}", String::from_utf8_lossy(&out.stderr));
        let v: Value = serde_json::from_slice(&out.stdout)?;
        rates.push(v["events_per_second"].as_f64().unwrap_or(f64::NAN));
        scrape = json!({"bytes": v["scrape_bytes"], "series": v["scrape_series"], "destinations": v["destinations"], "table_rebuild_seconds": v["table_rebuild_seconds"], "table_row_max_seconds": v["table_row_max_seconds"]});
    }
    println!(
        "bench: pipeline {:.0} events/s (median); one table build over {} destinations: {:.2} ms, the longest row {:.0} us",
        med(&stats(&rates)),
        scrape["destinations"],
        scrape["table_rebuild_seconds"].as_f64().unwrap_or(f64::NAN) * 1e3,
        scrape["table_row_max_seconds"].as_f64().unwrap_or(f64::NAN) * 1e6
    );
    Ok(
        json!({"events_per_run": plan.pipeline_events, "destinations": 1000, "events_per_second_one_core": stats(&rates), "scrape_after_run": scrape}),
    )
}

/// Clients scraping in a loop in the last ring-buffer level.
const SCRAPERS: usize = 10;

#[allow(clippy::cast_precision_loss, reason = "rates")]
fn ringbuf_phase(plan: &Plan) -> Result<Value> {
    let mut levels = Vec::new();
    // Offered events/s; None = as fast as 4 connections go.
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
        // min-idle 0: every request is a reuse, so each round trip is two
        // events (the client's and the server's reuse).
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
        paced_pingpong(c, plan.duration, target.map(|t| t / 2.0 / c as f64))?;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let scrapes: u64 = storm.into_iter().map(|h| h.join().unwrap_or(0)).sum();
        thread::sleep(Duration::from_millis(1500));
        let after = o.metrics()?;
        let secs = start.elapsed().as_secs_f64() - 1.5;
        let ev = metric_sum(&after, "observer_events_total", "") - metric_sum(&before, "observer_events_total", "");
        let lost = metric_sum(&after, "observer_events_lost_total", "ring_buffer_full")
            - metric_sum(&before, "observer_events_lost_total", "ring_buffer_full");
        let backlog = metric_sum(&after, "observer_events_lost_total", "store_backlog")
            - metric_sum(&before, "observer_events_lost_total", "store_backlog");
        o.stop()?;
        println!(
            "bench: ring buffer offered {target:?}/s with {scrapers} scrapers ({scrapes} scrapes): {:.0} events/s delivered, {lost} lost, {backlog} not stored",
            ev / secs
        );
        if scrapers > 0 {
            ensure!(lost == 0.0, "{scrapers} clients scraping in a loop cost {lost} ring-buffer events");
        }
        levels.push(json!({"offered_events_per_second": target, "scrapers": scrapers, "scrapes": scrapes, "events_per_second": ev / secs, "ring_buffer_lost": lost, "store_backlog_dropped": backlog}));
    }
    let best = levels
        .iter()
        .filter(|l| l["ring_buffer_lost"].as_f64() == Some(0.0))
        .filter_map(|l| l["events_per_second"].as_f64())
        .fold(0.0, f64::max);
    Ok(json!({"ring_buffer_bytes": 1_048_576, "levels": levels, "max_zero_loss_events_per_second": best}))
}

/// Child process: connect `per_port` times to each port in `ports`, close one
/// connection per port (a local idle close: evidence for the destination),
/// print `ready`, then hold the rest until killed.
pub fn hold(runs: &[(u16, u16)], per_port: usize) -> Result<()> {
    let mut held = Vec::new();
    for p in runs.iter().flat_map(|&(first, n)| first..first + n) {
        for k in 0..per_port {
            let s = TcpStream::connect(("127.0.0.1", p)).with_context(|| format!("connecting to port {p}"))?;
            if k == 0 {
                drop(s);
            } else {
                held.push(s);
            }
        }
    }
    println!("ready {}", held.len());
    std::io::stdout().flush()?;
    loop {
        thread::sleep(Duration::from_hours(1));
    }
}

#[allow(clippy::cast_precision_loss, reason = "sizes")]
fn memory_phase(plan: &Plan) -> Result<Value> {
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
    }))
}

/// `SUnreclaim` from /proc/meminfo (KiB).
fn unreclaimable_slab_kib() -> Result<u64> {
    let s = std::fs::read_to_string("/proc/meminfo")?;
    s.lines()
        .find(|l| l.starts_with("SUnreclaim:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .context("SUnreclaim missing")
}

fn rss_kib(pid: u32) -> Result<u64> {
    status_kib(pid, "VmRSS:")
}

/// A `/proc/PID/status` figure in KiB (`VmRSS:`, `VmHWM:`).
fn status_kib(pid: u32, key: &str) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .with_context(|| format!("{key} missing from /proc/{pid}/status"))
}

fn machine() -> Value {
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

/// Run one phase with the full plan and write its figures to
/// `target/bench/<phase>.json`.
pub fn run_phase(phase: &str) -> Result<()> {
    let plan = plan(false);
    let value = match phase {
        "hot_path_interleaved" => hot_path_interleaved(&plan)?,
        "memory" => memory_phase(&plan)?,
        "kernel_cost" => kernel_cost(&plan, &crate::workspace_root().join("bench/idle-bookkeeping.bt"))?,
        other => {
            anyhow::bail!(
                "no bench phase `{other}`; the phases that run alone are hot_path_interleaved, kernel_cost and memory"
            )
        }
    };
    let dir = crate::workspace_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join(format!("{phase}.json")), serde_json::to_string_pretty(&value)?)?;
    println!("bench: wrote target/bench/{phase}.json");
    Ok(())
}

fn plan(smoke: bool) -> Plan {
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
        }
    } else {
        Plan {
            smoke,
            rounds: 15,
            duration: Duration::from_secs(3),
            sessions: 4,
            blocks: 5,
            window: Duration::from_secs(1),
            pipeline_events: 2_000_000,
            memory_ports: 1000,
            memory_per_port: 50,
        }
    }
}

/// Run everything; with `smoke`, a few seconds of each and no report.
pub fn run(smoke: bool) -> Result<()> {
    let plan = plan(smoke);
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
        "pipeline": pipeline_phase(&plan)?,
        "ring_buffer": ringbuf_phase(&plan)?,
        "memory": memory_phase(&plan)?,
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

const TRACEFS_EVENTS: &str = "/sys/kernel/tracing/events";

fn mmm(v: &Value, scale: f64, unit: &str) -> String {
    format!(
        "{:.0} / **{:.0}** / {:.0} {unit}",
        v["min"].as_f64().unwrap_or(f64::NAN) * scale,
        v["median"].as_f64().unwrap_or(f64::NAN) * scale,
        v["max"].as_f64().unwrap_or(f64::NAN) * scale
    )
}

fn ratio(v: &Value) -> String {
    format!(
        "{:.3} / **{:.3}** / {:.3}",
        v["min"].as_f64().unwrap_or(f64::NAN),
        v["median"].as_f64().unwrap_or(f64::NAN),
        v["max"].as_f64().unwrap_or(f64::NAN)
    )
}

fn verdict(ok: bool) -> &'static str {
    if ok {
        "met"
    } else {
        "**missed**"
    }
}

/// A target judged on a 95% interval of a loss: met when the whole
/// interval is within it (and `also` holds), missed when the whole
/// interval is beyond it, and not settled when the interval spans it.
fn settled(lo: f64, hi: f64, target: f64, also: bool) -> &'static str {
    if hi <= target && also {
        "met"
    } else if lo > target || !also {
        "**missed**"
    } else {
        "**not settled** (the interval spans the target)"
    }
}

#[allow(clippy::too_many_lines, reason = "the report, section by section")]
fn markdown(r: &Value) -> String {
    let m = &r["machine"];
    let hp = &r["hot_path"];
    let kc = &r["kernel_cost"];
    let ch = &r["churn"];
    let pl = &r["pipeline"];
    let rb = &r["ring_buffer"];
    let me = &r["memory"];
    let layouts = &r["hot_path_interleaved"]["layouts"];
    // Loss (median) and its 95% interval, from a ratio's (a higher ratio is
    // a lower loss); NaN where there is no interval.
    let loss = |ratio: &Value| {
        let at = |i: usize| 1.0 - ratio["median_interval_95"][1 - i].as_f64().unwrap_or(f64::NAN);
        (1.0 - med(ratio), at(0), at(1))
    };
    let (free, free_lo, free_hi) = loss(&layouts["free"]["ratio_observer_to_none"]);
    let (pinned, pinned_lo, pinned_hi) = loss(&layouts["pinned"]["ratio_observer_to_none"]);
    let (sep, sep_lo, sep_hi) = loss(&hp["ratio_observer_to_none"]);
    let bt_cost = 1.0 - med(&hp["ratio_bpftrace_to_none"]);
    let send_net = kc["send_net_ns"].as_f64().unwrap_or(f64::NAN);
    let recv_net = kc["recv_net_ns"].as_f64().unwrap_or(f64::NAN);
    let churn_cost = 1.0 - med(&ch["ratio_observer_to_none"]);
    let pipe = med(&pl["events_per_second_one_core"]);
    let zero_loss = rb["max_zero_loss_events_per_second"].as_f64().unwrap_or(0.0);
    let rss_mib = me["rss_mib"].as_f64().unwrap_or(f64::NAN);
    let peak_mib = me["peak_rss_mib"].as_f64().unwrap_or(f64::NAN);
    let int = |v: &Value| v.as_f64().map_or_else(|| "-".to_owned(), |x| format!("{x:.0}"));
    // Why the hot path costs what it costs: the probes' own run time per
    // round trip against the CPU time a round trip takes.
    let g = |k: &str| kc["observer_ns_per_run"][k]["ns"].as_f64().unwrap_or(f64::NAN);
    let per_rt = 2.0 * g("tcp_sendmsg_locked") + 2.0 * g("tcp_rcv_space_adjust");
    let rt_none = med(&hp["round_trips_per_second"]["none"]);
    let cores = m["cores"].as_f64().unwrap_or(1.0);
    let cpu_per_rt_ns = cores / rt_none * 1e9;
    let hot_share = per_rt / cpu_per_rt_ns;
    let mut s = String::new();
    let _ = writeln!(s, "# Benchmarks\n");
    let _ = writeln!(
        s,
        "Measured {} on {} cores ({}), Linux {}, by `cargo xtask bench` (root). Raw figures: `target/bench/results.json`.\n",
        m["date_utc"].as_str().unwrap_or(""),
        m["cores"],
        m["cpu"].as_str().unwrap_or(""),
        m["kernel"].as_str().unwrap_or("")
    );
    let _ =
        writeln!(s, "## Headline against the targets\n\n| what | target | measured (median) | |\n|---|---|---|---|");
    let _ = writeln!(
        s,
        "| hot path: round trips/s lost to observer, threads free to move | <= 3%, and less than bpftrace | {:.1}% (95% interval {:.2}% to {:.2}%); bpftrace {:.1}% | {} |",
        free * 100.0,
        free_lo * 100.0,
        free_hi * 100.0,
        bt_cost * 100.0,
        settled(free_lo, free_hi, 0.03, free < bt_cost)
    );
    let _ = writeln!(
        s,
        "| hot path, saturated: each connection's two ends pinned to one CPU | <= 3% | {:.1}% (95% interval {:.2}% to {:.2}%) | {} |",
        pinned * 100.0,
        pinned_lo * 100.0,
        pinned_hi * 100.0,
        settled(pinned_lo, pinned_hi, 0.03, true)
    );
    let _ = writeln!(s, "| kernel cost per send / receive probe, net of an empty program | <= 100 ns | {send_net:.0} ns / {recv_net:.0} ns | {} |", verdict(send_net <= 100.0 && recv_net <= 100.0));
    let state_gross = kc["state_gross_ns"].as_f64().unwrap_or(f64::NAN);
    let _ = writeln!(
        s,
        "| state change (`inet_sock_set_state`) per run under churn, gross | <= 500 ns | {state_gross:.0} ns ({} ns net) | {} |",
        int(&kc["state_net_ns"]),
        verdict(state_gross <= 500.0)
    );
    let _ = writeln!(
        s,
        "| connection churn: connections/s lost | <= 5% | {:.1}% | {} |",
        churn_cost * 100.0,
        verdict(churn_cost <= 0.05)
    );
    let _ = writeln!(
        s,
        "| userspace pipeline, one core | >= 500,000 events/s | {pipe:.0} events/s | {} |",
        verdict(pipe >= 500_000.0)
    );
    let _ = writeln!(s, "| ring buffer: highest rate with zero loss | >= 50,000 events/s | {zero_loss:.0} events/s (highest offered) | {} |", verdict(zero_loss >= 50_000.0));
    let _ = writeln!(
        s,
        "| daemon RSS with {} tracked sockets, {} destination rows (peak) | <= 64 MiB | {peak_mib:.1} MiB (at the end {rss_mib:.1} MiB) | {} |",
        int(&me["tracked_sockets"]),
        me["destinations"],
        verdict(peak_mib <= 64.0)
    );
    let _ = writeln!(
        s,
        "\n**How the hot path is measured, and why it costs what it costs.** The two hot-path rows come from ping-pongs that run on while the send and receive probes are detached and re-attached between one-second windows (`observer run --bench-toggle`, section 1b), in blocks of with / without / without / with: a steady drift in the machine's speed cancels out of each block, and the placement of threads on CPUs, which differs from one ping-pong to the next and moved the separate runs' ratio by several points, is the same on both sides. The machine's noise still shows in the interval when it comes in bursts shorter than a block. Runs with and without observer as separate processes (section 1, the bpftrace comparison) gave {:.1}% here, with a 95% interval of {:.1}% to {:.1}%. The saturated layout is the worst case: every CPU is busy with whole round trips and never waits, so every nanosecond of probe time is a round trip lost; with threads free to move, some of it hides in the time a CPU waits for the other. Each round trip runs the send probe twice and the receive probe twice: {per_rt:.0} ns of probe time (gross, with the stats accounting, measured in section 2), {:.1}% of the {cpu_per_rt_ns:.0} ns of CPU a round trip takes at {rt_none:.0} round trips/s on {cores:.0} cores; the rest of the loss is what the probes cost around their own run time (the tracepoint's dispatch and the caches). The net cost per probe ({:.0} ns send, {:.0} ns receive in this run) is a socket-local storage lookup (`bpf_sk_storage_get` from a BTF tracepoint, no hash map) plus the state machine that follows requests: the receive probe takes the data's arrival time from the socket (`tcp_clock_cache`: one load, through the `bpf_rdonly_cast` kfunc, which the verifier turns into a register move, on 6.2+ as here, or through the `bpf_skc_to_tcp_sock` helper before), a write right after the last read (a client's next request, a server's answer) is timed from jiffies and that arrival with no helper call, so none of the four probe runs per round trip reads the clock; `tcp_sock` sequence numbers are read only for requests after a quiet spell of 100 ms and at decisions (a FIN, an RST, a close). This is the worst case (32-byte messages, no work per request, every core busy with nothing but TCP); with real request sizes and work per request the fixed per-call cost is a smaller share.\n",
        sep * 100.0,
        sep_lo * 100.0,
        sep_hi * 100.0,
        hot_share * 100.0,
        send_net,
        recv_net
    );
    let _ = writeln!(s, "A negative loss means the run with observer was faster than the run without: the difference is inside the noise.\n");
    let _ = writeln!(
        s,
        "**What a connection costs, and what this machine says about the ring buffer.** The probes now decide every outcome by TCP sequence state (`write_seq`, `snd_una`, `rcv_nxt`, `copied_seq` read at BTF-resolved offsets) and keep their state in socket-local storage, which the kernel allocates when a connection is established ({:.0} bytes of slab per socket, measured in 6.) and frees with the socket; the hash map it replaced was preallocated. So a short connection pays an allocation, a free and the state-change program ({} ns per run under churn, about five runs per connection on loopback between both ends; section 2), where the old probes paid a map insert. For scale, on this machine an empty program costs {} ns (send) / {} ns (receive) and bpftrace's equivalents cost {} / {} ns here. The ring buffer lost nothing at any offered rate; the highest rate is what this 2-core machine's unpaced load generator reached, not a loss threshold.\n",
        me["storage_bytes_per_socket"].as_f64().unwrap_or(f64::NAN),
        int(&kc["state_gross_ns"]),
        int(&kc["observer_ns_per_run"]["bench_empty_send"]["ns"]),
        int(&kc["observer_ns_per_run"]["bench_empty_recv"]["ns"]),
        int(&kc["bpftrace_ns_per_run"]["sock_send_lengt"]["ns"]),
        int(&kc["bpftrace_ns_per_run"]["sock_recv_lengt"]["ns"]),
    );
    let _ = writeln!(s, "## Method\n\nEvery comparison runs in one invocation, interleaved (the order rotates each round), and is reported as a ratio to the run without probes; absolute numbers on these machines are noisy and are given only beside the ratios, as min / **median** / max over the rounds.\n");
    let _ = writeln!(s, "1. **Hot path, separate runs**: {} loopback connections, 32-byte messages, ping-pong for {} s per run, {} rounds of (no probes, `observer run`, `bpftrace bench/idle-bookkeeping.bt`). The bpftrace script does the same per-socket bookkeeping on `sock:sock_send_length`/`sock:sock_recv_length` (last send and receive time per socket in maps, a line only on a reuse after 1 s idle).", hp["connections"], hp["seconds_per_run"], plan_rounds(hp));
    let _ = writeln!(s, "1b. **Hot path, interleaved** (the headline): the same 4 connections and messages in one ping-pong that never stops, with one `observer run --bench-toggle` throughout; SIGUSR1 detaches the send and receive probes or attaches them again (the load rests while they change, since re-attaching waits for an RCU grace period, and runs 100 ms before the next window). Blocks of four {} s windows, with / without / without / with; the block's ratio is the round trips with over those without. {} ping-pongs of {} blocks for each layout: threads free to move, and each connection's client and server threads pinned to CPU i mod the number of CPUs.", r["hot_path_interleaved"]["seconds_per_window"], r["hot_path_interleaved"]["ping_pongs"], r["hot_path_interleaved"]["blocks_per_ping_pong"]);
    let _ = writeln!(s, "2. **Kernel cost per event**: `kernel.bpf_stats_enabled=1`, run_time_ns / run_cnt of each program over a ping-pong run; observer's run also attaches empty programs on the same two hooks (`--bench-empty-probes`), whose figure (the fixed cost of a program plus the stats accounting) is subtracted to give the net cost. The state-change hooks barely run in a ping-pong, so a second observer run measures them over connection churn (as in 3.), with an empty program on `inet_sock_set_state` beside the real one.");
    let _ = writeln!(s, "3. **Churn**: 2 client threads doing connect, 32-byte request, response, close, {} s per run, with and without observer.", hp["seconds_per_run"]);
    let _ = writeln!(s, "4. **Pipeline**: `observer debug bench-pipeline`: {} synthetic kernel records over 1000 destinations (60% reuses, peer and local closes, connection events) decoded, aggregated and counted in the metrics on one core.", pl["events_per_run"]);
    let _ = writeln!(s, "5. **Ring buffer**: `observer run --min-idle 0s` so every request is a reuse (two events per round trip), 4 connections paced to offer 25k, 50k, 100k, 200k events/s, then unpaced, then 50k again with 10 clients scraping `/metrics` and `/api/v1/destinations` in a loop (any loss there fails the run); events delivered per second and `observer_events_lost_total` from `/metrics`.");
    let _ = writeln!(s, "6. **Memory**: {} connections to {} listening ports on loopback (both ends tracked), one connection per port closed to give each destination evidence; daemon VmRSS after the socket table refresh and its peak (VmHWM, the figure judged: it covers start-up, where the kernel's BTF is parsed, and every refresh and scrape), and the `bytes_memlock` of its maps (bpftool); socket-local storage as the unreclaimable slab (`SUnreclaim`) the kernel gives back when the daemon stops with the connections still open.\n", me["connections"], me["destinations"]);
    let _ = writeln!(s, "## Figures\n\n### 1. Hot path, separate runs (round trips per second)\n\n| mode | round trips/s (min / median / max) |\n|---|---|");
    for mode in ["none", "observer", "bpftrace"] {
        let _ = writeln!(s, "| {mode} | {} |", mmm(&hp["round_trips_per_second"][mode], 1.0, ""));
    }
    let _ = writeln!(
        s,
        "\n| ratio | min / median / max |\n|---|---|\n| observer / none | {} |\n| bpftrace / none | {} |\n",
        ratio(&hp["ratio_observer_to_none"]),
        ratio(&hp["ratio_bpftrace_to_none"])
    );
    let _ = writeln!(s, "### 1b. Hot path, interleaved (round trips per second)\n\n| layout | with observer | without | ratio with / without (min / median / max) |\n|---|---|---|---|");
    for layout in ["free", "pinned"] {
        let fig = &layouts[layout];
        let _ = writeln!(
            s,
            "| {layout} | {} | {} | {} |",
            mmm(&fig["round_trips_per_second"]["observer"], 1.0, ""),
            mmm(&fig["round_trips_per_second"]["none"], 1.0, ""),
            ratio(&fig["ratio_observer_to_none"])
        );
    }
    let _ = writeln!(s);
    let _ =
        writeln!(s, "### 2. Kernel cost per event (ns per run, gross)\n\n| program | ns/run | runs |\n|---|---|---|");
    for who in ["observer_ns_per_run", "bpftrace_ns_per_run"] {
        if let Some(map) = kc[who].as_object() {
            for (k, v) in map {
                let _ = writeln!(
                    s,
                    "| {} `{k}` | {} | {} |",
                    if who.starts_with("observer") { "observer" } else { "bpftrace" },
                    int(&v["ns"]),
                    v["runs"]
                );
            }
        }
    }
    let _ = writeln!(
        s,
        "\nNet (minus the empty program on the same hook): send {send_net:.0} ns, receive {recv_net:.0} ns.\n"
    );
    if let Some(map) = kc["churn_ns_per_run"].as_object() {
        let _ = writeln!(
            s,
            "Under connection churn (2 client threads, {} s; the state-change hooks warm):\n\n| program | ns/run | runs |\n|---|---|---|",
            hp["seconds_per_run"]
        );
        for (k, v) in
            map.iter().filter(|(k, _)| !k.starts_with("bench_empty_send") && !k.starts_with("bench_empty_recv"))
        {
            let _ = writeln!(s, "| observer `{k}` | {} | {} |", int(&v["ns"]), v["runs"]);
        }
        let _ = writeln!(
            s,
            "\nState change (`inet_sock_set_state`): {} ns per run gross, {} ns net of the empty program on the same hook (target: under 500 ns a run). Before the change that read `sk_protocol` and the addresses by direct BTF loads and let a connection's `established`/`closed` records skip the reader's wakeup (an `irq_work` interrupt per record), the same measurement gave 1,708 ns gross (1,653 net) on the probes of `738a54a` and 1,518 ns with the direct loads alone, on this machine on 2026-12-01.\n",
            int(&kc["state_gross_ns"]),
            int(&kc["state_net_ns"])
        );
    }
    let _ = writeln!(s, "### 3. Churn (connections per second)\n\n| mode | min / median / max |\n|---|---|\n| none | {} |\n| observer | {} |\n| ratio observer / none | {} |\n", mmm(&ch["connections_per_second"]["none"], 1.0, ""), mmm(&ch["connections_per_second"]["observer"], 1.0, ""), ratio(&ch["ratio_observer_to_none"]));
    let _ = writeln!(
        s,
        "### 4. Pipeline\n\n{} events/s on one core (min / median / max).\n\nThe `/metrics` scrape after a run over {} destinations (every destination with ok and failed reuses, peer and local closes): {} series, {} bytes. One build of the table over them (what the HTTP side does at most 4 times a second, a row at a time under the aggregator's lock): {:.1} ms in all; the longest row, the longest the event reader waits because of a scrape: {:.0} us.\n",
        mmm(&pl["events_per_second_one_core"], 1.0, ""),
        pl["scrape_after_run"]["destinations"],
        pl["scrape_after_run"]["series"],
        pl["scrape_after_run"]["bytes"],
        pl["scrape_after_run"]["table_rebuild_seconds"].as_f64().unwrap_or(f64::NAN) * 1e3,
        pl["scrape_after_run"]["table_row_max_seconds"].as_f64().unwrap_or(f64::NAN) * 1e6
    );
    let _ = writeln!(s, "### 5. Ring buffer (1 MiB)\n\n| offered events/s | clients scraping in a loop (scrapes) | delivered events/s | lost (ring buffer full) | not stored (store backlog) |\n|---|---|---|---|---|");
    for l in rb["levels"].as_array().into_iter().flatten() {
        let offered =
            l["offered_events_per_second"].as_f64().map_or_else(|| "unpaced".to_owned(), |o| format!("{o:.0}"));
        let _ = writeln!(
            s,
            "| {offered} | {} ({}) | {} | {} | {} |",
            l["scrapers"].as_u64().unwrap_or(0),
            l["scrapes"].as_u64().unwrap_or(0),
            int(&l["events_per_second"]),
            int(&l["ring_buffer_lost"]),
            int(&l["store_backlog_dropped"])
        );
    }
    let _ = writeln!(s, "\n### 6. Memory\n\n| | |\n|---|---|\n| tracked sockets | {} |\n| destination rows (1000 with their own label, plus `other` per role) | {} |\n| daemon RSS before the load | {:.1} MiB |\n| daemon RSS with the load, at the end / peak | {rss_mib:.1} MiB / {peak_mib:.1} MiB |\n| kernel map memory (bytes_memlock) | {:.1} MiB |\n| socket-local storage (slab given back when the daemon stopped) | {:.1} MiB, {:.0} bytes per tracked socket |\n", int(&me["tracked_sockets"]), me["destinations"], me["rss_bytes_idle"].as_f64().unwrap_or(0.0) / 1_048_576.0, me["kernel_map_mib"].as_f64().unwrap_or(f64::NAN), me["storage_mib"].as_f64().unwrap_or(f64::NAN), me["storage_bytes_per_socket"].as_f64().unwrap_or(f64::NAN));
    s
}

fn plan_rounds(hp: &Value) -> u64 {
    hp["ratio_observer_to_none"]["n"].as_u64().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::{median_interval, settled};

    #[test]
    fn a_target_is_judged_on_the_whole_interval() {
        assert_eq!(settled(0.01, 0.029, 0.03, true), "met");
        assert_eq!(settled(0.031, 0.05, 0.03, true), "**missed**");
        assert_eq!(settled(0.028, 0.033, 0.03, true), "**not settled** (the interval spans the target)");
        assert_eq!(settled(0.01, 0.02, 0.03, false), "**missed**", "the other condition fails");
        assert_eq!(settled(f64::NAN, f64::NAN, 0.03, true), "**not settled** (the interval spans the target)");
    }

    #[test]
    fn median_interval_is_the_order_statistics_of_the_binomial() {
        let v: Vec<f64> = (1..=15).map(f64::from).collect();
        // n = 15: P(B <= 3) = 1.8%, P(B <= 4) = 5.9%: the 4th and 12th.
        assert_eq!(median_interval(&v), Some((4.0, 12.0)));
        let v: Vec<f64> = (1..=9).map(f64::from).collect();
        assert_eq!(median_interval(&v), Some((2.0, 8.0)));
        let v: Vec<f64> = (1..=5).map(f64::from).collect();
        assert_eq!(median_interval(&v), None, "five values cannot give 95%");
    }
}

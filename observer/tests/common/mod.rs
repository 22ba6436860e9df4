//! Helpers for the root integration tests: the observer daemon as a child
//! process, network namespaces that are always removed, and event matching.
#![allow(dead_code, reason = "each test binary uses a different subset")]
#![allow(clippy::unwrap_used, clippy::missing_panics_doc, reason = "test helpers")]

use std::{
    io::{BufRead, BufReader},
    path::PathBuf,
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, LazyLock, Mutex, OnceLock},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use observer::kernel::event::SockEvent;

/// The observer binary under test: `OBSERVER_BIN` when set (`cargo xtask
/// test` sets it to the release build, the binary that ships and the one
/// that is fast enough under TCG), else this build's own.
pub static OBSERVER: LazyLock<&'static str> = LazyLock::new(|| {
    std::env::var("OBSERVER_BIN").map_or(env!("CARGO_BIN_EXE_observer"), |p| Box::leak(p.into_boxed_str()))
});

/// How far the kernel's idle age may be from the test client's own clock
/// (started at the reply's arrival, see `arrived_fn!`): 20 ms, times
/// `OBSERVER_TEST_TIME_SLACK` (the kernel matrix sets 5: under QEMU's TCG a
/// Python client's clock read and its send can be tens of ms apart, which
/// is the client's jitter, not the probes').
pub fn idle_precision() -> f64 {
    tolerance(0.020)
}

/// A timing tolerance of `base` seconds on this host, times
/// `OBSERVER_TEST_TIME_SLACK` under emulation (a Python `settimeout` or
/// `sleep` fires late by tens of ms under TCG; the probes' clock does not).
pub fn tolerance(base: f64) -> f64 {
    let slack = std::env::var("OBSERVER_TEST_TIME_SLACK").ok().and_then(|v| v.parse::<f64>().ok()).unwrap_or(1.0);
    base * slack.max(1.0)
}

/// A timer of `configured` seconds (a server's idle timeout, a client's
/// sleep or deadline) as observer measured it, asymmetrically: late by at
/// most `tolerance(late)`, since a timer fires late (by tens to hundreds
/// of ms under QEMU's TCG, which `OBSERVER_TEST_TIME_SLACK` widens), but
/// early by at most `tolerance(0.05)`: no timer fires early, so only the
/// delivery of the last byte before it (a loaded host deferred one by 41
/// ms) can make it look so (a 1.5 s timeout no longer passes at 1.0 s in
/// a guest).
pub fn fired(measured: f64, configured: f64, late: f64) -> bool {
    measured >= configured - tolerance(0.05) && measured <= configured + tolerance(late)
}

/// Run a command, fail with its output if it fails.
pub fn sh(cmd: &str) -> Result<String> {
    let out = Command::new("sh").arg("-c").arg(cmd).output().with_context(|| format!("spawning `{cmd}`"))?;
    if !out.status.success() {
        bail!(
            "`{cmd}` failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A running `observer run --events=json`, killed on drop.
pub struct Daemon {
    child: Child,
    /// The evidence store's directory when the test did not choose one.
    data: Option<tempfile::TempDir>,
    events: Arc<Mutex<Vec<SockEvent>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// Start the daemon with extra args and wait until its probes are attached.
    pub fn start(extra: &[&str]) -> Result<Self> {
        Self::start_as(&[], extra)
    }

    /// Start the daemon as the shipped unit and `DaemonSet` run it: user
    /// 65534 with exactly `CAP_BPF` and `CAP_PERFMON`, its evidence store
    /// in a directory that user owns.
    pub fn start_as_unit(extra: &[&str]) -> Result<Self> {
        let data = tempfile::tempdir()?;
        let mut d = Self::start_as_unit_in(data.path(), extra)?;
        d.data = Some(data);
        Ok(d)
    }

    /// [`Daemon::start_as_unit`] with its evidence store in `dir` (made the
    /// daemon user's).
    pub fn start_as_unit_in(dir: &std::path::Path, extra: &[&str]) -> Result<Self> {
        sh(&format!("chown 65534:65534 {}", dir.display()))?;
        let wrapper = as_nobody_with("bpf,perfmon");
        let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
        let path = dir.to_str().context("data dir")?.to_owned();
        Self::start_as(&wrapper, &[extra, &["--data-dir", path.as_str()]].concat())
    }

    /// Start the daemon through `wrapper` (e.g. `setpriv ...`), with extra args.
    pub fn start_as(wrapper: &[&str], extra: &[&str]) -> Result<Self> {
        Self::start_with(wrapper, &[], extra)
    }

    /// Start the daemon with these environment variables (as a unit's
    /// `Environment=` or a pod's `env:` sets them), and extra args.
    pub fn start_env(env: &[(&str, &str)], extra: &[&str]) -> Result<Self> {
        Self::start_with(&[], env, extra)
    }

    fn start_with(wrapper: &[&str], env: &[(&str, &str)], extra: &[&str]) -> Result<Self> {
        let mut args = vec!["run", "--events=json", "--connections"];
        if !extra.contains(&"--metrics-addr") {
            args.extend(["--metrics-addr", "127.0.0.1:0"]);
        }
        let data = if extra.contains(&"--data-dir") { None } else { Some(tempfile::tempdir()?) };
        let data_path = data.as_ref().map(|d| d.path().display().to_string());
        if let Some(p) = &data_path {
            args.extend(["--data-dir", p.as_str()]);
        }
        let (program, pre) = match wrapper.split_first() {
            Some((p, rest)) => (*p, [rest, &[*OBSERVER]].concat()),
            None => (*OBSERVER, Vec::new()),
        };
        let mut cmd = Command::new(program);
        // Which executable each client was told by, in the test's output.
        if std::env::var_os("RUST_LOG").is_none() {
            cmd.env("RUST_LOG", "info,observer::kernel::runtime=debug");
        }
        cmd.envs(env.iter().copied());
        let mut child = cmd
            .args(&pre)
            .args(&args)
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("spawning observer")?;
        let events = Arc::new(Mutex::new(Vec::new()));
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let out = child.stdout.take().unwrap();
        let ev = Arc::clone(&events);
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                match serde_json::from_str::<SockEvent>(&line) {
                    Ok(e) => ev.lock().unwrap().push(e),
                    Err(err) => eprintln!("observer stdout (not an event: {err}): {line}"),
                }
            }
        });
        let err = child.stderr.take().unwrap();
        let se = Arc::clone(&stderr);
        let (ready_tx, ready_rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                eprintln!("observer: {line}");
                if line.contains("observer running") {
                    let _ = ready_tx.send(());
                }
                se.lock().unwrap().push(line);
            }
        });
        let mut d = Self { child, data, events, stderr };
        // Loading takes tens of seconds in a guest under TCG beside
        // other suites (28 s once): the slack widens it there.
        let within = tolerance(30.0);
        if ready_rx.recv_timeout(Duration::from_secs_f64(within)).is_err() {
            let status = d.child.try_wait().ok().flatten();
            bail!("observer did not come up within {within} s (exit: {status:?}); stderr: {:?}", d.stderr_lines());
        }
        Ok(d)
    }

    pub fn events(&self) -> Vec<SockEvent> {
        self.events.lock().unwrap().clone()
    }

    /// The HTTP address the daemon logged.
    pub fn http_addr(&self) -> Result<String> {
        self.stderr_lines()
            .iter()
            .find_map(|l| l.split("serving http://").nth(1).and_then(|r| r.split('/').next()).map(str::to_owned))
            .context("daemon did not log its HTTP address")
    }

    /// `observer status --json` against this daemon.
    pub fn status(&self) -> Result<Vec<observer::diagnosis::aggregate::DestinationRow>> {
        let out = Command::new(*OBSERVER).args(["status", "--json", "--addr", &self.http_addr()?]).output()?;
        if !out.status.success() {
            bail!("observer status failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        serde_json::from_slice(&out.stdout).context("observer status --json output")
    }

    /// The daemon's `/metrics` exposition.
    pub fn metrics(&self) -> Result<String> {
        let body = observer::surfaces::http::get(&self.http_addr()?, "/metrics").map_err(anyhow::Error::msg)?;
        Ok(String::from_utf8(body)?)
    }

    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// Wait until the daemon has caught up: no event printed for `quiet`.
    /// A daemon starved of CPU (40 busy Python threads on a 2-CPU guest
    /// under TCG) drains the ring buffer seconds behind the traffic; its
    /// table is read only once it has printed the last event, so a fixed
    /// sleep cannot pass for "every event counted".
    pub fn caught_up(&self, quiet: Duration, limit: Duration) -> Result<()> {
        let start = Instant::now();
        let (mut seen, mut since) = (self.events.lock().unwrap().len(), Instant::now());
        loop {
            std::thread::sleep(Duration::from_millis(100));
            let n = self.events.lock().unwrap().len();
            if n != seen {
                (seen, since) = (n, Instant::now());
            } else if since.elapsed() >= quiet {
                return Ok(());
            }
            if start.elapsed() > limit {
                bail!(
                    "the daemon was still printing events {:.0} s after the traffic ended ({seen} so far)",
                    limit.as_secs_f64()
                );
            }
        }
    }

    /// Wait until `pred` holds for the events seen so far, or time out.
    pub fn wait_for(
        &self,
        what: &str,
        timeout: Duration,
        pred: impl Fn(&[SockEvent]) -> bool,
    ) -> Result<Vec<SockEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            let evs = self.events();
            if pred(&evs) {
                return Ok(evs);
            }
            if Instant::now() > deadline {
                bail!("timed out waiting for {what}; events seen: {evs:#?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn pid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    /// Send SIGTERM and wait for the exit status.
    pub fn terminate(self) -> Result<std::process::ExitStatus> {
        sh(&format!("kill -TERM {}", self.child.id()))?;
        self.terminate_after_signal()
    }

    /// SIGTERM, the exit status, and every event printed up to the exit.
    pub fn terminate_with_events(self) -> Result<(std::process::ExitStatus, Vec<SockEvent>)> {
        let events = Arc::clone(&self.events);
        let status = self.terminate()?;
        // The stdout reader ends at EOF, after the last line.
        std::thread::sleep(Duration::from_millis(500));
        let evs = events.lock().unwrap().clone();
        Ok((status, evs))
    }

    /// Wait for the exit status after a signal was sent.
    pub fn terminate_after_signal(mut self) -> Result<std::process::ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if let Some(st) = self.child.try_wait()? {
                return Ok(st);
            }
            if Instant::now() > deadline {
                bail!("observer did not exit within 20 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Network namespaces (and anything in them) removed on drop.
pub struct Netns {
    pub names: Vec<String>,
}

impl Netns {
    /// Create namespaces with unique names `obs-<tag>-<pid>-<i>`.
    pub fn create(tag: &str, count: usize) -> Result<Self> {
        let pid = std::process::id();
        let names: Vec<String> = (0..count).map(|i| format!("obs-{tag}-{pid}-{i}")).collect();
        let mut ns = Self { names: Vec::new() };
        for n in &names {
            // One shell per namespace: under TCG each process costs a
            // fraction of a second. No duplicate address detection:
            // addresses (link-local too) are usable at once, so the first
            // connection is not delayed.
            let made = sh(&format!(
                "ip netns add {n} && ip netns exec {n} sh -c 'sysctl -qw net.ipv6.conf.all.accept_dad=0 \
                 net.ipv6.conf.default.accept_dad=0 && ip link set lo up'"
            ));
            // Pushed even on failure: a half-made namespace is removed too.
            ns.names.push(n.clone());
            made?;
        }
        Ok(ns)
    }

    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// `ip netns exec <ns> sh -c cmd`.
    pub fn exec(&self, i: usize, cmd: &str) -> Result<String> {
        sh(&format!("ip netns exec {} sh -c '{}'", self.names[i], cmd.replace('\'', r"'\''")))
    }

    /// Spawn a long-running command in namespace `i` (killed with the namespace).
    pub fn spawn(&self, i: usize, cmd: &str) -> Result<Child> {
        Command::new("ip")
            .args(["netns", "exec", &self.names[i], "sh", "-c", &format!("exec {cmd}")])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("spawning `{cmd}` in {}", self.names[i]))
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        for n in &self.names {
            // Kill whatever still runs inside, then remove the namespace.
            let _ = sh(&format!("kill -9 $(ip netns pids {n}) 2>/dev/null; ip netns del {n}"));
        }
    }
}

/// `setpriv` arguments: user nobody, only the given capabilities (ambient,
/// so they survive the exec), nothing else in the bounding set: the
/// daemon as the systemd unit and the `DaemonSet` run it
/// (`as_nobody_with("bpf,perfmon")`).
pub fn as_nobody_with(caps: &str) -> Vec<String> {
    let caps = caps.split(',').map(|c| format!("+{c}")).collect::<Vec<_>>().join(",");
    vec![
        "setpriv".into(),
        "--reuid=65534".into(),
        "--regid=65534".into(),
        "--clear-groups".into(),
        format!("--inh-caps=-all,{caps}"),
        format!("--ambient-caps=-all,{caps}"),
        format!("--bounding-set=-all,{caps}"),
    ]
}

/// Kill a child on drop.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A test network: `client` and `server` namespaces, joined directly
/// (`pair`) or through a `router` namespace that runs conntrack (`routed`).
pub struct Topology {
    pub ns: Netns,
    pub client: usize,
    pub server: usize,
    pub router: Option<usize>,
    pub server_v4: String,
    pub server_v6: String,
}

impl Topology {
    /// client (`10.201.1.2`, `fd00:201:1::2`) <-> server (`10.201.1.1`, `fd00:201:1::1`).
    pub fn pair(tag: &str) -> Result<Self> {
        let ns = Netns::create(tag, 2)?;
        let (c, s) = (ns.name(0).to_owned(), ns.name(1).to_owned());
        sh(&format!(
            "ip -n {c} link add c0 type veth peer name s0 netns {s} && \
             ip -n {c} addr add 10.201.1.2/24 dev c0 && ip -n {c} addr add fd00:201:1::2/64 dev c0 nodad && ip -n {c} link set c0 up && \
             ip -n {s} addr add 10.201.1.1/24 dev s0 && ip -n {s} addr add fd00:201:1::1/64 dev s0 nodad && ip -n {s} link set s0 up"
        ))?;
        Ok(Self {
            ns,
            client: 0,
            server: 1,
            router: None,
            server_v4: "10.201.1.1".into(),
            server_v6: "fd00:201:1::1".into(),
        })
    }

    /// client (10.201.1.2) <-> router <-> server (10.201.2.2), IPv4 and IPv6.
    /// The router forwards with conntrack: established flows expire after
    /// `ct_timeout_s` of silence, `nf_conntrack_tcp_loose=0` keeps expired
    /// flows from being picked up again, and packets in state invalid get
    /// `verdict` (`reject with tcp reset` or `drop`).
    pub fn routed(tag: &str, ct_timeout_s: u32, verdict: &str) -> Result<Self> {
        let topo = Self::linked(tag)?;
        // The conntrack sysctls exist once the ct expression loaded nf_conntrack.
        topo.ns.exec(
            1,
            &format!(
                "sysctl -qw net.ipv4.ip_forward=1 net.ipv6.conf.all.forwarding=1 && \
                 nft add table inet observer_test && \
                 nft add chain inet observer_test forward_filter \"{{ type filter hook forward priority 0; policy accept; }}\" && \
                 nft add rule inet observer_test forward_filter ct state invalid {verdict} && \
                 sysctl -qw net.netfilter.nf_conntrack_tcp_timeout_established={ct_timeout_s} net.netfilter.nf_conntrack_tcp_loose=0"
            ),
        )?;
        Ok(topo)
    }

    /// The routed topology (IPv4), with the router split into two paths
    /// as ECMP splits flows: a flow whose client port has bit 1 clear
    /// passes a middlebox that forgets flows idle `short_s` seconds, the
    /// others one that forgets them after `long_s`; a forgotten flow's
    /// packets are dropped silently. (nftables dynamic sets with a timeout,
    /// refreshed by every packet of the flow: `ct timeout` objects do not
    /// apply on 6.18. Linux `connect()` prefers even ports, so bit 1 splits
    /// the flows, not bit 0.)
    pub fn forked(tag: &str, short_s: u32, long_s: u32) -> Result<Self> {
        let topo = Self::linked(tag)?;
        let rules = format!(
            r#"table inet observer_fork {{
  set short {{ type ipv4_addr . inet_service; flags dynamic, timeout; timeout {short_s}s; }}
  set long {{ type ipv4_addr . inet_service; flags dynamic, timeout; timeout {long_s}s; }}
  chain forward {{
    type filter hook forward priority 0; policy accept;
    meta nfproto != ipv4 accept
    meta l4proto != tcp accept
    iifname "r0" tcp sport & 2 == 0 jump out_short
    iifname "r0" jump out_long
    iifname "r1" tcp dport & 2 == 0 jump back_short
    iifname "r1" jump back_long
  }}
  chain out_short {{
    tcp flags & (syn | ack) == syn update @short {{ ip saddr . tcp sport }} accept
    ip saddr . tcp sport @short update @short {{ ip saddr . tcp sport }} accept
    drop
  }}
  chain out_long {{
    tcp flags & (syn | ack) == syn update @long {{ ip saddr . tcp sport }} accept
    ip saddr . tcp sport @long update @long {{ ip saddr . tcp sport }} accept
    drop
  }}
  chain back_short {{
    ip daddr . tcp dport @short update @short {{ ip daddr . tcp dport }} accept
    drop
  }}
  chain back_long {{
    ip daddr . tcp dport @long update @long {{ ip daddr . tcp dport }} accept
    drop
  }}
}}
"#
        );
        let file = script(&rules)?;
        topo.ns.exec(1, &format!("sysctl -qw net.ipv4.ip_forward=1 && nft -f {}", file.display()))?;
        Ok(topo)
    }

    /// client (10.201.1.2) <-> router <-> server (10.201.2.2), IPv4 and
    /// IPv6, addressed and routed; the router's rules are the caller's.
    fn linked(tag: &str) -> Result<Self> {
        let ns = Netns::create(tag, 3)?;
        let (c, r, s) = (ns.name(0).to_owned(), ns.name(1).to_owned(), ns.name(2).to_owned());
        sh(&format!(
            "ip -n {c} link add c0 type veth peer name r0 netns {r} && \
             ip -n {s} link add s0 type veth peer name r1 netns {r} && \
             ip -n {c} addr add 10.201.1.2/24 dev c0 && ip -n {c} addr add fd00:201:1::2/64 dev c0 nodad && ip -n {c} link set c0 up && \
             ip -n {c} route add default via 10.201.1.1 && ip -n {c} -6 route add default via fd00:201:1::1 && \
             ip -n {s} addr add 10.201.2.2/24 dev s0 && ip -n {s} addr add fd00:201:2::2/64 dev s0 nodad && ip -n {s} link set s0 up && \
             ip -n {s} route add default via 10.201.2.1 && ip -n {s} -6 route add default via fd00:201:2::1 && \
             ip -n {r} addr add 10.201.1.1/24 dev r0 && ip -n {r} addr add fd00:201:1::1/64 dev r0 nodad && ip -n {r} link set r0 up && \
             ip -n {r} addr add 10.201.2.1/24 dev r1 && ip -n {r} addr add fd00:201:2::1/64 dev r1 nodad && ip -n {r} link set r1 up"
        ))?;
        Ok(Self {
            ns,
            client: 0,
            server: 2,
            router: Some(1),
            server_v4: "10.201.2.2".into(),
            server_v6: "fd00:201:2::2".into(),
        })
    }
}

impl Topology {
    /// Ping the server from the client (IPv4 and IPv6) until it answers.
    fn wait_reachable(&self) -> Result<()> {
        for addr in [&self.server_v4, &self.server_v6] {
            let deadline = Instant::now() + Duration::from_secs(10);
            while self.ns.exec(self.client, &format!("ping -c1 -W1 {addr}")).is_err() {
                if Instant::now() > deadline {
                    bail!("{addr} unreachable from the client namespace");
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(())
    }
}

/// Write a script to a temp file that lives as long as the returned handle.
pub fn script(body: &str) -> Result<tempfile::TempPath> {
    use std::io::Write as _;
    let mut f = tempfile::Builder::new().suffix(".py").tempfile()?;
    f.write_all(body.as_bytes())?;
    Ok(f.into_temp_path())
}

/// A TCP echo server: `python3 ECHO_SERVER HOST PORT [IDLE_TIMEOUT]`;
/// prints `ready`. A request that is exactly `reset` is answered with an
/// RST (a stray reset). With `IDLE_TIMEOUT` (seconds), a connection
/// without a request that long is closed (FIN): a server's idle timeout.
pub const ECHO_SERVER: &str = include_str!("echo_server.py");

/// A free loopback port below Linux's ephemeral range (32768 and up), as
/// most real servers' are: where a daemon that starts after the
/// connections were made cannot use the listeners, it tells their roles
/// from the ports (`role::guess`), and a server on an ephemeral port above
/// its clients' would read as the client.
pub fn server_port() -> Result<u16> {
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

/// Start a process in a namespace and wait for it to print `ready`.
pub fn start_server(ns: &Netns, i: usize, cmd: &str) -> Result<Killed> {
    wait_ready(ns.spawn(i, cmd)?, cmd)
}

/// Start a process in this namespace and wait for it to print `ready`.
pub fn start_server_here(cmd: &str) -> Result<Killed> {
    let child = Command::new("sh")
        .args(["-c", &format!("exec {cmd}")])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("spawning `{cmd}`"))?;
    wait_ready(child, cmd)
}

fn wait_ready(mut child: Child, cmd: &str) -> Result<Killed> {
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains("ready") {
                let _ = tx.send(());
            }
        }
    });
    if rx.recv_timeout(Duration::from_secs_f64(tolerance(10.0))).is_err() {
        let _ = child.kill();
        let out = child.wait_with_output()?;
        bail!("server `{cmd}` did not get ready: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(Killed(child))
}

/// Client-side record of one reuse, printed by the test clients.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct ClientReuse {
    pub gap: f64,
    /// From the last reply's arrival (the kernel's clock) to the reuse.
    pub idle: f64,
    pub local: (String, u16),
    pub result: String,
}

impl ClientReuse {
    pub fn local_addr(&self) -> std::net::SocketAddr {
        let ip: std::net::IpAddr = self.local.0.parse().unwrap();
        std::net::SocketAddr::new(ip, self.local.1)
    }
}

/// Reuse events on the socket `local`.
pub fn reuses_from(events: &[SockEvent], local: std::net::SocketAddr) -> Vec<SockEvent> {
    events
        .iter()
        .filter(|e| e.kind() == observer::kernel::event::EventKind::Reuse && e.local == local)
        .cloned()
        .collect()
}

/// The observer reuse event that matches a client record (same socket,
/// closest idle age), and the idle-age disagreement in seconds.
pub fn matching(events: &[SockEvent], rec: &ClientReuse) -> Result<(SockEvent, f64)> {
    let best = reuses_from(events, rec.local_addr())
        .into_iter()
        .min_by(|a, b| (a.idle_seconds - rec.idle).abs().total_cmp(&(b.idle_seconds - rec.idle).abs()))
        .with_context(|| format!("no reuse event for {rec:?}; events: {events:#?}"))?;
    let err = (best.idle_seconds - rec.idle).abs();
    Ok((best, err))
}

/// Parse the JSON lines a test client printed.
pub fn client_records(stdout: &str) -> Result<Vec<ClientReuse>> {
    stdout
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).with_context(|| format!("client line {l}")))
        .collect()
}

/// Python: `arrived(c)`, the `time.monotonic()` at which the last reply
/// reached socket `c` (or `c.sock`), from the kernel's
/// `tcpi_last_data_recv` (ms since the last data segment arrived, offset 52
/// of `struct tcp_info` since 2.6). The test clients start their idle clock
/// there, not when their read returned: the probes time idle from the
/// wire, and under QEMU's TCG a Python read can return long after its data
/// arrived (seen once in CI: 4.198 s on the wire, 4.004 s by the client's
/// clock).
///
/// And `sent(c, t)`, called right after a write: when the last data left
/// socket `c`, from `tcpi_last_data_sent` (offset 44; a retransmission
/// moves it too, so it is read at once, long before any RTO), but never
/// before `t`, the client's clock just before it wrote. The reuse's idle
/// age ends there: under TCG a Python write can reach the kernel long after
/// the client read its clock (seen once in CI: 1.625 s on the wire, 1.507 s
/// by the client's clock). A write that failed keeps `t`. `wrote(c)` is
/// the same for the `exchange(c)` of `reuse_loop!`, which calls it after
/// its request is written.
macro_rules! arrived_fn {
    () => {
        r#"
import socket as _socket, struct as _struct, time as _time
def arrived(c):
    s = getattr(c, "sock", c)
    info = s.getsockopt(_socket.IPPROTO_TCP, _socket.TCP_INFO, 104)
    return _time.monotonic() - _struct.unpack_from("I", info, 52)[0] / 1000.0
def sent(c, t):
    s = getattr(c, "sock", c)
    if s is None:
        return t
    try:
        info = s.getsockopt(_socket.IPPROTO_TCP, _socket.TCP_INFO, 104)
    except OSError:
        return t
    return max(t, _time.monotonic() - _struct.unpack_from("I", info, 44)[0] / 1000.0)
_wrote = [None]
def wrote(c):
    _wrote[0] = sent(c, 0.0)
"#
    };
}

/// An echo client that reuses its connection after each gap, printing one
/// JSON line per reuse with its own idle measurement and the result. After a
/// failure it reconnects (one fresh exchange) and goes on, or stops with a
/// fifth argument `stop`:
/// `python3 RECONNECTING_CLIENT HOST PORT GAPS READ_TIMEOUT [stop]`.
pub const RECONNECTING_CLIENT: &str = concat!(
    arrived_fn!(),
    r#"
import json, socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
gaps = [float(g) for g in sys.argv[3].split(",")]
timeout = float(sys.argv[4])
def connect():
    s = socket.create_connection((host, port), timeout=10)
    s.settimeout(timeout)
    # Some exchanges, as a pooled connection has had: the kernel's RTT
    # estimate settles, so its retransmission timeout is the usual ~200 ms
    # even when the handshake itself needed a retransmitted SYN (1 s).
    for _ in range(20):
        s.sendall(b"hello")
        s.recv(100)
    return s
s = connect()
last = arrived(s)
for g in gaps:
    time.sleep(max(0.0, last + g - time.monotonic()))
    t = time.monotonic()
    rec = {"gap": g, "idle": t - last, "local": s.getsockname()[:2], "remote": s.getpeername()[:2]}
    try:
        s.sendall(b"ping")
        rec["idle"] = sent(s, t) - last
        d = s.recv(100)
        rec["result"] = "ok" if d else "eof"
    except socket.timeout:
        rec["result"] = "timeout"
    except (ConnectionResetError, BrokenPipeError):
        rec["result"] = "reset"
    print(json.dumps(rec), flush=True)
    if rec["result"] != "ok":
        s.close()
        if len(sys.argv) > 5 and sys.argv[5] == "stop":
            break
        s = connect()
    last = arrived(s)
s.close()
"#
);

/// The loop of the reconnecting clients, after their prelude defines
/// `gaps`, `connect()`, `exchange(c)` (calling `wrote(c)` once its request
/// is written), `local(c)` and `EOF_ERRORS`: reuse
/// the connection after each gap, print one JSON line per reuse (the
/// client's own idle measurement and the result), and after a failure go
/// on with a fresh connection (one fresh exchange first).
macro_rules! reuse_loop {
    () => {
        concat!(
            arrived_fn!(),
            r#"
c = connect()
exchange(c)
last = arrived(c)
for g in gaps:
    time.sleep(max(0.0, last + g - time.monotonic()))
    t = time.monotonic()
    rec = {"gap": g, "idle": t - last, "local": local(c)}
    _wrote[0] = None
    try:
        exchange(c)
        rec["result"] = "ok"
    except EOF_ERRORS:
        rec["result"] = "eof"
    except (ConnectionResetError, BrokenPipeError):
        rec["result"] = "reset"
    if _wrote[0] is not None:
        rec["idle"] = max(t, _wrote[0]) - last
    print(json.dumps(rec), flush=True)
    if rec["result"] != "ok":
        c.close()
        c = connect()
        exchange(c)
    last = arrived(c)
c.close()
"#
        )
    };
}

/// An HTTP keep-alive client that reuses its connection after each gap and
/// retries on a fresh connection after a failure:
/// `python3 HTTP_RECONNECTING HOST PORT GAPS`; `HTTP_HOST=NAME` in its
/// environment sends that `Host` header (a name for the row) instead of
/// the address.
pub const HTTP_RECONNECTING: &str = concat!(
    r#"
import http.client, json, os, sys, time
host, port = sys.argv[1], int(sys.argv[2])
gaps = [float(g) for g in sys.argv[3].split(",")]
headers = {"Host": os.environ["HTTP_HOST"]} if os.environ.get("HTTP_HOST") else {}
EOF_ERRORS = (http.client.RemoteDisconnected,)
def connect():
    c = http.client.HTTPConnection(host, port, timeout=5)
    c.connect()
    return c
def exchange(c):
    c.request("GET", "/", headers=headers)
    wrote(c)
    r = c.getresponse()
    r.read()
def local(c):
    return c.sock.getsockname()[:2]
"#,
    reuse_loop!()
);

/// 20 gaps, one in the middle of each twentieth of [0.5 T, 1.5 T], dealt
/// round-robin to `clients` clients.
pub fn gaps(t: f64, clients: usize) -> Vec<String> {
    let all: Vec<f64> = (0..20).map(|k| (0.5 + (f64::from(k) + 0.5) / 20.0) * t).collect();
    (0..clients)
        .map(|c| all.iter().skip(c).step_by(clients).map(|g| format!("{g:.3}")).collect::<Vec<_>>().join(","))
        .collect()
}

/// nginx in the server namespace on `server_v4:8080` with
/// `keepalive_timeout` of `keepalive_s` seconds; killed on drop.
pub fn start_nginx(topo: &Topology, dir: &std::path::Path, keepalive_s: u32) -> Result<Killed> {
    start_nginx_with(topo, dir, keepalive_s, 8080, "")
}

/// nginx on `server_v4:port`, with `listen_extra` after the address (e.g.
/// `ssl; ssl_certificate ...`); killed on drop.
pub fn start_nginx_with(
    topo: &Topology,
    dir: &std::path::Path,
    keepalive_s: u32,
    port: u16,
    listen_extra: &str,
) -> Result<Killed> {
    let conf = dir.join("nginx.conf");
    std::fs::write(
        &conf,
        format!(
            "daemon off; master_process off; worker_processes 1; pid {d}/nginx.pid; error_log {d}/error.log;\n\
             events {{ worker_connections 256; }}\n\
             http {{ access_log {d}/access.log; keepalive_timeout {keepalive_s}s;\n\
               server {{ listen {v4}:{port} {listen_extra}; location / {{ return 200 \"ok\\n\"; }} }} }}\n",
            d = dir.display(),
            v4 = topo.server_v4
        ),
    )?;
    let nginx = Killed(topo.ns.spawn(topo.server, &format!("nginx -c {} -p {}", conf.display(), dir.display()))?);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !topo.ns.exec(topo.server, "ss -ltn")?.contains(&format!(":{port}")) {
        if Instant::now() > deadline {
            bail!("nginx did not start: {}", std::fs::read_to_string(dir.join("error.log")).unwrap_or_default());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(nginx)
}

/// A threaded TCP server in Python, `python3 SCRIPT HOST PORT [ARGS...]`:
/// the literal given defines `serve(c)`, what one accepted connection gets
/// (with `socket`, `sys`, `threading` and `time` imported, and `host`,
/// `port` and `args`, the rest of the command line, set); the server
/// listens on `HOST PORT`, prints `ready`, and serves each connection on a
/// thread of its own.
macro_rules! threaded_server {
    ($serve:literal) => {
        concat!(
            "import socket, sys, threading, time\n",
            "host, port, args = sys.argv[1], int(sys.argv[2]), sys.argv[3:]\n",
            $serve,
            "\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n",
            "s.bind((host, port)); s.listen(64)\n",
            "print(\"ready\", flush=True)\n",
            "while True:\n",
            "    c, _ = s.accept()\n",
            "    threading.Thread(target=serve, args=(c,), daemon=True).start()\n",
        )
    };
}
#[allow(unused_imports, reason = "each test binary uses a different subset")]
pub(crate) use threaded_server;

/// A server that reads a request and closes `delay` seconds later without
/// answering (a worker killed at its request timeout):
/// `python3 KILLING_SERVER HOST PORT DELAY`.
pub const KILLING_SERVER: &str = threaded_server!(
    r#"
delay = float(args[0])
def serve(c):
    c.recv(4096)
    time.sleep(delay)
    c.close()
"#
);

/// Fresh connections, one request each, read with a timeout; prints
/// `ip port` and then `ok`/`eof`/`timeout` per connection:
/// `python3 ONE_REQUEST_CLIENT HOST PORT COUNT READ_TIMEOUT`.
pub const ONE_REQUEST_CLIENT: &str = r#"
import socket, sys
host, port, count, timeout = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
for _ in range(count):
    s = socket.create_connection((host, port), timeout=5)
    s.settimeout(timeout)
    s.sendall(b"request")
    try:
        r = "ok" if s.recv(100) else "eof"
    except socket.timeout:
        r = "timeout"
    print(s.getsockname()[0], s.getsockname()[1], flush=True)
    s.close()
"#;

/// Pooled connections, last used SPACING s apart: `python3 IDLE_POOL HOST
/// PORT N WAIT SPACING` prints `ready` once all are idle, reuses each after
/// WAIT s and prints one result per connection.
pub const IDLE_POOL: &str = r#"
import socket, sys, time
host, port, n, wait, spacing = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4]), float(sys.argv[5])
socks = []
for k in range(n):
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(b"hi"); s.recv(100)
    socks.append(s)
    time.sleep(spacing)
print("ready", flush=True)
time.sleep(wait)
res = []
for s in socks:
    try:
        s.sendall(b"again")
        res.append("ok" if s.recv(100) else "eof")
    except OSError:
        res.append("error")
print(" ".join(res), flush=True)
"#;

/// The lines a child prints, as they come (its stdout is taken).
pub fn lines_of(child: &mut Child) -> Result<mpsc::Receiver<String>> {
    let out = child.stdout.take().context("the child's stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    Ok(rx)
}

/// Wait (up to `secs` x the time slack) for a line containing `needle`.
pub fn wait_line(rx: &mpsc::Receiver<String>, needle: &str, secs: f64) -> Result<String> {
    let deadline = Instant::now() + Duration::from_secs_f64(tolerance(secs));
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains(needle) => return Ok(l),
            Ok(_) => {}
            Err(_) => bail!("no line with `{needle}` within {:.0} s", tolerance(secs)),
        }
    }
}

/// The Go TLS tool (`tests/go/tlstool.go`), built once per test run.
pub fn tlstool() -> Result<PathBuf> {
    static BUILT: OnceLock<std::result::Result<PathBuf, String>> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            // The arm64 guest cannot run the host's build: `cargo xtask test
            // --kernel debian-6.12-arm64` cross-builds one and names it here.
            if let Some(bin) = std::env::var_os("OBSERVER_TEST_TLSTOOL") {
                return Ok(PathBuf::from(bin));
            }
            let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("tlstool");
            let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/go/tlstool.go");
            std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
            let bin = dir.join("tlstool");
            // Built by an earlier run (the kernel-matrix VM sees the host's
            // files read-only and reuses the host's build).
            let fresh = |b: &PathBuf| -> Option<bool> {
                Some(std::fs::metadata(b).ok()?.modified().ok()? >= std::fs::metadata(&src).ok()?.modified().ok()?)
            };
            if fresh(&bin) == Some(true) {
                return Ok(bin);
            }
            sh(&format!(
                "cd {d} && GO111MODULE=off GOCACHE={d}/cache GOPATH={d}/gopath:/usr/share/gocode HOME={d} go build -o {b} {s}",
                d = dir.display(),
                b = bin.display(),
                s = src.display()
            ))
            .map_err(|e| format!("building tlstool (Debian's golang-go and golang-golang-x-net-dev): {e:#}"))?;
            Ok(bin)
        })
        .clone()
        .map_err(anyhow::Error::msg)
}

/// A series in a Prometheus text exposition, matched by name and labels:
/// `metric("observer_reuses_total").label("outcome", "ok").value(&body)`.
/// Every suite asserts on `/metrics` this one way.
#[derive(Debug, Clone)]
pub struct Metric {
    name: String,
    labels: Vec<(String, String)>,
}

/// The series named `name` (any labels unless [`Metric::label`] narrows it).
pub fn metric(name: &str) -> Metric {
    Metric { name: name.to_owned(), labels: Vec::new() }
}

impl Metric {
    /// Only series with label `key` equal to `value`.
    #[must_use]
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.push((key.to_owned(), value.to_owned()));
        self
    }

    /// The values of every matching series in `body`.
    pub fn values(&self, body: &str) -> Vec<f64> {
        body.lines().filter_map(|l| self.value_of(l)).collect()
    }

    /// The value of the one matching series; `None` if none or several match.
    pub fn value(&self, body: &str) -> Option<f64> {
        match self.values(body).as_slice() {
            [v] => Some(*v),
            _ => None,
        }
    }

    /// The sum over every matching series (0 when none match).
    pub fn sum(&self, body: &str) -> f64 {
        self.values(body).iter().sum()
    }

    fn value_of(&self, line: &str) -> Option<f64> {
        if line.starts_with('#') {
            return None;
        }
        let (series, value) = line.rsplit_once(' ')?;
        let (name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n, rest.strip_suffix('}')?),
            None => (series, ""),
        };
        if name != self.name {
            return None;
        }
        let have = parse_labels(labels);
        let all = self.labels.iter().all(|(k, v)| have.iter().any(|(hk, hv)| hk == k && hv == v));
        all.then(|| value.parse().ok()).flatten()
    }
}

/// `k="v",k2="v2"` (values without escaped quotes, as observer's are).
fn parse_labels(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some((k, after)) = rest.split_once("=\"") {
        let Some((v, tail)) = after.split_once('"') else { break };
        out.push((k.trim_start_matches(',').to_owned(), v.to_owned()));
        rest = tail;
    }
    out
}

/// HAProxy with `option nolinger` in front of nginx: it ends client
/// connections idle for `timeout http-keep-alive` with an RST (2.6: its
/// FIN, then the RST).
pub fn start_haproxy(topo: &Topology, dir: &std::path::Path, keep_alive_ms: u32) -> Result<Killed> {
    let conf = dir.join("haproxy.cfg");
    std::fs::write(
        &conf,
        format!(
            "defaults\n  mode http\n  timeout connect 2s\n  timeout client 30s\n  timeout server 30s\n\
             \x20 timeout http-keep-alive {keep_alive_ms}ms\n  option nolinger\n\
             frontend fe\n  bind {v4}:8090\n  default_backend be\n\
             backend be\n  server nginx {v4}:8080\n",
            v4 = topo.server_v4
        ),
    )?;
    let haproxy = Killed(topo.ns.spawn(topo.server, &format!("haproxy -db -f {}", conf.display()))?);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !topo.ns.exec(topo.server, "ss -ltn")?.contains(":8090") {
        if Instant::now() > deadline {
            bail!("haproxy did not start listening (Debian's `haproxy`; `cargo xtask test` installs it)");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(haproxy)
}

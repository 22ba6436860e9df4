//! Helpers for the root integration tests: the observer daemon as a child
//! process, network namespaces that are always removed, and event matching.
#![allow(dead_code, reason = "each test binary uses a different subset")]
#![allow(
    clippy::unwrap_used,
    clippy::missing_panics_doc,
    reason = "test helpers"
)]

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::{mpsc, Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use observer::event::SockEvent;

pub const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

/// Run a command, fail with its output if it fails.
pub fn sh(cmd: &str) -> Result<String> {
    let out = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .output()
        .with_context(|| format!("spawning `{cmd}`"))?;
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
    events: Arc<Mutex<Vec<SockEvent>>>,
    stderr: Arc<Mutex<Vec<String>>>,
}

impl Daemon {
    /// Start the daemon with extra args and wait until its probes are attached.
    pub fn start(extra: &[&str]) -> Result<Self> {
        let mut child = Command::new(OBSERVER)
            .args(["run", "--events=json", "--connections"])
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
        let mut d = Self {
            child,
            events,
            stderr,
        };
        if ready_rx.recv_timeout(Duration::from_secs(30)).is_err() {
            let status = d.child.try_wait().ok().flatten();
            bail!(
                "observer did not come up within 30 s (exit: {status:?}); stderr: {:?}",
                d.stderr_lines()
            );
        }
        Ok(d)
    }

    pub fn events(&self) -> Vec<SockEvent> {
        self.events.lock().unwrap().clone()
    }

    pub fn stderr_lines(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
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
        let ns = Self { names: Vec::new() };
        let mut ns = ns;
        for n in &names {
            sh(&format!("ip netns add {n}"))?;
            ns.names.push(n.clone());
            sh(&format!("ip netns exec {n} ip link set lo up"))?;
        }
        Ok(ns)
    }

    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// `ip netns exec <ns> sh -c cmd`.
    pub fn exec(&self, i: usize, cmd: &str) -> Result<String> {
        sh(&format!(
            "ip netns exec {} sh -c '{}'",
            self.names[i],
            cmd.replace('\'', r"'\''")
        ))
    }

    /// Spawn a long-running command in namespace `i` (killed with the namespace).
    pub fn spawn(&self, i: usize, cmd: &str) -> Result<Child> {
        Command::new("ip")
            .args([
                "netns",
                "exec",
                &self.names[i],
                "sh",
                "-c",
                &format!("exec {cmd}"),
            ])
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
            if let Ok(pids) = sh(&format!("ip netns pids {n}")) {
                for pid in pids.split_whitespace() {
                    let _ = sh(&format!("kill -9 {pid}"));
                }
            }
            let _ = sh(&format!("ip netns del {n}"));
        }
    }
}

/// Kill a child on drop.
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

//! The shipped systemd unit (`deploy/systemd/observer.service`) started by
//! a real systemd, so that a directive that breaks the daemon fails here
//! and not on a customer's host. These machines have no systemd as PID 1:
//! each test boots one with `systemd-nspawn --boot` on this host's own root
//! under a tmpfs overlay (nothing of the host is changed), sharing the
//! host's network and kernel. The unit is installed as the README says,
//! with only its port moved off 9477. Needs root and `systemd-nspawn`
//! (Debian: systemd-container).

mod common;

use std::{
    fs,
    path::PathBuf,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _, Result};
use common::{lines_of, start_server_here, wait_line, Killed, ECHO_SERVER, IDLE_POOL, OBSERVER};
use observer::diagnosis::aggregate::DestinationRow;

const UNIT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/systemd/observer.service");
const OTHER_NETNS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/systemd/other-netns.conf");

/// `CAP_PERFMON` (38) and `CAP_BPF` (39), as `/proc/PID/status` shows them.
const BPF_AND_PERFMON: u64 = (1 << 38) | (1 << 39);

/// Socket pairs held open in a network namespace of their own: `python3
/// PAIRS N` prints `ready` once N connected pairs have each moved a byte.
const PAIRS: &str = r#"
import socket, sys, time
n = int(sys.argv[1])
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(n)
cs = [socket.create_connection(s.getsockname()) for _ in range(n)]
acc = [s.accept()[0] for _ in range(n)]
for c in cs: c.sendall(b"x")
for a in acc: a.recv(1)
print("ready", flush=True)
time.sleep(600)
"#;

/// A systemd booted in a container on this host's root (an overlay with
/// a tmpfs on top), with the host's network. Powered off, unmounted and
/// removed on drop, also when the test fails.
struct Machine {
    nspawn: Child,
    /// The container's PID 1, as this host numbers it (for `nsenter`).
    init: u32,
    /// Unmounted after the container is gone (fields drop after `drop`).
    _mounts: Unmount,
    dir: tempfile::TempDir,
}

impl Machine {
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn boot() -> Result<Self> {
        let dir = tempfile::tempdir()?;
        let (up, root) = (dir.path().join("up"), dir.path().join("root"));
        fs::create_dir_all(&up)?;
        fs::create_dir_all(&root)?;
        common::sh(&format!("mount -t tmpfs observer-test {}", up.display()))?;
        let mut mounts = Unmount(vec![up.clone()]);
        fs::create_dir_all(up.join("upper"))?;
        fs::create_dir_all(up.join("work"))?;
        common::sh(&format!(
            "mount -t overlay observer-test -o lowerdir=/,upperdir={0}/upper,workdir={0}/work {1}",
            up.display(),
            root.display()
        ))?;
        mounts.0.insert(0, root.clone());
        let log = fs::File::create(dir.path().join("console.log"))?;
        let nspawn = Command::new("systemd-nspawn")
            .args(["--quiet", "--register=no", "--keep-unit", "--directory"])
            .arg(&root)
            // The unit's own grants must be in the container's bounding set.
            .args(["--capability=CAP_BPF,CAP_PERFMON,CAP_SYS_PTRACE", "--system-call-filter=bpf perf_event_open"])
            // basic.target: none of the host's own services start.
            .args(["--boot", "systemd.unit=basic.target"])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("spawning systemd-nspawn (Debian: systemd-container)")?;
        let mut m = Self { nspawn, init: 0, _mounts: mounts, dir };
        let deadline = Instant::now() + Duration::from_mins(1);
        // The container's PID 1 is systemd itself, a child of nspawn whose
        // own namespace numbers it 1 (nspawn's intermediate child is not).
        while m.init == 0 {
            m.init = container_init(m.nspawn.id()).unwrap_or(0);
            if let Some(status) = m.nspawn.try_wait()? {
                bail!("systemd-nspawn exited ({status}): {}", m.console());
            }
            ensure!(Instant::now() < deadline, "no container init after 60 s: {}", m.console());
            std::thread::sleep(Duration::from_millis(100));
        }
        // `running` or `degraded`: booted either way. Until systemd answers
        // on its bus, systemctl fails; ask again.
        loop {
            let state = m.run("systemctl is-system-running --wait 2>&1 || true")?;
            if matches!(state.trim(), "running" | "degraded") {
                break;
            }
            ensure!(Instant::now() < deadline, "systemd says {state}: {}", m.console());
            std::thread::sleep(Duration::from_millis(500));
        }
        Ok(m)
    }

    fn console(&self) -> String {
        fs::read_to_string(self.dir.path().join("console.log")).unwrap_or_default()
    }

    /// A shell command in the container (its mounts, PIDs and systemd).
    fn run(&self, cmd: &str) -> Result<String> {
        common::sh(&format!("nsenter -t {} -a sh -c '{}'", self.init, cmd.replace('\'', r"'\''")))
    }

    /// Install the unit as the README says (binary, unit file, drop-ins),
    /// its endpoint moved to `port`, and start it.
    fn install(&self, port: u16, dropins: &[(&str, &str)]) -> Result<()> {
        let root = self.root();
        fs::copy(*OBSERVER, root.join("usr/local/bin/observer")).context("installing the binary")?;
        let unit = fs::read_to_string(UNIT)?;
        ensure!(unit.contains("127.0.0.1:9477"), "the unit's endpoint moved: update this test");
        fs::write(root.join("etc/systemd/system/observer.service"), unit.replace("9477", &port.to_string()))?;
        let dropin_dir = root.join("etc/systemd/system/observer.service.d");
        let _ = fs::remove_dir_all(&dropin_dir);
        fs::create_dir_all(&dropin_dir)?;
        for (name, text) in dropins {
            fs::write(dropin_dir.join(name), text)?;
        }
        self.run("systemctl daemon-reload && systemctl reset-failed && systemctl restart observer")?;
        Ok(())
    }

    /// `systemctl show -p NAME --value observer`.
    fn show(&self, property: &str) -> Result<String> {
        Ok(self.run(&format!("systemctl show -p {property} --value observer"))?.trim().to_owned())
    }

    fn journal(&self) -> String {
        self.run("journalctl -u observer -o cat --no-pager").unwrap_or_else(|e| format!("(no journal: {e})"))
    }

    /// Wait until the service answers `/healthz` on `port`.
    fn healthy(&self, port: u16) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if observer::surfaces::http::get(&format!("127.0.0.1:{port}"), "/healthz").is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("observer.service never answered /healthz: {}\n{}", self.show("ActiveState")?, self.journal());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The service process's `/proc/PID/status` line `key`.
    fn status_of_main(&self, key: &str) -> Result<String> {
        let pid = self.show("MainPID")?;
        let status = self.run(&format!("cat /proc/{pid}/status"))?;
        Ok(status
            .lines()
            .find_map(|l| l.strip_prefix(key).and_then(|r| r.strip_prefix(':')))
            .with_context(|| format!("{key} of pid {pid}"))?
            .trim()
            .to_owned())
    }

    /// Hold `n` connected socket pairs in a new network namespace, made in
    /// the container (where the service's `/proc` can see its processes).
    fn pairs_in_other_netns(&self, n: usize) -> Result<Killed> {
        let path = self.root().join("opt/observer-test-pairs.py");
        fs::write(&path, PAIRS)?;
        let child = Command::new("nsenter")
            .args(["-t", &self.init.to_string(), "-a", "unshare", "--net", "sh", "-c"])
            .arg(format!("ip link set lo up && exec /usr/bin/python3 /opt/observer-test-pairs.py {n}"))
            .stdout(Stdio::piped())
            .spawn()?;
        let mut child = Killed(child);
        let lines = lines_of(&mut child.0)?;
        wait_line(&lines, "ready", 15.0)?;
        Ok(child)
    }
}

impl Drop for Machine {
    fn drop(&mut self) {
        let _ = self.run("systemctl --no-block poweroff");
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline && matches!(self.nspawn.try_wait(), Ok(None)) {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.nspawn.kill();
        let _ = self.nspawn.wait();
    }
}

/// The host PID of the container's systemd: a child of `nspawn` named
/// `systemd` whose last `NSpid` is 1.
fn container_init(nspawn: u32) -> Option<u32> {
    let children = std::fs::read_to_string(format!("/proc/{nspawn}/task/{nspawn}/children")).ok()?;
    children.split_whitespace().filter_map(|p| p.parse::<u32>().ok()).find(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|st| {
            st.lines().any(|l| l == "Name:\tsystemd")
                && st.lines().any(|l| l.starts_with("NSpid:") && l.split_whitespace().last() == Some("1"))
        })
    })
}

/// Lazy unmounts, in order, on drop.
struct Unmount(Vec<PathBuf>);

impl Drop for Unmount {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = Command::new("umount").arg("-l").arg(p).status();
        }
    }
}

/// `observer_tracked_sockets` from the service's `/metrics`.
fn tracked_sockets(port: u16) -> Result<i64> {
    let body = observer::surfaces::http::get(&format!("127.0.0.1:{port}"), "/metrics").map_err(anyhow::Error::msg)?;
    let text = String::from_utf8(body)?;
    text.lines()
        .find_map(|l| l.strip_prefix("observer_tracked_sockets "))
        .context("observer_tracked_sockets in /metrics")?
        .trim()
        .parse()
        .context("observer_tracked_sockets value")
}

/// The tracked-socket gauge before and after `pairs` socket pairs open in a
/// network namespace of their own, two table refreshes (5 s each) apart.
fn sockets_seen_in_other_netns(m: &Machine, port: u16, pairs: usize) -> Result<i64> {
    std::thread::sleep(Duration::from_secs(6));
    let before = tracked_sockets(port)?;
    let _pairs = m.pairs_in_other_netns(pairs)?;
    std::thread::sleep(Duration::from_secs(11));
    Ok(tracked_sockets(port)? - before)
}

fn free_port() -> Result<u16> {
    common::server_port()
}

/// The unit as shipped: running as a dynamic user with exactly `CAP_BPF`
/// and `CAP_PERFMON`, no new privileges, under a seccomp filter, its store
/// in `/var/lib/private/observer` at 0700, its endpoint reachable on
/// loopback through `IPAddressDeny=any`; a reuse on this host reaches its
/// table; other network namespaces are out of its view and the journal
/// says so; `systemctl stop` ends it cleanly.
#[test]
fn the_shipped_unit_runs_under_systemd() -> Result<()> {
    let m = Machine::boot()?;
    let port = free_port()?;
    m.install(port, &[])?;
    m.healthy(port)?;
    ensure!(m.show("ActiveState")? == "active", "{}", m.journal());

    let uid: u32 = m.status_of_main("Uid")?.split_whitespace().next().context("Uid")?.parse()?;
    ensure!(uid != 0, "the service runs as its dynamic user, not root");
    for key in ["CapEff", "CapPrm", "CapAmb"] {
        let caps = u64::from_str_radix(&m.status_of_main(key)?, 16)?;
        ensure!(caps == BPF_AND_PERFMON, "{key} {caps:#x}: exactly CAP_BPF and CAP_PERFMON");
    }
    ensure!(m.status_of_main("NoNewPrivs")? == "1", "NoNewPrivileges=yes");
    ensure!(m.status_of_main("Seccomp")? == "2", "SystemCallFilter: a seccomp filter");
    ensure!(m.show("MemoryMax")? == "268435456", "MemoryMax=256M: {}", m.show("MemoryMax")?);
    let store = m.run("stat -c \"%a %u\" /var/lib/private/observer /var/lib/private/observer/evidence.sqlite")?;
    ensure!(store == format!("700 {uid}\n600 {uid}\n"), "the store's modes and owner: {store}");

    // One reuse after 1.5 s idle on this host's loopback.
    let echo = common::script(ECHO_SERVER)?;
    let server_port = free_port()?;
    let _server = start_server_here(&format!("python3 {} 127.0.0.1 {server_port}", echo.display()))?;
    let pool = common::script(IDLE_POOL)?;
    let mut client = Command::new("python3")
        .arg(&pool)
        .args(["127.0.0.1", &server_port.to_string(), "1", "1.5", "0"])
        .stdout(Stdio::piped())
        .spawn()?;
    let lines = lines_of(&mut client)?;
    let _client = Killed(client);
    wait_line(&lines, "ok", 15.0)?;
    let dest = format!("127.0.0.1:{server_port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let row = loop {
        let body = observer::surfaces::http::get(&format!("127.0.0.1:{port}"), "/api/v1/destinations")
            .map_err(anyhow::Error::msg)?;
        let rows: Vec<DestinationRow> = serde_json::from_slice(&body)?;
        if let Some(r) = rows.into_iter().find(|r| r.id.destination == dest && r.counts.reuses >= 1) {
            break r;
        }
        ensure!(Instant::now() < deadline, "the service's table has no reuse to {dest}:\n{}", m.journal());
        std::thread::sleep(Duration::from_millis(250));
    };

    let unseen = sockets_seen_in_other_netns(&m, port, 50)?;
    ensure!(unseen < 50, "the shipped unit cannot enter other namespaces, yet {unseen} more sockets were tracked");
    let journal = m.journal();
    ensure!(
        journal.contains("may cover this network namespace only"),
        "the journal says what is out of view:\n{journal}"
    );

    m.run("systemctl stop observer")?;
    let (result, code) = (m.show("Result")?, m.show("ExecMainStatus")?);
    ensure!(
        result == "success" && code == "0",
        "systemctl stop: Result={result} ExecMainStatus={code}\n{}",
        m.journal()
    );
    let journal = m.journal();
    ensure!(journal.contains("observer running") && !journal.contains("panicked"), "{journal}");
    eprintln!(
        "MEASURED systemd unit: uid {uid}, CapEff {BPF_AND_PERFMON:#x}, Seccomp 2, store 0700; {dest} reuses={}; other netns: {unseen} of 100 sockets tracked; stopped with Result={result}",
        row.counts.reuses
    );
    Ok(())
}

/// The shipped drop-in (`deploy/systemd/other-netns.conf`) brings other
/// network namespaces into the at-risk view: 100 sockets in a namespace of
/// their own are tracked, and the journal has no warning about them.
#[test]
fn the_other_netns_dropin_lets_it_see_other_namespaces() -> Result<()> {
    let m = Machine::boot()?;
    let port = free_port()?;
    m.install(port, &[("other-netns.conf", &fs::read_to_string(OTHER_NETNS)?)])?;
    m.healthy(port)?;
    let caps = u64::from_str_radix(&m.status_of_main("CapEff")?, 16)?;
    ensure!(
        caps == BPF_AND_PERFMON | (1 << 21) | (1 << 19),
        "CapEff {caps:#x}: the drop-in adds CAP_SYS_ADMIN and CAP_SYS_PTRACE"
    );
    let seen = sockets_seen_in_other_netns(&m, port, 50)?;
    ensure!(seen >= 95, "only {seen} of 100 sockets in another namespace were tracked:\n{}", m.journal());
    let journal = m.journal();
    ensure!(!journal.contains("network namespace only"), "{journal}");
    eprintln!("MEASURED systemd unit with other-netns.conf: {seen} of 100 sockets in another namespace tracked");
    Ok(())
}

/// The test above can fail: the unit with `bpf` taken out of its
/// `SystemCallFilter` does not come up, and the journal names the filter
/// and the fix.
#[test]
fn a_filter_without_bpf_fails_the_unit_with_the_fix_named() -> Result<()> {
    let m = Machine::boot()?;
    let port = free_port()?;
    let dropin = "[Service]\nSystemCallFilter=\nSystemCallFilter=@system-service perf_event_open\n";
    m.install(port, &[("no-bpf.conf", dropin)])?;
    let deadline = Instant::now() + Duration::from_secs(30);
    while m.show("ExecMainStatus")? == "0" {
        ensure!(Instant::now() < deadline, "the service without bpf(2) kept running:\n{}", m.journal());
        std::thread::sleep(Duration::from_millis(200));
    }
    ensure!(observer::surfaces::http::get(&format!("127.0.0.1:{port}"), "/healthz").is_err(), "it answered");
    let journal = m.journal();
    let said = journal.lines().find(|l| l.contains("observer: error")).unwrap_or_default();
    ensure!(
        said.contains("SystemCallFilter=@system-service bpf perf_event_open"),
        "the error names the fix:\n{journal}"
    );
    eprintln!("MEASURED systemd unit without bpf in its filter: {}, {said}", m.show("Result")?);
    Ok(())
}

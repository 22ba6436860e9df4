//! The container image (`deploy/container/Containerfile`, built by `cargo
//! xtask image`, named to this test in `OBSERVER_TEST_IMAGE` by `cargo xtask
//! test`) run with podman as the README says: all capabilities dropped but
//! `CAP_BPF` and `CAP_PERFMON`, not privileged, BTF mounted read-only, under
//! the shipped seccomp profile (`deploy/kubernetes/seccomp-observer.json`). A
//! reuse in a test namespace must reach its table, and `observer status` run
//! in the container must show it. Needs root.

mod common;

use std::{
    path::Path,
    process::Command,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _, Result};
use common::{lines_of, start_server, wait_line, Killed, Topology, ECHO_SERVER, IDLE_POOL};
use observer::diagnosis::aggregate::DestinationRow;

/// `podman` with this machine's quirks: crun refuses a hybrid cgroup v1/v2
/// host, so runc with cgroupfs runs the container. Nothing here is needed
/// by the image itself.
fn podman() -> Command {
    let mut c = Command::new("podman");
    c.args(["--runtime", "runc", "--cgroup-manager", "cgroupfs"]);
    c
}

/// Removes the container, also when the test fails.
struct Container(String);

impl Drop for Container {
    fn drop(&mut self) {
        let _ = podman().args(["rm", "-f", "-t", "1", &self.0]).output();
    }
}

/// A resource limit of this process (soft), capped: the container may not
/// raise a limit without `CAP_SYS_RESOURCE`, which these machines lack.
fn limit(resource: libc::__rlimit_resource_t, cap: u64) -> u64 {
    let mut r = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit writes into the struct we pass.
    if unsafe { libc::getrlimit(resource, &raw mut r) } != 0 {
        return cap;
    }
    r.rlim_cur.min(cap)
}

/// The seccomp profile the manifests ship.
const SHIPPED_PROFILE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/kubernetes/seccomp-observer.json");

/// `podman run` of `image` as the README says (the host's network and
/// PIDs, `CAP_BPF` and `CAP_PERFMON` only, seccomp `profile`, BTF read-only,
/// the store on a tmpfs), with `extra` options; the caller adds the
/// daemon's arguments.
fn run_image(extra: &[&str], profile: &Path, image: &str) -> Command {
    let (nofile, nproc) = (limit(libc::RLIMIT_NOFILE, 65_536), limit(libc::RLIMIT_NPROC, 4096));
    let mut c = podman();
    c.arg("run")
        .args(extra)
        .args(["--network", "host", "--pid", "host"])
        .args(["--cap-drop", "all", "--cap-add", "CAP_BPF,CAP_PERFMON"])
        .arg("--security-opt")
        .arg(format!("seccomp={}", profile.display()))
        .args(["--ulimit", &format!("nofile={nofile}:{nofile}"), "--ulimit", &format!("nproc={nproc}:{nproc}")])
        .args(["-v", "/sys/kernel/btf:/sys/kernel/btf:ro", "--tmpfs", "/var/lib/observer"])
        .arg(image);
    c
}

#[test]
fn the_image_runs_with_two_capabilities_and_sees_a_reuse() -> Result<()> {
    let image = std::env::var("OBSERVER_TEST_IMAGE").context(
        "OBSERVER_TEST_IMAGE is unset: `cargo xtask test` builds the image (`cargo xtask image`) and names it",
    )?;
    let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let addr = format!("127.0.0.1:{port}");
    let name = format!("observer-test-{}", std::process::id());
    let out = run_image(&["-d", "--name", &name], Path::new(SHIPPED_PROFILE), &image)
        .args(["run", "--metrics-addr", &addr, "--min-idle", "1s"])
        .output()
        .context("podman run")?;
    ensure!(out.status.success(), "podman run: {}", String::from_utf8_lossy(&out.stderr));
    let container = Container(name);
    let logs = || {
        podman().args(["logs", &container.0]).output().map_or_else(
            |e| e.to_string(),
            |o| format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while observer::surfaces::http::get(&addr, "/healthz").is_err() {
        if Instant::now() > deadline {
            bail!("the container never became healthy; its log:\n{}", logs());
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    // The daemon in the container holds exactly CAP_PERFMON (38) and CAP_BPF (39).
    let pid = podman().args(["inspect", "-f", "{{.State.Pid}}", &container.0]).output()?;
    let pid = String::from_utf8_lossy(&pid.stdout).trim().to_owned();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).with_context(|| format!("pid {pid}"))?;
    let cap_eff = status.lines().find_map(|l| l.strip_prefix("CapEff:")).context("CapEff")?.trim().to_owned();
    ensure!(u64::from_str_radix(&cap_eff, 16)? == (1 << 38) | (1 << 39), "CapEff {cap_eff}");
    // Under the shipped seccomp profile (mode 2: a filter), not unconfined.
    let seccomp = status.lines().find_map(|l| l.strip_prefix("Seccomp:")).context("Seccomp")?.trim().to_owned();
    ensure!(seccomp == "2", "the daemon runs under a seccomp filter: Seccomp {seccomp}");

    // One reuse after 1.5 s idle, in namespaces this test made.
    let topo = Topology::pair("ctr")?;
    let echo = common::script(ECHO_SERVER)?;
    let _server = start_server(&topo.ns, topo.server, &format!("python3 {} {} 7200", echo.display(), topo.server_v4))?;
    let pool = common::script(IDLE_POOL)?;
    let mut client =
        topo.ns.spawn(topo.client, &format!("python3 {} {} 7200 1 1.5 0", pool.display(), topo.server_v4))?;
    let lines = lines_of(&mut client)?;
    let _client = Killed(client);
    wait_line(&lines, "ok", 15.0)?;

    let dest = format!("{}:7200", topo.server_v4);
    let deadline = Instant::now() + Duration::from_secs(10);
    let row = loop {
        let body = observer::surfaces::http::get(&addr, "/api/v1/destinations").map_err(anyhow::Error::msg)?;
        let rows: Vec<DestinationRow> = serde_json::from_slice(&body)?;
        if let Some(r) = rows.into_iter().find(|r| r.id.destination == dest && r.counts.reuses >= 1) {
            break r;
        }
        if Instant::now() > deadline {
            bail!("the container's table has no reuse to {dest}; its log:\n{}", logs());
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    // The command an operator runs in the pod (`kubectl exec ... observer
    // status`), under the same profile.
    let status = podman().args(["exec", &container.0, "/usr/bin/observer", "status", "--addr", &addr]).output()?;
    let said = String::from_utf8_lossy(&status.stdout);
    ensure!(
        status.status.success() && said.contains(&dest),
        "observer status in the container: {said}{}",
        String::from_utf8_lossy(&status.stderr)
    );
    let log = logs();
    ensure!(log.contains("observer running"), "{log}");
    let metrics = String::from_utf8(observer::surfaces::http::get(&addr, "/metrics").map_err(anyhow::Error::msg)?)?;
    let info = metrics.lines().find(|l| l.starts_with("observer_build_info{")).context("build info")?.to_owned();
    eprintln!(
        "MEASURED container: {image}, CapEff {cap_eff} (CAP_BPF,CAP_PERFMON), Seccomp {seccomp} (deploy/kubernetes/seccomp-observer.json): {dest} reuses={} failures={} verdict={:?}; {info}",
        row.counts.reuses, row.counts.failures, row.judgement.verdict
    );
    Ok(())
}

/// A seccomp profile that refuses `bpf(2)` (the runtimes' defaults do,
/// without `CAP_SYS_ADMIN`) stops the daemon at start with an error that
/// names the filter and the fix, not a bare "Operation not permitted".
#[test]
fn a_profile_refusing_bpf_is_named_in_the_error() -> Result<()> {
    let image = std::env::var("OBSERVER_TEST_IMAGE").context("OBSERVER_TEST_IMAGE is unset: run `cargo xtask test`")?;
    let mut profile: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(SHIPPED_PROFILE)?)?;
    let names = profile["syscalls"][0]["names"].as_array_mut().context("the profile's one allow list")?;
    names.retain(|n| n != "bpf");
    let refusing = tempfile::Builder::new().suffix(".json").tempfile()?;
    std::fs::write(refusing.path(), serde_json::to_vec(&profile)?)?;
    let out = run_image(&["--rm"], refusing.path(), &image).args(["run", "--metrics-addr", "127.0.0.1:0"]).output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success(), "the daemon cannot run without bpf(2): {err}");
    ensure!(
        err.contains("seccomp filter") && err.contains("seccomp-observer.json") && !err.contains("panicked"),
        "the error names the filter and the fix: {err}"
    );
    eprintln!("MEASURED container without bpf in its profile: {}", err.lines().last().unwrap_or_default());
    Ok(())
}

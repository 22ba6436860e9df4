//! The deployment artifacts under `deploy/`, checked with the tools their
//! consumers use: the systemd unit with `systemd-analyze verify`, the fleet
//! Prometheus rules with `promtool check rules` and `promtool test rules`.
//! No root needed.

use std::{path::PathBuf, process::Command};

use anyhow::{ensure, Context as _, Result};

fn deploy() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy")
}

fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("running {cmd:?} (Debian: systemd, prometheus)"))?;
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    ensure!(out.status.success(), "{cmd:?} failed:\n{said}");
    Ok(said)
}

#[test]
fn the_systemd_unit_verifies_clean() -> Result<()> {
    let unit = std::fs::read_to_string(deploy().join("systemd/observer.service"))?;
    // verify checks that ExecStart exists: point it at the binary under test.
    let dir = tempfile::tempdir()?;
    let path = dir.path().join("observer.service");
    std::fs::write(&path, unit.replace("/usr/local/bin/observer", env!("CARGO_BIN_EXE_observer")))?;
    let said = run(Command::new("systemd-analyze").arg("verify").arg(&path))?;
    // Unknown keys are only warnings to systemd: any output is a defect.
    ensure!(said.trim().is_empty(), "systemd-analyze verify:\n{said}");
    for key in [
        "DynamicUser=yes",
        "AmbientCapabilities=CAP_BPF CAP_PERFMON",
        "CapabilityBoundingSet=CAP_BPF CAP_PERFMON",
        "StateDirectory=observer",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
    ] {
        ensure!(unit.lines().any(|l| l == key), "the unit lacks {key}");
    }
    // A misspelt key must be caught by this check.
    std::fs::write(&path, std::fs::read_to_string(&path)?.replace("ProtectSystem=", "ProtectSystm="))?;
    let said = run(Command::new("systemd-analyze").arg("verify").arg(&path))?;
    ensure!(said.contains("Unknown key"), "a misspelt key went unnoticed: {said}");
    Ok(())
}

#[test]
fn the_fleet_rules_pass_promtool() -> Result<()> {
    let dir = deploy().join("prometheus");
    let said = run(Command::new("promtool").args(["check", "rules", "observer-rules.yml"]).current_dir(&dir))?;
    ensure!(said.contains("SUCCESS: 11 rules found"), "{said}");
    let said = run(Command::new("promtool").args(["test", "rules", "observer-rules.test.yml"]).current_dir(&dir))?;
    ensure!(said.contains("SUCCESS"), "{said}");
    Ok(())
}

/// `observer debug docs` (what `cargo xtask dist` ships): completions for
/// bash, zsh and fish and a man page per subcommand, from the clap
/// definitions.
#[test]
fn completions_and_man_pages_come_from_the_cli() -> Result<()> {
    let dir = tempfile::tempdir()?;
    run(Command::new(env!("CARGO_BIN_EXE_observer")).args(["debug", "docs", "--out-dir"]).arg(dir.path()))?;
    let read = |p: &str| std::fs::read_to_string(dir.path().join(p)).with_context(|| p.to_owned());
    let bash = read("completions/observer.bash")?;
    ensure!(bash.contains("--min-idle") && bash.contains("--config"), "bash completions lack run's flags");
    ensure!(read("completions/_observer")?.contains("--print-config"), "zsh");
    ensure!(read("completions/observer.fish")?.contains("allowed-host"), "fish");
    let man = read("man/observer-run.1")?;
    ensure!(man.starts_with(".ie") || man.contains(".TH observer-run"), "not a man page:\n{man}");
    ensure!(man.contains("min\\-idle"), "the run page documents its flags");
    for page in ["observer.1", "observer-status.1", "observer-analyze.1", "observer-report.1", "observer-path-check.1"]
    {
        ensure!(dir.path().join("man").join(page).exists(), "no {page}");
    }
    ensure!(!dir.path().join("man/observer-debug.1").exists(), "internal tools get no page");
    Ok(())
}

fn kubernetes_validate() -> Result<PathBuf> {
    let out = Command::new("python3")
        .args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"])
        .output()
        .context("python3")?;
    Ok(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()).join("kubernetes-validate"))
}

/// The `DaemonSet` and its `NetworkPolicy` validate against the
/// Kubernetes schemas (strict: no unknown fields), it runs with
/// capabilities rather than privileged, keeps the table on loopback, and
/// a broken copy is rejected by the same check.
#[test]
fn the_daemonset_validates_strictly() -> Result<()> {
    let manifest = deploy().join("kubernetes/daemonset.yaml");
    let tool = kubernetes_validate()?;
    let said = run(Command::new(&tool).arg("--strict").arg(&manifest))?;
    ensure!(said.contains("passed for resource daemonset/observer"), "{said}");
    ensure!(said.contains("passed for resource networkpolicy/observer-scrape-only"), "{said}");
    let text = std::fs::read_to_string(&manifest)?;
    for needle in [
        // The table on loopback, the scrape port (metrics and health only)
        // on the pod network for the scraper alone.
        "--metrics-addr=127.0.0.1:9477",
        "--scrape-addr=0.0.0.0:9479",
        "port: 9479",
        "privileged: false",
        "add: [\"BPF\", \"PERFMON\"]",
        "drop: [\"ALL\"]",
        "path: /healthz",
        "hostNetwork: false",
        "hostPID: true",
        "mountPath: /sys/fs/cgroup",
        "localhostProfile: observer/seccomp.json",
    ] {
        ensure!(text.contains(needle), "the manifest lacks `{needle}`");
    }
    let dir = tempfile::tempdir()?;
    // The commented lines that push to a node-local OTLP collector
    // validate too, once uncommented.
    let mut in_env = false;
    let pushed: Vec<String> = text
        .lines()
        .map(|l| {
            if l.trim() == "# env:" {
                in_env = true;
            } else if in_env && !l.trim_start().starts_with("#   ") {
                in_env = false;
            }
            if in_env {
                l.replacen("# ", "", 1)
            } else {
                l.to_owned()
            }
        })
        .collect();
    let pushed = pushed.join("\n");
    ensure!(
        pushed.contains("\n          env:\n") && pushed.contains("\n              value: http://$(NODE_IP):4318\n"),
        "the OTLP lines uncommented: {pushed}"
    );
    let otlp = dir.path().join("otlp.yaml");
    std::fs::write(&otlp, &pushed)?;
    let said = run(Command::new(&tool).arg("--strict").arg(&otlp))?;
    ensure!(said.contains("passed for resource daemonset/observer"), "with the OTLP lines: {said}");
    let broken = dir.path().join("broken.yaml");
    std::fs::write(&broken, text.replace("readOnlyRootFilesystem", "readOnlyRootFilesytem"))?;
    let out = Command::new(&tool).arg("--strict").arg(&broken).output()?;
    ensure!(!out.status.success(), "a misspelt field passed validation");
    Ok(())
}

/// Every system call the daemon and its commands made across the host
/// suites (foundation, faults, prometheus, owners, names, `store_kill`, the
/// CLI suites) and a `run`/`status`/`report` session on `x86_64`, recorded
/// with bpftrace on `raw_syscalls:sys_enter` for processes named
/// `observer` (2026-12-05): 68 calls. Both the seccomp profile and the
/// systemd unit's filter must allow each.
const MEASURED_SYSCALLS: &[&str] = &[
    "accept4",
    "access",
    "arch_prctl",
    "bind",
    "bpf",
    "brk",
    "chmod",
    "clone3",
    "close",
    "connect",
    "epoll_create1",
    "epoll_ctl",
    "epoll_wait",
    "eventfd2",
    "exit",
    "exit_group",
    "fchown",
    "fcntl",
    "fsync",
    "ftruncate",
    "futex",
    "getdents64",
    "geteuid",
    "getpid",
    "getrandom",
    "getsockname",
    "getsockopt",
    "gettid",
    "ioctl",
    "listen",
    "madvise",
    "mkdir",
    "mmap",
    "mprotect",
    "mremap",
    "munmap",
    "newfstatat",
    "openat",
    "poll",
    "prctl",
    "pread64",
    "prlimit64",
    "pwrite64",
    "read",
    "readlink",
    "recvfrom",
    "restart_syscall",
    "rseq",
    "rt_sigaction",
    "rt_sigprocmask",
    "rt_sigreturn",
    "sched_getaffinity",
    "sched_yield",
    "sendto",
    "set_robust_list",
    "set_tid_address",
    "setns",
    "setpriority",
    "setsockopt",
    "shutdown",
    "sigaltstack",
    "socket",
    "socketpair",
    "statx",
    "uname",
    "unlink",
    "write",
    "writev",
];

/// The unit's `SystemCallFilter`, expanded by systemd itself, allows every
/// call the daemon was measured making (none would fail with EPERM).
#[test]
fn the_units_syscall_filter_allows_every_measured_call() -> Result<()> {
    let unit = std::fs::read_to_string(deploy().join("systemd/observer.service"))?;
    let filter = unit.lines().find_map(|l| l.strip_prefix("SystemCallFilter=")).context("a SystemCallFilter")?;
    let mut allowed = std::collections::HashSet::new();
    let mut todo: Vec<String> = filter.split_whitespace().map(str::to_owned).collect();
    while let Some(item) = todo.pop() {
        if !item.starts_with('@') {
            allowed.insert(item);
            continue;
        }
        let said = run(Command::new("systemd-analyze").args(["syscall-filter", &item]))?;
        for l in said.lines().skip(1) {
            let l = l.trim();
            if !l.is_empty() && !l.starts_with('#') {
                todo.push(l.to_owned());
            }
        }
    }
    let missing: Vec<&&str> = MEASURED_SYSCALLS.iter().filter(|s| !allowed.contains(**s)).collect();
    ensure!(missing.is_empty(), "the unit's filter refuses calls the daemon makes: {missing:?}");
    ensure!(!allowed.contains("mount") && !allowed.contains("kexec_load"), "a filter that allows everything");
    Ok(())
}

/// The shipped seccomp profile (`deploy/kubernetes/seccomp-observer.json`)
/// is an allow list: every call the daemon was measured making, a margin
/// (arm64's names for the same calls, rarer paths: fsync variants, a
/// panic's abort, the container runtime's last steps before exec), and
/// nothing that mounts, traces, loads modules or makes namespaces. The
/// container suite runs the daemon under it.
#[test]
fn the_seccomp_profile_allows_the_measured_calls_and_no_more() -> Result<()> {
    let text = std::fs::read_to_string(deploy().join("kubernetes/seccomp-observer.json"))?;
    let profile: serde_json::Value = serde_json::from_str(&text)?;
    ensure!(profile["defaultAction"] == "SCMP_ACT_ERRNO", "refuse what is not listed");
    let rules = profile["syscalls"].as_array().context("syscalls")?;
    // Allowed whatever the container's capabilities.
    let allowed = |name: &str| {
        rules.iter().any(|r| {
            r["action"] == "SCMP_ACT_ALLOW"
                && r["args"].as_array().is_none_or(Vec::is_empty)
                && r["includes"].as_object().is_none_or(serde_json::Map::is_empty)
                && r["names"].as_array().is_some_and(|n| n.iter().any(|x| x == name))
        })
    };
    let missing: Vec<&&str> = MEASURED_SYSCALLS.iter().filter(|s| !allowed(s)).collect();
    ensure!(missing.is_empty(), "the profile refuses calls the daemon makes: {missing:?}");
    for name in ["mount", "unshare", "kexec_load", "init_module", "ptrace", "add_key", "swapon", "io_uring_setup"] {
        ensure!(!allowed(name), "{name} is refused by the runtime defaults and must stay so");
    }
    Ok(())
}

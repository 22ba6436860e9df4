//! The kernel matrix: which kernels boot under QEMU (TCG: there is no KVM
//! here), which root suites each runs and why, and the lanes that run the
//! guests side by side. `guest` fetches, builds and boots one of them.

mod guest;

use std::{collections::BTreeMap, path::Path, time::Instant};

use anyhow::{ensure, Context as _, Result};

pub use guest::{fetch, Fetched};

/// The integration suites (`observer/tests/*.rs`) that run on the host
/// only, and why; every other suite must run in a guest (the test below
/// reads the directory, so a new suite cannot be forgotten).
#[cfg(test)]
const HOST_SUITES: &[(&str, &str)] = &[
    ("path_cli", "no kernel behaviour"),
    ("cli_config", "no kernel behaviour"),
    ("store_kill", "no kernel behaviour"),
    ("report_render", "no kernel behaviour (Chromium)"),
    ("examples", "no kernel behaviour (docs/examples and the README's sample against a recording)"),
    ("deploy", "no kernel behaviour"),
    ("container", "no kernel behaviour (podman)"),
    ("systemd_unit", "no kernel behaviour (systemd-nspawn boots systemd on the host's root)"),
    ("faults", "the daemon's own outputs: pipes, a full tmpfs, kill -9"),
    ("otlp", "the OTLP export, userspace over the hooks `hooks` checks in the guests (a real collector, rotel)"),
    (
        "verdicts",
        "the estimator and the verdicts; its flood of 12,000 reuses is a load test the guests cannot hold beside \
         each other (924 of 12,000 requests failed in the 6.12 guest); the probes at a full ring buffer are hooks' test",
    ),
];
/// Tests of the guests' suites that run on the host only: what they add over
/// the rest is userspace judgement (the estimator, the aggregator, PromQL),
/// on kernel behaviour that other tests check in the guest. Under TCG they
/// cost minutes each (`.ci/run` stays under its time with them left out).
/// (suite, test, what covers its kernel part in the guest)
pub const HOST_ONLY: &[(&str, &str, &str)] = &[
    ("diagnosis", "a_swept_timeout_is_one_band_every_run", "the band estimate; FIN closes: fin_path_diagnosed"),
    ("diagnosis", "a_backend_restart_is_no_timeout_evidence", "the restart judgement; closes: fin_path_diagnosed"),
    (
        "names",
        "a_jdk_http_client_is_named_unprivileged",
        "the runtime resolver (a JVM's threads and class path, under TCG a JVM's start takes minutes); the reuse          events: a_go_client_over_tls_is_named_by_its_sni",
    ),
    (
        "probe",
        "a_daemon_started_during_a_probe_leaves_its_connections_out",
        "a TCG guest's daemon takes longer to start than the probe's connections live; the kernel side (adoption) runs in every guest",
    ),
    (
        "prometheus",
        "dashboards_query_real_prometheus",
        "PromQL and the dashboards; the exposition: fleet_interval_is_the_intersection_of_two_hosts",
    ),
];
/// Which guest runs what. Every guest runs `foundation` (attach, detach,
/// capabilities, the events). `hooks` (every event kind from real
/// traffic) runs on each kernel version's probe set and on each
/// architecture: 6.1's (`fentry` send, the
/// `bpf_skc_to_tcp_sock` receive) and 6.12's (`fentry` send, the
/// `bpf_rdonly_cast` receive; in the arm64 guest, which adds arm64's
/// trampolines). The wire-truth definitions (`wire_truth`), the send
/// path's failures and stalls (`dead_sockets`, `multiplexed`) and the
/// first-bytes read (`names`) run on 6.1, whose send hook and `iov_iter`
/// layout (`iov`, before 6.4's `ubuf`) are the ones that differ most from
/// the host's (the host's 6.18 has the tracepoint send hook and the
/// `bpf_rdonly_cast` receive). `observer probe` (`probe`: no eBPF; its
/// keep-alive trigger is kernel behaviour unchanged since long before
/// 6.1) and the suites that add userspace judgement over the same events
/// run on 6.12 (x86-64). Each suite runs in one guest at least (`tests`
/// below holds the rule): two full copies of the matrix do not fit
/// `.ci/run`'s hour on these 2-core machines under TCG. The lanes are
/// balanced by time, and they share two CPUs, so a suite moved from one
/// to the other slows both: CI run 16 (6.1: 2,438 s; 6.12 then arm64:
/// 655 + 1,230 s, of which about 850 s are the arm64 cross-build and
/// boot) went to 2,305 s against 1,420 + 1,160 s in run 17 with
/// `multiplexed` (535 s) in 6.12: 3,815 s in all, against 3,619 s.
/// `probe` (288 s in run 16) moves instead. Run 18, with the guests' TSC
/// clock and the Python interpreter named directly (`guest.rs`,
/// `python_first`): 6.1 1,842 s; 6.12 751 s then arm64 1,340 s; 3,385 s
/// in all.
const X86_61_SUITES: &[&str] = &["foundation", "hooks", "wire_truth", "dead_sockets", "multiplexed", "names"];
const X86_612_SUITES: &[&str] = &["foundation", "owners", "servers", "prometheus", "diagnosis", "probe"];
const ARM64_SUITES: &[&str] = &["foundation", "hooks"];

/// A guest's architecture.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arch {
    X86_64,
    /// Cross-built suites, an arm64 userland, `qemu-system-aarch64`.
    Aarch64,
}

/// A kernel of the matrix.
pub struct Kernel {
    /// `debian-6.1`.
    pub name: &'static str,
    /// Debian package name pattern (newest match is used).
    package_regex: &'static str,
    arch: Arch,
    /// The suites run there.
    suites: &'static [&'static str],
    /// Guests of one lane boot one after another; lanes run side by side.
    pub(crate) lane: u8,
}

pub const KERNELS: &[Kernel] = &[
    Kernel {
        name: "debian-6.1",
        package_regex: r"^linux-image-6\.1\.0-[0-9]+-cloud-amd64-unsigned$",
        arch: Arch::X86_64,
        suites: X86_61_SUITES,
        lane: 0,
    },
    Kernel {
        name: "debian-6.12",
        package_regex: r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-amd64-unsigned$",
        arch: Arch::X86_64,
        suites: X86_612_SUITES,
        lane: 1,
    },
    // arm64 before 6.4 has no ftrace direct calls, so no `fentry` on a
    // kernel function, and observer's send probe needs one there (the
    // README's kernel table); 6.12 is Debian 13's kernel.
    Kernel {
        name: "debian-6.12-arm64",
        package_regex: r"^linux-image-6\.12\.[0-9]+\+deb12-cloud-arm64-unsigned$",
        arch: Arch::Aarch64,
        suites: ARM64_SUITES,
        lane: 1,
    },
];

pub fn kernel(name: &str) -> Result<&'static Kernel> {
    KERNELS.iter().find(|k| k.name == name).with_context(|| {
        format!("unknown kernel {name}; known: {}", KERNELS.iter().map(|k| k.name).collect::<Vec<_>>().join(", "))
    })
}

/// The calling thread, and every process it starts from now on, at the
/// lowest CPU priority (on Linux the nice value is per thread).
fn lowest_priority() {
    // SAFETY: plain integers in, no memory touched.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 19) };
    if rc != 0 {
        println!("vm: could not lower the guests' CPU priority: {}", std::io::Error::last_os_error());
    }
}

/// Build and boot the fetched guests, one lane at a time per `lane` value,
/// the lanes side by side (each guest mostly waits on its tests' idle
/// timers: two side by side took 159 s here where one alone took 152 s),
/// and fail if any suite failed in any of them. `lowest`: the lanes, their
/// builds and QEMU run at the lowest CPU priority (beside the host's
/// suites, which keep the CPU their timing needs).
pub fn run_all(guests: Vec<Fetched>, toolchain: &str, daemon: &Path, filter: &[String], lowest: bool) -> Result<()> {
    let mut lanes: BTreeMap<u8, Vec<Fetched>> = BTreeMap::new();
    for g in guests {
        lanes.entry(g.kernel.lane).or_default().push(g);
    }
    let failed: Vec<&str> = std::thread::scope(|scope| {
        let handles: Vec<_> = lanes
            .into_values()
            .map(|lane| {
                scope.spawn(move || {
                    if lowest {
                        lowest_priority();
                    }
                    let mut failed = Vec::new();
                    for g in lane {
                        let name = g.kernel.name;
                        let t = Instant::now();
                        match guest::run(g, toolchain, daemon, filter) {
                            Ok(()) => println!("test: {name} suite passed in {:.0}s", t.elapsed().as_secs_f64()),
                            Err(e) => {
                                println!("test: {name} failed after {:.0}s: {e:#}", t.elapsed().as_secs_f64());
                                failed.push(name);
                            }
                        }
                    }
                    failed
                })
            })
            .collect();
        handles.into_iter().flat_map(|h| h.join().unwrap_or_else(|_| vec!["a lane that panicked"])).collect()
    });
    ensure!(failed.is_empty(), "guests failed: {}", failed.join(", "));
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every integration suite but the host's runs in a guest, every guest
    /// attaches the probes, every kernel version of the matrix sees every
    /// event kind, and no guest runs a suite that does not exist.
    #[test]
    fn every_suite_runs_in_a_guest_and_the_probes_on_every_kernel_version() {
        let dir = crate::workspace_root().join("observer/tests");
        let suites: Vec<String> = std::fs::read_dir(&dir)
            .expect("observer/tests")
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".rs").map(str::to_owned))
            .collect();
        assert!(suites.len() > HOST_SUITES.len(), "{suites:?}");
        for suite in &suites {
            let on_host = HOST_SUITES.iter().any(|(s, _)| s == suite);
            let in_guest = KERNELS.iter().any(|k| k.suites.contains(&suite.as_str()));
            assert!(on_host != in_guest, "{suite}: in a guest {in_guest}, host only {on_host}");
        }
        for version in ["6.1", "6.12"] {
            assert!(
                KERNELS.iter().any(|k| k.name.trim_start_matches("debian-").split('-').next() == Some(version)
                    && k.suites.contains(&"hooks")),
                "hooks does not run on {version}"
            );
        }
        for k in KERNELS {
            assert!(k.suites.contains(&"foundation"), "{} does not attach the probes", k.name);
            assert!(k.suites.iter().all(|s| suites.iter().any(|t| t == s)), "{}: {:?}", k.name, k.suites);
        }
        assert!(KERNELS.iter().any(|k| k.arch == Arch::Aarch64));
    }

    /// One marker for the root suites: `observer/Cargo.toml` gives each the
    /// feature `root-tests`, no test carries `#[ignore]`, and every suite a
    /// guest runs (kernel behaviour, so root) is marked.
    #[test]
    fn root_suites_are_marked_once_in_the_manifest() {
        let root = crate::workspace_root();
        let manifest = std::fs::read_to_string(root.join("observer/Cargo.toml")).expect("observer/Cargo.toml");
        let marked: Vec<&str> = manifest
            .split("[[test]]")
            .skip(1)
            .filter(|t| t.contains("required-features = [\"root-tests\"]"))
            .filter_map(|t| t.lines().find_map(|l| l.trim().strip_prefix("name = ")).map(|n| n.trim_matches('"')))
            .collect();
        assert!(manifest.contains("\nroot-tests = []"), "observer/Cargo.toml declares no feature root-tests");
        assert_eq!(format!("observer/{}", "root-tests"), crate::ROOT_TESTS);
        for k in KERNELS {
            for s in k.suites {
                assert!(marked.contains(s), "{s} runs in {} but is not marked root-tests", k.name);
            }
        }
        for entry in std::fs::read_dir(root.join("observer/tests")).expect("observer/tests") {
            let path = entry.expect("a test file").path();
            let Some(name) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".rs")) else {
                continue;
            };
            let text = std::fs::read_to_string(&path).expect("a suite");
            assert!(!text.contains("#[ignore"), "{name}: a root test is marked by its suite's feature, not #[ignore]");
            let needs_root = text.contains("Daemon::start") || text.contains("Netns::new") || text.contains("ip netns");
            assert!(
                !needs_root || marked.contains(&name),
                "{name} starts a daemon or a namespace but is not marked root-tests"
            );
        }
        for m in &marked {
            assert!(root.join(format!("observer/tests/{m}.rs")).exists(), "{m} is marked but has no file");
        }
    }
}

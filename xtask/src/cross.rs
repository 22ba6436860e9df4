//! arm64 (`aarch64-unknown-linux-gnu`) builds on an x86-64 machine: the
//! userspace is cross-compiled by Debian's rustc (its aarch64 standard
//! library is the Debian package `libstd-rust-web-dev:arm64`) and linked by
//! `aarch64-linux-gnu-gcc`; the eBPF object embedded in it is the same
//! architecture-neutral bytecode as on x86-64 (aya-build builds it with
//! `bpf_target_arch = "aarch64"`, which only kprobe argument access would
//! read; observer has no kprobes).

use std::{path::PathBuf, process::Command};

use anyhow::{Context as _, Result};

use crate::{apt_install, output_ok, status, workspace_root};

/// The Rust target triple.
pub const TRIPLE: &str = "aarch64-unknown-linux-gnu";

/// Debian packages the cross-build needs (after `dpkg --add-architecture arm64`).
const PACKAGES: &[&str] = &["gcc-aarch64-linux-gnu", "libc6-dev-arm64-cross", "libstd-rust-web-dev:arm64"];

/// `--target` values that mean arm64.
pub fn parse(target: &str) -> Result<()> {
    match target {
        "aarch64" | "arm64" | TRIPLE => Ok(()),
        other => anyhow::bail!("unknown --target {other}; the one cross target is `aarch64` ({TRIPLE})"),
    }
}

/// Let apt serve arm64 packages (Debian's multiarch), once.
pub fn add_arm64_architecture() -> Result<()> {
    let foreign = output_ok(Command::new("dpkg").arg("--print-foreign-architectures")).unwrap_or_default();
    if foreign.lines().any(|l| l.trim() == "arm64") {
        return Ok(());
    }
    println!("setup: adding the arm64 architecture to dpkg (Debian multiarch)");
    status(Command::new("dpkg").args(["--add-architecture", "arm64"]))?;
    status(Command::new("apt-get").args(["update", "-q"]))
}

/// Install what the cross-build needs.
pub fn setup() -> Result<()> {
    add_arm64_architecture()?;
    apt_install(PACKAGES)
}

/// `cargo` of Debian's toolchain, set up to build for arm64.
pub fn cargo() -> Command {
    let mut c = Command::new("rustup");
    c.current_dir(workspace_root())
        .args(["run", "debian", "cargo"])
        // Set by the cargo running xtask; they would pick its toolchain.
        .env_remove("RUSTC")
        .env_remove("CARGO")
        .env("OBSERVER_EBPF_TOOLCHAIN", "debian")
        .env("CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER", "aarch64-linux-gnu-gcc")
        // C code in dependencies (SQLite, zstd).
        .env("CC_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-gcc")
        .env("AR_aarch64_unknown_linux_gnu", "aarch64-linux-gnu-ar");
    c
}

/// Build the release binary for arm64; returns its path.
pub fn build_release() -> Result<PathBuf> {
    setup()?;
    status(cargo().args(["build", "--release", "-p", "observer", "--target", TRIPLE]))
        .context("cross-building observer for arm64")?;
    Ok(workspace_root().join("target").join(TRIPLE).join("release/observer"))
}

/// The shared libraries an arm64 executable needs, found in Debian's
/// cross sysroot (`ldd` cannot run it): its `NEEDED` entries and its
/// interpreter.
pub fn libraries(binary: &std::path::Path) -> Result<Vec<(PathBuf, PathBuf)>> {
    let dynamic = output_ok(Command::new("aarch64-linux-gnu-readelf").args(["-d", "-l"]).arg(binary))
        .context("aarch64-linux-gnu-readelf")?;
    let sysroot = PathBuf::from("/usr/aarch64-linux-gnu/lib");
    let mut out = Vec::new();
    for line in dynamic.lines() {
        // ` 0x0000000000000001 (NEEDED)  Shared library: [libc.so.6]`
        if let Some(name) = line.split("Shared library: [").nth(1).and_then(|s| s.split(']').next()) {
            out.push((sysroot.join(name), PathBuf::from("lib/aarch64-linux-gnu").join(name)));
        }
        // `[Requesting program interpreter: /lib/ld-linux-aarch64.so.1]`
        if let Some(interp) = line.split("program interpreter: ").nth(1).and_then(|s| s.split(']').next()) {
            let name = interp.rsplit('/').next().unwrap_or(interp);
            out.push((sysroot.join(name), PathBuf::from(interp.trim_start_matches('/'))));
        }
    }
    for (from, _) in &out {
        anyhow::ensure!(from.exists(), "{} is missing (libc6-dev-arm64-cross)", from.display());
    }
    Ok(out)
}

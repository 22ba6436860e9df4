//! What ships: the release binary (`build`), the package layout (`dist`)
//! and the container image (`image`), for this machine or arm64.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context as _, Result};

use crate::{cargo, cross, ensure_ok, setup, status, workspace_root};

/// Build the release binary for the host, or for arm64 with `--target aarch64`.
pub fn build(target: Option<&str>) -> Result<()> {
    let toolchain = setup(false)?;
    let bin = if let Some(t) = target {
        cross::parse(t)?;
        cross::build_release()?
    } else {
        status(cargo().args(["build", "--release", "-p", "observer"]).env("OBSERVER_EBPF_TOOLCHAIN", &toolchain))?;
        workspace_root().join("target/release/observer")
    };
    println!("build: {}", bin.display());
    Ok(())
}

pub fn dist(target: Option<&str>) -> Result<()> {
    let toolchain = setup(false)?;
    // The docs come from the host's binary (they are the same on every
    // architecture, and an arm64 binary does not run here).
    status(cargo().args(["build", "--release", "-p", "observer"]).env("OBSERVER_EBPF_TOOLCHAIN", &toolchain))?;
    let root = workspace_root();
    let host_bin = root.join("target/release/observer");
    let (bin, out) = match target {
        Some(t) => {
            cross::parse(t)?;
            (cross::build_release()?, root.join("target/dist-aarch64"))
        }
        None => (host_bin.clone(), root.join("target/dist")),
    };
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(out.join("bin"))?;
    fs::copy(&bin, out.join("bin/observer"))?;
    status(Command::new(&host_bin).args(["debug", "docs", "--out-dir"]).arg(&out))?;
    for (from, to) in [
        ("deploy/systemd/observer.service", "systemd/observer.service"),
        ("deploy/prometheus/observer-rules.yml", "prometheus/observer-rules.yml"),
        ("dashboards/observer.json", "dashboards/observer.json"),
        ("dashboards/fleet.json", "dashboards/fleet.json"),
        ("examples/observer.toml", "examples/observer.toml"),
    ] {
        let dst = out.join(to);
        if let Some(dir) = dst.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::copy(root.join(from), &dst).with_context(|| format!("copying {from}"))?;
    }
    println!("dist: {} (bin, completions, man, systemd, prometheus, dashboards, examples)", out.display());
    Ok(())
}

pub fn image_task(target: Option<&str>) -> Result<()> {
    let toolchain = setup(true)?;
    match target {
        None => println!("image: {}", image(&toolchain)?),
        Some("all") => {
            let amd64 = image(&toolchain)?;
            let arm64 = image_arm64()?;
            let list = format!("localhost/observer:{}-multiarch", env!("CARGO_PKG_VERSION"));
            let _ = Command::new("podman").args(["manifest", "rm", &list]).output();
            status(Command::new("podman").args(["manifest", "create", &list])).context("podman manifest create")?;
            // Local images: without the transport, podman 4 asks a registry.
            for image in [&amd64, &arm64] {
                status(Command::new("podman").args(["manifest", "add", &list, &format!("containers-storage:{image}")]))
                    .context("podman manifest add")?;
            }
            println!("image: {list} (manifest list: {amd64}, {arm64})");
        }
        Some(t) => {
            cross::parse(t)?;
            println!("image: {}", image_arm64()?);
        }
    }
    Ok(())
}

/// Lay out the image's root: the binary and the libraries it needs, each
/// as (source, path inside the image).
fn stage_image(stage: &Path, binary: &Path, libs: &[(PathBuf, PathBuf)]) -> Result<()> {
    let _ = fs::remove_dir_all(stage);
    let rootfs = stage.join("rootfs");
    for dir in ["usr/bin", "var/lib/observer", "tmp"] {
        fs::create_dir_all(rootfs.join(dir))?;
    }
    fs::copy(binary, rootfs.join("usr/bin/observer"))?;
    for (from, to) in libs {
        let dst = rootfs.join(to);
        if let Some(dir) = dst.parent() {
            fs::create_dir_all(dir)?;
        }
        fs::copy(from, &dst).with_context(|| format!("copying {}", from.display()))?;
    }
    fs::copy(workspace_root().join("deploy/container/Containerfile"), stage.join("Containerfile"))?;
    Ok(())
}

/// Build the container image: the release binary and the shared libraries
/// `ldd` names, under `target/image/rootfs`, then `podman build`. Returns
/// the image's name.
pub fn image(toolchain: &str) -> Result<String> {
    status(cargo().args(["build", "--release", "-p", "observer"]).env("OBSERVER_EBPF_TOOLCHAIN", toolchain))?;
    let root = workspace_root();
    let stage = root.join("target/image");
    let binary = root.join("target/release/observer");
    let ldd = Command::new("ldd").arg(&binary).output().context("running ldd")?;
    ensure_ok(&ldd, "ldd")?;
    let mut libs = Vec::new();
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` or
        // `/lib64/ld-linux-x86-64.so.2 (0x...)`; the vDSO has no file.
        let path = line.split("=>").last().unwrap_or_default().split_whitespace().next().unwrap_or_default();
        if path.starts_with('/') {
            libs.push((PathBuf::from(path), PathBuf::from(path.trim_start_matches('/'))));
        }
    }
    stage_image(&stage, &binary, &libs)?;
    let tag = format!("localhost/observer:{}", env!("CARGO_PKG_VERSION"));
    status(
        Command::new("podman").args(["build", "-q", "-t", &tag, "-f"]).arg(stage.join("Containerfile")).arg(&stage),
    )?;
    println!("image: {tag} (the binary and {} libraries)", libs.len());
    Ok(tag)
}

/// The arm64 image: the cross-built binary and its libraries from Debian's
/// cross sysroot. The Containerfile only copies files, so podman builds it
/// without emulating arm64.
fn image_arm64() -> Result<String> {
    let binary = cross::build_release()?;
    let libs = cross::libraries(&binary)?;
    let stage = workspace_root().join("target/image-aarch64");
    stage_image(&stage, &binary, &libs)?;
    let tag = format!("localhost/observer:{}-arm64", env!("CARGO_PKG_VERSION"));
    status(
        Command::new("podman")
            .args(["build", "-q", "--arch", "arm64", "-t", &tag, "-f"])
            .arg(stage.join("Containerfile"))
            .arg(&stage),
    )?;
    println!("image: {tag} (arm64: the binary and {} libraries)", libs.len());
    Ok(tag)
}

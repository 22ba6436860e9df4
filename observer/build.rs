//! Builds the eBPF object (`observer-ebpf`) with aya-build and leaves it in
//! `OUT_DIR/observer` for `include_bytes_aligned!`. With `AYA_BUILD_SKIP=1`
//! an empty stub is written instead, so pure-logic code builds and tests
//! without the eBPF toolchain; loading the stub fails with a clear error.

use std::{env, fs, path::PathBuf};

use anyhow::Context as _;

fn main() -> anyhow::Result<()> {
    println!("cargo:rerun-if-env-changed=AYA_BUILD_SKIP");
    println!("cargo:rerun-if-env-changed=OBSERVER_EBPF_TOOLCHAIN");
    let out_dir = PathBuf::from(env::var_os("OUT_DIR").context("OUT_DIR not set")?);
    let manifest_dir = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR not set")?);
    let skip = env::var("AYA_BUILD_SKIP").is_ok_and(|v| v == "1" || v.eq_ignore_ascii_case("true"));
    let object = out_dir.join("observer");
    if skip {
        fs::write(&object, b"").with_context(|| format!("writing stub {}", object.display()))?;
        return Ok(());
    }
    let common = manifest_dir.join("../observer-common");
    println!("cargo:rerun-if-changed={}", common.display());
    let ebpf_dir = manifest_dir.join("../observer-ebpf");
    let ebpf_dir = ebpf_dir.to_str().context("non UTF-8 path to observer-ebpf")?;
    // `cargo xtask setup` picks the toolchain: `debian` (Debian's rustc with
    // rust-src, linked into rustup) or a rustup nightly with rust-src.
    let toolchain = env::var("OBSERVER_EBPF_TOOLCHAIN").unwrap_or_else(|_| "debian".to_owned());
    if toolchain != "nightly" {
        // A stable compiler needs this to accept `-Z build-std`; aya-build
        // reads it and the nested cargo inherits it.
        // SAFETY: build scripts are single threaded here.
        unsafe { env::set_var("RUSTC_BOOTSTRAP", "1") };
    }
    // One eBPF build for every profile of this workspace (check, debug,
    // release): the object depends only on the target's architecture
    // (aya-build always builds it in release), and each build of it takes
    // minutes. aya-build builds under `OUT_DIR`, so point that at a shared
    // directory per architecture for the call; its nested cargo locks it.
    let arch = env::var("CARGO_CFG_TARGET_ARCH").context("CARGO_CFG_TARGET_ARCH not set")?;
    // The benchmark build (`--features bench`) adds the empty programs:
    // an object of its own, beside the shipped one.
    let bench = env::var_os("CARGO_FEATURE_BENCH").is_some();
    let flavour = if bench { format!("{arch}-bench") } else { arch };
    let shared = shared_dir(&out_dir).map_or_else(|| out_dir.clone(), |t| t.join("ebpf").join(&flavour));
    fs::create_dir_all(&shared).with_context(|| format!("creating {}", shared.display()))?;
    // SAFETY: build scripts are single threaded here.
    unsafe { env::set_var("OUT_DIR", &shared) };
    let built = aya_build::build_ebpf(
        [aya_build::Package {
            name: "observer-ebpf",
            root_dir: ebpf_dir,
            features: if bench { &["bench"] } else { &[] },
            ..Default::default()
        }],
        aya_build::Toolchain::Custom(&toolchain),
    );
    // SAFETY: as above.
    unsafe { env::set_var("OUT_DIR", &out_dir) };
    built.with_context(|| {
        format!("building the eBPF object with toolchain `{toolchain}` failed; run `cargo xtask setup`, or set AYA_BUILD_SKIP=1 to build without it")
    })?;
    if shared != out_dir {
        fs::copy(shared.join("observer"), &object)
            .with_context(|| format!("copying the eBPF object from {}", shared.display()))?;
    }
    Ok(())
}

/// The target directory of this build: the nearest ancestor of `OUT_DIR`
/// that cargo marked with `CACHEDIR.TAG`.
fn shared_dir(out_dir: &std::path::Path) -> Option<PathBuf> {
    out_dir.ancestors().find(|d| d.join("CACHEDIR.TAG").is_file()).map(std::path::Path::to_path_buf)
}

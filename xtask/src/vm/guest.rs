//! One guest of the kernel matrix: fetch its kernel, build what it runs,
//! boot it under QEMU (TCG) with virtme-ng, sharing the host's filesystem
//! read-only, and run its root suites inside against the binaries built on
//! the host.
//!
//! An arm64 kernel boots under `qemu-system-aarch64` with its own Debian
//! arm64 userland as root (made once by `mmdebstrap`, cached under
//! `target/vm/arm64-root`), the workspace shared read-only at the same path,
//! and the suites cross-built for arm64 (`cross`).
//!
//! Kernels come from Debian's archive (`linux-image-*-unsigned`); their
//! modules are installed under `/lib/modules/<release>` on the host so the
//! guest (which sees the host's root) can load `veth`, `nf_tables`, `nf_conntrack`.
//! QEMU 7.2's C virtiofsd is wrapped to take the Rust virtiofsd's arguments
//! that virtme-ng passes.

use std::{
    fmt::Write as _,
    fs,
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, ensure, Context as _, Result};

use super::{Arch, Kernel, HOST_ONLY};
use crate::{apt_install, cargo, cross, output_ok, status, workspace_root, ROOT_TESTS};

/// One suite in the guest longer than this is killed and failed (a hung
/// test must not hang CI).
const SUITE_TIMEOUT_S: u64 = 1200;
/// The whole VM run, boot included; past it the VM is killed and the run
/// fails with a message.
const VM_TIMEOUT: std::time::Duration = std::time::Duration::from_hours(1);
const VIRTME_NG: &str = "virtme-ng==1.42";

const VIRTIOFSD_WRAPPER: &str = r#"#!/bin/sh
# Written by `cargo xtask test --kernel`: maps the Rust virtiofsd arguments
# virtme-ng passes onto QEMU 7.2's C virtiofsd, and writes the pid file
# virtme-ng waits for.
sock= dir= cache=auto
while [ $# -gt 0 ]; do
  case "$1" in
    --socket-path) sock=$2; shift ;;
    --socket-path=*) sock=${1#*=} ;;
    --shared-dir) dir=$2; shift ;;
    --shared-dir=*) dir=${1#*=} ;;
    --cache) cache=$2; shift ;;
    --cache=*) cache=${1#*=} ;;
    --version|-V) echo "virtiofsd 1.10.0"; exit 0 ;;
    *) ;;
  esac
  shift
done
# `--help` and other probes carry no socket: nothing to start.
[ -n "$sock" ] || exit 0
case "$cache" in never) cache=none ;; metadata) cache=auto ;; esac
/usr/lib/qemu/virtiofsd --socket-path="$sock" -o source="$dir",cache="$cache",sandbox=chroot &
child=$!
i=0
while [ ! -S "$sock" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i+1)); done
echo $child > "$sock.pid"
wait $child
"#;

fn vm_dir() -> PathBuf {
    workspace_root().join("target/vm")
}

/// Where `python3`'s pip puts commands (`vng`, `virtme-run`).
fn python_scripts() -> Result<PathBuf> {
    let dir = output_ok(Command::new("python3").args(["-c", "import sysconfig; print(sysconfig.get_path('scripts'))"]))
        .context("python3 (for virtme-ng)")?;
    Ok(PathBuf::from(dir.trim()))
}

/// Install QEMU, kmod and virtme-ng (for arm64 also the cross-build's and
/// `mmdebstrap`'s packages), and fetch and unpack the kernel. Returns the
/// kernel image and its release.
fn prepare(k: &Kernel) -> Result<(PathBuf, String)> {
    let qemu = match k.arch {
        Arch::X86_64 => "qemu-system-x86",
        Arch::Aarch64 => {
            cross::setup()?;
            apt_install(ARM64_ROOT_PACKAGES)?;
            "qemu-system-arm"
        }
    };
    apt_install(&[qemu, "qemu-system-common", "kmod", "busybox-static"])?;
    if output_ok(Command::new(python_scripts()?.join("vng")).arg("--version")).is_none() {
        println!("vm: installing {VIRTME_NG} from PyPI");
        status(Command::new("python3").args(["-m", "pip", "install", "-q", VIRTME_NG]))?;
    }
    let dir = vm_dir();
    fs::create_dir_all(dir.join("bin"))?;
    let wrapper = dir.join("bin/virtiofsd");
    fs::write(&wrapper, VIRTIOFSD_WRAPPER)?;
    status(Command::new("chmod").arg("755").arg(&wrapper))?;
    let list = output_ok(Command::new("apt-cache").args(["search", "--names-only", k.package_regex]))
        .context("apt-cache search")?;
    let mut pkgs: Vec<&str> = list.lines().filter_map(|l| l.split_whitespace().next()).collect();
    // Newest by the numbers in the name (6.1.0-57 > 6.1.0-50; 6.12.117 > 6.12.107).
    pkgs.sort_by_key(|p| {
        p.split(|c: char| !c.is_ascii_digit()).filter_map(|n| n.parse::<u32>().ok()).collect::<Vec<_>>()
    });
    let pkg = *pkgs.last().with_context(|| format!("no Debian package matches {}", k.package_regex))?;
    let release = pkg.trim_start_matches("linux-image-").trim_end_matches("-unsigned").to_owned();
    let root = dir.join(&release);
    let image = root.join(format!("boot/vmlinuz-{release}"));
    if !image.exists() {
        println!("vm: fetching {pkg}");
        let spec = match k.arch {
            Arch::X86_64 => pkg.to_owned(),
            Arch::Aarch64 => format!("{pkg}:arm64"),
        };
        status(Command::new("apt-get").args(["download", "-q", &spec]).current_dir(&dir))?;
        let deb = fs::read_dir(&dir)?
            .filter_map(Result::ok)
            .map(|e| e.path())
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(pkg)))
            .context("downloaded .deb")?;
        status(Command::new("dpkg").arg("-x").arg(&deb).arg(&root))?;
    }
    Ok((image, release))
}

/// Install kernel `release`'s modules where its guest loads them from.
fn install_modules(k: &Kernel, release: &str) -> Result<()> {
    let root = vm_dir().join(release);
    // The guest loads `veth`, `nf_tables`, `nf_conntrack` from its root:
    // the host's for x86_64, its own userland for arm64.
    let modules_root = match k.arch {
        Arch::X86_64 => PathBuf::from("/"),
        Arch::Aarch64 => arm64_root()?,
    };
    let modules = modules_root.join("lib/modules").join(release);
    if !modules.join("modules.dep").exists() {
        println!("vm: installing the guest's modules under {}", modules.display());
        fs::create_dir_all(modules_root.join("lib/modules"))?;
        status(
            Command::new("cp")
                .arg("-a")
                .arg(root.join("lib/modules").join(release))
                .arg(modules_root.join("lib/modules")),
        )?;
        status(Command::new("depmod").arg("-b").arg(&modules_root).arg(release))?;
    }
    Ok(())
}

/// What makes the arm64 guest's userland on the host.
const ARM64_ROOT_PACKAGES: &[&str] = &["mmdebstrap", "arch-test", "qemu-user-static", "binfmt-support"];

/// What the arm64 guest's userland holds: virtme-ng's init needs
/// busybox and kmod; the suites need the rest.
const ARM64_PACKAGES: &str = "busybox-static,kmod,iproute2,nftables,conntrack,nginx-light,python3,procps,\
util-linux,iputils-ping,bpftool,openssl,haproxy,libcap2-bin";

/// The arm64 guest's root: Debian bookworm for arm64 by `mmdebstrap`
/// (maintainer scripts run under `qemu-user-static` through binfmt), made
/// once and remade when the package list changes.
fn arm64_root() -> Result<PathBuf> {
    let dir = vm_dir().join("arm64-root");
    let stamp = dir.join(".observer-packages");
    if fs::read_to_string(&stamp).is_ok_and(|s| s == ARM64_PACKAGES) {
        return Ok(dir);
    }
    let binfmt = Path::new("/proc/sys/fs/binfmt_misc");
    if !binfmt.join("status").exists() {
        status(Command::new("mount").args(["-t", "binfmt_misc", "binfmt_misc"]).arg(binfmt))
            .context("mounting binfmt_misc (arm64 maintainer scripts run under qemu-user)")?;
    }
    if !binfmt.join("qemu-aarch64").exists() {
        status(Command::new("update-binfmts").args(["--enable", "qemu-aarch64"]))?;
    }
    ensure!(
        binfmt.join("qemu-aarch64").exists(),
        "binfmt_misc has no qemu-aarch64 entry: arm64 programs cannot run here to make the guest's userland"
    );
    let tmp = vm_dir().join("arm64-root.tmp");
    // A run killed inside mmdebstrap leaves its proc, sys and dev mounts
    // there (seen: a clone that could not be removed).
    unmount_below(&tmp);
    let _ = fs::remove_dir_all(&tmp);
    let _ = fs::remove_dir_all(&dir);
    println!("vm: making the arm64 guest's userland (mmdebstrap; a few minutes, once)");
    let t = Instant::now();
    status(
        Command::new("mmdebstrap")
            .args(["--quiet", "--arch=arm64", "--variant=minbase", "--components=main"])
            .arg(format!("--include={ARM64_PACKAGES}"))
            .arg("bookworm")
            .arg(&tmp)
            .arg("deb http://deb.debian.org/debian bookworm main")
            .arg("deb http://deb.debian.org/debian bookworm-updates main")
            .arg("deb http://deb.debian.org/debian-security bookworm-security main"),
    )
    .context("mmdebstrap (the arm64 guest's userland)")?;
    // Mount points of the shared workspace and the output directory.
    fs::create_dir_all(tmp.join(workspace_root().strip_prefix("/").unwrap_or(&workspace_root())))?;
    fs::create_dir_all(tmp.join("out"))?;
    // virtme-ng's init ends the guest with `poweroff`, which minbase lacks.
    fs::write(tmp.join("usr/local/sbin/poweroff"), "#!/bin/sh\nexec busybox poweroff -f\n")?;
    status(Command::new("chmod").arg("755").arg(tmp.join("usr/local/sbin/poweroff")))?;
    fs::write(tmp.join(".observer-packages"), ARM64_PACKAGES)?;
    fs::rename(&tmp, &dir)?;
    println!("vm: arm64 userland ready in {:.0} s", t.elapsed().as_secs_f64());
    Ok(dir)
}

/// Unmount whatever is mounted at or below `dir`, deepest first.
fn unmount_below(dir: &Path) {
    let Ok(mounts) = fs::read_to_string("/proc/self/mounts") else { return };
    let mut below: Vec<&str> =
        mounts.lines().filter_map(|l| l.split(' ').nth(1)).filter(|m| Path::new(m).starts_with(dir)).collect();
    below.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in below {
        let _ = Command::new("umount").arg("-l").arg(m).status();
    }
}

/// Test executables of kernel `k`'s suites: built on the host, for arm64
/// cross-built.
fn suite_binaries(k: &Kernel, toolchain: &str) -> Result<Vec<(String, PathBuf)>> {
    let mut cmd = match k.arch {
        Arch::X86_64 => {
            let mut c = cargo();
            c.args(["test", "--workspace", "--features", ROOT_TESTS, "--no-run", "--message-format=json"])
                .env("OBSERVER_EBPF_TOOLCHAIN", toolchain);
            c
        }
        Arch::Aarch64 => {
            // Release: the suites then drive the release daemon, as on x86-64
            // (one cross build of the dependencies instead of a debug one).
            let mut c = cross::cargo();
            c.args([
                "test",
                "--release",
                "-p",
                "observer",
                "--features",
                ROOT_TESTS,
                "--no-run",
                "--message-format=json",
                "--target",
                cross::TRIPLE,
            ]);
            for s in k.suites {
                c.args(["--test", s]);
            }
            c
        }
    };
    let out = cmd.output()?;
    ensure!(out.status.success(), "building the test binaries failed: {}", String::from_utf8_lossy(&out.stderr));
    let mut found = Vec::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let name = v["target"]["name"].as_str().unwrap_or_default();
        if v["reason"] == "compiler-artifact" && k.suites.contains(&name) {
            if let Some(exe) = v["executable"].as_str() {
                found.push((name.to_owned(), PathBuf::from(exe)));
            }
        }
    }
    ensure!(found.len() == k.suites.len(), "expected test binaries for {:?}, found {found:?}", k.suites);
    Ok(found)
}

/// The guest sees the host's files read-only: build the Go TLS peer of the
/// `wire_truth` suite here, where that suite looks for it
/// (`CARGO_TARGET_TMPDIR/tlstool`), or for arm64 where
/// `OBSERVER_TEST_TLSTOOL` names it. Returns its path.
fn prebuild_tlstool(arch: Arch) -> Result<PathBuf> {
    let root = workspace_root();
    let (dir, goarch) = match arch {
        Arch::X86_64 => (root.join("target/tmp/tlstool"), "amd64"),
        Arch::Aarch64 => (vm_dir().join("arm64-bin"), "arm64"),
    };
    fs::create_dir_all(&dir)?;
    let bin = dir.join("tlstool");
    status(
        Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg(root.join("observer/tests/go/tlstool.go"))
            .current_dir(&dir)
            .env("GO111MODULE", "off")
            .env("GOARCH", goarch)
            .env("GOCACHE", dir.join("cache"))
            // Debian's golang-golang-x-net-dev (x/net/http2 for h2c) lives here.
            .env("GOPATH", format!("{}:/usr/share/gocode", dir.join("gopath").display()))
            .env("HOME", &dir),
    )
    .context("building the Go TLS peer (Debian's golang-go and golang-golang-x-net-dev)")?;
    Ok(bin)
}

/// The script the guest runs: each suite under a timeout, its log and exit
/// code written to `out` (for arm64, shared with the guest as `/out`).
fn suite_script(
    k: &Kernel,
    bins: &[(String, PathBuf)],
    daemon: &Path,
    tlstool: &Path,
    out: &Path,
    filter: &[String],
) -> Result<PathBuf> {
    let path = crate::python_first(&std::env::var("PATH").unwrap_or_default());
    // `RUSTC_BOOTSTRAP` lets the stable-built harness take libtest's
    // `--report-time`: each test's time in the guest reaches the CI log.
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".into());
    // Where the guest writes its logs: the host's directory, or for arm64
    // (its own root) the directory shared as `/out`.
    let (guest_out, env) = match k.arch {
        Arch::X86_64 => {
            (out.to_path_buf(), format!("PATH='{path}' HOME='{home}' OBSERVER_BIN='{}'", daemon.display()))
        }
        Arch::Aarch64 => (
            PathBuf::from("/out"),
            format!(
                "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root OBSERVER_TEST_TLSTOOL='{}'",
                tlstool.display()
            ),
        ),
    };
    let mut script = format!(
        "#!/bin/sh\ncd {root}\nexport {env} RUST_BACKTRACE=0 OBSERVER_TEST_TIME_SLACK=5 OBSERVER_TEST_FENTRY=1 RUSTC_BOOTSTRAP=1\nuname -r > {out}/uname\n",
        root = workspace_root().display(),
        out = guest_out.display()
    );
    let filter = filter.join(" ");
    for (name, exe) in bins {
        // A name filter picks tests by hand: the left-out ones too.
        let left_out = HOST_ONLY.iter().filter(|(s, _, _)| s == name && filter.is_empty());
        let skip = left_out.fold(String::new(), |mut acc, (_, t, _)| {
            let _ = write!(acc, " --skip {t}");
            acc
        });
        // A suite that failed (not timed out) runs its failed tests once
        // more, each on its own (`--exact`): a guest under TCG is slow by
        // seconds at random, and the host reports a pass then as FLAKY
        // with the first failure's text, never silently.
        let _ = writeln!(
            script,
            "s=$(date +%s); timeout -k 10 {SUITE_TIMEOUT_S} {exe} --test-threads=1 -Z unstable-options --report-time{skip} {filter} > {out}/{name}.log 2>&1; rc=$?\n\
             if [ $rc -ne 0 ] && [ $rc -ne 124 ] && [ $rc -ne 137 ]; then f=$(sed -n 's/^test \\(.*\\) \\.\\.\\. FAILED.*/\\1/p' {out}/{name}.log); \
             if [ -n \"$f\" ]; then timeout -k 10 {SUITE_TIMEOUT_S} {exe} --test-threads=1 -Z unstable-options --report-time --exact $f > {out}/{name}.retry.log 2>&1; echo $? > {out}/{name}.retry.rc; fi; fi\n\
             echo \"$rc $(( $(date +%s) - s ))\" > {out}/{name}.rc",
            exe = exe.display(),
            out = guest_out.display()
        );
    }
    let script_path = vm_dir().join(format!("run-suites-{}.sh", k.name));
    fs::write(&script_path, script)?;
    status(Command::new("chmod").arg("755").arg(&script_path))?;
    Ok(script_path)
}

/// A guest's kernel, fetched: what `fetch` did before any lane starts.
pub struct Fetched {
    pub(super) kernel: &'static Kernel,
    image: PathBuf,
    release: String,
    /// The x86-64 suites, built with the host's: the host's `cargo test`
    /// holds the build directory while it runs.
    bins: Option<Vec<(String, PathBuf)>>,
}

/// A guest ready to boot: its userland, modules and suites in place, its
/// script written.
struct Prepared {
    kernel: &'static Kernel,
    image: PathBuf,
    release: String,
    bins: Vec<(String, PathBuf)>,
    script_path: PathBuf,
    out: PathBuf,
}

/// Everything of kernel `k` that installs packages or needs the host's
/// build directory, done one guest at a time before any lane starts (two
/// `apt-get`s at once would fight over dpkg's lock).
pub fn fetch(k: &'static Kernel, toolchain: &str) -> Result<Fetched> {
    let (image, release) = prepare(k)?;
    let bins = match k.arch {
        Arch::X86_64 => Some(suite_binaries(k, toolchain)?),
        Arch::Aarch64 => None,
    };
    Ok(Fetched { kernel: k, image, release, bins })
}

/// The rest, in the guest's lane: the arm64 userland and cross-build, the
/// modules, the Go peer, the script. `daemon` is the host's release build,
/// which the x86-64 suites drive (the arm64 suites are release builds and
/// drive their own).
fn build(f: Fetched, toolchain: &str, daemon: &Path, filter: &[String]) -> Result<Prepared> {
    let Fetched { kernel: k, image, release, bins } = f;
    if k.arch == Arch::Aarch64 {
        arm64_root()?;
    }
    install_modules(k, &release)?;
    let bins = match bins {
        Some(b) => b,
        None => suite_binaries(k, toolchain)?,
    };
    let tlstool = prebuild_tlstool(k.arch)?;
    let out = vm_dir().join(format!("out-{}", k.name));
    let _ = fs::remove_dir_all(&out);
    fs::create_dir_all(&out)?;
    let script_path = suite_script(k, &bins, daemon, &tlstool, &out, filter)?;
    Ok(Prepared { kernel: k, image, release, bins, script_path, out })
}

/// Build and boot fetched guest `f`; fails if any of its tests fails.
pub(super) fn run(f: Fetched, toolchain: &str, daemon: &Path, filter: &[String]) -> Result<()> {
    boot(&build(f, toolchain, daemon, filter)?)
}

/// Boot one prepared guest and run its suites; fails if any test fails.
fn boot(p: &Prepared) -> Result<()> {
    let started = Instant::now();
    let Prepared { kernel: k, image, release, bins, script_path, out } = p;
    let path = std::env::var("PATH").unwrap_or_default();
    println!("vm: booting {release} under QEMU (TCG) and running {:?}", k.suites);
    let scripts = python_scripts()?;
    let vm_path = format!("{}:{}:{path}", vm_dir().join("bin").display(), scripts.display());
    let vng_log = vm_dir().join(format!("vng-{}.log", k.name));
    let log = fs::File::create(&vng_log)?;
    let mut vng = Command::new(scripts.join("vng"));
    vng.args(["--run"]).arg(image).args(["--disable-kvm", "--memory", "2G", "--cpus", "2"]);
    match k.arch {
        Arch::X86_64 => {
            // Under TCG the kernel finds the vCPUs' TSCs "unsynchronized"
            // and falls back to the HPET: every clock read (the daemon's,
            // Go's, nginx's) then leaves the vDSO for an emulated device,
            // 4x slower here (200,000 reads: 1.35 s against 0.32 s).
            // QEMU's TCG TSC follows the host's clock on every vCPU, so it
            // is monotonic and true: use it.
            vng.args(["--append", "tsc=reliable clocksource=tsc"]).arg("--rwdir").arg(out);
        }
        Arch::Aarch64 => {
            let ws = workspace_root();
            vng.args(["--arch", "arm64", "--root"])
                .arg(arm64_root()?)
                .arg(format!("--rodir={}={}", ws.display(), ws.display()))
                .arg(format!("--rwdir=/out={}", out.display()));
        }
    }
    let mut vng = vng
        .arg("--exec")
        .arg(script_path)
        .env("PATH", vm_path)
        .stdout(log.try_clone()?)
        .stderr(log)
        // Its own process group: a timeout kills QEMU and virtiofsd too.
        .process_group(0)
        .spawn()
        .context("starting vng (virtme-ng)")?;
    let st = loop {
        if let Some(st) = vng.try_wait()? {
            break st;
        }
        if started.elapsed() > VM_TIMEOUT {
            let _ = Command::new("kill").args(["-KILL", "--", &format!("-{}", vng.id())]).status();
            let _ = vng.wait();
            bail!(
                "the {release} VM did not finish within {} min and was killed (a hung guest or test?); see {} and {}",
                VM_TIMEOUT.as_secs() / 60,
                vng_log.display(),
                out.display()
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    };
    let guest = fs::read_to_string(out.join("uname")).unwrap_or_default();
    ensure!(
        guest.trim() == release,
        "the VM did not run the suites (vng exited {st}; guest kernel {:?}); see {}",
        guest.trim(),
        vng_log.display()
    );
    let mut failed = Vec::new();
    let mut flaky = Vec::new();
    for (name, _) in bins {
        let rc = fs::read_to_string(out.join(format!("{name}.rc"))).unwrap_or_else(|_| "missing".into());
        let log = fs::read_to_string(out.join(format!("{name}.log"))).unwrap_or_default();
        for l in log.lines().filter(|l| l.starts_with("test ") || l.contains("MEASURED")) {
            println!("vm[{release}] {name}: {l}");
        }
        let mut parts = rc.split_whitespace();
        let code = parts.next().unwrap_or("missing");
        let secs = parts.next().unwrap_or("?");
        println!("vm[{release}] {name}: exit {code} in {secs} s");
        if code == "124" || code == "137" {
            println!("vm[{release}] {name}: timed out after {SUITE_TIMEOUT_S} s and was killed");
        }
        if code != "0" {
            // The harness's failure section says why (assertion messages and
            // captured output), so a CI log is enough to diagnose it.
            if let Some(at) = log.find("\nfailures:\n") {
                for l in log[at..].lines().take(80) {
                    println!("vm[{release}] {name}: {l}");
                }
            }
            match retried(out, name, release) {
                Retry::Passed(tests) => flaky.push(format!("{name}: {tests}")),
                Retry::Failed | Retry::NotRun => failed.push(name.clone()),
            }
        }
    }
    println!("vm[{release}]: suites took {:.0} s in all", started.elapsed().as_secs_f64());
    if !flaky.is_empty() {
        println!(
            "vm[{release}]: FLAKY (failed, then passed when run again on its own; the first failure is above): {}",
            flaky.join("; ")
        );
    }
    if !failed.is_empty() {
        bail!("suites failed on {release}: {} (logs in {})", failed.join(", "), out.display());
    }
    Ok(())
}

/// What the second run of a suite's failed tests said.
enum Retry {
    /// All passed: the tests named.
    Passed(String),
    Failed,
    /// No second run (a timeout, or no failed test named in the log).
    NotRun,
}

/// Read and print suite `name`'s second run (`suite_script` writes it).
fn retried(out: &Path, name: &str, release: &str) -> Retry {
    let Ok(rc) = fs::read_to_string(out.join(format!("{name}.retry.rc"))) else {
        return Retry::NotRun;
    };
    let log = fs::read_to_string(out.join(format!("{name}.retry.log"))).unwrap_or_default();
    let mut tests = Vec::new();
    for l in log.lines().filter(|l| l.starts_with("test ") || l.contains("MEASURED")) {
        println!("vm[{release}] {name} (run again): {l}");
        if let Some(t) = l.strip_prefix("test ").and_then(|t| t.split(" ... ").next()).filter(|_| l.contains(" ... ")) {
            tests.push(t.to_string());
        }
    }
    if rc.trim() == "0" {
        Retry::Passed(tests.join(", "))
    } else {
        if let Some(at) = log.find("\nfailures:\n") {
            for l in log[at..].lines().take(80) {
                println!("vm[{release}] {name} (run again): {l}");
            }
        }
        Retry::Failed
    }
}

#[cfg(test)]
mod tests {
    use super::unmount_below;

    /// What an interrupted mmdebstrap leaves (mounts below its directory)
    /// is unmounted, deepest first, so the directory can be removed.
    #[test]
    fn mounts_left_below_a_directory_are_unmounted() {
        if !crate::is_root() {
            eprintln!("not root: mounting needs it (cargo xtask test runs this as root in CI)");
            return;
        }
        let dir = std::env::temp_dir().join(format!("observer-unmount-{}", std::process::id()));
        let outer = dir.join("proc");
        let inner = outer.join("fs");
        for m in [&outer, &inner] {
            std::fs::create_dir_all(m).unwrap();
            let mounted = std::process::Command::new("mount").args(["-t", "tmpfs", "none"]).arg(m).status().unwrap();
            assert!(mounted.success());
        }
        let mounted = || {
            std::fs::read_to_string("/proc/self/mounts")
                .unwrap()
                .lines()
                .filter(|l| l.split(' ').nth(1).is_some_and(|m| std::path::Path::new(m).starts_with(&dir)))
                .count()
        };
        assert_eq!(mounted(), 2);
        unmount_below(&dir);
        assert_eq!(mounted(), 0, "both unmounted");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

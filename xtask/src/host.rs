//! The host's suites: unit tests and every root suite against this kernel,
//! all of them run to the end (`--no-fail-fast`), then the tests that
//! failed run once more, each on its own. The host's suites share the CPU
//! with two TCG guests, and a Python server's timer can fire a tenth of a
//! second late then; a pass on the second run is printed as `FLAKY` with
//! the first failure's text above it, and a second failure fails the run.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::{bail, Context as _, Result};

use crate::{cargo, workspace_root, ROOT_TESTS};

/// The environment every run of a suite gets.
fn with_env<'a>(cmd: &'a mut Command, toolchain: &str, image: &str, daemon: &Path) -> &'a mut Command {
    cmd.env("OBSERVER_EBPF_TOOLCHAIN", toolchain)
        .env("OBSERVER_TEST_IMAGE", image)
        .env("OBSERVER_BIN", daemon)
        .env("PATH", crate::python_first(&std::env::var("PATH").unwrap_or_default()))
}

/// The failed tests of a `cargo test` run's output, by test binary: the
/// binary comes from cargo's `Running … (target/…/deps/NAME-HASH)` line,
/// each failure from the harness's `test NAME ... FAILED`.
fn failures(output: &str) -> BTreeMap<PathBuf, Vec<String>> {
    let mut out: BTreeMap<PathBuf, Vec<String>> = BTreeMap::new();
    let mut binary: Option<PathBuf> = None;
    for line in output.lines() {
        let l = line.trim();
        if let Some(rest) = l.strip_prefix("Running ") {
            binary = rest.rsplit_once('(').and_then(|(_, b)| b.strip_suffix(')')).map(PathBuf::from);
        } else if let Some(name) = l
            .strip_prefix("test ")
            .and_then(|t| t.split_once(" ... "))
            .and_then(|(name, result)| result.starts_with("FAILED").then_some(name))
        {
            if let Some(b) = &binary {
                out.entry(b.clone()).or_default().push(name.to_owned());
            }
        }
    }
    out
}

/// The package directory a test binary runs in (cargo runs each in its
/// package's root): the crate name before the hash tells.
fn package_dir(binary: &Path) -> PathBuf {
    let name = binary.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    let krate = name.rsplit_once('-').map_or(name, |(k, _)| k);
    workspace_root().join(match krate {
        "xtask" => "xtask",
        "observer_common" => "observer-common",
        _ => "observer",
    })
}

/// Run the host's suites (`args`: a name filter and harness options).
pub fn suites(toolchain: &str, image: &str, daemon: &Path, args: &[String], started: Instant) -> Result<()> {
    // The root suites are built only with their feature (`ROOT_TESTS`).
    // One test at a time: the scenarios measure timing and share the kernel.
    // The suites drive the release daemon, the binary that ships.
    let mut cmd = cargo();
    cmd.args([
        "test",
        "--workspace",
        "--all-targets",
        "--features",
        ROOT_TESTS,
        "--no-fail-fast",
        "--",
        "--test-threads=1",
    ])
    .args(args);
    let cmd = with_env(&mut cmd, toolchain, image, daemon);
    // cargo names the binaries on stderr, the harness the tests on stdout:
    // one pipe keeps them in order.
    let mut child = Command::new("sh")
        .args(["-c", "exec \"$@\" 2>&1", "sh"])
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .envs(cmd.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .current_dir(workspace_root())
        .stdout(Stdio::piped())
        .spawn()
        .context("starting cargo test")?;
    let mut output = String::new();
    for line in BufReader::new(child.stdout.take().context("cargo test's output")?).lines() {
        let line = line.context("reading cargo test's output")?;
        println!("{line}");
        output.push_str(&line);
        output.push('\n');
    }
    let st = child.wait()?;
    if st.success() {
        println!("test: host suite passed in {:.0}s", started.elapsed().as_secs_f64());
        return Ok(());
    }
    let failed = failures(&output);
    if failed.is_empty() {
        bail!("cargo test failed with {st} and named no failed test (a build error?): see above");
    }
    let mut still = Vec::new();
    let mut flaky = Vec::new();
    for (binary, tests) in &failed {
        let bin = workspace_root().join(binary);
        println!("test: running again, each on its own: {} {}", binary.display(), tests.join(" "));
        let mut again = Command::new(&bin);
        again.args(["--test-threads=1", "--exact"]).args(tests).current_dir(package_dir(binary));
        let ok = with_env(&mut again, toolchain, image, daemon)
            .status()
            .with_context(|| format!("running {} again", bin.display()))?
            .success();
        let names = tests.iter().map(|t| format!("{}::{t}", binary.file_name().unwrap_or_default().to_string_lossy()));
        if ok {
            flaky.extend(names);
        } else {
            still.extend(names);
        }
    }
    if !flaky.is_empty() {
        println!(
            "test: FLAKY on the host (failed, then passed when run again on its own; the first failure is above): {}",
            flaky.join(", ")
        );
    }
    if !still.is_empty() {
        bail!("host tests failed twice: {}", still.join(", "));
    }
    println!("test: host suite passed in {:.0}s (with a second run)", started.elapsed().as_secs_f64());
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::failures;

    #[test]
    fn failed_tests_are_told_by_their_binary() {
        let out = "     Running unittests src/lib.rs (target/debug/deps/observer-0a1b)\n\
                   test a ... ok\n\
                   \n     Running tests/probe.rs (target/debug/deps/probe-1fc4)\n\
                   test a_server_reset_at_idle_is_measured_as_rst ... FAILED\n\
                   test another ... ok <1.2s>\n\
                   test third ... FAILED <3.0s>\n\
                   ---- a_server_reset_at_idle_is_measured_as_rst stdout ----\n\
                   test result: FAILED. 1 passed; 2 failed\n";
        let f = failures(out);
        assert_eq!(f.len(), 1);
        assert_eq!(
            f[&PathBuf::from("target/debug/deps/probe-1fc4")],
            vec!["a_server_reset_at_idle_is_measured_as_rst".to_owned(), "third".to_owned()]
        );
    }
}

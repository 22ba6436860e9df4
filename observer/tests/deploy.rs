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
    ensure!(said.contains("SUCCESS: 9 rules found"), "{said}");
    let said = run(Command::new("promtool").args(["test", "rules", "observer-rules.test.yml"]).current_dir(&dir))?;
    ensure!(said.contains("SUCCESS"), "{said}");
    Ok(())
}

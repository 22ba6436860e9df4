//! `observer run` settings precedence, end to end through the binary:
//! flag > `OBSERVER_*` environment variable > `--config` file > default,
//! read back with `--print-config`. No root needed (nothing is loaded).

mod common;

use std::process::Command;

use anyhow::{ensure, Result};

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

fn effective(args: &[&str], env: &[(&str, &str)]) -> Result<String> {
    let mut cmd = Command::new(OBSERVER);
    cmd.arg("run").args(args).arg("--print-config");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output()?;
    ensure!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8(out.stdout)?)
}

#[test]
fn flag_over_env_over_file_over_default() -> Result<()> {
    let dir = tempfile::tempdir()?;
    let f = dir.path().join("observer.toml");
    std::fs::write(&f, "window = \"2h\"\nmin-idle = \"3s\"\nretention = \"7days\"\n")?;
    let f = f.to_str().unwrap_or_default();
    let out = effective(&["--config", f], &[])?;
    ensure!(out.contains("window = \"2h\"") && out.contains("min-idle = \"3s\""), "file: {out}");
    ensure!(out.contains("max-destinations = 1000"), "default: {out}");
    let out = effective(&["--config", f], &[("OBSERVER_WINDOW", "5m")])?;
    ensure!(out.contains("window = \"5m\""), "env over file: {out}");
    let out = effective(&["--config", f, "--window", "30m"], &[("OBSERVER_WINDOW", "5m")])?;
    ensure!(out.contains("window = \"30m\""), "flag over env: {out}");
    let out = effective(&[], &[("OBSERVER_CONFIG", f), ("OBSERVER_RETENTION", "1day")])?;
    ensure!(out.contains("retention = \"1day\"") && out.contains("min-idle = \"3s\""), "OBSERVER_CONFIG: {out}");
    Ok(())
}

/// Files observer writes name peers and processes: a report written with
/// `-o` is 0600 (as are the store and a `--record` file).
#[test]
fn a_report_file_is_private() -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir()?;
    let out = dir.path().join("report.html");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fin-nginx-2s.jsonl");
    let st = Command::new(OBSERVER)
        .args(["report", "--destination", "10.201.1.1:8080", "--recording", fixture, "-o"])
        .arg(&out)
        .output()?;
    ensure!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let mode = std::fs::metadata(&out)?.permissions().mode() & 0o777;
    ensure!(mode == 0o600, "report written with mode {mode:o}");
    Ok(())
}

/// `report` reads: on a directory with no store it says where the store
/// is, and leaves the directory as it was (once it made it 0700 and
/// created a database in it).
#[test]
fn report_on_a_directory_without_a_store_changes_nothing() -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir()?;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755))?;
    let out = Command::new(OBSERVER)
        .args(["report", "--destination", "10.0.0.2:443", "--data-dir"])
        .arg(dir.path())
        .output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    ensure!(!out.status.success() && err.contains("no evidence store at"), "{err}");
    ensure!(std::fs::metadata(dir.path())?.permissions().mode() & 0o777 == 0o755, "mode changed");
    ensure!(std::fs::read_dir(dir.path())?.count() == 0, "something was created");
    Ok(())
}

/// The suites' one way to read `/metrics`: by name and labels, one series
/// or the sum, a near name or a missing label never matching.
#[test]
fn the_metric_matcher_reads_a_series_by_name_and_labels() {
    let body = "# HELP observer_reuses_total Reuses.\n# TYPE observer_reuses_total counter\n\
observer_reuses_total{destination=\"10.0.0.1:80\",role=\"client\",outcome=\"ok\"} 7\n\
observer_reuses_total{destination=\"10.0.0.1:80\",role=\"client\",outcome=\"eof\"} 2\n\
observer_reuses_total_x{destination=\"10.0.0.1:80\"} 100\n\
observer_events_awaiting_owner 0\n";
    let reuses = common::metric("observer_reuses_total");
    assert_eq!(reuses.clone().label("outcome", "ok").value(body), Some(7.0));
    assert_eq!(reuses.clone().label("outcome", "eof").label("role", "client").value(body), Some(2.0));
    assert_eq!(reuses.value(body), None, "two series match: no single value");
    assert!((reuses.sum(body) - 9.0).abs() < f64::EPSILON);
    assert_eq!(common::metric("observer_reuses_total").label("outcome", "reset").value(body), None);
    assert_eq!(common::metric("observer_events_awaiting_owner").value(body), Some(0.0));
    assert_eq!(common::metric("observer_events").value(body), None, "a prefix is not the name");
}

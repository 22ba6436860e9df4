//! The examples a reader meets are what this observer prints, so they
//! cannot go stale: the evidence reports in `docs/examples/` and the
//! README's table sample are made from the real recording
//! `tests/fixtures/fin-nginx-2s.jsonl` (no root needed). On a difference
//! the test says how to refresh them: `cargo xtask examples` runs it with
//! `OBSERVER_UPDATE_EXAMPLES=1`, which writes them instead.

use std::{path::PathBuf, process::Command};

use anyhow::{ensure, Context as _, Result};

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");
const FIXTURE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fin-nginx-2s.jsonl");
const DEST: &str = "10.201.1.1:8080";
/// The README's sample starts with this line, inside a fenced block.
const ANALYZE_LINE: &str = "$ observer analyze observer/tests/fixtures/fin-nginx-2s.jsonl";

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn observer(args: &[&str]) -> Result<String> {
    let out = Command::new(OBSERVER).args(args).output()?;
    ensure!(out.status.success(), "observer {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    Ok(String::from_utf8(out.stdout)?)
}

/// The report without its generation time (the one line that differs
/// every run).
fn timeless(report: &str) -> String {
    report
        .lines()
        .map(|l| match (l.find("Generated "), l.find(" by observer")) {
            (Some(a), Some(b)) if a < b => format!("{}Generated <time>{}", &l[..a], &l[b..]),
            _ => l.to_owned(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

fn update() -> bool {
    std::env::var_os("OBSERVER_UPDATE_EXAMPLES").is_some()
}

const STALE: &str = "is stale: run `cargo xtask examples` and commit the result";

#[test]
fn the_example_reports_are_what_observer_writes() -> Result<()> {
    for (format, file) in [("md", "report-fin-nginx-2s.md"), ("html", "report-fin-nginx-2s.html")] {
        let now = observer(&["report", "--destination", DEST, "--recording", FIXTURE, "--format", format])?;
        let path = root().join("docs/examples").join(file);
        if update() {
            std::fs::write(&path, &now)?;
            continue;
        }
        let kept = std::fs::read_to_string(&path).with_context(|| format!("reading {}", path.display()))?;
        ensure!(timeless(&kept) == timeless(&now), "{} {STALE}", path.display());
    }
    Ok(())
}

/// The README's sample table is `observer analyze` of the recording.
#[test]
fn the_readme_sample_is_what_observer_prints() -> Result<()> {
    let path = root().join("README.md");
    let readme = std::fs::read_to_string(&path)?;
    let start = readme.find(ANALYZE_LINE).context("the README has no `observer analyze` sample")?;
    let body_start = start + ANALYZE_LINE.len() + 1;
    let body_len = readme[body_start..].find("```").context("the sample's block does not end")?;
    let kept = &readme[body_start..body_start + body_len];
    let now = observer(&["analyze", FIXTURE])?;
    if update() {
        let fresh = format!("{}{now}{}", &readme[..body_start], &readme[body_start + body_len..]);
        std::fs::write(&path, fresh)?;
        return Ok(());
    }
    ensure!(kept == now, "the README's sample {STALE}:\n{now}");
    Ok(())
}

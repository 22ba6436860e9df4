//! The HTML report renders in headless Chromium without console errors
//! (no root needed; Chromium from Debian, installed by `cargo xtask setup`).

use std::process::Command;

#[test]
fn html_report_renders_in_headless_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    let fixture = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/fin-nginx-2s.jsonl");
    let out = Command::new(env!("CARGO_BIN_EXE_observer"))
        .args(["report", "--destination", "10.201.1.1:8080", "--recording", fixture, "-o"])
        .arg(&html)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let png = dir.path().join("report.png");
    let profile = dir.path().join("profile");
    let out = Command::new("chromium")
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--enable-logging=stderr",
            "--v=0",
            "--window-size=1200,2600",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("--screenshot={}", png.display()))
        .arg(format!("file://{}", html.display()))
        .output()
        .expect("chromium (Debian package `chromium`) must be installed: run `cargo xtask setup`");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "chromium failed: {stderr}");
    let console: Vec<&str> = stderr.lines().filter(|l| l.contains(":CONSOLE(") || l.contains("Uncaught")).collect();
    assert!(console.is_empty(), "console messages: {console:#?}");
    let size = std::fs::metadata(&png).expect("screenshot written").len();
    assert!(size > 20_000, "a {size}-byte screenshot is too small to hold the report");
    let bytes = std::fs::read(&png).unwrap();
    assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
    if let Ok(to) = std::env::var("OBSERVER_SAVE_SCREENSHOT") {
        std::fs::copy(&png, to).unwrap();
    }
}

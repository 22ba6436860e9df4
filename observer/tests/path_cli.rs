//! `observer path` as a command: exit codes and output on the example files
//! and on bad files (no root needed).

use std::process::Command;

const OBSERVER: &str = env!("CARGO_BIN_EXE_observer");

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(OBSERVER).args(args).output().expect("run observer");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn example(name: &str) -> String {
    format!("{}/../examples/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn default_chain_exits_1_with_three_violations() {
    let (code, out, _) = run(&["path", "check", &example("seeds-default-chain.toml")]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("3 violation(s)"), "{out}");
    let (code, json, _) = run(&["path", "check", &example("seeds-default-chain.toml"), "--format", "json"]);
    assert_eq!(code, 1);
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    let rules: Vec<&str> = v["violations"].as_array().unwrap().iter().map(|x| x["rule"].as_str().unwrap()).collect();
    assert_eq!(rules, ["idle_staircase", "deadline_staircase", "deadline_unlimited"]);
    assert_eq!(v["hops"][3]["deadline"], "none");
    assert_eq!(v["hops"][2]["idle_timeout"], 5.0);
}

#[test]
fn fixed_chain_exits_0() {
    let (code, out, _) = run(&["path", "check", &example("seeds-fixed-chain.toml")]);
    assert_eq!(code, 0, "{out}");
}

#[test]
fn settlement_exits_1_with_the_48_second_fix() {
    let (code, out, _) = run(&["path", "check", &example("settlement-partner.toml")]);
    assert_eq!(code, 1);
    assert!(out.contains("pool idle timeout at most 48 s"), "{out}");
}

#[test]
fn bad_files_exit_2_naming_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    for (body, expect) in [
        ("[[hop]]\nname = \"lb\"\nkind = \"f5\"\n", "line 3: field `kind`: unknown kind `f5`"),
        ("[[hop]]\nname = \"lb\"\nidle_timeout = \"soon\"\n", "line 3: field `idle_timeout`"),
        ("", "declares no hops"),
        ("[[hop]\n", "line 1"),
    ] {
        let f = dir.path().join("p.toml");
        std::fs::write(&f, body).unwrap();
        let (code, _, err) = run(&["path", "check", f.to_str().unwrap()]);
        assert_eq!(code, 2, "{body:?}: {err}");
        assert!(err.contains(expect), "{body:?}: expected `{expect}` in {err}");
    }
    let (code, _, err) = run(&["path", "check", "/nonexistent.toml"]);
    assert_eq!(code, 2);
    assert!(err.contains("/nonexistent.toml"), "{err}");
}

#[test]
fn defaults_prints_the_catalog() {
    let (code, out, _) = run(&["path", "defaults"]);
    assert_eq!(code, 0);
    assert!(out.contains("aws-nat-gateway") && out.contains("350 s"), "{out}");
    let (code, out, _) = run(&["path", "defaults", "hikaricp"]);
    assert_eq!(code, 0);
    assert!(out.contains("max_lifetime = 1800 s"), "{out}");
    let (code, _, err) = run(&["path", "defaults", "nope"]);
    assert_eq!(code, 2);
    assert!(err.contains("known kinds"), "{err}");
}

/// What a path names is read at most 1 MiB: `/dev/zero` is refused at
/// once, exit 2, instead of growing until memory runs out; so is a
/// `--config` of it.
#[test]
fn an_endless_file_is_refused_not_read() {
    let (code, _, err) = run(&["path", "check", "/dev/zero"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("/dev/zero") && err.contains("larger than 1048576 bytes"), "{err}");
    let (code, _, err) = run(&["run", "--config", "/dev/zero", "--print-config"]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("larger than 1048576 bytes"), "{err}");
    let (code, _, err) = run(&["analyze", "/dev/zero"]);
    assert_ne!(code, 0, "{err}");
    assert!(err.contains("longer than 65536 bytes"), "{err}");
}

use std::io::Write as _;

use clap::Parser as _;

use super::*;
use crate::cli::{Command, EventsFormat};

fn os(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

fn file(body: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(body.as_bytes()).unwrap();
    f
}

fn run_args(argv: Vec<OsString>) -> crate::cli::RunArgs {
    match Cli::try_parse_from(argv).unwrap().command {
        Command::Run(a) => *a,
        _ => panic!("run"),
    }
}

#[test]
fn the_file_fills_what_flags_leave_and_flags_win() {
    let f = file("min-idle = \"3s\"\nwindow = \"2h\"\nallowed_host = [\"a.example\", \"b.example\"]\nconnections = true\nevents = \"json\"\nmax-destinations = 50\n");
    let p = f.path().to_str().unwrap();
    let argv = expand(os(&["observer", "run", "--config", p, "--window", "30m"])).unwrap();
    let a = run_args(argv);
    assert_eq!(a.min_idle, std::time::Duration::from_secs(3), "from the file");
    assert_eq!(a.window, std::time::Duration::from_mins(30), "the flag wins over the file");
    assert_eq!(a.allowed_hosts, vec!["a.example".to_owned(), "b.example".to_owned()]);
    assert!(a.connections);
    assert_eq!(a.events, Some(EventsFormat::Json));
    assert_eq!(a.max_destinations, 50);
    assert_eq!(a.retention, std::time::Duration::from_hours(14 * 24), "the default where nothing says");
    // The effective settings read back as a configuration file.
    let again = file(&a.to_toml());
    let b = run_args(expand(os(&["observer", "run", "--config", again.path().to_str().unwrap()])).unwrap());
    assert_eq!(b.to_toml(), a.to_toml());
}

#[test]
fn bad_files_name_the_problem() {
    let f = file("min-idel = \"3s\"\n");
    let err = expand(os(&["observer", "run", "--config", f.path().to_str().unwrap()])).unwrap_err().to_string();
    assert!(err.contains("`min-idel`") && err.contains("min-idle"), "{err}");
    let f = file("connections = \"yes\"\n");
    let err = expand(os(&["observer", "run", "--config", f.path().to_str().unwrap()])).unwrap_err().to_string();
    assert!(err.contains("true or false"), "{err}");
    let f = file("window = [\n");
    let err = expand(os(&["observer", "run", "--config", f.path().to_str().unwrap()])).unwrap_err().to_string();
    assert!(err.contains("not valid TOML"), "{err}");
    let err = expand(os(&["observer", "run", "--config", "/nonexistent/observer.toml"])).unwrap_err().to_string();
    assert!(err.contains("/nonexistent/observer.toml"), "{err}");
    // A bad value is clap's to report, naming the flag.
    let f = file("min-idle = \"soon\"\n");
    let argv = expand(os(&["observer", "run", "--config", f.path().to_str().unwrap()])).unwrap();
    let err = Cli::try_parse_from(argv).unwrap_err().to_string();
    assert!(err.contains("--min-idle") && err.contains("write it like"), "{err}");
}

#[test]
fn other_subcommands_are_left_alone() {
    let argv = os(&["observer", "status", "--json"]);
    assert_eq!(expand(argv.clone()).unwrap(), argv);
}

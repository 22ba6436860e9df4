use super::*;

#[test]
fn run_defaults() {
    let cli = Cli::try_parse_from(["observer", "run"]).unwrap();
    let Command::Run(a) = cli.command else { panic!("run") };
    assert_eq!(a.metrics_addr, "127.0.0.1:9477");
    assert_eq!(a.window, Duration::from_hours(24));
    assert_eq!(a.events, None);
    assert_eq!(a.min_idle, Duration::from_secs(1));
    assert_eq!(a.ring_buffer, 4 << 20);
    // Nothing is sent to a collector unless an endpoint is set; the OTLP
    // defaults are the specification's.
    assert_eq!(a.otlp_endpoint, None);
    assert_eq!(a.otlp_protocol, crate::surfaces::otlp::Transport::HttpProtobuf);
    assert_eq!(a.otlp_interval, Duration::from_mins(1));
    assert_eq!(a.otlp_timeout, Duration::from_secs(10));
    assert!(!a.otlp_logs);
}

#[test]
fn otlp_flags_take_milliseconds_as_the_variables_do_and_refuse_bad_values() {
    let Command::Run(a) = Cli::try_parse_from([
        "observer",
        "run",
        "--otlp-interval",
        "1500",
        "--otlp-timeout",
        "2s",
        "--otlp-protocol",
        "grpc",
    ])
    .unwrap()
    .command
    else {
        panic!("run")
    };
    assert_eq!(a.otlp_interval, Duration::from_millis(1500));
    assert_eq!(a.otlp_timeout, Duration::from_secs(2));
    assert_eq!(a.otlp_protocol, crate::surfaces::otlp::Transport::Grpc);
    for bad in [["--otlp-protocol", "http/json"], ["--otlp-interval", "0"], ["--otlp-interval", "soon"]] {
        let e = Cli::try_parse_from([["observer", "run"].as_slice(), bad.as_slice()].concat()).unwrap_err().to_string();
        assert!(e.contains(bad[0]), "{e}");
    }
    let toml = Cli::try_parse_from(["observer", "run", "--otlp-headers", "authorization=Bearer s3cret"]).unwrap();
    let Command::Run(a) = toml.command else { panic!("run") };
    let printed = a.to_toml();
    assert!(!printed.contains("s3cret"), "headers carry credentials: {printed}");
    assert!(printed.contains("# otlp-headers is set"), "{printed}");
}

#[test]
fn events_flag_forms() {
    let Command::Run(a) = Cli::try_parse_from(["observer", "run", "--events"]).unwrap().command else { panic!("run") };
    assert_eq!(a.events, Some(EventsFormat::Text));
    let Command::Run(a) =
        Cli::try_parse_from(["observer", "run", "--events=json", "--ring-buffer", "4KiB"]).unwrap().command
    else {
        panic!("run")
    };
    assert_eq!(a.events, Some(EventsFormat::Json));
    assert_eq!(a.ring_buffer, 4096);
    let Command::Run(a) =
        Cli::try_parse_from(["observer", "run", "--events", "json", "--connections"]).unwrap().command
    else {
        panic!("run")
    };
    assert_eq!((a.events, a.connections), (Some(EventsFormat::Json), true), "the space form works too");
    let Command::Run(a) = Cli::try_parse_from(["observer", "run", "--events", "--connections"]).unwrap().command else {
        panic!("run")
    };
    assert_eq!(a.events, Some(EventsFormat::Text));
}

#[test]
fn bad_values_name_the_fix() {
    let err = Cli::try_parse_from(["observer", "run", "--min-idle", "soon"]).unwrap_err().to_string();
    assert!(err.contains("write it like"), "{err}");
    let err = Cli::try_parse_from(["observer", "run", "--ring-buffer", "lots"]).unwrap_err().to_string();
    assert!(err.contains("256KiB"), "{err}");
}

#[test]
fn one_output_flag_with_the_old_spellings() {
    let status = |args: &[&str]| match Cli::try_parse_from([&["observer", "status"], args].concat()) {
        Ok(Cli { command: Command::Status(s) }) => Ok(s.json()),
        Ok(other) => panic!("{other:?}"),
        Err(e) => Err(e.kind()),
    };
    assert_eq!(status(&[]), Ok(false));
    assert_eq!(status(&["-o", "json"]), Ok(true));
    assert_eq!(status(&["--output", "text"]), Ok(false));
    assert_eq!(status(&["--output=table"]), Ok(false));
    assert_eq!(status(&["--json"]), Ok(true));
    assert_eq!(status(&["--json", "-o", "text"]), Err(clap::error::ErrorKind::ArgumentConflict));
    assert_eq!(status(&["-o", "yaml"]), Err(clap::error::ErrorKind::InvalidValue));
    let analyze = Cli::try_parse_from(["observer", "analyze", "rec.jsonl", "-o", "json"]).unwrap();
    assert!(matches!(analyze.command, Command::Analyze(a) if a.json()));
    for (args, want) in [
        (&["--format", "table"][..], Output::Text),
        (&["--format=json"][..], Output::Json),
        (&["-o", "json"][..], Output::Json),
        (&[][..], Output::Text),
    ] {
        let cli = Cli::try_parse_from([&["observer", "path", "check", "p.toml"][..], args].concat()).unwrap();
        let Command::Path(PathCommand::Check(c)) = cli.command else { panic!() };
        assert_eq!(c.output, want, "{args:?}");
    }
    // The report's -o stays the file it writes.
    let cli = Cli::try_parse_from(["observer", "report", "--destination", "10.0.0.1:80", "-o", "r.html"]).unwrap();
    assert!(matches!(cli.command, Command::Report(r) if r.output == Some(PathBuf::from("r.html"))));
}

use super::*;

#[test]
fn run_defaults() {
    let cli = Cli::try_parse_from(["observer", "run"]).unwrap();
    let Command::Run(a) = cli.command else { panic!("run") };
    assert_eq!(a.metrics_addr, "127.0.0.1:9477");
    assert_eq!(a.window, Duration::from_hours(24));
    assert_eq!(a.events, None);
    assert_eq!(a.min_idle, Duration::from_secs(1));
    assert_eq!(a.ring_buffer, 1 << 20);
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

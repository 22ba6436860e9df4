use super::*;

const RECORDING: &str = r#"{"ts_unix_ns":1700000000000000000,"kind":"reuse","role":"client","pid":1,"comm":"curl","local":"10.0.0.1:40000","remote":"10.0.0.2:80","idle_seconds":1.5,"outcome":"ok","elapsed_seconds":0.001,"retransmits":0,"safe_to_retry":false,"how":null,"request_outstanding":false,"peer_closed_first":false,"preexisting":false,"sock_id":1}
{"ts_unix_ns":1700000002000000000,"kind":"peer_close_while_idle","role":"client","pid":1,"comm":"curl","local":"10.0.0.1:40000","remote":"10.0.0.2:80","idle_seconds":2.0,"how":"fin"}

{"ts_unix_ns":1700000003000000000,"kind":"reuse","role":"client","pid":1,"comm":"curl","local":"10.0.0.1:40000","remote":"10.0.0.2:80","idle_seconds":2.5,"outcome":"reset","elapsed_seconds":0.001,"retransmits":0,"safe_to_retry":true,"how":"rst"}
"#;

#[test]
fn analyze_a_recording() {
    let events = read_recording(RECORDING.as_bytes()).unwrap();
    assert_eq!(events.len(), 3);
    let rows = analyze(&events, Config::default());
    assert_eq!(rows.len(), 1);
    let r = &rows[0];
    assert_eq!(r.id.destination, "10.0.0.2:80");
    assert_eq!((r.path.lower_seconds, r.path.upper_seconds), (1.5, Some(2.0)));
    assert_eq!(r.judgement.verdict.as_str(), "mismatch");
    assert_eq!(r.failure_mode.as_str(), "fin");
    let table = render_table(&rows);
    assert!(table.contains("10.0.0.2:80"), "{table}");
    assert!(table.contains("[1.500, 2.000s]"), "{table}");
    assert!(table.contains("mismatch"), "{table}");
    assert!(table.contains("1.200s"), "0.8 x the 1.5 s proven to survive: {table}");
}

#[test]
fn malformed_recording_names_the_line() {
    let bad = format!("{}\n{{\"kind\": 3}}\n", RECORDING.lines().next().unwrap());
    let err = read_recording(bad.as_bytes()).unwrap_err().to_string();
    assert!(err.starts_with("line 2:"), "{err}");
    let err = read_recording("not json\n".as_bytes()).unwrap_err().to_string();
    assert!(err.contains("line 1") && err.contains("observer run --record"), "{err}");
}

#[test]
fn status_json_has_the_documented_fields() {
    let rows = analyze(&read_recording(RECORDING.as_bytes()).unwrap(), Config::default());
    let v = serde_json::to_value(&rows).unwrap();
    let obj = v[0].as_object().unwrap();
    for f in [
        "destination",
        "role",
        "failure_mode",
        "path_idle_timeout_seconds",
        "path_idle_timeout_lower_seconds",
        "path_idle_timeout_upper_seconds",
        "pool_idle_timeout_seconds",
        "verdict",
        "recommended_pool_idle_timeout_seconds",
        "reuses",
        "failures",
        "at_risk_idle_sockets",
        "netns",
        "owners",
    ] {
        assert!(obj.contains_key(f), "missing {f}");
    }
    assert!(obj["path_idle_timeout_seconds"].is_null());
    assert_eq!(obj["recommended_pool_idle_timeout_seconds"].as_f64(), Some(1.2));
}

#[test]
fn two_namespaces_are_told_apart_in_the_table() {
    let mut events = read_recording(RECORDING.as_bytes()).unwrap();
    let mut pod = events.clone();
    for e in &mut pod {
        e.netns = 4_026_532_777;
    }
    for e in &mut events {
        e.netns = 7;
    }
    events.extend(pod);
    let rows = analyze(&events, Config { host_netns: 7, ..Config::default() });
    assert_eq!(rows.len(), 2);
    let table = render_table(&rows);
    assert!(table.contains("10.0.0.2:80 netns:4026532777"), "{table}");
    assert_eq!(table.matches("10.0.0.2:80").count(), table.matches("10.0.0.2:80 netns:").count() * 2, "{table}");
}

/// Names ride in a recording as `server_name` events; the table's first
/// column shows the most used (and how many others), the notes carry it.
#[test]
fn the_name_column_comes_first_and_notes_carry_the_name() {
    let name = |n: &str| {
        format!(
            r#"{{"ts_unix_ns":1700000000000000000,"kind":"server_name","role":"client","pid":1,"comm":"curl","local":"10.0.0.1:40000","remote":"10.0.0.2:80","idle_seconds":0.0,"server_name":"{n}"}}"#
        )
    };
    let rec = format!(
        "{}\n{}\n{}\n{RECORDING}",
        name("api.partner.example"),
        name("api.partner.example"),
        name("alt.partner.example")
    );
    let rows = analyze(&read_recording(rec.as_bytes()).unwrap(), Config::default());
    let out = render_table(&rows);
    let header = out.lines().next().unwrap();
    assert!(header.starts_with("NAME "), "{header}");
    assert!(out.lines().nth(1).unwrap().starts_with("api.partner.example +1 "), "{out}");
    assert!(out.contains("api.partner.example 10.0.0.2:80 (client): "), "{out}");
    let v = serde_json::to_value(&rows).unwrap();
    assert_eq!(v[0]["server_names"][0]["name"], "api.partner.example");
    assert_eq!(v[0]["server_names"][0]["connections"], 2);
    let plain = render_table(&analyze(&read_recording(RECORDING.as_bytes()).unwrap(), Config::default()));
    assert!(plain.lines().nth(1).unwrap().starts_with("- "), "{plain}");
}

#[test]
fn doomed_owners_reach_the_terminal_escaped() {
    use crate::diagnosis::table::ProcessOwner;
    let mut rows = analyze(&read_recording(RECORDING.as_bytes()).unwrap(), Config::default());
    rows[0].sockets.doomed_idle_sockets = 1;
    rows[0].sockets.doomed_owners = vec![ProcessOwner { process: "evil\u{1b}[2J".to_owned(), owner: None }];
    let out = render_table(&rows);
    assert!(!out.contains('\u{1b}'), "{out:?}");
    assert!(out.contains("held by evil\\u{1b}[2J"), "{out}");
}

#[test]
fn a_recording_is_read_bounded() {
    use std::io::Read as _;
    // /dev/zero as a recording: one endless line, refused at 64 KiB.
    let Err(e) = read_recording(std::io::repeat(0).take(1 << 30)) else { panic!("zeros are no recording") };
    assert!(matches!(e, RecordingError::LongLine { line: 1 }), "{e}");
    assert!(e.to_string().contains("longer than 65536 bytes"), "{e}");
    // More events than a read holds: the error says how to cut it.
    assert_eq!(read_events(RECORDING.as_bytes(), 3).unwrap().len(), 3);
    let Err(e) = read_events(RECORDING.as_bytes(), 2) else { panic!("3 events over a cap of 2") };
    assert!(matches!(e, RecordingError::TooLarge { max: 2 }) && e.to_string().contains("cut it"), "{e}");
}

use super::*;
use crate::surfaces::status::read_recording;

/// A recording of the FIN end-to-end scenario (nginx `keepalive_timeout 2s`,
/// 20 reuses at gaps spread over 1-3 s), made by `cargo xtask test` with
/// `OBSERVER_SAVE_RECORDING`.
const FIN_RECORDING: &str = include_str!("../../../tests/fixtures/fin-nginx-2s.jsonl");
const DEST: &str = "10.201.1.1:8080";

fn fin_report() -> Report {
    let events = read_recording(FIN_RECORDING.as_bytes()).unwrap();
    build(&input_from_recording(events, DEST.parse().unwrap(), 86_400 * 1_000_000_000)).unwrap()
}

#[test]
fn summary_numbers_from_the_recording() {
    let r = fin_report();
    assert_eq!(r.destination, DEST);
    assert_eq!(r.role, "client");
    let s = &r.summary;
    assert_eq!(s.failure_mode, FailureMode::Fin);
    let p = s.path.idle_timeout_seconds.expect("point from peer closes");
    assert!((p - 2.0).abs() < 0.01, "point {p}");
    assert!(s.path.lower_seconds < 2.0 && s.path.upper_seconds.is_some_and(|u| u > 1.98));
    assert_eq!((s.reuses, s.failures), (20, 10));
    assert!(s.peer_idle_closes >= 10, "{}", s.peer_idle_closes);
    assert!(
        s.failure_mode_text.starts_with("the hop closes idle connections with FIN after about 2"),
        "{}",
        s.failure_mode_text
    );
    assert!(s.first_failure_unix_ns <= s.last_failure_unix_ns);
    assert_eq!(r.our_side.judgement.verdict, Verdict::Mismatch);
    assert_eq!(r.our_side.judgement.recommended_pool_idle_timeout_seconds, Some(1.6));
    assert_eq!(r.our_side.judgement.recommended_max_lifetime_seconds, Some(300.0));
    assert!(r.our_side.judgement.safe_retry_rule);
    assert_eq!(r.our_side.processes, vec!["python3".to_owned()]);
}

#[test]
fn plots_show_the_step_at_the_timeout() {
    let r = fin_report();
    let below: u64 = r.failure_probability.iter().filter(|b| b.idle_to_seconds <= 1.9).map(|b| b.failures).sum();
    let above: Vec<&ProbabilityBin> =
        r.failure_probability.iter().filter(|b| b.idle_from_seconds >= 2.1 && b.reuses > 0).collect();
    assert_eq!(below, 0, "no failure below the timeout");
    assert!(!above.is_empty() && above.iter().all(|b| b.probability == Some(1.0)), "every reuse above it fails");
    assert_eq!(r.timeline.len(), TIMELINE_BINS);
    assert_eq!(r.timeline.iter().map(|b| b.failures).sum::<u64>(), 10);
    assert!(r.timeline.iter().map(|b| b.new_connections).sum::<u64>() >= 4, "the clients' connections count as volume");
}

#[test]
fn samples_and_questions() {
    let r = fin_report();
    assert_eq!(r.samples.total_failures, 10);
    assert_eq!(r.samples.shown, 10);
    assert!(r.samples.method.contains("all 10"));
    let x = &r.samples.rows[0];
    assert!(x.time_utc.ends_with('Z') && x.remote == DEST && x.process == "python3");
    assert!(x.idle_seconds > 2.0 && x.safe_to_retry);
    let topics: Vec<&str> = r.questions.iter().map(|q| q.topic.as_str()).collect();
    assert_eq!(
        topics,
        ["idle timeout", "request timeout", "maximum body size", "TLS versions", "source address ranges"]
    );
    assert!(r.questions[0].what_we_measured.contains("FIN after about 2"), "{}", r.questions[0].what_we_measured);
}

#[test]
fn html_is_self_contained_with_two_svg_plots() {
    let h = html(&fin_report());
    assert_eq!(h.matches("<svg").count(), 2);
    for section in ["id=\"summary\"", "id=\"our-side\"", "id=\"plots\"", "id=\"samples\"", "id=\"questions\""] {
        assert!(h.contains(section), "{section}");
    }
    assert!(!h.contains("<script") && !h.contains("src=") && !h.contains("href="), "no scripts, no external assets");
    assert!(h.contains("Failure probability against idle age at reuse") && h.contains("path timeout 2"));
}

#[test]
fn markdown_has_the_same_content_with_tables() {
    let m = markdown(&fin_report());
    for heading in [
        "## Summary",
        "## Our side",
        "### Failure probability against idle age at reuse",
        "### Failures over time beside request volume",
        "## Sample failures",
        "## Questions for the partner",
    ] {
        assert!(m.contains(heading), "{heading}");
    }
    assert!(m.contains("| 100% |") || m.contains("| 100%"), "probability table: {m}");
    assert!(!m.contains("<svg"));
}

#[test]
fn json_has_the_documented_fields() {
    let v = serde_json::to_value(fin_report()).unwrap();
    let keys =
        |o: &serde_json::Value| o.as_object().unwrap().keys().cloned().collect::<std::collections::BTreeSet<_>>();
    let want = |k: &[&str]| k.iter().map(|s| (*s).to_owned()).collect::<std::collections::BTreeSet<_>>();
    // The top level, exactly: `probe` and `probe_used` are written from
    // `summary.path`, which holds them.
    assert_eq!(
        keys(&v),
        want(&[
            "destination",
            "headline",
            "server_names",
            "role",
            "netns",
            "generated_unix_ns",
            "window_start_unix_ns",
            "window_end_unix_ns",
            "summary",
            "partner_card",
            "our_side",
            "failure_probability",
            "timeline",
            "samples",
            "questions",
            "changes",
            "probe",
            "probe_used",
            "findings",
        ])
    );
    // `summary` and `our_side` hold the row's path estimate and judgement
    // whole and publish exactly these keys: none of the row's other fields
    // (`path_outliers`, `evidence`, the server's recommendation) leaks in,
    // none is renamed.
    assert_eq!(
        keys(&v["summary"]),
        want(&[
            "path_idle_timeout_seconds",
            "path_idle_timeout_lower_seconds",
            "path_idle_timeout_upper_seconds",
            "lower_evidence",
            "upper_evidence",
            "point_evidence",
            "failure_mode",
            "failure_mode_text",
            "first_failure_unix_ns",
            "last_failure_unix_ns",
            "reuses",
            "failures",
            "failures_before_send",
            "peer_idle_closes",
            "discarded_dead",
            "reset_from",
            "reset_hops_closer",
            "reset_sources",
            "reset_text",
        ])
    );
    assert_eq!(
        keys(&v["our_side"]),
        want(&[
            "pool_idle_timeout_seconds",
            "pool_max_reuse_idle_seconds",
            "processes",
            "owners",
            "verdict",
            "recommended_pool_idle_timeout_seconds",
            "recommended_max_lifetime_seconds",
            "safe_retry_rule",
            "recommendation",
            "fix_settings",
            "protocols",
        ])
    );
    for f in
        ["time_utc", "local", "remote", "process", "pid", "idle_seconds", "outcome", "retransmits", "safe_to_retry"]
    {
        assert!(v["samples"]["rows"][0].get(f).is_some(), "missing samples.rows[].{f}");
    }
    for f in ["idle_from_seconds", "idle_to_seconds", "reuses", "failures", "probability"] {
        assert!(v["failure_probability"][0].get(f).is_some(), "missing failure_probability[].{f}");
    }
}

/// The projections write the row's values: `summary`'s path keys and
/// `our_side`'s verdict are the groups' own.
#[test]
fn the_published_keys_carry_the_groups_values() {
    let r = fin_report();
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["our_side"]["verdict"], "mismatch");
    assert_eq!(v["our_side"]["recommended_pool_idle_timeout_seconds"], 1.6);
    assert_eq!(v["summary"]["lower_evidence"], r.summary.path.lower_evidence);
    assert_eq!(v["summary"]["path_idle_timeout_lower_seconds"], r.summary.path.lower_seconds);
}

#[test]
fn no_evidence_is_a_clear_error() {
    let events = read_recording(FIN_RECORDING.as_bytes()).unwrap();
    let e = build(&input_from_recording(events, "10.9.9.9:1".parse().unwrap(), 1)).unwrap_err();
    assert!(e.to_string().contains("no evidence for 10.9.9.9:1"), "{e}");
}

#[test]
fn markdown_cells_escape_process_names() {
    let mut r = fin_report();
    r.our_side.processes = vec!["pipe|name".into(), "bell\u{7}".into()];
    r.our_side.owners.clear();
    if let Some(s) = r.samples.rows.first_mut() {
        s.process = "x|y".into();
    }
    let md = markdown(&r);
    assert!(md.contains("pipe\\|name") && !md.contains("pipe|name"), "{md}");
    assert!(!md.contains('\u{7}'), "control characters are escaped");
    if !r.samples.rows.is_empty() {
        assert!(md.contains("x\\|y"), "{md}");
    }
}

#[test]
fn processes_are_named_with_their_owners() {
    use crate::diagnosis::table::ProcessOwner;
    let owner = |c: Option<&str>, p: Option<&str>, u: Option<&str>| ProcessOwner {
        process: "api".into(),
        owner: Some(crate::kernel::owner::Owner {
            cgroup: "/x".into(),
            container: c.map(str::to_owned),
            runtime: None,
            pod: p.map(str::to_owned),
            unit: u.map(str::to_owned),
        }),
    };
    let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    assert_eq!(owner(Some(id), Some("1f2e"), None).label(), "api (container 0123456789ab, pod 1f2e)");
    assert_eq!(owner(None, None, Some("api.service")).label(), "api (api.service)");
    assert_eq!(owner(Some(id), None, Some("docker.scope")).label(), "api (container 0123456789ab)");
    assert_eq!(owner(None, None, None).label(), "api");
}

/// The recording without its first-bytes events: no name, no protocol.
fn unnamed() -> Vec<SockEvent> {
    let mut events = read_recording(FIN_RECORDING.as_bytes()).unwrap();
    events.retain(|e| e.kind() != EventKind::ServerName);
    events
}

/// The name clients used (the recorded clients' `Host` header) heads the
/// report: `name (address)`, in JSON, Markdown and HTML alike; without
/// one, the address alone.
#[test]
fn a_name_heads_the_report() {
    let r = fin_report();
    assert_eq!(r.headline, format!("api.partner.example ({DEST})"));
    assert_eq!(r.server_names[0].name, "api.partner.example");
    assert!(markdown(&r).starts_with(&format!("# Idle timeout evidence for `api.partner.example ({DEST})`")));
    assert!(html(&r).contains(&format!("<h1>Idle timeout evidence for <code>api.partner.example ({DEST})</code></h1>")));
    let plain = build(&input_from_recording(unnamed(), DEST.parse().unwrap(), 86_400 * 1_000_000_000)).unwrap();
    assert_eq!(plain.headline, DEST);
    assert!(plain.server_names.is_empty());
}

/// The protocol the first bytes showed is on the report's side of the
/// client, in JSON, Markdown and HTML; without one, the report says it
/// could not be told rather than leaving it out.
#[test]
fn the_protocol_is_on_our_side() {
    let recorded = fin_report();
    assert_eq!(serde_json::to_value(&recorded).unwrap()["our_side"]["protocols"], serde_json::json!(["http1"]));
    let mut events = unnamed();
    let plain = build(&input_from_recording(events.clone(), DEST.parse().unwrap(), 86_400 * 1_000_000_000)).unwrap();
    assert!(plain.our_side.protocols.is_empty());
    assert!(markdown(&plain).contains("| Protocol | not told by the first bytes"));
    let mut hello = events.iter().find(|e| e.remote.to_string() == DEST).unwrap().clone();
    hello.body = crate::kernel::event::Body::ServerName(crate::kernel::event::FirstBytes {
        server_name: None,
        protocol: Some(crate::kernel::first_bytes::Protocol::H2),
        tls_version: None,
    });
    events.insert(0, hello);
    let r = build(&input_from_recording(events, DEST.parse().unwrap(), 86_400 * 1_000_000_000)).unwrap();
    assert_eq!(serde_json::to_value(&r).unwrap()["our_side"]["protocols"], serde_json::json!(["h2"]));
    assert!(markdown(&r).contains("| Protocol | h2 |"));
    assert!(html(&r).contains("<tr><th>Protocol</th><td>h2</td></tr>"));
}

fn probe_of(dest: &str, ts_unix_ns: u64, lower: f64, upper: f64) -> ProbeEvidence {
    ProbeEvidence {
        ts_unix_ns,
        id: crate::diagnosis::key::RowId {
            destination: dest.to_owned(),
            role: Role::Client,
            netns: crate::diagnosis::key::Netns::HOST,
        },
        target: "partner.example:8080".to_owned(),
        first_exchange: "http".to_owned(),
        how: crate::diagnosis::table::FailureMode::Fin,
        idle_timeout_seconds: Some(lower),
        lower_seconds: lower,
        upper_seconds: Some(upper),
        settled: true,
        connections: 8,
        elapsed_seconds: 7.5,
        interrupted: false,
    }
}

#[test]
fn probe_evidence_is_shown_labelled_beside_the_passive_evidence() {
    let events = read_recording(FIN_RECORDING.as_bytes()).unwrap();
    let mut input = input_from_recording(events, DEST.parse().unwrap(), 86_400 * 1_000_000_000);
    // nginx's 2 s FIN, as a probe measured it after the recording.
    let mut probe = probe_of(DEST, input.until_ns, 2.0, 2.001);
    // The recorded clients ran in a network namespace of their own.
    probe.id.netns = fin_report().netns;
    input.probes = vec![probe];
    let r = build(&input).unwrap();
    let p = r.probe().expect("the probe is in the report");
    assert_eq!(p.how, crate::diagnosis::table::FailureMode::Fin);
    let line = r.findings.iter().find(|(k, _)| k == "Measured by observer probe").expect("a labelled line");
    assert!(
        line.1.starts_with("FIN at 2.000 s (partner.example:8080, first exchange http, 8 connections"),
        "{}",
        line.1
    );
    for text in [markdown(&r), html(&r)] {
        assert!(text.contains("Measured by observer probe") && text.contains("FIN at 2.000 s"), "{text}");
    }
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["probe"]["how"], "fin");
    assert!(v["probe_used"].is_boolean());
    // The passive evidence is untouched: the same reuses and failures.
    let plain = fin_report();
    assert_eq!((r.summary.reuses, r.summary.failures), (plain.summary.reuses, plain.summary.failures));
    assert!(plain.probe().is_none() && !plain.findings.iter().any(|(k, _)| k == "Measured by observer probe"));
}

#[test]
fn a_destination_only_a_probe_measured_has_a_report() {
    let events = read_recording(FIN_RECORDING.as_bytes()).unwrap();
    let until = events.last().unwrap().ts_unix_ns;
    let input = Input {
        destination: "10.9.9.9:443".to_owned(),
        since_ns: until - 3_600_000_000_000,
        until_ns: until,
        events: Vec::new(),
        volume: Vec::new(),
        changes: Vec::new(),
        probes: vec![probe_of("10.9.9.9:443", until - 1_000_000_000, 59.9, 60.1)],
        select: Select::default(),
        host_netns: 0,
    };
    let r = build(&input).unwrap();
    assert!(r.summary.path.probe_used);
    assert_eq!(r.summary.reuses, 0);
    assert!((r.summary.path.lower_seconds - 59.9).abs() < 1e-9);
    assert_eq!(r.our_side.judgement.recommended_pool_idle_timeout_seconds, Some(47.92));
    assert!(
        r.our_side.judgement.recommendation.contains("measured by observer probe"),
        "{}",
        r.our_side.judgement.recommendation
    );
}

/// One report model: every title, fact, table cell, paragraph and list
/// item of the document is in the Markdown and in the HTML alike.
#[test]
fn markdown_and_html_say_the_same_things() {
    use document::{document, Block};
    let report = fin_report();
    let (md, page) = (markdown(&report), html(&report));
    let doc = document(&report);
    let mut texts: Vec<String> = vec![doc.headline.clone()];
    for s in &doc.sections {
        texts.push(s.title.to_owned());
        for b in &s.blocks {
            match b {
                Block::Lead(t) | Block::Para(t) => texts.push(t.clone()),
                Block::Facts(f) => texts.extend(f.iter().flat_map(|f| [f.name.clone(), f.value.clone()])),
                Block::Table(t) => texts.extend(t.rows.iter().flatten().map(|c| c.text.clone())),
                Block::Plot { caption, .. } => texts.push((*caption).to_owned()),
                Block::List(items) => texts.extend(items.iter().cloned()),
            }
        }
    }
    assert!(texts.len() > 100, "{} texts", texts.len());
    for t in texts.iter().filter(|t| !t.is_empty()) {
        assert!(md.contains(t.as_str()), "Markdown lacks {t:?}");
        assert!(page.contains(&esc(t)), "HTML lacks {t:?}");
    }
}

/// The card of the FIN recording: nginx at 2 s over plain HTTP, reached
/// at one address from one of ours; no reset, no TLS, no deadline seen.
#[test]
fn the_partner_card_holds_only_what_was_measured() {
    let r = fin_report();
    let c = r.partner_card.as_ref().expect("a client report has the card");
    assert_eq!(c.name.as_deref(), Some("api.partner.example"));
    let p = c.idle_timeout_seconds.expect("the point");
    assert!((p - 2.0).abs() < 0.01, "{p}");
    assert_eq!(c.idle_close, Some(FailureMode::Fin));
    assert_eq!((c.reset_from, c.reset_hops_closer, c.request_deadline_seconds), (None, None, None));
    assert!(c.tls_versions.is_empty(), "not measured, never guessed");
    assert_eq!(c.their_addresses, vec!["10.201.1.1".to_owned()]);
    assert_eq!(c.our_addresses, vec!["10.201.1.2".to_owned()]);
    assert!(c.ask.iter().any(|q| q.starts_with("Maximum request and response body size")), "{:?}", c.ask);
    assert!(c.ask.iter().any(|q| q.starts_with("TLS versions")), "{:?}", c.ask);
    let v = serde_json::to_value(&r).unwrap();
    for f in [
        "name",
        "idle_timeout_seconds",
        "idle_close",
        "reset_from",
        "request_deadline_seconds",
        "tls_versions",
        "their_addresses",
        "our_addresses",
        "ask",
    ] {
        assert!(v["partner_card"].get(f).is_some(), "missing partner_card.{f}");
    }
    assert_eq!(v["partner_card"]["idle_close"], "fin");
    let md = markdown(&r);
    assert!(md.contains("## Partner card") && md.contains("| How an idle connection ends | fin |"), "{md}");
    assert!(html(&r).contains("Partner card"));
}

/// A TLS connection's second-flight record: the card lists the version
/// negotiated and no longer asks for it.
#[test]
fn the_card_lists_the_tls_version_negotiated() {
    use crate::kernel::{event::FirstBytes, first_bytes::TlsVersion};
    let mut events = read_recording(FIN_RECORDING.as_bytes()).unwrap();
    let mut flight = events.iter().find(|e| e.remote.to_string() == DEST).unwrap().clone();
    flight.body = crate::kernel::event::Body::ServerName(FirstBytes {
        server_name: None,
        protocol: None,
        tls_version: TlsVersion::of_wire(4),
    });
    assert_eq!(serde_json::to_value(&flight).unwrap()["tls_version"], "TLSv1.3");
    events.insert(0, flight);
    let r = build(&input_from_recording(events, DEST.parse().unwrap(), 86_400 * 1_000_000_000)).unwrap();
    let c = r.partner_card.as_ref().unwrap();
    assert_eq!(c.tls_versions, vec!["TLSv1.3".to_owned()]);
    assert!(c.ask[0].starts_with("Cipher suites you accept"), "{:?}", c.ask);
    assert!(markdown(&r).contains("| TLS versions | TLSv1.3 |"));
}

/// One name reached at two addresses: the card of either lists both, its
/// own first; another name's address is not listed.
#[test]
fn the_card_lists_every_address_of_the_name() {
    use crate::kernel::event::FirstBytes;
    let mut r = fin_report();
    let named = |remote: &str, name: &str| {
        let mut e = SockEvent::new(
            1,
            crate::kernel::event::EventKind::ServerName,
            crate::kernel::event::Role::Client,
            "10.201.1.2:40000".parse().unwrap(),
            remote.parse().unwrap(),
            0.0,
        );
        e.body = crate::kernel::event::Body::ServerName(FirstBytes {
            server_name: Some(name.to_owned()),
            protocol: None,
            tls_version: None,
        });
        e
    };
    let others = [
        named("10.201.1.9:443", "api.partner.example"),
        named("10.201.1.3:8443", "api.partner.example"),
        named("10.201.1.1:8080", "api.partner.example"),
        named("10.201.1.7:443", "other.example"),
    ];
    add_name_addresses(&mut r, &others);
    let c = r.partner_card.as_ref().unwrap();
    assert_eq!(c.their_addresses, vec!["10.201.1.1", "10.201.1.3", "10.201.1.9"]);
}

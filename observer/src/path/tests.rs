use super::*;
use crate::diagnosis::aggregate::DestinationRow;

const DEFAULT_CHAIN: &str = include_str!("../../../examples/seeds-default-chain.toml");
const FIXED_CHAIN: &str = include_str!("../../../examples/seeds-fixed-chain.toml");
const SETTLEMENT: &str = include_str!("../../../examples/settlement-partner.toml");

fn rules(r: &Report) -> Vec<(&str, &str)> {
    r.violations.iter().map(|v| (v.rule, v.hop.as_str())).collect()
}

#[test]
fn seeds_default_chain_breaks_both_staircases_exactly() {
    let r = check(&parse(DEFAULT_CHAIN).unwrap());
    assert_eq!(
        rules(&r),
        vec![("idle_staircase", "Node.js"), ("deadline_staircase", "Node.js"), ("deadline_unlimited", "PostgreSQL")],
        "{}",
        render(&r)
    );
    let text = render(&r);
    assert!(text.contains("Node.js closes idle connections after 5 s, but nginx keeps them idle up to 60 s"), "{text}");
    assert!(text.contains("Node.js waits up to 300 s, but load balancer gives up after 60 s"), "{text}");
    assert!(text.contains("PostgreSQL waits without limit"), "{text}");
}

#[test]
fn seeds_fixed_chain_is_clean() {
    let r = check(&parse(FIXED_CHAIN).unwrap());
    assert!(r.violations.is_empty(), "{}", render(&r));
    assert!(render(&r).contains("both staircases hold"));
}

#[test]
fn settlement_story_gets_the_48_second_fix() {
    let r = check(&parse(SETTLEMENT).unwrap());
    let margin = r.violations.iter().find(|v| v.rule == "client_pool_margin").expect("margin violation");
    assert!(margin.fix.contains("pool idle timeout at most 48 s"), "{}", margin.fix);
    assert!(margin.message.contains("300 s"), "{}", margin.message);
}

#[test]
fn bad_files_name_line_and_field() {
    let e = parse("[[hop]]\nname = \"lb\"\nkind = \"f5-bigip\"\n").unwrap_err();
    assert!(matches!(e, PathError::Field { line: 3, field: "kind", .. }), "{e}");
    assert!(e.to_string().contains("aws-alb"), "lists the known kinds: {e}");
    let e = parse("[[hop]]\nname = \"lb\"\n\nidle_timeout = \"sixty\"\n").unwrap_err();
    assert!(matches!(e, PathError::Field { line: 4, field: "idle_timeout", .. }), "{e}");
    assert!(e.to_string().contains("\"60s\""), "{e}");
    assert_eq!(parse("# nothing\n").unwrap_err(), PathError::NoHops);
    let e = parse("[[hop]]\nname = \"lb\"\nidle = \"60s\"\n").unwrap_err().to_string();
    assert!(e.contains("line 3") && e.contains("idle"), "{e}");
    let e = parse("[[hop]]\nkind = \"nginx\"\n").unwrap_err().to_string();
    assert!(e.contains("name"), "{e}");
    let e = parse("[[hop]]\nname = \"x\"\naddress = \"nowhere\"\n").unwrap_err();
    assert!(matches!(e, PathError::Field { line: 3, field: "address", .. }), "{e}");
}

#[test]
fn limits_parse_and_order() {
    assert_eq!(Limit::parse("5m"), Ok(Limit::Seconds(300.0)));
    assert_eq!(Limit::parse("none"), Ok(Limit::Unlimited));
    assert_eq!(Limit::parse("1500ms"), Ok(Limit::Seconds(1.5)));
    assert!(Limit::Unlimited.longer_than(Limit::Seconds(1e9)));
    assert!(!Limit::Seconds(5.0).longer_than(Limit::Seconds(5.0)));
    assert_eq!(fmt_secs(2.4), "2.4 s");
    assert_eq!(fmt_secs(48.0), "48 s");
}

#[test]
fn node_headers_and_health_check_rules() {
    let src = "[[hop]]\nname = \"lb\"\nkind = \"aws-alb\"\nhealth_check_timeout = \"30s\"\n\n[[hop]]\nname = \"app\"\nkind = \"nodejs\"\nidle_timeout = \"65s\"\ndeadline = \"20s\"\n";
    let r = check(&parse(src).unwrap());
    let got = rules(&r);
    assert!(got.contains(&("node_headers_timeout", "app")), "{got:?}");
    assert!(got.contains(&("health_check", "lb")), "{got:?}");
}

fn row(dest: &str, lower: f64, upper: Option<f64>, point: Option<f64>) -> DestinationRow {
    let mut agg = crate::diagnosis::aggregate::Aggregator::new(crate::diagnosis::aggregate::Config::default());
    // Build a row through the aggregator, then set the bounds under test.
    let ev = crate::kernel::event::SockEvent::new(
        1,
        crate::kernel::event::EventKind::Reuse,
        crate::kernel::event::Role::Client,
        "10.0.0.1:40000".parse().unwrap(),
        dest.parse().unwrap(),
        1.0,
    );
    let _ = agg.feed(&ev);
    let mut r = agg.rows(1).remove(0);
    r.path.lower_seconds = lower;
    r.path.upper_seconds = upper;
    r.path.idle_timeout_seconds = point;
    r
}

#[test]
fn observed_disagreement_is_flagged() {
    let hops = parse(SETTLEMENT).unwrap();
    let mut r = check(&hops);
    let before = r.violations.len();
    compare_observed(&mut r, &[row("203.0.113.10:443", 340.0, Some(352.0), Some(350.0))], None, 0);
    assert_eq!(r.violations.len(), before + 1);
    let v = r.violations.last().unwrap();
    assert_eq!(v.rule, "observed");
    assert!(
        v.message.contains("declared with an idle timeout of 60 s") && v.message.contains("350 s"),
        "{}",
        v.message
    );
    let mut r = check(&hops);
    compare_observed(&mut r, &[row("203.0.113.10:443", 59.0, Some(60.2), Some(60.0))], None, 0);
    assert_eq!(r.violations.len(), before, "60 s declared, 60 s measured");
    assert!(r.notes.iter().any(|n| n.contains("agree")));
    let mut r = check(&hops);
    compare_observed(&mut r, &[], None, 0);
    assert!(r.notes.iter().any(|n| n.contains("no evidence")));
}

fn with_deadlines(mut r: DestinationRow, peer: Option<f64>, ours: Option<f64>) -> DestinationRow {
    r.deadlines.peer_request_deadline_seconds = peer;
    r.deadlines.request_timeout_seconds = ours;
    r
}

const OBSERVED_PATH: &str = "[[hop]]\nname = \"client pool\"\nclient = true\nidle_timeout = \"300s\"\ndeadline = \"30s\"\n\n[[hop]]\nname = \"partner\"\nidle_timeout = \"400s\"\ndeadline = \"10s\"\naddress = \"203.0.113.10:443\"\n";

#[test]
fn observed_pool_margin_names_a_number() {
    let hops = parse(OBSERVED_PATH).unwrap();
    let mut r = check(&hops);
    assert!(r.violations.is_empty(), "{}", render(&r));
    compare_observed(&mut r, &[row("203.0.113.10:443", 340.0, Some(352.0), Some(350.0))], None, 0);
    let got = rules(&r);
    assert!(got.contains(&("observed_pool_margin", "client pool")), "{got:?}");
    let v = r.violations.iter().find(|v| v.rule == "observed_pool_margin").unwrap();
    assert!(v.fix.contains("at most 280 s"), "{}", v.fix);
}

#[test]
fn observed_deadlines_are_checked() {
    let hops = parse(OBSERVED_PATH).unwrap();
    let mut r = check(&hops);
    let measured = with_deadlines(row("203.0.113.10:443", 5.0, None, None), Some(3.0), Some(2.0));
    compare_observed(&mut r, &[measured], None, 0);
    let got = rules(&r);
    assert!(got.contains(&("observed_deadline", "partner")), "declared 10 s, aborts after 3 s: {got:?}");
    assert!(got.contains(&("observed_deadline_staircase", "partner")), "we give up at 2 s before its 3 s: {got:?}");
    let v = r.violations.iter().find(|v| v.rule == "observed_deadline_staircase").unwrap();
    assert!(v.message.contains("client pool gives up"), "{}", v.message);
    // Agreeing values raise nothing.
    let mut r = check(&hops);
    let measured = with_deadlines(row("203.0.113.10:443", 5.0, None, None), Some(10.02), Some(30.0));
    compare_observed(&mut r, &[measured], None, 0);
    assert!(r.violations.is_empty(), "{}", render(&r));
}

#[test]
fn idle_fixes_keep_the_margin() {
    let src = "[[hop]]\nname = \"client pool\"\nclient = true\nidle_timeout = \"300s\"\n\n[[hop]]\nname = \"nat\"\nidle_timeout = \"240s\"\n";
    let r = check(&parse(src).unwrap());
    let v = r.violations.iter().find(|v| v.rule == "idle_staircase").expect("a reversed step");
    assert!(v.fix.contains("to at most 192 s"), "no fix one second from the race: {}", v.fix);
}

#[test]
fn catalog_lists_kinds_with_sources() {
    let all = render_catalog(None).unwrap();
    for id in [
        "aws-alb",
        "aws-nlb",
        "aws-nat-gateway",
        "azure-lb",
        "gcp-cloud-nat",
        "nginx",
        "haproxy",
        "nodejs",
        "gunicorn",
        "uvicorn",
        "postgresql",
        "go-http",
        "okhttp",
        "reqwest",
        "hyper",
        "dotnet",
        "jdk-httpclient",
        "urllib3",
        "hikaricp",
    ] {
        assert!(all.contains(id), "{id} missing");
    }
    let one = render_catalog(Some("nodejs")).unwrap();
    assert!(one.contains("headers_timeout = 60 s") && one.contains("source:"), "{one}");
    assert!(render_catalog(Some("nope")).unwrap_err().contains("known kinds"));
}

/// One hop address seen from two network namespaces: without `--netns`
/// the check asks (a note naming both), with it each namespace's row is
/// compared on its own.
#[test]
fn observed_picks_the_namespace_or_asks() {
    let hops = parse(SETTLEMENT).unwrap();
    let mut bad = row("203.0.113.10:443", 340.0, Some(352.0), Some(350.0));
    bad.id.netns = crate::diagnosis::key::Netns::from(Some(4_026_532_284));
    let mut good = row("203.0.113.10:443", 59.0, Some(60.2), Some(60.0));
    good.id.netns = crate::diagnosis::key::Netns::from(Some(4_026_532_301));
    let rows = [bad, good];
    let mut r = check(&hops);
    let before = r.violations.len();
    compare_observed(&mut r, &rows, None, 0);
    assert_eq!(r.violations.len(), before, "no row is picked by chance");
    let asked = r.notes.iter().find(|n| n.contains("not compared")).expect("a note asks which");
    assert!(asked.contains("--netns 4026532284") && asked.contains("--netns 4026532301"), "{asked}");
    let mut r = check(&hops);
    compare_observed(&mut r, &rows, Some(4_026_532_284), 0);
    assert_eq!(r.violations.len(), before + 1);
    assert_eq!(r.violations.last().unwrap().rule, "observed");
    let mut r = check(&hops);
    compare_observed(&mut r, &rows, Some(4_026_532_301), 0);
    assert_eq!(r.violations.len(), before);
    assert!(r.notes.iter().any(|n| n.contains("agree")));
    // The host's row (netns null) answers to its inode and to 0.
    let mut host = row("203.0.113.10:443", 340.0, Some(352.0), Some(350.0));
    host.id.netns = crate::diagnosis::key::Netns::HOST;
    for want in [0, 4_026_531_840] {
        let mut r = check(&hops);
        compare_observed(&mut r, std::slice::from_ref(&host), Some(want), 4_026_531_840);
        assert_eq!(r.violations.len(), before + 1, "--netns {want}");
    }
}

/// A hop given by the name clients use (`host:port`) is compared with the
/// row whose clients sent that name (SNI or `Host`) on that port; a name
/// seen at two addresses is asked about, not guessed.
#[test]
fn observed_matches_a_hop_by_the_name_clients_use() {
    let by_name =
        SETTLEMENT.replace("address = \"203.0.113.10:443\"", "address = \"API.Settlement-Partner.example:443\"");
    assert_ne!(by_name, SETTLEMENT, "the example names its address");
    let hops = parse(&by_name).unwrap();
    let mut named = row("203.0.113.10:443", 340.0, Some(352.0), Some(350.0));
    named.server_names =
        vec![crate::diagnosis::table::ServerName { name: "api.settlement-partner.example".into(), connections: 9 }];
    let mut r = check(&hops);
    let before = r.violations.len();
    compare_observed(&mut r, std::slice::from_ref(&named), None, 0);
    assert_eq!(r.violations.len(), before + 1, "{:?}", r.notes);
    let v = r.violations.last().unwrap();
    assert!(v.message.contains("api.settlement-partner.example:443 (203.0.113.10:443)"), "{}", v.message);
    // The same address without the name: nothing to compare.
    let unnamed = row("203.0.113.10:443", 340.0, Some(352.0), Some(350.0));
    let mut r = check(&hops);
    compare_observed(&mut r, &[unnamed], None, 0);
    assert_eq!(r.violations.len(), before);
    assert!(r.notes.iter().any(|n| n.contains("no evidence measured yet for a destination clients reach as")));
    // One name, two addresses.
    let mut second = named.clone();
    second.id.destination = "203.0.113.11:443".into();
    let mut r = check(&hops);
    compare_observed(&mut r, &[named, second], None, 0);
    assert_eq!(r.violations.len(), before);
    assert!(r.notes.iter().any(|n| n.contains("several addresses")), "{:?}", r.notes);
    let e = parse("[[hop]]\nname = \"lb\"\naddress = \"-bad-:443\"\n").unwrap_err();
    assert!(e.to_string().contains("neither ip:port nor host:port"), "{e}");
}

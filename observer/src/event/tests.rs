use super::*;

fn bytes_of(e: &Event) -> Vec<u8> {
    // SAFETY: Event is POD without padding.
    unsafe { std::slice::from_raw_parts(std::ptr::from_ref::<Event>(e).cast::<u8>(), EVENT_SIZE) }.to_vec()
}

fn fixture_v4() -> Event {
    let mut e = Event::ZERO;
    e.ts_ns = 5_000_000_000;
    e.sock_id = 0xffff_8880_1234_5678;
    e.kind = kind::REUSE;
    e.family = AF_INET;
    e.saddr[..4].copy_from_slice(&[10, 0, 0, 1]);
    e.daddr[..4].copy_from_slice(&[10, 0, 0, 2]);
    e.sport = 43_210;
    e.dport = 80;
    e.role = role::CLIENT;
    e.outcome = outcome::RESET;
    e.how = how::RST;
    e.flags = flags::FIN_BEFORE_WRITE;
    e.idle_ns = 2_503_000_000;
    e.elapsed_ns = 120_000;
    e.tgid = 4242;
    e.comm[..7].copy_from_slice(b"python3");
    e
}

#[test]
fn decodes_ipv4_reuse_from_bytes() {
    let ev = decode_bytes(&bytes_of(&fixture_v4()), Clock::with_offset_ns(1_000_000_000_000_000_000)).unwrap();
    assert_eq!(ev.kind, EventKind::Reuse);
    assert_eq!(ev.local, "10.0.0.1:43210".parse().unwrap());
    assert_eq!(ev.remote, "10.0.0.2:80".parse().unwrap());
    assert_eq!(ev.outcome, Some(Outcome::Reset));
    assert!(ev.safe_to_retry);
    assert_eq!(ev.comm, "python3");
    assert_eq!(ev.pid, 4242);
    assert!((ev.idle_seconds - 2.503).abs() < 1e-9);
    assert_eq!(ev.ts_unix_ns, 1_000_000_005_000_000_000);
    assert_eq!(ev.how, Some(How::Rst));
}

#[test]
fn decodes_ipv6_and_v4_mapped() {
    let mut e = fixture_v4();
    e.kind = kind::ESTABLISHED;
    e.family = AF_INET6;
    e.saddr = Ipv6Addr::LOCALHOST.octets();
    e.daddr = Ipv4Addr::LOCALHOST.to_ipv6_mapped().octets();
    let ev = decode_bytes(&bytes_of(&e), Clock::with_offset_ns(0)).unwrap();
    assert_eq!(ev.local, "[::1]:43210".parse().unwrap());
    assert_eq!(ev.remote, "127.0.0.1:80".parse().unwrap());
    assert_eq!(ev.outcome, None, "only reuse events carry an outcome");
    assert_eq!(ev.elapsed_seconds, None);
}

#[test]
fn rejects_bad_records() {
    assert_eq!(decode_bytes(&[0; 10], Clock::with_offset_ns(0)), Err(DecodeError::Size(10)));
    let mut e = fixture_v4();
    e.kind = 99;
    assert_eq!(decode_bytes(&bytes_of(&e), Clock::with_offset_ns(0)), Err(DecodeError::Kind(99)));
    let mut e = fixture_v4();
    e.family = 1;
    assert_eq!(decode_bytes(&bytes_of(&e), Clock::with_offset_ns(0)), Err(DecodeError::Family(1)));
}

#[test]
fn preexisting_role_is_guessed_from_ports() {
    let mut e = fixture_v4();
    e.role = role::UNKNOWN;
    let ev = decode(&e, Clock::with_offset_ns(0)).unwrap();
    assert_eq!(ev.role, Role::Client);
    e.sport = 8080;
    e.dport = 51_000;
    assert_eq!(decode(&e, Clock::with_offset_ns(0)).unwrap().role, Role::Server);
}

#[test]
fn json_round_trips_with_stable_names() {
    let ev = decode(&fixture_v4(), Clock::with_offset_ns(0)).unwrap();
    let line = ev.to_json_line();
    for key in [
        "\"kind\":\"reuse\"",
        "\"outcome\":\"reset\"",
        "\"safe_to_retry\":true",
        "\"role\":\"client\"",
        "\"remote\":\"10.0.0.2:80\"",
        "\"idle_seconds\":2.503",
    ] {
        assert!(line.contains(key), "{key} missing in {line}");
    }
    let back: SockEvent = serde_json::from_str(&line).unwrap();
    assert_eq!(back, ev);
}

#[test]
fn text_line_has_the_fields_a_human_needs() {
    let ev = decode(&fixture_v4(), Clock::with_offset_ns(0)).unwrap();
    let s = ev.to_string();
    assert!(s.contains("reuse"), "{s}");
    assert!(s.contains("idle=2.503s"), "{s}");
    assert!(s.contains("outcome=reset"), "{s}");
    assert!(s.contains("safe_to_retry=true"), "{s}");
    assert!(s.contains("10.0.0.1:43210 -> 10.0.0.2:80"), "{s}");
}

#[test]
fn process_names_cannot_reach_the_terminal() {
    let mut e = SockEvent::new(
        1,
        EventKind::Reuse,
        Role::Client,
        "10.0.0.1:1".parse().unwrap(),
        "10.0.0.2:2".parse().unwrap(),
        2.0,
    );
    e.comm = "evil\u{1b}[2Jname".into();
    let line = e.to_string();
    assert!(!line.contains('\u{1b}'), "{line:?}");
    assert!(line.contains("evil\\u{1b}[2Jname"), "{line}");
}

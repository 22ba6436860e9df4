use super::*;
use crate::kernel::event::clock::{hz_from_coarse_clock, kernel_hz};
use observer_common::{dead, DoomedRecord};

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
    assert_eq!(ev.kind(), EventKind::Reuse);
    assert_eq!(ev.local, "10.0.0.1:43210".parse().unwrap());
    assert_eq!(ev.remote, "10.0.0.2:80".parse().unwrap());
    assert_eq!(ev.outcome(), Some(Outcome::Reset));
    assert!(ev.safe_to_retry());
    assert_eq!(ev.comm, "python3");
    assert_eq!(ev.pid, 4242);
    assert!((ev.idle_seconds - 2.503).abs() < 1e-9);
    assert_eq!(ev.ts_unix_ns, 1_000_000_005_000_000_000);
    assert_eq!(ev.how(), Some(How::Rst));
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
    assert_eq!(ev.outcome(), None, "only reuse events carry an outcome");
    assert_eq!(ev.elapsed_seconds(), None);
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
    // With an owner (its flattened `runtime`) and a client runtime.
    let mut rich = ev.clone();
    rich.owner =
        Some(crate::kernel::owner::Owner { cgroup: "/x".into(), runtime: Some("docker".into()), ..Default::default() });
    rich.reuse_mut().client_runtime = Some(crate::kernel::runtime::ClientRuntime {
        runtime: "go".into(),
        libraries: vec!["net/http".into()],
        ..Default::default()
    });
    let line = rich.to_json_line();
    let back: SockEvent = serde_json::from_str(&line).unwrap();
    assert_eq!(back, rich, "{line}");
    // A name.
    let mut named = SockEvent { body: Body::ServerName(FirstBytes::default()), ..ev };
    named.server_name_mut().server_name = Some("api.example".into());
    let line = named.to_json_line();
    assert!(line.contains(r#""kind":"server_name","server_name":"api.example""#), "{line}");
    assert_eq!(serde_json::from_str::<SockEvent>(&line).unwrap(), named, "{line}");
}

/// Each kind's JSON carries its own fields and no other kind's, and every
/// kind's line reads back into the same body.
#[test]
fn each_kind_writes_only_its_own_fields() {
    let at = |kind: EventKind| {
        let mut e = fixture_v4();
        e.kind = kind_wire(kind);
        e.flags = flags::PEER_CLOSED_FIRST | flags::REUSE;
        decode(&e, Clock::with_offset_ns(0)).unwrap()
    };
    for &kind in EventKind::ALL {
        let ev = at(kind);
        assert_eq!(ev.kind(), kind);
        let v: serde_json::Value = serde_json::from_str(&ev.to_json_line()).unwrap();
        let has = |k: &str| v.get(k).is_some();
        assert_eq!(v["kind"], kind.as_str());
        assert_eq!(has("outcome"), kind == EventKind::Reuse, "{kind:?}: {v}");
        assert_eq!(has("safe_to_retry"), kind == EventKind::Reuse, "{kind:?}: {v}");
        assert_eq!(has("peer_closed_first"), kind == EventKind::LocalClose, "{kind:?}: {v}");
        assert_eq!(
            has("reuse"),
            matches!(kind, EventKind::RequestAborted | EventKind::RequestTimeout),
            "{kind:?}: {v}"
        );
        assert_eq!(
            has("elapsed_seconds"),
            matches!(
                kind,
                EventKind::Reuse
                    | EventKind::RequestAborted
                    | EventKind::RequestTimeout
                    | EventKind::LateReuse
                    | EventKind::PeerCloseWhileIdle
                    | EventKind::DiscardedDead
            ),
            "{kind:?}: {v}"
        );
        for header in ["ts_unix_ns", "role", "local", "remote", "idle_seconds", "sock_id", "netns"] {
            assert!(has(header), "{kind:?} lacks {header}: {v}");
        }
        assert_eq!(serde_json::from_str::<SockEvent>(&ev.to_json_line()).unwrap(), ev, "{kind:?}");
    }
}

/// The wire value of a kind (the inverse of `of_wire`).
fn kind_wire(kind: EventKind) -> u8 {
    (0..=u8::MAX).find(|&w| EventKind::of_wire(w) == Some(kind)).unwrap()
}

/// Lines recorded before typed events (every field on every kind) read
/// into the right bodies; a reuse record without an outcome is refused.
#[test]
fn flat_recordings_still_read_and_a_reuse_needs_its_outcome() {
    let head = r#""ts_unix_ns":1,"role":"client","pid":1,"comm":"c","local":"10.0.0.1:1","remote":"10.0.0.2:2","idle_seconds":1.0"#;
    let rest = r#""outcome":null,"elapsed_seconds":2.5,"retransmits":3,"safe_to_retry":false,"failed_before_send":false,"how":"rst","request_outstanding":true,"peer_closed_first":false,"preexisting":false,"keepalive":false,"control_write":false,"reuse":true,"bytes":120,"sock_id":9,"netns":0,"cgroup_id":0"#;
    let ev: SockEvent = serde_json::from_str(&format!(r#"{{{head},"kind":"request_aborted",{rest}}}"#)).unwrap();
    assert_eq!(
        ev.body,
        Body::RequestAborted(Request {
            elapsed_seconds: 2.5,
            retransmits: 3,
            reuse: true,
            bytes: 120,
            how: Some(How::Rst)
        })
    );
    assert_eq!(ev.sock_id, 9);
    let est: SockEvent = serde_json::from_str(&format!(r#"{{{head},"kind":"established",{rest}}}"#)).unwrap();
    assert_eq!(est.body, Body::Established);
    // A local close with a request still outstanding (probes before
    // `request_timeout`) is no pool idle close.
    let close: SockEvent = serde_json::from_str(&format!(r#"{{{head},"kind":"local_close",{rest}}}"#)).unwrap();
    assert!(!close.is_pool_idle_close(), "{close:?}");
    let mut e = fixture_v4();
    e.outcome = outcome::NONE;
    assert_eq!(decode_bytes(&bytes_of(&e), Clock::with_offset_ns(0)), Err(DecodeError::Outcome(0)));
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

#[test]
fn decodes_a_reuse_that_failed_before_send_and_a_discarded_dead_socket() {
    let mut e = fixture_v4();
    e.outcome = outcome::TIMED_OUT;
    e.how = how::TIMEOUT;
    e.flags = flags::FAILED_BEFORE_SEND | flags::FIN_BEFORE_WRITE;
    let ev = decode_bytes(&bytes_of(&e), Clock::with_offset_ns(0)).unwrap();
    assert_eq!(ev.outcome(), Some(Outcome::TimedOut));
    assert!(ev.failed_before_send() && ev.safe_to_retry());
    assert!(ev.to_json_line().contains(r#""outcome":"timed_out""#), "{}", ev.to_json_line());
    assert!(ev.to_string().contains("failed_before_send"), "{ev}");
    e.kind = kind::DISCARDED_DEAD;
    e.flags = 0;
    e.how = how::RST;
    e.elapsed_ns = 0;
    let ev = decode_bytes(&bytes_of(&e), Clock::with_offset_ns(0)).unwrap();
    assert_eq!(ev.kind(), EventKind::DiscardedDead);
    assert_eq!((ev.outcome(), ev.how(), ev.elapsed_seconds()), (None, Some(How::Rst), None));
    assert!(!ev.failed_before_send());
    e.elapsed_ns = 2_000_000_000;
    let ev = decode_bytes(&bytes_of(&e), Clock::with_offset_ns(0)).unwrap();
    assert_eq!(ev.elapsed_seconds(), Some(2.0), "time from the peer's FIN to our close");
    // A recording written before these fields existed still reads.
    let old: SockEvent = serde_json::from_str(r#"{"ts_unix_ns":1,"kind":"reuse","role":"client","pid":1,"comm":"c","local":"10.0.0.1:1","remote":"10.0.0.2:2","idle_seconds":1.0,"outcome":"reset"}"#).unwrap();
    assert!(!old.failed_before_send());
}

#[test]
fn decodes_doomed_records() {
    let mut rec = DoomedRecord {
        id: 1,
        last_ns: 1_000_000_000,
        cgroup_id: 5,
        saddr: [0; 16],
        daddr: [0; 16],
        netns: 7,
        tgid: 42,
        sport: 40_000,
        dport: 5432,
        family: AF_INET,
        role: role::CLIENT,
        how: dead::FIN,
        comm: [0; 16],
    };
    rec.saddr[..4].copy_from_slice(&[10, 0, 0, 1]);
    rec.daddr[..4].copy_from_slice(&[10, 0, 0, 2]);
    rec.comm[..3].copy_from_slice(b"api");
    let v = doomed_of(&rec, 4_500_000_000).unwrap();
    assert_eq!(v.remote, "10.0.0.2:5432".parse().unwrap());
    assert_eq!((v.how, v.comm.as_str(), v.pid, v.netns), (How::Fin, "api", 42, 7));
    assert!((v.idle_seconds - 3.5).abs() < 1e-9);
    rec.how = dead::TIMEOUT;
    assert_eq!(doomed_of(&rec, 0).unwrap().how, How::Timeout);
    rec.how = 0;
    assert!(doomed_of(&rec, 0).is_none(), "a record without a death is no doomed socket");
}

/// The coarse clock's tick gives the same HZ as the kernel's config, so a
/// host (or VM) without a readable config still converts keep-alive times.
#[test]
fn hz_from_the_coarse_clock_matches_the_config() {
    let hz = hz_from_coarse_clock().expect("a tick between 1 and 10 ms");
    assert!((100..=1000).contains(&hz), "{hz}");
    assert_eq!(kernel_hz(), Some(hz));
}

/// The owner is one embedded type, flattened: an event's JSON keeps
/// `cgroup`, `container`, `runtime`, `pod` and `unit` at the top level,
/// absent when unresolved, and lines written before `runtime` existed (or
/// with no owner at all) still read.
#[test]
fn owner_fields_stay_flat_in_the_json() {
    let mut ev = decode(&fixture_v4(), Clock::with_offset_ns(0)).unwrap();
    let bare = ev.to_json_line();
    assert!(!bare.contains("\"cgroup\"") && !bare.contains("\"container\""), "{bare}");
    assert_eq!(serde_json::from_str::<SockEvent>(&bare).unwrap().owner, None);
    ev.owner = Some(crate::kernel::owner::parse(
        "/kubepods.slice/kubepods-pod1f2e3d4c_5b6a_7980_a1b2_c3d4e5f60718.slice/cri-containerd-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope",
    ));
    let line = ev.to_json_line();
    for key in [
        "\"cgroup\":\"/kubepods.slice/",
        "\"container\":\"0123456789ab",
        "\"runtime\":\"containerd\"",
        "\"pod\":\"1f2e3d4c-",
    ] {
        assert!(line.contains(key), "{key} missing in {line}");
    }
    let back: SockEvent = serde_json::from_str(&line).unwrap();
    assert_eq!(back, ev);
    assert_eq!(back.container().map(str::len), Some(64));
    let old = line.replace(",\"runtime\":\"containerd\"", "");
    let back: SockEvent = serde_json::from_str(&old).unwrap();
    assert_eq!(back.owner.as_ref().and_then(|o| o.runtime.as_deref()), None);
    assert_eq!(back.cgroup(), ev.cgroup());
}

/// Each event kind, outcome and closing way is declared once with its wire
/// value: every kind has exactly one, and no two share one.
#[test]
fn every_kind_has_one_wire_value() {
    for k in EventKind::ALL {
        let wires: Vec<u8> = (0..=u8::MAX).filter(|&v| EventKind::of_wire(v) == Some(*k)).collect();
        assert_eq!(wires.len(), 1, "{k:?}: {wires:?}");
    }
    for o in Outcome::ALL {
        assert_eq!((0..=u8::MAX).filter(|&v| Outcome::of_wire(v) == Some(*o)).count(), 1, "{o:?}");
    }
    assert_eq!(Outcome::of_wire(observer_common::outcome::NONE), None);
    assert_eq!(How::of_wire(observer_common::how::NONE), None);
    let wired = How::ALL.iter().filter(|h| (0..=u8::MAX).any(|v| How::of_wire(v) == Some(**h))).count();
    assert_eq!(wired, How::ALL.len() - 1, "all but `stalled`, which the doomed table says");
}

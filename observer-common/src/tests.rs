use super::*;
use core::mem::offset_of;

#[test]
fn the_ports_tell_the_role_by_one_rule() {
    assert_eq!(role::guess(40_000, 443), role::CLIENT, "the ephemeral side connected");
    assert_eq!(role::guess(443, 40_000), role::SERVER);
    assert_eq!(role::guess(6000, 5000), role::CLIENT, "neither ephemeral: the higher port");
    assert_eq!(role::guess(40_001, 40_000), role::CLIENT, "both ephemeral: the higher port");
    assert_eq!(role::guess(5000, 6000), role::SERVER);
    assert_eq!(role::guess(5000, 5000), role::UNKNOWN, "equal ports tell nothing");
}

#[test]
fn listeners_tell_the_role_of_an_adopted_socket() {
    // gRPC's 50051 is inside the ephemeral range: the ports alone read a
    // client on a lower ephemeral port as the server.
    assert_eq!(role::guess(41_000, 50_051), role::SERVER, "what the ports alone say");
    assert_eq!(role::of_adopted(41_000, 50_051, Some(false)), role::CLIENT, "no listener on 41000: it connected");
    assert_eq!(role::of_adopted(50_051, 41_000, Some(true)), role::SERVER, "a listener on 50051: it was accepted");
    assert_eq!(role::of_adopted(50_051, 41_000, None), role::CLIENT, "listeners unknown: the ports");
    // An NFS client on a reserved port talking to 2049.
    assert_eq!(role::of_adopted(800, 2049, Some(false)), role::CLIENT);
    // A server whose listener closed (draining): the plain server shape.
    assert_eq!(role::of_adopted(8080, 45_000, Some(false)), role::SERVER);
    // A listener decides even against the ports.
    assert_eq!(role::of_adopted(45_000, 8080, Some(true)), role::SERVER);
    for (local, remote) in [(40_000, 443), (443, 40_000), (5000, 6000), (5000, 5000)] {
        assert_eq!(role::of_adopted(local, remote, None), role::guess(local, remote));
    }
}

#[test]
fn listener_keys_keep_namespace_and_port_apart() {
    assert_eq!(role::listener_key(0, 80), 80);
    assert_eq!(role::listener_key(4_026_531_840, 443), 4_026_531_840_u64 * 65_536 + 443);
    assert_ne!(role::listener_key(1, 0), role::listener_key(0, 1));
    assert_ne!(role::listener_key(u32::MAX, u16::MAX), role::listener_key(u32::MAX - 1, u16::MAX));
}

#[test]
fn event_layout_is_stable() {
    assert_eq!(offset_of!(Event, ts_ns), 0);
    assert_eq!(offset_of!(Event, sock_id), 8);
    assert_eq!(offset_of!(Event, idle_ns), 16);
    assert_eq!(offset_of!(Event, elapsed_ns), 24);
    assert_eq!(offset_of!(Event, saddr), 32);
    assert_eq!(offset_of!(Event, daddr), 48);
    assert_eq!(offset_of!(Event, tgid), 64);
    assert_eq!(offset_of!(Event, retransmits), 68);
    assert_eq!(offset_of!(Event, keepalive_jiffies), 72);
    assert_eq!(offset_of!(Event, bytes), 76);
    assert_eq!(offset_of!(Event, sport), 80);
    assert_eq!(offset_of!(Event, dport), 82);
    assert_eq!(offset_of!(Event, family), 84);
    assert_eq!(offset_of!(Event, kind), 86);
    assert_eq!(offset_of!(Event, flags), 90);
    assert_eq!(offset_of!(Event, comm), 96);
    assert_eq!(offset_of!(Event, cgroup_id), 112);
    assert_eq!(offset_of!(Event, netns), 120);
    assert_eq!(core::mem::size_of::<Event>(), EVENT_SIZE);
}

#[test]
fn sock_state_layout_is_stable() {
    assert_eq!(offset_of!(SockState, died_ns), 80);
    assert_eq!(offset_of!(SockState, saddr), 88);
    assert_eq!(offset_of!(SockState, daddr), 104);
    assert_eq!(offset_of!(SockState, req_snd_seq), 120);
    assert_eq!(offset_of!(SockState, wburst_seq), 136);
    assert_eq!(offset_of!(SockState, sport), 144);
    assert_eq!(offset_of!(SockState, role), 150);
    assert_eq!(offset_of!(SockState, flags), 151);
    assert_eq!(offset_of!(SockState, comm), 152);
    assert_eq!(offset_of!(SockState, cgroup_id), 168);
    assert_eq!(offset_of!(SockState, burst_rseq), 196);
    assert_eq!(offset_of!(SockState, netns), 176);
    assert_eq!(offset_of!(SockState, watch), 182);
    assert_eq!(offset_of!(SockState, event_flags), 183);
    assert_eq!(core::mem::size_of::<SockState>(), SOCK_STATE_SIZE);
}

#[test]
fn records_and_keys_have_no_padding() {
    assert_eq!(offset_of!(SockRecord, saddr), 24);
    assert_eq!(offset_of!(SockRecord, flags), 63);
    assert_eq!(offset_of!(SockRecord, netns), 64);
    assert_eq!(offset_of!(SockRecord, cgroup_id), 72);
    assert_eq!(offset_of!(TupleKey, pad), 38);
    assert_eq!(core::mem::size_of::<ClosedIdle>(), 16);
    assert_eq!(offset_of!(DoomedRecord, saddr), 24);
    assert_eq!(offset_of!(DoomedRecord, netns), 56);
    assert_eq!(offset_of!(DoomedRecord, how), 71);
    assert_eq!(offset_of!(DoomedRecord, comm), 72);
    assert_eq!(offset_of!(SockState, dead), 180);
}

#[test]
fn h2_control_frames_by_their_exact_sizes() {
    use crate::{is_h2_control, is_h2_ping};
    for ping in [17, 38, 39, 46] {
        assert!(is_h2_ping(ping) && is_h2_control(ping), "{ping}");
    }
    // A Redis PING (14 bytes), a small request, a TLS record of 17 bytes.
    for not_ping in [14, 16, 18, 47, 48] {
        assert!(!is_h2_ping(not_ping), "{not_ping}");
    }
    // SETTINGS ack, RST_STREAM / WINDOW_UPDATE, cleartext and in TLS.
    for control in [9, 13, 30, 31, 34, 35, 42] {
        assert!(is_h2_control(control) && !is_h2_ping(control), "{control}");
    }
    // Two frames at once, or a call's HEADERS and DATA, are no control frame.
    for call in [0, 26, 28, 50, 120] {
        assert!(!is_h2_control(call), "{call}");
    }
}

#[test]
fn the_probe_thread_comm_is_its_name_nul_padded() {
    assert_eq!(&crate::PROBE_THREAD_COMM[..14], crate::PROBE_THREAD.as_bytes());
    assert!(crate::PROBE_THREAD_COMM[14..].iter().all(|&b| b == 0));
}

use super::api::{MAX_OLDER_BUILDS, TABLE_MAX_AGE_NS};
use super::*;

#[test]
fn health_needs_attached_probes_and_a_reader_that_passes() {
    let h = Health::default();
    let now = 100_000_000_000;
    assert!(!h.report(now).0, "nothing attached yet");
    h.attached.store(true, Ordering::Relaxed);
    assert!(!h.report(now).0, "attached, but the reader never passed");
    h.heartbeat_ns.store(now - 1_000_000_000, Ordering::Relaxed);
    let (ok, body) = h.report(now);
    assert!(ok, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["status"], "ok");
    assert_eq!(v["last_read_age_seconds"], 1.0);
    let (ok, body) = h.report(now + 10_000_000_000);
    assert!(!ok, "the reader stalled 11 s ago: {body}");
    assert!(body.contains("\"events_flowing\":false"), "{body}");
}

#[test]
fn a_degraded_store_is_reported_and_stays_healthy() {
    let h = Health::default();
    let now = 100_000_000_000;
    h.attached.store(true, Ordering::Relaxed);
    h.heartbeat_ns.store(now, Ordering::Relaxed);
    assert!(h.report(now).1.contains("\"store\":\"none\""));
    let state = Arc::new(store::WriterState::default());
    let _ = h.store.set(Arc::clone(&state));
    assert!(h.report(now).1.contains("\"store\":\"ok\""));
    state.degraded.store(true, Ordering::Relaxed);
    let (ok, body) = h.report(now);
    assert!(ok, "probes run: still healthy: {body}");
    assert!(body.contains("\"store\":\"degraded\""), "{body}");
}

/// Slow clients that hold old builds stop new ones: at most the current
/// build and [`MAX_OLDER_BUILDS`] earlier ones are alive, and a build is
/// freed with its last reader.
#[test]
fn slow_readers_hold_a_bounded_number_of_builds() {
    let shared = DaemonState::new(Aggregator::new(aggregate::Config::default()), Metrics::default());
    let wait = || std::thread::sleep(Duration::from_nanos(TABLE_MAX_AGE_NS + 50_000_000));
    let (t0, m0) = shared.bodies().unwrap();
    let (t0b, _) = shared.bodies().unwrap();
    assert_eq!(t0.as_ptr(), t0b.as_ptr(), "within the max age: one shared body");
    let mut held = vec![(t0, m0)];
    for _ in 0..MAX_OLDER_BUILDS {
        wait();
        let b = shared.bodies().unwrap();
        assert_ne!(b.0.as_ptr(), held.last().unwrap().0.as_ptr(), "older than the max age: rebuilt");
        held.push(b);
    }
    wait();
    let stale = shared.bodies().unwrap();
    assert_eq!(stale.0.as_ptr(), held.last().unwrap().0.as_ptr(), "{MAX_OLDER_BUILDS} older builds read: no new one");
    drop(stale);
    // The readers finish: the old builds are freed and building resumes.
    held.truncate(1);
    held.remove(0);
    let last = shared.bodies().unwrap();
    wait();
    let next = shared.bodies().unwrap();
    assert_ne!(next.0.as_ptr(), last.0.as_ptr());
}

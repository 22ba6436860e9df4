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

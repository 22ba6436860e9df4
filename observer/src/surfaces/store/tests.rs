#![allow(clippy::cast_precision_loss, reason = "small test counters")]
use std::{sync::atomic::Ordering, time::Instant};

use super::*;
use crate::{
    diagnosis::aggregate::{Aggregator, Config},
    diagnosis::key::{Destination, Netns},
    kernel::event::{clock_ns, Body, LocalClose, Outcome, Role},
};

const S: u64 = 1_000_000_000;
const T0: u64 = 1_700_000_000 * S;

/// An event's row key (the host's namespace unknown here).
fn key(e: &SockEvent) -> DestKey {
    DestKey::of_event(e, 0).expect("a test event has a destination")
}

/// An event as the store files it (the host's namespace unknown here).
fn evid(e: SockEvent) -> Record {
    Record::evidence(e, 0).expect("a test event has a destination")
}

fn ev(ts: u64, kind: EventKind, idle: f64, outcome: Option<Outcome>) -> SockEvent {
    let mut e = SockEvent::client_test(ts, kind, "10.0.0.2:443", idle).shaped("java", outcome);
    if let Some(o) = outcome {
        e.reuse_mut().safe_to_retry = o == Outcome::Eof;
        e.set_elapsed(0.002);
    }
    e
}

/// A mixed run: connections, reuses that survive and fail, peer closes,
/// names (one twice), and events that are no evidence (a close, a local
/// close of a busy socket).
fn run() -> Vec<SockEvent> {
    let mut v = Vec::new();
    for k in 0..30u32 {
        let idle = 30.0 + f64::from(k) * 2.0;
        let ts = T0 + u64::from(k) * 100 * S;
        v.push(ev(ts, EventKind::Established, 0.0, None));
        if k % 10 == 0 {
            let mut name = ev(ts, EventKind::ServerName, 0.0, None);
            name.server_name_mut().server_name = Some("api.example.com".into());
            v.push(name);
        }
        if idle >= 60.0 {
            v.push(ev(ts, EventKind::PeerCloseWhileIdle, 60.0 + f64::from(k % 3) * 0.1, None));
        }
        v.push(ev(ts + S, EventKind::Reuse, idle, Some(if idle < 60.0 { Outcome::Ok } else { Outcome::Eof })));
        let mut busy = ev(ts + 2 * S, EventKind::LocalClose, 0.0, None);
        busy.body = Body::LocalClose(LocalClose { request_outstanding: true, ..LocalClose::default() });
        v.push(busy);
        v.push(ev(ts + 2 * S, EventKind::Closed, 0.0, None));
    }
    v
}

/// What the daemon hands the store for [`run`]: the feed decides, [`keep`]
/// routes.
fn scenario() -> Vec<Record> {
    let mut agg = Aggregator::new(Config::default());
    let mut volume = ConnectionCounts::default();
    let mut out = Vec::new();
    for e in run() {
        let fed = agg.feed(&e);
        keep(&e, &fed, &mut volume, |r| out.push(r));
    }
    out.extend(volume.flush());
    out
}

/// The store's evidence is the aggregator's classification of the run,
/// event for event (and each name the first time its row saw it), and a
/// restart rebuilds the same rows from it.
#[test]
fn restart_keeps_evidence_and_rebuilds_the_same_estimates() {
    let dir = tempfile::tempdir().unwrap();
    let mut live = Aggregator::new(Config::default());
    let mut classified = Vec::new();
    for e in run() {
        let fed = live.feed(&e);
        if fed.ingested.is_some() || fed.fresh_name {
            classified.push(e);
        }
    }
    {
        let mut store = Store::open(dir.path(), 0).unwrap();
        store.insert(&scenario()).unwrap();
    }
    let store = Store::open(dir.path(), 0).unwrap();
    let events = store.events(None, 0).unwrap();
    assert_eq!(events.len(), 30 + 15 + 1, "30 finished reuses, 15 peer closes and one fresh name");
    assert_eq!(events, classified, "the store holds what the feed took, in order");
    let mut rebuilt = Aggregator::new(Config::default());
    for e in &events {
        let _ = rebuilt.feed(e);
    }
    let now = live.latest_ns();
    // A name is stored once per row: a restart keeps the name, not how
    // many connections carried it.
    let names = |mut rows: Vec<crate::diagnosis::table::DestinationRow>| {
        rows.iter_mut().flat_map(|r| r.server_names.iter_mut()).for_each(|n| n.connections = 0);
        rows
    };
    assert_eq!(names(rebuilt.rows(now)), names(live.rows(now)));
    let vol = store.volume("10.0.0.2:443", 0).unwrap();
    assert_eq!(vol.iter().map(|v| v.connections).sum::<u64>(), 30);
    assert!(store.integrity_ok().unwrap());
}

#[test]
fn retention_by_age() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path(), 0).unwrap();
    let day = 86_400 * S;
    store
        .insert(&[
            evid(ev(T0, EventKind::Reuse, 5.0, Some(Outcome::Ok))),
            evid(ev(T0 + 3 * day, EventKind::Reuse, 6.0, Some(Outcome::Ok))),
        ])
        .unwrap();
    let p = store
        .prune(T0 + 3 * day + S, Limits { retention_ns: 2 * day, max_bytes: u64::MAX, ..Limits::default() })
        .unwrap();
    assert_eq!(p, Pruned { by_age: 1, by_size: 0 });
    let left = store.events(None, 0).unwrap();
    assert_eq!(left.len(), 1);
    assert!((left[0].idle_seconds - 6.0).abs() < 1e-9, "the newer record stays");
}

#[test]
fn retention_by_size_keeps_the_newest() {
    let (_dir, mut store) = twenty_thousand_reuses();
    let before = store.size_bytes().unwrap();
    let limit = 1024 * 1024;
    assert!(before > limit, "the test needs more than 1 MiB ({before})");
    let p = store.prune(T0, Limits { retention_ns: u64::MAX / 2, max_bytes: limit, ..Limits::default() }).unwrap();
    let after = store.size_bytes().unwrap();
    assert!(after <= limit, "{after} bytes after pruning to {limit}");
    assert!(p.by_size > 0 && p.by_size < 20_000);
    let left = store.events(None, 0).unwrap();
    assert_eq!(left.last().unwrap().ts_unix_ns, T0 + 19_999 * S, "the newest record survives");
    assert_eq!(left.len() as u64 + p.by_size, 20_000);
    eprintln!("MEASURED store: 20000 reuse records = {before} bytes ({} bytes per record)", before / 20_000);
}

#[test]
fn writer_batches_and_counts_what_it_drops() {
    let dir = tempfile::tempdir().unwrap();
    let w = Writer::start(Store::open(dir.path(), 0).unwrap(), Limits::default(), 1).unwrap();
    let sent = 100_000u64;
    let mut accepted = 0u64;
    // Recent timestamps: the writer prunes by age as it starts.
    let now = clock_ns(libc::CLOCK_REALTIME);
    for k in 0..sent {
        if w.send(evid(ev(now + k, EventKind::Reuse, 2.0, Some(Outcome::Ok)))) {
            accepted += 1;
        }
    }
    let dropped = w.dropped();
    assert_eq!(w.finish(), 0, "nothing refused");
    assert_eq!(accepted + dropped, sent);
    assert!(dropped > 0, "a one-record queue under a tight loop must overflow");
    let store = Store::open(dir.path(), 0).unwrap();
    assert_eq!(store.count().unwrap(), accepted, "everything accepted was written");
}

#[test]
fn schema_mismatch_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), 0).unwrap();
        store.conn.execute("UPDATE meta SET value = 99 WHERE key = 'schema'", []).unwrap();
    }
    let Err(e) = Store::open(dir.path(), 0) else { panic!("must fail") };
    assert!(e.to_string().contains("schema version 99"), "{e}");
}

#[test]
fn connection_storms_become_one_record_per_minute() {
    let mut v = ConnectionCounts::default();
    let mut out = Vec::new();
    for k in 0..100_000u64 {
        out.extend(v.add(key(&ev(T0 + k * 1_000_000, EventKind::Established, 0.0, None)), T0 + k * 1_000_000));
    }
    // 100 s of connections at 1 kHz: one record for each finished minute.
    out.extend(v.flush());
    let minutes: Vec<u64> = out
        .iter()
        .filter_map(|r| match r {
            Record::Connections { minute, connections, .. } => Some(*minute * 1_000_000 + *connections),
            _ => None,
        })
        .collect();
    assert!(minutes.len() <= 3, "{} records", minutes.len());
    let total: u64 = out
        .iter()
        .map(|r| match r {
            Record::Connections { connections, .. } => *connections,
            _ => 0,
        })
        .sum();
    assert_eq!(total, 100_000);
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path(), 0).unwrap();
    store.insert(&out).unwrap();
    let vol: u64 = store.volume("10.0.0.2:443", 0).unwrap().iter().map(|v| v.connections).sum();
    assert_eq!(vol, 100_000);
}

#[test]
fn a_bad_row_is_skipped_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path(), 0).unwrap();
    store.insert(&scenario()).unwrap();
    store
        .conn
        .execute(
            "INSERT INTO evidence (ts_unix_ns, destination, role, kind, event) VALUES (?1, '10.0.0.2:443', 'client', 'reuse', '{not json')",
            [i64::try_from(T0).unwrap()],
        )
        .unwrap();
    store
        .conn
        .execute("INSERT INTO changes (ts_unix_ns, destination, change) VALUES (1, '10.0.0.2:443', 'garbage')", [])
        .unwrap();
    let events = store.events(None, 0).unwrap();
    assert_eq!(events.len(), 46, "every good row, the bad one skipped");
    assert!(store.changes("10.0.0.2:443", 0).unwrap().is_empty(), "the garbage change skipped");
}

/// A store in a fresh directory holding 20,000 reuse records, one a
/// second from `T0`, checkpointed.
fn twenty_thousand_reuses() -> (tempfile::TempDir, Store) {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path(), 0).unwrap();
    let batch: Vec<Record> =
        (0..20_000u64).map(|k| evid(ev(T0 + k * S, EventKind::Reuse, 1.0 + k as f64, Some(Outcome::Ok)))).collect();
    store.insert(&batch).unwrap();
    store.compact().unwrap();
    (dir, store)
}

fn mode(p: &Path) -> u32 {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

#[test]
fn files_are_private() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let mut store = Store::open(&data, 0).unwrap();
    store.insert(&scenario()).unwrap();
    assert_eq!(mode(&data), 0o700);
    assert_eq!(mode(&data.join(DB_FILE)), 0o600);
    let wal = data.join(DB_FILE).with_extension("sqlite-wal");
    assert!(wal.exists());
    assert_eq!(mode(&wal), 0o600, "SQLite gives the WAL the database file's mode");
}

#[test]
fn every_table_counts_toward_the_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let mut store = Store::open(dir.path(), 0).unwrap();
    // Connection counts only: 30,000 destination-minutes and no evidence at all.
    let batch: Vec<Record> = (0..30_000u64)
        .map(|k| {
            let addr = format!("10.{}.{}.1:443", k % 100, k / 1000).parse().unwrap();
            let key = DestKey { dest: Destination::Addr(addr), role: Role::Client, netns: Netns::HOST };
            Record::Connections { minute: T0 / (60 * S) + k / 100, key, connections: 1 }
        })
        .collect();
    store.insert(&batch).unwrap();
    store.compact().unwrap();
    let before = store.size_bytes().unwrap();
    let limit = 256 * 1024;
    assert!(before > limit, "the test needs more than the limit ({before})");
    store.prune(T0, Limits { retention_ns: u64::MAX / 2, max_bytes: limit, ..Limits::default() }).unwrap();
    assert!(store.size_bytes().unwrap() <= limit);
}

/// A store written by schema 1 (the release before namespaces; made by
/// that release's `Store`, see `tests/fixtures/README.md`): 10.0.0.2:443
/// reached from two namespaces, one with failures, with one change.
const SCHEMA1: &[u8] = include_bytes!("../../../tests/fixtures/store-schema1.sqlite");

#[test]
fn schema_1_is_migrated_and_reports_pick_the_namespace() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join(DB_FILE), SCHEMA1).unwrap();
    let store = Store::open(dir.path(), 0).unwrap();
    let version: i64 = store.conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    let d = "10.0.0.2:443";
    let events = store.events(Some(d), 0).unwrap();
    assert_eq!(events.len(), 40 + 10, "40 reuses and 10 peer closes survive the migration");
    let untagged: i64 = store
        .conn
        .query_row(
            "SELECT COUNT(*) FROM evidence WHERE netns IS NULL OR netns != json_extract(event, '$.netns')",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(untagged, 0, "every evidence row took its namespace from its JSON");
    let volume = store.volume(d, 0).unwrap();
    assert_eq!(volume.iter().map(|v| v.connections).sum::<u64>(), 40);
    assert!(volume.iter().all(|v| v.netns.is_none()), "schema 1 counted connections without a namespace");
    let changes = store.changes(d, 0).unwrap();
    assert_eq!(changes.len(), 1);
    let role: String = store.conn.query_row("SELECT role FROM changes", [], |r| r.get(0)).unwrap();
    assert_eq!(role, "client");
    let input = |netns: Option<u32>| crate::surfaces::report::Input {
        destination: d.to_owned(),
        since_ns: 0,
        until_ns: T0 + 3000 * S,
        events: events.clone(),
        volume: volume.clone(),
        changes: changes.clone(),
        probes: Vec::new(),
        select: crate::diagnosis::table::Select { role: None, netns },
        host_netns: 0,
    };
    let a = crate::surfaces::report::build(&input(Some(4_026_532_284))).unwrap();
    assert_eq!((a.netns.inode(), a.summary.reuses, a.summary.failures), (Some(4_026_532_284), 20, 10));
    assert_eq!(a.changes.len(), 1, "the change was namespace A's");
    let b = crate::surfaces::report::build(&input(Some(4_026_532_301))).unwrap();
    assert_eq!((b.netns.inode(), b.summary.reuses, b.summary.failures), (Some(4_026_532_301), 20, 0));
    assert!(b.changes.is_empty());
    let asked = crate::surfaces::report::build(&input(None)).unwrap_err().to_string();
    assert!(asked.contains("--netns 4026532284") && asked.contains("--netns 4026532301"), "{asked}");
    // New writes carry their namespace; a reopened store is not migrated twice.
    drop(store);
    let mut store = Store::open(dir.path(), 0).unwrap();
    let mut e = ev(T0 + 4000 * S, EventKind::Established, 0.0, None);
    e.netns = 7;
    let mut volume = ConnectionCounts::default();
    volume.add(key(&e), e.ts_unix_ns);
    store.insert(&volume.flush()).unwrap();
    assert!(store.volume(d, 0).unwrap().iter().any(|v| v.netns == Some(Netns::from(Some(7))) && v.connections == 1));
}

#[test]
fn a_foreign_schema_is_refused_with_the_fix() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), 0).unwrap();
        store.conn.execute("UPDATE meta SET value = 99 WHERE key = 'schema'", []).unwrap();
    }
    let e = Store::open(dir.path(), 0).err().expect("schema 99 is refused").to_string();
    assert!(e.contains("schema version 99") && e.contains("--data-dir"), "{e}");
}

/// A file that is not `SQLite`, a damaged database and another program's
/// database are each refused with the file and the fix named, and left
/// byte for byte as they were.
#[test]
fn bad_store_files_are_named_and_left_untouched() {
    let check = |dir: &Path, want: &str| {
        let file = dir.join(DB_FILE);
        let before = std::fs::read(&file).unwrap();
        let e = match Store::open(dir, 0).and_then(|s| s.events(None, 0).map(|_| s)) {
            Ok(_) => panic!("{want}: opened"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(&file.display().to_string()), "{want}: the file is named: {e}");
        assert!(e.contains(want) && e.contains("--data-dir"), "{want}: {e}");
        assert!(!e.contains('\n'), "one line: {e}");
        let after = std::fs::read(&file).unwrap();
        let first_diff = before.iter().zip(&after).position(|(a, b)| a != b);
        assert!(
            after.len() == before.len() && first_diff.is_none(),
            "{want}: the file changed: {} -> {} bytes, first difference at {first_diff:?}",
            before.len(),
            after.len()
        );
        assert!(!dir.join("evidence.sqlite-wal").exists() || want == "damaged", "{want}: no WAL was started");
        e
    };
    // Not SQLite at all.
    let junk = tempfile::tempdir().unwrap();
    std::fs::write(junk.path().join(DB_FILE), vec![b'x'; 8192]).unwrap();
    let e1 = check(junk.path(), "not an SQLite database");
    // Another program's database.
    let other = tempfile::tempdir().unwrap();
    {
        let c = Connection::open(other.path().join(DB_FILE)).unwrap();
        c.execute_batch(
            "CREATE TABLE invoices (id INTEGER PRIMARY KEY, total REAL); INSERT INTO invoices VALUES (1, 9.5);",
        )
        .unwrap();
    }
    let e2 = check(other.path(), "another program");
    // Ours, with its data pages overwritten (the first page, the schema, intact).
    let bad = tempfile::tempdir().unwrap();
    {
        let mut s = Store::open(bad.path(), 0).unwrap();
        s.insert(&scenario()).unwrap();
        let many: Vec<Record> = (0..2000).map(|k| evid(ev(T0 + k, EventKind::Reuse, 2.0, Some(Outcome::Ok)))).collect();
        s.insert(&many).unwrap();
        s.compact().unwrap();
    }
    let file = bad.path().join(DB_FILE);
    let mut bytes = std::fs::read(&file).unwrap();
    let page = 4096;
    assert!(bytes.len() > 8 * page, "the store spans pages: {}", bytes.len());
    for b in &mut bytes[page..] {
        *b = 0xA5;
    }
    std::fs::write(&file, &bytes).unwrap();
    let e3 = check(bad.path(), "damaged");
    eprintln!("MEASURED bad store files:\n  {e1}\n  {e2}\n  {e3}");
}

/// A store that refuses writes (its table gone, as a removed file or a
/// full disk would) degrades the writer, which holds the batch, retries,
/// and writes everything once the store takes writes again.
#[test]
fn a_refusing_store_is_retried_and_resumes_without_loss() {
    let dir = tempfile::tempdir().unwrap();
    let side = Connection::open(dir.path().join(DB_FILE)).unwrap();
    let w = Writer::start(Store::open(dir.path(), 0).unwrap(), Limits::default(), QUEUE).unwrap();
    let state = w.state();
    let now = clock_ns(libc::CLOCK_REALTIME);
    side.execute_batch("ALTER TABLE evidence RENAME TO evidence_away").unwrap();
    for k in 0..50 {
        assert!(w.send(evid(ev(now + k, EventKind::Reuse, 2.0, Some(Outcome::Ok)))));
    }
    let until = Instant::now() + Duration::from_secs(5);
    while !state.degraded.load(Ordering::Relaxed) {
        assert!(Instant::now() < until, "the writer never saw the failure");
        std::thread::sleep(Duration::from_millis(20));
    }
    for k in 50..100 {
        assert!(w.send(evid(ev(now + k, EventKind::Reuse, 2.0, Some(Outcome::Ok)))));
    }
    side.execute_batch("ALTER TABLE evidence_away RENAME TO evidence").unwrap();
    let until = Instant::now() + Duration::from_secs(10);
    while state.degraded.load(Ordering::Relaxed) {
        assert!(Instant::now() < until, "writing never resumed");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(w.finish(), 0, "nothing given up");
    assert_eq!(Store::open(dir.path(), 0).unwrap().count().unwrap(), 100, "every record written after the pause");
}

/// At shutdown a store that still refuses is not waited for: what is
/// queued is given up and counted, every record of it.
#[test]
fn a_refusing_store_at_shutdown_counts_what_it_gives_up() {
    let dir = tempfile::tempdir().unwrap();
    let side = Connection::open(dir.path().join(DB_FILE)).unwrap();
    let w = Writer::start(Store::open(dir.path(), 0).unwrap(), Limits::default(), QUEUE).unwrap();
    side.execute_batch("ALTER TABLE evidence RENAME TO evidence_away").unwrap();
    let now = clock_ns(libc::CLOCK_REALTIME);
    for k in 0..300 {
        assert!(w.send(evid(ev(now + k, EventKind::Reuse, 2.0, Some(Outcome::Ok)))));
    }
    let started = Instant::now();
    assert_eq!(w.finish(), 300, "every queued record is counted");
    assert!(started.elapsed() < Duration::from_secs(10), "shutdown waited {:?}", started.elapsed());
}

/// A store that refuses longer than `--store-give-up` gives the held
/// batch up while the daemon runs (counted), and writes what comes once
/// it accepts again: stored and counted add up to what was sent.
#[test]
fn a_store_refusing_past_the_give_up_counts_and_goes_on() {
    let dir = tempfile::tempdir().unwrap();
    let side = Connection::open(dir.path().join(DB_FILE)).unwrap();
    let limits = Limits { give_up_after: Duration::from_secs(1), ..Limits::default() };
    let w = Writer::start(Store::open(dir.path(), 0).unwrap(), limits, QUEUE).unwrap();
    side.execute_batch("ALTER TABLE evidence RENAME TO evidence_away").unwrap();
    let now = clock_ns(libc::CLOCK_REALTIME);
    for k in 0..50 {
        assert!(w.send(evid(ev(now + k, EventKind::Reuse, 2.0, Some(Outcome::Ok)))));
        if k % 10 == 0 {
            // A minute's connection count: a record, not an event.
            let minute = now / 60_000_000_000 + k;
            let key = key(&ev(now, EventKind::Established, 0.0, None));
            assert!(w.send(Record::Connections { minute, key, connections: 7 }));
        }
    }
    let state = w.state();
    let deadline = Instant::now() + Duration::from_secs(20);
    while state.failed.load(Ordering::Relaxed) == 0 {
        assert!(Instant::now() < deadline, "nothing given up after 20 s of a refusing store");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(state.degraded.load(Ordering::Relaxed));
    side.execute_batch("ALTER TABLE evidence_away RENAME TO evidence").unwrap();
    for k in 50..60 {
        assert!(w.send(evid(ev(now + k, EventKind::Reuse, 2.0, Some(Outcome::Ok)))));
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while state.degraded.load(Ordering::Relaxed) {
        assert!(Instant::now() < deadline, "still degraded 20 s after the store accepts again");
        std::thread::sleep(Duration::from_millis(50));
    }
    let other = state.failed_other.load(Ordering::Relaxed);
    let all = w.finish();
    let (given_up, stored) = (all - other, Store::open(dir.path(), 0).unwrap().count().unwrap());
    assert!(given_up > 0 && stored > 0, "given up {given_up}, stored {stored}");
    assert_eq!(stored + given_up, 60, "every event stored or counted as an event");
    assert!(other <= 5, "the connection counts are counted apart: {other}");
}

#[test]
fn what_exists_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    // The daemon in an existing directory: it creates its database 0600
    // and leaves the directory as the operator made it.
    let mut store = Store::open(dir.path(), 0).unwrap();
    store.insert(&scenario()).unwrap();
    drop(store);
    assert_eq!(mode(dir.path()), 0o755);
    assert_eq!(mode(&dir.path().join(DB_FILE)), 0o600);
    // An existing database of ours keeps the mode its operator gave it.
    std::fs::set_permissions(dir.path().join(DB_FILE), std::fs::Permissions::from_mode(0o640)).unwrap();
    drop(Store::open(dir.path(), 0).unwrap());
    assert_eq!(mode(&dir.path().join(DB_FILE)), 0o640);
    // A foreign database is refused with its mode and bytes unchanged.
    let other = tempfile::tempdir().unwrap();
    let foreign = other.path().join(DB_FILE);
    Connection::open(&foreign).unwrap().execute_batch("CREATE TABLE t (x);").unwrap();
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o644)).unwrap();
    let bytes = std::fs::read(&foreign).unwrap();
    assert!(matches!(Store::open(other.path(), 0), Err(StoreError::Foreign { .. })));
    assert!(matches!(Store::open_read_only(other.path()), Err(StoreError::Foreign { .. })));
    assert_eq!((mode(&foreign), std::fs::read(&foreign).unwrap()), (0o644, bytes));
}

#[test]
fn a_reader_changes_nothing() {
    use std::os::unix::fs::PermissionsExt as _;
    // An empty directory: no store, a clear error, nothing created.
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let Err(e) = Store::open_read_only(dir.path()) else { panic!("an empty directory has no store") };
    assert!(matches!(e, StoreError::Missing { .. }), "{e}");
    assert!(e.to_string().contains("--data-dir"), "{e}");
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "nothing created");
    assert_eq!(mode(dir.path()), 0o755);
    // A store no daemon holds open (its WAL folded in at close) reads.
    let mut store = Store::open(dir.path(), 0).unwrap();
    store.insert(&scenario()).unwrap();
    let written = store.events(None, 0).unwrap().len();
    drop(store);
    let db = dir.path().join(DB_FILE);
    let before = std::fs::read(&db).unwrap();
    let mut reader = Store::open_read_only(dir.path()).unwrap();
    assert_eq!(reader.events(None, 0).unwrap().len(), written);
    assert!(reader.insert(&scenario()).is_err(), "read-only");
    drop(reader);
    assert_eq!(std::fs::read(&db).unwrap(), before, "the database's bytes are unchanged");
    // Beside a live writer it reads what was committed.
    let mut writer = Store::open(dir.path(), 0).unwrap();
    writer.insert(&scenario()).unwrap();
    assert_eq!(Store::open_read_only(dir.path()).unwrap().events(None, 0).unwrap().len(), 2 * written);
    // Schema 1 is the daemon's to migrate: a reader says so and leaves it.
    let old = tempfile::tempdir().unwrap();
    std::fs::write(old.path().join(DB_FILE), SCHEMA1).unwrap();
    let Err(e) = Store::open_read_only(old.path()) else { panic!("schema 1 is not read as 2") };
    assert!(matches!(e, StoreError::NotMigrated { .. }), "{e}");
    assert_eq!(std::fs::read(old.path().join(DB_FILE)).unwrap(), SCHEMA1);
}

/// A reader holding a snapshot (`observer report` on the live store) keeps
/// the WAL from being folded back; the size prune must not count that WAL
/// and go on deleting: it deletes down to the limit in live pages, and the
/// file shrinks once the reader lets go.
#[test]
fn a_reader_does_not_make_the_size_prune_delete_everything() {
    let (dir, mut store) = twenty_thousand_reuses();
    let before = store.size_bytes().unwrap();
    let limit = before / 2;
    let reader = Connection::open(dir.path().join(DB_FILE)).unwrap();
    reader.execute_batch("BEGIN").unwrap();
    let seen: i64 = reader.query_row("SELECT COUNT(*) FROM evidence", [], |r| r.get(0)).unwrap();
    assert_eq!(seen, 20_000);
    let p = store.prune(T0, Limits { retention_ns: u64::MAX / 2, max_bytes: limit, ..Limits::default() }).unwrap();
    let left = store.events(None, 0).unwrap().len();
    eprintln!(
        "MEASURED prune beside a reader: {before} bytes to a {limit}-byte limit: {left} of 20000 records kept, {} deleted",
        p.by_size
    );
    assert!(left >= 8_000, "a reader's snapshot made the prune delete {} of 20000 records", p.by_size);
    reader.execute_batch("COMMIT").unwrap();
    drop(reader);
    store.prune(T0, Limits { retention_ns: u64::MAX / 2, max_bytes: limit, ..Limits::default() }).unwrap();
    assert!(store.size_bytes().unwrap() <= limit, "the file shrinks once the reader lets go");
    assert_eq!(store.events(None, 0).unwrap().len(), left, "and nothing more is deleted for it");
}

fn probe_at(ts: u64, destination: &str) -> crate::diagnosis::probed::ProbeEvidence {
    crate::diagnosis::probed::ProbeEvidence {
        ts_unix_ns: ts,
        id: crate::diagnosis::key::RowId {
            destination: destination.to_owned(),
            role: Role::Client,
            netns: crate::diagnosis::key::Netns::from(Some(7)),
        },
        target: "api:443".to_owned(),
        first_exchange: "tls".to_owned(),
        how: crate::diagnosis::table::FailureMode::Fin,
        idle_timeout_seconds: Some(2.0),
        lower_seconds: 2.0,
        upper_seconds: Some(2.001),
        settled: true,
        connections: 8,
        elapsed_seconds: 9.5,
        interrupted: false,
    }
}

#[test]
fn schema_2_gains_the_probes_table_and_only_the_daemon_migrates_it() {
    let dir = tempfile::tempdir().unwrap();
    let written;
    {
        // Schema 2 is schema 3 without the probes table (and schema 3's
        // volume table is schema 4's with the key's index).
        let mut store = Store::open(dir.path(), 0).unwrap();
        store.insert(&scenario()).unwrap();
        written = store.events(None, 0).unwrap().len();
        store.conn.execute_batch("DROP TABLE probes; UPDATE meta SET value = 2 WHERE key = 'schema';").unwrap();
    }
    let db = dir.path().join(DB_FILE);
    let before = std::fs::read(&db).unwrap();
    for e in [Store::open_read_only(dir.path()).err(), Store::open_existing(dir.path()).err()] {
        let e = e.expect("schema 2 is not read or written as 3");
        assert!(matches!(e, StoreError::NotMigrated { found: 2, .. }), "{e}");
        assert!(e.to_string().contains("observer run --data-dir"), "{e}");
    }
    assert_eq!(std::fs::read(&db).unwrap(), before, "neither a reader nor a probe changed it");
    let store = Store::open(dir.path(), 0).unwrap();
    let version: i64 = store.conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| r.get(0)).unwrap();
    assert_eq!(version, SCHEMA_VERSION);
    assert_eq!(store.events(None, 0).unwrap().len(), written, "the evidence stays");
    assert!(store.probes_after(0, 0).unwrap().is_empty());
}

#[test]
fn a_probe_adds_to_an_existing_store_and_never_makes_one() {
    let empty = tempfile::tempdir().unwrap();
    let Err(e) = Store::open_existing(empty.path()) else { panic!("no store to add to") };
    assert!(matches!(e, StoreError::Missing { .. }), "{e}");
    assert_eq!(std::fs::read_dir(empty.path()).unwrap().count(), 0, "nothing created");

    let dir = tempfile::tempdir().unwrap();
    let mut daemon = Store::open(dir.path(), 0).unwrap();
    daemon.insert(&scenario()).unwrap();
    let mut probe = Store::open_existing(dir.path()).unwrap();
    probe.insert(&[Record::Probe(probe_at(T0 + 10 * S, "10.0.0.2:443"))]).unwrap();
    probe.insert(&[Record::Probe(probe_at(T0 + 20 * S, "10.0.0.3:443"))]).unwrap();
    drop(probe);
    // The daemon reads what came since the last id it saw.
    let all = daemon.probes_after(0, 0).unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].1, probe_at(T0 + 10 * S, "10.0.0.2:443"));
    let after = daemon.probes_after(all[0].0, 0).unwrap();
    assert_eq!(after.iter().map(|(_, p)| p.id.destination.as_str()).collect::<Vec<_>>(), ["10.0.0.3:443"]);
    assert_eq!(daemon.probes_after(0, T0 + 15 * S).unwrap().len(), 1, "since a time");
    // A report reads one destination's.
    assert_eq!(daemon.probes("10.0.0.3:443", 0).unwrap(), vec![probe_at(T0 + 20 * S, "10.0.0.3:443")]);
    assert!(daemon.probes("10.0.0.9:443", 0).unwrap().is_empty());
    // Retention takes them like any evidence.
    let limits = Limits { retention_ns: 100 * S, ..Limits::default() };
    daemon.prune(T0 + 115 * S, limits).unwrap();
    assert_eq!(daemon.probes_after(0, 0).unwrap().len(), 1);
}

/// Schema 3 filed evidence and connection counts under the raw inode
/// events carry, so the host's namespace was spelled two ways (its inode,
/// and 0 where it was not known). Schema 4 files both under the row key:
/// NULL, one row of counts per minute; another namespace keeps its inode.
#[test]
fn schema_3_files_the_hosts_namespace_once() {
    const HOST: u32 = 4_026_531_840;
    const POD: u32 = 4_026_532_301;
    let dir = tempfile::tempdir().unwrap();
    {
        let store = Store::open(dir.path(), 0).unwrap();
        // Schema 3's volume table, with rows as schema 3 wrote them.
        store
            .conn
            .execute_batch(&format!(
                "DROP TABLE volume;
                 CREATE TABLE volume (minute INTEGER NOT NULL, destination TEXT NOT NULL, role TEXT NOT NULL,
                     netns INTEGER NOT NULL, connections INTEGER NOT NULL,
                     PRIMARY KEY (minute, destination, role, netns));
                 INSERT INTO volume VALUES (100, '10.0.0.2:443', 'client', {HOST}, 3),
                     (100, '10.0.0.2:443', 'client', 0, 2), (100, '10.0.0.2:443', 'client', {POD}, 5),
                     (100, '10.0.0.2:443', 'client', -1, 1);
                 UPDATE meta SET value = 3 WHERE key = 'schema';"
            ))
            .unwrap();
        for (raw, k) in [(HOST, 1), (0, 2), (POD, 3)] {
            let mut e = ev(T0 + k, EventKind::Reuse, 5.0, Some(Outcome::Ok));
            e.netns = raw;
            let json = serde_json::to_string(&e).unwrap();
            store
                .conn
                .execute(
                    "INSERT INTO evidence (ts_unix_ns, destination, role, netns, kind, event)
                     VALUES (?1, '10.0.0.2:443', 'client', ?2, 'reuse', ?3)",
                    params![i64::try_from(e.ts_unix_ns).unwrap(), raw, json],
                )
                .unwrap();
        }
    }
    let Err(e) = Store::open_read_only(dir.path()) else { panic!("schema 3 is the daemon's to migrate") };
    assert!(e.to_string().contains("schema 3"), "{e}");
    let mut store = Store::open(dir.path(), HOST).unwrap();
    let version: i64 = store.conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| r.get(0)).unwrap();
    assert_eq!(version, 4);
    let filed: Vec<Option<i64>> = store
        .conn
        .prepare("SELECT netns FROM evidence ORDER BY ts_unix_ns")
        .unwrap()
        .query_map([], |r| r.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    assert_eq!(filed, [None, None, Some(i64::from(POD))]);
    let mut volume = store.volume("10.0.0.2:443", 0).unwrap();
    volume.sort_by_key(|v| v.netns);
    let got: Vec<(Option<Netns>, u64)> = volume.iter().map(|v| (v.netns, v.connections)).collect();
    assert_eq!(
        got,
        [(None, 1), (Some(Netns::HOST), 5), (Some(Netns::from(Some(POD))), 5)],
        "the host's two spellings summed; schema 1's unknown kept apart"
    );
    // A count of the host's row for a minute already stored adds to it.
    let k =
        DestKey { dest: Destination::Addr("10.0.0.2:443".parse().unwrap()), role: Role::Client, netns: Netns::HOST };
    store.insert(&[Record::Connections { minute: 100, key: k, connections: 4 }]).unwrap();
    let host: u64 = store
        .volume("10.0.0.2:443", 0)
        .unwrap()
        .iter()
        .filter(|v| v.netns == Some(Netns::HOST))
        .map(|v| v.connections)
        .sum();
    assert_eq!(host, 9);
    let rows: i64 = store.conn.query_row("SELECT COUNT(*) FROM volume", [], |r| r.get(0)).unwrap();
    assert_eq!(rows, 3, "one row per minute and key");
}

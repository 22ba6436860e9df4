//! The evidence store: every event the aggregator's feed kept
//! ([`Fed::stored`]: its evidence, and each name new to its row), estimate
//! changes and per-minute connection counts, in an embedded `SQLite`
//! database in WAL mode under `--data-dir`. The store never classifies:
//! [`keep`] takes the feed's word.
//!
//! - Writes are batched by a writer thread off the event path; when its
//!   queue is full the record is dropped and counted (`store_backlog`), so a
//!   slow disk never blocks event reading.
//! - WAL mode: a crash or `kill -9` loses what waits in the writer's queue
//!   (milliseconds under steady load); the database itself stays consistent.
//! - A refused write (a full disk) is held and retried, and given up and
//!   counted only after [`GIVE_UP_AFTER`] or at shutdown ([`WriterState`]).
//! - A file that is not `SQLite`, a damaged store and another program's
//!   database are refused unwritten ([`StoreError::Corrupt`],
//!   [`StoreError::Foreign`]).
//! - Bounded: records older than the retention are deleted, and the oldest
//!   tenth of every table goes while the database is above its size limit;
//!   pruning runs in the writer thread every minute.
//! - Connection counts are aggregated per minute in memory ([`ConnectionCounts`]) and
//!   written as one record per destination and minute, so a storm of new
//!   connections never pushes evidence out of the writer's queue.
//! - One stored row that does not decode is skipped with a warning.
//! - A directory it creates is 0700, a database it creates 0600; what
//!   exists keeps its mode. Readers open it read-only (`open.rs`).
//! - `observer probe` adds its result to the `probes` table of an
//!   existing store; the daemon reads new ones as they come.
//! - Every row carries its row key ([`DestKey`]): destination, role and
//!   network namespace, settled as rows name it (`netns` NULL: the
//!   host's). Older schemas are migrated in place by the daemon (`open.rs`).

use std::{
    path::{Path, PathBuf},
    time::Duration,
};

use log::warn;
use rusqlite::{params, Connection};

use crate::{
    diagnosis::aggregate::{Change, Fed},
    diagnosis::key::DestKey,
    diagnosis::probed::ProbeEvidence,
    kernel::event::{EventKind, SockEvent},
};

mod debug;
mod open;
mod volume;
mod writer;

pub use debug::{debug_evidence_keys, debug_write_evidence};
pub use volume::{ConnectionCount, ConnectionCounts};
pub use writer::{Writer, WriterState, GIVE_UP_AFTER, QUEUE, RETRY_EVERY};

/// Name of the database file in the data directory.
pub const DB_FILE: &str = "evidence.sqlite";
/// Schema 4: every table's `netns` is the row key's, settled (NULL: the
/// host's namespace); schema 3 added the `probes` table, schema 2 a
/// `netns` column on every table.
pub const SCHEMA_VERSION: i64 = 4;

/// What can go wrong with the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("creating the data directory {path}: {error}; choose another with --data-dir")]
    CreateDir { path: PathBuf, error: std::io::Error },
    #[error(
        "opening the evidence store {path}: {error}; check the file and the permissions, or choose another --data-dir"
    )]
    Open { path: PathBuf, error: rusqlite::Error },
    #[error("the evidence store {path} has schema version {found} (0: none), this observer understands 1 to {SCHEMA_VERSION}; use a matching observer or another --data-dir")]
    Schema { path: PathBuf, found: i64 },
    #[error("migrating the evidence store {path} from schema {from} to {SCHEMA_VERSION}: {error}; the file is unchanged (each step is one transaction): free disk space or choose another --data-dir")]
    Migrate { path: PathBuf, from: i64, error: rusqlite::Error },
    #[error("the evidence store {path} is not an SQLite database or is damaged ({error}); move the file aside (observer then starts a new store there) or choose another --data-dir")]
    Corrupt { path: PathBuf, error: rusqlite::Error },
    #[error("{path} is a database of another program (it has tables but no observer schema); observer leaves it untouched: choose another --data-dir")]
    Foreign { path: PathBuf },
    #[error("no evidence store at {path}: give the daemon's --data-dir (default /var/lib/observer), or a recording with --recording FILE")]
    Missing { path: PathBuf },
    #[error("the evidence store {path} has schema {found}, which only the daemon migrates (a reader or a probe never changes a store): run `observer run --data-dir` on it once (a daemon of this version), then read it")]
    NotMigrated { path: PathBuf, found: i64 },
    #[error("evidence store: {0}")]
    Sql(rusqlite::Error),
    #[error("evidence store: a stored record is not valid: {0}")]
    Record(serde_json::Error),
}

// By hand, not `#[from]`: the messages carry their cause, and a source
// as well would print it twice in an error chain.
impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        Self::Sql(e)
    }
}

impl From<serde_json::Error> for StoreError {
    fn from(e: serde_json::Error) -> Self {
        Self::Record(e)
    }
}

impl StoreError {
    /// A failed statement, named: a file that is not a database, or a
    /// damaged one, says so with the file and the fix.
    fn of(path: &Path, source: rusqlite::Error) -> Self {
        match source.sqlite_error_code() {
            Some(rusqlite::ErrorCode::NotADatabase | rusqlite::ErrorCode::DatabaseCorrupt) => {
                Self::Corrupt { path: path.to_path_buf(), error: source }
            }
            Some(
                rusqlite::ErrorCode::ReadOnly | rusqlite::ErrorCode::PermissionDenied | rusqlite::ErrorCode::CannotOpen,
            ) => Self::Open { path: path.to_path_buf(), error: source },
            _ => Self::Sql(source),
        }
    }
}

/// Limits of the store.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Records older than this are deleted (ns).
    pub retention_ns: u64,
    /// The database is kept below this size.
    pub max_bytes: u64,
    /// A batch refused this long is given up and counted (`store_error`).
    pub give_up_after: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self { retention_ns: 14 * 86_400 * 1_000_000_000, max_bytes: 256 * 1024 * 1024, give_up_after: GIVE_UP_AFTER }
    }
}

/// One thing to store.
#[derive(Debug, Clone)]
#[allow(clippy::large_enum_variant, reason = "events are nearly every record: boxing would cost an allocation each")]
pub enum Record {
    /// An event the feed kept ([`Fed::stored`]), stored as it is under
    /// its row's key.
    Evidence {
        key: DestKey,
        event: SockEvent,
    },
    Change(Change),
    /// What `observer probe` measured.
    Probe(ProbeEvidence),
    /// New connections to one destination in one minute.
    Connections {
        minute: u64,
        key: DestKey,
        connections: u64,
    },
}

impl Record {
    /// An event stored under its own row key (None: it has no
    /// destination), its namespace settled against `host_netns`.
    #[must_use]
    pub fn evidence(event: SockEvent, host_netns: u32) -> Option<Self> {
        DestKey::of_event(&event, host_netns).map(|key| Self::Evidence { key, event })
    }
}

/// What the store keeps of one fed event, handed to `send`: the changes
/// of estimate it caused, the event itself when the feed kept it
/// ([`Fed::stored`]), and an established connection as a per-minute count
/// (a connection storm sends one record per destination and minute, not
/// one per connection). The one rule the daemon stores by.
pub fn keep(ev: &SockEvent, fed: &Fed, volume: &mut ConnectionCounts, mut send: impl FnMut(Record)) {
    for c in &fed.changes {
        send(Record::Change(c.clone()));
    }
    let Some(key) = fed.key else { return };
    match ev.kind() {
        EventKind::Established => volume.add(key, ev.ts_unix_ns).into_iter().for_each(send),
        _ if fed.stored() => send(Record::Evidence { key, event: ev.clone() }),
        _ => {}
    }
}

/// What a prune did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub by_age: u64,
    pub by_size: u64,
}

/// An open store.
pub struct Store {
    conn: Connection,
    path: PathBuf,
}

impl Store {
    /// The database file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Write records in one transaction.
    pub fn insert(&mut self, records: &[Record]) -> Result<usize, StoreError> {
        let tx = self.conn.transaction()?;
        let mut n = 0;
        {
            let mut ev_stmt = tx.prepare_cached(
                "INSERT INTO evidence (ts_unix_ns, destination, role, netns, kind, event) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            )?;
            let mut vol_stmt = tx.prepare_cached(
                "INSERT INTO volume (minute, destination, role, netns, connections) VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (minute, destination, role, IFNULL(netns, 0)) DO UPDATE SET connections = connections + ?5",
            )?;
            let mut ch_stmt = tx.prepare_cached(
                "INSERT INTO changes (ts_unix_ns, destination, role, netns, change) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            let mut probe_stmt = tx.prepare_cached(
                "INSERT INTO probes (ts_unix_ns, destination, role, netns, probe) VALUES (?1, ?2, ?3, ?4, ?5)",
            )?;
            for r in records {
                match r {
                    Record::Evidence { key, event } => {
                        ev_stmt.execute(params![
                            i64::try_from(event.ts_unix_ns).unwrap_or(i64::MAX),
                            key.dest.to_string(),
                            key.role.as_str(),
                            key.netns.inode(),
                            event.kind().as_str(),
                            serde_json::to_string(event)?
                        ])?;
                        n += 1;
                    }
                    Record::Connections { minute, key, connections } => {
                        vol_stmt.execute(params![
                            i64::try_from(*minute).unwrap_or(i64::MAX),
                            key.dest.to_string(),
                            key.role.as_str(),
                            key.netns.inode(),
                            i64::try_from(*connections).unwrap_or(i64::MAX)
                        ])?;
                    }
                    Record::Probe(p) => {
                        probe_stmt.execute(params![
                            i64::try_from(p.ts_unix_ns).unwrap_or(i64::MAX),
                            p.id.destination,
                            p.id.role.as_str(),
                            p.id.netns.inode(),
                            serde_json::to_string(p)?
                        ])?;
                        n += 1;
                    }
                    Record::Change(c) => {
                        let ts = i64::try_from(c.ts_unix_ns).unwrap_or(i64::MAX);
                        ch_stmt.execute(params![
                            ts,
                            c.id.destination,
                            c.id.role.as_str(),
                            c.id.netns.inode(),
                            serde_json::to_string(c)?
                        ])?;
                        n += 1;
                    }
                }
            }
        }
        tx.commit()?;
        Ok(n)
    }

    /// Evidence events since `since_ns` (all destinations, or one), oldest first.
    pub fn events(&self, destination: Option<&str>, since_ns: u64) -> Result<Vec<SockEvent>, StoreError> {
        let mut out = Vec::new();
        self.each_event(destination, since_ns, |ev| out.push(ev))?;
        Ok(out)
    }

    /// Each evidence event since `since_ns`, oldest first, streamed: a
    /// start-up over millions of stored records never holds them at once.
    /// Returns the number of events given.
    pub fn each_event(
        &self,
        destination: Option<&str>,
        since_ns: u64,
        mut f: impl FnMut(SockEvent),
    ) -> Result<u64, StoreError> {
        let since = i64::try_from(since_ns).unwrap_or(i64::MAX);
        let fail = |e| StoreError::of(&self.path, e);
        let (mut n, mut bad) = (0u64, 0u64);
        let mut push = |json: &str| match serde_json::from_str(json) {
            Ok(ev) => {
                f(ev);
                n += 1;
            }
            Err(e) => {
                if bad == 0 {
                    warn!("evidence store {}: skipping a stored event that does not decode: {e}", self.path.display());
                }
                bad += 1;
            }
        };
        let (sql, args): (&str, Vec<Box<dyn rusqlite::ToSql>>) = match destination {
            Some(d) => (
                "SELECT event FROM evidence WHERE destination = ?1 AND ts_unix_ns >= ?2 ORDER BY ts_unix_ns, id",
                vec![Box::new(d.to_owned()), Box::new(since)],
            ),
            None => {
                ("SELECT event FROM evidence WHERE ts_unix_ns >= ?1 ORDER BY ts_unix_ns, id", vec![Box::new(since)])
            }
        };
        let mut stmt = self.conn.prepare(sql).map_err(fail)?;
        let mut rows = stmt.query(rusqlite::params_from_iter(args.iter())).map_err(fail)?;
        while let Some(row) = rows.next().map_err(fail)? {
            let json = row.get_ref(0).map_err(fail)?.as_str().map_err(|e| fail(e.into()))?;
            push(json);
        }
        if bad > 1 {
            warn!("evidence store {}: skipped {bad} stored events that do not decode", self.path.display());
        }
        Ok(n)
    }

    /// Estimate changes for a destination since `since_ns`.
    pub fn changes(&self, destination: &str, since_ns: u64) -> Result<Vec<Change>, StoreError> {
        let since = i64::try_from(since_ns).unwrap_or(i64::MAX);
        let mut stmt = self.conn.prepare(
            "SELECT change FROM changes WHERE destination = ?1 AND ts_unix_ns >= ?2 ORDER BY ts_unix_ns, id",
        )?;
        let rows = stmt.query_map(params![destination, since], |r| r.get::<_, String>(0))?;
        let mut out = Vec::new();
        for r in rows {
            match serde_json::from_str(&r?) {
                Ok(c) => out.push(c),
                Err(e) => {
                    warn!("evidence store {}: skipping a stored change that does not decode: {e}", self.path.display());
                }
            }
        }
        Ok(out)
    }

    /// At most this many probes are read at once: the store keeps every
    /// probe of the retention, and one reader must not hold them all.
    pub const MAX_PROBES_READ: usize = 1024;

    /// Probes stored after row `after_id` and since `since_ns`, oldest
    /// first, each with its row id (the next call's `after_id`); at most
    /// [`Self::MAX_PROBES_READ`]. One that does not decode is skipped.
    pub fn probes_after(&self, after_id: i64, since_ns: u64) -> Result<Vec<(i64, ProbeEvidence)>, StoreError> {
        let since = i64::try_from(since_ns).unwrap_or(i64::MAX);
        self.probe_rows(
            "SELECT id, probe FROM probes WHERE id > ?1 AND ts_unix_ns >= ?2 ORDER BY id LIMIT ?3",
            &[&after_id, &since],
        )
    }

    /// The latest probes of one destination since `since_ns` (at most
    /// [`Self::MAX_PROBES_READ`]), oldest first.
    pub fn probes(&self, destination: &str, since_ns: u64) -> Result<Vec<ProbeEvidence>, StoreError> {
        let since = i64::try_from(since_ns).unwrap_or(i64::MAX);
        let mut rows = self.probe_rows(
            "SELECT id, probe FROM probes WHERE destination = ?1 AND ts_unix_ns >= ?2 ORDER BY id DESC LIMIT ?3",
            &[&destination, &since],
        )?;
        rows.reverse();
        Ok(rows.into_iter().map(|(_, p)| p).collect())
    }

    /// `(id, probe)` rows of `sql`, whose last parameter is the limit.
    fn probe_rows(&self, sql: &str, args: &[&dyn rusqlite::ToSql]) -> Result<Vec<(i64, ProbeEvidence)>, StoreError> {
        let fail = |e| StoreError::of(&self.path, e);
        let mut stmt = self.conn.prepare(sql).map_err(fail)?;
        let limit = i64::try_from(Self::MAX_PROBES_READ).unwrap_or(i64::MAX);
        let mut all: Vec<&dyn rusqlite::ToSql> = args.to_vec();
        all.push(&limit);
        let rows =
            stmt.query_map(all.as_slice(), |r| Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?))).map_err(fail)?;
        let mut out = Vec::new();
        for r in rows {
            let (id, json) = r.map_err(fail)?;
            match serde_json::from_str(&json) {
                Ok(p) => out.push((id, p)),
                Err(e) => {
                    warn!("evidence store {}: skipping a stored probe that does not decode: {e}", self.path.display());
                }
            }
        }
        Ok(out)
    }

    /// Number of evidence records.
    pub fn count(&self) -> Result<u64, StoreError> {
        let n: i64 = self.conn.query_row("SELECT COUNT(*) FROM evidence", [], |r| r.get(0))?;
        Ok(u64::try_from(n).unwrap_or(0))
    }

    /// Size of the database in bytes (pages in use and free, plus the WAL).
    pub fn size_bytes(&self) -> Result<u64, StoreError> {
        let pages: i64 = self.conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
        let page: i64 = self.conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        let wal = std::fs::metadata(self.path.with_extension("sqlite-wal")).map_or(0, |m| m.len());
        Ok(u64::try_from(pages * page).unwrap_or(0) + wal)
    }

    /// Bytes of the pages in use (the database as this connection sees
    /// it, free pages excluded; the WAL not counted).
    fn live_bytes(&self) -> Result<u64, StoreError> {
        let pages: i64 = self.conn.query_row("PRAGMA page_count", [], |r| r.get(0))?;
        let free: i64 = self.conn.query_row("PRAGMA freelist_count", [], |r| r.get(0))?;
        let page: i64 = self.conn.query_row("PRAGMA page_size", [], |r| r.get(0))?;
        Ok(u64::try_from((pages - free) * page).unwrap_or(0))
    }

    /// Apply retention by age, then by size, and give the space back.
    pub fn prune(&mut self, now_ns: u64, limits: Limits) -> Result<Pruned, StoreError> {
        let cutoff = i64::try_from(now_ns.saturating_sub(limits.retention_ns)).unwrap_or(i64::MAX);
        let mut pruned = Pruned::default();
        let n = self.conn.execute("DELETE FROM evidence WHERE ts_unix_ns < ?1", [cutoff])?;
        self.conn.execute("DELETE FROM changes WHERE ts_unix_ns < ?1", [cutoff])?;
        self.conn.execute("DELETE FROM probes WHERE ts_unix_ns < ?1", [cutoff])?;
        self.conn.execute("DELETE FROM volume WHERE minute < ?1", [cutoff / 60_000_000_000])?;
        pruned.by_age = n as u64;
        self.compact()?;
        // Oldest tenth at a time until the live pages are under the limit.
        // Not the file's size: a reader's snapshot (`observer report` on
        // the live store) keeps the WAL from folding back, and counting it
        // deleted nearly everything (20,000 records to 28 in a test). The
        // WAL shrinks at the next checkpoint after the reader lets go.
        let mut rounds = 0;
        while self.live_bytes()? > limits.max_bytes && rounds < 64 {
            // Every table counts toward the limit: the oldest tenth of each.
            let mut deleted = 0;
            for (table, order) in [
                ("evidence", "ts_unix_ns, id"),
                ("changes", "ts_unix_ns, id"),
                ("probes", "ts_unix_ns, id"),
                ("volume", "minute, destination, role"),
            ] {
                let total: i64 = self.conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))?;
                if total == 0 {
                    continue;
                }
                let n = self.conn.execute(
                    &format!(
                        "DELETE FROM {table} WHERE rowid IN (SELECT rowid FROM {table} ORDER BY {order} LIMIT ?1)"
                    ),
                    [(total / 10).max(1)],
                )?;
                if table == "evidence" {
                    pruned.by_size += n as u64;
                }
                deleted += n;
            }
            if deleted == 0 {
                break;
            }
            rounds += 1;
        }
        if rounds > 0 {
            self.compact()?;
        }
        Ok(pruned)
    }

    fn compact(&self) -> Result<(), StoreError> {
        // Each step of incremental_vacuum frees one page: run it to the end.
        let mut stmt = self.conn.prepare("PRAGMA incremental_vacuum")?;
        let mut rows = stmt.query([])?;
        while rows.next()?.is_some() {}
        // Fold the WAL back and truncate it so the size bound covers it.
        self.conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))?;
        Ok(())
    }

    /// `PRAGMA integrity_check` says "ok".
    pub fn integrity_ok(&self) -> Result<bool, StoreError> {
        let r: String = self.conn.query_row("PRAGMA integrity_check", [], |r| r.get(0))?;
        Ok(r == "ok")
    }
}

#[cfg(test)]
mod tests;

//! Opening the evidence store. The daemon opens it read-write: it creates
//! the directory (0700) and the database (0600) when they are missing,
//! checks the schema before it writes anything, and migrates schemas 1
//! to 3. `observer probe` opens an existing store read-write to add its
//! result, and does nothing else. Readers (`report`, `debug
//! evidence-keys`) open it read-only: they never
//! create, chmod, migrate or switch the journal mode of what they are
//! given (`SQLite` may add its own `-wal`/`-shm` side files to read a WAL
//! store that no daemon holds open).

use std::{
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _, PermissionsExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use rusqlite::{Connection, OpenFlags, OptionalExtension as _};

use super::{Store, StoreError, DB_FILE, SCHEMA_VERSION};

/// Schema 4, as a fresh store creates it: these, [`PROBES_TABLE`] and
/// [`VOLUME_TABLE`]. `netns` is the row key's (NULL: the host's
/// namespace, else another namespace's inode), except in `probes`.
const SCHEMA: &str = "CREATE TABLE evidence (
         id INTEGER PRIMARY KEY,
         ts_unix_ns INTEGER NOT NULL,
         destination TEXT NOT NULL,
         role TEXT NOT NULL,
         netns INTEGER,
         kind TEXT NOT NULL,
         event TEXT NOT NULL);
     CREATE INDEX evidence_ts ON evidence(ts_unix_ns);
     CREATE INDEX evidence_dest ON evidence(destination, ts_unix_ns);
     CREATE TABLE changes (
         id INTEGER PRIMARY KEY,
         ts_unix_ns INTEGER NOT NULL,
         destination TEXT NOT NULL,
         role TEXT,
         netns INTEGER,
         change TEXT NOT NULL);";

/// Schema 4's connection counts: one row per minute and row key. `netns`
/// -1 marks counts schema 1 stored without a namespace; the unique index
/// treats the host's NULL as one value.
const VOLUME_TABLE: &str = "CREATE TABLE volume (
         minute INTEGER NOT NULL,
         destination TEXT NOT NULL,
         role TEXT NOT NULL,
         netns INTEGER,
         connections INTEGER NOT NULL);
     CREATE UNIQUE INDEX volume_key ON volume(minute, destination, role, IFNULL(netns, 0));";

/// Schema 3 to 4 in one transaction: the raw namespace inodes evidence
/// and connection counts were filed under become the row key's, settled
/// against this host's namespace (`host`; it and 0 become NULL; changes
/// were settled already); connection counts move to [`VOLUME_TABLE`],
/// summed where two raw spellings meet. Probes keep the inode of the
/// namespace the probe ran in: a probe cannot always tell the host's (it
/// may not read PID 1's), so the daemon settles it when it takes one.
fn migrate_3_to_4(conn: &Connection, host: u32) -> rusqlite::Result<()> {
    let settled = format!("CASE WHEN netns = 0 OR netns = {host} THEN NULL ELSE netns END");
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE;
         UPDATE evidence SET netns = {settled};
         ALTER TABLE volume RENAME TO volume3;
         DROP INDEX IF EXISTS volume_key;
         {VOLUME_TABLE}
         INSERT INTO volume SELECT minute, destination, role, {settled}, SUM(connections) FROM volume3
             GROUP BY minute, destination, role, {settled};
         DROP TABLE volume3;
         UPDATE meta SET value = 4 WHERE key = 'schema';
         COMMIT;"
    ))
    .inspect_err(|_| {
        let _ = conn.execute_batch("ROLLBACK");
    })
}

/// What schema 3 added: `observer probe`'s results, each filed under the
/// inode of the namespace the probe ran in.
const PROBES_TABLE: &str = "CREATE TABLE probes (
         id INTEGER PRIMARY KEY,
         ts_unix_ns INTEGER NOT NULL,
         destination TEXT NOT NULL,
         role TEXT NOT NULL,
         netns INTEGER,
         probe TEXT NOT NULL);
     CREATE INDEX probes_ts ON probes(ts_unix_ns);";

/// Schema 2 to 3: the `probes` table, empty.
fn migrate_2_to_3(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(&format!(
        "BEGIN IMMEDIATE; {PROBES_TABLE} UPDATE meta SET value = 3 WHERE key = 'schema'; COMMIT;"
    ))
    .inspect_err(|_| {
        let _ = conn.execute_batch("ROLLBACK");
    })
}

/// Schema 1 to 2 in one transaction: evidence and changes take their
/// namespace (and a change its role) from their stored JSON; connection
/// counts, which never had one, get -1 (read back as unknown).
fn migrate_1_to_2(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "BEGIN IMMEDIATE;
         ALTER TABLE evidence ADD COLUMN netns INTEGER;
         UPDATE evidence SET netns = json_extract(event, '$.netns') WHERE json_valid(event);
         ALTER TABLE changes ADD COLUMN role TEXT;
         ALTER TABLE changes ADD COLUMN netns INTEGER;
         UPDATE changes SET role = json_extract(change, '$.role'), netns = json_extract(change, '$.netns')
             WHERE json_valid(change);
         CREATE TABLE volume2 (
             minute INTEGER NOT NULL,
             destination TEXT NOT NULL,
             role TEXT NOT NULL,
             netns INTEGER NOT NULL,
             connections INTEGER NOT NULL,
             PRIMARY KEY (minute, destination, role, netns));
         INSERT INTO volume2 SELECT minute, destination, role, -1, connections FROM volume;
         DROP TABLE volume;
         ALTER TABLE volume2 RENAME TO volume;
         UPDATE meta SET value = 2 WHERE key = 'schema';
         COMMIT;",
    )
    .inspect_err(|_| {
        let _ = conn.execute_batch("ROLLBACK");
    })
}

/// The names of the database's tables.
fn tables(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare("SELECT name FROM sqlite_master WHERE type = 'table'")?;
    let names = stmt.query_map([], |r| r.get(0))?.collect();
    names
}

impl Store {
    /// Open (or create) the store in `dir`, read-write: the daemon's and
    /// the crash tests' writer. `host_netns` is this host's namespace
    /// inode (0: not known), for the migration from schema 3.
    pub fn open(dir: &Path, host_netns: u32) -> Result<Self, StoreError> {
        let dir_err = |error| StoreError::CreateDir { path: dir.to_path_buf(), error };
        // Evidence names peers and processes: what observer creates is
        // private to the daemon's user. A directory or file that exists is
        // the operator's, and its mode is theirs.
        if !dir.is_dir() {
            std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir).map_err(dir_err)?;
            std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).map_err(dir_err)?;
        }
        let path = dir.join(DB_FILE);
        let open_err = |error: std::io::Error| StoreError::Open {
            path: path.clone(),
            error: rusqlite::Error::ToSqlConversionFailure(Box::new(error)),
        };
        // SQLite gives its -wal and -shm files the database file's mode.
        match std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path) {
            Ok(_) => std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(open_err)?,
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(open_err(e)),
        }
        let conn = Connection::open(&path).map_err(|error| StoreError::Open { path: path.clone(), error })?;
        let fail = |source| StoreError::of(&path, source);
        // Read before anything is written: a foreign or damaged file is
        // refused unchanged, never given a schema or a journal mode.
        let tables = tables(&conn).map_err(fail)?;
        let ours = tables.iter().any(|t| t == "meta");
        if !tables.is_empty() && !ours {
            return Err(StoreError::Foreign { path });
        }
        let setup = || -> rusqlite::Result<()> {
            conn.busy_timeout(Duration::from_secs(5))?;
            if tables.is_empty() {
                // auto_vacuum must be set before the first table exists.
                conn.pragma_update(None, "auto_vacuum", "INCREMENTAL")?;
                conn.execute_batch("CREATE TABLE meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);")?;
            }
            // Both are no-ops on a store that has them: an existing file
            // is not written before its schema was checked.
            conn.pragma_update(None, "journal_mode", "WAL")?;
            conn.pragma_update(None, "synchronous", "NORMAL")
        };
        setup().map_err(fail)?;
        let version: Option<i64> =
            conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| r.get(0)).optional().map_err(fail)?;
        let fresh = !tables.iter().any(|t| t == "evidence");
        match version {
            None if fresh => {
                conn.execute_batch(SCHEMA).map_err(fail)?;
                conn.execute_batch(PROBES_TABLE).map_err(fail)?;
                conn.execute_batch(VOLUME_TABLE).map_err(fail)?;
                conn.execute("INSERT INTO meta (key, value) VALUES ('schema', ?1)", [SCHEMA_VERSION]).map_err(fail)?;
            }
            Some(v) if v == SCHEMA_VERSION => {}
            Some(from @ 1..=3) => {
                let migrate = |error| StoreError::Migrate { path: path.clone(), from, error };
                if from == 1 {
                    migrate_1_to_2(&conn).map_err(migrate)?;
                }
                if from <= 2 {
                    migrate_2_to_3(&conn).map_err(migrate)?;
                }
                migrate_3_to_4(&conn, host_netns).map_err(migrate)?;
            }
            found => return Err(StoreError::Schema { path, found: found.unwrap_or(0) }),
        }
        Ok(Self { conn, path })
    }

    /// Open the store in `dir` read-write as it is, for `observer probe`:
    /// it adds its result to the daemon's store and nothing else. A
    /// missing store is not created (root's new file would lock out the
    /// daemon's user), and one of another schema is neither migrated nor
    /// written (the daemon owns both).
    pub fn open_existing(dir: &Path) -> Result<Self, StoreError> {
        Self::open_as_is(dir, OpenFlags::SQLITE_OPEN_READ_WRITE)
    }

    /// Open the store in `dir` read-only, as it is: a missing store, a
    /// foreign database or another schema is an error, and nothing is
    /// written.
    pub fn open_read_only(dir: &Path) -> Result<Self, StoreError> {
        Self::open_as_is(dir, OpenFlags::SQLITE_OPEN_READ_ONLY)
    }

    /// Open an existing store with `mode` (read-only or read-write), never
    /// creating it.
    fn open_as_is(dir: &Path, mode: OpenFlags) -> Result<Self, StoreError> {
        let path = dir.join(DB_FILE);
        if !path.is_file() {
            return Err(StoreError::Missing { path });
        }
        let conn = Connection::open_with_flags(&path, mode | OpenFlags::SQLITE_OPEN_NO_MUTEX)
            .map_err(|error| StoreError::Open { path: path.clone(), error })?;
        let fail = |source| StoreError::of(&path, source);
        conn.busy_timeout(Duration::from_secs(5)).map_err(fail)?;
        Self::checked(conn, path)
    }

    /// A store opened as it is, if it has this observer's schema.
    fn checked(conn: Connection, path: PathBuf) -> Result<Self, StoreError> {
        let fail = |source| StoreError::of(&path, source);
        let tables = tables(&conn).map_err(fail)?;
        if !tables.iter().any(|t| t == "meta") {
            return Err(if tables.is_empty() {
                StoreError::Schema { path, found: 0 }
            } else {
                StoreError::Foreign { path }
            });
        }
        let version: Option<i64> =
            conn.query_row("SELECT value FROM meta WHERE key = 'schema'", [], |r| r.get(0)).optional().map_err(fail)?;
        match version {
            Some(v) if v == SCHEMA_VERSION => Ok(Self { conn, path }),
            Some(found @ 1..=3) => Err(StoreError::NotMigrated { path, found }),
            found => Err(StoreError::Schema { path, found: found.unwrap_or(0) }),
        }
    }
}

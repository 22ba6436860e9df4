//! New connections per row and minute: counted in memory
//! ([`ConnectionCounts`], so a connection storm sends one record per row
//! and minute to the writer, never one per connection), written to the
//! `volume` table, and read back for a report's timeline.

use std::collections::HashMap;

use rusqlite::params;

use super::{Record, Store, StoreError};
use crate::{
    diagnosis::key::{DestKey, Netns},
    kernel::event::Role,
};

/// New connections of one row in one minute, as stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCount {
    /// Unix minute.
    pub minute: u64,
    pub role: Role,
    /// The row's namespace; None for counts stored by schema 1, which
    /// kept none (a report counts them for every namespace of the role).
    pub netns: Option<Netns>,
    pub connections: u64,
}

/// `volume.netns` of the counts schema 1 stored, which had no namespace.
pub(super) const NETNS_NOT_RECORDED: i64 = -1;

/// Per-minute connection counts, aggregated in memory before they reach
/// the writer: one record per row key and minute.
#[derive(Debug, Default)]
pub struct ConnectionCounts {
    minute: u64,
    counts: HashMap<DestKey, u64>,
}

impl ConnectionCounts {
    /// Rows counted per minute; the rest are counted as their role's
    /// `other` row.
    pub const MAX_KEYS: usize = 4096;

    /// Count a new connection of row `key` at `ts_unix_ns`; returns the
    /// previous minute's records once a new minute starts.
    pub fn add(&mut self, key: DestKey, ts_unix_ns: u64) -> Vec<Record> {
        let minute = ts_unix_ns / 60_000_000_000;
        let out = if minute > self.minute { self.flush() } else { Vec::new() };
        self.minute = self.minute.max(minute);
        let key = if self.counts.contains_key(&key) || self.counts.len() < Self::MAX_KEYS {
            key
        } else {
            DestKey::other(key.role)
        };
        *self.counts.entry(key).or_default() += 1;
        out
    }

    /// The records of the minute counted so far.
    pub fn flush(&mut self) -> Vec<Record> {
        let minute = self.minute;
        self.counts.drain().map(|(key, connections)| Record::Connections { minute, key, connections }).collect()
    }
}

impl Store {
    /// New connections per minute for a destination, per role and namespace.
    pub fn volume(&self, destination: &str, since_ns: u64) -> Result<Vec<ConnectionCount>, StoreError> {
        let since = i64::try_from(since_ns / 60_000_000_000).unwrap_or(i64::MAX);
        let mut stmt = self.conn.prepare(
            "SELECT minute, role, netns, SUM(connections) FROM volume WHERE destination = ?1 AND minute >= ?2
             GROUP BY minute, role, netns ORDER BY minute",
        )?;
        let rows = stmt.query_map(params![destination, since], |r| {
            Ok((r.get::<_, i64>(0)?, r.get::<_, String>(1)?, r.get::<_, Option<i64>>(2)?, r.get::<_, i64>(3)?))
        })?;
        let mut out = Vec::new();
        for r in rows {
            let (m, role, netns, c) = r?;
            let Some(role) = Role::parse(&role) else { continue };
            let netns = match netns {
                Some(NETNS_NOT_RECORDED) => None,
                Some(n) => Some(Netns::from(u32::try_from(n).ok())),
                None => Some(Netns::HOST),
            };
            out.push(ConnectionCount {
                minute: u64::try_from(m).unwrap_or(0),
                role,
                netns,
                connections: u64::try_from(c).unwrap_or(0),
            });
        }
        Ok(out)
    }
}

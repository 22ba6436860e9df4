//! `observer debug write-evidence`: synthetic evidence as fast as the store
//! takes it, for the crash tests; `observer debug evidence-keys`: what a
//! recording holds as evidence and what a store holds, line for line, for
//! the soak's accounting.

use anyhow::{Context as _, Result};

use super::{Record, Store};
use crate::{
    diagnosis::aggregate::{Aggregator, Config},
    kernel::event::clock_ns,
};

/// Writes batches of synthetic evidence, forever (tests kill it with
/// SIGKILL) or until `records` are written, over `destinations`.
pub fn debug_write_evidence(dir: &std::path::Path, records: Option<u64>, destinations: u16) -> Result<()> {
    let host_netns = crate::kernel::owner::host_netns();
    let mut store = Store::open(dir, host_netns)?;
    let mut k: u64 = 0;
    let destinations = u64::from(destinations.max(1));
    while records.is_none_or(|n| k < n) {
        let now = clock_ns(libc::CLOCK_REALTIME);
        // Each batch is one transaction: 500 for the kill test's steps,
        // 5,000 when a count is asked for (a large store written fast).
        let n = records.map_or(500, |r| (r - k).min(5_000));
        let batch: Vec<Record> = (0..n)
            .filter_map(|i| {
                k += 1;
                let mut e = crate::kernel::event::SockEvent::new(
                    now + i,
                    crate::kernel::event::EventKind::Reuse,
                    crate::kernel::event::Role::Client,
                    std::net::SocketAddr::from(([10, 0, 0, 1], 40000)),
                    std::net::SocketAddr::from((
                        [10, 0, 0, 2],
                        u16::try_from(443 + k % destinations).unwrap_or(u16::MAX),
                    )),
                    #[allow(clippy::cast_precision_loss, reason = "synthetic idle ages")]
                    ((k % 120) as f64),
                );
                e.comm = "writer".into();
                e.sock_id = k;
                Record::evidence(e, host_netns)
            })
            .collect();
        store.insert(&batch)?;
        println!("{k}");
    }
    Ok(())
}

/// One line per evidence event: of a recording (what the aggregator's
/// feed takes as evidence, replayed), or of a store (all its evidence; the
/// names it keeps are none).
pub fn debug_evidence_keys(recording: Option<&std::path::Path>, data_dir: Option<&std::path::Path>) -> Result<()> {
    use std::io::Write as _;
    let key = |e: &crate::kernel::event::SockEvent| {
        format!("{} {} {} {}", e.ts_unix_ns, e.kind().as_str(), e.local, e.remote)
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if let Some(path) = recording {
        let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let mut agg = Aggregator::new(Config::default());
        for e in crate::surfaces::status::read_recording(file)? {
            if agg.feed(&e).ingested.is_some() {
                writeln!(out, "{}", key(&e))?;
            }
        }
    }
    if let Some(dir) = data_dir {
        let store = Store::open_read_only(dir)?;
        let mut failed = None;
        store.each_event(None, 0, |e| {
            // Names are stored beside the evidence; they are no evidence.
            if failed.is_none() && e.kind() != crate::kernel::event::EventKind::ServerName {
                failed = writeln!(out, "{}", key(&e)).err();
            }
        })?;
        if let Some(e) = failed {
            return Err(e.into());
        }
    }
    out.flush()?;
    Ok(())
}

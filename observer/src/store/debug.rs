//! `observer debug write-evidence`: synthetic evidence as fast as the store
//! takes it, for the crash tests.

use anyhow::Result;

use super::{Record, Store};
use crate::event::clock_ns;

/// Writes batches of synthetic evidence forever; tests kill it with SIGKILL.
pub fn debug_write_evidence(dir: &std::path::Path) -> Result<()> {
    let mut store = Store::open(dir)?;
    let mut k: u64 = 0;
    loop {
        let now = clock_ns(libc::CLOCK_REALTIME);
        let batch: Vec<Record> = (0..500)
            .map(|i| {
                k += 1;
                let mut e = crate::event::SockEvent::new(
                    now + i,
                    crate::event::EventKind::Reuse,
                    crate::event::Role::Client,
                    std::net::SocketAddr::from(([10, 0, 0, 1], 40000)),
                    std::net::SocketAddr::from(([10, 0, 0, 2], 443)),
                    #[allow(clippy::cast_precision_loss, reason = "synthetic idle ages")]
                    ((k % 120) as f64),
                );
                e.comm = "writer".into();
                e.outcome = Some(crate::event::Outcome::Ok);
                e.sock_id = k;
                Record::Event(e)
            })
            .collect();
        store.insert(&batch)?;
        println!("{k}");
    }
}

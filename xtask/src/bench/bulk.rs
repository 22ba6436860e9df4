//! What observer costs bulk transfers: loopback streams of large writes
//! (a backup, an upload) that never stop, the send and receive probes
//! detached and re-attached between windows (one daemon, `--bench-toggle`:
//! in a bulk transfer they are the only programs that run per byte), in
//! blocks of four windows (with, without, without, with) so a drift of
//! the machine's speed cancels out of each block's ratio, as in the
//! interleaved hot path; separate runs, whole daemons against none, swing
//! by a third here. Then one more run of the shipped daemon with the
//! kernel's BPF statistics on: each program's runs and ns per MB (the
//! send tracepoint fires once per chunk it queues on 6.16+, not once per
//! write).

use std::{
    io::{Read as _, Write as _},
    net::{Shutdown, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};
use serde_json::{json, Value};

use super::{
    control::{per_run, shipped_bin, tmp, Observer},
    sh, stats, Plan,
};

/// Streams at once, and the size of each write.
const STREAMS: usize = 4;
const WRITE_BYTES: usize = 256 * 1024;

/// `STREAMS` loopback connections, each writing `WRITE_BYTES` at a time
/// into a reader that discards them.
struct Bulk {
    stop: Arc<AtomicBool>,
    /// Writers wait while set (while the probes change).
    paused: Arc<AtomicBool>,
    bytes: Arc<AtomicU64>,
    writers: Vec<thread::JoinHandle<std::io::Result<()>>>,
    readers: thread::JoinHandle<()>,
}

impl Bulk {
    fn start() -> Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let bytes = Arc::new(AtomicU64::new(0));
        let readers = thread::spawn(move || {
            let mut handles = Vec::new();
            for s in listener.incoming().take(STREAMS) {
                let Ok(mut s) = s else { break };
                handles.push(thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 20];
                    while matches!(s.read(&mut buf), Ok(n) if n > 0) {}
                }));
            }
            for h in handles {
                let _ = h.join();
            }
        });
        let writers = (0..STREAMS)
            .map(|_| {
                let (stop, paused, bytes) = (Arc::clone(&stop), Arc::clone(&paused), Arc::clone(&bytes));
                thread::spawn(move || -> std::io::Result<()> {
                    let mut s = TcpStream::connect(addr)?;
                    let buf = vec![7u8; WRITE_BYTES];
                    while !stop.load(Ordering::Relaxed) {
                        if paused.load(Ordering::Relaxed) {
                            thread::sleep(Duration::from_millis(1));
                            continue;
                        }
                        s.write_all(&buf)?;
                        bytes.fetch_add(WRITE_BYTES as u64, Ordering::Relaxed);
                    }
                    s.shutdown(Shutdown::Both)
                })
            })
            .collect();
        Ok(Self { stop, paused, bytes, writers, readers })
    }

    /// Bytes per second over the next `dur`, and the bytes.
    #[allow(clippy::cast_precision_loss, reason = "rates")]
    fn rate_over(&self, dur: Duration) -> (f64, u64) {
        let (b0, t0) = (self.bytes.load(Ordering::Relaxed), Instant::now());
        thread::sleep(dur);
        let b = self.bytes.load(Ordering::Relaxed) - b0;
        (b as f64 / t0.elapsed().as_secs_f64(), b)
    }

    fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for w in self.writers {
            w.join().map_err(|_| anyhow::anyhow!("a writer panicked"))?.context("a bulk writer")?;
        }
        let _ = self.readers.join();
        Ok(())
    }
}

#[allow(clippy::cast_precision_loss, reason = "rates and counts per MB")]
pub(crate) fn bulk_phase(plan: &Plan) -> Result<Value> {
    let window = plan.window * 2;
    let o = Observer::start(&["--bench-toggle"], &tmp("bulk"))?;
    let load = Bulk::start()?;
    thread::sleep(window);
    // The load rests while the probes change: re-attaching waits for an
    // RCU grace period, which saturated CPUs stretch.
    let toggle = |attached: bool| -> Result<()> {
        load.paused.store(true, Ordering::Relaxed);
        let r = o.toggle(attached);
        load.paused.store(false, Ordering::Relaxed);
        thread::sleep(Duration::from_millis(200));
        r
    };
    let (mut with, mut without, mut ratio) = (Vec::new(), Vec::new(), Vec::new());
    for block in 0..plan.blocks {
        let on1 = load.rate_over(window).0;
        toggle(false)?;
        let off1 = load.rate_over(window).0;
        let off2 = load.rate_over(window).0;
        toggle(true)?;
        let on2 = load.rate_over(window).0;
        let r = (on1 + on2) / (off1 + off2);
        println!(
            "bench: bulk block {block}: with {:.0} {:.0}, without {:.0} {:.0} MB/s: ratio {r:.4}",
            on1 / 1e6,
            on2 / 1e6,
            off1 / 1e6,
            off2 / 1e6
        );
        with.extend([on1 / 1e6, on2 / 1e6]);
        without.extend([off1 / 1e6, off2 / 1e6]);
        ratio.push(r);
    }
    load.stop()?;
    o.stop()?;
    // Runs per MB, apart: the statistics' own clock reads slow the probes.
    sh("sysctl -qw kernel.bpf_stats_enabled=1")?;
    let counted = (|| -> Result<_> {
        let o = Observer::start_bin(&shipped_bin(), &[], &tmp("bulk-runs"))?;
        let before = per_run(&o.progs)?;
        let load = Bulk::start()?;
        let (_, bytes) = load.rate_over(window * 4);
        load.stop()?;
        let after = per_run(&o.progs)?;
        o.stop()?;
        Ok((before, after, bytes))
    })();
    sh("sysctl -qw kernel.bpf_stats_enabled=0")?;
    let (before, after, bytes) = counted?;
    let mb = bytes as f64 / 1e6;
    let mut per_mb = serde_json::Map::new();
    let mut ns_per_mb = 0.0;
    for (name, (ns, n)) in &after {
        let n0 = before.get(name).map_or(0, |v| v.1);
        if *n > n0 {
            // The mean since the statistics came on: this run's, but for
            // the few runs of the start-up.
            let runs = (n - n0) as f64 / mb;
            ns_per_mb += runs * ns;
            per_mb.insert(name.clone(), json!({"runs": runs, "ns_per_run": ns}));
        }
    }
    Ok(json!({
        "streams": STREAMS,
        "write_bytes": WRITE_BYTES,
        "seconds_per_window": window.as_secs_f64(),
        "blocks": plan.blocks,
        "mb_per_second": {"with_probes": stats(&with), "without": stats(&without)},
        "ratio_with_to_without": stats(&ratio),
        "per_mb": per_mb,
        "probe_ns_per_mb": ns_per_mb,
        "mb_counted": mb,
    }))
}

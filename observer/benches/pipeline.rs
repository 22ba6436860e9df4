//! Userspace pipeline benchmark: decoding plus aggregation (and metrics) of
//! kernel records, fed from memory, on one core, through the same feed call
//! the daemon makes. A bench target, not part of the shipped binary:
//! `cargo xtask bench` runs it as
//! `pipeline [--events N] [--destinations D] [--metrics-histograms]`
//! and reads one JSON object from its standard output.

use std::time::Instant;

use observer_common::{how, kind, outcome, role, Event, AF_INET, EVENT_SIZE};
use serde::Serialize;

use observer::{
    diagnosis::aggregate::{Aggregator, Config},
    kernel::event::{decode_bytes, Clock},
    surfaces::metrics::Metrics,
};

/// What the pipeline sustained.
#[derive(Debug, Serialize)]
struct PipelineResult {
    pub events: usize,
    pub destinations: u32,
    pub seconds: f64,
    pub events_per_second: f64,
    pub rows: usize,
    /// Size of one `/metrics` scrape after the run.
    pub scrape_bytes: usize,
    /// Series in that scrape.
    pub scrape_series: usize,
    /// Building the table once, a row at a time as the HTTP side does
    /// (`/api/v1/destinations`, the gauges).
    pub table_rebuild_seconds: f64,
    /// The longest single row of that build: the longest the event
    /// reader waits for the aggregator's lock because of a scrape.
    pub table_row_max_seconds: f64,
}

/// A mix like a busy host's: mostly successful reuses, some failures and
/// peer closes, connection churn; spread over `destinations`.
fn synthetic(n: usize, destinations: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * EVENT_SIZE);
    for i in 0..n {
        let mut e = Event::ZERO;
        let k = u32::try_from(i % 10_000_000).unwrap_or(0);
        let d = (k / 10) % destinations.max(1);
        e.ts_ns = 1_000_000_000 + (i as u64) * 10_000;
        e.sock_id = u64::from(k % 65_536);
        e.family = AF_INET;
        e.saddr[..4].copy_from_slice(&[10, 0, 0, 1]);
        e.daddr[..4].copy_from_slice(&[10, 1, u8::try_from(d / 250).unwrap_or(0), u8::try_from(d % 250).unwrap_or(0)]);
        e.sport = 40_000 + u16::try_from(k % 20_000).unwrap_or(0);
        e.dport = 443;
        e.role = role::CLIENT;
        e.tgid = 1000 + (k % 7);
        e.comm[..4].copy_from_slice(b"java");
        let idle_ms = u64::from(500 + (k * 7919) % 120_000);
        e.idle_ns = idle_ms * 1_000_000;
        match i % 10 {
            0..=5 => {
                e.kind = kind::REUSE;
                e.outcome = if idle_ms > 60_000 { outcome::RESET } else { outcome::OK };
                e.elapsed_ns = 1_000_000;
            }
            6 => {
                e.kind = kind::PEER_CLOSE;
                e.how = how::FIN;
                e.idle_ns = 60_000_000_000;
            }
            7 => e.kind = kind::LOCAL_CLOSE,
            8 => e.kind = kind::ESTABLISHED,
            _ => e.kind = kind::CLOSED,
        }
        // SAFETY: Event is POD without padding.
        let bytes = unsafe { std::slice::from_raw_parts(std::ptr::from_ref(&e).cast::<u8>(), EVENT_SIZE) };
        out.extend_from_slice(bytes);
    }
    out
}

/// Decode, aggregate and count `n` records; report events per second.
#[allow(clippy::cast_precision_loss, reason = "rates")]
fn pipeline(n: usize, destinations: u32, histograms: bool) -> PipelineResult {
    let raw = synthetic(n, destinations);
    let clock = Clock::with_offset_ns(1_700_000_000_000_000_000);
    let mut agg = Aggregator::new(Config::default());
    let metrics = Metrics::new(histograms);
    let start = Instant::now();
    let mut decoded = 0usize;
    // Decoded as fed, as the daemon's reader does; the end's judgement
    // of the held closes (once, after 2M events) is inside the timing.
    let events = raw.chunks_exact(EVENT_SIZE).filter_map(|chunk| decode_bytes(chunk, clock).ok());
    agg.feed_to_end(events, |ev, fed| {
        metrics.fed(&ev, &fed);
        decoded += 1;
    });
    let seconds = start.elapsed().as_secs_f64();
    let at = agg.latest_ns();
    let built = Instant::now();
    let mut table = Vec::new();
    let mut table_row_max_seconds = 0.0f64;
    for key in agg.keys() {
        let one = Instant::now();
        if let Some(r) = agg.row_at(key, at) {
            table.push(r);
        }
        table_row_max_seconds = table_row_max_seconds.max(one.elapsed().as_secs_f64());
    }
    Aggregator::sort_rows(&mut table);
    let table_rebuild_seconds = built.elapsed().as_secs_f64();
    metrics.set_estimates(&table);
    let scrape = metrics.encode();
    PipelineResult {
        events: decoded,
        destinations,
        seconds,
        events_per_second: decoded as f64 / seconds,
        rows: table.len(),
        scrape_bytes: scrape.len(),
        scrape_series: scrape.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).count(),
        table_rebuild_seconds,
        table_row_max_seconds,
    }
}

/// The arguments. `cargo bench` adds `--bench`; `cargo test --all-targets`
/// runs this target too, with the test harness's arguments (ignored): then
/// a short run checks that the pipeline still runs and counts every event.
fn main() -> anyhow::Result<()> {
    let (mut events, mut destinations, mut histograms) = (None, 1000u32, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--events" => events = Some(args.next().unwrap_or_default().parse()?),
            "--destinations" => destinations = args.next().unwrap_or_default().parse()?,
            "--metrics-histograms" => histograms = true,
            "--bench" => events = events.or(Some(2_000_000)),
            _ => {}
        }
    }
    let events = events.unwrap_or(20_000);
    let result = pipeline(events, destinations, histograms);
    anyhow::ensure!(
        result.events == events && result.rows > 0 && result.events_per_second > 0.0,
        "the pipeline lost events or made no rows: {result:?}"
    );
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

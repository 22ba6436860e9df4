//! The pipeline's last stage, [`Outputs`]: what the diagnosis fed goes to
//! the evidence store (by [`store::keep`], the one rule), `--record` and
//! `--events`; none of them ends the daemon on a full disk or a closed pipe.
//!
//! - A recording that cannot be written loses the events of that write,
//!   counted (`record_error`) and logged once a minute; the file is cut
//!   back to its last whole line, so a resumed recording stays readable,
//!   and writing resumes by itself when the disk has room again. A
//!   recording removed while the daemon runs is created again.
//! - Standard output closed (`observer run --events | head`) ends the run
//!   as Unix tools end: no panic, the probes detached, the store flushed,
//!   exit 0. `--events` is written by its own thread ([`EventsOut`]): a
//!   reader that stalls costs dropped lines, counted, never the loop.
//! - The store's writer drops what its queue cannot hold and gives up
//!   refused writes after a while; both are counted here as they happen.

use std::{
    fs::File,
    io::{ErrorKind, Write as _},
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    sync::{atomic::Ordering, Arc},
    time::{Duration, Instant},
};

use log::{info, warn};

use crate::{
    cli::EventsFormat,
    diagnosis::aggregate::Fed,
    kernel::event::{Body, Outcome, Role, SockEvent},
    surfaces::metrics::{self, Metrics},
    surfaces::otlp::{Otlp, Tally},
    surfaces::store::{self, ConnectionCounts, Writer},
};

/// Bytes buffered before a write.
const BUFFER: usize = 64 * 1024;
/// Buffered lines are written after each read of the ring buffer once this
/// old, and every second regardless: a `kill -9` loses at most this much
/// of the recording, at one write per interval under any load.
pub(crate) const FLUSH_AFTER: Duration = Duration::from_millis(100);
/// A failing output is logged at most this often.
const WARN_EVERY: Duration = Duration::from_mins(1);

/// `--record FILE`: events as JSON lines, appended.
pub(crate) struct Recording {
    path: PathBuf,
    file: File,
    buf: Vec<u8>,
    /// Events in `buf`.
    lines: u64,
    /// The file's length after the last whole write.
    good_len: u64,
    /// Events not recorded so far.
    lost: u64,
    lost_unlogged: u64,
    failing: bool,
    last_warn: Option<Instant>,
    last_flush: Instant,
}

fn open_append(path: &Path) -> std::io::Result<File> {
    File::options().create(true).append(true).read(true).mode(0o600).open(path)
}

/// The length of the file's whole lines. A run killed mid-write (`kill -9`)
/// can leave half a line at the end; it is cut, so the lines this run
/// appends stay readable.
fn whole_lines(file: &File, path: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::FileExt as _;
    let len = file.metadata()?.len();
    if len == 0 || !file.metadata()?.is_file() {
        return Ok(len);
    }
    let mut tail = vec![0u8; 64 * 1024];
    let mut end = len;
    while end > 0 {
        let start = end.saturating_sub(tail.len() as u64);
        let chunk = &mut tail[..usize::try_from(end - start).unwrap_or(0)];
        file.read_exact_at(chunk, start)?;
        if end == len && chunk.last() == Some(&b'\n') {
            return Ok(len);
        }
        if let Some(i) = chunk.iter().rposition(|&b| b == b'\n') {
            end = start + i as u64 + 1;
            break;
        }
        end = start;
    }
    warn!(
        "the recording {} ended in half a line (a run was killed while writing): cut its last {} bytes",
        path.display(),
        len - end
    );
    file.set_len(end)?;
    Ok(end)
}

impl Recording {
    pub(crate) fn open(path: &Path) -> std::io::Result<Self> {
        let file = open_append(path)?;
        let good_len = whole_lines(&file, path)?;
        Ok(Self {
            path: path.to_path_buf(),
            file,
            buf: Vec::with_capacity(BUFFER),
            lines: 0,
            good_len,
            lost: 0,
            lost_unlogged: 0,
            failing: false,
            last_warn: None,
            last_flush: Instant::now(),
        })
    }

    /// Queue one line (without its newline).
    pub(crate) fn write_line(&mut self, line: &str) {
        self.buf.extend_from_slice(line.as_bytes());
        self.buf.push(b'\n');
        self.lines += 1;
        if self.buf.len() >= BUFFER {
            self.flush();
        }
    }

    /// Events that could not be recorded, in total.
    pub(crate) fn lost(&self) -> u64 {
        self.lost
    }

    /// Write what is buffered when the oldest of it waited [`FLUSH_AFTER`].
    pub(crate) fn flush_due(&mut self) {
        if self.last_flush.elapsed() >= FLUSH_AFTER {
            self.flush();
        }
    }

    /// Write what is buffered. A failed write is cut back to the last
    /// whole line and its events counted as lost.
    pub(crate) fn flush(&mut self) {
        self.last_flush = Instant::now();
        if self.buf.is_empty() {
            return;
        }
        // Removed under us: the writes would go to an inode nobody can read.
        if self.file.metadata().is_ok_and(|m| m.nlink() == 0) {
            match open_append(&self.path) {
                Ok(f) => {
                    warn!("the recording {} was removed: writing a new one there", self.path.display());
                    self.good_len = f.metadata().map_or(0, |m| m.len());
                    self.file = f;
                }
                Err(e) => self.fail(&e),
            }
        }
        if self.buf.is_empty() {
            return;
        }
        match self.file.write_all(&self.buf) {
            Ok(()) => {
                self.good_len += self.buf.len() as u64;
                if self.failing {
                    info!(
                        "the recording {} is written again ({} events were not recorded)",
                        self.path.display(),
                        self.lost
                    );
                    self.failing = false;
                }
                self.buf.clear();
                self.lines = 0;
            }
            Err(e) => {
                // A partial line would corrupt the line after it.
                let _ = self.file.set_len(self.good_len);
                self.fail(&e);
            }
        }
    }

    fn fail(&mut self, e: &std::io::Error) {
        self.lost += self.lines;
        self.lost_unlogged += self.lines;
        self.buf.clear();
        self.lines = 0;
        self.failing = true;
        if self.last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
            warn!(
                "writing the recording {}: {e}; {} events not recorded since the last message (counted in observer_events_lost_total{{reason=\"record_error\"}}); the daemon goes on and writes again when it can",
                self.path.display(),
                self.lost_unlogged
            );
            self.lost_unlogged = 0;
            self.last_warn = Some(Instant::now());
        }
    }
}

/// What handing a line to `--events` found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stdout {
    Open,
    /// The reader went away (`EPIPE`): the run ends.
    Closed,
    /// The reader is too slow: its queue is full and the line is dropped,
    /// counted (`events_output_backlog`).
    Backlog,
}

/// Lines `--events` holds for a slow reader before it drops them.
pub(crate) const EVENTS_QUEUE: usize = 16_384;

/// `--events` on its own thread: the daemon's loop hands it lines and
/// never waits on standard output, so a reader that stalls cannot hold
/// the loop (signals, `/healthz`'s heartbeat, the store). A closed pipe
/// ends the run; any other write error (a full disk behind a redirect)
/// loses the lines of that write, counted (`events_output_error`) and
/// logged once a minute: standard output is a view, the store and
/// `--record` hold the evidence.
pub(crate) struct EventsOut {
    tx: Option<std::sync::mpsc::SyncSender<String>>,
    closed: std::sync::Arc<std::sync::atomic::AtomicBool>,
    errors: std::sync::Arc<std::sync::atomic::AtomicU64>,
    done: std::sync::mpsc::Receiver<()>,
}

impl EventsOut {
    pub(crate) fn start() -> std::io::Result<Self> {
        use std::sync::{atomic::Ordering, Arc};
        let (tx, rx) = std::sync::mpsc::sync_channel::<String>(EVENTS_QUEUE);
        let (done_tx, done) = std::sync::mpsc::channel();
        let closed = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let errors = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (c, e) = (Arc::clone(&closed), Arc::clone(&errors));
        std::thread::Builder::new().name("events-out".into()).spawn(move || {
            let mut out = std::io::stdout();
            let mut last_warn: Option<Instant> = None;
            let mut batch = String::new();
            while let Ok(line) = rx.recv() {
                // What waits is written in one go.
                batch.clear();
                let mut lines = 1u64;
                batch.push_str(&line);
                batch.push('\n');
                while batch.len() < BUFFER {
                    let Ok(more) = rx.try_recv() else { break };
                    batch.push_str(&more);
                    batch.push('\n');
                    lines += 1;
                }
                match out.write_all(batch.as_bytes()).and_then(|()| out.flush()) {
                    Ok(()) => {}
                    Err(err) if err.kind() == ErrorKind::BrokenPipe => {
                        c.store(true, Ordering::Relaxed);
                        break;
                    }
                    Err(err) => {
                        e.fetch_add(lines, Ordering::Relaxed);
                        if last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) {
                            warn!("writing --events to standard output: {err}; lines are lost until it can be written");
                            last_warn = Some(Instant::now());
                        }
                    }
                }
            }
            let _ = done_tx.send(());
        })?;
        Ok(Self { tx: Some(tx), closed, errors, done })
    }

    /// Hand one line over; never blocks.
    pub(crate) fn print(&self, line: String) -> Stdout {
        if self.is_closed() {
            return Stdout::Closed;
        }
        match self.tx.as_ref().map(|tx| tx.try_send(line)) {
            Some(Ok(())) => Stdout::Open,
            Some(Err(std::sync::mpsc::TrySendError::Full(_))) => Stdout::Backlog,
            _ => Stdout::Closed,
        }
    }

    /// The reader went away.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Lines lost to write errors since the last call.
    pub(crate) fn take_errors(&self) -> u64 {
        self.errors.swap(0, std::sync::atomic::Ordering::Relaxed)
    }

    /// No more lines: what is queued is written within `wait`, or left to
    /// a reader that does not read (the run ends either way).
    pub(crate) fn finish(mut self, wait: Duration) {
        self.tx = None;
        let _ = self.done.recv_timeout(wait);
    }
}

/// Where fed events go: the store, `--record`, `--events`.
pub(crate) struct Outputs {
    print: Option<EventsFormat>,
    /// `--connections`: `--events` prints establishments and closes too.
    connections: bool,
    record: Option<Recording>,
    /// Events not recorded, as last exported.
    record_lost: u64,
    /// `--events`' writer thread.
    events_out: Option<EventsOut>,
    /// Standard output closed under `--events`: the run ends.
    pub(crate) stop: bool,
    store: Option<Writer>,
    /// The store's losses, as last exported.
    store_dropped: u64,
    store_failed: u64,
    store_failed_other: u64,
    store_dropped_other: u64,
    volume: ConnectionCounts,
    /// The OTLP export, when an endpoint is set.
    otlp: Option<OtlpOut>,
}

/// The OTLP export and its counts as last put on `/metrics`.
pub(crate) struct OtlpOut {
    export: Otlp,
    tally: Arc<Tally>,
    /// Metrics failures, logs failures, records dropped, records unsent.
    reported: [u64; 4],
}

impl OtlpOut {
    pub(crate) fn new(export: Otlp, tally: Arc<Tally>) -> Self {
        Self { export, tally, reported: [0; 4] }
    }
}

impl Outputs {
    pub(crate) fn new(
        print: Option<EventsFormat>,
        connections: bool,
        record: Option<Recording>,
        events_out: Option<EventsOut>,
        store: Writer,
    ) -> Self {
        Self {
            print,
            connections,
            record,
            record_lost: 0,
            events_out,
            stop: false,
            store: Some(store),
            store_dropped: 0,
            store_failed: 0,
            store_failed_other: 0,
            store_dropped_other: 0,
            volume: ConnectionCounts::default(),
            otlp: None,
        }
    }

    /// `--record`: every event that reached the diagnosis, before it is fed
    /// (a replay of the recording feeds the same events in the same order).
    pub(crate) fn record(&mut self, ev: &SockEvent) {
        if let Some(rec) = self.record.as_mut() {
            rec.write_line(&ev.to_json_line());
        }
    }

    /// What the feed made of `ev`, stored by the one rule, and `ev` printed
    /// under `--events`.
    pub(crate) fn write(&mut self, ev: &SockEvent, fed: &Fed, metrics: &Metrics) {
        if let (Some(o), Some(ingested)) = (&self.otlp, &fed.ingested) {
            if ev.role == Role::Client && ev.outcome().is_some_and(Outcome::is_failure) {
                o.export.failed_reuse(ev, &ingested.id.destination);
            }
        }
        if let Some(w) = &self.store {
            store::keep(ev, fed, &mut self.volume, |r| {
                let _ = w.send(r);
            });
        }
        let is_connection = matches!(ev.body, Body::Established | Body::Closed);
        if is_connection && !self.connections {
            return;
        }
        let line = match self.print {
            Some(EventsFormat::Text) => ev.to_string(),
            Some(EventsFormat::Json) => ev.to_json_line(),
            None => return,
        };
        let Some(out) = self.events_out.as_ref() else { return };
        match out.print(line) {
            Stdout::Open => {}
            Stdout::Closed => self.close_stdout(),
            Stdout::Backlog => metrics.lost(metrics::reason::EVENTS_OUTPUT_BACKLOG, 1),
        }
    }

    fn close_stdout(&mut self) {
        if self.print.take().is_some() {
            info!("standard output was closed: stopping, as a pipe's writer does");
            self.stop = true;
        }
    }

    /// After a read of the ring: `--events`' write errors exported, a
    /// closed standard output noticed, the recording written when due.
    pub(crate) fn after_drain(&mut self, metrics: &Metrics) {
        if let Some(out) = self.events_out.as_ref() {
            metrics.lost(metrics::reason::EVENTS_OUTPUT_ERROR, out.take_errors());
            if out.is_closed() {
                self.close_stdout();
            }
        }
        if let Some(rec) = self.record.as_mut() {
            rec.flush_due();
        }
    }

    /// Hand the connection counts of the minute so far to the store (it
    /// adds them up): a `kill -9` loses one second of them, not a minute.
    pub(crate) fn flush_volume(&mut self) {
        let Some(w) = &self.store else { return };
        for r in self.volume.flush() {
            let _ = w.send(r);
        }
    }

    /// Write the recording's buffer and export what it could not write.
    pub(crate) fn flush_record(&mut self, metrics: &Metrics) {
        let Some(rec) = self.record.as_mut() else { return };
        rec.flush();
        let lost = rec.lost();
        metrics.lost(metrics::reason::RECORD_ERROR, lost.saturating_sub(self.record_lost));
        self.record_lost = lost;
    }

    /// Log and export records the store had to drop since the last call.
    /// Send through OTLP from now on.
    pub(crate) fn export_otlp(&mut self, otlp: OtlpOut) {
        self.otlp = Some(otlp);
    }

    /// Put the OTLP export's failures and losses on `/metrics`.
    pub(crate) fn report_otlp(&mut self, metrics: &Metrics) {
        let Some(o) = &mut self.otlp else { return };
        let t = &o.tally;
        let now = [
            t.metrics_failures.load(Ordering::Relaxed),
            t.logs_failures.load(Ordering::Relaxed),
            t.logs_dropped.load(Ordering::Relaxed),
            t.logs_unsent.load(Ordering::Relaxed),
        ];
        let d: Vec<u64> = now.iter().zip(o.reported).map(|(n, r)| n.saturating_sub(r)).collect();
        metrics.otlp_failures("metrics", d[0]);
        metrics.otlp_failures("logs", d[1]);
        metrics.lost(metrics::reason::OTLP_LOGS_BACKLOG, d[2]);
        metrics.lost(metrics::reason::OTLP_LOGS_UNSENT, d[3]);
        o.reported = now;
    }

    pub(crate) fn report_store_losses(&mut self, metrics: &Metrics) {
        let Some(w) = &self.store else { return };
        // The writer logs its own failures, once a minute.
        let state = w.state();
        let failed = state.failed.load(Ordering::Relaxed);
        metrics.lost(metrics::reason::STORE_ERROR, failed.saturating_sub(self.store_failed));
        self.store_failed = self.store_failed.max(failed);
        let failed_other = state.failed_other.load(Ordering::Relaxed);
        metrics.store_records_lost(metrics::reason::STORE_ERROR, failed_other.saturating_sub(self.store_failed_other));
        self.store_failed_other = self.store_failed_other.max(failed_other);
        let other = w.dropped_other();
        metrics.store_records_lost(metrics::reason::STORE_BACKLOG, other.saturating_sub(self.store_dropped_other));
        self.store_dropped_other = self.store_dropped_other.max(other);
        let now = w.dropped();
        if now > self.store_dropped {
            let n = now - self.store_dropped;
            metrics.lost(metrics::reason::STORE_BACKLOG, n);
            warn!("the evidence store could not keep up: {n} records not stored ({now} in total); check the disk under --data-dir");
            self.store_dropped = now;
        }
    }

    /// At shutdown: the last counts stored, the writer's queue written, and
    /// `--events` given a second to finish.
    pub(crate) fn finish(&mut self) {
        if let Some(w) = self.store.take() {
            for r in self.volume.flush() {
                let _ = w.send(r);
            }
            let given_up = w.finish();
            if given_up > 0 {
                warn!("{given_up} records could not be stored in this run (counted as store_error while it ran)");
            }
        }
        if let Some(out) = self.events_out.take() {
            out.finish(Duration::from_secs(1));
        }
        if let Some(o) = self.otlp.take() {
            o.export.shutdown(Duration::from_secs(2));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_recording_is_created_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rec.jsonl");
        let mut r = Recording::open(&path).unwrap();
        r.write_line("{\"a\":1}");
        r.flush();
        std::fs::remove_file(&path).unwrap();
        r.write_line("{\"a\":2}");
        r.flush();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":2}\n");
        assert_eq!(r.lost(), 0);
    }

    #[test]
    fn half_a_line_left_by_a_kill_is_cut() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rec.jsonl");
        std::fs::write(&path, "{\"a\":1}\n{\"a\":2}\n{\"a\":").unwrap();
        let mut r = Recording::open(&path).unwrap();
        r.write_line("{\"a\":3}");
        r.flush();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "{\"a\":1}\n{\"a\":2}\n{\"a\":3}\n");
        // No newline at all: nothing whole to keep.
        std::fs::write(&path, "{\"a\":").unwrap();
        drop(Recording::open(&path).unwrap());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
    }

    /// `/dev/full` fails every write with ENOSPC, as a full disk does.
    #[test]
    fn a_full_disk_counts_every_event_not_recorded() {
        let mut r = Recording::open(Path::new("/dev/full")).unwrap();
        for k in 0..10 {
            r.write_line(&format!("{{\"k\":{k}}}"));
        }
        r.flush();
        r.write_line("{}");
        r.flush();
        assert_eq!(r.lost(), 11);
        assert!(r.buf.is_empty(), "nothing held after a failed write");
    }
}

//! The store's writer thread: records queued without blocking the event
//! path (bounded by a count, dropped and counted when full), written in
//! batches, and the retention applied every minute.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering},
        mpsc::{self, Receiver, RecvTimeoutError, Sender},
        Arc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use log::{debug, warn};

use super::{Limits, Record, Store};
use crate::kernel::event::clock_ns;

/// The writer thread's handle: queue records without blocking. The queue
/// grows as records come (a `sync_channel` would allocate and touch every
/// slot up front: 18 MiB of resident memory for an idle daemon) and is
/// bounded by a count of the records in it.
pub struct Writer {
    pub(crate) tx: Option<Sender<Record>>,
    pub(crate) queued: Arc<AtomicUsize>,
    pub(crate) capacity: usize,
    pub(crate) dropped: Arc<AtomicU64>,
    pub(crate) dropped_other: Arc<AtomicU64>,
    pub(crate) state: Arc<WriterState>,
    pub(crate) handle: Option<JoinHandle<()>>,
}

/// What the writer thread tells the daemon: its health and what it gave up.
#[derive(Debug, Default)]
pub struct WriterState {
    /// Event records (evidence and names) the store refused for
    /// `--store-give-up` (or at shutdown), given up and counted
    /// (`observer_events_lost_total{reason="store_error"}`).
    pub failed: AtomicU64,
    /// The same for connection counts and estimate changes
    /// (`observer_store_records_lost_total{reason="store_error"}`): records
    /// that hold no one event, kept apart so every count is of one unit.
    pub failed_other: AtomicU64,
    /// The last write failed and none succeeded since.
    pub degraded: AtomicBool,
    /// Shutting down: a failing write is given up at once, not retried.
    pub(crate) closing: AtomicBool,
}

/// Records queued for the writer at most.
pub const QUEUE: usize = 65_536;
pub(crate) const BATCH: usize = 4096;
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(500);
pub(crate) const PRUNE_EVERY: Duration = Duration::from_mins(1);
/// A batch the store refused (a full disk, a removed directory) is held
/// and written again this often, so writing resumes by itself.
pub const RETRY_EVERY: Duration = Duration::from_secs(1);
/// A batch refused this long (`--store-give-up`, [`Limits`]) is given up
/// and counted (`store_error`); the queue behind it, full by then, counts
/// what it cannot take (`store_backlog`).
pub const GIVE_UP_AFTER: Duration = Duration::from_mins(1);
/// A failing store is logged at most this often.
const WARN_EVERY: Duration = Duration::from_mins(1);

impl Writer {
    /// Start the writer thread on an open store, with a queue of `queue` records.
    pub fn start(store: Store, limits: Limits, queue: usize) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let dropped = Arc::new(AtomicU64::new(0));
        let dropped_other = Arc::new(AtomicU64::new(0));
        let queued = Arc::new(AtomicUsize::new(0));
        let state = Arc::new(WriterState::default());
        let (taken, st) = (Arc::clone(&queued), Arc::clone(&state));
        let handle = std::thread::Builder::new()
            .name("observer-store".into())
            .spawn(move || write_loop(store, &rx, &taken, &st, limits))?;
        Ok(Self { tx: Some(tx), queued, capacity: queue, dropped, dropped_other, state, handle: Some(handle) })
    }

    /// Queue a record; false (and counted) when the queue is full.
    #[must_use = "a false return means the record was dropped (it is counted)"]
    pub fn send(&self, r: Record) -> bool {
        let Some(tx) = &self.tx else { return false };
        let counter = if is_event(&r) { &self.dropped } else { &self.dropped_other };
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.capacity || tx.send(r).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            counter.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Event records dropped so far because the writer could not keep up.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Connection counts and estimate changes dropped so far, likewise.
    #[must_use]
    pub fn dropped_other(&self) -> u64 {
        self.dropped_other.load(Ordering::Relaxed)
    }

    /// The writer's health and the records it gave up.
    #[must_use]
    pub fn state(&self) -> Arc<WriterState> {
        Arc::clone(&self.state)
    }

    /// Write what is queued and stop; returns the records of every kind
    /// given up on the way (a store that still fails is not retried at
    /// shutdown).
    #[must_use = "records given up at shutdown are lost evidence: log or count them"]
    pub fn finish(mut self) -> u64 {
        self.stop();
        self.state.failed.load(Ordering::Relaxed) + self.state.failed_other.load(Ordering::Relaxed)
    }

    fn stop(&mut self) {
        self.state.closing.store(true, Ordering::Relaxed);
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// An event record (evidence or a name), counted as an event when lost.
fn is_event(r: &Record) -> bool {
    matches!(r, Record::Evidence { .. })
}

/// The writer thread. A refused batch is held and retried every
/// [`RETRY_EVERY`] while new records wait in the bounded queue; it is given
/// up (counted) after `limits.give_up_after`, or at once when shutting down.
pub(crate) fn write_loop(
    mut store: Store,
    rx: &Receiver<Record>,
    queued: &AtomicUsize,
    state: &WriterState,
    limits: Limits,
) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut last_prune = Instant::now().checked_sub(PRUNE_EVERY).unwrap_or_else(Instant::now);
    let mut failing_since: Option<Instant> = None;
    let mut last_warn: Option<Instant> = None;
    let mut given_up_unlogged = 0u64;
    loop {
        // While a refused batch is held, wait between attempts, and take
        // only what arrives meanwhile (one record a wait at most).
        let wait = if failing_since.is_some() { RETRY_EVERY } else { FLUSH_EVERY };
        let mut taken = 0;
        let open = match rx.recv_timeout(wait) {
            Ok(r) => {
                batch.push(r);
                taken += 1;
                while failing_since.is_none() && batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(r) => {
                            batch.push(r);
                            taken += 1;
                        }
                        Err(_) => break,
                    }
                }
                true
            }
            Err(RecvTimeoutError::Timeout) => true,
            Err(RecvTimeoutError::Disconnected) => false,
        };
        queued.fetch_sub(taken, Ordering::AcqRel);
        if !batch.is_empty() {
            match store.insert(&batch) {
                Ok(_) => {
                    if let Some(since) = failing_since.take() {
                        log::info!(
                            "evidence store {}: writing again after {:.0} s of failed writes",
                            store.path().display(),
                            since.elapsed().as_secs_f64()
                        );
                    }
                    state.degraded.store(false, Ordering::Relaxed);
                    batch.clear();
                }
                Err(e) => {
                    state.degraded.store(true, Ordering::Relaxed);
                    let since = *failing_since.get_or_insert_with(Instant::now);
                    if state.closing.load(Ordering::Relaxed) || since.elapsed() >= limits.give_up_after {
                        let events = batch.iter().filter(|r| is_event(r)).count() as u64;
                        state.failed.fetch_add(events, Ordering::Relaxed);
                        state.failed_other.fetch_add(batch.len() as u64 - events, Ordering::Relaxed);
                        given_up_unlogged += batch.len() as u64;
                        batch.clear();
                        // The next batch gets its own minute.
                        failing_since = Some(Instant::now());
                    }
                    if last_warn.is_none_or(|t| t.elapsed() >= WARN_EVERY) || state.closing.load(Ordering::Relaxed) {
                        warn!(
                            "evidence store {}: writing failed: {e}; holding {} records and retrying every {} s ({given_up_unlogged} given up since the last message, counted with reason=\"store_error\" in observer_events_lost_total, or observer_store_records_lost_total for connection counts and changes); free space under --data-dir",
                            store.path().display(),
                            batch.len(),
                            RETRY_EVERY.as_secs()
                        );
                        last_warn = Some(Instant::now());
                        given_up_unlogged = 0;
                    }
                }
            }
        }
        if last_prune.elapsed() >= PRUNE_EVERY {
            match store.prune(clock_ns(libc::CLOCK_REALTIME), limits) {
                Ok(p) if p.by_age + p.by_size > 0 => {
                    debug!("evidence store pruned {} old and {} records over the size limit", p.by_age, p.by_size);
                }
                Ok(_) => {}
                Err(e) => warn!("evidence store: pruning failed: {e}"),
            }
            last_prune = Instant::now();
        }
        if !open && batch.is_empty() {
            return;
        }
    }
}

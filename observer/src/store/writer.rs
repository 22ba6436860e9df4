//! The store's writer thread: records queued without blocking the event
//! path (bounded by a count, dropped and counted when full), written in
//! batches, and the retention applied every minute.

#[allow(
    clippy::wildcard_imports,
    reason = "one module split by concern: the parent's imports and siblings' items"
)]
use super::*;

/// The writer thread's handle: queue records without blocking. The queue
/// grows as records come (a `sync_channel` would allocate and touch every
/// slot up front: 18 MiB of resident memory for an idle daemon) and is
/// bounded by a count of the records in it.
pub struct Writer {
    pub(crate) tx: Option<Sender<Record>>,
    pub(crate) queued: Arc<AtomicUsize>,
    pub(crate) capacity: usize,
    pub(crate) dropped: Arc<AtomicU64>,
    pub(crate) handle: Option<JoinHandle<()>>,
}

/// Records queued for the writer at most.
pub const QUEUE: usize = 65_536;
pub(crate) const BATCH: usize = 4096;
pub(crate) const FLUSH_EVERY: Duration = Duration::from_millis(500);
pub(crate) const PRUNE_EVERY: Duration = Duration::from_mins(1);

impl Writer {
    /// Start the writer thread on an open store, with a queue of `queue` records.
    pub fn start(store: Store, limits: Limits, queue: usize) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel();
        let dropped = Arc::new(AtomicU64::new(0));
        let queued = Arc::new(AtomicUsize::new(0));
        let taken = Arc::clone(&queued);
        let handle = std::thread::Builder::new()
            .name("observer-store".into())
            .spawn(move || write_loop(store, &rx, &taken, limits))?;
        Ok(Self { tx: Some(tx), queued, capacity: queue, dropped, handle: Some(handle) })
    }

    /// Queue a record; false (and counted) when the queue is full.
    #[must_use = "a false return means the record was dropped (it is counted)"]
    pub fn send(&self, r: Record) -> bool {
        let Some(tx) = &self.tx else { return false };
        if self.queued.fetch_add(1, Ordering::AcqRel) >= self.capacity || tx.send(r).is_err() {
            self.queued.fetch_sub(1, Ordering::AcqRel);
            self.dropped.fetch_add(1, Ordering::Relaxed);
            return false;
        }
        true
    }

    /// Records dropped so far because the writer could not keep up.
    #[must_use]
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed)
    }

    /// Write what is queued and stop.
    pub fn finish(mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.tx.take();
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

pub(crate) fn write_loop(mut store: Store, rx: &Receiver<Record>, queued: &AtomicUsize, limits: Limits) {
    let mut batch = Vec::with_capacity(BATCH);
    let mut last_prune = Instant::now().checked_sub(PRUNE_EVERY).unwrap_or_else(Instant::now);
    loop {
        let open = match rx.recv_timeout(FLUSH_EVERY) {
            Ok(r) => {
                batch.push(r);
                while batch.len() < BATCH {
                    match rx.try_recv() {
                        Ok(r) => batch.push(r),
                        Err(_) => break,
                    }
                }
                true
            }
            Err(RecvTimeoutError::Timeout) => true,
            Err(RecvTimeoutError::Disconnected) => false,
        };
        if !batch.is_empty() {
            queued.fetch_sub(batch.len(), Ordering::AcqRel);
            if let Err(e) = store.insert(&batch) {
                warn!("evidence store: writing {} records failed: {e}", batch.len());
            }
            batch.clear();
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
        if !open {
            return;
        }
    }
}

//! What the HTTP endpoint serves: the daemon's health (`/healthz`), and the
//! shared state it reads (the table, cached, and the metrics).

use std::sync::{
    atomic::{AtomicBool, AtomicU64, Ordering},
    Arc, Mutex, PoisonError,
};

use anyhow::{Context as _, Result};
use log::error;

use crate::{
    diagnosis::aggregate::Aggregator,
    kernel::event::clock_ns,
    surfaces::http::{self, Handler, Response},
    surfaces::metrics::{self, Metrics},
    surfaces::store,
};

/// The daemon's health, as `GET /healthz` reports it.
#[derive(Debug, Default)]
pub struct Health {
    /// The probes are attached.
    pub attached: AtomicBool,
    /// The ring-buffer reader's last pass (`CLOCK_BOOTTIME` ns).
    pub heartbeat_ns: AtomicU64,
    /// Events read so far.
    pub events: AtomicU64,
    /// The evidence store's writer, once it runs.
    pub store: std::sync::OnceLock<Arc<store::WriterState>>,
}

/// The reader passes at least once a second (its tick); three missed
/// passes mean events no longer flow.
pub(crate) const HEALTHY_WITHIN_NS: u64 = 3_000_000_000;

impl Health {
    /// `(healthy, JSON body)`.
    #[must_use]
    pub fn report(&self, now_ns: u64) -> (bool, String) {
        let attached = self.attached.load(Ordering::Relaxed);
        let beat = self.heartbeat_ns.load(Ordering::Relaxed);
        let age = now_ns.saturating_sub(beat);
        let flowing = beat > 0 && age <= HEALTHY_WITHIN_NS;
        // A failing store degrades the evidence, not the probes: still 200.
        let store = match self.store.get() {
            None => "none",
            Some(s) if s.degraded.load(Ordering::Relaxed) => "degraded",
            Some(_) => "ok",
        };
        #[allow(clippy::cast_precision_loss, reason = "an age in seconds")]
        let body = serde_json::json!({
            "status": if attached && flowing { "ok" } else { "unavailable" },
            "probes_attached": attached,
            "events_flowing": flowing,
            "store": store,
            "events": self.events.load(Ordering::Relaxed),
            "last_read_age_seconds": (beat > 0).then(|| age as f64 / 1e9),
        });
        (attached && flowing, format!("{body}\n"))
    }
}

/// State the HTTP endpoint reads.
pub struct DaemonState {
    pub aggregator: Mutex<Aggregator>,
    pub metrics: Metrics,
    pub health: Health,
    /// The table as JSON and the metrics' exposition, as last built.
    pub(crate) cache: Mutex<Cache>,
}

/// One build of the table and the exposition, shared by every client.
#[derive(Default)]
pub(crate) struct Cache {
    /// When it was built (boot clock, ns); 0 before the first build.
    at: u64,
    table: hyper::body::Bytes,
    metrics: hyper::body::Bytes,
    /// The current build's token, and earlier builds' (alive while a slow
    /// client still reads one).
    current: std::sync::Weak<()>,
    older: Vec<std::sync::Weak<()>>,
}

/// The table and the estimate gauges are rebuilt at most this often,
/// however many clients scrape, and a row at a time: the event reader,
/// which needs the aggregator's lock, waits for one row at most.
pub const TABLE_MAX_AGE_NS: u64 = 250_000_000;

/// Builds kept alive by slow clients at most, beside the current one: past
/// it the current build is served even when older than
/// [`TABLE_MAX_AGE_NS`] (at most the 30 s exchange deadline), so memory
/// stays a few builds whatever the clients do.
pub const MAX_OLDER_BUILDS: usize = 2;

/// A body that tells, through its token, when its last reader is gone.
fn shared_body(bytes: Vec<u8>, token: &Arc<()>) -> hyper::body::Bytes {
    struct Owned(Vec<u8>, #[allow(dead_code, reason = "held for its drop")] Arc<()>);
    impl AsRef<[u8]> for Owned {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }
    hyper::body::Bytes::from_owner(Owned(bytes, Arc::clone(token)))
}

impl DaemonState {
    #[must_use]
    pub fn new(aggregator: Aggregator, metrics: Metrics) -> Self {
        Self {
            aggregator: Mutex::new(aggregator),
            metrics,
            health: Health::default(),
            cache: Mutex::new(Cache::default()),
        }
    }

    /// The table's JSON and the exposition, rebuilt (with the estimate
    /// gauges) when older than [`TABLE_MAX_AGE_NS`] and fewer than
    /// [`MAX_OLDER_BUILDS`] earlier builds are still being read.
    /// Concurrent scrapes wait for one rebuild.
    pub(crate) fn bodies(&self) -> Result<(hyper::body::Bytes, hyper::body::Bytes), serde_json::Error> {
        let mut cached = self.cache.lock().unwrap_or_else(PoisonError::into_inner);
        let now = clock_ns(libc::CLOCK_BOOTTIME);
        cached.older.retain(|w| w.strong_count() > 0);
        let fresh = cached.at != 0 && now.saturating_sub(cached.at) < TABLE_MAX_AGE_NS;
        if fresh || (cached.at != 0 && cached.older.len() >= MAX_OLDER_BUILDS) {
            return Ok((cached.table.clone(), cached.metrics.clone()));
        }
        // A row at a time: the reader waits for one row's computation at
        // most, never for the whole table.
        let at = clock_ns(libc::CLOCK_REALTIME);
        let keys = self.aggregator.lock().unwrap_or_else(PoisonError::into_inner).keys();
        let mut rows = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some(r) = self.aggregator.lock().unwrap_or_else(PoisonError::into_inner).row_at(key, at) {
                rows.push(r);
            }
        }
        Aggregator::sort_rows(&mut rows);
        let gone = self.aggregator.lock().unwrap_or_else(PoisonError::into_inner).take_gone();
        // Serialising and the gauges run off the aggregator's lock.
        self.metrics.forget(&gone);
        self.metrics.set_estimates(&rows);
        let token = Arc::new(());
        let table = shared_body(serde_json::to_vec(&rows)?, &token);
        drop(rows);
        let metrics = shared_body(self.metrics.encode().into_bytes(), &token);
        // The build replaced lives on while a client reads it; the new one
        // lives through its bodies only: the last reader frees it.
        let replaced = std::mem::replace(&mut cached.current, Arc::downgrade(&token));
        if cached.at != 0 {
            cached.older.push(replaced);
        }
        cached.at = now;
        cached.table = table;
        cached.metrics = metrics;
        Ok((cached.table.clone(), cached.metrics.clone()))
    }
}

impl Handler for DaemonState {
    fn get(&self, path: &str) -> Response {
        match path {
            "/api/v1/destinations" => match self.bodies() {
                Ok((table, _)) => Response::json(table),
                Err(e) => Response::text(500, format!("encoding the table: {e}\n")),
            },
            "/metrics" => match self.bodies() {
                Ok((_, metrics)) => Response { status: 200, content_type: metrics::CONTENT_TYPE, body: metrics },
                Err(e) => Response::text(500, format!("encoding the table: {e}\n")),
            },
            "/healthz" => {
                let (ok, body) = self.health.report(clock_ns(libc::CLOCK_BOOTTIME));
                Response { status: if ok { 200 } else { 503 }, content_type: "application/json", body: body.into() }
            }
            "/" => Response::text(200, "observer: GET /api/v1/destinations, GET /metrics, GET /healthz\n"),
            _ => Response::text(404, "not found; try /api/v1/destinations, /metrics or /healthz\n"),
        }
    }
}

/// Serve HTTP on a thread and runtime of its own: a scrape (which computes
/// the table) never delays the ring-buffer reader's runtime.
pub(crate) fn spawn_http(
    listener: std::net::TcpListener,
    shared: Arc<DaemonState>,
    limits: http::Limits,
) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().context("the HTTP runtime")?;
    std::thread::Builder::new()
        .name("observer-http".into())
        .spawn(move || {
            runtime.block_on(async move {
                match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => http::serve(l, shared as Arc<dyn Handler>, limits).await,
                    Err(e) => error!("the HTTP listener: {e}"),
                }
            });
        })
        .context("starting the HTTP thread")?;
    Ok(())
}

//! `observer run`: brings the probes up, follows the ring buffer, prints or
//! records events, reports losses, and tears everything down on SIGINT/SIGTERM.

use std::{
    fs::File,
    io::{BufWriter, Write},
    os::unix::fs::OpenOptionsExt as _,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use anyhow::{Context as _, Result};
use log::{error, info, warn};
use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, SignalKind},
};

use crate::{
    aggregate::{self, Aggregator},
    bpf::{self, KernelCounters, ProbeConfig, Probes},
    cli::{EventsFormat, RunArgs},
    event::{clock_ns, EventKind, SockEvent},
    http::{self, Handler, Response},
    metrics::{self, Metrics},
    owner::{self, Filter, Resolver},
    store::{self, Record, Store, Writer},
    table::ProcessOwner,
};

/// How often the at-risk view is refreshed from the kernel's socket table.
const SOCKET_REFRESH: Duration = Duration::from_secs(5);

/// The daemon's health, as `GET /healthz` reports it.
#[derive(Debug, Default)]
pub struct Health {
    /// The probes are attached.
    pub attached: AtomicBool,
    /// The ring-buffer reader's last pass (`CLOCK_BOOTTIME` ns).
    pub heartbeat_ns: AtomicU64,
    /// Events read so far.
    pub events: AtomicU64,
}

/// The reader passes at least once a second (its tick); three missed
/// passes mean events no longer flow.
const HEALTHY_WITHIN_NS: u64 = 3_000_000_000;

impl Health {
    /// `(healthy, JSON body)`.
    #[must_use]
    pub fn report(&self, now_ns: u64) -> (bool, String) {
        let attached = self.attached.load(Ordering::Relaxed);
        let beat = self.heartbeat_ns.load(Ordering::Relaxed);
        let age = now_ns.saturating_sub(beat);
        let flowing = beat > 0 && age <= HEALTHY_WITHIN_NS;
        #[allow(clippy::cast_precision_loss, reason = "an age in seconds")]
        let body = serde_json::json!({
            "status": if attached && flowing { "ok" } else { "unavailable" },
            "probes_attached": attached,
            "events_flowing": flowing,
            "events": self.events.load(Ordering::Relaxed),
            "last_read_age_seconds": (beat > 0).then(|| age as f64 / 1e9),
        });
        (attached && flowing, format!("{body}\n"))
    }
}

/// State the HTTP endpoint reads.
pub struct Shared {
    pub aggregator: Mutex<Aggregator>,
    pub metrics: Metrics,
    pub health: Health,
    /// The table as JSON, and when it was built (boot clock, ns).
    pub table: Mutex<(u64, Arc<Vec<u8>>)>,
}

/// The table and the estimate gauges are rebuilt at most this often,
/// however many clients scrape, and a row at a time: the event reader,
/// which needs the aggregator's lock, waits for one row at most.
pub const TABLE_MAX_AGE_NS: u64 = 250_000_000;

impl Shared {
    #[must_use]
    pub fn new(aggregator: Aggregator) -> Self {
        Self {
            aggregator: Mutex::new(aggregator),
            metrics: Metrics::new(),
            health: Health::default(),
            table: Mutex::new((0, Arc::new(Vec::new()))),
        }
    }

    /// The table's JSON, rebuilt (with the estimate gauges) when older
    /// than [`TABLE_MAX_AGE_NS`]. Concurrent scrapes wait for one rebuild.
    fn table(&self) -> Result<Arc<Vec<u8>>, serde_json::Error> {
        let mut cached = self.table.lock().unwrap_or_else(PoisonError::into_inner);
        let now = clock_ns(libc::CLOCK_BOOTTIME);
        if cached.0 != 0 && now.saturating_sub(cached.0) < TABLE_MAX_AGE_NS {
            return Ok(Arc::clone(&cached.1));
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
        *cached = (now, Arc::new(serde_json::to_vec(&rows)?));
        Ok(Arc::clone(&cached.1))
    }
}

impl Handler for Shared {
    fn get(&self, path: &str) -> Response {
        match path {
            "/api/v1/destinations" => match self.table() {
                Ok(body) => Response::json(body.as_ref().clone()),
                Err(e) => Response::text(500, format!("encoding the table: {e}\n")),
            },
            "/metrics" => {
                if let Err(e) = self.table() {
                    return Response::text(500, format!("encoding the table: {e}\n"));
                }
                Response { status: 200, content_type: metrics::CONTENT_TYPE, body: self.metrics.encode().into_bytes() }
            }
            "/healthz" => {
                let (ok, body) = self.health.report(clock_ns(libc::CLOCK_BOOTTIME));
                Response {
                    status: if ok { 200 } else { 503 },
                    content_type: "application/json",
                    body: body.into_bytes(),
                }
            }
            "/" => Response::text(200, "observer: GET /api/v1/destinations, GET /metrics, GET /healthz\n"),
            _ => Response::text(404, "not found; try /api/v1/destinations, /metrics or /healthz\n"),
        }
    }
}

/// Where decoded events go.
struct Sinks {
    print: Option<EventsFormat>,
    connections: bool,
    record: Option<BufWriter<File>>,
    decode_errors: u64,
    shared: Arc<Shared>,
    store: Option<Writer>,
    store_dropped: u64,
    volume: store::Volume,
    owners: Resolver,
    filter: Filter,
}

impl Sinks {
    fn handle(&mut self, mut ev: SockEvent) -> Result<()> {
        self.shared.health.events.fetch_add(1, Ordering::Relaxed);
        self.owners.enrich(&mut ev);
        if !self.filter.keeps_event(&ev) {
            return Ok(());
        }
        let ev = &ev;
        if let Some(rec) = self.record.as_mut() {
            writeln!(rec, "{}", ev.to_json_line()).context("writing the recording")?;
        }
        {
            let mut agg = self.shared.aggregator.lock().unwrap_or_else(PoisonError::into_inner);
            agg.ingest(ev);
            self.shared.metrics.observe(ev, agg.label_of(ev).as_ref());
            for r in agg.take_restarts() {
                self.shared.metrics.restart(&r);
                warn!(
                    "peer restart at {} ({}): {} connections closed at once, idle {:.3} to {:.3} s; not timeout evidence",
                    r.destination,
                    r.role.as_str(),
                    r.sockets,
                    r.min_idle_seconds,
                    r.max_idle_seconds
                );
            }
            self.shared.metrics.forget(&agg.take_gone());
            for c in agg.take_changes() {
                if let Some(w) = &self.store {
                    let _ = w.send(Record::Change(c.clone()));
                }
                warn!(
                    "path idle timeout of {} ({}) changed: was [{:?}, {:?}] s, now [{:?}, {:?}] s",
                    c.destination,
                    c.role.as_str(),
                    c.before_lower_seconds,
                    c.before_upper_seconds,
                    c.after_lower_seconds,
                    c.after_upper_seconds
                );
            }
        }
        if let Some(w) = &self.store {
            match ev.kind {
                EventKind::Closed => {}
                // Counted per minute in memory: a connection storm sends one
                // record per destination and minute, not one per connection.
                EventKind::Established => {
                    for r in self.volume.add(ev) {
                        let _ = w.send(r);
                    }
                }
                _ => {
                    let _ = w.send(Record::Event(ev.clone()));
                }
            }
        }
        let is_connection = matches!(ev.kind, EventKind::Established | EventKind::Closed);
        if is_connection && !self.connections {
            return Ok(());
        }
        match self.print {
            Some(EventsFormat::Text) => println!("{ev}"),
            Some(EventsFormat::Json) => println!("{}", ev.to_json_line()),
            None => {}
        }
        Ok(())
    }

    /// Log and export records the store had to drop since the last call.
    fn report_store_losses(&mut self) {
        let Some(w) = &self.store else { return };
        let now = w.dropped();
        if now > self.store_dropped {
            let n = now - self.store_dropped;
            self.shared.metrics.lost(metrics::reason::STORE_BACKLOG, n);
            warn!("the evidence store could not keep up: {n} records not stored ({now} in total); check the disk under --data-dir");
            self.store_dropped = now;
        }
    }
}

/// Open the store and rebuild the estimates from what it holds.
fn open_store(args: &RunArgs, aggregator: &mut Aggregator, filter: &Filter) -> Result<Writer> {
    let store = Store::open(&args.data_dir).context("opening the evidence store")?;
    let since = clock_ns(libc::CLOCK_REALTIME).saturating_sub(nanos(args.window));
    let mut events = store.events(None, since).context("reading stored evidence")?;
    // A store shared with an unfiltered run holds sockets this run does not watch.
    events.retain(|ev| filter.keeps_event(ev));
    for ev in &events {
        aggregator.ingest(ev);
    }
    // Replayed history is not news: no log lines or counters for it.
    aggregator.take_changes();
    aggregator.take_restarts();
    aggregator.take_gone();
    info!("evidence store {}: rebuilt the estimates from {} stored records", store.path().display(), events.len());
    let limits = store::Limits { retention_ns: nanos(args.retention), max_bytes: args.max_store_bytes };
    Writer::start(store, limits, store::QUEUE).context("starting the evidence store writer")
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Load and attach the probes, log each one. Nothing is mounted or
/// pinned: BTF programs need neither tracefs nor bpffs.
fn bring_up(args: &RunArgs) -> Result<Probes> {
    if !bpf::raise_memlock() {
        warn!("could not raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE); fine on kernels that account BPF memory to the cgroup (5.11+)");
    }
    let config = ProbeConfig {
        min_idle_ns: nanos(args.min_idle),
        stall_after_ns: nanos(args.stall_after),
        answer_within_ns: nanos(args.answer_within),
        emit_closed: args.connections && args.events.is_some(),
        ring_buffer_bytes: args.ring_buffer,
        bench_empty: args.bench_empty_probes,
        bench_toggle: args.bench_toggle,
    };
    if args.max_sockets.is_some() {
        warn!("--max-sockets is ignored: per-socket state lives in socket-local storage, freed with each socket");
    }
    let probes = Probes::load(&config).context("bringing up the probes")?;
    // Loading parsed the kernel's BTF three times, one copy at a time (tens
    // of MB each, freed now); glibc keeps freed heap resident until asked
    // to give it back.
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only returns free pages of the allocator's own
    // arenas to the kernel.
    unsafe {
        libc::malloc_trim(0);
    }
    for a in probes.attached() {
        let kind = match a.hook.kind {
            bpf::HookKind::BtfTracePoint => "tp_btf",
            bpf::HookKind::FEntry => "fentry",
            bpf::HookKind::Iter => "iter",
        };
        info!("attached {kind}/{} (program {}, id {})", a.hook.name, a.hook.program, a.prog_id);
    }
    Ok(probes)
}

/// Refresh the at-risk view and the tracked-socket gauge from the kernel.
/// Only client sockets idler than the smallest at-risk threshold are kept
/// (none while no destination has one), so a host with 100k sockets does
/// not copy its table at every refresh. A threshold that drops while the
/// table is read counts its sockets from the next refresh.
fn refresh_sockets(probes: &Probes, sinks: &mut Sinks) {
    let shared = Arc::clone(&sinks.shared);
    let floor = {
        let mut agg = shared.aggregator.lock().unwrap_or_else(PoisonError::into_inner);
        // Held peer closes become evidence (or a restart) and old
        // evidence expires even when no event arrives.
        agg.tick(clock_ns(libc::CLOCK_REALTIME));
        agg.at_risk_floor()
    };
    let now = clock_ns(libc::CLOCK_BOOTTIME);
    let mut views = Vec::new();
    let counted = probes.for_each_socket(|rec| {
        let Some(floor) = floor else { return };
        let Some(v) = crate::event::view_of(rec, now) else { return };
        // `--netns`/`--cgroup` keep the at-risk view to their sockets too.
        if v.role == crate::event::Role::Client
            && v.idle_seconds > floor
            && (sinks.filter.is_empty() || {
                let owner = sinks.owners.resolve(v.cgroup_id);
                sinks.filter.keeps(v.netns, owner.as_deref().map(|o| o.cgroup.as_str()))
            })
        {
            views.push(v);
        }
    });
    match counted {
        Ok(n) => {
            shared.metrics.set_tracked_sockets(n);
            shared.aggregator.lock().unwrap_or_else(PoisonError::into_inner).set_sockets(&views);
        }
        Err(e) => warn!("reading the socket table: {e}"),
    }
    let mut doomed = Vec::new();
    let walked = probes.for_each_doomed(|rec| {
        let Some(d) = crate::event::doomed_of(rec, now) else { return };
        let owner = sinks.owners.resolve(d.cgroup_id);
        if !sinks.filter.is_empty() && !sinks.filter.keeps(d.netns, owner.as_deref().map(|o| o.cgroup.as_str())) {
            return;
        }
        let who = ProcessOwner {
            process: if d.comm.is_empty() { "?".to_owned() } else { d.comm.clone() },
            container: owner.as_ref().and_then(|o| o.container.clone()),
            pod: owner.as_ref().and_then(|o| o.pod.clone()),
            unit: owner.as_ref().and_then(|o| o.unit.clone()),
        };
        doomed.push((d, who));
    });
    match walked {
        Ok(_) => shared.aggregator.lock().unwrap_or_else(PoisonError::into_inner).set_doomed(&doomed),
        Err(e) => warn!("reading the dead sockets: {e}"),
    }
}

/// The running kernel's release (`uname -r`).
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned())
}

/// Serve HTTP on a thread and runtime of its own: a scrape (which computes
/// the table) never delays the ring-buffer reader's runtime.
fn spawn_http(listener: std::net::TcpListener, shared: Arc<Shared>, limits: http::Limits) -> Result<()> {
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

/// What this run observes (`--netns`, `--cgroup`), where the cgroup tree
/// is, and the empty table keyed with the host's namespace.
fn scope(args: &RunArgs) -> Result<(Filter, Option<std::path::PathBuf>, Aggregator)> {
    let cgroup_root = owner::cgroup2_root();
    let filter = Filter::new(args.netns.as_deref(), args.cgroup.as_deref(), cgroup_root.as_deref())?;
    if !filter.is_empty() {
        info!(
            "observing only: netns={} cgroup={}",
            filter.netns.map_or_else(|| "any".to_owned(), |n| n.to_string()),
            filter.cgroup.as_deref().unwrap_or("any")
        );
    }
    if cgroup_root.is_none() {
        warn!("no cgroup v2 hierarchy is mounted: containers, pods and units stay unknown");
    }
    let host_netns = owner::host_netns();
    let aggregator = Aggregator::new(aggregate::Config {
        window_ns: nanos(args.window),
        max_destinations: args.max_destinations,
        host_netns,
    });
    Ok((filter, cgroup_root, aggregator))
}

/// Run the daemon until SIGINT or SIGTERM.
pub async fn run(args: RunArgs) -> Result<()> {
    // Before the store or the listen socket: a missing capability is named
    // first, and nothing is created by a daemon that cannot start.
    bpf::check_capabilities().context("checking capabilities")?;
    let (filter, cgroup_root, mut aggregator) = scope(&args)?;
    let writer = open_store(&args, &mut aggregator, &filter)?;
    let mut probes = bring_up(&args)?;
    let record = match &args.record {
        Some(path) => Some(BufWriter::new(
            File::options()
                .create(true)
                .append(true)
                .mode(0o600)
                .open(path)
                .with_context(|| format!("opening recording {}", path.display()))?,
        )),
        None => None,
    };
    let shared = Arc::new(Shared::new(aggregator));
    shared.metrics.set_build_info(env!("CARGO_PKG_VERSION"), probes.probe_set().name(), &kernel_release());
    shared.health.attached.store(true, Ordering::Relaxed);
    let listener = std::net::TcpListener::bind(&args.metrics_addr)
        .with_context(|| format!("listening on --metrics-addr {}; pick a free address", args.metrics_addr))?;
    listener.set_nonblocking(true).context("the HTTP listener")?;
    info!(
        "serving http://{}/api/v1/destinations, /metrics and /healthz",
        listener.local_addr().context("local address")?
    );
    spawn_http(
        listener,
        Arc::clone(&shared),
        http::Limits { allowed_hosts: args.allowed_hosts.clone(), ..http::Limits::default() },
    )?;
    let mut sinks = Sinks {
        print: args.events,
        connections: args.connections,
        record,
        decode_errors: 0,
        shared: Arc::clone(&shared),
        store: Some(writer),
        store_dropped: 0,
        volume: store::Volume::default(),
        owners: Resolver::new(cgroup_root),
        filter,
    };
    // One pass of the reader before the daemon says it runs: /healthz is
    // 200 from the first request a supervisor makes after that line.
    drain(&mut probes, &mut sinks)?;
    info!(
        "observer running: probe_set={} min_idle={:?} stall_after={:?} answer_within={:?} ring_buffer={}B",
        probes.probe_set().name(),
        args.min_idle,
        args.stall_after,
        args.answer_within,
        args.ring_buffer
    );

    let ring_fd = probes.ring_fd().context("duplicating the ring buffer fd")?;
    // SAFETY: `ring_fd` is an owned duplicate that lives inside the AsyncFd
    // and is closed only when the AsyncFd is dropped.
    let ring = unsafe { AsyncFd::register_with_interest(ring_fd, Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("watching the ring buffer: {e}"))?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    // Only with --bench-toggle: otherwise SIGUSR1 keeps its default action.
    let mut sigusr1 = if args.bench_toggle {
        Some(signal(SignalKind::user_defined1()).context("installing SIGUSR1 handler")?)
    } else {
        None
    };
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut refresh = tokio::time::interval(SOCKET_REFRESH);
    let mut reported = KernelCounters::default();

    loop {
        tokio::select! {
            guard = ring.readable() => {
                let mut guard = guard.context("waiting on the ring buffer")?;
                drain(&mut probes, &mut sinks)?;
                guard.clear_ready();
            }
            _ = tick.tick() => {
                drain(&mut probes, &mut sinks)?;
                report_losses(&probes, &mut reported, &shared.metrics);
                sinks.report_store_losses();
                if let Some(rec) = sinks.record.as_mut() {
                    rec.flush().context("flushing the recording")?;
                }
            }
            _ = refresh.tick() => refresh_sockets(&probes, &mut sinks),
            Some(()) = async { sigusr1.as_mut()?.recv().await } => {
                // A failed toggle must not end the daemon before its evidence is stored.
                match probes.toggle_hot_path() {
                    Ok(on) => info!("bench toggle: hot-path probes {}", if on { "attached" } else { "detached" }),
                    Err(e) => error!("bench toggle: {e}"),
                }
            }
            _ = sigterm.recv() => { info!("SIGTERM: detaching probes"); break; }
            _ = sigint.recv() => { info!("SIGINT: detaching probes"); break; }
        }
    }
    shut_down(probes, ring, &mut sinks, &mut reported)
}

/// Read what is left, detach the probes, and store the last evidence.
fn shut_down(
    mut probes: Probes,
    ring: AsyncFd<std::os::fd::OwnedFd>,
    sinks: &mut Sinks,
    reported: &mut KernelCounters,
) -> Result<()> {
    drain(&mut probes, sinks)?;
    report_losses(&probes, reported, &sinks.shared.metrics);
    if let Some(rec) = sinks.record.as_mut() {
        rec.flush().context("flushing the recording")?;
    }
    drop(ring);
    drop(probes);
    sinks.report_store_losses();
    if let Some(w) = sinks.store.take() {
        for r in sinks.volume.flush() {
            let _ = w.send(r);
        }
        w.finish();
    }
    info!("probes detached, evidence stored; exiting");
    Ok(())
}

fn drain(probes: &mut Probes, sinks: &mut Sinks) -> Result<()> {
    sinks.shared.health.heartbeat_ns.store(clock_ns(libc::CLOCK_BOOTTIME), Ordering::Relaxed);
    let mut result = Ok(());
    probes.drain(|ev| match ev {
        Ok(ev) => {
            if let Err(e) = sinks.handle(ev) {
                result = Err(e);
            }
        }
        Err(e) => {
            sinks.decode_errors += 1;
            sinks.shared.metrics.undecodable();
            error!("undecodable event ({} so far): {e}", sinks.decode_errors);
        }
    });
    if result.is_ok() {
        std::io::stdout().flush().ok();
    }
    result
}

fn report_losses(probes: &Probes, reported: &mut KernelCounters, metrics: &Metrics) {
    match probes.counters() {
        Ok(now) => {
            metrics.lost(metrics::reason::RING_BUFFER_FULL, now.ringbuf_full.saturating_sub(reported.ringbuf_full));
            metrics.lost(metrics::reason::SOCKET_STORAGE_FULL, now.map_full.saturating_sub(reported.map_full));
            metrics.lost(metrics::reason::DOOMED_TABLE_FULL, now.doomed_full.saturating_sub(reported.doomed_full));
            metrics.reuses_unresolved(now.reuse_unresolved.saturating_sub(reported.reuse_unresolved));
            if now.doomed_full > reported.doomed_full {
                warn!(
                    "{} dead sockets could not be counted in doomed_idle_sockets: the kernel's table of them (65,536) was full",
                    now.doomed_full - reported.doomed_full
                );
            }
            if now.ringbuf_full > reported.ringbuf_full {
                warn!(
                    "lost {} events because the ring buffer was full ({} in total); raise --ring-buffer",
                    now.ringbuf_full - reported.ringbuf_full,
                    now.ringbuf_full
                );
            }
            if now.map_full > reported.map_full {
                warn!(
                    "{} times the kernel refused socket-local storage for a socket (out of memory; {} in total): those sockets are not observed",
                    now.map_full - reported.map_full,
                    now.map_full
                );
            }
            *reported = now;
        }
        Err(e) => warn!("reading kernel counters: {e}"),
    }
}

#[cfg(test)]
mod tests;

//! `observer run`: brings the probes up, follows the ring buffer, prints or
//! records events, reports losses, and tears everything down on SIGINT/SIGTERM.
//! The events' way through the pipeline is [`pipeline`], the outputs that
//! never end the run [`outputs`]; what the HTTP
//! endpoint serves, health included, is [`api`].

use std::{
    sync::{atomic::Ordering, Arc},
    time::Duration,
};

use anyhow::{Context as _, Result};
use log::{error, info, warn};
use tokio::{
    io::{unix::AsyncFd, Interest},
    signal::unix::{signal, SignalKind},
};

use crate::{
    cli::RunArgs,
    diagnosis::aggregate::{self, Aggregator},
    kernel::bpf::{self, KernelCounters, ProbeConfig, Probes},
    kernel::event::clock_ns,
    kernel::owner::{self, Filter, Resolver},
    kernel::runtime::{KernelFiles, Listed},
    surfaces::http,
    surfaces::metrics::Metrics,
    surfaces::otlp,
    surfaces::store::{self, Store, Writer},
};

mod api;
mod enrich;
mod held;
mod outputs;
mod pipeline;
mod probe_feed;

use api::spawn_http;
pub use api::{DaemonState, Health};
use enrich::Enrich;
use outputs::{EventsOut, Recording};
use outputs::{OtlpOut, Outputs};
use pipeline::{drain, refresh_sockets, report_losses, Pipeline};

/// How often the at-risk view is refreshed from the kernel's socket table.
const SOCKET_REFRESH: Duration = Duration::from_secs(5);

/// Open the store and rebuild the estimates from what it holds.
fn open_store(args: &RunArgs, aggregator: &mut Aggregator, filter: &Filter) -> Result<Writer> {
    let store = Store::open(&args.data_dir, aggregator.host_netns()).context("opening the evidence store")?;
    let since = clock_ns(libc::CLOCK_REALTIME).saturating_sub(nanos(args.window));
    let mut replayed = 0u64;
    store
        .each_event(None, since, |ev| {
            // A store shared with an unfiltered run holds sockets this run
            // does not watch. Replayed history is not news: no log lines or
            // counters for it.
            if filter.keeps(ev.netns, ev.cgroup()) {
                aggregator.replay(std::iter::once(&ev));
                replayed += 1;
            }
        })
        .context("reading stored evidence")?;
    info!("evidence store {}: rebuilt the estimates from {replayed} stored records", store.path().display());
    let limits = store::Limits {
        retention_ns: nanos(args.retention),
        max_bytes: args.max_store_bytes,
        give_up_after: args.store_give_up,
    };
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
        #[cfg(feature = "bench")]
        bench_empty: args.bench_empty_probes,
        #[cfg(feature = "bench")]
        bench_toggle: args.bench_toggle,
        names: !args.no_names,
    };
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
            bpf::HookKind::FExit => "fexit",
            bpf::HookKind::Iter => "iter",
        };
        if a.on_demand {
            info!(
                "attached on demand {kind}/{}: only while a client socket reset or timed out idle waits for its application (program {}, id {})",
                a.hook.name, a.hook.program, a.prog_id
            );
        } else {
            info!("attached {kind}/{} (program {}, id {})", a.hook.name, a.hook.program, a.prog_id);
        }
    }
    Ok(probes)
}

/// The running kernel's release (`uname -r`).
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(|_| "unknown".to_owned(), |s| s.trim().to_owned())
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

/// Listen on `--metrics-addr` and serve the table, metrics and health.
fn serve_http(args: &RunArgs, shared: &Arc<DaemonState>) -> Result<()> {
    let listener = std::net::TcpListener::bind(&args.metrics_addr)
        .with_context(|| format!("listening on --metrics-addr {}; pick a free address", args.metrics_addr))?;
    listener.set_nonblocking(true).context("the HTTP listener")?;
    info!(
        "serving http://{}/api/v1/destinations, /metrics and /healthz",
        listener.local_addr().context("local address")?
    );
    spawn_http(
        listener,
        Arc::clone(shared),
        http::Limits { allowed_hosts: args.allowed_hosts.clone(), ..http::Limits::default() },
    )?;
    if let Some(addr) = &args.scrape_addr {
        let listener = std::net::TcpListener::bind(addr)
            .with_context(|| format!("listening on --scrape-addr {addr}; pick a free address"))?;
        listener.set_nonblocking(true).context("the scrape listener")?;
        info!("scrape port {}: /metrics and /healthz only", listener.local_addr().context("local address")?);
        spawn_http(
            listener,
            Arc::clone(shared),
            http::Limits {
                allowed_hosts: args.allowed_hosts.clone(),
                only: Some(http::SCRAPE_PATHS),
                ..http::Limits::default()
            },
        )?;
    }
    Ok(())
}

/// The OTLP settings from the flags and `OTEL_*` variables; None when no
/// endpoint is set.
fn otlp_settings(args: &RunArgs) -> Result<Option<otlp::Settings>> {
    otlp::resolve(
        args.otlp_endpoint.as_deref(),
        args.otlp_metrics_endpoint.as_deref(),
        args.otlp_logs_endpoint.as_deref(),
        args.otlp_protocol,
        args.otlp_headers.as_deref(),
        args.otlp_interval,
        args.otlp_timeout,
        args.otlp_logs,
    )
    .context("the OTLP settings")
}

/// Start the OTLP export: each collection reads the exposition a scrape
/// would get.
fn start_otlp(settings: &otlp::Settings, shared: &Arc<DaemonState>) -> Result<OtlpOut> {
    let source_state = Arc::clone(shared);
    let source: otlp::Source =
        Arc::new(move || source_state.bodies().ok().map(|(_, m)| String::from_utf8_lossy(&m).into_owned()));
    let tally = Arc::new(otlp::Tally::default());
    let export = otlp::Otlp::start(settings, shared.metrics.declared(), source, Arc::clone(&tally))
        .context("starting the OTLP export")?;
    Ok(OtlpOut::new(export, tally))
}

/// The pipeline for this run.
fn new_pipeline(
    args: &RunArgs,
    shared: &Arc<DaemonState>,
    writer: Writer,
    record: Option<Recording>,
    filter: Filter,
    cgroup_root: Option<std::path::PathBuf>,
) -> Result<Pipeline> {
    let events_out = if args.events.is_some() {
        Some(EventsOut::start().context("starting the --events writer thread")?)
    } else {
        None
    };
    Ok(Pipeline {
        enrich: Enrich::new(Resolver::new(cgroup_root), filter, &args.data_dir),
        outputs: Outputs::new(args.events, args.connections, record, events_out, writer),
        shared: Arc::clone(shared),
        probe_feed: probe_feed::ProbeFeed::new(&args.data_dir, nanos(args.window)),
        more: false,
        decode_errors: 0,
    })
}

/// The kernel's list of a process's mapped files, as the runtime
/// resolver reads it.
fn kernel_files(mut files: bpf::ProcessFiles) -> KernelFiles {
    Box::new(move |pid| {
        let start = std::time::Instant::now();
        let listed = files.of(pid)?;
        log::debug!(
            "process {pid}: {} mapped files listed by the kernel in {:?} ({})",
            listed.len(),
            start.elapsed(),
            if files.per_process() { "its tasks alone" } else { "every task walked" }
        );
        Ok(Listed::of(&listed))
    })
}

/// Run the daemon until SIGINT or SIGTERM.
pub async fn run(args: RunArgs) -> Result<()> {
    // Before the store or the listen socket: a missing capability is named
    // first, and nothing is created by a daemon that cannot start.
    let otlp = otlp_settings(&args)?;
    bpf::check_capabilities().context("checking capabilities")?;
    let (filter, cgroup_root, mut aggregator) = scope(&args)?;
    let writer = open_store(&args, &mut aggregator, &filter)?;
    let mut probes = bring_up(&args)?;
    let record = match &args.record {
        Some(path) => {
            Some(outputs::Recording::open(path).with_context(|| format!("opening the recording {}", path.display()))?)
        }
        None => None,
    };
    let shared = Arc::new(DaemonState::new(aggregator, Metrics::new(args.metrics_histograms)));
    let _ = shared.health.store.set(writer.state());
    shared.metrics.set_build_info(env!("CARGO_PKG_VERSION"), probes.probe_set().name(), &kernel_release());
    shared.health.attached.store(true, Ordering::Relaxed);
    serve_http(&args, &shared)?;
    let mut pipeline = new_pipeline(&args, &shared, writer, record, filter, cgroup_root)?;
    if let Some(settings) = &otlp {
        pipeline.outputs.export_otlp(start_otlp(settings, &shared)?);
    }
    // Before the daemon says it runs: a supervisor's SIGTERM right after
    // that line must stop it cleanly, not kill it (the default action).
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    // Only with --bench-toggle (the `bench` build): otherwise SIGUSR1 keeps
    // its default action.
    #[cfg(feature = "bench")]
    let mut sigusr1 = if args.bench_toggle {
        Some(signal(SignalKind::user_defined1()).context("installing SIGUSR1 handler")?)
    } else {
        None
    };
    #[cfg(not(feature = "bench"))]
    let mut sigusr1: Option<tokio::signal::unix::Signal> = None;
    // One pass of the reader before the daemon says it runs: /healthz is
    // 200 from the first request a supervisor makes after that line. One
    // walk of the sockets too: it enters the listeners older than the
    // probes, and a socket older than them is told client or server by
    // them from then on (before it, by its ports).
    drain(&mut probes, &mut pipeline);
    refresh_sockets(&mut probes, &mut pipeline);
    pipeline.poll_probes();
    info!(
        "observer running: probe_set={} min_idle={:?} stall_after={:?} answer_within={:?} ring_buffer={}B",
        probes.probe_set().name(),
        args.min_idle,
        args.stall_after,
        args.answer_within,
        args.ring_buffer
    );

    // Where other users' processes are closed to the daemon (the unit's
    // capabilities), the kernel lists their mapped files instead: loaded
    // once the daemon is up, never where /proc is readable.
    if std::fs::read_link("/proc/1/exe").is_err() {
        if let Some(files) = probes.load_process_files() {
            pipeline.enrich.runtimes.use_kernel_files(kernel_files(files));
        }
    }
    let ring_fd = probes.ring_fd().context("duplicating the ring buffer fd")?;
    // SAFETY: `ring_fd` is an owned duplicate that lives inside the AsyncFd
    // and is closed only when the AsyncFd is dropped.
    let ring = unsafe { AsyncFd::register_with_interest(ring_fd, Interest::READABLE) }
        .map_err(|e| anyhow::anyhow!("watching the ring buffer: {e}"))?;
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut refresh = tokio::time::interval_at(tokio::time::Instant::now() + SOCKET_REFRESH, SOCKET_REFRESH);
    let mut reported = KernelCounters::default();
    let owners_answered = pipeline.enrich.owners.walked();

    loop {
        tokio::select! {
            guard = ring.readable() => {
                // Readiness is cleared before reading, never after: the
                // kernel wakes the reader only when the ring goes from
                // empty to not empty, so a wake-up that came between the
                // last read and a later clear would be erased, and the
                // ring would fill until the next tick.
                guard.context("waiting on the ring buffer")?.clear_ready();
                drain(&mut probes, &mut pipeline);
                if pipeline.stop() { break; }
            }
            _ = tick.tick() => {
                every_second(&mut probes, &mut pipeline, &mut reported);
                if pipeline.stop() { break; }
            }
            _ = refresh.tick() => refresh_sockets(&mut probes, &mut pipeline),
            // The cgroup thread answered: events waiting for an owner go on.
            () = owners_answered.notified() => {
                pipeline.release(false);
                if pipeline.stop() { break; }
            }
            // The last drain stopped at its cap: read on, after whatever
            // else is ready (the branches are polled in random order).
            () = std::future::ready(()), if pipeline.more => {
                drain(&mut probes, &mut pipeline);
                if pipeline.stop() { break; }
            }
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
    shut_down(probes, ring, &mut pipeline, &mut reported);
    Ok(())
}

/// The loop's second: read the ring, tend the failed-write hook, let go
/// events that waited their longest for an owner, and report losses.
fn every_second(probes: &mut Probes, pipeline: &mut Pipeline, reported: &mut KernelCounters) {
    drain(probes, pipeline);
    if pipeline.stop() {
        return;
    }
    if let Err(e) = probes.tend_failed_writes() {
        warn!("the failed-write hook: {e}");
    }
    if let Some((on, attaches)) = probes.failed_write_hook() {
        pipeline.shared.metrics.set_failed_write_hook(on, attaches);
    }
    pipeline.release(false);
    report_losses(probes, reported, &pipeline.shared.metrics);
    pipeline.outputs.report_store_losses(&pipeline.shared.metrics);
    pipeline.outputs.report_otlp(&pipeline.shared.metrics);
    pipeline.outputs.flush_record(&pipeline.shared.metrics);
    pipeline.outputs.flush_volume();
    pipeline.poll_probes();
}

/// Read what is left, detach the probes, and store the last evidence.
fn shut_down(
    mut probes: Probes,
    ring: AsyncFd<std::os::fd::OwnedFd>,
    pipeline: &mut Pipeline,
    reported: &mut KernelCounters,
) {
    drain(&mut probes, pipeline);
    pipeline.release(true);
    report_losses(&probes, reported, &pipeline.shared.metrics);
    pipeline.outputs.flush_record(&pipeline.shared.metrics);
    drop(ring);
    drop(probes);
    pipeline.outputs.report_store_losses(&pipeline.shared.metrics);
    pipeline.outputs.finish();
    info!("probes detached, evidence stored; exiting");
}

#[cfg(test)]
mod tests;

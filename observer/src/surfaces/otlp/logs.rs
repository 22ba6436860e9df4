//! Failed reuses as OTLP log records: a logger whose processor hands each
//! record to a bounded queue (full: dropped and counted, never waited
//! for), and a thread of its own that sends them in batches.

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc::{sync_channel, Receiver, RecvTimeoutError, SyncSender, TrySendError},
        Arc,
    },
    time::{Duration, Instant, SystemTime},
};

use opentelemetry::{
    logs::{AnyValue, LogRecord as _, Logger as _, LoggerProvider as _, Severity},
    InstrumentationScope,
};
use opentelemetry_otlp::LogExporter;
use opentelemetry_sdk::{
    error::OTelSdkResult,
    logs::{LogBatch, LogExporter as _, LogProcessor, SdkLogRecord, SdkLogger, SdkLoggerProvider},
    Resource,
};

use super::Tally;
use crate::kernel::event::SockEvent;

/// Log records waiting for the sender at most: a collector down for its
/// timeout and retries (about 15 s) at a burst of failures fills it, and
/// the rest is dropped and counted, never waited for.
pub const LOG_QUEUE: usize = 4096;
/// Log records per export at most.
const LOG_BATCH: usize = 512;

/// Failed reuses as log records: a logger whose processor hands each
/// record to a bounded queue, and a thread that sends them in batches.
pub(super) struct FailureLogs {
    provider: SdkLoggerProvider,
    logger: SdkLogger,
    sender: Option<std::thread::JoinHandle<()>>,
    stop: Arc<AtomicBool>,
}

#[derive(Debug)]
pub(super) struct Queue {
    pub(super) tx: SyncSender<(SdkLogRecord, InstrumentationScope)>,
    pub(super) tally: Arc<Tally>,
}

impl LogProcessor for Queue {
    fn emit(&self, data: &mut SdkLogRecord, scope: &InstrumentationScope) {
        match self.tx.try_send((data.clone(), scope.clone())) {
            Ok(()) => {}
            Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => {
                self.tally.logs_dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn force_flush(&self) -> OTelSdkResult {
        Ok(())
    }

    fn shutdown_with_timeout(&self, _timeout: Duration) -> OTelSdkResult {
        Ok(())
    }
}

impl FailureLogs {
    pub(super) fn start(
        mut exporter: LogExporter,
        resource: &Resource,
        runtime: tokio::runtime::Handle,
        tally: Arc<Tally>,
        url: String,
    ) -> Self {
        exporter.set_resource(resource);
        let (tx, rx) = sync_channel(LOG_QUEUE);
        let provider = SdkLoggerProvider::builder()
            .with_resource(resource.clone())
            .with_log_processor(Queue { tx, tally: Arc::clone(&tally) })
            .build();
        let logger = provider.logger_with_scope(
            InstrumentationScope::builder("observer").with_version(env!("CARGO_PKG_VERSION")).build(),
        );
        let stop = Arc::new(AtomicBool::new(false));
        let s = Arc::clone(&stop);
        let sender = std::thread::Builder::new()
            .name("observer-otlp-logs".into())
            .spawn(move || send_loop(&rx, &exporter, &runtime, &tally, &url, &s))
            .map_err(|e| log::warn!("failed reuses are not sent as OTLP log records: starting their thread: {e}"))
            .ok();
        Self { provider, logger, sender, stop }
    }

    pub(super) fn send(&self, ev: &SockEvent, destination: &str) {
        let mut r = self.logger.create_log_record();
        let at = SystemTime::UNIX_EPOCH + Duration::from_nanos(ev.ts_unix_ns);
        r.set_timestamp(at);
        r.set_observed_timestamp(SystemTime::now());
        r.set_event_name("observer.failed_reuse");
        r.set_severity_number(Severity::Warn);
        r.set_severity_text("WARN");
        let outcome = ev.outcome().map_or("unknown", |o| o.as_str());
        r.set_body(AnyValue::from(format!(
            "{outcome} on a connection to {} reused after {:.3} s idle",
            ev.remote, ev.idle_seconds
        )));
        r.add_attribute("server.address", ev.remote.ip().to_string());
        r.add_attribute("server.port", i64::from(ev.remote.port()));
        r.add_attribute("client.address", ev.local.ip().to_string());
        r.add_attribute("client.port", i64::from(ev.local.port()));
        r.add_attribute("network.type", if ev.remote.is_ipv4() { "ipv4" } else { "ipv6" });
        r.add_attribute("network.transport", "tcp");
        r.add_attribute("observer.destination", destination.to_owned());
        r.add_attribute("observer.role", ev.role.as_str());
        r.add_attribute("observer.outcome", outcome);
        r.add_attribute("observer.idle_seconds", ev.idle_seconds);
        r.add_attribute("observer.safe_to_retry", ev.safe_to_retry());
        if ev.pid != 0 {
            r.add_attribute("process.pid", i64::from(ev.pid));
        }
        r.add_attribute("process.executable.name", ev.process.clone().unwrap_or_else(|| ev.comm.clone()));
        r.add_attribute("thread.name", ev.comm.clone());
        if let Some(from) = ev.reset.as_ref().and_then(|a| a.reset_from) {
            r.add_attribute("observer.reset_from", from.as_str());
        }
        self.logger.emit(r);
    }

    pub(super) fn shutdown(mut self, timeout: Duration) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.provider.shutdown_with_timeout(timeout);
        drop(self.provider);
        drop(self.logger);
        if let Some(h) = self.sender.take() {
            let deadline = Instant::now() + timeout;
            while !h.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if h.is_finished() {
                let _ = h.join();
            }
        }
    }
}

/// Send what the queue holds, a batch at a time: as soon as a record
/// waits, with whatever else came within 200 ms.
fn send_loop(
    rx: &Receiver<(SdkLogRecord, InstrumentationScope)>,
    exporter: &LogExporter,
    runtime: &tokio::runtime::Handle,
    tally: &Tally,
    url: &str,
    stop: &AtomicBool,
) {
    let mut batch = Vec::with_capacity(LOG_BATCH);
    loop {
        match rx.recv_timeout(Duration::from_millis(500)) {
            Ok(r) => batch.push(r),
            Err(RecvTimeoutError::Timeout) => {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                continue;
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let until = Instant::now() + Duration::from_millis(200);
        while batch.len() < LOG_BATCH {
            match rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                Ok(r) => batch.push(r),
                Err(_) => break,
            }
        }
        let refs: Vec<(&SdkLogRecord, &InstrumentationScope)> = batch.iter().map(|(r, s)| (r, s)).collect();
        let r = runtime.block_on(exporter.export(LogBatch::new(&refs)));
        if r.is_err() {
            tally.logs_unsent.fetch_add(batch.len() as u64, Ordering::Relaxed);
        }
        tally.outcome("logs", url, &r);
        batch.clear();
    }
}

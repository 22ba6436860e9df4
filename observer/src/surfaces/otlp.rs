//! OTLP export: the lean `/metrics` series pushed to an OpenTelemetry
//! collector on the SDK's periodic reader, and, opt-in, each failed reuse
//! as a log record. Configured as every OpenTelemetry SDK is (the
//! `OTEL_EXPORTER_OTLP_*` variables, through the `run` flags that read
//! them); nothing is sent unless an endpoint is set.
//!
//! A collector that is down or slow never holds the daemon: the exports
//! run on threads of their own (the periodic reader's, the log sender's)
//! with the exporter's timeout and retries, log records wait in a bounded
//! queue that drops and counts when full, and every failed export is
//! counted ([`Tally`]) for `/metrics`.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use opentelemetry::{metrics::MeterProvider as _, InstrumentationScope, KeyValue};
use opentelemetry_otlp::{
    LogExporter, MetricExporter, Protocol, WithExportConfig as _, WithHttpConfig as _, WithTonicConfig as _,
};
use opentelemetry_sdk::{
    error::OTelSdkResult,
    metrics::{data::ResourceMetrics, exporter::PushMetricExporter, PeriodicReader, SdkMeterProvider, Temporality},
    resource::EnvResourceDetector,
    Resource,
};

use crate::kernel::event::SockEvent;

mod logs;
pub mod series;

use logs::FailureLogs;
pub use logs::LOG_QUEUE;
use series::{Kind, Snapshot, Value};

/// The transport, as `OTEL_EXPORTER_OTLP_PROTOCOL` names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// `http/protobuf` (the default): port 4318, paths `/v1/metrics` and `/v1/logs`.
    HttpProtobuf,
    /// `grpc`: port 4317.
    Grpc,
}

impl Transport {
    /// Parse `OTEL_EXPORTER_OTLP_PROTOCOL`'s values.
    ///
    /// # Errors
    /// Anything but `http/protobuf` and `grpc`, naming what is accepted.
    pub fn parse(s: &str) -> Result<Self, String> {
        match s {
            "http/protobuf" => Ok(Self::HttpProtobuf),
            "grpc" => Ok(Self::Grpc),
            "http/json" => Err("`http/json` is not supported: use `http/protobuf` (the default) or `grpc`".to_owned()),
            other => Err(format!("unknown OTLP protocol `{other}`: use `http/protobuf` (the default) or `grpc`")),
        }
    }

    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::HttpProtobuf => "http/protobuf",
            Self::Grpc => "grpc",
        }
    }
}

/// Where and how to send, resolved from the flags and variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settings {
    pub transport: Transport,
    /// The metrics endpoint, complete (`.../v1/metrics` over HTTP).
    pub metrics_url: String,
    /// The logs endpoint when failed reuses are sent as log records.
    pub logs_url: Option<String>,
    pub headers: Vec<(String, String)>,
    pub interval: Duration,
    pub timeout: Duration,
}

/// What can be wrong with the OTLP settings or the exporter.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("OTEL_EXPORTER_OTLP_HEADERS (--otlp-headers) entry `{0}` is not `key=value`; write `k1=v1,k2=v2`")]
    Header(String),
    #[error("the OTLP endpoint `{0}` is not an http:// URL; write e.g. http://localhost:4318 (http/protobuf) or http://localhost:4317 (grpc)")]
    Endpoint(String),
    #[error("the OTLP endpoint `{0}` asks for TLS, which this build does not speak to a collector: send to a collector on the node over http:// (a node agent, as the DaemonSet's commented lines do), and let it forward over TLS")]
    Tls(String),
    #[error("building the OTLP {signal} exporter for {url}: {message}")]
    Build { signal: &'static str, url: String, message: String },
    #[error("starting the OTLP runtime: {0}")]
    Runtime(std::io::Error),
}

/// The settings, or None when no endpoint is set (nothing is exported).
/// `endpoint` is `OTEL_EXPORTER_OTLP_ENDPOINT` (the signals' paths are
/// added over HTTP), `metrics_endpoint` and `logs_endpoint` the
/// per-signal variables, taken as they are, as the specification says.
///
/// # Errors
/// A header that is not `key=value`, an endpoint that is not a URL.
#[allow(clippy::too_many_arguments, reason = "one argument per OTLP setting, each from its own flag")]
pub fn resolve(
    endpoint: Option<&str>,
    metrics_endpoint: Option<&str>,
    logs_endpoint: Option<&str>,
    transport: Transport,
    headers: Option<&str>,
    interval: Duration,
    timeout: Duration,
    logs: bool,
) -> Result<Option<Settings>, OtlpError> {
    let endpoint = endpoint.filter(|e| !e.is_empty());
    let signal = |explicit: Option<&str>, path: &str| -> Option<String> {
        explicit.filter(|e| !e.is_empty()).map(str::to_owned).or_else(|| {
            endpoint.map(|e| match transport {
                Transport::HttpProtobuf => format!("{}/{path}", e.trim_end_matches('/')),
                Transport::Grpc => e.to_owned(),
            })
        })
    };
    let Some(metrics_url) = signal(metrics_endpoint, "v1/metrics") else { return Ok(None) };
    let logs_url = if logs { signal(logs_endpoint, "v1/logs") } else { None };
    for url in std::iter::once(&metrics_url).chain(logs_url.as_ref()) {
        if url.starts_with("https://") {
            return Err(OtlpError::Tls(url.clone()));
        }
        if !url.starts_with("http://") {
            return Err(OtlpError::Endpoint(url.clone()));
        }
    }
    let headers = parse_headers(headers.unwrap_or(""))?;
    Ok(Some(Settings { transport, metrics_url, logs_url, headers, interval, timeout }))
}

/// `OTEL_EXPORTER_OTLP_HEADERS`: `k1=v1,k2=v2`, values percent-decoded.
fn parse_headers(s: &str) -> Result<Vec<(String, String)>, OtlpError> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').ok_or_else(|| OtlpError::Header(p.to_owned()))?;
            let k = k.trim();
            if k.is_empty() {
                return Err(OtlpError::Header(p.to_owned()));
            }
            Ok((k.to_owned(), percent_decode(v.trim())))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        if b[i] == b'%' && i + 2 < b.len() {
            if let (Some(h), Some(l)) = (hex(b[i + 1]), hex(b[i + 2])) {
                out.push(u8::try_from(h * 16 + l).unwrap_or(b'?'));
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Export outcomes, for `/metrics` (`observer_otlp_export_failures_total`
/// and the loss counter's `otlp_logs_*` reasons) and the logs.
#[derive(Debug, Default)]
pub struct Tally {
    pub metrics_exports: AtomicU64,
    pub metrics_failures: AtomicU64,
    pub logs_exports: AtomicU64,
    pub logs_failures: AtomicU64,
    /// Log records the full queue refused.
    pub logs_dropped: AtomicU64,
    /// Log records in batches the collector did not take.
    pub logs_unsent: AtomicU64,
    /// The last export failed (logged once per change).
    failing: AtomicBool,
}

impl Tally {
    pub(super) fn outcome(&self, signal: &'static str, url: &str, r: &OTelSdkResult) {
        let (ok, failed) = match signal {
            "metrics" => (&self.metrics_exports, &self.metrics_failures),
            _ => (&self.logs_exports, &self.logs_failures),
        };
        match r {
            Ok(()) => {
                ok.fetch_add(1, Ordering::Relaxed);
                if self.failing.swap(false, Ordering::Relaxed) {
                    log::info!("OTLP export to {url} works again");
                }
            }
            Err(e) => {
                failed.fetch_add(1, Ordering::Relaxed);
                if !self.failing.swap(true, Ordering::Relaxed) {
                    log::warn!(
                        "OTLP {signal} export to {url} failed: {e}; counted in observer_otlp_export_failures_total, retried at the next export"
                    );
                }
            }
        }
    }
}

/// The `/metrics` body, as a scrape would get it.
pub type Source = Arc<dyn Fn() -> Option<String> + Send + Sync>;

/// A running export: the meter provider (its reader's thread), the log
/// sender, and the runtime the transports need.
pub struct Otlp {
    meters: SdkMeterProvider,
    logs: Option<FailureLogs>,
    runtime: Option<tokio::runtime::Runtime>,
}

impl Otlp {
    /// Start exporting: `source` gives the exposition at each collection,
    /// whose families are read once from `declared` (an exposition of the
    /// empty registry, which lists every family).
    ///
    /// # Errors
    /// The runtime or an exporter could not be built.
    pub fn start(settings: &Settings, declared: &str, source: Source, tally: Arc<Tally>) -> Result<Self, OtlpError> {
        // hyper and tonic need tokio's reactor, which the periodic reader's
        // thread does not run: one worker of their own, so an export never
        // waits for the daemon's reader or its HTTP server.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("observer-otlp")
            .enable_all()
            .build()
            .map_err(OtlpError::Runtime)?;
        let resource = resource();
        let exporter = {
            let _in = runtime.enter();
            metric_exporter(settings)?
        };
        let exporter = Counted {
            inner: exporter,
            runtime: runtime.handle().clone(),
            tally: Arc::clone(&tally),
            url: settings.metrics_url.clone(),
        };
        let reader = PeriodicReader::builder(exporter).with_interval(settings.interval).build();
        let meters = SdkMeterProvider::builder().with_resource(resource.clone()).with_reader(reader).build();
        register(&meters, declared, source, settings.interval);
        let logs = match &settings.logs_url {
            Some(url) => {
                let exporter = {
                    let _in = runtime.enter();
                    log_exporter(settings, url)?
                };
                Some(FailureLogs::start(exporter, &resource, runtime.handle().clone(), tally, url.clone()))
            }
            None => None,
        };
        log::info!(
            "OTLP export to {} ({}) every {} s{}",
            settings.metrics_url,
            settings.transport.as_str(),
            settings.interval.as_secs_f64(),
            settings.logs_url.as_ref().map_or_else(String::new, |u| format!("; failed reuses as log records to {u}"))
        );
        Ok(Self { meters, logs, runtime: Some(runtime) })
    }

    /// Send a failed reuse as a log record (when logs are on).
    pub fn failed_reuse(&self, ev: &SockEvent, destination: &str) {
        if let Some(l) = &self.logs {
            l.send(ev, destination);
        }
    }

    /// Export what is left and stop, within `timeout` for each signal.
    pub fn shutdown(mut self, timeout: Duration) {
        if let Err(e) = self.meters.shutdown_with_timeout(timeout) {
            log::warn!("OTLP metrics at shutdown: {e}");
        }
        if let Some(l) = self.logs.take() {
            l.shutdown(timeout);
        }
    }
}

impl Drop for Otlp {
    fn drop(&mut self) {
        // The daemon stops inside its own runtime, where a runtime may not
        // be waited for: the exports are done or timed out by now.
        if let Some(rt) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

fn resource() -> Resource {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").map(|h| h.trim().to_owned()).unwrap_or_default();
    let mut base =
        vec![KeyValue::new("service.name", "observer"), KeyValue::new("service.version", env!("CARGO_PKG_VERSION"))];
    if !host.is_empty() {
        base.push(KeyValue::new("host.name", host));
    }
    // OTEL_RESOURCE_ATTRIBUTES (k8s.node.name from the DaemonSet) over
    // these, and OTEL_SERVICE_NAME over both, as the specification says.
    let builder = Resource::builder_empty().with_attributes(base).with_detector(Box::new(EnvResourceDetector::new()));
    match std::env::var("OTEL_SERVICE_NAME") {
        Ok(name) if !name.is_empty() => builder.with_service_name(name).build(),
        _ => builder.build(),
    }
}

fn metric_exporter(s: &Settings) -> Result<MetricExporter, OtlpError> {
    let built = match s.transport {
        Transport::HttpProtobuf => MetricExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(&s.metrics_url)
            .with_timeout(s.timeout)
            .with_headers(s.headers.iter().cloned().collect::<HashMap<_, _>>())
            .with_temporality(Temporality::Cumulative)
            .build(),
        Transport::Grpc => MetricExporter::builder()
            .with_tonic()
            .with_endpoint(&s.metrics_url)
            .with_timeout(s.timeout)
            .with_metadata(metadata(&s.headers))
            .with_temporality(Temporality::Cumulative)
            .build(),
    };
    built.map_err(|e| OtlpError::Build { signal: "metrics", url: s.metrics_url.clone(), message: e.to_string() })
}

fn log_exporter(s: &Settings, url: &str) -> Result<LogExporter, OtlpError> {
    let built = match s.transport {
        Transport::HttpProtobuf => LogExporter::builder()
            .with_http()
            .with_protocol(Protocol::HttpBinary)
            .with_endpoint(url)
            .with_timeout(s.timeout)
            .with_headers(s.headers.iter().cloned().collect::<HashMap<_, _>>())
            .build(),
        Transport::Grpc => LogExporter::builder()
            .with_tonic()
            .with_endpoint(url)
            .with_timeout(s.timeout)
            .with_metadata(metadata(&s.headers))
            .build(),
    };
    built.map_err(|e| OtlpError::Build { signal: "logs", url: url.to_owned(), message: e.to_string() })
}

fn metadata(headers: &[(String, String)]) -> opentelemetry_otlp::tonic_types::metadata::MetadataMap {
    let mut map = HashMap::new();
    for (k, v) in headers {
        map.insert(k.to_ascii_lowercase(), v.clone());
    }
    let http: http_headers::HeaderMap = map
        .iter()
        .filter_map(|(k, v)| {
            Some((
                http_headers::HeaderName::try_from(k.as_str()).ok()?,
                http_headers::HeaderValue::try_from(v.as_str()).ok()?,
            ))
        })
        .collect();
    opentelemetry_otlp::tonic_types::metadata::MetadataMap::from_headers(http)
}

use hyper::http as http_headers;

/// One observable instrument per family, each reading the exposition of
/// the current collection ([`Snapshots`]).
fn register(meters: &SdkMeterProvider, declared: &str, source: Source, interval: Duration) {
    let meter = meters
        .meter_with_scope(InstrumentationScope::builder("observer").with_version(env!("CARGO_PKG_VERSION")).build());
    let snapshots = Arc::new(Snapshots::new(source, interval));
    for family in series::families(declared) {
        let (prom, s) = (family.prometheus.clone(), Arc::clone(&snapshots));
        match family.kind {
            Kind::Sum => {
                meter
                    .u64_observable_counter(family.name)
                    .with_unit(family.unit)
                    .with_description(family.description)
                    .with_callback(move |o| {
                        for p in s.get().points(&prom) {
                            o.observe(count(p.value), &key_values(&p.attributes));
                        }
                    })
                    .build();
            }
            Kind::Gauge => {
                meter
                    .f64_observable_gauge(family.name)
                    .with_unit(family.unit)
                    .with_description(family.description)
                    .with_callback(move |o| {
                        for p in s.get().points(&prom) {
                            o.observe(p.value, &key_values(&p.attributes));
                        }
                    })
                    .build();
            }
        }
    }
}

#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a counter's value: finite, whole and non-negative"
)]
fn count(v: f64) -> u64 {
    if v.is_finite() && v > 0.0 {
        v.round() as u64
    } else {
        0
    }
}

fn key_values(attributes: &[(String, Value)]) -> Vec<KeyValue> {
    attributes
        .iter()
        .map(|(k, v)| match v {
            Value::Str(s) => KeyValue::new(k.clone(), s.clone()),
            Value::Int(i) => KeyValue::new(k.clone(), *i),
        })
        .collect()
}

/// The exposition read once per collection: every instrument's callback
/// of one collection runs within milliseconds, so a snapshot younger than
/// `fresh` is that collection's. `fresh` stays under half the export
/// interval: a snapshot kept a second served the next collection too at a
/// 500 ms interval, which then exported values a collection old.
pub(super) struct Snapshots {
    source: Source,
    fresh: Duration,
    last: Mutex<Option<(Instant, Arc<Snapshot>)>>,
}

impl Snapshots {
    pub(super) fn new(source: Source, interval: Duration) -> Self {
        Self { source, fresh: SNAPSHOT_FRESH.min(interval / 2), last: Mutex::new(None) }
    }

    fn get(&self) -> Arc<Snapshot> {
        self.get_at(Instant::now())
    }

    pub(super) fn get_at(&self, now: Instant) -> Arc<Snapshot> {
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, s)) = last.as_ref() {
            if now.saturating_duration_since(*at) < self.fresh {
                return Arc::clone(s);
            }
        }
        let snap = Arc::new(self.source.as_ref()().map_or_else(Snapshot::default, |body| Snapshot::read(&body)));
        *last = Some((now, Arc::clone(&snap)));
        snap
    }
}

/// How long one collection's snapshot is kept at most: its callbacks run
/// within milliseconds of each other.
const SNAPSHOT_FRESH: Duration = Duration::from_millis(100);

/// The metric exporter, run on the export runtime and counted.
struct Counted {
    inner: MetricExporter,
    runtime: tokio::runtime::Handle,
    tally: Arc<Tally>,
    url: String,
}

impl PushMetricExporter for Counted {
    fn export(&self, metrics: &ResourceMetrics) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        // Called on the periodic reader's thread, which no runtime runs.
        let r = self.runtime.block_on(self.inner.export(metrics));
        self.tally.outcome("metrics", &self.url, &r);
        std::future::ready(r)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn temporality(&self) -> Temporality {
        self.inner.temporality()
    }
}

#[cfg(test)]
mod tests;

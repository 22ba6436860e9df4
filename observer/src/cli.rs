//! Command-line interface (clap derive). Every flag is documented in the README.

use std::{fmt::Write as _, path::PathBuf, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};

use crate::surfaces::otlp::Transport;

#[derive(Debug, Parser)]
#[command(
    name = "observer",
    version,
    about = "Finds idle-timeout mismatches between connection pools and the network path, from the kernel"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the daemon: load and attach the probes and follow every TCP socket.
    // Boxed: its flags are most of the enum's size (clippy's large_enum_variant).
    Run(Box<RunArgs>),
    /// Ask the running daemon for the destination table.
    Status(StatusArgs),
    /// Run the daemon's aggregation offline over a recording (`run --record`).
    Analyze(AnalyzeArgs),
    /// Check a path's timeout staircases on paper.
    #[command(subcommand)]
    Path(PathCommand),
    /// Write the evidence report for one destination (reads the store; no daemon needed).
    Report(ReportArgs),
    /// Measure a path's idle timeout now: idle connections and TCP keep-alive probes, no request at risk (exit 0 measured, 1 nothing closed within --up-to, 2 bad input or unreachable).
    Probe(ProbeArgs),
    /// Tools for tests and benchmarks.
    #[command(subcommand, hide = true)]
    Debug(DebugCommand),
}

/// Report formats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ReportFormat {
    Html,
    Md,
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct ReportArgs {
    /// The destination, `ip:port` (IPv6 as `[addr]:port`).
    #[arg(long)]
    pub destination: String,
    /// Evidence from this long ago until now.
    #[arg(long, value_parser = parse_duration, default_value = "14days")]
    pub since: Duration,
    #[arg(long, value_enum, default_value = "html")]
    pub format: ReportFormat,
    /// Write here instead of standard output.
    #[arg(short = 'o', long = "output")]
    pub output: Option<PathBuf>,
    /// Directory of the evidence store.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Read a recording (`run --record`) instead of the store.
    #[arg(long)]
    pub recording: Option<PathBuf>,
    #[command(flatten)]
    pub select: SelectArgs,
}

/// Which row of a destination: needed when one address was seen in both
/// roles or from several network namespaces.
#[derive(Debug, Clone, Copy, Default, clap::Args)]
pub struct SelectArgs {
    /// The row's role (default: the only one seen).
    #[arg(long, value_enum)]
    pub role: Option<RoleArg>,
    /// The row's network namespace inode, as rows show it (`0`: the
    /// host's); default: the only one seen.
    #[arg(long, value_name = "INODE")]
    pub netns: Option<u32>,
}

impl SelectArgs {
    #[must_use]
    pub fn select(self) -> crate::diagnosis::table::Select {
        crate::diagnosis::table::Select { role: self.role.map(RoleArg::role), netns: self.netns }
    }
}

/// `--role`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RoleArg {
    Client,
    Server,
}

impl RoleArg {
    #[must_use]
    pub const fn role(self) -> crate::kernel::event::Role {
        match self {
            Self::Client => crate::kernel::event::Role::Client,
            Self::Server => crate::kernel::event::Role::Server,
        }
    }
}

#[derive(Debug, Subcommand)]
pub enum DebugCommand {
    /// Write synthetic evidence records into a store as fast as possible,
    /// forever (crash tests) or `--records` of them (the start-up bench).
    WriteEvidence {
        #[arg(long)]
        data_dir: PathBuf,
        /// Stop after this many records.
        #[arg(long)]
        records: Option<u64>,
        /// Spread the records over this many destinations.
        #[arg(long, default_value_t = 1)]
        destinations: u16,
    },
    /// Write shell completions (bash, zsh, fish) and man pages for every
    /// subcommand into a directory (`cargo xtask dist`).
    Docs {
        #[arg(long)]
        out_dir: PathBuf,
    },
    /// Print one key line (`ts kind local remote`) per evidence event of a
    /// recording, or per event stored under a data directory (the soak's
    /// accounting).
    EvidenceKeys {
        #[arg(long, conflicts_with = "data_dir", required_unless_present = "data_dir")]
        recording: Option<PathBuf>,
        #[arg(long)]
        data_dir: Option<PathBuf>,
    },
}

#[derive(Debug, Clone, clap::Args)]
#[allow(clippy::struct_excessive_bools, reason = "command-line switches, each its own flag")]
pub struct ProbeArgs {
    /// The destination, `host:port` (IPv6 as `[addr]:port`).
    pub destination: String,
    /// The longest idle age to try.
    #[arg(long, value_parser = parse_duration, default_value = "15m")]
    pub up_to: Duration,
    /// Connections at a time, one verdict each (1 to 64); a silent drop's bracket takes 16 at each idle age.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub connections: u32,
    /// First exchange: an HTTP/1.1 GET of this path with Host (over TLS with --tls).
    #[arg(long, value_name = "PATH", conflicts_with_all = ["tcp", "request"])]
    pub http: Option<String>,
    /// A TLS handshake with SNI (alone, or under --http or --request). The default on port 443.
    #[arg(long, conflicts_with = "tcp")]
    pub tls: bool,
    /// The TCP handshake only. The default on other ports than 443.
    #[arg(long)]
    pub tcp: bool,
    /// First exchange: this file's bytes (at most 64 KiB), then the server's answer until it is quiet.
    #[arg(long, value_name = "FILE", conflicts_with = "tcp")]
    pub request: Option<PathBuf>,
    /// The name for SNI and Host, when the destination is an address.
    #[arg(long, value_name = "NAME")]
    pub server_name: Option<String>,
    /// A path file (as for `path check`): print its declared idle timeouts beside the measured one.
    #[arg(long, value_name = "FILE")]
    pub path: Option<PathBuf>,
    /// No progress lines on standard error.
    #[arg(long, short = 'q')]
    pub quiet: bool,
    /// Stop narrowing a silent drop after this long (default: three times --up-to).
    #[arg(long, value_parser = parse_duration)]
    pub budget: Option<Duration>,
    /// Add the result to the daemon's evidence store in this directory (an existing store: the probe never creates or migrates one).
    #[arg(long, default_value = DEFAULT_DATA_DIR, env = "OBSERVER_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Do not add the result to the evidence store.
    #[arg(long)]
    pub no_store: bool,
    /// Output format.
    #[arg(long, short = 'o', alias = "output", value_enum, default_value = "text")]
    pub format: Output,
}

#[derive(Debug, Subcommand)]
pub enum PathCommand {
    /// Draw both staircases of a path file and list every violation (exit 0 clean, 1 violations, 2 bad file).
    Check(PathCheckArgs),
    /// Print the catalog of documented defaults (all kinds, or one).
    Defaults {
        /// A kind id, e.g. `nginx`.
        kind: Option<String>,
    },
}

/// What `status`, `analyze` and `path check` print: `-o/--output text|json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    /// A table for people (`table` is accepted too, `path check`'s old name).
    #[value(alias = "table")]
    Text,
    /// JSON for programs.
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct PathCheckArgs {
    /// The path file (TOML), hops from the client inward.
    pub file: PathBuf,
    /// Output format (`--format` is the old spelling, still accepted).
    #[arg(short = 'o', long, alias = "format", value_enum, default_value = "text")]
    pub output: Output,
    /// Compare declared idle timeouts of hops with an `address` to the daemon's measurements.
    #[arg(long)]
    pub observed: bool,
    /// The daemon's HTTP address, for `--observed`.
    #[arg(long, default_value = DEFAULT_METRICS_ADDR)]
    pub addr: String,
    /// With `--observed`, the rows' network namespace inode (`0`: the
    /// host's); default: the only one seen for each hop's address. A hop
    /// seen from several namespaces is not compared until one is chosen.
    #[arg(long, value_name = "INODE")]
    pub netns: Option<u32>,
}

impl StatusArgs {
    /// `--output json` or `--json`.
    #[must_use]
    pub fn json(&self) -> bool {
        self.json || self.output == Output::Json
    }
}

impl AnalyzeArgs {
    /// `--output json` or `--json`.
    #[must_use]
    pub fn json(&self) -> bool {
        self.json || self.output == AnalyzeOutput::Json
    }
}

/// Default address of the daemon's HTTP endpoint (loopback only).
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9477";

#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// The daemon's HTTP address (`run --metrics-addr`).
    #[arg(long, default_value = DEFAULT_METRICS_ADDR)]
    pub addr: String,
    /// Output format: a table, or the table as a JSON array.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: Output,
    /// Same as `--output json` (the old spelling).
    #[arg(long, conflicts_with = "output")]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct AnalyzeArgs {
    /// A JSON-lines recording written by `observer run --record`.
    pub file: PathBuf,
    /// Output format: a table, the table as a JSON array, or the `/metrics`
    /// exposition a daemon would serve at the recording's end.
    #[arg(short = 'o', long, value_enum, default_value = "text")]
    pub output: AnalyzeOutput,
    /// Same as `--output json` (the old spelling).
    #[arg(long, conflicts_with = "output")]
    pub json: bool,
    /// Evidence window.
    #[arg(long, value_parser = parse_duration, default_value = "24h")]
    pub window: Duration,
    /// Destinations with their own row; the rest are pooled as `other`.
    #[arg(long, default_value_t = 1000)]
    pub max_destinations: usize,
    /// With `-o prometheus`, the idle-age histograms too (`run --metrics-histograms`).
    #[arg(long)]
    pub metrics_histograms: bool,
}

/// What `observer analyze` prints.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum AnalyzeOutput {
    /// A table for people.
    #[value(alias = "table")]
    Text,
    /// The table as JSON.
    Json,
    /// The Prometheus exposition (text format 0.0.4) of the recording.
    Prometheus,
}

impl RunArgs {
    /// The effective settings as a configuration file would write them.
    #[must_use]
    pub fn to_toml(&self) -> String {
        let d = |x: Duration| format!("\"{}\"", humantime::format_duration(x));
        let q = |x: &str| format!("{x:?}");
        let mut lines = vec![
            ("log-format", q(if self.log_format == LogFormat::Json { "json" } else { "text" })),
            ("connections", self.connections.to_string()),
            ("min-idle", d(self.min_idle)),
            ("stall-after", d(self.stall_after)),
            ("answer-within", d(self.answer_within)),
            ("ring-buffer", self.ring_buffer.to_string()),
            ("metrics-addr", q(&self.metrics_addr)),
            ("allowed-host", format!("[{}]", self.allowed_hosts.iter().map(|h| q(h)).collect::<Vec<_>>().join(", "))),
            ("window", d(self.window)),
            ("max-destinations", self.max_destinations.to_string()),
            ("metrics-histograms", self.metrics_histograms.to_string()),
            ("data-dir", q(&self.data_dir.display().to_string())),
            ("retention", d(self.retention)),
            ("max-store-bytes", self.max_store_bytes.to_string()),
            ("store-give-up", d(self.store_give_up)),
            ("otlp-protocol", q(self.otlp_protocol.as_str())),
            ("otlp-interval", d(self.otlp_interval)),
            ("otlp-timeout", d(self.otlp_timeout)),
            ("otlp-logs", self.otlp_logs.to_string()),
        ];
        if let Some(e) = self.events {
            lines.insert(1, ("events", q(if e == EventsFormat::Json { "json" } else { "text" })));
        }
        if let Some(r) = &self.record {
            lines.push(("record", q(&r.display().to_string())));
        }
        if let Some(a) = &self.scrape_addr {
            lines.push(("scrape-addr", q(a)));
        }
        if let Some(c) = &self.cgroup {
            lines.push(("cgroup", q(&c.display().to_string())));
        }
        if let Some(n) = &self.netns {
            lines.push(("netns", q(&n.display().to_string())));
        }
        for (k, v) in [
            ("otlp-endpoint", &self.otlp_endpoint),
            ("otlp-metrics-endpoint", &self.otlp_metrics_endpoint),
            ("otlp-logs-endpoint", &self.otlp_logs_endpoint),
        ] {
            if let Some(v) = v {
                lines.push((k, q(v)));
            }
        }

        lines.iter().fold(String::new(), |mut out, (k, v)| {
            let _ = writeln!(out, "{k} = {v}");
            out
        }) + if self.otlp_headers.is_some() {
            // Headers carry credentials: said to be set, never printed.
            "# otlp-headers is set (OTEL_EXPORTER_OTLP_HEADERS); not printed, it may carry credentials\n"
        } else {
            ""
        }
    }
}

/// How the daemon writes its log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

/// How `--events` prints events.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum EventsFormat {
    /// One human-readable line per event.
    Text,
    /// One JSON object per line.
    Json,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("`{s}` is not a duration ({e}); write it like 1s, 500ms or 2m"))
}

/// A duration as the `OTEL_*` variables write it (milliseconds), or with a unit.
fn parse_millis(s: &str) -> Result<Duration, String> {
    let d = match s.trim().parse::<u64>() {
        Ok(ms) => Duration::from_millis(ms),
        Err(_) => parse_duration(s)?,
    };
    if d.is_zero() {
        return Err(format!("`{s}` is zero; write milliseconds (60000) or a duration (60s)"));
    }
    Ok(d)
}

fn parse_size64(s: &str) -> Result<u64, String> {
    let (num, mult) =
        [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10), ("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)]
            .iter()
            .find_map(|(suf, m)| s.strip_suffix(suf).map(|n| (n, *m)))
            .unwrap_or((s, 1));
    num.trim()
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("`{s}` is not a size; write it like 4096, 256KiB, 256MiB or 1GiB"))
}

fn parse_size(s: &str) -> Result<u32, String> {
    parse_size64(s).and_then(|n| u32::try_from(n).map_err(|_| format!("`{s}` is too large; at most 4GiB")))
}

#[derive(Debug, Clone, clap::Args)]
#[allow(clippy::struct_excessive_bools, reason = "each is an independent command-line switch")]
pub struct RunArgs {
    /// Read `run` settings from this TOML file (keys are the flags' long
    /// names); flags and `OBSERVER_*` variables take precedence over it.
    #[arg(long, env = "OBSERVER_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Log lines as text, or as one JSON object per line.
    #[arg(long, value_enum, default_value = "text", env = "OBSERVER_LOG_FORMAT")]
    pub log_format: LogFormat,
    /// Print the effective settings (after flags, `OBSERVER_*` variables,
    /// the configuration file and defaults) as TOML and exit.
    #[arg(long)]
    pub print_config: bool,
    /// Print each reuse outcome, peer close and local close (`text`, or `json` lines).
    #[arg(long, value_enum, num_args = 0..=1, default_missing_value = "text", env = "OBSERVER_EVENTS")]
    pub events: Option<EventsFormat>,
    /// Also print connection establish/close events with `--events`.
    #[arg(long, env = "OBSERVER_CONNECTIONS")]
    pub connections: bool,
    /// Do not read client connections' first bytes for the names they used
    /// (TLS SNI, HTTP `Host`): no name is captured, kept or shown.
    #[arg(long, env = "OBSERVER_NO_NAMES")]
    pub no_names: bool,
    /// A write after at least this much silence is a reuse.
    #[arg(long, value_parser = parse_duration, default_value = "1s", env = "OBSERVER_MIN_IDLE")]
    pub min_idle: Duration,
    /// A reuse whose bytes were retransmitted and stay unacknowledged this
    /// long, until the socket ends, is a stall.
    #[arg(long, value_parser = parse_duration, default_value = "1s", env = "OBSERVER_STALL_AFTER")]
    pub stall_after: Duration,
    /// A request with no answer within this bound is dropped as unresolved
    /// (counted) and never attributed to a later close.
    #[arg(long, value_parser = parse_duration, default_value = "5m", env = "OBSERVER_ANSWER_WITHIN")]
    pub answer_within: Duration,
    /// Size of the kernel-to-userspace ring buffer (power of two, >= 4096):
    /// 4 MiB holds 30,000 events, 1.5 s of a busy node's 20,000 reuses/s
    /// while the reader waits for a CPU.
    #[arg(long, value_parser = parse_size, default_value = "4MiB", env = "OBSERVER_RING_BUFFER")]
    pub ring_buffer: u32,
    /// Append every event to this file as JSON lines.
    #[arg(long, env = "OBSERVER_RECORD")]
    pub record: Option<PathBuf>,
    /// Serve `GET /api/v1/destinations`, `GET /metrics` and `GET /healthz` here.
    #[arg(long, default_value = DEFAULT_METRICS_ADDR, env = "OBSERVER_METRICS_ADDR")]
    pub metrics_addr: String,
    /// Also serve `GET /metrics` and `GET /healthz`, and nothing else, here:
    /// the port for Prometheus and probes on a shared network, while the
    /// destination table stays on `--metrics-addr` (loopback by default).
    #[arg(long, env = "OBSERVER_SCRAPE_ADDR")]
    pub scrape_addr: Option<String>,
    /// A host name the HTTP endpoint answers to besides IP addresses,
    /// `localhost` and this machine's name (repeatable); other `Host`
    /// headers get 421.
    #[arg(long = "allowed-host", value_name = "NAME", env = "OBSERVER_ALLOWED_HOSTS", value_delimiter = ',')]
    pub allowed_hosts: Vec<String>,
    /// Evidence window of the per-destination estimates.
    #[arg(long, value_parser = parse_duration, default_value = "24h", env = "OBSERVER_WINDOW")]
    pub window: Duration,
    /// Destinations with their own row and metric labels; the rest are pooled as `other`.
    #[arg(long, default_value_t = 1000, env = "OBSERVER_MAX_DESTINATIONS")]
    pub max_destinations: usize,
    /// Also export the idle-age histograms (`observer_reuse_idle_seconds`,
    /// `observer_peer_idle_close_seconds`, `observer_local_idle_close_seconds`):
    /// up to 161 more series per destination; the default lean set is about a dozen.
    #[arg(long, env = "OBSERVER_METRICS_HISTOGRAMS")]
    pub metrics_histograms: bool,
    /// Directory of the evidence store.
    #[arg(long, default_value = DEFAULT_DATA_DIR, env = "OBSERVER_DATA_DIR")]
    pub data_dir: PathBuf,
    /// Stored evidence older than this is deleted.
    #[arg(long, value_parser = parse_duration, default_value = "14days", env = "OBSERVER_RETENTION")]
    pub retention: Duration,
    /// The evidence store is kept below this size.
    #[arg(long, value_parser = parse_size64, default_value = "256MiB", env = "OBSERVER_MAX_STORE_BYTES")]
    pub max_store_bytes: u64,
    /// A batch the store refuses (a full disk, a removed directory) is held
    /// and retried every second for this long, then given up and counted
    /// (`observer_events_lost_total{reason="store_error"}`). What a `kill -9`
    /// during such a spell loses grows with it.
    #[arg(long, value_parser = parse_duration, default_value = "60s", env = "OBSERVER_STORE_GIVE_UP")]
    pub store_give_up: Duration,
    /// Send the metrics to this OpenTelemetry collector (OTLP): the base
    /// URL, e.g. `http://localhost:4318` (`/v1/metrics` and `/v1/logs` are
    /// added over HTTP) or `http://localhost:4317` with `--otlp-protocol
    /// grpc`. Nothing is sent unless an endpoint is set.
    #[arg(long, value_name = "URL", env = "OTEL_EXPORTER_OTLP_ENDPOINT")]
    pub otlp_endpoint: Option<String>,
    /// The metrics endpoint itself, used as it is (overrides `--otlp-endpoint` for metrics).
    #[arg(long, value_name = "URL", env = "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")]
    pub otlp_metrics_endpoint: Option<String>,
    /// The logs endpoint itself, used as it is (with `--otlp-logs`).
    #[arg(long, value_name = "URL", env = "OTEL_EXPORTER_OTLP_LOGS_ENDPOINT")]
    pub otlp_logs_endpoint: Option<String>,
    /// The OTLP transport: `http/protobuf` or `grpc`.
    #[arg(long, value_name = "PROTOCOL", value_parser = Transport::parse, default_value = "http/protobuf", env = "OTEL_EXPORTER_OTLP_PROTOCOL")]
    pub otlp_protocol: Transport,
    /// Headers on every export, `k1=v1,k2=v2` (values percent-encoded).
    #[arg(long, value_name = "HEADERS", env = "OTEL_EXPORTER_OTLP_HEADERS", hide_env_values = true)]
    pub otlp_headers: Option<String>,
    /// Time between metric exports (a bare number is milliseconds, as
    /// `OTEL_METRIC_EXPORT_INTERVAL` is written).
    #[arg(long, value_parser = parse_millis, default_value = "60000", env = "OTEL_METRIC_EXPORT_INTERVAL")]
    pub otlp_interval: Duration,
    /// How long one export may take before it fails (a bare number is milliseconds).
    #[arg(long, value_parser = parse_millis, default_value = "10000", env = "OTEL_EXPORTER_OTLP_TIMEOUT")]
    pub otlp_timeout: Duration,
    /// Also send each failed reuse as an OTLP log record (needs an endpoint).
    #[arg(long, env = "OBSERVER_OTLP_LOGS", value_parser = clap::builder::BoolishValueParser::new())]
    pub otlp_logs: bool,
    /// Observe only sockets of processes in this cgroup v2 subtree (a path
    /// below the cgroup2 mount, or relative to it: `/system.slice/app.service`).
    #[arg(long, value_name = "PATH", env = "OBSERVER_CGROUP")]
    pub cgroup: Option<PathBuf>,
    /// Observe only sockets in this network namespace (`/run/netns/NAME`,
    /// `/proc/PID/ns/net`).
    #[arg(long, value_name = "PATH", env = "OBSERVER_NETNS")]
    pub netns: Option<PathBuf>,
    /// Attach empty programs beside the hot-path probes (benchmark
    /// baseline; only in the `bench` build `cargo xtask bench` makes).
    #[cfg(feature = "bench")]
    #[arg(long, hide = true)]
    pub bench_empty_probes: bool,
    /// On SIGUSR1, detach the send and receive probes, or attach them again
    /// (benchmark: with and without probes inside one run; `bench` build).
    #[cfg(feature = "bench")]
    #[arg(long, hide = true)]
    pub bench_toggle: bool,
}

/// Default directory of the evidence store.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/observer";

#[cfg(test)]
mod tests;

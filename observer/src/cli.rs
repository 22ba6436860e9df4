//! Command-line interface (clap derive). Every flag is documented in the README.

use std::{path::PathBuf, time::Duration};

use clap::{Parser, Subcommand, ValueEnum};

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
    Run(RunArgs),
    /// Ask the running daemon for the destination table.
    Status(StatusArgs),
    /// Run the daemon's aggregation offline over a recording (`run --record`).
    Analyze(AnalyzeArgs),
    /// Check a path's timeout staircases on paper.
    #[command(subcommand)]
    Path(PathCommand),
    /// Write the evidence report for one destination (reads the store; no daemon needed).
    Report(ReportArgs),
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
}

#[derive(Debug, Subcommand)]
pub enum DebugCommand {
    /// Write synthetic evidence records into a store as fast as possible, forever (crash tests).
    WriteEvidence {
        #[arg(long)]
        data_dir: PathBuf,
    },
    /// Measure decoding plus aggregation on synthetic kernel records (benchmarks); prints JSON.
    BenchPipeline {
        #[arg(long, default_value_t = 2_000_000)]
        events: usize,
        #[arg(long, default_value_t = 1000)]
        destinations: u32,
    },
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

/// Output format of `path check`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum PathFormat {
    Table,
    Json,
}

#[derive(Debug, Clone, clap::Args)]
pub struct PathCheckArgs {
    /// The path file (TOML), hops from the client inward.
    pub file: PathBuf,
    #[arg(long, value_enum, default_value = "table")]
    pub format: PathFormat,
    /// Compare declared idle timeouts of hops with an `address` to the daemon's measurements.
    #[arg(long)]
    pub observed: bool,
    /// The daemon's HTTP address, for `--observed`.
    #[arg(long, default_value = DEFAULT_METRICS_ADDR)]
    pub addr: String,
}

/// Default address of the daemon's HTTP endpoint (loopback only).
pub const DEFAULT_METRICS_ADDR: &str = "127.0.0.1:9477";

#[derive(Debug, Clone, clap::Args)]
pub struct StatusArgs {
    /// The daemon's HTTP address (`run --metrics-addr`).
    #[arg(long, default_value = DEFAULT_METRICS_ADDR)]
    pub addr: String,
    /// Print the table as a JSON array.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Clone, clap::Args)]
pub struct AnalyzeArgs {
    /// A JSON-lines recording written by `observer run --record`.
    pub file: PathBuf,
    /// Print the table as a JSON array.
    #[arg(long)]
    pub json: bool,
    /// Evidence window.
    #[arg(long, value_parser = parse_duration, default_value = "24h")]
    pub window: Duration,
    /// Destinations with their own row; the rest are pooled as `other`.
    #[arg(long, default_value_t = 1000)]
    pub max_destinations: usize,
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
pub struct RunArgs {
    /// Print each reuse outcome, peer close and local close (`text`, or `json` lines).
    #[arg(long, value_enum, num_args = 0..=1, require_equals = true, default_missing_value = "text")]
    pub events: Option<EventsFormat>,
    /// Also print connection establish/close events with `--events`.
    #[arg(long)]
    pub connections: bool,
    /// A write after at least this much silence is a reuse.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub min_idle: Duration,
    /// A reuse whose bytes were retransmitted and stay unacknowledged this
    /// long, until the socket ends, is a stall.
    #[arg(long, value_parser = parse_duration, default_value = "1s")]
    pub stall_after: Duration,
    /// A request with no answer within this bound is dropped as unresolved
    /// (counted) and never attributed to a later close.
    #[arg(long, value_parser = parse_duration, default_value = "5m")]
    pub answer_within: Duration,
    /// Ignored since per-socket state moved to socket-local storage (no
    /// table to size); accepted so existing command lines keep working.
    #[arg(long, hide = true)]
    pub max_sockets: Option<u32>,
    /// Size of the kernel-to-userspace ring buffer (power of two, >= 4096).
    #[arg(long, value_parser = parse_size, default_value = "1MiB")]
    pub ring_buffer: u32,
    /// Append every event to this file as JSON lines.
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// Serve `GET /api/v1/destinations` and `GET /metrics` here.
    #[arg(long, default_value = DEFAULT_METRICS_ADDR)]
    pub metrics_addr: String,
    /// Evidence window of the per-destination estimates.
    #[arg(long, value_parser = parse_duration, default_value = "24h")]
    pub window: Duration,
    /// Destinations with their own row and metric labels; the rest are pooled as `other`.
    #[arg(long, default_value_t = 1000)]
    pub max_destinations: usize,
    /// Directory of the evidence store.
    #[arg(long, default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// Stored evidence older than this is deleted.
    #[arg(long, value_parser = parse_duration, default_value = "14days")]
    pub retention: Duration,
    /// The evidence store is kept below this size.
    #[arg(long, value_parser = parse_size64, default_value = "256MiB")]
    pub max_store_bytes: u64,
    /// Attach empty programs beside the hot-path probes (benchmark baseline).
    #[arg(long, hide = true)]
    pub bench_empty_probes: bool,
}

/// Default directory of the evidence store.
pub const DEFAULT_DATA_DIR: &str = "/var/lib/observer";

#[cfg(test)]
mod tests;

//! The partner report: what the path to one destination does to idle
//! connections, with timestamps, as HTML (inline SVG, no external assets, no
//! scripts), Markdown (plots as tables) or JSON (stable field names, listed
//! in the README). Built from stored evidence or a recording; no daemon.
//!
//! This module holds the report's data and how it is built; `html`,
//! `markdown` and `svg` render it.

use serde::{ser::SerializeStruct, Serialize, Serializer};

mod card;
mod document;
mod findings;
mod html;
mod markdown;
mod svg;

pub use card::{add_name_addresses, PartnerCard};
pub use html::html;
pub use markdown::markdown;

use crate::{
    diagnosis::aggregate::{Aggregator, Change, Config, FailureMode},
    diagnosis::evidence::Observation,
    diagnosis::key::{destination_of, DestKey, Netns, RowId},
    diagnosis::probed::ProbeEvidence,
    diagnosis::table::{PathEstimate, Select, SelectError, Verdict},
    diagnosis::verdict::Judgement,
    kernel::event::{EventKind, Role, SockEvent},
    surfaces::store::{ConnectionCount, ConnectionCounts, Record},
    units::fmt_secs,
};
use findings::{failure_text, findings, questions};

/// Samples shown in the failure table at most.
pub const MAX_SAMPLES: usize = 20;
const PROBABILITY_BINS: usize = 20;
const TIMELINE_BINS: usize = 24;

/// What the report is built from.
pub struct Input {
    pub destination: String,
    /// Evidence window start and end (ns since the epoch).
    pub since_ns: u64,
    pub until_ns: u64,
    /// Evidence events for the destination, oldest first.
    pub events: Vec<SockEvent>,
    /// New connections per minute, of every row of the destination.
    pub volume: Vec<ConnectionCount>,
    pub changes: Vec<Change>,
    /// What `observer probe` measured for the destination, oldest first.
    pub probes: Vec<ProbeEvidence>,
    /// Which row (`--role`, `--netns`); by default the client row if the
    /// destination was seen as one, else its only row.
    pub select: Select,
    /// The inode rows show as `netns: null` (0: every namespace named).
    pub host_netns: u32,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    /// The row's path estimate. The report's JSON gives six of it under
    /// the names it was published with (`path_idle_timeout_seconds`, its
    /// bounds, `lower_evidence`, `upper_evidence`, `point_evidence`); the
    /// probe is the report's own `probe`.
    #[serde(flatten, serialize_with = "published_path")]
    pub path: PathEstimate,
    pub failure_mode: FailureMode,
    /// The failure mode in plain words.
    pub failure_mode_text: String,
    pub first_failure_unix_ns: Option<u64>,
    pub last_failure_unix_ns: Option<u64>,
    pub reuses: u64,
    pub failures: u64,
    /// Failed reuses the kernel failed before a byte left the host (the
    /// socket had been reset or timed out while idle).
    pub failures_before_send: u64,
    pub peer_idle_closes: u64,
    /// Dead sockets the pool closed without writing on them (failures its
    /// validation or reader avoided).
    pub discarded_dead: u64,
    /// Who sent the resets (`peer`, `path`, `local`; null: none seen or
    /// none told), how many hops closer than the server, every source
    /// with its count, and the same in words: the row's.
    #[serde(flatten)]
    pub resets: crate::diagnosis::table::ResetSources,
    pub reset_text: Option<String>,
}

impl OurSide {
    /// The processes as the report names them (with their owners when known).
    #[must_use]
    pub fn process_labels(&self) -> Vec<String> {
        if self.owners.is_empty() {
            self.processes.clone()
        } else {
            self.owners.iter().map(crate::diagnosis::table::ProcessOwner::label).collect()
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct OurSide {
    /// The row's pool group (`pool_idle_timeout_seconds`,
    /// `pool_max_reuse_idle_seconds`).
    #[serde(flatten)]
    pub pool: crate::diagnosis::table::OurPool,
    pub processes: Vec<String>,
    /// The processes with their container, pod or unit where known.
    pub owners: Vec<crate::diagnosis::table::ProcessOwner>,
    /// The row's verdict and fix. The report's JSON gives five of it
    /// (`verdict`, the two recommended timeouts, `safe_retry_rule`,
    /// `recommendation`), as published.
    #[serde(flatten, serialize_with = "published_judgement")]
    pub judgement: Judgement,
    /// The fix in the clients' own terms (see the row's `fix_settings`).
    pub fix_settings: Vec<crate::diagnosis::clients::FixSetting>,
    /// The protocols the connections' first bytes showed (`h2`, `http1`),
    /// most seen first; empty when none could be told.
    pub protocols: Vec<crate::kernel::first_bytes::Protocol>,
}

impl OurSide {
    /// The protocols as the report prints them.
    #[must_use]
    pub fn protocols_text(&self) -> String {
        if self.protocols.is_empty() {
            "not told by the first bytes (binary, encrypted without ALPN, or not seen)".to_owned()
        } else {
            self.protocols.iter().map(|p| p.as_str()).collect::<Vec<_>>().join(", ")
        }
    }
}

#[derive(Debug, Clone, Serialize)]
pub struct ProbabilityBin {
    pub idle_from_seconds: f64,
    pub idle_to_seconds: f64,
    pub reuses: u64,
    pub failures: u64,
    /// failures / reuses; null without reuses.
    pub probability: Option<f64>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TimelineBin {
    pub start_unix_ns: u64,
    pub end_unix_ns: u64,
    pub reuses: u64,
    pub failures: u64,
    pub new_connections: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Sample {
    pub time_utc: String,
    pub local: String,
    pub remote: String,
    pub process: String,
    pub pid: u32,
    pub idle_seconds: f64,
    pub outcome: String,
    pub retransmits: u32,
    pub safe_to_retry: bool,
    /// The write failed in the kernel before any byte left the host.
    pub failed_before_send: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Samples {
    pub total_failures: usize,
    pub shown: usize,
    /// How the samples were chosen.
    pub method: String,
    pub rows: Vec<Sample>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Question {
    pub topic: String,
    pub question: String,
    pub what_we_measured: String,
}

/// The report (its JSON form is the `--format json` interface: written by
/// hand below, so that the top-level `probe` and `probe_used` it has
/// always published are read from `summary.path`, which holds them).
#[derive(Debug, Clone)]
pub struct Report {
    pub destination: String,
    /// What the report is headed by: the name clients used most and the
    /// address, `api.partner.example (203.0.113.7:443)`, or the address
    /// alone when no name was seen.
    pub headline: String,
    /// Every name clients used for the destination, most used first.
    pub server_names: Vec<crate::diagnosis::table::ServerName>,
    pub role: String,
    /// The row's network namespace inode (null: the host's).
    pub netns: Netns,
    pub generated_unix_ns: u64,
    pub window_start_unix_ns: u64,
    pub window_end_unix_ns: u64,
    pub summary: Summary,
    /// Client reports: the partner's card (null on a server row).
    pub partner_card: Option<PartnerCard>,
    pub our_side: OurSide,
    pub failure_probability: Vec<ProbabilityBin>,
    pub timeline: Vec<TimelineBin>,
    pub samples: Samples,
    pub questions: Vec<Question>,
    pub changes: Vec<Change>,
    /// Further findings as `(what, value)` lines: the verdict's evidence,
    /// restarts, mixed paths, the lower bound's basis, observed deadlines
    /// and, for a server, its clients' behaviour.
    pub findings: Vec<(String, String)>,
}

impl Report {
    /// The latest `observer probe` of the row in the window (None: none).
    #[must_use]
    pub fn probe(&self) -> Option<&ProbeEvidence> {
        self.summary.path.probe.as_ref()
    }
}

impl Serialize for Report {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_struct("Report", 20)?;
        m.serialize_field("destination", &self.destination)?;
        m.serialize_field("headline", &self.headline)?;
        m.serialize_field("server_names", &self.server_names)?;
        m.serialize_field("role", &self.role)?;
        m.serialize_field("netns", &self.netns)?;
        m.serialize_field("generated_unix_ns", &self.generated_unix_ns)?;
        m.serialize_field("window_start_unix_ns", &self.window_start_unix_ns)?;
        m.serialize_field("window_end_unix_ns", &self.window_end_unix_ns)?;
        m.serialize_field("summary", &self.summary)?;
        m.serialize_field("partner_card", &self.partner_card)?;
        m.serialize_field("our_side", &self.our_side)?;
        m.serialize_field("failure_probability", &self.failure_probability)?;
        m.serialize_field("timeline", &self.timeline)?;
        m.serialize_field("samples", &self.samples)?;
        m.serialize_field("questions", &self.questions)?;
        m.serialize_field("changes", &self.changes)?;
        // Published at the top level since the probe came (the row's
        // `path` group holds them).
        m.serialize_field("probe", &self.summary.path.probe)?;
        m.serialize_field("probe_used", &self.summary.path.probe_used)?;
        m.serialize_field("findings", &self.findings)?;
        m.end()
    }
}

/// Nothing to report, or no single row to report on.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum NoEvidence {
    #[error(
        "no evidence for {0} in the window; check the address (ip:port, IPv6 as [addr]:port), --since, and --data-dir"
    )]
    Empty(String),
    #[error(transparent)]
    Select(#[from] SelectError),
}

/// The row's side as the report's headline names it: the role, and the
/// network namespace when it is not the host's.
fn side(r: &Report) -> String {
    match r.netns.inode() {
        Some(n) => format!("{} side, network namespace {n}", r.role),
        None => format!("{} side", r.role),
    }
}

fn utc(ns: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns)).to_string()
}

/// Report input from a recording: the events of `destination`, over
/// `since_ns` before the recording's last event (a recording is its own
/// clock), with new connections counted per minute.
#[must_use]
pub fn input_from_recording(events: Vec<SockEvent>, destination: std::net::SocketAddr, since_ns: u64) -> Input {
    let mine: Vec<SockEvent> =
        events.into_iter().filter(|e| destination_of(e).is_some_and(|(a, _)| a == destination)).collect();
    let until = mine.last().map_or(0, |e| e.ts_unix_ns);
    let since = until.saturating_sub(since_ns);
    // Counted as the daemon counts them for the store.
    let mut counts = ConnectionCounts::default();
    let mut records = Vec::new();
    for e in mine.iter().filter(|e| e.kind() == EventKind::Established) {
        // A recording does not say which namespace was the host's (0).
        if let Some(key) = DestKey::of_event(e, 0) {
            records.extend(counts.add(key, e.ts_unix_ns));
        }
    }
    records.extend(counts.flush());
    let evidence = mine
        .into_iter()
        .filter(|e| e.ts_unix_ns >= since && !matches!(e.kind(), EventKind::Established | EventKind::Closed))
        .collect();
    Input {
        destination: destination.to_string(),
        since_ns: since,
        until_ns: until,
        events: evidence,
        volume: records
            .into_iter()
            .filter_map(|r| match r {
                Record::Connections { minute, key, connections } => {
                    Some(ConnectionCount { minute, role: key.role, netns: Some(key.netns), connections })
                }
                _ => None,
            })
            .collect(),
        changes: Vec::new(),
        probes: Vec::new(),
        select: Select::default(),
        host_netns: 0,
    }
}

/// An evidence event as the aggregator's feed took it.
struct Taken<'a> {
    ev: &'a SockEvent,
    what: Observation,
}

impl Taken<'_> {
    const fn is_reuse(&self) -> bool {
        matches!(self.what, Observation::Reuse { .. })
    }

    const fn is_failure(&self) -> bool {
        matches!(self.what, Observation::Reuse { failed: Some(_), .. })
    }
}

#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "bin arithmetic on small counts"
)]
fn probability_bins(reuses: &[&Taken]) -> Vec<ProbabilityBin> {
    let max = reuses.iter().map(|t| t.ev.idle_seconds).fold(0.0, f64::max);
    if max <= 0.0 {
        return Vec::new();
    }
    // A round bin width covering the largest idle age in ~20 bins.
    let raw = max * 1.05 / PROBABILITY_BINS as f64;
    let mag = 10f64.powf(raw.log10().floor());
    let width = [1.0, 2.0, 2.5, 5.0, 10.0].iter().map(|m| m * mag).find(|w| *w >= raw).unwrap_or(10.0 * mag);
    let n = ((max / width).floor() as usize + 1).max(1);
    let mut bins: Vec<ProbabilityBin> = (0..n)
        .map(|i| ProbabilityBin {
            idle_from_seconds: i as f64 * width,
            idle_to_seconds: (i + 1) as f64 * width,
            reuses: 0,
            failures: 0,
            probability: None,
        })
        .collect();
    for t in reuses {
        let i = ((t.ev.idle_seconds / width).floor() as usize).min(n - 1);
        bins[i].reuses += 1;
        if t.is_failure() {
            bins[i].failures += 1;
        }
    }
    for b in &mut bins {
        b.probability = (b.reuses > 0).then(|| b.failures as f64 / b.reuses as f64);
    }
    bins
}

fn timeline(volume: &[&ConnectionCount], reuses: &[&Taken]) -> Vec<TimelineBin> {
    let (start, end) = match (reuses.first(), reuses.last()) {
        (Some(a), Some(b)) => (a.ev.ts_unix_ns, b.ev.ts_unix_ns.max(a.ev.ts_unix_ns + 1)),
        _ => return Vec::new(),
    };
    let span = (end - start).div_ceil(TIMELINE_BINS as u64).max(1);
    let mut bins: Vec<TimelineBin> = (0..TIMELINE_BINS as u64)
        .map(|i| TimelineBin {
            start_unix_ns: start + i * span,
            end_unix_ns: start + (i + 1) * span,
            reuses: 0,
            failures: 0,
            new_connections: 0,
        })
        .collect();
    let idx = |ts: u64| usize::try_from((ts.saturating_sub(start)) / span).unwrap_or(usize::MAX).min(TIMELINE_BINS - 1);
    for t in reuses {
        let b = &mut bins[idx(t.ev.ts_unix_ns)];
        b.reuses += 1;
        if t.is_failure() {
            b.failures += 1;
        }
    }
    for v in volume {
        let ts = v.minute * 60_000_000_000;
        if ts + 60_000_000_000 >= start && ts <= end {
            bins[idx(ts.max(start))].new_connections += v.connections;
        }
    }
    bins
}

fn samples(failures: &[&SockEvent]) -> Samples {
    let total = failures.len();
    let picked: Vec<&SockEvent> = if total <= MAX_SAMPLES {
        failures.to_vec()
    } else {
        let mut idx: Vec<usize> = (0..5).chain(total - 5..total).collect();
        for k in 1..=10 {
            idx.push(5 + (total - 10) * k / 11);
        }
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter().map(|i| failures[i]).collect()
    };
    let method = if total <= MAX_SAMPLES {
        format!("all {total} failed reuses in the window, oldest first")
    } else {
        format!("the first 5, the last 5 and 10 evenly spaced in between of {total} failed reuses, oldest first")
    };
    Samples {
        total_failures: total,
        shown: picked.len(),
        method,
        rows: picked
            .iter()
            .map(|e| Sample {
                time_utc: utc(e.ts_unix_ns),
                local: e.local.to_string(),
                remote: e.remote.to_string(),
                process: e.comm.clone(),
                pid: e.pid,
                idle_seconds: (e.idle_seconds * 1000.0).round() / 1000.0,
                outcome: e.outcome().map_or("-", |o| o.as_str()).to_owned(),
                retransmits: e.retransmits(),
                safe_to_retry: e.safe_to_retry(),
                failed_before_send: e.failed_before_send(),
            })
            .collect(),
    }
}

/// Build the report.
pub fn build(input: &Input) -> Result<Report, NoEvidence> {
    // Rows of their own for every role and namespace the destination was
    // seen in (the events are of one address).
    let mut agg = Aggregator::new(Config {
        window_ns: input.until_ns.saturating_sub(input.since_ns),
        max_destinations: 4096,
        host_netns: input.host_netns,
    });
    // The feed's own classification, kept with its row: the report counts
    // what the table counted.
    let mut taken: Vec<(RowId, Taken)> = Vec::new();
    agg.feed_to_end(&input.events, |ev, fed| {
        if let Some(i) = fed.ingested {
            taken.push((i.id, Taken { ev, what: i.observed.what }));
        }
    });
    for p in &input.probes {
        agg.add_probe(p);
    }
    let rows = agg.rows(input.until_ns);
    if rows.is_empty() {
        return Err(NoEvidence::Empty(input.destination.clone()));
    }
    let mut select = input.select;
    if select.role.is_none() && rows.iter().any(|r| r.id.role == Role::Client) {
        select.role = Some(Role::Client);
    }
    let row = select.pick(&rows, &input.destination, input.host_netns)?.clone();
    let role = row.id.role;
    let id = row.id.clone();
    let mine: Vec<&Taken> = taken.iter().filter(|(row, _)| *row == id).map(|(_, t)| t).collect();
    // Counts stored before the store knew namespaces count for every
    // namespace of their role.
    let volume: Vec<&ConnectionCount> =
        input.volume.iter().filter(|v| v.role == role && v.netns.is_none_or(|n| n == row.id.netns)).collect();
    let changes: Vec<Change> =
        input.changes.iter().filter(|c| c.id.role == role && c.id.netns == row.id.netns).cloned().collect();
    let reuses: Vec<&Taken> = mine.iter().copied().filter(|t| t.is_reuse()).collect();
    let failures: Vec<&SockEvent> = reuses.iter().filter(|t| t.is_failure()).map(|t| t.ev).collect();
    let text = failure_text(row.failure_mode, &row);
    Ok(Report {
        destination: input.destination.clone(),
        headline: match row.server_names.first() {
            Some(n) => format!("{} ({})", n.name, input.destination),
            None => input.destination.clone(),
        },
        server_names: row.server_names.clone(),
        role: role.as_str().to_owned(),
        netns: row.id.netns,
        generated_unix_ns: crate::kernel::event::clock_ns(libc::CLOCK_REALTIME),
        window_start_unix_ns: mine.first().map_or(input.since_ns, |t| t.ev.ts_unix_ns),
        window_end_unix_ns: mine.last().map_or(input.until_ns, |t| t.ev.ts_unix_ns),
        summary: Summary {
            path: row.path.clone(),
            failure_mode: row.failure_mode,
            failure_mode_text: text.clone(),
            first_failure_unix_ns: failures.first().map(|e| e.ts_unix_ns),
            last_failure_unix_ns: failures.last().map(|e| e.ts_unix_ns),
            reuses: reuses.len() as u64,
            failures: failures.len() as u64,
            failures_before_send: failures.iter().filter(|e| e.failed_before_send()).count() as u64,
            peer_idle_closes: mine
                .iter()
                .filter(|t| matches!(t.what, Observation::PeerIdleClose { .. } | Observation::KeepaliveDeath { .. }))
                .count() as u64,
            discarded_dead: row.sockets.discarded_dead,
            resets: row.resets.clone(),
            reset_text: row.resets_in_words(),
        },
        partner_card: (role == Role::Client)
            .then(|| PartnerCard::of(&row, &input.destination, &mine.iter().map(|t| t.ev).collect::<Vec<_>>())),
        our_side: OurSide {
            pool: row.pool.clone(),
            processes: row.processes.clone(),
            owners: row.owners.clone(),
            judgement: row.judgement.clone(),
            fix_settings: row.fix_settings.clone(),
            protocols: row.protocols.clone(),
        },
        failure_probability: probability_bins(&reuses),
        timeline: timeline(&volume, &reuses),
        samples: samples(&failures),
        questions: questions(&row, &text),
        changes,
        findings: findings(&row),
    })
}

/// The path estimate as `summary` publishes it (names fixed since the
/// report's first JSON; the row's own names carry a `path_` prefix).
fn published_path<S: Serializer>(p: &PathEstimate, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Published {
        path_idle_timeout_seconds: Option<f64>,
        path_idle_timeout_lower_seconds: f64,
        path_idle_timeout_upper_seconds: Option<f64>,
        lower_evidence: usize,
        upper_evidence: usize,
        point_evidence: usize,
    }
    Published {
        path_idle_timeout_seconds: p.idle_timeout_seconds,
        path_idle_timeout_lower_seconds: p.lower_seconds,
        path_idle_timeout_upper_seconds: p.upper_seconds,
        lower_evidence: p.lower_evidence,
        upper_evidence: p.upper_evidence,
        point_evidence: p.point_evidence,
    }
    .serialize(s)
}

/// The judgement as `our_side` publishes it: the client's verdict and fix
/// (a report is a client row's, or a server row's without the server's
/// own recommendation).
fn published_judgement<S: Serializer>(j: &Judgement, s: S) -> Result<S::Ok, S::Error> {
    #[derive(Serialize)]
    struct Published<'a> {
        verdict: Verdict,
        recommended_pool_idle_timeout_seconds: Option<f64>,
        recommended_max_lifetime_seconds: Option<f64>,
        safe_retry_rule: bool,
        recommendation: &'a str,
    }
    Published {
        verdict: j.verdict,
        recommended_pool_idle_timeout_seconds: j.recommended_pool_idle_timeout_seconds,
        recommended_max_lifetime_seconds: j.recommended_max_lifetime_seconds,
        safe_retry_rule: j.safe_retry_rule,
        recommendation: &j.recommendation,
    }
    .serialize(s)
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

fn opt_secs(v: Option<f64>) -> String {
    v.map_or_else(|| "unknown".to_owned(), fmt_secs)
}

fn opt_time(v: Option<u64>) -> String {
    v.map_or_else(|| "none".to_owned(), utc)
}

#[cfg(test)]
mod tests;

//! The partner report: what the path to one destination does to idle
//! connections, with timestamps, as HTML (inline SVG, no external assets, no
//! scripts), Markdown (plots as tables) or JSON (stable field names, listed
//! in the README). Built from stored evidence or a recording; no daemon.

use std::fmt::Write as _;

use serde::Serialize;

use crate::{
    aggregate::{Aggregator, Change, Config, DestinationRow, FailureMode},
    event::{EventKind, SockEvent},
    path::fmt_secs,
};

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
    /// New connections per minute (unix minute, count).
    pub volume: Vec<(u64, u64)>,
    pub changes: Vec<Change>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub path_idle_timeout_seconds: Option<f64>,
    pub path_idle_timeout_lower_seconds: f64,
    pub path_idle_timeout_upper_seconds: Option<f64>,
    pub lower_evidence: usize,
    pub upper_evidence: usize,
    pub point_evidence: usize,
    pub failure_mode: FailureMode,
    /// The failure mode in plain words.
    pub failure_mode_text: String,
    pub first_failure_unix_ns: Option<u64>,
    pub last_failure_unix_ns: Option<u64>,
    pub reuses: u64,
    pub failures: u64,
    pub peer_idle_closes: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct OurSide {
    pub pool_idle_timeout_seconds: Option<f64>,
    pub pool_max_reuse_idle_seconds: Option<f64>,
    pub processes: Vec<String>,
    pub verdict: String,
    pub recommended_pool_idle_timeout_seconds: Option<f64>,
    pub recommended_max_lifetime_seconds: Option<f64>,
    pub safe_retry_rule: bool,
    pub recommendation: String,
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

/// The report (its JSON form is the `--format json` interface).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub destination: String,
    pub role: String,
    pub generated_unix_ns: u64,
    pub window_start_unix_ns: u64,
    pub window_end_unix_ns: u64,
    pub summary: Summary,
    pub our_side: OurSide,
    pub failure_probability: Vec<ProbabilityBin>,
    pub timeline: Vec<TimelineBin>,
    pub samples: Samples,
    pub questions: Vec<Question>,
    pub changes: Vec<Change>,
    /// Further findings as `(what, value)` lines: the verdict's evidence,
    /// restarts, mixed paths, the lower bound's basis, observed deadlines
    /// and, for a server, its clients' behaviour.
    #[serde(default)]
    pub findings: Vec<(String, String)>,
}

/// Nothing to report.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("no evidence for {0} in the window; check the address (ip:port, IPv6 as [addr]:port), --since, and --data-dir")]
pub struct NoEvidence(pub String);

fn utc(ns: u64) -> String {
    humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns)).to_string()
}

fn failure_text(mode: FailureMode, row: &DestinationRow) -> String {
    let (t, about) = match (row.path_idle_timeout_seconds, row.path_idle_timeout_upper_seconds) {
        (Some(p), _) => (fmt_secs(p), "about "),
        (None, Some(u)) => {
            (format!("between {} and {}", fmt_secs(row.path_idle_timeout_lower_seconds), fmt_secs(u)), "")
        }
        (None, None) => ("an unknown time".to_owned(), ""),
    };
    match mode {
        FailureMode::Fin => format!("the hop closes idle connections with FIN after {about}{t}"),
        FailureMode::Rst => format!("the hop resets connections reused after {about}{t} of idle time"),
        FailureMode::SilentDrop => {
            format!("the path silently drops idle flows after {about}{t}; a reused connection stalls until the client gives up")
        }
        FailureMode::None => "no failed reuse observed".to_owned(),
    }
}

/// Report input from a recording: the events of `destination`, over
/// `since_ns` before the recording's last event (a recording is its own
/// clock), with new connections counted per minute.
#[must_use]
pub fn input_from_recording(events: Vec<SockEvent>, destination: std::net::SocketAddr, since_ns: u64) -> Input {
    let mine: Vec<SockEvent> = events
        .into_iter()
        .filter(|e| crate::aggregate::destination_of(e).is_some_and(|(a, _)| a == destination))
        .collect();
    let until = mine.last().map_or(0, |e| e.ts_unix_ns);
    let since = until.saturating_sub(since_ns);
    let mut volume = std::collections::BTreeMap::new();
    for e in mine.iter().filter(|e| e.kind == EventKind::Established) {
        *volume.entry(e.ts_unix_ns / 60_000_000_000).or_insert(0u64) += 1;
    }
    let evidence = mine
        .into_iter()
        .filter(|e| e.ts_unix_ns >= since && !matches!(e.kind, EventKind::Established | EventKind::Closed))
        .collect();
    Input {
        destination: destination.to_string(),
        since_ns: since,
        until_ns: until,
        events: evidence,
        volume: volume.into_iter().collect(),
        changes: Vec::new(),
    }
}

fn is_failure(e: &SockEvent) -> bool {
    e.kind == EventKind::Reuse && e.outcome.is_some_and(crate::event::Outcome::is_failure)
}

#[allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "bin arithmetic on small counts"
)]
fn probability_bins(reuses: &[&SockEvent]) -> Vec<ProbabilityBin> {
    let max = reuses.iter().map(|e| e.idle_seconds).fold(0.0, f64::max);
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
    for e in reuses {
        let i = ((e.idle_seconds / width).floor() as usize).min(n - 1);
        bins[i].reuses += 1;
        if is_failure(e) {
            bins[i].failures += 1;
        }
    }
    for b in &mut bins {
        b.probability = (b.reuses > 0).then(|| b.failures as f64 / b.reuses as f64);
    }
    bins
}

fn timeline(input: &Input, reuses: &[&SockEvent]) -> Vec<TimelineBin> {
    let (start, end) = match (reuses.first(), reuses.last()) {
        (Some(a), Some(b)) => (a.ts_unix_ns, b.ts_unix_ns.max(a.ts_unix_ns + 1)),
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
    for e in reuses {
        let b = &mut bins[idx(e.ts_unix_ns)];
        b.reuses += 1;
        if is_failure(e) {
            b.failures += 1;
        }
    }
    for &(minute, n) in &input.volume {
        let ts = minute * 60_000_000_000;
        if ts + 60_000_000_000 >= start && ts <= end {
            bins[idx(ts.max(start))].new_connections += n;
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
                outcome: e.outcome.map_or("-", |o| o.as_str()).to_owned(),
                retransmits: e.retransmits,
                safe_to_retry: e.safe_to_retry,
            })
            .collect(),
    }
}

fn questions(row: &DestinationRow, text: &str) -> Vec<Question> {
    let q = |topic: &str, question: &str, measured: String| Question {
        topic: topic.to_owned(),
        question: question.to_owned(),
        what_we_measured: measured,
    };
    vec![
        q(
            "idle timeout",
            "What is the idle timeout of every hop on your side (load balancer, proxies, NAT, firewall, servers), and does it close with FIN, RST or silently?",
            format!(
                "{text}; interval [{}, {}] from {} surviving and {} failing reuses",
                fmt_secs(row.path_idle_timeout_lower_seconds),
                row.path_idle_timeout_upper_seconds.map_or_else(|| "?".into(), fmt_secs),
                row.path_lower_evidence,
                row.path_upper_evidence
            ),
        ),
        q(
            "request timeout",
            "How long do you wait for a request before giving up, at each hop?",
            match (row.peer_request_deadline_seconds, row.request_timeout_seconds) {
                (None, None) => "no deadline observed: no request was aborted or timed out in the window".into(),
                (p, o) => format!(
                    "your side aborted requests after {}; ours gives up after {}",
                    p.map_or_else(|| "-".into(), fmt_secs),
                    o.map_or_else(|| "-".into(), fmt_secs)
                ),
            },
        ),
        q("maximum body size", "What is the largest request and response body you accept?", "not measured".into()),
        q("TLS versions", "Which TLS versions and cipher suites do you accept, and when will that change?", "not measured".into()),
        q("source address ranges", "Which source address ranges do you allow, and which addresses do you connect from?", format!("we connect to {}", row.destination)),
    ]
}

/// The row's findings beyond the interval, as report lines.
fn findings(row: &DestinationRow) -> Vec<(String, String)> {
    let mut f = Vec::new();
    let mut add = |k: &str, v: String| f.push((k.to_owned(), v));
    if let Some(e) = row.evidence {
        add("The verdict rests on", crate::table::name_of(&e));
    }
    if row.path_lower_basis == Some(crate::aggregate::LowerBasis::Keepalive) {
        add(
            "Lower bound",
            "proven only by sockets whose TCP keep-alive probes ran while idle: it holds for proxies, not for NAT or conntrack".into(),
        );
    }
    if row.mixed_paths.len() > 1 {
        let parts: Vec<String> = row
            .mixed_paths
            .iter()
            .map(|p| format!("{} ({:.0}% of peer idle closes)", fmt_secs(p.idle_timeout_seconds), p.share * 100.0))
            .collect();
        add("Several idle timeouts behind this address (mixed paths)", parts.join(", "));
    }
    if row.peer_restarts > 0 {
        add(
            "Peer restarts",
            format!(
                "{} in the window; {} failed reuses they explain are not counted as timeout evidence",
                row.peer_restarts, row.restart_failures
            ),
        );
    }
    if let Some(p) = row.peer_request_deadline_seconds {
        add("Your request deadline (requests you aborted)", fmt_secs(p));
    }
    if let Some(o) = row.request_timeout_seconds {
        add("Our request timeout (requests we gave up on)", fmt_secs(o));
    }
    if let Some(t) = row.server_idle_timeout_seconds {
        add("Our idle timeout toward clients", fmt_secs(t));
    }
    if row.late_reuses > 0 {
        add("Clients writing on connections we had closed idle", row.late_reuses.to_string());
    }
    if let Some(m) = row.client_max_reuse_idle_seconds {
        add("Longest idle age after which a client reused a connection", fmt_secs(m));
    }
    if let Some(r) = row.recommended_server_idle_timeout_seconds {
        add("Or raise our idle timeout to at least", fmt_secs(r));
    }
    f
}

/// Build the report.
pub fn build(input: &Input) -> Result<Report, NoEvidence> {
    let mut agg =
        Aggregator::new(Config { window_ns: input.until_ns.saturating_sub(input.since_ns), max_destinations: 4 });
    for e in &input.events {
        agg.ingest(e);
    }
    agg.finish();
    let rows = agg.rows(input.until_ns);
    let row = rows
        .iter()
        .find(|r| r.role == crate::event::Role::Client)
        .or_else(|| rows.first())
        .cloned()
        .ok_or_else(|| NoEvidence(input.destination.clone()))?;
    let role = row.role;
    let mine: Vec<&SockEvent> = input.events.iter().filter(|e| e.role == role).collect();
    let reuses: Vec<&SockEvent> =
        mine.iter().copied().filter(|e| e.kind == EventKind::Reuse && e.outcome.is_some()).collect();
    let failures: Vec<&SockEvent> = reuses.iter().copied().filter(|e| is_failure(e)).collect();
    let text = failure_text(row.failure_mode, &row);
    Ok(Report {
        destination: input.destination.clone(),
        role: role.as_str().to_owned(),
        generated_unix_ns: crate::event::clock_ns(libc::CLOCK_REALTIME),
        window_start_unix_ns: input.events.first().map_or(input.since_ns, |e| e.ts_unix_ns),
        window_end_unix_ns: input.events.last().map_or(input.until_ns, |e| e.ts_unix_ns),
        summary: Summary {
            path_idle_timeout_seconds: row.path_idle_timeout_seconds,
            path_idle_timeout_lower_seconds: row.path_idle_timeout_lower_seconds,
            path_idle_timeout_upper_seconds: row.path_idle_timeout_upper_seconds,
            lower_evidence: row.path_lower_evidence,
            upper_evidence: row.path_upper_evidence,
            point_evidence: row.path_point_evidence,
            failure_mode: row.failure_mode,
            failure_mode_text: text.clone(),
            first_failure_unix_ns: failures.first().map(|e| e.ts_unix_ns),
            last_failure_unix_ns: failures.last().map(|e| e.ts_unix_ns),
            reuses: reuses.len() as u64,
            failures: failures.len() as u64,
            peer_idle_closes: mine.iter().filter(|e| e.kind == EventKind::PeerCloseWhileIdle).count() as u64,
        },
        our_side: OurSide {
            pool_idle_timeout_seconds: row.pool_idle_timeout_seconds,
            pool_max_reuse_idle_seconds: row.pool_max_reuse_idle_seconds,
            processes: row.processes.clone(),
            verdict: row.verdict.as_str().to_owned(),
            recommended_pool_idle_timeout_seconds: row.recommended_pool_idle_timeout_seconds,
            recommended_max_lifetime_seconds: row.recommended_max_lifetime_seconds,
            safe_retry_rule: row.safe_retry_rule,
            recommendation: row.recommendation.clone(),
        },
        failure_probability: probability_bins(&reuses),
        timeline: timeline(input, &reuses),
        samples: samples(&failures),
        questions: questions(&row, &text),
        changes: input.changes.clone(),
        findings: findings(&row),
    })
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

#[allow(clippy::many_single_char_names, reason = "plot geometry reads as the math: w, h, x, y")]
/// Bar chart as inline SVG: `bars` are (label, value, value2) with value2
/// drawn as a second, overlaid series when present.
#[allow(clippy::cast_precision_loss, reason = "plot coordinates")]
fn svg_bars(
    title: &str,
    x_label: &str,
    y_label: &str,
    bars: &[(String, f64, Option<f64>)],
    y_max: f64,
    marker: Option<(f64, &str)>,
) -> String {
    let (w, h, left, bottom, top) = (760.0, 300.0, 60.0, 50.0, 30.0);
    let plot_w = w - left - 20.0;
    let plot_h = h - bottom - top;
    let n = bars.len().max(1) as f64;
    let bw = plot_w / n;
    let y = |v: f64| top + plot_h - (v / y_max.max(1e-9)) * plot_h;
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{t}"><title>{t}</title><rect width="{w}" height="{h}" fill="#ffffff"/>"##,
        t = esc(title)
    );
    let _ = write!(
        s,
        r##"<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="#333"/><line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="#333"/>"##,
        top + plot_h,
        top + plot_h,
        left + plot_w,
        top + plot_h
    );
    for k in 0..=4 {
        let v = y_max * f64::from(k) / 4.0;
        let yy = y(v);
        let _ = write!(
            s,
            r##"<line x1="{}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"##,
            left,
            left + plot_w,
            left - 4.0,
            yy + 3.0,
            if y_max <= 1.0 { format!("{:.0}%", v * 100.0) } else { format!("{v:.0}") }
        );
    }
    let label_every = (bars.len() / 8).max(1);
    for (i, (label, v, v2)) in bars.iter().enumerate() {
        let x = left + i as f64 * bw;
        let _ = write!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#8aa4c8"/>"##,
            x + 1.0,
            y(*v),
            (bw - 2.0).max(1.0),
            top + plot_h - y(*v)
        );
        if let Some(v2) = v2 {
            let _ = write!(
                s,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#c0392b"/>"##,
                x + bw * 0.25,
                y(*v2),
                (bw * 0.5).max(1.0),
                top + plot_h - y(*v2)
            );
        }
        if i % label_every == 0 {
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
                x + bw / 2.0,
                top + plot_h + 14.0,
                esc(label)
            );
        }
    }
    if let Some((pos, text)) = marker {
        let x = left + pos * plot_w;
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#c0392b" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" font-size="11" fill="#c0392b">{}</text>"##,
            top + plot_h,
            x + 4.0,
            top + 12.0,
            esc(text)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text><text x="14" y="{:.1}" font-size="12" text-anchor="middle" transform="rotate(-90 14 {:.1})">{}</text></svg>"#,
        left + plot_w / 2.0,
        h - 10.0,
        esc(x_label),
        top + plot_h / 2.0,
        top + plot_h / 2.0,
        esc(y_label)
    );
    s
}

fn probability_svg(r: &Report) -> String {
    let bars: Vec<(String, f64, Option<f64>)> = r
        .failure_probability
        .iter()
        .map(|b| {
            let w = b.idle_to_seconds - b.idle_from_seconds;
            let label =
                if w < 1.0 { format!("{:.1}", b.idle_from_seconds) } else { format!("{:.0}", b.idle_from_seconds) };
            (label, b.probability.unwrap_or(0.0), None)
        })
        .collect();
    let max_x = r.failure_probability.last().map_or(1.0, |b| b.idle_to_seconds);
    let t = r.summary.path_idle_timeout_seconds.or(r.summary.path_idle_timeout_upper_seconds);
    let marker = t.map(|t| (t / max_x, format!("path timeout {}", fmt_secs(t))));
    svg_bars(
        "Failure probability against idle age at reuse",
        "idle age at reuse (s)",
        "failed reuses",
        &bars,
        1.0,
        marker.as_ref().map(|(p, s)| (*p, s.as_str())),
    )
}

#[allow(clippy::cast_precision_loss, reason = "plot heights")]
fn timeline_svg(r: &Report) -> String {
    let bars: Vec<(String, f64, Option<f64>)> = r
        .timeline
        .iter()
        .map(|b| {
            // HH:MM, or HH:MM:SS when the bins are shorter than a minute.
            let t = utc(b.start_unix_ns);
            let label = if b.end_unix_ns - b.start_unix_ns < 60_000_000_000 {
                t[11..19].to_owned()
            } else {
                t[11..16].to_owned()
            };
            (label, (b.reuses + b.new_connections) as f64, Some(b.failures as f64))
        })
        .collect();
    let max = bars.iter().map(|b| b.1.max(b.2.unwrap_or(0.0))).fold(1.0, f64::max);
    svg_bars(
        "Failures over time beside request volume",
        "time (UTC); blue: reuses + new connections, red: failures",
        "count",
        &bars,
        max,
        None,
    )
}

/// HTML: self-contained, no scripts, no external assets.
#[must_use]
#[allow(clippy::too_many_lines, reason = "the report's sections one after another")]
pub fn html(r: &Report) -> String {
    let s = &r.summary;
    let o = &r.our_side;
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Idle timeout evidence: {d}</title><style>
body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}}
table{{border-collapse:collapse;margin:1rem 0}}td,th{{border:1px solid #ccc;padding:.3rem .6rem;text-align:left;font-size:.9rem}}
th{{background:#f3f3f3}}.big{{font-size:1.3rem}}.bad{{color:#c0392b}}code{{background:#f6f6f6;padding:0 .2rem}}
</style></head><body>
<h1>Idle timeout evidence for <code>{d}</code></h1>
<p>Generated {gen} by observer from kernel observations of every TCP socket to <code>{d}</code> ({role} side), {ws} to {we}.</p>
<h2 id="summary">Summary</h2>
<p class="big">{text}.</p>
<table><tr><th>Effective path idle timeout</th><td>{point} (interval [{lo}, {up}])</td></tr>
<tr><th>Evidence</th><td>{le} reuses survived up to {lo}; {ue} observations failed from {up}; {pe} peer closes in the point cluster</td></tr>
<tr><th>Failure mode</th><td>{mode}</td></tr>
<tr><th>Reuses / failed reuses / peer idle closes</th><td>{reuses} / {failures} / {pcs}</td></tr>
<tr><th>First failure</th><td>{ff}</td></tr><tr><th>Last failure</th><td>{lf}</td></tr></table>
"#,
        d = esc(&r.destination),
        gen = utc(r.generated_unix_ns),
        role = esc(&r.role),
        ws = utc(r.window_start_unix_ns),
        we = utc(r.window_end_unix_ns),
        text = esc(&s.failure_mode_text),
        point = opt_secs(s.path_idle_timeout_seconds),
        lo = fmt_secs(s.path_idle_timeout_lower_seconds),
        up = opt_secs(s.path_idle_timeout_upper_seconds),
        le = s.lower_evidence,
        ue = s.upper_evidence,
        pe = s.point_evidence,
        mode = s.failure_mode.as_str(),
        reuses = s.reuses,
        failures = s.failures,
        pcs = s.peer_idle_closes,
        ff = opt_time(s.first_failure_unix_ns),
        lf = opt_time(s.last_failure_unix_ns),
    );
    let _ = write!(
        h,
        r#"<h2 id="our-side">Our side</h2><table>
<tr><th>Pool idle timeout observed</th><td>{pool}</td></tr>
<tr><th>Longest idle age at which our pool reused a socket</th><td>{maxr}</td></tr>
<tr><th>Processes talking to the destination</th><td>{procs}</td></tr>
<tr><th>Verdict</th><td class="{cls}">{verdict}</td></tr>
<tr><th>Recommended pool idle timeout</th><td>{rec} (0.8 x the path's idle timeout)</td></tr>
<tr><th>Recommended maximum connection lifetime</th><td>{life}</td></tr>
<tr><th>Safe retry</th><td>{retry}</td></tr></table>
<p>{recommendation}</p>
{findings}"#,
        pool = opt_secs(o.pool_idle_timeout_seconds),
        maxr = opt_secs(o.pool_max_reuse_idle_seconds),
        procs = esc(&o.processes.join(", ")),
        cls = if o.verdict.ends_with("mismatch") { "bad" } else { "" },
        verdict = esc(&o.verdict),
        rec = opt_secs(o.recommended_pool_idle_timeout_seconds),
        life = opt_secs(o.recommended_max_lifetime_seconds),
        retry = if o.safe_retry_rule {
            "retry once on a fresh connection only when no request byte reached a live peer (the peer's FIN arrived before the write: safe_to_retry)"
        } else {
            "no retry rule: a stall or a reset after the write may have reached the server"
        },
        recommendation = esc(&o.recommendation),
        findings = if r.findings.is_empty() {
            String::new()
        } else {
            let rows = r.findings.iter().fold(String::new(), |mut t, (k, v)| {
                let _ = write!(t, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
                t
            });
            format!("<h3>Further findings</h3><table>{rows}</table>\n")
        },
    );
    let _ = write!(
        h,
        r#"<h2 id="plots">Plots</h2><figure>{}<figcaption>The step where failures begin is the timeout.</figcaption></figure><figure>{}<figcaption>Failures come from reuse after idle, not from load: they appear when traffic is low.</figcaption></figure>"#,
        probability_svg(r),
        timeline_svg(r)
    );
    let _ = write!(
        h,
        r#"<h2 id="samples">Sample failures</h2><p>{} failed reuses in total; shown: {}.</p><table><tr><th>time (UTC)</th><th>local</th><th>remote</th><th>process</th><th>idle age</th><th>outcome</th><th>retransmits</th><th>safe_to_retry</th></tr>"#,
        r.samples.total_failures,
        esc(&r.samples.method)
    );
    for x in &r.samples.rows {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} ({})</td><td>{:.3} s</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&x.time_utc),
            esc(&x.local),
            esc(&x.remote),
            esc(&x.process),
            x.pid,
            x.idle_seconds,
            esc(&x.outcome),
            x.retransmits,
            x.safe_to_retry
        );
    }
    h.push_str("</table><h2 id=\"questions\">Questions for the partner</h2><table><tr><th>topic</th><th>question</th><th>what we already measured</th></tr>");
    for q in &r.questions {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&q.topic),
            esc(&q.question),
            esc(&q.what_we_measured)
        );
    }
    h.push_str("</table>");
    if !r.changes.is_empty() {
        h.push_str("<h2 id=\"changes\">Changes of the estimate</h2><ul>");
        for c in &r.changes {
            let _ = write!(
                h,
                "<li>{}: [{}, {}] became [{}, {}]</li>",
                utc(c.ts_unix_ns),
                opt_secs(c.before_lower_seconds),
                opt_secs(c.before_upper_seconds),
                opt_secs(c.after_lower_seconds),
                opt_secs(c.after_upper_seconds)
            );
        }
        h.push_str("</ul>");
    }
    h.push_str("</body></html>\n");
    h
}

/// Markdown: the same content, plots as tables.
#[must_use]
#[allow(clippy::too_many_lines, reason = "the report's sections one after another")]
pub fn markdown(r: &Report) -> String {
    let s = &r.summary;
    let o = &r.our_side;
    let mut m = String::new();
    let _ = writeln!(m, "# Idle timeout evidence for `{}`\n", r.destination);
    let _ = writeln!(
        m,
        "Generated {} by observer from kernel observations of every TCP socket to `{}` ({} side), {} to {}.\n",
        utc(r.generated_unix_ns),
        r.destination,
        r.role,
        utc(r.window_start_unix_ns),
        utc(r.window_end_unix_ns)
    );
    let _ = writeln!(m, "## Summary\n\n**{}.**\n", s.failure_mode_text);
    let _ = writeln!(m, "| | |\n|---|---|");
    let _ = writeln!(
        m,
        "| Effective path idle timeout | {} (interval [{}, {}]) |",
        opt_secs(s.path_idle_timeout_seconds),
        fmt_secs(s.path_idle_timeout_lower_seconds),
        opt_secs(s.path_idle_timeout_upper_seconds)
    );
    let _ = writeln!(m, "| Evidence | {} reuses survived up to {}; {} observations failed from {}; {} peer closes in the point cluster |", s.lower_evidence, fmt_secs(s.path_idle_timeout_lower_seconds), s.upper_evidence, opt_secs(s.path_idle_timeout_upper_seconds), s.point_evidence);
    let _ = writeln!(m, "| Failure mode | {} |", s.failure_mode.as_str());
    let _ = writeln!(
        m,
        "| Reuses / failed reuses / peer idle closes | {} / {} / {} |",
        s.reuses, s.failures, s.peer_idle_closes
    );
    let _ = writeln!(
        m,
        "| First failure | {} |\n| Last failure | {} |\n",
        opt_time(s.first_failure_unix_ns),
        opt_time(s.last_failure_unix_ns)
    );
    let _ = writeln!(m, "## Our side\n\n| | |\n|---|---|");
    let _ = writeln!(m, "| Pool idle timeout observed | {} |", opt_secs(o.pool_idle_timeout_seconds));
    let _ = writeln!(
        m,
        "| Longest idle age at which our pool reused a socket | {} |",
        opt_secs(o.pool_max_reuse_idle_seconds)
    );
    let _ = writeln!(m, "| Processes talking to the destination | {} |", o.processes.join(", "));
    let _ = writeln!(m, "| Verdict | {} |", o.verdict);
    let _ = writeln!(
        m,
        "| Recommended pool idle timeout | {} (0.8 x the path's idle timeout) |",
        opt_secs(o.recommended_pool_idle_timeout_seconds)
    );
    let _ =
        writeln!(m, "| Recommended maximum connection lifetime | {} |", opt_secs(o.recommended_max_lifetime_seconds));
    let _ = writeln!(
        m,
        "| Safe retry | {} |\n\n{}\n",
        if o.safe_retry_rule {
            "retry once on a fresh connection only when no request byte reached a live peer (safe_to_retry)"
        } else {
            "no retry rule"
        },
        o.recommendation
    );
    if !r.findings.is_empty() {
        let _ = writeln!(m, "### Further findings\n\n| | |\n|---|---|");
        for (k, v) in &r.findings {
            let _ = writeln!(m, "| {k} | {v} |");
        }
        m.push('\n');
    }
    let _ = writeln!(m, "## Plots\n\n### Failure probability against idle age at reuse\n\nThe step where failures begin is the timeout.\n\n| idle age (s) | reuses | failed | failure probability |\n|---|---|---|---|");
    for b in &r.failure_probability {
        let _ = writeln!(
            m,
            "| {:.1}-{:.1} | {} | {} | {} |",
            b.idle_from_seconds,
            b.idle_to_seconds,
            b.reuses,
            b.failures,
            b.probability.map_or_else(|| "-".to_owned(), |p| format!("{:.0}%", p * 100.0))
        );
    }
    let _ = writeln!(m, "\n### Failures over time beside request volume\n\n| from (UTC) | reuses | new connections | failed reuses |\n|---|---|---|---|");
    for b in &r.timeline {
        let _ = writeln!(m, "| {} | {} | {} | {} |", utc(b.start_unix_ns), b.reuses, b.new_connections, b.failures);
    }
    let _ = writeln!(m, "\n## Sample failures\n\n{} failed reuses in total; shown: {}.\n\n| time (UTC) | local | remote | process | idle age | outcome | retransmits | safe_to_retry |\n|---|---|---|---|---|---|---|---|", r.samples.total_failures, r.samples.method);
    for x in &r.samples.rows {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} ({}) | {:.3} s | {} | {} | {} |",
            x.time_utc, x.local, x.remote, x.process, x.pid, x.idle_seconds, x.outcome, x.retransmits, x.safe_to_retry
        );
    }
    let _ =
        writeln!(m, "\n## Questions for the partner\n\n| topic | question | what we already measured |\n|---|---|---|");
    for q in &r.questions {
        let _ = writeln!(m, "| {} | {} | {} |", q.topic, q.question, q.what_we_measured);
    }
    if !r.changes.is_empty() {
        let _ = writeln!(m, "\n## Changes of the estimate\n");
        for c in &r.changes {
            let _ = writeln!(
                m,
                "- {}: [{}, {}] became [{}, {}]",
                utc(c.ts_unix_ns),
                opt_secs(c.before_lower_seconds),
                opt_secs(c.before_upper_seconds),
                opt_secs(c.after_lower_seconds),
                opt_secs(c.after_upper_seconds)
            );
        }
    }
    m
}

#[cfg(test)]
mod tests;

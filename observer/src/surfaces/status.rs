//! `observer status` and `observer analyze`: the destination table as text
//! or JSON, from the daemon's API or from a recording.

use std::{
    fmt::Write as _,
    io::{BufRead, BufReader, Read},
};

use crate::{
    diagnosis::aggregate::{Aggregator, Config, DestinationRow},
    kernel::event::{printable, SockEvent},
};

/// A recording could not be read.
#[derive(Debug, thiserror::Error)]
pub enum RecordingError {
    #[error("reading the recording: {0}")]
    Io(#[from] std::io::Error),
    #[error("line {line}: {problem}; each line must be one JSON event as written by `observer run --record`")]
    Line { line: usize, problem: String },
    #[error("line {line} is longer than {MAX_LINE_BYTES} bytes: not a recording (an event is one JSON line of well under 4 KiB)")]
    LongLine { line: usize },
    #[error("the recording has more than {max} events, more than one read holds in memory: cut it to the time or destination you need (e.g. `grep '\"remote\":\"10.0.0.2:443\"'`, or `tail -n`)")]
    TooLarge { max: usize },
}

/// A recording line longer than this is refused (an event is well under
/// 4 KiB; `/dev/zero` is not a recording).
pub const MAX_LINE_BYTES: usize = 64 * 1024;
/// Events one recording read holds at most (a few hundred bytes each in
/// memory: about 1.5 GB at the cap).
pub const MAX_RECORDING_EVENTS: usize = 4_000_000;

/// Parse a JSON-lines recording (blank lines are skipped), bounded: a line
/// longer than [`MAX_LINE_BYTES`] or more than [`MAX_RECORDING_EVENTS`]
/// events is an error naming the problem, never unbounded memory.
pub fn read_recording(r: impl Read) -> Result<Vec<SockEvent>, RecordingError> {
    read_events(r, MAX_RECORDING_EVENTS)
}

fn read_events(r: impl Read, max: usize) -> Result<Vec<SockEvent>, RecordingError> {
    let mut out = Vec::new();
    let mut reader = BufReader::new(r);
    let mut buf = Vec::new();
    for i in 0.. {
        buf.clear();
        let limit = u64::try_from(MAX_LINE_BYTES).unwrap_or(u64::MAX) + 1;
        if (&mut reader).take(limit).read_until(b'\n', &mut buf)? == 0 {
            break;
        }
        if buf.len() > MAX_LINE_BYTES {
            return Err(RecordingError::LongLine { line: i + 1 });
        }
        let line = std::str::from_utf8(&buf)
            .map_err(|e| RecordingError::Line { line: i + 1, problem: format!("not UTF-8 ({e})") })?;
        if line.trim().is_empty() {
            continue;
        }
        if out.len() == max {
            return Err(RecordingError::TooLarge { max });
        }
        let ev =
            serde_json::from_str(line).map_err(|e| RecordingError::Line { line: i + 1, problem: e.to_string() })?;
        out.push(ev);
    }
    Ok(out)
}

/// Aggregate a recording as the daemon would have, as of its last event.
#[must_use]
pub fn analyze(events: &[SockEvent], config: Config) -> Vec<DestinationRow> {
    let mut agg = Aggregator::of_events(config, events);
    agg.rows(agg.latest_ns())
}

fn secs(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |s| format!("{s:.3}s"))
}

fn path_cell(r: &DestinationRow) -> String {
    let interval = format!("[{:.3}, {}]", r.path.lower_seconds, secs(r.path.upper_seconds));
    match r.path.idle_timeout_seconds {
        Some(p) => format!("{p:.3}s {interval}"),
        None if r.path.upper_seconds.is_none() && r.path.lower_seconds == 0.0 => "-".to_owned(),
        None => interval,
    }
}

/// Left-aligned columns, two spaces apart, header first.
pub(crate) fn columns<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    let mut line = |items: &mut dyn Iterator<Item = &str>| {
        let mut l = String::new();
        for (item, w) in items.zip(&widths) {
            let _ = write!(l, "{item:<w$}  ");
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(&mut header.iter().copied());
    for row in rows {
        line(&mut row.iter().map(String::as_str));
    }
    out
}

fn timeout_cell(r: &DestinationRow) -> String {
    match r.id.role {
        crate::kernel::event::Role::Server => {
            r.server.server_idle_timeout_seconds.map_or_else(|| "-".to_owned(), |t| format!("ours {t:.3}s"))
        }
        _ => path_cell(r),
    }
}

fn deadline_cell(r: &DestinationRow) -> String {
    if r.deadlines.peer_request_deadline_seconds.is_none() && r.deadlines.request_timeout_seconds.is_none() {
        return "-".to_owned();
    }
    format!("{}/{}", secs(r.deadlines.peer_request_deadline_seconds), secs(r.deadlines.request_timeout_seconds))
}

/// The destination, with its network namespace when it is not the host's
/// (one address seen from two pods is two rows).
fn destination_cell(r: &DestinationRow) -> String {
    match r.id.netns.inode() {
        Some(n) => format!("{} netns:{n}", r.id.destination),
        None => r.id.destination.clone(),
    }
}

/// The name clients used most for the destination, and how many others
/// they used (`-`: none seen, or `--no-names`).
fn name_cell(r: &DestinationRow) -> String {
    match r.server_names.as_slice() {
        [] => "-".to_owned(),
        [one] => printable(&one.name),
        [first, rest @ ..] => format!("{} +{}", printable(&first.name), rest.len()),
    }
}

/// The human table, with one note per finding under it.
#[must_use]
pub fn render_table(rows: &[DestinationRow]) -> String {
    let header = [
        "NAME",
        "DESTINATION",
        "ROLE",
        "MODE",
        "IDLE TIMEOUT",
        "POOL IDLE",
        "VERDICT",
        "EVIDENCE",
        "RECOMMENDED POOL IDLE",
        "DEADLINE PEER/OURS",
        "REUSES/1H",
        "FAILURES/1H",
        "AT RISK",
        "DOOMED",
        "DISCARDED",
    ];
    let cells: Vec<[String; 15]> = rows
        .iter()
        .map(|r| {
            let pool = match r.id.role {
                crate::kernel::event::Role::Server => r.server.client_pool_idle_timeout_seconds,
                _ => r.pool.idle_timeout_seconds,
            };
            [
                name_cell(r),
                destination_cell(r),
                r.id.role.as_str().to_owned(),
                r.failure_mode.as_str().to_owned(),
                timeout_cell(r),
                secs(pool),
                r.judgement.verdict.as_str().to_owned(),
                r.judgement.evidence.map_or_else(|| "-".to_owned(), |e| e.as_str().to_owned()),
                secs(r.judgement.recommended_pool_idle_timeout_seconds),
                deadline_cell(r),
                r.counts.reuses.to_string(),
                r.counts.failures.to_string(),
                r.sockets.at_risk_idle_sockets.to_string(),
                r.sockets.doomed_idle_sockets.to_string(),
                r.sockets.discarded_dead.to_string(),
            ]
        })
        .collect();
    let mut out = columns(&header, &cells);
    if rows.is_empty() {
        out.push_str("(no destinations with evidence yet)\n");
    }
    for r in rows {
        notes(&mut out, r);
    }
    out
}

/// The notes under the table for one row: its findings, one per line.
fn notes(out: &mut String, r: &DestinationRow) {
    let mut tags = vec![r.id.role.as_str()];
    tags.extend(r.protocols.iter().map(|p| p.as_str()));
    let tags = tags.join(", ");
    let who = match r.server_names.first() {
        Some(n) => format!("{} {} ({tags})", printable(&n.name), destination_cell(r)),
        None => format!("{} ({tags})", destination_cell(r)),
    };
    if r.judgement.verdict.is_mismatch()
        || r.judgement.recommended_pool_idle_timeout_seconds.is_none() && r.counts.failures_window > 0
    {
        let _ = writeln!(out, "{who}: {}", r.judgement.recommendation);
    }
    if r.judgement.verdict.is_mismatch() || r.fix_settings.iter().any(|f| f.finding.is_some()) {
        for f in r.fix_settings.iter().filter(|f| f.client != "unknown") {
            let _ = writeln!(out, "{who}: {}: {}", f.client, f.advice);
            if let Some(finding) = &f.finding {
                let _ = writeln!(out, "{who}: finding: {finding}");
            }
        }
    }
    if r.path.mixed_paths.len() > 1 {
        let parts: Vec<String> =
            r.path.mixed_paths.iter().map(|p| format!("{} ({:.0}%)", p.describe("s"), p.share * 100.0)).collect();
        let _ = writeln!(out, "{who}: mixed paths behind one address: {}", parts.join(", "));
    }
    if let Some(words) = r.resets_in_words() {
        let _ = writeln!(out, "{who}: {words}");
    }
    if r.counts.peer_restarts > 0 {
        let _ = writeln!(
            out,
            "{who}: {} peer restart(s) in the window; {} failed reuses they explain are not timeout evidence",
            r.counts.peer_restarts, r.counts.restart_failures
        );
    }
    if r.counts.failures_after_goodbye > 0 {
        let _ = writeln!(
            out,
            "{who}: {} failed reuse(s) written after the server's goodbye (GOAWAY or close_notify waiting unread): the client reads only when it waits for an answer and does not honour the drain signal",
            r.counts.failures_after_goodbye
        );
    }
    if r.path.lower_basis == Some(crate::diagnosis::aggregate::LowerBasis::Keepalive) {
        let _ = writeln!(
            out,
            "{who}: the lower bound rests only on sockets whose TCP keep-alive probes ran while idle (valid for proxies, not for NAT/conntrack)"
        );
    }
    if r.sockets.doomed_idle_sockets > 0 {
        let holders: Vec<String> = r.sockets.doomed_owners.iter().map(|o| printable(&o.label())).collect();
        let _ = writeln!(
            out,
            "{who}: {} sockets held now are already dead (closed or reset by the peer, or timed out, while idle, or stalled) and will fail on first use; held by {}",
            r.sockets.doomed_idle_sockets,
            if holders.is_empty() { "?".to_owned() } else { holders.join(", ") }
        );
    }
    if r.server.late_reuses > 0 {
        let _ = writeln!(
            out,
            "{who}: {} clients wrote on connections we had closed idle (late reuses)",
            r.server.late_reuses
        );
    }
    if let (Some(p), Some(o)) = (r.deadlines.peer_request_deadline_seconds, r.deadlines.request_timeout_seconds) {
        if o < p {
            let _ = writeln!(
                out,
                "{who}: deadline staircase reversed: we give up after {o:.3} s, before the peer's {p:.3} s deadline"
            );
        }
    }
}

#[cfg(test)]
mod tests;

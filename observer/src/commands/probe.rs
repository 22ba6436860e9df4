//! `observer probe`: the command body (arguments, output, exit code).

use std::{
    fmt::Write as _,
    net::ToSocketAddrs as _,
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::ExitCode,
    sync::atomic::{AtomicBool, Ordering},
    time::Duration,
};

use crate::{
    cli::{Output, ProbeArgs},
    kernel::event::{clock_ns, printable},
    probe::{
        announce::Announcer,
        conn::{First, Target},
        declared,
        search::{self, Close, FailureMode, Outcome},
        tls, Limits, Progress, Report,
    },
    surfaces::store::{Record, Store, StoreError},
    units::fmt_secs,
};

/// A `--request` file larger than this is refused (a first request is a
/// few hundred bytes).
const MAX_REQUEST_BYTES: u64 = 64 << 10;

/// `observer probe`: exit 0 measured, 1 nothing closed within `--up-to`,
/// 2 bad input or nothing could be measured.
#[must_use]
pub fn command(args: &ProbeArgs) -> ExitCode {
    let planned = plan(args).and_then(|p| Ok((p, declared_hops(args)?)));
    let ((mut target, limits), hops) = match planned {
        Ok(p) => p,
        Err(e) => {
            eprintln!("observer: error: {e}");
            return ExitCode::from(2);
        }
    };
    let quiet = args.quiet;
    // Where a daemon keeps its store, name this probe's connections for a
    // daemon that starts while it runs (one running already is told by
    // the kernel). Also under --no-store: this is no evidence.
    if args.data_dir.is_dir() {
        match Announcer::start(&args.data_dir, limits.budget) {
            Ok(a) => target.announce = Some(std::sync::Arc::new(a)),
            Err(e) if !quiet => eprintln!(
                "observer: note: cannot announce this probe's connections in {} ({e}): a daemon started during the probe counts them",
                args.data_dir.display()
            ),
            Err(_) => {}
        }
    }
    let mut progress = |p: Progress<'_>| {
        if !quiet {
            eprintln!("{}", progress_line(&p));
        }
    };
    // Ctrl-C ends the measurement and prints what is known so far.
    STOP.store(false, Ordering::Relaxed);
    // SAFETY: the handler only stores to an atomic (async-signal-safe).
    unsafe {
        libc::signal(libc::SIGINT, on_sigint as *const () as libc::sighandler_t);
    }
    let mut report = match crate::probe::measure(&args.destination, &target, limits, &STOP, &mut progress) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("observer: error: {}: {e}", printable(&args.destination));
            return ExitCode::from(2);
        }
    };
    report.path = declared::compare(&hops, &report.finding);
    if !args.no_store {
        match store(&report, &args.data_dir) {
            Stored::In(path) if !quiet => {
                eprintln!(
                    "stored as probe evidence in {}: a daemon on that store shows it in the row of {} within seconds",
                    path.display(),
                    report.address
                );
            }
            Stored::NoStore(why) if !quiet => {
                eprintln!("observer: note: the result was not stored: {why} (--no-store skips this)");
            }
            // A store that is there but refused the result: said even under --quiet.
            Stored::Failed(e) => eprintln!("observer: warning: the result was not stored: {e}"),
            _ => {}
        }
    }
    match args.format {
        Output::Json => match serde_json::to_string_pretty(&report) {
            Ok(j) => println!("{j}"),
            Err(e) => {
                eprintln!("observer: error: {e}");
                return ExitCode::from(2);
            }
        },
        Output::Text => print!("{}", render(&report)),
    }
    if report.finding.how == FailureMode::None {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// Set by SIGINT (Ctrl-C).
static STOP: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigint(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

/// What became of the result in the store.
enum Stored {
    In(PathBuf),
    /// It proves nothing worth storing.
    Nothing,
    /// No store this user can reach at `--data-dir`.
    NoStore(String),
    /// A store that refused it.
    Failed(String),
}

/// Add the result to the daemon's store in `dir` (an existing one).
fn store(report: &Report, dir: &Path) -> Stored {
    if !report.proves_anything() {
        return Stored::Nothing;
    }
    // The store is private to the daemon's user: say so rather than "missing".
    let private = |what: &Path| {
        Stored::NoStore(format!(
            "{} is not open to this user (the daemon's store is private to its user: run the probe as root or as that user)",
            what.display()
        ))
    };
    if dir.is_dir() && std::fs::read_dir(dir).is_err() {
        return private(dir);
    }
    let mut store = match Store::open_existing(dir) {
        Ok(s) => s,
        Err(StoreError::Missing { path }) => {
            return Stored::NoStore(format!(
                "no evidence store at {} (give a running daemon's --data-dir)",
                path.display()
            ))
        }
        Err(StoreError::Open { path, .. }) => return private(&path),
        Err(e) => return Stored::Failed(e.to_string()),
    };
    // The probe's own network namespace: its row is the one the daemon
    // keeps for sockets in it.
    let netns = std::fs::metadata("/proc/self/ns/net").ok().and_then(|m| u32::try_from(m.ino()).ok());
    let now = clock_ns(libc::CLOCK_REALTIME);
    match store.insert(&[Record::Probe(report.evidence(netns, now))]) {
        Ok(_) => Stored::In(store.path().to_path_buf()),
        Err(e) => Stored::Failed(e.to_string()),
    }
}

/// Seconds for a progress line: `1`, `1.5`, `44.631`.
fn short(s: f64) -> String {
    search::millis(s).to_string()
}

/// One line on standard error: the round's ages, then after each result
/// the bracket so far and the time left.
fn progress_line(p: &Progress<'_>) -> String {
    match p {
        Progress::Round { round, ages } => {
            // Repeated ages (16 connections at each in a bracket) once each.
            let mut counted: Vec<(f64, usize)> = Vec::new();
            for &a in *ages {
                match counted.last_mut() {
                    Some((b, n)) if b.to_bits() == a.to_bits() => *n += 1,
                    _ => counted.push((a, 1)),
                }
            }
            let list: Vec<String> =
                counted.iter().map(|&(a, n)| if n > 1 { format!("{n} x {}", short(a)) } else { short(a) }).collect();
            format!("round {round}: {} connections, keep-alive probes at {} s of idleness", ages.len(), list.join(", "))
        }
        Progress::Result { round, done, of, finding, round_ends_in, budget_left } => {
            let so_far = match finding.how {
                FailureMode::Fin | FailureMode::Rst => {
                    format!("closes at {} s", short(finding.idle_timeout_seconds.unwrap_or_default()))
                }
                FailureMode::SilentDrop => format!(
                    "bracket [{}, {}] s",
                    short(finding.lower_seconds),
                    short(finding.upper_seconds.unwrap_or_default())
                ),
                FailureMode::None => format!("alive up to {} s, nothing closed yet", short(finding.lower_seconds)),
            };
            format!(
                "round {round}: {done}/{of} done; {so_far}; this round ends within {} s, budget left {} s (Ctrl-C prints what is known)",
                round_ends_in.as_secs(),
                budget_left.as_secs()
            )
        }
    }
}

/// The target and limits from the arguments, or what is wrong with them.
fn plan(args: &ProbeArgs) -> Result<(Target, Limits), String> {
    let addr = args
        .destination
        .to_socket_addrs()
        .map_err(|e| format!("{}: {e}; write it as host:port or [ipv6]:port", printable(&args.destination)))?
        .next()
        .ok_or_else(|| format!("{} resolves to no address", printable(&args.destination)))?;
    let host = args.destination.rsplit_once(':').map_or(args.destination.as_str(), |(h, _)| h);
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let name = args.server_name.clone().unwrap_or_else(|| host.to_owned());
    let up_to = args.up_to.as_secs_f64();
    if !(1.0..=7200.0).contains(&up_to) {
        return Err(format!("--up-to {}: give 1s to 2h", humantime::format_duration(args.up_to)));
    }
    let first = if let Some(path) = &args.http {
        if !path.starts_with('/') || path.bytes().any(|b| b.is_ascii_control() || b == b' ') {
            return Err(format!("--http {}: give a path such as /health", printable(path)));
        }
        First::Http(path.clone())
    } else if let Some(file) = &args.request {
        let bytes = read_request(file)?;
        First::Request(bytes)
    } else {
        First::Handshake
    };
    // TLS when asked, and by default for a handshake on 443.
    let tls_wanted = args.tls || (!args.tcp && first == First::Handshake && addr.port() == 443);
    let tls = if tls_wanted { Some(tls::config().map_err(|e| format!("setting up TLS: {e}"))?) } else { None };
    let budget = args.budget.unwrap_or(Duration::from_secs_f64(up_to * 3.0));
    let connections = usize::try_from(args.connections).unwrap_or(32);
    Ok((Target { addr, name, tls, first, announce: None }, Limits { up_to, connections, budget }))
}

/// The hops of `--path FILE` (none without it).
fn declared_hops(args: &ProbeArgs) -> Result<Vec<crate::path::Hop>, String> {
    let Some(file) = &args.path else { return Ok(Vec::new()) };
    crate::path::load(file).map_err(|e| format!("--path {e}"))
}

fn read_request(file: &std::path::Path) -> Result<Vec<u8>, String> {
    let bytes =
        crate::files::read_bytes(file, MAX_REQUEST_BYTES).map_err(|e| format!("--request {}: {e}", file.display()))?;
    if bytes.is_empty() {
        return Err(format!("--request {}: empty; give the first request's bytes", file.display()));
    }
    Ok(bytes)
}

/// The human answer: what closes the path's idle connections, the fix,
/// and the evidence.
#[must_use]
pub fn render(r: &Report) -> String {
    let f = &r.finding;
    let mut out = String::new();
    let dest = printable(&r.destination);
    let _ = writeln!(out, "{dest} ({}, first exchange: {})", r.address, r.first_exchange);
    if r.interrupted {
        let _ = writeln!(out, "interrupted (Ctrl-C): what was known then");
    }
    let upper = f.upper_seconds.unwrap_or_default();
    let line = match f.how {
        FailureMode::Fin | FailureMode::Rst => {
            let kind = if f.how == FailureMode::Fin { "FIN" } else { "RST" };
            let at = f.idle_timeout_seconds.unwrap_or_default();
            let closes = r.probes.iter().filter(|p| matches!(p.outcome, Outcome::Closed { .. })).count();
            format!(
                "a hop closes idle connections with {kind} at {} of idleness (the median of {} closes, from {} to {}): a proxy or server ending its session",
                fmt_secs(at),
                closes,
                fmt_secs(f.lower_seconds),
                fmt_secs(upper)
            )
        }
        FailureMode::SilentDrop => format!(
            "a hop drops idle flows silently between {} and {} of idleness (alive at {}, gone by {}): a NAT or firewall forgetting the flow{}",
            fmt_secs(f.lower_seconds),
            fmt_secs(upper),
            fmt_secs(f.lower_seconds),
            fmt_secs(upper),
            if f.settled { "" } else { "; the time budget ended before the bracket was within 5 %" }
        ),
        FailureMode::None => format!("nothing closed an idle connection within {} (exit 1)", fmt_secs(f.lower_seconds)),
    };
    let _ = writeln!(out, "{line}");
    if let Some(rec) = f.recommended_pool_idle_timeout_seconds {
        let _ = writeln!(out, "effective path idle timeout: {}", effective(r));
        let _ = writeln!(out, "recommended pool idle timeout: at most {} (0.8 x the smallest)", fmt_secs(rec));
    }
    if let Some(p) = f.longer_path {
        let _ = writeln!(
            out,
            "a second path: {} connection(s) were alive at an age above one found dead (alive at {}{}): flows to this destination take more than one path (ECMP, several NATs or firewalls), or a flow was lost for another reason; the bracket above is the shortest path's",
            f.contradictions,
            fmt_secs(p.lower_seconds),
            p.upper_seconds.map(|u| format!(", gone by {}", fmt_secs(u))).unwrap_or_default()
        );
    }
    let _ = writeln!(out, "{} connections in {} round(s), {}", r.connections, r.rounds, fmt_secs(r.elapsed_seconds));
    let _ = writeln!(out, "\n{:>5}  {:>8}  {:>17}  result", "round", "planned", "idle age");
    let mut probes = r.probes.clone();
    probes.sort_by(|a, b| a.round.cmp(&b.round).then(a.planned_seconds.total_cmp(&b.planned_seconds)));
    // Connections of one round planned at one age with one result are one
    // line: "16 x", their idle ages from the earliest to the latest.
    let mut lines: Vec<Line> = Vec::new();
    for p in &probes {
        let (at, what) = match p.outcome {
            Outcome::Closed { close, at_seconds } => {
                (Some(at_seconds), if close == Close::Fin { "FIN: a hop closed it" } else { "RST: a hop reset it" })
            }
            Outcome::Alive { at_seconds } => (Some(at_seconds), "probe answered: alive"),
            Outcome::Dead { reset: true, at_seconds } => (Some(at_seconds), "probe answered with RST: gone"),
            Outcome::Dead { reset: false, at_seconds } => (Some(at_seconds), "probe unanswered: gone"),
            Outcome::Cancelled => (None, "not needed (a shorter age was gone)"),
            Outcome::Failed => (None, "connection failed"),
        };
        match lines.last_mut() {
            Some(l) if l.round == p.round && l.planned.to_bits() == p.planned_seconds.to_bits() && l.what == what => {
                l.n += 1;
                if let (Some((lo, hi)), Some(a)) = (l.span.as_mut(), at) {
                    *lo = lo.min(a);
                    *hi = hi.max(a);
                }
            }
            _ => lines.push(Line { round: p.round, planned: p.planned_seconds, span: at.map(|a| (a, a)), what, n: 1 }),
        }
    }
    for Line { round, planned, span, what, n } in lines {
        let at = match span {
            None => "-".to_owned(),
            Some((lo, hi)) if (hi - lo) * 1000.0 < 0.5 => fmt_secs(lo),
            Some((lo, hi)) => format!("{} to {}", fmt_secs(lo), fmt_secs(hi)),
        };
        let times = if n > 1 { format!("{n} x ") } else { String::new() };
        let _ = writeln!(out, "{round:>5}  {:>8}  {at:>17}  {times}{what}", fmt_secs(planned));
    }
    out
}

/// One line of the table: the connections of one round planned at one
/// age with one result, their idle ages from the earliest to the latest.
struct Line {
    round: u32,
    planned: f64,
    span: Option<(f64, f64)>,
    what: &'static str,
    n: usize,
}

fn effective(r: &Report) -> String {
    let f = &r.finding;
    match (f.how, f.idle_timeout_seconds, f.upper_seconds) {
        (FailureMode::Fin | FailureMode::Rst, Some(t), _) => fmt_secs(t),
        (FailureMode::SilentDrop, _, Some(u)) => format!("{} to {}", fmt_secs(f.lower_seconds), fmt_secs(u)),
        _ => "unknown".to_owned(),
    }
}

//! `observer probe`: a path's idle timeout measured on demand, before any
//! request fails.
//!
//! Each round opens up to `--connections` connections as a pool does
//! ([`conn::First`]), leaves them idle and plans one TCP keep-alive probe
//! on each at an idle age ([`search`]). A hop that closes (FIN or RST) is
//! measured directly at its close; a hop that drops flows silently (a NAT,
//! a firewall) is bracketed between the largest age whose probe was
//! answered and the smallest whose probe was not, and the next round
//! bisects that bracket. A keep-alive probe carries no application byte, so
//! the server's application sees one request per connection at most.

pub mod announce;
pub mod conn;
pub mod declared;
pub mod search;
pub mod tls;

use std::{
    sync::{
        atomic::{AtomicBool, Ordering},
        mpsc, Arc,
    },
    time::{Duration, Instant},
};

use serde::Serialize;

use conn::{OpenError, Target};
use search::{FailureMode, Finding, Outcome, Probe, Search};

use crate::{
    diagnosis::key::{Netns, RowId},
    diagnosis::probed::{ProbeEvidence, PROBE_THREAD},
    kernel::event::Role,
};

/// The result of `observer probe`: its JSON (`--format json`).
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// As the user wrote it.
    pub destination: String,
    /// The address connected to.
    pub address: String,
    /// `tcp`, `tls`, `http`, `https`, `request` or `tls+request`.
    pub first_exchange: String,
    #[serde(flatten)]
    pub finding: Finding,
    pub elapsed_seconds: f64,
    /// Connections opened in all (each gives one verdict).
    pub connections: usize,
    pub rounds: u32,
    /// Stopped by Ctrl-C: what was known then.
    pub interrupted: bool,
    /// Every connection's planned age and what it showed.
    pub probes: Vec<Probe>,
    /// With `--path FILE`: the declared idle timeouts beside the measure.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<declared::Comparison>,
}

impl Report {
    /// The result as stored evidence of the row it measured: the address
    /// connected to, as a client, in the probe's network namespace
    /// (`netns`, its inode, which the daemon settles against the host's
    /// when it takes the result); `ts_unix_ns` is when it ended.
    #[must_use]
    pub fn evidence(&self, netns: Option<u32>, ts_unix_ns: u64) -> ProbeEvidence {
        ProbeEvidence {
            ts_unix_ns,
            id: RowId { destination: self.address.clone(), role: Role::Client, netns: Netns::from(netns) },
            target: self.destination.clone(),
            first_exchange: self.first_exchange.clone(),
            how: self.finding.how,
            idle_timeout_seconds: self.finding.idle_timeout_seconds,
            lower_seconds: self.finding.lower_seconds,
            upper_seconds: self.finding.upper_seconds,
            settled: self.finding.settled,
            connections: self.connections,
            elapsed_seconds: self.elapsed_seconds,
            interrupted: self.interrupted,
        }
    }

    /// Whether the result proves anything worth storing: a close, or an
    /// idle age the path kept.
    #[must_use]
    pub fn proves_anything(&self) -> bool {
        self.finding.how != FailureMode::None || self.finding.lower_seconds > 0.0
    }
}

/// What the measurement needs besides the target.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub up_to: f64,
    pub connections: usize,
    pub budget: Duration,
}

/// Why nothing could be measured.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("no connection of the first round could be used: {0}")]
    Unreachable(OpenError),
    /// Every connection opened but none gave a verdict (the socket failed
    /// otherwise): nothing is claimed, not even "nothing closed".
    #[error(
        "none of the first round's {0} connections gave a verdict (each failed after opening); nothing was measured"
    )]
    NoVerdict(usize),
}

/// What the command hears while it measures.
#[derive(Debug, Clone, Copy)]
pub enum Progress<'a> {
    /// A round starts with these planned ages.
    Round { round: u32, ages: &'a [f64] },
    /// A connection of the round gave its result.
    Result {
        round: u32,
        /// Results of this round so far, of its connections.
        done: usize,
        of: usize,
        /// What all results so far show.
        finding: &'a Finding,
        /// The round's last connection still worth waiting for ends
        /// about this long from now.
        round_ends_in: Duration,
        /// Of `--budget`.
        budget_left: Duration,
    },
}

/// Run rounds against `destination` (as the user wrote it) until the
/// search is done, the budget would be exceeded, or `stop` is set (Ctrl-C:
/// the report then holds what is known so far).
pub fn measure(
    destination: &str,
    target: &Target,
    limits: Limits,
    stop: &AtomicBool,
    progress: &mut dyn FnMut(Progress<'_>),
) -> Result<Report, ProbeError> {
    let started = Instant::now();
    let mut search = Search::default();
    let mut ages = search::first_round(limits.up_to, limits.connections);
    let mut round = 0;
    let mut opened = 0;
    loop {
        round += 1;
        progress(Progress::Round { round, ages: &ages });
        let mut on_result = |search: &Search, done: usize, pending_longest: f64, round_started: Instant| {
            let finding = search.finding();
            // A probe that leaves at its age is answered at once or ends
            // after KEEPALIVE_COUNT more seconds.
            let ends = Duration::from_secs_f64(pending_longest + 4.0).saturating_sub(round_started.elapsed());
            progress(Progress::Result {
                round,
                done,
                of: ages.len(),
                finding: &finding,
                round_ends_in: ends,
                budget_left: limits.budget.saturating_sub(started.elapsed()),
            });
        };
        let (results, first_error) = run_round(target, &ages, round, &mut search, stop, &mut on_result);
        opened += ages.len();
        if round == 1 && results == 0 && !stop.load(Ordering::Relaxed) {
            return Err(match first_error {
                Some(e) => ProbeError::Unreachable(e),
                None => ProbeError::NoVerdict(ages.len()),
            });
        }
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let Some(next) = search.next_round(limits.connections) else { break };
        let longest = Duration::from_secs_f64(next.iter().copied().fold(0.0, f64::max) + 5.0);
        if started.elapsed() + longest > limits.budget {
            break;
        }
        ages = next;
    }
    Ok(Report {
        destination: destination.to_owned(),
        address: target.addr.to_string(),
        first_exchange: target.exchange_name().to_owned(),
        finding: search.finding(),
        elapsed_seconds: started.elapsed().as_secs_f64(),
        connections: opened,
        rounds: round,
        interrupted: stop.load(Ordering::Relaxed),
        probes: search.probes().to_vec(),
        path: Vec::new(),
    })
}

/// One round: a thread per connection; a connection whose age is past
/// one already found dead is cancelled (its verdict could add nothing), and
/// all are when `stop` is set. `on_result` hears of each result.
/// Returns how many connections gave a verdict, and the first open error.
fn run_round(
    target: &Target,
    ages: &[f64],
    round: u32,
    search: &mut Search,
    stop: &AtomicBool,
    on_result: &mut dyn FnMut(&Search, usize, f64, Instant),
) -> (usize, Option<OpenError>) {
    let started = Instant::now();
    let (tx, rx) = mpsc::channel();
    let cancels: Vec<(f64, Arc<AtomicBool>)> = ages.iter().map(|&a| (a, Arc::new(AtomicBool::new(false)))).collect();
    std::thread::scope(|s| {
        for (age, cancel) in &cancels {
            let (tx, failed) = (tx.clone(), tx.clone());
            let (age, cancel) = (*age, Arc::clone(cancel));
            // Named: the kernel keeps the name on the socket, and a daemon
            // beside the probe leaves these connections out of its rows.
            let spawned = std::thread::Builder::new().name(PROBE_THREAD.to_owned()).spawn_scoped(s, move || {
                let result = conn::open(target).map(|c| conn::watch(c, age, &cancel));
                let _ = tx.send((age, result));
            });
            if let Err(e) = spawned {
                let _ = failed.send((age, Err(OpenError::Thread(e.to_string()))));
            }
        }
        drop(tx);
        let (mut verdicts, mut first_error, mut done) = (0, None, 0);
        let mut pending: Vec<f64> = ages.to_vec();
        loop {
            let (age, result) = match rx.recv_timeout(Duration::from_millis(100)) {
                Ok(got) => got,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let stopped = stop.load(Ordering::Relaxed);
                    let elapsed = started.elapsed().as_secs_f64();
                    for (a, cancel) in &cancels {
                        if stopped || !search.worth_waiting(*a, elapsed) {
                            cancel.store(true, Ordering::Relaxed);
                        }
                    }
                    continue;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => break,
            };
            let outcome = match result {
                Ok(outcome) => outcome,
                Err(e) => {
                    first_error.get_or_insert(e);
                    Outcome::Failed
                }
            };
            if !matches!(outcome, Outcome::Failed | Outcome::Cancelled) {
                verdicts += 1;
            }
            search.record(Probe { round, planned_seconds: age, outcome });
            let elapsed = started.elapsed().as_secs_f64();
            for (a, cancel) in &cancels {
                if !search.worth_waiting(*a, elapsed) {
                    cancel.store(true, Ordering::Relaxed);
                }
            }
            done += 1;
            if let Some(i) = pending.iter().position(|p| p.to_bits() == age.to_bits()) {
                pending.swap_remove(i);
            }
            let longest = pending.iter().copied().filter(|a| search.worth_waiting(*a, elapsed)).fold(0.0, f64::max);
            on_result(search, done, longest, started);
        }
        (verdicts, first_error)
    })
}

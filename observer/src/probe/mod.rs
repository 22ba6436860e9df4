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

mod command;
pub mod conn;
pub mod declared;
pub mod search;
mod tls;

use std::{
    sync::{atomic::AtomicBool, mpsc, Arc},
    time::{Duration, Instant},
};

use serde::Serialize;

pub use command::command;
use conn::{OpenError, Target};
use search::{Finding, Outcome, Probe, Search};

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
    /// Every connection's planned age and what it showed.
    pub probes: Vec<Probe>,
    /// With `--path FILE`: the declared idle timeouts beside the measure.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub path: Vec<declared::Comparison>,
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

/// Run rounds until the search is done or the budget would be exceeded;
/// `progress` hears of each round as it starts.
pub fn measure(target: &Target, limits: Limits, progress: &mut dyn FnMut(u32, &[f64])) -> Result<Report, ProbeError> {
    let started = Instant::now();
    let mut search = Search::default();
    let mut ages = search::first_round(limits.up_to, limits.connections);
    let mut round = 0;
    let mut opened = 0;
    loop {
        round += 1;
        progress(round, &ages);
        let (results, first_error) = run_round(target, &ages, round, &mut search);
        opened += ages.len();
        if round == 1 && results == 0 {
            return Err(match first_error {
                Some(e) => ProbeError::Unreachable(e),
                None => ProbeError::NoVerdict(ages.len()),
            });
        }
        let Some(next) = search.next_round(limits.connections) else { break };
        let longest = Duration::from_secs_f64(next.iter().copied().fold(0.0, f64::max) + 5.0);
        if started.elapsed() + longest > limits.budget {
            break;
        }
        ages = next;
    }
    Ok(Report {
        destination: String::new(),
        address: target.addr.to_string(),
        first_exchange: String::new(),
        finding: search.finding(),
        elapsed_seconds: started.elapsed().as_secs_f64(),
        connections: opened,
        rounds: round,
        probes: search.probes().to_vec(),
        path: Vec::new(),
    })
}

/// One round: a thread per connection; a connection whose age is past
/// one already found dead is cancelled (its verdict could add nothing).
/// Returns how many connections gave a verdict, and the first open error.
fn run_round(target: &Target, ages: &[f64], round: u32, search: &mut Search) -> (usize, Option<OpenError>) {
    let (tx, rx) = mpsc::channel();
    let cancels: Vec<(f64, Arc<AtomicBool>)> = ages.iter().map(|&a| (a, Arc::new(AtomicBool::new(false)))).collect();
    std::thread::scope(|s| {
        for (age, cancel) in &cancels {
            let tx = tx.clone();
            let (age, cancel) = (*age, Arc::clone(cancel));
            s.spawn(move || {
                let result = conn::open(target).map(|c| conn::watch(c, age, &cancel));
                let _ = tx.send((age, result));
            });
        }
        drop(tx);
        let (mut verdicts, mut first_error) = (0, None);
        for (age, result) in rx {
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
            for (a, cancel) in &cancels {
                if !search.worth_waiting(*a) {
                    cancel.store(true, std::sync::atomic::Ordering::Relaxed);
                }
            }
        }
        (verdicts, first_error)
    })
}

//! Bounded evidence keeping for one destination, for the whole window.
//!
//! What defines the estimates is kept exactly; what only adds weight is
//! summarised:
//! - every failure and peer idle close (`dead` evidence) is kept with its
//!   time, idle age and socket, up to [`MAX_DEAD`] (beyond that the oldest
//!   failure goes, never for a success);
//! - successful reuses are summarised per time slice (the window in
//!   [`SLICES`] parts) in bins an eighth of an octave wide that keep the
//!   count and the exact smallest and largest idle age, so the largest
//!   surviving idle age is exact and a bin is always placed at ages that
//!   were really observed;
//! - our idle closes, request deadlines and late reuses are kept with their
//!   times up to [`MAX_TIMED`] each;
//! - each socket's longest silent survival, up to [`MAX_FLOWS`] sockets
//!   (the least recently surviving leaves first): survivals of one flow
//!   are one draw of a path, which telling two paths apart needs;
//! - counts (reuses, failures, peer closes, restarts, idle-age buckets) are
//!   counters per slice and per minute, so they are exact and never evicted.
//!
//! Expiry is per slice: a slice leaves when its newest observation is older
//! than the window, so evidence stays at most one slice (window / 12) past
//! it. The last hour is the last 60 whole minutes plus the current one.
//! Memory is bounded by [`MAX_BYTES`] per destination.

use observer_common::is_h2_ping;

use crate::{
    diagnosis::table::FailureMode,
    kernel::event::{Body, How, Outcome, PeerClose, Reuse, SockEvent},
};

mod flows;
mod resets;
mod window;

use flows::Flow;
pub use resets::{ResetBy, ResetCounts, PATH_HOPS};
use window::{Bin, Minute, Slice, Timed};
pub use window::{Counts, Dead, Evidence};

/// Time slices of the window.
pub const SLICES: usize = 12;
/// Slices kept at most (epoch changes split a slice early; past this the
/// two oldest merge).
pub const MAX_SLICES: usize = SLICES + 4;
/// Alive bins per slice; past this a new age joins the nearest bin.
pub const MAX_BINS_PER_SLICE: usize = 64;
/// Dead observations (failed reuses, peer idle closes) kept exactly.
pub const MAX_DEAD: usize = 512;
/// Sockets whose longest silent survival is kept (see [`Evidence::flows`]).
pub const MAX_FLOWS: usize = 256;
/// Timed observations kept per kind (our idle closes, request deadlines,
/// late reuses).
pub const MAX_TIMED: usize = 128;
/// Upper edges (seconds) of the idle-age buckets of the low-traffic signature.
pub const IDLE_BUCKETS: &[f64] = &[
    1.0, 2.0, 5.0, 10.0, 15.0, 30.0, 45.0, 60.0, 75.0, 90.0, 120.0, 180.0, 240.0, 300.0, 350.0, 400.0, 600.0, 900.0,
    1200.0, 3600.0,
];
const N_BUCKETS: usize = IDLE_BUCKETS.len() + 1;
const MINUTE_NS: u64 = 60_000_000_000;
const TIMED_KINDS: usize = 4;

/// Memory one destination's evidence can hold, bytes (heap, at full caps).
pub const MAX_BYTES: usize = MAX_SLICES * (size_of::<Slice>() + MAX_BINS_PER_SLICE * size_of::<Bin>())
    + MAX_DEAD * size_of::<Dead>()
    + TIMED_KINDS * MAX_TIMED * size_of::<Timed>()
    + 64 * size_of::<Minute>()
    + MAX_FLOWS * size_of::<Flow>();

/// One observation, as the estimates see it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Observation {
    /// A reuse after `idle` s; `refreshed` when TCP keep-alive probes ran
    /// during the idle time; `after_stall` for a request written on a
    /// connection whose earlier reuse had stalled (a failure counted, but
    /// that first stall dates the death: no timeout evidence); `ping` for
    /// an answered exchange of exactly an HTTP/2 `PING`'s request bytes
    /// (`observer_common::is_h2_ping`: 17, or 38, 39 or 46 in one TLS record)
    /// (an HTTP/2 `PING`, a health check): it proves the path held that
    /// long like any reuse, and says the connection was kept alive by
    /// messages rather than used.
    Reuse {
        idle: f64,
        failed: Option<FailureMode>,
        refreshed: bool,
        after_stall: bool,
        after_goodbye: bool,
        ping: bool,
    },
    /// The peer closed an idle socket.
    PeerIdleClose { idle: f64, mode: FailureMode },
    /// The kernel killed an idle socket whose keep-alive probes went
    /// unanswered: the flow was dead after `silent` s without a packet
    /// (the first unanswered probe's silent age). An upper bound, never a
    /// point: the flow died at some time before.
    KeepaliveDeath { silent: f64 },
    /// Our side closed an idle socket on its own initiative.
    LocalIdleClose { idle: f64 },
    /// The peer closed or reset with our request outstanding.
    RequestAborted { elapsed: f64 },
    /// We closed with our request outstanding.
    RequestTimeout { elapsed: f64 },
    /// Server side: a client wrote `elapsed` s after we closed the
    /// connection idle at `idle`.
    LateReuse { idle: f64, elapsed: f64 },
    /// The pool closed a socket that had died idle without writing on it
    /// (counted; the peer close that killed it is the timeout evidence).
    DiscardedDead,
}

/// An observation with its time and socket.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Observed {
    pub ts_ns: u64,
    pub sock_id: u64,
    pub keepalive: bool,
    /// Keep-alive idle time, s (0 = unknown).
    pub keepalive_idle: f32,
    pub what: Observation,
    /// A reset ended it (a failed reuse, an idle close, an aborted
    /// request, each by RST): who sent it.
    pub reset: Option<ResetBy>,
}

/// The failure mode a failed reuse shows.
#[must_use]
fn failure_mode(r: &Reuse) -> FailureMode {
    match r.outcome {
        Outcome::Ok => FailureMode::None,
        // A reuse written on a socket the peer had reset (or the kernel had
        // timed out) while idle failed because of that.
        Outcome::Reset if r.failed_before_send => FailureMode::Rst,
        // (A timed-out one, like a stall, shows a silent drop.)
        Outcome::TimedOut | Outcome::Stall => FailureMode::SilentDrop,
        // A reuse written after the peer's FIN failed because of that FIN.
        Outcome::Eof => FailureMode::Fin,
        Outcome::Reset if r.safe_to_retry => FailureMode::Fin,
        Outcome::Reset => FailureMode::Rst,
    }
}

impl Observed {
    /// The observation an event carries, if it is evidence at all: the one
    /// classification of events, by kind.
    #[must_use]
    pub fn of(ev: &SockEvent) -> Option<Self> {
        let idle = ev.idle_seconds;
        let ka_idle = ev.keepalive_idle_seconds.unwrap_or(0.0);
        let what = match &ev.body {
            Body::Reuse(r) => Observation::Reuse {
                idle,
                failed: (r.outcome != Outcome::Ok).then(|| failure_mode(r)),
                // Unknown keep-alive time counts as refreshed: the weaker claim.
                refreshed: ev.keepalive && (ka_idle <= 0.0 || ka_idle < idle),
                after_stall: r.how == Some(How::AfterStall),
                after_goodbye: r.how == Some(How::AfterGoodbye),
                ping: r.outcome == Outcome::Ok && is_h2_ping(r.bytes),
            },
            Body::PeerCloseWhileIdle(PeerClose { how: Some(How::Timeout), .. }) => Observation::KeepaliveDeath {
                // The first unanswered probe went out one keep-alive idle
                // time after the last segment received, when that is known.
                silent: if ka_idle > 0.0 && ka_idle < idle { ka_idle } else { idle },
            },
            Body::PeerCloseWhileIdle(PeerClose { how, .. }) => Observation::PeerIdleClose {
                idle,
                mode: if *how == Some(How::Rst) { FailureMode::Rst } else { FailureMode::Fin },
            },
            Body::LocalClose(c) if c.is_pool_idle_close() => Observation::LocalIdleClose { idle },
            Body::RequestAborted(r) => Observation::RequestAborted { elapsed: r.elapsed_seconds },
            Body::RequestTimeout(r) => Observation::RequestTimeout { elapsed: r.elapsed_seconds },
            Body::LateReuse(l) => Observation::LateReuse { idle, elapsed: l.elapsed_seconds },
            Body::DiscardedDead(_) => Observation::DiscardedDead,
            Body::Established | Body::Closed | Body::LocalClose(_) | Body::ServerName(_) => return None,
        };
        let by_rst = match &ev.body {
            Body::Reuse(r) => r.outcome == Outcome::Reset,
            Body::PeerCloseWhileIdle(c) => c.how == Some(How::Rst),
            Body::RequestAborted(r) => r.how == Some(How::Rst),
            _ => false,
        };
        #[allow(clippy::cast_possible_truncation, reason = "keep-alive times are far below f32 precision limits")]
        Some(Self {
            ts_ns: ev.ts_unix_ns,
            sock_id: ev.sock_id,
            keepalive: ev.keepalive,
            keepalive_idle: ka_idle as f32,
            what,
            reset: by_rst.then(|| ResetBy::of(ev.reset)),
        })
    }

    /// When the socket last had activity before this observation.
    #[must_use]
    pub fn idle_since_ns(&self) -> u64 {
        let idle = match self.what {
            Observation::Reuse { idle, .. }
            | Observation::PeerIdleClose { idle, .. }
            | Observation::LocalIdleClose { idle }
            | Observation::KeepaliveDeath { silent: idle } => idle,
            Observation::RequestAborted { .. } | Observation::RequestTimeout { .. } | Observation::DiscardedDead => 0.0,
            Observation::LateReuse { idle, elapsed } => idle + elapsed,
        };
        self.ts_ns.saturating_sub(secs_to_ns(idle))
    }
}

#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss, reason = "idle ages are small and positive")]
fn secs_to_ns(s: f64) -> u64 {
    (s.max(0.0) * 1e9) as u64
}

#[cfg(test)]
mod tests;

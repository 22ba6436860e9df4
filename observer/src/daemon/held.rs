//! Events waiting for their owner, under `--cgroup`. An event whose
//! cgroup id the resolver is still looking for waits here, and every later
//! event waits behind it, so the sinks see events in the kernel's order and
//! `--cgroup` can tell whether each belongs. Bounded: at most [`MAX_HELD`]
//! events, none longer than [`MAX_HOLD`]; past either, the oldest goes on
//! with whatever is known of its owner. (Without `--cgroup` nothing waits:
//! evidence held in memory is what a `kill -9` loses.)

use std::{
    collections::VecDeque,
    time::{Duration, Instant},
};

use crate::{
    kernel::event::SockEvent,
    kernel::owner::{Lookup, Owner, Resolver},
};

/// Events held at most (about 6 MiB).
pub(crate) const MAX_HELD: usize = 16_384;
/// The longest an event waits for its owner: far more than a walk of
/// the largest tree takes (2 s between walks, then the walk).
pub(crate) const MAX_HOLD: Duration = Duration::from_secs(30);

/// An event let go, with whether its owner was still being looked for.
pub(crate) struct Released {
    pub(crate) event: SockEvent,
    /// The owner was not known when the wait ended (its event carries none).
    pub(crate) unresolved: bool,
}

/// The queue of events waiting for an owner.
#[derive(Default)]
pub(crate) struct Held {
    queue: VecDeque<(Instant, SockEvent)>,
}

impl Held {
    pub(crate) fn push(&mut self, ev: SockEvent) {
        self.queue.push_back((Instant::now(), ev));
    }

    pub(crate) fn len(&self) -> usize {
        self.queue.len()
    }

    /// The time (`ts_unix_ns`) of the oldest event waiting.
    pub(crate) fn oldest_ns(&self) -> Option<u64> {
        self.queue.front().map(|(_, ev)| ev.ts_unix_ns)
    }

    /// The next event that may go: the oldest, once its owner is known or
    /// cannot be, or when `all`, the queue is over its bound or the oldest
    /// has waited [`MAX_HOLD`]. `None` while the oldest must wait on.
    pub(crate) fn next(&mut self, owners: &Resolver, all: bool) -> Option<Released> {
        let (since, front) = self.queue.front()?;
        let (owner, unresolved) = match owners.lookup(front.cgroup_id, front.pid) {
            Lookup::Found(o) => (Some(Owner::clone(&o)), false),
            Lookup::Unknown => (None, false),
            Lookup::Pending if all || self.queue.len() > MAX_HELD || since.elapsed() >= MAX_HOLD => (None, true),
            Lookup::Pending => return None,
        };
        let (_, mut event) = self.queue.pop_front()?;
        event.owner = owner;
        Some(Released { event, unresolved })
    }
}

#[cfg(test)]
mod tests {
    use std::{os::unix::fs::MetadataExt as _, time::Instant};

    use super::{Duration, Held, Resolver, SockEvent};
    use crate::kernel::event::{EventKind, Role};

    fn event(cgroup_id: u64, idle: f64) -> SockEvent {
        let mut ev = SockEvent::new(
            0,
            EventKind::Reuse,
            Role::Client,
            "127.0.0.1:1".parse().unwrap(),
            "127.0.0.1:2".parse().unwrap(),
            idle,
        );
        ev.cgroup_id = cgroup_id;
        ev
    }

    /// Everything the queue lets go within `limit`, in order.
    fn released(held: &mut Held, owners: &Resolver, limit: Duration) -> Vec<(f64, Option<String>, bool)> {
        let (mut out, deadline) = (Vec::new(), Instant::now() + limit);
        while held.len() > 0 && Instant::now() < deadline {
            while let Some(r) = held.next(owners, false) {
                out.push((r.event.idle_seconds, r.event.owner.map(|o| o.cgroup), r.unresolved));
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        out
    }

    #[test]
    fn events_wait_in_order_behind_an_owner_being_looked_for() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("app.service")).unwrap();
        let app = std::fs::metadata(dir.path().join("app.service")).unwrap().ino();
        let owners = Resolver::new(Some(dir.path().to_owned()));
        let mut held = Held::default();
        held.push(event(app, 1.0));
        // No cgroup (a softirq's event): it needs no lookup, but it came
        // later, so it waits its turn.
        held.push(event(0, 2.0));
        assert!(held.next(&owners, false).is_none(), "the first event's owner is being looked for");
        let out = released(&mut held, &owners, Duration::from_secs(10));
        assert_eq!(out, vec![(1.0, Some("/app.service".to_owned()), false), (2.0, None, false)]);
    }

    #[test]
    fn a_wait_that_ends_unanswered_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let owners = Resolver::new(Some(dir.path().to_owned()));
        // One walk now; a cgroup made after it waits for the next, 2 s on.
        held_until_walked(&owners, std::fs::metadata(dir.path()).unwrap().ino());
        std::fs::create_dir(dir.path().join("late")).unwrap();
        let late = std::fs::metadata(dir.path().join("late")).unwrap().ino();
        let mut held = Held::default();
        held.push(event(late, 1.0));
        assert!(held.next(&owners, false).is_none());
        let r = held.next(&owners, true).expect("shutdown lets every event go");
        assert!(r.unresolved && r.event.owner.is_none());
        assert_eq!(held.len(), 0);
    }

    fn held_until_walked(owners: &Resolver, id: u64) {
        let mut held = Held::default();
        held.push(event(id, 0.0));
        assert_eq!(released(&mut held, owners, Duration::from_secs(10)).len(), 1);
        assert_eq!(owners.scans(), 1);
    }
}

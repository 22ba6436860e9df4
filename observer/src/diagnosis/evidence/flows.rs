//! Each socket's longest silent survival, bounded: a flow takes one path
//! for its life (ECMP and NAT hash its ports), so its survivals are one
//! draw of a path however many there are, and a flow that survived an age
//! is on a path that holds past it. Two paths' lower bound counts these
//! (`estimate::two_paths`).

use super::MAX_FLOWS;

#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Flow {
    pub(crate) sock_id: u64,
    /// The longest idle age it survived silently (in `epoch`).
    pub(crate) max_idle: f64,
    /// Its last survival: the least recent leaves first when the table is
    /// full, and the flow leaves the window with it.
    pub(crate) last_ns: u64,
    pub(crate) epoch: u32,
}

/// Up to [`MAX_FLOWS`] sockets, the least recently surviving leaving first
/// (should it survive again, it comes back as a new flow).
#[derive(Debug, Clone, Default)]
pub(crate) struct FlowTable {
    pub(crate) entries: Vec<Flow>,
}

impl FlowTable {
    /// `sock_id` survived `idle` s silently in `epoch`.
    pub(crate) fn survived(&mut self, sock_id: u64, idle: f64, ts_ns: u64, epoch: u32) {
        if let Some(f) = self.entries.iter_mut().find(|f| f.sock_id == sock_id) {
            f.max_idle = if f.epoch == epoch { f.max_idle.max(idle) } else { idle };
            f.last_ns = f.last_ns.max(ts_ns);
            f.epoch = epoch;
            return;
        }
        let flow = Flow { sock_id, max_idle: idle, last_ns: ts_ns, epoch };
        if self.entries.len() < MAX_FLOWS {
            self.entries.push(flow);
        } else if let Some(oldest) = self.entries.iter_mut().min_by_key(|f| f.last_ns) {
            *oldest = flow;
        }
    }

    /// Drop the flows whose last survival `old` says left the window.
    pub(crate) fn expire(&mut self, old: impl Fn(u64) -> bool) {
        self.entries.retain(|f| !old(f.last_ns));
    }

    /// The flows of `epoch`.
    pub(crate) fn of_epoch(&self, epoch: u32) -> impl Iterator<Item = &Flow> {
        self.entries.iter().filter(move |f| f.epoch == epoch)
    }

    pub(crate) fn bytes(&self) -> usize {
        self.entries.capacity() * size_of::<Flow>()
    }
}

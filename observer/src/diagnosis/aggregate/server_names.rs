//! The names clients used for each destination (TLS SNI, HTTP `Host`),
//! with how many connections used each, and the protocols their first
//! bytes showed (`http1`, `h2`): kept apart from the evidence, as a
//! connection names its destination long before any evidence arrives.
//!
//! Bounded: [`MAX_NAMES`] names per destination (a name past them is
//! dropped, and counted in the row's `server_names_dropped`), and names
//! for at most four times `max_destinations` destinations (the one seen
//! longest ago makes room). A name not seen for the window is forgotten.

use std::collections::BTreeMap;

use super::Aggregator;
use crate::{
    diagnosis::key::DestKey,
    diagnosis::table::ServerName,
    kernel::event::{FirstBytes, SockEvent},
    kernel::first_bytes::{Protocol, TlsVersion},
};

/// Distinct names kept per destination.
pub const MAX_NAMES: usize = 4;

/// One destination's names.
#[derive(Debug, Clone, Default)]
pub(crate) struct Names {
    /// Name -> (connections, last seen ns).
    pub(crate) seen: BTreeMap<String, (u64, u64)>,
    /// Connections whose name did not fit.
    pub(crate) dropped: u64,
    /// Protocol -> (connections, last seen ns); two values at most.
    pub(crate) protocols: BTreeMap<Protocol, (u64, u64)>,
    /// TLS version -> (connections, last seen ns); four values at most.
    pub(crate) tls: BTreeMap<TlsVersion, (u64, u64)>,
    pub(crate) last_ns: u64,
}

impl Names {
    /// The names, most used first (ties by name), with their counts.
    pub(crate) fn ranked(&self) -> Vec<ServerName> {
        let mut v: Vec<ServerName> =
            self.seen.iter().map(|(n, &(c, _))| ServerName { name: n.clone(), connections: c }).collect();
        v.sort_by(|a, b| b.connections.cmp(&a.connections).then_with(|| a.name.cmp(&b.name)));
        v
    }
}

impl Aggregator {
    /// Take a `server_name` event: true when its name or protocol is new
    /// for its row (first sighting, or first since it was forgotten), which
    /// is what the store keeps.
    pub(crate) fn note_name(&mut self, ev: &SockEvent, said: &FirstBytes) -> bool {
        let Some(key) = DestKey::of_event(ev, self.host_netns()) else { return false };
        if said.tells_nothing() {
            return false;
        }
        let now = self.latest_ns;
        if !self.names.contains_key(&key) && self.names.len() >= 4 * self.config.max_destinations.max(1) {
            if let Some(oldest) = self.names.iter().min_by_key(|(_, n)| n.last_ns).map(|(k, _)| *k) {
                self.names.remove(&oldest);
            }
        }
        let names = self.names.entry(key).or_default();
        names.last_ns = now;
        let mut fresh = false;
        if let Some(p) = said.protocol {
            let (count, last) = names.protocols.entry(p).or_insert((0, now));
            fresh = *count == 0;
            *count += 1;
            *last = now;
        }
        if let Some(v) = said.tls_version {
            let (count, last) = names.tls.entry(v).or_insert((0, now));
            fresh |= *count == 0;
            *count += 1;
            *last = now;
        }
        let Some(name) = said.server_name.as_deref() else { return fresh };
        if let Some((count, last)) = names.seen.get_mut(name) {
            *count += 1;
            *last = now;
            return fresh;
        }
        if names.seen.len() >= MAX_NAMES {
            names.dropped += 1;
            return fresh;
        }
        names.seen.insert(name.to_owned(), (1, now));
        true
    }

    /// Forget names not seen for the window.
    pub(crate) fn expire_names(&mut self, now: u64) {
        let window = self.config.window_ns;
        self.names.retain(|_, n| {
            n.seen.retain(|_, &mut (_, last)| now.saturating_sub(last) <= window);
            n.protocols.retain(|_, &mut (_, last)| now.saturating_sub(last) <= window);
            n.tls.retain(|_, &mut (_, last)| now.saturating_sub(last) <= window);
            !n.seen.is_empty() || !n.protocols.is_empty() || !n.tls.is_empty()
        });
    }

    /// The protocols a row's connections showed, most used first.
    pub(crate) fn protocols_of(&self, key: &DestKey) -> Vec<Protocol> {
        let Some(n) = self.names.get(key) else { return Vec::new() };
        let mut v: Vec<(Protocol, u64)> = n.protocols.iter().map(|(p, &(c, _))| (*p, c)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.into_iter().map(|(p, _)| p).collect()
    }

    /// The TLS versions a row's connections negotiated, newest first.
    pub(crate) fn tls_of(&self, key: &DestKey) -> Vec<TlsVersion> {
        self.names.get(key).map_or_else(Vec::new, |n| n.tls.keys().rev().copied().collect())
    }

    /// The names of a row's destination, most used first.
    pub(crate) fn names_of(&self, key: &DestKey) -> (Vec<ServerName>, u64) {
        self.names.get(key).map_or_else(|| (Vec::new(), 0), |n| (n.ranked(), n.dropped))
    }
}

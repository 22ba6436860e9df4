//! The partner's card: what we measured of their side, for the
//! integration notes, from the report's row and events (and, for every
//! address of their name, the window's `server_name` records).

use serde::Serialize;

use crate::{
    diagnosis::{aggregate::FailureMode, table::DestinationRow},
    kernel::event::{ResetFrom, SockEvent},
};

use super::Report;

/// The partner's card: what we measured of their side, in the fields
/// the integration notes need (seed 001: "not one of those five numbers
/// was in their public documentation"), built only from what was
/// measured; what TCP cannot show is asked, never filled in.
#[derive(Debug, Clone, Serialize)]
pub struct PartnerCard {
    /// The name our clients asked for (TLS SNI, HTTP `Host`); null: none seen.
    pub name: Option<String>,
    /// The path's effective idle timeout: the point where measured, else
    /// null (the interval is `idle_timeout_interval_seconds`).
    pub idle_timeout_seconds: Option<f64>,
    /// `[lower, upper]` the evidence proves (upper null: nothing failed).
    pub idle_timeout_interval_seconds: [Option<f64>; 2],
    /// How an idle connection ends: `fin`, `rst` or `silent_drop`; null
    /// while no reuse failed and no peer closed one idle.
    pub idle_close: Option<FailureMode>,
    /// Who sent the resets (`peer`, `path`, `local`), and how many hops
    /// closer than their server; null: no reset seen, or not told.
    pub reset_from: Option<ResetFrom>,
    pub reset_hops_closer: Option<u8>,
    /// Their request deadline where it was seen (they closed with our
    /// request outstanding); null otherwise, never a guess.
    pub request_deadline_seconds: Option<f64>,
    /// TLS versions we negotiated with them (`TLSv1.3`, ...), from our
    /// clients' second flights; empty: plain TCP or not told (asked in `ask`).
    pub tls_versions: Vec<String>,
    /// The addresses we reached them at: this report's first, then every
    /// other address the name was reached at in the window (at most 16).
    pub their_addresses: Vec<String>,
    /// Our source addresses toward them (what they must allow), at most 16.
    pub our_addresses: Vec<String>,
    /// What cannot be measured from TCP: questions for the partner.
    pub ask: Vec<String>,
}

/// Addresses the card lists at most, theirs and ours each.
const MAX_ADDRESSES: usize = 16;

impl PartnerCard {
    pub(super) fn of(row: &DestinationRow, destination: &str, ours: &[&SockEvent]) -> Self {
        let mut our_addresses: Vec<String> = ours.iter().map(|e| e.local.ip().to_string()).collect();
        our_addresses.sort();
        our_addresses.dedup();
        our_addresses.truncate(MAX_ADDRESSES);
        // The address our events reached (the destination as written may
        // be a name or carry a port).
        let their = ours.first().map_or_else(|| destination.to_owned(), |e| e.remote.ip().to_string());
        let idle_close = (row.failure_mode != FailureMode::None).then_some(row.failure_mode);
        let tls = if row.tls_versions.is_empty() {
            "TLS versions and cipher suites you accept, and when that changes"
        } else {
            "Cipher suites you accept, and when your TLS versions change (what we negotiated is listed)"
        };
        let mut ask: Vec<String> =
            [tls, "Maximum request and response body size", "Source address ranges you allow (ours are listed)"]
                .map(str::to_owned)
                .to_vec();
        if row.deadlines.peer_request_deadline_seconds.is_none() {
            ask.push("Request timeout at each hop (not seen: no request of ours was cut off)".to_owned());
        }
        if row.path.upper_seconds.is_none() {
            ask.push("Idle timeout of every hop (not measured yet: no idle connection failed)".to_owned());
        }
        Self {
            name: row.server_names.first().map(|n| n.name.clone()),
            idle_timeout_seconds: row.path.idle_timeout_seconds,
            idle_timeout_interval_seconds: [Some(row.path.lower_seconds), row.path.upper_seconds],
            idle_close,
            reset_from: row.resets.from,
            reset_hops_closer: row.resets.hops_closer,
            request_deadline_seconds: row.deadlines.peer_request_deadline_seconds,
            tls_versions: row.tls_versions.iter().map(|v| v.as_str().to_owned()).collect(),
            their_addresses: vec![their],
            our_addresses,
            ask,
        }
    }
}

/// Every address the card's name was reached at, from `events` beyond the
/// report's own (the store's or the recording's window): the addresses
/// of the `server_name` records that carry the name, the report's own
/// first. At most 16.
pub fn add_name_addresses(report: &mut Report, events: &[SockEvent]) {
    let Some(card) = report.partner_card.as_mut() else { return };
    let Some(name) = card.name.clone() else { return };
    for e in events {
        let said = e.as_server_name().and_then(|n| n.server_name.as_deref());
        let ip = e.remote.ip().to_string();
        if said == Some(name.as_str())
            && !card.their_addresses.contains(&ip)
            && card.their_addresses.len() < MAX_ADDRESSES
        {
            card.their_addresses.push(ip);
        }
    }
    if let Some(rest) = card.their_addresses.get_mut(1..) {
        rest.sort();
    }
}

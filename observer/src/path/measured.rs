//! `path check --observed`: each hop with an `address` against what the
//! daemon measured for it (the client row of the chosen namespace): idle
//! timeouts, the pools' margin in front of them, and deadlines.

use super::{cell, Hop, HopAddress, Limit, Report, Violation};
use crate::{
    diagnosis::aggregate::DestinationRow,
    diagnosis::estimate::POOL_FRACTION,
    diagnosis::table::{Select, SelectError},
    units::fmt_secs,
};

/// Declared and measured agree within 5% (at least 50 ms) of measurement
/// and timer slack.
pub(crate) fn close_enough(declared: f64, measured: f64) -> bool {
    (declared - measured).abs() <= (declared * 0.05).max(0.05)
}

/// Compare what hops with an `address` declare to what the daemon measured
/// for that destination (client role): the idle timeout, the pool margin
/// in front of it, the request deadline, and the observed deadline pair.
/// Rows are the client rows of each hop's address in namespace `netns`
/// (`None`: the only one seen; `host_netns` is the inode rows show as
/// null); a hop seen from several namespaces is noted, not compared.
pub fn compare_observed(report: &mut Report, rows: &[DestinationRow], netns: Option<u32>, host_netns: u32) {
    let select = Select { role: Some(crate::kernel::event::Role::Client), netns };
    compare_idle(report, rows, select, host_netns);
    compare_deadlines(report, rows, select, host_netns);
}

/// The row a hop's address names, and how messages name it: by `ip:port`,
/// or by a host name clients used for it (TLS SNI, HTTP `Host`) on that
/// port. `Err` is the note saying why nothing is compared.
fn pick_hop<'a>(
    addr: &HopAddress,
    rows: &'a [DestinationRow],
    select: Select,
    host_netns: u32,
) -> Result<(String, &'a DestinationRow), String> {
    match addr {
        HopAddress::Socket(a) => {
            let dest = a.to_string();
            match select.pick(rows, &dest, host_netns) {
                Ok(row) => Ok((dest, row)),
                Err(SelectError::NoRow { .. }) => Err(format!("no evidence measured for {dest} yet")),
                Err(e @ SelectError::Ambiguous { .. }) => Err(format!("not compared: {e}")),
            }
        }
        HopAddress::Name { host, port } => {
            let named: Vec<&DestinationRow> = rows
                .iter()
                .filter(|r| r.id.destination.rsplit(':').next() == Some(&port.to_string()))
                .filter(|r| r.server_names.iter().any(|n| n.name == *host))
                .collect();
            let addrs: std::collections::BTreeSet<&str> = named.iter().map(|r| r.id.destination.as_str()).collect();
            match addrs.len() {
                0 => Err(format!("no evidence measured yet for a destination clients reach as {host}:{port}")),
                1 => {
                    let dest = addrs.first().map(|d| (*d).to_owned()).unwrap_or_default();
                    let row = select.pick(rows, &dest, host_netns).map_err(|e| format!("not compared: {e}"))?;
                    Ok((format!("{host}:{port} ({dest})"), row))
                }
                _ => Err(format!(
                    "not compared: clients reach {host}:{port} at several addresses ({}); give one as `address`",
                    addrs.into_iter().collect::<Vec<_>>().join(", ")
                )),
            }
        }
    }
}

pub(crate) fn compare_deadlines(report: &mut Report, rows: &[DestinationRow], select: Select, host_netns: u32) {
    let mut found = Vec::new();
    for (i, hop) in report.hops.iter().enumerate() {
        let Some(addr) = &hop.address else { continue };
        let Ok((dest, row)) = pick_hop(addr, rows, select, host_netns) else { continue };
        if let (Some(Limit::Seconds(d)), Some(m)) = (hop.limits.deadline, row.deadlines.peer_request_deadline_seconds) {
            if !close_enough(d, m) {
                found.push(Violation {
                    rule: "observed_deadline",
                    hop: hop.name.clone(),
                    message: format!(
                        "{} is declared with a deadline of {}, but it aborted requests after {} ({dest})",
                        hop.name,
                        fmt_secs(d),
                        fmt_secs(m)
                    ),
                    fix: format!(
                        "correct the path file (or the hop's configuration): {} gives up after {}",
                        hop.name,
                        fmt_secs(m)
                    ),
                });
            }
        }
        if let (Some(ours), Some(peer)) =
            (row.deadlines.request_timeout_seconds, row.deadlines.peer_request_deadline_seconds)
        {
            if ours < peer && !close_enough(ours, peer) {
                let client = report.hops[..i].iter().rev().find(|h| h.client).map_or("our client", |h| h.name.as_str());
                found.push(Violation {
                    rule: "observed_deadline_staircase",
                    hop: hop.name.clone(),
                    message: format!(
                        "{client} gives up on requests to {dest} after {}, before {}'s own deadline of {}: {} keeps working for a response nobody will read",
                        fmt_secs(ours),
                        hop.name,
                        fmt_secs(peer),
                        hop.name
                    ),
                    fix: format!(
                        "lower {}'s deadline below {} (deadlines fall inward), or raise {client}'s request timeout above {}",
                        hop.name,
                        fmt_secs(ours),
                        fmt_secs(peer)
                    ),
                });
            }
        }
    }
    report.violations.extend(found);
}

pub(crate) fn compare_idle(report: &mut Report, rows: &[DestinationRow], select: Select, host_netns: u32) {
    let mut margin = Vec::new();
    for hop in &report.hops {
        let Some(addr) = &hop.address else { continue };
        let (dest, row) = match pick_hop(addr, rows, select, host_netns) {
            Ok(found) => found,
            Err(note) => {
                report.notes.push(format!("{}: {note}", hop.name));
                continue;
            }
        };
        let (lower, upper, point) = (row.path.lower_seconds, row.path.upper_seconds, row.path.idle_timeout_seconds);
        let measured = point.map_or_else(
            || format!("[{}, {}]", fmt_secs(lower), upper.map_or_else(|| "?".to_owned(), fmt_secs)),
            |p| format!("{} [{}, {}]", fmt_secs(p), fmt_secs(lower), upper.map_or_else(|| "?".to_owned(), fmt_secs)),
        );
        // The pools in front must keep the margin to what was measured:
        // flagged only when the measured timeout (the point, else the upper
        // bound it cannot exceed) proves the pool too long; the number comes
        // from proof (the point, else the largest idle age proven to survive).
        if let Some(bound) = point.or(upper) {
            // A pool the declared values already flag is not flagged twice.
            let flagged = |name: &str| {
                report.violations.iter().chain(margin.iter()).any(|v| v.hop == name && v.rule.ends_with("pool_margin"))
            };
            let late: Vec<&Hop> = report
                .hops
                .iter()
                .filter(|h| h.client && !flagged(&h.name))
                .filter(|h| {
                    h.limits.pool_idle().is_some_and(|p| p.secs().is_none_or(|p| p > bound * POOL_FRACTION + 1e-9))
                })
                .collect();
            let safe = point.or((lower > 0.0).then_some(lower));
            for pool in late {
                let fix = safe.map_or_else(
                    || format!(
                        "lower {}'s pool idle timeout below {} (reuses fail from there); no safe number yet: no reuse survived and no peer closes measured the timeout",
                        pool.name,
                        fmt_secs(bound)
                    ),
                    |m| format!(
                        "set {}'s pool idle timeout to at most {} (0.8 x the measured {}), with a maximum connection lifetime",
                        pool.name,
                        fmt_secs(m * POOL_FRACTION),
                        fmt_secs(m)
                    ),
                );
                margin.push(Violation {
                    rule: "observed_pool_margin",
                    hop: pool.name.clone(),
                    message: format!(
                        "{} keeps idle connections {}, but the path to {dest} was measured at {measured}",
                        pool.name,
                        cell(pool.limits.pool_idle())
                    ),
                    fix,
                });
            }
        }
        let Some(declared) = hop.limits.idle_timeout else { continue };
        // 5% (at least 50 ms) of measurement and timer slack.
        let agrees = match declared {
            Limit::Seconds(d) => {
                let slack = (d * 0.05).max(0.05);
                d + slack >= lower && upper.is_none_or(|u| d - slack <= u)
            }
            Limit::Unlimited => upper.is_none(),
        };
        if agrees {
            report.notes.push(format!("{}: declared {declared}, measured {measured} for {dest}: agree", hop.name));
        } else {
            report.violations.push(Violation {
                rule: "observed",
                hop: hop.name.clone(),
                message: format!(
                    "{} is declared with an idle timeout of {declared}, but observer measured {measured} for {dest}",
                    hop.name
                ),
                fix: format!(
                    "correct the path file (or the hop's configuration): the path to {dest} behaves as {measured}"
                ),
            });
        }
    }
    report.violations.extend(margin);
}

//! What the report says in words for the partner: the failure in one
//! sentence, the questions to ask them with what we measured beside each,
//! and the row's further findings (the probe's measurement among them).

use super::{utc, Question};
use crate::{
    diagnosis::aggregate::{DestinationRow, FailureMode},
    kernel::event::ResetFrom,
    units::fmt_secs,
};

pub(super) fn failure_text(mode: FailureMode, row: &DestinationRow) -> String {
    let (t, about) = match (row.path.idle_timeout_seconds, row.path.upper_seconds) {
        (Some(p), _) => (fmt_secs(p), "about "),
        (None, Some(u)) => (format!("between {} and {}", fmt_secs(row.path.lower_seconds), fmt_secs(u)), ""),
        (None, None) => ("an unknown time".to_owned(), ""),
    };
    match mode {
        FailureMode::Fin => format!("the hop closes idle connections with FIN after {about}{t}"),
        FailureMode::Rst => format!("the hop resets connections reused after {about}{t} of idle time"),
        FailureMode::SilentDrop => {
            format!("the path silently drops idle flows after {about}{t}; a reused connection stalls until the client gives up")
        }
        FailureMode::None => "no failed reuse observed".to_owned(),
    }
}

pub(super) fn questions(row: &DestinationRow, text: &str) -> Vec<Question> {
    let q = |topic: &str, question: &str, measured: String| Question {
        topic: topic.to_owned(),
        question: question.to_owned(),
        what_we_measured: measured,
    };
    let mut asked = vec![
        q(
            "idle timeout",
            "What is the idle timeout of every hop on your side (load balancer, proxies, NAT, firewall, servers), and does it close with FIN, RST or silently?",
            format!(
                "{text}; interval [{}, {}] from {} surviving and {} failing reuses",
                fmt_secs(row.path.lower_seconds),
                row.path.upper_seconds.map_or_else(|| "?".into(), fmt_secs),
                row.path.lower_evidence,
                row.path.upper_evidence
            ),
        ),
        q(
            "request timeout",
            "How long do you wait for a request before giving up, at each hop?",
            match (row.deadlines.peer_request_deadline_seconds, row.deadlines.request_timeout_seconds) {
                (None, None) => "no deadline observed: no request was aborted or timed out in the window".into(),
                (p, o) => format!(
                    "your side aborted requests after {}; ours gives up after {}",
                    p.map_or_else(|| "-".into(), fmt_secs),
                    o.map_or_else(|| "-".into(), fmt_secs)
                ),
            },
        ),
        q("maximum body size", "What is the largest request and response body you accept?", "not measured".into()),
        q("TLS versions", "Which TLS versions and cipher suites do you accept, and when will that change?", "not measured".into()),
        q("source address ranges", "Which source address ranges do you allow, and which addresses do you connect from?", format!("we connect to {}", row.id.destination)),
    ];
    // Who to ask follows from who sent the resets.
    if let Some(words) = row.resets_in_words() {
        let question = match row.resets.from {
            Some(ResetFrom::Path) => Some(
                "Which device sits in front of your servers (firewall, NAT, load balancer), what is its idle timeout for TCP flows, and does it answer a forgotten flow with RST?",
            ),
            Some(ResetFrom::Peer) => Some("What closes idle connections on your servers (keep-alive or idle timeout), and why with RST rather than FIN?"),
            // This host's own stack: a question for us, not the partner.
            Some(ResetFrom::Local) | None => None,
        };
        if let Some(question) = question {
            asked.insert(1, q("who resets", question, words));
        }
    }
    asked
}

/// The row's findings beyond the interval, as report lines.
pub(super) fn findings(row: &DestinationRow) -> Vec<(String, String)> {
    let mut f = Vec::new();
    let mut add = |k: &str, v: String| f.push((k.to_owned(), v));
    if let Some(e) = row.judgement.evidence {
        add("The verdict rests on", e.as_str().to_owned());
    }
    if row.path.lower_basis == Some(crate::diagnosis::aggregate::LowerBasis::Keepalive) {
        add(
            "Lower bound",
            "proven only by sockets whose TCP keep-alive probes ran while idle: it holds for proxies, not for NAT or conntrack".into(),
        );
    }
    if let Some(p) = &row.path.probe {
        add(
            "Measured by observer probe",
            format!(
                "{} ({}, first exchange {}, {} connections in {}, {}){}",
                p.summary(),
                p.target,
                p.first_exchange,
                p.connections,
                fmt_secs(p.elapsed_seconds),
                utc(p.ts_unix_ns),
                if row.path.probe_used {
                    "; the estimate above rests on it"
                } else {
                    "; not used: the passive evidence proves as much, or contradicts it"
                }
            ),
        );
    }
    if row.path.mixed_paths.len() > 1 {
        let parts: Vec<String> = row
            .path
            .mixed_paths
            .iter()
            .map(|p| {
                if p.is_silent() {
                    format!("a silent drop in {} ({:.0}% of the flows)", p.describe(" s"), p.share * 100.0)
                } else {
                    format!("{} ({:.0}% of peer idle closes)", fmt_secs(p.idle_timeout_seconds), p.share * 100.0)
                }
            })
            .collect();
        add("Several idle timeouts behind this address (mixed paths)", parts.join(", "));
    }
    if let Some(words) = row.resets_in_words() {
        let timeout = row.path.idle_timeout_seconds.or(row.path.upper_seconds);
        let forgets = match (row.resets.from, timeout) {
            (Some(ResetFrom::Path), Some(t)) => {
                format!(": it forgets idle flows at about {}", fmt_secs(t))
            }
            _ => String::new(),
        };
        add("Who sent the resets", format!("{words}{forgets}"));
    }
    if row.counts.peer_restarts > 0 {
        add(
            "Peer restarts",
            format!(
                "{} in the window; {} failed reuses they explain are not counted as timeout evidence",
                row.counts.peer_restarts, row.counts.restart_failures
            ),
        );
    }
    if row.counts.failures_after_goodbye > 0 {
        add(
            "Requests written after the server's goodbye",
            format!(
                "{} failed reuses were written while the server's GOAWAY or close_notify waited unread: the client did not honour the drain signal",
                row.counts.failures_after_goodbye
            ),
        );
    }
    if let Some(p) = row.deadlines.peer_request_deadline_seconds {
        add("Your request deadline (requests you aborted)", fmt_secs(p));
    }
    if let Some(o) = row.deadlines.request_timeout_seconds {
        add("Our request timeout (requests we gave up on)", fmt_secs(o));
    }
    if let Some(t) = row.server.server_idle_timeout_seconds {
        add("Our idle timeout toward clients", fmt_secs(t));
    }
    if row.server.late_reuses > 0 {
        add("Clients writing on connections we had closed idle", row.server.late_reuses.to_string());
    }
    if let Some(m) = row.server.client_max_reuse_idle_seconds {
        add("Longest idle age after which a client reused a connection", fmt_secs(m));
    }
    if let Some(r) = row.judgement.recommended_server_idle_timeout_seconds {
        add("Or raise our idle timeout to at least", fmt_secs(r));
    }
    f
}

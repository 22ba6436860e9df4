//! The report as Markdown (plots as tables).

use std::fmt::Write as _;

use super::{fmt_secs, opt_secs, opt_time, utc, Report};

/// A value safe inside a Markdown table cell: `|` escaped, control
/// characters shown as escapes.
fn cell(s: &str) -> String {
    crate::kernel::event::printable(s).replace('|', "\\|")
}

/// Markdown: the same content, plots as tables.
#[must_use]
#[allow(clippy::too_many_lines, reason = "the report's sections one after another")]
pub fn markdown(r: &Report) -> String {
    let s = &r.summary;
    let o = &r.our_side;
    let mut m = String::new();
    let _ = writeln!(m, "# Idle timeout evidence for `{}`\n", r.headline);
    let _ = writeln!(
        m,
        "Generated {} by observer from kernel observations of every TCP socket to `{}` ({}), {} to {}.\n",
        utc(r.generated_unix_ns),
        r.destination,
        super::side(r),
        utc(r.window_start_unix_ns),
        utc(r.window_end_unix_ns)
    );
    let _ = writeln!(m, "## Summary\n\n**{}.**\n", s.failure_mode_text);
    let _ = writeln!(m, "| | |\n|---|---|");
    let _ = writeln!(
        m,
        "| Effective path idle timeout | {} (interval [{}, {}]) |",
        opt_secs(s.path_idle_timeout_seconds),
        fmt_secs(s.path_idle_timeout_lower_seconds),
        opt_secs(s.path_idle_timeout_upper_seconds)
    );
    let _ = writeln!(m, "| Evidence | {} reuses survived up to {}; {} observations failed from {}; {} peer closes in the point cluster |", s.lower_evidence, fmt_secs(s.path_idle_timeout_lower_seconds), s.upper_evidence, opt_secs(s.path_idle_timeout_upper_seconds), s.point_evidence);
    let _ = writeln!(m, "| Failure mode | {} |", s.failure_mode.as_str());
    let _ = writeln!(
        m,
        "| Reuses / failed reuses / peer idle closes | {} / {} / {} |\n| Failed before a byte was sent (the socket was already reset or timed out) | {} |\n| Dead sockets the pool discarded unwritten | {} |",
        s.reuses, s.failures, s.peer_idle_closes, s.failures_before_send, s.discarded_dead
    );
    let _ = writeln!(
        m,
        "| First failure | {} |\n| Last failure | {} |\n",
        opt_time(s.first_failure_unix_ns),
        opt_time(s.last_failure_unix_ns)
    );
    let _ = writeln!(m, "## Our side\n\n| | |\n|---|---|");
    let _ = writeln!(m, "| Pool idle timeout observed | {} |", opt_secs(o.pool_idle_timeout_seconds));
    let _ = writeln!(
        m,
        "| Longest idle age at which our pool reused a socket | {} |",
        opt_secs(o.pool_max_reuse_idle_seconds)
    );
    let procs: Vec<String> = o.process_labels().iter().map(|p| cell(p)).collect();
    let _ = writeln!(m, "| Processes talking to the destination | {} |", procs.join(", "));
    let _ = writeln!(m, "| Protocol | {} |", o.protocols_text());
    let _ = writeln!(m, "| Verdict | {} |", o.verdict);
    let _ = writeln!(
        m,
        "| Recommended pool idle timeout | {} (0.8 x the path's idle timeout) |",
        opt_secs(o.recommended_pool_idle_timeout_seconds)
    );
    let _ =
        writeln!(m, "| Recommended maximum connection lifetime | {} |", opt_secs(o.recommended_max_lifetime_seconds));
    let _ = writeln!(
        m,
        "| Safe retry | {} |\n\n{}\n",
        if o.safe_retry_rule {
            "retry once on a fresh connection only when no request byte reached a live peer (safe_to_retry)"
        } else {
            "no retry rule"
        },
        o.recommendation
    );
    if !o.fix_settings.is_empty() {
        let _ = writeln!(m, "### The fix in the client's terms\n\n| client | setting | default | what to do | finding |\n|---|---|---|---|---|");
        for f in &o.fix_settings {
            let _ = writeln!(
                m,
                "| {} | `{}` | {} | {} | {} |",
                f.client,
                f.setting,
                f.default_seconds.map_or_else(|| "none".to_owned(), fmt_secs),
                f.advice,
                f.finding.as_deref().unwrap_or("")
            );
        }
        m.push('\n');
    }
    if !r.findings.is_empty() {
        let _ = writeln!(m, "### Further findings\n\n| | |\n|---|---|");
        for (k, v) in &r.findings {
            let _ = writeln!(m, "| {k} | {v} |");
        }
        m.push('\n');
    }
    let _ = writeln!(m, "## Plots\n\n### Failure probability against idle age at reuse\n\nThe step where failures begin is the timeout.\n\n| idle age (s) | reuses | failed | failure probability |\n|---|---|---|---|");
    for b in &r.failure_probability {
        let _ = writeln!(
            m,
            "| {:.1}-{:.1} | {} | {} | {} |",
            b.idle_from_seconds,
            b.idle_to_seconds,
            b.reuses,
            b.failures,
            b.probability.map_or_else(|| "-".to_owned(), |p| format!("{:.0}%", p * 100.0))
        );
    }
    let _ = writeln!(m, "\n### Failures over time beside request volume\n\n| from (UTC) | reuses | new connections | failed reuses |\n|---|---|---|---|");
    for b in &r.timeline {
        let _ = writeln!(m, "| {} | {} | {} | {} |", utc(b.start_unix_ns), b.reuses, b.new_connections, b.failures);
    }
    let _ = writeln!(m, "\n## Sample failures\n\n{} failed reuses in total; shown: {}.\n\n| time (UTC) | local | remote | process | idle age | outcome | retransmits | safe_to_retry |\n|---|---|---|---|---|---|---|---|", r.samples.total_failures, r.samples.method);
    for x in &r.samples.rows {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} ({}) | {:.3} s | {} | {} | {} |",
            x.time_utc,
            x.local,
            x.remote,
            cell(&x.process),
            x.pid,
            x.idle_seconds,
            if x.failed_before_send { format!("{}, failed before send", x.outcome) } else { x.outcome.clone() },
            x.retransmits,
            x.safe_to_retry
        );
    }
    let _ =
        writeln!(m, "\n## Questions for the partner\n\n| topic | question | what we already measured |\n|---|---|---|");
    for q in &r.questions {
        let _ = writeln!(m, "| {} | {} | {} |", q.topic, q.question, q.what_we_measured);
    }
    if !r.changes.is_empty() {
        let _ = writeln!(m, "\n## Changes of the estimate\n");
        for c in &r.changes {
            let _ = writeln!(
                m,
                "- {}: [{}, {}] became [{}, {}]",
                utc(c.ts_unix_ns),
                opt_secs(c.before_lower_seconds),
                opt_secs(c.before_upper_seconds),
                opt_secs(c.after_lower_seconds),
                opt_secs(c.after_upper_seconds)
            );
        }
    }
    m
}

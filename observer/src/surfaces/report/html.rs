//! The report as one self-contained HTML page.

use std::fmt::Write as _;

use super::svg::{probability_svg, timeline_svg};
use super::{esc, fmt_secs, opt_secs, opt_time, utc, Report};

/// HTML: self-contained, no scripts, no external assets.
#[must_use]
#[allow(clippy::too_many_lines, reason = "the report's sections one after another")]
pub fn html(r: &Report) -> String {
    let s = &r.summary;
    let o = &r.our_side;
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Idle timeout evidence: {d}</title><style>
body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}}
table{{border-collapse:collapse;margin:1rem 0}}td,th{{border:1px solid #ccc;padding:.3rem .6rem;text-align:left;font-size:.9rem}}
th{{background:#f3f3f3}}.big{{font-size:1.3rem}}.bad{{color:#c0392b}}code{{background:#f6f6f6;padding:0 .2rem}}
</style></head><body>
<h1>Idle timeout evidence for <code>{h}</code></h1>
<p>Generated {gen} by observer from kernel observations of every TCP socket to <code>{d}</code> ({role}), {ws} to {we}.</p>
<h2 id="summary">Summary</h2>
<p class="big">{text}.</p>
<table><tr><th>Effective path idle timeout</th><td>{point} (interval [{lo}, {up}])</td></tr>
<tr><th>Evidence</th><td>{le} reuses survived up to {lo}; {ue} observations failed from {up}; {pe} peer closes in the point cluster</td></tr>
<tr><th>Failure mode</th><td>{mode}</td></tr>
<tr><th>Reuses / failed reuses / peer idle closes</th><td>{reuses} / {failures} / {pcs}</td></tr>
<tr><th>Failed before a byte was sent (the socket was already reset or timed out)</th><td>{fbs}</td></tr>
<tr><th>Dead sockets the pool discarded unwritten</th><td>{dd}</td></tr>
<tr><th>First failure</th><td>{ff}</td></tr><tr><th>Last failure</th><td>{lf}</td></tr></table>
"#,
        d = esc(&r.destination),
        h = esc(&r.headline),
        gen = utc(r.generated_unix_ns),
        role = esc(&super::side(r)),
        ws = utc(r.window_start_unix_ns),
        we = utc(r.window_end_unix_ns),
        text = esc(&s.failure_mode_text),
        point = opt_secs(s.path_idle_timeout_seconds),
        lo = fmt_secs(s.path_idle_timeout_lower_seconds),
        up = opt_secs(s.path_idle_timeout_upper_seconds),
        le = s.lower_evidence,
        ue = s.upper_evidence,
        pe = s.point_evidence,
        mode = s.failure_mode.as_str(),
        reuses = s.reuses,
        failures = s.failures,
        pcs = s.peer_idle_closes,
        fbs = s.failures_before_send,
        dd = s.discarded_dead,
        ff = opt_time(s.first_failure_unix_ns),
        lf = opt_time(s.last_failure_unix_ns),
    );
    let _ = write!(
        h,
        r#"<h2 id="our-side">Our side</h2><table>
<tr><th>Pool idle timeout observed</th><td>{pool}</td></tr>
<tr><th>Longest idle age at which our pool reused a socket</th><td>{maxr}</td></tr>
<tr><th>Processes talking to the destination</th><td>{procs}</td></tr>
<tr><th>Protocol</th><td>{protocols}</td></tr>
<tr><th>Verdict</th><td class="{cls}">{verdict}</td></tr>
<tr><th>Recommended pool idle timeout</th><td>{rec} (0.8 x the path's idle timeout)</td></tr>
<tr><th>Recommended maximum connection lifetime</th><td>{life}</td></tr>
<tr><th>Safe retry</th><td>{retry}</td></tr></table>
<p>{recommendation}</p>
{fixes}{findings}"#,
        pool = opt_secs(o.pool_idle_timeout_seconds),
        maxr = opt_secs(o.pool_max_reuse_idle_seconds),
        procs = esc(&o.process_labels().join(", ")),
        protocols = esc(&o.protocols_text()),
        cls = if o.verdict.ends_with("mismatch") { "bad" } else { "" },
        verdict = esc(&o.verdict),
        rec = opt_secs(o.recommended_pool_idle_timeout_seconds),
        life = opt_secs(o.recommended_max_lifetime_seconds),
        retry = if o.safe_retry_rule {
            "retry once on a fresh connection only when no request byte reached a live peer (the peer's FIN arrived before the write: safe_to_retry)"
        } else {
            "no retry rule: a stall or a reset after the write may have reached the server"
        },
        recommendation = esc(&o.recommendation),
        fixes = if o.fix_settings.is_empty() {
            String::new()
        } else {
            let rows = o.fix_settings.iter().fold(String::new(), |mut t, f| {
                let _ = write!(
                    t,
                    "<tr><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td><td class=\"bad\">{}</td></tr>",
                    esc(&f.client),
                    esc(&f.setting),
                    f.default_seconds.map_or_else(|| "none".to_owned(), fmt_secs),
                    esc(&f.advice),
                    esc(f.finding.as_deref().unwrap_or(""))
                );
                t
            });
            format!("<h3>The fix in the client's terms</h3><table><tr><th>client</th><th>setting</th><th>default</th><th>what to do</th><th>finding</th></tr>{rows}</table>\n")
        },
        findings = if r.findings.is_empty() {
            String::new()
        } else {
            let rows = r.findings.iter().fold(String::new(), |mut t, (k, v)| {
                let _ = write!(t, "<tr><th>{}</th><td>{}</td></tr>", esc(k), esc(v));
                t
            });
            format!("<h3>Further findings</h3><table>{rows}</table>\n")
        },
    );
    let _ = write!(
        h,
        r#"<h2 id="plots">Plots</h2><figure>{}<figcaption>The step where failures begin is the timeout.</figcaption></figure><figure>{}<figcaption>Failures come from reuse after idle, not from load: they appear when traffic is low.</figcaption></figure>"#,
        probability_svg(r),
        timeline_svg(r)
    );
    let _ = write!(
        h,
        r#"<h2 id="samples">Sample failures</h2><p>{} failed reuses in total; shown: {}.</p><table><tr><th>time (UTC)</th><th>local</th><th>remote</th><th>process</th><th>idle age</th><th>outcome</th><th>retransmits</th><th>safe_to_retry</th></tr>"#,
        r.samples.total_failures,
        esc(&r.samples.method)
    );
    for x in &r.samples.rows {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{} ({})</td><td>{:.3} s</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&x.time_utc),
            esc(&x.local),
            esc(&x.remote),
            esc(&x.process),
            x.pid,
            x.idle_seconds,
            esc(&if x.failed_before_send { format!("{}, failed before send", x.outcome) } else { x.outcome.clone() }),
            x.retransmits,
            x.safe_to_retry
        );
    }
    h.push_str("</table><h2 id=\"questions\">Questions for the partner</h2><table><tr><th>topic</th><th>question</th><th>what we already measured</th></tr>");
    for q in &r.questions {
        let _ = write!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&q.topic),
            esc(&q.question),
            esc(&q.what_we_measured)
        );
    }
    h.push_str("</table>");
    if !r.changes.is_empty() {
        h.push_str("<h2 id=\"changes\">Changes of the estimate</h2><ul>");
        for c in &r.changes {
            let _ = write!(
                h,
                "<li>{}: [{}, {}] became [{}, {}]</li>",
                utc(c.ts_unix_ns),
                opt_secs(c.before_lower_seconds),
                opt_secs(c.before_upper_seconds),
                opt_secs(c.after_lower_seconds),
                opt_secs(c.after_upper_seconds)
            );
        }
        h.push_str("</ul>");
    }
    h.push_str("</body></html>\n");
    h
}

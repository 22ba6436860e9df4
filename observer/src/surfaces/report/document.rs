//! The report as one document: its sections, facts, tables, plots and
//! lists in words, in no format. [`super::markdown`] and [`super::html`]
//! only walk it (JSON is the [`Report`] itself), so a wording lives in one
//! place and the two formats cannot drift apart.

use super::{
    fmt_secs, opt_secs, opt_time,
    svg::{probability_svg, timeline_svg},
    utc, Report,
};

/// The whole report.
pub(super) struct Document {
    /// What the report is about: `name (address)` or the address.
    pub headline: String,
    /// The line under the title: who made it from what, and when.
    pub intro: Vec<Span>,
    pub sections: Vec<Section>,
}

/// A piece of running text.
pub(super) enum Span {
    Text(String),
    /// An address or a name, shown as code.
    Code(String),
}

/// A section (level 2) or a part of one (level 3).
pub(super) struct Section {
    pub level: u8,
    /// The HTML anchor of a top section.
    pub id: Option<&'static str>,
    pub title: &'static str,
    pub blocks: Vec<Block>,
}

pub(super) enum Block {
    /// The one sentence that sums the section up, emphasised.
    Lead(String),
    Para(String),
    /// Name and value, one per row.
    Facts(Vec<Fact>),
    Table(Table),
    /// An SVG plot in HTML; its table (under the title) in Markdown.
    Plot {
        title: &'static str,
        caption: &'static str,
        svg: String,
        table: Table,
    },
    List(Vec<String>),
}

pub(super) struct Fact {
    pub name: String,
    pub value: String,
    /// Marked as a problem (a mismatch verdict).
    pub bad: bool,
}

pub(super) struct Table {
    pub head: Vec<&'static str>,
    pub rows: Vec<Vec<Cell>>,
}

pub(super) struct Cell {
    pub text: String,
    /// A setting's name, shown as code.
    pub code: bool,
    /// Marked as a problem (a finding against a default).
    pub bad: bool,
}

impl Cell {
    fn plain(text: impl Into<String>) -> Self {
        Self { text: text.into(), code: false, bad: false }
    }
}

fn fact(name: &str, value: impl Into<String>) -> Fact {
    Fact { name: name.to_owned(), value: value.into(), bad: false }
}

fn row(cells: impl IntoIterator<Item = String>) -> Vec<Cell> {
    cells.into_iter().map(Cell::plain).collect()
}

fn section(level: u8, id: Option<&'static str>, title: &'static str, blocks: Vec<Block>) -> Section {
    Section { level, id, title, blocks }
}

/// The report in words.
#[must_use]
pub(super) fn document(r: &Report) -> Document {
    let mut sections = vec![summary(r)];
    sections.extend(partner_card(r));
    sections.extend(our_side(r));
    sections.push(plots(r));
    sections.push(samples(r));
    sections.push(questions(r));
    if !r.changes.is_empty() {
        let items = r
            .changes
            .iter()
            .map(|c| {
                format!(
                    "{}: [{}, {}] became [{}, {}]",
                    utc(c.ts_unix_ns),
                    opt_secs(c.before_lower_seconds),
                    opt_secs(c.before_upper_seconds),
                    opt_secs(c.after_lower_seconds),
                    opt_secs(c.after_upper_seconds)
                )
            })
            .collect();
        sections.push(section(2, Some("changes"), "Changes of the estimate", vec![Block::List(items)]));
    }
    Document {
        headline: r.headline.clone(),
        intro: vec![
            Span::Text(format!(
                "Generated {} by observer from kernel observations of every TCP socket to ",
                utc(r.generated_unix_ns)
            )),
            Span::Code(r.destination.clone()),
            Span::Text(format!(
                " ({}), {} to {}.",
                super::side(r),
                utc(r.window_start_unix_ns),
                utc(r.window_end_unix_ns)
            )),
        ],
        sections,
    }
}

fn summary(r: &Report) -> Section {
    let s = &r.summary;
    let lower = fmt_secs(s.path.lower_seconds);
    let upper = opt_secs(s.path.upper_seconds);
    let facts = vec![
        fact(
            "Effective path idle timeout",
            format!("{} (interval [{lower}, {upper}])", opt_secs(s.path.idle_timeout_seconds)),
        ),
        fact(
            "Evidence",
            format!(
                "{} reuses survived up to {lower}; {} observations failed from {upper}; {} peer closes in the point cluster",
                s.path.lower_evidence, s.path.upper_evidence, s.path.point_evidence
            ),
        ),
        fact("Failure mode", s.failure_mode.as_str()),
        fact(
            "Reuses / failed reuses / peer idle closes",
            format!("{} / {} / {}", s.reuses, s.failures, s.peer_idle_closes),
        ),
        fact(
            "Failed before a byte was sent (the socket was already reset or timed out)",
            s.failures_before_send.to_string(),
        ),
        fact("Dead sockets the pool discarded unwritten", s.discarded_dead.to_string()),
        fact("Who sent the resets", s.reset_text.clone().unwrap_or_else(|| "no reset seen".to_owned())),
        fact("First failure", opt_time(s.first_failure_unix_ns)),
        fact("Last failure", opt_time(s.last_failure_unix_ns)),
    ];
    section(2, Some("summary"), "Summary", vec![Block::Lead(format!("{}.", s.failure_mode_text)), Block::Facts(facts)])
}

fn our_side(r: &Report) -> Vec<Section> {
    let o = &r.our_side;
    let facts = vec![
        fact("Pool idle timeout observed", opt_secs(o.pool.idle_timeout_seconds)),
        fact("Longest idle age at which our pool reused a socket", opt_secs(o.pool.max_reuse_idle_seconds)),
        fact("Processes talking to the destination", o.process_labels().join(", ")),
        fact("Protocol", o.protocols_text()),
        Fact {
            name: "Verdict".to_owned(),
            value: o.judgement.verdict.as_str().to_owned(),
            bad: o.judgement.verdict.is_mismatch(),
        },
        fact(
            "Recommended pool idle timeout",
            format!("{} (0.8 x the path's idle timeout)", opt_secs(o.judgement.recommended_pool_idle_timeout_seconds)),
        ),
        fact("Recommended maximum connection lifetime", opt_secs(o.judgement.recommended_max_lifetime_seconds)),
        fact(
            "Safe retry",
            if o.judgement.safe_retry_rule {
                "retry once on a fresh connection only when no request byte reached a live peer (the peer's FIN arrived before the write: safe_to_retry)"
            } else {
                "no retry rule: a stall or a reset after the write may have reached the server"
            },
        ),
    ];
    let mut out = vec![section(
        2,
        Some("our-side"),
        "Our side",
        vec![Block::Facts(facts), Block::Para(o.judgement.recommendation.clone())],
    )];
    if !o.fix_settings.is_empty() {
        let rows = o
            .fix_settings
            .iter()
            .map(|f| {
                vec![
                    Cell::plain(f.client.clone()),
                    Cell { text: f.setting.clone(), code: true, bad: false },
                    Cell::plain(f.default_seconds.map_or_else(|| "none".to_owned(), fmt_secs)),
                    Cell::plain(f.advice.clone()),
                    Cell { text: f.finding.clone().unwrap_or_default(), code: false, bad: true },
                ]
            })
            .collect();
        let table = Table { head: vec!["client", "setting", "default", "what to do", "finding"], rows };
        out.push(section(3, None, "The fix in the client's terms", vec![Block::Table(table)]));
    }
    if !r.findings.is_empty() {
        let facts = r.findings.iter().map(|(k, v)| fact(k, v.clone())).collect();
        out.push(section(3, None, "Further findings", vec![Block::Facts(facts)]));
    }
    out
}

fn plots(r: &Report) -> Section {
    let probability = Table {
        head: vec!["idle age (s)", "reuses", "failed", "failure probability"],
        rows: r
            .failure_probability
            .iter()
            .map(|b| {
                row([
                    format!("{:.1}-{:.1}", b.idle_from_seconds, b.idle_to_seconds),
                    b.reuses.to_string(),
                    b.failures.to_string(),
                    b.probability.map_or_else(|| "-".to_owned(), |p| format!("{:.0}%", p * 100.0)),
                ])
            })
            .collect(),
    };
    let timeline = Table {
        head: vec!["from (UTC)", "reuses", "new connections", "failed reuses"],
        rows: r
            .timeline
            .iter()
            .map(|b| {
                row([utc(b.start_unix_ns), b.reuses.to_string(), b.new_connections.to_string(), b.failures.to_string()])
            })
            .collect(),
    };
    section(
        2,
        Some("plots"),
        "Plots",
        vec![
            Block::Plot {
                title: "Failure probability against idle age at reuse",
                caption: "The step where failures begin is the timeout.",
                svg: probability_svg(r),
                table: probability,
            },
            Block::Plot {
                title: "Failures over time beside request volume",
                caption: "Failures come from reuse after idle, not from load: they appear when traffic is low.",
                svg: timeline_svg(r),
                table: timeline,
            },
        ],
    )
}

fn samples(r: &Report) -> Section {
    let rows = r
        .samples
        .rows
        .iter()
        .map(|x| {
            row([
                x.time_utc.clone(),
                x.local.clone(),
                x.remote.clone(),
                format!("{} ({})", x.process, x.pid),
                format!("{:.3} s", x.idle_seconds),
                if x.failed_before_send { format!("{}, failed before send", x.outcome) } else { x.outcome.clone() },
                x.retransmits.to_string(),
                x.safe_to_retry.to_string(),
            ])
        })
        .collect();
    let table = Table {
        head: vec!["time (UTC)", "local", "remote", "process", "idle age", "outcome", "retransmits", "safe_to_retry"],
        rows,
    };
    section(
        2,
        Some("samples"),
        "Sample failures",
        vec![
            Block::Para(format!("{} failed reuses in total; shown: {}.", r.samples.total_failures, r.samples.method)),
            Block::Table(table),
        ],
    )
}

/// The partner's card: only what was measured, and what to ask.
fn partner_card(r: &Report) -> Option<Section> {
    let c = r.partner_card.as_ref()?;
    let or_none = |v: Option<String>| v.unwrap_or_else(|| "not measured".to_owned());
    let [lower, upper] = c.idle_timeout_interval_seconds;
    let facts = vec![
        fact("Name", or_none(c.name.clone())),
        fact(
            "Idle timeout",
            format!(
                "{} (interval [{}, {}])",
                or_none(c.idle_timeout_seconds.map(fmt_secs)),
                lower.map_or_else(|| "?".to_owned(), fmt_secs),
                upper.map_or_else(|| "?".to_owned(), fmt_secs)
            ),
        ),
        fact("How an idle connection ends", or_none(c.idle_close.map(|m| m.as_str().to_owned()))),
        fact(
            "Who sends the resets",
            c.reset_from.map_or_else(
                || if r.summary.resets.sources.is_empty() { "no reset seen" } else { "not told" }.to_owned(),
                |f| match c.reset_hops_closer {
                    Some(h) if h > 0 => format!("{} ({h} hops closer than the server)", f.as_str()),
                    _ => f.as_str().to_owned(),
                },
            ),
        ),
        fact(
            "Request deadline",
            c.request_deadline_seconds.map_or_else(|| "not seen (no request of ours was cut off)".to_owned(), fmt_secs),
        ),
        fact(
            "TLS versions",
            if c.tls_versions.is_empty() { "not measured".to_owned() } else { c.tls_versions.join(", ") },
        ),
        fact("Their addresses", c.their_addresses.join(", ")),
        fact("Our source addresses", c.our_addresses.join(", ")),
    ];
    Some(section(
        2,
        Some("partner-card"),
        "Partner card",
        vec![
            Block::Para(
                "What we measured of their side, for the integration notes; nothing here is a guess.".to_owned(),
            ),
            Block::Facts(facts),
            Block::Para("To ask them (TCP cannot show it):".to_owned()),
            Block::List(c.ask.clone()),
        ],
    ))
}

fn questions(r: &Report) -> Section {
    let rows =
        r.questions.iter().map(|q| row([q.topic.clone(), q.question.clone(), q.what_we_measured.clone()])).collect();
    let table = Table { head: vec!["topic", "question", "what we already measured"], rows };
    section(2, Some("questions"), "Questions for the partner", vec![Block::Table(table)])
}

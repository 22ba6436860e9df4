//! The report as one self-contained HTML page: the [`document`] walked,
//! plots as inline SVG.

use std::fmt::Write as _;

use super::{
    document::{document, Block, Span, Table},
    esc, Report,
};

fn table(h: &mut String, t: &Table) {
    h.push_str("<table><tr>");
    for c in &t.head {
        let _ = write!(h, "<th>{}</th>", esc(c));
    }
    h.push_str("</tr>");
    for r in &t.rows {
        h.push_str("<tr>");
        for c in r {
            let text = if c.code { format!("<code>{}</code>", esc(&c.text)) } else { esc(&c.text) };
            let class = if c.bad { " class=\"bad\"" } else { "" };
            let _ = write!(h, "<td{class}>{text}</td>");
        }
        h.push_str("</tr>");
    }
    h.push_str("</table>\n");
}

/// HTML: self-contained, no scripts, no external assets.
#[must_use]
pub fn html(r: &Report) -> String {
    let d = document(r);
    let mut h = String::new();
    let _ = write!(
        h,
        r#"<!DOCTYPE html><html lang="en"><head><meta charset="utf-8"><title>Idle timeout evidence: {dest}</title><style>
body{{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}}
table{{border-collapse:collapse;margin:1rem 0}}td,th{{border:1px solid #ccc;padding:.3rem .6rem;text-align:left;font-size:.9rem}}
th{{background:#f3f3f3}}.big{{font-size:1.3rem}}.bad{{color:#c0392b}}code{{background:#f6f6f6;padding:0 .2rem}}
</style></head><body>
<h1>Idle timeout evidence for <code>{headline}</code></h1>
<p>"#,
        dest = esc(&r.destination),
        headline = esc(&d.headline),
    );
    for s in &d.intro {
        match s {
            Span::Text(t) => h.push_str(&esc(t)),
            Span::Code(c) => {
                let _ = write!(h, "<code>{}</code>", esc(c));
            }
        }
    }
    h.push_str("</p>\n");
    for s in &d.sections {
        let id = s.id.map(|i| format!(" id=\"{i}\"")).unwrap_or_default();
        let _ = writeln!(h, "<h{l}{id}>{}</h{l}>", esc(s.title), l = s.level);
        for b in &s.blocks {
            match b {
                Block::Lead(t) => {
                    let _ = writeln!(h, "<p class=\"big\">{}</p>", esc(t));
                }
                Block::Para(t) => {
                    let _ = writeln!(h, "<p>{}</p>", esc(t));
                }
                Block::Facts(facts) => {
                    h.push_str("<table>");
                    for f in facts {
                        let class = if f.bad { " class=\"bad\"" } else { "" };
                        let _ = write!(h, "<tr><th>{}</th><td{class}>{}</td></tr>", esc(&f.name), esc(&f.value));
                    }
                    h.push_str("</table>\n");
                }
                Block::Table(t) => table(&mut h, t),
                Block::Plot { caption, svg, .. } => {
                    let _ = writeln!(h, "<figure>{svg}<figcaption>{}</figcaption></figure>", esc(caption));
                }
                Block::List(items) => {
                    h.push_str("<ul>");
                    for i in items {
                        let _ = write!(h, "<li>{}</li>", esc(i));
                    }
                    h.push_str("</ul>\n");
                }
            }
        }
    }
    h.push_str("</body></html>\n");
    h
}

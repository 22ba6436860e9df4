//! The report as Markdown: the [`document`] walked, plots as tables.

use std::fmt::Write as _;

use super::{
    document::{document, Block, Cell, Span, Table},
    Report,
};

/// A value safe inside Markdown text and table cells: `|` escaped, control
/// characters shown as escapes.
fn cell(s: &str) -> String {
    crate::kernel::event::printable(s).replace('|', "\\|")
}

fn code(s: &str) -> String {
    format!("`{}`", cell(s))
}

fn table(m: &mut String, t: &Table) {
    let _ = writeln!(m, "| {} |", t.head.join(" | "));
    let _ = writeln!(m, "|{}", "---|".repeat(t.head.len()));
    for r in &t.rows {
        let cells: Vec<String> = r.iter().map(|c: &Cell| if c.code { code(&c.text) } else { cell(&c.text) }).collect();
        let _ = writeln!(m, "| {} |", cells.join(" | "));
    }
    m.push('\n');
}

/// Markdown: the same content as the HTML, plots as tables.
#[must_use]
pub fn markdown(r: &Report) -> String {
    let d = document(r);
    let mut m = String::new();
    let _ = writeln!(m, "# Idle timeout evidence for {}\n", code(&d.headline));
    for s in &d.intro {
        m.push_str(&match s {
            Span::Text(t) => cell(t),
            Span::Code(c) => code(c),
        });
    }
    m.push_str("\n\n");
    for s in &d.sections {
        let _ = writeln!(m, "{} {}\n", "#".repeat(usize::from(s.level)), s.title);
        for b in &s.blocks {
            match b {
                Block::Lead(t) => {
                    let _ = writeln!(m, "**{}**\n", cell(t));
                }
                Block::Para(t) => {
                    let _ = writeln!(m, "{}\n", cell(t));
                }
                Block::Facts(facts) => {
                    m.push_str("| | |\n|---|---|\n");
                    for f in facts {
                        let _ = writeln!(m, "| {} | {} |", cell(&f.name), cell(&f.value));
                    }
                    m.push('\n');
                }
                Block::Table(t) => table(&mut m, t),
                Block::Plot { title, caption, table: t, .. } => {
                    let _ = writeln!(m, "### {title}\n\n{caption}\n");
                    table(&mut m, t);
                }
                Block::List(items) => {
                    for i in items {
                        let _ = writeln!(m, "- {}", cell(i));
                    }
                    m.push('\n');
                }
            }
        }
    }
    m.truncate(m.trim_end().len());
    m.push('\n');
    m
}

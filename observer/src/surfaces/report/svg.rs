//! The report's plots as inline SVG (no external assets, no scripts).

use std::fmt::Write as _;

use super::{esc, fmt_secs, utc, Report};

#[allow(clippy::many_single_char_names, reason = "plot geometry reads as the math: w, h, x, y")]
/// Bar chart as inline SVG: `bars` are (label, value, value2) with value2
/// drawn as a second, overlaid series when present.
#[allow(clippy::cast_precision_loss, reason = "plot coordinates")]
fn svg_bars(
    title: &str,
    x_label: &str,
    y_label: &str,
    bars: &[(String, f64, Option<f64>)],
    y_max: f64,
    marker: Option<(f64, &str)>,
) -> String {
    let (w, h, left, bottom, top) = (760.0, 300.0, 60.0, 50.0, 30.0);
    let plot_w = w - left - 20.0;
    let plot_h = h - bottom - top;
    let n = bars.len().max(1) as f64;
    let bw = plot_w / n;
    let y = |v: f64| top + plot_h - (v / y_max.max(1e-9)) * plot_h;
    let mut s = format!(
        r##"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" role="img" aria-label="{t}"><title>{t}</title><rect width="{w}" height="{h}" fill="#ffffff"/>"##,
        t = esc(title)
    );
    let _ = write!(
        s,
        r##"<line x1="{left}" y1="{top}" x2="{left}" y2="{}" stroke="#333"/><line x1="{left}" y1="{}" x2="{}" y2="{}" stroke="#333"/>"##,
        top + plot_h,
        top + plot_h,
        left + plot_w,
        top + plot_h
    );
    for k in 0..=4 {
        let v = y_max * f64::from(k) / 4.0;
        let yy = y(v);
        let _ = write!(
            s,
            r##"<line x1="{}" y1="{yy:.1}" x2="{}" y2="{yy:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" font-size="10" text-anchor="end">{}</text>"##,
            left,
            left + plot_w,
            left - 4.0,
            yy + 3.0,
            if y_max <= 1.0 { format!("{:.0}%", v * 100.0) } else { format!("{v:.0}") }
        );
    }
    let label_every = (bars.len() / 8).max(1);
    for (i, (label, v, v2)) in bars.iter().enumerate() {
        let x = left + i as f64 * bw;
        let _ = write!(
            s,
            r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#8aa4c8"/>"##,
            x + 1.0,
            y(*v),
            (bw - 2.0).max(1.0),
            top + plot_h - y(*v)
        );
        if let Some(v2) = v2 {
            let _ = write!(
                s,
                r##"<rect x="{:.1}" y="{:.1}" width="{:.1}" height="{:.1}" fill="#c0392b"/>"##,
                x + bw * 0.25,
                y(*v2),
                (bw * 0.5).max(1.0),
                top + plot_h - y(*v2)
            );
        }
        if i % label_every == 0 {
            let _ = write!(
                s,
                r#"<text x="{:.1}" y="{:.1}" font-size="10" text-anchor="middle">{}</text>"#,
                x + bw / 2.0,
                top + plot_h + 14.0,
                esc(label)
            );
        }
    }
    if let Some((pos, text)) = marker {
        let x = left + pos * plot_w;
        let _ = write!(
            s,
            r##"<line x1="{x:.1}" y1="{top}" x2="{x:.1}" y2="{:.1}" stroke="#c0392b" stroke-dasharray="4 3"/><text x="{:.1}" y="{:.1}" font-size="11" fill="#c0392b">{}</text>"##,
            top + plot_h,
            x + 4.0,
            top + 12.0,
            esc(text)
        );
    }
    let _ = write!(
        s,
        r#"<text x="{:.1}" y="{:.1}" font-size="12" text-anchor="middle">{}</text><text x="14" y="{:.1}" font-size="12" text-anchor="middle" transform="rotate(-90 14 {:.1})">{}</text></svg>"#,
        left + plot_w / 2.0,
        h - 10.0,
        esc(x_label),
        top + plot_h / 2.0,
        top + plot_h / 2.0,
        esc(y_label)
    );
    s
}

pub(super) fn probability_svg(r: &Report) -> String {
    let bars: Vec<(String, f64, Option<f64>)> = r
        .failure_probability
        .iter()
        .map(|b| {
            let w = b.idle_to_seconds - b.idle_from_seconds;
            let label =
                if w < 1.0 { format!("{:.1}", b.idle_from_seconds) } else { format!("{:.0}", b.idle_from_seconds) };
            (label, b.probability.unwrap_or(0.0), None)
        })
        .collect();
    let max_x = r.failure_probability.last().map_or(1.0, |b| b.idle_to_seconds);
    let t = r.summary.path.idle_timeout_seconds.or(r.summary.path.upper_seconds);
    let marker = t.map(|t| (t / max_x, format!("path timeout {}", fmt_secs(t))));
    svg_bars(
        "Failure probability against idle age at reuse",
        "idle age at reuse (s)",
        "failed reuses",
        &bars,
        1.0,
        marker.as_ref().map(|(p, s)| (*p, s.as_str())),
    )
}

#[allow(clippy::cast_precision_loss, reason = "plot heights")]
pub(super) fn timeline_svg(r: &Report) -> String {
    let bars: Vec<(String, f64, Option<f64>)> = r
        .timeline
        .iter()
        .map(|b| {
            // HH:MM, or HH:MM:SS when the bins are shorter than a minute.
            let t = utc(b.start_unix_ns);
            let label = if b.end_unix_ns - b.start_unix_ns < 60_000_000_000 {
                t[11..19].to_owned()
            } else {
                t[11..16].to_owned()
            };
            (label, (b.reuses + b.new_connections) as f64, Some(b.failures as f64))
        })
        .collect();
    let max = bars.iter().map(|b| b.1.max(b.2.unwrap_or(0.0))).fold(1.0, f64::max);
    svg_bars(
        "Failures over time beside request volume",
        "time (UTC); blue: reuses + new connections, red: failures",
        "count",
        &bars,
        max,
        None,
    )
}

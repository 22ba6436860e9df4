//! The lean `/metrics` series in OpenTelemetry's terms, read from the
//! exposition itself so the two can never drift apart: each Prometheus
//! family's OTLP name, kind and unit, and each sample's attributes, with
//! the semantic conventions for the peer (`server.address`, `server.port`,
//! `network.type`) and observer's own labels under `observer.`.

use std::{collections::HashMap, net::SocketAddr};

/// How a family is sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A Prometheus counter: a cumulative, monotonic sum.
    Sum,
    /// A Prometheus gauge.
    Gauge,
}

/// One family of the exposition and its OTLP form.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Family {
    /// The Prometheus name, as samples carry it (`observer_reuses_total`).
    pub prometheus: String,
    /// The OTLP name (`observer.reuses`).
    pub name: String,
    /// `s` for `_seconds`, empty for counts.
    pub unit: &'static str,
    pub kind: Kind,
    pub description: String,
}

/// The OTLP name and unit of a Prometheus family: the `observer_` prefix
/// becomes the `observer.` namespace, and the unit suffix (`_total`,
/// `_seconds`) becomes the unit, so an OpenTelemetry Collector's
/// Prometheus exporter writes the original name back.
#[must_use]
pub fn otel_name(prometheus: &str) -> (String, &'static str) {
    let stem = prometheus.strip_prefix("observer_").unwrap_or(prometheus);
    let stem = stem.strip_suffix("_total").unwrap_or(stem);
    match stem.strip_suffix("_seconds") {
        Some(s) => (format!("observer.{s}"), "s"),
        None => (format!("observer.{stem}"), ""),
    }
}

/// The families a exposition declares (its `# TYPE` lines), counters and
/// gauges only: the histograms of `--metrics-histograms` stay on
/// `/metrics`, so OTLP carries the lean set.
#[must_use]
pub fn families(exposition: &str) -> Vec<Family> {
    let mut help: HashMap<&str, &str> = HashMap::new();
    let mut out = Vec::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, text) = rest.split_once(' ').unwrap_or((rest, ""));
            help.insert(name, text);
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, ty) = rest.split_once(' ').unwrap_or((rest, ""));
            let kind = match ty {
                "counter" => Kind::Sum,
                "gauge" => Kind::Gauge,
                _ => continue,
            };
            let (otel, unit) = otel_name(name);
            out.push(Family {
                prometheus: name.to_owned(),
                name: otel,
                unit,
                kind,
                description: help.get(name).copied().unwrap_or("").replace("\\n", "\n").replace("\\\\", "\\"),
            });
        }
    }
    out
}

/// An attribute's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    Str(String),
    Int(i64),
}

/// One data point: its attributes and value.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    pub attributes: Vec<(String, Value)>,
    pub value: f64,
}

/// Every data point of an exposition, by Prometheus family name.
#[derive(Debug, Default)]
pub struct Snapshot {
    points: HashMap<String, Vec<Point>>,
}

impl Snapshot {
    /// Read an exposition (as [`crate::surfaces::metrics::Metrics::encode`]
    /// writes it): each sample with its labels turned into attributes.
    #[must_use]
    pub fn read(exposition: &str) -> Self {
        let mut points: HashMap<String, Vec<Point>> = HashMap::new();
        for (family, labels, value) in exposition.lines().filter_map(sample) {
            points.entry(family.to_owned()).or_default().push(Point { attributes: attributes(&labels), value });
        }
        Self { points }
    }

    /// The points of one family (none when it has no series).
    #[must_use]
    pub fn points(&self, prometheus: &str) -> &[Point] {
        self.points.get(prometheus).map_or(&[], Vec::as_slice)
    }
}

/// A sample: its family name, labels and value.
type Sample<'a> = (&'a str, Vec<(String, String)>, f64);

/// A sample line: its family name, labels and value; None for comments,
/// blank lines and anything that does not parse.
fn sample(line: &str) -> Option<Sample<'_>> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let Some(i) = line.find('{') else {
        let (n, v) = line.split_once(' ')?;
        return Some((n, Vec::new(), parse_value(v)?));
    };
    let (name, rest) = (&line[..i], &line[i + 1..]);
    let mut labels = Vec::new();
    let mut chars = rest.char_indices().peekable();
    let mut end = None;
    loop {
        // A label: name="value", then `,` or `}`.
        while chars.peek().is_some_and(|(_, c)| *c == ',' || *c == ' ') {
            chars.next();
        }
        match chars.peek() {
            Some((i, '}')) => {
                end = Some(*i);
                break;
            }
            None => break,
            _ => {}
        }
        let mut key = String::new();
        for (_, c) in chars.by_ref() {
            if c == '=' {
                break;
            }
            key.push(c);
        }
        if chars.next().map(|(_, c)| c) != Some('"') {
            return None;
        }
        let mut value = String::new();
        let mut closed = false;
        while let Some((_, c)) = chars.next() {
            match c {
                '\\' => match chars.next().map(|(_, c)| c) {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => return None,
                },
                '"' => {
                    closed = true;
                    break;
                }
                c => value.push(c),
            }
        }
        if !closed {
            return None;
        }
        labels.push((key, value));
    }
    let end = end?;
    Some((name, labels, parse_value(rest[end + 1..].trim())?))
}

fn parse_value(v: &str) -> Option<f64> {
    // A timestamp may follow the value; ours never carry one.
    let v = v.split_whitespace().next()?;
    match v {
        "+Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        v => v.parse().ok(),
    }
}

/// A sample's labels as attributes: `destination` as the peer's semantic
/// conventions (and `observer.destination`, the label itself, to join
/// with Prometheus), every other label under `observer.`; an empty label
/// (the host's `netns`) is left out, as Prometheus reads it.
///
/// `server.address` is the address the row is keyed by, never a name: a
/// row's names arrive and change over its life, and an attribute that
/// changes starts a new series in every backend (a cumulative sum would
/// count twice). The names are on `observer.destination_info`'s
/// `observer.server_name`, as on `/metrics`; `network.peer.address`
/// would repeat the address, so it is not sent.
fn attributes(labels: &[(String, String)]) -> Vec<(String, Value)> {
    let mut out = Vec::with_capacity(labels.len() + 3);
    for (k, v) in labels {
        if v.is_empty() {
            continue;
        }
        if k == "destination" {
            if let Ok(addr) = v.parse::<SocketAddr>() {
                out.push(("server.address".to_owned(), Value::Str(addr.ip().to_string())));
                out.push(("server.port".to_owned(), Value::Int(i64::from(addr.port()))));
                let ty = if addr.is_ipv4() { "ipv4" } else { "ipv6" };
                out.push(("network.type".to_owned(), Value::Str(ty.to_owned())));
            }
        }
        out.push((format!("observer.{k}"), Value::Str(v.clone())));
    }
    out
}

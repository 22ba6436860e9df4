//! `observer path`: the two staircases of the seeds, checked on paper.
//!
//! A path file (TOML) lists the hops from the client inward. Each hop has a
//! `name`, an optional `kind` from the [`catalog`] of documented defaults and
//! optional overrides. The check draws both staircases and lists every
//! violation with a one-line fix:
//!
//! - idle timeouts rise inward: each hop keeps an idle connection longer than
//!   the hop in front of it keeps its pool toward it (strictly: equal timeouts
//!   race);
//! - a client pool's idle timeout is at most 0.8 x the smallest idle timeout
//!   behind it;
//! - deadlines fall inward (a hop may wait as long as, never longer than, any
//!   hop in front of it) and none is unlimited where the hop holds a request;
//! - a health check's timeout is shorter than every deadline behind it;
//! - Node.js `headers_timeout` is above its keep-alive timeout.

pub mod catalog;

use std::{fmt, fmt::Write as _, net::SocketAddr};

use serde::{Deserialize, Serialize, Serializer};

use crate::diagnosis::estimate::POOL_FRACTION;
use crate::units::fmt_secs;
use catalog::{Category, Kind};

mod measured;

pub(crate) use measured::close_enough;
pub use measured::compare_observed;

/// A timeout value: seconds, or no limit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    Seconds(f64),
    Unlimited,
}

impl Limit {
    /// Parse `"60s"`, `"5m"`, `"1h30m"`, `"500ms"` or `"none"`.
    pub fn parse(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if t.eq_ignore_ascii_case("none") {
            return Ok(Self::Unlimited);
        }
        humantime::parse_duration(t)
            .map(|d| Self::Seconds(d.as_secs_f64()))
            .map_err(|e| format!("`{s}` is not a duration ({e}); write it like \"60s\", \"5m\" or \"none\""))
    }

    /// Strict order with `Unlimited` above every finite value.
    fn longer_than(self, other: Self) -> bool {
        match (self, other) {
            (Self::Unlimited, Self::Seconds(_)) => true,
            (Self::Seconds(a), Self::Seconds(b)) => a > b,
            (_, Self::Unlimited) => false,
        }
    }

    fn secs(self) -> Option<f64> {
        match self {
            Self::Seconds(s) => Some(s),
            Self::Unlimited => None,
        }
    }
}

impl fmt::Display for Limit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Seconds(s) => f.write_str(&fmt_secs(*s)),
            Self::Unlimited => f.write_str("none"),
        }
    }
}

impl Serialize for Limit {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Self::Seconds(v) => s.serialize_f64(*v),
            Self::Unlimited => s.serialize_str("none"),
        }
    }
}

/// A hop's six limits (each known or not): in a kind's defaults, in a
/// path file's hop, and in the checks, one type.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct Limits {
    /// How long it keeps an idle connection from the hop in front of it.
    pub idle_timeout: Option<Limit>,
    /// How long its own pool toward the hop behind it keeps idle connections.
    pub upstream_idle_timeout: Option<Limit>,
    /// How long it waits for the hop behind it.
    pub deadline: Option<Limit>,
    pub health_check_timeout: Option<Limit>,
    /// Node.js `headersTimeout`.
    pub headers_timeout: Option<Limit>,
    pub max_lifetime: Option<Limit>,
}

impl Limits {
    /// None known.
    pub const NONE: Self = Self {
        idle_timeout: None,
        upstream_idle_timeout: None,
        deadline: None,
        health_check_timeout: None,
        headers_timeout: None,
        max_lifetime: None,
    };

    /// Each limit by its path-file key, in the file's order.
    #[must_use]
    pub const fn named(&self) -> [(&'static str, Option<Limit>); 6] {
        [
            ("idle_timeout", self.idle_timeout),
            ("upstream_idle_timeout", self.upstream_idle_timeout),
            ("deadline", self.deadline),
            ("health_check_timeout", self.health_check_timeout),
            ("headers_timeout", self.headers_timeout),
            ("max_lifetime", self.max_lifetime),
        ]
    }

    /// These (a file's) over a kind's `defaults`. A file that gives the
    /// hop's `idle_timeout` but no `upstream_idle_timeout` means one idle
    /// timeout for both sides: the kind's pool default does not apply.
    #[must_use]
    pub fn over(self, defaults: Self) -> Self {
        Self {
            idle_timeout: self.idle_timeout.or(defaults.idle_timeout),
            upstream_idle_timeout: self.upstream_idle_timeout.or(if self.idle_timeout.is_some() {
                None
            } else {
                defaults.upstream_idle_timeout
            }),
            deadline: self.deadline.or(defaults.deadline),
            health_check_timeout: self.health_check_timeout.or(defaults.health_check_timeout),
            headers_timeout: self.headers_timeout.or(defaults.headers_timeout),
            max_lifetime: self.max_lifetime.or(defaults.max_lifetime),
        }
    }

    /// How long the hop's pool toward the next hop keeps idle connections.
    #[must_use]
    pub fn pool_idle(&self) -> Option<Limit> {
        self.upstream_idle_timeout.or(self.idle_timeout)
    }
}

/// A path file could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum PathError {
    #[error("{0}")]
    Syntax(String),
    #[error("line {line}: field `{field}`: {problem}")]
    Field { line: usize, field: &'static str, problem: String },
    #[error("the file declares no hops; add one `[[hop]]` table per hop, from the client inward")]
    NoHops,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    #[serde(default)]
    hop: Vec<RawHop>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHop {
    name: toml::Spanned<String>,
    kind: Option<toml::Spanned<String>>,
    idle_timeout: Option<toml::Spanned<String>>,
    upstream_idle_timeout: Option<toml::Spanned<String>>,
    deadline: Option<toml::Spanned<String>>,
    health_check_timeout: Option<toml::Spanned<String>>,
    headers_timeout: Option<toml::Spanned<String>>,
    max_lifetime: Option<toml::Spanned<String>>,
    address: Option<toml::Spanned<String>>,
    client: Option<bool>,
}

/// One hop with its kind's defaults and the file's overrides applied.
#[derive(Debug, Clone, Serialize)]
pub struct Hop {
    pub name: String,
    pub kind: Option<String>,
    /// Client pool (from the kind's category, or `client = true`).
    pub client: bool,
    #[serde(skip)]
    pub category: Option<Category>,
    #[serde(flatten)]
    pub limits: Limits,
    pub address: Option<HopAddress>,
}

/// Where a hop is reached: `ip:port`, or `host:port` with the name clients
/// use in their configuration (matched against the names observer saw in
/// the clients' first bytes, TLS SNI or HTTP `Host`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HopAddress {
    Socket(SocketAddr),
    Name { host: String, port: u16 },
}

impl std::fmt::Display for HopAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Socket(a) => write!(f, "{a}"),
            Self::Name { host, port } => write!(f, "{host}:{port}"),
        }
    }
}

impl Serialize for HopAddress {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl std::str::FromStr for HopAddress {
    type Err = String;

    fn from_str(v: &str) -> Result<Self, String> {
        if let Ok(a) = v.parse::<SocketAddr>() {
            return Ok(Self::Socket(a));
        }
        let bad = || format!("`{v}` is neither ip:port nor host:port (IPv6 as [addr]:port)");
        let (host, port) = v.rsplit_once(':').ok_or_else(bad)?;
        let port = port.parse::<u16>().map_err(|_| bad())?;
        let host = crate::kernel::first_bytes::host_name(host.as_bytes()).ok_or_else(bad)?;
        Ok(Self::Name { host, port })
    }
}

fn line_of(src: &str, offset: usize) -> usize {
    src[..offset.min(src.len())].bytes().filter(|&b| b == b'\n').count() + 1
}

/// A path file read (at most [`crate::files::MAX_TEXT_BYTES`]) and
/// parsed; the error names the file.
pub fn load(file: &std::path::Path) -> Result<Vec<Hop>, String> {
    let src = crate::files::read_text(file, crate::files::MAX_TEXT_BYTES)
        .map_err(|e| format!("reading {}: {e}", file.display()))?;
    parse(&src).map_err(|e| format!("{}: {e}", file.display()))
}

/// Parse a path file.
pub fn parse(src: &str) -> Result<Vec<Hop>, PathError> {
    let raw: RawFile = toml::from_str(src).map_err(|e| PathError::Syntax(e.to_string().trim_end().to_owned()))?;
    if raw.hop.is_empty() {
        return Err(PathError::NoHops);
    }
    let limit = |v: &Option<toml::Spanned<String>>, field: &'static str| -> Result<Option<Limit>, PathError> {
        v.as_ref()
            .map(|s| {
                Limit::parse(s.get_ref()).map_err(|problem| PathError::Field {
                    line: line_of(src, s.span().start),
                    field,
                    problem,
                })
            })
            .transpose()
    };
    raw.hop
        .iter()
        .map(|h| {
            let kind: Option<&Kind> = match &h.kind {
                Some(k) => Some(catalog::find(k.get_ref()).ok_or_else(|| PathError::Field {
                    line: line_of(src, k.span().start),
                    field: "kind",
                    problem: format!(
                        "unknown kind `{}`; known kinds: {} (or leave `kind` out and give the timeouts)",
                        k.get_ref(),
                        catalog::CATALOG.iter().map(|k| k.id).collect::<Vec<_>>().join(", ")
                    ),
                })?),
                None => None,
            };
            let address = h
                .address
                .as_ref()
                .map(|a| {
                    a.get_ref().parse::<HopAddress>().map_err(|problem| PathError::Field {
                        line: line_of(src, a.span().start),
                        field: "address",
                        problem,
                    })
                })
                .transpose()?;
            let name = h.name.get_ref().trim().to_owned();
            if name.is_empty() {
                return Err(PathError::Field {
                    line: line_of(src, h.name.span().start),
                    field: "name",
                    problem: "empty name".into(),
                });
            }
            Ok(Hop {
                name,
                kind: kind.map(|k| k.id.to_owned()),
                client: h.client.unwrap_or(kind.is_some_and(|k| k.category == Category::ClientPool)),
                category: kind.map(|k| k.category),
                limits: Limits {
                    idle_timeout: limit(&h.idle_timeout, "idle_timeout")?,
                    upstream_idle_timeout: limit(&h.upstream_idle_timeout, "upstream_idle_timeout")?,
                    deadline: limit(&h.deadline, "deadline")?,
                    health_check_timeout: limit(&h.health_check_timeout, "health_check_timeout")?,
                    headers_timeout: limit(&h.headers_timeout, "headers_timeout")?,
                    max_lifetime: limit(&h.max_lifetime, "max_lifetime")?,
                }
                .over(kind.map_or(Limits::NONE, |k| k.limits)),
                address,
            })
        })
        .collect()
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Violation {
    /// `idle_staircase`, `client_pool_margin`, `deadline_staircase`,
    /// `deadline_unlimited`, `health_check`, `node_headers_timeout`, `observed`.
    pub rule: &'static str,
    pub hop: String,
    pub message: String,
    pub fix: String,
}

/// The result of a check.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub hops: Vec<Hop>,
    pub violations: Vec<Violation>,
    /// Notes that are not violations (e.g. no measurement yet).
    pub notes: Vec<String>,
}

fn v(rule: &'static str, hop: &Hop, message: String, fix: String) -> Violation {
    Violation { rule, hop: hop.name.clone(), message, fix }
}

/// Check both staircases and the other rules.
#[must_use]
#[allow(clippy::too_many_lines, reason = "the rules one after another, in the order the README lists them")]
pub fn check(hops: &[Hop]) -> Report {
    let mut out = Vec::new();
    // Idle staircase: each hop against the nearest hop in front of it that
    // has an idle timeout for its pool.
    for (i, inner) in hops.iter().enumerate() {
        let Some(inner_idle) = inner.limits.idle_timeout else { continue };
        let Some(outer) = hops[..i].iter().rev().find(|h| h.limits.pool_idle().is_some()) else { continue };
        let Some(outer_idle) = outer.limits.pool_idle() else { continue };
        let ok =
            inner_idle.longer_than(outer_idle) || (inner_idle == Limit::Unlimited && outer_idle == Limit::Unlimited);
        if !ok {
            out.push(v(
                "idle_staircase",
                inner,
                format!(
                    "{} closes idle connections after {inner_idle}, but {} keeps them idle up to {outer_idle}: {} can write a request onto a connection {} already closed",
                    inner.name, outer.name, outer.name, inner.name
                ),
                idle_fix(outer, outer_idle, inner, inner_idle),
            ));
        }
    }
    // Client pool margin: at most 0.8 x the smallest idle timeout behind it.
    for (i, pool) in hops.iter().enumerate().filter(|(_, h)| h.client) {
        let Some(p) = pool.limits.pool_idle() else { continue };
        let smallest = hops[i + 1..]
            .iter()
            .filter_map(|h| Some((h, h.limits.idle_timeout?.secs()?)))
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let Some((hop, s)) = smallest else { continue };
        let limit = s * POOL_FRACTION;
        if p.secs().is_none_or(|p| p > limit + 1e-9) {
            out.push(v(
                "client_pool_margin",
                pool,
                format!(
                    "{} keeps idle connections {p}, but {} closes them after {}: the pool's idle timeout must be the shortest by a margin",
                    pool.name,
                    hop.name,
                    fmt_secs(s)
                ),
                format!(
                    "set the pool idle timeout at most {} (0.8 x {}'s {}), with a maximum connection lifetime",
                    fmt_secs(limit),
                    hop.name,
                    fmt_secs(s)
                ),
            ));
        }
    }
    // Deadline staircase.
    for (i, inner) in hops.iter().enumerate() {
        let Some(d) = inner.limits.deadline else { continue };
        let outer_min =
            hops[..i].iter().filter_map(|h| Some((h, h.limits.deadline?.secs()?))).min_by(|a, b| a.1.total_cmp(&b.1));
        match (d, outer_min) {
            (Limit::Unlimited, _) if inner.category != Some(Category::Network) => {
                let below = outer_min.map_or_else(String::new, |(h, s)| format!(" below {}'s {}", h.name, fmt_secs(s)));
                out.push(v(
                    "deadline_unlimited",
                    inner,
                    format!("{} waits without limit: a slow request outlives every hop in front of it and holds a connection nobody will read", inner.name),
                    format!("give {} a deadline{below}", inner.name),
                ));
            }
            (Limit::Seconds(s), Some((outer, o))) if s > o + 1e-9 => out.push(v(
                "deadline_staircase",
                inner,
                format!(
                    "{} waits up to {}, but {} gives up after {}: the inner hop keeps working for a response nobody will read",
                    inner.name,
                    fmt_secs(s),
                    outer.name,
                    fmt_secs(o)
                ),
                format!("lower {}'s deadline below {}", inner.name, fmt_secs(o)),
            )),
            _ => {}
        }
    }
    // Health checks: shorter than every deadline behind them.
    for (i, h) in hops.iter().enumerate() {
        let Some(hc) = h.limits.health_check_timeout.and_then(Limit::secs) else { continue };
        for inner in &hops[i..] {
            if let Some(d) = inner.limits.deadline.and_then(Limit::secs) {
                if hc >= d {
                    out.push(v(
                        "health_check",
                        h,
                        format!(
                            "{}'s health check times out after {}, not shorter than {}'s deadline {}: a slow {} fails health checks everywhere at once",
                            h.name,
                            fmt_secs(hc),
                            inner.name,
                            fmt_secs(d),
                            inner.name
                        ),
                        format!("make the health check the shortest deadline of all (below {}), and keep it off slow paths", fmt_secs(d)),
                    ));
                }
            }
        }
    }
    // Node.js: headersTimeout above keepAliveTimeout.
    for h in hops.iter().filter(|h| h.kind.as_deref() == Some("nodejs") || h.limits.headers_timeout.is_some()) {
        if let (Some(ht), Some(ka)) = (h.limits.headers_timeout, h.limits.idle_timeout) {
            if !ht.longer_than(ka) {
                out.push(v(
                    "node_headers_timeout",
                    h,
                    format!("{}'s headers timeout {ht} is not above its keep-alive timeout {ka}: a reused connection can time out waiting for headers", h.name),
                    format!("set {}'s headers_timeout above {ka}", h.name),
                ));
            }
        }
    }
    Report { hops: hops.to_vec(), violations: out, notes: Vec::new() }
}

/// The fix of a reversed idle step, with the seeds' margin: the outer hop
/// at most 0.8 x the inner hop's idle timeout (a fix one second below the
/// inner hop's timeout is the very race), or the inner hop raised so that
/// the outer one sits at 0.8 x it.
fn idle_fix(outer: &Hop, outer_idle: Limit, inner: &Hop, inner_idle: Limit) -> String {
    let Some(i) = inner_idle.secs() else {
        return format!("give {} an idle timeout", outer.name);
    };
    let lower = fmt_secs(i * POOL_FRACTION);
    match outer_idle.secs() {
        Some(o) => format!(
            "lower {}'s idle timeout to at most {lower} (0.8 x {}'s {}), or raise {}'s to at least {} (so {}'s {} is 0.8 x it)",
            outer.name,
            inner.name,
            fmt_secs(i),
            inner.name,
            fmt_secs(o / POOL_FRACTION),
            outer.name,
            fmt_secs(o)
        ),
        None => format!(
            "give {} an idle timeout of at most {lower} (0.8 x {}'s {})",
            outer.name,
            inner.name,
            fmt_secs(i)
        ),
    }
}

fn cell(l: Option<Limit>) -> String {
    l.map_or_else(|| "-".to_owned(), |l| l.to_string())
}

/// The staircases as a table, then the violations.
#[must_use]
pub fn render(report: &Report) -> String {
    let rows: Vec<[String; 4]> = report
        .hops
        .iter()
        .map(|h| {
            let idle = match (h.limits.idle_timeout, h.limits.upstream_idle_timeout) {
                (Some(i), Some(u)) if u != i => format!("{i} (pool {u})"),
                (i, _) => cell(i),
            };
            [h.name.clone(), h.kind.clone().unwrap_or_else(|| "-".into()), idle, cell(h.limits.deadline)]
        })
        .collect();
    let header = ["HOP (client first)", "KIND", "IDLE TIMEOUT (must rise)", "DEADLINE (must fall)"];
    let mut out = crate::surfaces::status::columns(&header, &rows);
    out.push('\n');
    if report.violations.is_empty() {
        out.push_str("both staircases hold: no violations\n");
    } else {
        let _ = writeln!(out, "{} violation(s):", report.violations.len());
        for v in &report.violations {
            let _ = writeln!(out, "- [{}] {}\n  fix: {}", v.rule, v.message, v.fix);
        }
    }
    for n in &report.notes {
        let _ = writeln!(out, "note: {n}");
    }
    out
}

/// The catalog as text (one kind, or all).
pub fn render_catalog(kind: Option<&str>) -> Result<String, String> {
    let kinds: Vec<&Kind> = match kind {
        Some(id) => vec![catalog::find(id).ok_or_else(|| {
            format!(
                "unknown kind `{id}`; known kinds: {}",
                catalog::CATALOG.iter().map(|k| k.id).collect::<Vec<_>>().join(", ")
            )
        })?],
        None => catalog::CATALOG.iter().collect(),
    };
    let mut out = String::new();
    for k in kinds {
        let mut fields = Vec::new();
        for (name, val) in k.limits.named() {
            if let Some(v) = val {
                fields.push(format!("{name} = {v}"));
            }
        }
        let _ = writeln!(
            out,
            "{:<16} {} ({})\n                 {}\n                 source: {}",
            k.id,
            k.name,
            k.category.as_str(),
            fields.join(", "),
            k.source
        );
    }
    Ok(out)
}

#[cfg(test)]
mod tests;

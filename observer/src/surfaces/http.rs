//! The daemon's HTTP endpoint: `GET /api/v1/destinations` (JSON table),
//! `GET /metrics` (Prometheus) and `GET /healthz`, served with hyper
//! (HTTP/1.1, one request per connection) and bounded in every way a
//! client could use against it:
//! - at most [`Limits::max_connections`] connections at once (the rest are
//!   closed at accept);
//! - the whole request head within [`Limits::head_deadline`] (hyper's
//!   header read timeout, which is not per read: a client trickling one
//!   byte at a time is closed when it runs out);
//! - the whole exchange, response included, within
//!   [`Limits::request_deadline`] (a client that never reads its response);
//! - at most [`MAX_REQUEST`] bytes of head (hyper answers 431 past it);
//! - a `Host` header that is an IP literal, `localhost`, this machine's
//!   name or an `--allowed-host`, else 421 (DNS rebinding: a web page on a
//!   name the attacker controls cannot read the table).

use std::{convert::Infallible, sync::Arc, time::Duration};

use http_body_util::Full;
use hyper::{body::Bytes, header, server::conn::http1, service::service_fn, Method, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use log::debug;
use tokio::{net::TcpListener, sync::Semaphore};

/// Longest request head accepted (hyper's read buffer; at least 8 KiB).
pub const MAX_REQUEST: usize = 16 * 1024;

/// What the server allows a client.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections served at once; more are closed at accept.
    pub max_connections: usize,
    /// Time for the whole request head.
    pub head_deadline: Duration,
    /// Time for the whole exchange, the response written included.
    pub request_deadline: Duration,
    /// Host names accepted besides IP literals, `localhost` and this
    /// machine's name (lower case, without port).
    pub allowed_hosts: Vec<String>,
    /// The only paths this listener serves (`None`: every path). The
    /// scrape port serves [`SCRAPE_PATHS`]: the table stays off it.
    pub only: Option<&'static [&'static str]>,
}

/// What the scrape port (`--scrape-addr`) serves.
pub const SCRAPE_PATHS: &[&str] = &["/metrics", "/healthz"];

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_connections: 1024,
            head_deadline: Duration::from_secs(5),
            request_deadline: Duration::from_secs(30),
            allowed_hosts: Vec::new(),
            only: None,
        }
    }
}

/// A response: status, content type, body. The body is reference-counted:
/// every client of one cached table shares one copy of it.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Bytes,
}

impl Response {
    #[must_use]
    pub fn json(body: impl Into<Bytes>) -> Self {
        Self { status: 200, content_type: "application/json", body: body.into() }
    }

    #[must_use]
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self { status, content_type: "text/plain; charset=utf-8", body: Bytes::from(body.into()) }
    }
}

/// Routes a request path to a response.
pub trait Handler: Send + Sync + 'static {
    fn get(&self, path: &str) -> Response;
}

/// This machine's name, lower case.
fn hostname() -> Option<String> {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").ok()?;
    Some(name.trim().to_ascii_lowercase()).filter(|n| !n.is_empty())
}

/// Is `host` (a `Host` header value) one we answer?
#[must_use]
pub fn host_allowed(host: &str, allowed: &[String]) -> bool {
    let h = host.trim().to_ascii_lowercase();
    // Strip the port: `[v6]:port`, `name:port`, `v4:port`.
    let name = if let Some(rest) = h.strip_prefix('[') {
        rest.split(']').next().unwrap_or_default().to_owned()
    } else if h.matches(':').count() == 1 {
        h.split(':').next().unwrap_or_default().to_owned()
    } else {
        h.clone()
    };
    let name = name.trim_end_matches('.');
    name.parse::<std::net::IpAddr>().is_ok()
        || name == "localhost"
        || hostname().is_some_and(|m| m == name || m.split('.').next() == Some(name))
        || allowed.iter().any(|a| a.eq_ignore_ascii_case(name))
}

/// The response to one request (Host check, method, route).
fn respond<B>(handler: &dyn Handler, limits: &Limits, req: &hyper::Request<B>) -> hyper::Response<Full<Bytes>> {
    let host = req.headers().get(header::HOST).map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned());
    let r = if host.as_deref().is_some_and(|h| !host_allowed(h, &limits.allowed_hosts)) {
        Response::text(421, "unknown Host; use an IP address, localhost, or run with --allowed-host NAME\n")
    } else if limits.only.is_some_and(|only| !only.contains(&req.uri().path())) {
        Response::text(
            404,
            "this port serves /metrics and /healthz only; the destination table is on --metrics-addr (loopback by default)\n",
        )
    } else if req.method() == Method::GET {
        handler.get(req.uri().path())
    } else {
        Response::text(405, "only GET is served\n")
    };
    let mut out = hyper::Response::new(Full::new(r.body));
    *out.status_mut() = StatusCode::from_u16(r.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    out.headers_mut().insert(header::CONTENT_TYPE, header::HeaderValue::from_static(r.content_type));
    out
}

/// Accept connections forever.
pub async fn serve(listener: TcpListener, handler: Arc<dyn Handler>, limits: Limits) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let limits = Arc::new(limits);
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let Ok(permit) = Arc::clone(&slots).try_acquire_owned() else {
                    debug!("http {peer}: connection limit reached, closed");
                    drop(stream);
                    continue;
                };
                let handler = Arc::clone(&handler);
                let limits = Arc::clone(&limits);
                tokio::spawn(async move {
                    let service = {
                        let limits = Arc::clone(&limits);
                        service_fn(move |req| {
                            let r = respond(handler.as_ref(), &limits, &req);
                            async move { Ok::<_, Infallible>(r) }
                        })
                    };
                    let conn = http1::Builder::new()
                        .timer(TokioTimer::new())
                        .header_read_timeout(limits.head_deadline)
                        .max_buf_size(MAX_REQUEST)
                        .keep_alive(false)
                        .serve_connection(TokioIo::new(stream), service);
                    match tokio::time::timeout(limits.request_deadline, conn).await {
                        Ok(Ok(())) => {}
                        Ok(Err(e)) => debug!("http {peer}: {e}"),
                        Err(_) => debug!("http {peer}: request deadline passed, closed"),
                    }
                    drop(permit);
                });
            }
            Err(e) => {
                debug!("http accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// Largest response body [`get`] reads (a scrape of the largest table is a
/// few MB).
const MAX_BODY: u64 = 256 * 1024 * 1024;

/// Blocking GET for the CLI (`observer status`, `path check --observed`)
/// and the tests: returns the body of a 200 (ureq: chunked bodies, status
/// handling and timeouts done right).
pub fn get(addr: &str, path: &str) -> Result<Vec<u8>, String> {
    let agent: ureq::Agent = ureq::Agent::config_builder().timeout_global(Some(Duration::from_secs(10))).build().into();
    let url = format!("http://{addr}{path}");
    match agent.get(&url).call() {
        Ok(mut r) => {
            r.body_mut().with_config().limit(MAX_BODY).read_to_vec().map_err(|e| format!("reading {url}: {e}"))
        }
        Err(ureq::Error::StatusCode(code)) => Err(format!("{addr}{path} answered {code}")),
        Err(ureq::Error::Io(e)) => Err(format!(
            "cannot reach the observer daemon at {addr}: {e}; is `observer run` running (see --metrics-addr)?"
        )),
        Err(e) => Err(format!(
            "cannot reach the observer daemon at {addr}: {e}; is `observer run` running (see --metrics-addr)?"
        )),
    }
}

#[cfg(test)]
mod tests;

//! The daemon's HTTP endpoint: `GET /api/v1/destinations` (JSON table),
//! `GET /metrics` (Prometheus) and `GET /healthz`. A deliberately small
//! HTTP/1.1 server: GET only, one request per connection, and bounded in
//! every way a client could use against it:
//! - at most [`Limits::max_connections`] connections at once (the rest are
//!   closed at accept);
//! - the whole request head within [`Limits::head_deadline`] (not per read:
//!   a client trickling one byte at a time is closed when it runs out);
//! - at most [`MAX_REQUEST`] bytes of head;
//! - a `Host` header that is an IP literal, `localhost`, this machine's
//!   name or an `--allowed-host`, else 421 (DNS rebinding: a web page on a
//!   name the attacker controls cannot read the table).

use std::{sync::Arc, time::Duration};

use log::debug;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

/// Longest request head accepted.
pub const MAX_REQUEST: usize = 16 * 1024;

/// What the server allows a client.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections served at once; more are closed at accept.
    pub max_connections: usize,
    /// Time for the whole request head.
    pub head_deadline: Duration,
    /// Host names accepted besides IP literals, `localhost` and this
    /// machine's name (lower case, without port).
    pub allowed_hosts: Vec<String>,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_connections: 1024, head_deadline: Duration::from_secs(5), allowed_hosts: Vec::new() }
    }
}

/// A response: status, content type, body.
pub struct Response {
    pub status: u16,
    pub content_type: &'static str,
    pub body: Vec<u8>,
}

impl Response {
    #[must_use]
    pub fn json(body: Vec<u8>) -> Self {
        Self { status: 200, content_type: "application/json", body }
    }

    #[must_use]
    pub fn text(status: u16, body: impl Into<String>) -> Self {
        Self { status, content_type: "text/plain; charset=utf-8", body: body.into().into_bytes() }
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
                    if let Err(e) = handle(stream, handler.as_ref(), &limits).await {
                        debug!("http {peer}: {e}");
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

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        405 => "Method Not Allowed",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        503 => "Service Unavailable",
        _ => "Error",
    }
}

/// Read the request head, all of it within the deadline.
async fn read_head(stream: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let n = stream.read(&mut chunk).await?;
        if n == 0 {
            return Ok(None);
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            buf.truncate(p);
            return Ok(Some(buf));
        }
        if buf.len() > MAX_REQUEST {
            return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "request head too large"));
        }
    }
}

async fn handle(mut stream: TcpStream, handler: &dyn Handler, limits: &Limits) -> std::io::Result<()> {
    let head = match tokio::time::timeout(limits.head_deadline, read_head(&mut stream)).await {
        Err(_) => return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, "request head deadline passed")),
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::InvalidData => {
            return write(&mut stream, &Response::text(431, "request too large\n")).await;
        }
        Ok(Err(e)) => return Err(e),
        Ok(Ok(None)) => return Ok(()),
        Ok(Ok(Some(h))) => h,
    };
    let head = String::from_utf8_lossy(&head);
    let mut lines = head.lines();
    let mut parts = lines.next().unwrap_or_default().split_whitespace();
    let (method, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let host = lines.find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim().eq_ignore_ascii_case("host").then(|| v.trim().to_owned())
    });
    let response = if host.as_deref().is_some_and(|h| !host_allowed(h, &limits.allowed_hosts)) {
        Response::text(421, "unknown Host; use an IP address, localhost, or run with --allowed-host NAME\n")
    } else if method == "GET" {
        handler.get(target.split('?').next().unwrap_or_default())
    } else {
        Response::text(405, "only GET is served\n")
    };
    tokio::time::timeout(limits.head_deadline, write(&mut stream, &response))
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "response write deadline passed"))?
}

async fn write(stream: &mut TcpStream, r: &Response) -> std::io::Result<()> {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        r.status,
        reason(r.status),
        r.content_type,
        r.body.len()
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&r.body).await?;
    stream.shutdown().await
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

//! The daemon's HTTP endpoint: `GET /api/v1/destinations` (JSON table) and
//! `GET /metrics` (Prometheus). A deliberately small HTTP/1.1 server: GET
//! only, one request per connection, bounded request size and time.

use std::{sync::Arc, time::Duration};

use log::debug;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::{TcpListener, TcpStream},
};

/// Longest request head accepted.
const MAX_REQUEST: usize = 16 * 1024;
/// Time a client gets to send its request.
const READ_TIMEOUT: Duration = Duration::from_secs(5);

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

/// Accept connections forever.
pub async fn serve(listener: TcpListener, handler: Arc<dyn Handler>) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let handler = Arc::clone(&handler);
                tokio::spawn(async move {
                    if let Err(e) = handle(stream, handler.as_ref()).await {
                        debug!("http {peer}: {e}");
                    }
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
        431 => "Request Header Fields Too Large",
        _ => "Error",
    }
}

async fn handle(mut stream: TcpStream, handler: &dyn Handler) -> std::io::Result<()> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    let head_end = loop {
        let n = tokio::time::timeout(READ_TIMEOUT, stream.read(&mut chunk))
            .await
            .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "request timed out"))??;
        if n == 0 {
            return Ok(());
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(p) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        if buf.len() > MAX_REQUEST {
            return write(&mut stream, &Response::text(431, "request too large\n")).await;
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]);
    let mut parts = head.lines().next().unwrap_or_default().split_whitespace();
    let (method, target) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    let response = if method == "GET" {
        handler.get(target.split('?').next().unwrap_or_default())
    } else {
        Response::text(405, "only GET is served\n")
    };
    write(&mut stream, &response).await
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

/// Blocking GET for the CLI (`observer status`): returns the body of a 200.
pub fn get(addr: &str, path: &str) -> Result<Vec<u8>, String> {
    use std::io::{Read as _, Write as _};
    let mut s = std::net::TcpStream::connect(addr).map_err(|e| {
        format!("cannot reach the observer daemon at {addr}: {e}; is `observer run` running (see --metrics-addr)?")
    })?;
    s.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| e.to_string())?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").map_err(|e| e.to_string())?;
    let mut raw = Vec::new();
    s.read_to_end(&mut raw).map_err(|e| format!("reading from {addr}: {e}"))?;
    let end = raw.windows(4).position(|w| w == b"\r\n\r\n").ok_or_else(|| format!("{addr} sent no HTTP response"))?;
    let head = String::from_utf8_lossy(&raw[..end]);
    let status = head.split_whitespace().nth(1).unwrap_or_default();
    if status != "200" {
        return Err(format!("{addr}{path} answered {}", head.lines().next().unwrap_or_default()));
    }
    Ok(raw[end + 4..].to_vec())
}

#[cfg(test)]
mod tests;

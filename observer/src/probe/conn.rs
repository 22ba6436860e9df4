//! One probe connection: opened the way a pool opens one (the first
//! exchange of [`First`]), then left idle with one TCP keep-alive probe
//! planned at its age, and watched until the path answers. Plain blocking
//! sockets and `TCP_INFO`: no eBPF, no root.
//!
//! What each answer means follows the socket, not a timer of ours:
//! - `read` returns 0: the peer's FIN arrived (a hop closed the idle
//!   connection);
//! - `ECONNRESET` before the probe: a hop reset it by itself; after the
//!   probe: the probe was answered with a reset (the flow was gone);
//! - `ETIMEDOUT`: the kernel's keep-alive probes went unanswered;
//! - an ACK received after the probe was sent (`tcpi_last_ack_recv`): the
//!   probe was answered, the flow was alive at that age.

use std::{
    io::{self, Read, Write},
    net::{SocketAddr, TcpStream},
    os::fd::AsRawFd as _,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use rustls::{pki_types::ServerName, ClientConnection, StreamOwned};

use super::search::{millis, Close, Outcome};

/// Connect and first-exchange deadline.
const OPEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Keep-alive probes after the first, one second apart: a flow is dead
/// when `KEEPALIVE_COUNT` probes in a row go unanswered.
const KEEPALIVE_COUNT: u32 = 3;
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(1);
/// `TCP_KEEPIDLE`'s largest value (9 h): keep-alive armed, never firing
/// by itself within `--up-to` (at most 2 h).
const KEEPIDLE_MAX: u32 = 32_767;
/// An ACK must be this much younger than the idle time to be new (the
/// last one before the probe is as old as the idle time, at least half a
/// second, the shortest age planned).
const ACK_MARGIN: Duration = Duration::from_millis(200);
/// A jiffy and more (10 ms at 100 Hz, 4 ms at 250 Hz): how late the
/// kernel's timer may send the probe after we ask, and how coarse
/// `tcpi_last_ack_recv` is.
const JIFFY_SLACK: Duration = Duration::from_millis(20);
/// How often a waiting connection looks at its socket.
const POLL: Duration = Duration::from_millis(100);
/// Bytes this close before a FIN or RST are part of the close.
const CLOSING_BYTES: Duration = Duration::from_secs(1);
/// A user's request is answered whole when nothing follows for this long.
const QUIET: Duration = Duration::from_millis(300);
/// Response bytes read at most, per first exchange.
const MAX_RESPONSE: usize = 1 << 20;

/// The first exchange, which brings a connection into the state of a
/// pool's idle connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum First {
    /// The handshake only: TCP's, and TLS's with `Target::tls`.
    Handshake,
    /// An HTTP/1.1 `GET` of this path with `Host`, its response read whole.
    Http(String),
    /// These bytes, then whatever the server answers until it is quiet.
    Request(Vec<u8>),
}

/// Where and how to open each connection.
#[derive(Debug, Clone)]
pub struct Target {
    pub addr: SocketAddr,
    /// The name sent as SNI and `Host` (an address sends no SNI).
    pub name: String,
    pub tls: Option<Arc<rustls::ClientConfig>>,
    pub first: First,
    /// Where each connection is announced to a daemon that starts during
    /// the probe ([`super::announce`]); `None`: nowhere.
    pub announce: Option<Arc<super::announce::Announcer>>,
}

impl Target {
    /// How the first exchange is named in the output: `tcp`, `tls`,
    /// `http`, `https`, `request` or `tls+request`.
    #[must_use]
    pub fn exchange_name(&self) -> &'static str {
        match (&self.first, self.tls.is_some()) {
            (First::Handshake, false) => "tcp",
            (First::Handshake, true) => "tls",
            (First::Http(_), false) => "http",
            (First::Http(_), true) => "https",
            (First::Request(_), false) => "request",
            (First::Request(_), true) => "tls+request",
        }
    }
}

/// Why a connection could not be used.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("connecting to {0}: {1}")]
    Connect(SocketAddr, io::Error),
    #[error("the TLS handshake: {0}")]
    Tls(String),
    #[error("the first exchange: {0}")]
    Exchange(io::Error),
    #[error("the server closes after one response ({0}): a pool cannot keep it, there is nothing to measure")]
    NotReusable(&'static str),
    #[error("starting a connection's thread: {0}")]
    Thread(String),
}

/// An open connection after its first exchange.
pub struct Opened {
    sock: TcpStream,
    /// When the last byte arrived: the keep-alive's idle clock starts there.
    last_rx: Instant,
}

/// Open one connection and make its first exchange.
pub fn open(target: &Target) -> Result<Opened, OpenError> {
    let sock =
        TcpStream::connect_timeout(&target.addr, OPEN_TIMEOUT).map_err(|e| OpenError::Connect(target.addr, e))?;
    if let (Some(a), Ok(local), Ok(remote)) = (&target.announce, sock.local_addr(), sock.peer_addr()) {
        a.add(local, remote);
    }
    let mut last_rx = Instant::now();
    sock.set_read_timeout(Some(OPEN_TIMEOUT)).map_err(OpenError::Exchange)?;
    sock.set_write_timeout(Some(OPEN_TIMEOUT)).map_err(OpenError::Exchange)?;
    let sock = if let Some(config) = &target.tls {
        let name = ServerName::try_from(target.name.clone()).map_err(|e| OpenError::Tls(e.to_string()))?;
        let conn = ClientConnection::new(Arc::clone(config), name).map_err(|e| OpenError::Tls(e.to_string()))?;
        let mut tls = StreamOwned::new(conn, sock);
        while tls.conn.is_handshaking() {
            tls.conn.complete_io(&mut tls.sock).map_err(|e| OpenError::Tls(e.to_string()))?;
        }
        last_rx = Instant::now();
        if let Some(at) = exchange(&mut tls, target)? {
            last_rx = at;
        }
        tls.sock
    } else {
        let mut sock = sock;
        if let Some(at) = exchange(&mut sock, target)? {
            last_rx = at;
        }
        sock
    };
    sock.set_read_timeout(None).map_err(OpenError::Exchange)?;
    Ok(Opened { sock, last_rx })
}

/// A byte stream over one TCP socket, plain or TLS.
trait Wire: Read + Write {
    fn tcp(&self) -> &TcpStream;
}

impl Wire for TcpStream {
    fn tcp(&self) -> &TcpStream {
        self
    }
}

impl Wire for StreamOwned<ClientConnection, TcpStream> {
    fn tcp(&self) -> &TcpStream {
        &self.sock
    }
}

/// The first exchange on `stream`; when its last byte was received.
fn exchange(stream: &mut impl Wire, target: &Target) -> Result<Option<Instant>, OpenError> {
    match &target.first {
        First::Handshake => Ok(None),
        First::Http(path) => {
            let request = format!(
                "GET {path} HTTP/1.1\r\nHost: {}\r\nUser-Agent: observer-probe/{}\r\nAccept: */*\r\n\r\n",
                host_header(target),
                env!("CARGO_PKG_VERSION")
            );
            stream.write_all(request.as_bytes()).map_err(OpenError::Exchange)?;
            stream.flush().map_err(OpenError::Exchange)?;
            read_http_response(stream).map(Some)
        }
        First::Request(bytes) => {
            stream.write_all(bytes).map_err(OpenError::Exchange)?;
            stream.flush().map_err(OpenError::Exchange)?;
            read_until_quiet(stream).map(Some)
        }
    }
}

/// `Host`: the name, with the port unless it is the scheme's default.
fn host_header(target: &Target) -> String {
    let port = target.addr.port();
    let default = if target.tls.is_some() { 443 } else { 80 };
    let name = if target.name.contains(':') { format!("[{}]", target.name) } else { target.name.clone() };
    if port == default {
        name
    } else {
        format!("{name}:{port}")
    }
}

/// Read one HTTP/1.1 response whole (headers, then a `Content-Length` or
/// chunked body). A response the server ends by closing cannot be pooled.
fn read_http_response(stream: &mut impl Read) -> Result<Instant, OpenError> {
    let mut buf = Vec::new();
    let head_end = loop {
        if let Some(i) = find(&buf, b"\r\n\r\n") {
            break i + 4;
        }
        read_more(stream, &mut buf)?;
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
    let header = |name: &str| {
        head.lines().find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(':')).map(|v| v.trim().to_owned()))
    };
    if header("connection").is_some_and(|v| v.split(',').any(|t| t.trim() == "close")) {
        return Err(OpenError::NotReusable("Connection: close"));
    }
    let status: u16 = head.split_whitespace().nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    if matches!(status, 100..=199 | 204 | 304) {
        return Ok(Instant::now());
    }
    if header("transfer-encoding").is_some_and(|v| v.contains("chunked")) {
        while find(&buf[head_end..], b"0\r\n\r\n").is_none() {
            read_more(stream, &mut buf)?;
        }
        return Ok(Instant::now());
    }
    let Some(length) = header("content-length").and_then(|v| v.parse::<usize>().ok()) else {
        return Err(OpenError::NotReusable("a body without Content-Length, ended by the close"));
    };
    while buf.len() < head_end.saturating_add(length) {
        read_more(stream, &mut buf)?;
    }
    Ok(Instant::now())
}

/// The answer to a user's request: read until the server is quiet for
/// [`QUIET`] after its first bytes.
fn read_until_quiet(stream: &mut impl Wire) -> Result<Instant, OpenError> {
    let mut buf = Vec::new();
    read_more(stream, &mut buf)?;
    let mut last = Instant::now();
    let quiet = last;
    let mut chunk = [0u8; 4096];
    while quiet.elapsed() < OPEN_TIMEOUT && buf.len() < MAX_RESPONSE {
        // A short wait for more: the answer is whole when nothing follows.
        stream.tcp().set_read_timeout(Some(QUIET)).map_err(OpenError::Exchange)?;
        let got = stream.read(&mut chunk);
        stream.tcp().set_read_timeout(Some(OPEN_TIMEOUT)).map_err(OpenError::Exchange)?;
        match got {
            Ok(0) => return Err(OpenError::NotReusable("the server closed after its answer")),
            Ok(n) => {
                buf.extend_from_slice(&chunk[..n]);
                last = Instant::now();
            }
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => return Ok(last),
            Err(e) => return Err(OpenError::Exchange(e)),
        }
    }
    Ok(last)
}

fn read_more(stream: &mut impl Read, buf: &mut Vec<u8>) -> Result<(), OpenError> {
    if buf.len() >= MAX_RESPONSE {
        return Err(OpenError::Exchange(io::Error::other(format!("a response over {MAX_RESPONSE} bytes"))));
    }
    let mut chunk = [0u8; 8192];
    match stream.read(&mut chunk) {
        Ok(0) => Err(OpenError::NotReusable("the server closed during its response")),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(())
        }
        Err(e) => Err(OpenError::Exchange(e)),
    }
}

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).position(|w| w == needle)
}

/// Leave the connection idle and send one keep-alive probe at `age`
/// seconds of idleness, then watch it until the path answers or `cancel`
/// is set.
///
/// The probe leaves when we say, not when the kernel's keep-alive timer
/// fires: that timer sits on the timer wheel, which fires long timers late
/// (planned at 20, 44 and 134 s, answered at 21.6, 44.1 and 138.3 s here),
/// so a probe planned at 44 s found a 45 s conntrack timeout's flow gone
/// while data at 44.8 s still passed. Keep-alive is armed with the longest idle time (9 h); at the
/// planned age, lowering `TCP_KEEPIDLE` below the idle time already spent
/// makes the kernel send the probe at once.
#[must_use]
pub fn watch(opened: Opened, age: f64, cancel: &AtomicBool) -> Outcome {
    let Opened { mut sock, mut last_rx } = opened;
    let probe_at = Duration::from_secs_f64(age.max(0.0));
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(u64::from(KEEPIDLE_MAX)))
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_COUNT);
    if socket2::SockRef::from(&sock).set_tcp_keepalive(&keepalive).is_err() {
        return Outcome::Failed;
    }
    let mut buf = [0u8; 4096];
    // Bytes just before a close belong to it (a TLS close_notify, a
    // server's goodbye message): the close's age counts from the byte
    // before them.
    let mut before_burst = last_rx;
    // When the probe was sent, as idle ages: not before `.0` (we asked
    // for it then) and not after `.1` (the kernel's timer runs within a
    // jiffy of the ask). "Alive" claims the earlier, "gone" the later.
    let mut sent: Option<(Duration, Duration)> = None;
    loop {
        if cancel.load(Ordering::Relaxed) {
            return Outcome::Cancelled;
        }
        let wait = match sent {
            Some(_) => POLL,
            None => probe_at.saturating_sub(last_rx.elapsed()).min(POLL),
        };
        let ready = readable(&sock, wait);
        // After the wait: the age at which the close or answer was seen.
        let idle = last_rx.elapsed();
        let close_age = ms(if idle < CLOSING_BYTES { before_burst.elapsed() } else { idle });
        match ready {
            Err(_) => return Outcome::Failed,
            Ok(false) => {}
            Ok(true) => match sock.read(&mut buf) {
                Ok(0) => return Outcome::Closed { close: Close::Fin, at_seconds: close_age },
                // Late bytes (a TLS session ticket) before the probe: the
                // idle clock starts again.
                Ok(_) if sent.is_none() => {
                    if idle >= CLOSING_BYTES {
                        before_burst = last_rx;
                    }
                    last_rx = Instant::now();
                    continue;
                }
                // Bytes after the probe answer it as well as an ACK would.
                Ok(_) => return Outcome::Alive { at_seconds: ms(sent.map_or(idle, |(asked, _)| asked)) },
                Err(e) => {
                    return match (e.raw_os_error(), sent) {
                        // The reset answered the probe.
                        (Some(libc::ECONNRESET), Some((_, by))) => Outcome::Dead { reset: true, at_seconds: ms(by) },
                        (Some(libc::ECONNRESET), None) => Outcome::Closed { close: Close::Rst, at_seconds: close_age },
                        // KEEPALIVE_COUNT probes went unanswered.
                        (Some(libc::ETIMEDOUT), Some((_, by))) => Outcome::Dead { reset: false, at_seconds: ms(by) },
                        _ if e.kind() == io::ErrorKind::Interrupted => continue,
                        _ => Outcome::Failed,
                    };
                }
            },
        }
        match sent {
            None if idle >= probe_at => {
                let asked = last_rx.elapsed();
                if set_keepidle(&sock, 1).is_err() {
                    return Outcome::Failed;
                }
                sent = Some((asked, last_rx.elapsed() + JIFFY_SLACK));
            }
            None => {}
            Some((asked, _)) => {
                let since = idle.saturating_sub(asked);
                // An ACK that arrived after the probe was asked for answers it.
                if tcp_ack_age(&sock).is_some_and(|ack| ack <= since + JIFFY_SLACK && ack + ACK_MARGIN < idle) {
                    return Outcome::Alive { at_seconds: ms(asked) };
                }
                // The kernel ends an unanswered probe in KEEPALIVE_COUNT
                // intervals; far past that, something else holds the socket.
                if since > KEEPALIVE_INTERVAL * (KEEPALIVE_COUNT + 30) {
                    return Outcome::Failed;
                }
            }
        }
    }
}

/// Seconds, to the millisecond (the clocks here are no finer).
fn ms(d: Duration) -> f64 {
    millis(d.as_secs_f64())
}

/// `TCP_KEEPIDLE` in seconds: below the idle time already spent, the
/// kernel sends a probe at once.
fn set_keepidle(sock: &TcpStream, secs: i32) -> io::Result<()> {
    // SAFETY: setsockopt reads one int from the pointer we pass.
    let r = unsafe {
        libc::setsockopt(
            sock.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_KEEPIDLE,
            (&raw const secs).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<i32>()).map_err(io::Error::other)?,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether the socket has something to read (or an error) within `wait`.
fn readable(sock: &TcpStream, wait: Duration) -> io::Result<bool> {
    let mut fd = libc::pollfd { fd: sock.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    let ms = i32::try_from(wait.as_millis()).unwrap_or(i32::MAX);
    // SAFETY: one valid pollfd for the duration of the call.
    let n = unsafe { libc::poll(&raw mut fd, 1, ms) };
    match n {
        n if n < 0 => {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                Ok(false)
            } else {
                Err(e)
            }
        }
        0 => Ok(false),
        _ => Ok(true),
    }
}

/// How long ago the socket last received an ACK (`tcpi_last_ack_recv`).
fn tcp_ack_age(sock: &TcpStream) -> Option<Duration> {
    // SAFETY: tcp_info is plain data; zeroed is a valid value.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = libc::socklen_t::try_from(std::mem::size_of::<libc::tcp_info>()).ok()?;
    // SAFETY: getsockopt writes at most `len` bytes into `info`.
    let r = unsafe {
        libc::getsockopt(sock.as_raw_fd(), libc::IPPROTO_TCP, libc::TCP_INFO, (&raw mut info).cast(), &raw mut len)
    };
    (r == 0).then(|| Duration::from_millis(u64::from(info.tcpi_last_ack_recv)))
}

#[cfg(test)]
mod tests {
    use std::io::Cursor;

    use super::{read_http_response, OpenError};

    fn read(response: &str) -> Result<(), OpenError> {
        let mut c = Cursor::new(response.as_bytes().to_vec());
        read_http_response(&mut c).map(|_| ())
    }

    #[test]
    fn a_response_is_read_whole_by_its_length_or_its_chunks() {
        assert!(read("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n").is_ok());
        assert!(read("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nok\n\r\n0\r\n\r\n").is_ok());
        assert!(read("HTTP/1.1 204 No Content\r\n\r\n").is_ok());
        // A body shorter than its length: the server closed mid-response.
        assert!(matches!(
            read("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nok\n"),
            Err(OpenError::NotReusable("the server closed during its response"))
        ));
    }

    #[test]
    fn a_response_a_pool_cannot_keep_is_refused_with_the_reason() {
        for (response, why) in [
            ("HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", "Connection: close"),
            ("HTTP/1.1 200 OK\r\nconnection: keep-alive, Close\r\nContent-Length: 0\r\n\r\n", "Connection: close"),
            ("HTTP/1.1 200 OK\r\n\r\nbody until the close", "a body without Content-Length, ended by the close"),
        ] {
            match read(response) {
                Err(OpenError::NotReusable(r)) => assert_eq!(r, why, "{response:?}"),
                other => panic!("{response:?}: {other:?}"),
            }
        }
    }
}

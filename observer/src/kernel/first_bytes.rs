//! The name a client used, from the first bytes of its connection: the SNI
//! `server_name` of a TLS `ClientHello`, or the `Host` header of a plaintext
//! HTTP/1.x request. The send probe hands over at most [`HELLO_BYTES`] of a
//! client connection's first write, and only when they start like one of
//! the two; the bytes are parsed here and dropped at once (never stored,
//! recorded or logged).
//!
//! The same bytes tell the application protocol where they can
//! ([`protocol`]): the HTTP/2 connection preface (`h2c`, gRPC without
//! TLS), an HTTP/1.x request line, or a `ClientHello` whose ALPN offers
//! only `h2` (gRPC clients) or only HTTP/1.x. A `ClientHello` offering both
//! leaves the choice to the server: no protocol is told.
//!
//! No false name is the rule: a parse that runs out of bytes, meets a
//! malformed length, or finds something that is not a host name gives
//! `None`. Requests meant for a proxy (`CONNECT`, an absolute URI) are
//! skipped: their host is not the row's destination. IP literals are no
//! names (the row already carries the address).

use observer_common::HELLO_BYTES;

use crate::named::named;

named! {
    /// Where a name came from.
    pub enum NameSource {
        /// TLS `ClientHello` `server_name` extension.
        Sni => "sni",
        /// HTTP/1.x `Host` header.
        Host => "host",
    }
}

named! {
    /// The TLS version a connection negotiated, told by the client's second
    /// flight (`observer_common::tls`).
    pub enum TlsVersion {
        Tls10 => "TLSv1.0",
        Tls11 => "TLSv1.1",
        Tls12 => "TLSv1.2",
        Tls13 => "TLSv1.3",
    }
}

impl TlsVersion {
    /// From the probes' number (1 = TLS 1.0 … 4 = TLS 1.3; 0: none).
    #[must_use]
    pub const fn of_wire(v: u8) -> Option<Self> {
        match v {
            1 => Some(Self::Tls10),
            2 => Some(Self::Tls11),
            3 => Some(Self::Tls12),
            4 => Some(Self::Tls13),
            _ => None,
        }
    }
}

named! {
    /// The application protocol a connection's first bytes show.
    pub enum Protocol {
        /// HTTP/1.x: a request line, or TLS offering only HTTP/1.x by ALPN.
        Http1 => "http1",
        /// HTTP/2: the cleartext connection preface, or TLS offering only
        /// `h2` by ALPN.
        H2 => "h2",
        /// HTTP, its version the server's pick: TLS offering both `h2` and
        /// HTTP/1.x by ALPN (Go's `net/http`, `OkHttp`, browsers).
        Http => "http",
    }
}

/// The HTTP/2 connection preface (RFC 9113 3.4).
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The protocol a connection's first bytes show, where they tell it.
#[must_use]
pub fn protocol(bytes: &[u8]) -> Option<Protocol> {
    let bytes = &bytes[..bytes.len().min(HELLO_BYTES)];
    match bytes.first()? {
        0x16 => {
            let offered = alpn(bytes)?;
            if offered.is_empty() {
                None
            } else if offered.iter().all(|p| *p == b"h2") {
                Some(Protocol::H2)
            } else if offered.iter().all(|p| p.starts_with(b"http/1.")) {
                Some(Protocol::Http1)
            } else if offered.iter().all(|p| *p == b"h2" || p.starts_with(b"http/1.")) {
                Some(Protocol::Http)
            } else {
                None
            }
        }
        _ if bytes.starts_with(H2_PREFACE) => Some(Protocol::H2),
        b'A'..=b'Z' => request_line(bytes).map(|_| Protocol::Http1),
        _ => None,
    }
}

/// The host name in a connection's first bytes, lower-cased, with its source.
#[must_use]
pub fn server_name(bytes: &[u8]) -> Option<(String, NameSource)> {
    let bytes = &bytes[..bytes.len().min(HELLO_BYTES)];
    match bytes.first()? {
        0x16 => sni(bytes).map(|n| (n, NameSource::Sni)),
        b'A'..=b'Z' => http_host(bytes).map(|n| (n, NameSource::Host)),
        _ => None,
    }
}

/// A bounds-checked reader over a byte slice.
struct Reader<'a> {
    b: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if n > self.b.len() {
            return None;
        }
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Some(head)
    }

    fn u8(&mut self) -> Option<usize> {
        self.take(1).map(|b| usize::from(b[0]))
    }

    fn u16(&mut self) -> Option<usize> {
        self.take(2).map(|b| usize::from(u16::from_be_bytes([b[0], b[1]])))
    }

    fn u24(&mut self) -> Option<usize> {
        self.take(3).map(|b| (usize::from(b[0]) << 16) | (usize::from(b[1]) << 8) | usize::from(b[2]))
    }

    /// A sub-reader of `n` bytes; if fewer are left (a truncated capture),
    /// the rest, so that fields wholly inside it can still be read.
    fn sub(&mut self, n: usize) -> Reader<'a> {
        let n = n.min(self.b.len());
        let (head, rest) = self.b.split_at(n);
        self.b = rest;
        Reader { b: head }
    }
}

/// The extensions of a TLS record holding a `ClientHello` (RFC 8446
/// 4.1.2): a reader over them (cut short where the capture is).
fn extensions(bytes: &[u8]) -> Option<Reader<'_>> {
    let mut r = Reader { b: bytes };
    // Record: type 22 (handshake), legacy version 3.x, length.
    r.u8().filter(|&t| t == 0x16)?;
    r.u8().filter(|&major| major == 3)?;
    r.u8().filter(|&minor| minor <= 4)?;
    let record_len = r.u16().filter(|&l| (4..=16_384 + 256).contains(&l))?;
    let mut rec = r.sub(record_len);
    // Handshake: type 1 (ClientHello), length.
    rec.u8().filter(|&t| t == 1)?;
    let hello_len = rec.u24()?;
    let mut h = rec.sub(hello_len);
    h.u16().filter(|&v| (0x0300..=0x0304).contains(&v))?;
    h.take(32)?;
    let sid = h.u8().filter(|&l| l <= 32)?;
    h.take(sid)?;
    let suites = h.u16().filter(|&l| l >= 2 && l % 2 == 0)?;
    h.take(suites)?;
    let comp = h.u8().filter(|&l| l >= 1)?;
    h.take(comp)?;
    let ext_len = h.u16()?;
    Some(h.sub(ext_len))
}

/// The body of extension `want`, if it is in the capture whole.
fn extension(bytes: &[u8], want: usize) -> Option<&[u8]> {
    let mut exts = extensions(bytes)?;
    loop {
        let ty = exts.u16()?;
        let len = exts.u16()?;
        let body = exts.take(len)?;
        if ty == want {
            return Some(body);
        }
    }
}

/// The protocols a `ClientHello` offers by ALPN (RFC 7301 3.1), if it
/// carries the extension whole.
fn alpn(bytes: &[u8]) -> Option<Vec<&[u8]>> {
    let mut ext = Reader { b: extension(bytes, 16)? };
    let list_len = ext.u16()?;
    let mut list = Reader { b: ext.take(list_len)? };
    let mut out = Vec::new();
    while !list.b.is_empty() {
        let len = list.u8()?;
        out.push(list.take(len)?);
    }
    Some(out)
}

/// SNI from a TLS record holding a `ClientHello` (RFC 6066 3).
fn sni(bytes: &[u8]) -> Option<String> {
    let mut ext = Reader { b: extension(bytes, 0)? };
    let list_len = ext.u16()?;
    let mut list = Reader { b: ext.take(list_len)? };
    while !list.b.is_empty() {
        let name_type = list.u8()?;
        let name_len = list.u16()?;
        let name = list.take(name_len)?;
        if name_type == 0 {
            return host_name(name);
        }
    }
    None
}

/// Methods whose `Host` names the origin the connection goes to.
const METHODS: &[&[u8]] = &[b"GET", b"POST", b"PUT", b"HEAD", b"DELETE", b"OPTIONS", b"PATCH", b"TRACE"];

/// An HTTP/1.x request line (RFC 9112 3): its target and where the
/// headers start.
fn request_line(bytes: &[u8]) -> Option<(&[u8], usize)> {
    let line_end = find(bytes, b"\r\n")?;
    let line = &bytes[..line_end];
    let mut parts = line.split(|&b| b == b' ');
    let method = parts.next()?;
    let target = parts.next()?;
    let version = parts.next()?;
    if parts.next().is_some() || !METHODS.contains(&method) || !version.starts_with(b"HTTP/1.") {
        return None;
    }
    Some((target, line_end + 2))
}

/// `Host` of an HTTP/1.x request in origin form (RFC 9112 3.2).
fn http_host(bytes: &[u8]) -> Option<String> {
    let (target, headers) = request_line(bytes)?;
    // Origin form ("/path") or `OPTIONS *`: an absolute URI or `CONNECT`
    // goes to a proxy, whose name this is not.
    if !(target.starts_with(b"/") || target == b"*") {
        return None;
    }
    let mut rest = &bytes[headers..];
    loop {
        // A header counts only whole: its line must end inside the capture.
        let end = find(rest, b"\r\n")?;
        let header = &rest[..end];
        if header.is_empty() {
            return None;
        }
        if let Some(colon) = header.iter().position(|&b| b == b':') {
            if header[..colon].eq_ignore_ascii_case(b"host") {
                let value = header[colon + 1..].trim_ascii();
                return host_name(strip_port(value)?);
            }
        }
        rest = &rest[end + 2..];
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// `host[:port]` without the port; a bracketed IPv6 literal is no name.
fn strip_port(v: &[u8]) -> Option<&[u8]> {
    if v.first() == Some(&b'[') {
        return None;
    }
    match v.iter().position(|&b| b == b':') {
        Some(i) if v[i + 1..].iter().all(u8::is_ascii_digit) && i + 1 < v.len() => Some(&v[..i]),
        Some(_) => None,
        None => Some(v),
    }
}

/// A DNS host name (RFC 1123 labels; `_` allowed, as some internal names
/// carry it), lower-cased, without a trailing dot; not an IPv4 literal.
#[must_use]
pub fn host_name(b: &[u8]) -> Option<String> {
    let b = b.strip_suffix(b".").unwrap_or(b);
    if b.is_empty() || b.len() > 253 {
        return None;
    }
    for label in b.split(|&c| c == b'.') {
        let ok = !label.is_empty()
            && label.len() <= 63
            && label.iter().all(|&c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
            && label.first() != Some(&b'-')
            && label.last() != Some(&b'-');
        if !ok {
            return None;
        }
    }
    let s = std::str::from_utf8(b).ok()?.to_ascii_lowercase();
    if s.parse::<std::net::Ipv4Addr>().is_ok() {
        return None;
    }
    Some(s)
}

#[cfg(test)]
mod tests;

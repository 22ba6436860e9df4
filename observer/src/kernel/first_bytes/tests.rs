use proptest::prelude::*;

use super::*;

fn ext(ty: u16, body: &[u8]) -> Vec<u8> {
    let mut v = ty.to_be_bytes().to_vec();
    v.extend_from_slice(&u16::try_from(body.len()).unwrap().to_be_bytes());
    v.extend_from_slice(body);
    v
}

fn sni_ext(name: &[u8]) -> Vec<u8> {
    let mut entry = vec![0u8];
    entry.extend_from_slice(&u16::try_from(name.len()).unwrap().to_be_bytes());
    entry.extend_from_slice(name);
    let mut list = u16::try_from(entry.len()).unwrap().to_be_bytes().to_vec();
    list.extend_from_slice(&entry);
    ext(0, &list)
}

/// A `ClientHello` record as OpenSSL and Go write it: 32-byte session id,
/// a few suites, the given extensions.
fn client_hello(exts: &[Vec<u8>]) -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend_from_slice(&[7; 32]);
    body.push(32);
    body.extend_from_slice(&[9; 32]);
    body.extend_from_slice(&[0, 6, 0x13, 0x01, 0x13, 0x02, 0xc0, 0x2f]);
    body.extend_from_slice(&[1, 0]);
    let all: Vec<u8> = exts.concat();
    body.extend_from_slice(&u16::try_from(all.len()).unwrap().to_be_bytes());
    body.extend_from_slice(&all);
    let mut hs = vec![1];
    hs.extend_from_slice(&u32::try_from(body.len()).unwrap().to_be_bytes()[1..]);
    hs.extend_from_slice(&body);
    let mut rec = vec![0x16, 0x03, 0x01];
    rec.extend_from_slice(&u16::try_from(hs.len()).unwrap().to_be_bytes());
    rec.extend_from_slice(&hs);
    rec
}

fn named(s: &str, src: NameSource) -> (String, NameSource) {
    (s.to_owned(), src)
}

#[test]
fn sni_after_other_extensions() {
    let hello = client_hello(&[ext(0xff01, &[0]), ext(10, &[0, 4, 0, 29, 0, 23]), sni_ext(b"API.Partner.example")]);
    assert_eq!(server_name(&hello), Some(named("api.partner.example", NameSource::Sni)));
}

#[test]
fn hello_without_sni_has_no_name() {
    assert_eq!(server_name(&client_hello(&[ext(10, &[0, 2, 0, 29])])), None);
}

#[test]
fn sni_that_is_an_address_or_not_a_host_is_no_name() {
    for bad in [&b"10.1.2.3"[..], b"a..b", b"-x.example", b"x y", b"", b"caf\xc3\xa9.example"] {
        assert_eq!(server_name(&client_hello(&[sni_ext(bad)])), None, "{bad:?}");
    }
}

#[test]
fn a_truncated_hello_gives_its_name_only_when_whole() {
    let hello = client_hello(&[ext(10, &[0, 2, 0, 29]), sni_ext(b"db.internal.example")]);
    let name_end = hello.len();
    for cut in 0..name_end {
        let got = server_name(&hello[..cut]);
        assert_eq!(got, None, "cut at {cut} of {name_end}: a partial name must not be taken");
    }
    assert_eq!(server_name(&hello), Some(named("db.internal.example", NameSource::Sni)));
}

#[test]
fn server_hello_and_other_records_are_no_client_hello() {
    let mut server = client_hello(&[sni_ext(b"x.example")]);
    server[5] = 2;
    assert_eq!(server_name(&server), None);
    let mut alert = client_hello(&[sni_ext(b"x.example")]);
    alert[0] = 0x15;
    assert_eq!(server_name(&alert), None);
}

#[test]
fn host_header_of_an_origin_form_request() {
    let req = b"GET /v1/items?id=3 HTTP/1.1\r\nUser-Agent: t\r\nhost: Shop.Example:8080\r\nAccept: */*\r\n\r\n";
    assert_eq!(server_name(req), Some(named("shop.example", NameSource::Host)));
    let post = b"POST /x HTTP/1.0\r\nHost: a.b\r\n\r\nbody";
    assert_eq!(server_name(post), Some(named("a.b", NameSource::Host)));
}

#[test]
fn proxy_requests_and_cut_headers_are_skipped() {
    for req in [
        &b"CONNECT partner.example:443 HTTP/1.1\r\nHost: partner.example:443\r\n\r\n"[..],
        b"GET http://partner.example/ HTTP/1.1\r\nHost: partner.example\r\n\r\n",
        // The capture ends inside the Host line: "partner.ex" would be false.
        b"GET / HTTP/1.1\r\nHost: partner.ex",
        b"GET / HTTP/1.1\r\nAccept: */*\r\n\r\nHost: late.example\r\n",
        b"GET / HTTP/2.0\r\nHost: a.example\r\n\r\n",
        b"FOO / HTTP/1.1\r\nHost: a.example\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: 10.0.0.1:80\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: a.example:http\r\n\r\n",
    ] {
        assert_eq!(server_name(req), None, "{}", String::from_utf8_lossy(req));
    }
}

#[test]
fn binary_protocols_have_no_name() {
    // PostgreSQL StartupMessage, Redis RESP, a MySQL-ish packet.
    let pg = [0, 0, 0, 8, 4, 210, 22, 47];
    assert_eq!(server_name(&pg), None);
    assert_eq!(server_name(b"*1\r\n$4\r\nPING\r\n"), None);
    assert_eq!(server_name(&[0x16, 0x03, 0x01, 0x00, 0x00]), None);
}

#[test]
fn only_the_first_hello_bytes_count() {
    let mut req = b"GET / HTTP/1.1\r\nX-Pad: ".to_vec();
    req.extend(std::iter::repeat_n(b'a', HELLO_BYTES));
    req.extend_from_slice(b"\r\nHost: far.example\r\n\r\n");
    assert_eq!(server_name(&req), None, "a Host past the captured bytes is not read");
}

fn alpn_ext(protocols: &[&[u8]]) -> Vec<u8> {
    let mut list = Vec::new();
    for p in protocols {
        list.push(u8::try_from(p.len()).unwrap());
        list.extend_from_slice(p);
    }
    let mut body = u16::try_from(list.len()).unwrap().to_be_bytes().to_vec();
    body.extend_from_slice(&list);
    ext(16, &body)
}

#[test]
fn the_protocol_from_the_preface_the_request_line_or_alpn() {
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\x24\x04\0\0\0\0\0";
    assert_eq!(protocol(preface), Some(Protocol::H2));
    assert_eq!(server_name(preface), None, "the preface names nothing");
    assert_eq!(protocol(b"GET /x HTTP/1.1\r\nHost: a.example\r\n\r\n"), Some(Protocol::Http1));
    assert_eq!(protocol(b"CONNECT a.example:443 HTTP/1.1\r\n\r\n"), None, "not a method of ours");
    let grpc = client_hello(&[sni_ext(b"api.example"), alpn_ext(&[b"h2"])]);
    assert_eq!(protocol(&grpc), Some(Protocol::H2));
    assert_eq!(server_name(&grpc), Some(named("api.example", NameSource::Sni)));
    let h1 = client_hello(&[alpn_ext(&[b"http/1.1"])]);
    assert_eq!(protocol(&h1), Some(Protocol::Http1));
    // Go's net/http offers both: HTTP, its version the server's pick.
    assert_eq!(protocol(&client_hello(&[alpn_ext(&[b"h2", b"http/1.1"])])), Some(Protocol::Http));
    // Anything else offered beside them tells nothing.
    assert_eq!(protocol(&client_hello(&[alpn_ext(&[b"h2", b"spdy/3"])])), None);
    assert_eq!(protocol(&client_hello(&[sni_ext(b"a.example")])), None, "no ALPN");
    let cut = &grpc[..grpc.len() - 2];
    assert_eq!(protocol(cut), None, "an ALPN extension cut by the capture tells nothing");
    assert_eq!(protocol(&[0, 0, 0, 8, 4, 210, 22, 47]), None);
}

proptest! {
    #[test]
    fn any_bytes_parse_without_panic(bytes in proptest::collection::vec(any::<u8>(), 0..700)) {
        let _ = server_name(&bytes);
        let _ = protocol(&bytes);
    }

    #[test]
    fn a_name_found_is_the_name_sent(
        labels in proptest::collection::vec("[a-z][a-z0-9-]{0,10}[a-z0-9]", 1..5),
        cut in 0usize..400,
        pad in 0usize..100,
    ) {
        let name = labels.join(".");
        let hello = client_hello(&[ext(21, &vec![0; pad]), sni_ext(name.as_bytes())]);
        let got = server_name(&hello[..cut.min(hello.len())]);
        prop_assert!(got.is_none() || got == Some((name.clone(), NameSource::Sni)));
        let req = format!("GET /{} HTTP/1.1\r\nHost: {name}\r\n\r\n", "p".repeat(pad));
        let got = server_name(&req.as_bytes()[..cut.min(req.len())]);
        prop_assert!(got.is_none() || got == Some((name, NameSource::Host)));
    }
}

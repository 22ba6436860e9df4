//! Names and the fix in the client's words, end to end (root, real
//! kernel): the send probe hands a client connection's first bytes over
//! once, userspace reads the TLS SNI or the HTTP `Host` from them, and the
//! row, status, report, metrics and `path check` carry the name; the fix
//! names the setting of the client's runtime. Odd first writes give no
//! false name, and `--no-names` gives none at all.

mod common;

use std::{process::Command, time::Duration};

use anyhow::{ensure, Context as _, Result};
use common::{script, sh, start_nginx_with, start_server, Daemon, Topology, ECHO_SERVER, OBSERVER};
use observer::{
    diagnosis::aggregate::DestinationRow,
    kernel::event::{EventKind, Role},
};

/// A DNS server that knows one name (A record; every other question gets
/// NXDOMAIN, an AAAA question for the name an empty answer):
/// `python3 DNS ADDR PORT NAME IP`.
const DNS: &str = r#"
import socket, struct, sys
addr, port, name, ip = sys.argv[1], int(sys.argv[2]), sys.argv[3].lower(), sys.argv[4]
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
s.bind((addr, port))
print("ready", flush=True)
while True:
    q, peer = s.recvfrom(512)
    tid = struct.unpack(">H", q[:2])[0]
    i, labels = 12, []
    while q[i]:
        labels.append(q[i + 1:i + 1 + q[i]].decode().lower())
        i += 1 + q[i]
    qtype = struct.unpack(">H", q[i + 1:i + 3])[0]
    question = q[12:i + 5]
    hit = ".".join(labels) == name
    ans = b""
    if hit and qtype == 1:
        ans = b"\xc0\x0c" + struct.pack(">HHIH", 1, 1, 60, 4) + socket.inet_aton(ip)
    flags = 0x8180 | (0 if hit else 3)
    s.sendto(struct.pack(">HHHHHH", tid, flags, 1, 1 if ans else 0, 0, 0) + question + ans, peer)
"#;

/// Plain HTTP/1.1 requests with a `Host` header on one pooled connection
/// (reconnecting when the server closed it), GAPS seconds apart:
/// `python3 HOST_CLIENT IP PORT HOSTNAME GAPS`.
const HOST_CLIENT: &str = r#"
import http.client, sys, time
ip, port, name, gaps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
c = http.client.HTTPConnection(ip, port, timeout=5)
for g in gaps.split(","):
    time.sleep(float(g))
    for attempt in (1, 2):
        try:
            c.request("GET", "/", headers={"Host": name})
            c.getresponse().read()
            break
        except (ConnectionError, http.client.HTTPException):
            c.close()
            c = http.client.HTTPConnection(ip, port, timeout=5)
print("done", flush=True)
"#;

/// First writes that must not name anything falsely, one connection each
/// to PORT, PORT+1, ...: a TLS `ClientHello` split after 20 bytes, one cut
/// inside its SNI, a PostgreSQL startup message, and a 64 KiB HTTP request
/// (named `big.example` in its first bytes):
/// `python3 ODD_CLIENT IP PORT`.
const ODD_CLIENT: &str = r#"
import socket, ssl, struct, sys, time
ip, port = sys.argv[1], int(sys.argv[2])
def client_hello(name):
    inc, out = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ssl.create_default_context().wrap_bio(inc, out, server_hostname=name)
    try:
        obj.do_handshake()
    except ssl.SSLWantReadError:
        pass
    return out.read()
def send(p, parts):
    s = socket.create_connection((ip, p), timeout=5)
    for part in parts:
        s.sendall(part)
        time.sleep(0.2)
    time.sleep(0.3)
    s.close()
ch = client_hello("split.partner.example")
send(port, [ch[:20], ch[20:]])
ch2 = client_hello("cut.partner.example")
at = ch2.index(b"cut.partner.example") + 5
send(port + 1, [ch2[:at], ch2[at:]])
user = b"user\x00app\x00database\x00app\x00\x00"
send(port + 2, [struct.pack(">II", 8 + len(user), 196608) + user])
body = b"x" * 65536
send(port + 3, [b"POST /upload HTTP/1.1\r\nHost: big.example\r\nContent-Length: 65536\r\n\r\n" + body])
print("done", flush=True)
"#;

fn settle(daemon: &Daemon) -> Result<Vec<DestinationRow>> {
    daemon.caught_up(Duration::from_millis(1500), Duration::from_mins(1))?;
    daemon.status()
}

fn row<'a>(rows: &'a [DestinationRow], dest: &str) -> Result<&'a DestinationRow> {
    rows.iter()
        .find(|r| r.id.destination == dest && r.id.role == Role::Client)
        .with_context(|| format!("no client row for {dest}: {rows:#?}"))
}

/// A Go client with default settings (`http.DefaultTransport`'s pool)
/// reaches nginx over TLS by a host name its own resolver answers, behind a
/// 5 s keep-alive timeout: the row is named by the SNI, the report is
/// headed by it, the info metric and status show it, a path file naming the
/// hop by host name matches, and the fix names `IdleConnTimeout`, its 90 s
/// default, and the finding that it exceeds the path.
#[test]
#[ignore = "needs root and a 5.15+ kernel: run `cargo xtask test`"]
fn a_go_client_over_tls_is_named_by_its_sni() -> Result<()> {
    let topo = Topology::pair("ntls")?;
    let dir = tempfile::tempdir()?;
    sh(&format!("{} cert {}", common::tlstool()?.display(), dir.path().display()))?;
    let tls = format!("ssl; ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem", d = dir.path().display());
    let _nginx = start_nginx_with(&topo, dir.path(), 5, 8443, &tls)?;
    let dns = script(DNS)?;
    let name = "api.partner.example";
    let _dns = start_server(
        &topo.ns,
        topo.client,
        &format!("python3 -u {} 10.201.1.2 5353 {name} {}", dns.display(), topo.server_v4),
    )?;
    let data = tempfile::tempdir()?;
    let daemon = Daemon::start(&["--data-dir", data.path().to_str().context("path")?])?;
    // Reuses at 1.5 s survive; after 6 s idle nginx has closed (FIN at 5 s)
    // and Go dials anew: three peer closes measure the 5 s.
    let out = topo.ns.exec(
        topo.client,
        &format!(
            "{} defaults https://{name}:8443/ 0,1.5,6,1.5,6,1.5,6,1.5 10.201.1.2:5353",
            common::tlstool()?.display()
        ),
    )?;
    ensure!(out.matches("status 200").count() == 8, "the Go client: {out}");
    let rows = settle(&daemon)?;
    let dest = format!("{}:8443", topo.server_v4);
    let r = row(&rows, &dest)?;
    assert_eq!(r.server_names.first().map(|n| n.name.as_str()), Some(name), "{r:#?}");
    assert!(r.server_names[0].connections >= 4, "one name per connection: {:?}", r.server_names);
    // The daemon sees the whole host (CI's apt named deb.debian.org beside
    // this test once): the names of this test's destination only.
    let names: Vec<String> = daemon
        .events()
        .into_iter()
        .filter(|e| e.kind() == EventKind::ServerName && e.remote.to_string() == dest)
        .filter_map(|e| e.as_server_name().and_then(|n| n.server_name.clone()))
        .collect();
    ensure!(!names.is_empty() && names.iter().all(|n| n == name), "only the name sent: {names:?}");
    // The fix in Go's words, and its default as a finding.
    let go = r.fix_settings.iter().find(|f| f.client == "Go net/http").with_context(|| format!("{r:#?}"))?;
    assert_eq!(go.setting, "http.Transport.IdleConnTimeout");
    assert_eq!(go.default_seconds, Some(90.0));
    let finding = go.finding.as_deref().context("the 90 s default exceeds the path")?;
    assert!(finding.starts_with("Go net/http's default 90 s > the path's 5"), "{finding}");
    assert!(r.fix_settings.iter().all(|f| f.client != "unknown"), "every reuse was Go's: {:?}", r.fix_settings);
    // Status: the NAME column first, and the finding among the notes.
    let status = Command::new(*OBSERVER).args(["status", "--addr", &daemon.http_addr()?]).output()?;
    let text = String::from_utf8_lossy(&status.stdout);
    let line = text.lines().find(|l| l.contains(&dest)).with_context(|| format!("status: {text}"))?;
    assert!(line.starts_with(name), "{text}");
    assert!(
        text.lines().any(|l| l.starts_with(&format!("{name} {dest}"))
            && l.contains("(client): finding: Go net/http's default 90 s > the path's 5")),
        "{text}"
    );
    // The info metric.
    let metrics = daemon.metrics()?;
    let info = format!("observer_destination_info{{destination=\"{dest}\",role=\"client\",netns=\"");
    ensure!(
        metrics.lines().any(|l| l.starts_with(&info) && l.ends_with(&format!("server_name=\"{name}\"}} 1"))),
        "no info metric for {dest}: {}",
        metrics.lines().filter(|l| l.contains("destination_info")).collect::<Vec<_>>().join("\n")
    );
    // A path file that names the partner by host name matches the row.
    let path = dir.path().join("path.toml");
    std::fs::write(
        &path,
        format!("[[hop]]\nname = \"client\"\nclient = true\nidle_timeout = \"90s\"\n\n[[hop]]\nname = \"partner\"\nidle_timeout = \"60s\"\naddress = \"{name}:8443\"\n"),
    )?;
    let check = Command::new(*OBSERVER)
        .args(["path", "check", "--observed", "--addr", &daemon.http_addr()?])
        .arg(&path)
        .output()?;
    let said = String::from_utf8_lossy(&check.stdout);
    assert!(said.contains("[observed]") && said.contains(&format!("{name}:8443 ({dest})")), "{said}");
    // The report is headed by the name (the store's writer flushes every 500 ms).
    std::thread::sleep(Duration::from_secs(2));
    let report = Command::new(*OBSERVER)
        .args(["report", "--destination", &dest, "--format", "md", "--data-dir"])
        .arg(data.path())
        .output()?;
    let md = String::from_utf8_lossy(&report.stdout);
    ensure!(report.status.success(), "report: {}", String::from_utf8_lossy(&report.stderr));
    assert!(md.starts_with(&format!("# Idle timeout evidence for `{name} ({dest})`")), "{md}");
    assert!(md.contains("http.Transport.IdleConnTimeout") && !md.contains("| unknown | `the client pool"), "{md}");
    if let Ok(p) = std::env::var("OBSERVER_SAVE_REPORT") {
        std::fs::write(p, md.as_bytes())?;
    }
    eprintln!("MEASURED names tls: {:?}; fix {go:?}", r.server_names);
    Ok(())
}

/// Plain HTTP from Python with a `Host` header names its row, and the fix
/// is Python's; a second daemon beside it with `--no-names` sees the same
/// traffic and shows no name anywhere (no event, no row name, no metric).
/// A client whose runtime cannot be told gets the generic rule.
#[test]
#[ignore = "needs root and a 5.15+ kernel: run `cargo xtask test`"]
fn python_host_header_names_plain_http_and_no_names_shows_none() -> Result<()> {
    let topo = Topology::pair("nhost")?;
    let dir = tempfile::tempdir()?;
    let _nginx = start_nginx_with(&topo, dir.path(), 2, 8080, "")?;
    let named = Daemon::start(&[])?;
    let blind = Daemon::start(&["--no-names"])?;
    ensure!(
        blind.stderr_lines().iter().any(|l| l.contains("names off (--no-names)")),
        "the probe set line says names are off: {:?}",
        blind.stderr_lines()
    );
    let client = script(HOST_CLIENT)?;
    let name = "shop.partner.example";
    let out = topo.ns.exec(
        topo.client,
        &format!("python3 {} {} 8080 Shop.Partner.Example 0,1.2,3,1.2,3,1.2,3", client.display(), topo.server_v4),
    )?;
    ensure!(out.contains("done"), "{out}");
    let dest = format!("{}:8080", topo.server_v4);
    let rows = settle(&named)?;
    let r = row(&rows, &dest)?;
    assert_eq!(r.server_names.first().map(|n| n.name.as_str()), Some(name), "{r:#?}");
    let py = r.fix_settings.first().context("a fix")?;
    assert!(py.client.starts_with("Python") && py.advice.contains("Retry"), "{:?}", r.fix_settings);
    let rows = settle(&blind)?;
    let b = row(&rows, &dest)?;
    assert!(b.server_names.is_empty(), "--no-names: {b:#?}");
    ensure!(!blind.events().iter().any(|e| e.kind() == EventKind::ServerName), "--no-names printed a name");
    let metrics = blind.metrics()?;
    ensure!(!metrics.contains("observer_destination_info{"), "--no-names exported a name");
    assert_eq!(b.reuses, r.reuses, "the same evidence either way");
    // A client whose runtime cannot be told (bash's /dev/tcp) gets the
    // generic rule, with the number; its request, written a line at a
    // time, names nothing. It reads the whole echo (37 bytes), so the
    // server's idle close at 2 s shows (a peer close, then the reuse at
    // 3 s fails): a row with no timeout shown gives no number at all.
    let echo = script(ECHO_SERVER)?;
    let _echo =
        start_server(&topo.ns, topo.server, &format!("python3 -u {} {} 9200 2", echo.display(), topo.server_v4))?;
    let _ = topo.ns.exec(
        topo.client,
        &format!(
            "bash -c 'trap \"\" PIPE; exec 3<>/dev/tcp/{}/9200; for g in 0 1.2 1.2 3; do sleep $g; printf \"GET / HTTP/1.1\\r\\nHost: raw.example\\r\\n\\r\\n\" >&3 || break; read -t 2 -u 3 -N 37 r || true; done'",
            topo.server_v4
        ),
    );
    let rows = settle(&named)?;
    let raw = row(&rows, &format!("{}:9200", topo.server_v4))?;
    // bash's printf writes line by line: the first write is the request
    // line alone, the `Host` comes later. No name, rather than a guess.
    assert!(raw.server_names.is_empty(), "{raw:#?}");
    let generic = raw.fix_settings.first().with_context(|| format!("a fix for bash: {raw:#?}"))?;
    assert_eq!((generic.client.as_str(), raw.fix_settings.len()), ("unknown", 1), "{:?}", raw.fix_settings);
    assert!(generic.advice.contains("idle timeout to at most"), "{}", generic.advice);
    eprintln!("MEASURED names host: {:?}; fix {py:?}", r.server_names);
    Ok(())
}

/// First writes that carry no whole name give none: a `ClientHello` split
/// early, one cut inside its SNI, a binary protocol; a 64 KiB first write
/// whose first bytes name its host is read safely (only its first 512
/// bytes leave the kernel).
#[test]
#[ignore = "needs root and a 5.15+ kernel: run `cargo xtask test`"]
fn odd_first_writes_give_no_false_name() -> Result<()> {
    let topo = Topology::pair("nodd")?;
    let echo = script(ECHO_SERVER)?;
    let _servers: Vec<_> = (0..4)
        .map(|k| {
            start_server(
                &topo.ns,
                topo.server,
                &format!("python3 -u {} {} {} 30", echo.display(), topo.server_v4, 9101 + k),
            )
        })
        .collect::<Result<_>>()?;
    let daemon = Daemon::start(&[])?;
    let client = script(ODD_CLIENT)?;
    let out = topo.ns.exec(topo.client, &format!("python3 {} {} 9101", client.display(), topo.server_v4))?;
    ensure!(out.contains("done"), "{out}");
    daemon.caught_up(Duration::from_millis(1500), Duration::from_mins(1))?;
    let named: Vec<(u16, String)> = daemon
        .events()
        .into_iter()
        .filter(|e| e.kind() == EventKind::ServerName && e.remote.ip().to_string() == topo.server_v4)
        .map(|e| (e.remote.port(), e.as_server_name().and_then(|n| n.server_name.clone()).unwrap_or_default()))
        .collect();
    assert_eq!(named, vec![(9104, "big.example".to_owned())], "only the whole name");
    let established = daemon
        .events()
        .iter()
        .filter(|e| {
            e.kind() == EventKind::Established && e.role == Role::Client && (9101..=9104).contains(&e.remote.port())
        })
        .count();
    assert_eq!(established, 4, "every connection was seen");
    Ok(())
}

//! Root end-to-end tests of the wire-truth definitions: ordinary traffic
//! from real servers and clients must never become false evidence. Each
//! test asserts the event that must appear and the one that must not, and
//! prints what it measured (`MEASURED ...`).

mod common;

use std::{net::SocketAddr, time::Duration};

use anyhow::{bail, ensure, Context as _, Result};
use common::{
    script, sh, start_nginx, start_server, Daemon, Killed, Topology, ECHO_SERVER, KILLING_SERVER, ONE_REQUEST_CLIENT,
};
use observer::kernel::event::{EventKind, How, Outcome, Role, SockEvent};

/// Events of one socket, by its local address.
fn of(events: &[SockEvent], local: SocketAddr) -> Vec<&SockEvent> {
    events.iter().filter(|e| e.local == local).collect()
}

fn kinds(evs: &[&SockEvent]) -> Vec<String> {
    evs.iter()
        .map(|e| {
            let mut k = e.kind().as_str().to_owned();
            if let Some(o) = e.outcome() {
                k = format!("{k}:{}", o.as_str());
            }
            if let Some(h) = e.how() {
                k = format!("{k}/{}", h.as_str());
            }
            format!(
                "{k}@idle={:.3}{}",
                e.idle_seconds,
                e.elapsed_seconds().map(|x| format!(",elapsed={x:.3}")).unwrap_or_default()
            )
        })
        .collect()
}

/// `ip:port` lines (or JSON `{"local": [ip, port]}`) a client printed.
fn locals(out: &str) -> Result<Vec<SocketAddr>> {
    out.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            if l.starts_with('{') {
                let v: serde_json::Value = serde_json::from_str(l)?;
                let ip = v["local"][0].as_str().context("local ip")?;
                let port: u16 = match &v["local"][1] {
                    serde_json::Value::String(s) => s.parse()?,
                    n => u16::try_from(n.as_u64().context("port")?)?,
                };
                Ok(SocketAddr::new(ip.parse()?, port))
            } else {
                let (ip, port) = l.trim().rsplit_once(' ').context("`ip port` line")?;
                Ok(SocketAddr::new(ip.parse()?, port.parse()?))
            }
        })
        .collect()
}

/// Let late events arrive before asserting that one did not.
fn settle() {
    std::thread::sleep(Duration::from_millis(700));
}

/// A Python server (`SERVER HOST 9000`, prints `ready`) and one Python
/// client (`CLIENT HOST 9000`, prints `ip port` last) in a fresh pair of
/// namespaces; waits for a `until` event of the client's socket and lets
/// late events arrive. Returns the client's address and every event.
fn one_client_run(
    tag: &str,
    server_src: &str,
    client_src: &str,
    until: EventKind,
) -> Result<(SocketAddr, Vec<SockEvent>)> {
    let topo = Topology::pair(tag)?;
    let server = script(server_src)?;
    let _srv =
        start_server(&topo.ns, topo.server, &format!("python3 -u {} {} 9000", server.display(), topo.server_v4))?;
    let daemon = Daemon::start(&[])?;
    let client = script(client_src)?;
    let out = topo.ns.exec(topo.client, &format!("python3 {} {} 9000", client.display(), topo.server_v4))?;
    let local = *locals(&out)?.last().context("the client's address")?;
    daemon.wait_for(until.as_str(), Duration::from_secs(5), |evs| {
        evs.iter().any(|e| e.kind() == until && e.local == local)
    })?;
    settle();
    Ok((local, daemon.events()))
}

/// Reuses a raw HTTP/1.1 connection after `gap` with `Connection: close`
/// and reads only 200 ms later, so nginx's response and its FIN have both
/// been processed by the kernel before the application reads:
/// `python3 RAW_CLOSE_CLIENT HOST PORT GAP COUNT`.
const RAW_CLOSE_CLIENT: &str = r#"
import socket, sys, time
host, port, gap, count = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4])
def get(s, close):
    s.sendall(("GET / HTTP/1.1\r\nHost: t\r\n%s\r\n" % ("Connection: close\r\n" if close else "")).encode())
for _ in range(count):
    s = socket.create_connection((host, port), timeout=5)
    get(s, False)
    buf = b""
    while b"ok\n" not in buf:
        buf += s.recv(4096)
    time.sleep(gap)
    get(s, True)
    time.sleep(0.2)
    data = b""
    while True:
        d = s.recv(4096)
        if not d:
            break
        data += d
    assert b"200 OK" in data, data
    print(s.getsockname()[0], s.getsockname()[1], flush=True)
    s.close()
"#;

#[test]
fn response_then_close_is_ok_not_eof() -> Result<()> {
    let topo = Topology::pair("rclose")?;
    let dir = tempfile::tempdir()?;
    let _nginx = start_nginx(&topo, dir.path(), 60)?;
    let daemon = Daemon::start(&["--min-idle", "400ms"])?;
    let client = script(RAW_CLOSE_CLIENT)?;
    let out = topo.ns.exec(topo.client, &format!("python3 {} {} 8080 1.0 5", client.display(), topo.server_v4))?;
    let socks = locals(&out)?;
    ensure!(socks.len() == 5, "client printed {out}");
    daemon.wait_for("five reuse outcomes", Duration::from_secs(5), |evs| {
        socks.iter().all(|l| evs.iter().any(|e| e.kind() == EventKind::Reuse && e.local == *l))
    })?;
    settle();
    let events = daemon.events();
    let mut hows = Vec::new();
    for l in &socks {
        let mine = of(&events, *l);
        let reuses: Vec<_> = mine.iter().filter(|e| e.kind() == EventKind::Reuse).collect();
        ensure!(reuses.len() == 1, "one reuse per connection: {:?}", kinds(&mine));
        let r = reuses[0];
        assert_eq!(r.outcome(), Some(Outcome::Ok), "the response arrived: {:?}", kinds(&mine));
        assert!(common::fired(r.idle_seconds, 1.0, 0.05), "{r:?}");
        assert!(
            !mine.iter().any(|e| e.kind() == EventKind::PeerCloseWhileIdle || e.kind() == EventKind::RequestAborted),
            "the FIN after a response is no failure: {:?}",
            kinds(&mine)
        );
        hows.push(r.how().map_or("none", How::as_str));
    }
    eprintln!(
        "MEASURED response-then-close: 5 reuses, all ok, how = {hows:?}; events per socket e.g. {:?}",
        kinds(&of(&events, socks[0]))
    );
    // The same on busy connections (the close request right after the
    // first answer): no request is outstanding once the answer arrived,
    // read or not, so the FIN is neither an abort nor an idle close.
    let out = topo.ns.exec(topo.client, &format!("python3 {} {} 8080 0 3", client.display(), topo.server_v4))?;
    let busy = locals(&out)?;
    ensure!(busy.len() == 3, "client printed {out}");
    daemon.wait_for("the busy connections to close", Duration::from_secs(5), |evs| {
        busy.iter().all(|l| evs.iter().any(|e| e.kind() == EventKind::Closed && e.local == *l))
    })?;
    settle();
    let events = daemon.events();
    for l in &busy {
        let mine = of(&events, *l);
        assert!(
            !mine.iter().any(|e| matches!(
                e.kind(),
                EventKind::Reuse
                    | EventKind::RequestAborted
                    | EventKind::PeerCloseWhileIdle
                    | EventKind::RequestTimeout
            )),
            "a busy request answered before the FIN: {:?}",
            kinds(&mine)
        );
    }
    Ok(())
}

/// A server that answers each request `delay` seconds late:
/// `python3 SLOW_SERVER HOST PORT DELAY`.
const SLOW_SERVER: &str = common::threaded_server!(
    r#"
delay = float(args[0])
def serve(c):
    while True:
        try:
            d = c.recv(4096)
        except OSError:
            break
        if not d:
            break
        time.sleep(delay)
        try:
            c.sendall(d)
        except OSError:
            break
    c.close()
"#
);

/// One request per fresh connection to a server that gives up after (or
/// answers only after) `server_s`; every connection must produce one `kind`
/// event with `elapsed_seconds` near `expect_s`, and none of `forbidden`.
fn deadline_scenario(
    tag: &str,
    server_src: &str,
    server_s: u32,
    (count, read_timeout_s): (usize, u32),
    (kind, expect_s): (EventKind, f64),
    forbidden: &[EventKind],
) -> Result<Vec<SockEvent>> {
    let topo = Topology::pair(tag)?;
    let server = script(server_src)?;
    let _srv = start_server(
        &topo.ns,
        topo.server,
        &format!("python3 -u {} {} 9000 {server_s}", server.display(), topo.server_v4),
    )?;
    let daemon = Daemon::start(&[])?;
    let client = script(ONE_REQUEST_CLIENT)?;
    let out = topo
        .ns
        .exec(topo.client, &format!("python3 {} {} 9000 {count} {read_timeout_s}", client.display(), topo.server_v4))?;
    let socks = locals(&out)?;
    ensure!(socks.len() == count, "client printed {out}");
    daemon.wait_for(kind.as_str(), Duration::from_secs_f64(common::tolerance(5.0)), |evs| {
        socks.iter().all(|l| evs.iter().any(|e| e.kind() == kind && e.local == *l))
    })?;
    settle();
    let events = daemon.events();
    let mut found = Vec::new();
    for l in &socks {
        let mine = of(&events, *l);
        let ev = mine.iter().find(|e| e.kind() == kind).context("the deadline event")?;
        let e = ev.elapsed_seconds().unwrap_or_default();
        assert!(common::fired(e, expect_s, 0.1), "the {expect_s} s deadline: {ev:?}");
        assert!(ev.as_request().is_some_and(|r| !r.reuse), "{ev:?}");
        assert!(
            !mine.iter().any(|e| forbidden.contains(&e.kind()) || e.is_pool_idle_close()),
            "a deadline is no idle close: {:?}",
            kinds(&mine)
        );
        found.push((*ev).clone());
    }
    eprintln!(
        "MEASURED {}: elapsed {:?} s; e.g. {:?}",
        kind.as_str(),
        found.iter().map(|e| (e.elapsed_seconds().unwrap_or_default() * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
        kinds(&of(&events, socks[0]))
    );
    Ok(found)
}

#[test]
fn peer_killing_a_slow_request_is_request_aborted() -> Result<()> {
    let found = deadline_scenario(
        "abort",
        KILLING_SERVER,
        3,
        (3, 10),
        (EventKind::RequestAborted, 3.0),
        &[EventKind::PeerCloseWhileIdle, EventKind::Reuse],
    )?;
    assert!(found.iter().all(|e| e.how() == Some(How::Fin)), "{found:?}");
    Ok(())
}

#[test]
fn client_read_timeout_is_request_timeout() -> Result<()> {
    deadline_scenario(
        "rtimeout",
        SLOW_SERVER,
        4,
        (2, 2),
        (EventKind::RequestTimeout, 2.0),
        &[EventKind::LocalClose, EventKind::RequestAborted],
    )?;
    Ok(())
}

/// nginx with TLS on `server_v4:8443`, `keepalive_timeout` in seconds.
fn start_nginx_tls(topo: &Topology, dir: &std::path::Path, keepalive_s: u32) -> Result<Killed> {
    sh(&format!("{} cert {}", common::tlstool()?.display(), dir.display()))?;
    let tls = format!("ssl; ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem", d = dir.display());
    common::start_nginx_with(topo, dir, keepalive_s, 8443, &tls)
}

/// The Go client (`tlstool client URL IDLE_CONN WAIT`) run twice from the
/// client namespace; waits until each of its sockets has a `until` event,
/// lets late events arrive, and returns the sockets and every event.
fn go_clients(
    topo: &Topology,
    daemon: &Daemon,
    args: &str,
    until: EventKind,
) -> Result<(Vec<SocketAddr>, Vec<SockEvent>)> {
    let tool = common::tlstool()?;
    let mut socks = Vec::new();
    for _ in 0..2 {
        let out =
            topo.ns.exec(topo.client, &format!("{} client https://{}:8443/ {args}", tool.display(), topo.server_v4))?;
        socks.extend(locals(&out)?);
    }
    ensure!(socks.len() == 2, "{socks:?}");
    daemon.wait_for(until.as_str(), Duration::from_secs(5), |evs| {
        socks.iter().all(|l| evs.iter().any(|e| e.kind() == until && e.local == *l))
    })?;
    settle();
    Ok((socks, daemon.events()))
}

#[test]
fn tls_pool_idle_close_with_close_notify_is_a_pool_idle_close() -> Result<()> {
    let topo = Topology::pair("tlspool")?;
    let dir = tempfile::tempdir()?;
    let _nginx = start_nginx_tls(&topo, dir.path(), 60)?;
    let daemon = Daemon::start(&[])?;
    let (socks, events) = go_clients(&topo, &daemon, "1500ms 2500ms", EventKind::LocalClose)?;
    let mut idles = Vec::new();
    for l in &socks {
        let mine = of(&events, *l);
        let close = mine.iter().find(|e| e.kind() == EventKind::LocalClose).context("local close")?;
        assert!(close.is_pool_idle_close(), "{close:?}");
        assert!(
            close.as_local_close().is_some_and(|c| c.control_write),
            "the close_notify was taken as part of the close: {close:?}"
        );
        assert!(common::fired(close.idle_seconds, 1.5, 0.1), "Go's IdleConnTimeout is 1.5 s: {close:?}");
        assert!(
            !mine.iter().any(|e| matches!(e.kind(), EventKind::Reuse | EventKind::RequestTimeout)),
            "close_notify is no reuse: {:?}",
            kinds(&mine)
        );
        idles.push((close.idle_seconds * 1000.0).round() / 1000.0);
    }
    eprintln!(
        "MEASURED tls pool idle close: idle {idles:?} s (control_write); e.g. {:?}",
        kinds(&of(&events, socks[0]))
    );
    Ok(())
}

#[test]
fn tls_server_idle_close_is_seen_by_a_client_that_keeps_a_reader() -> Result<()> {
    let topo = Topology::pair("tlssrv")?;
    let _srv = start_server(
        &topo.ns,
        topo.server,
        &format!("{} server {}:8443 2s", common::tlstool()?.display(), topo.server_v4),
    )?;
    let daemon = Daemon::start(&[])?;
    let (socks, events) = go_clients(&topo, &daemon, "30s 3500ms", EventKind::PeerCloseWhileIdle)?;
    let mut idles = Vec::new();
    for l in &socks {
        let mine = of(&events, *l);
        let pc = mine.iter().find(|e| e.kind() == EventKind::PeerCloseWhileIdle).context("peer close")?;
        assert!(
            common::fired(pc.idle_seconds, 2.0, 0.1),
            "Go's server IdleTimeout is 2 s: {pc:?} ({:?})",
            kinds(&mine)
        );
        assert_eq!(pc.role, Role::Client);
        assert!(!mine.iter().any(|e| e.kind() == EventKind::Reuse), "{:?}", kinds(&mine));
        assert!(!mine.iter().any(|e| e.is_pool_idle_close()), "Go closed after the peer: {:?}", kinds(&mine));
        idles.push((pc.idle_seconds * 1000.0).round() / 1000.0);
        // The same close from the server: its close_notify is part of it.
        let srv = events
            .iter()
            .find(|e| e.kind() == EventKind::LocalClose && e.remote == *l && e.role == Role::Server)
            .context("the server's own idle close")?;
        assert!(srv.as_local_close().is_some_and(|c| c.control_write && !c.peer_closed_first), "{srv:?}");
        assert!(common::fired(srv.idle_seconds, 2.0, 0.1), "{srv:?}");
    }
    eprintln!("MEASURED tls server idle close seen by a Go reader: idle {idles:?} s (and by the server itself, control_write); e.g. {:?}", kinds(&of(&events, socks[0])));
    Ok(())
}

/// A TLS keep-alive server that closes a connection idle for `IDLE` s with
/// a bare FIN (Python's `SSLSocket.close()` sends no `close_notify`):
/// `python3 BARE_FIN_TLS_SERVER HOST PORT CERT_DIR IDLE`.
const BARE_FIN_TLS_SERVER: &str = r#"
import socket, ssl, sys, threading
host, port, d, idle = sys.argv[1], int(sys.argv[2]), sys.argv[3], float(sys.argv[4])
ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
ctx.load_cert_chain(d + "/cert.pem", d + "/key.pem")
ls = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
ls.bind((host, port)); ls.listen(64)
def serve(raw):
    try:
        c = ctx.wrap_socket(raw, server_side=True)
        c.settimeout(idle)
        buf = b""
        while True:
            try:
                d = c.recv(4096)
            except (socket.timeout, TimeoutError):
                break
            if not d:
                break
            buf += d
            while b"\r\n\r\n" in buf:
                _, buf = buf.split(b"\r\n\r\n", 1)
                c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
        c.close()
    except Exception:
        raw.close()
print("ready", flush=True)
while True:
    raw, _ = ls.accept()
    threading.Thread(target=serve, args=(raw,), daemon=True).start()
"#;

/// A server's idle close with a bare FIN, seen by a Go pool that keeps a
/// reader: Go reads the EOF, then writes its `close_notify` and closes.
/// That write follows the FIN but answers it (the EOF was read first), so
/// it is part of the close: a peer close, no reuse and no failure.
#[test]
fn tls_bare_fin_then_close_notify_from_a_reader_is_no_reuse() -> Result<()> {
    let topo = Topology::pair("tlsfin")?;
    let dir = tempfile::tempdir()?;
    sh(&format!("{} cert {}", common::tlstool()?.display(), dir.path().display()))?;
    let server = script(BARE_FIN_TLS_SERVER)?;
    let _srv = start_server(
        &topo.ns,
        topo.server,
        &format!("python3 -u {} {} 8443 {} 2", server.display(), topo.server_v4, dir.path().display()),
    )?;
    let daemon = Daemon::start(&[])?;
    let (socks, events) = go_clients(&topo, &daemon, "30s 3500ms", EventKind::PeerCloseWhileIdle)?;
    let mut idles = Vec::new();
    for l in &socks {
        let mine = of(&events, *l);
        let pc = mine.iter().find(|e| e.kind() == EventKind::PeerCloseWhileIdle).context("peer close")?;
        assert!(common::fired(pc.idle_seconds, 2.0, 0.1), "the server closes at 2 s: {pc:?}");
        assert_eq!(pc.how(), Some(How::Fin));
        // The server's RST answers the close_notify; Go's close comes after
        // it or before it, and is then its own close after the peer's.
        assert!(
            mine.iter()
                .filter(|e| e.kind() == EventKind::LocalClose)
                .all(|c| c.as_local_close().is_some_and(|c| c.peer_closed_first)),
            "{:?}",
            kinds(&mine)
        );
        assert!(
            !mine
                .iter()
                .any(|e| matches!(e.kind(), EventKind::Reuse | EventKind::RequestTimeout | EventKind::RequestAborted)),
            "Go's close_notify after the EOF is no request: {:?}",
            kinds(&mine)
        );
        idles.push((pc.idle_seconds * 1000.0).round() / 1000.0);
    }
    eprintln!(
        "MEASURED tls bare FIN seen by a Go reader: peer close at {idles:?} s; e.g. {:?}",
        kinds(&of(&events, socks[0]))
    );
    Ok(())
}

/// Connects, warms the connection, prints `ready`, reuses it `gap` seconds
/// later and waits up to 5 s for the echo; prints `ip port result`:
/// `python3 LATE_ANSWER_CLIENT HOST PORT GAP`.
const LATE_ANSWER_CLIENT: &str = r#"
import socket, sys, time
host, port, gap = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.create_connection((host, port), timeout=5)
for _ in range(20):
    s.sendall(b"hello"); s.recv(100)
print("ready", flush=True)
time.sleep(gap)
s.sendall(b"ping")
r = "ok" if s.recv(100) else "eof"
print(s.getsockname()[0], s.getsockname()[1], r, flush=True)
s.close()
"#;

#[test]
fn one_lost_segment_answered_late_is_ok_not_stall() -> Result<()> {
    let topo = Topology::routed("lost", 600, "drop")?;
    let router = topo.router.context("router")?;
    let server = script(ECHO_SERVER)?;
    let _srv =
        start_server(&topo.ns, topo.server, &format!("python3 -u {} {} 9000", server.display(), topo.server_v4))?;
    let daemon = Daemon::start(&["--stall-after", "300ms"])?;
    let client = script(LATE_ANSWER_CLIENT)?;
    let mut child =
        topo.ns.spawn(topo.client, &format!("python3 -u {} {} 9000 2", client.display(), topo.server_v4))?;
    let stdout = child.stdout.take().context("client stdout")?;
    let mut lines = std::io::BufRead::lines(std::io::BufReader::new(stdout));
    ensure!(lines.next().transpose()?.as_deref() == Some("ready"), "client did not get ready");
    let ready = std::time::Instant::now();
    // Drop the reuse's data segments (not pure ACKs) from now (the socket
    // is idle: nothing to drop) until 0.7 s after the write at +2 s: the
    // first transmission and the first retransmission are lost, a later
    // retransmission gets through and is answered. The rule goes in at
    // once, not just before the write: under emulation `nft` takes long.
    topo.ns.exec(
        router,
        &format!(
            "nft add rule inet observer_test forward_filter ip daddr {} tcp dport 9000 ip length gt 52 drop",
            topo.server_v4
        ),
    )?;
    std::thread::sleep(Duration::from_millis(2700).saturating_sub(ready.elapsed()));
    topo.ns.exec(router, "nft flush chain inet observer_test forward_filter")?;
    let line = lines.next().transpose()?.context("client result")?;
    let _ = child.wait();
    let (addr, result) = line.rsplit_once(' ').context("ip port result")?;
    ensure!(result == "ok", "the echo came back: {line}");
    let local = locals(addr)?[0];
    daemon.wait_for("the reuse outcome", Duration::from_secs(5), |evs| {
        evs.iter().any(|e| e.kind() == EventKind::Reuse && e.local == local)
    })?;
    settle();
    let events = daemon.events();
    let mine = of(&events, local);
    let r = mine.iter().find(|e| e.kind() == EventKind::Reuse).context("reuse")?;
    assert_eq!(r.outcome(), Some(Outcome::Ok), "answered late is ok: {:?}", kinds(&mine));
    assert!(r.retransmits() >= 1, "the segment was lost and retransmitted: {r:?}");
    assert!(r.elapsed_seconds().unwrap_or_default() > 0.3, "answered after --stall-after: {r:?}");
    assert!(!mine.iter().any(|e| e.outcome() == Some(Outcome::Stall)), "{:?}", kinds(&mine));
    eprintln!(
        "MEASURED lost segment: ok after {:.3} s with {} retransmits (stall-after 0.3 s); {:?}",
        r.elapsed_seconds().unwrap_or_default(),
        r.retransmits(),
        kinds(&mine)
    );
    Ok(())
}

/// Zero-length `recv()` calls (as .NET makes them to wait for data) while
/// idle and between a reuse write and the read of its answer:
/// `python3 ZERO_READ_CLIENT HOST PORT`. Python's `recv(0)` skips the
/// syscall, so libc's is called directly.
const ZERO_READ_CLIENT: &str = r#"
import ctypes, socket, sys, time
libc = ctypes.CDLL(None, use_errno=True)
host, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection((host, port), timeout=5)
s.sendall(b"hello"); s.recv(100)
buf = ctypes.create_string_buffer(1)
def zero():
    # 0 with data queued; -1 (EAGAIN) on this non-blocking socket without.
    return libc.recv(s.fileno(), buf, 0, 0)
for _ in range(3):
    time.sleep(0.5); zero()
time.sleep(0.5)
s.sendall(b"ping")
time.sleep(0.1)
for _ in range(5):
    assert zero() == 0
assert s.recv(100) == b"ping"
time.sleep(0.3)
print(s.getsockname()[0], s.getsockname()[1], flush=True)
s.close()
"#;

#[test]
fn zero_length_reads_are_not_eof() -> Result<()> {
    let (local, events) = one_client_run("zread", ECHO_SERVER, ZERO_READ_CLIENT, EventKind::Reuse)?;
    let mine = of(&events, local);
    let reuses: Vec<_> = mine.iter().filter(|e| e.kind() == EventKind::Reuse).collect();
    ensure!(reuses.len() == 1, "{:?}", kinds(&mine));
    assert_eq!(reuses[0].outcome(), Some(Outcome::Ok), "{:?}", kinds(&mine));
    assert!(reuses[0].idle_seconds > 1.9, "zero-length reads do not reset the idle clock: {:?}", reuses[0]);
    assert!(!mine.iter().any(|e| e.outcome() == Some(Outcome::Eof)), "{:?}", kinds(&mine));
    eprintln!("MEASURED zero-length reads: {:?}", kinds(&mine));
    Ok(())
}

/// A sink that never answers and closes a connection idle for 2 s:
/// `python3 SINK_SERVER HOST PORT`.
const SINK_SERVER: &str = common::threaded_server!(
    r#"
def serve(c):
    c.settimeout(2)
    try:
        while c.recv(4096):
            pass
    except socket.timeout:
        pass
    c.close()
"#
);

/// A log shipper: writes a line every 1.2 s, never reads, and waits for
/// the server to close: `python3 ONE_WAY_WRITER HOST PORT`.
const ONE_WAY_WRITER: &str = r#"
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection((host, port), timeout=10)
for i in range(4):
    s.sendall(b"log line %d\n" % i)
    time.sleep(1.2)
assert s.recv(100) == b""
print(s.getsockname()[0], s.getsockname()[1], flush=True)
s.close()
"#;

#[test]
fn one_way_writer_gets_no_outcome_from_a_later_close() -> Result<()> {
    let (local, events) = one_client_run("oneway", SINK_SERVER, ONE_WAY_WRITER, EventKind::Closed)?;
    let mine = of(&events, local);
    assert!(
        !mine
            .iter()
            .any(|e| matches!(e.kind(), EventKind::Reuse | EventKind::RequestAborted | EventKind::RequestTimeout)),
        "a one-way writer has no requests to fail: {:?}",
        kinds(&mine)
    );
    let pc = mine.iter().find(|e| e.kind() == EventKind::PeerCloseWhileIdle).context("the sink's idle close")?;
    assert!(common::fired(pc.idle_seconds, 2.0, 0.1), "the sink closes after 2 s idle: {pc:?}");
    eprintln!("MEASURED one-way writer: {:?}", kinds(&mine));
    Ok(())
}

#[test]
fn server_sees_a_client_reusing_after_its_idle_close_as_late_reuse() -> Result<()> {
    let topo = Topology::pair("late")?;
    let dir = tempfile::tempdir()?;
    let _nginx = start_nginx(&topo, dir.path(), 2)?;
    let daemon = Daemon::start(&["--min-idle", "400ms"])?;
    let client = script(common::HTTP_RECONNECTING)?;
    let out = topo.ns.exec(topo.client, &format!("python3 {} {} 8080 3", client.display(), topo.server_v4))?;
    let recs = common::client_records(&out)?;
    ensure!(recs.len() == 1 && recs[0].result != "ok", "the reuse after 3 s failed: {recs:?}");
    let client_addr = recs[0].local_addr();
    let server_addr: SocketAddr = format!("{}:8080", topo.server_v4).parse()?;
    let events = daemon.wait_for("the late reuse", Duration::from_secs(5), |evs| {
        evs.iter().any(|e| e.kind() == EventKind::LateReuse && e.remote == client_addr)
    })?;
    let late = events.iter().find(|e| e.kind() == EventKind::LateReuse && e.remote == client_addr).context("late")?;
    assert_eq!(late.local, server_addr, "{late:?}");
    assert_eq!(late.role, Role::Server);
    let after = late.elapsed_seconds().unwrap_or_default();
    assert!(
        (after - 1.0).abs() < common::tolerance(0.1),
        "the client wrote 3 s after its last request, nginx closed at 2 s: {late:?}"
    );
    assert!(common::fired(late.idle_seconds, 2.0, 0.1), "nginx's idle close at 2 s: {late:?}");
    let server_close = events
        .iter()
        .find(|e| e.kind() == EventKind::LocalClose && e.local == server_addr && e.remote == client_addr)
        .context("nginx's idle close")?;
    assert_eq!(server_close.role, Role::Server);
    eprintln!(
        "MEASURED late_reuse: {} <- {} {:.3} s after nginx's idle close at {:.3} s",
        late.local, late.remote, after, late.idle_seconds
    );
    Ok(())
}

/// Sends, reads the echo only 1.2 s after it arrived, idles 1.2 s more and
/// writes again after the server's 2 s idle close:
/// `python3 LATE_READ_CLIENT HOST PORT`.
const LATE_READ_CLIENT: &str = r#"
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection((host, port), timeout=5)
s.sendall(b"hello")
time.sleep(1.2)
assert s.recv(100) == b"hello"
time.sleep(1.2)
try:
    s.sendall(b"ping")
    assert s.recv(100) == b""
except ConnectionResetError:
    pass
print(s.getsockname()[0], s.getsockname()[1], flush=True)
s.close()
"#;

/// Idle starts when the answer reached TCP, not when the application read
/// it: the server's idle timer and every middlebox's run from the wire.
/// Timed from the read, this reuse would be a failure at 1.2 s idle and the
/// server's close a peer close at 0.8 s, both below its 2 s timeout.
#[test]
fn idle_runs_from_the_answer_on_the_wire_not_from_its_read() -> Result<()> {
    let server = format!("import sys; sys.argv.append('2')\n{ECHO_SERVER}");
    let (local, events) = one_client_run("lateread", &server, LATE_READ_CLIENT, EventKind::Reuse)?;
    let mine = of(&events, local);
    let close = mine.iter().find(|e| e.kind() == EventKind::PeerCloseWhileIdle).context("the server's idle close")?;
    assert!(common::fired(close.idle_seconds, 2.0, 0.1), "closed 2 s after the echo: {close:?}");
    let reuse = mine.iter().find(|e| e.kind() == EventKind::Reuse).context("the reuse")?;
    assert_ne!(reuse.outcome(), Some(Outcome::Ok), "{:?}", kinds(&mine));
    assert!(common::fired(reuse.idle_seconds, 2.4, 0.15), "2.4 s after the echo arrived: {reuse:?}");
    eprintln!(
        "MEASURED late read: peer close at idle {:.3} s, reuse {:?} at idle {:.3} s",
        close.idle_seconds,
        reuse.outcome(),
        reuse.idle_seconds
    );
    Ok(())
}

/// Five exchanges, then waits for the server's idle close:
/// `python3 WAIT_FOR_CLOSE_CLIENT HOST PORT`.
const WAIT_FOR_CLOSE_CLIENT: &str = r#"
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection((host, port), timeout=5)
for _ in range(5):
    s.sendall(b"ping")
    assert s.recv(100) == b"ping"
assert s.recv(100) == b""
print(s.getsockname()[0], s.getsockname()[1], flush=True)
s.close()
"#;

/// The kernel's jiffy (`clock_getres(CLOCK_MONOTONIC_COARSE)`), in seconds.
fn tick_seconds() -> Result<f64> {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: a valid pointer to a timespec.
    ensure!(unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &raw mut ts) } == 0, "clock_getres");
    Ok(Duration::new(u64::try_from(ts.tv_sec)?, u32::try_from(ts.tv_nsec)?).as_secs_f64())
}

/// A server's answer written 50 ms after the request arrived (inside the
/// send probe's clock-free window) is timed within three ticks of its
/// write, not from the request: the server's own idle close and the
/// client's view of it, from the answer's arrival, agree that closely.
/// Timed from the request's arrival, the server's idle would read 50 ms
/// long.
#[test]
fn a_servers_answer_is_timed_from_its_write_not_from_the_request() -> Result<()> {
    let server = format!("import sys; sys.argv += ['2', '0.05']\n{ECHO_SERVER}");
    let (local, events) = one_client_run("slowans", &server, WAIT_FOR_CLOSE_CLIENT, EventKind::PeerCloseWhileIdle)?;
    let mine = of(&events, local);
    let client = mine.iter().find(|e| e.kind() == EventKind::PeerCloseWhileIdle).context("the client's view")?;
    assert_eq!(client.role, Role::Client);
    let server = events
        .iter()
        .find(|e| e.kind() == EventKind::LocalClose && e.remote == local && e.role == Role::Server)
        .context("the server's own idle close")?;
    assert!(common::fired(server.idle_seconds, 2.0, 0.1), "{server:?}");
    let tick = tick_seconds()?;
    let diff = server.idle_seconds - client.idle_seconds;
    // The answer's write comes before its arrival, and the server's close
    // before its FIN arrives: the path between the namespaces adds well
    // under 2 ms on this host. The difference is the answer's delivery
    // less the FIN's, so a FIN delivered late only makes it negative; in a
    // guest under load the vCPU can stall in between (364 ms once, the
    // 6.1 guest beside two others), so there only the upper bound, the
    // one this test is about, stays tight.
    let lower = if common::tolerance(1.0) > 1.0 { -common::tolerance(0.1) } else { -0.002 };
    assert!(
        (lower..=3.0 * tick + common::tolerance(0.002)).contains(&diff),
        "server idle {:.4} s vs client {:.4} s (tick {tick} s)",
        server.idle_seconds,
        client.idle_seconds
    );
    assert!(
        !mine
            .iter()
            .any(|e| matches!(e.kind(), EventKind::Reuse | EventKind::RequestTimeout | EventKind::RequestAborted)),
        "{:?}",
        kinds(&mine)
    );
    eprintln!(
        "MEASURED slow answer: server idle close {:.4} s, client peer close {:.4} s, difference {:.1} ms (tick {:.1} ms)",
        server.idle_seconds,
        client.idle_seconds,
        diff * 1000.0,
        tick * 1000.0
    );
    Ok(())
}

/// `python3 REACTION_SERVER HOST PORT`: answers a line with `answer`; to
/// `stay` it then reads the client's acknowledgement, and 2 s later sends
/// a goodbye (`GOAWAY`-like) and closes a second after it, as Go's HTTP/2
/// server does; to `again` it reads the acknowledgement and answers the
/// next request; to anything else it reads to the end and closes.
const REACTION_SERVER: &str = common::threaded_server!(
    r#"
def serve(c):
    line = c.recv(100)
    c.sendall(b"answer\n")
    if line.startswith(b"stay"):
        assert c.recv(100) == b"ack\n"
        time.sleep(2.0)
        c.sendall(b"goodbye\n")
        time.sleep(1.0)
    elif line.startswith(b"again"):
        assert c.recv(100) == b"ack\n"
        assert c.recv(100) == b"again\n"
        c.sendall(b"answer\n")
        while c.recv(4096):
            pass
    else:
        while c.recv(4096):
            pass
    c.close()
"#
);

/// Writes made in reaction to a read, as an HTTP/2 client makes them: an
/// acknowledgement right after the answer (a `SETTINGS` ack), then the
/// peer's goodbye 2 s later and its close a second after it; on a second
/// connection, the acknowledgement, then a request 1.5 s later (a reuse);
/// on a third, our own goodbye right after the answer, then our close (a
/// `close_notify` as a client exits). Prints the three addresses.
const REACTION_CLIENT: &str = r#"
import socket, sys, time
host, port = sys.argv[1], int(sys.argv[2])
s = socket.create_connection((host, port), timeout=10)
s.sendall(b"stay\n")
assert s.recv(100) == b"answer\n"
s.sendall(b"ack\n")
assert s.recv(100) == b"goodbye\n"
assert s.recv(100) == b""
a = s.getsockname()
s.close()
r = socket.create_connection((host, port), timeout=10)
r.sendall(b"again\n")
assert r.recv(100) == b"answer\n"
r.sendall(b"ack\n")
time.sleep(1.5)
r.sendall(b"again\n")
assert r.recv(100) == b"answer\n"
reused = r.getsockname()
r.close()
t = socket.create_connection((host, port), timeout=10)
t.sendall(b"once\n")
assert t.recv(100) == b"answer\n"
t.sendall(b"bye\n")
b = t.getsockname()
t.close()
print(a[0], a[1])
print(reused[0], reused[1])
print(b[0], b[1], flush=True)
"#;

/// A write right after a read may be no request at all. When the next
/// read comes a quiet spell later, it may be the answer or the peer's
/// goodbye, and the close that follows cannot be dated: none is claimed
/// (dating it from the goodbye claimed 1.0 s for the server's 2 s, under
/// load, in the Go HTTP/2 test). An acknowledgement that got no answer
/// leaves the next write after a quiet spell a reuse (it was taken for a
/// one-way writer's, and the reuse went unseen). Our goodbye written right
/// after an answer and our close at once is no request deadline of ours.
#[test]
fn a_write_in_reaction_to_a_read_dates_nothing_it_cannot_know() -> Result<()> {
    let topo = Topology::pair("react")?;
    let server = script(REACTION_SERVER)?;
    let _srv =
        start_server(&topo.ns, topo.server, &format!("python3 -u {} {} 9000", server.display(), topo.server_v4))?;
    let daemon = Daemon::start(&[])?;
    let client = script(REACTION_CLIENT)?;
    let out = topo.ns.exec(topo.client, &format!("python3 {} {} 9000", client.display(), topo.server_v4))?;
    let [acked, reused, exits] = locals(&out)?[..] else { bail!("three client addresses: {out}") };
    daemon.wait_for("closed", Duration::from_secs(5), |evs| {
        evs.iter().any(|e| e.kind() == EventKind::Closed && e.local == exits)
    })?;
    settle();
    let events = daemon.events();
    let (first, second) = (of(&events, acked), of(&events, exits));
    let again = of(&events, reused);
    let reuse = again
        .iter()
        .find(|e| e.kind() == EventKind::Reuse)
        .with_context(|| format!("the reuse: {:?}", kinds(&again)))?;
    ensure!(
        reuse.outcome() == Some(Outcome::Ok) && common::fired(reuse.idle_seconds, 1.5, 0.1),
        "a reuse after 1.5 s, answered: {reuse:?}"
    );
    for e in &first {
        ensure!(
            e.kind() != EventKind::PeerCloseWhileIdle || common::fired(e.idle_seconds, 2.0, 0.1),
            "the peer's close dated {:.3} s idle (its goodbye came 2 s after the answer): {:?}",
            e.idle_seconds,
            kinds(&first)
        );
    }
    let requests = |evs: &[&SockEvent]| {
        evs.iter().any(|e| matches!(e.kind(), EventKind::Reuse | EventKind::RequestAborted | EventKind::RequestTimeout))
    };
    ensure!(!requests(&first), "the acknowledgement is no request: {:?}", kinds(&first));
    ensure!(!requests(&second), "our goodbye is no request timed out: {:?}", kinds(&second));
    for (evs, which) in [(&first, "first"), (&again, "reused"), (&second, "last")] {
        ensure!(evs.iter().any(|e| e.kind() == EventKind::Closed), "the daemon saw the {which} connection end");
    }
    eprintln!("MEASURED reaction writes: {:?} / {:?} / {:?}", kinds(&first), kinds(&again), kinds(&second));
    Ok(())
}

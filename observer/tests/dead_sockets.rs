//! Root end-to-end tests of sockets that die while a pool holds them idle:
//! a reuse the kernel fails before a byte leaves the host (the peer's RST
//! or the kernel's keep-alive timeout came first) is a failed reuse
//! (`failed_before_send`); a dead socket the pool closes unwritten is
//! `discarded_dead`; the dead sockets held right now are counted exactly
//! (`doomed_idle_sockets`). Real HAProxy, nginx, Go `net/http`, conntrack
//! and Python peers, each test in namespaces of its own.

#[macro_use]
mod common;

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use anyhow::{bail, ensure, Context as _, Result};
use common::{
    client_records, metric, script, start_haproxy, start_nginx, start_server, Daemon, Killed, Topology, ECHO_SERVER,
    HTTP_RECONNECTING,
};
use observer::{
    diagnosis::aggregate::DestinationRow,
    diagnosis::table::Verdict,
    kernel::event::{EventKind, How, Outcome, Role, SockEvent},
};

/// The client row of `dest`, once `pred` holds for it (polled through
/// `observer status --json`), or an error with the last rows seen.
fn row_when(daemon: &Daemon, dest: &str, secs: f64, pred: impl Fn(&DestinationRow) -> bool) -> Result<DestinationRow> {
    let deadline = Instant::now() + Duration::from_secs_f64(common::tolerance(secs));
    loop {
        let rows = daemon.status()?;
        if let Some(r) = rows.iter().find(|r| r.id.destination == dest && r.id.role == Role::Client) {
            if pred(r) {
                return Ok(r.clone());
            }
        }
        if Instant::now() > deadline {
            bail!("the row of {dest} never matched; rows: {rows:#?}");
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn of(events: &[SockEvent], local: SocketAddr) -> Vec<&SockEvent> {
    events.iter().filter(|e| e.local == local).collect()
}

/// The headline symptom: HAProxy resets a pooled connection while it is
/// idle, the pool (no reader) writes its next request on it minutes or
/// seconds later, and the kernel fails that write with ECONNRESET before a
/// packet leaves the host. Every such reuse the client reports is a
/// failed reuse (`reset`, `failed_before_send`, safe to retry), counted
/// once, and the row shows the 1.5 s timeout and the mismatch.
#[test]
fn haproxy_nolinger_idle_reset_fails_the_next_reuse_before_send() -> Result<()> {
    let topo = Topology::pair("nolinger")?;
    let dir = tempfile::tempdir()?;
    let _nginx = start_nginx(&topo, dir.path(), 60)?;
    let _haproxy = start_haproxy(&topo, dir.path(), 1500)?;
    let daemon = Daemon::start(&[])?;
    let py = script(HTTP_RECONNECTING)?;
    // The ok gaps stay clear of `--min-idle` (1 s): a gap of exactly 1.0 s
    // can be 0.999 s on the wire, which is not a reuse (seen once in CI).
    let gaps = "1.1,2.2,1.15,2.6,1.2,3.0,1.3,2.4";
    let out = topo.ns.exec(topo.client, &format!("python3 {} {} 8090 {gaps}", py.display(), topo.server_v4))?;
    let recs = client_records(&out)?;
    ensure!(recs.len() == 8, "client printed {recs:?}");
    daemon.wait_for("an outcome of every reuse", Duration::from_secs(5), |evs| {
        recs.iter().all(|r| !common::reuses_from(evs, r.local_addr()).is_empty())
    })?;
    std::thread::sleep(Duration::from_millis(700));
    let events = daemon.events();
    let mut failed = Vec::new();
    let mut hows = Vec::new();
    for rec in &recs {
        let (ev, err) = common::matching(&events, rec)?;
        assert!(err < common::idle_precision(), "idle age {} vs the client's {}", ev.idle_seconds, rec.idle);
        if rec.gap < 1.5 {
            assert_eq!(rec.result, "ok", "{rec:?}");
            assert_eq!(ev.outcome(), Some(Outcome::Ok), "{ev:?}");
            assert!(!ev.failed_before_send(), "{ev:?}");
        } else {
            assert_eq!(rec.result, "reset", "the client saw connection reset by peer: {rec:?}");
            assert_eq!(ev.outcome(), Some(Outcome::Reset), "{ev:?}");
            assert!(ev.failed_before_send() && ev.safe_to_retry(), "{ev:?}");
            let mine = of(&events, rec.local_addr());
            // HAProxy 2.6 half-closes first: its FIN, then the RST of
            // `nolinger` (the client's write then fails with EPIPE).
            let close = mine
                .iter()
                .find(|e| e.kind() == EventKind::PeerCloseWhileIdle)
                .with_context(|| format!("the idle close before the reuse: {mine:#?}"))?;
            assert!(matches!(close.how(), Some(How::Fin | How::Rst)), "{close:?}");
            assert!(common::fired(close.idle_seconds, 1.5, 0.1), "{close:?}");
            hows.push(close.how().map_or("?", How::as_str));
            assert_eq!(
                mine.iter()
                    .filter(|e| e.kind() == EventKind::Reuse && e.outcome().is_some_and(Outcome::is_failure))
                    .count(),
                1,
                "one failed reuse per dead socket: {mine:#?}"
            );
            failed.push((ev.idle_seconds * 1000.0).round() / 1000.0);
        }
    }
    let client_failures = recs.iter().filter(|r| r.result != "ok").count();
    ensure!(failed.len() == client_failures && client_failures == 4, "{failed:?} vs {recs:?}");
    let dest = format!("{}:8090", topo.server_v4);
    let row = row_when(&daemon, &dest, 10.0, |r| r.path.idle_timeout_seconds.is_some())?;
    assert_eq!(row.counts.failures_window, client_failures as u64, "failures equal the client's count: {row:#?}");
    let point = row.path.idle_timeout_seconds.context("point")?;
    assert!(common::fired(point, 1.5, 0.1), "point {point}: {row:#?}");
    assert_eq!(row.judgement.verdict, Verdict::Mismatch, "{row:#?}");
    eprintln!(
        "MEASURED haproxy nolinger 1500 ms: idle closes {hows:?}; failed reuses before send at {failed:?} s ({} of {} reuses, client saw {client_failures}); row point {point:.3} s, interval [{:.3}, {:?}], mode {:?}, verdict {:?}, recommendation {:?}",
        failed.len(),
        recs.len(),
        row.path.lower_seconds,
        row.path.upper_seconds,
        row.failure_mode,
        row.judgement.verdict,
        row.judgement.recommended_pool_idle_timeout_seconds,
    );
    Ok(())
}

/// A minimal HTTP/1.1 keep-alive server that resets connections idle for
/// IDLE seconds (`SO_LINGER` 0, as database servers and firewalls do):
/// `python3 LINGER0_HTTP_SERVER HOST PORT IDLE`.
const LINGER0_HTTP_SERVER: &str = r#"
import socket, struct, sys, threading
host, port, idle = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind((host, port)); s.listen(64)
print("ready", flush=True)
def serve(c):
    c.settimeout(idle)
    buf = b""
    while True:
        try:
            d = c.recv(65536)
        except socket.timeout:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            break
        if not d:
            break
        buf += d
        while b"\r\n\r\n" in buf:
            _, buf = buf.split(b"\r\n\r\n", 1)
            c.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n")
    c.close()
while True:
    c, _ = s.accept()
    threading.Thread(target=serve, args=(c,), daemon=True).start()
"#;

/// Go's `net/http` keeps a reader on every pooled connection: when the
/// server resets one idle, the reader sees ECONNRESET and the transport
/// closes it unwritten, so the next request dials afresh. That is
/// `discarded_dead` (a failure the pool avoided), never a failed reuse,
/// and the RSTs still measure the server's idle timeout.
#[test]
fn go_reader_discards_a_connection_the_server_reset_idle() -> Result<()> {
    let topo = Topology::pair("godiscard")?;
    let server = script(LINGER0_HTTP_SERVER)?;
    let _srv =
        start_server(&topo.ns, topo.server, &format!("python3 {} {} 8070 1.5", server.display(), topo.server_v4))?;
    let daemon = Daemon::start(&[])?;
    let tool = common::tlstool()?;
    let mut first = Vec::new();
    for _ in 0..3 {
        let out = topo
            .ns
            .exec(topo.client, &format!("{} client http://{}:8070/ 60s 3s again", tool.display(), topo.server_v4))?;
        let socks: Vec<SocketAddr> = out
            .lines()
            .filter(|l| l.starts_with('{'))
            .map(|l| -> Result<SocketAddr> {
                let v: serde_json::Value = serde_json::from_str(l)?;
                let port: u16 = v["local"][1].as_str().context("port")?.parse()?;
                Ok(SocketAddr::new(v["local"][0].as_str().context("ip")?.parse()?, port))
            })
            .collect::<Result<_>>()?;
        ensure!(socks.len() == 2 && socks[0] != socks[1], "Go dialed afresh for the second GET: {socks:?}");
        first.push(socks[0]);
    }
    daemon.wait_for("discarded_dead on each first connection", Duration::from_secs(5), |evs| {
        first.iter().all(|l| evs.iter().any(|e| e.kind() == EventKind::DiscardedDead && e.local == *l))
    })?;
    std::thread::sleep(Duration::from_millis(700));
    let events = daemon.events();
    let mut resets = Vec::new();
    for l in &first {
        let mine = of(&events, *l);
        let reset = mine.iter().find(|e| e.kind() == EventKind::PeerCloseWhileIdle).context("the idle RST")?;
        assert_eq!(reset.how(), Some(How::Rst), "{reset:?}");
        assert!(common::fired(reset.idle_seconds, 1.5, 0.1), "{reset:?}");
        let discarded = mine.iter().find(|e| e.kind() == EventKind::DiscardedDead).context("discarded_dead")?;
        assert_eq!(discarded.how(), Some(How::Rst), "{discarded:?}");
        assert_eq!(discarded.role, Role::Client);
        assert!(
            !mine.iter().any(|e| matches!(e.kind(), EventKind::Reuse | EventKind::RequestAborted)),
            "Go never wrote on the reset connection: {mine:#?}"
        );
        resets.push((reset.idle_seconds * 1000.0).round() / 1000.0);
    }
    let dest = format!("{}:8070", topo.server_v4);
    let row =
        row_when(&daemon, &dest, 10.0, |r| r.sockets.discarded_dead >= 3 && r.path.idle_timeout_seconds.is_some())?;
    assert_eq!(row.counts.failures_window, 0, "no failure: {row:#?}");
    assert_eq!(row.sockets.discarded_dead, 3, "{row:#?}");
    let point = row.path.idle_timeout_seconds.context("point")?;
    assert!(common::fired(point, 1.5, 0.1), "point {point}: {row:#?}");
    eprintln!(
        "MEASURED Go reader vs SO_LINGER 0 server (1.5 s): idle RSTs at {resets:?} s, discarded_dead {}, failures {}, point {point:.3} s, verdict {:?}",
        row.sockets.discarded_dead, row.counts.failures_window, row.judgement.verdict
    );
    Ok(())
}

/// A pooled connection with TCP keep-alive (`TCP_KEEPIDLE=2`,
/// `TCP_KEEPINTVL=1`, `TCP_KEEPCNT=2`) behind a NAT that forgets idle
/// flows after 1 s and drops what it no longer knows: the probes go
/// unanswered, the kernel kills the socket while it is idle (ETIMEDOUT at
/// about 4 s), and the reuse at 8 s fails before a byte is sent.
/// `python3 KEEPALIVE_CLIENT HOST PORT WAIT`; prints one JSON line.
const KEEPALIVE_CLIENT: &str = concat!(
    arrived_fn!(),
    r#"
import json, socket, sys, time
host, port, wait = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
s = socket.create_connection((host, port), timeout=5)
s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, 2)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, 1)
s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT, 2)
s.sendall(b"hello"); s.recv(100)
last = arrived(s)
time.sleep(max(0.0, last + wait - time.monotonic()))
rec = {"gap": wait, "idle": time.monotonic() - last, "local": s.getsockname()[:2]}
try:
    s.sendall(b"ping")
    rec["result"] = "ok" if s.recv(100) else "eof"
except OSError as e:
    rec["result"] = "timed_out" if e.errno == 110 else "error %d" % e.errno
print(json.dumps(rec), flush=True)
s.close()
"#
);

#[test]
fn keepalive_death_behind_a_nat_fails_the_reuse_as_timed_out() -> Result<()> {
    let topo = Topology::routed("kadeath", 1, "drop")?;
    let server = script(ECHO_SERVER)?;
    let _srv = start_server(&topo.ns, topo.server, &format!("python3 {} {} 7610", server.display(), topo.server_v4))?;
    let daemon = Daemon::start(&[])?;
    let client = script(KEEPALIVE_CLIENT)?;
    let out = topo.ns.exec(topo.client, &format!("python3 {} {} 7610 8", client.display(), topo.server_v4))?;
    let recs = client_records(&out)?;
    ensure!(recs.len() == 1 && recs[0].result == "timed_out", "the client's write failed with ETIMEDOUT: {recs:?}");
    let rec = &recs[0];
    daemon.wait_for("the reuse's outcome", Duration::from_secs(5), |evs| {
        !common::reuses_from(evs, rec.local_addr()).is_empty()
    })?;
    std::thread::sleep(Duration::from_millis(700));
    let events = daemon.events();
    let reuses = common::reuses_from(&events, rec.local_addr());
    ensure!(reuses.len() == 1, "one reuse, counted once: {reuses:#?}");
    let ev = &reuses[0];
    assert_eq!(ev.outcome(), Some(Outcome::TimedOut), "{ev:?}");
    assert!(ev.failed_before_send() && ev.safe_to_retry() && ev.keepalive, "{ev:?}");
    assert!((ev.idle_seconds - rec.idle).abs() < common::idle_precision(), "{ev:?} vs {rec:?}");
    let mine = of(&events, rec.local_addr());
    assert!(
        !mine.iter().any(|e| matches!(e.kind(), EventKind::RequestAborted | EventKind::RequestTimeout)),
        "the dead socket's write is no request: {mine:#?}"
    );
    // The kernel's kill is evidence itself: the first unanswered probe went
    // out 2 s after the last segment received, so a flow silent that long
    // was dead.
    let death = mine
        .iter()
        .find(|e| e.kind() == EventKind::PeerCloseWhileIdle && e.how() == Some(How::Timeout))
        .with_context(|| format!("the keep-alive death: {mine:#?}"))?;
    assert!(death.keepalive && death.keepalive_idle_seconds == Some(2.0), "{death:?}");
    assert!(common::fired(death.idle_seconds, 4.0, 0.1), "killed after 2 s + 2 x 1 s of probes: {death:?}");
    let dest = format!("{}:7610", topo.server_v4);
    let row = row_when(&daemon, &dest, 10.0, |r| r.counts.failures_window > 0)?;
    assert_eq!(row.counts.failures_window, 1, "no failure counted twice: {row:#?}");
    assert_eq!(row.failure_mode, observer::diagnosis::table::FailureMode::SilentDrop, "{row:#?}");
    let upper = row.path.upper_seconds.context("an upper bound")?;
    assert!(upper <= 2.0 + common::tolerance(0.05), "the first unanswered probe bounds the timeout: {row:#?}");
    assert_eq!(row.path.idle_timeout_seconds, None, "a death found by probes is no point: {row:#?}");
    eprintln!(
        "MEASURED keep-alive death behind a 1 s NAT: killed at {:.3} s silent (first unanswered probe at 2 s); reuse at {:.3} s timed_out (failed_before_send, keepalive {:?} s); row failures {}, mode {:?}, interval [{:.3}, {:?}]",
        death.idle_seconds,
        ev.idle_seconds,
        ev.keepalive_idle_seconds,
        row.counts.failures_window,
        row.failure_mode,
        row.path.lower_seconds,
        row.path.upper_seconds,
    );
    Ok(())
}

/// A pool of N idle connections, no reader: prints `ready` once all are
/// idle, holds them HOLD seconds, prints `closing`, closes them unwritten
/// and lingers: `python3 IDLE_HOLDER HOST PORT N HOLD`.
const IDLE_HOLDER: &str = r#"
import socket, sys, time
host, port, n, hold = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
socks = []
for _ in range(n):
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(b"hi"); s.recv(100)
    socks.append(s)
print("ready", flush=True)
time.sleep(hold)
print("closing", flush=True)
for s in socks:
    s.close()
time.sleep(30)
"#;

/// Ten pooled connections idle past the server's 2 s idle close: within
/// one refresh of the close, `doomed_idle_sockets` is exactly 10 and names
/// the holding process; after the pool closes them unwritten it is 0, and
/// each close was `discarded_dead`, not a failure.
#[test]
fn doomed_idle_sockets_counts_the_dead_sockets_a_pool_holds() -> Result<()> {
    let topo = Topology::pair("doomed")?;
    let server = script(ECHO_SERVER)?;
    let _srv = start_server(&topo.ns, topo.server, &format!("python3 {} {} 7620 2", server.display(), topo.server_v4))?;
    let daemon = Daemon::start(&[])?;
    let holder = script(IDLE_HOLDER)?;
    let mut pool =
        Killed(topo.ns.spawn(topo.client, &format!("python3 {} {} 7620 10 12", holder.display(), topo.server_v4))?);
    let lines = common::lines_of(&mut pool.0)?;
    common::wait_line(&lines, "ready", 10.0)?;
    let dest = format!("{}:7620", topo.server_v4);
    // The server closes at 2 s; the at-risk view refreshes every 5 s.
    let held = row_when(&daemon, &dest, 9.0, |r| r.sockets.doomed_idle_sockets == 10)?;
    assert!(held.sockets.doomed_owners.iter().any(|o| o.process == "python3"), "the holder is named: {held:#?}");
    assert_eq!(held.counts.failures_window, 0, "{held:#?}");
    common::wait_line(&lines, "closing", 15.0)?;
    let after =
        row_when(&daemon, &dest, 8.0, |r| r.sockets.doomed_idle_sockets == 0 && r.sockets.discarded_dead == 10)?;
    assert_eq!(after.counts.failures_window, 0, "closing a dead socket unwritten is no failure: {after:#?}");
    assert!(after.sockets.doomed_owners.is_empty(), "{after:#?}");
    let events = daemon.events();
    let discarded: Vec<&SockEvent> = events
        .iter()
        .filter(|e| e.kind() == EventKind::DiscardedDead && e.remote.port() == 7620)
        .inspect(|e| assert_eq!(e.how(), Some(How::Fin), "{e:?}"))
        .collect();
    ensure!(discarded.len() == 10, "{discarded:#?}");
    let metrics = daemon.metrics()?;
    let doomed = metric("observer_doomed_idle_sockets").label("destination", &dest).value(&metrics);
    assert_eq!(doomed, Some(0.0), "observer_doomed_idle_sockets for {dest}: {metrics}");
    eprintln!(
        "MEASURED doomed pool of 10 behind a 2 s server: doomed_idle_sockets {} held by {:?}, then {} after the pool closed them; discarded_dead {}",
        held.sockets.doomed_idle_sockets,
        held.sockets.doomed_owners.iter().map(observer::diagnosis::aggregate::ProcessOwner::label).collect::<Vec<_>>(),
        after.sockets.doomed_idle_sockets,
        after.sockets.discarded_dead
    );
    Ok(())
}

/// Three pooled connections to a server that resets them at 1 s idle;
/// the test tells the client when to act: `python3 HELD_CLIENT HOST PORT
/// DIR`. Once the file `DIR/stopped` exists it waits 1.5 s (the resets
/// come meanwhile), writes on `writer`, reads on `reader` (the pool
/// finding it dead), closes both and holds `late`; once `DIR/resumed`
/// exists it waits 0.5 s and writes on `late`. Prints one JSON line per
/// connection acted on, then `done`.
const HELD_CLIENT: &str = concat!(
    arrived_fn!(),
    r#"
import json, os, socket, sys, time
host, port, d = sys.argv[1], int(sys.argv[2]), sys.argv[3]
REQ = b"GET / HTTP/1.1\r\nHost: held\r\n\r\n"
def wait(name):
    while not os.path.exists(os.path.join(d, name)):
        time.sleep(0.01)
conns = {}
for name in ("writer", "reader", "late"):
    s = socket.create_connection((host, port), timeout=5)
    s.sendall(REQ); s.recv(100)
    conns[name] = (s, arrived(s))
print("exchanged", flush=True)
def act(name, write):
    s, last = conns[name]
    rec = {"name": name, "idle": time.monotonic() - last, "local": s.getsockname()[:2]}
    try:
        if write:
            s.sendall(REQ)
            rec["result"] = "ok" if s.recv(100) else "eof"
        else:
            rec["result"] = "data" if s.recv(100) else "eof"
    except OSError as e:
        rec["result"] = "reset" if e.errno == 104 else "error %d" % e.errno
    print(json.dumps(rec), flush=True)
    s.close()
wait("stopped")
time.sleep(1.5)
act("writer", True)
act("reader", False)
print("held", flush=True)
wait("resumed")
time.sleep(0.5)
act("late", True)
print("done", flush=True)
"#
);

/// Wait up to `secs` (x the time slack) until the failed-write hook is
/// attached (`on`) or detached; returns how long that took.
/// Connects the server refuses (an RST to a SYN) on `port`, held open a
/// moment: no connection died, so none is a dead socket waiting for a
/// write, and none is counted unseen when it is closed (the daemon's own
/// refused connect at start once was).
fn refused_connects(topo: &Topology, port: u16) -> Result<()> {
    topo.ns.exec(
        topo.client,
        &format!(
            "python3 -c \"import socket, time\nss = [socket.socket() for _ in range(3)]\nfor s in ss:\n    try: s.connect(('{}', {port}))\n    except ConnectionRefusedError: pass\ntime.sleep(0.5)\n\"",
            topo.server_v4
        ),
    )?;
    Ok(())
}

/// Run `f` with the daemon stopped (SIGSTOP, then SIGCONT whatever `f`
/// returns); returns whether the failed-write hook (program `hook`) was
/// attached meanwhile. No probe stops with the daemon: the kernel keeps
/// counting, but no hook can be attached or detached until it runs again,
/// so the link read at the stop holds for all of it. The daemon sees
/// every namespace: a socket another test left dead may have had the hook
/// attached just before.
fn while_stopped(daemon: &Daemon, hook: Option<u32>, f: impl FnOnce() -> Result<()>) -> Result<bool> {
    common::sh(&format!("kill -STOP {}", daemon.pid()))?;
    let run = || -> Result<bool> {
        let linked = match hook {
            Some(id) => hook_linked(daemon.pid(), id)?,
            None => false,
        };
        f()?;
        Ok(linked)
    };
    let linked = run();
    common::sh(&format!("kill -CONT {}", daemon.pid()))?;
    linked
}

/// The failed-write hook's program id, as the daemon logged it; `None`
/// where the probe set has no such hook.
fn hook_program(daemon: &Daemon) -> Option<u32> {
    daemon.stderr_lines().iter().find_map(|l| {
        let rest = l.split("attached on demand tp_btf/sock_send_length").nth(1)?;
        rest.rsplit(", id ").next()?.trim_end_matches(')').parse::<u32>().ok()
    })
}

/// Whether process `pid` holds a BPF link to program `prog_id` now, from
/// its descriptors' fdinfo (a link's shows `link_type` and `prog_id`).
fn hook_linked(pid: i32, prog_id: u32) -> Result<bool> {
    let want = format!("prog_id:\t{prog_id}\n");
    for fd in std::fs::read_dir(format!("/proc/{pid}/fdinfo"))? {
        // A descriptor closed since the listing is no link.
        let Ok(info) = std::fs::read_to_string(fd?.path()) else { continue };
        if info.contains("link_type:") && info.contains(&want) {
            return Ok(true);
        }
    }
    Ok(false)
}

fn wait_for_hook(daemon: &Daemon, on: bool, secs: f64) -> Result<f64> {
    let start = Instant::now();
    while metric("observer_failed_write_hook_attached").value(&daemon.metrics()?) != Some(f64::from(u8::from(on))) {
        ensure!(
            start.elapsed() < Duration::from_secs_f64(common::tolerance(secs)),
            "the failed-write hook was never {}",
            if on { "attached" } else { "detached" }
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(start.elapsed().as_secs_f64())
}

/// The failed-write hook (`sock_send_length`, on the `tp_btf` set) runs
/// on every `sendmsg` of the host while attached, so it is attached only
/// while a client socket reset idle waits for its application. A socket
/// that dies while it is off is still settled right: the daemon is
/// stopped (SIGSTOP) while three connections die, so no hook comes; the
/// write made then is a failed reuse (dated at the reset, found at the
/// close by the mark a write leaves), the read is `discarded_dead`, and
/// the write made after the daemon resumed is seen by the hook itself.
/// Once no dead socket waits, the hook is detached again.
#[test]
fn a_write_before_the_failed_write_hook_came_is_still_a_failed_reuse() -> Result<()> {
    let topo = Topology::pair("hook")?;
    let server = script(LINGER0_HTTP_SERVER)?;
    let _srv =
        start_server(&topo.ns, topo.server, &format!("python3 {} {} 8071 1.0", server.display(), topo.server_v4))?;
    let daemon = Daemon::start(&[])?;
    let hook_prog = hook_program(&daemon);
    let on_demand = hook_prog.is_some();
    if !on_demand {
        // The fentry set decides these writes in its send probe: no hook
        // to attach, and the writes are seen as they are made.
        eprintln!("MEASURED failed-write hook: not used by this probe set (the fentry send probe decides)");
    }
    if on_demand {
        // Off at the start, or soon once another test's dead socket closed.
        wait_for_hook(&daemon, false, 10.0)?;
    }
    refused_connects(&topo, 8072)?;
    let dir = tempfile::tempdir()?;
    let py = script(HELD_CLIENT)?;
    let mut client = topo
        .ns
        .spawn(topo.client, &format!("python3 {} {} 8071 {}", py.display(), topo.server_v4, dir.path().display()))?;
    let lines = common::lines_of(&mut client)?;
    common::wait_line(&lines, "exchanged", 10.0)?;
    let mut recs = Vec::new();
    let linked_while_stopped = while_stopped(&daemon, hook_prog, || {
        std::fs::write(dir.path().join("stopped"), b"")?;
        for _ in 0..2 {
            recs.push(serde_json::from_str::<serde_json::Value>(&common::wait_line(&lines, "\"name\"", 10.0)?)?);
        }
        common::wait_line(&lines, "held", 5.0)?;
        Ok(())
    })?;
    if on_demand {
        // `late` waits dead.
        wait_for_hook(&daemon, true, 5.0)?;
        // The link reading above tells an attached hook: it sees this one.
        ensure!(hook_linked(daemon.pid(), hook_prog.context("id")?)?, "the attached hook's link in fdinfo");
    }
    std::fs::write(dir.path().join("resumed"), b"")?;
    recs.push(serde_json::from_str(&common::wait_line(&lines, "\"name\"", 10.0)?)?);
    common::wait_line(&lines, "done", 5.0)?;
    let local = |r: &serde_json::Value| -> Result<SocketAddr> {
        Ok(SocketAddr::new(
            r["local"][0].as_str().context("ip")?.parse()?,
            u16::try_from(r["local"][1].as_u64().context("port")?)?,
        ))
    };
    let by_name = |n: &str| recs.iter().find(|r| r["name"] == n).with_context(|| format!("{n} in {recs:?}"));
    for r in &recs {
        ensure!(r["result"] == "reset", "each connection was reset idle and the client saw it: {r}");
    }
    let (writer, reader, late) = (local(by_name("writer")?)?, local(by_name("reader")?)?, local(by_name("late")?)?);
    daemon.wait_for("the three settled", Duration::from_secs(5), |evs| {
        [writer, late].iter().all(|l| evs.iter().any(|e| e.kind() == EventKind::Reuse && e.local == *l))
            && evs.iter().any(|e| e.kind() == EventKind::DiscardedDead && e.local == reader)
    })?;
    std::thread::sleep(Duration::from_millis(500));
    let events = daemon.events();
    let reuse = |l: SocketAddr| -> Result<SockEvent> {
        let mine = of(&events, l);
        let failed: Vec<_> = mine.iter().filter(|e| e.kind() == EventKind::Reuse).collect();
        ensure!(failed.len() == 1, "one reuse: {mine:#?}");
        ensure!(!mine.iter().any(|e| e.kind() == EventKind::DiscardedDead), "never also discarded: {mine:#?}");
        let ev = (**failed[0]).clone();
        ensure!(ev.outcome() == Some(Outcome::Reset) && ev.failed_before_send() && ev.safe_to_retry(), "{ev:?}");
        Ok(ev)
    };
    let w = reuse(writer)?;
    let writer_idle = by_name("writer")?["idle"].as_f64().context("idle")?;
    if on_demand && !linked_while_stopped {
        // Dated at the reset (1.0 s): the write came later, before any hook.
        ensure!(
            common::fired(w.idle_seconds, 1.0, 0.1) && w.idle_seconds <= writer_idle,
            "writer's failed reuse at {} s (reset at 1.0 s, written at {writer_idle} s)",
            w.idle_seconds
        );
    } else {
        // The hook (or the fentry send probe) saw the write as it was made.
        ensure!((w.idle_seconds - writer_idle).abs() < common::idle_precision(), "writer at {} s", w.idle_seconds);
    }
    let l = reuse(late)?;
    let late_idle = by_name("late")?["idle"].as_f64().context("idle")?;
    ensure!((l.idle_seconds - late_idle).abs() < common::idle_precision(), "late at {} vs {late_idle}", l.idle_seconds);
    let mine = of(&events, reader);
    ensure!(!mine.iter().any(|e| e.kind() == EventKind::Reuse), "the reader never wrote: {mine:#?}");
    let body = daemon.metrics()?;
    let unseen = metric("observer_events_lost_total").label("reason", "failed_write_unseen").value(&body);
    ensure!(unseen == Some(0.0), "nothing left unknown: {unseen:?}");
    let attaches = metric("observer_failed_write_hook_attaches_total").value(&body).unwrap_or(0.0);
    let mut detached_after = None;
    if on_demand {
        ensure!(attaches >= 1.0, "attached at least once: {attaches}");
        detached_after = Some(wait_for_hook(&daemon, false, 10.0)?);
    }
    eprintln!(
        "MEASURED failed-write hook on demand: writer written at {writer_idle:.3} s idle while the daemon was stopped (hook attached then: {linked_while_stopped}), failed reuse dated at {:.3} s; reader discarded; late written at {late_idle:.3} s, seen at {:.3} s; unseen {unseen:?}; attaches {attaches}; detached {detached_after:?} s after the last dead socket closed",
        w.idle_seconds, l.idle_seconds
    );
    let _ = client.wait();
    Ok(())
}

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
            && l.contains("(client, http): finding: Go net/http's default 90 s > the path's 5")),
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
    assert_eq!(b.counts.reuses, r.counts.reuses, "the same evidence either way");
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
        // Every test's server has the same address in its own namespace:
        // these servers by their ports.
        .filter(|e| {
            e.kind() == EventKind::ServerName
                && e.remote.ip().to_string() == topo.server_v4
                && (9101..=9104).contains(&e.remote.port())
        })
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

/// The JDK's own HTTP client: one `HttpClient` (HTTP/1.1), a GET after
/// each gap (seconds, comma separated): `java JdkPool URL GAPS`.
const JDK_POOL: &str = r#"
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.time.Duration;

public class JdkPool {
    public static void main(String[] args) throws Exception {
        HttpClient c = HttpClient.newBuilder().version(HttpClient.Version.HTTP_1_1).connectTimeout(Duration.ofSeconds(5)).build();
        HttpRequest r = HttpRequest.newBuilder(URI.create(args[0])).timeout(Duration.ofSeconds(5)).build();
        for (String g : args[1].split(",")) {
            Thread.sleep((long) (Double.parseDouble(g) * 1000));
            System.out.println("status " + c.send(r, HttpResponse.BodyHandlers.ofString()).statusCode());
        }
    }
}
"#;

/// A JDK 17 `java.net.http` client behind nginx closing idle connections
/// at 2 s, the daemon run as the unit runs it (nobody, exactly `CAP_BPF`
/// and `CAP_PERFMON`): the fix names `jdk.httpclient.keepalive.timeout` and
/// JDK 17's 1,200 s default as a finding. The client's own
/// `-Djdk.httpclient.keepalive.timeout=600` on its command line names no
/// library (Apache `HttpClient` was once found in it as a substring).
#[test]
fn a_jdk_http_client_is_named_unprivileged() -> Result<()> {
    let topo = Topology::pair("njdk")?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("JdkPool.java"), JDK_POOL)?;
    sh(&format!("cd {} && javac JdkPool.java", dir.path().display()))?;
    // The JDK by its full path: argv[0] then tells the JDK (its `release`
    // file) without reading another user's /proc/PID/exe.
    let java = sh("readlink -f \"$(command -v java)\"")?.trim().to_owned();
    let _nginx = start_nginx_with(&topo, dir.path(), 2, 8080, "")?;
    let daemon = Daemon::start_as_unit(&[])?;
    let out = topo.ns.exec(
        topo.client,
        &format!(
            "{java} -Djdk.httpclient.keepalive.timeout=600 -cp {} JdkPool http://{}:8080/ 0,1,3,1,3,1,3,1",
            dir.path().display(),
            topo.server_v4
        ),
    )?;
    ensure!(out.matches("status 200").count() == 8, "the JDK client: {out}");
    let rows = settle(&daemon)?;
    let r = row(&rows, &format!("{}:8080", topo.server_v4))?;
    eprintln!(
        "MEASURED JDK java.net.http unprivileged: point {:?}, verdict {}, processes {:?}, fix {:?}",
        r.path.idle_timeout_seconds,
        r.judgement.verdict.as_str(),
        r.processes,
        r.fix_settings
    );
    assert!(r.processes.iter().any(|p| p == "java"), "{r:#?}");
    let jdk = r
        .fix_settings
        .iter()
        .find(|f| f.client == "JDK java.net.http HttpClient")
        .with_context(|| format!("the JDK's client named: {:?}", r.fix_settings))?;
    assert_eq!(jdk.setting, "jdk.httpclient.keepalive.timeout (system property, seconds)");
    assert_eq!(jdk.default_seconds, Some(1200.0), "JDK 17's default: {jdk:?}");
    assert!(jdk.finding.as_deref().is_some_and(|f| f.contains("default 1200 s > the path's 2")), "{jdk:?}");
    assert!(r.fix_settings.iter().all(|f| f.client != "Apache HttpClient"), "{:?}", r.fix_settings);
    Ok(())
}

/// A tmpfs mounted on a directory with the given mode, unmounted on drop,
/// also when the test fails.
struct Tmpfs(std::path::PathBuf);

impl Tmpfs {
    fn mount(dir: &std::path::Path, mode: &str) -> Result<Self> {
        sh(&format!("chmod 755 {d} && mount -t tmpfs -o mode={mode} tmpfs {d}", d = dir.display()))?;
        Ok(Self(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = sh(&format!("umount -l {}", self.0.display()));
    }
}

/// An overlay mount (a lower and an upper layer in `dir`, on a tmpfs of
/// their own: an upper layer cannot be on every file system, not on the
/// guests' shared root; the union at `merged`), unmounted on drop.
struct Overlay {
    merged: std::path::PathBuf,
    _layers: Tmpfs,
}

impl Overlay {
    fn mount(dir: &std::path::Path) -> Result<Self> {
        let layers = Tmpfs::mount(dir, "755")?;
        let d = dir.display();
        sh(&format!(
            "mkdir -p {d}/lower {d}/upper {d}/work {d}/merged && chmod 755 {d}/lower {d}/upper {d}/merged && mount -t overlay overlay -o lowerdir={d}/lower,upperdir={d}/upper,workdir={d}/work {d}/merged"
        ))?;
        Ok(Self { merged: dir.join("merged"), _layers: layers })
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        // Before its layers' tmpfs (a field, dropped after this).
        let _ = sh(&format!("umount -l {}", self.merged.display()));
    }
}

/// Go `net/http` clients run by root, the daemon as the unit runs it (user
/// 65534 with `CAP_BPF` and `CAP_PERFMON`: another user's `/proc/PID/exe`
/// and `/proc/PID/maps` are closed to it). The kernel lists each client's
/// mapped files: one installed where any user may read it is told by its
/// executable, as root tells it (`http.Transport.IdleConnTimeout`), and so
/// is one started from an overlay (a container's root); one whose
/// directory only root may enter cannot be read, and the fix says so
/// instead of passing it off as a runtime without a pool.
#[test]
fn a_go_client_is_named_unprivileged() -> Result<()> {
    let topo = Topology::pair("ngou")?;
    let (dir, closed_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    // Two servers closing at 2 s: one row for the clients the daemon may
    // read, one for the client it may not.
    let _nginx = start_nginx_with(&topo, dir.path(), 2, 8080, "")?;
    let _nginx_closed = start_nginx_with(&topo, closed_dir.path(), 2, 8081, "")?;
    // Each on a tmpfs of its own: a file on an overlay whose layers are on
    // two file systems (a guest's /tmp) shows `stat` another device than
    // the kernel's inode has, and is not taken for the mapped one.
    let (open_dir, shut_dir) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let (open, shut) = (Tmpfs::mount(open_dir.path(), "755")?, Tmpfs::mount(shut_dir.path(), "700")?);
    let tool = common::tlstool()?;
    sh(&format!(
        "install -m 755 {t} {o}/goopen && install -m 755 {t} {s}/goshut",
        o = open.0.display(),
        s = shut.0.display(),
        t = tool.display()
    ))?;
    // A third copy started from an overlay, as a container's root is: its
    // executable maps the layer's file (another inode than the overlay's
    // `exe_file`), which the daemon may open on the host.
    let layers = tempfile::tempdir()?;
    let overlay = Overlay::mount(layers.path())?;
    sh(&format!("install -m 755 {} {}/gooverlay", tool.display(), overlay.merged.display()))?;
    let daemon = Daemon::start_as_unit(&[])?;
    for (bin, port) in
        [(open.0.join("goopen"), 8080), (overlay.merged.join("gooverlay"), 8080), (shut.0.join("goshut"), 8081)]
    {
        let out =
            topo.ns.exec(topo.client, &format!("{} h2 http://{}:{port}/ 0,1,3,1", bin.display(), topo.server_v4))?;
        ensure!(out.matches("\"proto\":\"HTTP/1.1\"").count() == 4, "{}: {out}", bin.display());
    }
    let rows = settle(&daemon)?;
    // Loaded once the daemon is up, as it may not read these processes.
    let files_listed = daemon.stderr_lines().iter().any(|l| l.contains("loaded iter/task_vma"));
    let (r, closed) =
        (row(&rows, &format!("{}:8080", topo.server_v4))?, row(&rows, &format!("{}:8081", topo.server_v4))?);
    eprintln!(
        "MEASURED Go net/http unprivileged (mapped files listed by the kernel: {files_listed}): readable and overlay: point {:?}, verdict {}, processes {:?}, fix {:?}; closed: processes {:?}, fix {:?}",
        r.path.idle_timeout_seconds,
        r.judgement.verdict.as_str(),
        r.processes,
        r.fix_settings,
        closed.processes,
        closed.fix_settings
    );
    ensure!(files_listed, "the task-VMA iterator loaded (5.12+)");
    ensure!(r.processes == ["goopen", "gooverlay"] && closed.processes == ["goshut"], "{r:#?}\n{closed:#?}");
    // Both told by their executable: Go's knob and nothing unknown.
    let clients: Vec<&str> = r.fix_settings.iter().map(|f| f.client.as_str()).collect();
    ensure!(clients == ["Go net/http"], "the readable and the overlay's Go clients named: {:?}", r.fix_settings);
    ensure!(r.fix_settings[0].setting.starts_with("http.Transport.IdleConnTimeout"), "{:?}", r.fix_settings);
    ensure!(
        closed.fix_settings.len() == 1
            && closed.fix_settings[0].client == "unknown"
            && closed.fix_settings[0].setting.contains("not readable with these capabilities"),
        "the one nobody may read says so: {:?}",
        closed.fix_settings
    );
    Ok(())
}

/// `python3 TLS_CLIENT IP PORT NAME GAPS`: HTTP/1.1 over TLS (SNI `NAME`,
/// no verification) on one connection, a request after each gap, a new
/// connection after a failed one; prints the version it negotiated.
const TLS_CLIENT: &str = r#"
import socket, ssl, sys, time
ip, port, name, gaps = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
def connect():
    return ctx.wrap_socket(socket.create_connection((ip, port), timeout=5), server_hostname=name)
def get(c):
    c.sendall(b"GET / HTTP/1.1\r\nHost: " + name.encode() + b"\r\n\r\n")
    return len(c.recv(4096)) > 0
c = connect()
get(c)
failed = 0
for g in gaps.split(","):
    time.sleep(float(g))
    try:
        ok = get(c)
    except (OSError, ssl.SSLError):
        ok = False
    if not ok:
        failed += 1
        c.close()
        c = connect()
        get(c)
print("version", c.version(), "failed", failed, flush=True)
"#;

/// The partner's card over TLS (#48): nginx with TLS 1.3 only on one port
/// and TLS 1.2 only on another, both closing idle connections at 2 s,
/// reached by one name on two addresses (the TLS 1.2 nginx listens on a
/// second one too). Each row lists the version its connections negotiated
/// (read from the client's second flight), and the report's card carries
/// the name, 2 s, `fin`, `["TLSv1.3"]`, both addresses of the name and
/// ours, and the resets of the requests written after nginx's close as
/// nginx's own. The daemon runs as the unit runs it.
#[test]
fn the_partner_card_carries_the_tls_version_negotiated() -> Result<()> {
    let topo = Topology::pair("ncard")?;
    let (d13, d12) = (tempfile::tempdir()?, tempfile::tempdir()?);
    let tool = common::tlstool()?;
    // The name's second address: the TLS 1.2 nginx listens there too.
    let second = "10.201.1.3";
    topo.ns.exec(topo.server, &format!("ip addr add {second}/24 dev s0"))?;
    let mut servers = Vec::new();
    for (dir, port, version) in [(&d13, 8443, "TLSv1.3"), (&d12, 8444, "TLSv1.2")] {
        sh(&format!("{} cert {}", tool.display(), dir.path().display()))?;
        let also = if port == 8444 { format!("; listen {second}:{port} ssl") } else { String::new() };
        let tls = format!(
            "ssl; ssl_certificate {d}/cert.pem; ssl_certificate_key {d}/key.pem; ssl_protocols {version}{also}",
            d = dir.path().display()
        );
        servers.push(start_nginx_with(&topo, dir.path(), 2, port, &tls)?);
    }
    let data = tempfile::tempdir()?;
    let daemon = Daemon::start_as_unit_in(data.path(), &[])?;
    let client = script(TLS_CLIENT)?;
    let name = "api.partner.example";
    // Reuses after 1 s survive; after 3 s nginx has closed at 2 s.
    let gaps = "1,3,1,3,1,3,1";
    let mut said = Vec::new();
    for (ip, port) in [(topo.server_v4.as_str(), 8443), (topo.server_v4.as_str(), 8444), (second, 8444)] {
        let out = topo.ns.exec(topo.client, &format!("python3 {} {ip} {port} {name} {gaps}", client.display()))?;
        said.push(out.trim().to_owned());
    }
    ensure!(said[0].starts_with("version TLSv1.3") && said[1].starts_with("version TLSv1.2"), "clients: {said:?}");
    let rows = settle(&daemon)?;
    let r13 = row(&rows, &format!("{}:8443", topo.server_v4))?;
    let r12 = row(&rows, &format!("{}:8444", topo.server_v4))?;
    eprintln!(
        "MEASURED tls versions: clients {said:?}; rows {:?} / {:?}; names {:?}",
        r13.tls_versions, r12.tls_versions, r13.server_names
    );
    ensure!(r13.tls_versions.iter().map(|v| v.as_str()).eq(["TLSv1.3"]), "{r13:#?}");
    ensure!(r12.tls_versions.iter().map(|v| v.as_str()).eq(["TLSv1.2"]), "{r12:#?}");
    // The report's card (the store's writer flushes every 500 ms).
    std::thread::sleep(Duration::from_secs(2));
    let dest = format!("{}:8443", topo.server_v4);
    let report = Command::new(*OBSERVER)
        .args(["report", "--destination", &dest, "--format", "json", "--data-dir"])
        .arg(data.path())
        .output()?;
    ensure!(report.status.success(), "report: {}", String::from_utf8_lossy(&report.stderr));
    let v: serde_json::Value = serde_json::from_slice(&report.stdout)?;
    let card = &v["partner_card"];
    eprintln!("MEASURED partner card: {card}");
    ensure!(card["name"] == name, "{card}");
    ensure!(card["idle_close"] == "fin", "{card}");
    let t = card["idle_timeout_seconds"].as_f64().context("the point, from nginx's closes")?;
    ensure!((t - 2.0).abs() <= 0.1, "nginx closes at 2 s: {t}");
    ensure!(card["tls_versions"] == serde_json::json!(["TLSv1.3"]), "{card}");
    ensure!(
        card["their_addresses"] == serde_json::json!([topo.server_v4, second]),
        "both addresses of the name: {card}"
    );
    ensure!(card["our_addresses"] == serde_json::json!(["10.201.1.2"]), "{card}");
    ensure!(card["request_deadline_seconds"].is_null(), "no request was cut off: {card}");
    // A request written after nginx's FIN is answered by nginx's RST: the
    // peer, where the kernel allows the hooks that tell it (every guest's);
    // else not told, never guessed.
    let told = !daemon.stderr_lines().iter().any(|l| l.contains("who sent a reset is not told"));
    let want = if told { serde_json::json!("peer") } else { serde_json::Value::Null };
    ensure!(card["reset_from"] == want, "resets from nginx itself (hooks {told}): {card}");
    Ok(())
}

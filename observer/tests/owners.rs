//! Who owns a connection, against the real kernel: the network namespace
//! and cgroup the probes record, the container id read from a cgroup named
//! by Docker's convention, one address in two namespaces as two rows, and
//! `run --netns` / `--cgroup` keeping only their sockets. Needs root.

mod common;

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use anyhow::{bail, ensure, Context as _, Result};
use common::{
    lines_of, metric, sh, start_server, wait_line, Daemon, Killed, Topology, ECHO_SERVER, IDLE_POOL, OBSERVER,
};
use observer::kernel::event::{EventKind, Role, SockEvent};

const CONTAINER: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

/// A cgroup subtree for the test (the v2 hierarchy is mounted for the test
/// if the machine has none), removed with its processes on drop.
struct TestCgroup {
    root: PathBuf,
    dir: PathBuf,
    mounted: Option<tempfile::TempDir>,
}

impl TestCgroup {
    fn create(tag: &str) -> Result<Self> {
        let (root, mounted) = if let Some(r) = observer::kernel::owner::cgroup2_root() {
            (r, None)
        } else {
            let t = tempfile::tempdir()?;
            sh(&format!("mount -t cgroup2 none {}", t.path().display()))?;
            (t.path().to_owned(), Some(t))
        };
        let dir = root.join(format!("observer-test-{tag}-{}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self { root, dir, mounted })
    }

    fn child(&self, name: &str) -> Result<PathBuf> {
        let p = self.dir.join(name);
        std::fs::create_dir(&p).with_context(|| format!("creating {}", p.display()))?;
        Ok(p)
    }

    /// The cgroup path as observer names it (relative to the v2 root).
    fn rel(&self, p: &Path) -> String {
        format!("/{}", p.strip_prefix(&self.root).unwrap_or(p).display())
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        if let Ok(entries) = std::fs::read_dir(&self.dir) {
            for e in entries.flatten().filter(|e| e.path().is_dir()) {
                let procs = std::fs::read_to_string(e.path().join("cgroup.procs")).unwrap_or_default();
                for pid in procs.split_whitespace() {
                    let _ = sh(&format!("kill -9 {pid}"));
                }
                for _ in 0..50 {
                    if std::fs::remove_dir(e.path()).is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(100));
                }
            }
        }
        let _ = std::fs::remove_dir(&self.dir);
        if let Some(t) = &self.mounted {
            let _ = sh(&format!("umount {}", t.path().display()));
        }
    }
}

/// One idle-pool client (one connection, one reuse after 1.5 s) run in
/// namespace `ns` and cgroup `cgroup`; waits for its result line.
fn reuse_from(ns: &str, cgroup: &Path, host: &str, pool: &Path) -> Result<()> {
    // Into the cgroup first: `ip netns exec` remounts /sys, which hides
    // the cgroup tree from the command it runs.
    let cmd = format!(
        "echo $$ > {}/cgroup.procs && exec ip netns exec {ns} python3 {} {host} 7000 1 1.5 0",
        cgroup.display(),
        pool.display()
    );
    let mut child = Command::new("sh")
        .args(["-c", &cmd])
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("spawning the pool client")?;
    let lines = lines_of(&mut child)?;
    let _guard = Killed(child);
    let line = wait_line(&lines, "ok", 15.0).context("the pool client's reuse")?;
    if line.trim() != "ok" {
        bail!("the pool client's reuse failed: {line}");
    }
    Ok(())
}

fn inode(path: &str) -> Result<u32> {
    Ok(u32::try_from(std::fs::metadata(path).with_context(|| format!("stat {path}"))?.ino())?)
}

fn reuses(d: &Daemon) -> Vec<SockEvent> {
    d.events().into_iter().filter(|e| e.kind() == EventKind::Reuse && e.role == Role::Client).collect()
}

#[test]
fn namespaces_cgroups_and_containers() -> Result<()> {
    let topo = Topology::pair("own")?;
    let (client_ns, server_ns) = (topo.ns.name(topo.client).to_owned(), topo.ns.name(topo.server).to_owned());
    let cg = TestCgroup::create("own")?;
    let app = cg.child(&format!("docker-{CONTAINER}.scope"))?;
    let other = cg.child("other")?;
    let pool = common::script(IDLE_POOL)?;
    let echo = common::script(ECHO_SERVER)?;
    let _server = start_server(&topo.ns, topo.server, &format!("python3 {} 0.0.0.0 7000", echo.display()))?;

    let base = ["--min-idle", "1s"];
    let all = Daemon::start(&base)?;
    let netns_path = format!("/run/netns/{client_ns}");
    let by_netns = Daemon::start(&[&base[..], &["--netns", &netns_path]].concat())?;
    let app_path = app.display().to_string();
    let by_cgroup = Daemon::start(&[&base[..], &["--cgroup", &app_path]].concat())?;

    // The "container" and a neighbour in the client namespace, and a third
    // client in the server's namespace reaching the same address.
    reuse_from(&client_ns, &app, &topo.server_v4, &pool)?;
    reuse_from(&client_ns, &other, &topo.server_v4, &pool)?;
    reuse_from(&server_ns, &other, &topo.server_v4, &pool)?;
    std::thread::sleep(Duration::from_secs(2));

    let client_inode = inode(&netns_path)?;
    let server_inode = inode(&format!("/run/netns/{server_ns}"))?;
    let (app_rel, other_rel) = (cg.rel(&app), cg.rel(&other));

    // Unfiltered: every client, each with its namespace and cgroup.
    let seen = reuses(&all);
    let dest = format!("{}:7000", topo.server_v4);
    let ours: Vec<_> = seen.iter().filter(|e| e.remote.to_string() == dest).collect();
    assert_eq!(ours.len(), 3, "three reuses to {dest}: {ours:#?}");
    let app_reuse = ours.iter().find(|e| e.cgroup() == Some(app_rel.as_str())).context("the container's reuse")?;
    assert_eq!(app_reuse.netns, client_inode);
    assert_eq!(app_reuse.container(), Some(CONTAINER), "{app_reuse:?}");
    assert_ne!(app_reuse.cgroup_id, 0);
    assert!(ours.iter().any(|e| e.netns == client_inode && e.cgroup() == Some(other_rel.as_str())));
    let neighbour = ours.iter().find(|e| e.netns == server_inode).context("the server namespace's reuse")?;
    assert_eq!(neighbour.cgroup(), Some(other_rel.as_str()));
    assert_eq!(neighbour.container(), None);
    // One address from two namespaces: two rows, each naming its namespace,
    // the container among the client namespace's owners.
    let rows: Vec<_> =
        all.status()?.into_iter().filter(|r| r.id.destination == dest && r.id.role == Role::Client).collect();
    assert_eq!(rows.len(), 2, "{rows:#?}");
    let client_row =
        rows.iter().find(|r| r.id.netns.inode() == Some(client_inode)).context("the client namespace's row")?;
    assert_eq!(client_row.counts.reuses, 2);
    assert!(client_row.owners.iter().any(|o| o.container() == Some(CONTAINER)), "{:?}", client_row.owners);
    let server_row =
        rows.iter().find(|r| r.id.netns.inode() == Some(server_inode)).context("the server namespace's row")?;
    assert_eq!(server_row.counts.reuses, 1);
    let metrics =
        String::from_utf8(observer::surfaces::http::get(&all.http_addr()?, "/metrics").map_err(anyhow::Error::msg)?)?;
    assert!(
        metrics.contains(&format!(r#"{{destination="{dest}",role="client",netns="{client_inode}",outcome="ok"}}"#)),
        "{metrics}"
    );

    // --netns: the client namespace's sockets only.
    let in_ns = by_netns.events();
    assert!(in_ns.iter().all(|e| e.netns == client_inode), "{in_ns:#?}");
    assert_eq!(reuses(&by_netns).iter().filter(|e| e.remote.to_string() == dest).count(), 2);

    // --cgroup: the container's sockets only.
    let in_cg = by_cgroup.events();
    assert!(in_cg.iter().all(|e| e.cgroup() == Some(app_rel.as_str())), "{in_cg:#?}");
    let r = reuses(&by_cgroup);
    assert_eq!(r.len(), 1, "{r:#?}");
    assert_eq!(r[0].container(), Some(CONTAINER));

    for d in [all, by_netns, by_cgroup] {
        assert!(d.terminate()?.success());
    }
    Ok(())
}

/// A cgroup made a moment after the daemon last looked at the tree (one
/// pod started just after another): under `--cgroup` its sockets' events
/// wait for their owner and are kept, instead of being left out until the
/// next walk (up to 2 s later: a whole pooled exchange here). Without a
/// filter nothing waits: both reuses go on at once (the late one names its
/// cgroup only if the resolver has answered by then: in CI once it had
/// not). Nothing is lost waiting.
#[test]
fn a_cgroup_made_after_the_last_walk_keeps_its_events() -> Result<()> {
    let topo = Topology::pair("late")?;
    let ns = topo.ns.name(topo.client).to_owned();
    let cg = TestCgroup::create("late")?;
    let pool = common::script(IDLE_POOL)?;
    let echo = common::script(ECHO_SERVER)?;
    let _server = start_server(&topo.ns, topo.server, &format!("python3 {} 0.0.0.0 7000", echo.display()))?;
    let base = ["--min-idle", "500ms"];
    let all = Daemon::start(&base)?;
    let subtree = cg.dir.display().to_string();
    let by_cgroup = Daemon::start(&[&base[..], &["--cgroup", &subtree]].concat())?;
    // A first process in a new cgroup makes the daemons look (its reuse
    // wakes them); once both have shown it, a second cgroup is made, and its
    // client connects and reuses within about a second, before another walk
    // of the tree would be due.
    let (first, late) = (cg.dir.join("first"), cg.dir.join("late"));
    let (pool, host) = (pool.display(), &topo.server_v4);
    let dest = format!("{host}:7000");
    let pooled = |dir: &Path, wait: &str| -> Result<()> {
        let cmd = format!(
            "mkdir {d} && echo $$ > {d}/cgroup.procs && exec ip netns exec {ns} python3 {pool} {host} 7000 1 {wait} 0",
            d = dir.display(),
        );
        let out = Command::new("sh").args(["-c", &cmd]).output().context("spawning a pool client")?;
        let said = String::from_utf8_lossy(&out.stdout);
        ensure!(said.lines().any(|l| l.trim() == "ok"), "the pool client in {}: {said}", dir.display());
        Ok(())
    };
    let reused_from = |evs: &[SockEvent], rel: &str| -> usize {
        evs.iter()
            .filter(|e| e.kind() == EventKind::Reuse && e.remote.to_string() == dest && e.cgroup() == Some(rel))
            .count()
    };
    pooled(&first, "0.6")?;
    let first_rel = cg.rel(&first);
    // Seen by both (the unfiltered one may not have its owner yet; the
    // --cgroup one kept it, so it knew the cgroup).
    all.wait_for("the first cgroup's reuse", Duration::from_secs(10), |evs| {
        evs.iter().any(|e| e.kind() == EventKind::Reuse && e.remote.to_string() == dest)
    })?;
    by_cgroup.wait_for("the first cgroup's reuse", Duration::from_secs(10), |evs| reused_from(evs, &first_rel) == 1)?;
    pooled(&late, "0.7")?;
    let late_rel = cg.rel(&late);
    for (who, d) in [("unfiltered", &all), ("--cgroup", &by_cgroup)] {
        let seen = d.wait_for("the late cgroup's reuse", Duration::from_secs(10), |evs| {
            evs.iter().filter(|e| e.kind() == EventKind::Reuse && e.remote.to_string() == dest).count() >= 2
        });
        let seen = seen.with_context(|| format!("{who}: the late cgroup's reuse never came (left out)"))?;
        let r: Vec<&SockEvent> =
            seen.iter().filter(|e| e.kind() == EventKind::Reuse && e.remote.to_string() == dest).collect();
        ensure!(r.len() == 2, "{who}: two reuses: {r:#?}");
        if who == "--cgroup" {
            // The new cgroup's events waited for their owner: kept, named.
            ensure!(reused_from(&seen, &late_rel) == 1, "{who}: the late reuse carries its cgroup: {r:#?}");
            let established = seen
                .iter()
                .filter(|e| e.kind() == EventKind::Established && e.cgroup() == Some(late_rel.as_str()))
                .count();
            ensure!(established == 1, "{who}: its connection's establishment too: {seen:#?}");
        }
    }
    for (who, d) in [("unfiltered", &all), ("--cgroup", &by_cgroup)] {
        let metrics = d.metrics()?;
        ensure!(
            metric("observer_events_lost_total").label("reason", "owner_unresolved").value(&metrics) == Some(0.0),
            "{who}: nothing given up waiting: {metrics}"
        );
        ensure!(
            metric("observer_events_awaiting_owner").value(&metrics) == Some(0.0),
            "{who}: nothing still waiting: {metrics}"
        );
    }
    for d in [all, by_cgroup] {
        ensure!(d.terminate()?.success());
    }
    Ok(())
}

#[test]
fn bad_filters_are_named() -> Result<()> {
    let out = Command::new(*OBSERVER).args(["run", "--cgroup", "/no/such/cgroup"]).output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--cgroup /no/such/cgroup"), "{err}");
    let out = Command::new(*OBSERVER).args(["run", "--netns", "/run/netns/no-such-namespace"]).output()?;
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(err.contains("--netns /run/netns/no-such-namespace") && err.contains("/proc/PID/ns/net"), "{err}");
    Ok(())
}

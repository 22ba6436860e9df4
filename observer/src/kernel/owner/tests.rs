use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use super::*;

const ID: &str = "4f0c1b9e2d3a4b5c6d7e8f901a2b3c4d5e6f708192a3b4c5d6e7f8091a2b3c4d";

#[test]
fn containerd_under_kubernetes_systemd_driver() {
    let path = format!(
        "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e3d4c_5b6a_7980_a1b2_c3d4e5f60718.slice/cri-containerd-{ID}.scope"
    );
    let o = parse(&path);
    assert_eq!(o.container.as_deref(), Some(ID));
    assert_eq!(o.runtime.as_deref(), Some("containerd"));
    assert_eq!(o.pod.as_deref(), Some("1f2e3d4c-5b6a-7980-a1b2-c3d4e5f60718"));
    assert_eq!(o.unit, None, "a container scope is not reported as a unit");
    assert_eq!(o.cgroup, path);
}

#[test]
fn guaranteed_pod_and_cgroupfs_driver() {
    let o = parse(&format!("/kubepods.slice/kubepods-pod0a1b2c3d_0000_1111_2222_333344445555.slice/crio-{ID}.scope"));
    assert_eq!(o.runtime.as_deref(), Some("cri-o"));
    assert_eq!(o.pod.as_deref(), Some("0a1b2c3d-0000-1111-2222-333344445555"));
    let o = parse(&format!("/kubepods/besteffort/pod0a1b2c3d-0000-1111-2222-333344445555/{ID}"));
    assert_eq!(o.container.as_deref(), Some(ID));
    assert_eq!(o.runtime, None, "a bare id does not say which runtime");
    assert_eq!(o.pod.as_deref(), Some("0a1b2c3d-0000-1111-2222-333344445555"));
}

#[test]
fn docker_podman_and_their_monitors() {
    let o = parse(&format!("/system.slice/docker-{ID}.scope"));
    assert_eq!((o.container.as_deref(), o.runtime.as_deref()), (Some(ID), Some("docker")));
    assert_eq!(o.pod, None, "no pod outside kubepods");
    let o = parse(&format!("/docker/{ID}"));
    assert_eq!((o.container.as_deref(), o.runtime.as_deref()), (Some(ID), Some("docker")));
    let o = parse(&format!("/machine.slice/libpod-{ID}.scope/container"));
    assert_eq!((o.container.as_deref(), o.runtime.as_deref()), (Some(ID), Some("podman")));
    let o = parse(&format!("/libpod_parent/libpod-{ID}"));
    assert_eq!(o.runtime.as_deref(), Some("podman"));
    // conmon runs beside the container; it is not the container.
    let o = parse(&format!("/machine.slice/libpod-conmon-{ID}.scope"));
    assert_eq!(o.container, None);
    assert_eq!(o.unit.as_deref(), Some(&*format!("libpod-conmon-{ID}.scope")));
}

#[test]
fn systemd_units_and_plain_paths() {
    let o = parse("/system.slice/nginx.service");
    assert_eq!(o.unit.as_deref(), Some("nginx.service"));
    assert_eq!(o.container, None);
    let o = parse("/user.slice/user-1000.slice/session-3.scope");
    assert_eq!(o.unit.as_deref(), Some("session-3.scope"));
    assert_eq!(parse("/"), Owner { cgroup: "/".into(), ..Owner::default() });
    // A pod-looking name outside kubepods, and a short hex name, are nothing.
    let o = parse("/pod0a1b2c3d-0000-1111-2222-333344445555/abc123");
    assert_eq!((o.pod, o.container), (None, None));
}

#[test]
fn cgroup2_mount_from_mountinfo() {
    let hybrid = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                  40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd\n\
                  41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
    assert_eq!(mountinfo_cgroup2(hybrid), Some(PathBuf::from("/sys/fs/cgroup/unified")));
    let unified = "25 22 0:23 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n";
    assert_eq!(mountinfo_cgroup2(unified), Some(PathBuf::from("/sys/fs/cgroup")));
    // A container's namespaced view mounts a subtree: not the root.
    let nested = "25 22 0:23 /kubepods.slice/x /sys/fs/cgroup ro - cgroup2 cgroup2 rw\n";
    assert_eq!(mountinfo_cgroup2(nested), None);
    let escaped = "25 22 0:23 / /mnt/my\\040cgroup rw - cgroup2 cgroup2 rw\n";
    assert_eq!(mountinfo_cgroup2(escaped), Some(PathBuf::from("/mnt/my cgroup")));
    assert_eq!(mountinfo_cgroup2("garbage\n\n - \n"), None);
    // Non-ASCII stays as written; an escape past a byte is taken literally.
    assert_eq!(unescape_mountinfo("/mnt/grüße\\040x"), "/mnt/grüße x");
    assert_eq!(unescape_mountinfo("/a\\777b\\04"), "/a\\777b\\04");
}

#[test]
fn filter_keeps_subtrees_and_namespaces() {
    let f = Filter { netns: Some(7), cgroup: Some("/system.slice".into()) };
    assert!(f.keeps(7, Some("/system.slice")));
    assert!(f.keeps(7, Some("/system.slice/nginx.service")));
    assert!(!f.keeps(7, Some("/system.slice2/x")), "a sibling with a longer name is outside");
    assert!(!f.keeps(8, Some("/system.slice")));
    assert!(!f.keeps(7, None), "an unknown owner cannot be shown to belong");
    let root = Filter { netns: None, cgroup: Some("/".into()) };
    assert!(root.keeps(1, Some("/anything")));
    assert!(Filter::default().keeps(0, None));
    assert!(Filter::default().is_empty());
}

#[test]
fn filter_paths_are_checked() {
    let dir = std::env::temp_dir().join(format!("observer-owner-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("a/b")).unwrap();
    let f = Filter::new(None, Some(&dir.join("a/b")), Some(&dir)).unwrap();
    assert_eq!(f.cgroup.as_deref(), Some("/a/b"));
    let f = Filter::new(None, Some(Path::new("/a/")), Some(&dir)).unwrap();
    assert_eq!(f.cgroup.as_deref(), Some("/a"));
    let e = Filter::new(None, Some(Path::new("/nope")), Some(&dir)).unwrap_err().to_string();
    assert!(e.contains("--cgroup /nope") && e.contains("not a directory"), "{e}");
    let e = Filter::new(None, Some(Path::new("/a")), None).unwrap_err().to_string();
    assert!(e.contains("no cgroup v2 hierarchy"), "{e}");
    let e = Filter::new(Some(&dir.join("missing")), None, None).unwrap_err().to_string();
    assert!(e.contains("--netns") && e.contains("/run/netns/NAME"), "{e}");
    let me = Filter::new(Some(Path::new("/proc/self/ns/net")), None, None).unwrap();
    assert_eq!(me.netns, netns_of("self"));
    std::fs::remove_dir_all(&dir).unwrap();
}

/// What the resolver says of `id` once its thread has answered (or 10 s).
fn settled(r: &Resolver, id: u64, pid: u32) -> Lookup {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match r.lookup(id, pid) {
            Lookup::Pending if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            other => return other,
        }
    }
}

fn found(l: Lookup) -> Arc<Owner> {
    match l {
        Lookup::Found(o) => o,
        other => panic!("expected an owner, got {other:?}"),
    }
}

#[test]
fn a_lookup_answers_at_once_and_the_walk_runs_on_its_own_thread() {
    let dir = tempfile::tempdir().unwrap();
    let leaf = dir.path().join(format!("system.slice/docker-{ID}.scope"));
    std::fs::create_dir_all(&leaf).unwrap();
    let ino = std::fs::metadata(&leaf).unwrap().ino();
    let r = Resolver::new(Some(dir.path().to_owned()));
    // The caller is never the one who walks: the first answer is "looking".
    assert_eq!(r.lookup(ino, 0), Lookup::Pending);
    let o = found(settled(&r, ino, 0));
    assert_eq!(o.cgroup, format!("/system.slice/docker-{ID}.scope"));
    assert_eq!(o.runtime.as_deref(), Some("docker"));
    assert_eq!(r.scans(), 1);
    // The one walk cached the whole tree.
    assert_eq!(found(r.lookup(std::fs::metadata(dir.path()).unwrap().ino(), 0)).cgroup, "/");
    assert_eq!(r.lookup(0, 0), Lookup::Unknown);
    assert_eq!(Resolver::new(None).lookup(ino, 0), Lookup::Unknown, "no cgroup tree: nothing to look for");
    let mut ev = crate::kernel::event::SockEvent::new(
        0,
        crate::kernel::event::EventKind::Reuse,
        crate::kernel::event::Role::Client,
        "127.0.0.1:1".parse().unwrap(),
        "127.0.0.1:2".parse().unwrap(),
        1.0,
    );
    ev.cgroup_id = ino;
    ev.owner = r.known(ev.cgroup_id, 0).map(|o| Owner::clone(&o));
    assert_eq!(ev.owner.as_ref().and_then(|o| o.container.as_deref()), Some(ID));
    assert!(ev.to_json_line().contains("\"container\""));
}

#[test]
fn a_process_tells_its_cgroup_without_a_walk_unless_it_moved() {
    let tree = tempfile::tempdir().unwrap();
    let proc = tempfile::tempdir().unwrap();
    let app = tree.path().join("system.slice/app.service");
    let other = tree.path().join("system.slice/other.service");
    std::fs::create_dir_all(&app).unwrap();
    std::fs::create_dir_all(&other).unwrap();
    for (pid, text) in [("41", "0::/system.slice/app.service\n"), ("42", "0::/system.slice/app.service\n")] {
        std::fs::create_dir(proc.path().join(pid)).unwrap();
        std::fs::write(proc.path().join(pid).join("cgroup"), text).unwrap();
    }
    let r = Resolver::with_proc(Some(tree.path().to_owned()), proc.path().to_owned());
    let app_id = std::fs::metadata(&app).unwrap().ino();
    assert_eq!(found(settled(&r, app_id, 41)).unit.as_deref(), Some("app.service"));
    assert_eq!(r.scans(), 0, "the process's own file told it: no walk");
    // Process 42 wrote from other.service and has moved to app.service
    // since: its file names a directory of another inode, so a walk decides.
    let other_id = std::fs::metadata(&other).unwrap().ino();
    assert_eq!(found(settled(&r, other_id, 42)).cgroup, "/system.slice/other.service");
    assert_eq!(r.scans(), 1);
}

#[test]
fn an_id_the_walk_did_not_find_starts_no_more_walks() {
    let dir = tempfile::tempdir().unwrap();
    let r = Resolver::new(Some(dir.path().to_owned()));
    // An id of a cgroup that is gone: one walk, then none for it.
    assert_eq!(settled(&r, u64::MAX - 7, 0), Lookup::Unknown);
    assert_eq!(r.scans(), 1);
    assert_eq!(r.lookup(u64::MAX - 7, 0), Lookup::Unknown, "known gone: no waiting");
    // A new cgroup gets its walk once the interval has passed (held back
    // until then: a burst of new ids costs one walk).
    let new = dir.path().join("new");
    std::fs::create_dir(&new).unwrap();
    let asked = Instant::now();
    assert_eq!(found(settled(&r, std::fs::metadata(&new).unwrap().ino(), 0)).cgroup, "/new");
    assert_eq!(r.scans(), 2);
    assert!(asked.elapsed() >= Duration::from_millis(1500), "{:?}", asked.elapsed());
    // The gone cgroup's sockets keep writing: still no walk for it.
    assert_eq!(r.lookup(u64::MAX - 7, 0), Lookup::Unknown);
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(r.scans(), 2, "a gone cgroup walks the tree once, not every 2 s");
}

/// The socket table asks without a process (pid 0). An event's lookup of
/// the same id, with its process, is what the thread asks: no walk waits.
#[test]
fn a_lookup_with_a_process_replaces_one_without() {
    let tree = tempfile::tempdir().unwrap();
    let proc = tempfile::tempdir().unwrap();
    let app = tree.path().join("app.service");
    std::fs::create_dir(proc.path().join("41")).unwrap();
    std::fs::write(proc.path().join("41/cgroup"), "0::/app.service\n").unwrap();
    let r = Resolver::with_proc(Some(tree.path().to_owned()), proc.path().to_owned());
    // A first walk, so the next one is held back 2 s.
    assert_eq!(settled(&r, u64::MAX - 3, 0), Lookup::Unknown);
    assert_eq!(r.scans(), 1);
    // Made after that walk: only a walk 2 s on, or process 41, can tell it.
    std::fs::create_dir(&app).unwrap();
    let app_id = std::fs::metadata(&app).unwrap().ino();
    assert_eq!(r.lookup(app_id, 0), Lookup::Pending);
    let asked = Instant::now();
    assert_eq!(found(settled(&r, app_id, 41)).unit.as_deref(), Some("app.service"));
    assert_eq!(r.scans(), 1, "told by process 41's file, not by a walk");
    assert!(asked.elapsed() < Duration::from_secs(1), "no walk waited for: {:?}", asked.elapsed());
}

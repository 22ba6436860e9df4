//! Who owns a connection: the writing process's cgroup v2 id (from the
//! probes) resolved to its cgroup path, and that path read with the naming
//! conventions of containerd, CRI-O, Docker, Podman, Kubernetes and systemd
//! into a container id, a pod uid and a unit. No container runtime or
//! Kubernetes API is asked: the cgroup tree is the only source.
//!
//! Also the `run --cgroup PATH` / `--netns PATH` filter.

use std::{
    os::unix::fs::MetadataExt as _,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

mod resolver;

pub use resolver::{Lookup, Resolver, MAX_CACHED, MAX_SCAN, RESCAN_EVERY};

/// The cgroup id of the root cgroup (every process on a host without
/// cgroup v2 delegation, or a hybrid host, may sit there).
pub const ROOT_CGROUP_ID: u64 = 1;

/// What a cgroup path says about its owner. The one owner type: events
/// and rows embed it (flattened, so their JSON keeps these fields flat).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Owner {
    /// The cgroup path, relative to the cgroup v2 root (`/` for the root).
    pub cgroup: String,
    /// Container id (64 hex digits) when the path follows a runtime's convention.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
    /// `containerd`, `cri-o`, `docker` or `podman`, when the name says so.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime: Option<String>,
    /// Kubernetes pod uid (with dashes), from a `kubepods` path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    /// The systemd unit (`nginx.service`, `session-3.scope`) the cgroup is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
}

fn is_container_id(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// A pod uid as Kubernetes prints it: 36 characters of hex and dashes.
fn pod_uid(raw: &str) -> Option<String> {
    let uid = raw.replace('_', "-");
    (uid.len() == 36 && uid.bytes().all(|b| b.is_ascii_hexdigit() || b == b'-')).then_some(uid)
}

/// The container named by one path component, and its runtime.
fn container_of(component: &str) -> Option<(String, Option<&'static str>)> {
    const SCOPES: [(&str, &str); 4] =
        [("cri-containerd-", "containerd"), ("crio-", "cri-o"), ("docker-", "docker"), ("libpod-", "podman")];
    let base = component.strip_suffix(".scope").unwrap_or(component);
    for (prefix, runtime) in SCOPES {
        if let Some(id) = base.strip_prefix(prefix) {
            // `crio-conmon-<id>` and `libpod-conmon-<id>` are the monitors,
            // not the container; they fail the id test.
            if is_container_id(id) {
                return Some((id.to_owned(), Some(runtime)));
            }
        }
    }
    // The cgroupfs drivers name the directory after the bare id
    // (`/docker/<id>`, `/kubepods/burstable/pod<uid>/<id>`).
    is_container_id(base).then(|| (base.to_owned(), None))
}

/// Read a cgroup path (relative to the v2 root) by the runtimes' conventions.
#[must_use]
pub fn parse(cgroup: &str) -> Owner {
    let mut owner = Owner { cgroup: cgroup.to_owned(), ..Owner::default() };
    let parts: Vec<&str> = cgroup.split('/').filter(|p| !p.is_empty()).collect();
    let under_kubepods = parts.iter().any(|p| p.starts_with("kubepods"));
    for (i, part) in parts.iter().enumerate() {
        if let Some((id, runtime)) = container_of(part) {
            // The runtime of a bare id: the parent says `docker` (cgroupfs
            // Docker) or `libpod_parent` (cgroupfs Podman).
            let runtime = runtime.or_else(|| match i.checked_sub(1).map(|p| parts[p]) {
                Some("docker") => Some("docker"),
                Some("libpod_parent") => Some("podman"),
                _ => None,
            });
            owner.container = Some(id);
            owner.runtime = runtime.map(str::to_owned);
        }
        if under_kubepods {
            // systemd driver: `kubepods-burstable-pod<uid_with_underscores>.slice`;
            // cgroupfs driver: `pod<uid>`.
            let raw = part.strip_suffix(".slice").and_then(|p| p.rsplit_once("-pod").map(|(_, uid)| uid));
            if let Some(uid) = raw.or_else(|| part.strip_prefix("pod")).and_then(pod_uid) {
                owner.pod = Some(uid);
            }
        }
        let unit = matches!(part.rsplit_once('.'), Some((_, "service" | "scope")));
        if unit && container_of(part).is_none() {
            owner.unit = Some((*part).to_owned());
        }
    }
    owner
}

/// Where the cgroup v2 hierarchy is mounted (`/sys/fs/cgroup` on a unified
/// host, `/sys/fs/cgroup/unified` on a hybrid one), from `/proc/self/mountinfo`.
#[must_use]
pub fn cgroup2_root() -> Option<PathBuf> {
    let info = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo_cgroup2(&info)
}

/// The cgroup2 mount point in a mountinfo text (the first one mounting the root).
#[must_use]
pub fn mountinfo_cgroup2(info: &str) -> Option<PathBuf> {
    info.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let fstype = right.split_whitespace().next()?;
        let mut f = left.split_whitespace();
        let root = f.nth(3)?;
        let mount = f.next()?;
        (fstype == "cgroup2" && root == "/").then(|| PathBuf::from(unescape_mountinfo(mount)))
    })
}

/// Mountinfo escapes space, tab, newline and backslash as octal; other
/// bytes (UTF-8 included) stand as they are.
fn unescape_mountinfo(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b.get(i + 1..i + 4).filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        if let Some(Ok(v)) = octal.map(|d| d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'))).map(u8::try_from) {
            out.push(v);
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Errors of the `--cgroup`/`--netns` filter.
#[derive(Debug, thiserror::Error)]
pub enum FilterError {
    #[error("--netns {0}: {1}; give a network namespace file such as /run/netns/NAME or /proc/PID/ns/net")]
    Netns(PathBuf, std::io::Error),
    #[error("--cgroup {0}: no cgroup v2 hierarchy is mounted; mount one (mount -t cgroup2 none /sys/fs/cgroup) or drop --cgroup")]
    NoCgroup2(PathBuf),
    #[error("--cgroup {0}: not a directory of the cgroup v2 tree at {1}; give a path such as /sys/fs/cgroup/system.slice or /system.slice")]
    Cgroup(PathBuf, PathBuf),
}

/// What `run --cgroup` and `--netns` keep.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Filter {
    /// Only sockets in this network namespace (its inode).
    pub netns: Option<u32>,
    /// Only sockets whose process is in this cgroup subtree (a path
    /// relative to the cgroup v2 root, `/` excluded).
    pub cgroup: Option<String>,
}

impl Filter {
    /// Build the filter from the flags, checking that each path exists.
    ///
    /// # Errors
    /// A namespace file that cannot be read, or a cgroup path outside the
    /// cgroup v2 tree.
    pub fn new(netns: Option<&Path>, cgroup: Option<&Path>, cgroup_root: Option<&Path>) -> Result<Self, FilterError> {
        let netns =
            match netns {
                Some(p) => {
                    let ino = std::fs::metadata(p).map_err(|e| FilterError::Netns(p.to_owned(), e))?.ino();
                    Some(u32::try_from(ino).map_err(|_| {
                        FilterError::Netns(p.to_owned(), std::io::Error::other("not a namespace inode"))
                    })?)
                }
                None => None,
            };
        let cgroup = match cgroup {
            Some(p) => Some(relative_cgroup(p, cgroup_root)?),
            None => None,
        };
        Ok(Self { netns, cgroup })
    }

    /// Nothing is filtered.
    #[must_use]
    pub const fn is_empty(&self) -> bool {
        self.netns.is_none() && self.cgroup.is_none()
    }

    /// Whether a socket in namespace `netns`, owned by cgroup path
    /// `cgroup` (`None`: unknown), is observed. A socket with no known
    /// owner is left out by a cgroup filter: it cannot be shown to belong.
    #[must_use]
    pub fn keeps(&self, netns: u32, cgroup: Option<&str>) -> bool {
        if self.netns.is_some_and(|n| n != netns) {
            return false;
        }
        match (&self.cgroup, cgroup) {
            (None, _) => true,
            (Some(_), None) => false,
            (Some(want), Some(have)) => {
                want == "/"
                    || have == want
                    || (have.starts_with(want.as_str()) && have.as_bytes().get(want.len()) == Some(&b'/'))
            }
        }
    }
}

/// `--cgroup` as a path relative to the v2 root: either a path below the
/// mount (`/sys/fs/cgroup/system.slice`) or one already relative to it
/// (`/system.slice`).
fn relative_cgroup(p: &Path, root: Option<&Path>) -> Result<String, FilterError> {
    let root = root.ok_or_else(|| FilterError::NoCgroup2(p.to_owned()))?;
    let rel = match p.strip_prefix(root) {
        Ok(rel) => rel.to_owned(),
        Err(_) => p.strip_prefix("/").unwrap_or(p).to_owned(),
    };
    if !root.join(&rel).is_dir() {
        return Err(FilterError::Cgroup(p.to_owned(), root.to_owned()));
    }
    let rel = rel.to_string_lossy().trim_end_matches('/').to_owned();
    Ok(format!("/{rel}"))
}

/// The host's network namespace: PID 1's (visible with the host's PID
/// namespace), else this process's; 0 when neither can be read.
#[must_use]
pub fn host_netns() -> u32 {
    netns_of("1").or_else(|| netns_of("self")).unwrap_or(0)
}

/// The network namespace inode of process `pid` (`/proc/PID/ns/net`).
#[must_use]
pub fn netns_of(pid: &str) -> Option<u32> {
    std::fs::metadata(format!("/proc/{pid}/ns/net")).ok().and_then(|m| u32::try_from(m.ino()).ok())
}

#[cfg(test)]
mod tests;

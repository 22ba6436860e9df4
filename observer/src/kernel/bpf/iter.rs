//! BPF iterator plumbing aya does not expose: the link's fd, and iterators
//! created inside other network namespaces.

use std::{
    collections::HashSet,
    fs::File,
    io::{self, Read as _},
    os::{
        fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd},
        unix::fs::MetadataExt as _,
    },
    path::{Path, PathBuf},
};

/// `BPF_LINK_CREATE`, `BPF_ITER_CREATE` and `BPF_TRACE_ITER` (uapi, stable).
const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_ITER_CREATE: libc::c_long = 33;
const BPF_TRACE_ITER: u32 = 28;

fn bpf(cmd: libc::c_long, attr: &mut [u32; 16]) -> io::Result<OwnedFd> {
    // SAFETY: a bpf(2) call with a zero-padded attribute buffer of the
    // size passed; the kernel returns a new fd or -1.
    let fd = unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), std::mem::size_of_val(attr)) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: the kernel handed us this fd.
    Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).map_err(io::Error::other)?) })
}

/// Attach the iterator program: a link iterators are created from.
pub fn link_create(prog: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    let mut attr = [0u32; 16];
    attr[0] = u32::try_from(prog.as_raw_fd()).map_err(io::Error::other)?;
    attr[2] = BPF_TRACE_ITER;
    bpf(BPF_LINK_CREATE, &mut attr)
}

/// Attach a task iterator program to one process only (`pid`, 6.1+:
/// `bpf_iter_link_info.task`): its iterators visit that process's tasks
/// instead of every task on the host. `EINVAL` on older kernels.
pub fn link_create_for_process(prog: BorrowedFd<'_>, pid: u32) -> io::Result<OwnedFd> {
    // `union bpf_iter_link_info`: `task.tid`, `task.pid`, `task.pid_fd`,
    // padded to the union's 16 bytes.
    let info: [u32; 4] = [0, pid, 0, 0];
    let ptr = info.as_ptr() as u64;
    let mut attr = [0u32; 16];
    attr[0] = u32::try_from(prog.as_raw_fd()).map_err(io::Error::other)?;
    attr[2] = BPF_TRACE_ITER;
    // `iter_info` (an aligned u64 at byte 16) and `iter_info_len`.
    #[allow(clippy::cast_possible_truncation, reason = "the pointer split into its two 32-bit halves")]
    {
        attr[4] = ptr as u32;
        attr[5] = (ptr >> 32) as u32;
    }
    attr[6] = u32::try_from(std::mem::size_of_val(&info)).map_err(io::Error::other)?;
    bpf(BPF_LINK_CREATE, &mut attr)
}

/// An iterator over the calling thread's network namespace (fixed
/// when the iterator is created, not when it is read).
pub fn create(link: &OwnedFd) -> io::Result<File> {
    let mut attr = [0u32; 16];
    attr[0] = u32::try_from(link.as_raw_fd()).map_err(io::Error::other)?;
    Ok(File::from(bpf(BPF_ITER_CREATE, &mut attr)?))
}

/// An iterator over the network namespace `ns` (a `/proc/PID/ns/net`
/// path), created from a short-lived thread that enters it.
pub fn create_in(ns: &Path, link: &OwnedFd) -> io::Result<File> {
    let file = File::open(ns)?;
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: setns on a namespace fd; it changes only this thread.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(io::Error::last_os_error());
            }
            create(link)
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("iterator thread panicked")))
    })
}

/// Read an iterator to its end, calling `f` on each record (a
/// `#[repr(C)]` POD record without padding, as the program writes it);
/// returns how many there were.
pub fn stream<R: aya::Pod>(mut file: File, f: &mut impl FnMut(&R)) -> io::Result<usize> {
    let size = std::mem::size_of::<R>();
    let mut buf = vec![0u8; size * 512];
    let (mut filled, mut n) = (0, 0);
    loop {
        let got = match file.read(&mut buf[filled..]) {
            Ok(0) => break,
            Ok(got) => got,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        filled += got;
        // A read may end inside a record: keep its start for the next.
        let whole = filled - filled % size;
        for c in buf[..whole].chunks_exact(size) {
            // SAFETY: exact-size chunk of a POD record without padding.
            f(&unsafe { std::ptr::read_unaligned(c.as_ptr().cast::<R>()) });
            n += 1;
        }
        buf.copy_within(whole..filled, 0);
        filled -= whole;
    }
    if filled != 0 {
        return Err(io::Error::other(format!("the socket iterator ended inside a record ({filled} bytes left)")));
    }
    Ok(n)
}

/// The inode of our own network namespace (0 when `/proc` does not say).
pub fn own_netns() -> u64 {
    std::fs::metadata("/proc/self/ns/net").map_or(0, |m| m.ino())
}

/// Network namespaces in use other than ours, as found in `/proc`.
pub struct OtherNetns {
    /// One `/proc/PID/ns/net` path per namespace, with its inode.
    pub found: Vec<(PathBuf, u64)>,
    /// The first `/proc/PID/ns/net` we were not allowed to read: another
    /// user's process (or one with more capabilities than ours) needs
    /// `CAP_SYS_PTRACE`, so its namespace may be missing from `found`.
    pub refused: Option<(PathBuf, io::Error)>,
}

/// The network namespaces processes use, other than ours. A process that
/// ends while we look is skipped; a link we may not read is reported.
pub fn other_netns() -> OtherNetns {
    let own = own_netns();
    let mut seen = HashSet::from([own]);
    let mut out = OtherNetns { found: Vec::new(), refused: None };
    let Ok(dir) = std::fs::read_dir("/proc") else { return out };
    for entry in dir.flatten() {
        if !entry.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let path = entry.path().join("ns/net");
        match std::fs::metadata(&path) {
            Ok(m) => {
                if seen.insert(m.ino()) {
                    out.found.push((path, m.ino()));
                }
            }
            Err(e) if e.kind() == io::ErrorKind::PermissionDenied && out.refused.is_none() => {
                out.refused = Some((path, e));
            }
            Err(_) => {}
        }
    }
    out
}

//! A process's mapped files as the kernel lists them (the `iter/task_vma`
//! program), for a daemon that may not read another user's
//! `/proc/PID/maps` and `/proc/PID/exe`: the shipped unit grants
//! `CAP_BPF` and `CAP_PERFMON`, not `CAP_SYS_PTRACE`. Owned by the runtime
//! resolver's thread; one run at a time.

use std::{
    io,
    os::fd::{AsFd as _, OwnedFd},
};

use aya::{
    maps::{Array, MapData},
    programs::Iter,
    Btf as AyaBtf, Ebpf,
};
use observer_common::{maps, MappedFile};

use super::{
    hooks::{Hook, HookKind},
    iter,
    load::take_map,
    Attached,
};

/// Mapped files listed per process at most (a JVM maps a few hundred).
pub const MAX_FILES: usize = 4096;

/// The task-VMA iterator's program and link, and the map that names its
/// process.
pub struct ProcessFiles {
    prog: OwnedFd,
    /// Iterates every task; the program writes only the named process's.
    link: OwnedFd,
    /// Whether links to one process work (6.1+); tried first.
    per_process: bool,
    files_of: Array<MapData, u32>,
}

impl ProcessFiles {
    pub(super) fn new(prog: OwnedFd, link: OwnedFd, files_of: Array<MapData, u32>) -> Self {
        Self { prog, link, per_process: true, files_of }
    }

    /// Whether a listing visits the one process only (6.1+), as far as
    /// known: true until a kernel refuses it.
    #[must_use]
    pub const fn per_process(&self) -> bool {
        self.per_process
    }

    /// An iterator over process `tgid`'s tasks where the kernel can make
    /// one (6.1+), else over every task (the program filters).
    fn iterator(&mut self, tgid: u32) -> io::Result<std::fs::File> {
        if self.per_process {
            match iter::link_create_for_process(self.prog.as_fd(), tgid) {
                Ok(link) => return iter::create(&link),
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => self.per_process = false,
                Err(e) => return Err(e),
            }
        }
        iter::create(&self.link)
    }

    /// The file-backed mappings of process `tgid` (its pid as the root
    /// namespace numbers it, as events carry it), one record per mapping,
    /// at most [`MAX_FILES`]. On 6.1+ the iterator visits this process
    /// alone; before, every process's mappings, writing only this one's.
    /// Empty when it has exited.
    pub fn of(&mut self, tgid: u32) -> io::Result<Vec<MappedFile>> {
        self.files_of.set(1, 0, 0).map_err(io::Error::other)?;
        self.files_of.set(0, tgid, 0).map_err(io::Error::other)?;
        let mut files = Vec::new();
        let read = self.iterator(tgid).and_then(|file| {
            iter::stream::<MappedFile>(file, &mut |f| {
                if files.len() < MAX_FILES {
                    files.push(*f);
                }
            })
        });
        // Off before anything is returned: no later run lists it by mistake.
        let cleared = self.files_of.set(0, 0, 0).map_err(io::Error::other);
        read?;
        cleared?;
        Ok(files)
    }
}

/// Load and link the `iter/task_vma` program. A failure is logged, never
/// fatal: processes are then told only as far as their `/proc` is
/// readable.
pub(super) fn load(ebpf: &mut Ebpf, btf: &AyaBtf) -> Option<(ProcessFiles, Attached)> {
    const HOOK: Hook =
        Hook { program: observer_common::program::ITER_TASK_VMA, kind: HookKind::Iter, name: "task_vma" };
    let loaded = (|| -> Result<(OwnedFd, OwnedFd, u32), String> {
        let prog = ebpf.program_mut(HOOK.program).ok_or("not in the object")?;
        let prog: &mut Iter = prog.try_into().map_err(|e| format!("{e}"))?;
        prog.load(HOOK.name, btf).map_err(|e| format!("{e}"))?;
        let fd = prog.fd().map_err(|e| format!("{e}"))?.as_fd().try_clone_to_owned().map_err(|e| format!("{e}"))?;
        let link = iter::link_create(fd.as_fd()).map_err(|e| format!("{e}"))?;
        Ok((fd, link, prog.info().map_err(|e| format!("{e}"))?.id()))
    })();
    let files_of = take_map(ebpf, maps::FILES_OF);
    match (loaded, files_of) {
        (Ok((prog, link, prog_id)), Ok(files_of)) => {
            Some((ProcessFiles::new(prog, link, files_of), Attached { hook: HOOK, prog_id, on_demand: false }))
        }
        (Err(e), _) => {
            log::warn!("another user's process is told only as far as its /proc is readable: iter/task_vma (5.12+) did not load: {e}");
            None
        }
        (_, Err(e)) => {
            log::warn!("another user's process is told only as far as its /proc is readable: {e}");
            None
        }
    }
}

//! `iter/task_vma` (5.12+): for the one process userspace names in
//! `FILES_OF`, its executable (`mm->exe_file`, first: its path, as names
//! leaf first, walked up the dentries and across mounts), then one
//! `MappedFile` per file-backed mapping (its name alone). The executable's
//! record carries its device and inode. This is what
//! `/proc/PID/maps` and `/proc/PID/exe` show, which another user's process
//! keeps from a daemon without `CAP_SYS_PTRACE` (the shipped unit grants
//! `CAP_BPF` and `CAP_PERFMON` only): the client's runtime and pool
//! library are told from it. Run on demand, once per process the daemon
//! cannot read. Plain reads only: `bpf_d_path` would need a `struct file`
//! the verifier trusts, which a VMA's is not on 6.13+.

use core::ffi::c_void;

use aya_ebpf::helpers::generated::{bpf_probe_read_kernel_str, bpf_seq_write};
use observer_common::{MappedFile, MAPPED_FILE_SIZE, MAPPED_NAME_BYTES};

use crate::common::{direct, exe_file, field, global, FILES_OF, MAPPED_SCRATCH, OFFSETS};

/// `struct bpf_iter__task_vma`.
#[repr(C)]
struct IterTaskVma {
    meta: *const *mut c_void,
    task: *mut c_void,
    vma: *mut c_void,
}

observer_common::named_as!(iter_task_vma, ITER_TASK_VMA);

#[no_mangle]
#[link_section = "iter/task_vma"]
pub extern "C" fn iter_task_vma(ctx: *mut c_void) -> i32 {
    // SAFETY: the kernel passes a `struct bpf_iter__task_vma`; `meta` is
    // never NULL and its first field is the seq file; `task` and `vma` are
    // BTF pointers checked for NULL before their fields are loaded; every
    // other kernel read is a probe read.
    unsafe {
        let ctx = &*ctx.cast::<IterTaskVma>();
        let (task, vma) = (ctx.task, ctx.vma);
        if task.is_null() || vma.is_null() {
            return 0;
        }
        let Some(&want) = FILES_OF.get(0) else { return 0 };
        let tgid: u32 = direct(task, &raw const OFFSETS.task_tgid);
        if want == 0 || tgid != want {
            return 0;
        }
        let Some(rec) = MAPPED_SCRATCH.get_ptr_mut(0) else { return 0 };
        let rec = &mut *rec;
        let seq = *ctx.meta;
        // The executable once per listing, from `mm->exe_file` (the path
        // the process started it by: an overlay's, where a VMA maps the
        // layer's file through a private mount no path leads to).
        if let Some(listed) = FILES_OF.get_ptr_mut(1) {
            if *listed == 0 {
                *listed = 1;
                let exe = exe_file(task);
                if !exe.is_null() {
                    executable(rec, tgid, exe);
                    bpf_seq_write(seq.cast(), core::ptr::from_ref::<MappedFile>(rec).cast(), MAPPED_FILE_SIZE as u32);
                }
            }
        }
        let file: *const c_void = field(vma, &raw const OFFSETS.vma_vm_file);
        if file.is_null() {
            return 0;
        }
        // A mapping's name is enough (a library is told by it): one step.
        rec.tgid = tgid;
        rec.flags = 0;
        rec.ino = 0;
        rec.dev = 0;
        leaf_name(rec, file);
        bpf_seq_write(seq.cast(), core::ptr::from_ref::<MappedFile>(rec).cast(), MAPPED_FILE_SIZE as u32);
    }
    0
}

/// Fill `rec` with process `tgid`'s executable `exe`: its inode, device
/// and path.
#[inline(always)]
fn executable(rec: &mut MappedFile, tgid: u32, exe: *const c_void) {
    let inode: *const c_void = field(exe, &raw const OFFSETS.file_inode);
    let sb: *const c_void = field(inode, &raw const OFFSETS.inode_sb);
    rec.tgid = tgid;
    rec.flags = MappedFile::EXECUTABLE;
    rec.ino = field(inode, &raw const OFFSETS.inode_ino);
    rec.dev = field(sb, &raw const OFFSETS.sb_dev);
    walk_path(rec, exe);
}

/// Write `file`'s own name alone into `rec.names` (depth 1, no
/// `WHOLE_PATH`).
#[inline(always)]
fn leaf_name(rec: &mut MappedFile, file: *const c_void) {
    let dentry: *const c_void = field(file, &raw const OFFSETS.file_dentry);
    let name: *const u8 = field(dentry, &raw const OFFSETS.dentry_name);
    let slot = rec.names[0].as_mut_ptr();
    // SAFETY: a probe read of at most one slot into that slot.
    let n = unsafe { bpf_probe_read_kernel_str(slot.cast(), MAPPED_NAME_BYTES as u32, name.cast()) };
    rec.depth = u32::from(n > 1);
}

/// Write `file`'s path into `rec.names`, leaf first, as `d_path` walks
/// it: up the dentries to the mount's root, then from there to where that
/// mount is mounted, until the root mount (its own parent). Sets
/// `WHOLE_PATH` if the root was reached within the bounds. Step `i`
/// writes slot `i` (empty for a mount crossing): one counter, so the
/// verifier's paths through the walk meet again at each step.
#[inline(always)]
fn walk_path(rec: &mut MappedFile, file: *const c_void) {
    let mut dentry: *const c_void = field(file, &raw const OFFSETS.file_dentry);
    let vfsmount: *const c_void = field(file, &raw const OFFSETS.file_mnt);
    let mount_mnt = global(&raw const OFFSETS.mount_mnt) as usize;
    let mut mount: *const c_void = vfsmount.cast::<u8>().wrapping_sub(mount_mnt).cast();
    rec.depth = 0;
    for (step, slot) in rec.names.iter_mut().enumerate() {
        slot[0] = 0;
        let vfs: *const c_void = mount.cast::<u8>().wrapping_add(mount_mnt).cast();
        let root: *const c_void = field(vfs, &raw const OFFSETS.vfsmount_root);
        if dentry == root {
            let parent: *const c_void = field(mount, &raw const OFFSETS.mount_parent);
            if parent.is_null() || parent == mount {
                rec.flags |= MappedFile::WHOLE_PATH;
                return;
            }
            dentry = field(mount, &raw const OFFSETS.mount_mountpoint);
            mount = parent;
        } else {
            let up: *const c_void = field(dentry, &raw const OFFSETS.dentry_parent);
            // The root of a file system not reached through its mount's
            // root: no path from the process's root.
            if up.is_null() || up == dentry {
                return;
            }
            let name: *const u8 = field(dentry, &raw const OFFSETS.dentry_name);
            // SAFETY: a probe read of at most one slot into that slot.
            if unsafe { bpf_probe_read_kernel_str(slot.as_mut_ptr().cast(), MAPPED_NAME_BYTES as u32, name.cast()) }
                <= 1
            {
                return;
            }
            dentry = up;
        }
        rec.depth = step as u32 + 1;
    }
}

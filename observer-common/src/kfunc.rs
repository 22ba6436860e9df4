//! The one kfunc call the probes make, written as a raw instruction
//! because aya 0.14 cannot link kfunc calls: userspace finds it by its
//! marker immediate and writes in the kfunc's BTF ID before loading.

/// Placeholder immediate of the `bpf_rdonly_cast` call.
pub const RDONLY_CAST_MARKER: u32 = 0x0b5e_7ca5;
/// The marker call as the little-endian `u64` the eBPF crate's `.quad`
/// writes into the object.
pub const RDONLY_CAST_CALL: u64 = u64::from_le_bytes(call_bytes(RDONLY_CAST_MARKER));

/// The call's bytes: `BPF_JMP | BPF_CALL` (0x85), `src_reg` =
/// `BPF_PSEUDO_KFUNC_CALL` (2), `dst_reg` 0, `off` 0 (vmlinux BTF),
/// `imm` the kfunc's BTF ID.
#[must_use]
pub const fn call_bytes(imm: u32) -> [u8; 8] {
    let i = imm.to_le_bytes();
    [0x85, 0x20, 0, 0, i[0], i[1], i[2], i[3]]
}

/// Replace the marker immediate of every such call in `object` with
/// `btf_id`; returns how many were replaced. The marker is not an
/// instruction any compiler emits (a kfunc call with an unrelocated
/// immediate), so a match is this call.
pub fn patch(object: &mut [u8], btf_id: u32) -> usize {
    let marker = call_bytes(RDONLY_CAST_MARKER);
    let mut n = 0;
    // Instructions are 8-byte aligned in their section; the section's
    // offset in the file is 8-aligned too, so step by 8.
    let mut i = 0;
    while i + 8 <= object.len() {
        if object[i..i + 8] == marker {
            object[i..i + 8].copy_from_slice(&call_bytes(btf_id));
            n += 1;
        }
        i += 8;
    }
    n
}

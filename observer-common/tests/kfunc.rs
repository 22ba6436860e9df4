//! The loader's patch of the raw `bpf_rdonly_cast` call.

use observer_common::kfunc::{call_bytes, patch, RDONLY_CAST_CALL, RDONLY_CAST_MARKER};

#[test]
fn the_call_is_a_kfunc_call() {
    // BPF_JMP | BPF_CALL, src_reg BPF_PSEUDO_KFUNC_CALL (2), dst_reg 0, off 0,
    // as the llvm-objdump of the built object shows it (`call 0xb5e7ca5`).
    assert_eq!(RDONLY_CAST_CALL, 0x0b5e_7ca5_0000_2085);
    assert_eq!(&call_bytes(7)[..4], &[0x85, 0x20, 0, 0]);
    assert_eq!(&call_bytes(65_504)[4..], &65_504u32.to_le_bytes());
}

#[test]
fn patches_every_aligned_marker_and_nothing_else() {
    let marker = call_bytes(RDONLY_CAST_MARKER);
    let mut obj = vec![0u8; 64];
    obj[16..24].copy_from_slice(&marker);
    obj[40..48].copy_from_slice(&marker);
    // Straddling two instructions: not an instruction, left alone.
    let mut odd = vec![0u8; 64];
    odd[20..28].copy_from_slice(&marker);
    obj.extend_from_slice(&odd);
    assert_eq!(patch(&mut obj, 65_504), 2);
    assert_eq!(obj[16..24], call_bytes(65_504));
    assert_eq!(obj[40..48], call_bytes(65_504));
    assert_eq!(obj[64 + 20..64 + 28], marker, "a misaligned match is not an instruction");
    assert_eq!(patch(&mut obj, 1), 0, "patched calls no longer carry the marker");
}

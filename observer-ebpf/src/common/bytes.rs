//! Byte moves the compiler would otherwise hand to its `memset`/`memmove`
//! subprograms: byte-at-a-time loops reached by a BPF-to-BPF call. Every
//! event cleared 112 bytes and copied three 16-byte arrays that way (123
//! call sites in the state-change program alone, most of its cost per run
//! under connection churn). Here they are aligned 8-byte stores, emitted
//! in line: volatile, so no pass turns them back into a library call.
//! The fields moved sit at 8-aligned offsets (asserted in
//! `observer-common`).

use core::ptr::{read_volatile, write_volatile};

/// Copy 16 bytes between 8-aligned fields.
#[inline(always)]
#[allow(clippy::cast_ptr_alignment, reason = "both fields are 8-aligned (asserted in observer-common)")]
pub(crate) fn copy16(dst: *mut [u8; 16], src: *const [u8; 16]) {
    let (d, s) = (dst.cast::<u64>(), src.cast::<u64>());
    // SAFETY: two aligned 8-byte moves within 16-byte fields.
    unsafe {
        write_volatile(d, read_volatile(s));
        write_volatile(d.add(1), read_volatile(s.add(1)));
    }
}

/// Zero an 8-aligned object whose size is a multiple of 8.
#[inline(always)]
pub(crate) fn zero<T>(p: *mut T) {
    const { assert!(core::mem::size_of::<T>().is_multiple_of(8) && core::mem::align_of::<T>() >= 8) };
    let w = p.cast::<u64>();
    let mut i = 0;
    while i < core::mem::size_of::<T>() / 8 {
        // SAFETY: within the object, aligned.
        unsafe { write_volatile(w.add(i), 0) };
        i += 1;
    }
}

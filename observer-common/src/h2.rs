//! Whether a client's write on a prior-knowledge HTTP/2 connection (one
//! that began with the cleartext preface, as gRPC without TLS) starts a
//! call, told from its frame headers: a call starts with a `HEADERS`
//! frame; `RST_STREAM`, `WINDOW_UPDATE`, `PING`, `SETTINGS` and a call's
//! later `DATA` start none, however many are coalesced into one write.
//! The send probe walks a write made while a reuse is unanswered or its
//! connection stalled with these steps (one 9-byte user read per frame);
//! the host tests them with [`starts_call`].

/// How many frame headers one write's walk reads.
pub const FRAMES: u32 = 4;
/// An HTTP/2 frame header: 24-bit length, type, flags, stream id.
pub const HEADER: u64 = 9;
/// The frame type that starts a call.
const HEADERS: u8 = 1;

/// One step of the walk: the frame header `h` at `off`. `None`: a
/// `HEADERS` frame (the write starts a call); else where the next frame
/// starts.
#[must_use]
pub const fn next_frame(off: u64, h: &[u8; 9]) -> Option<u64> {
    if h[3] == HEADERS {
        return None;
    }
    Some(off + HEADER + ((h[0] as u64) << 16 | (h[1] as u64) << 8 | h[2] as u64))
}

/// What a walk that found no `HEADERS` and stopped at `off` says of a
/// write of `len` bytes: no call if its frames covered it exactly;
/// unknown (`None`) otherwise (more frames than walked, or no HTTP/2).
#[must_use]
pub const fn walked(off: u64, len: u64) -> Option<bool> {
    if off == len {
        Some(false)
    } else {
        None
    }
}

/// The walk over a write of `len` bytes whose frame header at an offset
/// `read` gives (`None`: unreadable, and the walk says unknown). The probe
/// reads each from user memory; the host's tests from a buffer
/// ([`starts_call`]).
#[must_use]
#[inline]
pub fn walk(len: u64, mut read: impl FnMut(u64) -> Option<[u8; 9]>) -> Option<bool> {
    let mut off = 0;
    for _ in 0..FRAMES {
        if off >= len || len - off < HEADER {
            break;
        }
        match next_frame(off, &read(off)?) {
            None => return Some(true),
            Some(next) => off = next,
        }
    }
    walked(off, len)
}

/// [`walk`] over a write held in memory.
#[must_use]
pub fn starts_call(buf: &[u8]) -> Option<bool> {
    walk(buf.len() as u64, |off| {
        let at = usize::try_from(off).ok()?;
        buf.get(at..at + 9)?.try_into().ok()
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use std::{vec, vec::Vec};

    use super::starts_call;

    fn frame(ty: u8, payload: usize) -> Vec<u8> {
        let len = payload.to_be_bytes();
        let n = len.len();
        let mut f = vec![len[n - 3], len[n - 2], len[n - 1], ty, 0, 0, 0, 0, 1];
        f.resize(9 + payload, 0);
        f
    }

    const DATA: u8 = 0;
    const HEADERS: u8 = 1;
    const RST_STREAM: u8 = 3;
    const SETTINGS: u8 = 4;
    const PING: u8 = 6;
    const WINDOW_UPDATE: u8 = 8;

    #[test]
    fn a_call_is_a_write_holding_headers() {
        // gRPC's call: HEADERS then DATA, alone or after a WINDOW_UPDATE.
        assert_eq!(starts_call(&[frame(HEADERS, 40), frame(DATA, 20)].concat()), Some(true));
        assert_eq!(starts_call(&[frame(WINDOW_UPDATE, 4), frame(HEADERS, 40)].concat()), Some(true));
        assert_eq!(starts_call(&frame(HEADERS, 3)), Some(true));
    }

    #[test]
    fn coalesced_control_frames_are_no_call() {
        // Two cancels at once (26 bytes: the size rule counted it a call).
        assert_eq!(starts_call(&[frame(RST_STREAM, 4), frame(RST_STREAM, 4)].concat()), Some(false));
        assert_eq!(starts_call(&[frame(SETTINGS, 0), frame(PING, 8), frame(WINDOW_UPDATE, 4)].concat()), Some(false));
        // A call's later body.
        assert_eq!(starts_call(&frame(DATA, 1000)), Some(false));
    }

    #[test]
    fn what_the_walk_cannot_see_is_unknown() {
        // More frames than walked, before any HEADERS.
        let five = [frame(RST_STREAM, 4), frame(RST_STREAM, 4), frame(RST_STREAM, 4), frame(RST_STREAM, 4)].concat();
        assert_eq!(starts_call(&[five, frame(HEADERS, 10)].concat()), None);
        // A frame longer than the write (cut short), a stub header, no bytes.
        assert_eq!(starts_call(&frame(DATA, 100)[..50]), None);
        assert_eq!(starts_call(&[frame(RST_STREAM, 4), vec![0, 0]].concat()), None);
        assert_eq!(starts_call(&[]), Some(false));
    }
}

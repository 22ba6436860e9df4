//! The TLS version a connection negotiated, told from the client's second
//! flight (its first write after the `ClientHello`): the probes read its
//! first 16 bytes once per TLS connection; this decides, on both sides of
//! the kernel boundary (the probes call it, the host tests it).
//!
//! - TLS 1.3: after an optional `ChangeCipherSpec` (middlebox
//!   compatibility), the client's records are application data (type 23):
//!   its `Finished` is encrypted.
//! - TLS 1.2 and older: a handshake record (type 22: `ClientKeyExchange`,
//!   a client `Certificate`, or a resumed session's `Finished` after
//!   `ChangeCipherSpec`) whose record version is the negotiated one
//!   (3.3 = TLS 1.2, 3.2 = 1.1, 3.1 = 1.0).
//! - A second `ClientHello` (after a `HelloRetryRequest`), or a write of a
//!   lone `ChangeCipherSpec`: the next write tells.

/// What a write of the client's second flight says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flight {
    /// The negotiated version's minor: 1 = TLS 1.0 … 4 = TLS 1.3.
    Version(u8),
    /// Not yet: the next write tells (`after_ccs`: it followed a lone
    /// `ChangeCipherSpec`).
    Next { after_ccs: bool },
    /// Not a TLS second flight: stop looking.
    Unknown,
}

/// Record types.
const CCS: u8 = 20;
const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
/// Handshake message types.
const CLIENT_HELLO: u8 = 1;
const CERTIFICATE: u8 = 11;
const CLIENT_KEY_EXCHANGE: u8 = 16;

/// A record header at `b[at..at + 5]`, version 3.x: its type and minor.
const fn record(b: &[u8; 16], len: usize, at: usize) -> Option<(u8, u8)> {
    if at + 5 > len || b[at + 1] != 3 {
        return None;
    }
    Some((b[at], b[at + 2]))
}

/// The minor of a TLS 1.0–1.2 record version (3.1–3.3) as this module
/// numbers versions (1–3); `None` for anything else.
const fn legacy(minor: u8) -> Option<u8> {
    if minor >= 1 && minor <= 3 {
        Some(minor)
    } else {
        None
    }
}

/// Decide from the first `len` (at most 16) bytes `b` of a write of the
/// client's second flight; `after_ccs`: a lone `ChangeCipherSpec` was the
/// previous write.
#[must_use]
pub const fn second_flight(b: &[u8; 16], len: usize, after_ccs: bool) -> Flight {
    let len = if len > 16 { 16 } else { len };
    let Some((ty, minor)) = record(b, len, 0) else { return Flight::Unknown };
    match ty {
        APPLICATION_DATA => Flight::Version(4),
        CCS => match record(b, len, 6) {
            Some((APPLICATION_DATA, _)) => Flight::Version(4),
            Some((HANDSHAKE, _)) => match legacy(minor) {
                Some(v) => Flight::Version(v),
                None => Flight::Unknown,
            },
            None if len == 6 => Flight::Next { after_ccs: true },
            _ => Flight::Unknown,
        },
        HANDSHAKE if after_ccs => match legacy(minor) {
            Some(v) => Flight::Version(v),
            None => Flight::Unknown,
        },
        HANDSHAKE if len >= 6 => match b[5] {
            CLIENT_HELLO => Flight::Next { after_ccs: false },
            CLIENT_KEY_EXCHANGE | CERTIFICATE => match legacy(minor) {
                Some(v) => Flight::Version(v),
                None => Flight::Unknown,
            },
            _ => Flight::Unknown,
        },
        _ => Flight::Unknown,
    }
}

#[cfg(test)]
mod tests {
    use super::{second_flight, Flight};

    fn of(bytes: &[u8], after_ccs: bool) -> Flight {
        let mut b = [0u8; 16];
        let n = bytes.len().min(16);
        b[..n].copy_from_slice(&bytes[..n]);
        second_flight(&b, bytes.len(), after_ccs)
    }

    const CCS: [u8; 6] = [20, 3, 3, 0, 1, 1];

    #[test]
    fn tls13_with_and_without_the_compatibility_ccs() {
        let fin = [23, 3, 3, 0, 53, 0xaa, 0xbb];
        assert_eq!(of(&fin, false), Flight::Version(4));
        let both = [20, 3, 3, 0, 1, 1, 23, 3, 3, 0, 53, 0xaa];
        assert_eq!(both[..6], CCS);
        assert_eq!(of(&both, false), Flight::Version(4));
        // A lone CCS, then the encrypted Finished in the next write.
        assert_eq!(of(&CCS, false), Flight::Next { after_ccs: true });
        assert_eq!(of(&fin, true), Flight::Version(4));
    }

    #[test]
    fn tls12_and_older_by_the_record_version() {
        // ClientKeyExchange in a 3.3 record.
        assert_eq!(of(&[22, 3, 3, 0, 37, 16, 0, 0, 33], false), Flight::Version(3));
        assert_eq!(of(&[22, 3, 1, 0, 134, 16, 0, 0, 130], false), Flight::Version(1));
        // A client certificate first (mutual TLS 1.2).
        assert_eq!(of(&[22, 3, 3, 3, 0, 11, 0, 2, 250], false), Flight::Version(3));
        // Resumed 1.2: CCS, then the encrypted Finished as a handshake record.
        let resumed = [20, 3, 3, 0, 1, 1, 22, 3, 3, 0, 40, 0x5e];
        assert_eq!(of(&resumed, false), Flight::Version(3));
        assert_eq!(of(&[22, 3, 3, 0, 40, 0x5e], true), Flight::Version(3));
    }

    #[test]
    fn a_retried_hello_waits_and_anything_else_stops() {
        assert_eq!(of(&[22, 3, 1, 2, 0, 1, 0, 1, 252, 3, 3], false), Flight::Next { after_ccs: false });
        assert_eq!(of(b"GET / HTTP/1.1\r\n", false), Flight::Unknown);
        assert_eq!(of(&[23, 2, 0, 0, 1], false), Flight::Unknown);
        assert_eq!(of(&[22, 3, 3], false), Flight::Unknown);
        assert_eq!(of(&[20, 3, 3, 0, 1, 1, 21, 3, 3, 0, 2], false), Flight::Unknown);
        // A version beyond 3.3 in a legacy record is not guessed.
        assert_eq!(of(&[22, 3, 4, 0, 37, 16], false), Flight::Unknown);
    }
}

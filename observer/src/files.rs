//! Files a user names on the command line (`--config`, `path check`),
//! read whole but bounded: one larger than its limit is an error naming
//! the limit, never a read of whatever the path yields (`/dev/zero`, a
//! log, a disk image).

use std::{
    io::{Error, ErrorKind, Read as _},
    path::Path,
};

/// A configuration or path file larger than this is refused (real ones
/// are a few KiB).
pub const MAX_TEXT_BYTES: u64 = 1 << 20;

/// The file's bytes, at most `max` of them; more is an `InvalidData`
/// error that says so.
///
/// # Errors
///
/// The file cannot be opened or read, or is larger than `max` bytes.
pub fn read_bytes(path: &Path, max: u64) -> std::io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(max.saturating_add(1)).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > max {
        return Err(Error::new(ErrorKind::InvalidData, format!("larger than {max} bytes, which no such file is")));
    }
    Ok(bytes)
}

/// The file's text, at most `max` bytes; larger is an `InvalidData`
/// error that says so.
///
/// # Errors
///
/// The file cannot be opened or read, is not UTF-8, or is larger than
/// `max` bytes.
pub fn read_text(path: &Path, max: u64) -> std::io::Result<String> {
    String::from_utf8(read_bytes(path, max)?).map_err(|e| Error::new(ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::{read_text, MAX_TEXT_BYTES};

    #[test]
    fn an_endless_file_is_refused_at_the_limit() {
        let e = read_text(std::path::Path::new("/dev/zero"), MAX_TEXT_BYTES).unwrap_err();
        assert!(e.to_string().contains("larger than 1048576 bytes"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("small.toml");
        std::fs::write(&f, "window = \"1h\"\n").unwrap();
        assert_eq!(read_text(&f, MAX_TEXT_BYTES).unwrap(), "window = \"1h\"\n");
        std::fs::write(&f, "x".repeat(11)).unwrap();
        assert!(read_text(&f, 10).is_err() && read_text(&f, 11).is_ok());
    }
}

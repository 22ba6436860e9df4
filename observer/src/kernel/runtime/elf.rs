//! A Go executable told by its ELF sections: the build info
//! (`\xff Go buildinf:`, Go 1.18+ inline format, in `.go.buildinfo`) and
//! the pool libraries' function names, which stay in the function table
//! (`pclntab`) even when stripped. Only the headers of a non-Go
//! executable are read, and another process's executable is read bounded,
//! whatever its headers claim.

use std::collections::HashMap;

use super::ClientRuntime;

/// A function table larger than this is not searched (no Go binary's is).
const MAX_EXE_BYTES: u64 = 512 << 20;
/// Bytes of another process's executable held at once: the function table
/// is searched a chunk at a time, whatever size its headers claim, so a
/// crafted or odd executable costs the daemon at most this (plus the
/// section headers, at most 4,096 x 64 bytes, and 1 MiB of their names).
pub const EXE_CHUNK_BYTES: usize = 1 << 20;

/// Go libraries with a pool: (name, what shows it in the binary).
const GO_LIBRARIES: &[(&str, &[u8])] = &[
    ("net/http", b"net/http.(*Transport).roundTrip"),
    ("grpc-go", b"google.golang.org/grpc.(*ClientConn).Invoke"),
    ("database/sql", b"database/sql.(*DB).conn"),
    ("pgx", b"github.com/jackc/pgx"),
];

/// The Go version in the build info at `at`: the magic `\xff Go buildinf:`,
/// 16-byte aligned, a pointer
/// size of 4 or 8, the inline-strings flag (Go 1.18+), then the version as
/// a length-prefixed `go1.x` string. Anything else holding the magic (this
/// program's own constant) is no build info.
fn go_version(bytes: &[u8], at: usize) -> Option<&str> {
    if !at.is_multiple_of(16) {
        return None;
    }
    let head = bytes.get(at..at + 32)?;
    if &head[..14] != b"\xff Go buildinf:" || !matches!(head[14], 4 | 8) || head[15] & 2 == 0 {
        return None;
    }
    let len = usize::from(*bytes.get(at + 32)?);
    let v = std::str::from_utf8(bytes.get(at + 33..at + 33 + len)?).ok()?;
    v.starts_with("go1.").then_some(v)
}

/// A 64-bit little-endian ELF executable's sections by name: (file
/// offset, size). Reads the headers only.
fn elf_sections(f: &std::fs::File) -> Option<HashMap<String, (u64, u64)>> {
    use std::os::unix::fs::FileExt as _;
    let mut eh = [0u8; 64];
    f.read_exact_at(&mut eh, 0).ok()?;
    // \x7fELF, ELFCLASS64, ELFDATA2LSB.
    if &eh[..4] != b"\x7fELF" || eh[4] != 2 || eh[5] != 1 {
        return None;
    }
    let u16_at = |b: &[u8], o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
    let u32_at = |b: &[u8], o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap_or_default());
    let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap_or_default());
    let (shoff, shentsize, shnum, shstrndx) = (
        u64_at(&eh, 0x28),
        usize::from(u16_at(&eh, 0x3A)),
        usize::from(u16_at(&eh, 0x3C)),
        usize::from(u16_at(&eh, 0x3E)),
    );
    // An ELF64 section header is 64 bytes; anything else, or a table or
    // section past the end of the file, is no executable we read further.
    let len = f.metadata().ok()?.len();
    let within = |off: u64, size: u64| off.checked_add(size).is_some_and(|end| end <= len);
    if shentsize != 64 || shnum == 0 || shnum > 4096 || shstrndx >= shnum || !within(shoff, (64 * shnum) as u64) {
        return None;
    }
    let mut sh = vec![0u8; shentsize * shnum];
    f.read_exact_at(&mut sh, shoff).ok()?;
    let entry = |i: usize| &sh[i * shentsize..(i + 1) * shentsize];
    let strtab = entry(shstrndx);
    let (str_off, str_size) = (u64_at(strtab, 0x18), u64_at(strtab, 0x20));
    if str_size > 1 << 20 || !within(str_off, str_size) {
        return None;
    }
    let mut names = vec![0u8; usize::try_from(str_size).ok()?];
    f.read_exact_at(&mut names, str_off).ok()?;
    let mut out = HashMap::new();
    for i in 0..shnum {
        let e = entry(i);
        let at = usize::try_from(u32_at(e, 0)).ok()?;
        let name = names.get(at..)?.split(|&b| b == 0).next()?;
        let (off, size) = (u64_at(e, 0x18), u64_at(e, 0x20));
        // SHT_NOBITS (.bss) occupies no file bytes; any other section must
        // lie within the file.
        if u32_at(e, 4) == 8 || within(off, size) {
            out.insert(String::from_utf8_lossy(name).into_owned(), (off, size));
        }
    }
    Some(out)
}

/// Read one section, at most `max` bytes.
fn section(f: &std::fs::File, (off, size): (u64, u64), max: u64) -> Option<Vec<u8>> {
    use std::os::unix::fs::FileExt as _;
    let mut b = vec![0u8; usize::try_from(size.min(max)).ok()?];
    f.read_exact_at(&mut b, off).ok()?;
    Some(b)
}

/// Which of `needles` occur in a section (its first `MAX_EXE_BYTES`),
/// read `EXE_CHUNK_BYTES` at a time; consecutive chunks overlap by the
/// longest needle, so a name across a chunk boundary is found.
fn find_in_section<'a>(
    f: &std::fs::File,
    (off, size): (u64, u64),
    needles: &[(&'a str, &[u8])],
) -> Option<Vec<&'a str>> {
    use std::os::unix::fs::FileExt as _;
    let overlap = needles.iter().map(|(_, n)| n.len()).max().unwrap_or(0).saturating_sub(1);
    let end = off.checked_add(size.min(MAX_EXE_BYTES))?;
    let mut found = vec![false; needles.len()];
    let mut buf = vec![0u8; EXE_CHUNK_BYTES + overlap];
    let (mut at, mut kept) = (off, 0usize);
    while at < end && !found.iter().all(|&x| x) {
        let want = usize::try_from((end - at).min(EXE_CHUNK_BYTES as u64)).ok()?;
        f.read_exact_at(&mut buf[kept..kept + want], at).ok()?;
        let chunk = &buf[..kept + want];
        for (hit, (_, needle)) in found.iter_mut().zip(needles) {
            *hit = *hit || memchr::memmem::find(chunk, needle).is_some();
        }
        // Keep the chunk's tail: a name may continue in the next one.
        kept = overlap.min(chunk.len());
        let tail = chunk.len() - kept;
        buf.copy_within(tail..tail + kept, 0);
        at += want as u64;
    }
    Some(needles.iter().zip(found).filter(|(_, hit)| *hit).map(|((name, _), _)| *name).collect())
}

/// A Go executable by its sections: the build info (`.go.buildinfo`, read
/// whole, small), then the pool functions' names in its function table
/// (`.gopclntab`, or `.data.rel.ro` where a position-independent build
/// keeps it). A non-Go executable costs its headers only.
pub(super) fn of_elf(f: &std::fs::File) -> Option<ClientRuntime> {
    let sections = elf_sections(f)?;
    let info = section(f, *sections.get(".go.buildinfo")?, 1 << 16)?;
    go_version(&info, 0)?;
    let table = sections.get(".gopclntab").or_else(|| sections.get(".data.rel.ro"))?;
    let libraries = find_in_section(f, *table, GO_LIBRARIES)?.into_iter().map(str::to_owned).collect();
    Some(ClientRuntime { runtime: "go".into(), libraries, ..ClientRuntime::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_is_aligned_sized_and_versioned() {
        let mut info = b"\xff Go buildinf:\x08\x02".to_vec();
        info.extend_from_slice(&[0; 16]);
        info.push(8);
        info.extend_from_slice(b"go1.19.8");
        assert_eq!(go_version(&info, 0), Some("go1.19.8"));
        let mut padded = vec![0u8; 3];
        padded.extend_from_slice(&info);
        assert_eq!(go_version(&padded, 3), None, "an unaligned magic is no build info (a constant)");
        let mut old = info.clone();
        old[15] = 0;
        assert_eq!(go_version(&old, 0), None, "before Go 1.18's inline strings");
        info[33..37].copy_from_slice(b"rust");
        assert_eq!(go_version(&info, 0), None);
    }

    /// A crafted ELF64: a header, the section names, a Go build info, and
    /// a function table of `table_len` bytes (sparse: a hole in the file)
    /// holding `name` at `name_at`; its headers may lie (`claimed` is the
    /// table's size as the headers say it, `shentsize` their entry size).
    fn crafted(table_len: u64, name_at: u64, name: &[u8], claimed: u64, shentsize: u16) -> std::fs::File {
        use std::os::unix::fs::FileExt as _;
        let strtab = b"\0.shstrtab\0.go.buildinfo\0.gopclntab\0";
        let mut info = b"\xff Go buildinf:\x08\x02".to_vec();
        info.extend_from_slice(&[0; 16]);
        info.push(8);
        info.extend_from_slice(b"go1.19.8");
        let (str_off, info_off, table_off) = (0x40u64, 0x100u64, 0x1000u64);
        let shoff = table_off + table_len;
        let f = tempfile::tempfile().unwrap();
        let mut eh = [0u8; 64];
        eh[..6].copy_from_slice(b"\x7fELF\x02\x01");
        eh[0x28..0x30].copy_from_slice(&shoff.to_le_bytes());
        eh[0x3A..0x3C].copy_from_slice(&shentsize.to_le_bytes());
        eh[0x3C..0x3E].copy_from_slice(&4u16.to_le_bytes());
        eh[0x3E..0x40].copy_from_slice(&1u16.to_le_bytes());
        f.write_all_at(&eh, 0).unwrap();
        f.write_all_at(strtab, str_off).unwrap();
        f.write_all_at(&info, info_off).unwrap();
        f.write_all_at(name, table_off + name_at).unwrap();
        let header = |name: u32, off: u64, size: u64| {
            let mut h = [0u8; 64];
            h[..4].copy_from_slice(&name.to_le_bytes());
            h[4..8].copy_from_slice(&1u32.to_le_bytes());
            h[0x18..0x20].copy_from_slice(&off.to_le_bytes());
            h[0x20..0x28].copy_from_slice(&size.to_le_bytes());
            h
        };
        let headers = [
            [0u8; 64],
            header(1, str_off, strtab.len() as u64),
            header(11, info_off, info.len() as u64),
            header(25, table_off, claimed),
        ];
        f.write_all_at(&headers.concat(), shoff).unwrap();
        f
    }

    /// Another process's executable is read a chunk at a time, and what
    /// its headers claim is checked against the file: a 64 MiB function
    /// table (sparse) is searched whole, a name across a chunk boundary is
    /// found, and a table, header size or section past the file is refused.
    #[test]
    fn executables_are_read_in_bounded_chunks_and_lying_headers_refused() {
        let name = b"google.golang.org/grpc.(*ClientConn).Invoke";
        let mib = 1u64 << 20;
        let grpc =
            ClientRuntime { runtime: "go".into(), libraries: vec!["grpc-go".into()], ..ClientRuntime::default() };
        let at_end = crafted(64 * mib, 64 * mib - 100, name, 64 * mib, 64);
        assert_eq!(of_elf(&at_end), Some(grpc.clone()), "the whole table is searched");
        let across = crafted(4 * mib, 2 * mib - 10, name, 4 * mib, 64);
        assert_eq!(of_elf(&across), Some(grpc), "a name across a chunk boundary");
        let none = crafted(4 * mib, 0, b"nothing", 4 * mib, 64);
        assert_eq!(of_elf(&none), Some(ClientRuntime { runtime: "go".into(), ..ClientRuntime::default() }));
        // Headers that lie: a 512 MiB table in a 4 MiB file, a header size
        // that is not ELF64's.
        let lying = crafted(4 * mib, 0, name, 512 * mib, 64);
        assert!(!elf_sections(&lying).unwrap().contains_key(".gopclntab"), "a section past the file");
        assert_eq!(of_elf(&lying), None);
        assert_eq!(elf_sections(&crafted(mib, 0, name, mib, 0xFFFF)), None, "shentsize 65535");
        assert_eq!(elf_sections(&crafted(mib, 0, name, mib, 128)), None, "shentsize 128");
    }

    /// A real Go binary (built by the test with Debian's go, when present)
    /// is told by its sections; this test binary, an ELF too, is not Go.
    #[test]
    fn elf_sections_tell_a_go_binary() {
        let me = std::fs::File::open(std::env::current_exe().unwrap()).unwrap();
        assert!(elf_sections(&me).unwrap().contains_key(".text"));
        assert_eq!(of_elf(&me), None);
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("main.go");
        std::fs::write(&src, "package main\nimport \"net/http\"\nfunc main() { http.Get(\"http://127.0.0.1:1/\") }\n")
            .unwrap();
        let built = std::process::Command::new("go")
            .args(["build", "-o"])
            .arg(dir.path().join("gox"))
            .arg(&src)
            .env("GO111MODULE", "off")
            .env("GOCACHE", dir.path().join("cache"))
            .env("HOME", dir.path())
            .status();
        if !built.is_ok_and(|s| s.success()) {
            eprintln!("no go toolchain here: the Go half is checked by the names suite");
            return;
        }
        let go = std::fs::File::open(dir.path().join("gox")).unwrap();
        assert_eq!(
            of_elf(&go),
            Some(ClientRuntime {
                runtime: "go".into(),
                libraries: vec!["net/http".into()],
                ..ClientRuntime::default()
            })
        );
    }
}

//! A small reader of the kernel's BTF (`/sys/kernel/btf/vmlinux`): struct
//! member offsets (through anonymous unions and structs, bitfields
//! included) and enum values. The probes read `struct sock`/`tcp_sock`
//! fields at offsets resolved here at load time, so one eBPF object runs
//! on every kernel layout instead of baking in one kernel's offsets.
//!
//! Format: `Documentation/bpf/btf.rst` (header, type section, string
//! section; type ids start at 1).

use std::{collections::HashMap, path::Path};

/// What can go wrong reading BTF.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BtfError {
    #[error("reading {path}: {reason}; observer needs a kernel built with CONFIG_DEBUG_INFO_BTF=y (most distribution kernels from 5.4 on are)")]
    Missing { path: String, reason: String },
    #[error("BTF data is malformed: {0}")]
    Malformed(&'static str),
    #[error("the kernel's BTF has no {0}")]
    NotFound(String),
}

const MAGIC: u16 = 0xeb9f;
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC: u32 = 12;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Debug, Clone)]
struct Member {
    name: u32,
    ty: u32,
    bit_offset: u32,
    bitfield_size: u32,
}

#[derive(Debug, Clone)]
enum Ty {
    Composite {
        members: Vec<Member>,
    },
    Enum {
        values: Vec<(u32, i64)>,
    },
    /// Const, volatile, restrict, type tag: points at another type.
    Alias(u32),
    /// A named typedef of another type.
    Typedef(u32),
    /// A function (a kfunc is one the kernel lets programs call).
    Func,
    Other,
}

/// Where a member lives in its struct.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FieldPos {
    /// Offset in bits from the start of the struct.
    pub bit_offset: u32,
    /// Width in bits for a bitfield, 0 otherwise.
    pub bitfield_size: u32,
}

impl FieldPos {
    /// Byte holding the field's first bit.
    #[must_use]
    pub const fn byte(self) -> u64 {
        (self.bit_offset / 8) as u64
    }

    /// Shift of the field within that byte (0 for byte-aligned fields).
    #[must_use]
    pub const fn shift(self) -> u64 {
        (self.bit_offset % 8) as u64
    }
}

/// Parsed BTF: types by id and named structs/enums by name.
pub struct Btf {
    strings: Vec<u8>,
    types: Vec<(u32, Ty)>,
    by_name: HashMap<String, Vec<u32>>,
}

fn u32_at(b: &[u8], at: usize) -> Result<u32, BtfError> {
    b.get(at..at + 4).and_then(|s| s.try_into().ok()).map(u32::from_le_bytes).ok_or(BtfError::Malformed("truncated"))
}

impl Btf {
    /// Read the running kernel's BTF.
    pub fn from_sys_fs() -> Result<Self, BtfError> {
        Self::from_file(Path::new("/sys/kernel/btf/vmlinux"))
    }

    pub fn from_file(path: &Path) -> Result<Self, BtfError> {
        let data = std::fs::read(path)
            .map_err(|e| BtfError::Missing { path: path.display().to_string(), reason: e.to_string() })?;
        Self::parse(&data)
    }

    /// Parse little-endian BTF.
    pub fn parse(b: &[u8]) -> Result<Self, BtfError> {
        if b.len() < 24 || u16::from_le_bytes([b[0], b[1]]) != MAGIC {
            return Err(BtfError::Malformed("bad magic (not little-endian BTF)"));
        }
        let hdr_len = u32_at(b, 4)? as usize;
        let (type_off, type_len) = (u32_at(b, 8)? as usize, u32_at(b, 12)? as usize);
        let (str_off, str_len) = (u32_at(b, 16)? as usize, u32_at(b, 20)? as usize);
        let types_b = b
            .get(hdr_len + type_off..hdr_len + type_off + type_len)
            .ok_or(BtfError::Malformed("type section out of range"))?;
        let strings = b
            .get(hdr_len + str_off..hdr_len + str_off + str_len)
            .ok_or(BtfError::Malformed("string section out of range"))?
            .to_vec();
        let mut types = vec![(0, Ty::Other)]; // id 0 is void
        let mut at = 0;
        while at < types_b.len() {
            let name = u32_at(types_b, at)?;
            let info = u32_at(types_b, at + 4)?;
            let size_or_type = u32_at(types_b, at + 8)?;
            at += 12;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            let kind_flag = info >> 31 == 1;
            let ty = match kind {
                KIND_STRUCT | KIND_UNION => {
                    let mut members = Vec::with_capacity(vlen);
                    for i in 0..vlen {
                        let m = at + i * 12;
                        let off = u32_at(types_b, m + 8)?;
                        let (bit_offset, bitfield_size) =
                            if kind_flag { (off & 0x00ff_ffff, off >> 24) } else { (off, 0) };
                        members.push(Member {
                            name: u32_at(types_b, m)?,
                            ty: u32_at(types_b, m + 4)?,
                            bit_offset,
                            bitfield_size,
                        });
                    }
                    at += vlen * 12;
                    Ty::Composite { members }
                }
                KIND_ENUM => {
                    let mut values = Vec::with_capacity(vlen);
                    for i in 0..vlen {
                        let m = at + i * 8;
                        values.push((u32_at(types_b, m)?, i64::from(u32_at(types_b, m + 4)?.cast_signed())));
                    }
                    at += vlen * 8;
                    Ty::Enum { values }
                }
                KIND_ENUM64 => {
                    let mut values = Vec::with_capacity(vlen);
                    for i in 0..vlen {
                        let m = at + i * 12;
                        let v = u64::from(u32_at(types_b, m + 4)?) | (u64::from(u32_at(types_b, m + 8)?) << 32);
                        values.push((u32_at(types_b, m)?, v.cast_signed()));
                    }
                    at += vlen * 12;
                    Ty::Enum { values }
                }
                KIND_TYPEDEF => Ty::Typedef(size_or_type),
                KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => Ty::Alias(size_or_type),
                KIND_INT | KIND_VAR | KIND_DECL_TAG => {
                    at += 4;
                    Ty::Other
                }
                KIND_ARRAY => {
                    at += 12;
                    Ty::Other
                }
                KIND_FUNC => Ty::Func,
                KIND_FUNC_PROTO => {
                    at += vlen * 8;
                    Ty::Other
                }
                KIND_DATASEC => {
                    at += vlen * 12;
                    Ty::Other
                }
                0 | 20.. => return Err(BtfError::Malformed("unknown type kind")),
                _ => Ty::Other,
            };
            types.push((name, ty));
        }
        let mut btf = Self { strings, types, by_name: HashMap::new() };
        for id in 1..btf.types.len() {
            let (name, ty) = &btf.types[id];
            if *name != 0 && matches!(ty, Ty::Composite { .. } | Ty::Enum { .. } | Ty::Typedef(_)) {
                let n = btf.name(*name).to_owned();
                btf.by_name.entry(n).or_default().push(u32::try_from(id).unwrap_or(0));
            }
        }
        Ok(btf)
    }

    fn name(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&c| c == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or("")
    }

    fn resolve(&self, mut id: u32) -> Option<&Ty> {
        for _ in 0..32 {
            match &self.types.get(id as usize)?.1 {
                Ty::Alias(next) | Ty::Typedef(next) => id = *next,
                other => return Some(other),
            }
        }
        None
    }

    /// The member `field` (searching anonymous members), with its type.
    fn find_in(&self, members: &[Member], field: &str, depth: u32) -> Option<(FieldPos, u32)> {
        if depth > 8 {
            return None;
        }
        for m in members {
            let name = self.name(m.name);
            if name == field {
                return Some((FieldPos { bit_offset: m.bit_offset, bitfield_size: m.bitfield_size }, m.ty));
            }
            if name.is_empty() {
                if let Some(Ty::Composite { members: inner }) = self.resolve(m.ty) {
                    if let Some((p, ty)) = self.find_in(inner, field, depth + 1) {
                        return Some((FieldPos { bit_offset: m.bit_offset + p.bit_offset, ..p }, ty));
                    }
                }
            }
        }
        None
    }

    /// The members of the definition of `struct name` (not a forward declaration).
    fn members_of(&self, name: &str) -> Result<&[Member], BtfError> {
        let ids = self.by_name.get(name).ok_or_else(|| BtfError::NotFound(format!("struct {name}")))?;
        ids.iter()
            .find_map(|&id| match self.resolve(id) {
                Some(Ty::Composite { members }) if !members.is_empty() => Some(members.as_slice()),
                _ => None,
            })
            .ok_or_else(|| BtfError::NotFound(format!("struct {name}")))
    }

    /// Position of `field` in `struct name` (searching anonymous members).
    pub fn field(&self, name: &str, field: &str) -> Result<FieldPos, BtfError> {
        let members = self.members_of(name)?;
        self.find_in(members, field, 0)
            .map(|(p, _)| p)
            .ok_or_else(|| BtfError::NotFound(format!("field {name}.{field}")))
    }

    /// Byte offset of a field inside a member of `struct name`, one name
    /// per level (`inet_connection_sock` and `["icsk_ack", "lrcvtime"]`:
    /// a field of a named member whose struct has no name of its own).
    pub fn offset_path(&self, name: &str, path: &[&str]) -> Result<u64, BtfError> {
        let not_found = || BtfError::NotFound(format!("byte-aligned field {name}.{}", path.join(".")));
        let mut members = self.members_of(name)?;
        let mut bits = 0u32;
        for (i, part) in path.iter().enumerate() {
            let (pos, ty) = self.find_in(members, part, 0).ok_or_else(not_found)?;
            bits = bits.checked_add(pos.bit_offset).ok_or_else(not_found)?;
            if i + 1 < path.len() {
                members = match self.resolve(ty) {
                    Some(Ty::Composite { members }) => members,
                    _ => return Err(not_found()),
                };
            } else if pos.bitfield_size != 0 {
                return Err(not_found());
            }
        }
        if path.is_empty() || !bits.is_multiple_of(8) {
            return Err(not_found());
        }
        Ok(u64::from(bits / 8))
    }

    /// Byte offset of a byte-aligned `field` in `struct name`.
    pub fn offset(&self, name: &str, field: &str) -> Result<u64, BtfError> {
        let p = self.field(name, field)?;
        if p.bit_offset % 8 != 0 {
            return Err(BtfError::NotFound(format!("byte-aligned field {name}.{field}")));
        }
        Ok(p.byte())
    }

    /// A struct, union, enum or typedef of this name exists (a BTF
    /// tracepoint `tp` exists as the typedef `btf_trace_<tp>`).
    #[must_use]
    pub fn has_type(&self, name: &str) -> bool {
        self.by_name.contains_key(name)
    }

    /// BTF ID of the definition of `struct name` (not a forward
    /// declaration).
    pub fn struct_id(&self, name: &str) -> Result<u32, BtfError> {
        self.by_name
            .get(name)
            .and_then(|ids| {
                ids.iter().copied().find(|&id| {
                    matches!(self.types.get(id as usize), Some((_, Ty::Composite { members })) if !members.is_empty())
                })
            })
            .ok_or_else(|| BtfError::NotFound(format!("struct {name}")))
    }

    /// BTF ID of the function `name` (a kfunc's ID is what a program's
    /// call instruction names it by).
    #[must_use]
    pub fn func_id(&self, name: &str) -> Option<u32> {
        self.types
            .iter()
            .position(|(n, ty)| matches!(ty, Ty::Func) && self.name(*n) == name)
            .and_then(|id| u32::try_from(id).ok())
    }

    /// Value of `variant` in `enum name`.
    pub fn enum_value(&self, name: &str, variant: &str) -> Result<i64, BtfError> {
        let ids = self.by_name.get(name).ok_or_else(|| BtfError::NotFound(format!("enum {name}")))?;
        ids.iter()
            .find_map(|&id| match self.resolve(id) {
                Some(Ty::Enum { values }) => values.iter().find(|(n, _)| self.name(*n) == variant).map(|(_, v)| *v),
                _ => None,
            })
            .ok_or_else(|| BtfError::NotFound(format!("{name}::{variant}")))
    }
}

#[cfg(test)]
mod tests;

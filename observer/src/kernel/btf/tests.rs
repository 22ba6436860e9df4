use super::*;

/// Builds a BTF blob: `struct outer { int a; union { int b; struct {
/// int c; int d:3; } ; }; }` and `enum e { X = 3 }`.
fn blob() -> Vec<u8> {
    let strings = b"\0int\0outer\0a\0b\0c\0d\0e\0X\0".to_vec();
    let s = |name: &str| -> u32 {
        let pos =
            strings.windows(name.len() + 1).position(|w| &w[..name.len()] == name.as_bytes() && w[name.len()] == 0);
        u32::try_from(pos.unwrap()).unwrap()
    };
    let mut t = Vec::new();
    let mut push = |v: &[u32]| v.iter().for_each(|x| t.extend_from_slice(&x.to_le_bytes()));
    // 1: int
    push(&[s("int"), KIND_INT << 24, 4, 32]);
    // 2: anonymous struct { int c; int d:3; } (kind_flag for bitfields)
    push(&[0, (KIND_STRUCT << 24) | (1 << 31) | 2, 8]);
    push(&[s("c"), 1, 0]);
    push(&[s("d"), 1, (3 << 24) | 0x25]);
    // 3: anonymous union { int b; struct 2; }
    push(&[0, (KIND_UNION << 24) | 2, 8]);
    push(&[s("b"), 1, 0]);
    push(&[0, 2, 0]);
    // 4: struct outer { int a; union 3; }
    push(&[s("outer"), (KIND_STRUCT << 24) | 2, 12]);
    push(&[s("a"), 1, 0]);
    push(&[0, 3, 32]);
    // 5: enum e { X = 3 }
    push(&[s("e"), (KIND_ENUM << 24) | 1, 4]);
    push(&[s("X"), 3]);
    let mut b = Vec::new();
    b.extend_from_slice(&MAGIC.to_le_bytes());
    b.extend_from_slice(&[1, 0]);
    for v in [
        24u32,
        0,
        u32::try_from(t.len()).unwrap(),
        u32::try_from(t.len()).unwrap(),
        u32::try_from(strings.len()).unwrap(),
    ] {
        b.extend_from_slice(&v.to_le_bytes());
    }
    b.extend_from_slice(&t);
    b.extend_from_slice(&strings);
    b
}

#[test]
fn finds_fields_through_anonymous_members_and_bitfields() {
    let btf = Btf::parse(&blob()).unwrap();
    assert_eq!(btf.offset("outer", "a").unwrap(), 0);
    assert_eq!(btf.offset("outer", "b").unwrap(), 4);
    assert_eq!(btf.offset("outer", "c").unwrap(), 4);
    let d = btf.field("outer", "d").unwrap();
    assert_eq!((d.byte(), d.shift(), d.bitfield_size), (8, 5, 3));
    assert!(btf.offset("outer", "d").is_err(), "a bitfield has no byte offset");
    assert_eq!(btf.enum_value("e", "X").unwrap(), 3);
    assert_eq!(btf.field("outer", "zz"), Err(BtfError::NotFound("field outer.zz".into())));
    assert_eq!(btf.field("nope", "a"), Err(BtfError::NotFound("struct nope".into())));
    // A path through members: one level is a plain offset, a scalar has
    // no members, a bitfield no byte offset.
    assert_eq!(btf.offset_path("outer", &["c"]).unwrap(), 4);
    assert!(btf.offset_path("outer", &["a", "b"]).is_err());
    assert!(btf.offset_path("outer", &["d"]).is_err());
    assert!(btf.offset_path("outer", &[]).is_err());
}

#[test]
fn rejects_garbage_without_panicking() {
    assert!(Btf::parse(b"").is_err());
    assert!(Btf::parse(&[0u8; 64]).is_err());
    let mut b = blob();
    b.truncate(b.len() - 20);
    assert!(Btf::parse(&b).is_err());
    let mut b = blob();
    b[24 + 7] = 0x1f; // kind 31 in the first type's info
    assert!(Btf::parse(&b).is_err());
}

#[test]
fn reads_the_running_kernel() {
    // /sys/kernel/btf/vmlinux is world-readable where it exists.
    let Ok(btf) = Btf::from_sys_fs() else { return };
    assert_eq!(btf.offset("sock", "__sk_common").unwrap(), 0);
    assert_eq!(btf.offset("sock_common", "skc_family").unwrap(), 16);
    assert!(btf.offset("tcp_sock", "rcv_nxt").unwrap() > 1000);
    // `icsk_ack` is a named member of an unnamed struct type; `tcp_sock`
    // starts with its `inet_connection_sock`.
    let lrcvtime = btf.offset_path("inet_connection_sock", &["icsk_ack", "lrcvtime"]).unwrap();
    assert!(lrcvtime > btf.offset("inet_connection_sock", "icsk_ack").unwrap());
    assert_eq!(btf.offset_path("tcp_sock", &["inet_conn", "icsk_ack", "lrcvtime"]).unwrap(), lrcvtime);
    assert_eq!(btf.enum_value("sock_flags", "SOCK_KEEPOPEN").unwrap(), 3);
    assert!(btf.has_type("btf_trace_inet_sock_set_state"));
    assert!(!btf.has_type("btf_trace_no_such_tracepoint"));
    // The IDs `bpftool btf dump file /sys/kernel/btf/vmlinux` prints as
    // `[ID] STRUCT 'tcp_sock'` and `[ID] FUNC 'bpf_skc_to_tcp_sock'`-style
    // lines; the kernel checks both at load, so here only their shape.
    let id = btf.struct_id("tcp_sock").unwrap();
    assert!(id > 0 && btf.struct_id("no_such_struct").is_err());
    assert!(btf.func_id("tcp_sendmsg_locked").is_some(), "a kernel function is a FUNC");
    assert_eq!(btf.func_id("no_such_function"), None);
}

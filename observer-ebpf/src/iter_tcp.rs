//! `iter/tcp` (5.9+): writes one `SockRecord` per tracked TCP socket into
//! the iterator's seq file, so userspace can list idle ages (the at-risk
//! view) although socket-local storage has no keys to walk; and enters
//! each listening port in `LISTENERS` (listeners older than the probes).

use core::ffi::c_void;

use aya_ebpf::helpers::generated::{bpf_seq_write, bpf_sk_storage_get, bpf_skc_to_tcp_sock};
use observer_common::{role, tcp_state, SockRecord, SockState, SOCK_RECORD_SIZE};

use crate::common::{enter_listener, field, last_activity, netns_read, storage_map, OFFSETS};

/// `struct bpf_iter__tcp`.
#[repr(C)]
struct IterTcp {
    meta: *const *mut c_void,
    sk_common: *mut c_void,
}

observer_common::named_as!(iter_tcp, ITER_TCP);

#[no_mangle]
#[link_section = "iter/tcp"]
pub extern "C" fn iter_tcp(ctx: *mut c_void) -> i32 {
    // SAFETY: the kernel passes a `struct bpf_iter__tcp`; `meta` is never
    // NULL and its first field is the seq file.
    unsafe {
        let ctx = &*ctx.cast::<IterTcp>();
        let skc = ctx.sk_common;
        if skc.is_null() {
            return 0;
        }
        let state: u8 = field(skc, &raw const OFFSETS.skc_state);
        if i32::from(state) == tcp_state::LISTEN {
            let port: u16 = field(skc, &raw const OFFSETS.skc_num);
            enter_listener(role::listener_key(netns_read(skc), port));
            return 0;
        }
        let tp = bpf_skc_to_tcp_sock(skc);
        if tp.is_null() {
            return 0;
        }
        let p = bpf_sk_storage_get(storage_map(), tp.cast(), core::ptr::null_mut(), 0).cast::<SockState>();
        if p.is_null() {
            return 0;
        }
        let st = &*p;
        let rec = SockRecord {
            id: st.id,
            last_ns: last_activity(st),
            req_ns: st.req_ns,
            saddr: st.saddr,
            daddr: st.daddr,
            sport: st.sport,
            dport: st.dport,
            family: st.family,
            role: st.role,
            flags: st.event_flags,
            netns: st.netns,
            pad: 0,
            cgroup_id: st.cgroup_id,
        };
        let seq = *ctx.meta;
        bpf_seq_write(seq.cast(), (&raw const rec).cast(), SOCK_RECORD_SIZE as u32);
    }
    0
}

//! How a received segment arrived: its IP TTL (hop limit on IPv6) and
//! whether it came by the loopback interface. Read from the peer's
//! SYN-ACK and from a received RST only (once each per connection, never
//! per segment): userspace compares the two to tell who sent the reset.

use core::ffi::c_void;

use aya_ebpf::helpers::bpf_probe_read_kernel;
use observer_common::{ttl, SockState};

use super::{
    kernel::field,
    maps::{global, OFFSETS},
};

/// The loopback interface's index in every network namespace
/// (`LOOPBACK_IFINDEX`).
const LOOPBACK_IFINDEX: i32 = 1;

/// TTL (or hop limit) of `skb` as it arrived, and whether it came by
/// loopback; `None` when the offsets are not known or the header is not
/// IPv4 or IPv6 (a TTL is never 0 on arrival).
#[inline(always)]
fn arrival(skb: *const c_void) -> Option<(u8, bool)> {
    if skb.is_null() || global(&raw const OFFSETS.skb_head) == 0 {
        return None;
    }
    let head: *const u8 = field(skb, &raw const OFFSETS.skb_head);
    let nh: u16 = field(skb, &raw const OFFSETS.skb_network_header);
    if head.is_null() {
        return None;
    }
    // SAFETY: pointer arithmetic and probe reads (a failed read is 0:
    // neither version, or no TTL).
    let ttl = unsafe {
        let ip = head.add(usize::from(nh));
        let at = ttl::offset_for_version(bpf_probe_read_kernel(ip).unwrap_or(0))?;
        bpf_probe_read_kernel(ip.add(at)).unwrap_or(0u8)
    };
    let iif: i32 = field(skb, &raw const OFFSETS.skb_iif);
    (ttl != 0).then_some((ttl, iif == LOOPBACK_IFINDEX))
}

/// The peer's SYN-ACK (`tcp_finish_connect`'s `skb`): how far the peer is.
#[inline(always)]
pub fn on_synack(st: &mut SockState, skb: *const c_void) {
    if let Some((t, lo)) = arrival(skb) {
        st.peer_ttl = t;
        if lo {
            st.ttl_flags |= ttl::PEER_LOOPBACK;
        } else {
            st.ttl_flags &= !ttl::PEER_LOOPBACK;
        }
    }
}

/// A received RST (`tcp_reset`'s `skb`), before the reset is acted on:
/// every event it causes carries how it arrived.
#[inline(always)]
pub fn on_reset_arrived(st: &mut SockState, skb: *const c_void) {
    if let Some((t, lo)) = arrival(skb) {
        st.reset_ttl = t;
        st.ttl_flags |= ttl::RESET_SEEN;
        if lo {
            st.ttl_flags |= ttl::RESET_LOOPBACK;
        } else {
            st.ttl_flags &= !ttl::RESET_LOOPBACK;
        }
    }
}

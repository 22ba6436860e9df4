//! Empty BTF tracepoint programs on the hot-path hooks and the state-change
//! hook, in the benchmark's build only (the `bench` feature, which
//! `cargo xtask bench` turns on), attached by
//! `observer run --bench-empty-probes`: their run time is the fixed cost of
//! a program plus the stats accounting, which `cargo xtask bench`
//! subtracts from the real probes' figures.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};

observer_common::named_as!(bench_empty_send, BENCH_EMPTY_SEND);

#[btf_tracepoint(function = "tcp_sendmsg_locked")]
pub fn bench_empty_send(_ctx: BtfTracePointContext) -> i32 {
    0
}

observer_common::named_as!(bench_empty_recv, BENCH_EMPTY_RECV);

#[btf_tracepoint(function = "tcp_rcv_space_adjust")]
pub fn bench_empty_recv(_ctx: BtfTracePointContext) -> i32 {
    0
}

observer_common::named_as!(bench_empty_state, BENCH_EMPTY_STATE);

#[btf_tracepoint(function = "inet_sock_set_state")]
pub fn bench_empty_state(_ctx: BtfTracePointContext) -> i32 {
    0
}

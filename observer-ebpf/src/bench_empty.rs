//! Empty raw tracepoint programs on the hot-path hooks (kernel 6.5+), attached
//! only by `observer run --bench-empty-probes`: their run time is the fixed
//! cost of a program plus the stats accounting, which `cargo xtask bench`
//! subtracts from the real probes' figures.

use aya_ebpf::{macros::raw_tracepoint, programs::RawTracePointContext};

#[raw_tracepoint(tracepoint = "tcp_sendmsg_locked")]
pub fn bench_empty_send(_ctx: RawTracePointContext) -> i32 {
    0
}

#[raw_tracepoint(tracepoint = "sock_recv_length")]
pub fn bench_empty_recv(_ctx: RawTracePointContext) -> i32 {
    0
}

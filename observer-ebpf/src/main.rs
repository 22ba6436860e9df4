//! observer's eBPF programs: per-socket payload bookkeeping on every TCP
//! socket, and the events that attribute resets, EOFs and stalls on a reused
//! socket to its idle age.
//!
//! Hooks, one file each, all BTF tracing programs sharing socket-local
//! storage: send (`tp_btf/tcp_sendmsg_locked`, or `fentry` on the same
//! function where the tracepoint is missing) and receive
//! (`tp_btf/tcp_rcv_space_adjust`) on the hot path; `inet_sock_set_state`,
//! `tcp_receive_reset`, `tcp_retransmit_skb`, `tcp_send_reset` and
//! `tcp_destroy_sock` for state changes; `sock_send_length` (or the
//! `fentry` send probe's entry) for writes the kernel fails before sending;
//! `fentry/tcp_reset` and `fexit/tcp_finish_connect` for how a received RST
//! and the peer's SYN-ACK arrived (who sent a reset); `iter/tcp` for the
//! socket table; `iter/task_vma` for the files a
//! process maps, where the daemon may not read its `/proc`. Kernel struct offsets come
//! from userspace at load time (resolved from the running kernel's BTF).
#![cfg_attr(target_arch = "bpf", no_std)]
#![cfg_attr(target_arch = "bpf", no_main)]
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]
#![cfg_attr(not(target_arch = "bpf"), allow(dead_code, unused_imports))]
#![allow(clippy::inline_always, reason = "BPF helpers are kept inline so each program stays one verifier unit")]
#![allow(clippy::cast_possible_truncation, reason = "the BPF target is 64-bit; u64 -> usize is lossless")]
#![allow(clippy::needless_pass_by_value, reason = "the aya macros hand each program its context by value")]

#[cfg(all(target_arch = "bpf", feature = "bench"))]
mod bench_empty;
#[cfg(target_arch = "bpf")]
mod common;
#[cfg(target_arch = "bpf")]
mod inet_sock_set_state;
#[cfg(target_arch = "bpf")]
mod iter_task_vma;
#[cfg(target_arch = "bpf")]
mod iter_tcp;
#[cfg(target_arch = "bpf")]
mod sock_send_length;
#[cfg(target_arch = "bpf")]
mod tcp_destroy_sock;
#[cfg(target_arch = "bpf")]
mod tcp_finish_connect;
#[cfg(target_arch = "bpf")]
mod tcp_rcv_space_adjust;
#[cfg(target_arch = "bpf")]
mod tcp_receive_reset;
#[cfg(target_arch = "bpf")]
mod tcp_reset;
#[cfg(target_arch = "bpf")]
mod tcp_retransmit_skb;
#[cfg(target_arch = "bpf")]
mod tcp_send_reset;
#[cfg(target_arch = "bpf")]
mod tcp_sendmsg_locked;

#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[cfg(target_arch = "bpf")]
#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";

/// The probes only exist for the BPF target; a host build (clippy, `cargo
/// check --workspace`) compiles this stub instead.
#[cfg(not(target_arch = "bpf"))]
fn main() {}

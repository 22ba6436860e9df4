//! The programs of the eBPF object, by name: the probe crate's functions
//! carry these names (each checked at compile time by `named_as!` next to
//! the function), and the loader attaches them by them.

pub const INET_SOCK_SET_STATE: &str = "inet_sock_set_state";
pub const TCP_RCV_SPACE_ADJUST: &str = "tcp_rcv_space_adjust";
pub const TCP_RCV_SPACE_ADJUST_CAST: &str = "tcp_rcv_space_adjust_cast";
pub const TCP_RECEIVE_RESET: &str = "tcp_receive_reset";
pub const TCP_RETRANSMIT_SKB: &str = "tcp_retransmit_skb";
pub const TCP_DESTROY_SOCK: &str = "tcp_destroy_sock";
pub const SOCK_SEND_LENGTH: &str = "sock_send_length";
pub const TCP_SEND_RESET: &str = "tcp_send_reset";
pub const FENTRY_TCP_V4_SEND_RESET: &str = "fentry_tcp_v4_send_reset";
pub const FENTRY_TCP_V6_SEND_RESET: &str = "fentry_tcp_v6_send_reset";
pub const FENTRY_TCP_RESET: &str = "fentry_tcp_reset";
pub const FEXIT_TCP_FINISH_CONNECT: &str = "fexit_tcp_finish_connect";
pub const ITER_TCP: &str = "iter_tcp";
pub const ITER_TASK_VMA: &str = "iter_task_vma";
pub const TCP_SENDMSG_LOCKED: &str = "tcp_sendmsg_locked";
pub const FENTRY_TCP_SENDMSG_LOCKED: &str = "fentry_tcp_sendmsg_locked";
#[cfg(feature = "bench")]
pub const BENCH_EMPTY_SEND: &str = "bench_empty_send";
#[cfg(feature = "bench")]
pub const BENCH_EMPTY_RECV: &str = "bench_empty_recv";
#[cfg(feature = "bench")]
pub const BENCH_EMPTY_STATE: &str = "bench_empty_state";

/// Every program in the object (the benchmark's empty ones only in a
/// build with the `bench` feature).
pub const ALL: &[&str] = &[
    INET_SOCK_SET_STATE,
    TCP_RCV_SPACE_ADJUST,
    TCP_RCV_SPACE_ADJUST_CAST,
    TCP_RECEIVE_RESET,
    TCP_RETRANSMIT_SKB,
    TCP_DESTROY_SOCK,
    SOCK_SEND_LENGTH,
    TCP_SEND_RESET,
    FENTRY_TCP_V4_SEND_RESET,
    FENTRY_TCP_V6_SEND_RESET,
    FENTRY_TCP_RESET,
    FEXIT_TCP_FINISH_CONNECT,
    ITER_TCP,
    ITER_TASK_VMA,
    TCP_SENDMSG_LOCKED,
    FENTRY_TCP_SENDMSG_LOCKED,
    #[cfg(feature = "bench")]
    BENCH_EMPTY_SEND,
    #[cfg(feature = "bench")]
    BENCH_EMPTY_RECV,
    #[cfg(feature = "bench")]
    BENCH_EMPTY_STATE,
];

/// `a == b`, at compile time.
#[must_use]
pub const fn same(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// Fail the build unless function `f` is named as program `NAME` says:
/// `named_as!(inet_sock_set_state, INET_SOCK_SET_STATE);` next to it.
#[macro_export]
macro_rules! named_as {
    ($f:ident, $name:ident) => {
        const _: () = assert!(
            $crate::program::same(stringify!($f), $crate::program::$name),
            concat!("program `", stringify!($f), "` is not named as observer_common::program::", stringify!($name))
        );
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_compare() {
        for (i, a) in ALL.iter().enumerate() {
            for b in &ALL[i + 1..] {
                assert!(!same(a, b), "{a} listed twice");
            }
            assert!(same(a, a));
        }
        assert!(!same("tcp", "tcp_"));
    }
}

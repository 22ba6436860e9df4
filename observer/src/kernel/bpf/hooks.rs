//! The hooks: which program attaches where, and the probe set chosen
//! for the running kernel (what it has: `tp_btf` tracepoints, `fentry`,
//! the `bpf_rdonly_cast` kfunc).

use aya::programs::{fentry::FEntryLinkId, tp_btf::BtfTracePointLinkId};
use observer_common::program;

use super::BpfError;
use crate::kernel::btf::Btf;

/// How a program attaches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookKind {
    /// BTF-typed tracepoint (`tp_btf`, 5.5+).
    BtfTracePoint,
    /// `fentry` on a kernel function (5.5+, where the kernel allows it).
    FEntry,
    /// `fexit` on a kernel function (as `fentry`).
    FExit,
    /// BPF iterator (`iter/tcp`, 5.9+), run on demand.
    Iter,
}

/// A hook the probe set attaches.
#[derive(Debug, Clone, Copy)]
pub struct Hook {
    /// Program name in the object.
    pub program: &'static str,
    pub kind: HookKind,
    /// Tracepoint or kernel function name.
    pub name: &'static str,
}

impl Hook {
    const fn tp(name: &'static str) -> Self {
        Self { program: name, kind: HookKind::BtfTracePoint, name }
    }
}

/// The receive probe: reaches `tcp_sock` by a helper call.
pub(crate) const RECV: Hook = Hook::tp(program::TCP_RCV_SPACE_ADJUST);
/// The same on 6.2+, by the `bpf_rdonly_cast` kfunc (no call at all).
pub(crate) const RECV_CAST: Hook =
    Hook { program: program::TCP_RCV_SPACE_ADJUST_CAST, kind: HookKind::BtfTracePoint, name: "tcp_rcv_space_adjust" };

/// Hooks every set shares: BTF tracepoints present since 4.16
/// (`tcp_destroy_sock` since 5.3).
pub(crate) const STATE_HOOKS: &[Hook] = &[
    Hook::tp(program::INET_SOCK_SET_STATE),
    RECV,
    Hook::tp(program::TCP_RECEIVE_RESET),
    Hook::tp(program::TCP_RETRANSMIT_SKB),
    Hook::tp(program::TCP_DESTROY_SOCK),
];

/// Writes the kernel fails before sending, on the `tp_btf` set (6.3+):
/// the `tcp_sendmsg_locked` tracepoint never fires for them. Attached on
/// demand (see `watch`).
pub(crate) const SEND_ERROR_TP: Hook = Hook::tp(program::SOCK_SEND_LENGTH);

/// `late_reuse` on 6.16+: the `tcp_send_reset` tracepoint, which covers
/// time-wait sockets since 6.9.
pub(crate) const RESET_TP: Hook = Hook::tp(program::TCP_SEND_RESET);
/// `late_reuse` before that: `fentry` on the functions that send the RST.
pub(crate) const RESET_FENTRY: &[Hook] = &[
    Hook { program: program::FENTRY_TCP_V4_SEND_RESET, kind: HookKind::FEntry, name: "tcp_v4_send_reset" },
    Hook { program: program::FENTRY_TCP_V6_SEND_RESET, kind: HookKind::FEntry, name: "tcp_v6_send_reset" },
];

/// How a received RST and the peer's SYN-ACK arrived (who sent a reset),
/// every set where the kernel allows `fentry`/`fexit`: optional, a
/// refusal leaves every reset's source unknown.
pub(crate) const ARRIVAL: &[Hook] = &[
    Hook { program: program::FENTRY_TCP_RESET, kind: HookKind::FEntry, name: "tcp_reset" },
    Hook { program: program::FEXIT_TCP_FINISH_CONNECT, kind: HookKind::FExit, name: "tcp_finish_connect" },
];

/// The socket table, every set: `iter/tcp`.
pub(crate) const ITER: Hook = Hook { program: program::ITER_TCP, kind: HookKind::Iter, name: "tcp" };

/// Send hook on kernels with the `tcp_sendmsg_locked` tracepoint (6.16+).
pub(crate) const SEND_TP: Hook = Hook::tp(program::TCP_SENDMSG_LOCKED);
/// Send hook elsewhere: `fentry` on the same function.
pub(crate) const SEND_FENTRY: Hook =
    Hook { program: program::FENTRY_TCP_SENDMSG_LOCKED, kind: HookKind::FEntry, name: "tcp_sendmsg_locked" };

/// The hot-path hooks (`--bench-toggle` detaches and re-attaches them).
pub(crate) const HOT_HOOKS: &[&str] = &["tcp_sendmsg_locked", "tcp_rcv_space_adjust"];

/// A hot-path probe's link, while attached.
pub(crate) enum HotLink {
    Tp(BtfTracePointLinkId),
    FEntry(FEntryLinkId),
}

/// Empty programs for benchmarks (`--bench-empty-probes`, the `bench` build).
#[cfg(feature = "bench")]
pub(crate) const BENCH_EMPTY: &[Hook] = &[
    Hook { program: program::BENCH_EMPTY_SEND, kind: HookKind::BtfTracePoint, name: "tcp_sendmsg_locked" },
    Hook { program: program::BENCH_EMPTY_RECV, kind: HookKind::BtfTracePoint, name: "tcp_rcv_space_adjust" },
    Hook { program: program::BENCH_EMPTY_STATE, kind: HookKind::BtfTracePoint, name: "inet_sock_set_state" },
];

/// The set of hooks chosen for the running kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeSet {
    /// Every hook a BTF tracepoint (6.16+).
    TpBtf,
    /// Send hook by `fentry`, the rest BTF tracepoints (5.15+).
    FEntrySend,
}

impl ProbeSet {
    /// Choose the probe set from what the kernel's BTF offers (a BTF
    /// tracepoint exists as the type `btf_trace_<name>`; no tracefs needed,
    /// so this works without root). The reason is for the log.
    pub fn detect(btf: &Btf) -> Result<(Self, &'static str), BpfError> {
        for hook in STATE_HOOKS.iter().chain(std::iter::once(&RESET_TP)) {
            if !btf.has_type(&format!("btf_trace_{}", hook.name)) {
                return Err(BpfError::MissingHook(format!("the tracepoint {}", hook.name)));
            }
        }
        let tp = |h: &Hook| btf.has_type(&format!("btf_trace_{}", h.name));
        if tp(&SEND_TP) && tp(&SEND_ERROR_TP) {
            Ok((Self::TpBtf, "the tcp_sendmsg_locked tracepoint exists (6.16+)"))
        } else {
            Ok((
                Self::FEntrySend,
                "no tcp_sendmsg_locked tracepoint (before 6.16): fentry on tcp_sendmsg_locked and the RST senders",
            ))
        }
    }

    #[must_use]
    pub fn hooks(self) -> Vec<Hook> {
        let (send, reset): (&[Hook], &[Hook]) = match self {
            Self::TpBtf => (std::slice::from_ref(&SEND_TP), std::slice::from_ref(&RESET_TP)),
            Self::FEntrySend => (std::slice::from_ref(&SEND_FENTRY), RESET_FENTRY),
        };
        send.iter()
            .copied()
            .chain(STATE_HOOKS.iter().copied())
            .chain(reset.iter().copied())
            .chain(std::iter::once(ITER))
            .collect()
    }

    /// The hook loaded with the set but attached only while it is needed:
    /// `sock_send_length` on the `tp_btf` set (it runs on every `sendmsg`
    /// of every socket, for writes on dead client sockets only).
    #[must_use]
    pub const fn on_demand(self) -> Option<Hook> {
        match self {
            Self::TpBtf => Some(SEND_ERROR_TP),
            Self::FEntrySend => None,
        }
    }

    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::TpBtf => "tp_btf",
            Self::FEntrySend => "fentry_send",
        }
    }
}

//! Multiplexed connections (root, real kernel): real gRPC (`grpcio` from
//! `PyPI`, whose C core writes from its own threads) through a conntrack NAT
//! that silently drops flows idle for 3 s. On such a connection the
//! application keeps writing while a call is stuck (an `RST_STREAM` at
//! every deadline, later calls), so these check that a stall stays a stall,
//! that every call the client saw fail is counted, and that a connection
//! kept alive by HTTP/2 pings gives no number.

mod common;

use std::time::Duration;

use anyhow::{ensure, Context as _, Result};
use common::{script, server_port, Daemon, Topology};
use observer::{
    diagnosis::aggregate::{DestinationRow, FailureMode, Verdict},
    kernel::event::Role,
};

/// The NAT's idle timeout (conntrack's established timeout), seconds.
const NAT_S: u32 = 3;

/// A grpcio server with one bytes-in, bytes-out method (no generated
/// code) that allows its clients' keep-alive pings.
const GRPC_SERVER: &str = r#"
import grpc, sys
from concurrent import futures
h = grpc.method_handlers_generic_handler("t.T", {"Echo": grpc.unary_unary_rpc_method_handler(lambda req, ctx: req)})
s = grpc.server(futures.ThreadPoolExecutor(4), options=[
    ("grpc.http2.min_ping_interval_without_data_ms", 500),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_ping_strikes", 0)])
s.add_generic_rpc_handlers((h,))
s.add_insecure_port(sys.argv[1])
s.start()
print("ready", flush=True)
s.wait_for_termination()
"#;

/// `python3 CLIENT TARGET reopen|keep PING_S GAPS`: one channel (one TCP
/// connection); after a warm-up call, one call with a 1.5 s deadline after
/// each gap. `reopen` closes a channel whose call failed and opens a new
/// one; `keep` keeps it, as gRPC applications do. `PING_S` > 0 turns on
/// HTTP/2 keep-alive pings. Prints `ok GAP` or `fail GAP CODE` per call.
const GRPC_CLIENT: &str = r#"
import grpc, sys, time
target, mode, ping = sys.argv[1], sys.argv[2], float(sys.argv[3])
gaps = [float(x) for x in sys.argv[4].split(",")]
opts = [("grpc.enable_retries", 0), ("grpc.use_local_subchannel_pool", 1)]
if ping > 0:
    opts += [("grpc.keepalive_time_ms", int(ping * 1000)), ("grpc.keepalive_permit_without_calls", 1),
             ("grpc.http2.max_pings_without_data", 0)]
def channel():
    ch = grpc.insecure_channel(target, options=opts)
    call = ch.unary_unary("/t.T/Echo")
    call(b"hello", timeout=10)
    return ch, call
ch, call = channel()
for g in gaps:
    time.sleep(g)
    try:
        call(b"x" * 40, timeout=1.5)
        print(f"ok {g}", flush=True)
    except grpc.RpcError as e:
        print(f"fail {g} {e.code()}", flush=True)
        if mode == "reopen":
            ch.close()
            ch, call = channel()
"#;

struct Scenario {
    name: &'static str,
    topo: Topology,
    dest: String,
    _server: common::Killed,
    client: std::process::Child,
    _scripts: [tempfile::TempPath; 2],
}

fn scenario(name: &'static str, tag: &str, mode: &str, ping_s: f64, gaps: &[f64]) -> Result<Scenario> {
    let topo = Topology::routed(tag, NAT_S, "drop")?;
    let port = server_port()?;
    let server = script(GRPC_SERVER)?;
    let addr = format!("{}:{port}", topo.server_v4);
    let srv = common::start_server(&topo.ns, topo.server, &format!("python3 -u {} {addr}", server.display()))?;
    let client = script(GRPC_CLIENT)?;
    let gaps: Vec<String> = gaps.iter().map(f64::to_string).collect();
    let child = topo
        .ns
        .spawn(topo.client, &format!("python3 -u {} {addr} {mode} {ping_s} {}", client.display(), gaps.join(",")))?;
    Ok(Scenario { name, topo, dest: addr, _server: srv, client: child, _scripts: [server, client] })
}

/// The client's calls: (ok, failed).
fn calls(out: &str) -> (usize, usize) {
    let ok = out.lines().filter(|l| l.starts_with("ok ")).count();
    let failed = out.lines().filter(|l| l.starts_with("fail ") && l.contains("DEADLINE_EXCEEDED")).count();
    (ok, failed)
}

fn row<'a>(rows: &'a [DestinationRow], dest: &str) -> Result<&'a DestinationRow> {
    rows.iter()
        .find(|r| r.id.destination == dest && r.id.role == Role::Client)
        .with_context(|| format!("no client row for {dest}: {rows:#?}"))
}

/// The path's interval holds the NAT's timeout (to the probes' 20 ms).
fn holds_nat(r: &DestinationRow) -> bool {
    let t = f64::from(NAT_S);
    r.path_idle_timeout_lower_seconds - 0.02 <= t && r.path_idle_timeout_upper_seconds.is_some_and(|u| t <= u + 0.02)
}

#[test]
#[ignore = "needs root and a 5.15+ kernel: run `cargo xtask test`"]
fn grpc_through_a_silent_nat_every_failed_call_is_counted() -> Result<()> {
    let daemon = Daemon::start(&[])?;
    // Three channels at once, each through its own NAT: failed calls
    // reopen the channel; failed calls keep it; pings every second.
    let scenarios = vec![
        scenario("reopen", "mxre", "reopen", 0.0, &[1.0, 4.0, 2.0, 4.5, 1.5, 3.8, 2.5, 4.2])?,
        scenario("keep", "mxkp", "keep", 0.0, &[1.0, 2.0, 2.5, 4.0, 1.5, 4.5, 2.0])?,
        scenario("pinged", "mxpg", "keep", 1.0, &[1.0, 4.0, 2.0, 4.5, 3.5])?,
    ];
    let mut results = Vec::new();
    for s in scenarios {
        let out = s.client.wait_with_output()?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        ensure!(out.status.success(), "{} client failed: {stdout}{}", s.name, String::from_utf8_lossy(&out.stderr));
        results.push((s.name, s.dest, calls(&stdout), stdout, s.topo));
    }
    daemon.caught_up(Duration::from_millis(1500), Duration::from_mins(1))?;
    let rows = daemon.status()?;
    for (name, dest, (ok, failed), stdout, _) in &results {
        let r = row(&rows, dest)?;
        eprintln!(
            "MEASURED grpc {name}: client {ok} ok, {failed} failed; row: reuses {}, failures {}, mode {}, interval [{:.3}, {:?}], point {:?}, verdict {}, recommended {:?}",
            r.reuses,
            r.failures,
            r.failure_mode.as_str(),
            r.path_idle_timeout_lower_seconds,
            r.path_idle_timeout_upper_seconds,
            r.path_idle_timeout_seconds,
            r.verdict.as_str(),
            r.recommended_pool_idle_timeout_seconds
        );
        let client = format!("client said:\n{stdout}\nrow: {r:#?}");
        if *name == "pinged" {
            ensure!(*failed == 0, "pings every second keep the NAT's flow: {client}");
            ensure!(r.failures == 0 && r.verdict != Verdict::Mismatch, "no failure, no mismatch: {client}");
            ensure!(r.recommended_pool_idle_timeout_seconds.is_none(), "no timeout shown, no number: {client}");
            continue;
        }
        ensure!(*failed >= 3, "the NAT made calls fail: {client}");
        ensure!(usize::try_from(r.failures)? == *failed, "every failed call counted ({failed}): {client}");
        ensure!(r.failure_mode == FailureMode::SilentDrop, "silent drop: {client}");
        ensure!(holds_nat(r), "interval holds {NAT_S} s: {client}");
        ensure!(r.verdict == Verdict::Mismatch, "mismatch: {client}");
        let rec = r.recommended_pool_idle_timeout_seconds.context("a recommendation")?;
        let upper = r.path_idle_timeout_upper_seconds.unwrap_or(f64::INFINITY);
        ensure!(rec <= 0.8 * upper + 1e-9, "recommended {rec} above 0.8 x {upper}: {client}");
    }
    Ok(())
}

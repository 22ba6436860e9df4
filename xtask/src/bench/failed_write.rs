//! What the on-demand failed-write hook (`sock_send_length`, the `tp_btf`
//! probe set) costs every other socket while it is attached: one daemon,
//! one ping-pong that never stops, and a client socket that the peer
//! reset while idle, held unused (as a pool holds it until its next use or
//! eviction) so the daemon attaches the hook; then closed, so it detaches
//! it. Blocks of four windows (with, without, without, with) cancel a
//! drift of the machine's speed, as the interleaved hot path does. Also
//! measured: how soon the hook comes after the reset and goes after the
//! close, and its own ns per run (a separate run with BPF statistics on).

use std::{
    io::{Read as _, Write as _},
    net::{TcpListener, TcpStream},
    os::fd::AsRawFd as _,
    thread,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _, Result};
use serde_json::{json, Value};

use super::{
    control::{loaded_progs, metric_sum, shipped_bin, tmp, Observer},
    load::PingPong,
    sh, stats, Plan,
};

const GAUGE: &str = "observer_failed_write_hook_attached";

/// A client socket its peer reset after it had been idle past the
/// daemon's `--min-idle` (1 s): dead, and held.
fn dead_client() -> Result<TcpStream> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let mut client = TcpStream::connect(listener.local_addr()?)?;
    let (mut server, _) = listener.accept()?;
    client.write_all(b"ping")?;
    let mut buf = [0u8; 4];
    server.read_exact(&mut buf)?;
    server.write_all(&buf)?;
    client.read_exact(&mut buf)?;
    thread::sleep(Duration::from_millis(1300));
    // SO_LINGER 0: close sends an RST.
    let linger = libc::linger { l_onoff: 1, l_linger: 0 };
    // SAFETY: a valid socket and a `linger` of the size given.
    let rc = unsafe {
        libc::setsockopt(
            server.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&raw const linger).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<libc::linger>())?,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("SO_LINGER");
    }
    drop(server);
    Ok(client)
}

/// Wait until the daemon says the hook is attached (`on`) or not; the
/// seconds it took.
fn wait_hook(o: &Observer, on: bool, within: Duration) -> Result<f64> {
    let t = Instant::now();
    loop {
        let attached = metric_sum(&o.metrics()?, GAUGE, "") > 0.5;
        if attached == on {
            return Ok(t.elapsed().as_secs_f64());
        }
        if t.elapsed() > within {
            bail!("the failed-write hook was not {} within {within:?}", if on { "attached" } else { "detached" });
        }
        thread::sleep(Duration::from_millis(50));
    }
}

pub(crate) fn failed_write_phase(plan: &Plan) -> Result<Value> {
    let o = Observer::start_bin(&shipped_bin(), &[], &tmp("failed-write"))?;
    if !o.metrics()?.contains(GAUGE) {
        bail!("the daemon exports no {GAUGE}");
    }
    let load = PingPong::start(4, None, false)?;
    thread::sleep(plan.window);
    let (mut with, mut without, mut ratio, mut comes, mut goes) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new(), Vec::new());
    // The load rests while the hook changes (an attach can wait for an RCU
    // grace period); each window starts after it has run for a moment.
    let change = |dead: Option<TcpStream>, on: bool| -> Result<(Option<TcpStream>, f64)> {
        load.pause(true);
        let dead = if on {
            drop(dead);
            Some(dead_client()?)
        } else {
            drop(dead);
            None
        };
        let took = wait_hook(&o, on, Duration::from_secs(30));
        load.pause(false);
        thread::sleep(Duration::from_millis(100));
        Ok((dead, took?))
    };
    let (mut dead, took) = change(None, true)?;
    comes.push(took);
    for block in 0..plan.blocks.clamp(1, 12) {
        let on1 = load.rate_over(plan.window);
        let (d, took) = change(dead, false)?;
        goes.push(took);
        let off1 = load.rate_over(plan.window);
        let off2 = load.rate_over(plan.window);
        let (d, took) = change(d, true)?;
        dead = d;
        comes.push(took);
        let on2 = load.rate_over(plan.window);
        let r = (on1 + on2) / (off1 + off2);
        println!("bench: failed-write hook block {block}: attached {on1:.0} {on2:.0}, detached {off1:.0} {off2:.0} round trips/s: ratio {r:.4}");
        with.extend([on1, on2]);
        without.extend([off1, off2]);
        ratio.push(r);
    }
    // The hook's own cost per run, attached, under the same load.
    sh("sysctl -qw kernel.bpf_stats_enabled=1")?;
    let per_run = (|| -> Result<(f64, u64)> {
        let before = hook_stats()?;
        thread::sleep(plan.window * 4);
        let after = hook_stats()?;
        let runs = after.1.saturating_sub(before.1);
        #[allow(clippy::cast_precision_loss, reason = "an average")]
        let ns = if runs > 0 { after.0.saturating_sub(before.0) as f64 / runs as f64 } else { f64::NAN };
        Ok((ns, runs))
    })();
    sh("sysctl -qw kernel.bpf_stats_enabled=0")?;
    let (ns, runs) = per_run?;
    drop(dead);
    load.stop()?;
    o.stop()?;
    Ok(json!({
        "connections": 4, "message_bytes": 32, "seconds_per_window": plan.window.as_secs_f64(),
        "round_trips_per_second": {"attached": stats(&with), "detached": stats(&without)},
        "ratio_attached_to_detached": stats(&ratio),
        "seconds_to_attach_after_the_reset": stats(&comes),
        "seconds_to_detach_after_the_close": stats(&goes),
        "hook_ns_per_run": ns,
        "hook_runs_counted": runs,
    }))
}

/// `sock_send_length`'s run time and count so far (the loaded program of
/// that name).
fn hook_stats() -> Result<(u64, u64)> {
    loaded_progs()?
        .into_values()
        // The kernel keeps 15 bytes of a program's name.
        .find(|(name, _, _)| name.starts_with("sock_send_len"))
        .map(|(_, t, n)| (t, n))
        .context("no sock_send_length program loaded (the fentry set has none: this phase needs the tp_btf set)")
}

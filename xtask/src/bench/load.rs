//! The loads the benchmarks drive: loopback ping-pongs (free or pinned,
//! paced or not), connection churn, and idle connections held open.

use std::{
    io::{Read as _, Write},
    net::{Shutdown, TcpListener, TcpStream},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use anyhow::{Context as _, Result};

/// Ping-pong round trips per second over `conns` loopback connections.
pub(crate) fn pingpong(conns: usize, dur: Duration) -> Result<f64> {
    paced_pingpong(conns, dur, None)
}

/// Ping-pong, each connection paced to at most `rate` round trips/s.
pub(crate) fn paced_pingpong(conns: usize, dur: Duration, rate: Option<f64>) -> Result<f64> {
    let load = PingPong::start(conns, rate, false)?;
    let rate = load.rate_over(dur);
    load.stop()?;
    Ok(rate)
}

/// Round trips of one client, alone on its cache line (the clients count
/// as they go without slowing each other).
#[repr(align(128))]
#[derive(Default)]
pub(crate) struct Counter(AtomicU64);

/// A running ping-pong: `conns` loopback connections, 32-byte messages,
/// each connection paced to at most `rate` round trips/s; with `pin`, both
/// ends of connection i run on CPU i mod the number of CPUs, so every CPU
/// is busy with whole round trips and none waits on another.
pub(crate) struct PingPong {
    pub(crate) stop: Arc<AtomicBool>,
    /// Clients wait while set (between windows of the interleaved phase).
    pub(crate) paused: Arc<AtomicBool>,
    pub(crate) counts: Vec<Arc<Counter>>,
    pub(crate) clients: Vec<thread::JoinHandle<std::io::Result<()>>>,
    pub(crate) server: thread::JoinHandle<()>,
}

/// Run the calling thread on `cpu` only.
pub(crate) fn pin_to(cpu: usize) -> std::io::Result<()> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET and
    // sched_setaffinity get a pointer to it and its size.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &raw const set) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

impl PingPong {
    #[allow(clippy::cast_precision_loss, reason = "rates")]
    pub(crate) fn start(conns: usize, rate: Option<f64>, pin: bool) -> Result<Self> {
        let cpus = thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let paused = Arc::new(AtomicBool::new(false));
        let server = thread::spawn(move || {
            let mut handles = Vec::new();
            for s in listener.incoming().take(conns) {
                let Ok(mut s) = s else { break };
                handles.push(thread::spawn(move || {
                    let _ = s.set_nodelay(true);
                    let mut buf = [0u8; 32];
                    // The first message names the connection, for pinning.
                    if s.read_exact(&mut buf).is_err() {
                        return;
                    }
                    if pin && pin_to(usize::from(buf[0]) % cpus).is_err() {
                        return;
                    }
                    while s.write_all(&buf).is_ok() && s.read_exact(&mut buf).is_ok() {}
                }));
            }
            for h in handles {
                let _ = h.join();
            }
        });
        let counts: Vec<Arc<Counter>> = (0..conns).map(|_| Arc::default()).collect();
        let clients = counts
            .iter()
            .enumerate()
            .map(|(i, count)| {
                let (stop, paused, count) = (Arc::clone(&stop), Arc::clone(&paused), Arc::clone(count));
                thread::spawn(move || -> std::io::Result<()> {
                    if pin {
                        pin_to(i % cpus)?;
                    }
                    let mut s = TcpStream::connect(addr)?;
                    s.set_nodelay(true)?;
                    let mut buf = [u8::try_from(i).unwrap_or(0); 32];
                    let mut n = 0u64;
                    let t0 = Instant::now();
                    while !stop.load(Ordering::Relaxed) {
                        if paused.load(Ordering::Relaxed) {
                            thread::sleep(Duration::from_millis(1));
                            continue;
                        }
                        if let Some(r) = rate {
                            let due = Duration::from_secs_f64(n as f64 / r);
                            if let Some(wait) = due.checked_sub(t0.elapsed()) {
                                thread::sleep(wait);
                            }
                        }
                        s.write_all(&buf)?;
                        s.read_exact(&mut buf)?;
                        n += 1;
                        count.0.store(n, Ordering::Relaxed);
                    }
                    s.shutdown(Shutdown::Both)
                })
            })
            .collect();
        Ok(Self { stop, paused, counts, clients, server })
    }

    /// Hold the clients (`true`) or let them go on.
    pub(crate) fn pause(&self, paused: bool) {
        self.paused.store(paused, Ordering::Relaxed);
    }

    /// Round trips so far, all connections.
    pub(crate) fn count(&self) -> u64 {
        self.counts.iter().map(|c| c.0.load(Ordering::Relaxed)).sum()
    }

    /// Round trips per second over the next `dur`.
    #[allow(clippy::cast_precision_loss, reason = "rates")]
    pub(crate) fn rate_over(&self, dur: Duration) -> f64 {
        let (n0, t0) = (self.count(), Instant::now());
        thread::sleep(dur);
        (self.count() - n0) as f64 / t0.elapsed().as_secs_f64()
    }

    pub(crate) fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for c in self.clients {
            c.join().map_err(|_| anyhow::anyhow!("client thread panicked"))??;
        }
        let _ = self.server.join();
        Ok(())
    }
}

/// Short connections per second: connect, one request, one response, close.
pub(crate) fn churn(threads: usize, dur: Duration) -> Result<f64> {
    churn_with(threads, dur, &[1u8; 32])
}

/// An HTTP/1.1 request whose first write names its host: the send probe
/// hands its first bytes to the daemon (the names' cost).
pub(crate) const HTTP_REQUEST: &[u8] = b"GET / HTTP/1.1\r\nHost: bench.example\r\n\r\n";

/// [`churn`] with `request` as each connection's one write.
#[allow(clippy::cast_precision_loss, reason = "rates")]
pub(crate) fn churn_with(threads: usize, dur: Duration, request: &'static [u8]) -> Result<f64> {
    let n = request.len();
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let stop_s = Arc::clone(&stop);
    listener.set_nonblocking(true)?;
    // The server closes first, so TIME_WAIT stays on its side.
    let server = thread::spawn(move || {
        while !stop_s.load(Ordering::Relaxed) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    let _ = s.set_nonblocking(false);
                    let mut buf = vec![0u8; n];
                    if s.read_exact(&mut buf).is_ok() {
                        let _ = s.write_all(&buf);
                    }
                }
                Err(_) => thread::sleep(Duration::from_micros(50)),
            }
        }
    });
    let count = Arc::new(AtomicU64::new(0));
    let resets = Arc::new(AtomicU64::new(0));
    let start = Instant::now();
    let clients: Vec<_> = (0..threads)
        .map(|_| {
            let (stop, count, resets) = (Arc::clone(&stop), Arc::clone(&count), Arc::clone(&resets));
            thread::spawn(move || -> std::io::Result<()> {
                let mut buf = request.to_vec();
                let mut rest = [0u8; 1];
                while !stop.load(Ordering::Relaxed) {
                    let mut one = || -> std::io::Result<()> {
                        let mut s = TcpStream::connect(addr)?;
                        s.write_all(request)?;
                        s.read_exact(&mut buf)?;
                        let _ = s.read(&mut rest);
                        Ok(())
                    };
                    match one() {
                        Ok(()) => {
                            count.fetch_add(1, Ordering::Relaxed);
                        }
                        // The server stops accepting when the run ends.
                        Err(_) if stop.load(Ordering::Relaxed) => break,
                        // Tens of thousands of connections a run reuse
                        // ephemeral ports still in TIME_WAIT on the server
                        // side: now and then the kernel resets one. Counted,
                        // not fatal, unless they become common.
                        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
                            resets.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => return Err(e),
                    }
                }
                Ok(())
            })
        })
        .collect();
    thread::sleep(dur);
    stop.store(true, Ordering::Relaxed);
    let elapsed = start.elapsed().as_secs_f64();
    for c in clients {
        c.join().map_err(|_| anyhow::anyhow!("client thread panicked"))??;
    }
    let _ = server.join();
    let (done, reset) = (count.load(Ordering::Relaxed), resets.load(Ordering::Relaxed));
    anyhow::ensure!(reset * 100 <= done, "churn: {reset} of {} connections were reset", done + reset);
    if reset > 0 {
        println!(
            "bench: churn: {reset} of {} connections reset (ports reused from TIME_WAIT), not counted",
            done + reset
        );
    }
    Ok(done as f64 / elapsed)
}

/// Child process: connect `per_port` times to each port in `ports`, close one
/// connection per port (a local idle close: evidence for the destination),
/// print `ready`, then hold the rest until killed.
pub fn hold(runs: &[(u16, u16)], per_port: usize) -> Result<()> {
    let mut held = Vec::new();
    for p in runs.iter().flat_map(|&(first, n)| first..first + n) {
        for k in 0..per_port {
            let s = TcpStream::connect(("127.0.0.1", p)).with_context(|| format!("connecting to port {p}"))?;
            if k == 0 {
                drop(s);
            } else {
                held.push(s);
            }
        }
    }
    println!("ready {}", held.len());
    std::io::stdout().flush()?;
    loop {
        thread::sleep(Duration::from_hours(1));
    }
}

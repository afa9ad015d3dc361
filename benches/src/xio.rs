//! The X-IO side of the comparison: a zero-copy ping-pong between a client
//! stack in the parent and an echo server stack in a child process, a
//! one-way burst stream into a sink child, and the raw descriptor-ring
//! throughput without any buffer management.
//!
//! # Processes
//!
//! The parent runs the embedded manager (control plane only, never on the
//! timed path) and the client. The server is `current_exe()` run as
//!
//! ```text
//! serve-xio --prefix <P> --mode <busy-poll|adaptive|blocking> --addr <A> [--cpu <C>] [--sink]
//! ```
//!
//! It attaches a stack, binds `A`, and then either echoes (the L2-forwarder
//! pattern: `recv`, `into_mut`, change one byte, `send` the same buffer back)
//! or, with `--sink`, `recv_burst_with`s and drops everything except 1-byte
//! marker messages, which it echoes so the sender knows the stream before
//! the marker has been consumed. The server exits when the client's stack
//! goes away (`Error::Reset`) or the manager does; a parent-death signal
//! (`SIGKILL`) makes it die with the parent in any case. On exit it prints
//! `STATS <spin_hits> <sleeps>` (its adaptive-policy counters) on stdout.

use std::io::Read;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{mpsc, Arc, Barrier};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use xio_core::layout::Descriptor;
use xio_core::prelude::*;

use crate::baselines::ServerChild;
use crate::pin::{pin_scoped, pin_to_cpu};

/// The waiting modes that are benchmarked (`NonBlocking` is not a way to
/// wait).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Mode {
    /// `WaitMode::BusyPoll`: spin, never sleep.
    BusyPoll,
    /// `WaitMode::Adaptive`: spin while it pays, then sleep.
    Adaptive,
    /// `WaitMode::Blocking`: sleep on the doorbell at once.
    Blocking,
}

impl Mode {
    /// The stack's waiting mode.
    pub fn wait_mode(self) -> WaitMode {
        match self {
            Mode::BusyPoll => WaitMode::BusyPoll,
            Mode::Adaptive => WaitMode::Adaptive,
            Mode::Blocking => WaitMode::Blocking,
        }
    }

    /// Command-line spelling (the `clap::ValueEnum` name).
    pub fn name(self) -> &'static str {
        match self {
            Mode::BusyPoll => "busy-poll",
            Mode::Adaptive => "adaptive",
            Mode::Blocking => "blocking",
        }
    }

    /// Spelling for tables.
    pub fn label(self) -> &'static str {
        match self {
            Mode::BusyPoll => "BusyPoll",
            Mode::Adaptive => "Adaptive",
            Mode::Blocking => "Blocking",
        }
    }
}

/// Length of the marker message in a one-way stream (data messages are
/// longer).
const MARKER_LEN: usize = 1;
/// Messages per `send_burst` / `recv_burst`.
pub const BURST: usize = 32;
/// How long the parent waits for a server to bind its address.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// A whole pair is killed after this long (a hang, not a slow run).
const WATCHDOG: Duration = Duration::from_secs(300);

// ---------------------------------------------------------------------------
// Child side
// ---------------------------------------------------------------------------

/// Makes this process die with its parent (`PR_SET_PDEATHSIG`), and exits at
/// once if the parent is already gone. For every hidden server subcommand.
pub fn die_with_parent() -> Result<()> {
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL))
        .context("prctl(PR_SET_PDEATHSIG)")?;
    // The parent may have died before the prctl: we were re-parented.
    if rustix::process::getppid().is_none_or(|p| p.as_raw_nonzero().get() == 1) {
        bail!("parent process already exited");
    }
    Ok(())
}

/// Whether the zero-copy pairs copy what they receive out of the pool
/// (`StackBuilder::copy_on_receive`, the safe mode for untrusted
/// senders): `XIO_BENCH_COPY_ON_RECEIVE=1`, which the server processes
/// inherit. Measures what the safe mode costs against the default.
pub fn copy_on_receive() -> bool {
    std::env::var_os("XIO_BENCH_COPY_ON_RECEIVE").is_some_and(|v| v == "1")
}

/// Runs in the child: the echo (or, with `sink`, the sink) server. Pinning
/// is done by the caller first.
pub fn serve(prefix: &str, mode: Mode, addr: SocketAddr, sink: bool) -> Result<()> {
    let mut s = Stack::builder(prefix)
        .name(if sink { "bench-sink" } else { "bench-echo" })
        .wait_mode(mode.wait_mode())
        .copy_on_receive(copy_on_receive())
        .attach()
        .with_context(|| format!("attaching to pool {prefix:?}"))?;
    s.bind(addr).with_context(|| format!("binding {addr}"))?;
    let r = if sink {
        sink_loop(&mut s)
    } else {
        echo_loop(&mut s)
    };
    let p = s.spin_policy();
    println!("STATS {} {}", p.spin_hits, p.sleeps);
    r
}

/// Echoes until the client goes away.
fn echo_loop(s: &mut Stack) -> Result<()> {
    loop {
        match s.recv() {
            Ok(m) => {
                let from = m.from;
                let mut b = m.buf.into_mut();
                if let Some(x) = b.first_mut() {
                    *x = x.wrapping_add(1);
                }
                s.send(from, b).context("echo send")?;
            }
            Err(Error::Reset(_) | Error::ManagerGone) => return Ok(()),
            Err(e) => return Err(e).context("echo recv"),
        }
    }
}

/// Drops data messages, echoes markers, until the client goes away.
fn sink_loop(s: &mut Stack) -> Result<()> {
    // The burst path: each payload is looked at in place and the buffers go
    // back to the pool together.
    loop {
        let mut marker_from = None;
        match s.recv_burst_with(BURST, |from, _, payload| {
            if payload.len() == MARKER_LEN {
                marker_from = Some(from);
            }
        }) {
            Ok(_) => {
                if let Some(from) = marker_from {
                    let m = s.alloc(MARKER_LEN).context("marker echo alloc")?;
                    s.send(from, m).context("marker echo")?;
                }
            }
            Err(Error::Reset(_) | Error::ManagerGone) => return Ok(()),
            Err(e) => return Err(e).context("sink recv_burst_with"),
        }
    }
}

// ---------------------------------------------------------------------------
// Parent side
// ---------------------------------------------------------------------------

/// A fresh address for each server, so no two pairs ever share a binding.
fn next_addr() -> SocketAddr {
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    SocketAddr::from(([10, 77, (n / 250) as u8, (n % 250) as u8 + 1], 7))
}

/// Spawns `serve-xio` with stdout piped (for its `STATS` line).
fn spawn_server(
    prefix: &str,
    mode: Mode,
    addr: SocketAddr,
    cpu: Option<usize>,
    sink: bool,
) -> Result<ServerChild> {
    let exe = std::env::current_exe().context("locating current executable")?;
    let mut cmd = Command::new(exe);
    cmd.args(["serve-xio", "--prefix", prefix, "--mode", mode.name()])
        .arg("--addr")
        .arg(addr.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    if let Some(c) = cpu {
        cmd.arg("--cpu").arg(c.to_string());
    }
    if sink {
        cmd.arg("--sink");
    }
    ServerChild::spawn(&mut cmd)
}

/// Connects to `addr`, retrying while the server has not bound it yet.
fn connect_retry(s: &mut Stack, addr: SocketAddr, child: &mut ServerChild) -> Result<PeerId> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        match s.connect(addr) {
            Ok(p) => return Ok(p),
            Err(Error::Refused { .. }) => {}
            Err(e) => return Err(e).with_context(|| format!("connecting to {addr}")),
        }
        if let Some(st) = child.try_wait()? {
            bail!("server exited before binding {addr} ({st})");
        }
        ensure!(
            Instant::now() < deadline,
            "server did not bind {addr} within {READY_TIMEOUT:?}"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Kills the server if the pair is still running after a timeout, so a hung
/// client `recv` returns `Reset` instead of hanging the whole run.
struct Watchdog {
    cancel: Option<mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn arm(pid: u32, timeout: Duration) -> Result<Self> {
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("xio-bench-watchdog".into())
            .spawn(move || {
                if let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(timeout) {
                    eprintln!(
                        "watchdog: pair still running after {timeout:?}; killing server {pid}"
                    );
                    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
                        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                    }
                }
            })
            .context("spawning watchdog")?;
        Ok(Watchdog {
            cancel: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.cancel.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Spin-policy counters: waits satisfied by spinning, and waits that slept.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SpinCounts {
    /// `AdaptiveSpin::spin_hits`.
    pub hits: u64,
    /// `AdaptiveSpin::sleeps`.
    pub sleeps: u64,
}

impl SpinCounts {
    fn of(s: &Stack) -> Self {
        let p = s.spin_policy();
        SpinCounts {
            hits: p.spin_hits,
            sleeps: p.sleeps,
        }
    }

    /// Sum of two counts.
    pub fn plus(self, other: SpinCounts) -> SpinCounts {
        SpinCounts {
            hits: self.hits + other.hits,
            sleeps: self.sleeps + other.sleeps,
        }
    }

    fn since(self, earlier: SpinCounts) -> SpinCounts {
        SpinCounts {
            hits: self.hits - earlier.hits,
            sleeps: self.sleeps - earlier.sleeps,
        }
    }
}

/// CPU time a process used while it should have been idle.
#[derive(Clone, Copy, Debug)]
pub struct IdleCpu {
    /// How long it was left idle.
    pub window: Duration,
    /// utime + stime delta from `/proc/<pid>/stat`, in ms (clock-tick
    /// resolution, usually 10 ms).
    pub stat_ms: f64,
    /// On-CPU time delta from `/proc/<pid>/schedstat`, in ms (ns
    /// resolution), when the kernel provides it.
    pub sched_ms: Option<f64>,
}

/// `(utime + stime in ms, schedstat on-CPU ns)` of a single-threaded process.
fn proc_cpu(pid: u32) -> Result<(f64, Option<u64>)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .with_context(|| format!("reading /proc/{pid}/stat"))?;
    let rest = stat
        .rfind(')')
        .map(|i| &stat[i + 1..])
        .ok_or_else(|| anyhow!("malformed /proc/{pid}/stat"))?;
    // After "(comm)": field 3 (state) is index 0, so utime (14) is index 11
    // and stime (15) is index 12.
    let f: Vec<&str> = rest.split_whitespace().collect();
    ensure!(f.len() > 12, "short /proc/{pid}/stat");
    let utime: u64 = f[11].parse().context("utime")?;
    let stime: u64 = f[12].parse().context("stime")?;
    let hz = rustix::param::clock_ticks_per_second().max(1);
    let ms = (utime + stime) as f64 * 1000.0 / hz as f64;
    let sched = std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok());
    Ok((ms, sched))
}

fn measure_idle(pid: u32, window: Duration) -> Result<IdleCpu> {
    let (ms0, ns0) = proc_cpu(pid)?;
    std::thread::sleep(window);
    let (ms1, ns1) = proc_cpu(pid)?;
    Ok(IdleCpu {
        window,
        stat_ms: ms1 - ms0,
        sched_ms: ns0.zip(ns1).map(|(a, b)| b.saturating_sub(a) as f64 / 1e6),
    })
}

/// One X-IO ping-pong measurement.
#[derive(Clone, Debug)]
pub struct PairOpts<'a> {
    /// Pool prefix (the manager must be running).
    pub prefix: &'a str,
    /// Waiting mode of both stacks.
    pub mode: Mode,
    /// Server CPU.
    pub server_cpu: Option<usize>,
    /// Client CPU.
    pub client_cpu: Option<usize>,
    /// Message size in bytes (at least 1).
    pub size: usize,
    /// Untimed round trips.
    pub warmup: usize,
    /// Timed round trips.
    pub iters: usize,
    /// After the timed loop, leave the server idle this long and measure
    /// its CPU time.
    pub idle: Option<Duration>,
}

/// Result of [`run_pair`].
#[derive(Clone, Debug)]
pub struct PairResult {
    /// Round-trip times in ns.
    pub samples: Vec<u64>,
    /// The client's spin-policy counters over the timed loop.
    pub client_spin: SpinCounts,
    /// The server's counters over its whole session (from its `STATS` line).
    pub server_spin: Option<SpinCounts>,
    /// Server CPU use while idle.
    pub idle: Option<IdleCpu>,
}

/// One timed round trip: alloc, touch first and last byte, send, receive
/// the echo, check the first byte, drop.
#[inline]
fn round_trip(s: &mut Stack, peer: PeerId, size: usize, v: u8) -> Result<Message> {
    let mut b = s.alloc(size)?;
    b[0] = v;
    b[size - 1] = v;
    s.send(peer, b)?;
    let m = s.recv()?;
    ensure!(
        m.buf.first() == Some(&v.wrapping_add(1)),
        "bad echo: first byte {:?}, expected {}",
        m.buf.first(),
        v.wrapping_add(1)
    );
    Ok(m)
}

/// Spawns an echo server and runs the ping-pong from this thread.
pub fn run_pair(o: &PairOpts<'_>) -> Result<PairResult> {
    ensure!(o.size > 0, "message size must be at least 1 byte");
    let addr = next_addr();
    let mut child = spawn_server(o.prefix, o.mode, addr, o.server_cpu, false)?;
    let stdout = child.stdout();
    let pid = child.pid();
    let res = (|| {
        let _dog = Watchdog::arm(pid, WATCHDOG)?;
        let _pin = pin_scoped(o.client_cpu).context("pinning client")?;
        let mut s = Stack::builder(o.prefix)
            .name("bench-client")
            .wait_mode(o.mode.wait_mode())
            .copy_on_receive(copy_on_receive())
            .attach()
            .context("attaching client stack")?;
        let peer = connect_retry(&mut s, addr, &mut child)?;

        // One fully verified round trip.
        let m = round_trip(&mut s, peer, o.size, 0x5a)?;
        ensure!(m.from == peer, "reply from {:?}, expected {peer:?}", m.from);
        ensure!(m.buf.len() == o.size, "reply has {} bytes", m.buf.len());
        ensure!(
            m.buf[o.size - 1] == 0x5a || o.size == 1,
            "last byte changed"
        );
        drop(m);

        for i in 0..o.warmup {
            round_trip(&mut s, peer, o.size, i as u8)?;
        }
        let before = SpinCounts::of(&s);
        let mut samples = Vec::with_capacity(o.iters);
        for i in 0..o.iters {
            let t0 = Instant::now();
            let m = round_trip(&mut s, peer, o.size, i as u8)?;
            drop(m);
            samples.push(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX));
        }
        let client_spin = SpinCounts::of(&s).since(before);
        let idle = o.idle.map(|w| measure_idle(pid, w)).transpose()?;
        drop(s); // the server sees Reset and exits
        Ok(PairResult {
            samples,
            client_spin,
            server_spin: None,
            idle,
        })
    })();
    let mut r = child.finish(res)?;
    r.server_spin = stdout.and_then(read_stats);
    Ok(r)
}

/// Parses the server's `STATS <hits> <sleeps>` line (after it exited).
fn read_stats(mut out: std::process::ChildStdout) -> Option<SpinCounts> {
    let mut s = String::new();
    out.read_to_string(&mut s).ok()?;
    s.lines().find_map(|l| {
        let mut it = l.strip_prefix("STATS ")?.split_whitespace();
        Some(SpinCounts {
            hits: it.next()?.parse().ok()?,
            sleeps: it.next()?.parse().ok()?,
        })
    })
}

/// Result of [`run_oneway`].
#[derive(Clone, Copy, Debug)]
pub struct OnewayResult {
    /// Messages in the timed stream.
    pub msgs: u64,
    /// From the first `send_burst` until the marker behind the last message
    /// came back.
    pub elapsed: Duration,
}

impl OnewayResult {
    /// Millions of descriptors per second.
    pub fn mdesc_per_s(&self) -> f64 {
        self.msgs as f64 / self.elapsed.as_secs_f64() / 1e6
    }
}

/// Sends `n` messages of `size` bytes in bursts (`send_burst_with`, touching the
/// first byte), then a marker, and waits for the marker's
/// echo.
fn stream(s: &mut Stack, peer: PeerId, size: usize, n: u64) -> Result<()> {
    // The burst path: payloads are written straight into their pool
    // buffers, no `BufMut` per message.
    let mut sent = 0u64;
    while sent < n {
        let k = (n - sent).min(BURST as u64) as usize;
        s.send_burst_with(peer, k, size, |_, payload| payload[0] = 1)?;
        sent += k as u64;
    }
    let mut m = s.alloc(MARKER_LEN)?;
    m[0] = 0;
    s.send(peer, m)?;
    let ack = s.recv()?;
    ensure!(
        ack.buf.len() == MARKER_LEN && ack.from == peer,
        "unexpected reply to the marker ({} bytes from {:?})",
        ack.buf.len(),
        ack.from
    );
    Ok(())
}

/// One-way stream of `n` `size`-byte messages (after `warmup` untimed ones)
/// into a sink child.
pub fn run_oneway(
    prefix: &str,
    mode: Mode,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
    size: usize,
    warmup: u64,
    n: u64,
) -> Result<OnewayResult> {
    ensure!(
        size > MARKER_LEN,
        "data messages must be longer than markers"
    );
    let addr = next_addr();
    let mut child = spawn_server(prefix, mode, addr, server_cpu, true)?;
    let pid = child.pid();
    let res = (|| {
        let _dog = Watchdog::arm(pid, WATCHDOG)?;
        let _pin = pin_scoped(client_cpu).context("pinning client")?;
        let mut s = Stack::builder(prefix)
            .name("bench-stream")
            .wait_mode(mode.wait_mode())
            .attach()
            .context("attaching client stack")?;
        let peer = connect_retry(&mut s, addr, &mut child)?;
        stream(&mut s, peer, size, warmup)?;
        let t0 = Instant::now();
        stream(&mut s, peer, size, n)?;
        let elapsed = t0.elapsed();
        Ok(OnewayResult { msgs: n, elapsed })
    })();
    child.finish(res)
}

/// Raw descriptor-ring throughput (`xio_core::ring::heap_ring`, 1024 slots)
/// between two threads of this process pinned to the given CPUs, in bursts
/// of [`BURST`]: no buffers are allocated, freed or validated.
pub fn ring_throughput(
    producer_cpu: Option<usize>,
    consumer_cpu: Option<usize>,
    n: u64,
) -> Result<OnewayResult> {
    let (mut tx, mut rx) = xio_core::ring::heap_ring(1024);
    let start = Arc::new(Barrier::new(2));
    let abort = Arc::new(AtomicBool::new(false));
    let (go, stop) = (start.clone(), abort.clone());
    let consumer = std::thread::Builder::new()
        .name("xio-bench-ring-rx".into())
        .spawn(move || -> Result<Instant> {
            // Pass the barrier even when pinning fails, so the producer
            // never waits forever.
            let pinned = consumer_cpu.map_or(Ok(()), pin_to_cpu);
            go.wait();
            pinned.context("pinning ring consumer")?;
            let mut out = [Descriptor::default(); BURST];
            let mut got = 0u64;
            let mut sum = 0u64;
            while got < n {
                let k = rx.pop_burst(&mut out).map_err(|e| anyhow!("{e}"))?;
                if k == 0 {
                    ensure!(!stop.load(Ordering::Relaxed), "producer failed");
                    std::hint::spin_loop();
                    continue;
                }
                sum = sum.wrapping_add(out[..k].iter().map(|d| u64::from(d.index)).sum::<u64>());
                got += k as u64;
            }
            std::hint::black_box(sum);
            Ok(Instant::now())
        })
        .context("spawning ring consumer")?;
    let produced = (|| -> Result<Instant> {
        let pinned = pin_scoped(producer_cpu);
        start.wait();
        let _pin = pinned.context("pinning ring producer")?;
        let mut descs = [Descriptor::default(); BURST];
        let t0 = Instant::now();
        let mut sent = 0u64;
        while sent < n {
            let k = (n - sent).min(BURST as u64) as usize;
            for (i, d) in descs[..k].iter_mut().enumerate() {
                d.index = (sent as u32).wrapping_add(i as u32);
                d.len = 64;
            }
            let mut off = 0;
            while off < k {
                let p = tx.push_burst(&descs[off..k]).map_err(|e| anyhow!("{e}"))?;
                if p == 0 {
                    std::hint::spin_loop();
                }
                off += p;
            }
            sent += k as u64;
        }
        Ok(t0)
    })();
    if produced.is_err() {
        abort.store(true, Ordering::Relaxed);
    }
    let end = consumer
        .join()
        .map_err(|_| anyhow!("ring consumer panicked"))??;
    let t0 = produced?;
    Ok(OnewayResult {
        msgs: n,
        elapsed: end - t0,
    })
}

//! `xio-bench tokio`: async echo under tokio, X-IO streams (`xio-tokio`)
//! next to tokio's `TcpStream` and `UnixStream` in the same run.
//!
//! One worker thread per process (client on CPU 0, server on CPU 1); N
//! connections, each a task doing 64 B request-response with one request in
//! flight, for a fixed time, on plain `tokio::runtime::Builder` runtimes.

use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::ValueEnum;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::baselines::{read_port_line, temp_socket_path, RemoveOnDrop, ServerChild};
use crate::compare::progress;
use crate::pin::{online_cpus, pin_scoped};
use crate::stats::{fmt_us, summarize};

const MSG: usize = 64;
const DEFAULT_CONNS: [usize; 4] = [1, 16, 64, 256];

/// Options of `xio-bench tokio`.
#[derive(Clone, Debug, clap::Args)]
pub struct TokioArgs {
    /// Short run: 0.5 s per cell in 2 rounds.
    #[arg(long)]
    pub quick: bool,
    /// Connection counts (default 1,16,64,256).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub conns: Vec<usize>,
    /// Transports (default: all).
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1..)]
    pub transports: Vec<AsyncTransport>,
    /// Measured time per cell in ms (default 2000; split over the rounds).
    #[arg(long)]
    pub duration_ms: Option<u64>,
    /// Rounds per cell, run round-robin over the transports (default 4).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// tokio's current-thread runtime on both sides instead of a
    /// multi-thread runtime with one worker.
    #[arg(long)]
    pub current_thread: bool,
}

/// The environment variable that tells both processes which runtime to
/// build (`current` for the current-thread one).
const RUNTIME_VAR: &str = "XIO_BENCH_TOKIO_RUNTIME";

/// A stream transport under tokio.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum AsyncTransport {
    /// tokio `UnixStream`.
    Uds,
    /// tokio `TcpStream` over 127.0.0.1, `TCP_NODELAY`.
    Tcp,
    /// `xio_tokio::XioStream`.
    Xio,
    /// CloudWeGo shmipc-rs streams with its default wake-up (a message on
    /// the Unix socket); `tokio` only (see [`crate::peers`]).
    Shmipc,
    /// shmipc-rs with the eventfd wake-up (protocol V4); `tokio` only.
    ShmipcEventfd,
    /// No tokio: X-IO's own event loop (`Net::poll`, one thread each
    /// side, as `xio-bench sockets` section c), the bound xio-tokio is
    /// measured against; `tokio` only.
    XioPoll,
}

impl AsyncTransport {
    fn label(self) -> &'static str {
        match self {
            AsyncTransport::Uds => "tokio UDS",
            AsyncTransport::Tcp => "tokio TCP",
            AsyncTransport::Xio => "X-IO",
            AsyncTransport::Shmipc => "shmipc",
            AsyncTransport::ShmipcEventfd => "shmipc eventfd",
            AsyncTransport::XioPoll => "X-IO event loop",
        }
    }

    /// A peer library with an API of its own (no `AsyncRead`/hyper).
    fn is_peer(self) -> bool {
        matches!(self, AsyncTransport::Shmipc | AsyncTransport::ShmipcEventfd)
    }

    /// Measured by `xio-bench tokio` only: no stream under hyper.
    fn tokio_only(self) -> bool {
        self.is_peer() || self == AsyncTransport::XioPoll
    }
}

/// A one-worker runtime, or the current-thread one (see
/// [`TokioArgs::current_thread`]).
fn runtime() -> Result<tokio::runtime::Runtime> {
    if std::env::var_os(RUNTIME_VAR).is_some_and(|v| v == "current") {
        return Ok(tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?);
    }
    Ok(tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()?)
}

trait AsyncStream: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AsyncStream for T {}

#[derive(Default)]
struct Outcome {
    samples: Vec<u64>,
    ops: u64,
    wall: Duration,
}

/// Runs `xio-bench tokio`.
pub fn run(a: &TokioArgs) -> Result<()> {
    if online_cpus() < 2 {
        bail!("needs 2 CPUs (client on 0, server on 1)");
    }
    let conns: Vec<usize> = if a.conns.is_empty() {
        DEFAULT_CONNS.to_vec()
    } else {
        a.conns.clone()
    };
    let transports: Vec<AsyncTransport> = if a.transports.is_empty() {
        AsyncTransport::value_variants().to_vec()
    } else {
        a.transports.clone()
    };
    let rounds = a.rounds.unwrap_or(if a.quick { 2 } else { 4 }).max(1);
    let total = Duration::from_millis(a.duration_ms.unwrap_or(if a.quick { 500 } else { 2000 }));
    let per_round = total / rounds as u32;
    let warm = (per_round / 4).max(Duration::from_millis(50));
    // Read by both processes (the servers inherit it).
    std::env::set_var(
        RUNTIME_VAR,
        if a.current_thread { "current" } else { "multi" },
    );
    let runtime_name = if a.current_thread {
        "tokio's current-thread runtime"
    } else {
        "a tokio multi-thread runtime with one worker thread"
    };

    let run_dir = crate::compare::RunDir::create()?;
    std::env::set_var("XIO_RUN_DIR", &run_dir.0);
    let prefix = format!("xio-bench-tokio-{}", std::process::id());
    std::env::set_var("XIO_BENCH_PREFIX", &prefix);
    let _mgr = xio_core::manager::Manager::builder(&prefix)
        .spawn()
        .context("starting the embedded manager")?;

    println!(
        "## Async echo under tokio: {}\n",
        transports
            .iter()
            .map(|t| t.label())
            .collect::<Vec<_>>()
            .join(" vs ")
    );
    println!(
        "Command: `{}`. In each process {runtime_name}, client on CPU 0, server on CPU 1; \
         each connection is a task doing {MSG} B request-response, one request in flight. \
         {:.1} s measured per cell ({rounds} rounds, each after {:.2} s unmeasured). µs.\n",
        std::env::args().collect::<Vec<_>>().join(" "),
        total.as_secs_f64(),
        warm.as_secs_f64()
    );
    crate::compare::print_host_phase("before the run");
    let mut head = String::from("| conns |");
    let mut rule = String::from("|---:|");
    for t in &transports {
        let l = t.label();
        head.push_str(&format!(" {l} req/s | {l} p50 | {l} p99 |"));
        rule.push_str("---:|---:|---:|");
    }
    let mut lines = Vec::new();
    let mut failures = Vec::new();
    let mut ratios = Vec::new();
    for &n in &conns {
        let acc = measure_row(
            &transports,
            rounds,
            &format!("{n} conns"),
            &mut failures,
            |t| run_one(t, &prefix, n, warm, per_round),
        );
        let rates: Vec<Option<f64>> = acc
            .iter()
            .map(|c| {
                c.as_ref()
                    .map(|o| o.ops as f64 / o.wall.as_secs_f64().max(1e-9))
            })
            .collect();
        ratios.push((n, rates));
        let line = table_row(n, acc);
        lines.push(line);
    }
    println!("{head}\n{rule}");
    for l in lines {
        println!("{l}");
    }
    println!();
    print_ratios(&transports, &ratios);
    crate::compare::print_host_phase("after the run");
    for f in failures {
        println!("{f}");
    }
    if transports.contains(&AsyncTransport::Xio) {
        progress("X-IO idle CPU");
        match idle_cpu(&prefix) {
            Ok((srv, cli)) => println!(
                "Idle: after {IDLE_WARM} X-IO requests on one connection, the connection \
                 stays open with no traffic for {:.0} s: the server process used \
                 {srv:.2} ms of CPU, the client process {cli:.2} ms (summed over their \
                 threads, from `/proc/<pid>/task/*/schedstat`).\n",
                IDLE_WINDOW.as_secs_f64()
            ),
            Err(e) => println!("* X-IO idle CPU: FAILED: {e:#}\n"),
        }
    }
    Ok(())
}

const IDLE_WARM: usize = 20_000;
const IDLE_WINDOW: Duration = Duration::from_secs(1);

/// On-CPU nanoseconds of every thread of process `pid` so far.
fn process_cpu_ns(pid: u32) -> Result<u64> {
    let mut total = 0u64;
    for t in std::fs::read_dir(format!("/proc/{pid}/task"))? {
        let path = t?.path().join("schedstat");
        if let Ok(s) = std::fs::read_to_string(path) {
            total += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    Ok(total)
}

/// Steady traffic, then an open connection with none: CPU (ms) the
/// server and this (client) process use over [`IDLE_WINDOW`]. The
/// adaptive policy must put both drivers to sleep.
fn idle_cpu(prefix: &str) -> Result<(f64, f64)> {
    let (child, endpoint, _cleanup) = spawn_server("serve-tokio", AsyncTransport::Xio, prefix, 1)?;
    let pid = child.pid();
    let res = (|| {
        let _pin = pin_scoped(Some(0))?;
        let rt = runtime()?;
        rt.block_on(async {
            let p = endpoint.split_once('/').map_or("", |x| x.0);
            let net = xio_core::net::Net::attach(p)?;
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut s = loop {
                match connect(AsyncTransport::Xio, &endpoint, Some(&net)).await {
                    Ok(s) => break s,
                    Err(_) if Instant::now() < deadline => {
                        tokio::time::sleep(Duration::from_millis(2)).await
                    }
                    Err(e) => return Err(e).context("connecting"),
                }
            };
            let tx = [7u8; MSG];
            let mut rx = [0u8; MSG];
            for _ in 0..IDLE_WARM {
                s.write_all(&tx).await?;
                s.read_exact(&mut rx).await?;
            }
            // Let the spin budgets run out, then measure.
            tokio::time::sleep(Duration::from_millis(50)).await;
            let me = std::process::id();
            let (s0, c0) = (process_cpu_ns(pid)?, process_cpu_ns(me)?);
            tokio::time::sleep(IDLE_WINDOW).await;
            let (s1, c1) = (process_cpu_ns(pid)?, process_cpu_ns(me)?);
            s.shutdown().await?;
            Ok(((s1 - s0) as f64 / 1e6, (c1 - c0) as f64 / 1e6))
        })
    })();
    child.finish(res)
}

/// Runs one cell per transport, `rounds` times round-robin, merging the
/// rounds; a transport that fails once is reported (in `failures`) and
/// skipped from then on.
fn measure_row(
    transports: &[AsyncTransport],
    rounds: usize,
    what: &str,
    failures: &mut Vec<String>,
    run: impl Fn(AsyncTransport) -> Result<Outcome>,
) -> Vec<Option<Outcome>> {
    let mut acc: Vec<Option<Outcome>> = transports
        .iter()
        .map(|_| Some(Outcome::default()))
        .collect();
    for round in 0..rounds {
        for (k, &t) in transports.iter().enumerate() {
            let Some(a) = &mut acc[k] else { continue };
            progress(&format!(
                "{} {what} (round {}/{rounds})",
                t.label(),
                round + 1
            ));
            match run(t) {
                Ok(o) => {
                    a.samples.extend(o.samples);
                    a.ops += o.ops;
                    a.wall += o.wall;
                }
                Err(e) => {
                    eprintln!("[xio-bench] {} {what}: FAILED: {e:#}", t.label());
                    failures.push(format!("* {} {what}: {e:#}", t.label()));
                    acc[k] = None;
                }
            }
        }
    }
    acc
}

/// xio-tokio's requests/s over X-IO's own event loop's and over the best
/// shmipc mode's, per row, when the run measured them (issue 45's two
/// targets, judged within one run).
fn print_ratios(transports: &[AsyncTransport], rows: &[(usize, Vec<Option<f64>>)]) {
    let at = |t| transports.iter().position(|&x| x == t);
    let Some(x) = at(AsyncTransport::Xio) else {
        return;
    };
    let pol = at(AsyncTransport::XioPoll);
    let shm: Vec<usize> = [AsyncTransport::Shmipc, AsyncTransport::ShmipcEventfd]
        .into_iter()
        .filter_map(at)
        .collect();
    if pol.is_none() && shm.is_empty() {
        return;
    }
    let mut head = String::from("| conns |");
    let mut rule = String::from("|---:|");
    if pol.is_some() {
        head.push_str(" X-IO / X-IO event loop |");
        rule.push_str("---:|");
    }
    if !shm.is_empty() {
        head.push_str(" X-IO / best shmipc |");
        rule.push_str("---:|");
    }
    println!("{head}\n{rule}");
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!(" {:.2}x |", a / b),
        _ => " - |".to_owned(),
    };
    for (n, rates) in rows {
        let mut line = format!("| {n} |");
        if let Some(p) = pol {
            line.push_str(&ratio(rates[x], rates[p]));
        }
        if !shm.is_empty() {
            let best = shm.iter().filter_map(|&i| rates[i]).reduce(f64::max);
            line.push_str(&ratio(rates[x], best));
        }
        println!("{line}");
    }
    println!();
}

/// A markdown row: requests/s, p50 and p99 per transport.
fn table_row(n: usize, cells: Vec<Option<Outcome>>) -> String {
    let mut line = format!("| {n} |");
    for c in cells {
        match c {
            Some(mut o) => {
                let s = summarize(&mut o.samples);
                let rate = o.ops as f64 / o.wall.as_secs_f64().max(1e-9);
                line.push_str(&format!(
                    " {rate:.0} | {} | {} |",
                    fmt_us(s.p50_ns),
                    fmt_us(s.p99_ns)
                ));
            }
            None => line.push_str(" failed | | |"),
        }
    }
    line
}

fn fresh_xio_addr() -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(1);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    format!("10.78.{}.{}:80", (n >> 8) & 0xff, n & 0xff)
}

fn run_one(
    t: AsyncTransport,
    prefix: &str,
    n: usize,
    warm: Duration,
    measure: Duration,
) -> Result<Outcome> {
    if t == AsyncTransport::XioPoll {
        let (samples, ops, wall) = crate::sockets::event_loop_cell(n, warm, measure)?;
        return Ok(Outcome { samples, ops, wall });
    }
    let (child, endpoint, _cleanup) = spawn_server("serve-tokio", t, prefix, n)?;
    let res = (|| {
        let _pin = pin_scoped(Some(0))?;
        let rt = runtime()?;
        if t.is_peer() {
            let eventfd = t == AsyncTransport::ShmipcEventfd;
            let lat = rt.block_on(crate::peers::shmipc_client(
                &endpoint, n, MSG, eventfd, warm, measure,
            ))?;
            let samples: Vec<u64> = lat.into_iter().flatten().collect();
            return Ok(Outcome {
                ops: samples.len() as u64,
                samples,
                wall: measure,
            });
        }
        rt.block_on(client(t, endpoint, n, warm, measure))
    })();
    child.finish(res)
}

/// Spawns `xio-bench <sub>` for transport `t` and `n` connections on a
/// fresh endpoint, pinned to CPU 1. Returns the server, the endpoint for
/// the client, and what to remove afterwards.
fn spawn_server(
    sub: &str,
    t: AsyncTransport,
    prefix: &str,
    n: usize,
) -> Result<(ServerChild, String, Option<RemoveOnDrop>)> {
    let exe = std::env::current_exe()?;
    let mut cmd = Command::new(exe);
    cmd.arg(sub)
        .args([
            "--transport",
            &t.to_possible_value()
                .map(|v| v.get_name().to_owned())
                .unwrap_or_default(),
        ])
        .args(["--conns", &n.to_string()])
        .args(["--cpu", "1"])
        .stdin(Stdio::null());
    let mut cleanup = None;
    let endpoint = match t {
        AsyncTransport::Uds | AsyncTransport::Shmipc | AsyncTransport::ShmipcEventfd => {
            let p = temp_socket_path();
            let e = p
                .to_str()
                .ok_or_else(|| anyhow!("socket path not UTF-8"))?
                .to_owned();
            cleanup = Some(RemoveOnDrop(p));
            e
        }
        AsyncTransport::Tcp => "127.0.0.1:0".to_owned(),
        AsyncTransport::Xio => format!("{prefix}/{}", fresh_xio_addr()),
        AsyncTransport::XioPoll => bail!("the event loop's server is `serve-sock`"),
    };
    cmd.args(["--endpoint", &endpoint]);
    cmd.stdout(if t == AsyncTransport::Tcp {
        Stdio::piped()
    } else {
        Stdio::null()
    });
    let mut child = ServerChild::spawn(&mut cmd)?;
    let endpoint = if t == AsyncTransport::Tcp {
        let out = child.stdout().ok_or_else(|| anyhow!("no server stdout"))?;
        format!("127.0.0.1:{}", read_port_line(out, &mut child)?)
    } else {
        endpoint
    };
    Ok((child, endpoint, cleanup))
}

async fn connect(
    t: AsyncTransport,
    endpoint: &str,
    net: Option<&xio_core::net::Net>,
) -> io::Result<Box<dyn AsyncStream>> {
    Ok(match t {
        AsyncTransport::Uds => Box::new(tokio::net::UnixStream::connect(endpoint).await?),
        AsyncTransport::Tcp => {
            let s = tokio::net::TcpStream::connect(endpoint).await?;
            s.set_nodelay(true)?;
            Box::new(s)
        }
        AsyncTransport::Xio => {
            let (_, a) = endpoint
                .split_once('/')
                .ok_or_else(|| io::Error::other("bad endpoint"))?;
            let net = net.ok_or_else(|| io::Error::other("no net"))?;
            Box::new(xio_tokio::XioStream::connect_with(net, a).await?)
        }
        AsyncTransport::Shmipc | AsyncTransport::ShmipcEventfd | AsyncTransport::XioPoll => {
            return Err(io::Error::other(format!(
                "{} has no AsyncRead stream",
                t.label()
            )))
        }
    })
}

async fn client(
    t: AsyncTransport,
    endpoint: String,
    n: usize,
    warm: Duration,
    measure: Duration,
) -> Result<Outcome> {
    let net = match t {
        AsyncTransport::Xio => {
            let p = endpoint.split_once('/').map_or("", |x| x.0);
            Some(xio_core::net::Net::attach(p).context("attaching the client")?)
        }
        _ => None,
    };
    // The first connection waits for the server to listen.
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        match connect(t, &endpoint, net.as_ref()).await {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(2)).await
            }
            Err(e) => return Err(e).context("connecting"),
        }
    };
    let mut streams = vec![first];
    for _ in 1..n {
        streams.push(
            connect(t, &endpoint, net.as_ref())
                .await
                .context("connecting")?,
        );
    }
    let start = Instant::now();
    let from = start + warm;
    let to = from + measure;
    let tasks: Vec<_> = streams
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            tokio::spawn(async move {
                let mut tx = [0u8; MSG];
                tx[..8].copy_from_slice(&(i as u64).to_le_bytes());
                let mut rx = [0u8; MSG];
                let mut lat = Vec::new();
                loop {
                    let t0 = Instant::now();
                    if t0 >= to {
                        break;
                    }
                    s.write_all(&tx).await?;
                    s.read_exact(&mut rx).await?;
                    if rx != tx {
                        return Err(io::Error::other("wrong echo"));
                    }
                    if t0 >= from {
                        lat.push(t0.elapsed().as_nanos() as u64);
                    }
                }
                s.shutdown().await?;
                Ok::<_, io::Error>(lat)
            })
        })
        .collect();
    let mut out = Outcome::default();
    for t in tasks {
        let lat = t.await??;
        out.ops += lat.len() as u64;
        out.samples.extend(lat);
    }
    out.wall = measure;
    Ok(out)
}

/// The server (`serve-tokio`): echoes on `conns` connections, then exits.
pub fn serve(t: AsyncTransport, endpoint: &str, conns: usize) -> Result<()> {
    let rt = runtime()?;
    rt.block_on(async move {
        let done = Arc::new(AtomicUsize::new(0));
        let all = Arc::new(tokio::sync::Notify::new());
        macro_rules! serve_loop {
            ($accept:expr) => {{
                for _ in 0..conns {
                    let s = $accept;
                    let (done, all) = (done.clone(), all.clone());
                    tokio::spawn(async move {
                        let _ = echo(s).await;
                        if done.fetch_add(1, Ordering::SeqCst) + 1 == conns {
                            all.notify_one();
                        }
                    });
                }
            }};
        }
        match t {
            AsyncTransport::Uds => {
                let _ = std::fs::remove_file(endpoint);
                let l = tokio::net::UnixListener::bind(endpoint)?;
                let _cleanup = RemoveOnDrop(PathBuf::from(endpoint));
                serve_loop!(l.accept().await?.0);
                all.notified().await;
            }
            AsyncTransport::Tcp => {
                let l = tokio::net::TcpListener::bind(endpoint).await?;
                println!("PORT {}", l.local_addr()?.port());
                serve_loop!({
                    let s = l.accept().await?.0;
                    s.set_nodelay(true)?;
                    s
                });
                all.notified().await;
            }
            AsyncTransport::Xio => {
                let (p, a) = endpoint
                    .split_once('/')
                    .ok_or_else(|| anyhow!("bad endpoint"))?;
                let net = xio_core::net::Net::attach(p)?;
                let l = xio_tokio::XioListener::bind_with(&net, a)?;
                serve_loop!(l.accept().await?.0);
                all.notified().await;
            }
            AsyncTransport::Shmipc | AsyncTransport::ShmipcEventfd => {
                let _ = std::fs::remove_file(endpoint);
                let _cleanup = RemoveOnDrop(PathBuf::from(endpoint));
                crate::peers::shmipc_serve(endpoint, conns, MSG).await?;
            }
            AsyncTransport::XioPoll => bail!("the event loop's server is `serve-sock`"),
        }
        Ok::<_, anyhow::Error>(())
    })
}

async fn echo<S: AsyncRead + AsyncWrite + Unpin>(mut s: S) -> io::Result<()> {
    let mut buf = [0u8; MSG];
    loop {
        match s.read_exact(&mut buf).await {
            Ok(_) => s.write_all(&buf).await?,
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(e) => return Err(e),
        }
    }
}

// ---------------------------------------------------------------------------
// `xio-bench http`: hyper over X-IO next to hyper over TCP and a Unix socket.
// ---------------------------------------------------------------------------

/// Options of `xio-bench http`.
#[derive(Clone, Debug, clap::Args)]
pub struct HttpArgs {
    /// Short run: 0.5 s per cell in 2 rounds.
    #[arg(long)]
    pub quick: bool,
    /// Connection counts (default 1,16,64,256).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub conns: Vec<usize>,
    /// Body sizes of the POSTs (default 64; e.g. 64,64K,1M).
    #[arg(long, value_delimiter = ',', num_args = 1.., value_parser = crate::compare::parse_size)]
    pub sizes: Vec<usize>,
    /// HTTP versions (default both).
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1..)]
    pub versions: Vec<HttpVersion>,
    /// Transports (default: all).
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1..)]
    pub transports: Vec<AsyncTransport>,
    /// Measured time per cell in ms (default 2000; split over the rounds).
    #[arg(long)]
    pub duration_ms: Option<u64>,
    /// Rounds per cell (default 4).
    #[arg(long)]
    pub rounds: Option<usize>,
}

/// An HTTP version.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum HttpVersion {
    /// HTTP/1.1, keep-alive.
    H1,
    /// HTTP/2 with prior knowledge, one connection per request in flight.
    H2c,
    /// HTTP/2 with prior knowledge, every request in flight a stream of
    /// one connection (the count is then of streams; ANCHORS.md's h2c rows
    /// are measured this way).
    H2cMux,
}

impl HttpVersion {
    /// The connections a run of `n` requests in flight opens.
    fn conns(self, n: usize) -> usize {
        match self {
            HttpVersion::H2cMux => 1,
            _ => n,
        }
    }
}

/// Runs `xio-bench http`.
pub fn run_http(a: &HttpArgs) -> Result<()> {
    if online_cpus() < 2 {
        bail!("needs 2 CPUs (client on 0, server on 1)");
    }
    let or = |v: &Vec<usize>, d: &[usize]| if v.is_empty() { d.to_vec() } else { v.clone() };
    let conns = or(&a.conns, &DEFAULT_CONNS);
    let sizes = or(&a.sizes, &[MSG]);
    let versions = if a.versions.is_empty() {
        vec![HttpVersion::H1, HttpVersion::H2c]
    } else {
        a.versions.clone()
    };
    let transports: Vec<AsyncTransport> = if a.transports.is_empty() {
        AsyncTransport::value_variants()
            .iter()
            .copied()
            .filter(|t| !t.tokio_only())
            .collect()
    } else {
        a.transports.clone()
    };
    if let Some(t) = transports.iter().find(|t| t.tokio_only()) {
        bail!(
            "{} has no HTTP stack to measure: `xio-bench tokio` measures it",
            t.label()
        );
    }
    let rounds = a.rounds.unwrap_or(if a.quick { 2 } else { 4 }).max(1);
    let total = Duration::from_millis(a.duration_ms.unwrap_or(if a.quick { 500 } else { 2000 }));
    let per_round = total / rounds as u32;
    let warm = (per_round / 4).max(Duration::from_millis(50));

    let run_dir = crate::compare::RunDir::create()?;
    std::env::set_var("XIO_RUN_DIR", &run_dir.0);
    let prefix = format!("xio-bench-http-{}", std::process::id());
    let _mgr = xio_core::manager::Manager::builder(&prefix)
        .spawn()
        .context("starting the embedded manager")?;

    println!(
        "## HTTP echo under hyper: {}\n",
        transports
            .iter()
            .map(|t| t.label().replace("tokio ", "hyper over "))
            .collect::<Vec<_>>()
            .join(" vs ")
    );
    println!(
        "Command: `{}`. One tokio worker thread per process, client on CPU 0, server on CPU 1; \
         each connection (hyper's client `conn` API, one connection per task) POSTs the body \
         and the server echoes it, one request in flight per connection. {:.1} s measured per \
         cell ({rounds} rounds). µs.\n",
        std::env::args().collect::<Vec<_>>().join(" "),
        total.as_secs_f64()
    );
    crate::compare::print_host_phase("before the run");
    let mut failures = Vec::new();
    for &v in &versions {
        for &size in &sizes {
            println!(
                "### {} , {} body\n",
                match v {
                    HttpVersion::H1 => "HTTP/1.1",
                    HttpVersion::H2c => "h2c",
                    HttpVersion::H2cMux => "h2c, one connection (the count is of streams)",
                },
                crate::compare::fmt_size(size)
            );
            let mut head = String::from("| conns |");
            let mut rule = String::from("|---:|");
            for t in &transports {
                let l = t.label().replace("tokio ", "");
                head.push_str(&format!(" {l} req/s | {l} p50 | {l} p99 |"));
                rule.push_str("---:|---:|---:|");
            }
            println!("{head}\n{rule}");
            for &n in &conns {
                let what = format!("http {v:?} {size} B {n} conns");
                let acc = measure_row(&transports, rounds, &what, &mut failures, |t| {
                    run_http_one(t, v, &prefix, n, size, warm, per_round)
                });
                let line = table_row(n, acc);
                println!("{line}");
            }
            println!();
        }
    }
    crate::compare::print_host_phase("after the run");
    for f in failures {
        println!("{f}");
    }
    Ok(())
}

#[allow(clippy::too_many_arguments)]
fn run_http_one(
    t: AsyncTransport,
    v: HttpVersion,
    prefix: &str,
    n: usize,
    size: usize,
    warm: Duration,
    measure: Duration,
) -> Result<Outcome> {
    let (child, endpoint, _cleanup) = spawn_server("serve-http", t, prefix, v.conns(n))?;
    let res = (|| {
        let _pin = pin_scoped(Some(0))?;
        let rt = runtime()?;
        rt.block_on(http_client(t, v, endpoint, n, size, warm, measure))
    })();
    child.finish(res)
}

type ReqBody = http_body_util::Full<bytes::Bytes>;

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<ReqBody>),
    H2(hyper::client::conn::http2::SendRequest<ReqBody>),
}

async fn http_conn(
    t: AsyncTransport,
    v: HttpVersion,
    endpoint: &str,
    net: Option<&xio_core::net::Net>,
) -> io::Result<Sender> {
    let s = connect(t, endpoint, net).await?;
    let io = hyper_util::rt::TokioIo::new(s);
    let err = |e: hyper::Error| io::Error::other(e.to_string());
    Ok(match v {
        HttpVersion::H1 => {
            let (send, conn) = hyper::client::conn::http1::handshake(io)
                .await
                .map_err(err)?;
            tokio::spawn(conn);
            Sender::H1(send)
        }
        HttpVersion::H2c | HttpVersion::H2cMux => {
            let (send, conn) =
                hyper::client::conn::http2::handshake(hyper_util::rt::TokioExecutor::new(), io)
                    .await
                    .map_err(err)?;
            tokio::spawn(conn);
            Sender::H2(send)
        }
    })
}

#[allow(clippy::too_many_arguments)]
async fn http_client(
    t: AsyncTransport,
    v: HttpVersion,
    endpoint: String,
    n: usize,
    size: usize,
    warm: Duration,
    measure: Duration,
) -> Result<Outcome> {
    use http_body_util::BodyExt;
    let net = match t {
        AsyncTransport::Xio => {
            let p = endpoint.split_once('/').map_or("", |x| x.0);
            Some(xio_core::net::Net::attach(p).context("attaching the client")?)
        }
        _ => None,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let first = loop {
        match http_conn(t, v, &endpoint, net.as_ref()).await {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(2)).await
            }
            Err(e) => return Err(e).context("connecting"),
        }
    };
    let mut senders = vec![first];
    for _ in 1..n {
        senders.push(match (v, &senders[0]) {
            (HttpVersion::H2cMux, Sender::H2(s)) => Sender::H2(s.clone()),
            _ => http_conn(t, v, &endpoint, net.as_ref())
                .await
                .context("connecting")?,
        });
    }
    let body = bytes::Bytes::from((0..size).map(|i| (i % 251) as u8).collect::<Vec<u8>>());
    let uri: http::Uri = "http://bench/echo".parse()?;
    let start = Instant::now();
    let from = start + warm;
    let to = from + measure;
    let tasks: Vec<_> = senders
        .into_iter()
        .map(|mut s| {
            let body = body.clone();
            let uri = uri.clone();
            tokio::spawn(async move {
                let mut lat = Vec::new();
                loop {
                    let t0 = Instant::now();
                    if t0 >= to {
                        break;
                    }
                    let req = http::Request::post(uri.clone())
                        .body(http_body_util::Full::new(body.clone()))
                        .map_err(|e| anyhow!(e))?;
                    let resp = match &mut s {
                        Sender::H1(s) => {
                            s.ready().await?;
                            s.send_request(req).await?
                        }
                        Sender::H2(s) => {
                            s.ready().await?;
                            s.send_request(req).await?
                        }
                    };
                    let got = resp.into_body().collect().await?.to_bytes();
                    if got.len() != body.len() {
                        bail!("echo of {} bytes came back as {}", body.len(), got.len());
                    }
                    if t0 >= from {
                        lat.push(t0.elapsed().as_nanos() as u64);
                    }
                }
                Ok::<_, anyhow::Error>(lat)
            })
        })
        .collect();
    let mut out = Outcome::default();
    for t in tasks {
        let lat = t.await??;
        out.ops += lat.len() as u64;
        out.samples.extend(lat);
    }
    out.wall = measure;
    Ok(out)
}

/// The server (`serve-http`): hyper's auto (HTTP/1.1 + h2c) echo service.
pub fn serve_http(t: AsyncTransport, endpoint: &str, conns: usize) -> Result<()> {
    use http_body_util::BodyExt;
    async fn echo(
        req: http::Request<hyper::body::Incoming>,
    ) -> Result<http::Response<http_body_util::Full<bytes::Bytes>>, hyper::Error> {
        let b = req.into_body().collect().await?.to_bytes();
        Ok(http::Response::new(http_body_util::Full::new(b)))
    }
    let rt = runtime()?;
    rt.block_on(async move {
        let builder =
            hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
        let done = Arc::new(AtomicUsize::new(0));
        let all = Arc::new(tokio::sync::Notify::new());
        macro_rules! accept_loop {
            ($accept:expr) => {{
                for _ in 0..conns {
                    let s = $accept;
                    let conn = builder
                        .serve_connection(
                            hyper_util::rt::TokioIo::new(s),
                            hyper::service::service_fn(echo),
                        )
                        .into_owned();
                    let (done, all) = (done.clone(), all.clone());
                    tokio::spawn(async move {
                        let _ = conn.await;
                        if done.fetch_add(1, Ordering::SeqCst) + 1 == conns {
                            all.notify_one();
                        }
                    });
                }
                all.notified().await;
                Ok(())
            }};
        }
        match t {
            AsyncTransport::Uds => {
                let _ = std::fs::remove_file(endpoint);
                let l = tokio::net::UnixListener::bind(endpoint)?;
                let _cleanup = RemoveOnDrop(PathBuf::from(endpoint));
                accept_loop!(l.accept().await?.0)
            }
            AsyncTransport::Tcp => {
                let l = tokio::net::TcpListener::bind(endpoint).await?;
                println!("PORT {}", l.local_addr()?.port());
                accept_loop!({
                    let s = l.accept().await?.0;
                    s.set_nodelay(true)?;
                    s
                })
            }
            AsyncTransport::Xio => {
                let (p, a) = endpoint
                    .split_once('/')
                    .ok_or_else(|| anyhow!("bad endpoint"))?;
                let net = xio_core::net::Net::attach(p)?;
                let l = xio_tokio::XioListener::bind_with(&net, a)?;
                accept_loop!(l.accept().await?.0)
            }
            AsyncTransport::Shmipc | AsyncTransport::ShmipcEventfd | AsyncTransport::XioPoll => {
                bail!("{} has no HTTP stack", t.label())
            }
        }
    })
}

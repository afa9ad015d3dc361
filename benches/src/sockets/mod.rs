//! `xio-bench sockets`: stream sockets between two processes, every
//! transport side by side, printed as markdown tables on stdout (progress
//! goes to stderr).
//!
//! Transports: kernel Unix-domain stream sockets (`uds`) and TCP over
//! 127.0.0.1 with `TCP_NODELAY` on both ends (`tcp`).
//!
//! Sections (`--sections` picks some), each for every `--placement`
//! (`apart`: client CPU 0, server CPU 1; `one-core`: both on CPU 0):
//! * `a`: round trip over one persistent connection, for every `--sizes`
//!   size: the client `write_all`s `size` bytes, the server `read_exact`s
//!   them and writes them back, the client `read_exact`s the reply;
//! * `b`: short connections: connect, 64 B request, 64 B reply, close;
//! * `c`: `--conns` concurrent persistent connections, 64 B request-response
//!   with one request in flight per connection; client and server are each
//!   one thread driving all connections with an epoll loop.
//!
//! The parent is the client. Every measurement spawns a fresh server: this
//! executable with the hidden `serve-sock` subcommand, pinned to its CPU,
//! killed with the parent (`PR_SET_PDEATHSIG`). Each cell's work is split
//! into rounds that run round-robin over the transports (as in `compare`),
//! so drift on the host hits all transports alike.
//!
//! # Adding a transport
//!
//! The client and server loops of sections a and b are generic over
//! `Read + Write` streams ([`rtt_client`], [`short_client`],
//! [`serve_blocking`] with a [`Listen`] impl); only listen/accept/connect are
//! per transport. Section c's epoll loops ([`epoll_client`],
//! [`epoll_server`]) need kernel file descriptors. A new transport is one
//! [`Transport`] variant plus the arms marked `X-IO:` in [`spawn_server`],
//! [`serve`] and [`client`].

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use clap::ValueEnum;
use rustix::buffer::spare_capacity;
use rustix::event::{epoll, Timespec};
use rustix::io::Errno;
use rustix::net::{AddressFamily, SocketAddrUnix, SocketFlags, SocketType};

use crate::baselines::{
    echo_loop, elapsed_ns, ns_between, pattern, read_port_line, retry_connect, temp_socket_path,
    RemoveOnDrop, ServerChild, READY_TIMEOUT,
};
use crate::clock::{presized, to_ns, Clock};
use crate::compare::{
    background_load, fmt_size, parse_size, print_host_phase, progress, NoiseMeter,
};
use crate::pin::{online_cpus, pin_scoped};
use crate::stats::{fmt_us, summarize, Summary};
use xio_core::net::{Net, XioListener, XioStream};

/// Options of `xio-bench sockets`.
#[derive(Clone, Debug, clap::Args)]
pub struct SocketsArgs {
    /// Short run: a: 3000 round trips (warm-up 200); b: 1000 connections;
    /// c: 0.5 s per cell; all in 2 rounds.
    #[arg(long)]
    pub quick: bool,
    /// Sections to run (default: all): `a` round trip on one persistent
    /// connection, `b` short connections, `c` concurrent connections.
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1..)]
    pub sections: Vec<Section>,
    /// Message sizes for section a (default 64,1K,4K,64K).
    #[arg(long, value_delimiter = ',', num_args = 1.., value_parser = parse_size)]
    pub sizes: Vec<usize>,
    /// Connection counts for section c (default 1,16,64,256).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub conns: Vec<usize>,
    /// Placements (default both): `apart` (client CPU 0, server CPU 1),
    /// `one-core` (both on CPU 0).
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1..)]
    pub placement: Vec<Placement>,
    /// Transports to run (default: all).
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1..)]
    pub transports: Vec<Transport>,
    /// Section a: timed round trips per cell (default 20000; 3000 with
    /// --quick).
    #[arg(long)]
    pub iters: Option<usize>,
    /// Section a: untimed round trips before each round (default 2000; 200
    /// with --quick).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Section b: timed connections per cell (default 10000; 1000 with
    /// --quick), after 1/10 as many untimed ones per round.
    #[arg(long)]
    pub short_iters: Option<usize>,
    /// Section c: measured time per cell in ms (default 2000; 500 with
    /// --quick), split over the rounds; each round first runs 1/4 of its
    /// time (at least 50 ms) unmeasured.
    #[arg(long)]
    pub duration_ms: Option<u64>,
    /// Split each cell's work into this many rounds, run round-robin over
    /// the transports (default 4; 2 with --quick).
    #[arg(long)]
    pub rounds: Option<usize>,
}

/// A stream transport under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Transport {
    /// Kernel Unix-domain stream socket; the endpoint is a socket path.
    Uds,
    /// Kernel TCP over loopback with `TCP_NODELAY`; the endpoint is
    /// `ip:port` (port 0: the server picks one and prints `PORT <n>`).
    Tcp,
    /// X-IO sockets (`xio_core::net`) over the embedded manager's pool;
    /// the endpoint is `prefix/ip:port`.
    Xio,
    /// X-IO with batch wake-up off (one descriptor per drain), as the
    /// paper's X-IO-no-batch.
    XioNoBatch,
    /// X-IO whose section-c event loops hold their writes while they
    /// handle one poll's events, when there are several
    /// (`Net::batch_writes`), so the requests or replies of a pass leave
    /// together. Section c only.
    XioBatchWrites,
    /// X-IO streams through the zero-copy calls (section a only): the
    /// client sends pool buffers (`alloc` + `send_buf`) and takes replies
    /// with `recv_buf`; the server forwards each received buffer back in
    /// place (`recv_buf`, `into_mut`, `send_buf`). No payload copy at all.
    XioZc,
}

impl Transport {
    /// Column label.
    fn label(self) -> &'static str {
        match self {
            Transport::Uds => "UDS",
            Transport::Tcp => "TCP",
            Transport::Xio => "X-IO",
            Transport::XioNoBatch => "X-IO no-batch",
            Transport::XioBatchWrites => "X-IO batched writes",
            Transport::XioZc => "X-IO zero-copy",
        }
    }
}

/// A benchmark section.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Section {
    /// Round trip over one persistent connection.
    A,
    /// Short connections: connect, 64 B exchange, close.
    B,
    /// Concurrent persistent connections, 64 B request-response.
    C,
    /// As c, with a thread per connection on each side (blocking reads and
    /// writes: the paper's goroutine-per-connection model, where batched
    /// wake-up matters).
    D,
}

/// Where client and server run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Placement {
    /// Client on CPU 0, server on CPU 1.
    Apart,
    /// Both on CPU 0.
    OneCore,
}

impl Placement {
    /// (client CPU, server CPU).
    fn cpus(self) -> (usize, usize) {
        match self {
            Placement::Apart => (0, 1),
            Placement::OneCore => (0, 0),
        }
    }

    fn title(self) -> &'static str {
        match self {
            Placement::Apart => "separate cores (client CPU 0, server CPU 1)",
            Placement::OneCore => "one core (client and server both on CPU 0)",
        }
    }
}

const KIB: usize = 1 << 10;
const DEFAULT_SIZES: [usize; 4] = [64, KIB, 4 * KIB, 64 * KIB];
const DEFAULT_CONNS: [usize; 4] = [1, 16, 64, 256];
/// Message size of sections b and c.
const MSG: usize = 64;
/// Listen backlog (capped by `net.core.somaxconn`), so that section c's
/// connection burst never overflows the accept queue (std uses 128 for TCP).
const BACKLOG: i32 = 1024;
/// How long section c's client waits for the replies still in flight when
/// the measurement ends.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// Epoll token of the listening socket in [`epoll_server`].
const LISTENER_TOKEN: u64 = u64::MAX;

/// The name of a `clap::ValueEnum` value on the command line.
fn value_name<T: ValueEnum>(v: &T) -> String {
    v.to_possible_value()
        .map(|p| p.get_name().to_owned())
        .unwrap_or_default()
}

mod loops;

use loops::{epoll_client, epoll_server, xio_loop_client, xio_loop_server};

// ---------------------------------------------------------------------------
// Orchestration (parent)
// ---------------------------------------------------------------------------

/// What a client run measured.
#[derive(Default)]
struct Outcome {
    /// Per-operation latencies in ns (round trip, connection, request).
    samples: Vec<u64>,
    /// Operations completed in the measured window.
    ops: u64,
    /// Length of the measured window.
    wall: Duration,
    /// Section b: each connection's time split into connect, data (the
    /// exchange) and close, in ns (the paper's Fig. 8 phases); empty
    /// elsewhere.
    phases: [Vec<u64>; 3],
}

impl Outcome {
    fn merge(&mut self, mut o: Outcome) {
        self.samples.append(&mut o.samples);
        self.ops += o.ops;
        self.wall += o.wall;
        for (a, b) in self.phases.iter_mut().zip(&mut o.phases) {
            a.append(b);
        }
    }

    /// Operations per second.
    fn rate(&self) -> f64 {
        self.ops as f64 / self.wall.as_secs_f64().max(1e-9)
    }
}

/// A cell's result, summarized.
struct Cell {
    sum: Summary,
    rate: f64,
    /// The medians of [`Outcome::phases`], in ns (section b).
    phases: Option<[f64; 3]>,
}

/// The names of [`Outcome::phases`], as section b's rows say them.
const PHASES: [&str; 3] = ["connect", "data", "close"];

/// One client/server pair's parameters.
#[derive(Clone, Copy, Debug)]
struct Job {
    section: Section,
    /// Message size (section a; [`MSG`] otherwise).
    size: usize,
    /// Concurrent connections (section c; 1 otherwise).
    conns: usize,
    /// Untimed operations first (sections a and b).
    warmup: usize,
    /// Timed operations (sections a and b).
    iters: usize,
    /// Unmeasured warm-up time (section c).
    warm: Duration,
    /// Measured time (section c).
    measure: Duration,
    client_cpu: usize,
    server_cpu: usize,
}

/// Settings of a whole run.
#[derive(Clone)]
struct Plan {
    transports: Vec<Transport>,
    rounds: usize,
    warmup: usize,
    iters: usize,
    short_iters: usize,
    duration: Duration,
}

/// Runs `xio-bench sockets`.
pub fn run(a: &SocketsArgs) -> Result<()> {
    let started = Instant::now();
    let sections: Vec<Section> = or_all(&a.sections, Section::value_variants());
    let placements: Vec<Placement> = or_all(&a.placement, Placement::value_variants());
    let sizes: Vec<usize> = or_all(&a.sizes, &DEFAULT_SIZES);
    let conns: Vec<usize> = or_all(&a.conns, &DEFAULT_CONNS);
    ensure!(conns.iter().all(|&c| c > 0), "--conns must be at least 1");
    let plan = Plan {
        transports: or_all(&a.transports, Transport::value_variants()),
        rounds: a.rounds.unwrap_or(if a.quick { 2 } else { 4 }).max(1),
        warmup: a.warmup.unwrap_or(if a.quick { 200 } else { 2_000 }),
        iters: a
            .iters
            .unwrap_or(if a.quick { 3_000 } else { 20_000 })
            .max(1),
        short_iters: a
            .short_iters
            .unwrap_or(if a.quick { 1_000 } else { 10_000 })
            .max(1),
        duration: Duration::from_millis(
            a.duration_ms
                .unwrap_or(if a.quick { 500 } else { 2_000 })
                .max(1),
        ),
    };
    let cpus = online_cpus();

    // X-IO: a private run dir and an embedded manager; servers inherit both.
    let run_dir = crate::compare::RunDir::create()?;
    std::env::set_var("XIO_RUN_DIR", &run_dir.0);
    let prefix = format!("xio-bench-sock-{}", std::process::id());
    std::env::set_var("XIO_BENCH_PREFIX", &prefix);
    let _mgr = xio_core::manager::Manager::builder(&prefix)
        .spawn()
        .context("starting the embedded manager")?;

    let load = background_load(Duration::from_millis(500));
    let noise = NoiseMeter::start();
    if let Some(l) = load.as_ref().filter(|l| l.busy_pct > 10.0) {
        eprintln!(
            "[xio-bench] WARNING: the machine is {:.0}% busy before the run; \
             results will be noisy",
            l.busy_pct
        );
    }

    let labels: Vec<&str> = plan.transports.iter().map(|t| t.label()).collect();
    println!("## Stream sockets: {}\n", labels.join(" vs "));
    println!(
        "Machine: {}; Linux {}; {cpus} CPUs online. Command: `{}`.\n",
        cpu_model(),
        kernel_release(),
        std::env::args().collect::<Vec<_>>().join(" ")
    );
    println!(
        "UDS: Unix-domain stream socket; TCP: TCP over 127.0.0.1 with TCP_NODELAY on both ends. \
         Every cell's work is split into {} rounds run round-robin over the transports, \
         each round with a fresh server process. Times in µs.\n",
        plan.rounds
    );
    if let Some(l) = &load {
        println!(
            "Background load just before the run (all CPUs, 0.5 s): {:.1}% busy, {:.1}% steal.\n",
            l.busy_pct, l.steal_pct
        );
    }
    print_host_phase("before the run");

    for &section in &sections {
        for &place in &placements {
            let (cc, sc) = place.cpus();
            if cc.max(sc) >= cpus {
                println!("({}: skipped, only {cpus} CPU online)\n", place.title());
                continue;
            }
            match section {
                Section::A => section_a(&plan, place, &sizes),
                Section::B => section_b(&plan, place),
                Section::C => section_c(&plan, place, &conns, Section::C),
                Section::D => section_c(&plan, place, &conns, Section::D),
            }
        }
    }

    print_host_phase("after the run");
    println!("Total run time: {:.0} s.", started.elapsed().as_secs_f64());
    if let Some((secs, pct)) = noise.as_ref().and_then(NoiseMeter::finish) {
        println!(
            "Other processes used {secs:.1} CPU-seconds during the run \
             ({pct:.1}% of one CPU on average).{}",
            if pct > 5.0 {
                " **The machine was not quiet: treat these numbers as noisy.**"
            } else {
                ""
            }
        );
    }
    Ok(())
}

/// `v`, or `all` if `v` is empty.
fn or_all<T: Clone>(v: &[T], all: &[T]) -> Vec<T> {
    if v.is_empty() { all } else { v }.to_vec()
}

/// `model name` from `/proc/cpuinfo`.
fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "?".into())
}

/// `n` split into `rounds` parts, the remainder spread over the first ones.
fn share(n: usize, rounds: usize, round: usize) -> usize {
    n / rounds + usize::from(round < n % rounds)
}

/// Runs `job(round)` for every transport, round-robin over `plan.rounds`
/// rounds; a transport that fails is not retried.
fn measure(plan: &Plan, what: &str, job: impl Fn(usize) -> Job) -> Vec<Result<Cell, String>> {
    let ts = &plan.transports;
    let mut acc: Vec<Result<Outcome, String>> = ts.iter().map(|_| Ok(Outcome::default())).collect();
    for round in 0..plan.rounds {
        for (k, &t) in ts.iter().enumerate() {
            if acc[k].is_err() {
                continue;
            }
            progress(&format!(
                "{} {what} (round {}/{})",
                t.label(),
                round + 1,
                plan.rounds
            ));
            match run_pair(t, &job(round)) {
                Ok(o) => {
                    if let Ok(a) = &mut acc[k] {
                        a.merge(o);
                    }
                }
                Err(e) => {
                    eprintln!("[xio-bench] {} {what}: FAILED: {e:#}", t.label());
                    acc[k] = Err(format!("{e:#}"));
                }
            }
        }
    }
    acc.into_iter()
        .map(|r| {
            r.map(|mut o| {
                let phases = (!o.phases[0].is_empty())
                    .then(|| o.phases.each_mut().map(|p| summarize(p).p50_ns));
                Cell {
                    sum: summarize(&mut o.samples),
                    rate: o.rate(),
                    phases,
                }
            })
        })
        .collect()
}

/// Prints the failures of a table's cells below it.
fn print_failures(plan: &Plan, row: &str, cells: &[Result<Cell, String>]) {
    for (t, c) in plan.transports.iter().zip(cells) {
        if let Err(e) = c {
            println!("* {} {row}: failed: {}", t.label(), e.replace('\n', " "));
        }
    }
}

fn section_a(plan: &Plan, place: Placement, sizes: &[usize]) {
    let plan = &plan_for(plan, Section::A);
    let (cc, sc) = place.cpus();
    let rows: Vec<(usize, Vec<Result<Cell, String>>)> = sizes
        .iter()
        .map(|&size| {
            let what = format!("a {} {}", fmt_size(size), value_name(&place));
            let cells = measure(plan, &what, |round| Job {
                section: Section::A,
                size,
                conns: 1,
                warmup: plan.warmup,
                iters: share(plan.iters, plan.rounds, round),
                warm: Duration::ZERO,
                measure: Duration::ZERO,
                client_cpu: cc,
                server_cpu: sc,
            });
            (size, cells)
        })
        .collect();
    println!(
        "### (a) Round trip, one persistent connection, {}\n",
        place.title()
    );
    println!(
        "{} timed round trips per cell (`write_all` size bytes, server `read_exact` + \
         `write_all`, client `read_exact`), each round after {} untimed ones; \
         µs.\n",
        plan.iters, plan.warmup
    );
    let mut head = String::from("| size |");
    let mut rule = String::from("|---|");
    for t in &plan.transports {
        let l = t.label();
        head.push_str(&format!(" {l} p50 | {l} p99 | {l} mean |"));
        rule.push_str("---:|---:|---:|");
    }
    println!("{head}\n{rule}");
    for (size, cells) in &rows {
        let mut line = format!("| {} |", fmt_size(*size));
        for c in cells {
            match c {
                Ok(c) => line.push_str(&format!(
                    " {} | {} | {} |",
                    fmt_us(c.sum.p50_ns),
                    fmt_us(c.sum.p99_ns),
                    fmt_us(c.sum.mean_ns)
                )),
                Err(_) => line.push_str(" failed | | |"),
            }
        }
        println!("{line}");
    }
    println!();
    for (size, cells) in &rows {
        print_failures(plan, &fmt_size(*size), cells);
    }
}

/// A row of section b's table: name, and how to print it from a cell.
type Metric = (&'static str, fn(&Cell) -> String);

/// `plan` without the transports that do not take part in `section`: the
/// zero-copy calls are section a's, batched writes section c's (an event
/// loop's).
fn plan_for(plan: &Plan, section: Section) -> Plan {
    let mut p = plan.clone();
    p.transports.retain(|&t| match t {
        Transport::XioZc => section == Section::A,
        Transport::XioBatchWrites => section == Section::C,
        _ => true,
    });
    p
}

fn section_b(plan: &Plan, place: Placement) {
    let plan = &plan_for(plan, Section::B);
    let (cc, sc) = place.cpus();
    let what = format!("b {}", value_name(&place));
    let cells = measure(plan, &what, |round| {
        let iters = share(plan.short_iters, plan.rounds, round);
        Job {
            section: Section::B,
            size: MSG,
            conns: 1,
            warmup: (iters / 10).max(1),
            iters,
            warm: Duration::ZERO,
            measure: Duration::ZERO,
            client_cpu: cc,
            server_cpu: sc,
        }
    });
    println!("### (b) Short connections, {}\n", place.title());
    println!(
        "{} timed connections per transport: connect, write {MSG} B, `read_exact` {MSG} B \
         (the server accepts, echoes, closes), close; each round after 1/10 as many \
         untimed ones. Connections/s = timed connections / time of the timed loop. \
         The phases (the paper's Fig. 8): connect = until `connect` returns, data = \
         the exchange, close = the client's close (drop) of its stream; p50 of each.\n",
        plan.short_iters
    );
    let mut head = String::from("| |");
    let mut rule = String::from("|---|");
    for t in &plan.transports {
        head.push_str(&format!(" {} |", t.label()));
        rule.push_str("---:|");
    }
    println!("{head}\n{rule}");
    let metrics: [Metric; 4] = [
        ("p50 (µs)", |c| fmt_us(c.sum.p50_ns)),
        ("p99 (µs)", |c| fmt_us(c.sum.p99_ns)),
        ("mean (µs)", |c| fmt_us(c.sum.mean_ns)),
        ("connections/s", |c| format!("{:.0}", c.rate)),
    ];
    for (name, f) in metrics {
        let mut line = format!("| {name} |");
        for c in &cells {
            match c {
                Ok(c) => line.push_str(&format!(" {} |", f(c))),
                Err(_) => line.push_str(" failed |"),
            }
        }
        println!("{line}");
    }
    for (i, name) in PHASES.iter().enumerate() {
        let mut line = format!("| {name} p50 (µs) |");
        for c in &cells {
            match c.as_ref().ok().and_then(|c| c.phases) {
                Some(p) => line.push_str(&format!(" {} |", fmt_us(p[i]))),
                None => line.push_str(" - |"),
            }
        }
        println!("{line}");
    }
    println!();
    print_failures(plan, "short connections", &cells);
}

fn section_c(plan: &Plan, place: Placement, conns: &[usize], section: Section) {
    let plan = &plan_for(plan, section);
    let (cc, sc) = place.cpus();
    let per_round = plan.duration / plan.rounds as u32;
    let warm = (per_round / 4).max(Duration::from_millis(50));
    let rows: Vec<(usize, Vec<Result<Cell, String>>)> = conns
        .iter()
        .map(|&n| {
            let what = format!("{} {n} conns {}", value_name(&section), value_name(&place));
            let cells = measure(plan, &what, |_| Job {
                section,
                size: MSG,
                conns: n,
                warmup: 0,
                iters: 0,
                warm,
                measure: per_round,
                client_cpu: cc,
                server_cpu: sc,
            });
            (n, cells)
        })
        .collect();
    let (name, model) = if section == Section::D {
        (
            "(d) Concurrent connections, a thread per connection",
            "client and server run a thread per connection with blocking reads and writes",
        )
    } else {
        (
            "(c) Concurrent connections",
            "client and server are one thread each with an epoll loop over all connections",
        )
    };
    println!("### {name}, {MSG} B request-response, {}\n", place.title());
    println!(
        "One request in flight per connection; {model}. {:.1} s measured per cell \
         ({} rounds of {:.2} s, each after {:.2} s unmeasured). Requests/s and \
         latencies over the replies received in the measured window.\n",
        plan.duration.as_secs_f64(),
        plan.rounds,
        per_round.as_secs_f64(),
        warm.as_secs_f64()
    );
    let mut head = String::from("| conns |");
    let mut rule = String::from("|---:|");
    for t in &plan.transports {
        let l = t.label();
        head.push_str(&format!(" {l} req/s | {l} p50 | {l} p99 |"));
        rule.push_str("---:|---:|---:|");
    }
    println!("{head}\n{rule}");
    for (n, cells) in &rows {
        let mut line = format!("| {n} |");
        for c in cells {
            match c {
                Ok(c) => line.push_str(&format!(
                    " {:.0} | {} | {} |",
                    c.rate,
                    fmt_us(c.sum.p50_ns),
                    fmt_us(c.sum.p99_ns)
                )),
                Err(_) => line.push_str(" failed | | |"),
            }
        }
        println!("{line}");
    }
    println!();
    for (n, cells) in &rows {
        print_failures(plan, &format!("{n} conns"), cells);
    }
}

/// One cell of section c for X-IO's own event loop (`Net::poll`, one
/// thread each side, client on CPU 0, server on CPU 1): what `xio-bench
/// tokio` sets beside xio-tokio. Needs `XIO_BENCH_PREFIX` (the embedded
/// manager). Returns the round trips' latencies in ns, the round trips
/// completed in the measured window, and that window.
pub(crate) fn event_loop_cell(
    conns: usize,
    warm: Duration,
    measure: Duration,
) -> Result<(Vec<u64>, u64, Duration)> {
    let job = Job {
        section: Section::C,
        size: MSG,
        conns,
        warmup: 0,
        iters: 0,
        warm,
        measure,
        client_cpu: 0,
        server_cpu: 1,
    };
    let o = run_pair(Transport::Xio, &job)?;
    Ok((o.samples, o.ops, o.wall))
}

/// Spawns a server for `job`, runs the client pinned to its CPU, and waits
/// for the server to exit.
fn run_pair(t: Transport, job: &Job) -> Result<Outcome> {
    let (mut child, endpoint, _cleanup) = spawn_server(t, job)?;
    let res = pin_scoped(Some(job.client_cpu))
        .context("pinning client")
        .and_then(|_pin| client(t, job, &endpoint, &mut child));
    child.finish(res)
}

/// Spawns `xio-bench serve-sock ...` for `job` on a fresh endpoint.
/// Returns the server, the endpoint for the client, and what to clean up
/// afterwards.
fn spawn_server(t: Transport, job: &Job) -> Result<(ServerChild, String, Option<RemoveOnDrop>)> {
    let exe = std::env::current_exe().context("locating current executable")?;
    let mut cmd = Command::new(exe);
    cmd.arg("serve-sock")
        .args(["--transport", &value_name(&t)])
        .args(["--section", &value_name(&job.section)])
        .args(["--size", &job.size.to_string()])
        .args(["--conns", &job.conns.to_string()])
        .args(["--cpu", &job.server_cpu.to_string()])
        .stdin(Stdio::null());
    match t {
        Transport::Uds => {
            let path = temp_socket_path();
            let endpoint = path
                .to_str()
                .ok_or_else(|| anyhow!("temp socket path {path:?} is not UTF-8"))?
                .to_owned();
            let cleanup = RemoveOnDrop(path);
            cmd.args(["--endpoint", &endpoint]).stdout(Stdio::null());
            let child = ServerChild::spawn(&mut cmd)?;
            Ok((child, endpoint, Some(cleanup)))
        }
        Transport::Tcp => {
            cmd.args(["--endpoint", "127.0.0.1:0"])
                .stdout(Stdio::piped());
            let mut child = ServerChild::spawn(&mut cmd)?;
            let stdout = child
                .stdout()
                .ok_or_else(|| anyhow!("server stdout was not captured"))?;
            let port = read_port_line(stdout, &mut child)?;
            Ok((child, format!("127.0.0.1:{port}"), None))
        }
        Transport::Xio | Transport::XioNoBatch | Transport::XioBatchWrites | Transport::XioZc => {
            let prefix = std::env::var("XIO_BENCH_PREFIX")
                .context("X-IO needs the embedded manager (XIO_BENCH_PREFIX)")?;
            let endpoint = format!("{prefix}/{}", fresh_xio_addr());
            cmd.args(["--endpoint", &endpoint]).stdout(Stdio::null());
            let child = ServerChild::spawn(&mut cmd)?;
            Ok((child, endpoint, None))
        }
    }
}

/// Runs the client side of `job` against the server at `endpoint`. The
/// first connection is retried until the server listens (or exits).
fn client(t: Transport, job: &Job, endpoint: &str, child: &mut ServerChild) -> Result<Outcome> {
    match t {
        Transport::Uds => {
            let path = PathBuf::from(endpoint);
            let connect = || UnixStream::connect(&path);
            match job.section {
                Section::C => epoll_client(connect, Some(child), job),
                _ => blocking_client(connect, Some(child), job),
            }
        }
        Transport::Tcp => {
            let addr: SocketAddr = endpoint
                .parse()
                .with_context(|| format!("bad TCP endpoint {endpoint:?}"))?;
            let connect = || connect_tcp(addr);
            match job.section {
                Section::C => epoll_client(connect, Some(child), job),
                _ => blocking_client(connect, Some(child), job),
            }
        }
        Transport::Xio | Transport::XioNoBatch | Transport::XioBatchWrites | Transport::XioZc => {
            let (prefix, addr) = split_xio(endpoint)?;
            let net = Net::builder(prefix)
                .batch_wakeup(t != Transport::XioNoBatch)
                .attach()
                .context("attaching the client")?;
            let connect = || net.connect(addr);
            match job.section {
                Section::C => xio_loop_client(
                    &net,
                    connect,
                    Some(child),
                    job,
                    t == Transport::XioBatchWrites,
                ),
                Section::A if t == Transport::XioZc => {
                    let s = retry_connect(connect, Some(child), READY_TIMEOUT)?;
                    zc_rtt_client(&s, job.size, job.warmup, job.iters)
                }
                _ => blocking_client(connect, Some(child), job),
            }
        }
    }
    .with_context(|| format!("{} client (endpoint {endpoint:?})", t.label()))
}

fn connect_tcp(addr: SocketAddr) -> io::Result<TcpStream> {
    let s = TcpStream::connect(addr)?;
    s.set_nodelay(true)?;
    Ok(s)
}

// ---------------------------------------------------------------------------
// Server (child)
// ---------------------------------------------------------------------------

/// A listening socket, as the generic server loops need it.
trait Listen {
    /// An accepted connection.
    type Stream: Read + Write;
    /// Accepts one connection (socket options already set).
    fn accept_stream(&self) -> io::Result<Self::Stream>;
}

impl Listen for UnixListener {
    type Stream = UnixStream;
    fn accept_stream(&self) -> io::Result<UnixStream> {
        self.accept().map(|(s, _)| s)
    }
}

impl Listen for TcpListener {
    type Stream = TcpStream;
    fn accept_stream(&self) -> io::Result<TcpStream> {
        let (s, _) = self.accept()?;
        s.set_nodelay(true)?;
        Ok(s)
    }
}

impl Listen for XioListener {
    type Stream = XioStream;
    fn accept_stream(&self) -> io::Result<XioStream> {
        self.accept().map(|(s, _)| s)
    }
}

/// A fresh X-IO address for one server (unique within the run).
fn fresh_xio_addr() -> SocketAddr {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(1);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    SocketAddr::from(([10, 77, (n >> 8) as u8, n as u8], 80))
}

/// `prefix/ip:port` into its parts.
fn split_xio(endpoint: &str) -> Result<(&str, SocketAddr)> {
    let (p, a) = endpoint
        .split_once('/')
        .ok_or_else(|| anyhow!("bad X-IO endpoint {endpoint:?} (want prefix/ip:port)"))?;
    Ok((
        p,
        a.parse()
            .with_context(|| format!("bad address in {endpoint:?}"))?,
    ))
}

/// Section a over X-IO's zero-copy calls: sends a pool buffer of `size`
/// bytes and takes the reply as pool buffers. The payload is written only
/// for the checked round trips (the first and last), as an application
/// that builds its message in the buffer would; nothing is ever copied.
fn zc_rtt_client(s: &XioStream, size: usize, warmup: usize, iters: usize) -> Result<Outcome> {
    let tx = pattern(size);
    let tx_last = other_pattern(size);
    let one = |msg: Option<&[u8]>| -> Result<()> {
        let mut b = s.alloc(size)?;
        if let Some(m) = msg {
            b.copy_from_slice(m);
        }
        s.send_buf(b).map_err(|(e, _)| e).context("send_buf")?;
        let mut got = 0;
        let mut ok = true;
        while got < size {
            let r = s.recv_buf()?.ok_or_else(|| anyhow!("server closed"))?;
            if let Some(m) = msg {
                ok &= r[..] == m[got..got + r.len()];
            }
            got += r.len();
        }
        ensure!(ok, "the reply does not echo the request");
        Ok(())
    };
    one(Some(&tx))?;
    for _ in 0..warmup {
        one(None)?;
    }
    let mut samples = Vec::with_capacity(iters);
    let t_all = Instant::now();
    for i in 0..iters {
        let msg = match i {
            0 => Some(&tx[..]),
            _ if i + 1 == iters => Some(&tx_last[..]),
            _ => None,
        };
        let t0 = Instant::now();
        one(msg)?;
        samples.push(elapsed_ns(t0));
    }
    Ok(Outcome {
        samples,
        ops: iters as u64,
        wall: t_all.elapsed(),
        ..Default::default()
    })
}

/// Section a's server over X-IO's zero-copy calls: every received buffer
/// goes back as it is (`into_mut` + `send_buf`), until end of stream.
fn zc_echo_server(l: &XioListener) -> Result<()> {
    let (s, _) = l.accept().context("accept")?;
    while let Some(b) = s.recv_buf()? {
        s.send_buf(b.into_mut())
            .map_err(|(e, _)| e)
            .context("send_buf")?;
    }
    Ok(())
}

/// Runs in the child (`serve-sock`): serves one session of `section`, then
/// returns. Pinning is done by the caller first.
///
/// `endpoint`: the socket path for `uds` (removed on exit); `ip:port` for
/// `tcp` (with port 0 the server prints `PORT <n>` on stdout). `conns` is
/// the number of connections of section c.
pub fn serve(
    t: Transport,
    endpoint: &str,
    section: Section,
    size: usize,
    conns: usize,
) -> Result<()> {
    ensure!(size > 0, "message size must be at least 1 byte");
    match t {
        Transport::Uds => {
            let path = Path::new(endpoint);
            let l = listen_uds(path)?;
            let _cleanup = RemoveOnDrop(path.to_path_buf());
            match section {
                Section::C => epoll_server(&l, conns),
                _ => serve_blocking(&l, section, size, conns),
            }
        }
        Transport::Tcp => {
            let l = listen_tcp(endpoint)?;
            match section {
                Section::C => epoll_server(&l, conns),
                _ => serve_blocking(&l, section, size, conns),
            }
        }
        Transport::Xio | Transport::XioNoBatch | Transport::XioBatchWrites | Transport::XioZc => {
            let (prefix, addr) = split_xio(endpoint)?;
            let net = Net::builder(prefix)
                .batch_wakeup(t != Transport::XioNoBatch)
                .attach()
                .context("attaching the server")?;
            let l = net.listen(addr)?;
            match section {
                Section::C => xio_loop_server(&net, &l, conns, t == Transport::XioBatchWrites),
                Section::A if t == Transport::XioZc => zc_echo_server(&l),
                _ => serve_blocking(&l, section, size, conns),
            }
        }
    }
    .with_context(|| {
        format!(
            "{} server (section {}, endpoint {endpoint:?}, size {size})",
            t.label(),
            value_name(&section)
        )
    })
}

fn listen_uds(path: &Path) -> Result<UnixListener> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing stale {path:?}")),
    }
    let fd = rustix::net::socket_with(
        AddressFamily::UNIX,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .context("socket(AF_UNIX)")?;
    let addr = SocketAddrUnix::new(path).with_context(|| format!("socket path {path:?}"))?;
    rustix::net::bind(&fd, &addr).with_context(|| format!("binding {path:?}"))?;
    rustix::net::listen(&fd, BACKLOG).context("listen")?;
    Ok(UnixListener::from(fd))
}

/// Binds and listens on `endpoint`; prints `PORT <n>` (flushed) if it asked
/// for port 0.
fn listen_tcp(endpoint: &str) -> Result<TcpListener> {
    let addr: SocketAddr = endpoint
        .parse()
        .with_context(|| format!("bad TCP endpoint {endpoint:?} (want ip:port)"))?;
    let family = match addr {
        SocketAddr::V4(_) => AddressFamily::INET,
        SocketAddr::V6(_) => AddressFamily::INET6,
    };
    let fd = rustix::net::socket_with(family, SocketType::STREAM, SocketFlags::CLOEXEC, None)
        .context("socket(AF_INET)")?;
    rustix::net::sockopt::set_socket_reuseaddr(&fd, true).context("SO_REUSEADDR")?;
    rustix::net::bind(&fd, &addr).with_context(|| format!("binding {addr}"))?;
    rustix::net::listen(&fd, BACKLOG).context("listen")?;
    let l = TcpListener::from(fd);
    if addr.port() == 0 {
        let port = l.local_addr()?.port();
        let mut out = io::stdout().lock();
        writeln!(out, "PORT {port}")?;
        out.flush()?;
    }
    Ok(l)
}

/// Server of sections a and b, for any transport with blocking streams.
fn serve_blocking<L: Listen>(l: &L, section: Section, size: usize, conns: usize) -> Result<()>
where
    L::Stream: Send + 'static,
{
    match section {
        Section::A => {
            let mut s = l.accept_stream().context("accept")?;
            echo_loop(&mut s, size)?;
            Ok(())
        }
        Section::B => short_server(l, size),
        Section::C => bail!("section c needs an event loop"),
        Section::D => threads_server(l, conns),
    }
}

/// Section d's server: a thread per accepted connection, echoing until the
/// client closes.
fn threads_server<L: Listen>(l: &L, n: usize) -> Result<()>
where
    L::Stream: Send + 'static,
{
    let mut hs = Vec::with_capacity(n);
    for _ in 0..n {
        let s = l.accept_stream().context("accept")?;
        hs.push(std::thread::spawn(move || echo_loop(s, MSG)));
    }
    for h in hs {
        h.join().map_err(|_| anyhow!("server thread panicked"))??;
    }
    Ok(())
}

/// Section d's client: `job.conns` connections, each driven by its own
/// thread doing blocking [`MSG`]-byte request-response until the measured
/// window ends.
fn threads_client<S: Read + Write + Send>(
    mut connect: impl FnMut() -> io::Result<S>,
    child: Option<&mut ServerChild>,
    job: &Job,
) -> Result<Outcome> {
    let first = retry_connect(&mut connect, child, READY_TIMEOUT)?;
    let mut conns = vec![first];
    for _ in 1..job.conns {
        conns.push(connect().context("connecting")?);
    }
    let start = Instant::now();
    let from = start + job.warm;
    let to = from + job.measure;
    let per_thread: Vec<Result<Vec<u64>>> = std::thread::scope(|sc| {
        let hs: Vec<_> = conns
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                sc.spawn(move || {
                    let mut tx = [0u8; MSG];
                    tx[..8].copy_from_slice(&(i as u64).to_le_bytes());
                    let mut rx = [0u8; MSG];
                    let mut lat = Vec::new();
                    loop {
                        let t0 = Instant::now();
                        if t0 >= to {
                            break;
                        }
                        round_trip(&mut s, &tx, &mut rx)?;
                        ensure!(rx == tx, "wrong reply on connection {i}");
                        if t0 >= from {
                            lat.push(elapsed_ns(t0));
                        }
                    }
                    Ok(lat)
                })
            })
            .collect();
        hs.into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow!("client thread panicked")))
            })
            .collect()
    });
    let mut out = Outcome::default();
    for r in per_thread {
        let lat = r?;
        out.ops += lat.len() as u64;
        out.samples.extend(lat);
    }
    out.wall = job.measure;
    Ok(out)
}

/// Section b: accepts connections one at a time, echoes one `size`-byte
/// message on each and closes it. A connection that closes without sending
/// anything ends the session.
fn short_server<L: Listen>(l: &L, size: usize) -> Result<()> {
    let mut buf = vec![0u8; size];
    loop {
        let mut s = l.accept_stream().context("accept")?;
        let n = loop {
            match s.read(&mut buf) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e).context("reading request"),
            }
        };
        if n == 0 {
            return Ok(());
        }
        s.read_exact(&mut buf[n..]).context("reading request")?;
        s.write_all(&buf).context("writing reply")?;
        // Dropping `s` closes the connection.
    }
}

// ---------------------------------------------------------------------------
// Blocking clients (sections a and b), generic over the stream type
// ---------------------------------------------------------------------------

/// Client of sections a and b for any transport with blocking streams.
fn blocking_client<S: Read + Write + Send>(
    mut connect: impl FnMut() -> io::Result<S>,
    child: Option<&mut ServerChild>,
    job: &Job,
) -> Result<Outcome> {
    match job.section {
        Section::A => {
            let mut s = retry_connect(&mut connect, child, READY_TIMEOUT)?;
            rtt_client(&mut s, job.size, job.warmup, job.iters)
        }
        Section::B => short_client(connect, child, job.warmup, job.iters),
        Section::C => bail!("section c needs an event loop"),
        Section::D => threads_client(connect, child, job),
    }
}

/// `pattern` with every byte inverted: a different message of the same size,
/// so a reply that repeats an earlier message is caught.
fn other_pattern(size: usize) -> Vec<u8> {
    pattern(size).into_iter().map(|b| !b).collect()
}

#[inline]
fn round_trip<S: Read + Write>(s: &mut S, tx: &[u8], rx: &mut [u8]) -> Result<()> {
    s.write_all(tx).context("writing request")?;
    s.read_exact(rx).context("reading reply")?;
    Ok(())
}

/// Section a: one verified round trip, `warmup` untimed ones, then `iters`
/// timed ones. The first and the last timed replies are checked too (the
/// last with a different message); the receive buffer is cleared before
/// them, outside the timed region.
fn rtt_client<S: Read + Write>(
    s: &mut S,
    size: usize,
    warmup: usize,
    iters: usize,
) -> Result<Outcome> {
    let tx = pattern(size);
    let tx_last = other_pattern(size);
    let mut rx = vec![0u8; size];
    round_trip(s, &tx, &mut rx)?;
    ensure!(rx == tx, "the reply does not echo the request");
    for _ in 0..warmup {
        round_trip(s, &tx, &mut rx)?;
    }
    let mut samples = Vec::with_capacity(iters);
    let t_all = Instant::now();
    for i in 0..iters {
        let last = i + 1 == iters;
        let check = i == 0 || last;
        let msg = if last { &tx_last } else { &tx };
        if check {
            rx.fill(0);
        }
        let t0 = Instant::now();
        round_trip(s, msg, &mut rx)?;
        samples.push(elapsed_ns(t0));
        ensure!(!check || rx == *msg, "reply {i} does not echo the request");
    }
    let wall = t_all.elapsed();
    Ok(Outcome {
        samples,
        ops: iters as u64,
        wall,
        ..Default::default()
    })
}

/// Section b: `warmup` untimed and `iters` timed connections, each
/// connect + one [`MSG`]-byte exchange + close. The first (readiness)
/// connection and the last timed one are checked. Ends the session with a
/// connection that sends nothing.
fn short_client<S: Read + Write>(
    mut connect: impl FnMut() -> io::Result<S>,
    child: Option<&mut ServerChild>,
    warmup: usize,
    iters: usize,
) -> Result<Outcome> {
    let tx = pattern(MSG);
    let tx_last = other_pattern(MSG);
    let mut rx = [0u8; MSG];
    let mut s = retry_connect(&mut connect, child, READY_TIMEOUT)?;
    round_trip(&mut s, &tx, &mut rx)?;
    drop(s);
    ensure!(rx[..] == tx[..], "the reply does not echo the request");
    for _ in 0..warmup {
        let mut s = connect().context("connect")?;
        round_trip(&mut s, &tx, &mut rx)?;
    }
    let mut samples = Vec::with_capacity(iters);
    let mut phases: [Vec<u64>; 3] = std::array::from_fn(|_| Vec::with_capacity(iters));
    let t_all = Instant::now();
    for i in 0..iters {
        let msg = if i + 1 == iters { &tx_last } else { &tx };
        let t0 = Instant::now();
        let mut s = connect().context("connect")?;
        let t1 = Instant::now();
        round_trip(&mut s, msg, &mut rx)?;
        let t2 = Instant::now();
        drop(s);
        let t3 = Instant::now();
        samples.push(ns_between(t0, t3));
        for (p, (a, b)) in phases.iter_mut().zip([(t0, t1), (t1, t2), (t2, t3)]) {
            p.push(ns_between(a, b));
        }
    }
    let wall = t_all.elapsed();
    ensure!(
        rx[..] == tx_last[..],
        "the last reply does not echo the request"
    );
    drop(connect().context("connect (end of session)")?);
    Ok(Outcome {
        samples,
        ops: iters as u64,
        wall,
        phases,
    })
}

/// One section-(a) run (round trips over one persistent connection) of
/// `t` with the server on `sc` and the client on `cc`: the samples in ns.
/// X-IO transports use the pool named by `XIO_BENCH_PREFIX`. For
/// `xio-bench backends`.
#[cfg(feature = "dpdk")]
pub(crate) fn rtt_samples(
    t: Transport,
    size: usize,
    warmup: usize,
    iters: usize,
    cc: usize,
    sc: usize,
) -> Result<Vec<u64>> {
    let job = Job {
        section: Section::A,
        size,
        conns: 1,
        warmup,
        iters,
        warm: Duration::ZERO,
        measure: Duration::ZERO,
        client_cpu: cc,
        server_cpu: sc,
    };
    Ok(run_pair(t, &job)?.samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shares_add_up() {
        for (n, r) in [(10, 3), (3, 4), (20_000, 4)] {
            assert_eq!((0..r).map(|i| share(n, r, i)).sum::<usize>(), n);
        }
    }

    fn job(section: Section, size: usize, conns: usize) -> Job {
        Job {
            section,
            size,
            conns,
            warmup: 5,
            iters: 50,
            warm: Duration::from_millis(20),
            // Section c counts what lands in this window: long enough that
            // a loaded CI machine still lets some requests through.
            measure: Duration::from_secs(2),
            client_cpu: 0,
            server_cpu: 0,
        }
    }

    /// Runs `serve`'s loop for `j` on a fresh Unix socket in a thread and
    /// the client on this one.
    fn over_uds(j: &Job) -> Outcome {
        let path = temp_socket_path();
        let l = listen_uds(&path).unwrap();
        let _rm = RemoveOnDrop(path.clone());
        let (section, size, conns) = (j.section, j.size, j.conns);
        let server = std::thread::spawn(move || match section {
            Section::C => epoll_server(&l, conns),
            _ => serve_blocking(&l, section, size, conns),
        });
        let connect = || UnixStream::connect(&path);
        let o = match j.section {
            Section::C => epoll_client(connect, None, j),
            _ => blocking_client(connect, None, j),
        }
        .unwrap();
        server.join().unwrap().unwrap();
        o
    }

    #[test]
    fn sections_over_uds() {
        let o = over_uds(&job(Section::A, 5000, 1));
        assert_eq!((o.samples.len(), o.ops), (50, 50));
        let o = over_uds(&job(Section::B, MSG, 1));
        assert_eq!((o.samples.len(), o.ops), (50, 50));
        let o = over_uds(&job(Section::C, MSG, 8));
        assert!(o.ops > 0);
        assert_eq!(o.samples.len() as u64, o.ops);
    }

    #[test]
    fn section_c_over_tcp() {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        let server = std::thread::spawn(move || epoll_server(&l, 4));
        let o = epoll_client(|| connect_tcp(addr), None, &job(Section::C, MSG, 4)).unwrap();
        server.join().unwrap().unwrap();
        assert!(o.ops > 0);
    }

    #[test]
    fn replayed_reply_is_caught() {
        // A broken "echo" that always returns the first message it got.
        let (mut a, mut b) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || {
            let mut first = vec![0u8; 100];
            b.read_exact(&mut first).unwrap();
            let mut buf = vec![0u8; 100];
            b.write_all(&first).unwrap();
            while b.read_exact(&mut buf).is_ok() {
                if b.write_all(&first).is_err() {
                    break;
                }
            }
        });
        let e = rtt_client(&mut a, 100, 3, 10).err().expect("must fail");
        assert!(format!("{e:#}").contains("reply 9"), "{e:#}");
        drop(a);
        server.join().unwrap();
    }

    #[test]
    fn names() {
        assert_eq!(value_name(&Section::A), "a");
        assert_eq!(value_name(&Placement::OneCore), "one-core");
        assert_eq!(value_name(&Transport::Uds), "uds");
    }
}

//! `xio-bench capi`: the C ABI's cost. The C packet generator against the
//! C echo function (`crates/xio-capi/examples/pktgen.c`, `l2fwd_echo.c`,
//! built here with the system compiler against libxio), next to the same
//! loops written in Rust on `xio_core::stack`, and the two mixed, in the
//! same run, client and server pinned to separate CPUs.
//!
//! Every round trip: allocate a pool buffer, write two 6-byte addresses
//! and a sequence number, send, receive the echo (the function swapped the
//! addresses in place, without a copy), check it, free it.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Instant;

use anyhow::{bail, ensure, Context, Result};
use clap::Args;
use xio_core::manager::Manager;
use xio_core::stack::{Error, Stack};
use xio_core::PoolConfig;

use crate::compare::{fmt_size, parse_size, RunDir};
use crate::pin::{online_cpus, pin_to_cpu};
use crate::xio::Mode;

/// Options of `xio-bench capi`.
#[derive(Args, Debug)]
pub struct CapiArgs {
    /// Fewer round trips (a smoke run).
    #[arg(long)]
    quick: bool,
    /// Timed round trips per run.
    #[arg(long)]
    iters: Option<usize>,
    /// Runs per pair, round-robin over the pairs (the median is reported).
    #[arg(long)]
    rounds: Option<usize>,
    /// Payload sizes.
    #[arg(long, value_delimiter = ',', value_parser = parse_size)]
    sizes: Vec<usize>,
    /// Waiting modes (adaptive, busy-poll).
    #[arg(long, value_delimiter = ',', value_enum)]
    modes: Vec<Mode>,
    /// CPU of the packet generator.
    #[arg(long, default_value_t = 0)]
    client_cpu: usize,
    /// CPU of the echo function.
    #[arg(long, default_value_t = 1)]
    server_cpu: usize,
}

#[derive(Clone, Copy, PartialEq)]
enum Lang {
    C,
    Rust,
}

impl Lang {
    fn name(self) -> &'static str {
        match self {
            Lang::C => "C",
            Lang::Rust => "Rust",
        }
    }
}

/// One run's figures, in ns.
#[derive(Clone, Copy, Default)]
struct Rtt {
    p50: f64,
    p99: f64,
    mean: f64,
}

/// The C programs, built once for the run.
struct CBins {
    pktgen: PathBuf,
    l2fwd: PathBuf,
}

fn build_c(dir: &Path) -> Result<CBins> {
    let exe = std::env::current_exe()?;
    let lib = exe.parent().context("exe dir")?.to_path_buf();
    // Build libxio next to this binary (a no-op when it is up to date):
    // a stale library may speak an older segment layout, and the C side
    // would then refuse to attach.
    let target = lib.parent().context("target dir")?;
    let mut cargo = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cargo
        .args([
            "build",
            "--quiet",
            "-p",
            "xio-capi",
            "--lib",
            "--target-dir",
        ])
        .arg(target)
        .current_dir(env!("CARGO_MANIFEST_DIR"));
    if lib.file_name().is_some_and(|n| n == "release") {
        cargo.arg("--release");
    }
    let st = cargo.status().context("running cargo to build libxio")?;
    ensure!(st.success(), "building libxio failed ({st})");
    ensure!(
        lib.join("libxio.so").exists(),
        "no libxio.so in {} after building it",
        lib.display()
    );
    let capi = Path::new(env!("CARGO_MANIFEST_DIR")).join("../crates/xio-capi");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let mut out = Vec::new();
    for name in ["pktgen", "l2fwd_echo"] {
        let bin = dir.join(name);
        let st = Command::new(&cc)
            .args(["-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-o"])
            .arg(&bin)
            .arg(capi.join(format!("examples/{name}.c")))
            .arg(format!("-I{}", capi.join("include").display()))
            .arg(format!("-L{}", lib.display()))
            .arg(format!("-Wl,-rpath,{}", lib.display()))
            .arg("-lxio")
            .status()
            .with_context(|| format!("running {cc}"))?;
        if !st.success() {
            bail!("compiling {name}.c failed");
        }
        out.push(bin);
    }
    let l2fwd = out.pop().expect("two");
    let pktgen = out.pop().expect("two");
    Ok(CBins { pktgen, l2fwd })
}

fn next_addr() -> SocketAddr {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    SocketAddr::from(([10, 78, (n / 250) as u8, (n % 250) as u8 + 1], 9))
}

const SRC: [u8; 6] = [2, 0, 0, 0, 0, 1];
const DST: [u8; 6] = [2, 0, 0, 0, 0, 2];
const TAG_STOP: u32 = 1;

/// The Rust echo function: what `l2fwd_echo.c` does, on `Stack`. Runs in
/// the hidden `serve-l2fwd` child.
pub fn serve_l2fwd(prefix: &str, addr: SocketAddr, mode: Mode) -> Result<()> {
    let mut s = Stack::builder(prefix)
        .wait_mode(mode.wait_mode())
        .attach()
        .context("attach")?;
    s.bind(addr).context("bind")?;
    println!("XIO:ready");
    loop {
        let m = match s.recv() {
            Ok(m) => m,
            Err(Error::Reset(_)) => continue,
            Err(e) => return Err(e).context("recv"),
        };
        if m.tag == TAG_STOP {
            return Ok(());
        }
        let from = m.from;
        let mut b = m.buf.into_mut();
        if b.len() >= 12 {
            let mut mac = [0u8; 6];
            mac.copy_from_slice(&b[..6]);
            b.copy_within(6..12, 0);
            b[6..12].copy_from_slice(&mac);
        }
        match s.send(from, b) {
            Ok(()) | Err(Error::Reset(_)) => {}
            Err(e) => return Err(e).context("send"),
        }
    }
}

/// The Rust packet generator: what `pktgen.c` does, on `Stack`.
fn rust_pktgen(
    prefix: &str,
    addr: SocketAddr,
    mode: Mode,
    size: usize,
    iters: usize,
) -> Result<Rtt> {
    let mut s = Stack::builder(prefix)
        .wait_mode(mode.wait_mode())
        .attach()?;
    let peer = s.connect(addr)?;
    let warmup = (iters / 10).min(1000);
    let mut rtt = Vec::with_capacity(iters);
    for i in 0..iters + warmup {
        let t0 = Instant::now();
        let mut b = s.alloc(size)?;
        b.set_len(size);
        b[..6].copy_from_slice(&DST);
        b[6..12].copy_from_slice(&SRC);
        b[12..20].copy_from_slice(&(i as u64).to_ne_bytes());
        s.send(peer, b)?;
        let m = s.recv()?;
        let dt = t0.elapsed();
        let d = &m.buf;
        if m.from != peer
            || d.len() != size
            || d[..6] != SRC
            || d[6..12] != DST
            || d[12..20] != (i as u64).to_ne_bytes()
        {
            bail!("bad echo {i}");
        }
        drop(m);
        if i >= warmup {
            rtt.push(dt.as_nanos() as u64);
        }
    }
    s.send_tagged(peer, TAG_STOP, s.alloc(1)?)?;
    Ok(summarize(&mut rtt))
}

fn summarize(v: &mut [u64]) -> Rtt {
    v.sort_unstable();
    let n = v.len();
    Rtt {
        p50: v[n / 2] as f64,
        p99: v[n * 99 / 100] as f64,
        mean: v.iter().sum::<u64>() as f64 / n as f64,
    }
}

fn field(line: &str, key: &str) -> Result<f64> {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .with_context(|| format!("no {key} in {line:?}"))?
        .parse()
        .context("a number")
}

/// Starts the echo function on the server CPU; returns once it is bound.
fn spawn_server(
    lang: Lang,
    bins: &CBins,
    prefix: &str,
    addr: SocketAddr,
    mode: Mode,
    cpu: usize,
) -> Result<Child> {
    let mut cmd = match lang {
        Lang::C => {
            let mut c = Command::new("taskset");
            c.arg("-c")
                .arg(cpu.to_string())
                .arg(&bins.l2fwd)
                .arg(prefix)
                .arg(addr.to_string());
            if mode == Mode::BusyPoll {
                c.arg("--busy-poll");
            }
            c
        }
        Lang::Rust => {
            let mut c = Command::new(std::env::current_exe()?);
            c.args(["serve-l2fwd", "--prefix", prefix, "--addr"])
                .arg(addr.to_string())
                .arg("--mode")
                .arg(mode.name())
                .arg("--cpu")
                .arg(cpu.to_string());
            c
        }
    };
    let mut child = cmd
        .stdout(Stdio::piped())
        .stdin(Stdio::null())
        .spawn()
        .context("spawning the echo function")?;
    let mut out = std::io::BufReader::new(child.stdout.take().expect("piped"));
    let mut line = String::new();
    std::io::BufRead::read_line(&mut out, &mut line)?;
    if !line.starts_with("XIO:ready") {
        bail!("echo function did not start: {line:?}");
    }
    // Keep reading what it says later (its final count), so it never
    // writes to a closed pipe.
    std::thread::spawn(move || std::io::copy(&mut out, &mut std::io::sink()));
    Ok(child)
}

#[allow(clippy::too_many_arguments)]
fn run_pair(
    client: Lang,
    server: Lang,
    bins: &CBins,
    prefix: &str,
    mode: Mode,
    size: usize,
    iters: usize,
    a: &CapiArgs,
) -> Result<Rtt> {
    let addr = next_addr();
    let mut srv = spawn_server(server, bins, prefix, addr, mode, a.server_cpu)?;
    let r = match client {
        Lang::Rust => rust_pktgen(prefix, addr, mode, size, iters),
        Lang::C => {
            let mut c = Command::new("taskset");
            c.arg("-c")
                .arg(a.client_cpu.to_string())
                .arg(&bins.pktgen)
                .arg(prefix)
                .arg(addr.to_string())
                .arg(iters.to_string())
                .arg(size.to_string())
                .arg("--stop");
            if mode == Mode::BusyPoll {
                c.arg("--busy-poll");
            }
            let out = c.stderr(Stdio::inherit()).output()?;
            let text = String::from_utf8_lossy(&out.stdout);
            let line = text
                .lines()
                .find(|l| l.starts_with("XIO:rtt"))
                .with_context(|| format!("pktgen said {text:?} ({:?})", out.status))?;
            Ok(Rtt {
                p50: field(line, "p50_ns")?,
                p99: field(line, "p99_ns")?,
                mean: field(line, "mean_ns")?,
            })
        }
    };
    let st = srv.wait()?;
    if r.is_ok() && !st.success() {
        bail!("echo function failed: {st:?}");
    }
    r
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Runs the benchmark; markdown on stdout.
pub fn run(a: &CapiArgs) -> Result<()> {
    let iters = a.iters.unwrap_or(if a.quick { 5_000 } else { 50_000 });
    let rounds = a.rounds.unwrap_or(if a.quick { 1 } else { 3 }).max(1);
    let sizes = if a.sizes.is_empty() {
        vec![64, 1500]
    } else {
        a.sizes.clone()
    };
    let modes = if a.modes.is_empty() {
        vec![Mode::Adaptive, Mode::BusyPoll]
    } else {
        a.modes.clone()
    };
    if modes.contains(&Mode::Blocking) {
        bail!("capi: the C programs wait adaptively or busy-poll (--modes adaptive,busy-poll)");
    }
    let cpus = online_cpus();
    if a.client_cpu >= cpus || a.server_cpu >= cpus {
        bail!("only {cpus} CPUs are online");
    }
    let run_dir = RunDir::create()?;
    std::env::set_var("XIO_RUN_DIR", &run_dir.0);
    let bins = build_c(&run_dir.0)?;
    let prefix = format!("xio-bench-capi-{}", std::process::id());
    let _mgr = Manager::builder(&prefix)
        .pool(PoolConfig::default())
        .spawn()
        .context("starting the embedded manager")?;
    pin_to_cpu(a.client_cpu)?;

    let pairs = [
        (Lang::Rust, Lang::Rust),
        (Lang::C, Lang::C),
        (Lang::C, Lang::Rust),
        (Lang::Rust, Lang::C),
    ];
    println!("## C ABI: zero-copy round trip, C and Rust\n");
    println!(
        "{iters} timed round trips per run (after {} untimed), {rounds} runs per pair \
         round-robin, median of the runs' figures. Packet generator on CPU {}, echo \
         function on CPU {}. Times in µs.\n",
        (iters / 10).min(1000),
        a.client_cpu,
        a.server_cpu
    );
    for &mode in &modes {
        for &size in &sizes {
            let mut runs: Vec<Vec<Rtt>> = vec![Vec::new(); pairs.len()];
            for _ in 0..rounds {
                for (k, &(c, s)) in pairs.iter().enumerate() {
                    let r = run_pair(c, s, &bins, &prefix, mode, size, iters, a)
                        .with_context(|| format!("{} -> {}", c.name(), s.name()))?;
                    runs[k].push(r);
                }
            }
            println!("### {} mode, {}\n", mode.label(), fmt_size(size));
            println!("| generator → echo function | p50 | p99 | mean | p50 vs Rust → Rust |");
            println!("|---|---|---|---|---|");
            let base = median(runs[0].iter().map(|r| r.p50).collect());
            for (k, &(c, s)) in pairs.iter().enumerate() {
                let p50 = median(runs[k].iter().map(|r| r.p50).collect());
                let p99 = median(runs[k].iter().map(|r| r.p99).collect());
                let mean = median(runs[k].iter().map(|r| r.mean).collect());
                println!(
                    "| {} → {} | {:.2} | {:.2} | {:.2} | {:+.0} ns |",
                    c.name(),
                    s.name(),
                    p50 / 1e3,
                    p99 / 1e3,
                    mean / 1e3,
                    p50 - base
                );
            }
            println!();
        }
    }
    Ok(())
}

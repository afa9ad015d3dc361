//! `xio-bench compare`: X-IO against the kernel and shared-memory baselines,
//! printed as markdown tables on stdout (progress goes to stderr).
//!
//! Sections:
//! 1. round trip with client and server on separate cores, every size: the
//!    `spin-ring` floor, `spin-ring-copy`, X-IO in each waiting mode, Unix
//!    socket, TCP;
//! 2. X-IO spin-policy counters and the server's CPU use while idle;
//! 3. round trip with both processes on one core (X-IO Adaptive/Blocking,
//!    Unix socket, TCP; busy-poll variants only with a handful of
//!    iterations, since every hop then waits for a scheduler slice);
//! 4. one-way throughput (64-byte messages, bursts of 32);
//! 5. the targets, checked against the numbers above.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use xio_core::prelude::*;

use crate::baselines::{self, Baseline};
use crate::pin::online_cpus;
use crate::stats::{fmt_us, summarize, Summary};
use crate::xio::{self, IdleCpu, Mode, PairOpts, SpinCounts};

/// Options of `xio-bench compare`.
#[derive(Clone, Debug, clap::Args)]
pub struct CompareArgs {
    /// Fewer iterations (warmup 200, 3000 timed round trips, 1M one-way
    /// messages) for a quick look.
    #[arg(long)]
    pub quick: bool,
    /// Message sizes for the separate-cores table (e.g. `64,1K,4KiB,1M`).
    /// Default: 64 B, 1 KiB, 4 KiB, 64 KiB, 1 MiB.
    #[arg(long, value_delimiter = ',', num_args = 1.., value_parser = parse_size)]
    pub sizes: Vec<usize>,
    /// X-IO waiting modes to run. Default: all three.
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1..)]
    pub modes: Vec<Mode>,
    /// Timed round trips per measurement (default 20000; 3000 with --quick).
    #[arg(long)]
    pub iters: Option<usize>,
    /// Untimed round trips before each measurement (default 2000; 200 with
    /// --quick).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Messages in each one-way throughput run (default 5000000; 1000000
    /// with --quick).
    #[arg(long)]
    pub oneway_msgs: Option<u64>,
    /// CPU of the client (the parent).
    #[arg(long, default_value_t = 0)]
    pub client_cpu: usize,
    /// CPU of the server (the child) in the separate-cores runs.
    #[arg(long, default_value_t = 1)]
    pub server_cpu: usize,
    /// Sections to run (default: all): `apart` (round trip on separate
    /// cores, with the spin-policy/idle table), `one-core`, `oneway`.
    #[arg(long, value_enum, value_delimiter = ',', num_args = 1..)]
    pub sections: Vec<Section>,
    /// How long the X-IO server is left idle for the idle-CPU check, in ms
    /// (0 skips the check).
    #[arg(long, default_value_t = 1000)]
    pub idle_ms: u64,
}

/// A part of the comparison.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Section {
    /// Round trip, client and server on separate cores.
    Apart,
    /// Round trip, both on one core.
    OneCore,
    /// One-way throughput.
    Oneway,
}

const KIB: usize = 1 << 10;
const MIB: usize = 1 << 20;
const DEFAULT_SIZES: [usize; 5] = [64, KIB, 4 * KIB, 64 * KIB, MIB];
const ONE_CORE_SIZES: [usize; 2] = [64, 64 * KIB];
/// Iterations for busy-polling on a single core (each hop costs a slice).
const ONE_CORE_SPIN_ITERS: usize = 20;
const ONE_CORE_SPIN_WARMUP: usize = 2;
/// Largest message `spin-ring-copy` supports.
const COPY_MAX: usize = 2 * MIB;
/// Size of the one-way messages.
const ONEWAY_SIZE: usize = 64;

/// Parses `64`, `64B`, `1K`, `1KiB`, `4k`, `1M`, `1MiB`.
pub fn parse_size(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let (num, mult) = if let Some(n) = lower
        .strip_suffix("kib")
        .or_else(|| lower.strip_suffix('k'))
    {
        (n, KIB)
    } else if let Some(n) = lower
        .strip_suffix("mib")
        .or_else(|| lower.strip_suffix('m'))
    {
        (n, MIB)
    } else {
        (lower.strip_suffix('b').unwrap_or(&lower), 1)
    };
    let n: usize = num
        .trim()
        .parse()
        .map_err(|_| format!("bad size {t:?} (try 64, 1K, 4KiB, 1M)"))?;
    match n.checked_mul(mult) {
        Some(0) | None => Err(format!("bad size {t:?}")),
        Some(v) => Ok(v),
    }
}

/// `64 B`, `1 KiB`, `1 MiB`.
fn fmt_size(n: usize) -> String {
    if n >= MIB && n.is_multiple_of(MIB) {
        format!("{} MiB", n / MIB)
    } else if n >= KIB && n.is_multiple_of(KIB) {
        format!("{} KiB", n / KIB)
    } else {
        format!("{n} B")
    }
}

fn fmt_ratio(x: f64) -> String {
    format!("{x:.2}x")
}

/// Which table a measurement belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Where {
    Apart,
    OneCore,
}

/// What was measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Transport {
    Base(Baseline),
    Xio(Mode),
}

impl Transport {
    fn label(self) -> String {
        match self {
            Transport::Base(Baseline::SpinRing) => "SpinRing (floor)".into(),
            Transport::Base(Baseline::SpinRingCopy) => "SpinRingCopy".into(),
            Transport::Base(Baseline::Uds) => "Unix socket".into(),
            Transport::Base(Baseline::Tcp) => "TCP loopback".into(),
            Transport::Xio(m) => format!("X-IO {}", m.label()),
        }
    }
}

/// One table row.
struct Row {
    size: usize,
    what: Transport,
    /// Extra label text (e.g. the reduced iteration count).
    note: &'static str,
    res: Result<Summary, String>,
}

/// Details of an X-IO separate-cores run.
struct XioDetail {
    size: usize,
    mode: Mode,
    client: SpinCounts,
    server: Option<SpinCounts>,
    idle: Option<IdleCpu>,
}

#[derive(Default)]
struct Results {
    p50: HashMap<(Where, usize, Transport), f64>,
}

impl Results {
    fn get(&self, w: Where, size: usize, t: Transport) -> Option<f64> {
        self.p50.get(&(w, size, t)).copied()
    }
}

/// Runs the whole comparison.
pub fn run(a: &CompareArgs) -> Result<()> {
    let started = Instant::now();
    let warmup = a.warmup.unwrap_or(if a.quick { 200 } else { 2_000 });
    let iters = a.iters.unwrap_or(if a.quick { 3_000 } else { 20_000 });
    let oneway_n = a
        .oneway_msgs
        .unwrap_or(if a.quick { 1_000_000 } else { 5_000_000 });
    let sizes: Vec<usize> = if a.sizes.is_empty() {
        DEFAULT_SIZES.to_vec()
    } else {
        a.sizes.clone()
    };
    let modes: Vec<Mode> = if a.modes.is_empty() {
        vec![Mode::BusyPoll, Mode::Adaptive, Mode::Blocking]
    } else {
        a.modes.clone()
    };
    let want = |s: Section| a.sections.is_empty() || a.sections.contains(&s);
    let idle = (a.idle_ms > 0).then(|| Duration::from_millis(a.idle_ms));
    let cpus = online_cpus();
    let (cc, sc) = (a.client_cpu, a.server_cpu);
    if cc >= cpus || sc >= cpus {
        bail!("--client-cpu {cc} / --server-cpu {sc}: only {cpus} CPUs are online");
    }

    // A private run dir and pool; children inherit XIO_RUN_DIR.
    let run_dir = RunDir::create()?;
    std::env::set_var("XIO_RUN_DIR", &run_dir.0);
    let prefix = format!("xio-bench-{}", std::process::id());
    let mgr = Manager::builder(&prefix)
        .pool(PoolConfig::default())
        .spawn()
        .context("starting the embedded manager")?;

    println!("## X-IO vs baselines\n");
    println!(
        "Round trips: {warmup} warmup + {iters} timed per row (unless noted); \
         one-way: {oneway_n} messages of {ONEWAY_SIZE} B per run. \
         Client CPU {cc}, server CPU {sc}; {cpus} CPUs online. Times in µs.\n"
    );

    let mut res = Results::default();
    let mut details = Vec::new();

    // 1. Separate cores.
    let mut rows = Vec::new();
    if cc == sc {
        println!("(separate-cores table skipped: client and server CPU are the same)\n");
    } else if want(Section::Apart) {
        for &size in &sizes {
            let mut measure = |what: Transport, rows: &mut Vec<Row>| {
                let r = match what {
                    Transport::Base(b) => run_base(b, Some(sc), Some(cc), size, warmup, iters),
                    Transport::Xio(mode) => {
                        let o = PairOpts {
                            prefix: &prefix,
                            mode,
                            server_cpu: Some(sc),
                            client_cpu: Some(cc),
                            size,
                            warmup,
                            iters,
                            idle,
                        };
                        progress(&format!("X-IO {} {}", mode.label(), fmt_size(size)));
                        xio::run_pair(&o).map(|mut p| {
                            details.push(XioDetail {
                                size,
                                mode,
                                client: p.client_spin,
                                server: p.server_spin,
                                idle: p.idle,
                            });
                            summarize(&mut p.samples)
                        })
                    }
                };
                record(&mut res, Where::Apart, size, what, "", r, rows);
            };
            measure(Transport::Base(Baseline::SpinRing), &mut rows);
            if size <= COPY_MAX {
                measure(Transport::Base(Baseline::SpinRingCopy), &mut rows);
            }
            for &m in &modes {
                measure(Transport::Xio(m), &mut rows);
            }
            measure(Transport::Base(Baseline::Uds), &mut rows);
            measure(Transport::Base(Baseline::Tcp), &mut rows);
        }
        println!("### Round trip, separate cores (client CPU {cc}, server CPU {sc})\n");
        print_table(&rows, &res, Where::Apart);
        print_details(&details, &modes);
    }

    // 3. One core.
    let mut rows = Vec::new();
    let one_core_sizes: &[usize] = if want(Section::OneCore) {
        &ONE_CORE_SIZES
    } else {
        &[]
    };
    for &size in one_core_sizes {
        let mut one = |what: Transport, note: &'static str, w: usize, n: usize| {
            let r = match what {
                Transport::Base(b) => run_base(b, Some(cc), Some(cc), size, w, n),
                Transport::Xio(mode) => {
                    progress(&format!(
                        "X-IO {} {} one core",
                        mode.label(),
                        fmt_size(size)
                    ));
                    let o = PairOpts {
                        prefix: &prefix,
                        mode,
                        server_cpu: Some(cc),
                        client_cpu: Some(cc),
                        size,
                        warmup: w,
                        iters: n,
                        idle: None,
                    };
                    xio::run_pair(&o).map(|mut p| summarize(&mut p.samples))
                }
            };
            record(&mut res, Where::OneCore, size, what, note, r, &mut rows);
        };
        for m in [Mode::Adaptive, Mode::Blocking] {
            if modes.contains(&m) {
                one(Transport::Xio(m), "", warmup, iters);
            }
        }
        one(Transport::Base(Baseline::Uds), "", warmup, iters);
        one(Transport::Base(Baseline::Tcp), "", warmup, iters);
        const SPIN_NOTE: &str = " (20 iters only)";
        if modes.contains(&Mode::BusyPoll) {
            one(
                Transport::Xio(Mode::BusyPoll),
                SPIN_NOTE,
                ONE_CORE_SPIN_WARMUP,
                ONE_CORE_SPIN_ITERS,
            );
        }
        one(
            Transport::Base(Baseline::SpinRing),
            SPIN_NOTE,
            ONE_CORE_SPIN_WARMUP,
            ONE_CORE_SPIN_ITERS,
        );
    }
    if !rows.is_empty() {
        println!("### Round trip, one core (client and server both on CPU {cc})\n");
        print_table(&rows, &res, Where::OneCore);
        println!(
            "Busy-polling rows on one core ran only {ONE_CORE_SPIN_ITERS} iterations: a spinner \
             holds the CPU until the scheduler preempts it, so every hop costs a time slice.\n"
        );
    }

    // 4. One-way throughput.
    let mut tput: Vec<(String, Result<xio::OnewayResult, String>)> = Vec::new();
    if cc != sc && want(Section::Oneway) {
        let warm = (oneway_n / 10).min(100_000);
        for m in [Mode::BusyPoll, Mode::Adaptive] {
            if !modes.contains(&m) {
                continue;
            }
            progress(&format!("one-way X-IO {}", m.label()));
            let r = xio::run_oneway(&prefix, m, Some(sc), Some(cc), ONEWAY_SIZE, warm, oneway_n);
            tput.push((
                format!(
                    "X-IO {} (alloc + send_burst / recv_burst + free)",
                    m.label()
                ),
                r.map_err(|e| format!("{e:#}")),
            ));
        }
        progress("raw ring throughput");
        let r = xio::ring_throughput(Some(cc), Some(sc), oneway_n);
        tput.push((
            "raw `xio_core::ring` (two threads, no buffers)".into(),
            r.map_err(|e| format!("{e:#}")),
        ));
        println!(
            "### One-way throughput ({ONEWAY_SIZE} B messages, bursts of {}, CPU {cc} -> CPU {sc})\n",
            xio::BURST
        );
        println!("| path | messages | time | M desc/s |");
        println!("|---|---:|---:|---:|");
        for (label, r) in &tput {
            match r {
                Ok(o) => println!(
                    "| {label} | {} | {:.1} ms | {:.1} |",
                    o.msgs,
                    o.elapsed.as_secs_f64() * 1e3,
                    o.mdesc_per_s()
                ),
                Err(e) => println!("| {label} | failed: {} | | |", one_line(e)),
            }
        }
        println!();
    }

    // 5. Targets.
    print_targets(&res, &details, &tput, &sizes, &modes);

    drop(mgr);
    println!("Total run time: {:.0} s.", started.elapsed().as_secs_f64());
    Ok(())
}

/// One baseline measurement (with progress output).
fn run_base(
    b: Baseline,
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
    size: usize,
    warmup: usize,
    iters: usize,
) -> Result<Summary> {
    let where_ = if server_cpu == client_cpu {
        " one core"
    } else {
        ""
    };
    progress(&format!("{b} {}{where_}", fmt_size(size)));
    let mut s = baselines::run_pair(b, &["serve"], server_cpu, client_cpu, size, warmup, iters)?;
    Ok(summarize(&mut s))
}

fn progress(what: &str) {
    eprintln!("[xio-bench] {what} ...");
}

fn one_line(e: &str) -> String {
    e.replace(['\n', '|'], " ")
}

fn record(
    res: &mut Results,
    w: Where,
    size: usize,
    what: Transport,
    note: &'static str,
    r: Result<Summary>,
    rows: &mut Vec<Row>,
) {
    let r = r.map_err(|e| format!("{e:#}"));
    match &r {
        Ok(s) => {
            // Reduced-iteration rows are shown but not used for targets.
            if note.is_empty() {
                res.p50.insert((w, size, what), s.p50_ns);
            }
        }
        Err(e) => eprintln!(
            "[xio-bench] {} {}: FAILED: {e}",
            what.label(),
            fmt_size(size)
        ),
    }
    rows.push(Row {
        size,
        what,
        note,
        res: r,
    });
}

fn print_table(rows: &[Row], res: &Results, w: Where) {
    let floor = |size| res.get(Where::Apart, size, Transport::Base(Baseline::SpinRing));
    if w == Where::Apart {
        println!("| size | transport | p50 | p99 | mean | p50 vs SpinRing p50 | n |");
        println!("|---|---|---:|---:|---:|---:|---:|");
    } else {
        println!(
            "| size | transport | p50 | p99 | mean | p50 vs SpinRing p50 (separate cores) \
             | p50 vs Unix socket p50 (one core) | n |"
        );
        println!("|---|---|---:|---:|---:|---:|---:|---:|");
    }
    for r in rows {
        let name = format!("{}{}", r.what.label(), r.note);
        let size = fmt_size(r.size);
        match &r.res {
            Ok(s) => {
                let vs = |base: Option<f64>| {
                    base.filter(|&b| b > 0.0)
                        .map(|b| fmt_ratio(s.p50_ns / b))
                        .unwrap_or_else(|| "–".into())
                };
                let mut line = format!(
                    "| {size} | {name} | {} | {} | {} | {} |",
                    fmt_us(s.p50_ns),
                    fmt_us(s.p99_ns),
                    fmt_us(s.mean_ns),
                    vs(floor(r.size)),
                );
                if w == Where::OneCore {
                    let uds = res.get(Where::OneCore, r.size, Transport::Base(Baseline::Uds));
                    line.push_str(&format!(" {} |", vs(uds)));
                }
                line.push_str(&format!(" {} |", s.n));
                println!("{line}");
            }
            Err(e) => {
                let cols = if w == Where::Apart { 5 } else { 6 };
                println!(
                    "| {size} | {name} | failed: {}{}",
                    one_line(e),
                    " |".repeat(cols)
                );
            }
        }
    }
    println!();
}

fn fmt_counts(c: SpinCounts) -> String {
    let total = c.hits + c.sleeps;
    if total == 0 {
        return "0 / 0".into();
    }
    format!(
        "{} / {} ({:.1}% spin)",
        c.hits,
        c.sleeps,
        100.0 * c.hits as f64 / total as f64
    )
}

fn fmt_idle(i: &IdleCpu) -> String {
    match i.sched_ms {
        Some(ms) => format!(
            "{ms:.2} ms (stat: {:.0} ms) in {:.1} s",
            i.stat_ms,
            i.window.as_secs_f64()
        ),
        None => format!("{:.0} ms in {:.1} s", i.stat_ms, i.window.as_secs_f64()),
    }
}

/// The best idle-CPU figure available, in ms.
fn idle_ms(i: &IdleCpu) -> f64 {
    i.sched_ms.unwrap_or(i.stat_ms)
}

fn print_details(details: &[XioDetail], modes: &[Mode]) {
    if details.is_empty() {
        return;
    }
    println!("### X-IO spin policy and idle CPU (separate cores)\n");
    println!(
        "Spin hits / sleeps: waits satisfied by spinning vs. waits that slept \
         (`Stack::spin_policy()`; they stay 0 outside Adaptive mode). \
         Client: over the timed loop; server: over its whole session. \
         Idle CPU: the server's on-CPU time (`/proc/<pid>/schedstat`; \
         utime+stime from `/proc/<pid>/stat` in parentheses, 10 ms ticks) \
         while it waited in `recv` with no traffic after the run.\n"
    );
    println!("| size | mode | client spin hits / sleeps | server spin hits / sleeps | server CPU while idle |");
    println!("|---|---|---|---|---|");
    for m in modes {
        for d in details.iter().filter(|d| d.mode == *m) {
            println!(
                "| {} | {} | {} | {} | {} |",
                fmt_size(d.size),
                d.mode.label(),
                fmt_counts(d.client),
                d.server.map(fmt_counts).unwrap_or_else(|| "–".into()),
                d.idle.as_ref().map(fmt_idle).unwrap_or_else(|| "–".into()),
            );
        }
    }
    println!();
}

/// Verdict over a list of per-size checks.
fn verdict(checks: &[bool]) -> &'static str {
    if checks.is_empty() {
        "not measured"
    } else if checks.iter().all(|&c| c) {
        "**met**"
    } else if checks.iter().any(|&c| c) {
        "**partly met**"
    } else {
        "**not met**"
    }
}

fn print_targets(
    res: &Results,
    details: &[XioDetail],
    tput: &[(String, Result<xio::OnewayResult, String>)],
    sizes: &[usize],
    modes: &[Mode],
) {
    println!("### Targets\n");
    println!("| target | measured | verdict |");
    println!("|---|---|---|");
    let floor = |s| res.get(Where::Apart, s, Transport::Base(Baseline::SpinRing));
    let apart = |s, m| res.get(Where::Apart, s, Transport::Xio(m));
    let one = |s, t| res.get(Where::OneCore, s, t);

    // Busy-poll <= 2x floor.
    if modes.contains(&Mode::BusyPoll) {
        let mut parts = Vec::new();
        let mut ok = Vec::new();
        for &s in sizes {
            if let (Some(x), Some(f)) = (apart(s, Mode::BusyPoll), floor(s)) {
                parts.push(format!("{}: {}", fmt_size(s), fmt_ratio(x / f)));
                ok.push(x <= 2.0 * f);
            }
        }
        println!(
            "| BusyPoll p50 ≤ 2x SpinRing p50, separate cores, every size | {} | {} |",
            parts.join(", "),
            verdict(&ok)
        );
    }

    if modes.contains(&Mode::Adaptive) {
        let mut parts = Vec::new();
        let mut ok = Vec::new();
        for &s in sizes {
            if let Some(x) = apart(s, Mode::Adaptive) {
                parts.push(format!("{}: {} µs", fmt_size(s), fmt_us(x)));
                ok.push(x < 1_000.0);
            }
        }
        println!(
            "| Adaptive ping-pong p50 < 1 µs, separate cores | {} | {} |",
            parts.join(", "),
            verdict(&ok)
        );
        let idles: Vec<f64> = details
            .iter()
            .filter(|d| d.mode == Mode::Adaptive)
            .filter_map(|d| d.idle.as_ref().map(idle_ms))
            .collect();
        if !idles.is_empty() {
            let max = idles.iter().copied().fold(0.0, f64::max);
            let ok: Vec<bool> = idles.iter().map(|&i| i < 10.0).collect();
            println!(
                "| Adaptive: ~no CPU when idle (< 10 ms per 1 s) | max {max:.2} ms over {} idle windows | {} |",
                idles.len(),
                verdict(&ok)
            );
        }
        let mut parts = Vec::new();
        let mut ok = Vec::new();
        for s in ONE_CORE_SIZES {
            let uds = one(s, Transport::Base(Baseline::Uds));
            if let (Some(x), Some(u)) = (one(s, Transport::Xio(Mode::Adaptive)), uds) {
                parts.push(format!(
                    "{}: {} vs {} µs",
                    fmt_size(s),
                    fmt_us(x),
                    fmt_us(u)
                ));
                ok.push(x <= u);
            }
        }
        println!(
            "| One core: Adaptive p50 ≤ Unix socket p50 | {} | {} |",
            parts.join(", "),
            verdict(&ok)
        );
    }

    if modes.contains(&Mode::Blocking) {
        let mut parts = Vec::new();
        let mut ok = Vec::new();
        for &s in sizes {
            let uds = res.get(Where::Apart, s, Transport::Base(Baseline::Uds));
            if let (Some(x), Some(u)) = (apart(s, Mode::Blocking), uds) {
                parts.push(format!(
                    "{}: {} vs {} µs",
                    fmt_size(s),
                    fmt_us(x),
                    fmt_us(u)
                ));
                ok.push(x <= u);
            }
        }
        for s in ONE_CORE_SIZES {
            let uds = one(s, Transport::Base(Baseline::Uds));
            if let (Some(x), Some(u)) = (one(s, Transport::Xio(Mode::Blocking)), uds) {
                parts.push(format!(
                    "{} one core: {} vs {} µs",
                    fmt_size(s),
                    fmt_us(x),
                    fmt_us(u)
                ));
                ok.push(x <= u);
            }
        }
        println!(
            "| Blocking p50 ≤ Unix socket p50 | {} | {} |",
            parts.join(", "),
            verdict(&ok)
        );
    }

    let xio_tput: Vec<(String, f64)> = tput
        .iter()
        .filter(|(l, _)| l.starts_with("X-IO"))
        .filter_map(|(l, r)| {
            let mode = l.split_whitespace().nth(1).unwrap_or("?").to_owned();
            r.as_ref().ok().map(|o| (mode, o.mdesc_per_s()))
        })
        .collect();
    if !xio_tput.is_empty() {
        let parts: Vec<String> = xio_tput
            .iter()
            .map(|(m, r)| format!("{m}: {r:.1} M/s"))
            .collect();
        let ok: Vec<bool> = xio_tput.iter().map(|(_, r)| *r >= 50.0).collect();
        println!(
            "| One-way ≥ 50 M descriptors/s | {} | {} |",
            parts.join(", "),
            verdict(&ok)
        );
    }
    println!();
}

/// A fresh directory for the pool's control socket, removed on drop.
struct RunDir(PathBuf);

impl RunDir {
    fn create() -> Result<Self> {
        let d = std::env::temp_dir().join(format!("xio-bench-run-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).with_context(|| format!("creating {d:?}"))?;
        Ok(RunDir(d))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("64"), Ok(64));
        assert_eq!(parse_size("64B"), Ok(64));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert_eq!(parse_size("1M"), Ok(MIB));
        assert_eq!(parse_size("1mib"), Ok(MIB));
        assert!(parse_size("0").is_err());
        assert!(parse_size("x").is_err());
        assert_eq!(fmt_size(64), "64 B");
        assert_eq!(fmt_size(1024), "1 KiB");
        assert_eq!(fmt_size(MIB), "1 MiB");
        assert_eq!(fmt_size(1500), "1500 B");
    }
}

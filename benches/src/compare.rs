//! `xio-bench compare`: X-IO against the kernel and shared-memory baselines,
//! printed as markdown tables on stdout (progress goes to stderr).
//!
//! Sections (`--sections` picks some):
//! 1. round trip with client and server on separate cores, every size: the
//!    `spin-ring` floor, `spin-ring-copy`, X-IO in each waiting mode, Unix
//!    socket, TCP;
//! 2. round trip with both processes on one core (X-IO Adaptive/Blocking,
//!    Unix socket, TCP; busy-poll variants only with a handful of
//!    iterations, since every hop then waits for a scheduler slice);
//! 3. X-IO spin-policy counters and the server's CPU use while idle;
//! 4. one-way throughput (64-byte messages, bursts of 32);
//! 5. the targets, checked against the numbers above.
//!
//! Every row's iterations are split into rounds that run round-robin over
//! the transports of a table, so drift on the host (on a VM, where the
//! vCPUs happen to sit) hits all transports alike instead of one row.

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
    /// Fewer iterations (warmup 200, 3000 timed round trips in 2 rounds, 1M
    /// one-way messages) for a quick look.
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
    /// Untimed round trips before each round of a measurement (default
    /// 2000; 200 with --quick).
    #[arg(long)]
    pub warmup: Option<usize>,
    /// Messages in each one-way throughput run (default 5000000; 1000000
    /// with --quick).
    #[arg(long)]
    pub oneway_msgs: Option<u64>,
    /// Split each row's iterations into this many rounds, run round-robin
    /// over the transports (default 4; 2 with --quick).
    #[arg(long)]
    pub rounds: Option<usize>,
    /// CPU of the client (the parent).
    #[arg(long, default_value_t = 0)]
    pub client_cpu: usize,
    /// CPU of the server (the child) in the separate-cores runs.
    #[arg(long, default_value_t = 1)]
    pub server_cpu: usize,
    /// Sections to run (default: all): `apart` (round trip on separate
    /// cores, including the idle-CPU check), `one-core`, `oneway`.
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
/// Repetitions of each one-way throughput run.
const ONEWAY_RUNS: usize = 3;
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
pub(crate) fn fmt_size(n: usize) -> String {
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
            Transport::Base(Baseline::Iceoryx2) => "iceoryx2".into(),
            Transport::Base(Baseline::IoUringUds) => "io_uring Unix socket".into(),
            Transport::Base(Baseline::IoUringTcp) => "io_uring TCP".into(),
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
    one_core: bool,
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
    let rounds = a.rounds.unwrap_or(if a.quick { 2 } else { 4 }).max(1);
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

    let load = background_load(Duration::from_millis(500));
    let noise = NoiseMeter::start();
    if let Some(l) = &load {
        if l.busy_pct > 10.0 {
            eprintln!(
                "[xio-bench] WARNING: the machine is {:.0}% busy before the run; \
                 results will be noisy",
                l.busy_pct
            );
        }
    }

    println!("## X-IO vs baselines\n");
    println!(
        "Round trips: {iters} timed per row (unless noted), in {rounds} rounds run round-robin \
         over the transports of a table, each round after {warmup} untimed ones; \
         one-way: {oneway_n} messages of {ONEWAY_SIZE} B per run. \
         Client CPU {cc}, server CPU {sc}; {cpus} CPUs online. Times in µs.\n"
    );
    if let Some(l) = &load {
        println!(
            "Background load just before the run (all CPUs, 0.5 s): {:.1}% busy, {:.1}% steal.\n",
            l.busy_pct, l.steal_pct
        );
    }
    print_host_phase("before the run");

    let mut res = Results::default();
    let mut details = Vec::new();

    let ctx = Ctx {
        prefix: &prefix,
        rounds,
        warmup,
    };

    // 1. Separate cores.
    let mut rows = Vec::new();
    if cc == sc {
        println!("(separate-cores table skipped: client and server CPU are the same)\n");
    } else if want(Section::Apart) {
        for &size in &sizes {
            let mut jobs = vec![Transport::Base(Baseline::SpinRing)];
            if size <= COPY_MAX {
                jobs.push(Transport::Base(Baseline::SpinRingCopy));
            }
            jobs.extend(modes.iter().map(|&m| Transport::Xio(m)));
            if size <= crate::peers::ICEORYX2_MAX {
                jobs.push(Transport::Base(Baseline::Iceoryx2));
            }
            jobs.push(Transport::Base(Baseline::Uds));
            jobs.push(Transport::Base(Baseline::Tcp));
            jobs.push(Transport::Base(Baseline::IoUringUds));
            jobs.push(Transport::Base(Baseline::IoUringTcp));
            let place = Placement {
                client: cc,
                server: sc,
            };
            for (what, r, detail) in ctx.run_jobs(&jobs, size, place, iters, idle) {
                details.extend(detail);
                record(&mut res, Where::Apart, size, what, "", r, &mut rows);
            }
        }
        println!("### Round trip, separate cores (client CPU {cc}, server CPU {sc})\n");
        print_table(&rows, &res, Where::Apart);
    }

    // 2. One core.
    let mut rows = Vec::new();
    let one_core_sizes: &[usize] = if want(Section::OneCore) {
        &ONE_CORE_SIZES
    } else {
        &[]
    };
    let place = Placement {
        client: cc,
        server: cc,
    };
    for &size in one_core_sizes {
        let mut jobs: Vec<Transport> = [Mode::Adaptive, Mode::Blocking]
            .into_iter()
            .filter(|m| modes.contains(m))
            .map(Transport::Xio)
            .collect();
        jobs.push(Transport::Base(Baseline::Uds));
        jobs.push(Transport::Base(Baseline::Tcp));
        for (what, r, detail) in ctx.run_jobs(&jobs, size, place, iters, None) {
            details.extend(detail);
            record(&mut res, Where::OneCore, size, what, "", r, &mut rows);
        }
        // Busy-polling on one core: a handful of round trips only.
        let mut spin = vec![Transport::Base(Baseline::SpinRing)];
        if modes.contains(&Mode::BusyPoll) {
            spin.insert(0, Transport::Xio(Mode::BusyPoll));
        }
        let few = Ctx {
            prefix: &prefix,
            rounds: 1,
            warmup: ONE_CORE_SPIN_WARMUP,
        };
        for (what, r, _) in few.run_jobs(&spin, size, place, ONE_CORE_SPIN_ITERS, None) {
            record(
                &mut res,
                Where::OneCore,
                size,
                what,
                " (20 iters only)",
                r,
                &mut rows,
            );
        }
    }
    if !rows.is_empty() {
        println!("### Round trip, one core (client and server both on CPU {cc})\n");
        print_table(&rows, &res, Where::OneCore);
        println!(
            "Busy-polling rows on one core ran only {ONE_CORE_SPIN_ITERS} iterations: a spinner \
             holds the CPU until the scheduler preempts it, so every hop costs a time slice.\n"
        );
    }

    // 3. Spin policy and idle CPU.
    print_details(&details, &modes);

    // 4. One-way throughput.
    let mut tput: Vec<(String, Result<Vec<xio::OnewayResult>, String>)> = Vec::new();
    if cc != sc && want(Section::Oneway) {
        let warm = (oneway_n / 10).min(100_000);
        let repeat = |what: &str, f: &mut dyn FnMut() -> Result<xio::OnewayResult>| {
            (0..ONEWAY_RUNS)
                .map(|i| {
                    progress(&format!("one-way {what} (run {}/{ONEWAY_RUNS})", i + 1));
                    f()
                })
                .collect::<Result<Vec<_>>>()
                .map_err(|e| format!("{e:#}"))
        };
        for m in [Mode::BusyPoll, Mode::Adaptive] {
            if !modes.contains(&m) {
                continue;
            }
            let label = format!(
                "X-IO {} (send_burst_with / recv_burst_with: alloc, fill, send, check, free)",
                m.label()
            );
            let r = repeat(&label, &mut || {
                xio::run_oneway(&prefix, m, Some(sc), Some(cc), ONEWAY_SIZE, warm, oneway_n)
            });
            tput.push((label, r));
        }
        let label = "raw `xio_core::ring` (two threads, no buffers)".to_owned();
        let r = repeat(&label, &mut || {
            xio::ring_throughput(Some(cc), Some(sc), oneway_n)
        });
        tput.push((label, r));
        println!(
            "### One-way throughput ({ONEWAY_SIZE} B messages, bursts of {}, CPU {cc} -> CPU {sc})\n",
            xio::BURST
        );
        println!(
            "{ONEWAY_RUNS} runs of {oneway_n} messages each (after {warm} untimed ones); \
             timed from the first send until the receiver has consumed the last message.\n"
        );
        println!("| path | M desc/s (median) | min – max |");
        println!("|---|---:|---:|");
        for (label, r) in &tput {
            match r {
                Ok(runs) => {
                    let (med, lo, hi) = median_range(runs);
                    println!("| {label} | {med:.1} | {lo:.1} – {hi:.1} |");
                }
                Err(e) => println!("| {label} | failed: {} | |", one_line(e)),
            }
        }
        println!();
    }

    // 5. Targets.
    print_targets(&res, &details, &tput, &sizes);

    drop(mgr);
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
        if pct > 5.0 {
            eprintln!(
                "[xio-bench] WARNING: other processes used {pct:.1}% of a CPU during the run"
            );
        }
    }
    Ok(())
}

/// Where the two processes run.
#[derive(Clone, Copy, Debug)]
struct Placement {
    client: usize,
    server: usize,
}

/// What every measurement shares.
struct Ctx<'a> {
    prefix: &'a str,
    /// Each transport's iterations are split into this many rounds, run
    /// round-robin over the transports, so slow drift of the host (vCPU
    /// placement, other tenants) affects every transport alike.
    rounds: usize,
    /// Untimed round trips before each round.
    warmup: usize,
}

impl Ctx<'_> {
    /// Measures every transport in `jobs` at `size`, `iters` timed round
    /// trips each, split into rounds; a transport that fails is not retried.
    /// X-IO runs also return their spin-policy counters (summed over the
    /// rounds) and, after the last round, the idle-CPU check.
    fn run_jobs(
        &self,
        jobs: &[Transport],
        size: usize,
        place: Placement,
        iters: usize,
        idle: Option<Duration>,
    ) -> Vec<(Transport, Result<Summary>, Option<XioDetail>)> {
        let rounds = self.rounds.clamp(1, iters.max(1));
        let mut acc: Vec<Result<Vec<u64>>> = jobs.iter().map(|_| Ok(Vec::new())).collect();
        let mut det: Vec<Option<XioDetail>> = jobs.iter().map(|_| None).collect();
        let one_core = place.client == place.server;
        for round in 0..rounds {
            // Spread the remainder over the first rounds.
            let n = iters / rounds + usize::from(round < iters % rounds);
            for (k, &what) in jobs.iter().enumerate() {
                let Ok(samples) = &mut acc[k] else { continue };
                progress(&format!(
                    "{} {}{} (round {}/{rounds})",
                    what.label(),
                    fmt_size(size),
                    if one_core { ", one core" } else { "" },
                    round + 1
                ));
                let r = match what {
                    Transport::Base(b) => baselines::run_pair(
                        b,
                        &["serve"],
                        Some(place.server),
                        Some(place.client),
                        size,
                        self.warmup,
                        n,
                    ),
                    Transport::Xio(mode) => {
                        let o = PairOpts {
                            prefix: self.prefix,
                            mode,
                            server_cpu: Some(place.server),
                            client_cpu: Some(place.client),
                            size,
                            warmup: self.warmup,
                            iters: n,
                            idle: idle.filter(|_| round + 1 == rounds),
                        };
                        xio::run_pair(&o).map(|p| {
                            let d = det[k].get_or_insert(XioDetail {
                                size,
                                mode,
                                one_core,
                                client: SpinCounts::default(),
                                server: Some(SpinCounts::default()),
                                idle: None,
                            });
                            d.client = d.client.plus(p.client_spin);
                            d.server = d.server.zip(p.server_spin).map(|(a, b)| a.plus(b));
                            d.idle = d.idle.or(p.idle);
                            p.samples
                        })
                    }
                };
                match r {
                    Ok(mut s) => samples.append(&mut s),
                    Err(e) => acc[k] = Err(e),
                }
            }
        }
        jobs.iter()
            .zip(acc)
            .zip(det)
            .map(|((&what, r), d)| (what, r.map(|mut s| summarize(&mut s)), d))
            .collect()
    }
}

/// Share of all CPUs' time that was busy (and stolen by the hypervisor)
/// over a short window, from `/proc/stat`.
pub(crate) struct Load {
    pub(crate) busy_pct: f64,
    pub(crate) steal_pct: f64,
}

/// `/proc/stat`'s all-CPU counters (in clock ticks): user nice system idle
/// iowait irq softirq steal.
fn proc_stat_cpu() -> Option<Vec<u64>> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let line = s.lines().find(|l| l.starts_with("cpu "))?;
    let v: Option<Vec<u64>> = line
        .split_whitespace()
        .skip(1)
        .take(8)
        .map(|v| v.parse().ok())
        .collect();
    v.filter(|v| v.len() == 8)
}

/// Busy (not idle, not iowait, not steal) ticks of all CPUs.
fn busy_ticks(v: &[u64]) -> u64 {
    v[0] + v[1] + v[2] + v[5] + v[6]
}

/// Samples `/proc/stat` twice, `window` apart, while this process is idle.
pub(crate) fn background_load(window: Duration) -> Option<Load> {
    let a = proc_stat_cpu()?;
    std::thread::sleep(window);
    let b = proc_stat_cpu()?;
    let total: u64 = b.iter().sum::<u64>() - a.iter().sum::<u64>();
    if total == 0 {
        return None;
    }
    Some(Load {
        busy_pct: 100.0 * (busy_ticks(&b) - busy_ticks(&a)) as f64 / total as f64,
        steal_pct: 100.0 * (b[7] - a[7]) as f64 / total as f64,
    })
}

/// CPU ticks used by this process (all threads) and its reaped children:
/// utime + stime + cutime + cstime from `/proc/self/stat`.
fn own_ticks() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &s[s.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // utime is field 14, i.e. index 11 after "(comm)"; then stime, cutime, cstime.
    f.get(11..15)?
        .iter()
        .map(|x| x.parse::<i64>().ok().map(|v| v.max(0) as u64))
        .sum()
}

/// Measures how much CPU *other* processes used while the benchmark ran:
/// all CPUs' busy time minus ours (and our children's).
pub(crate) struct NoiseMeter {
    t0: Instant,
    busy0: u64,
    own0: u64,
}

impl NoiseMeter {
    pub(crate) fn start() -> Option<Self> {
        Some(NoiseMeter {
            t0: Instant::now(),
            busy0: busy_ticks(&proc_stat_cpu()?),
            own0: own_ticks()?,
        })
    }

    /// (CPU seconds used by others, as a percentage of one CPU over the run).
    pub(crate) fn finish(&self) -> Option<(f64, f64)> {
        let busy = busy_ticks(&proc_stat_cpu()?) - self.busy0;
        let own = own_ticks()? - self.own0;
        let hz = rustix::param::clock_ticks_per_second().max(1) as f64;
        let other_s = busy.saturating_sub(own) as f64 / hz;
        let wall = self.t0.elapsed().as_secs_f64().max(1e-9);
        Some((other_s, 100.0 * other_s / wall))
    }
}

/// Median, minimum and maximum rate (M desc/s) of some runs.
fn median_range(runs: &[xio::OnewayResult]) -> (f64, f64, f64) {
    let mut r: Vec<f64> = runs.iter().map(xio::OnewayResult::mdesc_per_s).collect();
    r.sort_by(f64::total_cmp);
    match (r.first(), r.last()) {
        (Some(&lo), Some(&hi)) => (r[r.len() / 2], lo, hi),
        _ => (0.0, 0.0, 0.0),
    }
}

pub(crate) fn progress(what: &str) {
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
    println!("### X-IO spin policy and idle CPU\n");
    println!(
        "Spin hits / sleeps: waits satisfied by spinning vs. waits that slept \
         (`Stack::spin_policy()`; only Adaptive mode counts them). \
         Client: over the timed loop; server: over its whole session. \
         Idle CPU: the server's on-CPU time (`/proc/<pid>/schedstat`; \
         utime+stime from `/proc/<pid>/stat` in parentheses, 10 ms ticks) \
         while it waited in `recv` with no traffic after the run.\n"
    );
    println!(
        "| size | mode | placement | client spin hits / sleeps | server spin hits / sleeps | server CPU while idle |"
    );
    println!("|---|---|---|---|---|---|");
    for one_core in [false, true] {
        for m in modes {
            for d in details
                .iter()
                .filter(|d| d.mode == *m && d.one_core == one_core)
            {
                println!(
                    "| {} | {} | {} | {} | {} | {} |",
                    fmt_size(d.size),
                    d.mode.label(),
                    if d.one_core {
                        "one core"
                    } else {
                        "separate cores"
                    },
                    fmt_counts(d.client),
                    d.server.map(fmt_counts).unwrap_or_else(|| "–".into()),
                    d.idle.as_ref().map(fmt_idle).unwrap_or_else(|| "–".into()),
                );
            }
        }
    }
    println!();
    for one_core in [false, true] {
        let (hits, sleeps) = details
            .iter()
            .filter(|d| d.mode == Mode::Adaptive && d.one_core == one_core)
            .fold((0, 0), |(h, s), d| (h + d.client.hits, s + d.client.sleeps));
        if hits + sleeps > 0 {
            println!(
                "Adaptive client, {}: {hits} spin hits / {sleeps} sleeps over all sizes \
                 ({:.1}% of waits ended while spinning).\n",
                if one_core {
                    "one core"
                } else {
                    "separate cores"
                },
                100.0 * hits as f64 / (hits + sleeps) as f64
            );
        }
    }
}

/// One row of the targets table (skipped when nothing was measured).
fn target_row(target: &str, parts: &[String], ok: &[bool]) {
    if !ok.is_empty() {
        println!("| {target} | {} | {} |", parts.join(", "), verdict(ok));
    }
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
    tput: &[(String, Result<Vec<xio::OnewayResult>, String>)],
    sizes: &[usize],
) {
    println!("### Targets\n");
    println!("| target | measured | verdict |");
    println!("|---|---|---|");
    let floor = |s| res.get(Where::Apart, s, Transport::Base(Baseline::SpinRing));
    let apart = |s, m| res.get(Where::Apart, s, Transport::Xio(m));
    let one = |s, t| res.get(Where::OneCore, s, t);
    let uds_apart = |s| res.get(Where::Apart, s, Transport::Base(Baseline::Uds));
    let uds_one = |s| one(s, Transport::Base(Baseline::Uds));
    let vs = |label: String, x: f64, u: f64| format!("{label}: {} vs {} µs", fmt_us(x), fmt_us(u));

    // BusyPoll <= 2x the floor.
    let (mut parts, mut ok) = (Vec::new(), Vec::new());
    for &s in sizes {
        if let (Some(x), Some(f)) = (apart(s, Mode::BusyPoll), floor(s)) {
            parts.push(format!("{}: {}", fmt_size(s), fmt_ratio(x / f)));
            ok.push(x <= 2.0 * f);
        }
    }
    target_row(
        "BusyPoll p50 ≤ 2x SpinRing p50, separate cores, every size",
        &parts,
        &ok,
    );

    // Adaptive under 1 us.
    let (mut parts, mut ok) = (Vec::new(), Vec::new());
    for &s in sizes {
        if let Some(x) = apart(s, Mode::Adaptive) {
            parts.push(format!("{}: {} µs", fmt_size(s), fmt_us(x)));
            ok.push(x < 1_000.0);
        }
    }
    target_row("Adaptive ping-pong p50 < 1 µs, separate cores", &parts, &ok);

    // Adaptive idle.
    // (CPU ms used, window ms) per idle check.
    let idles: Vec<(f64, f64)> = details
        .iter()
        .filter(|d| d.mode == Mode::Adaptive)
        .filter_map(|d| {
            d.idle
                .as_ref()
                .map(|i| (idle_ms(i), i.window.as_secs_f64() * 1e3))
        })
        .collect();
    let max = idles.iter().map(|&(i, _)| i).fold(0.0, f64::max);
    target_row(
        "Adaptive: ~no CPU when idle (< 1% of the idle window)",
        &[format!("max {max:.2} ms over {} idle windows", idles.len())],
        &idles.iter().map(|&(i, w)| i < 0.01 * w).collect::<Vec<_>>(),
    );

    // One core: Adaptive <= UDS.
    let (mut parts, mut ok) = (Vec::new(), Vec::new());
    for s in ONE_CORE_SIZES {
        if let (Some(x), Some(u)) = (one(s, Transport::Xio(Mode::Adaptive)), uds_one(s)) {
            parts.push(vs(fmt_size(s), x, u));
            ok.push(x <= u);
        }
    }
    target_row("One core: Adaptive p50 ≤ Unix socket p50", &parts, &ok);

    // Blocking <= UDS.
    let (mut parts, mut ok) = (Vec::new(), Vec::new());
    for &s in sizes {
        if let (Some(x), Some(u)) = (apart(s, Mode::Blocking), uds_apart(s)) {
            parts.push(vs(fmt_size(s), x, u));
            ok.push(x <= u);
        }
    }
    for s in ONE_CORE_SIZES {
        if let (Some(x), Some(u)) = (one(s, Transport::Xio(Mode::Blocking)), uds_one(s)) {
            parts.push(vs(format!("{} one core", fmt_size(s)), x, u));
            ok.push(x <= u);
        }
    }
    target_row("Blocking p50 ≤ Unix socket p50", &parts, &ok);

    // One-way throughput.
    let (mut parts, mut ok) = (Vec::new(), Vec::new());
    for (label, r) in tput.iter().filter(|(l, _)| l.starts_with("X-IO")) {
        if let Ok(runs) = r {
            let (med, _, _) = median_range(runs);
            let mode = label.split_whitespace().nth(1).unwrap_or("?");
            parts.push(format!("{mode}: {med:.1} M/s (median)"));
            ok.push(med >= 50.0);
        }
    }
    target_row("One-way ≥ 50 M descriptors/s", &parts, &ok);
    println!();
}

/// A fresh directory for the pool's control socket, removed on drop.
pub(crate) struct RunDir(pub(crate) PathBuf);

impl RunDir {
    pub(crate) fn create() -> Result<Self> {
        let d = std::env::temp_dir().join(format!("xio-bench-run-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        // Private whatever the umask: the manager refuses a run dir every
        // user may write to (under umask 0 the bench failed to start).
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&d)
            .with_context(|| format!("creating {d:?}"))?;
        Ok(RunDir(d))
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Descriptors the host-phase probe pushes through the raw ring.
const PHASE_PROBE_DESCS: u64 = 20_000_000;

/// Measures the raw ring between CPUs 0 and 1 (two pinned threads, no
/// buffers) and prints it as the host's phase: on the reference VM the
/// cost of moving a cache line between the two vCPUs changes by up to
/// 10x within minutes (the same binary's raw ring at 37, 140 and 520 M
/// descriptors/s), and X-IO's figures, bound by those moves, follow it far
/// more than the kernel's. `when` says where in the run the probe is.
pub(crate) fn print_host_phase(when: &str) {
    if crate::pin::online_cpus() < 2 {
        return;
    }
    match crate::xio::ring_throughput(Some(0), Some(1), PHASE_PROBE_DESCS) {
        Ok(r) => println!(
            "Host phase {when}: the raw ring (CPU 0 -> CPU 1) moves {:.0} M descriptors/s.\n",
            r.mdesc_per_s()
        ),
        Err(e) => println!("Host phase {when}: the raw-ring probe failed ({e:#}).\n"),
    }
    if crate::xio::copy_on_receive() {
        println!("X-IO pairs copy on receive (XIO_BENCH_COPY_ON_RECEIVE=1).\n");
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

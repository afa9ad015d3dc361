//! Noisy neighbours (issue 44; IX++'s interference experiment): a
//! latency-critical pair (64 B request-response, separate processes
//! pinned to CPUs 0 and 1, adaptive mode) measured alone, then while
//! other services of the same pool try to take it: a writer flooding a
//! reader that never reads (its ring full, its buffers pinned unread), and
//! a hog that allocates all it can of every class and holds it. Once with
//! the default quotas (half of each class per service) and once without
//! (a quota of the whole class), side by side. The noise waits without
//! spinning once the pool refuses it, so what it costs the pair is the
//! pool, not the CPU.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use xio_core::prelude::*;

use crate::compare::{print_host_phase, RunDir};
use crate::stats::{fmt_us, summarize};
use crate::xio::{self, Mode, PairOpts};

/// Options of `xio-bench noisy`.
#[derive(clap::Args, Debug)]
pub struct NoisyArgs {
    /// Timed round trips per measurement.
    #[arg(long, default_value_t = 20_000)]
    iters: usize,
    /// How long a measurement may wait for buffers before it is reported
    /// stalled (the pool taken from it).
    #[arg(long, default_value_t = 5)]
    stall_secs: u64,
}

/// The flooder, its reader and the hog: threads of this process, each
/// with a stack of its own, non-blocking and sleeping 1 ms whenever the
/// pool or a ring refuses them.
struct Noise {
    stop: Arc<AtomicBool>,
    /// Parties that have been refused since they started (saturated).
    saturated: Arc<AtomicUsize>,
    threads: Vec<std::thread::JoinHandle<Result<()>>>,
}

impl Noise {
    fn start(prefix: &str) -> Result<Noise> {
        let stop = Arc::new(AtomicBool::new(false));
        let saturated = Arc::new(AtomicUsize::new(0));
        let addr: std::net::SocketAddr = "10.99.0.1:9".parse().unwrap();
        // The reader binds and never reads; it lives until the stop.
        let mut reader = Stack::builder(prefix).name("noisy-reader").attach()?;
        reader.bind(addr)?;
        let mut threads = Vec::new();
        {
            let (stop, sat, prefix) = (stop.clone(), saturated.clone(), prefix.to_owned());
            threads.push(std::thread::spawn(move || -> Result<()> {
                let mut s = Stack::builder(&prefix)
                    .name("noisy-writer")
                    .wait_mode(WaitMode::NonBlocking)
                    .attach()?;
                let peer = s.connect(addr)?;
                let mut told = false;
                while !stop.load(Ordering::Relaxed) {
                    let sent = s.try_alloc(64).ok().map(|mut b| {
                        b.set_len(64);
                        s.try_send(peer, b).is_ok()
                    });
                    if sent != Some(true) {
                        if !told {
                            sat.fetch_add(1, Ordering::Relaxed);
                            told = true;
                        }
                        std::thread::sleep(Duration::from_millis(1));
                    }
                }
                Ok(())
            }));
        }
        {
            let (stop, sat, prefix) = (stop.clone(), saturated.clone(), prefix.to_owned());
            threads.push(std::thread::spawn(move || -> Result<()> {
                let s = Stack::builder(&prefix)
                    .name("noisy-hog")
                    .wait_mode(WaitMode::NonBlocking)
                    .attach()?;
                let mut held = Vec::new();
                for size in [2 << 10, 64 << 10, 1 << 20] {
                    while let Ok(b) = s.try_alloc(size) {
                        held.push(b);
                    }
                }
                sat.fetch_add(1, Ordering::Relaxed);
                while !stop.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(5));
                }
                drop((held, reader));
                Ok(())
            }));
        }
        Ok(Noise {
            stop,
            saturated,
            threads,
        })
    }

    fn wait_saturated(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.saturated.load(Ordering::Relaxed) < 2 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn stop(self) -> Result<()> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads {
            t.join()
                .map_err(|_| anyhow::anyhow!("a noise thread panicked"))??;
        }
        Ok(())
    }
}

/// The latency pair on `prefix`, in a thread: its p50 and p99 (µs), or
/// `None` if it had not finished after `stall` (the noise is then stopped
/// so it can finish, and its figures are not reported).
fn pair(
    prefix: &str,
    iters: usize,
    stall: Duration,
    noise: Option<Noise>,
) -> Result<Option<(f64, f64)>> {
    let p = prefix.to_owned();
    let t = std::thread::spawn(move || {
        xio::run_pair(&PairOpts {
            prefix: &p,
            mode: Mode::Adaptive,
            server_cpu: Some(1),
            client_cpu: Some(0),
            size: 64,
            warmup: 2_000,
            iters,
            idle: None,
        })
    });
    let deadline = Instant::now() + stall;
    while !t.is_finished() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let stalled = !t.is_finished();
    if let Some(n) = noise {
        n.stop()?;
    }
    let mut r = t
        .join()
        .map_err(|_| anyhow::anyhow!("the pair panicked"))?
        .context("the latency pair")?;
    if stalled {
        return Ok(None);
    }
    let s = summarize(&mut r.samples);
    Ok(Some((s.p50_ns / 1e3, s.p99_ns / 1e3)))
}

pub fn run(a: &NoisyArgs) -> Result<()> {
    let run_dir = RunDir::create()?;
    std::env::set_var("XIO_RUN_DIR", &run_dir.0);
    print_host_phase("before the run");
    let stall = Duration::from_secs(a.stall_secs);
    let classes = PoolConfig::default().classes;
    println!("| pool | alone p50 / p99 | with the noise p50 / p99 | p99 with / alone |");
    println!("|---|---:|---:|---:|");
    for (label, quotas) in [
        ("default quotas (half of each class)", Vec::new()),
        ("no quotas (`--quota` of each whole class)", classes.clone()),
    ] {
        let prefix = format!("xio-noisy-{}-{}", std::process::id(), quotas.len());
        let mgr = Manager::builder(&prefix)
            .pool(PoolConfig {
                quotas,
                ..PoolConfig::default()
            })
            .spawn()
            .context("starting the embedded manager")?;
        let alone = pair(&prefix, a.iters, stall, None)?.context("the pair stalled alone")?;
        let noise = Noise::start(&prefix)?;
        noise.wait_saturated();
        let free: Vec<String> = mgr
            .usage()
            .iter()
            .map(|u| format!("{}/{}", u.free, u.total))
            .collect();
        let loaded = pair(&prefix, a.iters, stall, Some(noise))?;
        let cell = |v: Option<(f64, f64)>| match v {
            Some((p50, p99)) => format!("{} / {} µs", fmt_us(p50 * 1e3), fmt_us(p99 * 1e3)),
            None => format!("stalled (no buffer in {} s)", a.stall_secs),
        };
        let ratio = match loaded {
            Some((_, p99)) => format!("{:.2}x", p99 / alone.1),
            None => "∞".into(),
        };
        println!(
            "| {label}; free while noisy {} | {} | {} | {ratio} |",
            free.join(", "),
            cell(Some(alone)),
            cell(loaded)
        );
        mgr.stop();
    }
    print_host_phase("after the run");
    Ok(())
}

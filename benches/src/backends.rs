//! `xio-bench backends` (feature `dpdk`): the same round trips on the shm
//! backend and on the DPDK backend, next to a Unix-domain socket, in one
//! run. The bench process runs both managers (so it is the DPDK primary of
//! the DPDK pool) and the clients; servers are child processes (DPDK
//! secondaries for the DPDK pool). Client on CPU 0, server on CPU 1.

use anyhow::{Context, Result};
use clap::Args;
use xio_core::manager::{Backend, Manager};
use xio_core::PoolConfig;

use crate::compare::{fmt_size, RunDir};
use crate::sockets::{rtt_samples, Transport};
use crate::stats::{fmt_us, summarize};
use crate::xio::{run_pair, Mode, PairOpts};

/// Options of `xio-bench backends`.
#[derive(Args, Debug)]
pub struct BackendsArgs {
    /// Fewer round trips.
    #[arg(long)]
    quick: bool,
    /// Timed round trips per run.
    #[arg(long)]
    iters: Option<usize>,
    /// Runs per row, one after another (samples pooled).
    #[arg(long)]
    rounds: Option<usize>,
}

#[derive(Clone, Copy)]
enum Row {
    Zc(Backend),
    Stream(Backend),
    Uds,
}

impl Row {
    fn label(self) -> &'static str {
        match self {
            Row::Zc(Backend::Shm) => "zero-copy (Stack), shm",
            Row::Zc(Backend::Dpdk) => "zero-copy (Stack), DPDK",
            Row::Stream(Backend::Shm) => "stream (XioStream), shm",
            Row::Stream(Backend::Dpdk) => "stream (XioStream), DPDK",
            Row::Uds => "stream, Unix-domain socket",
        }
    }
}

/// Runs the comparison; markdown on stdout.
pub fn run(a: &BackendsArgs) -> Result<()> {
    let iters = a.iters.unwrap_or(if a.quick { 3_000 } else { 20_000 });
    let rounds = a.rounds.unwrap_or(if a.quick { 1 } else { 3 }).max(1);
    let warmup = (iters / 10).max(100);
    let run_dir = RunDir::create()?;
    std::env::set_var("XIO_RUN_DIR", &run_dir.0);
    let pid = std::process::id();
    let shm = format!("xb-shm-{pid}");
    let dpdk = format!("xbd{pid}");
    let _m1 = Manager::builder(&shm)
        .pool(PoolConfig::default())
        .spawn()
        .context("shm manager")?;
    let _m2 = Manager::builder(&dpdk)
        .pool(PoolConfig::default())
        .backend(Backend::Dpdk)
        .spawn()
        .context("DPDK manager (hugepages reserved? see docs/dpdk.md)")?;
    let prefix = |b: Backend| match b {
        Backend::Shm => shm.as_str(),
        Backend::Dpdk => dpdk.as_str(),
    };
    let rows = [
        Row::Zc(Backend::Shm),
        Row::Zc(Backend::Dpdk),
        Row::Stream(Backend::Shm),
        Row::Stream(Backend::Dpdk),
        Row::Uds,
    ];
    let sizes = [64usize, 64 << 10];
    println!("## Backends: shm and DPDK, same run\n");
    println!(
        "{iters} timed round trips per run after {warmup} untimed, {rounds} runs per row \
         one after another (samples pooled); adaptive waiting; client CPU 0, server CPU 1. \
         Zero-copy rows: `alloc` + `send` + `recv` of a pool buffer echoed in place; \
         stream rows: `write_all` + `read_exact` over one connection. µs.\n"
    );
    println!("| transport | 64 B p50 | 64 B p99 | 64 KiB p50 | 64 KiB p99 |");
    println!("|---|---:|---:|---:|---:|");
    for row in rows {
        let mut cells = Vec::new();
        for &size in &sizes {
            let mut all = Vec::new();
            for _ in 0..rounds {
                let mut s = match row {
                    Row::Zc(b) => {
                        run_pair(&PairOpts {
                            prefix: prefix(b),
                            mode: Mode::Adaptive,
                            server_cpu: Some(1),
                            client_cpu: Some(0),
                            size,
                            warmup,
                            iters,
                            idle: None,
                        })?
                        .samples
                    }
                    Row::Stream(b) => {
                        std::env::set_var("XIO_BENCH_PREFIX", prefix(b));
                        rtt_samples(Transport::Xio, size, warmup, iters, 0, 1)?
                    }
                    Row::Uds => rtt_samples(Transport::Uds, size, warmup, iters, 0, 1)?,
                };
                all.append(&mut s);
            }
            let sum = summarize(&mut all);
            cells.push(format!("{} | {}", fmt_us(sum.p50_ns), fmt_us(sum.p99_ns)));
            eprintln!("[xio-bench] {} {}: done", row.label(), fmt_size(size));
        }
        println!("| {} | {} |", row.label(), cells.join(" | "));
    }
    println!();
    Ok(())
}

//! TEMPORARY driver for the baseline modules (to be replaced by the real
//! harness). Runs every baseline via `run_pair` and prints p50/p99.

mod baselines;
mod pin;
mod stats;

use baselines::Baseline;
use clap::{Parser, Subcommand};

/// Temporary baseline driver.
#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    /// Iterations per measurement.
    #[arg(long, default_value_t = 20_000)]
    iters: usize,
    /// Warmup round trips.
    #[arg(long, default_value_t = 2_000)]
    warmup: usize,
    /// Server CPU.
    #[arg(long)]
    server_cpu: Option<usize>,
    /// Client CPU.
    #[arg(long)]
    client_cpu: Option<usize>,
    /// Baselines to run (default: all).
    #[arg(long, value_enum)]
    only: Vec<Baseline>,
    /// Server subcommand (for testing failure paths).
    #[arg(long, default_value = "serve")]
    server_subcmd: String,
    /// Sizes to run.
    #[arg(long, default_values_t = [64usize, 65536])]
    sizes: Vec<usize>,
}

#[derive(Subcommand)]
enum Cmd {
    /// Child side.
    Serve {
        #[arg(long, value_enum)]
        baseline: Baseline,
        #[arg(long)]
        endpoint: String,
        #[arg(long)]
        size: usize,
        #[arg(long)]
        cpu: Option<usize>,
    },
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Some(Cmd::Serve {
        baseline,
        endpoint,
        size,
        cpu,
    }) = cli.cmd
    {
        if let Some(cpu) = cpu {
            pin::pin_to_cpu(cpu)?;
        }
        return baselines::serve(baseline, &endpoint, size);
    }
    println!("online cpus: {}", pin::online_cpus());
    let list: Vec<Baseline> = if cli.only.is_empty() {
        <Baseline as clap::ValueEnum>::value_variants().to_vec()
    } else {
        cli.only.clone()
    };
    for b in list {
        for &size in &cli.sizes {
            let t = std::time::Instant::now();
            let mut s = baselines::run_pair(
                b,
                &[cli.server_subcmd.as_str()],
                cli.server_cpu,
                cli.client_cpu,
                size,
                cli.warmup,
                cli.iters,
            )?;
            let sum = stats::summarize(&mut s);
            println!(
                "{:<15} {:>8} B  p50 {:>8} us  p99 {:>8} us  mean {:>8} us  n={} ({:.2?})",
                b.to_string(),
                size,
                stats::fmt_us(sum.p50_ns),
                stats::fmt_us(sum.p99_ns),
                stats::fmt_us(sum.mean_ns),
                sum.n,
                t.elapsed()
            );
        }
    }
    Ok(())
}

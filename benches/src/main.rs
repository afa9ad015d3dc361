//! `xio-bench`: cross-process latency and throughput of X-IO against Unix
//! sockets, TCP loopback and bare shared-memory spin rings.
//!
//! ```text
//! cargo run -p xio-bench --release -- compare [--quick] [--sizes 64,1K,...] [--modes adaptive,...] [--iters N]
//! ```
//!
//! The parent process is the client of every pair and runs the embedded
//! X-IO manager; each server is this same executable run with a hidden
//! subcommand (`serve` for the baselines, `serve-xio` for X-IO).

mod baselines;
mod compare;
mod pin;
mod stats;
mod xio;

use std::net::SocketAddr;

use anyhow::{Context, Result};
use baselines::Baseline;
use clap::{Parser, Subcommand};

/// Cross-process latency and throughput benchmarks for X-IO.
#[derive(Parser)]
#[command(name = "xio-bench", version)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Compare X-IO with the baselines; prints markdown tables on stdout.
    Compare(compare::CompareArgs),
    /// (internal) Baseline server, spawned by the parent.
    #[command(hide = true)]
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
    /// (internal) X-IO echo or sink server, spawned by the parent.
    #[command(hide = true)]
    ServeXio {
        #[arg(long)]
        prefix: String,
        #[arg(long, value_enum)]
        mode: xio::Mode,
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long)]
        cpu: Option<usize>,
        /// Drop data messages (echo only 1-byte markers) instead of echoing.
        #[arg(long)]
        sink: bool,
    },
}

fn pin(cpu: Option<usize>) -> Result<()> {
    if let Some(c) = cpu {
        pin::pin_to_cpu(c).with_context(|| format!("pinning to CPU {c}"))?;
    }
    Ok(())
}

fn main() -> Result<()> {
    match Cli::parse().cmd {
        Cmd::Compare(a) => compare::run(&a),
        Cmd::Serve {
            baseline,
            endpoint,
            size,
            cpu,
        } => {
            xio::die_with_parent()?;
            pin(cpu)?;
            baselines::serve(baseline, &endpoint, size)
        }
        Cmd::ServeXio {
            prefix,
            mode,
            addr,
            cpu,
            sink,
        } => {
            xio::die_with_parent()?;
            pin(cpu)?;
            xio::serve(&prefix, mode, addr, sink)
        }
    }
}

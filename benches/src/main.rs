//! `xio-bench`: cross-process latency and throughput of X-IO against Unix
//! sockets, TCP loopback and bare shared-memory spin rings.
//!
//! ```text
//! cargo run -p xio-bench --release -- compare [--quick] [--sizes 64,1K,...] [--modes adaptive,...] [--iters N]
//! cargo run -p xio-bench --release -- sockets [--quick] [--sections a,b,c] [--placement apart,one-core]
//! cargo run -p xio-bench --release -- go [--quick] [--conns 1,16,64,256] [--protos h1,h2c]
//! ```
//!
//! The parent process is the client of every pair and runs the embedded
//! X-IO manager; each server is this same executable run with a hidden
//! subcommand (`serve` for the baselines, `serve-xio` for X-IO,
//! `serve-sock` for `sockets`).

#[cfg(feature = "dpdk")]
mod backends;
mod baselines;
mod capi;
mod clock;
mod compare;
mod gobench;
mod noisy;
mod peers;
mod pin;
mod report;
mod sockets;
mod stats;
mod tokio_bench;
mod uring;
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
    /// HTTP echo under hyper: X-IO next to TCP and a Unix socket.
    Http(tokio_bench::HttpArgs),
    /// (internal) hyper echo server, spawned by the parent.
    #[command(hide = true)]
    ServeHttp {
        #[arg(long, value_enum)]
        transport: tokio_bench::AsyncTransport,
        #[arg(long)]
        endpoint: String,
        #[arg(long, default_value_t = 1)]
        conns: usize,
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// Async echo under tokio: X-IO next to tokio's TcpStream and UnixStream.
    Tokio(tokio_bench::TokioArgs),
    /// (internal) tokio echo server, spawned by the parent.
    #[command(hide = true)]
    ServeTokio {
        #[arg(long, value_enum)]
        transport: tokio_bench::AsyncTransport,
        #[arg(long)]
        endpoint: String,
        #[arg(long, default_value_t = 1)]
        conns: usize,
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// Compare X-IO with the baselines; prints markdown tables on stdout.
    Compare(compare::CompareArgs),
    /// Go over X-IO (the go/ package): net.Conn ping-pong and net/http
    /// (HTTP/1.1, h2c) next to TCP and a Unix socket; needs Go on PATH.
    Go(gobench::GoArgs),
    /// Noisy neighbours: a 64 B request-response pair alone, then while
    /// other services flood and hoard the pool, with quotas and without.
    Noisy(noisy::NoisyArgs),
    /// The shm and DPDK backends side by side with a Unix socket (needs the
    /// `dpdk` feature and hugepages).
    #[cfg(feature = "dpdk")]
    Backends(backends::BackendsArgs),
    /// The C ABI: C packet generator and echo function next to the same
    /// loops in Rust (zero-copy round trip).
    Capi(capi::CapiArgs),
    /// (internal) The Rust echo function of `capi`.
    #[command(hide = true)]
    ServeL2fwd {
        #[arg(long)]
        prefix: String,
        #[arg(long)]
        addr: SocketAddr,
        #[arg(long, value_enum)]
        mode: xio::Mode,
        #[arg(long)]
        cpu: Option<usize>,
    },
    /// The paper's experiments (Figs. 7 to 10), the peers and one core in
    /// one run: a markdown summary and SVG plots in a folder.
    Report(report::ReportArgs),
    /// Stream sockets (Unix socket, TCP loopback) side by side: round trip,
    /// short connections, concurrent connections; markdown on stdout.
    Sockets(sockets::SocketsArgs),
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
    /// (internal) `sockets` server, spawned by the parent.
    #[command(hide = true)]
    ServeSock {
        #[arg(long, value_enum)]
        transport: sockets::Transport,
        #[arg(long)]
        endpoint: String,
        #[arg(long, value_enum)]
        section: sockets::Section,
        #[arg(long)]
        size: usize,
        /// Connections of section c.
        #[arg(long, default_value_t = 1)]
        conns: usize,
        #[arg(long)]
        cpu: Option<usize>,
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
        Cmd::Go(a) => gobench::run(&a),
        Cmd::Noisy(a) => noisy::run(&a),
        #[cfg(feature = "dpdk")]
        Cmd::Backends(a) => backends::run(&a),
        Cmd::Capi(a) => capi::run(&a),
        Cmd::ServeL2fwd {
            prefix,
            addr,
            mode,
            cpu,
        } => {
            xio::die_with_parent()?;
            pin(cpu)?;
            capi::serve_l2fwd(&prefix, addr, mode)
        }
        Cmd::Report(a) => report::run(&a),
        Cmd::Sockets(a) => sockets::run(&a),
        Cmd::Tokio(a) => tokio_bench::run(&a),
        Cmd::Http(a) => tokio_bench::run_http(&a),
        Cmd::ServeHttp {
            transport,
            endpoint,
            conns,
            cpu,
        } => {
            xio::die_with_parent()?;
            pin(cpu)?;
            tokio_bench::serve_http(transport, &endpoint, conns)
        }
        Cmd::ServeTokio {
            transport,
            endpoint,
            conns,
            cpu,
        } => {
            xio::die_with_parent()?;
            pin(cpu)?;
            tokio_bench::serve(transport, &endpoint, conns)
        }
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
        Cmd::ServeSock {
            transport,
            endpoint,
            section,
            size,
            conns,
            cpu,
        } => {
            xio::die_with_parent()?;
            pin(cpu)?;
            sockets::serve(transport, &endpoint, section, size, conns)
        }
    }
}

//! `xio-bench go`: Go programs over X-IO next to the kernel (the Go
//! package in `go/`): a raw `net.Conn` 64 B ping-pong, and Go's net/http
//! echo (HTTP/1.1 and h2c) at several connection counts, each beside TCP
//! loopback and a Unix socket in the same run. The measuring is done by
//! the Go command `go/cmd/xio-gobench`, built here against the release
//! libxio; this prints its tables with the host's phase around them.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context, Result};

/// Arguments of `xio-bench go`.
#[derive(clap::Args, Debug)]
pub(crate) struct GoArgs {
    /// Short run (fewer round trips, 0.5 s per HTTP cell).
    #[arg(long)]
    quick: bool,
    /// Connection counts of the HTTP tables (default 1,16,64,256).
    #[arg(long, value_delimiter = ',')]
    conns: Vec<usize>,
    /// HTTP versions (default h1,h2c).
    #[arg(long, value_delimiter = ',')]
    protos: Vec<String>,
    /// Rounds per cell, alternating the transports (default 3).
    #[arg(long)]
    rounds: Option<usize>,
    /// Skip the HTTP tables (ping-pong only).
    #[arg(long)]
    no_http: bool,
}

fn repo_root() -> PathBuf {
    // benches/ is a member of the workspace at the repository's root.
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("benches/ has a parent")
        .to_path_buf()
}

fn run_checked(cmd: &mut Command, what: &str) -> Result<()> {
    let status = cmd.status().with_context(|| format!("running {what}"))?;
    if !status.success() {
        bail!("{what} failed ({status})");
    }
    Ok(())
}

/// Builds the release libxio and the Go benchmark; returns the binary.
fn build() -> Result<PathBuf> {
    let root = repo_root();
    run_checked(
        Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
            .args(["build", "--release", "-q", "-p", "xio-capi"])
            .current_dir(&root),
        "cargo build -p xio-capi (the Go package links its libxio.a)",
    )?;
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| root.join("target"));
    let bin = target.join("release").join("xio-gobench");
    run_checked(
        Command::new("go")
            .args(["build", "-o"])
            .arg(&bin)
            .arg("./cmd/xio-gobench")
            .current_dir(root.join("go")),
        "go build ./cmd/xio-gobench (Go 1.26 or later on PATH)",
    )?;
    Ok(bin)
}

pub(crate) fn run(a: &GoArgs) -> Result<()> {
    let bin = build()?;
    let rounds = a.rounds.unwrap_or(if a.quick { 1 } else { 3 });
    println!("## Go: net.Conn and net/http over X-IO, TCP loopback and a Unix socket\n");
    println!(
        "Client and server are separate processes, each pinned to its own CPU \
         (client 0, server 1) with one Go P (GOMAXPROCS=1); the transports \
         alternate round by round ({rounds} rounds). Built with {}.\n",
        String::from_utf8_lossy(
            &Command::new("go")
                .arg("version")
                .output()
                .map(|o| o.stdout)
                .unwrap_or_default()
        )
        .trim()
    );
    crate::compare::print_host_phase("before the run");
    println!("### net.Conn ping-pong, 64 B\n");
    let iters = if a.quick { "3000" } else { "20000" };
    run_checked(
        Command::new(&bin).args(["pingpong", "-iters", iters, "-rounds", &rounds.to_string()]),
        "xio-gobench pingpong",
    )?;
    if !a.no_http {
        let conns = if a.conns.is_empty() {
            "1,16,64,256".to_string()
        } else {
            a.conns
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",")
        };
        let protos = if a.protos.is_empty() {
            "h1,h2c".to_string()
        } else {
            a.protos.join(",")
        };
        println!(
            "\n### net/http echo (POST 64 B, keep-alive, one request in flight per connection)"
        );
        let dur = if a.quick { "500ms" } else { "2s" };
        run_checked(
            Command::new(&bin).args([
                "http",
                "-conns",
                &conns,
                "-protos",
                &protos,
                "-duration",
                dur,
                "-rounds",
                &rounds.to_string(),
            ]),
            "xio-gobench http",
        )?;
        println!();
    }
    crate::compare::print_host_phase("after the run");
    Ok(())
}

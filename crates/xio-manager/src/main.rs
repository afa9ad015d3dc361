//! `xio-manager`: the per-node X-IO manager.
//!
//! ```text
//! xio-manager [--prefix NAME] [--class SIZE:COUNT]...   run in the foreground
//! xio-manager status [--prefix NAME]                    print services, channels, buffers
//! ```
//! Stops cleanly on SIGINT/SIGTERM and removes its socket. A second manager
//! on the same prefix is refused.

use std::process::ExitCode;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};
use xio_core::manager::Manager;
use xio_core::PoolConfig;

#[derive(Parser, Debug)]
#[command(
    name = "xio-manager",
    version,
    about = "The X-IO per-node manager: owns a shared-memory pool and sets up channels between services",
    after_help = "Logs go to stderr at level info; $XIO_LOG sets the filter (e.g. XIO_LOG=debug)."
)]
struct Cli {
    /// Pool prefix (one pool per security domain). Default: $XIO_PREFIX or "xio".
    #[arg(long, global = true)]
    prefix: Option<String>,
    /// A buffer size class, SIZE:COUNT, SIZE in bytes or with K/M suffix
    /// (repeat; default 2K:8192 64K:512 1M:32).
    #[arg(long = "class", value_name = "SIZE:COUNT")]
    classes: Vec<String>,
    /// The most buffers of a class one service may hold at once: what it
    /// allocated and its receivers have not freed yet (repeat per class;
    /// SIZE as in --class). A service at its quota waits, as for an empty
    /// pool. Default: half of each class; COUNT equal to the class's
    /// count turns the cap off.
    #[arg(long = "quota", value_name = "SIZE:COUNT")]
    quotas: Vec<String>,
    /// Where buffers and rings live: `shm` (default) or `dpdk` (DPDK
    /// mempools and rings in hugepages; this manager becomes the DPDK
    /// primary of the prefix; needs a build with `--features dpdk`).
    #[arg(long, default_value = "shm", value_parser = parse_backend)]
    backend: xio_core::manager::Backend,
    /// Most services registered at once.
    #[arg(long, default_value_t = 64)]
    max_stacks: u32,
    /// Most services one process may have registered at once (default:
    /// --max-stacks less an eighth, at most 8, kept for other processes).
    #[arg(long)]
    max_stacks_per_process: Option<u32>,
    /// Most channels (pairs of services) at once.
    #[arg(long, default_value_t = 256)]
    max_channels: u32,
    /// Slots per ring (power of two); each takes up to three descriptors
    /// pushed together.
    #[arg(long, default_value_t = 1024)]
    ring_capacity: u32,
    /// Also admit this user's processes to the pool (a uid or a user
    /// name; repeat, or separate with commas). The default domain is the
    /// manager's own user and root. Whoever is admitted can read and write
    /// every buffer of the pool.
    #[arg(long = "allow-uid", value_name = "USER", value_delimiter = ',', value_parser = parse_uid)]
    allow_uids: Vec<u32>,
    /// Also admit processes whose group or supplementary group is this
    /// one (a gid or a group name; repeat, or separate with commas).
    #[arg(long = "allow-gid", value_name = "GROUP", value_delimiter = ',', value_parser = parse_gid)]
    allow_gids: Vec<u32>,
    /// Serve Prometheus metrics (text format) on this local address:
    /// `127.0.0.1:PORT` (a loopback address) or `unix:/path/to/socket`.
    /// Off by default. The metric list is in docs/operations.md.
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Log as JSON lines instead of text.
    #[arg(long)]
    json: bool,
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Print the running manager's services, channels and buffers in use.
    Status,
}

/// A uid, or a user name looked up in the system's user database.
fn parse_uid(s: &str) -> anyhow::Result<u32> {
    if let Ok(n) = s.parse() {
        return Ok(n);
    }
    let name = std::ffi::CString::new(s).context("a user name holds no NUL")?;
    // SAFETY: `name` is a NUL-terminated string; getpwnam returns NULL or
    // a pointer to a record valid until the next such call, read at once
    // (clap parses on this thread, before any other thread looks users up).
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        bail!("no user {s:?} (give a user name or a numeric uid)");
    }
    // SAFETY: non-NULL: a valid passwd record (above).
    Ok(unsafe { (*pw).pw_uid })
}

/// A gid, or a group name looked up in the system's group database.
fn parse_gid(s: &str) -> anyhow::Result<u32> {
    if let Ok(n) = s.parse() {
        return Ok(n);
    }
    let name = std::ffi::CString::new(s).context("a group name holds no NUL")?;
    // SAFETY: as in `parse_uid`, for getgrnam and its group record.
    let gr = unsafe { libc::getgrnam(name.as_ptr()) };
    if gr.is_null() {
        bail!("no group {s:?} (give a group name or a numeric gid)");
    }
    // SAFETY: non-NULL: a valid group record (above).
    Ok(unsafe { (*gr).gr_gid })
}

fn parse_size(s: &str) -> anyhow::Result<u32> {
    let s = s.trim();
    let (num, mult) = match s.as_bytes().last() {
        Some(b'K' | b'k') => (&s[..s.len() - 1], 1024),
        Some(b'M' | b'm') => (&s[..s.len() - 1], 1024 * 1024),
        _ => (s, 1),
    };
    let n: u32 = num.parse().with_context(|| format!("bad size {s:?}"))?;
    n.checked_mul(mult)
        .with_context(|| format!("size {s:?} too large"))
}

fn parse_class(s: &str) -> anyhow::Result<(u32, u32)> {
    let Some((size, count)) = s.split_once(':') else {
        bail!("{s:?} must be SIZE:COUNT, e.g. 64K:512");
    };
    Ok((
        parse_size(size)?,
        count
            .trim()
            .parse()
            .with_context(|| format!("bad count in {s:?}"))?,
    ))
}

fn run(cli: Cli) -> anyhow::Result<()> {
    let prefix = cli
        .prefix
        .clone()
        .unwrap_or_else(xio_core::paths::default_prefix);
    if let Some(Cmd::Status) = cli.cmd {
        let text = xio_core::manager::query_status(&prefix)?;
        // A reader that stopped early (`| head`) is not an error.
        use std::io::Write;
        return match std::io::stdout().lock().write_all(text.as_bytes()) {
            Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
                Err(e).context("writing the status")
            }
            _ => Ok(()),
        };
    }
    let mut pool = PoolConfig {
        max_stacks: cli.max_stacks,
        max_channels: cli.max_channels,
        ring_capacity: cli.ring_capacity,
        ..PoolConfig::default()
    };
    if !cli.classes.is_empty() {
        pool.classes = cli
            .classes
            .iter()
            .map(|c| parse_class(c))
            .collect::<anyhow::Result<_>>()?;
        pool.classes.sort_unstable();
    }
    pool.quotas = cli
        .quotas
        .iter()
        .map(|q| parse_class(q))
        .collect::<anyhow::Result<_>>()?;
    raise_fd_limit();
    // Handlers first: a signal that arrives while the manager starts (its
    // socket may already be visible) waits for it, instead of killing the
    // process and leaving the socket file behind.
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGINT,
        signal_hook::consts::SIGTERM,
    ])
    .context("install signal handlers")?;
    let mut builder = Manager::builder(&prefix).pool(pool);
    for &uid in &cli.allow_uids {
        builder = builder.allow_uid(uid);
    }
    for &gid in &cli.allow_gids {
        builder = builder.allow_gid(gid);
    }
    if let Some(n) = cli.max_stacks_per_process {
        builder = builder.max_stacks_per_process(n);
    }
    let manager = builder.backend(cli.backend).bind()?;
    if let Some(addr) = &cli.metrics {
        serve_metrics(addr, manager.metrics())?;
    }
    let stopper = manager.stopper();
    std::thread::spawn(move || {
        if let Some(sig) = signals.forever().next() {
            tracing::info!(signal = sig, "stopping");
            stopper.stop();
        }
    });
    manager.run()?;
    Ok(())
}

/// Binds `addr` (a loopback `IP:PORT`, or `unix:PATH`) and answers every
/// connection with the metrics, on a thread of its own: an HTTP/1.1
/// response whatever was asked, as a scraper needs. A connection gets a
/// second to send its request; one at a time, so a slow scraper delays
/// the next, never the manager.
fn serve_metrics(addr: &str, metrics: xio_core::manager::Metrics) -> anyhow::Result<()> {
    use std::io::{Read, Write};
    fn answer(mut c: impl Read + Write, metrics: &xio_core::manager::Metrics) {
        // The request is read, not parsed: every path gets the metrics.
        let mut req = [0u8; 4096];
        let _ = c.read(&mut req);
        let body = metrics.render();
        let _ = write!(
            c,
            "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4; charset=utf-8\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        );
    }
    let timeout = Some(std::time::Duration::from_secs(1));
    if let Some(path) = addr.strip_prefix("unix:") {
        let _ = std::fs::remove_file(path);
        let l = std::os::unix::net::UnixListener::bind(path)
            .with_context(|| format!("metrics: bind {path}"))?;
        tracing::info!(path, "serving metrics");
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let _ = c.set_read_timeout(timeout);
                answer(c, &metrics);
            }
        });
    } else {
        let a: std::net::SocketAddr = addr
            .parse()
            .with_context(|| format!("metrics: {addr:?} is not IP:PORT or unix:PATH"))?;
        anyhow::ensure!(
            a.ip().is_loopback(),
            "metrics: {a} is not a loopback address (the metrics are for this node; \
             use 127.0.0.1 or ::1, or a unix: path)"
        );
        let l = std::net::TcpListener::bind(a).with_context(|| format!("metrics: bind {a}"))?;
        tracing::info!(addr = %a, "serving metrics");
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let _ = c.set_read_timeout(timeout);
                answer(c, &metrics);
            }
        });
    }
    Ok(())
}

/// Raises this process's soft fd limit to its hard one, as servers do:
/// the manager holds fds for every stack (a socket, a doorbell and a
/// pidfd each, and those it queues for stacks that are not reading), and
/// the usual soft limit of 1024 is below what 64 stacks can need.
fn raise_fd_limit() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let lim = getrlimit(Resource::Nofile);
    if lim.current == lim.maximum {
        return;
    }
    let raised = Rlimit {
        current: lim.maximum,
        maximum: lim.maximum,
    };
    match setrlimit(Resource::Nofile, raised) {
        Ok(()) => tracing::debug!(limit = ?lim.maximum, "fd limit raised"),
        Err(e) => tracing::warn!(error = %e, "could not raise the fd limit"),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let filter = tracing_subscriber::EnvFilter::try_from_env("XIO_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        // A log write that fails (stderr a pipe whose reader is gone) is
        // dropped: tracing-subscriber would report it with `eprintln!`,
        // which panics on that same stderr, killing the manager at its
        // next log line (or its signal thread, so SIGTERM did nothing).
        .log_internal_errors(false)
        // Colours only for a terminal, not in a log file or a pipe.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()));
    if cli.json {
        builder.json().init();
    } else {
        builder.init();
    }
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xio-manager: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn parse_backend(s: &str) -> Result<xio_core::manager::Backend, String> {
    s.parse()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_classes() {
        assert_eq!(parse_size("2K").unwrap(), 2048);
        assert_eq!(parse_size("1m").unwrap(), 1 << 20);
        assert_eq!(parse_class("64K:512").unwrap(), (65536, 512));
        assert!(parse_class("64K").is_err());
        assert!(parse_size("99999999M").is_err());
    }
}

//! Cross-process ping-pong baselines that X-IO is measured against.
//!
//! Every baseline is a pair of processes: a *server* (a child process running
//! [`serve`]) that echoes each message back, and a *client* (the parent,
//! running [`ping`]) that sends `size` bytes, waits for `size` bytes back and
//! records the round-trip time with [`Instant`].
//!
//! | baseline         | transport                                                    |
//! |------------------|--------------------------------------------------------------|
//! | `uds`            | Unix-domain stream socket (`std::os::unix::net`)             |
//! | `tcp`            | TCP over 127.0.0.1 with `TCP_NODELAY` on both ends           |
//! | `spin-ring`      | shared-memory SPSC descriptor rings, both sides busy-spin; the payload never moves (the zero-copy floor) |
//! | `spin-ring-copy` | same rings, but the payload is copied into and out of shared memory on each hop |
//! | `iceoryx2`       | Eclipse iceoryx2's publish-subscribe, both sides busy-poll (see [`crate::peers`]) |
//!
//! # Session lifecycle
//!
//! A server serves exactly one benchmarking session and then exits:
//! * `uds` / `tcp`: the server accepts connections one at a time. A connection
//!   that closes before sending a single byte is treated as a readiness probe
//!   and the server keeps accepting; the first connection that exchanges data
//!   is the session, and when the client closes it the server exits.
//! * `spin-ring*`: the server exits when the client sets the stop flag in the
//!   shared mapping. [`ping`] always sets it when it returns (success or error).
//!
//! Servers also give up by themselves if their parent process goes away, so an
//! aborted benchmark never leaves a process spinning.
//!
//! # Shared-memory handoff (`spin-ring*`)
//!
//! The parent creates a memfd (`memfd_create("xio-bench-spin")`), sizes and
//! initialises it, clears `FD_CLOEXEC` on it just for the duration of the
//! `spawn`, and passes the *fd number* as the endpoint string. The child finds
//! the very same descriptor number open in its own table (fd numbers are
//! preserved across `fork`/`exec`), checks via `/proc/self/fd/<n>` that it is
//! the benchmark memfd, maps it `MAP_SHARED` and takes ownership of it.

use std::cell::UnsafeCell;
use std::fmt;
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4, TcpListener, TcpStream};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::ptr::{self, NonNull};
use std::sync::atomic::{AtomicI32, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, ensure, Context, Result};
use rustix::fs::MemfdFlags;
use rustix::io::{Errno, FdFlags};
use rustix::mm::{MapFlags, ProtFlags};
use rustix::process::Pid;

use crate::pin::pin_scoped;
use crate::uring::UringStream;

/// Which baseline transport to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, clap::ValueEnum)]
pub enum Baseline {
    /// Unix-domain stream socket; the endpoint is the socket path.
    Uds,
    /// TCP loopback (127.0.0.1) with `TCP_NODELAY`; the server picks a port
    /// and reports it as a `PORT <n>` line on stdout.
    Tcp,
    /// Shared-memory SPSC rings with busy-spinning on both sides, exchanging
    /// a 16-byte descriptor per message; the payload is never touched. This is
    /// the floor for a zero-copy design.
    SpinRing,
    /// Like [`Baseline::SpinRing`], but the sender copies the payload into a
    /// shared area and the receiver copies it out, to show what copying costs.
    /// Sizes up to 2 MiB (the payload area per direction).
    SpinRingCopy,
    /// iceoryx2's publish-subscribe (see [`crate::peers`]); the endpoint is
    /// the services' name prefix, and the server prints `READY`.
    Iceoryx2,
    /// As [`Baseline::Uds`], each read and write an io_uring request with
    /// its completion busy-polled (see [`crate::uring`]).
    IoUringUds,
    /// As [`Baseline::Tcp`], through io_uring as [`Baseline::IoUringUds`].
    IoUringTcp,
}

impl Baseline {
    /// The name used on the command line (the `clap::ValueEnum` name):
    /// `uds`, `tcp`, `spin-ring`, `spin-ring-copy`.
    pub fn name(self) -> &'static str {
        match self {
            Baseline::Uds => "uds",
            Baseline::Tcp => "tcp",
            Baseline::SpinRing => "spin-ring",
            Baseline::SpinRingCopy => "spin-ring-copy",
            Baseline::Iceoryx2 => "iceoryx2",
            Baseline::IoUringUds => "io-uring-uds",
            Baseline::IoUringTcp => "io-uring-tcp",
        }
    }
}

impl fmt::Display for Baseline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How long the parent waits for a freshly spawned server to become ready.
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the parent waits for a server to exit after the session ended.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);
/// While spinning, check the stop flag every this many empty polls.
const STOP_CHECK_MASK: u32 = (1 << 10) - 1;
/// While spinning, check that the peer process still exists every this many
/// empty polls (~1M; milliseconds to tens of milliseconds of spinning).
const PEER_CHECK_MASK: u32 = (1 << 20) - 1;

/// Runs in the child process: serves one benchmarking session, then returns.
///
/// * `endpoint` is the socket path for [`Baseline::Uds`] (a stale file at
///   that path is removed first, and the socket file is removed on exit),
///   ignored for [`Baseline::Tcp`] (the server binds 127.0.0.1:0 and prints
///   `PORT <n>` on stdout, flushed), and the inherited memfd's descriptor
///   number for [`Baseline::SpinRing`] / [`Baseline::SpinRingCopy`].
/// * `size` is the message size in bytes; it must match the client's.
///
/// Pinning is not done here: the caller pins first (see [`run_pair`]'s
/// `--cpu`), then calls `serve`.
///
/// # Errors
///
/// Setup failures (bad endpoint, bind failure, invalid mapping), I/O errors
/// in the middle of a session, or the parent process disappearing.
pub fn serve(b: Baseline, endpoint: &str, size: usize) -> Result<()> {
    ensure!(size > 0, "message size must be at least 1 byte");
    match b {
        Baseline::Uds => serve_uds(Path::new(endpoint), size, false),
        Baseline::Tcp => serve_tcp(size, false),
        Baseline::IoUringUds => serve_uds(Path::new(endpoint), size, true),
        Baseline::IoUringTcp => serve_tcp(size, true),
        Baseline::SpinRing => serve_spin(endpoint, size, false),
        Baseline::SpinRingCopy => serve_spin(endpoint, size, true),
        Baseline::Iceoryx2 => crate::peers::serve_iceoryx2(endpoint, size),
    }
    .with_context(|| format!("{b} server (endpoint {endpoint:?}, size {size})"))
}

/// Runs in the parent: connects to an already-running server (spawns nothing)
/// and does one verified round trip, `warmup` untimed round trips and then
/// `iters` timed round trips of `size` bytes each.
///
/// Returns the per-round-trip latencies in nanoseconds (`iters` samples).
///
/// * `endpoint`: socket path for [`Baseline::Uds`]; the port (`"40123"`) or a
///   full `"ip:port"` for [`Baseline::Tcp`]; for the spin rings, the number
///   of a memfd descriptor open in *this* process that the server mapped
///   (which the caller must keep open for the duration of the call).
///
/// Ends the session when it returns, so the server exits: the socket is
/// closed, or the shared stop flag is set.
///
/// # Errors
///
/// Connection/setup failures, I/O errors, a reply that does not echo the
/// request, or the server process disappearing.
pub fn ping(
    b: Baseline,
    endpoint: &str,
    size: usize,
    warmup: usize,
    iters: usize,
) -> Result<Vec<u64>> {
    ensure!(size > 0, "message size must be at least 1 byte");
    match b {
        Baseline::Uds | Baseline::IoUringUds => {
            let path = Path::new(endpoint);
            let stream = retry_connect(|| UnixStream::connect(path), None, READY_TIMEOUT)?;
            if b == Baseline::IoUringUds {
                let s = UringStream::new(stream).context("setting up an io_uring")?;
                return ping_stream(s, size, warmup, iters);
            }
            ping_stream(stream, size, warmup, iters)
        }
        Baseline::Tcp | Baseline::IoUringTcp => {
            let addr = parse_tcp_endpoint(endpoint)?;
            let stream = retry_connect(|| TcpStream::connect(addr), None, READY_TIMEOUT)?;
            stream.set_nodelay(true).context("setting TCP_NODELAY")?;
            if b == Baseline::IoUringTcp {
                let s = UringStream::new(stream).context("setting up an io_uring")?;
                return ping_stream(s, size, warmup, iters);
            }
            ping_stream(stream, size, warmup, iters)
        }
        Baseline::SpinRing | Baseline::SpinRingCopy => {
            let copy = b == Baseline::SpinRingCopy;
            let raw = parse_fd(endpoint)?;
            check_is_bench_memfd(raw)?;
            // SAFETY: `check_is_bench_memfd` verified that `raw` is open in this
            // process and is the benchmark memfd; the caller owns it and, as
            // documented, keeps it open for this call. The borrow is used only
            // for `fstat` + `mmap` inside `Mapping::map` and does not escape.
            let fd = unsafe { BorrowedFd::borrow_raw(raw) };
            let map = Mapping::map(fd)?;
            ping_spin(&map, copy, size, warmup, iters)
        }
        Baseline::Iceoryx2 => crate::peers::ping_iceoryx2(endpoint, size, warmup, iters),
    }
    .with_context(|| format!("{b} client (endpoint {endpoint:?}, size {size})"))
}

/// Convenience for the parent: sets up the endpoint, spawns the server,
/// waits until it is ready, runs [`ping`] (with the calling thread pinned to
/// `client_cpu` if `Some`; the previous affinity is restored afterwards),
/// ends the session and waits for the server to exit.
///
/// The server is `std::env::current_exe()` run with exactly these arguments:
///
/// ```text
/// <server_args...> --baseline <name> --endpoint <endpoint> --size <size> [--cpu <server_cpu>]
/// ```
///
/// * `<name>` is [`Baseline::name`]: `uds`, `tcp`, `spin-ring` or
///   `spin-ring-copy` (the `clap::ValueEnum` spelling).
/// * `<endpoint>` is a fresh socket path in the temp dir for `uds`
///   (`xio-bench-<pid>-<n>.sock`, removed afterwards), the literal `-` for
///   `tcp` (the server must print `PORT <n>` on stdout; any other stdout
///   lines are forwarded to our stderr prefixed with `[server]`), and the
///   decimal number of the inherited memfd for the spin rings.
/// * `<size>` is the decimal message size in bytes.
/// * `--cpu <n>` is appended only when `server_cpu` is `Some(n)`. The child is
///   expected to call [`crate::pin::pin_to_cpu`]`(n)` and then
///   [`serve`]`(baseline, endpoint, size)`.
///
/// The child's stdin is `/dev/null`, stderr is inherited, and stdout is
/// inherited except for `tcp` (piped, as above).
///
/// Readiness: for `uds`, the socket accepts a (probe) connection; for `tcp`,
/// the `PORT` line was read; for the spin rings, the server set the ready
/// flag in the shared mapping. Each wait gives up after 30 s or as soon as the
/// child exits. If anything fails, the child is killed and reaped.
///
/// # Errors
///
/// Spawn/setup failures, readiness timeouts, errors from [`ping`], or a
/// server that exits unsuccessfully (or does not exit within 10 s).
pub fn run_pair(
    b: Baseline,
    server_args: &[&str],
    server_cpu: Option<usize>,
    client_cpu: Option<usize>,
    size: usize,
    warmup: usize,
    iters: usize,
) -> Result<Vec<u64>> {
    ensure!(size > 0, "message size must be at least 1 byte");
    ensure!(
        b != Baseline::SpinRingCopy || size <= PAYLOAD_BYTES,
        "size {size} exceeds the {PAYLOAD_BYTES}-byte payload area of {b}"
    );
    let exe = std::env::current_exe().context("locating current executable")?;
    let mut cmd = Command::new(exe);
    cmd.args(server_args).stdin(Stdio::null());
    let add_args = |cmd: &mut Command, endpoint: &str| {
        cmd.args(["--baseline", b.name(), "--endpoint", endpoint])
            .arg("--size")
            .arg(size.to_string());
        if let Some(cpu) = server_cpu {
            cmd.arg("--cpu").arg(cpu.to_string());
        }
    };

    match b {
        Baseline::Uds | Baseline::IoUringUds => {
            let path = temp_socket_path();
            let _cleanup = RemoveOnDrop(path.clone());
            let _ = std::fs::remove_file(&path);
            let endpoint = path
                .to_str()
                .ok_or_else(|| anyhow!("temp socket path {path:?} is not UTF-8"))?;
            add_args(&mut cmd, endpoint);
            let mut child = ServerChild::spawn(&mut cmd)?;
            // Readiness probe: the server treats a connection that closes
            // without data as a probe and keeps accepting.
            let probe = retry_connect(
                || UnixStream::connect(&path),
                Some(&mut child),
                READY_TIMEOUT,
            )?;
            drop(probe);
            let res = {
                let _pin = pin_scoped(client_cpu).context("pinning client")?;
                ping(b, endpoint, size, warmup, iters)
            };
            child.finish(res)
        }
        Baseline::Tcp | Baseline::IoUringTcp => {
            add_args(&mut cmd, "-");
            cmd.stdout(Stdio::piped());
            let mut child = ServerChild::spawn(&mut cmd)?;
            let stdout = child
                .stdout()
                .ok_or_else(|| anyhow!("server stdout was not captured"))?;
            let port = read_port_line(stdout, &mut child)?;
            let res = {
                let _pin = pin_scoped(client_cpu).context("pinning client")?;
                ping(b, &port.to_string(), size, warmup, iters)
            };
            child.finish(res)
        }
        Baseline::Iceoryx2 => {
            static N: AtomicUsize = AtomicUsize::new(0);
            let endpoint = format!(
                "xio-bench-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::Relaxed)
            );
            add_args(&mut cmd, &endpoint);
            cmd.stdout(Stdio::piped());
            let mut child = ServerChild::spawn(&mut cmd)?;
            let stdout = child
                .stdout()
                .ok_or_else(|| anyhow!("server stdout was not captured"))?;
            read_tagged_line(stdout, &mut child, "READY")?;
            let res = {
                let _pin = pin_scoped(client_cpu).context("pinning client")?;
                ping(b, &endpoint, size, warmup, iters)
            };
            child.finish(res)
        }
        Baseline::SpinRing | Baseline::SpinRingCopy => {
            let copy = b == Baseline::SpinRingCopy;
            let (fd, map) = create_shm(copy)?;
            let raw = fd.as_raw_fd();
            add_args(&mut cmd, &raw.to_string());
            // Make the memfd inheritable only around the spawn, so it does not
            // leak into processes spawned later (other threads spawning in
            // this window would inherit it too; harmless for the benchmark).
            rustix::io::fcntl_setfd(&fd, FdFlags::empty()).context("clearing FD_CLOEXEC")?;
            let spawned = ServerChild::spawn(&mut cmd);
            rustix::io::fcntl_setfd(&fd, FdFlags::CLOEXEC).context("restoring FD_CLOEXEC")?;
            let mut child = spawned?;
            let ctrl = &map.header().ctrl.0;
            let ready = wait_ready(ctrl, Some(&mut child), READY_TIMEOUT);
            let res = ready.and_then(|()| {
                let _pin = pin_scoped(client_cpu).context("pinning client")?;
                ping(b, &raw.to_string(), size, warmup, iters)
            });
            // `ping` sets the stop flag itself; set it here too in case we
            // never got that far.
            // Release pairs with the server's Acquire load of `stop`.
            ctrl.stop.store(1, Ordering::Release);
            let res = child.finish(res);
            drop(map);
            drop(fd);
            res
        }
    }
}

// ---------------------------------------------------------------------------
// Socket baselines
// ---------------------------------------------------------------------------

/// `uring`: each read and write through an io_uring ([`UringStream`]).
fn serve_uds(path: &Path, size: usize, uring: bool) -> Result<()> {
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("removing stale {path:?}")),
    }
    let listener = UnixListener::bind(path).with_context(|| format!("binding {path:?}"))?;
    let _cleanup = RemoveOnDrop(path.to_path_buf());
    listener.set_nonblocking(true)?;
    let parent = rustix::process::getppid();
    loop {
        let stream = accept_or_orphaned(|| listener.accept().map(|(s, _)| s), parent)?;
        stream.set_nonblocking(false)?;
        if echo_maybe_uring(stream, size, uring)? > 0 {
            return Ok(());
        }
    }
}

/// [`echo_loop`] on `s`, through an io_uring if `uring`.
fn echo_maybe_uring<S: Read + Write + AsRawFd>(s: S, size: usize, uring: bool) -> Result<u64> {
    if uring {
        echo_loop(UringStream::new(s).context("setting up an io_uring")?, size)
    } else {
        echo_loop(s, size)
    }
}

/// `uring`: as for [`serve_uds`].
fn serve_tcp(size: usize, uring: bool) -> Result<()> {
    let listener = TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .context("binding 127.0.0.1:0")?;
    let port = listener.local_addr()?.port();
    {
        let mut out = io::stdout().lock();
        writeln!(out, "PORT {port}")?;
        out.flush()?;
    }
    listener.set_nonblocking(true)?;
    let parent = rustix::process::getppid();
    loop {
        let stream = accept_or_orphaned(|| listener.accept().map(|(s, _)| s), parent)?;
        stream.set_nonblocking(false)?;
        stream.set_nodelay(true).context("setting TCP_NODELAY")?;
        if echo_maybe_uring(stream, size, uring)? > 0 {
            return Ok(());
        }
    }
}

/// Polls a non-blocking `accept` until it yields a connection, bailing out if
/// our parent process goes away in the meantime.
fn accept_or_orphaned<S>(
    mut accept: impl FnMut() -> io::Result<S>,
    parent: Option<Pid>,
) -> Result<S> {
    loop {
        match accept() {
            Ok(s) => return Ok(s),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e).context("accept"),
        }
        if rustix::process::getppid() != parent {
            bail!("parent process exited before connecting");
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Echoes `size`-byte messages until the peer closes at a message boundary.
/// Returns the number of messages echoed.
pub(crate) fn echo_loop<S: Read + Write>(mut s: S, size: usize) -> Result<u64> {
    let mut buf = vec![0u8; size];
    let mut count = 0u64;
    loop {
        // The first read tells a clean close (EOF between messages) apart
        // from a truncated message.
        let n = match s.read(&mut buf) {
            Ok(0) => return Ok(count),
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).context("reading request"),
        };
        s.read_exact(&mut buf[n..]).context("reading request")?;
        s.write_all(&buf).context("writing reply")?;
        count += 1;
    }
}

/// Client side of the socket baselines.
fn ping_stream<S: Read + Write>(
    mut s: S,
    size: usize,
    warmup: usize,
    iters: usize,
) -> Result<Vec<u64>> {
    let tx = pattern(size);
    let mut rx = vec![0u8; size];

    // One verified round trip before anything is measured.
    s.write_all(&tx).context("writing request")?;
    s.read_exact(&mut rx).context("reading reply")?;
    ensure!(rx == tx, "server reply does not echo the request");

    for _ in 0..warmup {
        s.write_all(&tx).context("writing request")?;
        s.read_exact(&mut rx).context("reading reply")?;
    }

    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        s.write_all(&tx).context("writing request")?;
        s.read_exact(&mut rx).context("reading reply")?;
        samples.push(elapsed_ns(t0));
    }
    Ok(samples)
}

fn parse_tcp_endpoint(endpoint: &str) -> Result<SocketAddr> {
    if let Ok(port) = endpoint.parse::<u16>() {
        return Ok(SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port)));
    }
    endpoint
        .parse::<SocketAddr>()
        .with_context(|| format!("bad TCP endpoint {endpoint:?} (want a port or ip:port)"))
}

/// Reads the server's stdout until the `PORT <n>` line. The reader thread
/// keeps draining (and forwarding to stderr) whatever the server prints
/// afterwards so the server can never block on a full pipe.
pub(crate) fn read_port_line(
    stdout: std::process::ChildStdout,
    child: &mut ServerChild,
) -> Result<u16> {
    let rest = read_tagged_line(stdout, child, "PORT")?;
    rest.trim()
        .parse::<u16>()
        .with_context(|| format!("bad PORT line {rest:?}"))
}

/// Reads the server's stdout until a line that starts with `tag` (a word)
/// and returns the rest of it, as [`read_port_line`] does.
pub(crate) fn read_tagged_line(
    stdout: std::process::ChildStdout,
    child: &mut ServerChild,
    tag: &'static str,
) -> Result<String> {
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::Builder::new()
        .name("xio-bench-server-stdout".into())
        .spawn(move || {
            let mut tx = Some(tx);
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                let rest = line
                    .strip_prefix(tag)
                    .filter(|r| r.is_empty() || r.starts_with(' '));
                match (rest, tx.take()) {
                    (Some(rest), Some(tx)) => {
                        let _ = tx.send(rest.trim().to_owned());
                    }
                    (_, t) => {
                        tx = t;
                        eprintln!("[server] {line}");
                    }
                }
            }
        })
        .context("spawning stdout reader thread")?;
    match rx.recv_timeout(READY_TIMEOUT) {
        Ok(rest) => Ok(rest),
        Err(mpsc::RecvTimeoutError::Timeout) => {
            bail!("server printed no {tag} line within {READY_TIMEOUT:?}")
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            // stdout closed without the line: the server is exiting.
            let status = match child.wait_timeout(EXIT_TIMEOUT) {
                Ok(st) => st.to_string(),
                Err(e) => format!("{e:#}"),
            };
            bail!("server closed stdout without a {tag} line ({status})")
        }
    }
}

/// Retries `connect` until it succeeds, the timeout passes, or `child`
/// (if given) exits.
pub(crate) fn retry_connect<T>(
    mut connect: impl FnMut() -> io::Result<T>,
    mut child: Option<&mut ServerChild>,
    timeout: Duration,
) -> Result<T> {
    let deadline = Instant::now() + timeout;
    loop {
        let err = match connect() {
            Ok(s) => return Ok(s),
            Err(e) => e,
        };
        if let Some(child) = child.as_deref_mut() {
            if let Some(status) = child.try_wait()? {
                bail!("server exited before accepting a connection ({status})");
            }
        }
        if Instant::now() >= deadline {
            return Err(err).context(format!("server not connectable within {timeout:?}"));
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

pub(crate) fn temp_socket_path() -> PathBuf {
    static COUNTER: AtomicUsize = AtomicUsize::new(0);
    let name = format!(
        "xio-bench-{}-{}.sock",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    );
    let dir = std::env::temp_dir();
    // sun_path is 108 bytes; fall back to /tmp for very long TMPDIRs.
    let candidate = dir.join(&name);
    if candidate.as_os_str().len() < 100 {
        candidate
    } else {
        Path::new("/tmp").join(name)
    }
}

// ---------------------------------------------------------------------------
// Shared-memory spin rings
// ---------------------------------------------------------------------------

/// Descriptor slots per ring (power of two).
const RING_SLOTS: usize = 256;
/// Bytes of payload area per direction (spin-ring-copy's maximum `size`).
const PAYLOAD_BYTES: usize = 2 << 20;
/// Identifies an initialised benchmark mapping ("XIOBSPN1").
const SHM_MAGIC: u64 = u64::from_le_bytes(*b"XIOBSPN1");
/// memfd name; the child checks `/proc/self/fd/<n>` against it.
const MEMFD_NAME: &str = "xio-bench-spin";
/// `Control::mode` value for [`Baseline::SpinRing`].
const MODE_NO_COPY: u32 = 1;
/// `Control::mode` value for [`Baseline::SpinRingCopy`].
const MODE_COPY: u32 = 2;

/// Pads and aligns `T` to its own 128-byte block (two 64-byte lines, so the
/// adjacent-line prefetcher does not couple neighbours either).
#[repr(C, align(128))]
struct CacheLine<T>(T);

/// One single-producer single-consumer ring of 16-byte descriptors
/// (`[offset, len]` into the sender's payload area).
///
/// `head` and `tail` are free-running counters (never wrapped to the slot
/// count); the ring is empty when `head == tail` and full when
/// `tail - head == RING_SLOTS`.
#[repr(C)]
struct Ring {
    /// Number of descriptors consumed. Written only by the consumer.
    head: CacheLine<AtomicU64>,
    /// Number of descriptors produced. Written only by the producer.
    tail: CacheLine<AtomicU64>,
    /// Slot `i % RING_SLOTS` is owned by the producer while `i >= tail` and
    /// by the consumer while `head <= i < tail`.
    slots: [UnsafeCell<[u64; 2]>; RING_SLOTS],
}

/// Setup/teardown flags, written rarely (never on the hot path).
#[repr(C)]
struct Control {
    /// `SHM_MAGIC` once the parent initialised the mapping.
    magic: AtomicU64,
    /// `MODE_NO_COPY` or `MODE_COPY`.
    mode: AtomicU32,
    /// Server's pid, valid once `ready` is 1.
    server_pid: AtomicI32,
    /// Set to 1 by the server once it has attached.
    ready: AtomicU32,
    /// Set to 1 by the client to make the server exit.
    stop: AtomicU32,
}

/// Start of the memfd. Everything that both processes mutate concurrently is
/// an atomic or inside an `UnsafeCell`, so sharing `&Header` is sound.
#[repr(C)]
struct Header {
    ctrl: CacheLine<Control>,
    /// Client -> server.
    ping: Ring,
    /// Server -> client.
    pong: Ring,
}

const PAGE: usize = 4096;
/// Client -> server payload area (spin-ring-copy only).
const PING_PAYLOAD_OFF: usize = std::mem::size_of::<Header>().div_ceil(PAGE) * PAGE;
/// Server -> client payload area (spin-ring-copy only).
const PONG_PAYLOAD_OFF: usize = PING_PAYLOAD_OFF + PAYLOAD_BYTES;
/// Total memfd size.
const SHM_LEN: usize = PONG_PAYLOAD_OFF + PAYLOAD_BYTES;

// Layout checks: head and tail on their own 128-byte blocks, slots after them.
const _: () = {
    assert!(std::mem::offset_of!(Ring, head) == 0);
    assert!(std::mem::offset_of!(Ring, tail) == 128);
    assert!(std::mem::offset_of!(Ring, slots) == 256);
    assert!(std::mem::size_of::<Ring>() == 256 + RING_SLOTS * 16);
    assert!(std::mem::offset_of!(Header, ping) % 128 == 0);
    assert!(std::mem::offset_of!(Header, pong) % 128 == 0);
    assert!(std::mem::align_of::<Header>() <= PAGE);
    assert!(RING_SLOTS.is_power_of_two());
};

/// A `MAP_SHARED` read-write mapping of the whole benchmark memfd.
struct Mapping {
    base: NonNull<u8>,
}

impl Mapping {
    /// Maps `SHM_LEN` bytes of `fd`, which must be at least that long.
    fn map(fd: BorrowedFd<'_>) -> Result<Self> {
        let st = rustix::fs::fstat(fd).context("fstat on shared memory fd")?;
        ensure!(
            u64::try_from(st.st_size).unwrap_or(0) >= SHM_LEN as u64,
            "shared memory fd is {} bytes, expected at least {SHM_LEN}",
            st.st_size
        );
        // SAFETY: a null hint lets the kernel pick a fresh address range, so no
        // existing Rust object is affected. The file is at least SHM_LEN bytes
        // (checked above), so every mapped page is backed. The mapping is owned
        // by the returned `Mapping` and unmapped only in its `Drop`.
        let p = unsafe {
            rustix::mm::mmap(
                ptr::null_mut(),
                SHM_LEN,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                fd,
                0,
            )
        }
        .context("mmap of shared memory")?;
        let base = NonNull::new(p.cast::<u8>()).ok_or_else(|| anyhow!("mmap returned null"))?;
        Ok(Mapping { base })
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is SHM_LEN >= size_of::<Header>() bytes, page
        // aligned (>= align_of::<Header>()), and lives as long as `self`. The
        // memfd starts zero-filled and all-zero bytes are a valid `Header`
        // (atomics, integers, UnsafeCell<[u64; 2]>). Every field the other
        // process mutates concurrently is an atomic or inside an UnsafeCell,
        // so a shared reference is sound; a process is just another thread
        // as far as the memory model is concerned, and 64-bit atomics are
        // lock-free (address-free) wherever `AtomicU64` exists.
        unsafe { &*self.base.as_ptr().cast::<Header>() }
    }

    /// Start of a payload area (`PING_PAYLOAD_OFF` or `PONG_PAYLOAD_OFF`),
    /// `PAYLOAD_BYTES` long.
    fn payload(&self, off: usize) -> *mut u8 {
        self.base.as_ptr().wrapping_add(off)
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `base`/SHM_LEN is exactly the range mapped in `map`; all
        // references handed out by `header` borrow `self`, so none outlive it.
        let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), SHM_LEN) };
    }
}

/// Producer end of a [`Ring`], with the producer-local copy of `tail` and a
/// cached copy of the consumer's `head`.
struct Producer<'a> {
    ring: &'a Ring,
    tail: u64,
    head_cache: u64,
}

impl<'a> Producer<'a> {
    fn attach(ring: &'a Ring) -> Self {
        // Only the producer writes `tail`, so Relaxed reads our own value.
        let tail = ring.tail.0.load(Ordering::Relaxed);
        // Acquire pairs with the consumer's Release store of `head`.
        let head_cache = ring.head.0.load(Ordering::Acquire);
        Producer {
            ring,
            tail,
            head_cache,
        }
    }

    #[inline]
    fn try_push(&mut self, desc: [u64; 2]) -> bool {
        if self.tail.wrapping_sub(self.head_cache) >= RING_SLOTS as u64 {
            // Acquire pairs with the consumer's Release store of `head` in
            // `try_pop`: its read of a slot happens-before we reuse the slot.
            self.head_cache = self.ring.head.0.load(Ordering::Acquire);
            if self.tail.wrapping_sub(self.head_cache) >= RING_SLOTS as u64 {
                return false;
            }
        }
        let slot = &self.ring.slots[(self.tail as usize) & (RING_SLOTS - 1)];
        // SAFETY: slot `tail` is owned by the producer: the consumer only reads
        // slots below `tail`, and it released this slot (head > tail - SLOTS,
        // observed with Acquire above). We are the only producer.
        unsafe { slot.get().write(desc) };
        self.tail = self.tail.wrapping_add(1);
        // Release pairs with the consumer's Acquire load of `tail` in
        // `try_pop`: publishes the slot (and any payload bytes written before).
        self.ring.tail.0.store(self.tail, Ordering::Release);
        true
    }
}

/// Consumer end of a [`Ring`], with the consumer-local copy of `head` and a
/// cached copy of the producer's `tail`.
struct Consumer<'a> {
    ring: &'a Ring,
    head: u64,
    tail_cache: u64,
}

impl<'a> Consumer<'a> {
    fn attach(ring: &'a Ring) -> Self {
        // Only the consumer writes `head`, so Relaxed reads our own value.
        let head = ring.head.0.load(Ordering::Relaxed);
        // Acquire pairs with the producer's Release store of `tail`.
        let tail_cache = ring.tail.0.load(Ordering::Acquire);
        Consumer {
            ring,
            head,
            tail_cache,
        }
    }

    #[inline]
    fn try_pop(&mut self) -> Option<[u64; 2]> {
        if self.head == self.tail_cache {
            // Acquire pairs with the producer's Release store of `tail` in
            // `try_push`: the slot write (and payload) happen-before our read.
            self.tail_cache = self.ring.tail.0.load(Ordering::Acquire);
            if self.head == self.tail_cache {
                return None;
            }
        }
        let slot = &self.ring.slots[(self.head as usize) & (RING_SLOTS - 1)];
        // SAFETY: head < tail (observed with Acquire), so the producer
        // published this slot and will not touch it until we advance `head`.
        // We are the only consumer.
        let desc = unsafe { slot.get().read() };
        self.head = self.head.wrapping_add(1);
        // Release pairs with the producer's Acquire load of `head` in
        // `try_push`: our read of the slot happens-before its reuse.
        self.ring.head.0.store(self.head, Ordering::Release);
        Some(desc)
    }
}

/// Creates, sizes and initialises the benchmark memfd (with `FD_CLOEXEC`).
fn create_shm(copy: bool) -> Result<(OwnedFd, Mapping)> {
    let fd = rustix::fs::memfd_create(MEMFD_NAME, MemfdFlags::CLOEXEC).context("memfd_create")?;
    rustix::fs::ftruncate(&fd, SHM_LEN as u64).context("ftruncate memfd")?;
    let map = Mapping::map(fd.as_fd())?;
    let ctrl = &map.header().ctrl.0;
    let mode = if copy { MODE_COPY } else { MODE_NO_COPY };
    ctrl.mode.store(mode, Ordering::Relaxed);
    // Release pairs with the Acquire load of `magic` in `check_header` (the
    // spawn is a synchronisation point anyway).
    ctrl.magic.store(SHM_MAGIC, Ordering::Release);
    Ok((fd, map))
}

fn check_header(map: &Mapping, copy: bool) -> Result<()> {
    let ctrl = &map.header().ctrl.0;
    // Acquire pairs with the Release store of `magic` in `create_shm`.
    ensure!(
        ctrl.magic.load(Ordering::Acquire) == SHM_MAGIC,
        "shared memory is not an initialised xio-bench mapping"
    );
    let want = if copy { MODE_COPY } else { MODE_NO_COPY };
    let got = ctrl.mode.load(Ordering::Relaxed);
    ensure!(
        got == want,
        "shared memory was set up for mode {got}, but this side runs mode {want}"
    );
    Ok(())
}

fn parse_fd(endpoint: &str) -> Result<RawFd> {
    let fd: RawFd = endpoint
        .trim()
        .parse()
        .with_context(|| format!("spin-ring endpoint {endpoint:?} is not an fd number"))?;
    ensure!(fd >= 0, "negative fd {fd}");
    Ok(fd)
}

/// Verifies that `fd` is open in this process and is the benchmark memfd.
fn check_is_bench_memfd(fd: RawFd) -> Result<()> {
    let link = std::fs::read_link(format!("/proc/self/fd/{fd}")).with_context(|| {
        format!("fd {fd} is not open (was FD_CLOEXEC cleared before spawning?)")
    })?;
    let want = format!("/memfd:{MEMFD_NAME}");
    ensure!(
        link.to_str().is_some_and(|l| l.starts_with(&want)),
        "fd {fd} is {link:?}, not the {want} memfd"
    );
    Ok(())
}

/// Server side of the spin rings: takes ownership of the inherited memfd,
/// maps it, signals ready, then echoes descriptors until told to stop.
fn serve_spin(endpoint: &str, size: usize, copy: bool) -> Result<()> {
    ensure!(
        !copy || size <= PAYLOAD_BYTES,
        "size {size} exceeds the {PAYLOAD_BYTES}-byte payload area"
    );
    let raw = parse_fd(endpoint)?;
    check_is_bench_memfd(raw)?;
    // SAFETY: `raw` is open (checked above) and is the memfd our parent left
    // inheritable for us; no other object in this process owns it (it came
    // from exec, not from any Rust code here), so taking ownership is sound.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // Don't leak it into anything we might spawn.
    rustix::io::fcntl_setfd(&fd, FdFlags::CLOEXEC).context("setting FD_CLOEXEC")?;
    let map = Mapping::map(fd.as_fd())?;
    drop(fd); // the mapping keeps the memory alive
    check_header(&map, copy)?;

    let h = map.header();
    let ctrl = &h.ctrl.0;
    let parent = rustix::process::getppid();
    let mut rx = Consumer::attach(&h.ping);
    let mut tx = Producer::attach(&h.pong);
    let ping_area = map.payload(PING_PAYLOAD_OFF);
    let pong_area = map.payload(PONG_PAYLOAD_OFF);
    let mut buf = vec![0u8; if copy { size } else { 0 }];

    ctrl.server_pid
        .store(rustix::process::getpid().as_raw_pid(), Ordering::Relaxed);
    // Release pairs with the client's Acquire load of `ready` in
    // `wait_ready`: publishes `server_pid`.
    ctrl.ready.store(1, Ordering::Release);

    loop {
        // Wait for a request.
        let mut spins = 0u32;
        let desc = loop {
            if let Some(d) = rx.try_pop() {
                break d;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins & STOP_CHECK_MASK == 0 && server_should_exit(ctrl, parent, spins)? {
                return Ok(());
            }
        };

        if copy {
            let [off, len] = desc;
            let (off, len) = (off as usize, len as usize);
            ensure!(
                len <= buf.len() && off.checked_add(len).is_some_and(|e| e <= PAYLOAD_BYTES),
                "bad descriptor [{off}, {len}] (size {size})"
            );
            // SAFETY: off + len <= PAYLOAD_BYTES (checked), so the source lies in
            // the ping payload area; the client wrote it before publishing the
            // descriptor (Release/Acquire on ping.tail) and does not touch it
            // again until it has our reply. `buf` has >= len bytes and is a
            // separate allocation.
            unsafe { ptr::copy_nonoverlapping(ping_area.add(off), buf.as_mut_ptr(), len) };
            // SAFETY: len <= PAYLOAD_BYTES; the pong area is ours to write until
            // we publish the reply, since the client copied the previous reply
            // out before sending this request.
            unsafe { ptr::copy_nonoverlapping(buf.as_ptr(), pong_area, len) };
        }
        let reply = if copy { [0, desc[1]] } else { desc };

        let mut spins = 0u32;
        while !tx.try_push(reply) {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins & STOP_CHECK_MASK == 0 && server_should_exit(ctrl, parent, spins)? {
                return Ok(());
            }
        }
    }
}

/// Slow path of the server's spin loops: `Ok(true)` if the client asked us to
/// stop, an error if our parent is gone, `Ok(false)` to keep spinning.
#[cold]
#[inline(never)]
fn server_should_exit(ctrl: &Control, parent: Option<Pid>, spins: u32) -> Result<bool> {
    // Acquire pairs with the client's Release store of `stop`.
    if ctrl.stop.load(Ordering::Acquire) != 0 {
        return Ok(true);
    }
    if spins & PEER_CHECK_MASK == 0 && rustix::process::getppid() != parent {
        bail!("parent process exited; stopping");
    }
    Ok(false)
}

/// Waits until the server has attached (`ready == 1`), the timeout passes, or
/// `child` (if given) exits.
fn wait_ready(
    ctrl: &Control,
    mut child: Option<&mut ServerChild>,
    timeout: Duration,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        // Acquire pairs with the server's Release store of `ready`.
        if ctrl.ready.load(Ordering::Acquire) != 0 {
            return Ok(());
        }
        if let Some(child) = child.as_deref_mut() {
            if let Some(status) = child.try_wait()? {
                bail!("server exited before attaching to shared memory ({status})");
            }
        }
        ensure!(
            Instant::now() < deadline,
            "server did not attach to shared memory within {timeout:?}"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
}

/// Client side of the spin rings. Always sets the stop flag before returning.
fn ping_spin(
    map: &Mapping,
    copy: bool,
    size: usize,
    warmup: usize,
    iters: usize,
) -> Result<Vec<u64>> {
    check_header(map, copy)?;
    let ctrl = &map.header().ctrl.0;
    // `stop` is only ever written by clients (and the parent); Relaxed is
    // enough to detect a mapping whose session already ended.
    ensure!(
        ctrl.stop.load(Ordering::Relaxed) == 0,
        "this shared-memory session has already been stopped"
    );
    let res = ping_spin_inner(map, copy, size, warmup, iters);
    // Release pairs with the server's Acquire load of `stop` in
    // `server_should_exit`.
    ctrl.stop.store(1, Ordering::Release);
    res
}

fn ping_spin_inner(
    map: &Mapping,
    copy: bool,
    size: usize,
    warmup: usize,
    iters: usize,
) -> Result<Vec<u64>> {
    ensure!(
        !copy || size <= PAYLOAD_BYTES,
        "size {size} exceeds the {PAYLOAD_BYTES}-byte payload area"
    );
    let h = map.header();
    wait_ready(&h.ctrl.0, None, READY_TIMEOUT)?;
    // Published by the server before its Release store of `ready`, which
    // `wait_ready` observed with Acquire.
    let server_pid = h.ctrl.0.server_pid.load(Ordering::Relaxed);

    let mut c = SpinClient {
        tx: Producer::attach(&h.ping),
        rx: Consumer::attach(&h.pong),
        ping_area: map.payload(PING_PAYLOAD_OFF),
        pong_area: map.payload(PONG_PAYLOAD_OFF),
        copy,
        size,
        src: pattern(if copy { size } else { 0 }),
        dst: vec![0u8; if copy { size } else { 0 }],
        server_pid,
    };

    // One verified round trip before anything is measured.
    let reply = c.round_trip()?;
    ensure!(
        reply == [0, size as u64],
        "server echoed descriptor {reply:?}, expected [0, {size}]"
    );
    ensure!(
        c.dst == c.src,
        "server reply payload does not echo the request"
    );

    for _ in 0..warmup {
        c.round_trip()?;
    }
    let mut samples = Vec::with_capacity(iters);
    for _ in 0..iters {
        let t0 = Instant::now();
        c.round_trip()?;
        samples.push(elapsed_ns(t0));
    }
    Ok(samples)
}

/// Client state for the spin rings; all buffers are allocated up front.
struct SpinClient<'a> {
    tx: Producer<'a>,
    rx: Consumer<'a>,
    ping_area: *mut u8,
    pong_area: *mut u8,
    copy: bool,
    size: usize,
    src: Vec<u8>,
    dst: Vec<u8>,
    server_pid: i32,
}

impl SpinClient<'_> {
    /// Sends one request and spins for its reply; returns the reply
    /// descriptor.
    #[inline]
    fn round_trip(&mut self) -> Result<[u64; 2]> {
        if self.copy {
            // SAFETY: size <= PAYLOAD_BYTES (checked in `ping_spin_inner`) and
            // `src` holds `size` bytes. The server reads the ping area only
            // between our publishing a descriptor and its reply, and we are
            // past the previous reply, so nobody else accesses it now.
            unsafe { ptr::copy_nonoverlapping(self.src.as_ptr(), self.ping_area, self.size) };
        }
        let desc = [0, self.size as u64];
        let mut spins = 0u32;
        while !self.tx.try_push(desc) {
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins & PEER_CHECK_MASK == 0 {
                check_server_alive(self.server_pid)?;
            }
        }
        let mut spins = 0u32;
        let reply = loop {
            if let Some(d) = self.rx.try_pop() {
                break d;
            }
            std::hint::spin_loop();
            spins = spins.wrapping_add(1);
            if spins & PEER_CHECK_MASK == 0 {
                check_server_alive(self.server_pid)?;
            }
        };
        if self.copy {
            let [off, len] = reply;
            ensure!(
                off == 0 && len == self.size as u64,
                "bad reply descriptor {reply:?}"
            );
            // SAFETY: the server wrote `size` <= PAYLOAD_BYTES bytes at the
            // start of the pong area before publishing `reply` (Release/Acquire
            // on pong.tail) and won't write it again before our next request.
            // `dst` holds `size` bytes and is a separate allocation.
            unsafe { ptr::copy_nonoverlapping(self.pong_area, self.dst.as_mut_ptr(), self.size) };
            std::hint::black_box(&mut self.dst);
        }
        Ok(reply)
    }
}

/// Errors if the server process is gone (it no longer exists, or it is a
/// zombie waiting to be reaped, which `kill(pid, 0)` still reports as alive).
#[cold]
#[inline(never)]
fn check_server_alive(pid: i32) -> Result<()> {
    let Some(p) = Pid::from_raw(pid) else {
        bail!("invalid server pid {pid}");
    };
    if rustix::process::test_kill_process(p) == Err(Errno::SRCH) {
        bail!("server process {pid} is gone");
    }
    if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].trim_start().chars().next());
        if matches!(state, Some('Z' | 'X')) {
            bail!("server process {pid} has exited");
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// Shared helpers
// ---------------------------------------------------------------------------

/// A recognisable, non-constant byte pattern (so a wrong echo is detected and
/// pages are really touched).
pub(crate) fn pattern(size: usize) -> Vec<u8> {
    (0..size)
        .map(|i| (i.wrapping_mul(31) ^ (i >> 8)) as u8 | 1)
        .collect()
}

#[inline]
pub(crate) fn elapsed_ns(t0: Instant) -> u64 {
    u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX)
}

/// Nanoseconds from `a` to `b` (0 if `b` is not later).
pub(crate) fn ns_between(a: Instant, b: Instant) -> u64 {
    u64::try_from(b.saturating_duration_since(a).as_nanos()).unwrap_or(u64::MAX)
}

/// Removes a file when dropped (best effort).
pub(crate) struct RemoveOnDrop(pub(crate) PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// A spawned server process; killed and reaped on drop unless already reaped.
/// Also used by the X-IO pairs in [`crate::xio`].
pub(crate) struct ServerChild {
    child: Option<Child>,
    /// Exit status once reaped.
    status: Option<ExitStatus>,
    /// The process id.
    pid: u32,
}

impl ServerChild {
    pub(crate) fn spawn(cmd: &mut Command) -> Result<Self> {
        let child = cmd
            .spawn()
            .with_context(|| format!("spawning server {cmd:?}"))?;
        Ok(ServerChild {
            pid: child.id(),
            child: Some(child),
            status: None,
        })
    }

    pub(crate) fn stdout(&mut self) -> Option<std::process::ChildStdout> {
        self.child.as_mut()?.stdout.take()
    }

    /// The server's process id.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Non-blocking check whether the server has exited (reaping it if so).
    pub(crate) fn try_wait(&mut self) -> Result<Option<ExitStatus>> {
        if let Some(c) = self.child.as_mut() {
            if let Some(st) = c.try_wait().context("polling server process")? {
                self.child = None;
                self.status = Some(st);
            }
        }
        Ok(self.status)
    }

    /// Waits up to `timeout` for the child to exit, killing it after that.
    pub(crate) fn wait_timeout(&mut self, timeout: Duration) -> Result<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(st) = self.try_wait()? {
                return Ok(st);
            }
            if Instant::now() >= deadline {
                self.kill();
                bail!("server did not exit within {timeout:?}; killed it");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            self.status = c.wait().ok();
        }
    }

    /// Ends the pair after the client finished: waits for the server to exit
    /// and merges its exit status into the client's result.
    pub(crate) fn finish<T>(mut self, client: Result<T>) -> Result<T> {
        match client {
            Ok(samples) => {
                let st = self.wait_timeout(EXIT_TIMEOUT)?;
                ensure!(st.success(), "server exited with {st}");
                Ok(samples)
            }
            Err(e) => {
                let st = self.wait_timeout(Duration::from_secs(1));
                Err(match st {
                    Ok(st) => e.context(format!("server exited with {st}")),
                    Err(_) => e.context("server was still running; killed it"),
                })
            }
        }
    }
}

impl Drop for ServerChild {
    fn drop(&mut self) {
        self.kill();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    #[test]
    fn names_match_clap() {
        for b in Baseline::value_variants() {
            let pv = b.to_possible_value().unwrap();
            assert_eq!(pv.get_name(), b.name());
            assert_eq!(Baseline::from_str(b.name(), false).unwrap(), *b);
        }
    }

    #[test]
    fn ring_in_process() {
        let (_fd, map) = create_shm(false).unwrap();
        let h = map.header();
        let mut p = Producer::attach(&h.ping);
        let mut c = Consumer::attach(&h.ping);
        assert_eq!(c.try_pop(), None);
        for i in 0..RING_SLOTS as u64 {
            assert!(p.try_push([i, i * 2]));
        }
        assert!(!p.try_push([0, 0]), "ring should be full");
        for i in 0..RING_SLOTS as u64 {
            assert_eq!(c.try_pop(), Some([i, i * 2]));
        }
        assert_eq!(c.try_pop(), None);
        // Wrap around a few times.
        for i in 0..3 * RING_SLOTS as u64 {
            assert!(p.try_push([i, 7]));
            assert_eq!(c.try_pop(), Some([i, 7]));
        }
    }

    #[test]
    fn echo_over_socketpair() {
        let (a, b) = UnixStream::pair().unwrap();
        let server = std::thread::spawn(move || echo_loop(b, 4096).unwrap());
        let samples = ping_stream(a, 4096, 10, 100).unwrap();
        assert_eq!(samples.len(), 100);
        assert_eq!(server.join().unwrap(), 1 + 10 + 100);
    }

    #[test]
    fn tcp_endpoint_parsing() {
        assert_eq!(
            parse_tcp_endpoint("4242").unwrap(),
            "127.0.0.1:4242".parse().unwrap()
        );
        assert_eq!(
            parse_tcp_endpoint("127.0.0.2:9").unwrap(),
            "127.0.0.2:9".parse().unwrap()
        );
        assert!(parse_tcp_endpoint("nope").is_err());
    }
}

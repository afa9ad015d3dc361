//! X-IO for tokio services: [`XioListener`] and [`XioStream`], shaped like
//! `tokio::net::TcpListener` and `TcpStream`, over shared memory.
//!
//! ```no_run
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use xio_tokio::{XioListener, XioStream};
//!
//! # async fn run() -> std::io::Result<()> {
//! let listener = XioListener::bind("10.0.0.1:80").await?; // pool: $XIO_PREFIX or "xio"
//! tokio::spawn(async move {
//!     loop {
//!         let (mut s, _) = listener.accept().await.unwrap();
//!         tokio::spawn(async move {
//!             let mut buf = [0u8; 1024];
//!             while let Ok(n) = s.read(&mut buf).await {
//!                 if n == 0 || s.write_all(&buf[..n]).await.is_err() {
//!                     break;
//!                 }
//!             }
//!         });
//!     }
//! });
//! let mut s = XioStream::connect("10.0.0.1:80").await?;
//! s.write_all(b"hello").await?;
//! # Ok(()) }
//! ```
//!
//! # How it waits
//! Each [`Net`] used from a runtime gets one *driver* task: it waits for
//! the net's eventfd doorbell through the runtime's reactor
//! ([`tokio::io::unix::AsyncFd`]), drains the shared-memory rings when a
//! peer rings it, and wakes every task whose connection became ready in
//! one pass (batch wake-up). The `poll_*` functions never wait and never
//! spin; they register the task's waker.
//!
//! A net used from several runtimes (say concurrent `#[tokio::test]`s
//! sharing [`Net::global`]) gets a driver on the first runtime that
//! waits on it, and more where that one cannot serve. A driver on a
//! multi-thread runtime serves the tasks of every runtime, for as long as
//! its runtime lives. A current_thread runtime runs its driver only while
//! some thread is in its `block_on`, so that driver serves that runtime's
//! own tasks alone: a task of another runtime that waits starts a driver
//! on its own runtime. While a net has other drivers, a current_thread
//! runtime's does not watch the rings (below): its `block_on` may return
//! mid-watch, with the doorbell the others sleep on switched off. When a
//! runtime shuts down, its drivers end and wake every task waiting on
//! their nets, and those of the runtimes still running start a driver of
//! their own if they need one.
//!
//! The runtime needs its I/O and time drivers (`#[tokio::main]` and
//! `#[tokio::test]` enable both; a hand-built runtime needs `enable_all()`
//! or `enable_io().enable_time()`): the driver task waits on the doorbell
//! through the reactor and paces its retries with timers, and without a
//! time driver tokio panics at the first of them.
//!
//! Waking a parked worker thread costs about 30 µs on a VM, far more than
//! the shared-memory round trip. So before the driver sleeps on the
//! doorbell it keeps watching the rings for the adaptive policy's budget,
//! yielding to the runtime's other tasks between looks (never spinning
//! inside a poll), and only while a peer is awake on another core: idle,
//! or sharing one core with its peer, it sleeps at once. Asleep, it also
//! watches the manager ([`Net::manager_watch`]), so a dead manager is
//! noticed at once without a timer: an idle service makes no wake-ups.
//!
//! **Busy-poll**, for latency-critical services with a core to spare: a
//! [`Net`] built with `Net::builder(prefix).wait_mode(WaitMode::BusyPoll)`
//! makes its driver watch the rings without ever sleeping (off by default;
//! it keeps one worker busy).
//!
//! # Cancellation
//! `accept`, `read` (and every `AsyncRead` use) and `recv_buf`/`recv_bytes`
//! are cancellation safe: a dropped future loses nothing. So is `connect`
//! to an address connected to before; one that waits for the manager
//! (on a blocking thread) runs to its end when its future is dropped, and
//! the connection it made is closed at once (the listener may accept it
//! and read end-of-file). A dropped `XioListener::bind` likewise binds
//! and then unbinds; [`XioListener::bind_with`] leaves nothing behind.
//! `write` is as `AsyncWrite` always is (bytes reported written are sent;
//! a dropped future wrote nothing or a reported prefix). `send_buf` is not:
//! dropping its future drops the buffer unsent. `readable`, `writable`,
//! `ready` and `peek` are cancellation safe, as tokio's are.
//!
//! # Readiness and wake-ups, as tokio's
//! A stream keeps its read and write readiness until an operation meets
//! `WouldBlock` (tokio's `ScheduledIo` model): `readable()` after a
//! `read_exact` that took everything returns at once, and the `try_read`
//! after it says `WouldBlock`; an accepted stream starts read- and
//! write-ready, as tokio's accepted sockets do. Futures (`accept`,
//! `readable`, `writable`, `ready`, `peek`, `connected`) each keep their
//! own place among a stream's or listener's waiters until what they wait
//! for happens or they are dropped: every one is woken then, never
//! before. The `poll_*` methods keep the waker of the task that polled
//! last, as tokio's do.
//!
//! # Where it differs from tokio's `TcpStream`
//! Beyond what [`XioStream::connect`] says of a refusal (reported by the
//! first read, not by `connect`):
//! - A client's [`XioStream::local_addr`] is made from its process's
//!   stack id (X-IO clients do not bind), so its IP is not the
//!   listener's as on loopback TCP; any address can be bound, as X-IO
//!   addresses are names, not routes (a net built with
//!   `Net::builder(prefix).strict_addresses(true)`, or
//!   `$XIO_STRICT_ADDRESSES=1`, refuses other nodes' addresses as TCP
//!   does). An IPv4 client of a listener on `[::]` is accepted with IPv4
//!   addresses (Linux maps them into IPv6, `::ffff:a.b.c.d`).
//! - `set_nodelay`, `set_ttl` and `set_linger` are kept and reported as
//!   TCP reports them, but only a zero linger changes anything (a close
//!   with a reset): nothing is ever delayed and nothing routes these
//!   bytes. There is no `TcpSocket`; `from_std`/`into_std` convert to and
//!   from `xio_core`'s blocking types, not kernel sockets.
//! - [`XioStream::ready`] never reports `WRITE_CLOSED` (tokio reports it
//!   from Linux's `EPOLLHUP`: both directions shut, or a reset), and
//!   refuses `ERROR` (or `PRIORITY`) without `READABLE` or `WRITABLE`
//!   (`Unsupported`).
//! - A writer waits in the kernel with TCP. Here, what no peer signals,
//!   room in a full ring to a peer or a buffer in an exhausted pool, is
//!   looked for again on a timer (tokio's, about every millisecond) that
//!   wakes the tasks waiting for it. Readers that do not read can hold a
//!   pool's buffers (the default pool holds some 40 full windows of the
//!   default 2 MiB): while such a pool stays empty, its stalled writers
//!   cost a little CPU each millisecond, where TCP's sleep. Idle streams
//!   cost nothing.
//!
//! `tests/tokio_parity.rs` runs the same scenarios against tokio's TCP
//! and X-IO, comparing what a program sees, and pins the differences
//! above that a scenario can observe.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::net::ToSocketAddrs as AsyncToSocketAddrs;

use bytes::Bytes;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf, Ready};

pub use xio_core as core;
pub use xio_core::buf::{Buf, BufMut};
pub use xio_core::net::Net;
use xio_core::net::WaitEntry;

/// How often a busy driver reads the control socket on its own (a sleeping
/// one watches it instead), and a driver without a manager watch ticks.
const LIVENESS: Duration = Duration::from_secs(1);
/// Pause before retrying what nothing signals (a full ring, an empty pool).
const RETRY: Duration = Duration::from_micros(50);

/// The driver tasks of each net, by [`Net::id`]: usually one, more when
/// tasks of several runtimes use the net (see the crate docs).
struct Registry {
    drivers: HashMap<usize, NetDrivers>,
}

/// The drivers of one net.
struct NetDrivers {
    list: Vec<Arc<Driver>>,
    /// How many of its driver tasks exist (counted up before one is
    /// spawned, down when it ends or is dropped): a current_thread
    /// runtime's driver watches the rings only while it is alone (see
    /// [`drive`]).
    live: Arc<AtomicUsize>,
}

/// One driver task of a net.
struct Driver {
    /// Set while the task exists; cleared when its future ends or is
    /// dropped (its runtime shut down), see [`Running`].
    alive: AtomicBool,
    /// The runtime it was spawned on.
    runtime: tokio::runtime::Id,
    /// Whether it serves the tasks of every runtime. A multi-thread
    /// runtime's workers run it for as long as that runtime lives; a
    /// current_thread runtime runs it only while some thread is in that
    /// runtime's `block_on`, which is when (and only when) that runtime's
    /// own tasks run: it serves those alone.
    serves_all: bool,
}

impl Driver {
    /// Whether a task of runtime `current` (`None`: outside any runtime)
    /// may rely on this driver to wake it.
    fn serves(&self, current: impl FnOnce() -> Option<tokio::runtime::Id>) -> bool {
        // Acquire: partner of the Release in `Running::drop`.
        self.alive.load(Ordering::Acquire) && (self.serves_all || current() == Some(self.runtime))
    }
}

/// Owned by a driver task: marks its [`Driver`] dead when the task's
/// future ends or is dropped (its runtime shut down), then wakes every
/// task waiting on the net. Tasks of other runtimes may have relied on
/// this driver; woken, they poll again, find it dead and start one on
/// their own runtime (a task of the runtime that shut down is dropped
/// instead of polled).
struct Running {
    driver: Arc<Driver>,
    net: xio_core::net::WeakNet,
    /// Its net's [`NetDrivers::live`], counted down.
    live: Arc<AtomicUsize>,
}

impl Drop for Running {
    fn drop(&mut self) {
        // Release: partner of the Acquire in `Driver::serves`. The flag
        // guards no data; what matters is that a task woken below sees it
        // cleared, which the net's lock (taken by `wake_tasks`, then by
        // the woken task's poll) also ensures.
        self.driver.alive.store(false, Ordering::Release);
        let last = self.live.fetch_sub(1, Ordering::Relaxed) == 1;
        // Not the registry's lock: this may run inside `ensure_driver`,
        // which holds it (a spawn on a runtime that is shutting down drops
        // the future at once). No net lock is held here either: nothing
        // polls, spawns or drops a driver under it.
        if let Some(net) = self.net.upgrade() {
            net.wake_tasks();
        }
        // The runtime's tasks are being dropped with it, before or after
        // this: the streams they held close, their FINs maybe queued
        // behind a full ring. With no driver left to retry those sends,
        // the peers would wait for good (a net kept by `Net::global` is
        // never dropped, whose drop sends them).
        if last {
            flush_without_driver(self.net.clone(), self.live.clone());
        }
    }
}

/// How long the sends queued when a net's last driver ended are retried
/// for, off the runtime (see [`flush_without_driver`]). A peer that
/// drains its rings, however slowly it reads, takes them well within it.
const ORPHAN_FLUSH: Duration = Duration::from_secs(60);

/// How long [`flush_without_driver`] looks for sends to retry after it
/// last found some: the tasks of a runtime shutting down are dropped
/// (closing their streams) before or after its driver, within its drop.
const ORPHAN_GRACE: Duration = Duration::from_secs(1);

/// Retries, on a thread of its own, what a net queues behind full rings
/// once its last driver ended (its runtime shut down), as a kernel goes
/// on sending a closed socket's data: until a driver runs again (it
/// retries them), the net is dropped (its drop sends them), nothing was
/// queued for [`ORPHAN_GRACE`], or [`ORPHAN_FLUSH`] passes. Looks every
/// 10 ms at most (backing off from [`RETRY`]), so it costs next to
/// nothing meanwhile. A stream closed later than the grace, outside any
/// runtime, with its FIN behind a full ring, waits for the net's next use.
fn flush_without_driver(net: xio_core::net::WeakNet, live: Arc<AtomicUsize>) {
    let spawned = std::thread::Builder::new()
        .name("xio-tokio-flush".into())
        .spawn(move || {
            let start = std::time::Instant::now();
            let mut busy = start;
            let mut pause = RETRY;
            loop {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(10));
                let now = std::time::Instant::now();
                // Relaxed: a stale count costs one more look.
                if live.load(Ordering::Relaxed) > 0 || now >= start + ORPHAN_FLUSH {
                    return;
                }
                let Some(n) = net.upgrade() else { return };
                if !n.flush_queued() {
                    busy = now;
                } else if now >= busy + ORPHAN_GRACE {
                    return;
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "xio-tokio: no thread to send what waits behind full rings");
    }
}

thread_local! {
    /// The net this thread last found a driver for, and the process (fork
    /// generation) it was found in: every poll that returns `Pending`
    /// checks its driver, and one atomic load is all that check costs in
    /// the common case (one net per service, its driver on a multi-thread
    /// runtime). A current_thread runtime's driver also needs the
    /// current runtime's id (an `Arc` clone and drop in tokio).
    static LAST_DRIVER: RefCell<Option<(u32, usize, Arc<Driver>)>> = const { RefCell::new(None) };
}

/// Per process: a child forked while another thread held the lock gets
/// its own registry instead of a lock nobody will release.
static REGISTRY: xio_core::fork::PerProcess<Mutex<Registry>> =
    xio_core::fork::PerProcess::new(|| {
        Mutex::new(Registry {
            drivers: HashMap::new(),
        })
    });

fn registry() -> &'static Mutex<Registry> {
    REGISTRY.get()
}

/// Test hook: holds this process's driver registry locked until the
/// returned guard drops, as another thread may hold it when the process
/// forks. Not for applications.
#[doc(hidden)]
pub fn __hold_registry() -> Box<dyn std::any::Any> {
    Box::new(registry().lock().unwrap_or_else(|e| e.into_inner()))
}

/// The id of the runtime this thread is in, if any.
fn current_runtime() -> Option<tokio::runtime::Id> {
    tokio::runtime::Handle::try_current().ok().map(|h| h.id())
}

/// Makes sure `net` has a driver task that serves the current task: one
/// on a multi-thread runtime, or one on the current runtime; else starts
/// one on the current runtime.
///
/// A net may so get several drivers (tasks of a current_thread runtime
/// and of another runtime use it, or its driver's runtime shut down while
/// another's tasks use it). They share the net safely: `Net::drive`,
/// `watch_begin`, `watch_drain` and `watch_end` each run under the net's
/// lock, so the drains do not interleave, and a task's waker is woken by
/// whichever drains its connection. The doorbell is one eventfd: each
/// driver polls its own duplicate, so a ring makes every sleeping driver
/// readable, and the one that drives second finds little to do. Peers
/// ring it only while it is armed, and a driver disarms it (`watch_begin`,
/// or a `drive` that finds something as it arms) only to drive again
/// soon, arming it before it sleeps. "Soon" holds for a multi-thread
/// runtime's driver; a current_thread runtime's stops wherever it was
/// when its `block_on` returns, maybe for good, which would leave the
/// others asleep on a doorbell nobody rings. So such a driver, while the
/// net has other drivers, does not watch and rings the doorbell when it
/// finds it could not arm it (see [`drive`]). What overlapping watches
/// cost is the adaptive policy's learning (each watch carries the policy;
/// the later end wins) and, in busy-poll mode, a busy worker per
/// multi-thread runtime.
fn ensure_driver(net: &Net) -> io::Result<()> {
    let id = net.id();
    // A net's id cannot be reused while one of its drivers lives (the
    // driver's weak reference keeps the address), so a cached live driver
    // is proof.
    let gen = xio_core::fork::generation();
    let cached = LAST_DRIVER.with(|l| {
        l.borrow()
            .as_ref()
            .is_some_and(|(g, i, d)| *g == gen && *i == id && d.serves(current_runtime))
    });
    if cached {
        return Ok(());
    }
    let handle = tokio::runtime::Handle::try_current().ok();
    let current = handle.as_ref().map(tokio::runtime::Handle::id);
    let mut r = registry().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(d) = r
        .drivers
        .get(&id)
        .and_then(|ds| ds.list.iter().find(|d| d.serves(|| current)))
    {
        let d = d.clone();
        LAST_DRIVER.with(|l| *l.borrow_mut() = Some((gen, id, d)));
        return Ok(());
    }
    let handle = handle.ok_or_else(no_runtime)?;
    let bell = net.doorbell()?;
    // SAFETY: an `OwnedFd` is open and names the same eventfd for as long
    // as it lives, and the `AsyncFd` owns it.
    let fd = unsafe { AsyncFd::register_with_interest(bell, tokio::io::Interest::READABLE)? };
    // Without it (an epoll refused) the driver looks once a second.
    let manager = net
        .manager_watch()
        .and_then(|w| {
            // SAFETY: as for the doorbell: the `OwnedFd` names the same epoll
            // instance for as long as it lives, and the `AsyncFd` owns it.
            unsafe { AsyncFd::register_with_interest(w, tokio::io::Interest::READABLE) }
                .map_err(io::Error::from)
        })
        .map_err(|e| tracing::debug!(error = %e, "no manager watch; a liveness tick instead"))
        .ok();
    let weak = net.downgrade();
    let driver = Arc::new(Driver {
        alive: AtomicBool::new(true),
        runtime: handle.id(),
        serves_all: matches!(
            handle.runtime_flavor(),
            tokio::runtime::RuntimeFlavor::MultiThread
        ),
    });
    // Forget the drivers that ended, of every net (spawns are rare).
    // Relaxed: a stale "alive" only keeps an entry until the next spawn.
    r.drivers.retain(|_, ds| {
        ds.list.retain(|d| d.alive.load(Ordering::Relaxed));
        !ds.list.is_empty()
    });
    let entry = r.drivers.entry(id).or_insert_with(|| NetDrivers {
        list: Vec::new(),
        live: Arc::default(),
    });
    // Counted before the task can run (or be dropped, by a runtime
    // shutting down): see `drive` for why the order matters.
    entry.live.fetch_add(1, Ordering::Relaxed);
    let live = entry.live.clone();
    entry.list.push(driver.clone());
    let running = Running {
        driver: driver.clone(),
        net: weak.clone(),
        live: live.clone(),
    };
    // A multi-thread runtime polls its driver for as long as it lives.
    let suspendable = (!driver.serves_all).then_some(live);
    handle.spawn(async move {
        let _running = running;
        drive(weak, fd, manager, suspendable).await
    });
    LAST_DRIVER.with(|l| *l.borrow_mut() = Some((gen, id, driver)));
    Ok(())
}

/// How the driver yields to the runtime's other ready tasks between its
/// looks at the rings.
///
/// Mostly by waking itself, not with `tokio::task::yield_now`: that one
/// defers the task until the worker has polled the I/O driver, which with
/// nothing else to run is an `epoll_wait` system call (and two clock reads
/// of the scheduler's statistics) per look. A self-wake puts the task at
/// the back of the run queue instead (the multi-thread and current-thread
/// schedulers both treat it as a yield); the reactor is still polled at
/// every scheduler maintenance tick.
///
/// But the multi-thread scheduler also asks an idle worker to come and
/// steal each yield it queues, and a look lasts tens of nanoseconds. With
/// another worker parked, an axum app and a client making its requests
/// in `block_on`, both on `#[tokio::main]`'s default runtime on a 2-core
/// machine, did 4–8k requests/s, fewer than over TCP (8–10k). Yielding
/// the deferring way while another worker is parked took that to
/// 10–21k, and cost a client whose requests run in a spawned task about
/// 12% (median of five runs, 112k to 99k requests/s). Why the deferred
/// yield helps is not established: the idle worker wakes about as often
/// either way; the difference is a system call per yield. Runtimes with
/// one worker always wake the task (the benchmarks' figures did not
/// move).
struct Yielder {
    /// The runtime's metrics, when it has more than one worker (only the
    /// multi-thread scheduler unparks workers for a yield).
    metrics: Option<tokio::runtime::RuntimeMetrics>,
}

impl Yielder {
    /// The yielder of a task of the current runtime.
    fn new() -> Self {
        let handle = tokio::runtime::Handle::current();
        let multi = matches!(
            handle.runtime_flavor(),
            tokio::runtime::RuntimeFlavor::MultiThread
        );
        let metrics = handle.metrics();
        Self {
            metrics: (multi && metrics.num_workers() > 1).then_some(metrics),
        }
    }

    /// Whether a worker of the runtime is parked (this one runs, so it is
    /// another): a self-wake would unpark it.
    fn worker_parked(&self) -> bool {
        let Some(m) = &self.metrics else {
            return false;
        };
        #[cfg(target_has_atomic = "64")]
        {
            // An odd count: parked (tokio's documented encoding).
            (0..m.num_workers()).any(|i| m.worker_park_unpark_count(i) % 2 == 1)
        }
        #[cfg(not(target_has_atomic = "64"))]
        {
            let _ = m;
            true // no way to tell: never risk the unpark storm
        }
    }

    /// Yields once (see [`Yielder`]).
    async fn yield_now(&self) {
        if self.worker_parked() {
            tokio::task::yield_now().await;
            return;
        }
        let mut yielded = false;
        std::future::poll_fn(move |cx| {
            if yielded {
                return Poll::Ready(());
            }
            yielded = true;
            cx.waker().wake_by_ref();
            Poll::Pending
        })
        .await
    }
}

/// Looks at the rings a few times in a row (without yielding). A yield
/// to the runtime is a trip through its scheduler, a few hundred
/// nanoseconds when nothing else is ready: looking only once per trip
/// left an arrival waiting most of a trip to be seen. A few looks cost
/// tens of nanoseconds, also when other tasks are ready.
fn look_burst(w: &mut xio_core::net::Watcher) -> bool {
    for _ in 0..LOOKS_PER_YIELD {
        if w.has_input() {
            return true;
        }
    }
    false
}

/// Looks at the rings per yield of the driver (see [`look_burst`]).
const LOOKS_PER_YIELD: u32 = 8;

/// What ended the driver's sleep.
enum Woke {
    /// The doorbell rang.
    Bell,
    /// The manager queued a control message or went away.
    Manager,
    /// The manager's watch failed: look once, then tick instead.
    ManagerWatchFailed,
    /// The liveness tick (a driver without a manager watch).
    Tick,
}

/// The error of a call made outside a tokio runtime.
fn no_runtime() -> io::Error {
    io::Error::other("xio-tokio needs a tokio runtime (call it from within one)")
}

/// The addresses `addr` names, as `tokio::net::TcpStream::connect` finds
/// them: an `ip:port` at once, a host name looked up on tokio's blocking
/// threads (`tokio::net::lookup_host`), so a slow resolver does not hold
/// up the runtime.
async fn socket_addrs(addr: impl AsyncToSocketAddrs) -> io::Result<Vec<SocketAddr>> {
    // tokio's lookup panics outside a runtime; ours is an error.
    tokio::runtime::Handle::try_current().map_err(|_| no_runtime())?;
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr).await?.collect();
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "the address names no socket address",
        ));
    }
    Ok(addrs)
}

/// Connects to the first of `addrs` that connects without a wait on the
/// manager ([`Net::connect_known`]), trying them in order as
/// [`Net::connect`] does. `None` when one of them needs the manager
/// before any connected: the caller connects to the rest on a blocking
/// thread. (An error on an earlier address is then superseded, as
/// [`Net::connect`] reports the last.)
fn connect_known(net: &Net, addrs: &[SocketAddr]) -> Option<io::Result<xio_core::net::XioStream>> {
    let mut last = None;
    for a in addrs {
        match net.connect_known(*a) {
            Ok(Some(s)) => return Some(Ok(s)),
            Ok(None) => return None,
            Err(e) => last = Some(e),
        }
    }
    last.map(Err)
}

/// Runs `f`, which may wait on the manager, on tokio's blocking threads.
async fn on_blocking_thread<T: Send + 'static>(
    f: impl FnOnce() -> io::Result<T> + Send + 'static,
) -> io::Result<T> {
    let rt = tokio::runtime::Handle::try_current().map_err(|_| no_runtime())?;
    match rt.spawn_blocking(f).await {
        Ok(r) => r,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        Err(e) => Err(io::Error::other(e)),
    }
}

/// The driver task of one net (see the crate docs). `manager`: the net's
/// [`Net::manager_watch`], polled beside the doorbell while the driver
/// sleeps, so a sleeping driver needs no timer to notice a dead manager.
///
/// `suspendable`: the net's count of drivers ([`NetDrivers::live`]), for
/// a driver on a current_thread runtime. That runtime polls it only
/// while some thread is in its `block_on`, which may return at any of the
/// driver's yields and not come back for a long while (or ever, until the
/// runtime drops). A driver left there in a watch, or after a `drive`
/// that found the doorbell could not be armed, leaves the doorbell off:
/// the peers do not ring it, and another runtime's driver asleep on it
/// (its tasks too) waits for this runtime to run again. So while the net
/// has another driver, this one sleeps instead of watching (it drains at
/// every ring; the fast path, one driver per net or a multi-thread
/// runtime's, watches as before), and rings the doorbell itself when a
/// `drive` could not arm it, so the others drain what came. Counted
/// before a driver is spawned, it is seen by a watch that the new
/// driver's first `drive` (which arms the doorbell) does not follow:
/// both run under the net's lock, and the count is read after
/// `watch_begin`.
async fn drive(
    net: xio_core::net::WeakNet,
    fd: AsyncFd<std::os::fd::OwnedFd>,
    mut manager: Option<AsyncFd<std::os::fd::OwnedFd>>,
    suspendable: Option<Arc<AtomicUsize>>,
) {
    // Relaxed: see above (the net's lock orders what matters).
    let shared = || {
        suspendable
            .as_ref()
            .is_some_and(|live| live.load(Ordering::Relaxed) > 1)
    };
    let yielder = Yielder::new();
    let mut last_tick = std::time::Instant::now();
    let mut rung = true;
    let mut rounds = 0u32;
    let mut tick_due = false;
    let mut ctrl_due = false;
    // A token watch (sparse traffic, see `Drive::sparse`) just ended
    // empty: sleep now instead of watching again after re-arming.
    let mut token_watched = false;
    loop {
        let Some(mut n) = net.upgrade() else { return };
        // Clock reads are slow on VMs: look at the time now and then only.
        rounds = rounds.wrapping_add(1);
        let liveness = std::mem::take(&mut ctrl_due)
            || (tick_due || rounds % 64 == 0) && last_tick.elapsed() >= LIVENESS;
        tick_due = false;
        if liveness {
            last_tick = std::time::Instant::now();
        }
        let d = match n.drive(std::mem::take(&mut rung), liveness) {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "xio-tokio driver");
                drop(n);
                tokio::time::sleep(Duration::from_millis(1)).await;
                continue;
            }
        };
        if !d.armed && shared() {
            // Something came as we armed: we may yield below and not be
            // polled again for a while; the others must hear it.
            let _ = n.ring_doorbell();
        }
        if liveness && manager.is_some() && n.manager_gone() {
            // No manager to announce a peer's death any more: the tick
            // looks at the peers itself (`Stack` checks their pidfds).
            manager = None;
        }
        if d.retry {
            drop(n);
            tokio::time::sleep(RETRY).await;
            if let Some(n) = net.upgrade() {
                n.wake_retriers();
            }
            continue;
        }
        if !d.armed {
            drop(n);
            yielder.yield_now().await;
            continue;
        }
        if d.woke && !d.sparse {
            // Let the woken tasks run before choosing between watching and
            // sleeping. A request answered by one of them rings its peer,
            // which then counts as awake, so we watch for the reply. Deciding
            // first, while the peer still sleeps, would make both ends sleep
            // on every exchange (each sees the other asleep): the ~25 us
            // per request mode HTTP at one connection kept falling into.
            drop(n);
            yielder.yield_now().await;
            let Some(again) = net.upgrade() else { return };
            n = again;
        }
        // Before sleeping on the doorbell (a parked worker costs ~30 us to
        // wake on a VM), keep watching the rings for the adaptive budget,
        // yielding to the runtime's other tasks between looks. The budget
        // is zero unless a peer is awake on another core: idle, we sleep.
        //
        // With sparse traffic the budget is a token spin: one short watch,
        // in place (it keeps the policy learning: a reply that comes soon
        // after it grows the budget back), then sleep, so that the tasks
        // the drain woke run at once.
        let budget = if (std::mem::take(&mut token_watched) && d.sparse) || shared() {
            Duration::ZERO
        } else {
            n.spin_budget()
        };
        if !budget.is_zero() {
            // Under steady traffic the watch goes on from arrival to
            // arrival: each one is drained (waking its tasks) without
            // arming and disarming the doorbell or re-reading the budget;
            // the budget restarts at every arrival. It ends when nothing
            // came for a budget, now and then for the liveness tick, or
            // when something waits on a retry.
            let mut w = n.watch_begin();
            if shared() {
                // A driver of another runtime started meanwhile: its
                // first drive may have armed the doorbell before we
                // disarmed it. Arm it again (drive) and sleep.
                n.watch_end(w, true, Duration::ZERO);
                continue;
            }
            let began = std::time::Instant::now();
            // When the current budget started: read lazily (clock reads are
            // slow here), at the first time check after an arrival.
            let mut start = Some(began);
            let mut looks = 0u32;
            let hit = loop {
                if look_burst(&mut w) {
                    match n.watch_drain(&mut w) {
                        Ok(d) if !d.retry => {
                            start = None;
                            looks = 0;
                            // Let the woken tasks run before looking again.
                            yielder.yield_now().await;
                            continue;
                        }
                        _ => break true,
                    }
                }
                looks = looks.wrapping_add(1);
                if looks % 8 == 0 {
                    let since = *start.get_or_insert_with(std::time::Instant::now);
                    if since.elapsed() >= budget {
                        break false;
                    }
                    if last_tick.elapsed() >= LIVENESS {
                        tick_due = true;
                        break true;
                    }
                }
                if d.sparse {
                    // A token watch (see `Drive::sparse`): look without
                    // yielding, which would cost more than it watches.
                    std::hint::spin_loop();
                } else {
                    yielder.yield_now().await;
                }
            };
            n.watch_end(w, hit, start.unwrap_or(began).elapsed());
            token_watched = d.sparse && !hit;
            // Drive again: drains what came, handles a retry or the tick,
            // or re-arms the doorbell.
            continue;
        }
        drop(n);
        let woke = match &manager {
            Some(m) => sleep_on(&fd, m).await,
            None => match tokio::time::timeout(LIVENESS, fd.readable()).await {
                Ok(r) => r.map(|mut guard| {
                    guard.clear_ready();
                    Woke::Bell
                }),
                Err(_) => Ok(Woke::Tick),
            },
        };
        match woke {
            Ok(Woke::Bell) => rung = true,
            Ok(Woke::Manager) => ctrl_due = true,
            Ok(Woke::ManagerWatchFailed) => {
                manager = None;
                ctrl_due = true;
            }
            // Without a watch, look at the control socket at every tick
            // (this once waited for the 64th round's clock check: a dead
            // manager was noticed after ~64 s).
            Ok(Woke::Tick) => ctrl_due = true,
            Err(e) => {
                tracing::error!(error = %e, "xio-tokio: doorbell failed; driver stops");
                return;
            }
        }
    }
}

/// Sleeps until the doorbell rings or the manager's watch is readable,
/// with no timer. Clears the readiness it reports before the driver
/// reads, so what comes later is seen. Fails only if the doorbell does.
async fn sleep_on(
    bell: &AsyncFd<std::os::fd::OwnedFd>,
    manager: &AsyncFd<std::os::fd::OwnedFd>,
) -> io::Result<Woke> {
    std::future::poll_fn(|cx| {
        if let Poll::Ready(r) = bell.poll_read_ready(cx) {
            r?.clear_ready();
            return Poll::Ready(Ok(Woke::Bell));
        }
        if let Poll::Ready(r) = manager.poll_read_ready(cx) {
            return Poll::Ready(Ok(match r {
                Ok(mut g) => {
                    g.clear_ready();
                    Woke::Manager
                }
                Err(_) => Woke::ManagerWatchFailed,
            }));
        }
        Poll::Pending
    })
    .await
}

/// A listening socket, like `tokio::net::TcpListener`.
///
/// One bound with [`XioListener::bind`] (on the process-wide pool) follows
/// its manager across a restart, as `xio_core::net::XioListener::bind`'s
/// does: when the manager is gone, the next accept binds the same address
/// on a net attached to the new manager (trying again every 200 ms until
/// one runs, accepting on the old net meanwhile) and goes on accepting
/// there, so a service that only accepts (`axum::serve`) stays reachable.
/// Attaching and binding there are requests to the new manager, made on
/// tokio's blocking threads: one that is slow to answer does not hold up
/// the runtime.
/// Connections accepted before keep working on the old net; ones that had
/// arrived but were not yet accepted are reset.
#[derive(Debug)]
pub struct XioListener {
    inner: xio_core::net::XioListener,
    /// While the core listener waits for a new manager: the timer for its
    /// next attempt, and the tasks accepting meanwhile.
    retry: Mutex<Retry>,
}

#[derive(Debug, Default)]
struct Retry {
    /// The timer, and the runtime it was made on: a task of another
    /// runtime makes its own (tokio panics on polling a timer whose
    /// runtime was shut down, and a listener may outlive the runtime it
    /// first waited on).
    timer: Option<(tokio::runtime::Id, Pin<Box<tokio::time::Sleep>>)>,
    /// What the timer is polled with, so that it wakes every task
    /// accepting meanwhile: a timer wakes only the waker it was polled
    /// with last, and the task that polled it last may have stopped
    /// accepting (its accept future dropped), leaving the others asleep
    /// on the old net for good.
    waiters: Arc<Waiters>,
    /// The attempt to follow in progress, on a blocking thread: it
    /// attaches to the new manager and binds there, requests that wait
    /// for a slow (or stopped) manager.
    following: Option<tokio::task::JoinHandle<Option<Result<(), std::time::Instant>>>>,
}

/// Tasks woken together (see [`Retry::waiters`]).
#[derive(Debug, Default)]
struct Waiters(Mutex<Vec<std::task::Waker>>);

impl Waiters {
    fn add(&self, w: &std::task::Waker) {
        let mut ws = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if !ws.iter().any(|x| x.will_wake(w)) {
            ws.push(w.clone());
        }
    }

    fn wake_all(&self) {
        let ws = std::mem::take(&mut *self.0.lock().unwrap_or_else(|e| e.into_inner()));
        ws.into_iter().for_each(std::task::Waker::wake);
    }
}

impl std::task::Wake for Waiters {
    fn wake(self: Arc<Self>) {
        self.wake_all();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wake_all();
    }
}

impl XioListener {
    /// Binds `addr` on the process-wide pool ([`Net::global`], attached
    /// again if its manager was restarted). The listener follows the pool's
    /// manager across restarts (see [`XioListener`]).
    ///
    /// Binding is a request to the manager, made on tokio's blocking
    /// threads: a slow or stopped manager does not hold up this runtime.
    /// `addr` is what `tokio::net::TcpListener::bind` takes (a host name
    /// is looked up there too).
    pub async fn bind(addr: impl AsyncToSocketAddrs) -> io::Result<XioListener> {
        let addrs = socket_addrs(addr).await?;
        Self::from_std(
            on_blocking_thread(move || xio_core::net::XioListener::bind(&addrs[..])).await?,
        )
    }

    /// Binds `addr` on `net`. (Not async: binding is one request to the
    /// local manager, answered in microseconds, made on this thread; with
    /// a manager that may be slow, [`XioListener::bind`] or
    /// `spawn_blocking` keep the runtime's workers free.)
    pub fn bind_with(net: &Net, addr: impl ToSocketAddrs) -> io::Result<XioListener> {
        Self::from_std(net.listen(addr)?)
    }

    /// Wraps a listener made by `xio_core` (say with a backlog of its own,
    /// [`Net::listen_with_backlog`]), as `tokio::net::TcpListener::from_std`
    /// does. Must be called within a tokio runtime.
    pub fn from_std(inner: xio_core::net::XioListener) -> io::Result<XioListener> {
        ensure_driver(&inner.net())?;
        Ok(XioListener {
            inner,
            retry: Mutex::default(),
        })
    }

    /// The bound address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// The core listener back, in non-blocking mode (as
    /// `tokio::net::TcpListener::into_std` gives a std listener).
    pub fn into_std(self) -> io::Result<xio_core::net::XioListener> {
        self.inner.set_nonblocking(true)?;
        Ok(self.inner)
    }

    /// `IP_TTL` as set ([`xio_core::net::XioListener::ttl`]).
    pub fn ttl(&self) -> io::Result<u32> {
        self.inner.ttl()
    }

    /// Sets `IP_TTL`, which accepted streams start with
    /// ([`xio_core::net::XioListener::set_ttl`]; nothing routes these
    /// bytes).
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.inner.set_ttl(ttl)
    }

    /// Waits for a connection. Cancellation safe. Every task waiting in
    /// `accept` on the listener is woken when a connection comes (one of
    /// them takes it, the others wait on), as with tokio's.
    pub async fn accept(&self) -> io::Result<(XioStream, SocketAddr)> {
        let mut entry = WaitEntry::default();
        std::future::poll_fn(|cx| self.poll_accept_in(cx, Some(&mut entry))).await
    }

    /// Polls for a connection. As `tokio::net::TcpListener::poll_accept`,
    /// only the task that polled last is woken: tasks that share a
    /// listener wait in [`XioListener::accept`].
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(XioStream, SocketAddr)>> {
        self.poll_accept_in(cx, None)
    }

    fn poll_accept_in(
        &self,
        cx: &mut Context<'_>,
        entry: Option<&mut WaitEntry>,
    ) -> Poll<io::Result<(XioStream, SocketAddr)>> {
        // Follow first, even while clients still on the old net keep it
        // busy; until a new manager runs, accept there meanwhile.
        self.poll_follow(cx)?;
        let l = &self.inner;
        let p = match entry {
            Some(e) => l.poll_accept_entry(cx, e),
            None => l.poll_accept(cx),
        };
        let (s, a) = ready!(pending_needs_driver(&l.net(), p))?;
        // The core's own blocking calls (used by `alloc`) must not wait.
        s.set_nonblocking(true)?;
        Poll::Ready(Ok((
            XioStream {
                inner: s,
                syn: Arc::default(),
                // As tokio's accepted sockets: ready both ways until an
                // operation meets `WouldBlock` (see `XioStream::readable`).
                ready: [AtomicBool::new(true), AtomicBool::new(true)],
            },
            a,
        )))
    }

    /// The core listener's follow of a restarted manager, made on the
    /// blocking threads (it waits for the new manager), with the timer
    /// it needs while none runs yet. Meanwhile the caller accepts on the
    /// old net.
    fn poll_follow(&self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.inner.follows() || !self.inner.net().manager_gone() {
            return Ok(());
        }
        let rt = tokio::runtime::Handle::try_current().map_err(|_| no_runtime())?;
        let mut retry = self.retry.lock().unwrap_or_else(|e| e.into_inner());
        // Polled for every waiting task: the attempt's end and the timer
        // wake them all, this one too.
        retry.waiters.add(cx.waker());
        let all = std::task::Waker::from(retry.waiters.clone());
        let mut all = Context::from_waker(&all);
        loop {
            if let Some(h) = retry.following.as_mut() {
                let r = match std::future::Future::poll(Pin::new(h), &mut all) {
                    Poll::Pending => return Ok(()),
                    Poll::Ready(r) => r,
                };
                retry.following = None;
                match r {
                    // Followed (by another handle, if `None`: the net is
                    // a new one whose manager is there).
                    Ok(Some(Ok(())) | None) => {
                        ensure_driver(&self.inner.net())?;
                        retry.timer = None;
                        // Tasks waiting on the old net accept on the new one.
                        retry.waiters.wake_all();
                        return Ok(());
                    }
                    Ok(Some(Err(at))) => {
                        let at = tokio::time::Instant::from_std(at);
                        retry.timer = Some((rt.id(), Box::pin(tokio::time::sleep_until(at))));
                    }
                    Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
                    // Its runtime shuts down: try again.
                    Err(_) => {}
                }
            }
            if let Some((id, t)) = retry.timer.as_mut() {
                if *id != rt.id() {
                    let at = t.deadline();
                    retry.timer = Some((rt.id(), Box::pin(tokio::time::sleep_until(at))));
                }
                let (_, t) = retry.timer.as_mut().expect("just set");
                if std::future::Future::poll(t.as_mut(), &mut all).is_pending() {
                    return Ok(());
                }
                retry.timer = None;
            }
            // Due (the core says when not, and the timer waits for that).
            let l = self.inner.try_clone()?;
            retry.following = Some(rt.spawn_blocking(move || l.follow()));
        }
    }

    /// The core listener (which swaps its net when it follows a restart).
    pub fn as_core(&self) -> &xio_core::net::XioListener {
        &self.inner
    }
}

/// A connected stream, like `tokio::net::TcpStream`: `AsyncRead` and
/// `AsyncWrite` (vectored: header and body leave as one buffer when they
/// fit), plus zero-copy [`XioStream::recv_buf`] and [`XioStream::send_buf`].
/// Dropping it closes the connection (FIN, or RST with unread data).
#[derive(Debug)]
pub struct XioStream {
    inner: xio_core::net::XioStream,
    /// While its SYN may be unanswered: the route check a wait starts.
    syn: Arc<SynWatch>,
    /// Readiness kept as tokio keeps a socket's, by direction ([`READ`],
    /// [`WRITE`]): set when an operation or a readiness check finds that
    /// direction ready, and cleared only when an operation meets
    /// `WouldBlock` (see [`XioStream::readable`]). A flag each, so that
    /// setting and clearing are plain stores, not read-modify-writes.
    ready: [AtomicBool; 2],
}

/// A connecting stream's check of its SYN's route, started by its first
/// wait (a read, a write waiting for the window, ...) as a blocking
/// connect makes it: a process that stopped listening on the address and
/// makes no X-IO call any more never answers, so a task of the stream's
/// own asks the manager now and then (on the blocking threads) whether
/// the address is still that process's, and if not the connection is
/// refused, which wakes the waiting tasks. The waiting tasks themselves
/// are never woken for it.
#[derive(Debug, Default)]
struct SynWatch {
    /// Set until a wait finds the SYN answered (or refused): then the
    /// check costs a wait one atomic load.
    waiting: AtomicBool,
    /// Set while a watcher task runs ([`watch_syn`]).
    watching: AtomicBool,
}

/// Clears [`SynWatch::watching`] when the watcher ends, also when its
/// runtime shuts down and drops it: a wait on another runtime then starts
/// another.
struct Watching(Arc<SynWatch>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.watching.store(false, Ordering::Relaxed);
    }
}

/// Asks the manager now and then (2 ms, doubling up to 100 ms, as a
/// blocking connect does) whether `s`'s SYN still goes to a process that
/// owns its address, until the SYN is answered or refused or the stream
/// is dropped. A refusal resets the connection, which wakes its tasks.
async fn watch_syn(s: xio_core::net::WeakXioStream, flag: Watching) {
    let mut every = Duration::from_millis(2);
    loop {
        tokio::time::sleep(every).await;
        every = (every * 2).min(Duration::from_millis(100));
        let Some(strong) = s.upgrade() else { break };
        if strong.connect_settled() {
            flag.0.waiting.store(false, Ordering::Relaxed);
            break;
        }
        // The question may wait for the manager: off the runtime's
        // threads. Its answer needs no handling (see above).
        let asked = tokio::task::spawn_blocking(move || drop(strong.check_connect_route()));
        if asked.await.is_err() {
            break; // the runtime shuts down
        }
    }
    drop(flag);
}

impl TryFrom<xio_core::net::XioListener> for XioListener {
    type Error = io::Error;

    /// [`XioListener::from_std`].
    fn try_from(l: xio_core::net::XioListener) -> io::Result<XioListener> {
        XioListener::from_std(l)
    }
}

/// The read direction of [`XioStream::ready`] (see [`XioStream::readable`]).
const READ: usize = 0;
/// The write direction of [`XioStream::ready`].
const WRITE: usize = 1;

impl XioStream {
    /// Connects on the process-wide pool ([`Net::global`]). Returns once
    /// the SYN is on its way: writes may follow at once, and a refusal by
    /// the listening process shows as `ConnectionRefused` on the first
    /// read (an address nobody binds is refused here, by the manager).
    /// The pool's net is attached again if its manager was restarted.
    ///
    /// A connect to an address connected to before is made here at once;
    /// one the manager must resolve (the first to each address) waits for
    /// it on tokio's blocking threads, so a slow or stopped manager does
    /// not hold up this runtime. `addr` is anything
    /// `tokio::net::TcpStream::connect` takes (`"10.0.0.1:80"`,
    /// `("localhost", 80)`, a `SocketAddr`, ...); a host name is looked up
    /// on the blocking threads too, as tokio does.
    pub async fn connect(addr: impl AsyncToSocketAddrs) -> io::Result<XioStream> {
        let addrs = socket_addrs(addr).await?;
        if let Some(net) = Net::global_if_attached() {
            if let Some(r) = connect_known(&net, &addrs) {
                return Self::from_core(r?);
            }
        }
        Self::from_core(
            on_blocking_thread(move || xio_core::net::XioStream::connect(&addrs[..])).await?,
        )
    }

    /// Connects on `net` (as [`XioStream::connect`]: a connect that needs
    /// the manager waits for it on tokio's blocking threads).
    pub async fn connect_with(net: &Net, addr: impl AsyncToSocketAddrs) -> io::Result<XioStream> {
        let addrs = socket_addrs(addr).await?;
        if let Some(r) = connect_known(net, &addrs) {
            return Self::from_core(r?);
        }
        let net = net.clone();
        Self::from_core(on_blocking_thread(move || net.connect(&addrs[..])).await?)
    }

    fn from_core(inner: xio_core::net::XioStream) -> io::Result<XioStream> {
        ensure_driver(inner.net())?;
        // The core's own blocking calls (used by `alloc`) must not wait.
        inner.set_nonblocking(true)?;
        Ok(XioStream {
            inner,
            syn: Arc::new(SynWatch {
                waiting: AtomicBool::new(true),
                watching: AtomicBool::new(false),
            }),
            ready: [AtomicBool::new(false), AtomicBool::new(false)],
        })
    }

    /// Wraps a stream made by `xio_core` (connected, accepted, or taken
    /// back with [`XioStream::into_std`]), as
    /// `tokio::net::TcpStream::from_std` wraps a std stream: it is put in
    /// non-blocking mode, and the net gets a driver on this runtime. Must
    /// be called within a tokio runtime.
    pub fn from_std(inner: xio_core::net::XioStream) -> io::Result<XioStream> {
        Self::from_core(inner)
    }

    /// The core stream back, in non-blocking mode (as
    /// `tokio::net::TcpStream::into_std`; `set_nonblocking(false)` makes
    /// its reads and writes wait again).
    pub fn into_std(self) -> io::Result<xio_core::net::XioStream> {
        Ok(self.inner)
    }

    /// Notes what an operation on direction `dir` found: ready when it
    /// did something, not ready when it met `WouldBlock` (the only thing
    /// that clears a flag, as in tokio). Errors leave the flag alone: the
    /// next operation meets them again without waiting.
    fn note<T>(&self, dir: usize, r: io::Result<T>) -> io::Result<T> {
        match &r {
            Ok(_) => self.set_ready(dir),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.clear_ready(dir),
            Err(_) => {}
        }
        r
    }

    /// [`XioStream::note`] for a poll: `Pending` met `WouldBlock`.
    fn note_poll<T>(&self, dir: usize, p: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match &p {
            Poll::Pending => self.clear_ready(dir),
            Poll::Ready(Ok(_)) => self.set_ready(dir),
            Poll::Ready(Err(_)) => {}
        }
        p
    }

    // Relaxed: the flags are hints checked against the stream's real state
    // (a clear flag makes the check look at the net, under its lock), so a
    // stale flag costs a spurious readiness at most, which tokio allows.
    fn set_ready(&self, dir: usize) {
        // Looked at first: a store dirties the line even when it writes
        // the value already there, which is the usual case.
        if !self.ready[dir].load(Ordering::Relaxed) {
            self.ready[dir].store(true, Ordering::Relaxed);
        }
    }

    fn clear_ready(&self, dir: usize) {
        if self.ready[dir].load(Ordering::Relaxed) {
            self.ready[dir].store(false, Ordering::Relaxed);
        }
    }

    fn is_ready(&self, dir: usize) -> bool {
        self.ready[dir].load(Ordering::Relaxed)
    }

    /// [`pending_needs_driver`] for a wait on the stream, which while the
    /// SYN may be unanswered also starts the route check (see
    /// [`SynWatch`]). A ready result costs nothing, nor (beyond an atomic
    /// load) does a wait once the SYN was answered.
    fn pending<T>(&self, p: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        let p = pending_needs_driver(self.inner.net(), p);
        // Relaxed: the flag only saves the look below; the net's lock
        // orders what that look finds.
        if p.is_pending() && self.syn.waiting.load(Ordering::Relaxed) {
            self.watch_syn();
        }
        p
    }

    /// Starts the route check of a stream whose SYN is unanswered, unless
    /// it runs already.
    fn watch_syn(&self) {
        if self.inner.connect_settled() {
            // Answered or refused: waits are plain from now on.
            self.syn.waiting.store(false, Ordering::Relaxed);
            return;
        }
        // Outside a runtime (a multi-thread runtime's driver serves the
        // task) nothing can run it: the next wait in one starts it.
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return;
        };
        if self.syn.watching.swap(true, Ordering::Relaxed) {
            return;
        }
        let flag = Watching(self.syn.clone());
        rt.spawn(watch_syn(self.inner.downgrade(), flag));
    }

    /// Waits until the listener answered the SYN (`ConnectionRefused` if it
    /// refused). Optional: reads wait for it anyway.
    ///
    /// As a blocking connect does, once a wait (this one, or any read's or
    /// write's while the SYN is unanswered) found the SYN unanswered, the
    /// manager is asked now and then (on the blocking threads) whether the
    /// address still belongs to the process the SYN went to: a process
    /// that stopped listening there and makes no X-IO call any more would
    /// never answer, and the connection is refused instead of waiting for
    /// good.
    pub async fn connected(&self) -> io::Result<()> {
        let mut entry = WaitEntry::default();
        std::future::poll_fn(|cx| {
            let p = self.inner.poll_connected_entry(cx, &mut entry);
            self.pending(p)
        })
        .await
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        self.inner.peer_addr()
    }

    /// This end's address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }

    /// Sets `TCP_NODELAY`, for [`XioStream::nodelay`] to report. Both
    /// values behave the same: nothing is ever delayed, as with it on.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.inner.set_nodelay(nodelay)
    }

    /// What [`XioStream::set_nodelay`] was given last (false at first, as
    /// on a TCP socket).
    pub fn nodelay(&self) -> io::Result<bool> {
        self.inner.nodelay()
    }

    /// `SO_LINGER` as set (see [`XioStream::set_zero_linger`]).
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        self.inner.linger()
    }

    /// Sets `SO_LINGER` (see `xio_core::net::XioStream::set_linger`: zero
    /// closes with a reset; another duration lets the drop wait up to
    /// that long, on the dropping thread, for what waits behind a full
    /// ring). Deprecated in tokio for that wait; kept for ported code.
    #[deprecated = "a non-zero linger makes dropping the stream wait on the runtime's thread; use set_zero_linger for an abortive close"]
    pub fn set_linger(&self, dur: Option<Duration>) -> io::Result<()> {
        self.inner.set_linger(dur)
    }

    /// Closes with a reset when the stream is dropped, as tokio's
    /// `set_zero_linger`: the peer's reads see `ConnectionReset`, and what
    /// it had not read is dropped.
    pub fn set_zero_linger(&self) -> io::Result<()> {
        self.inner.set_linger(Some(Duration::ZERO))
    }

    /// `IP_TTL` as set (64 at first, or the listener's when accepted).
    pub fn ttl(&self) -> io::Result<u32> {
        self.inner.ttl()
    }

    /// Sets `IP_TTL` (1 to 255; nothing routes these bytes, so it changes
    /// nothing else).
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.inner.set_ttl(ttl)
    }

    /// The refusal or reset that ended the stream, if no read or write
    /// reported it yet, once (as `SO_ERROR`, which those calls clear):
    /// code ported from tokio or mio asks it whether a connect failed.
    /// See `xio_core::net::XioStream::take_error`.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        self.inner.take_error()
    }

    /// Receives into `buf` without taking the bytes off the stream (as
    /// `TcpStream::peek`): the next read returns them again. Waits for
    /// data; `Ok(0)` is end of stream. A reset is reported once, as by a
    /// read (and as Linux's peek does): then reads see end of stream.
    pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut entry = WaitEntry::default();
        std::future::poll_fn(|cx| self.poll_peek_in(cx, Some(&mut entry), buf)).await
    }

    /// Polls [`XioStream::peek`] (only the task that polled last is woken,
    /// as with tokio's `poll_peek`).
    pub fn poll_peek(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
        self.poll_peek_in(cx, None, buf)
    }

    fn poll_peek_in(
        &self,
        cx: &mut Context<'_>,
        entry: Option<&mut WaitEntry>,
        buf: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        // Into an empty buffer, as a socket's: waits for something to be
        // there (then 0), which the core's peek would not.
        let mut one = [0u8; 1];
        let into: &mut [u8] = if buf.is_empty() { &mut one } else { buf };
        let p = match entry {
            Some(e) => self.inner.poll_peek_entry(cx, e, into),
            None => self.inner.poll_peek(cx, into),
        };
        let p = self.pending(p);
        let empty = buf.is_empty();
        self.note_poll(READ, p)
            .map_ok(|n| if empty { 0 } else { n })
    }

    /// Waits until the stream is read-ready (as `TcpStream::readable`;
    /// then use [`XioStream::try_read`]). Readiness is kept as tokio keeps
    /// it: once bytes, end of stream or an error were seen, the stream
    /// stays read-ready until a read (or peek) meets `WouldBlock`, so this
    /// may return when a read would wait, and the read then says
    /// `WouldBlock` and the next `readable` waits. A freshly accepted
    /// stream starts read- and write-ready, as tokio's accepted sockets
    /// do. Every task waiting in `readable` (or `ready`) is woken when the
    /// stream becomes ready.
    pub async fn readable(&self) -> io::Result<()> {
        let mut entry = WaitEntry::default();
        std::future::poll_fn(|cx| self.poll_read_ready_in(cx, Some(&mut entry))).await
    }

    /// Polls [`XioStream::readable`] (as `TcpStream::poll_read_ready`:
    /// only the task that polled last is woken). Fails only when it cannot
    /// wait (no driver can serve the task, say outside any runtime), as a
    /// read would.
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_read_ready_in(cx, None)
    }

    fn poll_read_ready_in(
        &self,
        cx: &mut Context<'_>,
        entry: Option<&mut WaitEntry>,
    ) -> Poll<io::Result<()>> {
        if self.is_ready(READ) {
            return Poll::Ready(Ok(()));
        }
        let mut one = [0u8; 1];
        // The stream's error is the next read's to report; the missing
        // driver (`pending`) is this call's: reported as readiness, it
        // made a `readable().await?; try_read()` loop spin on `WouldBlock`.
        let p = match entry {
            Some(e) => self.inner.poll_peek_ready_entry(cx, e, &mut one),
            None => self.inner.poll_peek_ready(cx, &mut one),
        };
        let p = self.pending(p.map(|_| Ok(())));
        if let Poll::Ready(Ok(())) = p {
            self.set_ready(READ);
        }
        p
    }

    /// Waits until the stream is write-ready (as `TcpStream::writable`;
    /// then use [`XioStream::try_write`]): a write would take at least one
    /// byte, or fail. Kept as [`XioStream::readable`] keeps read
    /// readiness: until a write meets `WouldBlock`. When it is looked for,
    /// the window, the pool and the ring to the peer all have room, and
    /// the pool has a buffer for the write (set aside for it, unless the
    /// pool is too small to keep spares: then another writer may take it
    /// first, and `try_write` says `WouldBlock`, as tokio allows after a
    /// readiness event).
    pub async fn writable(&self) -> io::Result<()> {
        let mut entry = WaitEntry::default();
        std::future::poll_fn(|cx| self.poll_write_ready_in(cx, Some(&mut entry))).await
    }

    /// Polls [`XioStream::writable`] (as `TcpStream::poll_write_ready`:
    /// only the task that polled last is woken).
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_write_ready_in(cx, None)
    }

    fn poll_write_ready_in(
        &self,
        cx: &mut Context<'_>,
        entry: Option<&mut WaitEntry>,
    ) -> Poll<io::Result<()>> {
        if self.is_ready(WRITE) {
            return Poll::Ready(Ok(()));
        }
        let p = match entry {
            Some(e) => self.inner.poll_write_ready_entry(cx, e),
            None => self.inner.poll_write_ready(cx),
        };
        let p = self.pending(p);
        if let Poll::Ready(Ok(())) = p {
            self.set_ready(WRITE);
        }
        p
    }

    /// Waits until any of `interest` is ready (as `TcpStream::ready`):
    /// `READABLE` (with `READ_CLOSED` at end of stream or after a reset),
    /// `WRITABLE` (also when a write would fail: the write reports why;
    /// `WRITE_CLOSED` is not reported). With `ERROR` next to `READABLE`, a
    /// reset reports `ERROR` too; `ERROR` or `PRIORITY` alone is refused
    /// (`Unsupported`): there is no wait for an error alone. Readiness is
    /// kept until an operation meets `WouldBlock`, as
    /// [`XioStream::readable`] says, and is a hint, as with a socket:
    /// `try_read`/`try_write` may still say `WouldBlock`.
    pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
        if !interest.is_readable() && !interest.is_writable() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "an X-IO stream reports READABLE and WRITABLE readiness only",
            ));
        }
        let (mut er, mut ew) = (WaitEntry::default(), WaitEntry::default());
        std::future::poll_fn(|cx| {
            let mut ready = Ready::EMPTY;
            if interest.is_readable() {
                // Looked at even when the flag says ready: end of stream
                // and a reset show only there.
                let mut one = [0u8; 1];
                match self.inner.poll_peek_ready_entry(cx, &mut er, &mut one) {
                    Poll::Ready(Ok(0)) => ready |= Ready::READABLE | Ready::READ_CLOSED,
                    // A reset: as epoll reports one (IN, RDHUP, ERR).
                    Poll::Ready(Err(_)) => {
                        ready |= Ready::READABLE | Ready::READ_CLOSED;
                        if interest.is_error() {
                            ready |= Ready::ERROR;
                        }
                    }
                    Poll::Ready(Ok(_)) => ready |= Ready::READABLE,
                    // A missing driver is this call's error, not a reset
                    // (see `poll_read_ready`).
                    Poll::Pending => {
                        if let Poll::Ready(Err(e)) = self.pending(Poll::<io::Result<()>>::Pending) {
                            return Poll::Ready(Err(e));
                        }
                        if self.is_ready(READ) {
                            ready |= Ready::READABLE;
                        }
                    }
                }
                if ready.is_readable() {
                    self.set_ready(READ);
                }
            }
            if interest.is_writable() {
                if self.is_ready(WRITE) {
                    ready |= Ready::WRITABLE;
                } else {
                    // A write's error is the next write's to report (a
                    // missing driver is this call's).
                    let w = self.inner.poll_write_ready_entry(cx, &mut ew);
                    match self.pending(w.map(|_| Ok(()))) {
                        Poll::Ready(Ok(())) => {
                            self.set_ready(WRITE);
                            ready |= Ready::WRITABLE;
                        }
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => {}
                    }
                }
            }
            if ready.is_empty() {
                Poll::Pending
            } else {
                Poll::Ready(Ok(ready))
            }
        })
        .await
    }

    /// [`XioStream::try_read`] into several buffers (as
    /// `TcpStream::try_read_vectored`).
    pub fn try_read_vectored(&self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
        use std::io::Read;
        if bufs.iter().all(|b| b.is_empty()) {
            return self.try_read(&mut []);
        }
        let r = (&self.inner).read_vectored(bufs);
        self.note(READ, r)
    }

    /// [`XioStream::try_write`] from several buffers, in one descriptor
    /// when they fit a buffer (as `TcpStream::try_write_vectored`).
    pub fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
        use std::io::Write;
        let r = (&self.inner).write_vectored(bufs);
        if bufs.iter().all(|b| b.is_empty()) {
            return r;
        }
        self.note(WRITE, r)
    }

    /// Reads what is there without waiting: `WouldBlock` if nothing is
    /// (as `TcpStream::try_read`, also into an empty buffer), `Ok(0)` at
    /// end of stream.
    pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
        use std::io::Read;
        if buf.is_empty() {
            // As a socket's: `WouldBlock` while nothing is queued.
            let r = self.inner.peek(&mut [0u8; 1]).map(|_| 0);
            return self.note(READ, r);
        }
        let r = (&self.inner).read(buf);
        self.note(READ, r)
    }

    /// [`XioStream::try_read`] into a growable buffer's spare capacity
    /// (as `TcpStream::try_read_buf`): what is there is appended to `buf`
    /// (a `BytesMut` or `Vec<u8>`; one that is full grows first, as
    /// `BufMut::chunk_mut` does), with no zeroing first. `WouldBlock` if
    /// nothing is there, `Ok(0)` at end of stream.
    pub fn try_read_buf<B: bytes::BufMut>(&self, buf: &mut B) -> io::Result<usize> {
        let dst = buf.chunk_mut();
        // SAFETY: `read_uninit` only writes into the slice, never reads it
        // and never writes uninitialised bytes into it, which is all
        // `as_uninit_slice_mut` asks of its caller.
        let out = unsafe { dst.as_uninit_slice_mut() };
        let n = self.note(READ, self.inner.read_uninit(out))?;
        // SAFETY: `read_uninit` initialised the first `n` bytes of the
        // chunk, which is at least `n` long.
        unsafe { buf.advance_mut(n) };
        Ok(n)
    }

    /// Writes what the window and the pool take now, without waiting:
    /// `WouldBlock` if nothing can go (as `TcpStream::try_write`).
    pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
        use std::io::Write;
        let r = (&self.inner).write(buf);
        if buf.is_empty() {
            return r;
        }
        self.note(WRITE, r)
    }

    /// The next received pool buffer itself, without a copy (`None`: end
    /// of stream). Cancellation safe.
    pub async fn recv_buf(&self) -> io::Result<Option<Buf>> {
        std::future::poll_fn(|cx| self.poll_recv_buf(cx)).await
    }

    /// Polls for the next received pool buffer.
    pub fn poll_recv_buf(&self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Buf>>> {
        let p = self.inner.poll_recv_buf(cx);
        let p = self.pending(p);
        self.note_poll(READ, p)
    }

    /// The next received pool buffer as [`Bytes`], without a copy: the
    /// buffer returns to the pool when the last clone is dropped.
    pub async fn recv_bytes(&self) -> io::Result<Option<Bytes>> {
        Ok(self.recv_buf().await?.map(into_bytes))
    }

    /// A writable pool buffer of `len` bytes for [`XioStream::send_buf`];
    /// waits while the pool is exhausted.
    pub async fn alloc(&self, len: usize) -> io::Result<BufMut> {
        loop {
            match self.inner.alloc(len) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    tokio::time::sleep(RETRY).await;
                }
                r => return r,
            }
        }
    }

    /// Sends a pool buffer as the next bytes of the stream, without a
    /// copy. Not cancellation safe: a dropped future drops the buffer.
    pub async fn send_buf(&self, buf: BufMut) -> io::Result<()> {
        let mut slot = Some(buf);
        std::future::poll_fn(|cx| {
            let p = self.inner.poll_send_buf(cx, &mut slot);
            let p = self.pending(p);
            self.note_poll(WRITE, p)
        })
        .await
    }

    /// Splits into halves that borrow the stream.
    pub fn split(&mut self) -> (ReadHalf<'_>, WriteHalf<'_>) {
        (ReadHalf(self), WriteHalf(self))
    }

    /// Splits into owned halves (movable to other tasks). Dropping the
    /// write half shuts down writing, as tokio's `TcpStream` halves do.
    pub fn into_split(self) -> (OwnedReadHalf, OwnedWriteHalf) {
        let a = Arc::new(self);
        (OwnedReadHalf(a.clone()), OwnedWriteHalf(a))
    }

    /// The core stream.
    pub fn as_core(&self) -> &xio_core::net::XioStream {
        &self.inner
    }
}

impl TryFrom<xio_core::net::XioStream> for XioStream {
    type Error = io::Error;

    /// [`XioStream::from_std`].
    fn try_from(s: xio_core::net::XioStream) -> io::Result<XioStream> {
        XioStream::from_std(s)
    }
}

/// A received pool buffer as [`Bytes`] (no copy; back to the pool when
/// the last clone is dropped).
pub fn into_bytes(b: Buf) -> Bytes {
    Bytes::from_owner(b)
}

fn poll_read_core(
    s: &XioStream,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    // SAFETY: `poll_read_uninit` only writes into the slice (never reads
    // it or de-initialises anything), and reports how many bytes it wrote.
    let unfilled = unsafe { buf.unfilled_mut() };
    if unfilled.is_empty() {
        // As a socket's: waits for something to be there, then reads
        // nothing (an error there is reported, as by a read).
        return s.poll_peek_in(cx, None, &mut []).map_ok(drop);
    }
    let p = s.inner.poll_read_uninit(cx, unfilled);
    let p = s.pending(p);
    let n = ready!(s.note_poll(READ, p))?;
    // SAFETY: the first `n` bytes of the unfilled part were just written.
    unsafe { buf.assume_init(n) };
    buf.advance(n);
    Poll::Ready(Ok(()))
}

fn poll_write_core(
    s: &XioStream,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    let p = s.inner.poll_write_vectored(cx, bufs);
    let p = s.pending(p);
    if bufs.iter().all(|b| b.is_empty()) {
        return p;
    }
    s.note_poll(WRITE, p)
}

/// A task that will wait needs the net's driver to wake it: make sure it
/// runs (only then: a ready result needs nothing).
fn pending_needs_driver<T>(net: &Net, p: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
    if p.is_pending() {
        if let Err(e) = ensure_driver(net) {
            return Poll::Ready(Err(e));
        }
    }
    p
}

/// `poll_shutdown`: a reset stream's `NotConnected` is success, as tokio's
/// `TcpStream` has it since 1.46: the reset is the reads' to report, and
/// closing paths that shut down before they drop (hyper's) need no case
/// of their own. Writes after it fail with `BrokenPipe`, as TCP's.
fn shutdown_core(s: &xio_core::net::XioStream) -> Poll<io::Result<()>> {
    match s.shutdown(Shutdown::Write) {
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Poll::Ready(Ok(())),
        r => Poll::Ready(r),
    }
}

macro_rules! impl_async_io {
    ($t:ty) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                poll_read_core(self.stream(), cx, buf)
            }
        }
    };
    (write $t:ty) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                poll_write_core(self.stream(), cx, &[IoSlice::new(buf)])
            }
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                poll_write_core(self.stream(), cx, bufs)
            }
            fn is_write_vectored(&self) -> bool {
                true
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }
            fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                shutdown_core(self.stream().as_core())
            }
        }
    };
}

impl_async_io!(XioStream);
impl_async_io!(write XioStream);

/// The stream a half (or the stream itself) reads and writes through.
trait AsStream {
    fn stream(&self) -> &XioStream;
}

impl AsStream for XioStream {
    fn stream(&self) -> &XioStream {
        self
    }
}

macro_rules! as_stream {
    ($($t:ty),*) => {$(
        impl AsStream for $t {
            fn stream(&self) -> &XioStream {
                &self.0
            }
        }
    )*};
}

as_stream!(ReadHalf<'_>, WriteHalf<'_>, OwnedReadHalf, OwnedWriteHalf);

/// The read half of [`XioStream::split`].
#[derive(Debug)]
pub struct ReadHalf<'a>(&'a XioStream);
/// The write half of [`XioStream::split`].
#[derive(Debug)]
pub struct WriteHalf<'a>(&'a XioStream);
/// The read half of [`XioStream::into_split`].
#[derive(Debug)]
pub struct OwnedReadHalf(Arc<XioStream>);
/// The write half of [`XioStream::into_split`]; dropping it shuts down
/// writing (unless [`OwnedWriteHalf::forget`]).
#[derive(Debug)]
pub struct OwnedWriteHalf(Arc<XioStream>);

/// The methods of tokio's `TcpStream` halves, each as [`XioStream`]'s.
macro_rules! half_methods {
    (common $t:ty) => {
        impl $t {
            /// The peer's address ([`XioStream::peer_addr`]).
            pub fn peer_addr(&self) -> io::Result<SocketAddr> {
                self.0.peer_addr()
            }

            /// This end's address ([`XioStream::local_addr`]).
            pub fn local_addr(&self) -> io::Result<SocketAddr> {
                self.0.local_addr()
            }

            /// Waits for any of `interest` ([`XioStream::ready`]).
            pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
                self.0.ready(interest).await
            }
        }

        impl AsRef<XioStream> for $t {
            fn as_ref(&self) -> &XioStream {
                &self.0
            }
        }
    };
    (read $t:ty) => {
        half_methods!(common $t);
        impl $t {
            /// Waits until a read would not wait ([`XioStream::readable`]).
            pub async fn readable(&self) -> io::Result<()> {
                self.0.readable().await
            }

            /// Polls [`XioStream::readable`] ([`XioStream::poll_read_ready`]).
            pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.0.poll_read_ready(cx)
            }

            /// Reads what is there without waiting ([`XioStream::try_read`]).
            pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
                self.0.try_read(buf)
            }

            /// [`XioStream::try_read_vectored`].
            pub fn try_read_vectored(&self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
                self.0.try_read_vectored(bufs)
            }

            /// [`XioStream::try_read_buf`].
            pub fn try_read_buf<B: bytes::BufMut>(&self, buf: &mut B) -> io::Result<usize> {
                self.0.try_read_buf(buf)
            }

            /// Receives without taking the bytes off ([`XioStream::peek`]).
            pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
                self.0.peek(buf).await
            }

            /// Polls [`XioStream::peek`].
            pub fn poll_peek(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
                self.0.poll_peek(cx, buf)
            }
        }
    };
    (write $t:ty) => {
        half_methods!(common $t);
        impl $t {
            /// Waits until a write would not wait ([`XioStream::writable`]).
            pub async fn writable(&self) -> io::Result<()> {
                self.0.writable().await
            }

            /// Polls [`XioStream::writable`] ([`XioStream::poll_write_ready`]).
            pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.0.poll_write_ready(cx)
            }

            /// Writes what can go now without waiting ([`XioStream::try_write`]).
            pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
                self.0.try_write(buf)
            }

            /// [`XioStream::try_write_vectored`].
            pub fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
                self.0.try_write_vectored(bufs)
            }
        }
    };
}

half_methods!(read ReadHalf<'_>);
half_methods!(write WriteHalf<'_>);
half_methods!(read OwnedReadHalf);
half_methods!(write OwnedWriteHalf);

impl_async_io!(ReadHalf<'_>);
impl_async_io!(write WriteHalf<'_>);
impl_async_io!(OwnedReadHalf);
impl_async_io!(write OwnedWriteHalf);

impl OwnedReadHalf {
    /// Puts the halves back together (they must come from one stream).
    pub fn reunite(self, w: OwnedWriteHalf) -> Result<XioStream, (OwnedReadHalf, OwnedWriteHalf)> {
        if !Arc::ptr_eq(&self.0, &w.0) {
            return Err((self, w));
        }
        let a = self.0.clone();
        drop(self);
        let w = std::mem::ManuallyDrop::new(w);
        // SAFETY: `w` is never used or dropped again; its Arc is moved out
        // once (so its write-half Drop, a shutdown, does not run).
        drop(unsafe { std::ptr::read(&w.0) });
        match Arc::try_unwrap(a) {
            Ok(s) => Ok(s),
            Err(_) => unreachable!("both halves were given back"),
        }
    }
}

impl OwnedWriteHalf {
    /// Puts the halves back together ([`OwnedReadHalf::reunite`]).
    pub fn reunite(self, r: OwnedReadHalf) -> Result<XioStream, (OwnedReadHalf, OwnedWriteHalf)> {
        r.reunite(self)
    }

    /// Drops the half without shutting down writing (as tokio's
    /// `OwnedWriteHalf::forget`): the stream stays open for writes until
    /// the read half goes too.
    pub fn forget(self) {
        let w = std::mem::ManuallyDrop::new(self);
        // SAFETY: `w` is never used or dropped again; its Arc is moved out
        // once (so the shutdown of its Drop does not run).
        drop(unsafe { std::ptr::read(&w.0) });
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        let _ = self.0.as_core().shutdown(Shutdown::Write);
    }
}

/// Whether an accept error concerns the one connection (gone before it
/// was taken), not the listener: an accept loop skips it and goes on,
/// where another error (out of fds, say) calls for a pause first.
pub fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

/// `axum::serve(listener, app)` over X-IO (feature `axum`).
///
/// For `ConnectInfo<SocketAddr>` (axum implements `Connected` for its own
/// `TcpListener` only, and Rust's coherence rules keep this crate from
/// adding one for this listener), tap the listener with a no-op: axum's
/// impl for any tapped listener applies.
///
/// ```no_run
/// use axum::serve::ListenerExt;
/// # async fn run(app: axum::Router) -> std::io::Result<()> {
/// let listener = xio_tokio::XioListener::bind("0.0.0.0:3000").await?;
/// axum::serve(
///     listener.tap_io(|_| {}),
///     app.into_make_service_with_connect_info::<std::net::SocketAddr>(),
/// )
/// .await?;
/// # Ok(()) }
/// ```
#[cfg(feature = "axum")]
impl axum::serve::Listener for XioListener {
    type Io = XioStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (XioStream, SocketAddr) {
        loop {
            match XioListener::accept(self).await {
                Ok(x) => return x,
                // As axum does for TCP: one connection's trouble is
                // skipped; anything else (out of fds, say) is logged and
                // waited out for a second, not retried in a tight loop.
                Err(e) if is_connection_error(&e) => {}
                Err(e) => {
                    tracing::error!(error = %e, "accept failed; retrying in 1 s");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        XioListener::local_addr(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtimes_of_one_worker_yield_by_waking_the_task() {
        let ct = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        ct.block_on(async { assert!(Yielder::new().metrics.is_none()) });
        let one = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .build()
            .unwrap();
        one.block_on(async {
            tokio::spawn(async { assert!(Yielder::new().metrics.is_none()) })
                .await
                .unwrap()
        });
    }

    /// The choice between the two ways of yielding rests on tokio's
    /// documented encoding of a worker's state in its park/unpark count
    /// (odd: parked). A runtime whose second worker has nothing to do must
    /// show it parked, or the driver would go back to waking itself while
    /// that worker sleeps.
    #[cfg(target_has_atomic = "64")]
    #[test]
    fn an_idle_second_worker_is_seen_parked() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .build()
            .unwrap();
        rt.block_on(async {
            tokio::spawn(async {
                let y = Yielder::new();
                assert!(y.metrics.is_some());
                // A watchdog, not a time bound: the idle worker parks
                // within microseconds of the runtime's start.
                let mut looks = 0u32;
                while !y.worker_parked() {
                    looks += 1;
                    assert!(looks < 100_000, "the idle worker never showed as parked");
                    std::thread::sleep(Duration::from_micros(100));
                }
                // This worker runs (an even count), so the parked one is
                // the other.
                let m = y.metrics.as_ref().unwrap();
                let parked = (0..m.num_workers())
                    .filter(|&i| m.worker_park_unpark_count(i) % 2 == 1)
                    .count();
                assert_eq!(parked, 1);
            })
            .await
            .unwrap();
        });
    }
}

//! The driver task of each net: one per net and runtime, draining the
//! rings and waking the tasks whose streams became ready, watching the
//! rings for the adaptive budget before it sleeps on the doorbell (see
//! the crate docs); and what the connecting paths share with it.

use super::*;

/// How often a busy driver reads the control socket on its own (a sleeping
/// one watches it instead), and a driver without a manager watch ticks.
pub(crate) const LIVENESS: Duration = Duration::from_secs(1);
/// Pause before retrying what nothing signals (a full ring, an empty pool).
pub(crate) const RETRY: Duration = Duration::from_micros(50);

/// The driver tasks of each net, by [`Net::id`]: usually one, more when
/// tasks of several runtimes use the net (see the crate docs).
pub(crate) struct Registry {
    drivers: HashMap<usize, NetDrivers>,
}

/// The drivers of one net.
pub(crate) struct NetDrivers {
    list: Vec<Arc<Driver>>,
    /// How many of its driver tasks exist (counted up before one is
    /// spawned, down when it ends or is dropped): a current_thread
    /// runtime's driver watches the rings only while it is alone (see
    /// [`drive`]).
    live: Arc<AtomicUsize>,
}

/// One driver task of a net.
pub(crate) struct Driver {
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
pub(crate) struct Running {
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
pub(crate) const ORPHAN_FLUSH: Duration = Duration::from_secs(60);

/// How long [`flush_without_driver`] looks for sends to retry after it
/// last found some: the tasks of a runtime shutting down are dropped
/// (closing their streams) before or after its driver, within its drop.
pub(crate) const ORPHAN_GRACE: Duration = Duration::from_secs(1);

/// Retries, on a thread of its own, what a net queues behind full rings
/// once its last driver ended (its runtime shut down), as a kernel goes
/// on sending a closed socket's data: until a driver runs again (it
/// retries them), the net is dropped (its drop sends them), nothing was
/// queued for [`ORPHAN_GRACE`], or [`ORPHAN_FLUSH`] passes. Looks every
/// 10 ms at most (backing off from [`RETRY`]), so it costs next to
/// nothing meanwhile. A stream closed later than the grace, outside any
/// runtime, with its FIN behind a full ring, waits for the net's next use.
pub(crate) fn flush_without_driver(net: xio_core::net::WeakNet, live: Arc<AtomicUsize>) {
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
pub(crate) static REGISTRY: xio_core::fork::PerProcess<Mutex<Registry>> =
    xio_core::fork::PerProcess::new(|| {
        Mutex::new(Registry {
            drivers: HashMap::new(),
        })
    });

pub(crate) fn registry() -> &'static Mutex<Registry> {
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
pub(crate) fn current_runtime() -> Option<tokio::runtime::Id> {
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
pub(crate) fn ensure_driver(net: &Net) -> io::Result<()> {
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
/// machine, did fewer requests a second than over TCP. Yielding the
/// deferring way while another worker is parked more than doubled that,
/// and cost a client whose requests run in a spawned task about a tenth.
/// Why the deferred
/// yield helps is not established: the idle worker wakes about as often
/// either way; the difference is a system call per yield. Runtimes with
/// one worker always wake the task (the benchmarks' figures did not
/// move).
pub(crate) struct Yielder {
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
pub(crate) fn look_burst(w: &mut xio_core::net::Watcher) -> bool {
    for _ in 0..LOOKS_PER_YIELD {
        if w.has_input() {
            return true;
        }
    }
    false
}

/// Looks at the rings per yield of the driver (see [`look_burst`]).
pub(crate) const LOOKS_PER_YIELD: u32 = 8;

/// What ended the driver's sleep.
pub(crate) enum Woke {
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
pub(crate) fn no_runtime() -> io::Error {
    io::Error::other("xio-tokio needs a tokio runtime (call it from within one)")
}

/// The addresses `addr` names, as `tokio::net::TcpStream::connect` finds
/// them: an `ip:port` at once, a host name looked up on tokio's blocking
/// threads (`tokio::net::lookup_host`), so a slow resolver does not hold
/// up the runtime.
pub(crate) async fn socket_addrs(addr: impl AsyncToSocketAddrs) -> io::Result<Vec<SocketAddr>> {
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
pub(crate) fn connect_known(
    net: &Net,
    addrs: &[SocketAddr],
) -> Option<io::Result<xio_core::net::XioStream>> {
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
pub(crate) async fn on_blocking_thread<T: Send + 'static>(
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
pub(crate) async fn drive(
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
            // on every exchange (each sees the other asleep): a wake-up per
            // request, the slow mode HTTP at one connection kept falling into.
            drop(n);
            yielder.yield_now().await;
            let Some(again) = net.upgrade() else { return };
            n = again;
        }
        // Before sleeping on the doorbell (a parked worker costs tens of
        // microseconds to wake on a VM), keep watching the rings for the adaptive budget,
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
pub(crate) async fn sleep_on(
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

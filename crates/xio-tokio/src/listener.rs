//! [`XioListener`]: accepting, following a restarted manager, and the
//! conversions and the axum listener around it.

use super::*;

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
pub(crate) struct Retry {
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
pub(crate) struct Waiters(Mutex<Vec<std::task::Waker>>);

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

impl TryFrom<xio_core::net::XioListener> for XioListener {
    type Error = io::Error;

    /// [`XioListener::from_std`].
    fn try_from(l: xio_core::net::XioListener) -> io::Result<XioListener> {
        XioListener::from_std(l)
    }
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

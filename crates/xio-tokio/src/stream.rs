//! [`XioStream`]: connecting (with the check of its SYN's route),
//! readiness kept as tokio keeps it, reads and writes, zero-copy
//! receives, and TCP's options.

use super::*;

/// A connected stream, like `tokio::net::TcpStream`: `AsyncRead` and
/// `AsyncWrite` (vectored: header and body leave as one buffer when they
/// fit), plus zero-copy [`XioStream::recv_buf`] and [`XioStream::send_buf`].
/// Dropping it closes the connection (FIN, or RST with unread data).
#[derive(Debug)]
pub struct XioStream {
    pub(crate) inner: xio_core::net::XioStream,
    /// While its SYN may be unanswered: the route check a wait starts.
    pub(crate) syn: Arc<SynWatch>,
    /// Readiness kept as tokio keeps a socket's, by direction ([`READ`],
    /// [`WRITE`]): set when an operation or a readiness check finds that
    /// direction ready, and cleared only when an operation meets
    /// `WouldBlock` (see [`XioStream::readable`]). A flag each, so that
    /// setting and clearing are plain stores, not read-modify-writes.
    pub(crate) ready: [AtomicBool; 2],
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
pub(crate) struct SynWatch {
    /// Set until a wait finds the SYN answered (or refused): then the
    /// check costs a wait one atomic load.
    waiting: AtomicBool,
    /// Set while a watcher task runs ([`watch_syn`]).
    watching: AtomicBool,
}

/// Clears [`SynWatch::watching`] when the watcher ends, also when its
/// runtime shuts down and drops it: a wait on another runtime then starts
/// another.
pub(crate) struct Watching(Arc<SynWatch>);

impl Drop for Watching {
    fn drop(&mut self) {
        self.0.watching.store(false, Ordering::Relaxed);
    }
}

/// Asks the manager now and then (2 ms, doubling up to 100 ms, as a
/// blocking connect does) whether `s`'s SYN still goes to a process that
/// owns its address, until the SYN is answered or refused or the stream
/// is dropped. A refusal resets the connection, which wakes its tasks.
pub(crate) async fn watch_syn(s: xio_core::net::WeakXioStream, flag: Watching) {
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

/// The read direction of [`XioStream::ready`] (see [`XioStream::readable`]).
pub(crate) const READ: usize = 0;
/// The write direction of [`XioStream::ready`].
pub(crate) const WRITE: usize = 1;

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

    pub(crate) fn from_core(inner: xio_core::net::XioStream) -> io::Result<XioStream> {
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
    pub(crate) fn note<T>(&self, dir: usize, r: io::Result<T>) -> io::Result<T> {
        match &r {
            Ok(_) => self.set_ready(dir),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => self.clear_ready(dir),
            Err(_) => {}
        }
        r
    }

    /// [`XioStream::note`] for a poll: `Pending` met `WouldBlock`.
    pub(crate) fn note_poll<T>(&self, dir: usize, p: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
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
    pub(crate) fn set_ready(&self, dir: usize) {
        // Looked at first: a store dirties the line even when it writes
        // the value already there, which is the usual case.
        if !self.ready[dir].load(Ordering::Relaxed) {
            self.ready[dir].store(true, Ordering::Relaxed);
        }
    }

    pub(crate) fn clear_ready(&self, dir: usize) {
        if self.ready[dir].load(Ordering::Relaxed) {
            self.ready[dir].store(false, Ordering::Relaxed);
        }
    }

    pub(crate) fn is_ready(&self, dir: usize) -> bool {
        self.ready[dir].load(Ordering::Relaxed)
    }

    /// [`pending_needs_driver`] for a wait on the stream, which while the
    /// SYN may be unanswered also starts the route check (see
    /// [`SynWatch`]). A ready result costs nothing, nor (beyond an atomic
    /// load) does a wait once the SYN was answered.
    pub(crate) fn pending<T>(&self, p: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
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
    pub(crate) fn watch_syn(&self) {
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

    pub(crate) fn poll_peek_in(
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

    pub(crate) fn poll_read_ready_in(
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

    pub(crate) fn poll_write_ready_in(
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

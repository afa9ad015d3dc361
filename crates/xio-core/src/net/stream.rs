//! [`XioStream`]: a connected stream, its options, and its blocking reads and writes.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering as AtomicOrdering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::buf::{Buf, BufMut};
use crate::conn::{ConnError, ConnId};
use crate::layout::kind;
use crate::signal::ReadSignal;
use crate::stack::Error;

use super::core::Core;
use super::listener::ListenerInner;
use super::waiters::{wake_all, Key, Waiter, Waiters};
use super::{stack_err, Event, Net, Try};

pub(super) struct StreamInner {
    pub(super) net: Net,
    pub(super) id: ConnId,
    /// See [`ReadSignal`].
    pub(super) sig: Arc<ReadSignal>,
    nonblocking: AtomicBool,
    /// Nanoseconds; 0 is none.
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    /// What `set_nodelay` was given (nothing is ever delayed either way).
    nodelay: AtomicBool,
    /// `SO_LINGER` in nanoseconds, [`NO_LINGER`] for none.
    linger: AtomicU64,
    /// `IP_TTL` as set.
    ttl: Ttl,
}

/// [`StreamInner::linger`] when none is set.
const NO_LINGER: u64 = u64::MAX;

/// Linux's `IP_TTL` until one is set (`net.ipv4.ip_default_ttl`).
pub(super) const DEFAULT_TTL: u32 = 64;

/// `IP_TTL` as a stream or listener keeps it: set and reported, as a
/// socket's, though nothing routes these bytes.
pub(super) struct Ttl(AtomicU32);

impl Ttl {
    pub(super) fn new(ttl: u32) -> Self {
        Ttl(AtomicU32::new(ttl))
    }

    /// Takes what Linux takes: 1 to 255 (0 and more are `EINVAL`).
    pub(super) fn set(&self, ttl: u32) -> io::Result<()> {
        if !(1..=255).contains(&ttl) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a TTL is 1 to 255, not {ttl}"),
            ));
        }
        self.0.store(ttl, AtomicOrdering::Relaxed);
        Ok(())
    }

    pub(super) fn get(&self) -> u32 {
        self.0.load(AtomicOrdering::Relaxed)
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if self.net.inherited() {
            return; // the parent's stream: nothing of it to undo here
        }
        let c = self.id;
        // Wakers still registered for the stream (a read's, say) are
        // dropped after the lock is released: nothing will wake them.
        let mut orphans = Vec::new();
        let mut wake = Vec::new();
        let queued_for = self.net.update(|g| {
            let peer = g.table.peer_of(c);
            // Bytes the peer sent that are still in the rings were
            // received, as a socket's kernel has them: take them in first,
            // so that leaving them unread resets the peer (as TCP's close
            // does) instead of a FIN telling it all it sent was read.
            // (Not needed once the peer's FIN is in: all it sent is here.)
            if peer.is_some_and(|p| p != g.me()) && !g.driving && !g.table.input_ended(c) {
                for _ in 0..DROP_DRAIN_MAX {
                    if !g.stack.has_input() || g.drain(&mut wake).is_err() {
                        break;
                    }
                }
            }
            if self.linger.load(AtomicOrdering::Relaxed) == 0 {
                g.table.abort(c);
            } else {
                g.table.close(c);
            }
            if let Some(t) = g.user_tokens.get_mut(c.index()) {
                *t = None;
            }
            // A write's retry is no event of a closed stream (it would
            // come under the id, the program's token forgotten).
            g.retry_writes.retain(|&(r, _)| r != c);
            if let Some(slot) = g.signals.get_mut(c.index()) {
                if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, &self.sig)) {
                    *slot = None;
                }
            }
            for key in [Key::Read(c), Key::Write(c), Key::Connect(c)] {
                if let Some(Waiters { list: mut ws, .. }) = g.waiters.remove(&key) {
                    // A blocked thread holds the stream: none is here.
                    debug_assert!(ws.iter().all(Waiter::is_task));
                    orphans.append(&mut ws);
                    g.recycle(ws);
                }
            }
            // The FIN (or RST) goes now, or waits behind a full ring.
            g.run_actions(&mut wake);
            // Readiness not yet returned by `poll` (the drain above may
            // have just noted some) is no event of a closed stream, as
            // `epoll_wait` reports none for a closed fd: its token may
            // name what the program freed with the stream.
            g.forget_ready(c);
            peer.filter(|&p| g.pending_for(p))
        });
        wake_all(&mut wake);
        drop(orphans);
        if let Some(peer) = queued_for {
            // Queued behind a full ring, it would leave at this process's
            // next X-IO call, which may never come (a client that
            // connects, writes, closes and then waits on other things):
            // its peer would wait for the end of stream for good. A
            // socket's FIN leaves with the kernel; give the peer a moment
            // to make room. Bounded: one that does not drain keeps it
            // queued, as before.
            let wait = match self.linger.load(AtomicOrdering::Relaxed) {
                NO_LINGER => DROP_FLUSH_WAIT,
                n => Duration::from_nanos(n).max(DROP_FLUSH_WAIT),
            };
            let deadline = Instant::now()
                .checked_add(wait)
                .unwrap_or_else(Instant::now);
            while self.net.update(|g| {
                g.flush_pending();
                g.pending_for(peer)
            }) && Instant::now() < deadline
            {
                std::thread::yield_now();
            }
        }
    }
}

/// How long dropping a stream waits for ring space for its FIN.
const DROP_FLUSH_WAIT: Duration = Duration::from_micros(500);

/// Most drains a dropped stream makes to take in what its peer sent.
const DROP_DRAIN_MAX: usize = 64;

/// A connected stream. Like `std::net::TcpStream`: `Read`, `Write`
/// (also on `&XioStream`), shutdown, timeouts, non-blocking mode; plus
/// zero-copy [`XioStream::recv_buf`] and [`XioStream::send_buf`].
/// Dropping the last handle closes it (a FIN, or a RST if received data
/// was left unread).
///
/// # Differences from `TcpStream` on Linux
/// Ported code sees the same data, error kinds and byte counts (but for
/// how much a write takes before a full window stops it, which buffer
/// sizes decide on both) — the `std_parity` test suite runs the same
/// scenarios against both — except:
/// - `local_addr` of a connecting stream is an address made from the
///   process's stack id, not the listener's IP (X-IO clients do not bind);
///   IPv4-mapped to connect to an IPv6 address. An IPv4 client of a
///   listener on `[::]` is accepted with IPv4 addresses (Linux's
///   dual-stack socket maps them into IPv6).
/// - A connect over a route the net knows returns before the listener
///   answers: a refusal is the first read's or write's (see
///   [`Net::connect`]).
/// - `shutdown(Read)` discards what is queued and what still arrives, as
///   on the BSDs (see [`XioStream::shutdown`]).
/// - A read into an empty buffer returns `Ok(0)` without waiting (Linux's
///   waits for data or the timeout, or in non-blocking mode says
///   `WouldBlock`).
/// - Timeouts read back exactly as set (a socket's are rounded to the
///   kernel's clock tick).
/// - `set_nodelay`, `set_ttl` and `set_linger` are kept and reported as
///   a socket reports them, but only a zero linger changes anything (a
///   close with a reset): no write is ever delayed, and nothing routes
///   these bytes.
/// - No file descriptor (`AsRawFd`): an event loop uses [`Net::poll`] or
///   [`Net::poll_fd`].
#[derive(Clone)]
pub struct XioStream {
    pub(super) inner: Arc<StreamInner>,
}

impl std::fmt::Debug for XioStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XioStream")
            .field("conn", &self.inner.id)
            .finish()
    }
}

/// An [`XioStream`] that does not keep the connection open (see
/// [`XioStream::downgrade`]): for an adapter's helper that must not
/// outlive the stream's last handle.
#[derive(Clone, Debug)]
pub struct WeakXioStream(std::sync::Weak<StreamInner>);

impl WeakXioStream {
    /// The stream, while some handle still keeps it open.
    pub fn upgrade(&self) -> Option<XioStream> {
        self.0.upgrade().map(|inner| XioStream { inner })
    }
}

/// A connect that found no manager to resolve its address (none ran, or
/// it went away and none runs again): refused, as a TCP connect to a port
/// nobody listens on (the stack's error, which says what happened, stays
/// its source).
pub(super) fn no_manager_refuses(e: io::Error) -> io::Error {
    let no_manager = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<Error>())
        .is_some_and(|s| matches!(s, Error::NoManager { .. } | Error::ManagerGone));
    if !no_manager {
        return e;
    }
    match e.into_inner() {
        Some(inner) => io::Error::new(io::ErrorKind::ConnectionRefused, inner),
        None => io::ErrorKind::ConnectionRefused.into(),
    }
}

/// The error inside the `WouldBlock` that a stream's read or write timeout
/// gives, as `std::net::TcpStream` on Linux does (a timed-out call fails
/// with `EAGAIN` there, and ported code checks for `WouldBlock`). It tells
/// a timeout from non-blocking mode's `WouldBlock`:
/// `e.get_ref().is_some_and(|i| i.is::<TimeoutElapsed>())`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("timed out (the stream's read or write timeout)")]
pub struct TimeoutElapsed;

/// A stream operation bounded by the stream's own timeout: its `TimedOut`
/// becomes `WouldBlock` ([`TimeoutElapsed`]).
fn stream_timeout<T>(r: io::Result<T>) -> io::Result<T> {
    r.map_err(|e| {
        if e.kind() == io::ErrorKind::TimedOut {
            io::Error::new(io::ErrorKind::WouldBlock, TimeoutElapsed)
        } else {
            e
        }
    })
}

fn timeout_of(a: &AtomicU64) -> Option<Instant> {
    match a.load(AtomicOrdering::Relaxed) {
        0 => None,
        n => Some(Instant::now() + Duration::from_nanos(n)),
    }
}

fn store_timeout(a: &AtomicU64, t: Option<Duration>) -> io::Result<()> {
    match t {
        Some(d) if d.is_zero() => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cannot set a 0 duration timeout",
        )),
        Some(d) => {
            a.store(
                d.as_nanos().clamp(1, u64::MAX as u128) as u64,
                AtomicOrdering::Relaxed,
            );
            Ok(())
        }
        None => {
            a.store(0, AtomicOrdering::Relaxed);
            Ok(())
        }
    }
}

impl XioStream {
    pub(super) fn new(net: Net, id: ConnId) -> Self {
        Self {
            inner: Arc::new(StreamInner {
                net,
                id,
                sig: Arc::default(),
                nonblocking: AtomicBool::new(false),
                read_timeout: AtomicU64::new(0),
                write_timeout: AtomicU64::new(0),
                nodelay: AtomicBool::new(false),
                linger: AtomicU64::new(NO_LINGER),
                ttl: Ttl::new(DEFAULT_TTL),
            }),
        }
    }

    /// A stream accepted on `l`, with the options it inherits.
    pub(super) fn accepted(net: Net, id: ConnId, l: &ListenerInner) -> Self {
        let s = Self::new(net, id);
        s.inner.ttl.0.store(l.ttl.get(), AtomicOrdering::Relaxed);
        s
    }

    /// Connects to `addr` on the process-wide [`Net::global`]. With no
    /// manager running, as with nobody listening: `ConnectionRefused`
    /// (code that waits for its server to come up retries on it), whose
    /// message says how to start one. Otherwise as [`Net::connect`].
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<XioStream> {
        Net::with_global(|n| n.connect(&addr)).map_err(no_manager_refuses)
    }

    /// Connects on [`Net::global`], waiting at most `timeout`.
    pub fn connect_timeout(addr: &SocketAddr, timeout: Duration) -> io::Result<XioStream> {
        Net::with_global(|n| n.connect_timeout(addr, timeout)).map_err(no_manager_refuses)
    }

    /// The token [`Net::poll`] reports this stream's readiness under: one
    /// X-IO chose, unique among the net's open streams, until
    /// [`XioStream::set_token`] chooses another.
    pub fn token(&self) -> u64 {
        self.inner.net.lock().token_of(self.inner.id)
    }

    /// Chooses the token [`Net::poll`] reports this stream's readiness
    /// under, as `epoll_ctl`'s data or mio's `Token` do: an event loop can
    /// then index its own table with it (a slab index, say) instead of
    /// looking X-IO's tokens up. Events not yet returned by `poll` carry
    /// the new token too. Keeping tokens unique is the caller's business.
    pub fn set_token(&self, token: u64) {
        let c = self.inner.id;
        self.inner.net.update(|g| {
            let i = c.index();
            if g.user_tokens.len() <= i {
                g.user_tokens.resize(i + 1, None);
            }
            g.user_tokens[i] = Some((c.0, token));
            if let Some(i) = g.ready_index(c) {
                if let Event::Stream { token: t, .. } = &mut g.ready[i] {
                    *t = token;
                }
            }
        });
    }

    /// The net this stream belongs to.
    pub fn net(&self) -> &Net {
        &self.inner.net
    }

    /// This end's address (for a connecting stream, a per-connection
    /// address made from the process's stack id: X-IO clients do not bind).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        let g = self.inner.net.lock();
        g.table
            .addrs(self.inner.id)
            .map(|a| a.0)
            .map_err(io::Error::from)
    }

    /// The other end's address; `NotConnected` once the connection was
    /// reset (or refused), as `TcpStream::peer_addr` on Linux.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        let g = self.inner.net.lock();
        g.table.peer_addr(self.inner.id).map_err(io::Error::from)
    }

    /// Another handle to the same stream (the stream closes when the last
    /// one is dropped).
    pub fn try_clone(&self) -> io::Result<XioStream> {
        Ok(self.clone())
    }

    /// A handle that does not keep the connection open.
    pub fn downgrade(&self) -> WeakXioStream {
        WeakXioStream(Arc::downgrade(&self.inner))
    }

    /// Non-blocking mode: reads and writes return `WouldBlock` instead of
    /// waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.inner
            .nonblocking
            .store(nonblocking, AtomicOrdering::Relaxed);
        Ok(())
    }

    /// Read timeout; `None` waits forever. A read that waits longer fails
    /// with `WouldBlock`, as a `TcpStream`'s does on Linux (its source is
    /// [`TimeoutElapsed`]).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        store_timeout(&self.inner.read_timeout, t)
    }

    /// Write timeout (for waits on credit, ring space or buffers); as the
    /// read timeout, it ends a wait with `WouldBlock` ([`TimeoutElapsed`]).
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        store_timeout(&self.inner.write_timeout, t)
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(
            match self.inner.read_timeout.load(AtomicOrdering::Relaxed) {
                0 => None,
                n => Some(Duration::from_nanos(n)),
            },
        )
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(
            match self.inner.write_timeout.load(AtomicOrdering::Relaxed) {
                0 => None,
                n => Some(Duration::from_nanos(n)),
            },
        )
    }

    /// Sets `TCP_NODELAY` as a TCP socket takes it, for [`XioStream::nodelay`]
    /// to report. Both values behave the same: X-IO has no Nagle
    /// algorithm, and every write leaves at once, as with `TCP_NODELAY` on.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.inner.nodelay.store(nodelay, AtomicOrdering::Relaxed);
        Ok(())
    }

    /// What [`XioStream::set_nodelay`] was given last (false on a new
    /// stream, as on a TCP socket).
    pub fn nodelay(&self) -> io::Result<bool> {
        Ok(self.inner.nodelay.load(AtomicOrdering::Relaxed))
    }

    /// Sets `SO_LINGER`, as a TCP socket takes it. A zero duration closes
    /// with a reset when the last handle is dropped (an abortive close:
    /// the peer's reads see `ConnectionReset` instead of end of stream,
    /// and what it had not read is dropped). Another duration lets the
    /// drop wait up to that long for what still waits behind a full ring
    /// to the peer (as a lingering close waits for unsent data); without
    /// one it waits a moment only. Written bytes are in the peer's memory
    /// already: there is no unacknowledged data to wait for.
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        let v = linger.map_or(NO_LINGER, |d| {
            u64::try_from(d.as_nanos()).unwrap_or(NO_LINGER - 1)
        });
        self.inner.linger.store(v, AtomicOrdering::Relaxed);
        Ok(())
    }

    /// `SO_LINGER` as set ([`XioStream::set_linger`]; `None` on a new
    /// stream).
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        Ok(match self.inner.linger.load(AtomicOrdering::Relaxed) {
            NO_LINGER => None,
            n => Some(Duration::from_nanos(n)),
        })
    }

    /// Sets `IP_TTL` (1 to 255, as Linux takes it), for
    /// [`XioStream::ttl`] to report: nothing routes these bytes, so it
    /// changes nothing else.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.inner.ttl.set(ttl)
    }

    /// `IP_TTL` as set: Linux's default of 64 on a new stream, or the
    /// listener's on an accepted one.
    pub fn ttl(&self) -> io::Result<u32> {
        Ok(self.inner.ttl.get())
    }

    /// The refusal or reset that ended the stream, if no read or write
    /// reported it yet, once (as `SO_ERROR`, which those calls clear): an
    /// event loop told a non-blocking connect is ready asks it whether the
    /// connect failed. What the net has taken in counts (a `poll`, a read
    /// or write that waited), as a socket's is what its kernel processed.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        let c = self.inner.id;
        Ok(self
            .inner
            .net
            .lock()
            .table
            .take_error(c)
            .map(io::Error::from))
    }

    /// Reads without taking the bytes off the stream (`MSG_PEEK`): the
    /// next read returns them again. Waits as `read` does. A reset is
    /// reported once, as by a read: then peeks and reads see end of
    /// stream (as Linux's, whose peek clears the socket's error).
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_op(|core, wake, c| core.peek_step(wake, c, buf, true))
    }

    /// Shuts down reading, writing or both. Writing: the peer reads end of
    /// stream after the data already written. Reading: reads return end of
    /// stream at once; what was queued and what still arrives is
    /// discarded and credited back, so the peer's writes go on, neither
    /// blocked nor reset, and a later close is a FIN. (As on the BSDs;
    /// Linux's TCP keeps those bytes readable instead.) A reset (or
    /// refused) stream is `NotConnected`, as a TCP socket's `shutdown`
    /// after a RST on Linux.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let c = self.inner.id;
        self.inner.net.update(|g| {
            if matches!(how, Shutdown::Write | Shutdown::Both) {
                g.table.shutdown_write(c)?;
            }
            if matches!(how, Shutdown::Read | Shutdown::Both) {
                g.table.shutdown_read(c)?;
            }
            Ok::<_, ConnError>(())
        })?;
        Ok(())
    }

    /// How many bytes a read returns without waiting, of those taken in
    /// from the ring so far (`ioctl(FIONREAD)`; a readiness check, such
    /// as [`XioStream::poll_peek_ready`], takes in what has arrived).
    pub fn bytes_queued(&self) -> usize {
        let g = self.inner.net.lock();
        g.table.queued(self.inner.id)
    }

    /// Whether the stream is in non-blocking mode.
    pub fn is_nonblocking(&self) -> bool {
        self.nb()
    }

    fn nb(&self) -> bool {
        self.inner.nonblocking.load(AtomicOrdering::Relaxed)
    }

    fn read_on(&self, out: &mut [u8]) -> io::Result<usize> {
        self.read_uninit(crate::conn::as_uninit(out))
    }

    /// [`Read::read`] into memory that may be uninitialised (a `BytesMut`'s
    /// or a `Vec`'s spare capacity, which need not be zeroed first): waits
    /// as `read` does (or says `WouldBlock` when non-blocking), then
    /// writes the first `n` bytes of `out` and returns `n`. It never reads
    /// `out` and leaves the rest as it was.
    pub fn read_uninit(&self, out: &mut [std::mem::MaybeUninit<u8>]) -> io::Result<usize> {
        self.read_op(|core, wake, c| core.read_step(wake, c, out))
    }

    /// `readv`: waits as `read` does until a byte is there, then fills
    /// `outs` in order with as much as has arrived.
    fn read_vectored_on(&self, outs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.read_op(|core, wake, c| core.read_vectored_step(wake, c, outs))
    }

    /// Receives the next chunk as the pool buffer itself, without copying
    /// (FABLE's getreadbuf): `Ok(None)` is end of stream. Bytes already
    /// taken by `read` are skipped. Mixes freely with `read`. In
    /// copy-on-receive mode ([`crate::net::NetBuilder::copy_on_receive`])
    /// the chunk is a private copy instead; made writable and passed to
    /// [`XioStream::send_buf`], it is copied into a pool buffer first.
    pub fn recv_buf(&self) -> io::Result<Option<Buf>> {
        self.read_op(|core, wake, c| core.chunk_step(wake, c))
    }

    /// A read through the blocking driver (or `WouldBlock` when
    /// non-blocking): waits for the connection, then tries `step`. An event
    /// loop's read that would find nothing returns without the lock (see
    /// [`ReadSignal`]). A timeout is `WouldBlock` ([`TimeoutElapsed`]), as
    /// `std::net::TcpStream`'s on Linux.
    fn read_op<R>(
        &self,
        step: impl FnMut(&mut Core, &mut Vec<Waiter>, ConnId) -> Try<R>,
    ) -> io::Result<R> {
        stream_timeout(self.read_op_until(step))
    }

    fn read_op_until<R>(
        &self,
        mut step: impl FnMut(&mut Core, &mut Vec<Waiter>, ConnId) -> Try<R>,
    ) -> io::Result<R> {
        let c = self.inner.id;
        let deadline = timeout_of(&self.inner.read_timeout);
        let nb = self.nb();
        if !nb {
            self.inner.net.ensure_connected(c, deadline)?;
        } else if self.inner.sig.still_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let sig = &self.inner.sig;
        self.inner
            .net
            .block(Key::Read(c), nb, deadline, |core, wake| {
                let r = step(core, wake, c);
                if nb {
                    core.note_read(c, sig, &r);
                }
                r
            })
    }

    /// A writable pool buffer of `len` bytes to fill and [`send_buf`]
    /// (waits while the pool is exhausted; `InvalidInput` above the largest
    /// class).
    ///
    /// [`send_buf`]: XioStream::send_buf
    pub fn alloc(&self, len: usize) -> io::Result<BufMut> {
        let deadline = timeout_of(&self.inner.write_timeout);
        if self.nb() {
            let mut g = self.inner.net.lock();
            let r = g.stack.try_alloc(len);
            if let Err(Error::WouldBlock) = r {
                // An empty pool: an event loop hears when to try again.
                g.note_retry_write(self.inner.id);
            }
            return r.map_err(stack_err);
        }
        stream_timeout(self.inner.net.alloc_wait(len, deadline))
    }

    /// Sends a pool buffer as the next bytes of the stream, without copying
    /// (FABLE's commit). An error hands the buffer back when it was not
    /// sent (`WouldBlock` in non-blocking mode, a reset connection,
    /// `InvalidInput` for a buffer of another pool). An empty buffer is
    /// no bytes of the stream: the peer's `recv_buf` never returns it.
    pub fn send_buf(&self, buf: BufMut) -> Result<(), (io::Error, Option<BufMut>)> {
        self.send_buf_with(buf, self.nb())
    }

    pub(super) fn send_buf_with(
        &self,
        buf: BufMut,
        nonblocking: bool,
    ) -> Result<(), (io::Error, Option<BufMut>)> {
        let c = self.inner.id;
        let deadline = timeout_of(&self.inner.write_timeout);
        let buf = self.inner.net.sendable(
            buf,
            if nonblocking {
                Some(Instant::now())
            } else {
                deadline
            },
        )?;
        let mut slot = Some(buf);
        let mut peer_used = None;
        let r = self
            .inner
            .net
            .block(Key::Write(c), nonblocking, deadline, |core, _| {
                if let Err(e) = core.stack.check_ours(slot.as_ref().expect("until sent")) {
                    return Try::Done(Err(e.into()));
                }
                // After what a write batch holds (it may hold this
                // connection's earlier bytes; queued, the check below
                // keeps the order).
                core.release_held();
                let (peer, to, flag) = match core.table.send_target(c) {
                    Ok(t) => t,
                    Err(e) => return Try::Done(Err(e.into())),
                };
                if core.pending_for(peer) && !core.flush_pending() && core.pending_for(peer) {
                    return Try::Retry;
                }
                let cap = slot.as_ref().expect("until sent").capacity();
                if core.table.take_credit(c, cap).is_err() {
                    return Try::Wait;
                }
                let buf = slot.take().expect("until sent");
                let me = core.me();
                if peer == me {
                    core.table.on_data(me, ConnId(to), buf.freeze());
                    return Try::Done(Ok(()));
                }
                peer_used = Some(peer);
                match core
                    .stack
                    .push_buf(peer, kind::STREAM | flag, to, buf, true)
                {
                    Ok(None) => Try::Done(Ok(())),
                    Ok(Some(back)) => {
                        slot = Some(back);
                        core.table.return_credit(c, cap);
                        Try::Retry
                    }
                    Err((e, back)) => {
                        slot = Some(back);
                        core.table.return_credit(c, cap);
                        core.refused_peers.push(peer);
                        Try::Done(Err(stack_err(e)))
                    }
                }
            });
        self.inner.net.update(|_| ());
        let _ = peer_used;
        stream_timeout(r).map_err(|e| (e, slot))
    }
}

impl Read for XioStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_on(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.read_vectored_on(bufs)
    }
}

impl Read for &XioStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_on(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.read_vectored_on(bufs)
    }
}

impl Write for &XioStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let deadline = timeout_of(&self.inner.write_timeout);
        stream_timeout(
            self.inner
                .net
                .write_on(self.inner.id, bufs, self.nb(), deadline),
        )
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for XioStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&*self).write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

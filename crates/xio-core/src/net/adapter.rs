//! The adapter interface: readiness through wakers, for runtimes and foreign event loops.

use std::io::{self, IoSlice};
use std::net::SocketAddr;
use std::task::{ready, Context, Poll};
use std::time::Duration;

use crate::buf::{Buf, BufMut};
use crate::conn::{ConnError, ConnId};
use crate::stack::{Error, Probe};

use super::core::Core;
use super::waiters::{wake_all, Key, WaitEntry, Waiter};
use super::{stack_err, Event, Net, Try, XioListener, XioStream};
#[cfg(doc)]
use crate::signal::ReadSignal;

/// No data for this long means the traffic stopped: an adapter's empty
/// watches then shrink the spin budget to nothing. Longer than any gap the
/// adaptive policy spins through (its ceiling is 200 µs).
const IDLE_AFTER_NS: u64 = 1_000_000;

/// A learned spin budget below this means traffic is sparse (see
/// [`Drive::sparse`]): a watch that short saves nothing a yield to the
/// runtime would not cost.
const SPARSE_BUDGET_NS: u64 = 5_000;

/// A driver's look at the rings that takes no lock (see
/// [`Net::watch_begin`]).
pub struct Watcher {
    probe: Box<Probe>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").finish_non_exhaustive()
    }
}

impl Watcher {
    /// Whether something waits to be drained (shared loads only).
    pub fn has_input(&mut self) -> bool {
        self.probe.ready_now()
    }
}

/// What [`Net::drive`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drive {
    /// The doorbell is armed: peers will ring it when they send, so the
    /// caller may wait for it to become readable. When false, something
    /// arrived meanwhile: call `drive` again (after yielding).
    pub armed: bool,
    /// Some task waits on something no peer signals (a full ring, an empty
    /// pool): call [`Net::wake_retriers`] after a short pause (about 50 µs).
    pub retry: bool,
    /// The drain woke tasks. Let them run before deciding how to wait:
    /// what they send decides whether a peer is about to answer (see
    /// [`Net::spin_budget`]).
    pub woke: bool,
    /// The adaptive policy has learned that traffic is sparse: its budget
    /// is a token spin (a few µs at most). Yielding to the runtime to let
    /// woken tasks run first, or between looks of a watch, then buys
    /// nothing, and on a multi-thread runtime each yield also wakes an
    /// idle worker. Watch that briefly without yielding, then sleep.
    pub sparse: bool,
}

impl Core {
    /// Whether the adaptive policy has learned that traffic is sparse
    /// (see [`Drive::sparse`]).
    fn sparse(&mut self) -> bool {
        self.stack.spin_mut().budget() < Duration::from_nanos(SPARSE_BUDGET_NS)
    }
}

/// The adapter interface: readiness through wakers, for runtimes (the
/// tokio adapter) and event loops in other languages (the C ABI). An
/// adapter runs one *driver* per net: it waits for [`Net::doorbell`] to
/// become readable, then calls [`Net::drive`], which drains the rings and
/// wakes every task whose connection became ready (batch wake-up), and
/// arms the doorbell again. The `poll_*` methods of the streams and
/// listeners never wait and never spin: they register the task's waker.
impl Net {
    /// A duplicate of the doorbell eventfd: readable when a peer rang
    /// because this net's doorbell was armed ([`Net::drive`]).
    pub fn doorbell(&self) -> io::Result<std::os::fd::OwnedFd> {
        let mut g = self.lock();
        g.bell_out = true;
        Ok(rustix::io::fcntl_dupfd_cloexec(g.stack.doorbell_fd(), 3)?)
    }

    /// The fd an event loop that calls [`Net::poll_nowait`] sleeps on: an
    /// epoll instance (poll it for readability, never read it) that is
    /// readable when the doorbell rang ([`Net::doorbell`]) or when the
    /// net's retry timer fired: sends of the net's own that wait for a
    /// peer's full ring are then retried by the next `poll_nowait`, and
    /// non-blocking writes that met a full ring or an empty pool are
    /// reported writable by it, without the loop spinning while the peer
    /// makes no room. Every call returns a copy of the same instance.
    pub fn poll_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        use rustix::event::epoll;
        use rustix::time::{timerfd_create, TimerfdClockId, TimerfdFlags};
        let mut g = self.lock();
        if g.loop_fd.is_none() {
            let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
            let timer = timerfd_create(
                TimerfdClockId::Monotonic,
                TimerfdFlags::CLOEXEC | TimerfdFlags::NONBLOCK,
            )?;
            // Level-triggered: readable while the doorbell's count or the
            // timer's expiry is unread (`poll_nowait` clears both).
            epoll::add(
                &ep,
                g.stack.doorbell_fd(),
                epoll::EventData::new_u64(0),
                epoll::EventFlags::IN,
            )?;
            epoll::add(
                &ep,
                &timer,
                epoll::EventData::new_u64(1),
                epoll::EventFlags::IN,
            )?;
            g.loop_fd = Some(ep);
            g.retry_timer = Some(timer);
            g.retry_armed = None;
        }
        g.bell_out = true;
        let ep = g.loop_fd.as_ref().expect("just made");
        Ok(rustix::io::fcntl_dupfd_cloexec(ep, 3)?)
    }

    /// A pollable fd for the manager's side of this net: readable while
    /// the manager has queued control messages or is gone. (An epoll
    /// instance watching the control socket, so nothing can read the
    /// socket through it.) A driver sleeping on [`Net::doorbell`] polls
    /// this one too and, when it is readable, calls [`Net::drive`] with
    /// `liveness`: a dead manager is then noticed at once, where a driver
    /// without it has to look about once a second. Once the net has
    /// found the manager gone ([`Net::manager_gone`]), the fd stops
    /// watching and is never readable again.
    pub fn manager_watch(&self) -> io::Result<std::os::fd::OwnedFd> {
        use rustix::event::epoll;
        let mut g = self.lock();
        if g.manager_watch.is_none() && !g.stack.manager_gone() {
            let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
            epoll::add(
                &ep,
                g.stack.ctrl_fd(),
                epoll::EventData::new_u64(0),
                epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
            )?;
            g.manager_watch = Some(ep);
        }
        match &g.manager_watch {
            // Every copy is the same epoll instance: `drain` empties it.
            Some(w) => Ok(rustix::io::fcntl_dupfd_cloexec(w, 3)?),
            // Gone already: an empty instance, never readable.
            None => Ok(epoll::create(epoll::CreateFlags::CLOEXEC)?),
        }
    }

    /// Drains the rings, wakes the tasks that became ready, and arms the
    /// doorbell. `rung`: the doorbell fd was readable (its ring is
    /// consumed here). With `liveness`, also reads the control socket (call
    /// it about once a second, so a dead manager is noticed).
    pub fn drive(&self, rung: bool, liveness: bool) -> io::Result<Drive> {
        let mut wake = Vec::new();
        let mut g = self.lock();
        if rung {
            g.stack.clear_doorbell();
        }
        if liveness {
            g.force_ctrl = true;
        }
        let mut r = Ok(());
        if !g.driving {
            if let Err(e) = g.drain(&mut wake) {
                r = Err(e);
            }
        }
        #[cfg(test)]
        if std::mem::take(&mut g.fail_drive) {
            r = Err(io::Error::other("a drain failed (injected)"));
        }
        let retry = !g.retry_waiters.is_empty() || g.has_pending();
        // A blocking driver thread watches the rings itself: leave the
        // doorbell to it (it wakes our tasks' wakers as it drains).
        let armed = g.driving || g.stack.arm_doorbell();
        let sparse = g.sparse();
        drop(g);
        let woke = !wake.is_empty();
        wake_all(&mut wake);
        r.map(|()| Drive {
            armed,
            retry,
            woke,
            sparse,
        })
    }

    /// Sends what waits behind full rings (data, and control messages such
    /// as a closed stream's FIN), as far as the rings take it now; true
    /// once nothing waits. For an adapter whose last driver ended (its
    /// runtime shut down): nobody else retries those sends until the net
    /// is used again, and the peers would wait for them meanwhile.
    pub fn flush_queued(&self) -> bool {
        self.lock().flush_pending()
    }

    /// Wakes the tasks waiting on a full ring or an empty pool (see
    /// [`Drive::retry`]), and retries queued control sends.
    pub fn wake_retriers(&self) {
        let mut g = self.lock();
        g.flush_pending();
        let ws = std::mem::take(&mut g.retry_waiters);
        drop(g);
        for w in ws {
            w.wake();
        }
    }

    /// Wakes every task waiting on this net: the registered wakers of
    /// every stream and listener, and the tasks waiting for a retry.
    /// Threads in blocking calls are left asleep. For an adapter whose
    /// driver went away (its runtime shut down): the woken tasks poll
    /// again and find, or start, another driver. Costs the woken tasks a
    /// spurious poll each; nothing is lost. Also rings the doorbell: the
    /// driver that went away may have been watching the rings with the
    /// doorbell switched off, and another reactor asleep on it (a driver
    /// of another runtime) would not hear the peers until it is armed
    /// again.
    pub fn wake_tasks(&self) {
        let mut wake = Vec::new();
        let mut g = self.lock();
        g.take_wakers(&mut wake);
        g.ring_reactor();
        drop(g);
        wake_all(&mut wake);
    }

    /// How long a driver task should keep watching the rings (yielding to
    /// other tasks between looks) before it sleeps on the doorbell: the
    /// adaptive policy's budget, zero unless a peer is awake on another
    /// core. Call [`Net::watch_begin`] first and [`Net::watch_end`] after.
    pub fn spin_budget(&self) -> Duration {
        Duration::from_nanos(self.lock().stack.spin_budget_now())
    }

    /// Whether the rings hold something to drain (a few shared loads).
    pub fn has_input(&self) -> bool {
        self.lock().stack.has_input()
    }

    /// Starts watching the rings instead of the doorbell: peers stop
    /// ringing it (a system call each) while we look, and the returned
    /// [`Watcher`] looks without taking the net's lock.
    pub fn watch_begin(&self) -> Watcher {
        let mut g = self.lock();
        g.stack.disarm_doorbell();
        let reuse = g.probe.take();
        Watcher {
            probe: g.stack.probe(reuse),
        }
    }

    /// Within a watch, when [`Watcher::has_input`] says so: drains the
    /// rings and wakes the tasks that became ready, and keeps watching
    /// (the doorbell stays disarmed, the watcher is brought up to date).
    /// Cheaper than [`Net::watch_end`] + [`Net::drive`] +
    /// [`Net::watch_begin`] per arrival under steady traffic. When the
    /// result says `retry`, end the watch and drive.
    pub fn watch_drain(&self, w: &mut Watcher) -> io::Result<Drive> {
        let mut wake = Vec::new();
        let mut g = self.lock();
        let r = if g.driving {
            Ok(())
        } else {
            g.drain(&mut wake).map(drop)
        };
        g.stack.refresh_probe(&mut w.probe);
        let retry = !g.retry_waiters.is_empty() || g.has_pending();
        let sparse = g.sparse();
        drop(g);
        let woke = !wake.is_empty();
        wake_all(&mut wake);
        r.map(|()| Drive {
            armed: false,
            retry,
            woke,
            sparse,
        })
    }

    /// Within a watch, for an event loop (the C ABI's, the Go package's
    /// dispatcher): drains the rings and appends at most `cap` readiness
    /// events, as [`Net::poll_nowait_capped`] does, but leaves the doorbell
    /// off (peers do not ring it while the loop watches) and brings the
    /// watcher up to date. End the watch with [`Net::watch_end`], then
    /// [`Net::poll_nowait`] (which arms the doorbell) before sleeping on
    /// [`Net::poll_fd`].
    pub fn poll_in_watch(
        &self,
        w: &mut Watcher,
        events: &mut Vec<Event>,
        cap: usize,
    ) -> io::Result<usize> {
        let n = self.poll_capped(events, cap, Some(Duration::ZERO))?;
        self.lock().stack.refresh_probe(&mut w.probe);
        Ok(n)
    }

    /// Ends a watch: `hit` if something arrived within it, after `spun`.
    /// Teaches the adaptive policy; the caller then drives (a hit) or arms
    /// the doorbell again through [`Net::drive`].
    pub fn watch_end(&self, w: Watcher, hit: bool, spun: Duration) {
        let mut g = self.lock();
        let mut probe = w.probe;
        g.stack.end_probe(&mut probe);
        g.probe = Some(probe);
        let now = crate::wait::now_ns();
        if g.data_seen.0 != g.data_drains {
            g.data_seen = (g.data_drains, now);
        }
        let quiet = now.saturating_sub(g.data_seen.1) > IDLE_AFTER_NS;
        let spin = g.stack.spin_mut();
        spin.on_spin_start();
        if hit {
            spin.on_spin_hit();
        } else {
            if quiet {
                // Nothing for longer than any gap worth spinning through:
                // the traffic stopped. Two idle drivers would otherwise keep
                // each other looking awake (worth spinning for) and watch
                // forever.
                spin.on_idle_watch();
            }
            g.missed = Some((spun.as_nanos() as u64, now));
        }
    }

    /// One attempt of an operation for an adapter, with what the table
    /// holds; if it cannot complete, the task's waker is registered
    /// instead of waiting.
    /// With `entry`, the task waits in the entry's own place (see
    /// [`WaitEntry`]), which it leaves when it completes; without, in the
    /// key's slot.
    fn poll_op<R>(
        &self,
        key: Key,
        cx: &Context<'_>,
        mut entry: Option<&mut WaitEntry>,
        mut f: impl FnMut(&mut Core, &mut Vec<Waiter>) -> Try<R>,
    ) -> Poll<io::Result<R>> {
        if let Some(e) = entry.as_deref_mut() {
            e.leave_unless(self);
        }
        let mut wake = Vec::new();
        let mut g = self.lock();
        // No drain here: the adapter's driver drains (it watches the rings
        // or is rung), and it runs under the same lock, so a task either
        // finds what the driver delivered or has its waker registered
        // before the driver looks. Draining from every task that found
        // nothing pulled other connections' messages in piecemeal, one
        // drain per task instead of one batch per pass, and hyper at many
        // connections ran measurably slower.
        let attempt = f(&mut g, &mut wake);
        let r = match attempt {
            Try::Done(r) => {
                // Done: out of the list now, under this lock hold, so the
                // entry's drop has nothing left to do.
                if let Some((k, id)) = entry.and_then(|e| e.at.take()) {
                    g.remove_entry(k, id, &mut wake);
                }
                Poll::Ready(r)
            }
            Try::Wait => {
                match entry {
                    Some(e) => g.add_entry(self, key, cx.waker(), e, &mut wake),
                    None => g.add_waker(key, cx.waker(), &mut wake),
                }
                Poll::Pending
            }
            Try::Retry => {
                g.add_retry(cx.waker());
                Poll::Pending
            }
        };
        drop(g);
        wake_all(&mut wake);
        r
    }
}

impl XioListener {
    /// Accepts a connection if one waits, else registers the task
    /// (adapter interface, see [`Net::drive`]): only the task that called
    /// it last is woken, as `tokio::net::TcpListener::poll_accept` has it.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(XioStream, SocketAddr)>> {
        self.poll_accept_in(cx, None)
    }

    /// [`XioListener::poll_accept`] for a future that owns `entry`: every
    /// such future waiting is woken when a connection comes (see
    /// [`WaitEntry`]), as tokio's `accept()` futures are.
    pub fn poll_accept_entry(
        &self,
        cx: &mut Context<'_>,
        entry: &mut WaitEntry,
    ) -> Poll<io::Result<(XioStream, SocketAddr)>> {
        self.poll_accept_in(cx, Some(entry))
    }

    fn poll_accept_in(
        &self,
        cx: &mut Context<'_>,
        entry: Option<&mut WaitEntry>,
    ) -> Poll<io::Result<(XioStream, SocketAddr)>> {
        let addr = self.inner.addr;
        let net = self.net();
        // The peer's address under the same lock, as `accept` takes it
        // (see `accept_on`: a connection reset while queued is handed over).
        let (c, peer) = ready!(net.poll_op(Key::Accept(addr), cx, entry, |core, wake| {
            match core.accept_on(addr, wake) {
                Ok(accepted) => Try::Done(Ok(accepted)),
                Err(ConnError::WouldBlock) => Try::Wait,
                Err(e) => Try::Done(Err(e.into())),
            }
        }))?;
        Poll::Ready(Ok((XioStream::accepted(net, c, &self.inner), peer)))
    }
}

impl XioStream {
    /// Reads if bytes (or end of stream, or an error) are there, else
    /// registers the task (adapter interface, see [`Net::drive`]).
    pub fn poll_read(&self, cx: &mut Context<'_>, out: &mut [u8]) -> Poll<io::Result<usize>> {
        self.poll_read_uninit(cx, crate::conn::as_uninit(out))
    }

    /// [`XioStream::poll_read`] into memory that may be uninitialised (a
    /// runtime's read buffer, which need not be zeroed first): the first
    /// `n` bytes are written, nothing else.
    pub fn poll_read_uninit(
        &self,
        cx: &mut Context<'_>,
        out: &mut [std::mem::MaybeUninit<u8>],
    ) -> Poll<io::Result<usize>> {
        self.poll_read_op(cx, None, |core, wake, c| core.read_step(wake, c, out))
    }

    /// Peeks if bytes (or end of stream, or an error) are there, else
    /// registers the task: [`XioStream::peek`] for adapters. What it
    /// copies stays to be read; a reset it reports is reported once, as
    /// [`XioStream::peek`]'s.
    pub fn poll_peek(&self, cx: &mut Context<'_>, out: &mut [u8]) -> Poll<io::Result<usize>> {
        self.poll_read_op(cx, None, |core, wake, c| core.peek_step(wake, c, out, true))
    }

    /// [`XioStream::poll_peek`] for a future that owns `entry` (see
    /// [`WaitEntry`]).
    pub fn poll_peek_entry(
        &self,
        cx: &mut Context<'_>,
        entry: &mut WaitEntry,
        out: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_read_op(cx, Some(entry), |core, wake, c| {
            core.peek_step(wake, c, out, true)
        })
    }

    /// [`XioStream::poll_peek`] for readiness (an adapter's
    /// `poll_read_ready`): an error it sees (a reset) is left for the next
    /// read or peek to report.
    pub fn poll_peek_ready(&self, cx: &mut Context<'_>, out: &mut [u8]) -> Poll<io::Result<usize>> {
        self.poll_read_op(cx, None, |core, wake, c| {
            core.peek_step(wake, c, out, false)
        })
    }

    /// [`XioStream::poll_peek_ready`] for a future that owns `entry` (an
    /// adapter's `readable()`; see [`WaitEntry`]).
    pub fn poll_peek_ready_entry(
        &self,
        cx: &mut Context<'_>,
        entry: &mut WaitEntry,
        out: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_read_op(cx, Some(entry), |core, wake, c| {
            core.peek_step(wake, c, out, false)
        })
    }

    /// [`Net::poll_op`] for a read, returning `Pending` without the lock
    /// when the task's waker is still the key's slot (see [`ReadSignal`]).
    /// A future's entry takes the lock each time: the signal records the
    /// slot's waker only.
    fn poll_read_op<R>(
        &self,
        cx: &Context<'_>,
        entry: Option<&mut WaitEntry>,
        mut f: impl FnMut(&mut Core, &mut Vec<Waiter>, ConnId) -> Try<R>,
    ) -> Poll<io::Result<R>> {
        let s = &self.inner;
        let slot = entry.is_none();
        if slot && s.sig.still_parked(cx.waker()) {
            return Poll::Pending;
        }
        let c = s.id;
        let w = cx.waker();
        s.net.poll_op(Key::Read(c), cx, entry, |core, wake| {
            s.sig.forget();
            let r = f(core, wake, c);
            if !slot {
                return r;
            }
            match &r {
                // `poll_op` registers the waker.
                Try::Wait => core.park_reader(c, &s.sig, w),
                // A read that took everything is followed at once by
                // another that finds nothing (hyper's is): register the
                // task now, in this lock hold, so that poll takes the
                // lock-free way. At worst the task is woken once without
                // reading, which futures allow.
                Try::Done(Ok(_)) if !core.table.is_readable(c) => {
                    core.add_waker(Key::Read(c), w, wake);
                    core.park_reader(c, &s.sig, w);
                }
                _ => {}
            }
            r
        })
    }

    /// Takes the next received pool buffer if there is one (`None`: end of
    /// stream), else registers the task.
    pub fn poll_recv_buf(&self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Buf>>> {
        self.poll_read_op(cx, None, |core, wake, c| core.chunk_step(wake, c))
    }

    /// Writes what fits now (credit, ring space, buffers), else registers
    /// the task. Several slices are packed into one buffer when they fit.
    pub fn poll_write_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let c = self.inner.id;
        let net = &self.inner.net;
        match net.write_on(c, bufs, true, None) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return Poll::Ready(r),
        }
        // Register, then try once more: what freed the way between the two
        // calls would otherwise wake nobody.
        let mut wake = Vec::new();
        {
            let mut g = net.lock();
            let smallest = net.shared.classes[0];
            if g.table.credit_left(c) < smallest {
                g.add_waker(Key::Write(c), cx.waker(), &mut wake);
            } else {
                g.add_retry(cx.waker());
            }
        }
        wake_all(&mut wake);
        match net.write_on(c, bufs, true, None) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
            r => Poll::Ready(r),
        }
    }

    /// Ready when a write would not wait: it would take at least one byte
    /// (the window has room for a buffer of the smallest class, the pool
    /// has one, and the ring to the peer has room with nothing queued
    /// behind it),
    /// or it would fail (the connection is closed or reset; the write
    /// reports the error). Otherwise registers the task where a write
    /// would wait. The smallest buffer is taken here and kept for the
    /// write, so pool exhaustion cannot make this ready and the write
    /// then block; in a pool whose smallest class is too small for spares
    /// (the net keeps none from reads) it is only looked for, and the
    /// write may then find the pool empty (`WouldBlock`, a readiness
    /// hint's usual caveat).
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_write_ready_in(cx, None)
    }

    /// [`XioStream::poll_write_ready`] for a future that owns `entry` (an
    /// adapter's `writable()`; see [`WaitEntry`]). A wait for room in a
    /// ring or a buffer of the pool, which no peer signals, is the
    /// retry's, as with `poll_write_ready`.
    pub fn poll_write_ready_entry(
        &self,
        cx: &mut Context<'_>,
        entry: &mut WaitEntry,
    ) -> Poll<io::Result<()>> {
        self.poll_write_ready_in(cx, Some(entry))
    }

    fn poll_write_ready_in(
        &self,
        cx: &mut Context<'_>,
        mut entry: Option<&mut WaitEntry>,
    ) -> Poll<io::Result<()>> {
        let net = &self.inner.net;
        let smallest = net.shared.classes[0];
        if let Some(e) = entry.as_deref_mut() {
            e.leave_unless(net);
        }
        let mut wake = Vec::new();
        let mut g = net.lock();
        let r = self.write_ready_step(&mut g, cx, &mut entry, smallest, &mut wake);
        if r.is_ready() {
            if let Some((k, id)) = entry.and_then(|e| e.at.take()) {
                g.remove_entry(k, id, &mut wake);
            }
        }
        drop(g);
        wake_all(&mut wake);
        r
    }

    fn write_ready_step(
        &self,
        g: &mut Core,
        cx: &mut Context<'_>,
        entry: &mut Option<&mut WaitEntry>,
        smallest: usize,
        wake: &mut Vec<Waiter>,
    ) -> Poll<io::Result<()>> {
        let c = self.inner.id;
        let net = &self.inner.net;
        // Not `send_target`: that takes a reset as reported, and the next
        // read would then see end of stream instead of the reset.
        let Some(peer) = g.table.send_peer(c) else {
            return Poll::Ready(Ok(()));
        };
        if g.table.credit_left(c) < smallest {
            match entry.as_deref_mut() {
                Some(e) => g.add_entry(net, Key::Write(c), cx.waker(), e, wake),
                None => g.add_waker(Key::Write(c), cx.waker(), wake),
            }
            return Poll::Pending;
        }
        if g.pending_for(peer) && !g.flush_pending() && g.pending_for(peer) {
            g.add_retry(cx.waker());
            return Poll::Pending;
        }
        if !g.stack.tx_room(peer) {
            // Full: the peer drains it when it runs (woken if asleep), and
            // the retry looks again.
            g.stack.wake_peer(peer);
            g.add_retry(cx.waker());
            return Poll::Pending;
        }
        if g.spare.is_empty() {
            match g.stack.try_alloc(smallest) {
                // Kept only where spares are allowed: a task that polls
                // and never writes would keep it for good, and in a class
                // too small for spares that can starve the peer's writer.
                // Not kept, readiness is a hint, as documented above.
                Ok(b) if g.spare_max > 0 => g.spare.push(b),
                Ok(b) => drop(b),
                Err(Error::WouldBlock) => {
                    g.add_retry(cx.waker());
                    return Poll::Pending;
                }
                Err(e) => return Poll::Ready(Err(stack_err(e))),
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Sends a pool buffer if there is credit and room, else registers the
    /// task and leaves the buffer in `slot`.
    pub fn poll_send_buf(
        &self,
        cx: &mut Context<'_>,
        slot: &mut Option<BufMut>,
    ) -> Poll<io::Result<()>> {
        let Some(buf) = slot.take() else {
            return Poll::Ready(Ok(()));
        };
        match self.send_buf_with(buf, true) {
            Ok(()) => Poll::Ready(Ok(())),
            Err((e, back)) if e.kind() == io::ErrorKind::WouldBlock => {
                *slot = back;
                let net = &self.inner.net;
                let mut wake = Vec::new();
                {
                    let mut g = net.lock();
                    let need = slot.as_ref().map_or(0, BufMut::capacity);
                    if g.table.credit_left(self.inner.id) < need {
                        g.add_waker(Key::Write(self.inner.id), cx.waker(), &mut wake);
                    } else {
                        g.add_retry(cx.waker());
                    }
                }
                wake_all(&mut wake);
                // Once more after registering (see `poll_write_vectored`).
                let buf = slot.take().expect("handed back");
                match self.send_buf_with(buf, true) {
                    Ok(()) => Poll::Ready(Ok(())),
                    Err((e, back)) if e.kind() == io::ErrorKind::WouldBlock => {
                        *slot = back;
                        Poll::Pending
                    }
                    Err((e, back)) => {
                        *slot = back;
                        Poll::Ready(Err(e))
                    }
                }
            }
            Err((e, back)) => {
                *slot = back;
                Poll::Ready(Err(e))
            }
        }
    }

    /// Waits (as a task) until the SYN is answered: `Ok` once connected,
    /// `ConnectionRefused` if the listener refused. A task that keeps
    /// waiting calls [`XioStream::check_connect_route`] now and then, as a
    /// blocking connect does on its own.
    pub fn poll_connected(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let c = self.inner.id;
        self.inner
            .net
            .poll_op(Key::Connect(c), cx, None, |core, _| core.connect_step(c))
    }

    /// [`XioStream::poll_connected`] for a future that owns `entry` (see
    /// [`WaitEntry`]).
    pub fn poll_connected_entry(
        &self,
        cx: &mut Context<'_>,
        entry: &mut WaitEntry,
    ) -> Poll<io::Result<()>> {
        let c = self.inner.id;
        self.inner
            .net
            .poll_op(Key::Connect(c), cx, Some(entry), |core, _| {
                core.connect_step(c)
            })
    }

    /// Whether the SYN was answered or refused (what
    /// [`XioStream::poll_connected`] would report), without registering
    /// anything.
    pub fn connect_settled(&self) -> bool {
        let c = self.inner.id;
        !matches!(self.inner.net.lock().connect_step(c), Try::Wait)
    }

    /// For an adapter whose task has waited a while for the SYN's answer
    /// ([`XioStream::poll_connected`]): asks the manager whether the
    /// address still belongs to the process the SYN went to, and if not
    /// refuses the connection (`ConnectionRefused`, also to the waiting
    /// task). A process that stopped listening there and makes no X-IO
    /// call any more would never answer: without this, the task waits for
    /// good where TCP's connect is refused. `Ok` if the SYN was answered
    /// or may still be. Waits at most 100 ms for the manager, holding the
    /// net: call it off the runtime's threads.
    pub fn check_connect_route(&self) -> io::Result<()> {
        let c = self.inner.id;
        let net = &self.inner.net;
        match net.syn_target(c)? {
            Some((peer, addr)) => net.check_syn_route(c, peer, addr, None),
            None => Ok(()),
        }
    }
}

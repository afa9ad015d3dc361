//! Readiness for event loops: [`Net::poll`] and its variants, and the retry timer.

use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::conn::ConnId;

use super::core::Core;
use super::waiters::{Key, Waiter};
#[cfg(doc)]
use super::XioStream;
use super::{Net, Try};

/// Longest a driver waits before retrying sends that did not fit a full
/// ring (nothing wakes it when the peer makes room).
pub(super) const RETRY_FULL: Duration = Duration::from_micros(50);

/// Longest pause of [`Net::poll_fd`]'s retry timer: while a peer makes no
/// room (it is stopped, say) or a pool no buffer, the pause doubles from
/// [`RETRY_FULL`] up to this: a loop asleep on the fd wakes about once a
/// millisecond meanwhile.
const RETRY_FULL_MAX: Duration = Duration::from_millis(1);

/// Readiness reported by [`Net::poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A stream (see [`XioStream::token`]) may be readable and/or writable.
    Stream {
        /// The stream's token.
        token: u64,
        /// A read may make progress (data, end of stream or an error).
        readable: bool,
        /// A write may make progress (credit came back, or an error).
        writable: bool,
    },
    /// A connection waits to be accepted on this address.
    Accept(SocketAddr),
}

impl Core {
    /// For [`Net::poll_nowait`]: while sends wait for ring space, or
    /// non-blocking writes for a full ring or an empty pool (noted in
    /// `retry_writes`, or reported writable by this poll to be tried
    /// again), sets the retry timer of [`Net::poll_fd`] (a short pause,
    /// doubling up to [`RETRY_FULL_MAX`] while no fewer wait), and stops
    /// it once none wait. Without a timer (the loop sleeps on the bare
    /// [`Net::doorbell`]) rings the doorbell instead, for the net's own
    /// sends: that loop comes straight back, as it does if the timer
    /// cannot be set. True if the doorbell has to ring.
    fn set_retry_timer(&mut self) -> bool {
        let own = self.pending_len();
        let reported = std::mem::take(&mut self.retries_reported);
        if self.retry_timer.is_none() {
            return own > 0;
        }
        let waiting = own + self.retry_writes.len() + reported;
        let pause = match (waiting, self.retry_armed) {
            (0, None) => return false,
            (0, Some(_)) => None,
            // Room made since the last try, or the first wait: soon.
            (n, Some((p, before))) if n >= before => Some((p * 2).min(RETRY_FULL_MAX)),
            _ => Some(RETRY_FULL),
        };
        // Unset, the loop is brought straight back instead.
        !self.arm_retry_timer(pause, waiting) && waiting > 0
    }

    /// Sets [`Net::poll_fd`]'s retry timer to fire once after `pause`
    /// (stops it on `None`), for `waiting` sends and writes; false if it
    /// could not be set (`retry_armed` is then left as it was).
    fn arm_retry_timer(&mut self, pause: Option<Duration>, waiting: usize) -> bool {
        use rustix::time::{timerfd_settime, Itimerspec, TimerfdTimerFlags, Timespec};
        let Some(timer) = &self.retry_timer else {
            return false;
        };
        let value = pause.map_or(
            Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            |p| Timespec {
                tv_sec: 0,
                tv_nsec: p.subsec_nanos().into(),
            },
        );
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // Setting the time (or stopping it) also clears an expiry not read
        // yet, so a timer that fired goes quiet here without a read.
        let set = timerfd_settime(
            timer,
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: zero,
                it_value: value,
            },
        );
        if set.is_err() {
            // (The next `set_retry_timer` tries again.)
            return false;
        }
        self.retry_armed = pause.map(|p| (p, waiting));
        true
    }

    /// A non-blocking write on `c` said `WouldBlock` for a full ring or an
    /// empty pool, which no peer signals the end of: [`Net::poll`] reports
    /// it writable after [`RETRY_FULL`], and a loop asleep on
    /// [`Net::poll_fd`] is woken for that by the retry timer, set here if
    /// it is not already (so the loop needs no poll of its own meanwhile).
    /// Only the `WouldBlock` path comes here.
    pub(super) fn note_retry_write(&mut self, c: ConnId) {
        if !self.track_ready || self.retry_writes.iter().any(|(r, _)| *r == c) {
            return;
        }
        self.retry_writes.push((c, Instant::now()));
        if self.retry_armed.is_none() {
            let waiting = self.pending_len() + self.retry_writes.len();
            // Unset (it cannot be), the loop's next poll tries again.
            let _ = self.arm_retry_timer(Some(RETRY_FULL), waiting);
        }
    }

    /// The token `poll` reports `c` under: the one chosen with
    /// [`XioStream::set_token`], else the connection's id.
    pub(super) fn token_of(&self, c: ConnId) -> u64 {
        match self.user_tokens.get(c.index()) {
            Some(&Some((id, token))) if id == c.0 => token,
            _ => u64::from(c.0),
        }
    }

    /// Where `c` is listed in `ready`, if it is.
    pub(super) fn ready_index(&self, c: ConnId) -> Option<usize> {
        let &(id, i) = self.ready_seen.get(c.index())?;
        (id == c.0 && self.ready_conn.get(i as usize) == Some(&Some(c.0))).then_some(i as usize)
    }

    /// Lists the remaining entries of `ready` afresh in `ready_seen`
    /// after the first ones were taken.
    fn reindex_ready(&mut self) {
        for (i, id) in self.ready_conn.iter().enumerate() {
            if let &Some(id) = id {
                self.ready_seen[ConnId(id).index()] = (id, i as u32);
            }
        }
    }

    /// Takes `c`'s event out of `ready`, if it is there.
    pub(super) fn forget_ready(&mut self, c: ConnId) {
        if let Some(i) = self.ready_index(c) {
            self.forget_ready_at(i);
        }
    }

    /// Takes entry `i` out of `ready` (and its index).
    pub(super) fn forget_ready_at(&mut self, i: usize) {
        self.ready.remove(i);
        self.ready_conn.remove(i);
        self.reindex_ready();
    }

    pub(super) fn note_ready(&mut self, c: ConnId, r: bool, w: bool) {
        // Not yet accepted: reported when it is (see `accept_on`), under
        // the token the program gives it then.
        if !self.track_ready || self.table.is_unaccepted(c) {
            return;
        }
        match self.ready_index(c) {
            Some(i) => {
                if let Event::Stream {
                    readable, writable, ..
                } = &mut self.ready[i]
                {
                    *readable |= r;
                    *writable |= w;
                }
            }
            None => {
                let i = c.index();
                if self.ready_seen.len() <= i {
                    self.ready_seen.resize(i + 1, (0, u32::MAX));
                }
                self.ready_seen[i] = (c.0, self.ready.len() as u32);
                self.ready_conn.push(Some(c.0));
                self.ready.push(Event::Stream {
                    token: self.token_of(c),
                    readable: r,
                    writable: w,
                });
            }
        }
    }

    /// Wakes a thread waiting in [`Net::poll`] while another thread
    /// drives (a blocking call on another stream): the readiness just
    /// noted is what it waits for, and nothing else would wake it until
    /// the driver's own call ends.
    pub(super) fn wake_poller(&mut self, wake: &mut Vec<Waiter>) {
        if self.track_ready && !self.waiters.is_empty() && self.waiters.contains_key(&Key::Poll) {
            self.wake_key(Key::Poll, wake);
        }
    }

    /// Reports as writable the non-blocking writes that waited
    /// [`RETRY_FULL`] on a full ring or an empty pool: time to try again.
    fn ripe_retries(&mut self) {
        if self.retry_writes.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut i = 0;
        while i < self.retry_writes.len() {
            let (c, since) = self.retry_writes[i];
            if now.duration_since(since) >= RETRY_FULL {
                self.retry_writes.swap_remove(i);
                self.retries_reported = self.retries_reported.saturating_add(1);
                self.note_ready(c, false, true);
            } else {
                i += 1;
            }
        }
    }
}

impl Net {
    /// Waits for readiness events of streams in non-blocking mode (an
    /// `epoll_wait` for X-IO sockets): appends to `events` what became
    /// readable, writable or acceptable since the last call, waiting up to
    /// `timeout` (per the net's waiting mode) when nothing is. With batch
    /// wake-up on, one drain of the rings reports every ready connection;
    /// off, one descriptor at a time. Events are edge-like hints: after
    /// one, read or write until `WouldBlock`.
    ///
    /// Once a net has been polled, `poll` is where its rings are drained:
    /// a non-blocking read or write that finds nothing to do returns
    /// `WouldBlock` at once, and what arrives later is reported by the
    /// next `poll` (as with a socket and `epoll`). Blocking calls still
    /// drain and wait as usual.
    pub fn poll(&self, events: &mut Vec<Event>, timeout: Option<Duration>) -> io::Result<usize> {
        self.poll_capped(events, usize::MAX, timeout)
    }

    /// [`Net::poll`] appending at most `cap` events (at least one); the
    /// rest stay for the next call, where [`XioStream::set_token`] still
    /// changes their tokens (as `epoll_wait`'s `maxevents`).
    pub fn poll_capped(
        &self,
        events: &mut Vec<Event>,
        cap: usize,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let cap = cap.max(1);
        let start = events.len();
        let mut collect = |core: &mut Core, _: &mut Vec<Waiter>| {
            // A poll ends any write batch's run (see `Net::batch_writes`).
            core.release_held();
            core.ring_unrung();
            if !core.track_ready {
                // From now on readiness is recorded; what is ready already
                // is reported first.
                core.track_ready = true;
                let (conns, accepts) = core.table.ready_now();
                for (c, r, w) in conns {
                    core.note_ready(c, r, w);
                }
                for a in accepts {
                    core.ready.push(Event::Accept(a));
                    core.ready_conn.push(None);
                }
            }
            core.ripe_retries();
            if core.ready.is_empty() {
                return Try::Wait;
            }
            if core.ready.len() <= cap {
                core.ready_conn.clear();
                events.append(&mut core.ready);
            } else {
                events.extend(core.ready.drain(..cap));
                core.ready_conn.drain(..cap);
                core.reindex_ready();
                // Bring a loop that sleeps on the doorbell's fd back for
                // the rest.
                let _ = core.stack.ring_self();
            }
            Try::Done(Ok(()))
        };
        // Under load something is ready at once: look (and drain) before
        // reading the clock for a deadline.
        let r = match self.block(Key::Poll, true, None, &mut collect) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && timeout != Some(Duration::ZERO) => {
                // (`Duration::MAX` and the like: no deadline.)
                let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
                self.block(Key::Poll, false, deadline, &mut collect)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            r => r,
        };
        match r {
            Ok(()) => Ok(events.len() - start),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// [`Net::poll`] for event loops that wait on [`Net::poll_fd`]
    /// themselves (an `epoll` loop in C): collects what is ready without
    /// waiting, then arms the doorbell, so the fd becomes readable when
    /// more arrives. Call it whenever the fd is readable.
    ///
    /// A non-blocking write (or a stream's `alloc`) that said
    /// `WouldBlock` for a full ring or an empty pool, which no peer
    /// signals the end of, is reported writable again after 50 µs: on
    /// [`Net::poll_fd`] the retry timer below makes the fd readable for
    /// that, so a loop asleep on it alone needs nothing more. A loop
    /// asleep on the bare [`Net::doorbell`] has no timer: it calls this at
    /// least every millisecond while such a write waits.
    ///
    /// What the net sends by itself (a close's FIN, the window a read
    /// gives back) and finds a peer's ring full for is retried when the
    /// fd's timer fires: after 50 µs, the pause doubling up to 1 ms while
    /// the peer makes no room (a stopped peer costs the loop a wake-up a
    /// millisecond, not a core). The same timer, with the same back-off,
    /// brings the loop back for the writes above. A loop asleep on the bare
    /// [`Net::doorbell`] has no timer: for it the doorbell is left
    /// readable while such sends wait, and it comes straight back.
    ///
    /// An error met after events were collected (a failed drain) comes
    /// with the next call, the fd left readable for it: the events are
    /// returned, not dropped with it.
    pub fn poll_nowait(&self, events: &mut Vec<Event>) -> io::Result<usize> {
        self.poll_nowait_capped(events, usize::MAX)
    }

    /// [`Net::poll_nowait`] appending at most `cap` events (at least one);
    /// when more are ready the doorbell is left readable so the caller
    /// comes back for them (and while sends of the net's own wait for a
    /// peer's ring to have room, its timer is set: see
    /// [`Net::poll_nowait`]).
    pub fn poll_nowait_capped(&self, events: &mut Vec<Event>, cap: usize) -> io::Result<usize> {
        self.poll_nowait_hinted(events, cap, true)
    }

    /// [`Net::poll_nowait_capped`] for a loop that knows whether
    /// [`Net::poll_fd`] was readable since it last called: with `rung`
    /// false the doorbell is not read (a read that would find nothing: one
    /// system call saved on each look that did not sleep, which under
    /// load is most of them). A ring left unread keeps the fd readable:
    /// the loop's next wait on it returns at once, and it calls this with
    /// `rung` true. When unsure, pass true.
    pub fn poll_nowait_hinted(
        &self,
        events: &mut Vec<Event>,
        cap: usize,
        rung: bool,
    ) -> io::Result<usize> {
        let cap = cap.max(1);
        let start = events.len();
        if let Some(e) = self.lock().poll_error.take() {
            return Err(e);
        }
        self.poll_capped(events, cap, Some(Duration::ZERO))?;
        // Read the control socket once the manager's liveness word says it
        // died (one load); where no manager registered the word, about
        // once a second.
        let alive = self.shared.seg.manager_alive();
        let liveness = if crate::liveness::watched(alive) {
            crate::liveness::died(alive)
        } else {
            let mut g = self.lock();
            let now = crate::wait::now_ns();
            let due = now.saturating_sub(g.last_liveness) > 1_000_000_000;
            if due {
                g.last_liveness = now;
            }
            due
        };
        // Consume the doorbell, drain what came meanwhile (recorded as
        // readiness) and arm the doorbell; when something keeps arriving
        // as we arm, leave the fd readable so the caller comes back.
        let mut armed = false;
        // A failure from here on must not take the events collected
        // above with it (the C ABI returns an error code alone): they go
        // to the caller, the error with the next call.
        let mut failed = None;
        for _ in 0..4 {
            let d = match self.drive(rung, liveness) {
                Ok(d) => d,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            if d.retry {
                self.wake_retriers();
            }
            if d.armed {
                armed = true;
                break;
            }
        }
        let room = cap - (events.len() - start);
        if failed.is_none() && room > 0 && !self.lock().ready.is_empty() {
            if let Err(e) = self.poll_capped(events, room, Some(Duration::ZERO)) {
                failed = Some(e);
            }
        }
        // Sends queued behind a full ring (a FIN, a credit) go out only
        // when a drain retries them, and the room a peer makes rings
        // nobody: the caller has to come back for them (as `Drive::retry`
        // asks a driver to), rather than sleep with them queued while the
        // peer waits for them. A loop on `poll_fd` comes back when its
        // timer fires: after a pause, not at once, so a peer that does
        // not run (stopped) costs it no core meanwhile. One on the bare
        // doorbell finds it readable again at once.
        let again = {
            let mut g = self.lock();
            let retry = g.set_retry_timer();
            !g.ready.is_empty() || retry
        };
        // After a failure the doorbell may be unarmed with the rings
        // holding more: ring it, so the caller comes back (for the
        // error, and to drain again) instead of sleeping on them.
        let rung = if !armed || again || failed.is_some() {
            self.ring_doorbell()
        } else {
            Ok(())
        };
        let n = events.len() - start;
        match failed.or(rung.err()) {
            Some(e) if n == 0 => Err(e),
            Some(e) => {
                self.lock().poll_error = Some(e);
                Ok(n)
            }
            None => Ok(n),
        }
    }

    /// Makes [`Net::doorbell`] readable, so an external loop waiting on it
    /// comes back (for example while it holds events it has not handed
    /// out yet).
    pub fn ring_doorbell(&self) -> io::Result<()> {
        self.lock().stack.ring_self()
    }
}

//! The zero-copy receive path: checking each descriptor a peer pushed and
//! taking its buffer, draining the rings into the inbox, and
//! [`Stack::recv`] and its variants (timeouts, bursts, and
//! [`Stack::recv_burst_with`] with its guard for a panicking `f`).

use std::time::{Duration, Instant};

use crate::backend::{RawBuf, Reject};
use crate::buf::Buf;
use crate::layout::{kind, Descriptor};
use crate::sync::Ordering;
use crate::wait::WaitMode;

use super::{Error, Event, Incoming, Message, PeerId, Stack, BURST};

impl Stack {
    /// Checks one received descriptor and takes its buffer; a rejected
    /// one is counted (here and in the slot, for status) and logged.
    pub(super) fn take_descriptor(&mut self, peer: PeerId, d: &Descriptor) -> Option<RawBuf> {
        let r = if kind::carries_buffer(d.kind) {
            self.pool.accept(peer.slot(), d)
        } else {
            Err(Reject::Kind(d.kind))
        };
        match r {
            Ok(raw) => Some(raw),
            Err(why) => {
                self.corrupt += 1;
                self.slot().corrupt.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(%peer, ?d, %why, "rejected a corrupt descriptor");
                None
            }
        }
    }

    /// Starts loading the headers of `self.scratch[..n]` so their misses
    /// overlap (a single descriptor gains nothing from it).
    ///
    /// With `payloads`, also each buffer's payload lines past the header's
    /// (and the header of a lone descriptor, whose miss then overlaps the
    /// payload's): for the socket layer, whose reads copy every payload
    /// out. A zero-copy receiver may never touch the payload, and pulling
    /// lines it does not read would make the sender's next write of them
    /// a miss.
    pub(super) fn prefetch_scratch(&self, n: usize, payloads: bool) {
        let Some(v) = self.pool.shm_view() else {
            return;
        };
        if n > 1 || payloads {
            for d in &self.scratch[..n] {
                v.prefetch(d, payloads && kind::carries_buffer(d.kind));
            }
        }
    }

    /// Validates `self.scratch[..n]` from `peer` and queues what passes as
    /// `Buf`s. The headers are prefetched first, so their misses overlap.
    pub(super) fn deliver_burst(&mut self, peer: PeerId, n: usize) {
        self.prefetch_scratch(n, false);
        // The `Buf`s' pool references first: those not kept from our sends
        // are made here, where their increments (locked instructions) do
        // not stall on the header stores below (each an ownership transfer
        // of a line the sender wrote). The loop then only takes kept ones.
        self.keep_refs(n);
        for j in 0..n {
            let d = self.scratch[j];
            if !kind::carries_buffer(d.kind) && kind::is_known(d.kind) {
                self.inbox.push_back(Event::Sock(Incoming::Control {
                    from: peer,
                    kind: d.kind,
                    conn: d.conn,
                    arg: d.index,
                    arg2: d.len,
                }));
                continue;
            }
            if let Some(raw) = self.take_descriptor(peer, &d) {
                let mut buf = Buf::new(self.pool_ref(), raw, d.len as usize);
                if let (Some(p), true) = (&self.private, d.kind == kind::DATA) {
                    buf = p.copy_of(buf);
                }
                self.inbox.push_back(if d.kind == kind::DATA {
                    Event::Msg(Message {
                        from: peer,
                        tag: d.conn,
                        buf,
                    })
                } else {
                    Event::Sock(Incoming::Buf {
                        from: peer,
                        kind: d.kind,
                        conn: d.conn,
                        buf,
                    })
                });
            }
        }
    }

    /// Moves whatever the rings hold into the inbox. Returns how many
    /// descriptors were taken.
    pub(super) fn poll_rings(&mut self) -> Result<usize, Error> {
        self.check_not_forked()?;
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        self.poll_ctrl_if_bumped()?;
        let n_ch = self.channels.len();
        let mut total = 0;
        let mut broken = Vec::new();
        for k in 0..n_ch {
            let i = (self.rr + k) % n_ch;
            let n = match self.channels[i].rx.pop_burst(&mut self.scratch) {
                Ok(n) => n,
                Err(_) => {
                    // An impossible ring index: the peer is broken. Count it
                    // and stop reading that channel.
                    self.corrupt += 1;
                    self.slot().corrupt.fetch_add(1, Ordering::Relaxed);
                    broken.push(self.channels[i].peer);
                    continue;
                }
            };
            let peer = self.channels[i].peer_id;
            self.deliver_burst(peer, n);
            total += n;
        }
        self.rr = self.rr.wrapping_add(1);
        for p in broken {
            self.close_channel(p, None);
        }
        Ok(total)
    }

    fn next_event(
        &mut self,
        deadline: Option<Instant>,
        mode: Option<WaitMode>,
    ) -> Result<Message, Error> {
        // Before the inbox: what it holds are the parent's buffers, which
        // a forked child must not be handed as well.
        self.check_not_forked()?;
        let saved = self.mode;
        if let Some(m) = mode {
            self.mode = m;
        }
        let r = loop {
            if let Some(ev) = self.inbox.pop_front() {
                break match ev {
                    Event::Msg(m) => Ok(m),
                    Event::Reset(p) => Err(Error::Reset(p)),
                    Event::Sock(_) => continue,
                };
            }
            match self.poll_rings() {
                Ok(n) if n > 0 => continue,
                Ok(_) => {}
                Err(e) => break Err(e),
            }
            if self.inbox.is_empty() {
                if let Err(e) = self.wait(deadline) {
                    break Err(e);
                }
            }
        };
        self.mode = saved;
        r
    }

    /// Receives the next message, waiting per the stack's mode. A peer that
    /// died or left is reported once as [`Error::Reset`] after the messages
    /// it sent before.
    pub fn recv(&mut self) -> Result<Message, Error> {
        self.next_event(None, None)
    }

    /// Receives without waiting ([`Error::WouldBlock`] when nothing is ready).
    pub fn try_recv(&mut self) -> Result<Message, Error> {
        self.next_event(None, Some(WaitMode::NonBlocking))
    }

    /// Receives, waiting at most `timeout` ([`Error::TimedOut`]). Waits
    /// even in non-blocking mode (adaptively then), since a timeout asks to.
    /// A timeout too large for a deadline (`Duration::MAX`) waits
    /// without one.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Message, Error> {
        let mode = (self.mode == WaitMode::NonBlocking).then_some(WaitMode::Adaptive);
        // A timeout past what an `Instant` holds (`Duration::MAX`, as one
        // writes "forever") is no deadline, not an overflow panic.
        self.next_event(Instant::now().checked_add(timeout), mode)
    }

    /// Receives up to `max` ready messages into `out` after waiting for the
    /// first; returns how many. An error met once messages are in hand
    /// (the manager found gone, say) is returned by the next receive, so
    /// an `Err` never comes with messages in `out`. With `max` 0 it
    /// returns 0 at once.
    pub fn recv_burst(&mut self, out: &mut Vec<Message>, max: usize) -> Result<usize, Error> {
        self.check_not_forked()?;
        if max == 0 {
            return Ok(0); // room for none: nothing to wait for
        }
        let first = self.recv()?;
        out.push(first);
        let mut n = 1;
        while n < max {
            match self.inbox.front() {
                Some(Event::Msg(_)) => {
                    if let Some(Event::Msg(m)) = self.inbox.pop_front() {
                        out.push(m);
                        n += 1;
                    }
                }
                Some(Event::Reset(_)) => break,
                Some(Event::Sock(_)) => {
                    self.inbox.pop_front();
                }
                None => match self.poll_rings() {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        // The messages in hand first; the error next time.
                        self.deferred = Some(e);
                        break;
                    }
                },
            }
        }
        Ok(n)
    }

    /// Receives up to `max` messages and shows each to `f` as
    /// `(sender, tag, payload)`; the buffers return to the pool together
    /// right after. Waits for the first message per the mode. The burst
    /// path for consumers that look at each payload and are done with it:
    /// no `Buf` per message, one pass over the private cache per burst.
    /// A peer's reset is reported as [`Error::Reset`] once its earlier
    /// messages were shown. With `max` 0 it returns 0 at once.
    pub fn recv_burst_with(
        &mut self,
        max: usize,
        mut f: impl FnMut(PeerId, u32, &[u8]),
    ) -> Result<usize, Error> {
        self.check_not_forked()?;
        if max == 0 {
            // Nothing may be shown: waiting for a first message would
            // never end (it could not be taken).
            return Ok(0);
        }
        loop {
            // Messages already queued as `Buf`s (after a reset, say) first.
            if let Some(ev) = self.inbox.pop_front() {
                return match ev {
                    Event::Msg(m) => {
                        f(m.from, m.tag, &m.buf);
                        Ok(1)
                    }
                    Event::Reset(p) => Err(Error::Reset(p)),
                    Event::Sock(_) => continue,
                };
            }
            if let Some(e) = self.deferred.take() {
                return Err(e);
            }
            self.poll_ctrl_if_bumped()?;
            if !self.inbox.is_empty() {
                continue;
            }
            let mut shown = 0;
            let mut done = [RawBuf { class: 0, index: 0 }; BURST];
            let n_ch = self.channels.len();
            for k in 0..n_ch {
                if shown >= max {
                    break;
                }
                let i = (self.rr + k) % n_ch;
                let want = (max - shown).min(BURST);
                let Ok(n) = self.channels[i].rx.pop_burst(&mut self.scratch[..want]) else {
                    if shown > 0 {
                        // What was shown is this call's result; the next
                        // call meets the broken ring again.
                        break;
                    }
                    // A broken ring: the general path reports and closes it.
                    return self.recv().map(|m| {
                        f(m.from, m.tag, &m.buf);
                        1
                    });
                };
                let peer = self.channels[i].peer_id;
                self.prefetch_scratch(n, false);
                // Buffers taken (to free below), and messages shown. The
                // guard sees to them if `f` panics.
                let mut g = Shown {
                    stack: &mut *self,
                    done: &mut done,
                    taken: 0,
                    next: 0,
                    n,
                    peer,
                    unwinding: true,
                };
                let mut k_shown = 0;
                for j in 0..n {
                    g.next = j + 1;
                    let d = g.stack.scratch[j];
                    if !kind::carries_buffer(d.kind) && kind::is_known(d.kind) {
                        // The socket layer's control kinds are no messages
                        // (`recv` drops them too), and not corrupt.
                        continue;
                    }
                    if let Some(raw) = g.stack.take_descriptor(peer, &d) {
                        // Counted before `f` sees it: freed if `f` panics.
                        g.done[g.taken] = raw;
                        g.taken += 1;
                        // A socket-layer buffer (stream bytes, a SYN) is
                        // no message either: it only goes back.
                        if d.kind == kind::DATA {
                            let (ptr, _) = g.stack.pool.data(raw);
                            // SAFETY: `take_descriptor` checked the buffer
                            // is ours (HELD) and `d.len` fits it; it stays
                            // ours until `free_many` below (or the guard's).
                            let payload =
                                unsafe { std::slice::from_raw_parts(ptr, d.len as usize) };
                            f(peer, d.conn, payload);
                            k_shown += 1;
                        }
                    }
                }
                g.unwinding = false;
                let k_ok = g.taken;
                drop(g);
                self.pool.free_many(&done[..k_ok]);
                shown += k_shown;
            }
            self.rr = self.rr.wrapping_add(1);
            if shown > 0 {
                return Ok(shown);
            }
            self.wait(None)?;
        }
    }
}

/// `recv_burst_with`'s burst while the caller's `f` runs. If `f` panics
/// (and the application catches it), the buffers taken go back to the
/// pool, and the messages of the burst after the one `f` was shown are
/// kept for the next receive. Without it the buffers stayed held by this
/// stack with no handle, and the rest of the burst, off the ring and
/// never taken, were lost and their buffers with them, as long as the
/// stack lived.
struct Shown<'a> {
    stack: &'a mut Stack,
    done: &'a mut [RawBuf; BURST],
    /// Buffers taken (`done[..taken]`).
    taken: usize,
    /// The first descriptor of `stack.scratch[..n]` not looked at.
    next: usize,
    n: usize,
    peer: PeerId,
    /// Until the burst is handled the normal way.
    unwinding: bool,
}

impl Drop for Shown<'_> {
    fn drop(&mut self) {
        if !self.unwinding {
            return;
        }
        self.stack.pool.free_many(&self.done[..self.taken]);
        let rest = self.n - self.next;
        self.stack.scratch.copy_within(self.next..self.n, 0);
        self.stack.deliver_burst(self.peer, rest);
    }
}

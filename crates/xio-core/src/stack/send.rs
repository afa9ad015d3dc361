//! The zero-copy send path: [`Stack::send`] and its variants, the burst
//! paths ([`Stack::send_burst`], [`Stack::send_burst_with`] and its guard
//! for a panicking `fill`), the checks a send makes (our pool's buffer, an
//! open channel), and waking a peer that sleeps (the producer half of the
//! Dekker handshake with `wait_on`).

use crate::backend::{AllocError, AnyPool, Doorbell, RawBuf};
use crate::buf::BufMut;
use crate::layout::{chan_state, kind, Descriptor, SLEEP_EVENTFD, SLEEP_FUTEX};
use crate::segment::Segment;
use crate::sync::{fence, futex_wake, Ordering};
use crate::wait::{now_ns, WaitMode};

use super::alloc::take_for_send;
use super::waiting::backoff_wait;
#[cfg(doc)]
use super::Message;
use super::{Chan, Error, Event, PeerId, Stack, BURST};

impl Stack {
    /// Sends `buf` to `peer` (zero-copy: the buffer itself moves).
    /// Waits while the ring is full; [`Error::Reset`] if the peer is gone.
    pub fn send(&mut self, peer: PeerId, buf: BufMut) -> Result<(), Error> {
        self.send_tagged(peer, 0, buf)
    }

    /// Sends with a tag the receiver sees in [`Message::tag`].
    pub fn send_tagged(&mut self, peer: PeerId, tag: u32, buf: BufMut) -> Result<(), Error> {
        let mut one = Some(buf);
        self.send_from(peer, tag, &mut one, self.mode)
    }

    /// [`Stack::send_tagged`] that hands the buffer back when it fails
    /// (a reset peer, or a full ring in non-blocking mode), so a caller
    /// that must lose nothing (the C ABI) keeps it.
    pub fn send_or_return(
        &mut self,
        peer: PeerId,
        tag: u32,
        buf: BufMut,
    ) -> Result<(), (Error, Option<BufMut>)> {
        let mut one = Some(buf);
        match self.send_from(peer, tag, &mut one, self.mode) {
            Ok(()) => Ok(()),
            Err(e) => Err((e, one)),
        }
    }

    /// Sends without waiting: a full ring hands the buffer back in
    /// `Err((Error::WouldBlock, buf))`.
    pub fn try_send(&mut self, peer: PeerId, buf: BufMut) -> Result<(), (Error, Option<BufMut>)> {
        let mut one = Some(buf);
        match self.send_from(peer, 0, &mut one, WaitMode::NonBlocking) {
            Ok(()) => Ok(()),
            Err(e) => Err((e, one)),
        }
    }

    /// Sends every buffer in `bufs` (in order) with one doorbell check at
    /// the end: the burst path for one-way streams. A buffer of another
    /// pool fails the call with [`Error::ForeignBuffer`] before anything
    /// is sent. Waits (per the mode) for ring space; in non-blocking mode
    /// a full ring fails with [`Error::WouldBlock`]. On any error the
    /// buffers not sent stay in `bufs`.
    pub fn send_burst(&mut self, peer: PeerId, bufs: &mut Vec<BufMut>) -> Result<(), Error> {
        let Some(ci) = self.chan_of(peer) else {
            return Err(self.no_channel(peer));
        };
        let mut ci = ci;
        for b in bufs.iter_mut() {
            if let Some(copy) = self.pool_copy(b)? {
                *b = copy;
            }
            self.check_ours(b)?;
        }
        let mut descs = [Descriptor::default(); BURST];
        let mut sent = 0;
        let total = bufs.len();
        let mut backoff = 0u32;
        while sent < total {
            self.check_open(ci, peer)?;
            let ch = &mut self.channels[ci];
            let free = match ch.tx_space((total - sent).min(BURST)) {
                Ok(f) => f,
                Err(()) => {
                    self.close_channel(peer.slot(), None);
                    return Err(Error::Reset(peer));
                }
            };
            if free == 0 {
                Self::notify(&self.seg, ch);
                self.seg
                    .stack_slot(self.id)
                    .ring_full
                    .fetch_add(1, Ordering::Relaxed);
                if self.mode == WaitMode::NonBlocking {
                    // What was not sent stays in `bufs`.
                    return Err(Error::WouldBlock);
                }
                backoff_wait(&mut backoff, self.mode);
                if self.reap_while_sending() {
                    // Channels may have closed (and moved).
                    ci = self.chan_of(peer).ok_or(Error::Reset(peer))?;
                }
                continue;
            }
            let n = free.min(BURST).min(total - sent);
            // Release our references first (locked decrements), then stamp
            // the headers (stores to lines the receiver will read, which
            // must not be held up by a locked instruction after them).
            let mut raws = [(RawBuf { class: 0, index: 0 }, 0usize); BURST];
            for (r, b) in raws.iter_mut().zip(bufs.drain(..n)) {
                *r = take_for_send(self.refs.get_mut(), &self.pool, b);
            }
            for (k, &(raw, len)) in raws[..n].iter().enumerate() {
                descs[k] = self
                    .pool
                    .prepare_send(raw, len as u32, peer.slot(), 0, kind::DATA);
            }
            let pushed = ch.tx.push_burst(&descs[..n]).unwrap_or(0);
            debug_assert_eq!(pushed, n, "we are the only producer and saw room");
            sent += n;
        }
        Self::notify(&self.seg, &self.channels[ci]);
        Ok(())
    }

    /// Sends `n` messages of `len` bytes to `peer`, letting `fill(i, payload)`
    /// write each straight into its pool buffer: the burst path for
    /// producers, with no `BufMut` per message and one pass over the private
    /// cache per burst. Waits (per the mode) for buffers and ring space.
    pub fn send_burst_with(
        &mut self,
        peer: PeerId,
        n: usize,
        len: usize,
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> Result<(), Error> {
        let Some(ci) = self.chan_of(peer) else {
            return Err(self.no_channel(peer));
        };
        let mut ci = ci;
        let mut raws = [RawBuf { class: 0, index: 0 }; BURST];
        let mut descs = [Descriptor::default(); BURST];
        let mut sent = 0;
        let mut backoff = 0u32;
        while sent < n {
            self.check_open(ci, peer)?;
            let free = match self.channels[ci].tx_space((n - sent).min(BURST)) {
                Ok(f) => f,
                Err(()) => {
                    self.close_channel(peer.slot(), None);
                    return Err(Error::Reset(peer));
                }
            };
            if free == 0 {
                Self::notify(&self.seg, &self.channels[ci]);
                self.seg
                    .stack_slot(self.id)
                    .ring_full
                    .fetch_add(1, Ordering::Relaxed);
                if self.mode == WaitMode::NonBlocking {
                    return Err(Error::WouldBlock);
                }
                backoff_wait(&mut backoff, self.mode);
                if self.reap_while_sending() {
                    // Channels may have closed (and moved).
                    ci = self.chan_of(peer).ok_or(Error::Reset(peer))?;
                }
                continue;
            }
            let want = free.min(BURST).min(n - sent);
            let got = match self.pool.alloc_many(len, &mut raws[..want]) {
                Ok(g) => g,
                Err(AllocError::TooLarge(l)) => return Err(Error::TooLarge(l)),
                Err(AllocError::Forked) => return Err(Error::Forked),
                Err(AllocError::ManagerGone) => return Err(Error::ManagerGone),
                Err(AllocError::Exhausted) => {
                    Self::notify(&self.seg, &self.channels[ci]);
                    if self.mode == WaitMode::NonBlocking {
                        return Err(Error::WouldBlock);
                    }
                    backoff_wait(&mut backoff, self.mode);
                    continue;
                }
            };
            // The guard sees to the buffers if `fill` panics.
            let mut g = Filling {
                chan: &mut self.channels[ci],
                seg: &self.seg,
                pool: &self.pool,
                raws: &raws[..got],
                descs: &mut descs,
                stamped: 0,
                unwinding: true,
            };
            for k in 0..got {
                let raw = g.raws[k];
                let (ptr, _) = g.pool.data(raw);
                // SAFETY: freshly allocated to us (ALLOCATED), `len` fits
                // the class; nobody else touches it until it is sent.
                let payload = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                fill(sent + k, payload);
                g.descs[k] = g
                    .pool
                    .prepare_send(raw, len as u32, peer.slot(), 0, kind::DATA);
                g.stamped = k + 1;
            }
            g.unwinding = false;
            let pushed = g.chan.tx.push_burst(&g.descs[..got]).unwrap_or(0);
            debug_assert_eq!(pushed, got, "we are the only producer and saw room");
            drop(g);
            sent += got;
        }
        Self::notify(&self.seg, &self.channels[ci]);
        Ok(())
    }

    /// Refuses a buffer of another pool. Its (class, index) would name a
    /// buffer of ours: sending it would hand a peer a buffer someone else
    /// may hold, and leave the real one allocated in its own pool.
    pub(crate) fn check_ours(&self, b: &BufMut) -> Result<(), Error> {
        // Almost always our own stack's buffer: one pointer comparison.
        if b.pool_addr() == self.pool.addr() || b.pool_id() == self.pool.pool_id() {
            Ok(())
        } else {
            Err(Error::ForeignBuffer)
        }
    }

    /// The error of a send to `peer`, which has no channel here: `Reset`
    /// while its departure is still to be reported (a receive closed the
    /// channel and queued the reset behind the peer's last messages, which
    /// the caller may be answering), as when a send finds the channel
    /// closing, or when another generation holds the peer's slot now (the
    /// peer died and another stack took its slot); `NotConnected`
    /// otherwise.
    fn no_channel(&self, peer: PeerId) -> Error {
        let reset_queued = self
            .inbox
            .iter()
            .any(|e| matches!(e, Event::Reset(p) if peer.names(*p)));
        let slot_taken_over = self.by_peer.contains_key(&peer.slot());
        if reset_queued || slot_taken_over {
            Error::Reset(peer)
        } else {
            Error::NotConnected(peer)
        }
    }

    pub(super) fn check_open(&mut self, ci: usize, peer: PeerId) -> Result<(), Error> {
        self.check_not_forked()?;
        let id = self.channels[ci].id;
        if self.seg.channel(id).state.load(Ordering::Acquire) != chan_state::ACTIVE {
            self.close_channel(peer.slot(), None);
            return Err(Error::Reset(peer));
        }
        Ok(())
    }

    fn send_from(
        &mut self,
        peer: PeerId,
        tag: u32,
        slot: &mut Option<BufMut>,
        mode: WaitMode,
    ) -> Result<(), Error> {
        if let Some(b) = slot {
            if let Some(copy) = self.pool_copy(b)? {
                *b = copy;
            }
            self.check_ours(b)?;
        }
        let mut backoff = 0u32;
        // Whether the control socket was read while waiting for room: a
        // channel missing after that was closed by the news it held.
        let mut polled = false;
        loop {
            let Some(ci) = self.chan_of(peer) else {
                return Err(if polled {
                    Error::Reset(peer)
                } else {
                    self.no_channel(peer)
                });
            };
            self.check_open(ci, peer)?;
            let ch = &mut self.channels[ci];
            match ch.tx_space(1) {
                Ok(0) => {
                    self.seg
                        .stack_slot(self.id)
                        .ring_full
                        .fetch_add(1, Ordering::Relaxed);
                    if mode == WaitMode::NonBlocking {
                        return Err(Error::WouldBlock);
                    }
                    // Full: make sure the consumer is awake, then wait for it
                    // to make room. Also watch for the peer's death.
                    Self::notify(&self.seg, ch);
                    backoff_wait(&mut backoff, mode);
                    if self.slot().ctrl_seq.load(Ordering::Acquire) != self.ctrl_seen {
                        polled = true;
                        self.poll_rings()?;
                    }
                    polled |= self.reap_while_sending();
                }
                Ok(_) => {
                    let buf = slot.take().expect("buffer present until sent");
                    let (raw, len) = take_for_send(self.refs.get_mut(), &self.pool, buf);
                    let d = self
                        .pool
                        .prepare_send(raw, len as u32, peer.slot(), tag, kind::DATA);
                    let pushed = ch.tx.push_one(d.to_words()).unwrap_or(false);
                    debug_assert!(pushed, "we are the only producer and saw room");
                    Self::notify(&self.seg, ch);
                    return Ok(());
                }
                Err(()) => {
                    self.close_channel(peer.slot(), None);
                    return Err(Error::Reset(peer));
                }
            }
        }
    }

    /// Wakes the peer if it is asleep (the producer half of the Dekker
    /// handshake in `wait`): a futex wake, or the doorbell for a peer that
    /// waits in a reactor.
    #[inline]
    pub(super) fn notify(seg: &Segment, ch: &Chan) {
        fence(Ordering::SeqCst);
        let s = seg.stack_slot(ch.peer);
        if s.sleeping.load(Ordering::Relaxed) != 0 {
            match s.sleeping.swap(0, Ordering::AcqRel) {
                SLEEP_FUTEX => {
                    s.rung_at.store(now_ns(), Ordering::Relaxed);
                    futex_wake(&s.sleeping);
                }
                SLEEP_EVENTFD => {
                    s.rung_at.store(now_ns(), Ordering::Relaxed);
                    let _ = ch.peer_bell.ring();
                }
                _ => {}
            }
        }
    }
}

/// `send_burst_with`'s buffers while the caller's `fill` runs. If `fill`
/// panics (and the application catches it), the messages filled and
/// stamped in flight to the peer go out, as whole messages, and the
/// buffers not filled go back to the pool. Without it they stayed
/// allocated to this stack, and stamped for the receiver with no
/// descriptor in its ring, as long as both lived.
struct Filling<'a> {
    chan: &'a mut Chan,
    seg: &'a Segment,
    pool: &'a AnyPool,
    raws: &'a [RawBuf],
    descs: &'a mut [Descriptor; BURST],
    /// Buffers filled and stamped in flight (`descs[..stamped]`).
    stamped: usize,
    /// Until the burst is pushed the normal way.
    unwinding: bool,
}

impl Drop for Filling<'_> {
    fn drop(&mut self) {
        if !self.unwinding {
            return;
        }
        // There was room for all of them (seen before allocating).
        let _ = self.chan.tx.push_burst(&self.descs[..self.stamped]);
        Stack::notify(self.seg, self.chan);
        self.pool.free_many(&self.raws[self.stamped..]);
    }
}

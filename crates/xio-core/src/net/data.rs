//! The data path: one attempt of a read, peek, connect or accept, and stream writes.

use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use crate::buf::{Buf, BufMut};
use crate::conn::{ConnError, ConnId};
use crate::layout::kind;
use crate::stack::{Error, PeerId};

use super::batch::HELD_MAX;
use super::core::Core;
use super::waiters::{Key, Waiter};
use super::{stack_err, Net, Try};

/// Most emptied buffers a net keeps for its next writes.
pub(super) const SPARE_MAX: usize = 8;

/// Keeps `b`, a buffer a read has emptied, as a writable spare if it is of
/// the smallest class (`size`) and fewer than `max` are kept; otherwise it
/// returns to the pool. In request-response traffic each
/// request's buffer then carries the response: no trip through the pool's
/// cache (a lock each way) and no pool reference count changes. The spares
/// stay ours in the segment (`ALLOCATED`, owner us), so a crash returns
/// them like any held buffer. `max` is a small share of the class: a
/// reader that never writes keeps its spares for good, and with
/// [`SPARE_MAX`] each in a class of few buffers, its writer waited for a
/// buffer for ever.
fn keep_spare(spare: &mut Vec<BufMut>, size: usize, max: usize, b: Buf) {
    if spare.len() < max && b.capacity() == size {
        spare.push(b.into_mut());
    }
}

impl Core {
    /// One attempt at a read of `c` into `out`, for `block` and `poll_op`.
    pub(super) fn read_step(
        &mut self,
        wake: &mut Vec<Waiter>,
        c: ConnId,
        out: &mut [std::mem::MaybeUninit<u8>],
    ) -> Try<usize> {
        let (spare, size, max) = (&mut self.spare, self.spare_size, self.spare_max);
        let r = self
            .table
            .read_uninit_with(c, out, |b| keep_spare(spare, size, max, b));
        self.settle_read(wake, r)
    }

    /// [`Core::read_step`] into several buffers, in order (`readv`).
    pub(super) fn read_vectored_step(
        &mut self,
        wake: &mut Vec<Waiter>,
        c: ConnId,
        outs: &mut [IoSliceMut<'_>],
    ) -> Try<usize> {
        let (spare, size, max) = (&mut self.spare, self.spare_size, self.spare_max);
        let outs = outs.iter_mut().map(|o| crate::conn::as_uninit(o));
        let r = self
            .table
            .read_vectored_uninit_with(c, outs, |b| keep_spare(spare, size, max, b));
        self.settle_read(wake, r)
    }

    /// A writable buffer of the smallest class from the ones reads
    /// emptied, if there is one and `len` fits it.
    fn take_spare(&mut self, len: usize) -> Option<BufMut> {
        if len > self.spare_size {
            return None;
        }
        self.spare.pop()
    }

    /// One attempt at copying `c`'s received bytes without consuming them.
    /// `report`: a reset seen is reported once, as a read reports it
    /// (`MSG_PEEK`); else it is left for the next read (readiness).
    pub(super) fn peek_step(
        &mut self,
        wake: &mut Vec<Waiter>,
        c: ConnId,
        out: &mut [u8],
        report: bool,
    ) -> Try<usize> {
        let r = if report {
            self.table.peek_reporting(c, out)
        } else {
            self.table.peek(c, out)
        };
        self.settle_read(wake, r)
    }

    /// One attempt at taking `c`'s next received buffer (`None`: end).
    pub(super) fn chunk_step(&mut self, wake: &mut Vec<Waiter>, c: ConnId) -> Try<Option<Buf>> {
        let stack = &self.stack;
        let r = self.table.take_chunk(c).map(|o| {
            o.map(|(mut b, off)| {
                b.advance(off);
                stack.private_copy(b)
            })
        });
        self.settle_read(wake, r)
    }

    /// What a read attempt amounts to: done (sending the credit it freed),
    /// or wait for more.
    fn settle_read<T>(&mut self, wake: &mut Vec<Waiter>, r: Result<T, ConnError>) -> Try<T> {
        match r {
            Ok(v) => {
                self.run_actions(wake);
                Try::Done(Ok(v))
            }
            Err(ConnError::WouldBlock) => Try::Wait,
            Err(e) => Try::Done(Err(e.into())),
        }
    }

    /// Whether `c`'s SYN was answered (or refused).
    pub(super) fn connect_step(&self, c: ConnId) -> Try<()> {
        match self.table.connect_result(c) {
            Err(ConnError::WouldBlock) => Try::Wait,
            // Answered, then reset (one drain may bring both): connected.
            // The reset is for the reads to report, after what arrived
            // before it (a first read failing here lost that, and reported
            // the reset twice).
            Err(ConnError::Reset) => Try::Done(Ok(())),
            r => Try::Done(r.map_err(io::Error::from)),
        }
    }

    /// Takes the next connection waiting on `addr`. The next `poll`
    /// reports it writable, and readable if something arrived on it
    /// before, as epoll reports a socket when it is added (a loop that
    /// waits to be told it may write, to greet, say, is told): a thread
    /// asleep in `poll` is woken, and the doorbell rung for a loop that
    /// sleeps on its fd. With it, the peer's address, from the table
    /// entry: a connection reset while queued (its client died) is still
    /// handed over, as Linux's accept does, and reports the reset to its
    /// first read (`peer_addr` would refuse it, as getpeername does).
    pub(super) fn accept_on(
        &mut self,
        addr: SocketAddr,
        wake: &mut Vec<Waiter>,
    ) -> Result<(ConnId, SocketAddr), ConnError> {
        let c = self.table.accept(addr)?;
        let peer = self.table.addrs(c)?.1;
        if self.track_ready {
            let readable = self.table.is_readable(c);
            self.note_ready(c, readable, true);
            if self.wake_key(Key::Poll, wake) && self.driving {
                self.stack.kick();
            }
            if readable {
                let _ = self.stack.ring_self();
            } else {
                self.ring_reactor();
            }
        }
        Ok((c, peer))
    }
}

impl Net {
    /// A writable pool buffer of `len` bytes, waiting while the pool is
    /// exhausted.
    pub(super) fn alloc_wait(&self, len: usize, deadline: Option<Instant>) -> io::Result<BufMut> {
        let mut backoff = 0u32;
        loop {
            let r = {
                let mut g = self.lock();
                let r = g.stack.try_alloc(len);
                if matches!(r, Err(Error::WouldBlock)) {
                    // About to wait: what a write batch holds must not
                    // wait with us (its buffers may be the ones missing,
                    // back once the reader has them).
                    g.release_held();
                    g.ring_unrung();
                }
                r
            };
            match r {
                Ok(b) => return Ok(b),
                Err(Error::WouldBlock) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                    backoff += 1;
                    if backoff < 64 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(20));
                    }
                }
                Err(e) => return Err(stack_err(e)),
            }
        }
    }

    /// `buf` as a pool buffer this net can send: a private copy (received
    /// in copy-on-receive mode, made writable) is copied into a pool
    /// buffer first, waiting for one until `deadline`, so code that
    /// forwards what it receives runs the same in both modes. Anything
    /// else is returned as it is (the send checks it).
    pub(super) fn sendable(
        &self,
        buf: BufMut,
        deadline: Option<Instant>,
    ) -> Result<BufMut, (io::Error, Option<BufMut>)> {
        if !self.shared.copy_on_receive
            || self.lock().stack.private_pool_id() != Some(buf.pool_id())
        {
            return Ok(buf);
        }
        match self.alloc_wait(buf.len(), deadline) {
            Ok(mut n) => {
                n.set_len(buf.len());
                n.copy_from_slice(&buf);
                Ok(n)
            }
            Err(e) => Err((e, Some(buf))),
        }
    }

    fn class_for(&self, n: usize) -> usize {
        let c = &self.shared.classes;
        c.iter()
            .copied()
            .find(|&s| s >= n)
            .unwrap_or_else(|| *c.last().expect("at least one class"))
    }

    /// Writes from `bufs` (as one byte sequence) on `c`: splits into pool
    /// buffers, packs several slices into one buffer when they fit. Returns
    /// the bytes written; blocking, writes everything unless an error
    /// comes after some bytes were written.
    pub(super) fn write_on(
        &self,
        c: ConnId,
        bufs: &[IoSlice<'_>],
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return self
                .lock()
                .table
                .send_target(c)
                .map(|_| 0)
                .map_err(io::Error::from);
        }
        let max_buf = *self.shared.classes.last().expect("a class");
        let mut cursor = (0usize, 0usize); // (slice, offset)
        let mut written = 0usize;
        let mut peer_used = None;
        let r = self.block(Key::Write(c), nonblocking, deadline, |core, wake| {
            // Not held: what a write batch holds goes first (the pending
            // check below then keeps the order if it had to queue).
            let hold = core.holds_writes();
            if !hold {
                core.release_held();
            }
            while written < total {
                let (peer, to, flag) = match core.table.send_target(c) {
                    Ok(t) => t,
                    Err(e) => return Try::Done(Err(e.into())),
                };
                peer_used = Some(peer);
                if core.pending_for(peer) && !core.flush_pending() && core.pending_for(peer) {
                    return park(core, &mut peer_used, Try::Retry);
                }
                core.stack.prefetch_tx(peer);
                let mut want = (total - written).min(max_buf);
                // One buffer for the whole write when a class holds it
                // without wasting most of it; otherwise fill buffers of the
                // class below (65 KiB goes as 64 KiB + 2 KiB, not in a
                // 1 MiB buffer: the large classes are few, and a buffer's
                // whole capacity counts against the window).
                let fit = self.class_for(want);
                if fit >= 4 * want {
                    if let Some(&below) = self.shared.classes.iter().rev().find(|&&s| s < want) {
                        want = below;
                    }
                }
                let credit = core.table.credit_left(c);
                if credit < self.class_for(want) {
                    // Use what credit there is, in a smaller buffer.
                    match self.shared.classes.iter().rev().find(|&&s| s <= credit) {
                        Some(&s) if s > 0 => want = want.min(s),
                        _ => return park(core, &mut peer_used, Try::Wait),
                    }
                }
                // The best buffer; a smaller one if that class is exhausted.
                let mut len = want;
                let mut buf = None;
                while buf.is_none() {
                    // A spare (emptied by a read, or kept by
                    // `poll_write_ready`) once the classes tried come down
                    // to its size.
                    if let Some(b) = core.take_spare(len) {
                        buf = Some(b);
                        break;
                    }
                    match core.stack.try_alloc(len) {
                        Ok(b) => {
                            buf = Some(b);
                            break;
                        }
                        Err(Error::WouldBlock) => {
                            let cap = self.class_for(len);
                            match self.shared.classes.iter().rev().find(|&&s| s < cap) {
                                Some(&s) => len = s,
                                None => break,
                            }
                        }
                        Err(e) => return Try::Done(Err(stack_err(e))),
                    }
                }
                if buf.is_none() {
                    // Every class from the wanted one down is empty:
                    // readers that do not read may hold them for good. A
                    // larger buffer, as credit allows, rather than a wait
                    // on them (a small class must not be a way for one
                    // stalled service to stop every other's writes).
                    let credit = core.table.credit_left(c);
                    let above = self.class_for(want);
                    for &s in self.shared.classes.iter() {
                        if s <= above || s > credit {
                            continue;
                        }
                        match core.stack.try_alloc(s) {
                            Ok(b) => {
                                // Fill it: one scarce large buffer, not
                                // one per small piece.
                                buf = Some(b);
                                len = (total - written).min(s);
                                break;
                            }
                            Err(Error::WouldBlock) => {}
                            Err(e) => return Try::Done(Err(stack_err(e))),
                        }
                    }
                }
                let Some(mut buf) = buf else {
                    return park(core, &mut peer_used, Try::Retry);
                };
                let cap = buf.capacity();
                if core.table.take_credit(c, cap).is_err() {
                    return park(core, &mut peer_used, Try::Wait);
                }
                // Gather `len` bytes from the slices.
                buf.set_len(len);
                let mut k = 0;
                while k < len {
                    let s = &bufs[cursor.0][cursor.1..];
                    let n = s.len().min(len - k);
                    buf[k..k + n].copy_from_slice(&s[..n]);
                    k += n;
                    cursor.1 += n;
                    if cursor.1 == bufs[cursor.0].len() {
                        cursor = (cursor.0 + 1, 0);
                    }
                }
                let me = core.me();
                if peer == me {
                    core.table.on_data(me, ConnId(to), buf.freeze());
                    written += len;
                    continue;
                }
                if hold {
                    // A write batch: sent when it ends (nothing to ring now).
                    core.held.push((peer, kind::STREAM | flag, to, buf));
                    written += len;
                    peer_used = None;
                    if core.held.len() >= HELD_MAX {
                        core.release_held();
                    }
                    continue;
                }
                match core
                    .stack
                    .push_buf(peer, kind::STREAM | flag, to, buf, false)
                {
                    Ok(None) => written += len,
                    Ok(Some(back)) => {
                        // Ring full: undo, wait for room.
                        drop(back);
                        core.table.return_credit(c, cap);
                        rewind(&mut cursor, bufs, len);
                        core.stack.wake_peer(peer);
                        return if written > 0 && nonblocking {
                            Try::Done(Ok(written))
                        } else {
                            Try::Retry
                        };
                    }
                    Err((e, _)) => {
                        core.refused_peers.push(peer);
                        return Try::Done(Err(stack_err(e)));
                    }
                }
            }
            if let Some(p) = peer_used.take() {
                core.stack.wake_peer(p);
            }
            core.run_actions(wake);
            Try::Done(Ok(written))
        });
        if let Some(p) = peer_used {
            // Ended early (an error, or non-blocking): the peer may sleep.
            self.update(|g| g.stack.wake_peer(p));
        }
        match r {
            Err(e) if written > 0 && e.kind() != io::ErrorKind::WouldBlock => {
                tracing::debug!(error = %e, written, "write ended early");
                // The caller hears of the partial write now and of a reset
                // at its next call (as a socket keeps its pending error).
                self.update(|g| g.table.unreport_reset(c));
                Ok(written)
            }
            Err(e) if written > 0 && e.kind() == io::ErrorKind::WouldBlock => Ok(written),
            r => r,
        }
    }
}

/// Before a write waits (for credit, room or a buffer): rings the peer its
/// buffers went to without a doorbell, or a reader asleep would never take
/// them, and the credit the write waits for would never come.
fn park<R>(core: &mut Core, peer: &mut Option<PeerId>, t: Try<R>) -> Try<R> {
    if let Some(p) = peer.take() {
        core.stack.wake_peer(p);
    }
    t
}

/// Moves a gather cursor back by `n` bytes.
pub(super) fn rewind(cursor: &mut (usize, usize), bufs: &[IoSlice<'_>], mut n: usize) {
    while n > 0 {
        if cursor.1 == 0 {
            cursor.0 -= 1;
            cursor.1 = bufs[cursor.0].len();
        }
        let k = n.min(cursor.1);
        cursor.1 -= k;
        n -= k;
    }
}

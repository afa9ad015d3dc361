//! Write batches ([`Net::batch_writes`]): stream writes held and sent together.

use std::sync::atomic::Ordering as AtomicOrdering;

use super::core::{Core, Pending};
use super::waiters::wake_all;
use super::Net;
#[cfg(doc)]
use crate::stack::Stack;

/// A batch of stream writes (see [`Net::batch_writes`]): what this thread
/// wrote while it lives leaves together when it drops. Bound to the thread
/// that took it.
#[must_use = "writes are held only while the guard lives"]
pub struct WriteBatch<'a> {
    net: &'a Net,
    /// Whether this guard counts in the batch (false when another thread
    /// held one when it was taken).
    owned: bool,
    /// Not `Send`: the batch belongs to the thread that took it.
    _thread: std::marker::PhantomData<*const ()>,
}

impl std::fmt::Debug for WriteBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBatch")
            .field("owned", &self.owned)
            .finish_non_exhaustive()
    }
}

impl Drop for WriteBatch<'_> {
    fn drop(&mut self) {
        if self.owned {
            self.net.end_write_batch();
        }
    }
}

/// Most stream writes a write batch holds before it sends them anyway.
pub(super) const HELD_MAX: usize = 256;

/// This thread, as a number (the address of a thread-local: unique among
/// live threads, and cheap to read on every write).
pub(super) fn thread_key() -> usize {
    thread_local!(static KEY: u8 = const { 0 });
    KEY.with(|k| k as *const u8 as usize)
}

impl Core {
    /// Whether this thread's stream writes are held by a write batch.
    pub(super) fn holds_writes(&self) -> bool {
        let owner = self.batch_owner.load(AtomicOrdering::Relaxed);
        owner != 0 && owner == thread_key()
    }

    /// Sends what a write batch held, in order: each peer's share in one
    /// run of ring stores (see [`Stack::push_bufs`]); what its ring has no
    /// room for waits in `pending`, behind anything already there, as any
    /// send does. A peer whose channel is gone gets nothing (its
    /// connections are reset by the drain, as for a direct write).
    pub(super) fn release_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let mut held = std::mem::take(&mut self.held);
        let mut rest = std::mem::take(&mut self.held_rest);
        let mut run = std::mem::take(&mut self.held_run);
        while !held.is_empty() {
            // The first peer's writes, in order; the others' wait for the
            // next round (between connections of different peers order
            // does not matter; within one it is kept).
            let peer = held[0].0;
            for (p, kind, to, b) in held.drain(..) {
                if p == peer {
                    run.push((kind, to, b));
                } else {
                    rest.push((p, kind, to, b));
                }
            }
            std::mem::swap(&mut held, &mut rest);
            if !self.pending_for(peer) && self.stack.push_bufs(peer, &mut run).is_err() {
                run.clear();
                self.refused_peers.push(peer);
                continue;
            }
            if !run.is_empty() {
                self.pending.entry(peer).or_default().extend(
                    run.drain(..)
                        .map(|(kind, to, buf)| Pending::Buf { kind, to, buf }),
                );
            }
            // Pushed, queued or both: ring it (a reader must drain for a
            // queue's room to come).
            if !self.unrung.contains(&peer) {
                self.unrung.push(peer);
            }
        }
        // Keep the allocations for the next batch (all three are empty).
        self.held = held;
        self.held_rest = rest;
        self.held_run = run;
    }
}

impl Net {
    /// Holds this thread's stream writes on this net's streams until the
    /// returned guard drops, then sends them together: for an event loop,
    /// around its handling of one [`Net::poll`]'s events when there are
    /// several.
    ///
    /// Each write still copies its bytes and counts against the
    /// connection's window at once, and returns as usual; what waits is
    /// the descriptor. Sent together, the descriptors' ring stores overlap
    /// their trips to the reader's core, where one write at a time waits
    /// for each (a locked instruction after a store to a line the reader
    /// holds waits for that line); the gain is the "batched writes" column
    /// of BENCHMARKS.md's stream sockets. With a single event per poll
    /// there is nothing to batch, and the guard only costs its lock.
    ///
    /// ```no_run
    /// # fn main() -> std::io::Result<()> {
    /// # let net = xio_core::net::Net::attach("xio")?;
    /// let mut events = Vec::new();
    /// loop {
    ///     events.clear();
    ///     net.poll(&mut events, None)?;
    ///     let _batch = (events.len() > 1).then(|| net.batch_writes());
    ///     for ev in &events {
    ///         // read requests, write replies: the replies leave together
    ///         // when `_batch` drops, at the end of this pass
    ///     }
    /// }
    /// # }
    /// ```
    ///
    /// Held writes also leave, in order, at the next `poll`, before this
    /// thread waits in any call of this net, before anything else is sent
    /// (a FIN, a reset, a zero-copy `send_buf`, another thread's write:
    /// the bytes of one connection never change order), and when 256 are
    /// held. What the reader's ring has no room for then waits in the
    /// net's queue, as any write's descriptors that find the ring full,
    /// and leaves at the net's next call (a later write on that
    /// connection says `WouldBlock` until it has, as a full socket
    /// buffer would). Do not hold a guard across work that does not come
    /// back to the net soon: the bytes wait for it, as with `TCP_CORK`.
    /// Writes of other threads are not held; a guard taken while another
    /// thread's is alive holds nothing. Guards nest.
    pub fn batch_writes(&self) -> WriteBatch<'_> {
        WriteBatch {
            net: self,
            // An inner guard of the same thread finds its batch begun and
            // leaves the ending to the outer one.
            owned: self.start_batch() == Some(true),
            _thread: std::marker::PhantomData,
        }
    }

    /// [`Net::batch_writes`] without a guard, for callers that cannot keep
    /// one (the C ABI): holds this thread's stream writes until
    /// [`Net::end_write_batch`]. True when they are held (now, or already
    /// by an earlier call); false when another thread's batch is under way
    /// (this thread's writes then go out as usual). Calls do not nest: the
    /// first `end_write_batch` ends the batch.
    pub fn begin_write_batch(&self) -> bool {
        self.start_batch().is_some()
    }

    /// Ends this thread's write batch (see [`Net::begin_write_batch`]):
    /// sends what it holds, together. Nothing happens if this thread has
    /// none.
    pub fn end_write_batch(&self) {
        let mut wake = Vec::new();
        let mut g = self.lock();
        // Under the lock: none of our writes is between its check and its
        // hold (this thread's cannot be, and other threads' do not hold).
        if self
            .shared
            .batch_owner
            .compare_exchange(
                thread_key(),
                0,
                AtomicOrdering::Relaxed,
                AtomicOrdering::Relaxed,
            )
            .is_err()
        {
            return;
        }
        g.release_held();
        // Rings the peers sent to, and settles peers found gone.
        g.run_actions(&mut wake);
        drop(g);
        wake_all(&mut wake);
    }

    /// Starts holding this thread's writes: `Some(true)` if this call
    /// began the batch, `Some(false)` if this thread's was under way,
    /// `None` if another thread's is. Only this thread's writes look for
    /// its key, so no lock is needed.
    fn start_batch(&self) -> Option<bool> {
        let me = thread_key();
        match self.shared.batch_owner.compare_exchange(
            0,
            me,
            AtomicOrdering::Relaxed,
            AtomicOrdering::Relaxed,
        ) {
            Ok(_) => Some(true),
            Err(o) if o == me => Some(false),
            Err(_) => None,
        }
    }
}

//! A stream's read signal: what lets a read that would find nothing return
//! without the net's lock (see [`ReadSignal`]).

use std::task::{RawWakerVTable, Waker};

use crate::sync::{fence, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// Lets a task poll a quiet stream's reads again without the net's lock.
///
/// hyper polls a connection's read three to five times per request, and
/// all but one of those find nothing: each took the net's lock (two atomic
/// read-modify-writes, the costliest part of such a poll), looked the
/// connection up and found its waker already registered. Instead, a poll
/// that registers the task's waker records here which waker it was and the
/// connection's read *epoch*; the net bumps the epoch (under its lock)
/// whenever it wakes the connection's readers, which is when a registered
/// waker leaves the waiter list. A later poll with the same waker and an
/// unchanged epoch knows its waker is still registered, so it returns
/// `Pending` after a few plain loads. Every change that can make a read
/// ready (data, end of stream, a reset, a shutdown) goes through that
/// wake-up, since the registered waker would otherwise never run either.
///
/// An event loop's non-blocking reads use the epoch the same way: a read
/// that left the connection empty records so, and the next one says
/// `WouldBlock` while the epoch stands.
///
/// Every method but the two `still_*` runs under the net's lock (one
/// writer at a time); the `still_*` methods run anywhere. Model-checked
/// with loom (`loom_tests` below).
#[derive(Debug)]
pub(crate) struct ReadSignal {
    /// Bumped whenever the connection's readers are woken.
    epoch: AtomicU32,
    /// Of the last poll that registered a waker and returned `Pending`:
    /// `registration << 32 | epoch`, 0 while being written or when none.
    /// Registrations are numbered from 1, so no two records are equal.
    parked: AtomicU64,
    /// Registrations so far.
    registrations: AtomicU32,
    /// That waker's identity (what `Waker::will_wake` compares).
    data: AtomicPtr<()>,
    vtable: AtomicPtr<RawWakerVTable>,
    /// `1 << 32 | epoch` when a read found the connection empty, 0 when
    /// none did.
    empty_at: AtomicU64,
}

impl Default for ReadSignal {
    fn default() -> Self {
        Self {
            epoch: AtomicU32::new(0),
            parked: AtomicU64::new(0),
            registrations: AtomicU32::new(0),
            data: AtomicPtr::new(std::ptr::null_mut()),
            vtable: AtomicPtr::new(std::ptr::null_mut()),
            empty_at: AtomicU64::new(0),
        }
    }
}

impl ReadSignal {
    /// Under the lock: the connection's readers are being woken.
    pub(crate) fn bump(&self) {
        let e = self.epoch.load(Ordering::Relaxed);
        self.epoch.store(e.wrapping_add(1), Ordering::Release);
    }

    /// Under the lock: forgets the waker record (a poll that took the lock
    /// has seen the connection's real state).
    pub(crate) fn forget(&self) {
        self.parked.store(0, Ordering::Relaxed);
    }

    /// Under the lock, right after `w` was registered for the connection's
    /// reads: records it.
    pub(crate) fn park(&self, w: &Waker) {
        self.park_raw(w.data(), w.vtable());
    }

    /// [`ReadSignal::park`] by the waker's identity. A seqlock write: the
    /// record reads as 0 while the identity changes.
    fn park_raw(&self, data: *const (), vtable: *const RawWakerVTable) {
        let r = self
            .registrations
            .load(Ordering::Relaxed)
            .wrapping_add(1)
            .max(1);
        self.registrations.store(r, Ordering::Relaxed);
        self.parked.store(0, Ordering::Relaxed);
        fence(Ordering::Release);
        self.data.store(data.cast_mut(), Ordering::Relaxed);
        self.vtable.store(vtable.cast_mut(), Ordering::Relaxed);
        let e = self.epoch.load(Ordering::Relaxed);
        self.parked
            .store(u64::from(r) << 32 | u64::from(e), Ordering::Release);
    }

    /// Under the lock, in an event loop (its `Net::poll` drains): the
    /// connection has nothing to read at the current epoch.
    pub(crate) fn note_empty(&self) {
        let e = self.epoch.load(Ordering::Relaxed);
        self.empty_at
            .store(1 << 32 | u64::from(e), Ordering::Release);
    }

    /// Whether the connection was found empty and nothing arrived since,
    /// so a non-blocking read may say `WouldBlock` at once. A stale "yes"
    /// (an arrival's bump not yet visible here) is harmless: the
    /// `Net::poll` that drained the arrival reports it, and that poll's
    /// lock makes the bump visible to the reads that follow.
    pub(crate) fn still_empty(&self) -> bool {
        let r = self.empty_at.load(Ordering::Acquire);
        r != 0 && r as u32 == self.epoch.load(Ordering::Acquire)
    }

    /// Whether `w` is registered for the connection's reads and nothing
    /// woke them since, so a poll may return `Pending` at once. A stale
    /// "no" only costs the locked path. A stale "yes" (a bump not yet
    /// visible here) is harmless: the wake-up that follows the bump polls
    /// the task again.
    pub(crate) fn still_parked(&self, w: &Waker) -> bool {
        self.still_parked_raw(w.data(), w.vtable())
    }

    fn still_parked_raw(&self, data: *const (), vtable: *const RawWakerVTable) -> bool {
        let p = self.parked.load(Ordering::Acquire);
        if p == 0 {
            return false;
        }
        let d = self.data.load(Ordering::Relaxed);
        let v = self.vtable.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        // Unchanged record: `d` and `v` are the identity it describes.
        p == self.parked.load(Ordering::Relaxed)
            && p as u32 == self.epoch.load(Ordering::Acquire)
            && std::ptr::eq(d, data)
            && std::ptr::eq(v, vtable)
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::atomic::AtomicBool;
    use loom::sync::Arc;
    use loom::thread;

    /// A waker identity that is never dereferenced, only compared.
    fn id(n: usize) -> (*const (), *const RawWakerVTable) {
        (
            std::ptr::without_provenance(n),
            std::ptr::without_provenance(n + 100),
        )
    }

    /// Two registrations racing a lock-free check: the check may see
    /// either record whole, never the first one's number with the second
    /// one's identity or an identity made of both.
    #[test]
    fn loom_read_signal_records_are_never_torn() {
        loom::model(|| {
            let s = Arc::new(ReadSignal::default());
            let w = s.clone();
            let t = thread::spawn(move || {
                let (d, v) = id(1);
                w.park_raw(d, v);
                let (d, v) = id(2);
                w.park_raw(d, v);
            });
            let (d1, _) = id(1);
            let (_, v2) = id(2);
            assert!(!s.still_parked_raw(d1, v2), "a torn identity passed");
            t.join().unwrap();
            let (d, v) = id(2);
            assert!(s.still_parked_raw(d, v));
            let (d, v) = id(1);
            assert!(!s.still_parked_raw(d, v));
        });
    }

    /// Once a task has seen the wake-up that followed a bump (the waker's
    /// run publishes it), neither check says "nothing new": no read waits
    /// on a waker that was already taken, or misses what arrived.
    #[test]
    fn loom_read_signal_a_seen_bump_ends_both_records() {
        loom::model(|| {
            let s = Arc::new(ReadSignal::default());
            let (d, v) = id(1);
            s.park_raw(d, v);
            s.note_empty();
            let woke = Arc::new(AtomicBool::new(false));
            let (w, f) = (s.clone(), woke.clone());
            let t = thread::spawn(move || {
                w.bump();
                f.store(true, Ordering::Release);
            });
            if woke.load(Ordering::Acquire) {
                assert!(!s.still_parked_raw(d, v), "parked past a seen wake-up");
                assert!(!s.still_empty(), "empty past a seen wake-up");
            }
            t.join().unwrap();
            assert!(!s.still_parked_raw(d, v));
            assert!(!s.still_empty());
        });
    }
}

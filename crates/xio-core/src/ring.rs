//! Single-producer single-consumer descriptor ring.
//!
//! The classic Lamport ring as refined by FastForward/MCRingBuffer and rtrb:
//! head and tail live on separate 128-byte lines, each side keeps a private
//! copy of its own index and a cached copy of the other's, and touches the
//! other's line only when the cache says the ring is full (producer) or empty
//! (consumer). Indices are free-running `u32`s; `index & mask` is the slot.
//!
//! The other side is another process, so the index we read from it is
//! untrusted: a value that would make more than `capacity` slots readable or
//! writable is reported as [`RingError::Corrupt`] instead of being used.

use std::sync::Arc;

use crate::layout::{Descriptor, RingHeader};
use crate::sync::{Ordering, UnsafeCell};

/// A ring's shared index was impossible: the peer is buggy or hostile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ring corrupt: peer index out of range")]
pub struct RingError;

/// Alias kept for readability at call sites.
pub use RingError as Corrupt;

pub(crate) struct RawRing {
    hdr: *const RingHeader,
    slots: *const UnsafeCell<Descriptor>,
    mask: u32,
    // Keeps the memory the pointers point into alive.
    _keep: Arc<dyn Send + Sync>,
}

impl RawRing {
    /// # Safety
    /// `hdr` must point to a `RingHeader` followed (at `slots`) by `cap`
    /// descriptor slots, all valid for as long as `keep` lives, with at most
    /// one producer and one consumer attached.
    pub(crate) unsafe fn new(
        hdr: *const RingHeader,
        slots: *const u8,
        cap: u32,
        keep: Arc<dyn Send + Sync>,
    ) -> Self {
        debug_assert!(cap.is_power_of_two());
        Self {
            hdr,
            slots: slots.cast(),
            mask: cap - 1,
            _keep: keep,
        }
    }

    #[inline]
    fn hdr(&self) -> &RingHeader {
        // SAFETY: valid for the life of `_keep` (see `new`).
        unsafe { &*self.hdr }
    }

    #[inline]
    fn slot(&self, i: u32) -> &UnsafeCell<Descriptor> {
        // SAFETY: `i & mask < cap`, and the slots are valid (see `new`).
        unsafe { &*self.slots.add((i & self.mask) as usize) }
    }

    fn cap(&self) -> u32 {
        self.mask + 1
    }
}

/// Heap-allocated ring storage, for tests, loom models and in-process use.
pub(crate) struct HeapRing {
    hdr: RingHeader,
    slots: Box<[UnsafeCell<Descriptor>]>,
}

// SAFETY: the slots are only touched under the SPSC protocol below.
unsafe impl Sync for HeapRing {}
// SAFETY: as above.
unsafe impl Send for HeapRing {}

/// Creates a heap ring of `cap` (a power of two) slots.
pub fn heap_ring(cap: u32) -> (Producer, Consumer) {
    assert!(cap.is_power_of_two() && cap >= 2);
    let r = Arc::new(HeapRing {
        hdr: RingHeader::default(),
        slots: (0..cap)
            .map(|_| UnsafeCell::new(Descriptor::default()))
            .collect(),
    });
    let hdr = &r.hdr as *const RingHeader;
    let slots = r.slots.as_ptr().cast::<u8>();
    let keep: Arc<dyn Send + Sync> = r;
    // SAFETY: the Arc keeps header and slots alive; one producer, one consumer.
    let (a, b) = unsafe {
        (
            RawRing::new(hdr, slots, cap, keep.clone()),
            RawRing::new(hdr, slots, cap, keep),
        )
    };
    (Producer::new(a), Consumer::new(b))
}

/// The writing end of a ring. `Send`, not `Clone`, not `Sync`.
pub struct Producer {
    ring: RawRing,
    tail: u32,
    cached_head: u32,
}

/// The reading end of a ring. `Send`, not `Clone`, not `Sync`.
pub struct Consumer {
    ring: RawRing,
    head: u32,
    cached_tail: u32,
}

// SAFETY: a Producer is the only writer of the ring's tail and slots; moving
// it to another thread moves that role with it.
unsafe impl Send for Producer {}
// SAFETY: likewise for the consumer's head.
unsafe impl Send for Consumer {}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("tail", &self.tail)
            .field("cap", &self.ring.cap())
            .finish()
    }
}
impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("head", &self.head)
            .field("cap", &self.ring.cap())
            .finish()
    }
}

impl Producer {
    pub(crate) fn new(ring: RawRing) -> Self {
        // Relaxed: we are the only writer of tail; the consumer's head is
        // re-read with Acquire before any slot is reused.
        let tail = ring.hdr().tail.load(Ordering::Relaxed);
        let cached_head = ring.hdr().head.load(Ordering::Acquire);
        Self {
            ring,
            tail,
            cached_head,
        }
    }

    /// Ring capacity.
    pub fn capacity(&self) -> u32 {
        self.ring.cap()
    }

    /// Slots free for writing (refreshes the cached head).
    pub fn free_slots(&mut self) -> Result<u32, RingError> {
        self.free_for(u32::MAX)
    }

    /// Free slots, reading the consumer's index only when the cached value
    /// shows fewer than `want`.
    #[inline]
    fn free_for(&mut self, want: u32) -> Result<u32, RingError> {
        let cap = self.ring.cap();
        let used = self.tail.wrapping_sub(self.cached_head);
        if cap - used >= want {
            return Ok(cap - used);
        }
        // Acquire: pairs with the consumer's Release store of head in
        // `Consumer::pop_burst`; the slots it has read are ours to overwrite.
        self.cached_head = self.ring.hdr().head.load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(self.cached_head);
        if used > cap {
            return Err(RingError);
        }
        Ok(cap - used)
    }

    /// Pushes one descriptor, or hands it back when the ring is full.
    pub fn push(&mut self, d: Descriptor) -> Result<(), Full> {
        match self.push_burst(core::slice::from_ref(&d)) {
            Ok(1) => Ok(()),
            _ => Err(Full(d)),
        }
    }

    /// Pushes as many of `ds` as fit; returns how many.
    pub fn push_burst(&mut self, ds: &[Descriptor]) -> Result<usize, RingError> {
        let free = self.free_for(ds.len().min(u32::MAX as usize) as u32)? as usize;
        let n = ds.len().min(free);
        for (i, d) in ds[..n].iter().enumerate() {
            // SAFETY: slots between tail and cached_head + cap are not being
            // read by the consumer (it has published head past them).
            unsafe { self.ring.slot(self.tail.wrapping_add(i as u32)).write(*d) };
        }
        if n > 0 {
            self.tail = self.tail.wrapping_add(n as u32);
            // Release: publishes the slot writes above; pairs with the
            // consumer's Acquire load of tail in `Consumer::available`.
            self.ring.hdr().tail.store(self.tail, Ordering::Release);
        }
        Ok(n)
    }
}

/// A push that did not fit; the descriptor is handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full(pub Descriptor);

impl Consumer {
    pub(crate) fn new(ring: RawRing) -> Self {
        // Relaxed: we are the only writer of head.
        let head = ring.hdr().head.load(Ordering::Relaxed);
        Self {
            ring,
            head,
            cached_tail: head,
        }
    }

    /// Descriptors ready to read (refreshes the cached tail when it shows
    /// none).
    #[inline]
    pub fn available(&mut self) -> Result<u32, RingError> {
        self.available_for(1)
    }

    /// Descriptors ready, reading the producer's index only when the cached
    /// value shows fewer than `want`.
    #[inline]
    fn available_for(&mut self, want: u32) -> Result<u32, RingError> {
        let avail = self.cached_tail.wrapping_sub(self.head);
        if avail >= want {
            return Ok(avail);
        }
        // Acquire: pairs with the producer's Release store of tail in
        // `Producer::push_burst`; the slots before it are written.
        self.cached_tail = self.ring.hdr().tail.load(Ordering::Acquire);
        let avail = self.cached_tail.wrapping_sub(self.head);
        if avail > self.ring.cap() {
            // Leave cached_tail where it cannot mislead the next call.
            self.cached_tail = self.head;
            return Err(RingError);
        }
        Ok(avail)
    }

    /// Pops one descriptor.
    pub fn pop(&mut self) -> Result<Option<Descriptor>, RingError> {
        let mut d = [Descriptor::default()];
        Ok((self.pop_burst(&mut d)? == 1).then_some(d[0]))
    }

    /// Pops up to `out.len()` descriptors; returns how many.
    pub fn pop_burst(&mut self, out: &mut [Descriptor]) -> Result<usize, RingError> {
        let want = out.len().min(u32::MAX as usize) as u32;
        let n = (self.available_for(want)? as usize).min(out.len());
        for (i, o) in out[..n].iter_mut().enumerate() {
            // SAFETY: slots from head to cached_tail were published by the
            // producer (Acquire above) and it will not touch them until we
            // move head past them.
            *o = unsafe { self.ring.slot(self.head.wrapping_add(i as u32)).read() };
        }
        if n > 0 {
            self.head = self.head.wrapping_add(n as u32);
            // Release: our reads of the slots happen before the producer may
            // reuse them; pairs with its Acquire load of head in `free_slots`.
            self.ring.hdr().head.store(self.head, Ordering::Release);
        }
        Ok(n)
    }

    /// True when nothing is ready (refreshes the cached tail).
    pub fn is_empty(&mut self) -> bool {
        !matches!(self.available(), Ok(n) if n > 0)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    fn d(i: u32) -> Descriptor {
        Descriptor {
            index: i,
            len: i * 2,
            conn: 7,
            ..Default::default()
        }
    }

    #[test]
    fn fifo_full_empty_wrap() {
        let (mut p, mut c) = heap_ring(4);
        assert_eq!(c.pop().unwrap(), None);
        for round in 0..10u32 {
            for i in 0..4 {
                p.push(d(round * 4 + i)).unwrap();
            }
            assert_eq!(p.push(d(99)), Err(Full(d(99))));
            for i in 0..4 {
                assert_eq!(c.pop().unwrap(), Some(d(round * 4 + i)));
            }
            assert_eq!(c.pop().unwrap(), None);
        }
    }

    #[test]
    fn bursts_partial() {
        let (mut p, mut c) = heap_ring(8);
        let src: Vec<_> = (0..12).map(d).collect();
        assert_eq!(p.push_burst(&src).unwrap(), 8);
        let mut out = [Descriptor::default(); 5];
        assert_eq!(c.pop_burst(&mut out).unwrap(), 5);
        assert_eq!(&out[..], &src[..5]);
        assert_eq!(p.push_burst(&src[8..]).unwrap(), 4);
        let mut rest = [Descriptor::default(); 16];
        assert_eq!(c.pop_burst(&mut rest).unwrap(), 7);
        assert_eq!(&rest[..7], &src[5..12]);
    }

    #[test]
    fn index_wraps_past_u32() {
        let (mut p, mut c) = heap_ring(4);
        // Start both sides just below the u32 wrap.
        p.tail = u32::MAX - 2;
        p.cached_head = u32::MAX - 2;
        c.head = u32::MAX - 2;
        c.cached_tail = u32::MAX - 2;
        p.ring.hdr().tail.store(u32::MAX - 2, Ordering::Relaxed);
        c.ring.hdr().head.store(u32::MAX - 2, Ordering::Relaxed);
        for i in 0..20 {
            p.push(d(i)).unwrap();
            assert_eq!(c.pop().unwrap(), Some(d(i)));
        }
    }

    #[test]
    fn corrupt_tail_is_reported_not_used() {
        let (mut p, mut c) = heap_ring(4);
        p.push(d(1)).unwrap();
        // A hostile producer claims a thousand descriptors are ready.
        p.ring.hdr().tail.store(1000, Ordering::Release);
        assert_eq!(c.pop(), Err(RingError));
        // A hostile consumer moves head beyond tail.
        c.ring.hdr().head.store(500, Ordering::Release);
        p.cached_head = 0;
        p.tail = 4;
        assert_eq!(p.free_slots(), Err(RingError));
    }

    #[test]
    fn cross_thread_stream() {
        let (mut p, mut c) = heap_ring(64);
        const N: u32 = 200_000;
        let t = std::thread::spawn(move || {
            let mut i = 0;
            while i < N {
                if p.push(d(i)).is_ok() {
                    i += 1;
                } else {
                    std::thread::yield_now();
                }
            }
        });
        let mut next = 0;
        let mut buf = [Descriptor::default(); 16];
        while next < N {
            let n = c.pop_burst(&mut buf).unwrap();
            for x in &buf[..n] {
                assert_eq!(*x, d(next));
                next += 1;
            }
            if n == 0 {
                std::thread::yield_now();
            }
        }
        t.join().unwrap();
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use crate::sync::AtomicU32;
    use loom::thread;

    fn d(i: u32) -> Descriptor {
        Descriptor {
            index: i,
            len: i + 1,
            ..Default::default()
        }
    }

    /// Push/pop across threads through a two-slot ring: exercises full,
    /// empty and wrap-around (4 items through 2 slots), and checks FIFO order
    /// and that every slot read sees the write it was published with.
    #[test]
    fn loom_push_pop_full_empty_wrap() {
        loom::model(|| {
            let (mut p, mut c) = heap_ring(2);
            let t = thread::spawn(move || {
                let mut i = 0;
                while i < 4 {
                    match p.push(d(i)) {
                        Ok(()) => i += 1,
                        Err(Full(_)) => thread::yield_now(),
                    }
                }
            });
            let mut next = 0;
            while next < 4 {
                match c.pop().unwrap() {
                    Some(x) => {
                        assert_eq!(x, d(next));
                        next += 1;
                    }
                    None => thread::yield_now(),
                }
            }
            t.join().unwrap();
        });
    }

    /// Bursts: a burst push of 3 into a 4-slot ring against burst pops.
    #[test]
    fn loom_bursts() {
        loom::model(|| {
            let (mut p, mut c) = heap_ring(4);
            let t = thread::spawn(move || {
                let src = [d(0), d(1), d(2), d(3), d(4)];
                let mut sent = 0;
                while sent < src.len() {
                    let n = p.push_burst(&src[sent..(sent + 3).min(src.len())]).unwrap();
                    sent += n;
                    if n == 0 {
                        thread::yield_now();
                    }
                }
            });
            let mut out = [Descriptor::default(); 2];
            let mut next = 0;
            while next < 5 {
                let n = c.pop_burst(&mut out).unwrap();
                for x in &out[..n] {
                    assert_eq!(*x, d(next));
                    next += 1;
                }
                if n == 0 {
                    thread::yield_now();
                }
            }
            t.join().unwrap();
        });
    }

    /// Peer gone: the producer pushes and then marks the channel closed
    /// (as the stack does on close and the manager on a crash). A consumer
    /// that sees "closed" and then drains once more must have every
    /// descriptor pushed before the close.
    #[test]
    fn loom_peer_gone_drains_everything() {
        loom::model(|| {
            let (mut p, mut c) = heap_ring(4);
            let closed = Arc::new(AtomicU32::new(0));
            let closed2 = closed.clone();
            let t = thread::spawn(move || {
                p.push(d(0)).unwrap();
                p.push(d(1)).unwrap();
                // Release: publishes the pushes; pairs with the Acquire below.
                closed2.store(1, Ordering::Release);
            });
            let mut got = Vec::new();
            loop {
                while let Some(x) = c.pop().unwrap() {
                    got.push(x);
                }
                if closed.load(Ordering::Acquire) == 1 {
                    while let Some(x) = c.pop().unwrap() {
                        got.push(x);
                    }
                    break;
                }
                thread::yield_now();
            }
            assert_eq!(got, vec![d(0), d(1)]);
            t.join().unwrap();
        });
    }
}

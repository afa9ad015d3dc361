//! Single-producer single-consumer descriptor ring.
//!
//! Lamport's ring with the refinements of FastForward (Giacomoni et al.,
//! PPoPP'08) and rtrb: there is no shared producer index. Each slot carries
//! a sequence number (`position + 1`) that the producer stores last, with
//! Release, so a consumer polling for the next descriptor reads only that
//! slot's line, the one the producer just wrote: one cache-line transfer per
//! descriptor instead of two (index, then slot). The consumer's index lives
//! on its own 128-byte line and the producer keeps a cached copy, reading
//! the shared one only when the cache says the ring is full. Positions are
//! free-running `u32`s; `position & mask` is the slot.
//!
//! A slot is a cache line and holds up to [`SLOT_DESCS`] descriptors of one
//! push: a burst fills its slots three at a time (a third of the lines to
//! move), a lone push takes one slot. Capacity and free space are counted
//! in slots, so `n` free slots take at least `n` descriptors.
//!
//! The other side is another process, so what we read from it is untrusted:
//! a consumer index that would make more than `capacity` slots writable is
//! [`RingError`], and so is a slot whose descriptor count is out of range;
//! a forged sequence number can only make us read a slot early, and every
//! descriptor is validated before use anyway. A sequence number forged to
//! say "not yet" would make the consumer wait on a slot the producer has
//! published, and the producer then wait on a full ring: a producer that
//! finds its ring full checks that the slot at the head still holds what
//! it published there, and a consumer with nothing to read that the slot
//! holds one of the two values the ends write (see `check_idle`).

use std::sync::Arc;

use crate::backend::traits::{DescConsumer, DescProducer, RingError, RingWatch};
#[cfg(any(test, feature = "test-support"))]
use crate::layout::initial_seq;
use crate::layout::{Descriptor, RingHeader, RingSlot, SLOT_DESCS};
use crate::segment::Segment;
use crate::sync::Ordering;

pub(crate) struct RawRing {
    hdr: *const RingHeader,
    slots: *const RingSlot,
    mask: u32,
    // Keeps the memory the pointers point into alive.
    _keep: Arc<dyn Send + Sync>,
}

impl RawRing {
    /// # Safety
    /// `hdr` must point to a `RingHeader` and `slots` to `cap` `RingSlot`s,
    /// all valid for as long as `keep` lives, with at most one producer and
    /// one consumer attached.
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
    fn slot(&self, i: u32) -> &RingSlot {
        // SAFETY: `i & mask < cap`, and the slots are valid (see `new`).
        unsafe { &*self.slots.add((i & self.mask) as usize) }
    }

    fn cap(&self) -> u32 {
        self.mask + 1
    }
}

impl Clone for RawRing {
    fn clone(&self) -> Self {
        Self {
            hdr: self.hdr,
            slots: self.slots,
            mask: self.mask,
            _keep: self._keep.clone(),
        }
    }
}

/// Looks at a ring from another thread of the consumer's process, without
/// the consumer: "is the next slot published?". What a driver spins on
/// while it does not hold its stack (see `Stack::probe`).
pub struct Watch {
    ring: RawRing,
}

// SAFETY: only atomic loads through pointers into memory `_keep` keeps alive.
unsafe impl Send for Watch {}
// SAFETY: as above; loads only.
unsafe impl Sync for Watch {}

impl Watch {
    /// True when the slot at the consumer's head is published. The head is
    /// read from the ring header, which the consumer stores after every pop
    /// (a forged value can only make this answer wrongly, never fault).
    #[inline]
    pub fn has_data(&self) -> bool {
        let head = self.ring.hdr().head.load(Ordering::Relaxed);
        self.ring.slot(head).seq.load(Ordering::Acquire) == head.wrapping_add(1)
    }
}

/// Heap-allocated ring storage, for tests, loom models and in-process use.
#[cfg(any(test, feature = "test-support"))]
pub(crate) struct HeapRing {
    hdr: RingHeader,
    slots: Box<[RingSlot]>,
}

// SAFETY: the slots are only touched under the SPSC protocol below.
#[cfg(any(test, feature = "test-support"))]
unsafe impl Sync for HeapRing {}
// SAFETY: as above.
#[cfg(any(test, feature = "test-support"))]
unsafe impl Send for HeapRing {}

/// Creates a heap ring of `cap` (a power of two) slots.
#[cfg(any(test, feature = "test-support"))]
pub fn heap_ring(cap: u32) -> (Producer, Consumer) {
    assert!(cap.is_power_of_two() && cap >= 2);
    let r = Arc::new(HeapRing {
        hdr: RingHeader::default(),
        slots: (0..cap).map(|_| RingSlot::default()).collect(),
    });
    for (k, slot) in r.slots.iter().enumerate() {
        slot.seq
            .store(initial_seq(k as u32, cap), Ordering::Relaxed);
    }
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
    /// Descriptors already popped from the slot at `head` (it stays the
    /// head until all of its descriptors are).
    taken: u32,
}

// SAFETY: a Producer is the only writer of the ring's slots; moving it to
// another thread moves that role with it.
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
            .field("taken", &self.taken)
            .field("cap", &self.ring.cap())
            .finish()
    }
}

impl Producer {
    pub(crate) fn new(ring: RawRing) -> Self {
        // A fresh ring (the manager zeroes it): both ends start at 0.
        let head = ring.hdr().head.load(Ordering::Acquire);
        Self {
            ring,
            tail: head,
            cached_head: head,
        }
    }

    /// Ring capacity, in slots.
    #[cfg(any(test, feature = "test-support"))]
    pub fn capacity(&self) -> u32 {
        self.ring.cap()
    }

    /// Slots free for writing (refreshes the cached head).
    #[cfg(any(test, feature = "test-support"))]
    pub fn free_slots(&mut self) -> Result<u32, RingError> {
        self.free_for(u32::MAX)
    }

    /// Starts taking the line of the next slot in exclusive state (a
    /// hint). A push stores into that line, and the wake-up check after
    /// a push fences: with the line already ours the fence need not wait
    /// for it to come over from the consumer's core.
    #[inline]
    pub fn prefetch_next(&self) {
        crate::sync::prefetch_write(self.ring.slot(self.tail));
    }

    /// Free slots, reading the consumer's index only when the cached value
    /// shows fewer than `want`.
    #[inline]
    pub fn free_for(&mut self, want: u32) -> Result<u32, RingError> {
        let cap = self.ring.cap();
        let used = self.tail.wrapping_sub(self.cached_head);
        if cap - used >= want {
            return Ok(cap - used);
        }
        // Acquire: pairs with the consumer's Release store of head in
        // `Consumer::pop_burst`; the slots it has read are ours to overwrite.
        let head = self.ring.hdr().head.load(Ordering::Acquire);
        let used = self.tail.wrapping_sub(head);
        if used > cap {
            return Err(RingError);
        }
        if used == cap && self.ring.slot(head).seq.load(Ordering::Relaxed) != head.wrapping_add(1) {
            // Full, and the slot the consumer waits on does not say what
            // we published there (`head + 1`, kept until we write the
            // slot again, a lap later): another process rewrote it, most
            // likely to its last lap's value, which the consumer takes
            // for "nothing yet" and waits on, while we would wait for it
            // to drain. Only on a full ring: off the send path, and it is
            // when waiting would never end.
            return Err(RingError);
        }
        self.cached_head = head;
        Ok(cap - used)
    }

    /// Descriptors one [`push_burst`](Self::push_burst) can take now:
    /// [`SLOT_DESCS`] a free slot. Reads the consumer's index only when the
    /// cached one shows room for fewer than `want`.
    #[inline]
    pub fn room_for(&mut self, want: u32) -> Result<u32, RingError> {
        let slots = self.free_for(want.div_ceil(SLOT_DESCS as u32))?;
        Ok(slots.saturating_mul(SLOT_DESCS as u32))
    }

    /// Test hook: publishes a slot whose descriptor count is `count`
    /// (zeroed descriptors), as a broken or hostile producer could. False
    /// when the ring is full. Not for applications.
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-support"))]
    pub fn __publish_count(&mut self, count: u32) -> Result<bool, RingError> {
        if self.free_for(1)? == 0 {
            return Ok(false);
        }
        self.publish_slot(&[Descriptor::default(); SLOT_DESCS], count);
        Ok(true)
    }

    /// Writes `descs` and `count` into the slot at the tail and publishes
    /// it (its `seq` stored last). The caller has checked that the slot is
    /// free.
    #[inline]
    fn publish_slot(&mut self, descs: &[Descriptor], count: u32) {
        let slot = self.ring.slot(self.tail);
        for (cell, d) in slot.desc.iter().zip(descs) {
            // SAFETY: the consumer has moved its head past this slot (the
            // caller checked the free space), so it will not read it until
            // the seq store below publishes it.
            unsafe { cell.write(*d) };
        }
        // SAFETY: as above.
        unsafe { slot.count.write(count) };
        self.tail = self.tail.wrapping_add(1);
        // Release: publishes the descriptors and count written above;
        // pairs with the consumer's Acquire load of `seq` in
        // `Consumer::ready`.
        slot.seq.store(self.tail, Ordering::Release);
    }

    /// Pushes one descriptor into a slot of its own: `Ok(false)` when the
    /// ring is full.
    #[inline]
    pub fn push_one(&mut self, d: Descriptor) -> Result<bool, RingError> {
        if self.free_for(1)? == 0 {
            return Ok(false);
        }
        self.publish_slot(core::slice::from_ref(&d), 1);
        Ok(true)
    }

    /// Pushes one descriptor, or hands it back when the ring is full.
    #[cfg(any(test, feature = "test-support"))]
    pub fn push(&mut self, d: Descriptor) -> Result<(), Full> {
        match self.push_one(d) {
            Ok(true) => Ok(()),
            _ => Err(Full(d)),
        }
    }

    /// Pushes as many of `ds` as fit; returns how many. Consecutive
    /// descriptors share a slot, [`SLOT_DESCS`] at a time, so a burst
    /// moves a third of the lines; each slot is published (its `seq`
    /// stored) once all of its descriptors are written.
    pub fn push_burst(&mut self, ds: &[Descriptor]) -> Result<usize, RingError> {
        let want = ds.len().div_ceil(SLOT_DESCS).min(u32::MAX as usize) as u32;
        let free = self.free_for(want)? as usize;
        let n = ds.len().min(free.saturating_mul(SLOT_DESCS));
        for group in ds[..n].chunks(SLOT_DESCS) {
            self.publish_slot(group, group.len() as u32);
        }
        Ok(n)
    }
}

/// A push that did not fit; the descriptor is handed back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg(any(test, feature = "test-support"))]
pub struct Full(pub Descriptor);

impl Consumer {
    pub(crate) fn new(ring: RawRing) -> Self {
        // Relaxed: we are the only writer of head.
        let head = ring.hdr().head.load(Ordering::Relaxed);
        Self {
            ring,
            head,
            taken: 0,
        }
    }

    /// Whether the slot at position `pos` holds the descriptor written there.
    #[inline]
    fn ready(&self, pos: u32) -> bool {
        // Acquire: pairs with the producer's Release store of `seq` in
        // `Producer::push_burst`; the descriptor is written before it.
        self.ring.slot(pos).seq.load(Ordering::Acquire) == pos.wrapping_add(1)
    }

    /// Slots ready to read (at least the count of consecutive published
    /// slots from the head, up to the capacity); each holds one to
    /// [`SLOT_DESCS`] descriptors.
    #[cfg(any(test, feature = "test-support"))]
    pub fn available(&mut self) -> Result<u32, RingError> {
        let mut n = 0;
        while n < self.ring.cap() && self.ready(self.head.wrapping_add(n)) {
            n += 1;
        }
        Ok(n)
    }

    /// Pops one descriptor.
    #[cfg(any(test, feature = "test-support"))]
    pub fn pop(&mut self) -> Result<Option<Descriptor>, RingError> {
        let mut d = [Descriptor::default()];
        Ok((self.pop_burst(&mut d)? == 1).then_some(d[0]))
    }

    /// Pops up to `out.len()` descriptors; returns how many. A slot whose
    /// descriptors do not all fit in `out` is left at the head with the
    /// rest still in it. A slot whose count is impossible (the producer is
    /// broken or hostile) is [`RingError`], once the descriptors before it
    /// have been returned.
    pub fn pop_burst(&mut self, out: &mut [Descriptor]) -> Result<usize, RingError> {
        let start = self.head;
        let mut n = 0;
        while n < out.len() && self.ready(self.head) {
            let slot = self.ring.slot(self.head);
            // SAFETY: the slot is published (Acquire in `ready`) and the
            // producer will not touch it until we move head past it.
            let count = unsafe { slot.count.read() };
            let left = match count.checked_sub(self.taken) {
                Some(l) if l > 0 && count as usize <= SLOT_DESCS => l as usize,
                _ if n > 0 => break,
                _ => return Err(RingError),
            };
            let take = left.min(out.len() - n);
            for k in 0..take {
                // SAFETY: as above; `taken + k < count <= SLOT_DESCS`.
                out[n + k] = unsafe { slot.desc[self.taken as usize + k].read() };
            }
            n += take;
            if take == left {
                self.taken = 0;
                self.head = self.head.wrapping_add(1);
            } else {
                self.taken += take as u32;
            }
        }
        if self.head != start {
            // Release: our reads of the slots happen before the producer may
            // reuse them; pairs with its Acquire load of head in `free_for`.
            self.ring.hdr().head.store(self.head, Ordering::Release);
        } else if n == 0 {
            self.check_idle()?;
        }
        Ok(n)
    }

    /// With nothing to read: checks the words another process may have
    /// forged. The slot at the head holds `head + 1` once published, and
    /// its last lap's `head + 1 - cap` until then; anything else was
    /// written by neither end, and waiting on it would wedge the channel:
    /// [`RingError`]. The shared head, which only this consumer writes,
    /// must equal its own copy: a forged one could show the producer a
    /// full ring that nobody would ever drain, so it is put back.
    #[inline]
    fn check_idle(&self) -> Result<(), RingError> {
        let seq = self.ring.slot(self.head).seq.load(Ordering::Acquire);
        let next = self.head.wrapping_add(1);
        if seq != next && seq != next.wrapping_sub(self.ring.cap()) {
            return Err(RingError);
        }
        let shared = &self.ring.hdr().head;
        if shared.load(Ordering::Relaxed) != self.head {
            shared.store(self.head, Ordering::Release);
        }
        Ok(())
    }

    /// A [`Watch`] on this ring.
    pub fn watch(&self) -> Watch {
        Watch {
            ring: self.ring.clone(),
        }
    }

    /// True when nothing is ready: one load of the next slot's line.
    #[inline]
    pub fn is_empty(&mut self) -> bool {
        !self.ready(self.head)
    }
}

/// The ends of channel `channel`'s rings in `seg` for the stack on side
/// `dir`: it produces into ring `dir` and consumes the other (the manager
/// gives each ring of a channel one producer and one consumer).
pub fn channel_ends(seg: &Segment, channel: u32, dir: usize) -> (Producer, Consumer) {
    let cap = seg.ring_capacity();
    let keep: Arc<dyn Send + Sync> = seg.region().clone();
    let (th, ts) = seg.ring_ptrs(channel, dir);
    let (rh, rs) = seg.ring_ptrs(channel, 1 - dir);
    // SAFETY: the pointers come from the validated segment and stay
    // valid while `keep` (the mapping) lives; the manager gives each
    // ring of a channel exactly one producer and one consumer.
    unsafe {
        (
            Producer::new(RawRing::new(th, ts, cap, keep.clone())),
            Consumer::new(RawRing::new(rh, rs, cap, keep)),
        )
    }
}

impl RingWatch for Watch {
    fn has_data(&self) -> bool {
        Watch::has_data(self)
    }
}

impl DescProducer for Producer {
    fn push_burst(&mut self, ds: &[Descriptor]) -> Result<usize, RingError> {
        Producer::push_burst(self, ds)
    }
    fn push_one(&mut self, words: (u64, u64)) -> Result<bool, RingError> {
        Producer::push_one(self, Descriptor::from_words(words))
    }
    fn room(&mut self, want: u32) -> Result<u32, RingError> {
        Producer::room_for(self, want)
    }
    fn prefetch_next(&self) {
        Producer::prefetch_next(self)
    }
    #[cfg(any(test, feature = "test-support"))]
    fn __publish_count(&mut self, count: u32) -> Result<bool, RingError> {
        Producer::__publish_count(self, count)
    }
}

impl DescConsumer for Consumer {
    fn pop_burst(&mut self, out: &mut [Descriptor]) -> Result<usize, RingError> {
        Consumer::pop_burst(self, out)
    }
    fn has_data(&mut self) -> bool {
        !self.is_empty()
    }
    fn watch(&self) -> Box<dyn RingWatch> {
        Box::new(Consumer::watch(self))
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
    fn bursts_share_slots_and_pop_partially() {
        let (mut p, mut c) = heap_ring(4);
        let src: Vec<_> = (0..14).map(d).collect();
        // Four slots take twelve descriptors of one burst, three a slot.
        assert_eq!(p.room_for(14).unwrap(), 12);
        assert_eq!(p.push_burst(&src).unwrap(), 12);
        assert_eq!(p.free_slots().unwrap(), 0);
        assert_eq!(p.room_for(1).unwrap(), 0);
        assert_eq!(p.push(d(99)), Err(Full(d(99))));
        // Five out: the first slot and two of the second, which stays the
        // head until its third is out too.
        let mut out = [Descriptor::default(); 5];
        assert_eq!(c.pop_burst(&mut out).unwrap(), 5);
        assert_eq!(&out[..], &src[..5]);
        assert_eq!(p.free_slots().unwrap(), 1);
        assert_eq!(p.room_for(2).unwrap(), 3);
        assert_eq!(p.push_burst(&src[12..]).unwrap(), 2);
        assert_eq!(c.pop().unwrap(), Some(src[5]));
        assert_eq!(p.free_slots().unwrap(), 1);
        let mut rest = [Descriptor::default(); 16];
        assert_eq!(c.pop_burst(&mut rest).unwrap(), 8);
        assert_eq!(&rest[..8], &src[6..14]);
        assert_eq!(c.pop().unwrap(), None);
        assert_eq!(p.free_slots().unwrap(), 4);
    }

    #[test]
    fn lone_pushes_take_a_slot_each() {
        let (mut p, mut c) = heap_ring(2);
        p.push(d(0)).unwrap();
        p.push(d(1)).unwrap();
        assert_eq!(p.push(d(2)), Err(Full(d(2))));
        assert_eq!(c.pop().unwrap(), Some(d(0)));
        assert_eq!(p.push_burst(&[d(2), d(3), d(4), d(5)]).unwrap(), 3);
        let mut out = [Descriptor::default(); 8];
        assert_eq!(c.pop_burst(&mut out).unwrap(), 4);
        assert_eq!(&out[..4], &[d(1), d(2), d(3), d(4)]);
    }

    #[test]
    fn a_descriptor_pushed_as_words_arrives_whole() {
        use crate::backend::traits::DescProducer;
        let (mut p, mut c) = heap_ring(2);
        let odd = Descriptor {
            index: u32::MAX,
            len: 0x8000_0001,
            conn: 0xdead_beef,
            class: 0xfe,
            kind: 0x81,
            gen: 0xffff,
        };
        assert_eq!(DescProducer::push_one(&mut p, odd.to_words()), Ok(true));
        assert_eq!(DescProducer::push_one(&mut p, d(7).to_words()), Ok(true));
        // Full: refused, nothing written over the two above.
        assert_eq!(DescProducer::push_one(&mut p, d(8).to_words()), Ok(false));
        assert_eq!(c.pop().unwrap(), Some(odd));
        assert_eq!(c.pop().unwrap(), Some(d(7)));
        assert_eq!(c.pop().unwrap(), None);
    }

    #[test]
    fn impossible_slot_counts_are_errors_after_what_came_before() {
        for bad in [0, SLOT_DESCS as u32 + 1, u32::MAX] {
            let (mut p, mut c) = heap_ring(4);
            p.push_burst(&[d(0), d(1), d(2)]).unwrap();
            p.push_burst(&[d(3), d(4)]).unwrap();
            // SAFETY: test only; the consumer is not reading concurrently.
            unsafe { p.ring.slot(1).count.write(bad) };
            let mut out = [Descriptor::default(); 8];
            assert_eq!(c.pop_burst(&mut out), Ok(3));
            assert_eq!(c.pop_burst(&mut out), Err(RingError));
            assert_eq!(c.pop(), Err(RingError));
        }
        // A count that shrinks under a consumer half way through its slot.
        let (mut p, mut c) = heap_ring(4);
        p.push_burst(&[d(0), d(1), d(2)]).unwrap();
        let mut two = [Descriptor::default(); 2];
        assert_eq!(c.pop_burst(&mut two), Ok(2));
        // SAFETY: as above.
        unsafe { p.ring.slot(0).count.write(2) };
        assert_eq!(c.pop(), Err(RingError));
    }

    #[test]
    fn index_wraps_past_u32() {
        let (mut p, mut c) = heap_ring(4);
        // Start both sides just below the u32 wrap, slots as a fresh ring
        // starting there would have them.
        let start = u32::MAX - 2;
        p.tail = start;
        p.cached_head = start;
        c.head = start;
        c.ring.hdr().head.store(start, Ordering::Relaxed);
        for pos in start..start.wrapping_add(4) {
            p.ring
                .slot(pos)
                .seq
                .store(pos.wrapping_add(1).wrapping_sub(4), Ordering::Relaxed);
        }
        for i in 0..20 {
            p.push(d(i)).unwrap();
            assert_eq!(c.pop().unwrap(), Some(d(i)));
        }
    }

    #[test]
    fn corrupt_indices_are_reported_not_used() {
        let (mut p, mut c) = heap_ring(4);
        p.push(d(1)).unwrap();
        // A hostile producer forges sequence numbers: at most `capacity`
        // slots are ever read, and what they hold is validated (their
        // counts here, their descriptors later).
        for pos in 0..4u32 {
            p.ring.slot(pos).seq.store(pos + 1, Ordering::Release);
        }
        // Slots never written hold no descriptor (count 0): the ring is
        // corrupt once the one real descriptor is out.
        let mut out = [Descriptor::default(); 16];
        assert_eq!(c.pop_burst(&mut out), Ok(1));
        assert_eq!(c.pop_burst(&mut out), Err(RingError));
        // A hostile consumer moves head beyond tail.
        c.ring.hdr().head.store(500, Ordering::Release);
        p.cached_head = 0;
        p.tail = 4;
        assert_eq!(p.free_slots(), Err(RingError));
        let _ = c;
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

    /// Bursts: pushes of up to 4 descriptors (a full slot and one more)
    /// into a 2-slot ring against pops of 2, which take a full slot in two
    /// goes: packing, partial pops, full, empty and wrap-around.
    #[test]
    fn loom_bursts() {
        loom::model(|| {
            let (mut p, mut c) = heap_ring(2);
            let t = thread::spawn(move || {
                let src = [d(0), d(1), d(2), d(3), d(4)];
                let mut sent = 0;
                while sent < src.len() {
                    let n = p.push_burst(&src[sent..(sent + 4).min(src.len())]).unwrap();
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

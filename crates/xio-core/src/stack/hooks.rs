//! Test hooks (`#[doc(hidden)]`, named `__*`): what a broken or hostile
//! stack could do (forged descriptors, slots claiming any count, scribbled
//! ring words, buffers under any kind), so tests can check that receivers
//! refuse it; and views of the segment and of buffers in flight.

use crate::backend::{DescProducer, RingError};
use crate::buf::BufMut;
use crate::layout::Descriptor;
use crate::segment::Segment;
use crate::sync::{AtomicU32, Ordering};

use super::{Error, PeerId, Stack};

impl Stack {
    /// Test hook: pushes a raw descriptor to `peer` as if it were a buffer,
    /// to check that receivers reject forgeries. Not for applications.
    /// Returns whether it fit in the ring.
    #[doc(hidden)]
    pub fn __push_raw(&mut self, peer: PeerId, d: Descriptor) -> Result<bool, Error> {
        self.raw_push(peer, |tx| Ok(tx.push_burst(&[d])? == 1))
    }

    /// Test hook: publishes a ring slot toward `peer` that claims `count`
    /// descriptors, as a broken or hostile stack could. `Ok(false)` when
    /// the ring is full or its slots carry no count (DPDK). Not for
    /// applications.
    #[doc(hidden)]
    pub fn __push_slot_count(&mut self, peer: PeerId, count: u32) -> Result<bool, Error> {
        self.raw_push(peer, |tx| tx.__publish_count(count))
    }

    /// The test hooks' way into the ring toward `peer`: `push`, then the
    /// doorbell.
    fn raw_push(
        &mut self,
        peer: PeerId,
        push: impl FnOnce(&mut dyn DescProducer) -> Result<bool, RingError>,
    ) -> Result<bool, Error> {
        let ci = self.chan_of(peer).ok_or(Error::NotConnected(peer))?;
        let ch = &mut self.channels[ci];
        let ok = push(&mut *ch.tx).map_err(|e| Error::Protocol(e.to_string()))?;
        Self::notify(&self.seg, ch);
        Ok(ok)
    }

    /// Test hook: stores `value` into 32-bit word `word` of the shared
    /// ring memory of the channel to `peer` that this stack's side writes,
    /// as a broken or hostile stack could: a word of the ring it produces
    /// into (taken modulo the ring's size, sixteen words a slot: the
    /// descriptors, then the sequence number at 12 and the count at 13),
    /// or, for `word == u32::MAX`, the index at which it consumes the
    /// peer's ring. `Ok(false)` on DPDK, whose rings are not in the
    /// segment. Not for applications.
    #[doc(hidden)]
    pub fn __scribble_ring(&mut self, peer: PeerId, word: u32, value: u32) -> Result<bool, Error> {
        if !self.pool.rings_in_segment() {
            return Ok(false);
        }
        let ci = self.chan_of(peer).ok_or(Error::NotConnected(peer))?;
        let ch = &self.channels[ci];
        const WORDS: u32 = (core::mem::size_of::<crate::layout::RingSlot>() / 4) as u32;
        let target = if word == u32::MAX {
            let (h, _) = self.seg.ring_ptrs(ch.id, 1 - ch.dir as usize);
            // SAFETY: `ring_ptrs` points into the mapping, which `self.seg`
            // keeps alive; the header is atomics only.
            let hdr: &crate::layout::RingHeader = unsafe { &*h };
            let head: &AtomicU32 = &hdr.head;
            head
        } else {
            let (_, slots) = self.seg.ring_ptrs(ch.id, ch.dir as usize);
            let w = word % (self.seg.ring_capacity() * WORDS);
            // SAFETY: `w` words lie inside the ring's slots (modulo its
            // size), which lie inside the mapping `self.seg` keeps alive;
            // slots are 64-byte aligned, so every word is aligned for an
            // `AtomicU32`, and the other side reads them only as
            // untrusted.
            unsafe { &*slots.add(w as usize * 4).cast::<AtomicU32>() }
        };
        target.store(value, Ordering::Release);
        Ok(true)
    }

    /// Test hook: sends a real buffer under any descriptor kind and
    /// connection id, as a hostile peer could. Hands the buffer back when
    /// the ring is full. Not for applications.
    #[doc(hidden)]
    pub fn __push_buf_raw(
        &mut self,
        peer: PeerId,
        kind: u8,
        conn: u32,
        buf: BufMut,
    ) -> Result<Option<BufMut>, Error> {
        self.push_buf(peer, kind, conn, buf, true)
            .map_err(|(e, _)| e)
    }

    /// Test hook: the segment.
    #[doc(hidden)]
    pub fn __segment(&self) -> &Segment {
        &self.seg
    }

    /// Test hook: buffers of the pool stamped in flight to this stack and
    /// not received yet (in a ring, or stamped and never pushed), on
    /// either backend.
    #[doc(hidden)]
    pub fn __in_flight_to_me(&self) -> usize {
        self.pool.in_flight_to(self.id)
    }
}

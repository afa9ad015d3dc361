//! The DPDK backend's descriptor rings: a single-producer single-consumer
//! `rte_ring` of 16-byte descriptors per channel direction, its size and
//! mask checked once, and the ends that implement the ring traits.

use std::ptr::NonNull;
use std::sync::Arc;

use dpdk_sys as sys;

use super::error::{cname, errno_text, DpdkError};
use super::mempool::SharedMem;
use crate::backend::traits::{DescConsumer, DescProducer, RingError, RingWatch};
use crate::layout::Descriptor;

/// The name of the ring that stack end `dir` of channel `channel`
/// produces into.
pub fn ring_name(channel: u32, dir: usize) -> String {
    format!("xio-r{channel}-{dir}")
}

/// The ring ends of stack end `dir` of `channel`: it produces into ring
/// `dir` and consumes ring `1 - dir`.
pub fn channel_ends(channel: u32, dir: usize) -> Result<(DpdkProducer, DpdkConsumer), DpdkError> {
    Ok((
        DpdkProducer::new(Ring::lookup(&ring_name(channel, dir))?),
        DpdkConsumer::new(Ring::lookup(&ring_name(channel, 1 - dir))?),
    ))
}

/// An `rte_ring` of [`Descriptor`]s (16-byte elements), single producer
/// and single consumer: one direction of a channel.
#[derive(Debug)]
pub struct Ring {
    r: NonNull<sys::rte_ring>,
    /// The slot mask, checked once (see [`Ring::wrap`]) and kept here:
    /// the ring's own size, mask and capacity are shared memory, and
    /// DPDK's burst functions read them on every call (a peer that
    /// overwrote the mask made the other end read and write slots far
    /// outside the ring).
    mask: u32,
}

// SAFETY: an rte_ring is shared memory; SP/SC discipline is kept by giving
// each end to one owner (DpdkProducer / DpdkConsumer are not Clone).
unsafe impl Send for Ring {}
// SAFETY: only `count` is called through a shared reference (a read of
// the ring's indices).
unsafe impl Sync for Ring {}

const DESC: u32 = std::mem::size_of::<Descriptor>() as u32;
// The shim's ring functions move 16-byte elements.
const _: () = assert!(DESC == 16);

impl Ring {
    /// Creates a ring of `count` descriptors (a power of two; primary).
    pub fn create(name: &str, count: u32) -> Result<Ring, DpdkError> {
        let c = cname(name, sys::xio_shim_limits::XIO_SHIM_RING_NAMESIZE as usize)?;
        // SAFETY: valid name; flags select SP/SC.
        let r = unsafe {
            sys::rte_ring_create_elem(
                c.as_ptr(),
                DESC,
                count,
                sys::SOCKET_ID_ANY,
                sys::RING_F_SP_ENQ | sys::RING_F_SC_DEQ,
            )
        };
        let r = NonNull::new(r).ok_or_else(|| DpdkError::Create {
            what: "ring",
            name: name.into(),
            reason: errno_text(),
        })?;
        Ring::wrap(r, name)
    }

    /// The ring at `r`, its size, mask and capacity checked once, its
    /// header and slots in the prefix's shared memory.
    fn wrap(r: NonNull<sys::rte_ring>, name: &str) -> Result<Ring, DpdkError> {
        let corrupt = || DpdkError::CorruptRing(name.into());
        let head = std::mem::size_of::<sys::rte_ring>();
        if !SharedMem::holds_now(r.as_ptr() as usize, head)? {
            return Err(corrupt());
        }
        let mut mask = 0;
        // SAFETY: a ring header in shared memory (checked above); the
        // shim reads each field once.
        if unsafe { sys::xio_shim_ring_check(r.as_ptr(), &mut mask) } != 0 {
            return Err(corrupt());
        }
        let slots = (mask as usize + 1) * DESC as usize;
        if !SharedMem::holds_now(r.as_ptr() as usize, head + slots)? {
            return Err(corrupt());
        }
        Ok(Ring { r, mask })
    }

    /// Looks up a ring made by the primary.
    pub fn lookup(name: &str) -> Result<Ring, DpdkError> {
        let c = cname(name, sys::xio_shim_limits::XIO_SHIM_RING_NAMESIZE as usize)?;
        // SAFETY: valid name.
        let r = unsafe { sys::rte_ring_lookup(c.as_ptr()) };
        let r = NonNull::new(r).ok_or_else(|| DpdkError::NotFound {
            what: "ring",
            name: name.into(),
        })?;
        Ring::wrap(r, name)
    }

    /// Test hook: overwrites the ring's mask and size and moves its heads
    /// and tails to `at`, one descriptor waiting, as a broken or hostile
    /// process of the prefix can. Not for applications.
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-support"))]
    pub fn __scribble(&self, mask: u32, size: u32, at: u32) {
        // SAFETY: a live ring; writes fields of shared memory, as any
        // process of the prefix can.
        unsafe { sys::xio_shim_ring_scribble(self.r.as_ptr(), mask, size, at) }
    }

    /// Descriptors waiting.
    pub fn count(&self) -> u32 {
        // SAFETY: a live ring; reads its indices.
        unsafe { sys::xio_shim_spsc_count(self.r.as_ptr(), self.mask) }
    }

    fn push(&mut self, ds: &[Descriptor]) -> usize {
        // SAFETY: `ds` holds ds.len() elements of DESC (16) bytes; we
        // are the ring's only producer; slots are reached through the
        // mask checked in `wrap` only.
        unsafe {
            sys::xio_shim_spsc_enqueue(
                self.r.as_ptr(),
                self.mask,
                ds.as_ptr().cast(),
                ds.len() as u32,
            ) as usize
        }
    }

    /// Takes up to `out.len()` descriptors. Only the ring's one consumer
    /// may call it (`DpdkConsumer`, which is not `Clone` and pops through
    /// `&mut self`): the ring is single-consumer. A shared reference is
    /// enough otherwise, since the ring is DPDK's memory, not ours, and
    /// the consumer's watches share the `Ring` (the `&mut` this took was
    /// made from an `Arc` they also hold: aliasing undefined behaviour).
    fn pop(&self, out: &mut [Descriptor]) -> usize {
        // SAFETY: `out` has room for out.len() elements; the caller is the
        // only consumer (above). Descriptor is plain data, any bytes are a
        // value.
        // Slots are reached through the mask checked in `wrap` only.
        unsafe {
            sys::xio_shim_spsc_dequeue(
                self.r.as_ptr(),
                self.mask,
                out.as_mut_ptr().cast(),
                out.len() as u32,
            ) as usize
        }
    }

    /// Empties the ring (a channel slot being reused).
    ///
    /// # Safety
    ///
    /// No process may use the ring meanwhile: `rte_ring_reset` rewrites
    /// its indices without synchronisation.
    pub unsafe fn reset(&self) {
        // SAFETY: a live ring no process uses (the caller's contract).
        unsafe { sys::rte_ring_reset(self.r.as_ptr()) }
    }

    fn free_count(&self) -> u32 {
        // SAFETY: a live ring.
        unsafe { self.mask - sys::xio_shim_spsc_count(self.r.as_ptr(), self.mask) }
    }
}

/// The sending end of a channel direction.
#[derive(Debug)]
pub struct DpdkProducer(Ring);

/// The receiving end of a channel direction.
#[derive(Debug)]
pub struct DpdkConsumer(Arc<Ring>);

impl DpdkProducer {
    /// The producer end of `ring` (give each ring one producer).
    pub fn new(ring: Ring) -> Self {
        DpdkProducer(ring)
    }
}

impl DpdkConsumer {
    /// The consumer end of `ring` (give each ring one consumer).
    pub fn new(ring: Ring) -> Self {
        DpdkConsumer(Arc::new(ring))
    }
}

impl DescProducer for DpdkProducer {
    fn push_burst(&mut self, ds: &[Descriptor]) -> Result<usize, RingError> {
        Ok(self.0.push(ds))
    }
    fn room(&mut self, _want: u32) -> Result<u32, RingError> {
        Ok(self.0.free_count())
    }
}

impl DescConsumer for DpdkConsumer {
    fn pop_burst(&mut self, out: &mut [Descriptor]) -> Result<usize, RingError> {
        // This consumer is the ring's only one (`&mut self`, not Clone);
        // the watches only read counts.
        Ok(self.0.pop(out))
    }
    fn has_data(&mut self) -> bool {
        self.0.count() > 0
    }
    fn watch(&self) -> Box<dyn RingWatch> {
        Box::new(DpdkWatch(self.0.clone()))
    }
}

struct DpdkWatch(Arc<Ring>);

impl RingWatch for DpdkWatch {
    fn has_data(&self) -> bool {
        self.0.count() > 0
    }
}

//! What every backend implements, and the values that cross the seam:
//! the pool ([`BufferPool`]) and the two ends of a descriptor ring
//! ([`DescProducer`], [`DescConsumer`], [`RingWatch`]), with the buffer
//! references, refusals and counts they hand back. Nothing here knows an
//! implementation: the shm backend ([`crate::backend::shm`]) and DPDK's
//! implement these.

use crate::layout::Descriptor;

/// A buffer reference: class and index. Not a pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawBuf {
    /// Size class.
    pub class: u8,
    /// Index within the class.
    pub index: u32,
}

/// Why a received descriptor was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// Class out of range.
    #[error("descriptor names size class {0}, which does not exist")]
    Class(u8),
    /// Index out of range.
    #[error("descriptor names buffer {0}, beyond its class")]
    Index(u32),
    /// Length larger than the buffer.
    #[error("descriptor length {0} exceeds its buffer")]
    Length(u32),
    /// Not a data descriptor.
    #[error("descriptor kind {0} is not data")]
    Kind(u8),
    /// Header says the buffer is not in flight to us (wrong owner, state or
    /// generation): a forged, replayed or stale descriptor.
    #[error("buffer is not in flight to this stack (header {0:#x})")]
    Ownership(u64),
}

/// The pool has no free buffer of a suitable class right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// Larger than the largest class.
    #[error("{0} bytes is more than the largest buffer class")]
    TooLarge(usize),
    /// Every buffer of the class is in use (retry, or wait).
    #[error("pool exhausted")]
    Exhausted,
    /// This process was forked from the one that attached the pool
    /// handle (see [`crate::fork`]).
    #[error("the pool handle was inherited across fork(); attach a new stack")]
    Forked,
    /// The private cache is empty and the manager died while it held the
    /// shared list closed (killed in the middle of a reclamation sweep):
    /// nothing will open it again. Also for an allocation that does not
    /// wait.
    #[error("the manager died while it held the free list closed")]
    ManagerGone,
}

/// Buffers in use, per class: free on the shared list, and per owner.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassUsage {
    /// Buffer size.
    pub buf_size: u32,
    /// Buffers in the class.
    pub total: u32,
    /// Buffers in state `FREE`.
    pub free: u32,
    /// `(owner stack id, buffers)` for every owner with at least one,
    /// counting private caches.
    pub by_owner: Vec<(u16, u32)>,
    /// The most buffers one stack may have charged to it (its quota; the
    /// class's count where the backend has no quotas).
    pub quota: u32,
    /// `(stack id, buffers)` charged to each stack with at least one
    /// (see `bufword::charged_to`); empty where the backend has no quotas.
    pub by_charge: Vec<(u16, u32)>,
}

/// A reclamation gave up: stack `.0`, alive as far as the manager knows,
/// stayed inside a free-list operation for all the patience it was given.
/// Nothing changed; the lists are open again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stack {0} stayed inside a free-list operation; reclamation deferred")]
pub struct Busy(pub u16);

/// What a reclamation returned to the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Buffers that the dead stacks owned (cached, allocated, held, or in
    /// flight to them), and buffers one stamped in flight to a stack that
    /// can no longer receive them.
    pub owned: u32,
    /// Buffers found free but missing from the list (lost mid-operation).
    pub lost: u32,
}

/// A ring's shared index was impossible: the peer is buggy or hostile.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("ring corrupt: peer index out of range")]
pub struct RingError;

/// A pool of fixed-size buffers shared between stacks.
pub trait BufferPool: Send + Sync + std::fmt::Debug + 'static {
    /// This stack's id in the pool.
    #[cfg(any(test, feature = "test-support"))]
    fn stack_id(&self) -> u16;
    /// Takes a buffer of at least `len` bytes.
    fn alloc(&self, len: usize, wait: bool) -> Result<RawBuf, AllocError>;
    /// Returns a buffer this stack owns.
    fn free(&self, b: RawBuf);
    /// Data pointer and capacity.
    fn data(&self, b: RawBuf) -> (*mut u8, usize);
    /// Hands ownership to stack `to` and builds the descriptor.
    fn prepare_send(&self, b: RawBuf, len: u32, to: u16, conn: u32, kind: u8) -> Descriptor;
    /// Validates a descriptor received from stack `from` and takes the
    /// buffer.
    fn accept(&self, from: u16, d: &Descriptor) -> Result<RawBuf, Reject>;
    /// Makes a received buffer writable again.
    fn reuse(&self, b: RawBuf);
    /// The pool's identity (its segment's, [`Region::ident`]): equal for
    /// every stack of one pool, so a stack can tell its pool's buffers
    /// from another pool's.
    ///
    /// [`Region::ident`]: crate::segment::Region::ident
    fn pool_id(&self) -> u64;
}

/// The sending end of a descriptor ring.
pub trait DescProducer: Send + std::fmt::Debug {
    /// Pushes as many as fit.
    fn push_burst(&mut self, ds: &[Descriptor]) -> Result<usize, RingError>;
    /// Pushes one descriptor given as its words
    /// ([`Descriptor::to_words`], so it travels in registers): `Ok(false)`
    /// when the ring is full.
    fn push_one(&mut self, words: (u64, u64)) -> Result<bool, RingError> {
        Ok(self.push_burst(&[Descriptor::from_words(words)])? == 1)
    }
    /// Descriptors one [`push_burst`](Self::push_burst) can take now (at
    /// least one when any slot is free), from the cached consumer index
    /// when it shows room for at least `want` (no cross-core read), else
    /// freshly read. Rings with a descriptor a slot answer their free
    /// slots.
    fn room(&mut self, want: u32) -> Result<u32, RingError>;
    /// Starts taking the line of the next slot in exclusive state, ahead
    /// of a push (a hint; nothing by default).
    fn prefetch_next(&self) {}
    /// Test hook: publishes a slot claiming `count` descriptors (see
    /// [`Producer::__publish_count`]); `Ok(false)` where slots carry no
    /// count. Not for applications.
    ///
    /// [`Producer::__publish_count`]: crate::backend::shm::ring::Producer::__publish_count
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-support"))]
    fn __publish_count(&mut self, _count: u32) -> Result<bool, RingError> {
        Ok(false)
    }
}

/// The receiving end of a descriptor ring.
pub trait DescConsumer: Send + std::fmt::Debug {
    /// Pops up to `out.len()`.
    fn pop_burst(&mut self, out: &mut [Descriptor]) -> Result<usize, RingError>;
    /// Whether anything is ready.
    fn has_data(&mut self) -> bool;
    /// A handle that answers [`RingWatch::has_data`] from another thread
    /// while this consumer is not being used.
    fn watch(&self) -> Box<dyn RingWatch>;
}

/// Readiness of a ring, checked without its consumer.
pub trait RingWatch: Send + Sync {
    /// Whether the consumer would find a descriptor.
    fn has_data(&self) -> bool;
}

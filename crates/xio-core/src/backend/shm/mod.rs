//! The shm backend: buffers in the segment's size classes, with their
//! free lists and ownership headers ([`pool`]), and descriptor rings in
//! the segment's channel slots ([`ring`]). The same types over a heap
//! [`Region`](crate::segment::Region) make the in-process backend the
//! fast unit tests use.

mod manager_pool;
pub mod pool;
pub mod ring;
#[cfg(all(test, not(loom)))]
mod tests;

pub use manager_pool::ManagerPool;
pub use pool::{PoolView, StackPool};
#[cfg(any(test, feature = "test-support"))]
pub use pool::PREFETCH_PAYLOAD;
#[cfg(any(test, feature = "test-support"))]
pub use ring::{heap_ring, Consumer, Full, Producer, Watch};

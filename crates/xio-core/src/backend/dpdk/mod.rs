//! The DPDK backend's building blocks: the EAL (a manager is the primary
//! process of its prefix, stacks are secondaries), one `rte_mempool` per
//! size class holding the buffers, and single-producer single-consumer
//! `rte_ring`s of 16-byte descriptors, all in hugepage memory and found by
//! name. [`DpdkPool`] implements [`BufferPool`] and [`DpdkProducer`] /
//! [`DpdkConsumer`] implement the ring traits, so the layers above are the
//! same as with the shm backend.
//!
//! Every mempool object starts with a 64-byte [`ObjHeader`] recording its
//! owner, state and generation, as the shm pool's buffer headers do: a
//! descriptor from a peer is checked against it (untrusted input), and the
//! buffers of a process that died are found by walking the objects.
//!
//! Mempools use DPDK's default multi-producer multi-consumer ring ops with
//! no per-lcore cache (a cache of a killed process would be lost).
//!
//! The pieces: the EAL and the hugepage checks (`eal`), a class's
//! mempool and its object headers (`mempool`), the pool over them
//! (`pool`), the descriptor rings (`ring`), and the manager's bring-up
//! as the primary (`primary`).
//!
//! [`BufferPool`]: crate::backend::BufferPool

mod eal;
mod error;
mod mempool;
mod pool;
mod primary;
mod ring;

pub(crate) use pool::attach_pool;
#[cfg(not(feature = "test-support"))]
pub(crate) use pool::DpdkPool;
pub(crate) use primary::Primary;
pub(crate) use ring::channel_ends;

// What the tests reach: the pieces, to build pools and rings by hand and
// to forge their shared state.
#[cfg(feature = "test-support")]
pub use eal::{check_hugepages, preflight, Eal, HugePages, Role};
#[cfg(feature = "test-support")]
pub use error::DpdkError;
#[cfg(feature = "test-support")]
pub use mempool::{mempool_name, obj_state, Mempool, ObjHeader, HEADER};
#[cfg(feature = "test-support")]
pub use pool::{DpdkPool, InsideOp};
#[cfg(feature = "test-support")]
pub use ring::{ring_name, DpdkConsumer, DpdkProducer, Ring};

//! The backend seam: pool, ring and doorbell as traits, so a backend other
//! than shared memory (DPDK's rte_mempool and rte_ring) plugs in under the
//! stack without the layers above changing.
//!
//! The traits and the values that cross them are in `traits` (re-exported
//! here), the doorbell in `doorbell`, the layer's errors in [`Error`]. The
//! shm backend ([`shm`]) implements them with [`shm::StackPool`],
//! [`shm::Producer`]/[`shm::Consumer`] and [`EventFdDoorbell`]; the same
//! types over a heap [`crate::segment::Region`] make the in-process backend
//! used by the fast unit tests. The DPDK backend is `dpdk` (with the
//! `dpdk` feature). Which backend a pool uses is [`Backend`]; the stack and
//! the manager reach the one their pool has through `any`, the only code
//! that knows which backends this build has.

mod any;
#[cfg(any(test, feature = "test-support"))]
#[doc(hidden)]
pub mod conformance;
mod doorbell;
mod error;
pub(crate) mod gate;
mod traits;

pub mod shm;

#[cfg(feature = "dpdk")]
pub mod dpdk;

pub use any::Backend;
pub(crate) use any::{AnyManagerPool, AnyPool, ManagerBackend};
pub use doorbell::{Doorbell, EventFdDoorbell};
pub use error::Error;
#[cfg(any(test, feature = "test-support"))]
pub use error::BoxError;
#[cfg(any(test, feature = "test-support"))]
pub use traits::Reclaimed;
#[cfg(any(test, feature = "test-support"))]
pub use traits::RingError;
pub use traits::{
    AllocError, BufferPool, Busy, ClassUsage, DescConsumer, DescProducer, RawBuf, Reject,
    RingWatch,
};

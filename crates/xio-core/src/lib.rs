//! X-IO core: lock-free shared-memory communication between processes on
//! one machine.
//!
//! A per-node **manager** ([`manager`]) owns a sealed memfd segment holding a
//! buffer pool and single-producer single-consumer descriptor rings, or, with
//! the DPDK backend, DPDK's mempools and rings. Every service links a
//! **stack** ([`stack::Stack`]) that registers with the manager over a Unix
//! socket, maps the segment, and exchanges 16-byte descriptors with its peers
//! while payloads stay where they were written: zero-copy. The socket
//! interface ([`net`]) runs streams over the same stack.
//!
//! The API is the public modules and the names re-exported here. The
//! machinery under it is the crate's own, one module per concern:
//! `backend` (the pool, ring and doorbell traits; `backend/shm` and
//! `backend/dpdk` implement them), `layout` and `segment` (the shared
//! memory's layout and its checked mapping), `conn` (the connection state
//! machine, no I/O), `proto` and `ctrl` (the control protocol and its
//! socket), and `manager`'s and `stack`'s own folders.
//!
//! ```
//! use xio_core::prelude::*;
//!
//! # let dir = std::env::temp_dir().join(format!("xio-doc-{}", std::process::id()));
//! # std::fs::create_dir_all(&dir).unwrap();
//! # std::env::set_var("XIO_RUN_DIR", &dir);
//! // An embedded manager (tests, examples, single-binary use); production
//! // runs the `xio-manager` binary instead.
//! let manager = Manager::builder("doc-example").spawn()?;
//!
//! let mut server = Stack::attach("doc-example")?;
//! server.bind("10.0.0.1:7".parse()?)?;
//! let mut client = Stack::attach("doc-example")?;
//! let peer = client.connect("10.0.0.1:7".parse()?)?;
//!
//! let mut buf = client.alloc(5)?;
//! buf.copy_from(b"hello");
//! client.send(peer, buf)?;                 // the buffer moves, bytes stay put
//!
//! let msg = server.recv()?;
//! assert_eq!(&msg.buf[..], b"hello");
//! let reply = msg.buf.into_mut();          // forward in place, no new buffer
//! server.send(msg.from, reply)?;
//! assert_eq!(&client.recv()?.buf[..], b"hello");
//! # drop((server, client));
//! # manager.stop();
//! # let _ = std::fs::remove_dir_all(&dir);
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_op_in_unsafe_fn)]

/// Declares modules that are the crate's own: `pub(crate)`, and public
/// (hidden from the docs) only with the `test-support` feature, which this
/// workspace's tests and benchmarks turn on to forge and inspect shared
/// state. The API is the public modules and the re-exports below.
macro_rules! internal {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "test-support")]
        #[doc(hidden)]
        pub mod $name;
        #[cfg(not(feature = "test-support"))]
        pub(crate) mod $name;
    )*};
}

// The API: the zero-copy stack, sockets, the manager, and what they hand out.
pub mod buf;
pub mod fork;
pub mod manager;
pub mod net;
pub mod paths;
pub mod stack;
pub mod wait;

// The machinery under it.
internal!(addr, backend, conn, ctrl, layout, proto, segment);
pub(crate) mod liveness;
pub(crate) mod signal;
pub(crate) mod status;
pub(crate) mod sync;

/// The shm backend's pool and the pool seam's values (tests and
/// benchmarks).
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub mod pool {
    pub use crate::backend::shm::pool::{PoolView, StackPool, PREFETCH_PAYLOAD};
    pub use crate::backend::shm::ManagerPool;
    pub use crate::backend::{AllocError, Busy, ClassUsage, RawBuf, Reclaimed, Reject};
}

/// The shm backend's descriptor ring (tests and benchmarks).
#[cfg(feature = "test-support")]
#[doc(hidden)]
pub mod ring {
    pub use crate::backend::shm::ring::{channel_ends, heap_ring, Consumer, Full, Producer, Watch};
    pub use crate::backend::RingError;
    pub use crate::layout::initial_seq;
}

/// The DPDK backend (tests).
#[cfg(all(feature = "dpdk", feature = "test-support"))]
#[doc(hidden)]
pub use backend::dpdk;

pub use backend::{Backend, ClassUsage, Error as BackendError};
pub use buf::{Buf, BufMut};
pub use conn::ConnError;
pub use layout::{ClassInfo, ConfigError, Geometry, PoolConfig};
pub use manager::{Manager, ManagerBuilder, ManagerError, ManagerHandle};
pub use net::{Net, NetBuilder, XioListener, XioStream};
pub use proto::ErrorCode;
pub use segment::SegmentError;
pub use stack::{Error, Message, PeerId, Stack};
pub use wait::WaitMode;

/// The common names.
pub mod prelude {
    pub use crate::buf::{Buf, BufMut};
    pub use crate::layout::PoolConfig;
    pub use crate::manager::{Manager, ManagerHandle};
    pub use crate::stack::{Error, Message, PeerId, Stack};
    pub use crate::wait::WaitMode;
}

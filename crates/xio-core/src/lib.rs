//! X-IO core: lock-free shared-memory communication between processes on
//! one machine.
//!
//! A per-node **manager** ([`manager`]) owns a sealed memfd segment holding a
//! buffer pool ([`pool`]) and single-producer single-consumer descriptor
//! rings ([`ring`]). Every service links a **stack** ([`stack::Stack`]) that
//! registers with the manager over a Unix socket ([`proto`], [`ctrl`]),
//! maps the segment, and exchanges 16-byte descriptors with its peers while
//! payloads stay where they were written: zero-copy.
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

pub mod addr;
pub mod backend;
pub mod buf;
pub mod conn;
pub mod ctrl;
#[cfg(feature = "dpdk")]
pub mod dpdk;
pub mod fork;
pub mod layout;
pub(crate) mod liveness;
pub mod manager;
pub mod net;
pub mod paths;
pub mod pool;
pub mod proto;
pub mod ring;
pub mod segment;
pub(crate) mod signal;
pub mod stack;
pub(crate) mod sync;
pub mod wait;

pub use manager::{Manager, ManagerHandle};
pub use stack::{Error, Stack};
pub use sync::CachePadded;
pub use wait::WaitMode;

/// The common names.
pub mod prelude {
    pub use crate::buf::{Buf, BufMut};
    pub use crate::layout::PoolConfig;
    pub use crate::manager::{Manager, ManagerHandle};
    pub use crate::stack::{Error, Message, PeerId, Stack};
    pub use crate::wait::WaitMode;
}

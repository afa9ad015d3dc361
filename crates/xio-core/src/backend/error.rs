//! What the backend layer raises: making or mapping the segment, a pool of
//! a backend this build lacks, and DPDK's failures to attach, to find a
//! channel's rings or to start. The stack and the manager turn these into
//! their own errors (`From` impls there), so callers see what they saw
//! before the seam.

use crate::segment::SegmentError;

/// An error of a backend's own source (a DPDK error, say), kept whole.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors of the backend layer.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Creating, mapping or initialising the segment failed.
    #[error(transparent)]
    Segment(#[from] SegmentError),
    /// The pool `prefix` uses the DPDK backend, and this build has none
    /// (a stack attaching).
    #[error("pool {prefix:?} uses the DPDK backend: build X-IO with the `dpdk` feature")]
    Unsupported {
        /// The pool's prefix.
        prefix: String,
    },
    /// A manager was asked for the DPDK backend, and this build has none.
    #[error(
        "this build has no DPDK support: build with the `dpdk` feature \
         (cargo build --features dpdk)"
    )]
    NotBuilt,
    /// A stack could not join the pool's backend (DPDK: the EAL as a
    /// secondary, or the class mempools).
    #[error("{0}")]
    Attach(BoxError),
    /// A channel's rings could not be found or checked.
    #[error("{0}")]
    Channel(BoxError),
    /// The manager could not start the backend (DPDK: the EAL as the
    /// primary, the mempools or the rings).
    #[error("{0}")]
    Start(BoxError),
}

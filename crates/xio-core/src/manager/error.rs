//! The manager's errors: [`ManagerError`], and how it maps to `io::Error`
//! (and from the backend's errors).

use std::io;

use crate::paths;
use crate::segment::SegmentError;

/// Errors starting or running a manager.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// Another manager holds this prefix.
    #[error("another xio-manager is already running for pool {prefix:?}{} (lock {lock})", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    AlreadyRunning {
        /// The prefix.
        prefix: String,
        /// Its pid, if the lock file says.
        pid: Option<u32>,
        /// The lock file.
        lock: String,
    },
    /// Invalid prefix.
    #[error(transparent)]
    BadPrefix(#[from] paths::BadPrefix),
    /// Could not create the segment.
    #[error(transparent)]
    Segment(#[from] SegmentError),
    /// The DPDK backend could not start (no hugepages, no DPDK support in
    /// this build, another primary on the prefix...).
    #[error("dpdk backend: {0}")]
    Dpdk(String),
    /// A system call failed.
    #[error("{what}: {err}")]
    Io {
        /// What we were doing.
        what: String,
        /// The error.
        err: io::Error,
    },
}

/// So `Manager::builder(..).spawn()?` works in a function returning
/// `io::Result` (a `main`, say): the kind says what went wrong, the
/// manager's error is the source.
///
/// ```no_run
/// fn main() -> std::io::Result<()> {
///     let _manager = xio_core::Manager::builder("xio").spawn()?;
///     Ok(())
/// }
/// ```
impl From<ManagerError> for io::Error {
    fn from(e: ManagerError) -> io::Error {
        let kind = match &e {
            ManagerError::AlreadyRunning { .. } => io::ErrorKind::AddrInUse,
            ManagerError::BadPrefix(_) => io::ErrorKind::InvalidInput,
            ManagerError::Io { err, .. } => err.kind(),
            ManagerError::Segment(_) | ManagerError::Dpdk(_) => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

/// The backend layer's errors as a manager reports them (as it did before
/// the backend seam): the segment's are [`ManagerError::Segment`], the
/// rest (DPDK's, or no DPDK in this build) [`ManagerError::Dpdk`].
impl From<crate::backend::Error> for ManagerError {
    fn from(e: crate::backend::Error) -> ManagerError {
        match e {
            crate::backend::Error::Segment(e) => ManagerError::Segment(e),
            e => ManagerError::Dpdk(e.to_string()),
        }
    }
}

pub(super) fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ManagerError {
    let what = what.into();
    move |err| ManagerError::Io { what, err }
}

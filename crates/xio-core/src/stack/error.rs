//! The stack's errors: [`Error`], what each means and what to do about
//! it, and how it maps to `io::Error` (and from the backend's errors).

use std::io;
use std::time::Duration;

use crate::backend::Backend;
use crate::ctrl::RecvError;
use crate::paths;
use crate::proto::ErrorCode;

use super::PeerId;
#[cfg(doc)]
use super::{Stack, StackBuilder};

/// Errors of the stack. `Debug` prints the message, as `Display` does:
/// `main() -> Result<(), Box<dyn Error>>` shows errors with `Debug`, and
/// the message says what to do (start a manager, say).
#[derive(thiserror::Error)]
pub enum Error {
    /// No manager listens on this prefix.
    #[error("no X-IO manager for pool {prefix:?} at {path} ({err}): start one with `xio-manager --prefix {prefix}`, or use the pool a running manager serves ($XIO_PREFIX names the process-wide one, default \"xio\")")]
    NoManager {
        /// The prefix.
        prefix: String,
        /// Socket path tried.
        path: String,
        /// The connect error.
        err: io::Error,
    },
    /// The prefix is not a valid name.
    #[error(transparent)]
    BadPrefix(#[from] paths::BadPrefix),
    /// The manager refused a request.
    #[error("manager refused: {message}")]
    Refused {
        /// Why.
        code: ErrorCode,
        /// Details.
        message: String,
    },
    /// The process listening on the pool's control socket runs as a user
    /// this stack does not trust with its traffic (see
    /// [`StackBuilder::attach`] for the rule).
    #[error("refusing the X-IO manager at {path}: it runs as uid {uid}, not as this user (uid {me}) or root, and $XIO_RUN_DIR does not name a directory of that user's that only it can write (set it to join another user's security domain)")]
    UntrustedManager {
        /// The socket's path.
        path: String,
        /// The listener's uid.
        uid: u32,
        /// This process's effective uid.
        me: u32,
    },
    /// The peer died or left; its channel is closed.
    #[error("connection reset: peer {0} is gone")]
    Reset(PeerId),
    /// Not connected to that peer.
    #[error("not connected to peer {0}")]
    NotConnected(PeerId),
    /// The operation would wait, in non-blocking mode.
    #[error("operation would block")]
    WouldBlock,
    /// The wait timed out.
    #[error("timed out")]
    TimedOut,
    /// Larger than the largest buffer class.
    #[error("{0} bytes is more than the largest buffer class")]
    TooLarge(usize),
    /// The manager went away.
    #[error("the X-IO manager went away")]
    ManagerGone,
    /// The manager broke the protocol, or the segment is invalid.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The pool's backend is not the one [`StackBuilder::require_backend`]
    /// asked for.
    #[error(
        "pool {prefix:?} uses the {has:?} backend, not {wanted:?} (see xio-manager --backend)"
    )]
    WrongBackend {
        /// The prefix.
        prefix: String,
        /// Its backend.
        has: Backend,
        /// The one asked for.
        wanted: Backend,
    },
    /// [`Stack::alloc_burst`] asked for more buffers of a size than the
    /// pool holds, or than this stack's quota of them: no wait could ever
    /// give them.
    #[error("a burst of {n} buffers of {len} bytes: a stack may hold only {count} of that size (the class's size or this stack's quota of it; see xio-manager --quota)")]
    BurstTooLarge {
        /// Buffers asked for.
        n: usize,
        /// Their size.
        len: usize,
        /// How many of the size's class a stack may hold (its quota, at
        /// most the class's count).
        count: usize,
    },
    /// The buffer belongs to another pool (allocated or received by a
    /// stack of another prefix): a stack sends only its own pool's
    /// buffers. Copy the bytes into a buffer of this pool instead.
    #[error("the buffer belongs to another pool; copy it into one of this stack's")]
    ForeignBuffer,
    /// This process was forked from the one that attached the stack: the
    /// stack, its connections and its buffers stay the parent's. Attach a
    /// new stack in the child (see [`crate::fork`]).
    #[error("the X-IO stack was inherited across fork(); attach a new one in this process")]
    Forked,
    /// The manager did not answer a request in time: it is stopped
    /// (SIGSTOP, a debugger) or stuck, not dead (a dead one is
    /// [`Error::ManagerGone`]). Its reply, if it comes later, is handled
    /// then (a late channel is set up, a late bind given back).
    #[error("the X-IO manager did not answer within {0:?}: is it stopped (SIGSTOP, a debugger) or stuck? See StackBuilder::control_timeout / $XIO_CONTROL_TIMEOUT_MS")]
    ManagerUnresponsive(Duration),
    /// An environment variable X-IO reads has a value it cannot use.
    #[error("${var}={value:?} is not valid: expected {expected}")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let k = match &e {
            Error::NoManager { .. } => io::ErrorKind::NotFound,
            Error::BadPrefix(_) | Error::BadEnv { .. } => io::ErrorKind::InvalidInput,
            Error::Refused {
                code: ErrorCode::AddrInUse,
                ..
            } => io::ErrorKind::AddrInUse,
            Error::Refused {
                code: ErrorCode::ConnectionRefused | ErrorCode::Busy,
                ..
            } => io::ErrorKind::ConnectionRefused,
            Error::Refused {
                code: ErrorCode::PermissionDenied,
                ..
            }
            | Error::UntrustedManager { .. } => io::ErrorKind::PermissionDenied,
            Error::Refused { .. } => io::ErrorKind::Other,
            Error::Reset(_) => io::ErrorKind::ConnectionReset,
            Error::NotConnected(_) => io::ErrorKind::NotConnected,
            Error::WouldBlock => io::ErrorKind::WouldBlock,
            Error::TimedOut => io::ErrorKind::TimedOut,
            Error::ManagerUnresponsive(_) => io::ErrorKind::TimedOut,
            Error::TooLarge(_) => io::ErrorKind::InvalidInput,
            Error::BurstTooLarge { .. } => io::ErrorKind::InvalidInput,
            Error::ManagerGone => io::ErrorKind::BrokenPipe,
            Error::Protocol(_) => io::ErrorKind::InvalidData,
            Error::WrongBackend { .. } => io::ErrorKind::Unsupported,
            Error::ForeignBuffer => io::ErrorKind::InvalidInput,
            Error::Forked => io::ErrorKind::Unsupported,
            Error::Io(e) => return io::Error::new(e.kind(), e.to_string()),
        };
        io::Error::new(k, e)
    }
}

/// The backend layer's errors as a stack reports them (as it did before
/// the backend seam): a stack that cannot join the pool's DPDK process
/// group is [`Error::Io`], everything else [`Error::Protocol`] (a pool of
/// a backend this build lacks, a channel whose rings are missing, a
/// segment that does not map).
impl From<crate::backend::Error> for Error {
    fn from(e: crate::backend::Error) -> Error {
        use crate::backend::Error as B;
        match e {
            B::Attach(e) | B::Start(e) => Error::Io(io::Error::other(e.to_string())),
            B::Segment(_) | B::Unsupported { .. } | B::NotBuilt | B::Channel(_) => {
                Error::Protocol(e.to_string())
            }
        }
    }
}

pub(super) fn recv_err(e: RecvError) -> Error {
    match e {
        RecvError::Closed => Error::ManagerGone,
        RecvError::Io(e) => Error::Io(e),
        RecvError::Proto(p) => Error::Protocol(p.to_string()),
    }
}

//! Result codes, the thread's last error message, and the panic guard.

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::io;
use std::panic::{catch_unwind, AssertUnwindSafe};

use xio_core::stack::Error as StackError;

/// What every `xio_` function returns: `XIO_OK` (0) or an error code.
/// The values are stable across versions.
pub type XioResult = i32;

/// Success.
pub const XIO_OK: XioResult = 0;
/// A required pointer was NULL, a string was not valid UTF-8 or not an
/// address, or a value was out of range.
pub const XIO_ERR_INVALID_ARGUMENT: XioResult = 1;
/// The handle is not a live handle of the expected type.
pub const XIO_ERR_INVALID_HANDLE: XioResult = 2;
/// The operation would wait (non-blocking mode, or a timeout of 0).
pub const XIO_ERR_WOULD_BLOCK: XioResult = 3;
/// The timeout passed.
pub const XIO_ERR_TIMED_OUT: XioResult = 4;
/// No manager runs for this pool prefix (start `xio-manager --prefix P`).
pub const XIO_ERR_NO_MANAGER: XioResult = 5;
/// Nobody listens on that address (no X-IO service binds it on this
/// node), or its listener's backlog is full. Not a process that binds it
/// but does not read its control socket: that is `XIO_ERR_PEER_BUSY`.
pub const XIO_ERR_CONNECTION_REFUSED: XioResult = 6;
/// The peer reset the connection, crashed or left. On a stream it is
/// reported once, as TCP's `ECONNRESET`: later reads return 0 (end of
/// stream) and writes `XIO_ERR_BROKEN_PIPE`.
pub const XIO_ERR_CONNECTION_RESET: XioResult = 7;
/// Not connected (to that peer, or the stream was shut down).
pub const XIO_ERR_NOT_CONNECTED: XioResult = 8;
/// Another service is bound to that address.
pub const XIO_ERR_ADDR_IN_USE: XioResult = 9;
/// Larger than the pool's largest buffer class.
pub const XIO_ERR_TOO_LARGE: XioResult = 10;
/// The manager went away. On a stack it is a one-time notice, from
/// whichever call learns it first (often `xio_recv`): channels already
/// made keep carrying buffers, and only what needs the manager fails from
/// then on (`xio_stack_bind` and `xio_stack_connect` to a new peer return
/// this code again). A net's connections likewise keep working; its
/// `xio_listen`, and its `xio_dial` to a listener of another process,
/// fail with it (one of the same net still answers). To reach a
/// restarted manager, attach again (`xio_stack_attach`, `xio_net_attach`:
/// a handle attached before, NULL prefix included, stays with the old
/// pool) and bind or listen again. With no manager left to announce a
/// peer's death, an event loop that keeps the old net should call
/// `xio_net_poll` at least once a second (a timeout on its own
/// `epoll_wait`): each call looks at the peers' processes, and a dead
/// one's streams become readable with `XIO_ERR_CONNECTION_RESET`.
pub const XIO_ERR_MANAGER_GONE: XioResult = 11;
/// A peer or the manager broke the protocol.
pub const XIO_ERR_PROTOCOL: XioResult = 12;
/// A system call failed (see `xio_last_error`).
pub const XIO_ERR_IO: XioResult = 13;
/// Another thread owns this stack (a stack is used by one thread at a
/// time: see `xio_stack_attach` and `xio_stack_release`), or has a write
/// batch under way on this net (see `xio_net_batch_begin`).
pub const XIO_ERR_BUSY: XioResult = 14;
/// Writing after this side shut down writes, to a peer that closed and
/// answered with a reset, or after a reset was reported.
pub const XIO_ERR_BROKEN_PIPE: XioResult = 15;
/// The buffer is read-only (received): `xio_buf_make_writable` first.
pub const XIO_ERR_READ_ONLY: XioResult = 16;
/// A bug inside the library (a caught panic); see `xio_last_error`.
pub const XIO_ERR_INTERNAL: XioResult = 17;
/// The handle was inherited across `fork()`: its stack belongs to the
/// parent (so does an inherited buffer, which the child can neither send
/// nor write). Attach a new stack (or net) in the child.
pub const XIO_ERR_FORKED: XioResult = 18;
/// No room for it: every stack slot (attach) or channel slot (connect,
/// dial) of the pool is taken, or the net's connection table is full
/// (dial, accept: about a million connections open at once). It passes
/// once others leave (see the pool's `max_stacks` and `max_channels`).
pub const XIO_ERR_NO_SPACE: XioResult = 19;
/// A process on this node binds that address, but does not read its
/// control socket (it is stopped, stuck or overloaded), so the manager
/// makes no new connection to it until it does. The service is there: do
/// not take this for `XIO_ERR_CONNECTION_REFUSED` (and do not fall back to
/// TCP); trying again later may succeed.
pub const XIO_ERR_PEER_BUSY: XioResult = 20;
/// Another manager already runs for that pool prefix
/// (`xio_manager_spawn`).
pub const XIO_ERR_MANAGER_RUNNING: XioResult = 21;
/// Not allowed: the pool's manager does not admit this process's user or
/// groups (`xio-manager --allow-uid` / `--allow-gid` admit more), or the
/// process listening on the pool's socket runs as a user this one does
/// not trust (see `XIO_RUN_DIR` in docs/operations.md). `xio_last_error`
/// names the rule.
pub const XIO_ERR_PERMISSION_DENIED: XioResult = 22;

/// An error on its way to C: a code and the message for `xio_last_error`.
#[derive(Debug)]
pub(crate) struct Fail {
    code: XioResult,
    msg: std::borrow::Cow<'static, str>,
}

pub(crate) type Res<T> = Result<T, Fail>;

impl Fail {
    pub(crate) fn new(code: XioResult, msg: impl Into<std::borrow::Cow<'static, str>>) -> Fail {
        Fail {
            code,
            msg: msg.into(),
        }
    }

    pub(crate) fn null(what: &str) -> Fail {
        Fail::new(XIO_ERR_INVALID_ARGUMENT, format!("{what} is NULL"))
    }
}

impl From<io::Error> for Fail {
    fn from(e: io::Error) -> Fail {
        // The common answer of a non-blocking call: no message to build
        // (an event loop meets it at every read that drains a stream). A
        // timeout is `WouldBlock` too, with its reason inside (below).
        if e.kind() == io::ErrorKind::WouldBlock
            && !e
                .get_ref()
                .is_some_and(|s| s.is::<xio_core::net::TimeoutElapsed>())
        {
            return Fail::new(XIO_ERR_WOULD_BLOCK, "operation would block");
        }
        // An io::Error made from a stack error keeps it as its source.
        if let Some(se) = e.get_ref().and_then(|s| s.downcast_ref::<StackError>()) {
            return Fail::new(stack_code(se), e.to_string());
        }
        // A stream's timeout is WouldBlock in Rust (as std's TcpStream);
        // C keeps its own code for it.
        if e.get_ref()
            .is_some_and(|s| s.is::<xio_core::net::TimeoutElapsed>())
        {
            return Fail::new(XIO_ERR_TIMED_OUT, e.to_string());
        }
        let code = match e.kind() {
            io::ErrorKind::InvalidInput => XIO_ERR_INVALID_ARGUMENT,
            io::ErrorKind::WouldBlock => XIO_ERR_WOULD_BLOCK,
            io::ErrorKind::TimedOut => XIO_ERR_TIMED_OUT,
            io::ErrorKind::NotFound => XIO_ERR_NO_MANAGER,
            io::ErrorKind::ConnectionRefused => XIO_ERR_CONNECTION_REFUSED,
            io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => {
                XIO_ERR_CONNECTION_RESET
            }
            io::ErrorKind::NotConnected => XIO_ERR_NOT_CONNECTED,
            io::ErrorKind::AddrInUse => XIO_ERR_ADDR_IN_USE,
            io::ErrorKind::BrokenPipe => XIO_ERR_BROKEN_PIPE,
            io::ErrorKind::InvalidData => XIO_ERR_PROTOCOL,
            // The net's connection table is full (`ConnError::TooMany`).
            io::ErrorKind::OutOfMemory => XIO_ERR_NO_SPACE,
            io::ErrorKind::PermissionDenied => XIO_ERR_PERMISSION_DENIED,
            _ => XIO_ERR_IO,
        };
        Fail::new(code, e.to_string())
    }
}

fn stack_code(e: &StackError) -> XioResult {
    use xio_core::ErrorCode;
    match e {
        StackError::NoManager { .. } => XIO_ERR_NO_MANAGER,
        StackError::BadPrefix(_) | StackError::BadEnv { .. } => XIO_ERR_INVALID_ARGUMENT,
        StackError::Refused {
            code: ErrorCode::AddrInUse,
            ..
        } => XIO_ERR_ADDR_IN_USE,
        StackError::Refused {
            code: ErrorCode::ConnectionRefused,
            ..
        } => XIO_ERR_CONNECTION_REFUSED,
        // Rust sees `ConnectionRefused` as its kind, with this code inside
        // (xio-hyper looks there); C gets a code of its own.
        StackError::Refused {
            code: ErrorCode::Busy,
            ..
        } => XIO_ERR_PEER_BUSY,
        StackError::Refused {
            code: ErrorCode::NoSpace,
            ..
        } => XIO_ERR_NO_SPACE,
        StackError::Refused {
            code: ErrorCode::PermissionDenied,
            ..
        }
        | StackError::UntrustedManager { .. } => XIO_ERR_PERMISSION_DENIED,
        StackError::Refused { .. } => XIO_ERR_PROTOCOL,
        StackError::Reset(_) => XIO_ERR_CONNECTION_RESET,
        StackError::NotConnected(_) => XIO_ERR_NOT_CONNECTED,
        StackError::WouldBlock => XIO_ERR_WOULD_BLOCK,
        StackError::TimedOut => XIO_ERR_TIMED_OUT,
        StackError::ManagerUnresponsive(_) => XIO_ERR_TIMED_OUT,
        StackError::TooLarge(_) => XIO_ERR_TOO_LARGE,
        StackError::ManagerGone => XIO_ERR_MANAGER_GONE,
        StackError::Protocol(_) => XIO_ERR_PROTOCOL,
        StackError::WrongBackend { .. } => XIO_ERR_INVALID_ARGUMENT,
        StackError::ForeignBuffer => XIO_ERR_INVALID_ARGUMENT,
        StackError::BurstTooLarge { .. } => XIO_ERR_INVALID_ARGUMENT,
        StackError::Forked => XIO_ERR_FORKED,
        StackError::Io(_) => XIO_ERR_IO,
    }
}

impl From<xio_core::manager::ManagerError> for Fail {
    fn from(e: xio_core::manager::ManagerError) -> Fail {
        use xio_core::manager::ManagerError;
        let code = match &e {
            ManagerError::AlreadyRunning { .. } => XIO_ERR_MANAGER_RUNNING,
            ManagerError::BadPrefix(_) => XIO_ERR_INVALID_ARGUMENT,
            _ => XIO_ERR_IO,
        };
        Fail::new(code, e.to_string())
    }
}

impl From<StackError> for Fail {
    fn from(e: StackError) -> Fail {
        Fail::new(stack_code(&e), e.to_string())
    }
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `msg` as this thread's last error. Runs outside the panic
/// guard, so it must not panic: while the thread exits (a C program's
/// `pthread_key_create` destructor calling us after Rust's thread-locals
/// were destroyed) the message is dropped instead.
fn set_last(msg: &str) {
    let _ = LAST.try_with(|l| {
        let mut l = l.borrow_mut();
        // The same message again (a loop meeting `WouldBlock` over and
        // over): nothing to copy.
        if l.as_bytes() == msg.as_bytes() {
            return;
        }
        *l = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    });
}

/// Runs the body of an exported function: maps its error to a code (and
/// this thread's last-error message) and stops any panic at the boundary.
pub(crate) fn guard(f: impl FnOnce() -> Res<()>) -> XioResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => XIO_OK,
        Ok(Err(fail)) => {
            set_last(&fail.msg);
            fail.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last(&format!("internal error (a bug in libxio): {what}"));
            XIO_ERR_INTERNAL
        }
    }
}

/// A static description of `code` (never NULL; unknown codes get
/// "unknown error").
///
/// Thread-safe.
#[no_mangle]
pub extern "C" fn xio_strerror(code: XioResult) -> *const c_char {
    let s: &'static CStr = match code {
        XIO_OK => c"success",
        XIO_ERR_INVALID_ARGUMENT => c"invalid argument",
        XIO_ERR_INVALID_HANDLE => c"invalid handle",
        XIO_ERR_WOULD_BLOCK => c"operation would block",
        XIO_ERR_TIMED_OUT => c"timed out",
        XIO_ERR_NO_MANAGER => c"no X-IO manager for this pool prefix",
        XIO_ERR_CONNECTION_REFUSED => c"connection refused",
        XIO_ERR_CONNECTION_RESET => c"connection reset by peer",
        XIO_ERR_NOT_CONNECTED => c"not connected",
        XIO_ERR_ADDR_IN_USE => c"address in use",
        XIO_ERR_TOO_LARGE => c"larger than the largest buffer class",
        XIO_ERR_MANAGER_GONE => c"the X-IO manager went away",
        XIO_ERR_PROTOCOL => c"protocol error",
        XIO_ERR_IO => c"system call failed",
        XIO_ERR_BUSY => c"in use by another thread",
        XIO_ERR_BROKEN_PIPE => c"broken pipe",
        XIO_ERR_READ_ONLY => c"buffer is read-only",
        XIO_ERR_INTERNAL => c"internal error",
        XIO_ERR_FORKED => c"handle inherited across fork(); attach a new stack",
        XIO_ERR_NO_SPACE => c"no free stack, channel or connection slot",
        XIO_ERR_PEER_BUSY => c"the process bound to the address is not reading its control socket",
        XIO_ERR_MANAGER_RUNNING => c"another X-IO manager runs for this pool prefix",
        XIO_ERR_PERMISSION_DENIED => c"permission denied: not in the pool's security domain",
        _ => c"unknown error",
    };
    s.as_ptr()
}

/// The message of the last failed `xio_` call on this thread (more detail
/// than `xio_strerror`: addresses, prefixes, system errors). Empty before
/// any failure. Valid until the next failing `xio_` call on this thread.
/// While the thread exits (from a thread-specific data destructor, after
/// libxio's per-thread storage is gone) messages are not kept: this then
/// returns a fixed text saying so.
///
/// Thread-safe (the message is per thread).
#[no_mangle]
pub extern "C" fn xio_last_error() -> *const c_char {
    LAST.try_with(|l| l.borrow().as_ptr())
        .unwrap_or(c"(no message: the thread is exiting)".as_ptr())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A full connection table is a lack of room, as a full pool is, not
    /// an unexplained I/O error.
    #[test]
    fn a_full_connection_table_is_no_space() {
        let e = io::Error::from(xio_core::conn::ConnError::TooMany);
        assert_eq!(Fail::from(e).code, XIO_ERR_NO_SPACE);
    }
}

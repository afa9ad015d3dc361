//! The client side of `xio-manager status`: asking a manager for its
//! report over the control socket, as any process may (no stack needed).
//! Re-exported by [`crate::manager`], where these were first.

use std::io;
use std::os::fd::{AsFd, OwnedFd};

use crate::ctrl::{self, RecvError};
use crate::paths;
use crate::proto::Msg;
use crate::stack::{default_control_timeout, Error};

/// Asks the manager of `prefix` for its status report (what
/// `xio-manager status` prints), waiting at most the control timeout
/// (`$XIO_CONTROL_TIMEOUT_MS`, else 5 s; see [`query_status_within`]).
pub fn query_status(prefix: &str) -> Result<String, Error> {
    query_status_within(prefix, default_control_timeout()?)
}

/// [`query_status`], waiting at most `timeout` for the manager to take the
/// connection and to answer: a manager that is stopped (SIGSTOP, a
/// debugger) or stuck gives [`Error::ManagerUnresponsive`] (`TimedOut`).
pub fn query_status_within(prefix: &str, timeout: std::time::Duration) -> Result<String, Error> {
    let deadline = std::time::Instant::now().checked_add(timeout);
    paths::check_prefix(prefix)?;
    let path = paths::socket_path(prefix);
    let sock = ctrl::connect_within(&path, timeout).map_err(|err| match err.kind() {
        io::ErrorKind::TimedOut => Error::ManagerUnresponsive(timeout),
        _ => Error::NoManager {
            prefix: prefix.to_owned(),
            path: path.display().to_string(),
            err,
        },
    })?;
    // A new socket's buffer is empty: this does not wait.
    ctrl::send_nowait(sock.as_fd(), &Msg::Status, &[])?;
    match ctrl::recv_until(sock.as_fd(), deadline) {
        Ok((msg, fds)) => status_from_reply(msg, fds),
        Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::TimedOut => {
            Err(Error::ManagerUnresponsive(timeout))
        }
        Err(RecvError::Closed) => Err(Error::ManagerGone),
        Err(RecvError::Io(e)) => Err(e.into()),
        Err(RecvError::Proto(p)) => Err(Error::Protocol(p.to_string())),
    }
}

/// The report in the manager's answer to [`Msg::Status`]: inline, or read
/// from the memfd that came with it. For clients of the raw control
/// protocol ([`crate::ctrl`]); [`query_status`] does it all.
pub fn status_from_reply(msg: Msg, fds: Vec<OwnedFd>) -> Result<String, Error> {
    match msg {
        Msg::StatusReply { text } => Ok(text),
        Msg::StatusReplyFd { len } => {
            let [fd] = <[OwnedFd; 1]>::try_from(fds)
                .map_err(|f| Error::Protocol(format!("a status report with {} fds", f.len())))?;
            let bytes = ctrl::read_sealed_memfd(fd.as_fd(), len as usize)
                .map_err(|e| Error::Protocol(format!("status report: {e}")))?;
            String::from_utf8(bytes).map_err(|_| Error::Protocol("status report not UTF-8".into()))
        }
        Msg::Error { code, message } => Err(Error::Refused { code, message }),
        other => Err(Error::Protocol(format!("unexpected {other:?}"))),
    }
}

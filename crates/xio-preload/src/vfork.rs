//! A forked child's way to the streams its parent kept on X-IO, and
//! `vfork`.
//!
//! `fork` hands to the kernel path, before libc's fork, only the moved
//! streams a program `exec`ed by the child would inherit (not
//! close-on-exec); the others, the usual kind (Python's and redis's
//! sockets are close-on-exec), stay on X-IO in the parent. In the child
//! their fds are placeholders (the X-IO side is the parent's). So the
//! child asks: at its first call on such an fd (any hook's lookup), or
//! before it copies it (`dup2` onto a program's stdin) or makes it
//! inheritable (`F_SETFD`, `FIONCLEX`), or before it forks again, it
//! sends the stream's number in the list made at the fork over a socket
//! pair made with it; the parent hands that stream to the kernel path
//! behind a relay (`fork::hand_over`) and sends the new socket's fd back
//! (`SCM_RIGHTS`), which the child puts in the placeholder's place. After
//! a `fork` a thread of the parent answers; after a `vfork` the parent
//! itself, which waits in `vfork` until the child `exec`s or exits (as a
//! vfork parent is suspended). The stream is named by its number in the
//! list, not by an fd of the parent's, which the parent may have closed
//! or reused meanwhile; the list keeps it alive until the child is done
//! asking, as the child's copy of a kernel socket would.
//!
//! The library's `vfork` is a `fork` (a vfork child runs in its parent's
//! memory, where the hooks it calls before `exec` would edit the
//! parent's tables).

use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use crate::{fd_flags, fork, real, unix_pair, Kind, Sock};

/// In a forked child: its end of the link to the parent, and the fds of
/// the parent's streams left on X-IO with each one's number in the
/// parent's list.
static CHILD: Mutex<Option<ChildLink>> = Mutex::new(None);
type ChildLink = (RawFd, Vec<(RawFd, u32)>);
/// Whether [`CHILD`] is set: the hooks look at this alone otherwise.
static IN_CHILD: AtomicBool = AtomicBool::new(false);

/// The link a vfork makes, while the fork's locks are held.
pub(crate) struct Link {
    parent: RawFd,
    child: RawFd,
    /// The streams left on X-IO, by number, and the kernel socket each
    /// was handed over as, once asked for.
    streams: Vec<(Arc<Sock>, Option<OwnedFd>)>,
    /// Their fds, with each one's number.
    held: Vec<(RawFd, u32)>,
}

/// Before libc's fork, with the table held: a link if `table` has streams
/// (those left after the hand-over of the inheritable ones).
pub(crate) fn prepare(table: Option<&HashMap<RawFd, Arc<Sock>>>) -> Option<Link> {
    let mut streams: Vec<(Arc<Sock>, Option<OwnedFd>)> = Vec::new();
    let mut held = Vec::new();
    for (&fd, sock) in table.into_iter().flatten() {
        if !matches!(sock.kind, Kind::Stream { .. }) {
            continue;
        }
        let i = match streams.iter().position(|(s, _)| Arc::ptr_eq(s, sock)) {
            Some(i) => i,
            None => {
                streams.push((sock.clone(), None));
                streams.len() - 1
            }
        };
        held.push((fd, i as u32));
    }
    if held.is_empty() {
        return None;
    }
    // Both ends close-on-exec: the child's closes when its program starts,
    // which ends the parent's wait.
    let (p, c) = unix_pair(true, false).ok()?;
    Some(Link {
        parent: p.into_raw_fd(),
        child: c.into_raw_fd(),
        streams,
        held,
    })
}

impl Link {
    /// In the parent, still under the fork's locks: the child's end is the
    /// child's alone (a later fork on another thread must not hold it).
    /// A failed fork keeps nothing to serve.
    pub(crate) fn in_parent(&mut self, pid: libc::pid_t) {
        // SAFETY: the child's end, closed once here.
        unsafe { real::close(self.child) };
        self.child = -1;
        if pid < 0 {
            self.held.clear();
        }
    }

    /// In the parent after the fork: hands over each stream the child
    /// asks for and sends its kernel socket back, until the child's end
    /// closes (`exec` or exit).
    pub(crate) fn serve(mut self) {
        if !self.held.is_empty() {
            loop {
                let mut b = [0u8; 4];
                // SAFETY: `b` has 4 writable bytes.
                let n = unsafe { real::read(self.parent, b.as_mut_ptr().cast(), 4) };
                if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                if n != 4 {
                    break;
                }
                let near = self
                    .streams
                    .get_mut(u32::from_ne_bytes(b) as usize)
                    .and_then(|(sock, near)| {
                        if near.is_none() {
                            match fork::hand_over(sock) {
                                Ok(fd) => *near = Some(fd),
                                Err(e) => {
                                    use std::io::Write;
                                    let _ = writeln!(
                                        io::stderr(),
                                        "libxio_preload: a stream stays X-IO's for a forked child: {e}"
                                    );
                                }
                            }
                        }
                        near.as_ref().map(AsRawFd::as_raw_fd)
                    });
                send_fd(self.parent, near);
            }
        }
        // SAFETY: the parent's end, closed once here.
        unsafe { real::close(self.parent) };
    }
}

/// `vfork(2)`, as a `fork` (see the module's docs).
///
/// # Safety
///
/// As libc's `fork`.
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: the same contract.
    let (pid, link) = unsafe { fork::fork_handing(false) };
    if let Some(l) = link {
        l.serve();
    }
    pid
}

/// In every forked child, under the fork's locks: the link its parent had
/// as a forked child itself is not this one's (closed; the parent asked
/// for all it held before forking); `link`, this fork's, is. The parent's
/// streams the link holds go to `dropped`.
pub(crate) fn in_child(link: Option<Link>, dropped: &mut Vec<Arc<Sock>>) {
    let old = CHILD.lock().unwrap_or_else(|e| e.into_inner()).take();
    IN_CHILD.store(false, Ordering::Release);
    if let Some((fd, _)) = old {
        // SAFETY: the inherited link, not this child's to use.
        unsafe { real::close(fd) };
    }
    let Some(l) = link else {
        return;
    };
    // SAFETY: the parent's end, a copy of the parent's own.
    unsafe { real::close(l.parent) };
    dropped.extend(l.streams.into_iter().map(|(s, _)| s));
    // Out of the way of the fds the program is about to arrange.
    // SAFETY: `l.child` is open; the copy is close-on-exec.
    let high = unsafe { real::fcntl(l.child, libc::F_DUPFD_CLOEXEC, 512) };
    let fd = if high >= 0 {
        // SAFETY: the low copy, replaced by `high`.
        unsafe { real::close(l.child) };
        high
    } else {
        l.child
    };
    *CHILD.lock().unwrap_or_else(|e| e.into_inner()) = Some((fd, l.held));
    IN_CHILD.store(true, Ordering::Release);
}

/// Sends one byte with `fd` attached (none if `None`).
fn send_fd(link: RawFd, fd: Option<RawFd>) {
    let mut byte = [fd.is_some() as u8];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    // Room for one fd's control message, aligned for `cmsghdr`.
    let mut space = [0u64; 4];
    // SAFETY: a zeroed msghdr is valid; its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if let Some(fd) = fd {
        msg.msg_control = space.as_mut_ptr().cast();
        // SAFETY: CMSG_SPACE computes a size.
        msg.msg_controllen = unsafe { libc::CMSG_SPACE(4) } as usize;
        // SAFETY: `space` holds CMSG_SPACE(4) bytes, so the first header
        // and its 4 data bytes are inside it.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as usize;
            std::ptr::write_unaligned(libc::CMSG_DATA(c).cast::<RawFd>(), fd);
        }
    }
    loop {
        // SAFETY: `msg` points at live buffers.
        let r = unsafe { real::sendmsg(link, &msg, libc::MSG_NOSIGNAL) };
        if r >= 0 || io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Receives what [`send_fd`] sent: the fd, if one came.
fn recv_fd(link: RawFd) -> Option<RawFd> {
    let mut byte = [0u8; 1];
    let mut iov = libc::iovec {
        iov_base: byte.as_mut_ptr().cast(),
        iov_len: 1,
    };
    let mut space = [0u64; 4];
    // SAFETY: a zeroed msghdr is valid; its pointers are set below.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = space.as_mut_ptr().cast();
    msg.msg_controllen = std::mem::size_of_val(&space);
    loop {
        // SAFETY: `msg` points at live buffers.
        let r = unsafe { real::recvmsg(link, &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if r < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if r != 1 {
            return None;
        }
        break;
    }
    // SAFETY: the kernel filled `msg`'s control buffer; the header, if
    // any, is an SCM_RIGHTS with one fd (the parent sends no other).
    unsafe {
        let c = libc::CMSG_FIRSTHDR(&msg);
        if c.is_null() || (*c).cmsg_type != libc::SCM_RIGHTS {
            return None;
        }
        Some(std::ptr::read_unaligned(libc::CMSG_DATA(c).cast::<RawFd>()))
    }
}

/// In a forked child, before `fd` is used, copied or made inheritable: if it is a
/// parent's stream left on X-IO, has the parent hand it over and puts the
/// kernel socket it sends in the placeholder's place. Nothing otherwise
/// (one load).
pub(crate) fn take_over(fd: RawFd) {
    if !IN_CHILD.load(Ordering::Acquire) {
        return;
    }
    let mut g = CHILD.lock().unwrap_or_else(|e| e.into_inner());
    let Some((link, held)) = g.as_mut() else {
        return;
    };
    let Some(i) = held.iter().position(|&(h, _)| h == fd) else {
        return;
    };
    let (_, n) = held.swap_remove(i);
    let link = *link;
    let b = n.to_ne_bytes();
    // SAFETY: 4 readable bytes; MSG_NOSIGNAL: a parent gone is an error.
    let got = if unsafe { real::send(link, b.as_ptr().cast(), 4, libc::MSG_NOSIGNAL) } == 4 {
        recv_fd(link)
    } else {
        None
    };
    let Some(new) = got else {
        use std::io::Write;
        let _ = writeln!(
            io::stderr(),
            "libxio_preload: fd {fd} is an X-IO stream its parent could not hand over"
        );
        return;
    };
    // The placeholder's status flags (O_NONBLOCK) and close-on-exec flag
    // carry over.
    let (fl, cloexec) = fd_flags(fd);
    // SAFETY: both open; the placeholder at `fd` is replaced by the
    // kernel socket the parent sent, whose own fd is then closed.
    unsafe {
        real::fcntl(new, libc::F_SETFL, fl as usize);
        real::dup3(new, fd, if cloexec { libc::O_CLOEXEC } else { 0 });
        real::close(new);
    }
}

/// In a forked child about to fork again: asks for every stream it still
/// holds for its parent.
pub(crate) fn take_over_all() {
    if !IN_CHILD.load(Ordering::Acquire) {
        return;
    }
    let fds: Vec<RawFd> = CHILD
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map(|(_, held)| held.iter().map(|&(fd, _)| fd).collect())
        .unwrap_or_default();
    for fd in fds {
        take_over(fd);
    }
}

/// In a forked child, as fds `first..=last` are closed or replaced: a held
/// fd there is the program's from now (no longer the parent's stream),
/// and the link, if there, is gone.
pub(crate) fn forget(first: RawFd, last: RawFd) {
    if !IN_CHILD.load(Ordering::Acquire) {
        return;
    }
    let mut g = CHILD.lock().unwrap_or_else(|e| e.into_inner());
    let Some((link, held)) = g.as_mut() else {
        return;
    };
    held.retain(|&(fd, _)| !(first..=last).contains(&fd));
    if (first..=last).contains(link) {
        *g = None;
        IN_CHILD.store(false, Ordering::Release);
    }
}

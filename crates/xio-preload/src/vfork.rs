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
use std::ffi::c_int;
use std::io::{self, Write};
use std::os::fd::{AsRawFd, IntoRawFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::{fd_flags, fork, real, unix_pair, Kind, Sock};

/// In a forked child: its end of the link to the parent, and the fds of
/// the parent's streams left on X-IO with each one's number in the
/// parent's list. Taken inside lookups (after the epoll sets' lock) and
/// held across a fork, after the sets' lock.
static CHILD: Mutex<Option<ChildLink>> = Mutex::new(None);
type ChildLink = (RawFd, Vec<(RawFd, u32)>);
/// Whether [`CHILD`] is set: the hooks look at this alone otherwise.
static IN_CHILD: AtomicBool = AtomicBool::new(false);
/// The held fds below 65,536, a bit each: a call on any other fd in a
/// child passes without the lock.
static HELD: [AtomicU64; 1024] = [const { AtomicU64::new(0) }; 1024];

fn held_bit(fd: RawFd) -> Option<(&'static AtomicU64, u64)> {
    let f = usize::try_from(fd).ok()?;
    Some((HELD.get(f / 64)?, 1u64 << (f % 64)))
}

/// The link a fork makes, while the fork's locks are held.
pub(crate) struct Link {
    parent: RawFd,
    child: RawFd,
    /// The streams left on X-IO, by number.
    streams: Vec<Arc<Sock>>,
    /// Their fds, with each one's number.
    held: Vec<(RawFd, u32)>,
}

impl Drop for Link {
    fn drop(&mut self) {
        for fd in [self.parent, self.child] {
            if fd >= 0 {
                // SAFETY: the link's own ends, each closed once.
                unsafe { real::close(fd) };
            }
        }
    }
}

/// Before libc's fork, with the table held: a link if `table` has streams
/// (those left after the hand-over of the inheritable ones).
pub(crate) fn prepare(table: Option<&HashMap<RawFd, Arc<Sock>>>) -> Option<Link> {
    let mut streams: Vec<Arc<Sock>> = Vec::new();
    let mut held = Vec::new();
    for (&fd, sock) in table.into_iter().flatten() {
        if !matches!(sock.kind, Kind::Stream { .. }) {
            continue;
        }
        let i = match streams.iter().position(|s| Arc::ptr_eq(s, sock)) {
            Some(i) => i,
            None => {
                streams.push(sock.clone());
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
    pub(crate) fn in_parent(&mut self) {
        // SAFETY: the child's end, closed once here.
        unsafe { real::close(self.child) };
        self.child = -1;
    }

    /// In the parent after the fork: hands over each stream the child
    /// asks for and sends its kernel socket back, until the child's end
    /// closes (`exec` or exit).
    pub(crate) fn serve(self) {
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
                .get(u32::from_ne_bytes(b) as usize)
                .and_then(|sock| match fork::hand_over(sock) {
                    Ok(fd) => Some(fd),
                    Err(e) => {
                        let _ = writeln!(
                            io::stderr(),
                            "libxio_preload: a stream stays X-IO's for a forked child: {e}"
                        );
                        None
                    }
                });
            send_fd(self.parent, near.as_ref().map(AsRawFd::as_raw_fd));
        }
    }
}

/// `vfork(2)`, as a `fork` (see the module's docs) whose parent answers
/// the child until it runs its program.
///
/// # Safety
///
/// As libc's `fork`.
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // SAFETY: the same contract.
    let (pid, link) = unsafe { fork::fork_handing() };
    if let Some(l) = link {
        l.serve();
    }
    pid
}

/// `posix_spawn(3)`: its child runs no hook before `exec`, so the
/// streams the new program inherits (not close-on-exec) are handed to the
/// kernel path first, as `vfork` does; a `dup2` file action's stream was
/// handed over when the action was added.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn(
    pid: *mut libc::pid_t,
    path: *const libc::c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    fork::inheritable_to_kernel();
    // SAFETY: passed on.
    unsafe { real::posix_spawn(pid, path, fa, attr, argv, envp) }
}

/// `posix_spawnp(3)`, as [`posix_spawn`].
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn posix_spawnp(
    pid: *mut libc::pid_t,
    file: *const libc::c_char,
    fa: *const libc::posix_spawn_file_actions_t,
    attr: *const libc::posix_spawnattr_t,
    argv: *const *mut libc::c_char,
    envp: *const *mut libc::c_char,
) -> c_int {
    fork::inheritable_to_kernel();
    // SAFETY: passed on.
    unsafe { real::posix_spawnp(pid, file, fa, attr, argv, envp) }
}

/// `system(3)`: libc runs the shell through its internal `posix_spawn`,
/// which no hook sees, so the streams the shell inherits are handed to
/// the kernel path first, as for [`posix_spawn`].
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn system(command: *const libc::c_char) -> c_int {
    // (A null command only asks whether a shell exists: the shell libc
    // runs for it uses nothing it inherits.)
    if !command.is_null() {
        fork::inheritable_to_kernel();
    }
    // SAFETY: passed on.
    unsafe { real::system(command) }
}

/// `popen(3)`, as [`system`].
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn popen(
    command: *const libc::c_char,
    mode: *const libc::c_char,
) -> *mut libc::FILE {
    fork::inheritable_to_kernel();
    // SAFETY: passed on.
    unsafe { real::popen(command, mode) }
}

/// `posix_spawn_file_actions_adddup2(3)`: the new program gets `fd`, so a
/// moved stream there is handed to the kernel path now.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn posix_spawn_file_actions_adddup2(
    fa: *mut libc::posix_spawn_file_actions_t,
    fd: c_int,
    newfd: c_int,
) -> c_int {
    if let Some(sock) = crate::lookup(fd) {
        if matches!(sock.kind, Kind::Stream { .. }) {
            if let Err(e) = fork::hand_over(&sock) {
                let _ = writeln!(
                    io::stderr(),
                    "libxio_preload: a stream stays X-IO's for a spawned program: {e}"
                );
            }
        }
    }
    // SAFETY: passed on.
    unsafe { real::posix_spawn_file_actions_adddup2(fa, fd, newfd) }
}

/// The child's link, held across a fork (see `fork.rs`).
pub(crate) fn lock_for_fork() -> MutexGuard<'static, Option<ChildLink>> {
    CHILD.lock().unwrap_or_else(|e| e.into_inner())
}

/// In every forked child, under the fork's locks (`child` is the link's
/// lock): the link its parent had as a forked child itself is not this
/// one's (closed; the parent asked for all it held before forking);
/// `link`, this fork's, is. The parent's streams the link holds go to
/// `dropped`.
pub(crate) fn in_child(
    child: &mut Option<ChildLink>,
    link: Option<Link>,
    dropped: &mut Vec<Arc<Sock>>,
) {
    if let Some((fd, held)) = child.take() {
        for (h, _) in held {
            if let Some((w, bit)) = held_bit(h) {
                w.fetch_and(!bit, Ordering::Relaxed);
            }
        }
        // SAFETY: the inherited link, not this child's to use.
        unsafe { real::close(fd) };
    }
    IN_CHILD.store(false, Ordering::Release);
    let Some(mut l) = link else {
        return;
    };
    // SAFETY: the parent's end, a copy of the parent's own.
    unsafe { real::close(l.parent) };
    l.parent = -1;
    dropped.append(&mut l.streams);
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
    l.child = -1;
    let held = std::mem::take(&mut l.held);
    for &(h, _) in &held {
        if let Some((w, bit)) = held_bit(h) {
            w.fetch_or(bit, Ordering::Relaxed);
        }
    }
    *child = Some((fd, held));
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

/// In a forked child, before `fd` is used, copied or made inheritable: if
/// it is a parent's stream left on X-IO, has the parent hand it over and
/// puts the kernel socket it sends in the placeholder's place. A load or
/// two otherwise, no lock.
pub(crate) fn take_over(fd: RawFd) {
    if !IN_CHILD.load(Ordering::Acquire) {
        return;
    }
    if held_bit(fd).is_some_and(|(w, bit)| w.load(Ordering::Relaxed) & bit == 0) {
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
    if let Some((w, bit)) = held_bit(fd) {
        w.fetch_and(!bit, Ordering::Relaxed);
    }
    let link = *link;
    let b = n.to_ne_bytes();
    // SAFETY: 4 readable bytes; MSG_NOSIGNAL: a parent gone is an error.
    let got = if unsafe { real::send(link, b.as_ptr().cast(), 4, libc::MSG_NOSIGNAL) } == 4 {
        recv_fd(link)
    } else {
        None
    };
    let done = held.is_empty();
    if done {
        // Nothing more to ask for: the parent's thread can end.
        *g = None;
        IN_CHILD.store(false, Ordering::Release);
        // SAFETY: the link's fd, ours, closed once.
        unsafe { real::close(link) };
    }
    let Some(new) = got else {
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
/// and the link, if there, is gone. Nothing during a fork (its locks are
/// held; the fork's own closes are not the program's).
pub(crate) fn forget(first: RawFd, last: RawFd) {
    if !IN_CHILD.load(Ordering::Acquire) || fork::forking() {
        return;
    }
    let mut g = CHILD.lock().unwrap_or_else(|e| e.into_inner());
    let Some((link, held)) = g.as_mut() else {
        return;
    };
    held.retain(|&(fd, _)| {
        let gone = (first..=last).contains(&fd);
        if gone {
            if let Some((w, bit)) = held_bit(fd) {
                w.fetch_and(!bit, Ordering::Relaxed);
            }
        }
        !gone
    });
    if (first..=last).contains(link) {
        *g = None;
        IN_CHILD.store(false, Ordering::Release);
    } else if held.is_empty() {
        // SAFETY: the link's fd, ours, closed once.
        unsafe { real::close(*link) };
        *g = None;
        IN_CHILD.store(false, Ordering::Release);
    }
}

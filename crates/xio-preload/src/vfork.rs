//! `vfork`: a child that starts a new program, and the streams it passes
//! on.
//!
//! The library's `vfork` is a `fork` (a vfork child runs in its parent's
//! memory, where the hooks it calls before `exec` would edit the
//! parent's tables) that hands to the kernel path only the moved streams
//! a new program inherits, those not close-on-exec: Python's subprocess
//! uses vfork, and its sockets are close-on-exec, so starting a program
//! costs the open connections nothing.
//!
//! A close-on-exec stream can still reach the new program: the child
//! `dup2`s it onto the program's stdin or stdout (`Popen(stdin=conn)`), or
//! makes it inheritable (`pass_fds`). In the child such an fd is a
//! placeholder (the X-IO side is the parent's). So the child asks: before
//! it copies one (`dup`, `dup2`, `dup3`, `F_DUPFD`) or makes it
//! inheritable (`F_SETFD`, `FIONCLEX`), it sends the fd's number over a
//! socket pair made for the vfork, and the parent, which waits in `vfork`
//! until the child `exec`s or exits (as a vfork parent is suspended), hands
//! that stream to the kernel path behind a relay and passes its new fd
//! back (`SCM_RIGHTS`); the child puts it in the placeholder's place.

use std::io;
use std::os::fd::{IntoRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;

use crate::{fd_flags, fork, real, unix_pair, MOVED};

/// In a vfork child: its end of the link to the parent, and the fds of
/// the parent's streams not handed over (placeholders here).
static CHILD: Mutex<Option<(RawFd, Vec<RawFd>)>> = Mutex::new(None);
/// Whether [`CHILD`] is set: the hooks look at this alone otherwise.
static IN_CHILD: AtomicBool = AtomicBool::new(false);

/// `vfork(2)`, as a `fork` (see the module's docs).
///
/// # Safety
///
/// As libc's `fork`.
#[no_mangle]
pub unsafe extern "C" fn vfork() -> libc::pid_t {
    // Both ends close-on-exec: the child's closes when its program starts,
    // which ends the parent's wait.
    let link = if MOVED.load(Ordering::Acquire) > 0 {
        unix_pair(true, false).ok()
    } else {
        None
    };
    // SAFETY: the same contract.
    let (pid, held) = unsafe { fork::fork_handing(false) };
    let Some((parent, child)) = link else {
        return pid;
    };
    let (parent, child) = (parent.into_raw_fd(), child.into_raw_fd());
    match pid {
        0 => {
            // SAFETY: the parent's end, a copy of the child's own.
            unsafe { real::close(parent) };
            if held.is_empty() {
                // SAFETY: ours, unused.
                unsafe { real::close(child) };
            } else {
                *CHILD.lock().unwrap_or_else(|e| e.into_inner()) = Some((child, held));
                IN_CHILD.store(true, Ordering::Release);
            }
        }
        _ => {
            // SAFETY: the child's end: the parent keeps none.
            unsafe { real::close(child) };
            if pid > 0 && !held.is_empty() {
                serve(parent);
            }
            // SAFETY: ours, done with.
            unsafe { real::close(parent) };
        }
    }
    pid
}

/// In the parent: hands over each stream the child asks for and passes
/// its fd back, until the child's end closes (`exec` or exit).
fn serve(link: RawFd) {
    loop {
        let mut b = [0u8; 4];
        // SAFETY: `b` has 4 writable bytes.
        let n = unsafe { real::read(link, b.as_mut_ptr().cast(), 4) };
        if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        }
        if n != 4 {
            return;
        }
        let fd = RawFd::from_ne_bytes(b);
        let ok = fork::to_kernel_at(fd);
        send_fd(link, ok.then_some(fd));
    }
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

/// In a vfork child, before `fd` is copied or made inheritable: if it is a
/// parent's stream left on X-IO, has the parent hand it over and puts the
/// kernel fd it sends in its place. Nothing otherwise (one load).
pub(crate) fn take_over(fd: RawFd) {
    if !IN_CHILD.load(Ordering::Acquire) {
        return;
    }
    let mut g = CHILD.lock().unwrap_or_else(|e| e.into_inner());
    let Some((link, held)) = g.as_mut() else {
        return;
    };
    let Some(i) = held.iter().position(|&h| h == fd) else {
        return;
    };
    held.swap_remove(i);
    let link = *link;
    let b = fd.to_ne_bytes();
    // SAFETY: 4 readable bytes.
    if unsafe { real::write(link, b.as_ptr().cast(), 4) } != 4 {
        return;
    }
    match recv_fd(link) {
        Some(new) => {
            let flags = if fd_flags(fd).1 { libc::O_CLOEXEC } else { 0 };
            // SAFETY: both open; the placeholder at `fd` is replaced by
            // the kernel fd the parent sent, which is then closed.
            unsafe {
                real::dup3(new, fd, flags);
                real::close(new);
            }
        }
        None => {
            use std::io::Write;
            let _ = writeln!(
                io::stderr(),
                "libxio_preload: fd {fd} is an X-IO stream its parent could not hand over"
            );
        }
    }
}

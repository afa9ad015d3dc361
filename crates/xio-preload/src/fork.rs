//! `fork` and `vfork`: what a child inherits of the moved sockets.
//!
//! A moved stream's X-IO side belongs to the process that opened it (its
//! stack, its rings); a forked child cannot use it. So a stream the child
//! uses is handed to the kernel path: its fds become one end of a fresh
//! Unix socket pair (same numbers, flags and epoll registrations), and a
//! relay in this process moves the bytes between the pair's other end
//! and the X-IO stream, both ways, until every copy of the fd, in this
//! process and in its children, is closed. Parent and child then share
//! the stream as they would share a kernel socket (ForkingMixIn servers,
//! CGI); the relay costs a copy and a kernel hop.
//!
//! A stream with an fd that is not close-on-exec is handed over before
//! the fork (a program the child `exec`s would inherit it, and no hook
//! runs there). A close-on-exec one stays on X-IO in the parent, and the
//! child asks for it when it first uses it (see `vfork.rs`): a child that
//! never does (redis's `BGSAVE`) costs the connections nothing.
//!
//! Listeners stay moved on both sides: the child's copy is a fresh entry
//! whose X-IO side binds at its first accept or readiness registration
//! (nginx's workers, after a master that never accepts). X-IO lets one
//! process bind an address at a time; a second worker's listener is
//! kernel-only.
//!
//! `posix_spawn` hands over what the new program inherits before it runs
//! (its child runs no hook), and a `dup2` file action's stream when the
//! action is added (see `vfork.rs`); so do `system` and `popen`, whose
//! internal `posix_spawn` no hook sees.
//!
//! Not covered: a process that ends while a child still uses a stream it
//! relays (the child sees the end of the stream).

use std::cell::Cell;
use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::Shutdown;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use xio_core::net::XioStream;

use crate::{fd_flags, mux, ready, real, unix_pair, vfork, Kind, Sock, MOVED, TABLE};

/// The relays' ends of their pairs: a forked child closes its copies,
/// which would keep its own end from ever seeing the relay's end.
static RELAYED: Mutex<Vec<RawFd>> = Mutex::new(Vec::new());

thread_local! {
    /// Set on the thread inside libc's `fork`: the fork handlers that run
    /// there (xio-core's closes and `dup2`s descriptors in the child) call
    /// the hooks while this library's locks are held, so the hooks pass
    /// them to libc as they are.
    static FORKING: Cell<bool> = const { Cell::new(false) };
}

/// Whether this thread is inside libc's `fork` (see [`FORKING`]).
pub(crate) fn forking() -> bool {
    FORKING.get()
}

/// `fork(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn fork() -> libc::pid_t {
    // SAFETY: the same contract.
    let (pid, link) = unsafe { fork_handing() };
    if let Some(l) = link {
        // The child may ask for its streams at any time: a thread of the
        // parent answers until every copy of the child's end is closed.
        let _quiet = QuietSignals::new();
        let spawned = std::thread::Builder::new()
            .name("xio-fork-link".into())
            .spawn(move || l.serve());
        if let Err(e) = spawned {
            let _ = writeln!(
                io::stderr(),
                "libxio_preload: the forked child cannot take over its X-IO streams: {e}"
            );
        }
    }
    pid
}

/// `fork`, handing to the kernel the moved streams a program `exec`ed by
/// the child would inherit (not close-on-exec); the parent gets the link
/// over which the child asks for the others (see `vfork.rs`).
///
/// # Safety
///
/// As libc's `fork`.
pub(crate) unsafe fn fork_handing() -> (libc::pid_t, Option<vfork::Link>) {
    // A child forking again: the streams it still holds for its parent
    // are asked for now (its own child could not ask).
    vfork::take_over_all();
    inheritable_to_kernel();
    // The library's locks, held across the fork: the child's copies are
    // then free (a thread of the parent inside one would leave the
    // child's copy taken for ever). Order: sets, the child's link,
    // registry, table (the order the hooks nest them in).
    let mut sets = mux::lock_for_fork();
    let mut child_link = vfork::lock_for_fork();
    let (mut registry, poll_fd) = ready::lock_for_fork();
    let mut relayed = RELAYED.lock().unwrap_or_else(|e| e.into_inner());
    let mut sleepers = crate::bell::lock_for_fork();
    let mut table = TABLE.write().unwrap_or_else(|e| e.into_inner());
    // Made under the locks: a fork on another thread meanwhile would
    // inherit the child's end and keep the parent waiting.
    let mut link = vfork::prepare(table.as_ref());
    FORKING.set(true);
    // SAFETY: libc's fork; the locks above are released in both processes.
    let pid = unsafe { real::fork() };
    // What the child lets go of, dropped once the locks are released (a
    // stream's socket pair end closes through the `close` hook).
    let mut dropped: Vec<Arc<Sock>> = Vec::new();
    let mut bells = Vec::new();
    if pid == 0 {
        // The child: its listeners are fresh entries (their X-IO side
        // unbound, their locks free); a stream moved since the
        // `inheritable_to_kernel` above is the parent's (dropping an inherited one
        // does nothing, see xio-core's `fork`).
        let mut fresh: HashMap<*const Sock, Arc<Sock>> = HashMap::new();
        let mut kept = HashMap::new();
        for (fd, sock) in table.take().into_iter().flatten() {
            if let Kind::Listener { addr, .. } = &sock.kind {
                let new = fresh
                    .entry(Arc::as_ptr(&sock))
                    .or_insert_with(|| crate::new_listener(*addr))
                    .clone();
                kept.insert(fd, new);
            }
            dropped.push(sock);
        }
        MOVED.store(kept.len(), Ordering::Release);
        crate::remap(kept.keys().copied());
        *table = Some(kept);
        let listeners: Vec<Arc<Sock>> = fresh.into_values().collect();
        ready::child_registry(&mut registry, &listeners);
        mux::child_sets(&mut sets);
        // The parent's threads are not the child's.
        bells = std::mem::take(&mut *sleepers);
        for fd in relayed.drain(..) {
            // SAFETY: the child's copy of a relay's end, not used here.
            unsafe { real::close(fd) };
        }
        vfork::in_child(&mut child_link, link.take(), &mut dropped);
    } else if pid < 0 {
        link = None;
    } else if let Some(l) = &mut link {
        l.in_parent();
    }
    drop((
        table, sleepers, relayed, poll_fd, registry, child_link, sets,
    ));
    FORKING.set(false);
    drop((dropped, bells));
    (pid, link)
}

/// Hands to the kernel path, behind a relay, the moved streams a program
/// `exec`ed now would inherit: those with an fd that is not close-on-exec
/// (before a fork, and before `posix_spawn`, whose child runs no hook).
pub(crate) fn inheritable_to_kernel() {
    if MOVED.load(Ordering::Acquire) == 0 {
        return;
    }
    // Each stream with all its fds (one open file description, `dup`ed).
    let mut streams: HashMap<*const Sock, (Arc<Sock>, Vec<RawFd>)> = HashMap::new();
    {
        let t = TABLE.read().unwrap_or_else(|e| e.into_inner());
        for (&fd, sock) in t.iter().flatten() {
            if matches!(sock.kind, Kind::Stream { .. }) {
                streams
                    .entry(Arc::as_ptr(sock))
                    .or_insert_with(|| (sock.clone(), Vec::new()))
                    .1
                    .push(fd);
            }
        }
    }
    for (sock, fds) in streams.into_values() {
        if fds.iter().all(|&fd| fd_flags(fd).1) {
            continue;
        }
        if let Err(e) = to_kernel(&sock, &fds) {
            // The stream stays moved in this process; a child that uses
            // it finds a closed pair.
            let _ = writeln!(
                io::stderr(),
                "libxio_preload: a stream stays X-IO's across a fork: {e}"
            );
        }
    }
}

/// Hands `sock`, a moved stream, to the kernel path behind a relay, with
/// whatever fds this process still has of it, and returns the new pair's
/// near end: for a `vfork` child that passes the stream on. (Its current
/// fds cannot be relayed where they stand: their pair's far end is shut
/// down, so that calls the library does not define fail visibly.)
pub(crate) fn hand_over(sock: &Arc<Sock>) -> io::Result<OwnedFd> {
    let fds: Vec<RawFd> = {
        let t = TABLE.read().unwrap_or_else(|e| e.into_inner());
        t.iter()
            .flatten()
            .filter(|(_, x)| Arc::ptr_eq(x, sock))
            .map(|(&fd, _)| fd)
            .collect()
    };
    to_kernel(sock, &fds)
}

/// Hands `sock` to the kernel path: a socket pair's near end over each
/// of `fds` that still maps to it (same flags, epoll registrations moved),
/// a relay on its far end; returns a copy of the near end. Once per
/// stream: asked again (another child's link, a fork that came between),
/// it puts the same near end over what fds are left, as a second relay
/// on one X-IO stream would split its bytes.
fn to_kernel(sock: &Sock, fds: &[RawFd]) -> io::Result<OwnedFd> {
    let Kind::Stream { s, handed, .. } = &sock.kind else {
        return Err(io::Error::other("not a stream"));
    };
    let mut handed = handed.lock().unwrap_or_else(|e| e.into_inner());
    let fresh = match &*handed {
        Some(_) => None,
        None => {
            let (a, b) = (s.try_clone()?, s.try_clone()?);
            let (near, far) = unix_pair(true, false)?;
            if let Some(&first) = fds.first() {
                // The program's status flags (O_NONBLOCK), from the
                // placeholder it still has there.
                let (fl, _) = fd_flags(first);
                // SAFETY: `near` is open; its file description becomes
                // every one of `fds`'.
                unsafe { real::fcntl(near.as_raw_fd(), libc::F_SETFL, fl as usize) };
            }
            keep_timeouts(s, near.as_raw_fd());
            Some((a, b, near, far))
        }
    };
    let near = match (&*handed, &fresh) {
        (Some(n), _) => n.as_raw_fd(),
        (None, Some((_, _, n, _))) => n.as_raw_fd(),
        (None, None) => unreachable!("made above"),
    };
    for &fd in fds {
        if let Some(old) = crate::replace_mapped(fd, sock, near)? {
            mux::to_kernel(fd);
            drop(old);
        }
    }
    if let Some((a, b, n, far)) = fresh {
        // Started once the fds are the kernel's: the relay makes the X-IO
        // stream blocking, which the program's calls must not meet.
        relay(a, b, far)?;
        *handed = Some(n);
    }
    // SAFETY: `near` is open (kept in `handed`); the copy is the caller's.
    let copy = unsafe { real::fcntl(near, libc::F_DUPFD_CLOEXEC, 0) };
    if copy < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: just made, owned from here.
    Ok(unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(copy) })
}

/// The program's timeouts lived on the X-IO stream: `fd`, its kernel
/// socket now, takes them over.
fn keep_timeouts(s: &XioStream, fd: RawFd) {
    for (name, t) in [
        (libc::SO_RCVTIMEO, s.read_timeout()),
        (libc::SO_SNDTIMEO, s.write_timeout()),
    ] {
        if let Ok(Some(t)) = t {
            let tv = libc::timeval {
                tv_sec: t.as_secs() as libc::time_t,
                tv_usec: t.subsec_micros() as libc::suseconds_t,
            };
            // SAFETY: a timeval for the option, its size given.
            unsafe {
                real::setsockopt(
                    fd,
                    libc::SOL_SOCKET,
                    name,
                    (&raw const tv).cast(),
                    size_of::<libc::timeval>() as libc::socklen_t,
                )
            };
        }
    }
}

/// Moves bytes between X-IO stream `s` (`s2` another handle to it) and
/// `far`, the pair's end kept here, until both directions end.
fn relay(s: XioStream, s2: XioStream, far: OwnedFd) -> io::Result<()> {
    for x in [&s, &s2] {
        x.set_nonblocking(false)?;
        x.set_read_timeout(None)?;
        x.set_write_timeout(None)?;
    }
    let far = {
        let mut g = RELAYED.lock().unwrap_or_else(|e| e.into_inner());
        let fd = far.into_raw_fd();
        g.push(fd);
        Arc::new(Relayed(fd))
    };
    let far2 = far.clone();
    // The relay's threads start with every signal blocked: the program's
    // handlers run on its own threads, as without the library.
    let _quiet = QuietSignals::new();
    // From X-IO to the pair: its end of stream is a shutdown of the
    // pair's write side (the program reads its end of file).
    std::thread::Builder::new()
        .name("xio-relay-in".into())
        .spawn(move || {
            let mut s = s;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                match s.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if !send_all(far.0, &buf[..n]) {
                            break;
                        }
                    }
                }
            }
            // SAFETY: `far` is open while this thread holds it.
            unsafe { real::shutdown(far.0, libc::SHUT_WR) };
        })?;
    // From the pair to X-IO: the program's end of stream is X-IO's FIN;
    // when every copy of the program's end is closed (the pair hangs up),
    // the stream ends both ways, which also ends the other thread.
    std::thread::Builder::new()
        .name("xio-relay-out".into())
        .spawn(move || {
            let mut s = s2;
            let fd = far2.0;
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                // SAFETY: `buf` has `buf.len()` writable bytes.
                let n = unsafe { real::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
                match n {
                    0 => break,
                    n if n > 0 => {
                        if s.write_all(&buf[..n as usize]).is_err() {
                            break;
                        }
                    }
                    _ if io::Error::last_os_error().kind() == io::ErrorKind::Interrupted => {}
                    _ => break,
                }
            }
            let _ = s.shutdown(Shutdown::Write);
            wait_hang_up(fd);
            let _ = s.shutdown(Shutdown::Both);
        })?;
    Ok(())
}

/// A relay's end of its pair, closed (and forgotten for forks) by the
/// last of the relay's two threads.
struct Relayed(RawFd);

impl Drop for Relayed {
    fn drop(&mut self) {
        // Forgotten and closed under the lock a fork holds: a child
        // closes every copy it has, and never a number reused since.
        let mut g = RELAYED.lock().unwrap_or_else(|e| e.into_inner());
        g.retain(|&f| f != self.0);
        // SAFETY: the relay's own fd, closed once, here.
        unsafe { real::close(self.0) };
    }
}

/// Writes all of `data` to `fd`; false if the pair is gone.
fn send_all(fd: RawFd, mut data: &[u8]) -> bool {
    while !data.is_empty() {
        // SAFETY: `data` is readable; MSG_NOSIGNAL: a gone reader is an
        // error here, not the program's SIGPIPE.
        let n = unsafe { real::send(fd, data.as_ptr().cast(), data.len(), libc::MSG_NOSIGNAL) };
        if n > 0 {
            data = &data[n as usize..];
        } else if n < 0 && io::Error::last_os_error().kind() == io::ErrorKind::Interrupted {
            continue;
        } else {
            return false;
        }
    }
    true
}

/// Waits until every copy of the pair's other end is closed.
fn wait_hang_up(fd: RawFd) {
    let mut p = libc::pollfd {
        fd,
        // None asked: only a hang-up or an error is reported.
        events: 0,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd.
        let r = unsafe { real::poll(&mut p, 1, -1) };
        if r > 0 && p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
            return;
        }
        if r < 0 && io::Error::last_os_error().kind() != io::ErrorKind::Interrupted {
            return;
        }
    }
}

/// Every signal blocked on this thread while it lives (threads spawned
/// meanwhile inherit the mask), the mask before restored after.
pub(crate) struct QuietSignals(libc::sigset_t);

impl QuietSignals {
    pub(crate) fn new() -> QuietSignals {
        // SAFETY: zeroed sigsets, filled by `sigfillset` and written by
        // `pthread_sigmask` with the mask it replaces.
        unsafe {
            let mut all: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigfillset(&mut all);
            libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
            QuietSignals(old)
        }
    }
}

impl Drop for QuietSignals {
    fn drop(&mut self) {
        // SAFETY: the mask saved in `new`.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

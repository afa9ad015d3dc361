//! `accept`: a moved listener takes connections from X-IO and from the
//! kernel alike, and waits as a kernel `accept` does: for either, until
//! the listener's `SO_RCVTIMEO` (`EAGAIN`) or a signal that ends the call
//! (`EINTR`, see `intr`).

use std::ffi::c_int;
use std::io;
use std::net::SocketAddr;
use std::os::fd::RawFd;
use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use libc::{sockaddr, socklen_t};
use xio_core::net::XioListener;

use crate::addr::write_sockaddr;
use crate::{
    bell, fail, fd_flags, install_new, int_opt, intr, lookup, net, peer_of, ready, real, Kind, Sock,
};

/// X-IO's side of listener `addr`, bound at the first accept.
pub(crate) fn xio_listener(
    slot: &Mutex<Option<Option<XioListener>>>,
    addr: SocketAddr,
) -> Option<XioListener> {
    let mut g = slot.lock().unwrap_or_else(|e| e.into_inner());
    g.get_or_insert_with(|| {
        let l = net().and_then(|_| XioListener::bind(addr).ok())?;
        l.set_nonblocking(true).ok()?;
        Some(l)
    })
    .as_ref()
    .and_then(|l| l.try_clone().ok())
}

/// Waits for a connection on X-IO listener `l` or on kernel listener `fd`.
/// `Ok(Some(fd))`: a moved stream; `Ok(None)`: the kernel has one (accept
/// it there).
fn accept_either(
    fd: RawFd,
    sock: &Sock,
    l: &XioListener,
    flags: c_int,
) -> io::Result<Option<RawFd>> {
    let (fl, _) = fd_flags(fd);
    let nonblocking = fl & libc::O_NONBLOCK != 0;
    let net = l.net();
    let try_xio = || match l.accept() {
        Ok((s, _)) => {
            // An accepted socket starts with its listener's IP_TTL and
            // timeouts (Linux copies them when the connection is made,
            // before the accept; here they are the accept's).
            if let Some(ttl) = int_opt(fd, libc::IPPROTO_IP, libc::IP_TTL) {
                let _ = s.set_ttl(ttl as u32);
            }
            if let Some(t) = timeout_of(fd, libc::SO_RCVTIMEO) {
                let _ = s.set_read_timeout(Some(t));
            }
            if let Some(t) = timeout_of(fd, libc::SO_SNDTIMEO) {
                let _ = s.set_write_timeout(Some(t));
            }
            install_new(s, flags).map(Some)
        }
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
            sock.bits.acceptable.store(false, Ordering::Relaxed);
            Ok(None)
        }
        Err(e) => Err(e),
    };
    let timeout = if nonblocking {
        None
    } else {
        timeout_of(fd, libc::SO_RCVTIMEO)
    };
    let deadline = timeout.map(|t| Instant::now() + t);
    let since = intr::Since::now(timeout.is_some());
    loop {
        if let Some(new) = try_xio()? {
            return Ok(Some(new));
        }
        match readable(&[fd], 0) {
            Ok(true) => return Ok(None),
            // (A signal during the look: whether it ends the call is
            // decided below, as for one during the sleep.)
            Ok(false) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        // Take in what came (arming the doorbell), look once more, then
        // sleep on both: what comes after the arming rings it (and what
        // another thread takes in rings this thread's bell).
        let asleep = (!nonblocking).then(bell::Asleep::new).flatten();
        ready::pump();
        if let Some(new) = try_xio()? {
            return Ok(Some(new));
        }
        if nonblocking {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        // A handler that ran while this thread was not asleep in a
        // syscall ends the call too (before its timeout, as Linux looks).
        if since.interrupted() {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let ms = match deadline {
            None => -1,
            Some(d) => match d.saturating_duration_since(Instant::now()) {
                left if left.is_zero() => return Err(io::ErrorKind::WouldBlock.into()),
                left => c_int::try_from(left.as_micros().div_ceil(1000)).unwrap_or(c_int::MAX),
            },
        };
        let pfd = ready::poll_fd(&net).ok_or_else(|| io::Error::other("no poll fd"))?;
        let mut fds = vec![fd, pfd];
        fds.extend(asleep.as_ref().map(bell::Asleep::fd));
        match readable(&fds, ms) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {
                if since.interrupted() {
                    return Err(e);
                }
                // A handler that restarts calls: go round again.
            }
            r => {
                r?;
            }
        }
        // Which one woke us is not asked: the next pump reads the
        // doorbell.
        ready::note_rung();
    }
}

/// Kernel socket `fd`'s `SO_RCVTIMEO` or `SO_SNDTIMEO` (`name`), if one
/// is set.
fn timeout_of(fd: RawFd, name: c_int) -> Option<Duration> {
    // SAFETY: all-zero is a valid `timeval`.
    let mut tv: libc::timeval = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::timeval>() as socklen_t;
    // SAFETY: `tv` has `len` bytes of room.
    let r = unsafe { real::getsockopt(fd, libc::SOL_SOCKET, name, (&raw mut tv).cast(), &mut len) };
    if r != 0 {
        return None;
    }
    let t = Duration::from_secs(tv.tv_sec.max(0) as u64)
        + Duration::from_micros(tv.tv_usec.max(0) as u64);
    (!t.is_zero()).then_some(t)
}

/// Whether any of `fds` is readable within `timeout_ms` (-1: no limit);
/// `EINTR` if a signal's handler ran meanwhile.
fn readable(fds: &[RawFd], timeout_ms: c_int) -> io::Result<bool> {
    let mut p: Vec<libc::pollfd> = fds
        .iter()
        .map(|&fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
    // SAFETY: `p` holds `p.len()` pollfds.
    let r = unsafe { real::poll(p.as_mut_ptr(), p.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r > 0)
}

/// `accept4(2)`.
///
/// # Safety
///
/// As libc's: `addr` is null or has `*len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn accept4(
    fd: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
    flags: c_int,
) -> c_int {
    if let Some(sock) = lookup(fd) {
        if let Kind::Listener { addr: a, xio } = &sock.kind {
            if let Some(l) = xio_listener(xio, *a) {
                match accept_either(fd, &sock, &l, flags) {
                    Ok(Some(new)) => {
                        if let Some(peer) = lookup(new).and_then(|x| match &x.kind {
                            Kind::Stream { s, .. } => peer_of(s).ok(),
                            Kind::Listener { .. } => None,
                        }) {
                            // SAFETY: the caller's contract.
                            unsafe { write_sockaddr(&peer, addr, len) };
                        }
                        return new;
                    }
                    Ok(None) => {}
                    Err(e) => return fail(&e, true),
                }
            }
        }
    }
    // SAFETY: passed on.
    unsafe { real::accept4(fd, addr, len, flags) }
}

/// `accept(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the same contract.
    unsafe { accept4(fd, addr, len, 0) }
}

//! `EINTR`: a blocking call on a moved socket interrupted by a signal.
//!
//! A kernel socket's blocking call returns `EINTR` when a signal's handler
//! runs, unless the handler was installed with `SA_RESTART` (and no
//! timeout is set on the socket), in which case the call goes on. X-IO's
//! own blocking waits are not interrupted, so while the program has a
//! handler installed without `SA_RESTART` (Python's `SIGINT` handler is
//! one: a blocked `recv` must raise `KeyboardInterrupt`), blocking calls
//! on moved sockets wait here instead: tried non-blocking, then a wait in
//! `ppoll` on the net's poll fd and the thread's bell, which a signal
//! interrupts. Which signal interrupted is not known, so any handler
//! without `SA_RESTART` makes every interruption an `EINTR`; a program
//! with only restarting handlers (or none) keeps X-IO's own waits.

use std::ffi::c_int;
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use xio_core::net::XioStream;

use crate::ready::{self, ERR, HUP, IN};
use crate::{bell, real, with_stream, Kind, Sock};

/// Signals (bit `n - 1` for signal `n`) whose handler does not restart
/// calls.
static NORESTART: AtomicU64 = AtomicU64::new(0);

/// Whether a blocking call is to be interruptible (see the module's docs).
pub(crate) fn enabled() -> bool {
    NORESTART.load(Ordering::Relaxed) != 0
}

fn note(sig: c_int, handler: libc::sighandler_t, flags: c_int) {
    if !(1..=64).contains(&sig) {
        return;
    }
    let bit = 1u64 << (sig - 1);
    if handler != libc::SIG_DFL && handler != libc::SIG_IGN && flags & libc::SA_RESTART == 0 {
        NORESTART.fetch_or(bit, Ordering::Relaxed);
    } else {
        NORESTART.fetch_and(!bit, Ordering::Relaxed);
    }
}

/// `sigaction(2)`: noted (see the module's docs), then libc's.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn sigaction(
    sig: c_int,
    act: *const libc::sigaction,
    old: *mut libc::sigaction,
) -> c_int {
    // SAFETY: passed on.
    let r = unsafe { real::sigaction(sig, act, old) };
    if r == 0 && !act.is_null() {
        // SAFETY: the caller's sigaction, read by libc just now.
        let a = unsafe { &*act };
        note(sig, a.sa_sigaction, a.sa_flags);
    }
    r
}

/// `signal(2)`: glibc's installs a handler that restarts calls.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: passed on.
    let r = unsafe { real::signal(sig, handler) };
    if r != libc::SIG_ERR {
        note(sig, handler, libc::SA_RESTART);
    }
    r
}

/// Runs `f` on `sock`'s stream non-blocking until it would not block,
/// waiting in between for the stream to be readable (or, `write`,
/// writable), until the stream's timeout (`EAGAIN`) or a signal
/// (`EINTR`).
pub(crate) fn blocking<R>(
    sock: &Sock,
    write: bool,
    mut f: impl FnMut(&XioStream) -> io::Result<R>,
) -> io::Result<R> {
    let timeout = with_stream(sock, |s| {
        if write {
            s.write_timeout()
        } else {
            s.read_timeout()
        }
    })?;
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        match crate::once(sock, true, &mut f) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if write {
                    sock.bits.writable.store(false, Ordering::Relaxed);
                }
                wait(sock, write, deadline)?;
            }
            r => return r,
        }
    }
}

/// Waits for `sock` to be readable (`write`: writable): a spin on the
/// rings for the net's adaptive budget, then sleeps in `ppoll`.
fn wait(sock: &Sock, write: bool, deadline: Option<Instant>) -> io::Result<()> {
    let Kind::Stream { s, .. } = &sock.kind else {
        return Ok(());
    };
    let net = s.net().clone();
    let ready = || {
        if write {
            sock.bits.writable.load(Ordering::Relaxed)
        } else {
            ready::readiness(sock) & (IN | ERR | HUP) != 0
        }
    };
    let mut w = net.watch_begin();
    let budget = net.spin_budget();
    let start = Instant::now();
    let mut hit = false;
    while start.elapsed() < budget {
        if w.has_input() {
            hit = true;
            break;
        }
        std::hint::spin_loop();
    }
    net.watch_end(w, hit, start.elapsed());
    let pfd = ready::poll_fd(&net).ok_or_else(|| io::Error::other("no poll fd"))?;
    let asleep = bell::Asleep::new();
    loop {
        ready::pump();
        if ready() {
            return Ok(());
        }
        let t = match deadline {
            None => None,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::ErrorKind::WouldBlock.into());
                }
                Some(libc::timespec {
                    tv_sec: left.as_secs() as libc::time_t,
                    tv_nsec: left.subsec_nanos() as libc::c_long,
                })
            }
        };
        let mut fds: Vec<libc::pollfd> = std::iter::once(pfd)
            .chain(asleep.as_ref().map(bell::Asleep::fd))
            .map(|fd| libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` holds `fds.len()` entries.
        let r = unsafe {
            real::ppoll(
                fds.as_mut_ptr(),
                fds.len() as libc::nfds_t,
                t.as_ref().map_or(std::ptr::null(), |t| t as *const _),
                std::ptr::null(),
            )
        };
        if let (Some(a), Some(b)) = (&asleep, fds.get(1)) {
            a.drain(r > 0 && b.revents != 0);
        }
        if r < 0 {
            // EINTR among them: a signal's handler ran.
            return Err(io::Error::last_os_error());
        }
    }
}

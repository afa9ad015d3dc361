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
//! interrupts: the call then ends with `EINTR` if a handler without
//! `SA_RESTART` ran (the trampoline below counts them), and goes on
//! otherwise. A socket with a timeout waits here while any handler is
//! installed, and any handler ends its call: Linux never restarts a
//! timed socket call. Otherwise a program with only restarting handlers
//! (or none) keeps X-IO's own waits.
//!
//! The program's handlers are installed behind a trampoline that counts
//! each run: `epoll_wait`, `poll` and these waits return `EINTR` when the
//! count moved during the call, as the kernel's would, even if the
//! signal came while the library was spinning or looking rather than
//! asleep in a syscall (nginx's SIGTERM handler sets a flag its loop reads
//! when `epoll_wait` returns; missed, nginx stopped only at its next
//! timer).

use std::ffi::c_int;
use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::Instant;

use xio_core::net::XioStream;

use crate::ready::{self, ERR, HUP, IN};
use crate::{bell, real, with_stream, Kind, Sock};

/// Signals (bit `n - 1` for signal `n`) whose handler does not restart
/// calls.
static NORESTART: AtomicU64 = AtomicU64::new(0);

/// Signals with a handler of the program's, restarting or not.
static HANDLED: AtomicU64 = AtomicU64::new(0);

/// Whether a blocking call is to be interruptible (see the module's docs).
pub(crate) fn enabled() -> bool {
    NORESTART.load(Ordering::Relaxed) != 0
}

/// Whether a blocking call on a socket is to be interruptible: always
/// while a handler without `SA_RESTART` is installed, and while any
/// handler is if the socket has a timeout (`timed`): Linux does not
/// restart a socket call with `SO_RCVTIMEO` or `SO_SNDTIMEO` set
/// (signal(7)).
pub(crate) fn wanted(timed: bool) -> bool {
    enabled() || (timed && HANDLED.load(Ordering::Relaxed) != 0)
}

/// Whether a handler is installed at all (a timed call may then be
/// interruptible, see [`wanted`]).
pub(crate) fn any_handler() -> bool {
    HANDLED.load(Ordering::Relaxed) != 0
}

/// The handler counts at a blocking call's start.
#[derive(Clone, Copy)]
pub(crate) struct Since {
    delivered: u64,
    interrupting: u64,
    timed: bool,
}

impl Since {
    /// Counts from now, for a call on a socket with a timeout if `timed`.
    pub(crate) fn now(timed: bool) -> Since {
        Since {
            delivered: delivered(),
            interrupting: interrupting(),
            timed,
        }
    }

    /// Whether a handler that ends the call has run on this thread since:
    /// any handler for a timed call, else one without `SA_RESTART`.
    pub(crate) fn interrupted(&self) -> bool {
        if self.timed {
            delivered() != self.delivered
        } else {
            interrupting() != self.interrupting
        }
    }
}

thread_local! {
    /// How many times a program's handler has run on this thread
    /// (through [`trampoline`]). Constant-initialised, no destructor: a
    /// handler touches the thread's TLS block only (the library, loaded
    /// at start, has static TLS). Atomic so that a loop's reads are not
    /// folded into one: the handler changes it between them.
    static DELIVERED: AtomicU64 = const { AtomicU64::new(0) };
    /// Of those, the runs of handlers without `SA_RESTART`: what ends a
    /// blocking socket call (the kernel restarts it for the others).
    static INTERRUPTING: AtomicU64 = const { AtomicU64::new(0) };
}

/// The count of handlers run on this thread so far: a wait that sees it
/// change returns `EINTR`, as a kernel wait interrupted by the handler
/// would (a signal that comes while the library spins or looks, outside
/// any syscall, would otherwise go unnoticed until the next event:
/// nginx's SIGTERM waited for its keep-alive timer, 75 s). Per thread,
/// as the kernel interrupts only the thread the handler ran on.
pub(crate) fn delivered() -> u64 {
    DELIVERED.with(|d| d.load(Ordering::Relaxed))
}

/// The count of runs on this thread of handlers without `SA_RESTART`.
fn interrupting() -> u64 {
    INTERRUPTING.with(|d| d.load(Ordering::Relaxed))
}

/// The program's handlers, by signal number, and whether each takes
/// `SA_SIGINFO`'s three arguments.
static HANDLERS: [AtomicUsize; 65] = [const { AtomicUsize::new(0) }; 65];
static SIGINFO: [AtomicBool; 65] = [const { AtomicBool::new(false) }; 65];

/// The handler installed for every program handler: counts, then runs
/// the program's. Async-signal-safe: atomics and the call only.
extern "C" fn trampoline(sig: c_int, info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    DELIVERED.with(|d| d.fetch_add(1, Ordering::Relaxed));
    let Some(i) = usize::try_from(sig).ok().filter(|&i| i < 65) else {
        return;
    };
    if (1..=64).contains(&i) && NORESTART.load(Ordering::Relaxed) & (1u64 << (i - 1)) != 0 {
        INTERRUPTING.with(|d| d.fetch_add(1, Ordering::Relaxed));
    }
    let h = HANDLERS[i].load(Ordering::Acquire);
    if h == 0 || h == libc::SIG_DFL || h == libc::SIG_IGN {
        return;
    }
    if SIGINFO[i].load(Ordering::Acquire) {
        // SAFETY: the program installed `h` with SA_SIGINFO: a
        // three-argument handler.
        let f: extern "C" fn(c_int, *mut libc::siginfo_t, *mut libc::c_void) =
            unsafe { std::mem::transmute(h) };
        f(sig, info, ctx);
    } else {
        // SAFETY: the program installed `h` without SA_SIGINFO: a
        // one-argument handler.
        let f: extern "C" fn(c_int) = unsafe { std::mem::transmute(h) };
        f(sig);
    }
}

fn note(sig: c_int, handler: libc::sighandler_t, flags: c_int) {
    if !(1..=64).contains(&sig) {
        return;
    }
    let bit = 1u64 << (sig - 1);
    let handled = handler != libc::SIG_DFL && handler != libc::SIG_IGN;
    if handled {
        HANDLED.fetch_or(bit, Ordering::Relaxed);
    } else {
        HANDLED.fetch_and(!bit, Ordering::Relaxed);
    }
    if handled && flags & libc::SA_RESTART == 0 {
        NORESTART.fetch_or(bit, Ordering::Relaxed);
    } else {
        NORESTART.fetch_and(!bit, Ordering::Relaxed);
    }
}

/// Puts the program's own handler back where `old` names the trampoline.
fn unwrap_old(sig: c_int, old: *mut libc::sigaction, prev: (usize, bool)) {
    if old.is_null() {
        return;
    }
    // SAFETY: libc just wrote `*old`.
    let o = unsafe { &mut *old };
    if o.sa_sigaction == trampoline as *const () as usize && (1..=64).contains(&sig) {
        o.sa_sigaction = prev.0;
        if !prev.1 {
            o.sa_flags &= !libc::SA_SIGINFO;
        }
    }
}

/// `sigaction(2)`: a program's handler is installed behind
/// [`trampoline`] (and noted, see the module's docs); `old` shows the
/// program's own.
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
    let i = usize::try_from(sig).ok().filter(|&i| (1..65).contains(&i));
    let prev = i.map_or((0, false), |i| {
        (
            HANDLERS[i].load(Ordering::Acquire),
            SIGINFO[i].load(Ordering::Acquire),
        )
    });
    if act.is_null() || i.is_none() {
        // SAFETY: passed on.
        let r = unsafe { real::sigaction(sig, act, old) };
        if r == 0 {
            unwrap_old(sig, old, prev);
        }
        return r;
    }
    let i = i.expect("checked");
    // SAFETY: the caller's sigaction.
    let mut a = unsafe { std::ptr::read(act) };
    let h = a.sa_sigaction;
    // (The trampoline itself, handed back by a path the library does not
    // see, is not wrapped again: it would call itself.)
    let wrapped = h != libc::SIG_DFL && h != libc::SIG_IGN && h != trampoline as *const () as usize;
    if wrapped {
        HANDLERS[i].store(h, Ordering::Release);
        SIGINFO[i].store(a.sa_flags & libc::SA_SIGINFO != 0, Ordering::Release);
        a.sa_sigaction = trampoline as *const () as usize;
        a.sa_flags |= libc::SA_SIGINFO;
    }
    // SAFETY: passed on, with the trampoline in the program's handler's
    // place.
    let r = unsafe { real::sigaction(sig, &a, old) };
    if r == 0 {
        note(sig, h, a.sa_flags);
        unwrap_old(sig, old, prev);
    } else if wrapped {
        HANDLERS[i].store(prev.0, Ordering::Release);
        SIGINFO[i].store(prev.1, Ordering::Release);
    }
    r
}

/// Signals [`siginterrupt`] made interrupting: glibc's `signal` installs
/// their handlers without `SA_RESTART` (its own hidden set, which the
/// library's `signal` replaces).
static SIGINTR: AtomicU64 = AtomicU64::new(0);

/// Installs `handler` for `sig` with `flags`, through [`sigaction`] (so
/// behind the trampoline and noted), the signal itself masked in its
/// handler if `mask_self`; the previous handler, or `SIG_ERR`.
fn install(
    sig: c_int,
    handler: libc::sighandler_t,
    flags: c_int,
    mask_self: bool,
) -> libc::sighandler_t {
    if handler == libc::SIG_ERR || !(1..65).contains(&sig) {
        crate::set_errno(libc::EINVAL);
        return libc::SIG_ERR;
    }
    // SAFETY: zeroed sigactions are valid; the mask is filled below.
    let (mut a, mut old): (libc::sigaction, libc::sigaction) =
        unsafe { (std::mem::zeroed(), std::mem::zeroed()) };
    a.sa_sigaction = handler;
    a.sa_flags = flags;
    // SAFETY: `a.sa_mask` is ours to fill; `sig` is a valid number.
    unsafe {
        libc::sigemptyset(&mut a.sa_mask);
        if mask_self {
            libc::sigaddset(&mut a.sa_mask, sig);
        }
    }
    // SAFETY: valid sigactions.
    if unsafe { sigaction(sig, &a, &mut old) } != 0 {
        return libc::SIG_ERR;
    }
    old.sa_sigaction
}

/// `signal(2)`, as glibc's (BSD semantics): a handler that restarts
/// calls unless [`siginterrupt`] said otherwise for `sig`, with `sig`
/// masked while it runs, through [`sigaction`] (glibc's own `signal`
/// would install it behind the library's back).
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    let interrupting =
        (1..65).contains(&sig) && SIGINTR.load(Ordering::Relaxed) & (1u64 << (sig - 1)) != 0;
    let flags = if interrupting { 0 } else { libc::SA_RESTART };
    install(sig, handler, flags, true)
}

/// `bsd_signal(3)`: glibc's `signal` under another name.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn bsd_signal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the same contract.
    unsafe { signal(sig, handler) }
}

/// `ssignal(3)`: glibc's `signal` under another name.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn ssignal(sig: c_int, handler: libc::sighandler_t) -> libc::sighandler_t {
    // SAFETY: the same contract.
    unsafe { signal(sig, handler) }
}

/// `sysv_signal(3)`, and `__sysv_signal`, which a program compiled for
/// strict ISO C calls for `signal`: System V semantics, a handler run
/// once (then the default action), not masked while it runs, and calls
/// interrupted.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn sysv_signal(
    sig: c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    install(sig, handler, libc::SA_RESETHAND | libc::SA_NODEFER, false)
}

/// See [`sysv_signal`].
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn __sysv_signal(
    sig: c_int,
    handler: libc::sighandler_t,
) -> libc::sighandler_t {
    // SAFETY: the same contract.
    unsafe { sysv_signal(sig, handler) }
}

/// `siginterrupt(3)`: whether `sig`'s handler interrupts calls (`flag`
/// non-zero: no `SA_RESTART`), now and for handlers [`signal`] installs
/// later, through [`sigaction`] (glibc's own reads and writes the action
/// behind the library's back, and the library would go on treating the
/// handler as before).
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn siginterrupt(sig: c_int, flag: c_int) -> c_int {
    if !(1..65).contains(&sig) {
        crate::set_errno(libc::EINVAL);
        return -1;
    }
    let bit = 1u64 << (sig - 1);
    if flag != 0 {
        SIGINTR.fetch_or(bit, Ordering::Relaxed);
    } else {
        SIGINTR.fetch_and(!bit, Ordering::Relaxed);
    }
    // SAFETY: a zeroed sigaction is valid storage for the call to fill.
    let mut a: libc::sigaction = unsafe { std::mem::zeroed() };
    // SAFETY: valid sigactions (the current one read, then set back
    // changed).
    unsafe {
        if sigaction(sig, std::ptr::null(), &mut a) != 0 {
            return -1;
        }
        if flag != 0 {
            a.sa_flags &= !libc::SA_RESTART;
        } else {
            a.sa_flags |= libc::SA_RESTART;
        }
        sigaction(sig, &a, std::ptr::null_mut())
    }
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
    let since = Since::now(deadline.is_some());
    loop {
        match crate::once(sock, true, &mut f) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                if write {
                    sock.bits.writable.store(false, Ordering::Relaxed);
                }
                wait(sock, write, deadline, &since)?;
            }
            r => return r,
        }
    }
}

/// Waits for `sock` to be readable (`write`: writable): a spin on the
/// rings for the net's adaptive budget, then sleeps in `ppoll`; `EINTR`
/// once a handler that ends the call ran since `since` (the call's start).
fn wait(sock: &Sock, write: bool, deadline: Option<Instant>, since: &Since) -> io::Result<()> {
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
        if since.interrupted() {
            return Err(io::ErrorKind::Interrupted.into());
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
        // Taken before the drain, whose lock may set errno.
        let err = io::Error::last_os_error();
        if r > 0 && fds[0].revents != 0 {
            ready::note_rung();
        }
        if let (Some(a), Some(b)) = (&asleep, fds.get(1)) {
            a.drain(r > 0 && b.revents != 0);
        }
        if r < 0 && err.kind() != io::ErrorKind::Interrupted {
            return Err(err);
        }
        // EINTR: a handler ran; one without SA_RESTART (any, on a socket
        // with a timeout) ends the call (the counts are looked at above),
        // the others restart it, as the kernel does.
    }
}

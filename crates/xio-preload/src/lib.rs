//! `libxio_preload.so`: run an unmodified program with
//! `LD_PRELOAD=libxio_preload.so` and its local TCP goes over X-IO.
//!
//! The library defines the socket calls a program makes (`connect`,
//! `listen`, `accept`, `read`, `send` and the rest); each looks up its fd
//! in a table of *moved* sockets and hands every other fd to libc's own
//! function (found with `dlsym(RTLD_NEXT)`), so kernel sockets, files and
//! pipes go exactly where they went.
//!
//! What moves (`XIO_PRELOAD`): `local` (the default) moves TCP streams
//! whose peer is a loopback address, `off` none, `list` those to the
//! `ip:port`s of `XIO_PRELOAD_ADDRS` (comma-separated). The pool is
//! `$XIO_PREFIX`'s, as for every X-IO program; without a manager every
//! socket stays with the kernel.
//!
//! - A listener listens on the kernel as the program asked, and on X-IO
//!   at the same address from its first `accept`: an X-IO client's
//!   connection comes over shared memory, a kernel client's over TCP.
//! - A `connect` goes to X-IO when an X-IO listener holds the address, to
//!   the kernel when none does (the manager says so), as xio-hyper's
//!   fallback.
//! - A moved stream stays a real fd of the same number: one end of a Unix
//!   socket pair put in its place (`dup3`), so fd tables, `close` of the
//!   wrong fd and `exec` behave; the data goes over X-IO.
//!
//! - `poll`, `ppoll` and `epoll` take moved and kernel fds in one set
//!   (see `mux`); a TCP socket registered in an epoll set before its
//!   `connect` moved it stays registered.
//! - `fork` hands moved streams to the kernel path behind a relay, so
//!   parent and child share them as kernel sockets; a child's listeners
//!   bind X-IO afresh (see `fork`).
//!
//! - `select` and `pselect` as `poll`; `sendmsg`, `recvmsg` and
//!   `sendfile` on moved streams (see `msg`); `ioctl(FIONREAD)`.
//!
//! - A blocking call is interrupted by a signal whose handler does not
//!   restart calls (`EINTR`, see `intr`).
//!
//! Not yet: `EPOLLEXCLUSIVE` as one wake-up (each set is woken).

use std::collections::HashMap;
use std::ffi::{c_int, c_void};
use std::io::{self, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};

use libc::{size_t, sockaddr, socklen_t, ssize_t};
use xio_core::net::{Net, XioListener, XioStream};

mod accept;
mod addr;
mod bell;
mod fork;
mod intr;
mod msg;
mod mux;
mod opts;
mod ready;
mod real;
mod vfork;

use addr::read_sockaddr;

// ---------------------------------------------------------------------------
// The table of moved sockets
// ---------------------------------------------------------------------------

/// A moved socket: one per open file description (every fd `dup`ed from
/// it shares it), so X-IO's stream closes when the last of them does.
struct Sock {
    kind: Kind,
    /// Serializes a call that flips the stream's blocking mode for one
    /// operation (`MSG_DONTWAIT`) with the others.
    io: Mutex<()>,
    /// Readiness kept between `poll`/`epoll` reports.
    bits: ready::Bits,
}

enum Kind {
    /// A stream over X-IO (its events carry `token`), and the far end of
    /// the socket pair whose near end holds its fd number.
    Stream {
        s: XioStream,
        token: u64,
        _far: OwnedFd,
        /// Once handed to the kernel path (see `fork.rs`): the near end of
        /// the pair its relay serves.
        handed: Mutex<Option<OwnedFd>>,
    },
    /// A kernel listener that also listens on X-IO from its first accept.
    Listener {
        addr: SocketAddr,
        /// `None` until the first accept or readiness registration; then
        /// X-IO's listener, or `Some(None)` if X-IO would not bind it
        /// (the address taken there: kernel only).
        xio: Mutex<Option<Option<XioListener>>>,
    },
}

/// Moved sockets by fd.
static TABLE: RwLock<Option<HashMap<RawFd, Arc<Sock>>>> = RwLock::new(None);
/// How many fds the table holds: while none, every call goes straight to
/// libc without a lock.
static MOVED: AtomicUsize = AtomicUsize::new(0);

/// Which fds the table maps (a bit each, for fds below 65,536; past
/// that the table is asked). Set and cleared under the table's write
/// lock. A call on a kernel fd reads its bit and goes to libc without a
/// lock: the write a signal handler makes to its wake-up pipe or socket
/// pair (Python's, asyncio's) cannot then meet the table's lock held by
/// the code it interrupted.
static MAPPED: [AtomicU64; 1024] = [const { AtomicU64::new(0) }; 1024];

/// `fd`'s word in [`MAPPED`] and its bit, if it has one.
fn mapped_bit(fd: RawFd) -> Option<(&'static AtomicU64, u64)> {
    let f = usize::try_from(fd).ok()?;
    Some((MAPPED.get(f / 64)?, 1u64 << (f % 64)))
}

/// Sets (`on`) or clears `fd`'s bit in [`MAPPED`] (with the table's write
/// lock held).
fn set_mapped(fd: RawFd, on: bool) {
    if let Some((w, bit)) = mapped_bit(fd) {
        if on {
            w.fetch_or(bit, Ordering::Release);
        } else {
            w.fetch_and(!bit, Ordering::Release);
        }
    }
}

/// Makes [`MAPPED`] say exactly `fds` (a forked child's table, rebuilt
/// with the table's write lock held).
fn remap(fds: impl Iterator<Item = RawFd>) {
    for w in &MAPPED {
        w.store(0, Ordering::Release);
    }
    for fd in fds {
        set_mapped(fd, true);
    }
}

fn lookup(fd: RawFd) -> Option<Arc<Sock>> {
    if fork::forking() {
        return None;
    }
    // A forked child's first use of a stream its parent kept on X-IO
    // hands it over (see `vfork.rs`); one load otherwise.
    vfork::take_over(fd);
    if MOVED.load(Ordering::Acquire) == 0 {
        return None;
    }
    if mapped_bit(fd).is_some_and(|(w, bit)| w.load(Ordering::Acquire) & bit == 0) {
        return None;
    }
    let t = TABLE.read().unwrap_or_else(|e| e.into_inner());
    t.as_ref()?.get(&fd).cloned()
}

/// Maps `fd` to `sock` (replacing what it mapped); the old one, if any, is
/// returned to be dropped outside the lock (dropping a stream sends its
/// FIN, which may call into libc).
fn insert(fd: RawFd, sock: Arc<Sock>) -> Option<Arc<Sock>> {
    if fork::forking() {
        return Some(sock);
    }
    let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
    let old = t.get_or_insert_with(HashMap::new).insert(fd, sock);
    if old.is_none() {
        MOVED.fetch_add(1, Ordering::Release);
        set_mapped(fd, true);
    }
    old
}

/// Under the table's lock: if `fd` maps to `sock`, puts a copy of `near`
/// in its place (its close-on-exec flag kept) and forgets it; the entry
/// is returned, to be dropped outside the lock. Nothing if `fd` is
/// another's by now (closed and reused meanwhile).
fn replace_mapped(fd: RawFd, sock: &Sock, near: RawFd) -> io::Result<Option<Arc<Sock>>> {
    let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
    let Some(m) = t.as_mut() else {
        return Ok(None);
    };
    if !m
        .get(&fd)
        .is_some_and(|x| std::ptr::eq(Arc::as_ptr(x), sock))
    {
        return Ok(None);
    }
    let (_, cloexec) = fd_flags(fd);
    let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: both open; `dup3` replaces the placeholder at `fd` with a
    // copy of `near`.
    if unsafe { real::dup3(near, fd, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    let old = m.remove(&fd);
    MOVED.fetch_sub(1, Ordering::Release);
    set_mapped(fd, false);
    Ok(old)
}

fn remove(fd: RawFd) -> Option<Arc<Sock>> {
    if MOVED.load(Ordering::Acquire) == 0 || fork::forking() {
        return None;
    }
    // A kernel fd (its bit clear) is not in the table: no lock (a close
    // in a signal handler must not wait for the code it interrupted).
    if mapped_bit(fd).is_some_and(|(w, bit)| w.load(Ordering::Acquire) & bit == 0) {
        return None;
    }
    let mut t = TABLE.write().unwrap_or_else(|e| e.into_inner());
    let old = t.as_mut()?.remove(&fd);
    if old.is_some() {
        MOVED.fetch_sub(1, Ordering::Release);
        set_mapped(fd, false);
    }
    old
}

// ---------------------------------------------------------------------------
// Scope
// ---------------------------------------------------------------------------

/// The `XIO_*` variables as the program started with them, read when the
/// library is loaded: some programs replace their environment before
/// they open a socket (nginx keeps only `TZ` unless told otherwise), and
/// the pool, the run dir and the scope must still be the ones the
/// operator set.
fn saved_env() -> &'static [(String, String)] {
    static SAVED: OnceLock<Vec<(String, String)>> = OnceLock::new();
    SAVED.get_or_init(|| {
        std::env::vars_os()
            .filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
            .filter(|(k, _)| k.starts_with("XIO_"))
            .collect()
    })
}

/// Runs when the library is loaded, before the program's `main`.
extern "C" fn at_load() {
    let _ = saved_env();
    // SAFETY: registers a handler that only stores to an atomic.
    unsafe { libc::pthread_atfork(None, None, Some(forked_child)) };
}

/// This process's id, cached (`getpid` is a system call, and each wait
/// asks whether its thread's bell and the net's poll fd are this
/// process's); forgotten in a forked child.
static PID: AtomicU32 = AtomicU32::new(0);

pub(crate) fn pid() -> u32 {
    match PID.load(Ordering::Relaxed) {
        0 => {
            let p = std::process::id();
            PID.store(p, Ordering::Relaxed);
            p
        }
        p => p,
    }
}

/// Runs in every child `fork` makes (the library's `fork` and `vfork`
/// call libc's).
extern "C" fn forked_child() {
    PID.store(0, Ordering::Relaxed);
}

#[used]
#[link_section = ".init_array"]
static AT_LOAD: extern "C" fn() = at_load;

/// A saved `XIO_*` variable (see [`saved_env`]).
fn saved(name: &str) -> Option<&'static str> {
    saved_env()
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

/// Puts the saved `XIO_*` variables back where the program dropped them,
/// before X-IO reads them (the pool's prefix, the run dir).
fn restore_env() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        for (k, v) in saved_env() {
            if std::env::var_os(k).is_none() {
                std::env::set_var(k, v);
            }
        }
    });
}

enum Scope {
    Off,
    Local,
    List(Vec<SocketAddr>),
}

fn scope() -> &'static Scope {
    static SCOPE: OnceLock<Scope> = OnceLock::new();
    SCOPE.get_or_init(|| match saved("XIO_PRELOAD") {
        Some("off") | Some("0") => Scope::Off,
        Some("list") => Scope::List(
            saved("XIO_PRELOAD_ADDRS")
                .unwrap_or_default()
                .split(',')
                .filter_map(|a| a.trim().parse().ok())
                .collect(),
        ),
        _ => Scope::Local,
    })
}

/// Whether a connection to `a` (or a listener on `a`) moves.
fn in_scope(a: &SocketAddr, listener: bool) -> bool {
    match scope() {
        Scope::Off => false,
        Scope::Local => a.ip().is_loopback() || (listener && a.ip().is_unspecified()),
        Scope::List(l) => l.iter().any(|x| {
            x.port() == a.port() && (x.ip() == a.ip() || (listener && a.ip().is_unspecified()))
        }),
    }
}

/// The process's net, if a manager is there.
fn net() -> Option<Net> {
    restore_env();
    Net::global().ok()
}

// ---------------------------------------------------------------------------
// errno
// ---------------------------------------------------------------------------

fn set_errno(e: c_int) {
    // SAFETY: `__errno_location` returns this thread's errno slot.
    unsafe { *libc::__errno_location() = e };
}

/// This thread's errno, as the last failed call left it.
fn errno() -> c_int {
    // SAFETY: `__errno_location` returns this thread's errno slot.
    unsafe { *libc::__errno_location() }
}

/// The errno a kernel socket gives for `e`.
fn errno_of(e: &io::Error) -> c_int {
    if let Some(n) = e.raw_os_error() {
        return n;
    }
    use io::ErrorKind as K;
    match e.kind() {
        K::WouldBlock => libc::EAGAIN,
        K::TimedOut => libc::EAGAIN, // SO_RCVTIMEO's expiry
        K::ConnectionRefused => libc::ECONNREFUSED,
        K::ConnectionReset => libc::ECONNRESET,
        K::ConnectionAborted => libc::ECONNABORTED,
        K::BrokenPipe => libc::EPIPE,
        K::NotConnected => libc::ENOTCONN,
        K::AddrInUse => libc::EADDRINUSE,
        K::AddrNotAvailable => libc::EADDRNOTAVAIL,
        K::InvalidInput => libc::EINVAL,
        K::Interrupted => libc::EINTR,
        K::PermissionDenied => libc::EACCES,
        K::Unsupported => libc::EOPNOTSUPP,
        _ => libc::EIO,
    }
}

/// -1 with errno set for `e`; an `EPIPE` raises `SIGPIPE` first, as a
/// kernel socket's write does, unless `nosignal`.
fn fail(e: &io::Error, nosignal: bool) -> c_int {
    let n = errno_of(e);
    if n == libc::EPIPE && !nosignal {
        // SAFETY: raising a signal at this thread; its handler (or the
        // default action) is the program's, as for a kernel socket.
        unsafe { libc::raise(libc::SIGPIPE) };
    }
    set_errno(n);
    -1
}

fn ret_len(r: io::Result<usize>, nosignal: bool) -> ssize_t {
    match r {
        Ok(n) => n as ssize_t,
        Err(e) => fail(&e, nosignal) as ssize_t,
    }
}

// ---------------------------------------------------------------------------
// Moving a socket
// ---------------------------------------------------------------------------

/// Whether `fd` is a kernel TCP socket (AF_INET or AF_INET6, stream).
fn is_tcp(fd: RawFd) -> bool {
    let opt = |name| int_opt(fd, libc::SOL_SOCKET, name);
    opt(libc::SO_TYPE) == Some(libc::SOCK_STREAM)
        && matches!(opt(libc::SO_DOMAIN), Some(libc::AF_INET | libc::AF_INET6))
}

/// Kernel socket `fd`'s integer option, if it has one.
fn int_opt(fd: RawFd, level: c_int, name: c_int) -> Option<c_int> {
    let mut v: c_int = 0;
    let mut len = size_of::<c_int>() as socklen_t;
    // SAFETY: `v` and `len` are valid for the call's writes.
    let r = unsafe { real::getsockopt(fd, level, name, (&raw mut v).cast(), &mut len) };
    (r == 0).then_some(v)
}

/// `fd`'s file status flags (`O_NONBLOCK`), and whether it is close-on-exec.
fn fd_flags(fd: RawFd) -> (c_int, bool) {
    // SAFETY: plain fcntl queries.
    let fl = unsafe { real::fcntl(fd, libc::F_GETFL, 0) };
    // SAFETY: as above.
    let fdfl = unsafe { real::fcntl(fd, libc::F_GETFD, 0) };
    (fl.max(0), fdfl > 0 && fdfl & libc::FD_CLOEXEC != 0)
}

/// A Unix socket pair: its near end, to hold a moved stream's fd number,
/// and its far end, kept by the library.
fn socket_pair(cloexec: bool, nonblock: bool) -> io::Result<(OwnedFd, OwnedFd)> {
    let (near, far) = unix_pair(cloexec, nonblock)?;
    // The far end is shut down: a call this library does not define
    // (`splice`, stdio's own writes) reaches the near end, the pair's
    // socket, and must fail visibly (EPIPE, end of stream) rather than
    // write into a socket nobody reads or wait for ever.
    // SAFETY: `far` is open and ours.
    unsafe { real::shutdown(far.as_raw_fd(), libc::SHUT_RDWR) };
    Ok((near, far))
}

/// A Unix stream socket pair; the far end (the library's) is always
/// close-on-exec: a child program gets the near end, never the library's.
fn unix_pair(cloexec: bool, nonblock: bool) -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0 as c_int; 2];
    let mut ty = libc::SOCK_STREAM;
    if cloexec {
        ty |= libc::SOCK_CLOEXEC;
    }
    if nonblock {
        ty |= libc::SOCK_NONBLOCK;
    }
    // SAFETY: `fds` has room for the two fds.
    if unsafe { libc::socketpair(libc::AF_UNIX, ty, 0, fds.as_mut_ptr()) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fds[1]` was just made and is ours.
    unsafe { real::fcntl(fds[1], libc::F_SETFD, libc::FD_CLOEXEC as usize) };
    // SAFETY: both fds were just made by `socketpair` and are owned here.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// A moved stream's shared object, registered for the net's events.
fn new_stream(s: XioStream, far: OwnedFd) -> Arc<Sock> {
    let token = ready::new_token();
    let sock = Arc::new(Sock {
        kind: Kind::Stream {
            s,
            token,
            _far: far,
            handed: Mutex::new(None),
        },
        io: Mutex::new(()),
        bits: ready::Bits::default(),
    });
    sock.bits.writable.store(true, Ordering::Relaxed);
    // Registered before its events carry the token: one that came in
    // between would find no socket and be lost (an edge, for EPOLLET).
    ready::register(&sock);
    with_stream(&sock, |s| s.set_token(token));
    sock
}

/// Puts stream `s` in place of kernel socket `fd` (same number, same
/// close-on-exec), closing the kernel socket.
fn install_over(fd: RawFd, s: XioStream) -> io::Result<()> {
    let (fl, cloexec) = fd_flags(fd);
    let (near, far) = socket_pair(false, false)?;
    let flags = if cloexec { libc::O_CLOEXEC } else { 0 };
    // SAFETY: both fds are open; `dup3` atomically replaces `fd` (closing
    // the kernel socket that was there) with a copy of `near`.
    if unsafe { real::dup3(near.as_raw_fd(), fd, flags) } < 0 {
        return Err(io::Error::last_os_error());
    }
    if fl & libc::O_NONBLOCK != 0 {
        s.set_nonblocking(true)?;
        // SAFETY: `fd` is the pair's near end now.
        unsafe { real::fcntl(fd, libc::F_SETFL, (fl | libc::O_NONBLOCK) as usize) };
    }
    let old = insert(fd, new_stream(s, far));
    drop(old);
    Ok(())
}

/// A new fd for accepted stream `s` (`flags`: accept4's).
fn install_new(s: XioStream, flags: c_int) -> io::Result<RawFd> {
    let nonblock = flags & libc::SOCK_NONBLOCK != 0;
    let (near, far) = socket_pair(flags & libc::SOCK_CLOEXEC != 0, nonblock)?;
    if nonblock {
        s.set_nonblocking(true)?;
    }
    let fd = std::os::fd::IntoRawFd::into_raw_fd(near);
    let old = insert(fd, new_stream(s, far));
    drop(old);
    Ok(fd)
}

// ---------------------------------------------------------------------------
// connect, listen, accept
// ---------------------------------------------------------------------------

/// `socket(2)`: a TCP socket is noted fresh (see `mux::set_fresh`) until
/// it connects or listens.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn socket(domain: c_int, ty: c_int, proto: c_int) -> c_int {
    // SAFETY: passed on.
    let fd = unsafe { real::socket(domain, ty, proto) };
    if fd >= 0 {
        let tcp = matches!(domain, libc::AF_INET | libc::AF_INET6)
            && ty & 0xf == libc::SOCK_STREAM
            && matches!(scope(), Scope::Local | Scope::List(_));
        mux::set_fresh(fd, tcp);
    }
    fd
}

/// What a connect over X-IO came to.
enum Dialled {
    Moved,
    /// No X-IO listener holds the address (or no manager): the kernel's.
    Kernel,
    Failed(io::Error),
}

fn dial(fd: RawFd, to: SocketAddr) -> Dialled {
    let Some(net) = net() else {
        return Dialled::Kernel;
    };
    // A connect to one of this process's own listeners: the net connects
    // the two itself once the listener's X-IO side is bound (it is bound
    // lazily, and this process is inside X-IO now).
    if let Some(own) = ready::own_listener(to) {
        if let Kind::Listener { addr, xio } = &own.kind {
            let _ = accept::xio_listener(xio, *addr);
        }
    }
    let mut r = net.connect(to);
    // A route this process learnt before may be stale (the service
    // restarted elsewhere): the refusal made the net forget it, and a
    // second connect asks the manager (as xio-hyper's connector does).
    if matches!(&r, Err(e) if e.kind() == io::ErrorKind::ConnectionRefused && !nobody_binds(e)) {
        r = net.connect(to);
    }
    match r {
        Ok(s) => match install_over(fd, s) {
            Ok(()) => Dialled::Moved,
            Err(e) => Dialled::Failed(e),
        },
        Err(e) if nobody_binds(&e) => Dialled::Kernel,
        Err(e) => Dialled::Failed(e),
    }
}

/// Whether the manager refused a connect because no X-IO service binds
/// the address (then the kernel may have a listener there).
fn nobody_binds(e: &io::Error) -> bool {
    matches!(
        e.get_ref()
            .and_then(|i| i.downcast_ref::<xio_core::Error>()),
        Some(xio_core::Error::Refused {
            code: xio_core::ErrorCode::ConnectionRefused,
            ..
        })
    )
}

/// A connect to the unspecified address reaches this host's loopback, as
/// Linux's TCP has it.
fn unspecified_is_loopback(a: SocketAddr) -> SocketAddr {
    match a.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, a.port()))
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, a.port()))
        }
        _ => a,
    }
}

/// `connect(2)`.
///
/// # Safety
///
/// As libc's: `addr` points to `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's contract.
    let to = unsafe { read_sockaddr(addr, len) };
    if let Some(to) = to.map(unspecified_is_loopback) {
        // A non-blocking connect too completes here (a connect to a
        // local X-IO listener is a round trip over shared memory): it
        // returns 0, which a non-blocking connect may.
        if in_scope(&to, false) && lookup(fd).is_none() && is_tcp(fd) {
            match dial(fd, to) {
                Dialled::Moved => {
                    mux::moved_by_connect(fd);
                    return 0;
                }
                Dialled::Kernel => {}
                Dialled::Failed(e) => return fail(&e, true),
            }
        }
    }
    mux::end_fresh(fd);
    // SAFETY: the caller's contract, passed on.
    unsafe { real::connect(fd, addr, len) }
}

/// `listen(2)`: the kernel's, then noted for X-IO.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn listen(fd: c_int, backlog: c_int) -> c_int {
    mux::end_fresh(fd);
    // SAFETY: passed on.
    let r = unsafe { real::listen(fd, backlog) };
    if r == 0 && lookup(fd).is_none() && is_tcp(fd) {
        if let Some(a) = local_addr_of(fd).filter(|a| in_scope(a, true)) {
            let sock = new_listener(a);
            ready::register(&sock);
            let old = insert(fd, sock);
            drop(old);
        }
    }
    r
}

/// A listener's entry, its X-IO side not bound yet.
fn new_listener(addr: SocketAddr) -> Arc<Sock> {
    Arc::new(Sock {
        kind: Kind::Listener {
            addr,
            xio: Mutex::new(None),
        },
        io: Mutex::new(()),
        bits: ready::Bits::default(),
    })
}

fn local_addr_of(fd: RawFd) -> Option<SocketAddr> {
    // SAFETY: all-zero is a valid `sockaddr_storage`.
    let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let mut len = size_of::<libc::sockaddr_storage>() as socklen_t;
    // SAFETY: `st` has `len` bytes of room.
    let r = unsafe { libc::getsockname(fd, (&raw mut st).cast(), &mut len) };
    if r != 0 {
        return None;
    }
    // SAFETY: the kernel wrote `len` bytes of an address into `st`.
    unsafe { read_sockaddr((&raw const st).cast(), len) }
}

// ---------------------------------------------------------------------------
// Data
// ---------------------------------------------------------------------------

/// X-IO's address for a connecting stream (`127.88.<stack>:<port>`, see
/// xio-core's `client_addr`) as a kernel loopback connection shows it:
/// the other end's loopback address with the same port. Programs check a
/// peer for `127.0.0.1` (redis's protected mode does).
fn kernel_like(a: SocketAddr, other: Option<SocketAddr>) -> SocketAddr {
    let v4 = match a.ip() {
        std::net::IpAddr::V4(v4) => v4,
        std::net::IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => v4,
            None => return a,
        },
    };
    let [a0, a1, ..] = v4.octets();
    match other {
        Some(o) if a0 == 127 && (88..=104).contains(&a1) && o.ip().is_loopback() => {
            SocketAddr::new(o.ip(), a.port())
        }
        _ => a,
    }
}

/// A moved stream's peer address, as the kernel would give it.
fn peer_of(s: &XioStream) -> io::Result<SocketAddr> {
    Ok(kernel_like(s.peer_addr()?, s.local_addr().ok()))
}

/// A moved stream's own address, as the kernel would give it.
fn local_of(s: &XioStream) -> io::Result<SocketAddr> {
    Ok(kernel_like(s.local_addr()?, s.peer_addr().ok()))
}

/// The stream of `fd`, if it is a moved one.
fn stream_of(fd: RawFd) -> Option<Arc<Sock>> {
    lookup(fd).filter(|s| matches!(s.kind, Kind::Stream { .. }))
}

fn with_stream<R>(sock: &Sock, f: impl FnOnce(&XioStream) -> R) -> R {
    match &sock.kind {
        Kind::Stream { s, .. } => f(s),
        Kind::Listener { .. } => unreachable!("filtered by stream_of"),
    }
}

/// Runs `f` on the stream as a call with `dontwait` (`MSG_DONTWAIT`)
/// would: non-blocking if so or if the stream is; else blocking, and
/// interruptible by a signal while the program has a handler that does
/// not restart calls, or any handler if the stream has a timeout (see
/// `intr`). `write`: `f` writes.
fn op<R>(
    sock: &Sock,
    dontwait: bool,
    write: bool,
    f: impl FnMut(&XioStream) -> io::Result<R>,
) -> io::Result<R> {
    if !dontwait && intr::enabled() {
        if !with_stream(sock, XioStream::is_nonblocking) {
            return intr::blocking(sock, write, f);
        }
    } else if !dontwait && intr::any_handler() {
        let (nonblocking, timed) = with_stream(sock, |s| {
            let t = if write {
                s.write_timeout()
            } else {
                s.read_timeout()
            };
            (s.is_nonblocking(), matches!(t, Ok(Some(_))))
        });
        if !nonblocking && intr::wanted(timed) {
            return intr::blocking(sock, write, f);
        }
    }
    once(sock, dontwait, f)
}

/// Runs `f` on the stream non-blocking if `dontwait` (`MSG_DONTWAIT`).
fn once<R>(
    sock: &Sock,
    dontwait: bool,
    f: impl FnOnce(&XioStream) -> io::Result<R>,
) -> io::Result<R> {
    with_stream(sock, |s| {
        if !dontwait || s.is_nonblocking() {
            return f(s);
        }
        let _g = sock.io.lock().unwrap_or_else(|e| e.into_inner());
        s.set_nonblocking(true)?;
        let r = f(s);
        s.set_nonblocking(false)?;
        r
    })
}

fn recv_into(sock: &Sock, buf: *mut c_void, n: size_t, flags: c_int) -> io::Result<usize> {
    let dontwait = flags & libc::MSG_DONTWAIT != 0;
    if n == 0 {
        // As Linux's TCP: an empty read waits for data (a non-blocking
        // one says EAGAIN), until its timeout, and then reads nothing.
        let blocking = !dontwait && !with_stream(sock, XioStream::is_nonblocking);
        return match op(sock, dontwait, false, |s| s.peek(&mut [0u8; 1])) {
            Err(e) if blocking && e.kind() == io::ErrorKind::WouldBlock => Ok(0),
            r => r.map(|_| 0),
        };
    }
    if buf.is_null() || n > isize::MAX as usize {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    if flags & libc::MSG_PEEK != 0 {
        // SAFETY: the caller gave `n` writable bytes at `buf` (not null,
        // checked); peek's buffer is initialised first.
        let out = unsafe {
            std::ptr::write_bytes(buf.cast::<u8>(), 0, n);
            std::slice::from_raw_parts_mut(buf.cast::<u8>(), n)
        };
        return op(sock, dontwait, false, |s| s.peek(out));
    }
    // SAFETY: the caller gave `n` writable bytes at `buf` (not null,
    // checked), which may be uninitialised: `read_uninit` only writes.
    let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<std::mem::MaybeUninit<u8>>(), n) };
    if flags & libc::MSG_WAITALL == 0 || dontwait {
        return op(sock, dontwait, false, |s| s.read_uninit(out));
    }
    // MSG_WAITALL: until the buffer is full, the stream ends or fails
    // (what was read before a failure is returned, as the kernel does).
    let mut got = 0;
    while got < n {
        match op(sock, false, false, |s| s.read_uninit(&mut out[got..])) {
            Ok(0) => break,
            Ok(k) => got += k,
            Err(e) if got == 0 => return Err(e),
            Err(_) => break,
        }
    }
    Ok(got)
}

fn send_from(sock: &Sock, buf: *const c_void, n: size_t, flags: c_int) -> io::Result<usize> {
    if n == 0 {
        // Fails as a write does once the stream cannot be written.
        return op(sock, flags & libc::MSG_DONTWAIT != 0, true, |mut s| {
            s.write(&[])
        });
    }
    if buf.is_null() || n > isize::MAX as usize {
        return Err(io::Error::from_raw_os_error(libc::EFAULT));
    }
    // SAFETY: the caller of the hook gave `n` readable bytes at `buf`.
    let data = unsafe { std::slice::from_raw_parts(buf.cast::<u8>(), n) };
    wrote(
        sock,
        op(sock, flags & libc::MSG_DONTWAIT != 0, true, |mut s| {
            s.write(data)
        }),
    )
}

/// A write's result, noted: one that met `EAGAIN` leaves the stream
/// unwritable until the net reports room.
fn wrote(sock: &Sock, r: io::Result<usize>) -> io::Result<usize> {
    if matches!(&r, Err(e) if e.kind() == io::ErrorKind::WouldBlock) {
        sock.bits.writable.store(false, Ordering::Relaxed);
    }
    r
}

/// `read(2)`.
///
/// # Safety
///
/// As libc's: `buf` has `n` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn read(fd: c_int, buf: *mut c_void, n: size_t) -> ssize_t {
    match stream_of(fd) {
        Some(s) => ret_len(recv_into(&s, buf, n, 0), true),
        // SAFETY: passed on.
        None => unsafe { real::read(fd, buf, n) },
    }
}

/// `__read_chk`, what `read` becomes under `_FORTIFY_SOURCE`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn __read_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    _buflen: size_t,
) -> ssize_t {
    // SAFETY: the same contract.
    unsafe { read(fd, buf, n) }
}

/// `recv(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn recv(fd: c_int, buf: *mut c_void, n: size_t, flags: c_int) -> ssize_t {
    match stream_of(fd) {
        Some(s) => ret_len(recv_into(&s, buf, n, flags), true),
        // SAFETY: passed on.
        None => unsafe { real::recv(fd, buf, n, flags) },
    }
}

/// `__recv_chk`, what `recv` becomes under `_FORTIFY_SOURCE`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn __recv_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    _buflen: size_t,
    flags: c_int,
) -> ssize_t {
    // SAFETY: the same contract.
    unsafe { recv(fd, buf, n, flags) }
}

/// `__recvfrom_chk`, what `recvfrom` becomes under `_FORTIFY_SOURCE`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn __recvfrom_chk(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    _buflen: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    // SAFETY: the same contract.
    unsafe { recvfrom(fd, buf, n, flags, addr, len) }
}

/// `recvfrom(2)`: on a moved stream no address is given back, as Linux's
/// TCP gives none (the length is set to 0).
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: size_t,
    flags: c_int,
    addr: *mut sockaddr,
    len: *mut socklen_t,
) -> ssize_t {
    match stream_of(fd) {
        Some(s) => {
            let r = recv_into(&s, buf, n, flags);
            if r.is_ok() && !addr.is_null() && !len.is_null() {
                // SAFETY: the caller's length.
                unsafe { *len = 0 };
            }
            ret_len(r, true)
        }
        // SAFETY: passed on.
        None => unsafe { real::recvfrom(fd, buf, n, flags, addr, len) },
    }
}

/// `write(2)`.
///
/// # Safety
///
/// As libc's: `buf` has `n` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn write(fd: c_int, buf: *const c_void, n: size_t) -> ssize_t {
    match stream_of(fd) {
        Some(s) => ret_len(send_from(&s, buf, n, 0), false),
        // SAFETY: passed on.
        None => unsafe { real::write(fd, buf, n) },
    }
}

/// `send(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn send(fd: c_int, buf: *const c_void, n: size_t, flags: c_int) -> ssize_t {
    match stream_of(fd) {
        Some(s) => ret_len(
            send_from(&s, buf, n, flags),
            flags & libc::MSG_NOSIGNAL != 0,
        ),
        // SAFETY: passed on.
        None => unsafe { real::send(fd, buf, n, flags) },
    }
}

/// `sendto(2)`: on a moved (connected) stream the address is ignored, as
/// TCP ignores it.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: size_t,
    flags: c_int,
    addr: *const sockaddr,
    len: socklen_t,
) -> ssize_t {
    match stream_of(fd) {
        Some(s) => ret_len(
            send_from(&s, buf, n, flags),
            flags & libc::MSG_NOSIGNAL != 0,
        ),
        // SAFETY: passed on.
        None => unsafe { real::sendto(fd, buf, n, flags, addr, len) },
    }
}

/// The `iovec`s at `iov` (`n` of them).
///
/// # Safety
///
/// `iov` points to `n` `iovec`s, each naming `iov_len` bytes.
unsafe fn iovecs<'a>(iov: *const libc::iovec, n: c_int) -> &'a [libc::iovec] {
    if iov.is_null() || n <= 0 {
        return &[];
    }
    // SAFETY: the caller's contract.
    unsafe { std::slice::from_raw_parts(iov, n as usize) }
}

/// `readv(2)`: on a moved stream, into the buffers in order, as much as
/// has arrived.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn readv(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    match stream_of(fd) {
        Some(s) => {
            // SAFETY: the caller's contract.
            let v = unsafe { iovecs(iov, n) };
            ret_len(read_iovecs(&s, v, 0), true)
        }
        // SAFETY: passed on.
        None => unsafe { real::readv(fd, iov, n) },
    }
}

/// Reads into `v` in order, as much as has arrived (waiting for the
/// first byte as a read does).
fn read_iovecs(sock: &Sock, v: &[libc::iovec], flags: c_int) -> io::Result<usize> {
    let full: Vec<&libc::iovec> = v.iter().filter(|b| b.iov_len > 0).collect();
    match full[..] {
        // No room at all: nothing read, at once (as Linux's readv).
        [] => Ok(0),
        [one] => recv_into(sock, one.iov_base, one.iov_len, flags),
        _ => {
            let mut slices: Vec<std::io::IoSliceMut<'_>> = full
                .iter()
                .map(|b| {
                    // SAFETY: each iovec names `iov_len` writable bytes
                    // (the caller's contract); `read_vectored` only writes.
                    let bytes = unsafe {
                        std::slice::from_raw_parts_mut(b.iov_base.cast::<u8>(), b.iov_len)
                    };
                    std::io::IoSliceMut::new(bytes)
                })
                .collect();
            op(sock, flags & libc::MSG_DONTWAIT != 0, false, |mut s| {
                std::io::Read::read_vectored(&mut s, &mut slices)
            })
        }
    }
}

/// `writev(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn writev(fd: c_int, iov: *const libc::iovec, n: c_int) -> ssize_t {
    match stream_of(fd) {
        Some(s) => {
            // SAFETY: the caller's contract.
            let v = unsafe { iovecs(iov, n) };
            let slices: Vec<std::io::IoSlice<'_>> = v
                .iter()
                .filter(|b| b.iov_len > 0)
                .map(|b| {
                    // SAFETY: each iovec names `iov_len` readable bytes
                    // (the caller's contract).
                    let bytes =
                        unsafe { std::slice::from_raw_parts(b.iov_base.cast::<u8>(), b.iov_len) };
                    std::io::IoSlice::new(bytes)
                })
                .collect();
            if slices.is_empty() {
                return 0;
            }
            let r = wrote(&s, op(&s, false, true, |mut st| st.write_vectored(&slices)));
            ret_len(r, false)
        }
        // SAFETY: passed on.
        None => unsafe { real::writev(fd, iov, n) },
    }
}

// ---------------------------------------------------------------------------
// Descriptors
// ---------------------------------------------------------------------------

/// `close(2)`: a moved socket's X-IO side closes with its last fd.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn close(fd: c_int) -> c_int {
    vfork::forget(fd, fd);
    if !fork::forking() {
        mux::end_fresh(fd);
    }
    let old = remove(fd);
    if (MOVED.load(Ordering::Relaxed) > 0 || old.is_some() || mux::any_sets()) && !fork::forking() {
        mux::forget(fd);
    }
    // SAFETY: passed on.
    let r = unsafe { real::close(fd) };
    drop(old);
    r
}

/// Forgets the moved sockets among fds `first..=last` (being closed
/// together), as `close` does one by one.
fn forget_range(first: u32, last: u32) {
    if fork::forking() {
        return;
    }
    vfork::forget(
        first.min(i32::MAX as u32) as RawFd,
        last.min(i32::MAX as u32) as RawFd,
    );
    if MOVED.load(Ordering::Acquire) == 0 {
        mux::forget_range(first, last);
        return;
    }
    let fds: Vec<RawFd> = {
        let t = TABLE.read().unwrap_or_else(|e| e.into_inner());
        t.iter()
            .flat_map(|m| m.keys().copied())
            .filter(|&fd| (first..=last).contains(&(fd as u32)))
            .collect()
    };
    let mut dropped = Vec::new();
    for fd in fds {
        dropped.extend(remove(fd));
    }
    mux::forget_range(first, last);
    // A stream's X-IO side closes now; its fd numbers are not reused
    // before the caller's real call closes them.
    drop(dropped);
}

/// `close_range(2)`: the moved sockets in the range are forgotten, as by
/// `close` (not with `CLOSE_RANGE_CLOEXEC`, which closes nothing).
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn close_range(first: u32, last: u32, flags: c_int) -> c_int {
    if flags as u32 & libc::CLOSE_RANGE_CLOEXEC == 0 {
        forget_range(first, last);
    }
    // SAFETY: passed on.
    unsafe { real::close_range(first, last, flags) }
}

/// `closefrom(3)`: as `close_range(lowfd, ~0, 0)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn closefrom(lowfd: c_int) {
    forget_range(lowfd.max(0) as u32, u32::MAX);
    // SAFETY: passed on.
    unsafe { real::closefrom(lowfd) }
}

/// `shutdown(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn shutdown(fd: c_int, how: c_int) -> c_int {
    if let Some(s) = stream_of(fd) {
        let how = match how {
            libc::SHUT_RD => Shutdown::Read,
            libc::SHUT_WR => Shutdown::Write,
            libc::SHUT_RDWR => Shutdown::Both,
            _ => {
                set_errno(libc::EINVAL);
                return -1;
            }
        };
        return match with_stream(&s, |s| s.shutdown(how)) {
            Ok(()) => 0,
            Err(e) => fail(&e, true),
        };
    }
    // SAFETY: passed on.
    unsafe { real::shutdown(fd, how) }
}

/// After a `dup` of `old` to `new` succeeded: `new` names what `old` does.
fn dup_done(old: RawFd, new: c_int) -> c_int {
    if new >= 0 && new != old {
        if !fork::forking() {
            mux::end_fresh(new);
        }
        let was = match lookup(old) {
            Some(s) => insert(new, s),
            None => remove(new),
        };
        drop(was);
    }
    new
}

/// `fdopen(3)`: stdio's calls on the stream are libc's own, which no hook
/// sees; in a forked child, a stream its parent kept on X-IO is taken
/// over first (see `vfork.rs`).
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn fdopen(fd: c_int, mode: *const libc::c_char) -> *mut libc::FILE {
    vfork::take_over(fd);
    // SAFETY: passed on.
    unsafe { real::fdopen(fd, mode) }
}

/// `dup(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn dup(fd: c_int) -> c_int {
    vfork::take_over(fd);
    // SAFETY: passed on.
    dup_done(fd, unsafe { real::dup(fd) })
}

/// `dup2(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn dup2(fd: c_int, to: c_int) -> c_int {
    vfork::take_over(fd);
    if fd != to {
        vfork::forget(to, to);
    }
    // SAFETY: passed on.
    dup_done(fd, unsafe { real::dup2(fd, to) })
}

/// `dup3(2)`.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn dup3(fd: c_int, to: c_int, flags: c_int) -> c_int {
    vfork::take_over(fd);
    vfork::forget(to, to);
    // SAFETY: passed on.
    dup_done(fd, unsafe { real::dup3(fd, to, flags) })
}

/// `fcntl(2)`: `F_SETFL`'s `O_NONBLOCK` reaches a moved stream, `F_DUPFD`
/// maps the copy. (Variadic in C; its one argument, if any, is an integer
/// or a pointer, passed here as a word, as the x86-64 and aarch64 calling
/// conventions allow.)
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn fcntl(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    let inheritable = cmd == libc::F_SETFD && arg as c_int & libc::FD_CLOEXEC == 0;
    if inheritable || cmd == libc::F_DUPFD || cmd == libc::F_DUPFD_CLOEXEC {
        vfork::take_over(fd);
    }
    // SAFETY: passed on.
    let r = unsafe { real::fcntl(fd, cmd, arg) };
    match cmd {
        libc::F_SETFL if r == 0 => {
            if let Some(s) = stream_of(fd) {
                let nb = arg as c_int & libc::O_NONBLOCK != 0;
                if let Err(e) = with_stream(&s, |s| s.set_nonblocking(nb)) {
                    return fail(&e, true);
                }
            }
            r
        }
        libc::F_DUPFD | libc::F_DUPFD_CLOEXEC => dup_done(fd, r),
        _ => r,
    }
}

/// `fcntl64`, glibc's name for `fcntl` with 64-bit offsets.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn fcntl64(fd: c_int, cmd: c_int, arg: usize) -> c_int {
    // SAFETY: the same contract.
    unsafe { fcntl(fd, cmd, arg) }
}

/// `ioctl(2)`: `FIONBIO` reaches a moved stream; `FIONREAD` counts what
/// it has to read.
///
/// # Safety
///
/// As libc's.
#[no_mangle]
pub unsafe extern "C" fn ioctl(fd: c_int, req: libc::c_ulong, arg: usize) -> c_int {
    if req == libc::FIONCLEX {
        vfork::take_over(fd);
    }
    if req == libc::FIONREAD {
        if let Some(s) = stream_of(fd) {
            if arg == 0 {
                set_errno(libc::EFAULT);
                return -1;
            }
            // What has arrived is taken in first.
            ready::pump();
            let n = with_stream(&s, XioStream::bytes_queued);
            // SAFETY: FIONREAD's argument points to an int (the caller's
            // contract).
            unsafe {
                std::ptr::write_unaligned(arg as *mut c_int, n.min(c_int::MAX as usize) as c_int)
            };
            return 0;
        }
    }
    // SAFETY: passed on.
    let r = unsafe { real::ioctl(fd, req, arg) };
    if r == 0 && req == libc::FIONBIO {
        if let Some(s) = stream_of(fd) {
            // SAFETY: FIONBIO's argument points to an int (the kernel
            // just read it).
            let nb = unsafe { *(arg as *const c_int) } != 0;
            if let Err(e) = with_stream(&s, |s| s.set_nonblocking(nb)) {
                return fail(&e, true);
            }
        }
    }
    r
}

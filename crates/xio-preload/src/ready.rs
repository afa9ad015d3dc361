//! Readiness of moved sockets, for `poll` and `epoll`: the net's events
//! (`Net::poll_nowait`, which also drains the rings and arms the
//! doorbell) turned into what a kernel socket would report, level
//! triggered.
//!
//! - A stream is readable while a non-blocking look (`poll_peek_ready`,
//!   which leaves a reset for the read to report) finds data, its end or
//!   an error: checked at each report, so it is never stale.
//! - A stream is writable until a write of it meets `EAGAIN`, and again
//!   once the net reports it writable (credit back).
//! - A listener's X-IO side is acceptable once the net reports a
//!   connection waiting, until an accept finds none.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::task::{Context, Poll, Waker};

use xio_core::net::{Event, Net};

use crate::{Kind, Sock};

/// `EPOLLIN`, `EPOLLOUT` and the rest; `poll`'s bits have the same values.
pub(crate) const IN: u32 = libc::EPOLLIN as u32;
pub(crate) const OUT: u32 = libc::EPOLLOUT as u32;
pub(crate) const ERR: u32 = libc::EPOLLERR as u32;
pub(crate) const HUP: u32 = libc::EPOLLHUP as u32;
pub(crate) const RDHUP: u32 = libc::EPOLLRDHUP as u32;

/// What readiness a socket keeps between reports.
#[derive(Default)]
pub(crate) struct Bits {
    /// A stream's write side has room (until a write meets `EAGAIN`).
    pub(crate) writable: AtomicBool,
    /// A listener's X-IO side has a connection waiting.
    pub(crate) acceptable: AtomicBool,
    /// Counts the net's readable (or acceptable) reports: an edge each,
    /// for `EPOLLET`.
    pub(crate) read_edges: AtomicU64,
    /// Counts the net's writable reports.
    pub(crate) write_edges: AtomicU64,
}

/// Moved sockets by the token their streams carry, and listeners by
/// address, for the net's events.
pub(crate) struct Registry {
    by_token: HashMap<u64, Weak<Sock>>,
    listeners: HashMap<SocketAddr, Weak<Sock>>,
}

static REGISTRY: Mutex<Option<Registry>> = Mutex::new(None);
static NEXT_TOKEN: AtomicU64 = AtomicU64::new(1);

fn registry<R>(f: impl FnOnce(&mut Registry) -> R) -> R {
    let mut g = REGISTRY.lock().unwrap_or_else(|e| e.into_inner());
    f(g.get_or_insert_with(|| Registry {
        by_token: HashMap::new(),
        listeners: HashMap::new(),
    }))
}

/// A new token for a stream's events.
pub(crate) fn new_token() -> u64 {
    NEXT_TOKEN.fetch_add(1, Ordering::Relaxed)
}

/// Records `sock` (a stream with `token`, or a listener) for the net's
/// events.
pub(crate) fn register(sock: &Arc<Sock>) {
    registry(|r| {
        match &sock.kind {
            Kind::Stream { token, .. } => {
                r.by_token.retain(|_, w| w.strong_count() > 0);
                r.by_token.insert(*token, Arc::downgrade(sock));
            }
            Kind::Listener { addr, .. } => {
                r.listeners.insert(*addr, Arc::downgrade(sock));
            }
        };
    });
}

/// The net's poll fd and the process it was made in.
type PollFd = Option<(u32, OwnedFd)>;
static POLL_FD: Mutex<PollFd> = Mutex::new(None);

/// The net's poll fd (readable when the doorbell rang), one per process.
pub(crate) fn poll_fd(net: &Net) -> Option<RawFd> {
    let mut g = POLL_FD.lock().unwrap_or_else(|e| e.into_inner());
    let pid = crate::pid();
    let mut old = None;
    if g.as_ref().is_none_or(|(p, _)| *p != pid) {
        // A forked child's copy of its parent's is closed after the lock
        // is let go (its close goes through the hooks, which take other
        // locks).
        old = g.replace((pid, net.poll_fd().ok()?));
    }
    let fd = g.as_ref().map(|(_, fd)| fd.as_raw_fd());
    drop(g);
    drop(old);
    fd
}

/// This process's listener of `to` (exactly, or on the unspecified
/// address of its port), if any.
pub(crate) fn own_listener(to: SocketAddr) -> Option<Arc<Sock>> {
    registry(|r| {
        r.listeners
            .iter()
            .filter(|(a, _)| **a == to || (a.ip().is_unspecified() && a.port() == to.port()))
            .find_map(|(_, w)| w.upgrade())
    })
}

/// The registry and the poll fd, held across a `fork` (see `fork.rs`) so
/// the child's copies are not taken by a thread it does not have.
pub(crate) fn lock_for_fork() -> (
    MutexGuard<'static, Option<Registry>>,
    MutexGuard<'static, PollFd>,
) {
    (
        REGISTRY.lock().unwrap_or_else(|e| e.into_inner()),
        POLL_FD.lock().unwrap_or_else(|e| e.into_inner()),
    )
}

/// In a forked child, with the registry held: only `listeners` (the
/// child's own copies) are known; the parent's streams and tokens are not
/// the child's.
pub(crate) fn child_registry(g: &mut Option<Registry>, listeners: &[Arc<Sock>]) {
    let r = g.get_or_insert_with(|| Registry {
        by_token: HashMap::new(),
        listeners: HashMap::new(),
    });
    r.by_token.clear();
    r.listeners.clear();
    for l in listeners {
        if let Kind::Listener { addr, .. } = &l.kind {
            r.listeners.insert(*addr, Arc::downgrade(l));
        }
    }
}

/// Whether a wait saw the net's poll fd readable since the last pump
/// (true until one has looked: unsure is read).
static RUNG: AtomicBool = AtomicBool::new(true);

/// Notes that a wait saw the net's poll fd readable: the next pump reads
/// the doorbell (see `Net::poll_nowait_hinted`).
pub(crate) fn note_rung() {
    RUNG.store(true, Ordering::Release);
}

/// Takes in what the net has (draining its rings, arming its doorbell)
/// and notes the readiness it reports. The doorbell is read only if a
/// wait saw it rung: a look that did not sleep (the common case under
/// load) makes no system call for it.
pub(crate) fn pump() {
    let Some(net) = Net::global_if_attached() else {
        return;
    };
    let mut events = Vec::new();
    let rung = RUNG.swap(false, Ordering::AcqRel);
    if net
        .poll_nowait_hinted(&mut events, usize::MAX, rung)
        .is_err()
        || events.is_empty()
    {
        return;
    }
    let socks: Vec<(Arc<Sock>, bool, bool)> = registry(|r| {
        events
            .iter()
            .filter_map(|e| match *e {
                Event::Stream {
                    token,
                    readable,
                    writable,
                } => r
                    .by_token
                    .get(&token)?
                    .upgrade()
                    .map(|s| (s, readable, writable)),
                Event::Accept(a) => r.listeners.get(&a)?.upgrade().map(|s| (s, true, false)),
            })
            .collect()
    });
    let noted = !socks.is_empty();
    for (s, readable, writable) in socks {
        if readable {
            if matches!(s.kind, Kind::Listener { .. }) {
                s.bits.acceptable.store(true, Ordering::Relaxed);
            }
            s.bits.read_edges.fetch_add(1, Ordering::Relaxed);
        }
        if writable {
            s.bits.writable.store(true, Ordering::Relaxed);
            s.bits.write_edges.fetch_add(1, Ordering::Relaxed);
        }
    }
    if noted {
        // Another thread may have looked before these came and be about
        // to sleep on the doorbell just consumed. Rung after the bits are
        // set: a thread woken before would look, find a listener or a
        // write side not yet marked, and sleep again for good.
        crate::bell::ring_others();
    }
}

/// What `sock` reports now (of `IN`, `OUT`, `ERR`, `HUP`, `RDHUP`); for a
/// listener, its X-IO side only (the kernel's is the kernel's to report).
pub(crate) fn readiness(sock: &Sock) -> u32 {
    match &sock.kind {
        Kind::Stream { s, .. } => {
            let mut r = 0;
            let mut b = [0u8; 1];
            let mut cx = Context::from_waker(Waker::noop());
            match s.poll_peek_ready(&mut cx, &mut b) {
                Poll::Ready(Ok(0)) => r |= IN | RDHUP,
                Poll::Ready(Ok(_)) => r |= IN,
                Poll::Ready(Err(_)) => r |= IN | ERR | HUP | RDHUP,
                Poll::Pending => {}
            }
            if sock.bits.writable.load(Ordering::Relaxed) {
                r |= OUT;
            }
            r
        }
        Kind::Listener { .. } => {
            if sock.bits.acceptable.load(Ordering::Relaxed) {
                IN
            } else {
                0
            }
        }
    }
}

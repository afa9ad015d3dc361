//! Sockets over shared memory: [`XioListener`] and [`XioStream`], shaped
//! like `std::net::TcpListener` and `TcpStream` so code ports by changing
//! the type names (the paper's POSIX-like layer, §III-D).
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use xio_core::net::{XioListener, XioStream};
//!
//! let listener = XioListener::bind("10.0.0.1:80")?;   // pool from $XIO_PREFIX
//! std::thread::spawn(move || {
//!     for conn in listener.incoming() {
//!         let mut s = conn.unwrap();
//!         let mut buf = [0u8; 5];
//!         s.read_exact(&mut buf).unwrap();
//!         s.write_all(&buf).unwrap();
//!     }
//! });
//! let mut s = XioStream::connect("10.0.0.1:80")?;
//! s.write_all(b"hello")?;
//! let mut back = [0u8; 5];
//! s.read_exact(&mut back)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # How it works
//! A process's sockets share one [`Stack`] (one per [`Net`]); connections
//! multiplex over the channel between two stacks, demultiplexed by the
//! receiving stack's connection table (`conn::Table`, which has no
//! I/O of its own). Streams are byte streams: reads return what is there,
//! in order, however it was written; a write larger than a pool buffer is
//! split; `write_vectored` packs its slices into one buffer when they fit.
//!
//! **Waiting.** A thread that must wait becomes the *driver* if nobody is:
//! it waits on the stack's rings with the stack's waiting policy (adaptive
//! by default: spin while a peer is awake on another core, then sleep on
//! the futex), without holding the lock, so other threads keep sending.
//! When something arrives it drains every ring into the table and wakes
//! every thread whose connection became ready in one pass (the paper's
//! batch wake-up). Other waiters sleep until woken; none spins, and the
//! driver does not spin either while threads it woke have yet to run
//! (they may need its CPU). When the driver has what it waited for, it
//! hands the role to another waiter.
//! An event loop ([`Net::poll`]) and an async adapter's driver ([`Net::drive`])
//! drain in batches themselves; once a net is polled, its non-blocking
//! reads and writes that find nothing to do say `WouldBlock` without
//! looking at the rings, and tasks' `poll_*` calls leave the rings to the
//! adapter's driver.
//!
//! **Flow control.** Each connection may have a window of buffer capacity
//! unread at the receiver ([`NetBuilder::window`], 2 MiB by default); the
//! reader credits it back as it consumes. A writer without credit waits
//! (or gets `WouldBlock`); nothing is dropped. An exhausted pool is a
//! wait too, and a write falls back to smaller buffers before it waits.
//!
//! **Closing and errors, as Linux TCP.** Dropping a stream sends a FIN
//! (a RST if received data was left unread). Data that arrives for a
//! stream already closed here is answered with a RST, so a peer that
//! keeps writing fails instead of waiting for credit that never comes. A
//! reset (a RST, or the peer process died) is reported once, to the next
//! read or write: `ConnectionReset`, or, if the peer had already finished
//! sending, a write's `BrokenPipe` (Linux's `EPIPE` in close-wait; reads
//! then see end of stream, as Linux's do after a FIN); after that reads
//! return end of stream and writes `BrokenPipe`. A refused connect stays
//! `ConnectionRefused`.
//!
//! **Exiting.** A process that exits (returning from `main`, or
//! `std::process::exit`, or C's `exit`) with connections still open closes
//! them as a socket's would be closed at exit: a FIN each (a RST where
//! received data was left unread), so its peers read end of stream after
//! its last bytes, not a reset. This runs last at exit (after the
//! program's `atexit` handlers and destructors, which still find their
//! streams open) and is best effort (a net whose lock another thread keeps
//! for 50 ms is left to the manager; other threads still running then see
//! their streams closed). A process killed by a signal runs no handler:
//! its peers get a reset (the manager announces the death) after what it
//! sent.

mod adapter;
mod batch;
mod builder;
mod connect;
mod core;
mod data;
mod event_loop;
mod exit;
mod listener;
mod stream;
mod syn;
#[cfg(test)]
mod tests;
mod waiters;

pub use adapter::{Drive, Watcher};
pub use batch::WriteBatch;
pub use builder::NetBuilder;
pub use event_loop::Event;
#[cfg(any(test, feature = "test-support"))]
pub use exit::__hold_process_locks;
pub use listener::{Incoming, XioListener};
pub use stream::{TimeoutElapsed, WeakXioStream, XioStream};
pub use waiters::WaitEntry;

#[cfg(any(test, feature = "test-support"))]
use std::collections::VecDeque;
use std::io;
use std::sync::atomic::AtomicUsize;
#[cfg(any(test, feature = "test-support"))]
use std::sync::atomic::Ordering as AtomicOrdering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::stack::{Error, PeerId};

use self::core::Core;
#[cfg(doc)]
use crate::stack::Stack;
#[cfg(doc)]
use batch::thread_key;
#[cfg(doc)]
use exit::LIVE;
use waiters::wake_all;

/// Connections a listener holds before it is accepted from, unless
/// [`Net::listen_with_backlog`] says otherwise: Linux's default
/// `SOMAXCONN`.
pub const DEFAULT_BACKLOG: usize = 4096;

/// A process's attachment for sockets: one stack shared by all the
/// listeners and streams made from it. Cheap to clone.
#[derive(Clone)]
pub struct Net {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net").finish_non_exhaustive()
    }
}

/// A [`Net`] that does not keep it alive (see [`Net::downgrade`]).
#[derive(Clone, Debug)]
pub struct WeakNet(std::sync::Weak<Shared>);

impl WeakNet {
    /// The net, if some handle still keeps it.
    pub fn upgrade(&self) -> Option<Net> {
        self.0.upgrade().map(|shared| Net { shared })
    }
}

struct Shared {
    core: Mutex<Core>,
    classes: Vec<usize>,
    /// Listeners bind only this node's addresses (see
    /// [`NetBuilder::strict_addresses`]).
    strict: bool,
    /// Copy on receive ([`NetBuilder::copy_on_receive`]), fixed at attach:
    /// a send looks here, without the lock, before it looks for a private
    /// copy to put into a pool buffer.
    copy_on_receive: bool,
    /// Threads woken from a blocking call that have not yet taken the
    /// lock again: they want a CPU (see `Net::block`). Also in `Core`.
    waking: Arc<AtomicUsize>,
    /// The stack's segment, for its manager's liveness word (read without
    /// the lock).
    seg: crate::segment::Segment,
    /// The thread ([`thread_key`]) whose stream writes a [`WriteBatch`]
    /// holds, 0 for none. Also in `Core`.
    batch_owner: Arc<AtomicUsize>,
    /// The process that attached: in a forked child the net is the
    /// parent's (see [`Net::lock`]).
    born: crate::fork::Birth,
}

/// The process-wide net ([`Net::global`]); per process, as [`LIVE`].
static GLOBAL: crate::fork::PerProcess<Mutex<Option<(crate::fork::Birth, Net)>>> =
    crate::fork::PerProcess::new(|| Mutex::new(None));

/// What one attempt of a blocking operation found.
enum Try<R> {
    Done(io::Result<R>),
    /// Not yet: wait for `Key`.
    Wait,
    /// Not yet, and nothing will signal it (a full ring, an exhausted
    /// pool): retry after a short pause.
    Retry,
}

fn stack_err(e: Error) -> io::Error {
    io::Error::from(e)
}

impl Net {
    /// The process-wide default: pool `$XIO_PREFIX` (or `xio`), attached
    /// on first use. What [`XioListener::bind`] and [`XioStream::connect`]
    /// use. A process forked from one that used it attaches its own on
    /// first use (the parent's stays the parent's; see [`crate::fork`]).
    ///
    /// When its manager is gone (it was restarted, say: the manager's
    /// liveness word says so at once, with no call to it), the next call
    /// attaches to the running one; until one runs, it keeps returning the
    /// old net, whose channels still reach the peers it had. Streams and
    /// listeners made before keep their net. [`XioStream::connect`] and
    /// [`XioListener::bind`] retry once on a fresh net when theirs finds
    /// the manager gone. A service that has not yet bound on the new
    /// manager is refused, as a TCP server that is restarting.
    pub fn global() -> io::Result<Net> {
        let mut g = GLOBAL.get().lock().unwrap_or_else(|e| e.into_inner());
        if let Some((born, n)) = g.as_ref() {
            if !born.forked() {
                if !n.manager_gone() {
                    return Ok(n.clone());
                }
                return match Net::attach(&crate::paths::default_prefix()) {
                    Ok(fresh) => {
                        tracing::info!("the pool's manager was restarted: attached again");
                        *g = Some((crate::fork::Birth::now(), fresh.clone()));
                        Ok(fresh)
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "manager gone and none to attach to");
                        Ok(n.clone())
                    }
                };
            }
        }
        let n = Net::attach(&crate::paths::default_prefix())?;
        // (A forked child has its own `GLOBAL`, empty at first: the
        // parent's net is not its to use.)
        *g = Some((crate::fork::Birth::now(), n.clone()));
        Ok(n)
    }

    /// [`Net::global`] if this process has attached it already and its
    /// manager runs: never attaches, so never waits on a manager. `None`
    /// too while another thread holds the global net's slot (it may be
    /// attaching, which waits on the manager).
    pub fn global_if_attached() -> Option<Net> {
        let g = match GLOBAL.get().try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        match g.as_ref() {
            Some((born, n)) if !born.forked() && !n.manager_gone() => Some(n.clone()),
            _ => None,
        }
    }

    /// Runs `f` on [`Net::global`]; if that fails because the net's
    /// manager is gone, once more on the net `global` attaches afresh (when
    /// a manager runs again).
    pub fn with_global<R>(mut f: impl FnMut(&Net) -> io::Result<R>) -> io::Result<R> {
        let n = Net::global()?;
        match f(&n) {
            Err(e) if n.manager_gone() => match Net::global() {
                Ok(fresh) if fresh.id() != n.id() => f(&fresh),
                _ => Err(e),
            },
            r => r,
        }
    }

    /// Whether the manager's liveness word says it is gone (one load; a
    /// hint, which the stack confirms from its control socket).
    fn manager_died_now(&self) -> bool {
        crate::liveness::died(self.shared.seg.manager_alive())
    }

    /// Whether this net's manager is gone: its liveness word says so, or
    /// the stack found it out when it last talked to it. Connections
    /// already made keep working; new ones need a net attached to a
    /// running manager ([`Net::global`] attaches again by itself).
    ///
    /// When the liveness word says so before the stack found it, the stack
    /// is made to look now (unless another thread drives the net, which
    /// will): it reads what the manager queued before it went, and the fd
    /// of [`Net::manager_watch`] goes quiet in the same step, so a `true`
    /// here never leaves that fd to wake its loop once more. The word alone
    /// is not believed (any process of the pool can write it): the stack
    /// confirms the death from its control socket.
    pub fn manager_gone(&self) -> bool {
        if !self.manager_died_now() {
            return self.lock().stack.manager_gone();
        }
        let mut wake = Vec::new();
        let mut g = self.lock();
        if !g.stack.manager_gone() && !g.driving {
            g.force_ctrl = true;
            if let Err(e) = g.drain(&mut wake) {
                tracing::debug!(error = %e, "drain on finding the manager gone");
            }
        }
        let gone = g.stack.manager_gone();
        drop(g);
        wake_all(&mut wake);
        gone
    }

    /// Runs `f` on the core, then what it asked the table for (sends, and
    /// waking the waiters it made ready, after the lock is released).
    fn update<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
        let mut wake = Vec::new();
        let mut g = self.lock();
        let r = f(&mut g);
        g.run_actions(&mut wake);
        drop(g);
        wake_all(&mut wake);
        r
    }

    /// An identity for this net (equal for clones), for adapters' tables.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// A handle that does not keep the net (its stack) alive.
    pub fn downgrade(&self) -> WeakNet {
        WeakNet(Arc::downgrade(&self.shared))
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        if self.shared.born.forked() {
            return self.lock_inherited();
        }
        self.shared.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Net::lock`] in a process forked from the one that attached. The
    /// net's calls then fail with `Forked` (its stack is the parent's),
    /// but they take the lock first, and a lock another thread of the
    /// parent held at the fork stays taken here for good: rather than
    /// wait for ever, say what happened.
    #[cold]
    fn lock_inherited(&self) -> MutexGuard<'_, Core> {
        match self.shared.core.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => panic!(
                "an X-IO net inherited across fork() was in use by another thread of the \
                 parent at the fork, and its lock stays taken in this process: attach a \
                 new Net in the child instead (see xio_core::fork)"
            ),
        }
    }

    /// Whether this process is a fork of the one that attached the net.
    fn inherited(&self) -> bool {
        self.shared.born.forked()
    }

    /// Test hook: holds the net's lock until the returned guard drops,
    /// as another thread may when the process forks. Not for
    /// applications.
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-support"))]
    pub fn __hold_lock(&self) -> impl Drop + '_ {
        self.lock()
    }

    /// This net's stack id in the pool.
    pub fn stack_id(&self) -> PeerId {
        self.lock().me()
    }

    /// Connections open (in any state), and ones closed here whose peer
    /// has not finished yet (its FIN still to come). Takes what the rings
    /// hold first.
    pub fn connections(&self) -> usize {
        let mut wake = Vec::new();
        let n = {
            let mut g = self.lock();
            if !g.driving {
                let _ = g.drain(&mut wake);
            }
            g.table.len()
        };
        wake_all(&mut wake);
        n
    }

    /// The per-connection flow-control window in bytes.
    pub fn window(&self) -> usize {
        self.lock().table.window()
    }

    /// Test hook: threads woken from blocking calls that have not taken
    /// the lock back yet, and threads woken in all. Not for applications.
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-support"))]
    pub fn __waking(&self) -> (usize, u64) {
        let g = self.lock();
        (
            self.shared.waking.load(AtomicOrdering::Relaxed),
            g.threads_woken,
        )
    }

    /// Test hook: descriptors queued behind full rings (all peers), and
    /// resets dropped for peers that do not drain. Not for applications.
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-support"))]
    pub fn __send_queue(&self) -> (usize, u64) {
        let g = self.lock();
        (g.pending.values().map(VecDeque::len).sum(), g.rst_dropped)
    }

    /// Test hook: how many requests of this net wait for the manager's
    /// answer outside its lock. Not for applications.
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-support"))]
    pub fn __requests_awaited(&self) -> usize {
        self.lock().stack.awaited()
    }

    /// Changes how long this net's calls wait for the manager's answer
    /// (see [`NetBuilder::control_timeout`]).
    pub fn set_control_timeout(&self, timeout: Duration) {
        self.lock().stack.set_control_timeout(timeout);
    }
}

//! Waking the waits of other threads.
//!
//! A net has one doorbell, and whichever thread takes in its events
//! ([`crate::ready::pump`]) consumes it. The events are noted on the
//! sockets for every thread to see, but a thread that had already looked
//! and was about to sleep (in `epoll_wait`, `poll`, `accept`) would sleep
//! through them: the doorbell it sleeps on is quiet again. So each thread
//! has a bell (an eventfd) that its waits sleep on too; a thread going to
//! sleep puts its bell on a list first, then looks at the sockets once
//! more; a pump that noted events rings every bell on the list but its
//! own. A single-threaded program finds only its own bell on the list
//! (nothing to ring), and a wait reads its bell only when it was rung (a mark kept exact under
//! the list's lock): no syscall is added to its path. A wait stays on
//! the list, once, until it returns (`Asleep` is made once per call).

use std::cell::RefCell;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use crate::real;

/// One thread's bell.
pub(crate) struct Bell {
    /// Unique in the process's life (fd numbers are reused).
    pub(crate) id: u64,
    fd: OwnedFd,
    /// Rung since it was last drained.
    rung: AtomicBool,
}

impl Bell {
    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }
}

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// The bells of the threads about to sleep or asleep.
static SLEEPERS: Mutex<Vec<Arc<Bell>>> = Mutex::new(Vec::new());

thread_local! {
    /// This thread's bell and the process it was made in (a forked
    /// child's copy of the thread makes its own).
    static MINE: RefCell<Option<(u32, Arc<Bell>)>> = const { RefCell::new(None) };
}

/// This thread's bell, made at its first wait.
pub(crate) fn mine() -> Option<Arc<Bell>> {
    let pid = crate::pid();
    MINE.with(|m| {
        let mut m = m.borrow_mut();
        if m.as_ref().is_none_or(|(p, _)| *p != pid) {
            // SAFETY: a new eventfd; owned from here.
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            if fd < 0 {
                return None;
            }
            let bell = Arc::new(Bell {
                id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
                // SAFETY: just made, ours.
                fd: unsafe { OwnedFd::from_raw_fd(fd) },
                rung: AtomicBool::new(false),
            });
            *m = Some((pid, bell));
        }
        m.as_ref().map(|(_, b)| b.clone())
    })
}

/// A thread on the list of sleepers (from before its last look until it
/// wakes).
pub(crate) struct Asleep(Arc<Bell>);

impl Asleep {
    /// Puts this thread's bell on the list; `None` if it has none.
    pub(crate) fn new() -> Option<Asleep> {
        let b = mine()?;
        lock().push(b.clone());
        Some(Asleep(b))
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.0.fd()
    }

    pub(crate) fn id(&self) -> u64 {
        self.0.id
    }

    /// Quiets the bell after a wait, if it rang: `fired` (the wait saw
    /// it readable) or marked rung. A wait that no other thread rang
    /// reads nothing (no system call). Ringers mark and write under the
    /// list's lock, and the drain reads and clears under it: the mark is
    /// set exactly while the bell is readable.
    pub(crate) fn drain(&self, fired: bool) {
        if fired || self.0.rung.load(Ordering::Acquire) {
            let _g = lock();
            self.0.quiet();
        }
    }
}

impl Bell {
    /// Reads the bell if marked (under the list's lock).
    fn quiet(&self) {
        if self.rung.swap(false, Ordering::AcqRel) {
            let mut v = 0u64;
            // SAFETY: reading an eventfd's 8-byte counter into `v`.
            unsafe { real::read(self.fd(), (&raw mut v).cast(), 8) };
        }
    }
}

impl Drop for Asleep {
    fn drop(&mut self) {
        let mut g = lock();
        // One entry: a wait inside a wait (a signal's handler's) has its
        // own, and the outer one's ring is left for it to read.
        if let Some(i) = g.iter().position(|b| Arc::ptr_eq(b, &self.0)) {
            g.swap_remove(i);
        }
        if !g.iter().any(|b| Arc::ptr_eq(b, &self.0)) {
            self.0.quiet();
        }
    }
}

fn lock() -> MutexGuard<'static, Vec<Arc<Bell>>> {
    SLEEPERS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Rings the bell of every other thread on the list (after a pump noted
/// events).
pub(crate) fn ring_others() {
    let g = lock();
    if g.is_empty() {
        return;
    }
    let me = MINE.with(|m| m.borrow().as_ref().map(|(_, b)| b.id));
    for b in g.iter().filter(|b| Some(b.id) != me) {
        // Marked and written under the lock (see `Asleep::drain`).
        if !b.rung.swap(true, Ordering::AcqRel) {
            let one = 1u64;
            // SAFETY: adding 1 to an eventfd's counter.
            unsafe { real::write(b.fd(), (&raw const one).cast(), 8) };
        }
    }
}

/// The list, held across a `fork` (see `fork.rs`).
pub(crate) fn lock_for_fork() -> MutexGuard<'static, Vec<Arc<Bell>>> {
    lock()
}

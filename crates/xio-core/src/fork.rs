//! What a process forked from one with stacks inherits, and how X-IO
//! keeps it from doing harm.
//!
//! A stack is one process's identity in the pool: its id, its rings (each
//! with one consumer), its private buffer cache. `fork()` copies all of it
//! into the child, but the child is not that process: were it to receive
//! on the inherited rings, free the inherited buffers or return the copied
//! cache to the pool, parent and child would both own the same buffers and
//! race on the same rings. Worse, the child's copy of the stack's control
//! socket keeps it open after the parent dies, and the manager learns of a
//! death only by that socket closing: a parent killed while a child it
//! forked lives on would never be reclaimed, and its peers would never get
//! their reset.
//!
//! An embedded manager has the same problem the other way round: a child
//! holding copies of the manager's ends of the stacks' sockets keeps
//! stacks from seeing a dead manager, a copy of its listening socket lets
//! attaching stacks queue where nobody accepts, a copy of its lock file
//! keeps a new manager from starting, and dropping an inherited
//! [`crate::manager::ManagerHandle`] would stop the parent's manager.
//!
//! So, at the first attach (or manager start), X-IO registers a
//! `pthread_atfork` handler that runs in every forked child. It bumps the
//! fork generation, which every stack, pool and manager handle compares
//! with its own: in the child, inherited stacks fail with
//! [`crate::stack::Error::Forked`], inherited buffers are forgotten, not
//! freed, and an inherited manager handle is left alone. And it points each
//! descriptor registered as `CloseOnFork` (the `O_CLOFORK` Linux lacks) at
//! an inert socket, so the only open copy of the real one is the parent's.
//! A child that wants X-IO attaches its own stack (or `Net`;
//! [`crate::net::Net::global`] does so by itself). An inherited `Net` (and
//! its streams and listeners) is not to be used in the child: its calls
//! fail with `Forked`, and if another thread of the parent held the net's
//! lock at the fork (the child's copy of it stays taken), they panic
//! saying so instead of waiting for ever. Dropping inherited streams and
//! listeners does nothing (the C API's handles check the fork generation
//! before the lock and answer `XIO_ERR_FORKED`). `posix_spawn` and
//! `std::process::Command` do not run fork handlers and need none: the
//! descriptors are close-on-exec.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};

/// Bumped in every forked child.
static GENERATION: AtomicU32 = AtomicU32::new(0);

/// `CloseOnFork` descriptors (raw fds, -1 = free), for the child handler
/// to neuter. Beyond this many in one process a descriptor is not
/// registered (a child keeps a copy open: the problem above, for that one
/// only).
const SLOTS: usize = 1024;
static REGISTERED: [AtomicI32; SLOTS] = [const { AtomicI32::new(-1) }; SLOTS];

/// Whether the fork handler is registered (a flag, not a `Once`: a fork
/// while another thread is inside a `Once` would leave the child's copy
/// waiting for ever; two registrations would be harmless).
static INSTALLED: AtomicBool = AtomicBool::new(false);

extern "C" {
    // POSIX; in glibc's and musl's libc.
    fn pthread_atfork(
        prepare: Option<unsafe extern "C" fn()>,
        parent: Option<unsafe extern "C" fn()>,
        child: Option<unsafe extern "C" fn()>,
    ) -> i32;
}

/// The fork generation of this process: bumped in every child forked
/// once X-IO's fork handler is installed (at the first attach, manager
/// start or [`PerProcess::get`]). A cache of per-process facts keyed by it
/// is not mistaken in a child for the parent's.
#[inline]
pub fn generation() -> u32 {
    GENERATION.load(Ordering::Relaxed)
}

/// Which process (by fork generation) made a stack, pool or manager
/// handle: recorded when it is made, and asked at each operation that
/// reaches shared state (one relaxed load).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Birth(u32);

impl Birth {
    /// This process, now.
    #[inline]
    pub(crate) fn now() -> Birth {
        Birth(generation())
    }

    /// Whether this process is a fork of the one that made the owner.
    #[inline]
    pub(crate) fn forked(self) -> bool {
        generation() != self.0
    }
}

/// A process-wide value (a registry behind a lock, say) that a forked
/// child gets afresh instead of inheriting. A lock that some other thread
/// of the parent held at the `fork()` is never released in the child, so
/// a child locking its copy would wait forever; this one's first use in
/// the child makes a new value (the inherited copy is left alone, never
/// freed: one per fork).
///
/// ```
/// use std::sync::Mutex;
/// use xio_core::fork::PerProcess;
///
/// static NAMES: PerProcess<Mutex<Vec<String>>> = PerProcess::new(|| Mutex::new(Vec::new()));
/// NAMES.get().lock().unwrap().push("x".into());
/// ```
pub struct PerProcess<T: 'static> {
    current: std::sync::atomic::AtomicPtr<(u32, T)>,
    make: fn() -> T,
    /// `Send`/`Sync` as a `T` would be (it is shared between threads).
    _shared: std::marker::PhantomData<T>,
}

impl<T: 'static> PerProcess<T> {
    /// A value made by `make` at its first use in each process.
    pub const fn new(make: fn() -> T) -> PerProcess<T> {
        PerProcess {
            current: std::sync::atomic::AtomicPtr::new(std::ptr::null_mut()),
            make,
            _shared: std::marker::PhantomData,
        }
    }

    /// This process's value.
    pub fn get(&self) -> &'static T {
        // A fork must bump the generation from the first use on (before
        // any attach installs the handler, a thread may hold the value's
        // lock already).
        install();
        let g = generation();
        loop {
            let p = self.current.load(Ordering::Acquire);
            // SAFETY: a non-null pointer came from `Box::into_raw` below
            // and is never freed once published.
            if let Some(cur) = unsafe { p.as_ref() } {
                if cur.0 == g {
                    return &cur.1;
                }
            }
            let fresh = Box::into_raw(Box::new((g, (self.make)())));
            match self
                .current
                .compare_exchange(p, fresh, Ordering::AcqRel, Ordering::Acquire)
            {
                // SAFETY: published: lives (unfreed) for the program.
                Ok(_) => return unsafe { &(*fresh).1 },
                // Another thread of this process published first.
                // SAFETY: `fresh` was never shared.
                Err(_) => drop(unsafe { Box::from_raw(fresh) }),
            }
        }
    }
}

/// Runs in the child right after `fork()`, with one thread: only atomics
/// and system calls (async-signal-safe).
unsafe extern "C" fn on_fork_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
    let Ok(inert) = rustix::net::socket_with(
        rustix::net::AddressFamily::UNIX,
        rustix::net::SocketType::STREAM,
        rustix::net::SocketFlags::CLOEXEC,
        None,
    ) else {
        return;
    };
    for slot in &REGISTERED {
        let fd = slot.load(Ordering::Relaxed);
        if fd < 0 {
            continue;
        }
        // SAFETY: `fd` is open in the child: a registered fd is only closed
        // after its slot is cleared (`CloseOnFork::drop`), and the child has the
        // parent's fds as of the fork. `ManuallyDrop` keeps this borrowed
        // view from closing it; `dup3` replaces what it refers to, and the
        // owning `CloseOnFork` closes the inert copy when it drops.
        let mut target = std::mem::ManuallyDrop::new(unsafe { OwnedFd::from_raw_fd(fd) });
        let _ = rustix::io::dup3(&inert, &mut target, rustix::io::DupFlags::CLOEXEC);
    }
}

/// A descriptor a forked child must not keep open (see the module docs):
/// a stack's control socket, or the manager's listening socket, lock file
/// and ends of the stacks' sockets.
#[derive(Debug)]
pub(crate) struct CloseOnFork {
    fd: OwnedFd,
    slot: Option<usize>,
}

/// Registers the fork handler, once.
fn install() {
    if INSTALLED.load(Ordering::Acquire) || INSTALLED.swap(true, Ordering::AcqRel) {
        return;
    }
    // SAFETY: the handler is an `extern "C" fn` that lives for the whole
    // program and does only async-signal-safe work.
    let rc = unsafe { pthread_atfork(None, None, Some(on_fork_child)) };
    if rc != 0 {
        tracing::warn!(
            rc,
            "pthread_atfork failed: forked children keep X-IO's sockets"
        );
    }
}

impl CloseOnFork {
    pub(crate) fn new(fd: OwnedFd) -> CloseOnFork {
        install();
        let raw = fd.as_raw_fd();
        let slot = REGISTERED.iter().position(|s| {
            s.compare_exchange(-1, raw, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        });
        CloseOnFork { fd, slot }
    }
}

impl AsFd for CloseOnFork {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for CloseOnFork {
    fn drop(&mut self) {
        // Unregistered before the fd closes (when `self.fd` drops next), so
        // a fork in between never touches a number reused by someone else.
        if let Some(s) = self.slot {
            REGISTERED[s].store(-1, Ordering::Relaxed);
        }
    }
}

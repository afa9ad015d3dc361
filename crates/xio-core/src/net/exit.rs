//! Closing every connection at process exit, as the kernel closes a process's sockets.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::waiters::wake_all;
#[cfg(any(test, feature = "test-support"))]
use super::GLOBAL;
use super::{Net, WeakNet};

/// How long the exit handler tries for a net's lock, and to push what
/// waits for ring space, before leaving that net's connections to the
/// manager (another thread may be stopped for good while it holds it).
const EXIT_LOCK_WAIT: Duration = Duration::from_millis(50);

/// Every net this process attached, for [`close_at_exit`]. Per process:
/// a forked child starts with none (its inherited nets are the parent's)
/// and with a lock no thread of the parent can still hold.
pub(super) static LIVE: crate::fork::PerProcess<Mutex<Vec<WeakNet>>> =
    crate::fork::PerProcess::new(|| Mutex::new(Vec::new()));

/// Notes `net` for the exit handler.
pub(super) fn close_at_exit_register(net: &Net) {
    let mut live = LIVE.get().lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|w| w.0.strong_count() > 0);
    live.push(net.downgrade());
}

/// [`close_at_exit`] as a `.fini_array` entry: `exit` runs those after
/// every `atexit` handler and C++ destructor of the program (glibc's
/// `_dl_fini`), so the program's own cleanup at exit still finds its
/// connections open, as it would find its sockets. (An `atexit` handler
/// registered at the first attach ran before the handlers registered
/// earlier.)
#[used]
#[link_section = ".fini_array"]
static CLOSE_AT_EXIT: extern "C" fn() = close_at_exit;

/// At exit, closes every connection still open, as the kernel closes a
/// process's sockets: peers then read end of stream, not a reset. Other
/// threads still run while `exit` calls this (their calls on the closed
/// streams fail from then on), so it only tries each lock for a while;
/// nothing here may unwind into C.
extern "C" fn close_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let deadline = Instant::now() + EXIT_LOCK_WAIT;
        let Some(live) = lock_until(LIVE.get(), deadline) else {
            return;
        };
        let nets = live_nets(&live);
        drop(live);
        for n in nets {
            n.close_all(deadline.max(Instant::now() + EXIT_LOCK_WAIT));
        }
    });
}

/// `m` locked, trying until `deadline` (poisoned counts as locked: at
/// exit, what a panicked thread left is still worth closing).
fn lock_until<T>(m: &Mutex<T>, deadline: Instant) -> Option<MutexGuard<'_, T>> {
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::yield_now();
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

/// Test hook: locks this process's registries of nets (the exit
/// handler's and [`Net::global`]'s) until the returned guard drops, as
/// another thread may hold them when the process forks. Not for
/// applications.
#[doc(hidden)]
#[cfg(any(test, feature = "test-support"))]
pub fn __hold_process_locks() -> Box<dyn std::any::Any> {
    let live = LIVE.get().lock().unwrap_or_else(|e| e.into_inner());
    let global = GLOBAL.get().lock().unwrap_or_else(|e| e.into_inner());
    Box::new((live, global))
}

/// The nets of [`LIVE`] still alive.
fn live_nets(live: &[WeakNet]) -> Vec<Net> {
    live.iter().filter_map(WeakNet::upgrade).collect()
}

impl Net {
    /// Closes every connection of this net as dropping its stream would
    /// (a FIN, or a RST where data was left unread): what the exit handler
    /// does. Gives up if the lock stays taken until `deadline`, and stops
    /// pushing what waits for ring space then.
    fn close_all(&self, deadline: Instant) {
        let Some(mut g) = lock_until(&self.shared.core, deadline) else {
            return;
        };
        if g.stack.forked() {
            return;
        }
        // What arrived and was not read is unread data too (a RST), as it
        // would be in a socket's kernel buffer.
        let mut wake = Vec::new();
        let _ = g.drain(&mut wake);
        for c in g.table.open_ids() {
            g.table.close(c);
        }
        g.run_actions(&mut wake);
        // FINs behind a full ring: give the peer a little time to make
        // room, or it gets a reset (and loses what was queued before).
        g.flush_pending_until(deadline);
        drop(g);
        wake_all(&mut wake);
    }
}

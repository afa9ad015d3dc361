//! A manager running on a thread of this process ([`ManagerBuilder::spawn`]):
//! its [`ManagerHandle`], which stops it when dropped, a [`Stopper`] for
//! any thread, and the [`Snapshot`] of what the manager knows.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::backend::{AnyManagerPool, ClassUsage, Doorbell, EventFdDoorbell};

use super::error::io_err;
use super::{Manager, ManagerBuilder, ManagerError};

impl ManagerBuilder {
    /// Binds and runs the manager on a background thread, until the
    /// returned handle is dropped or stopped.
    #[must_use = "the manager stops when its handle is dropped: keep the handle"]
    pub fn spawn(self) -> Result<ManagerHandle, ManagerError> {
        let m = self.bind()?;
        let stop = m.stopper();
        let metrics = m.metrics();
        let view = m.pool.clone();
        let snap = m.snapshot.clone();
        let prefix = m.prefix.clone();
        let thread = std::thread::Builder::new()
            .name(format!("xio-manager-{prefix}"))
            .spawn(move || m.run())
            .map_err(io_err("spawn manager thread"))?;
        Ok(ManagerHandle {
            thread: Some(thread),
            born: crate::fork::Birth::now(),
            stop,
            pool: view,
            snapshot: snap,
            metrics,
            prefix,
        })
    }
}

/// Stops a running manager from another thread or a signal handler thread.
#[derive(Clone, Debug)]
pub struct Stopper(Arc<EventFdDoorbell>);

impl Stopper {
    /// Asks the manager to stop; `run` returns soon after.
    pub fn stop(&self) {
        let _ = self.0.ring();
    }
}

impl Manager {
    /// A handle that makes [`Manager::run`] return.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.stop.clone())
    }
}

/// What the manager knows, for status output and tests.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Registered stacks.
    pub stacks: Vec<StackInfo>,
    /// Open channels: `(slot, stack a, stack b)`.
    pub channels: Vec<(u32, u16, u16)>,
    /// Processes that died or left, in total, counted once the buffers
    /// they held are back (with [`Snapshot::reclaimed`]).
    pub deaths: u64,
    /// Buffers reclaimed from them, in total.
    pub reclaimed: u64,
    /// Times the manager's liveness word was found overwritten and put
    /// back.
    pub liveness_repairs: u64,
    /// Free-list gates found closed outside a sweep (forged) and reopened.
    pub gate_repairs: u64,
    /// Stacks woken because a ring held something for them for a whole
    /// look while they slept (a wake-up lost: their `sleeping` word
    /// overwritten by a process that can write the segment).
    pub nudges: u64,
    /// Stacks registered, in total.
    pub attaches: u64,
    /// Connections refused a registration or dropped before one, in
    /// total: another user, no free slot, a process at its limits.
    pub refused: u64,
    /// Buffers found held in the name of no stack (a header another
    /// process overwrote) and given back, in total.
    pub orphans: u64,
    /// Malformed or unexpected control messages received.
    pub bad_messages: u64,
    /// Dead stacks whose buffers wait to be reclaimed: a live stack was
    /// inside a free-list operation (stopped, say) for as long as the
    /// manager would wait. It tries again, in the background.
    pub unswept: usize,
}

/// One registered stack.
#[derive(Clone, Debug)]
pub struct StackInfo {
    /// Stack id.
    pub id: u16,
    /// Process id.
    pub pid: u32,
    /// Service name.
    pub name: String,
    /// Bound addresses.
    pub addrs: Vec<SocketAddr>,
    /// Control messages waiting in the manager for room in the stack's
    /// socket: more than zero means it is not reading it (stopped or
    /// stuck), and the manager takes no requests from it meanwhile.
    pub queued: usize,
}

/// A manager running on a thread of this process. Stops (and removes its
/// socket) when dropped.
#[derive(Debug)]
#[must_use = "the manager stops when its handle is dropped"]
pub struct ManagerHandle {
    thread: Option<JoinHandle<Result<(), ManagerError>>>,
    /// The fork generation of the process running the manager: a forked
    /// child's copy of the handle must not stop it (see [`crate::fork`]).
    born: crate::fork::Birth,
    stop: Stopper,
    pool: AnyManagerPool,
    snapshot: Arc<Mutex<Snapshot>>,
    pub(super) metrics: super::metrics::Metrics,
    prefix: String,
}

impl ManagerHandle {
    /// Buffers per class, free and per owner.
    pub fn usage(&self) -> Vec<ClassUsage> {
        self.pool.usage()
    }

    /// True when every buffer of every class is free.
    pub fn pool_is_whole(&self) -> bool {
        self.usage().iter().all(|u| u.free == u.total)
    }

    /// Registered stacks, channels and counters.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The pool's prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Stops the manager and waits for its thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.born.forked() {
            // A forked child's copy: the manager runs in the parent (its
            // stop eventfd is shared), and the thread is not ours to join.
            std::mem::forget(self.thread.take());
            return;
        }
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(Err(e)) => tracing::error!(error = %e, "manager failed"),
                Err(_) => tracing::error!("manager thread panicked"),
                Ok(Ok(())) => {}
            }
        }
    }
}

impl Drop for ManagerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

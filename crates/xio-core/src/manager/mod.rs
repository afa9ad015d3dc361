//! The manager: owns the pool, registers stacks, sets up channels, and
//! reclaims what a dead process held. The `xio-manager` binary runs this
//! same code in the foreground; [`ManagerBuilder::spawn`] runs it on a
//! thread inside any process (tests, examples, single-binary services).
//!
//! The manager is the control plane only: once two stacks have a channel it
//! never touches their traffic. It learns of a death by EOF on the stack's
//! control socket, which the kernel delivers the moment a process dies,
//! however it dies.
//!
//! # Where things are
//! This file holds the [`Manager`]'s state (the stacks, channels and
//! bindings it keeps) and [`Manager::run`]. The rest is split by concern:
//! - `error.rs`: [`ManagerError`];
//! - `builder.rs`: [`ManagerBuilder`] and starting a manager: the run dir,
//!   the lock file, the control socket and the pool;
//! - `domain.rs`: the security domain: who may attach;
//! - `handle.rs`: a manager running on a thread ([`ManagerHandle`],
//!   [`Stopper`]) and what it shows ([`Snapshot`]);
//! - `serve.rs`: the serve loop: polling, accepting, and the requests of
//!   registered stacks;
//! - `session.rs`: a stack's session: its registration (`Hello`), and
//!   cutting it off when its socket ends or misbehaves;
//! - `outbox.rs`: messages to stacks, sent without ever waiting on one,
//!   queued while its socket is full;
//! - `channels.rs`: bindings and channels: binding addresses, resolving a
//!   connect, setting up a channel, and its release;
//! - `death.rs`: a stack that left or died: its peers reset, its
//!   addresses freed, its channels closed;
//! - `sweep.rs`: reclaiming the buffers dead stacks held, and freeing
//!   their slots once every peer let go;
//! - `report.rs`: the snapshot and the status report;
//! - `registration.rs`: the manager's thread registered as the pool's
//!   live manager (its liveness word);
//! - `tests.rs`: unit tests.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

pub use crate::backend::Backend;
use crate::backend::{AnyManagerPool, EventFdDoorbell, ManagerBackend};
use crate::fork::CloseOnFork;
use crate::proto::Msg;
use crate::segment::Segment;

#[cfg(feature = "test-support")]
#[doc(hidden)]
pub use crate::status::status_from_reply;
pub use crate::status::{query_status, query_status_within};

mod builder;
mod channels;
mod death;
mod domain;
mod error;
mod handle;
mod metrics;
mod outbox;
mod registration;
mod report;
mod serve;
mod session;
mod sweep;
#[cfg(all(test, not(loom)))]
mod tests;

pub use builder::ManagerBuilder;
pub use channels::MAX_BINDINGS_PER_STACK;
pub use error::ManagerError;
pub use handle::{ManagerHandle, Snapshot, StackInfo, Stopper};
pub use metrics::Metrics;

use builder::{LockFile, SocketFile};
#[cfg(doc)]
use outbox::RETRY_STALLED;

/// A connection to the control socket that has not said `Hello` yet.
struct Pending {
    sock: CloseOnFork,
    /// The connecting process, as the kernel names it (none from a pid
    /// namespace the manager cannot see).
    pid: Option<u32>,
    /// When it connected.
    since: std::time::Instant,
    /// It had sent something by the time it was accepted (a stack sends
    /// its Hello as it connects): not silent, so not counted against its
    /// process's limit.
    said: bool,
}

struct StackEntry {
    sock: CloseOnFork,
    /// Its slot's generation (see [`Manager::generations`]).
    generation: u16,
    pid: u32,
    name: String,
    bell: EventFdDoorbell,
    /// A pidfd of the stack's process (when the kernel's credentials named
    /// it), handed to its peers with the channel: with no manager left to
    /// tell them, they see its death themselves.
    pidfd: Option<OwnedFd>,
    addrs: BTreeSet<SocketAddr>,
    /// peer id -> channel slot
    peers: HashMap<u16, u32>,
    /// Messages its socket had no room for, oldest first, with their fds.
    /// While any wait, the manager reads no requests from this stack (so
    /// a stack that never reads cannot grow it by asking) and polls its
    /// socket for room instead: the manager never blocks on one stack.
    outbox: VecDeque<(Msg, Vec<OwnedFd>)>,
    /// The fds the outbox holds.
    outbox_fds: usize,
    /// The outbox's first message was refused for a reason poll does not
    /// signal the end of: it is tried again every [`RETRY_STALLED`].
    stalled: bool,
    /// The stack left (its end of file read) while its process still
    /// holds the socket: a buffer of it lives on (see [`Manager::on_leave`]).
    /// Its peers and addresses are let go; its buffers are reclaimed when
    /// the socket closes.
    left: bool,
    /// It left because the manager cut it off for a bad control message
    /// (not of its own accord): the status report says so.
    bad: bool,
    /// It left, its end shut for writing (`POLLRDHUP`), and what it had
    /// sent before was read and dropped: nothing more can come but the
    /// hang-up.
    drained: bool,
}

struct ChanEntry {
    a: u16,
    b: u16,
    /// When closing: the live end we wait on, and the dead one.
    closing: Option<(u16, u16)>,
}

/// A sweep a dead stack is owed.
#[derive(Clone, Copy, Debug, Default)]
struct Owed {
    /// Its first: its death is counted in the snapshot with it.
    first: bool,
    /// Its last, after every peer let go of its channels: its slot is
    /// free after it.
    last: bool,
}

/// A bound manager; [`Manager::run`] serves until stopped.
pub struct Manager {
    prefix: String,
    /// Unlinked before the lock is let go: while it is held, no other
    /// manager binds the path.
    sock: SocketFile,
    /// Dropped (unlinked, then released) before the listener closes.
    _lock: LockFile,
    listener: CloseOnFork,
    seg: Segment,
    pool: AnyManagerPool,
    /// What the backend holds beside the pool (DPDK: both rings of every
    /// channel slot, made at start, and the prefix's hugepage files,
    /// removed when the manager stops or is dropped without running).
    backend: ManagerBackend,
    stop: Arc<EventFdDoorbell>,
    /// Connections that have not said `Hello` yet (see `serve.rs`).
    pending: Vec<Pending>,
    /// The most stacks one process may have registered.
    max_stacks_per_process: u32,
    stacks: HashMap<u16, StackEntry>,
    /// Dead stacks whose slot waits for their peers to release channels.
    dead: HashMap<u16, BTreeSet<u32>>,
    /// Dead stacks whose buffers are still to be swept back (see
    /// [`Manager::sweep`]).
    unswept: BTreeMap<u16, Owed>,
    /// After a sweep gave up on a stack inside a free-list operation: when
    /// to try again, and the wait after that one (doubling).
    sweep_retry: Option<(std::time::Instant, std::time::Duration)>,
    /// When to look next for buffers held in the name of no stack (see
    /// [`Manager::audit`]).
    audit_due: std::time::Instant,
    /// Rings found with something to read at the last look, and the
    /// consumer index then (see [`Manager::nudge_stuck_readers`]).
    waiting_rings: HashMap<(u32, u8), u32>,
    /// The stack id given last: the next one is looked for after it, so
    /// an id comes back only after every other was used (as pids do). A
    /// peer's id reused at once would make what its peers still hold of
    /// the dead one (a queued reset, a route) look like the new one's.
    last_id: u16,
    /// Per slot, the generation given with it last: the next registration
    /// in the slot gets the one after (skipping 0), so a peer can tell a
    /// newcomer from the dead stack whose slot it took (a reset still
    /// queued for the dead one, say). Kept here, not read back from the
    /// segment, where any attached process could rewrite it.
    generations: Vec<u16>,
    bindings: HashMap<SocketAddr, u16>,
    channels: Vec<Option<ChanEntry>>,
    /// Most fds all outboxes may hold together (a share of the fd limit
    /// at start).
    outbox_fd_budget: usize,
    snapshot: Arc<Mutex<Snapshot>>,
    /// Who may attach (see `domain.rs`).
    domain: domain::Domain,
    /// Accepting failed (out of fds, most often): the listener is not
    /// polled until then. The connection that failed stays in the
    /// kernel's queue, so polling it meanwhile would spin.
    accept_paused: Option<std::time::Instant>,
    /// Accepting has failed since it last succeeded (logged once).
    accept_failing: bool,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("prefix", &self.prefix)
            .field("stacks", &self.stacks.len())
            .finish()
    }
}

impl Manager {
    /// Serves until stopped; then removes the socket.
    pub fn run(mut self) -> Result<(), ManagerError> {
        // Sleeping stacks learn of this thread's end, however it ends,
        // through the segment's liveness word (see `crate::liveness`).
        let alive = registration::Registration::register(&self.seg);
        if alive.is_none() {
            tracing::warn!(
                prefix = %self.prefix,
                "the kernel refused a robust futex list: stacks notice a dead manager within a second"
            );
        }
        let r = self.serve(alive.as_ref());
        self.sock.remove();
        // Close the stacks' sockets, then mark the word: a stack it wakes
        // finds its control socket closed.
        self.stacks.clear();
        self.pending.clear();
        drop(alive);
        self.backend.stop();
        tracing::info!(prefix = %self.prefix, "manager stopped");
        r
    }
}

//! The stack: a process's attachment to a pool, and the zero-copy interface
//! (the paper's `xio_malloc` / `xio_tx` / `xio_rx`).
//!
//! ```no_run
//! use xio_core::prelude::*;
//!
//! let mut stack = Stack::attach("demo")?;          // register with the manager
//! let peer = stack.connect("10.0.0.2:80".parse()?)?; // channel to whoever bound it
//! let mut buf = stack.alloc(64)?;                   // a pool buffer, ours alone
//! buf.copy_from(b"hello");
//! stack.send(peer, buf)?;                           // moves; no copy
//! let msg = stack.recv()?;                          // waits (adaptive by default)
//! assert_eq!(&msg.buf[..], b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! # Where things are
//! This file holds the [`Stack`] type, its state and its accessors. The
//! rest of its `impl` is split by concern, one file each:
//! - `error.rs`: [`Error`], and how it maps to `io::Error`;
//! - `attach.rs`: [`StackBuilder`] and attaching (connecting to the
//!   manager's control socket, `Hello`, mapping the segment);
//! - `control.rs`: requests to the manager over the control socket (bind,
//!   unbind, connect) and its answers, late ones included; its unprompted
//!   messages; messages queued while the socket is full;
//! - `channels.rs`: channels to peers: connecting, setting up a channel's
//!   rings from the manager's fds, closing one, and the routes learnt;
//! - `death.rs`: what a stack does about a dead manager and dead peers
//!   (their pidfds, while no manager runs to announce them);
//! - `alloc.rs`: allocating buffers, and the pool references recycled for
//!   them;
//! - `send.rs`: the zero-copy send path, and waking a peer;
//! - `recv.rs`: the zero-copy receive path: draining the rings, `recv` and
//!   its variants;
//! - `socket.rs`: what the socket layer ([`crate::net`]) uses: events of
//!   every kind, and pushes of control descriptors and stream buffers;
//! - `waiting.rs`: waiting for input (the waiting policy over the rings, a
//!   driver's probe, the doorbell) and the backoff where no doorbell
//!   exists;
//! - `hooks.rs`: the `__` test hooks (a broken or hostile peer);
//! - `tests.rs`: unit tests.

mod alloc;
mod attach;
mod channels;
mod control;
mod death;
mod error;
#[cfg(any(test, feature = "test-support"))]
mod hooks;
mod private;
mod recv;
mod send;
mod socket;
#[cfg(test)]
mod tests;
mod waiting;

pub(crate) use attach::default_control_timeout;
pub use attach::StackBuilder;
pub(crate) use control::Kept;
pub use error::Error;
pub(crate) use socket::Incoming;
pub(crate) use waiting::Probe;

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{
    AnyPool, BufferPool, DescConsumer, DescProducer, Doorbell, EventFdDoorbell, RawBuf,
};
use crate::buf::Buf;
use crate::layout::{Descriptor, StackSlot};
use crate::proto::Msg;
use crate::segment::Segment;
use crate::sync::FxHashMap;
use crate::wait::{AdaptiveSpin, WaitMode};

/// Another stack, as seen from this one: its slot in the pool (the low
/// 16 bits) and the slot's generation (the high 16), `generation << 16 |
/// slot`. The manager gives a slot a new generation at each registration,
/// so a service that restarts in a dead one's slot has another id: a reset
/// still queued for the dead one ([`Error::Reset`], a socket's
/// `PeerGone`) names the dead one and nothing of the newcomer's, and a
/// send to the dead one's id fails with a reset instead of reaching the
/// newcomer.
///
/// Generation 0 is no registration's: an id made from a slot alone (C's
/// `xio_peer`, `PeerId(slot)`) names whichever stack holds the slot now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u32);

impl PeerId {
    /// The id of the stack in `slot` at `generation`.
    pub const fn new(slot: u16, generation: u16) -> PeerId {
        PeerId((generation as u32) << 16 | slot as u32)
    }
    /// Its slot in the pool (what C programs see as an `xio_peer`).
    pub const fn slot(self) -> u16 {
        self.0 as u16
    }
    /// Its slot's generation (0: any, see [`PeerId`]).
    pub const fn generation(self) -> u16 {
        (self.0 >> 16) as u16
    }
    /// Whether this id names `current`, the stack that holds the slot now:
    /// the same slot, and the same generation unless this id has none.
    pub(crate) const fn names(self, current: PeerId) -> bool {
        self.slot() == current.slot()
            && (self.generation() == 0 || self.generation() == current.generation())
    }
}

impl std::fmt::Display for PeerId {
    /// The slot, as C programs see an `xio_peer`, and its generation after
    /// a dot when it has one (`3.2`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.generation() {
            0 => self.slot().fmt(f),
            g => write!(f, "{}.{g}", self.slot()),
        }
    }
}

/// A received buffer and where it came from.
#[derive(Debug)]
pub struct Message {
    /// The sender.
    pub from: PeerId,
    /// The sender's tag (see [`Stack::send_tagged`]).
    pub tag: u32,
    /// The payload, read-only; drop it to return it to the pool, or
    /// [`Buf::into_mut`] it to forward.
    pub buf: Buf,
}

const BURST: usize = 32;

/// Pool references a stack keeps from the buffers it sends, for the
/// buffers it receives or allocates (see [`Stack::pool_ref`]): a burst's
/// worth each way.
const REFS_KEPT: usize = 2 * BURST;

struct Chan {
    id: u32,
    /// The ring of the channel this stack produces into (it consumes the
    /// other).
    #[cfg(any(test, feature = "test-support"))]
    dir: u8,
    peer: u16,
    /// The peer's full id (slot and generation).
    peer_id: PeerId,
    tx: Box<dyn DescProducer>,
    rx: Box<dyn DescConsumer>,
    peer_bell: EventFdDoorbell,
    /// The peer process's pidfd, from the manager: readable once it has
    /// exited. Looked at only while no manager runs to say so.
    peer_pidfd: Option<OwnedFd>,
}

impl Chan {
    /// Descriptors one push can take, for `want`: reads the consumer's
    /// index only when the cached one shows room for fewer (reading it on
    /// every send cost a cross-core miss per message: the consumer writes
    /// it on every pop). Pushes one at a time take a slot each, so only
    /// "more than zero" holds for them.
    fn tx_space(&mut self, want: usize) -> Result<usize, ()> {
        Ok(self
            .tx
            .room(want.min(u32::MAX as usize) as u32)
            .map_err(|_| ())? as usize)
    }
}

enum Event {
    Msg(Message),
    Reset(PeerId),
    /// A socket-layer descriptor (buffer or control) found by a path that
    /// does not route them: handed to [`Stack::poll_events`], dropped by
    /// the zero-copy receive paths.
    Sock(Incoming),
}

/// A process's attachment to an X-IO pool. See the module docs.
///
/// `Send` but not `Sync`: one thread drives a stack (buffers themselves are
/// `Send` and may be dropped anywhere).
pub struct Stack {
    id: u16,
    /// Its slot's generation (see [`PeerId`]).
    generation: u16,
    seg: Segment,
    pool: AnyPool,
    bell: EventFdDoorbell,
    channels: Vec<Chan>,
    by_peer: FxHashMap<u16, usize>,
    resolved: HashMap<SocketAddr, u16>,
    ctrl_seen: u32,
    mode: WaitMode,
    spin: AdaptiveSpin,
    inbox: VecDeque<Event>,
    scratch: [Descriptor; BURST],
    /// Kept between calls of [`Stack::push_bufs`] (no allocation per burst).
    burst_raws: Vec<(u8, u32, RawBuf, usize)>,
    /// References to our pool taken from buffers we sent, handed to the
    /// buffers we receive or allocate next (see [`Stack::pool_ref`]). A
    /// cell, for `alloc(&self)`: the stack is not `Sync`.
    refs: std::cell::RefCell<Vec<Arc<dyn BufferPool>>>,
    rr: usize,
    corrupt: u64,
    /// Where received messages are copied, in copy-on-receive mode (see
    /// `private.rs`).
    private: Option<Arc<private::PrivatePool>>,
    manager_gone: bool,
    /// An error met after [`Stack::recv_burst`] had messages in hand: they
    /// are returned first, the error by the next receive.
    deferred: Option<Error>,
    /// The manager runs in this process (embedded). Its liveness word is
    /// then not waited on: at the process's death the kernel wakes one
    /// waiter of that word, and it must be one in another process, which
    /// passes the news on; one of ours would die with it, and the other
    /// processes would never learn. (Our own sleeps need no such news.)
    manager_here: bool,
    /// How long a request waits for the manager's answer.
    ctrl_timeout: Duration,
    /// Requests sent and not answered yet, oldest first, each with its
    /// number: the one a caller waits for, and those whose callers were
    /// told they timed out. The manager answers in order, so each reply
    /// is the first entry's: a timed-out request's is settled (see
    /// [`Stack::settle`]), not taken for the answer to a later one.
    unanswered: VecDeque<(u64, Msg)>,
    /// Number of the next request.
    next_request: u64,
    /// Requests whose callers wait for the answer without holding this
    /// stack (see [`Stack::begin_request`]): whoever reads their replies
    /// keeps them in `answered` instead of settling them.
    awaited: Vec<u64>,
    /// Answers kept for `awaited` requests: number, request, answer.
    answered: Vec<(u64, Msg, Kept)>,
    /// Messages the control socket had no room for (the manager is not
    /// reading this stack's messages: stopped, or busy sending it news it
    /// has not read yet), in order: channels' releases, and unbinds of
    /// addresses bound late for a caller who was told the bind failed.
    /// Sent before anything else is read or asked; never waited for,
    /// since the manager may be waiting for us.
    unsent: Vec<Msg>,
    /// When the messages left over are tried again from the ring path.
    unsent_due: Option<Instant>,
    /// When a wait that does not sleep (busy polling, non-blocking, a
    /// send waiting for room) next looks at its peers' pidfds while no manager runs (see
    /// [`Stack::dead_manager_tick`]).
    busy_tick_due: Option<Instant>,
    /// A value of the manager's liveness word that said "died" while the
    /// control socket stayed open (see [`Stack::manager_died`]): ignored
    /// until the word changes.
    forged_liveness: Option<u32>,
    /// Bumped whenever the set of channels changes, so a [`Probe`] made
    /// earlier knows it may be missing a ring.
    epoch: Arc<AtomicU64>,
    /// The fork generation of the process that attached (see
    /// [`crate::fork`]).
    born: crate::fork::Birth,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("id", &self.id)
            .field("channels", &self.channels.len())
            .field("mode", &self.mode)
            .finish()
    }
}

impl Stack {
    /// This stack's id in the pool.
    pub fn id(&self) -> PeerId {
        PeerId::new(self.id, self.generation)
    }

    /// The waiting mode of blocking calls.
    pub fn wait_mode(&self) -> WaitMode {
        self.mode
    }

    /// Changes the waiting mode.
    pub fn set_wait_mode(&mut self, mode: WaitMode) {
        self.mode = mode;
    }

    /// The adaptive policy's current state (for benchmarks and tuning).
    pub fn spin_policy(&self) -> &AdaptiveSpin {
        &self.spin
    }

    /// Descriptors this stack refused as corrupt.
    pub fn corrupt_descriptors(&self) -> u64 {
        self.corrupt
    }

    /// Whether this process is a fork of the one that attached the stack
    /// (whose rings and buffers it must leave alone; see [`crate::fork`]).
    #[inline]
    pub(crate) fn segment(&self) -> &Segment {
        &self.seg
    }

    pub(crate) fn forked(&self) -> bool {
        self.born.forked()
    }

    /// [`Error::Forked`] in a forked child.
    #[inline]
    fn check_not_forked(&self) -> Result<(), Error> {
        if self.forked() {
            return Err(Error::Forked);
        }
        Ok(())
    }

    /// Changes the control timeout (see [`StackBuilder::control_timeout`]).
    pub fn set_control_timeout(&mut self, timeout: Duration) {
        self.ctrl_timeout = timeout;
    }

    /// The doorbell fd: readable when the stack should look at its rings.
    pub fn doorbell_fd(&self) -> BorrowedFd<'_> {
        self.bell.fd()
    }

    fn slot(&self) -> &StackSlot {
        self.seg.stack_slot(self.id)
    }

    /// Whether this stack found its manager gone (see
    /// [`Error::ManagerGone`]).
    pub fn manager_gone(&self) -> bool {
        self.manager_gone
    }

    /// The channel to `peer`: to its slot, if the stack there is the one
    /// `peer` names (see [`PeerId`]).
    #[inline]
    fn chan_of(&self, peer: PeerId) -> Option<usize> {
        let &ci = self.by_peer.get(&peer.slot())?;
        peer.names(self.channels[ci].peer_id).then_some(ci)
    }

    /// Peers this stack has a channel to.
    pub fn peers(&self) -> Vec<PeerId> {
        self.channels.iter().map(|c| c.peer_id).collect()
    }
}

impl Drop for Stack {
    /// Tells the manager this stack is gone by half-closing its control
    /// socket. The socket itself stays open as long as a buffer of the
    /// stack lives (the pool keeps it: the manager must not reclaim a
    /// buffer still in use), and the manager used to take the stack for
    /// alive until then: its peers sent into a ring nobody read, without
    /// a reset, and its addresses stayed bound. Reading the end of file,
    /// the manager now resets the peers and frees the addresses, and
    /// reclaims the buffers only once the socket closes.
    fn drop(&mut self) {
        if self.forked() {
            return; // the parent's socket (here an inert copy)
        }
        let _ = rustix::net::shutdown(self.ctrl_fd(), rustix::net::Shutdown::Write);
    }
}

impl AsFd for Stack {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.bell.fd()
    }
}

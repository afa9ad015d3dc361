//! The connection table of the socket layer: a state machine with no I/O
//! (quinn-proto style). Inputs are what arrived (a descriptor's meaning,
//! a peer's death) and what the application asked (connect, listen,
//! accept, read, shutdown, close); outputs are [`Action`]s for the driver:
//! control descriptors to send and connections to wake. The blocking
//! std-like types, the tokio adapter and the C ABI drive the same table.
//!
//! Connection ids carry a generation in their high bits, so a late
//! descriptor for a closed and reused slot is recognised and dropped.
//! Generic over the buffer type so it can be tested without a pool.
//!
//! # Where things are
//! This file holds the types: [`Table`] and its entries, [`ConnId`],
//! [`State`], [`Action`] and [`Chunk`]. The table's methods are split by
//! concern:
//! - `error.rs`: [`ConnError`];
//! - `entries.rs`: the table's slots: ids and their generations, and the
//!   connections closed here whose peer may still send;
//! - `handshake.rs`: listeners, connect, accept, and the SYN / SYN-ACK
//!   exchange;
//! - `input.rs`: what the peer sends (data, FIN, RST) and its death, and
//!   the resets the table answers with;
//! - `flow.rs`: flow control: the window, and credit taken, returned and
//!   given back to the sender;
//! - `read.rs`: reads, peeks and zero-copy takes, and readiness;
//! - `write.rs`: where a write goes, and the reset a write or `SO_ERROR`
//!   reports;
//! - `close.rs`: shutdown, close and abort;
//! - `tests.rs`: unit tests.

use std::collections::VecDeque;

use crate::sync::FxHashMap as HashMap;
use std::net::SocketAddr;

use crate::stack::PeerId;

#[cfg(doc)]
use crate::layout::kind;

mod close;
mod entries;
mod error;
mod flow;
mod handshake;
mod input;
mod read;
#[cfg(test)]
mod tests;
mod write;

pub use error::ConnError;
pub(crate) use read::as_uninit;

/// Bits of a connection id that index the table; the rest is a generation.
const INDEX_BITS: u32 = 20;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
/// Most connections one stack holds at once.
pub const MAX_CONNS: usize = 1 << INDEX_BITS;
/// Most connections remembered as closing (see `Table::closing`): peers
/// that never answer our FINs must not grow the table without bound.
/// Past it the oldest is forgotten and its peer reset, as TCP's
/// FIN-WAIT-2 timeout lets an orphan go.
const CLOSING_MAX: usize = 1 << 16;
/// Generations of a slot skipped, at most, because they are remembered
/// as closing; then the first of them is forgotten (its peer reset) and
/// reissued. A slot reused one connection after another comes back to
/// its oldest generation after 4096 of them (the id's bits above the
/// index), and a peer that never answered any would otherwise hold them
/// all.
const SKIP_MAX: usize = 16;

/// A connection, local to one stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ConnId(pub u32);

impl ConnId {
    pub(crate) fn index(self) -> usize {
        (self.0 & INDEX_MASK) as usize
    }
}

/// A received chunk of a stream: its bytes, and the buffer capacity it
/// occupies (what flow control counts, since that is what the pool loses).
pub trait Chunk: AsRef<[u8]> {
    /// Bytes of pool memory this chunk holds.
    fn footprint(&self) -> usize;
    /// Appends `other`'s bytes to this chunk's if they fit in the memory
    /// it already holds (then `other` can go). Never, by default.
    fn absorb(&mut self, other: &Self) -> bool {
        let _ = other;
        false
    }
}

impl Chunk for Vec<u8> {
    fn footprint(&self) -> usize {
        self.len().max(1)
    }
}

impl Chunk for crate::buf::Buf {
    fn footprint(&self) -> usize {
        self.capacity()
    }
    fn absorb(&mut self, other: &Self) -> bool {
        self.append(other)
    }
}

/// Where a connection stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// SYN sent, waiting for the SYN-ACK.
    SynSent,
    /// Open (either half may have been shut down).
    Established,
    /// Reset by the peer (RST, refused, or the peer process died).
    Reset,
}

/// What the driver must do after an input. Taken with [`Table::poll_action`].
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Send a SYN for `conn` to `peer`, naming `target` and our `source`
    /// address (a SYN carries a buffer with both).
    SendSyn {
        /// Destination stack.
        peer: PeerId,
        /// Our connection.
        conn: ConnId,
        /// The listening address.
        target: SocketAddr,
        /// Our end's address.
        source: SocketAddr,
    },
    /// Send a control descriptor of `kind` (SYN-ACK, FIN, RST, CREDIT) for
    /// the peer's connection `to`, with argument `arg`.
    Control {
        /// Destination stack.
        peer: PeerId,
        /// One of the socket kinds of [`crate::layout::kind`].
        kind: u8,
        /// The receiver's connection id.
        to: u32,
        /// Kind-specific: the acceptor's id for SYN-ACK, bytes for CREDIT.
        arg: u32,
    },
    /// `conn` became readable (data, end of stream, or an error).
    Readable(ConnId),
    /// `conn` got send credit back (or failed): wake its writers.
    Writable(ConnId),
    /// `conn` finished connecting (or failed): wake its `connect`.
    Connected(ConnId),
    /// A connection is waiting to be accepted on `addr`.
    Acceptable(SocketAddr),
}

struct Entry<B> {
    gen: u32,
    peer: PeerId,
    /// The peer's id for this connection (known once established).
    remote: u32,
    state: State,
    refused: bool,
    local_addr: SocketAddr,
    peer_addr: SocketAddr,
    rx: VecDeque<B>,
    /// Bytes of `rx.front()` already read.
    offset: usize,
    peer_fin: bool,
    /// The peer process is gone after a clean FIN: reads end normally,
    /// writes fail.
    peer_gone: bool,
    fin_sent: bool,
    read_shut: bool,
    /// Bytes of buffer capacity we may still send.
    credit: usize,
    /// Closed by the application while its SYN was unanswered: kept until
    /// the answer comes, so it is not taken for a stale id (and reset).
    closed: bool,
    /// For an accepted connection: the initiator's key in `early`.
    early_key: Option<(PeerId, u32)>,
    /// A reset was reported once: reads now return end of stream and
    /// writes `BrokenPipe`, as a TCP socket's do after its `ECONNRESET`.
    reset_reported: bool,
    /// In a listener's queue, not yet accepted: no stream exists for it,
    /// so readiness is not reported (as epoll knows nothing of a socket
    /// not yet accepted and added).
    unaccepted: bool,
    /// Capacity consumed here and not yet credited back to the sender.
    unacked: usize,
}

impl<B> Entry<B> {
    /// The error of a reset connection: refused if it never got through;
    /// a broken pipe if the peer had finished sending (Linux reports a RST
    /// in TCP's close-wait as `EPIPE`).
    fn reset_error(&self) -> ConnError {
        if self.refused {
            ConnError::Refused
        } else if self.peer_fin {
            ConnError::BrokenPipe
        } else {
            ConnError::Reset
        }
    }

    /// What a read of a reset connection returns: the error once, then
    /// end of stream (a refusal stays an error). A peer that had finished
    /// sending (its FIN came before the reset) ends reads with end of
    /// stream and leaves the error to the writes, as Linux, whose read
    /// looks at a received FIN (`SOCK_DONE`) before a pending error.
    fn read_reset(&mut self) -> Result<(), ConnError> {
        if self.peer_fin && !self.refused {
            Ok(())
        } else if self.refused || !self.reset_reported {
            self.reset_reported = true;
            Err(self.reset_error())
        } else {
            Ok(())
        }
    }
}

/// A listening address: connections not yet accepted, and how many of
/// them it holds before refusing more.
#[derive(Debug, Default)]
struct Listener {
    queue: VecDeque<ConnId>,
    backlog: usize,
}

/// A connection closed here whose peer may still send (see
/// `Table::closing`).
#[derive(Clone, Copy, Debug)]
struct Closing {
    peer: PeerId,
    /// The peer's id for it, for the RST.
    remote: u32,
    /// Its key in `Table::early`, if it was accepted.
    early: Option<(PeerId, u32)>,
}

/// A stack's connections and listeners.
pub struct Table<B> {
    entries: Vec<Option<Entry<B>>>,
    gens: Vec<u32>,
    free: Vec<u32>,
    listeners: HashMap<SocketAddr, Listener>,
    actions: VecDeque<Action>,
    window: usize,
    /// Unacknowledged bytes at which a reader credits its writer: a
    /// quarter of the smallest window a writer may have (see
    /// [`Table::set_window_floor`]).
    credit_every: usize,
    /// Accepted connections by (initiator stack, initiator's id), for what
    /// the initiator sent before it knew our id ([`kind::EARLY`]).
    early: HashMap<(PeerId, u32), ConnId>,
    /// Connections closed here after sending their FIN while the peer may
    /// still send (TCP's FIN-WAIT): the peer and its id, so that data
    /// arriving for them is answered with a RST (its writer learns the
    /// connection is gone instead of waiting for credit that never
    /// comes). Forgotten at the peer's FIN or RST, or when it dies. With
    /// the connection's key in `early`, kept there meanwhile: a peer that
    /// closed before it knew our id sends its FIN under its own id.
    closing: HashMap<ConnId, Closing>,
    /// The ids put in `closing`, oldest first (some may have left it):
    /// whom [`CLOSING_MAX`] resets first.
    closing_order: VecDeque<ConnId>,
}

impl<B: Chunk> Table<B> {
    /// An empty table whose connections may each have `window` bytes of
    /// buffer capacity in flight (unread at the receiver). The window must
    /// be at least twice the largest buffer a writer uses, so a writer
    /// waiting for credit is always owed some (see [`Table::read`]).
    pub fn new(window: usize) -> Self {
        Self {
            entries: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
            listeners: HashMap::default(),
            actions: VecDeque::new(),
            window: window.max(2),
            credit_every: window.max(2) / 4,
            early: HashMap::default(),
            closing: HashMap::default(),
            closing_order: VecDeque::new(),
        }
    }

    /// Connections open (in any state), and closed ones whose peer may
    /// still send.
    pub fn len(&self) -> usize {
        self.entries.len() - self.free.len() + self.closing.len()
    }

    /// True when no connection is open.
    #[cfg(any(test, feature = "test-support"))]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next thing the driver must do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }
}

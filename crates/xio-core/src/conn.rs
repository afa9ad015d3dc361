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

use std::collections::VecDeque;

use crate::sync::FxHashMap as HashMap;
use std::net::SocketAddr;

use crate::layout::kind;
use crate::stack::PeerId;

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

/// Initialised bytes as the `MaybeUninit` slice a read writes into.
/// Only for writers that never de-initialise (ours copy bytes in).
pub(crate) fn as_uninit(out: &mut [u8]) -> &mut [std::mem::MaybeUninit<u8>] {
    // SAFETY: initialised bytes are valid `MaybeUninit<u8>`s, same layout;
    // the callers only write initialised bytes through the result.
    unsafe { &mut *(out as *mut [u8] as *mut [std::mem::MaybeUninit<u8>]) }
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

/// Errors of table operations, mapped to `io::ErrorKind` by the drivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// Nothing to read yet (or nothing to accept, or no send credit).
    #[error("operation would block")]
    WouldBlock,
    /// The peer reset the connection or died.
    #[error("connection reset by peer")]
    Reset,
    /// Nobody listens at the address.
    #[error("connection refused")]
    Refused,
    /// The id is not (or no longer) a connection of this table.
    #[error("not connected")]
    NotConnected,
    /// The address already has a listener here.
    #[error("address in use")]
    AddrInUse,
    /// The table is full.
    #[error("too many connections")]
    TooMany,
    /// Writing after `shutdown` or `close`.
    #[error("broken pipe")]
    BrokenPipe,
}

impl From<ConnError> for std::io::Error {
    fn from(e: ConnError) -> Self {
        use std::io::ErrorKind as K;
        let k = match e {
            ConnError::WouldBlock => K::WouldBlock,
            ConnError::Reset => K::ConnectionReset,
            ConnError::Refused => K::ConnectionRefused,
            ConnError::NotConnected => K::NotConnected,
            ConnError::AddrInUse => K::AddrInUse,
            ConnError::TooMany => K::OutOfMemory,
            ConnError::BrokenPipe => K::BrokenPipe,
        };
        std::io::Error::new(k, e)
    }
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
    early_key: Option<(u16, u32)>,
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
    early: Option<(u16, u32)>,
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
    early: HashMap<(u16, u32), ConnId>,
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

    /// The per-connection window.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The smallest window a peer's table may have (each process chooses
    /// its own, and the window is not exchanged): we credit back once a
    /// quarter of the smaller of it and ours has built up, so a writer
    /// with a window below ours is credited before it runs dry (see
    /// [`Table::new`]). Without it, a writer whose whole window is less
    /// than a quarter of ours would wait for credit for good.
    pub fn set_window_floor(&mut self, floor: usize) {
        self.credit_every = self.window.min(floor.max(2)) / 4;
    }

    /// Connections open (in any state), and closed ones whose peer may
    /// still send.
    pub fn len(&self) -> usize {
        self.entries.len() - self.free.len() + self.closing.len()
    }

    /// True when no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The next thing the driver must do, if any.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    fn insert(
        &mut self,
        peer: PeerId,
        remote: u32,
        state: State,
        local_addr: SocketAddr,
        peer_addr: SocketAddr,
    ) -> Result<ConnId, ConnError> {
        let i = match self.free.pop() {
            Some(i) => i as usize,
            None => {
                if self.entries.len() >= MAX_CONNS {
                    return Err(ConnError::TooMany);
                }
                self.entries.push(None);
                self.gens.push(0);
                self.entries.len() - 1
            }
        };
        // An id still remembered as closing (see `closing`) is not handed
        // out again: the old peer's late data or FIN would reach the new
        // connection. Skip its generation, a few at most (`SKIP_MAX`).
        let first = self.gens[i];
        let mut skipped = 0;
        while self
            .closing
            .contains_key(&ConnId(self.gens[i] << INDEX_BITS | i as u32))
        {
            skipped += 1;
            if skipped == SKIP_MAX {
                self.gens[i] = first;
                self.forget_closing(ConnId(first << INDEX_BITS | i as u32));
                break;
            }
            self.gens[i] = (self.gens[i] + 1) & (u32::MAX >> INDEX_BITS);
        }
        let gen = self.gens[i];
        self.entries[i] = Some(Entry {
            gen,
            peer,
            remote,
            state,
            refused: false,
            local_addr,
            peer_addr,
            rx: VecDeque::new(),
            offset: 0,
            peer_fin: false,
            peer_gone: false,
            fin_sent: false,
            read_shut: false,
            credit: self.window,
            unacked: 0,
            closed: false,
            early_key: None,
            unaccepted: false,
            reset_reported: false,
        });
        Ok(ConnId(gen << INDEX_BITS | i as u32))
    }

    fn get(&self, c: ConnId) -> Option<&Entry<B>> {
        self.entries
            .get(c.index())?
            .as_ref()
            .filter(|e| e.gen == c.0 >> INDEX_BITS)
    }

    fn get_mut(&mut self, c: ConnId) -> Option<&mut Entry<B>> {
        self.entries
            .get_mut(c.index())?
            .as_mut()
            .filter(|e| e.gen == c.0 >> INDEX_BITS)
    }

    fn remove(&mut self, c: ConnId) -> Option<Entry<B>> {
        self.get(c)?;
        let i = c.index();
        self.gens[i] = (self.gens[i] + 1) & (u32::MAX >> INDEX_BITS);
        self.free.push(i as u32);
        let e = self.entries[i].take();
        if let Some(k) = e.as_ref().and_then(|e| e.early_key) {
            self.forget_early(k, c);
        }
        e
    }

    /// Forgets the early route `k` if it still leads to `c`: the
    /// initiator's id comes back once its slot's generations wrap, and
    /// then the route is a newer connection's.
    fn forget_early(&mut self, k: (u16, u32), c: ConnId) {
        if self.early.get(&k) == Some(&c) {
            self.early.remove(&k);
        }
    }

    /// Our connection for what `peer` sent with its own id `remote`
    /// ([`kind::EARLY`]).
    pub fn early_conn(&self, peer: PeerId, remote: u32) -> Option<ConnId> {
        self.early.get(&(peer.0, remote)).copied()
    }

    /// Whether `c` still waits for its SYN-ACK.
    pub fn is_connecting(&self, c: ConnId) -> bool {
        self.get(c).is_some_and(|e| e.state == State::SynSent)
    }

    /// The stack a connection goes to.
    pub fn peer_of(&self, c: ConnId) -> Option<PeerId> {
        self.get(c).map(|e| e.peer)
    }

    /// A RST that answers input naming no connection of ours (refused,
    /// stale or forged): the driver may drop it for a peer that does not
    /// drain its ring (see [`kind::RST_ENDS`]).
    fn rst(&mut self, peer: PeerId, to: u32) {
        self.actions.push_back(Action::Control {
            peer,
            kind: kind::RST,
            to,
            arg: 0,
        });
    }

    /// A RST that ends a connection the peer still holds (closed here
    /// with unread data, never accepted, or forgotten while closing): it
    /// must arrive, or the peer's reader and writer wait for good.
    fn reset(&mut self, peer: PeerId, to: u32) {
        self.actions.push_back(Action::Control {
            peer,
            kind: kind::RST,
            to,
            arg: kind::RST_ENDS,
        });
    }

    /// Whether a listener is on `addr`.
    pub fn is_listening(&self, addr: &SocketAddr) -> bool {
        self.listeners.contains_key(addr)
    }

    /// The listener a SYN for `target` goes to: the one on `target`, else
    /// one on a wildcard address of its port (`0.0.0.0`, `[::]`; see
    /// [`crate::addr`]). Which addresses may reach a wildcard listener is
    /// the resolver's choice (the manager's, or the connecting stack's for
    /// its own listeners); a SYN from another stack is checked against it
    /// again ([`Table::on_syn_from`]).
    pub fn listener_for(&self, target: &SocketAddr) -> Option<SocketAddr> {
        crate::addr::bindings_for(*target).find(|a| self.listeners.contains_key(a))
    }

    /// Starts listening on `addr`, holding at most `backlog` (at least
    /// one) connections not yet accepted: a SYN beyond them is refused,
    /// so a client that connects faster than the server accepts, or a
    /// hostile one, cannot grow the table (and the data its connections
    /// may send before being accepted) without bound.
    pub fn listen(&mut self, addr: SocketAddr, backlog: usize) -> Result<(), ConnError> {
        if self.listeners.contains_key(&addr) {
            return Err(ConnError::AddrInUse);
        }
        self.listeners.insert(
            addr,
            Listener {
                queue: VecDeque::new(),
                backlog: backlog.max(1),
            },
        );
        Ok(())
    }

    /// Stops listening; connections not yet accepted are reset.
    pub fn unlisten(&mut self, addr: SocketAddr) {
        for c in self.listeners.remove(&addr).unwrap_or_default().queue {
            if let Some(e) = self.remove(c) {
                if e.state == State::Established {
                    self.reset(e.peer, e.remote);
                }
            }
        }
    }

    /// Opens a connection from `source` to `target` on stack `peer`.
    pub fn connect(
        &mut self,
        peer: PeerId,
        target: SocketAddr,
        source: SocketAddr,
    ) -> Result<ConnId, ConnError> {
        let c = self.insert(peer, 0, State::SynSent, source, target)?;
        self.actions.push_back(Action::SendSyn {
            peer,
            conn: c,
            target,
            source,
        });
        Ok(c)
    }

    /// Takes the next connection waiting on `addr`.
    pub fn accept(&mut self, addr: SocketAddr) -> Result<ConnId, ConnError> {
        let l = self
            .listeners
            .get_mut(&addr)
            .ok_or(ConnError::NotConnected)?;
        let c = l.queue.pop_front().ok_or(ConnError::WouldBlock)?;
        if let Some(e) = self.get_mut(c) {
            e.unaccepted = false;
        }
        Ok(c)
    }

    /// Whether `c` waits in a listener's queue (see [`Table::accept`]).
    pub fn is_unaccepted(&self, c: ConnId) -> bool {
        self.get(c).is_some_and(|e| e.unaccepted)
    }

    /// A SYN from `peer` (whose id for it is `remote`) for `target`, from
    /// `source`, whose target was resolved by this table's owner (a
    /// connect of its own): see [`Table::on_syn_from`] for another stack's.
    pub fn on_syn(&mut self, peer: PeerId, remote: u32, target: SocketAddr, source: SocketAddr) {
        self.on_syn_from(peer, remote, target, source, |_| true)
    }

    /// [`Table::on_syn`] for a SYN another stack wrote: it reaches a
    /// wildcard listener only if `this_node` says its target's address is
    /// one of this node's, as the manager's resolution requires (see
    /// [`crate::addr`]). The target is the peer's word: without the check
    /// a stack with a channel to us reached our `0.0.0.0:port` listener
    /// at any address it liked, another machine's included, and chose the
    /// accepted stream's `local_addr`.
    pub fn on_syn_from(
        &mut self,
        peer: PeerId,
        remote: u32,
        target: SocketAddr,
        source: SocketAddr,
        this_node: impl FnOnce(std::net::IpAddr) -> bool,
    ) {
        let Some(key) = self.listener_for(&target) else {
            return self.rst(peer, remote); // nobody listens: refused
        };
        if key.ip().is_unspecified()
            && !crate::addr::exact_names(target).any(|a| a == key)
            && !this_node(target.ip())
        {
            return self.rst(peer, remote); // not an address of this node
        }
        match self.listeners.get(&key) {
            Some(l) if l.queue.len() < l.backlog => {}
            // The backlog is full: refused.
            _ => return self.rst(peer, remote),
        }
        match self.insert(peer, remote, State::Established, target, source) {
            Ok(c) => {
                if let Some(e) = self.get_mut(c) {
                    e.early_key = Some((peer.0, remote));
                    e.unaccepted = true;
                }
                self.early.insert((peer.0, remote), c);
                self.listeners
                    .get_mut(&key)
                    .expect("checked")
                    .queue
                    .push_back(c);
                self.actions.push_back(Action::Control {
                    peer,
                    kind: kind::SYN_ACK,
                    to: remote,
                    arg: c.0,
                });
                self.actions.push_back(Action::Acceptable(key));
            }
            Err(_) => self.rst(peer, remote),
        }
    }

    /// A SYN-ACK for our `local` connection; the peer's id is `remote`.
    pub fn on_syn_ack(&mut self, peer: PeerId, local: ConnId, remote: u32) {
        match self.get_mut(local) {
            Some(e) if e.state == State::SynSent && e.peer == peer && e.closed => {
                // Closed meanwhile; its FIN already went (early). What the
                // peer still sends gets a RST.
                self.remove(local);
                self.remember_closing(
                    local,
                    Closing {
                        peer,
                        remote,
                        early: None,
                    },
                );
            }
            Some(e) if e.state == State::SynSent && e.peer == peer => {
                e.state = State::Established;
                e.remote = remote;
                self.actions.push_back(Action::Connected(local));
            }
            // Stale or forged: tell the sender its connection is dead.
            _ => self.rst(peer, remote),
        }
    }

    /// Stream bytes for `local` from `peer`. A buffer for an unknown or
    /// finished connection is dropped (back to the pool by its `Drop`),
    /// answered with a RST when the connection still exists.
    pub fn on_data(&mut self, peer: PeerId, local: ConnId, buf: B) {
        let window = self.window;
        let Some(e) = self.get_mut(local) else {
            self.after_close(peer, local, true);
            return;
        };
        if e.peer != peer {
            return;
        }
        if e.state == State::Established && !e.peer_fin {
            if e.read_shut {
                // Discarded, and credited at once so the writer goes on.
                let n = buf.footprint();
                let to = e.remote;
                self.credit(peer, to, n);
                return;
            }
            // A sender that ignores its window only hurts itself: its
            // excess waits here, and `unacked` is capped when credited.
            let _ = window;
            // No bytes (a zero-copy writer's empty buffer): nothing to
            // read, so nothing queued, as TCP gives a reader no empty
            // segment. Queued, it stood for data ahead of a reset or the
            // end: a peek waited on it for good, and a read said
            // `WouldBlock` with the reset (or end) behind it.
            if buf.as_ref().is_empty() {
                let n = buf.footprint();
                drop(buf);
                self.consumed(local, n);
                return;
            }
            // A reader that lags: pack the bytes into the last chunk's
            // spare room and let this buffer go (credited now), so the
            // window counts bytes rather than buffers. Otherwise a
            // thousand 10-byte writes hold a thousand 2 KiB buffers, fill
            // the window, and a pipelining peer that reads only after it
            // has written deadlocks with its server.
            if let Some(last) = e.rx.back_mut() {
                if last.absorb(&buf) {
                    let n = buf.footprint();
                    drop(buf);
                    // New bytes, a new readiness event (as epoll's edge
                    // triggering gives for every arrival).
                    self.actions.push_back(Action::Readable(local));
                    self.consumed(local, n);
                    return;
                }
            }
            e.rx.push_back(buf);
            self.actions.push_back(Action::Readable(local));
        } else if e.state == State::Established {
            let to = e.remote;
            self.rst(peer, to);
        }
    }

    fn credit(&mut self, peer: PeerId, to: u32, bytes: usize) {
        self.actions.push_back(Action::Control {
            peer,
            kind: kind::CREDIT,
            to,
            arg: bytes.min(u32::MAX as usize) as u32,
        });
    }

    /// The peer consumed `bytes` of what `local` sent.
    pub fn on_credit(&mut self, peer: PeerId, local: ConnId, bytes: u32) {
        let window = self.window;
        if let Some(e) = self.get_mut(local) {
            if e.peer == peer {
                e.credit = (e.credit + bytes as usize).min(window);
                self.actions.push_back(Action::Writable(local));
            }
        }
    }

    /// The peer will send no more on `local`.
    pub fn on_fin(&mut self, peer: PeerId, local: ConnId) {
        if let Some(e) = self.get_mut(local) {
            if e.peer == peer {
                e.peer_fin = true;
                self.actions.push_back(Action::Readable(local));
            }
        } else {
            self.after_close(peer, local, false);
        }
    }

    /// Input from `peer` for `local`, which is no longer a connection: if
    /// we closed it while the peer could still send, the peer's FIN or RST
    /// ends that wait, and data is answered with a RST (the buffer itself
    /// is dropped, back to the pool).
    fn after_close(&mut self, peer: PeerId, local: ConnId, data: bool) {
        let Some(&Closing {
            peer: p,
            remote,
            early,
        }) = self.closing.get(&local)
        else {
            return;
        };
        if p == peer {
            self.closing.remove(&local);
            if let Some(k) = early {
                self.forget_early(k, local);
            }
            if data {
                self.reset(peer, remote);
            }
        }
    }

    /// The peer reset `local` (or refused it, if we were connecting).
    pub fn on_rst(&mut self, peer: PeerId, local: ConnId) {
        let Some(e) = self.get_mut(local) else {
            self.after_close(peer, local, false);
            return;
        };
        if e.peer != peer || e.state == State::Reset {
            return;
        }
        if e.closed {
            self.remove(local);
            return;
        }
        let was_connecting = e.state == State::SynSent;
        e.refused = was_connecting;
        e.state = State::Reset;
        // What arrived before the reset stays readable, as on Linux (an
        // HTTP server that answers 413 and closes while the client still
        // uploads: the client must read the answer, then the reset).
        if was_connecting {
            self.actions.push_back(Action::Connected(local));
        }
        self.actions.push_back(Action::Readable(local));
        self.actions.push_back(Action::Writable(local));
    }

    /// Stack `peer` died or left: its connections are reset, except that
    /// one it had closed cleanly (FIN) still reads to its end, as with TCP
    /// when a process exits after closing its socket.
    pub fn on_peer_gone(&mut self, peer: PeerId) {
        let early = &mut self.early;
        self.closing.retain(|_, c| {
            if c.peer == peer {
                if let Some(k) = &c.early {
                    early.remove(k);
                }
            }
            c.peer != peer
        });
        let ids: Vec<ConnId> = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let e = e.as_ref()?;
                (e.peer == peer).then_some(ConnId(e.gen << INDEX_BITS | i as u32))
            })
            .collect();
        for c in ids {
            match self.get_mut(c) {
                Some(e) if e.closed => {
                    self.remove(c);
                }
                Some(e) if e.peer_fin && e.state == State::Established => {
                    e.peer_gone = true;
                    self.actions.push_back(Action::Writable(c));
                }
                _ => self.on_rst(peer, c),
            }
        }
    }

    /// The result of a `connect` once [`Action::Connected`] fired.
    pub fn connect_result(&self, c: ConnId) -> Result<(), ConnError> {
        match self.get(c) {
            None => Err(ConnError::NotConnected),
            Some(e) if e.refused => Err(ConnError::Refused),
            Some(e) => match e.state {
                State::Established => Ok(()),
                State::SynSent => Err(ConnError::WouldBlock),
                State::Reset => Err(ConnError::Reset),
            },
        }
    }

    /// Changes our address for `c` (a connecting stream's address depends
    /// on its id, known only once it is inserted).
    pub fn set_local_addr(&mut self, c: ConnId, addr: SocketAddr) {
        if let Some(e) = self.get_mut(c) {
            e.local_addr = addr;
        }
    }

    /// Our address and the peer's for `c`.
    pub fn addrs(&self, c: ConnId) -> Result<(SocketAddr, SocketAddr), ConnError> {
        let e = self.get(c).ok_or(ConnError::NotConnected)?;
        Ok((e.local_addr, e.peer_addr))
    }

    /// The peer's address for `c`, as `getpeername` gives it: none
    /// (`NotConnected`) once `c` was reset or refused, as a TCP socket in
    /// state CLOSE answers `ENOTCONN`.
    pub fn peer_addr(&self, c: ConnId) -> Result<SocketAddr, ConnError> {
        match self.get(c) {
            Some(e) if e.state != State::Reset => Ok(e.peer_addr),
            _ => Err(ConnError::NotConnected),
        }
    }

    /// Records that `bytes` of capacity were consumed on `c`, and credits
    /// the sender once a quarter of the window (of the smallest a writer
    /// may have, [`Table::set_window_floor`]) has built up. A writer that
    /// waits needs at most half its window (see [`Table::new`]), so when
    /// the reader has drained everything it is owed at least half, and a
    /// quarter always triggers: no deadlock.
    fn consumed(&mut self, c: ConnId, bytes: usize) {
        let threshold = self.credit_every;
        let Some(e) = self.get_mut(c) else { return };
        e.unacked += bytes;
        if e.unacked >= threshold && e.state == State::Established {
            let (peer, to, n) = (e.peer, e.remote, e.unacked);
            e.unacked = 0;
            self.credit(peer, to, n);
        }
    }

    /// Copies received bytes into `out`: `Ok(0)` is end of stream (after
    /// every byte sent before the FIN). Bytes come in order, and a read
    /// may return part of one buffer or parts of several.
    pub fn read(&mut self, c: ConnId, out: &mut [u8]) -> Result<usize, ConnError> {
        self.read_uninit(c, as_uninit(out))
    }

    /// [`Table::read`] into memory that may be uninitialised (a runtime's
    /// read buffer): the first `n` bytes of `out` are written, nothing else
    /// is touched.
    pub fn read_uninit(
        &mut self,
        c: ConnId,
        out: &mut [std::mem::MaybeUninit<u8>],
    ) -> Result<usize, ConnError> {
        self.read_uninit_with(c, out, drop)
    }

    /// As [`Self::read_uninit`], handing each chunk read to the end to
    /// `spent` instead of dropping it (the socket layer reuses their
    /// buffers for its next writes).
    pub fn read_uninit_with(
        &mut self,
        c: ConnId,
        out: &mut [std::mem::MaybeUninit<u8>],
        spent: impl FnMut(B),
    ) -> Result<usize, ConnError> {
        self.read_vectored_uninit_with(c, std::iter::once(out), spent)
    }

    /// As [`Self::read_uninit_with`] into several buffers, filled in order
    /// as far as the received bytes go (as `readv` on a TCP socket): a
    /// buffer is only started once the ones before it are full. Empty
    /// buffers are skipped; if all are, the read is `Ok(0)` at once.
    pub fn read_vectored_uninit_with<'o>(
        &mut self,
        c: ConnId,
        outs: impl IntoIterator<Item = &'o mut [std::mem::MaybeUninit<u8>]>,
        mut spent: impl FnMut(B),
    ) -> Result<usize, ConnError> {
        let e = self.get_mut(c).ok_or(ConnError::NotConnected)?;
        if e.state == State::Reset && e.rx.is_empty() {
            return e.read_reset().map(|()| 0);
        }
        if e.read_shut {
            return Ok(0);
        }
        let mut n = 0;
        let mut consumed = 0;
        let mut room = false;
        'outs: for out in outs {
            room |= !out.is_empty();
            let mut m = 0;
            while m < out.len() {
                let Some(front) = e.rx.front() else {
                    break 'outs;
                };
                let bytes = &front.as_ref()[e.offset..];
                let k = bytes.len().min(out.len() - m);
                for (d, &b) in out[m..m + k].iter_mut().zip(&bytes[..k]) {
                    d.write(b);
                }
                m += k;
                n += k;
                e.offset += k;
                if e.offset == front.as_ref().len() {
                    consumed += front.footprint();
                    if let Some(b) = e.rx.pop_front() {
                        spent(b);
                    }
                    e.offset = 0;
                }
            }
        }
        let fin = e.peer_fin;
        if consumed > 0 {
            self.consumed(c, consumed);
        }
        if n > 0 || !room {
            Ok(n)
        } else if fin {
            Ok(0)
        } else {
            Err(ConnError::WouldBlock)
        }
    }

    /// [`Table::peek`] as `MSG_PEEK` has it: a reset it reports is
    /// reported once, as by a read (Linux's peek clears the socket's
    /// error too: the next peek or read is end of stream, `SO_ERROR` 0).
    pub fn peek_reporting(&mut self, c: ConnId, out: &mut [u8]) -> Result<usize, ConnError> {
        let e = self.get_mut(c).ok_or(ConnError::NotConnected)?;
        if e.state == State::Reset && e.rx.is_empty() {
            return e.read_reset().map(|()| 0);
        }
        self.peek(c, out)
    }

    /// Copies received bytes into `out` without consuming them (a later
    /// read returns them again): `Ok(0)` is end of stream. A reset it
    /// reports is left for the next read (readiness looks with this).
    pub fn peek(&mut self, c: ConnId, out: &mut [u8]) -> Result<usize, ConnError> {
        let e = self.get(c).ok_or(ConnError::NotConnected)?;
        if e.state == State::Reset && e.rx.is_empty() {
            return if (e.reset_reported || e.peer_fin) && !e.refused {
                Ok(0)
            } else {
                Err(e.reset_error())
            };
        }
        if e.read_shut {
            return Ok(0);
        }
        let mut n = 0;
        let mut offset = e.offset;
        for b in &e.rx {
            if n == out.len() {
                break;
            }
            let bytes = &b.as_ref()[offset..];
            let k = bytes.len().min(out.len() - n);
            out[n..n + k].copy_from_slice(&bytes[..k]);
            n += k;
            offset = 0;
        }
        if n > 0 || out.is_empty() {
            Ok(n)
        } else if e.peer_fin {
            Ok(0)
        } else {
            Err(ConnError::WouldBlock)
        }
    }

    /// Takes the next received chunk whole (the zero-copy read), with the
    /// number of its bytes already consumed by ordinary reads. `Ok(None)`
    /// is end of stream.
    pub fn take_chunk(&mut self, c: ConnId) -> Result<Option<(B, usize)>, ConnError> {
        let e = self.get_mut(c).ok_or(ConnError::NotConnected)?;
        if e.state == State::Reset && e.rx.is_empty() {
            return e.read_reset().map(|()| None);
        }
        if e.read_shut {
            return Ok(None);
        }
        match e.rx.pop_front() {
            Some(b) => {
                let off = std::mem::take(&mut e.offset);
                self.consumed(c, b.footprint());
                Ok(Some((b, off)))
            }
            None if e.peer_fin => Ok(None),
            None => Err(ConnError::WouldBlock),
        }
    }

    /// What a poller starting late must hear of, as epoll reports a
    /// socket's readiness when it is added: the connections a read would
    /// not wait on, and those a write may go on (connected: every one not
    /// waiting for its SYN-ACK), as (connection, readable, writable); and
    /// listeners with connections to accept.
    pub fn ready_now(&self) -> (Vec<(ConnId, bool, bool)>, Vec<SocketAddr>) {
        let conns = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let e = e.as_ref().filter(|e| !e.unaccepted && !e.closed)?;
                let readable =
                    !e.rx.is_empty() || e.peer_fin || e.read_shut || e.state == State::Reset;
                let writable = readable || e.state != State::SynSent;
                (readable || writable).then_some((
                    ConnId(e.gen << INDEX_BITS | i as u32),
                    readable,
                    writable,
                ))
            })
            .collect();
        let accepts = self
            .listeners
            .iter()
            .filter(|(_, l)| !l.queue.is_empty())
            .map(|(a, _)| *a)
            .collect();
        (conns, accepts)
    }

    /// Whether nothing more can come from the peer on `c` that a close
    /// should look at: its FIN or a reset is in, or this end shut reads
    /// (what comes then is dropped anyway).
    pub fn input_ended(&self, c: ConnId) -> bool {
        self.get(c)
            .is_none_or(|e| e.peer_fin || e.read_shut || e.state == State::Reset)
    }

    /// Whether a read on `c` would return at once (data, end, or error).
    pub fn is_readable(&self, c: ConnId) -> bool {
        self.get(c).is_none_or(|e| {
            !e.rx.is_empty() || e.peer_fin || e.read_shut || e.state == State::Reset
        })
    }

    /// Where a write on `c` goes: the peer stack, the id to address, and
    /// the flag to add to the kind ([`kind::EARLY`] while the SYN is
    /// unanswered: then the id is our own). A reset is reported once (by
    /// this or a read), then writes fail with `BrokenPipe`, as on Linux.
    pub fn send_target(&mut self, c: ConnId) -> Result<(PeerId, u32, u8), ConnError> {
        let e = self.get_mut(c).ok_or(ConnError::NotConnected)?;
        match e.state {
            State::Reset if e.reset_reported && !e.refused => Err(ConnError::BrokenPipe),
            State::Reset => {
                e.reset_reported = true;
                Err(e.reset_error())
            }
            _ if e.fin_sent => Err(ConnError::BrokenPipe),
            State::SynSent => Ok((e.peer, c.0, kind::EARLY)),
            // The peer finished, then its process went: as a RST in
            // close-wait.
            State::Established if e.peer_gone => Err(ConnError::BrokenPipe),
            State::Established => Ok((e.peer, e.remote, 0)),
        }
    }

    /// The peer a write on `c` would go to, or `None` if it would fail:
    /// what [`Table::send_target`] says, without reporting a reset (a
    /// readiness check, whose error is the next read's or write's).
    pub fn send_peer(&self, c: ConnId) -> Option<PeerId> {
        let e = self.get(c)?;
        match e.state {
            State::Reset => None,
            _ if e.fin_sent => None,
            State::Established if e.peer_gone => None,
            State::SynSent | State::Established => Some(e.peer),
        }
    }

    /// A reset that a write reported but whose caller was told of a
    /// partial write instead: the next call reports it again.
    pub fn unreport_reset(&mut self, c: ConnId) {
        if let Some(e) = self.get_mut(c) {
            if e.state == State::Reset {
                e.reset_reported = false;
            }
        }
    }

    /// The error that ended `c`, once, as a socket's `SO_ERROR`: a
    /// refusal or reset no read or write has reported yet. Taking it
    /// counts as reporting it: reads then end (after what arrived before
    /// it) and writes fail with `BrokenPipe`, as on Linux once `SO_ERROR`
    /// was read; a refusal stays the reads' error.
    pub fn take_error(&mut self, c: ConnId) -> Option<ConnError> {
        let e = self.get_mut(c)?;
        if e.state != State::Reset || e.reset_reported {
            return None;
        }
        e.reset_reported = true;
        Some(e.reset_error())
    }

    /// Send credit left on `c`, in bytes of buffer capacity.
    pub fn credit_left(&self, c: ConnId) -> usize {
        self.get(c).map_or(0, |e| e.credit)
    }

    /// Takes `bytes` of send credit for a buffer about to be sent on `c`.
    pub fn take_credit(&mut self, c: ConnId, bytes: usize) -> Result<(), ConnError> {
        self.send_target(c)?;
        let e = self.get_mut(c).expect("checked by send_target");
        if e.credit < bytes {
            return Err(ConnError::WouldBlock);
        }
        e.credit -= bytes;
        Ok(())
    }

    /// Gives back credit taken for a buffer that was not sent after all.
    pub fn return_credit(&mut self, c: ConnId, bytes: usize) {
        let window = self.window;
        if let Some(e) = self.get_mut(c) {
            e.credit = (e.credit + bytes).min(window);
        }
    }

    /// No more writes on `c` (the peer reads end of stream after our data).
    /// A reset (or refused) connection is `NotConnected`, as Linux's
    /// `shutdown` says `ENOTCONN` once a RST closed the socket.
    pub fn shutdown_write(&mut self, c: ConnId) -> Result<(), ConnError> {
        let e = self.get_mut(c).ok_or(ConnError::NotConnected)?;
        if e.state == State::Reset {
            return Err(ConnError::NotConnected);
        }
        if e.fin_sent || e.peer_gone {
            return Ok(());
        }
        e.fin_sent = true;
        let (peer, to, k) = if e.state == State::SynSent {
            (e.peer, c.0, kind::FIN | kind::EARLY)
        } else {
            (e.peer, e.remote, kind::FIN)
        };
        self.actions.push_back(Action::Control {
            peer,
            kind: k,
            to,
            arg: 0,
        });
        // A writer waiting for credit on `c` learns at once that it may
        // not write any more (`BrokenPipe`, as Linux's EPIPE).
        self.actions.push_back(Action::Writable(c));
        Ok(())
    }

    /// No more reads on `c`: reads return end of stream, what is queued
    /// and what still arrives is discarded (and credited back). A reset
    /// connection is `NotConnected`, as for [`Table::shutdown_write`].
    pub fn shutdown_read(&mut self, c: ConnId) -> Result<(), ConnError> {
        let e = self.get_mut(c).ok_or(ConnError::NotConnected)?;
        if e.state == State::Reset {
            return Err(ConnError::NotConnected);
        }
        e.read_shut = true;
        let n: usize = e.rx.drain(..).map(|b| b.footprint()).sum();
        e.offset = 0;
        self.actions.push_back(Action::Readable(c));
        if n > 0 {
            self.consumed(c, n);
        }
        Ok(())
    }

    /// Every connection the program has not closed (accepted or not).
    pub fn open_ids(&self) -> Vec<ConnId> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let e = e.as_ref()?;
                (!e.closed).then_some(ConnId(e.gen << INDEX_BITS | i as u32))
            })
            .collect()
    }

    /// Closes `c`: a FIN if everything received was read, else a RST (as
    /// TCP does when unread data is discarded). The id is dead afterwards.
    pub fn close(&mut self, c: ConnId) {
        if let Some(e) = self.get_mut(c) {
            if e.state == State::SynSent {
                // Unanswered SYN: say FIN now (early), and keep the entry
                // until the answer, which would otherwise look stale and
                // be reset, losing what we sent.
                e.closed = true;
                e.rx.clear();
                if !e.fin_sent {
                    e.fin_sent = true;
                    let peer = e.peer;
                    self.actions.push_back(Action::Control {
                        peer,
                        kind: kind::FIN | kind::EARLY,
                        to: c.0,
                        arg: 0,
                    });
                }
                return;
            }
        }
        let Some(e) = self.remove(c) else { return };
        if e.state != State::Established || e.peer_gone {
            return;
        }
        if !e.rx.is_empty() {
            self.reset(e.peer, e.remote);
            return;
        }
        if !e.fin_sent {
            self.actions.push_back(Action::Control {
                peer: e.peer,
                kind: kind::FIN,
                to: e.remote,
                arg: 0,
            });
        }
        if !e.peer_fin {
            if let Some(k) = e.early_key {
                // Unless a newer connection took the route meanwhile.
                self.early.entry(k).or_insert(c);
            }
            self.remember_closing(
                c,
                Closing {
                    peer: e.peer,
                    remote: e.remote,
                    early: e.early_key,
                },
            );
        }
    }

    /// Closes `c` with a reset, whatever it holds (an abortive close, as
    /// TCP's with `SO_LINGER` of zero): what it received unread is
    /// dropped and the peer's reads see `ConnectionReset`. An unanswered
    /// SYN is closed as [`Table::close`] closes it: the peer has no
    /// connection to reset yet. The id is dead afterwards.
    pub fn abort(&mut self, c: ConnId) {
        if self.get(c).is_some_and(|e| e.state == State::SynSent) {
            return self.close(c);
        }
        let Some(e) = self.remove(c) else { return };
        if e.state == State::Established && !e.peer_gone {
            self.reset(e.peer, e.remote);
        }
    }

    /// Stops remembering `c` as closing, resetting its peer (which may
    /// still write, and must not wait for credit for good).
    fn forget_closing(&mut self, c: ConnId) {
        if let Some(o) = self.closing.remove(&c) {
            if let Some(k) = o.early {
                self.forget_early(k, c);
            }
            self.reset(o.peer, o.remote);
        }
    }

    /// Remembers `c` as closing (see `closing`). Past [`CLOSING_MAX`] the
    /// oldest is forgotten and its peer reset: a peer that never answers
    /// our FINs would otherwise grow the table without bound (and, with
    /// one slot reused each time, take every generation of it).
    fn remember_closing(&mut self, c: ConnId, what: Closing) {
        self.closing.insert(c, what);
        self.closing_order.push_back(c);
        while self.closing.len() > CLOSING_MAX {
            let Some(old) = self.closing_order.pop_front() else {
                break;
            };
            // Ids whose peer has answered since are stale here.
            self.forget_closing(old);
        }
        // Ids answered meanwhile pile up here: drop them now and then.
        if self.closing_order.len() > 2 * self.closing.len() + 64 {
            let closing = &self.closing;
            self.closing_order.retain(|k| closing.contains_key(k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Generations of one slot (the id's bits above the index).
    const GENERATIONS: usize = 1 << (32 - INDEX_BITS);

    fn a(p: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], p))
    }

    fn src() -> SocketAddr {
        SocketAddr::from(([127, 88, 0, 1], 5000))
    }

    fn actions<B: Chunk>(t: &mut Table<B>) -> Vec<Action> {
        std::iter::from_fn(|| t.poll_action()).collect()
    }

    /// Two tables wired back to back: `c` on stack 1, `s` on stack 2.
    fn handshake() -> (Table<Vec<u8>>, Table<Vec<u8>>, ConnId, ConnId) {
        handshake_of()
    }

    fn handshake_of<B: Chunk>() -> (Table<B>, Table<B>, ConnId, ConnId) {
        let mut c = Table::new(64);
        let mut s = Table::new(64);
        s.listen(a(80), 16).unwrap();
        let cid = c.connect(PeerId(2), a(80), src()).unwrap();
        let acts = actions(&mut c);
        let [Action::SendSyn {
            conn,
            target,
            source,
            ..
        }] = acts[..]
        else {
            panic!("{acts:?}")
        };
        s.on_syn(PeerId(1), conn.0, target, source);
        let acts = actions(&mut s);
        let Action::Control {
            kind: kind::SYN_ACK,
            to,
            arg: from,
            ..
        } = acts[0]
        else {
            panic!("{acts:?}")
        };
        assert_eq!(acts[1], Action::Acceptable(a(80)));
        let sid = s.accept(a(80)).unwrap();
        assert_eq!(sid.0, from);
        assert_eq!(s.addrs(sid).unwrap(), (a(80), src()));
        c.on_syn_ack(PeerId(2), ConnId(to), from);
        assert_eq!(actions(&mut c), vec![Action::Connected(cid)]);
        assert_eq!(c.connect_result(cid), Ok(()));
        (c, s, cid, sid)
    }

    #[test]
    fn handshake_data_partial_reads_and_fin() {
        let (mut c, mut s, cid, sid) = handshake();
        let (peer, to, flag) = c.send_target(cid).unwrap();
        assert_eq!((peer, to, flag), (PeerId(2), sid.0, 0));
        s.on_data(PeerId(1), sid, b"hello ".to_vec());
        s.on_data(PeerId(1), sid, b"world".to_vec());
        let mut buf = [0u8; 3];
        let mut got = Vec::new();
        while let Ok(n) = s.read(sid, &mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"hello world");
        assert_eq!(s.read(sid, &mut buf), Err(ConnError::WouldBlock));
        c.shutdown_write(cid).unwrap();
        assert_eq!(
            actions(&mut c),
            vec![
                Action::Control {
                    peer: PeerId(2),
                    kind: kind::FIN,
                    to: sid.0,
                    arg: 0
                },
                Action::Writable(cid)
            ]
        );
        assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
        s.on_fin(PeerId(1), sid);
        assert_eq!(s.read(sid, &mut buf), Ok(0), "end of stream");
        // Half-close: the server can still write back.
        assert!(s.send_target(sid).is_ok());
    }

    /// A chunk with room to spare, as a pool buffer has.
    struct Roomy(Vec<u8>);

    impl AsRef<[u8]> for Roomy {
        fn as_ref(&self) -> &[u8] {
            &self.0
        }
    }

    impl Chunk for Roomy {
        fn footprint(&self) -> usize {
            16
        }
        fn absorb(&mut self, other: &Self) -> bool {
            let fits = self.0.len() + other.0.len() <= 16;
            if fits {
                self.0.extend_from_slice(&other.0);
            }
            fits
        }
    }

    /// Chunks that arrive while others wait unread are packed into them
    /// and credited back at once; the bytes read come out in order, and
    /// every footprint is credited exactly once.
    #[test]
    fn queued_small_chunks_are_packed_and_credited() {
        let (mut c, mut s, cid, sid) = handshake_of::<Roomy>();
        let w = c.window();
        let mut sent = Vec::new();
        // Unpacked, the window (64) holds 4 chunks; packed five to a
        // chunk (each packed one credited back at once), 16 get through.
        assert_eq!(w, 64);
        for i in 0..16u8 {
            c.take_credit(cid, 16).unwrap();
            s.on_data(PeerId(1), sid, Roomy(vec![i; 3]));
            sent.extend([i; 3]);
            pass_credits(&mut s, &mut c, cid);
        }
        let mut got = Vec::new();
        let mut out = [0u8; 7];
        while let Ok(n) = s.read(sid, &mut out) {
            got.extend_from_slice(&out[..n]);
        }
        assert_eq!(got, sent);
        pass_credits(&mut s, &mut c, cid);
        assert_eq!(c.credit_left(cid), w, "every footprint credited back");
    }

    /// Hands the credits `s` (stack 2) owes to `c` (stack 1) for `cid`.
    fn pass_credits<B: Chunk>(s: &mut Table<B>, c: &mut Table<B>, cid: ConnId) {
        for act in actions(s) {
            if let Action::Control {
                kind: kind::CREDIT,
                arg,
                ..
            } = act
            {
                c.on_credit(PeerId(2), cid, arg);
            }
        }
    }

    #[test]
    fn credit_is_taken_returned_and_never_deadlocks() {
        let (mut c, mut s, cid, sid) = handshake();
        let w = c.window();
        assert_eq!(c.credit_left(cid), w);
        // Fill the window with 8-byte chunks.
        let mut sent = 0;
        while c.take_credit(cid, 8).is_ok() {
            s.on_data(PeerId(1), sid, vec![7u8; 8]);
            sent += 8;
        }
        assert_eq!(sent, w);
        assert_eq!(c.take_credit(cid, 8), Err(ConnError::WouldBlock));
        actions(&mut s);
        // The reader drains it all: credit flows back (at least a quarter
        // of the window per message) and the writer may go on.
        let mut out = [0u8; 5];
        let mut credited = 0;
        while let Ok(n) = s.read(sid, &mut out) {
            assert!(n > 0);
            for act in actions(&mut s) {
                if let Action::Control {
                    kind: kind::CREDIT,
                    arg,
                    to,
                    ..
                } = act
                {
                    assert_eq!(to, cid.0);
                    assert!(arg as usize >= w / 4);
                    credited += arg as usize;
                    c.on_credit(PeerId(2), cid, arg);
                }
            }
        }
        assert_eq!(credited, w);
        assert_eq!(c.credit_left(cid), w);
        // A forged credit cannot push it past the window.
        c.on_credit(PeerId(2), cid, u32::MAX);
        assert_eq!(c.credit_left(cid), w);
    }

    #[test]
    fn refused_reset_and_peer_death() {
        let mut c: Table<Vec<u8>> = Table::new(64);
        let mut s: Table<Vec<u8>> = Table::new(64);
        let cid = c.connect(PeerId(2), a(81), src()).unwrap();
        s.on_syn(PeerId(1), cid.0, a(81), src());
        assert_eq!(
            actions(&mut s),
            vec![Action::Control {
                peer: PeerId(1),
                kind: kind::RST,
                to: cid.0,
                arg: 0
            }]
        );
        actions(&mut c);
        c.on_rst(PeerId(2), cid);
        assert_eq!(
            actions(&mut c),
            vec![
                Action::Connected(cid),
                Action::Readable(cid),
                Action::Writable(cid)
            ]
        );
        assert_eq!(c.connect_result(cid), Err(ConnError::Refused));
        assert_eq!(c.read(cid, &mut [0u8; 1]), Err(ConnError::Refused));

        let (mut c, mut s, cid, sid) = handshake();
        s.on_data(PeerId(1), sid, b"x".to_vec());
        actions(&mut s);
        s.on_peer_gone(PeerId(1));
        assert_eq!(
            actions(&mut s),
            vec![Action::Readable(sid), Action::Writable(sid)]
        );
        let mut b = [0u8; 4];
        // What the dead peer sent first, then the reset.
        assert_eq!(s.read(sid, &mut b), Ok(1));
        assert_eq!(s.read(sid, &mut b), Err(ConnError::Reset));
        // A peer that closed cleanly and then exited: its data, then end
        // of stream; writing to it fails (a broken pipe, as a RST in
        // close-wait).
        let (_, mut s3, _, sid3) = handshake();
        s3.on_data(PeerId(1), sid3, b"last".to_vec());
        s3.on_fin(PeerId(1), sid3);
        s3.on_peer_gone(PeerId(1));
        assert_eq!(s3.read(sid3, &mut b), Ok(4));
        assert_eq!(s3.read(sid3, &mut b), Ok(0));
        assert_eq!(s3.send_target(sid3), Err(ConnError::BrokenPipe));
        // Closing with unread data sends RST, not FIN.
        let (_, mut s2, _, sid2) = handshake();
        s2.on_data(PeerId(1), sid2, b"unread".to_vec());
        actions(&mut s2);
        s2.close(sid2);
        assert!(matches!(
            actions(&mut s2)[..],
            [Action::Control {
                kind: kind::RST,
                ..
            }]
        ));
        c.close(cid);
        assert_eq!(
            actions(&mut c),
            vec![Action::Control {
                peer: PeerId(2),
                kind: kind::FIN,
                to: sid.0,
                arg: 0
            }]
        );
    }

    #[test]
    fn early_data_and_fin_before_the_syn_ack() {
        let mut c: Table<Vec<u8>> = Table::new(64);
        let mut s: Table<Vec<u8>> = Table::new(64);
        s.listen(a(80), 16).unwrap();
        let cid = c.connect(PeerId(2), a(80), src()).unwrap();
        actions(&mut c);
        // Before any answer the client writes, addressed by its own id...
        let (peer, to, flag) = c.send_target(cid).unwrap();
        assert_eq!((peer, to, flag), (PeerId(2), cid.0, kind::EARLY));
        c.close(cid);
        assert_eq!(
            actions(&mut c),
            vec![Action::Control {
                peer: PeerId(2),
                kind: kind::FIN | kind::EARLY,
                to: cid.0,
                arg: 0
            }]
        );
        assert_eq!(c.len(), 1, "kept until the answer");
        // ...and the server maps that id to its own connection.
        s.on_syn(PeerId(1), cid.0, a(80), src());
        let sid = s.accept(a(80)).unwrap();
        assert_eq!(s.early_conn(PeerId(1), cid.0), Some(sid));
        s.on_data(PeerId(1), sid, b"early".to_vec());
        s.on_fin(PeerId(1), sid);
        let mut b = [0u8; 8];
        assert_eq!(s.read(sid, &mut b), Ok(5));
        assert_eq!(s.read(sid, &mut b), Ok(0));
        // The SYN-ACK for the closed connection is taken quietly (no RST);
        // the id is remembered until the server's FIN.
        actions(&mut c);
        c.on_syn_ack(PeerId(2), cid, sid.0);
        assert!(actions(&mut c).is_empty());
        assert_eq!(c.len(), 1, "waits for the peer's FIN");
        actions(&mut s);
        s.close(sid);
        assert_eq!(s.early_conn(PeerId(1), cid.0), None, "forgotten on close");
        assert!(s.is_empty(), "the client had finished: nothing to wait for");
        assert!(matches!(
            actions(&mut s)[..],
            [Action::Control { kind: kind::FIN, to, .. }] if to == cid.0
        ));
        c.on_fin(PeerId(2), cid);
        assert!(actions(&mut c).is_empty());
        assert!(c.is_empty());
    }

    #[test]
    fn stale_ids_are_not_delivered_to_a_reused_slot() {
        let (mut c, _s, cid, _) = handshake();
        c.close(cid);
        // The peer's FIN ends the closed connection for good.
        c.on_fin(PeerId(2), cid);
        let new = c.connect(PeerId(2), a(80), src()).unwrap();
        assert_eq!(new.index(), cid.index(), "slot reused");
        assert_ne!(new, cid, "with a new generation");
        actions(&mut c);
        c.on_data(PeerId(2), cid, b"late".to_vec());
        assert!(
            actions(&mut c).is_empty(),
            "late data never reaches the new one"
        );
        assert_eq!(c.read(cid, &mut [0u8; 4]), Err(ConnError::NotConnected));
        // Data from the wrong peer is refused too.
        c.on_data(PeerId(9), new, b"x".to_vec());
        assert!(actions(&mut c).is_empty());
        // A SYN-ACK for a stale id is answered with a RST.
        c.on_syn_ack(PeerId(2), cid, 77);
        assert!(matches!(
            actions(&mut c)[..],
            [Action::Control {
                kind: kind::RST,
                to: 77,
                ..
            }]
        ));
    }

    /// Data for a connection closed here is answered with a RST (the
    /// writer would otherwise wait for credit forever), once; the reset is
    /// reported once, then reads see end of stream and writes a broken
    /// pipe, as on Linux.
    #[test]
    fn data_after_close_is_reset_and_the_reset_is_reported_once() {
        let (mut c, mut s, cid, sid) = handshake();
        s.close(sid);
        let acts = actions(&mut s);
        assert!(
            matches!(
                acts[..],
                [Action::Control {
                    kind: kind::FIN,
                    ..
                }]
            ),
            "{acts:?}"
        );
        c.on_fin(PeerId(2), cid);
        actions(&mut c);
        assert_eq!(c.read(cid, &mut [0u8; 4]), Ok(0));
        // The client writes anyway: the server resets.
        s.on_data(PeerId(1), sid, b"more".to_vec());
        let acts = actions(&mut s);
        let [Action::Control {
            kind: kind::RST,
            to,
            peer: PeerId(1),
            ..
        }] = acts[..]
        else {
            panic!("{acts:?}")
        };
        assert_eq!(to, cid.0);
        assert!(s.is_empty(), "the closed id is forgotten");
        s.on_data(PeerId(1), sid, b"again".to_vec());
        assert!(actions(&mut s).is_empty(), "one RST is enough");
        c.on_rst(PeerId(2), cid);
        // After the FIN, reads end normally, the reset notwithstanding.
        assert_eq!(c.read(cid, &mut [0u8; 4]), Ok(0));
        assert_eq!(c.peek(cid, &mut [0u8; 4]), Ok(0));
        assert_eq!(c.take_chunk(cid), Ok(None));
        // In close-wait, Linux says EPIPE; then the pipe stays broken.
        assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
        assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
        assert_eq!(c.read(cid, &mut [0u8; 4]), Ok(0));

        // Reset while open: ConnectionReset once, then end of stream and
        // BrokenPipe.
        let (mut c, _s, cid, _) = handshake();
        c.on_rst(PeerId(2), cid);
        assert_eq!(c.read(cid, &mut [0u8; 4]), Err(ConnError::Reset));
        assert_eq!(c.read(cid, &mut [0u8; 4]), Ok(0));
        assert_eq!(c.take_chunk(cid), Ok(None));
        assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
        // A write may be the first to hear of it.
        let (mut c, _s, cid, _) = handshake();
        c.on_rst(PeerId(2), cid);
        assert_eq!(c.send_target(cid), Err(ConnError::Reset));
        assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
        assert_eq!(c.read(cid, &mut [0u8; 4]), Ok(0));
        // A refusal stays an error.
        let mut c: Table<Vec<u8>> = Table::new(64);
        let cid = c.connect(PeerId(2), a(80), src()).unwrap();
        c.on_rst(PeerId(2), cid);
        assert_eq!(c.read(cid, &mut [0u8; 4]), Err(ConnError::Refused));
        assert_eq!(c.read(cid, &mut [0u8; 4]), Err(ConnError::Refused));
        // A closed connection whose peer dies is forgotten.
        let (mut c, _s, cid, _) = handshake();
        c.close(cid);
        assert_eq!(c.len(), 1);
        c.on_peer_gone(PeerId(2));
        assert!(c.is_empty());
        // What arrived before a reset is read first (the 413 a server sent
        // before it closed and reset the rest of an upload), then the reset.
        let (mut c, _s, cid, _) = handshake();
        c.on_data(PeerId(2), cid, b"413".to_vec());
        c.on_rst(PeerId(2), cid);
        let mut b = [0u8; 8];
        assert_eq!(c.peek(cid, &mut b), Ok(3));
        assert_eq!(c.read(cid, &mut b), Ok(3));
        assert_eq!(&b[..3], b"413");
        assert_eq!(c.read(cid, &mut b), Err(ConnError::Reset));
        assert_eq!(c.read(cid, &mut b), Ok(0));
        // A partial write that met the reset leaves it for the next call.
        let (mut c, _s, cid, _) = handshake();
        c.on_rst(PeerId(2), cid);
        assert_eq!(c.send_target(cid), Err(ConnError::Reset));
        c.unreport_reset(cid);
        assert_eq!(c.send_target(cid), Err(ConnError::Reset));
    }

    /// An id remembered as closing is not handed out again while its peer
    /// may still send to it, however often its slot is reused (the
    /// generation wraps after 4096).
    #[test]
    fn a_closing_id_is_not_reissued() {
        let (mut c, _s, cid, _) = handshake();
        c.close(cid);
        for _ in 0..5000 {
            let new = c.connect(PeerId(2), a(80), src()).unwrap();
            assert_ne!(new, cid);
            c.on_rst(PeerId(2), new); // refused
            c.close(new);
        }
        assert_eq!(c.len(), 1, "only the closing one");
    }

    /// A peer that never answers our FINs, one connection after another
    /// (the same slot each time): once the slot comes back to a
    /// generation still closing, its oldest is forgotten and reissued
    /// (this used to loop for good once every generation was closing),
    /// and that connection's peer is reset with a RST that must arrive.
    #[test]
    fn a_slot_whose_generations_are_all_closing_is_reissued() {
        let mut s: Table<Vec<u8>> = Table::new(64);
        s.listen(a(80), 16).unwrap();
        let mut ends = Vec::new();
        let mut ids = Vec::new();
        for i in 0..GENERATIONS as u32 + 10 {
            s.on_syn(PeerId(1), i, a(80), src());
            let c = s.accept(a(80)).unwrap();
            assert_eq!(c.index(), 0, "one slot, reused");
            ids.push(c);
            s.close(c);
            for act in actions(&mut s) {
                if let Action::Control {
                    kind: kind::RST,
                    to,
                    arg,
                    ..
                } = act
                {
                    assert_eq!(arg, kind::RST_ENDS, "a reset that ends a connection");
                    ends.push(to);
                }
            }
        }
        // The ten oldest were forgotten, their peers told.
        assert_eq!(ends, (0..10).collect::<Vec<u32>>());
        assert_eq!(s.len(), GENERATIONS);
        assert_eq!(ids[GENERATIONS..], ids[..10], "their ids reissued");
    }

    /// Peers that never answer our FINs, many connections at once: the
    /// closing ones stay bounded, the oldest are forgotten (their peers
    /// reset) first.
    #[test]
    fn closing_connections_are_bounded() {
        let mut s: Table<Vec<u8>> = Table::new(64);
        s.listen(a(80), CLOSING_MAX + 10).unwrap();
        let n = CLOSING_MAX as u32 + 5;
        let ids: Vec<ConnId> = (0..n)
            .map(|i| {
                s.on_syn(PeerId(1), i, a(80), src());
                s.accept(a(80)).unwrap()
            })
            .collect();
        actions(&mut s);
        for &c in &ids {
            s.close(c);
        }
        let ends: Vec<u32> = actions(&mut s)
            .into_iter()
            .filter_map(|act| match act {
                Action::Control {
                    kind: kind::RST,
                    to,
                    arg: kind::RST_ENDS,
                    ..
                } => Some(to),
                _ => None,
            })
            .collect();
        assert_eq!(ends, (0..5).collect::<Vec<u32>>());
        assert_eq!(s.len(), CLOSING_MAX);
        // A forgotten one's late data is dropped, and no second reset.
        s.on_data(PeerId(1), ids[0], b"late".to_vec());
        assert!(actions(&mut s).is_empty());
        // One that is remembered answers late data with its reset.
        s.on_data(PeerId(1), ids[5], b"late".to_vec());
        assert_eq!(s.len(), CLOSING_MAX - 1);
    }

    /// The peer answers some FINs: what it answered leaves the order
    /// queue too, and never counts against the bound.
    #[test]
    fn answered_fins_leave_the_closing_order() {
        let mut s: Table<Vec<u8>> = Table::new(64);
        s.listen(a(80), 16).unwrap();
        for i in 0..10_000u32 {
            s.on_syn(PeerId(1), i, a(80), src());
            let c = s.accept(a(80)).unwrap();
            s.close(c);
            s.on_fin(PeerId(1), c);
            assert!(actions(&mut s).iter().all(|a| !matches!(
                a,
                Action::Control {
                    kind: kind::RST,
                    ..
                }
            )));
        }
        assert_eq!(s.len(), 0);
        assert!(s.closing_order.len() <= 64);
    }

    /// Windows differ (each process sets its own): a writer whose whole
    /// window is below a quarter of the reader's is still credited.
    #[test]
    fn a_small_writer_window_is_credited_by_a_large_reader() {
        let mut c: Table<Vec<u8>> = Table::new(64);
        let mut s: Table<Vec<u8>> = Table::new(1024);
        s.set_window_floor(64);
        s.listen(a(80), 16).unwrap();
        let cid = c.connect(PeerId(2), a(80), src()).unwrap();
        let Action::SendSyn {
            conn,
            target,
            source,
            ..
        } = actions(&mut c)[0]
        else {
            panic!()
        };
        s.on_syn(PeerId(1), conn.0, target, source);
        let Action::Control { to, arg: from, .. } = actions(&mut s)[0] else {
            panic!()
        };
        let sid = s.accept(a(80)).unwrap();
        c.on_syn_ack(PeerId(2), ConnId(to), from);
        actions(&mut c);
        // Ten windows' worth, 16 bytes at a time, read as it comes.
        let mut b = [0u8; 16];
        for round in 0..40 {
            let (peer, to, _) = c.send_target(cid).unwrap();
            assert_eq!(peer, PeerId(2));
            assert!(
                c.take_credit(cid, 16).is_ok(),
                "writer starved at round {round}"
            );
            s.on_data(PeerId(1), ConnId(to), vec![round as u8; 16]);
            assert_eq!(s.read(sid, &mut b), Ok(16));
            for act in actions(&mut s) {
                if let Action::Control {
                    kind: kind::CREDIT,
                    to,
                    arg,
                    ..
                } = act
                {
                    c.on_credit(PeerId(2), ConnId(to), arg);
                }
            }
        }
    }

    #[test]
    fn closing_with_unread_data_sends_a_reset_that_must_arrive() {
        let (_c, mut s, _cid, sid) = handshake();
        s.on_data(PeerId(1), sid, b"unread".to_vec());
        actions(&mut s);
        s.close(sid);
        let acts = actions(&mut s);
        assert!(
            acts.iter().any(|a| matches!(
                a,
                Action::Control {
                    kind: kind::RST,
                    arg: kind::RST_ENDS,
                    ..
                }
            )),
            "{acts:?}"
        );
    }

    #[test]
    fn shutting_down_writes_wakes_a_waiting_writer() {
        let (mut c, _s, cid, _) = handshake();
        c.shutdown_write(cid).unwrap();
        assert!(actions(&mut c).contains(&Action::Writable(cid)));
        assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
    }

    #[test]
    fn peek_leaves_the_bytes_for_the_next_read() {
        let (mut c, _s, cid, _) = handshake();
        let mut b = [0u8; 8];
        assert_eq!(c.peek(cid, &mut b), Err(ConnError::WouldBlock));
        c.on_data(PeerId(2), cid, b"abc".to_vec());
        c.on_data(PeerId(2), cid, b"defg".to_vec());
        assert_eq!(c.read(cid, &mut b[..1]), Ok(1));
        assert_eq!(c.peek(cid, &mut b[..5]), Ok(5));
        assert_eq!(&b[..5], b"bcdef");
        assert_eq!(
            c.peek(cid, &mut b),
            Ok(6),
            "across buffers, from the offset"
        );
        assert_eq!(c.read(cid, &mut b), Ok(6));
        assert_eq!(&b[..6], b"bcdefg");
        c.on_fin(PeerId(2), cid);
        assert_eq!(c.peek(cid, &mut b), Ok(0));
    }

    #[test]
    fn a_reporting_peek_reports_a_reset_once_and_a_plain_one_leaves_it() {
        let (mut c, _s, cid, _) = handshake();
        let mut b = [0u8; 8];
        c.on_rst(PeerId(2), cid);
        assert_eq!(c.peek(cid, &mut b), Err(ConnError::Reset));
        assert_eq!(c.peek(cid, &mut b), Err(ConnError::Reset), "left");
        assert_eq!(c.peek_reporting(cid, &mut b), Err(ConnError::Reset));
        assert_eq!(c.peek_reporting(cid, &mut b), Ok(0), "once");
        assert_eq!(c.take_error(cid), None);
        assert_eq!(c.read(cid, &mut b), Ok(0));
    }

    #[test]
    fn a_full_backlog_refuses_until_one_is_accepted() {
        let mut s: Table<Vec<u8>> = Table::new(64);
        s.listen(a(1), 2).unwrap();
        s.on_syn(PeerId(1), 10, a(1), src());
        s.on_syn(PeerId(1), 11, a(1), src());
        actions(&mut s);
        s.on_syn(PeerId(2), 12, a(1), src());
        assert_eq!(s.len(), 2, "the third waits nowhere");
        assert!(matches!(
            s.poll_action(),
            Some(Action::Control { peer: PeerId(2), kind: k, to: 12, .. }) if k == kind::RST
        ));
        let first = s.accept(a(1)).unwrap();
        s.on_syn(PeerId(2), 13, a(1), src());
        assert_eq!(s.len(), 3);
        assert_ne!(s.accept(a(1)).unwrap(), first);
    }

    #[test]
    fn thousands_of_connections_and_reuse() {
        let mut s: Table<Vec<u8>> = Table::new(64);
        s.listen(a(1), 5000).unwrap();
        for round in 0..3 {
            let ids: Vec<ConnId> = (0..5000)
                .map(|i| {
                    s.on_syn(PeerId(1 + (i % 7) as u16), i, a(1), src());
                    s.accept(a(1)).unwrap()
                })
                .collect();
            assert_eq!(s.len(), 5000, "round {round}");
            for (i, &c) in ids.iter().enumerate() {
                s.close(c);
                if i % 2 == 0 {
                    s.on_fin(PeerId(1 + (i % 7) as u16), c);
                }
            }
            assert_eq!(s.len(), 2500, "closed, the peer may still send");
            for (i, &c) in ids.iter().enumerate().filter(|(i, _)| i % 2 == 1) {
                s.on_rst(PeerId(1 + (i % 7) as u16), c);
            }
            actions(&mut s);
            assert!(s.is_empty());
        }
        assert_eq!(s.listen(a(1), 1), Err(ConnError::AddrInUse));
    }
}

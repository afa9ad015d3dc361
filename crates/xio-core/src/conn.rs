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

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;

use crate::stack::PeerId;

/// Bits of a connection id that index the table; the rest is a generation.
const INDEX_BITS: u32 = 20;
const INDEX_MASK: u32 = (1 << INDEX_BITS) - 1;
/// Most connections one stack holds at once.
pub const MAX_CONNS: usize = 1 << INDEX_BITS;

/// A connection, local to one stack.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId(pub u32);

impl ConnId {
    fn index(self) -> usize {
        (self.0 & INDEX_MASK) as usize
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

/// What the driver must do after an input.
#[derive(Debug, PartialEq, Eq)]
pub enum Action {
    /// Send a SYN for `conn` to `peer`, naming `target`.
    SendSyn {
        /// Destination stack.
        peer: PeerId,
        /// Our connection.
        conn: ConnId,
        /// The listening address.
        target: SocketAddr,
    },
    /// Send a SYN-ACK: `to` is the initiator's id, `from` ours.
    SendSynAck {
        /// Destination stack.
        peer: PeerId,
        /// The initiator's connection id.
        to: u32,
        /// Our new connection.
        from: ConnId,
    },
    /// Send a FIN (no more data from us) to the peer's `to`.
    SendFin {
        /// Destination stack.
        peer: PeerId,
        /// The peer's connection id.
        to: u32,
    },
    /// Send a RST to the peer's `to`.
    SendRst {
        /// Destination stack.
        peer: PeerId,
        /// The peer's connection id.
        to: u32,
    },
    /// `conn` became readable (data, end of stream, or an error).
    Readable(ConnId),
    /// `conn` finished connecting (or failed): wake its `connect`.
    Connected(ConnId),
    /// A connection is waiting to be accepted on `addr`.
    Acceptable(SocketAddr),
}

/// Errors of table operations, mapped to `io::ErrorKind` by the drivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// Nothing to read yet (or nothing to accept).
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

struct Entry<B> {
    gen: u32,
    peer: PeerId,
    /// The peer's id for this connection (known once established).
    remote: u32,
    state: State,
    refused: bool,
    rx: VecDeque<B>,
    /// Bytes of `rx.front()` already read.
    offset: usize,
    peer_fin: bool,
    fin_sent: bool,
}

/// A stack's connections and listeners.
pub struct Table<B> {
    entries: Vec<Option<Entry<B>>>,
    gens: Vec<u32>,
    free: Vec<u32>,
    listeners: HashMap<SocketAddr, VecDeque<ConnId>>,
}

impl<B> Default for Table<B> {
    fn default() -> Self {
        Self {
            entries: Vec::new(),
            gens: Vec::new(),
            free: Vec::new(),
            listeners: HashMap::new(),
        }
    }
}

impl<B: AsRef<[u8]>> Table<B> {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Connections open (in any state).
    pub fn len(&self) -> usize {
        self.entries.len() - self.free.len()
    }

    /// True when no connection is open.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn insert(&mut self, peer: PeerId, remote: u32, state: State) -> Result<ConnId, ConnError> {
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
        let gen = self.gens[i];
        self.entries[i] = Some(Entry {
            gen,
            peer,
            remote,
            state,
            refused: false,
            rx: VecDeque::new(),
            offset: 0,
            peer_fin: false,
            fin_sent: false,
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
        self.entries[i].take()
    }

    /// Starts listening on `addr`.
    pub fn listen(&mut self, addr: SocketAddr) -> Result<(), ConnError> {
        if self.listeners.contains_key(&addr) {
            return Err(ConnError::AddrInUse);
        }
        self.listeners.insert(addr, VecDeque::new());
        Ok(())
    }

    /// Stops listening; pending connections are reset.
    pub fn unlisten(&mut self, addr: SocketAddr) -> Vec<Action> {
        let mut out = Vec::new();
        for c in self.listeners.remove(&addr).unwrap_or_default() {
            if let Some(e) = self.remove(c) {
                out.push(Action::SendRst {
                    peer: e.peer,
                    to: e.remote,
                });
            }
        }
        out
    }

    /// Opens a connection to `target` on stack `peer`.
    pub fn connect(
        &mut self,
        peer: PeerId,
        target: SocketAddr,
    ) -> Result<(ConnId, Action), ConnError> {
        let c = self.insert(peer, 0, State::SynSent)?;
        Ok((
            c,
            Action::SendSyn {
                peer,
                conn: c,
                target,
            },
        ))
    }

    /// Takes the next connection waiting on `addr`.
    pub fn accept(&mut self, addr: SocketAddr) -> Result<ConnId, ConnError> {
        let q = self
            .listeners
            .get_mut(&addr)
            .ok_or(ConnError::NotConnected)?;
        q.pop_front().ok_or(ConnError::WouldBlock)
    }

    /// A SYN from `peer` for `target`, whose id there is `remote`.
    pub fn on_syn(&mut self, peer: PeerId, remote: u32, target: SocketAddr) -> Vec<Action> {
        if !self.listeners.contains_key(&target) {
            return vec![Action::SendRst { peer, to: remote }];
        }
        match self.insert(peer, remote, State::Established) {
            Ok(c) => {
                self.listeners
                    .get_mut(&target)
                    .expect("checked")
                    .push_back(c);
                vec![
                    Action::SendSynAck {
                        peer,
                        to: remote,
                        from: c,
                    },
                    Action::Acceptable(target),
                ]
            }
            Err(_) => vec![Action::SendRst { peer, to: remote }],
        }
    }

    /// A SYN-ACK for our `local` connection; the peer's id is `remote`.
    pub fn on_syn_ack(&mut self, peer: PeerId, local: ConnId, remote: u32) -> Vec<Action> {
        match self.get_mut(local) {
            Some(e) if e.state == State::SynSent && e.peer == peer => {
                e.state = State::Established;
                e.remote = remote;
                vec![Action::Connected(local)]
            }
            // Stale or forged: tell the sender its connection is dead.
            _ => vec![Action::SendRst { peer, to: remote }],
        }
    }

    /// Data for `local` from `peer`. A buffer for an unknown connection is
    /// dropped (returned to the pool by its `Drop`) and answered with a RST.
    pub fn on_data(&mut self, peer: PeerId, local: ConnId, buf: B) -> Vec<Action> {
        match self.get_mut(local) {
            Some(e) if e.peer == peer && e.state == State::Established && !e.peer_fin => {
                e.rx.push_back(buf);
                vec![Action::Readable(local)]
            }
            Some(e) if e.peer == peer => {
                let to = e.remote;
                vec![Action::SendRst { peer, to }]
            }
            _ => Vec::new(),
        }
    }

    /// The peer will send no more on `local`.
    pub fn on_fin(&mut self, peer: PeerId, local: ConnId) -> Vec<Action> {
        match self.get_mut(local) {
            Some(e) if e.peer == peer => {
                e.peer_fin = true;
                vec![Action::Readable(local)]
            }
            _ => Vec::new(),
        }
    }

    /// The peer reset `local` (or refused it, if we were connecting).
    pub fn on_rst(&mut self, peer: PeerId, local: ConnId) -> Vec<Action> {
        match self.get_mut(local) {
            Some(e) if e.peer == peer => {
                let was_connecting = e.state == State::SynSent;
                e.refused = was_connecting;
                e.state = State::Reset;
                e.rx.clear();
                if was_connecting {
                    vec![Action::Connected(local)]
                } else {
                    vec![Action::Readable(local)]
                }
            }
            _ => Vec::new(),
        }
    }

    /// Stack `peer` died: every connection to it is reset.
    pub fn on_peer_gone(&mut self, peer: PeerId) -> Vec<Action> {
        let ids: Vec<ConnId> = self
            .entries
            .iter()
            .enumerate()
            .filter_map(|(i, e)| {
                let e = e.as_ref()?;
                (e.peer == peer).then_some(ConnId(e.gen << INDEX_BITS | i as u32))
            })
            .collect();
        ids.into_iter().flat_map(|c| self.on_rst(peer, c)).collect()
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

    /// Copies received bytes into `out`: `Ok(0)` is end of stream (after
    /// every byte sent before the FIN). Bytes come in order, and a read
    /// may return part of one buffer or parts of several.
    pub fn read(&mut self, c: ConnId, out: &mut [u8]) -> Result<usize, ConnError> {
        let e = self.get_mut(c).ok_or(ConnError::NotConnected)?;
        if e.state == State::Reset {
            return Err(ConnError::Reset);
        }
        let mut n = 0;
        while n < out.len() {
            let Some(front) = e.rx.front() else { break };
            let bytes = &front.as_ref()[e.offset..];
            let k = bytes.len().min(out.len() - n);
            out[n..n + k].copy_from_slice(&bytes[..k]);
            n += k;
            e.offset += k;
            if e.offset == front.as_ref().len() {
                e.rx.pop_front();
                e.offset = 0;
            }
        }
        if n > 0 || out.is_empty() {
            Ok(n)
        } else if e.peer_fin {
            Ok(0)
        } else {
            Err(ConnError::WouldBlock)
        }
    }

    /// Where a write on `c` goes: the peer stack and its connection id.
    pub fn send_target(&self, c: ConnId) -> Result<(PeerId, u32), ConnError> {
        let e = self.get(c).ok_or(ConnError::NotConnected)?;
        match e.state {
            State::Reset => Err(ConnError::Reset),
            State::SynSent => Err(ConnError::NotConnected),
            State::Established if e.fin_sent => Err(ConnError::BrokenPipe),
            State::Established => Ok((e.peer, e.remote)),
        }
    }

    /// No more writes on `c` (the peer reads end of stream after our data).
    pub fn shutdown_write(&mut self, c: ConnId) -> Result<Vec<Action>, ConnError> {
        let e = self.get_mut(c).ok_or(ConnError::NotConnected)?;
        if e.state != State::Established || e.fin_sent {
            return Ok(Vec::new());
        }
        e.fin_sent = true;
        Ok(vec![Action::SendFin {
            peer: e.peer,
            to: e.remote,
        }])
    }

    /// Closes `c`: a FIN if everything received was read, else a RST (as
    /// TCP does when unread data is discarded). The id is dead afterwards.
    pub fn close(&mut self, c: ConnId) -> Vec<Action> {
        let Some(e) = self.remove(c) else {
            return Vec::new();
        };
        match e.state {
            State::Established if !e.rx.is_empty() => vec![Action::SendRst {
                peer: e.peer,
                to: e.remote,
            }],
            State::Established if !e.fin_sent => vec![Action::SendFin {
                peer: e.peer,
                to: e.remote,
            }],
            _ => Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(p: u16) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, 1], p))
    }

    /// Two tables wired back to back: `c` on stack 1, `s` on stack 2.
    fn handshake() -> (Table<Vec<u8>>, Table<Vec<u8>>, ConnId, ConnId) {
        let mut c = Table::new();
        let mut s = Table::new();
        s.listen(a(80)).unwrap();
        let (cid, syn) = c.connect(PeerId(2), a(80)).unwrap();
        let Action::SendSyn { conn, target, .. } = syn else {
            panic!()
        };
        let acts = s.on_syn(PeerId(1), conn.0, target);
        let Action::SendSynAck { to, from, .. } = acts[0] else {
            panic!("{acts:?}")
        };
        assert_eq!(acts[1], Action::Acceptable(a(80)));
        let sid = s.accept(a(80)).unwrap();
        assert_eq!(sid, from);
        assert_eq!(
            c.on_syn_ack(PeerId(2), ConnId(to), from.0),
            vec![Action::Connected(cid)]
        );
        assert_eq!(c.connect_result(cid), Ok(()));
        (c, s, cid, sid)
    }

    #[test]
    fn handshake_data_partial_reads_and_fin() {
        let (mut c, mut s, cid, sid) = handshake();
        let (peer, to) = c.send_target(cid).unwrap();
        assert_eq!((peer, to), (PeerId(2), sid.0));
        s.on_data(PeerId(1), sid, b"hello ".to_vec());
        s.on_data(PeerId(1), sid, b"world".to_vec());
        let mut buf = [0u8; 3];
        let mut got = Vec::new();
        while let Ok(n) = s.read(sid, &mut buf) {
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, b"hello world");
        assert_eq!(s.read(sid, &mut buf), Err(ConnError::WouldBlock));
        assert_eq!(
            c.shutdown_write(cid).unwrap(),
            vec![Action::SendFin {
                peer: PeerId(2),
                to: sid.0
            }]
        );
        assert_eq!(c.send_target(cid), Err(ConnError::BrokenPipe));
        s.on_fin(PeerId(1), sid);
        assert_eq!(s.read(sid, &mut buf), Ok(0), "end of stream");
        // Half-close: the server can still write back.
        assert!(s.send_target(sid).is_ok());
    }

    #[test]
    fn refused_reset_and_peer_death() {
        let mut c: Table<Vec<u8>> = Table::new();
        let mut s: Table<Vec<u8>> = Table::new();
        let (cid, _) = c.connect(PeerId(2), a(81)).unwrap();
        let rst = s.on_syn(PeerId(1), cid.0, a(81));
        assert_eq!(
            rst,
            vec![Action::SendRst {
                peer: PeerId(1),
                to: cid.0
            }]
        );
        assert_eq!(c.on_rst(PeerId(2), cid), vec![Action::Connected(cid)]);
        assert_eq!(c.connect_result(cid), Err(ConnError::Refused));

        let (mut c, mut s, cid, sid) = handshake();
        s.on_data(PeerId(1), sid, b"x".to_vec());
        assert_eq!(s.on_peer_gone(PeerId(1)), vec![Action::Readable(sid)]);
        let mut b = [0u8; 4];
        assert_eq!(s.read(sid, &mut b), Err(ConnError::Reset));
        // Closing with unread data sends RST, not FIN.
        let (_, mut s2, _, sid2) = handshake();
        s2.on_data(PeerId(1), sid2, b"unread".to_vec());
        assert!(matches!(s2.close(sid2)[0], Action::SendRst { .. }));
        assert_eq!(
            c.close(cid),
            vec![Action::SendFin {
                peer: PeerId(2),
                to: sid.0
            }]
        );
    }

    #[test]
    fn stale_ids_are_not_delivered_to_a_reused_slot() {
        let (mut c, _s, cid, _) = handshake();
        c.close(cid);
        let (new, _) = c.connect(PeerId(2), a(80)).unwrap();
        assert_eq!(new.index(), cid.index(), "slot reused");
        assert_ne!(new, cid, "with a new generation");
        assert!(c.on_data(PeerId(2), cid, b"late".to_vec()).is_empty());
        assert_eq!(c.read(cid, &mut [0u8; 4]), Err(ConnError::NotConnected));
        // Data from the wrong peer is refused too.
        assert!(!matches!(
            c.on_data(PeerId(9), new, b"x".to_vec()).first(),
            Some(Action::Readable(_))
        ));
    }

    #[test]
    fn thousands_of_connections_and_reuse() {
        let mut s: Table<Vec<u8>> = Table::new();
        s.listen(a(1)).unwrap();
        for round in 0..3 {
            let ids: Vec<ConnId> = (0..5000)
                .map(|i| {
                    s.on_syn(PeerId(1 + (i % 7) as u16), i, a(1));
                    s.accept(a(1)).unwrap()
                })
                .collect();
            assert_eq!(s.len(), 5000, "round {round}");
            for c in ids {
                s.close(c);
            }
            assert!(s.is_empty());
        }
        assert_eq!(s.listen(a(1)), Err(ConnError::AddrInUse));
    }
}

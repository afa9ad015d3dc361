//! Opening connections: listeners (with their backlog), `connect` and
//! `accept`, the SYN and SYN-ACK that establish a connection (a wildcard
//! listener reached only at this node's addresses), and the addresses of
//! each end.

use std::collections::VecDeque;
use std::net::SocketAddr;

use crate::layout::kind;
use crate::stack::PeerId;

use super::{Action, Chunk, Closing, ConnError, ConnId, Listener, State, Table};

impl<B: Chunk> Table<B> {
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
                    e.early_key = Some((peer, remote));
                    e.unaccepted = true;
                }
                self.early.insert((peer, remote), c);
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

    /// Whether `c` still waits for its SYN-ACK.
    pub fn is_connecting(&self, c: ConnId) -> bool {
        self.get(c).is_some_and(|e| e.state == State::SynSent)
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
}

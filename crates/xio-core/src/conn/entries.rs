//! The table's slots: inserting a connection (its id the slot's index and
//! generation, skipping generations still remembered as closing), finding
//! and removing one, the routes for what an initiator sent before it knew
//! our id, and the memory of connections closed here whose peer may still
//! send (bounded: past [`CLOSING_MAX`] the oldest peer is reset).

use std::collections::VecDeque;
use std::net::SocketAddr;

use crate::stack::PeerId;

use super::{
    Chunk, Closing, ConnError, ConnId, Entry, State, Table, CLOSING_MAX, INDEX_BITS, MAX_CONNS,
    SKIP_MAX,
};
#[cfg(doc)]
use crate::layout::kind;

impl<B: Chunk> Table<B> {
    pub(super) fn insert(
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

    pub(super) fn get(&self, c: ConnId) -> Option<&Entry<B>> {
        self.entries
            .get(c.index())?
            .as_ref()
            .filter(|e| e.gen == c.0 >> INDEX_BITS)
    }

    pub(super) fn get_mut(&mut self, c: ConnId) -> Option<&mut Entry<B>> {
        self.entries
            .get_mut(c.index())?
            .as_mut()
            .filter(|e| e.gen == c.0 >> INDEX_BITS)
    }

    pub(super) fn remove(&mut self, c: ConnId) -> Option<Entry<B>> {
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
    pub(super) fn forget_early(&mut self, k: (PeerId, u32), c: ConnId) {
        if self.early.get(&k) == Some(&c) {
            self.early.remove(&k);
        }
    }

    /// Our connection for what `peer` sent with its own id `remote`
    /// ([`kind::EARLY`]).
    pub fn early_conn(&self, peer: PeerId, remote: u32) -> Option<ConnId> {
        self.early.get(&(peer, remote)).copied()
    }

    /// The stack a connection goes to.
    pub fn peer_of(&self, c: ConnId) -> Option<PeerId> {
        self.get(c).map(|e| e.peer)
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
    pub(super) fn remember_closing(&mut self, c: ConnId, what: Closing) {
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

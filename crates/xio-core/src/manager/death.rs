//! A stack that left or died: its addresses are freed, its peers told
//! (`PeerDown`) and its channels closed, each freed once the peer releases
//! it. A stack that left (its process keeps the socket, for a buffer of it
//! that lives on) keeps its slot and buffers until the socket closes; a
//! dead one is owed sweeps (see `sweep.rs`).

use std::collections::BTreeSet;

use crate::layout::{chan_state, slot_state};
use crate::proto::Msg;
use crate::sync::Ordering;

use super::{ChanEntry, Manager, Owed, StackEntry};

impl Manager {
    /// Stack `id` left (dropped) while its process still holds its socket
    /// open, for a buffer of it that lives on. Its peers are reset and its
    /// addresses freed as at a death; its buffers, which the process may
    /// still use, and its slot wait for the socket to close (then
    /// [`Self::on_death`]). Until then it counts as live for the sweeps:
    /// freeing those buffers takes the free lists.
    pub(super) fn on_leave(&mut self, id: u16) {
        let Some(e) = self.stacks.get_mut(&id) else {
            return;
        };
        if e.left {
            return;
        }
        e.left = true;
        // Nobody will read what waits for it.
        e.outbox.clear();
        e.outbox_fds = 0;
        e.stalled = false;
        let addrs = std::mem::take(&mut e.addrs);
        let peers = std::mem::take(&mut e.peers);
        for addr in &addrs {
            if self.bindings.get(addr) == Some(&id) {
                self.bindings.remove(addr);
            }
        }
        for (peer, ch) in peers {
            // Release: pairs with the Acquire loads in the peer's send path.
            self.seg
                .channel(ch)
                .state
                .store(chan_state::CLOSED, Ordering::Release);
            match self.stacks.get_mut(&peer) {
                Some(p) => {
                    p.peers.remove(&id);
                    self.deliver(
                        peer,
                        Msg::PeerDown {
                            channel: ch,
                            peer: id,
                        },
                        None,
                    );
                    if let Some(c) = self.channels[ch as usize].as_mut() {
                        c.closing = Some((peer, id));
                    }
                }
                None => self.free_channel(ch),
            }
        }
        tracing::info!(
            stack = id,
            "stack left; its buffers are reclaimed once its process lets go of them"
        );
        // The releases it owed (a dead peer's channels) will not come.
        self.settle_closing(|_, live| live == id);
    }

    pub(super) fn on_death(&mut self, id: u16, e: StackEntry) {
        self.seg
            .stack_slot(id)
            .state
            .store(slot_state::DEAD, Ordering::Release);
        for addr in &e.addrs {
            if self.bindings.get(addr) == Some(&id) {
                self.bindings.remove(addr);
            }
        }
        let mut waiting = BTreeSet::new();
        for (&peer, &ch) in &e.peers {
            // Release: pairs with the Acquire loads in the peer's send path.
            self.seg
                .channel(ch)
                .state
                .store(chan_state::CLOSED, Ordering::Release);
            if let Some(p) = self.stacks.get_mut(&peer) {
                p.peers.remove(&id);
                let down = Msg::PeerDown {
                    channel: ch,
                    peer: id,
                };
                self.deliver(peer, down, None);
                if let Some(c) = self.channels[ch as usize].as_mut() {
                    c.closing = Some((peer, id));
                }
                waiting.insert(ch);
            } else {
                self.free_channel(ch);
            }
        }
        // And those it let go of while alive (it left, or gave one up)
        // whose other end has not released them yet: their rings may still
        // hold its descriptors, and its id must name nobody else meanwhile.
        for (ch, c) in self.channels.iter().enumerate() {
            if let Some(ChanEntry {
                closing: Some((live, dead)),
                ..
            }) = c
            {
                if *dead == id && self.stacks.contains_key(live) {
                    waiting.insert(ch as u32);
                }
            }
        }
        tracing::info!(stack = id, pid = e.pid, name = %e.name, peers_reset = waiting.len(), "stack left");
        // Its slot is free after the last sweep, once every peer let go of
        // its channels (now, if it had none).
        let last = waiting.is_empty();
        if !last {
            self.dead.insert(id, waiting);
        }
        self.owe_sweep(id, Owed { first: true, last });
        // The channels it was to release (their other end died, or gave
        // them up): nobody will now. Settled at once, not left for the
        // loop to find: a newcomer registered in this same pass may get
        // its id, and would be taken for the end that owes the release.
        self.settle_closing(|_, live| live == id);
    }

    /// Frees the closing channels (a dead peer's, waiting for the release
    /// of their live end) whose live end `gone` says will never release
    /// them, and finishes their dead end's reclaim.
    pub(super) fn settle_closing(&mut self, gone: impl Fn(&Self, u16) -> bool) {
        let settled: Vec<(u32, u16)> = self
            .channels
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let (live, dead) = c.as_ref()?.closing?;
                gone(self, live).then_some((i as u32, dead))
            })
            .collect();
        for (ch, dead) in settled {
            self.free_channel(ch);
            self.finish_dead(dead, ch);
        }
    }
}

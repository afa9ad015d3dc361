//! The state machine's transitions on what the peer sends: stream data
//! (queued, packed into the last chunk, or answered with a RST), FIN, RST,
//! and the peer's death; and the two kinds of RST the table sends (one
//! that may be dropped, one that must arrive).

use crate::layout::kind;
use crate::stack::PeerId;

use super::{Action, Chunk, Closing, ConnId, State, Table, INDEX_BITS};

impl<B: Chunk> Table<B> {
    /// A RST that answers input naming no connection of ours (refused,
    /// stale or forged): the driver may drop it for a peer that does not
    /// drain its ring (see [`kind::RST_ENDS`]).
    pub(super) fn rst(&mut self, peer: PeerId, to: u32) {
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
    pub(super) fn reset(&mut self, peer: PeerId, to: u32) {
        self.actions.push_back(Action::Control {
            peer,
            kind: kind::RST,
            to,
            arg: kind::RST_ENDS,
        });
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
}

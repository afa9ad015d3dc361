//! Ending connections: shutting down either half, closing (a FIN, or a
//! RST if received data was left unread; remembered as closing while the
//! peer may still send) and aborting.

use crate::layout::kind;

use super::{Action, Chunk, Closing, ConnError, ConnId, State, Table};

impl<B: Chunk> Table<B> {
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
}

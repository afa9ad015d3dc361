//! The write side: where a write goes (the peer's id, or ours while the
//! SYN is unanswered) and whether it may go, and the reset it reports,
//! once, as a write or `SO_ERROR` would on Linux.

use crate::layout::kind;
use crate::stack::PeerId;

use super::{Chunk, ConnError, ConnId, State, Table};

impl<B: Chunk> Table<B> {
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
}

//! Flow control: each connection may have a window of buffer capacity
//! unread at the receiver. A writer takes credit for each buffer (and
//! returns what it did not send); a reader credits the writer back once a
//! quarter of the smallest window a writer may have was consumed.

use crate::layout::kind;
use crate::stack::PeerId;

use super::{Action, Chunk, ConnError, ConnId, State, Table};

impl<B: Chunk> Table<B> {
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

    pub(super) fn credit(&mut self, peer: PeerId, to: u32, bytes: usize) {
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

    /// Records that `bytes` of capacity were consumed on `c`, and credits
    /// the sender once a quarter of the window (of the smallest a writer
    /// may have, [`Table::set_window_floor`]) has built up. A writer that
    /// waits needs at most half its window (see [`Table::new`]), so when
    /// the reader has drained everything it is owed at least half, and a
    /// quarter always triggers: no deadlock.
    pub(super) fn consumed(&mut self, c: ConnId, bytes: usize) {
        let threshold = self.credit_every;
        let Some(e) = self.get_mut(c) else { return };
        e.unacked += bytes;
        if e.unacked >= threshold && e.state == State::Established {
            let (peer, to, n) = (e.peer, e.remote, e.unacked);
            e.unacked = 0;
            self.credit(peer, to, n);
        }
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
}

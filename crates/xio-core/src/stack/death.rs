//! Deaths the manager cannot announce: with the manager gone, a stack
//! looks at its peers' pidfds itself and closes the channels of those that
//! exited, and waits that never sleep (busy polling, non-blocking, a send
//! waiting for room) look at the control socket on their own tick, since
//! the liveness tick that wakes a sleeper never comes to them.

use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

use crate::sync::Ordering;
use crate::wait::WaitMode;

/// How long [`Stack::manager_died`] waits for the control socket to hang
/// up once the liveness word says the manager died. A dead manager's
/// files close microseconds after the kernel marks the word; a forged
/// word costs a stack this wait once.
const CONFIRM_DEATH: Duration = Duration::from_millis(100);

use super::{Error, PeerId, Stack};

impl Stack {
    /// With no manager left to announce deaths, looks at the peers'
    /// pidfds: a peer whose process exited is closed here as the manager's
    /// `PeerDown` would (what it sent is delivered, then a reset), so a
    /// reader waiting on it does not wait forever. Called on the liveness
    /// tick, which runs while the manager is gone.
    pub(super) fn reap_dead_peers(&mut self) {
        let dead: Vec<u16> = self
            .channels
            .iter()
            .filter(|c| {
                c.peer_pidfd.as_ref().is_some_and(|fd| {
                    let mut p = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
                    matches!(rustix::event::poll(&mut p, Some(&rustix::time::Timespec::default())), Ok(n) if n > 0)
                })
            })
            .map(|c| c.peer)
            .collect();
        for peer in dead {
            tracing::info!(
                stack = self.id,
                peer,
                "peer exited while no manager runs: reset"
            );
            self.close_channel(peer, None);
        }
    }

    /// Whether `peer` still has a channel here, after closing those of
    /// peers whose process exited (their pidfds): what a stack without a
    /// manager can know of a peer.
    pub(crate) fn peer_alive(&mut self, peer: PeerId) -> bool {
        self.reap_dead_peers();
        self.chan_of(peer).is_some()
    }

    /// For a send waiting for room in a ring: with no manager left to
    /// announce a peer's death, looks (once a tick) at the peers' pidfds
    /// as a receive does, so a dead peer's channel is closed and the send
    /// reset rather than waiting for ever. A manager found gone here is
    /// reported by the next receive (the send goes on: its channel works
    /// without one). True if it looked.
    pub(super) fn reap_while_sending(&mut self) -> bool {
        if !self.dead_manager_tick() {
            return false;
        }
        match self.poll_ctrl() {
            Ok(()) => {}
            Err(Error::ManagerGone) => {
                if self.deferred.is_none() {
                    self.deferred = Some(Error::ManagerGone);
                }
                self.reap_dead_peers();
            }
            Err(e) => tracing::warn!(error = %e, "control message from the manager not handled"),
        }
        true
    }

    /// Whether a busy-polling or non-blocking wait should look at the
    /// control socket as the liveness tick makes a sleeping one do (see
    /// [`Stack::dead_manager_tick`]).
    pub(super) fn never_sleeps_tick(&mut self) -> bool {
        matches!(self.mode, WaitMode::BusyPoll | WaitMode::NonBlocking) && self.dead_manager_tick()
    }

    /// Whether a wait that never sleeps on the doorbell should look at the
    /// control socket as the liveness tick makes a sleeping one do: it
    /// never gets that tick, and a dead manager bumps no `ctrl_seq`. With
    /// the manager dead: at once (to report it), then once a tick (a
    /// peer's death then shows only in its pidfd).
    fn dead_manager_tick(&mut self) -> bool {
        if !self.manager_died() {
            return false;
        }
        if !self.manager_gone {
            return true;
        }
        let now = Instant::now();
        if self.busy_tick_due.is_some_and(|t| now < t) {
            return false;
        }
        self.busy_tick_due = Some(now + crate::liveness::TICK);
        true
    }

    /// Whether the manager is gone. The liveness word is a hint: it is in
    /// memory every process of the pool can write, and one forged value
    /// made every stack give its manager up for good. A death is confirmed
    /// by the control socket, which the kernel closes as the manager's
    /// process ends, just after it marks the word: this waits up to
    /// [`CONFIRM_DEATH`] for the hang-up. A word that says "died" while
    /// the socket stays open and silent that long is remembered as forged
    /// and ignored until it changes (the manager puts its own value back).
    pub(crate) fn manager_died(&mut self) -> bool {
        if self.manager_gone {
            return true;
        }
        let w = self.seg.manager_alive().load(Ordering::Acquire);
        if !crate::liveness::died_value(w) || self.forged_liveness == Some(w) {
            return false;
        }
        let ctrl = self.ctrl_fd();
        let mut fds = [PollFd::new(&ctrl, PollFlags::IN | PollFlags::RDHUP)];
        let ts = Timespec {
            tv_sec: 0,
            tv_nsec: CONFIRM_DEATH.as_nanos() as _,
        };
        match rustix::event::poll(&mut fds, Some(&ts)) {
            Ok(0) => {
                tracing::warn!(
                    word = w,
                    "the manager's liveness word says it died, but its socket is open: \
                     ignoring the word (a process that can write the pool overwrote it?)"
                );
                self.forged_liveness = Some(w);
                false
            }
            // A hang-up is the death; data (the manager speaking) is
            // read by the caller's next look, which asks again.
            Ok(_) => fds[0]
                .revents()
                .intersects(PollFlags::HUP | PollFlags::RDHUP | PollFlags::ERR),
            Err(_) => false,
        }
    }
}

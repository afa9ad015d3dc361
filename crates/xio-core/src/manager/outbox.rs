//! Messages to stacks. The manager never blocks on one stack: a message
//! is sent without waiting, and rings the stack; if its socket is full (a
//! stopped stack), it waits in that stack's outbox, with its fds, until
//! the socket has room. The fds outboxes may hold are bounded.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use crate::backend::Doorbell;
use crate::ctrl;
use crate::proto::Msg;
use crate::sync::Ordering;

use super::Manager;

/// Most fds the messages queued for a stack that does not read its control
/// socket (stopped, or stuck) may hold: a new peer's channel carries two,
/// and the manager's fds are for every stack. Past this, connections to
/// that stack are refused until it reads. The rest of what can queue is
/// bounded without a limit: one reply (its requests are not read while
/// anything waits) and one peer's death per channel (a dead peer's
/// channel is not reused before this stack lets it go).
const MAX_OUTBOX_FDS: usize = 256;
/// The share of the manager's fd limit the outboxes of all stacks may hold
/// together: a few stopped stacks must not take the fds every stack needs
/// (accepting, channels).
pub(super) const OUTBOX_FDS_SHARE: u64 = 4;

/// Whether a send's error says the stack's end is closed.
fn hung_up(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::NotConnected
            | io::ErrorKind::ConnectionRefused
    )
}

/// What became of a message [`Manager::try_send`] tried to send.
enum Sent {
    /// Sent, and the stack rung.
    Done,
    /// The stack is gone (its end of file is read by the loop).
    Gone,
    /// Not sent: it must wait in the outbox; `stalled` when the kernel
    /// refused it for another reason than a full socket.
    Queue { stalled: bool },
}

/// How often a message the kernel refused for a reason other than a full
/// socket (`ETOOMANYREFS`: too many fds in flight for the user) is tried
/// again: no poll event says when it would pass.
pub(super) const RETRY_STALLED: std::time::Duration = std::time::Duration::from_millis(20);

impl Manager {
    /// What a stack receives with a channel to `peer`: its pidfd if there
    /// is one, then its doorbell, last (where stacks before the pidfd took
    /// it from).
    fn peer_fds(&self, peer: u16) -> Vec<BorrowedFd<'_>> {
        let e = &self.stacks[&peer];
        e.pidfd
            .as_ref()
            .map(|f| f.as_fd())
            .into_iter()
            .chain(std::iter::once(e.bell.fd()))
            .collect()
    }

    /// Sends `msg` to stack `to` without waiting, with the fds of stack
    /// `fds_of` (a channel's peer) if any, then rings it: a stack that
    /// stopped waiting for a reply (its request timed out) reads it when it
    /// sees the bump. If the socket is full, or older messages wait, the
    /// message joins the stack's outbox, its fds duplicated, and goes when
    /// the socket has room ([`Self::flush`]).
    pub(super) fn deliver(&mut self, to: u16, msg: Msg, fds_of: Option<u16>) {
        let fds = fds_of.map(|p| self.peer_fds(p)).unwrap_or_default();
        let stalled = match self.try_send(to, &msg, &fds) {
            Sent::Done | Sent::Gone => return,
            Sent::Queue { stalled } => stalled,
        };
        let owned: io::Result<Vec<OwnedFd>> = fds.iter().map(|f| f.try_clone_to_owned()).collect();
        let owned = owned.unwrap_or_else(|err| {
            // Out of fds. It goes without them (the stack then fails the
            // channel, or the request, for want of them) rather than not
            // at all, which would put its replies out of step.
            tracing::error!(stack = to, error = %err, ?msg, "no fd left to queue a control message's fds");
            Vec::new()
        });
        self.enqueue(to, msg, owned, stalled);
    }

    /// [`Self::deliver`] with fds of the manager's own (a status report's
    /// memfd), which are queued as they are if they cannot go at once.
    pub(super) fn deliver_owned(&mut self, to: u16, msg: Msg, fds: Vec<OwnedFd>) {
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        let stalled = match self.try_send(to, &msg, &borrowed) {
            Sent::Done | Sent::Gone => return,
            Sent::Queue { stalled } => stalled,
        };
        self.enqueue(to, msg, fds, stalled);
    }

    /// Sends `msg` to stack `to` now if nothing waits before it, and rings
    /// it if it went.
    fn try_send(&self, to: u16, msg: &Msg, fds: &[BorrowedFd<'_>]) -> Sent {
        let Some(e) = self.stacks.get(&to) else {
            return Sent::Gone;
        };
        if !e.outbox.is_empty() {
            return Sent::Queue { stalled: false };
        }
        match ctrl::send_nowait(e.sock.as_fd(), msg, fds) {
            Ok(()) => {
                self.notify(to);
                Sent::Done
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => Sent::Queue { stalled: false },
            // A stack that is gone: the loop reads its end of file.
            Err(err) if hung_up(&err) => Sent::Gone,
            Err(err) => {
                tracing::debug!(stack = to, error = %err, "control message refused; retrying");
                Sent::Queue { stalled: true }
            }
        }
    }

    /// Puts `msg` at the end of stack `to`'s outbox.
    fn enqueue(&mut self, to: u16, msg: Msg, fds: Vec<OwnedFd>, stalled: bool) {
        let Some(e) = self.stacks.get_mut(&to) else {
            return;
        };
        e.outbox_fds += fds.len();
        e.outbox.push_back((msg, fds));
        e.stalled |= stalled;
        if e.outbox.len() == 1 {
            tracing::debug!(stack = to, "control socket full; queueing");
        }
    }

    /// Whether the messages queued for stack `id` hold as many fds as
    /// they may (its own share, or all stacks' together): it gets no new
    /// channel until it reads.
    pub(super) fn outbox_full(&self, id: u16) -> bool {
        let total = || -> usize { self.stacks.values().map(|e| e.outbox_fds).sum() };
        self.stacks.get(&id).is_some_and(|e| {
            !e.outbox.is_empty()
                && (e.outbox_fds + 2 > MAX_OUTBOX_FDS || total() + 2 > self.outbox_fd_budget)
        })
    }

    /// Sends what waits in stack `id`'s outbox, as far as its socket has
    /// room, and rings it if anything went.
    pub(super) fn flush(&mut self, id: u16) {
        let Some(e) = self.stacks.get_mut(&id) else {
            return;
        };
        let mut sent = false;
        e.stalled = false;
        while let Some((msg, fds)) = e.outbox.front() {
            let fds: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
            match ctrl::send_nowait(e.sock.as_fd(), msg, &fds) {
                Ok(()) => {
                    if let Some((_, fds)) = e.outbox.pop_front() {
                        e.outbox_fds -= fds.len();
                    }
                    sent = true;
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                Err(err) if hung_up(&err) => {
                    // Gone, with whatever it had not read.
                    let e = self.stacks.remove(&id).expect("present");
                    return self.on_death(id, e);
                }
                Err(err) => {
                    tracing::debug!(stack = id, error = %err, "control message refused; retrying");
                    e.stalled = true;
                    break;
                }
            }
        }
        if sent {
            self.notify(id);
        }
    }

    fn notify(&self, id: u16) {
        // Sent first, then the sequence bump, then the wake-up: a stack that
        // sees the bump finds the message already queued.
        let slot = self.seg.stack_slot(id);
        slot.ctrl_seq.fetch_add(1, Ordering::SeqCst);
        // Wake it however it sleeps (futex or doorbell); both are harmless
        // when it is awake. Storing 0 also makes a FUTEX_WAIT that has not
        // started yet return at once.
        slot.sleeping.store(0, Ordering::SeqCst);
        crate::sync::futex_wake(&slot.sleeping);
        if let Some(e) = self.stacks.get(&id) {
            let _ = e.bell.ring();
        }
    }
}

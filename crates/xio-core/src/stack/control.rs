//! Talking to the manager over the control socket: requests (bind,
//! unbind, connect) and their answers, which come in order, so a reply to
//! a request whose caller timed out is settled when it comes; answers kept
//! for callers that wait without holding the stack; the manager's
//! unprompted messages (a peer's channel up or down); and messages that
//! found the socket full, queued and sent before anything else.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::ctrl::{self, RecvError};
use crate::proto::Msg;
use crate::sync::Ordering;

use super::error::recv_err;
use super::{Error, PeerId, Stack};

/// The manager's answer to a request (`Err`: a malformed one), with the
/// fds it carried.
type Answer = Result<(Msg, Vec<OwnedFd>), Error>;

/// An answer kept for a caller waiting outside the stack (see
/// [`Stack::begin_request`]).
#[derive(Debug)]
pub(crate) enum Kept {
    /// The reply as it came.
    Reply(Answer),
    /// A `Connect`'s reply, acted on when it was read (the channel set up,
    /// the route recorded), so a peer's death read after it closes that
    /// channel as it should: the peer, or why not. (A refusal by the
    /// manager is a `Reply`.)
    Route(Result<PeerId, Error>),
}
/// How often messages the control socket had no room for (see
/// `Stack::unsent`) are tried again from the ring path.
const UNSENT_RETRY: Duration = Duration::from_millis(1);

impl Stack {
    /// The control socket (others may watch it; only `poll_ctrl` reads it).
    pub(crate) fn ctrl_fd(&self) -> BorrowedFd<'_> {
        self.pool
            .keepalive()
            .expect("a stack always holds its control socket")
    }

    /// Whether a connect to `addr` was sent and its answer has not come.
    pub(crate) fn asking(&self, addr: SocketAddr) -> bool {
        self.unanswered
            .iter()
            .any(|(_, m)| *m == Msg::Connect { addr })
    }

    /// Sends a request and waits for its reply, handling the manager's
    /// unprompted messages (and late replies to requests that timed out)
    /// that arrive first. Waits until `deadline` or the control timeout,
    /// whichever is first: [`Error::TimedOut`] for the caller's deadline,
    /// [`Error::ManagerUnresponsive`] for the manager's.
    pub(super) fn request(
        &mut self,
        msg: &Msg,
        deadline: Option<Instant>,
    ) -> Result<(Msg, Vec<OwnedFd>), Error> {
        let limit = Instant::now().checked_add(self.ctrl_timeout);
        let until = match (deadline, limit) {
            (Some(d), Some(l)) => Some(d.min(l)),
            (d, l) => d.or(l),
        };
        let me = self.send_request(msg)?;
        loop {
            let (m, fds) = match ctrl::recv_until(self.ctrl_fd(), until) {
                Ok(x) => x,
                Err(RecvError::Closed) => {
                    self.manager_gone = true;
                    return Err(Error::ManagerGone);
                }
                Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::TimedOut => {
                    tracing::warn!(
                        stack = self.id,
                        request = ?msg,
                        "the manager did not answer in time"
                    );
                    return Err(if until == limit {
                        Error::ManagerUnresponsive(self.ctrl_timeout)
                    } else {
                        Error::TimedOut
                    });
                }
                // Taken as the reply it stands in place of (replies come
                // in order): a request's own fails, a late one is dropped.
                Err(RecvError::Proto(p)) => {
                    tracing::warn!(error = %p, "malformed reply from the manager");
                    if self.unanswered.front().is_some_and(|&(n, _)| n == me) {
                        self.unanswered.pop_front();
                        return Err(Error::Protocol(p.to_string()));
                    }
                    self.on_reply(Err(Error::Protocol(p.to_string())));
                    continue;
                }
                Err(e) => return Err(recv_err(e)),
            };
            match m {
                // A peer's channel that fails to come up is not this
                // request's failure.
                Msg::ChannelUp { .. } | Msg::PeerDown { .. } => {
                    if let Err(e) = self.handle_async(m, fds) {
                        tracing::warn!(error = %e, "control message from the manager not handled");
                    }
                }
                reply => {
                    if self.unanswered.front().is_some_and(|&(n, _)| n == me) {
                        self.unanswered.pop_front();
                        return Ok((reply, fds));
                    }
                    self.on_reply(Ok((reply, fds)));
                }
            }
        }
    }

    /// Sends request `msg` and queues it as unanswered; its number.
    fn send_request(&mut self, msg: &Msg) -> Result<u64, Error> {
        self.check_not_forked()?;
        if self.manager_gone {
            return Err(Error::ManagerGone);
        }
        self.send_unsent();
        // A message still queued (the socket was full a moment ago) goes
        // first: a request that overtook a release could be answered with
        // the channel it gives up (a Connect, as `existing`), and a Bind
        // that overtook an unbind of its address would be undone by it.
        if !self.unsent.is_empty() {
            return Err(Error::ManagerUnresponsive(self.ctrl_timeout));
        }
        // Not blocking: a manager stopped long enough for timed-out
        // requests to fill the socket's buffer must not hang the sender.
        if let Err(e) = ctrl::send_nowait(self.ctrl_fd(), msg, &[]) {
            return Err(match e.kind() {
                // EPIPE, or ECONNRESET when it closed with our messages
                // unread.
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                    self.manager_gone = true;
                    Error::ManagerGone
                }
                io::ErrorKind::WouldBlock => Error::ManagerUnresponsive(self.ctrl_timeout),
                _ => Error::Io(e),
            });
        }
        let me = self.next_request;
        self.next_request += 1;
        // Queued at once: however this call ends, the reply that comes is
        // this request's, and is settled as such.
        self.unanswered.push_back((me, msg.clone()));
        Ok(me)
    }

    /// A reply (`Err`: a malformed one) to the oldest unanswered request
    /// that is not the reader's own: kept for a caller waiting outside the
    /// stack, else settled (its caller gave up).
    fn on_reply(&mut self, reply: Answer) {
        match self.unanswered.pop_front() {
            Some((n, req)) if self.awaited.contains(&n) => {
                let kept = match (&req, reply) {
                    // The manager's refusal is kept as it came: the caller
                    // tells it from one made here (a channel closed while
                    // connecting), as only the manager's may mean a
                    // wildcard listener of the caller's own.
                    (Msg::Connect { addr }, Ok((m, fds))) if !matches!(m, Msg::Error { .. }) => {
                        Kept::Route(self.connected(*addr, m, fds))
                    }
                    (_, reply) => Kept::Reply(reply),
                };
                self.answered.push((n, req, kept));
            }
            Some((_, req)) => {
                if let Ok((m, fds)) = reply {
                    self.settle(req, m, fds);
                }
            }
            None => tracing::warn!(?reply, "reply to no request ignored"),
        }
    }

    /// Sends request `msg` for a caller that waits for the answer without
    /// holding this stack (so other threads can use it meanwhile): it asks
    /// [`Stack::take_answer`] when the control socket has news, and calls
    /// [`Stack::give_up`] if it stops waiting. Returns the request's number.
    pub(crate) fn begin_request(&mut self, msg: &Msg) -> Result<u64, Error> {
        let n = self.send_request(msg)?;
        self.awaited.push(n);
        Ok(n)
    }

    /// The answer to request `n` (of [`Stack::begin_request`]) if it has
    /// come, reading what the control socket holds.
    pub(crate) fn take_answer(&mut self, n: u64) -> Result<Option<Kept>, Error> {
        if !self.answered.iter().any(|(k, ..)| *k == n) {
            match self.poll_ctrl() {
                Ok(()) | Err(Error::ManagerGone) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "control message from the manager not handled")
                }
            }
        }
        match self.answered.iter().position(|(k, ..)| *k == n) {
            Some(i) => {
                let (_, _, kept) = self.answered.swap_remove(i);
                self.awaited.retain(|&k| k != n);
                Ok(Some(kept))
            }
            None if self.manager_gone => {
                self.give_up(n);
                Err(Error::ManagerGone)
            }
            None => Ok(None),
        }
    }

    /// The caller of request `n` stopped waiting: its answer, now or when
    /// it comes, is settled as a late one.
    pub(crate) fn give_up(&mut self, n: u64) {
        self.awaited.retain(|&k| k != n);
        if let Some(i) = self.answered.iter().position(|(k, ..)| *k == n) {
            // A route was acted on already, as settling would.
            if let (_, req, Kept::Reply(Ok((m, fds)))) = self.answered.swap_remove(i) {
                self.settle(req, m, fds);
            }
        }
    }

    /// The control socket, duplicated: for a thread that waits for it
    /// without holding the stack.
    pub(crate) fn ctrl_fd_owned(&self) -> io::Result<OwnedFd> {
        self.ctrl_fd().try_clone_to_owned()
    }

    /// How long requests wait for the manager.
    pub(crate) fn control_timeout(&self) -> Duration {
        self.ctrl_timeout
    }

    /// How many requests' callers wait for answers outside the stack.
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn awaited(&self) -> usize {
        self.awaited.len()
    }

    /// Acts on the late `reply` to `req`, whose caller was told it timed
    /// out: a channel the manager set up is set up here too (its peer has
    /// it already), and an address bound for us is given back.
    /// Errors are logged: the request's caller is gone.
    fn settle(&mut self, req: Msg, reply: Msg, fds: Vec<OwnedFd>) {
        tracing::info!(stack = self.id, request = ?req, ?reply, "late answer from the manager");
        match (req, reply) {
            (
                Msg::Connect { addr },
                Msg::Connected {
                    channel,
                    dir,
                    peer,
                    generation,
                    existing,
                },
            ) => {
                if !self.by_peer.contains_key(&peer) {
                    if existing {
                        // Closed here since (see `Stack::connected`).
                        return;
                    }
                    if let Err(e) =
                        self.take_channel(channel, dir, peer, generation, fds, "late Connected")
                    {
                        tracing::warn!(error = %e, "late channel not set up");
                        return;
                    }
                }
                self.resolved.insert(addr, peer);
            }
            // Unless the caller tried again: that request follows, and the
            // address is then its to keep (the manager answers Ok to a
            // stack binding what it holds).
            (Msg::Bind { addr }, Msg::Ok)
                if !self
                    .unanswered
                    .iter()
                    .any(|(_, m)| *m == Msg::Bind { addr }) =>
            {
                // Queued if the socket is full (the manager is stopped
                // again, say): dropped, it left the address bound to us
                // for good.
                self.send_later(Msg::Unbind { addr });
            }
            _ => {}
        }
    }

    fn expect_ok(&mut self, msg: &Msg) -> Result<(), Error> {
        match self.request(msg, None)?.0 {
            Msg::Ok => Ok(()),
            Msg::Error { code, message } => Err(Error::Refused { code, message }),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Binds `addr`: other stacks that connect to it reach this one.
    pub fn bind(&mut self, addr: SocketAddr) -> Result<(), Error> {
        self.expect_ok(&Msg::Bind { addr })
    }

    /// Releases `addr`.
    pub fn unbind(&mut self, addr: SocketAddr) -> Result<(), Error> {
        self.expect_ok(&Msg::Unbind { addr })
    }

    fn handle_async(&mut self, m: Msg, fds: Vec<OwnedFd>) -> Result<(), Error> {
        match m {
            Msg::ChannelUp {
                channel,
                dir,
                peer,
                generation,
            } => self.take_channel(channel, dir, peer, generation, fds, "ChannelUp"),
            Msg::PeerDown { channel, peer } => {
                self.close_channel(peer, Some(channel));
                Ok(())
            }
            // Outside `request`, replies are late ones, or answers for
            // callers waiting outside the stack.
            reply => {
                self.on_reply(Ok((reply, fds)));
                Ok(())
            }
        }
    }

    /// Releases `addr` without waiting for the answer: for a request that
    /// failed as [`Error::ManagerUnresponsive`] before it was sent (the
    /// socket was full), and whose caller cannot retry (a listener's
    /// drop). Sent once the socket has room, before any new request.
    pub(crate) fn unbind_later(&mut self, addr: SocketAddr) {
        self.send_later(Msg::Unbind { addr });
    }

    /// Sends `msg` (a release, or an `Unbind` nobody waits for) now, or,
    /// if the socket is full, after those already waiting, at the next
    /// look at the control socket.
    pub(super) fn send_later(&mut self, msg: Msg) {
        self.unsent.push(msg);
        self.send_unsent();
    }

    /// Sends the messages that wait, as far as the socket has room. An
    /// `Unbind` is answered: its reply is expected in turn (and settled,
    /// as nobody waits for it).
    fn send_unsent(&mut self) {
        while let Some(msg) = self.unsent.first() {
            match ctrl::send_nowait(self.ctrl_fd(), msg, &[]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(()) => {
                    let msg = self.unsent.remove(0);
                    if matches!(msg, Msg::Unbind { .. }) {
                        let n = self.next_request;
                        self.next_request += 1;
                        self.unanswered.push_back((n, msg));
                    }
                }
                // No manager to tell.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::BrokenPipe
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::NotConnected
                    ) =>
                {
                    self.unsent.remove(0);
                }
                // Full (WouldBlock), or short of kernel memory (ENOBUFS,
                // ENOMEM): kept for the next try, as the manager waits
                // for a release before it frees the channel, and keeps an
                // address bound until it is unbound.
                Err(_) => return,
            }
        }
    }

    /// Reads pending control messages without blocking. A dead manager is
    /// reported once ([`Error::ManagerGone`]); the channels already set up
    /// keep working after that, without it.
    pub(super) fn poll_ctrl(&mut self) -> Result<(), Error> {
        if self.manager_gone {
            self.reap_dead_peers();
            return Ok(());
        }
        self.send_unsent();
        // A message that could not be acted on is reported once the
        // socket is read out, not at once: those behind it came with the
        // same wake-up, and nothing else makes the stack read them.
        let mut failed = None;
        loop {
            match ctrl::recv(self.ctrl_fd(), true) {
                Ok((m, fds)) => {
                    match (self.handle_async(m, fds), &failed) {
                        (Ok(()), _) => {}
                        (Err(e), None) => failed = Some(e),
                        // Only the first is returned.
                        (Err(e), Some(_)) => {
                            tracing::warn!(error = %e, "control message from the manager not handled")
                        }
                    }
                }
                // Everything a manager sent is queued before it dies, so a
                // dead one whose socket is not closed yet (a process
                // releases its robust futexes before its files) has
                // nothing more to say.
                Err(RecvError::Io(e))
                    if e.kind() == io::ErrorKind::WouldBlock && self.manager_died() =>
                {
                    self.manager_gone = true;
                    return Err(Error::ManagerGone);
                }
                Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    return failed.map_or(Ok(()), Err)
                }
                Err(RecvError::Closed) => {
                    self.manager_gone = true;
                    return Err(Error::ManagerGone);
                }
                Err(RecvError::Proto(p)) => {
                    tracing::warn!(error = %p, "malformed message from the manager ignored");
                    // If it stood for a reply, the next is the next
                    // request's: keep them in step. (An unprompted message
                    // malformed this way costs a late reply's settling.)
                    if !self.unanswered.is_empty() {
                        self.on_reply(Err(Error::Protocol(p.to_string())));
                    }
                }
                Err(e) => return Err(recv_err(e)),
            }
        }
    }

    /// Handles control messages if the manager queued any.
    pub(super) fn poll_ctrl_if_bumped(&mut self) -> Result<(), Error> {
        // Messages that found the socket full wait for room, not for news
        // (a manager reading a release answers nothing, so rings nobody).
        // Once a millisecond at most: a stopped manager fails each try.
        if !self.unsent.is_empty() && !self.manager_gone {
            let now = Instant::now();
            if self.unsent_due.is_none_or(|t| now >= t) {
                self.send_unsent();
                self.unsent_due = (!self.unsent.is_empty()).then(|| now + UNSENT_RETRY);
            }
        }
        let seq = self.slot().ctrl_seq.load(Ordering::Acquire);
        if seq != self.ctrl_seen {
            self.ctrl_seen = seq;
            self.poll_ctrl()?;
        }
        Ok(())
    }
}

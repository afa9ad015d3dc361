//! The serve loop: one `poll` over the stop eventfd, the listener, the
//! connections that have not said `Hello` yet and the registered stacks;
//! then accepting (same user only), and each registered stack's request
//! (bind, unbind, connect, a channel's release, status).

use std::io;
use std::os::fd::{AsFd, BorrowedFd};

use rustix::event::{PollFd, PollFlags};

use crate::ctrl::{self, RecvError};
use crate::fork::CloseOnFork;
use crate::proto::{ErrorCode, Msg};

use super::error::io_err;
use super::outbox::RETRY_STALLED;
use super::session::{hung_up_now, readable_now};
use super::{Manager, ManagerError, Pending};

/// Connections that have not said `Hello`, in all.
const MAX_PENDING: usize = 256;
/// Connections without a `Hello` one process may have: a stack sends its
/// Hello as soon as it connects, so more than a few mean a process that
/// connects and says nothing (a flood meant to push others out).
const MAX_PENDING_PER_PROCESS: usize = 16;
/// How long a connection may stay without saying `Hello`.
const PENDING_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// How long the listener rests after an accept failed (`EMFILE`, `ENFILE`,
/// `ENOBUFS`...): the connection stays queued and the listener readable, so
/// polling it at once would spin until an fd is freed. Stacks already
/// registered are served meanwhile.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

impl Manager {
    /// Serves until stopped. `alive`: this thread's registration as the
    /// pool's live manager, whose word it keeps right.
    pub(super) fn serve(
        &mut self,
        alive: Option<&super::registration::Registration>,
    ) -> Result<(), ManagerError> {
        loop {
            let ids: Vec<u16> = self.stacks.keys().copied().collect();
            let now = std::time::Instant::now();
            let accept_wait = match self.accept_paused {
                Some(until) if until > now => Some(until - now),
                _ => {
                    self.accept_paused = None;
                    None
                }
            };
            let (stop_r, listen_r, pend_r, stack_r) = {
                let mut fds = Vec::with_capacity(2 + self.pending.len() + ids.len());
                fds.push(PollFd::new(&*self.stop, PollFlags::IN));
                let listen = if accept_wait.is_some() {
                    PollFlags::empty()
                } else {
                    PollFlags::IN
                };
                fds.push(PollFd::new(&self.listener, listen));
                for p in &self.pending {
                    fds.push(PollFd::new(&p.sock, PollFlags::IN));
                }
                for id in &ids {
                    let e = &self.stacks[id];
                    // A stack with messages waiting for room: only room
                    // (or its hang-up) is of interest until they are out.
                    let want = if e.left && e.drained {
                        // Only its hang-up (reported unasked): its end of
                        // file is read, and would wake every poll.
                        PollFlags::empty()
                    } else if e.left {
                        // What it still sends, to drop (see
                        // `Self::discard_from_left`), and the shutting of
                        // its end.
                        PollFlags::IN | PollFlags::RDHUP
                    } else if e.outbox.is_empty() {
                        PollFlags::IN
                    } else if e.stalled {
                        // Room is not what it waits for (a hang-up is
                        // still reported).
                        PollFlags::empty()
                    } else {
                        PollFlags::OUT
                    };
                    fds.push(PollFd::new(&e.sock, want));
                }
                let stalled = ids.iter().any(|id| self.stacks[id].stalled);
                let sweep = self
                    .sweep_retry
                    .map(|(at, _)| at.saturating_duration_since(std::time::Instant::now()));
                let audit = Some(
                    self.audit_due()
                        .saturating_duration_since(std::time::Instant::now()),
                );
                let expiry = self
                    .pending
                    .first()
                    .map(|p| (p.since + PENDING_TIMEOUT).saturating_duration_since(now));
                let wait = [
                    stalled.then_some(RETRY_STALLED),
                    accept_wait,
                    sweep,
                    audit,
                    expiry,
                ]
                .into_iter()
                .flatten()
                .min();
                let limit = wait.map(|w| rustix::event::Timespec {
                    tv_sec: w.as_secs() as _,
                    tv_nsec: w.subsec_nanos() as _,
                });
                match rustix::event::poll(&mut fds, limit.as_ref()) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(io_err("poll")(e.into())),
                }
                let ready = |f: &PollFd<'_>| !f.revents().is_empty();
                let np = self.pending.len();
                (
                    ready(&fds[0]),
                    ready(&fds[1]),
                    fds[2..2 + np].iter().map(ready).collect::<Vec<_>>(),
                    fds[2 + np..]
                        .iter()
                        .map(|f| f.revents())
                        .collect::<Vec<_>>(),
                )
            };
            if stop_r {
                return Ok(());
            }
            // Registered stacks first (ids were captured before polling).
            for (id, ev) in ids.iter().zip(stack_r) {
                let r = !ev.is_empty();
                let hup = ev.intersects(PollFlags::HUP | PollFlags::ERR);
                match self.stacks.get(id) {
                    // Hung up: its process closed the socket (a stack that
                    // leaves only shuts down its writes), so it is dead,
                    // whatever waits either way. Requests it queued before
                    // dying, or after it was cut off, are not read: the
                    // socket gives them before its end of file, and acting
                    // on them would bind addresses and open channels (a
                    // peer's `ChannelUp`, with fds) for a dead process. Its
                    // death settles its channels as its end of file would.
                    // Messages waiting for it would go nowhere (a send to
                    // it may also fail for another reason first,
                    // `ETOOMANYREFS`, and be retried for ever).
                    Some(_) if hup => {
                        let e = self.stacks.remove(id).expect("present");
                        self.on_death(*id, e);
                    }
                    // A stack that left has no outbox and is not served.
                    Some(e) if e.left && r => {
                        self.discard_from_left(*id, ev.contains(PollFlags::RDHUP))
                    }
                    Some(e) if (r || e.stalled) && !e.outbox.is_empty() => self.flush(*id),
                    Some(_) if r => self.on_stack_readable(*id),
                    _ => {}
                }
            }
            // Pending connections, from the back so removal keeps indices.
            for i in (0..pend_r.len()).rev() {
                if pend_r[i] {
                    let p = self.pending.remove(i);
                    self.on_pending(p);
                }
            }
            self.expire_pending();
            if listen_r {
                self.accept_all();
            }
            self.sweep(false);
            self.audit();
            if alive.is_some_and(|a| a.repair()) {
                tracing::warn!(
                    "the manager's liveness word was overwritten (by a process that can \
                     write the pool); put back"
                );
                self.snapshot
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .liveness_repairs += 1;
            }
            // Outside a sweep every gate is open: one found closed was
            // closed by a process that can write the segment.
            let reopened = crate::backend::gate::reopen_forged(&self.seg);
            if reopened > 0 {
                tracing::warn!(
                    gates = reopened,
                    "free-list gates found closed outside a sweep (by a process that can \
                     write the pool); reopened"
                );
                self.snapshot
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .gate_repairs += reopened as u64;
            }
            self.publish();
        }
    }

    fn accept_all(&mut self) {
        loop {
            match ctrl::accept(self.listener.as_fd()) {
                Ok(s) => {
                    // The pool is one security domain (see `domain.rs`).
                    if let Err(why) = self.domain.admit(&s) {
                        // Counted (`refused`); logged at debug only, as a
                        // flood of them would flood the log.
                        tracing::debug!(
                            peer = ?ctrl::peer_cred(&s).ok(),
                            "refused a process outside the security domain"
                        );
                        self.refuse(&s, ErrorCode::PermissionDenied, why);
                        continue;
                    }
                    if self.accept_failing {
                        self.accept_failing = false;
                        tracing::info!("accepting connections again");
                    }
                    let pid = ctrl::peer_cred(&s).ok().and_then(|c| c.pid);
                    // What a stack sends as it connects is usually there
                    // already: such a connection is not silent. It is read
                    // at the next turn, as every new one (after the
                    // registered stacks' requests of this turn).
                    let said = readable_now(&s);
                    self.queue_new(Pending {
                        sock: CloseOnFork::new(s),
                        pid,
                        since: std::time::Instant::now(),
                        said,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Gone from the queue: nothing to retry.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e) => {
                    // Once per episode, not per try: it may last.
                    if !self.accept_failing {
                        self.accept_failing = true;
                        tracing::warn!(
                            error = %e,
                            retry_ms = ACCEPT_BACKOFF.as_millis() as u64,
                            "accept failed; new connections wait (registered stacks are still served)"
                        );
                    }
                    self.accept_paused = Some(std::time::Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    fn bad_message(&self, sock: &impl AsFd, why: String) {
        self.snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bad_messages += 1;
        tracing::warn!(reason = %why, "bad control message; closing the connection");
        let _ = ctrl::send_nowait(
            sock.as_fd(),
            &Msg::Error {
                code: ErrorCode::BadMessage,
                message: why,
            },
            &[],
        );
    }

    /// With the table of silent connections full: drops the oldest of the
    /// process that has the most (the one flooding), telling it why, so
    /// that a flood from many processes costs the floods, not a stack
    /// whose Hello is on its way.
    fn evict_pending(&mut self) {
        let mut per: std::collections::HashMap<Option<u32>, usize> = Default::default();
        for p in &self.pending {
            *per.entry(p.pid).or_default() += 1;
        }
        let Some((&worst, _)) = per.iter().max_by_key(|&(_, &n)| n) else {
            return;
        };
        let i = self
            .pending
            .iter()
            .position(|p| p.pid == worst)
            .expect("counted");
        let p = self.pending.remove(i);
        self.refuse(
            &p.sock,
            ErrorCode::Busy,
            "dropped: the manager holds too many connections that have not said Hello, \
             and this process has the most"
                .into(),
        );
    }

    /// Tells a connection why the manager will not serve it, then leaves
    /// it to be dropped, and counts it (for the metrics). An attaching
    /// stack reports the message as the manager's refusal.
    pub(super) fn refuse(&self, sock: &impl AsFd, code: ErrorCode, message: String) {
        let _ = ctrl::send_nowait(sock.as_fd(), &Msg::Error { code, message }, &[]);
        self.snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .refused += 1;
    }

    /// Drops connections that stayed silent for [`PENDING_TIMEOUT`].
    fn expire_pending(&mut self) {
        let now = std::time::Instant::now();
        while self
            .pending
            .first()
            .is_some_and(|p| now.duration_since(p.since) >= PENDING_TIMEOUT)
        {
            let p = self.pending.remove(0);
            self.refuse(
                &p.sock,
                ErrorCode::Busy,
                format!(
                    "no Hello within {} s of connecting",
                    PENDING_TIMEOUT.as_secs()
                ),
            );
        }
    }

    /// Queues a new connection that has not said anything yet, within
    /// the limits: [`MAX_PENDING_PER_PROCESS`] for its process (past it,
    /// refused: it must not push out anyone else's), [`MAX_PENDING`] in
    /// all (past it, the process with the most loses its oldest).
    /// Connections whose client left first count for nothing.
    fn queue_new(&mut self, p: Pending) {
        let mine = |q: &Pending| !q.said && p.pid.is_some() && q.pid == p.pid;
        let silent = |v: &[Pending]| v.iter().filter(|q| mine(q)).count();
        if !p.said && silent(&self.pending) >= MAX_PENDING_PER_PROCESS {
            self.pending.retain(|q| !(mine(q) && hung_up_now(&q.sock)));
        }
        if !p.said && silent(&self.pending) >= MAX_PENDING_PER_PROCESS {
            self.refuse(
                &p.sock,
                ErrorCode::Busy,
                format!(
                    "process {} has {MAX_PENDING_PER_PROCESS} connections to the manager \
                     that have not said Hello, the most one may have",
                    p.pid.unwrap_or(0)
                ),
            );
            return;
        }
        if self.pending.len() >= MAX_PENDING {
            // A flood of connect-and-close must not push out a stack whose
            // Hello is on its way.
            self.pending.retain(|q| !hung_up_now(&q.sock));
        }
        if self.pending.len() >= MAX_PENDING {
            self.evict_pending();
        }
        self.pending.push(p);
    }

    /// Reads the first message of a connection that has not said `Hello`
    /// and acts on it; one with nothing to say yet is queued again.
    fn on_pending(&mut self, p: Pending) {
        let sock = &p.sock;
        let (msg, _fds) = match ctrl::recv(sock.as_fd(), true) {
            Ok(x) => x,
            Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                // Back in its place: the table stays in connection order.
                let at = self.pending.partition_point(|q| q.since <= p.since);
                self.pending.insert(at, p);
                return;
            }
            Err(RecvError::Closed) | Err(RecvError::Io(_)) => return,
            Err(RecvError::Proto(e)) => return self.bad_message(sock, e.to_string()),
        };
        match msg {
            Msg::Hello { pid, name } => self.register(p.sock, pid, name),
            Msg::Status => {
                let (msg, fd) = self.status_reply();
                let fds: Vec<BorrowedFd<'_>> = fd.iter().map(|f| f.as_fd()).collect();
                let _ = ctrl::send_nowait(sock.as_fd(), &msg, &fds);
            }
            other => self.bad_message(sock, format!("expected Hello, got {other:?}")),
        }
    }

    fn on_stack_readable(&mut self, id: u16) {
        let r = ctrl::recv(self.stacks[&id].sock.as_fd(), true);
        let msg = match r {
            Ok((m, _)) => m,
            Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(RecvError::Proto(p)) => {
                self.bad_message(&self.stacks[&id].sock, p.to_string());
                return self.cut_off_for_bad_message(id);
            }
            Err(_) => return self.cut_off(id),
        };
        let reply = match msg {
            Msg::Bind { addr } => self.bind_addr(id, addr),
            Msg::Unbind { addr } => {
                if self.bindings.get(&addr) == Some(&id) {
                    self.bindings.remove(&addr);
                    self.stacks
                        .get_mut(&id)
                        .expect("present")
                        .addrs
                        .remove(&addr);
                }
                Some(Msg::Ok)
            }
            Msg::Connect { addr } => {
                self.connect(id, addr);
                return;
            }
            Msg::ChannelReleased { channel } => {
                self.released(id, channel);
                None
            }
            Msg::Status => {
                let (msg, fd) = self.status_reply();
                return self.deliver_owned(id, msg, fd.into_iter().collect());
            }
            other => {
                self.bad_message(
                    &self.stacks[&id].sock,
                    format!("unexpected {other:?} from a registered stack"),
                );
                return self.cut_off_for_bad_message(id);
            }
        };
        if let Some(m) = reply {
            self.deliver(id, m, None);
        }
    }
}

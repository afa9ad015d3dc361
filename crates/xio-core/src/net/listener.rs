//! [`XioListener`]: a listening socket.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering as AtomicOrdering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::conn::ConnError;
use crate::stack::Error;

use super::connect::kept_ok;
use super::stream::Ttl;
use super::waiters::{wake_all, Key};
#[cfg(doc)]
use super::NetBuilder;
use super::{Event, Net, Try, XioStream};

/// A listening socket. Like `std::net::TcpListener`.
///
/// One bound with [`XioListener::bind`] (on the process-wide
/// [`Net::global`]) follows its manager across a restart: once its net
/// finds the manager gone, `accept` binds the same address on a net
/// attached to the new manager (looking again every 200 ms while none
/// runs, and meanwhile still accepting on the old net) and goes on
/// accepting there. So a server that only accepts stays reachable.
/// Connections accepted before keep working on the old net; ones that had
/// arrived but were not yet accepted are reset. A listener made with
/// [`Net::listen`] stays on its net.
///
/// Differences from `TcpListener` on Linux (see also [`XioStream`]'s): a
/// connect beyond the backlog is refused rather than left to retry (see
/// [`Net::listen_with_backlog`]); any address can be bound, not only
/// this host's (X-IO addresses are names, not routes: where std says
/// `AddrNotAvailable`, the bind succeeds and connects naming the address
/// reach it, unless the net has [`NetBuilder::strict_addresses`]); the
/// TTL is kept and reported only; no file descriptor (an event loop uses
/// [`Net::poll`]).
pub struct XioListener {
    /// Shared by [`XioListener::try_clone`]s; the address is unbound when
    /// the last one goes.
    pub(super) inner: Arc<ListenerInner>,
}

pub(super) struct ListenerInner {
    /// The net it listens on (another one after following a restart).
    pub(super) net: Mutex<Net>,
    pub(super) addr: SocketAddr,
    pub(super) nonblocking: AtomicBool,
    /// `IP_TTL` as set, which accepted streams start with (as Linux's
    /// accepted sockets inherit the listener's).
    pub(super) ttl: Ttl,
    /// For a listener on the process-wide net: when it may next try to
    /// bind on a restarted manager.
    pub(super) follow: Option<Mutex<Instant>>,
}

/// How long a listener following its manager waits between attempts to
/// bind on a restarted one (a failed attempt is one `connect` to a socket
/// path that is not there).
const FOLLOW_RETRY: Duration = Duration::from_millis(200);

impl std::fmt::Debug for XioListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XioListener")
            .field("addr", &self.inner.addr)
            .finish()
    }
}

impl XioListener {
    /// Binds `addr` on the process-wide [`Net::global`]. The listener
    /// follows the pool's manager across restarts (see [`XioListener`]).
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<XioListener> {
        let mut l = Net::with_global(|n| n.listen(&addr))?;
        Arc::get_mut(&mut l.inner).expect("not shared yet").follow =
            Some(Mutex::new(Instant::now()));
        Ok(l)
    }

    /// The address this listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.addr)
    }

    /// The net this listener accepts on (for one made by
    /// [`XioListener::bind`], a new one after it followed a restarted
    /// manager).
    pub fn net(&self) -> Net {
        self.inner
            .net
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits for a connection (or `WouldBlock` in non-blocking mode).
    pub fn accept(&self) -> io::Result<(XioStream, SocketAddr)> {
        let nb = self.inner.nonblocking.load(AtomicOrdering::Relaxed);
        let addr = self.inner.addr;
        loop {
            let net = self.net();
            // A listener that follows its manager and finds it gone binds
            // on a restarted one, or (none runs yet) waits on the old net
            // at most until the next attempt.
            let (gone, deadline) = match &self.inner.follow {
                Some(next) if net.manager_gone() => {
                    if self.try_follow(&net, next) {
                        continue;
                    }
                    (true, Some(*next.lock().unwrap_or_else(|e| e.into_inner())))
                }
                _ => (false, None),
            };
            let follows = self.inner.follow.is_some();
            // The peer's address under the same lock (one lock less per
            // connection on the accepting side).
            let r = net.block(Key::Accept(addr), nb, deadline, |core, wake| {
                if follows && !gone && core.stack.manager_gone() {
                    return Try::Done(Ok(None)); // went away while we waited
                }
                match core.accept_on(addr, wake) {
                    Ok(accepted) => Try::Done(Ok(Some(accepted))),
                    Err(ConnError::WouldBlock) => Try::Wait,
                    Err(e) => Try::Done(Err(e.into())),
                }
            });
            match r {
                Ok(Some((c, peer))) => return Ok((XioStream::accepted(net, c, &self.inner), peer)),
                Ok(None) => continue,
                Err(e) if gone && e.kind() == io::ErrorKind::TimedOut => continue,
                // Another thread (a clone) followed the restart meanwhile
                // and unlistened the old net: accept on the new one.
                Err(e)
                    if follows
                        && e.kind() == io::ErrorKind::NotConnected
                        && self.net().id() != net.id() =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether this listener follows its manager across a restart (one
    /// from [`XioListener::bind`]; see [`XioListener::follow`]).
    pub fn follows(&self) -> bool {
        self.inner.follow.is_some()
    }

    /// For a listener that follows its manager (one from
    /// [`XioListener::bind`]) whose manager is gone: binds the address on
    /// a net attached to a running one if an attempt is due, and says
    /// whether the listener now accepts on a new net (`Ok`), or when to try
    /// again (`Err`: no manager runs yet). `None` otherwise. `accept` does
    /// this itself; an async adapter calls it before `poll_accept` and
    /// wakes its task at the time given (the core has no timers).
    pub fn follow(&self) -> Option<Result<(), Instant>> {
        let next = self.inner.follow.as_ref()?;
        let net = self.net();
        if !net.manager_gone() {
            return None;
        }
        if self.try_follow(&net, next) {
            Some(Ok(()))
        } else {
            Some(Err(*next.lock().unwrap_or_else(|e| e.into_inner())))
        }
    }

    /// Binds this listener's address on a net attached to a running
    /// manager, if the time for an attempt has come. Returns whether the
    /// listener now accepts there.
    fn try_follow(&self, old: &Net, next: &Mutex<Instant>) -> bool {
        let mut next = next.lock().unwrap_or_else(|e| e.into_inner());
        if self.net().id() != old.id() {
            return true; // another thread followed already
        }
        if Instant::now() < *next {
            return false;
        }
        *next = Instant::now() + FOLLOW_RETRY;
        // `global` attaches afresh once a manager runs again; until then
        // it returns the old net.
        let fresh = match Net::global() {
            Ok(n) if n.id() != old.id() => n,
            Ok(_) => {
                tracing::debug!(addr = %self.inner.addr, "manager gone, none runs yet");
                return false;
            }
            Err(e) => {
                tracing::debug!(addr = %self.inner.addr, error = %e, "manager gone, none runs yet");
                return false;
            }
        };
        match fresh.listen(self.inner.addr) {
            Ok(l) => {
                // Swap nets: dropping `l` then unlistens on the old one
                // (resetting what was not accepted there).
                std::mem::swap(
                    &mut *self.inner.net.lock().unwrap_or_else(|e| e.into_inner()),
                    &mut *l.inner.net.lock().unwrap_or_else(|e| e.into_inner()),
                );
                drop(l);
                tracing::info!(addr = %self.inner.addr, "listening again, on the restarted manager");
                true
            }
            Err(e) => {
                tracing::warn!(addr = %self.inner.addr, error = %e, "could not bind again on the restarted manager; trying again");
                false
            }
        }
    }

    /// An endless iterator of accepted streams.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// Always `None`: errors are reported by the calls they concern.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(None)
    }

    /// Another handle on the same listener, as `TcpListener::try_clone`:
    /// either may accept, non-blocking mode is shared, and the address
    /// stays bound until both are dropped.
    pub fn try_clone(&self) -> io::Result<XioListener> {
        Ok(XioListener {
            inner: self.inner.clone(),
        })
    }

    /// Sets `IP_TTL` (1 to 255), which streams accepted from now on start
    /// with, as a TCP listener's accepted sockets do; nothing routes these
    /// bytes, so it changes nothing else.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.inner.ttl.set(ttl)
    }

    /// `IP_TTL` as set (Linux's default of 64 until then).
    pub fn ttl(&self) -> io::Result<u32> {
        Ok(self.inner.ttl.get())
    }

    /// Non-blocking `accept`.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.inner
            .nonblocking
            .store(nonblocking, AtomicOrdering::Relaxed);
        Ok(())
    }
}

/// The iterator [`XioListener::incoming`] returns, as
/// `std::net::Incoming`: `accept` forever.
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a XioListener,
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<XioStream>;
    fn next(&mut self) -> Option<io::Result<XioStream>> {
        Some(self.listener.accept().map(|(s, _)| s))
    }
}

/// How long a closing listener waits for the manager to confirm its
/// unbind (it answers in microseconds when it runs).
const UNBIND_WAIT: Duration = Duration::from_millis(100);

impl Drop for ListenerInner {
    fn drop(&mut self) {
        if self
            .net
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .inherited()
        {
            return; // the parent's listener: nothing of it to undo here
        }
        let addr = self.addr;
        let net = self.net.get_mut().unwrap_or_else(|e| e.into_inner());
        // Waiters still registered for the address (an async accept
        // cancelled while it waited leaves its task's waker; a thread of a
        // listener that followed a restart may wait on this old net): woken
        // after the lock is released, so the wakers leave the net instead
        // of holding their tasks for its lifetime, and a thread looks again.
        let mut waiting = Vec::new();
        // The table and the request in one step (see `Net::listen_one`).
        let asked = net.update(|g| {
            g.table.unlisten(addr);
            // As for a closed stream (see `Core::forget_ready`): no accept
            // event of a closed listener.
            if let Some(i) = g.ready.iter().position(|e| *e == Event::Accept(addr)) {
                g.forget_ready_at(i);
            }
            g.wake_key(Key::Accept(addr), &mut waiting);
            let asked = g.ask(&crate::proto::Msg::Unbind { addr });
            // Not sent: the control socket is full (or holds messages
            // that go first). Queued, not dropped: else the manager kept
            // the address bound to this process for good.
            if let Err(Error::ManagerUnresponsive(_)) = asked {
                g.stack.unbind_later(addr);
            }
            asked
        });
        wake_all(&mut waiting);
        // Not the whole control timeout: a drop should not wait long. A
        // later answer is settled when it comes.
        let unbound = asked.and_then(|a| {
            net.wait_answer(a, Instant::now().checked_add(UNBIND_WAIT))
                .and_then(kept_ok)
        });
        if let Err(e) = unbound {
            tracing::debug!(addr = %addr, error = %e, "unbind failed");
        }
    }
}

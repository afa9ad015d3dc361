//! Listening and connecting, and requests to the manager awaited outside the net.

use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::conn::{ConnError, ConnId};
use crate::stack::{Error, Kept, PeerId};

use super::core::Core;
use super::listener::ListenerInner;
use super::stream::{no_manager_refuses, Ttl, DEFAULT_TTL};
use super::syn::{client_addr, this_node, SYN_LEN};
use super::waiters::{wake_all, Key};
use super::{stack_err, Net, XioListener, XioStream, DEFAULT_BACKLOG};

/// How often a connect refused as this net's own address looks again
/// while a bind of that address is still being answered (`Net::connect_one`).
const BIND_SETTLE: Duration = Duration::from_micros(50);

/// How long a connect waiting for its SYN's answer waits for the manager
/// to say whether the address still belongs to the peer asked.
const ROUTE_CHECK_WAIT: Duration = Duration::from_millis(100);

/// Longest sleep of a thread waiting for the manager's answer outside the
/// net (see `Net::wait_answer`) before it looks whether another thread
/// read it.
const ASK_SLICE: Duration = Duration::from_millis(1);

/// The manager's answer to a bind or unbind as a result.
pub(super) fn kept_ok(k: Kept) -> Result<(), Error> {
    match k {
        Kept::Reply(Ok((crate::proto::Msg::Ok, _))) => Ok(()),
        Kept::Reply(Ok((crate::proto::Msg::Error { code, message }, _))) => {
            Err(Error::Refused { code, message })
        }
        Kept::Reply(Err(e)) => Err(e),
        other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
    }
}

/// A request sent to the manager whose answer is awaited outside the net
/// (see [`Net::wait_answer`]).
pub(super) struct Asked {
    n: u64,
    /// The control socket, duplicated, to wait on.
    fd: std::os::fd::OwnedFd,
    timeout: Duration,
    /// When the control timeout ends for it.
    limit: Option<Instant>,
    what: crate::proto::Msg,
}

/// A small deterministic-enough spread for picking ports.
fn fastrand(i: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut x = t ^ i.wrapping_mul(0x9E37_79B9) ^ std::process::id();
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    x
}

impl Core {
    /// Sends request `msg` to the manager for a caller that waits for
    /// the answer without holding the net ([`Net::wait_answer`]).
    pub(super) fn ask(&mut self, msg: &crate::proto::Msg) -> Result<Asked, Error> {
        let n = self.stack.begin_request(msg)?;
        match self.stack.ctrl_fd_owned() {
            Ok(fd) => {
                let timeout = self.stack.control_timeout();
                Ok(Asked {
                    n,
                    fd,
                    timeout,
                    limit: Instant::now().checked_add(timeout),
                    what: msg.clone(),
                })
            }
            Err(e) => {
                self.stack.give_up(n);
                Err(Error::Io(e))
            }
        }
    }
}

impl Net {
    /// Listens on `addr` (port 0 picks a free port). The address is bound
    /// in the pool's manager, so other processes' `connect` reaches it.
    /// Up to [`DEFAULT_BACKLOG`] connections wait to be accepted; see
    /// [`Net::listen_with_backlog`].
    pub fn listen(&self, addr: impl ToSocketAddrs) -> io::Result<XioListener> {
        self.listen_with_backlog(addr, DEFAULT_BACKLOG)
    }

    /// [`Net::listen`] holding at most `backlog` (at least one)
    /// connections not yet accepted, as `listen(2)`'s argument. A connect
    /// beyond them is refused: its stream's first read fails with
    /// `ConnectionRefused` (where TCP would drop the SYN and let the
    /// client retry). So a client flooding a server that does not accept
    /// cannot grow its memory, or the pool buffers its unaccepted
    /// connections may fill, without bound.
    pub fn listen_with_backlog(
        &self,
        addr: impl ToSocketAddrs,
        backlog: usize,
    ) -> io::Result<XioListener> {
        let mut last = None;
        for a in addr.to_socket_addrs()? {
            match self.listen_one(a, backlog) {
                Ok(l) => return Ok(l),
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to bind")))
    }

    fn listen_one(&self, addr: SocketAddr, backlog: usize) -> io::Result<XioListener> {
        let mut a = addr;
        let mut tries = 0;
        loop {
            if a.port() == 0 || tries > 0 {
                a.set_port(49152 + (fastrand(tries) % 16384) as u16);
            }
            // The table's look and the request in one step, so a listener
            // of this net closing (its unbind) and this bind reach the
            // manager in the order the table saw them; `binding` holds the
            // address while the answer is awaited.
            let asked = {
                let mut g = self.lock();
                if self.shared.strict && !this_node(&mut g.node_ips, a.ip()) {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrNotAvailable,
                        format!(
                            "{} is not an address of this node (strict addresses: \
                             see NetBuilder::strict_addresses)",
                            a.ip()
                        ),
                    ));
                }
                if g.table.is_listening(&a) || g.binding.contains(&a) {
                    if addr.port() != 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::AddrInUse,
                            format!("{a} is already listened on by this net"),
                        ));
                    }
                    None
                } else {
                    let asked = g
                        .ask(&crate::proto::Msg::Bind { addr: a })
                        .map_err(stack_err)?;
                    g.binding.push(a);
                    Some(asked)
                }
            };
            if let Some(asked) = asked {
                let bound = self.wait_answer(asked, None).and_then(kept_ok);
                let mut g = self.lock();
                g.binding.retain(|b| *b != a);
                match bound {
                    Ok(()) => {
                        g.table.listen(a, backlog).map_err(io::Error::from)?;
                        break;
                    }
                    Err(e) => {
                        let e = stack_err(e);
                        if addr.port() != 0 || e.kind() != io::ErrorKind::AddrInUse || tries > 64 {
                            return Err(e);
                        }
                    }
                }
            }
            tries += 1;
        }
        Ok(XioListener {
            inner: Arc::new(ListenerInner {
                net: Mutex::new(self.clone()),
                addr: a,
                nonblocking: AtomicBool::new(false),
                ttl: Ttl::new(DEFAULT_TTL),
                follow: None,
            }),
        })
    }

    /// Waits for the answer to `asked` (see [`Core::ask`]) until
    /// `deadline` or the control timeout, without holding the net: a
    /// stopped or slow manager stops this call only, not every stream of
    /// the process. Whoever reads the control socket meanwhile keeps the
    /// answer for it; the wait wakes when the socket has news, or every
    /// millisecond to look for an answer another thread read.
    pub(super) fn wait_answer(
        &self,
        asked: Asked,
        deadline: Option<Instant>,
    ) -> Result<Kept, Error> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let Asked {
            n,
            fd,
            timeout,
            limit,
            what,
        } = asked;
        let until = match (deadline, limit) {
            (Some(d), Some(l)) => Some(d.min(l)),
            (d, l) => d.or(l),
        };
        loop {
            {
                let mut g = self.lock();
                // A call to the manager: what a write batch of this thread
                // holds leaves first, as before any wait, and is out when
                // the call returns, however soon the answer came.
                g.release_held();
                g.ring_unrung();
                if let Some(kept) = g.stack.take_answer(n)? {
                    return Ok(kept);
                }
                if until.is_some_and(|u| Instant::now() >= u) {
                    g.stack.give_up(n);
                    tracing::warn!(request = ?what, "the manager did not answer in time");
                    return Err(if until == limit {
                        Error::ManagerUnresponsive(timeout)
                    } else {
                        Error::TimedOut
                    });
                }
            }
            let slice = until.map_or(ASK_SLICE, |u| {
                u.saturating_duration_since(Instant::now()).min(ASK_SLICE)
            });
            let ts = Timespec {
                tv_sec: 0,
                tv_nsec: slice.as_nanos() as _,
            };
            let mut p = [PollFd::new(&fd, PollFlags::IN)];
            match poll(&mut p, Some(&ts)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    self.lock().stack.give_up(n);
                    return Err(Error::Io(e.into()));
                }
            }
        }
    }

    /// Connects to `addr`, which some process (this one included) listens
    /// on. Fails with `ConnectionRefused` if nobody does, or if the address
    /// needs the manager to resolve and it is gone (the source error says
    /// so: [`Error::ManagerGone`]). The unspecified address (`0.0.0.0`,
    /// `[::]`) means this host's loopback, as for a TCP connect on Linux.
    ///
    /// Unlike a blocking TCP connect, one to an address this net has
    /// connected to before (the route is known) returns without waiting
    /// for the listener's answer, as a non-blocking connect does: if the
    /// listener has gone since, the stream's first read or write fails
    /// with `ConnectionRefused` instead of the connect.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> io::Result<XioStream> {
        let mut last = None;
        for a in addr.to_socket_addrs()? {
            match self.connect_one(a, None, true) {
                Ok(Some(s)) => return Ok(s),
                Ok(None) => unreachable!("a connect that may ask always answers"),
                Err(e) => last = Some(no_manager_refuses(e)),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to")
        }))
    }

    /// Connects, waiting at most `timeout` (a zero one is `InvalidInput`,
    /// as with `TcpStream::connect_timeout`).
    pub fn connect_timeout(&self, addr: &SocketAddr, timeout: Duration) -> io::Result<XioStream> {
        if timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot set a 0 duration timeout",
            ));
        }
        // A timeout past what an `Instant` holds (`Duration::MAX`) is no
        // deadline, not an overflow panic.
        self.connect_one(*addr, Instant::now().checked_add(timeout), true)
            .map(|s| s.expect("a connect that may ask always answers"))
            .map_err(no_manager_refuses)
    }

    /// Connects to `addr` if that needs no wait: the address is one of
    /// this net's listeners, or one this net has connected to before
    /// (resolved already, to a process still attached). `Ok(None)`
    /// otherwise (the manager would have to resolve it, or an IPv6 SYN's
    /// buffer is not to be had at once), and nothing was sent: then
    /// [`Net::connect`], where blocking is fine (an async adapter calls it
    /// on a blocking thread).
    pub fn connect_known(&self, addr: SocketAddr) -> io::Result<Option<XioStream>> {
        self.connect_one(addr, None, false)
    }

    /// `may_ask`: whether to ask the manager for a route this net does
    /// not know and wait for a SYN's buffer; without it, such a connect
    /// returns `Ok(None)` having done nothing.
    fn connect_one(
        &self,
        addr: SocketAddr,
        deadline: Option<Instant>,
        may_ask: bool,
    ) -> io::Result<Option<XioStream>> {
        // The unspecified address is this host's loopback, as Linux's TCP
        // connect takes it (`connect("0.0.0.0:3000")` dials the address a
        // server bound and reaches it on 127.0.0.1).
        let mut addr = addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        // An IPv6 SYN's buffer, taken before the lock (it may have to
        // wait). An IPv4 SYN needs none (see `kind::SYN4`).
        let syn = match addr {
            SocketAddr::V6(_) if may_ask => Some(self.alloc_wait(SYN_LEN, deadline)?),
            SocketAddr::V6(_) => match self.lock().stack.try_alloc(SYN_LEN) {
                Ok(b) => Some(b),
                Err(Error::WouldBlock) => return Ok(None),
                Err(e) => return Err(stack_err(e)),
            },
            SocketAddr::V4(_) => None,
        };
        // An address this net has no route for is asked of the manager
        // without holding the net (see `Net::wait_answer`).
        let mut g = self.lock();
        let me = g.me();
        let resolved = if g.table.is_listening(&addr) {
            Ok(me) // our own listener
        } else if let Some(p) = g.stack.resolve_known(addr).map_err(stack_err)? {
            Ok(p)
        } else if !may_ask {
            return Ok(None);
        } else {
            let asked = g
                .ask(&crate::proto::Msg::Connect { addr })
                .map_err(stack_err)?;
            drop(g);
            let answer = self.wait_answer(asked, deadline);
            g = self.lock();
            // The manager refuses an address it resolves to us (below). A
            // bind of ours covering `addr` may have reached it before this
            // connect while the binding thread has not put the listener in
            // the table yet: wait for that bind to settle, then look again.
            let refused = matches!(
                answer,
                Ok(Kept::Reply(Ok((
                    crate::proto::Msg::Error {
                        code: crate::proto::ErrorCode::ConnectionRefused,
                        ..
                    },
                    _,
                ))))
            );
            if refused && crate::addr::is_this_node(addr.ip()) {
                while g.table.listener_for(&addr).is_none()
                    && crate::addr::bindings_for(addr).any(|a| g.binding.contains(&a))
                    && deadline.is_none_or(|d| Instant::now() < d)
                {
                    drop(g);
                    std::thread::sleep(BIND_SETTLE);
                    g = self.lock();
                }
            }
            match answer {
                // Listening on it ourselves since.
                _ if g.table.is_listening(&addr) => Ok(me),
                // Acted on when it was read (see `Kept::Route`); the
                // peer may have died since, its death read by another
                // thread: its reset found no connection to reset yet,
                // so refuse here rather than send a SYN nowhere.
                Ok(Kept::Route(Ok(p))) if !g.stack.peer_alive(p) => Err(Error::Refused {
                    code: crate::proto::ErrorCode::ConnectionRefused,
                    message: format!("the process bound to {addr} exited"),
                }),
                Ok(Kept::Route(r)) => r,
                // The manager refuses an address nobody binds, at once.
                // It also refuses one it resolves to us: then it found a
                // wildcard listener of ours (see `crate::addr`), as no
                // other stack binds the address exactly. Only its own
                // refusal means that: one made here (the channel to the
                // stack it named closed while connecting, or that stack
                // exited) is about another stack, which binds the
                // address exactly, and must not reach our wildcard; so is
                // the manager's `Busy` (that stack does not read its
                // control socket), which is why it is not this code.
                Ok(Kept::Reply(Ok((
                    crate::proto::Msg::Error {
                        code: crate::proto::ErrorCode::ConnectionRefused,
                        ..
                    },
                    _,
                )))) if g.table.listener_for(&addr).is_some()
                    && crate::addr::is_this_node(addr.ip()) =>
                {
                    Ok(me)
                }
                Ok(Kept::Reply(Ok((crate::proto::Msg::Error { code, message }, _)))) => {
                    Err(Error::Refused { code, message })
                }
                Ok(Kept::Reply(Ok((m, _)))) => {
                    Err(Error::Protocol(format!("unexpected reply {m:?}")))
                }
                Ok(Kept::Reply(Err(e))) | Err(e) => Err(e),
            }
        };
        let (c, local, drained) = {
            let peer = resolved.map_err(stack_err)?;
            let local = peer == me;
            // The source address depends on the id: reserve it, then fix.
            let c = g
                .table
                .connect(peer, addr, client_addr(me, ConnId(0), &addr))
                .map_err(io::Error::from)?;
            g.table.set_local_addr(c, client_addr(me, c, &addr));
            g.syn_buf = syn;
            let mut wake = Vec::new();
            g.run_actions(&mut wake);
            g.syn_buf = None;
            // A client that only connects, writes and closes never waits,
            // so nothing else would take the listeners' SYN-ACKs off its
            // rings: each of its closed connections would stay in the
            // table until the next wait, and the answers pile up at the
            // listener. Unless a driver thread drains for us, do it here
            // when something is there (one look at the rings otherwise).
            let drained = if !g.driving && g.stack.has_input() {
                g.drain(&mut wake).map(drop)
            } else {
                Ok(())
            };
            drop(g);
            wake_all(&mut wake);
            (c, local, drained)
        };
        let s = XioStream::new(self.clone(), c);
        // A failed drain fails the connect; dropping `s` closes the
        // connection it had already opened.
        drained?;
        if local {
            // Answered already, by our own table.
            self.ensure_connected(c, deadline)?;
        }
        // Otherwise the stream is usable at once: writes go out behind the
        // SYN (addressed by our id until the SYN-ACK tells us the
        // listener's), and the first read waits for the answer.
        Ok(Some(s))
    }

    /// Waits until `c`'s SYN is answered (at once if it was). A refusal is
    /// `ConnectionRefused`, and the address is resolved afresh next time.
    pub(super) fn ensure_connected(&self, c: ConnId, deadline: Option<Instant>) -> io::Result<()> {
        let Some((peer, addr)) = self.syn_target(c)? else {
            return Ok(());
        };
        let r = self.await_syn_ack(c, peer, addr, deadline);
        if let Err(e) = &r {
            if e.kind() == io::ErrorKind::ConnectionRefused {
                // Perhaps a stale resolution: the next connect asks again.
                self.lock().stack.forget_resolution(&addr);
            }
        }
        r
    }

    /// The peer and address of `c`'s SYN if it is not answered yet.
    pub(super) fn syn_target(&self, c: ConnId) -> io::Result<Option<(PeerId, SocketAddr)>> {
        let g = self.lock();
        if !g.table.is_connecting(c) {
            return Ok(None);
        }
        let peer = g.table.peer_of(c).ok_or(ConnError::NotConnected)?;
        let addr = g.table.addrs(c).map_err(io::Error::from)?.1;
        Ok(Some((peer, addr)))
    }

    /// Waits for the answer to a SYN. The answer needs the listening
    /// process to look at its rings, which it does whenever one of its
    /// threads waits in X-IO (an accept loop always does). A process that
    /// stopped listening and does nothing with X-IO any more would leave the
    /// SYN unanswered, so after a little while we ask the manager whether
    /// the address still belongs to that process (`check_syn_route`).
    fn await_syn_ack(
        &self,
        c: ConnId,
        peer: PeerId,
        addr: SocketAddr,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        let mut check = Duration::from_millis(2);
        loop {
            let until = Instant::now() + check;
            let until = deadline.map_or(until, |d| d.min(until));
            let r = self.block(Key::Connect(c), false, Some(until), |core, _| {
                core.connect_step(c)
            });
            match r {
                Err(e)
                    if e.kind() == io::ErrorKind::TimedOut
                        && deadline.is_none_or(|d| Instant::now() < d) =>
                {
                    self.check_syn_route(c, peer, addr, deadline)?;
                    check = (check * 2).min(Duration::from_millis(100));
                }
                r => return r,
            }
        }
    }

    /// For a connection `c` whose SYN to `peer` (for `addr`) is not
    /// answered yet: asks the manager whether `addr` still belongs to
    /// `peer`, and if not refuses the connection here
    /// (`ConnectionRefused`; the caller retries with a fresh resolution).
    /// Waits for the manager at most [`ROUTE_CHECK_WAIT`] (or `deadline`),
    /// holding the net.
    pub(super) fn check_syn_route(
        &self,
        c: ConnId,
        peer: PeerId,
        addr: SocketAddr,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        let mut g = self.lock();
        if !g.table.is_connecting(c) {
            return Ok(()); // answered meanwhile
        }
        g.stack.forget_resolution(&addr);
        // A question, not the connect itself: a manager that does not
        // answer at once is not waited for (holding the lock), and its late
        // answer is settled later. Asked already with no answer yet: not
        // again (each ask holds the lock while it waits).
        let ask = Instant::now() + ROUTE_CHECK_WAIT;
        let ask = deadline.map_or(ask, |d| d.min(ask));
        let answer = if g.stack.asking(addr) {
            Err(Error::ManagerUnresponsive(ROUTE_CHECK_WAIT))
        } else {
            g.stack.connect_until(addr, Some(ask))
        };
        let still = match answer {
            Ok(p) => p == peer,
            Err(Error::Refused { .. }) => false,
            // Nobody to ask, or nobody answering: wait on while the process
            // lives (it answers when it next looks at its rings), and keep
            // the route.
            Err(Error::ManagerGone | Error::ManagerUnresponsive(_) | Error::TimedOut) => {
                let alive = g.stack.peer_alive(peer);
                if alive {
                    g.stack.remember_resolution(addr, peer);
                }
                alive
            }
            Err(e) => return Err(stack_err(e)),
        };
        // Answered while the manager was asked: the answer stands.
        if !still && g.table.is_connecting(c) {
            // Nobody will answer: refuse it here.
            g.table.on_rst(peer, c);
            let mut wake = Vec::new();
            g.run_actions(&mut wake);
            drop(g);
            wake_all(&mut wake);
            return Err(ConnError::Refused.into());
        }
        Ok(())
    }
}

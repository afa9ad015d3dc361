//! [`Core`], a net's state under its lock: draining the rings, running the table's actions, sends queued behind full rings.

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::sync::atomic::AtomicUsize;
use std::sync::Arc;
use std::task::Waker;
use std::time::{Duration, Instant};

use crate::buf::{Buf, BufMut};
use crate::conn::{Action, ConnError, ConnId, Table};
use crate::layout::kind;
use crate::signal::ReadSignal;
use crate::stack::{Error, Incoming as StackInput, PeerId, Probe, Stack};
use crate::sync::FxHashMap as HashMap;

#[cfg(doc)]
use super::data::SPARE_MAX;
use super::event_loop::Event;
#[cfg(doc)]
use super::event_loop::RETRY_FULL;
use super::stack_err;
use super::syn::{client_addr, decode_syn, encode_syn, this_node};
#[cfg(doc)]
use super::waiters::WaitEntry;
use super::waiters::{Key, Waiter, WaiterMap};
#[cfg(doc)]
use super::{Net, Shared, WriteBatch, XioStream};

/// Sends queued for a peer whose ring is full beyond which resets to it
/// are dropped (see `Core::send_or_queue`).
const RST_QUEUE_MAX: usize = 4096;

/// Most descriptors one drain takes with batch wake-up on: enough to wake
/// many connections per pass, few enough that the first of them is served
/// (and its reply on its way) before the rest are even looked at.
const DRAIN_BATCH: usize = 32;

/// A send that did not fit the ring, kept in order per peer.
pub(super) enum Pending {
    Ctrl { kind: u8, to: u32, args: [u32; 2] },
    Buf { kind: u8, to: u32, buf: BufMut },
}

pub(super) struct Core {
    /// [`Shared::waking`].
    pub(super) waking: Arc<AtomicUsize>,
    /// Threads woken from blocking calls, ever (a test hook's figure).
    pub(super) threads_woken: u64,
    pub(super) stack: Stack,
    pub(super) table: Table<Buf>,
    pub(super) driving: bool,
    pub(super) probe: Option<Box<Probe>>,
    pub(super) waiters: WaiterMap,
    /// The last [`WaitEntry`] id given out.
    pub(super) entries: u64,
    /// The read signal of each stream that recorded a registered waker or
    /// an empty read, by connection index (see [`ReadSignal`]).
    pub(super) signals: Vec<Option<Arc<ReadSignal>>>,
    /// Emptied waiter lists kept for reuse (see `Core::recycle`).
    pub(super) spare_lists: Vec<Vec<Waiter>>,
    pub(super) parked: usize,
    pub(super) pending: HashMap<PeerId, VecDeque<Pending>>,
    /// [`Shared::batch_owner`]: set and cleared by a [`WriteBatch`]
    /// (cleared with the lock held, after the held writes left).
    pub(super) batch_owner: Arc<AtomicUsize>,
    /// Stream writes held by a write batch: peer, kind, receiver's
    /// connection, buffer; in the order they were made.
    pub(super) held: Vec<(PeerId, u8, u32, BufMut)>,
    /// Scratch of `release_held`, kept so a batch allocates nothing: one
    /// peer's share of `held`, and the other peers' for the next round.
    pub(super) held_run: Vec<(u8, u32, BufMut)>,
    pub(super) held_rest: Vec<(PeerId, u8, u32, BufMut)>,
    pub(super) force_ctrl: bool,
    pub(super) batch: bool,
    pub(super) ready: Vec<Event>,
    /// The connection of each entry of `ready` (none for accepts).
    pub(super) ready_conn: Vec<Option<u32>>,
    pub(super) track_ready: bool,
    /// By connection index: the connection and its entry's index in
    /// `ready` when last listed; current only if `ready_conn` there still
    /// names it (dedup without a map, and without clearing per poll).
    pub(super) ready_seen: Vec<(u32, u32)>,
    /// Tokens chosen with [`XioStream::set_token`], by connection index,
    /// with the connection they were chosen for.
    pub(super) user_tokens: Vec<Option<(u32, u64)>>,
    /// Addresses whose bind is awaited (see `Net::listen_one`).
    pub(super) binding: Vec<SocketAddr>,
    /// Addresses of this node that peers' SYNs named (see
    /// [`this_node`]): each looked up once, not at every SYN.
    pub(super) node_ips: Vec<std::net::IpAddr>,
    /// The buffer the next IPv6 SYN travels in (allocated before taking
    /// the lock; an IPv4 SYN needs none).
    pub(super) syn_buf: Option<BufMut>,
    /// Buffers of the smallest class that reads emptied, kept writable
    /// for the next writes (see `Core::keep_spare`).
    pub(super) spare: Vec<BufMut>,
    /// Most spares kept: [`SPARE_MAX`], fewer in a pool whose smallest
    /// class is small (see [`Stack::keep_aside`]).
    pub(super) spare_max: usize,
    /// The smallest class's buffer size.
    pub(super) spare_size: usize,
    /// Peers sent to without a wake-up yet (see `Core::push`).
    pub(super) unrung: Vec<PeerId>,
    /// Peers a SYN-ACK or data could not reach (their channel is gone).
    pub(super) refused_peers: Vec<PeerId>,
    /// Resets dropped for peers that do not drain their rings.
    pub(super) rst_dropped: u64,
    /// Tasks waiting on something nothing signals (a full ring, an empty
    /// pool): an adapter's driver wakes them after a short pause.
    pub(super) retry_waiters: Vec<Waker>,
    /// A spin before parking that found nothing: (ns spun, when it ended).
    pub(super) missed: Option<(u64, u64)>,
    /// Non-blocking writes that returned `WouldBlock` for a full ring or an
    /// empty pool (which no peer signals): [`Net::poll`] reports them
    /// writable after [`RETRY_FULL`], with when each was noted.
    pub(super) retry_writes: Vec<(ConnId, Instant)>,
    /// Writes of `retry_writes` reported writable since
    /// [`Net::poll_nowait`] last set its timer: the loop tries them again,
    /// and may find them blocked again (see `Core::set_retry_timer`).
    pub(super) retries_reported: usize,
    /// When [`Net::poll_nowait`] last read the control socket.
    pub(super) last_liveness: u64,
    /// The epoll instance behind [`Net::manager_watch`], kept to be
    /// emptied when the manager is found gone.
    pub(super) manager_watch: Option<std::os::fd::OwnedFd>,
    /// The epoll instance behind [`Net::poll_fd`] (the doorbell and
    /// `retry_timer`), made on first ask.
    pub(super) loop_fd: Option<std::os::fd::OwnedFd>,
    /// A timerfd in `loop_fd`: set while the net's own sends wait for a
    /// peer's full ring, or `retry_writes` for a ring or a buffer (which
    /// no peer signals), so a loop asleep on the fd retries them after a
    /// pause (see `Core::set_retry_timer`, `Core::note_retry_write`).
    pub(super) retry_timer: Option<std::os::fd::OwnedFd>,
    /// `retry_timer` is set: the pause it was set for, and how many sends
    /// waited then (fewer later: the peer makes room, retry soon again).
    pub(super) retry_armed: Option<(Duration, usize)>,
    /// Tests: the next [`Net::drive`] fails as a drain can (a control
    /// message the stack could not act on, say).
    #[cfg(test)]
    pub(super) fail_drive: bool,
    /// An error [`Net::poll_nowait`] met after it had collected events:
    /// those went to the caller, this comes with its next call.
    pub(super) poll_error: Option<io::Error>,
    /// The drain has acted on the manager's end (see `drain`).
    pub(super) told_gone: bool,
    /// [`Net::doorbell`] was handed out: a reactor (xio-tokio's driver, an
    /// event loop) may sleep on it, relying on the doorbell staying armed.
    pub(super) bell_out: bool,
    /// The drain is acting on what the rings brought, which the peers
    /// rang the doorbell for (see `run_actions`).
    pub(super) draining: bool,
    /// Drains that found something (no clock read on the data path)...
    pub(super) data_drains: u64,
    /// ...as of the last watch end, and when that count last moved (ns).
    pub(super) data_seen: (u64, u64),
}

impl Core {
    pub(super) fn me(&self) -> PeerId {
        self.stack.id()
    }

    /// Sends (or queues, behind earlier sends to the same peer) one
    /// descriptor. A peer whose channel is gone is reset by the drain that
    /// follows; what was queued for it is dropped (buffers back to the pool).
    fn send_or_queue(&mut self, peer: PeerId, p: Pending) {
        // What a write batch holds goes first (pushed, or queued ahead):
        // a FIN or reset must not overtake a connection's data.
        self.release_held();
        let q = self.pending.entry(peer).or_default();
        if !q.is_empty() {
            if q.len() >= RST_QUEUE_MAX
                && matches!(
                    p,
                    Pending::Ctrl {
                        kind: kind::RST,
                        args: [0, _],
                        ..
                    }
                )
            {
                // A peer that keeps sending but never drains its ring
                // would otherwise grow this queue by one reset for every
                // forged SYN or SYN-ACK, without bound. Such a reset
                // answers something that names no live connection here;
                // dropping it loses that peer nothing it could not learn
                // by reading (as TCP rate-limits its resets). A reset
                // that ends a connection ([`kind::RST_ENDS`]) always
                // goes: there are at most as many as connections.
                self.rst_dropped += 1;
                tracing::debug!(%peer, "reset to a peer that does not drain dropped");
                return;
            }
            q.push_back(p);
            return;
        }
        match self.push(peer, p) {
            Ok(None) => {}
            Ok(Some(p)) => {
                // The first send left waiting for ring space rings our own
                // doorbell, as the first retrier does (`add_retry`): an
                // adapter's driver asleep on it would otherwise never see
                // `retry`, and a FIN queued behind a full ring by a task
                // that then only reads stayed queued for good.
                if !self.has_pending() {
                    let _ = self.stack.ring_self();
                }
                self.pending.entry(peer).or_default().push_back(p);
            }
            Err(_) => self.refused_peers.push(peer),
        }
    }

    /// One push: `Ok(Some)` hands it back when the ring is full. The peer
    /// is not woken yet: it is noted, and [`Core::ring_unrung`] wakes each
    /// noted peer once, so the SYN-ACKs, FINs and credits one drain
    /// produces cost one doorbell check per peer, not one each.
    fn push(&mut self, peer: PeerId, p: Pending) -> Result<Option<Pending>, Error> {
        if !self.unrung.contains(&peer) {
            self.unrung.push(peer);
        }
        match p {
            Pending::Ctrl { kind, to, args } => {
                if self.stack.push_control(peer, kind, to, args, false)? {
                    Ok(None)
                } else {
                    Ok(Some(Pending::Ctrl { kind, to, args }))
                }
            }
            Pending::Buf { kind, to, buf } => Ok(self
                .stack
                .push_buf(peer, kind, to, buf, false)
                .map_err(|(e, _)| e)?
                .map(|buf| Pending::Buf { kind, to, buf })),
        }
    }

    /// Wakes (if asleep) every peer [`Core::push`] sent to since the last
    /// call.
    pub(super) fn ring_unrung(&mut self) {
        for p in self.unrung.drain(..) {
            self.stack.wake_peer(p);
        }
    }

    /// Pushes queued sends in order; true if nothing is left queued.
    pub(super) fn flush_pending(&mut self) -> bool {
        // Held writes join their peers' queues first, in order (taking a
        // queue out below and putting it back must not lose them).
        self.release_held();
        if self.pending.values().all(VecDeque::is_empty) {
            return true;
        }
        let peers: Vec<PeerId> = self.pending.keys().copied().collect();
        for p in peers {
            let mut q = self.pending.remove(&p).unwrap_or_default();
            while let Some(item) = q.pop_front() {
                match self.push(p, item) {
                    Ok(None) => {}
                    Ok(Some(item)) => {
                        q.push_front(item);
                        break;
                    }
                    Err(_) => {
                        q.clear();
                        self.refused_peers.push(p);
                    }
                }
            }
            if !q.is_empty() {
                self.pending.insert(p, q);
            }
        }
        self.ring_unrung();
        self.pending.values().all(VecDeque::is_empty)
    }

    /// [`Core::flush_pending`] until nothing is left queued or `deadline`,
    /// pausing between tries for peers to make room; true if all went.
    pub(super) fn flush_pending_until(&mut self, deadline: Instant) -> bool {
        while !self.flush_pending() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        true
    }

    pub(super) fn has_pending(&self) -> bool {
        self.pending.values().any(|q| !q.is_empty())
    }

    /// How many sends wait for ring space.
    pub(super) fn pending_len(&self) -> usize {
        self.pending.values().map(VecDeque::len).sum()
    }

    pub(super) fn pending_for(&self, peer: PeerId) -> bool {
        self.pending.get(&peer).is_some_and(|q| !q.is_empty())
    }

    /// Moves what the rings hold into the table and runs what follows.
    pub(super) fn drain(&mut self, wake: &mut Vec<Waiter>) -> io::Result<usize> {
        self.flush_pending();
        let max = if self.batch { DRAIN_BATCH } else { 1 };
        let force = std::mem::take(&mut self.force_ctrl);
        let me = self.me();
        let table = &mut self.table;
        let node_ips = &mut self.node_ips;
        let mut gone = Vec::new();
        let r = self.stack.poll_events(max, force, &mut |ev| match ev {
            StackInput::Buf {
                from,
                kind: kind::STREAM,
                conn,
                buf,
            } => table.on_data(from, ConnId(conn), buf),
            StackInput::Buf {
                from,
                kind: k,
                conn,
                buf,
            } if k == kind::STREAM | kind::EARLY => {
                if let Some(c) = table.early_conn(from, conn) {
                    table.on_data(from, c, buf);
                }
            }
            StackInput::Buf {
                from,
                kind: kind::SYN,
                conn,
                buf,
            } => match decode_syn(&buf) {
                // The source the buffer names is the peer's word: a stack
                // could claim another's client address, or any host's.
                // The ring says who sent it, and that makes the address
                // (as for a SYN4).
                Some((target, _)) => {
                    let source = client_addr(from, ConnId(conn), &target);
                    table.on_syn_from(from, conn, target, source, |ip| this_node(node_ips, ip))
                }
                None => {
                    tracing::warn!(peer = %from, "malformed SYN refused");
                }
            },
            StackInput::Buf { from, kind, .. } => {
                tracing::debug!(peer = %from, kind, "dropped a non-stream buffer");
            }
            StackInput::Control {
                from,
                kind: kind::SYN4,
                conn,
                arg,
                arg2,
            } => match u16::try_from(arg2) {
                Ok(port) => {
                    let target = SocketAddr::from((std::net::Ipv4Addr::from(arg), port));
                    let source = client_addr(from, ConnId(conn), &target);
                    table.on_syn_from(from, conn, target, source, |ip| this_node(node_ips, ip));
                }
                Err(_) => tracing::warn!(peer = %from, arg2, "malformed SYN refused"),
            },
            StackInput::Control {
                from,
                kind,
                conn,
                arg,
                ..
            } => dispatch_control(table, from, kind, conn, arg),
            StackInput::Message(m) => {
                tracing::debug!(peer = %m.from, "dropped a zero-copy message");
            }
            StackInput::PeerGone(p) => {
                table.on_peer_gone(p);
                gone.push(p);
            }
        });
        let _ = me;
        for p in gone {
            self.pending.remove(&p);
        }
        let n = match r {
            Ok(n) => n,
            Err(Error::ManagerGone) => {
                tracing::warn!("the X-IO manager went away; open connections keep working");
                0
            }
            Err(e) => return Err(stack_err(e)),
        };
        // However the stack found its manager gone (here, or a request's
        // failed send), its socket stays readable (end of file): quiet the
        // watch for good, in every copy handed out.
        if self.stack.manager_gone() && !self.told_gone {
            self.told_gone = true;
            if let Some(w) = self.manager_watch.take() {
                let _ = rustix::event::epoll::delete(&w, self.stack.ctrl_fd());
            }
            // Waiting accepts look again: a listener that follows the
            // process-wide net (xio-tokio's) then binds on the new one.
            let keys: Vec<Key> = self
                .waiters
                .keys()
                .filter(|k| matches!(k, Key::Accept(_)))
                .collect();
            for k in keys {
                self.wake_key(k, wake);
            }
        }
        self.draining = true;
        self.run_actions(wake);
        self.draining = false;
        if n > 0 {
            self.data_drains = self.data_drains.wrapping_add(1);
            if let Some((spun, at)) = self.missed.take() {
                // A worker's spin before parking missed this traffic: tell
                // the policy how long the gap really was.
                let gap = crate::wait::now_ns().saturating_sub(at);
                self.stack.spin_mut().on_sleep(spun, gap, None);
            }
        }
        Ok(n)
    }

    /// Carries out what the table asked for: sends, and wake-ups.
    pub(super) fn run_actions(&mut self, wake: &mut Vec<Waiter>) {
        let me = self.me();
        let mut kick = false;
        // Whether readiness was noted (for an event loop's `poll`).
        let mut ready = false;
        loop {
            let Some(a) = self.table.poll_action() else {
                // Peers whose channel vanished under a send: what they sent
                // before (a FIN, say) is still to be read, and the stack
                // queued their reset behind it, which the next drain
                // delivers in order. Resetting their connections here
                // instead would turn a clean close into a reset.
                for p in std::mem::take(&mut self.refused_peers) {
                    self.pending.remove(&p);
                }
                self.ring_unrung();
                break;
            };
            let key = match a {
                Action::SendSyn {
                    peer,
                    conn,
                    target,
                    source,
                } => {
                    if peer == me {
                        let source = self.table.addrs(conn).map_or(source, |a| a.0);
                        self.table.on_syn(me, conn.0, target, source);
                    } else if let SocketAddr::V4(t) = target {
                        // No buffer: the address fits the descriptor, and
                        // the listener derives our address from our ids.
                        debug_assert_eq!(
                            self.table.addrs(conn).map(|a| a.0).ok(),
                            Some(client_addr(me, conn, &target))
                        );
                        self.send_or_queue(
                            peer,
                            Pending::Ctrl {
                                kind: kind::SYN4,
                                to: conn.0,
                                args: [u32::from(*t.ip()), u32::from(t.port())],
                            },
                        );
                    } else if let Some(mut buf) = self.syn_buf.take() {
                        let source = self.table.addrs(conn).map_or(source, |a| a.0);
                        encode_syn(&mut buf, &target, &source);
                        self.send_or_queue(
                            peer,
                            Pending::Buf {
                                kind: kind::SYN,
                                to: conn.0,
                                buf,
                            },
                        );
                    } else {
                        // Only `connect` makes SYNs, and it provides the buffer.
                        self.table.on_rst(peer, conn);
                    }
                    continue;
                }
                Action::Control {
                    peer,
                    kind,
                    to,
                    arg,
                } => {
                    if peer == me {
                        dispatch_control(&mut self.table, me, kind, to, arg);
                    } else {
                        self.send_or_queue(
                            peer,
                            Pending::Ctrl {
                                kind,
                                to,
                                args: [arg, 0],
                            },
                        );
                    }
                    continue;
                }
                Action::Readable(c) => {
                    self.note_ready(c, true, false);
                    self.wake_poller(wake);
                    ready = true;
                    Key::Read(c)
                }
                Action::Writable(c) => {
                    self.note_ready(c, false, true);
                    self.wake_poller(wake);
                    ready = true;
                    Key::Write(c)
                }
                Action::Connected(c) => {
                    if self.table.connect_result(c) == Err(ConnError::Refused) {
                        // A refusal that came after `connect` returned
                        // (it does not wait for the answer): the route it
                        // used may be stale, the address handed over to
                        // another process. The next connect asks again.
                        if let (Some(peer), Ok((_, addr))) =
                            (self.table.peer_of(c), self.table.addrs(c))
                        {
                            self.stack.forget_resolution_to(&addr, peer);
                        }
                    }
                    self.note_ready(c, true, true);
                    self.wake_poller(wake);
                    ready = true;
                    Key::Connect(c)
                }
                Action::Acceptable(addr) => {
                    if self.track_ready && !self.ready.contains(&Event::Accept(addr)) {
                        self.ready.push(Event::Accept(addr));
                        self.ready_conn.push(None);
                        kick |= self.wake_key(Key::Poll, wake);
                        ready = true;
                    }
                    Key::Accept(addr)
                }
            };
            kick |= self.wake_key(key, wake);
        }
        // A driver waiting on the rings (another thread) cannot see what a
        // local operation made ready (a connection to this same process,
        // say): wake it so it looks.
        if kick && self.driving {
            self.stack.kick();
        }
        // Nor can an event loop asleep on the doorbell's fd: the peers
        // ring it for what they send, but what an operation of this net
        // made ready (another thread's write on a connection within the
        // net, the window a read of one gave back to its writer, a dial
        // to the net's own listener) came from no ring. What a drain
        // found, the poll that drains collects, or the peers rang for.
        if ready && self.track_ready && !self.draining {
            self.ring_reactor();
        }
    }

    /// Rings the doorbell if a reactor may sleep on it ([`Net::doorbell`]
    /// was handed out): for news it would not hear otherwise.
    pub(super) fn ring_reactor(&mut self) {
        if self.bell_out {
            let _ = self.stack.ring_self();
        }
    }
}

impl Drop for Core {
    /// Sends what still waits for ring space (a FIN behind a full ring, say)
    /// before the stack detaches, waiting a little for peers to make room:
    /// otherwise a peer would see a reset where it should read end of
    /// stream. Bounded: a peer that never drains is reset by its manager.
    fn drop(&mut self) {
        if self.stack.forked() {
            return; // the parent's connections: nothing here to send
        }
        if !self.flush_pending_until(Instant::now() + Duration::from_secs(1)) {
            tracing::warn!("closing with sends a peer never made room for");
        }
        // An adapter's driver task asleep on a duplicate of the doorbell
        // (xio-tokio's) holds only a weak reference to the net: woken, it
        // finds the net gone and ends, with its fds. Nothing else would
        // ever wake it.
        let _ = self.stack.ring_self();
    }
}

fn dispatch_control(table: &mut Table<Buf>, from: PeerId, k: u8, conn: u32, arg: u32) {
    let c = if k & kind::EARLY != 0 {
        match table.early_conn(from, conn) {
            Some(c) => c,
            None => return,
        }
    } else {
        ConnId(conn)
    };
    match kind::base(k) {
        kind::SYN_ACK => table.on_syn_ack(from, c, arg),
        kind::FIN => table.on_fin(from, c),
        kind::RST => table.on_rst(from, c),
        kind::CREDIT => table.on_credit(from, c, arg),
        _ => tracing::warn!(peer = %from, k, "unexpected control descriptor ignored"),
    }
}

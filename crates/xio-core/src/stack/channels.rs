//! Channels to peers: connecting to an address (the manager's `Connect`,
//! or a route already known), setting up a channel's rings and doorbell
//! from what the manager sends, closing a channel (what the peer sent is
//! delivered first, then a reset), and the routes (address to peer)
//! learnt and forgotten.

use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::time::Instant;

use crate::backend::{DescConsumer, DescProducer, EventFdDoorbell};
use crate::proto::Msg;
use crate::sync::Ordering;

use super::{Chan, Error, Event, PeerId, Stack};

impl Stack {
    /// Opens (or reuses) the channel to the stack bound to `addr`.
    /// Fails with `Refused { code: ConnectionRefused }` if nobody bound it.
    pub fn connect(&mut self, addr: SocketAddr) -> Result<PeerId, Error> {
        self.connect_until(addr, None)
    }

    /// [`Stack::connect`], waiting for the manager until `deadline` at
    /// most (and the control timeout).
    pub(crate) fn connect_until(
        &mut self,
        addr: SocketAddr,
        deadline: Option<Instant>,
    ) -> Result<PeerId, Error> {
        if let Some(p) = self.resolve_known(addr)? {
            return Ok(p);
        }
        let (m, fds) = self.request(&Msg::Connect { addr }, deadline)?;
        self.connected(addr, m, fds)
    }

    /// The peer `addr` resolves to, if this stack knows it without asking
    /// the manager (after reading the news of deaths).
    pub(crate) fn resolve_known(&mut self, addr: SocketAddr) -> Result<Option<PeerId>, Error> {
        self.check_not_forked()?;
        // Deaths first: a peer the manager announced dead (or, with no
        // manager, whose pidfd says so) loses its channel and with it its
        // routes, so a service restarted on its address is asked for
        // instead of the corpse (a stack that made no call since the death
        // has not read the announcement yet).
        match self.poll_ctrl_if_bumped() {
            Ok(()) | Err(Error::ManagerGone) => {}
            // Trouble with some other message is no reason to fail this
            // connect (it would have succeeded before looking).
            Err(e) => tracing::warn!(error = %e, "control message from the manager not handled"),
        }
        if self.manager_died() {
            self.reap_dead_peers();
        }
        if let Some(&p) = self.resolved.get(&addr) {
            if let Some(&ci) = self.by_peer.get(&p) {
                return Ok(Some(self.channels[ci].peer_id));
            }
        }
        Ok(None)
    }

    /// Acts on the manager's answer `m` to a `Connect` to `addr`: the
    /// channel to the peer, set up if new.
    pub(crate) fn connected(
        &mut self,
        addr: SocketAddr,
        m: Msg,
        fds: Vec<OwnedFd>,
    ) -> Result<PeerId, Error> {
        match m {
            Msg::Connected {
                channel,
                dir,
                peer,
                generation,
                existing,
            } => {
                if !self.by_peer.contains_key(&peer) {
                    // A channel the manager had for us when it answered,
                    // which we no longer have: we closed it since (the
                    // peer left, or its ring was corrupt) and released it,
                    // or are about to. Taken again, it would be released
                    // twice when the news of its closing is read: by then
                    // the manager may have given the slot to a new channel
                    // of ours, which the second release would close.
                    if existing {
                        return Err(Error::Refused {
                            code: crate::proto::ErrorCode::ConnectionRefused,
                            message: format!(
                                "the channel to the process bound to {addr} closed while connecting"
                            ),
                        });
                    }
                    self.take_channel(channel, dir, peer, generation, fds, "Connected")?;
                }
                let ci = self.by_peer[&peer];
                if self.channels[ci].peer_id.generation() != generation {
                    // The manager answers with the channel it has to that
                    // slot; ours is to a stack it no longer has there (a
                    // death not read here yet): not this one. A channel
                    // it made for us meanwhile goes back, or it would stay
                    // taken for good.
                    if !existing && channel != self.channels[ci].id {
                        self.release(channel);
                    }
                    return Err(Error::Refused {
                        code: crate::proto::ErrorCode::ConnectionRefused,
                        message: format!(
                            "the process bound to {addr} took the slot of one that died; \
                             its channel is not up here yet"
                        ),
                    });
                }
                self.resolved.insert(addr, peer);
                Ok(self.channels[ci].peer_id)
            }
            Msg::Error { code, message } => Err(Error::Refused { code, message }),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Sets up the channel the manager's `what` (a `ChannelUp`, or the
    /// answer to a `Connect`) names, with the fds that came with it: the
    /// peer's doorbell last, after its pidfd. A channel this stack cannot
    /// take (its fds did not arrive: this process was out of fds, and the
    /// kernel dropped them) is given back to the manager, as one found
    /// corrupt is: the manager closes it for the peer too, whose sends are
    /// reset instead of filling a ring nobody reads, and frees it once the
    /// peer lets go (kept, it stayed taken for good, and so did the
    /// peer's slot after its death, since this stack never released it).
    pub(super) fn take_channel(
        &mut self,
        channel: u32,
        dir: u8,
        peer: u16,
        generation: u16,
        mut fds: Vec<OwnedFd>,
        what: &str,
    ) -> Result<(), Error> {
        let r = match fds.pop() {
            Some(bell) => {
                self.add_channel(channel, dir, PeerId::new(peer, generation), bell, fds.pop())
            }
            None => Err(Error::Protocol(format!("{what} without doorbell"))),
        };
        if r.is_err() && !self.by_peer.contains_key(&peer) && channel < self.seg.max_channels() {
            self.release(channel);
        }
        r
    }

    fn add_channel(
        &mut self,
        channel: u32,
        dir: u8,
        peer_id: PeerId,
        bell: OwnedFd,
        pidfd: Option<OwnedFd>,
    ) -> Result<(), Error> {
        let peer = peer_id.slot();
        if channel >= self.seg.max_channels()
            || peer == 0
            || u32::from(peer) > self.seg.max_stacks()
        {
            return Err(Error::Protocol(format!(
                "channel {channel} / peer {peer} out of range"
            )));
        }
        if self.by_peer.contains_key(&peer) {
            return Ok(());
        }
        let (tx, rx) = self.channel_ends(channel, dir)?;
        self.channels.push(Chan {
            id: channel,
            #[cfg(any(test, feature = "test-support"))]
            dir,
            peer,
            peer_id,
            tx,
            rx,
            peer_bell: EventFdDoorbell::from_fd(bell),
            peer_pidfd: pidfd,
        });
        self.by_peer.insert(peer, self.channels.len() - 1);
        self.epoch.fetch_add(1, Ordering::Release);
        tracing::debug!(stack = self.id, channel, peer, "channel up");
        Ok(())
    }

    /// Our ends of `channel`'s rings: we produce into ring `dir` and
    /// consume the other (the manager gives each ring one producer and one
    /// consumer).
    #[allow(clippy::type_complexity)]
    fn channel_ends(
        &self,
        channel: u32,
        dir: u8,
    ) -> Result<(Box<dyn DescProducer>, Box<dyn DescConsumer>), Error> {
        Ok(self.pool.channel_ends(&self.seg, channel, dir)?)
    }

    /// Stops using the channel to `peer`: delivers what it already sent,
    /// queues a reset for the application and tells the manager.
    /// `announced`: the channel the manager's `PeerDown` names.
    pub(super) fn close_channel(&mut self, peer: u16, announced: Option<u32>) {
        let Some(&i) = self.by_peer.get(&peer) else {
            // Already closed here, and released then: a second release
            // could name the slot after the manager reused it for a new
            // channel of ours, and close that one.
            return;
        };
        if announced.is_some_and(|ch| ch != self.channels[i].id) {
            return; // about a channel to this peer we already closed
        }
        self.by_peer.remove(&peer);
        let mut ch = self.channels.swap_remove(i);
        if let Some(moved) = self.channels.get(i) {
            self.by_peer.insert(moved.peer, i);
        }
        self.epoch.fetch_add(1, Ordering::Release);
        // Deliver everything the peer sent before it went away.
        loop {
            let n = ch.rx.pop_burst(&mut self.scratch).unwrap_or_default();
            if n == 0 {
                break;
            }
            self.deliver_burst(ch.peer_id, n);
        }
        self.inbox.push_back(Event::Reset(ch.peer_id));
        self.resolved.retain(|_, p| *p != peer);
        // Announced or closed: the manager waits for our release. Still
        // active (we found the peer's ring corrupt): the release asks the
        // manager to close it for the peer too, so the peer's sends are
        // reset instead of waiting on a ring nobody reads.
        self.release(ch.id);
        tracing::debug!(stack = self.id, channel = ch.id, peer, "channel closed");
    }

    /// Tells the manager this stack is done with channel `ch`, now or, if
    /// the socket is full, at the next look at the control socket.
    fn release(&mut self, ch: u32) {
        self.send_later(Msg::ChannelReleased { channel: ch });
    }

    /// Records that `addr` resolves to `peer` (a route the caller forgot
    /// but found still good).
    pub(crate) fn remember_resolution(&mut self, addr: SocketAddr, peer: PeerId) {
        self.resolved.insert(addr, peer.slot());
    }

    /// Forgets which stack `addr` resolved to, so the next `connect` asks
    /// the manager again.
    pub(crate) fn forget_resolution(&mut self, addr: &SocketAddr) {
        self.resolved.remove(addr);
    }

    /// Forgets how `addr` was resolved if it was resolved to `peer` (which
    /// refused a connection to it).
    pub(crate) fn forget_resolution_to(&mut self, addr: &SocketAddr, peer: PeerId) {
        if self.resolved.get(addr) == Some(&peer.slot()) {
            self.resolved.remove(addr);
        }
    }
}

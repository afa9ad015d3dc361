//! What the socket layer ([`crate::net`]) uses of a stack: every kind of
//! event that arrived ([`Incoming`]: stream buffers, control descriptors,
//! messages, a peer's departure), and pushes of control descriptors and
//! stream buffers, one at a time or in bursts, woken when the caller says.

use crate::buf::{Buf, BufMut};
use crate::layout::{kind, Descriptor, SLOT_DESCS};
use crate::sync::Ordering;

use super::alloc::take_for_send;
use super::{Error, Event, Message, PeerId, Stack, BURST};

/// What arrived, for the socket layer (see [`Stack::poll_events`]).
pub(crate) enum Incoming {
    /// A validated buffer of a buffer-carrying kind.
    Buf {
        from: PeerId,
        kind: u8,
        conn: u32,
        buf: Buf,
    },
    /// A control descriptor (no buffer): only its fields (`arg` is the
    /// descriptor's `index`, `arg2` its `len`).
    Control {
        from: PeerId,
        kind: u8,
        conn: u32,
        arg: u32,
        arg2: u32,
    },
    /// A message of the zero-copy interface (the socket layer drops it).
    Message(Message),
    /// The peer died or left; everything it sent came before.
    PeerGone(PeerId),
}

impl Stack {
    /// Moves up to `max` descriptors from the rings to `f`, validating
    /// each: buffers (data of both interfaces, SYNs) as [`Buf`]s, control
    /// kinds as they are, and a peer's death as [`Incoming::PeerGone`]
    /// after everything it sent. With `ctrl`, reads the control socket even
    /// if the manager did not signal (after a liveness tick).
    pub(crate) fn poll_events(
        &mut self,
        max: usize,
        ctrl: bool,
        f: &mut dyn FnMut(Incoming),
    ) -> Result<usize, Error> {
        self.check_not_forked()?;
        if ctrl {
            self.poll_ctrl()?;
        } else {
            self.poll_ctrl_if_bumped()?;
        }
        let mut total = 0;
        // Events queued earlier (a closed channel's last messages, resets).
        while let Some(ev) = self.inbox.pop_front() {
            match ev {
                Event::Msg(m) => f(Incoming::Message(m)),
                Event::Reset(p) => f(Incoming::PeerGone(p)),
                Event::Sock(i) => f(i),
            }
            total += 1;
        }
        let n_ch = self.channels.len();
        let mut broken = Vec::new();
        for k in 0..n_ch {
            if total >= max {
                break;
            }
            let i = (self.rr + k) % n_ch;
            let want = (max - total).min(BURST);
            let n = match self.channels[i].rx.pop_burst(&mut self.scratch[..want]) {
                Ok(n) => n,
                Err(_) => {
                    self.corrupt += 1;
                    self.slot().corrupt.fetch_add(1, Ordering::Relaxed);
                    broken.push(self.channels[i].peer);
                    continue;
                }
            };
            let peer = self.channels[i].peer_id;
            self.prefetch_scratch(n, true);
            // As in `deliver_burst`: any new references before the stores.
            self.keep_refs(n);
            for j in 0..n {
                let d = self.scratch[j];
                if kind::carries_buffer(d.kind) {
                    if let Some(raw) = self.take_descriptor(peer, &d) {
                        let buf = Buf::new(self.pool_ref(), raw, d.len as usize);
                        f(Incoming::Buf {
                            from: peer,
                            kind: d.kind,
                            conn: d.conn,
                            buf,
                        });
                    }
                } else if kind::is_known(d.kind) {
                    f(Incoming::Control {
                        from: peer,
                        kind: d.kind,
                        conn: d.conn,
                        arg: d.index,
                        arg2: d.len,
                    });
                } else {
                    self.corrupt += 1;
                    self.slot().corrupt.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(%peer, ?d, "rejected a descriptor of unknown kind");
                }
            }
            total += n;
        }
        self.rr = self.rr.wrapping_add(1);
        for p in broken {
            self.close_channel(p, None);
        }
        while let Some(ev) = self.inbox.pop_front() {
            match ev {
                Event::Msg(m) => f(Incoming::Message(m)),
                Event::Reset(p) => f(Incoming::PeerGone(p)),
                Event::Sock(i) => f(i),
            }
            total += 1;
        }
        Ok(total)
    }

    /// Pushes one control descriptor (no buffer) to `peer`: `arg` goes in
    /// the descriptor's `index`, `arg2` in its `len`. `Ok(false)` when the
    /// ring is full. With `notify` false the peer is not woken (call
    /// [`Stack::wake_peer`] after a burst).
    pub(crate) fn push_control(
        &mut self,
        peer: PeerId,
        kind: u8,
        conn: u32,
        [arg, arg2]: [u32; 2],
        notify: bool,
    ) -> Result<bool, Error> {
        let ci = self.chan_of(peer).ok_or(Error::Reset(peer))?;
        self.check_open(ci, peer)?;
        let ch = &mut self.channels[ci];
        let d = Descriptor {
            index: arg,
            len: arg2,
            kind,
            conn,
            ..Descriptor::default()
        };
        match ch.tx.push_one(d.to_words()) {
            Ok(true) => {
                if notify {
                    Self::notify(&self.seg, ch);
                }
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(_) => {
                self.close_channel(peer.slot(), None);
                Err(Error::Reset(peer))
            }
        }
    }

    /// Pushes a buffer of kind `kind` for the peer's `conn`, or hands it
    /// back (`Ok(Some)`) when the ring is full, or with the error when the
    /// channel is gone. With `notify` false the
    /// peer is not woken (call [`Stack::wake_peer`] after a burst).
    pub(crate) fn push_buf(
        &mut self,
        peer: PeerId,
        kind: u8,
        conn: u32,
        buf: BufMut,
        notify: bool,
    ) -> Result<Option<BufMut>, (Error, BufMut)> {
        let Some(ci) = self.chan_of(peer) else {
            return Err((Error::Reset(peer), buf));
        };
        if let Err(e) = self.check_open(ci, peer) {
            return Err((e, buf));
        }
        let ch = &mut self.channels[ci];
        match ch.tx_space(1) {
            Ok(0) => {
                Self::notify(&self.seg, ch);
                self.seg
                    .stack_slot(self.id)
                    .ring_full
                    .fetch_add(1, Ordering::Relaxed);
                Ok(Some(buf))
            }
            Ok(_) => {
                let (raw, len) = take_for_send(self.refs.get_mut(), &self.pool, buf);
                let d = self
                    .pool
                    .prepare_send(raw, len as u32, peer.slot(), conn, kind);
                let pushed = ch.tx.push_one(d.to_words()).unwrap_or(false);
                debug_assert!(pushed, "we are the only producer and saw room");
                if notify {
                    Self::notify(&self.seg, ch);
                }
                Ok(None)
            }
            Err(()) => {
                self.close_channel(peer.slot(), None);
                Err((Error::Reset(peer), buf))
            }
        }
    }

    /// Pushes to `peer`, in order, as many of `bufs` (kind, receiver's
    /// connection, buffer) as its ring has room for, without ringing it;
    /// removes those from `bufs` and returns how many. The references are
    /// released first (locked decrements) and the ring written after, with
    /// no locked instruction between the ring's stores: each store's line
    /// comes over from the consumer's core, and a locked instruction after
    /// one would wait for it, where a run of plain stores overlaps them.
    /// Buffers of another pool must not be passed (the socket layer only
    /// sends its own).
    pub(crate) fn push_bufs(
        &mut self,
        peer: PeerId,
        bufs: &mut Vec<(u8, u32, BufMut)>,
    ) -> Result<usize, Error> {
        let ci = self.chan_of(peer).ok_or(Error::Reset(peer))?;
        self.check_open(ci, peer)?;
        let ch = &mut self.channels[ci];
        let room = match ch.tx_space(bufs.len()) {
            Ok(n) => n.min(bufs.len()),
            Err(()) => {
                self.close_channel(peer.slot(), None);
                return Err(Error::Reset(peer));
            }
        };
        if room < bufs.len() {
            self.seg
                .stack_slot(self.id)
                .ring_full
                .fetch_add(1, Ordering::Relaxed);
        }
        let mut raws = std::mem::take(&mut self.burst_raws);
        let (refs, pool) = (self.refs.get_mut(), &self.pool);
        raws.extend(bufs.drain(..room).map(|(kind, conn, b)| {
            let (raw, len) = take_for_send(refs, pool, b);
            (kind, conn, raw, len)
        }));
        // A slot's worth at a time: its headers stamped, then its one push
        // (three descriptors to a line). The slot's store publishes as soon
        // as those headers' lines are ours, so the reader can start on it
        // while the next slot's stamps are still on their way.
        let ch = &mut self.channels[ci];
        for group in raws.chunks(SLOT_DESCS) {
            let mut descs = [Descriptor::default(); SLOT_DESCS];
            for (d, &(kind, conn, raw, len)) in descs.iter_mut().zip(group) {
                *d = self
                    .pool
                    .prepare_send(raw, len as u32, peer.slot(), conn, kind);
            }
            let n = ch.tx.push_burst(&descs[..group.len()]).unwrap_or(0);
            debug_assert_eq!(n, group.len(), "we are the only producer and saw room");
        }
        raws.clear();
        self.burst_raws = raws;
        Ok(room)
    }

    /// Starts taking the line of the next slot toward `peer` in exclusive
    /// state, ahead of a push: the wake-up check's fence after the push
    /// then need not wait for that line.
    #[inline]
    pub(crate) fn prefetch_tx(&self, peer: PeerId) {
        if let Some(ci) = self.chan_of(peer) {
            self.channels[ci].tx.prefetch_next();
        }
    }

    /// Whether the ring to `peer` has room for a descriptor (true when
    /// there is no channel or it is broken: a send then fails at once, it
    /// does not wait).
    pub(crate) fn tx_room(&mut self, peer: PeerId) -> bool {
        match self.chan_of(peer) {
            Some(ci) => self.channels[ci].tx_space(1).map_or(true, |n| n > 0),
            None => true,
        }
    }

    /// Wakes `peer` if it sleeps (after pushes made with `notify` false).
    pub(crate) fn wake_peer(&self, peer: PeerId) {
        if let Some(ci) = self.chan_of(peer) {
            Self::notify(&self.seg, &self.channels[ci]);
        }
    }
}

//! Addresses and channels: binding an address (at most
//! [`MAX_BINDINGS_PER_STACK`] a stack), resolving a connect to the stack
//! bound (exactly, or through a wildcard binding), setting up a channel
//! slot between two stacks, and a stack's release of one.

use std::net::SocketAddr;

use crate::layout::chan_state;
use crate::proto::{ErrorCode, Msg};
use crate::sync::Ordering;

use super::session::hung_up_now;
use super::{ChanEntry, Manager};

/// Most addresses one stack may hold bound at once. The manager goes over
/// every binding at each pass of its loop (the snapshot) and in every
/// status report: without a bound, one stack binding ever more addresses
/// would grow the manager's memory and slow it down for every stack. A
/// bind past this is refused ([`ErrorCode::NoSpace`]).
pub const MAX_BINDINGS_PER_STACK: usize = 4096;

impl Manager {
    pub(super) fn bind_addr(&mut self, id: u16, addr: SocketAddr) -> Option<Msg> {
        // A holder whose process is gone, its end of file not read yet
        // (this same pass of the loop, or requests of its own still
        // waiting to be read before it): its death is handled now, and
        // its addresses are free. What it sent that is not read yet
        // needs no answer: its death settles its channels (released or
        // not) as it would at its end of file.
        if let Some(&other) = self.bindings.get(&addr) {
            if other != id
                && self
                    .stacks
                    .get(&other)
                    .is_some_and(|e| hung_up_now(&e.sock))
            {
                let e = self.stacks.remove(&other).expect("present");
                self.on_death(other, e);
            }
        }
        match self.bindings.get(&addr) {
            Some(&other) if other != id => Some(Msg::Error {
                code: ErrorCode::AddrInUse,
                message: match self.stacks.get(&other) {
                    Some(e) => format!(
                        "{addr} is bound by process {} ({}, stack {other})",
                        e.pid, e.name
                    ),
                    None => format!("{addr} is bound by stack {other}"),
                },
            }),
            None if self.stacks[&id].addrs.len() >= MAX_BINDINGS_PER_STACK => Some(Msg::Error {
                code: ErrorCode::NoSpace,
                message: format!(
                    "this stack holds {MAX_BINDINGS_PER_STACK} addresses bound, the most it may"
                ),
            }),
            _ => {
                self.bindings.insert(addr, id);
                self.stacks
                    .get_mut(&id)
                    .expect("present")
                    .addrs
                    .insert(addr);
                tracing::info!(stack = id, %addr, "bound");
                Some(Msg::Ok)
            }
        }
    }

    /// The stack bound to `addr`: exactly, or through a wildcard binding
    /// of its port when `addr` is one of this node's (see [`crate::addr`]).
    fn lookup(&self, addr: SocketAddr) -> Option<u16> {
        let bound = |a: SocketAddr| self.bindings.get(&a).copied();
        if let Some(b) = crate::addr::exact_names(addr).find_map(bound) {
            return Some(b);
        }
        let b = crate::addr::wildcards(addr).find_map(bound)?;
        crate::addr::is_this_node(addr.ip()).then_some(b)
    }

    pub(super) fn connect(&mut self, a: u16, addr: SocketAddr) {
        let reply = |m: &mut Self, msg: Msg| m.deliver(a, msg, None);
        // A holder whose process is gone, its hang-up not handled yet
        // (later in this same pass of the loop): its death is handled
        // now, as `bind_addr` does, and the address looked up again. A
        // channel to it would hand `a` a dead stack's fds and then a
        // reset, where a refusal lets it try another address, or TCP.
        let b = match self.lookup(addr) {
            Some(b) if b != a && self.stacks.get(&b).is_some_and(|e| hung_up_now(&e.sock)) => {
                let e = self.stacks.remove(&b).expect("present");
                self.on_death(b, e);
                self.lookup(addr)
            }
            b => b,
        };
        let Some(b) = b else {
            let msg = Msg::Error {
                code: ErrorCode::ConnectionRefused,
                message: format!("nothing is bound to {addr}"),
            };
            return reply(self, msg);
        };
        if b == a {
            let msg = Msg::Error {
                code: ErrorCode::ConnectionRefused,
                message: format!("{addr} is bound by this same stack"),
            };
            return reply(self, msg);
        }
        if !self.stacks[&a].peers.contains_key(&b) && self.outbox_full(b) {
            let e = &self.stacks[&b];
            tracing::warn!(stack = b, pid = e.pid, name = %e.name, %addr, "a new channel refused: the stack is not reading its control socket");
            // Busy, not ConnectionRefused: `a` must not take it for the
            // refusal of an address only its own wildcard binding covers.
            let msg = Msg::Error {
                code: ErrorCode::Busy,
                message: format!(
                    "{addr} is bound by process {} ({}), which is not reading its control socket",
                    e.pid, e.name
                ),
            };
            return reply(self, msg);
        }
        if let Some(&ch) = self.stacks[&a].peers.get(&b) {
            let (dir, _) = self.dir_of(ch, a);
            let msg = Msg::Connected {
                channel: ch,
                dir,
                peer: b,
                generation: self.stacks[&b].generation,
                existing: true,
            };
            return self.deliver(a, msg, Some(b));
        }
        let Some(ch) = self.channels.iter().position(|c| c.is_none()) else {
            let msg = Msg::Error {
                code: ErrorCode::NoSpace,
                message: "no free channel slot".into(),
            };
            return reply(self, msg);
        };
        let ch = ch as u32;
        // Stale descriptors of the slot's last channel go; their
        // buffers were reclaimed by owner.
        // SAFETY: the slot is free: no stack has its channel (both
        // ends released it or died), and none gets it before the
        // `ACTIVE` store below.
        unsafe { self.backend.reset_channel(&self.seg, ch) };
        let hdr = self.seg.channel(ch);
        // Release: the ring resets above happen before either end can see
        // the channel active.
        hdr.state.store(chan_state::ACTIVE, Ordering::Release);
        self.channels[ch as usize] = Some(ChanEntry {
            a,
            b,
            closing: None,
        });
        self.stacks
            .get_mut(&a)
            .expect("present")
            .peers
            .insert(b, ch);
        self.stacks
            .get_mut(&b)
            .expect("present")
            .peers
            .insert(a, ch);
        // Tell b first, so its channel exists before a's first descriptor.
        let up = Msg::ChannelUp {
            channel: ch,
            dir: 1,
            peer: a,
            generation: self.stacks[&a].generation,
        };
        self.deliver(b, up, Some(a));
        let msg = Msg::Connected {
            channel: ch,
            dir: 0,
            peer: b,
            generation: self.stacks[&b].generation,
            existing: false,
        };
        self.deliver(a, msg, Some(b));
        tracing::info!(channel = ch, a, b, %addr, "channel up");
    }

    fn dir_of(&self, ch: u32, id: u16) -> (u8, u16) {
        let c = self.channels[ch as usize].as_ref().expect("live channel");
        if c.a == id {
            (0, c.b)
        } else {
            (1, c.a)
        }
    }

    pub(super) fn free_channel(&mut self, ch: u32) {
        self.seg
            .channel(ch)
            .state
            .store(chan_state::FREE, Ordering::Release);
        self.channels[ch as usize] = None;
    }

    /// A live stack is done with a channel: one whose other end died, or
    /// one it gave up while both ends live (it found the ring from the
    /// other end corrupt, or could not set the channel up: its fds did not
    /// reach it). The latter is closed for the other end too,
    /// as a death would close it, and freed once that end is done.
    pub(super) fn released(&mut self, by: u16, ch: u32) {
        let Some(Some(c)) = self.channels.get_mut(ch as usize) else {
            return;
        };
        let Some((live, dead)) = c.closing else {
            if by != c.a && by != c.b {
                return; // not its channel
            }
            let other = if by == c.a { c.b } else { c.a };
            // Release: pairs with the Acquire loads in both ends' send paths.
            self.seg
                .channel(ch)
                .state
                .store(chan_state::CLOSED, Ordering::Release);
            c.closing = Some((other, by));
            if let Some(e) = self.stacks.get_mut(&by) {
                e.peers.remove(&other);
            }
            tracing::warn!(
                stack = by,
                peer = other,
                channel = ch,
                "channel given up (a corrupt ring, or one it could not set up): reset both ends"
            );
            match self.stacks.get_mut(&other) {
                Some(e) => {
                    e.peers.remove(&by);
                    self.deliver(
                        other,
                        Msg::PeerDown {
                            channel: ch,
                            peer: by,
                        },
                        None,
                    );
                }
                None => self.free_channel(ch),
            }
            return;
        };
        if live != by {
            return;
        }
        self.free_channel(ch);
        self.finish_dead(dead, ch);
    }
}

//! What the manager shows: the [`Snapshot`] it publishes after each pass
//! of its loop, and the status report (`xio-manager status`), inline or,
//! when long, in a sealed memfd.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;

use crate::ctrl;
use crate::proto::{Msg, MAX_STATUS, MAX_STATUS_INLINE};
use crate::sync::Ordering;

#[cfg(doc)]
use super::Snapshot;
use super::{Manager, StackInfo};

impl Manager {
    pub(super) fn publish(&mut self) {
        // Live stacks that died while a dead peer's channel waited on them.
        self.settle_closing(|m, live| !m.stacks.contains_key(&live));
        let mut s = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        s.unswept = self.unswept.len();
        s.stacks = self
            .stacks
            .iter()
            .map(|(&id, e)| StackInfo {
                id,
                pid: e.pid,
                name: e.name.clone(),
                addrs: e.addrs.iter().copied().collect(),
                queued: e.outbox.len(),
            })
            .collect();
        s.stacks.sort_by_key(|s| s.id);
        s.channels = self
            .channels
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                c.as_ref()
                    .filter(|c| c.closing.is_none())
                    .map(|c| (i as u32, c.a, c.b))
            })
            .collect();
    }

    /// The status report as a reply: inline if it fits a packet, else in
    /// a sealed memfd. Without a memfd (out of fds, say) it goes inline
    /// cut short, and says so.
    pub(super) fn status_reply(&self) -> (Msg, Option<OwnedFd>) {
        let mut text = self.status_text();
        if text.len() <= MAX_STATUS_INLINE {
            return (Msg::StatusReply { text }, None);
        }
        let whole = text.len();
        if whole > MAX_STATUS {
            cut(&mut text, MAX_STATUS - 100);
            text += &format!("... (report cut at {} of {whole} bytes)\n", text.len());
        }
        match ctrl::sealed_memfd("xio-status", text.as_bytes()) {
            Ok(fd) => (
                Msg::StatusReplyFd {
                    len: text.len() as u32,
                },
                Some(fd),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "no memfd for a long status report; sending it cut");
                let note = format!(
                    "... (report cut: the manager has no memfd for its {whole} bytes: {e})\n"
                );
                cut(&mut text, MAX_STATUS_INLINE.saturating_sub(note.len()));
                text += &note;
                (Msg::StatusReply { text }, None)
            }
        }
    }

    fn status_text(&self) -> String {
        use std::fmt::Write;
        let mut t = String::new();
        // Dead stacks whose slots are not free yet (peers still to let go
        // of their channels, or buffers still to reclaim): a newcomer
        // cannot have them, so the count says so.
        let dead: BTreeSet<u16> = self
            .dead
            .keys()
            .chain(self.unswept.keys())
            .copied()
            .collect();
        let held = if dead.is_empty() {
            String::new()
        } else {
            format!(" (+{} dead, slots not free yet)", dead.len())
        };
        let _ = writeln!(
            t,
            "pool {}: {} MiB segment, {}/{} stacks{held}, {}/{} channels",
            self.prefix,
            self.seg.region().len() >> 20,
            self.stacks.len(),
            self.seg.max_stacks(),
            self.channels.iter().filter(|c| c.is_some()).count(),
            self.seg.max_channels()
        );
        let usage = self.pool.usage();
        let mut ids: Vec<_> = self.stacks.keys().copied().collect();
        ids.sort_unstable();
        let _ = writeln!(t, "stacks:");
        for id in ids {
            let e = &self.stacks[&id];
            let slot = self.seg.stack_slot(id);
            let held: u32 = usage
                .iter()
                .flat_map(|u| u.by_owner.iter())
                .filter(|(o, _)| *o == id)
                .map(|(_, n)| n)
                .sum();
            let addrs: Vec<String> = e.addrs.iter().map(|a| a.to_string()).collect();
            let _ = writeln!(
                t,
                "  stack {id:<4} pid {:<8} {:<16} buffers {held:<6} channels {:<3} sleeps {:<8} corrupt {:<4} generation {:<5} bound [{}]",
                e.pid,
                e.name,
                e.peers.len(),
                slot.sleeps.load(Ordering::Relaxed),
                slot.corrupt.load(Ordering::Relaxed),
                e.generation,
                addrs.join(", ")
            );
            if e.left && e.bad {
                let _ = writeln!(
                    t,
                    "             cut off after a bad control message: its buffers come back when its process lets go of them"
                );
            } else if e.left {
                let _ = writeln!(
                    t,
                    "             left: its buffers come back when its process lets go of them"
                );
            } else if !e.outbox.is_empty() {
                let _ = writeln!(
                    t,
                    "             not reading its control socket: {} messages wait",
                    e.outbox.len()
                );
            }
            // Use against the quota, class by class, where any is charged.
            let quota: Vec<String> = usage
                .iter()
                .filter_map(|u| {
                    let n = u.by_charge.iter().find(|(o, _)| *o == id)?.1;
                    Some(format!("{} B {n}/{}", u.buf_size, u.quota))
                })
                .collect();
            if !quota.is_empty() {
                let _ = writeln!(
                    t,
                    "             charged (of its quota): {}",
                    quota.join(", ")
                );
            }
        }
        if !self.dead.is_empty() {
            let ids: Vec<String> = self.dead.keys().map(|id| id.to_string()).collect();
            let _ = writeln!(
                t,
                "  dead, slot kept until its peers release their channels: {}",
                ids.join(", ")
            );
        }
        if !self.unswept.is_empty() {
            let ids: Vec<String> = self.unswept.keys().map(|id| id.to_string()).collect();
            let _ = writeln!(
                t,
                "  dead, buffers not reclaimed yet (a live stack stays inside a free-list operation): {}",
                ids.join(", ")
            );
        }
        let orphans = self
            .snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .orphans;
        if orphans > 0 {
            let _ = writeln!(
                t,
                "  buffers found held in the name of no stack and given back: {orphans} \
                 (a process that can write the pool overwrote their headers)"
            );
        }
        let _ = writeln!(t, "channels:");
        for (i, c) in self.channels.iter().enumerate() {
            if let Some(c) = c {
                let state = if c.closing.is_some() {
                    "closing"
                } else {
                    "open"
                };
                let _ = writeln!(
                    t,
                    "  channel {i:<4} stack {} <-> stack {} ({state})",
                    c.a, c.b
                );
            }
        }
        let _ = writeln!(t, "buffers:");
        for u in usage {
            let owners: Vec<String> = u
                .by_owner
                .iter()
                .map(|(o, n)| format!("stack {o}: {n}"))
                .collect();
            let _ = writeln!(
                t,
                "  class {:>8} B: {:>6} total, {:>6} free, {:>6} in use, quota {} per stack{}{}",
                u.buf_size,
                u.total,
                u.free,
                u.total - u.free,
                u.quota,
                if owners.is_empty() { "" } else { " (" },
                if owners.is_empty() {
                    String::new()
                } else {
                    owners.join(", ") + ")"
                }
            );
        }
        t
    }
}

/// Cuts `s` to at most `max` bytes, on a char boundary.
fn cut(s: &mut String, max: usize) {
    let mut n = max.min(s.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    s.truncate(n);
}

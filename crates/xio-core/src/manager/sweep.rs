//! Reclaiming what dead stacks held: sweeps that give their buffers back
//! to the pool (put off, never waited on, while a live stack stays inside
//! a free-list operation), a second sweep once every peer released their
//! channels, and then their slots freed.

use std::collections::HashMap;

use crate::backend::{Busy, Doorbell};
use crate::layout::slot_state;
use crate::sync::Ordering;

use super::session::hung_up_now;
use super::{Manager, Owed};

/// How long a sweep waits, gates closed, for live stacks to leave their
/// free-list operations. Far more than an operation takes (microseconds)
/// when its thread runs; a stack that is stopped, or whose thread lost
/// its CPU mid-operation, holds up reclamation rather than the manager
/// (and, with every gate closed meanwhile, every stack's free lists).
const SWEEP_PATIENCE: std::time::Duration = std::time::Duration::from_millis(2);
/// First wait before a sweep that gave up is tried again; it doubles up
/// to [`SWEEP_RETRY_MAX`], so a stack stopped for long costs the others a
/// closed gate for [`SWEEP_PATIENCE`] a second at most.
const SWEEP_RETRY: std::time::Duration = std::time::Duration::from_millis(10);
/// Longest wait between tries of a sweep.
const SWEEP_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(1);
/// How often the manager looks for buffers held in the name of no stack.
/// A look reads every buffer's header once (a fraction of a millisecond
/// for a pool of tens of thousands) and closes no gate unless it finds
/// one.
pub(super) const AUDIT_EVERY: std::time::Duration = std::time::Duration::from_secs(2);

impl Manager {
    /// Records that dead stack `id` is owed `what`, and sweeps at once.
    pub(super) fn owe_sweep(&mut self, id: u16, what: Owed) {
        let o = self.unswept.entry(id).or_default();
        o.first |= what.first;
        o.last |= what.last;
        self.sweep(true);
    }

    /// Gives back what the dead stacks in `unswept` held, all in one pass
    /// over the pool (`force`: even if a retry is not due yet).
    ///
    /// Stacks still registered whose sockets hung up (their end of file
    /// not read yet: two died at once) are not waited for; a live stack
    /// inside a free-list operation is, for [`SWEEP_PATIENCE`]. Past that
    /// (it is stopped, say) the sweep is put off and tried again from the
    /// loop: the manager never waits on one stack. Meanwhile the dead
    /// stacks' buffers stay out of the pool and their slots stay taken
    /// (reusing an id before its buffers are back would hand them to the
    /// newcomer).
    pub(super) fn sweep(&mut self, force: bool) {
        if self.unswept.is_empty() {
            self.sweep_retry = None;
            return;
        }
        let now = std::time::Instant::now();
        if !force && self.sweep_retry.is_some_and(|(at, _)| now < at) {
            return;
        }
        let dead: Vec<u16> = self.unswept.keys().copied().collect();
        let live: Vec<u16> = self.stacks.keys().copied().collect();
        // Asked at each try, not when the sweep was owed: a peer that has
        // released its channels with a dead stack since (drained its rings)
        // is a reader no more, so a retried first sweep, or the last one,
        // takes back what the dead stack stamped for it and never pushed.
        let readers: Vec<(u16, u16)> = dead
            .iter()
            .flat_map(|&d| self.readers_of(d).into_iter().map(move |r| (d, r)))
            .collect();
        let stacks = &self.stacks;
        let gone = |id: u16| stacks.get(&id).is_none_or(|e| hung_up_now(&e.sock));
        let r = match self
            .pool
            .reclaim(&dead, &live, &readers, SWEEP_PATIENCE, gone)
        {
            Ok(r) => r,
            Err(Busy(busy)) => {
                let wait = self.sweep_retry.map_or(SWEEP_RETRY, |(_, w)| w);
                if self.sweep_retry.is_none() {
                    tracing::warn!(
                        stack = busy,
                        dead = ?dead,
                        "a live stack stays inside a free-list operation (stopped?): \
                         reclaiming the dead stacks' buffers later"
                    );
                }
                self.sweep_retry = Some((now + wait, (wait * 2).min(SWEEP_RETRY_MAX)));
                return;
            }
        };
        self.sweep_retry = None;
        let owed = std::mem::take(&mut self.unswept);
        if r.owned + r.lost > 0 {
            tracing::info!(
                stacks = ?dead,
                reclaimed = r.owned,
                lost_and_found = r.lost,
                "reclaimed the buffers dead stacks held"
            );
        }
        {
            let mut s = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
            s.deaths += owed.values().filter(|o| o.first).count() as u64;
            s.reclaimed += u64::from(r.owned + r.lost);
        }
        for (id, o) in owed {
            if o.last {
                self.seg
                    .stack_slot(id)
                    .state
                    .store(slot_state::FREE, Ordering::Release);
            }
        }
    }

    /// Gives back buffers held in the name of a stack the manager does not
    /// know (neither registered nor dead and waiting for its sweeps): a
    /// header overwritten by a process that can write the segment, which
    /// no sweep for a death would ever find. Nobody frees such a buffer,
    /// so without this it stays "in use" until the manager stops. Looks
    /// every [`AUDIT_EVERY`] (headers only), and sweeps only when it finds
    /// one.
    pub(super) fn audit(&mut self) {
        let now = std::time::Instant::now();
        if now < self.audit_due {
            return;
        }
        self.audit_due = now + AUDIT_EVERY;
        self.nudge_stuck_readers();
        let known = |o: u16| {
            o != 0
                && (self.stacks.contains_key(&o)
                    || self.unswept.contains_key(&o)
                    || self.dead.contains_key(&o))
        };
        let orphans: u32 = self
            .pool
            .usage()
            .iter()
            .flat_map(|u| u.by_owner.iter())
            .filter(|&&(o, _)| !known(o))
            .map(|&(_, n)| n)
            .sum();
        if orphans == 0 {
            return;
        }
        let live: Vec<u16> = self.stacks.keys().copied().collect();
        let stacks = &self.stacks;
        let gone = |id: u16| stacks.get(&id).is_none_or(|e| hung_up_now(&e.sock));
        // Busy (a live stack inside a free-list operation for all the
        // patience): the next look tries again.
        if let Ok(r) = self.pool.reclaim(&[], &live, &[], SWEEP_PATIENCE, gone) {
            tracing::warn!(
                buffers = r.owned,
                "gave back buffers held in the name of no stack (a process \
                 that can write the pool overwrote their headers)"
            );
            let mut s = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
            s.orphans += u64::from(r.owned);
            s.reclaimed += u64::from(r.owned + r.lost);
        }
    }

    /// Wakes a stack whose ring has held something for it since the last
    /// look, its consumer index unmoved: a producer rings a sleeper only
    /// if the sleeper's `sleeping` word says it sleeps, and a process that
    /// can write the segment could clear that word under it, leaving it
    /// asleep for good with no timer to end the sleep (none is armed, on
    /// purpose: see `crate::liveness`). So a lost wake-up costs at most
    /// two looks. A busy reader that is merely slow gets a spare wake-up,
    /// which costs it nothing. Shm rings only (DPDK's are not in the
    /// segment).
    fn nudge_stuck_readers(&mut self) {
        if self.seg.backend() != crate::layout::backend::SHM {
            return;
        }
        let mut now_waiting = HashMap::new();
        let mut stuck = Vec::new();
        for (ch, c) in self.channels.iter().enumerate() {
            let Some(c) = c.as_ref().filter(|c| c.closing.is_none()) else {
                continue;
            };
            for dir in 0..2u8 {
                let Some(head) = self.seg.ring_pending(ch as u32, dir as usize) else {
                    continue;
                };
                // Ring 0 is the one `a` produces into, `b` reads.
                let reader = if dir == 0 { c.b } else { c.a };
                if self.waiting_rings.get(&(ch as u32, dir)) == Some(&head) {
                    stuck.push(reader);
                }
                now_waiting.insert((ch as u32, dir), head);
            }
        }
        self.waiting_rings = now_waiting;
        stuck.sort_unstable();
        stuck.dedup();
        for id in stuck {
            let Some(e) = self.stacks.get(&id) else {
                continue;
            };
            crate::sync::futex_wake(&self.seg.stack_slot(id).sleeping);
            let _ = e.bell.ring();
            tracing::debug!(
                stack = id,
                "woke a stack that left a ring unread for a whole look"
            );
            self.snapshot
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .nudges += 1;
        }
    }

    /// When the next [`Manager::audit`] is due.
    pub(super) fn audit_due(&self) -> std::time::Instant {
        self.audit_due
    }

    /// The stacks that may still read a ring from `dead`: the other ends of
    /// its channels not yet released (and so not yet drained). What `dead`
    /// stamped in flight to them is left to the sweep after they release.
    fn readers_of(&self, dead: u16) -> Vec<u16> {
        self.channels
            .iter()
            .flatten()
            .filter_map(|c| match (c.a == dead, c.b == dead) {
                (true, _) => Some(c.b),
                (_, true) => Some(c.a),
                _ => None,
            })
            .collect()
    }

    pub(super) fn finish_dead(&mut self, dead: u16, ch: u32) {
        let Some(w) = self.dead.get_mut(&dead) else {
            return;
        };
        w.remove(&ch);
        if w.is_empty() {
            self.dead.remove(&dead);
            // Second sweep: a peer may have sent to the dead stack between
            // our first sweep and its noticing the channel closed. And the
            // peers have drained and released its rings, so what it stamped
            // for them but never pushed (it died in between) is found now
            // (`sweep` asks `readers_of` afresh at each try: none are left).
            self.owe_sweep(
                dead,
                Owed {
                    first: false,
                    last: true,
                },
            );
        }
    }
}

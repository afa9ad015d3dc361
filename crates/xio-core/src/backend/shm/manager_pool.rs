//! The manager's side of the shm pool: laying the free lists out,
//! counting buffers for status, and reclaiming a dead stack's buffers
//! (see the pool's docs, [`crate::backend::shm::pool`]).

use std::time::Duration;

use super::pool::PoolView;
use crate::backend::gate::{close_gates, open_gates};
use crate::backend::traits::{Busy, ClassUsage, Reclaimed};
use crate::layout::{bufword, MAG_SIZE};
use crate::segment::Segment;
use crate::sync::{AtomicU64, Ordering};

/// Manager-side pool operations: initialisation, statistics, reclamation.
#[derive(Debug)]
pub struct ManagerPool {
    view: PoolView,
}

impl ManagerPool {
    /// Wraps a freshly initialised segment and puts every buffer into the
    /// full magazines of its class.
    pub fn init(seg: Segment) -> Self {
        let this = Self {
            view: PoolView::new(seg),
        };
        for class in 0..this.view.segment().classes().len() {
            let all: Vec<u32> = (0..this.view.segment().classes()[class].count).collect();
            this.rebuild(class, &all, false);
        }
        this
    }

    /// Lays the free lists of `class` out anew: `free` in full magazines,
    /// every other magazine on the empty stack. Only with the lists frozen
    /// (at init, or with the gates closed). `bump`: give the freed buffers
    /// a new generation, so stale descriptors naming them are refused.
    fn rebuild(&self, class: usize, free: &[u32], bump: bool) {
        let seg = self.view.segment();
        let count = seg.classes()[class].count;
        for &i in free {
            let h = seg.buf_header(class, i).expect("in range");
            let w = h.word.load(Ordering::Relaxed);
            let g = if bump {
                bufword::gen(w).wrapping_add(1)
            } else {
                bufword::gen(w)
            };
            h.word
                .store(bufword::pack(bufword::FREE, 0, g), Ordering::Relaxed);
        }
        let n_full = free.len().div_ceil(MAG_SIZE) as u32;
        for (m, chunk) in free.chunks(MAG_SIZE).enumerate() {
            let mag = seg
                .magazine(class, m as u32)
                .expect("one magazine per buffer");
            for (slot, &i) in mag.idx.iter().zip(chunk) {
                slot.store(i, Ordering::Relaxed);
            }
            mag.len.store(chunk.len() as u32, Ordering::Relaxed);
            mag.next.store(
                if m as u32 + 1 < n_full {
                    m as u32 + 2
                } else {
                    0
                },
                Ordering::Relaxed,
            );
        }
        for m in n_full..count {
            let mag = seg.magazine(class, m).expect("in range");
            mag.len.store(0, Ordering::Relaxed);
            mag.next
                .store(if m + 1 < count { m + 2 } else { 0 }, Ordering::Relaxed);
        }
        let fh = seg.free_head(class);
        let tag = |h: &AtomicU64| (h.load(Ordering::Relaxed) >> 32).wrapping_add(1) << 32;
        // Release: the magazines written above happen before any stack pops
        // them (its Acquire load of the head).
        fh.head.store(
            tag(&fh.head) | if n_full > 0 { 1 } else { 0 },
            Ordering::Release,
        );
        let first_empty = if n_full < count { n_full as u64 + 1 } else { 0 };
        fh.empty
            .store(tag(&fh.empty) | first_empty, Ordering::Release);
    }

    /// The shared view.
    #[cfg(any(test, feature = "test-support"))]
    pub fn view(&self) -> &PoolView {
        &self.view
    }

    /// Counts buffers by state and owner (a racy snapshot, for status).
    pub fn usage(&self) -> Vec<ClassUsage> {
        let seg = self.view.segment();
        seg.classes()
            .iter()
            .enumerate()
            .map(|(class, c)| {
                let mut u = ClassUsage {
                    buf_size: c.buf_size,
                    total: c.count,
                    quota: if c.quota == 0 { c.count } else { c.quota.min(c.count) },
                    ..Default::default()
                };
                let mut owners = std::collections::BTreeMap::<u16, u32>::new();
                let mut charged = std::collections::BTreeMap::<u16, u32>::new();
                for i in 0..c.count {
                    let w = seg
                        .buf_header(class, i)
                        .expect("in range")
                        .word
                        .load(Ordering::Relaxed);
                    if bufword::state(w) == bufword::FREE {
                        u.free += 1;
                    } else {
                        *owners.entry(bufword::owner(w)).or_default() += 1;
                    }
                    if let Some(who) = bufword::charged_to(w) {
                        *charged.entry(who).or_default() += 1;
                    }
                }
                u.by_owner = owners.into_iter().collect();
                u.by_charge = charged.into_iter().collect();
                u
            })
            .collect()
    }

    fn close_gates(
        &self,
        live: &[u16],
        patience: Duration,
        gone: impl FnMut(u16) -> bool,
    ) -> Result<(), Busy> {
        close_gates(self.view.segment(), live, patience, gone)
    }

    fn open_gates(&self) {
        open_gates(self.view.segment())
    }

    /// Gives back everything the stacks in `dead` owned, and anything lost
    /// in a list operation one was in the middle of. `live` are the other
    /// registered stacks; `gone(id)` says whether one of them has in fact
    /// exited (asked only of one found inside a list operation). Rebuilds
    /// the lists from the headers: whatever is free (listed or not) goes
    /// back into magazines.
    ///
    /// A buffer held in the name of a stack that is not in `live` is given
    /// back too, whether `dead` names it or not: the owner is dead, or the
    /// header was overwritten by a process that can write the segment
    /// (owner 0, or an id no stack holds). Nobody else would ever free it.
    ///
    /// Also gives back the buffers a dead stack `d` stamped in flight to a
    /// stack `o` unless `(d, o)` is in `readers`: the pairs where `o` may
    /// still read a ring from `d` (the other end of a channel of `d` not yet
    /// released). The rule is per dead stack: `o` may have drained and
    /// released its channel with one dead stack and not yet with another.
    /// A sender stamps before it pushes, so one that died in between left
    /// buffers owned by a live receiver but in no ring. Once the receiver
    /// has drained the ring and released the channel, whatever `d` stamped
    /// for it and it did not take can never reach it. Before that the
    /// buffer may still be in the ring, and taking it back would make the
    /// receiver reject (or, after the buffer's reuse, misread) a descriptor
    /// the dead stack really sent.
    ///
    /// A buffer a live stack received from one in `dead` and still holds
    /// is charged to its holder from then on (its sender cleared from the
    /// word): the dead stack's slot, and whoever registers in it next,
    /// must not carry it.
    ///
    /// Waits at most `patience` for live stacks to leave their list
    /// operations; if one does not (a stopped process, say), nothing
    /// changes and `Err(Busy(id))` names it: try again later (with the
    /// readers as they are then). The manager must not wait on one stack
    /// without bound.
    pub fn reclaim(
        &self,
        dead: &[u16],
        live: &[u16],
        readers: &[(u16, u16)],
        patience: Duration,
        gone: impl FnMut(u16) -> bool,
    ) -> Result<Reclaimed, Busy> {
        self.close_gates(live, patience, gone)?;
        let seg = self.view.segment();
        let mut r = Reclaimed::default();
        for (class, c) in seg.classes().iter().enumerate() {
            // Walk the frozen full stack to know what is listed. A corrupt
            // link (cycle, out of range) ends the walk; the rebuild below
            // starts from the headers, so nothing is lost by stopping.
            let mut listed = vec![false; c.count as usize];
            let mut seen = vec![false; c.count as usize];
            let mut cur = seg.free_head(class).head.load(Ordering::Acquire) as u32;
            while cur != 0 {
                let m = cur - 1;
                let Some(mag) = seg.magazine(class, m) else {
                    break;
                };
                if seen[m as usize] {
                    break;
                }
                seen[m as usize] = true;
                let len = (mag.len.load(Ordering::Relaxed) as usize).min(MAG_SIZE);
                for slot in &mag.idx[..len] {
                    if let Some(l) = listed.get_mut(slot.load(Ordering::Relaxed) as usize) {
                        *l = true;
                    }
                }
                cur = mag.next.load(Ordering::Relaxed);
            }
            let mut free = Vec::new();
            for i in 0..c.count {
                let w = seg
                    .buf_header(class, i)
                    .expect("in range")
                    .word
                    .load(Ordering::Relaxed);
                if bufword::state(w) == bufword::FREE {
                    if !listed[i as usize] {
                        r.lost += 1;
                    }
                    free.push(i);
                } else if !live.contains(&bufword::owner(w))
                    || (bufword::state(w) == bufword::INFLIGHT
                        && dead.contains(&bufword::from(w))
                        && !readers.contains(&(bufword::from(w), bufword::owner(w))))
                {
                    r.owned += 1;
                    free.push(i);
                } else if bufword::state(w) == bufword::HELD && dead.contains(&bufword::from(w)) {
                    // Received from a stack that died, and kept: charged
                    // to whoever keeps it from now on, not to the dead
                    // sender's slot (a stack that registers there would
                    // inherit it). A compare-and-swap: the holder may be
                    // freeing it this moment, and its word then wins.
                    let _ = seg.buf_header(class, i).expect("in range").word.compare_exchange(
                        w,
                        bufword::pack_from(bufword::HELD, bufword::owner(w), 0, bufword::gen(w)),
                        Ordering::Relaxed,
                        Ordering::Relaxed,
                    );
                }
            }
            self.rebuild(class, &free, true);
        }
        for &d in dead {
            // A dead stack's count stays as its threads left it.
            seg.stack_slot(d).intent.store(0, Ordering::SeqCst);
        }
        self.open_gates();
        Ok(r)
    }
}

//! The intent/gate bracket around every operation on a pool's shared
//! free lists (the shm pool's magazines, DPDK's mempools), and the
//! manager's side of it: closing the gates, waiting for the stacks to be
//! idle, reopening them. Why it exists, and how the two sides order their
//! accesses, is in the shm pool's docs ([`crate::backend::shm::pool`],
//! "Crash safety"); both backends keep the words in the segment.

use std::time::{Duration, Instant};

use crate::backend::traits::Busy;
use crate::segment::Segment;
use crate::sync::{yield_thread, AtomicU32, AtomicU64, Ordering};

/// Longest wait for a closed gate. The manager holds the gates for a
/// sweep: its patience with busy stacks (milliseconds) and a rebuild of
/// the lists. A gate closed much longer is one a process that can write
/// the segment closed (the manager reopens such a gate at its next look):
/// the operation gives up, as for a shortage, so that a caller's timeout
/// holds and no thread waits on it at full CPU.
#[cfg(not(loom))]
const GATE_WAIT_MAX: Duration = Duration::from_millis(100);

/// Runs a free-list operation of stack `me` on `class` of `seg`'s pool
/// inside the intent/gate bracket (see the module docs). Returns `None`
/// while the manager holds the gate and `wait` is false; when the manager
/// died holding it (killed in the middle of a sweep: nobody will open it,
/// and the lists behind it may be half rebuilt; [`stranded`] then says
/// so); and when the gate stayed closed for [`GATE_WAIT_MAX`].
pub(crate) fn global_op<R>(
    seg: &Segment,
    me: u16,
    class: usize,
    wait: bool,
    op: impl FnOnce() -> R,
) -> Option<R> {
    let intent = &seg.stack_slot(me).intent;
    let alive = seg.manager_alive();
    bracket(
        intent,
        &seg.free_head(class).gate,
        wait,
        || crate::liveness::died(alive),
        op,
    )
}

/// Whether `class`'s gate is held closed by a manager that died (killed
/// in the middle of a sweep): nobody will open it again.
pub(crate) fn stranded(seg: &Segment, class: usize) -> bool {
    seg.free_head(class).gate.load(Ordering::Acquire) != 0
        && crate::liveness::died(seg.manager_alive())
}

/// Orders a store before the load that follows it in the Dekker
/// handshake between [`bracket`] and [`close_gates`]. In
/// production the `SeqCst` accesses on both sides already do (C11: one
/// total order over them); loom models `SeqCst` accesses as `AcqRel`
/// only (its README, "Unsupported features") but does model a `SeqCst`
/// fence, so under loom the order is spelled out as one. A fence here in
/// production would cost an `mfence` per free-list operation for nothing.
#[inline(always)]
fn dekker_order() {
    #[cfg(loom)]
    crate::sync::fence(Ordering::SeqCst);
}

/// One thread of a stack inside a free-list operation: its share of the
/// stack's intent count, given back when dropped (also on unwind, so a
/// panic inside the operation does not leave the manager waiting).
struct Intent<'a>(&'a AtomicU64);

impl Drop for Intent<'_> {
    #[inline]
    fn drop(&mut self) {
        // SeqCst: the list writes of the operation happen before the
        // manager, loading the count in `close_gates`, can see us idle.
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Enters a free-list operation: counts this thread in `intent`, then
/// checks `gate`. `None` (and not counted) while the manager holds the
/// gate.
///
/// A count, not a flag: the threads of one stack share its slot, and a
/// flag one of them cleared on its way out said "idle" while another was
/// still inside.
#[inline]
fn enter<'a>(intent: &'a AtomicU64, gate: &AtomicU32) -> Option<Intent<'a>> {
    // SeqCst increment then SeqCst load: our half of the Dekker handshake
    // with `ManagerPool::close_gates` (gate store, then intent loads).
    // Either the manager sees the count, or we see the gate.
    intent.fetch_add(1, Ordering::SeqCst);
    let entered = Intent(intent);
    dekker_order();
    (gate.load(Ordering::SeqCst) == 0).then_some(entered)
}

/// Runs `op` as a free-list operation bracketed by `intent` and `gate`
/// (see the module docs); waits out a closed gate if `wait`, else returns
/// `None`. Also `None` if the gate is closed and `closer_died()`: the
/// manager that closed it is gone and will never open it.
fn bracket<R>(
    intent: &AtomicU64,
    gate: &AtomicU32,
    wait: bool,
    closer_died: impl Fn() -> bool,
    op: impl FnOnce() -> R,
) -> Option<R> {
    loop {
        if let Some(_inside) = enter(intent, gate) {
            return Some(op());
        }
        if !wait {
            return None;
        }
        // Acquire: pairs with the Release store in `open_gates`; the
        // rebuilt lists are visible to the operation we retry.
        let mut pause = Pause::new();
        while gate.load(Ordering::Acquire) != 0 {
            if closer_died() || !pause.wait() {
                return None;
            }
        }
    }
}

/// The wait for a closed gate: yields first (a sweep's gates are closed
/// for milliseconds at most), then sleeps from 1 µs, doubling up to a
/// millisecond, so a gate held closed for long costs no CPU; false once
/// the gate has been waited on for [`GATE_WAIT_MAX`]. Under loom, yields.
struct Pause {
    #[cfg(not(loom))]
    step: u32,
    #[cfg(not(loom))]
    since: Instant,
}

impl Pause {
    fn new() -> Self {
        Pause {
            #[cfg(not(loom))]
            step: 0,
            #[cfg(not(loom))]
            since: Instant::now(),
        }
    }

    /// Pauses once; false if the wait has lasted long enough.
    #[cfg(not(loom))]
    fn wait(&mut self) -> bool {
        const YIELDS: u32 = 64;
        self.step = self.step.saturating_add(1);
        if self.step <= YIELDS {
            yield_thread();
            return true;
        }
        if self.since.elapsed() >= GATE_WAIT_MAX {
            return false;
        }
        let us = 1u64 << (self.step - YIELDS - 1).min(10);
        std::thread::sleep(Duration::from_micros(us.min(1000)));
        true
    }

    #[cfg(loom)]
    fn wait(&mut self) -> bool {
        yield_thread();
        true
    }
}

/// Reopens every gate of `seg` that is closed, outside a sweep (the
/// manager calls it only there): a gate closed by a process that can
/// write the segment, which would otherwise hold every stack's list
/// operations on that class for good. Returns how many it reopened.
pub(crate) fn reopen_forged(seg: &Segment) -> usize {
    let mut n = 0;
    for class in 0..seg.classes().len() {
        let gate = &seg.free_head(class).gate;
        if gate.load(Ordering::Acquire) != 0 {
            gate.store(0, Ordering::Release);
            n += 1;
        }
    }
    n
}

/// The manager's wait for one stack's `intent` to drop to zero, with the
/// gates already closed (and `dekker_order` after closing them). Gives up
/// at `deadline` (`None`: never) and returns false.
fn wait_idle(intent: &AtomicU64, deadline: Option<Instant>) -> bool {
    loop {
        // SeqCst: the manager's half of the Dekker handshake in `enter`.
        if intent.load(Ordering::SeqCst) == 0 {
            return true;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        yield_thread();
    }
}

/// Closes every gate and waits until no stack in `live` is inside a list
/// operation; returns with the lists frozen. A stack found inside one
/// for which `gone` says its process has exited is not waited for (it
/// writes nothing any more; what it left half done, reconciliation
/// repairs). One still inside at the end of `patience` makes the gates
/// reopen, untouched, and is returned as `Busy`.
pub(crate) fn close_gates(
    seg: &Segment,
    live: &[u16],
    patience: Duration,
    mut gone: impl FnMut(u16) -> bool,
) -> Result<(), Busy> {
    for class in 0..seg.classes().len() {
        // SeqCst: the manager's half of the Dekker handshake in `enter`.
        seg.free_head(class).gate.store(1, Ordering::SeqCst);
    }
    dekker_order();
    let deadline = Instant::now().checked_add(patience);
    for &id in live {
        let intent = &seg.stack_slot(id).intent;
        if wait_idle(intent, Some(Instant::now())) || gone(id) {
            continue;
        }
        // Alive (or its death not visible yet): wait, but not forever.
        if !wait_idle(intent, deadline) && !gone(id) {
            open_gates(seg);
            return Err(Busy(id));
        }
    }
    Ok(())
}

/// Reopens the gates [`close_gates`] closed.
pub(crate) fn open_gates(seg: &Segment) {
    for class in 0..seg.classes().len() {
        // Release: our list repairs happen before anyone re-enters.
        seg.free_head(class).gate.store(0, Ordering::Release);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// A gate nobody opens, its closer alive (a process that can write the
    /// segment closed it): a waiting operation gives up instead of waiting
    /// for good, and does not run.
    #[test]
    fn a_wait_for_a_gate_nobody_opens_gives_up() {
        let (intent, gate) = (AtomicU64::new(0), AtomicU32::new(1));
        let ran = std::cell::Cell::new(false);
        assert_eq!(bracket(&intent, &gate, true, || false, || ran.set(true)), None);
        assert!(!ran.get());
        assert_eq!(intent.load(Ordering::SeqCst), 0, "not counted inside");
        // Open, it runs.
        gate.store(0, Ordering::SeqCst);
        assert_eq!(bracket(&intent, &gate, true, || false, || 7), Some(7));
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    /// The crash-reclamation handshake: two threads of one stack each run
    /// a free-list operation (`bracket`, as `global_op` does; one waits
    /// out a closed gate, one gives up) while the manager closes the gate
    /// and, if the stack's intent reads zero, rebuilds the lists (as
    /// `close_gates` and `reclaim` do; otherwise it gives up, as when its
    /// patience runs out). What an operation and the rebuild write are
    /// loom cells, so an operation overlapping the rebuild fails the
    /// model, and so does a write going unseen. With the intent a flag
    /// instead of a count (the second thread's exit clearing it while the
    /// first is inside) it fails.
    #[test]
    fn loom_no_rebuild_while_a_thread_of_the_stack_is_inside() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let intent = Arc::new(AtomicU64::new(0));
            let gate = Arc::new(AtomicU32::new(0));
            // What each thread's operation changes (the lists themselves
            // are lock-free among stacks: only the manager needs them
            // still); the rebuild changes both.
            let lists: Arc<[loom::cell::UnsafeCell<u32>; 2]> = Arc::new(Default::default());
            let threads: Vec<_> = (0..2)
                .map(|i| {
                    let (intent, gate, lists) = (intent.clone(), gate.clone(), lists.clone());
                    thread::spawn(move || {
                        bracket(
                            &intent,
                            &gate,
                            i == 0,
                            || false,
                            || {
                                // SAFETY: inside the bracket; the model checks
                                // that the manager does not touch it meanwhile.
                                lists[i].with_mut(|p| unsafe { *p += 1 })
                            },
                        )
                        .is_some()
                    })
                })
                .collect();
            gate.store(1, Ordering::SeqCst);
            dekker_order();
            // No patience: one look (waiting is the same look repeated).
            let rebuilt = wait_idle(&intent, Some(Instant::now()));
            if rebuilt {
                for l in lists.iter() {
                    // SAFETY: the gate is closed and the stack idle: the
                    // lists are the manager's alone (what the model checks).
                    l.with_mut(|p| unsafe { *p += 10 });
                }
            }
            gate.store(0, Ordering::Release);
            let ran: Vec<bool> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            assert!(ran[0], "the waiting thread runs once the gate reopens");
            for (l, ran) in lists.iter().zip(ran) {
                // SAFETY: every thread joined.
                let v = l.with(|p| unsafe { *p });
                assert_eq!(v, u32::from(ran) + if rebuilt { 10 } else { 0 });
            }
            assert_eq!(intent.load(Ordering::SeqCst), 0);
        });
    }
}

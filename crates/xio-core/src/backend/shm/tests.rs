//! The shm pool's tests: the stacks' side ([`StackPool`], [`PoolView`])
//! and the manager's ([`ManagerPool`]) together, each on both backings (a
//! heap region, the in-process backend, and a sealed memfd).

use std::time::Duration;

use super::manager_pool::ManagerPool;
use super::pool::{PoolView, StackPool};
use crate::backend::traits::{AllocError, Busy, RawBuf, Reject};
use crate::layout::{bufword, Descriptor, PoolConfig, MAG_SIZE};
use crate::segment::{Region, Segment};
use crate::sync::Ordering;

/// The conformance suite runs every pool test on each backing: the
/// heap region (the in-process backend) and a sealed memfd (shm).
#[derive(Clone, Copy, Debug)]
enum Backing {
    Heap,
    Memfd,
}
const BACKINGS: [Backing; 2] = [Backing::Heap, Backing::Memfd];

fn pool(b: Backing, classes: Vec<(u32, u32)>) -> (ManagerPool, Segment) {
    pool_with_quotas(b, classes.clone(), classes)
}

/// A pool whose classes have these quotas (`pool`: the whole class each,
/// so one stack may empty it, as the free-list tests do).
fn pool_with_quotas(
    b: Backing,
    classes: Vec<(u32, u32)>,
    quotas: Vec<(u32, u32)>,
) -> (ManagerPool, Segment) {
    let cfg = PoolConfig {
        classes,
        max_stacks: 4,
        max_channels: 2,
        ring_capacity: 8,
        quotas,
    };
    let geo = cfg.geometry().unwrap();
    let region = match b {
        Backing::Heap => Region::heap(geo.total_len as usize).unwrap(),
        Backing::Memfd => Region::create_memfd("xio-pool-test", geo.total_len as usize).unwrap(),
    };
    let seg = Segment::init(region, &cfg, &geo).unwrap();
    (ManagerPool::init(seg.clone()), seg)
}

fn total_free(m: &ManagerPool) -> u32 {
    m.usage().iter().map(|u| u.free).sum()
}

#[test]
fn alloc_free_all_classes_and_exhaustion() {
    for b in BACKINGS {
        alloc_free_all_classes_and_exhaustion_on(b);
    }
}

fn alloc_free_all_classes_and_exhaustion_on(b: Backing) {
    let (m, seg) = pool(b, vec![(64, 40), (4096, 3)]);
    let p = StackPool::new(PoolView::new(seg), 1);
    let small: Vec<_> = (0..40).map(|_| p.alloc(10, true).unwrap()).collect();
    assert_eq!(p.alloc(64, true), Err(AllocError::Exhausted));
    let big = p.alloc(65, true).unwrap();
    assert_eq!(big.class, 1);
    assert_eq!(p.alloc(4097, true), Err(AllocError::TooLarge(4097)));
    let mut seen = std::collections::HashSet::new();
    assert!(
        small.iter().all(|b| seen.insert(*b)),
        "no buffer handed out twice"
    );
    for b in small {
        p.free(b);
    }
    p.free(big);
    p.flush();
    assert_eq!(total_free(&m), 43);
}

/// A magazine is shared memory: an index listed twice (or the index
/// of a buffer someone holds) must not make this process hand one
/// buffer out twice, two `BufMut`s over the same bytes.
#[test]
fn a_corrupt_magazine_never_hands_out_a_buffer_twice() {
    for b in BACKINGS {
        a_corrupt_magazine_never_hands_out_a_buffer_twice_on(b);
    }
}

fn a_corrupt_magazine_never_hands_out_a_buffer_twice_on(b: Backing) {
    let (_m, seg) = pool(b, vec![(64, 8)]);
    // Eight buffers in magazine 0; each pop takes one from its end
    // (a cache of one: 8 / (2 x 4 stacks)).
    let mag = seg.magazine(0, 0).unwrap();
    assert_eq!(mag.len.load(Ordering::Relaxed), 8);
    let dup = mag.idx[6].load(Ordering::Relaxed);
    mag.idx[7].store(dup, Ordering::Relaxed);
    let p = StackPool::new(PoolView::new(seg.clone()), 1);
    let mut seen = std::collections::HashSet::new();
    while let Ok(b) = p.alloc(10, false) {
        assert!(seen.insert(b), "{b:?} handed out twice");
    }
    // And one that another stack holds, listed as free.
    let q = StackPool::new(PoolView::new(seg.clone()), 2);
    for b in seen.drain() {
        p.free(b);
    }
    p.flush();
    let theirs = q.alloc(10, false).unwrap();
    let mag = (0..8)
        .filter_map(|m| seg.magazine(0, m))
        .find(|m| m.len.load(Ordering::Relaxed) > 0)
        .unwrap();
    let n = mag.len.load(Ordering::Relaxed) as usize;
    mag.idx[n - 1].store(theirs.index, Ordering::Relaxed);
    while let Ok(b) = p.alloc(10, false) {
        assert_ne!(b, theirs, "a buffer stack 2 holds handed to stack 1");
    }
}

/// Flushing a cache of more than a magazine pushes a chunk at a time.
/// When the empty magazines ran out midway (a corrupt list), the cache
/// took back every index, the pushed ones too: those were then both
/// listed free and cached, and handed to two stacks.
#[test]
fn a_flush_that_fails_midway_keeps_only_what_it_did_not_push() {
    for b in BACKINGS {
        a_flush_that_fails_midway_keeps_only_what_it_did_not_push_on(b);
    }
}

fn a_flush_that_fails_midway_keeps_only_what_it_did_not_push_on(b: Backing) {
    let (_m, seg) = pool(b, vec![(64, 1000)]);
    let p = StackPool::new(PoolView::new(seg.clone()), 1);
    let held: Vec<_> = (0..2 * MAG_SIZE)
        .map(|_| p.alloc(10, true).unwrap())
        .collect();
    for b in held {
        p.free(b); // a cache of 60: nothing spills
    }
    // One empty magazine left: the flush's second chunk finds none.
    let fh = seg.free_head(0);
    let first = fh.empty.load(Ordering::Relaxed) as u32;
    assert_ne!(first, 0);
    seg.magazine(0, first - 1)
        .unwrap()
        .next
        .store(0, Ordering::Relaxed);
    p.flush();
    let q = StackPool::new(PoolView::new(seg.clone()), 2);
    let mut theirs = std::collections::HashSet::new();
    while let Ok(b) = q.alloc(10, false) {
        theirs.insert(b);
    }
    while let Ok(b) = p.alloc(10, false) {
        assert!(!theirs.contains(&b), "{b:?} handed to both stacks");
    }
}

#[test]
fn send_accept_and_forged_descriptors() {
    for b in BACKINGS {
        send_accept_and_forged_descriptors_on(b);
    }
}

fn send_accept_and_forged_descriptors_on(b: Backing) {
    let (_m, seg) = pool(b, vec![(256, 8)]);
    let a = StackPool::new(PoolView::new(seg.clone()), 1);
    let b = StackPool::new(PoolView::new(seg), 2);
    let x = a.alloc(100, true).unwrap();
    let d = a.view().prepare_send(1, x, 100, 2, 0, 0);
    // Not addressed to stack 3; not from stack 3; wrong generation; bad class, index, length.
    assert!(matches!(
        b.view().accept(3, 1, &d),
        Err(Reject::Ownership(_))
    ));
    // Through another sender's ring.
    assert!(matches!(
        b.view().accept(2, 3, &d),
        Err(Reject::Ownership(_))
    ));
    assert!(matches!(
        b.view().accept(
            2,
            1,
            &Descriptor {
                gen: d.gen ^ 1,
                ..d
            }
        ),
        Err(Reject::Ownership(_))
    ));
    assert_eq!(
        b.view().accept(2, 1, &Descriptor { class: 5, ..d }),
        Err(Reject::Class(5))
    );
    assert_eq!(
        b.view().accept(2, 1, &Descriptor { index: 8, ..d }),
        Err(Reject::Index(8))
    );
    assert_eq!(
        b.view().accept(2, 1, &Descriptor { len: 257, ..d }),
        Err(Reject::Length(257))
    );
    assert_eq!(b.view().accept(2, 1, &d), Ok(x));
    // A replay of the same descriptor is refused.
    assert!(matches!(
        b.view().accept(2, 1, &d),
        Err(Reject::Ownership(_))
    ));
    b.free(x);
}

#[test]
fn reclaim_returns_everything_a_dead_stack_held() {
    for b in BACKINGS {
        reclaim_returns_everything_a_dead_stack_held_on(b);
    }
}

fn reclaim_returns_everything_a_dead_stack_held_on(b: Backing) {
    let (m, seg) = pool(b, vec![(64, 100), (1024, 10)]);
    let a = StackPool::new(PoolView::new(seg.clone()), 1);
    let b = StackPool::new(PoolView::new(seg.clone()), 2);
    let held: Vec<_> = (0..30).map(|_| a.alloc(64, true).unwrap()).collect();
    // In flight from b to a.
    let f = b.alloc(1000, true).unwrap();
    let _ = b.view().prepare_send(2, f, 1, 1, 0, 0);
    // Simulate a crash between taking a magazine and claiming its
    // buffers: pop one by hand, never claim.
    let lost = {
        let v = PoolView::new(seg.clone());
        let mg = v.mag_pop(0, &seg.free_head(0).head).unwrap();
        seg.magazine(0, mg).unwrap().len.load(Ordering::SeqCst)
    };
    assert!(lost > 0);
    seg.stack_slot(1).intent.store(1, Ordering::SeqCst);
    std::mem::forget(a); // a "dies" with its cache and buffers
    let r = m
        .reclaim(&[1], &[2], &[], Duration::MAX, |_| false)
        .unwrap();
    assert_eq!(r.lost, lost, "the taken-but-unclaimed buffers are found");
    assert!(r.owned >= 31, "{r:?}");
    drop(held);
    // b is alive and keeps its own (b's cached leftovers + nothing else).
    b.flush();
    assert_eq!(total_free(&m), 110);
    // The rebuilt lists work.
    let all: Vec<_> = (0..100).map(|_| b.alloc(1, true).unwrap()).collect();
    assert_eq!(all.len(), 100);
}

/// Two threads of one stack: one inside a free-list operation, the
/// other completes one of its own. The stack is not idle: a
/// reclamation (for some other, dead stack) must not go ahead. With a
/// per-stack flag the second thread's exit cleared it and the manager
/// rebuilt the lists under the first.
#[test]
fn a_stack_is_busy_while_any_of_its_threads_is_in_a_list_op() {
    for b in BACKINGS {
        a_stack_is_busy_while_any_of_its_threads_is_in_a_list_op_on(b);
    }
}

fn a_stack_is_busy_while_any_of_its_threads_is_in_a_list_op_on(b: Backing) {
    use std::sync::mpsc::channel;
    let (m, seg) = pool(b, vec![(64, 64)]);
    let view = PoolView::new(seg.clone());
    let (inside_tx, inside_rx) = channel();
    let (leave_tx, leave_rx) = channel::<()>();
    let t1 = {
        let view = view.clone();
        std::thread::spawn(move || {
            view.global_op(1, 0, true, || {
                inside_tx.send(()).unwrap();
                leave_rx.recv().unwrap();
            })
        })
    };
    inside_rx.recv().unwrap();
    // A second thread of stack 1 enters and leaves.
    std::thread::scope(|s| {
        s.spawn(|| view.global_op(1, 0, true, || ()).unwrap());
    });
    assert_eq!(
        m.reclaim(&[2], &[1], &[], Duration::from_millis(20), |_| false),
        Err(Busy(1)),
        "stack 1 has a thread inside a list operation"
    );
    assert_eq!(
        seg.free_head(0).gate.load(Ordering::SeqCst),
        0,
        "a reclamation that gave up leaves the gates open"
    );
    leave_tx.send(()).unwrap();
    t1.join().unwrap().unwrap();
    m.reclaim(&[2], &[1], &[], Duration::MAX, |_| false)
        .expect("idle now");
    assert_eq!(total_free(&m), 64);
}

/// A stack that left its intent set and has exited (its end of file
/// not handled yet) is not waited for; a live one is, for the patience
/// given, and then named.
#[test]
fn reclaim_skips_an_exited_stacks_intent_and_names_a_stuck_one() {
    for b in BACKINGS {
        reclaim_skips_an_exited_stacks_intent_and_names_a_stuck_one_on(b);
    }
}

fn reclaim_skips_an_exited_stacks_intent_and_names_a_stuck_one_on(b: Backing) {
    let (m, seg) = pool(b, vec![(64, 64)]);
    let a = StackPool::new(PoolView::new(seg.clone()), 1);
    let held: Vec<_> = (0..10).map(|_| a.alloc(1, true).unwrap()).collect();
    // Stack 1 dies holding 10 (and its cache); stacks 2 and 3 "died
    // inside a list operation".
    std::mem::forget(a);
    seg.stack_slot(2).intent.store(1, Ordering::SeqCst);
    seg.stack_slot(3).intent.store(1, Ordering::SeqCst);
    // 3 is still registered (its death not handled yet) and has exited.
    let mut asked = Vec::new();
    let r = m
        .reclaim(&[1, 2], &[3], &[], Duration::MAX, |id| {
            asked.push(id);
            true
        })
        .expect("an exited stack is not waited for");
    assert_eq!(asked, [3]);
    assert!(r.owned >= 10, "{r:?}");
    assert_eq!(seg.stack_slot(2).intent.load(Ordering::SeqCst), 0);
    assert_eq!(seg.stack_slot(3).intent.load(Ordering::SeqCst), 1);
    drop(held);
    // Now 3 is alive but stuck (stopped inside a list operation).
    assert_eq!(
        m.reclaim(&[2], &[3], &[], Duration::from_millis(5), |_| false),
        Err(Busy(3))
    );
    seg.stack_slot(3).intent.store(0, Ordering::SeqCst);
    m.reclaim(&[2], &[3], &[], Duration::from_millis(5), |_| false)
        .expect("3 left its operation");
    assert_eq!(total_free(&m), 64);
}

#[test]
fn reclaim_finds_what_a_dead_sender_stamped_but_never_pushed() {
    for b in BACKINGS {
        reclaim_finds_what_a_dead_sender_stamped_but_never_pushed_on(b);
    }
}

fn reclaim_finds_what_a_dead_sender_stamped_but_never_pushed_on(b: Backing) {
    let (m, seg) = pool(b, vec![(64, 10)]);
    let a = StackPool::new(PoolView::new(seg.clone()), 1);
    let b = StackPool::new(PoolView::new(seg.clone()), 2);
    // a stamps two buffers in flight to b: `pushed` reaches b's ring,
    // `stranded` never does (a dies first).
    let pushed = a.alloc(64, true).unwrap();
    let stranded = a.alloc(64, true).unwrap();
    let d_pushed = a.view().prepare_send(1, pushed, 8, 2, 0, 0);
    let d_stranded = a.view().prepare_send(1, stranded, 8, 2, 0, 0);
    std::mem::forget(a);
    // First sweep: b may still read the ring from a, so neither goes.
    let r = m
        .reclaim(&[1], &[2], &[(1, 2)], Duration::MAX, |_| false)
        .unwrap();
    assert_eq!(r.owned, 0, "both may still reach b: {r:?}");
    assert_eq!(b.view().accept(2, 1, &d_pushed), Ok(pushed));
    // b drained the ring and released the channel: the second sweep
    // takes back what a stamped for b and b never took, not what it did.
    let r = m
        .reclaim(&[1], &[2], &[], Duration::MAX, |_| false)
        .unwrap();
    assert_eq!(r.owned, 1, "{r:?}");
    assert_eq!(total_free(&m), 9);
    // A stale descriptor for the reclaimed buffer is refused, even
    // once the buffer is in flight to b again with a newer generation.
    assert!(matches!(
        b.view().accept(2, 1, &d_stranded),
        Err(Reject::Ownership(_))
    ));
    let c = StackPool::new(PoolView::new(seg), 3);
    let again: Vec<_> = (0..9).map(|_| c.alloc(64, true).unwrap()).collect();
    assert!(again.contains(&stranded));
    let _ = c.view().prepare_send(3, stranded, 8, 2, 0, 0);
    assert!(matches!(
        b.view().accept(2, 1, &d_stranded),
        Err(Reject::Ownership(_))
    ));
    b.free(pushed);
}

/// Two senders die at once and are swept in one pass: the readers rule
/// holds per dead stack. The live receiver has released its channel
/// with one of them (drained it) and not yet with the other: what the
/// first stamped for it and never pushed goes back, what the second
/// stamped stays (it may still be in the ring) until the next sweep.
#[test]
fn reclaim_applies_the_readers_rule_per_dead_stack() {
    for b in BACKINGS {
        reclaim_applies_the_readers_rule_per_dead_stack_on(b);
    }
}

fn reclaim_applies_the_readers_rule_per_dead_stack_on(b: Backing) {
    let (m, seg) = pool(b, vec![(64, 64)]);
    let state = |x: RawBuf| {
        let w = seg
            .buf_header(x.class as usize, x.index)
            .unwrap()
            .word
            .load(Ordering::SeqCst);
        (bufword::state(w), bufword::owner(w))
    };
    let s1 = StackPool::new(PoolView::new(seg.clone()), 1);
    let s2 = StackPool::new(PoolView::new(seg.clone()), 2);
    let s3 = StackPool::new(PoolView::new(seg.clone()), 3);
    // Stamped and never pushed: 1 -> 3, 2 -> 3, 1 -> 2; and one in
    // flight between live stacks (3 -> 3 will do: from a live sender).
    let x13 = s1.alloc(64, true).unwrap();
    let x23 = s2.alloc(64, true).unwrap();
    let x12 = s1.alloc(64, true).unwrap();
    let x33 = s3.alloc(64, true).unwrap();
    let _ = s1.view().prepare_send(1, x13, 8, 3, 0, 0);
    let _ = s2.view().prepare_send(2, x23, 8, 3, 0, 0);
    let _ = s1.view().prepare_send(1, x12, 8, 2, 0, 0);
    let _ = s3.view().prepare_send(3, x33, 8, 3, 0, 0);
    std::mem::forget(s1);
    std::mem::forget(s2);
    // 3 has released its channel with 1, not yet the one with 2.
    m.reclaim(&[1, 2], &[3], &[(2, 3)], Duration::MAX, |_| false)
        .unwrap();
    assert_eq!(state(x13).0, bufword::FREE, "3 no longer reads from 1");
    assert_eq!(state(x12).0, bufword::FREE, "owned by a dead stack");
    assert_eq!(
        state(x23),
        (bufword::INFLIGHT, 3),
        "3 may still read it from 2's ring"
    );
    assert_eq!(state(x33), (bufword::INFLIGHT, 3), "a live sender's");
    // 3 released the other channel too: the last sweep for 2 finds it.
    m.reclaim(&[2], &[3], &[], Duration::MAX, |_| false)
        .unwrap();
    assert_eq!(state(x23).0, bufword::FREE);
    assert_eq!(state(x33), (bufword::INFLIGHT, 3));
    drop(s3);
}

#[test]
fn concurrent_alloc_free_threads() {
    for b in BACKINGS {
        concurrent_alloc_free_threads_on(b);
    }
}

fn concurrent_alloc_free_threads_on(b: Backing) {
    let (m, seg) = pool(b, vec![(64, 256)]);
    let hs: Vec<_> = (1..=3u16)
        .map(|id| {
            let seg = seg.clone();
            std::thread::spawn(move || {
                let p = StackPool::new(PoolView::new(seg), id);
                let mut mine = Vec::new();
                for i in 0..20_000 {
                    if i % 3 != 2 {
                        if let Ok(b) = p.alloc(8, true) {
                            mine.push(b);
                        }
                    } else if let Some(b) = mine.pop() {
                        p.free(b);
                    }
                    if mine.len() > 50 {
                        for b in mine.drain(..) {
                            p.free(b);
                        }
                    }
                }
                for b in mine {
                    p.free(b);
                }
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    assert_eq!(total_free(&m), 256);
}

/// A segment of `b` with the conformance suites' classes and rings of 8
/// slots.
fn conformance_segment(b: Backing) -> (ManagerPool, Segment) {
    let cfg = PoolConfig {
        classes: crate::backend::conformance::CLASSES.to_vec(),
        max_stacks: 4,
        max_channels: 2,
        ring_capacity: 8,
        quotas: crate::backend::conformance::CLASSES.to_vec(),
    };
    let geo = cfg.geometry().unwrap();
    let region = match b {
        Backing::Heap => Region::heap(geo.total_len as usize).unwrap(),
        Backing::Memfd => Region::create_memfd("xio-conformance", geo.total_len as usize).unwrap(),
    };
    let seg = Segment::init(region, &cfg, &geo).unwrap();
    (ManagerPool::init(seg.clone()), seg)
}

#[test]
fn conformance_pool() {
    for b in BACKINGS {
        crate::backend::conformance::pool_suite(|| {
            let (m, seg) = conformance_segment(b);
            crate::backend::conformance::PoolPair {
                a: StackPool::new(PoolView::new(seg.clone()), 1),
                b: StackPool::new(PoolView::new(seg), 2),
                keep: Box::new(m),
            }
        });
    }
}

#[test]
fn conformance_ring() {
    // The in-process ring on the heap, and a channel's ring in a segment
    // of each backing.
    crate::backend::conformance::ring_suite(|| super::heap_ring(8));
    for b in BACKINGS {
        crate::backend::conformance::ring_suite(|| {
            // Side 0 produces into the ring side 1 consumes, once the
            // manager has emptied it (as before it hands a channel out).
            let (_m, seg) = conformance_segment(b);
            seg.reset_channel_rings(1);
            let (tx, _) = super::ring::channel_ends(&seg, 1, 0);
            let (_, rx) = super::ring::channel_ends(&seg, 1, 1);
            (tx, rx)
        });
    }
}

#[test]
fn conformance_doorbell() {
    // One doorbell for every backend: the eventfd the manager hands out.
    crate::backend::conformance::doorbell_suite(|| crate::backend::EventFdDoorbell::new().unwrap());
}

#[test]
fn a_class_not_given_a_quota_gets_half_of_it() {
    let cfg = PoolConfig {
        classes: vec![(64, 41), (4096, 1)],
        quotas: vec![(64, 100)],
        ..PoolConfig::default()
    };
    let geo = cfg.geometry().unwrap();
    // Named: capped at the class's count; not named: half, rounded up.
    assert_eq!(geo.classes[0].quota, 41);
    assert_eq!(geo.classes[1].quota, 1);
    let cfg = PoolConfig {
        classes: vec![(64, 41)],
        ..PoolConfig::default()
    };
    assert_eq!(cfg.geometry().unwrap().classes[0].quota, 21);
    for bad in [(128, 5), (64, 0)] {
        let cfg = PoolConfig {
            classes: vec![(64, 41)],
            quotas: vec![bad],
            ..PoolConfig::default()
        };
        assert!(cfg.geometry().is_err(), "{bad:?}");
    }
}

#[test]
fn a_stack_at_its_quota_waits_and_everyone_else_still_allocates() {
    for b in BACKINGS {
        let (m, seg) = pool_with_quotas(b, vec![(64, 40)], vec![(64, 10)]);
        let a = StackPool::new(PoolView::new(seg.clone()), 1);
        let c = StackPool::new(PoolView::new(seg.clone()), 3);
        let mine: Vec<_> = (0..10).map(|_| a.alloc(10, true).unwrap()).collect();
        assert_eq!(a.alloc(10, true), Err(AllocError::Exhausted));
        let mut out = [RawBuf { class: 0, index: 0 }; 4];
        assert_eq!(a.alloc_many(10, &mut out), Err(AllocError::Exhausted));
        // The pool is not empty: another stack allocates.
        let theirs = c.alloc(10, true).unwrap();
        // One back, one more.
        a.free(mine[0]);
        let again = a.alloc(10, true).unwrap();
        assert_eq!(a.alloc(10, true), Err(AllocError::Exhausted));
        a.free(again);
        for &x in &mine[1..] {
            a.free(x);
        }
        c.free(theirs);
        assert_eq!(a.alloc_many(10, &mut out), Ok(4));
        a.free_many(&out);
        a.flush();
        c.flush();
        assert_eq!(total_free(&m), 40, "{b:?}");
    }
}

/// What a sender sent and its receiver did not consume counts against the
/// sender: a receiver that never reads stops the sender at its quota, not
/// the pool at its end. What the receiver frees or takes over is the
/// sender's again (credited), and taken over counts against the receiver.
#[test]
fn what_a_receiver_holds_counts_against_its_sender_until_freed() {
    for b in BACKINGS {
        let (m, seg) = pool_with_quotas(b, vec![(64, 40)], vec![(64, 10)]);
        let tx = StackPool::new(PoolView::new(seg.clone()), 1);
        let rx = StackPool::new(PoolView::new(seg.clone()), 2);
        let mut held = Vec::new();
        for _ in 0..10 {
            let x = tx.alloc(10, true).unwrap();
            let d = tx.view().prepare_send(1, x, 10, 2, 0, 0);
            held.push(rx.view().accept(2, 1, &d).unwrap());
        }
        assert_eq!(tx.alloc(10, true), Err(AllocError::Exhausted), "{b:?}");
        // The receiver is charged nothing for them: it allocates its own.
        let own = rx.alloc(10, true).unwrap();
        rx.free(own);
        // Taken over: the sender gets one back, the receiver pays for it.
        let kept = held.pop().unwrap();
        rx.reuse(kept);
        let x = tx.alloc(10, true).unwrap();
        assert_eq!(tx.alloc(10, true), Err(AllocError::Exhausted));
        tx.free(x);
        // Freed: every one back (a quota of 10 credits one at a time).
        for h in held {
            rx.free(h);
        }
        let all: Vec<_> = (0..10).map(|_| tx.alloc(10, true).unwrap()).collect();
        for x in all {
            tx.free(x);
        }
        rx.free(kept);
        tx.flush();
        rx.flush();
        assert_eq!(total_free(&m), 40, "{b:?}");
    }
}

/// The counters are an estimate a process that writes the segment can
/// forge (or a late credit skew): at the quota by the counters, a stack
/// counts from the headers and goes on if they say it may.
#[test]
fn forged_charge_counters_are_recounted_from_the_headers() {
    for b in BACKINGS {
        let (_m, seg) = pool_with_quotas(b, vec![(64, 40)], vec![(64, 10)]);
        let a = StackPool::new(PoolView::new(seg.clone()), 1);
        let slot = seg.stack_slot(1);
        slot.charged[0].store(1_000_000, Ordering::Relaxed);
        let x = a.alloc(10, true).unwrap();
        // Set to agree with the headers (none), then charged the new one.
        let used = slot.charged[0]
            .load(Ordering::Relaxed)
            .wrapping_sub(slot.credited[0].load(Ordering::Relaxed));
        assert_eq!(used, 1, "{b:?}");
        // A credit forged past the charge (or a late one, for the stack
        // that had the id before) is no room past the quota: the headers
        // are counted again, and still cap it.
        slot.credited[0].store(u32::MAX / 2, Ordering::Relaxed);
        std::thread::sleep(Duration::from_millis(10));
        let more: Vec<_> = (0..9).map(|_| a.alloc(10, true).unwrap()).collect();
        assert_eq!(a.alloc(10, true), Err(AllocError::Exhausted), "{b:?}");
        a.free(x);
        for y in more {
            a.free(y);
        }
    }
}

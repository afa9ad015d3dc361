//! Crash reclamation against what runs beside it: threads of one stack in
//! free-list operations while the manager rebuilds the lists, stacks that
//! die together inside such operations, and a live stack stopped inside
//! one while another dies, or while a dead sender's last sweep is due
//! (see "Crash reclamation" in docs/design.md).
//!
//! Real processes and the real segment's atomics: not built under
//! `--cfg loom`, whose atomics the segment's types then use (the loom
//! models are the library's `loom_` tests).
#![cfg(not(loom))]

mod common;

use common::*;
use std::mem::ManuallyDrop;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;
use xio_core::layout::PoolConfig;
use xio_core::manager::{Manager, ManagerHandle};
use xio_core::pool::{ManagerPool, PoolView, StackPool};
use xio_core::prelude::*;
use xio_core::segment::{Region, Segment};

/// Entry point of child processes (a no-op when run as a normal test).
#[test]
fn child_main() {
    let Some((role, a)) = child_role() else {
        return;
    };
    match role.as_str() {
        "two_stacks_churn" => two_stacks_churn(&a[0]),
        "big_churn" => big_churn(&a[0]),
        "holder" => holder(&a[0]),
        "dies_mid_burst" => dies_mid_burst(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap()),
        r => panic!("unknown role {r}"),
    }
}

/// Two stacks in one process, a thread each, allocating and freeing as
/// fast as they can in the small class (a list operation per batch) and
/// the 1 MiB one (a list operation every time: that class is not cached).
fn two_stacks_churn(prefix: &str) {
    let stacks = [
        Stack::attach(prefix).unwrap(),
        Stack::attach(prefix).unwrap(),
    ];
    let threads: Vec<_> = stacks
        .into_iter()
        .map(|s| {
            std::thread::spawn(move || loop {
                let small: Vec<_> = (0..100).map(|_| s.alloc(64).unwrap()).collect();
                let big = s.alloc(1 << 20).unwrap();
                drop(small);
                drop(big);
            })
        })
        .collect();
    println!("XIO:ready");
    for t in threads {
        t.join().unwrap();
    }
}

/// One stack allocating and freeing a 1 MiB buffer, over and over: a
/// free-list operation every time.
fn big_churn(prefix: &str) {
    let s = Stack::attach(prefix).unwrap();
    println!("XIO:ready {}", s.id().slot());
    loop {
        drop(s.alloc(1 << 20).unwrap());
    }
}

/// Holds ten buffers until killed.
fn holder(prefix: &str) {
    let s = Stack::attach(prefix).unwrap();
    let _held: Vec<_> = (0..10).map(|_| s.alloc(64).unwrap()).collect();
    println!("XIO:ready {}", s.id().slot());
    loop {
        std::thread::park();
    }
}

/// An embedded manager that is not stopped if the test fails: stopping
/// joins its thread, and a manager stuck in a reclamation (the bug these
/// tests look for) would turn the failure into a hang. Passed to
/// [`stop`] at the end of a test that passed.
fn manager(prefix: &str) -> ManuallyDrop<ManagerHandle> {
    ManuallyDrop::new(Manager::builder(prefix).spawn().unwrap())
}

/// Stops a manager from [`manager`].
fn stop(mgr: ManuallyDrop<ManagerHandle>) {
    drop(ManuallyDrop::into_inner(mgr));
}

/// Attaches a stack, the watchdog being the only limit: a manager that
/// stopped serving fails the test with `what`.
fn attach_or_fail(prefix: &str, what: &str) -> Stack {
    Stack::builder(prefix)
        .control_timeout(WATCHDOG)
        .attach()
        .unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// Two threads of one stack allocate and free a class every operation of
/// which is a free-list one (fewer buffers than 2 x max_stacks: not
/// cached, as the default pool's 1 MiB class), while the manager reclaims
/// over and over for another, dead stack. `free` spills outside the cache
/// lock, so the two are inside list operations at once; the manager must
/// wait for both, or it rebuilds the lists under one and hands a buffer
/// out twice. Bounded by the number of reclamations, not by time.
#[test]
fn threads_of_one_stack_in_list_ops_while_the_manager_reclaims() {
    const N: usize = 6;
    const RECLAIMS: u64 = 20_000;
    let cfg = PoolConfig {
        classes: vec![(64, 64), (4096, N as u32)],
        max_stacks: 4,
        max_channels: 1,
        ring_capacity: 8,
        quotas: Vec::new(),
    };
    let geo = cfg.geometry().unwrap();
    let region = Region::heap(geo.total_len as usize).unwrap();
    let seg = Segment::init(region, &cfg, &geo).unwrap();
    let m = ManagerPool::init(seg.clone());
    let pool = StackPool::new(PoolView::new(seg), 1);
    let out: Vec<AtomicBool> = (0..N).map(|_| AtomicBool::new(false)).collect();
    let (stop, twice, allocs) = (AtomicBool::new(false), AtomicU64::new(0), AtomicU64::new(0));
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while !stop.load(Ordering::Relaxed) {
                    // Not waiting: a closed gate reads as exhausted.
                    let Ok(b) = pool.alloc(4000, false) else {
                        continue;
                    };
                    assert_eq!(b.class, 1);
                    allocs.fetch_add(1, Ordering::Relaxed);
                    if out[b.index as usize].swap(true, Ordering::SeqCst) {
                        twice.fetch_add(1, Ordering::SeqCst);
                    }
                    out[b.index as usize].store(false, Ordering::SeqCst);
                    pool.free(b);
                }
            });
        }
        for _ in 0..RECLAIMS {
            if twice.load(Ordering::SeqCst) > 0 {
                break;
            }
            m.reclaim(&[2], &[1], &[], WATCHDOG, |_| false)
                .expect("watchdog: stack 1 never left its list operations");
            std::thread::sleep(Duration::from_micros(50));
        }
        stop.store(true, Ordering::SeqCst);
    });
    pool.flush();
    let usage = m.usage();
    eprintln!(
        "allocations {}, buffers handed out twice {}; usage {usage:?}",
        allocs.load(Ordering::SeqCst),
        twice.load(Ordering::SeqCst)
    );
    assert_eq!(
        twice.load(Ordering::SeqCst),
        0,
        "a buffer was handed out twice at once"
    );
    assert!(usage.iter().all(|u| u.free == u.total), "{usage:?}");
}

/// Two stacks whose processes died inside free-list operations, their
/// intents left set (simulated, as `reclaim`'s unit test does): when the
/// manager handles the first death the second stack is still registered,
/// its end of file unread. It must not wait on that one's intent: it
/// used to, for ever, and served nobody again.
#[test]
fn manager_serves_on_when_two_stacks_die_inside_list_ops() {
    setup();
    let p = prefix("two-intents");
    let mgr = manager(&p);
    let a = Stack::attach(&p).unwrap();
    let b = Stack::attach(&p).unwrap();
    let seg = a.__segment().clone();
    for s in [&a, &b] {
        seg.stack_slot(s.id().slot())
            .intent
            .fetch_add(1, Ordering::SeqCst);
    }
    drop(a);
    drop(b);
    let c = attach_or_fail(&p, "the manager stopped serving after two deaths");
    drop(c.alloc(1 << 20).expect("the lists are open"));
    drop(c);
    wait_pool_whole(&mgr);
    wait_until("all three deaths counted", || mgr.snapshot().deaths == 3);
    stop(mgr);
}

/// Two stacks of one process killed -9 while allocating, over and over:
/// one may die inside a free-list operation while the manager handles
/// the other's death (before the fix, a run hung in round 11 or 15).
#[test]
fn manager_survives_two_simultaneous_deaths_mid_alloc() {
    setup();
    let p = prefix("two-deaths");
    let mgr = manager(&p);
    for round in 0..30 {
        let mut c = ChildProc::spawn("child_main", "two_stacks_churn", std::slice::from_ref(&p));
        c.expect("ready");
        std::thread::sleep(Duration::from_millis(20));
        c.kill9();
        drop(attach_or_fail(
            &p,
            &format!("round {round}: the manager stopped serving"),
        ));
    }
    wait_pool_whole(&mgr);
    stop(mgr);
}

/// A live stack stopped (SIGSTOP) inside a free-list operation while
/// another dies: the manager cannot rebuild the lists under it, and must
/// not wait for it either. It goes on serving with the lists open, puts
/// the dead stack's buffers off (`unswept`), and takes them back once the
/// stopped stack runs again.
#[test]
fn a_stack_stopped_inside_a_list_op_delays_reclamation_not_the_manager() {
    setup();
    let p = prefix("stopped-mid-op");
    let mgr = manager(&p);
    let me = attach_or_fail(&p, "first attach");
    let seg = me.__segment().clone();
    let mut holder = ChildProc::spawn("child_main", "holder", std::slice::from_ref(&p));
    holder.expect("ready");
    let mut churn = ChildProc::spawn("child_main", "big_churn", std::slice::from_ref(&p));
    let id: u16 = churn.expect("ready").parse().unwrap();
    let intent = &seg.stack_slot(id).intent;
    // Stop it until it is caught inside an operation.
    stop_inside_list_op(&churn, intent);
    holder.kill9();
    wait_until("the holder's death put off", || mgr.snapshot().unswept == 1);
    // Meanwhile the manager serves, with the lists open.
    let other = attach_or_fail(&p, "the manager stopped serving");
    drop(other.alloc(1 << 20).expect("the lists are open"));
    assert_eq!(mgr.snapshot().deaths, 0, "{:?}", mgr.snapshot());
    churn.signal(rustix::process::Signal::CONT);
    wait_until("the holder's buffers back", || {
        let s = mgr.snapshot();
        s.unswept == 0 && s.deaths == 1 && s.reclaimed >= 10
    });
    churn.kill9();
    drop((me, other));
    wait_pool_whole(&mgr);
    stop(mgr);
}

/// The last sweep of a dead sender, due once its receiver has drained and
/// released their channel, is the one that takes back what the sender
/// stamped for the receiver but never pushed (the readers rule). Put off
/// because a live stack is stopped inside a free-list operation, it must
/// stay owed, the dead stack's slot taken, and run with the receiver no
/// longer a reader once the stopped stack runs again.
#[test]
fn a_put_off_last_sweep_still_reclaims_what_a_dead_sender_stamped() {
    use xio_core::layout::slot_state;
    const AT: usize = 20;
    setup();
    let p = prefix("late-last-sweep");
    let mgr = manager(&p);
    let a = SocketAddr::from(([10, 0, 0, 1], 98));
    let mut rx = attach_or_fail(&p, "first attach");
    rx.bind(a).unwrap();
    let me = rx.id().slot();
    let seg = rx.__segment().clone();
    let in_flight_to_us = || in_flight_to(&seg, me);
    let mut churn = ChildProc::spawn("child_main", "big_churn", std::slice::from_ref(&p));
    let churner: u16 = churn.expect("ready").parse().unwrap();
    let mut tx = ChildProc::spawn(
        "child_main",
        "dies_mid_burst",
        &[p.clone(), a.to_string(), AT.to_string()],
    );
    // The first sweep, with the churner running: we may still read the
    // ring from the dead sender, so it leaves all it stamped for us.
    wait_until("the sender's death swept", || {
        let s = mgr.snapshot();
        s.deaths == 1 && s.unswept == 0
    });
    let _ = tx.child.wait();
    assert_eq!(in_flight_to_us(), BURST + AT);
    // Stop the churner inside a list operation.
    stop_inside_list_op(&churn, &seg.stack_slot(churner).intent);
    // Drain the ring (the first burst, intact), then the reset: we
    // release the channel, and the last sweep is owed.
    let mut got = 0u64;
    let dead = loop {
        match rx.recv_timeout(WATCHDOG) {
            Ok(m) => {
                assert!(verify(&m.buf, got), "message {got} corrupted");
                got += 1;
            }
            Err(Error::Reset(peer)) => break peer.slot(),
            Err(e) => panic!("{e}"),
        }
    };
    assert_eq!(got, BURST as u64);
    assert_eq!(rx.corrupt_descriptors(), 0);
    let slot = &seg.stack_slot(dead).state;
    wait_until("the last sweep put off", || mgr.snapshot().unswept == 1);
    assert_ne!(slot.load(Ordering::Acquire), slot_state::FREE);
    assert_eq!(in_flight_to_us(), AT, "nothing reclaimed while put off");
    // Retried once the churner runs again: the obligation was kept, and
    // we are no longer a reader of the dead sender.
    churn.signal(rustix::process::Signal::CONT);
    wait_until("the last sweep done", || {
        mgr.snapshot().unswept == 0 && slot.load(Ordering::Acquire) == slot_state::FREE
    });
    assert_eq!(
        in_flight_to_us(),
        0,
        "what the dead sender stamped for us was not reclaimed"
    );
    churn.kill9();
    drop(rx);
    wait_pool_whole(&mgr);
    stop(mgr);
}

/// Stops `child` (SIGSTOP) at a moment its `intent` says it is inside a
/// free-list operation (it is let go and stopped again until then).
fn stop_inside_list_op(child: &ChildProc, intent: &std::sync::atomic::AtomicU64) {
    let mut tries = 0;
    loop {
        child.signal(rustix::process::Signal::STOP);
        if intent.load(Ordering::SeqCst) != 0 {
            return;
        }
        child.signal(rustix::process::Signal::CONT);
        tries += 1;
        assert!(tries < 100_000, "never caught the child in a list op");
        std::thread::sleep(Duration::from_micros(200));
    }
}

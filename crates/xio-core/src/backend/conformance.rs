//! One conformance suite per backend concept, generic over the
//! implementation: what every [`BufferPool`], every descriptor ring
//! ([`DescProducer`] / [`DescConsumer`] / [`RingWatch`](super::RingWatch)) and every
//! [`Doorbell`] must do, whatever backs it. Each backend instantiates the
//! suites with its own constructors: the shm backend on a heap region and
//! on a sealed memfd (`backend/shm/tests.rs`), DPDK in a primary process
//! of its own (`tests/dpdk.rs`, run by `scripts/test-dpdk.sh`).
//!
//! The suites check the contract the stack relies on, not an
//! implementation's internals (free lists, magazines, reclamation): those
//! keep their own tests beside their code. A constructor is called once
//! per check, so each starts from a fresh pool or ring.

use std::sync::mpsc;
use std::time::Duration;

use super::{AllocError, BufferPool, DescConsumer, DescProducer, Doorbell, RawBuf, Reject};
use crate::layout::{kind, Descriptor};

/// Two stacks of one fresh pool, and whatever keeps the pool alive (a
/// manager's side of it, a segment, mempools).
pub struct PoolPair<P> {
    /// The first stack.
    pub a: P,
    /// The second stack, with another id.
    pub b: P,
    /// Dropped after the stacks.
    pub keep: Box<dyn std::any::Any>,
}

/// The classes every pool constructor is asked for: `(buffer size,
/// buffers)`, smallest first.
pub const CLASSES: [(u32, u32); 2] = [(256, 64), (4096, 16)];

/// Runs the pool suite: `make` returns two stacks of a fresh pool with
/// the buffer classes [`CLASSES`].
pub fn pool_suite<P: BufferPool>(mut make: impl FnMut() -> PoolPair<P>) {
    identity(make());
    sizes_and_exhaustion(make());
    handoff(make());
    forged_descriptors(make());
    replays_and_stale_descriptors(make());
    reuse_gives_a_new_generation(make());
    concurrent_handoff(make());
}

/// The bytes of a buffer the caller owns.
#[allow(clippy::mut_from_ref)]
fn bytes<P: BufferPool>(p: &P, b: RawBuf) -> &mut [u8] {
    let (ptr, cap) = p.data(b);
    // SAFETY: the caller owns `b` (allocated or accepted, not yet sent or
    // freed), the pool maps `cap` bytes at `ptr` for as long as the pool
    // lives, and each check uses one slice of a buffer at a time.
    unsafe { std::slice::from_raw_parts_mut(ptr, cap) }
}

fn identity<P: BufferPool>(p: PoolPair<P>) {
    assert_ne!(p.a.stack_id(), p.b.stack_id(), "two stacks, two ids");
    assert_eq!(p.a.pool_id(), p.b.pool_id(), "one pool, one identity");
}

/// Every buffer of a class is handed out once, holds what it was asked
/// for, and comes back when freed; a request no class holds is refused.
fn sizes_and_exhaustion<P: BufferPool>(p: PoolPair<P>) {
    let (size, count) = CLASSES[0];
    let held: Vec<RawBuf> = (0..count)
        .map(|i| {
            let b = p.a.alloc(1 + i as usize % size as usize, true).unwrap();
            assert_eq!(b.class, 0, "the smallest class that holds it");
            let (_, cap) = p.a.data(b);
            assert!(cap >= size as usize);
            b
        })
        .collect();
    let mut seen = std::collections::HashSet::new();
    assert!(
        held.iter().all(|b| seen.insert(*b)),
        "a buffer handed out twice"
    );
    let mut ptrs: Vec<usize> = held.iter().map(|&b| p.a.data(b).0 as usize).collect();
    ptrs.sort_unstable();
    assert!(
        ptrs.windows(2).all(|w| w[1] - w[0] >= size as usize),
        "buffers overlap"
    );
    // The class is empty for everyone; a larger class is not used for it.
    assert_eq!(p.a.alloc(size as usize, true), Err(AllocError::Exhausted));
    assert_eq!(p.b.alloc(1, true), Err(AllocError::Exhausted));
    let big = p.b.alloc(size as usize + 1, true).unwrap();
    assert_eq!(big.class, 1);
    let max = CLASSES[CLASSES.len() - 1].0 as usize;
    assert_eq!(p.a.alloc(max + 1, true), Err(AllocError::TooLarge(max + 1)));
    for b in held {
        p.a.free(b);
    }
    p.b.free(big);
    // Nothing leaked: the whole class again.
    let again: Vec<RawBuf> = (0..count).map(|_| p.a.alloc(1, true).unwrap()).collect();
    for b in again {
        p.a.free(b);
    }
}

/// A buffer sent by one stack is accepted by its addressee as itself,
/// with the bytes the sender wrote and the descriptor's fields intact.
fn handoff<P: BufferPool>(p: PoolPair<P>) {
    for (class, &(size, _)) in CLASSES.iter().enumerate() {
        let b = p.a.alloc(size as usize, true).unwrap();
        assert_eq!(b.class as usize, class);
        let payload = &mut bytes(&p.a, b)[..size as usize];
        payload
            .iter_mut()
            .enumerate()
            .for_each(|(i, x)| *x = i as u8 ^ 0x5a);
        let d = p.a.prepare_send(b, size, p.b.stack_id(), 77, kind::DATA);
        assert_eq!(
            (d.class, d.index, d.len, d.conn),
            (b.class, b.index, size, 77)
        );
        assert_eq!(d.kind, kind::DATA);
        let got = p.b.accept(p.a.stack_id(), &d).unwrap();
        assert_eq!(got, b);
        let seen = &bytes(&p.b, got)[..size as usize];
        assert!(seen.iter().enumerate().all(|(i, &x)| x == i as u8 ^ 0x5a));
        p.b.free(got);
    }
}

/// Descriptors naming what does not exist are refused with the reason,
/// and take nothing.
fn forged_descriptors<P: BufferPool>(p: PoolPair<P>) {
    let (size, count) = CLASSES[0];
    let b = p.a.alloc(8, true).unwrap();
    let d = p.a.prepare_send(b, 8, p.b.stack_id(), 1, kind::DATA);
    let from = p.a.stack_id();
    let bad_class = Descriptor {
        class: CLASSES.len() as u8,
        ..d
    };
    assert_eq!(
        p.b.accept(from, &bad_class),
        Err(Reject::Class(CLASSES.len() as u8))
    );
    let bad_index = Descriptor {
        index: count + 1000,
        ..d
    };
    assert_eq!(
        p.b.accept(from, &bad_index),
        Err(Reject::Index(count + 1000))
    );
    let bad_len = Descriptor { len: size + 1, ..d };
    assert_eq!(p.b.accept(from, &bad_len), Err(Reject::Length(size + 1)));
    // Addressed to b: a is not its owner.
    assert!(matches!(p.a.accept(from, &d), Err(Reject::Ownership(_))));
    // None of the refusals took it: b still can.
    let got = p.b.accept(from, &d).unwrap();
    p.b.free(got);
}

/// A descriptor is good for one trip: replayed after it was accepted,
/// or after its buffer was freed and handed out again, it is refused.
fn replays_and_stale_descriptors<P: BufferPool>(p: PoolPair<P>) {
    let from = p.a.stack_id();
    let b = p.a.alloc(8, true).unwrap();
    let d = p.a.prepare_send(b, 8, p.b.stack_id(), 1, kind::DATA);
    let got = p.b.accept(from, &d).unwrap();
    assert!(matches!(p.b.accept(from, &d), Err(Reject::Ownership(_))));
    p.b.free(got);
    assert!(matches!(p.b.accept(from, &d), Err(Reject::Ownership(_))));
    // The same buffer's next trip: the old descriptor does not match it.
    let mut next = Vec::new();
    let again = loop {
        match p.a.alloc(8, true) {
            Ok(c) if c == b => break Some(c),
            Ok(c) => next.push(c),
            // The buffer stayed in b's private cache.
            Err(AllocError::Exhausted) => break None,
            Err(e) => panic!("{e}"),
        }
    };
    if let Some(c) = again {
        let d2 = p.a.prepare_send(c, 8, p.b.stack_id(), 2, kind::DATA);
        assert!(matches!(p.b.accept(from, &d), Err(Reject::Ownership(_))));
        let got = p.b.accept(from, &d2).unwrap();
        p.b.free(got);
    }
    for c in next {
        p.a.free(c);
    }
}

/// A received buffer made writable again travels on as a new trip: the
/// descriptor it came with no longer matches it.
fn reuse_gives_a_new_generation<P: BufferPool>(p: PoolPair<P>) {
    let (a_id, b_id) = (p.a.stack_id(), p.b.stack_id());
    let b = p.a.alloc(16, true).unwrap();
    let d = p.a.prepare_send(b, 16, b_id, 1, kind::DATA);
    let got = p.b.accept(a_id, &d).unwrap();
    p.b.reuse(got);
    bytes(&p.b, got)[..5].copy_from_slice(b"reply");
    let back = p.b.prepare_send(got, 5, a_id, 2, kind::DATA);
    assert_ne!(
        back.gen, d.gen,
        "a reused buffer's trip has a new generation"
    );
    let mine = p.a.accept(b_id, &back).unwrap();
    assert_eq!(&bytes(&p.a, mine)[..5], b"reply");
    assert!(matches!(p.b.accept(a_id, &d), Err(Reject::Ownership(_))));
    p.a.free(mine);
}

/// Two threads, one stack each, hand buffers across while both allocate
/// and free: every buffer arrives with its sender's bytes, none is handed
/// out twice.
fn concurrent_handoff<P: BufferPool>(p: PoolPair<P>) {
    const N: u32 = 20_000;
    let (tx, rx) = mpsc::sync_channel::<Descriptor>(CLASSES[0].1 as usize / 2);
    std::thread::scope(|s| {
        s.spawn(|| {
            for i in 0..N {
                let b = loop {
                    match p.a.alloc(8, true) {
                        Ok(b) => break b,
                        Err(AllocError::Exhausted) => std::thread::yield_now(),
                        Err(e) => panic!("{e}"),
                    }
                };
                bytes(&p.a, b)[..4].copy_from_slice(&i.to_le_bytes());
                let d = p.a.prepare_send(b, 4, p.b.stack_id(), i, kind::DATA);
                tx.send(d).unwrap();
            }
        });
        for i in 0..N {
            let d = rx.recv().unwrap();
            assert_eq!(d.conn, i);
            let b = p.b.accept(p.a.stack_id(), &d).unwrap();
            assert_eq!(bytes(&p.b, b)[..4], i.to_le_bytes());
            // b's own traffic on the side: its cache and a's share the lists.
            if i % 7 == 0 {
                if let Ok(own) = p.b.alloc(8, true) {
                    p.b.free(own);
                }
            }
            p.b.free(b);
        }
    });
}

/// Runs the ring suite: `make` returns the two ends of a fresh, empty
/// ring of a few slots (at least 4 descriptors).
pub fn ring_suite<T: DescProducer, C: DescConsumer>(mut make: impl FnMut() -> (T, C)) {
    empty(make());
    one_descriptor_whole(make());
    full_and_room(make());
    bursts_in_order_across_wraps(make());
    two_threads_in_order(make());
}

/// Descriptor number `i`, every field derived from it.
fn desc(i: u32) -> Descriptor {
    Descriptor {
        index: i,
        len: i.wrapping_mul(3),
        conn: !i,
        class: i as u8,
        kind: (i >> 8) as u8,
        gen: (i >> 3) as u16,
    }
}

fn empty<T: DescProducer, C: DescConsumer>((_tx, mut rx): (T, C)) {
    assert!(!rx.has_data());
    assert!(!rx.watch().has_data());
    let mut out = [Descriptor::default(); 4];
    assert_eq!(rx.pop_burst(&mut out).unwrap(), 0);
}

fn one_descriptor_whole<T: DescProducer, C: DescConsumer>((mut tx, mut rx): (T, C)) {
    let watch = rx.watch();
    let d = desc(0xdead_beef);
    assert!(tx.push_one(d.to_words()).unwrap());
    assert!(rx.has_data());
    assert!(watch.has_data(), "a watch sees what the consumer would");
    let mut out = [Descriptor::default(); 4];
    assert_eq!(rx.pop_burst(&mut out).unwrap(), 1);
    assert_eq!(out[0], d, "every field arrives");
    assert!(!rx.has_data());
    assert!(!watch.has_data());
}

/// A full ring takes nothing and says so (`room` 0, `push_one` false, a
/// burst of 0); one pop makes room again; nothing is lost or reordered.
fn full_and_room<T: DescProducer, C: DescConsumer>((mut tx, mut rx): (T, C)) {
    let mut n = 0u32;
    while tx.push_one(desc(n).to_words()).unwrap() {
        n += 1;
        assert!(n <= 1 << 20, "a ring that never fills");
    }
    assert!(n >= 4, "a ring of at least 4 descriptors");
    assert_eq!(tx.room(1).unwrap(), 0);
    assert_eq!(tx.push_burst(&[desc(n)]).unwrap(), 0);
    let mut out = [Descriptor::default(); 1];
    assert_eq!(rx.pop_burst(&mut out).unwrap(), 1);
    assert_eq!(out[0], desc(0));
    assert!(tx.room(1).unwrap() >= 1);
    assert!(tx.push_one(desc(n).to_words()).unwrap());
    let mut all = vec![Descriptor::default(); n as usize + 8];
    let mut got = 0;
    while got < n as usize {
        let k = rx.pop_burst(&mut all[got..]).unwrap();
        assert!(k > 0, "descriptors pushed but not popped");
        got += k;
    }
    assert_eq!(got, n as usize);
    assert!(all[..got].iter().zip(1..).all(|(d, i)| *d == desc(i)));
}

/// Bursts of every small size, pushed and popped in uneven steps many
/// times round the ring: every descriptor once, in order. `room` is a
/// promise: a burst of that many is taken whole.
fn bursts_in_order_across_wraps<T: DescProducer, C: DescConsumer>((mut tx, mut rx): (T, C)) {
    let (mut next_in, mut next_out) = (0u32, 0u32);
    let mut out = [Descriptor::default(); 5];
    for round in 0..2_000u32 {
        let want = 1 + round % 7;
        let room = tx.room(want).unwrap();
        let k = want.min(room);
        let burst: Vec<Descriptor> = (next_in..next_in + k).map(desc).collect();
        assert_eq!(
            tx.push_burst(&burst).unwrap(),
            k as usize,
            "room promised {room}"
        );
        next_in += k;
        let take = 1 + round as usize % out.len();
        let got = rx.pop_burst(&mut out[..take]).unwrap();
        for d in &out[..got] {
            assert_eq!(*d, desc(next_out));
            next_out += 1;
        }
    }
    while next_out < next_in {
        let got = rx.pop_burst(&mut out).unwrap();
        assert!(got > 0);
        for d in &out[..got] {
            assert_eq!(*d, desc(next_out));
            next_out += 1;
        }
    }
    assert!(next_in > 1_000, "the ring took too little to wrap");
}

/// A producer and a consumer thread: every descriptor once, in order.
fn two_threads_in_order<T: DescProducer, C: DescConsumer>((mut tx, mut rx): (T, C)) {
    const N: u32 = 50_000;
    std::thread::scope(|s| {
        s.spawn(move || {
            let mut i = 0;
            while i < N {
                let burst: Vec<Descriptor> = (i..(i + 1 + i % 5).min(N)).map(desc).collect();
                match tx.push_burst(&burst).unwrap() {
                    0 => std::thread::yield_now(),
                    k => i += k as u32,
                }
            }
        });
        let mut out = [Descriptor::default(); 8];
        let mut next = 0;
        while next < N {
            match rx.pop_burst(&mut out).unwrap() {
                0 => std::thread::yield_now(),
                k => {
                    for d in &out[..k] {
                        assert_eq!(*d, desc(next));
                        next += 1;
                    }
                }
            }
        }
    });
}

/// Runs the doorbell suite on doorbells `make` returns, fresh and unrung.
pub fn doorbell_suite<D: Doorbell + 'static>(mut make: impl FnMut() -> D) {
    // Not rung: a wait ends at its timeout, and says it was not rung.
    let bell = make();
    assert!(!bell.wait(Some(Duration::from_millis(1)), None).unwrap());
    // Rung: the fd is readable, and a wait returns at once and consumes it.
    bell.ring().unwrap();
    bell.ring().unwrap();
    assert!(readable(bell.fd()));
    assert!(bell.wait(None, None).unwrap());
    assert!(
        !readable(bell.fd()),
        "one wait consumes every ring before it"
    );
    assert!(!bell.wait(Some(Duration::ZERO), None).unwrap());
    // Another fd readable ends the wait without a ring.
    let other = make();
    other.ring().unwrap();
    assert!(!bell.wait(None, Some(other.fd())).unwrap());
    // A ring from another thread wakes a waiter with no timeout.
    let bell = std::sync::Arc::new(make());
    let waiter = {
        let bell = bell.clone();
        std::thread::spawn(move || bell.wait(None, None).unwrap())
    };
    bell.ring().unwrap();
    assert!(waiter.join().unwrap());
}

fn readable(fd: std::os::fd::BorrowedFd<'_>) -> bool {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    rustix::event::poll(&mut fds, Some(&rustix::time::Timespec::default())).unwrap() == 1
}

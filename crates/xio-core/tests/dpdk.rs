//! The DPDK backend across real processes: a primary creates the
//! mempools and rings of a prefix, secondaries find them by name and
//! exchange buffers through `DpdkPool` and the ring ends (the same traits
//! the stack uses); a secondary killed with -9 has its buffers reclaimed;
//! two prefixes on one machine stay apart. Needs hugepages (.ci/run
//! reserves them) and the `dpdk` feature:
//! `cargo test -p xio-core --features dpdk --test dpdk`.
#![cfg(feature = "dpdk")]

mod common;

use std::io::BufRead;

use common::*;
use xio_core::backend::{BufferPool, DescConsumer, DescProducer};
use xio_core::dpdk::{DpdkConsumer, DpdkPool, DpdkProducer, Eal, Mempool, Ring, Role};
use xio_core::layout::{kind, Descriptor};
use xio_core::pool::RawBuf;

const CLASSES: [(&str, usize, u32); 2] = [("xio-c0", 2048, 512), ("xio-c1", 65536, 64)];
const PRIMARY: u16 = 1;
const SECONDARY: u16 = 2;

fn pools(create: bool, me: u16) -> DpdkPool {
    let classes = CLASSES
        .iter()
        .enumerate()
        .map(|(c, &(name, size, n))| {
            if create {
                Mempool::create(name, c as u8, n, size).unwrap()
            } else {
                Mempool::lookup(name, size).unwrap()
            }
        })
        .collect();
    DpdkPool::new(classes, me)
}

/// Ring ends: (to the other side, from the other side).
fn rings(create: bool, primary: bool) -> (DpdkProducer, DpdkConsumer) {
    let get = |n: &str| {
        if create {
            Ring::create(n, 1024).unwrap()
        } else {
            Ring::lookup(n).unwrap()
        }
    };
    let (a2b, b2a) = (get("xio-a2b"), get("xio-b2a"));
    if primary {
        (DpdkProducer::new(a2b), DpdkConsumer::new(b2a))
    } else {
        (DpdkProducer::new(b2a), DpdkConsumer::new(a2b))
    }
}

/// The payload of a buffer this process owns (the pool hands out raw
/// pointers, as it does to `BufMut`).
#[allow(clippy::mut_from_ref)]
fn payload(pool: &DpdkPool, b: RawBuf, len: usize) -> &mut [u8] {
    let (p, cap) = pool.data(b);
    assert!(len <= cap);
    // SAFETY: we own the buffer (allocated or accepted by us, not yet sent
    // or freed), `len` fits it, and each call site uses one slice at a time.
    unsafe { std::slice::from_raw_parts_mut(p, len) }
}

fn send(pool: &DpdkPool, tx: &mut DpdkProducer, b: RawBuf, len: usize, to: u16, tag: u32) {
    let d = pool.prepare_send(b, len as u32, to, tag, kind::DATA);
    while tx.push_burst(&[d]).unwrap() == 0 {
        std::thread::yield_now();
    }
}

fn recv(rx: &mut DpdkConsumer) -> Descriptor {
    let mut d = [Descriptor::default()];
    loop {
        if rx.pop_burst(&mut d).unwrap() == 1 {
            return d[0];
        }
        std::thread::yield_now();
    }
}

fn msg_len(i: u64) -> usize {
    size_of_msg(i).min(65536)
}

/// This binary's `child_main` in role `role`, on prefix `p`.
fn child(role: &str, p: &str) -> ChildProc {
    ChildProc::spawn("child_main", role, &[p.to_owned()])
}

/// A manager of prefix `p` in a child process, once it says it is ready.
fn manager_ready(p: &str) -> ChildProc {
    let mut m = child("manager", p);
    m.expect("ready");
    m
}

#[test]
fn child_main() {
    let Some((role, a)) = child_role() else {
        return;
    };
    match role.as_str() {
        "primary" => primary(&a[0]),
        "echo" => echo(&a[0], a[1].parse().unwrap()),
        "hoard" => hoard(&a[0]),
        "iso_primary" => iso_primary(&a[0], a[1].parse().unwrap()),
        "iso_secondary" => iso_secondary(&a[0]),
        "in_cgroup_primary" => in_cgroup_primary(&a[0], &a[1]),
        "try_primary" => try_primary(&a[0]),
        "replay" => replay(&a[0]),
        "dropped_stack" => dropped_stack(&a[0]),
        "failed_manager" => failed_manager(&a[0]),
        "unrun_manager" => unrun_manager(&a[0]),
        "scribbled_index" => scribbled_index(&a[0]),
        "huge_class" => huge_class(&a[0]),
        "idle_secondary" => idle_secondary(&a[0]),
        "manager" => manager(&a[0]),
        "half_get" => half_get(&a[0]),
        "parked_get" => parked_get(&a[0]),
        "loose_half_get" => loose_half_get(&a[0]),
        "late_get" => late_get(&a[0]),
        "scribbler" => scribbler(&a[0]),
        "ring_scribbler" => ring_scribbler(&a[0]),
        "link_scribbler" => link_scribbler(&a[0]),
        "ring_mask" => ring_mask(&a[0]),
        "take_all" => take_all(&a[0]),
        "bogus_putter" => bogus_putter(&a[0]),
        "double_putter" => double_putter(&a[0]),
        "churn" => churn(&a[0]),
        "scribbled_in_use" => scribbled_in_use(&a[0]),
        "pool_ids" => pool_ids(&a[0]),
        "oversized_lookup" => oversized_lookup(&a[0]),
        "small_class_empty" => small_class_empty(&a[0]),
        "unstamped_stack" => unstamped_stack(&a[0]),
        "conformance" => conformance(&a[0]),
        r => panic!("unknown role {r}"),
    }
}

/// Creates the objects, then does what its stdin says.
fn primary(prefix: &str) {
    Eal::init(prefix, Role::Primary).unwrap();
    let pool = pools(true, PRIMARY);
    let (mut tx, mut rx) = rings(true, true);
    println!("XIO:ready");
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let w: Vec<&str> = line.split_whitespace().collect();
        match w.as_slice() {
            ["pingpong", n] => {
                let n: u64 = n.parse().unwrap();
                for i in 0..n {
                    let len = msg_len(i);
                    let b = pool.alloc(len, false).unwrap();
                    fill(payload(&pool, b, len), i);
                    send(&pool, &mut tx, b, len, SECONDARY, i as u32);
                    let d = recv(&mut rx);
                    let b = pool.accept(0, &d).unwrap();
                    assert_eq!(d.conn, i as u32);
                    assert!(verify(payload(&pool, b, d.len as usize), i + 1_000_000));
                    pool.free(b);
                }
                println!("XIO:pingpong ok");
            }
            ["send", n] => {
                for i in 0..n.parse::<u32>().unwrap() {
                    let b = pool.alloc(64, false).unwrap();
                    send(&pool, &mut tx, b, 64, SECONDARY, i);
                }
                println!("XIO:sent");
            }
            ["reclaim", id] => {
                // The dead stack's inbound ring holds stale descriptors:
                // drop them (their buffers are found by owner below).
                let mut junk = [Descriptor::default(); 64];
                let mut consumer_of_a2b = DpdkConsumer::new(Ring::lookup("xio-a2b").unwrap());
                while consumer_of_a2b.pop_burst(&mut junk).unwrap() > 0 {}
                let r = pool
                    .reclaim(&[id.parse().unwrap()], &[], &[], Default::default(), |_| {
                        true
                    })
                    .unwrap();
                println!("XIO:reclaimed {}", r.owned);
            }
            ["avail"] => {
                let c = pool.classes();
                println!(
                    "XIO:avail {} {} {} {}",
                    c[0].avail(),
                    c[0].len(),
                    c[1].avail(),
                    c[1].len()
                );
            }
            _ => panic!("unknown command {line}"),
        }
    }
}

/// A secondary that checks each buffer, rewrites it in place and sends it
/// back (the buffer made writable again, as `Buf::into_mut` does).
fn echo(prefix: &str, n: u64) {
    Eal::init(prefix, Role::Secondary).unwrap();
    let pool = pools(false, SECONDARY);
    let (mut tx, mut rx) = rings(false, false);
    println!("XIO:ready");
    for i in 0..n {
        let d = recv(&mut rx);
        let b = pool.accept(0, &d).unwrap();
        let len = d.len as usize;
        assert_eq!(len, msg_len(i));
        assert!(verify(payload(&pool, b, len), i));
        // A replayed descriptor is refused: the buffer is ours now.
        assert!(pool.accept(0, &d).is_err());
        pool.reuse(b);
        fill(payload(&pool, b, len), i + 1_000_000);
        send(&pool, &mut tx, b, len, PRIMARY, d.conn);
    }
    println!("XIO:echoed {n}");
}

/// A secondary that takes buffers and never gives them back.
fn hoard(prefix: &str) {
    Eal::init(prefix, Role::Secondary).unwrap();
    let pool = pools(false, SECONDARY);
    let (_tx, mut rx) = rings(false, false);
    let mut held = Vec::new();
    for _ in 0..20 {
        held.push(pool.alloc(100, false).unwrap());
    }
    println!("XIO:allocated");
    for _ in 0..5 {
        let d = recv(&mut rx);
        held.push(pool.accept(0, &d).unwrap());
    }
    println!("XIO:holding {}", held.len());
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

fn iso_primary(prefix: &str, marker: u32) {
    Eal::init(prefix, Role::Primary).unwrap();
    let _pool = pools(true, PRIMARY);
    let mut tx = DpdkProducer::new(Ring::create("xio-iso", 64).unwrap());
    let d = Descriptor {
        conn: marker,
        ..Default::default()
    };
    assert_eq!(tx.push_burst(&[d]).unwrap(), 1);
    println!("XIO:ready");
    for _ in std::io::stdin().lock().lines() {}
}

fn iso_secondary(prefix: &str) {
    match Eal::init(prefix, Role::Secondary) {
        Ok(_) => {
            let mut rx = DpdkConsumer::new(Ring::lookup("xio-iso").unwrap());
            println!("XIO:marker {}", recv(&mut rx).conn);
        }
        Err(e) => println!("XIO:error {e}"),
    }
}

/// A buffer goes 1 -> 2 -> 1 -> 2, made writable again by each receiver
/// (as `Buf::into_mut` does); then a copy of its first descriptor comes
/// (replayed by a hostile or broken sender): says whether it was taken.
fn replay(prefix: &str) {
    Eal::init(prefix, Role::Primary).unwrap();
    let one = pools(true, PRIMARY);
    let two = pools(false, SECONDARY);
    let b = one.alloc(64, false).unwrap();
    let first = one.prepare_send(b, 64, SECONDARY, 7, kind::DATA);
    let b = two.accept(0, &first).unwrap();
    two.reuse(b);
    let back = two.prepare_send(b, 64, PRIMARY, 8, kind::DATA);
    let b = one.accept(0, &back).unwrap();
    one.reuse(b);
    let again = one.prepare_send(b, 32, SECONDARY, 9, kind::DATA);
    let replayed = two.accept(0, &first);
    let genuine = two.accept(0, &again);
    println!(
        "XIO:replay {} genuine {}",
        if replayed.is_ok() { "taken" } else { "refused" },
        if genuine.is_ok() { "taken" } else { "refused" },
    );
}

/// A stack's buffer is reclaimed by the manager while the stack lives (it
/// dropped the stack: a control-protocol error), then the stack frees it:
/// says how many buffers class 0 then hands out, and how many of them
/// twice.
fn dropped_stack(prefix: &str) {
    Eal::init(prefix, Role::Primary).unwrap();
    let manager = pools(true, 0);
    let stack = pools(false, SECONDARY);
    let b = stack.alloc(100, false).unwrap();
    let r = manager.reclaim(&[SECONDARY], &[], &[], Default::default(), |_| true);
    assert_eq!(r.unwrap().owned, 1);
    stack.free(b);
    let mut seen = std::collections::HashSet::new();
    let mut twice = 0;
    while let Ok(b) = manager.alloc(100, false) {
        if b.class != 0 {
            break;
        }
        if !seen.insert(b.index) {
            twice += 1;
        }
    }
    println!("XIO:handed {} twice {twice}", seen.len() + twice);
}

/// A DPDK manager's builder with a small pool: 64 buffers of 2 KiB, 4
/// stacks, `channels` channels of `ring` slots.
fn small_dpdk_manager(prefix: &str, channels: u32, ring: u32) -> xio_core::manager::ManagerBuilder {
    xio_core::manager::Manager::builder(prefix)
        .backend(xio_core::manager::Backend::Dpdk)
        .pool(xio_core::layout::PoolConfig {
            classes: vec![(2048, 64)],
            max_stacks: 4,
            max_channels: channels,
            ring_capacity: ring,
            quotas: Vec::new(),
        })
}

/// Starts a manager whose rings DPDK cannot make (more than its memzone
/// limit), after its mempools were made: says how that went, and exits.
fn failed_manager(prefix: &str) {
    let r = small_dpdk_manager(prefix, 4096, 2).spawn();
    match r {
        Ok(_) => println!("XIO:started"),
        Err(e) => println!("XIO:failed {e}"),
    }
}

/// Binds a manager of the DPDK backend and drops it without running it
/// (an application that set one up, then failed at something else):
/// says how many of the prefix's hugepage files are left, and exits.
fn unrun_manager(prefix: &str) {
    let m = small_dpdk_manager(prefix, 4, 64).bind().unwrap();
    let made = hugepage_files(prefix).len();
    drop(m);
    println!("XIO:left {made} {}", hugepage_files(prefix).len());
}

/// Overwrites the index in object 5's header of class 0 (any process that
/// maps the prefix's hugepages can), then looks the mempool up as a stack
/// does: says whether it was taken.
fn scribbled_index(prefix: &str) {
    Eal::init(prefix, Role::Primary).unwrap();
    let (name, size, _) = CLASSES[0];
    let made = Mempool::create(name, 0, CLASSES[0].2, size).unwrap();
    // What a broken or hostile process of the prefix would write.
    made.header(5)
        .unwrap()
        .index
        .store(77_777, std::sync::atomic::Ordering::Relaxed);
    match Mempool::lookup(name, size) {
        Ok(_) => println!("XIO:lookup taken"),
        Err(e) => println!("XIO:lookup refused {e}"),
    }
}

/// Asks for a mempool of buffers a 64-byte header makes 4 GiB: says
/// whether it was made.
fn huge_class(prefix: &str) {
    Eal::init(prefix, Role::Primary).unwrap();
    match Mempool::create("xio-huge", 0, 1, (u32::MAX - 63) as usize) {
        Ok(m) => println!("XIO:mempool made, {} objects", m.len()),
        Err(e) => println!("XIO:mempool refused {e}"),
    }
}

/// Starts a primary, says how that went, and exits.
fn try_primary(prefix: &str) {
    match Eal::init(prefix, Role::Primary) {
        Ok(_) => println!("XIO:started"),
        Err(e) => println!("XIO:error {e}"),
    }
}

/// A secondary that does nothing until its stdin closes.
fn idle_secondary(prefix: &str) {
    Eal::init(prefix, Role::Secondary).unwrap();
    println!("XIO:ready {}", std::process::id());
    for _ in std::io::stdin().lock().lines() {}
}

/// Makes class 0's mempool, then looks it up as a stack would whose
/// class table says its buffers are 64 KiB: says whether it was taken.
fn oversized_lookup(prefix: &str) {
    Eal::init(prefix, Role::Primary).unwrap();
    let (name, size, n) = CLASSES[0];
    let _made = Mempool::create(name, 0, n, size).unwrap();
    match Mempool::lookup(name, 65536) {
        Ok(m) => println!("XIO:lookup taken, {} bytes a buffer", m.size()),
        Err(e) => println!("XIO:lookup refused {e}"),
    }
}

/// A pool with a segment, as stacks have: says its id, its segment's
/// identity, and a fresh memfd segment's.
fn pool_ids(prefix: &str) {
    Eal::init(prefix, Role::Primary).unwrap();
    let cfg = xio_core::layout::PoolConfig {
        classes: vec![(2048, 1)],
        max_stacks: 4,
        max_channels: 2,
        ring_capacity: 8,
        quotas: Vec::new(),
    };
    let geo = cfg.geometry().unwrap();
    let seg = |name: &str| {
        let r = xio_core::segment::Region::create_memfd(name, geo.total_len as usize).unwrap();
        xio_core::segment::Segment::init_for(r, &cfg, &geo, xio_core::layout::backend::DPDK)
            .unwrap()
    };
    let (mine, other) = (seg("xio-mine"), seg("xio-other"));
    let (name, size, n) = CLASSES[0];
    let pool = DpdkPool::with_segment(
        vec![Mempool::create(name, 0, n, size).unwrap()],
        1,
        mine.clone(),
    );
    println!(
        "XIO:ids {:#x} {:#x} {:#x}",
        pool.pool_id(),
        mine.region().ident(),
        other.region().ident()
    );
}

/// Overwrites the index in object 5's header of class 0 once the pool is
/// in use (any process that maps the prefix's hugepages can), then takes
/// and gives back every buffer of the class: says how many it took.
fn scribbled_in_use(prefix: &str) {
    Eal::init(prefix, Role::Primary).unwrap();
    let pool = pools(true, PRIMARY);
    // What a broken or hostile process of the prefix would write.
    pool.classes()[0]
        .header(5)
        .unwrap()
        .index
        .store(77_777, std::sync::atomic::Ordering::Relaxed);
    let mut held = Vec::new();
    while let Ok(b) = pool.alloc(100, false) {
        pool.data(b);
        held.push(b);
    }
    for &b in &held {
        pool.free(b);
    }
    println!("XIO:took {}", held.len());
}

/// A stack's pool of the manager's classes (`manager`), its mempool
/// operations bracketed and locked as the stack's own are.
fn stack_pool(s: &xio_core::stack::Stack) -> DpdkPool {
    let classes = [(0, 2048), (1, 65536)]
        .iter()
        .map(|&(c, size)| Mempool::lookup(&xio_core::dpdk::mempool_name(c), size).unwrap())
        .collect();
    DpdkPool::with_segment(classes, s.id().slot(), s.__segment().clone())
}

/// A stack whose process stops inside a get from class 0's mempool (inside
/// the bracket and under the lock, as its allocations take them), as one
/// killed there would: then waits to be killed.
fn half_get(prefix: &str) {
    let s = xio_core::stack::Stack::attach(prefix).unwrap();
    stack_pool(&s).__inside_op(0, |op| {
        assert!(op.half_get(3));
        println!("XIO:stopped inside a get");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    });
}

/// A stack that stops inside a get from class 0's mempool the way its
/// own allocations make them (inside the intent/gate bracket, its slots
/// reserved, the consumer tail not moved yet), as one killed there
/// would: then waits to be killed.
fn parked_get(prefix: &str) {
    let s = xio_core::stack::Stack::attach(prefix).unwrap();
    stack_pool(&s).__inside_op(0, |op| {
        assert!(op.half_get(3));
        println!("XIO:parked");
        loop {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    });
}

/// A broken or hostile stack that leaves a get from class 0's mempool
/// half done in its ring (its slots reserved, the consumer tail not
/// moved) and yet lets go of the mempool's lock, as any process of the
/// prefix can (the ring and the lock word are shared memory it may
/// write): then waits to be killed.
fn loose_half_get(prefix: &str) {
    let s = xio_core::stack::Stack::attach(prefix).unwrap();
    assert!(stack_pool(&s).__inside_op(0, |op| op.half_get(3)).unwrap());
    println!("XIO:scribbled");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// A stack that, told `go`, allocates a buffer (its first: a get from
/// class 0's mempool) and says so; exits at the end of its stdin.
fn late_get(prefix: &str) {
    let s = xio_core::stack::Stack::attach(prefix).unwrap();
    println!("XIO:ready");
    let mut lines = std::io::stdin().lock().lines();
    assert_eq!(lines.next().unwrap().unwrap(), "go");
    let b = s.alloc(100).unwrap();
    println!("XIO:allocated");
    drop(b);
    for l in lines {
        l.unwrap();
    }
}

/// A stack that puts pointers to none of class 0's objects into its
/// mempool, as a broken or hostile process of the prefix can: one to an
/// address no process maps, one inside an object, one past the last
/// object, one just before the first. Then waits to be killed.
fn bogus_putter(prefix: &str) {
    let s = xio_core::stack::Stack::attach(prefix).unwrap();
    let pool = stack_pool(&s);
    pool.__inside_op(0, |op| {
        let mp = op.mempool();
        let at = |i: u32| mp.header(i).unwrap() as *const _ as usize;
        let stride = at(1) - at(0);
        let last = at(mp.len() as u32 - 1);
        op.put_raw(&[0x1000, at(3) + 8, last + 4 * stride, at(0) - 64]);
    })
    .unwrap();
    println!("XIO:put");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// A stack that allocates one buffer of class 0, then puts a second entry
/// for it and for a free object into class 0's mempool, as a broken or
/// hostile process of the prefix can (a double put). Then waits to be
/// killed.
fn double_putter(prefix: &str) {
    let s = xio_core::stack::Stack::attach(prefix).unwrap();
    let pool = stack_pool(&s);
    let mine = pool.alloc(100, false).unwrap();
    pool.__inside_op(0, |op| {
        let mp = op.mempool();
        let at = |i: u32| mp.header(i).unwrap() as *const _ as usize;
        let free = (0..mp.len() as u32)
            .find(|&i| {
                mp.header(i)
                    .unwrap()
                    .stamped(std::sync::atomic::Ordering::Relaxed)
                    .1
                    == xio_core::dpdk::obj_state::FREE
            })
            .unwrap();
        op.put_raw(&[at(mine.index), at(free)]);
    })
    .unwrap();
    println!("XIO:put");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// A stack that overwrites the index in object 5's header of class 0
/// (a broken or hostile process of the prefix can), then waits to be
/// killed.
fn scribbler(prefix: &str) {
    let _s = xio_core::stack::Stack::attach(prefix).unwrap();
    let mp = Mempool::lookup(&xio_core::dpdk::mempool_name(0), 2048).unwrap();
    // What a broken or hostile process of the prefix would write.
    mp.header(5)
        .unwrap()
        .index
        .store(77_777, std::sync::atomic::Ordering::Relaxed);
    println!("XIO:scribbled");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// A stack that overwrites class 0's mempool's ops index (past DPDK's
/// ops table) and its ring's slot mask (every bit), as a broken or
/// hostile process of the prefix can, then waits to be killed.
fn ring_scribbler(prefix: &str) {
    let _s = xio_core::stack::Stack::attach(prefix).unwrap();
    let mp = Mempool::lookup(&xio_core::dpdk::mempool_name(0), 2048).unwrap();
    mp.__scribble_ring(1000, u32::MAX);
    println!("XIO:scribbled");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// A stack that overwrites the link to the next object in the DPDK header
/// of object 5 of class 0 with an address no process maps, as a broken or
/// hostile process of the prefix can, then waits to be killed.
fn link_scribbler(prefix: &str) {
    let _s = xio_core::stack::Stack::attach(prefix).unwrap();
    let mp = Mempool::lookup(&xio_core::dpdk::mempool_name(0), 2048).unwrap();
    mp.__scribble_link(5, 0x1000);
    println!("XIO:scribbled");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// Makes a channel ring and takes its consumer end, then overwrites the
/// ring's mask and size (every bit) and moves its indices far along with
/// one descriptor waiting, as a broken or hostile process of the prefix
/// can (the producer end, say): says how many descriptors a pop took.
fn ring_mask(prefix: &str) {
    Eal::init(prefix, Role::Primary).unwrap();
    let made = Ring::create("xio-mask", 1024).unwrap();
    let mut rx = DpdkConsumer::new(Ring::lookup("xio-mask").unwrap());
    made.__scribble(u32::MAX, u32::MAX, 0x4000_0000);
    let mut d = [Descriptor::default(); 4];
    println!("XIO:popped {}", rx.pop_burst(&mut d).unwrap());
}

/// A stack that takes every small buffer it can: says how many (or why
/// it could not attach), then gives them back and exits.
fn take_all(prefix: &str) {
    match xio_core::stack::Stack::attach(prefix) {
        Ok(s) => {
            let mut held = Vec::new();
            while let Ok(b) = s.try_alloc(100) {
                held.push(b);
            }
            println!("XIO:took {}", held.len());
        }
        Err(e) => println!("XIO:took none: {e}"),
    }
}

/// Asks the manager child for its sweep count until it is not 0.
fn wait_for_a_sweep(m: &mut ChildProc) {
    wait_for_deaths(m, 1)
}

/// Waits (watchdog) until the manager has swept `n` deaths in all. A
/// stack that exits cleanly is one too: a test that ran one before the
/// death it waits for waited for that one (the manager's answer could
/// come before the second sweep, and a buffer of the killed stack was
/// then not back yet: one run in six failed so).
fn wait_for_deaths(m: &mut ChildProc, n: u64) {
    let deadline = std::time::Instant::now() + WATCHDOG;
    loop {
        m.tell("deaths");
        if m.expect("deaths").parse::<u64>().unwrap() >= n {
            return;
        }
        assert!(std::time::Instant::now() < deadline, "watchdog: no sweep");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A stack that takes and gives back buffers as fast as it can (its
/// cache refilled from and spilled to the mempools all the time) until
/// it is killed.
fn churn(prefix: &str) {
    let s = xio_core::stack::Stack::attach(prefix).unwrap();
    println!("XIO:churning");
    loop {
        let v: Vec<_> = (0..100).map(|_| s.alloc(100).unwrap()).collect();
        drop(v);
    }
}

/// Takes every buffer of class 0, then asks for one more small buffer:
/// says what it got.
fn small_class_empty(prefix: &str) {
    Eal::init(prefix, Role::Primary).unwrap();
    let pool = pools(true, PRIMARY);
    let held: Vec<RawBuf> = (0..CLASSES[0].2)
        .map(|_| pool.alloc(100, false).unwrap())
        .collect();
    assert!(held.iter().all(|b| b.class == 0));
    match pool.alloc(100, false) {
        Ok(b) => println!("XIO:got class {}", b.class),
        Err(e) => println!("XIO:got {e}"),
    }
}

/// The backend conformance suites on DPDK, in a primary: every pool is
/// fresh mempools of the suite's classes, two `DpdkPool`s over them (the
/// second found by name, as a secondary finds them), every ring a fresh
/// `rte_ring`. The doorbell is the eventfd every backend uses.
fn conformance(prefix: &str) {
    use xio_core::backend::conformance::{self as suite, PoolPair, CLASSES};
    Eal::init(prefix, Role::Primary).unwrap();
    let mut n = 0;
    suite::pool_suite(|| {
        n += 1;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for (c, &(size, count)) in CLASSES.iter().enumerate() {
            let name = format!("cf{n}-{c}");
            a.push(Mempool::create(&name, c as u8, count, size as usize).unwrap());
            b.push(Mempool::lookup(&name, size as usize).unwrap());
        }
        PoolPair {
            a: DpdkPool::new(a, PRIMARY),
            b: DpdkPool::new(b, SECONDARY),
            keep: Box::new(()),
        }
    });
    let mut n = 0;
    suite::ring_suite(|| {
        n += 1;
        let r = Ring::create(&format!("cfr{n}"), 8).unwrap();
        let rx = DpdkConsumer::new(Ring::lookup(&format!("cfr{n}")).unwrap());
        (DpdkProducer::new(r), rx)
    });
    suite::doorbell_suite(|| xio_core::backend::EventFdDoorbell::new().unwrap());
    println!("XIO:conformance ok");
}

/// A small DPDK manager that answers `deaths` (stacks it has swept) and
/// `whole` (`free total` of every class, the first number of the pair is
/// the mempool's count).
fn manager(prefix: &str) {
    let pool = xio_core::layout::PoolConfig {
        classes: vec![(2048, 256), (65536, 16)],
        max_stacks: 4,
        max_channels: 4,
        ring_capacity: 64,
        quotas: Vec::new(),
    };
    let m = xio_core::manager::Manager::builder(prefix)
        .backend(xio_core::manager::Backend::Dpdk)
        .pool(pool)
        .spawn()
        .unwrap();
    println!("XIO:ready");
    for line in std::io::stdin().lock().lines() {
        match line.unwrap().as_str() {
            "deaths" => println!("XIO:deaths {}", m.snapshot().deaths),
            "whole" => {
                let u = m.usage();
                let free: u32 = u.iter().map(|c| c.free).sum();
                let total: u32 = u.iter().map(|c| c.total).sum();
                println!("XIO:whole {free} {total}");
            }
            l => panic!("unknown command {l}"),
        }
    }
    m.stop();
}

/// A stack that takes buffers (an allocation fills its cache from the
/// mempool), then leaves every object it owns as a process killed right
/// after the mempool handed them over, before stamping them its own
/// (or right after stamping them free, before putting them back), would:
/// free in the header, in no mempool. Then waits to be killed.
fn unstamped_stack(prefix: &str) {
    let s = xio_core::stack::Stack::attach(prefix).unwrap();
    let held: Vec<_> = (0..3).map(|_| s.alloc(100).unwrap()).collect();
    let me = s.id().slot();
    let mut n = 0;
    for (c, size) in [(0, 2048), (1, 65536)] {
        let mp = Mempool::lookup(&xio_core::dpdk::mempool_name(c), size).unwrap();
        for i in 0..mp.len() as u32 {
            let h = mp.header(i).unwrap();
            if h.stamped(std::sync::atomic::Ordering::Relaxed).0 == me {
                h.stamp(
                    0,
                    xio_core::dpdk::obj_state::FREE,
                    std::sync::atomic::Ordering::Relaxed,
                );
                n += 1;
            }
        }
    }
    assert!(n >= held.len(), "{n} objects owned");
    println!("XIO:unstamped {n}");
    loop {
        std::thread::sleep(std::time::Duration::from_secs(1));
    }
}

/// Joins the cgroup `procs` (a `cgroup.procs` file), then starts a
/// primary there: what a service in a container limited to some CPUs
/// does.
fn in_cgroup_primary(prefix: &str, procs: &str) {
    std::fs::write(procs, std::process::id().to_string()).unwrap();
    match Eal::init(prefix, Role::Primary) {
        Ok(_) => println!("XIO:started"),
        Err(e) => println!("XIO:error {e}"),
    }
}

/// A cpuset cgroup allowed only this machine's last CPU (removed when
/// dropped), or `None` where cgroups cannot be made (not root, no cpuset
/// controller, a single CPU).
struct OneCpuCgroup(std::path::PathBuf);

impl OneCpuCgroup {
    fn new(name: &str) -> Option<Self> {
        let cpus = std::thread::available_parallelism().ok()?.get();
        if cpus < 2 {
            return None;
        }
        let last = (cpus - 1).to_string();
        // cgroup v1's cpuset hierarchy, else v2 with the cpuset controller.
        for root in ["/sys/fs/cgroup/cpuset", "/sys/fs/cgroup"] {
            let root = std::path::Path::new(root);
            if std::fs::create_dir(root.join(name)).is_err() {
                continue;
            }
            let g = OneCpuCgroup(root.join(name));
            let mems = std::fs::read_to_string(root.join("cpuset.mems.effective"))
                .or_else(|_| std::fs::read_to_string(root.join("cpuset.mems")))
                .unwrap_or_else(|_| "0".into());
            if std::fs::write(g.0.join("cpuset.cpus"), &last).is_ok()
                && std::fs::write(g.0.join("cpuset.mems"), mems.trim()).is_ok()
            {
                return Some(g);
            }
        }
        None
    }

    fn procs(&self) -> String {
        self.0.join("cgroup.procs").display().to_string()
    }
}

impl Drop for OneCpuCgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.0);
    }
}

/// Asks the manager whether every object of its mempools is back (the
/// pool's count against the mempools'), then stops it.
fn assert_whole_then_finish(mut m: ChildProc, prefix: &str) {
    m.tell("whole");
    let w = m.expect("whole");
    finish_primary(m, prefix);
    let w: Vec<&str> = w.split_whitespace().collect();
    assert_eq!(w[0], w[1], "every object back in its mempool");
}

/// A new stack takes every buffer of class 0 it can get; how many.
fn taken_by_a_new_stack(prefix: &str) -> String {
    let mut t = ChildProc::spawn("child_main", "take_all", &[prefix.to_owned()]);
    let took = t.expect("took");
    t.wait_success();
    took
}

/// Ends a primary (stdin closed: it returns and exits) and removes what
/// DPDK leaves of the prefix: its hugepage files and runtime directory (a
/// new primary of the same prefix would clear them, but test prefixes are
/// unique).
fn finish_primary(mut p: ChildProc, prefix: &str) {
    drop(p.child.stdin.take());
    p.wait_success();
    remove_prefix_files(prefix);
}

fn remove_prefix_files(prefix: &str) {
    Eal::remove_hugepage_files(prefix);
    let _ = std::fs::remove_dir_all(format!("/var/run/dpdk/{prefix}"));
}

/// The primary's mempool counts: `[free0, total0, free1, total1]`.
fn avail(prim: &mut ChildProc) -> Vec<u32> {
    prim.tell("avail");
    prim.expect("avail")
        .split_whitespace()
        .map(|x| x.parse().unwrap())
        .collect()
}

/// Both classes' mempools hold every object again (free == total).
fn assert_pools_whole(prim: &mut ChildProc) {
    let a = avail(prim);
    assert_eq!(
        (a[0], a[2]),
        (a[1], a[3]),
        "every buffer back in its mempool"
    );
}

/// Runs `role` in a child process on a pool of its own (prefix from
/// `test`), and returns what it says after `key`, once it exited
/// cleanly and its hugepage files are gone.
fn child_says(test: &str, role: &str, key: &str) -> String {
    let p = dpdk_prefix(test);
    let mut c = ChildProc::spawn("child_main", role, std::slice::from_ref(&p));
    let r = c.expect(key);
    c.wait_success();
    remove_prefix_files(&p);
    r
}

fn dpdk_prefix(test: &str) -> String {
    // DPDK file prefixes end up in /var/run/dpdk/<prefix>: keep them short.
    format!("xt{}{}", test, std::process::id())
}

#[test]
fn buffers_cross_processes_through_dpdk_rings() {
    setup();
    let p = dpdk_prefix("x");
    let mut prim = child("primary", &p);
    prim.expect("ready");
    let n = 3000u64;
    let mut sec = ChildProc::spawn("child_main", "echo", &[p.clone(), n.to_string()]);
    sec.expect("ready");
    prim.tell(&format!("pingpong {n}"));
    prim.expect("pingpong ok");
    assert_eq!(sec.expect("echoed"), n.to_string());
    sec.wait_success();
    assert_pools_whole(&mut prim);
    finish_primary(prim, &p);
}

#[test]
fn killed_secondary_is_reclaimed() {
    setup();
    let p = dpdk_prefix("k");
    let mut prim = child("primary", &p);
    prim.expect("ready");
    let mut h = child("hoard", &p);
    h.expect("allocated");
    prim.tell("send 10");
    prim.expect("sent");
    assert_eq!(h.expect("holding"), "25");
    let before = avail(&mut prim);
    assert_eq!(before[1] - before[0], 20 + 10, "held + in flight");
    h.kill9();
    prim.tell(&format!("reclaim {SECONDARY}"));
    assert_eq!(prim.expect("reclaimed"), "30");
    assert_pools_whole(&mut prim);
    finish_primary(prim, &p);
}

#[test]
fn two_prefixes_stay_apart() {
    setup();
    let (pa, pb) = (dpdk_prefix("a"), dpdk_prefix("b"));
    // The same object names in both prefixes: no clash.
    let mut a = ChildProc::spawn("child_main", "iso_primary", &[pa.clone(), "111".into()]);
    let mut b = ChildProc::spawn("child_main", "iso_primary", &[pb.clone(), "222".into()]);
    a.expect("ready");
    b.expect("ready");
    let mut sa = ChildProc::spawn("child_main", "iso_secondary", std::slice::from_ref(&pa));
    let mut sb = ChildProc::spawn("child_main", "iso_secondary", std::slice::from_ref(&pb));
    assert_eq!(sa.expect("marker"), "111");
    assert_eq!(sb.expect("marker"), "222");
    sa.wait_success();
    sb.wait_success();
    // A prefix without a primary: a clear error, not a hang or a crash.
    let mut none = ChildProc::spawn("child_main", "iso_secondary", &[dpdk_prefix("none")]);
    let e = none.expect("error");
    assert!(e.contains("primary"), "{e}");
    none.wait_success();
    remove_prefix_files(&dpdk_prefix("none"));
    finish_primary(a, &pa);
    finish_primary(b, &pb);
}

/// A service in a container limited to some CPUs (a cpuset cgroup, as
/// `docker run --cpuset-cpus` makes) starts DPDK. The EAL was given the
/// CPUs `0..n` for its lcore, `n` the number it may use, and pinning to
/// CPUs outside the cgroup fails: `rte_eal_init` refused with "Cannot
/// set affinity" whenever the allowed CPUs were not the first ones.
#[test]
fn the_eal_starts_in_a_cgroup_limited_to_other_cpus() {
    setup();
    let p = dpdk_prefix("cg");
    let Some(cg) = OneCpuCgroup::new(&p) else {
        eprintln!("skipped: cannot make a cpuset cgroup here (needs root and cgroups)");
        return;
    };
    let mut c = ChildProc::spawn("child_main", "in_cgroup_primary", &[p.clone(), cg.procs()]);
    let r = c.expect("");
    c.wait_success();
    remove_prefix_files(&p);
    drop(cg);
    assert_eq!(r, "started", "the EAL refused to start: {r}");
}

/// A manager restarted while processes attached to the one before still
/// run: DPDK refuses the new primary (those secondaries keep the
/// prefix's shared files locked). The error said "is another primary
/// running with this prefix?", which sent the operator looking for a
/// primary that does not exist, and said it twice. It now names the
/// processes that must exit first, once.
#[test]
fn a_primary_refused_for_a_live_secondary_names_it() {
    setup();
    let p = dpdk_prefix("live");
    let mut prim = child("primary", &p);
    prim.expect("ready");
    let mut sec = child("idle_secondary", &p);
    let pid = sec.expect("ready");
    // The primary stops as a manager does: its runtime files stay.
    drop(prim.child.stdin.take());
    prim.wait_success();
    let mut again = child("try_primary", &p);
    let e = again.expect("");
    again.wait_success();
    drop(sec.child.stdin.take());
    sec.wait_success();
    remove_prefix_files(&p);
    assert!(e.starts_with("error "), "{e}");
    assert_eq!(e.matches("EAL init failed").count(), 1, "{e}");
    assert!(e.contains(&format!("process {pid}")), "{e}");
}

/// A stale or replayed descriptor is refused by its generation: the shm
/// pool bumps it when a received buffer is made writable again, the DPDK
/// pool did not. A buffer that came back to a stack through a chain of
/// reuses (an echo's reply, a proxy forwarding) then matched the
/// descriptor of its first trip, and a replay of that one took it: the
/// receiver read the new payload under the old length and connection,
/// and refused the real descriptor as corrupt.
#[test]
fn a_replayed_descriptor_does_not_take_a_reused_buffer() {
    setup();
    let r = child_says("replay", "replay", "replay");
    assert_eq!(r, "refused genuine taken");
}

/// A stack the manager dropped (a control-protocol error) while its
/// process lives has its buffers reclaimed; when it frees one afterwards
/// the shm pool sees it is not the owner any more and leaves it, the
/// DPDK pool put it into the mempool a second time, and the mempool then
/// handed the same buffer to two allocations (of any stacks).
#[test]
fn a_buffer_reclaimed_from_a_live_stack_is_not_freed_twice() {
    setup();
    let r = child_says("dropped", "dropped_stack", "handed");
    assert_eq!(r, format!("{} twice 0", CLASSES[0].2));
}

/// The prefix's hugepage files in the hugetlbfs mounts.
fn hugepage_files(prefix: &str) -> Vec<String> {
    let stem = format!("{prefix}map_");
    ["/dev/hugepages"]
        .iter()
        .flat_map(|d| std::fs::read_dir(d).into_iter().flatten().flatten())
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|n| n.starts_with(&stem))
        .collect()
}

/// A manager that fails to start after DPDK made its first objects (a
/// pool larger than the hugepages left, more rings than DPDK's memzone
/// limit) left the prefix's hugepage files behind when its process
/// exited: the pages stayed taken, by nobody, until a manager of the
/// same prefix started again.
#[test]
fn a_manager_that_fails_to_start_leaves_no_hugepages_taken() {
    setup();
    let p = dpdk_prefix("failed");
    let mut c = child("failed_manager", &p);
    let r = c.expect("");
    c.wait_success();
    let left = hugepage_files(&p);
    remove_prefix_files(&p);
    assert!(r.starts_with("failed "), "{r}");
    assert!(left.is_empty(), "left behind: {left:?}");
}

/// A manager of the DPDK backend bound and dropped without `run` (set up,
/// then given up on by its application) left the prefix's hugepage files:
/// only `run` removed them, so the pages stayed taken, by nobody, after
/// the process exited, until a manager of the same prefix started again.
#[test]
fn a_manager_dropped_without_running_leaves_no_hugepages_taken() {
    setup();
    let p = dpdk_prefix("unrun");
    let mut c = child("unrun_manager", &p);
    let r = c.expect("left");
    c.wait_success();
    let left = hugepage_files(&p);
    remove_prefix_files(&p);
    let r: Vec<&str> = r.split_whitespace().collect();
    assert_ne!(r[0], "0", "the manager made hugepage files");
    assert_eq!(r[1], "0", "left behind after the drop");
    assert!(left.is_empty(), "left behind after exit: {left:?}");
}

/// Object headers live in memory every process of the prefix can write.
/// A header whose index was overwritten left its slot in a stack's object
/// table dangling, and the first descriptor, status report or sweep
/// naming that slot dereferenced it: undefined behaviour from a value
/// read from shared memory. The lookup refuses such a pool now.
#[test]
fn a_mempool_whose_headers_do_not_number_its_objects_is_refused() {
    setup();
    let r = child_says("scribble", "scribbled_index", "lookup");
    assert!(r.starts_with("refused "), "{r}");
}

/// A class whose buffers with their 64-byte header need 4 GiB: the
/// object size was cut to 32 bits, to 0, and DPDK made objects of no
/// bytes that the header of each was then written over (and stacks
/// would write whole buffers into): memory corruption from a pool
/// configuration. It is refused now.
#[test]
fn a_class_too_large_for_dpdk_objects_is_refused() {
    setup();
    let r = child_says("huge", "huge_class", "mempool");
    assert!(r.starts_with("refused "), "{r}");
}

/// A stack killed -9 between taking objects from a mempool and stamping
/// them its own (or between stamping them free and putting them back)
/// left them free in their headers but in no mempool: the manager's sweep
/// looked for the dead stack's id in the headers, found none, and the
/// objects were gone from the pool for good. The sweep now empties the
/// mempools with every stack held out of them (the shm pool's intent and
/// gate) and puts back whatever is free, listed or not.
#[test]
fn objects_a_killed_stack_took_but_never_stamped_come_back() {
    setup();
    let p = dpdk_prefix("unst");
    let mut m = manager_ready(&p);
    let mut s = child("unstamped_stack", &p);
    s.expect("unstamped");
    s.kill9();
    wait_for_a_sweep(&mut m);
    assert_whole_then_finish(m, &p);
}

/// An allocation whose class is empty reports the pool exhausted, as the
/// shm pool does. The DPDK pool took a buffer of the next larger class
/// instead: the socket layer, which picks classes itself (down to smaller
/// ones first, up only as the connection's window allows, since a
/// buffer's whole capacity counts against it), got 64 KiB buffers for
/// 2 KiB writes and drained the few large buffers other writes need.
#[test]
fn an_empty_class_is_exhausted_not_served_from_a_larger_one() {
    setup();
    let r = child_says("small", "small_class_empty", "got");
    assert_eq!(r, "pool exhausted");
}

/// The pool, ring and doorbell conformance suites, which the shm backend
/// passes on a heap region and on a memfd, pass on DPDK.
#[test]
fn the_conformance_suites_pass_on_dpdk() {
    setup();
    let r = child_says("conf", "conformance", "conformance");
    assert_eq!(r, "ok");
}

/// A stack finds a class's mempool by name and takes the buffer size
/// from the segment's class table: a table that does not match the
/// mempool (another program's mempool of the same name in the prefix, a
/// segment overwritten) made every buffer of the class reach past its
/// object into the next ones, and a write of a full buffer corrupted
/// other processes' buffers and headers. The lookup checks the size
/// against the mempool's objects now.
#[test]
fn a_mempool_smaller_than_its_class_is_refused() {
    setup();
    let r = child_says("undersz", "oversized_lookup", "lookup");
    assert!(r.starts_with("refused "), "{r}");
}

/// A stack refuses to send a buffer of another pool by comparing pool
/// ids, which the shm pool takes from its segment's identity (a memfd's
/// device and inode: `1 << 32 ^ inode` on Linux). The DPDK pool used the
/// address of its first mempool, in DPDK's memory at 4 GiB and up: the
/// same range. A process with an shm pool and a DPDK pool whose numbers
/// met sent the shm buffer as the DPDK pool's (class, index), handing a
/// peer someone else's buffer. The DPDK pool's id is its segment's
/// identity now, distinct from every other segment's in the process.
#[test]
fn a_dpdk_pools_id_is_its_segments_identity() {
    setup();
    let r = child_says("ids", "pool_ids", "ids");
    let ids: Vec<&str> = r.split_whitespace().collect();
    assert_eq!(ids[0], ids[1], "{r}");
    assert_ne!(ids[0], ids[2], "{r}");
}

/// An object's header names its index, in memory any process of the
/// prefix can write. The pool took the index of each object the mempool
/// handed out from its header: one overwritten after the lookup became a
/// buffer index beyond the class, and the pool panicked on it ("a RawBuf
/// we made"), or named another process's buffer. Then it was left out
/// (lost until a sweep, and again at the next get). An object whose
/// header does not name it is now found by its address, its index
/// written back: every object serves, as itself.
#[test]
fn an_object_whose_header_index_was_overwritten_is_handed_out_as_itself() {
    setup();
    let r = child_says("scrib2", "scribbled_in_use", "took");
    assert_eq!(r, CLASSES[0].2.to_string());
}

/// Stacks killed -9 at arbitrary points of taking and giving back buffers:
/// after each death the manager's sweep leaves every object in its
/// mempool. (Before the mempool operations were bracketed, most kills
/// landed between a mempool operation and the header stamps, and lost a
/// few objects each.)
#[test]
fn stacks_killed_while_taking_and_giving_back_buffers_lose_none() {
    setup();
    let p = dpdk_prefix("churn");
    let mut m = manager_ready(&p);
    for k in 1..=20u64 {
        let mut s = child("churn", &p);
        s.expect("churning");
        // Not a time bound: where in its loop the stack is when killed.
        std::thread::sleep(std::time::Duration::from_millis(5 + (k * 7919) % 50));
        s.kill9();
        let deadline = std::time::Instant::now() + WATCHDOG;
        loop {
            m.tell("deaths");
            if m.expect("deaths") == k.to_string() {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "watchdog: no sweep");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        m.tell("whole");
        let w = m.expect("whole");
        let w: Vec<&str> = w.split_whitespace().collect();
        assert_eq!(w[0], w[1], "kill {k}");
    }
    finish_primary(m, &p);
}

/// DPDK's multi-producer/consumer ring, under each mempool, is not
/// crash-safe: a process killed inside a get (its slots reserved, the
/// consumer tail not moved yet) makes every later get wait for it for
/// ever. The manager's sweep, which empties the mempools, then never
/// returned: the manager stopped serving every stack. With the stacks
/// held out of the mempools it now finishes what the dead one left half
/// done, and the objects it was taking come back by their headers.
#[test]
fn a_stack_killed_inside_a_mempool_get_does_not_hang_the_sweep() {
    setup();
    let p = dpdk_prefix("halfget");
    let mut m = manager_ready(&p);
    let mut s = child("half_get", &p);
    s.expect("stopped inside a get");
    s.kill9();
    wait_for_a_sweep(&mut m);
    assert_whole_then_finish(m, &p);
}

/// One stack killed inside a mempool get while another live one had
/// started a get of its own: DPDK's ring made the live one wait for the
/// dead one's consumer tail for ever, inside its intent/gate bracket, so
/// the manager's sweep (which repairs that tail) waited for the live one
/// and put itself off for ever: neither the dead stack's buffers nor the
/// live stack came back. The mempool operations are now one at a time
/// (a lock in the segment, waited for outside the bracket), so the only
/// operation half done is the dead one's and the sweep repairs it.
#[test]
fn a_stack_killed_inside_a_mempool_get_does_not_block_another_ones_get() {
    setup();
    a_live_get_outlives(&dpdk_prefix("park"), "parked_get", "parked");
}

/// A broken or hostile stack left a mempool get half done in the ring
/// and let go of the lock, then died. A live stack's next get from that
/// mempool reserved its slots behind the half-done one and waited for
/// the consumer tail to reach them (DPDK's protocol), for ever: inside
/// its intent/gate bracket and holding the lock, so the manager's sweep
/// (which repairs the tail) waited for the live stack in turn, and every
/// other stack's mempool operations for the lock. Under the lock a get
/// or put is the only one on its mempool, so a half-done one is not a
/// peer's in progress: it now fails at once, the stack waits as for an
/// empty pool, outside the bracket, and the sweep repairs the ring.
#[test]
fn a_mempool_get_left_half_done_by_a_dead_process_hangs_no_live_get() {
    setup();
    a_live_get_outlives(&dpdk_prefix("loose"), "loose_half_get", "scribbled");
}

/// A manager, a child in `role` that leaves a mempool get in the state
/// its name says (and prints `word`), and a live stack starting a get of
/// its own: once the child is killed -9 and swept, the live get ends and
/// the pool is whole.
fn a_live_get_outlives(p: &str, role: &str, word: &str) {
    let mut m = manager_ready(p);
    let mut bad = child(role, p);
    bad.expect(word);
    let mut live = child("late_get", p);
    live.expect("ready");
    live.tell("go");
    // Not a time bound: lets the live stack reach its get before the
    // other one dies (too early, and the test passes without showing).
    std::thread::sleep(std::time::Duration::from_millis(500));
    bad.kill9();
    wait_for_a_sweep(&mut m);
    live.expect("allocated");
    drop(live.child.stdin.take());
    live.wait_success();
    assert_whole_then_finish(m, p);
}

/// A manager, and a child in `role` that scribbles on the prefix's shared
/// DPDK state, says so, and is killed -9: after the sweep of its death,
/// what a new stack takes (the pool then checked whole).
fn taken_after_a_scribblers_sweep(tag: &str, role: &str) -> String {
    setup();
    let p = dpdk_prefix(tag);
    let mut m = manager_ready(&p);
    let mut s = child(role, &p);
    s.expect("scribbled");
    s.kill9();
    wait_for_a_sweep(&mut m);
    let took = taken_by_a_new_stack(&p);
    assert_whole_then_finish(m, &p);
    took
}

/// An object whose header's index was overwritten: the pool leaves it
/// out of every allocation, and a stack attaching later refused the
/// whole mempool as corrupt, for good (nothing rewrote the index). The
/// manager's sweep, which knows every object's index from its place,
/// now writes it back: after the next death every object serves again.
#[test]
fn an_overwritten_object_index_is_repaired_by_the_sweep() {
    let took = taken_after_a_scribblers_sweep("rix", "scribbler");
    assert_eq!(took, "256", "every small buffer of the manager's class 0");
}

/// A mempool's ring holds object pointers in memory every process of the
/// prefix can write, and a stack dereferenced each pointer a get handed
/// it (to read the object's header) before checking it was one of the
/// pool's objects: one bogus entry, put there by a broken or hostile
/// process, crashed the next stack whose cache refill took it (or made it
/// read outside the pool). The pointer is now checked against the pool's
/// object area first, and a bad one dropped: the stack takes every real
/// object and lives.
#[test]
fn a_bogus_pointer_in_a_mempool_does_not_crash_the_stack_that_gets_it() {
    setup();
    let p = dpdk_prefix("bogus");
    let m = manager_ready(&p);
    let mut s = child("bogus_putter", &p);
    s.expect("put");
    let took = taken_by_a_new_stack(&p);
    s.kill9();
    assert_whole_then_finish(m, &p);
    assert_eq!(took, "256", "every small buffer of the manager's class 0");
}

/// A mempool's ring is shared memory, and a broken or hostile process can
/// list an object in it twice. A stack took whatever the ring handed it:
/// an object another live stack held (its buffer stamped over and handed
/// to two processes at once), or one it had just taken itself in the same
/// refill (two of its own allocations sharing one buffer). Every object
/// the ring lists is free in its header (each put stamps it free first);
/// one that is not is a second entry and is dropped now.
#[test]
fn an_object_listed_twice_in_a_mempool_is_not_handed_out_twice() {
    setup();
    let p = dpdk_prefix("dup");
    let mut m = manager_ready(&p);
    let mut s = child("double_putter", &p);
    s.expect("put");
    let took = taken_by_a_new_stack(&p);
    s.kill9();
    // The stack that took the buffers, and the killed one.
    wait_for_deaths(&mut m, 2);
    assert_whole_then_finish(m, &p);
    assert_eq!(
        took, "255",
        "every small buffer but the other stack's, once"
    );
}

/// A mempool's ops index and its ring's mask live in memory every process
/// of the prefix can write, and DPDK's get and put read them on every
/// call: a stack that overwrote them made the manager's next sweep (and
/// every stack's next cache refill) abort inside DPDK (an ops index past
/// its table fails an `RTE_VERIFY`) or index slots outside the ring. The
/// pool now checks the ring once, when it wraps the mempool, and uses its
/// own copies; the manager's sweep writes the values back, so a stack
/// attaching later (which checks them) takes the pool.
#[test]
fn an_overwritten_mempool_ops_index_and_ring_mask_hurt_no_other_process() {
    let took = taken_after_a_scribblers_sweep("ops", "ring_scribbler");
    assert_eq!(took, "256", "every small buffer of the manager's class 0");
}

/// DPDK links a mempool's objects in a list through its headers before
/// each object, in memory every process of the prefix can write, and a
/// stack attaching walked it blindly (`rte_mempool_obj_iter`) to build
/// its object table: a link a peer overwrote crashed every stack that
/// attached afterwards (or, a cycle, made it collect objects until its
/// memory ran out). The walk now checks each object is in the prefix's
/// hugepage mappings before reading its link, and refuses the mempool as
/// corrupt; the manager's sweep links the list again.
#[test]
fn an_overwritten_object_link_does_not_crash_a_stack_attaching_later() {
    setup();
    let p = dpdk_prefix("link");
    let mut m = manager_ready(&p);
    let mut s = child("link_scribbler", &p);
    s.expect("scribbled");
    let while_corrupt = taken_by_a_new_stack(&p);
    s.kill9();
    // The stack that took the buffers, and the killed one.
    wait_for_deaths(&mut m, 2);
    let after_sweep = taken_by_a_new_stack(&p);
    assert_whole_then_finish(m, &p);
    assert!(
        while_corrupt.starts_with("none") && while_corrupt.contains("corrupt"),
        "{while_corrupt}"
    );
    assert_eq!(
        after_sweep, "256",
        "every small buffer of the manager's class 0"
    );
}

/// A channel ring's size and mask live in memory every process of the
/// prefix can write, and DPDK's burst functions read them on every call:
/// a peer that overwrote the mask and moved the indices made the other
/// end read (or write) a slot gigabytes past the ring, and crash there.
/// The ring's mask is checked once when it is looked up and kept by the
/// process; a pop reads a slot of the ring (a descriptor the receiver
/// checks, as any from a peer).
#[test]
fn an_overwritten_ring_mask_does_not_send_a_pop_outside_the_ring() {
    setup();
    let r = child_says("mask", "ring_mask", "popped");
    assert_eq!(r, "1");
}

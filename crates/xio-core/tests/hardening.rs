//! What a process that can write the shared segment, or reach the
//! manager's socket, must not be able to do to everyone else: each test
//! does what an outside attack on the pool did, and checks that the pool,
//! the manager and the other stacks come through.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use xio_core::layout::bufword;
use xio_core::proto::{ErrorCode, Msg};
use xio_core::stack::{Error, Stack};
use xio_core::PoolConfig;

#[test]
fn child_main() {
    let Some((role, a)) = child_role() else {
        return;
    };
    die_with_parent();
    match role.as_str() {
        "flood" => flood(&a[0]),
        "attach" => match Stack::attach(&a[0]) {
            Ok(_) => println!("XIO:attached ok"),
            Err(e) => println!("XIO:attached {e}"),
        },
        r => panic!("unknown role {r}"),
    }
}

/// Connects to the manager's socket again and again and never says
/// anything, keeping the newest 400 connections open, until killed.
fn flood(prefix: &str) {
    let path = xio_core::paths::socket_path(prefix);
    let mut held = std::collections::VecDeque::new();
    println!("XIO:flooding");
    loop {
        match xio_core::ctrl::connect(&path) {
            Ok(s) => {
                held.push_back(s);
                if held.len() > 400 {
                    held.pop_front();
                }
            }
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(1)),
        }
    }
}

/// A buffer whose header names an owner no stack holds (written by a
/// process that can write the segment) was never reclaimed: no stack
/// frees it and no death names its owner, so it stayed "in use" until
/// the manager restarted, and random header writes drained the pool for
/// good. The manager now gives back what is held in the name of no stack.
#[test]
fn buffers_held_in_the_name_of_no_stack_come_back() {
    setup();
    let p = prefix("orphans");
    // No quota: the test takes a whole class with one stack at the end.
    let mgr = manager_builder(&p)
        .pool(PoolConfig {
            quotas: PoolConfig::default().classes,
            ..PoolConfig::default()
        })
        .spawn()
        .unwrap();
    let stack = Stack::attach(&p).unwrap();
    let seg = stack.__segment();
    let count = seg.classes()[0].count;
    let n = count.min(100);
    // Owner 65535 (no stack), owner 0 (the manager, which holds none) and
    // the id of a slot nobody uses, in states a live stack's buffer has.
    for i in 0..n {
        let owner = match i % 3 {
            0 => 65535,
            1 => 0,
            _ => seg.max_stacks() as u16 - 1,
        };
        let state = [bufword::ALLOCATED, bufword::HELD, bufword::CACHED][i as usize % 3];
        let h = seg.buf_header(0, i).unwrap();
        let gen = bufword::gen(h.word.load(Ordering::Relaxed));
        h.word
            .store(bufword::pack(state, owner, gen), Ordering::Relaxed);
    }
    assert!(!mgr.pool_is_whole());
    // The count is written just after the pool is whole again.
    wait_until("the overwritten buffers back in the pool", || {
        mgr.pool_is_whole() && mgr.snapshot().orphans > 0
    });
    assert_eq!(mgr.snapshot().orphans, u64::from(n));
    // Every buffer of the class can be had again.
    let bufs: Vec<_> = (0..count).map(|_| stack.try_alloc(1).unwrap()).collect();
    assert_eq!(bufs.len(), count as usize);
    drop(bufs);
    drop(stack);
    wait_pool_whole(&mgr);
    mgr.stop();
}

/// `FUTEX_OWNER_DIED`: what the kernel leaves in a dead manager's
/// liveness word.
const OWNER_DIED: u32 = 0x4000_0000;

/// One forged 4-byte value in the manager's liveness word made every
/// stack believe the manager dead for the rest of its life: stacks
/// stopped reading their control sockets, the process-wide net attached
/// again and again and new connections were refused. A stack now confirms
/// a death from its control socket, and the manager puts its word back.
#[test]
fn a_forged_liveness_word_does_not_pass_for_the_managers_death() {
    use std::io::{Read, Write};
    setup();
    let p = prefix("liveness");
    let mgr = manager_builder(&p).spawn().unwrap();
    let net = xio_core::net::Net::attach(&p).unwrap();
    let listener = net.listen("10.9.0.1:80").unwrap();
    let probe = Stack::attach(&p).unwrap();
    let word = probe.__segment().manager_alive();
    for forged in [OWNER_DIED, OWNER_DIED | 0x8000_0000] {
        word.store(forged, Ordering::SeqCst);
        assert!(!net.manager_gone(), "a forged word passed for a death");
        // The net still makes connections, which need the manager.
        let mut c = net.connect("10.9.0.1:80").unwrap();
        let (mut s, _) = listener.accept().unwrap();
        c.write_all(b"ping").unwrap();
        let mut got = [0u8; 4];
        s.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"ping");
        assert!(!net.manager_gone());
        // The manager puts its own value back.
        wait_until("the liveness word put back", || {
            word.load(Ordering::SeqCst) & OWNER_DIED == 0
        });
    }
    assert!(mgr.snapshot().liveness_repairs >= 2);
    assert_eq!(
        mgr.snapshot().stacks.len(),
        2,
        "no stack gave its manager up"
    );
    drop((listener, net, probe));
    wait_pool_whole(&mgr);
    mgr.stop();
}

/// A flood of connections that never said Hello pushed legitimate
/// newcomers out (the manager kept 256 and dropped the oldest):
/// `Stack::attach` failed 98 of 100 times, reporting the manager gone.
/// One process may now keep 16 such connections; more are refused, and
/// a full table drops the connections of the process that has most.
#[test]
fn a_flood_of_silent_connections_does_not_keep_stacks_out() {
    setup();
    let p = prefix("flood");
    let mgr = manager_builder(&p).spawn().unwrap();
    let mut flood = ChildProc::spawn("child_main", "flood", std::slice::from_ref(&p));
    flood.expect("flooding");
    for i in 0..50 {
        if let Err(e) = Stack::attach(&p) {
            panic!("attach {i} during the flood: {e}");
        }
    }
    flood.kill9();
    wait_pool_whole(&mgr);
    mgr.stop();
}

/// One process attaching in a loop took every stack slot ("no free stack
/// slot" for everyone else). It may now have all but an eighth (at most
/// 8) of them, is told so past that, and another process still attaches.
#[test]
fn one_process_cannot_take_every_stack_slot() {
    setup();
    let p = prefix("slots");
    let mgr = manager_builder(&p)
        .pool(PoolConfig {
            max_stacks: 16,
            ..PoolConfig::default()
        })
        .spawn()
        .unwrap();
    let mine: Vec<Stack> = (0..14).map(|_| Stack::attach(&p).unwrap()).collect();
    match Stack::attach(&p) {
        Err(Error::Refused {
            code: ErrorCode::NoSpace,
            message,
        }) => assert!(
            message.contains("the most one process may have"),
            "{message}"
        ),
        other => panic!("a 15th stack of one process: {other:?}"),
    }
    let mut other = ChildProc::spawn("child_main", "attach", std::slice::from_ref(&p));
    assert_eq!(other.expect("attached"), "ok");
    other.wait_success();
    drop(mine);
    wait_pool_whole(&mgr);
    mgr.stop();
}

/// A connection that says nothing is dropped after 10 s, told why.
#[test]
fn a_silent_connection_is_told_why_it_is_dropped() {
    use std::os::fd::AsFd;
    setup();
    let p = prefix("silent");
    let mgr = manager_builder(&p).spawn().unwrap();
    let s = xio_core::ctrl::connect(&xio_core::paths::socket_path(&p)).unwrap();
    match xio_core::ctrl::recv(s.as_fd(), false) {
        Ok((
            Msg::Error {
                code: ErrorCode::Busy,
                message,
            },
            _,
        )) => assert!(message.contains("no Hello"), "{message}"),
        other => panic!("{other:?}"),
    }
    mgr.stop();
}

/// A free-list gate held closed by a process that can write the segment
/// made every allocation that needed the shared list wait at full CPU,
/// ignoring its caller's timeout, for good. A wait for a gate now gives
/// up after a bound (a shortage: the caller's own wait and timeout
/// apply), and the manager reopens a gate it finds closed outside a sweep.
#[test]
fn a_gate_held_closed_by_another_process_is_reopened() {
    setup();
    let p = prefix("gate");
    let mgr = manager_builder(&p).spawn().unwrap();
    let stack = Stack::attach(&p).unwrap();
    let seg = stack.__segment();
    for c in 0..seg.classes().len() {
        seg.free_head(c).gate.store(1, Ordering::SeqCst);
    }
    // Not waiting: a shortage, not a dead manager.
    assert!(matches!(stack.try_alloc(1), Err(Error::WouldBlock)));
    // Waiting: served once the manager has reopened the gate.
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let t = {
        let (p, done) = (p.clone(), done.clone());
        std::thread::spawn(move || {
            let s = Stack::attach(&p).unwrap();
            let b = s.alloc(1).unwrap();
            done.store(true, Ordering::SeqCst);
            drop(b);
        })
    };
    wait_until("an allocation behind a forged gate", || {
        done.load(Ordering::SeqCst)
    });
    t.join().unwrap();
    wait_until("the gates counted as reopened", || {
        mgr.snapshot().gate_repairs > 0
    });
    // Open for good (the exit of `t`'s stack may have a sweep close them
    // for a moment meanwhile: wait it out, not the instant).
    wait_until("every gate open", || {
        (0..seg.classes().len()).all(|c| seg.free_head(c).gate.load(Ordering::SeqCst) == 0)
    });
    drop(stack);
    wait_pool_whole(&mgr);
    mgr.stop();
}

/// A published descriptor's sequence number overwritten by a process that
/// can write the segment left its receiver waiting on it for ever, and
/// the channel wedged once the sender filled the ring. The receiver now
/// finds a sequence number neither end could have written and gives the
/// channel up (a reset), counting it as corrupt.
#[test]
fn a_forged_ring_sequence_resets_the_channel_instead_of_wedging_it() {
    let (mgr, mut b, mut a, peer) = manager_and_pair("ringseq", "10.9.1.1:7".parse().unwrap());
    let mut buf = a.alloc(4).unwrap();
    buf.copy_from(b"ping");
    a.send(peer, buf).unwrap();
    // Slot 0's sequence number (word 12 of the ring a writes).
    assert!(a.__scribble_ring(peer, 12, 0xdead_beef).unwrap());
    // A watchdog, not a time bound: before, this waited for ever.
    match b.recv_timeout(WATCHDOG) {
        Err(Error::TimedOut) => panic!("the receiver waited on a forged sequence number"),
        other => drop(other),
    }
    assert!(b.corrupt_descriptors() > 0);
    drop((a, b));
    wait_pool_whole(&mgr);
    mgr.stop();
}

/// A published slot's sequence number forged to its last lap's value (what
/// an unpublished slot holds) made the receiver wait on it, and the
/// sender, once the ring filled, wait for a drain that never came: the
/// channel wedged. The sender now finds, on a full ring, that the slot at
/// the head does not hold what it published there, and resets the
/// channel.
#[test]
fn a_sequence_forged_to_its_last_laps_value_resets_the_channel_instead_of_wedging_it() {
    let (mgr, b, mut a, peer) = manager_and_pair("ringlap", "10.9.1.3:7".parse().unwrap());
    let cap = a.__segment().ring_capacity();
    let mut buf = a.alloc(4).unwrap();
    buf.copy_from(b"ping");
    a.send(peer, buf).unwrap();
    // Slot 0 (word 12) published as 1; its last lap's value is 1 - cap.
    assert!(a.__scribble_ring(peer, 12, 1u32.wrapping_sub(cap)).unwrap());
    // Fill the ring: the sender finds it full and the slot forged.
    let mut sent = 1;
    let err = loop {
        let mut buf = a.alloc(4).unwrap();
        buf.copy_from(b"more");
        match a.try_send(peer, buf) {
            Ok(()) => sent += 1,
            Err((e, _)) => break e,
        }
        assert!(sent <= cap, "more sent than the ring holds");
    };
    assert!(matches!(err, Error::Reset(p) if p == peer), "{err:?}");
    drop((a, b));
    wait_pool_whole(&mgr);
    mgr.stop();
}

/// The consumer's index of a ring, forged to show its producer a full
/// ring, wedged the channel: the consumer, finding nothing to read, never
/// wrote its index again. It now puts its own index back whenever it
/// finds nothing to read.
#[test]
fn a_forged_consumer_index_is_put_back() {
    let (mgr, mut b, mut a, to_b) = manager_and_pair("ringhead", "10.9.1.2:7".parse().unwrap());
    // A ring's worth, one slot each, read: a's cached view of the index
    // is still 0, so its next send reads the shared index.
    let cap = b.__segment().ring_capacity();
    for _ in 0..cap {
        let mut buf = a.alloc(4).unwrap();
        buf.copy_from(b"ping");
        a.send(to_b, buf).unwrap();
    }
    let mut to_a = None;
    for _ in 0..cap {
        to_a = Some(b.recv().unwrap().from);
    }
    let to_a = to_a.unwrap();
    // Written and read: tail and head are `cap`. A head of 0 shows the
    // producer a full ring.
    assert!(b.__scribble_ring(to_a, u32::MAX, 0).unwrap());
    // b looks, finds nothing, and puts its index back.
    assert!(matches!(
        b.recv_timeout(std::time::Duration::ZERO),
        Err(Error::TimedOut)
    ));
    let mut buf = a.alloc(4).unwrap();
    buf.copy_from(b"pong");
    if let Err((e, _)) = a.try_send(to_b, buf) {
        panic!("the ring still looks full: {e}");
    }
    assert_eq!(&b.recv().unwrap().buf[..], b"pong");
    drop((a, b));
    wait_pool_whole(&mgr);
    mgr.stop();
}

/// A sleeper's `sleeping` word cleared by a process that can write the
/// segment: producers ring a stack only if that word says it sleeps, and
/// its sleep has no timer, so it slept for good while its ring filled.
/// The manager now wakes a stack whose ring held something for it for a
/// whole look (every 2 s) with its index unmoved.
#[test]
fn a_cleared_sleeping_word_costs_a_sleeper_its_wake_up_only_for_a_while() {
    let (mgr, mut b, mut a, to_b) = manager_and_pair("sleeping", "10.9.1.3:7".parse().unwrap());
    let b_id = b.id().slot();
    let reader = std::thread::spawn(move || {
        b.set_wait_mode(xio_core::WaitMode::Blocking);
        let m = b.recv().unwrap();
        let got = m.buf.to_vec();
        drop(m);
        (b, got)
    });
    let sleeping = &a.__segment().stack_slot(b_id).sleeping;
    wait_until("b asleep", || {
        sleeping.load(Ordering::SeqCst) == xio_core::layout::SLEEP_FUTEX
    });
    // Forged: b looks awake, so a does not ring it.
    sleeping.store(0, Ordering::SeqCst);
    let mut buf = a.alloc(4).unwrap();
    buf.copy_from(b"ping");
    a.send(to_b, buf).unwrap();
    wait_until("b woken by the manager", || reader.is_finished());
    let (b, got) = reader.join().unwrap();
    assert_eq!(got, b"ping");
    assert!(mgr.snapshot().nudges >= 1);
    drop((a, b));
    wait_pool_whole(&mgr);
    mgr.stop();
}

/// A listener that accepted 10,000 connections and never read drained
/// every class of the pool (1-byte writes landed in ever larger buffers
/// as the small ones ran out), and everyone else's traffic stopped until
/// that process exited. What a writer sent and its reader has not read
/// now counts against the writer's quota of each class (half of it by
/// default): the writes stop there, and the rest of the pool serves the
/// others.
#[test]
fn connections_nobody_reads_cannot_take_the_pool_from_everyone() {
    use std::io::{Read, Write};
    setup();
    if test_backend() != xio_core::manager::Backend::Shm {
        return; // quotas are the shm pool's
    }
    let p = prefix("unread");
    let classes = vec![(2 << 10, 512), (64 << 10, 16), (1 << 20, 4)];
    let mgr = manager_builder(&p)
        .pool(PoolConfig {
            classes: classes.clone(),
            max_stacks: 8,
            max_channels: 8,
            ..PoolConfig::default()
        })
        .spawn()
        .unwrap();
    let hog = xio_core::net::Net::attach(&p).unwrap();
    let flood = xio_core::net::Net::attach(&p).unwrap();
    let l = hog.listen("10.77.0.1:80").unwrap();
    let (mut written, mut refused) = (0, 0);
    let mut keep = Vec::new();
    for _ in 0..10_000 {
        let s = flood.connect("10.77.0.1:80").unwrap();
        let (a, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        match (&s).write(b"x") {
            Ok(1) => written += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => refused += 1,
            r => panic!("write: {r:?}"),
        }
        keep.push((s, a));
    }
    eprintln!("10,000 connections: {written} writes went, {refused} would block");
    // Stopped at its quotas: half of each class, give or take what the
    // stacks keep cached.
    let quotas: u32 = classes.iter().map(|c| c.1.div_ceil(2)).sum();
    assert!(
        written <= quotas as usize,
        "{written} writes pinned buffers"
    );
    assert!(refused >= 10_000 - quotas as usize, "{refused}");
    let usage = mgr.usage();
    let flood_id = usage[0]
        .by_charge
        .iter()
        .max_by_key(|(_, n)| *n)
        .map(|(id, _)| *id)
        .unwrap();
    for u in &usage {
        let charged = u
            .by_charge
            .iter()
            .find(|(id, _)| *id == flood_id)
            .map_or(0, |c| c.1);
        assert!(
            charged <= u.quota,
            "class {}: {charged} of {}",
            u.buf_size,
            u.quota
        );
        assert!(
            u.free >= u.total - u.quota - u.total / 8,
            "class {}: {u:?}",
            u.buf_size
        );
    }
    // The metrics count the writes refused at the quota.
    let metrics = mgr.metrics().render();
    let line = metrics
        .lines()
        .find(|l| l.starts_with(&format!("xio_stack_quota_full_total{{stack=\"{flood_id}\"")))
        .unwrap_or_else(|| panic!("no quota_full line for {flood_id}:\n{metrics}"));
    let refusals: u64 = line.rsplit(' ').next().unwrap().parse().unwrap();
    assert!(refusals >= refused as u64, "{line}");
    // The status report shows the writer's charge against its quota.
    let status = xio_core::manager::query_status(&p).unwrap();
    assert!(
        status.contains(&format!("stack {flood_id}"))
            && status.contains(&format!(
                "2048 B {}/256",
                usage[0]
                    .by_charge
                    .iter()
                    .find(|c| c.0 == flood_id)
                    .unwrap()
                    .1
            ))
            && status.contains("quota 256 per stack"),
        "{status}"
    );
    // Everyone else still talks: another pair, 1 KiB each way, and a
    // 256 KiB message that needs the large classes.
    let a = xio_core::net::Net::attach(&p).unwrap();
    let b = xio_core::net::Net::attach(&p).unwrap();
    let l2 = b.listen("10.77.0.2:80").unwrap();
    let mut c = a.connect("10.77.0.2:80").unwrap();
    let (mut s, _) = l2.accept().unwrap();
    let big = vec![7u8; 256 << 10];
    for i in 0..200 {
        let msg = if i == 100 { &big[..] } else { &big[..1024] };
        c.write_all(msg).unwrap();
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).unwrap();
        s.write_all(&got).unwrap();
        c.read_exact(&mut got).unwrap();
        assert_eq!(got, msg);
    }
    // The reader reads at last: the writer's quota comes back.
    let mut one = [0u8; 1];
    for (_, a) in keep.iter_mut().take(written) {
        assert_eq!(a.read(&mut one).unwrap(), 1);
    }
    {
        let (w, _) = &keep[written];
        w.set_nonblocking(false).unwrap();
        (&*w).write_all(b"y").unwrap();
    }
    drop((keep, c, s, l, l2));
    drop((hog, flood, a, b));
    wait_pool_whole(&mgr);
}

/// A zero-copy receiver reads its sender's buffer in place, and the
/// sender (or any process that can write the pool) can still change it
/// after sending. In copy-on-receive mode the receiver reads a copy in
/// its own memory, and the pool buffer is back at once.
#[test]
fn copy_on_receive_keeps_what_was_received_from_changing() {
    let addr = "10.77.1.1:7".parse().unwrap();
    let (mgr, mut server, client, peer) = manager_and_pair("copyrecv", addr);
    let mut client = client;
    for copy in [false, true] {
        server.set_copy_on_receive(copy);
        assert_eq!(server.copies_on_receive(), copy);
        let mut b = client.alloc(64).unwrap();
        b.set_len(4);
        b.copy_from_slice(b"sent");
        let p = b.as_mut_ptr();
        client.send(peer, b).unwrap();
        let m = server.recv().unwrap();
        // The sender writes the buffer it sent, as a hostile one would.
        // SAFETY: `p` is in the pool's mapping, which the stacks keep
        // mapped; nothing else runs on it meanwhile.
        unsafe { std::ptr::copy_nonoverlapping(b"CHG!".as_ptr(), p, 4) };
        let want: &[u8] = if copy { b"sent" } else { b"CHG!" };
        assert_eq!(&m.buf[..], want, "copy on receive {copy}");
        // Sent back as it came (the forwarder pattern), in either mode: a
        // private copy goes into a pool buffer first.
        let mut w = m.buf.into_mut();
        w.copy_from_slice(b"back");
        server.send(m.from, w).unwrap();
        assert_eq!(&client.recv().unwrap().buf[..], b"back");
    }
    drop((server, client));
    wait_pool_whole(&mgr);
}

/// The socket layer's zero-copy read (`recv_buf`) hands over the pool
/// buffer its sender wrote; in copy-on-receive mode it hands over a copy,
/// and the pool buffer is back at once (none is held in the receiver's
/// name while it keeps what it read).
#[test]
fn a_sockets_zero_copy_read_in_copy_on_receive_mode_is_a_copy() {
    use std::io::Write;
    setup();
    let p = prefix("copyrecvnet");
    let mgr = manager_builder(&p).spawn().unwrap();
    let probe = Stack::attach(&p).unwrap();
    for (i, copy) in [false, true].into_iter().enumerate() {
        let rx = xio_core::net::Net::builder(&p)
            .copy_on_receive(copy)
            .attach()
            .unwrap();
        let tx = xio_core::net::Net::attach(&p).unwrap();
        let addr = format!("10.77.2.{}:7", i + 1);
        let l = rx.listen(addr.as_str()).unwrap();
        let mut c = tx.connect(addr.as_str()).unwrap();
        let (s, _) = l.accept().unwrap();
        c.write_all(b"sent").unwrap();
        let b = s.recv_buf().unwrap().expect("a chunk");
        assert_eq!(&b[..], b"sent");
        let held = owned_in_state(probe.__segment(), rx.stack_id().slot(), bufword::HELD);
        assert_eq!(held, usize::from(!copy), "copy on receive {copy}");
        // Sent back as it came (an echo), in either mode.
        let mut w = b.into_mut();
        w.copy_from_slice(b"back");
        s.send_buf(w).map_err(|(e, _)| e).unwrap();
        let mut back = [0u8; 4];
        std::io::Read::read_exact(&mut c, &mut back).unwrap();
        assert_eq!(&back, b"back");
        drop((s, c, l, rx, tx));
    }
    drop(probe);
    wait_pool_whole(&mgr);
    mgr.stop();
}

/// A stack that registers in the slot of one that died is another peer:
/// the reset still queued for the dead one names the dead one (before
/// generations it named the slot, and an application, or the socket
/// layer, took it for the newcomer's), a send to the dead one's id is
/// reset instead of reaching the newcomer, and what the dead one sent and
/// a peer still holds is charged to that peer, not to the slot's newcomer.
#[test]
fn a_stack_in_a_dead_ones_slot_inherits_neither_its_reset_nor_its_buffers() {
    setup();
    let p = prefix("generations");
    // Two slots: the newcomer can only get the dead one's.
    let mgr = manager_builder(&p)
        .pool(PoolConfig {
            classes: vec![(2 << 10, 64)],
            max_stacks: 2,
            max_channels: 2,
            ..PoolConfig::default()
        })
        .spawn()
        .unwrap();
    let addr: std::net::SocketAddr = "10.9.2.1:7".parse().unwrap();
    let mut a = Stack::attach(&p).unwrap();
    let mut b = Stack::attach(&p).unwrap();
    b.bind(addr).unwrap();
    let old = a.connect(addr).unwrap();
    assert_eq!(old, b.id());
    let mut hi = a.alloc(2).unwrap();
    hi.copy_from(b"hi");
    a.send(old, hi).unwrap();
    let m = b.recv().unwrap();
    for _ in 0..3 {
        let mut r = b.alloc(5).unwrap();
        r.copy_from(b"reply");
        b.send(m.from, r).unwrap();
    }
    drop(m);
    let kept: Vec<_> = (0..3).map(|_| a.recv().unwrap()).collect();
    assert!(kept.iter().all(|m| m.from == old && &m.buf[..] == b"reply"));
    drop(b);

    // `a` reads the news (a connect looks first) and releases the channel;
    // then the slot is free.
    wait_until("the dead stack's binding gone", || {
        matches!(a.connect(addr), Err(Error::Refused { .. }))
    });
    let mut b2 = None;
    wait_until("the dead stack's slot free", || {
        match Stack::attach(&p) {
            Ok(s) => b2 = Some(s),
            Err(Error::Refused {
                code: ErrorCode::NoSpace,
                ..
            }) => {}
            Err(e) => panic!("{e}"),
        }
        b2.is_some()
    });
    let mut b2 = b2.unwrap();
    assert_eq!(b2.id().slot(), old.slot(), "the dead one's slot");
    assert_ne!(b2.id(), old, "with another generation");
    b2.bind(addr).unwrap();
    let new = a.connect(addr).unwrap();
    assert_eq!(new, b2.id());

    // The reset queued for the dead one names it, not the newcomer.
    match a.recv_timeout(WATCHDOG) {
        Err(Error::Reset(gone)) => assert_eq!(gone, old),
        other => panic!("expected the dead one's reset: {other:?}"),
    }
    // A send to the dead one's id does not reach the newcomer.
    let mut stale = a.alloc(5).unwrap();
    stale.copy_from(b"stale");
    match a.send(old, stale) {
        Err(Error::Reset(p)) => assert_eq!(p, old),
        other => panic!("a send to the dead one's id: {other:?}"),
    }
    let mut fresh = a.alloc(5).unwrap();
    fresh.copy_from(b"fresh");
    a.send(new, fresh).unwrap();
    let m = b2.recv_timeout(WATCHDOG).unwrap();
    assert_eq!((&m.buf[..], m.from), (&b"fresh"[..], a.id()));
    drop(m);

    // What `a` keeps of the dead one's sends is charged to `a`, nothing
    // to the slot's newcomer (which then owns and sent nothing).
    let charge = |id: u16| -> u32 {
        mgr.usage()
            .iter()
            .flat_map(|u| u.by_charge.iter())
            .filter(|(o, _)| *o == id)
            .map(|(_, n)| n)
            .sum()
    };
    assert_eq!(charge(b2.id().slot()), 0, "{:?}", mgr.usage());
    assert_eq!(charge(a.id().slot()), 3, "{:?}", mgr.usage());
    drop(kept);
    drop((a, b2));
    wait_pool_whole(&mgr);
    mgr.stop();
}

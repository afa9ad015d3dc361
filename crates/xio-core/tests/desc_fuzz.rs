//! Deterministic fuzzing of what a hostile peer can put in front of a
//! receiver. A real second process connects to the victim and sends it
//! random and mutated descriptors (every field at its boundaries and at
//! random; descriptors naming buffers it does not own, buffers the victim
//! holds, buffers in flight between others, the same buffer again), sends
//! real buffers after scribbling on their headers, and scribbles on the
//! ring words its side can write (its ring's slots, sequence numbers and
//! counts; the index it consumes the victim's ring at). Meanwhile a
//! well-behaved peer talks to the victim, which receives through its
//! zero-copy paths (`recv`, `recv_burst`, `recv_burst_with`) in one test
//! and through its socket layer in the other. The victim must never crash,
//! hang, lose or misattribute the good peer's data, or hand out one buffer
//! twice; it counts what it refuses; once the hostile process is killed
//! (SIGKILL) it still talks to a newcomer, and once everyone left the pool
//! is whole.
//!
//! `XIO_FUZZ_SEED` (decimal or `0x` hex) picks the run and
//! `XIO_FUZZ_ITERS` its length (hostile actions); both are printed so a
//! failure replays with the same values.

mod common;

use common::seeded::{env_u64, Rng};
use common::*;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use xio_core::layout::{bufword, kind, Descriptor, MAX_CLASSES, NO_CLASS};
use xio_core::prelude::*;

const DEFAULT_SEED: u64 = 0x5eed_d15c_f00d_0001;
/// Hostile actions a run: a few seconds in a debug build.
const DEFAULT_ITERS: u64 = 4_000;
/// Bits of a socket connection id below its generation (see `conn.rs`).
const INDEX_BITS: u32 = 20;
/// The tag of the one message the hostile process's last, well-behaved
/// stack sends before it is killed.
const LAST_TAG: u32 = 0x1a57_0001;
/// That message's payload.
const LAST_BYTES: [u8; 64] = [0x5a; 64];

/// The run's seed and length, printed for replay.
fn fuzz_params(test: &str) -> (u64, u64) {
    let seed = env_u64("XIO_FUZZ_SEED").unwrap_or(DEFAULT_SEED);
    let iters = env_u64("XIO_FUZZ_ITERS").unwrap_or(DEFAULT_ITERS);
    eprintln!("{test}: XIO_FUZZ_SEED={seed:#x} XIO_FUZZ_ITERS={iters}");
    (seed, iters)
}

/// The hostile process, attacking `addr` on pool `p` (`mode`: "zero-copy"
/// or "sockets").
fn spawn_hostile(p: &str, addr: SocketAddr, seed: u64, iters: u64, mode: &str) -> ChildProc {
    let args = [
        p.to_owned(),
        addr.to_string(),
        seed.to_string(),
        iters.to_string(),
        mode.into(),
    ];
    ChildProc::spawn("child_main", "hostile", &args)
}

#[test]
fn child_main() {
    let Some((role, a)) = child_role() else {
        return;
    };
    match role.as_str() {
        "hostile" => hostile(
            &a[0],
            a[1].parse().unwrap(),
            a[2].parse().unwrap(),
            a[3].parse().unwrap(),
            a[4] == "sockets",
        ),
        r => panic!("unknown role {r}"),
    }
}

/// What the hostile process knows of the pool: every class's size and
/// count, read from the segment.
struct Shape {
    classes: Vec<(u32, u32)>,
}

impl Shape {
    /// A descriptor with every field drawn at random or at a boundary.
    fn forged(&self, rng: &mut Rng, sockets: bool) -> Descriptor {
        let n = self.classes.len() as u32;
        let class = match rng.below(4) {
            0 => rng.pick(&[n - 1, n, MAX_CLASSES as u32 - 1, MAX_CLASSES as u32, 0x7f]) as u8,
            1 => NO_CLASS,
            2 => rng.next() as u8,
            _ => rng.below(n as u64) as u8,
        };
        let (size, count) = self
            .classes
            .get(class as usize)
            .copied()
            .unwrap_or((2048, 8192));
        Descriptor {
            index: if rng.one_in(2) {
                rng.below(count as u64) as u32
            } else {
                rng.u32_near(&[count, count / 2])
            },
            len: if rng.one_in(2) {
                rng.below(size as u64 + 1) as u32
            } else {
                rng.u32_near(&[size, size * 2])
            },
            conn: self.conn(rng, sockets),
            class,
            kind: any_kind(rng),
            gen: rng.u32_near(&[0x1_0000]) as u16,
        }
    }

    /// A connection id: small and generation-tagged ones name the
    /// victim's real connections, the rest are noise.
    fn conn(&self, rng: &mut Rng, sockets: bool) -> u32 {
        match rng.below(if sockets { 4 } else { 2 }) {
            0 => rng.u32_near(&[1 << INDEX_BITS]),
            1 => rng.next() as u32,
            2 => rng.below(16) as u32,
            _ => ((rng.below(4) as u32) << INDEX_BITS) | rng.below(16) as u32,
        }
    }
}

/// Any kind byte: mostly the known ones, with and without the early flag.
fn any_kind(rng: &mut Rng) -> u8 {
    match rng.below(4) {
        0 => rng.next() as u8,
        _ => rng.below(8) as u8 | if rng.one_in(3) { kind::EARLY } else { 0 },
    }
}

/// Header words of the buffers of `class` in `seg`.
fn words(seg: &xio_core::segment::Segment, class: usize) -> impl Iterator<Item = (u32, u64)> + '_ {
    let count = seg.classes()[class].count;
    (0..count).map(move |i| {
        let w = seg
            .buf_header(class, i)
            .unwrap()
            .word
            .load(Ordering::Acquire);
        (i, w)
    })
}

/// Pushes `d`, waiting a little while the ring is full (a victim that
/// reads slowly); gives up after a while rather than hang, as
/// [`Error::WouldBlock`] (a ring our own scribbles wedged, say).
fn push(evil: &mut Stack, to: PeerId, d: Descriptor) -> Result<(), Error> {
    for _ in 0..100 {
        if evil.__push_raw(to, d)? {
            return Ok(());
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Err(Error::WouldBlock)
}

/// Sends `b` under `k`/`conn`; a full ring drops it (back to the pool).
fn push_buf(evil: &mut Stack, to: PeerId, k: u8, conn: u32, mut b: BufMut) -> Result<(), Error> {
    for _ in 0..100 {
        match evil.__push_buf_raw(to, k, conn, b)? {
            None => return Ok(()),
            Some(back) => b = back,
        }
        std::thread::sleep(Duration::from_micros(200));
    }
    Err(Error::WouldBlock)
}

/// Child role: the hostile peer. Says `ready`, runs `iters` actions drawn
/// from `seed`, says `done`, then waits to be killed.
fn hostile(prefix: &str, addr: SocketAddr, seed: u64, iters: u64, sockets: bool) {
    let mut evil = Stack::builder(prefix).name("hostile").attach().unwrap();
    let mut victim = evil.connect(addr).unwrap();
    let mut me = evil.id().slot();
    let seg = evil.__segment().clone();
    let shape = Shape {
        classes: seg
            .classes()
            .iter()
            .map(|c| (c.buf_size, c.count))
            .collect(),
    };
    let SocketAddr::V4(v4) = addr else {
        unreachable!("an IPv4 address")
    };
    let ip = u32::from(*v4.ip());
    println!("XIO:ready");
    let mut rng = Rng(seed ^ 0x0bad_5eed);
    let mut reconnects = 0u64;
    let mut wedged = 0u64;
    for _ in 0..iters {
        let r = match rng.below(100) {
            // Forged fields, sometimes the same one again.
            0..=34 => {
                let d = shape.forged(&mut rng, sockets);
                let mut r = push(&mut evil, victim, d);
                while r.is_ok() && rng.one_in(4) {
                    r = push(&mut evil, victim, d);
                }
                r
            }
            // A descriptor naming a real buffer, by what its header says
            // (in flight to the victim from anyone, held by it, in flight
            // to another stack, free, someone's), the rest mutated.
            35..=54 => {
                let class = rng.below(shape.classes.len() as u64) as usize;
                let want = rng.below(5);
                let victim_id = victim.slot();
                let found: Vec<(u32, u64)> = words(&seg, class)
                    .filter(|&(_, w)| {
                        let (s, o) = (bufword::state(w), bufword::owner(w));
                        match want {
                            0 => s == bufword::INFLIGHT && o == victim_id,
                            1 => s == bufword::HELD && o == victim_id,
                            2 => s == bufword::INFLIGHT && o != victim_id,
                            3 => s == bufword::FREE || s == bufword::CACHED,
                            _ => s == bufword::ALLOCATED || (s == bufword::HELD && o != victim_id),
                        }
                    })
                    .collect();
                if found.is_empty() {
                    Ok(())
                } else {
                    let (index, w) = found[rng.below(found.len() as u64) as usize];
                    let size = shape.classes[class].0;
                    let mut d = Descriptor {
                        index,
                        len: rng.below(size as u64 + 1) as u32,
                        conn: shape.conn(&mut rng, sockets),
                        class: class as u8,
                        kind: if rng.one_in(3) {
                            any_kind(&mut rng)
                        } else if sockets {
                            rng.pick(&[kind::STREAM, kind::STREAM | kind::EARLY, kind::SYN])
                        } else {
                            kind::DATA
                        },
                        gen: bufword::gen(w) as u16,
                    };
                    match rng.below(6) {
                        0 => d.gen = d.gen.wrapping_add(1),
                        1 => d.len = rng.u32_near(&[size]),
                        2 => d.index ^= 1,
                        _ => {}
                    }
                    let mut r = push(&mut evil, victim, d);
                    while r.is_ok() && rng.one_in(3) {
                        r = push(&mut evil, victim, d);
                    }
                    r
                }
            }
            // A real buffer of ours under any kind and connection.
            55..=69 => {
                let len = rng.pick(&[0usize, 1, 64, 2048, 2049, 65_536]);
                // Not `alloc`: with the pool dry (our own wasted buffers,
                // the victim's receive queues) it would wait for good.
                match evil.try_alloc(len) {
                    Ok(mut b) => {
                        b.as_full_mut().fill(0xa5);
                        let k = if sockets && rng.one_in(2) {
                            kind::STREAM | kind::EARLY
                        } else {
                            any_kind(&mut rng)
                        };
                        let conn = if k & kind::EARLY != 0 {
                            rng.below(16) as u32
                        } else {
                            shape.conn(&mut rng, sockets)
                        };
                        push_buf(&mut evil, victim, k, conn, b)
                    }
                    // The pool is dry: nothing to send this time.
                    Err(Error::WouldBlock) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            // A buffer of ours whose header we scribble on first, then
            // send (the handle is forgotten: the header no longer says
            // it is ours).
            70..=79 => match evil.try_alloc(64) {
                Ok(b) => {
                    let mine: Vec<u32> = words(&seg, 0)
                        .filter(|&(_, w)| {
                            bufword::state(w) == bufword::ALLOCATED && bufword::owner(w) == me
                        })
                        .map(|(i, _)| i)
                        .collect();
                    if let [index] = mine[..] {
                        let h = seg.buf_header(0, index).unwrap();
                        let old = h.word.load(Ordering::Relaxed);
                        let state = match rng.below(3) {
                            0 => bufword::INFLIGHT,
                            1 => rng.below(6) as u8,
                            _ => rng.next() as u8,
                        };
                        let owner = rng.pick(&[me, victim.slot(), 0]);
                        let gen = if rng.one_in(2) {
                            bufword::gen(old)
                        } else {
                            rng.next() as u32 & 0xff_ffff
                        };
                        let noise = rng.next() as u16;
                        let from = rng.pick(&[me, victim.slot(), 0, noise]);
                        h.word.store(
                            bufword::pack_from(state, owner, from, gen),
                            Ordering::Release,
                        );
                        std::mem::forget(b);
                        let d = Descriptor {
                            index,
                            len: rng.below(65) as u32,
                            conn: shape.conn(&mut rng, sockets),
                            class: 0,
                            kind: if rng.one_in(2) {
                                kind::DATA
                            } else {
                                any_kind(&mut rng)
                            },
                            gen: bufword::gen(old) as u16,
                        };
                        push(&mut evil, victim, d)
                    } else {
                        Ok(())
                    }
                }
                Err(Error::WouldBlock) => Ok(()),
                Err(e) => Err(e),
            },
            // The socket layer's control descriptors: SYNs to the
            // listener and elsewhere, credits, FINs, RSTs, SYN-ACKs.
            80..=89 => {
                let k = rng.pick(&[
                    kind::SYN4,
                    kind::SYN4,
                    kind::SYN_ACK,
                    kind::FIN,
                    kind::FIN | kind::EARLY,
                    kind::RST,
                    kind::RST | kind::EARLY,
                    kind::CREDIT,
                ]);
                let early = k & kind::EARLY != 0 || k == kind::SYN4;
                let d = Descriptor {
                    index: match k {
                        kind::SYN4 if rng.one_in(2) => ip,
                        kind::SYN4 | kind::SYN_ACK | kind::CREDIT => rng.u32_near(&[ip]),
                        _ => rng.u32_near(&[kind::RST_ENDS]),
                    },
                    len: if k == kind::SYN4 && rng.one_in(2) {
                        u32::from(addr.port())
                    } else {
                        rng.u32_near(&[u32::from(addr.port()), 1 << 16])
                    },
                    conn: if early {
                        rng.below(16) as u32
                    } else {
                        shape.conn(&mut rng, sockets)
                    },
                    class: rng.next() as u8,
                    kind: k,
                    gen: rng.next() as u16,
                };
                push(&mut evil, victim, d)
            }
            // Reads what the victim sent (or not: a peer that never reads
            // fills the victim's ring).
            90..=94 => {
                for _ in 0..rng.below(64) {
                    match evil.recv_timeout(Duration::ZERO) {
                        Ok(_) | Err(Error::TimedOut) | Err(Error::WouldBlock) => {}
                        Err(e) => {
                            let _ = e;
                            break;
                        }
                    }
                }
                Ok(())
            }
            // The ring words our side writes: a slot's descriptors,
            // sequence number or count (near the slots in use), or the
            // index we read the victim's ring at.
            _ => {
                let word = if rng.one_in(4) {
                    u32::MAX
                } else {
                    rng.below(1 << 16) as u32
                };
                let value = match word % 16 {
                    12 => rng.u32_near(&[word / 16 + 1, word / 16]),
                    13 => rng.u32_near(&[1, 3, 4]),
                    _ => rng.u32_near(&[]),
                };
                evil.__scribble_ring(victim, word, value).map(|_| ())
            }
        };
        match r {
            Ok(()) => {}
            // The ring stayed full: our own scribbles wedged it (a
            // sequence number the victim waits on for ever, say). Come
            // back as a new stack; the victim drops the old channel.
            Err(Error::WouldBlock) => {
                wedged += 1;
                evil = Stack::builder(prefix).name("hostile").attach().unwrap();
                me = evil.id().slot();
                victim = evil.connect(addr).unwrap();
            }
            // The victim gave the channel up (a ring it found corrupt), or
            // the manager closed it: connect again and go on.
            Err(Error::Reset(_) | Error::NotConnected(_) | Error::Protocol(_)) => {
                reconnects += 1;
                let _ = evil.recv_timeout(Duration::ZERO);
                victim = loop {
                    match evil.connect(addr) {
                        Ok(v) => break v,
                        Err(_) => {
                            let _ = evil.recv_timeout(Duration::from_millis(1));
                        }
                    }
                };
            }
            Err(e) => panic!("hostile: {e}"),
        }
    }
    // The last actions may have left our channel corrupt without our
    // knowing: the victim then resets it on its own, and our death has no
    // channel left to be reported on. A last stack, well-behaved, gives
    // the death a channel the test can wait on; it sends one message,
    // which the victim must read before it reports the reset.
    let mut last = Stack::builder(prefix)
        .name("hostile-last")
        .attach()
        .unwrap();
    let to = last.connect(addr).unwrap();
    if !sockets {
        let mut b = last.alloc(LAST_BYTES.len()).unwrap();
        b.copy_from(&LAST_BYTES);
        last.send_tagged(to, LAST_TAG, b).unwrap();
    }
    let me_last = last.id().slot();
    println!("XIO:done {me_last} {reconnects} {wedged} {me}");
    let _keep = (evil, last);
    loop {
        std::thread::park();
    }
}

/// Zero-copy victim: a stack bound to the address receives from a good
/// peer (checksummed, numbered messages, some echoed back) and from the
/// hostile process, through `recv`, `recv_burst` and `recv_burst_with`
/// in turn, holding some of what it gets for a while.
#[test]
fn a_hostile_peer_cannot_hurt_a_zero_copy_receiver() {
    let (seed, iters) = fuzz_params("zero-copy");
    setup();
    let p = prefix("fuzz-zc");
    let mgr = manager_builder(&p).spawn().unwrap();
    let addr: SocketAddr = "10.7.0.1:9000".parse().unwrap();
    let mut victim = Stack::builder(&p)
        .name("victim")
        .wait_mode(WaitMode::NonBlocking)
        .attach()
        .unwrap();
    victim.bind(addr).unwrap();

    let mut good = Stack::attach(&p).unwrap();
    let good_id = good.id().slot();
    let good_to = good.connect(addr).unwrap();
    let stop_good = Arc::new(AtomicBool::new(false));
    let sent = Arc::new(AtomicU64::new(0));
    let good_thread = {
        let (stop, sent) = (stop_good.clone(), sent.clone());
        std::thread::spawn(move || {
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let mut b = good.alloc(size_of_small(seq)).unwrap();
                fill(&mut b, seq);
                good.send_tagged(good_to, seq as u32, b).unwrap();
                seq += 1;
                sent.store(seq, Ordering::Release);
                // The victim's echoes: read and dropped.
                while good.recv_timeout(Duration::ZERO).is_ok() {}
                if seq % 64 == 0 {
                    std::thread::sleep(Duration::from_micros(200));
                }
            }
            good
        })
    };

    let mut evil = spawn_hostile(&p, addr, seed, iters, "zero-copy");
    evil.expect("ready");

    let mut check = Check {
        good_id,
        next_good: 0,
        held: Default::default(),
        from_hostile: 0,
        last_from: Vec::new(),
    };
    let mut rng = Rng(seed ^ 0x0007_1c71);
    let mut resets = 0u64;
    // Receives by a path drawn at random until `done` says so.
    // Receives once, by a path drawn at random; returns the peer whose
    // reset it met (never the good one).
    let mut receive = |victim: &mut Stack, check: &mut Check| -> Option<u16> {
        let r = match rng.below(3) {
            0 => victim
                .recv_timeout(Duration::from_millis(5))
                .map(|m| check.take(victim, m)),
            1 => {
                let mut out = Vec::new();
                let r = victim.recv_burst(&mut out, 1 + rng.below(40) as usize);
                for m in out {
                    check.take(victim, m);
                }
                r.map(|_| ())
            }
            _ => victim
                .recv_burst_with(1 + rng.below(40) as usize, |from, tag, p| {
                    check.shown(from, tag, p)
                })
                .map(|_| ()),
        };
        match r {
            Ok(()) | Err(Error::TimedOut | Error::WouldBlock) => None,
            Err(Error::Reset(p)) if p.slot() != good_id => Some(p.slot()),
            Err(e) => panic!("victim: {e}"),
        }
    };
    // The attack: receive until the hostile process is through (it says
    // so on its own thread's pipe; we look between receives).
    let (done_tx, done_rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let said = evil.expect("done");
        done_tx.send(said).unwrap();
        evil
    });
    let said = loop {
        if receive(&mut victim, &mut check).is_some() {
            resets += 1;
        }
        match done_rx.try_recv() {
            Ok(said) => break said,
            Err(std::sync::mpsc::TryRecvError::Empty) => {}
            Err(e) => panic!("the hostile process never finished: {e}"),
        }
    };
    let mut evil = waiter.join().unwrap();
    let rejected = victim.corrupt_descriptors();
    eprintln!(
        "zero-copy: {} messages from the hostile peer taken, {rejected} descriptors \
         refused, {resets} channel resets, hostile (last id, reconnects, new stacks, attacking id) {said}, {} good messages",
        check.from_hostile, check.next_good
    );
    assert!(
        rejected > 0,
        "nothing was refused: the fuzzing did not reach the checks"
    );
    evil.kill9();
    // The hostile process's death is reported on its last stack's
    // channel (the others' may be gone already: the victim resets a
    // channel it finds corrupt), once what that stack sent is read.
    let hostile: u16 = said.split(' ').next().unwrap().parse().unwrap();
    wait_until("the hostile peer reported gone", || {
        receive(&mut victim, &mut check) == Some(hostile)
    });
    assert!(
        check.last_from.contains(&hostile),
        "the hostile's last message was not read before its reset (last tags from {:?})",
        check.last_from
    );
    // Every message of the good peer arrives, in order and intact.
    stop_good.store(true, Ordering::Relaxed);
    // Received meanwhile: its last send may wait for room in the ring
    // (a join alone deadlocked there).
    while !good_thread.is_finished() {
        receive(&mut victim, &mut check);
        std::thread::yield_now();
    }
    let good = good_thread.join().unwrap();
    let total = sent.load(Ordering::Acquire);
    wait_until("every good message received", || {
        receive(&mut victim, &mut check);
        check.next_good == total
    });
    check.held.clear();
    // A newcomer is served both ways.
    let mut fresh = Stack::attach(&p).unwrap();
    let to = fresh.connect(addr).unwrap();
    let mut b = fresh.alloc(100).unwrap();
    fill(&mut b, 7);
    fresh.send(to, b).unwrap();
    let m = victim.recv_timeout(WATCHDOG).unwrap();
    assert!(verify(&m.buf, 7) && m.buf.len() == 100);
    victim.send(m.from, m.buf.into_mut()).unwrap();
    let back = fresh.recv_timeout(WATCHDOG).unwrap();
    assert!(verify(&back.buf, 7));
    drop(back);
    drop((victim, good, fresh));
    wait_pool_whole(&mgr);
}

/// What the zero-copy victim checks of each message.
struct Check {
    good_id: u16,
    next_good: u64,
    /// Messages of the hostile peer the test holds a while.
    held: std::collections::VecDeque<Message>,
    from_hostile: u64,
    /// Senders of the messages tagged [`LAST_TAG`] with [`LAST_BYTES`].
    last_from: Vec<u16>,
}

impl Check {
    /// A message with its buffer: checked, then kept, echoed or dropped.
    fn take(&mut self, victim: &mut Stack, m: Message) {
        assert!(m.buf.len() <= m.buf.capacity());
        if m.from.slot() == self.good_id {
            self.shown(m.from, m.tag, &m.buf);
            if self.next_good % 8 == 0 {
                let _ = victim.try_send(m.from, m.buf.into_mut());
            }
            return;
        }
        self.shown(m.from, m.tag, &m.buf);
        // No buffer is handed out twice: none of those held has the same
        // payload address.
        let at = m.buf.as_ptr();
        let live: HashSet<*const u8> = self.held.iter().map(|h| h.buf.as_ptr()).collect();
        assert!(!live.contains(&at), "a buffer handed out twice");
        self.held.push_back(m);
        if self.held.len() > 16 || (self.from_hostile % 3 == 0) {
            self.held.pop_front();
        }
    }

    /// A payload, shown or taken: the good peer's are numbered in order
    /// and checksummed; the hostile peer's are read through.
    fn shown(&mut self, from: PeerId, tag: u32, p: &[u8]) {
        if from.slot() == self.good_id {
            assert_eq!(
                tag, self.next_good as u32,
                "the good peer's message {} lost or misattributed",
                self.next_good
            );
            assert!(
                verify(p, self.next_good),
                "good message {} corrupted",
                self.next_good
            );
            self.next_good += 1;
        } else {
            self.from_hostile += 1;
            if tag == LAST_TAG && p == LAST_BYTES {
                self.last_from.push(from.slot());
            }
            std::hint::black_box(p.iter().fold(0u8, |a, &b| a.wrapping_add(b)));
        }
    }
}

/// Message sizes of the good zero-copy peer: all in the smallest class,
/// where the hostile process looks for buffers in flight.
fn size_of_small(i: u64) -> usize {
    8 + (i as usize * 37) % 2000
}

/// Socket victim: a listener whose accepted streams echo, a good client
/// whose checked exchanges go on throughout, and the hostile process
/// sending stream, SYN, FIN, RST, credit and SYN-ACK descriptors (to real
/// connections and made-up ones) besides the rest.
#[test]
fn a_hostile_peer_cannot_hurt_a_socket_server() {
    use std::io::{Read, Write};
    use xio_core::net::{Net, XioStream};
    let (seed, iters) = fuzz_params("sockets");
    setup();
    let p = prefix("fuzz-sock");
    let mgr = manager_builder(&p).spawn().unwrap();
    let addr: SocketAddr = "10.7.0.2:9001".parse().unwrap();
    let server = Net::attach(&p).unwrap();
    let l = server.listen(addr).unwrap();
    l.set_nonblocking(true).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    // Echoes each accepted stream until the stop.
    let acceptor = {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut handlers = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let s = match l.accept() {
                    Ok((s, _)) => s,
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(1));
                        continue;
                    }
                    Err(e) => panic!("accept: {e}"),
                };
                let stop = stop.clone();
                handlers.push(std::thread::spawn(move || {
                    let mut s: XioStream = s;
                    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                    // Writes wait: a hostile stream that never reads is
                    // reset when its process dies.
                    let mut buf = vec![0u8; 1 << 16];
                    while !stop.load(Ordering::Relaxed) {
                        match s.read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => {
                                if s.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                            Err(e)
                                if matches!(
                                    e.kind(),
                                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                                ) => {}
                            Err(_) => break,
                        }
                    }
                }));
            }
            for h in handlers {
                h.join().unwrap();
            }
        })
    };
    let client = Net::attach(&p).unwrap();
    // One checked exchange of `n` bytes on `s`.
    let exchange = |s: &mut XioStream, seed: u64, n: usize| {
        let mut out = vec![0u8; n];
        fill(&mut out, seed);
        let mut w = s.try_clone().unwrap();
        let writer = std::thread::spawn(move || w.write_all(&out).unwrap());
        let mut back = vec![0u8; n];
        s.read_exact(&mut back).unwrap();
        writer.join().unwrap();
        assert!(verify(&back, seed), "echo {seed} corrupted");
    };
    let stop_good = Arc::new(AtomicBool::new(false));
    let good = {
        let stop = stop_good.clone();
        let client = client.clone();
        std::thread::spawn(move || {
            let mut long = client.connect(addr).unwrap();
            let mut rounds = 0u64;
            while !stop.load(Ordering::Relaxed) {
                exchange(&mut long, rounds, 1 + (rounds as usize * 7919) % 200_000);
                if rounds % 16 == 0 {
                    let mut fresh = client.connect(addr).unwrap();
                    exchange(&mut fresh, rounds + 1, 1000);
                }
                rounds += 1;
            }
            rounds
        })
    };
    let mut evil = spawn_hostile(&p, addr, seed, iters, "sockets");
    evil.expect("ready");
    let said = evil.expect("done");
    let watcher = Stack::attach(&p).unwrap();
    let victim = server.stack_id().slot();
    let rejected = watcher
        .__segment()
        .stack_slot(victim)
        .corrupt
        .load(Ordering::Relaxed);
    evil.kill9();
    // The good client's exchanges went on meanwhile and go on after;
    // a new connection is served.
    let mut s = client.connect(addr).unwrap();
    exchange(&mut s, 4242, 100_000);
    drop(s);
    // The client first: the echoes stop once it is done.
    stop_good.store(true, Ordering::Relaxed);
    let rounds = good.join().unwrap();
    stop.store(true, Ordering::Relaxed);
    acceptor.join().unwrap();
    eprintln!(
        "sockets: {rejected} descriptors refused, hostile (last id, reconnects, new stacks, attacking id) {said}, \
         {rounds} good exchanges"
    );
    assert!(
        rejected > 0,
        "nothing was refused: the fuzzing did not reach the checks"
    );
    drop((watcher, client, server));
    wait_pool_whole(&mgr);
}

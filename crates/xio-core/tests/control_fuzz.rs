//! Deterministic fuzzing of the manager's control socket, which takes
//! untrusted input: a malformed or unexpected message gets an error reply
//! or a closed socket, never a crash, a hang, a leaked fd or a wrong reply.
//!
//! Structured mutations of every message kind of the protocol (bytes
//! flipped, truncated, extended; the length field, version and kind
//! changed; fields at their boundaries; fds of every kind and count
//! attached; messages out of order and repeated) and wholly random
//! packets go to an embedded manager from many short connections and a
//! few long-lived ones. Each reply is checked against what the protocol
//! promises for that message in that state. After every batch a
//! well-behaved pair of stacks must still attach, bind, connect, exchange
//! a message and get a status report; at the end the pool must be whole
//! and the manager's process hold the fds it held before.
//!
//! `XIO_FUZZ_SEED` (decimal or 0x-hex) picks the seed, printed at start
//! and in every failure; `XIO_FUZZ_ITERS` the number of iterations
//! (default: a short run for CI). This file is its own test binary with a
//! single test, so the fd count of the process is the manager's and ours.

mod common;

use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Instant;

use common::seeded::{env_u64, Rng};
use common::*;
use rustix::net::{SendAncillaryBuffer, SendAncillaryMessage, SendFlags};
use xio_core::ctrl::{self, RecvError};
use xio_core::layout::PoolConfig;
use xio_core::prelude::*;
use xio_core::proto::{ErrorCode, Msg, MAX_MSG, PROTO_VERSION};
use xio_core::stack::Error as StackError;

/// Protocol message type numbers, every one of them (see `proto::ty`).
const KINDS: [u8; 14] = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14];
const HDR: usize = 8;

fn u32_edge(r: &mut Rng) -> u32 {
    let x = r.next() as u32;
    r.pick(&[0, 1, 2, 7, 8, 255, 256, 4096, u32::MAX - 1, u32::MAX, x])
}

fn u16_edge(r: &mut Rng) -> u16 {
    let x = r.next() as u16;
    r.pick(&[0, 1, 2, 15, 16, 17, 64, 65, u16::MAX - 1, u16::MAX, x])
}

/// A small set of addresses, so that binds, connects and unbinds of
/// different sessions meet; and some at the edges.
fn addr(r: &mut Rng) -> SocketAddr {
    let port = r.pick(&[0u16, 1, 7000, 7001, 7002, 65535]);
    let ip = match r.index(8) {
        0 => "0.0.0.0",
        1 => "::",
        2 => "127.0.0.1",
        3 => "::ffff:127.0.0.1",
        4 => "::1",
        5 => "255.255.255.255",
        6 => "fe80::1",
        _ => "10.9.0.1",
    };
    SocketAddr::new(ip.parse().unwrap(), port)
}

fn name(r: &mut Rng) -> String {
    match r.index(6) {
        0 => String::new(),
        1 => "n".repeat(64),
        2 => "é".repeat(40), // cut on a char boundary when encoded
        3 => "evil\n\x1b[31mred\r".into(),
        4 => "\0\0".into(),
        _ => "fuzz".into(),
    }
}

/// A valid message of any kind, fields at or near their edges.
fn valid(r: &mut Rng) -> Msg {
    match r.pick(&KINDS) {
        1 => Msg::Hello {
            pid: u32_edge(r),
            name: name(r),
        },
        2 => Msg::Welcome {
            stack_id: u16_edge(r),
            generation: u16_edge(r),
        },
        3 => Msg::Bind { addr: addr(r) },
        4 => Msg::Unbind { addr: addr(r) },
        5 => Msg::Connect { addr: addr(r) },
        6 => Msg::ChannelUp {
            channel: u32_edge(r),
            dir: r.index(2) as u8,
            peer: u16_edge(r),
            generation: u16_edge(r),
        },
        7 => Msg::PeerDown {
            channel: u32_edge(r),
            peer: u16_edge(r),
        },
        8 => Msg::ChannelReleased {
            channel: u32_edge(r),
        },
        9 => Msg::Ok,
        10 => Msg::Error {
            code: r.pick(&[ErrorCode::BadMessage, ErrorCode::Busy, ErrorCode::Internal]),
            message: name(r),
        },
        11 => Msg::Status,
        12 => Msg::StatusReply { text: name(r) },
        13 => Msg::Connected {
            channel: u32_edge(r),
            dir: r.index(2) as u8,
            peer: u16_edge(r),
            generation: u16_edge(r),
            existing: r.pct(50),
        },
        _ => Msg::StatusReplyFd {
            len: u32_edge(r) % (16 << 20),
        },
    }
}

fn set_len_field(p: &mut [u8]) {
    if p.len() >= HDR {
        let l = (p.len() - HDR) as u32;
        p[4..8].copy_from_slice(&l.to_le_bytes());
    }
}

/// A valid encoding, mutated (or not).
fn mutated(r: &mut Rng) -> Vec<u8> {
    let mut p = valid(r).encode();
    let n = r.pick(&[0, 0, 1, 1, 2, 3]);
    for _ in 0..n {
        match r.index(11) {
            0 if !p.is_empty() => {
                let i = r.index(p.len());
                p[i] ^= 1 << r.index(8);
            }
            1 if !p.is_empty() => {
                let i = r.index(p.len());
                p[i] = r.pick(&[0, 1, 0x7f, 0x80, 0xff]);
            }
            2 => {
                let l = r.index(p.len() + 1);
                p.truncate(l);
            }
            3 => {
                let extra = r.pick(&[1, 2, 7, 64]);
                let b = r.bytes(extra);
                p.extend_from_slice(&b);
            }
            4 if p.len() >= HDR => {
                let actual = (p.len() - HDR) as u32;
                let x = r.next() as u32;
                let l = r.pick(&[
                    0,
                    actual.wrapping_sub(1),
                    actual + 1,
                    u32::MAX,
                    MAX_MSG as u32,
                    x,
                ]);
                p[4..8].copy_from_slice(&l.to_le_bytes());
            }
            5 if p.len() >= 3 => p[2] = r.pick(&[0, 1, PROTO_VERSION + 1, 0xff]),
            6 if p.len() >= 4 => {
                let k = r.pick(&KINDS);
                p[3] = r.pick(&[0, 15, 0x7f, 0xff, k]);
            }
            7 if p.len() > HDR + 1 => {
                // A body field's first bytes at an edge: a string's length
                // prefix, an address family, a direction, a flag.
                let i = HDR + r.index(p.len() - HDR);
                let v = r.pick(&[0u16, 1, 4, 6, 64, 65, 1024, 4088, u16::MAX]);
                let b = v.to_le_bytes();
                p[i] = b[0];
                if i + 1 < p.len() {
                    p[i + 1] = b[1];
                }
            }
            8 => {
                // Longer than a packet: truncated by the manager's recv.
                let l = r.pick(&[MAX_MSG - 1, MAX_MSG, MAX_MSG + 1, 9000, 65_000]);
                p.resize(l.max(p.len()), 0xAB);
                set_len_field(&mut p);
            }
            9 if p.len() > HDR => {
                // Invalid UTF-8 where a string starts, length fixed.
                let i = HDR + r.index(p.len() - HDR);
                p[i] = 0xC3;
                if i + 1 < p.len() {
                    p[i + 1] = 0x28;
                }
            }
            _ => {}
        }
        if r.pct(50) {
            // So that body mutations reach the body decoder.
            set_len_field(&mut p);
        }
    }
    p
}

/// A packet with no structure at all (sometimes a valid header on it).
fn random_packet(r: &mut Rng) -> Vec<u8> {
    let len = r.pick(&[0, 1, 7, 8, 9, 16, 40, 300, MAX_MSG, 5000]);
    let len = r.index(len + 1);
    let mut p = r.bytes(len);
    if p.len() >= HDR && r.pct(50) {
        p[0] = b'X';
        p[1] = b'I';
        p[2] = PROTO_VERSION;
        set_len_field(&mut p);
    }
    p
}

/// Fds to send along a message: none mostly; else any count (past what the
/// manager's buffer holds, too) of any kind.
fn some_fds(r: &mut Rng, own: BorrowedFd<'_>) -> Vec<OwnedFd> {
    if r.pct(75) {
        return Vec::new();
    }
    let n = r.pick(&[1, 1, 2, 3, 4, 5, 8]);
    (0..n)
        .map(|_| match r.index(7) {
            0 => rustix::pipe::pipe().unwrap().0,
            1 => rustix::pipe::pipe().unwrap().1,
            2 => rustix::fs::memfd_create("fuzz", rustix::fs::MemfdFlags::CLOEXEC).unwrap(),
            3 => rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap(),
            4 => {
                rustix::net::socketpair(
                    rustix::net::AddressFamily::UNIX,
                    rustix::net::SocketType::SEQPACKET,
                    rustix::net::SocketFlags::CLOEXEC,
                    None,
                )
                .unwrap()
                .0
            }
            5 => rustix::fs::open(
                "/dev/null",
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .unwrap(),
            // The connection's own socket: an fd in flight to itself.
            _ => own.try_clone_to_owned().unwrap(),
        })
        .collect()
}

/// Sends raw bytes with fds. False if the manager's end is gone (it cut
/// the connection off: allowed after a bad message).
fn send_raw(s: &OwnedFd, bytes: &[u8], fds: &[OwnedFd], nowait: bool) -> bool {
    let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(8))];
    let mut anc = SendAncillaryBuffer::new(&mut space);
    if !borrowed.is_empty() {
        assert!(anc.push(SendAncillaryMessage::ScmRights(&borrowed)));
    }
    let iov = [std::io::IoSlice::new(bytes)];
    let flags = if nowait {
        SendFlags::NOSIGNAL | SendFlags::DONTWAIT
    } else {
        SendFlags::NOSIGNAL
    };
    match rustix::net::sendmsg(s, &iov, &mut anc, flags) {
        Ok(n) => {
            assert_eq!(n, bytes.len(), "short send");
            true
        }
        Err(rustix::io::Errno::PIPE | rustix::io::Errno::CONNRESET) => false,
        // Only without waiting: to a connection no longer read.
        Err(rustix::io::Errno::AGAIN) => false,
        // Larger than the socket's send buffer can ever hold.
        Err(rustix::io::Errno::MSGSIZE) => true,
        Err(e) => panic!("send: {e}"),
    }
}

/// What the protocol promises in answer to one packet.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Expect {
    /// `Welcome` with the segment and doorbell fds, or `NoSpace`.
    Welcome,
    /// A status report.
    Status,
    /// `Ok`, or a refusal (`AddrInUse`, `NoSpace`).
    Bound,
    /// `Ok`.
    Ok,
    /// `Connected` with the peer's fds, or a refusal.
    Connected,
    /// No reply.
    Nothing,
    /// `Error { BadMessage }`, then nothing more is read (an empty
    /// packet too: it is not the end of the stream).
    Bad,
}

/// What the manager must answer to `bytes` (as it receives them: cut at
/// [`MAX_MSG`]), from a connection `registered` or not.
fn expect(bytes: &[u8], registered: bool) -> Expect {
    let Ok(m) = Msg::decode(&bytes[..bytes.len().min(MAX_MSG)]) else {
        return Expect::Bad;
    };
    match (registered, m) {
        (_, Msg::Status) => Expect::Status,
        (false, Msg::Hello { .. }) => Expect::Welcome,
        (false, _) => Expect::Bad,
        (true, Msg::Bind { .. }) => Expect::Bound,
        (true, Msg::Unbind { .. }) => Expect::Ok,
        (true, Msg::Connect { .. }) => Expect::Connected,
        (true, Msg::ChannelReleased { .. }) => Expect::Nothing,
        (true, _) => Expect::Bad,
    }
}

/// One raw connection to the manager.
struct Session {
    sock: OwnedFd,
    registered: bool,
    /// The manager reads no more from it (cut off, or answered and closed).
    done: bool,
    /// Replies owed, oldest first.
    owed: std::collections::VecDeque<Expect>,
    /// Packets were sent after one the manager may answer by closing the
    /// connection (a reset, with them unread: `ctrl` still reads the reply
    /// queued before it), or by closing it with no reply (a Welcome it
    /// could not send).
    may_reset: bool,
}

impl Session {
    fn open(p: &str) -> Session {
        Session {
            sock: ctrl::connect(&xio_core::paths::socket_path(p)).unwrap(),
            registered: false,
            done: false,
            owed: Default::default(),
            may_reset: false,
        }
    }

    /// Sends a packet and notes what must come back.
    fn send(&mut self, r: &mut Rng, bytes: &[u8]) {
        let fds = some_fds(r, self.sock.as_fd());
        self.may_reset |= self.done || self.owed.contains(&Expect::Welcome);
        // A connection the manager no longer reads may be full: no waiting.
        let sent = send_raw(&self.sock, bytes, &fds, self.done);
        if std::env::var_os("XIO_FUZZ_TRACE").is_some() {
            eprintln!(
                "TRACE sock {:?} sent {} bytes {:02x?} fds {} ok {sent} done {} reg {}",
                self.sock,
                bytes.len(),
                &bytes[..bytes.len().min(12)],
                fds.len(),
                self.done,
                self.registered
            );
        }
        if self.done {
            return;
        }
        // Unless its Hello may have been refused (no stack slot): the
        // manager closes the connection then.
        assert!(
            sent || self.owed.contains(&Expect::Welcome),
            "the manager closed a connection it still serves"
        );
        let e = expect(bytes, self.registered);
        match e {
            Expect::Welcome => self.registered = true,
            Expect::Bad => self.done = true,
            Expect::Status if !self.registered => self.done = true,
            _ => {}
        }
        if e != Expect::Nothing {
            self.owed.push_back(e);
        }
    }

    /// Reads every reply owed and checks it.
    fn settle(&mut self, ctx: &str) {
        let deadline = Instant::now() + WATCHDOG;
        while let Some(&e) = self.owed.front() {
            let (m, fds) = match ctrl::recv_until(self.sock.as_fd(), Some(deadline)) {
                Ok(x) => x,
                Err(RecvError::Io(err)) if err.kind() == std::io::ErrorKind::TimedOut => {
                    panic!("{ctx}: watchdog: no reply (owed {e:?})")
                }
                Err(RecvError::Closed) if self.may_reset => {
                    self.done = true;
                    self.owed.clear();
                    return;
                }
                Err(err) => panic!("{ctx}: {err} (owed {e:?})"),
            };
            let ok = match (&m, e) {
                // Unprompted, to a registered stack: another stack opened
                // a channel to its address, or a peer went away.
                (Msg::ChannelUp { .. }, _) if self.registered => {
                    assert!((1..=2).contains(&fds.len()), "{ctx}: {m:?} {fds:?}");
                    continue;
                }
                (Msg::PeerDown { channel, .. }, _) if self.registered => {
                    // As a stack does: let go of it, or the slots of the
                    // dead peer and of the channel stay taken.
                    if !self.done {
                        let rel = Msg::ChannelReleased { channel: *channel }.encode();
                        send_raw(&self.sock, &rel, &[], false);
                    }
                    continue;
                }
                (Msg::Welcome { .. }, Expect::Welcome) => fds.len() == 2,
                (
                    Msg::Error {
                        code: ErrorCode::NoSpace,
                        ..
                    },
                    Expect::Welcome,
                ) => {
                    // No slot: the manager closes the connection.
                    self.registered = false;
                    self.done = true;
                    self.owed.clear();
                    return;
                }
                (Msg::StatusReply { .. }, Expect::Status) => fds.is_empty(),
                (Msg::StatusReplyFd { .. }, Expect::Status) => fds.len() == 1,
                (Msg::Ok, Expect::Bound | Expect::Ok) => fds.is_empty(),
                (
                    Msg::Error {
                        code: ErrorCode::AddrInUse | ErrorCode::NoSpace,
                        ..
                    },
                    Expect::Bound,
                ) => fds.is_empty(),
                (Msg::Connected { .. }, Expect::Connected) => (1..=2).contains(&fds.len()),
                (
                    Msg::Error {
                        code: ErrorCode::ConnectionRefused | ErrorCode::Busy | ErrorCode::NoSpace,
                        ..
                    },
                    Expect::Connected,
                ) => fds.is_empty(),
                (
                    Msg::Error {
                        code: ErrorCode::BadMessage,
                        ..
                    },
                    Expect::Bad,
                ) => fds.is_empty(),
                _ => false,
            };
            assert!(ok, "{ctx}: owed {e:?}, got {m:?} with {} fds", fds.len());
            self.owed.pop_front();
        }
    }
}

/// The fds this process holds.
fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// `f`, again while the manager refuses it for want of a slot (the
/// fuzzing may hold them all for a moment: dead stacks whose peers have
/// not let go of their channels yet). Any other error fails the test.
fn retry_no_space<T>(ctx: &str, what: &str, mut f: impl FnMut() -> Result<T, StackError>) -> T {
    let deadline = Instant::now() + WATCHDOG;
    loop {
        match f() {
            Ok(x) => return x,
            Err(StackError::Refused {
                code: ErrorCode::NoSpace,
                ..
            }) if Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(2))
            }
            Err(e) => panic!("{ctx}: {what}: {e}"),
        }
    }
}

/// Every long-lived session answers what waits for it (releasing the
/// channels of peers gone) and is answered in turn.
fn drain(r: &mut Rng, long: &mut [Session], ctx: &str) {
    for s in long.iter_mut().filter(|s| !s.done) {
        s.send(r, &Msg::Status.encode());
        s.settle(ctx);
    }
}

/// A well-behaved pair of stacks still gets everything done.
fn check_serves(p: &str, round: u32, ctx: &str) {
    let a: SocketAddr = format!("10.250.{}.{}:{}", round / 250 % 250, round % 250, 40_000)
        .parse()
        .unwrap();
    let mut srv = retry_no_space(ctx, "attach", || Stack::attach(p));
    srv.bind(a)
        .unwrap_or_else(|e| panic!("{ctx}: bind {a}: {e}"));
    let mut cli = retry_no_space(ctx, "attach", || Stack::attach(p));
    let peer = retry_no_space(ctx, "connect", || cli.connect(a));
    let mut b = cli.alloc(5).unwrap();
    b.copy_from(b"round");
    cli.send(peer, b).unwrap();
    let m = srv
        .recv_timeout(WATCHDOG)
        .unwrap_or_else(|e| panic!("{ctx}: recv: {e}"));
    assert_eq!(&m.buf[..], b"round", "{ctx}");
    drop(m);
    let status = xio_core::manager::query_status(p).unwrap_or_else(|e| panic!("{ctx}: {e}"));
    assert!(status.contains(&a.to_string()), "{ctx}: {status}");
}

#[test]
fn the_manager_survives_fuzzed_control_messages() {
    setup();
    let seed = env_u64("XIO_FUZZ_SEED").unwrap_or(0x5eed_c0de);
    let iters = env_u64("XIO_FUZZ_ITERS").unwrap_or(10_000);
    eprintln!("control fuzz: XIO_FUZZ_SEED={seed:#x} XIO_FUZZ_ITERS={iters}");
    let mut r = Rng(seed);
    let p = prefix("ctlfuzz");
    let cfg = PoolConfig {
        classes: vec![(2048, 256), (65_536, 16)],
        max_stacks: 64,
        max_channels: 64,
        ring_capacity: 64,
        quotas: Vec::new(),
    };
    let mgr = manager_builder(&p).pool(cfg).spawn().unwrap();
    // Settled: the manager's thread has its fds.
    xio_core::manager::query_status(&p).unwrap();
    let fds_before = fd_count();

    const LONG: usize = 5;
    const BATCH: u64 = 100;
    let mut long: Vec<Session> = Vec::new();
    let started = Instant::now();
    for i in 0..iters {
        let ctx = format!("seed {seed:#x} iteration {i}");
        match r.index(100) {
            // A short connection, one packet, unregistered.
            0..=29 => {
                let mut s = Session::open(&p);
                let b = if r.pct(85) {
                    mutated(&mut r)
                } else {
                    random_packet(&mut r)
                };
                s.send(&mut r, &b);
                if r.pct(90) {
                    s.settle(&ctx);
                }
            }
            // A short registered connection: several packets sent before
            // any reply is read, then perhaps closed with replies unread.
            30..=54 => {
                let mut s = Session::open(&p);
                let hello = Msg::Hello {
                    pid: r.next() as u32,
                    name: name(&mut r),
                };
                s.send(&mut r, &hello.encode());
                for _ in 0..r.index(6) {
                    let b = match r.index(10) {
                        0 => random_packet(&mut r),
                        1..=4 => valid(&mut r).encode(),
                        _ => mutated(&mut r),
                    };
                    s.send(&mut r, &b);
                }
                if r.pct(80) {
                    s.settle(&ctx);
                }
            }
            // A long-lived session: mostly well-formed requests.
            55..=94 => {
                if long.len() < LONG || r.pct(3) {
                    let mut s = Session::open(&p);
                    let hello = Msg::Hello {
                        pid: 0,
                        name: "long".into(),
                    };
                    s.send(&mut r, &hello.encode());
                    s.settle(&ctx);
                    if long.len() >= LONG {
                        long.remove(r.index(long.len()));
                    }
                    long.push(s);
                }
                let k = r.index(long.len());
                let s = &mut long[k];
                for _ in 0..1 + r.index(3) {
                    let m = match r.index(20) {
                        0..=5 => Msg::Bind { addr: addr(&mut r) },
                        6..=7 => Msg::Unbind { addr: addr(&mut r) },
                        8..=13 => Msg::Connect { addr: addr(&mut r) },
                        14..=16 => Msg::ChannelReleased {
                            channel: r.index(10) as u32,
                        },
                        17 => Msg::Status,
                        // Repeats and wrong-state requests.
                        18 => Msg::Hello {
                            pid: 1,
                            name: "again".into(),
                        },
                        _ => valid(&mut r),
                    };
                    let b = if r.pct(5) {
                        mutated(&mut r)
                    } else {
                        m.encode()
                    };
                    s.send(&mut r, &b);
                }
                // One of them sometimes stays deaf for a while.
                if k != 0 || r.pct(30) {
                    s.settle(&ctx);
                }
                if s.done {
                    long.remove(k);
                }
            }
            // A connection that sends nothing, or an empty packet.
            _ => {
                let mut s = Session::open(&p);
                if r.pct(50) {
                    s.send(&mut r, &[]);
                }
            }
        }
        if (i + 1) % BATCH == 0 || i + 1 == iters {
            drain(&mut r, &mut long, &ctx);
            drain(&mut r, &mut long, &ctx);
            long.retain(|s| !s.done);
            check_serves(&p, (i / BATCH) as u32, &ctx);
        }
    }
    let took = started.elapsed();
    let bad = mgr.snapshot().bad_messages;
    eprintln!("control fuzz: {iters} iterations in {took:?}, {bad} bad messages counted");
    drop(long);
    wait_pool_whole(&mgr);
    let snap = mgr.snapshot();
    assert!(snap.channels.is_empty(), "seed {seed:#x}: {snap:?}");
    // At most as many as before (fewer is fine: what the process opened
    // lazily before the count may have closed since).
    wait_until(&format!("seed {seed:#x}: fds back to {fds_before}"), || {
        fd_count() <= fds_before
    });
}

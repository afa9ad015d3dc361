//! Chaos: the `xio-manager` binary and several worker processes, each
//! doing mixed traffic with the others at once (zero-copy `Stack`
//! messages with bursts and held buffers, blocking `XioStream`s, tokio
//! `XioStream`s), and in each round one or two random workers killed with
//! SIGKILL (at a random moment, after a SIGSTOP, or while churning
//! attaches, binds and connects), then respawned.
//!
//! What must hold: the survivors see only clean errors (reset, refused),
//! never wrong bytes (every message and frame is checksummed), and never
//! hang (each worker's watchdog, a hang guard and not a speed bound,
//! aborts it if a loop stops moving); once a killed worker is reaped the
//! manager's status shows nothing of it (no stack, channel or buffer of a
//! stack that is not listed); at the end, with every worker gone, the
//! pool is whole and the manager holds the fds it held before.
//!
//! Deterministic choices from a seed, printed (replay with
//! `XIO_CHAOS_SEED=<seed>`); `XIO_CHAOS_ROUNDS` sets the rounds (the
//! default keeps a CI run to some seconds). Timing is not replayed: the
//! same seed makes the same choices, not the same interleavings.

mod support;

use std::collections::{HashMap, VecDeque};
use std::io::{self, BufRead, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use xio_core::net::Net;
use xio_core::prelude::*;
use xio_core::proto::ErrorCode;

use support::seeded::{env_u64, fill, seed_from_env, verify, Rng};
use support::{fds_of, process_run_dir, wait_until, Reap, BIN, WATCHDOG};

const WORKERS: usize = 4;
const DEFAULT_ROUNDS: u64 = 20;

fn raw_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 1, 0, i as u8 + 1], 7))
}
fn blk_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 2, 0, i as u8 + 1], 7))
}
fn tok_addr(i: usize) -> SocketAddr {
    SocketAddr::from(([10, 3, 0, i as u8 + 1], 7))
}

// ---------------------------------------------------------------- worker

/// Each loop of a worker beats; a loop that stops beating for the
/// watchdog aborts the worker (a hang, seen by the parent as a death it
/// did not cause).
#[derive(Default)]
struct Beats(std::sync::Mutex<Vec<(String, Arc<AtomicU64>)>>);

impl Beats {
    fn new_loop(&self, name: String) -> Arc<AtomicU64> {
        let b = Arc::new(AtomicU64::new(0));
        self.0.lock().unwrap().push((name, b.clone()));
        b
    }
}

/// What a worker checked and found right: raw messages, blocking and
/// tokio frames (printed on the parent's `stats`, to see the traffic ran).
static CHECKED: [AtomicU64; 3] = [AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)];

fn checked(kind: usize) {
    CHECKED[kind].fetch_add(1, Ordering::Relaxed);
}

fn beat(b: &AtomicU64) {
    b.fetch_add(1, Ordering::Relaxed);
}

/// Entry point of the worker processes (a no-op when run as a test).
#[test]
fn chaos_child() {
    let Ok(role) = std::env::var("XIO_CHAOS_ROLE") else {
        return;
    };
    assert_eq!(role, "worker");
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    // A panic in any thread is the worker's end, loudly: the parent sees
    // an abort it did not cause.
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        default(info);
        std::process::abort();
    }));
    let args: Vec<String> = std::env::var("XIO_CHAOS_ARGS")
        .unwrap()
        .split(' ')
        .map(str::to_owned)
        .collect();
    let prefix = args[0].clone();
    let idx: usize = args[1].parse().unwrap();
    let seed: u64 = args[2].parse().unwrap();
    worker(&prefix, idx, seed);
}

fn worker(prefix: &str, idx: usize, seed: u64) {
    let beats = Arc::new(Beats::default());
    let mut raw = Stack::builder(prefix)
        .name(format!("raw{idx}"))
        .wait_mode(WaitMode::NonBlocking)
        .control_timeout(WATCHDOG)
        .attach()
        .unwrap();
    raw.bind(raw_addr(idx)).unwrap();
    let raw_id = raw.id().slot();
    let net = Net::builder(prefix)
        .control_timeout(WATCHDOG)
        .attach()
        .unwrap();
    let lis = net.listen(blk_addr(idx)).unwrap();
    let (tok_tx, tok_rx) = mpsc::channel();
    {
        let prefix = prefix.to_owned();
        let beats = beats.clone();
        std::thread::spawn(move || tokio_side(&prefix, idx, seed, tok_tx, &beats));
    }
    let tok_id = tok_rx.recv_timeout(WATCHDOG).expect("tokio side ready");

    {
        let b = beats.new_loop("raw".into());
        std::thread::spawn(move || raw_loop(raw, idx, seed, &b));
    }
    {
        let seed = seed ^ 0x11;
        std::thread::spawn(move || blocking_server(lis, seed));
    }
    for c in 0..3u64 {
        let net = net.clone();
        let b = beats.new_loop(format!("blocking client {c}"));
        std::thread::spawn(move || blocking_client(net, idx, seed ^ (0x100 + c), &b));
    }
    println!("XIO:ready {} {} {}", raw_id, net.stack_id().slot(), tok_id);
    {
        let beats = beats.clone();
        std::thread::spawn(move || loop {
            let before: Vec<u64> = beats
                .0
                .lock()
                .unwrap()
                .iter()
                .map(|(_, b)| b.load(Ordering::Relaxed))
                .collect();
            std::thread::sleep(WATCHDOG);
            for ((name, b), was) in beats.0.lock().unwrap().iter().zip(before) {
                assert_ne!(
                    b.load(Ordering::Relaxed),
                    was,
                    "watchdog: worker {idx}'s {name} loop hangs"
                );
            }
        });
    }
    // Commands from the parent.
    for line in io::stdin().lock().lines() {
        let line = line.unwrap();
        if line == "stats" {
            let [r, b, t] = &CHECKED;
            println!(
                "worker {idx}: checked {} raw messages, {} blocking and {} tokio frames",
                r.load(Ordering::Relaxed),
                b.load(Ordering::Relaxed),
                t.load(Ordering::Relaxed)
            );
        }
        if line == "churn" {
            for c in 0..2u64 {
                let prefix = prefix.to_owned();
                let net = net.clone();
                std::thread::spawn(move || churn(&prefix, &net, idx, c, seed ^ (0x200 + c)));
            }
        }
    }
    loop {
        std::thread::park();
    }
}

/// A raw message: 8 bytes of seed (its low 24 bits the length), then
/// the pattern of that seed.
fn write_msg(b: &mut [u8], seed: u64) {
    b[..8].copy_from_slice(&seed.to_le_bytes());
    fill(&mut b[8..], seed);
}

fn check_msg(b: &[u8], from: PeerId) {
    assert!(b.len() >= 8, "short message {} from {from}", b.len());
    let seed = u64::from_le_bytes(b[..8].try_into().unwrap());
    assert_eq!(
        (seed & 0xff_ffff) as usize,
        b.len(),
        "message from {from}: wrong length"
    );
    assert!(verify(&b[8..], seed), "message from {from}: wrong bytes");
    checked(0);
}

fn msg_len(rng: &mut Rng) -> usize {
    match rng.range(0, 100) {
        0..=79 => rng.range(8, 2048) as usize,
        80..=97 => rng.range(2048, 65_536) as usize,
        _ => rng.range(65_536, 300_000) as usize,
    }
}

/// A clean error of the raw API, in a world where peers die.
fn raw_clean(e: &Error) -> bool {
    matches!(
        e,
        Error::Reset(_)
            | Error::NotConnected(_)
            | Error::WouldBlock
            | Error::Refused {
                code: ErrorCode::ConnectionRefused,
                ..
            }
    )
}

fn raw_loop(mut s: Stack, idx: usize, seed: u64, b: &AtomicU64) {
    let mut rng = Rng(seed ^ 0xaa);
    let mut peers: HashMap<usize, PeerId> = HashMap::new();
    let mut held_rx: VecDeque<Buf> = VecDeque::new();
    let mut held_tx: Vec<BufMut> = Vec::new();
    let mut msgs = Vec::new();
    loop {
        beat(b);
        // Receive: one short wait, then drain with one of the burst APIs.
        match s.recv_timeout(Duration::from_millis(5)) {
            Ok(m) => {
                check_msg(&m.buf, m.from);
                if held_rx.len() < 64 && rng.pct(30) {
                    held_rx.push_back(m.buf);
                }
            }
            Err(Error::TimedOut) => {}
            Err(Error::Reset(p)) => peers.retain(|_, q| *q != p),
            Err(e) => panic!("raw recv: {e}"),
        }
        for _ in 0..4 {
            let r = match rng.range(0, 3) {
                0 => s.try_recv().map(|m| {
                    check_msg(&m.buf, m.from);
                    1
                }),
                1 => {
                    msgs.clear();
                    let r = s.recv_burst(&mut msgs, 32);
                    for m in msgs.drain(..) {
                        check_msg(&m.buf, m.from);
                        if held_rx.len() < 64 && rng.pct(10) {
                            held_rx.push_back(m.buf);
                        }
                    }
                    r
                }
                _ => s.recv_burst_with(32, |from, _, p| check_msg(p, from)),
            };
            match r {
                Ok(_) => {}
                Err(Error::WouldBlock) => break,
                Err(Error::Reset(p)) => peers.retain(|_, q| *q != p),
                Err(e) => panic!("raw drain: {e}"),
            }
        }
        while held_rx.len() > 32 || (!held_rx.is_empty() && rng.pct(20)) {
            held_rx.pop_front();
        }
        if held_tx.len() > 8 || rng.pct(10) {
            held_tx.clear();
        }
        // Send to a random other worker.
        let j = (idx + rng.range(1, WORKERS as u64) as usize) % WORKERS;
        let peer = match peers.get(&j) {
            Some(&p) => p,
            None => match s.connect(raw_addr(j)) {
                Ok(p) => {
                    peers.insert(j, p);
                    p
                }
                Err(e) if raw_clean(&e) => continue,
                Err(e) => panic!("raw connect to worker {j}: {e}"),
            },
        };
        let r = match rng.range(0, 4) {
            0 => {
                let len = msg_len(&mut rng);
                match s.alloc(len) {
                    Ok(mut buf) => {
                        write_msg(&mut buf, (rng.next() << 24) | len as u64);
                        if rng.pct(20) {
                            // Hold it a while unsent.
                            held_tx.push(buf);
                            Ok(())
                        } else {
                            s.send(peer, buf)
                        }
                    }
                    Err(e) => Err(e),
                }
            }
            1 => {
                let n = rng.range(1, 40) as usize;
                let len = rng.range(8, 1500) as usize;
                let base = rng.next() << 24;
                s.send_burst_with(peer, n, len, |i, p| {
                    write_msg(p, base.wrapping_add((i as u64) << 24) | len as u64)
                })
            }
            2 => {
                let n = rng.range(1, 40) as usize;
                let len = rng.range(8, 4000) as usize;
                let mut bufs = Vec::new();
                match s.alloc_burst(len, n, &mut bufs) {
                    Ok(()) => {
                        for b in &mut bufs {
                            write_msg(b, (rng.next() << 24) | len as u64);
                        }
                        s.send_burst(peer, &mut bufs)
                    }
                    Err(e) => Err(e),
                }
            }
            _ => match s.try_alloc(64) {
                Ok(mut buf) => {
                    write_msg(&mut buf, (rng.next() << 24) | 64);
                    s.try_send(peer, buf).map_err(|(e, _)| e)
                }
                Err(e) => Err(e),
            },
        };
        match r {
            Ok(()) => {}
            Err(Error::Reset(p)) => peers.retain(|_, q| *q != p),
            Err(Error::NotConnected(_)) => {
                peers.remove(&j);
            }
            Err(e) if raw_clean(&e) => {}
            Err(e) => panic!("raw send to worker {j}: {e}"),
        }
        assert_eq!(s.corrupt_descriptors(), 0, "corrupt descriptors seen");
    }
}

/// A clean error of a stream in a world where peers die.
fn stream_clean(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
    )
}

fn check_stream_err(what: &str, e: io::Error) {
    assert!(stream_clean(&e), "{what}: {e} ({:?})", e.kind());
}

/// The reply's seed and length for a frame.
fn reply_of(seed: u64, len: usize) -> (u64, usize) {
    (seed.rotate_left(17) ^ 0xa5, len / 2 + 1)
}

fn frame_len(rng: &mut Rng) -> usize {
    match rng.range(0, 100) {
        0..=69 => rng.range(0, 4096) as usize,
        70..=94 => rng.range(4096, 200_000) as usize,
        // Many buffers, and more than the window.
        _ => rng.range(200_000, 3_000_000) as usize,
    }
}

/// Writes all of `data` in random pieces with `write` (partial writes).
fn write_pieces(s: &mut impl Write, data: &[u8], rng: &mut Rng) -> io::Result<()> {
    let mut off = 0;
    while off < data.len() {
        let k = (rng.range(1, 300_000) as usize).min(data.len() - off);
        let piece = &data[off..off + k];
        let r = if k > 1 && rng.pct(20) {
            // Two slices: packed into one buffer when they fit.
            let (x, y) = piece.split_at(k / 2);
            s.write_vectored(&[io::IoSlice::new(x), io::IoSlice::new(y)])
        } else {
            s.write(piece)
        };
        match r {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => off += n,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Reads exactly `buf.len()` in random pieces; `Ok(false)` for end of
/// stream before the first byte when `eof_ok`. End of stream inside it is
/// a truncation: wrong bytes, not a clean error.
fn read_pieces(s: &mut impl Read, buf: &mut [u8], rng: &mut Rng, eof_ok: bool) -> io::Result<bool> {
    let mut off = 0;
    while off < buf.len() {
        let k = (rng.range(1, 100_000) as usize).min(buf.len() - off);
        match s.read(&mut buf[off..off + k]) {
            Ok(0) if off == 0 && eof_ok => return Ok(false),
            Ok(0) => panic!("end of stream inside a frame ({off} of {})", buf.len()),
            Ok(n) => off += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

fn frame(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0u8; 16 + len];
    v[..8].copy_from_slice(&seed.to_le_bytes());
    v[8..16].copy_from_slice(&(len as u64).to_le_bytes());
    fill(&mut v[16..], seed);
    v
}

fn blocking_server(lis: xio_core::net::XioListener, seed: u64) {
    let mut k = 0u64;
    loop {
        let (mut s, _) = match lis.accept() {
            Ok(c) => c,
            Err(e) => {
                check_stream_err("accept", e);
                continue;
            }
        };
        k += 1;
        let mut rng = Rng(seed ^ k);
        std::thread::spawn(move || {
            s.set_read_timeout(Some(WATCHDOG)).unwrap();
            s.set_write_timeout(Some(WATCHDOG)).unwrap();
            loop {
                let mut h = [0u8; 16];
                match read_pieces(&mut s, &mut h, &mut rng, true) {
                    Ok(true) => {}
                    Ok(false) => return,
                    Err(e) => return check_stream_err("server read", e),
                }
                let fseed = u64::from_le_bytes(h[..8].try_into().unwrap());
                let len = u64::from_le_bytes(h[8..].try_into().unwrap()) as usize;
                assert!(len <= 3_000_000, "frame header: wrong bytes ({len})");
                let mut body = vec![0u8; len];
                if let Err(e) = read_pieces(&mut s, &mut body, &mut rng, false) {
                    return check_stream_err("server read", e);
                }
                assert!(verify(&body, fseed), "blocking frame: wrong bytes");
                let (rs, rl) = reply_of(fseed, len);
                if let Err(e) = write_pieces(&mut s, &frame(rs, rl), &mut rng) {
                    return check_stream_err("server write", e);
                }
            }
        });
    }
}

fn blocking_client(net: Net, idx: usize, seed: u64, b: &AtomicU64) {
    let mut rng = Rng(seed);
    loop {
        beat(b);
        // Several connections at once, to random workers, used in turn.
        let mut conns = Vec::new();
        for _ in 0..rng.range(1, 5) {
            let j = (idx + rng.range(1, WORKERS as u64) as usize) % WORKERS;
            match net.connect_timeout(&blk_addr(j), WATCHDOG) {
                Ok(s) => {
                    s.set_read_timeout(Some(WATCHDOG)).unwrap();
                    s.set_write_timeout(Some(WATCHDOG)).unwrap();
                    conns.push(s);
                }
                // Refused: worker j is being respawned.
                Err(e) => check_stream_err("connect", e),
            }
        }
        if conns.is_empty() {
            std::thread::sleep(Duration::from_millis(2));
            continue;
        }
        for _ in 0..rng.range(1, 12) {
            if conns.is_empty() {
                break;
            }
            beat(b);
            let k = rng.range(0, conns.len() as u64) as usize;
            let s = &mut conns[k];
            let len = frame_len(&mut rng);
            let fseed = rng.next();
            if let Err(e) = write_pieces(s, &frame(fseed, len), &mut rng) {
                check_stream_err("client write", e);
                conns.swap_remove(k);
                continue;
            }
            let (rs, rl) = reply_of(fseed, len);
            let mut back = vec![0u8; 16 + rl];
            match read_pieces(s, &mut back, &mut rng, false) {
                Ok(_) => {
                    assert_eq!(back, frame(rs, rl), "blocking reply: wrong bytes");
                    checked(1);
                }
                Err(e) => {
                    check_stream_err("client read", e);
                    conns.swap_remove(k);
                }
            }
        }
    }
}

/// Attaches, binds, connects and drops, over and over: the worker is
/// killed inside one of these control operations.
fn churn(prefix: &str, net: &Net, idx: usize, c: u64, seed: u64) {
    let mut rng = Rng(seed);
    loop {
        let mut s = match Stack::builder(prefix)
            .name("churn")
            .control_timeout(WATCHDOG)
            .attach()
        {
            Ok(s) => s,
            // Churning faster than peers let go of the channels of the
            // stacks it dropped (each slot is kept until then) may run
            // out of slots for a while: capacity, not a leak (the
            // parent's check after the round finds any kept for good).
            Err(Error::Refused {
                code: ErrorCode::NoSpace,
                ..
            }) => {
                std::thread::sleep(Duration::from_millis(1));
                continue;
            }
            Err(e) => panic!("churn attach: {e}"),
        };
        // Each churn thread its own addresses: only a dead process's
        // binding can be in the way, and that one must not be.
        let a = SocketAddr::from((
            [10, 4, idx as u8 + 1, (c * 128 + rng.range(0, 128)) as u8],
            7,
        ));
        if let Err(e) = s.bind(a) {
            panic!("churn bind (process {}): {e}", std::process::id());
        }
        let j = (idx + rng.range(1, WORKERS as u64) as usize) % WORKERS;
        match s.connect(raw_addr(j)) {
            Ok(p) => {
                if let Ok(mut b) = s.try_alloc(64) {
                    write_msg(&mut b, (rng.next() << 24) | 64);
                    let _ = s.try_send(p, b);
                }
            }
            Err(e) if raw_clean(&e) => {}
            Err(Error::Refused {
                code: ErrorCode::NoSpace,
                ..
            }) => {}
            Err(e) => panic!("churn connect: {e}"),
        }
        if rng.pct(50) {
            let _ = s.unbind(a);
        }
        drop(s);
        match net.connect_timeout(&blk_addr(j), WATCHDOG) {
            Ok(c) => drop(c),
            Err(e) => check_stream_err("churn stream connect", e),
        }
    }
}

fn tokio_side(prefix: &str, idx: usize, seed: u64, ready: mpsc::Sender<u16>, beats: &Beats) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let clients: Vec<_> = (0..2)
        .map(|c| beats.new_loop(format!("tokio client {c}")))
        .collect();
    rt.block_on(async move {
        let net = Net::builder(prefix)
            .control_timeout(WATCHDOG)
            .attach()
            .unwrap();
        let lis = xio_tokio::XioListener::bind_with(&net, tok_addr(idx)).unwrap();
        ready.send(net.stack_id().slot()).unwrap();
        for (c, b) in clients.into_iter().enumerate() {
            let net = net.clone();
            tokio::spawn(tokio_client(net, idx, seed ^ (0x300 + c as u64), b));
        }
        let mut k = 0;
        loop {
            let (s, _) = match lis.accept().await {
                Ok(c) => c,
                Err(e) => {
                    check_stream_err("tokio accept", e);
                    continue;
                }
            };
            k += 1;
            tokio::spawn(tokio_serve(s, Rng(seed ^ 0x400 ^ k)));
        }
    });
}

/// The watchdog around one tokio operation (a hang guard).
async fn guard<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(WATCHDOG, f).await {
        Ok(r) => r,
        Err(_) => panic!("watchdog: tokio {what} hangs"),
    }
}

async fn tokio_write_pieces(
    s: &mut xio_tokio::XioStream,
    data: &[u8],
    rng: &mut Rng,
) -> io::Result<()> {
    use tokio::io::AsyncWriteExt;
    let mut off = 0;
    while off < data.len() {
        let k = (rng.range(1, 300_000) as usize).min(data.len() - off);
        match guard("write", s.write(&data[off..off + k])).await {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => off += n,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

async fn tokio_read_pieces(
    s: &mut xio_tokio::XioStream,
    buf: &mut [u8],
    rng: &mut Rng,
    eof_ok: bool,
) -> io::Result<bool> {
    use tokio::io::AsyncReadExt;
    let mut off = 0;
    while off < buf.len() {
        let k = (rng.range(1, 100_000) as usize).min(buf.len() - off);
        match guard("read", s.read(&mut buf[off..off + k])).await {
            Ok(0) if off == 0 && eof_ok => return Ok(false),
            Ok(0) => panic!(
                "tokio: end of stream inside a frame ({off} of {})",
                buf.len()
            ),
            Ok(n) => off += n,
            Err(e) => return Err(e),
        }
    }
    Ok(true)
}

async fn tokio_serve(mut s: xio_tokio::XioStream, mut rng: Rng) {
    loop {
        let mut h = [0u8; 16];
        match tokio_read_pieces(&mut s, &mut h, &mut rng, true).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return check_stream_err("tokio server read", e),
        }
        let fseed = u64::from_le_bytes(h[..8].try_into().unwrap());
        let len = u64::from_le_bytes(h[8..].try_into().unwrap()) as usize;
        assert!(len <= 3_000_000, "tokio frame header: wrong bytes ({len})");
        let mut body = vec![0u8; len];
        if let Err(e) = tokio_read_pieces(&mut s, &mut body, &mut rng, false).await {
            return check_stream_err("tokio server read", e);
        }
        assert!(verify(&body, fseed), "tokio frame: wrong bytes");
        let (rs, rl) = reply_of(fseed, len);
        if let Err(e) = tokio_write_pieces(&mut s, &frame(rs, rl), &mut rng).await {
            return check_stream_err("tokio server write", e);
        }
    }
}

async fn tokio_client(net: Net, idx: usize, seed: u64, b: Arc<AtomicU64>) {
    let mut rng = Rng(seed);
    loop {
        beat(&b);
        let j = (idx + rng.range(1, WORKERS as u64) as usize) % WORKERS;
        let mut s = match guard(
            "connect",
            xio_tokio::XioStream::connect_with(&net, tok_addr(j)),
        )
        .await
        {
            Ok(s) => s,
            Err(e) => {
                check_stream_err("tokio connect", e);
                tokio::time::sleep(Duration::from_millis(2)).await;
                continue;
            }
        };
        for _ in 0..rng.range(1, 6) {
            beat(&b);
            let len = frame_len(&mut rng);
            let fseed = rng.next();
            if let Err(e) = tokio_write_pieces(&mut s, &frame(fseed, len), &mut rng).await {
                check_stream_err("tokio client write", e);
                break;
            }
            let (rs, rl) = reply_of(fseed, len);
            let mut back = vec![0u8; 16 + rl];
            match tokio_read_pieces(&mut s, &mut back, &mut rng, false).await {
                Ok(_) => {
                    assert_eq!(back, frame(rs, rl), "tokio reply: wrong bytes");
                    checked(2);
                }
                Err(e) => {
                    check_stream_err("tokio client read", e);
                    break;
                }
            }
        }
    }
}

// ---------------------------------------------------------------- status

#[derive(Debug)]
struct StackLine {
    id: u16,
    pid: u32,
}

#[derive(Debug, Default)]
struct Status {
    stacks: Vec<StackLine>,
    /// Channel endpoints.
    channels: Vec<(u16, u16)>,
    /// Buffer owners (stack ids) with buffers in use.
    owners: Vec<u16>,
    /// Whether any class has buffers in use.
    in_use: bool,
    /// Dead stacks whose slots or buffers are still kept.
    dead_lines: Vec<String>,
}

fn parse_status(t: &str) -> Status {
    let mut st = Status::default();
    for line in t.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if line.starts_with("  stack ") && w.len() >= 5 && w[2] == "pid" {
            st.stacks.push(StackLine {
                id: w[1].parse().unwrap(),
                pid: w[3].parse().unwrap(),
            });
        } else if line.starts_with("  channel ") {
            // "channel i stack a <-> stack b (state)"
            st.channels
                .push((w[3].parse().unwrap(), w[6].parse().unwrap()));
        } else if line.starts_with("  class ") {
            // "class N B: T total, F free, U in use (stack o: n, ...)"
            let used: u64 = w[7].parse().unwrap();
            st.in_use |= used > 0;
            if let Some(i) = line.find('(') {
                for part in line[i + 1..line.len() - 1].split(", ") {
                    let o = part.trim_start_matches("stack ").split(':').next().unwrap();
                    st.owners.push(o.parse().unwrap());
                }
            }
        } else if line.trim_start().starts_with("dead,") {
            st.dead_lines.push(line.trim().to_owned());
        }
    }
    st
}

// ---------------------------------------------------------------- parent

struct Worker {
    child: Child,
    ids: Vec<u16>,
}

/// Starts worker `idx` (not waiting for it): the child and where its
/// ready line comes.
fn start_worker(prefix: &str, idx: usize, seed: u64, gen: u64) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "chaos_child",
            "--nocapture",
            "--test-threads=1",
            "--quiet",
        ])
        .env("XIO_CHAOS_ROLE", "worker")
        .env(
            "XIO_CHAOS_ARGS",
            format!("{prefix} {idx} {}", seed ^ (gen << 32) ^ idx as u64),
        )
        .env("XIO_CONTROL_TIMEOUT_MS", WATCHDOG.as_millis().to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in io::BufReader::new(out).lines().map_while(Result::ok) {
            if let Some(rest) = line.strip_prefix("XIO:ready ") {
                let _ = tx.send(rest.to_owned());
            } else if !line.trim().is_empty() && !line.starts_with("running ") {
                eprintln!("[worker {idx}] {line}");
            }
        }
    });
    (child, rx)
}

/// Starts worker `idx` and waits until it serves.
fn spawn_worker(prefix: &str, idx: usize, seed: u64, gen: u64) -> Worker {
    let (child, rx) = start_worker(prefix, idx, seed, gen);
    let ids = rx
        .recv_timeout(WATCHDOG)
        .unwrap_or_else(|_| panic!("watchdog: worker {idx} never got ready"))
        .split(' ')
        .map(|s| s.parse().unwrap())
        .collect();
    Worker { child, ids }
}

fn signal(pid: u32, sig: rustix::process::Signal) {
    rustix::process::kill_process(rustix::process::Pid::from_raw(pid as i32).unwrap(), sig)
        .unwrap();
}

/// Waits until every thread of `pid` is stopped.
fn wait_stopped(pid: u32) {
    wait_until("worker stopped", || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .map(|d| {
                d.flatten().all(|t| {
                    let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                    stat.rsplit(") ").next().is_some_and(|r| r.starts_with('T'))
                })
            })
            .unwrap_or(true)
    });
}

/// The status once nothing of a dead process is left in it: every
/// channel's ends and every buffer's owner a listed stack, no stack of
/// the `dead` pids, no dead slot kept (watchdog: fail with the status).
fn settled(prefix: &str, dead: &[u32], what: &str) -> Status {
    let deadline = Instant::now() + WATCHDOG;
    loop {
        let text = xio_core::manager::query_status_within(prefix, WATCHDOG).unwrap();
        let st = parse_status(&text);
        let live = |id: u16| st.stacks.iter().any(|s| s.id == id);
        let ok = st.stacks.iter().all(|s| !dead.contains(&s.pid))
            && st.channels.iter().all(|&(a, b)| live(a) && live(b))
            && st.owners.iter().all(|&o| live(o))
            && st.dead_lines.is_empty();
        if ok {
            return st;
        }
        assert!(
            Instant::now() < deadline,
            "watchdog: {what}: the manager still shows the dead:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn chaos_kill_workers_mid_traffic() {
    if std::env::var_os("XIO_CHAOS_ROLE").is_some() {
        return;
    }
    let seed = seed_from_env("XIO_CHAOS_SEED");
    let rounds = env_u64("XIO_CHAOS_ROUNDS").unwrap_or(DEFAULT_ROUNDS);
    eprintln!("chaos seed {seed}, {rounds} rounds (replay: XIO_CHAOS_SEED={seed})");
    let mut rng = Rng(seed);

    let dir = process_run_dir("xio-chaos");
    let prefix = "chaos";
    let sock = dir.join(format!("{prefix}.sock"));
    let mut m = Reap(
        Command::new(BIN)
            .args(["--prefix", prefix])
            .args([
                "--class", "2K:8192", "--class", "64K:1024", "--class", "1M:32",
            ])
            .args(["--max-stacks", "64", "--max-channels", "256"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("manager socket", || sock.exists());
    let mpid = m.0.id();
    let fds_before = fds_of(mpid);

    let mut gen = 0u64;
    // The manager's fds once the dead are settled, by how many workers
    // live then.
    let mut fds_with: HashMap<usize, u64> = HashMap::new();
    let mut workers: Vec<Worker> = (0..WORKERS)
        .map(|i| spawn_worker(prefix, i, seed, gen))
        .collect();
    for round in 0..rounds {
        gen += 1;
        std::thread::sleep(Duration::from_millis(rng.range(20, 400)));
        let n_victims = if rng.pct(30) { 2 } else { 1 };
        let mut victims: Vec<usize> = Vec::new();
        while victims.len() < n_victims {
            let v = rng.range(0, WORKERS as u64) as usize;
            if !victims.contains(&v) {
                victims.push(v);
            }
        }
        let how = rng.range(0, 4);
        let how_name = [
            "kill",
            "stop then kill",
            "churn then kill",
            "kill, then kill a new one mid-startup",
        ][how as usize];
        // Respawned at once, before the manager has seen the death (its
        // addresses must bind at once), or once it shows nothing of it.
        let early = rng.pct(40);
        eprintln!(
            "round {round}: {how_name} workers {victims:?}{}",
            if early { ", respawned at once" } else { "" }
        );
        let mut dead_pids = Vec::new();
        for &v in &victims {
            let w = &mut workers[v];
            let pid = w.child.id();
            match how {
                1 => {
                    signal(pid, rustix::process::Signal::STOP);
                    wait_stopped(pid);
                    std::thread::sleep(Duration::from_millis(rng.range(10, 300)));
                }
                2 => {
                    let stdin = w.child.stdin.as_mut().unwrap();
                    writeln!(stdin, "churn").unwrap();
                    stdin.flush().unwrap();
                    std::thread::sleep(Duration::from_millis(rng.range(1, 100)));
                }
                _ => {}
            }
            signal(pid, rustix::process::Signal::KILL);
            let st = w.child.wait().unwrap();
            assert_eq!(
                std::os::unix::process::ExitStatusExt::signal(&st),
                Some(libc::SIGKILL),
                "round {round}: worker {v} ended by itself before the kill: {st:?}; seed {seed}"
            );
            dead_pids.push(pid);
            if how == 3 {
                // Killed inside its attach, bind, listen or first
                // connects.
                let (mut c, _ready) = start_worker(prefix, v, seed, gen | 1 << 20);
                std::thread::sleep(Duration::from_micros(rng.range(0, 60_000)));
                signal(c.id(), rustix::process::Signal::KILL);
                dead_pids.push(c.id());
                c.wait().unwrap();
            }
        }
        // The survivors live on (a failed check aborts them).
        for (i, w) in workers.iter_mut().enumerate() {
            if !victims.contains(&i) {
                if let Some(st) = w.child.try_wait().unwrap() {
                    panic!("round {round}: worker {i} died ({st:?}); seed {seed}");
                }
            }
        }
        if early {
            for &v in &victims {
                workers[v] = spawn_worker(prefix, v, seed, gen);
            }
        }
        let st = settled(prefix, &dead_pids, &format!("round {round}"));
        if !early {
            for &v in &victims {
                for id in &workers[v].ids {
                    assert!(
                        !st.stacks.iter().any(|s| s.id == *id),
                        "round {round}: killed worker {v}'s stack {id} still listed"
                    );
                }
            }
        }
        let fds = fds_of(mpid);
        eprintln!("round {round}: manager fds {fds}");
        if !early {
            // The same survivors' worth of stacks holds no more fds than
            // the first time: what the dead held was closed (waited for:
            // the end of our status query may not be seen yet).
            let survivors = WORKERS - victims.len();
            let first = *fds_with.entry(survivors).or_insert(fds);
            wait_until("the manager's fds back down", || fds_of(mpid) <= first);
        }
        if !early {
            for &v in &victims {
                workers[v] = spawn_worker(prefix, v, seed, gen);
            }
        }
    }
    // Survivors of the last round too: still alive, then all killed.
    for (i, w) in workers.iter_mut().enumerate() {
        if let Some(st) = w.child.try_wait().unwrap() {
            panic!("worker {i} died ({st:?}); seed {seed}");
        }
    }
    for w in &mut workers {
        let stdin = w.child.stdin.as_mut().unwrap();
        writeln!(stdin, "stats").unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    let pids: Vec<u32> = workers.iter().map(|w| w.child.id()).collect();
    for w in &mut workers {
        let _ = w.child.kill();
        let _ = w.child.wait();
    }
    settled(prefix, &pids, "all workers killed");
    wait_until("pool whole", || {
        let st = parse_status(&xio_core::manager::query_status_within(prefix, WATCHDOG).unwrap());
        st.stacks.is_empty() && st.channels.is_empty() && !st.in_use
    });
    // Waited for: the manager may not have seen the end of our last
    // status query yet.
    let deadline = Instant::now() + WATCHDOG;
    while fds_of(mpid) > fds_before {
        if Instant::now() > deadline {
            let fds: Vec<String> = std::fs::read_dir(format!("/proc/{mpid}/fd"))
                .unwrap()
                .flatten()
                .map(|e| {
                    let l = std::fs::read_link(e.path()).unwrap_or_default();
                    format!("{} -> {}", e.file_name().to_string_lossy(), l.display())
                })
                .collect();
            panic!(
                "the manager holds {} fds, {fds_before} before any worker: {fds:#?}",
                fds.len()
            );
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(m.0.try_wait().unwrap().is_none(), "the manager died");
    m.signal(rustix::process::Signal::TERM);
    assert!(m.0.wait().unwrap().success());
    eprintln!("chaos seed {seed}: {rounds} rounds passed");
    let _ = std::fs::remove_dir_all(&dir);
}

//! Cross-process tests of the socket interface's data path
//! ([`xio_core::net`]): echo streams with every byte checked, windows and
//! credit, half close, slow readers, pool pressure, zero copy, write
//! batches, and forged descriptors that must hurt no other connection.

mod common;

use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use common::sockets::*;
use common::*;
use xio_core::net::{Event, Net, XioStream};

/// Entry point of child processes (a no-op when run as a normal test).
#[test]
fn child_main() {
    let Some((role, a)) = child_role() else {
        return;
    };
    match role.as_str() {
        "echo_server" => echo_server(&a[0], a[1].parse().unwrap()),
        "stream_clients" => stream_clients(
            &a[0],
            a[1].parse().unwrap(),
            a[2].parse().unwrap(),
            a[3].parse().unwrap(),
            a[4].parse().unwrap(),
        ),
        "slow_reader_server" => slow_reader_server(&a[0], a[1].parse().unwrap()),
        r => panic!("unknown role {r}"),
    }
}

/// A thread-per-connection echo server, as a std user would write it.
fn echo_server(prefix: &str, addr: SocketAddr) {
    let net = Net::attach(prefix).unwrap();
    let l = net.listen(addr).unwrap();
    println!("XIO:ready");
    for s in l.incoming() {
        let mut s = s.unwrap();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 20];
            let mut rng = (s.token() | 1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
            loop {
                rng ^= rng << 13;
                rng ^= rng >> 7;
                rng ^= rng << 17;
                // Random read sizes, 1 B to 1 MiB.
                let want = 1 + (rng as usize % buf.len());
                match s.read(&mut buf[..want]) {
                    Ok(0) => break,
                    Ok(n) => {
                        if s.write_all(&buf[..n]).is_err() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        });
    }
}

/// One write of several windows to a reader asleep on its doorbell (the
/// blocking wait mode sleeps at once): the buffers pushed before the
/// writer runs out of credit must ring the reader, or neither side ever
/// wakes.
#[test]
fn a_write_beyond_the_window_wakes_a_sleeping_reader() {
    let (mgr, p) = start("bigwrite");
    let server = Net::builder(&p)
        .wait_mode(xio_core::WaitMode::Blocking)
        .attach()
        .unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.61.0.5:80".parse().unwrap();
    let l = server.listen(addr).unwrap();
    let mut c = client.connect(addr).unwrap();
    c.write_all(b"hi").unwrap();
    let (mut s, _) = l.accept().unwrap();
    let total = 4 * client.window();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 1 << 16];
        let mut got = 0;
        loop {
            match s.read(&mut buf).unwrap() {
                0 => break,
                n => {
                    assert!(buf[..n].iter().all(|&b| b == 3 || b == b'h' || b == b'i'));
                    got += n;
                }
            }
        }
        got
    });
    // Give the reader time to fall asleep on its doorbell (not a bound:
    // the test passes either way when the fix is in).
    std::thread::sleep(Duration::from_millis(50));
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = done.clone();
    let writer = std::thread::spawn(move || {
        c.write_all(&vec![3u8; total]).unwrap();
        flag.store(true, std::sync::atomic::Ordering::Release);
        drop(c);
    });
    wait_until("the big write finishes", || {
        done.load(std::sync::atomic::Ordering::Acquire)
    });
    writer.join().unwrap();
    assert_eq!(reader.join().unwrap(), total + 2);
    drop(l);
    wait_closed(&client, &server);
    drop((client, server));
    wait_pool_whole(&mgr);
}

/// Each process chooses its window, and they are not exchanged: a
/// writer whose whole window is below a quarter of its reader's used to
/// wait for credit for good (the reader credited back only a quarter of
/// its own window at a time).
#[test]
fn windows_of_different_sizes_still_credit_the_writer() {
    let (mgr, p) = start("windows");
    let server = Net::builder(&p).window(16 << 20).attach().unwrap();
    let client = Net::attach(&p).unwrap();
    assert!(
        4 * client.window() <= server.window(),
        "the case under test"
    );
    let addr: SocketAddr = "10.61.0.6:80".parse().unwrap();
    let l = server.listen(addr).unwrap();
    let mut c = client.connect(addr).unwrap();
    let total = 4 * client.window();
    let writer = std::thread::spawn(move || {
        c.write_all(&vec![5u8; total]).unwrap();
        c
    });
    let (mut s, _) = l.accept().unwrap();
    // The watchdog: a starved writer shows as a timed-out read.
    s.set_read_timeout(Some(WATCHDOG)).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0;
    while got < total {
        let n = s.read(&mut buf).unwrap();
        assert!(n > 0 && buf[..n].iter().all(|&b| b == 5));
        got += n;
    }
    drop(writer.join().unwrap());
    assert_eq!(
        s.read(&mut buf).unwrap(),
        0,
        "end of stream after every byte"
    );
    drop((s, l));
    wait_closed(&client, &server);
    drop((client, server));
    wait_pool_whole(&mgr);
}

/// A deterministic byte stream: byte `i` of stream `seed`.
fn stream_byte(seed: u64, i: u64) -> u8 {
    let x = (i / 8).wrapping_add(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let x = (x ^ (x >> 29)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    (x >> (8 * (i % 8))) as u8
}

/// Runs one checksummed echo exchange of `total` bytes on `s`: a writer
/// thread sends with random write sizes (1 B to 1 MiB), this thread reads
/// with random read sizes and checks every byte.
fn checked_echo(s: XioStream, seed: u64, total: u64) {
    let w = s.try_clone().unwrap();
    let writer = std::thread::spawn(move || {
        let mut w = w;
        let mut rng = seed | 1;
        let mut sent = 0u64;
        let mut chunk = Vec::new();
        while sent < total {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let n = (1 + rng % (1 << 20)).min(total - sent);
            chunk.clear();
            chunk.extend((sent..sent + n).map(|i| stream_byte(seed, i)));
            w.write_all(&chunk).unwrap();
            sent += n;
        }
        w.shutdown(Shutdown::Write).unwrap();
    });
    let mut r = s;
    let mut rng = seed.rotate_left(17) | 1;
    let mut got = 0u64;
    let mut buf = vec![0u8; 1 << 20];
    loop {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        let want = 1 + (rng as usize % buf.len());
        let n = r.read(&mut buf[..want]).unwrap();
        if n == 0 {
            break;
        }
        for (k, &b) in buf[..n].iter().enumerate() {
            assert_eq!(
                b,
                stream_byte(seed, got + k as u64),
                "byte {} of stream {seed}",
                got + k as u64
            );
        }
        got += n as u64;
    }
    assert_eq!(got, total, "stream {seed}: every byte back");
    writer.join().unwrap();
}

/// `conns` concurrent connections, each a checksummed echo of `bytes`.
fn stream_clients(prefix: &str, addr: SocketAddr, conns: u64, bytes: u64, seed0: u64) {
    let net = Net::attach(prefix).unwrap();
    let hs: Vec<_> = (0..conns)
        .map(|i| {
            let net = net.clone();
            std::thread::spawn(move || {
                let s = net.connect(addr).unwrap();
                checked_echo(s, seed0 + i, bytes);
            })
        })
        .collect();
    for h in hs {
        h.join().unwrap();
    }
    wait_until("client connections closed", || net.connections() == 0);
    println!("XIO:done");
}

fn run_echo(test: &str, port: u16, procs: u64, conns: u64, bytes: u64) {
    let (mgr, p) = start(test);
    let addr: SocketAddr = format!("10.3.0.1:{port}").parse().unwrap();
    let mut server = serving("echo_server", &p, addr);
    let clients: Vec<_> = (0..procs)
        .map(|k| {
            ChildProc::spawn(
                "child_main",
                "stream_clients",
                &[
                    p.clone(),
                    addr.to_string(),
                    conns.to_string(),
                    bytes.to_string(),
                    (k * 100_000).to_string(),
                ],
            )
        })
        .collect();
    for mut c in clients {
        c.expect("done");
        c.wait_success();
    }
    server.kill9();
    wait_pool_whole(&mgr);
}

#[test]
fn echo_one_client_large_random_stream() {
    run_echo("echo1", 1, 1, 1, 24 << 20);
}

#[test]
fn echo_64_concurrent_clients() {
    run_echo("echo64", 2, 2, 32, 1 << 20);
}

#[test]
fn echo_1000_concurrent_clients() {
    run_echo("echo1000", 3, 4, 250, 16 << 10);
}

/// In one process: a listener and its clients on the same stack (no
/// channel: the table delivers to itself), with half-close.
#[test]
fn same_process_half_close_and_eof() {
    let (_mgr, p) = start("sameproc");
    let net = Net::attach(&p).unwrap();
    let l = net.listen("10.3.0.2:80").unwrap();
    let c = std::thread::spawn({
        let net = net.clone();
        move || {
            let mut s = net.connect("10.3.0.2:80").unwrap();
            s.write_all(b"request").unwrap();
            s.shutdown(Shutdown::Write).unwrap();
            let mut back = String::new();
            s.read_to_string(&mut back).unwrap();
            back
        }
    });
    let (mut s, peer) = l.accept().unwrap();
    assert_eq!(peer, net_peer(&s));
    let mut req = Vec::new();
    s.read_to_end(&mut req).unwrap();
    assert_eq!(req, b"request", "end of stream after every byte");
    s.write_all(b"response after the client's FIN").unwrap();
    drop(s);
    assert_eq!(c.join().unwrap(), "response after the client's FIN");
    wait_until("connections closed", || net.connections() == 0);
}

fn net_peer(s: &XioStream) -> SocketAddr {
    s.peer_addr().unwrap()
}

/// Accepts A then B; echoes on B; reads nothing on A until B says so,
/// then reads all of A and reports what it got on B.
fn slow_reader_server(prefix: &str, addr: SocketAddr) {
    let net = Net::attach(prefix).unwrap();
    let l = net.listen(addr).unwrap();
    println!("XIO:ready");
    let (mut a, _) = l.accept().unwrap();
    let (mut b, _) = l.accept().unwrap();
    let mut msg = [0u8; 64];
    loop {
        b.read_exact(&mut msg).unwrap();
        if msg[0] == b'!' {
            break;
        }
        b.write_all(&msg).unwrap();
    }
    let mut got = 0u64;
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = a.read(&mut buf).unwrap();
        if n == 0 {
            break;
        }
        for (k, &x) in buf[..n].iter().enumerate() {
            assert_eq!(x, stream_byte(7, got + k as u64));
        }
        got += n as u64;
    }
    b.write_all(&got.to_le_bytes()).unwrap();
    b.read_exact(&mut [0u8; 1]).unwrap_err();
}

#[test]
fn slow_reader_does_not_starve_others_and_loses_nothing() {
    let (mgr, p) = start("slow");
    let addr: SocketAddr = "10.3.0.6:80".parse().unwrap();
    let server = serving("slow_reader_server", &p, addr);
    let total: u64 = 32 << 20;
    {
        let net = Net::attach(&p).unwrap();
        let a = net.connect(addr).unwrap();
        let mut b = net.connect(addr).unwrap();
        // A writes far more than the window; its reader is not reading.
        let writer = std::thread::spawn(move || {
            let mut a = a;
            let mut sent = 0u64;
            let mut chunk = vec![0u8; 300_000];
            while sent < total {
                let n = (chunk.len() as u64).min(total - sent) as usize;
                for (k, x) in chunk[..n].iter_mut().enumerate() {
                    *x = stream_byte(7, sent + k as u64);
                }
                a.write_all(&chunk[..n]).unwrap();
                sent += n as u64;
            }
        });
        // Meanwhile B keeps working, and the pool is never taken by A.
        wait_until("A's window full", || {
            mgr.usage().iter().any(|c| c.free < c.total)
        });
        for i in 0..2000u64 {
            let mut m = [0u8; 64];
            fill(&mut m, i);
            m[0] = b'.';
            b.write_all(&m).unwrap();
            let mut back = [0u8; 64];
            b.read_exact(&mut back).unwrap();
            assert_eq!(back, m);
        }
        let usage = mgr.usage();
        let held: u64 = usage
            .iter()
            .map(|c| u64::from(c.total - c.free) * u64::from(c.buf_size))
            .sum();
        assert!(
            held <= 4 * net.window() as u64,
            "a stalled reader holds at most about a window ({held} bytes in use)"
        );
        b.write_all(&[b'!'; 64]).unwrap();
        writer.join().unwrap();
        // Closing A (its last handle went with the writer thread) sends a FIN.
        let mut got = [0u8; 8];
        b.read_exact(&mut got).unwrap();
        assert_eq!(u64::from_le_bytes(got), total, "every byte of A arrived");
    }
    server.wait_success();
    wait_pool_whole(&mgr);
}

#[test]
fn zero_copy_buffers_vectored_writes_timeouts_and_poll() {
    let (_mgr, p) = start("zc");
    let srv = Net::attach(&p).unwrap();
    let cli = Net::attach(&p).unwrap();
    let l = srv.listen("10.3.0.7:0").unwrap();
    let addr = l.local_addr().unwrap();
    assert_ne!(addr.port(), 0, "port 0 picks one");
    // The handshake is answered by the listening process when one of its
    // threads waits in X-IO: here, an accept in another thread.
    let l2 = l.try_clone().unwrap();
    let acc = std::thread::spawn(move || l.accept().unwrap().0);
    let c = cli.connect(addr).unwrap();
    let s = acc.join().unwrap();
    // The first handle is gone with its thread; the clone still listens.
    let acc = std::thread::spawn(move || {
        l2.accept().unwrap();
        l2
    });
    drop(cli.connect(addr).unwrap());
    drop(acc.join().unwrap());
    // (A fresh net: `cli` has the route cached, and would hear the
    // refusal only at its first read.)
    let e = Net::attach(&p).unwrap().connect(addr).unwrap_err();
    assert_eq!(
        e.kind(),
        std::io::ErrorKind::ConnectionRefused,
        "unbound with the last handle"
    );

    // write_vectored: header + body leave as one buffer.
    let n = (&c)
        .write_vectored(&[IoSlice::new(b"HEADER\r\n"), IoSlice::new(&[7u8; 1000])])
        .unwrap();
    assert_eq!(n, 1008);
    let b = s.recv_buf().unwrap().unwrap();
    assert_eq!(b.len(), 1008, "one descriptor for header and body");
    assert_eq!(&b[..8], b"HEADER\r\n");
    drop(b);

    // alloc + send_buf, received by an ordinary read in small pieces, then
    // a recv_buf of the rest of the same buffer.
    let mut m = c.alloc(100).unwrap();
    for (i, x) in m.iter_mut().enumerate() {
        *x = i as u8;
    }
    c.send_buf(m).unwrap();
    let mut three = [0u8; 3];
    (&s).read_exact(&mut three).unwrap();
    assert_eq!(three, [0, 1, 2]);
    let rest = s.recv_buf().unwrap().unwrap();
    assert_eq!(rest.len(), 97);
    assert_eq!(rest[0], 3);
    // Forward the received buffer in place.
    let mut fwd = rest.into_mut();
    fwd[0] = 0xff;
    s.send_buf(fwd).unwrap();
    let mut got = [0u8; 97];
    (&c).read_exact(&mut got).unwrap();
    assert_eq!(got[0], 0xff);
    assert_eq!(got[1], 4);

    // peek waits as read does and leaves the bytes for the next read.
    (&c).write_all(b"peek").unwrap();
    let mut four = [0u8; 4];
    let mut seen = 0;
    while seen < 4 {
        seen = s.peek(&mut four).unwrap();
    }
    assert_eq!(&four, b"peek");
    let mut again = [0u8; 4];
    (&s).read_exact(&mut again).unwrap();
    assert_eq!(&again, b"peek");
    // nodelay reports what was set (false at first, as TCP's).
    assert!(!s.nodelay().unwrap() && s.take_error().unwrap().is_none());
    s.set_nodelay(true).unwrap();
    assert!(s.nodelay().unwrap());

    // Timeouts and non-blocking mode.
    s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    let e = (&s).read(&mut three).unwrap_err();
    // As std's TcpStream on Linux: WouldBlock, which says it was the timeout.
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    assert!(e
        .get_ref()
        .is_some_and(|i| i.is::<xio_core::net::TimeoutElapsed>()));
    s.set_nonblocking(true).unwrap();
    let e = (&s).read(&mut three).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
    assert!(!e
        .get_ref()
        .is_some_and(|i| i.is::<xio_core::net::TimeoutElapsed>()));

    // poll: the first reports the stream writable (as epoll reports a
    // socket added), then readiness of the server's stream once the
    // client writes.
    let mut evs = Vec::new();
    srv.poll(&mut evs, Some(Duration::from_millis(1))).unwrap();
    assert_eq!(
        evs,
        [Event::Stream {
            token: s.token(),
            readable: false,
            writable: true
        }]
    );
    evs.clear();
    assert_eq!(
        srv.poll(&mut evs, Some(Duration::from_millis(1))).unwrap(),
        0
    );
    (&c).write_all(b"ping").unwrap();
    while evs.is_empty() {
        srv.poll(&mut evs, Some(Duration::from_secs(1))).unwrap();
    }
    assert!(evs.contains(&Event::Stream {
        token: s.token(),
        readable: true,
        writable: false
    }));
    let mut ping = [0u8; 4];
    (&s).read_exact(&mut ping).unwrap();
    assert_eq!(&ping, b"ping");
}

/// A connection whose reader stopped reading can hold a whole buffer
/// class (its window of unread data is larger than the class): another
/// connection's small writes then take buffers of a larger class instead
/// of waiting for a reader that may never read.
#[test]
fn a_stalled_reader_holding_a_class_does_not_stop_other_writes() {
    let (mgr, p) = start_with(
        "stalled",
        // No quota, so the stalled reader can hold the whole small class
        // (the default quota would stop its writer at half; see
        // tests/hardening.rs).
        xio_core::layout::PoolConfig {
            classes: vec![(2 << 10, 64), (64 << 10, 64)],
            quotas: vec![(2 << 10, 64), (64 << 10, 64)],
            ..Default::default()
        },
    );
    let srv = Net::attach(&p).unwrap();
    let cli = Net::attach(&p).unwrap();
    let stalled = srv.listen("10.3.0.10:80").unwrap();
    let c = cli.connect("10.3.0.10:80").unwrap();
    let never_read = accept_soon(&stalled);
    c.set_nonblocking(true).unwrap();
    let chunk = [7u8; 2048];
    let mut unread = 0;
    loop {
        match (&c).write(&chunk) {
            Ok(n) => unread += n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("write: {e}"),
        }
    }
    assert_eq!(mgr.usage()[0].free, 0, "the small class is held unread");
    assert!(unread > 64 * 2048, "writes went on in larger buffers");
    // A 10 KiB write now fills one large buffer, not five at 2 KiB each.
    // (The accept drains the server's rings first: what it packs there
    // frees large buffers, so count only after. DPDK's mempools take
    // buffers into per-core caches in bulk: no exact count there.)
    let other = cli.connect("10.3.0.10:80").unwrap();
    let other_end = accept_soon(&stalled);
    let free_large = mgr.usage()[1].free;
    (&other).write_all(&[9u8; 10 << 10]).unwrap();
    if test_backend() == xio_core::manager::Backend::Shm {
        assert_eq!(mgr.usage()[1].free, free_large - 1, "one 64 KiB buffer");
    }
    drop((other, other_end));
    let echo = srv.listen("10.3.0.11:80").unwrap();
    let server = std::thread::spawn(move || echo_one(echo.accept().unwrap().0));
    let mut s = cli.connect("10.3.0.11:80").unwrap();
    s.set_read_timeout(Some(WATCHDOG)).unwrap();
    s.set_write_timeout(Some(WATCHDOG)).unwrap();
    s.write_all(b"hello").unwrap();
    let mut b = [0u8; 5];
    s.read_exact(&mut b)
        .expect("an echo while the small class is held");
    assert_eq!(&b, b"hello");
    server.join().unwrap();
    drop((s, c, never_read, stalled, cli, srv));
    wait_pool_whole(&mgr);
}

/// A client pipelines many small requests and reads the replies only
/// after writing them all (a Redis pipeline, `Framed::send` in a loop).
/// Each write takes a buffer, and a window counts buffer capacity: the
/// replies the client has not read yet are packed into the buffers
/// already queued, or a thousand 10-byte replies would fill its window,
/// the server would stop reading, and both would wait for ever.
#[test]
fn pipelined_small_writes_do_not_fill_the_window() {
    setup();
    let p = prefix("pipeline");
    let mgr = manager_builder(&p).spawn().unwrap();
    const N: usize = 20_000;
    let srv = Net::attach(&p).unwrap();
    let cli = Net::attach(&p).unwrap();
    let l = srv.listen("10.3.0.12:80").unwrap();
    let server = std::thread::spawn(move || {
        let mut s = l.accept().unwrap().0;
        s.set_write_timeout(Some(WATCHDOG)).unwrap();
        let mut req = [0u8; 10];
        for _ in 0..N {
            s.read_exact(&mut req).unwrap();
            s.write_all(&req).unwrap();
        }
    });
    let mut c = cli.connect("10.3.0.12:80").unwrap();
    c.set_write_timeout(Some(WATCHDOG)).unwrap();
    c.set_read_timeout(Some(WATCHDOG)).unwrap();
    for i in 0..N {
        let mut m = [b'.'; 10];
        m[..8].copy_from_slice(&(i as u64).to_le_bytes());
        c.write_all(&m)
            .expect("the window filled with unread replies");
    }
    let mut got = vec![0u8; 10 * N];
    c.read_exact(&mut got).unwrap();
    for (i, m) in got.chunks(10).enumerate() {
        assert_eq!(m[..8], (i as u64).to_le_bytes(), "reply {i}");
    }
    server.join().unwrap();
    drop((c, cli, srv));
    wait_pool_whole(&mgr);
}

/// A pool far smaller than the window: writers wait for buffers (falling
/// back to other classes first) while the reader is slow, and every byte
/// arrives once it reads.
#[test]
fn pool_exhaustion_is_a_wait_not_an_error() {
    let (mgr, p) = start_with(
        "tinypool",
        // No quota: the writer is to run the whole pool dry.
        xio_core::layout::PoolConfig {
            classes: vec![(2 << 10, 128), (16 << 10, 16)],
            quotas: vec![(2 << 10, 128), (16 << 10, 16)],
            ..Default::default()
        },
    );
    let total: u64 = 4 << 20;
    {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        assert!(
            srv.window() as u64 > 512 << 10,
            "window larger than the pool"
        );
        let l = srv.listen("10.3.0.9:80").unwrap();
        let acc = std::thread::spawn(move || l.accept().unwrap().0);
        let c = cli.connect("10.3.0.9:80").unwrap();
        let s = acc.join().unwrap();
        let writer = std::thread::spawn(move || {
            let mut sent = 0u64;
            let mut chunk = vec![0u8; 40_000];
            while sent < total {
                let n = (chunk.len() as u64).min(total - sent) as usize;
                for (k, x) in chunk[..n].iter_mut().enumerate() {
                    *x = stream_byte(3, sent + k as u64);
                }
                (&c).write_all(&chunk[..n]).unwrap();
                sent += n as u64;
            }
            c.shutdown(Shutdown::Write).unwrap();
        });
        // Let the writer run into the empty pool before reading.
        wait_until("pool exhausted", || mgr.usage().iter().all(|u| u.free == 0));
        let mut got = 0u64;
        let mut buf = vec![0u8; 7000];
        loop {
            let n = (&s).read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            for (k, &x) in buf[..n].iter().enumerate() {
                assert_eq!(x, stream_byte(3, got + k as u64));
            }
            got += n as u64;
        }
        assert_eq!(got, total);
        writer.join().unwrap();
    }
    wait_pool_whole(&mgr);
}

/// `send_buf` with a buffer of another pool: `InvalidInput`, the buffer
/// handed back, the connection still usable, both pools whole after.
#[test]
fn send_buf_refuses_a_buffer_of_another_pool() {
    let (mgr2, p2) = start("foreignbuf-2");
    // The other pool is shm even when the suite runs on DPDK (a process
    // joins one DPDK prefix only).
    let p1 = prefix("foreignbuf-1");
    let mgr1 = xio_core::manager::Manager::builder(&p1)
        .backend(xio_core::manager::Backend::Shm)
        .spawn()
        .unwrap();
    let stack1 = xio_core::stack::Stack::attach(&p1).unwrap();
    let net2 = Net::attach(&p2).unwrap();
    let l = net2.listen("10.3.0.9:80").unwrap();
    let s = net2.connect("10.3.0.9:80").unwrap();
    let (mut srv, _) = l.accept().unwrap();
    let mut other = stack1.alloc(16).unwrap();
    other.copy_from(b"from pool one..!");
    let (e, back) = s.send_buf(other).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
    assert_eq!(&back.expect("handed back")[..], b"from pool one..!");
    (&s).write_all(b"still works").unwrap();
    let mut got = [0u8; 11];
    srv.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"still works");
    drop((s, srv, l, stack1, net2));
    wait_pool_whole(&mgr1);
    wait_pool_whole(&mgr2);
}

/// A peer's descriptors are untrusted: a raw stack throws 20,000 random
/// descriptors at a socket server (every kind, with and without the early
/// flag, connection ids both random and close to real ones, SYNs to the
/// listener and to nobody, real buffers under every kind) and never
/// drains what the server answers. The server's other client, whose
/// connection stays open across the attack, notices nothing; new
/// connections still work; and once everyone is gone the pool is whole.
#[test]
fn hostile_descriptors_hurt_no_other_connection() {
    use xio_core::layout::{kind, Descriptor};
    use xio_core::stack::Stack;

    let (mgr, p) = start("hostile");
    let addr: SocketAddr = "10.3.9.1:7000".parse().unwrap();
    let mut server = serving("echo_server", &p, addr);
    let net = Net::attach(&p).unwrap();
    let s = net.connect(addr).unwrap();
    echo_check(&s, b"before the attack");

    let mut evil = Stack::attach(&p).unwrap();
    let victim = evil.connect(addr).unwrap();
    let SocketAddr::V4(v4) = addr else {
        unreachable!()
    };
    let listener_ip = u32::from(*v4.ip());
    let mut rng = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut pushed = 0;
    for i in 0..20_000u32 {
        let r = next();
        let k = match r % 10 {
            0..=7 => (r % 8) as u8,
            8 => (r >> 8) as u8,
            _ => kind::SYN4,
        } | if r & (1 << 20) != 0 { kind::EARLY } else { 0 };
        let r2 = next();
        // Connection ids: small ones and generation-tagged small indices
        // name the server's real connections; the rest are noise.
        let conn = match r2 % 4 {
            0 => (r2 >> 8) as u32 % 64,
            1 => (((r2 >> 8) as u32 % 4) << 20) | ((r2 >> 16) as u32 % 64),
            _ => (r2 >> 8) as u32,
        };
        if i % 10 == 0 {
            // A real buffer under any kind.
            let mut b = evil.alloc(64 + (r2 % 2000) as usize).unwrap();
            b.fill(0xa5);
            loop {
                match evil.__push_buf_raw(victim, k, conn, b).unwrap() {
                    None => break,
                    Some(back) => {
                        b = back;
                        std::thread::sleep(Duration::from_micros(100));
                    }
                }
            }
            pushed += 1;
            continue;
        }
        let r3 = next();
        let mut d = Descriptor {
            index: (r3 >> 32) as u32 % 70_000,
            len: r3 as u32 % 5000,
            conn,
            class: (r3 >> 24) as u8 % 5,
            kind: k,
            gen: (r3 >> 40) as u16,
        };
        if kind::base(k) == kind::SYN4 && i % 500 == 5 {
            // A connection the server will accept (and keep, unused).
            d.index = listener_ip;
            d.len = u32::from(addr.port());
        }
        while !evil.__push_raw(victim, d).unwrap() {
            std::thread::sleep(Duration::from_micros(100));
        }
        pushed += 1;
    }
    assert_eq!(pushed, 20_000);
    // The server looked at them: the buffer-carrying kinds with forged
    // buffer references (most of the noise) are counted as corrupt.
    let slot = evil.__segment().stack_slot(victim.slot());
    wait_until("the server rejected the forgeries", || {
        slot.corrupt.load(std::sync::atomic::Ordering::Relaxed) >= 5_000
    });
    // The open connection and the server are unharmed.
    echo_check(&s, b"after the attack");
    let fresh = net.connect(addr).unwrap();
    checked_echo(fresh, 77, 3 << 20);
    drop(evil);
    echo_check(&s, b"after the attacker left");
    drop(s);
    wait_until("client connections closed", || net.connections() == 0);
    drop(net);
    server.kill9();
    wait_pool_whole(&mgr);
}

fn would_block(s: &XioStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    matches!((&*s).read(&mut b), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

/// `Net::batch_writes` holds this thread's stream writes until the guard
/// drops and then sends them in order; what must not wait for it does not:
/// a FIN goes after the held bytes, a blocking call of the same thread
/// sends them before it waits, 256 held writes leave at once, and another
/// thread's writes are never held.
#[test]
fn a_write_batch_holds_writes_until_it_ends_and_keeps_their_order() {
    let (_mgr, p) = start("batch");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen("10.3.0.30:80").unwrap();
    let mut cs = Vec::new();
    let mut ss = Vec::new();
    for _ in 0..4 {
        cs.push(client.connect("10.3.0.30:80").unwrap());
        ss.push(l.accept().unwrap().0);
    }

    // Several connections, several writes each: nothing leaves while the
    // guard lives (the server's non-blocking reads drain its rings first,
    // so `WouldBlock` means nothing came), all of it when it drops.
    {
        let _batch = client.batch_writes();
        let _inner = client.batch_writes(); // guards nest
        for round in 0..3u8 {
            for (i, c) in cs.iter().enumerate() {
                (&*c).write_all(&[i as u8, round]).unwrap();
            }
        }
        for s in &ss {
            assert!(would_block(s), "a held write arrived");
        }
    }
    for (i, s) in ss.iter().enumerate() {
        let i = i as u8;
        assert_eq!(read_n(s, 6), [i, 0, i, 1, i, 2]);
    }

    {
        let _batch = client.batch_writes();
        // Another thread's writes are not held.
        std::thread::scope(|sc| {
            sc.spawn(|| (&cs[1]).write_all(b"other thread").unwrap());
        });
        assert_eq!(read_n(&ss[1], 12), b"other thread");

        // 256 held writes leave without waiting for the guard.
        for k in 0..300u32 {
            (&cs[2]).write_all(&[k as u8]).unwrap();
        }
        let first: Vec<u8> = (0..256u32).map(|k| k as u8).collect();
        assert_eq!(read_n(&ss[2], 256), first);
        assert!(would_block(&ss[2]), "more than 256 held writes left");

        // A blocking read of this thread sends what is held before it
        // waits (the answer it waits for may depend on it).
        (&cs[3]).write_all(b"ping").unwrap();
        let s3 = &ss[3];
        std::thread::scope(|sc| {
            sc.spawn(|| {
                let got = read_n(s3, 4);
                (&*s3).write_all(&got).unwrap();
            });
            assert_eq!(read_n(&cs[3], 4), b"ping");
        });

        // So does a call that waits for the manager's answer (a listen):
        // the bytes are there when it returns.
        (&cs[3]).write_all(b"before listen").unwrap();
        let _l2 = client.listen("10.3.0.31:80").unwrap();
        // (The non-blocking read drains the server's rings first: what
        // is not there yet was held.)
        ss[3].set_nonblocking(true).unwrap();
        let mut first = [0u8; 1];
        assert_eq!(
            (&ss[3]).read(&mut first).ok(),
            Some(1),
            "held past the wait"
        );
        assert_eq!(&first, b"b");
        assert_eq!(read_n(&ss[3], 12), b"efore listen");

        // A FIN comes after the bytes held before it.
        (&cs[0]).write_all(b"last words").unwrap();
        drop(cs.remove(0));
        let mut rest = Vec::new();
        ss[0].set_nonblocking(false).unwrap();
        ss[0].set_read_timeout(Some(WATCHDOG)).unwrap();
        (&ss[0]).read_to_end(&mut rest).unwrap();
        assert_eq!(rest, b"last words");
    }
    let rest: Vec<u8> = (256..300u32).map(|k| k as u8).collect();
    assert_eq!(read_n(&ss[2], 44), rest);
}

/// Held writes that find the reader's ring full wait in the net's queue
/// and leave as the reader makes room (at the writer's next poll): none is
/// lost or reordered, and the FIN of a stream closed in the batch comes
/// after all of them.
#[test]
fn a_write_batch_larger_than_the_ring_loses_nothing() {
    let (_mgr, p) = start_with(
        "batchfull",
        xio_core::layout::PoolConfig {
            ring_capacity: 64,
            ..Default::default()
        },
    );
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen("10.3.0.31:80").unwrap();
    let c = client.connect("10.3.0.31:80").unwrap();
    let (s, _) = l.accept().unwrap();
    c.set_nonblocking(true).unwrap();
    let mut events = Vec::new();
    client.poll(&mut events, Some(Duration::ZERO)).unwrap();
    let n = 300u32;
    {
        // More than the ring takes and under the 256 a batch holds: at
        // the end the ring's 64 slots take 192 (three descriptors a slot
        // when pushed together) and the rest queue.
        let _batch = client.batch_writes();
        for k in 0..240 {
            (&c).write_all(&[k as u8]).unwrap();
        }
    }
    std::thread::scope(|sc| {
        let reader = sc.spawn(|| {
            s.set_read_timeout(Some(WATCHDOG)).unwrap();
            let mut all = Vec::new();
            (&s).read_to_end(&mut all).unwrap();
            all
        });
        // The next batch, while those wait: a write finds the queue and
        // says `WouldBlock` (what a full socket buffer says); the event
        // loop polls (which pushes what waits) and writes again.
        {
            let _batch = client.batch_writes();
            for k in 240..n {
                while let Err(e) = (&c).write_all(&[k as u8]) {
                    assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock);
                    events.clear();
                    client
                        .poll(&mut events, Some(Duration::from_millis(10)))
                        .unwrap();
                }
            }
            // The FIN goes behind the held bytes and whatever still waits.
            drop(c);
        }
        // The writer's event loop goes on: its polls push what waits.
        while !reader.is_finished() {
            events.clear();
            client
                .poll(&mut events, Some(Duration::from_millis(10)))
                .unwrap();
        }
        let want: Vec<u8> = (0..n).map(|k| k as u8).collect();
        assert_eq!(reader.join().unwrap(), want);
    });
}

/// A write larger than the window on a connection within one net (no
/// ring between the ends: the table delivers to itself) while the reader
/// waits in a blocking read, driving the net: the writer, out of credit,
/// must let the reader know what it delivered, or each waits for the
/// other.
#[test]
fn a_same_net_write_beyond_the_window_wakes_the_driving_reader() {
    let (_mgr, p) = start("localbig");
    let net = Net::attach(&p).unwrap();
    let l = net.listen("10.3.0.42:80").unwrap();
    let c = net.connect("10.3.0.42:80").unwrap();
    let (s, _) = l.accept().unwrap();
    let total = 3 * net.window() / 2;
    let (tx, rx) = std::sync::mpsc::channel();
    // The reader waits first: it drives the net (sleeps on its rings).
    let reader = std::thread::spawn(move || {
        let mut got = vec![0u8; total];
        (&s).read_exact(&mut got).unwrap();
        tx.send(()).unwrap();
        got
    });
    std::thread::sleep(Duration::from_millis(200));
    let writer = std::thread::spawn(move || {
        let data = vec![0x5au8; total];
        (&c).write_all(&data).unwrap();
        c
    });
    let hung = rx.recv_timeout(WATCHDOG).is_err();
    if hung {
        // Ending a write batch runs what the table asked for (its wake-ups
        // included), which ends the hang.
        drop(net.batch_writes());
    }
    let got = reader.join().unwrap();
    drop(writer.join().unwrap());
    assert!(!hung, "reader and writer waited for each other");
    assert!(got.iter().all(|&b| b == 0x5a));
}

/// `XioStream::alloc` waiting for an exhausted class sends what a write
/// batch of its thread holds first, as every wait of the net does: the
/// held buffers may be the ones the class lacks, back once the reader
/// has them.
#[test]
fn an_alloc_waiting_for_the_pool_sends_what_a_write_batch_holds() {
    let (_mgr, p) = start_with(
        "allocbatch",
        xio_core::layout::PoolConfig {
            classes: vec![(2 << 10, 1024), (64 << 10, 8)],
            ..Default::default()
        },
    );
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen("10.3.0.45:80").unwrap();
    let c = client.connect("10.3.0.45:80").unwrap();
    let (s, _) = l.accept().unwrap();
    let chunk = 64 << 10;
    let reader = std::thread::spawn(move || read_n(&s, 8 * chunk));
    // The watchdog: a hang ends in the write timeout's WouldBlock.
    c.set_write_timeout(Some(WATCHDOG)).unwrap();
    let _batch = client.batch_writes();
    for k in 0..8u8 {
        (&c).write_all(&vec![k; chunk]).unwrap();
    }
    // Every 64 KiB buffer is held by the batch.
    let b = c.alloc(chunk);
    assert!(b.is_ok(), "{:?}", b.err());
    let got = reader.join().unwrap();
    for k in 0..8u8 {
        assert!(got[k as usize * chunk..][..chunk].iter().all(|&x| x == k));
    }
}

/// A reader keeps the buffers its reads empty as spares for its next
/// writes. In a pool whose smallest class has few buffers, a reader that
/// never writes must not keep them all: the writer would wait for a
/// buffer for good.
#[test]
fn a_reader_that_never_writes_does_not_keep_a_small_class() {
    let (mgr, p) = start_with(
        "few-spares",
        xio_core::layout::PoolConfig {
            classes: vec![(2048, 8)],
            ..Default::default()
        },
    );
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.61.0.9:80".parse().unwrap();
    let l = server.listen(addr).unwrap();
    let mut c = client.connect(addr).unwrap();
    c.set_write_timeout(Some(WATCHDOG)).unwrap();
    c.write_all(b"hi").unwrap();
    let (mut s, _) = l.accept().unwrap();
    let mut two = [0u8; 2];
    s.read_exact(&mut two).unwrap();
    writes_get_through(&mut c, &mut s, 32);
    drop((c, s, l));
    wait_closed(&client, &server);
    drop((client, server));
    wait_pool_whole(&mgr);
}

/// `poll_write_ready` sets a buffer aside for the write it promises. In a
/// pool whose smallest class is too small for spares (the net keeps none
/// from its reads), it still kept one for good when no write came (a
/// task that polls `ready(READABLE | WRITABLE)` and only reads): with a
/// class of one buffer its peer's writer waited for ever.
#[test]
fn write_readiness_keeps_no_buffer_where_spares_are_not_allowed() {
    let (mgr, p) = start_with(
        "ready-spare",
        xio_core::layout::PoolConfig {
            classes: vec![(2048, 1)],
            ..Default::default()
        },
    );
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.61.0.10:80".parse().unwrap();
    let l = server.listen(addr).unwrap();
    let mut c = client.connect(addr).unwrap();
    c.set_write_timeout(Some(WATCHDOG)).unwrap();
    let (mut s, _) = l.accept().unwrap();
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    assert!(matches!(
        s.poll_write_ready(&mut cx),
        std::task::Poll::Ready(Ok(()))
    ));
    writes_get_through(&mut c, &mut s, 4);
    drop((c, s, l));
    wait_closed(&client, &server);
    drop((client, server));
    wait_pool_whole(&mgr);
}

/// `n` writes of 100 bytes from `c`, each read whole at `s`: in a pool
/// of few buffers, the writer is not left waiting for one the reader
/// keeps (the write timeout is the watchdog).
fn writes_get_through(c: &mut XioStream, s: &mut XioStream, n: u8) {
    for i in 0..n {
        c.write_all(&[i; 100])
            .unwrap_or_else(|e| panic!("write {i}: {e}"));
        let mut got = [0u8; 100];
        s.read_exact(&mut got).unwrap();
        assert!(got.iter().all(|&b| b == i));
    }
}

/// `shutdown(Read)`: reads return end of stream at once, what was queued
/// and what still arrives is discarded and credited back, so the peer's
/// writes go on (neither blocked on a window nobody reads nor reset), and
/// the reader's close is then a FIN, not a reset for unread data. (Linux
/// keeps queued and arriving bytes readable instead; the BSDs discard, as
/// here.) As for everything X-IO receives, this happens while the
/// reader's process calls into its net (a wait, a read, a driver thread).
#[test]
fn shutdown_read_discards_without_stalling_or_resetting_the_writer() {
    let (_mgr, p) = start("shutrd");
    let addr: SocketAddr = "10.3.0.78:80".parse().unwrap();
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen(addr).unwrap();
    let mut c = client.connect(addr).unwrap();
    c.set_write_timeout(Some(WATCHDOG)).unwrap();
    c.write_all(b"queued before the shutdown").unwrap();
    let (mut s, _) = l.accept().unwrap();
    s.set_read_timeout(Some(WATCHDOG)).unwrap();
    s.shutdown(Shutdown::Read).unwrap();
    assert_eq!(s.read(&mut [0u8; 64]).unwrap(), 0);
    // The server's net runs (here waiting for its next connection): with
    // no kernel, the discarding and crediting happen as a net's process
    // calls into it.
    let waiting = std::thread::spawn(move || l.accept().map(drop));
    // Far more than a window: only credit coming back lets it through.
    let chunk = vec![7u8; 64 << 10];
    for _ in 0..128 {
        c.write_all(&chunk)
            .expect("the writer is neither stalled nor reset");
    }
    assert_eq!(s.read(&mut [0u8; 64]).unwrap(), 0);
    drop(client.connect(addr).unwrap());
    waiting.join().unwrap().unwrap();
    // The other direction still works.
    s.write_all(b"still here").unwrap();
    let mut got = [0u8; 10];
    c.set_read_timeout(Some(WATCHDOG)).unwrap();
    c.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"still here");
    drop(s);
    let mut rest = Vec::new();
    c.read_to_end(&mut rest)
        .expect("end of stream, not a reset");
    assert!(rest.is_empty());
}

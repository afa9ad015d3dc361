//! Cross-process tests of the socket interface's connections
//! ([`xio_core::net`]): connect and accept, addresses, refusals and the
//! backlog, resets, timeouts, shutdown, and processes exiting with streams
//! open.

mod common;

use std::io::{Read, Write};
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
        "short_clients" => short_clients(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap()),
        "writer_forever" => writer_forever(&a[0], a[1].parse().unwrap()),
        "reads_one_byte" => reads_one_byte(&a[0], a[1].parse().unwrap()),
        "exits_holding" => exits_holding(&a[0], a[1].parse().unwrap()),
        r => panic!("unknown role {r}"),
    }
}

/// Role of `a_process_exiting_with_open_streams_closes_them`: opens two
/// connections, writes on both, and exits (when told) without closing
/// either, as a program calling `std::process::exit` does.
fn exits_holding(prefix: &str, addr: SocketAddr) {
    static BYE: std::sync::OnceLock<XioStream> = std::sync::OnceLock::new();
    extern "C" fn say_bye() {
        if let Some(s) = BYE.get() {
            let _ = (&*s).write_all(b", bye");
        }
    }
    // Registered before the first attach: exit runs it after the
    // connection closing would have, were that an `atexit` handler too.
    // SAFETY: registers a function that lives as long as the process.
    assert_eq!(unsafe { libc::atexit(say_bye) }, 0);
    let net = Net::attach(prefix).unwrap();
    let mut a = net.connect(addr).unwrap();
    a.write_all(b"last words").unwrap();
    BYE.set(a.try_clone().unwrap()).unwrap();
    let mut b = net.connect(addr).unwrap();
    b.write_all(b"b").unwrap();
    println!("XIO:connected");
    wait_told("exit");
    // No destructor runs from here: `a`, `b` and `net` stay open.
    std::process::exit(0);
}

/// A process that exits with connections open closes them as its sockets
/// would be closed: the peer reads everything and then end of stream (not
/// a reset), and a connection with data the process never read is reset.
#[test]
fn a_process_exiting_with_open_streams_closes_them() {
    let (mgr, p) = start("exitclose");
    let addr: SocketAddr = "10.61.0.9:80".parse().unwrap();
    let net = Net::attach(&p).unwrap();
    let l = net.listen(addr).unwrap();
    let mut child = ChildProc::spawn(
        "child_main",
        "exits_holding",
        &[p.clone(), addr.to_string()],
    );
    child.expect("connected");
    let (mut a, mut b) = (accept_soon(&l), accept_soon(&l));
    for s in [&a, &b] {
        s.set_read_timeout(Some(WATCHDOG)).unwrap();
    }
    let mut first = [0u8; 1];
    a.read_exact(&mut first).unwrap();
    if first[0] == b'b' {
        std::mem::swap(&mut a, &mut b);
        a.read_exact(&mut first).unwrap();
    } else {
        b.read_exact(&mut [0u8; 1]).unwrap();
    }
    assert_eq!(first[0], b'l');
    // Data the child will never read.
    b.write_all(b"unread").unwrap();
    child.tell("exit");
    let mut rest = Vec::new();
    a.read_to_end(&mut rest)
        .expect("end of stream, not a reset");
    assert_eq!(
        rest, b"ast words, bye",
        "the program's own exit handler wrote first"
    );
    let err = b.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    child.wait_success();
    drop((a, b, l, net));
    wait_pool_whole(&mgr);
}

/// Role of `writing_to_a_closed_connection_fails_instead_of_hanging`:
/// reads one byte of each connection and closes it.
fn reads_one_byte(prefix: &str, addr: SocketAddr) {
    let net = Net::attach(prefix).unwrap();
    let l = net.listen(addr).unwrap();
    println!("XIO:ready");
    for s in l.incoming() {
        let mut s = s.unwrap();
        s.read_exact(&mut [0u8; 1]).unwrap();
    }
}

/// A server that read what it wanted and closed: the client sees end of
/// stream, and its writes after that fail with `BrokenPipe` (the closed
/// end answers data with a RST, as TCP's does) instead of filling the
/// window and waiting forever for credit. Nothing stays held.
#[test]
fn writing_to_a_closed_connection_fails_instead_of_hanging() {
    let (mgr, p) = start("closedwrite");
    let addr: SocketAddr = "10.61.0.4:80".parse().unwrap();
    let mut server = serving("reads_one_byte", &p, addr);
    {
        let net = Net::attach(&p).unwrap();
        let mut c = net.connect(addr).unwrap();
        // The watchdog: a hang would end in WouldBlock (the timeout).
        c.set_write_timeout(Some(WATCHDOG)).unwrap();
        c.write_all(b"x").unwrap();
        assert_eq!(c.read(&mut [0u8; 8]).unwrap(), 0, "the server closed");
        // Several times the window: without the RST this waits forever.
        let big = vec![7u8; 4 * net.window()];
        let err = c.write_all(&big).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe, "{err}");
        assert_eq!(
            c.write(b"y").unwrap_err().kind(),
            std::io::ErrorKind::BrokenPipe
        );
        assert_eq!(c.read(&mut [0u8; 8]).unwrap(), 0);
        drop(c);
        // The next connection is served as before.
        let mut c = net.connect(addr).unwrap();
        c.write_all(b"z").unwrap();
        assert_eq!(c.read(&mut [0u8; 8]).unwrap(), 0);
    }
    server.kill9();
    wait_pool_whole(&mgr);
}

/// An address handed over from one live process to another: a client
/// that reached the first keeps its route, and `connect` uses it without
/// waiting for the answer. The refusal that comes back must make the
/// client ask the manager again (it used to dial the old process for
/// good, every connection refused).
#[test]
fn a_refusal_forgets_a_stale_route() {
    let (mgr, p) = start("handover");
    let a = Net::attach(&p).unwrap();
    let b = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.61.0.7:80".parse().unwrap();
    // Process A keeps serving another address, so it keeps looking at
    // its rings and answers SYNs for the one it gave up.
    let other = a
        .listen("10.61.0.8:80".parse::<SocketAddr>().unwrap())
        .unwrap();
    let a_busy = std::thread::spawn(move || other.accept().map(drop));
    let la = a.listen(addr).unwrap();
    let c = client.connect(addr).unwrap();
    let (s, _) = la.accept().unwrap();
    echo_both(&c, &s);
    drop((c, s, la));
    // B takes the address over once A's unbind is through.
    let lb = loop {
        match b.listen(addr) {
            Ok(l) => break l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                std::thread::sleep(Duration::from_millis(1));
            }
            Err(e) => panic!("{e}"),
        }
    };
    let b_serves = std::thread::spawn(move || {
        let (mut s, _) = lb.accept().unwrap();
        let mut x = [0u8; 1];
        s.read_exact(&mut x).unwrap();
        s.write_all(&x).unwrap();
        lb
    });
    // Non-blocking, as an event loop or an async adapter reads: only the
    // refusal itself, read from the rings, can tell the route is stale.
    let mut refused = 0;
    let mut events = Vec::new();
    loop {
        let mut c = client.connect(addr).unwrap();
        c.set_nonblocking(true).unwrap();
        let _ = c.write_all(b"b");
        let mut x = [0u8; 1];
        let r = loop {
            match c.read(&mut x) {
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    client.poll(&mut events, Some(WATCHDOG)).unwrap();
                }
                r => break r,
            }
        };
        match r {
            Ok(1) => {
                assert_eq!(&x, b"b");
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => refused += 1,
            r => panic!("{r:?}"),
        }
        assert!(
            refused <= 1,
            "refused {refused} times: the stale route is kept"
        );
    }
    drop(b_serves.join().unwrap());
    // Wake A's accept loop and let it go.
    drop(
        client
            .connect("10.61.0.8:80".parse::<SocketAddr>().unwrap())
            .unwrap(),
    );
    a_busy.join().unwrap().unwrap();
    drop((a, b, client));
    wait_pool_whole(&mgr);
}

/// One byte each way between `c` and `s`.
fn echo_both(mut c: &XioStream, mut s: &XioStream) {
    let mut x = [0u8; 1];
    c.write_all(b"x").unwrap();
    s.read_exact(&mut x).unwrap();
    s.write_all(&x).unwrap();
    c.read_exact(&mut x).unwrap();
    assert_eq!(&x, b"x");
}

/// The SYN names the listening address: in the descriptor itself for an
/// IPv4 target (the listener derives the client's address from its ids),
/// in a pool buffer for an IPv6 one. Both ends must agree on both
/// addresses either way.
#[test]
fn ipv4_and_ipv6_syns_agree_on_addresses() {
    let (_mgr, p) = start("synaddr");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    for target in ["10.3.0.9:8080", "[fd00::9]:8081"] {
        let target: SocketAddr = target.parse().unwrap();
        let l = server.listen(target).unwrap();
        let mut c = client.connect(target).unwrap();
        c.write_all(b"ping").unwrap();
        let (mut s, peer) = l.accept().unwrap();
        assert_eq!(s.local_addr().unwrap(), target);
        assert_eq!(c.peer_addr().unwrap(), target);
        assert_eq!(peer, c.local_addr().unwrap(), "{target}");
        let mut req = [0u8; 4];
        s.read_exact(&mut req).unwrap();
        assert_eq!(&req, b"ping");
        s.write_all(b"pong").unwrap();
        c.read_exact(&mut req).unwrap();
        assert_eq!(&req, b"pong");
        drop((c, s, l));
    }
    wait_until("connections closed", || {
        server.connections() == 0 && client.connections() == 0
    });
}

/// One exchange from `client` to `target`, accepted on `l`; returns the
/// accepted stream's local address (the address the client dialled).
fn exchange_via(l: &xio_core::net::XioListener, client: &Net, target: &str) -> SocketAddr {
    let mut c = client.connect(target).unwrap();
    c.write_all(b"ping").unwrap();
    let mut s = accept_soon(l);
    let mut b = [0u8; 4];
    s.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
    s.write_all(b"pong").unwrap();
    c.read_exact(&mut b).unwrap();
    assert_eq!(&b, b"pong");
    s.local_addr().unwrap()
}

/// A listener on `0.0.0.0:port` (or `[::]:port`) answers for its port on
/// this node's addresses, as a TCP listener does: the axum tutorial's
/// `bind("0.0.0.0:3000")` is reached at `127.0.0.1:3000` and
/// `localhost:3000`. Another machine's address is not taken (a TCP
/// fallback must still dial it), an IPv4 wildcard does not take IPv6, and
/// a binding to the exact address comes first.
#[test]
fn a_wildcard_listener_answers_for_this_nodes_addresses() {
    let (_mgr, p) = start("wildcard");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let any: SocketAddr = "0.0.0.0:3000".parse().unwrap();
    let l = server.listen(any).unwrap();
    assert_eq!(l.local_addr().unwrap(), any);
    for (target, reached) in [
        ("127.0.0.1:3000", "127.0.0.1:3000"),
        ("127.1.2.3:3000", "127.1.2.3:3000"),
        // Loopback, as TCP dials the unspecified address.
        ("0.0.0.0:3000", "127.0.0.1:3000"),
        ("[::ffff:127.0.0.1]:3000", "[::ffff:127.0.0.1]:3000"),
    ] {
        let local = exchange_via(&l, &client, target);
        assert_eq!(local, reached.parse::<SocketAddr>().unwrap());
    }
    // `localhost` may resolve to ::1 first, which this listener does not
    // take; the IPv4 address after it connects.
    exchange_via(&l, &client, "localhost:3000");
    // The listener's own process, through its own table.
    exchange_via(&l, &server, "127.0.0.1:3000");
    for refused in ["[::1]:3000", "192.0.2.7:3000", "127.0.0.1:3001"] {
        let e = client.connect(refused).unwrap_err();
        assert_eq!(
            e.kind(),
            std::io::ErrorKind::ConnectionRefused,
            "{refused}: {e}"
        );
    }
    // The wildcard itself is taken once.
    let e = client.listen(any).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
    // An exact binding on the port comes first for its address.
    let exact = client.listen("127.0.0.2:3000").unwrap();
    let local = exchange_via(&exact, &server, "127.0.0.2:3000");
    assert_eq!(local, "127.0.0.2:3000".parse::<SocketAddr>().unwrap());
    // Written IPv4-mapped, it is the same address.
    exchange_via(&exact, &server, "[::ffff:127.0.0.2]:3000");
    exchange_via(&l, &client, "127.0.0.3:3000");
    // `[::]` takes both families (a dual-stack listener, as Linux's).
    let l6 = server.listen("[::]:3002").unwrap();
    exchange_via(&l6, &client, "[::1]:3002");
    exchange_via(&l6, &client, "127.0.0.1:3002");
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// `n` short connections in a row: connect, 64 B each way, close.
fn short_clients(prefix: &str, addr: SocketAddr, n: u64) {
    let net = Net::attach(prefix).unwrap();
    // Warm: the first connect opens the channel (and its doorbell fd).
    let mut buf = [0u8; 64];
    let fds = |net: &Net| {
        let mut s = net.connect(addr).unwrap();
        s.write_all(&[1u8; 64]).unwrap();
        s.read_exact(&mut [0u8; 64]).unwrap();
        open_fds()
    };
    let before = fds(&net);
    for i in 0..n {
        let mut s = net.connect(addr).unwrap();
        fill(&mut buf, i);
        s.write_all(&buf).unwrap();
        let mut back = [0u8; 64];
        s.read_exact(&mut back).unwrap();
        assert!(verify(&back, i), "connection {i}");
    }
    assert_eq!(open_fds(), before, "no fd per connection");
    wait_until("client table empty", || net.connections() == 0);
    println!("XIO:done");
}

#[test]
fn ten_thousand_short_connections_leak_nothing() {
    let (mgr, p) = start("short");
    let addr: SocketAddr = "10.3.0.3:80".parse().unwrap();
    let n = 10_000u64;
    {
        let net = Net::attach(&p).unwrap();
        let l = net.listen(addr).unwrap();
        let mut client = ChildProc::spawn(
            "child_main",
            "short_clients",
            &[p.clone(), addr.to_string(), n.to_string()],
        );
        // Serve n + 1 connections one after another, as a simple server.
        for _ in 0..=n {
            let (mut s, _) = l.accept().unwrap();
            let mut b = [0u8; 64];
            s.read_exact(&mut b).unwrap();
            s.write_all(&b).unwrap();
        }
        client.expect("done");
        client.wait_success();
        wait_until("server table empty", || net.connections() == 0);
    }
    wait_pool_whole(&mgr);
}

/// Writes a pattern forever on one connection (killed by the test).
fn writer_forever(prefix: &str, addr: SocketAddr) {
    let net = Net::attach(prefix).unwrap();
    let l = net.listen(addr).unwrap();
    println!("XIO:ready");
    let (mut s, _) = l.accept().unwrap();
    let chunk = vec![0x5au8; 100_000];
    loop {
        if s.write_all(&chunk).is_err() {
            return;
        }
    }
}

#[test]
fn peer_killed_mid_stream_gives_reset_and_pool_is_whole() {
    let (mgr, p) = start("kill");
    let addr: SocketAddr = "10.3.0.4:80".parse().unwrap();
    let mut server = serving("writer_forever", &p, addr);
    {
        let net = Net::attach(&p).unwrap();
        let mut s = net.connect(addr).unwrap();
        let mut buf = vec![0u8; 65536];
        let mut got = 0usize;
        while got < (8 << 20) {
            let n = s.read(&mut buf).unwrap();
            assert!(buf[..n].iter().all(|&b| b == 0x5a));
            got += n;
        }
        // The writer holds buffers in flight to us and in its cache.
        server.kill9();
        let err = loop {
            match s.read(&mut buf) {
                Ok(n) => assert!(n > 0, "a reset, not end of stream"),
                Err(e) => break e,
            }
        };
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
        // Reported once, as a TCP socket's ECONNRESET: then end of stream
        // and a broken pipe.
        assert_eq!(s.read(&mut buf).unwrap(), 0);
        let err = s.write_all(b"anyone?").unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::BrokenPipe, "{err}");
    }
    wait_pool_whole(&mgr);
}

#[test]
fn connect_refused_promptly() {
    let (_mgr, p) = start("refused");
    let net = Net::attach(&p).unwrap();
    // Nobody bound the address.
    let e = net.connect("10.3.0.5:1").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    // The address's listener is gone but its stack is still there.
    let other = Net::attach(&p).unwrap();
    let l = other.listen("10.3.0.5:2").unwrap();
    let t = std::thread::spawn(move || {
        drop(l.accept().unwrap());
        l
    });
    let s = net.connect("10.3.0.5:2").unwrap();
    drop(s);
    drop(t.join().unwrap());
    // Nobody in that process waits in X-IO now, so nothing answers the
    // SYN. The connect itself returns at once (the stream is usable behind
    // its SYN), but the first read asks the manager after a moment, which
    // knows the address is free: refused.
    if let Ok(s) = net.connect("10.3.0.5:2") {
        let e = (&s).read(&mut [0u8; 1]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        let e = (&s).write(b"x").unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    }
    // And the next connect asks the manager: refused at once.
    let e = net.connect("10.3.0.5:2").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    // Same process, nobody listening.
    let e = other.connect("10.3.0.5:3").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    // A second listener on the same address is refused.
    let _l = other.listen("10.3.0.5:4").unwrap();
    let e = net.listen("10.3.0.5:4").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::AddrInUse, "{e}");
}

/// A thread that keeps `net` looking at its rings (an event loop that
/// accepts nothing), so its process answers SYNs and closes.
struct Poller {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Poller {
    fn start(net: &Net) -> Poller {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (net, flag) = (net.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut events = Vec::new();
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                events.clear();
                net.poll(&mut events, Some(Duration::from_millis(5)))
                    .unwrap();
            }
        });
        Poller { stop, thread }
    }

    fn stop(self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.join().unwrap();
    }
}

/// A listener holds at most its backlog of connections not yet accepted;
/// a connect beyond it is refused, and accepting makes room.
#[test]
fn a_full_backlog_refuses_connects_until_one_is_accepted() {
    let (mgr, p) = start("backlog");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.9.2:7000".parse().unwrap();
    let l = server.listen_with_backlog(addr, 3).unwrap();
    // The server answers SYNs whenever one of its threads waits in X-IO:
    // here an event loop that never accepts.
    let poller = Poller::start(&server);
    let waiting: Vec<XioStream> = (0..3).map(|_| client.connect(addr).unwrap()).collect();
    (&waiting[0]).write_all(b"first").unwrap();
    // The stream of a connect is usable at once (writes go out behind the
    // SYN); the answer, here a refusal, comes with the first read.
    let refused = client.connect(addr).unwrap();
    refused.set_read_timeout(Some(WATCHDOG)).unwrap();
    let e = (&refused).read(&mut [0u8; 1]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    drop(refused);
    // The waiting ones are whole: what they sent is there once accepted.
    let (s0, _) = l.accept().unwrap();
    let mut buf = [0u8; 5];
    (&s0).read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"first");
    let fourth = client.connect(addr).unwrap();
    (&fourth).write_all(b"in").unwrap();
    let accepted: Vec<XioStream> = (0..3).map(|_| l.accept().unwrap().0).collect();
    let mut two = [0u8; 2];
    (&accepted[2]).read_exact(&mut two).unwrap();
    assert_eq!(&two, b"in");
    drop((waiting, fourth, s0, accepted, l));
    poller.stop();
    wait_closed(&client, &server);
    drop((client, server));
    wait_pool_whole(&mgr);
}

/// A client that only ever connects, writes and closes never waits for an
/// answer; the SYN-ACKs it does not read must not make either side keep
/// its connections (`connect` drains them), and in the end both tables
/// are empty and the pool whole.
#[test]
fn fire_and_forget_clients_leave_nothing_behind() {
    let (mgr, p) = start("forget");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.9.3:7000".parse().unwrap();
    let l = server.listen(addr).unwrap();
    const N: usize = 20_000;
    let acceptor = std::thread::spawn(move || {
        let mut buf = [0u8; 64];
        for _ in 0..N {
            let (s, _) = l.accept().unwrap();
            let mut got = 0;
            loop {
                match (&s).read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) => panic!("{e}"),
                }
            }
            assert_eq!(got, 5);
        }
    });
    for _ in 0..N {
        let s = client.connect(addr).unwrap();
        (&s).write_all(b"hello").unwrap();
    }
    // Bounded by what is in flight (a ring's worth at most), not by N.
    assert!(client.connections() < N / 2, "{}", client.connections());
    acceptor.join().unwrap();
    wait_closed(&client, &server);
    drop((client, server));
    wait_pool_whole(&mgr);
}

/// Each forged SYN-ACK is answered with a reset. A raw stack that sends
/// 50,000 of them and never drains its ring must not make the server
/// queue 50,000 resets: beyond a bound they are dropped, and the server's
/// own connection is unaffected.
#[test]
fn resets_for_a_peer_that_never_drains_are_bounded() {
    use xio_core::layout::{kind, Descriptor};
    use xio_core::stack::Stack;

    let (mgr, p) = start("rstflood");
    let server = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.9.4:7000".parse().unwrap();
    let l = server.listen(addr).unwrap();
    let client = Net::attach(&p).unwrap();
    let c = client.connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    let mut evil = Stack::attach(&p).unwrap();
    let victim = evil.connect(addr).unwrap();
    let forged = Descriptor {
        kind: kind::SYN_ACK,
        ..Descriptor::default()
    };
    let poller = Poller::start(&server);
    for i in 0..50_000u32 {
        let d = Descriptor {
            conn: i.wrapping_mul(2_654_435_761),
            index: i,
            ..forged
        };
        while !evil.__push_raw(victim, d).unwrap() {
            std::thread::sleep(Duration::from_micros(50));
        }
    }
    wait_until("every forgery answered or dropped", || {
        let (queued, dropped) = server.__send_queue();
        queued as u64 + dropped >= 40_000
    });
    let (queued, dropped) = server.__send_queue();
    assert!(queued <= 4096 + 1, "{queued} sends queued for the flooder");
    assert!(dropped > 0);
    poller.stop();
    // The real connection still works (its own rings, its own peer).
    (&c).write_all(b"still here").unwrap();
    let mut buf = [0u8; 10];
    (&s).read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"still here");
    drop(evil);
    drop((c, s, l));
    wait_closed(&client, &server);
    drop((client, server));
    wait_pool_whole(&mgr);
}

/// A server that answered and closed (a FIN: it had read everything)
/// before the rest of the request came: it resets the late bytes, so its
/// RST follows its FIN. As on Linux, where a FIN already received ends
/// reads before any error (`SOCK_DONE` is looked at before `sk_err`), the
/// client reads the answer and then end of stream (`read_to_end`
/// succeeds); the reset is its next write's broken pipe.
#[test]
fn a_reset_after_the_peers_fin_still_ends_reads_normally() {
    let (_mgr, p) = start("finrst");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen("10.3.0.41:80").unwrap();
    let mut c = client.connect("10.3.0.41:80").unwrap();
    let (s, _) = l.accept().unwrap();
    c.write_all(b"head").unwrap();
    assert_eq!(read_n(&s, 4), b"head");
    (&s).write_all(b"answer").unwrap();
    drop(s);
    c.write_all(b"late body").unwrap();
    wait_until("the server reset the late bytes", || {
        server.connections() == 0
    });
    // The answer, the FIN and the RST, into the client's table.
    client.connections();
    c.set_read_timeout(Some(WATCHDOG)).unwrap();
    let mut got = Vec::new();
    c.read_to_end(&mut got).unwrap();
    assert_eq!(got, b"answer");
    assert_eq!(
        c.write(b"more").unwrap_err().kind(),
        std::io::ErrorKind::BrokenPipe
    );
    assert_eq!(c.read(&mut [0u8; 4]).unwrap(), 0);
}

/// A connection id comes back after its slot's generations wrap (4096
/// reuses). A server still holding the first connection of that id must
/// not, when it drops it, take the id's early route from the new one:
/// what the client sends before it has the SYN-ACK (addressed by its own
/// id) must reach the new connection.
#[test]
fn an_old_connection_of_a_reused_id_leaves_the_new_ones_early_bytes() {
    let (_mgr, p) = start("earlyreuse");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen("10.3.0.46:80").unwrap();
    let first = client.connect("10.3.0.46:80").unwrap();
    let id = first.token();
    let (old, _) = l.accept().unwrap();
    // Both finish (so the client forgets the id), the server keeps its end.
    old.shutdown(Shutdown::Write).unwrap();
    first.set_read_timeout(Some(WATCHDOG)).unwrap();
    assert_eq!((&first).read(&mut [0u8; 1]).unwrap(), 0);
    drop(first);
    let mut n = 0;
    let c = loop {
        let c = client.connect("10.3.0.46:80").unwrap();
        if c.token() == id {
            break c;
        }
        n += 1;
        assert!(
            n < 10_000,
            "the id never came back: {id:#x} {:#x}",
            c.token()
        );
        let (s, _) = l.accept().unwrap();
        drop(s);
        c.set_read_timeout(Some(WATCHDOG)).unwrap();
        assert_eq!((&c).read(&mut [0u8; 1]).unwrap(), 0);
    };
    // The new connection is accepted (its SYN-ACK not yet read by the
    // client), then the old one is closed.
    let (s, _) = l.accept().unwrap();
    drop(old);
    // Sent before the client knows the server's id: addressed by its own.
    (&c).write_all(b"early").unwrap();
    drop(c);
    // The watchdog: a hang ends in the read timeout's WouldBlock.
    s.set_read_timeout(Some(WATCHDOG)).unwrap();
    let mut got = Vec::new();
    (&s).read_to_end(&mut got).unwrap();
    assert_eq!(got, b"early");
}

/// A stream dropped with received bytes it never read resets its peer,
/// as a TCP socket closed with unread data does (Linux sends a RST at
/// `close`, and the peer's next read fails with `ECONNRESET`), even when
/// the bytes were still in the ring, not yet drained into the table,
/// when the stream was dropped. Checked against 127.0.0.1 TCP first.
#[test]
fn dropping_a_stream_with_undrained_bytes_resets_the_peer() {
    // The contract, over loopback TCP.
    {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        c.write_all(b"request").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        drop(s);
        c.set_read_timeout(Some(WATCHDOG)).unwrap();
        let e = c.read(&mut [0u8; 8]).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "tcp: {e}");
    }
    let (_mgr, p) = start("dropunread");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen("10.3.0.43:80").unwrap();
    let mut c = client.connect("10.3.0.43:80").unwrap();
    let (s, _) = l.accept().unwrap();
    c.write_all(b"request").unwrap();
    // The server never reads (nor calls into X-IO) before it drops.
    drop(s);
    c.set_read_timeout(Some(WATCHDOG)).unwrap();
    let r = c.read(&mut [0u8; 8]);
    assert_eq!(
        r.as_ref().map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionReset),
        "{r:?}"
    );
}

/// `shutdown` of a reset (or refused) stream fails with `NotConnected`, as
/// Linux's does (`ENOTCONN`: the connection is gone), instead of saying
/// `Ok` to a FIN that never goes; a refused connect's too. Shutting down
/// twice stays `Ok`, as on Linux.
#[test]
fn shutdown_of_a_reset_stream_is_not_connected() {
    let (_mgr, p) = start("shutreset");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.0.49:80".parse().unwrap();
    let l = server.listen(addr).unwrap();
    let mut c = client.connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    c.write_all(b"unread").unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    c.shutdown(Shutdown::Write).unwrap();
    // Data left unread: the server's close resets the client.
    let mut one = [0u8; 1];
    s.peek(&mut one).unwrap();
    drop(s);
    c.set_read_timeout(Some(WATCHDOG)).unwrap();
    let mut rest = Vec::new();
    let e = loop {
        match c.read(&mut one) {
            Ok(0) => panic!("end of stream, not a reset"),
            Ok(_) => rest.push(one[0]),
            Err(e) => break e,
        }
    };
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
    for how in [Shutdown::Read, Shutdown::Write, Shutdown::Both] {
        let r = c.shutdown(how);
        assert_eq!(
            r.as_ref().map_err(|e| e.kind()),
            Err(std::io::ErrorKind::NotConnected),
            "{how:?}: {r:?}"
        );
    }
    // Refused: nobody listens.
    let r = client.connect("10.3.0.50:80");
    if let Ok(c) = r {
        c.set_read_timeout(Some(WATCHDOG)).unwrap();
        let _ = (&c).read(&mut one);
        let r = c.shutdown(Shutdown::Write);
        assert_eq!(
            r.as_ref().map_err(|e| e.kind()),
            Err(std::io::ErrorKind::NotConnected),
            "{r:?}"
        );
    }
}

/// `connect_timeout` with a zero timeout is `InvalidInput`, as
/// `TcpStream::connect_timeout`'s (and as `set_read_timeout` here): it
/// connected (or timed out) instead, a call std would have refused.
#[test]
fn connect_timeout_of_zero_is_invalid_input() {
    let (_mgr, p) = start("ctzero");
    let net = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.0.51:80".parse().unwrap();
    let _l = net.listen(addr).unwrap();
    let std_l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let tcp = std::net::TcpStream::connect_timeout(&std_l.local_addr().unwrap(), Duration::ZERO);
    assert_eq!(
        tcp.map(drop).map_err(|e| e.kind()),
        Err(std::io::ErrorKind::InvalidInput)
    );
    for to in [addr, "10.3.0.52:80".parse().unwrap()] {
        let r = net.connect_timeout(&to, Duration::ZERO);
        assert_eq!(
            r.map(drop).map_err(|e| e.kind()),
            Err(std::io::ErrorKind::InvalidInput),
            "{to}"
        );
    }
    net.connect_timeout(&addr, Duration::from_secs(60)).unwrap();
}

/// A zero-copy writer may send an empty buffer (`alloc(0)`, or
/// `copy_from(b"")`): no bytes, so nothing for a reader to wait on. Ahead
/// of a reset it hid the reset: a blocking `peek` waited for good (the
/// empty chunk counted as "something queued", not as the end), and an
/// event loop's read, told the stream was readable, said `WouldBlock`
/// and heard of the reset never (as TCP delivers no empty segment to a
/// reader, the reset must be what comes).
#[test]
fn an_empty_buffer_ahead_of_a_reset_does_not_hide_it() {
    let (_mgr, p) = start("emptyrst");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.0.53:80".parse().unwrap();
    let l = server.listen(addr).unwrap();
    // Each client sends an empty buffer, then leaves unread what the
    // server wrote: its close resets the server's end.
    let reset_after_empty = || {
        let c = client.connect(addr).unwrap();
        let (s, _) = l.accept().unwrap();
        c.send_buf(c.alloc(0).unwrap()).map_err(|(e, _)| e).unwrap();
        (&s).write_all(b"unread").unwrap();
        c.set_read_timeout(Some(WATCHDOG)).unwrap();
        c.peek(&mut [0u8; 1]).unwrap();
        drop(c);
        s
    };
    // A blocking peek (the watchdog: a hang ends in the read timeout's
    // WouldBlock).
    let s = reset_after_empty();
    s.set_read_timeout(Some(WATCHDOG)).unwrap();
    let r = s.peek(&mut [0u8; 8]);
    assert_eq!(
        r.as_ref().map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionReset),
        "peek: {r:?}"
    );
    // An event loop: after a readable event, reads until WouldBlock.
    let s = reset_after_empty();
    s.set_nonblocking(true).unwrap();
    s.set_token(7);
    let mut events = Vec::new();
    loop {
        events.clear();
        server.poll(&mut events, None).unwrap();
        if events.iter().any(|e| {
            matches!(
                e,
                Event::Stream {
                    token: 7,
                    readable: true,
                    ..
                }
            )
        }) && server.connections() == 2
        {
            break;
        }
    }
    let r = (&s).read(&mut [0u8; 8]);
    assert_eq!(
        r.as_ref().map_err(|e| e.kind()),
        Err(std::io::ErrorKind::ConnectionReset),
        "read: {r:?}"
    );
}

/// A server that answers and closes with the request unread (an HTTP 413
/// to an upload) resets the client, and the client still reads the answer
/// before the reset, as over TCP, also when its first read comes after
/// both: that read waited for the SYN's answer and, finding the
/// connection reset behind it, failed at once, so the answer was lost to
/// a client that stops at the first error (and the reset was reported
/// twice).
#[test]
fn an_answer_before_a_reset_is_read_on_a_fresh_connection() {
    let read_all = |s: &mut dyn Read| {
        let mut got = Vec::new();
        let mut b = [0u8; 64];
        loop {
            match s.read(&mut b) {
                Ok(0) => break (got, None),
                Ok(n) => got.extend_from_slice(&b[..n]),
                Err(e) => break (got, Some(e.kind())),
            }
        }
    };
    // The contract, over loopback TCP.
    {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let mut c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (mut s, _) = l.accept().unwrap();
        c.write_all(b"upload").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        s.write_all(b"413").unwrap();
        drop(s);
        std::thread::sleep(Duration::from_millis(50));
        c.set_read_timeout(Some(WATCHDOG)).unwrap();
        let (got, e) = read_all(&mut c);
        assert_eq!(
            (&got[..], e),
            (&b"413"[..], Some(std::io::ErrorKind::ConnectionReset))
        );
        assert_eq!(c.read(&mut [0u8; 8]).unwrap(), 0, "tcp: the reset once");
    }
    let (_mgr, p) = start("answerreset");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen("10.3.0.54:80").unwrap();
    let mut c = client.connect("10.3.0.54:80").unwrap();
    c.write_all(b"upload").unwrap();
    let (mut s, _) = l.accept().unwrap();
    let mut one = [0u8; 1];
    s.peek(&mut one).unwrap();
    s.write_all(b"413").unwrap();
    // Closed with the upload unread: a reset, behind the SYN-ACK and the
    // answer in the client's ring (the client has not looked yet).
    drop(s);
    c.set_read_timeout(Some(WATCHDOG)).unwrap();
    let (got, e) = read_all(&mut c);
    assert_eq!(
        (&got[..], e),
        (&b"413"[..], Some(std::io::ErrorKind::ConnectionReset))
    );
    assert_eq!(c.read(&mut one).unwrap(), 0, "the reset once");
}

/// `take_error` says what ended a connection, once, as `SO_ERROR` does:
/// an event loop told a non-blocking connect is writable asks it whether
/// the connect failed (mio's pattern), and it said `None` to a refused
/// one. Once taken, reads end and writes say `BrokenPipe`, as after a
/// socket's `SO_ERROR` was read.
#[test]
fn take_error_reports_a_refusal_or_reset_once() {
    let (_mgr, p) = start("takeerror");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.0.55:80".parse().unwrap();
    let l = server.listen_with_backlog(addr, 1).unwrap();
    let _first = client.connect(addr).unwrap();
    // The backlog is full: refused.
    let c = client.connect(addr).unwrap();
    c.set_nonblocking(true).unwrap();
    c.set_token(9);
    let mut events = Vec::new();
    // The server must look at its rings for the SYN: accept (none comes
    // out while the first waits unaccepted) until the refusal is in.
    l.set_nonblocking(true).unwrap();
    loop {
        let _ = server.poll_nowait(&mut Vec::new());
        events.clear();
        client
            .poll(&mut events, Some(Duration::from_millis(10)))
            .unwrap();
        if events.iter().any(|e| {
            matches!(
                e,
                Event::Stream {
                    token: 9,
                    writable: true,
                    readable: true
                }
            )
        }) {
            break;
        }
    }
    let e = c.take_error().unwrap().expect("the refusal");
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    // A reset, taken once.
    let (s, _) = l.accept().unwrap();
    let c = _first;
    (&c).write_all(b"unread").unwrap();
    s.set_read_timeout(Some(WATCHDOG)).unwrap();
    s.peek(&mut [0u8; 1]).unwrap();
    drop(s);
    c.set_read_timeout(Some(WATCHDOG)).unwrap();
    assert!(c.take_error().unwrap().is_none(), "nothing taken in yet");
    wait_until("the reset", || {
        client.connections();
        c.take_error().unwrap().is_some_and(|e| {
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
            true
        })
    });
    assert!(c.take_error().unwrap().is_none(), "once");
    assert_eq!((&c).read(&mut [0u8; 4]).unwrap(), 0);
    let e = (&c).write(b"x").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe, "{e}");
}

/// An IPv6 SYN names its source address in its buffer, which the peer
/// writes: a stack could claim any address (another stack's client
/// address, a real host's) and a server that trusts `peer_addr` would take
/// the connection for someone else's. The listener now derives the
/// address from the ring the SYN came on, as for an IPv4 SYN.
#[test]
fn an_ipv6_syn_cannot_claim_another_source_address() {
    use xio_core::layout::kind;
    use xio_core::stack::Stack;

    let (mgr, p) = start("syn6-source");
    let server = Net::attach(&p).unwrap();
    let addr: SocketAddr = "[fd00::61:9]:80".parse().unwrap();
    let l = server.listen(addr).unwrap();
    let mut evil = Stack::attach(&p).unwrap();
    let to = evil.connect(addr).unwrap();
    // What an honest client's SYN says, but for the source: a forged
    // address of another stack (`127.88.<stack>:<port>`).
    let forged: SocketAddr = "127.88.0.63:2222".parse().unwrap();
    let put = |out: &mut [u8], a: &SocketAddr| {
        match a {
            SocketAddr::V4(v) => {
                out[0] = 4;
                out[1..5].copy_from_slice(&v.ip().octets());
            }
            SocketAddr::V6(v) => {
                out[0] = 6;
                out[1..17].copy_from_slice(&v.ip().octets());
            }
        }
        out[17..19].copy_from_slice(&a.port().to_le_bytes());
    };
    let mut b = evil.alloc(39).unwrap();
    b.set_len(39);
    b.fill(0);
    b[0] = 1;
    put(&mut b[1..20], &addr);
    put(&mut b[20..39], &forged);
    let conn = 5u32;
    assert!(evil
        .__push_buf_raw(to, kind::SYN, conn, b)
        .unwrap()
        .is_none());
    let (s, from) = l.accept().unwrap();
    let id = evil.id().slot().to_be_bytes();
    // (IPv4-mapped: a client of an IPv6 address has one.)
    let ip = std::net::Ipv4Addr::new(127, 88, id[0], id[1]).to_ipv6_mapped();
    let expected = SocketAddr::from((ip, 1024 + conn as u16));
    assert_eq!(from, expected, "the SYN's claimed source was trusted");
    assert_eq!(s.peer_addr().unwrap(), expected);
    drop((s, l, evil));
    drop(server);
    wait_pool_whole(&mgr);
}

/// A SYN's target is the peer's word too: a stack with a channel to a
/// service bound to `0.0.0.0:port` reached it at any address it named,
/// another machine's included (the manager refuses to resolve those), and
/// so chose the accepted stream's `local_addr`. The listener now refuses
/// a target that is not this node's, as the manager does; a loopback
/// target still reaches it.
#[test]
fn a_syn_for_another_machines_address_does_not_reach_a_wildcard_listener() {
    use xio_core::layout::{kind, Descriptor};
    use xio_core::stack::Stack;

    let (mgr, p) = start("syn-target");
    let server = Net::attach(&p).unwrap();
    let l = server.listen("0.0.0.0:8081").unwrap();
    let mut evil = Stack::attach(&p).unwrap();
    let to = evil.connect("127.0.0.1:8081".parse().unwrap()).unwrap();
    // TEST-NET-1: no interface of this machine has it.
    let syn = |conn: u32, ip: [u8; 4]| Descriptor {
        kind: kind::SYN4,
        conn,
        index: u32::from(std::net::Ipv4Addr::from(ip)),
        len: 8081,
        ..Descriptor::default()
    };
    assert!(evil.__push_raw(to, syn(5, [192, 0, 2, 7])).unwrap());
    assert!(evil.__push_raw(to, syn(6, [127, 0, 0, 1])).unwrap());
    // The SYNs are taken in order: once the second is accepted, the
    // first was refused or waits in the queue too.
    let (s, _) = l.accept().unwrap();
    assert_eq!(
        s.local_addr().unwrap(),
        "127.0.0.1:8081".parse::<SocketAddr>().unwrap()
    );
    l.set_nonblocking(true).unwrap();
    match l.accept() {
        Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "{e}"),
        Ok((s, _)) => panic!("a SYN for {:?} was accepted", s.local_addr()),
    }
    drop((s, l, evil));
    drop(server);
    wait_pool_whole(&mgr);
}

/// `peer_addr` after a reset: a TCP socket says `ENOTCONN` once the RST
/// closed it (Linux's `getpeername` in state CLOSE), and so does an X-IO
/// stream; it used to go on naming the peer that was gone.
#[test]
fn peer_addr_after_a_reset_is_not_connected() {
    let (_mgr, p) = start("peerreset");
    let addr: SocketAddr = "10.3.0.77:80".parse().unwrap();
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen(addr).unwrap();
    let mut c = client.connect(addr).unwrap();
    c.write_all(b"never read").unwrap();
    let (s, _) = l.accept().unwrap();
    assert_eq!(c.peer_addr().unwrap(), addr);
    // Closed with unread data: a reset.
    drop(s);
    let err = c.read(&mut [0u8; 8]).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    let err = c.peer_addr().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::NotConnected, "{err}");
    // Its own address is still its own.
    c.local_addr().unwrap();
}

/// A connect to the unspecified address (`0.0.0.0:port`, `[::]:port`)
/// reaches this host's listener on the port, as Linux's TCP connect does
/// (it takes the unspecified address for loopback): code that dials the
/// address its server bound, `0.0.0.0:3000`, was refused unless that very
/// wildcard was bound, and a server on `127.0.0.1:port` was never reached.
/// Checked against loopback TCP first.
#[test]
fn a_connect_to_the_unspecified_address_reaches_this_host() {
    // The contract, over TCP.
    {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let c = std::net::TcpStream::connect(("0.0.0.0", port)).unwrap();
        assert_eq!(c.peer_addr().unwrap(), l.local_addr().unwrap());
        let (s, _) = l.accept().unwrap();
        assert_eq!(s.local_addr().unwrap(), l.local_addr().unwrap());
    }
    let (_mgr, p) = start("connunspec");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let cases = [
        ("127.0.0.1:8081", "0.0.0.0:8081", "127.0.0.1:8081"),
        ("0.0.0.0:8082", "0.0.0.0:8082", "127.0.0.1:8082"),
        ("[::1]:8083", "[::]:8083", "[::1]:8083"),
    ];
    for (bound, dialled, reached) in cases {
        let reached: SocketAddr = reached.parse().unwrap();
        let l = server.listen(bound).unwrap();
        let c = client.connect(dialled);
        let mut c = c.unwrap_or_else(|e| panic!("{dialled}: {e}"));
        assert_eq!(c.peer_addr().unwrap(), reached, "{dialled}");
        c.write_all(b"ping").unwrap();
        let (mut s, _) = l.accept().unwrap();
        assert_eq!(s.local_addr().unwrap(), reached, "{dialled}");
        let mut b = [0u8; 4];
        s.read_exact(&mut b).unwrap();
        assert_eq!(&b, b"ping");
    }
}

/// A connect to an address this same net is binding, while the bind is
/// under way on another thread (the README's axum server and client in
/// one process): once the manager has the bind, the manager refuses the
/// net its own address ("bound by this same stack"), and the connect must
/// wait for the binding thread to list the listener instead of taking
/// that refusal. Before the bind reaches the manager a refusal is right
/// ("nothing is bound"); the connect retries then, as a client would.
#[test]
fn a_connect_racing_its_own_nets_bind_is_not_refused_as_its_own() {
    let (_mgr, p) = start("bindrace");
    let net = Net::attach(&p).unwrap();
    for i in 0..300u16 {
        let port = 20_000 + i;
        let binder = {
            let net = net.clone();
            std::thread::spawn(move || net.listen(("0.0.0.0", port)).unwrap())
        };
        let target: SocketAddr = ([127, 0, 0, 1], port).into();
        let (s, l) = loop {
            // Once the bind has returned, a connect must reach it: no
            // retry after that (and no loop for ever if the bind failed).
            let bound = binder.is_finished();
            match net.connect(target) {
                Ok(s) => break (s, binder.join().unwrap()),
                Err(e) => {
                    let why = e.to_string();
                    assert!(
                        !why.contains("same stack"),
                        "port {port}: refused as our own address: {why}"
                    );
                    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{why}");
                    assert!(
                        !bound,
                        "port {port}: refused after the bind returned: {why}"
                    );
                    std::thread::yield_now();
                }
            }
        };
        let _accepted = l.accept().unwrap();
        drop(s);
    }
}

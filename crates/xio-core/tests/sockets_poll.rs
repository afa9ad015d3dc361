//! Tests of the socket interface's event loop ([`xio_core::net::Net::poll`]):
//! events and the tokens they carry, readiness, the doorbell, and the
//! blocking driver and the threads it wakes.

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
        "poll_clients" => poll_clients(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap()),
        r => panic!("unknown role {r}"),
    }
}

/// Once a net has been polled, `poll` is where its rings are drained (as
/// with `epoll`): a non-blocking read that finds nothing queued says
/// WouldBlock even though bytes sit in the ring, the next `poll` reports
/// the stream readable, and nothing is lost. Blocking reads still drain.
#[test]
fn polled_net_leaves_draining_to_poll() {
    let (_mgr, p) = start("polldrain");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen("10.3.0.10:80").unwrap();
    let mut c = client.connect("10.3.0.10:80").unwrap();
    let (s, _) = l.accept().unwrap();
    s.set_nonblocking(true).unwrap();
    let mut events = Vec::new();
    server.poll(&mut events, Some(Duration::ZERO)).unwrap();
    let mut buf = [0u8; 8];
    for round in 0..3u8 {
        c.write_all(&[round]).unwrap();
        // In the server's ring, not yet in its table.
        let e = (&s).read(&mut buf).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WouldBlock, "round {round}");
        events.clear();
        server
            .poll(&mut events, Some(Duration::from_secs(5)))
            .unwrap();
        assert!(
            events.iter().any(|e| matches!(
                e,
                Event::Stream { token, readable: true, .. } if *token == s.token()
            )),
            "round {round}: {events:?}"
        );
        assert_eq!((&s).read(&mut buf).unwrap(), 1);
        assert_eq!(buf[0], round);
    }
    // A blocking read on the same polled net drains and waits as usual.
    s.set_nonblocking(false).unwrap();
    c.write_all(b"blocking").unwrap();
    let mut got = [0u8; 8];
    (&s).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"blocking");
}

/// A connection's events come only once it is accepted, under the token
/// the program gives it then: an `Accept` and a `Stream` event of the same
/// unaccepted connection in one batch made a C event loop see a token it
/// never chose (a newcomer's test: 110 of 304 connections). And a capped
/// poll leaves the rest in the net, where `set_token` still applies.
#[test]
fn a_connections_events_come_once_it_is_accepted_under_its_token() {
    let (_mgr, p) = start("acceptevents");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.0.12:80".parse().unwrap();
    let l = server.listen(addr).unwrap();
    l.set_nonblocking(true).unwrap();
    let mut events = Vec::new();
    assert_eq!(server.poll(&mut events, Some(Duration::ZERO)).unwrap(), 0);
    // Three clients connect and write before anything is accepted.
    let mut clients: Vec<XioStream> = (0..3)
        .map(|_| {
            let mut c = client.connect(addr).unwrap();
            c.write_all(b"early").unwrap();
            c
        })
        .collect();
    let mut accepts = 0;
    wait_until("the listener reported", || {
        events.clear();
        server
            .poll(&mut events, Some(Duration::from_millis(10)))
            .unwrap();
        for e in &events {
            match e {
                Event::Accept(a) => {
                    assert_eq!(*a, addr);
                    accepts += 1;
                }
                other => panic!("an event before accept: {other:?}"),
            }
        }
        accepts > 0
    });
    // Accepted and given tokens: their data is reported now, under them.
    let mut streams = Vec::new();
    while let Ok((s, _)) = l.accept() {
        s.set_nonblocking(true).unwrap();
        s.set_token(1000 + streams.len() as u64);
        streams.push(s);
    }
    assert_eq!(streams.len(), 3);
    let mut seen = Vec::new();
    // One at a time; the third's token changes while its event waits.
    wait_until("every stream reported", || {
        events.clear();
        server
            .poll_capped(&mut events, 1, Some(Duration::from_millis(10)))
            .unwrap();
        assert!(events.len() <= 1, "{events:?}");
        for e in &events {
            match *e {
                Event::Stream {
                    token, readable, ..
                } => {
                    assert!(readable);
                    seen.push(token);
                }
                Event::Accept(_) => panic!("accepted already: {e:?}"),
            }
        }
        if seen.len() == 1 {
            streams[2].set_token(7777);
        }
        seen.len() == 3
    });
    seen.sort_unstable();
    let mut want = vec![1000, 1001, 7777];
    if seen.contains(&1002) {
        // The third was the one reported first, before its token changed.
        want = vec![1000, 1001, 1002];
    }
    assert_eq!(seen, want);
    for s in &streams {
        let mut b = [0u8; 5];
        (&*s).read_exact(&mut b).unwrap();
        assert_eq!(&b, b"early");
    }
    clients
        .iter_mut()
        .for_each(|c| c.shutdown(Shutdown::Both).unwrap());
}

/// An event loop that greets its clients writes once `poll` says an
/// accepted stream is writable, as epoll says when the socket is added:
/// the accepted stream is reported writable even with nothing to read
/// (found in review: it was reported only once data came, and a server
/// that speaks first waited for ever).
#[test]
fn an_accepted_stream_is_reported_writable() {
    let (_mgr, p) = start("acceptwr");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.0.14:80".parse().unwrap();
    let l = server.listen(addr).unwrap();
    l.set_nonblocking(true).unwrap();
    let mut events = Vec::new();
    server.poll_nowait(&mut events).unwrap();
    let c = client.connect(addr).unwrap();
    let (s, _) = loop {
        events.clear();
        server.poll(&mut events, Some(WATCHDOG)).unwrap();
        assert!(!events.is_empty(), "no connection came");
        if let Ok(a) = l.accept() {
            break a;
        }
    };
    s.set_nonblocking(true).unwrap();
    s.set_token(7);
    events.clear();
    server.poll(&mut events, Some(WATCHDOG)).unwrap();
    assert_eq!(
        events,
        [Event::Stream {
            token: 7,
            readable: false,
            writable: true
        }]
    );
    (&s).write_all(b"hello").unwrap();
    let mut got = [0u8; 5];
    (&c).read_exact(&mut got).unwrap();
    assert_eq!(&got, b"hello");
}

/// An fd-driven loop (`poll_nowait`, then sleep on the doorbell's fd) that
/// accepts a connection whose data came with its SYN: the data's event,
/// held back until the accept, rings the doorbell then, or the loop would
/// sleep on data nobody announces (found in review).
#[test]
fn an_accept_with_data_waiting_rings_the_doorbell() {
    let (_mgr, p) = start("acceptring");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.0.13:80".parse().unwrap();
    let l = server.listen(addr).unwrap();
    l.set_nonblocking(true).unwrap();
    let bell = server.doorbell().unwrap();
    let mut events = Vec::new();
    server.poll_nowait(&mut events).unwrap();
    let mut c = client.connect(addr).unwrap();
    c.write_all(b"early").unwrap();
    // The loop: sleep on the fd, then take what is ready, until the
    // listener says a connection waits.
    let sleep_on_bell = || wait_readable(&bell, "the doorbell never rang");
    loop {
        events.clear();
        server.poll_nowait(&mut events).unwrap();
        if events.contains(&Event::Accept(addr)) {
            break;
        }
        sleep_on_bell();
    }
    assert!(
        !events.iter().any(|e| matches!(e, Event::Stream { .. })),
        "{events:?}"
    );
    let (s, _) = l.accept().unwrap();
    s.set_nonblocking(true).unwrap();
    s.set_token(42);
    loop {
        sleep_on_bell();
        events.clear();
        server.poll_nowait(&mut events).unwrap();
        if !events.is_empty() {
            break;
        }
    }
    assert!(
        matches!(
            events[..],
            [Event::Stream {
                token: 42,
                readable: true,
                ..
            }]
        ),
        "{events:?}"
    );
    let mut b = [0u8; 5];
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"early");
}

/// `poll_nowait_hinted` with `rung` false leaves the doorbell unread: the
/// events still come (the rings are drained), the poll fd stays readable
/// so the loop comes back, and a call with `rung` true then reads it.
#[test]
fn a_poll_not_told_of_a_ring_leaves_the_fd_readable() {
    let (_mgr, p) = start("hinted");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.0.14:80".parse().unwrap();
    let l = server.listen(addr).unwrap();
    let mut c = client.connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    s.set_nonblocking(true).unwrap();
    s.set_token(7);
    let fd = server.poll_fd().unwrap();
    let mut events = Vec::new();
    // Armed, with nothing to report.
    while server.poll_nowait(&mut events).unwrap() > 0 {
        events.clear();
    }
    let readable = |fd: &std::os::fd::OwnedFd| {
        let mut fds = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
        rustix::event::poll(&mut fds, Some(&rustix::event::Timespec::default())).unwrap() == 1
    };
    assert!(!readable(&fd), "readable before anything was sent");
    c.write_all(b"ping").unwrap();
    wait_readable(&fd, "the doorbell never rang");
    server
        .poll_nowait_hinted(&mut events, usize::MAX, false)
        .unwrap();
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Stream {
                token: 7,
                readable: true,
                ..
            }
        )),
        "{events:?}"
    );
    assert!(readable(&fd), "the unread ring was lost");
    events.clear();
    server
        .poll_nowait_hinted(&mut events, usize::MAX, true)
        .unwrap();
    assert!(!readable(&fd), "a ring read with `rung` true stayed");
    let mut b = [0u8; 4];
    (&s).read_exact(&mut b).unwrap();
    assert_eq!(&b, b"ping");
}

/// Opens `n` connections, sends one request on each, says so, and waits to
/// be killed.
fn poll_clients(prefix: &str, addr: SocketAddr, n: usize) {
    let net = Net::attach(prefix).unwrap();
    let conns: Vec<XioStream> = (0..n).map(|_| net.connect(addr).unwrap()).collect();
    for (i, c) in conns.iter().enumerate() {
        (&*c).write_all(&(i as u64).to_le_bytes()).unwrap();
    }
    for c in &conns {
        let mut b = [0u8; 8];
        (&*c).read_exact(&mut b).unwrap();
    }
    println!("XIO:sent");
    loop {
        std::thread::park();
    }
}

/// An event-loop server ([`Net::poll`], non-blocking streams) hears of
/// every connection's reset when its client process is killed: none is
/// left waiting forever.
#[test]
fn event_loop_server_sees_every_reset_of_a_killed_client() {
    let (mgr, p) = start("pollkill");
    let addr: SocketAddr = "10.3.0.8:80".parse().unwrap();
    let n = 200;
    {
        let net = Net::attach(&p).unwrap();
        let l = net.listen(addr).unwrap();
        let mut client = ChildProc::spawn(
            "child_main",
            "poll_clients",
            &[p.clone(), addr.to_string(), n.to_string()],
        );
        let mut conns = std::collections::HashMap::new();
        for _ in 0..n {
            let (s, _) = l.accept().unwrap();
            s.set_nonblocking(true).unwrap();
            conns.insert(s.token(), s);
        }
        let mut events = Vec::new();
        let mut answered = 0;
        let mut resets = 0;
        let mut killed = false;
        while !conns.is_empty() {
            events.clear();
            net.poll(&mut events, Some(Duration::from_secs(1))).unwrap();
            for ev in &events {
                let Event::Stream { token, .. } = *ev else {
                    continue;
                };
                let Some(s) = conns.get(&token) else { continue };
                let mut b = [0u8; 8];
                match (&*s).read(&mut b) {
                    Ok(8) => {
                        (&*s).write_all(&b).unwrap();
                        answered += 1;
                    }
                    Ok(n) => panic!("short read {n}"),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                    Err(e) => {
                        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionReset, "{e}");
                        conns.remove(&token);
                        resets += 1;
                    }
                }
            }
            if answered == n && !killed {
                client.expect("sent");
                client.kill9();
                killed = true;
            }
        }
        assert_eq!((answered, resets), (n, n));
        drop(l);
    }
    wait_pool_whole(&mgr);
}

/// `set_token`: `poll` reports a stream under the token its caller chose
/// (as `epoll_ctl`'s data), also for an event noted before the choice;
/// other streams keep X-IO's tokens.
#[test]
fn poll_reports_tokens_the_caller_chose() {
    let (_mgr, p) = start("usertoken");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen("10.3.0.11:80").unwrap();
    let mut c1 = client.connect("10.3.0.11:80").unwrap();
    let (s1, _) = l.accept().unwrap();
    let mut c2 = client.connect("10.3.0.11:80").unwrap();
    let (s2, _) = l.accept().unwrap();
    for s in [&s1, &s2] {
        s.set_nonblocking(true).unwrap();
    }
    let mut events = Vec::new();
    server.poll(&mut events, Some(Duration::ZERO)).unwrap();
    let x_token = s2.token();
    s1.set_token(7);
    assert_eq!(s1.token(), 7);
    let wait_for = |events: &mut Vec<Event>, token: u64| {
        for _ in 0..100 {
            events.clear();
            server
                .poll(events, Some(Duration::from_millis(100)))
                .unwrap();
            if events
                .iter()
                .any(|e| matches!(e, Event::Stream { token: t, readable: true, .. } if *t == token))
            {
                return;
            }
        }
        panic!("no readable event under token {token}");
    };
    c1.write_all(b"one").unwrap();
    wait_for(&mut events, 7);
    let mut buf = [0u8; 8];
    assert_eq!((&s1).read(&mut buf).unwrap(), 3);
    c2.write_all(b"two").unwrap();
    wait_for(&mut events, x_token);
    assert_eq!((&s2).read(&mut buf).unwrap(), 3);
    // A token chosen while an event waits to be returned: the event
    // carries it. A blocking read on the same net drains the rings, which
    // notes s1's data (sent first on the same ring) for the next poll.
    c1.write_all(b"three").unwrap();
    c2.write_all(b"x").unwrap();
    s2.set_nonblocking(false).unwrap();
    assert_eq!((&s2).read(&mut buf).unwrap(), 1);
    s1.set_token(9);
    events.clear();
    server.poll(&mut events, Some(Duration::ZERO)).unwrap();
    assert!(
        events.iter().any(|e| matches!(
            e,
            Event::Stream {
                token: 9,
                readable: true,
                ..
            }
        )),
        "{events:?}"
    );
    assert!(
        !events
            .iter()
            .any(|e| matches!(e, Event::Stream { token: 7, .. })),
        "{events:?}"
    );
    assert_eq!((&s1).read(&mut buf).unwrap(), 5);
}

/// The blocking driver spins only while no thread it woke is still on its
/// way back to the lock (`Net::block`: a spinner would keep them off its
/// CPU). That count must return to zero once every thread is back, or a
/// driver would never spin again. A thread per connection on both sides,
/// in one process, with every wake-up path in use: reads woken by the
/// driver's drains, the driver's role handed over, accepts.
#[test]
fn threads_woken_by_the_driver_are_all_counted_back() {
    let (mgr, p) = start("waking");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.9.5:7000".parse().unwrap();
    let l = server.listen(addr).unwrap();
    const CONNS: usize = 16;
    const ROUNDS: usize = 2000;
    let srv = std::thread::spawn(move || {
        let echoes: Vec<_> = (0..CONNS)
            .map(|_| {
                let (s, _) = l.accept().unwrap();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 64];
                    loop {
                        match (&s).read(&mut buf) {
                            Ok(0) => break,
                            Ok(n) => (&s).write_all(&buf[..n]).unwrap(),
                            Err(e) => panic!("{e}"),
                        }
                    }
                })
            })
            .collect();
        echoes.into_iter().for_each(|h| h.join().unwrap());
    });
    let clients: Vec<_> = (0..CONNS)
        .map(|i| {
            let net = client.clone();
            std::thread::spawn(move || {
                let s = net.connect(addr).unwrap();
                for r in 0..ROUNDS {
                    echo_check(&s, &[(i + r) as u8; 64]);
                }
            })
        })
        .collect();
    clients.into_iter().for_each(|h| h.join().unwrap());
    srv.join().unwrap();
    for (name, net) in [("client", &client), ("server", &server)] {
        let (waking, woken) = net.__waking();
        assert!(woken > 0, "{name}: no thread was ever woken");
        assert_eq!(waking, 0, "{name}: {woken} woken");
    }
    wait_closed(&client, &server);
    drop((client, server));
    wait_pool_whole(&mgr);
}

/// `Drive::sparse` tells an adapter's driver that traffic is sparse, so
/// it sleeps after a token watch instead of yielding to its runtime (on a
/// multi-thread runtime every yield also wakes an idle worker). A fresh
/// net has the full budget; after empty watches each followed by a gap
/// far longer than any worth spinning through, the budget is a token and
/// `sparse` says so.
#[test]
fn sparse_traffic_is_reported_to_the_driver() {
    let (mgr, p) = start("sparse");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.9.6:7000".parse().unwrap();
    let l = server.listen(addr).unwrap();
    let c = client.connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    s.set_nonblocking(true).unwrap();
    assert!(
        !server.drive(false, false).unwrap().sparse,
        "a fresh net starts with the full spin budget"
    );
    let mut buf = [0u8; 8];
    // Each round halves the budget (200 µs at first) down to a token.
    for round in 0..32u8 {
        // The driver watched and nothing came...
        let w = server.watch_begin();
        server.watch_end(w, false, Duration::ZERO);
        // ...until much later than any spin pays for.
        std::thread::sleep(Duration::from_millis(3));
        (&c).write_all(&[round]).unwrap();
        loop {
            server.drive(true, false).unwrap();
            match (&s).read(&mut buf) {
                Ok(1) => break,
                Ok(n) => panic!("read {n} bytes"),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                    std::thread::sleep(Duration::from_micros(100))
                }
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(buf[0], round);
    }
    assert!(
        server.drive(false, false).unwrap().sparse,
        "32 gaps of 3 ms left the budget at {:?}",
        server.spin_budget()
    );
    drop((c, s, l));
    wait_closed(&client, &server);
    drop((client, server));
    wait_pool_whole(&mgr);
}

/// Runs `release` after `done` is signalled, or after 20 s (then reports
/// a hang): a watchdog for a wait that must end on its own.
fn watchdog_then(
    release: impl FnOnce() + Send + 'static,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<bool>) {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let hung = rx.recv_timeout(WATCHDOG).is_err();
        release();
        hung
    });
    (tx, t)
}

/// An event loop's `poll` that waits while another thread of the same net
/// drives (a blocking read on another stream) hears of a stream's data:
/// the driver's drain must wake the parked poll, not only readers parked
/// on the stream itself.
#[test]
fn a_poll_waiting_behind_a_blocking_reader_hears_of_data() {
    let (_mgr, p) = start("pollbehind");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen("10.3.0.40:80").unwrap();
    let mut c1 = client.connect("10.3.0.40:80").unwrap();
    let (s1, _) = l.accept().unwrap();
    let mut c2 = client.connect("10.3.0.40:80").unwrap();
    let (s2, _) = l.accept().unwrap();
    s2.set_nonblocking(true).unwrap();
    let mut events = Vec::new();
    server.poll(&mut events, Some(Duration::ZERO)).unwrap();
    let token = s2.token();
    // s1's blocking read drives the net (nothing comes for it).
    let reader = std::thread::spawn(move || {
        let mut b = [0u8; 1];
        (&s1).read(&mut b).unwrap()
    });
    std::thread::sleep(Duration::from_millis(200));
    // Data for s2 once the poll below waits.
    let writer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        c2.write_all(b"two").unwrap();
        c2
    });
    // The watchdog ends the blocking read, which ends a hang.
    let (done, dog) = watchdog_then(move || c1.write_all(b"x").unwrap());
    loop {
        events.clear();
        server.poll(&mut events, None).unwrap();
        if events
            .iter()
            .any(|e| matches!(e, Event::Stream { token: t, readable: true, .. } if *t == token))
        {
            break;
        }
    }
    let _ = done.send(());
    assert!(
        !dog.join().unwrap(),
        "the poll heard nothing until the blocking read ended"
    );
    assert_eq!(reader.join().unwrap(), 1);
    let mut b = [0u8; 8];
    assert_eq!((&s2).read(&mut b).unwrap(), 3);
    drop(writer.join().unwrap());
}

/// A non-blocking write that met a full ring is reported writable by a
/// later poll (nothing signals room): not once its stream was closed,
/// when the event would carry a token the program never chose (the
/// closed stream's own is forgotten), as epoll reports nothing for a
/// closed socket.
#[test]
fn a_closed_streams_pending_retry_reports_nothing() {
    let (_mgr, p) = start_with(
        "retryclosed",
        xio_core::layout::PoolConfig {
            ring_capacity: 64,
            ..Default::default()
        },
    );
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen("10.3.0.43:80").unwrap();
    let c = client.connect("10.3.0.43:80").unwrap();
    let (_s, _) = l.accept().unwrap();
    c.set_nonblocking(true).unwrap();
    c.set_token(1);
    let mut events = Vec::new();
    client.poll(&mut events, Some(Duration::ZERO)).unwrap();
    // The server does not drain: the ring fills before the window does.
    let mut full = false;
    for _ in 0..10_000 {
        match (&c).write(b"x") {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                full = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(full, "the ring never filled");
    drop(c);
    // Past the retry pause (50 µs).
    std::thread::sleep(Duration::from_millis(5));
    events.clear();
    client.poll(&mut events, Some(Duration::ZERO)).unwrap();
    assert!(
        events
            .iter()
            .all(|e| matches!(e, Event::Stream { token: 1, .. })),
        "{events:?}"
    );
}

/// A non-blocking write that met a full ring is reported writable by a
/// poll after a short pause (nothing signals room), also when the poll
/// waits while another thread of the net drives (a blocking read on
/// another stream): the waiting poll must look again after the pause.
#[test]
fn a_poll_waiting_behind_a_blocking_reader_reports_a_write_retry() {
    let (_mgr, p) = start_with(
        "retrybehind",
        xio_core::layout::PoolConfig {
            ring_capacity: 64,
            ..Default::default()
        },
    );
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let l = server.listen("10.3.0.44:80").unwrap();
    let mut a = client.connect("10.3.0.44:80").unwrap();
    let (mut sa, _) = l.accept().unwrap();
    let b = client.connect("10.3.0.44:80").unwrap();
    let (_sb, _) = l.accept().unwrap();
    // Both ends connected before the server stops draining.
    a.write_all(b"a").unwrap();
    assert_eq!(read_n(&sa, 1), b"a");
    sa.write_all(b"b").unwrap();
    assert_eq!(read_n(&a, 1), b"b");
    b.set_nonblocking(true).unwrap();
    b.set_token(2);
    let mut events = Vec::new();
    client.poll(&mut events, Some(Duration::ZERO)).unwrap();
    // a's blocking read drives the client's net.
    let reader = std::thread::spawn(move || {
        let mut x = [0u8; 1];
        (&a).read(&mut x).unwrap()
    });
    std::thread::sleep(Duration::from_millis(200));
    let (done, dog) = watchdog_then(move || sa.write_all(b"x").unwrap());
    let mut full = false;
    for _ in 0..10_000 {
        match (&b).write(b"x") {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                full = true;
                break;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(full, "the ring never filled");
    loop {
        events.clear();
        client.poll(&mut events, None).unwrap();
        if events.iter().any(|e| {
            matches!(
                e,
                Event::Stream {
                    token: 2,
                    writable: true,
                    ..
                }
            )
        }) {
            break;
        }
    }
    let _ = done.send(());
    assert!(
        !dog.join().unwrap(),
        "the retry was reported only once the blocking read ended"
    );
    assert_eq!(reader.join().unwrap(), 1);
}

/// `Duration::MAX` as a timeout ("forever") waits without a deadline
/// instead of panicking on `Instant` overflow (found in review, as
/// `Stack::recv_timeout`'s).
#[test]
fn timeouts_of_duration_max_mean_no_deadline() {
    let (_mgr, p) = start("maxtimeout");
    let server = Net::attach(&p).unwrap();
    let client = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.0.47:80".parse().unwrap();
    let l = server.listen(addr).unwrap();
    let c = client.connect_timeout(&addr, Duration::MAX).unwrap();
    let (s, _) = l.accept().unwrap();
    s.set_nonblocking(true).unwrap();
    s.set_token(3);
    (&c).write_all(b"x").unwrap();
    let mut events = Vec::new();
    loop {
        server.poll(&mut events, Some(Duration::MAX)).unwrap();
        if events.iter().any(|e| {
            matches!(
                e,
                Event::Stream {
                    token: 3,
                    readable: true,
                    ..
                }
            )
        }) {
            break;
        }
        events.clear();
    }
}

/// A net's first `poll` reports the streams connected and accepted before
/// it as writable, as epoll reports a socket when it is added: an event
/// loop that starts after its streams exist and waits to be told it may
/// write (to greet, say) is told, as it is for a stream accepted later.
/// (Only readable ones were reported; the loop waited for good.)
#[test]
fn the_first_poll_reports_streams_made_before_it_writable() {
    let (_mgr, p) = start("firstpollwr");
    let net = Net::attach(&p).unwrap();
    let addr: SocketAddr = "10.3.0.48:80".parse().unwrap();
    let l = net.listen(addr).unwrap();
    let c = net.connect(addr).unwrap();
    let (s, _) = l.accept().unwrap();
    for (st, token) in [(&c, 1), (&s, 2)] {
        st.set_nonblocking(true).unwrap();
        st.set_token(token);
    }
    let mut events = Vec::new();
    net.poll(&mut events, Some(Duration::ZERO)).unwrap();
    events.sort_by_key(|e| match e {
        Event::Stream { token, .. } => *token,
        Event::Accept(_) => 0,
    });
    assert_eq!(
        events,
        [1, 2].map(|token| Event::Stream {
            token,
            readable: false,
            writable: true
        })
    );
}

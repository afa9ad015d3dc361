//! Cross-process tests of the socket interface ([`xio_core::net`]): an
//! embedded manager in the test process, real child processes as servers
//! and clients, every byte checked.

mod common;

use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

use common::*;
use xio_core::manager::ManagerHandle;
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
        "short_clients" => short_clients(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap()),
        "writer_forever" => writer_forever(&a[0], a[1].parse().unwrap()),
        "slow_reader_server" => slow_reader_server(&a[0], a[1].parse().unwrap()),
        "poll_clients" => poll_clients(&a[0], a[1].parse().unwrap(), a[2].parse().unwrap()),
        "global_user" => global_user(a[0].parse().unwrap(), a[1].parse().unwrap()),
        "global_acceptor" => global_acceptor(a[0].parse().unwrap()),
        "reads_one_byte" => reads_one_byte(&a[0], a[1].parse().unwrap()),
        "server_with_its_manager" => server_with_its_manager(&a[0], a[1].parse().unwrap()),
        "connect_without_manager" => connect_without_manager(),
        "global_client" => global_client(a[0].parse().unwrap()),
        "echo_and_hold" => echo_and_hold(&a[0], a[1].parse().unwrap()),
        "exits_holding" => exits_holding(&a[0], a[1].parse().unwrap()),
        "echo_rebinding" => echo_rebinding(&a[0], a[1].parse().unwrap()),
        "slow_acceptor" => slow_acceptor(&a[0], a[1].parse().unwrap()),
        r => panic!("unknown role {r}"),
    }
}

/// A child process in `role`, serving on `addr` in pool `p`, once it
/// says it is ready.
fn serving(role: &str, p: &str, addr: SocketAddr) -> ChildProc {
    let mut c = ChildProc::spawn("child_main", role, &[p.to_owned(), addr.to_string()]);
    c.expect("ready");
    c
}

fn start(test: &str) -> (ManagerHandle, String) {
    start_with(test, Default::default())
}

/// [`start`] with the pool `pool` (small rings or classes, say).
fn start_with(test: &str, pool: xio_core::layout::PoolConfig) -> (ManagerHandle, String) {
    setup();
    let p = prefix(test);
    let mgr = manager_builder(&p).pool(pool).spawn().unwrap();
    (mgr, p)
}

/// Whether a test may stop its manager and start another in this process
/// (not on DPDK: one process cannot start DPDK's primary twice).
fn manager_restarts_in_process() -> bool {
    let ok = test_backend() != xio_core::manager::Backend::Dpdk;
    if !ok {
        eprintln!("skipped on the DPDK backend: the manager cannot restart in-process");
    }
    ok
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

/// Serves one echo exchange of 5 bytes on `l`.
fn echo_once(l: &xio_core::net::XioListener) {
    let (mut s, _) = l.accept().unwrap();
    let mut b = [0u8; 5];
    s.read_exact(&mut b).unwrap();
    s.write_all(&b).unwrap();
}

/// Role of `the_global_net_attaches_again_after_its_manager_restarts`:
/// everything through the process-wide net (`XIO_PREFIX` names the
/// test's pool), as a service that never names its pool does.
fn global_user(first: SocketAddr, second: SocketAddr) {
    let l1 = xio_core::net::XioListener::bind(first).unwrap();
    println!("XIO:listening");
    echo_once(&l1);
    wait_told("restarted");
    // The old net finds its manager gone on this bind, and the bind is
    // retried on a net attached to the new manager.
    let l2 = xio_core::net::XioListener::bind(second).unwrap();
    assert!(l1.net().manager_gone());
    assert_ne!(l2.net().id(), l1.net().id());
    println!("XIO:listening");
    echo_once(&l2);
    println!("XIO:done");
}

/// A service on the process-wide net outlives its manager: after a
/// restart, its next bind attaches to the new manager by itself, and
/// other processes reach it there.
#[test]
fn the_global_net_attaches_again_after_its_manager_restarts() {
    if !manager_restarts_in_process() {
        return;
    }
    let (m1, p) = start("restart");
    let (a1, a2): (SocketAddr, SocketAddr) = (
        "10.61.0.1:80".parse().unwrap(),
        "10.61.0.2:80".parse().unwrap(),
    );
    let mut child = ChildProc::spawn_env(
        "child_main",
        "global_user",
        &[a1.to_string(), a2.to_string()],
        &[("XIO_PREFIX", p.as_str())],
    );
    child.expect("listening");
    echo_via(&Net::attach(&p).unwrap(), a1).unwrap();
    drop(m1);
    let _m2 = manager_builder(&p).spawn().unwrap();
    child.tell("restarted");
    child.expect("listening");
    echo_via(&Net::attach(&p).unwrap(), a2).unwrap();
    child.expect("done");
    child.wait_success();
}

/// Role of `a_bound_listener_follows_a_restarted_manager`: a server that
/// only accepts, on the process-wide net, as most std servers are.
fn global_acceptor(addr: SocketAddr) {
    let l = xio_core::net::XioListener::bind(addr).unwrap();
    // Two threads accept, as servers with a pool of acceptors do: when
    // one follows a restart, the other must go on (an accept error would
    // end the process, and the test would find nobody listening).
    let l2 = l.try_clone().unwrap();
    std::thread::spawn(move || loop {
        let (mut s, _) = l2.accept().unwrap_or_else(|e| {
            eprintln!("second acceptor: {e}");
            std::process::exit(1)
        });
        let mut b = [0u8; 5];
        if s.read_exact(&mut b).is_ok() {
            let _ = s.write_all(&b);
        }
    });
    println!("XIO:listening");
    loop {
        echo_once(&l);
    }
}

/// A listener made by `XioListener::bind` follows its manager: a server
/// blocked in `accept` when the manager stops binds its address again on
/// the next manager by itself, and new clients reach it there.
#[test]
fn a_bound_listener_follows_a_restarted_manager() {
    if !manager_restarts_in_process() {
        return;
    }
    let (m1, p) = start("follow");
    let addr: SocketAddr = "10.61.0.3:80".parse().unwrap();
    let mut child = ChildProc::spawn_env(
        "child_main",
        "global_acceptor",
        &[addr.to_string()],
        &[("XIO_PREFIX", p.as_str())],
    );
    let exchange = |net: &Net| -> std::io::Result<()> {
        let mut s = net.connect(addr)?;
        s.write_all(b"hello")?;
        let mut b = [0u8; 5];
        s.read_exact(&mut b)?;
        assert_eq!(&b, b"hello");
        Ok(())
    };
    child.expect("listening");
    exchange(&Net::attach(&p).unwrap()).unwrap();
    drop(m1);
    // A while with no manager at all: the server keeps looking for one.
    std::thread::sleep(Duration::from_millis(1500));
    let _m2 = manager_builder(&p).spawn().unwrap();
    let net = Net::attach(&p).unwrap();
    // Refused until the server has bound again; it was never told.
    wait_until(
        "the server binds again on the new manager",
        || match exchange(&net) {
            Ok(()) => true,
            Err(e) => {
                assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
                std::thread::sleep(Duration::from_millis(5));
                false
            }
        },
    );
    child.kill9();
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

/// Role of `a_peer_dying_with_the_manager_still_resets`: a single-binary
/// service, its manager embedded, echoing one exchange per connection and
/// then holding the connection open.
fn server_with_its_manager(prefix: &str, addr: SocketAddr) {
    let _mgr = manager_builder(prefix).spawn().unwrap();
    // A stack of this process asleep from the start, so first in line for
    // the one wake-up the kernel gives at the manager's death: it must not
    // be waiting on the liveness word, or that wake-up dies with it.
    let idle = Net::attach(prefix).unwrap();
    let idle_l = idle.listen("10.61.0.10:80").unwrap();
    std::thread::spawn(move || drop(idle_l.accept()));
    std::thread::sleep(Duration::from_millis(50));
    let net = Net::attach(prefix).unwrap();
    let l = net.listen(addr).unwrap();
    println!("XIO:ready");
    let mut held = Vec::new();
    for s in l.incoming() {
        let mut s = s.unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).unwrap();
        s.write_all(&b).unwrap();
        held.push(s);
    }
}

/// A pool for `test` whose manager runs in a `server_with_its_manager`
/// child serving `addr`: its prefix and the child. None on DPDK, where the
/// manager runs in the test process.
fn manager_in_a_child(test: &str, addr: SocketAddr) -> Option<(String, ChildProc)> {
    if test_backend() == xio_core::manager::Backend::Dpdk {
        eprintln!("skipped on the DPDK backend: the manager runs in the test process there");
        return None;
    }
    setup();
    let p = prefix(test);
    let server = serving("server_with_its_manager", &p, addr);
    Some((p, server))
}

/// A `server_with_its_manager` child on `addr`, and a net of this process
/// with one connection to it that has echoed once (a read timeout as its
/// watchdog). None on DPDK, where the manager runs in the test process.
fn service_with_its_manager(test: &str, addr: SocketAddr) -> Option<(ChildProc, Net, XioStream)> {
    let (p, server) = manager_in_a_child(test, addr)?;
    let net = Net::attach(&p).unwrap();
    let mut s = net.connect(addr).unwrap();
    // The read timeout stays as the watchdog: a hang ends in WouldBlock.
    hello_echo(&mut s).unwrap();
    Some((server, net, s))
}

/// A service with its manager embedded is killed -9: the manager dies with
/// it, so none is left to announce the death. The client, blocked in a
/// read, still gets a reset (it looks at the peer's pidfd on its liveness
/// tick) instead of waiting forever.
#[test]
fn a_peer_dying_with_the_manager_still_resets() {
    let addr: SocketAddr = "10.61.0.6:80".parse().unwrap();
    let Some((mut server, net, mut s)) = service_with_its_manager("withmgr", addr) else {
        return;
    };
    let reader = std::thread::spawn(move || s.read(&mut [0u8; 8]));
    std::thread::sleep(Duration::from_millis(20)); // let it block (either way)
    server.kill9();
    let err = reader.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
    assert!(net.manager_gone());
}

/// A manager that stops answering (SIGSTOP here; a debugger, a hang)
/// without dying: an attach, a bind, or a connect that needs it, fails
/// with `TimedOut` after the control timeout, where it used to wait
/// forever (the connect holding the net). Once the manager runs again,
/// its late answers are matched to the requests that timed out, in order,
/// never taken for the answers to the next ones:
/// - the late channel to a service is set up here without any call of
///   ours (the manager rings us), so that service's connection to us over
///   it is accepted;
/// - a late bind is given back, and when that happens inside the next
///   request, that request's answer (refused: another process holds the
///   address) is not mixed up with the give-back's;
/// - the late refusal does not fail anything else.
#[test]
fn a_stopped_manager_times_requests_out_and_answers_them_late_in_order() {
    // An embedded manager and a service on 10.61.0.20:80.
    let Some((p, server)) = manager_in_a_child("stopped", "10.61.0.20:80".parse().unwrap()) else {
        return;
    };
    let net = Net::attach(&p).unwrap();
    let ours = net.listen("10.61.0.40:80").unwrap();
    let other = Net::attach(&p).unwrap();
    let _theirs = other.listen("10.61.0.41:80").unwrap();
    server.signal(rustix::process::Signal::STOP);
    let short = Duration::from_millis(200);
    let err = Net::builder(&p)
        .control_timeout(short)
        .attach()
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    let nobody = "10.61.0.21:80".parse::<SocketAddr>().unwrap();
    let err = net
        .connect_timeout(&"10.61.0.41:80".parse().unwrap(), short)
        .unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    let err = net.connect_timeout(&nobody, short).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    net.set_control_timeout(short);
    let err = net.listen("10.61.0.30:80").unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    net.set_control_timeout(WATCHDOG);
    server.signal(rustix::process::Signal::CONT);
    // The manager answers our queued requests in order (the bind last)
    // before the other stack connects: so the channel between the two is
    // the late connect's, which this net must pick up by itself.
    wait_until("the manager to answer the queued requests", || {
        xio_core::manager::query_status(&p).is_ok_and(|t| t.contains("10.61.0.30:80"))
    });
    let mut theirs = other.connect("10.61.0.40:80").unwrap();
    theirs.write_all(b"late").unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let r = ours.accept().map(|a| a.0);
        // Unbound before the stream is handed over: an unbind still in
        // flight at the next SIGSTOP would wait out the timeout holding
        // the net.
        drop(ours);
        tx.send(r)
    });
    let mut s = rx
        .recv_timeout(WATCHDOG)
        .expect("the connection over the late channel was never accepted")
        .unwrap();
    let mut got = [0u8; 4];
    s.set_read_timeout(Some(WATCHDOG)).unwrap();
    s.read_exact(&mut got).unwrap();
    assert_eq!(&got, b"late");
    net.listen("10.61.0.30:80").unwrap();
    // Once more, with the late answer read by the next request: the bind
    // given back must not take that request's answer (the service's
    // address is its own: refused, not the late bind's Ok).
    server.signal(rustix::process::Signal::STOP);
    net.set_control_timeout(short);
    let err = net.listen("10.61.0.31:80").unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::TimedOut, "{err}");
    net.set_control_timeout(WATCHDOG);
    server.signal(rustix::process::Signal::CONT);
    let err = net.listen("10.61.0.20:80").unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
    net.listen("10.61.0.31:80").unwrap();
    let err = net.connect(nobody).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
    // And the data path to the service works as before.
    let mut s = net.connect("10.61.0.20:80").unwrap();
    hello_echo(&mut s).unwrap();
}

/// For tests of a stopped manager: a `server_with_its_manager` child on
/// `addr` (the manager to stop), an echo service in this process on
/// `echo` (the stopped child cannot answer), and a net of this process
/// whose requests wait as long as the watchdog; and the pool's prefix.
/// None on DPDK, where the manager runs in the test process.
fn stoppable_manager(test: &str, addr: SocketAddr, echo: &str) -> Option<(String, ChildProc, Net)> {
    let (p, server) = manager_in_a_child(test, addr)?;
    let echo_l = Net::attach(&p).unwrap().listen(echo).unwrap();
    std::thread::spawn(move || {
        for s in echo_l.incoming() {
            echo_one(s.unwrap());
        }
    });
    let net = Net::attach(&p).unwrap();
    net.set_control_timeout(WATCHDOG);
    Some((p, server, net))
}

/// A listener closed while the manager is stopped waits a moment for its
/// unbind's answer, not the whole control timeout holding its net (every
/// stream of the process waited with it); the unbind is done once the
/// manager runs again.
#[test]
fn a_listener_closed_while_the_manager_is_stopped_does_not_hold_the_net() {
    let addr: SocketAddr = "10.61.0.50:80".parse().unwrap();
    let Some((p, server, net)) = stoppable_manager("stopclose", addr, "10.61.0.52:80") else {
        return;
    };
    let mut s = net.connect("10.61.0.52:80").unwrap();
    let ours: SocketAddr = "10.61.0.51:80".parse().unwrap();
    let l = net.listen(ours).unwrap();
    server.signal(rustix::process::Signal::STOP);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        drop(l);
        tx.send(())
    });
    rx.recv_timeout(WATCHDOG / 2)
        .expect("closing the listener held the net for the control timeout");
    // The data path needs no manager.
    hello_echo(&mut s).unwrap();
    server.signal(rustix::process::Signal::CONT);
    wait_until("the late unbind", || {
        xio_core::manager::query_status(&p).is_ok_and(|t| !t.contains("10.61.0.51:80"))
    });
    let other = Net::attach(&p).unwrap();
    other.listen(ours).unwrap();
    // The late answer is settled, not taken for the next request's.
    let err = net.listen(addr).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
}

/// A connect the manager must resolve, and a bind, wait for its answer
/// without holding the net: with the manager stopped, the process's other
/// streams go on (they used to wait up to the control timeout), and once
/// it runs again both complete.
#[test]
fn requests_waiting_for_a_stopped_manager_do_not_hold_the_net() {
    let addr: SocketAddr = "10.61.0.60:80".parse().unwrap();
    let Some((_p, server, net)) = stoppable_manager("stopask", addr, "10.61.0.62:80") else {
        return;
    };
    let s1 = net.connect("10.61.0.62:80").unwrap();
    let s2 = net.connect("10.61.0.62:80").unwrap();
    server.signal(rustix::process::Signal::STOP);
    // Echoes on `s` from another thread; fails if it waits for the net.
    let echo_meanwhile = |mut s: XioStream| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || tx.send(hello_echo(&mut s)));
        rx.recv_timeout(WATCHDOG / 2)
            .expect("a stream waited for a request to the stopped manager")
            .unwrap();
    };
    let (tx, connected) = std::sync::mpsc::channel();
    let n = net.clone();
    std::thread::spawn(move || tx.send(n.connect(addr)));
    wait_until("the connect waits", || net.__requests_awaited() == 1);
    echo_meanwhile(s1);
    let (tx, bound) = std::sync::mpsc::channel();
    let n = net.clone();
    std::thread::spawn(move || tx.send(n.listen("10.61.0.63:80").map(drop)));
    wait_until("the bind waits", || net.__requests_awaited() == 2);
    echo_meanwhile(s2);
    server.signal(rustix::process::Signal::CONT);
    let mut s = connected.recv_timeout(WATCHDOG).unwrap().unwrap();
    hello_echo(&mut s).unwrap();
    bound.recv_timeout(WATCHDOG).unwrap().unwrap();
    // The manager answered both in order: what follows is answered right.
    let err = net.listen(addr).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::AddrInUse, "{err}");
}

/// With the manager dead, a connect to a service that died with it is
/// refused at once (the service's pidfd says it exited), not taken over
/// the dead channel and failed at the first read.
#[test]
fn a_connect_to_a_service_dead_with_the_manager_is_refused() {
    let addr: SocketAddr = "10.61.0.11:80".parse().unwrap();
    let Some((mut server, net, _held)) = service_with_its_manager("deadsvc", addr) else {
        return;
    };
    server.kill9();
    // The channel to the dead service is still here: nobody announced it.
    let err = net.connect(addr).map(drop).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
}

/// Role of `the_first_connect_after_a_service_restart_reaches_it`: binds
/// `addr` as soon as the manager lets it (the previous holder's death may
/// not be handled yet), then echoes one exchange per connection.
fn echo_rebinding(prefix: &str, addr: SocketAddr) {
    let net = Net::attach(prefix).unwrap();
    let l = loop {
        match net.listen(addr) {
            Ok(l) => break l,
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => {
                std::thread::sleep(Duration::from_millis(5));
            }
            Err(e) => panic!("listen: {e}"),
        }
    };
    println!("XIO:ready");
    for s in l.incoming() {
        echo_one(s.unwrap());
    }
}

/// One 5-byte exchange with an echo server at `addr`.
fn echo_via(net: &Net, addr: SocketAddr) -> std::io::Result<()> {
    hello_echo(&mut net.connect(addr)?)
}

/// Writes "hello" on `s` and checks it comes back (a read timeout as the
/// watchdog).
fn hello_echo(s: &mut XioStream) -> std::io::Result<()> {
    s.set_read_timeout(Some(WATCHDOG))?;
    s.write_all(b"hello")?;
    let mut b = [0u8; 5];
    s.read_exact(&mut b)?;
    assert_eq!(&b, b"hello");
    Ok(())
}

/// In a child: waits until the test writes `what` on its stdin.
fn wait_told(what: &str) {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), what);
}

/// Role of `without_a_manager_a_slow_listener_keeps_its_route`: looks for
/// connections only every 20 ms (so a SYN waits longer than a client's
/// first check), echoing one exchange on each.
fn slow_acceptor(prefix: &str, addr: SocketAddr) {
    let net = Net::attach(prefix).unwrap();
    let l = net.listen(addr).unwrap();
    l.set_nonblocking(true).unwrap();
    println!("XIO:ready");
    loop {
        std::thread::sleep(Duration::from_millis(20));
        match l.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false).unwrap();
                echo_one(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(e) => panic!("accept: {e}"),
        }
    }
}

/// With the manager gone, a client whose SYN waits on a live but slow
/// listener cannot ask the manager whether the address still belongs to
/// it; it waits on while the process lives, and keeps its route: every
/// later connect reaches the listener too (it used to be refused, the
/// route forgotten for an answer that never came).
#[test]
fn without_a_manager_a_slow_listener_keeps_its_route() {
    if !manager_restarts_in_process() {
        return;
    }
    let (mgr, p) = start("slowsyn");
    let addr: SocketAddr = "10.61.0.13:80".parse().unwrap();
    let mut server = serving("slow_acceptor", &p, addr);
    let net = Net::attach(&p).unwrap();
    echo_via(&net, addr).unwrap();
    mgr.stop();
    wait_until("the client sees the manager gone", || net.manager_gone());
    for i in 0..3 {
        echo_via(&net, addr).unwrap_or_else(|e| panic!("connect {i} without a manager: {e}"));
    }
    server.kill9();
}

fn echo_one(mut s: XioStream) {
    let mut b = [0u8; 5];
    if s.read_exact(&mut b).is_ok() {
        let _ = s.write_all(&b);
    }
}

/// A service is killed and started again on its address while a client
/// makes no X-IO call: the client's first connect afterwards reaches the
/// new process (its stack reads the manager's news of the death before it
/// trusts its route), where it used to be refused once.
#[test]
fn the_first_connect_after_a_service_restart_reaches_it() {
    let (mgr, p) = start("svcrestart");
    let addr: SocketAddr = "10.61.0.12:80".parse().unwrap();
    let args = [p.clone(), addr.to_string()];
    let net = Net::attach(&p).unwrap();
    let mut first = ChildProc::spawn("child_main", "echo_rebinding", &args);
    first.expect("ready");
    echo_via(&net, addr).unwrap();
    first.kill9();
    let mut second = ChildProc::spawn("child_main", "echo_rebinding", &args);
    second.expect("ready");
    echo_via(&net, addr).expect("the restarted service answers the first connect");
    second.kill9();
    drop(net);
    wait_pool_whole(&mgr);
}

/// Role of `connect_with_no_manager_is_refused`: the process-wide net, on
/// a pool ($XIO_PREFIX) no manager serves.
fn connect_without_manager() {
    let e = XioStream::connect("10.61.0.7:80").unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    assert!(e.to_string().contains("xio-manager --prefix"), "{e}");
    println!("XIO:done");
}

/// A connect on the process-wide net with no manager running fails as a
/// TCP connect to a port nobody listens on does (`ConnectionRefused`,
/// which code waiting for its server retries on), saying how to start one.
#[test]
fn connect_with_no_manager_is_refused() {
    setup();
    let p = prefix("nomgr");
    let mut child = ChildProc::spawn_env(
        "child_main",
        "connect_without_manager",
        &[],
        &[("XIO_PREFIX", p.as_str())],
    );
    child.expect("done");
    child.wait_success();
}

/// Role of the restart tests: a client on the process-wide net that
/// connects once, waits (idle, not touching its net) until told the
/// manager was restarted, then connects again.
fn global_client(addr: SocketAddr) {
    let exchange = || hello_echo(&mut XioStream::connect(addr).unwrap()).unwrap();
    exchange();
    println!("XIO:connected");
    wait_told("restarted");
    exchange();
    println!("XIO:done");
}

/// After a restart, a client idle since before it connects to a service
/// that has already bound again on the new manager: its process-wide net
/// notices the old manager's death by itself (the liveness word) and asks
/// the new one, instead of using its cached route to the old listener,
/// which is gone (a refusal at the first read).
#[test]
fn a_client_reaches_a_service_that_followed_the_restart() {
    if !manager_restarts_in_process() {
        return;
    }
    let (m1, p) = start("followed");
    let addr: SocketAddr = "10.61.0.8:80".parse().unwrap();
    let env = [("XIO_PREFIX", p.as_str())];
    let mut server =
        ChildProc::spawn_env("child_main", "global_acceptor", &[addr.to_string()], &env);
    server.expect("listening");
    let mut client = ChildProc::spawn_env("child_main", "global_client", &[addr.to_string()], &env);
    client.expect("connected");
    drop(m1);
    let _m2 = manager_builder(&p).spawn().unwrap();
    // Once the service answers on the new manager...
    let net = Net::attach(&p).unwrap();
    wait_until("the service binds again", || echo_via(&net, addr).is_ok());
    // ...the idle client reaches it too.
    client.tell("restarted");
    client.expect("done");
    client.wait_success();
    server.kill9();
}

/// Role of `a_reader_in_the_managers_process_hears_of_its_stop`: echoes 5
/// bytes on one connection, then holds it open.
fn echo_and_hold(prefix: &str, addr: SocketAddr) {
    let net = Net::attach(prefix).unwrap();
    let l = net.listen(addr).unwrap();
    println!("XIO:ready");
    let (mut s, _) = l.accept().unwrap();
    let mut b = [0u8; 5];
    s.read_exact(&mut b).unwrap();
    s.write_all(&b).unwrap();
    loop {
        std::thread::park();
    }
}

/// A stack in the manager's own process does not wait on the manager's
/// liveness word (see `a_peer_dying_with_the_manager_still_resets`), yet a
/// reader of it blocked when the manager stops still hears of that, and
/// then of its peer's death: it gets a reset, not a wait forever.
#[test]
fn a_reader_in_the_managers_process_hears_of_its_stop() {
    if !manager_restarts_in_process() {
        return;
    }
    let (m1, p) = start("herestop");
    let addr: SocketAddr = "10.61.0.11:80".parse().unwrap();
    let mut server = serving("echo_and_hold", &p, addr);
    let net = Net::attach(&p).unwrap();
    let mut s = net.connect(addr).unwrap();
    // The watchdog: a hang would end in WouldBlock.
    s.set_read_timeout(Some(WATCHDOG)).unwrap();
    s.write_all(b"hello").unwrap();
    s.read_exact(&mut [0u8; 5]).unwrap();
    let reader = std::thread::spawn(move || s.read(&mut [0u8; 8]));
    std::thread::sleep(Duration::from_millis(20)); // let it block (either way)
    drop(m1);
    wait_until("the net hears its manager stopped", || net.manager_gone());
    server.kill9();
    let err = reader.join().unwrap().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
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

/// Takes the next connection of `l` (non-blocking looks, so a SYN that
/// went elsewhere fails the watchdog instead of hanging the test).
fn accept_soon(l: &xio_core::net::XioListener) -> XioStream {
    l.set_nonblocking(true).unwrap();
    let mut got = None;
    wait_until("a connection to accept", || match l.accept() {
        Ok((s, _)) => {
            got = Some(s);
            true
        }
        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => false,
        Err(e) => panic!("accept: {e}"),
    });
    let s = got.unwrap();
    s.set_nonblocking(false).unwrap();
    s
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

/// Once a net has been polled, `poll` is where its rings are drained (as
/// with `epoll`): a non-blocking read that finds nothing queued says
/// WouldBlock even though bytes sit in the ring, the next `poll` reports
/// the stream readable, and nothing is lost. Blocking reads still drain.
/// An event loop's non-blocking poll learns that its manager stopped at
/// the first poll after (from the manager's liveness word), where it used
/// to look at the control socket only once a second.
#[test]
fn a_polled_net_sees_its_manager_gone_at_the_next_poll() {
    let (mgr, p) = start("pollgone");
    let net = Net::attach(&p).unwrap();
    let _l = net.listen("10.3.0.12:80").unwrap();
    let mut events = Vec::new();
    net.poll_nowait(&mut events).unwrap();
    assert!(!net.manager_gone());
    mgr.stop();
    let _ = net.poll_nowait(&mut events);
    assert!(net.manager_gone());
}

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

fn net_peer(s: &XioStream) -> SocketAddr {
    s.peer_addr().unwrap()
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
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

/// Waits (watchdog) until neither net has a connection left, both looking
/// at their rings meanwhile as live processes do (closing takes both).
fn wait_closed(client: &Net, server: &Net) {
    let mut events = Vec::new();
    wait_until("connections closed", || {
        client.poll(&mut events, Some(Duration::ZERO)).unwrap();
        server.poll(&mut events, Some(Duration::ZERO)).unwrap();
        client.connections() == 0 && server.connections() == 0
    });
}

/// One short exchange on `s`, every byte checked.
fn echo_check(mut s: &XioStream, msg: &[u8]) {
    s.write_all(msg).unwrap();
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, msg);
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

/// `Net::manager_watch`: quiet while the manager runs, readable when it
/// stops, and quiet again for good once the net has noticed.
#[test]
fn the_manager_watch_fires_at_the_managers_end_then_goes_quiet() {
    use rustix::event::{poll, PollFd, PollFlags};
    let (mgr, p) = start("mgrwatch");
    let net = Net::attach(&p).unwrap();
    let _l = net.listen("10.3.0.13:80").unwrap();
    let w = net.manager_watch().unwrap();
    let mut events = Vec::new();
    net.poll_nowait(&mut events).unwrap();
    let readable = |t: Option<&rustix::time::Timespec>| {
        let mut fds = [PollFd::new(&w, PollFlags::IN)];
        poll(&mut fds, t).unwrap() == 1
    };
    let now = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    assert!(!readable(Some(&now)), "readable while the manager runs");
    mgr.stop();
    let dog = rustix::time::Timespec {
        tv_sec: WATCHDOG.as_secs() as i64,
        tv_nsec: 0,
    };
    assert!(readable(Some(&dog)), "the watch never fired");
    net.poll_nowait(&mut events).unwrap();
    assert!(net.manager_gone());
    assert!(
        !readable(Some(&now)),
        "still readable after the net noticed"
    );
    // A watch asked for afterwards never fires either.
    let late = net.manager_watch().unwrap();
    let mut fds = [PollFd::new(&late, PollFlags::IN)];
    assert_eq!(poll(&mut fds, Some(&now)).unwrap(), 0);
}

/// A net that finds its manager gone through a failed request (not a
/// poll) quiets its watch at the next poll all the same.
#[test]
fn the_manager_watch_goes_quiet_when_a_request_finds_the_manager_gone() {
    use rustix::event::{poll, PollFd, PollFlags};
    let (mgr, p) = start("mgrwatchreq");
    let net = Net::attach(&p).unwrap();
    let w = net.manager_watch().unwrap();
    mgr.stop();
    let e = net.listen("10.3.0.14:80").unwrap_err();
    assert!(net.manager_gone(), "{e}");
    let mut events = Vec::new();
    net.poll_nowait(&mut events).unwrap();
    let mut fds = [PollFd::new(&w, PollFlags::IN)];
    let now = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    assert_eq!(
        poll(&mut fds, Some(&now)).unwrap(),
        0,
        "readable after the poll"
    );
}

/// `manager_gone` answering yes from the liveness word alone (no poll
/// since the manager stopped) leaves the watch quiet too: a C loop that
/// woke on the closed socket, polled before the word was marked, then
/// asked, must not be woken again by the same closed socket.
#[test]
fn manager_gone_from_the_liveness_word_quiets_the_watch() {
    use rustix::event::{poll, PollFd, PollFlags};
    let (mgr, p) = start("mgrwatchword");
    let net = Net::attach(&p).unwrap();
    let w = net.manager_watch().unwrap();
    mgr.stop();
    assert!(net.manager_gone());
    let mut fds = [PollFd::new(&w, PollFlags::IN)];
    let now = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    assert_eq!(
        poll(&mut fds, Some(&now)).unwrap(),
        0,
        "readable after manager_gone said yes"
    );
}

/// Reads exactly `n` bytes from `s` (blocking, with a watchdog timeout).
fn read_n(s: &XioStream, n: usize) -> Vec<u8> {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(WATCHDOG)).unwrap();
    let mut got = vec![0u8; n];
    (&*s).read_exact(&mut got).unwrap();
    got
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

/// Runs `release` after `done` is signalled, or after 20 s (then reports
/// a hang): a watchdog for a wait that must end on its own.
fn watchdog_then(
    release: impl FnOnce() + Send + 'static,
) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<bool>) {
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let t = std::thread::spawn(move || {
        let hung = rx.recv_timeout(Duration::from_secs(20)).is_err();
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
    let hung = rx.recv_timeout(Duration::from_secs(20)).is_err();
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
    c.set_write_timeout(Some(Duration::from_secs(20))).unwrap();
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
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
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
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
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

/// A late `Connected` naming a channel this stack has closed since (the
/// peer left; a send saw the channel closed before the news was read) set
/// the channel up again, so the manager's `PeerDown` that followed made
/// the stack release it a second time. The manager had freed the slot at
/// the first release and given it to a new channel meanwhile: the second
/// release closed that one, another process's connection to us.
#[test]
fn a_late_answer_does_not_bring_back_a_closed_channel() {
    use xio_core::stack::{Error, Stack};

    let service: SocketAddr = "10.61.0.80:80".parse().unwrap();
    let Some((p, server, _net)) = stoppable_manager("latechan", service, "10.61.0.81:80") else {
        return;
    };
    let (one, two, ours): (SocketAddr, SocketAddr, SocketAddr) = (
        "10.61.0.82:80".parse().unwrap(),
        "10.61.0.83:80".parse().unwrap(),
        "10.61.0.84:80".parse().unwrap(),
    );
    let mut a = Stack::attach(&p).unwrap();
    a.bind(ours).unwrap();
    let mut b = Stack::attach(&p).unwrap();
    b.bind(one).unwrap();
    b.bind(two).unwrap();
    let pb = a.connect(one).unwrap();
    // A connect to b's other address times out; the manager answers it
    // (the channel that exists) once it runs again.
    server.signal(rustix::process::Signal::STOP);
    a.set_control_timeout(Duration::from_millis(200));
    let err = a.connect(two).unwrap_err();
    assert!(matches!(err, Error::ManagerUnresponsive(_)), "{err}");
    a.set_control_timeout(WATCHDOG);
    server.signal(rustix::process::Signal::CONT);
    // Answered: the manager reads a stack's request before a newcomer's.
    xio_core::manager::query_status(&p).unwrap();
    // b leaves; a, reading nothing, finds the channel closed as it sends.
    drop(b);
    wait_until("b's leave", || {
        xio_core::manager::query_status(&p).is_ok_and(|t| !t.contains("10.61.0.82:80"))
    });
    let err = a.try_send(pb, a.alloc(8).unwrap()).unwrap_err().0;
    assert!(matches!(err, Error::Reset(_)), "{err}");
    // c connects to a: the slot a released is free, and is c's now.
    let mut c = Stack::attach(&p).unwrap();
    let pa = c.connect(ours).unwrap();
    // a reads the late answer, the PeerDown and c's channel (and reports
    // b's reset).
    loop {
        match a.try_recv() {
            Err(Error::WouldBlock) => break,
            Err(Error::Reset(p)) if p == pb => {}
            r => panic!("unexpected {r:?}"),
        }
    }
    xio_core::manager::query_status(&p).unwrap();
    let mut m = c.alloc(5).unwrap();
    m.set_len(5);
    m.copy_from_slice(b"hello");
    c.send(pa, m)
        .expect("c's channel to a was closed by a's release of a slot it had given back");
    let got = a.recv_timeout(WATCHDOG).unwrap();
    assert_eq!(&got.buf[..], b"hello");
}

/// This process's sockets connected to the manager of `prefix` (a stack's
/// control socket), by number, duplicated.
fn control_sockets(prefix: &str) -> Vec<(i32, std::os::fd::OwnedFd)> {
    let path = xio_core::paths::socket_path(prefix);
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc/self/fd").unwrap() {
        let Some(fd) = e
            .ok()
            .and_then(|e| e.file_name().to_str()?.parse::<i32>().ok())
        else {
            continue;
        };
        // SAFETY: borrowed only to dup it; another test's thread may
        // close it meanwhile, which fails the dup (EBADF) or dups a file
        // that the peer check below rejects.
        let Ok(dup) = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }.try_clone_to_owned()
        else {
            continue;
        };
        let peer = rustix::net::getpeername(&dup).ok().flatten();
        let unix = peer.and_then(|a| rustix::net::SocketAddrUnix::try_from(a).ok());
        // The manager binds a temporary name, then renames it: its
        // accepted sockets keep the name it bound.
        let path = path.as_os_str().as_encoded_bytes();
        if unix.is_some_and(|u| u.path_bytes().is_some_and(|b| b.starts_with(path))) {
            out.push((fd, dup));
        }
    }
    out
}

/// A bind that timed out while the manager was stopped is given back when
/// its late answer comes (the caller was told it failed). That unbind was
/// sent only if the control socket had room at that moment, and dropped
/// otherwise: the manager kept the address bound to this process for
/// good, and nobody could bind it again. It now waits its turn, as a
/// channel's release does.
#[test]
fn a_late_binds_unbind_is_not_lost_to_a_full_control_socket() {
    use rustix::process::Signal;
    use std::os::fd::AsFd;
    use xio_core::ctrl;
    use xio_core::proto::Msg;
    use xio_core::stack::{Error, Stack};

    let Some((p, server)) = manager_in_a_child("lateunbind", "10.61.0.90:80".parse().unwrap())
    else {
        return;
    };
    let ours: SocketAddr = "10.61.0.91:80".parse().unwrap();
    let before: Vec<i32> = control_sockets(&p).into_iter().map(|(fd, _)| fd).collect();
    let mut a = Stack::attach(&p).unwrap();
    let (_, a_ctrl) = control_sockets(&p)
        .into_iter()
        .find(|(fd, _)| !before.contains(fd))
        .expect("a's control socket");
    server.signal(Signal::STOP);
    a.set_control_timeout(Duration::from_millis(200));
    let err = a.bind(ours).unwrap_err();
    assert!(matches!(err, Error::ManagerUnresponsive(_)), "{err}");
    a.set_control_timeout(WATCHDOG);
    server.signal(Signal::CONT);
    // Answered (the manager reads a stack's request before a newcomer's),
    // not read by a yet.
    let status = xio_core::manager::query_status(&p).unwrap();
    assert!(status.contains("10.61.0.91:80"), "{status}");
    // Stopped again, with a's control socket full.
    server.signal(Signal::STOP);
    let mut filled = 0;
    loop {
        match ctrl::send_nowait(a_ctrl.as_fd(), &Msg::Status, &[]) {
            Ok(()) => filled += 1,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => panic!("send: {e}"),
        }
    }
    assert!(filled > 0);
    // a reads the late answer: its unbind finds no room.
    assert!(matches!(a.try_recv(), Err(Error::WouldBlock)));
    server.signal(Signal::CONT);
    let mut b = Stack::attach(&p).unwrap();
    wait_until("the address is free again", || {
        // a reads the status replies, and has room again.
        let _ = a.try_recv();
        b.bind(ours).is_ok()
    });
}

/// A listener closed while the manager is stopped and the net's control
/// socket is full could not even send its unbind: the manager kept the
/// address bound to this process for good (another process's listen
/// failed with AddrInUse until it exited). The unbind now waits its turn.
#[test]
fn a_listener_closed_while_the_control_socket_is_full_is_still_unbound() {
    use rustix::process::Signal;
    use std::os::fd::AsFd;
    use xio_core::{ctrl, proto::Msg};

    let Some((p, server, _net)) = stoppable_manager(
        "fullclose",
        "10.61.0.95:80".parse().unwrap(),
        "10.61.0.96:80",
    ) else {
        return;
    };
    let ours: SocketAddr = "10.61.0.97:80".parse().unwrap();
    let before: Vec<i32> = control_sockets(&p).into_iter().map(|(fd, _)| fd).collect();
    let net = Net::attach(&p).unwrap();
    let (_, net_ctrl) = control_sockets(&p)
        .into_iter()
        .find(|(fd, _)| !before.contains(fd))
        .expect("the net's control socket");
    // The route to the echo service, known from now on.
    drop(net.connect("10.61.0.96:80").unwrap());
    let l = net.listen(ours).unwrap();
    server.signal(Signal::STOP);
    while ctrl::send_nowait(net_ctrl.as_fd(), &Msg::Status, &[]).is_ok() {}
    drop(l);
    server.signal(Signal::CONT);
    let other = Net::attach(&p).unwrap();
    wait_until("the address is free again", || {
        // A connect to a known route looks at the control socket (and
        // may report the status replies the net did not ask for).
        let _ = net.connect_known("10.61.0.96:80".parse().unwrap());
        other.listen(ours).is_ok()
    });
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

/// A connect whose answer names a channel this net closed meanwhile (the
/// peer's ring was found corrupt while the manager was stopped) is
/// refused. That refusal was taken for the manager's own (it refuses an
/// address it resolves to us, meaning one of our wildcard listeners), so
/// the connect to another process's exact address went to our own
/// wildcard listener instead.
#[test]
fn a_channel_closed_while_connecting_does_not_connect_to_our_own_wildcard() {
    use rustix::process::Signal;
    use xio_core::stack::Stack;

    let Some((p, server, _net)) = stoppable_manager(
        "closedwild",
        "10.61.0.100:80".parse().unwrap(),
        "10.61.0.101:80",
    ) else {
        return;
    };
    let port = 40000 + (std::process::id() % 20000) as u16;
    let exact: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let ours: SocketAddr = "10.61.0.102:80".parse().unwrap();
    let a = Net::attach(&p).unwrap();
    a.set_control_timeout(WATCHDOG);
    let mut poke = a.connect("10.61.0.101:80").unwrap();
    let wild = a.listen(format!("0.0.0.0:{port}")).unwrap();
    let _l = a.listen(ours).unwrap();
    // b binds the exact address, and has a channel to a.
    let mut b = Stack::attach(&p).unwrap();
    b.bind(exact).unwrap();
    let pa = b.connect(ours).unwrap();
    hello_echo(&mut poke).unwrap();
    server.signal(Signal::STOP);
    let a2 = a.clone();
    let connect = std::thread::spawn(move || a2.connect(exact));
    wait_until("the connect waits for the manager", || {
        a.__requests_awaited() == 1
    });
    // a finds b's ring corrupt and closes the channel; the manager, when
    // it runs, answers the connect with that channel first.
    assert!(b.__push_slot_count(pa, 9).unwrap());
    // (A connect to a known route drains the rings.)
    drop(a.connect("10.61.0.101:80").unwrap());
    server.signal(Signal::CONT);
    let r = connect.join().unwrap();
    wild.set_nonblocking(true).unwrap();
    let accepted = wild.accept();
    assert!(
        accepted.is_err(),
        "the connect to {exact} reached our own wildcard listener"
    );
    let err = r.map(drop).unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused, "{err}");
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

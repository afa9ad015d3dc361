//! Cross-process tests of the socket interface ([`xio_core::net`]) around
//! its manager: restarts (the process-wide net and its listeners follow),
//! a stopped or dead manager, late answers, and the manager watch.

mod common;

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use common::sockets::*;
use common::*;
use xio_core::net::{Net, XioStream};

/// Entry point of child processes (a no-op when run as a normal test).
#[test]
fn child_main() {
    let Some((role, a)) = child_role() else {
        return;
    };
    match role.as_str() {
        "global_user" => global_user(a[0].parse().unwrap(), a[1].parse().unwrap()),
        "global_acceptor" => global_acceptor(a[0].parse().unwrap()),
        "server_with_its_manager" => server_with_its_manager(&a[0], a[1].parse().unwrap()),
        "connect_without_manager" => connect_without_manager(),
        "global_client" => global_client(a[0].parse().unwrap()),
        "echo_and_hold" => echo_and_hold(&a[0], a[1].parse().unwrap()),
        "echo_rebinding" => echo_rebinding(&a[0], a[1].parse().unwrap()),
        "slow_acceptor" => slow_acceptor(&a[0], a[1].parse().unwrap()),
        r => panic!("unknown role {r}"),
    }
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

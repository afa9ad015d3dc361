//! Helpers shared by the socket tests (`sockets_*.rs`): starting a
//! manager, a child that serves, and the exchanges and waits more than
//! one of those files uses.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::time::Duration;

use super::{manager_builder, prefix, setup, wait_until, ChildProc, WATCHDOG};
use xio_core::manager::ManagerHandle;
use xio_core::net::{Net, XioStream};

/// A child process in `role`, serving on `addr` in pool `p`, once it
/// says it is ready.
pub fn serving(role: &str, p: &str, addr: SocketAddr) -> ChildProc {
    let mut c = ChildProc::spawn("child_main", role, &[p.to_owned(), addr.to_string()]);
    c.expect("ready");
    c
}

pub fn start(test: &str) -> (ManagerHandle, String) {
    start_with(test, Default::default())
}

/// [`start`] with the pool `pool` (small rings or classes, say).
pub fn start_with(test: &str, pool: xio_core::layout::PoolConfig) -> (ManagerHandle, String) {
    setup();
    let p = prefix(test);
    let mgr = manager_builder(&p).pool(pool).spawn().unwrap();
    (mgr, p)
}

/// In a child: waits until the test writes `what` on its stdin.
pub fn wait_told(what: &str) {
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    assert_eq!(line.trim(), what);
}

pub fn echo_one(mut s: XioStream) {
    let mut b = [0u8; 5];
    if s.read_exact(&mut b).is_ok() {
        let _ = s.write_all(&b);
    }
}

/// Takes the next connection of `l` (non-blocking looks, so a SYN that
/// went elsewhere fails the watchdog instead of hanging the test).
pub fn accept_soon(l: &xio_core::net::XioListener) -> XioStream {
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

/// Waits (watchdog) until neither net has a connection left, both looking
/// at their rings meanwhile as live processes do (closing takes both).
pub fn wait_closed(client: &Net, server: &Net) {
    let mut events = Vec::new();
    wait_until("connections closed", || {
        client.poll(&mut events, Some(Duration::ZERO)).unwrap();
        server.poll(&mut events, Some(Duration::ZERO)).unwrap();
        client.connections() == 0 && server.connections() == 0
    });
}

/// One short exchange on `s`, every byte checked.
pub fn echo_check(mut s: &XioStream, msg: &[u8]) {
    s.write_all(msg).unwrap();
    let mut back = vec![0u8; msg.len()];
    s.read_exact(&mut back).unwrap();
    assert_eq!(back, msg);
}

/// Reads exactly `n` bytes from `s` (blocking, with a watchdog timeout).
pub fn read_n(s: &XioStream, n: usize) -> Vec<u8> {
    s.set_nonblocking(false).unwrap();
    s.set_read_timeout(Some(WATCHDOG)).unwrap();
    let mut got = vec![0u8; n];
    (&*s).read_exact(&mut got).unwrap();
    got
}

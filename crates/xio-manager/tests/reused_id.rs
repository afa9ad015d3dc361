//! A stack that dies while it owes the manager the release of a dead
//! peer's channel settles that channel at its death, even when a newcomer
//! registers in the same pass of the manager's loop and gets its id: the
//! newcomer must not be taken for the end that owes the release (it never
//! would release it, and the dead peer's slot and the channel would stay
//! taken for good).

mod support;

use std::os::fd::AsFd;
use std::process::{Command, Stdio};

use xio_core::ctrl;
use xio_core::proto::Msg;

use crate::support::{hello, raw_conn, raw_stack, wait_until, Reap, BIN};

fn status(sock: &std::path::Path) -> String {
    let s = raw_conn(sock);
    ctrl::send(s.as_fd(), &Msg::Status, &[]).unwrap();
    let (m, fds) = ctrl::recv(s.as_fd(), false).unwrap();
    xio_core::manager::status_from_reply(m, fds).unwrap()
}

#[test]
fn a_dead_stacks_owed_release_is_not_handed_to_the_newcomer_with_its_id() {
    use rustix::process::Signal;
    let dir = support::process_dir("xio-reused-id-test");
    let prefix = "reused-id-test";
    let sock = dir.join(format!("{prefix}.sock"));
    let m = Reap(
        Command::new(BIN)
            .args(["--prefix", prefix, "--class", "2K:64", "--max-stacks", "2"])
            .env("XIO_RUN_DIR", &dir)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("manager socket", || sock.exists());
    let addr: std::net::SocketAddr = "192.0.2.7:80".parse().unwrap();

    // A (id 1) opens a channel to B (id 2), then dies: B owes the manager
    // its release, and never gives it (it does not read).
    let a = raw_stack(&sock, "a");
    let b = raw_stack(&sock, "b");
    ctrl::send(b.as_fd(), &Msg::Bind { addr }, &[]).unwrap();
    let (r, _) = ctrl::recv(b.as_fd(), false).unwrap();
    assert!(matches!(r, Msg::Ok), "{r:?}");
    ctrl::send(a.as_fd(), &Msg::Connect { addr }, &[]).unwrap();
    let (r, _fds) = ctrl::recv(a.as_fd(), false).unwrap();
    assert!(matches!(r, Msg::Connected { .. }), "{r:?}");
    drop(a);
    wait_until("A's death is handled", || {
        let s = status(&sock);
        s.contains("1/2 stacks") && s.contains("(closing)")
    });
    // A's slot is not free: the count and the list say so.
    let s = status(&sock);
    assert!(
        s.contains("1/2 stacks (+1 dead, slots not free yet)")
            && s.contains("dead, slot kept until its peers release their channels: 1"),
        "{s}"
    );

    // A newcomer's connection, accepted (a status query made after it is
    // answered, and the listener's queue is taken in order).
    let c = raw_conn(&sock);
    let _ = status(&sock);

    // While the manager is held: the newcomer's Hello, and B's end. Both
    // are read in one pass of the manager's loop.
    m.signal(Signal::STOP);
    wait_until("manager stopped", || m.state() == 'T');
    ctrl::send(
        c.as_fd(),
        &Msg::Hello {
            pid: std::process::id(),
            name: "c".into(),
        },
        &[],
    )
    .unwrap();
    drop(b);
    m.signal(Signal::CONT);
    let (r, _fds) = ctrl::recv(c.as_fd(), false).expect("watchdog: no answer to Hello");
    assert!(matches!(r, Msg::Welcome { .. }), "{r:?}");

    // Both of the channel's ends are gone: it is freed, and with it A's
    // slot, which a second newcomer then gets.
    let s = status(&sock);
    assert!(!s.contains("(closing)"), "{s}");
    let d = raw_conn(&sock);
    match hello(&d, "d") {
        Msg::Welcome { .. } => {}
        other => panic!("a stack slot stays taken by the dead A: {other:?}\n{s}"),
    }
    drop((c, d));
    drop(m);
    let _ = std::fs::remove_dir_all(&dir);
}

//! An address whose owner is dead can be bound at once, even while the
//! manager has not yet read everything the dead owner sent before its end
//! (a service restarted right after a crash must not be told its address
//! is taken by a process that no longer exists).

mod support;

use std::os::fd::AsFd;
use std::process::{Command, Stdio};

use xio_core::ctrl;
use xio_core::proto::Msg;

use crate::support::{raw_stack, wait_until, Reap, BIN};

#[test]
fn an_address_whose_owner_died_binds_at_once() {
    use rustix::process::Signal;
    let dir = support::process_dir("xio-rebind-test");
    let prefix = "rebind-test";
    let sock = dir.join(format!("{prefix}.sock"));
    let m = Reap(
        Command::new(BIN)
            .args(["--prefix", prefix, "--class", "2K:64"])
            .env("XIO_RUN_DIR", &dir)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("manager socket", || sock.exists());
    let addr: std::net::SocketAddr = "192.0.2.9:80".parse().unwrap();

    let old = raw_stack(&sock, "old");
    ctrl::send(old.as_fd(), &Msg::Bind { addr }, &[]).unwrap();
    let (r, _) = ctrl::recv(old.as_fd(), false).unwrap();
    assert!(matches!(r, Msg::Ok), "{r:?}");
    let new = raw_stack(&sock, "new");

    // While the manager is held: the old owner's last words (requests
    // with no reply), then its end; then the newcomer's bind.
    m.signal(Signal::STOP);
    wait_until("manager stopped", || m.state() == 'T');
    for _ in 0..8 {
        let released = Msg::ChannelReleased { channel: u32::MAX };
        ctrl::send(old.as_fd(), &released, &[]).unwrap();
    }
    drop(old);
    ctrl::send(new.as_fd(), &Msg::Bind { addr }, &[]).unwrap();
    m.signal(Signal::CONT);

    let (r, _) = ctrl::recv(new.as_fd(), false).expect("watchdog: no answer to bind");
    assert!(matches!(r, Msg::Ok), "bind after the owner's death: {r:?}");
    drop(new);
    drop(m);
    let _ = std::fs::remove_dir_all(&dir);
}

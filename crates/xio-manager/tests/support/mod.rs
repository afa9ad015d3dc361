//! What the `xio-manager` binary's tests share: the binary, a watchdog,
//! a guard that reaps a manager child, and raw control connections. Each
//! test binary uses a part.
#![allow(dead_code)]

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use xio_core::ctrl;
use xio_core::proto::Msg;

pub const BIN: &str = env!("CARGO_BIN_EXE_xio-manager");

/// A watchdog, not a time bound: what it waits for happens or the test fails.
pub const WATCHDOG: Duration = Duration::from_secs(60);

/// Polls `f` until true (watchdog: panic with `what`).
pub fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WATCHDOG;
    while !f() {
        assert!(Instant::now() < deadline, "watchdog: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Kills the manager child if an assertion fails first (a stopped one
/// too).
pub struct Reap(pub Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Reap {
    /// Sends `sig` to the manager.
    pub fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.0.id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
    }

    /// Its state letter in /proc (`T`: stopped).
    pub fn state(&self) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 1..];
        after.trim_start().chars().next().unwrap()
    }
}

/// A raw control connection to the manager at `sock`, its replies waited
/// for at most the watchdog.
pub fn raw_conn(sock: &Path) -> OwnedFd {
    let s = ctrl::connect(sock).unwrap();
    rustix::net::sockopt::set_socket_timeout(
        &s,
        rustix::net::sockopt::Timeout::Recv,
        Some(WATCHDOG),
    )
    .unwrap();
    s
}

/// Registers `s` as a stack: the answer to its Hello.
pub fn hello(s: &OwnedFd, name: &str) -> Msg {
    let hello = Msg::Hello {
        pid: std::process::id(),
        name: name.into(),
    };
    ctrl::send(s.as_fd(), &hello, &[]).unwrap();
    ctrl::recv(s.as_fd(), false).unwrap().0
}

/// A raw control connection registered as a stack.
pub fn raw_stack(sock: &Path, name: &str) -> OwnedFd {
    let s = raw_conn(sock);
    let m = hello(&s, name);
    assert!(matches!(m, Msg::Welcome { .. }), "{name}: {m:?}");
    s
}

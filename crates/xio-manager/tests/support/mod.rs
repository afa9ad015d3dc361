//! What the `xio-manager` binary's tests share: the binary, a watchdog,
//! and a guard that reaps a manager child. Each test binary uses a part.
#![allow(dead_code)]

use std::process::Child;
use std::time::{Duration, Instant};

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

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

#[path = "../../../xio-core/tests/common/process_dir.rs"]
mod process_dir;
/// `<tmp>/<kind>-<pid>`, those of dead processes removed (see the module).
#[allow(unused_imports)] // not every test binary makes one
pub use process_dir::process_dir;
/// The seeded generator and byte pattern of the randomized tests.
#[path = "../../../xio-core/tests/common/seeded.rs"]
pub mod seeded;

pub const BIN: &str = env!("CARGO_BIN_EXE_xio-manager");

/// A watchdog, not a time bound: what it waits for happens or the test fails.
pub const WATCHDOG: Duration = Duration::from_secs(60);

/// Stacks attached to the manager `pid` of `prefix` until it holds at
/// least `fds` descriptors (each stack takes three of it: its socket, its
/// doorbell, its pidfd). What tests of a manager out of fds use to bring
/// it near its limit: a process may keep only a few connections that say
/// nothing (16), so those alone could not.
pub fn stacks_until_fds(prefix: &str, pid: u32, fds: u64) -> Vec<xio_core::stack::Stack> {
    let mut stacks = Vec::new();
    while fds_of(pid) < fds {
        stacks.push(xio_core::stack::Stack::attach(prefix).unwrap());
    }
    stacks
}

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

/// Starts the manager binary with at most `fd_limit` fds (soft and hard
/// limit) on `prefix` in run dir `dir`, logging at info level; returns it
/// and its log lines as they come. The caller waits for its socket.
pub fn spawn_fd_limited(
    dir: &Path,
    prefix: &str,
    fd_limit: u64,
) -> (Reap, std::sync::Arc<std::sync::Mutex<Vec<String>>>) {
    use std::io::{BufRead, BufReader};
    use std::os::unix::process::CommandExt;
    use std::process::{Command, Stdio};
    let mut cmd = Command::new(BIN);
    cmd.args(["--prefix", prefix, "--class", "2K:64"])
        .args(["--max-stacks", "8", "--max-channels", "8"])
        .env("XIO_RUN_DIR", dir)
        .env("XIO_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: between fork and exec the child only makes one system call,
    // setrlimit, which is async-signal-safe; nothing allocates or locks.
    unsafe {
        cmd.pre_exec(move || {
            use rustix::process::{setrlimit, Resource, Rlimit};
            // Hard limit too: the binary raises its soft limit to the hard.
            let lim = Rlimit {
                current: Some(fd_limit),
                maximum: Some(fd_limit),
            };
            setrlimit(Resource::Nofile, lim).map_err(std::io::Error::from)
        });
    }
    let mut m = Reap(cmd.spawn().unwrap());
    let log = std::sync::Arc::new(std::sync::Mutex::new(Vec::<String>::new()));
    let err = BufReader::new(m.0.stderr.take().unwrap());
    let sink = log.clone();
    std::thread::spawn(move || {
        for line in err.lines().map_while(Result::ok) {
            sink.lock().unwrap_or_else(|e| e.into_inner()).push(line);
        }
    });
    (m, log)
}

/// How many fds process `pid` holds.
pub fn fds_of(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64
}

/// A run dir of its own for this test process, `<tmp>/<name>-<pid>`
/// (see [`process_dir`]), made and set as `$XIO_RUN_DIR` for the process (stacks read it). For
/// test binaries whose other tests, if any, neither read nor set the
/// environment while this runs.
pub fn process_run_dir(name: &str) -> std::path::PathBuf {
    let dir = process_dir(name);
    std::env::set_var("XIO_RUN_DIR", &dir);
    dir
}

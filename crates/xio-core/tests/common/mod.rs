//! Helpers for tests that spawn real processes.
//!
//! A child is this same test binary re-run with `--exact child_main` and
//! `XIO_CHILD_ROLE` set; the `child_main` test then plays that role and
//! exits. Children die with the test process (PDEATHSIG), and every wait
//! has a watchdog so a bug shows up as a failure, not a hung CI run.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::Once;
use std::time::{Duration, Instant};

mod process_dir;
pub use process_dir::process_dir;
pub mod seeded;
pub mod sockets;
#[allow(unused_imports)] // not every test binary checks bytes
pub use seeded::{fill, verify};

/// Generous: a watchdog against hangs, not a performance bound.
pub const WATCHDOG: Duration = Duration::from_secs(120);

/// Points every stack and manager of this test process (and its children)
/// at a private run directory (those of test processes gone are removed).
pub fn setup() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("XIO_CHILD_ROLE").is_none() {
            let dir = process_dir("xio-test");
            // Set before any thread of ours reads the environment.
            std::env::set_var("XIO_RUN_DIR", &dir);
        }
    });
}

/// The backend the suites run against: `XIO_TEST_BACKEND=dpdk` runs them
/// on DPDK (one test per process, see scripts/test-dpdk.sh), default shm.
pub fn test_backend() -> xio_core::manager::Backend {
    match std::env::var("XIO_TEST_BACKEND").as_deref() {
        Ok("dpdk") => xio_core::manager::Backend::Dpdk,
        Ok("shm") | Err(_) => xio_core::manager::Backend::Shm,
        Ok(other) => panic!("XIO_TEST_BACKEND={other}: shm or dpdk"),
    }
}

/// A manager builder for `prefix` on the backend under test.
pub fn manager_builder(prefix: &str) -> xio_core::manager::ManagerBuilder {
    xio_core::manager::Manager::builder(prefix).backend(test_backend())
}

/// A pool prefix unique to this test and process.
pub fn prefix(test: &str) -> String {
    format!("t-{test}-{}", std::process::id())
}

/// A child process playing `role` with `args`.
pub struct ChildProc {
    pub child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl ChildProc {
    pub fn spawn(test_fn: &str, role: &str, args: &[String]) -> ChildProc {
        Self::spawn_env(test_fn, role, args, &[])
    }

    /// As [`ChildProc::spawn`], with `env` added to the child's environment.
    pub fn spawn_env(
        test_fn: &str,
        role: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> ChildProc {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .envs(env.iter().copied())
            .args([
                "--exact",
                test_fn,
                "--nocapture",
                "--test-threads=1",
                "--quiet",
            ])
            .env("XIO_CHILD_ROLE", role)
            .env("XIO_CHILD_ARGS", args.join("\x1f"))
            .stdout(Stdio::piped())
            .stdin(Stdio::piped())
            .spawn()
            .expect("spawn child");
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("XIO:") {
                    let _ = tx.send(line);
                } else if !line.trim().is_empty() {
                    eprintln!("[child] {line}");
                }
            }
        });
        ChildProc { child, lines: rx }
    }

    /// Waits for the child to print `XIO:<what>`; returns the rest of the line.
    pub fn expect(&mut self, what: &str) -> String {
        let deadline = Instant::now() + WATCHDOG;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(&format!("XIO:{what}")) {
                        return rest.trim().to_owned();
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!(
                        "watchdog: child never said {what:?} (status {:?})",
                        self.child.try_wait()
                    );
                }
            }
        }
    }

    /// Waits for exit (watchdog: kill and fail).
    pub fn wait_success(mut self) {
        let deadline = Instant::now() + WATCHDOG;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "child failed: {st:?}");
                return;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("watchdog: child did not finish");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Sends the child a line on its stdin.
    pub fn tell(&mut self, line: &str) {
        use std::io::Write;
        let w = self.child.stdin.as_mut().expect("stdin piped");
        writeln!(w, "{line}").expect("child reads its stdin");
        w.flush().unwrap();
    }

    /// Sends `sig` (SIGSTOP, SIGCONT...) to the child. After a SIGSTOP,
    /// waits until every thread of it has stopped (the signal is
    /// delivered asynchronously).
    pub fn signal(&self, sig: rustix::process::Signal) {
        let id = self.child.id();
        let pid = rustix::process::Pid::from_raw(id as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
        if sig == rustix::process::Signal::STOP {
            wait_until("the child to stop", || {
                let tasks = std::fs::read_dir(format!("/proc/{id}/task")).unwrap();
                tasks.flatten().all(|t| {
                    let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                    // The state follows the parenthesised command name.
                    stat.rsplit(") ").next().is_some_and(|r| r.starts_with('T'))
                })
            });
        }
    }

    pub fn kill9(&mut self) {
        let pid = rustix::process::Pid::from_raw(self.child.id() as i32).unwrap();
        rustix::process::kill_process(pid, rustix::process::Signal::KILL).unwrap();
        let _ = self.child.wait();
    }
}

/// Waits until `fd` is readable; the watchdog fails the test with `what`
/// (a hang guard, not a time bound).
pub fn wait_readable(fd: impl std::os::fd::AsFd, what: &str) {
    let mut fds = [rustix::event::PollFd::new(
        &fd,
        rustix::event::PollFlags::IN,
    )];
    let timeout = rustix::event::Timespec {
        tv_sec: WATCHDOG.as_secs() as i64,
        tv_nsec: 0,
    };
    let n = rustix::event::poll(&mut fds, Some(&timeout)).unwrap();
    assert_eq!(n, 1, "watchdog: {what}");
}

/// In a child process (`XIO_CHILD_ROLE` set): its role and the role's
/// arguments, after asking to die with the parent. `None` in a normal
/// test run, where a `child_main` test does nothing.
pub fn child_role() -> Option<(String, Vec<String>)> {
    let role = std::env::var("XIO_CHILD_ROLE").ok()?;
    die_with_parent();
    Some((role, child_args()))
}

/// In a child: the role's arguments.
pub fn child_args() -> Vec<String> {
    std::env::var("XIO_CHILD_ARGS")
        .map(|a| a.split('\x1f').map(str::to_owned).collect())
        .unwrap_or_default()
}

/// In a child: die with the parent, so a failed test leaves no orphans.
pub fn die_with_parent() {
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
}

/// Polls `cond` until true (watchdog: panic with `what`).
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WATCHDOG;
    while !cond() {
        assert!(Instant::now() < deadline, "watchdog: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The message-size schedule of the checksummed tests: mostly small, with a
/// 1 MiB message every 100 and 64 KiB-ish ones in between.
pub fn size_of_msg(i: u64) -> usize {
    match i % 100 {
        0 => 1 << 20,
        1..=3 => 65_536 - (i as usize % 7),
        4..=10 => 2048 + (i as usize * 131) % 60_000,
        _ => 64 + (i as usize * 37) % 1985,
    }
}

/// Waits (watchdog) until every stack has left the manager and every buffer
/// is back in the pool.
pub fn wait_pool_whole(mgr: &xio_core::manager::ManagerHandle) {
    wait_until("pool whole after every stack left", || {
        mgr.snapshot().stacks.is_empty() && mgr.pool_is_whole()
    });
}

/// An embedded manager for `test`, a server stack bound to `addr`, and a
/// client stack connected to it.
pub fn manager_and_pair(
    test: &str,
    addr: std::net::SocketAddr,
) -> (
    xio_core::manager::ManagerHandle,
    xio_core::stack::Stack,
    xio_core::stack::Stack,
    xio_core::stack::PeerId,
) {
    setup();
    let p = prefix(test);
    let mgr = manager_builder(&p).spawn().unwrap();
    let mut server = xio_core::stack::Stack::attach(&p).unwrap();
    server.bind(addr).unwrap();
    let mut client = xio_core::stack::Stack::attach(&p).unwrap();
    let peer = client.connect(addr).unwrap();
    (mgr, server, client, peer)
}

/// Messages per burst of [`dies_mid_burst`].
pub const BURST: usize = 32;

/// Child role: sends one burst of [`BURST`] checksummed 64-byte messages
/// to `addr`, then dies (SIGKILL) in the fill of message `at` of the next:
/// the `at` before it are stamped in flight to the receiver but never
/// pushed.
pub fn dies_mid_burst(prefix: &str, addr: std::net::SocketAddr, at: usize) {
    let mut s = xio_core::stack::Stack::builder(prefix)
        .name("dies-mid-burst")
        .attach()
        .unwrap();
    let peer = s.connect(addr).unwrap();
    s.send_burst_with(peer, BURST, 64, |i, b| fill(b, i as u64))
        .unwrap();
    s.send_burst_with(peer, BURST, 64, |i, b| {
        if i == at {
            let me = rustix::process::getpid();
            let _ = rustix::process::kill_process(me, rustix::process::Signal::KILL);
            loop {
                std::thread::park();
            }
        }
        fill(b, (BURST + i) as u64)
    })
    .unwrap();
    unreachable!("killed in the fill above");
}

/// Buffers of `seg` whose header says in flight to stack `me`.
pub fn in_flight_to(seg: &xio_core::segment::Segment, me: u16) -> usize {
    owned_in_state(seg, me, xio_core::layout::bufword::INFLIGHT)
}

/// Buffers of `seg` in header state `state` owned by stack `owner`.
pub fn owned_in_state(seg: &xio_core::segment::Segment, owner: u16, state: u8) -> usize {
    use std::sync::atomic::Ordering;
    use xio_core::layout::bufword;
    let mut n = 0;
    for (class, c) in seg.classes().iter().enumerate() {
        for i in 0..c.count {
            let w = seg
                .buf_header(class, i)
                .unwrap()
                .word
                .load(Ordering::SeqCst);
            if bufword::state(w) == state && bufword::owner(w) == owner {
                n += 1;
            }
        }
    }
    n
}

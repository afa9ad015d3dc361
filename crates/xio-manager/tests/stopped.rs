//! `status` on a manager that is stopped (SIGSTOP, a debugger) or stuck:
//! it fails with `TimedOut` after the control timeout, where it used to
//! wait for ever, and works again once the manager runs.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use xio_core::stack::Error;

const BIN: &str = env!("CARGO_BIN_EXE_xio-manager");

/// A watchdog, not a time bound: what it waits for happens or the test fails.
const WATCHDOG: Duration = Duration::from_secs(60);

fn wait_until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + WATCHDOG;
    while !f() {
        assert!(Instant::now() < deadline, "watchdog: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Kills the manager if an assertion fails first (a stopped one too).
struct Reap(Child);

impl Drop for Reap {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Reap {
    fn signal(&self, sig: rustix::process::Signal) {
        let pid = rustix::process::Pid::from_raw(self.0.id() as i32).unwrap();
        rustix::process::kill_process(pid, sig).unwrap();
    }

    /// Its state letter in /proc (`T`: stopped).
    fn state(&self) -> char {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.0.id())).unwrap();
        let after = &stat[stat.rfind(')').unwrap() + 1..];
        after.trim_start().chars().next().unwrap()
    }
}

#[test]
fn status_of_a_stopped_manager_times_out_and_works_once_it_runs() {
    let dir = std::env::temp_dir().join(format!("xio-stopped-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // The only test of this process: no other thread reads the environment.
    std::env::set_var("XIO_RUN_DIR", &dir);
    let prefix = "stopped-test";
    let sock = dir.join(format!("{prefix}.sock"));
    let m = Reap(
        Command::new(BIN)
            .args(["--prefix", prefix, "--class", "2K:64"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("manager socket", || sock.exists());
    let status = || xio_core::manager::query_status_within(prefix, WATCHDOG);
    assert!(status().unwrap().contains("stacks:"));

    m.signal(rustix::process::Signal::STOP);
    wait_until("the manager stops", || m.state() == 'T');
    let short = Duration::from_millis(20);
    match xio_core::manager::query_status_within(prefix, short) {
        Err(e @ Error::ManagerUnresponsive(_)) => {
            assert_eq!(std::io::Error::from(e).kind(), std::io::ErrorKind::TimedOut)
        }
        other => panic!("expected ManagerUnresponsive, got {other:?}"),
    }
    // The binary takes its timeout from the environment, as stacks do.
    let out = Command::new(BIN)
        .args(["status", "--prefix", prefix])
        .env("XIO_CONTROL_TIMEOUT_MS", "20")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("did not answer within 20ms"), "{err}");
    // More than the listener's queue holds (128): the connects that find
    // it full time out too, rather than wait for room.
    for i in 0..140 {
        match xio_core::manager::query_status_within(prefix, short) {
            Err(Error::ManagerUnresponsive(_)) => {}
            other => panic!("query {i}: expected ManagerUnresponsive, got {other:?}"),
        }
    }
    let path = xio_core::paths::socket_path(prefix);
    let e = xio_core::ctrl::connect_within(&path, short).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");

    m.signal(rustix::process::Signal::CONT);
    assert!(status().unwrap().contains("stacks:"));
    let out = Command::new(BIN)
        .args(["status", "--prefix", prefix])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    m.signal(rustix::process::Signal::TERM);
    let mut m = m;
    assert!(m.0.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

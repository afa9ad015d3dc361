//! The `xio-manager` binary: foreground run, status, refusal of a second
//! manager, clean stop on SIGTERM/SIGINT.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use xio_core::prelude::*;

mod support;

use support::{process_run_dir, wait_until, BIN};

fn signal(child: &std::process::Child, sig: rustix::process::Signal) {
    let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
    rustix::process::kill_process(pid, sig).unwrap();
}

#[test]
fn run_status_refuse_second_and_stop_on_signals() {
    let dir = process_run_dir("xio-bin-test");
    let prefix = "bin-test";
    let sock = dir.join(format!("{prefix}.sock"));
    for sig in [rustix::process::Signal::TERM, rustix::process::Signal::INT] {
        let mut m = Command::new(BIN)
            .args(["--prefix", prefix, "--class", "4K:64", "--class", "64K:8"])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_until("manager socket", || sock.exists());

        let mut s = Stack::builder(prefix)
            .name("status-probe")
            .attach()
            .unwrap();
        s.bind("192.0.2.1:443".parse().unwrap()).unwrap();
        let held = s.alloc(1000).unwrap();
        let out = Command::new(BIN)
            .args(["status", "--prefix", prefix])
            .output()
            .unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        assert!(text.contains("status-probe"), "{text}");
        assert!(text.contains("192.0.2.1:443"), "{text}");
        assert!(text.contains("4096 B:"), "{text}");
        // Into a pipe whose reader is gone (`status | head` once head has
        // what it wants): a quiet success, not a panic.
        let (r, w) = rustix::pipe::pipe().unwrap();
        drop(r);
        let out = Command::new(BIN)
            .args(["status", "--prefix", prefix])
            .stdout(Stdio::from(w))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{:?}: {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        drop(held);

        let second = Command::new(BIN)
            .args(["--prefix", prefix])
            .output()
            .unwrap();
        assert!(!second.status.success());
        let err = String::from_utf8_lossy(&second.stderr);
        assert!(err.contains("already running"), "{err}");

        drop(s);
        signal(&m, sig);
        let st = m.wait().unwrap();
        assert!(st.success(), "manager exit on {sig:?}: {st:?}");
        assert!(!sock.exists(), "socket removed on exit");
        let lock = dir.join(format!("{prefix}.lock"));
        assert!(!lock.exists(), "lock file removed on exit");
        let mut log = String::new();
        std::io::Read::read_to_string(m.stderr.as_mut().unwrap(), &mut log).unwrap();
        assert!(
            log.contains("manager ready") && log.contains("stack registered"),
            "{log}"
        );
    }
    let out = Command::new(BIN)
        .args(["status", "--prefix", prefix])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("no X-IO manager"));
    let _ = std::fs::remove_dir_all(&dir);
}

/// The control socket's file appears only once the manager accepts on it:
/// whoever waits for the file connects at once and is never refused (the
/// socket is bound under a temporary name and renamed when it listens).
#[test]
fn the_socket_appears_only_when_it_listens() {
    let dir = support::process_dir("xio-bin-appear");
    let sock = dir.join("appear-test.sock");
    /// Kills the manager if an assertion fails first.
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    // The gap this closes is a few microseconds: catching it takes tries.
    for _ in 0..50 {
        let mut m = Reap(
            Command::new(BIN)
                .args(["--prefix", "appear-test", "--class", "2K:16"])
                .env("XIO_RUN_DIR", &dir)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        );
        // Poll without sleeping, to catch the file the moment it appears.
        let deadline = std::time::Instant::now() + support::WATCHDOG;
        while !sock.exists() {
            assert!(
                std::time::Instant::now() < deadline,
                "watchdog: manager socket"
            );
            std::thread::yield_now();
        }
        // The control socket is a seqpacket one.
        use rustix::net::{AddressFamily, SocketAddrUnix, SocketType};
        let c = rustix::net::socket(AddressFamily::UNIX, SocketType::SEQPACKET, None).unwrap();
        let r = rustix::net::connect(&c, &SocketAddrUnix::new(&sock).unwrap());
        assert!(r.is_ok(), "connect as the socket appeared: {r:?}");
        drop(c);
        signal(&m.0, rustix::process::Signal::TERM);
        assert!(m.0.wait().unwrap().success());
        let left: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .filter(|n| n.to_string_lossy().contains(".sock"))
            .collect();
        assert!(left.is_empty(), "socket files left behind: {left:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A manager whose log went away (its stderr a pipe nobody reads any
/// more: `xio-manager 2>&1 | head`, a logger that died) keeps serving and
/// still stops on SIGTERM. tracing-subscriber reported the failed write
/// with `eprintln!`, which panics on that same stderr: the first log line
/// killed the manager, or the signal thread, so SIGTERM was ignored.
#[test]
fn a_manager_whose_stderr_is_closed_serves_and_stops() {
    let dir = support::process_dir("xio-bin-nolog");
    let prefix = "nolog-test";
    let sock = dir.join(format!("{prefix}.sock"));
    let (read_end, write_end) = rustix::pipe::pipe().unwrap();
    drop(read_end); // every write to the manager's stderr fails (EPIPE)
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let mut m = Reap(
        Command::new(BIN)
            .args(["--prefix", prefix, "--class", "2K:16"])
            .env("XIO_RUN_DIR", &dir)
            .stdout(Stdio::null())
            .stderr(Stdio::from(write_end))
            .spawn()
            .unwrap(),
    );
    wait_until("manager socket", || {
        sock.exists() || m.0.try_wait().unwrap().is_some()
    });
    for _ in 0..3 {
        // Each status request and each attach is a log line at least.
        let out = Command::new(BIN)
            .args(["status", "--prefix", prefix])
            .env("XIO_RUN_DIR", &dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "status: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert!(m.0.try_wait().unwrap().is_none(), "the manager died");
    signal(&m.0, rustix::process::Signal::TERM);
    let deadline = Instant::now() + support::WATCHDOG;
    let st = loop {
        if let Some(st) = m.0.try_wait().unwrap() {
            break st;
        }
        assert!(
            Instant::now() < deadline,
            "SIGTERM did not stop the manager"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(st.success(), "manager exit: {st:?}");
    assert!(!sock.exists(), "socket removed on exit");
    let _ = std::fs::remove_dir_all(&dir);
}

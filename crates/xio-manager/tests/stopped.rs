//! `status` on a manager that is stopped (SIGSTOP, a debugger) or stuck:
//! it fails with `TimedOut` after the control timeout, where it used to
//! wait for ever, and works again once the manager runs.

use std::process::{Command, Stdio};
use std::time::Duration;

use xio_core::stack::Error;

mod support;

use support::{process_run_dir, wait_until, Reap, BIN, WATCHDOG};

#[test]
fn status_of_a_stopped_manager_times_out_and_works_once_it_runs() {
    let dir = process_run_dir("xio-stopped-test");
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
    // Attaching, with the queue full, times out the same way (its connect
    // used to wait for room for good).
    match xio_core::stack::Stack::builder(prefix)
        .control_timeout(short)
        .attach()
    {
        Err(Error::ManagerUnresponsive(_)) => {}
        other => panic!(
            "attach: expected ManagerUnresponsive, got {:?}",
            other.err()
        ),
    }

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

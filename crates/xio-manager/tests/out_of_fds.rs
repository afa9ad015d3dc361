//! The `xio-manager` binary out of fds: an accept that fails leaves the
//! connection queued and the listener readable, so the manager must rest
//! its listener instead of polling it again at once (it spun at full CPU,
//! logging a warning per turn), and go on serving its stacks meanwhile.

use xio_core::prelude::*;

mod support;

use support::{fds_of, process_run_dir, spawn_fd_limited, stacks_until_fds, wait_until};

/// The manager's fd limit: a few more than it holds once started with one
/// stack registered (stdio, lock, listener, segment, eventfds, the signal
/// pipe, the stack's socket, doorbell and pidfd).
const FD_LIMIT: u64 = 32;

#[test]
fn a_manager_out_of_fds_rests_its_listener_and_still_serves_its_stacks() {
    let dir = process_run_dir("xio-fds-test");
    let prefix = "fds-test";
    let sock = dir.join(format!("{prefix}.sock"));
    let (mut m, log) = spawn_fd_limited(&dir, prefix, FD_LIMIT);
    let count = |what: &str| {
        log.lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(what))
            .count()
    };
    wait_until("manager socket", || sock.exists());
    let mut steady = Stack::builder(prefix).name("steady").attach().unwrap();

    // Stacks bring it near its limit, then connections that say nothing
    // (fewer than the 16 one process may keep): the manager holds an fd
    // for each until it has none left; the last two stay in the
    // listener's queue (few enough that, once the others go, all fit).
    let _fill = stacks_until_fds(prefix, m.0.id(), FD_LIMIT - 12);
    let open = fds_of(m.0.id());
    assert!(open < FD_LIMIT, "the manager holds {open} fds at start");
    let path = xio_core::paths::socket_path(prefix);
    let silent: Vec<_> = (0..FD_LIMIT - open + 2)
        .map(|_| xio_core::ctrl::connect(&path).unwrap())
        .collect();
    wait_until("the manager runs out of fds", || count("accept failed") > 0);

    // The stack it has is served meanwhile, each request a turn of the
    // manager's loop: one that polled the listener at once would have
    // failed to accept, and logged it, at each of them.
    for i in 0..200u16 {
        let addr = format!("10.67.{}.{}:80", i / 100, i % 100 + 1);
        steady.bind(addr.parse().unwrap()).unwrap();
    }
    assert_eq!(count("accept failed"), 1, "{:#?}", log.lock().unwrap());

    // Fds freed, it accepts again (what waited in the queue, and a new
    // client), and says so once.
    drop(silent);
    wait_until("the manager accepts again", || {
        count("accepting connections again") > 0
    });
    let status = xio_core::manager::query_status(prefix).unwrap();
    assert!(
        status.contains("steady") && status.contains("10.67.1.100:80"),
        "{status}"
    );
    assert_eq!(count("accept failed"), 1);
    assert_eq!(count("accepting connections again"), 1);

    drop(steady);
    let pid = rustix::process::Pid::from_raw(m.0.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert!(m.0.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

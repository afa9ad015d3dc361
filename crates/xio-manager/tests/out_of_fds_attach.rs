//! The `xio-manager` binary with one fd left when a stack attaches: it
//! accepts the connection with it, then cannot make the stack's doorbell.
//! The stack must hear why (a refusal naming the doorbell), not find its
//! socket closed, and the manager must go on.

use xio_core::prelude::*;
use xio_core::proto::ErrorCode;

mod support;

use support::{fds_of, process_run_dir, spawn_fd_limited, stacks_until_fds, wait_until};

const FD_LIMIT: u64 = 32;

#[test]
fn a_manager_that_cannot_make_a_doorbell_refuses_the_attach_and_says_why() {
    let dir = process_run_dir("xio-fds-attach");
    let prefix = "fds-attach";
    let (mut m, _log) = spawn_fd_limited(&dir, prefix, FD_LIMIT);
    let path = xio_core::paths::socket_path(prefix);
    wait_until("manager socket", || path.exists());

    // Stacks, then silent connections one at a time (fewer than the 16
    // one process may keep), until the manager has one fd left: the
    // attach's own connection takes it.
    let fill = stacks_until_fds(prefix, m.0.id(), FD_LIMIT - 10);
    let mut silent = Vec::new();
    while fds_of(m.0.id()) < FD_LIMIT - 1 {
        let before = fds_of(m.0.id());
        silent.push(xio_core::ctrl::connect(&path).unwrap());
        wait_until("the manager accepts", || fds_of(m.0.id()) > before);
    }
    match Stack::attach(prefix) {
        Err(xio_core::stack::Error::Refused { code, message }) => {
            assert_eq!(code, ErrorCode::NoSpace, "{message}");
            assert!(message.contains("doorbell"), "{message}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("attached with no fd left for a doorbell"),
    }

    // With fds back, the next attach works.
    drop(silent);
    drop(fill);
    wait_until("the manager closes the silent connections", || {
        fds_of(m.0.id()) < FD_LIMIT - 4
    });
    let s = Stack::attach(prefix).unwrap();
    drop(s);
    let pid = rustix::process::Pid::from_raw(m.0.id() as i32).unwrap();
    rustix::process::kill_process(pid, rustix::process::Signal::TERM).unwrap();
    assert!(m.0.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&dir);
}

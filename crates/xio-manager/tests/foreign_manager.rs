//! A stack attaches only to a manager of its own user or root's: whoever
//! answers on the socket gets every byte the stack sends, and a run dir
//! may be shared (`XIO_RUN_DIR` pointed at a common directory, or a
//! socket bind-mounted into a container). One test in this binary: it
//! sets `XIO_RUN_DIR` for the whole process.

mod support;

use std::process::{Command, Stdio};

use crate::support::{wait_until, Reap, BIN};

#[test]
fn a_stack_refuses_a_manager_run_by_another_user() {
    use std::os::unix::process::CommandExt;
    // Running the manager as another user needs root.
    if !rustix::process::geteuid().is_root() {
        eprintln!("skipped: needs root to run a manager as another user");
        return;
    }
    let base = std::env::temp_dir().join(format!("xio-foreign-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    let dir = base.join("run");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    // Set before any stack reads it; no other test runs in this binary.
    std::env::set_var("XIO_RUN_DIR", &dir);

    let mut m = Reap(
        Command::new(BIN)
            .args(["--prefix", "foreign", "--class", "2K:16"])
            .env("XIO_RUN_DIR", &dir)
            .uid(65534)
            .gid(65534)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("the other user's manager listens", || {
        dir.join("foreign.sock").exists() || m.0.try_wait().unwrap().is_some()
    });
    assert!(
        m.0.try_wait().unwrap().is_none(),
        "the manager run as uid 65534 did not start"
    );

    match xio_core::stack::Stack::attach("foreign") {
        Err(xio_core::stack::Error::NoManager { err, .. }) => {
            assert_eq!(err.kind(), std::io::ErrorKind::PermissionDenied, "{err}");
            assert!(err.to_string().contains("uid 65534"), "{err}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a root stack attached to uid 65534's manager"),
    }
    // The manager saw a connection close before its Hello, nothing else.
    assert!(m.0.try_wait().unwrap().is_none(), "the manager died");
    m.signal(rustix::process::Signal::TERM);
    assert!(m.0.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&base);
}

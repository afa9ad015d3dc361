//! A stack attaches only to a manager it trusts: whoever answers on the
//! socket gets every byte the stack sends, and a run dir may be shared
//! (`XIO_RUN_DIR` pointed at a common directory, or a socket bind-mounted
//! into a container). A manager of another user is trusted only in a run
//! dir `XIO_RUN_DIR` names that belongs to that user alone (joining its
//! domain on purpose); in a directory every user may write to, never. One
//! test in this binary: it sets `XIO_RUN_DIR` for the whole process.

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
    // Everyone's (sticky, as /tmp): the manager may start there, no stack
    // of another user trusts it.
    std::fs::set_permissions(&dir, {
        let mut p = perms(&dir);
        std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o1777);
        p
    })
    .unwrap();
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
        Err(e @ xio_core::stack::Error::UntrustedManager { uid: 65534, .. }) => {
            let io = std::io::Error::from(e);
            assert_eq!(io.kind(), std::io::ErrorKind::PermissionDenied, "{io}");
            assert!(io.to_string().contains("XIO_RUN_DIR"), "{io}");
        }
        Err(e) => panic!("refused for another reason: {e}"),
        Ok(_) => panic!("a root stack attached to uid 65534's manager in a common dir"),
    }
    // The same manager in a run dir of its user's alone, named by
    // XIO_RUN_DIR: the stack joins its domain (root is in every one).
    std::os::unix::fs::chown(&dir, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&dir, {
        let mut p = perms(&dir);
        std::os::unix::fs::PermissionsExt::set_mode(&mut p, 0o755);
        p
    })
    .unwrap();
    let joined = xio_core::stack::Stack::attach("foreign");
    assert!(joined.is_ok(), "{:?}", joined.err());
    drop(joined);
    // The manager saw a connection close before its Hello, nothing else.
    assert!(m.0.try_wait().unwrap().is_none(), "the manager died");
    m.signal(rustix::process::Signal::TERM);
    assert!(m.0.wait().unwrap().success());
    let _ = std::fs::remove_dir_all(&base);
}

fn perms(p: &std::path::Path) -> std::fs::Permissions {
    std::fs::metadata(p).unwrap().permissions()
}

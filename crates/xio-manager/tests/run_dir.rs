//! The run dir holds the control socket every stack of the user trusts:
//! the manager refuses one another user could write to (a world-writable
//! one, or one someone else made first, as anyone can under /tmp), and
//! makes its own private.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::{Reap, BIN, WATCHDOG};

/// Runs the manager on `dir`: `Err(stderr)` if it refuses to start,
/// `Ok(manager)` once its socket is there.
fn start(dir: &Path) -> Result<Reap, String> {
    let mut m = Reap(
        Command::new(BIN)
            .args(["--prefix", "rundir", "--class", "2K:16"])
            .env("XIO_RUN_DIR", dir)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let deadline = Instant::now() + WATCHDOG;
    loop {
        if let Some(st) = m.0.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(m.0.stderr.as_mut().unwrap(), &mut err).unwrap();
            assert!(!st.success(), "{err}");
            return Err(err);
        }
        if dir.join("rundir.sock").exists() {
            return Ok(m);
        }
        assert!(
            Instant::now() < deadline,
            "watchdog: manager neither up nor out"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn stop(m: Reap) {
    let mut m = m;
    m.signal(rustix::process::Signal::TERM);
    assert!(m.0.wait().unwrap().success());
}

#[test]
fn a_run_dir_others_can_write_is_refused_and_a_new_one_is_private() {
    let base = std::env::temp_dir().join(format!("xio-rundir-test-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();

    // Everyone may write, no sticky bit: anyone could swap the socket.
    let open = base.join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    match start(&open) {
        Err(e) => assert!(e.contains("run dir") && e.contains("every user"), "{e}"),
        Ok(m) => {
            stop(m);
            panic!("the manager started in a world-writable run dir");
        }
    }

    // Made first by another user (as anyone can make /tmp/xio-<uid>):
    // only root can set that up here.
    if rustix::process::geteuid().is_root() {
        let squatted = base.join("squatted");
        std::fs::create_dir(&squatted).unwrap();
        std::os::unix::fs::chown(&squatted, Some(65534), Some(65534)).unwrap();
        match start(&squatted) {
            Err(e) => assert!(e.contains("run dir") && e.contains("owned by"), "{e}"),
            Ok(m) => {
                stop(m);
                panic!("the manager started in a run dir another user owns");
            }
        }
    }

    // One it makes itself is private to the user.
    let fresh = base.join("fresh").join("xio");
    let m = start(&fresh).expect("a fresh run dir");
    let mode = std::fs::metadata(&fresh).unwrap().mode() & 0o777;
    assert_eq!(mode, 0o700, "the run dir made is {mode:o}");
    stop(m);
    let _ = std::fs::remove_dir_all(&base);
}

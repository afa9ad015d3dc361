//! The examples leave nothing in the temp dir: each makes a run dir of its
//! own there (`xio-<name>-<pid>`), which an early error return left
//! behind, one per failed run. And the children they spawn die with them.

#[path = "common/process_dir.rs"]
mod process_dir;

use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Where the examples are: `target/<profile>/examples`, next to this
/// test's `deps/`. Cargo builds no examples for `--test examples`, so
/// they are built here (a no-op when they are up to date), never stale.
fn examples_dir() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(["build", "--quiet", "-p", "xio-core", "--examples"]);
    if dir.file_name().is_some_and(|n| n == "release") {
        cmd.arg("--release");
    }
    let st = cmd
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .status()
        .expect("running cargo to build the examples");
    assert!(st.success(), "building the examples failed");
    dir.join("examples")
}

/// Each self-contained example, failing once its manager runs (every
/// stack refuses a control timeout of 0), returns its error and removes
/// its run dir on the way out.
#[test]
fn an_example_that_fails_leaves_no_run_dir() {
    let examples = examples_dir();
    let tmp = process_dir::process_dir("xio-examples-test");
    for name in ["demo", "echo", "oneway"] {
        let out = Command::new(examples.join(name))
            .env("TMPDIR", &tmp)
            .env("XIO_CONTROL_TIMEOUT_MS", "0")
            .env_remove("XIO_RUN_DIR")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("XIO_CONTROL_TIMEOUT_MS"),
            "{name} did not fail as meant: {out:?}"
        );
        let left: Vec<_> = std::fs::read_dir(&tmp)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{name} left {left:?} in {}", tmp.display());
    }
    std::fs::remove_dir(&tmp).unwrap();
}

/// The service child a self-contained example spawns dies with the
/// example however it ends, `kill -9` included, rather than serve for
/// ever. Here a shell plays the example: it starts echo's service as the
/// example does (its own pid in `XIO_EXAMPLE_PARENT`), and is killed.
#[test]
fn an_examples_child_dies_with_it() {
    use std::io::BufRead;
    use std::time::{Duration, Instant};
    // Ends a test that would otherwise hang; no bound on speed.
    const HANG_GUARD: Duration = Duration::from_secs(120);
    let examples = examples_dir();
    let prefix = format!("ex-orphan-{}", std::process::id());
    let mgr = xio_core::manager::Manager::builder(&prefix)
        .spawn()
        .unwrap();
    let mut sh = Command::new("sh")
        .args(["-c", "XIO_EXAMPLE_PARENT=$$ \"$@\" & wait", "sh"])
        .arg(examples.join("echo"))
        .args(["serve", &prefix, "10.0.0.1:9"])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(sh.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "ready");
    // The service's pid, from the manager it registered with (once the
    // manager has published it).
    let deadline = Instant::now() + HANG_GUARD;
    let pid = loop {
        if let Some(s) = mgr.snapshot().stacks.first() {
            break s.pid;
        }
        assert!(
            Instant::now() < deadline,
            "hang guard: the service registers"
        );
        std::thread::sleep(Duration::from_millis(2));
    };
    // Held while it lives: readable once it exits (a zombie too).
    let pidfd = rustix::process::pidfd_open(
        rustix::process::Pid::from_raw(pid as i32).unwrap(),
        rustix::process::PidfdFlags::empty(),
    )
    .unwrap();
    sh.kill().unwrap();
    sh.wait().unwrap();
    let mut fds = [rustix::event::PollFd::new(
        &pidfd,
        rustix::event::PollFlags::IN,
    )];
    let t = rustix::time::Timespec {
        tv_sec: HANG_GUARD.as_secs() as _,
        tv_nsec: 0,
    };
    let exited = matches!(rustix::event::poll(&mut fds, Some(&t)), Ok(n) if n > 0);
    if !exited {
        // Not left running after the test.
        let _ = rustix::process::pidfd_send_signal(&pidfd, rustix::process::Signal::KILL);
    }
    assert!(exited, "hang guard: echo's service outlived its parent");
    drop(mgr);
}

//! The examples leave nothing in the temp dir: each makes a run dir of its
//! own there (`xio-<name>-<pid>`), which an early error return left
//! behind, one per failed run.

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

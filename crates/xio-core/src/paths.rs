//! Where a pool's control socket lives.
//!
//! A pool is named by its *prefix* (like DPDK's `--file-prefix`: one pool per
//! security domain). Its manager listens on `<run dir>/<prefix>.sock` and
//! holds `<run dir>/<prefix>.lock` (both removed at a clean stop). The
//! socket file appears only once the manager accepts on it (it listens
//! under `<prefix>.sock.new` first), so waiting for the file is waiting
//! for the manager. The run dir is
//! `$XIO_RUN_DIR` if set, else `$XDG_RUNTIME_DIR/xio`, else `/tmp/xio-<uid>`.
//! The manager makes it private (0700) if missing, and refuses one another
//! user owns or every user may write to without the sticky bit.

use std::path::PathBuf;

/// A prefix that cannot name a pool.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid pool prefix {0:?}: use 1 to 64 characters from A-Z a-z 0-9 _ . - (not starting with '.')")]
pub struct BadPrefix(pub String);

/// Checks a prefix.
pub fn check_prefix(prefix: &str) -> Result<(), BadPrefix> {
    let ok = !prefix.is_empty()
        && prefix.len() <= 64
        && !prefix.starts_with('.')
        && prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"_.-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(BadPrefix(prefix.to_owned()))
    }
}

/// The directory holding control sockets.
pub fn run_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XIO_RUN_DIR") {
        return PathBuf::from(d);
    }
    if let Some(d) = std::env::var_os("XDG_RUNTIME_DIR") {
        return PathBuf::from(d).join("xio");
    }
    PathBuf::from(format!("/tmp/xio-{}", rustix::process::getuid().as_raw()))
}

#[cfg(test)]
#[path = "../tests/common/process_dir.rs"]
mod process_dir;

/// Points this unit-test process's managers and stacks at a run dir of
/// its own (`<tmp>/xio-unit-<pid>`, those of test processes gone
/// removed), as the integration tests do: not the user's real one, which
/// collected a lock file per run (and a socket after a crash). Call it
/// first in every unit test that runs a manager.
#[cfg(test)]
pub(crate) fn use_test_run_dir() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| std::env::set_var("XIO_RUN_DIR", process_dir::process_dir("xio-unit")));
}

/// The control socket of pool `prefix`.
pub fn socket_path(prefix: &str) -> PathBuf {
    run_dir().join(format!("{prefix}.sock"))
}

/// The lock file of pool `prefix`.
pub fn lock_path(prefix: &str) -> PathBuf {
    run_dir().join(format!("{prefix}.lock"))
}

/// The default prefix: `$XIO_PREFIX` or `"xio"`.
pub fn default_prefix() -> String {
    std::env::var("XIO_PREFIX").unwrap_or_else(|_| "xio".to_owned())
}

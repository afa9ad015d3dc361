//! Where a pool's control socket lives.
//!
//! A pool is named by its *prefix* (like DPDK's `--file-prefix`: one pool per
//! security domain). Its manager listens on `<run dir>/<prefix>.sock` and
//! holds `<run dir>/<prefix>.lock` (both removed at a clean stop). The
//! socket file appears only once the manager accepts on it (it listens
//! under `<prefix>.sock.new` first), so waiting for the file is waiting
//! for the manager. The run dir is
//! `$XIO_RUN_DIR` if set, else `$XDG_RUNTIME_DIR/xio`, else `/tmp/xio-<uid>`
//! (or, when another user took that name first, `$HOME/.xio-run`). The
//! manager makes it private (0700) if missing, and refuses one another user
//! owns or every user may write to without the sticky bit.

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
    default_run_dir(
        std::path::Path::new("/tmp"),
        std::env::var_os("HOME").map(PathBuf::from).as_deref(),
        rustix::process::getuid().as_raw(),
        rustix::process::geteuid().as_raw(),
    )
}

/// `<tmp>/xio-<uid>`, unless something this user does not own is there
/// already: any user can create a name in `/tmp` first, and the manager
/// refuses a run dir another user owns (safe, but no manager could start).
/// Then `<home>/.xio-run`, if `home` is a directory of this user's: a
/// place no other user can take. Managers and stacks choose alike, so
/// they meet in the fallback too. With no such home, `<tmp>/xio-<uid>`
/// still, and the manager's refusal says to set `XIO_RUN_DIR`.
fn default_run_dir(
    tmp: &std::path::Path,
    home: Option<&std::path::Path>,
    uid: u32,
    euid: u32,
) -> PathBuf {
    use std::os::unix::fs::MetadataExt;
    let ours = |p: &std::path::Path| {
        std::fs::symlink_metadata(p).is_ok_and(|m| m.is_dir() && (m.uid() == euid || m.uid() == 0))
    };
    let dir = tmp.join(format!("xio-{uid}"));
    let taken = std::fs::symlink_metadata(&dir).is_ok() && !ours(&dir);
    match home {
        Some(h) if taken && h.is_absolute() && ours(h) => h.join(".xio-run"),
        _ => dir,
    }
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

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Another user's `xio-<uid>` in the temporary directory (made here as
    /// root, as any user could make it) sends managers and stacks to the
    /// user's home; their own, or none, keeps them in the temporary one.
    #[test]
    fn a_run_dir_taken_by_another_user_falls_back_to_home() {
        let base = std::env::temp_dir().join(format!("xio-rundir-fallback-{}", std::process::id()));
        let (tmp, home) = (base.join("tmp"), base.join("home"));
        std::fs::create_dir_all(&tmp).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        let (uid, euid) = (4242, rustix::process::geteuid().as_raw());
        let dir = tmp.join("xio-4242");
        // Free: the usual place.
        assert_eq!(default_run_dir(&tmp, Some(&home), uid, euid), dir);
        // Ours: still there.
        std::fs::create_dir(&dir).unwrap();
        assert_eq!(default_run_dir(&tmp, Some(&home), uid, euid), dir);
        // A file, or a symlink, in its place is not ours.
        std::fs::remove_dir(&dir).unwrap();
        std::os::unix::fs::symlink(&home, &dir).unwrap();
        assert_eq!(
            default_run_dir(&tmp, Some(&home), uid, euid),
            home.join(".xio-run")
        );
        std::fs::remove_file(&dir).unwrap();
        // Another user's directory (only root can make one here).
        if euid == 0 {
            std::fs::create_dir(&dir).unwrap();
            rustix::fs::chown(&dir, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
            assert_eq!(
                default_run_dir(&tmp, Some(&home), uid, euid),
                home.join(".xio-run")
            );
            // No home of ours to go to: the usual place, which the manager
            // then refuses, saying to set XIO_RUN_DIR.
            assert_eq!(default_run_dir(&tmp, None, uid, euid), dir);
            let theirs = base.join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            rustix::fs::chown(&theirs, Some(rustix::fs::Uid::from_raw(65534)), None).unwrap();
            assert_eq!(default_run_dir(&tmp, Some(&theirs), uid, euid), dir);
        }
        let _ = std::fs::remove_dir_all(&base);
    }
}

//! An example's private run dir, `<tmp>/xio-<name>-<pid>`: where its
//! manager puts the control socket, made the process's `$XIO_RUN_DIR`
//! (the children it spawns inherit it). Dropped, it removes the dir, so
//! `main` leaves nothing behind however it returns (an error or a panic
//! included), not only at the end of a run that went well. The children
//! never make one; the pid check keeps a copy that got into another
//! process from removing the dir. (Ctrl-C ends the process without
//! running drops: that run's dir stays.)
//!
//! Shared by the examples with `#[path]`; it needs nothing but std.

use std::path::{Path, PathBuf};

pub struct RunDir {
    dir: PathBuf,
    pid: u32,
}

impl RunDir {
    /// Makes the dir and points `$XIO_RUN_DIR` at it (before the
    /// manager or a stack reads it).
    pub fn create(name: &str) -> std::io::Result<RunDir> {
        let pid = std::process::id();
        let dir = std::env::temp_dir().join(format!("xio-{name}-{pid}"));
        // Private, as the manager wants it whatever the umask.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&dir)?;
        std::env::set_var("XIO_RUN_DIR", &dir);
        Ok(RunDir { dir, pid })
    }
}

impl std::ops::Deref for RunDir {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.dir
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if std::process::id() == self.pid {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

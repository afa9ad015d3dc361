//! A directory of this test process's own that does not pile up.
//!
//! Test processes give themselves a run dir (or a scratch dir for built C
//! programs) named `<tmp>/<kind>-<pid>`; the test harness has no hook at
//! process exit, so each run left its dir behind (hundreds of them, some
//! of 24 MB). Instead, whoever makes a dir of a kind removes the dirs of
//! that kind whose process is gone. Shared by every crate's tests (with
//! `#[path]`: it needs nothing but std).
//!
//! Only dirs named exactly `<kind>-<digits>`, owned by this user, and
//! whose pid is not alive (no `/proc/<pid>`) are removed: other test
//! processes, of this run or of another checkout's, run meanwhile. A pid
//! reused since leaves a dead dir in place (until that process is gone
//! too); nothing is removed where `/proc` is not mounted. A test process
//! in another pid namespace sharing this `/tmp` is the one case not
//! guarded against: its pid means nothing here.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// `<tmp>/<kind>-<pid>` for this process, made if missing, after removing
/// the dirs of `kind` left by processes no longer alive.
pub fn process_dir(kind: &str) -> PathBuf {
    let tmp = std::env::temp_dir();
    let dir = tmp.join(format!("{kind}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    remove_dead(&tmp, kind, &dir);
    dir
}

fn remove_dead(tmp: &Path, kind: &str, own: &Path) {
    if !Path::new("/proc/self").exists() {
        return;
    }
    let Ok(me) = std::fs::metadata(own).map(|m| m.uid()) else {
        return;
    };
    let Ok(entries) = std::fs::read_dir(tmp) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(kind))
            .and_then(|n| n.strip_prefix('-'))
        else {
            continue;
        };
        if pid.is_empty() || !pid.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid == std::process::id() || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        // Not following a link; one of another user's is theirs.
        match std::fs::symlink_metadata(e.path()) {
            Ok(md) if md.is_dir() && md.uid() == me => {}
            _ => continue,
        }
        // Another process may be removing it too: errors are its work.
        let _ = std::fs::remove_dir_all(e.path());
    }
}

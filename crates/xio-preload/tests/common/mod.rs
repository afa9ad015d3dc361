//! What the preload tests share: the library's path, the run dir, waits.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

// The run dirs of test processes that are gone are removed, as xio-core's
// own suites do.
#[path = "../../../xio-core/tests/common/process_dir.rs"]
mod process_dir;

pub mod py;

/// A watchdog against hangs, not a performance bound.
pub const WATCHDOG: Duration = Duration::from_secs(60);

/// The library, built beside this test (`target/<profile>/`).
pub fn library() -> PathBuf {
    let exe = std::env::current_exe().expect("test path");
    let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
    let lib = dir.join("libxio_preload.so");
    let built = std::fs::metadata(&lib)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| {
            panic!(
                "{} not built: `cargo build -p xio-preload` first (scripts/test.sh does)",
                lib.display()
            )
        });
    // `cargo test` builds the crate's tests, not its cdylib: a library
    // older than its sources would test old code.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    for f in std::fs::read_dir(&src).unwrap() {
        let changed = f.unwrap().metadata().unwrap().modified().unwrap();
        assert!(
            changed <= built,
            "{} is older than its sources: `cargo build -p xio-preload` first",
            lib.display()
        );
    }
    lib
}

/// This test process's run dir (the manager's socket and lock), one for
/// all its tests, each with its own pool prefix; set before any manager
/// or child reads it.
pub fn run_dir() -> &'static PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let d = process_dir::process_dir("xio-preload-test");
        std::env::set_var("XIO_RUN_DIR", &d);
        d
    })
}

pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let start = Instant::now();
    while !cond() {
        assert!(start.elapsed() < WATCHDOG, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A port free on 127.0.0.1 now, for a server started next. Drawn below
/// the kernel's ephemeral range (32768 up), where no connect's own port
/// and no `bind(0)` can take it before the server binds it, and never the
/// same twice in this process (tests run in parallel).
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    // Spread by a hash of the pid: test binaries of other runs (with
    // neighbouring pids) may be drawing too.
    let base = std::process::id().wrapping_mul(2_654_435_761) % 10_000;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        assert!(n < 10_000, "no free port in 20000..30000");
        let port = 20_000 + ((base + n) % 10_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// `program` with pool `prefix` and this process's run dir, preloaded if
/// `preload` (and no `LD_PRELOAD` or scope inherited from the test's own
/// environment).
pub fn command(prefix: &str, program: &str, preload: bool) -> std::process::Command {
    let mut c = std::process::Command::new(program);
    c.env("XIO_PREFIX", prefix)
        .env("XIO_RUN_DIR", run_dir())
        .env_remove("LD_PRELOAD")
        .env_remove("XIO_PRELOAD");
    if preload {
        c.env("LD_PRELOAD", library());
    }
    c
}

/// The channels the stack of process `pid` has, in `mgr`'s view.
pub fn channels_of(mgr: &xio_core::manager::ManagerHandle, pid: u32) -> usize {
    let snap = mgr.snapshot();
    let Some(me) = snap.stacks.iter().find(|s| s.pid == pid).map(|s| s.id) else {
        return 0;
    };
    snap.channels
        .iter()
        .filter(|&&(_, a, b)| a == me || b == me)
        .count()
}

//! xio-core's std-parity scenarios, written against std's `TcpListener`
//! and `TcpStream`, run by a plain-TCP program (this test binary, started
//! again as a child) twice: over the kernel, and under
//! `LD_PRELOAD=libxio_preload.so` with a manager, where its loopback
//! connections move to X-IO. Each step must say the same in both runs
//! (`io::ErrorKind`s, byte counts, data), but for the differences pinned
//! in [`KNOWN`]; and every connection the preloaded run made must have
//! gone over X-IO (its fd a Unix socket pair's end, not a TCP socket).

mod common;
#[path = "../../xio-core/tests/common/parity.rs"]
mod parity;
#[macro_use]
#[path = "../../xio-core/tests/common/std_scenarios.rs"]
mod std_scenarios;

use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use xio_core::manager::Manager;

use common::{command, run_dir, WATCHDOG};

// (The scenarios' own timeouts.)
const _: Duration = WATCHDOG;
use std_scenarios::*;

/// Std's sockets, each connect noted: whether the preload moved it.
struct Checked;

static CONNECTED: AtomicUsize = AtomicUsize::new(0);
static MOVED: AtomicUsize = AtomicUsize::new(0);

/// Whether `s`'s fd is a Unix socket (a moved stream's), by its inode in
/// `/proc/net/unix`.
fn is_moved(s: &TcpStream) -> bool {
    let link = std::fs::read_link(format!("/proc/self/fd/{}", s.as_raw_fd())).unwrap();
    let link = link.to_string_lossy();
    let inode = link
        .strip_prefix("socket:[")
        .and_then(|l| l.strip_suffix(']'))
        .expect("a socket");
    std::fs::read_to_string("/proc/net/unix")
        .unwrap()
        .lines()
        .skip(1)
        .any(|l| l.split_whitespace().nth(6) == Some(inode))
}

fn note(r: io::Result<TcpStream>) -> io::Result<TcpStream> {
    if let Ok(s) = &r {
        CONNECTED.fetch_add(1, Ordering::Relaxed);
        if is_moved(s) {
            MOVED.fetch_add(1, Ordering::Relaxed);
        }
    }
    r
}

impl Family for Checked {
    type L = TcpListener;
    fn bind(&self, a: SocketAddr) -> io::Result<TcpListener> {
        Std.bind(a)
    }
    fn connect(&self, a: SocketAddr) -> io::Result<TcpStream> {
        note(Std.connect(a))
    }
    fn connect_timeout(&self, a: SocketAddr, t: Duration) -> io::Result<TcpStream> {
        note(Std.connect_timeout(a, t))
    }
    fn bind_any(&self, a: &[SocketAddr]) -> io::Result<TcpListener> {
        Std.bind_any(a)
    }
    fn connect_any(&self, a: &[SocketAddr]) -> io::Result<TcpStream> {
        note(Std.connect_any(a))
    }
}

macro_rules! run_named {
    ($($name:ident),* $(,)?) => {
        /// Runs scenario `name` over [`Checked`].
        fn run_named(name: &str, log: &mut Log) {
            match name {
                $(stringify!($name) => scenario::$name::<Checked>(&Checked, log),)*
                _ => panic!("no scenario {name}"),
            }
        }
    };
}

with_scenarios!(run_named);

/// The child's part: runs the scenario `XIO_PARITY_RUN` names and prints
/// its steps (in the parent's own run: nothing to do).
#[test]
fn child() {
    let Ok(name) = std::env::var("XIO_PARITY_RUN") else {
        return;
    };
    V6.set(std::env::var("XIO_PARITY_V6").as_deref() == Ok("1"));
    let mut log = Log::default();
    run_named(&name, &mut log);
    for (step, v) in &log.0 {
        println!("XIO-STEP\t{step}\t{v}");
    }
    println!(
        "XIO-MOVED\t{}\t{}",
        CONNECTED.load(Ordering::Relaxed),
        MOVED.load(Ordering::Relaxed)
    );
}

/// A step the preloaded program sees differently from the kernel's, on
/// purpose or as a documented limit: in scenario `scenario`, step `step`
/// gives `kernel` over TCP and `preloaded` under the library.
struct Known {
    scenario: &'static str,
    step: &'static str,
    kernel: &'static str,
    preloaded: &'static str,
}

const KNOWN: &[Known] = &[];

/// One run of scenario `name` in a child: its steps, and how many of its
/// connects succeeded and how many of those moved.
fn run_child(
    name: &str,
    v6: bool,
    preload: Option<&str>,
) -> (Vec<(&'static str, String)>, usize, usize) {
    let exe = std::env::current_exe().unwrap();
    let exe = exe.to_str().unwrap();
    let mut c = command(preload.unwrap_or("unused"), exe, preload.is_some());
    c.args(["--exact", "child", "--nocapture", "--test-threads=1"])
        .env("XIO_PARITY_RUN", name)
        .env("XIO_PARITY_V6", if v6 { "1" } else { "0" });
    let out = c.output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{name} (preloaded: {}): {}\n{text}",
        preload.is_some(),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut steps = Vec::new();
    let mut counts = (0, 0);
    for l in text.lines() {
        let f: Vec<&str> = l.splitn(3, '\t').collect();
        match f[..] {
            ["XIO-STEP", step, v] => {
                steps.push((&*Box::leak(step.to_owned().into_boxed_str()), v.to_owned()));
            }
            ["XIO-MOVED", c, m] => counts = (c.parse().unwrap(), m.parse().unwrap()),
            _ => {}
        }
    }
    (steps, counts.0, counts.1)
}

/// Runs `name` over the kernel and preloaded, and compares.
fn compare(name: &'static str, v6: bool) {
    if v6 && TcpListener::bind("[::1]:0").is_err() {
        eprintln!("{name}: skipped over IPv6: ::1 cannot be bound here");
        return;
    }
    let _ = run_dir();
    let (want, connected, moved) = run_child(name, v6, None);
    assert_eq!(moved, 0, "{name}: nothing moves without the library");
    let prefix = format!("par-{name}-{}-{}", u8::from(v6), std::process::id());
    let _mgr = Manager::builder(&prefix).spawn().unwrap();
    let (got, connected_x, moved_x) = run_child(name, v6, Some(&prefix));
    assert_eq!(connected, connected_x, "{name}: the same connects succeed");
    assert_eq!(moved_x, connected_x, "{name}: every connect went over X-IO");
    parity::judge(name, "kernel", &want, &got, |n, step| {
        KNOWN
            .iter()
            .find(|k| k.scenario == n && k.step == step)
            .map(|k| (k.kernel, k.preloaded))
    });
}

macro_rules! compared {
    ($($name:ident),* $(,)?) => {
        mod v4 {
            $(
                #[test]
                fn $name() {
                    super::compare(stringify!($name), false);
                }
            )*
        }
        mod v6 {
            $(
                #[test]
                fn $name() {
                    super::compare(stringify!($name), true);
                }
            )*
        }
    };
}

with_scenarios!(compared);

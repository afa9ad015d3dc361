//! The C ABI from C: the examples and `tests/c/api_test.c` are compiled
//! with the system C compiler (`-Wall -Wextra -Werror`, AddressSanitizer
//! where the compiler has it) against `include/xio.h` and libxio, through
//! the pkg-config file, and run as real processes against a manager; C
//! and Rust processes talk over the same pool.

#[path = "../../xio-core/tests/common/process_dir.rs"]
mod process_dir;

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::Receiver;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use xio_core::manager::{Manager, ManagerHandle};
use xio_core::net::Net;
use xio_core::stack::{Error, Stack};

/// Against hangs only; not a performance bound.
const WATCHDOG: Duration = Duration::from_secs(120);

fn run_dir() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        // Those of test processes gone are removed (24 MB each).
        let dir = process_dir::process_dir("xio-capi-test");
        // Fresh: an earlier test process with the same pid (another boot,
        // container or checkout) left its C programs here, and `build_with`
        // would run those, built from other sources against another
        // libxio.
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::create_dir_all(&dir).unwrap();
        // Before any thread of ours reads the environment.
        std::env::set_var("XIO_RUN_DIR", &dir);
        dir
    })
}

fn manager(test: &str) -> (ManagerHandle, String) {
    run_dir();
    let p = format!("c-{test}-{}", std::process::id());
    (Manager::builder(&p).spawn().unwrap(), p)
}

/// Where libxio is: next to this test's `deps/` directory. Cargo builds
/// only the rlib for integration tests, so the shared library is built
/// here (a no-op when it is up to date), never tested stale.
fn lib_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let exe = std::env::current_exe().unwrap();
        let dir = exe.parent().unwrap().parent().unwrap().to_path_buf();
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "--quiet", "-p", "xio-capi", "--lib"]);
        if dir.file_name().is_some_and(|n| n == "release") {
            cmd.arg("--release");
        }
        let st = cmd
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("running cargo to build libxio");
        assert!(st.success(), "building libxio failed");
        assert!(
            dir.join("libxio.so").exists(),
            "libxio.so not built in {}",
            dir.display()
        );
        dir
    })
    .clone()
}

/// The compile and link flags from our pkg-config file `pkg` (`xio` or
/// `xio-static`: its `.pc.in` filled in for this build tree, as
/// scripts/capi.sh does).
fn pkg_config_flags(pkg: &str) -> Vec<String> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let pc_dir = run_dir().join("pkgconfig");
    std::fs::create_dir_all(&pc_dir).unwrap();
    let lib = lib_dir();
    let pc = std::fs::read_to_string(crate_dir.join(format!("{pkg}.pc.in")))
        .unwrap()
        .replace("@PREFIX@", crate_dir.to_str().unwrap())
        .replace("@LIBDIR@", lib.to_str().unwrap())
        .replace("@INCLUDEDIR@", crate_dir.join("include").to_str().unwrap())
        .replace("@VERSION@", env!("CARGO_PKG_VERSION"));
    std::fs::write(pc_dir.join(format!("{pkg}.pc")), pc).unwrap();
    let out = Command::new("pkg-config")
        .args(["--cflags", "--libs", pkg])
        .env("PKG_CONFIG_PATH", &pc_dir)
        .output()
        .expect("pkg-config is installed (apt-get install pkg-config)");
    assert!(out.status.success(), "pkg-config: {out:?}");
    String::from_utf8(out.stdout)
        .unwrap()
        .split_whitespace()
        .map(str::to_owned)
        .collect()
}

fn cc() -> String {
    std::env::var("CC").unwrap_or_else(|_| "cc".into())
}

/// Whether the compiler can build and run an AddressSanitizer binary.
fn asan() -> bool {
    static ASAN: OnceLock<bool> = OnceLock::new();
    *ASAN.get_or_init(|| {
        let src = run_dir().join("asan_probe.c");
        let exe = run_dir().join("asan_probe");
        std::fs::write(&src, "int main(void) { return 0; }\n").unwrap();
        let built = Command::new(cc())
            .args(["-fsanitize=address", "-o"])
            .arg(&exe)
            .arg(&src)
            .status()
            .is_ok_and(|s| s.success());
        let ok = built && Command::new(&exe).status().is_ok_and(|s| s.success());
        if !ok {
            eprintln!("AddressSanitizer unavailable: C programs built without it");
        }
        ok
    })
}

/// Compiles one C program (once per test process) against libxio.so;
/// returns its path.
fn build(name: &str) -> PathBuf {
    build_with(name, "xio", name)
}

/// Compiles C program `name` linked through pkg-config package `pkg` as
/// `exe_name` (once per test process); returns its path.
fn build_with(name: &str, pkg: &str, exe_name: &str) -> PathBuf {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _g = LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let src = [
        crate_dir.join("examples").join(format!("{name}.c")),
        crate_dir.join("tests/c").join(format!("{name}.c")),
        // Written by the test itself (the README's program).
        run_dir().join(format!("{name}.c")),
    ]
    .into_iter()
    .find(|p| p.exists())
    .unwrap_or_else(|| panic!("no C source for {name}"));
    let exe = run_dir().join(exe_name);
    if exe.exists() {
        return exe;
    }
    let mut cmd = Command::new(cc());
    cmd.args(["-std=c11", "-O2", "-g", "-Wall", "-Wextra", "-Werror"]);
    if asan() {
        cmd.arg("-fsanitize=address");
    }
    cmd.arg("-o")
        .arg(&exe)
        .arg(&src)
        .args(pkg_config_flags(pkg));
    let out = cmd.output().expect("a C compiler (cc)");
    assert!(
        out.status.success(),
        "compiling {name}.c failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

/// A running C program; its `XIO:` lines are collected.
struct CProc {
    child: Child,
    lines: Receiver<String>,
    name: String,
}

impl CProc {
    fn spawn(name: &str, args: &[&str]) -> CProc {
        Self::spawn_exe(build(name), name, args)
    }

    /// Runs the already built `exe` (of program `name`).
    fn spawn_exe(exe: PathBuf, name: &str, args: &[&str]) -> CProc {
        let mut child = Command::new(exe)
            .args(args)
            .env("XIO_RUN_DIR", run_dir())
            // Leaks are checked; libxio's own process-wide state is freed
            // at exit by the OS like any library's.
            .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
            .stdout(Stdio::piped())
            .stdin(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let tag = name.to_owned();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                if line.starts_with("XIO:") {
                    let _ = tx.send(line);
                } else {
                    eprintln!("[{tag}] {line}");
                }
            }
        });
        CProc {
            child,
            lines: rx,
            name: name.into(),
        }
    }

    /// Waits for `XIO:<what>` and returns the rest of the line.
    fn expect(&mut self, what: &str) -> String {
        let deadline = Instant::now() + WATCHDOG;
        loop {
            match self
                .lines
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
            {
                Ok(l) => {
                    if let Some(rest) = l.strip_prefix(&format!("XIO:{what}")) {
                        return rest.trim().to_owned();
                    }
                }
                Err(_) => {
                    let _ = self.child.kill();
                    panic!(
                        "{} never said {what:?} (status {:?})",
                        self.name,
                        self.child.try_wait()
                    );
                }
            }
        }
    }

    fn wait_success(mut self) {
        let deadline = Instant::now() + WATCHDOG;
        loop {
            if let Some(st) = self.child.try_wait().unwrap() {
                assert!(st.success(), "{} failed: {st:?}", self.name);
                return;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("{} did not finish", self.name);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

impl Drop for CProc {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + WATCHDOG;
    while !cond() {
        assert!(Instant::now() < deadline, "watchdog: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn wait_pool_whole(mgr: &ManagerHandle) {
    wait_until("pool whole after every stack left", || {
        mgr.snapshot().stacks.is_empty() && mgr.pool_is_whole()
    });
}

/// `key=value` fields of a result line.
fn field(line: &str, key: &str) -> u64 {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(&format!("{key}=")))
        .unwrap_or_else(|| panic!("no {key} in {line:?}"))
        .parse()
        .unwrap()
}

#[test]
fn api_contract_from_c() {
    let (mgr, p) = manager("api");
    let mut t = CProc::spawn("api_test", &[&p]);
    t.expect("ok");
    t.wait_success();
    wait_pool_whole(&mgr);
}

/// Linked through `xio-static.pc`: the program carries libxio in itself
/// (no libxio.so among its needed libraries, no run path to one) and
/// passes the same API contract.
#[test]
fn a_c_program_linked_statically_passes_the_api_contract() {
    let (mgr, p) = manager("static");
    let exe = build_with("api_test", "xio-static", "api_test_static");
    let out = Command::new("readelf")
        .arg("-d")
        .arg(&exe)
        .output()
        .expect("readelf (binutils, installed with the C compiler)");
    assert!(out.status.success(), "readelf: {out:?}");
    let dynamic = String::from_utf8_lossy(&out.stdout);
    assert!(
        !dynamic.contains("libxio") && !dynamic.contains("RUNPATH") && !dynamic.contains("RPATH"),
        "linked against the shared libxio:\n{dynamic}"
    );
    let mut t = CProc::spawn_exe(exe, "api_test", &[&p]);
    t.expect("ok");
    t.wait_success();
    wait_pool_whole(&mgr);
}

/// The C program of docs/c.md, as a reader
/// copies it into `app.c`: it compiles through `xio.pc` (with every
/// warning on) and, run against the `l2fwd_echo` example the guide
/// starts as its peer, prints the echo and ends.
#[test]
fn the_readmes_c_program_builds_and_gets_its_echo() {
    let (mgr, p) = manager("readme");
    let readme = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/c.md");
    let readme = std::fs::read_to_string(readme).unwrap();
    let src = readme
        .split("```c\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("a ```c block in docs/c.md");
    // Its pool is "mypool"; this test's has a name of its own.
    assert!(
        src.contains("\"mypool\""),
        "the guide's program uses another pool"
    );
    let src = src.replace("\"mypool\"", &format!("{p:?}"));
    std::fs::write(run_dir().join("readme_app.c"), src).unwrap();
    let exe = build("readme_app");

    let mut nf = CProc::spawn("l2fwd_echo", &[&p, "10.0.0.1:7"]);
    nf.expect("ready");
    let mut app = Command::new(exe)
        .env("XIO_RUN_DIR", run_dir())
        .env("ASAN_OPTIONS", "detect_leaks=1:abort_on_error=0")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + WATCHDOG;
    let status = loop {
        if let Some(st) = app.try_wait().unwrap() {
            break st;
        }
        if Instant::now() > deadline {
            let _ = app.kill();
            let _ = app.wait();
            panic!("the guide's program did not finish");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut out = String::new();
    app.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    assert!(
        status.success(),
        "the guide's program failed: {status:?}, said {out:?}"
    );
    assert_eq!(out, "echoed: hello\n");

    // Its two sends (the message and the forwarded reply) reached the echo.
    // Counted as received, not echoed: the program closes its stack right
    // after the second send, and the echo of it meets a reset whenever the
    // close wins the race (the test failed that way about one run in six).
    let mut me = Stack::attach(&p).unwrap();
    let peer = me.connect("10.0.0.1:7".parse().unwrap()).unwrap();
    me.send_tagged(peer, 1, me.alloc(1).unwrap()).unwrap();
    assert_eq!(nf.expect("received"), "2");
    nf.wait_success();
    drop(me);
    wait_pool_whole(&mgr);
}

#[test]
fn c_packet_generator_against_c_echo_function() {
    let (mgr, p) = manager("zc");
    let mut nf = CProc::spawn("l2fwd_echo", &[&p, "10.8.0.1:9"]);
    nf.expect("ready");
    let mut gen = CProc::spawn("pktgen", &[&p, "10.8.0.1:9", "20000", "64", "--stop"]);
    let line = gen.expect("rtt");
    eprintln!("C pktgen -> C l2fwd_echo: {line}");
    assert_eq!(field(&line, "n"), 20000);
    gen.wait_success();
    // Every round trip (warm-up included) went through the function.
    assert_eq!(nf.expect("forwarded"), "21000");
    nf.wait_success();
    wait_pool_whole(&mgr);
}

#[test]
fn rust_client_against_c_echo_function() {
    let (mgr, p) = manager("rzc");
    let mut nf = CProc::spawn("l2fwd_echo", &[&p, "10.8.0.2:9"]);
    nf.expect("ready");
    let mut me = Stack::attach(&p).unwrap();
    let peer = me.connect("10.8.0.2:9".parse().unwrap()).unwrap();
    for i in 0..2000u32 {
        let len = 12 + (i as usize * 37) % 3000;
        let mut b = me.alloc(len).unwrap();
        b.set_len(len);
        for (k, x) in b.iter_mut().enumerate() {
            *x = (k as u32 ^ i) as u8;
        }
        let sent = b.to_vec();
        me.send(peer, b).unwrap();
        let m = me.recv_timeout(WATCHDOG).unwrap();
        assert_eq!(m.from, peer);
        assert_eq!(m.buf.len(), len);
        // The function swapped the two 6-byte addresses, nothing else.
        assert_eq!(&m.buf[..6], &sent[6..12]);
        assert_eq!(&m.buf[6..12], &sent[..6]);
        assert_eq!(&m.buf[12..], &sent[12..]);
    }
    me.send_tagged(peer, 1, me.alloc(1).unwrap()).unwrap();
    assert_eq!(nf.expect("forwarded"), "2000");
    nf.wait_success();
    drop(me);
    wait_pool_whole(&mgr);
}

#[test]
fn c_socket_clients_against_c_epoll_server() {
    let (mgr, p) = manager("sock");
    let mut srv = CProc::spawn("sock_echo_server", &[&p, "10.8.1.1:80", "4"]);
    srv.expect("ready");
    // Small messages, and ones that span pool buffers and the server's
    // 64 KiB output buffer (its back-pressure path).
    let mut clients: Vec<CProc> = [
        ("3000", "64"),
        ("3000", "1"),
        ("200", "100000"),
        ("50", "1000000"),
    ]
    .iter()
    .map(|(n, size)| CProc::spawn("sock_client", &[&p, "10.8.1.1:80", n, size]))
    .collect();
    for c in &mut clients {
        let line = c.expect("rtt");
        eprintln!("C sock_client -> C epoll server: {line}");
    }
    for c in clients {
        c.wait_success();
    }
    assert_eq!(srv.expect("served"), "4");
    srv.wait_success();
    wait_pool_whole(&mgr);
}

#[test]
fn rust_streams_against_c_server_and_c_client_against_rust_server() {
    let (mgr, p) = manager("mix");
    // Rust clients, C server.
    let mut srv = CProc::spawn("sock_echo_server", &[&p, "10.8.2.1:80", "8"]);
    srv.expect("ready");
    let net = Net::attach(&p).unwrap();
    let threads: Vec<_> = (0..8u8)
        .map(|t| {
            let net = net.clone();
            std::thread::spawn(move || {
                let mut s = net.connect("10.8.2.1:80").unwrap();
                for i in 0..300usize {
                    let msg: Vec<u8> = (0..1 + (i * 131) % 9000).map(|k| (k as u8) ^ t).collect();
                    s.write_all(&msg).unwrap();
                    let mut back = vec![0; msg.len()];
                    s.read_exact(&mut back).unwrap();
                    assert_eq!(back, msg);
                }
                s.shutdown(std::net::Shutdown::Write).unwrap();
                let mut rest = Vec::new();
                s.read_to_end(&mut rest).unwrap();
                assert!(rest.is_empty());
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(srv.expect("served"), "8");
    srv.wait_success();

    // A C client, Rust server (a thread per connection).
    let l = net.listen("10.8.2.2:80").unwrap();
    let server = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        let mut buf = vec![0; 65536];
        loop {
            let n = s.read(&mut buf).unwrap();
            if n == 0 {
                break;
            }
            s.write_all(&buf[..n]).unwrap();
        }
    });
    let mut c = CProc::spawn("sock_client", &[&p, "10.8.2.2:80", "2000", "300"]);
    eprintln!("C sock_client -> Rust server: {}", c.expect("rtt"));
    c.wait_success();
    server.join().unwrap();
    drop(net);
    wait_pool_whole(&mgr);
}

/// A C epoll loop asleep with no timeout learns that its manager stopped
/// through `xio_net_manager_fd` (see `tests/c/manager_fd_test.c`).
#[test]
fn an_idle_c_epoll_loop_learns_its_manager_stopped() {
    let (mgr, p) = manager("mgrfd");
    let mut t = CProc::spawn("manager_fd_test", &[&p]);
    t.expect("ready");
    mgr.stop();
    assert_eq!(
        t.expect("gone"),
        "1 0",
        "woken by the manager's fd, which is quiet afterwards"
    );
    t.wait_success();
}

#[test]
fn killed_c_process_is_reclaimed() {
    let (mgr, p) = manager("kill");
    let mut nf = CProc::spawn("l2fwd_echo", &[&p, "10.8.3.1:9", "--hold", "20"]);
    nf.expect("ready");
    let mut me = Stack::attach(&p).unwrap();
    let peer = me.connect("10.8.3.1:9".parse().unwrap()).unwrap();
    for _ in 0..30 {
        let mut b = me.alloc(64).unwrap();
        b.set_len(64);
        me.send(peer, b).unwrap();
    }
    assert_eq!(nf.expect("holding"), "20");
    // The function holds 20 buffers and echoes the other 10.
    for _ in 0..10 {
        me.recv_timeout(WATCHDOG).unwrap();
    }
    let held: u32 = mgr
        .usage()
        .iter()
        .map(|u| {
            u.by_owner
                .iter()
                .filter(|(o, _)| *o != me.id().slot())
                .map(|(_, n)| *n)
                .sum::<u32>()
        })
        .sum();
    assert!(held >= 20, "buffers the C process holds: {held}");
    nf.child.kill().unwrap(); // SIGKILL
    let _ = nf.child.wait();
    wait_until("manager noticed the death", || mgr.snapshot().deaths >= 1);
    let err = me.recv_timeout(WATCHDOG).unwrap_err();
    assert!(matches!(err, Error::Reset(q) if q == peer), "{err}");
    wait_until("only our stack holds buffers", || {
        mgr.usage()
            .iter()
            .all(|u| u.by_owner.iter().all(|(o, _)| *o == me.id().slot()))
    });
    assert!(mgr.snapshot().reclaimed >= 20, "{:?}", mgr.snapshot());
    drop(me);
    wait_pool_whole(&mgr);
}

//! Debian's redis-server, redis-cli and redis-benchmark, unmodified,
//! under `LD_PRELOAD=libxio_preload.so` with a real manager: redis's
//! event loop (epoll, non-blocking sockets, `accept`, `writev`) over
//! X-IO, kernel clients in the same epoll set, and kill -9 of either side.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Stdio};

use xio_core::manager::{Manager, ManagerHandle};

mod common;

use common::{channels_of, command, free_port, run_dir, wait_until};

struct Redis {
    mgr: ManagerHandle,
    prefix: String,
    port: u16,
    server: Child,
}

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// A preloaded redis-server on a free loopback port, answering.
fn start(test: &str) -> Redis {
    let dir = run_dir();
    let prefix = format!("redis-{test}-{}", std::process::id());
    let mgr = Manager::builder(&prefix).spawn().unwrap();
    let port = free_port();
    let server = command(&prefix, "redis-server", true)
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--dir", dir.to_str().unwrap()])
        // A snapshot of one test's server is not another's to load.
        .args(["--dbfilename", &format!("{test}.rdb")])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("redis-server (Debian's redis-server package)");
    let r = Redis {
        mgr,
        prefix,
        port,
        server,
    };
    wait_until("redis-server answering", || {
        cli(&r, false, &["ping"]).is_some_and(|o| o == "PONG")
    });
    r
}

/// One redis-cli command's answer, `None` if it failed.
fn cli(r: &Redis, preload: bool, args: &[&str]) -> Option<String> {
    let out = command(&r.prefix, "redis-cli", preload)
        .args(["-p", &r.port.to_string()])
        .args(args)
        .stderr(Stdio::null())
        .output()
        .expect("redis-cli (Debian's redis-tools package)");
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A Python client (inline commands over one connection kept open),
/// reading commands from its stdin and printing each reply on a line;
/// `CLOSED` or `RESET` when the server is gone.
const CLIENT: &str = r#"
import socket, sys
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
f = s.makefile("rb")
for line in sys.stdin:
    try:
        s.sendall(line.strip().encode() + b"\r\n")
        r = f.readline()
        if not r:
            print("CLOSED", flush=True)
            break
        if r.startswith(b"$") and not r.startswith(b"$-1"):
            r = f.read(int(r[1:]) + 2)
        print(r.decode().strip().lstrip("+:").replace("\n", " | "), flush=True)
    except (ConnectionResetError, BrokenPipeError):
        print("RESET", flush=True)
        break
"#;

/// A connection kept open by a Python client.
struct Session {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Session {
    fn open(r: &Redis, preload: bool) -> Session {
        let script = run_dir().join(format!("client-{}.py", r.port));
        std::fs::write(&script, CLIENT).unwrap();
        let mut child = command(&r.prefix, "python3", preload)
            .arg(&script)
            .arg(r.port.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = BufReader::new(child.stdout.take().unwrap());
        Session {
            child,
            stdin,
            stdout,
        }
    }

    fn ask(&mut self, cmd: &str) -> String {
        // A write to a client that has exited fails; its last line says why.
        let _ = writeln!(self.stdin, "{cmd}").and_then(|()| self.stdin.flush());
        let mut l = String::new();
        self.stdout.read_line(&mut l).unwrap();
        l.trim().to_owned()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// redis-cli over X-IO and over the kernel, at once, to one preloaded
/// redis-server: both kinds of connection live in redis's one epoll set.
#[test]
fn redis_serves_x_io_and_kernel_clients_from_one_event_loop() {
    let r = start("mixed");
    let mut x = Session::open(&r, true);
    assert_eq!(x.ask("SET greeting hello"), "OK");
    wait_until("the client's channel", || {
        channels_of(&r.mgr, r.server.id()) == 1
    });
    let mut k = Session::open(&r, false);
    assert_eq!(k.ask("GET greeting"), "hello");
    assert_eq!(k.ask("SET other 42"), "OK");
    assert_eq!(x.ask("GET other"), "42");
    // Redis sees the X-IO client at a loopback address, as over TCP
    // (its protected mode lets only those in).
    let list = x.ask("CLIENT LIST");
    assert!(list.contains("addr=127.0.0.1:"), "{list}");
    assert_eq!(
        channels_of(&r.mgr, r.server.id()),
        1,
        "the kernel client has no channel"
    );
}

/// redis-benchmark, preloaded, against the preloaded server: one client
/// and fifty, pipelined and not; every request answered (redis-benchmark
/// exits with an error otherwise), over X-IO (its stack registered with
/// the manager and the server's channels grew).
#[test]
fn redis_benchmark_runs_over_x_io() {
    let r = start("bench");
    for args in [
        &["-c", "1", "-n", "2000"][..],
        &["-c", "50", "-n", "20000"],
        &["-c", "50", "-n", "20000", "-P", "16"],
    ] {
        let before = r.mgr.snapshot().attaches;
        let out = command(&r.prefix, "redis-benchmark", true)
            .args(["-p", &r.port.to_string(), "-t", "set,get", "-q"])
            .args(args)
            .stderr(Stdio::inherit())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "redis-benchmark {args:?}: {}",
            out.status
        );
        let text = String::from_utf8_lossy(&out.stdout).replace('\r', "\n");
        assert!(
            text.contains("SET:") && text.contains("GET:"),
            "redis-benchmark {args:?} said: {text}"
        );
        assert!(
            r.mgr.snapshot().attaches > before,
            "redis-benchmark never attached to the pool"
        );
    }
    // Without `-r`, SET writes one key (`key:__rand_int__`).
    assert_eq!(cli(&r, true, &["DBSIZE"]).as_deref(), Some("1"));
    wait_until("every connection's channel gone quiet", || {
        r.mgr.snapshot().stacks.len() == 1
    });
}

/// A preloaded client killed with -9 mid-connection: redis-server goes on
/// serving others, and the dead client's buffers come back.
#[test]
fn a_killed_x_io_client_leaves_redis_serving() {
    let r = start("kill-client");
    let mut x = Session::open(&r, true);
    assert_eq!(x.ask("SET a 1"), "OK");
    x.child.kill().unwrap();
    x.child.wait().unwrap();
    wait_until("the pool whole", || r.mgr.pool_is_whole());
    assert_eq!(cli(&r, true, &["GET", "a"]).as_deref(), Some("1"));
}

/// A preloaded redis-server killed with -9 while a preloaded client is
/// connected: the client's next request finds the connection reset or
/// closed (no hang, no answer), and the pool is whole.
#[test]
fn a_killed_redis_server_resets_its_x_io_clients() {
    let mut r = start("kill-server");
    let mut x = Session::open(&r, true);
    assert_eq!(x.ask("SET a 1"), "OK");
    r.server.kill().unwrap();
    r.server.wait().unwrap();
    let after = x.ask("GET a");
    assert!(after == "RESET" || after == "CLOSED", "{after:?}");
    wait_until("the pool whole", || r.mgr.pool_is_whole());
}

/// A `BGSAVE` (redis forks a child that writes the snapshot and exits)
/// while an X-IO client is connected: the client's stream stays on X-IO
/// in redis (no relay thread is started; the child never uses it), the
/// snapshot is written, and the connection serves on after it.
#[test]
fn a_bgsave_fork_leaves_connected_clients_on_x_io() {
    let r = start("bgsave");
    let mut x = Session::open(&r, true);
    assert_eq!(x.ask("SET kept value"), "OK");
    wait_until("the client's channel", || {
        channels_of(&r.mgr, r.server.id()) == 1
    });
    assert_eq!(x.ask("BGSAVE"), "Background saving started");
    wait_until("the snapshot written", || {
        x.ask("INFO persistence")
            .split(" | ")
            .any(|l| l.trim() == "rdb_bgsave_in_progress:0")
            && x.ask("LASTSAVE") != "0"
    });
    assert_eq!(x.ask("GET kept"), "value");
    let threads: Vec<String> = std::fs::read_dir(format!("/proc/{}/task", r.server.id()))
        .unwrap()
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_owned())
        .collect();
    assert!(
        !threads.iter().any(|t| t.starts_with("xio-relay")),
        "the stream went through a relay: {threads:?}"
    );
    assert_eq!(channels_of(&r.mgr, r.server.id()), 1, "still over X-IO");
}

//! Debian's nginx, unmodified, under `LD_PRELOAD=libxio_preload.so` with
//! a real manager, in one process (`master_process off`) and as a master
//! with forked workers, with curl, wrk and h2load as clients: static
//! files checked byte for byte, HTTP/1.1 and h2c, a proxied upstream,
//! over X-IO (the manager shows nginx's channels) and over the kernel at
//! once.

use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};

use xio_core::manager::{Manager, ManagerHandle};

mod common;

use common::{channels_of, command, free_port, run_dir, wait_until};

struct Nginx {
    mgr: ManagerHandle,
    prefix: String,
    dir: PathBuf,
    http: u16,
    h2c: u16,
    server: Child,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM: a master stops its workers before it exits (SIGKILL
        // would leave them running). nginx's handler only sets a flag its
        // loop reads when epoll_wait returns (EINTR): a signal that came
        // while the library's wait was spinning went unnoticed until the
        // next timer (the keep-alive one, 300 s here, past the
        // watchdog), so a stop that does not come is a failure.
        // SAFETY: a signal to our child, by pid.
        unsafe { libc::kill(self.server.id() as i32, libc::SIGTERM) };
        let start = std::time::Instant::now();
        while self.server.try_wait().ok().flatten().is_none() {
            if start.elapsed() > common::WATCHDOG {
                let _ = self.server.kill();
                let _ = self.server.wait();
                if !std::thread::panicking() {
                    panic!("nginx did not stop on SIGTERM");
                }
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    }
}

/// A preloaded nginx serving `dir/html` on two free loopback ports (one
/// HTTP/1.1, one h2c), bound on X-IO too, in one process.
fn start(test: &str) -> Nginx {
    start_with(test, "master_process off;\nworker_processes 1;", "", None)
}

/// [`start`] with `procs` (the master and worker directives), `more` in
/// the HTTP server block, and user `allow` admitted to the pool besides
/// the test's. Returns once a process of nginx's (the one, or a worker)
/// has bound the HTTP port on X-IO.
fn start_with(test: &str, procs: &str, more: &str, allow: Option<u32>) -> Nginx {
    // The run dir first: the manager reads it as it starts.
    let dir = run_dir().join(format!("nginx-{test}"));
    let prefix = format!("nginx-{test}-{}", std::process::id());
    let mut b = Manager::builder(&prefix);
    if let Some(uid) = allow {
        b = b.allow_uid(uid);
    }
    let mgr = b.spawn().unwrap();
    std::fs::create_dir_all(dir.join("html")).unwrap();
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    std::fs::write(dir.join("html/index.html"), "hello from nginx\n").unwrap();
    let big: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("html/big.bin"), big).unwrap();
    let (http, h2c) = (free_port(), free_port());
    let conf = format!(
        "daemon off;\n{procs}\n\
         error_log {d}/logs/error.log info;\npid {d}/nginx.pid;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  access_log off;\n  sendfile on;\n  keepalive_timeout 300s;\n\
           client_body_temp_path {d}/tmp;\n\
           server {{\n    listen 127.0.0.1:{http};\n    listen 127.0.0.1:{h2c} http2;\n    root {d}/html;\n{more}\n  }}\n}}\n",
        d = dir.display()
    );
    std::fs::write(dir.join("nginx.conf"), conf).unwrap();
    let server = command(&prefix, "nginx", true)
        .arg("-c")
        .arg(dir.join("nginx.conf"))
        .arg("-p")
        .arg(&dir)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("nginx (Debian's nginx package)");
    let n = Nginx {
        mgr,
        prefix,
        dir,
        http,
        h2c,
        server,
    };
    wait_until("nginx bound on X-IO", || n.bound_by().is_some());
    n
}

impl Nginx {
    /// The process (of nginx's) holding its HTTP port on X-IO.
    fn bound_by(&self) -> Option<u32> {
        self.mgr
            .snapshot()
            .stacks
            .iter()
            .find(|s| s.addrs.iter().any(|a| a.port() == self.http))
            .map(|s| s.pid)
    }
}

/// curl's body for `path` into `out`; false if it failed.
fn curl(n: &Nginx, preload: bool, path: &str, out: &Path) -> bool {
    command(&n.prefix, "curl", preload)
        .args(["-s", "-f", "-o"])
        .arg(out)
        .arg(format!("http://127.0.0.1:{}{path}", n.http))
        .status()
        .expect("curl")
        .success()
}

/// curl over X-IO and over the kernel gets the same bytes from one nginx.
#[test]
fn nginx_serves_static_files_to_x_io_and_kernel_curl() {
    let n = start("static");
    for preload in [true, false] {
        for file in ["index.html", "big.bin"] {
            let out = n.dir.join(format!("got-{preload}-{file}"));
            assert!(curl(&n, preload, &format!("/{file}"), &out), "curl {file}");
            assert_eq!(
                std::fs::read(&out).unwrap(),
                std::fs::read(n.dir.join("html").join(file)).unwrap(),
                "{file} (preloaded curl: {preload})"
            );
        }
    }
}

/// wrk (HTTP/1.1 keep-alive) and h2load (h2c), preloaded, against the
/// preloaded nginx: every request answered, over X-IO channels.
#[test]
fn wrk_and_h2load_run_against_nginx_over_x_io() {
    let n = start("load");
    let wrk = command(&n.prefix, "wrk", true)
        .args(["-t1", "-c8", "-d2s"])
        .arg(format!("http://127.0.0.1:{}/", n.http))
        .stdout(Stdio::piped())
        .spawn()
        .expect("wrk (Debian's wrk package)");
    wait_until("wrk's connections on X-IO", || {
        channels_of(&n.mgr, n.server.id()) > 0
    });
    let out = wrk.wait_with_output_checked();
    assert!(out.contains("Requests/sec"), "{out}");
    assert!(
        !out.contains("Non-2xx") && !out.contains("Socket errors"),
        "{out}"
    );

    let out = command(&n.prefix, "h2load", true)
        .args(["-n", "2000", "-c", "4"])
        .arg(format!("http://127.0.0.1:{}/", n.h2c))
        .output()
        .expect("h2load (Debian's nghttp2-client package)");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}");
    assert!(
        text.contains("2000 succeeded, 0 failed, 0 errored"),
        "{text}"
    );
}

/// An upstream for nginx's `proxy_pass`: Python's `http.server` on
/// `port`, answering "upstream <path>".
const UPSTREAM: &str = r#"
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = ("upstream " + self.path).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"#;

/// The uid of user `nobody`, whom nginx's workers run as when its master
/// runs as root and the configuration names no `user`.
fn nobody() -> u32 {
    // SAFETY: a NUL-terminated name; the entry is read at once.
    let pw = unsafe { libc::getpwnam(c"nobody".as_ptr()) };
    assert!(!pw.is_null(), "no user nobody");
    // SAFETY: not null: getpwnam's entry.
    unsafe { (*pw).pw_uid }
}

/// nginx as it is deployed: a master that forks two workers. The worker
/// that binds the port on X-IO first serves X-IO's clients (the other is
/// kernel-only: X-IO lets one process bind an address), and proxies
/// `/up/` to a preloaded upstream over X-IO; kernel clients are served
/// too. A worker killed with -9 is replaced by the master, and the new
/// one takes the X-IO side over.
#[test]
fn nginx_master_with_workers_serves_and_proxies_over_x_io() {
    let up = free_port();
    let n = start_with(
        "workers",
        "master_process on;\nworker_processes 2;",
        &format!("    location /up/ {{ proxy_pass http://127.0.0.1:{up}/; }}"),
        // The workers run as `nobody` (the master as the test's user,
        // root in CI): the operator admits them to the pool.
        Some(nobody()),
    );
    let script = n.dir.join("upstream.py");
    std::fs::write(&script, UPSTREAM).unwrap();
    let upstream = Reaped(
        command(&n.prefix, "python3", true)
            .arg(&script)
            .arg(up.to_string())
            .spawn()
            .expect("python3"),
    );
    let upstream = &upstream.0;
    wait_until("the upstream bound on X-IO", || {
        n.mgr
            .snapshot()
            .stacks
            .iter()
            .any(|s| s.pid == upstream.id() && s.addrs.iter().any(|a| a.port() == up))
    });
    let worker = n.bound_by().unwrap();
    assert_ne!(worker, n.server.id(), "a worker binds, not the master");
    let check = |preload: bool, path: &str, want: &[u8]| {
        let out = n.dir.join("got");
        assert!(curl(&n, preload, path, &out), "curl {path}");
        assert_eq!(std::fs::read(&out).unwrap(), want, "{path}");
    };
    let index = std::fs::read(n.dir.join("html/index.html")).unwrap();
    for preload in [true, false] {
        check(preload, "/index.html", &index);
        check(preload, "/up/a?b=c", b"upstream /a?b=c");
    }
    // nginx keeps its upstream connections only with keepalive: the
    // channel from the worker to the upstream stays (X-IO keeps a channel
    // between two processes once made).
    assert!(channels_of(&n.mgr, upstream.id()) > 0, "proxied over X-IO");
    assert!(channels_of(&n.mgr, worker) > 0, "served over X-IO");

    // SAFETY: a signal to a child process of nginx's, by pid.
    assert_eq!(unsafe { libc::kill(worker as i32, libc::SIGKILL) }, 0);
    wait_until("another worker bound on X-IO", || {
        n.bound_by().is_some_and(|p| p != worker)
    });
    for preload in [true, false] {
        check(preload, "/index.html", &index);
        check(preload, "/up/after", b"upstream /after");
    }
    assert!(channels_of(&n.mgr, n.bound_by().unwrap()) > 0);
}

/// A child killed and reaped when dropped (a failing test leaves none).
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

trait WaitChecked {
    fn wait_with_output_checked(self) -> String;
}

impl WaitChecked for Child {
    fn wait_with_output_checked(self) -> String {
        let out = self.wait_with_output().unwrap();
        assert!(out.status.success(), "exit {}", out.status);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

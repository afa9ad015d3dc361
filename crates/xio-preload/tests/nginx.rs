//! Debian's nginx, unmodified, under `LD_PRELOAD=libxio_preload.so` with
//! a real manager (in one process: `master_process off`; its forked
//! workers are a later stage), with curl, wrk and h2load as clients:
//! static files checked byte for byte, HTTP/1.1 and h2c, over X-IO (the
//! manager shows nginx's channels) and over the kernel at once.

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
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// A preloaded nginx serving `dir/html` on two free loopback ports (one
/// HTTP/1.1, one h2c), bound on X-IO too.
fn start(test: &str) -> Nginx {
    // The run dir first: the manager reads it as it starts.
    let dir = run_dir().join(format!("nginx-{test}"));
    let prefix = format!("nginx-{test}-{}", std::process::id());
    let mgr = Manager::builder(&prefix).spawn().unwrap();
    std::fs::create_dir_all(dir.join("html")).unwrap();
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    std::fs::write(dir.join("html/index.html"), "hello from nginx\n").unwrap();
    let big: Vec<u8> = (0..300_000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(dir.join("html/big.bin"), big).unwrap();
    let (http, h2c) = (free_port(), free_port());
    let conf = format!(
        "daemon off;\nmaster_process off;\nworker_processes 1;\n\
         error_log {d}/logs/error.log info;\npid {d}/nginx.pid;\n\
         events {{ worker_connections 1024; }}\n\
         http {{\n  access_log off;\n  sendfile off;\n\
           client_body_temp_path {d}/tmp;\n\
           server {{\n    listen 127.0.0.1:{http};\n    listen 127.0.0.1:{h2c} http2;\n    root {d}/html;\n  }}\n}}\n",
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
    wait_until("nginx bound on X-IO", || {
        n.mgr
            .snapshot()
            .stacks
            .iter()
            .any(|s| s.pid == n.server.id() && s.addrs.iter().any(|a| a.port() == n.http))
    });
    n
}

/// curl's body for `path`, `None` if it failed.
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

//! `xio-manager --metrics`: Prometheus' text format over HTTP on a local
//! address, with the pool's use and the manager's counters as they are.

use std::io::{Read, Write};
use std::process::{Command, Stdio};

use xio_core::prelude::*;

mod support;

use support::{process_run_dir, wait_until, Reap, BIN};

/// One scrape: the whole response.
fn scrape(path: &std::path::Path) -> String {
    let mut c = std::os::unix::net::UnixStream::connect(path).unwrap();
    c.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    c.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn the_manager_serves_its_metrics_on_a_unix_socket() {
    let dir = process_run_dir("xio-metrics-test");
    let prefix = "metrics-test";
    let sock = dir.join(format!("{prefix}.sock"));
    let metrics = dir.join("metrics.sock");
    let m = Reap(
        Command::new(BIN)
            .args(["--prefix", prefix, "--class", "4K:64", "--class", "64K:8"])
            .arg("--metrics")
            .arg(format!("unix:{}", metrics.display()))
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    wait_until("manager socket", || sock.exists());
    let s = Stack::builder(prefix).name("probe").attach().unwrap();
    let held = s.alloc(1000).unwrap();
    // The manager publishes its counters at the end of the turn that
    // registered the stack, which may be after the attach returns.
    let mut out = String::new();
    wait_until("the stack in the metrics", || {
        out = scrape(&metrics);
        out.contains("xio_stacks 1")
    });
    assert!(out.starts_with("HTTP/1.1 200 OK\r\n"), "{out}");
    assert!(
        out.contains("Content-Type: text/plain; version=0.0.4"),
        "{out}"
    );
    let body = out.split("\r\n\r\n").nth(1).unwrap();
    for line in [
        "xio_pool_buffers{class=\"4096\"} 64",
        "xio_pool_buffers{class=\"65536\"} 8",
        "xio_pool_buffers_held{class=\"4096\",stack=\"1\"} 1",
        "xio_stacks 1",
        "xio_attaches_total 1",
        "# TYPE xio_attaches_total counter",
        "xio_stack_sleeps_total{stack=\"1\",name=\"probe\"}",
        // The default quota, half of each class, and what is charged.
        "xio_pool_quota{class=\"4096\"} 32",
        "xio_pool_buffers_charged{class=\"4096\",stack=\"1\"} 1",
        "xio_stack_pool_empty_total{stack=\"1\",name=\"probe\"} 0",
        "xio_stack_quota_full_total{stack=\"1\",name=\"probe\"} 0",
        "xio_stack_ring_full_total{stack=\"1\",name=\"probe\"} 0",
    ] {
        assert!(body.contains(line), "no {line:?} in:\n{body}");
    }
    // Every sample line is a name, optional labels and a number.
    for l in body.lines().filter(|l| !l.starts_with('#')) {
        let v = l.rsplit(' ').next().unwrap();
        assert!(v.parse::<f64>().is_ok(), "{l}");
    }
    drop(held);
    drop(s);
    wait_until("the stack's buffers back in the metrics", || {
        scrape(&metrics).contains("xio_pool_buffers_free{class=\"4096\"} 64")
    });
    m.signal(rustix::process::Signal::TERM);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn metrics_on_an_address_other_nodes_reach_are_refused() {
    // The run dir for the child alone: the other test set this process's.
    let dir = std::env::temp_dir().join(format!("xio-metrics-refused-{}", std::process::id()));
    let out = Command::new(BIN)
        .args(["--prefix", "metrics-refused", "--metrics", "192.0.2.1:9464"])
        .env("XIO_RUN_DIR", &dir)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a loopback address"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

//! The Rust examples of the guides (docs/zero-copy.md, docs/sockets.md,
//! docs/http.md), as a reader copies them: every paragraph of every
//! ```rust block there is in this file word for word
//! (`readme_examples_are_the_ones_here` checks), so they compile, and
//! those that run on their own are run, each in a child process of this
//! test binary with a run dir of its own (they use the process-wide pool
//! and fixed addresses, as the guides do), against an embedded manager
//! of the guides' pool, "mypool".

#[path = "../../xio-core/tests/common/process_dir.rs"]
mod process_dir;

use std::error::Error;
use std::time::{Duration, Instant};

type R = Result<(), Box<dyn Error + Send + Sync>>;

/// Against hangs only; not a performance bound.
const WATCHDOG: Duration = Duration::from_secs(120);

/// "Using it": the zero-copy interface, against an echo at 10.0.0.2:80.
fn using_it() -> R {
    use xio_core::prelude::*;

    let mut stack = Stack::attach("mypool")?; // register, map the pool
    stack.bind("10.0.0.1:80".parse()?)?; // be reachable at an address
    let peer = stack.connect("10.0.0.2:80".parse()?)?; // channel to another service

    let mut buf = stack.alloc(1500)?; // a pool buffer, yours alone
    buf.copy_from(b"hello");
    stack.send(peer, buf)?; // the buffer moves; bytes stay put

    let msg = stack.recv()?; // adaptive wait by default
    let reply = msg.buf.into_mut(); // modify and forward in place
    stack.send(msg.from, reply)?;
    Ok(())
}

/// "Sockets".
fn sockets() -> R {
    use std::io::{Read, Write};
    use xio_core::net::{XioListener, XioStream};

    // The process-wide pool is $XIO_PREFIX (default "xio"); for another,
    // let net = xio_core::net::Net::attach("mypool")?; then net.listen(..), net.connect(..).
    let listener = XioListener::bind("10.0.0.1:80")?;
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let mut s = s.unwrap();
            let mut req = [0u8; 5];
            s.read_exact(&mut req).unwrap();
            s.write_all(b"world").unwrap();
        }
    });
    let mut s = XioStream::connect("10.0.0.1:80")?;
    s.write_all(b"hello")?;

    // Zero-copy on the same stream: send a pool buffer, receive one.
    let mut buf = s.alloc(1500)?;
    buf.copy_from(b"again"); // the payload is these 5 bytes
    s.send_buf(buf).map_err(|(e, _)| e)?;
    let reply = s.recv_buf()?; // Some(Buf), or None at end of stream

    assert_eq!(reply.as_deref(), Some(&b"world"[..]));
    Ok(())
}

/// "Async (tokio)".
async fn tokio_example() -> R {
    use tokio::io::AsyncWriteExt;
    use xio_tokio::{XioListener, XioStream};

    let listener = XioListener::bind("10.0.0.1:80").await?; // in the server
    let mut c = XioStream::connect("10.0.0.1:80").await?; // in a client
    c.write_all(b"hello").await?;
    let (s, _peer) = listener.accept().await?; // in the server
    let body = s.recv_bytes().await?; // Some(Bytes): a pool buffer, no copy; None at end of stream

    assert_eq!(body.as_deref(), Some(&b"hello"[..]));
    Ok(())
}

/// "HTTP (hyper, axum)": the server part.
async fn http_server(app: axum::Router) -> R {
    // Server: axum unchanged but for the listener (0.0.0.0 answers for
    // 127.0.0.1, localhost and this node's addresses, as with TCP).
    let listener = xio_tokio::XioListener::bind("0.0.0.0:3000").await?;
    axum::serve(listener, app).await?;
    // Only X-IO clients reach it (the connector below, XioStream, xio.h), not
    // curl, a browser or another machine: for those serve the same app on a
    // tokio TcpListener too (the axum example below does both at once).
    Ok(())
}

/// "HTTP (hyper, axum)": the client part, against `http_server`.
async fn http_example() -> R {
    // Cargo.toml: axum 0.8, xio-tokio = { features = ["axum"] }, xio-hyper,
    // and for the client hyper-util = { features = ["client-legacy", "http1",
    // "tokio"] }, http-body-util, bytes. The xio crates are not on crates.io:
    // depend on this repository by path (or git), e.g.
    // xio-hyper = { path = "../xio/crates/xio-hyper" }.
    use bytes::Bytes;
    use http_body_util::Full;
    use hyper_util::{client::legacy::Client, rt::TokioExecutor};

    let app = axum::Router::new().route("/hello", axum::routing::get(|| async { "hi" }));
    tokio::spawn(http_server(app));
    // The test's own wait (not in the guide): the client below must not
    // dial before the spawned server has bound its address.
    // A server that never binds still fails below, with the client's error
    // (before the parent's watchdog ends this process).
    let deadline = Instant::now() + WATCHDOG / 2;
    while Instant::now() < deadline {
        if xio_tokio::XioStream::connect("127.0.0.1:3000")
            .await
            .is_ok()
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }

    // Client: hyper-util's client with the X-IO connector.
    let client = Client::builder(TokioExecutor::new())
        .build::<_, Full<Bytes>>(xio_hyper::XioConnector::new()?.with_tcp_fallback());
    let resp = client.get("http://127.0.0.1:3000/hello".parse()?).await?;

    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.extensions().get::<xio_hyper::Transport>(),
        Some(&xio_hyper::Transport::Xio)
    );
    Ok(())
}

/// "HTTP (hyper, axum)": tonic's server (compiled, not run: tests/grpc.rs
/// runs a whole service this way).
#[allow(dead_code)]
async fn tonic_server<S>(svc: S) -> R
where
    S: tonic::codegen::Service<
            http::Request<tonic::body::Body>,
            Response = http::Response<tonic::body::Body>,
            Error = std::convert::Infallible,
        > + tonic::server::NamedService
        + Clone
        + Send
        + Sync
        + 'static,
    S::Future: Send + 'static,
{
    // Server: instead of `.serve(addr)`.
    let listener = xio_hyper::XioListener::bind("127.0.0.1:50051").await?;
    tonic::transport::Server::builder()
        .add_service(svc)
        .serve_with_incoming(xio_hyper::incoming(listener))
        .await?;
    Ok(())
}

/// "HTTP (hyper, axum)": tonic's client (compiled, not run).
#[allow(dead_code)]
async fn tonic_client() -> R {
    // Client: instead of `.connect()` (`XioConnector::or_tcp()` to fall back).
    let channel = tonic::transport::Endpoint::from_static("http://127.0.0.1:50051")
        .connect_with_connector(xio_hyper::XioConnector::new()?)
        .await?;
    drop(channel);
    Ok(())
}

/// The words of `s`, one space apart: a guide's paragraph is indented
/// here, and rustfmt aligns its trailing comments its own way.
fn words(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The guides whose ```rust blocks are here.
const GUIDES: [&str; 3] = ["docs/zero-copy.md", "docs/sockets.md", "docs/http.md"];

#[test]
fn readme_examples_are_the_ones_here() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let here = words(include_str!("readme.rs"));
    let mut blocks = Vec::new();
    for guide in GUIDES {
        let text = std::fs::read_to_string(root.join(guide)).unwrap();
        for b in text.split("```rust\n").skip(1) {
            blocks.push((guide, b.split("```").next().unwrap().to_string()));
        }
    }
    assert!(
        blocks.len() >= 5,
        "the guides have fewer ```rust blocks than they had"
    );
    for (guide, block) in blocks {
        for para in block.split("\n\n").filter(|p| !p.trim().is_empty()) {
            assert!(
                here.contains(words(para).as_str()),
                "this {guide} example is not in tests/readme.rs (copy it here, \
                 so that it is compiled and run):\n{para}"
            );
        }
    }
}

/// In a child process (`XIO_README_EXAMPLE` set by `readme_examples_run`):
/// runs one example.
#[test]
fn child() {
    let Ok(example) = std::env::var("XIO_README_EXAMPLE") else {
        return;
    };
    let _manager = xio_core::Manager::builder("mypool").spawn().unwrap();
    let rt = || tokio::runtime::Runtime::new().unwrap();
    let done = match example.as_str() {
        "using_it" => {
            // The peer the example connects to: it echoes what it gets.
            let mut echo = xio_core::Stack::attach("mypool").unwrap();
            echo.bind("10.0.0.2:80".parse().unwrap()).unwrap();
            std::thread::spawn(move || {
                while let Ok(m) = echo.recv() {
                    let _ = echo.send(m.from, m.buf.into_mut());
                }
            });
            using_it()
        }
        "sockets" => sockets(),
        "tokio" => rt().block_on(tokio_example()),
        "http" => rt().block_on(http_example()),
        other => panic!("no example {other}"),
    };
    done.unwrap();
    println!("README example ok");
}

#[test]
fn readme_examples_run() {
    let dir = process_dir::process_dir("xio-readme-test");
    for example in ["using_it", "sockets", "tokio", "http"] {
        let run_dir = dir.join(example);
        std::fs::create_dir_all(&run_dir).unwrap();
        let mut child = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "child",
                "--nocapture",
                "--test-threads=1",
                "--quiet",
            ])
            .env("XIO_README_EXAMPLE", example)
            .env("XIO_RUN_DIR", &run_dir)
            .env("XIO_PREFIX", "mypool")
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + WATCHDOG;
        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                panic!("the guides' {example} example did not finish");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let mut out = String::new();
        std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
        assert!(
            status.success() && out.contains("README example ok"),
            "the guides' {example} example failed ({status:?}):\n{out}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

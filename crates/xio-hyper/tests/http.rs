//! HTTP over X-IO with only the transport swapped: an axum app, hyper
//! clients and servers in HTTP/1.1 and h2c, the TCP fallback, and a server
//! process that dies mid-request.

#[path = "../../xio-core/tests/common/process_dir.rs"]
mod process_dir;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use xio_core::manager::{Manager, ManagerHandle};
use xio_hyper::{Net, Protocol, Shutdown, XioConnector, XioListener};

/// Generous: a guard against hangs, not a performance bound.
const WATCHDOG: Duration = Duration::from_secs(120);

fn setup(test: &str) -> (ManagerHandle, String) {
    let p = test_prefix(test);
    let mgr = Manager::builder(&p).spawn().unwrap();
    (mgr, p)
}

/// The test's pool prefix, in this test process's own run directory.
fn test_prefix(test: &str) -> String {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("XIO_CHILD_ROLE").is_none() {
            let dir = process_dir::process_dir("xio-hyper-test");
            std::env::set_var("XIO_RUN_DIR", &dir);
        }
    });
    format!("th-{test}-{}", std::process::id())
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
struct Item {
    id: u32,
    name: String,
}

fn app() -> axum::Router {
    use axum::extract::{DefaultBodyLimit, Path};
    use axum::routing::{get, post};
    axum::Router::new()
        .route("/hello", get(|| async { "hello over X-IO" }))
        .route(
            "/items/{id}",
            get(|Path(id): Path<u32>| async move {
                axum::Json(Item {
                    id,
                    name: format!("item {id}"),
                })
            }),
        )
        .route(
            "/items",
            post(|axum::Json(mut it): axum::Json<Item>| async move {
                it.name = it.name.to_uppercase();
                axum::Json(it)
            }),
        )
        .route(
            "/stream",
            get(|| async {
                let chunks =
                    (0..100u32).map(|i| Ok::<_, Infallible>(Bytes::from(format!("chunk {i}\n"))));
                axum::body::Body::from_stream(futures_util::stream::iter(chunks))
            }),
        )
        .route(
            "/upload",
            post(|body: Bytes| async move {
                let sum: u64 = body.iter().map(|&b| u64::from(b)).sum();
                format!("{} {sum}", body.len())
            }),
        )
        .layer(DefaultBodyLimit::max(64 << 20))
}

type Body = Full<Bytes>;

fn client(net: &Net) -> Client<XioConnector, Body> {
    Client::builder(TokioExecutor::new()).build(XioConnector::with_net(net.clone()))
}

async fn body_string(r: http::Response<hyper::body::Incoming>) -> String {
    let b = r.into_body().collect().await.unwrap().to_bytes();
    String::from_utf8(b.to_vec()).unwrap()
}

/// `ConnectInfo<SocketAddr>` over X-IO: axum's own `Connected` impl is for
/// its `TcpListener` only, and its generic one covers any listener behind
/// `tap_io`, as xio-tokio's docs say; the handler sees the client's X-IO
/// address.
#[test]
fn axum_connect_info_through_a_tapped_listener() {
    use axum::extract::ConnectInfo;
    use axum::serve::ListenerExt;
    use std::net::SocketAddr;
    let (_mgr, p) = setup("axumci");
    rt().block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "10.5.0.9:80").unwrap();
        let app = axum::Router::new().route(
            "/who",
            axum::routing::get(
                |ConnectInfo(a): ConnectInfo<SocketAddr>| async move { a.to_string() },
            ),
        );
        let server = tokio::spawn(async move {
            axum::serve(
                l.tap_io(|_| {}),
                app.into_make_service_with_connect_info::<SocketAddr>(),
            )
            .await
        });
        let r = tokio::time::timeout(
            WATCHDOG,
            client(&cli).get("http://10.5.0.9/who".parse().unwrap()),
        )
        .await
        .unwrap()
        .unwrap();
        assert_eq!(r.status(), 200);
        let who: SocketAddr = body_string(r).await.parse().unwrap();
        // The client's address: the one an X-IO dial is given, not the
        // listener's.
        assert_ne!(who, "10.5.0.9:80".parse::<SocketAddr>().unwrap());
        assert_ne!(who.port(), 0, "{who}");
        server.abort();
    });
}

#[test]
fn axum_app_with_only_the_listener_swapped() {
    let (_mgr, p) = setup("axum");
    rt().block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "10.5.0.1:80").unwrap();
        let server = tokio::spawn(async move { axum::serve(l, app()).await });
        let c = client(&cli);
        let r = c
            .get("http://10.5.0.1:80/hello".parse().unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(body_string(r).await, "hello over X-IO");

        let r = c
            .get("http://10.5.0.1/items/7".parse().unwrap())
            .await
            .unwrap();
        let it: Item = serde_json::from_str(&body_string(r).await).unwrap();
        assert_eq!(
            it,
            Item {
                id: 7,
                name: "item 7".into()
            }
        );

        let req = http::Request::post("http://10.5.0.1/items")
            .header("content-type", "application/json")
            .body(Full::from(
                serde_json::to_vec(&Item {
                    id: 1,
                    name: "abc".into(),
                })
                .unwrap(),
            ))
            .unwrap();
        let r = c.request(req).await.unwrap();
        let it: Item = serde_json::from_str(&body_string(r).await).unwrap();
        assert_eq!(it.name, "ABC");

        let r = c
            .get("http://10.5.0.1/stream".parse().unwrap())
            .await
            .unwrap();
        let text = body_string(r).await;
        assert_eq!(text.lines().count(), 100);
        assert!(text.ends_with("chunk 99\n"));

        // A 10 MiB upload, checksummed.
        let big: Vec<u8> = (0..10u64 << 20).map(|i| (i * 31 % 251) as u8).collect();
        let sum: u64 = big.iter().map(|&b| u64::from(b)).sum();
        let req = http::Request::post("http://10.5.0.1/upload")
            .body(Full::from(big))
            .unwrap();
        let r = c.request(req).await.unwrap();
        assert_eq!(body_string(r).await, format!("{} {sum}", 10u64 << 20));

        let r = c
            .get("http://10.5.0.1/nope".parse().unwrap())
            .await
            .unwrap();
        assert_eq!(r.status(), 404);
        server.abort();
    });
}

async fn echo(
    req: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<Body>, Infallible> {
    let v = req.version();
    let b = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let mut r = http::Response::new(Full::from(b));
    r.headers_mut()
        .insert("x-version", format!("{v:?}").parse().unwrap());
    Ok(r)
}

fn hyper_256_concurrent(protocol: Protocol, h2: bool, port: u16) {
    let (_mgr, p) = setup(if h2 { "h2c" } else { "h1" });
    rt().block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, ("10.5.0.2", port)).unwrap();
        let stop = Shutdown::new();
        let server = tokio::spawn(xio_hyper::serve(
            l,
            hyper::service::service_fn(echo),
            protocol,
            stop.clone(),
        ));
        let c: Client<XioConnector, Body> = Client::builder(TokioExecutor::new())
            .http2_only(h2)
            .build(XioConnector::with_net(cli.clone()));
        let tasks: Vec<_> = (0..256u32)
            .map(|i| {
                let c = c.clone();
                tokio::spawn(async move {
                    let body = format!("request {i} ").repeat(1 + (i as usize % 50));
                    let req = http::Request::post(format!("http://10.5.0.2:{port}/echo"))
                        .body(Full::from(body.clone()))
                        .unwrap();
                    let r = c.request(req).await.unwrap();
                    let want = if h2 { "HTTP/2.0" } else { "HTTP/1.1" };
                    assert_eq!(r.headers()["x-version"], want);
                    assert_eq!(body_string(r).await, body);
                })
            })
            .collect();
        tokio::time::timeout(WATCHDOG, async {
            for t in tasks {
                t.await.unwrap();
            }
        })
        .await
        .expect("watchdog");
        drop(c);
        stop.shutdown();
        tokio::time::timeout(WATCHDOG, server)
            .await
            .expect("graceful shutdown finishes")
            .unwrap()
            .unwrap();
    });
}

#[test]
fn hyper_http1_256_concurrent_requests() {
    hyper_256_concurrent(Protocol::Http1, false, 81);
}

#[test]
fn hyper_h2c_256_concurrent_requests_auto_detected() {
    hyper_256_concurrent(Protocol::Auto, true, 82);
}

/// A plain hyper echo server over TCP on 127.0.0.1; its address.
async fn tcp_echo_server() -> std::net::SocketAddr {
    let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = tcp.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (s, _) = tcp.accept().await.unwrap();
            tokio::spawn(
                hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(
                        hyper_util::rt::TokioIo::new(s),
                        hyper::service::service_fn(echo),
                    )
                    .into_owned(),
            );
        }
    });
    addr
}

#[test]
fn tcp_fallback_when_no_xio_listener_on_this_node() {
    let (_mgr, p) = setup("fallback");
    rt().block_on(async {
        // A plain TCP hyper server (the service "moved to another node").
        let addr = tcp_echo_server().await;
        let cli = Net::attach(&p).unwrap();
        let uri: http::Uri = format!("http://{addr}/x").parse().unwrap();
        // Without fallback: refused (nobody binds it in X-IO).
        let strict: Client<XioConnector, Body> =
            Client::builder(TokioExecutor::new()).build(XioConnector::with_net(cli.clone()));
        assert!(strict.get(uri.clone()).await.is_err());
        // With fallback: over TCP.
        let c: Client<XioConnector, Body> = Client::builder(TokioExecutor::new())
            .build(XioConnector::with_net(cli.clone()).with_tcp_fallback());
        let req = http::Request::post(uri)
            .body(Full::from("via tcp"))
            .unwrap();
        let r = c.request(req).await.unwrap();
        // What hyper's `HttpConnector` tells of a TCP connection (its
        // users read the peer's address there), as well as the transport.
        let info = r
            .extensions()
            .get::<hyper_util::client::legacy::connect::HttpInfo>()
            .expect("HttpInfo over TCP");
        assert_eq!(info.remote_addr(), addr);
        assert_ne!(info.local_addr().port(), 0);
        assert_eq!(
            r.extensions().get::<xio_hyper::Transport>(),
            Some(&xio_hyper::Transport::Tcp)
        );
        assert_eq!(body_string(r).await, "via tcp");
    });
}

/// The fallback's TCP dial is limited as `HttpConnector`'s is, when asked
/// to: an address that never answers the SYN fails the connect with
/// `TimedOut`, not after the kernel's two minutes of retries. A listener
/// whose accept queue is full drops SYNs (Linux), so it stands in for
/// one. (Not an unroutable address such as 10.255.255.1: depending on
/// the network it is refused at once as unreachable, or even accepted by
/// a transparent proxy.)
#[test]
fn the_tcp_fallback_gives_up_after_its_connect_timeout() {
    let (_mgr, p) = setup("connect-timeout");
    rt().block_on(async {
        let cli = Net::attach(&p).unwrap();
        let mut connector = XioConnector::with_net(cli)
            .with_tcp_fallback()
            .connect_timeout(Some(Duration::from_millis(50)));
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let full = sock.listen(0).unwrap();
        let uri: http::Uri = format!("http://{}/x", full.local_addr().unwrap())
            .parse()
            .unwrap();
        // Dials that fit the queue connect (and keep their place in it);
        // the first that does not times out.
        let mut held = Vec::new();
        let e = tokio::time::timeout(WATCHDOG, async {
            loop {
                match tower_service::Service::call(&mut connector, uri.clone()).await {
                    Ok(c) => {
                        assert!(!c.is_xio());
                        held.push(c);
                        assert!(held.len() < 1000, "the accept queue never filled");
                    }
                    Err(e) => break e,
                }
            }
        })
        .await
        .expect("watchdog: a dial to a full accept queue ignored its timeout");
        assert_eq!(e.kind(), std::io::ErrorKind::TimedOut, "{e}");
        drop(full);
    });
}

/// The same binary on a node with no X-IO manager at all: a connector
/// built with `or_tcp` builds, and dials TCP.
#[test]
fn or_tcp_dials_tcp_where_no_manager_runs() {
    // This process's run directory is its own, and nothing here starts a
    // manager for the process-wide pool's prefix.
    let _ = setup("nomanager");
    assert!(Net::global().is_err(), "a manager runs for the global pool");
    assert!(XioConnector::new().is_err());
    rt().block_on(async {
        let addr = tcp_echo_server().await;
        let uri: http::Uri = format!("http://{addr}/x").parse().unwrap();
        let mut connector = XioConnector::or_tcp();
        let conn = tower_service::Service::call(&mut connector, uri.clone())
            .await
            .unwrap();
        assert!(!conn.is_xio());
        let c: Client<XioConnector, Body> =
            Client::builder(TokioExecutor::new()).build(XioConnector::or_tcp());
        let req = http::Request::post(uri)
            .body(Full::from("no manager here"))
            .unwrap();
        let r = c.request(req).await.unwrap();
        assert_eq!(body_string(r).await, "no manager here");

        // `lazy` builds too; each connection is refused while no manager
        // runs, and goes over X-IO once one does.
        let mut lazy = XioConnector::lazy();
        let xio_uri: http::Uri = "http://10.5.0.9:80/".parse().unwrap();
        let e = tower_service::Service::call(&mut lazy, xio_uri.clone())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        assert!(e.to_string().contains("xio-manager --prefix"), "{e}");
        let _global = Manager::builder(&xio_core::paths::default_prefix())
            .spawn()
            .unwrap();
        let _l = XioListener::bind("10.5.0.9:80").await.unwrap();
        let conn = tower_service::Service::call(&mut lazy, xio_uri)
            .await
            .unwrap();
        assert!(conn.is_xio());
    });
}

/// The child of `server_dying_mid_request_gives_an_error`: a blocking X-IO
/// server that reads a request and never answers.
#[test]
fn child_main() {
    let Ok(role) = std::env::var("XIO_CHILD_ROLE") else {
        return;
    };
    assert_eq!(role, "silent");
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let net = Net::attach(&std::env::var("XIO_CHILD_PREFIX").unwrap()).unwrap();
    let l = net.listen("10.5.0.3:80").unwrap();
    println!("ready");
    use std::io::{Read, Write};
    std::io::stdout().flush().unwrap();
    let (mut s, _) = l.accept().unwrap();
    let mut b = [0u8; 4096];
    let _ = s.read(&mut b);
    println!("got");
    std::io::stdout().flush().unwrap();
    loop {
        std::thread::park();
    }
}

#[test]
fn server_dying_mid_request_gives_an_error() {
    let (_mgr, p) = setup("dying");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_main",
            "--nocapture",
            "--test-threads=1",
            "--quiet",
        ])
        .env("XIO_CHILD_ROLE", "silent")
        .env("XIO_CHILD_PREFIX", &p)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let out = std::io::BufRead::lines(std::io::BufReader::new(child.stdout.take().unwrap()));
    let mut out = out.map_while(Result::ok);
    assert!(out.any(|l| l == "ready"));
    rt().block_on(async {
        let cli = Net::attach(&p).unwrap();
        let c = client(&cli);
        let req = c.get("http://10.5.0.3/slow".parse().unwrap());
        let pending = tokio::spawn(req);
        // Once the server has the request, it dies.
        let waited = tokio::task::spawn_blocking(move || {
            assert!(out.any(|l| l == "got"));
            child.kill().unwrap();
            child.wait().unwrap();
        });
        waited.await.unwrap();
        let r = tokio::time::timeout(WATCHDOG, pending)
            .await
            .expect("an error, not a hang")
            .unwrap();
        assert!(r.is_err(), "the request must fail: {r:?}");
    });
}

/// The tutorials' server address and client URL: a service on
/// `0.0.0.0:3000` reached at `http://localhost:3000` over X-IO, whatever
/// order the name's addresses come in (`::1` first on many systems).
#[test]
fn localhost_reaches_a_wildcard_server() {
    let (_mgr, p) = setup("localhost");
    rt().block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::bind_with(&srv, "0.0.0.0:3000").unwrap();
        let stop = Shutdown::new();
        let server = tokio::spawn(xio_hyper::serve(
            l,
            hyper::service::service_fn(echo),
            Protocol::Auto,
            stop.clone(),
        ));
        let c = client(&cli);
        for uri in ["http://localhost:3000/a", "http://127.0.0.1:3000/b"] {
            let req = http::Request::post(uri).body(Full::from(uri)).unwrap();
            let r = c.request(req).await.unwrap();
            assert_eq!(
                r.extensions().get::<xio_hyper::Transport>(),
                Some(&xio_hyper::Transport::Xio)
            );
            assert_eq!(body_string(r).await, uri);
        }
        drop(c);
        stop.shutdown();
        tokio::time::timeout(WATCHDOG, server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    });
}

/// One service on X-IO and TCP at once: peers on this node come over
/// shared memory, the others over TCP, and a fallback client reaches it
/// either way.
#[test]
fn one_server_on_xio_and_tcp() {
    let (_mgr, p) = setup("both");
    rt().block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let x = XioListener::bind_with(&srv, "10.5.0.4:80").unwrap();
        let t = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let taddr = t.local_addr().unwrap();
        let stop = Shutdown::new();
        let server = tokio::spawn(xio_hyper::serve_on(
            Some(x),
            Some(t),
            hyper::service::service_fn(echo),
            Protocol::Auto,
            stop.clone(),
        ));
        let c: Client<XioConnector, Body> = Client::builder(TokioExecutor::new())
            .build(XioConnector::with_net(cli.clone()).with_tcp_fallback());
        for uri in [
            "http://10.5.0.4:80/a".to_owned(),
            format!("http://{taddr}/b"),
        ] {
            let req = http::Request::post(uri.as_str())
                .body(Full::from(uri.clone()))
                .unwrap();
            let r = c.request(req).await.unwrap();
            // Which way it went, from the response.
            let way = if uri.contains("10.5.0.4") {
                xio_hyper::Transport::Xio
            } else {
                xio_hyper::Transport::Tcp
            };
            assert_eq!(r.extensions().get::<xio_hyper::Transport>(), Some(&way));
            assert_eq!(body_string(r).await, uri);
        }
        // Neither way: the error says both were tried.
        // Bound but not listening: connects are refused, and no other test
        // can be given the port while this one holds it.
        let held = tokio::net::TcpSocket::new_v4().unwrap();
        held.bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let nowhere = held.local_addr().unwrap();
        let mut connector = XioConnector::with_net(cli.clone()).with_tcp_fallback();
        let e = tower_service::Service::call(
            &mut connector,
            format!("http://{nowhere}/").parse().unwrap(),
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        let msg = e.to_string();
        assert!(msg.contains("X-IO") && msg.contains("TCP"), "{msg}");
        drop(held);
        drop(c);
        stop.shutdown();
        tokio::time::timeout(WATCHDOG, server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    });
}

/// A service that stops listening on X-IO (its process lives on) and
/// serves on TCP only: a fallback client that reached it over X-IO
/// before still holds the route, and must fall back at the next
/// connection, not fail its request with the late refusal.
#[test]
fn the_fallback_follows_a_service_that_left_xio() {
    let (_mgr, p) = setup("left");
    rt().block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        // The server process keeps another X-IO listener, so it keeps
        // answering on its rings (a refusal needs someone to send it).
        let _other = XioListener::bind_with(&srv, "10.5.0.9:80").unwrap();
        let t = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = t.local_addr().unwrap();
        let x = XioListener::bind_with(&srv, addr).unwrap();
        let stop_x = Shutdown::new();
        let xs = tokio::spawn(xio_hyper::serve(
            x,
            hyper::service::service_fn(echo),
            Protocol::Auto,
            stop_x.clone(),
        ));
        let stop_t = Shutdown::new();
        let ts = tokio::spawn(xio_hyper::serve_on(
            None,
            Some(t),
            hyper::service::service_fn(echo),
            Protocol::Auto,
            stop_t.clone(),
        ));
        let uri: http::Uri = format!("http://{addr}/x").parse().unwrap();
        let get = |way| {
            let c: Client<XioConnector, Body> = Client::builder(TokioExecutor::new())
                .build(XioConnector::with_net(cli.clone()).with_tcp_fallback());
            let uri = uri.clone();
            async move {
                let r = c.get(uri).await.unwrap();
                assert_eq!(r.extensions().get::<xio_hyper::Transport>(), Some(&way));
            }
        };
        get(xio_hyper::Transport::Xio).await;
        stop_x.shutdown();
        tokio::time::timeout(WATCHDOG, xs)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        for _ in 0..3 {
            get(xio_hyper::Transport::Tcp).await;
        }
        stop_t.shutdown();
        tokio::time::timeout(WATCHDOG, ts)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    });
}

/// The connector speaks no TLS: an `https` URI (or any but `http`) is
/// refused rather than sent in clear (over TCP too, with the fallback), unless a TLS
/// connector wrapping it says it encrypts.
#[test]
fn https_is_refused_unless_a_tls_layer_says_otherwise() {
    let (_mgr, p) = setup("https");
    rt().block_on(async {
        let cli = Net::attach(&p).unwrap();
        let mut connector = XioConnector::with_net(cli.clone()).with_tcp_fallback();
        let e =
            tower_service::Service::call(&mut connector, "https://127.0.0.1:9/".parse().unwrap())
                .await
                .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("TLS"), "{e}");
        // Nor any scheme but `http`, as hyper's `HttpConnector` (`wss`,
        // which hyper-util's client counts as secure, went out in clear
        // to a listener on port 80).
        let _l = XioListener::bind_with(&cli, "10.5.0.11:80").unwrap();
        for uri in ["wss://10.5.0.11/", "grpcs://10.5.0.11/", "ftp://10.5.0.11/"] {
            let e = tower_service::Service::call(&mut connector, uri.parse().unwrap())
                .await
                .map(|c| c.is_xio())
                .unwrap_err();
            assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput, "{uri}: {e}");
        }
        // Allowed, it dials (and finds nobody there).
        let mut connector = XioConnector::with_net(cli).enforce_http(false);
        let e = tower_service::Service::call(&mut connector, "https://10.5.0.10/".parse().unwrap())
            .await
            .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
    });
}

/// A client that sends half a request head and stalls: hyper closes its
/// connection at its header-read timeout (30 s; it had no timer before,
/// so no timeout), and a graceful shutdown meanwhile completes then
/// instead of waiting for good.
#[test]
fn a_stalled_request_head_does_not_hold_a_graceful_shutdown_for_good() {
    use tokio::io::AsyncWriteExt;
    rt().block_on(async {
        let t = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = t.local_addr().unwrap();
        let stop = Shutdown::new();
        let server = tokio::spawn(xio_hyper::serve_on(
            None,
            Some(t),
            hyper::service::service_fn(echo),
            Protocol::Auto,
            stop.clone(),
        ));
        let mut c = tokio::net::TcpStream::connect(addr).await.unwrap();
        c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n").await.unwrap();
        // The server has the connection once it answers another.
        let ok: Client<_, Body> = Client::builder(TokioExecutor::new())
            .build(hyper_util::client::legacy::connect::HttpConnector::new());
        ok.get(format!("http://{addr}/").parse().unwrap())
            .await
            .unwrap();
        stop.shutdown();
        tokio::time::timeout(WATCHDOG, server)
            .await
            .expect("the shutdown completes")
            .unwrap()
            .unwrap();
        drop(c);
    });
}

/// An `Upgrade:` handshake (what a WebSocket starts with) through
/// `serve`: the service answers 101 and both sides then own the raw
/// connection, as with hyper's own servers. `serve` used hyper-util's
/// connection without upgrades, and the upgrade future failed.
#[test]
fn serve_hands_an_upgraded_connection_to_the_service() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let (_mgr, p) = setup("upgrade");
    rt().block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        // HTTP/1 only as well as detected (HTTP/1 only went through the
        // auto builder, which ignored it).
        for (port, protocol) in [(80u16, Protocol::Auto), (85, Protocol::Http1)] {
            let l = XioListener::bind_with(&srv, ("10.5.0.9", port)).unwrap();
            let stop = Shutdown::new();
            let service = hyper::service::service_fn(
                |mut req: http::Request<hyper::body::Incoming>| async move {
                    let on = hyper::upgrade::on(&mut req);
                    tokio::spawn(async move {
                        // The raw connection: echo one message in upper case.
                        let mut io = hyper_util::rt::TokioIo::new(on.await.expect("upgraded"));
                        let mut buf = [0u8; 5];
                        io.read_exact(&mut buf).await.unwrap();
                        io.write_all(&buf.to_ascii_uppercase()).await.unwrap();
                        io.flush().await.unwrap();
                    });
                    let mut r = http::Response::new(Full::<Bytes>::default());
                    *r.status_mut() = http::StatusCode::SWITCHING_PROTOCOLS;
                    r.headers_mut()
                        .insert("connection", "upgrade".parse().unwrap());
                    r.headers_mut().insert("upgrade", "echo".parse().unwrap());
                    Ok::<_, Infallible>(r)
                },
            );
            let server = tokio::spawn(xio_hyper::serve(l, service, protocol, stop.clone()));
            tokio::time::timeout(WATCHDOG, async {
                let io = XioConnector::with_net(cli.clone());
                let s = tower_service::Service::call(
                    &mut { io },
                    format!("http://10.5.0.9:{port}").parse().unwrap(),
                )
                .await
                .unwrap();
                let (mut send, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(s)
                    .await
                    .unwrap();
                tokio::spawn(conn.with_upgrades());
                let req = http::Request::get("http://10.5.0.9/")
                    .header("connection", "upgrade")
                    .header("upgrade", "echo")
                    .body(Full::default())
                    .unwrap();
                let r = send.send_request(req).await.unwrap();
                assert_eq!(r.status(), http::StatusCode::SWITCHING_PROTOCOLS);
                let mut io = hyper_util::rt::TokioIo::new(hyper::upgrade::on(r).await.unwrap());
                io.write_all(b"hello").await.unwrap();
                let mut got = [0u8; 5];
                io.read_exact(&mut got).await.unwrap();
                assert_eq!(&got, b"HELLO");
            })
            .await
            .expect("watchdog");
            stop.shutdown();
            tokio::time::timeout(WATCHDOG, server)
                .await
                .expect("graceful shutdown finishes")
                .unwrap()
                .unwrap();
        }
    });
}

/// A connection the listener refuses is a connect error, as over TCP
/// (`hyper_util`'s `Error::is_connect`, which retry policies use to tell
/// a request that never left from one that may have been processed),
/// also when this process's route to the address is stale (the service
/// stopped listening there since it was last reached) and the refusal
/// comes from the listener's process rather than the manager.
#[test]
fn a_refused_connection_is_a_connect_error() {
    let (_mgr, p) = setup("refusedconn");
    rt().block_on(async {
        // TCP: nobody listens on the port.
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        let tcp: Client<_, Body> = Client::builder(TokioExecutor::new()).build_http::<Body>();
        let req = http::Request::post(format!("http://127.0.0.1:{port}/x"))
            .body(Full::from("never sent"))
            .unwrap();
        let e = tcp.request(req).await.unwrap_err();
        assert!(e.is_connect(), "TCP: {e:?}");

        // X-IO, a stale route.
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        // The server process keeps another listener (it keeps answering).
        let _other = XioListener::bind_with(&srv, "10.5.0.31:80").unwrap();
        let x = XioListener::bind_with(&srv, "10.5.0.30:80").unwrap();
        let stop = Shutdown::new();
        let server = tokio::spawn(xio_hyper::serve(
            x,
            hyper::service::service_fn(echo),
            Protocol::Auto,
            stop.clone(),
        ));
        let uri = "http://10.5.0.30/x";
        let req = http::Request::post(uri).body(Full::from("one")).unwrap();
        let r = client(&cli).request(req).await.unwrap();
        assert_eq!(body_string(r).await, "one");
        stop.shutdown();
        tokio::time::timeout(WATCHDOG, server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        // A new client: no pooled connection.
        let req = http::Request::post(uri).body(Full::from("two")).unwrap();
        let e = tokio::time::timeout(WATCHDOG, client(&cli).request(req))
            .await
            .expect("watchdog")
            .unwrap_err();
        assert!(e.is_connect(), "X-IO: {e:?}");
    });
}

/// `Protocol::Http1` speaks HTTP/1.1 only and `Protocol::Http2` h2c only,
/// as documented: a client of the other version is not served. (Since
/// `serve` took connections with upgrades, hyper-util's builder ignored
/// `http1_only`/`http2_only` and served either version whatever was
/// asked.) What each does serve still works.
#[test]
fn a_protocol_restricted_server_serves_only_its_version() {
    let (_mgr, p) = setup("protoonly");
    rt().block_on(async {
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        for (port, protocol) in [(83u16, Protocol::Http1), (84, Protocol::Http2)] {
            let l = XioListener::bind_with(&srv, ("10.5.0.40", port)).unwrap();
            let stop = Shutdown::new();
            let server = tokio::spawn(xio_hyper::serve(
                l,
                hyper::service::service_fn(echo),
                protocol,
                stop.clone(),
            ));
            let uri = format!("http://10.5.0.40:{port}/x");
            for h2 in [false, true] {
                let c: Client<XioConnector, Body> = Client::builder(TokioExecutor::new())
                    .http2_only(h2)
                    .build(XioConnector::with_net(cli.clone()));
                let req = http::Request::post(uri.as_str())
                    .body(Full::from("v"))
                    .unwrap();
                let r = tokio::time::timeout(WATCHDOG, c.request(req))
                    .await
                    .expect("watchdog");
                let served = h2 == (protocol == Protocol::Http2);
                match r {
                    Ok(r) if served => assert_eq!(body_string(r).await, "v"),
                    Ok(r) => panic!("{protocol:?} served {:?}", r.headers().get("x-version")),
                    Err(e) => assert!(!served, "{protocol:?}, h2 {h2}: {e:?}"),
                }
            }
            stop.shutdown();
            tokio::time::timeout(WATCHDOG, server)
                .await
                .expect("graceful shutdown finishes")
                .unwrap()
                .unwrap();
        }
    });
}

/// A route this process learnt to a process that has since stopped
/// listening on the address and makes no X-IO call any more (a blocking
/// program between calls): nobody there reads the SYN, so nobody refuses
/// it. A blocking connect asks the manager after a little while; the
/// connector waited for the answer for good, a request hanging where TCP
/// refuses at once (and the fallback never ran).
#[test]
fn a_stale_route_to_a_silent_process_is_refused_not_waited_for() {
    let (_mgr, p) = setup("silent");
    let srv = Net::attach(&p).unwrap();
    rt().block_on(async {
        let addr = tcp_echo_server().await;
        // A blocking server, no tokio driver: it reads its rings only
        // while one of its threads waits in X-IO.
        let l = srv.listen(addr).unwrap();
        let served = std::thread::spawn(move || drop(l.accept().unwrap()));
        let cli = Net::attach(&p).unwrap();
        let uri: http::Uri = format!("http://{addr}/x").parse().unwrap();
        let mut strict = XioConnector::with_net(cli.clone());
        let first = tower_service::Service::call(&mut strict, uri.clone())
            .await
            .unwrap();
        assert!(first.is_xio());
        // Its listener closes; the process goes quiet (`srv` stays).
        tokio::task::spawn_blocking(move || served.join().unwrap())
            .await
            .unwrap();
        drop(first);
        let e = tokio::time::timeout(
            WATCHDOG,
            tower_service::Service::call(&mut strict, uri.clone()),
        )
        .await
        .expect("refused, not waited for")
        .map(|c| c.is_xio())
        .unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
        // With the fallback, a request goes over TCP.
        let c: Client<XioConnector, Body> = Client::builder(TokioExecutor::new())
            .build(XioConnector::with_net(cli.clone()).with_tcp_fallback());
        let req = http::Request::post(uri).body(Full::from("tcp")).unwrap();
        let r = tokio::time::timeout(WATCHDOG, c.request(req))
            .await
            .expect("over TCP, not waited for")
            .unwrap();
        assert_eq!(
            r.extensions().get::<xio_hyper::Transport>(),
            Some(&xio_hyper::Transport::Tcp)
        );
        assert_eq!(body_string(r).await, "tcp");
    });
    drop(srv);
}

/// A listener whose backlog is full refuses a SYN (design: "Backlog"):
/// the service is bound here and busy. The fallback is for an address no
/// X-IO service binds on this node; it dialled TCP for such a refusal
/// too, sending the request to whatever answers on TCP (or nowhere). A
/// stale route's refusal still falls back (the manager, asked again, says
/// nobody binds the address), and once the backlog has room the request
/// goes over X-IO.
#[test]
fn a_full_backlog_is_refused_not_dialled_over_tcp() {
    let (_mgr, p) = setup("backlogfull");
    rt().block_on(async {
        // A TCP server on the same address, to show where the request went.
        let addr = tcp_echo_server().await;
        let srv = Net::attach(&p).unwrap();
        let cli = Net::attach(&p).unwrap();
        let l = XioListener::from_std(srv.listen_with_backlog(addr, 1).unwrap()).unwrap();
        // Fills the backlog (not accepted).
        let first = xio_hyper::XioStream::connect_with(&cli, addr)
            .await
            .unwrap();
        first.connected().await.unwrap();
        let uri: http::Uri = format!("http://{addr}/x").parse().unwrap();
        let mut fallback = XioConnector::with_net(cli.clone()).with_tcp_fallback();
        let r = tokio::time::timeout(
            WATCHDOG,
            tower_service::Service::call(&mut fallback, uri.clone()),
        )
        .await
        .expect("watchdog");
        match r {
            Ok(c) => panic!("connected, over X-IO: {}", c.is_xio()),
            Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}"),
        }
        // Room again: over X-IO.
        let (_s, _) = l.accept().await.unwrap();
        let c = tokio::time::timeout(WATCHDOG, tower_service::Service::call(&mut fallback, uri))
            .await
            .expect("watchdog")
            .unwrap();
        assert!(c.is_xio());
        drop(first);
    });
}

/// An address that a process on this node binds, refused because that
/// process does not read its control socket (stopped, stuck; the
/// manager's `ErrorCode::Busy`): the service is here, as with a full
/// backlog, and the fallback is only for an address no X-IO service binds
/// on this node. The connector took that refusal for "nobody binds it"
/// and sent the request over TCP, to whatever answers there.
#[test]
fn a_service_here_that_does_not_read_is_refused_not_dialled_over_tcp() {
    use std::os::fd::AsFd;
    use xio_core::ctrl;
    use xio_core::proto::Msg;
    // Hundreds of raw stacks in this process (and the manager's fds for
    // the deaf one) need more than the usual 1024 fds.
    let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
    let want = lim.maximum.map_or(1 << 16, |h| h.min(1 << 16));
    let _ = rustix::process::setrlimit(
        rustix::process::Resource::Nofile,
        rustix::process::Rlimit {
            current: Some(want.max(lim.current.unwrap_or(0))),
            maximum: lim.maximum,
        },
    );
    let p = test_prefix("busy");
    let mgr = Manager::builder(&p)
        .pool(xio_core::layout::PoolConfig {
            classes: vec![(2 << 10, 256)],
            max_stacks: 300,
            max_channels: 300,
            ring_capacity: 16,
            quotas: Vec::new(),
        })
        .spawn()
        .unwrap();
    let rt = rt();
    // A TCP server on the same address, to show where the request went.
    let addr = rt.block_on(tcp_echo_server());
    // A raw stack ("deaf": it never reads) binds the address here.
    let deaf_stack = || {
        let s = ctrl::connect(&xio_core::paths::socket_path(&p)).unwrap();
        let hello = Msg::Hello {
            pid: 1,
            name: "deaf".into(),
        };
        ctrl::send(s.as_fd(), &hello, &[]).unwrap();
        let Msg::Welcome { stack_id, .. } = ctrl::recv(s.as_fd(), false).unwrap().0 else {
            panic!("no Welcome")
        };
        (s, stack_id)
    };
    let (deaf, id) = deaf_stack();
    ctrl::send(deaf.as_fd(), &Msg::Bind { addr }, &[]).unwrap();
    assert!(matches!(
        ctrl::recv(deaf.as_fd(), false).unwrap().0,
        Msg::Ok
    ));
    // Status requests it does not read, until the manager holds replies
    // for it.
    let queued = || {
        mgr.snapshot()
            .stacks
            .iter()
            .find(|s| s.id == id)
            .map_or(0, |s| s.queued)
    };
    let deadline = std::time::Instant::now() + WATCHDOG;
    while queued() == 0 {
        assert!(std::time::Instant::now() < deadline, "nothing queued");
        loop {
            match ctrl::send_nowait(deaf.as_fd(), &Msg::Status, &[]) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => panic!("send: {e}"),
            }
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    // Peers' new channels fill what the manager may hold for it, until
    // it refuses them.
    let mut peers = Vec::new();
    loop {
        assert!(peers.len() < 290, "connections were never refused");
        let (s, _) = deaf_stack();
        ctrl::send(s.as_fd(), &Msg::Connect { addr }, &[]).unwrap();
        match ctrl::recv_until(s.as_fd(), Some(std::time::Instant::now() + WATCHDOG))
            .unwrap()
            .0
        {
            Msg::Connected { .. } => peers.push(s),
            Msg::Error { message, .. } => {
                assert!(message.contains("not reading"), "{message}");
                break;
            }
            other => panic!("connect {}: {other:?}", peers.len()),
        }
    }
    let cli = Net::attach(&p).unwrap();
    cli.set_control_timeout(WATCHDOG);
    let uri: http::Uri = format!("http://{addr}/x").parse().unwrap();
    let mut fallback = XioConnector::with_net(cli.clone()).with_tcp_fallback();
    let r = rt
        .block_on(async {
            tokio::time::timeout(WATCHDOG, tower_service::Service::call(&mut fallback, uri)).await
        })
        .expect("watchdog");
    match r {
        Ok(c) => panic!("connected (over X-IO: {})", c.is_xio()),
        Err(e) => {
            assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused, "{e}");
            assert!(e.to_string().contains("not reading"), "{e}");
        }
    }
    drop((cli, peers, deaf));
}

//! `serve_on` keeps serving through accept errors. A test binary of its
//! own: it lowers the process's fd limit, which would starve any test
//! running beside it.

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use xio_hyper::{Protocol, Shutdown};

/// Generous: a guard against hangs, not a performance bound.
const WATCHDOG: Duration = Duration::from_secs(120);

async fn hello(
    _: http::Request<hyper::body::Incoming>,
) -> Result<http::Response<Full<Bytes>>, Infallible> {
    Ok(http::Response::new(Full::from("hello")))
}

/// Out of fds for a moment (EMFILE at accept): `serve_on` used to
/// return the error, stop serving and drop its connections; now it
/// waits a moment and serves on, the waiting connection included.
#[test]
fn serve_on_survives_running_out_of_fds() {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let t = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = t.local_addr().unwrap();
        let stop = Shutdown::new();
        let server = tokio::spawn(xio_hyper::serve_on(
            None,
            Some(t),
            hyper::service::service_fn(hello),
            Protocol::Auto,
            stop.clone(),
        ));
        let client: Client<_, Full<Bytes>> =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let uri: http::Uri = format!("http://{addr}/").parse().unwrap();
        assert!(client.get(uri.clone()).await.unwrap().status().is_success());
        let old = getrlimit(Resource::Nofile);
        setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(256),
                maximum: old.maximum,
            },
        )
        .unwrap();
        let mut held = Vec::new();
        while let Ok(f) = std::fs::File::open("/dev/null") {
            held.push(f);
        }
        // The last free fd for this connection: the server's accept of
        // it then finds none.
        held.pop();
        let waiting = std::net::TcpStream::connect(addr).unwrap();
        // Let the server try (not a bound: with the fix the test passes
        // however long it takes).
        tokio::time::sleep(Duration::from_millis(200)).await;
        drop(held);
        setrlimit(Resource::Nofile, old).unwrap();
        assert!(!server.is_finished(), "serve_on stopped at EMFILE");
        // The waiting connection is served too, after the pause.
        let waiting = tokio::net::TcpStream::from_std({
            waiting.set_nonblocking(true).unwrap();
            waiting
        })
        .unwrap();
        let (mut send, conn) = hyper::client::conn::http1::handshake::<_, Full<Bytes>>(
            hyper_util::rt::TokioIo::new(waiting),
        )
        .await
        .unwrap();
        tokio::spawn(conn);
        let r = tokio::time::timeout(
            WATCHDOG,
            send.send_request(http::Request::get("/").body(Full::default()).unwrap()),
        )
        .await
        .unwrap()
        .unwrap();
        assert!(r.status().is_success());
        assert!(client.get(uri).await.unwrap().status().is_success());
        stop.shutdown();
        tokio::time::timeout(WATCHDOG, server)
            .await
            .unwrap()
            .unwrap()
            .unwrap();
    });
}

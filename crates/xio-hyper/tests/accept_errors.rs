//! `serve_on` keeps serving through accept errors. A test binary of its
//! own: it lowers the process's fd limit, which would starve any test
//! running beside it.

#[path = "../../xio-core/tests/common/process_dir.rs"]
mod process_dir;

use std::convert::Infallible;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
use xio_hyper::{Net, Protocol, Shutdown, XioConnector, XioListener};

/// Generous: a guard against hangs, not a performance bound.
const WATCHDOG: Duration = Duration::from_secs(120);

/// The tests here lower the process's fd limit one at a time.
static FDS: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Takes every fd but one (for a connection the test makes), with the
/// limit lowered so that this is quick; `release` gives them back.
struct Starved {
    held: Vec<std::fs::File>,
    old: Rlimit,
}

impl Starved {
    fn all_but_one() -> Starved {
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
        held.pop();
        Starved { held, old }
    }

    fn release(self) {
        drop(self.held);
        setrlimit(Resource::Nofile, self.old).unwrap();
    }
}

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
    let _one = FDS.lock().unwrap_or_else(|e| e.into_inner());
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
        // The last free fd for this connection: the server's accept of
        // it then finds none.
        let starved = Starved::all_but_one();
        let waiting = std::net::TcpStream::connect(addr).unwrap();
        // Let the server try (not a bound: with the fix the test passes
        // however long it takes).
        tokio::time::sleep(Duration::from_millis(200)).await;
        starved.release();
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

/// A manager on a pool of the test's own.
fn manager(test: &str) -> (xio_core::manager::ManagerHandle, String) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let dir = process_dir::process_dir("xio-hyper-acc");
        std::env::set_var("XIO_RUN_DIR", &dir);
    });
    let p = format!("ta-{test}-{}", std::process::id());
    (xio_core::manager::Manager::builder(&p).spawn().unwrap(), p)
}

/// Sets a flag at the first ERROR event on the thread it is the default
/// of (`serve_on` logs its accept errors so).
struct ErrorSeen(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl tracing::Subscriber for ErrorSeen {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, e: &tracing::Event<'_>) {
        if *e.metadata().level() == tracing::Level::ERROR {
            self.0.store(true, std::sync::atomic::Ordering::SeqCst);
        }
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// `serve_on` on X-IO and TCP, the TCP listener out of fds (EMFILE at
/// every accept): its pause after the error held up the X-IO listener
/// too, so a peer on this node waited for the pause (1 s after each
/// error) as well. The clock is paused and a task keeps the runtime
/// busy, so a pause never ends: an X-IO connection must be accepted
/// during it.
#[test]
fn an_accept_error_on_tcp_does_not_pause_the_xio_listener() {
    let _one = FDS.lock().unwrap_or_else(|e| e.into_inner());
    let (mgr, p) = manager("pace");
    let (done, finished) = std::sync::mpsc::channel();
    let run = std::thread::spawn(move || {
        let erred = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let _log = tracing::subscriber::set_default(ErrorSeen(erred.clone()));
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        rt.block_on(async move {
            let srv = Net::attach(&p).unwrap();
            let cli = Net::attach(&p).unwrap();
            let t = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = t.local_addr().unwrap();
            let x = XioListener::bind_with(&srv, "10.6.0.1:80").unwrap();
            let stop = Shutdown::new();
            tokio::spawn(xio_hyper::serve_on(
                Some(x),
                Some(t),
                hyper::service::service_fn(hello),
                Protocol::Auto,
                stop.clone(),
            ));
            let get = || async {
                // A client of its own: a new connection, to be accepted.
                let c: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new())
                    .build(XioConnector::with_net(cli.clone()));
                c.get("http://10.6.0.1/".parse().unwrap()).await.unwrap()
            };
            // Both nets' drivers and the route, while fds are there.
            assert!(get().await.status().is_success());
            let starved = Starved::all_but_one();
            let _waiting = std::net::TcpStream::connect(addr).unwrap();
            // Busy: the paused clock never jumps to a timer.
            tokio::spawn(async {
                loop {
                    tokio::task::yield_now().await;
                }
            });
            while !erred.load(std::sync::atomic::Ordering::SeqCst) {
                tokio::task::yield_now().await;
            }
            // The TCP listener pauses now; X-IO serves meanwhile.
            assert!(get().await.status().is_success());
            starved.release();
            stop.shutdown();
        });
        done.send(()).unwrap();
    });
    finished
        .recv_timeout(WATCHDOG)
        .expect("watchdog: the X-IO listener waited for the TCP listener's pause");
    run.join().unwrap();
    drop(mgr);
}

/// A gRPC service with no methods (every call is unimplemented).
#[derive(Clone)]
struct NoMethods;

impl tonic::server::NamedService for NoMethods {
    const NAME: &'static str = "test.NoMethods";
}

impl tower_service::Service<http::Request<tonic::body::Body>> for NoMethods {
    type Response = http::Response<tonic::body::Body>;
    type Error = std::convert::Infallible;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<tonic::body::Body>) -> Self::Future {
        std::future::ready(Ok(tonic::Status::unimplemented("none").into_http()))
    }
}

/// tonic's accept loop takes the next connection at once after an accept
/// error. An error that persists (here: out of fds when the listener
/// needs a driver, its first runtime gone) made `incoming` fail at every
/// poll, so tonic spun in one poll for good and starved its runtime: on a
/// current_thread runtime nothing else ran again, not even what would
/// have freed the fds or stopped the server. It now pauses after such an
/// error, as axum's and `serve_on`'s loops do.
#[test]
fn a_persistent_accept_error_does_not_spin_tonics_loop() {
    let _one = FDS.lock().unwrap_or_else(|e| e.into_inner());
    let (mgr, p) = manager("tonicspin");
    let srv = Net::attach(&p).unwrap();
    // The listener's driver is on a runtime that is then shut down.
    let l = {
        let first = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        first.block_on(async { XioListener::bind_with(&srv, "10.6.0.2:50051").unwrap() })
    };
    let (done, finished) = std::sync::mpsc::channel();
    let run = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let starved = Starved::all_but_one();
            let last = std::fs::File::open("/dev/null").unwrap();
            let server = tokio::spawn(
                tonic::transport::Server::builder()
                    .add_service(NoMethods)
                    .serve_with_incoming_shutdown(xio_hyper::incoming(l), async {
                        let _ = stopped.await;
                    }),
            );
            // The server tries to accept (and fails: no fd for a driver).
            tokio::task::yield_now().await;
            drop(last);
            starved.release();
            stop.send(()).unwrap();
            server.await.unwrap().unwrap();
        });
        done.send(()).unwrap();
    });
    finished
        .recv_timeout(WATCHDOG)
        .expect("watchdog: tonic's accept loop spun on the error");
    run.join().unwrap();
    drop((srv, mgr));
}

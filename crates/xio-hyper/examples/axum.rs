//! An unchanged axum app served over X-IO and over TCP at once, and a
//! hyper-util client calling it both ways: the one-line swap, runnable.
//!
//! ```text
//! cargo run --release -p xio-hyper --example axum            # self-contained run
//! cargo run --release -p xio-hyper --example axum -- serve [TCP_ADDR]   # just the server
//! ```
//! Without arguments it starts an embedded manager, the app as a child
//! process (an X-IO listener and a TCP listener serving the same
//! `Router`), calls two routes through each transport, then times
//! sequential keep-alive requests on each, side by side. Everything runs
//! on tokio's default runtime, as under `#[tokio::main]`.
//!
//! `serve` alone uses the pool of `$XIO_PREFIX` (default `xio`, so run
//! `xio-manager` first), listens on X-IO 127.0.0.1:3000 and on TCP
//! 127.0.0.1:3000 (or the address given after `serve`), and stops at
//! Ctrl-C.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use axum::routing::{get, post};
use axum::{Json, Router};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::{Connect, HttpConnector};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncReadExt;

#[path = "../../xio-core/examples/common/run_dir.rs"]
mod run_dir;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Sequential requests in each timed run.
const TIMED: u32 = 10_000;

#[derive(Deserialize, Serialize)]
struct Order {
    item: String,
    qty: u32,
}

#[derive(Deserialize, Serialize)]
struct Receipt {
    item: String,
    qty: u32,
    total_cents: u64,
}

/// The application: nothing in it knows about X-IO.
fn app() -> Router {
    Router::new()
        .route("/hello", get(|| async { "hello from axum" }))
        .route(
            "/order",
            post(|Json(o): Json<Order>| async move {
                Json(Receipt {
                    total_cents: u64::from(o.qty) * 250,
                    item: o.item,
                    qty: o.qty,
                })
            }),
        )
}

/// Serves `app()` on X-IO `xio_addr` and on TCP `tcp_addr` until Ctrl-C
/// (or, with `until_eof`, until its input ends: the self-contained run's
/// child, which thus also ends with its parent); prints `ready <tcp port>`
/// once both listen.
async fn serve(xio_addr: &str, tcp_addr: &str, until_eof: bool) -> Result<(), BoxError> {
    // The one line that changes: an X-IO listener where a TCP one was.
    let xio = xio_tokio::XioListener::bind(xio_addr).await?;
    let tcp = tokio::net::TcpListener::bind(tcp_addr).await?;
    println!("ready {}", tcp.local_addr()?.port());
    let (stop, stopped) = tokio::sync::watch::channel(());
    let shutdown = |mut rx: tokio::sync::watch::Receiver<()>| async move {
        let _ = rx.changed().await;
    };
    let servers = tokio::spawn(async move {
        tokio::try_join!(
            axum::serve(xio, app()).with_graceful_shutdown(shutdown(stopped.clone())),
            axum::serve(tcp, app()).with_graceful_shutdown(shutdown(stopped)),
        )
    });
    let mut stdin = tokio::io::stdin();
    let mut sink = [0u8; 64];
    let eof = async {
        if !until_eof {
            return std::future::pending().await;
        }
        while matches!(stdin.read(&mut sink).await, Ok(n) if n > 0) {}
    };
    tokio::select! {
        _ = eof => {}
        _ = tokio::signal::ctrl_c() => {}
    }
    drop(stop);
    servers.await??;
    Ok(())
}

/// Calls both routes through `client` and prints the answers.
async fn call_routes<C>(
    label: &str,
    client: &Client<C, Full<Bytes>>,
    base: &str,
) -> Result<(), BoxError>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let hello = client.get(format!("{base}/hello").parse()?).await?;
    let body = hello.into_body().collect().await?.to_bytes();
    println!(
        "{label:>5}  GET  /hello -> {}",
        String::from_utf8_lossy(&body)
    );

    let order = serde_json::to_vec(&Order {
        item: "espresso".into(),
        qty: 3,
    })?;
    let req = http::Request::post(format!("{base}/order"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(Full::new(Bytes::from(order)))?;
    let resp = client.request(req).await?;
    if !resp.status().is_success() {
        return Err(format!("POST /order: {}", resp.status()).into());
    }
    let receipt: Receipt = serde_json::from_slice(&resp.into_body().collect().await?.to_bytes())?;
    println!(
        "{label:>5}  POST /order -> {} x {}: {} cents",
        receipt.qty, receipt.item, receipt.total_cents
    );
    Ok(())
}

/// `TIMED` sequential GETs of `uri`, each body checked; requests per second.
async fn timed<C>(client: Client<C, Full<Bytes>>, uri: http::Uri) -> Result<f64, BoxError>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let t0 = Instant::now();
    for _ in 0..TIMED {
        let resp = client.get(uri.clone()).await?;
        let body = resp.into_body().collect().await?.to_bytes();
        if body.as_ref() != b"hello from axum" {
            return Err(format!("unexpected body {body:?}").into());
        }
    }
    Ok(f64::from(TIMED) / t0.elapsed().as_secs_f64())
}

/// Requests per second from a spawned task and from the main future
/// (`block_on`'s thread, which every response must wake).
async fn both_ways<C>(
    client: &Client<C, Full<Bytes>>,
    uri: &http::Uri,
) -> Result<(f64, f64), BoxError>
where
    C: Connect + Clone + Send + Sync + 'static,
{
    let (c, u) = (client.clone(), uri.clone());
    let in_task =
        tokio::spawn(async move { timed(c, u).await.map_err(|e| e.to_string()) }).await??;
    let in_main = timed(client.clone(), uri.clone()).await?;
    Ok((in_task, in_main))
}

fn main() -> Result<(), BoxError> {
    // What `#[tokio::main]` builds: a worker per CPU.
    let rt = tokio::runtime::Runtime::new()?;
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("serve") {
        // The self-contained run asks for a free TCP port.
        let tcp = args.get(2).map_or("127.0.0.1:3000", String::as_str);
        let until_eof = args.get(3).map(String::as_str) == Some("--until-eof");
        return rt.block_on(serve("127.0.0.1:3000", tcp, until_eof));
    }

    // A private pool: a manager on a thread of this process, its control
    // socket in a directory of our own (removed on the way out, however
    // `main` returns); the child finds both through the environment it
    // inherits.
    let _dir = run_dir::RunDir::create("axum")?;
    let prefix = format!("axum-{}", std::process::id());
    std::env::set_var("XIO_PREFIX", &prefix);
    let manager = xio_core::Manager::builder(&prefix).spawn()?;

    let mut child = Command::new(std::env::current_exe()?)
        .args(["serve", "127.0.0.1:0", "--until-eof"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()?;
    let result = (|| -> Result<(), BoxError> {
        let mut line = String::new();
        BufReader::new(child.stdout.take().ok_or("no stdout")?).read_line(&mut line)?;
        let port: u16 = line
            .strip_prefix("ready ")
            .ok_or_else(|| format!("the server said {line:?}, not `ready <port>`"))?
            .trim()
            .parse()?;
        let tcp_base = format!("http://{}", SocketAddr::from(([127, 0, 0, 1], port)));
        let xio_base = "http://127.0.0.1:3000";

        rt.block_on(async {
            // The client side's one line: the X-IO connector where
            // hyper-util's `HttpConnector` was.
            let over_xio =
                Client::builder(TokioExecutor::new()).build(xio_hyper::XioConnector::new()?);
            let mut http = HttpConnector::new();
            http.set_nodelay(true);
            let over_tcp = Client::builder(TokioExecutor::new()).build(http);

            call_routes("X-IO", &over_xio, xio_base).await?;
            call_routes("TCP", &over_tcp, &tcp_base).await?;

            let xio_uri = format!("{xio_base}/hello").parse()?;
            let (xio_task, xio_main) = both_ways(&over_xio, &xio_uri).await?;
            let tcp_uri = format!("{tcp_base}/hello").parse()?;
            let (tcp_task, tcp_main) = both_ways(&over_tcp, &tcp_uri).await?;
            println!();
            println!("{TIMED} sequential GET /hello on one keep-alive connection, requests/s:");
            println!("                   X-IO        TCP   X-IO / TCP");
            println!(
                "  from a task  {xio_task:>9.0}  {tcp_task:>9.0}   {:>6.1}x",
                xio_task / tcp_task
            );
            println!(
                "  from main()  {xio_main:>9.0}  {tcp_main:>9.0}   {:>6.1}x   \
                 (each response wakes the main thread)",
                xio_main / tcp_main
            );
            Ok::<_, BoxError>(())
        })
    })();

    // End of input stops the server gracefully (`--until-eof`); then the
    // manager.
    drop(child.stdin.take());
    let deadline = Instant::now() + Duration::from_secs(10);
    while child.try_wait()?.is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(manager);
    result
}

//! `fetch`: one HTTP request with hyper-util's client over X-IO (falling
//! back to TCP when no X-IO service binds the address on this node), as
//! `curl` would make it over TCP. Prints the status and the body.
//!
//! ```text
//! fetch [--h2c] URL [BODY]     # BODY given: a POST of it, else a GET
//! ```
//! Uses the pool of `$XIO_PREFIX` (default `xio`). `--h2c` speaks HTTP/2
//! with prior knowledge (as free5GC's SBI clients do). Exits 1 on a
//! transport error; the status is printed as is.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

type BoxError = Box<dyn std::error::Error + Send + Sync>;

async fn fetch(h2c: bool, url: &str, body: Option<String>) -> Result<(), BoxError> {
    let connector = xio_hyper::XioConnector::new()?.with_tcp_fallback();
    let client = Client::builder(TokioExecutor::new())
        .http2_only(h2c)
        .build::<_, Full<Bytes>>(connector);
    let req = match body {
        Some(b) => http::Request::post(url)
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(b)))?,
        None => http::Request::get(url).body(Full::new(Bytes::new()))?,
    };
    let resp = client.request(req).await?;
    let status = resp.status();
    let version = resp.version();
    let body = resp.into_body().collect().await?.to_bytes();
    println!("{version:?} {status}");
    println!("{}", String::from_utf8_lossy(&body));
    Ok(())
}

fn main() {
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    let h2c = args.first().is_some_and(|a| a == "--h2c");
    if h2c {
        args.remove(0);
    }
    let Some(url) = args.first().cloned() else {
        eprintln!("usage: fetch [--h2c] URL [BODY]");
        std::process::exit(2);
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    if let Err(e) = rt.block_on(fetch(h2c, &url, args.get(1).cloned())) {
        eprintln!("fetch: {e}");
        std::process::exit(1);
    }
}

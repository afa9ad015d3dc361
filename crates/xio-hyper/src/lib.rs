//! X-IO for hyper and axum: swap one connector (client) or listener
//! (server) and keep the rest of the HTTP code.
//!
//! **Client.** [`XioConnector`] is a `tower_service::Service<http::Uri>`
//! for hyper-util's legacy client; the URI's authority (`ip:port`) is the
//! X-IO address. HTTP/1.1, or HTTP/2 with prior knowledge (h2c):
//!
//! ```no_run
//! use http_body_util::Empty;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! let client = Client::builder(TokioExecutor::new())
//!     .build::<_, Empty<bytes::Bytes>>(xio_hyper::XioConnector::new()?);
//! let resp = client.get("http://10.0.0.1:80/hello".parse()?).await?;
//! # Ok(()) }
//! # use http_body_util as _; use bytes as _;
//! ```
//!
//! **Server.** [`serve`] runs any hyper service over an
//! [`xio_tokio::XioListener`] (HTTP/1.1, h2c, or auto-detected), with
//! graceful shutdown; with xio-tokio's `axum` feature, `axum::serve(listener,
//! app)` works directly. An accept error does not stop it (one
//! connection's is skipped; others, such as running out of fds, pause the
//! listener that had it for a second), and an HTTP/1 request head that
//! does not come within hyper's header-read timeout (30 s) closes its
//! connection, so a stalled client cannot hold a graceful shutdown for
//! good.
//!
//! An axum app that takes the client's address (`ConnectInfo<SocketAddr>`,
//! through `into_make_service_with_connect_info`) needs one more call:
//! axum implements that for its own `TcpListener` only, and for any
//! listener wrapped by `ListenerExt::tap_io`:
//!
//! ```no_run
//! use std::net::SocketAddr;
//! use axum::extract::ConnectInfo;
//! use axum::serve::ListenerExt;
//!
//! # async fn run() -> std::io::Result<()> {
//! let app = axum::Router::new().route(
//!     "/",
//!     axum::routing::get(|ConnectInfo(peer): ConnectInfo<SocketAddr>| async move {
//!         peer.to_string()
//!     }),
//! );
//! let listener = xio_hyper::XioListener::bind("0.0.0.0:3000").await?.tap_io(|_| ());
//! axum::serve(listener, app.into_make_service_with_connect_info::<SocketAddr>()).await
//! # }
//! ```
//!
//! **Fallback to TCP.** [`XioConnector::with_tcp_fallback`] dials over TCP
//! when no X-IO service is bound to the address on this node (the manager
//! refuses it, or no manager runs), so a service keeps working when its
//! peers move to another node; [`XioConnector::or_tcp`] does the same
//! and builds even where no X-IO manager runs at all; [`serve_on`] listens
//! on X-IO and TCP at once. A connection over X-IO is returned once the
//! listener has answered (a round trip over shared memory, as TCP's
//! handshake), so that a refusal is a connect error (hyper-util's
//! `Error::is_connect`), and with a fallback an address whose X-IO
//! service went away since this process last reached it is dialled over
//! TCP rather than failing the request. As with hyper's `HttpConnector`,
//! a TCP dial has no time limit unless [`XioConnector::connect_timeout`]
//! sets one. A listener that refuses because
//! its backlog is full is on this node, as is a process bound to the
//! address that the manager refuses a connect to because it does not read
//! its control socket (stopped, stuck): those refusals are the connect's
//! error, never a reason to dial TCP.
//!
//! **No TLS.** `https` URIs (any scheme but `http`: `wss` too) are
//! refused (`InvalidInput`), as hyper's `HttpConnector` does: the request
//! would go out in clear. Under a TLS
//! connector that wraps this one, [`XioConnector::enforce_http`]`(false)`.
//!
//! **tonic** (feature `tonic`, on by default): the client uses
//! `Endpoint::connect_with_connector(XioConnector)` as is; the server
//! `Server::builder().add_service(svc).serve_with_incoming(xio_hyper::incoming(listener))`.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use hyper::body::Incoming;
use hyper::service::Service as HyperService;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;

pub use xio_core as core;
pub use xio_tokio::{Net, XioListener, XioStream};

/// A connection made by [`XioConnector`]: X-IO, or TCP after a fallback.
#[derive(Debug)]
pub enum XioConn {
    /// Over X-IO shared memory.
    Xio(TokioIo<XioStream>),
    /// Over TCP (the address has no X-IO listener on this node).
    Tcp(TokioIo<tokio::net::TcpStream>),
}

impl XioConn {
    /// True when the connection is over X-IO.
    pub fn is_xio(&self) -> bool {
        matches!(self, XioConn::Xio(_))
    }
}

/// Which transport carried a response of a client built on
/// [`XioConnector`], in the response's extensions (with a TCP fallback,
/// to tell which way a request went):
///
/// ```no_run
/// # async fn f(resp: http::Response<hyper::body::Incoming>) {
/// match resp.extensions().get::<xio_hyper::Transport>() {
///     Some(xio_hyper::Transport::Xio) => println!("shared memory"),
///     Some(xio_hyper::Transport::Tcp) => println!("TCP fallback"),
///     None => println!("not from an XioConnector"),
/// }
/// # }
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Transport {
    /// X-IO shared memory.
    Xio,
    /// TCP, after the connector's fallback.
    Tcp,
}

/// The response's extensions get the [`Transport`]; over TCP also
/// hyper-util's `HttpInfo` (the peer's and our address), as its
/// `HttpConnector` gives (hyper-util offers no way to make one for an
/// X-IO stream: its `peer_addr` and `local_addr` tell them).
impl Connection for XioConn {
    fn connected(&self) -> Connected {
        match self {
            XioConn::Xio(_) => Connected::new().extra(Transport::Xio),
            XioConn::Tcp(s) => s.connected().extra(Transport::Tcp),
        }
    }
}

macro_rules! both {
    ($self:ident, $s:ident => $e:expr) => {
        match $self.get_mut() {
            XioConn::Xio($s) => {
                let $s = Pin::new($s);
                $e
            }
            XioConn::Tcp($s) => {
                let $s = Pin::new($s);
                $e
            }
        }
    };
}

impl hyper::rt::Read for XioConn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        both!(self, s => s.poll_read(cx, buf))
    }
}

impl hyper::rt::Write for XioConn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        both!(self, s => s.poll_write(cx, buf))
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        both!(self, s => s.poll_write_vectored(cx, bufs))
    }
    fn is_write_vectored(&self) -> bool {
        match self {
            XioConn::Xio(s) => s.is_write_vectored(),
            XioConn::Tcp(s) => s.is_write_vectored(),
        }
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, s => s.poll_flush(cx))
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        both!(self, s => s.poll_shutdown(cx))
    }
}

/// A hyper-util connector over X-IO (see the crate docs).
#[derive(Clone, Debug)]
pub struct XioConnector {
    /// `None`: the process-wide pool's, as of each connection (so a
    /// restarted manager is picked up).
    net: Option<Net>,
    tcp_fallback: bool,
    /// Refuse `https` URIs (see [`XioConnector::enforce_http`]).
    enforce_http: bool,
    /// Limit on the fallback's TCP dials (see
    /// [`XioConnector::connect_timeout`]).
    connect_timeout: Option<Duration>,
}

impl XioConnector {
    /// A connector on the process-wide pool ([`Net::global`]). Fails if
    /// the pool's manager cannot be reached now; later connections attach
    /// again by themselves if it is restarted.
    pub fn new() -> io::Result<Self> {
        Net::global()?;
        Ok(Self {
            net: None,
            tcp_fallback: false,
            enforce_http: true,
            connect_timeout: None,
        })
    }

    /// A connector on the process-wide pool that attaches when it
    /// connects, so it builds where no manager runs yet (a client started
    /// before its manager): while none runs, each connection fails as
    /// refused (with a message that says how to start one), and X-IO is
    /// used as soon as one does. X-IO only, unlike [`XioConnector::or_tcp`].
    pub fn lazy() -> Self {
        Self {
            net: None,
            tcp_fallback: false,
            enforce_http: true,
            connect_timeout: None,
        }
    }

    /// A connector on `net`.
    pub fn with_net(net: Net) -> Self {
        Self {
            net: Some(net),
            tcp_fallback: false,
            enforce_http: true,
            connect_timeout: None,
        }
    }

    /// Dials over TCP when the address has no X-IO listener on this node
    /// (not when its listener refuses for a full backlog, or its process
    /// does not read its control socket: see the crate docs).
    pub fn with_tcp_fallback(mut self) -> Self {
        self.tcp_fallback = true;
        self
    }

    /// How long the TCP fallback may take to connect, as hyper-util's
    /// `HttpConnector::set_connect_timeout`: divided evenly across the
    /// addresses the host has, each dial failing with `TimedOut` when its
    /// share runs out. Default `None`: a dial waits as long as the kernel
    /// retries its SYN (about two minutes on Linux for an address that
    /// never answers). The X-IO attempt before it is not counted: it asks
    /// the manager on this node, within the control timeout.
    pub fn connect_timeout(mut self, timeout: Option<Duration>) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Whether `https` URIs (any scheme but `http`) are refused
    /// (`InvalidInput`), as hyper's `HttpConnector` does by default: this connector speaks no TLS, and
    /// hyper-util's client sends whatever it connects plain, so an
    /// `https` request would leave unencrypted (over TCP too, with the
    /// fallback). On by default; turn it off only under a TLS connector
    /// that wraps this one (hyper-rustls's, or tonic's with a TLS
    /// config), which passes the `https` URI down and encrypts itself.
    pub fn enforce_http(mut self, on: bool) -> Self {
        self.enforce_http = on;
        self
    }

    /// A connector on the process-wide pool that dials TCP wherever X-IO
    /// cannot: the address has no X-IO listener on this node, or no X-IO
    /// manager runs here at all (the same binary on a node without X-IO).
    /// Unlike [`XioConnector::new`] it never fails to build.
    pub fn or_tcp() -> Self {
        Self {
            net: None,
            tcp_fallback: true,
            enforce_http: true,
            connect_timeout: None,
        }
    }
}

/// The addresses a URI's authority names, port 80 for http and 443 for
/// https if absent (a host name is looked up off the runtime's threads,
/// as hyper's own connector does).
async fn uri_addrs(uri: &http::Uri) -> io::Result<Vec<SocketAddr>> {
    let host = uri
        .host()
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}")))?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    let port = uri
        .port_u16()
        .unwrap_or(if uri.scheme_str() == Some("https") {
            443
        } else {
            80
        });
    if let Ok(ip) = host.parse::<std::net::IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let addrs: Vec<SocketAddr> = tokio::net::lookup_host((host, port)).await?.collect();
    if addrs.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("no address for {uri}"),
        ));
    }
    Ok(addrs)
}

/// Why an X-IO dial failed.
enum Dial {
    /// The connect itself (the manager refused the address, say).
    Connect(io::Error),
    /// The listener's answer to the SYN: refused (`ConnectionRefused`).
    Listener(io::Error),
}

/// Connects to `addr` over X-IO and waits for the listener's answer (one
/// round trip over shared memory), as TCP's connect waits for the
/// SYN-ACK: a refusal must come here, as a connect error (hyper-util's
/// `is_connect`: the request never left, so it is safe to retry) where
/// the next address or TCP can still be tried, not as the request's error
/// after it was written.
async fn dial(net: Option<&Net>, addr: SocketAddr) -> Result<XioStream, Dial> {
    let s = match net {
        Some(net) => XioStream::connect_with(net, addr).await,
        None => XioStream::connect(addr).await,
    }
    .map_err(Dial::Connect)?;
    match s.connected().await {
        Ok(()) => Ok(s),
        Err(e) if e.kind() == io::ErrorKind::ConnectionRefused => Err(Dial::Listener(e)),
        Err(e) => Err(Dial::Connect(e)),
    }
}

impl tower_service::Service<http::Uri> for XioConnector {
    type Response = XioConn;
    type Error = io::Error;
    type Future = Pin<Box<dyn Future<Output = io::Result<XioConn>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: http::Uri) -> Self::Future {
        let net = self.net.clone();
        let fallback = self.tcp_fallback;
        let enforce_http = self.enforce_http;
        let connect_timeout = self.connect_timeout;
        Box::pin(async move {
            // Any scheme but `http`, as `HttpConnector` does: `wss` (say)
            // asks for TLS as much as `https` does.
            if enforce_http && uri.scheme() != Some(&http::uri::Scheme::HTTP) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{uri}: this connector speaks no TLS (wrap it in a TLS connector \
                         and call `enforce_http(false)`, or use http://)"
                    ),
                ));
            }
            // Every address the name has, in order (`localhost` may be
            // ::1 first, where only 127.0.0.1 is listened on).
            let addrs = uri_addrs(&uri).await?;
            let mut refused = None;
            // A refusal by a listener bound here (its backlog full), or
            // by the manager for a process bound here that does not read
            // its control socket (stopped, stuck): the service is on this
            // node, so no TCP.
            let mut busy = None;
            for &addr in &addrs {
                let mut dialled = dial(net.as_ref(), addr).await;
                // A route this process learnt earlier may be stale (the
                // address handed over, or now served on TCP only); the
                // refusal made the net forget it, so a second dial asks
                // the manager: it refuses an address nobody binds, and
                // finds a new owner. A refusal by the listener it names
                // is the listener's own (its backlog is full).
                if matches!(&dialled, Err(Dial::Listener(_))) {
                    dialled = dial(net.as_ref(), addr).await;
                }
                match dialled {
                    Ok(s) => return Ok(XioConn::Xio(TokioIo::new(s))),
                    Err(Dial::Listener(e)) => busy = Some(e),
                    Err(Dial::Connect(e)) if bound_here_but_busy(&e) => busy = Some(e),
                    Err(Dial::Connect(e)) if e.kind() == io::ErrorKind::ConnectionRefused => {
                        refused = Some(e)
                    }
                    Err(Dial::Connect(e)) => {
                        refused = Some(e);
                        break;
                    }
                }
            }
            if let Some(e) = busy {
                return Err(e);
            }
            let e = refused.expect("at least one address");
            if !(fallback
                && matches!(
                    e.kind(),
                    io::ErrorKind::ConnectionRefused | io::ErrorKind::NotFound
                ))
            {
                return Err(e);
            }
            tracing::debug!(?addrs, "no X-IO listener here; dialling TCP");
            let s = tcp_connect(&addrs, connect_timeout).await.map_err(|t| {
                // Say that both ways were tried, not only TCP's.
                io::Error::new(t.kind(), format!("X-IO: {e}; then TCP to {uri}: {t}"))
            })?;
            // As hyper-util's `HttpConnector`: a socket without
            // `TCP_NODELAY` still works, only slower.
            if let Err(e) = s.set_nodelay(true) {
                tracing::warn!(error = %e, "TCP_NODELAY not set on the fallback connection");
            }
            Ok(XioConn::Tcp(TokioIo::new(s)))
        })
    }
}

/// Whether a connect's `ConnectionRefused` is the manager's
/// [`ErrorCode::Busy`](xio_core::ErrorCode::Busy): a process on
/// this node binds the address but does not read its control socket. The
/// kind callers see is the same as for an address nobody binds; only the
/// stack's error inside (the `io::Error`'s source) tells them apart.
fn bound_here_but_busy(e: &io::Error) -> bool {
    matches!(
        e.get_ref()
            .and_then(|i| i.downcast_ref::<xio_core::Error>()),
        Some(xio_core::Error::Refused {
            code: xio_core::ErrorCode::Busy,
            ..
        })
    )
}

/// Dials `addrs` over TCP in turn, as `TcpStream::connect` does (the last
/// error if none answers), each within its even share of `timeout`, as
/// hyper-util's `HttpConnector` divides its connect timeout.
async fn tcp_connect(
    addrs: &[SocketAddr],
    timeout: Option<Duration>,
) -> io::Result<tokio::net::TcpStream> {
    let each = timeout.and_then(|t| t.checked_div(u32::try_from(addrs.len()).unwrap_or(u32::MAX)));
    let mut last = None;
    for &addr in addrs {
        let dialled = match each {
            Some(t) => match tokio::time::timeout(t, tokio::net::TcpStream::connect(addr)).await {
                Ok(r) => r,
                Err(_) => Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("{addr}: connect timed out after {t:?}"),
                )),
            },
            None => tokio::net::TcpStream::connect(addr).await,
        };
        match dialled {
            Ok(s) => return Ok(s),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to dial")))
}

/// Which HTTP versions [`serve`] speaks.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Protocol {
    /// HTTP/1.1 and HTTP/2 with prior knowledge, detected per connection.
    #[default]
    Auto,
    /// HTTP/1.1 only.
    Http1,
    /// HTTP/2 with prior knowledge (h2c) only.
    Http2,
}

/// A stop signal for [`serve`]: `shutdown()` stops accepting and lets the
/// connections in progress finish.
#[derive(Clone, Debug, Default)]
pub struct Shutdown(
    std::sync::Arc<tokio::sync::Notify>,
    std::sync::Arc<std::sync::atomic::AtomicBool>,
);

impl Shutdown {
    /// A new signal.
    pub fn new() -> Self {
        Self::default()
    }

    /// Stops the server (graceful).
    pub fn shutdown(&self) {
        self.1.store(true, std::sync::atomic::Ordering::SeqCst);
        self.0.notify_waiters();
    }

    async fn wait(&self) {
        let notified = self.0.notified();
        if self.1.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        notified.await;
    }
}

/// Spawns a connection of [`serve_on`]'s that finishes gracefully (its
/// `graceful_shutdown`) when `stop` changes, and drops `stop` when it ends.
macro_rules! spawn_conn {
    ($conn:expr, $stop:expr) => {{
        let conn = $conn;
        let mut stop = $stop;
        tokio::spawn(async move {
            let mut conn = std::pin::pin!(conn);
            let r = tokio::select! {
                r = conn.as_mut() => r,
                _ = stop.changed() => {
                    conn.as_mut().graceful_shutdown();
                    conn.await
                }
            };
            if let Err(e) = r {
                tracing::debug!(error = %e, "connection ended with an error");
            }
            drop(stop);
        });
    }};
}

/// Serves `service` on every connection `listener` accepts, until
/// `shutdown` fires; then waits for the connections in progress to finish
/// their requests (graceful) and returns. HTTP/1 upgrades (a WebSocket's
/// handshake, say) work as with hyper's own servers: the service answers
/// 101 and takes the connection with `hyper::upgrade::on`.
pub async fn serve<S, B>(
    listener: XioListener,
    service: S,
    protocol: Protocol,
    shutdown: Shutdown,
) -> io::Result<()>
where
    S: HyperService<http::Request<Incoming>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    serve_on(Some(listener), None, service, protocol, shutdown).await
}

/// [`serve`] on an X-IO listener and a TCP listener at once: the same
/// service for peers on this node (X-IO) and on others (TCP), as when a
/// deployment moves some of them away. Either listener may be absent.
pub async fn serve_on<S, B>(
    xio: Option<XioListener>,
    tcp: Option<tokio::net::TcpListener>,
    service: S,
    protocol: Protocol,
    shutdown: Shutdown,
) -> io::Result<()>
where
    S: HyperService<http::Request<Incoming>, Response = http::Response<B>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
    B: hyper::body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // The connections in progress: each holds a receiver, told to finish
    // at a graceful shutdown, which waits until all of them dropped
    // theirs. (hyper-util's `GracefulShutdown` cannot watch hyper's HTTP/1
    // connection with upgrades, which `Protocol::Http1` needs.)
    let (stop_conns, conn_stopped) = tokio::sync::watch::channel(());
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // With a timer, hyper closes an HTTP/1 connection whose request head
    // does not come within its header-read timeout (30 s by default);
    // without one it waits for good, and so would a graceful shutdown.
    builder.http1().timer(TokioTimer::new());
    builder.http2().timer(TokioTimer::new());
    let mut h1 = hyper::server::conn::http1::Builder::new();
    h1.timer(TokioTimer::new());
    // Only `Auto` goes through the auto builder with upgrades: that one
    // ignores `http1_only` and `http2_only`, and would serve either
    // version whatever `protocol` says.
    let builder = match protocol {
        Protocol::Http2 => builder.http2_only(),
        Protocol::Auto | Protocol::Http1 => builder,
    };
    let (mut xio, mut tcp) = (Paced::new(xio), Paced::new(tcp));
    loop {
        let conn = tokio::select! {
            s = xio.accept() => XioConn::Xio(TokioIo::new(s)),
            s = tcp.accept() => {
                if let Err(e) = s.set_nodelay(true) {
                    tracing::debug!(error = %e, "TCP_NODELAY not set");
                }
                XioConn::Tcp(TokioIo::new(s))
            }
            () = shutdown.wait() => break,
        };
        let stop = conn_stopped.clone();
        // With upgrades: a WebSocket (or any `Upgrade:`) handshake hands
        // the service the connection, as hyper's own servers allow (an
        // HTTP/2 one, extended CONNECT, is hyper's h2 server's own).
        match protocol {
            Protocol::Auto => spawn_conn!(
                builder
                    .serve_connection_with_upgrades(conn, service.clone())
                    .into_owned(),
                stop
            ),
            Protocol::Http1 => spawn_conn!(
                h1.serve_connection(conn, service.clone()).with_upgrades(),
                stop
            ),
            Protocol::Http2 => spawn_conn!(
                builder.serve_connection(conn, service.clone()).into_owned(),
                stop
            ),
        }
    }
    drop((xio, tcp, conn_stopped));
    // Every connection is told (those that start waiting later see the
    // value changed), and each drops its receiver when it ends.
    stop_conns.send_replace(());
    stop_conns.closed().await;
    Ok(())
}

/// A listener [`serve_on`] accepts on.
trait Accept {
    type Conn;
    fn accept(&self) -> impl Future<Output = io::Result<Self::Conn>> + Send + '_;
}

impl Accept for XioListener {
    type Conn = XioStream;
    async fn accept(&self) -> io::Result<XioStream> {
        XioListener::accept(self).await.map(|(s, _)| s)
    }
}

impl Accept for tokio::net::TcpListener {
    type Conn = tokio::net::TcpStream;
    async fn accept(&self) -> io::Result<tokio::net::TcpStream> {
        tokio::net::TcpListener::accept(self).await.map(|(s, _)| s)
    }
}

/// One of [`serve_on`]'s listeners, with its own pause after an accept
/// error. An accept error is no reason to stop serving (nor to drop the
/// connections in progress): one connection's trouble is skipped,
/// anything else (out of fds, say) waits a moment first, as axum's and
/// tonic's loops do. The pause is this listener's alone: the other one
/// (X-IO beside TCP) goes on accepting meanwhile.
struct Paced<L> {
    listener: Option<L>,
    /// Until when accepting waits, after an error.
    paused: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl<L: Accept> Paced<L> {
    fn new(listener: Option<L>) -> Self {
        Self {
            listener,
            paused: None,
        }
    }

    /// The next connection; never, without a listener. Cancellation safe
    /// (a pause in progress goes on at the next call).
    async fn accept(&mut self) -> L::Conn {
        let Some(l) = &self.listener else {
            return std::future::pending().await;
        };
        loop {
            if let Some(p) = self.paused.as_mut() {
                p.await;
                self.paused = None;
            }
            match l.accept().await {
                Ok(c) => return c,
                Err(e) if xio_tokio::is_connection_error(&e) => {}
                Err(e) => {
                    tracing::error!(error = %e, "accept failed; retrying in 1 s");
                    self.paused = Some(Box::pin(tokio::time::sleep(ACCEPT_PAUSE)));
                }
            }
        }
    }
}

/// The pause after an accept error that is not one connection's.
const ACCEPT_PAUSE: Duration = Duration::from_secs(1);

/// tonic's server side: `Server::builder().add_service(svc)
/// .serve_with_incoming(xio_hyper::incoming(listener))` (feature `tonic`).
#[cfg(feature = "tonic")]
pub fn incoming(listener: XioListener) -> XioIncoming {
    XioIncoming {
        listener,
        paused: None,
    }
}

/// The stream of accepted connections [`incoming`] returns.
///
/// An accept error is an item, as with tonic's own `TcpIncoming`; after
/// one that is not one connection's (out of fds, say) the stream waits a
/// second before it accepts again. tonic's server loop takes the next
/// item at once after an error, so an error that persists would
/// otherwise spin it in one poll, starving its runtime's other tasks.
#[cfg(feature = "tonic")]
#[derive(Debug)]
pub struct XioIncoming {
    listener: XioListener,
    /// Until when accepting waits, after an error.
    paused: Option<Pin<Box<tokio::time::Sleep>>>,
}

#[cfg(feature = "tonic")]
impl futures_core::Stream for XioIncoming {
    type Item = io::Result<GrpcStream>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        if let Some(p) = this.paused.as_mut() {
            std::task::ready!(p.as_mut().poll(cx));
            this.paused = None;
        }
        match this.listener.poll_accept(cx) {
            Poll::Ready(Ok((s, peer))) => {
                let local = s.local_addr().ok();
                Poll::Ready(Some(Ok(GrpcStream {
                    inner: s,
                    local,
                    peer,
                })))
            }
            Poll::Ready(Err(e)) => {
                if !xio_tokio::is_connection_error(&e) {
                    tracing::error!(error = %e, "accept failed; retrying in 1 s");
                    this.paused = Some(Box::pin(tokio::time::sleep(ACCEPT_PAUSE)));
                }
                Poll::Ready(Some(Err(e)))
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// An accepted X-IO stream as tonic's server needs it (`Connected`).
#[cfg(feature = "tonic")]
#[derive(Debug)]
pub struct GrpcStream {
    inner: XioStream,
    local: Option<SocketAddr>,
    peer: SocketAddr,
}

/// As TCP's, so `Request::remote_addr()` and `local_addr()` work in a
/// tonic service unchanged (the peer's address is the client stack's,
/// `127.88.x.y`, IPv4-mapped when it dialled an IPv6 address: see
/// `xio_core::net`).
#[cfg(feature = "tonic")]
impl tonic::transport::server::Connected for GrpcStream {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;
    fn connect_info(&self) -> Self::ConnectInfo {
        tonic::transport::server::TcpConnectInfo {
            local_addr: self.local,
            remote_addr: Some(self.peer),
        }
    }
}

#[cfg(feature = "tonic")]
impl tokio::io::AsyncRead for GrpcStream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

#[cfg(feature = "tonic")]
impl tokio::io::AsyncWrite for GrpcStream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }
    fn is_write_vectored(&self) -> bool {
        true
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

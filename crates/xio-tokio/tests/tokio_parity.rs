//! Differential tests: the same async scenario run against
//! `tokio::net::TcpListener` / `TcpStream` over loopback TCP and against
//! [`XioListener`] / [`XioStream`] (an embedded manager, a server net and
//! a client net), comparing what a program sees: byte counts, data,
//! readiness and `io::ErrorKind`s. The crate promises that a tokio
//! service ports by changing the type names; where X-IO differs on
//! purpose (said in the crate docs, "Where it differs from tokio's
//! `TcpStream`"), the difference is listed in [`KNOWN`], which pins both
//! sides. (The blocking counterpart is xio-core's `std_parity.rs`.)
//!
//! The scenarios are written once, against [`Family`] / [`Lst`] /
//! [`Strm`], whose methods are tokio's own names: the two implementations
//! are the same macro expanded for each type.
//!
//! Not compared, because X-IO lacks them on purpose: `TcpSocket` (no
//! socket options before connecting), `from_std` / `into_std` of kernel
//! sockets (X-IO's convert to and from `xio_core`'s types: `tests/tokio.rs`),
//! and `tokio-stream`'s `TcpListenerStream` (an accept loop is
//! `loop { l.accept().await }`). The [`wakers`] module compares how many
//! waiting futures are woken, and when.

#[path = "../../xio-core/tests/common/parity.rs"]
mod parity;
#[path = "../../xio-core/tests/common/process_dir.rs"]
mod process_dir;

use std::future::Future;
use std::io::{self, IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, Interest};
use xio_core::manager::{Manager, ManagerHandle};
use xio_tokio::{Net, XioListener, XioStream};

/// Generous: a guard against hangs, not a performance bound.
const WATCHDOG: Duration = Duration::from_secs(120);

/// A stream's calls a scenario uses, with tokio's names and signatures
/// (`AsyncRead` / `AsyncWrite` come with the type).
trait Strm: AsyncRead + AsyncWrite + Unpin + Send + Sized + 'static {
    type R: AsyncRead + Unpin + Send + 'static;
    type W: AsyncWrite + Unpin + Send + 'static;
    fn peek(&self, b: &mut [u8]) -> impl Future<Output = io::Result<usize>>;
    fn readable(&self) -> impl Future<Output = io::Result<()>>;
    fn writable(&self) -> impl Future<Output = io::Result<()>>;
    fn ready(&self, i: Interest) -> impl Future<Output = io::Result<tokio::io::Ready>>;
    fn poll_read_ready(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>>;
    fn poll_write_ready(&self, cx: &mut std::task::Context<'_>) -> std::task::Poll<io::Result<()>>;
    fn ttl(&self) -> io::Result<u32>;
    fn set_ttl(&self, ttl: u32) -> io::Result<()>;
    fn linger(&self) -> io::Result<Option<Duration>>;
    fn set_zero_linger(&self) -> io::Result<()>;
    fn try_read(&self, b: &mut [u8]) -> io::Result<usize>;
    fn try_write(&self, b: &[u8]) -> io::Result<usize>;
    fn try_read_vectored(&self, b: &mut [IoSliceMut<'_>]) -> io::Result<usize>;
    fn try_write_vectored(&self, b: &[IoSlice<'_>]) -> io::Result<usize>;
    fn local_addr(&self) -> io::Result<SocketAddr>;
    fn peer_addr(&self) -> io::Result<SocketAddr>;
    fn set_nodelay(&self, on: bool) -> io::Result<()>;
    fn nodelay(&self) -> io::Result<bool>;
    fn take_error(&self) -> io::Result<Option<io::Error>>;
    #[allow(clippy::type_complexity)]
    fn split(
        &mut self,
    ) -> (
        impl AsyncRead + Unpin + Send + '_,
        impl AsyncWrite + Unpin + Send + '_,
    );
    fn into_split(self) -> (Self::R, Self::W);
    /// `OwnedReadHalf::reunite` (the error's halves dropped).
    fn reunite(r: Self::R, w: Self::W) -> Result<Self, ()>;
    /// `OwnedWriteHalf::forget`.
    fn forget(w: Self::W);
}

/// A listener's calls a scenario uses.
trait Lst: Sized + Send + 'static {
    type S: Strm;
    fn accept(&self) -> impl Future<Output = io::Result<(Self::S, SocketAddr)>>;
    fn local_addr(&self) -> io::Result<SocketAddr>;
    fn ttl(&self) -> io::Result<u32>;
    fn set_ttl(&self, ttl: u32) -> io::Result<()>;
}

macro_rules! same_api {
    ($l:ty, $s:ty, $r:ty, $w:ty) => {
        impl Strm for $s {
            type R = $r;
            type W = $w;
            async fn peek(&self, b: &mut [u8]) -> io::Result<usize> {
                <$s>::peek(self, b).await
            }
            async fn readable(&self) -> io::Result<()> {
                <$s>::readable(self).await
            }
            async fn writable(&self) -> io::Result<()> {
                <$s>::writable(self).await
            }
            async fn ready(&self, i: Interest) -> io::Result<tokio::io::Ready> {
                <$s>::ready(self, i).await
            }
            fn poll_read_ready(
                &self,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<io::Result<()>> {
                <$s>::poll_read_ready(self, cx)
            }
            fn poll_write_ready(
                &self,
                cx: &mut std::task::Context<'_>,
            ) -> std::task::Poll<io::Result<()>> {
                <$s>::poll_write_ready(self, cx)
            }
            fn ttl(&self) -> io::Result<u32> {
                <$s>::ttl(self)
            }
            fn set_ttl(&self, ttl: u32) -> io::Result<()> {
                <$s>::set_ttl(self, ttl)
            }
            fn linger(&self) -> io::Result<Option<Duration>> {
                <$s>::linger(self)
            }
            fn set_zero_linger(&self) -> io::Result<()> {
                <$s>::set_zero_linger(self)
            }
            fn try_read(&self, b: &mut [u8]) -> io::Result<usize> {
                <$s>::try_read(self, b)
            }
            fn try_write(&self, b: &[u8]) -> io::Result<usize> {
                <$s>::try_write(self, b)
            }
            fn try_read_vectored(&self, b: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
                <$s>::try_read_vectored(self, b)
            }
            fn try_write_vectored(&self, b: &[IoSlice<'_>]) -> io::Result<usize> {
                <$s>::try_write_vectored(self, b)
            }
            fn local_addr(&self) -> io::Result<SocketAddr> {
                <$s>::local_addr(self)
            }
            fn peer_addr(&self) -> io::Result<SocketAddr> {
                <$s>::peer_addr(self)
            }
            fn set_nodelay(&self, on: bool) -> io::Result<()> {
                <$s>::set_nodelay(self, on)
            }
            fn nodelay(&self) -> io::Result<bool> {
                <$s>::nodelay(self)
            }
            fn take_error(&self) -> io::Result<Option<io::Error>> {
                <$s>::take_error(self)
            }
            fn split(
                &mut self,
            ) -> (
                impl AsyncRead + Unpin + Send + '_,
                impl AsyncWrite + Unpin + Send + '_,
            ) {
                <$s>::split(self)
            }
            fn into_split(self) -> ($r, $w) {
                <$s>::into_split(self)
            }
            fn reunite(r: $r, w: $w) -> Result<Self, ()> {
                r.reunite(w).map_err(drop)
            }
            fn forget(w: $w) {
                w.forget()
            }
        }

        impl Lst for $l {
            type S = $s;
            async fn accept(&self) -> io::Result<($s, SocketAddr)> {
                <$l>::accept(self).await
            }
            fn local_addr(&self) -> io::Result<SocketAddr> {
                <$l>::local_addr(self)
            }
            fn ttl(&self) -> io::Result<u32> {
                <$l>::ttl(self)
            }
            fn set_ttl(&self, ttl: u32) -> io::Result<()> {
                <$l>::set_ttl(self, ttl)
            }
        }
    };
}

same_api!(
    tokio::net::TcpListener,
    tokio::net::TcpStream,
    tokio::net::tcp::OwnedReadHalf,
    tokio::net::tcp::OwnedWriteHalf
);
same_api!(
    XioListener,
    XioStream,
    xio_tokio::OwnedReadHalf,
    xio_tokio::OwnedWriteHalf
);

/// Where a scenario runs: binding and connecting, and a pause for what
/// travels between the ends to arrive.
trait Family {
    type L: Lst;
    fn bind(&self, a: SocketAddr) -> impl Future<Output = io::Result<Self::L>>;
    fn connect(&self, a: SocketAddr) -> impl Future<Output = io::Result<<Self::L as Lst>::S>>;
    /// Lets what is in flight arrive (a moment; not a bound on anything).
    async fn settle(&self) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

struct Tcp;

impl Family for Tcp {
    type L = tokio::net::TcpListener;
    async fn bind(&self, a: SocketAddr) -> io::Result<tokio::net::TcpListener> {
        tokio::net::TcpListener::bind(a).await
    }
    async fn connect(&self, a: SocketAddr) -> io::Result<tokio::net::TcpStream> {
        tokio::net::TcpStream::connect(a).await
    }
}

/// X-IO: listeners on one net, connects from another (two stacks of one
/// pool, real shared-memory channels between them), both driven by the
/// runtime the scenario runs on.
struct Xio {
    server: Net,
    client: Net,
}

impl Family for Xio {
    type L = XioListener;
    async fn bind(&self, a: SocketAddr) -> io::Result<XioListener> {
        XioListener::bind_with(&self.server, a)
    }
    async fn connect(&self, a: SocketAddr) -> io::Result<XioStream> {
        XioStream::connect_with(&self.client, a).await
    }
}

fn manager(test: &str) -> (ManagerHandle, String) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let dir = process_dir::process_dir("xio-tokio-parity");
        std::env::set_var("XIO_RUN_DIR", &dir);
    });
    let p = format!("tp-{test}-{}", std::process::id());
    (Manager::builder(&p).spawn().unwrap(), p)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// What a scenario saw, step by step.
#[derive(Default)]
struct Log(Vec<(&'static str, String)>);

impl Log {
    /// Adds a step (shown as it happens with --nocapture: a scenario
    /// stopped by the watchdog shows where it waits).
    fn push(&mut self, step: &'static str, s: String) {
        eprintln!("  {step}: {s}");
        self.0.push((step, s));
    }
    /// Records `r` as `Ok(value)` or `Err(kind)`.
    fn r<T: std::fmt::Debug>(&mut self, step: &'static str, r: io::Result<T>) {
        let s = match r {
            Ok(v) => format!("Ok({v:?})"),
            Err(e) => format!("Err({:?})", e.kind()),
        };
        self.push(step, s);
    }
    /// Records a read's outcome with the bytes it read.
    fn read(&mut self, step: &'static str, r: io::Result<usize>, buf: &[u8]) {
        let s = match r {
            Ok(n) => format!("Ok({n}, {:?})", String::from_utf8_lossy(&buf[..n])),
            Err(e) => format!("Err({:?})", e.kind()),
        };
        self.push(step, s);
    }
    fn v<T: std::fmt::Debug>(&mut self, step: &'static str, v: T) {
        self.push(step, format!("{v:?}"));
    }
}

/// The loopback address with `port` (the same in both worlds: X-IO
/// addresses are its own, so loopback means nothing special to it).
fn lo(port: u16) -> SocketAddr {
    SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port))
}

/// A connected pair: (client, server, listener).
async fn pair<F: Family>(f: &F) -> (<F::L as Lst>::S, <F::L as Lst>::S, F::L) {
    let l = f.bind(lo(0)).await.unwrap();
    let c = f.connect(l.local_addr().unwrap()).await.unwrap();
    let (s, _) = l.accept().await.unwrap();
    (c, s, l)
}

/// A difference from tokio that X-IO makes on purpose (documented in the
/// crate docs): in scenario `scenario`, step `step` gives `tcp` over TCP
/// and `xio` here.
struct Known {
    scenario: &'static str,
    step: &'static str,
    tcp: &'static str,
    xio: &'static str,
}

const KNOWN: &[Known] = &[
    // `XioStream::local_addr`: X-IO clients do not bind; a connecting
    // stream's address is made from its process's stack id.
    Known {
        scenario: "addresses_and_options",
        step: "client's ip is the listener's",
        tcp: "true",
        xio: "false",
    },
    // `XioStream::connect` (and the crate docs): a connect over a route
    // the net knows returns before the listener answers; a refusal is the
    // first read's.
    Known {
        scenario: "unspecified_and_dropped_listeners",
        step: "connect again",
        tcp: "Err(ConnectionRefused)",
        xio: "Ok(())",
    },
    // Crate docs: an IPv4 client of a listener bound to `[::]` is
    // accepted with its IPv4 addresses (Linux's dual-stack socket maps
    // them into IPv6, `::ffff:a.b.c.d`).
    Known {
        scenario: "ipv6",
        step: "v4 client to [::]",
        tcp: "Ok((true, \"::ffff:127.0.0.1\", [102, 111, 117, 114]))",
        xio: "Ok((false, \"127.0.0.1\", [102, 111, 117, 114]))",
    },
    // Crate docs (`XioStream::ready`): `WRITE_CLOSED` is not reported
    // (Linux's EPOLLHUP, once both directions are shut or on a reset).
    Known {
        scenario: "peer_dropped_with_unread_data",
        step: "ready(READABLE | WRITABLE) after the reset",
        tcp: "Ok(Ready { is_readable: true, is_writable: true, is_read_closed: true, is_write_closed: true, is_error: false, is_priority: false })",
        xio: "Ok(Ready { is_readable: true, is_writable: true, is_read_closed: true, is_write_closed: false, is_error: false, is_priority: false })",
    },
    Known {
        scenario: "readiness_after_own_shutdown",
        step: "ready when both are shut",
        tcp: "Ok(Ready { is_readable: true, is_writable: true, is_read_closed: true, is_write_closed: true, is_error: false, is_priority: false })",
        xio: "Ok(Ready { is_readable: true, is_writable: true, is_read_closed: true, is_write_closed: false, is_error: false, is_priority: false })",
    },
    // Crate docs (`XioStream::ready`): `ERROR` alone is refused, there is
    // no wait for an error alone.
    Known {
        scenario: "peer_dropped_with_unread_data",
        step: "ready(ERROR) alone",
        tcp: "Ok(Ready { is_readable: false, is_writable: false, is_read_closed: false, is_write_closed: false, is_error: true, is_priority: false })",
        xio: "Err(Unsupported)",
    },
];

/// Runs `scenario` against tokio TCP, then against X-IO, and compares the
/// logs step by step.
fn differential<A, B>(name: &'static str, tcp: A, xio: B)
where
    A: for<'a> FnOnce(&'a Tcp, &'a mut Log) -> std::pin::Pin<Box<dyn Future<Output = ()> + 'a>>,
    B: for<'a> FnOnce(&'a Xio, &'a mut Log) -> std::pin::Pin<Box<dyn Future<Output = ()> + 'a>>,
{
    let mut want = Log::default();
    let rt = runtime();
    rt.block_on(async {
        tokio::time::timeout(WATCHDOG, tcp(&Tcp, &mut want))
            .await
            .expect("watchdog: the TCP scenario hangs")
    });
    drop(rt);
    let (_mgr, p) = manager(name);
    let x = Xio {
        server: Net::attach(&p).unwrap(),
        client: Net::attach(&p).unwrap(),
    };
    let mut got = Log::default();
    let rt = runtime();
    rt.block_on(async {
        tokio::time::timeout(WATCHDOG, xio(&x, &mut got))
            .await
            .expect("watchdog: the X-IO scenario hangs")
    });
    drop(x);
    drop(rt);
    parity::judge(name, "tokio TCP", &want.0, &got.0, |n, step| {
        KNOWN
            .iter()
            .find(|k| k.scenario == n && k.step == step)
            .map(|k| (k.tcp, k.xio))
    });
}

/// One test per scenario: the scenario's generic function, run in both
/// worlds.
macro_rules! scenarios {
    ($($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                differential(
                    stringify!($name),
                    |f, log| Box::pin(scenario::$name(f, log)),
                    |f, log| Box::pin(scenario::$name(f, log)),
                );
            }
        )*
    };
}

scenarios!(
    shutdown_then_read_and_write,
    peer_dropped_cleanly,
    peer_dropped_with_unread_data,
    write_to_a_peer_that_closed,
    try_io_and_readiness,
    peek,
    split_and_reunite,
    addresses_and_options,
    listening_and_connecting,
    cancellation_and_timeouts,
    buffered_and_helpers,
    proxy_to_tcp,
    reset_seen_by_take_error_and_by_a_waiting_writer,
    big_transfers_then_shutdown_or_drop,
    accepting_after_the_client_left,
    readiness_after_own_shutdown,
    waits_ended_by_the_peer,
    unspecified_and_dropped_listeners,
    ipv6,
    data_then_reset,
    readiness_kept_until_would_block,
    ttl_and_linger,
);

/// Reads until end of stream or an error: the bytes, then how it ended.
async fn drain(r: &mut (impl AsyncRead + Unpin)) -> (String, io::Result<usize>) {
    let mut got = Vec::new();
    let mut b = [0u8; 64];
    let end = loop {
        match r.read(&mut b).await {
            Ok(0) => break Ok(0),
            Ok(n) => got.extend_from_slice(&b[..n]),
            Err(e) => break Err(e),
        }
    };
    (String::from_utf8_lossy(&got).into_owned(), end)
}

/// Reads exactly `n` bytes (the peer wrote them in pieces that may
/// arrive together or apart).
async fn exactly(r: &mut (impl AsyncRead + Unpin), n: usize) -> String {
    let mut b = vec![0u8; n];
    r.read_exact(&mut b).await.unwrap();
    String::from_utf8(b).unwrap()
}

mod scenario {
    use super::*;

    pub async fn shutdown_then_read_and_write<F: Family>(f: &F, log: &mut Log) {
        let (mut c, mut s, _l) = pair(f).await;
        log.r("write before", c.write(b"abc").await);
        log.r("shutdown", c.shutdown().await);
        log.r("write after", c.write(b"x").await);
        log.r("write_all after", c.write_all(b"xy").await);
        log.r("empty write after", c.write(b"").await);
        log.r("shutdown again", c.shutdown().await);
        log.r("flush after", c.flush().await);
        let (got, end) = drain(&mut s).await;
        log.v("peer reads all", got);
        log.r("peer's end", end);
        let mut b = [0u8; 8];
        log.r("peer reads after the end", s.read(&mut b).await);
        log.r("peer readable at the end", s.readable().await);
        log.r("peer try_read at the end", s.try_read(&mut b));
        log.r("peer writes back", s.write_all(b"back").await);
        let r = c.read(&mut b).await;
        log.read("read back", r, &b);
        log.r("peer shuts down", s.shutdown().await);
        log.r("then the end", c.read(&mut b).await);
        log.r("write still fails", c.write(b"y").await);
    }

    pub async fn peer_dropped_cleanly<F: Family>(f: &F, log: &mut Log) {
        let (mut c, mut s, _l) = pair(f).await;
        log.r("peer writes", s.write_all(b"bye").await);
        drop(s);
        let (got, end) = drain(&mut c).await;
        log.v("read all", got);
        log.r("the end", end);
        let mut b = [0u8; 8];
        log.r("read again", c.read(&mut b).await);
        log.r("peek at the end", c.peek(&mut b).await);
        log.r("try_read at the end", c.try_read(&mut b));
        log.r(
            "try_read_vectored at the end",
            c.try_read_vectored(&mut [IoSliceMut::new(&mut b)]),
        );
        log.r("readable", c.readable().await);
        log.r("ready(READABLE)", c.ready(Interest::READABLE).await);
        log.r(
            "ready(READABLE | WRITABLE)",
            c.ready(Interest::READABLE | Interest::WRITABLE).await,
        );
        log.r("take_error", c.take_error().map(|e| e.map(|e| e.kind())));
        log.v("peer_addr is ok", c.peer_addr().is_ok());
        log.r("shutdown after the end", c.shutdown().await);
        log.r("write after own shutdown", c.write(b"x").await);
    }

    pub async fn peer_dropped_with_unread_data<F: Family>(f: &F, log: &mut Log) {
        let (mut c, s, _l) = pair(f).await;
        log.r("write", c.write_all(b"unread").await);
        let mut b = [0u8; 8];
        log.r("peer peeks", s.peek(&mut b[..1]).await);
        drop(s);
        f.settle().await;
        log.r("readable", c.readable().await);
        log.r(
            "ready(READABLE | WRITABLE) after the reset",
            c.ready(Interest::READABLE | Interest::WRITABLE).await,
        );
        log.r("ready(ERROR) alone", c.ready(Interest::ERROR).await);
        log.r("read", c.read(&mut b).await);
        log.r("read after", c.read(&mut b).await);
        log.r("try_read after", c.try_read(&mut b));
        log.r("write", c.write(b"x").await);
        log.r("take_error", c.take_error().map(|e| e.map(|e| e.kind())));
        log.v("local_addr is ok", c.local_addr().is_ok());
        log.r("shutdown after the reset", c.shutdown().await);
        log.r("write after shutdown", c.write(b"x").await);
    }

    pub async fn write_to_a_peer_that_closed<F: Family>(f: &F, log: &mut Log) {
        let (mut c, s, _l) = pair(f).await;
        drop(s);
        let mut b = [0u8; 8];
        log.r("reads the end", c.read(&mut b).await);
        // Linux: the first write is taken, the peer answers with a reset
        // (in CLOSE_WAIT, an EPIPE), and the writes after it fail. Only
        // once the reset is back is this deterministic: a settle between.
        log.r("first write", c.write(b"x").await);
        f.settle().await;
        log.r("second write", c.write(b"x").await);
        log.r("third write", c.write(b"x").await);
        log.r("write_all", c.write_all(b"xyz").await);
        log.r("try_write", c.try_write(b"x"));
        log.r("writable", c.writable().await);
        log.r("read after", c.read(&mut b).await);
    }

    pub async fn try_io_and_readiness<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f).await;
        let mut b = [0u8; 16];
        log.r("try_read, nothing queued", c.try_read(&mut b));
        log.r(
            "try_read_vectored, nothing queued",
            c.try_read_vectored(&mut [IoSliceMut::new(&mut b)]),
        );
        log.r("try_read into nothing, nothing queued", c.try_read(&mut []));
        log.r("writable", c.writable().await);
        log.r(
            "ready(WRITABLE)",
            c.ready(Interest::WRITABLE).await.map(|r| r.is_writable()),
        );
        log.r("try_write", c.try_write(b"abcd"));
        log.r(
            "try_write_vectored",
            c.try_write_vectored(&[IoSlice::new(b"ef"), IoSlice::new(b""), IoSlice::new(b"gh")]),
        );
        log.r("try_write of nothing", c.try_write(b""));
        // Read it all with the readiness style: readable, then try_read
        // until WouldBlock.
        let mut got = Vec::new();
        while got.len() < 8 {
            s.readable().await.unwrap();
            loop {
                match s.try_read(&mut b) {
                    Ok(n) => got.extend_from_slice(&b[..n]),
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                    Err(e) => panic!("{e}"),
                }
            }
        }
        log.v("peer reads", String::from_utf8_lossy(&got).into_owned());
        log.r("peer: nothing more", s.try_read(&mut b));
        log.r(
            "peer ready(READABLE | WRITABLE), nothing queued",
            s.ready(Interest::READABLE | Interest::WRITABLE).await,
        );
        // A vectored read of queued bytes fills the buffers in order.
        log.r("try_write more", c.try_write(b"0123456789"));
        s.readable().await.unwrap();
        let mut all = [0u8; 10];
        while s.peek(&mut all).await.unwrap() < 10 {
            f.settle().await;
        }
        let (mut x, mut y) = ([0u8; 3], [0u8; 4]);
        let r = s.try_read_vectored(&mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)]);
        log.v("try_read_vectored", (r.map_err(|e| e.kind()), x, y));
        let r = s.try_read(&mut b);
        log.read("the rest", r, &b);
        // After a FIN (once it is there: tokio reports the readiness it
        // last saw until the reactor hears of the FIN).
        drop(c);
        f.settle().await;
        log.r("readable after the FIN", s.readable().await);
        log.r(
            "ready after the FIN",
            s.ready(Interest::READABLE | Interest::WRITABLE).await,
        );
        log.r("try_read after the FIN", s.try_read(&mut b));
    }

    pub async fn peek<F: Family>(f: &F, log: &mut Log) {
        let (mut c, mut s, _l) = pair(f).await;
        log.r("write", c.write_all(b"hello").await);
        let mut b = [0u8; 3];
        let r = s.peek(&mut b).await;
        log.read("peek part", r, &b);
        let mut all = [0u8; 5];
        while s.peek(&mut all).await.unwrap() < 5 {
            f.settle().await;
        }
        let r = s.peek(&mut all).await;
        log.read("peek all", r, &all);
        let mut b = [0u8; 8];
        let r = s.read(&mut b).await;
        log.read("read gets what was peeked", r, &b);
        // Into an empty buffer: tokio's asks the kernel, which says
        // EAGAIN while nothing is queued, so it waits for data.
        let r = tokio::time::timeout(Duration::from_millis(20), s.peek(&mut [])).await;
        log.v(
            "peek into nothing, nothing queued",
            r.map_err(|_| "elapsed").map(|r| r.map_err(|e| e.kind())),
        );
        let r = tokio::time::timeout(Duration::from_millis(20), s.read(&mut [])).await;
        log.v(
            "read into nothing, nothing queued",
            r.map_err(|_| "elapsed").map(|r| r.map_err(|e| e.kind())),
        );
        log.r("write more", c.write_all(b"x").await);
        while s.peek(&mut b).await.unwrap() < 1 {}
        log.r("peek into nothing, data queued", s.peek(&mut []).await);
        log.r("read into nothing, data queued", s.read(&mut []).await);
        let r = s.read(&mut b).await;
        log.read("the data is all there", r, &b);
        log.r("shutdown", c.shutdown().await);
        log.r("peek at the end", s.peek(&mut b).await);
    }

    pub async fn split_and_reunite<F: Family>(f: &F, log: &mut Log) {
        let (mut c, mut s, l) = pair(f).await;
        {
            let (mut r, mut w) = c.split();
            log.r("borrowed write half writes", w.write_all(b"ping").await);
            log.v("peer gets it", exactly(&mut s, 4).await);
            log.r("peer answers", s.write_all(b"pong").await);
            log.v("borrowed read half reads", exactly(&mut r, 4).await);
            log.r("borrowed write half shuts down", w.shutdown().await);
        }
        log.r("the stream can no longer write", c.write(b"x").await);
        let (got, end) = drain(&mut s).await;
        log.v("peer sees the end", (got, end.map_err(|e| e.kind())));
        drop((c, s));

        let c = f.connect(l.local_addr().unwrap()).await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        let (mut r, mut w) = c.into_split();
        log.r("owned write half writes", w.write_all(b"abc").await);
        log.v("peer gets it", exactly(&mut s, 3).await);
        log.r("peer answers", s.write_all(b"def").await);
        log.v("owned read half reads", exactly(&mut r, 3).await);
        // Halves of another stream do not reunite with these.
        let c2 = f.connect(l.local_addr().unwrap()).await.unwrap();
        let (_s2, _) = l.accept().await.unwrap();
        let (r2, w2) = c2.into_split();
        log.v(
            "reunite mismatched",
            <F::L as Lst>::S::reunite(r2, w).is_ok(),
        );
        drop(w2);
        // (w was consumed: split again from a new pair.)
        let c3 = f.connect(l.local_addr().unwrap()).await.unwrap();
        let (mut s3, _) = l.accept().await.unwrap();
        let (r3, w3) = c3.into_split();
        let c3 = <F::L as Lst>::S::reunite(r3, w3);
        log.v("reunite matched", c3.is_ok());
        let mut c3 = c3.unwrap();
        log.r("reunited writes", c3.write_all(b"again").await);
        log.v("peer of reunited gets it", exactly(&mut s3, 5).await);
        // Dropping an owned write half shuts down writing; forget does not.
        let (r3, w3) = c3.into_split();
        <F::L as Lst>::S::forget(w3);
        log.r(
            "peer writes to a forgotten half's stream",
            s3.write_all(b"z").await,
        );
        let mut r3 = r3;
        log.v("read half still reads", exactly(&mut r3, 1).await);
        drop(r);
        drop(r3);
        let (got, end) = drain(&mut s3).await;
        log.v(
            "peer of forgotten sees the end at the drop",
            (got, end.map_err(|e| e.kind())),
        );
        // tokio::io::split works on any AsyncRead + AsyncWrite.
        let c4 = f.connect(l.local_addr().unwrap()).await.unwrap();
        let (mut s4, _) = l.accept().await.unwrap();
        let (mut r4, mut w4) = tokio::io::split(c4);
        log.r("tokio::io::split write", w4.write_all(b"io").await);
        log.v("peer gets it", exactly(&mut s4, 2).await);
        log.r("peer answers", s4.write_all(b"ok").await);
        log.v("tokio::io::split read", exactly(&mut r4, 2).await);
        log.r("tokio::io::split shutdown", w4.shutdown().await);
        let (got, end) = drain(&mut s4).await;
        log.v("peer sees the end", (got, end.map_err(|e| e.kind())));
        log.v("unsplit", r4.is_pair_of(&w4));
    }

    pub async fn addresses_and_options<F: Family>(f: &F, log: &mut Log) {
        let (c, s, l) = pair(f).await;
        let la = l.local_addr().unwrap();
        log.v("port 0 gets a port", (la.ip(), la.port() != 0));
        log.v(
            "connected's peer is the listener",
            c.peer_addr().unwrap() == la,
        );
        log.v(
            "accepted's local is the listener",
            s.local_addr().unwrap() == la,
        );
        log.v(
            "peer of one is local of other",
            s.peer_addr().unwrap() == c.local_addr().unwrap(),
        );
        log.v(
            "client's ip is the listener's",
            c.local_addr().unwrap().ip() == la.ip(),
        );
        log.r("take_error", c.take_error().map(|e| e.is_none()));
        log.r("nodelay by default", c.nodelay());
        log.r("set_nodelay(true)", c.set_nodelay(true));
        log.r("nodelay after set_nodelay(true)", c.nodelay());
        log.r("set_nodelay(false)", c.set_nodelay(false));
        log.r("nodelay after set_nodelay(false)", c.nodelay());
        let c2 = f.connect(la).await.unwrap();
        let (s2, a2) = l.accept().await.unwrap();
        log.v(
            "accept's address is the peer's",
            a2 == s2.peer_addr().unwrap() && a2 == c2.local_addr().unwrap(),
        );
        log.v(
            "two clients, two addresses",
            c2.local_addr().unwrap() != c.local_addr().unwrap(),
        );
    }

    pub async fn listening_and_connecting<F: Family>(f: &F, log: &mut Log) {
        let l = f.bind(lo(0)).await.unwrap();
        let a = l.local_addr().unwrap();
        log.r("bind again", f.bind(a).await.map(drop));
        drop(l);
        log.r("bind after the drop", f.bind(a).await.map(drop));
        let free = a;
        // X-IO may hand back a stream behind its SYN: the refusal is then
        // its first read's (the crate docs); either way it is refused.
        let r = match f.connect(free).await {
            Ok(mut c) => c.read(&mut [0u8; 1]).await.map(drop),
            Err(e) => Err(e),
        };
        log.r("nobody listens", r);
        let l = f.bind(lo(0)).await.unwrap();
        let port = l.local_addr().unwrap().port();
        let any = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port));
        let r = async {
            let c = f.connect(any).await?;
            let (s, a) = l.accept().await?;
            Ok((
                c.peer_addr()? == lo(port),
                a == c.local_addr()?,
                s.local_addr()? == lo(port),
            ))
        }
        .await;
        log.r("0.0.0.0 means this host", r);
        // An accept loop: each connection in order, with its data.
        let mut clients = Vec::new();
        for i in 0..3u8 {
            let mut c = f.connect(lo(port)).await.unwrap();
            c.write_all(&[b'0' + i]).await.unwrap();
            clients.push(c);
        }
        let mut seen = Vec::new();
        for _ in 0..3 {
            let (mut s, a) = l.accept().await.unwrap();
            let mut b = [0u8; 1];
            s.read_exact(&mut b).await.unwrap();
            let who = clients.iter().position(|c| c.local_addr().unwrap() == a);
            seen.push((b[0] as char, who));
        }
        log.v("accept loop", seen);
    }

    pub async fn cancellation_and_timeouts<F: Family>(f: &F, log: &mut Log) {
        let (mut c, mut s, _l) = pair(f).await;
        let mut b = [0u8; 8];
        let r = tokio::time::timeout(Duration::from_millis(20), s.read(&mut b)).await;
        log.v(
            "timeout around a read",
            r.map_err(|_| "elapsed").map(|r| r.map_err(|e| e.kind())),
        );
        // A read dropped mid-wait (select!), then the bytes go to the next.
        let mut b1 = [0u8; 8];
        tokio::select! {
            r = s.read(&mut b1) => log.v("read before the write", r.map_err(|e| e.kind())),
            _ = f.settle() => log.v("read before the write", "dropped mid-wait"),
        }
        log.r("write", c.write_all(b"late").await);
        let r = tokio::time::timeout(WATCHDOG, s.read(&mut b))
            .await
            .unwrap();
        log.read("a new read gets it", r, &b);
        // Same for peek and readable.
        tokio::select! {
            r = s.peek(&mut b1) => log.v("peek before the write", r.map_err(|e| e.kind())),
            _ = f.settle() => log.v("peek before the write", "dropped mid-wait"),
        }
        tokio::select! {
            r = s.readable() => log.v("readable before the write", r.map_err(|e| e.kind())),
            _ = f.settle() => log.v("readable before the write", "dropped mid-wait"),
        }
        log.r("write again", c.write_all(b"more").await);
        let r = tokio::time::timeout(WATCHDOG, s.read(&mut b))
            .await
            .unwrap();
        log.read("a new read gets it again", r, &b);
        // A read_exact cancelled halfway keeps what it took (AsyncReadExt
        // docs: not cancellation safe): the rest comes to the next read.
        log.r("write half", c.write_all(b"ab").await);
        let mut four = [0u8; 4];
        tokio::select! {
            r = s.read_exact(&mut four) => log.v("read_exact of 4 with 2 there", r.map_err(|e| e.kind())),
            _ = f.settle() => log.v("read_exact of 4 with 2 there", "dropped mid-wait"),
        }
        log.r("write the rest", c.write_all(b"cd").await);
        let mut two = [0u8; 2];
        log.r("next read_exact", s.read_exact(&mut two).await);
        log.v(
            "gets the later bytes",
            String::from_utf8_lossy(&two).into_owned(),
        );
    }

    pub async fn buffered_and_helpers<F: Family>(f: &F, log: &mut Log) {
        let (mut c, s, _l) = pair(f).await;
        log.r(
            "write lines",
            c.write_all(b"first line\nsecond line\nno newline").await,
        );
        log.r("shutdown", c.shutdown().await);
        let mut r = tokio::io::BufReader::new(s);
        let mut line = String::new();
        log.r("read_line", r.read_line(&mut line).await);
        log.v("line", line.clone());
        let mut lines = Vec::new();
        let mut ls = r.lines();
        while let Some(l) = ls.next_line().await.unwrap() {
            lines.push(l);
        }
        log.v("lines", lines);
        let s = ls.into_inner().into_inner();
        drop(s);
        // read_to_end, read_to_string, then read_exact at the end.
        let (mut c, mut s, _l) = pair(f).await;
        log.r("write", c.write_all(b"whole").await);
        log.r("write more", c.write_all(b" thing").await);
        log.r("shutdown", c.shutdown().await);
        let mut all = Vec::new();
        log.r("read_to_end", s.read_to_end(&mut all).await);
        log.v("all", String::from_utf8_lossy(&all).into_owned());
        let mut b = [0u8; 4];
        log.r("read_exact at the end", s.read_exact(&mut b).await);
        let mut st = String::new();
        log.r("read_to_string at the end", s.read_to_string(&mut st).await);
        let (mut c, mut s, _l) = pair(f).await;
        log.r("write 2", c.write_all(b"ab").await);
        drop(c);
        log.r(
            "read_exact of 4 with 2 then the end",
            s.read_exact(&mut b).await,
        );
        log.r("read_u8 at the end", s.read_u8().await);
    }

    pub async fn proxy_to_tcp<F: Family>(f: &F, log: &mut Log) {
        // A proxy between this family's stream and a kernel TCP stream:
        // client -> [s | proxy | ts] -> tc.
        let (mut c, mut s, _l) = pair(f).await;
        let tl = tokio::net::TcpListener::bind(lo(0)).await.unwrap();
        let mut tc = tokio::net::TcpStream::connect(tl.local_addr().unwrap())
            .await
            .unwrap();
        let (mut ts, _) = tl.accept().await.unwrap();
        let proxy = tokio::spawn(async move {
            let r = tokio::io::copy_bidirectional(&mut s, &mut ts).await;
            r.map_err(|e| e.kind())
        });
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        log.r("client writes", c.write_all(&data).await);
        let mut through = vec![0u8; data.len()];
        log.r("through the proxy", tc.read_exact(&mut through).await);
        log.v("same bytes", through == data);
        log.r("tcp answers", tc.write_all(b"and back").await);
        log.r("tcp shuts down", tc.shutdown().await);
        log.r("client shuts down", c.shutdown().await);
        let mut back = Vec::new();
        log.r("client reads to the end", c.read_to_end(&mut back).await);
        log.v("back", String::from_utf8_lossy(&back).into_owned());
        let mut rest = Vec::new();
        log.r("tcp reads to the end", tc.read_to_end(&mut rest).await);
        log.v("proxy's counts", proxy.await.unwrap());
    }

    pub async fn reset_seen_by_take_error_and_by_a_waiting_writer<F: Family>(f: &F, log: &mut Log) {
        let (mut c, s, _l) = pair(f).await;
        log.r("write", c.write_all(b"unread").await);
        let mut b = [0u8; 8];
        s.peek(&mut b[..1]).await.unwrap();
        drop(s);
        f.settle().await;
        log.r(
            "take_error says reset",
            c.take_error().map(|e| e.map(|e| e.kind())),
        );
        log.r(
            "take_error once",
            c.take_error().map(|e| e.map(|e| e.kind())),
        );
        log.r("read after", c.read(&mut b).await);
        log.r("write after", c.write(b"x").await);
        // A writer waiting for room (the window or the socket buffer is
        // full) when the peer resets.
        let (mut c, s, _l) = pair(f).await;
        let chunk = vec![7u8; 64 << 10];
        // Hang guard: far more than any window or socket buffer.
        let stop = (0..100_000)
            .find_map(|_| match c.try_write(&chunk) {
                Ok(_) => None,
                Err(e) => Some(e.kind()),
            })
            .expect("the window fills");
        log.v("try_write stopped by", stop);
        let (w, ()) = tokio::join!(c.write(&chunk), async move {
            f.settle().await;
            drop(s);
        });
        log.r("the waiting write", w);
        log.r("a write after", c.write(&chunk).await);
        log.r("a read after", c.read(&mut b).await);
    }

    pub async fn big_transfers_then_shutdown_or_drop<F: Family>(f: &F, log: &mut Log) {
        const BIG: usize = 3 << 20;
        let data: Vec<u8> = (0..BIG).map(|i| (i % 253) as u8).collect();
        // More than a window, then a shutdown: the end comes after it all.
        let (c, mut s, _l) = pair(f).await;
        let d = data.clone();
        let writer = tokio::spawn(async move {
            let mut c = c;
            c.write_all(&d).await.map_err(|e| e.kind())?;
            c.shutdown().await.map_err(|e| e.kind())?;
            Ok::<_, io::ErrorKind>(c)
        });
        let mut got = Vec::new();
        log.r(
            "read_to_end after a shutdown",
            s.read_to_end(&mut got).await,
        );
        log.v("all of it", got == data);
        let c = writer.await.unwrap();
        log.v("writer", c.as_ref().map(drop));
        // The same, dropped instead of shut down: nothing is lost.
        let (c, mut s, _l) = pair(f).await;
        let d = data.clone();
        let writer = tokio::spawn(async move {
            let mut c = c;
            c.write_all(&d).await.map_err(|e| e.kind())
        });
        let mut got = Vec::new();
        log.r("read_to_end after a drop", s.read_to_end(&mut got).await);
        log.v("all of it", got == data);
        log.v("writer", writer.await.unwrap());
        // The other way while this end has shut down (a half-closed
        // stream carries the peer's bytes).
        let (mut c, s, _l) = pair(f).await;
        log.r("shutdown", c.shutdown().await);
        let d = data.clone();
        let writer = tokio::spawn(async move {
            let mut s = s;
            s.write_all(&d).await.map_err(|e| e.kind())
        });
        let mut got = vec![0u8; BIG];
        log.r("read it all", c.read_exact(&mut got).await.map(drop));
        log.v("all of it", got == data);
        log.v("writer", writer.await.unwrap());
        log.r("then the end", c.read(&mut got).await);
    }

    pub async fn accepting_after_the_client_left<F: Family>(f: &F, log: &mut Log) {
        let l = f.bind(lo(0)).await.unwrap();
        let a = l.local_addr().unwrap();
        // An accept dropped mid-wait loses nothing.
        tokio::select! {
            r = l.accept() => log.v("accept before any connect", r.map(drop).map_err(|e| e.kind())),
            _ = f.settle() => log.v("accept before any connect", "dropped mid-wait"),
        }
        let mut c = f.connect(a).await.unwrap();
        let ca = c.local_addr().unwrap();
        log.r("write", c.write_all(b"hi").await);
        log.r("shutdown", c.shutdown().await);
        drop(c);
        f.settle().await;
        let (mut s, peer) = l.accept().await.unwrap();
        log.v("accepted the client", peer == ca);
        let mut got = Vec::new();
        log.r("read_to_end", s.read_to_end(&mut got).await);
        log.v("got", String::from_utf8_lossy(&got).into_owned());
        log.r("write to the gone client", s.write(b"x").await);
        // Connected and dropped without a word.
        let c = f.connect(a).await.unwrap();
        drop(c);
        f.settle().await;
        let (mut s, _) = l.accept().await.unwrap();
        log.r("read of a silent client gone", s.read(&mut [0u8; 4]).await);
    }

    pub async fn readiness_after_own_shutdown<F: Family>(f: &F, log: &mut Log) {
        let (mut c, mut s, _l) = pair(f).await;
        log.r("shutdown", c.shutdown().await);
        f.settle().await;
        log.r("writable after own shutdown", c.writable().await);
        log.r("try_write after own shutdown", c.try_write(b"x"));
        log.r(
            "try_write_vectored after own shutdown",
            c.try_write_vectored(&[IoSlice::new(b"x")]),
        );
        let r = tokio::time::timeout(Duration::from_millis(20), c.readable()).await;
        log.v(
            "readable with nothing to read",
            r.map_err(|_| "elapsed").map(|r| r.map_err(|e| e.kind())),
        );
        log.r("peer reads the end", s.read(&mut [0u8; 4]).await);
        log.r("peer writes", s.write_all(b"still").await);
        log.r("readable then", c.readable().await);
        let mut b = [0u8; 8];
        let r = c.try_read(&mut b);
        log.read("try_read then", r, &b);
        drop(s);
        f.settle().await;
        log.r(
            "ready when both are shut",
            c.ready(Interest::READABLE | Interest::WRITABLE).await,
        );
        log.r("read the end", c.read(&mut b).await);
    }

    pub async fn waits_ended_by_the_peer<F: Family>(f: &F, log: &mut Log) {
        // readable() waiting, then the peer shuts down.
        let (c, mut s, _l) = pair(f).await;
        let (r, ()) = tokio::join!(c.readable(), async {
            f.settle().await;
            s.shutdown().await.unwrap();
        });
        log.r("readable waiting, peer shuts down", r);
        log.r("try_read then", c.try_read(&mut [0u8; 4]));
        // peek waiting, then the peer resets.
        let (mut c, s, _l) = pair(f).await;
        c.write_all(b"unread").await.unwrap();
        s.peek(&mut [0u8; 1]).await.unwrap();
        let mut b = [0u8; 4];
        let (r, ()) = tokio::join!(c.peek(&mut b), async move {
            f.settle().await;
            drop(s);
        });
        log.r("peek waiting, peer resets", r);
        log.r("read then", c.read(&mut b).await);
        // writable() waiting for room, then the peer resets.
        let (c, s, _l) = pair(f).await;
        let chunk = vec![7u8; 64 << 10];
        (0..100_000)
            .find_map(|_| c.try_write(&chunk).err())
            .expect("the window fills");
        let (r, ()) = tokio::join!(c.writable(), async move {
            f.settle().await;
            drop(s);
        });
        log.r("writable waiting, peer resets", r);
        log.r("try_write then", c.try_write(&chunk));
        log.r("try_write again", c.try_write(&chunk));
        log.r(
            "ready(WRITABLE) then",
            c.ready(Interest::WRITABLE).await.map(|r| r.is_writable()),
        );
        // A read half's read waiting while the write half is dropped: the
        // read goes on waiting, and gets what the peer sends.
        let (c, mut s, _l) = pair(f).await;
        let (mut r, w) = c.into_split();
        let mut b = [0u8; 8];
        let (n, ()) = tokio::join!(r.read(&mut b), async {
            f.settle().await;
            drop(w);
            let mut e = [0u8; 1];
            assert_eq!(s.read(&mut e).await.unwrap(), 0);
            s.write_all(b"after").await.unwrap();
        });
        log.read("read half after the write half went", n, &b);
    }

    pub async fn unspecified_and_dropped_listeners<F: Family>(f: &F, log: &mut Log) {
        let any = SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, 0));
        let l = f.bind(any).await.unwrap();
        let la = l.local_addr().unwrap();
        log.v("unspecified stays so", la.ip().is_unspecified());
        let c = f.connect(lo(la.port())).await.unwrap();
        let (s, a) = l.accept().await.unwrap();
        log.r(
            "accepted's local is the address connected to",
            s.local_addr().map(|x| x == lo(la.port())),
        );
        log.r("client's peer", c.peer_addr().map(|x| x == lo(la.port())));
        log.r("accept's address", c.local_addr().map(|x| x == a));
        // A listener dropped with a connection it never accepted.
        let l = f.bind(lo(0)).await.unwrap();
        let a = l.local_addr().unwrap();
        let mut c = f.connect(a).await.unwrap();
        log.r("write before", c.write(b"hello").await);
        f.settle().await;
        drop(l);
        let mut b = [0u8; 8];
        log.r("read", c.read(&mut b).await);
        log.r("read again", c.read(&mut b).await);
        log.r("write", c.write(b"x").await);
        let again = f.connect(a).await;
        log.r(
            "connect again",
            again.as_ref().map(drop).map_err(|e| e.kind().into()),
        );
        let r = match again {
            Ok(mut c) => c.read(&mut b).await,
            Err(e) => Err(e),
        };
        log.r("connect again, then read", r);
    }

    pub async fn ipv6<F: Family>(f: &F, log: &mut Log) {
        // A host without IPv6 loopback (a container started with it off)
        // has no TCP side to compare with: both sides log nothing.
        if std::net::TcpListener::bind("[::1]:0").is_err() {
            eprintln!("ipv6: skipped: ::1 cannot be bound here");
            return;
        }
        let lo6 = |port| SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
        let l = f.bind(lo6(0)).await.unwrap();
        let a = l.local_addr().unwrap();
        log.v("bound", (a.ip(), a.port() != 0));
        let mut c = f.connect(a).await.unwrap();
        let (mut s, peer) = l.accept().await.unwrap();
        log.r("peer is the client", c.local_addr().map(|x| x == peer));
        log.v("client is v6", peer.is_ipv6());
        log.r("write", c.write_all(b"six").await);
        log.v("read", exactly(&mut s, 3).await);
        // An IPv4 client to a listener on [::] (Linux is dual-stack by
        // default: it is accepted, as a v4-mapped address). Not where
        // the host made v6 sockets v6-only.
        let dual =
            std::fs::read_to_string("/proc/sys/net/ipv6/bindv6only").is_ok_and(|s| s.trim() == "0");
        if !dual {
            return;
        }
        let any6 = SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, 0));
        let l = f.bind(any6).await.unwrap();
        let port = l.local_addr().unwrap().port();
        let r = async {
            let mut c = f.connect(lo(port)).await?;
            c.write_all(b"four").await?;
            let (mut s, peer) = l.accept().await?;
            let mut b = [0u8; 4];
            s.read_exact(&mut b).await?;
            Ok((peer.to_string(), s.local_addr()?.ip().to_string(), b))
        }
        .await;
        log.r(
            "v4 client to [::]",
            r.map(|(p, l, b)| (p.starts_with("[::ffff:127.0.0.1]"), l, b)),
        );
    }

    pub async fn data_then_reset<F: Family>(f: &F, log: &mut Log) {
        // The peer writes, then closes with bytes it never read: the bytes
        // it wrote were there before its reset.
        let (mut c, mut s, _l) = pair(f).await;
        log.r("write", c.write_all(b"unread").await);
        s.peek(&mut [0u8; 1]).await.unwrap();
        log.r("peer writes", s.write_all(b"data").await);
        c.peek(&mut [0u8; 1]).await.unwrap();
        drop(s);
        f.settle().await;
        let mut b = [0u8; 8];
        let r = c.read(&mut b).await;
        log.read("read", r, &b);
        log.r("read again", c.read(&mut b).await);
        // Through a BufReader.
        let (mut c, mut s, _l) = pair(f).await;
        c.write_all(b"unread").await.unwrap();
        s.peek(&mut [0u8; 1]).await.unwrap();
        s.write_all(b"line\n").await.unwrap();
        c.peek(&mut [0u8; 1]).await.unwrap();
        drop(s);
        f.settle().await;
        let mut r = tokio::io::BufReader::new(c);
        let mut line = String::new();
        log.r("read_line", r.read_line(&mut line).await);
        log.v("line", line.clone());
        line.clear();
        log.r("read_line again", r.read_line(&mut line).await);
        log.r("read_line after", r.read_line(&mut line).await);
    }

    /// tokio keeps a socket's readiness until an operation meets
    /// `WouldBlock` (its `ScheduledIo`), and starts an accepted socket
    /// read- and write-ready (tokio#8435): a readiness check says ready
    /// where a read or write would wait, and the operation then clears it.
    pub async fn readiness_kept_until_would_block<F: Family>(f: &F, log: &mut Log) {
        use futures_util::FutureExt;
        let now = |r: Option<io::Result<()>>| match r {
            None => "pending".to_string(),
            Some(r) => format!("{:?}", r.map_err(|e| e.kind())),
        };
        let (mut c, mut s, _l) = pair(f).await;
        f.settle().await;
        log.v(
            "fresh accepted: readable now",
            now(s.readable().now_or_never()),
        );
        log.v(
            "fresh accepted: poll_read_ready now",
            now(std::future::poll_fn(|cx| s.poll_read_ready(cx)).now_or_never()),
        );
        log.v(
            "fresh accepted: writable now",
            now(s.writable().now_or_never()),
        );
        log.r("fresh accepted: try_read", s.try_read(&mut [0u8; 4]));
        log.v("then readable now", now(s.readable().now_or_never()));
        log.v(
            "fresh client: readable now",
            now(c.readable().now_or_never()),
        );
        log.v(
            "fresh client: writable now",
            now(c.writable().now_or_never()),
        );
        // Reads: kept after `read_exact` took everything.
        c.write_all(b"hello").await.unwrap();
        let mut b = [0u8; 5];
        s.read_exact(&mut b).await.unwrap();
        log.v(
            "after read_exact took all: readable now",
            now(s.readable().now_or_never()),
        );
        log.v(
            "and ready(READABLE) now",
            s.ready(Interest::READABLE)
                .now_or_never()
                .map(|r| r.map(|r| r.is_readable()).map_err(|e| e.kind())),
        );
        log.r("try_read", s.try_read(&mut b));
        log.v(
            "after WouldBlock: readable now",
            now(s.readable().now_or_never()),
        );
        log.v(
            "after WouldBlock: poll_read_ready now",
            now(std::future::poll_fn(|cx| s.poll_read_ready(cx)).now_or_never()),
        );
        // Ready again once data comes, and woken for it.
        let (r, ()) = tokio::join!(s.readable(), async {
            f.settle().await;
            c.write_all(b"more").await.unwrap();
        });
        log.r("readable when data comes", r);
        let mut four = [0u8; 4];
        s.read_exact(&mut four).await.unwrap();
        // Writes: kept after 512 writes of 4,000 bytes that all went.
        let chunk = vec![1u8; 4000];
        let went = (0..512).take_while(|_| s.try_write(&chunk).is_ok()).count();
        log.v("512 try_writes of 4,000 bytes go", went);
        log.v("after them: writable now", now(s.writable().now_or_never()));
        let stopped = (0..100_000).find_map(|_| s.try_write(&chunk).err());
        log.v("try_write until", stopped.map(|e| e.kind()));
        log.v(
            "after WouldBlock: writable now",
            now(s.writable().now_or_never()),
        );
        log.v(
            "after WouldBlock: poll_write_ready now",
            now(std::future::poll_fn(|cx| s.poll_write_ready(cx)).now_or_never()),
        );
        // Writable again once the peer reads, and woken for it.
        let (w, ()) = tokio::join!(s.writable(), async {
            f.settle().await;
            let mut sink = vec![0u8; 1 << 16];
            let mut left = went * 4000;
            while left > 0 {
                left -= c.read(&mut sink[..left.min(1 << 16)]).await.unwrap();
            }
        });
        log.r("writable when the peer reads", w);
    }

    /// `IP_TTL` and `SO_LINGER` as ported code sets and reads them: a TTL
    /// of 1 to 255 is kept (an accepted stream starts with its
    /// listener's), and a zero linger closes with a reset.
    pub async fn ttl_and_linger<F: Family>(f: &F, log: &mut Log) {
        let l = f.bind(lo(0)).await.unwrap();
        log.r("listener ttl", l.ttl());
        log.r("listener set_ttl(77)", l.set_ttl(77));
        log.r("listener ttl then", l.ttl());
        log.r("listener set_ttl(0)", l.set_ttl(0));
        let mut c = f.connect(l.local_addr().unwrap()).await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        log.r("client ttl", c.ttl());
        log.r("accepted ttl", s.ttl());
        log.r("set_ttl(100)", c.set_ttl(100));
        log.r("ttl then", c.ttl());
        log.r("set_ttl(0)", c.set_ttl(0));
        log.r("set_ttl(256)", c.set_ttl(256));
        log.r("ttl after refusals", c.ttl());
        log.r("linger", c.linger());
        log.r("set_zero_linger", c.set_zero_linger());
        log.r("linger then", c.linger());
        // An abortive close: the peer reads what came, then the reset.
        log.r("write", c.write_all(b"last").await);
        let mut b = [0u8; 4];
        s.read_exact(&mut b).await.unwrap();
        drop(c);
        f.settle().await;
        log.r(
            "peer reads after the zero-linger close",
            s.read(&mut b).await,
        );
        log.r("then", s.read(&mut b).await);
        // Without a linger, a close is the end of stream.
        let mut c = f.connect(l.local_addr().unwrap()).await.unwrap();
        let (mut s, _) = l.accept().await.unwrap();
        log.r("write", c.write_all(b"x").await);
        s.read_exact(&mut b[..1]).await.unwrap();
        log.r("shutdown", c.shutdown().await);
        drop(c);
        log.r("peer reads after a plain close", s.read(&mut b).await);
    }
}

/// Waker retention: many tasks waiting on one listener or one stream are
/// all woken when it becomes ready, and none before (tokio keeps every
/// waiting future's waker in the socket's waiter list). Each scenario is
/// a test over tokio's TCP types and its twin over X-IO, on the
/// multi-thread and the current-thread runtime: a difference shows as one
/// failing twin.
mod wakers {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    use std::task::{Context, Wake, Waker};

    /// How many futures wait at once.
    const TASKS: usize = 50;

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Polls each future once with its own counting waker (all must
    /// wait), lets the runtime run a while (nothing may wake them), then
    /// does `make_ready` and waits until every one was woken. Returns how
    /// many were woken early.
    async fn all_woken_once<'a, T>(
        mut futs: Vec<std::pin::Pin<Box<dyn Future<Output = T> + 'a>>>,
        make_ready: impl Future<Output = ()>,
    ) -> usize {
        let counts: Vec<Arc<Count>> = futs.iter().map(|_| Arc::default()).collect();
        for (f, c) in futs.iter_mut().zip(&counts) {
            let w = Waker::from(c.clone());
            assert!(
                f.as_mut().poll(&mut Context::from_waker(&w)).is_pending(),
                "a future did not wait"
            );
        }
        // A moment for anything that would wake them early.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let early = counts
            .iter()
            .filter(|c| c.0.load(Ordering::Relaxed) > 0)
            .count();
        make_ready.await;
        let mut looks = 0u32;
        while counts.iter().any(|c| c.0.load(Ordering::Relaxed) == 0) {
            looks += 1;
            let left = counts
                .iter()
                .filter(|c| c.0.load(Ordering::Relaxed) == 0)
                .count();
            // A watchdog, not a time bound.
            assert!(
                looks < 60_000,
                "{left} of {TASKS} waiting futures never woken"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        drop(futs);
        early
    }

    pub async fn accept<F: Family>(f: &F) {
        let l = f.bind(lo(0)).await.unwrap();
        let a = l.local_addr().unwrap();
        let futs = (0..TASKS)
            .map(|_| Box::pin(l.accept()) as std::pin::Pin<Box<dyn Future<Output = _>>>)
            .collect();
        let mut client = None;
        let early = all_woken_once(futs, async {
            client = Some(f.connect(a).await.unwrap());
        })
        .await;
        assert_eq!(early, 0, "accept futures woken before a connection came");
        // The connection is still there for the next accept.
        l.accept().await.unwrap();
    }

    pub async fn readable<F: Family>(f: &F) {
        let (mut c, s, _l) = pair(f).await;
        // The client's side: not read-ready at first.
        let futs = (0..TASKS)
            .map(|_| Box::pin(c.readable()) as std::pin::Pin<Box<dyn Future<Output = _>>>)
            .collect();
        let mut s = s;
        let early = all_woken_once(futs, async {
            s.write_all(b"x").await.unwrap();
        })
        .await;
        assert_eq!(early, 0, "readable futures woken before data came");
        let mut b = [0u8; 1];
        c.read_exact(&mut b).await.unwrap();
    }

    pub async fn writable<F: Family>(f: &F) {
        let (c, mut s, _l) = pair(f).await;
        let chunk = vec![7u8; 64 << 10];
        let mut sent = 0;
        while let Ok(n) = c.try_write(&chunk) {
            sent += n;
        }
        let futs = (0..TASKS)
            .map(|_| Box::pin(c.writable()) as std::pin::Pin<Box<dyn Future<Output = _>>>)
            .collect();
        let early = all_woken_once(futs, async {
            let mut sink = vec![0u8; 64 << 10];
            while sent > 0 {
                sent -= s.read(&mut sink[..sent.min(64 << 10)]).await.unwrap();
            }
        })
        .await;
        assert_eq!(early, 0, "writable futures woken before the peer read");
    }

    fn rt(multi: bool) -> tokio::runtime::Runtime {
        if multi {
            runtime()
        } else {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        }
    }

    fn on_tcp(
        multi: bool,
        scenario: impl for<'a> FnOnce(&'a Tcp) -> std::pin::Pin<Box<dyn Future<Output = ()> + 'a>>,
    ) {
        rt(multi).block_on(async {
            tokio::time::timeout(WATCHDOG, scenario(&Tcp))
                .await
                .expect("watchdog: the scenario hangs")
        });
    }

    fn on_xio(
        name: &str,
        multi: bool,
        scenario: impl for<'a> FnOnce(&'a Xio) -> std::pin::Pin<Box<dyn Future<Output = ()> + 'a>>,
    ) {
        let (_mgr, p) = manager(name);
        let rt = rt(multi);
        let x = rt.block_on(async {
            Xio {
                server: Net::attach(&p).unwrap(),
                client: Net::attach(&p).unwrap(),
            }
        });
        rt.block_on(async {
            tokio::time::timeout(WATCHDOG, scenario(&x))
                .await
                .expect("watchdog: the scenario hangs")
        });
        drop(x);
    }

    macro_rules! twins {
        ($($scenario:ident: $tcp_m:ident $tcp_c:ident $xio_m:ident $xio_c:ident;)*) => {$(
            #[test]
            fn $tcp_m() {
                on_tcp(true, |f| Box::pin($scenario(f)));
            }
            #[test]
            fn $tcp_c() {
                on_tcp(false, |f| Box::pin($scenario(f)));
            }
            #[test]
            fn $xio_m() {
                on_xio(stringify!($xio_m), true, |f| Box::pin($scenario(f)));
            }
            #[test]
            fn $xio_c() {
                on_xio(stringify!($xio_c), false, |f| Box::pin($scenario(f)));
            }
        )*};
    }

    twins! {
        accept: accept_tcp_multi accept_tcp_current accept_xio_multi accept_xio_current;
        readable: readable_tcp_multi readable_tcp_current readable_xio_multi readable_xio_current;
        writable: writable_tcp_multi writable_tcp_current writable_xio_multi writable_xio_current;
    }
}

//! The std-parity scenarios, written once against [`Family`] / [`Lst`] /
//! [`Strm`] (std's own names): xio-core's `std_parity` runs them over
//! std and over X-IO's types; xio-preload's runs them over std in a
//! process under `LD_PRELOAD=libxio_preload.so` and without. Included
//! with `#[path]`; the includer provides `WATCHDOG`.
#![allow(dead_code)]

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use super::WATCHDOG;

/// Calls `$m!` with the name of every scenario.
macro_rules! with_scenarios {
    ($m:ident) => {
        $m!(
            write_after_own_shutdown_write,
            read_after_own_shutdown_read,
            shutdown_both_twice,
            peer_closes_cleanly,
            peer_closes_with_unread_data,
            timeouts,
            nonblocking_listener_and_stream,
            empty_reads_and_writes,
            vectored,
            binding,
            connecting,
            addresses,
            options_and_clones,
            listener_dropped_with_unaccepted,
            nonblocking_writes_fill_then_drain,
            write_timeout_takes_part,
            shutdown_from_another_thread_ends_a_blocked_call,
            several_addresses_and_after_shutdown,
            strict_addresses,
            ttl,
            reset_seen_through_take_error_then_nonblocking,
            peek_reports_a_reset_once,
        );
    };
}

/// A stream's calls a scenario uses, with std's names and signatures.
pub trait Strm: Sized + Send + 'static {
    fn read(&self, b: &mut [u8]) -> io::Result<usize>;
    fn read_vectored(&self, b: &mut [IoSliceMut<'_>]) -> io::Result<usize>;
    fn write(&self, b: &[u8]) -> io::Result<usize>;
    fn write_vectored(&self, b: &[IoSlice<'_>]) -> io::Result<usize>;
    fn peek(&self, b: &mut [u8]) -> io::Result<usize>;
    fn shutdown(&self, how: Shutdown) -> io::Result<()>;
    fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    fn read_timeout(&self) -> io::Result<Option<Duration>>;
    fn write_timeout(&self) -> io::Result<Option<Duration>>;
    fn set_nonblocking(&self, nb: bool) -> io::Result<()>;
    fn local_addr(&self) -> io::Result<SocketAddr>;
    fn peer_addr(&self) -> io::Result<SocketAddr>;
    fn take_error(&self) -> io::Result<Option<io::Error>>;
    fn try_clone(&self) -> io::Result<Self>;
    fn set_nodelay(&self, on: bool) -> io::Result<()>;
    fn nodelay(&self) -> io::Result<bool>;
    fn set_ttl(&self, ttl: u32) -> io::Result<()>;
    fn ttl(&self) -> io::Result<u32>;
}

/// A listener's calls a scenario uses.
pub trait Lst: Sized + Send + 'static {
    type S: Strm;
    fn accept(&self) -> io::Result<(Self::S, SocketAddr)>;
    fn local_addr(&self) -> io::Result<SocketAddr>;
    fn set_nonblocking(&self, nb: bool) -> io::Result<()>;
    fn take_error(&self) -> io::Result<Option<io::Error>>;
    fn try_clone(&self) -> io::Result<Self>;
    fn incoming(&self) -> Box<dyn Iterator<Item = io::Result<Self::S>> + '_>;
    fn set_ttl(&self, ttl: u32) -> io::Result<()>;
    fn ttl(&self) -> io::Result<u32>;
}

macro_rules! same_api {
    ($l:ty, $s:ty) => {
        impl Strm for $s {
            fn read(&self, b: &mut [u8]) -> io::Result<usize> {
                Read::read(&mut &*self, b)
            }
            fn read_vectored(&self, b: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
                Read::read_vectored(&mut &*self, b)
            }
            fn write(&self, b: &[u8]) -> io::Result<usize> {
                Write::write(&mut &*self, b)
            }
            fn write_vectored(&self, b: &[IoSlice<'_>]) -> io::Result<usize> {
                Write::write_vectored(&mut &*self, b)
            }
            fn peek(&self, b: &mut [u8]) -> io::Result<usize> {
                <$s>::peek(self, b)
            }
            fn shutdown(&self, how: Shutdown) -> io::Result<()> {
                <$s>::shutdown(self, how)
            }
            fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
                <$s>::set_read_timeout(self, t)
            }
            fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
                <$s>::set_write_timeout(self, t)
            }
            fn read_timeout(&self) -> io::Result<Option<Duration>> {
                <$s>::read_timeout(self)
            }
            fn write_timeout(&self) -> io::Result<Option<Duration>> {
                <$s>::write_timeout(self)
            }
            fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
                <$s>::set_nonblocking(self, nb)
            }
            fn local_addr(&self) -> io::Result<SocketAddr> {
                <$s>::local_addr(self)
            }
            fn peer_addr(&self) -> io::Result<SocketAddr> {
                <$s>::peer_addr(self)
            }
            fn take_error(&self) -> io::Result<Option<io::Error>> {
                <$s>::take_error(self)
            }
            fn try_clone(&self) -> io::Result<Self> {
                <$s>::try_clone(self)
            }
            fn set_nodelay(&self, on: bool) -> io::Result<()> {
                <$s>::set_nodelay(self, on)
            }
            fn nodelay(&self) -> io::Result<bool> {
                <$s>::nodelay(self)
            }
            fn set_ttl(&self, ttl: u32) -> io::Result<()> {
                <$s>::set_ttl(self, ttl)
            }
            fn ttl(&self) -> io::Result<u32> {
                <$s>::ttl(self)
            }
        }

        impl Lst for $l {
            type S = $s;
            fn accept(&self) -> io::Result<($s, SocketAddr)> {
                <$l>::accept(self)
            }
            fn local_addr(&self) -> io::Result<SocketAddr> {
                <$l>::local_addr(self)
            }
            fn set_nonblocking(&self, nb: bool) -> io::Result<()> {
                <$l>::set_nonblocking(self, nb)
            }
            fn take_error(&self) -> io::Result<Option<io::Error>> {
                <$l>::take_error(self)
            }
            fn try_clone(&self) -> io::Result<Self> {
                <$l>::try_clone(self)
            }
            fn set_ttl(&self, ttl: u32) -> io::Result<()> {
                <$l>::set_ttl(self, ttl)
            }
            fn ttl(&self) -> io::Result<u32> {
                <$l>::ttl(self)
            }
            fn incoming(&self) -> Box<dyn Iterator<Item = io::Result<$s>> + '_> {
                Box::new(<$l>::incoming(self))
            }
        }
    };
}

same_api!(TcpListener, TcpStream);

/// Where a scenario runs: binding and connecting, and a pause for what
/// travels between the ends to arrive (a sleep for the kernel; for X-IO,
/// whose processes move data when they call into their net, each net has
/// a thread waiting in it, as a live server process has).
pub trait Family {
    type L: Lst;
    fn bind(&self, a: SocketAddr) -> io::Result<Self::L>;
    fn connect(&self, a: SocketAddr) -> io::Result<<Self::L as Lst>::S>;
    fn connect_timeout(&self, a: SocketAddr, t: Duration) -> io::Result<<Self::L as Lst>::S>;
    /// Binds the first of `a` that can be bound (std's `bind` over a
    /// `ToSocketAddrs` of several).
    fn bind_any(&self, a: &[SocketAddr]) -> io::Result<Self::L>;
    /// Binds as code that relies on bind's address check needs: std's
    /// bind; a net with strict addresses for X-IO.
    fn bind_strict(&self, a: SocketAddr) -> io::Result<Self::L> {
        self.bind(a)
    }
    /// Connects to the first of `a` that answers.
    fn connect_any(&self, a: &[SocketAddr]) -> io::Result<<Self::L as Lst>::S>;
    /// Lets what is in flight arrive (a moment; not a bound on anything).
    fn settle(&self) {
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub struct Std;

impl Family for Std {
    type L = TcpListener;
    fn bind(&self, a: SocketAddr) -> io::Result<TcpListener> {
        TcpListener::bind(a)
    }
    fn connect(&self, a: SocketAddr) -> io::Result<TcpStream> {
        TcpStream::connect(a)
    }
    fn connect_timeout(&self, a: SocketAddr, t: Duration) -> io::Result<TcpStream> {
        TcpStream::connect_timeout(&a, t)
    }
    fn bind_any(&self, a: &[SocketAddr]) -> io::Result<TcpListener> {
        TcpListener::bind(a)
    }
    fn connect_any(&self, a: &[SocketAddr]) -> io::Result<TcpStream> {
        TcpStream::connect(a)
    }
}

/// What a scenario saw, step by step.
#[derive(Default)]
pub struct Log(pub Vec<(&'static str, String)>);

impl Log {
    /// Records `r` as `Ok(value)` or `Err(kind)`.
    pub fn r<T: std::fmt::Debug>(&mut self, step: &'static str, r: io::Result<T>) {
        let s = match r {
            Ok(v) => format!("Ok({v:?})"),
            Err(e) => format!("Err({:?})", e.kind()),
        };
        self.0.push((step, s));
    }
    /// Records a read's outcome with the bytes it read.
    pub fn read(&mut self, step: &'static str, r: io::Result<usize>, buf: &[u8]) {
        let s = match r {
            Ok(n) => format!("Ok({n}, {:?})", String::from_utf8_lossy(&buf[..n])),
            Err(e) => format!("Err({:?})", e.kind()),
        };
        self.0.push((step, s));
    }
    pub fn v<T: std::fmt::Debug>(&mut self, step: &'static str, v: T) {
        self.0.push((step, format!("{v:?}")));
    }
}

thread_local! {
    /// Whether this test's scenario runs over IPv6.
    pub static V6: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// The loopback address of the test's family with `port` (the same in
/// both worlds: X-IO addresses are its own, so loopback means nothing
/// special to it).
pub fn lo(port: u16) -> SocketAddr {
    if V6.get() {
        SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port))
    } else {
        SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port))
    }
}

/// An address of the test's family on no interface here (TEST-NET-1 or
/// the documentation prefix).
pub fn elsewhere() -> SocketAddr {
    if V6.get() {
        "[2001:db8::1]:0".parse().unwrap()
    } else {
        "192.0.2.1:0".parse().unwrap()
    }
}

/// The unspecified address of the test's family with `port`.
pub fn any(port: u16) -> SocketAddr {
    if V6.get() {
        SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port))
    } else {
        SocketAddr::from((std::net::Ipv4Addr::UNSPECIFIED, port))
    }
}

/// A connected pair: (client, server).
pub fn pair<F: Family>(f: &F) -> (<F::L as Lst>::S, <F::L as Lst>::S, F::L) {
    let l = f.bind(lo(0)).unwrap();
    let c = f.connect(l.local_addr().unwrap()).unwrap();
    let (s, _) = l.accept().unwrap();
    for x in [&c, &s] {
        x.set_read_timeout(Some(WATCHDOG)).unwrap();
        x.set_write_timeout(Some(WATCHDOG)).unwrap();
    }
    (c, s, l)
}

pub mod scenario {
    use super::*;

    pub fn write_after_own_shutdown_write<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f);
        log.r("write before", c.write(b"abc"));
        log.r("shutdown(Write)", c.shutdown(Shutdown::Write));
        log.r("write after", c.write(b"x"));
        log.r("empty write after", c.write(b""));
        log.r("shutdown(Write) again", c.shutdown(Shutdown::Write));
        let mut b = [0u8; 8];
        let mut got = Vec::new();
        loop {
            match s.read(&mut b) {
                Ok(0) => break,
                Ok(n) => got.extend_from_slice(&b[..n]),
                Err(e) => {
                    log.r::<()>("peer read", Err(e));
                    break;
                }
            }
        }
        log.v("peer read all", String::from_utf8_lossy(&got).into_owned());
        log.r("peer read after EOF", s.read(&mut b));
        log.r("peer write back", s.write(b"back"));
        let r = c.read(&mut b);
        log.read("read back", r, &b);
        log.r("write still fails", c.write(b"y"));
    }

    pub fn read_after_own_shutdown_read<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f);
        log.r("shutdown(Read)", c.shutdown(Shutdown::Read));
        let mut b = [0u8; 8];
        log.r("read", c.read(&mut b));
        log.r("read again", c.read(&mut b));
        log.r("peek", c.peek(&mut b));
        log.r("shutdown(Read) again", c.shutdown(Shutdown::Read));
        log.r("write still works", c.write(b"hi"));
        let r = s.read(&mut b);
        log.read("peer reads it", r, &b);
    }

    pub fn shutdown_both_twice<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f);
        log.r("shutdown(Both)", c.shutdown(Shutdown::Both));
        log.r("shutdown(Both) again", c.shutdown(Shutdown::Both));
        let mut b = [0u8; 8];
        log.r("read", c.read(&mut b));
        log.r("write", c.write(b"x"));
        log.r("peer reads end", s.read(&mut b));
        log.r("shutdown(Read) after", c.shutdown(Shutdown::Read));
        log.r("shutdown(Write) after", c.shutdown(Shutdown::Write));
    }

    pub fn peer_closes_cleanly<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f);
        log.r("peer writes", s.write(b"bye"));
        drop(s);
        let mut b = [0u8; 8];
        let r = c.read(&mut b);
        log.read("read", r, &b);
        log.r("read end", c.read(&mut b));
        log.r("read end again", c.read(&mut b));
        log.r("peek end", c.peek(&mut b));
        log.r("take_error", c.take_error().map(|e| e.map(|e| e.kind())));
        log.v("peer_addr is ok", c.peer_addr().is_ok());
        log.r("shutdown(Read) after the end", c.shutdown(Shutdown::Read));
        // Into a closed socket: the first write is taken, the peer answers
        // with a reset, and the next write fails.
        log.r("write", c.write(b"x"));
        f.settle();
        log.r("read after the reset", c.read(&mut b));
        log.r("write after the reset", c.write(b"x"));
        log.r("write again", c.write(b"x"));
        log.r("shutdown(Write)", c.shutdown(Shutdown::Write));
    }

    pub fn peer_closes_with_unread_data<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f);
        log.r("write", c.write(b"unread"));
        let mut b = [0u8; 8];
        log.r("peer peeks", s.peek(&mut b[..1]));
        drop(s);
        f.settle();
        log.r("read", c.read(&mut b));
        log.r("read after", c.read(&mut b));
        log.r("write", c.write(b"x"));
        log.r("take_error", c.take_error().map(|e| e.map(|e| e.kind())));
        log.r("peer_addr", c.peer_addr());
        log.v("local_addr is ok", c.local_addr().is_ok());
        log.r("shutdown(Both)", c.shutdown(Shutdown::Both));
    }

    pub fn timeouts<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f);
        c.set_read_timeout(None).unwrap();
        c.set_write_timeout(None).unwrap();
        log.r("read_timeout default", c.read_timeout());
        log.r("write_timeout default", c.write_timeout());
        log.r(
            "zero read timeout",
            c.set_read_timeout(Some(Duration::ZERO)),
        );
        log.r(
            "zero write timeout",
            c.set_write_timeout(Some(Duration::ZERO)),
        );
        log.r("read_timeout unchanged", c.read_timeout());
        log.r("set read", c.set_read_timeout(Some(Duration::from_secs(2))));
        log.r(
            "set write",
            c.set_write_timeout(Some(Duration::from_secs(3))),
        );
        log.r("read_timeout", c.read_timeout());
        log.r("write_timeout", c.write_timeout());
        log.r(
            "set short",
            c.set_read_timeout(Some(Duration::from_millis(20))),
        );
        let mut b = [0u8; 8];
        log.r("read times out", c.read(&mut b));
        log.r("peek times out", c.peek(&mut b));
        log.r("again", c.read(&mut b));
        log.r("peer writes", s.write(b"late"));
        c.set_read_timeout(Some(WATCHDOG)).unwrap();
        let r = c.read(&mut b);
        log.read("then a read succeeds", r, &b);
        log.r("clear", c.set_read_timeout(None));
        log.r("read_timeout cleared", c.read_timeout());
        // A timeout is the handle's socket's, so a clone shares it.
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        log.r("clone sees it", c.try_clone().unwrap().read_timeout());
    }

    pub fn nonblocking_listener_and_stream<F: Family>(f: &F, log: &mut Log) {
        let l = f.bind(lo(0)).unwrap();
        log.r("listener nonblocking", l.set_nonblocking(true));
        log.r("accept nothing", l.accept().map(drop));
        let c = f.connect(l.local_addr().unwrap()).unwrap();
        let s = loop {
            match l.accept() {
                Ok((s, _)) => break s,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => f.settle(),
                Err(e) => panic!("{e}"),
            }
        };
        log.r("accept nothing again", l.accept().map(drop));
        // std: an accepted socket is blocking even from a non-blocking
        // listener on Linux.
        s.set_read_timeout(Some(WATCHDOG)).unwrap();
        log.r("stream nonblocking", c.set_nonblocking(true));
        let mut b = [0u8; 8];
        log.r("read nothing", c.read(&mut b));
        log.r("peek nothing", c.peek(&mut b));
        log.r("write", c.write(b"nb"));
        let r = s.read(&mut b);
        log.read("peer reads", r, &b);
        log.r("peer writes", s.write(b"x"));
        let r = loop {
            match c.read(&mut b) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => f.settle(),
                r => break r,
            }
        };
        log.read("nonblocking read", r, &b);
        log.r("blocking again", c.set_nonblocking(false));
        c.set_read_timeout(Some(WATCHDOG)).unwrap();
        let w = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            s.write(b"later").map(|_| s)
        });
        let r = c.read(&mut b);
        log.read("blocking read waits", r, &b);
        let s = w.join().unwrap().unwrap();
        drop(s);
        log.r("read end", c.read(&mut b));
        log.r("listener blocking again", l.set_nonblocking(false));
        let c2 = f.connect(l.local_addr().unwrap()).unwrap();
        log.r(
            "accept blocks and gets it",
            l.accept()
                .map(|(s, a)| (s.peer_addr().ok() == Some(a), a == c2.local_addr().unwrap())),
        );
    }

    pub fn empty_reads_and_writes<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f);
        log.r("empty write", c.write(b""));
        // (Linux's waits for data or the timeout, then says 0.)
        c.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        log.r("empty read, nothing queued", c.read(&mut []));
        log.r("empty peek, nothing queued", c.peek(&mut []));
        log.r(
            "empty readv, nothing queued",
            c.read_vectored(&mut [IoSliceMut::new(&mut [])]),
        );
        log.r(
            "empty vectored write",
            c.write_vectored(&[IoSlice::new(b""), IoSlice::new(b"")]),
        );
        log.r("no slices", c.write_vectored(&[]));
        log.r("peer writes", s.write(b"data"));
        let mut one = [0u8; 1];
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        log.r("peer sees no bytes from the empty writes", s.read(&mut one));
        c.peek(&mut one).unwrap();
        log.r("empty read, data queued", c.read(&mut []));
        let mut b = [0u8; 8];
        let r = c.read(&mut b);
        log.read("the data is all there", r, &b);
        c.set_nonblocking(true).unwrap();
        log.r("nonblocking empty read, nothing queued", c.read(&mut []));
        log.r(
            "nonblocking empty readv, nothing queued",
            c.read_vectored(&mut [IoSliceMut::new(&mut []), IoSliceMut::new(&mut [])]),
        );
        c.set_nonblocking(false).unwrap();
        drop(s);
        f.settle();
        log.r("empty write after the peer left", c.write(b""));
    }

    pub fn vectored<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f);
        log.r(
            "write_vectored",
            c.write_vectored(&[
                IoSlice::new(b"ab"),
                IoSlice::new(b""),
                IoSlice::new(b"cdef"),
            ]),
        );
        // Everything has arrived before the read (peek waits for the
        // first byte; the kernel delivers the one segment at once).
        let mut all = [0u8; 6];
        while s.peek(&mut all).unwrap() < 6 {}
        let (mut x, mut y) = ([0u8; 3], [0u8; 8]);
        let r = s.read_vectored(&mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)]);
        log.v("read_vectored", (r.map_err(|e| e.kind()), x, y));
        // A header and a body written apart (two chunks in X-IO, maybe two
        // segments in TCP), both queued: one readv takes both, skipping an
        // empty buffer, and stops where the data does.
        log.r("write header", c.write(b"HEAD"));
        log.r("write body", c.write(b"body!"));
        let mut all = [0u8; 9];
        while s.peek(&mut all).unwrap() < 9 {}
        let (mut h, mut e, mut b, mut rest) = ([0u8; 4], [0u8; 0], [0u8; 5], [0u8; 4]);
        let r = s.read_vectored(&mut [
            IoSliceMut::new(&mut h),
            IoSliceMut::new(&mut e),
            IoSliceMut::new(&mut b),
            IoSliceMut::new(&mut rest),
        ]);
        log.v(
            "header and body in one readv",
            (r.map_err(|e| e.kind()), h, b, rest),
        );
        // More queued than the buffers hold: they are filled, the rest
        // stays for the next read.
        log.r("write more", c.write(b"0123456789"));
        let mut all = [0u8; 10];
        while s.peek(&mut all).unwrap() < 10 {}
        let (mut x, mut y) = ([0u8; 2], [0u8; 3]);
        let r = s.read_vectored(&mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)]);
        log.v("buffers full", (r.map_err(|e| e.kind()), x, y));
        let mut b = [0u8; 16];
        let r = s.read(&mut b);
        log.read("the rest", r, &b);
        // Nothing queued: a non-blocking readv would block, a blocking
        // one waits for its timeout.
        s.set_nonblocking(true).unwrap();
        let r = s.read_vectored(&mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)]);
        log.r("nonblocking readv, nothing queued", r);
        s.set_nonblocking(false).unwrap();
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let r = s.read_vectored(&mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)]);
        log.r("readv times out", r);
        s.set_read_timeout(Some(WATCHDOG)).unwrap();
        // End of stream: a readv says 0.
        drop(c);
        let r = s.read_vectored(&mut [IoSliceMut::new(&mut x), IoSliceMut::new(&mut y)]);
        log.r("readv at the end", r);
    }

    pub fn binding<F: Family>(f: &F, log: &mut Log) {
        let l = f.bind(lo(0)).unwrap();
        let a = l.local_addr().unwrap();
        log.v("port 0 gets a port", (a.ip(), a.port() != 0));
        log.r("bind again", f.bind(a).map(drop));
        let l2 = l.try_clone().unwrap();
        drop(l);
        log.r("a clone keeps it bound", f.bind(a).map(drop));
        drop(l2);
        log.r("bind after the last is dropped", f.bind(a).map(drop));
        // An accepted connection still open does not keep the address
        // (std: SO_REUSEADDR, which std sets on Unix).
        let l = f.bind(a).unwrap();
        let c = f.connect(a).unwrap();
        let (s, _) = l.accept().unwrap();
        drop(l);
        log.r("bind while a connection lives", f.bind(a).map(drop));
        drop((c, s));
        log.r(
            "listener take_error",
            f.bind(lo(0)).unwrap().take_error().map(|e| e.is_none()),
        );
    }

    pub fn connecting<F: Family>(f: &F, log: &mut Log) {
        let free = {
            let l = f.bind(lo(0)).unwrap();
            l.local_addr().unwrap()
        };
        let r = f.connect(free).and_then(|c| {
            // X-IO may hand back a stream behind its SYN: the refusal is
            // its first read's.
            c.set_read_timeout(Some(WATCHDOG)).unwrap();
            c.read(&mut [0u8; 1]).map(drop)
        });
        log.r("nobody listens", r);
        let r = f.connect_timeout(free, WATCHDOG).and_then(|c| {
            c.set_read_timeout(Some(WATCHDOG)).unwrap();
            c.read(&mut [0u8; 1]).map(drop)
        });
        log.r("nobody listens, with a timeout", r);
        log.r(
            "zero connect timeout",
            f.connect_timeout(free, Duration::ZERO).map(drop),
        );
        let l = f.bind(lo(0)).unwrap();
        let port = l.local_addr().unwrap().port();
        let r = f.connect(any(port)).and_then(|c| {
            let (s, a) = l.accept()?;
            Ok((
                c.peer_addr()? == lo(port),
                a == c.local_addr()?,
                s.local_addr()? == lo(port),
            ))
        });
        log.r("0.0.0.0 means this host", r);
    }

    pub fn addresses<F: Family>(f: &F, log: &mut Log) {
        let (c, s, l) = pair(f);
        let la = l.local_addr().unwrap();
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
        log.v(
            "client port not the listener's",
            c.local_addr().unwrap().port() != la.port(),
        );
        log.v(
            "client's address is of the listener's family",
            c.local_addr().unwrap().is_ipv6() == la.is_ipv6(),
        );
        let c2 = f.connect(la).unwrap();
        let (s2, a2) = l.accept().unwrap();
        log.v(
            "accept's address is the peer's",
            a2 == s2.peer_addr().unwrap() && a2 == c2.local_addr().unwrap(),
        );
        log.v(
            "two clients, two addresses",
            c2.local_addr().unwrap() != c.local_addr().unwrap(),
        );
    }

    pub fn options_and_clones<F: Family>(f: &F, log: &mut Log) {
        let (c, s, l) = pair(f);
        log.r("take_error", c.take_error().map(|e| e.is_none()));
        log.r("set_nodelay", c.set_nodelay(true));
        log.r("nodelay", c.nodelay());
        let c2 = c.try_clone().unwrap();
        log.r("clone writes", c2.write(b"12"));
        log.r("original writes", c.write(b"34"));
        let mut b = [0u8; 4];
        let mut n = 0;
        while n < 4 {
            n += s.read(&mut b[n..]).unwrap();
        }
        log.v("peer reads both in order", b);
        log.r("nonblocking via a clone", c2.set_nonblocking(true));
        log.r("shared with the original", c.read(&mut b));
        c2.set_nonblocking(false).unwrap();
        drop(c);
        log.r("the clone keeps it open", c2.write(b"5"));
        let r = s.read(&mut b);
        log.read("peer reads it", r, &b);
        let l2 = l.try_clone().unwrap();
        l2.set_nonblocking(true).unwrap();
        log.r("listener nonblocking shared", l.accept().map(drop));
        l.set_nonblocking(false).unwrap();
        let c3 = f.connect(l.local_addr().unwrap()).unwrap();
        let r = l.incoming().next().expect("endless");
        log.r(
            "incoming",
            r.and_then(|s| Ok(s.peer_addr()? == c3.local_addr()?)),
        );
    }

    pub fn nonblocking_writes_fill_then_drain<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f);
        c.set_nonblocking(true).unwrap();
        let chunk = vec![5u8; 64 << 10];
        let mut sent = 0usize;
        // Hang guard: far more than any window or socket buffer.
        let stop = (0..100_000)
            .find_map(|_| match c.write(&chunk) {
                Ok(n) => {
                    sent += n;
                    None
                }
                Err(e) => Some(e.kind()),
            })
            .expect("a non-blocking writer finds the window full");
        log.v("stopped by", stop);
        log.v("took something first", sent > 0);
        let mut b = vec![0u8; 64 << 10];
        let mut got = 0usize;
        while got < sent {
            let n = s.read(&mut b).unwrap();
            assert!(b[..n].iter().all(|&x| x == 5));
            got += n;
        }
        // (How much depends on socket buffers and the window.)
        log.v("peer reads exactly what was taken", got == sent);
        f.settle();
        let r = loop {
            match c.write(b"more") {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => f.settle(),
                r => break r,
            }
        };
        log.r("writable again", r);
        let r = s.read(&mut b);
        log.read("and it arrives", r, &b);
    }

    pub fn write_timeout_takes_part<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f);
        c.set_write_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        // More than any window or socket buffer: the timeout ends it.
        let big = vec![9u8; 32 << 20];
        let n = c.write(&big);
        log.v(
            "a partial count",
            n.as_ref()
                .map(|&n| n > 0 && n < big.len())
                .map_err(|e| e.kind()),
        );
        let n = n.unwrap_or(0);
        let mut b = vec![0u8; 64 << 10];
        let mut got = 0usize;
        while got < n {
            got += s.read(&mut b).unwrap();
        }
        log.v("peer reads what the count said", got == n);
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        log.r("and no more", s.read(&mut b));
    }

    pub fn shutdown_from_another_thread_ends_a_blocked_call<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f);
        // The hang guard: a read still waiting then says WouldBlock.
        c.set_read_timeout(Some(WATCHDOG)).unwrap();
        let reader = c.try_clone().unwrap();
        let t = std::thread::spawn(move || reader.read(&mut [0u8; 8]).map_err(|e| e.kind()));
        std::thread::sleep(Duration::from_millis(50));
        log.r("shutdown(Read)", c.shutdown(Shutdown::Read));
        log.v("the blocked read ends", t.join().unwrap());
        // A writer blocked on a full window / socket buffer.
        c.set_write_timeout(Some(WATCHDOG)).unwrap();
        let writer = c.try_clone().unwrap();
        let t = std::thread::spawn(move || {
            let chunk = vec![1u8; 64 << 10];
            loop {
                if let Err(e) = writer.write(&chunk) {
                    break e.kind();
                }
            }
        });
        std::thread::sleep(Duration::from_millis(200));
        log.r("shutdown(Write)", c.shutdown(Shutdown::Write));
        log.v("the blocked write ends", t.join().unwrap());
        drop(s);
    }

    /// Bind's check that the address is this node's: std's always, X-IO's
    /// on a strict net.
    pub fn strict_addresses<F: Family>(f: &F, log: &mut Log) {
        log.r(
            "bind an address of no interface",
            f.bind_strict(elsewhere()).map(drop),
        );
        log.r("bind loopback", f.bind_strict(lo(0)).map(drop));
        log.r("bind unspecified", f.bind_strict(any(0)).map(drop));
    }

    /// `IP_TTL` on streams and listeners: 1 to 255 kept and reported, an
    /// accepted stream starting with its listener's.
    pub fn ttl<F: Family>(f: &F, log: &mut Log) {
        let l = f.bind(lo(0)).unwrap();
        log.r("listener ttl", l.ttl());
        log.r("listener set_ttl(200)", l.set_ttl(200));
        log.r("listener set_ttl(300)", l.set_ttl(300));
        log.r("listener ttl then", l.ttl());
        let c = f.connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        log.r("client ttl", c.ttl());
        log.r("accepted ttl", s.ttl());
        log.r("set_ttl(1)", c.set_ttl(1));
        log.r("ttl then", c.ttl());
        log.r("set_ttl(0)", c.set_ttl(0));
        log.r("ttl after", c.ttl());
        log.r("a clone's ttl", c.try_clone().and_then(|c| c.ttl()));
    }

    pub fn several_addresses_and_after_shutdown<F: Family>(f: &F, log: &mut Log) {
        let l = f.bind(lo(0)).unwrap();
        let a = l.local_addr().unwrap();
        let free = {
            let l = f.bind(lo(0)).unwrap();
            l.local_addr().unwrap()
        };
        log.r(
            "bind takes the first that can be bound",
            f.bind_any(&[a, free])
                .and_then(|l2| Ok(l2.local_addr()? == free)),
        );
        log.r(
            "bind with no address",
            f.bind_any(&[]).map(drop).map_err(|e| e.kind().into()),
        );
        log.r(
            "connect goes on past a refusal",
            f.connect_any(&[free, a])
                .and_then(|c| Ok(c.peer_addr()? == a)),
        );
        let (s, _) = l.accept().unwrap();
        log.r(
            "connect with no address",
            f.connect_any(&[]).map(drop).map_err(|e| e.kind().into()),
        );
        log.r(
            "bind an address of no interface",
            f.bind(elsewhere()).map(drop).map_err(|e| e.kind().into()),
        );
        log.r(
            "unspecified address stays so",
            f.bind(any(0))
                .and_then(|l| Ok(l.local_addr()?.ip().is_unspecified())),
        );
        let (c, s2, _l2) = pair(f);
        let (ca, sa) = (c.local_addr().unwrap(), s2.local_addr().unwrap());
        log.r("nodelay by default", c.nodelay());
        log.r("set_nodelay(false)", c.set_nodelay(false));
        log.r("nodelay after", c.nodelay());
        log.r("shutdown(Both)", c.shutdown(Shutdown::Both));
        log.r("local_addr after shutdown", c.local_addr().map(|x| x == ca));
        log.r("peer_addr after shutdown", c.peer_addr().map(|x| x == sa));
        log.r(
            "take_error after shutdown",
            c.take_error().map(|e| e.map(|e| e.kind())),
        );
        let mut b = [0u8; 4];
        log.r("peer reads the end", s2.read(&mut b));
        log.r(
            "peer's addresses still there",
            s2.local_addr()
                .and_then(|l| Ok(l == sa && s2.peer_addr()? == ca)),
        );
        drop(s);
    }

    pub fn reset_seen_through_take_error_then_nonblocking<F: Family>(f: &F, log: &mut Log) {
        // A FIN, seen by a non-blocking reader that had found nothing.
        let (c, s, _l) = pair(f);
        c.set_nonblocking(true).unwrap();
        let mut b = [0u8; 8];
        log.r("nothing yet", c.read(&mut b));
        log.r("peek nothing yet", c.peek(&mut b));
        drop(s);
        f.settle();
        log.r("nonblocking read sees the end", c.read(&mut b));
        log.r("nonblocking peek sees the end", c.peek(&mut b));
        // A reset, asked for with take_error before any read or write.
        let (c, s, _l) = pair(f);
        log.r("write", c.write(b"unread"));
        s.peek(&mut b[..1]).unwrap();
        drop(s);
        f.settle();
        log.r(
            "take_error says reset",
            c.take_error().map(|e| e.map(|e| e.kind())),
        );
        log.r(
            "take_error once",
            c.take_error().map(|e| e.map(|e| e.kind())),
        );
        c.set_nonblocking(true).unwrap();
        log.r("nonblocking read after", c.read(&mut b));
        log.r("nonblocking peek after", c.peek(&mut b));
        log.r("nonblocking write after", c.write(b"x"));
        log.r("peer_addr after", c.peer_addr().map(drop));
    }

    pub fn listener_dropped_with_unaccepted<F: Family>(f: &F, log: &mut Log) {
        let l = f.bind(lo(0)).unwrap();
        let a = l.local_addr().unwrap();
        let c = f.connect(a).unwrap();
        c.set_read_timeout(Some(WATCHDOG)).unwrap();
        log.r("write before", c.write(b"hello"));
        f.settle();
        drop(l);
        let mut b = [0u8; 8];
        log.r("read", c.read(&mut b));
        log.r("read again", c.read(&mut b));
        log.r("write", c.write(b"x"));
        let again = f.connect(a);
        log.r(
            "connect again",
            again.as_ref().map(drop).map_err(|e| e.kind().into()),
        );
        let r = again.and_then(|c| {
            c.set_read_timeout(Some(WATCHDOG)).unwrap();
            c.read(&mut b)
        });
        log.r("connect again, then read", r);
    }

    pub fn peek_reports_a_reset_once<F: Family>(f: &F, log: &mut Log) {
        let (c, s, _l) = pair(f);
        log.r("write", c.write(b"unread"));
        let mut b = [0u8; 8];
        s.peek(&mut b[..1]).unwrap();
        drop(s);
        f.settle();
        // Linux's MSG_PEEK clears the socket's error as a read does.
        log.r("peek says reset", c.peek(&mut b));
        log.r("peek again", c.peek(&mut b));
        log.r(
            "take_error after",
            c.take_error().map(|e| e.map(|e| e.kind())),
        );
        log.r("read after", c.read(&mut b));
        log.r("write after", c.write(b"x"));
    }
}

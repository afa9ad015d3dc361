//! X-IO for tokio services: [`XioListener`] and [`XioStream`], shaped like
//! `tokio::net::TcpListener` and `TcpStream`, over shared memory.
//!
//! ```no_run
//! use tokio::io::{AsyncReadExt, AsyncWriteExt};
//! use xio_tokio::{XioListener, XioStream};
//!
//! # async fn run() -> std::io::Result<()> {
//! let listener = XioListener::bind("10.0.0.1:80").await?; // pool: $XIO_PREFIX or "xio"
//! tokio::spawn(async move {
//!     loop {
//!         let (mut s, _) = listener.accept().await.unwrap();
//!         tokio::spawn(async move {
//!             let mut buf = [0u8; 1024];
//!             while let Ok(n) = s.read(&mut buf).await {
//!                 if n == 0 || s.write_all(&buf[..n]).await.is_err() {
//!                     break;
//!                 }
//!             }
//!         });
//!     }
//! });
//! let mut s = XioStream::connect("10.0.0.1:80").await?;
//! s.write_all(b"hello").await?;
//! # Ok(()) }
//! ```
//!
//! # How it waits
//! Each [`Net`] used from a runtime gets one *driver* task: it waits for
//! the net's eventfd doorbell through the runtime's reactor
//! ([`tokio::io::unix::AsyncFd`]), drains the shared-memory rings when a
//! peer rings it, and wakes every task whose connection became ready in
//! one pass (batch wake-up). The `poll_*` functions never wait and never
//! spin; they register the task's waker.
//!
//! A net used from several runtimes (say concurrent `#[tokio::test]`s
//! sharing [`Net::global`]) gets a driver on the first runtime that
//! waits on it, and more where that one cannot serve. A driver on a
//! multi-thread runtime serves the tasks of every runtime, for as long as
//! its runtime lives. A current_thread runtime runs its driver only while
//! some thread is in its `block_on`, so that driver serves that runtime's
//! own tasks alone: a task of another runtime that waits starts a driver
//! on its own runtime. While a net has other drivers, a current_thread
//! runtime's does not watch the rings (below): its `block_on` may return
//! mid-watch, with the doorbell the others sleep on switched off. When a
//! runtime shuts down, its drivers end and wake every task waiting on
//! their nets, and those of the runtimes still running start a driver of
//! their own if they need one.
//!
//! The runtime needs its I/O and time drivers (`#[tokio::main]` and
//! `#[tokio::test]` enable both; a hand-built runtime needs `enable_all()`
//! or `enable_io().enable_time()`): the driver task waits on the doorbell
//! through the reactor and paces its retries with timers, and without a
//! time driver tokio panics at the first of them.
//!
//! Waking a parked worker thread costs tens of microseconds on a VM, far
//! more than the shared-memory round trip. So before the driver sleeps on the
//! doorbell it keeps watching the rings for the adaptive policy's budget,
//! yielding to the runtime's other tasks between looks (never spinning
//! inside a poll), and only while a peer is awake on another core: idle,
//! or sharing one core with its peer, it sleeps at once. Asleep, it also
//! watches the manager ([`Net::manager_watch`]), so a dead manager is
//! noticed at once without a timer: an idle service makes no wake-ups.
//!
//! **Busy-poll**, for latency-critical services with a core to spare: a
//! [`Net`] built with `Net::builder(prefix).wait_mode(WaitMode::BusyPoll)`
//! makes its driver watch the rings without ever sleeping (off by default;
//! it keeps one worker busy).
//!
//! # Cancellation
//! `accept`, `read` (and every `AsyncRead` use) and `recv_buf`/`recv_bytes`
//! are cancellation safe: a dropped future loses nothing. So is `connect`
//! to an address connected to before; one that waits for the manager
//! (on a blocking thread) runs to its end when its future is dropped, and
//! the connection it made is closed at once (the listener may accept it
//! and read end-of-file). A dropped `XioListener::bind` likewise binds
//! and then unbinds; [`XioListener::bind_with`] leaves nothing behind.
//! `write` is as `AsyncWrite` always is (bytes reported written are sent;
//! a dropped future wrote nothing or a reported prefix). `send_buf` is not:
//! dropping its future drops the buffer unsent. `readable`, `writable`,
//! `ready` and `peek` are cancellation safe, as tokio's are.
//!
//! # Readiness and wake-ups, as tokio's
//! A stream keeps its read and write readiness until an operation meets
//! `WouldBlock` (tokio's `ScheduledIo` model): `readable()` after a
//! `read_exact` that took everything returns at once, and the `try_read`
//! after it says `WouldBlock`; an accepted stream starts read- and
//! write-ready, as tokio's accepted sockets do. Futures (`accept`,
//! `readable`, `writable`, `ready`, `peek`, `connected`) each keep their
//! own place among a stream's or listener's waiters until what they wait
//! for happens or they are dropped: every one is woken then, never
//! before. The `poll_*` methods keep the waker of the task that polled
//! last, as tokio's do.
//!
//! # Where it differs from tokio's `TcpStream`
//! Beyond what [`XioStream::connect`] says of a refusal (reported by the
//! first read, not by `connect`):
//! - A client's [`XioStream::local_addr`] is made from its process's
//!   stack id (X-IO clients do not bind), so its IP is not the
//!   listener's as on loopback TCP; any address can be bound, as X-IO
//!   addresses are names, not routes (a net built with
//!   `Net::builder(prefix).strict_addresses(true)`, or
//!   `$XIO_STRICT_ADDRESSES=1`, refuses other nodes' addresses as TCP
//!   does). An IPv4 client of a listener on `[::]` is accepted with IPv4
//!   addresses (Linux maps them into IPv6, `::ffff:a.b.c.d`).
//! - `set_nodelay`, `set_ttl` and `set_linger` are kept and reported as
//!   TCP reports them, but only a zero linger changes anything (a close
//!   with a reset): nothing is ever delayed and nothing routes these
//!   bytes. There is no `TcpSocket`; `from_std`/`into_std` convert to and
//!   from `xio_core`'s blocking types, not kernel sockets.
//! - [`XioStream::ready`] never reports `WRITE_CLOSED` (tokio reports it
//!   from Linux's `EPOLLHUP`: both directions shut, or a reset), and
//!   refuses `ERROR` (or `PRIORITY`) without `READABLE` or `WRITABLE`
//!   (`Unsupported`).
//! - A writer waits in the kernel with TCP. Here, what no peer signals,
//!   room in a full ring to a peer or a buffer in an exhausted pool, is
//!   looked for again on a timer (tokio's, about every millisecond) that
//!   wakes the tasks waiting for it. Readers that do not read can hold a
//!   pool's buffers (the default pool holds some 40 full windows of the
//!   default 2 MiB): while such a pool stays empty, its stalled writers
//!   cost a little CPU each millisecond, where TCP's sleep. Idle streams
//!   cost nothing.
//!
//! `tests/tokio_parity.rs` runs the same scenarios against tokio's TCP
//! and X-IO, comparing what a program sees, and pins the differences
//! above that a scenario can observe.

use std::cell::RefCell;
use std::collections::HashMap;
use std::io::{self, IoSlice};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{ready, Context, Poll};
use std::time::Duration;
use tokio::net::ToSocketAddrs as AsyncToSocketAddrs;

use bytes::Bytes;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf, Ready};

pub use xio_core as core;
pub use xio_core::buf::{Buf, BufMut};
pub use xio_core::net::Net;
use xio_core::net::WaitEntry;

mod driver;
mod halves;
mod listener;
mod stream;

#[doc(hidden)]
pub use driver::__hold_registry;
use driver::*;
use halves::*;
pub use halves::{OwnedReadHalf, OwnedWriteHalf, ReadHalf, WriteHalf};
pub use listener::XioListener;
pub use stream::XioStream;
use stream::{READ, WRITE};

/// A received pool buffer as [`Bytes`] (no copy; back to the pool when
/// the last clone is dropped).
pub fn into_bytes(b: Buf) -> Bytes {
    Bytes::from_owner(b)
}

/// Whether an accept error concerns the one connection (gone before it
/// was taken), not the listener: an accept loop skips it and goes on,
/// where another error (out of fds, say) calls for a pause first.
pub fn is_connection_error(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionRefused
            | io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
    )
}

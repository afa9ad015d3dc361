//! `AsyncRead`/`AsyncWrite` for the stream and its halves, which share
//! one implementation, and the halves themselves.

use super::*;

pub(crate) fn poll_read_core(
    s: &XioStream,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    // SAFETY: `poll_read_uninit` only writes into the slice (never reads
    // it or de-initialises anything), and reports how many bytes it wrote.
    let unfilled = unsafe { buf.unfilled_mut() };
    if unfilled.is_empty() {
        // As a socket's: waits for something to be there, then reads
        // nothing (an error there is reported, as by a read).
        return s.poll_peek_in(cx, None, &mut []).map_ok(drop);
    }
    let p = s.inner.poll_read_uninit(cx, unfilled);
    let p = s.pending(p);
    let n = ready!(s.note_poll(READ, p))?;
    // SAFETY: the first `n` bytes of the unfilled part were just written.
    unsafe { buf.assume_init(n) };
    buf.advance(n);
    Poll::Ready(Ok(()))
}

pub(crate) fn poll_write_core(
    s: &XioStream,
    cx: &mut Context<'_>,
    bufs: &[IoSlice<'_>],
) -> Poll<io::Result<usize>> {
    let p = s.inner.poll_write_vectored(cx, bufs);
    let p = s.pending(p);
    if bufs.iter().all(|b| b.is_empty()) {
        return p;
    }
    s.note_poll(WRITE, p)
}

/// A task that will wait needs the net's driver to wake it: make sure it
/// runs (only then: a ready result needs nothing).
pub(crate) fn pending_needs_driver<T>(net: &Net, p: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
    if p.is_pending() {
        if let Err(e) = ensure_driver(net) {
            return Poll::Ready(Err(e));
        }
    }
    p
}

/// `poll_shutdown`: a reset stream's `NotConnected` is success, as tokio's
/// `TcpStream` has it since 1.46: the reset is the reads' to report, and
/// closing paths that shut down before they drop (hyper's) need no case
/// of their own. Writes after it fail with `BrokenPipe`, as TCP's.
pub(crate) fn shutdown_core(s: &xio_core::net::XioStream) -> Poll<io::Result<()>> {
    match s.shutdown(Shutdown::Write) {
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Poll::Ready(Ok(())),
        r => Poll::Ready(r),
    }
}

macro_rules! impl_async_io {
    ($t:ty) => {
        impl AsyncRead for $t {
            fn poll_read(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<io::Result<()>> {
                poll_read_core(self.stream(), cx, buf)
            }
        }
    };
    (write $t:ty) => {
        impl AsyncWrite for $t {
            fn poll_write(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                buf: &[u8],
            ) -> Poll<io::Result<usize>> {
                poll_write_core(self.stream(), cx, &[IoSlice::new(buf)])
            }
            fn poll_write_vectored(
                self: Pin<&mut Self>,
                cx: &mut Context<'_>,
                bufs: &[IoSlice<'_>],
            ) -> Poll<io::Result<usize>> {
                poll_write_core(self.stream(), cx, bufs)
            }
            fn is_write_vectored(&self) -> bool {
                true
            }
            fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                Poll::Ready(Ok(()))
            }
            fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
                shutdown_core(self.stream().as_core())
            }
        }
    };
}

impl_async_io!(XioStream);
impl_async_io!(write XioStream);

/// The stream a half (or the stream itself) reads and writes through.
pub(crate) trait AsStream {
    fn stream(&self) -> &XioStream;
}

impl AsStream for XioStream {
    fn stream(&self) -> &XioStream {
        self
    }
}

macro_rules! as_stream {
    ($($t:ty),*) => {$(
        impl AsStream for $t {
            fn stream(&self) -> &XioStream {
                &self.0
            }
        }
    )*};
}

as_stream!(ReadHalf<'_>, WriteHalf<'_>, OwnedReadHalf, OwnedWriteHalf);

/// The read half of [`XioStream::split`].
#[derive(Debug)]
pub struct ReadHalf<'a>(pub(crate) &'a XioStream);
/// The write half of [`XioStream::split`].
#[derive(Debug)]
pub struct WriteHalf<'a>(pub(crate) &'a XioStream);
/// The read half of [`XioStream::into_split`].
#[derive(Debug)]
pub struct OwnedReadHalf(pub(crate) Arc<XioStream>);
/// The write half of [`XioStream::into_split`]; dropping it shuts down
/// writing (unless [`OwnedWriteHalf::forget`]).
#[derive(Debug)]
pub struct OwnedWriteHalf(pub(crate) Arc<XioStream>);

/// The methods of tokio's `TcpStream` halves, each as [`XioStream`]'s.
macro_rules! half_methods {
    (common $t:ty) => {
        impl $t {
            /// The peer's address ([`XioStream::peer_addr`]).
            pub fn peer_addr(&self) -> io::Result<SocketAddr> {
                self.0.peer_addr()
            }

            /// This end's address ([`XioStream::local_addr`]).
            pub fn local_addr(&self) -> io::Result<SocketAddr> {
                self.0.local_addr()
            }

            /// Waits for any of `interest` ([`XioStream::ready`]).
            pub async fn ready(&self, interest: Interest) -> io::Result<Ready> {
                self.0.ready(interest).await
            }
        }

        impl AsRef<XioStream> for $t {
            fn as_ref(&self) -> &XioStream {
                &self.0
            }
        }
    };
    (read $t:ty) => {
        half_methods!(common $t);
        impl $t {
            /// Waits until a read would not wait ([`XioStream::readable`]).
            pub async fn readable(&self) -> io::Result<()> {
                self.0.readable().await
            }

            /// Polls [`XioStream::readable`] ([`XioStream::poll_read_ready`]).
            pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.0.poll_read_ready(cx)
            }

            /// Reads what is there without waiting ([`XioStream::try_read`]).
            pub fn try_read(&self, buf: &mut [u8]) -> io::Result<usize> {
                self.0.try_read(buf)
            }

            /// [`XioStream::try_read_vectored`].
            pub fn try_read_vectored(&self, bufs: &mut [io::IoSliceMut<'_>]) -> io::Result<usize> {
                self.0.try_read_vectored(bufs)
            }

            /// [`XioStream::try_read_buf`].
            pub fn try_read_buf<B: bytes::BufMut>(&self, buf: &mut B) -> io::Result<usize> {
                self.0.try_read_buf(buf)
            }

            /// Receives without taking the bytes off ([`XioStream::peek`]).
            pub async fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
                self.0.peek(buf).await
            }

            /// Polls [`XioStream::peek`].
            pub fn poll_peek(&self, cx: &mut Context<'_>, buf: &mut [u8]) -> Poll<io::Result<usize>> {
                self.0.poll_peek(cx, buf)
            }
        }
    };
    (write $t:ty) => {
        half_methods!(common $t);
        impl $t {
            /// Waits until a write would not wait ([`XioStream::writable`]).
            pub async fn writable(&self) -> io::Result<()> {
                self.0.writable().await
            }

            /// Polls [`XioStream::writable`] ([`XioStream::poll_write_ready`]).
            pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
                self.0.poll_write_ready(cx)
            }

            /// Writes what can go now without waiting ([`XioStream::try_write`]).
            pub fn try_write(&self, buf: &[u8]) -> io::Result<usize> {
                self.0.try_write(buf)
            }

            /// [`XioStream::try_write_vectored`].
            pub fn try_write_vectored(&self, bufs: &[io::IoSlice<'_>]) -> io::Result<usize> {
                self.0.try_write_vectored(bufs)
            }
        }
    };
}

half_methods!(read ReadHalf<'_>);
half_methods!(write WriteHalf<'_>);
half_methods!(read OwnedReadHalf);
half_methods!(write OwnedWriteHalf);

impl_async_io!(ReadHalf<'_>);
impl_async_io!(write WriteHalf<'_>);
impl_async_io!(OwnedReadHalf);
impl_async_io!(write OwnedWriteHalf);

impl OwnedReadHalf {
    /// Puts the halves back together (they must come from one stream).
    pub fn reunite(self, w: OwnedWriteHalf) -> Result<XioStream, (OwnedReadHalf, OwnedWriteHalf)> {
        if !Arc::ptr_eq(&self.0, &w.0) {
            return Err((self, w));
        }
        let a = self.0.clone();
        drop(self);
        let w = std::mem::ManuallyDrop::new(w);
        // SAFETY: `w` is never used or dropped again; its Arc is moved out
        // once (so its write-half Drop, a shutdown, does not run).
        drop(unsafe { std::ptr::read(&w.0) });
        match Arc::try_unwrap(a) {
            Ok(s) => Ok(s),
            Err(_) => unreachable!("both halves were given back"),
        }
    }
}

impl OwnedWriteHalf {
    /// Puts the halves back together ([`OwnedReadHalf::reunite`]).
    pub fn reunite(self, r: OwnedReadHalf) -> Result<XioStream, (OwnedReadHalf, OwnedWriteHalf)> {
        r.reunite(self)
    }

    /// Drops the half without shutting down writing (as tokio's
    /// `OwnedWriteHalf::forget`): the stream stays open for writes until
    /// the read half goes too.
    pub fn forget(self) {
        let w = std::mem::ManuallyDrop::new(self);
        // SAFETY: `w` is never used or dropped again; its Arc is moved out
        // once (so the shutdown of its Drop does not run).
        drop(unsafe { std::ptr::read(&w.0) });
    }
}

impl Drop for OwnedWriteHalf {
    fn drop(&mut self) {
        let _ = self.0.as_core().shutdown(Shutdown::Write);
    }
}

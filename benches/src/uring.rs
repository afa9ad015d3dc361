//! The io_uring baselines (the X-IO paper's Fig. 7): the same echo as the
//! `uds` and `tcp` baselines, with every read and write an io_uring
//! request whose completion the thread busy-polls (the paper's completion
//! polling), so no read or write is a blocking system call.
//!
//! Submission polling (`IORING_SETUP_SQPOLL`, the paper's other half) is
//! not used: it adds a kernel thread per ring that spins on its queue,
//! and on the 2-CPU machines this runs on the client's and the server's
//! spinning threads already take both CPUs; two more spinners would
//! share them by time slices of milliseconds. Each request is submitted
//! with `io_uring_enter` instead (one system call per read or write).

use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, RawFd};

use io_uring::{opcode, types, IoUring};

/// A connected stream whose reads and writes go through an io_uring.
pub(crate) struct UringStream<S> {
    /// Kept open for as long as the ring may name its descriptor.
    _stream: S,
    fd: RawFd,
    ring: IoUring,
}

impl<S: AsRawFd> UringStream<S> {
    /// A ring of its own for `stream` (two entries: one request in flight).
    pub(crate) fn new(stream: S) -> io::Result<Self> {
        let fd = stream.as_raw_fd();
        Ok(Self {
            _stream: stream,
            fd,
            ring: IoUring::new(2)?,
        })
    }

    /// Submits `entry` and busy-polls its completion: the byte count, or
    /// the error the kernel gave.
    ///
    /// # Safety
    ///
    /// The memory `entry` names must stay valid and unaliased until this
    /// returns (it waits for the completion, so a borrow for the call is
    /// enough).
    unsafe fn run(&mut self, entry: io_uring::squeue::Entry) -> io::Result<usize> {
        // SAFETY: the caller keeps the buffer valid until the completion,
        // which this function reaps before it returns.
        unsafe { self.ring.submission().push(&entry) }
            .map_err(|_| io::Error::other("io_uring submission queue full"))?;
        self.ring.submit()?;
        loop {
            if let Some(c) = self.ring.completion().next() {
                let r = c.result();
                return if r < 0 {
                    Err(io::Error::from_raw_os_error(-r))
                } else {
                    Ok(r as usize)
                };
            }
            std::hint::spin_loop();
        }
    }
}

impl<S: AsRawFd> Read for UringStream<S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let e = opcode::Recv::new(types::Fd(self.fd), buf.as_mut_ptr(), len).build();
        // SAFETY: `buf` is borrowed mutably for the whole call, and `run`
        // returns only once the kernel is done with it.
        unsafe { self.run(e) }
    }
}

impl<S: AsRawFd> Write for UringStream<S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let len = u32::try_from(buf.len()).unwrap_or(u32::MAX);
        let e = opcode::Send::new(types::Fd(self.fd), buf.as_ptr(), len).build();
        // SAFETY: as for `read`: `buf` outlives the request.
        unsafe { self.run(e) }
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes go both ways through the rings, a partial request included,
    /// and the end of the stream reads as 0.
    #[test]
    fn a_uring_stream_echoes_and_sees_the_end() {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        let mut a = UringStream::new(a).unwrap();
        let t = std::thread::spawn(move || {
            let mut b = UringStream::new(b).unwrap();
            let mut buf = [0u8; 5];
            b.read_exact(&mut buf).unwrap();
            b.write_all(&buf).unwrap();
        });
        a.write_all(b"hello").unwrap();
        let mut back = [0u8; 5];
        a.read_exact(&mut back).unwrap();
        assert_eq!(&back, b"hello");
        t.join().unwrap();
        assert_eq!(a.read(&mut back).unwrap(), 0);
    }
}

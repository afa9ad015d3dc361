//! How a sleeping stack is woken: the [`Doorbell`] seam and its eventfd
//! implementation, the same for every backend (a stack's doorbell and its
//! peers' are eventfds the manager hands out).

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
#[cfg(any(test, feature = "test-support"))]
use std::time::Duration;

use rustix::event::EventfdFlags;
#[cfg(any(test, feature = "test-support"))]
use rustix::event::{PollFd, PollFlags};

/// Something a sleeping stack can be woken through.
pub trait Doorbell: Send + Sync + std::fmt::Debug {
    /// Wakes the waiter.
    fn ring(&self) -> io::Result<()>;
    /// Sleeps until rung or `timeout`; true if rung. Consumes the ring.
    #[cfg(any(test, feature = "test-support"))]
    fn wait(&self, timeout: Option<Duration>, also: Option<BorrowedFd<'_>>) -> io::Result<bool>;
    /// A pollable fd (readable when rung), for reactors.
    fn fd(&self) -> BorrowedFd<'_>;
}

/// A doorbell backed by a non-blocking eventfd.
#[derive(Debug)]
pub struct EventFdDoorbell {
    fd: OwnedFd,
}

impl EventFdDoorbell {
    /// A new eventfd doorbell.
    pub fn new() -> io::Result<Self> {
        Ok(Self {
            fd: rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?,
        })
    }
    /// Wraps an eventfd received from the manager.
    pub fn from_fd(fd: OwnedFd) -> Self {
        Self { fd }
    }
    /// Clears a pending ring without sleeping.
    pub fn drain(&self) {
        let mut b = [0u8; 8];
        let _ = rustix::io::read(&self.fd, &mut b);
    }
}

impl AsFd for EventFdDoorbell {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Doorbell for EventFdDoorbell {
    fn ring(&self) -> io::Result<()> {
        match rustix::io::write(&self.fd, &1u64.to_ne_bytes()) {
            Ok(_) | Err(rustix::io::Errno::AGAIN) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    #[cfg(any(test, feature = "test-support"))]
    fn wait(&self, timeout: Option<Duration>, also: Option<BorrowedFd<'_>>) -> io::Result<bool> {
        let ts = timeout.map(|d| rustix::time::Timespec {
            tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
            tv_nsec: d.subsec_nanos() as _,
        });
        let mut fds = [
            PollFd::new(&self.fd, PollFlags::IN),
            PollFd::new(&self.fd, PollFlags::IN),
        ];
        let n = match also {
            Some(f) => {
                fds[1] = PollFd::from_borrowed_fd(f, PollFlags::IN);
                2
            }
            None => 1,
        };
        match rustix::event::poll(&mut fds[..n], ts.as_ref()) {
            Ok(_) | Err(rustix::io::Errno::INTR) => {}
            Err(e) => return Err(e.into()),
        }
        let rung = fds[0].revents().contains(PollFlags::IN);
        if rung {
            self.drain();
        }
        Ok(rung)
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

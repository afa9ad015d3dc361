//! The backend seams: pool, ring and doorbell as traits, so a backend other
//! than shared memory (DPDK's rte_mempool and rte_ring) plugs in under the
//! stack without the layers above changing.
//!
//! The shm backend implements them with [`crate::pool::StackPool`],
//! [`crate::ring::Producer`]/[`crate::ring::Consumer`] and
//! [`EventFdDoorbell`]; the same types over a heap [`crate::segment::Region`]
//! make the in-process backend used by the fast unit tests.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::Duration;

use rustix::event::{EventfdFlags, PollFd, PollFlags};

use crate::layout::Descriptor;
use crate::pool::{AllocError, RawBuf, Reject, StackPool};
use crate::ring::{Consumer, Producer, RingError};

/// A pool of fixed-size buffers shared between stacks.
pub trait BufferPool: Send + Sync + std::fmt::Debug + 'static {
    /// This stack's id in the pool.
    fn stack_id(&self) -> u16;
    /// Takes a buffer of at least `len` bytes.
    fn alloc(&self, len: usize, wait: bool) -> Result<RawBuf, AllocError>;
    /// Returns a buffer this stack owns.
    fn free(&self, b: RawBuf);
    /// Data pointer and capacity.
    fn data(&self, b: RawBuf) -> (*mut u8, usize);
    /// Hands ownership to stack `to` and builds the descriptor.
    fn prepare_send(&self, b: RawBuf, len: u32, to: u16, conn: u32, kind: u8) -> Descriptor;
    /// Validates a descriptor received from stack `from` and takes the
    /// buffer.
    fn accept(&self, from: u16, d: &Descriptor) -> Result<RawBuf, Reject>;
    /// Makes a received buffer writable again.
    fn reuse(&self, b: RawBuf);
    /// Largest buffer size.
    fn max_buf(&self) -> usize;
    /// The pool's identity (its segment's, [`Region::ident`]): equal for
    /// every stack of one pool, so a stack can tell its pool's buffers
    /// from another pool's.
    ///
    /// [`Region::ident`]: crate::segment::Region::ident
    fn pool_id(&self) -> u64;
}

impl BufferPool for StackPool {
    fn stack_id(&self) -> u16 {
        StackPool::stack_id(self)
    }
    fn alloc(&self, len: usize, wait: bool) -> Result<RawBuf, AllocError> {
        StackPool::alloc(self, len, wait)
    }
    fn free(&self, b: RawBuf) {
        StackPool::free(self, b)
    }
    fn data(&self, b: RawBuf) -> (*mut u8, usize) {
        self.view().data(b)
    }
    fn prepare_send(&self, b: RawBuf, len: u32, to: u16, conn: u32, kind: u8) -> Descriptor {
        self.view()
            .prepare_send(self.stack_id(), b, len, to, conn, kind)
    }
    fn accept(&self, from: u16, d: &Descriptor) -> Result<RawBuf, Reject> {
        self.view().accept(self.stack_id(), from, d)
    }
    fn reuse(&self, b: RawBuf) {
        StackPool::reuse(self, b)
    }
    fn max_buf(&self) -> usize {
        self.view()
            .segment()
            .classes()
            .last()
            .map_or(0, |c| c.buf_size as usize)
    }
    fn pool_id(&self) -> u64 {
        self.view().segment().region().ident()
    }
}

/// The sending end of a descriptor ring.
pub trait DescProducer: Send + std::fmt::Debug {
    /// Pushes as many as fit.
    fn push_burst(&mut self, ds: &[Descriptor]) -> Result<usize, RingError>;
    /// Pushes one descriptor given as its words
    /// ([`Descriptor::to_words`], so it travels in registers): `Ok(false)`
    /// when the ring is full.
    fn push_one(&mut self, words: (u64, u64)) -> Result<bool, RingError> {
        Ok(self.push_burst(&[Descriptor::from_words(words)])? == 1)
    }
    /// Descriptors one [`push_burst`](Self::push_burst) can take now (at
    /// least one when any slot is free), from the cached consumer index
    /// when it shows room for at least `want` (no cross-core read), else
    /// freshly read. Rings with a descriptor a slot answer their free
    /// slots.
    fn room(&mut self, want: u32) -> Result<u32, RingError>;
    /// Starts taking the line of the next slot in exclusive state, ahead
    /// of a push (a hint; nothing by default).
    fn prefetch_next(&self) {}
    /// Test hook: publishes a slot claiming `count` descriptors (see
    /// [`Producer::__publish_count`]); `Ok(false)` where slots carry no
    /// count. Not for applications.
    #[doc(hidden)]
    fn __publish_count(&mut self, _count: u32) -> Result<bool, RingError> {
        Ok(false)
    }
}

/// The receiving end of a descriptor ring.
pub trait DescConsumer: Send + std::fmt::Debug {
    /// Pops up to `out.len()`.
    fn pop_burst(&mut self, out: &mut [Descriptor]) -> Result<usize, RingError>;
    /// Whether anything is ready.
    fn has_data(&mut self) -> bool;
    /// A handle that answers [`RingWatch::has_data`] from another thread
    /// while this consumer is not being used.
    fn watch(&self) -> Box<dyn RingWatch>;
}

/// Readiness of a ring, checked without its consumer.
pub trait RingWatch: Send + Sync {
    /// Whether the consumer would find a descriptor.
    fn has_data(&self) -> bool;
}

impl RingWatch for crate::ring::Watch {
    fn has_data(&self) -> bool {
        crate::ring::Watch::has_data(self)
    }
}

impl DescProducer for Producer {
    fn push_burst(&mut self, ds: &[Descriptor]) -> Result<usize, RingError> {
        Producer::push_burst(self, ds)
    }
    fn push_one(&mut self, words: (u64, u64)) -> Result<bool, RingError> {
        Producer::push_one(self, Descriptor::from_words(words))
    }
    fn room(&mut self, want: u32) -> Result<u32, RingError> {
        Producer::room_for(self, want)
    }
    fn prefetch_next(&self) {
        Producer::prefetch_next(self)
    }
    fn __publish_count(&mut self, count: u32) -> Result<bool, RingError> {
        Producer::__publish_count(self, count)
    }
}

impl DescConsumer for Consumer {
    fn pop_burst(&mut self, out: &mut [Descriptor]) -> Result<usize, RingError> {
        Consumer::pop_burst(self, out)
    }
    fn has_data(&mut self) -> bool {
        !self.is_empty()
    }
    fn watch(&self) -> Box<dyn RingWatch> {
        Box::new(Consumer::watch(self))
    }
}

/// Something a sleeping stack can be woken through.
pub trait Doorbell: Send + Sync + std::fmt::Debug {
    /// Wakes the waiter.
    fn ring(&self) -> io::Result<()>;
    /// Sleeps until rung or `timeout`; true if rung. Consumes the ring.
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

//! Copy on receive ([`StackBuilder::copy_on_receive`]): a received message
//! is copied out of the pool into this process's own memory, and the pool
//! buffer freed at once, so what the receiver reads cannot change under
//! it, whatever its sender (or any process that can write the pool) does
//! after sending. FABLE's safe mode, for receivers that must not trust
//! their senders; the default stays zero-copy.
//!
//! The copies are `Buf`s like any other, over a [`PrivatePool`]: private
//! heap memory the stack hands out by index. Made writable, such a buffer
//! is the receiver's to change; sent on (the forwarder pattern), it is
//! copied into a pool buffer first, so the same code runs in both modes.
//!
//! [`StackBuilder::copy_on_receive`]: super::StackBuilder::copy_on_receive

use std::sync::Mutex;

use crate::backend::{AllocError, BufferPool, RawBuf, Reject};
use crate::buf::{Buf, BufMut};
use crate::layout::Descriptor;

use super::Error;

/// Private buffers, by index: each a heap allocation of its message's
/// size, freed with its `Buf`.
#[derive(Debug, Default)]
pub(super) struct PrivatePool {
    slab: Mutex<Slab>,
}

#[derive(Debug, Default)]
struct Slab {
    bufs: Vec<Option<Box<[u8]>>>,
    free: Vec<u32>,
}

impl PrivatePool {
    /// A private copy of `b`'s payload; `b` goes back to its pool.
    pub(super) fn copy_of(self: &std::sync::Arc<Self>, b: Buf) -> Buf {
        let data: Box<[u8]> = Box::from(&b[..]);
        let len = data.len();
        drop(b);
        let index = {
            let mut s = self.slab.lock().unwrap_or_else(|e| e.into_inner());
            match s.free.pop() {
                Some(i) => {
                    s.bufs[i as usize] = Some(data);
                    i
                }
                None => {
                    s.bufs.push(Some(data));
                    (s.bufs.len() - 1) as u32
                }
            }
        };
        Buf::new(self.clone(), RawBuf { class: 0, index }, len)
    }
}

impl BufferPool for PrivatePool {
    #[cfg(any(test, feature = "test-support"))]
    fn stack_id(&self) -> u16 {
        0
    }
    /// Never asked: only copies are made here ([`PrivatePool::copy_of`]).
    fn alloc(&self, len: usize, _wait: bool) -> Result<RawBuf, AllocError> {
        Err(AllocError::TooLarge(len))
    }
    fn free(&self, b: RawBuf) {
        let mut s = self.slab.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(slot) = s.bufs.get_mut(b.index as usize) {
            if slot.take().is_some() {
                s.free.push(b.index);
            }
        }
    }
    fn data(&self, b: RawBuf) -> (*mut u8, usize) {
        let mut s = self.slab.lock().unwrap_or_else(|e| e.into_inner());
        match s.bufs.get_mut(b.index as usize).and_then(Option::as_mut) {
            // The box's heap memory stays where it is while the slab's
            // vector moves; it is freed only by `free`, when its `Buf` goes.
            Some(d) => (d.as_mut_ptr(), d.len()),
            None => (std::ptr::NonNull::dangling().as_ptr(), 0),
        }
    }
    /// Never called: a stack refuses to send a buffer of another pool
    /// before it stamps it (`Stack::check_ours`).
    fn prepare_send(&self, _b: RawBuf, _len: u32, _to: u16, _conn: u32, _kind: u8) -> Descriptor {
        Descriptor::default()
    }
    fn accept(&self, _from: u16, d: &Descriptor) -> Result<RawBuf, Reject> {
        Err(Reject::Class(d.class))
    }
    /// Private memory is writable as it is.
    fn reuse(&self, _b: RawBuf) {}
    /// This pool's address: no segment's (theirs are their mappings').
    fn pool_id(&self) -> u64 {
        self as *const Self as u64
    }
}

impl super::Stack {
    /// Turns copy on receive on or off for the messages received from now
    /// on (see [`StackBuilder::copy_on_receive`]); those already received
    /// stay as they are.
    ///
    /// [`StackBuilder::copy_on_receive`]: super::StackBuilder::copy_on_receive
    pub fn set_copy_on_receive(&mut self, on: bool) {
        match (on, self.private.is_some()) {
            (true, false) => self.private = Some(std::sync::Arc::new(PrivatePool::default())),
            (false, true) => self.private = None,
            _ => {}
        }
    }

    /// `b` as the receiver should see it: a private copy in
    /// copy-on-receive mode (the pool buffer goes back), `b` itself
    /// otherwise. For the socket layer's zero-copy reads.
    pub(crate) fn private_copy(&self, b: Buf) -> Buf {
        match &self.private {
            Some(p) => p.copy_of(b),
            None => b,
        }
    }

    /// The identity of this stack's private pool, in copy-on-receive mode.
    pub(crate) fn private_pool_id(&self) -> Option<u64> {
        self.private.as_ref().map(|p| p.pool_id())
    }

    /// A pool copy of `b` if it is a private copy of this stack's (a
    /// received message made writable, in copy-on-receive mode) about to
    /// be sent: so code that forwards what it receives works the same in
    /// both modes. Waits for the pool buffer per the stack's mode. `None`
    /// for anything else, which `check_ours` judges.
    pub(super) fn pool_copy(&self, b: &BufMut) -> Result<Option<BufMut>, Error> {
        match &self.private {
            Some(p) if b.pool_id() == p.pool_id() => {
                let mut n = self.alloc(b.len())?;
                n.set_len(b.len());
                n.copy_from_slice(b);
                Ok(Some(n))
            }
            _ => Ok(None),
        }
    }

    /// Whether received messages are copied out of the pool.
    pub fn copies_on_receive(&self) -> bool {
        self.private.is_some()
    }
}

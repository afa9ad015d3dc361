//! Allocating buffers ([`Stack::alloc`], [`Stack::alloc_burst`],
//! [`Stack::try_alloc`]), and the pool references a stack recycles: those
//! of the buffers it sends go to the buffers it receives or allocates
//! next, which saves a locked increment and decrement per buffer.

use std::sync::Arc;

use crate::backend::{AllocError, AnyPool, BufferPool, RawBuf};
use crate::buf::BufMut;
use crate::wait::WaitMode;

use super::waiting::backoff_wait;
use super::{Error, Stack, BURST, REFS_KEPT};

/// Takes `b` apart for sending, keeping its pool reference in `refs` for
/// the next received buffer when it is a reference to `pool` and `refs`
/// has room (it is released otherwise, a locked decrement).
pub(super) fn take_for_send(
    refs: &mut Vec<Arc<dyn BufferPool>>,
    pool: &AnyPool,
    b: BufMut,
) -> (RawBuf, usize) {
    let (raw, len, p) = b.into_parts();
    if refs.len() < REFS_KEPT && Arc::as_ptr(&p).cast::<()>() == pool.addr() {
        refs.push(p);
    }
    (raw, len)
}

impl Stack {
    /// A reference to our pool for a buffer being received or allocated:
    /// one kept from a buffer we sent when there is one (moved, not
    /// counted), a new one (a locked increment) otherwise.
    pub(super) fn pool_ref(&self) -> Arc<dyn BufferPool> {
        let kept = self.refs.borrow_mut().pop();
        kept.unwrap_or_else(|| self.pool.shared())
    }

    /// Makes sure `n` (at most [`REFS_KEPT`]) pool references are kept,
    /// so the next `n` [`Stack::pool_ref`]s make none.
    pub(super) fn keep_refs(&mut self, n: usize) {
        let refs = self.refs.get_mut();
        while refs.len() < n.min(REFS_KEPT) {
            refs.push(self.pool.shared());
        }
    }

    /// A writable buffer of at least `len` bytes. When the pool is
    /// exhausted this waits (per the mode) for buffers to come back;
    /// it never fails for lack of buffers except in non-blocking mode.
    pub fn alloc(&self, len: usize) -> Result<BufMut, Error> {
        let mut backoff = 0u32;
        loop {
            match self.pool.alloc(len, self.mode != WaitMode::NonBlocking) {
                Ok(raw) => return Ok(BufMut::new(self.pool_ref(), raw, len)),
                Err(AllocError::TooLarge(n)) => return Err(Error::TooLarge(n)),
                Err(AllocError::Forked) => return Err(Error::Forked),
                Err(AllocError::ManagerGone) => return Err(Error::ManagerGone),
                Err(AllocError::Exhausted) => {
                    if self.mode == WaitMode::NonBlocking {
                        return Err(Error::WouldBlock);
                    }
                    backoff_wait(&mut backoff, self.mode);
                }
            }
        }
    }

    /// Allocates `n` buffers of `len` bytes into `out` with one pass over
    /// the private cache: the burst path of [`Stack::alloc`]. While it
    /// waits for buffers it holds none of them (a burst that kept what it
    /// had waited for ever on anyone who needed one more before freeing
    /// theirs, another such burst say), so it gets all `n` at once or
    /// waits. `n` beyond what the class holds, or beyond this stack's
    /// quota of it, could never be met: it fails at once with
    /// [`Error::BurstTooLarge`] (`InvalidInput`). On an error
    /// `out` is as it was.
    pub fn alloc_burst(&self, len: usize, n: usize, out: &mut Vec<BufMut>) -> Result<(), Error> {
        // Checked once per call, not per buffer: the class table is read
        // only (a `len` past every class fails below as `TooLarge`).
        if let Some(class) = self
            .seg
            .classes()
            .iter()
            .position(|c| c.buf_size as usize >= len)
        {
            let count = self
                .pool
                .class_count(&self.seg, class)
                .min(self.pool.class_quota(class));
            if n > count {
                return Err(Error::BurstTooLarge { n, len, count });
            }
        }
        let mut raws = [RawBuf { class: 0, index: 0 }; BURST];
        let start = out.len();
        let mut done = 0;
        let mut backoff = 0u32;
        while done < n {
            let want = (n - done).min(BURST);
            let got = match self.pool.alloc_many(len, &mut raws[..want]) {
                Ok(g) => g,
                Err(
                    e @ (AllocError::TooLarge(_) | AllocError::Forked | AllocError::ManagerGone),
                ) => {
                    out.truncate(start);
                    return Err(match e {
                        AllocError::TooLarge(l) => Error::TooLarge(l),
                        AllocError::Forked => Error::Forked,
                        _ => Error::ManagerGone,
                    });
                }
                Err(AllocError::Exhausted) => 0,
            };
            for &raw in &raws[..got] {
                out.push(BufMut::new(self.pool_ref(), raw, len));
            }
            done += got;
            if got == 0 {
                // Give back what this call took before waiting.
                out.truncate(start);
                done = 0;
                if self.mode == WaitMode::NonBlocking {
                    return Err(Error::WouldBlock);
                }
                backoff_wait(&mut backoff, self.mode);
            }
        }
        Ok(())
    }

    /// A writable buffer, or [`Error::WouldBlock`] if the pool is exhausted
    /// ([`Error::ManagerGone`] if what it needs is behind a free list the
    /// manager died holding closed: no wait would end that).
    pub fn try_alloc(&self, len: usize) -> Result<BufMut, Error> {
        match self.pool.alloc(len, false) {
            Ok(raw) => Ok(BufMut::new(self.pool_ref(), raw, len)),
            Err(AllocError::TooLarge(n)) => Err(Error::TooLarge(n)),
            Err(AllocError::Exhausted) => Err(Error::WouldBlock),
            Err(AllocError::Forked) => Err(Error::Forked),
            Err(AllocError::ManagerGone) => Err(Error::ManagerGone),
        }
    }

    /// How many buffers of the smallest class this stack may keep aside
    /// beyond its pool cache, at most `want`: a quarter of the class's
    /// share per admitted stack (the pool caches take at most half of
    /// it), so what every stack keeps cannot empty the class.
    pub(crate) fn keep_aside(&self, want: usize) -> usize {
        let stacks = self.seg.max_stacks().max(1) as usize;
        want.min(self.pool.class_count(&self.seg, 0) / (4 * stacks))
    }
}

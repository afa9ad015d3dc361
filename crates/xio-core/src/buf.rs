//! Ownership-typed pool buffers.
//!
//! ```text
//! alloc ──> BufMut (unique, writable) ──send──> [in flight] ──recv──> Buf (read-only)
//!              ^                                                       │
//!              └──────────────── Buf::into_mut (same buffer) ──────────┘
//! ```
//! Dropping either returns the buffer to the pool. The payload never moves.

use std::fmt;
use std::sync::Arc;

use crate::backend::{BufferPool, RawBuf};

/// A writable pool buffer, owned by this process alone.
pub struct BufMut {
    pool: Arc<dyn BufferPool>,
    raw: RawBuf,
    len: usize,
    cap: usize,
    ptr: *mut u8,
}

/// A received, read-only pool buffer. Returns to the pool when dropped;
/// [`Buf::into_mut`] makes it writable again to modify and forward in place.
pub struct Buf {
    pool: Arc<dyn BufferPool>,
    raw: RawBuf,
    len: usize,
    ptr: *const u8,
    cap: usize,
    /// Bytes skipped at the front by [`Buf::advance`].
    off: usize,
}

// SAFETY: the buffer is exclusively owned (the pool protocol hands each
// buffer to one owner), so moving it to another thread is like moving a Vec.
unsafe impl Send for BufMut {}
// SAFETY: shared access is read-only.
unsafe impl Sync for BufMut {}
// SAFETY: as for BufMut.
unsafe impl Send for Buf {}
// SAFETY: read-only.
unsafe impl Sync for Buf {}

impl BufMut {
    pub(crate) fn new(pool: Arc<dyn BufferPool>, raw: RawBuf, len: usize) -> Self {
        let (ptr, cap) = pool.data(raw);
        debug_assert!(len <= cap);
        Self {
            pool,
            raw,
            len,
            cap,
            ptr,
        }
    }

    /// Bytes of payload.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The buffer's size (its class).
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Sets the payload length (bytes past the old length keep whatever the
    /// buffer held: pool memory is never uninitialised, only stale).
    ///
    /// # Panics
    /// If `len` exceeds the capacity.
    pub fn set_len(&mut self, len: usize) {
        assert!(
            len <= self.cap,
            "length {len} beyond buffer capacity {}",
            self.cap
        );
        self.len = len;
    }

    /// Replaces the payload with a copy of `src`.
    ///
    /// # Panics
    /// If `src` is longer than the capacity.
    pub fn copy_from(&mut self, src: &[u8]) {
        self.set_len(src.len());
        self.copy_from_slice(src);
    }

    /// The whole buffer, up to its capacity.
    pub fn as_full_mut(&mut self) -> &mut [u8] {
        // SAFETY: we own the buffer exclusively (state ALLOCATED, owner us);
        // ptr..ptr+cap lies in the mapped segment, which `pool` keeps alive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.cap) }
    }

    /// Makes this buffer a read-only [`Buf`] of this process without
    /// sending it (what a connection to the same process delivers).
    pub fn freeze(self) -> Buf {
        let (raw, len) = (self.raw, self.len);
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is not used or dropped after the pool Arc is moved out.
        let pool = unsafe { std::ptr::read(&this.pool) };
        Buf::new(pool, raw, len)
    }

    /// The identity of the pool this buffer belongs to.
    pub(crate) fn pool_id(&self) -> u64 {
        self.pool.pool_id()
    }

    /// The address of the stack pool object this buffer returns to.
    pub(crate) fn pool_addr(&self) -> *const () {
        Arc::as_ptr(&self.pool).cast()
    }

    /// The buffer's identity and length for a descriptor, and its pool
    /// reference, which a stack keeps for the next buffer it receives (a
    /// reference moved is a locked increment and a locked decrement saved).
    pub(crate) fn into_parts(self) -> (RawBuf, usize, Arc<dyn BufferPool>) {
        // Ownership moves into the descriptor; the pool is told by the send.
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is never used or dropped again; the Arc is moved
        // out once, so its count is neither lost nor released twice.
        let pool = unsafe { std::ptr::read(&this.pool) };
        (this.raw, this.len, pool)
    }
}

impl std::ops::Deref for BufMut {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: as in `as_full_mut`, and len <= cap.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl std::ops::DerefMut for BufMut {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_full_mut`, and len <= cap.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for BufMut {
    fn drop(&mut self) {
        self.pool.free(self.raw);
    }
}

impl fmt::Debug for BufMut {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BufMut")
            .field("buf", &self.raw)
            .field("len", &self.len)
            .finish()
    }
}

impl Buf {
    pub(crate) fn new(pool: Arc<dyn BufferPool>, raw: RawBuf, len: usize) -> Self {
        let (ptr, cap) = pool.data(raw);
        debug_assert!(len <= cap);
        Self {
            pool,
            raw,
            len,
            ptr,
            cap,
            off: 0,
        }
    }

    /// The buffer's size (its class): the pool memory it holds.
    pub fn capacity(&self) -> usize {
        self.cap
    }

    /// Drops the first `n` bytes of the payload (the buffer is unchanged;
    /// only this view moves).
    ///
    /// # Panics
    /// If `n` exceeds the length.
    pub fn advance(&mut self, n: usize) {
        assert!(n <= self.len, "advance {n} past length {}", self.len);
        // SAFETY: n <= len, so the new pointer stays inside the buffer.
        self.ptr = unsafe { self.ptr.add(n) };
        self.len -= n;
        self.off += n;
    }

    /// Bytes of payload.
    pub fn len(&self) -> usize {
        self.len
    }

    /// True when the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `bytes` in the buffer's spare capacity if they fit; false
    /// (and nothing written) if not. The socket layer packs small received
    /// chunks this way while a reader lags.
    pub(crate) fn append(&mut self, bytes: &[u8]) -> bool {
        let used = self.off + self.len;
        if self.cap - used < bytes.len() {
            return false;
        }
        // SAFETY: this `Buf` is the only handle to its buffer (the pool
        // hands each buffer to one owner: `accept` takes a received one
        // from INFLIGHT to HELD once, and a loopback one is a frozen
        // `BufMut` of ours), so nobody else reads or writes it, and
        // `&mut self` means no slice of it is borrowed. `self.ptr` is the
        // buffer's start plus `off`, and `off + len + bytes.len() <= cap`
        // (checked above) keeps the copy inside it. `bytes` is not in
        // this buffer: no other handle to it exists to lend a slice, and
        // `self` lends none while mutably borrowed.
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.ptr.add(self.len).cast_mut(),
                bytes.len(),
            );
        }
        self.len += bytes.len();
        true
    }

    /// Makes the buffer writable again without a new allocation: the
    /// L2-forwarder pattern (receive, rewrite a header, send on).
    pub fn into_mut(self) -> BufMut {
        let this = std::mem::ManuallyDrop::new(self);
        // SAFETY: `this` is not used or dropped after the pool Arc is moved out.
        let pool = unsafe { std::ptr::read(&this.pool) };
        pool.reuse(this.raw);
        let mut m = BufMut::new(pool, this.raw, this.off + this.len);
        if this.off > 0 {
            m.as_full_mut()
                .copy_within(this.off..this.off + this.len, 0);
            m.set_len(this.len);
        }
        m
    }
}

impl std::ops::Deref for Buf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: we hold the buffer (state HELD, owner us), nobody writes it
        // while we do; ptr..ptr+len is in the segment `pool` keeps mapped
        // (or, for a copy on receive, in the private allocation `pool`
        // keeps until this `Buf` is freed).
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

impl AsRef<[u8]> for Buf {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl AsRef<[u8]> for BufMut {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        self.pool.free(self.raw);
    }
}

impl fmt::Debug for Buf {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Buf")
            .field("buf", &self.raw)
            .field("len", &self.len)
            .finish()
    }
}

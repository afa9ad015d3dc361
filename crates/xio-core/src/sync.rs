//! The one place lock-free code takes its atomics and cells from.
//!
//! Under `--cfg loom` these are loom's model-checked types, so the ring and
//! the pool free list are checked by the same code that runs in production.

#[cfg(loom)]
pub(crate) use loom::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, Ordering};

#[cfg(not(loom))]
pub(crate) use std::sync::atomic::{fence, AtomicPtr, AtomicU32, AtomicU64, Ordering};

/// A cell whose accesses loom can track; a thin wrapper over
/// `core::cell::UnsafeCell` otherwise.
#[cfg(not(loom))]
#[derive(Debug)]
#[repr(transparent)]
pub(crate) struct UnsafeCell<T>(core::cell::UnsafeCell<T>);

#[cfg(not(loom))]
impl<T: Default> Default for UnsafeCell<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

#[cfg(loom)]
impl<T: Default> Default for UnsafeCell<T> {
    fn default() -> Self {
        Self::new(T::default())
    }
}

#[cfg(not(loom))]
impl<T> UnsafeCell<T> {
    pub(crate) const fn new(v: T) -> Self {
        Self(core::cell::UnsafeCell::new(v))
    }
    /// Reads the value.
    ///
    /// # Safety
    /// No other access to the cell may be in progress.
    #[inline]
    pub(crate) unsafe fn read(&self) -> T
    where
        T: Copy,
    {
        // SAFETY: the caller guarantees exclusive access for the read.
        unsafe { self.0.get().read_volatile() }
    }
    /// Writes the value.
    ///
    /// # Safety
    /// No other access to the cell may be in progress.
    #[inline]
    pub(crate) unsafe fn write(&self, v: T) {
        // SAFETY: the caller guarantees exclusive access for the write.
        unsafe { self.0.get().write_volatile(v) }
    }
}

#[cfg(loom)]
#[derive(Debug)]
pub(crate) struct UnsafeCell<T>(loom::cell::UnsafeCell<T>);

#[cfg(loom)]
impl<T> UnsafeCell<T> {
    pub(crate) fn new(v: T) -> Self {
        Self(loom::cell::UnsafeCell::new(v))
    }
    pub(crate) unsafe fn read(&self) -> T
    where
        T: Copy,
    {
        // SAFETY: forwarded to the caller.
        self.0.with(|p| unsafe { p.read() })
    }
    pub(crate) unsafe fn write(&self, v: T) {
        // SAFETY: forwarded to the caller.
        self.0.with_mut(|p| unsafe { p.write(v) })
    }
}

/// Hint to the CPU that we are spinning (loom: yield to the model).
#[inline]
pub(crate) fn spin_hint() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::hint::spin_loop();
}

/// Gives the CPU to another thread while waiting on one that may not be
/// running (loom: yield to the model).
#[inline]
pub(crate) fn yield_thread() {
    #[cfg(loom)]
    loom::thread::yield_now();
    #[cfg(not(loom))]
    std::thread::yield_now();
}

/// Starts loading the cache line at `p` in exclusive state (x86-64
/// `PREFETCHW`), for a line about to be read and then written: one
/// coherence transaction instead of a shared read followed by an upgrade.
#[inline]
pub(crate) fn prefetch_write<T>(p: *const T) {
    // Inline assembly because `_mm_prefetch::<_MM_HINT_ET0>` becomes a
    // plain `prefetcht0` unless the crate is built with `prfchw` enabled.
    // Processors without PREFETCHW execute the opcode as a NOP.
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch is only a hint: it never faults (not even on an
    // unmapped address), writes no register, flag or memory.
    unsafe {
        core::arch::asm!(
            "prefetchw [{0}]",
            in(reg) p,
            options(nostack, preserves_flags, readonly)
        )
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// Pads and aligns a value to 128 bytes: two cache lines, because adjacent-line
/// prefetch on x86-64 pulls pairs of lines (the reasoning of crossbeam's
/// `CachePadded`). `#[repr(C)]` so it can live in shared memory.
///
/// Not crossbeam-utils' `CachePadded`, which every use here would otherwise
/// be: all of them are fields of the segment layout, which C and Go read too
/// and whose version the header carries. crossbeam's type is not
/// `#[repr(C)]`, and its alignment depends on the target and may change
/// with the crate (128 on x86-64, 256 on s390x, 64 or 32 elsewhere); a
/// layout that moved with a dependency's release would break every process
/// built against the one before.
#[derive(Debug, Default)]
#[repr(C, align(128))]
pub struct CachePadded<T>(pub T);

impl<T> core::ops::Deref for CachePadded<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// Sleeps while `word` holds `expected` (a futex shared between processes:
/// no PRIVATE flag), at most `timeout`. Spurious returns are allowed.
#[cfg(not(loom))]
pub(crate) fn futex_wait(word: &AtomicU32, expected: u32, timeout: Option<std::time::Duration>) {
    let ts = timeout.map(|d| rustix::time::Timespec {
        tv_sec: d.as_secs().min(i64::MAX as u64) as i64,
        tv_nsec: d.subsec_nanos() as _,
    });
    let _ = rustix::thread::futex::wait(
        word,
        rustix::thread::futex::Flags::empty(),
        expected,
        ts.as_ref(),
    );
}

/// Wakes every process sleeping in [`futex_wait`] on `word`.
#[cfg(not(loom))]
pub(crate) fn futex_wake(word: &AtomicU32) {
    let _ =
        rustix::thread::futex::wake(word, rustix::thread::futex::Flags::empty(), i32::MAX as u32);
}

#[cfg(loom)]
pub(crate) fn futex_wait(_: &AtomicU32, _: u32, _: Option<std::time::Duration>) {
    loom::thread::yield_now();
}

#[cfg(loom)]
pub(crate) fn futex_wake(_: &AtomicU32) {}

/// A fast hasher for the small integer keys of in-process tables
/// (connection ids, stack ids, addresses): the FxHash step (rotate, xor,
/// multiply), as rustc uses. Not for keys an attacker picks to collide:
/// the tables it serves are keyed by our own ids, or by peers of the same
/// uid that can already write the whole segment.
#[derive(Clone, Copy, Default)]
pub(crate) struct FxHasher {
    hash: u64,
}

const FX_SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl std::hash::Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut b = [0u8; 8];
            b[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(b));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.write_u64(u64::from(i));
    }
    #[inline]
    fn write_u16(&mut self, i: u16) {
        self.write_u64(u64::from(i));
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.write_u64(u64::from(i));
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.hash = (self.hash.rotate_left(5) ^ i).wrapping_mul(FX_SEED);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.write_u64(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// A `HashMap` with [`FxHasher`].
pub(crate) type FxHashMap<K, V> =
    std::collections::HashMap<K, V, std::hash::BuildHasherDefault<FxHasher>>;

//! The shared segment: a sealed memfd mapped `MAP_SHARED` (or, for fast
//! in-process tests, a zeroed heap allocation with the same layout), and
//! checked accessors for everything the layout places in it.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;
use std::sync::Arc;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::mm::{MapFlags, ProtFlags};

use crate::sync::AtomicU32;

use crate::layout::{
    BufHeader, ChannelHeader, ClassInfo, FreeHead, Geometry, Magazine, PoolConfig, RingHeader,
    SegmentHeader, StackSlot, LAYOUT_VERSION, MAGIC, MAX_CLASSES,
};

/// Errors opening or creating a segment.
#[derive(Debug, thiserror::Error)]
pub enum SegmentError {
    /// A system call failed.
    #[error("{what}: {err}")]
    Os {
        /// What we were doing.
        what: &'static str,
        /// The error.
        err: std::io::Error,
    },
    /// The segment is not an X-IO segment, or of another layout version, or
    /// its header does not fit its size.
    #[error("invalid segment: {0}")]
    Invalid(&'static str),
    /// The pool configuration is invalid.
    #[error(transparent)]
    Config(#[from] crate::layout::ConfigError),
}

fn os(what: &'static str) -> impl FnOnce(rustix::io::Errno) -> SegmentError {
    move |e| SegmentError::Os {
        what,
        err: e.into(),
    }
}

enum Backing {
    Memfd(OwnedFd),
    #[cfg(any(test, feature = "test-support"))]
    Heap(std::alloc::Layout),
}

/// A mapped region of memory holding a segment.
pub struct Region {
    base: NonNull<u8>,
    len: usize,
    backing: Backing,
    /// What every mapping of the same segment shares (see
    /// [`Region::ident`]).
    ident: u64,
}

// SAFETY: the region is plain memory shared with other processes anyway; all
// access to it goes through atomics or through buffers whose ownership the
// pool protocol makes exclusive.
unsafe impl Send for Region {}
// SAFETY: as above.
unsafe impl Sync for Region {}

impl Region {
    /// Creates a sealed memfd of `len` bytes and maps it.
    pub fn create_memfd(name: &str, len: usize) -> Result<Self, SegmentError> {
        let fd = rustix::fs::memfd_create(name, MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING)
            .map_err(os("memfd_create"))?;
        rustix::fs::ftruncate(&fd, len as u64).map_err(os("ftruncate memfd"))?;
        // The size can never change again: a stack that mapped it can trust
        // every offset checked against `len` stays mapped.
        rustix::fs::fcntl_add_seals(&fd, SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL)
            .map_err(os("seal memfd"))?;
        Self::map(fd, len)
    }

    /// Maps a segment fd received from the manager. Refuses an fd that is not
    /// sealed against shrinking (a shrink would turn accesses into SIGBUS).
    pub fn map_fd(fd: OwnedFd) -> Result<Self, SegmentError> {
        let seals = rustix::fs::fcntl_get_seals(&fd).map_err(os("get seals"))?;
        if !seals.contains(SealFlags::SHRINK | SealFlags::GROW) {
            return Err(SegmentError::Invalid(
                "segment fd is not sealed against resizing",
            ));
        }
        let st = rustix::fs::fstat(&fd).map_err(os("fstat segment"))?;
        let len = usize::try_from(st.st_size).map_err(|_| SegmentError::Invalid("size"))?;
        Self::map(fd, len)
    }

    fn map(fd: OwnedFd, len: usize) -> Result<Self, SegmentError> {
        if len < core::mem::size_of::<SegmentHeader>() {
            return Err(SegmentError::Invalid("segment smaller than its header"));
        }
        // SAFETY: a fresh shared mapping of a sealed fd; nothing else in this
        // process refers to the returned range.
        let p = unsafe {
            rustix::mm::mmap(
                core::ptr::null_mut(),
                len,
                ProtFlags::READ | ProtFlags::WRITE,
                MapFlags::SHARED,
                &fd,
                0,
            )
        }
        .map_err(os("mmap segment"))?;
        let base = NonNull::new(p.cast::<u8>()).ok_or(SegmentError::Invalid("null mapping"))?;
        let st = rustix::fs::fstat(&fd).map_err(os("fstat segment"))?;
        Ok(Self {
            base,
            len,
            backing: Backing::Memfd(fd),
            ident: (st.st_dev as u64).rotate_left(32) ^ st.st_ino as u64,
        })
    }

    /// A zeroed heap region: the same layout without a kernel object, for
    /// in-process tests and single-process use.
    #[cfg(any(test, feature = "test-support"))]
    pub fn heap(len: usize) -> Result<Self, SegmentError> {
        let layout = std::alloc::Layout::from_size_align(len.max(4096), 4096)
            .map_err(|_| SegmentError::Invalid("heap layout"))?;
        // SAFETY: non-zero size.
        let p = unsafe { std::alloc::alloc_zeroed(layout) };
        let base = NonNull::new(p).ok_or(SegmentError::Invalid("out of memory"))?;
        Ok(Self {
            base,
            len,
            backing: Backing::Heap(layout),
            ident: base.as_ptr() as u64,
        })
    }

    /// The memfd, if this region has one.
    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        match &self.backing {
            Backing::Memfd(fd) => Some(fd.as_fd()),
            #[cfg(any(test, feature = "test-support"))]
            Backing::Heap(_) => None,
        }
    }

    /// The segment's identity in this process: equal for every mapping of
    /// one segment (a memfd's device and inode; a heap region's address),
    /// different between segments, so a buffer of one pool is not taken
    /// for a buffer of another.
    pub fn ident(&self) -> u64 {
        self.ident
    }

    /// Bytes mapped.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: a region holds at least a header.
    #[cfg(any(test, feature = "test-support"))]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Overwrites the region's bytes at `off` with `bytes` (clipped to the
    /// region): what a process that can write the segment may do at any
    /// time. For the fuzz targets and tests, from one thread.
    #[cfg(any(test, feature = "test-support"))]
    #[doc(hidden)]
    pub fn __scribble(&self, off: usize, bytes: &[u8]) {
        let off = off.min(self.len);
        let n = bytes.len().min(self.len - off);
        // SAFETY: `off + n` is within the mapping, which lives as long as
        // `self`; `bytes` is not in it (a caller's slice). Every reader of
        // the region reads through atomics or volatile copies that it then
        // checks, so bytes written here are only what another process's
        // writes could be; the caller runs no other thread on the region.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.base.as_ptr().add(off), n) }
    }
}

impl Drop for Region {
    fn drop(&mut self) {
        match &self.backing {
            Backing::Memfd(_) => {
                // SAFETY: we mapped exactly this range and every reference
                // into it is tied to an `Arc<Region>` that is now gone.
                let _ = unsafe { rustix::mm::munmap(self.base.as_ptr().cast(), self.len) };
            }
            #[cfg(any(test, feature = "test-support"))]
            Backing::Heap(layout) => {
                // SAFETY: allocated in `heap` with this layout.
                unsafe { std::alloc::dealloc(self.base.as_ptr(), *layout) }
            }
        }
    }
}

/// [`SegmentHeader`] without its atomic: what `Segment::open` reads of it,
/// once.
struct HeaderCopy {
    magic: u64,
    version: u32,
    n_classes: u32,
    total_len: u64,
    max_stacks: u32,
    max_channels: u32,
    ring_capacity: u32,
    channel_stride: u32,
    backend: u32,
    free_heads_off: u64,
    stacks_off: u64,
    channels_off: u64,
    classes: [ClassInfo; MAX_CLASSES],
}

/// A validated segment: a region plus its geometry, copied out of the header
/// once and checked against the region's size, so later accessors only need
/// to check indices.
#[derive(Clone)]
pub struct Segment {
    region: Arc<Region>,
    n_classes: usize,
    classes: [ClassInfo; MAX_CLASSES],
    max_stacks: u32,
    max_channels: u32,
    ring_capacity: u32,
    channel_stride: u64,
    free_heads_off: u64,
    stacks_off: u64,
    channels_off: u64,
    backend: u32,
}

impl std::fmt::Debug for Segment {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Segment")
            .field("len", &self.region.len)
            .field("classes", &self.classes())
            .field("max_stacks", &self.max_stacks)
            .field("max_channels", &self.max_channels)
            .finish()
    }
}

impl Segment {
    /// Lays out a fresh (zeroed) region for `cfg` and writes its header.
    /// Manager side.
    pub fn init(region: Region, cfg: &PoolConfig, geo: &Geometry) -> Result<Self, SegmentError> {
        Self::init_for(region, cfg, geo, crate::layout::backend::SHM)
    }

    /// [`Segment::init`] recording `backend` (see [`crate::layout::backend`]).
    pub fn init_for(
        region: Region,
        cfg: &PoolConfig,
        geo: &Geometry,
        backend: u32,
    ) -> Result<Self, SegmentError> {
        if (region.len as u64) < geo.total_len {
            return Err(SegmentError::Invalid(
                "region smaller than the pool geometry",
            ));
        }
        let mut classes = [ClassInfo::default(); MAX_CLASSES];
        classes[..geo.classes.len()].copy_from_slice(&geo.classes);
        let hdr = SegmentHeader {
            magic: MAGIC,
            version: LAYOUT_VERSION,
            n_classes: geo.classes.len() as u32,
            total_len: geo.total_len,
            max_stacks: cfg.max_stacks,
            max_channels: cfg.max_channels,
            ring_capacity: cfg.ring_capacity,
            channel_stride: geo.channel_stride,
            backend,
            manager_alive: AtomicU32::new(0),
            free_heads_off: geo.free_heads_off,
            stacks_off: geo.stacks_off,
            channels_off: geo.channels_off,
            classes,
        };
        // SAFETY: the region is at least a header long, page aligned, and
        // nobody else has it yet.
        unsafe { region.base.as_ptr().cast::<SegmentHeader>().write(hdr) };
        Self::open(region)
    }

    /// Validates a region's header. Stack side (and the manager's own view).
    pub fn open(region: Region) -> Result<Self, SegmentError> {
        let p = region.base.as_ptr().cast::<SegmentHeader>();
        // Each field read once, into a copy that is then checked and kept:
        // the header is shared memory any attached process can write, and
        // checking the mapping's values and then copying them afresh let
        // one changed in between in unchecked (out-of-bounds accesses
        // later). Field by field: a copy of the whole header would read the
        // atomic `manager_alive` non-atomically.
        macro_rules! field {
            ($f:ident) => {
                // SAFETY: `map` checked the region holds a header; the field
                // is plain data (`ShmSafe`), read without a reference.
                unsafe { std::ptr::read_volatile(&raw const (*p).$f) }
            };
        }
        let h = HeaderCopy {
            magic: field!(magic),
            version: field!(version),
            n_classes: field!(n_classes),
            total_len: field!(total_len),
            max_stacks: field!(max_stacks),
            max_channels: field!(max_channels),
            ring_capacity: field!(ring_capacity),
            channel_stride: field!(channel_stride),
            backend: field!(backend),
            free_heads_off: field!(free_heads_off),
            stacks_off: field!(stacks_off),
            channels_off: field!(channels_off),
            classes: field!(classes),
        };
        if h.magic != MAGIC {
            return Err(SegmentError::Invalid("bad magic: not an X-IO segment"));
        }
        if h.version != LAYOUT_VERSION {
            return Err(SegmentError::Invalid("segment layout version mismatch"));
        }
        let len = region.len as u64;
        if h.total_len > len {
            return Err(SegmentError::Invalid(
                "header claims more bytes than mapped",
            ));
        }
        let n = h.n_classes as usize;
        if h.backend > crate::layout::backend::DPDK {
            return Err(SegmentError::Invalid("unknown backend"));
        }
        if n == 0 || n > MAX_CLASSES {
            return Err(SegmentError::Invalid("class count"));
        }
        // As `PoolConfig::geometry` allows: a stack divides by the stack
        // count (its cache share), and a ring of one slot is none.
        if !h.ring_capacity.is_power_of_two()
            || !(2..=1 << 20).contains(&h.ring_capacity)
            || !(1..=65534).contains(&h.max_stacks)
            || h.max_channels == 0
        {
            return Err(SegmentError::Invalid("ring capacity, stack or channel count"));
        }
        // Aligned for the type placed there (128 for those holding
        // `CachePadded` fields, a cache line at least): a reference to a
        // misaligned one is undefined behaviour, whatever x86 makes of it.
        let fits = |off: u64, n: u64, size: u64, align: usize| -> bool {
            n.checked_mul(size)
                .and_then(|b| b.checked_add(off))
                .is_some_and(|end| end <= len)
                && off % align.max(64) as u64 == 0
        };
        use core::mem::align_of;
        let ring_end = crate::layout::ring_offset(h.ring_capacity, 1)
            + crate::layout::ring_bytes(h.ring_capacity);
        let ok = fits(
            h.free_heads_off,
            MAX_CLASSES as u64,
            core::mem::size_of::<FreeHead>() as u64,
            align_of::<FreeHead>(),
        ) && fits(
            h.stacks_off,
            h.max_stacks as u64 + 1,
            core::mem::size_of::<StackSlot>() as u64,
            align_of::<StackSlot>(),
        ) && (h.channel_stride as u64) >= ring_end
            && h.channel_stride % 128 == 0
            && fits(
                h.channels_off,
                h.max_channels as u64,
                h.channel_stride as u64,
                align_of::<ChannelHeader>().max(align_of::<RingHeader>()),
            )
            && h.classes[..n].iter().all(|c| {
                c.buf_size > 0
                    && fits(
                        c.data_off,
                        c.count as u64,
                        crate::layout::buf_stride(c.buf_size),
                        align_of::<BufHeader>(),
                    )
                    && fits(
                        c.mag_off,
                        c.count as u64,
                        core::mem::size_of::<Magazine>() as u64,
                        align_of::<Magazine>(),
                    )
            });
        if !ok {
            return Err(SegmentError::Invalid("header offsets outside the segment"));
        }
        Ok(Self {
            region: Arc::new(region),
            n_classes: n,
            classes: h.classes,
            max_stacks: h.max_stacks,
            max_channels: h.max_channels,
            ring_capacity: h.ring_capacity,
            channel_stride: h.channel_stride as u64,
            free_heads_off: h.free_heads_off,
            stacks_off: h.stacks_off,
            channels_off: h.channels_off,
            backend: h.backend,
        })
    }

    /// Where buffers and rings live (see [`crate::layout::backend`]).
    pub fn backend(&self) -> u32 {
        self.backend
    }

    /// The underlying region.
    pub fn region(&self) -> &Arc<Region> {
        &self.region
    }

    /// The size classes.
    pub fn classes(&self) -> &[ClassInfo] {
        &self.classes[..self.n_classes]
    }

    /// Highest stack id.
    pub fn max_stacks(&self) -> u32 {
        self.max_stacks
    }

    /// Number of channel slots.
    pub fn max_channels(&self) -> u32 {
        self.max_channels
    }

    /// Slots per ring.
    pub fn ring_capacity(&self) -> u32 {
        self.ring_capacity
    }

    #[inline]
    fn at<T: crate::layout::ShmSafe>(&self, off: u64) -> &T {
        // SAFETY: callers pass offsets that `open` proved lie inside the
        // mapping with room for a `T`, suitably aligned (`open` checked
        // each offset against its type's alignment, and strides are
        // multiples of the type's size);
        // every type placed there is `ShmSafe` (valid when zeroed, atomics
        // only), so a shared reference is sound even while other processes
        // use it.
        unsafe { &*self.region.base.as_ptr().add(off as usize).cast::<T>() }
    }

    /// Free-list head of `class` (checked by the caller against `classes()`).
    #[inline]
    pub fn free_head(&self, class: usize) -> &FreeHead {
        assert!(class < self.n_classes);
        self.at(self.free_heads_off + (class * core::mem::size_of::<FreeHead>()) as u64)
    }

    /// The manager's liveness word (see `crate::liveness`).
    #[inline]
    pub fn manager_alive(&self) -> &AtomicU32 {
        &self.at::<SegmentHeader>(0).manager_alive
    }

    /// Slot of stack `id` (1..=max_stacks). Panics on an out-of-range id:
    /// ids come from the manager or are checked before use.
    #[inline]
    pub fn stack_slot(&self, id: u16) -> &StackSlot {
        assert!(
            id != 0 && u32::from(id) <= self.max_stacks,
            "stack id {id} out of range"
        );
        self.at(self.stacks_off + id as u64 * core::mem::size_of::<StackSlot>() as u64)
    }

    /// Header of channel `ch`.
    #[inline]
    pub fn channel(&self, ch: u32) -> &ChannelHeader {
        assert!(ch < self.max_channels, "channel {ch} out of range");
        self.at(self.channels_off + ch as u64 * self.channel_stride)
    }

    /// Raw pointers to ring `dir` of channel `ch`.
    pub(crate) fn ring_ptrs(&self, ch: u32, dir: usize) -> (*const RingHeader, *const u8) {
        assert!(ch < self.max_channels && dir < 2);
        let off = self.channels_off
            + ch as u64 * self.channel_stride
            + crate::layout::ring_offset(self.ring_capacity, dir);
        let hdr: &RingHeader = self.at(off);
        // SAFETY: `open` checked the whole channel slot, both rings included,
        // lies inside the mapping.
        let slots = unsafe {
            self.region
                .base
                .as_ptr()
                .add((off + core::mem::size_of::<RingHeader>() as u64) as usize)
        };
        (hdr as *const RingHeader, slots.cast_const())
    }

    /// The consumer index of ring `dir` of channel `ch` if the slot there
    /// is published (something waits to be read), for the manager's
    /// look at readers that do not read. The index is the consumer's
    /// word: any value reads in range (it is taken modulo the capacity).
    pub(crate) fn ring_pending(&self, ch: u32, dir: usize) -> Option<u32> {
        let (h, slots) = self.ring_ptrs(ch, dir);
        // SAFETY: `ring_ptrs` points at the ring's header inside the
        // mapping (`open` checked the channel slot); atomics only.
        let head = unsafe { &*h }.head.load(crate::sync::Ordering::Acquire);
        let i = (head % self.ring_capacity) as usize;
        // SAFETY: `i` is below the capacity, so the slot lies inside the
        // ring `open` checked; slots are `RingSlot`s (atomics and plain
        // words read only through the atomic `seq` here).
        let slot = unsafe { &*slots.cast::<crate::layout::RingSlot>().add(i) };
        (slot.seq.load(crate::sync::Ordering::Acquire) == head.wrapping_add(1)).then_some(head)
    }

    /// Header of buffer `idx` of `class`; `None` when out of range.
    #[inline]
    pub fn buf_header(&self, class: usize, idx: u32) -> Option<&BufHeader> {
        let c = self.classes.get(class).filter(|_| class < self.n_classes)?;
        if idx >= c.count {
            return None;
        }
        Some(self.at(c.data_off + idx as u64 * crate::layout::buf_stride(c.buf_size)))
    }

    /// Magazine `m` of `class`; `None` when out of range.
    #[inline]
    pub fn magazine(&self, class: usize, m: u32) -> Option<&Magazine> {
        let c = self.classes.get(class).filter(|_| class < self.n_classes)?;
        if m >= c.count {
            return None;
        }
        Some(self.at(c.mag_off + m as u64 * core::mem::size_of::<Magazine>() as u64))
    }

    /// Start of buffer `idx`'s data; the caller has checked the range.
    #[inline]
    pub(crate) fn buf_data(&self, class: usize, idx: u32) -> *mut u8 {
        let c = &self.classes[class];
        debug_assert!(class < self.n_classes && idx < c.count);
        // SAFETY: in range per `open`'s check of data_off + count * stride;
        // the payload follows the header within the stride.
        unsafe {
            self.region.base.as_ptr().add(
                (c.data_off
                    + idx as u64 * crate::layout::buf_stride(c.buf_size)
                    + crate::layout::BUF_HEADROOM) as usize,
            )
        }
    }
}

impl Segment {
    /// Empties both rings of channel `ch` (manager side, before handing the
    /// channel out; nobody else uses it then).
    pub fn reset_channel_rings(&self, ch: u32) {
        for dir in 0..2 {
            let (h, s) = self.ring_ptrs(ch, dir);
            // SAFETY: in range (ring_ptrs asserts); a shared reference to an
            // atomic-only ShmSafe header is always sound.
            let h = unsafe { &*h };
            h.head.store(0, crate::sync::Ordering::Relaxed);
            // Stale sequence numbers from the channel's last use would read
            // as published descriptors.
            for i in 0..self.ring_capacity as usize {
                // SAFETY: the ring's slots follow its header inside the
                // channel slot `open` checked; nobody uses the ring now.
                let slot = unsafe { &*(s as *const crate::layout::RingSlot).add(i) };
                slot.seq.store(
                    crate::layout::initial_seq(i as u32, self.ring_capacity),
                    crate::sync::Ordering::Relaxed,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The header is shared memory any attached process may write: `open`
    /// checked its offsets and then copied them afresh, so one that
    /// changed in between (a hostile stack flipping it while a newcomer
    /// attaches) went unchecked into the segment, and accessors then
    /// reached outside the mapping.
    #[test]
    fn open_uses_the_header_values_it_checked() {
        use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
        let cfg = PoolConfig {
            classes: vec![(2048, 64)],
            max_stacks: 4,
            max_channels: 2,
            ring_capacity: 8,
            quotas: Vec::new(),
        };
        let geo = cfg.geometry().unwrap();
        let region = Region::create_memfd("xio-header-race", geo.total_len as usize).unwrap();
        let seg = Segment::init(region, &cfg, &geo).unwrap();
        let good = seg.classes()[0].data_off;
        let bad = 1u64 << 40;
        let base = seg.region.base.as_ptr() as usize;
        let stop = AtomicBool::new(false);
        std::thread::scope(|s| {
            s.spawn(|| {
                let off = core::mem::offset_of!(SegmentHeader, classes)
                    + core::mem::offset_of!(ClassInfo, data_off);
                // SAFETY: the header's field, 8-byte aligned, in a mapping
                // `seg` keeps alive; what a hostile process would do.
                let word = unsafe { AtomicU64::from_ptr((base + off) as *mut u64) };
                while !stop.load(Ordering::Relaxed) {
                    word.store(bad, Ordering::Relaxed);
                    word.store(good, Ordering::Relaxed);
                }
            });
            for _ in 0..20_000 {
                let fd = seg.region.fd().unwrap().try_clone_to_owned().unwrap();
                if let Ok(s2) = Segment::open(Region::map_fd(fd).unwrap()) {
                    if s2.classes()[0].data_off != good {
                        stop.store(true, Ordering::Relaxed);
                        panic!("an offset that was not checked was kept");
                    }
                }
            }
            stop.store(true, Ordering::Relaxed);
        });
    }

    /// A header whose stack count was overwritten with 0 made the next
    /// stack to attach divide by it (its cache share) and panic: found by
    /// the `segment_state` fuzz target. Counts a configuration could not
    /// have are refused, as `PoolConfig::geometry` refuses them.
    #[test]
    fn open_refuses_counts_no_configuration_has() {
        let cfg = PoolConfig {
            classes: vec![(2048, 64)],
            max_stacks: 4,
            max_channels: 2,
            ring_capacity: 8,
            quotas: Vec::new(),
        };
        let geo = cfg.geometry().unwrap();
        let fields = [
            (core::mem::offset_of!(SegmentHeader, max_stacks), 0u32),
            (core::mem::offset_of!(SegmentHeader, max_stacks), 65535),
            (core::mem::offset_of!(SegmentHeader, max_channels), 0),
            (core::mem::offset_of!(SegmentHeader, ring_capacity), 1),
            (core::mem::offset_of!(SegmentHeader, ring_capacity), 0),
        ];
        for (off, v) in fields {
            let region = Region::create_memfd("xio-header-counts", geo.total_len as usize).unwrap();
            let seg = Segment::init(region, &cfg, &geo).unwrap();
            seg.region().__scribble(off, &v.to_ne_bytes());
            let fd = seg.region().fd().unwrap().try_clone_to_owned().unwrap();
            assert!(
                Segment::open(Region::map_fd(fd).unwrap()).is_err(),
                "field at {off} = {v} accepted"
            );
        }
    }

    /// Free heads, stack slots, channel headers and magazines hold
    /// `CachePadded` fields (128-byte aligned): an offset that is only a
    /// multiple of 64 made a misaligned reference (undefined behaviour)
    /// out of a header another process wrote.
    #[test]
    fn open_refuses_offsets_misaligned_for_their_type() {
        let cfg = PoolConfig {
            classes: vec![(2048, 64)],
            max_stacks: 4,
            max_channels: 2,
            ring_capacity: 8,
            quotas: Vec::new(),
        };
        let good = cfg.geometry().unwrap();
        let region = || Region::heap(good.total_len as usize).unwrap();
        Segment::init(region(), &cfg, &good).unwrap();
        type Shift = fn(&mut Geometry);
        let shifts: [(&str, Shift); 4] = [
            ("free heads", |g| g.free_heads_off += 64),
            ("stack slots", |g| g.stacks_off += 64),
            ("channels", |g| g.channels_off += 64),
            ("magazines", |g| g.classes[0].mag_off += 64),
        ];
        for (what, shift) in shifts {
            let mut geo = good.clone();
            shift(&mut geo);
            assert!(
                Segment::init(region(), &cfg, &geo).is_err(),
                "{what} 64 bytes off their alignment were accepted"
            );
        }
    }
}

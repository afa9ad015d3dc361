//! A class's `rte_mempool`: its objects, each with the header that records
//! its owner, state and generation, found and checked by address; and the
//! prefix's shared memory, by the kernel's list of this process's
//! mappings, that every pointer DPDK's tables hold is checked against.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::Arc;

use dpdk_sys as sys;

use super::eal::{Role, EAL};
use super::error::{cname, errno_text, DpdkError};

/// State of a mempool object, in its header.
pub mod obj_state {
    /// In the mempool.
    pub const FREE: u8 = 0;
    /// Allocated, writable by its owner.
    pub const ALLOCATED: u8 = 1;
    /// In its owner's private cache (see `DpdkPool`): taken from the
    /// mempool, not in use.
    pub const CACHED: u8 = 4;
    /// Sent: owned by the receiver, not yet received.
    pub const IN_FLIGHT: u8 = 2;
    /// Received, read-only.
    pub const HELD: u8 = 3;
}

/// The header at the start of every mempool object (64 bytes, so the
/// payload stays cache-line aligned).
#[repr(C, align(64))]
#[derive(Debug)]
pub struct ObjHeader {
    /// The owning stack (0: nobody) and the state (see [`obj_state`]) in
    /// one word ([`ObjHeader::stamp`], [`ObjHeader::stamped`]): written
    /// together, read together. As two fields, a sender stamping a buffer
    /// in flight wrote the owner, then the state, and a sweep reading
    /// between the two saw the receiver owning a buffer still allocated
    /// by the sender: with that receiver dead, it took the sender's
    /// buffer back while the sender was still sending it.
    pub word: AtomicU32,
    /// Index in the class (set at creation; written back by the manager's
    /// sweep, or by a stack that the mempool hands the object to, if
    /// anything overwrote it: see `Mempool::index_of`).
    pub index: AtomicU32,
    /// Bumped on every allocation: a stale descriptor does not match.
    pub gen: AtomicU32,
    /// The stack that sent it, while `IN_FLIGHT`: the manager finds by it
    /// what a sender that died between stamping and pushing left owned by
    /// a live receiver but in no ring (see [`DpdkPool::reclaim`](super::DpdkPool::reclaim)).
    pub from: AtomicU16,
    /// Size class (set once at creation).
    pub class: u8,
}

impl ObjHeader {
    /// The owner and state, read in one load.
    #[inline]
    pub fn stamped(&self, order: Ordering) -> (u16, u8) {
        let w = self.word.load(order);
        (w as u16, (w >> 16) as u8)
    }

    /// Writes the owner and state in one store.
    #[inline]
    pub fn stamp(&self, owner: u16, state: u8, order: Ordering) {
        self.word.store(stamp_word(owner, state), order);
    }
}

/// The header word of `owner` and `state`.
const fn stamp_word(owner: u16, state: u8) -> u32 {
    owner as u32 | (state as u32) << 16
}

/// Bytes before the payload in each object.
pub const HEADER: usize = std::mem::size_of::<ObjHeader>();

/// An `rte_mempool` of one size class (created by the primary, looked up
/// by secondaries).
#[derive(Debug)]
pub struct Mempool {
    pub(super) mp: NonNull<sys::rte_mempool>,
    /// The mempool's ring and its slot mask, checked once when the pool
    /// was wrapped ([`Mempool::wrap`]) and kept here: every get and put
    /// goes to them directly. The mempool's ops index and ring pointer,
    /// and the ring's mask, are shared memory any process of the prefix
    /// can write; DPDK's `rte_mempool_get_bulk` read them on every call,
    /// so an overwritten ops index aborted the process (DPDK's
    /// `RTE_VERIFY`) or called another ops' functions, and an overwritten
    /// mask made it read and write slots outside the ring.
    pub(super) ring: NonNull<sys::rte_ring>,
    pub(super) mask: u32,
    /// Every get and put on the mempool, of every process, runs alone:
    /// under the mempool's lock (see [`DpdkPool::mempool_op`](super::DpdkPool::mempool_op)) or with
    /// the gates closed (the manager's sweep). Then a get or put half done
    /// in the ring is no peer's in progress but one a process killed
    /// inside an operation left, or a hostile one made: DPDK's protocol
    /// waited for its tail for ever, inside the bracket and holding the
    /// lock, so the sweep that repairs it waited for the waiter and every
    /// other operation for the lock. Such a get or put is refused instead
    /// (an empty pool to the caller, until the sweep repairs the ring).
    /// Off for a pool without a segment, whose operations run at once.
    pub(super) exclusive: bool,
    /// A half-done operation was reported (see [`Mempool::half_done`]).
    told_half_done: std::sync::atomic::AtomicBool,
    /// Object `i`'s address, by the index in its header.
    pub(super) objs: Vec<NonNull<ObjHeader>>,
    /// Where the objects lie, from `objs` (our own memory): runs of
    /// consecutive objects `stride` bytes apart, one per memory chunk
    /// DPDK placed them in (usually one). A pointer the mempool's ring
    /// hands out is checked against them before it is read through.
    runs: Vec<Run>,
    stride: usize,
    pub(super) size: usize,
}

/// Objects `first..first + count` of a mempool, at `base + k * stride`.
#[derive(Clone, Copy, Debug)]
struct Run {
    base: usize,
    /// `count * stride`: the bytes the run spans.
    span: usize,
    first: u32,
}

// SAFETY: a mempool is a shared, thread-safe DPDK object (MP/MC ops); the
// object addresses are the same in every thread.
unsafe impl Send for Mempool {}
// SAFETY: as above.
unsafe impl Sync for Mempool {}

struct InitArg {
    class: u8,
}

unsafe extern "C" fn init_obj(
    _mp: *mut sys::rte_mempool,
    arg: *mut c_void,
    obj: *mut c_void,
    idx: u32,
) {
    // SAFETY: DPDK calls this once per object during creation with our
    // InitArg and an object of at least HEADER bytes, suitably aligned
    // (elements are cache-line aligned).
    unsafe {
        let a = &*arg.cast::<InitArg>();
        obj.cast::<ObjHeader>().write(ObjHeader {
            word: AtomicU32::new(stamp_word(0, obj_state::FREE)),
            index: AtomicU32::new(idx),
            gen: AtomicU32::new(0),
            from: AtomicU16::new(0),
            class: a.class,
        });
    }
}

impl Mempool {
    /// Creates the pool of class `class`: `n` objects of `size` payload
    /// bytes (primary only).
    pub fn create(name: &str, class: u8, n: u32, size: usize) -> Result<Mempool, DpdkError> {
        let c = cname(
            name,
            sys::xio_shim_limits::XIO_SHIM_MEMPOOL_NAMESIZE as usize,
        )?;
        // DPDK sizes objects in 32 bits: cut, the size would wrap to a
        // few bytes, under the header written into each object and the
        // buffers written after it.
        let elt = u32::try_from(HEADER + size).map_err(|_| DpdkError::Create {
            what: "mempool",
            name: name.into(),
            reason: format!("{size}-byte buffers do not fit DPDK's 32-bit object size"),
        })?;
        let mut arg = InitArg { class };
        // SAFETY: valid name; our callback matches rte_mempool_obj_cb_t and
        // `arg` outlives the call (objects are initialised during it, each
        // of `elt` bytes: room for the header).
        let mp = unsafe {
            sys::rte_mempool_create(
                c.as_ptr(),
                n,
                elt,
                0,
                0,
                None,
                std::ptr::null_mut(),
                Some(init_obj),
                (&mut arg as *mut InitArg).cast(),
                sys::SOCKET_ID_ANY,
                0,
            )
        };
        let mp = NonNull::new(mp).ok_or_else(|| DpdkError::Create {
            what: "mempool",
            name: name.into(),
            reason: errno_text(),
        })?;
        Self::wrap(mp, name, size)
    }

    /// Looks up the pool `name` made by the primary, of `size` payload bytes.
    pub fn lookup(name: &str, size: usize) -> Result<Mempool, DpdkError> {
        let c = cname(
            name,
            sys::xio_shim_limits::XIO_SHIM_MEMPOOL_NAMESIZE as usize,
        )?;
        // SAFETY: valid NUL-terminated name.
        let mp = unsafe { sys::rte_mempool_lookup(c.as_ptr()) };
        let mp = NonNull::new(mp).ok_or_else(|| DpdkError::NotFound {
            what: "mempool",
            name: name.into(),
        })?;
        Self::wrap(mp, name, size)
    }

    /// The object table of `mp`, by the index in each object's header.
    /// Each index must name one object: a slot left unfilled would be
    /// dereferenced later (a header is shared memory, so untrusted). And
    /// each object must hold the header and `size` payload bytes: `size`
    /// comes from the segment's class table, and a table that does not
    /// match the mempool found by name would make every buffer reach into
    /// the objects after it.
    ///
    /// The walk over the objects is DPDK's list of them, linked through
    /// DPDK's object headers: shared memory too. `rte_mempool_obj_iter`
    /// followed it blindly, so a link a peer overwrote crashed every stack
    /// attaching afterwards (an unmapped address), or never ended (a
    /// cycle, collecting objects until memory ran out), or put addresses
    /// outside DPDK's memory in the table. Each step is now checked
    /// before it is read through: the mempool, every object (with its
    /// DPDK header and `size` payload bytes) and the ring lie in the
    /// prefix's hugepage mappings of this process (the kernel's list, not
    /// DPDK's), objects do not overlap, and the walk stops at the object
    /// count or at the first index met twice.
    fn wrap(mp: NonNull<sys::rte_mempool>, name: &str, size: usize) -> Result<Mempool, DpdkError> {
        let corrupt = || DpdkError::Corrupt(name.into());
        let shared = SharedMem::of_prefix();
        shared.usable()?;
        if !shared.holds(
            mp.as_ptr() as usize,
            std::mem::size_of::<sys::rte_mempool>(),
        ) {
            return Err(corrupt());
        }
        // SAFETY: a live mempool in shared memory (checked); reads one field.
        let elt = unsafe { sys::xio_shim_mempool_elt_size(mp.as_ptr()) } as usize;
        let need = HEADER.checked_add(size).ok_or_else(corrupt)?;
        if need > elt {
            return Err(corrupt());
        }
        let dpdk_hdr = sys::xio_shim_limits::XIO_SHIM_OBJHDR_SIZE as usize;
        let span = dpdk_hdr + need;
        // SAFETY: as above.
        let n = unsafe { sys::xio_shim_mempool_size(mp.as_ptr()) } as usize;
        if shared.len().is_some_and(|l| n > l / span) {
            return Err(corrupt());
        }
        let mut objs: Vec<Option<NonNull<ObjHeader>>> = vec![None; n];
        // SAFETY: a live mempool (checked above).
        let mut o = unsafe { sys::xio_shim_mempool_first_obj(mp.as_ptr()) };
        while let Some(p) = NonNull::new(o) {
            let a = p.as_ptr() as usize;
            if a % std::mem::align_of::<ObjHeader>() != 0
                || !shared.holds(a.wrapping_sub(dpdk_hdr), span)
            {
                return Err(corrupt());
            }
            let h = p.cast::<ObjHeader>();
            // SAFETY: `h` lies in the prefix's shared memory with room for
            // DPDK's header before it and ours after it (checked above),
            // aligned; its index is checked below (any process of the
            // prefix could have overwritten it).
            let i = unsafe { h.as_ref().index.load(Ordering::Relaxed) } as usize;
            match objs.get_mut(i) {
                Some(slot @ None) => *slot = Some(h),
                // A second visit (a cycle ends here) or an index past
                // the count.
                _ => return Err(corrupt()),
            }
            // SAFETY: DPDK's header before `o` is in shared memory
            // (checked above).
            o = unsafe { sys::xio_shim_mempool_next_obj(o) };
        }
        let objs = objs
            .into_iter()
            .collect::<Option<Vec<_>>>()
            .ok_or_else(corrupt)?;
        let mut at: Vec<usize> = objs.iter().map(|h| h.as_ptr() as usize).collect();
        at.sort_unstable();
        if at.windows(2).any(|w| w[1] - w[0] < span) {
            return Err(corrupt());
        }
        let (runs, stride) = runs_of(&objs);
        // SAFETY: a live mempool; reads one field (checked below and in
        // the shim before anything is read through it).
        let ring = unsafe { sys::xio_shim_mempool_pool_data(mp.as_ptr()) };
        let ring = NonNull::new(ring)
            .filter(|r| shared.holds(r.as_ptr() as usize, std::mem::size_of::<sys::rte_ring>()))
            .ok_or_else(corrupt)?;
        let mut mask = 0;
        // SAFETY: a live mempool and a ring header in shared memory
        // (checked); the shim reads each field once and checks it (the
        // ring's size against the objects found).
        let r = unsafe {
            sys::xio_shim_mempool_ring(mp.as_ptr(), ring.as_ptr(), objs.len() as u32, &mut mask)
        };
        let slots = (mask as usize + 1) * std::mem::size_of::<*mut c_void>();
        if r != 0
            || !shared.holds(
                ring.as_ptr() as usize,
                std::mem::size_of::<sys::rte_ring>() + slots,
            )
        {
            return Err(corrupt());
        }
        Ok(Mempool {
            mp,
            ring,
            mask,
            exclusive: false,
            told_half_done: Default::default(),
            objs,
            runs,
            stride,
            size,
        })
    }

    /// The index of the object at `o`, if `o` is exactly one of the
    /// pool's objects (by address alone: nothing is read through `o`).
    /// A subtraction, a compare and a division per run (one, usually).
    #[inline]
    fn position(&self, o: *mut c_void) -> Option<u32> {
        position_in(&self.runs, self.stride, o as usize)
    }

    /// Objects in the pool.
    pub fn len(&self) -> usize {
        self.objs.len()
    }

    /// True if the pool has no objects.
    #[cfg(any(test, feature = "test-support"))]
    pub fn is_empty(&self) -> bool {
        self.objs.is_empty()
    }

    /// Objects currently free in the pool.
    pub fn avail(&self) -> u32 {
        // SAFETY: the mempool's ring (checked in `wrap`); reads its tails.
        unsafe { sys::xio_shim_mpring_count(self.ring.as_ptr(), self.mask) }
    }

    /// Payload bytes per object.
    #[cfg(any(test, feature = "test-support"))]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The header of object `index`.
    pub fn header(&self, index: u32) -> Option<&ObjHeader> {
        // SAFETY: objects live as long as the mempool, which outlives self.
        self.objs.get(index as usize).map(|h| unsafe { h.as_ref() })
    }

    /// The index of object `o` (a pointer the mempool handed out), if it is
    /// one of the pool's objects. The mempool's ring, which holds the
    /// pointers, and the object headers are shared memory any process of
    /// the prefix can write: `o` is checked against the pool's object
    /// area by address before anything is read through it (a bogus
    /// pointer, read, crashed the process or read outside the pool), and
    /// the index is taken from the address. One that is none of the
    /// pool's objects is `None`: dropped by the caller, not used and not
    /// put back. A header whose index was overwritten gets it written
    /// back: left out of the pool, such an object stayed lost (the sweep
    /// put it back, the next get left it out again) and made every later
    /// lookup of the mempool ([`Mempool::wrap`]) refuse it as corrupt.
    pub(super) fn index_of(&self, o: *mut c_void) -> Option<u32> {
        let Some(at) = self.position(o) else {
            tracing::warn!(
                mempool = self.size,
                pointer = o as usize,
                "the mempool handed out a pointer to none of its objects \
                 (its ring was overwritten): dropped"
            );
            return None;
        };
        // SAFETY: object `at` of the pool (checked above by address);
        // objects live as long as the mempool.
        let h = unsafe { self.objs[at as usize].as_ref() };
        let i = h.index.load(Ordering::Relaxed);
        if i != at {
            tracing::warn!(
                mempool = self.size,
                object = at,
                overwritten = i,
                "an object's header named another index: written back"
            );
            h.index.store(at, Ordering::Relaxed);
        }
        Some(at)
    }

    /// Takes one object, as the pointer the mempool holds.
    pub(super) fn get_raw(&self) -> Option<*mut c_void> {
        let mut o: *mut c_void = std::ptr::null_mut();
        self.get_bulk(std::slice::from_mut(&mut o)).then_some(o)
    }

    /// Says, the first time in this process, that a get or put found
    /// another one half done in the mempool's ring (see
    /// [`Mempool::exclusive`]): a stack waiting for the repair retries
    /// its get over and over. Only when the shim says so: not on the
    /// common path.
    #[cold]
    fn half_done(&self) {
        if self.told_half_done.swap(true, Ordering::Relaxed) {
            return;
        }
        tracing::warn!(
            mempool = self.size,
            "the mempool's ring holds a get or put another process left half done \
             (it died inside one, or overwrote an index): none taken or put until the \
             manager's sweep repairs it"
        );
    }

    /// Finishes what a process killed inside a get or put left half done
    /// in the mempool's ring (DPDK's multi-producer/consumer ring is not
    /// crash-safe: every later get, or put, would wait for that process
    /// for ever). What it was taking or putting back is in no mempool
    /// then, and found by its header. Only with no other process inside
    /// an operation on the mempool (the gates closed). True if something
    /// was half done.
    pub(super) fn repair_ring(&self) -> bool {
        // SAFETY: the mempool's ring (checked in `wrap`); nobody else is
        // inside an operation on it (the caller's contract).
        unsafe { sys::xio_shim_mpring_repair(self.ring.as_ptr()) == 1 }
    }

    /// Writes back the mempool's ops index and ring pointer and the
    /// ring's size, mask and capacity as this process checked them (the
    /// manager's sweep: any stack can overwrite them, and a stack that
    /// attaches later checks them, and refuses the mempool as corrupt).
    /// And links DPDK's list of the objects again as this process found
    /// it (by index: the order DPDK numbered them in at creation), for
    /// the same stacks.
    pub(super) fn restore_ring(&self) {
        let objs: Vec<*mut c_void> = self.objs.iter().map(|h| h.as_ptr().cast()).collect();
        // SAFETY: a live mempool, its ring and its objects; writes the
        // fields DPDK set at creation back to those values.
        unsafe {
            sys::xio_shim_mempool_ring_restore(self.mp.as_ptr(), self.ring.as_ptr(), self.mask);
            sys::xio_shim_mempool_relink(self.mp.as_ptr(), objs.as_ptr(), objs.len() as u32);
        }
    }

    /// Test hook: overwrites the link in object `i`'s DPDK header (to the
    /// next object, in shared memory) with `next`, as a broken or hostile
    /// process of the prefix can. Not for applications.
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-support"))]
    pub fn __scribble_link(&self, i: u32, next: usize) {
        if let Some(h) = self.objs.get(i as usize) {
            // SAFETY: one of our objects; writes one word of DPDK's
            // header before it, as any process of the prefix can.
            unsafe { sys::xio_shim_mempool_scribble_next(h.as_ptr().cast(), next) };
        }
    }

    /// Test hook: overwrites the mempool's ops index and its ring's mask
    /// (in shared memory), as a broken or hostile process of the prefix
    /// can. Not for applications.
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-support"))]
    pub fn __scribble_ring(&self, ops_index: i32, mask: u32) {
        // SAFETY: a live mempool; writes two fields of shared memory, as
        // any process of the prefix can.
        unsafe { sys::xio_shim_mempool_scribble(self.mp.as_ptr(), ops_index, mask) };
    }

    /// Takes exactly `out.len()` objects, or none.
    pub(super) fn get_bulk(&self, out: &mut [*mut c_void]) -> bool {
        let (r, p, n) = (self.ring.as_ptr(), out.as_mut_ptr(), out.len() as u32);
        // SAFETY: room for out.len() object pointers; the ring and mask
        // checked in `wrap` (slots are read at `index & mask` only); the
        // exclusive get only when no other operation runs (the field).
        let got = unsafe {
            if self.exclusive {
                sys::xio_shim_mpring_get_excl(r, self.mask, p, n)
            } else {
                sys::xio_shim_mpring_get(r, self.mask, p, n)
            }
        };
        if got == -2 {
            self.half_done();
        }
        got == 0
    }

    pub(super) fn put_bulk(&self, objs: &[*mut c_void]) {
        if objs.is_empty() {
            return;
        }
        let (r, p, n) = (self.ring.as_ptr(), objs.as_ptr(), objs.len() as u32);
        // SAFETY: objects of this pool that nobody uses any more; the ring
        // and mask checked in `wrap`; the exclusive put only when no other
        // operation runs (the field).
        let r = unsafe {
            if self.exclusive {
                sys::xio_shim_mpring_put_excl(r, self.mask, p, n)
            } else {
                sys::xio_shim_mpring_put(r, self.mask, p, n)
            }
        };
        if r == -2 {
            // What was not put back stays free in its header; the sweep
            // that repairs the ring lists it.
            self.half_done();
        } else if r != 0 {
            // The ring has room for every object: full, it lists some
            // twice (a broken or hostile process put them). What was not
            // put back stays free in its header; the next sweep lists it.
            tracing::warn!(
                mempool = self.size,
                objects = objs.len(),
                "the mempool's ring is full (it lists objects twice): not put back"
            );
        }
    }

    pub(super) fn put(&self, h: &ObjHeader) {
        let o = (h as *const ObjHeader).cast_mut().cast::<c_void>();
        self.put_bulk(&[o]);
    }

    pub(super) fn data(&self, h: &ObjHeader) -> *mut u8 {
        // SAFETY: the payload follows the header inside the object.
        unsafe { (h as *const ObjHeader).cast_mut().cast::<u8>().add(HEADER) }
    }
}

/// The runs `objs` lie in (see the field of [`Mempool`]), and their stride: the
/// smallest distance between consecutive objects (the object size, in a
/// run of two or more; a run of one object matches its base alone).
fn runs_of(objs: &[NonNull<ObjHeader>]) -> (Vec<Run>, usize) {
    let addr = |i: usize| objs[i].as_ptr() as usize;
    let stride = (1..objs.len())
        .map(|i| addr(i).abs_diff(addr(i - 1)))
        .filter(|&d| d > 0)
        .min()
        .unwrap_or(1);
    let mut runs: Vec<Run> = Vec::new();
    for i in 0..objs.len() {
        match runs.last_mut() {
            Some(r) if r.base.checked_add(r.span) == Some(addr(i)) => r.span += stride,
            _ => runs.push(Run {
                base: addr(i),
                span: stride,
                first: i as u32,
            }),
        }
    }
    (runs, stride)
}

/// The index of the object at address `a` in `runs` (see [`runs_of`]).
#[inline]
fn position_in(runs: &[Run], stride: usize, a: usize) -> Option<u32> {
    runs.iter().find_map(|r| {
        let off = a.wrapping_sub(r.base);
        (off < r.span && off % stride == 0).then(|| r.first + (off / stride) as u32)
    })
}

/// The address ranges where this process maps its EAL prefix's hugepage
/// files (DPDK's shared memory), from the kernel's `/proc/self/maps`:
/// what a peer cannot forge, unlike DPDK's own tables of that memory,
/// which live in it. Adjacent mappings are merged (DPDK maps one file
/// per page, and an object may span pages). When a primary maps none
/// (DPDK without hugepage files, `--in-memory`, where no other process can
/// join) nothing is checked; when a secondary maps none (it shares the
/// primary's memory by those files), or the maps could not be read, the
/// check cannot see the memory peers write, and nothing is held (see
/// [`SharedMem::usable`]).
pub(super) struct SharedMem {
    ranges: Vec<(usize, usize)>,
    /// No range, and none needed: a primary without hugepage files.
    unchecked: bool,
}

/// The process's [`SharedMem`], read once (both rings of every
/// connection are checked against it, and `/proc/self/maps` is long: one
/// mapping per hugepage), and again on a miss (DPDK maps more memory
/// when the primary allocates some).
static SHARED: std::sync::Mutex<Option<Arc<SharedMem>>> = std::sync::Mutex::new(None);

impl SharedMem {
    /// Whether `len` bytes at `at` lie in the shared memory: the cached
    /// ranges, or the process's mappings read again; `Err` if they cannot
    /// be checked ([`SharedMem::usable`]).
    pub(super) fn holds_now(at: usize, len: usize) -> Result<bool, DpdkError> {
        let cached = SHARED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get_or_insert_with(|| Arc::new(SharedMem::of_prefix()))
            .clone();
        if cached.holds(at, len) {
            return Ok(true);
        }
        let fresh = Arc::new(SharedMem::of_prefix());
        *SHARED.lock().unwrap_or_else(|e| e.into_inner()) = Some(fresh.clone());
        fresh.usable()?;
        Ok(fresh.holds(at, len))
    }

    fn of_prefix() -> SharedMem {
        let Some(Ok(eal)) = EAL.get() else {
            // No EAL: no DPDK memory to hold.
            return SharedMem {
                ranges: Vec::new(),
                unchecked: false,
            };
        };
        let stem = format!("{}map_", eal.prefix());
        let maps = std::fs::read_to_string("/proc/self/maps").ok();
        SharedMem::read(maps.as_deref(), &stem, eal.role())
    }

    /// The mappings of `maps` (`/proc/self/maps` text, `None` if it could
    /// not be read) whose file's name starts with `stem`, in a process of
    /// role `role`.
    fn read(maps: Option<&str>, stem: &str, role: Role) -> SharedMem {
        let mut m = SharedMem::parse(maps.unwrap_or_default(), stem);
        m.unchecked = maps.is_some() && m.ranges.is_empty() && role == Role::Primary;
        m
    }

    /// The ranges of `maps` (`/proc/<pid>/maps` text) whose file's name
    /// starts with `stem`.
    fn parse(maps: &str, stem: &str) -> SharedMem {
        let mut r: Vec<(usize, usize)> = maps
            .lines()
            .filter_map(|l| {
                let mut f = l.split_whitespace();
                let range = f.next()?;
                let file = f.nth(4)?;
                if !file.rsplit('/').next()?.starts_with(stem) {
                    return None;
                }
                let (a, b) = range.split_once('-')?;
                Some((
                    usize::from_str_radix(a, 16).ok()?,
                    usize::from_str_radix(b, 16).ok()?,
                ))
            })
            .collect();
        r.sort_unstable();
        let mut merged: Vec<(usize, usize)> = Vec::new();
        for (a, b) in r {
            match merged.last_mut() {
                Some((_, end)) if *end == a => *end = b,
                _ => merged.push((a, b)),
            }
        }
        SharedMem {
            ranges: merged,
            unchecked: false,
        }
    }

    /// `Err` when nothing can be checked though peers may write the
    /// memory: a secondary that maps none of the prefix's hugepage files,
    /// or maps that could not be read. A pointer found in DPDK's shared
    /// tables could then lead anywhere: the ring or mempool is refused,
    /// not used unchecked.
    fn usable(&self) -> Result<(), DpdkError> {
        if self.ranges.is_empty() && !self.unchecked {
            return Err(DpdkError::Unchecked(
                EAL.get()
                    .and_then(|e| e.as_ref().ok())
                    .map_or_else(String::new, |e| e.prefix().to_owned()),
            ));
        }
        Ok(())
    }

    /// Bytes mapped, if anything is.
    fn len(&self) -> Option<usize> {
        (!self.ranges.is_empty()).then(|| self.ranges.iter().map(|(a, b)| b - a).sum())
    }

    /// Whether `len` bytes at `at` lie in one range (or nothing needs
    /// to: see [`SharedMem::unchecked`]).
    fn holds(&self, at: usize, len: usize) -> bool {
        (self.ranges.is_empty() && self.unchecked)
            || at
                .checked_add(len)
                .is_some_and(|end| self.ranges.iter().any(|&(a, b)| a <= at && end <= b))
    }
}

/// The name of class `c`'s mempool (DPDK names are per file prefix, so
/// per X-IO pool).
pub fn mempool_name(c: usize) -> String {
    format!("xio-p{c}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Objects in two memory chunks (DPDK places a mempool's objects in
    /// as many as it needs), the second holding one: every object is
    /// found at its address, and nothing else is, not even inside an
    /// object or between the chunks.
    #[test]
    fn objects_are_found_by_address_alone() {
        let stride = 2240;
        let mut addrs: Vec<usize> = (0..5).map(|k| 0x1_0000_0000 + k * stride).collect();
        addrs.push(0x2_0000_0000);
        addrs.extend((0..3).map(|k| 0x1_8000_0000 + k * stride));
        let objs: Vec<NonNull<ObjHeader>> = addrs
            .iter()
            .map(|&a| NonNull::new(a as *mut ObjHeader).unwrap())
            .collect();
        let (runs, s) = runs_of(&objs);
        assert_eq!((runs.len(), s), (3, stride));
        for (i, &a) in addrs.iter().enumerate() {
            assert_eq!(position_in(&runs, s, a), Some(i as u32), "object {i}");
            for bad in [a + 8, a - 64, a + stride / 2] {
                assert_eq!(position_in(&runs, s, bad), None, "{bad:#x}");
            }
        }
        for bad in [0, 0x1000, addrs[4] + stride, addrs[5] + stride, usize::MAX] {
            assert_eq!(position_in(&runs, s, bad), None, "{bad:#x}");
        }
        assert!(runs_of(&[]).0.is_empty());
    }

    /// The prefix's hugepage files, one mapping per page, merged where
    /// adjacent; other files and other prefixes are not DPDK's memory of
    /// this pool.
    #[test]
    fn shared_memory_is_the_prefixs_hugepage_mappings() {
        let maps = "\
100000000-100200000 rw-s 00000000 00:2f 11 /dev/hugepages/xtamap_0
100200000-100400000 rw-s 00000000 00:2f 12 /dev/hugepages/xtamap_1
100600000-100800000 rw-s 00000000 00:2f 13 /dev/hugepages/xtamap_2
100400000-100600000 rw-s 00000000 00:2f 14 /dev/hugepages/xtbmap_0
7f0000000000-7f0000001000 rw-p 00000000 00:00 0 [heap]
7f0000002000-7f0000003000 r--s 00000000 00:05 9 /memfd:xtamap_9 (deleted)
";
        let m = SharedMem::parse(maps, "xtamap_");
        assert_eq!(m.len(), Some(0x60_0000));
        assert!(m.holds(0x1_001f_ff00, 0x200), "across two pages");
        assert!(!m.holds(0x1_003f_ff00, 0x200), "into another prefix's page");
        assert!(!m.holds(0x1_0080_0000 - 8, 16), "past the end");
        assert!(!m.holds(usize::MAX - 4, 16));
        assert!(!m.holds(0x7f00_0000_0000, 8));
        assert!(
            !SharedMem::parse(maps, "xtcmap_").holds(0x1000, 8),
            "none: held by nothing"
        );
    }

    /// A process that finds none of its prefix's hugepage files in its
    /// mappings checked nothing: every range "held". Right for a primary
    /// running without hugepage files (`--in-memory`), which no other
    /// process can join; but a secondary shares the primary's memory by
    /// those files, so finding none (or `/proc/self/maps` unreadable)
    /// means the check cannot see the memory peers write, and it passed
    /// every ring and object pointer unchecked. Now it holds nothing.
    #[test]
    fn shared_memory_that_cannot_be_found_holds_nothing() {
        let maps = "7f0000000000-7f0000001000 rw-p 00000000 00:00 0 [heap]\n";
        let none = SharedMem::read(Some(maps), "xtamap_", Role::Secondary);
        assert!(
            !none.holds(0x7f00_0000_0000, 8),
            "a secondary without the files"
        );
        assert!(none.usable().is_err());
        let unread = SharedMem::read(None, "xtamap_", Role::Primary);
        assert!(!unread.holds(0x1000, 8), "maps unreadable");
        let e = unread.usable().unwrap_err().to_string();
        assert!(e.contains("/proc/self/maps"), "{e}");
        let alone = SharedMem::read(Some(maps), "xtamap_", Role::Primary);
        assert!(alone.holds(0x1000, 8), "a primary without files: no peer");
        assert!(alone.usable().is_ok());
    }

    #[test]
    fn header_is_one_cache_line() {
        assert_eq!(HEADER, 64);
    }
}

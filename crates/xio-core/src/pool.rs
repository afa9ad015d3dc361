//! The buffer pool: per-class lock-free free lists in shared memory, a
//! private per-stack cache in front of them, ownership recorded in every
//! buffer's header, and the manager's crash reclamation.
//!
//! # Free lists
//! Each class has a Treiber stack (IBM's lock-free LIFO, with the usual
//! tag in the high half of the head against ABA) linked through the buffer
//! headers by index. Stacks take and return buffers in batches so the shared
//! head is touched once per batch, not once per message.
//!
//! # Crash safety
//! A process can die anywhere, including between popping a buffer off a
//! list and writing its id into the buffer's header. So every list
//! operation is bracketed by an *intent* in the stack's slot, and a list
//! operation first checks the class's *gate*. The intent is a count of the
//! stack's threads inside a list operation, not a flag: the threads of one
//! stack run them at once (`free` spills outside the cache lock), and with
//! a flag the first to leave cleared it while another was still inside,
//! so the manager rebuilt the lists under it and handed buffers out twice.
//! To reconcile after a death the manager closes the gates and waits until
//! no live stack has an intent (a Dekker handshake: stack increments its
//! intent then loads gate, the manager stores gate then loads intents, all
//! `SeqCst`). The list is then frozen and the manager alone walks it: every
//! buffer the dead stacks owned, and every buffer marked free but missing
//! from the list (lost in the window above), goes back. The gates stay
//! closed for one scan of the headers, only when a process dies; in normal
//! operation the lists are lock-free.
//!
//! The manager never waits on one stack for long: an intent left by a
//! stack that has exited (its end of file not handled yet) is ignored, and
//! if a live stack stays inside an operation (stopped, say) past the
//! manager's patience, the gates reopen untouched and [`ManagerPool::reclaim`]
//! reports [`Busy`]: the caller tries again later.
//!
//! # Ownership
//! The header word says who owns a buffer and in what state (see
//! [`bufword`]). A sender stamps `INFLIGHT, owner = receiver, from = sender`
//! before pushing the descriptor, so a buffer in flight belongs to whoever
//! would have received it: if that one dies, its buffers come back with it.
//! If the sender dies between the stamp and the push, the buffer is in no
//! ring; the manager finds it by its sender once the receiver has released
//! its channel from the dead one (see [`ManagerPool::reclaim`]).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::layout::{
    bufword, BufHeader, Descriptor, Magazine, BUF_HEADROOM, MAG_SIZE, MAX_CLASSES,
};
use crate::segment::Segment;
use crate::sync::{spin_hint, yield_thread, AtomicU32, AtomicU64, Ordering};

/// Most buffers of one class a stack keeps in its private cache.
const CACHE_MAX: usize = 2 * MAG_SIZE;

/// A buffer reference: class and index. Not a pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RawBuf {
    /// Size class.
    pub class: u8,
    /// Index within the class.
    pub index: u32,
}

/// Why a received descriptor was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Reject {
    /// Class out of range.
    #[error("descriptor names size class {0}, which does not exist")]
    Class(u8),
    /// Index out of range.
    #[error("descriptor names buffer {0}, beyond its class")]
    Index(u32),
    /// Length larger than the buffer.
    #[error("descriptor length {0} exceeds its buffer")]
    Length(u32),
    /// Not a data descriptor.
    #[error("descriptor kind {0} is not data")]
    Kind(u8),
    /// Header says the buffer is not in flight to us (wrong owner, state or
    /// generation): a forged, replayed or stale descriptor.
    #[error("buffer is not in flight to this stack (header {0:#x})")]
    Ownership(u64),
}

/// Shared-memory view of the pool with no private state: what both stacks
/// and the manager use.
#[derive(Clone, Debug)]
pub struct PoolView {
    seg: Segment,
}

impl PoolView {
    /// A view of `seg`'s pool.
    pub fn new(seg: Segment) -> Self {
        Self { seg }
    }

    /// The segment.
    pub fn segment(&self) -> &Segment {
        &self.seg
    }

    /// Smallest class whose buffers hold `len` bytes.
    pub fn class_for(&self, len: usize) -> Option<usize> {
        self.seg
            .classes()
            .iter()
            .position(|c| c.buf_size as usize >= len)
    }

    /// Runs a free-list operation of stack `me` on `class` inside the
    /// intent/gate bracket (see the module docs). Returns `None` while the
    /// manager holds the gate and `wait` is false, and when the manager
    /// died holding it (killed in the middle of a sweep): nobody will open
    /// it, and the lists behind it may be half rebuilt.
    pub(crate) fn global_op<R>(
        &self,
        me: u16,
        class: usize,
        wait: bool,
        op: impl FnOnce() -> R,
    ) -> Option<R> {
        let intent = &self.seg.stack_slot(me).intent;
        let alive = self.seg.manager_alive();
        bracket(
            intent,
            &self.seg.free_head(class).gate,
            wait,
            || crate::liveness::died(alive),
            op,
        )
    }

    /// Whether `class`'s gate is held closed by a manager that died (killed
    /// in the middle of a sweep): nobody will open it again.
    pub(crate) fn stranded(&self, class: usize) -> bool {
        self.seg.free_head(class).gate.load(Ordering::Acquire) != 0
            && crate::liveness::died(self.seg.manager_alive())
    }

    /// Pops a magazine off the tagged stack at `head`.
    fn mag_pop(&self, class: usize, head: &AtomicU64) -> Option<u32> {
        tagged_pop(head, |m| self.seg.magazine(class, m))
    }

    /// Pushes magazine `m` (ours alone) onto the tagged stack at `head`.
    fn mag_push(&self, class: usize, head: &AtomicU64, m: u32) {
        let mag = self.seg.magazine(class, m).expect("own magazine in range");
        tagged_push(head, mag, m)
    }

    /// Takes one full magazine of `class` into `out`, claiming each buffer
    /// for `me` as `CACHED`. Must run inside `global_op`.
    ///
    /// Takes at most `keep` of the magazine's buffers and puts the
    /// magazine back with the rest: a class of few large buffers (32 x 1 MiB,
    /// say) must not go whole into one stack's cache.
    fn pop_batch(&self, me: u16, class: usize, keep: usize, out: &mut Vec<u32>) {
        let fh = self.seg.free_head(class);
        let Some(m) = self.mag_pop(class, &fh.head) else {
            return;
        };
        let mag = self
            .seg
            .magazine(class, m)
            .expect("popped magazine in range");
        let all = (mag.len.load(Ordering::Relaxed) as usize).min(MAG_SIZE);
        let rest = all.saturating_sub(keep.max(1));
        // The headers were last written by whichever stack freed them
        // (usually on the other core). Ask for every line in exclusive
        // state up front: the misses overlap, and the load-then-store below
        // takes one coherence transaction per line instead of two.
        for slot in &mag.idx[rest..all] {
            if let Some(hdr) = self.seg.buf_header(class, slot.load(Ordering::Relaxed)) {
                prefetch_write(hdr);
            }
        }
        for slot in &mag.idx[rest..all] {
            let i = slot.load(Ordering::Relaxed);
            // A corrupt entry is skipped; reconciliation finds the buffer.
            let Some(hdr) = self.seg.buf_header(class, i) else {
                continue;
            };
            let w = hdr.word.load(Ordering::Relaxed);
            // Every listed buffer is FREE (`push_chain`, `rebuild`). One
            // that is not was listed twice or is someone's (a corrupt
            // magazine): taking it would hand one buffer out twice, two
            // `BufMut`s over the same bytes. Skipped, as a bad index.
            if bufword::state(w) != bufword::FREE {
                continue;
            }
            hdr.word.store(
                bufword::pack(bufword::CACHED, me, bufword::gen(w)),
                Ordering::Relaxed,
            );
            out.push(i);
        }
        mag.len.store(rest as u32, Ordering::Relaxed);
        if rest > 0 {
            self.mag_push(class, &fh.head, m);
        } else {
            self.mag_push(class, &fh.empty, m);
        }
    }

    /// Returns `idxs` (owned by `me`) to `class`'s full magazines, a
    /// magazine's worth at a time. Must run inside `global_op`. Returns how
    /// many went (the first ones): fewer than all only if the empty
    /// magazines ran out, which the one-magazine-per-buffer sizing rules
    /// out unless the segment is corrupt. Those that went are listed free:
    /// the caller must keep only the rest.
    fn push_chain(&self, class: usize, idxs: &[u32]) -> usize {
        let fh = self.seg.free_head(class);
        let mut pushed = 0;
        for chunk in idxs.chunks(MAG_SIZE) {
            let Some(m) = self.mag_pop(class, &fh.empty) else {
                return pushed;
            };
            let mag = self
                .seg
                .magazine(class, m)
                .expect("popped magazine in range");
            for (slot, &i) in mag.idx.iter().zip(chunk) {
                if let Some(h) = self.seg.buf_header(class, i) {
                    // Free before it is visible: a crash after this store
                    // but before the push leaves a free, unlisted buffer,
                    // which reconciliation returns.
                    let w = h.word.load(Ordering::Relaxed);
                    h.word.store(
                        bufword::pack(bufword::FREE, 0, bufword::gen(w)),
                        Ordering::Relaxed,
                    );
                }
                slot.store(i, Ordering::Relaxed);
            }
            mag.len.store(chunk.len() as u32, Ordering::Relaxed);
            self.mag_push(class, &fh.head, m);
            pushed += chunk.len();
        }
        pushed
    }

    /// Stamps a buffer owned by `me` as in flight from `me` to `to` and
    /// builds its descriptor.
    #[inline]
    pub fn prepare_send(
        &self,
        me: u16,
        b: RawBuf,
        len: u32,
        to: u16,
        conn: u32,
        kind: u8,
    ) -> Descriptor {
        let hdr = self
            .seg
            .buf_header(b.class as usize, b.index)
            .expect("own buffer in range");
        let gen = bufword::gen(hdr.word.load(Ordering::Relaxed));
        // Release is not needed for the receiver (the ring's Release covers
        // it) but keeps the manager's view ordered with the data writes.
        hdr.word.store(
            bufword::pack_from(bufword::INFLIGHT, to, me, gen),
            Ordering::Release,
        );
        Descriptor {
            index: b.index,
            len,
            conn,
            class: b.class,
            kind,
            gen: gen as u16,
        }
    }

    /// Checks a descriptor read by stack `me` from the ring of stack
    /// `from` and takes the buffer (`INFLIGHT -> HELD`). Everything in `d`
    /// is untrusted. The buffer must be in flight from `from`: another
    /// peer's in-flight buffer named through this ring would hand that
    /// peer's message out as `from`'s (and its real descriptor be refused).
    pub fn accept(&self, me: u16, from: u16, d: &Descriptor) -> Result<RawBuf, Reject> {
        let class = d.class as usize;
        let info = self
            .seg
            .classes()
            .get(class)
            .ok_or(Reject::Class(d.class))?;
        let hdr = self
            .seg
            .buf_header(class, d.index)
            .ok_or(Reject::Index(d.index))?;
        if d.len > info.buf_size {
            return Err(Reject::Length(d.len));
        }
        // Acquire: pairs with the sender's Release store in `prepare_send`.
        let w = hdr.word.load(Ordering::Acquire);
        if bufword::state(w) != bufword::INFLIGHT
            || bufword::owner(w) != me
            || bufword::from(w) != from
            || bufword::gen(w) as u16 != d.gen
        {
            return Err(Reject::Ownership(w));
        }
        // Marking it HELD means a replayed copy of the same descriptor is
        // refused. A plain store, not a CAS: only the owner moves a buffer
        // out of INFLIGHT, and the owner's receive path is one thread (a
        // hostile process could race us, but it can scribble on the whole
        // segment anyway; what we guarantee is that our own process never
        // hands out one buffer twice). A locked RMW here would cost more
        // than the rest of the receive path.
        hdr.word.store(
            bufword::pack(bufword::HELD, me, bufword::gen(w)),
            Ordering::Relaxed,
        );
        Ok(RawBuf {
            class: d.class,
            index: d.index,
        })
    }

    /// Starts loading the header line of `d`'s buffer, so the header
    /// checks of a burst overlap their cache misses instead of taking them
    /// one after another (`accept` then finds the line in cache). The line
    /// is asked for in exclusive state, since `accept` writes the header
    /// right after reading it.
    ///
    /// With `payload`, also the payload lines past the header's (up to
    /// [`PREFETCH_PAYLOAD`] bytes), so a reader copying a small message out
    /// does not take a second miss after the header's: a 64-byte message
    /// spills 16 bytes into the buffer's second line. They too are asked
    /// for in exclusive state: the socket layer keeps an emptied small
    /// buffer to write its next message into, and a line held shared
    /// would make that write wait for an upgrade at the next fence (the
    /// sender is done with the lines either way). Nothing is loaded if the
    /// descriptor is out of range.
    #[inline]
    pub fn prefetch(&self, d: &Descriptor, payload: bool) {
        let class = d.class as usize;
        let Some(h) = self.seg.buf_header(class, d.index) else {
            return;
        };
        prefetch_write(h);
        if !payload {
            return;
        }
        let size = self.seg.classes()[class].buf_size as usize;
        let end = BUF_HEADROOM as usize + (d.len as usize).min(size).min(PREFETCH_PAYLOAD);
        let base = (h as *const BufHeader).cast::<u8>();
        let mut off = 64;
        while off < end {
            // `wrapping_add` keeps the address computation free of any
            // in-bounds claim; the line is inside the buffer's stride.
            prefetch_write(base.wrapping_add(off));
            off += 64;
        }
    }

    /// Turns a held (received) buffer back into a writable one, with a new
    /// generation so an old descriptor for it can never be accepted again.
    pub fn reuse(&self, me: u16, b: RawBuf) {
        let hdr = self
            .seg
            .buf_header(b.class as usize, b.index)
            .expect("own buffer in range");
        let g = bufword::gen(hdr.word.load(Ordering::Relaxed)).wrapping_add(1);
        hdr.word
            .store(bufword::pack(bufword::ALLOCATED, me, g), Ordering::Relaxed);
    }

    /// Data pointer and capacity of a buffer.
    pub fn data(&self, b: RawBuf) -> (*mut u8, usize) {
        let c = self.seg.classes()[b.class as usize];
        (
            self.seg.buf_data(b.class as usize, b.index),
            c.buf_size as usize,
        )
    }
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

/// Payload bytes [`PoolView::prefetch`] asks for: enough for
/// a small request or response, little enough not to crowd the cache.
pub const PREFETCH_PAYLOAD: usize = 192;

/// Orders a store before the load that follows it in the Dekker
/// handshake between [`bracket`] and [`ManagerPool::close_gates`]. In
/// production the `SeqCst` accesses on both sides already do (C11: one
/// total order over them); loom models `SeqCst` accesses as `AcqRel`
/// only (its README, "Unsupported features") but does model a `SeqCst`
/// fence, so under loom the order is spelled out as one. A fence here in
/// production would cost an `mfence` per free-list operation for nothing.
#[inline(always)]
fn dekker_order() {
    #[cfg(loom)]
    crate::sync::fence(Ordering::SeqCst);
}

/// One thread of a stack inside a free-list operation: its share of the
/// stack's intent count, given back when dropped (also on unwind, so a
/// panic inside the operation does not leave the manager waiting).
struct Intent<'a>(&'a AtomicU64);

impl Drop for Intent<'_> {
    fn drop(&mut self) {
        // SeqCst: the list writes of the operation happen before the
        // manager, loading the count in `close_gates`, can see us idle.
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Enters a free-list operation: counts this thread in `intent`, then
/// checks `gate`. `None` (and not counted) while the manager holds the
/// gate.
///
/// A count, not a flag: the threads of one stack share its slot, and a
/// flag one of them cleared on its way out said "idle" while another was
/// still inside.
#[inline]
fn enter<'a>(intent: &'a AtomicU64, gate: &AtomicU32) -> Option<Intent<'a>> {
    // SeqCst increment then SeqCst load: our half of the Dekker handshake
    // with `ManagerPool::close_gates` (gate store, then intent loads).
    // Either the manager sees the count, or we see the gate.
    intent.fetch_add(1, Ordering::SeqCst);
    let entered = Intent(intent);
    dekker_order();
    (gate.load(Ordering::SeqCst) == 0).then_some(entered)
}

/// Runs `op` as a free-list operation bracketed by `intent` and `gate`
/// (see the module docs); waits out a closed gate if `wait`, else returns
/// `None`. Also `None` if the gate is closed and `closer_died()`: the
/// manager that closed it is gone and will never open it.
fn bracket<R>(
    intent: &AtomicU64,
    gate: &AtomicU32,
    wait: bool,
    closer_died: impl Fn() -> bool,
    op: impl FnOnce() -> R,
) -> Option<R> {
    loop {
        if let Some(_inside) = enter(intent, gate) {
            return Some(op());
        }
        if !wait {
            return None;
        }
        // Acquire: pairs with the Release store in `open_gates`; the
        // rebuilt lists are visible to the operation we retry.
        while gate.load(Ordering::Acquire) != 0 {
            if closer_died() {
                return None;
            }
            yield_thread();
        }
    }
}

/// The manager's wait for one stack's `intent` to drop to zero, with the
/// gates already closed (and `dekker_order` after closing them). Gives up
/// at `deadline` (`None`: never) and returns false.
fn wait_idle(intent: &AtomicU64, deadline: Option<Instant>) -> bool {
    loop {
        // SeqCst: the manager's half of the Dekker handshake in `enter`.
        if intent.load(Ordering::SeqCst) == 0 {
            return true;
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return false;
        }
        yield_thread();
    }
}

/// Closes every gate and waits until no stack in `live` is inside a list
/// operation; returns with the lists frozen. A stack found inside one
/// for which `gone` says its process has exited is not waited for (it
/// writes nothing any more; what it left half done, reconciliation
/// repairs). One still inside at the end of `patience` makes the gates
/// reopen, untouched, and is returned as `Busy`.
pub(crate) fn close_gates(
    seg: &Segment,
    live: &[u16],
    patience: Duration,
    mut gone: impl FnMut(u16) -> bool,
) -> Result<(), Busy> {
    for class in 0..seg.classes().len() {
        // SeqCst: the manager's half of the Dekker handshake in `enter`.
        seg.free_head(class).gate.store(1, Ordering::SeqCst);
    }
    dekker_order();
    let deadline = Instant::now().checked_add(patience);
    for &id in live {
        let intent = &seg.stack_slot(id).intent;
        if wait_idle(intent, Some(Instant::now())) || gone(id) {
            continue;
        }
        // Alive (or its death not visible yet): wait, but not forever.
        if !wait_idle(intent, deadline) && !gone(id) {
            open_gates(seg);
            return Err(Busy(id));
        }
    }
    Ok(())
}

/// Reopens the gates [`close_gates`] closed.
pub(crate) fn open_gates(seg: &Segment) {
    for class in 0..seg.classes().len() {
        // Release: our list repairs happen before anyone re-enters.
        seg.free_head(class).gate.store(0, Ordering::Release);
    }
}

/// Treiber pop of a magazine index from a tagged head
/// (`tag << 32 | index + 1`). `mag` resolves an index, `None` if out of
/// range (a corrupt head then reads as empty).
pub(crate) fn tagged_pop<'a>(
    head: &AtomicU64,
    mag: impl Fn(u32) -> Option<&'a Magazine>,
) -> Option<u32> {
    loop {
        // Acquire: pairs with the Release CAS in `tagged_push`: the
        // magazine's contents and link were written before.
        let h = head.load(Ordering::Acquire);
        let first = h as u32;
        if first == 0 {
            return None;
        }
        // May be stale if another stack pops it first; the tagged CAS then
        // fails (the tag changed even if the same magazine is back on top).
        let next = mag(first - 1)?.next.load(Ordering::Relaxed);
        let new = ((h >> 32).wrapping_add(1) << 32) | next as u64;
        if head
            .compare_exchange(h, new, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
        {
            return Some(first - 1);
        }
        spin_hint();
    }
}

/// Treiber push of magazine `m` (exclusively ours) onto a tagged head.
pub(crate) fn tagged_push(head: &AtomicU64, mag: &Magazine, m: u32) {
    loop {
        let h = head.load(Ordering::Relaxed);
        mag.next.store(h as u32, Ordering::Relaxed);
        let new = ((h >> 32).wrapping_add(1) << 32) | (m as u64 + 1);
        // Release: publishes the magazine's contents and link; pairs with
        // the Acquire load in `tagged_pop`.
        if head
            .compare_exchange(h, new, Ordering::Release, Ordering::Relaxed)
            .is_ok()
        {
            return;
        }
        spin_hint();
    }
}

/// A stack's handle on the pool: the shared view plus a private cache per
/// class. `Sync`; the cache sits behind a mutex that is uncontended unless
/// several threads of one process allocate at once.
#[derive(Debug)]
pub struct StackPool {
    view: PoolView,
    me: u16,
    cache: Mutex<[Vec<u32>; MAX_CLASSES]>,
    /// Per class: private cache limit. Small enough that the caches of
    /// every stack the pool admits hold at most half the class, so buffers
    /// parked in one process's cache can never starve another (a class of
    /// few large buffers is not cached at all).
    limit: [usize; MAX_CLASSES],
    // The registration with the manager: while it is open the manager
    // leaves our buffers alone, so it lives as long as the last buffer.
    keepalive: Option<crate::fork::CloseOnFork>,
    /// The fork generation this pool belongs to: in a forked child it
    /// touches nothing shared (see [`crate::fork`]).
    born: crate::fork::Birth,
}

/// The pool has no free buffer of a suitable class right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// Larger than the largest class.
    #[error("{0} bytes is more than the largest buffer class")]
    TooLarge(usize),
    /// Every buffer of the class is in use (retry, or wait).
    #[error("pool exhausted")]
    Exhausted,
    /// This process was forked from the one that attached the pool
    /// handle (see [`crate::fork`]).
    #[error("the pool handle was inherited across fork(); attach a new stack")]
    Forked,
    /// The private cache is empty and the manager died while it held the
    /// shared list closed (killed in the middle of a reclamation sweep):
    /// nothing will open it again. Also for an allocation that does not
    /// wait.
    #[error("the manager died while it held the free list closed")]
    ManagerGone,
}

impl StackPool {
    /// A pool handle for stack `me`.
    pub fn new(view: PoolView, me: u16) -> Self {
        let limit = Self::limits(&view);
        Self {
            view,
            me,
            cache: Mutex::new(Default::default()),
            limit,
            keepalive: None,
            born: crate::fork::Birth::now(),
        }
    }

    fn limits(view: &PoolView) -> [usize; MAX_CLASSES] {
        let seg = view.segment();
        let mut l = [0; MAX_CLASSES];
        for (i, c) in seg.classes().iter().enumerate() {
            // At most half a class across all admitted stacks; the batch
            // moved at once (half the limit) fits one magazine.
            l[i] = (c.count as usize / (2 * seg.max_stacks() as usize)).min(CACHE_MAX);
        }
        l
    }

    /// A pool handle that keeps `ctrl` (the stack's manager connection)
    /// open for as long as it or any buffer from it lives.
    pub fn with_keepalive(view: PoolView, me: u16, ctrl: std::os::fd::OwnedFd) -> Self {
        let limit = Self::limits(&view);
        Self {
            view,
            me,
            cache: Mutex::new(Default::default()),
            limit,
            keepalive: Some(crate::fork::CloseOnFork::new(ctrl)),
            born: crate::fork::Birth::now(),
        }
    }

    /// The kept-alive control socket.
    pub fn keepalive(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.keepalive.as_ref().map(|f| f.as_fd())
    }

    /// Whether this process is a fork of the one that made the handle.
    #[inline]
    fn forked(&self) -> bool {
        self.born.forked()
    }

    /// The shared view.
    pub fn view(&self) -> &PoolView {
        &self.view
    }

    /// This stack's id.
    pub fn stack_id(&self) -> u16 {
        self.me
    }

    /// Takes a buffer of at least `len` bytes, `ALLOCATED` to this stack.
    /// `wait`: whether to wait out a manager reconciliation (microseconds,
    /// only after a crash) rather than report `Exhausted`.
    pub fn alloc(&self, len: usize, wait: bool) -> Result<RawBuf, AllocError> {
        if self.forked() {
            return Err(AllocError::Forked);
        }
        let class = self.view.class_for(len).ok_or(AllocError::TooLarge(len))?;
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let c = &mut cache[class];
        if c.is_empty()
            && self
                .view
                .global_op(self.me, class, wait, || {
                    self.view.pop_batch(self.me, class, self.limit[class], c)
                })
                .is_none()
            && (wait || self.view.stranded(class))
        {
            // Waiting, it gives up only on a gate a dead manager left
            // closed; not waiting, such a gate is no passing shortage
            // either (the caller would retry for ever).
            return Err(AllocError::ManagerGone);
        }
        let idx = c.pop().ok_or(AllocError::Exhausted)?;
        drop(cache);
        let b = RawBuf {
            class: class as u8,
            index: idx,
        };
        let hdr = self
            .view
            .seg
            .buf_header(class, idx)
            .expect("popped index in range");
        let g = bufword::gen(hdr.word.load(Ordering::Relaxed)).wrapping_add(1);
        hdr.word.store(
            bufword::pack(bufword::ALLOCATED, self.me, g),
            Ordering::Relaxed,
        );
        Ok(b)
    }

    /// Takes up to `out.len()` buffers of at least `len` bytes with one
    /// pass over the private cache; returns how many.
    pub fn alloc_many(&self, len: usize, out: &mut [RawBuf]) -> Result<usize, AllocError> {
        if self.forked() {
            return Err(AllocError::Forked);
        }
        let class = self.view.class_for(len).ok_or(AllocError::TooLarge(len))?;
        let mut got = 0;
        // The gate a dead manager left closed (see `alloc`).
        let mut stranded = false;
        {
            let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
            let c = &mut cache[class];
            while got < out.len() {
                if c.is_empty() {
                    stranded = self
                        .view
                        .global_op(self.me, class, true, || {
                            self.view.pop_batch(self.me, class, self.limit[class], c)
                        })
                        .is_none();
                }
                let Some(idx) = c.pop() else { break };
                out[got] = RawBuf {
                    class: class as u8,
                    index: idx,
                };
                got += 1;
            }
        }
        for b in &out[..got] {
            let hdr = self
                .view
                .seg
                .buf_header(class, b.index)
                .expect("cached index in range");
            let g = bufword::gen(hdr.word.load(Ordering::Relaxed)).wrapping_add(1);
            hdr.word.store(
                bufword::pack(bufword::ALLOCATED, self.me, g),
                Ordering::Relaxed,
            );
        }
        if got == 0 {
            return Err(if stranded {
                AllocError::ManagerGone
            } else {
                AllocError::Exhausted
            });
        }
        Ok(got)
    }

    /// Returns buffers this stack holds to the pool with one pass over the
    /// private cache: the burst path of [`StackPool::free`].
    pub fn free_many(&self, bufs: &[RawBuf]) {
        if self.forked() {
            return; // the parent's buffers: forgotten here
        }
        for &b in bufs {
            if let Some(hdr) = self.view.seg.buf_header(b.class as usize, b.index) {
                let w = hdr.word.load(Ordering::Relaxed);
                hdr.word.store(
                    bufword::pack(bufword::CACHED, self.me, bufword::gen(w)),
                    Ordering::Relaxed,
                );
            }
        }
        self.cache_many(bufs);
    }

    /// Puts buffers stamped `CACHED` into the private cache. A class over
    /// its limit spills half of it (at most a magazine: the limit is at
    /// most [`CACHE_MAX`]) to the shared list outside the cache lock, from
    /// an array on the stack: this runs once per received burst, and a
    /// heap allocation per spill cost as much as the spill itself.
    fn cache_many(&self, mut bufs: &[RawBuf]) {
        let mut spill = [0u32; MAG_SIZE];
        while !bufs.is_empty() {
            let mut spilled = None;
            {
                let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                while let Some((&b, rest)) = bufs.split_first() {
                    bufs = rest;
                    let class = b.class as usize;
                    let c = &mut cache[class];
                    c.push(b.index);
                    if c.len() > self.limit[class] {
                        let at = c.len() - (self.limit[class] / 2).max(1);
                        let n = c.len() - at;
                        spill[..n].copy_from_slice(&c[at..]);
                        c.truncate(at);
                        spilled = Some((class, n));
                        break;
                    }
                }
            }
            let Some((class, n)) = spilled else { break };
            let pushed = self
                .view
                .global_op(self.me, class, true, || {
                    self.view.push_chain(class, &spill[..n])
                })
                .unwrap_or(0);
            if pushed < n {
                // No empty magazine: the segment is corrupt. Keep them.
                let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
                cache[class].extend_from_slice(&spill[pushed..n]);
            }
        }
    }

    /// Makes a buffer this stack holds writable again
    /// ([`PoolView::reuse`]); in a forked child, only the local handle.
    pub fn reuse(&self, b: RawBuf) {
        if !self.forked() {
            self.view.reuse(self.me, b);
        }
    }

    /// Returns a buffer this stack owns (allocated or held) to the pool.
    pub fn free(&self, b: RawBuf) {
        if self.forked() {
            return; // the parent's buffer: forgotten here
        }
        let Some(hdr) = self.view.seg.buf_header(b.class as usize, b.index) else {
            return;
        };
        let w = hdr.word.load(Ordering::Relaxed);
        if bufword::owner(w) != self.me {
            // Reclaimed by the manager after our channel died; not ours.
            return;
        }
        hdr.word.store(
            bufword::pack(bufword::CACHED, self.me, bufword::gen(w)),
            Ordering::Relaxed,
        );
        self.cache_many(&[b]);
    }

    /// Returns every privately cached buffer to the shared lists.
    pub fn flush(&self) {
        if self.forked() {
            return; // the parent's cache, copied by fork()
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        for (class, c) in cache.iter_mut().enumerate() {
            if !c.is_empty() {
                let mut spill = std::mem::take(c);
                let pushed = self
                    .view
                    .global_op(self.me, class, true, || self.view.push_chain(class, &spill))
                    .unwrap_or(0);
                // What went is listed free: keeping it too would hand it
                // out twice (here and from the list).
                spill.drain(..pushed);
                *c = spill;
            }
        }
    }
}

impl Drop for StackPool {
    fn drop(&mut self) {
        // Return the cache while still registered; the manager reclaims
        // anything else when the control socket closes right after.
        self.flush();
    }
}

/// Buffers in use, per class: free on the shared list, and per owner.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClassUsage {
    /// Buffer size.
    pub buf_size: u32,
    /// Buffers in the class.
    pub total: u32,
    /// Buffers in state `FREE`.
    pub free: u32,
    /// `(owner stack id, buffers)` for every owner with at least one,
    /// counting private caches.
    pub by_owner: Vec<(u16, u32)>,
}

/// Manager-side pool operations: initialisation, statistics, reclamation.
#[derive(Debug)]
pub struct ManagerPool {
    view: PoolView,
}

/// A reclamation gave up: stack `.0`, alive as far as the manager knows,
/// stayed inside a free-list operation for all the patience it was given.
/// Nothing changed; the lists are open again.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("stack {0} stayed inside a free-list operation; reclamation deferred")]
pub struct Busy(pub u16);

/// What a reclamation returned to the pool.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Buffers that the dead stacks owned (cached, allocated, held, or in
    /// flight to them), and buffers one stamped in flight to a stack that
    /// can no longer receive them.
    pub owned: u32,
    /// Buffers found free but missing from the list (lost mid-operation).
    pub lost: u32,
}

impl ManagerPool {
    /// Wraps a freshly initialised segment and puts every buffer into the
    /// full magazines of its class.
    pub fn init(seg: Segment) -> Self {
        let this = Self {
            view: PoolView::new(seg),
        };
        for class in 0..this.view.seg.classes().len() {
            let all: Vec<u32> = (0..this.view.seg.classes()[class].count).collect();
            this.rebuild(class, &all, false);
        }
        this
    }

    /// Lays the free lists of `class` out anew: `free` in full magazines,
    /// every other magazine on the empty stack. Only with the lists frozen
    /// (at init, or with the gates closed). `bump`: give the freed buffers
    /// a new generation, so stale descriptors naming them are refused.
    fn rebuild(&self, class: usize, free: &[u32], bump: bool) {
        let seg = &self.view.seg;
        let count = seg.classes()[class].count;
        for &i in free {
            let h = seg.buf_header(class, i).expect("in range");
            let w = h.word.load(Ordering::Relaxed);
            let g = if bump {
                bufword::gen(w).wrapping_add(1)
            } else {
                bufword::gen(w)
            };
            h.word
                .store(bufword::pack(bufword::FREE, 0, g), Ordering::Relaxed);
        }
        let n_full = free.len().div_ceil(MAG_SIZE) as u32;
        for (m, chunk) in free.chunks(MAG_SIZE).enumerate() {
            let mag = seg
                .magazine(class, m as u32)
                .expect("one magazine per buffer");
            for (slot, &i) in mag.idx.iter().zip(chunk) {
                slot.store(i, Ordering::Relaxed);
            }
            mag.len.store(chunk.len() as u32, Ordering::Relaxed);
            mag.next.store(
                if m as u32 + 1 < n_full {
                    m as u32 + 2
                } else {
                    0
                },
                Ordering::Relaxed,
            );
        }
        for m in n_full..count {
            let mag = seg.magazine(class, m).expect("in range");
            mag.len.store(0, Ordering::Relaxed);
            mag.next
                .store(if m + 1 < count { m + 2 } else { 0 }, Ordering::Relaxed);
        }
        let fh = seg.free_head(class);
        let tag = |h: &AtomicU64| (h.load(Ordering::Relaxed) >> 32).wrapping_add(1) << 32;
        // Release: the magazines written above happen before any stack pops
        // them (its Acquire load of the head).
        fh.head.store(
            tag(&fh.head) | if n_full > 0 { 1 } else { 0 },
            Ordering::Release,
        );
        let first_empty = if n_full < count { n_full as u64 + 1 } else { 0 };
        fh.empty
            .store(tag(&fh.empty) | first_empty, Ordering::Release);
    }

    /// The shared view.
    pub fn view(&self) -> &PoolView {
        &self.view
    }

    /// Counts buffers by state and owner (a racy snapshot, for status).
    pub fn usage(&self) -> Vec<ClassUsage> {
        let seg = &self.view.seg;
        seg.classes()
            .iter()
            .enumerate()
            .map(|(class, c)| {
                let mut u = ClassUsage {
                    buf_size: c.buf_size,
                    total: c.count,
                    ..Default::default()
                };
                let mut owners = std::collections::BTreeMap::<u16, u32>::new();
                for i in 0..c.count {
                    let w = seg
                        .buf_header(class, i)
                        .expect("in range")
                        .word
                        .load(Ordering::Relaxed);
                    if bufword::state(w) == bufword::FREE {
                        u.free += 1;
                    } else {
                        *owners.entry(bufword::owner(w)).or_default() += 1;
                    }
                }
                u.by_owner = owners.into_iter().collect();
                u
            })
            .collect()
    }

    fn close_gates(
        &self,
        live: &[u16],
        patience: Duration,
        gone: impl FnMut(u16) -> bool,
    ) -> Result<(), Busy> {
        close_gates(&self.view.seg, live, patience, gone)
    }

    fn open_gates(&self) {
        open_gates(&self.view.seg)
    }

    /// Gives back everything the stacks in `dead` owned, and anything lost
    /// in a list operation one was in the middle of. `live` are the other
    /// registered stacks; `gone(id)` says whether one of them has in fact
    /// exited (asked only of one found inside a list operation). Rebuilds
    /// the lists from the headers: whatever is free (listed or not) goes
    /// back into magazines.
    ///
    /// Also gives back the buffers a dead stack `d` stamped in flight to a
    /// stack `o` unless `(d, o)` is in `readers`: the pairs where `o` may
    /// still read a ring from `d` (the other end of a channel of `d` not yet
    /// released). The rule is per dead stack: `o` may have drained and
    /// released its channel with one dead stack and not yet with another.
    /// A sender stamps before it pushes, so one that died in between left
    /// buffers owned by a live receiver but in no ring. Once the receiver
    /// has drained the ring and released the channel, whatever `d` stamped
    /// for it and it did not take can never reach it. Before that the
    /// buffer may still be in the ring, and taking it back would make the
    /// receiver reject (or, after the buffer's reuse, misread) a descriptor
    /// the dead stack really sent.
    ///
    /// Waits at most `patience` for live stacks to leave their list
    /// operations; if one does not (a stopped process, say), nothing
    /// changes and `Err(Busy(id))` names it: try again later (with the
    /// readers as they are then). The manager must not wait on one stack
    /// without bound.
    pub fn reclaim(
        &self,
        dead: &[u16],
        live: &[u16],
        readers: &[(u16, u16)],
        patience: Duration,
        gone: impl FnMut(u16) -> bool,
    ) -> Result<Reclaimed, Busy> {
        self.close_gates(live, patience, gone)?;
        let seg = &self.view.seg;
        let mut r = Reclaimed::default();
        for (class, c) in seg.classes().iter().enumerate() {
            // Walk the frozen full stack to know what is listed. A corrupt
            // link (cycle, out of range) ends the walk; the rebuild below
            // starts from the headers, so nothing is lost by stopping.
            let mut listed = vec![false; c.count as usize];
            let mut seen = vec![false; c.count as usize];
            let mut cur = seg.free_head(class).head.load(Ordering::Acquire) as u32;
            while cur != 0 {
                let m = cur - 1;
                let Some(mag) = seg.magazine(class, m) else {
                    break;
                };
                if seen[m as usize] {
                    break;
                }
                seen[m as usize] = true;
                let len = (mag.len.load(Ordering::Relaxed) as usize).min(MAG_SIZE);
                for slot in &mag.idx[..len] {
                    if let Some(l) = listed.get_mut(slot.load(Ordering::Relaxed) as usize) {
                        *l = true;
                    }
                }
                cur = mag.next.load(Ordering::Relaxed);
            }
            let mut free = Vec::new();
            for i in 0..c.count {
                let w = seg
                    .buf_header(class, i)
                    .expect("in range")
                    .word
                    .load(Ordering::Relaxed);
                if bufword::state(w) == bufword::FREE {
                    if !listed[i as usize] {
                        r.lost += 1;
                    }
                    free.push(i);
                } else if dead.contains(&bufword::owner(w))
                    || bufword::owner(w) == 0
                    || (bufword::state(w) == bufword::INFLIGHT
                        && dead.contains(&bufword::from(w))
                        && !readers.contains(&(bufword::from(w), bufword::owner(w))))
                {
                    r.owned += 1;
                    free.push(i);
                }
            }
            self.rebuild(class, &free, true);
        }
        for &d in dead {
            // A dead stack's count stays as its threads left it.
            seg.stack_slot(d).intent.store(0, Ordering::SeqCst);
        }
        self.open_gates();
        Ok(r)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use crate::layout::PoolConfig;
    use crate::segment::Region;

    /// The conformance suite runs every pool test on each backing: the
    /// heap region (the in-process backend) and a sealed memfd (shm).
    #[derive(Clone, Copy, Debug)]
    enum Backing {
        Heap,
        Memfd,
    }
    const BACKINGS: [Backing; 2] = [Backing::Heap, Backing::Memfd];

    fn pool(b: Backing, classes: Vec<(u32, u32)>) -> (ManagerPool, Segment) {
        let cfg = PoolConfig {
            classes,
            max_stacks: 4,
            max_channels: 2,
            ring_capacity: 8,
        };
        let geo = cfg.geometry().unwrap();
        let region = match b {
            Backing::Heap => Region::heap(geo.total_len as usize).unwrap(),
            Backing::Memfd => {
                Region::create_memfd("xio-pool-test", geo.total_len as usize).unwrap()
            }
        };
        let seg = Segment::init(region, &cfg, &geo).unwrap();
        (ManagerPool::init(seg.clone()), seg)
    }

    fn total_free(m: &ManagerPool) -> u32 {
        m.usage().iter().map(|u| u.free).sum()
    }

    #[test]
    fn alloc_free_all_classes_and_exhaustion() {
        for b in BACKINGS {
            alloc_free_all_classes_and_exhaustion_on(b);
        }
    }

    fn alloc_free_all_classes_and_exhaustion_on(b: Backing) {
        let (m, seg) = pool(b, vec![(64, 40), (4096, 3)]);
        let p = StackPool::new(PoolView::new(seg), 1);
        let small: Vec<_> = (0..40).map(|_| p.alloc(10, true).unwrap()).collect();
        assert_eq!(p.alloc(64, true), Err(AllocError::Exhausted));
        let big = p.alloc(65, true).unwrap();
        assert_eq!(big.class, 1);
        assert_eq!(p.alloc(4097, true), Err(AllocError::TooLarge(4097)));
        let mut seen = std::collections::HashSet::new();
        assert!(
            small.iter().all(|b| seen.insert(*b)),
            "no buffer handed out twice"
        );
        for b in small {
            p.free(b);
        }
        p.free(big);
        p.flush();
        assert_eq!(total_free(&m), 43);
    }

    /// A magazine is shared memory: an index listed twice (or the index
    /// of a buffer someone holds) must not make this process hand one
    /// buffer out twice, two `BufMut`s over the same bytes.
    #[test]
    fn a_corrupt_magazine_never_hands_out_a_buffer_twice() {
        for b in BACKINGS {
            a_corrupt_magazine_never_hands_out_a_buffer_twice_on(b);
        }
    }

    fn a_corrupt_magazine_never_hands_out_a_buffer_twice_on(b: Backing) {
        let (_m, seg) = pool(b, vec![(64, 8)]);
        // Eight buffers in magazine 0; each pop takes one from its end
        // (a cache of one: 8 / (2 x 4 stacks)).
        let mag = seg.magazine(0, 0).unwrap();
        assert_eq!(mag.len.load(Ordering::Relaxed), 8);
        let dup = mag.idx[6].load(Ordering::Relaxed);
        mag.idx[7].store(dup, Ordering::Relaxed);
        let p = StackPool::new(PoolView::new(seg.clone()), 1);
        let mut seen = std::collections::HashSet::new();
        while let Ok(b) = p.alloc(10, false) {
            assert!(seen.insert(b), "{b:?} handed out twice");
        }
        // And one that another stack holds, listed as free.
        let q = StackPool::new(PoolView::new(seg.clone()), 2);
        for b in seen.drain() {
            p.free(b);
        }
        p.flush();
        let theirs = q.alloc(10, false).unwrap();
        let mag = (0..8)
            .filter_map(|m| seg.magazine(0, m))
            .find(|m| m.len.load(Ordering::Relaxed) > 0)
            .unwrap();
        let n = mag.len.load(Ordering::Relaxed) as usize;
        mag.idx[n - 1].store(theirs.index, Ordering::Relaxed);
        while let Ok(b) = p.alloc(10, false) {
            assert_ne!(b, theirs, "a buffer stack 2 holds handed to stack 1");
        }
    }

    /// Flushing a cache of more than a magazine pushes a chunk at a time.
    /// When the empty magazines ran out midway (a corrupt list), the cache
    /// took back every index, the pushed ones too: those were then both
    /// listed free and cached, and handed to two stacks.
    #[test]
    fn a_flush_that_fails_midway_keeps_only_what_it_did_not_push() {
        for b in BACKINGS {
            a_flush_that_fails_midway_keeps_only_what_it_did_not_push_on(b);
        }
    }

    fn a_flush_that_fails_midway_keeps_only_what_it_did_not_push_on(b: Backing) {
        let (_m, seg) = pool(b, vec![(64, 1000)]);
        let p = StackPool::new(PoolView::new(seg.clone()), 1);
        let held: Vec<_> = (0..2 * MAG_SIZE)
            .map(|_| p.alloc(10, true).unwrap())
            .collect();
        for b in held {
            p.free(b); // a cache of 60: nothing spills
        }
        // One empty magazine left: the flush's second chunk finds none.
        let fh = seg.free_head(0);
        let first = fh.empty.load(Ordering::Relaxed) as u32;
        assert_ne!(first, 0);
        seg.magazine(0, first - 1)
            .unwrap()
            .next
            .store(0, Ordering::Relaxed);
        p.flush();
        let q = StackPool::new(PoolView::new(seg.clone()), 2);
        let mut theirs = std::collections::HashSet::new();
        while let Ok(b) = q.alloc(10, false) {
            theirs.insert(b);
        }
        while let Ok(b) = p.alloc(10, false) {
            assert!(!theirs.contains(&b), "{b:?} handed to both stacks");
        }
    }

    #[test]
    fn send_accept_and_forged_descriptors() {
        for b in BACKINGS {
            send_accept_and_forged_descriptors_on(b);
        }
    }

    fn send_accept_and_forged_descriptors_on(b: Backing) {
        let (_m, seg) = pool(b, vec![(256, 8)]);
        let a = StackPool::new(PoolView::new(seg.clone()), 1);
        let b = StackPool::new(PoolView::new(seg), 2);
        let x = a.alloc(100, true).unwrap();
        let d = a.view().prepare_send(1, x, 100, 2, 0, 0);
        // Not addressed to stack 3; not from stack 3; wrong generation; bad class, index, length.
        assert!(matches!(
            b.view().accept(3, 1, &d),
            Err(Reject::Ownership(_))
        ));
        // Through another sender's ring.
        assert!(matches!(
            b.view().accept(2, 3, &d),
            Err(Reject::Ownership(_))
        ));
        assert!(matches!(
            b.view().accept(
                2,
                1,
                &Descriptor {
                    gen: d.gen ^ 1,
                    ..d
                }
            ),
            Err(Reject::Ownership(_))
        ));
        assert_eq!(
            b.view().accept(2, 1, &Descriptor { class: 5, ..d }),
            Err(Reject::Class(5))
        );
        assert_eq!(
            b.view().accept(2, 1, &Descriptor { index: 8, ..d }),
            Err(Reject::Index(8))
        );
        assert_eq!(
            b.view().accept(2, 1, &Descriptor { len: 257, ..d }),
            Err(Reject::Length(257))
        );
        assert_eq!(b.view().accept(2, 1, &d), Ok(x));
        // A replay of the same descriptor is refused.
        assert!(matches!(
            b.view().accept(2, 1, &d),
            Err(Reject::Ownership(_))
        ));
        b.free(x);
    }

    #[test]
    fn reclaim_returns_everything_a_dead_stack_held() {
        for b in BACKINGS {
            reclaim_returns_everything_a_dead_stack_held_on(b);
        }
    }

    fn reclaim_returns_everything_a_dead_stack_held_on(b: Backing) {
        let (m, seg) = pool(b, vec![(64, 100), (1024, 10)]);
        let a = StackPool::new(PoolView::new(seg.clone()), 1);
        let b = StackPool::new(PoolView::new(seg.clone()), 2);
        let held: Vec<_> = (0..30).map(|_| a.alloc(64, true).unwrap()).collect();
        // In flight from b to a.
        let f = b.alloc(1000, true).unwrap();
        let _ = b.view().prepare_send(2, f, 1, 1, 0, 0);
        // Simulate a crash between taking a magazine and claiming its
        // buffers: pop one by hand, never claim.
        let lost = {
            let v = PoolView::new(seg.clone());
            let mg = v.mag_pop(0, &seg.free_head(0).head).unwrap();
            seg.magazine(0, mg).unwrap().len.load(Ordering::SeqCst)
        };
        assert!(lost > 0);
        seg.stack_slot(1).intent.store(1, Ordering::SeqCst);
        std::mem::forget(a); // a "dies" with its cache and buffers
        let r = m
            .reclaim(&[1], &[2], &[], Duration::MAX, |_| false)
            .unwrap();
        assert_eq!(r.lost, lost, "the taken-but-unclaimed buffers are found");
        assert!(r.owned >= 31, "{r:?}");
        drop(held);
        // b is alive and keeps its own (b's cached leftovers + nothing else).
        b.flush();
        assert_eq!(total_free(&m), 110);
        // The rebuilt lists work.
        let all: Vec<_> = (0..100).map(|_| b.alloc(1, true).unwrap()).collect();
        assert_eq!(all.len(), 100);
    }

    /// Two threads of one stack: one inside a free-list operation, the
    /// other completes one of its own. The stack is not idle: a
    /// reclamation (for some other, dead stack) must not go ahead. With a
    /// per-stack flag the second thread's exit cleared it and the manager
    /// rebuilt the lists under the first.
    #[test]
    fn a_stack_is_busy_while_any_of_its_threads_is_in_a_list_op() {
        for b in BACKINGS {
            a_stack_is_busy_while_any_of_its_threads_is_in_a_list_op_on(b);
        }
    }

    fn a_stack_is_busy_while_any_of_its_threads_is_in_a_list_op_on(b: Backing) {
        use std::sync::mpsc::channel;
        let (m, seg) = pool(b, vec![(64, 64)]);
        let view = PoolView::new(seg.clone());
        let (inside_tx, inside_rx) = channel();
        let (leave_tx, leave_rx) = channel::<()>();
        let t1 = {
            let view = view.clone();
            std::thread::spawn(move || {
                view.global_op(1, 0, true, || {
                    inside_tx.send(()).unwrap();
                    leave_rx.recv().unwrap();
                })
            })
        };
        inside_rx.recv().unwrap();
        // A second thread of stack 1 enters and leaves.
        std::thread::scope(|s| {
            s.spawn(|| view.global_op(1, 0, true, || ()).unwrap());
        });
        assert_eq!(
            m.reclaim(&[2], &[1], &[], Duration::from_millis(20), |_| false),
            Err(Busy(1)),
            "stack 1 has a thread inside a list operation"
        );
        assert_eq!(
            seg.free_head(0).gate.load(Ordering::SeqCst),
            0,
            "a reclamation that gave up leaves the gates open"
        );
        leave_tx.send(()).unwrap();
        t1.join().unwrap().unwrap();
        m.reclaim(&[2], &[1], &[], Duration::MAX, |_| false)
            .expect("idle now");
        assert_eq!(total_free(&m), 64);
    }

    /// A stack that left its intent set and has exited (its end of file
    /// not handled yet) is not waited for; a live one is, for the patience
    /// given, and then named.
    #[test]
    fn reclaim_skips_an_exited_stacks_intent_and_names_a_stuck_one() {
        for b in BACKINGS {
            reclaim_skips_an_exited_stacks_intent_and_names_a_stuck_one_on(b);
        }
    }

    fn reclaim_skips_an_exited_stacks_intent_and_names_a_stuck_one_on(b: Backing) {
        let (m, seg) = pool(b, vec![(64, 64)]);
        let a = StackPool::new(PoolView::new(seg.clone()), 1);
        let held: Vec<_> = (0..10).map(|_| a.alloc(1, true).unwrap()).collect();
        // Stack 1 dies holding 10 (and its cache); stacks 2 and 3 "died
        // inside a list operation".
        std::mem::forget(a);
        seg.stack_slot(2).intent.store(1, Ordering::SeqCst);
        seg.stack_slot(3).intent.store(1, Ordering::SeqCst);
        // 3 is still registered (its death not handled yet) and has exited.
        let mut asked = Vec::new();
        let r = m
            .reclaim(&[1, 2], &[3], &[], Duration::MAX, |id| {
                asked.push(id);
                true
            })
            .expect("an exited stack is not waited for");
        assert_eq!(asked, [3]);
        assert!(r.owned >= 10, "{r:?}");
        assert_eq!(seg.stack_slot(2).intent.load(Ordering::SeqCst), 0);
        assert_eq!(seg.stack_slot(3).intent.load(Ordering::SeqCst), 1);
        drop(held);
        // Now 3 is alive but stuck (stopped inside a list operation).
        assert_eq!(
            m.reclaim(&[2], &[3], &[], Duration::from_millis(5), |_| false),
            Err(Busy(3))
        );
        seg.stack_slot(3).intent.store(0, Ordering::SeqCst);
        m.reclaim(&[2], &[3], &[], Duration::from_millis(5), |_| false)
            .expect("3 left its operation");
        assert_eq!(total_free(&m), 64);
    }

    #[test]
    fn reclaim_finds_what_a_dead_sender_stamped_but_never_pushed() {
        for b in BACKINGS {
            reclaim_finds_what_a_dead_sender_stamped_but_never_pushed_on(b);
        }
    }

    fn reclaim_finds_what_a_dead_sender_stamped_but_never_pushed_on(b: Backing) {
        let (m, seg) = pool(b, vec![(64, 10)]);
        let a = StackPool::new(PoolView::new(seg.clone()), 1);
        let b = StackPool::new(PoolView::new(seg.clone()), 2);
        // a stamps two buffers in flight to b: `pushed` reaches b's ring,
        // `stranded` never does (a dies first).
        let pushed = a.alloc(64, true).unwrap();
        let stranded = a.alloc(64, true).unwrap();
        let d_pushed = a.view().prepare_send(1, pushed, 8, 2, 0, 0);
        let d_stranded = a.view().prepare_send(1, stranded, 8, 2, 0, 0);
        std::mem::forget(a);
        // First sweep: b may still read the ring from a, so neither goes.
        let r = m
            .reclaim(&[1], &[2], &[(1, 2)], Duration::MAX, |_| false)
            .unwrap();
        assert_eq!(r.owned, 0, "both may still reach b: {r:?}");
        assert_eq!(b.view().accept(2, 1, &d_pushed), Ok(pushed));
        // b drained the ring and released the channel: the second sweep
        // takes back what a stamped for b and b never took, not what it did.
        let r = m
            .reclaim(&[1], &[2], &[], Duration::MAX, |_| false)
            .unwrap();
        assert_eq!(r.owned, 1, "{r:?}");
        assert_eq!(total_free(&m), 9);
        // A stale descriptor for the reclaimed buffer is refused, even
        // once the buffer is in flight to b again with a newer generation.
        assert!(matches!(
            b.view().accept(2, 1, &d_stranded),
            Err(Reject::Ownership(_))
        ));
        let c = StackPool::new(PoolView::new(seg), 3);
        let again: Vec<_> = (0..9).map(|_| c.alloc(64, true).unwrap()).collect();
        assert!(again.contains(&stranded));
        let _ = c.view().prepare_send(3, stranded, 8, 2, 0, 0);
        assert!(matches!(
            b.view().accept(2, 1, &d_stranded),
            Err(Reject::Ownership(_))
        ));
        b.free(pushed);
    }

    /// Two senders die at once and are swept in one pass: the readers rule
    /// holds per dead stack. The live receiver has released its channel
    /// with one of them (drained it) and not yet with the other: what the
    /// first stamped for it and never pushed goes back, what the second
    /// stamped stays (it may still be in the ring) until the next sweep.
    #[test]
    fn reclaim_applies_the_readers_rule_per_dead_stack() {
        for b in BACKINGS {
            reclaim_applies_the_readers_rule_per_dead_stack_on(b);
        }
    }

    fn reclaim_applies_the_readers_rule_per_dead_stack_on(b: Backing) {
        let (m, seg) = pool(b, vec![(64, 64)]);
        let state = |x: RawBuf| {
            let w = seg
                .buf_header(x.class as usize, x.index)
                .unwrap()
                .word
                .load(Ordering::SeqCst);
            (bufword::state(w), bufword::owner(w))
        };
        let s1 = StackPool::new(PoolView::new(seg.clone()), 1);
        let s2 = StackPool::new(PoolView::new(seg.clone()), 2);
        let s3 = StackPool::new(PoolView::new(seg.clone()), 3);
        // Stamped and never pushed: 1 -> 3, 2 -> 3, 1 -> 2; and one in
        // flight between live stacks (3 -> 3 will do: from a live sender).
        let x13 = s1.alloc(64, true).unwrap();
        let x23 = s2.alloc(64, true).unwrap();
        let x12 = s1.alloc(64, true).unwrap();
        let x33 = s3.alloc(64, true).unwrap();
        let _ = s1.view().prepare_send(1, x13, 8, 3, 0, 0);
        let _ = s2.view().prepare_send(2, x23, 8, 3, 0, 0);
        let _ = s1.view().prepare_send(1, x12, 8, 2, 0, 0);
        let _ = s3.view().prepare_send(3, x33, 8, 3, 0, 0);
        std::mem::forget(s1);
        std::mem::forget(s2);
        // 3 has released its channel with 1, not yet the one with 2.
        m.reclaim(&[1, 2], &[3], &[(2, 3)], Duration::MAX, |_| false)
            .unwrap();
        assert_eq!(state(x13).0, bufword::FREE, "3 no longer reads from 1");
        assert_eq!(state(x12).0, bufword::FREE, "owned by a dead stack");
        assert_eq!(
            state(x23),
            (bufword::INFLIGHT, 3),
            "3 may still read it from 2's ring"
        );
        assert_eq!(state(x33), (bufword::INFLIGHT, 3), "a live sender's");
        // 3 released the other channel too: the last sweep for 2 finds it.
        m.reclaim(&[2], &[3], &[], Duration::MAX, |_| false)
            .unwrap();
        assert_eq!(state(x23).0, bufword::FREE);
        assert_eq!(state(x33), (bufword::INFLIGHT, 3));
        drop(s3);
    }

    #[test]
    fn concurrent_alloc_free_threads() {
        for b in BACKINGS {
            concurrent_alloc_free_threads_on(b);
        }
    }

    fn concurrent_alloc_free_threads_on(b: Backing) {
        let (m, seg) = pool(b, vec![(64, 256)]);
        let hs: Vec<_> = (1..=3u16)
            .map(|id| {
                let seg = seg.clone();
                std::thread::spawn(move || {
                    let p = StackPool::new(PoolView::new(seg), id);
                    let mut mine = Vec::new();
                    for i in 0..20_000 {
                        if i % 3 != 2 {
                            if let Ok(b) = p.alloc(8, true) {
                                mine.push(b);
                            }
                        } else if let Some(b) = mine.pop() {
                            p.free(b);
                        }
                        if mine.len() > 50 {
                            for b in mine.drain(..) {
                                p.free(b);
                            }
                        }
                    }
                    for b in mine {
                        p.free(b);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(total_free(&m), 256);
    }
}

#[cfg(all(test, loom))]
mod loom_tests {
    use super::*;
    use loom::sync::Arc;
    use loom::thread;

    struct Lists {
        full: AtomicU64,
        empty: AtomicU64,
        mags: Vec<Magazine>,
    }

    impl Lists {
        fn pop(&self, head: &AtomicU64) -> Option<u32> {
            tagged_pop(head, |m| self.mags.get(m as usize))
        }
        fn push(&self, head: &AtomicU64, m: u32) {
            tagged_push(head, &self.mags[m as usize], m)
        }
        fn walk(&self, head: &AtomicU64) -> Vec<u32> {
            let mut v = Vec::new();
            let mut cur = head.load(Ordering::Acquire) as u32;
            while cur != 0 {
                v.push(cur - 1);
                cur = self.mags[cur as usize - 1].next.load(Ordering::Relaxed);
                assert!(v.len() <= self.mags.len(), "cycle");
            }
            v
        }
    }

    /// The crash-reclamation handshake: two threads of one stack each run
    /// a free-list operation (`bracket`, as `global_op` does; one waits
    /// out a closed gate, one gives up) while the manager closes the gate
    /// and, if the stack's intent reads zero, rebuilds the lists (as
    /// `close_gates` and `reclaim` do; otherwise it gives up, as when its
    /// patience runs out). What an operation and the rebuild write are
    /// loom cells, so an operation overlapping the rebuild fails the
    /// model, and so does a write going unseen. With the intent a flag
    /// instead of a count (the second thread's exit clearing it while the
    /// first is inside) it fails.
    #[test]
    fn loom_no_rebuild_while_a_thread_of_the_stack_is_inside() {
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let intent = Arc::new(AtomicU64::new(0));
            let gate = Arc::new(AtomicU32::new(0));
            // What each thread's operation changes (the lists themselves
            // are lock-free among stacks: only the manager needs them
            // still); the rebuild changes both.
            let lists: Arc<[loom::cell::UnsafeCell<u32>; 2]> = Arc::new(Default::default());
            let threads: Vec<_> = (0..2)
                .map(|i| {
                    let (intent, gate, lists) = (intent.clone(), gate.clone(), lists.clone());
                    thread::spawn(move || {
                        bracket(
                            &intent,
                            &gate,
                            i == 0,
                            || false,
                            || {
                                // SAFETY: inside the bracket; the model checks
                                // that the manager does not touch it meanwhile.
                                lists[i].with_mut(|p| unsafe { *p += 1 })
                            },
                        )
                        .is_some()
                    })
                })
                .collect();
            gate.store(1, Ordering::SeqCst);
            dekker_order();
            // No patience: one look (waiting is the same look repeated).
            let rebuilt = wait_idle(&intent, Some(Instant::now()));
            if rebuilt {
                for l in lists.iter() {
                    // SAFETY: the gate is closed and the stack idle: the
                    // lists are the manager's alone (what the model checks).
                    l.with_mut(|p| unsafe { *p += 10 });
                }
            }
            gate.store(0, Ordering::Release);
            let ran: Vec<bool> = threads.into_iter().map(|t| t.join().unwrap()).collect();
            assert!(ran[0], "the waiting thread runs once the gate reopens");
            for (l, ran) in lists.iter().zip(ran) {
                // SAFETY: every thread joined.
                let v = l.with(|p| unsafe { *p });
                assert_eq!(v, u32::from(ran) + if rebuilt { 10 } else { 0 });
            }
            assert_eq!(intent.load(Ordering::SeqCst), 0);
        });
    }

    /// Three magazines: 0 and 1 full (holding buffers 10 and 11), 2 empty.
    fn lists() -> Arc<Lists> {
        let l = Lists {
            full: AtomicU64::new(0),
            empty: AtomicU64::new(0),
            mags: (0..3).map(|_| Magazine::default()).collect(),
        };
        for (m, b) in [(1u32, 11u32), (0, 10)] {
            l.mags[m as usize].idx[0].store(b, Ordering::Relaxed);
            l.mags[m as usize].len.store(1, Ordering::Relaxed);
            l.push(&l.full, m);
        }
        l.push(&l.empty, 2);
        Arc::new(l)
    }

    /// Two stacks take a full magazine each and return it empty, while a
    /// third returns a buffer in the empty magazine: no magazine is handed
    /// out twice, none is lost, and every buffer index read is one that was
    /// published with its magazine.
    #[test]
    fn loom_magazine_stacks_take_and_return() {
        // Three threads with CAS retry loops: bound preemptions (as loom's
        // docs advise) so the model stays tractable; 3 covers every
        // interleaving of one racing CAS against another with a retry.
        let mut b = loom::model::Builder::new();
        b.preemption_bound = Some(3);
        b.check(|| {
            let l = lists();
            let takers: Vec<_> = (0..2)
                .map(|_| {
                    let l = l.clone();
                    thread::spawn(move || {
                        let m = l.pop(&l.full).expect("two full magazines for two takers");
                        let mag = &l.mags[m as usize];
                        assert_eq!(mag.len.load(Ordering::Relaxed), 1);
                        let b = mag.idx[0].load(Ordering::Relaxed);
                        assert!(b == 10 || b == 11 || b == 12, "published index, got {b}");
                        mag.len.store(0, Ordering::Relaxed);
                        l.push(&l.empty, m);
                        b
                    })
                })
                .collect();
            let giver = {
                let l = l.clone();
                thread::spawn(move || {
                    if let Some(m) = l.pop(&l.empty) {
                        let mag = &l.mags[m as usize];
                        mag.idx[0].store(12, Ordering::Relaxed);
                        mag.len.store(1, Ordering::Relaxed);
                        l.push(&l.full, m);
                    }
                })
            };
            let mut got: Vec<u32> = takers.into_iter().map(|t| t.join().unwrap()).collect();
            giver.join().unwrap();
            got.sort_unstable();
            got.dedup();
            assert_eq!(got.len(), 2, "no buffer taken twice");
            let mut all = l.walk(&l.full);
            all.extend(l.walk(&l.empty));
            all.sort_unstable();
            assert_eq!(all, vec![0, 1, 2], "every magazine on exactly one list");
        });
    }
}

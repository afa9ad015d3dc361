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
//!
//! [`ManagerPool::reclaim`]: crate::backend::shm::ManagerPool::reclaim
//! [`Busy`]: crate::backend::Busy

use std::sync::Mutex;

use crate::backend::gate;
use crate::backend::traits::{AllocError, BufferPool, RawBuf, Reject};
use crate::layout::{
    bufword, BufHeader, Descriptor, Magazine, BUF_HEADROOM, MAG_SIZE, MAX_CLASSES,
};
use crate::segment::Segment;
use crate::sync::{prefetch_write, spin_hint, AtomicU64, Ordering};

/// Most buffers of one class a stack keeps in its private cache.
const CACHE_MAX: usize = 2 * MAG_SIZE;

/// How often at most a stack that its counters put at a quota counts its
/// charge from the headers (a scan of the class).
const RECOUNT_EVERY: std::time::Duration = std::time::Duration::from_millis(5);

/// A stack's side of the quotas: the caps, and the credits it owes other
/// stacks for buffers of theirs it freed or took over, given in batches.
#[derive(Debug)]
struct Quota {
    /// Per class: [`ClassInfo::quota`](crate::layout::ClassInfo::quota),
    /// read once (a later write to the segment does not move it).
    cap: [u32; MAX_CLASSES],
    /// Per class: credits given in one add: a sixteenth of the quota, 1
    /// to 32, so what peers still owe is a small part of it.
    batch: [u32; MAX_CLASSES],
    /// Per stack id, per class: credits owed, not given yet.
    owed: Box<[[std::sync::atomic::AtomicU32; MAX_CLASSES]]>,
    /// Per class: the last count from the headers.
    counted_at: Mutex<[Option<std::time::Instant>; MAX_CLASSES]>,
}

impl Quota {
    fn new(view: &PoolView) -> Quota {
        let seg = view.segment();
        let mut cap = [0; MAX_CLASSES];
        let mut batch = [1; MAX_CLASSES];
        for (i, c) in seg.classes().iter().enumerate() {
            // 0 is no quota a manager writes (it writes at least 1):
            // a forged word, taken as no cap rather than as no buffers.
            cap[i] = if c.quota == 0 { c.count } else { c.quota.min(c.count) };
            batch[i] = (cap[i] / 16).clamp(1, 32);
        }
        Quota {
            cap,
            batch,
            owed: (0..=seg.max_stacks()).map(|_| Default::default()).collect(),
            counted_at: Mutex::new([None; MAX_CLASSES]),
        }
    }
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
    /// intent/gate bracket ([`gate::global_op`] on this view's segment).
    pub(crate) fn global_op<R>(
        &self,
        me: u16,
        class: usize,
        wait: bool,
        op: impl FnOnce() -> R,
    ) -> Option<R> {
        gate::global_op(&self.seg, me, class, wait, op)
    }

    /// Whether `class`'s gate is held closed by a manager that died
    /// ([`gate::stranded`]).
    pub(crate) fn stranded(&self, class: usize) -> bool {
        gate::stranded(&self.seg, class)
    }

    /// Pops a magazine off the tagged stack at `head`.
    pub(super) fn mag_pop(&self, class: usize, head: &AtomicU64) -> Option<u32> {
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
        // The sender stays in the word: it is charged for the buffer until
        // we free it or take it over (see `bufword::charged_to`).
        hdr.word.store(
            bufword::pack_from(bufword::HELD, me, from, bufword::gen(w)),
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

    /// Buffers of `class` charged to stack `id` ([`bufword::charged_to`]):
    /// a scan of the class's headers, the truth the quota counters
    /// estimate.
    pub(crate) fn charged_to(&self, class: usize, id: u16) -> u32 {
        let Some(c) = self.seg.classes().get(class) else {
            return 0;
        };
        let mut n = 0;
        for i in 0..c.count {
            let w = self
                .seg
                .buf_header(class, i)
                .map_or(0, |h| h.word.load(Ordering::Relaxed));
            if bufword::charged_to(w) == Some(id) {
                n += 1;
            }
        }
        n
    }

    /// Buffers stamped in flight to stack `id` and not received yet (in a
    /// ring, or stamped and never pushed): a scan of every header.
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn in_flight_to(&self, id: u16) -> usize {
        let seg = &self.seg;
        let mut n = 0;
        for (class, c) in seg.classes().iter().enumerate() {
            for i in 0..c.count {
                let w = seg
                    .buf_header(class, i)
                    .map_or(0, |h| h.word.load(Ordering::Acquire));
                if bufword::state(w) == bufword::INFLIGHT && bufword::owner(w) == id {
                    n += 1;
                }
            }
        }
        n
    }
}

/// Payload bytes [`PoolView::prefetch`] asks for: enough for
/// a small request or response, little enough not to crowd the cache.
pub const PREFETCH_PAYLOAD: usize = 192;

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
    /// What this stack counts against its quotas.
    quota: Quota,
    // The registration with the manager: while it is open the manager
    // leaves our buffers alone, so it lives as long as the last buffer.
    keepalive: Option<crate::fork::CloseOnFork>,
    /// The fork generation this pool belongs to: in a forked child it
    /// touches nothing shared (see [`crate::fork`]).
    born: crate::fork::Birth,
}

impl StackPool {
    /// A pool handle for stack `me`.
    #[cfg(any(test, feature = "test-support"))]
    pub fn new(view: PoolView, me: u16) -> Self {
        Self::with(view, me, None)
    }

    fn with(view: PoolView, me: u16, keepalive: Option<crate::fork::CloseOnFork>) -> Self {
        Self {
            limit: Self::limits(&view),
            quota: Quota::new(&view),
            view,
            me,
            cache: Mutex::new(Default::default()),
            keepalive,
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
        Self::with(view, me, Some(crate::fork::CloseOnFork::new(ctrl)))
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
        if self.over_quota(class, 1) {
            self.note(|s| &s.quota_full);
            return Err(AllocError::Exhausted);
        }
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        let c = &mut cache[class];
        if c.is_empty()
            && self
                .view
                .global_op(self.me, class, wait, || {
                    self.view.pop_batch(self.me, class, self.limit[class], c)
                })
                .is_none()
            && self.view.stranded(class)
        {
            // A gate a dead manager left closed is no passing shortage
            // (the caller would retry for ever). One closed too long
            // (forged) is a shortage: the caller waits with its timeout.
            return Err(AllocError::ManagerGone);
        }
        let Some(idx) = c.pop() else {
            drop(cache);
            self.note(|s| &s.pool_empty);
            return Err(AllocError::Exhausted);
        };
        drop(cache);
        self.charge(class, 1);
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
        // Within the quota: as many as it leaves room for.
        let room = self.quota_room(class, out.len() as u32) as usize;
        if room == 0 && !out.is_empty() {
            self.note(|s| &s.quota_full);
            return Err(AllocError::Exhausted);
        }
        let out = &mut out[..room];
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
                        .is_none()
                        && self.view.stranded(class);
                }
                let Some(idx) = c.pop() else { break };
                out[got] = RawBuf {
                    class: class as u8,
                    index: idx,
                };
                got += 1;
            }
        }
        self.charge(class, got as u32);
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
            if stranded {
                return Err(AllocError::ManagerGone);
            }
            self.note(|s| &s.pool_empty);
            return Err(AllocError::Exhausted);
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
                self.discharge(b.class as usize, w);
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
            // Taken over: whoever was charged for it is no longer, we are.
            if let Some(hdr) = self.view.seg.buf_header(b.class as usize, b.index) {
                self.discharge(b.class as usize, hdr.word.load(Ordering::Relaxed));
                self.charge(b.class as usize, 1);
            }
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
        self.discharge(b.class as usize, w);
        hdr.word.store(
            bufword::pack(bufword::CACHED, self.me, bufword::gen(w)),
            Ordering::Relaxed,
        );
        self.cache_many(&[b]);
    }

    /// The quota of `class` ([`ClassInfo::quota`], read at attach).
    ///
    /// [`ClassInfo::quota`]: crate::layout::ClassInfo::quota
    pub fn quota(&self, class: usize) -> u32 {
        self.quota.cap.get(class).copied().unwrap_or(0)
    }

    /// How many of `want` buffers of `class` the quota leaves room for.
    #[inline]
    fn quota_room(&self, class: usize, want: u32) -> u32 {
        let cap = self.quota(class);
        let counted = self.charged_now(class);
        if counted.is_some_and(|used| used.saturating_add(want) <= cap) {
            return want;
        }
        // Unknown (below zero) is taken as full until the headers say.
        let used = self.recount(class).or(counted).unwrap_or(cap);
        cap.saturating_sub(used).min(want)
    }

    /// Whether `n` more buffers of `class` would pass its quota.
    #[inline]
    fn over_quota(&self, class: usize, n: u32) -> bool {
        self.quota_room(class, n) < n
    }

    /// What the counters say is charged to this stack in `class`: charged
    /// less credited. `None` when that is below zero, which no honest
    /// count gives (a late credit for the stack that had this id before,
    /// or a forged word): the headers must say.
    #[inline]
    fn charged_now(&self, class: usize) -> Option<u32> {
        let slot = self.view.seg.stack_slot(self.me);
        let c = slot.charged[class].load(Ordering::Relaxed);
        let d = slot.credited[class].load(Ordering::Relaxed);
        let used = c.wrapping_sub(d);
        (used as i32 >= 0).then_some(used)
    }

    /// The counters say the quota is reached: counts the charge from the
    /// headers instead (at most once per [`RECOUNT_EVERY`] per class), and
    /// sets the counters to agree. Credits still owed by peers (a batch
    /// not full yet), buffers the manager took back from a dead peer, and
    /// forged counter words all make the counters overstate the charge;
    /// the headers do not. `None` if it counted too recently.
    #[cold]
    fn recount(&self, class: usize) -> Option<u32> {
        let now = std::time::Instant::now();
        {
            let mut at = self.quota.counted_at.lock().unwrap_or_else(|e| e.into_inner());
            if at[class].is_some_and(|t| now.duration_since(t) < RECOUNT_EVERY) {
                return None;
            }
            at[class] = Some(now);
        }
        let truth = self.view.charged_to(class, self.me);
        let slot = self.view.seg.stack_slot(self.me);
        let credited = slot.credited[class].load(Ordering::Relaxed);
        slot.charged[class].store(credited.wrapping_add(truth), Ordering::Relaxed);
        Some(truth)
    }

    /// Counts a refused allocation in this stack's slot (for the metrics).
    #[cold]
    fn note(&self, which: impl FnOnce(&crate::layout::StackSlot) -> &AtomicU64) {
        which(self.view.seg.stack_slot(self.me)).fetch_add(1, Ordering::Relaxed);
    }

    /// Charges `n` buffers of `class` to this stack.
    ///
    /// A plain load and store, not a locked add: only this stack writes
    /// the word, and its threads racing on it (several allocating at once)
    /// can lose an update, which the recount from the headers puts right.
    /// The locked adds cost a tenth of a 64-byte round trip.
    #[inline]
    fn charge(&self, class: usize, n: u32) {
        if n > 0 {
            let c = &self.view.seg.stack_slot(self.me).charged[class];
            c.store(c.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
        }
    }

    /// Takes the charge for a buffer of `class` whose header word was `w`
    /// off whoever carries it: this stack at once; another stack in
    /// batches of [`Quota::batch`] (an add on a line that stack reads is
    /// worth amortizing; it is a locked add, as several stacks give it
    /// credits). Plain loads and stores otherwise, as in `charge`: a lost
    /// update only overstates a charge, and the recount corrects that.
    #[inline]
    fn discharge(&self, class: usize, w: u64) {
        let Some(who) = bufword::charged_to(w) else {
            return;
        };
        let seg = &self.view.seg;
        if who == self.me {
            let c = &seg.stack_slot(who).charged[class];
            c.store(c.load(Ordering::Relaxed).wrapping_sub(1), Ordering::Relaxed);
            return;
        }
        let Some(owed) = self.quota.owed.get(who as usize) else {
            return; // out of range: a forged word; the recount settles it
        };
        let n = owed[class].load(Ordering::Relaxed) + 1;
        if n < self.quota.batch[class] {
            owed[class].store(n, Ordering::Relaxed);
            return;
        }
        owed[class].store(0, Ordering::Relaxed);
        if u32::from(who) <= seg.max_stacks() {
            seg.stack_slot(who).credited[class].fetch_add(n, Ordering::Relaxed);
        }
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

impl BufferPool for StackPool {
    #[cfg(any(test, feature = "test-support"))]
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
    fn pool_id(&self) -> u64 {
        self.view().segment().region().ident()
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

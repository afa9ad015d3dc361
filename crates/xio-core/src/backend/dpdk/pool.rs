//! The DPDK backend's buffer pool: a stack's private cache per class in
//! front of the class mempools, ownership in every object's header, the
//! intent/gate bracket and a lock around every mempool operation, and the
//! manager's reclamation.

use std::ffi::c_void;
use std::sync::atomic::Ordering;

#[cfg(any(test, feature = "test-support"))]
use dpdk_sys as sys;

use super::eal::{Eal, Role};
use super::error::DpdkError;
use super::mempool::{mempool_name, obj_state, Mempool, ObjHeader};
use crate::backend::error::Error;
use crate::backend::gate;
use crate::backend::traits::{AllocError, BufferPool, Busy, ClassUsage, RawBuf, Reclaimed, Reject};
use crate::layout::{kind, Descriptor};
use crate::segment::Segment;

/// The buffer pool of the DPDK backend: a mempool per class.
///
/// Like the shm pool, a stack keeps a small private cache per class, so
/// most allocations and frees touch no cache line another process writes
/// (DPDK's own per-lcore caches would be lost if the process died; ours
/// are marked in the object headers, `CACHED` with the stack as owner, so
/// the manager reclaims them like anything else the stack owned).
///
/// A process can die between taking objects from a mempool and stamping
/// them its own, or between stamping them free and putting them back: the
/// objects are then free in their headers but in no mempool. So, as in the
/// shm pool (see [`crate::backend::shm::pool`]), every mempool operation is bracketed by
/// the stack's *intent* and the class's *gate* in the segment, and the
/// manager's [`DpdkPool::reclaim`] closes the gates, waits until no live
/// stack is inside one, empties the mempools and puts back every object
/// free in its header, listed or not.
#[derive(Debug)]
pub struct DpdkPool {
    classes: Vec<Mempool>,
    /// Per class: cached objects, and how many the cache may hold.
    cache: Vec<(std::sync::Mutex<Vec<usize>>, usize)>,
    me: u16,
    /// A stack's control socket: while it is open the manager reclaims
    /// none of our buffers, so it lives as long as the last buffer.
    keepalive: Option<crate::fork::CloseOnFork>,
    /// The fork generation this pool belongs to: in a forked child it
    /// touches no mempool (see [`crate::fork`]).
    born: crate::fork::Birth,
    /// The segment whose intent and gate words bracket the mempool
    /// operations (see above); `None` for a pool without a manager, whose
    /// operations are not bracketed and whose reclamation finds nothing
    /// lost.
    gates: Option<Segment>,
}

/// Test hook: a mempool reached inside a mempool operation of a pool
/// ([`DpdkPool::__inside_op`]), so what a test does to its ring happens
/// where a real process's operations do: inside the intent/gate bracket
/// and under the class's lock (a test outside them modelled a state no
/// process can reach). Not for applications.
#[doc(hidden)]
#[cfg(any(test, feature = "test-support"))]
pub struct InsideOp<'a>(&'a Mempool);

#[cfg(any(test, feature = "test-support"))]
impl InsideOp<'_> {
    /// The mempool.
    pub fn mempool(&self) -> &Mempool {
        self.0
    }

    /// Reserves `n` objects for a get and stops there, as a process
    /// killed inside one would. False if fewer are free.
    pub fn half_get(&self, n: u32) -> bool {
        // SAFETY: a live mempool, under its lock; what it leaves is what
        // a process killed there would.
        unsafe { sys::xio_shim_mpring_half_dequeue(self.0.ring.as_ptr(), self.0.mask, n) == 0 }
    }

    /// Puts `addrs` into the mempool's ring as object pointers, whatever
    /// they point at: what a broken or hostile process of the prefix can
    /// put there.
    pub fn put_raw(&self, addrs: &[usize]) {
        let objs: Vec<*mut c_void> = addrs.iter().map(|&a| a as *mut c_void).collect();
        self.0.put_bulk(&objs);
    }
}

/// One step of waiting for a mempool lock another process holds (see
/// [`DpdkPool::mempool_op`]): `LOCK_YIELDS` yields, then sleeps of
/// 1 µs doubling up to [`LOCK_SLEEP_MAX`].
fn lock_wait(step: &mut u32) {
    *step = step.saturating_add(1);
    match lock_pause(*step) {
        None => std::thread::yield_now(),
        Some(d) => std::thread::sleep(d),
    }
}

/// Yields before a lock wait sleeps.
const LOCK_YIELDS: u32 = 64;
/// The longest sleep of a lock wait.
const LOCK_SLEEP_MAX: std::time::Duration = std::time::Duration::from_millis(1);

/// The pause of step `step` of a lock wait: `None` to yield.
fn lock_pause(step: u32) -> Option<std::time::Duration> {
    let past = step.checked_sub(LOCK_YIELDS)?;
    Some(std::time::Duration::from_micros(1 << past.min(10)).min(LOCK_SLEEP_MAX))
}

/// A held mempool lock (see [`DpdkPool::mempool_op`]), released when
/// dropped (also on unwind: a panic inside an operation must not leave
/// every process waiting for the lock).
struct MempoolLock<'a>(&'a crate::sync::AtomicU64);

impl Drop for MempoolLock<'_> {
    fn drop(&mut self) {
        // Release: the operation's ring writes happen before the next
        // holder's (its Acquire CAS in `DpdkPool::mempool_op`).
        self.0.store(0, Ordering::Release);
    }
}

/// A stack's pool: joins the prefix's DPDK process group as a secondary
/// (or uses the manager's EAL in its own process) and finds the class
/// mempools the manager made, with the sizes the segment records.
pub fn attach_pool(
    prefix: &str,
    seg: &Segment,
    me: u16,
    keepalive: std::os::fd::OwnedFd,
) -> Result<DpdkPool, Error> {
    let err = |e: DpdkError| Error::Attach(Box::new(e));
    Eal::init(prefix, Role::Secondary).map_err(err)?;
    let classes = seg
        .classes()
        .iter()
        .enumerate()
        .map(|(c, info)| Mempool::lookup(&mempool_name(c), info.buf_size as usize))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    let mut p = DpdkPool::with_segment(classes, me, seg.clone());
    p.keepalive = Some(crate::fork::CloseOnFork::new(keepalive));
    // Every stack's cache together holds at most half a class (a class of
    // few large buffers is not cached at all).
    let stacks = seg.max_stacks().max(1) as usize;
    for (c, mp) in p.classes.iter().enumerate() {
        p.cache[c].1 = (mp.len() / (2 * stacks)).min(CACHE_MAX);
    }
    Ok(p)
}

/// Most objects a stack caches per class.
const CACHE_MAX: usize = 32;

impl DpdkPool {
    /// The pools of the classes (created by the primary or looked up by a
    /// secondary), for stack `me` (0: the manager).
    pub fn new(classes: Vec<Mempool>, me: u16) -> DpdkPool {
        let cache = classes
            .iter()
            .map(|_| (std::sync::Mutex::new(Vec::new()), 0))
            .collect();
        DpdkPool {
            classes,
            cache,
            me,
            keepalive: None,
            born: crate::fork::Birth::now(),
            gates: None,
        }
    }

    /// As [`DpdkPool::new`], with the mempool operations bracketed by the
    /// intent and gate words of the pool's segment `seg` (what stacks and
    /// the manager use: see the type's docs).
    pub fn with_segment(classes: Vec<Mempool>, me: u16, seg: Segment) -> DpdkPool {
        let mut p = DpdkPool::new(classes, me);
        // Every operation runs under the mempool's lock or with the gates
        // closed (see `Mempool::exclusive`).
        for mp in &mut p.classes {
            mp.exclusive = true;
        }
        p.gates = Some(seg);
        p
    }

    /// Runs a mempool operation on class `c` (taking objects and stamping
    /// them ours, or stamping them free and putting them back) inside the
    /// intent/gate bracket. `None` while the manager holds the gate and
    /// `wait` is false, or when the manager died holding it.
    ///
    /// The operations of every process on one mempool run one at a time,
    /// under a lock word in the segment (the class's free-list head, which
    /// the DPDK backend does not use otherwise) holding the taker's id + 1.
    /// DPDK's multi-producer/consumer ring lets several run at once, each
    /// finishing only after those that started before it: one behind a
    /// process killed inside an operation waits for it for ever, inside
    /// its bracket, so the manager's sweep (the only thing that repairs the
    /// ring) waited for it in turn and put itself off for ever. With the
    /// lock the only operation a sweep can find half done is the dead
    /// holder's, which the ring repair finishes exactly. The lock is taken
    /// inside the bracket and waited for outside it: a stack waiting for
    /// a dead holder keeps no sweep waiting. The cost is one CAS and one
    /// store per mempool operation (a cache refill or spill, not every
    /// allocation), beside the CAS and stores DPDK's ring makes anyway.
    fn mempool_op<R>(&self, c: usize, wait: bool, op: impl FnOnce() -> R) -> Option<R> {
        let Some(seg) = &self.gates else {
            return Some(op());
        };
        let lock: &crate::sync::AtomicU64 = &seg.free_head(c).head;
        let mine = u64::from(self.me) + 1;
        let mut op = Some(op);
        let mut waited = 0u32;
        loop {
            let done = gate::global_op(seg, self.me, c, wait, || {
                // Acquire: pairs with the Release in `MempoolLock::drop`
                // (the last holder's ring writes) and in the sweep's reset.
                lock.compare_exchange(0, mine, Ordering::Acquire, Ordering::Relaxed)
                    .ok()?;
                let _held = MempoolLock(lock);
                Some(op.take().map(|op| op()))
            })?;
            if let Some(r) = done {
                return r;
            }
            // Held by another operation, or by a stack that died inside
            // one: the manager's sweep, which this wait does not hold up,
            // repairs the ring and frees the lock. An operation holds it
            // for a bulk get or put (microseconds): a few yields see it
            // free. A holder that is stopped (SIGSTOP, a debugger) or
            // descheduled holds it for as long as that lasts, and
            // yielding for ever burned a core per waiting thread: past
            // the yields the wait sleeps, doubling up to a millisecond.
            while lock.load(Ordering::Relaxed) != 0 {
                if (!wait && seg.free_head(c).gate.load(Ordering::Relaxed) != 0)
                    || crate::liveness::died(seg.manager_alive())
                {
                    return None;
                }
                lock_wait(&mut waited);
            }
        }
    }

    /// Test hook: runs `f` on class `c`'s mempool inside the bracket and
    /// under the lock a mempool operation of this pool runs in (so a test
    /// can stop a process there, or do to the ring what a process can).
    /// Not for applications.
    #[doc(hidden)]
    #[cfg(any(test, feature = "test-support"))]
    pub fn __inside_op<R>(&self, c: usize, f: impl FnOnce(&InsideOp<'_>) -> R) -> Option<R> {
        self.mempool_op(c, true, || f(&InsideOp(&self.classes[c])))
    }

    /// Whether class `c`'s gate is held closed by a manager that died.
    fn stranded(&self, c: usize) -> bool {
        self.gates
            .as_ref()
            .is_some_and(|seg| gate::stranded(seg, c))
    }

    /// The control socket kept open (see the field).
    pub fn keepalive(&self) -> Option<std::os::fd::BorrowedFd<'_>> {
        use std::os::fd::AsFd;
        self.keepalive.as_ref().map(|f| f.as_fd())
    }

    /// Allocates up to `out.len()` buffers of `len` bytes; how many, at
    /// least one: none is [`AllocError::Exhausted`], as with the shm pool
    /// (callers wait, or fail a non-blocking call, on that error).
    pub fn alloc_many(&self, len: usize, out: &mut [RawBuf]) -> Result<usize, AllocError> {
        let mut n = 0;
        for o in out.iter_mut() {
            match BufferPool::alloc(self, len, false) {
                Ok(b) => *o = b,
                Err(AllocError::Exhausted) => break,
                Err(e) => return Err(e),
            }
            n += 1;
        }
        if n == 0 {
            return Err(AllocError::Exhausted);
        }
        Ok(n)
    }

    /// Buffers per class: total, free, and held per owner (status).
    pub fn usage(&self) -> Vec<ClassUsage> {
        self.classes
            .iter()
            .map(|mp| {
                let mut by: std::collections::BTreeMap<u16, u32> = Default::default();
                for h in &mp.objs {
                    // SAFETY: objects live as long as the mempool.
                    let h = unsafe { h.as_ref() };
                    let (owner, state) = h.stamped(Ordering::Acquire);
                    if state != obj_state::FREE {
                        *by.entry(owner).or_default() += 1;
                    }
                }
                ClassUsage {
                    buf_size: mp.size as u32,
                    total: mp.len() as u32,
                    free: mp.avail(),
                    by_owner: by.into_iter().collect(),
                    // No quotas on this backend.
                    quota: mp.len() as u32,
                    by_charge: Vec::new(),
                }
            })
            .collect()
    }

    /// The class pools.
    pub fn classes(&self) -> &[Mempool] {
        &self.classes
    }

    /// Returns to the pools every buffer the `dead` stacks owned (held,
    /// allocated, cached or in flight to them), and every buffer a dead
    /// stack stamped in flight to a receiver that no longer reads from it
    /// (not among `readers`, the `(dead, reader)` pairs whose channel the
    /// reader has not released): such a buffer is in no ring the reader
    /// will look at again, stamped but never pushed. What the manager does
    /// when stacks die.
    ///
    /// With a segment ([`DpdkPool::with_segment`]), also every object free
    /// in its header but in no mempool (a stack died inside a mempool
    /// operation): as [`crate::backend::shm::ManagerPool::reclaim`] does, it
    /// closes the gates and waits at most `patience` for the `live`
    /// stacks to leave their mempool operations (`gone(id)`: whether one
    /// found inside has in fact exited), empties the mempools and puts
    /// back every object that is free, listed or not. A live stack that
    /// stays inside is `Err(Busy)`, nothing changed: try again later.
    pub fn reclaim(
        &self,
        dead: &[u16],
        live: &[u16],
        readers: &[(u16, u16)],
        patience: std::time::Duration,
        gone: impl FnMut(u16) -> bool,
    ) -> Result<Reclaimed, Busy> {
        let Some(seg) = &self.gates else {
            return Ok(Reclaimed {
                owned: self.reclaim_owned(dead, readers),
                lost: 0,
            });
        };
        gate::close_gates(seg, live, patience, gone)?;
        let mut r = Reclaimed::default();
        for mp in &self.classes {
            // What a stack may have overwritten in the mempool's and
            // ring's headers (this process uses its own copies; stacks
            // attaching later check them).
            mp.restore_ring();
            // Frozen: no live stack is inside a mempool operation, so a
            // get or put half done in the ring is a dead stack's, and
            // would make the gets below wait for ever.
            if mp.repair_ring() {
                tracing::warn!(
                    mempool = mp.size,
                    "a stack died inside a mempool operation: its ring repaired"
                );
            }
            // And emptying the mempool shows what it lists. A pointer that is
            // none of our objects (a corrupt mempool) is dropped, not
            // dereferenced.
            let at: std::collections::HashMap<usize, usize> = mp
                .objs
                .iter()
                .enumerate()
                .map(|(i, h)| (h.as_ptr() as usize, i))
                .collect();
            let mut listed = vec![false; mp.len()];
            while let Some(o) = mp.get_raw() {
                if let Some(&i) = at.get(&(o as usize)) {
                    listed[i] = true;
                }
            }
            let mut back = Vec::new();
            let mut reindexed = 0u32;
            for (i, h) in mp.objs.iter().enumerate() {
                // SAFETY: objects live as long as the mempool.
                let h = unsafe { h.as_ref() };
                // An index overwritten since the mempool was made (this
                // table was built then, from the indices DPDK numbered):
                // written back, or every later lookup of the mempool
                // refuses it as corrupt.
                if h.index.load(Ordering::Relaxed) != i as u32 {
                    h.index.store(i as u32, Ordering::Relaxed);
                    reindexed += 1;
                }
                let (owner, state) = h.stamped(Ordering::Acquire);
                let from = h.from.load(Ordering::Relaxed);
                if state == obj_state::FREE {
                    if !listed[i] {
                        r.lost += 1;
                    }
                } else if !live.contains(&owner)
                    || (state == obj_state::IN_FLIGHT
                        && dead.contains(&from)
                        && !readers.contains(&(from, owner)))
                {
                    r.owned += 1;
                } else {
                    // A live stack's (listed too if the mempool is
                    // corrupt: it stays out, with its owner).
                    continue;
                }
                h.stamp(0, obj_state::FREE, Ordering::Release);
                back.push((h as *const ObjHeader).cast_mut().cast::<c_void>());
            }
            mp.put_bulk(&back);
            if reindexed > 0 {
                tracing::warn!(
                    mempool = mp.size,
                    objects = reindexed,
                    "object headers named the wrong index: written back"
                );
            }
        }
        for &d in dead {
            // A dead stack's count stays as its threads left it.
            seg.stack_slot(d).intent.store(0, Ordering::SeqCst);
        }
        for c in 0..self.classes.len() {
            // No live stack is inside an operation (the gates are closed
            // and their counts read zero), so a lock still held is a dead
            // or exited stack's, whose operation the ring repair above
            // finished. Release: the repairs happen before the next holder
            // (its Acquire CAS).
            seg.free_head(c).head.store(0, Ordering::Release);
        }
        gate::open_gates(seg);
        Ok(r)
    }

    /// [`DpdkPool::reclaim`] for a pool without a segment: by owner only.
    fn reclaim_owned(&self, dead: &[u16], readers: &[(u16, u16)]) -> u32 {
        let mut n = 0;
        for mp in &self.classes {
            for h in &mp.objs {
                // SAFETY: objects live as long as the mempool.
                let h = unsafe { h.as_ref() };
                let (owner, state) = h.stamped(Ordering::Acquire);
                if state == obj_state::FREE {
                    continue;
                }
                let from = h.from.load(Ordering::Relaxed);
                if dead.contains(&owner)
                    || (state == obj_state::IN_FLIGHT
                        && dead.contains(&from)
                        && !readers.contains(&(from, owner)))
                {
                    h.stamp(0, obj_state::FREE, Ordering::Release);
                    mp.put(h);
                    n += 1;
                }
            }
        }
        n
    }

    /// Buffers stamped in flight to stack `id` and not received yet.
    #[cfg(any(test, feature = "test-support"))]
    pub fn in_flight_to(&self, id: u16) -> usize {
        self.classes
            .iter()
            .flat_map(|mp| &mp.objs)
            .filter(|h| {
                // SAFETY: objects live as long as the mempool.
                let h = unsafe { h.as_ref() };
                h.stamped(Ordering::Acquire) == (id, obj_state::IN_FLIGHT)
            })
            .count()
    }

    /// An object of class `c` and its index, stamped `CACHED` for us: from
    /// the private cache, refilled from the mempool in one bulk get when
    /// empty. `Err` when the class's gate is closed and `wait` is false,
    /// or the manager died holding it (see [`DpdkPool::mempool_op`]). A
    /// pointer the mempool hands out that is none of its objects
    /// ([`Mempool::index_of`]) is dropped, and the refill goes on.
    fn take<'a>(
        &'a self,
        c: usize,
        mp: &'a Mempool,
        wait: bool,
    ) -> Result<Option<(u32, &'a ObjHeader)>, ()> {
        let claim = |o: *mut c_void| {
            let i = mp.index_of(o)?;
            let h = mp.header(i)?;
            // Every object the mempool lists is free in its header: each
            // put stamps it free first, under the lock this runs under
            // too. One that is not was listed twice (the ring is shared
            // memory: a broken or hostile process put it again) and is
            // someone's, maybe ours from earlier in this refill: handed
            // out, two holders would share it. Dropped, as a bogus
            // pointer is.
            if h.stamped(Ordering::Relaxed) != (0, obj_state::FREE) {
                tracing::warn!(
                    mempool = mp.size,
                    object = i,
                    "the mempool listed an object that is not free: dropped"
                );
                return None;
            }
            h.stamp(self.me, obj_state::CACHED, Ordering::Release);
            Some((i, h))
        };
        let (cache, limit) = &self.cache[c];
        if *limit == 0 {
            // Past objects left unclaimed, to the first good one.
            return self
                .mempool_op(c, wait, || loop {
                    if let Some(got) = claim(mp.get_raw()?) {
                        return Some(got);
                    }
                })
                .ok_or(());
        }
        let mut cached = cache.lock().unwrap_or_else(|e| e.into_inner());
        if cached.is_empty() {
            let want = (limit / 2).clamp(1, CACHE_MAX);
            self.mempool_op(c, wait, || {
                let mut objs = [std::ptr::null_mut(); CACHE_MAX];
                // Until something is cached or the mempool is empty (every
                // object of a refill may have been left unclaimed).
                while cached.is_empty() {
                    // All or nothing: with fewer left, take one.
                    let n = if mp.get_bulk(&mut objs[..want]) {
                        want
                    } else if let Some(o) = mp.get_raw() {
                        objs[0] = o;
                        1
                    } else {
                        break;
                    };
                    for &o in &objs[..n] {
                        if let Some((i, _)) = claim(o) {
                            cached.push(i as usize);
                        }
                    }
                }
            })
            .ok_or(())?;
        }
        Ok(cached
            .pop()
            .and_then(|i| Some((i as u32, mp.header(i as u32)?))))
    }

    /// Marks cached object `i` of `mp` free, for a put: `None` if it is
    /// not in our cache any more (the manager dropped this stack and took
    /// it back), when putting it would list it in the mempool twice.
    fn uncache(&self, mp: &Mempool, i: usize) -> Option<*mut c_void> {
        let h = mp.header(i as u32)?;
        if h.stamped(Ordering::Relaxed) != (self.me, obj_state::CACHED) {
            return None;
        }
        h.stamp(0, obj_state::FREE, Ordering::Release);
        Some((h as *const ObjHeader).cast_mut().cast::<c_void>())
    }

    fn obj(&self, b: RawBuf) -> (&Mempool, &ObjHeader) {
        let mp = &self.classes[b.class as usize];
        (mp, mp.header(b.index).expect("a RawBuf we made"))
    }
}

impl Drop for DpdkPool {
    /// A stack leaving cleanly gives its cache back (a dead one's is
    /// reclaimed by the manager from the headers).
    fn drop(&mut self) {
        if self.born.forked() {
            return; // the parent's cache, copied by fork()
        }
        for (c, mp) in self.classes.iter().enumerate() {
            let cached =
                std::mem::take(&mut *self.cache[c].0.lock().unwrap_or_else(|e| e.into_inner()));
            if cached.is_empty() {
                continue;
            }
            // `None`: the manager died holding the gate; the objects stay
            // stamped ours, for nobody.
            let _ = self.mempool_op(c, true, || {
                let objs: Vec<*mut c_void> = cached
                    .into_iter()
                    .filter_map(|i| self.uncache(mp, i))
                    .collect();
                mp.put_bulk(&objs);
            });
        }
    }
}

impl BufferPool for DpdkPool {
    #[cfg(any(test, feature = "test-support"))]
    fn stack_id(&self) -> u16 {
        self.me
    }

    fn alloc(&self, len: usize, wait: bool) -> Result<RawBuf, AllocError> {
        if self.born.forked() {
            return Err(AllocError::Forked);
        }
        // The smallest class that holds `len`, and only that one, as in
        // the shm pool: when it is empty the caller chooses (the socket
        // layer tries smaller classes, and larger ones only as a
        // connection's window allows: a buffer's whole capacity counts).
        let (c, mp) = self
            .classes
            .iter()
            .enumerate()
            .find(|(_, mp)| mp.size >= len)
            .ok_or(AllocError::TooLarge(len))?;
        match self.take(c, mp, wait) {
            Ok(Some((index, h))) => {
                h.gen.fetch_add(1, Ordering::Relaxed);
                h.stamp(self.me, obj_state::ALLOCATED, Ordering::Release);
                Ok(RawBuf {
                    class: c as u8,
                    index,
                })
            }
            Ok(None) => Err(AllocError::Exhausted),
            // As in the shm pool: a gate a dead manager left closed is no
            // passing shortage.
            Err(()) if self.stranded(c) => Err(AllocError::ManagerGone),
            Err(()) => Err(AllocError::Exhausted),
        }
    }

    fn free(&self, b: RawBuf) {
        if self.born.forked() {
            return; // the parent's buffer: forgotten here
        }
        let (mp, h) = self.obj(b);
        if h.stamped(Ordering::Relaxed).0 != self.me {
            // Reclaimed by the manager (it dropped this stack); not ours
            // to give back, as in the shm pool.
            return;
        }
        let class = b.class as usize;
        let (cache, limit) = &self.cache[class];
        if *limit > 0 {
            let mut c = cache.lock().unwrap_or_else(|e| e.into_inner());
            if c.len() >= *limit {
                // Full: give half back in one bulk put (`None`: the
                // manager died holding the gate; the cache grows instead).
                let _ = self.mempool_op(class, true, || {
                    let back: Vec<*mut c_void> = c
                        .drain(limit / 2..)
                        .filter_map(|i| self.uncache(mp, i))
                        .collect();
                    mp.put_bulk(&back);
                });
            }
            h.stamp(self.me, obj_state::CACHED, Ordering::Release);
            c.push(b.index as usize);
            return;
        }
        // `None`: the manager died holding the gate; the buffer stays
        // stamped ours, for nobody.
        let _ = self.mempool_op(class, true, || {
            h.stamp(0, obj_state::FREE, Ordering::Release);
            mp.put(h);
        });
    }

    fn data(&self, b: RawBuf) -> (*mut u8, usize) {
        let (mp, h) = self.obj(b);
        (mp.data(h), mp.size)
    }

    fn prepare_send(&self, b: RawBuf, len: u32, to: u16, conn: u32, k: u8) -> Descriptor {
        let (_, h) = self.obj(b);
        h.from.store(self.me, Ordering::Relaxed);
        // One store of owner and state (see `ObjHeader::word`). Release:
        // the manager that sees IN_FLIGHT sees `from`.
        h.stamp(to, obj_state::IN_FLIGHT, Ordering::Release);
        Descriptor {
            index: b.index,
            len,
            conn,
            class: b.class,
            kind: k,
            gen: h.gen.load(Ordering::Relaxed) as u16,
        }
    }

    /// `_from` is not checked: a DPDK object's header does not name the
    /// stack that sent it.
    fn accept(&self, _from: u16, d: &Descriptor) -> Result<RawBuf, Reject> {
        let mp = self
            .classes
            .get(d.class as usize)
            .ok_or(Reject::Class(d.class))?;
        let h = mp.header(d.index).ok_or(Reject::Index(d.index))?;
        if d.len as usize > mp.size {
            return Err(Reject::Length(d.len));
        }
        if !kind::carries_buffer(d.kind) {
            return Err(Reject::Kind(d.kind));
        }
        let (owner, state) = h.stamped(Ordering::Acquire);
        let gen = h.gen.load(Ordering::Relaxed) as u16;
        if owner != self.me || state != obj_state::IN_FLIGHT || gen != d.gen {
            return Err(Reject::Ownership(
                (u64::from(owner) << 32) | (u64::from(state) << 16) | u64::from(gen),
            ));
        }
        h.stamp(self.me, obj_state::HELD, Ordering::Release);
        Ok(RawBuf {
            class: d.class,
            index: d.index,
        })
    }

    fn reuse(&self, b: RawBuf) {
        if self.born.forked() {
            return;
        }
        let (_, h) = self.obj(b);
        // A new generation, as an allocation makes (and the shm pool's
        // `reuse`): a stale or replayed descriptor of the buffer's last
        // trip must not match its next one.
        h.gen.fetch_add(1, Ordering::Relaxed);
        // The owner as it is: this changes the state alone, as before.
        let (owner, _) = h.stamped(Ordering::Relaxed);
        h.stamp(owner, obj_state::ALLOCATED, Ordering::Release);
    }

    fn pool_id(&self) -> u64 {
        // The segment's identity, as for the shm pool: the same for every
        // stack of the pool in this process, and distinct from every other
        // segment's. Not a mempool's address: DPDK's memory starts at
        // 4 GiB, where memfd identities (`1 << 32 ^ inode`) lie too, and
        // an shm pool whose inode met it passed for this one.
        match &self.gates {
            Some(seg) => seg.region().ident(),
            // No segment (a pool without a manager): the first mempool,
            // one object at the same address for every pool of the prefix.
            None => self.classes.first().map_or(0, |m| m.mp.as_ptr() as u64),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A lock wait yields first, then sleeps from 1 µs, doubling, and
    /// never longer than a millisecond however long it waits.
    #[test]
    fn a_lock_wait_yields_then_backs_off_to_a_millisecond() {
        assert_eq!(lock_pause(1), None);
        assert_eq!(lock_pause(LOCK_YIELDS - 1), None);
        let us = |s| lock_pause(s).map(|d: std::time::Duration| d.as_micros());
        assert_eq!(us(LOCK_YIELDS), Some(1));
        assert_eq!(us(LOCK_YIELDS + 1), Some(2));
        assert_eq!(us(LOCK_YIELDS + 9), Some(512));
        assert_eq!(us(LOCK_YIELDS + 10), Some(1000));
        assert_eq!(us(u32::MAX), Some(1000));
    }
}

//! Which backend a pool uses ([`Backend`]), and the one place that knows
//! which backends this build has: the stack's pool (`AnyPool`), the
//! manager's (`AnyManagerPool`), and what the manager holds of its backend
//! beside its pool (`ManagerBackend`). Nothing else matches on the `dpdk`
//! feature: the stack and the manager call these, whatever the build.

use std::os::fd::{BorrowedFd, OwnedFd};
use std::sync::Arc;
use std::time::Duration;

#[cfg(feature = "dpdk")]
use super::dpdk;
use super::error::Error;
use super::shm::{ManagerPool, PoolView, StackPool};
use super::traits::{
    AllocError, BufferPool, Busy, ClassUsage, DescConsumer, DescProducer, RawBuf, Reclaimed, Reject,
};
use crate::layout::{Descriptor, Geometry, PoolConfig};
use crate::segment::{Region, Segment};

/// Where a pool keeps its buffers and rings.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Backend {
    /// A sealed memfd segment (the default: no root, no hugepages).
    #[default]
    Shm,
    /// DPDK mempools and rings in hugepage memory: the manager is the DPDK
    /// primary of the prefix, stacks are secondaries (needs the `dpdk`
    /// feature, hugepages and, in practice, root).
    Dpdk,
}

impl std::str::FromStr for Backend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "shm" => Ok(Backend::Shm),
            "dpdk" => Ok(Backend::Dpdk),
            _ => Err(format!("unknown backend {s:?} (shm or dpdk)")),
        }
    }
}

/// The stack's buffer pool: the shm backend's, or DPDK's mempools. An
/// enum rather than a trait object, so the shm fast path stays inlined
/// (and without the `dpdk` feature the match has one arm).
#[derive(Clone, Debug)]
pub(crate) enum AnyPool {
    Shm(Arc<StackPool>),
    #[cfg(feature = "dpdk")]
    Dpdk(Arc<dpdk::DpdkPool>),
}

impl AnyPool {
    /// The pool of stack `me` in the backend `seg` records (a stack
    /// attaching to the pool of `prefix`), keeping `ctrl` (the stack's
    /// manager connection) open as long as it or a buffer from it lives.
    /// A backend this build lacks is [`Error::Unsupported`].
    pub(crate) fn attach(
        prefix: &str,
        seg: &Segment,
        me: u16,
        ctrl: OwnedFd,
    ) -> Result<AnyPool, Error> {
        Ok(match seg.backend() {
            crate::layout::backend::SHM => AnyPool::Shm(Arc::new(StackPool::with_keepalive(
                PoolView::new(seg.clone()),
                me,
                ctrl,
            ))),
            #[cfg(feature = "dpdk")]
            crate::layout::backend::DPDK => {
                AnyPool::Dpdk(Arc::new(dpdk::attach_pool(prefix, seg, me, ctrl)?))
            }
            _ => {
                return Err(Error::Unsupported {
                    prefix: prefix.to_owned(),
                })
            }
        })
    }

    /// What buffers point back to.
    #[inline]
    pub(crate) fn shared(&self) -> Arc<dyn BufferPool> {
        match self {
            AnyPool::Shm(p) => p.clone(),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => p.clone(),
        }
    }

    #[inline]
    pub(crate) fn accept(&self, from: u16, d: &Descriptor) -> Result<RawBuf, Reject> {
        match self {
            AnyPool::Shm(p) => BufferPool::accept(&**p, from, d),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => BufferPool::accept(&**p, from, d),
        }
    }

    /// The address of the pool object (what a `BufMut` of ours holds).
    #[inline]
    pub(crate) fn addr(&self) -> *const () {
        match self {
            AnyPool::Shm(p) => Arc::as_ptr(p).cast(),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => Arc::as_ptr(p).cast(),
        }
    }

    /// The pool's identity (see [`BufferPool::pool_id`]).
    #[inline]
    pub(crate) fn pool_id(&self) -> u64 {
        match self {
            AnyPool::Shm(p) => p.pool_id(),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => p.pool_id(),
        }
    }

    /// The shm pool's view, for what only it has (prefetching headers and
    /// payloads: a DPDK buffer's header is DPDK's).
    #[inline]
    pub(crate) fn shm_view(&self) -> Option<&PoolView> {
        match self {
            AnyPool::Shm(p) => Some(p.view()),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(_) => None,
        }
    }

    #[inline]
    pub(crate) fn data(&self, b: RawBuf) -> (*mut u8, usize) {
        match self {
            AnyPool::Shm(p) => BufferPool::data(&**p, b),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => BufferPool::data(&**p, b),
        }
    }

    #[inline]
    pub(crate) fn prepare_send(
        &self,
        b: RawBuf,
        len: u32,
        to: u16,
        conn: u32,
        k: u8,
    ) -> Descriptor {
        match self {
            AnyPool::Shm(p) => BufferPool::prepare_send(&**p, b, len, to, conn, k),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => BufferPool::prepare_send(&**p, b, len, to, conn, k),
        }
    }

    #[inline]
    pub(crate) fn alloc(&self, len: usize, wait: bool) -> Result<RawBuf, AllocError> {
        match self {
            AnyPool::Shm(p) => BufferPool::alloc(&**p, len, wait),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => BufferPool::alloc(&**p, len, wait),
        }
    }

    #[inline]
    pub(crate) fn alloc_many(&self, len: usize, out: &mut [RawBuf]) -> Result<usize, AllocError> {
        match self {
            AnyPool::Shm(p) => p.alloc_many(len, out),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => p.alloc_many(len, out),
        }
    }

    /// Buffers in size class `class` (a DPDK segment's class table
    /// records one per class; the mempool knows).
    #[inline]
    pub(crate) fn class_count(&self, seg: &Segment, class: usize) -> usize {
        match self {
            AnyPool::Shm(_) => seg.classes().get(class).map_or(0, |c| c.count as usize),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => p.classes().get(class).map_or(0, |m| m.len()),
        }
    }

    /// The most buffers of `class` this stack may hold at once: the
    /// class's quota (shm), or its whole count (DPDK, which has no quotas).
    pub(crate) fn class_quota(&self, class: usize) -> usize {
        match self {
            AnyPool::Shm(p) => p.quota(class) as usize,
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => p.classes().get(class).map_or(0, |m| m.len()),
        }
    }

    /// The control socket, which the pool keeps open as long as a buffer
    /// lives (the manager reclaims nothing before).
    pub(crate) fn keepalive(&self) -> Option<BorrowedFd<'_>> {
        match self {
            AnyPool::Shm(p) => p.keepalive(),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => p.keepalive(),
        }
    }

    #[inline]
    pub(crate) fn free_many(&self, bufs: &[RawBuf]) {
        match self {
            AnyPool::Shm(p) => p.free_many(bufs),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => bufs.iter().for_each(|&b| p.free(b)),
        }
    }

    /// A stack's ends of `channel`'s rings in this pool's backend: it
    /// produces into ring `dir` and consumes the other (the manager gives
    /// each ring one producer and one consumer). The shm rings are in
    /// `seg`; DPDK's are found by name, and one that is not found or fails
    /// its checks is [`Error::Channel`].
    #[allow(clippy::type_complexity)]
    pub(crate) fn channel_ends(
        &self,
        seg: &Segment,
        channel: u32,
        dir: u8,
    ) -> Result<(Box<dyn DescProducer>, Box<dyn DescConsumer>), Error> {
        match self {
            AnyPool::Shm(_) => {
                let (tx, rx) = super::shm::ring::channel_ends(seg, channel, dir as usize);
                Ok((Box::new(tx), Box::new(rx)))
            }
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(_) => {
                let (tx, rx) = dpdk::channel_ends(channel, dir as usize)
                    .map_err(|e| Error::Channel(Box::new(e)))?;
                Ok((Box::new(tx), Box::new(rx)))
            }
        }
    }

    /// Whether the pool's rings are in the segment (the shm backend's;
    /// DPDK's are not).
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn rings_in_segment(&self) -> bool {
        matches!(self, AnyPool::Shm(_))
    }

    /// Buffers of the pool stamped in flight to stack `id` and not
    /// received yet (in a ring, or stamped and never pushed).
    #[cfg(any(test, feature = "test-support"))]
    pub(crate) fn in_flight_to(&self, id: u16) -> usize {
        match self {
            AnyPool::Shm(p) => p.view().in_flight_to(id),
            #[cfg(feature = "dpdk")]
            AnyPool::Dpdk(p) => p.in_flight_to(id),
        }
    }
}

/// The manager's side of the pool, per backend.
#[derive(Clone, Debug)]
pub(crate) enum AnyManagerPool {
    Shm(Arc<ManagerPool>),
    #[cfg(feature = "dpdk")]
    Dpdk(Arc<dpdk::DpdkPool>),
}

impl AnyManagerPool {
    pub(crate) fn usage(&self) -> Vec<ClassUsage> {
        match self {
            AnyManagerPool::Shm(p) => p.usage(),
            #[cfg(feature = "dpdk")]
            AnyManagerPool::Dpdk(p) => p.usage(),
        }
    }

    /// See [`ManagerPool::reclaim`]: `Err` when a live stack stayed
    /// inside a free-list operation longer than `patience`.
    pub(crate) fn reclaim(
        &self,
        dead: &[u16],
        live: &[u16],
        readers: &[(u16, u16)],
        patience: Duration,
        gone: impl FnMut(u16) -> bool,
    ) -> Result<Reclaimed, Busy> {
        match self {
            AnyManagerPool::Shm(p) => p.reclaim(dead, live, readers, patience, gone),
            #[cfg(feature = "dpdk")]
            AnyManagerPool::Dpdk(p) => p.reclaim(dead, live, readers, patience, gone),
        }
    }
}

/// What a manager holds of its backend beside its pool, for as long as it
/// lives: nothing for shm (the segment holds everything), the DPDK
/// primary's rings and hugepage files for DPDK.
pub(crate) enum ManagerBackend {
    Shm,
    #[cfg(feature = "dpdk")]
    Dpdk(dpdk::Primary),
}

impl ManagerBackend {
    /// Creates the pool of `backend` for the manager of `prefix`, of
    /// configuration `cfg` and geometry `geo`: its segment, the manager's
    /// side of the pool, and what else the backend holds. A backend this
    /// build lacks is [`Error::NotBuilt`].
    pub(crate) fn start(
        backend: Backend,
        prefix: &str,
        cfg: &PoolConfig,
        geo: &Geometry,
    ) -> Result<(Segment, AnyManagerPool, ManagerBackend), Error> {
        match backend {
            Backend::Shm => {
                let region =
                    Region::create_memfd(&format!("xio-{prefix}"), geo.total_len as usize)?;
                let seg = Segment::init(region, cfg, geo)?;
                let pool = AnyManagerPool::Shm(Arc::new(ManagerPool::init(seg.clone())));
                Ok((seg, pool, ManagerBackend::Shm))
            }
            #[cfg(feature = "dpdk")]
            Backend::Dpdk => {
                let (seg, pool, primary) = dpdk::Primary::start(prefix, cfg)?;
                let pool = AnyManagerPool::Dpdk(Arc::new(pool));
                Ok((seg, pool, ManagerBackend::Dpdk(primary)))
            }
            #[cfg(not(feature = "dpdk"))]
            Backend::Dpdk => Err(Error::NotBuilt),
        }
    }

    /// Empties both rings of channel slot `ch`: the segment's, and (DPDK)
    /// the slot's `rte_ring`s, whose stale descriptors go (their buffers
    /// were reclaimed by owner).
    ///
    /// # Safety
    ///
    /// No stack may use the slot's rings meanwhile: the slot is free, and
    /// nobody gets its channel before the manager marks it active.
    pub(crate) unsafe fn reset_channel(&self, seg: &Segment, ch: u32) {
        seg.reset_channel_rings(ch);
        match self {
            ManagerBackend::Shm => {}
            #[cfg(feature = "dpdk")]
            ManagerBackend::Dpdk(p) => {
                // SAFETY: nobody uses the slot's rings (the caller's
                // contract).
                unsafe { p.reset_rings(ch) }
            }
        }
    }

    /// What the backend lets go of when the manager stops (DPDK: the
    /// prefix's hugepage files; what it holds otherwise goes with it).
    pub(crate) fn stop(&mut self) {
        match self {
            ManagerBackend::Shm => {}
            #[cfg(feature = "dpdk")]
            ManagerBackend::Dpdk(p) => p.release_hugepages(),
        }
    }
}

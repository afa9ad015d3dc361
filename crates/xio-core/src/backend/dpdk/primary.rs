//! The manager's side of the DPDK backend: it joins DPDK as the primary
//! of the prefix, creates the class mempools and both rings of every
//! channel slot, and removes the prefix's hugepage files when it is done.

use super::eal::{Eal, Role};
use super::error::DpdkError;
use super::mempool::{mempool_name, Mempool};
use super::pool::DpdkPool;
use super::ring::{ring_name, Ring};
use crate::backend::error::Error;
use crate::layout::PoolConfig;
use crate::segment::{Region, Segment, SegmentError};

/// The DPDK primary's hugepage files of a prefix (DPDK keeps them for
/// secondaries, and clears them only when a primary of the same prefix
/// starts again): removed when the manager stops
/// ([`Manager::run`](crate::manager::Manager::run) returns), is dropped
/// without running, or fails to start once DPDK made them, so the pages
/// are not left taken, by nobody, after the process exits. Processes that
/// still map them keep their memory until they exit. Not in a forked child
/// (the files are the parent's).
struct HugepageFiles {
    prefix: String,
    born: crate::fork::Birth,
}

impl Drop for HugepageFiles {
    fn drop(&mut self) {
        if !self.born.forked() {
            Eal::remove_hugepage_files(&self.prefix);
        }
    }
}

/// What a manager of the DPDK backend holds beside its pool, until it is
/// dropped.
pub(crate) struct Primary {
    /// Both rings of every channel slot, made at start.
    rings: Vec<[Ring; 2]>,
    /// The prefix's hugepage files, removed when the manager stops or is
    /// dropped without running.
    hugepages: Option<HugepageFiles>,
}

impl Primary {
    /// The DPDK backend's objects: joins DPDK as the primary of the
    /// prefix, creates a mempool per class and both rings of every channel
    /// slot, and a segment for the stack slots and channel states whose
    /// class table gives the sizes (one shm buffer per class, unused);
    /// and the guard of the prefix's hugepage files.
    pub(crate) fn start(
        prefix: &str,
        pool: &PoolConfig,
    ) -> Result<(Segment, DpdkPool, Primary), Error> {
        let dpdk = |e: DpdkError| Error::Start(Box::new(e));
        Eal::init(prefix, Role::Primary).map_err(dpdk)?;
        // The prefix's hugepages are ours now: failing past here (the
        // pool larger than the hugepages left, more rings than DPDK's
        // memzone limit, anything later in `bind`) or dropped without
        // running, the guard removes their files.
        let files = HugepageFiles {
            prefix: prefix.to_owned(),
            born: crate::fork::Birth::now(),
        };
        let (seg, pool, rings) = objects(prefix, pool)?;
        Ok((
            seg,
            pool,
            Primary {
                rings,
                hugepages: Some(files),
            },
        ))
    }

    /// Empties both rings of channel slot `ch` (a slot being reused):
    /// stale descriptors of the slot's last channel go.
    ///
    /// # Safety
    ///
    /// No process may use the slot's rings meanwhile (see [`Ring::reset`]).
    pub(crate) unsafe fn reset_rings(&self, ch: u32) {
        if let Some(r) = self.rings.get(ch as usize) {
            // SAFETY: nobody uses the slot's rings (the caller's contract).
            unsafe {
                r[0].reset();
                r[1].reset();
            }
        }
    }

    /// Removes the prefix's hugepage files now (the manager has stopped).
    pub(crate) fn release_hugepages(&mut self) {
        drop(self.hugepages.take());
    }
}

/// What [`Primary::start`] makes once this process is the primary.
fn objects(prefix: &str, pool: &PoolConfig) -> Result<(Segment, DpdkPool, Vec<[Ring; 2]>), Error> {
    let dpdk = |e: DpdkError| Error::Start(Box::new(e));
    let mut shadow = pool.clone();
    for c in &mut shadow.classes {
        c.1 = 1;
    }
    let geo = shadow.geometry().map_err(SegmentError::from)?;
    let region = Region::create_memfd(&format!("xio-{prefix}"), geo.total_len as usize)?;
    let seg = Segment::init_for(region, &shadow, &geo, crate::layout::backend::DPDK)?;
    let classes = pool
        .classes
        .iter()
        .enumerate()
        .map(|(c, &(size, n))| Mempool::create(&mempool_name(c), c as u8, n, size as usize))
        .collect::<Result<Vec<_>, _>>()
        .map_err(dpdk)?;
    let rings = (0..pool.max_channels)
        .map(|ch| {
            Ok([
                Ring::create(&ring_name(ch, 0), pool.ring_capacity)?,
                Ring::create(&ring_name(ch, 1), pool.ring_capacity)?,
            ])
        })
        .collect::<Result<Vec<_>, DpdkError>>()
        .map_err(dpdk)?;
    tracing::info!(prefix = %prefix, "dpdk backend: primary, mempools and rings created");
    let pool = DpdkPool::with_segment(classes, 0, seg.clone());
    Ok((seg, pool, rings))
}

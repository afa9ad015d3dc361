//! DPDK's errors, with what to do about them, and the small helpers that
//! make them (`rte_strerror`, object names).

use std::ffi::{CStr, CString};

use dpdk_sys as sys;

/// What can go wrong with DPDK, with what to do about it.
#[derive(Clone, Debug, thiserror::Error)]
pub enum DpdkError {
    /// No hugepages reserved, or none free, or hugetlbfs not mounted.
    #[error("{0}")]
    Hugepages(String),
    /// `rte_eal_init` failed.
    #[error("DPDK EAL init failed for prefix {prefix:?} as {role}: {reason}{hint}")]
    Eal {
        /// The file prefix.
        prefix: String,
        /// primary or secondary.
        role: &'static str,
        /// `rte_strerror`.
        reason: String,
        /// What to check.
        hint: String,
    },
    /// The EAL of this process was already initialised differently (one
    /// prefix and role per process: a DPDK limit).
    #[error("this process already runs DPDK as {role} of prefix {prefix:?}; it cannot also be {wanted_role} of {wanted:?}")]
    AlreadyInit {
        /// The prefix in use.
        prefix: String,
        /// Its role.
        role: &'static str,
        /// The prefix asked for.
        wanted: String,
        /// The role asked for.
        wanted_role: &'static str,
    },
    /// A named object was not found (wrong prefix, or no manager created it).
    #[error("no DPDK {what} named {name:?} in this prefix (is the manager running with the dpdk backend and this prefix?)")]
    NotFound {
        /// mempool or ring.
        what: &'static str,
        /// Its name.
        name: String,
    },
    /// Creating an object failed.
    #[error("creating DPDK {what} {name:?} failed: {reason}")]
    Create {
        /// mempool or ring.
        what: &'static str,
        /// Its name.
        name: String,
        /// `rte_strerror`.
        reason: String,
    },
    /// A name was too long or held a NUL.
    #[error("bad DPDK object name {0:?}")]
    Name(String),
    /// The object headers of a mempool do not number its objects `0..n`
    /// (overwritten: they live in memory every process of the prefix can
    /// write), or its objects are smaller than the pool's class says.
    #[error("DPDK mempool {0:?} is corrupt: its objects do not match its buffer class")]
    Corrupt(String),
    /// A ring's size, mask and capacity do not agree, or it lies outside
    /// the prefix's memory (overwritten, as [`DpdkError::Corrupt`]).
    #[error("DPDK ring {0:?} is corrupt")]
    CorruptRing(String),
    /// This process cannot tell which memory the prefix's processes
    /// share (it maps none of the prefix's hugepage files, or
    /// `/proc/self/maps` could not be read), so it cannot check what
    /// they wrote there.
    #[error(
        "found none of DPDK prefix {0:?}'s hugepage files in /proc/self/maps (unreadable, \
         or DPDK runs without hugepage files, which secondaries need): what other processes \
         of the prefix write cannot be checked, so none of it is used"
    )]
    Unchecked(String),
}

pub(super) fn errno_text() -> String {
    // SAFETY: plain calls; rte_strerror returns a static or thread-local
    // NUL-terminated string.
    unsafe {
        let e = sys::xio_shim_errno();
        CStr::from_ptr(sys::rte_strerror(e))
            .to_string_lossy()
            .into_owned()
    }
}

pub(super) fn cname(name: &str, max: usize) -> Result<CString, DpdkError> {
    if name.len() >= max {
        return Err(DpdkError::Name(name.into()));
    }
    CString::new(name).map_err(|_| DpdkError::Name(name.into()))
}

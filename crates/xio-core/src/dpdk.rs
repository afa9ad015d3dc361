//! The DPDK backend's building blocks: the EAL (a manager is the primary
//! process of its prefix, stacks are secondaries), one `rte_mempool` per
//! size class holding the buffers, and single-producer single-consumer
//! `rte_ring`s of 16-byte descriptors, all in hugepage memory and found by
//! name. [`DpdkPool`] implements [`BufferPool`] and [`DpdkProducer`] /
//! [`DpdkConsumer`] implement the ring traits, so the layers above are the
//! same as with the shm backend.
//!
//! Every mempool object starts with a 64-byte [`ObjHeader`] recording its
//! owner, state and generation, as the shm pool's buffer headers do: a
//! descriptor from a peer is checked against it (untrusted input), and the
//! buffers of a process that died are found by walking the objects.
//!
//! Mempools use DPDK's default multi-producer multi-consumer ring ops with
//! no per-lcore cache (a cache of a killed process would be lost).

use std::ffi::{c_void, CStr, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use dpdk_sys as sys;

use crate::backend::{BufferPool, DescConsumer, DescProducer, RingWatch};
use crate::layout::{kind, Descriptor};
use crate::pool::{AllocError, Busy, PoolView, RawBuf, Reclaimed, Reject};
use crate::ring::RingError;

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

fn errno_text() -> String {
    // SAFETY: plain calls; rte_strerror returns a static or thread-local
    // NUL-terminated string.
    unsafe {
        let e = sys::xio_shim_errno();
        CStr::from_ptr(sys::rte_strerror(e))
            .to_string_lossy()
            .into_owned()
    }
}

/// Whether this process is the DPDK primary of its prefix or a secondary.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Creates the shared objects (the manager).
    Primary,
    /// Looks them up (a stack).
    Secondary,
}

impl Role {
    fn name(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Secondary => "secondary",
        }
    }
}

/// The process's EAL: initialised once, for one prefix and role.
#[derive(Debug)]
pub struct Eal {
    prefix: String,
    role: Role,
}

/// The EAL starts once per process: DPDK cannot start it again, not even
/// after a failed start, so a failure is kept and answered again.
static EAL: OnceLock<Result<Eal, DpdkError>> = OnceLock::new();

/// Checks what DPDK needs before `rte_eal_init` as `role`, which reports
/// it badly: reserved hugepages, free ones for a primary, and a mounted
/// hugetlbfs.
pub fn preflight(role: Role) -> Result<(), DpdkError> {
    let pages = HugePages::from_sysfs(std::path::Path::new("/sys/kernel/mm/hugepages"))
        .unwrap_or_else(|| {
            HugePages::from_meminfo(&std::fs::read_to_string("/proc/meminfo").unwrap_or_default())
        });
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    check_hugepages(pages, &mounts, role)
}

/// Hugepages reserved and free on the machine, over every page size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HugePages {
    /// Reserved.
    pub total: u64,
    /// Not in use.
    pub free: u64,
}

impl HugePages {
    /// From a directory laid out as `/sys/kernel/mm/hugepages` (one
    /// `hugepages-<size>kB` directory per page size, each with
    /// `nr_hugepages` and `free_hugepages`); `None` if it cannot be read.
    /// `/proc/meminfo` counts the default page size only: 1 GiB pages
    /// reserved beside a 2 MiB default, as DPDK deployments do, are
    /// only here.
    pub fn from_sysfs(dir: &std::path::Path) -> Option<HugePages> {
        let read = |d: &std::path::Path, f: &str| -> Option<u64> {
            std::fs::read_to_string(d.join(f)).ok()?.trim().parse().ok()
        };
        let mut pages = HugePages { total: 0, free: 0 };
        let mut any = false;
        for e in std::fs::read_dir(dir).ok()?.flatten() {
            let d = e.path();
            if !e.file_name().to_string_lossy().starts_with("hugepages-") {
                continue;
            }
            pages.total += read(&d, "nr_hugepages")?;
            pages.free += read(&d, "free_hugepages")?;
            any = true;
        }
        any.then_some(pages)
    }

    /// From `/proc/meminfo` text (the default page size's).
    pub fn from_meminfo(meminfo: &str) -> HugePages {
        let field = |k: &str| -> u64 {
            meminfo
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|r| r.split_whitespace().next()?.parse().ok())
                .unwrap_or(0)
        };
        HugePages {
            total: field("HugePages_Total:"),
            free: field("HugePages_Free:"),
        }
    }
}

/// The hugetlbfs mount points listed in `/proc/mounts` text.
fn hugetlbfs_dirs(mounts: &str) -> impl Iterator<Item = &str> {
    mounts.lines().filter_map(|l| {
        let mut f = l.split_whitespace();
        let dir = f.nth(1)?;
        (f.next() == Some("hugetlbfs")).then_some(dir)
    })
}

/// [`preflight`] on the given hugepage counts and `/proc/mounts` text.
pub fn check_hugepages(pages: HugePages, mounts: &str, role: Role) -> Result<(), DpdkError> {
    let fix = "reserve some as root: `echo 256 > /proc/sys/vm/nr_hugepages` and \
               `mount -t hugetlbfs nodev /dev/hugepages` (or run .ci/run)";
    if pages.total == 0 {
        return Err(DpdkError::Hugepages(format!(
            "no hugepages are reserved on this machine; the dpdk backend needs them: {fix}"
        )));
    }
    // A secondary maps the primary's pages and takes none of its own: a
    // manager whose pool fills every reserved page (hugepages sized to
    // the pool, as DPDK deployments do) still takes stacks.
    if role == Role::Primary && pages.free == 0 {
        return Err(DpdkError::Hugepages(format!(
            "all {} hugepages are in use; free some or reserve more: {fix}",
            pages.total
        )));
    }
    if hugetlbfs_dirs(mounts).next().is_none() {
        return Err(DpdkError::Hugepages(format!(
            "no hugetlbfs is mounted: {fix}"
        )));
    }
    Ok(())
}

impl Eal {
    /// Initialises DPDK in this process as `role` of `prefix` (DPDK's
    /// `--file-prefix`: one per pool, like X-IO's prefix), or returns the
    /// EAL already running with the same prefix and role.
    pub fn init(prefix: &str, role: Role) -> Result<&'static Eal, DpdkError> {
        let r = EAL.get_or_init(|| Self::start(prefix, role));
        match r {
            // A primary uses its own objects: asking for a secondary of
            // the same prefix (a stack in the manager's process) is fine.
            Ok(e) if e.prefix == prefix && (e.role == role || role == Role::Secondary) => Ok(e),
            Ok(e) => Err(DpdkError::AlreadyInit {
                prefix: e.prefix.clone(),
                role: e.role.name(),
                wanted: prefix.into(),
                wanted_role: role.name(),
            }),
            Err(e) => Err(e.clone()),
        }
    }

    fn start(prefix: &str, role: Role) -> Result<Eal, DpdkError> {
        preflight(role)?;
        // EAL pins the calling thread to its lcore's CPUs: keep the
        // caller's own placement (a benchmark's pinning, a service's
        // taskset) instead.
        let affinity = rustix::thread::sched_getaffinity(None).ok();
        // One lcore, floating over the CPUs this process may use: EAL
        // would otherwise pin the calling thread to one core. Named one
        // by one, not as `0..n`: in a container limited to other CPUs (a
        // cpuset cgroup) pinning to CPUs outside it fails, and with it
        // `rte_eal_init`.
        let cpus = affinity.as_ref().map_or_else(
            || {
                let n = std::thread::available_parallelism().map_or(1, |n| n.get());
                format!("0-{}", n - 1)
            },
            cpu_list,
        );
        let args = [
            "xio".to_string(),
            format!("--proc-type={}", role.name()),
            format!("--file-prefix={prefix}"),
            "--no-pci".into(),
            "--no-telemetry".into(),
            format!("--lcores=0@({cpus})"),
            "--log-level=lib.eal:error".into(),
        ]
        .into_iter()
        .chain(
            std::env::var("XIO_DPDK_EAL_ARGS")
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_owned),
        )
        .collect::<Vec<_>>();
        let cargs: Vec<CString> = args
            .iter()
            .map(|a| CString::new(a.as_str()).expect("no NUL in EAL args"))
            .collect();
        let mut argv: Vec<*mut std::ffi::c_char> =
            cargs.iter().map(|a| a.as_ptr().cast_mut()).collect();
        // SAFETY: argv holds valid NUL-terminated strings that outlive the
        // call (EAL may permute argv, not free it); called once (OnceLock).
        let n = unsafe { sys::rte_eal_init(argv.len() as i32, argv.as_mut_ptr()) };
        if let Some(set) = affinity {
            let _ = rustix::thread::sched_setaffinity(None, &set);
        }
        if n < 0 {
            return Err(DpdkError::Eal {
                prefix: prefix.into(),
                role: role.name(),
                reason: errno_text(),
                hint: match role {
                    Role::Secondary => " (a secondary needs the primary, the X-IO manager \
                                        started with the dpdk backend and this prefix, to be \
                                        running)"
                        .into(),
                    Role::Primary => match processes_using(prefix).as_slice() {
                        [] => " (DPDK needs root or access to /dev/hugepages)".into(),
                        // A manager restarted while processes attached to
                        // the one before still run: DPDK keeps the prefix
                        // to them until they exit.
                        pids => format!(
                            " (process {} still uses this prefix's DPDK memory, attached to an \
                             earlier manager; a new primary can start once it has exited)",
                            pids.iter()
                                .map(u32::to_string)
                                .collect::<Vec<_>>()
                                .join(", process ")
                        ),
                    },
                },
            });
        }
        Ok(Eal {
            prefix: prefix.into(),
            role,
        })
    }

    /// Removes the prefix's hugepage files (what a clean manager stop
    /// leaves behind: DPDK keeps them for secondaries, and would only clear
    /// them when a primary of the same prefix starts again). Processes that
    /// still map them keep their memory until they exit.
    pub fn remove_hugepage_files(prefix: &str) {
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
        let stem = format!("{prefix}map_");
        for dir in hugetlbfs_dirs(&mounts) {
            for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if e.file_name().to_str().is_some_and(|n| n.starts_with(&stem)) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The role.
    pub fn role(&self) -> Role {
        self.role
    }
}

/// The processes other than this one that map `prefix`'s DPDK files (its
/// runtime directory's or its hugepage files): the secondaries that keep a
/// new primary of the prefix from starting.
fn processes_using(prefix: &str) -> Vec<u32> {
    let runtime = format!("/dpdk/{prefix}/");
    let pages = format!("/{prefix}map_");
    let me = std::process::id();
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse().ok())
        .filter(|&pid| pid != me)
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/maps")).is_ok_and(|m| {
                m.lines()
                    .any(|l| l.contains(&runtime) || l.contains(&pages))
            })
        })
        .collect();
    pids.sort_unstable();
    pids
}

/// The CPUs of `set` in EAL's cpuset syntax, runs as ranges (`0-3,6`).
fn cpu_list(set: &rustix::thread::CpuSet) -> String {
    let mut runs: Vec<(usize, usize)> = Vec::new();
    for c in (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c)) {
        match runs.last_mut() {
            Some((_, end)) if *end + 1 == c => *end = c,
            _ => runs.push((c, c)),
        }
    }
    runs.iter()
        .map(|&(a, b)| {
            if a == b {
                a.to_string()
            } else {
                format!("{a}-{b}")
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

fn cname(name: &str, max: usize) -> Result<CString, DpdkError> {
    if name.len() >= max {
        return Err(DpdkError::Name(name.into()));
    }
    CString::new(name).map_err(|_| DpdkError::Name(name.into()))
}

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
    /// a live receiver but in no ring (see [`DpdkPool::reclaim`]).
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
    mp: NonNull<sys::rte_mempool>,
    /// The mempool's ring and its slot mask, checked once when the pool
    /// was wrapped ([`Mempool::wrap`]) and kept here: every get and put
    /// goes to them directly. The mempool's ops index and ring pointer,
    /// and the ring's mask, are shared memory any process of the prefix
    /// can write; DPDK's `rte_mempool_get_bulk` read them on every call,
    /// so an overwritten ops index aborted the process (DPDK's
    /// `RTE_VERIFY`) or called another ops' functions, and an overwritten
    /// mask made it read and write slots outside the ring.
    ring: NonNull<sys::rte_ring>,
    mask: u32,
    /// Every get and put on the mempool, of every process, runs alone:
    /// under the mempool's lock (see [`DpdkPool::mempool_op`]) or with
    /// the gates closed (the manager's sweep). Then a get or put half done
    /// in the ring is no peer's in progress but one a process killed
    /// inside an operation left, or a hostile one made: DPDK's protocol
    /// waited for its tail for ever, inside the bracket and holding the
    /// lock, so the sweep that repairs it waited for the waiter and every
    /// other operation for the lock. Such a get or put is refused instead
    /// (an empty pool to the caller, until the sweep repairs the ring).
    /// Off for a pool without a segment, whose operations run at once.
    exclusive: bool,
    /// A half-done operation was reported (see [`Mempool::half_done`]).
    told_half_done: std::sync::atomic::AtomicBool,
    /// Object `i`'s address, by the index in its header.
    objs: Vec<NonNull<ObjHeader>>,
    /// Where the objects lie, from `objs` (our own memory): runs of
    /// consecutive objects `stride` bytes apart, one per memory chunk
    /// DPDK placed them in (usually one). A pointer the mempool's ring
    /// hands out is checked against them before it is read through.
    runs: Vec<Run>,
    stride: usize,
    size: usize,
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
    pub fn is_empty(&self) -> bool {
        self.objs.is_empty()
    }

    /// Objects currently free in the pool.
    pub fn avail(&self) -> u32 {
        // SAFETY: the mempool's ring (checked in `wrap`); reads its tails.
        unsafe { sys::xio_shim_mpring_count(self.ring.as_ptr(), self.mask) }
    }

    /// Payload bytes per object.
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
    fn index_of(&self, o: *mut c_void) -> Option<u32> {
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
    fn get_raw(&self) -> Option<*mut c_void> {
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
    fn repair_ring(&self) -> bool {
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
    fn restore_ring(&self) {
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
    pub fn __scribble_ring(&self, ops_index: i32, mask: u32) {
        // SAFETY: a live mempool; writes two fields of shared memory, as
        // any process of the prefix can.
        unsafe { sys::xio_shim_mempool_scribble(self.mp.as_ptr(), ops_index, mask) };
    }

    /// Takes exactly `out.len()` objects, or none.
    fn get_bulk(&self, out: &mut [*mut c_void]) -> bool {
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

    fn put_bulk(&self, objs: &[*mut c_void]) {
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

    fn put(&self, h: &ObjHeader) {
        let o = (h as *const ObjHeader).cast_mut().cast::<c_void>();
        self.put_bulk(&[o]);
    }

    fn data(&self, h: &ObjHeader) -> *mut u8 {
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
struct SharedMem {
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
    fn holds_now(at: usize, len: usize) -> Result<bool, DpdkError> {
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
        let stem = format!("{}map_", eal.prefix);
        let maps = std::fs::read_to_string("/proc/self/maps").ok();
        SharedMem::read(maps.as_deref(), &stem, eal.role)
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
                    .map_or_else(String::new, |e| e.prefix.clone()),
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

/// The name of the ring that stack end `dir` of channel `channel`
/// produces into.
pub fn ring_name(channel: u32, dir: usize) -> String {
    format!("xio-r{channel}-{dir}")
}

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
/// shm pool (see [`crate::pool`]), every mempool operation is bracketed by
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
    gates: Option<PoolView>,
}

/// Test hook: a mempool reached inside a mempool operation of a pool
/// ([`DpdkPool::__inside_op`]), so what a test does to its ring happens
/// where a real process's operations do: inside the intent/gate bracket
/// and under the class's lock (a test outside them modelled a state no
/// process can reach). Not for applications.
#[doc(hidden)]
pub struct InsideOp<'a>(&'a Mempool);

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
    seg: &crate::segment::Segment,
    me: u16,
    keepalive: std::os::fd::OwnedFd,
) -> Result<DpdkPool, crate::stack::Error> {
    let err = |e: DpdkError| crate::stack::Error::Io(std::io::Error::other(e.to_string()));
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

/// The ring ends of stack end `dir` of `channel`: it produces into ring
/// `dir` and consumes ring `1 - dir`.
pub fn channel_ends(channel: u32, dir: usize) -> Result<(DpdkProducer, DpdkConsumer), DpdkError> {
    Ok((
        DpdkProducer::new(Ring::lookup(&ring_name(channel, dir))?),
        DpdkConsumer::new(Ring::lookup(&ring_name(channel, 1 - dir))?),
    ))
}

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
    pub fn with_segment(classes: Vec<Mempool>, me: u16, seg: crate::segment::Segment) -> DpdkPool {
        let mut p = DpdkPool::new(classes, me);
        // Every operation runs under the mempool's lock or with the gates
        // closed (see `Mempool::exclusive`).
        for mp in &mut p.classes {
            mp.exclusive = true;
        }
        p.gates = Some(PoolView::new(seg));
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
        let Some(v) = &self.gates else {
            return Some(op());
        };
        let seg = v.segment();
        let lock: &crate::sync::AtomicU64 = &seg.free_head(c).head;
        let mine = u64::from(self.me) + 1;
        let mut op = Some(op);
        let mut waited = 0u32;
        loop {
            let done = v.global_op(self.me, c, wait, || {
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
                if (!wait && v.segment().free_head(c).gate.load(Ordering::Relaxed) != 0)
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
    pub fn __inside_op<R>(&self, c: usize, f: impl FnOnce(&InsideOp<'_>) -> R) -> Option<R> {
        self.mempool_op(c, true, || f(&InsideOp(&self.classes[c])))
    }

    /// Whether class `c`'s gate is held closed by a manager that died.
    fn stranded(&self, c: usize) -> bool {
        self.gates.as_ref().is_some_and(|v| v.stranded(c))
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
    pub fn usage(&self) -> Vec<crate::pool::ClassUsage> {
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
                crate::pool::ClassUsage {
                    buf_size: mp.size as u32,
                    total: mp.len() as u32,
                    free: mp.avail(),
                    by_owner: by.into_iter().collect(),
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
    /// operation): as [`crate::pool::ManagerPool::reclaim`] does, it
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
        let Some(v) = &self.gates else {
            return Ok(Reclaimed {
                owned: self.reclaim_owned(dead, readers),
                lost: 0,
            });
        };
        let seg = v.segment();
        crate::pool::close_gates(seg, live, patience, gone)?;
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
                } else if dead.contains(&owner)
                    || owner == 0
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
        crate::pool::open_gates(seg);
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
            Err(()) if wait || self.stranded(c) => Err(AllocError::ManagerGone),
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

    fn max_buf(&self) -> usize {
        self.classes.iter().map(|m| m.size).max().unwrap_or(0)
    }
    fn pool_id(&self) -> u64 {
        // The segment's identity, as for the shm pool: the same for every
        // stack of the pool in this process, and distinct from every other
        // segment's. Not a mempool's address: DPDK's memory starts at
        // 4 GiB, where memfd identities (`1 << 32 ^ inode`) lie too, and
        // an shm pool whose inode met it passed for this one.
        match &self.gates {
            Some(v) => v.segment().region().ident(),
            // No segment (a pool without a manager): the first mempool,
            // one object at the same address for every pool of the prefix.
            None => self.classes.first().map_or(0, |m| m.mp.as_ptr() as u64),
        }
    }
}

/// An `rte_ring` of [`Descriptor`]s (16-byte elements), single producer
/// and single consumer: one direction of a channel.
#[derive(Debug)]
pub struct Ring {
    r: NonNull<sys::rte_ring>,
    /// The slot mask, checked once (see [`Ring::wrap`]) and kept here:
    /// the ring's own size, mask and capacity are shared memory, and
    /// DPDK's burst functions read them on every call (a peer that
    /// overwrote the mask made the other end read and write slots far
    /// outside the ring).
    mask: u32,
}

// SAFETY: an rte_ring is shared memory; SP/SC discipline is kept by giving
// each end to one owner (DpdkProducer / DpdkConsumer are not Clone).
unsafe impl Send for Ring {}
// SAFETY: only `count` is called through a shared reference (a read of
// the ring's indices).
unsafe impl Sync for Ring {}

const DESC: u32 = std::mem::size_of::<Descriptor>() as u32;
// The shim's ring functions move 16-byte elements.
const _: () = assert!(DESC == 16);

impl Ring {
    /// Creates a ring of `count` descriptors (a power of two; primary).
    pub fn create(name: &str, count: u32) -> Result<Ring, DpdkError> {
        let c = cname(name, sys::xio_shim_limits::XIO_SHIM_RING_NAMESIZE as usize)?;
        // SAFETY: valid name; flags select SP/SC.
        let r = unsafe {
            sys::rte_ring_create_elem(
                c.as_ptr(),
                DESC,
                count,
                sys::SOCKET_ID_ANY,
                sys::RING_F_SP_ENQ | sys::RING_F_SC_DEQ,
            )
        };
        let r = NonNull::new(r).ok_or_else(|| DpdkError::Create {
            what: "ring",
            name: name.into(),
            reason: errno_text(),
        })?;
        Ring::wrap(r, name)
    }

    /// The ring at `r`, its size, mask and capacity checked once, its
    /// header and slots in the prefix's shared memory.
    fn wrap(r: NonNull<sys::rte_ring>, name: &str) -> Result<Ring, DpdkError> {
        let corrupt = || DpdkError::CorruptRing(name.into());
        let head = std::mem::size_of::<sys::rte_ring>();
        if !SharedMem::holds_now(r.as_ptr() as usize, head)? {
            return Err(corrupt());
        }
        let mut mask = 0;
        // SAFETY: a ring header in shared memory (checked above); the
        // shim reads each field once.
        if unsafe { sys::xio_shim_ring_check(r.as_ptr(), &mut mask) } != 0 {
            return Err(corrupt());
        }
        let slots = (mask as usize + 1) * DESC as usize;
        if !SharedMem::holds_now(r.as_ptr() as usize, head + slots)? {
            return Err(corrupt());
        }
        Ok(Ring { r, mask })
    }

    /// Looks up a ring made by the primary.
    pub fn lookup(name: &str) -> Result<Ring, DpdkError> {
        let c = cname(name, sys::xio_shim_limits::XIO_SHIM_RING_NAMESIZE as usize)?;
        // SAFETY: valid name.
        let r = unsafe { sys::rte_ring_lookup(c.as_ptr()) };
        let r = NonNull::new(r).ok_or_else(|| DpdkError::NotFound {
            what: "ring",
            name: name.into(),
        })?;
        Ring::wrap(r, name)
    }

    /// Test hook: overwrites the ring's mask and size and moves its heads
    /// and tails to `at`, one descriptor waiting, as a broken or hostile
    /// process of the prefix can. Not for applications.
    #[doc(hidden)]
    pub fn __scribble(&self, mask: u32, size: u32, at: u32) {
        // SAFETY: a live ring; writes fields of shared memory, as any
        // process of the prefix can.
        unsafe { sys::xio_shim_ring_scribble(self.r.as_ptr(), mask, size, at) }
    }

    /// Descriptors waiting.
    pub fn count(&self) -> u32 {
        // SAFETY: a live ring; reads its indices.
        unsafe { sys::xio_shim_spsc_count(self.r.as_ptr(), self.mask) }
    }

    fn push(&mut self, ds: &[Descriptor]) -> usize {
        // SAFETY: `ds` holds ds.len() elements of DESC (16) bytes; we
        // are the ring's only producer; slots are reached through the
        // mask checked in `wrap` only.
        unsafe {
            sys::xio_shim_spsc_enqueue(
                self.r.as_ptr(),
                self.mask,
                ds.as_ptr().cast(),
                ds.len() as u32,
            ) as usize
        }
    }

    /// Takes up to `out.len()` descriptors. Only the ring's one consumer
    /// may call it (`DpdkConsumer`, which is not `Clone` and pops through
    /// `&mut self`): the ring is single-consumer. A shared reference is
    /// enough otherwise, since the ring is DPDK's memory, not ours, and
    /// the consumer's watches share the `Ring` (the `&mut` this took was
    /// made from an `Arc` they also hold: aliasing undefined behaviour).
    fn pop(&self, out: &mut [Descriptor]) -> usize {
        // SAFETY: `out` has room for out.len() elements; the caller is the
        // only consumer (above). Descriptor is plain data, any bytes are a
        // value.
        // Slots are reached through the mask checked in `wrap` only.
        unsafe {
            sys::xio_shim_spsc_dequeue(
                self.r.as_ptr(),
                self.mask,
                out.as_mut_ptr().cast(),
                out.len() as u32,
            ) as usize
        }
    }

    /// Empties the ring (a channel slot being reused).
    ///
    /// # Safety
    ///
    /// No process may use the ring meanwhile: `rte_ring_reset` rewrites
    /// its indices without synchronisation.
    pub unsafe fn reset(&self) {
        // SAFETY: a live ring no process uses (the caller's contract).
        unsafe { sys::rte_ring_reset(self.r.as_ptr()) }
    }

    fn free_count(&self) -> u32 {
        // SAFETY: a live ring.
        unsafe { self.mask - sys::xio_shim_spsc_count(self.r.as_ptr(), self.mask) }
    }
}

/// The sending end of a channel direction.
#[derive(Debug)]
pub struct DpdkProducer(Ring);

/// The receiving end of a channel direction.
#[derive(Debug)]
pub struct DpdkConsumer(Arc<Ring>);

impl DpdkProducer {
    /// The producer end of `ring` (give each ring one producer).
    pub fn new(ring: Ring) -> Self {
        DpdkProducer(ring)
    }
}

impl DpdkConsumer {
    /// The consumer end of `ring` (give each ring one consumer).
    pub fn new(ring: Ring) -> Self {
        DpdkConsumer(Arc::new(ring))
    }
}

impl DescProducer for DpdkProducer {
    fn push_burst(&mut self, ds: &[Descriptor]) -> Result<usize, RingError> {
        Ok(self.0.push(ds))
    }
    fn room(&mut self, _want: u32) -> Result<u32, RingError> {
        Ok(self.0.free_count())
    }
}

impl DescConsumer for DpdkConsumer {
    fn pop_burst(&mut self, out: &mut [Descriptor]) -> Result<usize, RingError> {
        // This consumer is the ring's only one (`&mut self`, not Clone);
        // the watches only read counts.
        Ok(self.0.pop(out))
    }
    fn has_data(&mut self) -> bool {
        self.0.count() > 0
    }
    fn watch(&self) -> Box<dyn RingWatch> {
        Box::new(DpdkWatch(self.0.clone()))
    }
}

struct DpdkWatch(Arc<Ring>);

impl RingWatch for DpdkWatch {
    fn has_data(&self) -> bool {
        self.0.count() > 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTS: &str = "nodev /dev/hugepages hugetlbfs rw,relatime,pagesize=2M 0 0\n";

    const fn pages(total: u64, free: u64) -> HugePages {
        HugePages { total, free }
    }

    #[test]
    fn preflight_explains_what_is_missing() {
        let none = HugePages::from_meminfo("HugePages_Total:       0\nHugePages_Free:        0\n");
        assert_eq!(none, pages(0, 0));
        for role in [Role::Primary, Role::Secondary] {
            let e = check_hugepages(none, MOUNTS, role).unwrap_err().to_string();
            assert!(e.contains("no hugepages are reserved"), "{e}");
            assert!(e.contains("nr_hugepages"), "{e}");
        }
        let e = check_hugepages(pages(256, 0), MOUNTS, Role::Primary)
            .unwrap_err()
            .to_string();
        assert!(e.contains("all 256 hugepages are in use"), "{e}");
        let ok = HugePages::from_meminfo("HugePages_Total:     256\nHugePages_Free:      100\n");
        assert_eq!(ok, pages(256, 100));
        for role in [Role::Primary, Role::Secondary] {
            let e = check_hugepages(ok, "proc /proc proc rw 0 0\n", role)
                .unwrap_err()
                .to_string();
            assert!(e.contains("no hugetlbfs is mounted"), "{e}");
            assert!(check_hugepages(ok, MOUNTS, role).is_ok());
        }
    }

    /// A stack joins a manager whose pool took every reserved hugepage:
    /// the secondary maps the primary's pages and needs no free one. The
    /// check refused it ("all 256 hugepages are in use") before DPDK was
    /// asked, so no service could attach to a manager sized to the
    /// machine's hugepages.
    #[test]
    fn a_secondary_needs_no_free_hugepage() {
        assert!(check_hugepages(pages(256, 0), MOUNTS, Role::Secondary).is_ok());
    }

    /// 1 GiB pages reserved beside a 2 MiB default page size (`hugepagesz=1G
    /// hugepages=4` on the kernel command line, or through sysfs), as
    /// DPDK deployments do: `/proc/meminfo` counts the default size only,
    /// and the check read it alone, so it said no hugepages were reserved
    /// and DPDK, which would have used the 1 GiB mount, was never asked.
    #[test]
    fn hugepages_of_every_size_are_counted() {
        let dir = std::env::temp_dir().join(format!("xio-hp-{}", std::process::id()));
        for (size, n) in [("2048kB", 0), ("1048576kB", 4)] {
            let d = dir.join(format!("hugepages-{size}"));
            std::fs::create_dir_all(&d).unwrap();
            std::fs::write(d.join("nr_hugepages"), format!("{n}\n")).unwrap();
            std::fs::write(d.join("free_hugepages"), format!("{n}\n")).unwrap();
        }
        let found = HugePages::from_sysfs(&dir);
        let _ = std::fs::remove_dir_all(&dir);
        assert_eq!(found, Some(pages(4, 4)));
        let gig = "nodev /mnt/huge1g hugetlbfs rw,relatime,pagesize=1024M 0 0\n";
        assert!(check_hugepages(pages(4, 4), gig, Role::Primary).is_ok());
        assert_eq!(HugePages::from_sysfs(&dir), None, "gone: unreadable");
    }

    #[test]
    fn cpu_lists_name_the_cpus_of_a_set() {
        let mut set = rustix::thread::CpuSet::new();
        for c in [1, 2, 3, 6, 9, 10] {
            set.set(c);
        }
        assert_eq!(cpu_list(&set), "1-3,6,9-10");
    }

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

    #[test]
    fn header_is_one_cache_line() {
        assert_eq!(HEADER, 64);
    }
}

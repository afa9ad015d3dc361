//! The manager: owns the pool, registers stacks, sets up channels, and
//! reclaims what a dead process held. The `xio-manager` binary runs this
//! same code in the foreground; [`ManagerBuilder::spawn`] runs it on a
//! thread inside any process (tests, examples, single-binary services).
//!
//! The manager is the control plane only: once two stacks have a channel it
//! never touches their traffic. It learns of a death by EOF on the stack's
//! control socket, which the kernel delivers the moment a process dies,
//! however it dies.

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use rustix::event::{PollFd, PollFlags};

use crate::backend::{Doorbell, EventFdDoorbell};
use crate::ctrl::{self, RecvError};
use crate::fork::CloseOnFork;
use crate::layout::{chan_state, slot_state, PoolConfig};
use crate::paths;
use crate::pool::{Busy, ClassUsage, ManagerPool, Reclaimed};
use crate::proto::{ErrorCode, Msg, MAX_STATUS, MAX_STATUS_INLINE};
use crate::segment::{Region, Segment, SegmentError};
use crate::sync::Ordering;

/// Errors starting or running a manager.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// Another manager holds this prefix.
    #[error("another xio-manager is already running for pool {prefix:?}{} (lock {lock})", pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    AlreadyRunning {
        /// The prefix.
        prefix: String,
        /// Its pid, if the lock file says.
        pid: Option<u32>,
        /// The lock file.
        lock: String,
    },
    /// Invalid prefix.
    #[error(transparent)]
    BadPrefix(#[from] paths::BadPrefix),
    /// Could not create the segment.
    #[error(transparent)]
    Segment(#[from] SegmentError),
    /// The DPDK backend could not start (no hugepages, no DPDK support in
    /// this build, another primary on the prefix...).
    #[error("dpdk backend: {0}")]
    Dpdk(String),
    /// A system call failed.
    #[error("{what}: {err}")]
    Io {
        /// What we were doing.
        what: String,
        /// The error.
        err: io::Error,
    },
}

/// So `Manager::builder(..).spawn()?` works in a function returning
/// `io::Result` (a `main`, say): the kind says what went wrong, the
/// manager's error is the source.
///
/// ```no_run
/// fn main() -> std::io::Result<()> {
///     let _manager = xio_core::Manager::builder("xio").spawn()?;
///     Ok(())
/// }
/// ```
impl From<ManagerError> for io::Error {
    fn from(e: ManagerError) -> io::Error {
        let kind = match &e {
            ManagerError::AlreadyRunning { .. } => io::ErrorKind::AddrInUse,
            ManagerError::BadPrefix(_) => io::ErrorKind::InvalidInput,
            ManagerError::Io { err, .. } => err.kind(),
            ManagerError::Segment(_) | ManagerError::Dpdk(_) => io::ErrorKind::Other,
        };
        io::Error::new(kind, e)
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> ManagerError {
    let what = what.into();
    move |err| ManagerError::Io { what, err }
}

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

/// Options for a manager.
#[derive(Clone, Debug)]
pub struct ManagerBuilder {
    prefix: String,
    pool: PoolConfig,
    backend: Backend,
}

impl ManagerBuilder {
    /// Where buffers and rings live (default [`Backend::Shm`]).
    pub fn backend(mut self, backend: Backend) -> Self {
        self.backend = backend;
        self
    }

    /// The pool geometry (default: [`PoolConfig::default`]).
    pub fn pool(mut self, pool: PoolConfig) -> Self {
        self.pool = pool;
        self
    }

    /// Creates the pool and takes the prefix: after this returns, stacks can
    /// connect (their requests are served once [`Manager::run`] runs).
    pub fn bind(self) -> Result<Manager, ManagerError> {
        Manager::bind(self)
    }

    /// Binds and runs the manager on a background thread, until the
    /// returned handle is dropped or stopped.
    #[must_use = "the manager stops when its handle is dropped: keep the handle"]
    pub fn spawn(self) -> Result<ManagerHandle, ManagerError> {
        let m = self.bind()?;
        let stop = m.stopper();
        let view = m.pool.clone();
        let snap = m.snapshot.clone();
        let prefix = m.prefix.clone();
        let thread = std::thread::Builder::new()
            .name(format!("xio-manager-{prefix}"))
            .spawn(move || m.run())
            .map_err(io_err("spawn manager thread"))?;
        Ok(ManagerHandle {
            thread: Some(thread),
            born: crate::fork::Birth::now(),
            stop,
            pool: view,
            snapshot: snap,
            prefix,
        })
    }
}

/// Stops a running manager from another thread or a signal handler thread.
#[derive(Clone, Debug)]
pub struct Stopper(Arc<EventFdDoorbell>);

impl Stopper {
    /// Asks the manager to stop; `run` returns soon after.
    pub fn stop(&self) {
        let _ = self.0.ring();
    }
}

/// What the manager knows, for status output and tests.
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Registered stacks.
    pub stacks: Vec<StackInfo>,
    /// Open channels: `(slot, stack a, stack b)`.
    pub channels: Vec<(u32, u16, u16)>,
    /// Processes that died or left, in total, counted once the buffers
    /// they held are back (with [`Snapshot::reclaimed`]).
    pub deaths: u64,
    /// Buffers reclaimed from them, in total.
    pub reclaimed: u64,
    /// Malformed or unexpected control messages received.
    pub bad_messages: u64,
    /// Dead stacks whose buffers wait to be reclaimed: a live stack was
    /// inside a free-list operation (stopped, say) for as long as the
    /// manager would wait. It tries again, in the background.
    pub unswept: usize,
}

/// One registered stack.
#[derive(Clone, Debug)]
pub struct StackInfo {
    /// Stack id.
    pub id: u16,
    /// Process id.
    pub pid: u32,
    /// Service name.
    pub name: String,
    /// Bound addresses.
    pub addrs: Vec<SocketAddr>,
    /// Control messages waiting in the manager for room in the stack's
    /// socket: more than zero means it is not reading it (stopped or
    /// stuck), and the manager takes no requests from it meanwhile.
    pub queued: usize,
}

/// A manager running on a thread of this process. Stops (and removes its
/// socket) when dropped.
#[derive(Debug)]
#[must_use = "the manager stops when its handle is dropped"]
pub struct ManagerHandle {
    thread: Option<JoinHandle<Result<(), ManagerError>>>,
    /// The fork generation of the process running the manager: a forked
    /// child's copy of the handle must not stop it (see [`crate::fork`]).
    born: crate::fork::Birth,
    stop: Stopper,
    pool: MgrPool,
    snapshot: Arc<Mutex<Snapshot>>,
    prefix: String,
}

/// The manager's side of the pool, per backend.
#[derive(Clone, Debug)]
enum MgrPool {
    Shm(Arc<ManagerPool>),
    #[cfg(feature = "dpdk")]
    Dpdk(Arc<crate::dpdk::DpdkPool>),
}

impl MgrPool {
    fn usage(&self) -> Vec<ClassUsage> {
        match self {
            MgrPool::Shm(p) => p.usage(),
            #[cfg(feature = "dpdk")]
            MgrPool::Dpdk(p) => p.usage(),
        }
    }

    /// See [`ManagerPool::reclaim`]: `Err` when a live stack stayed
    /// inside a free-list operation longer than [`SWEEP_PATIENCE`].
    fn reclaim(
        &self,
        dead: &[u16],
        live: &[u16],
        readers: &[(u16, u16)],
        gone: impl FnMut(u16) -> bool,
    ) -> Result<Reclaimed, Busy> {
        match self {
            MgrPool::Shm(p) => p.reclaim(dead, live, readers, SWEEP_PATIENCE, gone),
            #[cfg(feature = "dpdk")]
            MgrPool::Dpdk(p) => p.reclaim(dead, live, readers, SWEEP_PATIENCE, gone),
        }
    }
}

impl ManagerHandle {
    /// Buffers per class, free and per owner.
    pub fn usage(&self) -> Vec<ClassUsage> {
        self.pool.usage()
    }

    /// True when every buffer of every class is free.
    pub fn pool_is_whole(&self) -> bool {
        self.usage().iter().all(|u| u.free == u.total)
    }

    /// Registered stacks, channels and counters.
    pub fn snapshot(&self) -> Snapshot {
        self.snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// The pool's prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Stops the manager and waits for its thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        if self.born.forked() {
            // A forked child's copy: the manager runs in the parent (its
            // stop eventfd is shared), and the thread is not ours to join.
            std::mem::forget(self.thread.take());
            return;
        }
        self.stop.stop();
        if let Some(t) = self.thread.take() {
            match t.join() {
                Ok(Err(e)) => tracing::error!(error = %e, "manager failed"),
                Err(_) => tracing::error!("manager thread panicked"),
                Ok(Ok(())) => {}
            }
        }
    }
}

impl Drop for ManagerHandle {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct StackEntry {
    sock: CloseOnFork,
    pid: u32,
    name: String,
    bell: EventFdDoorbell,
    /// A pidfd of the stack's process (when the kernel's credentials named
    /// it), handed to its peers with the channel: with no manager left to
    /// tell them, they see its death themselves.
    pidfd: Option<OwnedFd>,
    addrs: BTreeSet<SocketAddr>,
    /// peer id -> channel slot
    peers: HashMap<u16, u32>,
    /// Messages its socket had no room for, oldest first, with their fds.
    /// While any wait, the manager reads no requests from this stack (so
    /// a stack that never reads cannot grow it by asking) and polls its
    /// socket for room instead: the manager never blocks on one stack.
    outbox: VecDeque<(Msg, Vec<OwnedFd>)>,
    /// The fds the outbox holds.
    outbox_fds: usize,
    /// The outbox's first message was refused for a reason poll does not
    /// signal the end of: it is tried again every [`RETRY_STALLED`].
    stalled: bool,
    /// The stack left (its end of file read) while its process still
    /// holds the socket: a buffer of it lives on (see [`Manager::on_leave`]).
    /// Its peers and addresses are let go; its buffers are reclaimed when
    /// the socket closes.
    left: bool,
    /// It left because the manager cut it off for a bad control message
    /// (not of its own accord): the status report says so.
    bad: bool,
    /// It left, its end shut for writing (`POLLRDHUP`), and what it had
    /// sent before was read and dropped: nothing more can come but the
    /// hang-up.
    drained: bool,
}

struct ChanEntry {
    a: u16,
    b: u16,
    /// When closing: the live end we wait on, and the dead one.
    closing: Option<(u16, u16)>,
}

/// A sweep a dead stack is owed.
#[derive(Clone, Copy, Debug, Default)]
struct Owed {
    /// Its first: its death is counted in the snapshot with it.
    first: bool,
    /// Its last, after every peer let go of its channels: its slot is
    /// free after it.
    last: bool,
}

/// A bound manager; [`Manager::run`] serves until stopped.
pub struct Manager {
    prefix: String,
    /// Unlinked before the lock is let go: while it is held, no other
    /// manager binds the path.
    sock: SocketFile,
    /// Dropped (unlinked, then released) before the listener closes.
    _lock: LockFile,
    listener: CloseOnFork,
    seg: Segment,
    pool: MgrPool,
    /// DPDK: both rings of every channel slot, made at start.
    #[cfg(feature = "dpdk")]
    rings: Vec<[crate::dpdk::Ring; 2]>,
    /// DPDK: the prefix's hugepage files, removed when the manager stops
    /// or is dropped without running.
    #[cfg(feature = "dpdk")]
    hugepages: Option<HugepageFiles>,
    stop: Arc<EventFdDoorbell>,
    pending: Vec<CloseOnFork>,
    stacks: HashMap<u16, StackEntry>,
    /// Dead stacks whose slot waits for their peers to release channels.
    dead: HashMap<u16, BTreeSet<u32>>,
    /// Dead stacks whose buffers are still to be swept back (see
    /// [`Manager::sweep`]).
    unswept: BTreeMap<u16, Owed>,
    /// After a sweep gave up on a stack inside a free-list operation: when
    /// to try again, and the wait after that one (doubling).
    sweep_retry: Option<(std::time::Instant, std::time::Duration)>,
    /// The stack id given last: the next one is looked for after it, so
    /// an id comes back only after every other was used (as pids do). A
    /// peer's id reused at once would make what its peers still hold of
    /// the dead one (a queued reset, a route) look like the new one's.
    last_id: u16,
    bindings: HashMap<SocketAddr, u16>,
    channels: Vec<Option<ChanEntry>>,
    /// Most fds all outboxes may hold together (a share of the fd limit
    /// at start).
    outbox_fd_budget: usize,
    snapshot: Arc<Mutex<Snapshot>>,
    uid: u32,
    /// Accepting failed (out of fds, most often): the listener is not
    /// polled until then. The connection that failed stays in the
    /// kernel's queue, so polling it meanwhile would spin.
    accept_paused: Option<std::time::Instant>,
    /// Accepting has failed since it last succeeded (logged once).
    accept_failing: bool,
}

impl std::fmt::Debug for Manager {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Manager")
            .field("prefix", &self.prefix)
            .field("stacks", &self.stacks.len())
            .finish()
    }
}

const MAX_PENDING: usize = 256;

/// Most addresses one stack may hold bound at once. The manager goes over
/// every binding at each pass of its loop (the snapshot) and in every
/// status report: without a bound, one stack binding ever more addresses
/// would grow the manager's memory and slow it down for every stack. A
/// bind past this is refused ([`ErrorCode::NoSpace`]).
pub const MAX_BINDINGS_PER_STACK: usize = 4096;

/// Most fds the messages queued for a stack that does not read its control
/// socket (stopped, or stuck) may hold: a new peer's channel carries two,
/// and the manager's fds are for every stack. Past this, connections to
/// that stack are refused until it reads. The rest of what can queue is
/// bounded without a limit: one reply (its requests are not read while
/// anything waits) and one peer's death per channel (a dead peer's
/// channel is not reused before this stack lets it go).
const MAX_OUTBOX_FDS: usize = 256;
/// The share of the manager's fd limit the outboxes of all stacks may hold
/// together: a few stopped stacks must not take the fds every stack needs
/// (accepting, channels).
const OUTBOX_FDS_SHARE: u64 = 4;

/// Whether a send's error says the stack's end is closed.
fn hung_up(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::BrokenPipe
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::NotConnected
            | io::ErrorKind::ConnectionRefused
    )
}

/// What became of a message [`Manager::try_send`] tried to send.
enum Sent {
    /// Sent, and the stack rung.
    Done,
    /// The stack is gone (its end of file is read by the loop).
    Gone,
    /// Not sent: it must wait in the outbox; `stalled` when the kernel
    /// refused it for another reason than a full socket.
    Queue { stalled: bool },
}

/// How often a message the kernel refused for a reason other than a full
/// socket (`ETOOMANYREFS`: too many fds in flight for the user) is tried
/// again: no poll event says when it would pass.
const RETRY_STALLED: std::time::Duration = std::time::Duration::from_millis(20);

/// How long the listener rests after an accept failed (`EMFILE`, `ENFILE`,
/// `ENOBUFS`...): the connection stays queued and the listener readable, so
/// polling it at once would spin until an fd is freed. Stacks already
/// registered are served meanwhile.
const ACCEPT_BACKOFF: std::time::Duration = std::time::Duration::from_millis(50);

/// How long a sweep waits, gates closed, for live stacks to leave their
/// free-list operations. Far more than an operation takes (microseconds)
/// when its thread runs; a stack that is stopped, or whose thread lost
/// its CPU mid-operation, holds up reclamation rather than the manager
/// (and, with every gate closed meanwhile, every stack's free lists).
const SWEEP_PATIENCE: std::time::Duration = std::time::Duration::from_millis(2);
/// First wait before a sweep that gave up is tried again; it doubles up
/// to [`SWEEP_RETRY_MAX`], so a stack stopped for long costs the others a
/// closed gate for [`SWEEP_PATIENCE`] a second at most.
const SWEEP_RETRY: std::time::Duration = std::time::Duration::from_millis(10);
/// Longest wait between tries of a sweep.
const SWEEP_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// Whether the process behind a registered stack's control socket `sock`
/// has exited, its end of file not handled yet: the socket hung up. A
/// process's descriptors close after its memory is released (`do_exit`:
/// `exit_mm` before `exit_files`), and a live stack's pool handle keeps its
/// socket open, so once hung up nothing of it touches the free lists.
fn hung_up_now(sock: &impl AsFd) -> bool {
    // No events asked for: a hang-up or error is reported anyway.
    let mut fds = [PollFd::new(sock, PollFlags::empty())];
    let now = rustix::event::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&now)), Ok(n) if n > 0)
        && fds[0].revents().intersects(PollFlags::HUP | PollFlags::ERR)
}

/// Refuses a run dir another user could write to: one owned by another
/// user than this one or root (anyone can make `/tmp/xio-<uid>` before
/// the user does), or one every user may write to without the sticky bit.
/// Either could swap the manager's socket (or its lock) for its own, and
/// take every stack that attaches.
fn check_run_dir(dir: &std::path::Path) -> Result<(), ManagerError> {
    use std::os::unix::fs::MetadataExt;
    let me = rustix::process::geteuid().as_raw();
    let mut why = None;
    for md in [std::fs::symlink_metadata(dir), std::fs::metadata(dir)] {
        let md = md.map_err(io_err(format!("stat {}", dir.display())))?;
        if md.uid() != me && md.uid() != 0 {
            why = Some(format!(
                "owned by uid {}, not by this user (uid {me}) or root",
                md.uid()
            ));
        } else if !md.file_type().is_symlink() && md.mode() & 0o1002 == 0o002 {
            why = Some("writable by every user (and not sticky)".into());
        }
        if why.is_some() {
            break;
        }
    }
    match why {
        None => Ok(()),
        Some(why) => Err(ManagerError::Io {
            what: format!(
                "run dir {}: {why}; another user could replace the manager's socket \
                 (set XIO_RUN_DIR to a directory of this user's)",
                dir.display()
            ),
            err: io::Error::from(io::ErrorKind::PermissionDenied),
        }),
    }
}

/// A manager's hold on its pool's lock file, `<run dir>/<prefix>.lock`: an
/// exclusive `flock` on the file the path names. Dropped in the process
/// that took it, it unlinks the file while still holding the lock, so a
/// clean stop leaves no file behind (each prefix ever run left one).
///
/// Unlinking a lock file is safe only because taking it checks, once the
/// lock is held, that the path still names the file locked (the dev and
/// inode of the fd and of the path match), and starts over if not: a
/// starter that opened the file just before a stopping manager unlinked
/// it would otherwise lock the unlinked file while a third starter locks
/// the new one, and two managers would run.
struct LockFile {
    fd: CloseOnFork,
    path: PathBuf,
    born: crate::fork::Birth,
}

impl LockFile {
    /// Takes the lock of `path` (creating the file), or `None` when another
    /// manager holds it.
    fn acquire(path: &std::path::Path) -> io::Result<Option<LockFile>> {
        use rustix::fs::{FlockOperation, Mode, OFlags};
        loop {
            let fd = rustix::fs::open(
                path,
                OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )?;
            match rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => {}
                Err(rustix::io::Errno::WOULDBLOCK) => return Ok(None),
                Err(e) => return Err(e.into()),
            }
            let held = rustix::fs::fstat(&fd)?;
            match rustix::fs::stat(path) {
                Ok(named) if same_file(&held, &named) => {
                    return Ok(Some(LockFile {
                        fd: CloseOnFork::new(fd),
                        path: path.to_owned(),
                        born: crate::fork::Birth::now(),
                    }))
                }
                // Unlinked (or replaced) by a manager that stopped between
                // our open and our lock: the lock guards nothing; take the
                // one of the file the path names now.
                Ok(_) | Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            }
        }
    }
}

fn same_file(a: &rustix::fs::Stat, b: &rustix::fs::Stat) -> bool {
    a.st_dev == b.st_dev && a.st_ino == b.st_ino
}

impl Drop for LockFile {
    fn drop(&mut self) {
        // A forked child's copy: the lock is the parent's (the child's fd
        // was pointed at an inert socket, if it was registered).
        if self.born.forked() {
            return;
        }
        // Unlinked while the lock is still held (it is released when the
        // fd closes, after this): a starter that opened this file finds,
        // once it gets the lock, that the path no longer names it. Only if
        // the path still names our file: never another manager's.
        if let (Ok(held), Ok(named)) = (rustix::fs::fstat(&self.fd), rustix::fs::stat(&self.path)) {
            if same_file(&held, &named) {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// A started manager's control socket, `<run dir>/<prefix>.sock`: unlinked
/// when it stops ([`Manager::run`] returns) or is dropped without running,
/// so neither leaves a file nobody listens on, which whoever waits for the
/// socket to appear (a script, a test, a stack retrying) would take for a
/// running manager. As [`LockFile`], only if the path still names the file
/// it bound (dev and inode), and not in a forked child.
struct SocketFile {
    path: PathBuf,
    /// The bound file's `stat`; `None` once removed.
    bound: Option<rustix::fs::Stat>,
    born: crate::fork::Birth,
}

impl SocketFile {
    fn remove(&mut self) {
        // A forked child's copy: the socket is the parent's.
        if self.born.forked() {
            return;
        }
        let Some(bound) = self.bound.take() else {
            return;
        };
        if rustix::fs::stat(&self.path).is_ok_and(|named| same_file(&bound, &named)) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

impl Drop for SocketFile {
    fn drop(&mut self) {
        self.remove();
    }
}

/// The DPDK primary's hugepage files of a prefix (DPDK keeps them for
/// secondaries, and clears them only when a primary of the same prefix
/// starts again): removed when the manager stops ([`Manager::run`]
/// returns), is dropped without running, or fails to start once DPDK
/// made them, so the pages are not left taken, by nobody, after the
/// process exits. Processes that still map them keep their memory until
/// they exit. Not in a forked child (the files are the parent's).
#[cfg(feature = "dpdk")]
struct HugepageFiles {
    prefix: String,
    born: crate::fork::Birth,
}

#[cfg(feature = "dpdk")]
impl Drop for HugepageFiles {
    fn drop(&mut self) {
        if !self.born.forked() {
            crate::dpdk::Eal::remove_hugepage_files(&self.prefix);
        }
    }
}

/// A listening socket's temporary path: removed if the manager fails to
/// start, renamed to the real path once it has.
struct Staged(std::path::PathBuf);

impl Staged {
    fn publish(self, to: &std::path::Path) -> Result<(), ManagerError> {
        let r = std::fs::rename(&self.0, to).map_err(io_err(format!(
            "rename {} to {}",
            self.0.display(),
            to.display()
        )));
        // Renamed, the drop finds nothing to remove; failed, it cleans up.
        drop(self);
        r
    }
}

impl Drop for Staged {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl Manager {
    /// Options for a manager of pool `prefix`.
    pub fn builder(prefix: &str) -> ManagerBuilder {
        ManagerBuilder {
            prefix: prefix.to_owned(),
            pool: PoolConfig::default(),
            backend: Backend::default(),
        }
    }

    fn bind(b: ManagerBuilder) -> Result<Manager, ManagerError> {
        paths::check_prefix(&b.prefix)?;
        let geo = b.pool.geometry().map_err(SegmentError::from)?;
        let dir = paths::run_dir();
        // Made private (only what is missing): the socket in it is one
        // every stack of the user trusts.
        std::os::unix::fs::DirBuilderExt::mode(std::fs::DirBuilder::new().recursive(true), 0o700)
            .create(&dir)
            .map_err(io_err(format!("create {}", dir.display())))?;
        check_run_dir(&dir)?;
        let lock_path = paths::lock_path(&b.prefix);
        let Some(lock) = LockFile::acquire(&lock_path)
            .map_err(io_err(format!("lock {}", lock_path.display())))?
        else {
            let pid = std::fs::read_to_string(&lock_path)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            return Err(ManagerError::AlreadyRunning {
                prefix: b.prefix,
                pid,
                lock: lock_path.display().to_string(),
            });
        };
        let _ = rustix::fs::ftruncate(&lock.fd, 0);
        let _ = rustix::io::pwrite(&lock.fd, format!("{}\n", std::process::id()).as_bytes(), 0);
        let sock_path = paths::socket_path(&b.prefix);
        // We hold the lock, so socket files left here are a dead manager's.
        let _ = std::fs::remove_file(&sock_path);
        // The socket is bound under a temporary name and renamed into place
        // once it listens and the pool exists: whoever waits for the file
        // to appear (a script, a test, a stack retrying) can connect as
        // soon as it does, never in the gap between bind and listen, where
        // a connect is refused.
        let staged = Staged(sock_path.with_extension("sock.new"));
        let _ = std::fs::remove_file(&staged.0);
        let listener =
            ctrl::listen(&staged.0).map_err(io_err(format!("listen on {}", staged.0.display())))?;
        ctrl::set_nonblocking(&listener, true).map_err(io_err("set listener non-blocking"))?;
        #[cfg(feature = "dpdk")]
        let mut rings = Vec::new();
        #[cfg(feature = "dpdk")]
        let mut hugepages = None;
        let (seg, pool) = match b.backend {
            Backend::Shm => {
                let region =
                    Region::create_memfd(&format!("xio-{}", b.prefix), geo.total_len as usize)?;
                let seg = Segment::init(region, &b.pool, &geo)?;
                let pool = MgrPool::Shm(Arc::new(ManagerPool::init(seg.clone())));
                (seg, pool)
            }
            #[cfg(feature = "dpdk")]
            Backend::Dpdk => {
                let (seg, pool, r, files) = Self::dpdk_pool(&b)?;
                rings = r;
                hugepages = Some(files);
                (seg, pool)
            }
            #[cfg(not(feature = "dpdk"))]
            Backend::Dpdk => {
                return Err(ManagerError::Dpdk(
                    "this build has no DPDK support: build with the `dpdk` feature \
                     (cargo build --features dpdk)"
                        .into(),
                ))
            }
        };
        let stop = Arc::new(EventFdDoorbell::new().map_err(io_err("eventfd"))?);
        // The rename keeps the inode: what the path names until someone
        // else's file replaces it.
        let bound = rustix::fs::stat(&staged.0)
            .map_err(|e| io_err(format!("stat {}", staged.0.display()))(e.into()))?;
        staged.publish(&sock_path)?;
        let sock = SocketFile {
            path: sock_path,
            bound: Some(bound),
            born: crate::fork::Birth::now(),
        };
        tracing::info!(
            prefix = %b.prefix,
            socket = %sock.path.display(),
            segment_mib = seg.region().len() >> 20,
            backend = ?b.backend,
            classes = ?b.pool.classes,
            "manager ready"
        );
        Ok(Manager {
            prefix: b.prefix,
            sock,
            _lock: lock,
            listener: CloseOnFork::new(listener),
            channels: (0..seg.max_channels()).map(|_| None).collect(),
            seg,
            pool,
            #[cfg(feature = "dpdk")]
            rings,
            #[cfg(feature = "dpdk")]
            hugepages,
            stop,
            pending: Vec::new(),
            stacks: HashMap::new(),
            dead: HashMap::new(),
            unswept: BTreeMap::new(),
            sweep_retry: None,
            last_id: 0,
            bindings: HashMap::new(),
            outbox_fd_budget: {
                let lim = rustix::process::getrlimit(rustix::process::Resource::Nofile);
                (lim.current.unwrap_or(1 << 20) / OUTBOX_FDS_SHARE) as usize
            },
            snapshot: Arc::new(Mutex::new(Snapshot::default())),
            uid: rustix::process::geteuid().as_raw(),
            accept_paused: None,
            accept_failing: false,
        })
    }

    /// The DPDK backend's objects: joins DPDK as the primary of the
    /// prefix, creates a mempool per class and both rings of every channel
    /// slot, and a segment for the stack slots and channel states whose
    /// class table gives the sizes (one shm buffer per class, unused);
    /// and the guard of the prefix's hugepage files.
    #[cfg(feature = "dpdk")]
    #[allow(clippy::type_complexity)]
    fn dpdk_pool(
        b: &ManagerBuilder,
    ) -> Result<(Segment, MgrPool, Vec<[crate::dpdk::Ring; 2]>, HugepageFiles), ManagerError> {
        use crate::dpdk::{Eal, Role};
        let dpdk = |e: crate::dpdk::DpdkError| ManagerError::Dpdk(e.to_string());
        Eal::init(&b.prefix, Role::Primary).map_err(dpdk)?;
        // The prefix's hugepages are ours now: failing past here (the
        // pool larger than the hugepages left, more rings than DPDK's
        // memzone limit, anything later in `bind`) or dropped without
        // running, the guard removes their files.
        let files = HugepageFiles {
            prefix: b.prefix.clone(),
            born: crate::fork::Birth::now(),
        };
        let (seg, pool, rings) = Self::dpdk_objects(b)?;
        Ok((seg, pool, rings, files))
    }

    /// What [`Self::dpdk_pool`] makes once this process is the primary.
    #[cfg(feature = "dpdk")]
    #[allow(clippy::type_complexity)]
    fn dpdk_objects(
        b: &ManagerBuilder,
    ) -> Result<(Segment, MgrPool, Vec<[crate::dpdk::Ring; 2]>), ManagerError> {
        use crate::dpdk::{mempool_name, ring_name, DpdkPool, Mempool, Ring};
        let dpdk = |e: crate::dpdk::DpdkError| ManagerError::Dpdk(e.to_string());
        let mut shadow = b.pool.clone();
        for c in &mut shadow.classes {
            c.1 = 1;
        }
        let geo = shadow.geometry().map_err(SegmentError::from)?;
        let region = Region::create_memfd(&format!("xio-{}", b.prefix), geo.total_len as usize)?;
        let seg = Segment::init_for(region, &shadow, &geo, crate::layout::backend::DPDK)?;
        let classes = b
            .pool
            .classes
            .iter()
            .enumerate()
            .map(|(c, &(size, n))| Mempool::create(&mempool_name(c), c as u8, n, size as usize))
            .collect::<Result<Vec<_>, _>>()
            .map_err(dpdk)?;
        let rings = (0..b.pool.max_channels)
            .map(|ch| {
                Ok([
                    Ring::create(&ring_name(ch, 0), b.pool.ring_capacity)?,
                    Ring::create(&ring_name(ch, 1), b.pool.ring_capacity)?,
                ])
            })
            .collect::<Result<Vec<_>, crate::dpdk::DpdkError>>()
            .map_err(dpdk)?;
        tracing::info!(prefix = %b.prefix, "dpdk backend: primary, mempools and rings created");
        let pool = MgrPool::Dpdk(Arc::new(DpdkPool::with_segment(classes, 0, seg.clone())));
        Ok((seg, pool, rings))
    }

    /// A handle that makes [`Manager::run`] return.
    pub fn stopper(&self) -> Stopper {
        Stopper(self.stop.clone())
    }

    /// The control socket's path.
    pub fn socket_path(&self) -> &std::path::Path {
        &self.sock.path
    }

    /// Serves until stopped; then removes the socket.
    pub fn run(mut self) -> Result<(), ManagerError> {
        // Sleeping stacks learn of this thread's end, however it ends,
        // through the segment's liveness word (see `crate::liveness`).
        let alive = crate::liveness::Registration::register(&self.seg);
        if alive.is_none() {
            tracing::warn!(
                prefix = %self.prefix,
                "the kernel refused a robust futex list: stacks notice a dead manager within a second"
            );
        }
        let r = self.serve();
        self.sock.remove();
        // Close the stacks' sockets, then mark the word: a stack it wakes
        // finds its control socket closed.
        self.stacks.clear();
        self.pending.clear();
        drop(alive);
        #[cfg(feature = "dpdk")]
        drop(self.hugepages.take());
        tracing::info!(prefix = %self.prefix, "manager stopped");
        r
    }

    fn serve(&mut self) -> Result<(), ManagerError> {
        loop {
            let ids: Vec<u16> = self.stacks.keys().copied().collect();
            let now = std::time::Instant::now();
            let accept_wait = match self.accept_paused {
                Some(until) if until > now => Some(until - now),
                _ => {
                    self.accept_paused = None;
                    None
                }
            };
            let (stop_r, listen_r, pend_r, stack_r) = {
                let mut fds = Vec::with_capacity(2 + self.pending.len() + ids.len());
                fds.push(PollFd::new(&*self.stop, PollFlags::IN));
                let listen = if accept_wait.is_some() {
                    PollFlags::empty()
                } else {
                    PollFlags::IN
                };
                fds.push(PollFd::new(&self.listener, listen));
                for p in &self.pending {
                    fds.push(PollFd::new(p, PollFlags::IN));
                }
                for id in &ids {
                    let e = &self.stacks[id];
                    // A stack with messages waiting for room: only room
                    // (or its hang-up) is of interest until they are out.
                    let want = if e.left && e.drained {
                        // Only its hang-up (reported unasked): its end of
                        // file is read, and would wake every poll.
                        PollFlags::empty()
                    } else if e.left {
                        // What it still sends, to drop (see
                        // `Self::discard_from_left`), and the shutting of
                        // its end.
                        PollFlags::IN | PollFlags::RDHUP
                    } else if e.outbox.is_empty() {
                        PollFlags::IN
                    } else if e.stalled {
                        // Room is not what it waits for (a hang-up is
                        // still reported).
                        PollFlags::empty()
                    } else {
                        PollFlags::OUT
                    };
                    fds.push(PollFd::new(&e.sock, want));
                }
                let stalled = ids.iter().any(|id| self.stacks[id].stalled);
                let sweep = self
                    .sweep_retry
                    .map(|(at, _)| at.saturating_duration_since(std::time::Instant::now()));
                let wait = [stalled.then_some(RETRY_STALLED), accept_wait, sweep]
                    .into_iter()
                    .flatten()
                    .min();
                let limit = wait.map(|w| rustix::event::Timespec {
                    tv_sec: w.as_secs() as _,
                    tv_nsec: w.subsec_nanos() as _,
                });
                match rustix::event::poll(&mut fds, limit.as_ref()) {
                    Ok(_) | Err(rustix::io::Errno::INTR) => {}
                    Err(e) => return Err(io_err("poll")(e.into())),
                }
                let ready = |f: &PollFd<'_>| !f.revents().is_empty();
                let np = self.pending.len();
                (
                    ready(&fds[0]),
                    ready(&fds[1]),
                    fds[2..2 + np].iter().map(ready).collect::<Vec<_>>(),
                    fds[2 + np..]
                        .iter()
                        .map(|f| f.revents())
                        .collect::<Vec<_>>(),
                )
            };
            if stop_r {
                return Ok(());
            }
            // Registered stacks first (ids were captured before polling).
            for (id, ev) in ids.iter().zip(stack_r) {
                let r = !ev.is_empty();
                let hup = ev.intersects(PollFlags::HUP | PollFlags::ERR);
                match self.stacks.get(id) {
                    // Hung up: its process closed the socket (a stack that
                    // leaves only shuts down its writes), so it is dead,
                    // whatever waits either way. Requests it queued before
                    // dying, or after it was cut off, are not read: the
                    // socket gives them before its end of file, and acting
                    // on them would bind addresses and open channels (a
                    // peer's `ChannelUp`, with fds) for a dead process. Its
                    // death settles its channels as its end of file would.
                    // Messages waiting for it would go nowhere (a send to
                    // it may also fail for another reason first,
                    // `ETOOMANYREFS`, and be retried for ever).
                    Some(_) if hup => {
                        let e = self.stacks.remove(id).expect("present");
                        self.on_death(*id, e);
                    }
                    // A stack that left has no outbox and is not served.
                    Some(e) if e.left && r => {
                        self.discard_from_left(*id, ev.contains(PollFlags::RDHUP))
                    }
                    Some(e) if (r || e.stalled) && !e.outbox.is_empty() => self.flush(*id),
                    Some(_) if r => self.on_stack_readable(*id),
                    _ => {}
                }
            }
            // Pending connections, from the back so removal keeps indices.
            for i in (0..pend_r.len()).rev() {
                if pend_r[i] {
                    let sock = self.pending.swap_remove(i);
                    self.on_pending(sock);
                }
            }
            if listen_r {
                self.accept_all();
            }
            self.sweep(false);
            self.publish();
        }
    }

    fn accept_all(&mut self) {
        loop {
            match ctrl::accept(self.listener.as_fd()) {
                Ok(s) => {
                    // Same user (or root) only: one pool per security domain.
                    match ctrl::peer_cred(&s) {
                        Ok(c) if c.uid == self.uid || c.uid == 0 => {}
                        _ => {
                            let _ = ctrl::send_nowait(
                                s.as_fd(),
                                &Msg::Error {
                                    code: ErrorCode::Unexpected,
                                    message: "permission denied: wrong user".into(),
                                },
                                &[],
                            );
                            continue;
                        }
                    }
                    if self.accept_failing {
                        self.accept_failing = false;
                        tracing::info!("accepting connections again");
                    }
                    if self.pending.len() >= MAX_PENDING {
                        // Connections whose client left first: a flood of
                        // connect-and-close must not push out a stack
                        // whose Hello is on its way.
                        self.pending.retain(|p| !hung_up_now(p));
                    }
                    if self.pending.len() >= MAX_PENDING {
                        // Drop the oldest silent connection.
                        self.pending.remove(0);
                    }
                    self.pending.push(CloseOnFork::new(s));
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                // Gone from the queue: nothing to retry.
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e) => {
                    // Once per episode, not per try: it may last.
                    if !self.accept_failing {
                        self.accept_failing = true;
                        tracing::warn!(
                            error = %e,
                            retry_ms = ACCEPT_BACKOFF.as_millis() as u64,
                            "accept failed; new connections wait (registered stacks are still served)"
                        );
                    }
                    self.accept_paused = Some(std::time::Instant::now() + ACCEPT_BACKOFF);
                    return;
                }
            }
        }
    }

    fn bad_message(&self, sock: &impl AsFd, why: String) {
        self.snapshot
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .bad_messages += 1;
        tracing::warn!(reason = %why, "bad control message; closing the connection");
        let _ = ctrl::send_nowait(
            sock.as_fd(),
            &Msg::Error {
                code: ErrorCode::BadMessage,
                message: why,
            },
            &[],
        );
    }

    fn on_pending(&mut self, sock: CloseOnFork) {
        let (msg, _fds) = match ctrl::recv(sock.as_fd(), true) {
            Ok(x) => x,
            Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                self.pending.push(sock);
                return;
            }
            Err(RecvError::Closed) | Err(RecvError::Io(_)) => return,
            Err(RecvError::Proto(p)) => return self.bad_message(&sock, p.to_string()),
        };
        match msg {
            Msg::Hello { pid, name } => self.register(sock, pid, name),
            Msg::Status => {
                let (msg, fd) = self.status_reply();
                let fds: Vec<BorrowedFd<'_>> = fd.iter().map(|f| f.as_fd()).collect();
                let _ = ctrl::send_nowait(sock.as_fd(), &msg, &fds);
            }
            other => self.bad_message(&sock, format!("expected Hello, got {other:?}")),
        }
    }

    fn register(&mut self, sock: CloseOnFork, claimed_pid: u32, name: String) {
        // The name is the stack's to choose and goes into the logs and the
        // status report: no control characters, so it cannot forge lines
        // there or send escape sequences to a terminal.
        let name: String = name
            .chars()
            .map(|c| if c.is_control() { '?' } else { c })
            .collect();
        // None for a stack in a pid namespace the manager cannot see.
        let cred = ctrl::peer_cred(&sock).ok().and_then(|c| c.pid);
        let pid = cred.unwrap_or(claimed_pid);
        // Only a pid the kernel vouched for: a claimed one may name anyone.
        let pidfd = cred
            .and_then(|p| rustix::process::Pid::from_raw(p as i32))
            .and_then(|p| {
                rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
            });
        let max = self.seg.max_stacks();
        let free = (1..=max)
            .map(|k| ((u32::from(self.last_id) + k - 1) % max + 1) as u16)
            .find(|&id| {
                !self.stacks.contains_key(&id)
                    && !self.dead.contains_key(&id)
                    && !self.unswept.contains_key(&id)
                    && self.seg.stack_slot(id).state.load(Ordering::Acquire) == slot_state::FREE
            });
        let Some(id) = free else {
            let _ = ctrl::send_nowait(
                sock.as_fd(),
                &Msg::Error {
                    code: ErrorCode::NoSpace,
                    message: "no free stack slot".into(),
                },
                &[],
            );
            return;
        };
        let bell = match EventFdDoorbell::new() {
            Ok(b) => b,
            Err(e) => {
                // Out of fds, most likely: say so, rather than leave the
                // stack to find a closed socket.
                tracing::error!(error = %e, "eventfd for a new stack");
                let _ = ctrl::send_nowait(
                    sock.as_fd(),
                    &Msg::Error {
                        code: ErrorCode::NoSpace,
                        message: format!("the manager could not make a doorbell: {e}"),
                    },
                    &[],
                );
                return;
            }
        };
        let slot = self.seg.stack_slot(id);
        slot.sleeping.store(0, Ordering::Relaxed);
        slot.cpu.store(0, Ordering::Relaxed);
        slot.intent.store(0, Ordering::Relaxed);
        // The counters the status report shows are the newcomer's own,
        // not those of the stack that had the id before.
        slot.sleeps.store(0, Ordering::Relaxed);
        slot.corrupt.store(0, Ordering::Relaxed);
        slot.rung_at.store(0, Ordering::Relaxed);
        slot.pid.store(pid, Ordering::Relaxed);
        slot.state.store(slot_state::ACTIVE, Ordering::Release);
        let seg_fd = self.seg.region().fd().expect("manager segments are memfds");
        // A new socket's buffer is empty: this does not find it full.
        if let Err(e) = ctrl::send_nowait(
            sock.as_fd(),
            &Msg::Welcome { stack_id: id },
            &[seg_fd, bell.fd()],
        ) {
            tracing::warn!(error = %e, "could not answer Hello");
            slot.state.store(slot_state::FREE, Ordering::Release);
            return;
        }
        tracing::info!(stack = id, pid, name = %name, "stack registered");
        self.last_id = id;
        self.stacks.insert(
            id,
            StackEntry {
                sock,
                pid,
                name,
                bell,
                pidfd,
                addrs: BTreeSet::new(),
                peers: HashMap::new(),
                outbox: VecDeque::new(),
                outbox_fds: 0,
                stalled: false,
                left: false,
                bad: false,
                drained: false,
            },
        );
    }

    /// What a stack receives with a channel to `peer`: its pidfd if there
    /// is one, then its doorbell, last (where stacks before the pidfd took
    /// it from).
    fn peer_fds(&self, peer: u16) -> Vec<BorrowedFd<'_>> {
        let e = &self.stacks[&peer];
        e.pidfd
            .as_ref()
            .map(|f| f.as_fd())
            .into_iter()
            .chain(std::iter::once(e.bell.fd()))
            .collect()
    }

    fn on_stack_readable(&mut self, id: u16) {
        let r = ctrl::recv(self.stacks[&id].sock.as_fd(), true);
        let msg = match r {
            Ok((m, _)) => m,
            Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => return,
            Err(RecvError::Proto(p)) => {
                self.bad_message(&self.stacks[&id].sock, p.to_string());
                return self.cut_off_for_bad_message(id);
            }
            Err(_) => return self.cut_off(id),
        };
        let reply = match msg {
            Msg::Bind { addr } => self.bind_addr(id, addr),
            Msg::Unbind { addr } => {
                if self.bindings.get(&addr) == Some(&id) {
                    self.bindings.remove(&addr);
                    self.stacks
                        .get_mut(&id)
                        .expect("present")
                        .addrs
                        .remove(&addr);
                }
                Some(Msg::Ok)
            }
            Msg::Connect { addr } => {
                self.connect(id, addr);
                return;
            }
            Msg::ChannelReleased { channel } => {
                self.released(id, channel);
                None
            }
            Msg::Status => {
                let (msg, fd) = self.status_reply();
                return self.deliver_owned(id, msg, fd.into_iter().collect());
            }
            other => {
                self.bad_message(
                    &self.stacks[&id].sock,
                    format!("unexpected {other:?} from a registered stack"),
                );
                return self.cut_off_for_bad_message(id);
            }
        };
        if let Some(m) = reply {
            self.deliver(id, m, None);
        }
    }

    /// Sends `msg` to stack `to` without waiting, with the fds of stack
    /// `fds_of` (a channel's peer) if any, then rings it: a stack that
    /// stopped waiting for a reply (its request timed out) reads it when it
    /// sees the bump. If the socket is full, or older messages wait, the
    /// message joins the stack's outbox, its fds duplicated, and goes when
    /// the socket has room ([`Self::flush`]).
    fn deliver(&mut self, to: u16, msg: Msg, fds_of: Option<u16>) {
        let fds = fds_of.map(|p| self.peer_fds(p)).unwrap_or_default();
        let stalled = match self.try_send(to, &msg, &fds) {
            Sent::Done | Sent::Gone => return,
            Sent::Queue { stalled } => stalled,
        };
        let owned: io::Result<Vec<OwnedFd>> = fds.iter().map(|f| f.try_clone_to_owned()).collect();
        let owned = owned.unwrap_or_else(|err| {
            // Out of fds. It goes without them (the stack then fails the
            // channel, or the request, for want of them) rather than not
            // at all, which would put its replies out of step.
            tracing::error!(stack = to, error = %err, ?msg, "no fd left to queue a control message's fds");
            Vec::new()
        });
        self.enqueue(to, msg, owned, stalled);
    }

    /// [`Self::deliver`] with fds of the manager's own (a status report's
    /// memfd), which are queued as they are if they cannot go at once.
    fn deliver_owned(&mut self, to: u16, msg: Msg, fds: Vec<OwnedFd>) {
        let borrowed: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
        let stalled = match self.try_send(to, &msg, &borrowed) {
            Sent::Done | Sent::Gone => return,
            Sent::Queue { stalled } => stalled,
        };
        self.enqueue(to, msg, fds, stalled);
    }

    /// Sends `msg` to stack `to` now if nothing waits before it, and rings
    /// it if it went.
    fn try_send(&self, to: u16, msg: &Msg, fds: &[BorrowedFd<'_>]) -> Sent {
        let Some(e) = self.stacks.get(&to) else {
            return Sent::Gone;
        };
        if !e.outbox.is_empty() {
            return Sent::Queue { stalled: false };
        }
        match ctrl::send_nowait(e.sock.as_fd(), msg, fds) {
            Ok(()) => {
                self.notify(to);
                Sent::Done
            }
            Err(err) if err.kind() == io::ErrorKind::WouldBlock => Sent::Queue { stalled: false },
            // A stack that is gone: the loop reads its end of file.
            Err(err) if hung_up(&err) => Sent::Gone,
            Err(err) => {
                tracing::debug!(stack = to, error = %err, "control message refused; retrying");
                Sent::Queue { stalled: true }
            }
        }
    }

    /// Puts `msg` at the end of stack `to`'s outbox.
    fn enqueue(&mut self, to: u16, msg: Msg, fds: Vec<OwnedFd>, stalled: bool) {
        let Some(e) = self.stacks.get_mut(&to) else {
            return;
        };
        e.outbox_fds += fds.len();
        e.outbox.push_back((msg, fds));
        e.stalled |= stalled;
        if e.outbox.len() == 1 {
            tracing::debug!(stack = to, "control socket full; queueing");
        }
    }

    /// Whether the messages queued for stack `id` hold as many fds as
    /// they may (its own share, or all stacks' together): it gets no new
    /// channel until it reads.
    fn outbox_full(&self, id: u16) -> bool {
        let total = || -> usize { self.stacks.values().map(|e| e.outbox_fds).sum() };
        self.stacks.get(&id).is_some_and(|e| {
            !e.outbox.is_empty()
                && (e.outbox_fds + 2 > MAX_OUTBOX_FDS || total() + 2 > self.outbox_fd_budget)
        })
    }

    /// Sends what waits in stack `id`'s outbox, as far as its socket has
    /// room, and rings it if anything went.
    fn flush(&mut self, id: u16) {
        let Some(e) = self.stacks.get_mut(&id) else {
            return;
        };
        let mut sent = false;
        e.stalled = false;
        while let Some((msg, fds)) = e.outbox.front() {
            let fds: Vec<BorrowedFd<'_>> = fds.iter().map(|f| f.as_fd()).collect();
            match ctrl::send_nowait(e.sock.as_fd(), msg, &fds) {
                Ok(()) => {
                    if let Some((_, fds)) = e.outbox.pop_front() {
                        e.outbox_fds -= fds.len();
                    }
                    sent = true;
                }
                Err(err) if err.kind() == io::ErrorKind::Interrupted => {}
                Err(err) if err.kind() == io::ErrorKind::WouldBlock => break,
                Err(err) if hung_up(&err) => {
                    // Gone, with whatever it had not read.
                    let e = self.stacks.remove(&id).expect("present");
                    return self.on_death(id, e);
                }
                Err(err) => {
                    tracing::debug!(stack = id, error = %err, "control message refused; retrying");
                    e.stalled = true;
                    break;
                }
            }
        }
        if sent {
            self.notify(id);
        }
    }

    fn bind_addr(&mut self, id: u16, addr: SocketAddr) -> Option<Msg> {
        // A holder whose process is gone, its end of file not read yet
        // (this same pass of the loop, or requests of its own still
        // waiting to be read before it): its death is handled now, and
        // its addresses are free. What it sent that is not read yet
        // needs no answer: its death settles its channels (released or
        // not) as it would at its end of file.
        if let Some(&other) = self.bindings.get(&addr) {
            if other != id
                && self
                    .stacks
                    .get(&other)
                    .is_some_and(|e| hung_up_now(&e.sock))
            {
                let e = self.stacks.remove(&other).expect("present");
                self.on_death(other, e);
            }
        }
        match self.bindings.get(&addr) {
            Some(&other) if other != id => Some(Msg::Error {
                code: ErrorCode::AddrInUse,
                message: match self.stacks.get(&other) {
                    Some(e) => format!(
                        "{addr} is bound by process {} ({}, stack {other})",
                        e.pid, e.name
                    ),
                    None => format!("{addr} is bound by stack {other}"),
                },
            }),
            None if self.stacks[&id].addrs.len() >= MAX_BINDINGS_PER_STACK => Some(Msg::Error {
                code: ErrorCode::NoSpace,
                message: format!(
                    "this stack holds {MAX_BINDINGS_PER_STACK} addresses bound, the most it may"
                ),
            }),
            _ => {
                self.bindings.insert(addr, id);
                self.stacks
                    .get_mut(&id)
                    .expect("present")
                    .addrs
                    .insert(addr);
                tracing::info!(stack = id, %addr, "bound");
                Some(Msg::Ok)
            }
        }
    }

    /// The stack bound to `addr`: exactly, or through a wildcard binding
    /// of its port when `addr` is one of this node's (see [`crate::addr`]).
    fn lookup(&self, addr: SocketAddr) -> Option<u16> {
        let bound = |a: SocketAddr| self.bindings.get(&a).copied();
        if let Some(b) = crate::addr::exact_names(addr).find_map(bound) {
            return Some(b);
        }
        let b = crate::addr::wildcards(addr).find_map(bound)?;
        crate::addr::is_this_node(addr.ip()).then_some(b)
    }

    fn notify(&self, id: u16) {
        // Sent first, then the sequence bump, then the wake-up: a stack that
        // sees the bump finds the message already queued.
        let slot = self.seg.stack_slot(id);
        slot.ctrl_seq.fetch_add(1, Ordering::SeqCst);
        // Wake it however it sleeps (futex or doorbell); both are harmless
        // when it is awake. Storing 0 also makes a FUTEX_WAIT that has not
        // started yet return at once.
        slot.sleeping.store(0, Ordering::SeqCst);
        crate::sync::futex_wake(&slot.sleeping);
        if let Some(e) = self.stacks.get(&id) {
            let _ = e.bell.ring();
        }
    }

    fn connect(&mut self, a: u16, addr: SocketAddr) {
        let reply = |m: &mut Self, msg: Msg| m.deliver(a, msg, None);
        // A holder whose process is gone, its hang-up not handled yet
        // (later in this same pass of the loop): its death is handled
        // now, as `bind_addr` does, and the address looked up again. A
        // channel to it would hand `a` a dead stack's fds and then a
        // reset, where a refusal lets it try another address, or TCP.
        let b = match self.lookup(addr) {
            Some(b) if b != a && self.stacks.get(&b).is_some_and(|e| hung_up_now(&e.sock)) => {
                let e = self.stacks.remove(&b).expect("present");
                self.on_death(b, e);
                self.lookup(addr)
            }
            b => b,
        };
        let Some(b) = b else {
            let msg = Msg::Error {
                code: ErrorCode::ConnectionRefused,
                message: format!("nothing is bound to {addr}"),
            };
            return reply(self, msg);
        };
        if b == a {
            let msg = Msg::Error {
                code: ErrorCode::ConnectionRefused,
                message: format!("{addr} is bound by this same stack"),
            };
            return reply(self, msg);
        }
        if !self.stacks[&a].peers.contains_key(&b) && self.outbox_full(b) {
            let e = &self.stacks[&b];
            tracing::warn!(stack = b, pid = e.pid, name = %e.name, %addr, "a new channel refused: the stack is not reading its control socket");
            // Busy, not ConnectionRefused: `a` must not take it for the
            // refusal of an address only its own wildcard binding covers.
            let msg = Msg::Error {
                code: ErrorCode::Busy,
                message: format!(
                    "{addr} is bound by process {} ({}), which is not reading its control socket",
                    e.pid, e.name
                ),
            };
            return reply(self, msg);
        }
        if let Some(&ch) = self.stacks[&a].peers.get(&b) {
            let (dir, _) = self.dir_of(ch, a);
            let msg = Msg::Connected {
                channel: ch,
                dir,
                peer: b,
                existing: true,
            };
            return self.deliver(a, msg, Some(b));
        }
        let Some(ch) = self.channels.iter().position(|c| c.is_none()) else {
            let msg = Msg::Error {
                code: ErrorCode::NoSpace,
                message: "no free channel slot".into(),
            };
            return reply(self, msg);
        };
        let ch = ch as u32;
        self.seg.reset_channel_rings(ch);
        #[cfg(feature = "dpdk")]
        if let Some(r) = self.rings.get(ch as usize) {
            // Stale descriptors of the slot's last channel go; their
            // buffers were reclaimed by owner.
            // SAFETY: the slot is free: no stack has its channel (both
            // ends released it or died), and none gets it before the
            // `ACTIVE` store below.
            unsafe {
                r[0].reset();
                r[1].reset();
            }
        }
        let hdr = self.seg.channel(ch);
        // Release: the ring resets above happen before either end can see
        // the channel active.
        hdr.state.store(chan_state::ACTIVE, Ordering::Release);
        self.channels[ch as usize] = Some(ChanEntry {
            a,
            b,
            closing: None,
        });
        self.stacks
            .get_mut(&a)
            .expect("present")
            .peers
            .insert(b, ch);
        self.stacks
            .get_mut(&b)
            .expect("present")
            .peers
            .insert(a, ch);
        // Tell b first, so its channel exists before a's first descriptor.
        let up = Msg::ChannelUp {
            channel: ch,
            dir: 1,
            peer: a,
        };
        self.deliver(b, up, Some(a));
        let msg = Msg::Connected {
            channel: ch,
            dir: 0,
            peer: b,
            existing: false,
        };
        self.deliver(a, msg, Some(b));
        tracing::info!(channel = ch, a, b, %addr, "channel up");
    }

    fn dir_of(&self, ch: u32, id: u16) -> (u8, u16) {
        let c = self.channels[ch as usize].as_ref().expect("live channel");
        if c.a == id {
            (0, c.b)
        } else {
            (1, c.a)
        }
    }

    /// Stops serving registered stack `id`, whose socket ended (or failed,
    /// or brought a message it had no business sending). Its death if its
    /// process has closed the socket; otherwise the process lives on, may
    /// hold buffers of the stack and be inside a free-list operation, so
    /// it only leaves ([`Self::on_leave`]) until the socket closes. (A
    /// malformed message used to end it as a death at once: its buffers,
    /// still in use, went back to the pool, and the sweep rebuilt the free
    /// lists without waiting for its operations.)
    fn cut_off(&mut self, id: u16) {
        if hung_up_now(&self.stacks[&id].sock) {
            let e = self.stacks.remove(&id).expect("present");
            self.on_death(id, e);
        } else {
            self.on_leave(id);
        }
    }

    /// [`Self::cut_off`] for a malformed or unexpected message, noted for
    /// the status report (which otherwise shows a stack that left).
    fn cut_off_for_bad_message(&mut self, id: u16) {
        if let Some(e) = self.stacks.get_mut(&id) {
            e.bad = true;
        }
        self.cut_off(id);
    }

    /// Reads and drops what stack `id`, which left (or was cut off) while
    /// its process holds its socket, sent since: nothing of it is acted
    /// on, but left unread, a packet's fds stay open, and one may be the
    /// stack's own socket, which would then never hang up once its
    /// process closes it (its slot taken until the manager stops).
    /// `shut`: its end is shut for writing, so nothing more comes once
    /// the end of file is read. Once its end is shut, an empty packet
    /// reads as the end of file too: one sent before more packets, then
    /// the shutdown, leaves those unread, as a process may keep its socket
    /// open; a stack never sends one. The reads are bounded per pass (the
    /// loop serves the others).
    fn discard_from_left(&mut self, id: u16, shut: bool) {
        const MOST: usize = 256;
        let Some(e) = self.stacks.get_mut(&id) else {
            return;
        };
        for _ in 0..MOST {
            match ctrl::recv_raw(e.sock.as_fd(), true) {
                // Dropped, fds and all.
                Ok(_) | Err(RecvError::Proto(_)) => {}
                Err(RecvError::Closed) if shut => {
                    e.drained = true;
                    return;
                }
                // An end of file that came after the poll: the next one
                // reports the shutdown.
                Err(RecvError::Closed) => {}
                Err(RecvError::Io(err)) if err.kind() == io::ErrorKind::Interrupted => {}
                // Nothing waits (or the socket failed: its hang-up follows).
                Err(RecvError::Io(_)) => return,
            }
        }
    }

    /// Stack `id` left (dropped) while its process still holds its socket
    /// open, for a buffer of it that lives on. Its peers are reset and its
    /// addresses freed as at a death; its buffers, which the process may
    /// still use, and its slot wait for the socket to close (then
    /// [`Self::on_death`]). Until then it counts as live for the sweeps:
    /// freeing those buffers takes the free lists.
    fn on_leave(&mut self, id: u16) {
        let Some(e) = self.stacks.get_mut(&id) else {
            return;
        };
        if e.left {
            return;
        }
        e.left = true;
        // Nobody will read what waits for it.
        e.outbox.clear();
        e.outbox_fds = 0;
        e.stalled = false;
        let addrs = std::mem::take(&mut e.addrs);
        let peers = std::mem::take(&mut e.peers);
        for addr in &addrs {
            if self.bindings.get(addr) == Some(&id) {
                self.bindings.remove(addr);
            }
        }
        for (peer, ch) in peers {
            // Release: pairs with the Acquire loads in the peer's send path.
            self.seg
                .channel(ch)
                .state
                .store(chan_state::CLOSED, Ordering::Release);
            match self.stacks.get_mut(&peer) {
                Some(p) => {
                    p.peers.remove(&id);
                    self.deliver(
                        peer,
                        Msg::PeerDown {
                            channel: ch,
                            peer: id,
                        },
                        None,
                    );
                    if let Some(c) = self.channels[ch as usize].as_mut() {
                        c.closing = Some((peer, id));
                    }
                }
                None => self.free_channel(ch),
            }
        }
        tracing::info!(
            stack = id,
            "stack left; its buffers are reclaimed once its process lets go of them"
        );
        // The releases it owed (a dead peer's channels) will not come.
        self.settle_closing(|_, live| live == id);
    }

    fn on_death(&mut self, id: u16, e: StackEntry) {
        self.seg
            .stack_slot(id)
            .state
            .store(slot_state::DEAD, Ordering::Release);
        for addr in &e.addrs {
            if self.bindings.get(addr) == Some(&id) {
                self.bindings.remove(addr);
            }
        }
        let mut waiting = BTreeSet::new();
        for (&peer, &ch) in &e.peers {
            // Release: pairs with the Acquire loads in the peer's send path.
            self.seg
                .channel(ch)
                .state
                .store(chan_state::CLOSED, Ordering::Release);
            if let Some(p) = self.stacks.get_mut(&peer) {
                p.peers.remove(&id);
                let down = Msg::PeerDown {
                    channel: ch,
                    peer: id,
                };
                self.deliver(peer, down, None);
                if let Some(c) = self.channels[ch as usize].as_mut() {
                    c.closing = Some((peer, id));
                }
                waiting.insert(ch);
            } else {
                self.free_channel(ch);
            }
        }
        // And those it let go of while alive (it left, or gave one up)
        // whose other end has not released them yet: their rings may still
        // hold its descriptors, and its id must name nobody else meanwhile.
        for (ch, c) in self.channels.iter().enumerate() {
            if let Some(ChanEntry {
                closing: Some((live, dead)),
                ..
            }) = c
            {
                if *dead == id && self.stacks.contains_key(live) {
                    waiting.insert(ch as u32);
                }
            }
        }
        tracing::info!(stack = id, pid = e.pid, name = %e.name, peers_reset = waiting.len(), "stack left");
        // Its slot is free after the last sweep, once every peer let go of
        // its channels (now, if it had none).
        let last = waiting.is_empty();
        if !last {
            self.dead.insert(id, waiting);
        }
        self.owe_sweep(id, Owed { first: true, last });
        // The channels it was to release (their other end died, or gave
        // them up): nobody will now. Settled at once, not left for the
        // loop to find: a newcomer registered in this same pass may get
        // its id, and would be taken for the end that owes the release.
        self.settle_closing(|_, live| live == id);
    }

    /// Frees the closing channels (a dead peer's, waiting for the release
    /// of their live end) whose live end `gone` says will never release
    /// them, and finishes their dead end's reclaim.
    fn settle_closing(&mut self, gone: impl Fn(&Self, u16) -> bool) {
        let settled: Vec<(u32, u16)> = self
            .channels
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                let (live, dead) = c.as_ref()?.closing?;
                gone(self, live).then_some((i as u32, dead))
            })
            .collect();
        for (ch, dead) in settled {
            self.free_channel(ch);
            self.finish_dead(dead, ch);
        }
    }

    /// Records that dead stack `id` is owed `what`, and sweeps at once.
    fn owe_sweep(&mut self, id: u16, what: Owed) {
        let o = self.unswept.entry(id).or_default();
        o.first |= what.first;
        o.last |= what.last;
        self.sweep(true);
    }

    /// Gives back what the dead stacks in `unswept` held, all in one pass
    /// over the pool (`force`: even if a retry is not due yet).
    ///
    /// Stacks still registered whose sockets hung up (their end of file
    /// not read yet: two died at once) are not waited for; a live stack
    /// inside a free-list operation is, for [`SWEEP_PATIENCE`]. Past that
    /// (it is stopped, say) the sweep is put off and tried again from the
    /// loop: the manager never waits on one stack. Meanwhile the dead
    /// stacks' buffers stay out of the pool and their slots stay taken
    /// (reusing an id before its buffers are back would hand them to the
    /// newcomer).
    fn sweep(&mut self, force: bool) {
        if self.unswept.is_empty() {
            self.sweep_retry = None;
            return;
        }
        let now = std::time::Instant::now();
        if !force && self.sweep_retry.is_some_and(|(at, _)| now < at) {
            return;
        }
        let dead: Vec<u16> = self.unswept.keys().copied().collect();
        let live: Vec<u16> = self.stacks.keys().copied().collect();
        // Asked at each try, not when the sweep was owed: a peer that has
        // released its channels with a dead stack since (drained its rings)
        // is a reader no more, so a retried first sweep, or the last one,
        // takes back what the dead stack stamped for it and never pushed.
        let readers: Vec<(u16, u16)> = dead
            .iter()
            .flat_map(|&d| self.readers_of(d).into_iter().map(move |r| (d, r)))
            .collect();
        let stacks = &self.stacks;
        let gone = |id: u16| stacks.get(&id).is_none_or(|e| hung_up_now(&e.sock));
        let r = match self.pool.reclaim(&dead, &live, &readers, gone) {
            Ok(r) => r,
            Err(Busy(busy)) => {
                let wait = self.sweep_retry.map_or(SWEEP_RETRY, |(_, w)| w);
                if self.sweep_retry.is_none() {
                    tracing::warn!(
                        stack = busy,
                        dead = ?dead,
                        "a live stack stays inside a free-list operation (stopped?): \
                         reclaiming the dead stacks' buffers later"
                    );
                }
                self.sweep_retry = Some((now + wait, (wait * 2).min(SWEEP_RETRY_MAX)));
                return;
            }
        };
        self.sweep_retry = None;
        let owed = std::mem::take(&mut self.unswept);
        if r.owned + r.lost > 0 {
            tracing::info!(
                stacks = ?dead,
                reclaimed = r.owned,
                lost_and_found = r.lost,
                "reclaimed the buffers dead stacks held"
            );
        }
        {
            let mut s = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
            s.deaths += owed.values().filter(|o| o.first).count() as u64;
            s.reclaimed += u64::from(r.owned + r.lost);
        }
        for (id, o) in owed {
            if o.last {
                self.seg
                    .stack_slot(id)
                    .state
                    .store(slot_state::FREE, Ordering::Release);
            }
        }
    }

    /// The stacks that may still read a ring from `dead`: the other ends of
    /// its channels not yet released (and so not yet drained). What `dead`
    /// stamped in flight to them is left to the sweep after they release.
    fn readers_of(&self, dead: u16) -> Vec<u16> {
        self.channels
            .iter()
            .flatten()
            .filter_map(|c| match (c.a == dead, c.b == dead) {
                (true, _) => Some(c.b),
                (_, true) => Some(c.a),
                _ => None,
            })
            .collect()
    }

    fn free_channel(&mut self, ch: u32) {
        self.seg
            .channel(ch)
            .state
            .store(chan_state::FREE, Ordering::Release);
        self.channels[ch as usize] = None;
    }

    /// A live stack is done with a channel: one whose other end died, or
    /// one it gave up while both ends live (it found the ring from the
    /// other end corrupt, or could not set the channel up: its fds did not
    /// reach it). The latter is closed for the other end too,
    /// as a death would close it, and freed once that end is done.
    fn released(&mut self, by: u16, ch: u32) {
        let Some(Some(c)) = self.channels.get_mut(ch as usize) else {
            return;
        };
        let Some((live, dead)) = c.closing else {
            if by != c.a && by != c.b {
                return; // not its channel
            }
            let other = if by == c.a { c.b } else { c.a };
            // Release: pairs with the Acquire loads in both ends' send paths.
            self.seg
                .channel(ch)
                .state
                .store(chan_state::CLOSED, Ordering::Release);
            c.closing = Some((other, by));
            if let Some(e) = self.stacks.get_mut(&by) {
                e.peers.remove(&other);
            }
            tracing::warn!(
                stack = by,
                peer = other,
                channel = ch,
                "channel given up (a corrupt ring, or one it could not set up): reset both ends"
            );
            match self.stacks.get_mut(&other) {
                Some(e) => {
                    e.peers.remove(&by);
                    self.deliver(
                        other,
                        Msg::PeerDown {
                            channel: ch,
                            peer: by,
                        },
                        None,
                    );
                }
                None => self.free_channel(ch),
            }
            return;
        };
        if live != by {
            return;
        }
        self.free_channel(ch);
        self.finish_dead(dead, ch);
    }

    fn finish_dead(&mut self, dead: u16, ch: u32) {
        let Some(w) = self.dead.get_mut(&dead) else {
            return;
        };
        w.remove(&ch);
        if w.is_empty() {
            self.dead.remove(&dead);
            // Second sweep: a peer may have sent to the dead stack between
            // our first sweep and its noticing the channel closed. And the
            // peers have drained and released its rings, so what it stamped
            // for them but never pushed (it died in between) is found now
            // (`sweep` asks `readers_of` afresh at each try: none are left).
            self.owe_sweep(
                dead,
                Owed {
                    first: false,
                    last: true,
                },
            );
        }
    }

    fn publish(&mut self) {
        // Live stacks that died while a dead peer's channel waited on them.
        self.settle_closing(|m, live| !m.stacks.contains_key(&live));
        let mut s = self.snapshot.lock().unwrap_or_else(|e| e.into_inner());
        s.unswept = self.unswept.len();
        s.stacks = self
            .stacks
            .iter()
            .map(|(&id, e)| StackInfo {
                id,
                pid: e.pid,
                name: e.name.clone(),
                addrs: e.addrs.iter().copied().collect(),
                queued: e.outbox.len(),
            })
            .collect();
        s.stacks.sort_by_key(|s| s.id);
        s.channels = self
            .channels
            .iter()
            .enumerate()
            .filter_map(|(i, c)| {
                c.as_ref()
                    .filter(|c| c.closing.is_none())
                    .map(|c| (i as u32, c.a, c.b))
            })
            .collect();
    }

    /// The status report as a reply: inline if it fits a packet, else in
    /// a sealed memfd. Without a memfd (out of fds, say) it goes inline
    /// cut short, and says so.
    fn status_reply(&self) -> (Msg, Option<OwnedFd>) {
        let mut text = self.status_text();
        if text.len() <= MAX_STATUS_INLINE {
            return (Msg::StatusReply { text }, None);
        }
        let whole = text.len();
        if whole > MAX_STATUS {
            cut(&mut text, MAX_STATUS - 100);
            text += &format!("... (report cut at {} of {whole} bytes)\n", text.len());
        }
        match ctrl::sealed_memfd("xio-status", text.as_bytes()) {
            Ok(fd) => (
                Msg::StatusReplyFd {
                    len: text.len() as u32,
                },
                Some(fd),
            ),
            Err(e) => {
                tracing::warn!(error = %e, "no memfd for a long status report; sending it cut");
                let note = format!(
                    "... (report cut: the manager has no memfd for its {whole} bytes: {e})\n"
                );
                cut(&mut text, MAX_STATUS_INLINE.saturating_sub(note.len()));
                text += &note;
                (Msg::StatusReply { text }, None)
            }
        }
    }

    fn status_text(&self) -> String {
        use std::fmt::Write;
        let mut t = String::new();
        // Dead stacks whose slots are not free yet (peers still to let go
        // of their channels, or buffers still to reclaim): a newcomer
        // cannot have them, so the count says so.
        let dead: BTreeSet<u16> = self
            .dead
            .keys()
            .chain(self.unswept.keys())
            .copied()
            .collect();
        let held = if dead.is_empty() {
            String::new()
        } else {
            format!(" (+{} dead, slots not free yet)", dead.len())
        };
        let _ = writeln!(
            t,
            "pool {}: {} MiB segment, {}/{} stacks{held}, {}/{} channels",
            self.prefix,
            self.seg.region().len() >> 20,
            self.stacks.len(),
            self.seg.max_stacks(),
            self.channels.iter().filter(|c| c.is_some()).count(),
            self.seg.max_channels()
        );
        let usage = self.pool.usage();
        let mut ids: Vec<_> = self.stacks.keys().copied().collect();
        ids.sort_unstable();
        let _ = writeln!(t, "stacks:");
        for id in ids {
            let e = &self.stacks[&id];
            let slot = self.seg.stack_slot(id);
            let held: u32 = usage
                .iter()
                .flat_map(|u| u.by_owner.iter())
                .filter(|(o, _)| *o == id)
                .map(|(_, n)| n)
                .sum();
            let addrs: Vec<String> = e.addrs.iter().map(|a| a.to_string()).collect();
            let _ = writeln!(
                t,
                "  stack {id:<4} pid {:<8} {:<16} buffers {held:<6} channels {:<3} sleeps {:<8} corrupt {:<4} bound [{}]",
                e.pid,
                e.name,
                e.peers.len(),
                slot.sleeps.load(Ordering::Relaxed),
                slot.corrupt.load(Ordering::Relaxed),
                addrs.join(", ")
            );
            if e.left && e.bad {
                let _ = writeln!(
                    t,
                    "             cut off after a bad control message: its buffers come back when its process lets go of them"
                );
            } else if e.left {
                let _ = writeln!(
                    t,
                    "             left: its buffers come back when its process lets go of them"
                );
            } else if !e.outbox.is_empty() {
                let _ = writeln!(
                    t,
                    "             not reading its control socket: {} messages wait",
                    e.outbox.len()
                );
            }
        }
        if !self.dead.is_empty() {
            let ids: Vec<String> = self.dead.keys().map(|id| id.to_string()).collect();
            let _ = writeln!(
                t,
                "  dead, slot kept until its peers release their channels: {}",
                ids.join(", ")
            );
        }
        if !self.unswept.is_empty() {
            let ids: Vec<String> = self.unswept.keys().map(|id| id.to_string()).collect();
            let _ = writeln!(
                t,
                "  dead, buffers not reclaimed yet (a live stack stays inside a free-list operation): {}",
                ids.join(", ")
            );
        }
        let _ = writeln!(t, "channels:");
        for (i, c) in self.channels.iter().enumerate() {
            if let Some(c) = c {
                let state = if c.closing.is_some() {
                    "closing"
                } else {
                    "open"
                };
                let _ = writeln!(
                    t,
                    "  channel {i:<4} stack {} <-> stack {} ({state})",
                    c.a, c.b
                );
            }
        }
        let _ = writeln!(t, "buffers:");
        for u in usage {
            let owners: Vec<String> = u
                .by_owner
                .iter()
                .map(|(o, n)| format!("stack {o}: {n}"))
                .collect();
            let _ = writeln!(
                t,
                "  class {:>8} B: {:>6} total, {:>6} free, {:>6} in use{}{}",
                u.buf_size,
                u.total,
                u.free,
                u.total - u.free,
                if owners.is_empty() { "" } else { " (" },
                if owners.is_empty() {
                    String::new()
                } else {
                    owners.join(", ") + ")"
                }
            );
        }
        t
    }
}

/// Asks the manager of `prefix` for its status report (what
/// `xio-manager status` prints), waiting at most the control timeout
/// (`$XIO_CONTROL_TIMEOUT_MS`, else 5 s; see [`query_status_within`]).
pub fn query_status(prefix: &str) -> Result<String, crate::stack::Error> {
    query_status_within(prefix, crate::stack::default_control_timeout()?)
}

/// [`query_status`], waiting at most `timeout` for the manager to take the
/// connection and to answer: a manager that is stopped (SIGSTOP, a
/// debugger) or stuck gives [`Error::ManagerUnresponsive`] (`TimedOut`).
///
/// [`Error::ManagerUnresponsive`]: crate::stack::Error::ManagerUnresponsive
pub fn query_status_within(
    prefix: &str,
    timeout: std::time::Duration,
) -> Result<String, crate::stack::Error> {
    use crate::stack::Error;
    let deadline = std::time::Instant::now().checked_add(timeout);
    paths::check_prefix(prefix)?;
    let path = paths::socket_path(prefix);
    let sock = ctrl::connect_within(&path, timeout).map_err(|err| match err.kind() {
        io::ErrorKind::TimedOut => Error::ManagerUnresponsive(timeout),
        _ => Error::NoManager {
            prefix: prefix.to_owned(),
            path: path.display().to_string(),
            err,
        },
    })?;
    // A new socket's buffer is empty: this does not wait.
    ctrl::send_nowait(sock.as_fd(), &Msg::Status, &[])?;
    match ctrl::recv_until(sock.as_fd(), deadline) {
        Ok((msg, fds)) => status_from_reply(msg, fds),
        Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::TimedOut => {
            Err(Error::ManagerUnresponsive(timeout))
        }
        Err(RecvError::Closed) => Err(Error::ManagerGone),
        Err(RecvError::Io(e)) => Err(e.into()),
        Err(RecvError::Proto(p)) => Err(Error::Protocol(p.to_string())),
    }
}

/// The report in the manager's answer to [`Msg::Status`]: inline, or read
/// from the memfd that came with it. For clients of the raw control
/// protocol ([`crate::ctrl`]); [`query_status`] does it all.
pub fn status_from_reply(msg: Msg, fds: Vec<OwnedFd>) -> Result<String, crate::stack::Error> {
    use crate::stack::Error;
    match msg {
        Msg::StatusReply { text } => Ok(text),
        Msg::StatusReplyFd { len } => {
            let [fd] = <[OwnedFd; 1]>::try_from(fds)
                .map_err(|f| Error::Protocol(format!("a status report with {} fds", f.len())))?;
            let bytes = ctrl::read_sealed_memfd(fd.as_fd(), len as usize)
                .map_err(|e| Error::Protocol(format!("status report: {e}")))?;
            String::from_utf8(bytes).map_err(|_| Error::Protocol("status report not UTF-8".into()))
        }
        Msg::Error { code, message } => Err(Error::Refused { code, message }),
        other => Err(Error::Protocol(format!("unexpected {other:?}"))),
    }
}

/// Cuts `s` to at most `max` bytes, on a char boundary.
fn cut(s: &mut String, max: usize) {
    let mut n = max.min(s.len());
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    s.truncate(n);
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    /// Two starters racing for a lock a stopping manager lets go of (and
    /// unlinks) never both hold it: the one that locked the unlinked file
    /// sees that the path no longer names it and takes the new file's
    /// lock instead. Without that check, a starter that opened the old
    /// file just before the unlink and locked it just after ran beside
    /// one that created the new file. A race: it shows only in some
    /// rounds, so there are many; a pass is no proof, a failure is a bug.
    #[test]
    fn racing_starters_never_both_hold_a_lock_being_let_go() {
        use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
        let dir = std::env::temp_dir().join(format!("xio-lockrace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("race.lock");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
        for round in 0..500 {
            let stopping = LockFile::acquire(&path)
                .unwrap()
                .expect("free between rounds");
            let holders = AtomicUsize::new(0);
            let go = AtomicBool::new(false);
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        while !go.load(Ordering::Relaxed) {
                            std::hint::spin_loop();
                        }
                        let held = loop {
                            if let Some(l) = LockFile::acquire(&path).unwrap() {
                                break l;
                            }
                            assert!(std::time::Instant::now() < deadline, "hang guard");
                        };
                        let others = holders.fetch_add(1, Ordering::SeqCst);
                        assert_eq!(others, 0, "round {round}: two starters hold the lock");
                        std::thread::yield_now();
                        holders.fetch_sub(1, Ordering::SeqCst);
                        drop(held);
                    });
                }
                go.store(true, Ordering::Relaxed);
                std::thread::yield_now();
                drop(stopping);
            });
            assert!(
                !path.exists(),
                "round {round}: the last holder left its file"
            );
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// What a sweep takes for "exited, end of file not read yet": the
    /// peer's end closed, whether or not messages wait unread.
    #[test]
    fn hung_up_now_sees_a_closed_peer() {
        use rustix::net::{socketpair, AddressFamily, SocketFlags, SocketType};
        let (ours, theirs) = socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap();
        assert!(!hung_up_now(&ours));
        rustix::net::send(&theirs, b"unread", rustix::net::SendFlags::empty()).unwrap();
        assert!(!hung_up_now(&ours), "a message is not a hang-up");
        drop(theirs);
        assert!(hung_up_now(&ours));
    }
}

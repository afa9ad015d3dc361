//! The stack: a process's attachment to a pool, and the zero-copy interface
//! (the paper's `xio_malloc` / `xio_tx` / `xio_rx`).
//!
//! ```no_run
//! use xio_core::prelude::*;
//!
//! let mut stack = Stack::attach("demo")?;          // register with the manager
//! let peer = stack.connect("10.0.0.2:80".parse()?)?; // channel to whoever bound it
//! let mut buf = stack.alloc(64)?;                   // a pool buffer, ours alone
//! buf.copy_from(b"hello");
//! stack.send(peer, buf)?;                           // moves; no copy
//! let msg = stack.recv()?;                          // waits (adaptive by default)
//! assert_eq!(&msg.buf[..], b"hello");
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::{
    BufferPool, DescConsumer, DescProducer, Doorbell, EventFdDoorbell, RingWatch,
};
use crate::buf::{Buf, BufMut};
use crate::ctrl::{self, RecvError};
use crate::layout::{
    chan_state, kind, Descriptor, StackSlot, SLEEP_EVENTFD, SLEEP_FUTEX, SLOT_DESCS,
};
use crate::paths;
use crate::pool::{AllocError, PoolView, StackPool};
use crate::proto::{ErrorCode, Msg};
use crate::ring::{Consumer, Producer, RawRing};
use crate::segment::{Region, Segment};
use crate::sync::{fence, futex_wake, spin_hint, AtomicU32, FxHashMap, Ordering};
use crate::wait::{now_ns, AdaptiveSpin, WaitMode};

/// Another stack, as seen from this one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PeerId(pub u16);

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Display::fmt(self, f)
    }
}

impl std::fmt::Display for PeerId {
    /// The number, as C programs see an `xio_peer`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

/// A received buffer and where it came from.
#[derive(Debug)]
pub struct Message {
    /// The sender.
    pub from: PeerId,
    /// The sender's tag (see [`Stack::send_tagged`]).
    pub tag: u32,
    /// The payload, read-only; drop it to return it to the pool, or
    /// [`Buf::into_mut`] it to forward.
    pub buf: Buf,
}

/// Errors of the stack. `Debug` prints the message, as `Display` does:
/// `main() -> Result<(), Box<dyn Error>>` shows errors with `Debug`, and
/// the message says what to do (start a manager, say).
#[derive(thiserror::Error)]
pub enum Error {
    /// No manager listens on this prefix.
    #[error("no X-IO manager for pool {prefix:?} at {path} ({err}): start one with `xio-manager --prefix {prefix}`, or use the pool a running manager serves ($XIO_PREFIX names the process-wide one, default \"xio\")")]
    NoManager {
        /// The prefix.
        prefix: String,
        /// Socket path tried.
        path: String,
        /// The connect error.
        err: io::Error,
    },
    /// The prefix is not a valid name.
    #[error(transparent)]
    BadPrefix(#[from] paths::BadPrefix),
    /// The manager refused a request.
    #[error("manager refused: {message}")]
    Refused {
        /// Why.
        code: ErrorCode,
        /// Details.
        message: String,
    },
    /// The peer died or left; its channel is closed.
    #[error("connection reset: peer {0} is gone")]
    Reset(PeerId),
    /// Not connected to that peer.
    #[error("not connected to peer {0}")]
    NotConnected(PeerId),
    /// The operation would wait, in non-blocking mode.
    #[error("operation would block")]
    WouldBlock,
    /// The wait timed out.
    #[error("timed out")]
    TimedOut,
    /// Larger than the largest buffer class.
    #[error("{0} bytes is more than the largest buffer class")]
    TooLarge(usize),
    /// The manager went away.
    #[error("the X-IO manager went away")]
    ManagerGone,
    /// The manager broke the protocol, or the segment is invalid.
    #[error("protocol error: {0}")]
    Protocol(String),
    /// The pool's backend is not the one [`StackBuilder::require_backend`]
    /// asked for.
    #[error(
        "pool {prefix:?} uses the {has:?} backend, not {wanted:?} (see xio-manager --backend)"
    )]
    WrongBackend {
        /// The prefix.
        prefix: String,
        /// Its backend.
        has: crate::manager::Backend,
        /// The one asked for.
        wanted: crate::manager::Backend,
    },
    /// [`Stack::alloc_burst`] asked for more buffers of a size than the
    /// pool holds: no wait could ever give them.
    #[error("a burst of {n} buffers of {len} bytes: the pool holds only {count} of that size")]
    BurstTooLarge {
        /// Buffers asked for.
        n: usize,
        /// Their size.
        len: usize,
        /// How many the size's class holds in all.
        count: usize,
    },
    /// The buffer belongs to another pool (allocated or received by a
    /// stack of another prefix): a stack sends only its own pool's
    /// buffers. Copy the bytes into a buffer of this pool instead.
    #[error("the buffer belongs to another pool; copy it into one of this stack's")]
    ForeignBuffer,
    /// This process was forked from the one that attached the stack: the
    /// stack, its connections and its buffers stay the parent's. Attach a
    /// new stack in the child (see [`crate::fork`]).
    #[error("the X-IO stack was inherited across fork(); attach a new one in this process")]
    Forked,
    /// The manager did not answer a request in time: it is stopped
    /// (SIGSTOP, a debugger) or stuck, not dead (a dead one is
    /// [`Error::ManagerGone`]). Its reply, if it comes later, is handled
    /// then (a late channel is set up, a late bind given back).
    #[error("the X-IO manager did not answer within {0:?}: is it stopped (SIGSTOP, a debugger) or stuck? See StackBuilder::control_timeout / $XIO_CONTROL_TIMEOUT_MS")]
    ManagerUnresponsive(Duration),
    /// An environment variable X-IO reads has a value it cannot use.
    #[error("${var}={value:?} is not valid: expected {expected}")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
        /// What it should be.
        expected: &'static str,
    },
    /// A system call failed.
    #[error(transparent)]
    Io(#[from] io::Error),
}

impl From<Error> for io::Error {
    fn from(e: Error) -> io::Error {
        let k = match &e {
            Error::NoManager { .. } => io::ErrorKind::NotFound,
            Error::BadPrefix(_) | Error::BadEnv { .. } => io::ErrorKind::InvalidInput,
            Error::Refused {
                code: ErrorCode::AddrInUse,
                ..
            } => io::ErrorKind::AddrInUse,
            Error::Refused {
                code: ErrorCode::ConnectionRefused | ErrorCode::Busy,
                ..
            } => io::ErrorKind::ConnectionRefused,
            Error::Refused { .. } => io::ErrorKind::Other,
            Error::Reset(_) => io::ErrorKind::ConnectionReset,
            Error::NotConnected(_) => io::ErrorKind::NotConnected,
            Error::WouldBlock => io::ErrorKind::WouldBlock,
            Error::TimedOut => io::ErrorKind::TimedOut,
            Error::ManagerUnresponsive(_) => io::ErrorKind::TimedOut,
            Error::TooLarge(_) => io::ErrorKind::InvalidInput,
            Error::BurstTooLarge { .. } => io::ErrorKind::InvalidInput,
            Error::ManagerGone => io::ErrorKind::BrokenPipe,
            Error::Protocol(_) => io::ErrorKind::InvalidData,
            Error::WrongBackend { .. } => io::ErrorKind::Unsupported,
            Error::ForeignBuffer => io::ErrorKind::InvalidInput,
            Error::Forked => io::ErrorKind::Unsupported,
            Error::Io(e) => return io::Error::new(e.kind(), e.to_string()),
        };
        io::Error::new(k, e)
    }
}

/// Options for attaching.
#[derive(Clone, Debug)]
pub struct StackBuilder {
    prefix: String,
    name: String,
    mode: WaitMode,
    backend: Option<crate::manager::Backend>,
    /// `None`: `$XIO_CONTROL_TIMEOUT_MS`, else 5 s, read at attach.
    ctrl_timeout: Option<Duration>,
}

impl StackBuilder {
    /// The service name shown by `xio-manager status`.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// How blocking calls wait (default: [`WaitMode::Adaptive`]).
    pub fn wait_mode(mut self, mode: WaitMode) -> Self {
        self.mode = mode;
        self
    }

    /// How long a request to the manager (attach, bind, a connect to an
    /// address not resolved yet) waits for its answer before failing with
    /// [`Error::ManagerUnresponsive`] (`TimedOut`). Default 5 s, or
    /// `$XIO_CONTROL_TIMEOUT_MS` (milliseconds, 1 or more; another value
    /// makes the attach fail with [`Error::BadEnv`]). A manager answers
    /// in microseconds; this bounds the wait on one that is stopped or
    /// stuck, during which the caller (and, in the socket layer, its net)
    /// waits.
    pub fn control_timeout(mut self, timeout: Duration) -> Self {
        self.ctrl_timeout = Some(timeout);
        self
    }

    /// Refuses to attach unless the pool uses `backend` (by default a
    /// stack follows whatever backend its manager chose): for services
    /// that must share hugepage memory with DPDK programs, say.
    pub fn require_backend(mut self, backend: crate::manager::Backend) -> Self {
        self.backend = Some(backend);
        self
    }

    /// Registers with the pool's manager and maps the pool.
    pub fn attach(self) -> Result<Stack, Error> {
        paths::check_prefix(&self.prefix)?;
        let ctrl_timeout = match self.ctrl_timeout {
            Some(t) => t,
            None => default_control_timeout()?,
        };
        let path = paths::socket_path(&self.prefix);
        // Bounded: a stopped manager accepts nothing, and once its
        // listen queue is full a plain connect waits for it for good.
        let sock = match ctrl::connect_within(&path, ctrl_timeout) {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(Error::ManagerUnresponsive(ctrl_timeout))
            }
            Err(err) => {
                return Err(Error::NoManager {
                    prefix: self.prefix.clone(),
                    path: path.display().to_string(),
                    err,
                })
            }
        };
        // The timeout was for the connect; sends on the socket wait as
        // before.
        rustix::net::sockopt::set_socket_timeout(&sock, rustix::net::sockopt::Timeout::Send, None)
            .map_err(io::Error::from)?;
        // Only a manager of this user's (or root's): whoever answers gets
        // every byte this stack sends, and a run dir can be shared.
        let cred = ctrl::peer_cred(&sock)?;
        let me = rustix::process::geteuid().as_raw();
        if cred.uid != me && cred.uid != 0 {
            return Err(Error::NoManager {
                prefix: self.prefix.clone(),
                path: path.display().to_string(),
                err: io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!(
                        "the socket's listener runs as uid {}, not as this user (uid {me}) \
                         or root; refusing it",
                        cred.uid
                    ),
                ),
            });
        }
        let pid = rustix::process::getpid().as_raw_nonzero().get() as u32;
        let manager_here = cred.pid == Some(pid);
        ctrl::send(
            sock.as_fd(),
            &Msg::Hello {
                pid,
                name: self.name.clone(),
            },
            &[],
        )?;
        let answer = ctrl::recv_until(sock.as_fd(), Instant::now().checked_add(ctrl_timeout));
        let (msg, mut fds) = match answer {
            Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::TimedOut => {
                return Err(Error::ManagerUnresponsive(ctrl_timeout))
            }
            r => r.map_err(recv_err)?,
        };
        let id = match msg {
            Msg::Welcome { stack_id } if fds.len() == 2 => stack_id,
            Msg::Error { code, message } => return Err(Error::Refused { code, message }),
            other => return Err(Error::Protocol(format!("expected Welcome, got {other:?}"))),
        };
        let bell = EventFdDoorbell::from_fd(fds.pop().expect("two fds"));
        let seg_fd = fds.pop().expect("two fds");
        let region = Region::map_fd(seg_fd).map_err(|e| Error::Protocol(e.to_string()))?;
        let seg = Segment::open(region).map_err(|e| Error::Protocol(e.to_string()))?;
        if id == 0 || u32::from(id) > seg.max_stacks() {
            return Err(Error::Protocol(format!("stack id {id} out of range")));
        }
        let backend = match seg.backend() {
            crate::layout::backend::DPDK => crate::manager::Backend::Dpdk,
            _ => crate::manager::Backend::Shm,
        };
        if let Some(want) = self.backend.filter(|&w| w != backend) {
            return Err(Error::WrongBackend {
                prefix: self.prefix.clone(),
                has: backend,
                wanted: want,
            });
        }
        let pool = match seg.backend() {
            crate::layout::backend::SHM => PoolRef::Shm(Arc::new(StackPool::with_keepalive(
                PoolView::new(seg.clone()),
                id,
                sock,
            ))),
            #[cfg(feature = "dpdk")]
            crate::layout::backend::DPDK => PoolRef::Dpdk(Arc::new(crate::dpdk::attach_pool(
                &self.prefix,
                &seg,
                id,
                sock,
            )?)),
            _ => {
                return Err(Error::Protocol(format!(
                    "pool {:?} uses the DPDK backend: build X-IO with the `dpdk` feature",
                    self.prefix
                )))
            }
        };
        let slot_seq = seg.stack_slot(id).ctrl_seq.load(Ordering::Acquire);
        Ok(Stack {
            id,
            seg,
            pool,
            bell,
            channels: Vec::new(),
            by_peer: FxHashMap::default(),
            resolved: HashMap::new(),
            ctrl_seen: slot_seq,
            mode: self.mode,
            spin: AdaptiveSpin::default(),
            inbox: VecDeque::new(),
            scratch: [Descriptor::default(); BURST],
            burst_raws: Vec::new(),
            refs: std::cell::RefCell::new(Vec::with_capacity(REFS_KEPT)),
            rr: 0,
            corrupt: 0,
            manager_gone: false,
            deferred: None,
            manager_here,
            ctrl_timeout,
            unanswered: VecDeque::new(),
            awaited: Vec::new(),
            answered: Vec::new(),
            unsent: Vec::new(),
            unsent_due: None,
            busy_tick_due: None,
            next_request: 0,
            epoch: Arc::new(AtomicU64::new(0)),
            born: crate::fork::Birth::now(),
        })
    }
}

const BURST: usize = 32;

/// Pool references a stack keeps from the buffers it sends, for the
/// buffers it receives or allocates (see [`Stack::pool_ref`]): a burst's
/// worth each way.
const REFS_KEPT: usize = 2 * BURST;

/// The manager's answer to a request (`Err`: a malformed one), with the
/// fds it carried.
type Answer = Result<(Msg, Vec<OwnedFd>), Error>;

/// An answer kept for a caller waiting outside the stack (see
/// [`Stack::begin_request`]).
#[derive(Debug)]
pub(crate) enum Kept {
    /// The reply as it came.
    Reply(Answer),
    /// A `Connect`'s reply, acted on when it was read (the channel set up,
    /// the route recorded), so a peer's death read after it closes that
    /// channel as it should: the peer, or why not. (A refusal by the
    /// manager is a `Reply`.)
    Route(Result<PeerId, Error>),
}
/// How often messages the control socket had no room for (see
/// `Stack::unsent`) are tried again from the ring path.
const UNSENT_RETRY: Duration = Duration::from_millis(1);

/// The control timeout unless set: `$XIO_CONTROL_TIMEOUT_MS`, else 5 s.
/// A value that is not a whole number of milliseconds from 1 up is an
/// error, not ignored: 0 would fail every request at once, and a typo
/// would quietly give the default.
pub(crate) fn default_control_timeout() -> Result<Duration, Error> {
    const VAR: &str = "XIO_CONTROL_TIMEOUT_MS";
    let Some(v) = std::env::var_os(VAR) else {
        return Ok(Duration::from_secs(5));
    };
    match v.to_str().and_then(|v| v.trim().parse::<u64>().ok()) {
        Some(ms) if ms > 0 => Ok(Duration::from_millis(ms)),
        _ => Err(Error::BadEnv {
            var: VAR,
            value: v.to_string_lossy().into_owned(),
            expected: "a whole number of milliseconds, 1 or more",
        }),
    }
}

/// The stack's buffer pool: the shm backend's, or DPDK's mempools. An
/// enum rather than a trait object, so the shm fast path stays inlined
/// (and without the `dpdk` feature the match has one arm).
#[derive(Clone, Debug)]
enum PoolRef {
    Shm(Arc<StackPool>),
    #[cfg(feature = "dpdk")]
    Dpdk(Arc<crate::dpdk::DpdkPool>),
}

/// Takes `b` apart for sending, keeping its pool reference in `refs` for
/// the next received buffer when it is a reference to `pool` and `refs`
/// has room (it is released otherwise, a locked decrement).
fn take_for_send(
    refs: &mut Vec<Arc<dyn BufferPool>>,
    pool: &PoolRef,
    b: BufMut,
) -> (crate::pool::RawBuf, usize) {
    let (raw, len, p) = b.into_parts();
    if refs.len() < REFS_KEPT && Arc::as_ptr(&p).cast::<()>() == pool.addr() {
        refs.push(p);
    }
    (raw, len)
}

impl PoolRef {
    /// What buffers point back to.
    fn shared(&self) -> Arc<dyn BufferPool> {
        match self {
            PoolRef::Shm(p) => p.clone(),
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(p) => p.clone(),
        }
    }

    #[inline]
    fn accept(
        &self,
        me: u16,
        from: u16,
        d: &Descriptor,
    ) -> Result<crate::pool::RawBuf, crate::pool::Reject> {
        match self {
            PoolRef::Shm(p) => p.view().accept(me, from, d),
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(p) => p.accept(from, d),
        }
    }

    /// The address of the pool object (what a `BufMut` of ours holds).
    fn addr(&self) -> *const () {
        match self {
            PoolRef::Shm(p) => Arc::as_ptr(p).cast(),
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(p) => Arc::as_ptr(p).cast(),
        }
    }

    /// The pool's identity (see [`BufferPool::pool_id`]).
    fn pool_id(&self) -> u64 {
        match self {
            PoolRef::Shm(p) => p.pool_id(),
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(p) => p.pool_id(),
        }
    }

    /// The shm pool's view, for what only it has (prefetching headers and
    /// payloads: a DPDK buffer's header is DPDK's).
    #[inline]
    fn shm_view(&self) -> Option<&crate::pool::PoolView> {
        match self {
            PoolRef::Shm(p) => Some(p.view()),
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(_) => None,
        }
    }

    #[inline]
    fn data(&self, b: crate::pool::RawBuf) -> (*mut u8, usize) {
        match self {
            PoolRef::Shm(p) => p.view().data(b),
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(p) => p.data(b),
        }
    }

    #[inline]
    fn prepare_send(
        &self,
        b: crate::pool::RawBuf,
        len: u32,
        to: u16,
        conn: u32,
        k: u8,
    ) -> Descriptor {
        match self {
            PoolRef::Shm(p) => p.view().prepare_send(p.stack_id(), b, len, to, conn, k),
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(p) => p.prepare_send(b, len, to, conn, k),
        }
    }

    #[inline]
    fn alloc(&self, len: usize, wait: bool) -> Result<crate::pool::RawBuf, AllocError> {
        match self {
            PoolRef::Shm(p) => p.alloc(len, wait),
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(p) => BufferPool::alloc(&**p, len, wait),
        }
    }

    fn alloc_many(&self, len: usize, out: &mut [crate::pool::RawBuf]) -> Result<usize, AllocError> {
        match self {
            PoolRef::Shm(p) => p.alloc_many(len, out),
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(p) => p.alloc_many(len, out),
        }
    }

    /// Buffers in size class `class` (a DPDK segment's class table
    /// records one per class; the mempool knows).
    fn class_count(&self, seg: &Segment, class: usize) -> usize {
        match self {
            PoolRef::Shm(_) => seg.classes().get(class).map_or(0, |c| c.count as usize),
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(p) => p.classes().get(class).map_or(0, |m| m.len()),
        }
    }

    /// The control socket, which the pool keeps open as long as a buffer
    /// lives (the manager reclaims nothing before).
    fn keepalive(&self) -> Option<BorrowedFd<'_>> {
        match self {
            PoolRef::Shm(p) => p.keepalive(),
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(p) => p.keepalive(),
        }
    }

    fn free_many(&self, bufs: &[crate::pool::RawBuf]) {
        match self {
            PoolRef::Shm(p) => p.free_many(bufs),
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(p) => bufs.iter().for_each(|&b| p.free(b)),
        }
    }
}

struct Chan {
    id: u32,
    /// The ring of the channel this stack produces into (it consumes the
    /// other).
    dir: u8,
    peer: u16,
    tx: Box<dyn DescProducer>,
    rx: Box<dyn DescConsumer>,
    peer_bell: EventFdDoorbell,
    /// The peer process's pidfd, from the manager: readable once it has
    /// exited. Looked at only while no manager runs to say so.
    peer_pidfd: Option<OwnedFd>,
}

enum Event {
    Msg(Message),
    Reset(PeerId),
    /// A socket-layer descriptor (buffer or control) found by a path that
    /// does not route them: handed to [`Stack::poll_events`], dropped by
    /// the zero-copy receive paths.
    Sock(Incoming),
}

/// A process's attachment to an X-IO pool. See the module docs.
///
/// `Send` but not `Sync`: one thread drives a stack (buffers themselves are
/// `Send` and may be dropped anywhere).
pub struct Stack {
    id: u16,
    seg: Segment,
    pool: PoolRef,
    bell: EventFdDoorbell,
    channels: Vec<Chan>,
    by_peer: FxHashMap<u16, usize>,
    resolved: HashMap<SocketAddr, u16>,
    ctrl_seen: u32,
    mode: WaitMode,
    spin: AdaptiveSpin,
    inbox: VecDeque<Event>,
    scratch: [Descriptor; BURST],
    /// Kept between calls of [`Stack::push_bufs`] (no allocation per burst).
    burst_raws: Vec<(u8, u32, crate::pool::RawBuf, usize)>,
    /// References to our pool taken from buffers we sent, handed to the
    /// buffers we receive or allocate next (see [`Stack::pool_ref`]). A
    /// cell, for `alloc(&self)`: the stack is not `Sync`.
    refs: std::cell::RefCell<Vec<Arc<dyn BufferPool>>>,
    rr: usize,
    corrupt: u64,
    manager_gone: bool,
    /// An error met after [`Stack::recv_burst`] had messages in hand: they
    /// are returned first, the error by the next receive.
    deferred: Option<Error>,
    /// The manager runs in this process (embedded). Its liveness word is
    /// then not waited on: at the process's death the kernel wakes one
    /// waiter of that word, and it must be one in another process, which
    /// passes the news on; one of ours would die with it, and the other
    /// processes would never learn. (Our own sleeps need no such news.)
    manager_here: bool,
    /// How long a request waits for the manager's answer.
    ctrl_timeout: Duration,
    /// Requests sent and not answered yet, oldest first, each with its
    /// number: the one a caller waits for, and those whose callers were
    /// told they timed out. The manager answers in order, so each reply
    /// is the first entry's: a timed-out request's is settled (see
    /// [`Stack::settle`]), not taken for the answer to a later one.
    unanswered: VecDeque<(u64, Msg)>,
    /// Number of the next request.
    next_request: u64,
    /// Requests whose callers wait for the answer without holding this
    /// stack (see [`Stack::begin_request`]): whoever reads their replies
    /// keeps them in `answered` instead of settling them.
    awaited: Vec<u64>,
    /// Answers kept for `awaited` requests: number, request, answer.
    answered: Vec<(u64, Msg, Kept)>,
    /// Messages the control socket had no room for (the manager is not
    /// reading this stack's messages: stopped, or busy sending it news it
    /// has not read yet), in order: channels' releases, and unbinds of
    /// addresses bound late for a caller who was told the bind failed.
    /// Sent before anything else is read or asked; never waited for,
    /// since the manager may be waiting for us.
    unsent: Vec<Msg>,
    /// When the messages left over are tried again from the ring path.
    unsent_due: Option<Instant>,
    /// When a wait that does not sleep (busy polling, non-blocking, a
    /// send waiting for room) next looks at its peers' pidfds while no manager runs (see
    /// [`Stack::dead_manager_tick`]).
    busy_tick_due: Option<Instant>,
    /// Bumped whenever the set of channels changes, so a [`Probe`] made
    /// earlier knows it may be missing a ring.
    epoch: Arc<AtomicU64>,
    /// The fork generation of the process that attached (see
    /// [`crate::fork`]).
    born: crate::fork::Birth,
}

impl std::fmt::Debug for Stack {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stack")
            .field("id", &self.id)
            .field("channels", &self.channels.len())
            .field("mode", &self.mode)
            .finish()
    }
}

fn recv_err(e: RecvError) -> Error {
    match e {
        RecvError::Closed => Error::ManagerGone,
        RecvError::Io(e) => Error::Io(e),
        RecvError::Proto(p) => Error::Protocol(p.to_string()),
    }
}

impl Stack {
    /// Attaches to pool `prefix` with default options.
    pub fn attach(prefix: &str) -> Result<Stack, Error> {
        Self::builder(prefix).attach()
    }

    /// Options for attaching to pool `prefix`.
    pub fn builder(prefix: &str) -> StackBuilder {
        let name = std::env::args().next().unwrap_or_default();
        let name = name.rsplit('/').next().unwrap_or("").to_owned();
        StackBuilder {
            prefix: prefix.to_owned(),
            name,
            mode: WaitMode::default(),
            backend: None,
            ctrl_timeout: None,
        }
    }

    /// This stack's id in the pool.
    pub fn id(&self) -> PeerId {
        PeerId(self.id)
    }

    /// The waiting mode of blocking calls.
    pub fn wait_mode(&self) -> WaitMode {
        self.mode
    }

    /// Changes the waiting mode.
    pub fn set_wait_mode(&mut self, mode: WaitMode) {
        self.mode = mode;
    }

    /// The adaptive policy's current state (for benchmarks and tuning).
    pub fn spin_policy(&self) -> &AdaptiveSpin {
        &self.spin
    }

    /// Descriptors this stack refused as corrupt.
    pub fn corrupt_descriptors(&self) -> u64 {
        self.corrupt
    }

    /// Whether this process is a fork of the one that attached the stack
    /// (whose rings and buffers it must leave alone; see [`crate::fork`]).
    #[inline]
    pub(crate) fn forked(&self) -> bool {
        self.born.forked()
    }

    /// [`Error::Forked`] in a forked child.
    #[inline]
    fn check_not_forked(&self) -> Result<(), Error> {
        if self.forked() {
            return Err(Error::Forked);
        }
        Ok(())
    }

    /// Whether a connect to `addr` was sent and its answer has not come.
    pub(crate) fn asking(&self, addr: SocketAddr) -> bool {
        self.unanswered
            .iter()
            .any(|(_, m)| *m == Msg::Connect { addr })
    }

    /// Changes the control timeout (see [`StackBuilder::control_timeout`]).
    pub fn set_control_timeout(&mut self, timeout: Duration) {
        self.ctrl_timeout = timeout;
    }

    /// The doorbell fd: readable when the stack should look at its rings.
    pub fn doorbell_fd(&self) -> BorrowedFd<'_> {
        self.bell.fd()
    }

    /// The control socket (others may watch it; only `poll_ctrl` reads it).
    pub(crate) fn ctrl_fd(&self) -> BorrowedFd<'_> {
        self.pool
            .keepalive()
            .expect("a stack always holds its control socket")
    }

    fn slot(&self) -> &StackSlot {
        self.seg.stack_slot(self.id)
    }

    /// Sends a request and waits for its reply, handling the manager's
    /// unprompted messages (and late replies to requests that timed out)
    /// that arrive first. Waits until `deadline` or the control timeout,
    /// whichever is first: [`Error::TimedOut`] for the caller's deadline,
    /// [`Error::ManagerUnresponsive`] for the manager's.
    fn request(
        &mut self,
        msg: &Msg,
        deadline: Option<Instant>,
    ) -> Result<(Msg, Vec<OwnedFd>), Error> {
        let limit = Instant::now().checked_add(self.ctrl_timeout);
        let until = match (deadline, limit) {
            (Some(d), Some(l)) => Some(d.min(l)),
            (d, l) => d.or(l),
        };
        let me = self.send_request(msg)?;
        loop {
            let (m, fds) = match ctrl::recv_until(self.ctrl_fd(), until) {
                Ok(x) => x,
                Err(RecvError::Closed) => {
                    self.manager_gone = true;
                    return Err(Error::ManagerGone);
                }
                Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::TimedOut => {
                    tracing::warn!(
                        stack = self.id,
                        request = ?msg,
                        "the manager did not answer in time"
                    );
                    return Err(if until == limit {
                        Error::ManagerUnresponsive(self.ctrl_timeout)
                    } else {
                        Error::TimedOut
                    });
                }
                // Taken as the reply it stands in place of (replies come
                // in order): a request's own fails, a late one is dropped.
                Err(RecvError::Proto(p)) => {
                    tracing::warn!(error = %p, "malformed reply from the manager");
                    if self.unanswered.front().is_some_and(|&(n, _)| n == me) {
                        self.unanswered.pop_front();
                        return Err(Error::Protocol(p.to_string()));
                    }
                    self.on_reply(Err(Error::Protocol(p.to_string())));
                    continue;
                }
                Err(e) => return Err(recv_err(e)),
            };
            match m {
                // A peer's channel that fails to come up is not this
                // request's failure.
                Msg::ChannelUp { .. } | Msg::PeerDown { .. } => {
                    if let Err(e) = self.handle_async(m, fds) {
                        tracing::warn!(error = %e, "control message from the manager not handled");
                    }
                }
                reply => {
                    if self.unanswered.front().is_some_and(|&(n, _)| n == me) {
                        self.unanswered.pop_front();
                        return Ok((reply, fds));
                    }
                    self.on_reply(Ok((reply, fds)));
                }
            }
        }
    }

    /// Sends request `msg` and queues it as unanswered; its number.
    fn send_request(&mut self, msg: &Msg) -> Result<u64, Error> {
        self.check_not_forked()?;
        if self.manager_gone {
            return Err(Error::ManagerGone);
        }
        self.send_unsent();
        // A message still queued (the socket was full a moment ago) goes
        // first: a request that overtook a release could be answered with
        // the channel it gives up (a Connect, as `existing`), and a Bind
        // that overtook an unbind of its address would be undone by it.
        if !self.unsent.is_empty() {
            return Err(Error::ManagerUnresponsive(self.ctrl_timeout));
        }
        // Not blocking: a manager stopped long enough for timed-out
        // requests to fill the socket's buffer must not hang the sender.
        if let Err(e) = ctrl::send_nowait(self.ctrl_fd(), msg, &[]) {
            return Err(match e.kind() {
                // EPIPE, or ECONNRESET when it closed with our messages
                // unread.
                io::ErrorKind::BrokenPipe | io::ErrorKind::ConnectionReset => {
                    self.manager_gone = true;
                    Error::ManagerGone
                }
                io::ErrorKind::WouldBlock => Error::ManagerUnresponsive(self.ctrl_timeout),
                _ => Error::Io(e),
            });
        }
        let me = self.next_request;
        self.next_request += 1;
        // Queued at once: however this call ends, the reply that comes is
        // this request's, and is settled as such.
        self.unanswered.push_back((me, msg.clone()));
        Ok(me)
    }

    /// A reply (`Err`: a malformed one) to the oldest unanswered request
    /// that is not the reader's own: kept for a caller waiting outside the
    /// stack, else settled (its caller gave up).
    fn on_reply(&mut self, reply: Answer) {
        match self.unanswered.pop_front() {
            Some((n, req)) if self.awaited.contains(&n) => {
                let kept = match (&req, reply) {
                    // The manager's refusal is kept as it came: the caller
                    // tells it from one made here (a channel closed while
                    // connecting), as only the manager's may mean a
                    // wildcard listener of the caller's own.
                    (Msg::Connect { addr }, Ok((m, fds))) if !matches!(m, Msg::Error { .. }) => {
                        Kept::Route(self.connected(*addr, m, fds))
                    }
                    (_, reply) => Kept::Reply(reply),
                };
                self.answered.push((n, req, kept));
            }
            Some((_, req)) => {
                if let Ok((m, fds)) = reply {
                    self.settle(req, m, fds);
                }
            }
            None => tracing::warn!(?reply, "reply to no request ignored"),
        }
    }

    /// Sends request `msg` for a caller that waits for the answer without
    /// holding this stack (so other threads can use it meanwhile): it asks
    /// [`Stack::take_answer`] when the control socket has news, and calls
    /// [`Stack::give_up`] if it stops waiting. Returns the request's number.
    pub(crate) fn begin_request(&mut self, msg: &Msg) -> Result<u64, Error> {
        let n = self.send_request(msg)?;
        self.awaited.push(n);
        Ok(n)
    }

    /// The answer to request `n` (of [`Stack::begin_request`]) if it has
    /// come, reading what the control socket holds.
    pub(crate) fn take_answer(&mut self, n: u64) -> Result<Option<Kept>, Error> {
        if !self.answered.iter().any(|(k, ..)| *k == n) {
            match self.poll_ctrl() {
                Ok(()) | Err(Error::ManagerGone) => {}
                Err(e) => {
                    tracing::warn!(error = %e, "control message from the manager not handled")
                }
            }
        }
        match self.answered.iter().position(|(k, ..)| *k == n) {
            Some(i) => {
                let (_, _, kept) = self.answered.swap_remove(i);
                self.awaited.retain(|&k| k != n);
                Ok(Some(kept))
            }
            None if self.manager_gone => {
                self.give_up(n);
                Err(Error::ManagerGone)
            }
            None => Ok(None),
        }
    }

    /// The caller of request `n` stopped waiting: its answer, now or when
    /// it comes, is settled as a late one.
    pub(crate) fn give_up(&mut self, n: u64) {
        self.awaited.retain(|&k| k != n);
        if let Some(i) = self.answered.iter().position(|(k, ..)| *k == n) {
            // A route was acted on already, as settling would.
            if let (_, req, Kept::Reply(Ok((m, fds)))) = self.answered.swap_remove(i) {
                self.settle(req, m, fds);
            }
        }
    }

    /// The control socket, duplicated: for a thread that waits for it
    /// without holding the stack.
    pub(crate) fn ctrl_fd_owned(&self) -> io::Result<OwnedFd> {
        self.ctrl_fd().try_clone_to_owned()
    }

    /// How long requests wait for the manager.
    pub(crate) fn control_timeout(&self) -> Duration {
        self.ctrl_timeout
    }

    /// How many requests' callers wait for answers outside the stack.
    pub(crate) fn awaited(&self) -> usize {
        self.awaited.len()
    }

    /// Acts on the late `reply` to `req`, whose caller was told it timed
    /// out: a channel the manager set up is set up here too (its peer has
    /// it already), and an address bound for us is given back.
    /// Errors are logged: the request's caller is gone.
    fn settle(&mut self, req: Msg, reply: Msg, fds: Vec<OwnedFd>) {
        tracing::info!(stack = self.id, request = ?req, ?reply, "late answer from the manager");
        match (req, reply) {
            (
                Msg::Connect { addr },
                Msg::Connected {
                    channel,
                    dir,
                    peer,
                    existing,
                },
            ) => {
                if !self.by_peer.contains_key(&peer) {
                    if existing {
                        // Closed here since (see `Stack::connected`).
                        return;
                    }
                    if let Err(e) = self.take_channel(channel, dir, peer, fds, "late Connected") {
                        tracing::warn!(error = %e, "late channel not set up");
                        return;
                    }
                }
                self.resolved.insert(addr, peer);
            }
            // Unless the caller tried again: that request follows, and the
            // address is then its to keep (the manager answers Ok to a
            // stack binding what it holds).
            (Msg::Bind { addr }, Msg::Ok)
                if !self
                    .unanswered
                    .iter()
                    .any(|(_, m)| *m == Msg::Bind { addr }) =>
            {
                // Queued if the socket is full (the manager is stopped
                // again, say): dropped, it left the address bound to us
                // for good.
                self.send_later(Msg::Unbind { addr });
            }
            _ => {}
        }
    }

    fn expect_ok(&mut self, msg: &Msg) -> Result<(), Error> {
        match self.request(msg, None)?.0 {
            Msg::Ok => Ok(()),
            Msg::Error { code, message } => Err(Error::Refused { code, message }),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Binds `addr`: other stacks that connect to it reach this one.
    pub fn bind(&mut self, addr: SocketAddr) -> Result<(), Error> {
        self.expect_ok(&Msg::Bind { addr })
    }

    /// Releases `addr`.
    pub fn unbind(&mut self, addr: SocketAddr) -> Result<(), Error> {
        self.expect_ok(&Msg::Unbind { addr })
    }

    /// Opens (or reuses) the channel to the stack bound to `addr`.
    /// Fails with `Refused { code: ConnectionRefused }` if nobody bound it.
    pub fn connect(&mut self, addr: SocketAddr) -> Result<PeerId, Error> {
        self.connect_until(addr, None)
    }

    /// [`Stack::connect`], waiting for the manager until `deadline` at
    /// most (and the control timeout).
    pub(crate) fn connect_until(
        &mut self,
        addr: SocketAddr,
        deadline: Option<Instant>,
    ) -> Result<PeerId, Error> {
        if let Some(p) = self.resolve_known(addr)? {
            return Ok(p);
        }
        let (m, fds) = self.request(&Msg::Connect { addr }, deadline)?;
        self.connected(addr, m, fds)
    }

    /// The peer `addr` resolves to, if this stack knows it without asking
    /// the manager (after reading the news of deaths).
    pub(crate) fn resolve_known(&mut self, addr: SocketAddr) -> Result<Option<PeerId>, Error> {
        self.check_not_forked()?;
        // Deaths first: a peer the manager announced dead (or, with no
        // manager, whose pidfd says so) loses its channel and with it its
        // routes, so a service restarted on its address is asked for
        // instead of the corpse (a stack that made no call since the death
        // has not read the announcement yet).
        match self.poll_ctrl_if_bumped() {
            Ok(()) | Err(Error::ManagerGone) => {}
            // Trouble with some other message is no reason to fail this
            // connect (it would have succeeded before looking).
            Err(e) => tracing::warn!(error = %e, "control message from the manager not handled"),
        }
        if self.manager_gone || crate::liveness::died(self.seg.manager_alive()) {
            self.reap_dead_peers();
        }
        if let Some(&p) = self.resolved.get(&addr) {
            if self.by_peer.contains_key(&p) {
                return Ok(Some(PeerId(p)));
            }
        }
        Ok(None)
    }

    /// Acts on the manager's answer `m` to a `Connect` to `addr`: the
    /// channel to the peer, set up if new.
    pub(crate) fn connected(
        &mut self,
        addr: SocketAddr,
        m: Msg,
        fds: Vec<OwnedFd>,
    ) -> Result<PeerId, Error> {
        match m {
            Msg::Connected {
                channel,
                dir,
                peer,
                existing,
            } => {
                if !self.by_peer.contains_key(&peer) {
                    // A channel the manager had for us when it answered,
                    // which we no longer have: we closed it since (the
                    // peer left, or its ring was corrupt) and released it,
                    // or are about to. Taken again, it would be released
                    // twice when the news of its closing is read: by then
                    // the manager may have given the slot to a new channel
                    // of ours, which the second release would close.
                    if existing {
                        return Err(Error::Refused {
                            code: crate::proto::ErrorCode::ConnectionRefused,
                            message: format!(
                                "the channel to the process bound to {addr} closed while connecting"
                            ),
                        });
                    }
                    self.take_channel(channel, dir, peer, fds, "Connected")?;
                }
                self.resolved.insert(addr, peer);
                Ok(PeerId(peer))
            }
            Msg::Error { code, message } => Err(Error::Refused { code, message }),
            other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
        }
    }

    /// Sets up the channel the manager's `what` (a `ChannelUp`, or the
    /// answer to a `Connect`) names, with the fds that came with it: the
    /// peer's doorbell last, after its pidfd. A channel this stack cannot
    /// take (its fds did not arrive: this process was out of fds, and the
    /// kernel dropped them) is given back to the manager, as one found
    /// corrupt is: the manager closes it for the peer too, whose sends are
    /// reset instead of filling a ring nobody reads, and frees it once the
    /// peer lets go (kept, it stayed taken for good, and so did the
    /// peer's slot after its death, since this stack never released it).
    fn take_channel(
        &mut self,
        channel: u32,
        dir: u8,
        peer: u16,
        mut fds: Vec<OwnedFd>,
        what: &str,
    ) -> Result<(), Error> {
        let r = match fds.pop() {
            Some(bell) => self.add_channel(channel, dir, peer, bell, fds.pop()),
            None => Err(Error::Protocol(format!("{what} without doorbell"))),
        };
        if r.is_err() && !self.by_peer.contains_key(&peer) && channel < self.seg.max_channels() {
            self.release(channel);
        }
        r
    }

    fn add_channel(
        &mut self,
        channel: u32,
        dir: u8,
        peer: u16,
        bell: OwnedFd,
        pidfd: Option<OwnedFd>,
    ) -> Result<(), Error> {
        if channel >= self.seg.max_channels()
            || peer == 0
            || u32::from(peer) > self.seg.max_stacks()
        {
            return Err(Error::Protocol(format!(
                "channel {channel} / peer {peer} out of range"
            )));
        }
        if self.by_peer.contains_key(&peer) {
            return Ok(());
        }
        let (tx, rx) = self.channel_ends(channel, dir)?;
        self.channels.push(Chan {
            id: channel,
            dir,
            peer,
            tx,
            rx,
            peer_bell: EventFdDoorbell::from_fd(bell),
            peer_pidfd: pidfd,
        });
        self.by_peer.insert(peer, self.channels.len() - 1);
        self.epoch.fetch_add(1, Ordering::Release);
        tracing::debug!(stack = self.id, channel, peer, "channel up");
        Ok(())
    }

    /// Our ends of `channel`'s rings: we produce into ring `dir` and
    /// consume the other (the manager gives each ring one producer and one
    /// consumer).
    #[allow(clippy::type_complexity)]
    fn channel_ends(
        &self,
        channel: u32,
        dir: u8,
    ) -> Result<(Box<dyn DescProducer>, Box<dyn DescConsumer>), Error> {
        #[cfg(feature = "dpdk")]
        if let PoolRef::Dpdk(_) = self.pool {
            let (tx, rx) = crate::dpdk::channel_ends(channel, dir as usize)
                .map_err(|e| Error::Protocol(e.to_string()))?;
            return Ok((Box::new(tx), Box::new(rx)));
        }
        let cap = self.seg.ring_capacity();
        let keep: Arc<dyn Send + Sync> = self.seg.region().clone();
        let (th, ts) = self.seg.ring_ptrs(channel, dir as usize);
        let (rh, rs) = self.seg.ring_ptrs(channel, 1 - dir as usize);
        // SAFETY: the pointers come from the validated segment and stay
        // valid while `keep` (the mapping) lives; the manager gives each
        // ring of a channel exactly one producer and one consumer.
        let (tx, rx) = unsafe {
            (
                Producer::new(RawRing::new(th, ts, cap, keep.clone())),
                Consumer::new(RawRing::new(rh, rs, cap, keep)),
            )
        };
        Ok((Box::new(tx), Box::new(rx)))
    }

    fn handle_async(&mut self, m: Msg, fds: Vec<OwnedFd>) -> Result<(), Error> {
        match m {
            Msg::ChannelUp { channel, dir, peer } => {
                self.take_channel(channel, dir, peer, fds, "ChannelUp")
            }
            Msg::PeerDown { channel, peer } => {
                self.close_channel(peer, Some(channel));
                Ok(())
            }
            // Outside `request`, replies are late ones, or answers for
            // callers waiting outside the stack.
            reply => {
                self.on_reply(Ok((reply, fds)));
                Ok(())
            }
        }
    }

    /// Stops using the channel to `peer`: delivers what it already sent,
    /// queues a reset for the application and tells the manager.
    /// `announced`: the channel the manager's `PeerDown` names.
    fn close_channel(&mut self, peer: u16, announced: Option<u32>) {
        let Some(&i) = self.by_peer.get(&peer) else {
            // Already closed here, and released then: a second release
            // could name the slot after the manager reused it for a new
            // channel of ours, and close that one.
            return;
        };
        if announced.is_some_and(|ch| ch != self.channels[i].id) {
            return; // about a channel to this peer we already closed
        }
        self.by_peer.remove(&peer);
        let mut ch = self.channels.swap_remove(i);
        if let Some(moved) = self.channels.get(i) {
            self.by_peer.insert(moved.peer, i);
        }
        self.epoch.fetch_add(1, Ordering::Release);
        // Deliver everything the peer sent before it went away.
        loop {
            let n = ch.rx.pop_burst(&mut self.scratch).unwrap_or_default();
            if n == 0 {
                break;
            }
            self.deliver_burst(peer, n);
        }
        self.inbox.push_back(Event::Reset(PeerId(peer)));
        self.resolved.retain(|_, p| *p != peer);
        // Announced or closed: the manager waits for our release. Still
        // active (we found the peer's ring corrupt): the release asks the
        // manager to close it for the peer too, so the peer's sends are
        // reset instead of waiting on a ring nobody reads.
        self.release(ch.id);
        tracing::debug!(stack = self.id, channel = ch.id, peer, "channel closed");
    }

    /// Tells the manager this stack is done with channel `ch`, now or, if
    /// the socket is full, at the next look at the control socket.
    fn release(&mut self, ch: u32) {
        self.send_later(Msg::ChannelReleased { channel: ch });
    }

    /// Releases `addr` without waiting for the answer: for a request that
    /// failed as [`Error::ManagerUnresponsive`] before it was sent (the
    /// socket was full), and whose caller cannot retry (a listener's
    /// drop). Sent once the socket has room, before any new request.
    pub(crate) fn unbind_later(&mut self, addr: SocketAddr) {
        self.send_later(Msg::Unbind { addr });
    }

    /// Sends `msg` (a release, or an `Unbind` nobody waits for) now, or,
    /// if the socket is full, after those already waiting, at the next
    /// look at the control socket.
    fn send_later(&mut self, msg: Msg) {
        self.unsent.push(msg);
        self.send_unsent();
    }

    /// Sends the messages that wait, as far as the socket has room. An
    /// `Unbind` is answered: its reply is expected in turn (and settled,
    /// as nobody waits for it).
    fn send_unsent(&mut self) {
        while let Some(msg) = self.unsent.first() {
            match ctrl::send_nowait(self.ctrl_fd(), msg, &[]) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(()) => {
                    let msg = self.unsent.remove(0);
                    if matches!(msg, Msg::Unbind { .. }) {
                        let n = self.next_request;
                        self.next_request += 1;
                        self.unanswered.push_back((n, msg));
                    }
                }
                // No manager to tell.
                Err(e)
                    if matches!(
                        e.kind(),
                        io::ErrorKind::BrokenPipe
                            | io::ErrorKind::ConnectionReset
                            | io::ErrorKind::NotConnected
                    ) =>
                {
                    self.unsent.remove(0);
                }
                // Full (WouldBlock), or short of kernel memory (ENOBUFS,
                // ENOMEM): kept for the next try, as the manager waits
                // for a release before it frees the channel, and keeps an
                // address bound until it is unbound.
                Err(_) => return,
            }
        }
    }

    /// Checks one received descriptor and takes its buffer; a rejected
    /// one is counted (here and in the slot, for status) and logged.
    fn take_descriptor(&mut self, peer: u16, d: &Descriptor) -> Option<crate::pool::RawBuf> {
        let r = if kind::carries_buffer(d.kind) {
            self.pool.accept(self.id, peer, d)
        } else {
            Err(crate::pool::Reject::Kind(d.kind))
        };
        match r {
            Ok(raw) => Some(raw),
            Err(why) => {
                self.corrupt += 1;
                self.slot().corrupt.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(peer, ?d, %why, "rejected a corrupt descriptor");
                None
            }
        }
    }

    /// Starts loading the headers of `self.scratch[..n]` so their misses
    /// overlap (a single descriptor gains nothing from it).
    ///
    /// With `payloads`, also each buffer's payload lines past the header's
    /// (and the header of a lone descriptor, whose miss then overlaps the
    /// payload's): for the socket layer, whose reads copy every payload
    /// out. A zero-copy receiver may never touch the payload, and pulling
    /// lines it does not read would make the sender's next write of them
    /// a miss.
    fn prefetch_scratch(&self, n: usize, payloads: bool) {
        let Some(v) = self.pool.shm_view() else {
            return;
        };
        if n > 1 || payloads {
            for d in &self.scratch[..n] {
                v.prefetch(d, payloads && kind::carries_buffer(d.kind));
            }
        }
    }

    /// A reference to our pool for a buffer being received or allocated:
    /// one kept from a buffer we sent when there is one (moved, not
    /// counted), a new one (a locked increment) otherwise.
    fn pool_ref(&self) -> Arc<dyn BufferPool> {
        let kept = self.refs.borrow_mut().pop();
        kept.unwrap_or_else(|| self.pool.shared())
    }

    /// Makes sure `n` (at most [`REFS_KEPT`]) pool references are kept,
    /// so the next `n` [`Stack::pool_ref`]s make none.
    fn keep_refs(&mut self, n: usize) {
        let refs = self.refs.get_mut();
        while refs.len() < n.min(REFS_KEPT) {
            refs.push(self.pool.shared());
        }
    }

    /// Validates `self.scratch[..n]` from `peer` and queues what passes as
    /// `Buf`s. The headers are prefetched first, so their misses overlap.
    fn deliver_burst(&mut self, peer: u16, n: usize) {
        self.prefetch_scratch(n, false);
        // The `Buf`s' pool references first: those not kept from our sends
        // are made here, where their increments (locked instructions) do
        // not stall on the header stores below (each an ownership transfer
        // of a line the sender wrote). The loop then only takes kept ones.
        self.keep_refs(n);
        for j in 0..n {
            let d = self.scratch[j];
            if !kind::carries_buffer(d.kind) && kind::is_known(d.kind) {
                self.inbox.push_back(Event::Sock(Incoming::Control {
                    from: PeerId(peer),
                    kind: d.kind,
                    conn: d.conn,
                    arg: d.index,
                    arg2: d.len,
                }));
                continue;
            }
            if let Some(raw) = self.take_descriptor(peer, &d) {
                let buf = Buf::new(self.pool_ref(), raw, d.len as usize);
                self.inbox.push_back(if d.kind == kind::DATA {
                    Event::Msg(Message {
                        from: PeerId(peer),
                        tag: d.conn,
                        buf,
                    })
                } else {
                    Event::Sock(Incoming::Buf {
                        from: PeerId(peer),
                        kind: d.kind,
                        conn: d.conn,
                        buf,
                    })
                });
            }
        }
    }

    /// Whether this stack found its manager gone (see
    /// [`Error::ManagerGone`]).
    pub fn manager_gone(&self) -> bool {
        self.manager_gone
    }

    /// Reads pending control messages without blocking. A dead manager is
    /// reported once ([`Error::ManagerGone`]); the channels already set up
    /// keep working after that, without it.
    fn poll_ctrl(&mut self) -> Result<(), Error> {
        if self.manager_gone {
            self.reap_dead_peers();
            return Ok(());
        }
        self.send_unsent();
        // A message that could not be acted on is reported once the
        // socket is read out, not at once: those behind it came with the
        // same wake-up, and nothing else makes the stack read them.
        let mut failed = None;
        loop {
            match ctrl::recv(self.ctrl_fd(), true) {
                Ok((m, fds)) => {
                    match (self.handle_async(m, fds), &failed) {
                        (Ok(()), _) => {}
                        (Err(e), None) => failed = Some(e),
                        // Only the first is returned.
                        (Err(e), Some(_)) => {
                            tracing::warn!(error = %e, "control message from the manager not handled")
                        }
                    }
                }
                // Everything a manager sent is queued before it dies, so a
                // dead one whose socket is not closed yet (a process
                // releases its robust futexes before its files) has
                // nothing more to say.
                Err(RecvError::Io(e))
                    if e.kind() == io::ErrorKind::WouldBlock
                        && crate::liveness::died(self.seg.manager_alive()) =>
                {
                    self.manager_gone = true;
                    return Err(Error::ManagerGone);
                }
                Err(RecvError::Io(e)) if e.kind() == io::ErrorKind::WouldBlock => {
                    return failed.map_or(Ok(()), Err)
                }
                Err(RecvError::Closed) => {
                    self.manager_gone = true;
                    return Err(Error::ManagerGone);
                }
                Err(RecvError::Proto(p)) => {
                    tracing::warn!(error = %p, "malformed message from the manager ignored");
                    // If it stood for a reply, the next is the next
                    // request's: keep them in step. (An unprompted message
                    // malformed this way costs a late reply's settling.)
                    if !self.unanswered.is_empty() {
                        self.on_reply(Err(Error::Protocol(p.to_string())));
                    }
                }
                Err(e) => return Err(recv_err(e)),
            }
        }
    }

    /// With no manager left to announce deaths, looks at the peers'
    /// pidfds: a peer whose process exited is closed here as the manager's
    /// `PeerDown` would (what it sent is delivered, then a reset), so a
    /// reader waiting on it does not wait forever. Called on the liveness
    /// tick, which runs while the manager is gone.
    fn reap_dead_peers(&mut self) {
        let dead: Vec<u16> = self
            .channels
            .iter()
            .filter(|c| {
                c.peer_pidfd.as_ref().is_some_and(|fd| {
                    let mut p = [rustix::event::PollFd::new(fd, rustix::event::PollFlags::IN)];
                    matches!(rustix::event::poll(&mut p, Some(&rustix::time::Timespec::default())), Ok(n) if n > 0)
                })
            })
            .map(|c| c.peer)
            .collect();
        for peer in dead {
            tracing::info!(
                stack = self.id,
                peer,
                "peer exited while no manager runs: reset"
            );
            self.close_channel(peer, None);
        }
    }

    /// Whether `peer` still has a channel here, after closing those of
    /// peers whose process exited (their pidfds): what a stack without a
    /// manager can know of a peer.
    pub(crate) fn peer_alive(&mut self, peer: PeerId) -> bool {
        self.reap_dead_peers();
        self.by_peer.contains_key(&peer.0)
    }

    /// Records that `addr` resolves to `peer` (a route the caller forgot
    /// but found still good).
    pub(crate) fn remember_resolution(&mut self, addr: SocketAddr, peer: PeerId) {
        self.resolved.insert(addr, peer.0);
    }

    /// Handles control messages if the manager queued any.
    fn poll_ctrl_if_bumped(&mut self) -> Result<(), Error> {
        // Messages that found the socket full wait for room, not for news
        // (a manager reading a release answers nothing, so rings nobody).
        // Once a millisecond at most: a stopped manager fails each try.
        if !self.unsent.is_empty() && !self.manager_gone {
            let now = Instant::now();
            if self.unsent_due.is_none_or(|t| now >= t) {
                self.send_unsent();
                self.unsent_due = (!self.unsent.is_empty()).then(|| now + UNSENT_RETRY);
            }
        }
        let seq = self.slot().ctrl_seq.load(Ordering::Acquire);
        if seq != self.ctrl_seen {
            self.ctrl_seen = seq;
            self.poll_ctrl()?;
        }
        Ok(())
    }

    /// Moves whatever the rings hold into the inbox. Returns how many
    /// descriptors were taken.
    fn poll_rings(&mut self) -> Result<usize, Error> {
        self.check_not_forked()?;
        if let Some(e) = self.deferred.take() {
            return Err(e);
        }
        self.poll_ctrl_if_bumped()?;
        let n_ch = self.channels.len();
        let mut total = 0;
        let mut broken = Vec::new();
        for k in 0..n_ch {
            let i = (self.rr + k) % n_ch;
            let n = match self.channels[i].rx.pop_burst(&mut self.scratch) {
                Ok(n) => n,
                Err(_) => {
                    // An impossible ring index: the peer is broken. Count it
                    // and stop reading that channel.
                    self.corrupt += 1;
                    self.slot().corrupt.fetch_add(1, Ordering::Relaxed);
                    broken.push(self.channels[i].peer);
                    continue;
                }
            };
            let peer = self.channels[i].peer;
            self.deliver_burst(peer, n);
            total += n;
        }
        self.rr = self.rr.wrapping_add(1);
        for p in broken {
            self.close_channel(p, None);
        }
        Ok(total)
    }

    /// Waits until something may be ready, per the waiting mode.
    fn wait(&mut self, deadline: Option<Instant>) -> Result<(), Error> {
        // Waits that never sleep get no liveness tick: with the manager
        // dead they look at the control socket themselves (before a
        // non-blocking wait fails), and what that closes ends the wait.
        if self.never_sleeps_tick() {
            self.poll_ctrl()?;
            if !self.inbox.is_empty() {
                return Ok(());
            }
        }
        let mut view = StackView {
            inbox: !self.inbox.is_empty(),
            seg: &self.seg,
            ctrl_seen: self.ctrl_seen,
            id: self.id,
            channels: &mut self.channels,
        };
        let woken = wait_on(
            self.seg.stack_slot(self.id),
            self.seg.manager_alive(),
            !self.manager_here,
            self.mode,
            &mut self.spin,
            &mut view,
            deadline,
            &|| true,
        )?;
        if woken == Woken::Tick {
            self.poll_ctrl()?;
        }
        Ok(())
    }

    /// For a send waiting for room in a ring: with no manager left to
    /// announce a peer's death, looks (once a tick) at the peers' pidfds
    /// as a receive does, so a dead peer's channel is closed and the send
    /// reset rather than waiting for ever. A manager found gone here is
    /// reported by the next receive (the send goes on: its channel works
    /// without one). True if it looked.
    fn reap_while_sending(&mut self) -> bool {
        if !self.dead_manager_tick() {
            return false;
        }
        match self.poll_ctrl() {
            Ok(()) => {}
            Err(Error::ManagerGone) => {
                if self.deferred.is_none() {
                    self.deferred = Some(Error::ManagerGone);
                }
                self.reap_dead_peers();
            }
            Err(e) => tracing::warn!(error = %e, "control message from the manager not handled"),
        }
        true
    }

    /// Whether a busy-polling or non-blocking wait should look at the
    /// control socket as the liveness tick makes a sleeping one do (see
    /// [`Stack::dead_manager_tick`]).
    fn never_sleeps_tick(&mut self) -> bool {
        matches!(self.mode, WaitMode::BusyPoll | WaitMode::NonBlocking) && self.dead_manager_tick()
    }

    /// Whether a wait that never sleeps on the doorbell should look at the
    /// control socket as the liveness tick makes a sleeping one do: it
    /// never gets that tick, and a dead manager bumps no `ctrl_seq`. With
    /// the manager dead: at once (to report it), then once a tick (a
    /// peer's death then shows only in its pidfd).
    fn dead_manager_tick(&mut self) -> bool {
        if !(self.manager_gone || crate::liveness::died(self.seg.manager_alive())) {
            return false;
        }
        if !self.manager_gone {
            return true;
        }
        let now = Instant::now();
        if self.busy_tick_due.is_some_and(|t| now < t) {
            return false;
        }
        self.busy_tick_due = Some(now + crate::liveness::TICK);
        true
    }

    /// A [`Probe`] on this stack's rings, for a driver that waits without
    /// holding the stack (another thread may send meanwhile). `reuse` is
    /// the previous probe, kept if the channels did not change. Give it
    /// back with [`Stack::end_probe`].
    /// Boxed: a probe holds the segment (~340 bytes), and it moves in and
    /// out of its owner at every wait.
    pub(crate) fn probe(&mut self, reuse: Option<Box<Probe>>) -> Box<Probe> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let mut p = match reuse {
            Some(p) if p.epoch_seen == epoch => p,
            _ => Box::new(Probe {
                seg: self.seg.clone(),
                id: self.id,
                ctrl_seen: 0,
                watches: self.ring_watches(),
                epoch: self.epoch.clone(),
                epoch_seen: epoch,
                mode: self.mode,
                spin: AdaptiveSpin::default(),
                born: self.born,
                manager_here: self.manager_here,
            }),
        };
        p.ctrl_seen = self.ctrl_seen;
        p.mode = self.mode;
        p.spin = std::mem::take(&mut self.spin);
        p
    }

    /// Brings a probe that stays out up to date after a drain: what the
    /// control socket said is seen, and new channels are watched. Counts
    /// a hit for the adaptive policy.
    pub(crate) fn refresh_probe(&mut self, p: &mut Probe) {
        let epoch = self.epoch.load(Ordering::Acquire);
        if p.epoch_seen != epoch {
            p.watches = self.ring_watches();
            p.epoch_seen = epoch;
        }
        p.ctrl_seen = self.ctrl_seen;
        p.spin.on_spin_start();
        p.spin.on_spin_hit();
    }

    /// A watch of every channel's receive ring, for a probe.
    fn ring_watches(&self) -> Vec<(u16, Box<dyn RingWatch>)> {
        self.channels
            .iter()
            .map(|c| (c.peer, c.rx.watch()))
            .collect()
    }

    /// Takes back what a probe learned (the adaptive policy's state).
    pub(crate) fn end_probe(&mut self, p: &mut Probe) {
        self.spin = std::mem::take(&mut p.spin);
    }

    /// Moves up to `max` descriptors from the rings to `f`, validating
    /// each: buffers (data of both interfaces, SYNs) as [`Buf`]s, control
    /// kinds as they are, and a peer's death as [`Incoming::PeerGone`]
    /// after everything it sent. With `ctrl`, reads the control socket even
    /// if the manager did not signal (after a liveness tick).
    pub(crate) fn poll_events(
        &mut self,
        max: usize,
        ctrl: bool,
        f: &mut dyn FnMut(Incoming),
    ) -> Result<usize, Error> {
        self.check_not_forked()?;
        if ctrl {
            self.poll_ctrl()?;
        } else {
            self.poll_ctrl_if_bumped()?;
        }
        let mut total = 0;
        // Events queued earlier (a closed channel's last messages, resets).
        while let Some(ev) = self.inbox.pop_front() {
            match ev {
                Event::Msg(m) => f(Incoming::Message(m)),
                Event::Reset(p) => f(Incoming::PeerGone(p)),
                Event::Sock(i) => f(i),
            }
            total += 1;
        }
        let n_ch = self.channels.len();
        let mut broken = Vec::new();
        for k in 0..n_ch {
            if total >= max {
                break;
            }
            let i = (self.rr + k) % n_ch;
            let want = (max - total).min(BURST);
            let n = match self.channels[i].rx.pop_burst(&mut self.scratch[..want]) {
                Ok(n) => n,
                Err(_) => {
                    self.corrupt += 1;
                    self.slot().corrupt.fetch_add(1, Ordering::Relaxed);
                    broken.push(self.channels[i].peer);
                    continue;
                }
            };
            let peer = self.channels[i].peer;
            self.prefetch_scratch(n, true);
            // As in `deliver_burst`: any new references before the stores.
            self.keep_refs(n);
            for j in 0..n {
                let d = self.scratch[j];
                if kind::carries_buffer(d.kind) {
                    if let Some(raw) = self.take_descriptor(peer, &d) {
                        let buf = Buf::new(self.pool_ref(), raw, d.len as usize);
                        f(Incoming::Buf {
                            from: PeerId(peer),
                            kind: d.kind,
                            conn: d.conn,
                            buf,
                        });
                    }
                } else if kind::is_known(d.kind) {
                    f(Incoming::Control {
                        from: PeerId(peer),
                        kind: d.kind,
                        conn: d.conn,
                        arg: d.index,
                        arg2: d.len,
                    });
                } else {
                    self.corrupt += 1;
                    self.slot().corrupt.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(peer, ?d, "rejected a descriptor of unknown kind");
                }
            }
            total += n;
        }
        self.rr = self.rr.wrapping_add(1);
        for p in broken {
            self.close_channel(p, None);
        }
        while let Some(ev) = self.inbox.pop_front() {
            match ev {
                Event::Msg(m) => f(Incoming::Message(m)),
                Event::Reset(p) => f(Incoming::PeerGone(p)),
                Event::Sock(i) => f(i),
            }
            total += 1;
        }
        Ok(total)
    }

    /// Pushes one control descriptor (no buffer) to `peer`: `arg` goes in
    /// the descriptor's `index`, `arg2` in its `len`. `Ok(false)` when the
    /// ring is full. With `notify` false the peer is not woken (call
    /// [`Stack::wake_peer`] after a burst).
    pub(crate) fn push_control(
        &mut self,
        peer: PeerId,
        kind: u8,
        conn: u32,
        [arg, arg2]: [u32; 2],
        notify: bool,
    ) -> Result<bool, Error> {
        let ci = *self.by_peer.get(&peer.0).ok_or(Error::Reset(peer))?;
        self.check_open(ci, peer)?;
        let ch = &mut self.channels[ci];
        let d = Descriptor {
            index: arg,
            len: arg2,
            kind,
            conn,
            ..Descriptor::default()
        };
        match ch.tx.push_one(d.to_words()) {
            Ok(true) => {
                if notify {
                    Self::notify(&self.seg, ch);
                }
                Ok(true)
            }
            Ok(false) => Ok(false),
            Err(_) => {
                self.close_channel(peer.0, None);
                Err(Error::Reset(peer))
            }
        }
    }

    /// Pushes a buffer of kind `kind` for the peer's `conn`, or hands it
    /// back (`Ok(Some)`) when the ring is full, or with the error when the
    /// channel is gone. With `notify` false the
    /// peer is not woken (call [`Stack::wake_peer`] after a burst).
    pub(crate) fn push_buf(
        &mut self,
        peer: PeerId,
        kind: u8,
        conn: u32,
        buf: BufMut,
        notify: bool,
    ) -> Result<Option<BufMut>, (Error, BufMut)> {
        let Some(&ci) = self.by_peer.get(&peer.0) else {
            return Err((Error::Reset(peer), buf));
        };
        if let Err(e) = self.check_open(ci, peer) {
            return Err((e, buf));
        }
        let ch = &mut self.channels[ci];
        match ch.tx_space(1) {
            Ok(0) => {
                Self::notify(&self.seg, ch);
                Ok(Some(buf))
            }
            Ok(_) => {
                let (raw, len) = take_for_send(self.refs.get_mut(), &self.pool, buf);
                let d = self.pool.prepare_send(raw, len as u32, peer.0, conn, kind);
                let pushed = ch.tx.push_one(d.to_words()).unwrap_or(false);
                debug_assert!(pushed, "we are the only producer and saw room");
                if notify {
                    Self::notify(&self.seg, ch);
                }
                Ok(None)
            }
            Err(()) => {
                self.close_channel(peer.0, None);
                Err((Error::Reset(peer), buf))
            }
        }
    }

    /// Pushes to `peer`, in order, as many of `bufs` (kind, receiver's
    /// connection, buffer) as its ring has room for, without ringing it;
    /// removes those from `bufs` and returns how many. The references are
    /// released first (locked decrements) and the ring written after, with
    /// no locked instruction between the ring's stores: each store's line
    /// comes over from the consumer's core, and a locked instruction after
    /// one would wait for it, where a run of plain stores overlaps them.
    /// Buffers of another pool must not be passed (the socket layer only
    /// sends its own).
    pub(crate) fn push_bufs(
        &mut self,
        peer: PeerId,
        bufs: &mut Vec<(u8, u32, BufMut)>,
    ) -> Result<usize, Error> {
        let ci = *self.by_peer.get(&peer.0).ok_or(Error::Reset(peer))?;
        self.check_open(ci, peer)?;
        let ch = &mut self.channels[ci];
        let room = match ch.tx_space(bufs.len()) {
            Ok(n) => n.min(bufs.len()),
            Err(()) => {
                self.close_channel(peer.0, None);
                return Err(Error::Reset(peer));
            }
        };
        let mut raws = std::mem::take(&mut self.burst_raws);
        let (refs, pool) = (self.refs.get_mut(), &self.pool);
        raws.extend(bufs.drain(..room).map(|(kind, conn, b)| {
            let (raw, len) = take_for_send(refs, pool, b);
            (kind, conn, raw, len)
        }));
        // A slot's worth at a time: its headers stamped, then its one push
        // (three descriptors to a line). The slot's store publishes as soon
        // as those headers' lines are ours, so the reader can start on it
        // while the next slot's stamps are still on their way.
        let ch = &mut self.channels[ci];
        for group in raws.chunks(SLOT_DESCS) {
            let mut descs = [Descriptor::default(); SLOT_DESCS];
            for (d, &(kind, conn, raw, len)) in descs.iter_mut().zip(group) {
                *d = self.pool.prepare_send(raw, len as u32, peer.0, conn, kind);
            }
            let n = ch.tx.push_burst(&descs[..group.len()]).unwrap_or(0);
            debug_assert_eq!(n, group.len(), "we are the only producer and saw room");
        }
        raws.clear();
        self.burst_raws = raws;
        Ok(room)
    }

    /// Starts taking the line of the next slot toward `peer` in exclusive
    /// state, ahead of a push: the wake-up check's fence after the push
    /// then need not wait for that line.
    #[inline]
    pub(crate) fn prefetch_tx(&self, peer: PeerId) {
        if let Some(&ci) = self.by_peer.get(&peer.0) {
            self.channels[ci].tx.prefetch_next();
        }
    }

    /// Whether the ring to `peer` has room for a descriptor (true when
    /// there is no channel or it is broken: a send then fails at once, it
    /// does not wait).
    pub(crate) fn tx_room(&mut self, peer: PeerId) -> bool {
        match self.by_peer.get(&peer.0) {
            Some(&ci) => self.channels[ci].tx_space(1).map_or(true, |n| n > 0),
            None => true,
        }
    }

    /// Wakes `peer` if it sleeps (after pushes made with `notify` false).
    pub(crate) fn wake_peer(&self, peer: PeerId) {
        if let Some(&ci) = self.by_peer.get(&peer.0) {
            Self::notify(&self.seg, &self.channels[ci]);
        }
    }

    /// Asks peers to ring the eventfd doorbell (not the futex) when they
    /// send: what a reactor that polls [`Stack::doorbell_fd`] needs. The
    /// Dekker half of `notify`: publish, then look at the rings. Returns
    /// false (and leaves the doorbell unarmed) when something is already
    /// there to drain.
    pub(crate) fn arm_doorbell(&mut self) -> bool {
        if self.forked() {
            return false; // not our slot: the caller drains, and fails
        }
        let slot = self.seg.stack_slot(self.id);
        slot.sleeping.store(SLEEP_EVENTFD, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let ready = !self.inbox.is_empty()
            || slot.ctrl_seq.load(Ordering::Acquire) != self.ctrl_seen
            || self.channels.iter_mut().any(|c| c.rx.has_data());
        if ready {
            slot.sleeping.store(0, Ordering::Relaxed);
        }
        !ready
    }

    /// Whether anything waits to be drained (shared loads only).
    pub(crate) fn has_input(&mut self) -> bool {
        !self.inbox.is_empty()
            || self.slot().ctrl_seq.load(Ordering::Acquire) != self.ctrl_seen
            || self.channels.iter_mut().any(|c| c.rx.has_data())
    }

    /// How long a waiter should watch the rings before sleeping now, per
    /// the adaptive policy (0 unless a peer is awake on another CPU).
    pub(crate) fn spin_budget_now(&mut self) -> u64 {
        if self.mode != WaitMode::Adaptive {
            return if self.mode == WaitMode::BusyPoll {
                u64::MAX
            } else {
                0
            };
        }
        let my_cpu = rustix::thread::sched_getcpu() as u32 + 1;
        let slot = self.seg.stack_slot(self.id);
        if slot.cpu.load(Ordering::Relaxed) != my_cpu {
            slot.cpu.store(my_cpu, Ordering::Relaxed);
        }
        let worth = peers_worth_spinning(&self.seg, self.channels.iter().map(|c| c.peer), my_cpu);
        self.spin.spin_for(worth)
    }

    /// Undoes [`Stack::arm_doorbell`] (peers stop ringing) while a thread
    /// watches the rings itself.
    pub(crate) fn disarm_doorbell(&mut self) {
        if self.forked() {
            return;
        }
        let slot = self.seg.stack_slot(self.id);
        let _ =
            slot.sleeping
                .compare_exchange(SLEEP_EVENTFD, 0, Ordering::AcqRel, Ordering::Relaxed);
    }

    /// The adaptive policy, to report a gap measured outside `wait`.
    pub(crate) fn spin_mut(&mut self) -> &mut AdaptiveSpin {
        &mut self.spin
    }

    /// Consumes a ring of the eventfd doorbell.
    pub(crate) fn clear_doorbell(&self) {
        if !self.forked() {
            self.bell.drain(); // the parent's rings, otherwise
        }
    }

    /// Makes the doorbell fd readable (an external loop must come back).
    pub(crate) fn ring_self(&self) -> io::Result<()> {
        if self.forked() {
            return Err(Error::Forked.into());
        }
        self.bell.ring()
    }

    /// Ends the wait of a driver thread (see [`Probe`]) at once: something
    /// local became ready that its rings will not show. The Dekker pair of
    /// the sleep in `wait_on`: bump what the probe checks, then look at
    /// `sleeping`.
    pub(crate) fn kick(&self) {
        if self.forked() {
            return;
        }
        self.epoch.fetch_add(1, Ordering::SeqCst);
        fence(Ordering::SeqCst);
        let s = self.slot();
        if s.sleeping.load(Ordering::Relaxed) == SLEEP_FUTEX
            && s.sleeping.swap(0, Ordering::AcqRel) == SLEEP_FUTEX
        {
            futex_wake(&s.sleeping);
        }
    }

    /// Forgets which stack `addr` resolved to, so the next `connect` asks
    /// the manager again.
    pub(crate) fn forget_resolution(&mut self, addr: &SocketAddr) {
        self.resolved.remove(addr);
    }

    /// Forgets how `addr` was resolved if it was resolved to `peer` (which
    /// refused a connection to it).
    pub(crate) fn forget_resolution_to(&mut self, addr: &SocketAddr, peer: PeerId) {
        if self.resolved.get(addr) == Some(&peer.0) {
            self.resolved.remove(addr);
        }
    }

    fn next_event(
        &mut self,
        deadline: Option<Instant>,
        mode: Option<WaitMode>,
    ) -> Result<Message, Error> {
        // Before the inbox: what it holds are the parent's buffers, which
        // a forked child must not be handed as well.
        self.check_not_forked()?;
        let saved = self.mode;
        if let Some(m) = mode {
            self.mode = m;
        }
        let r = loop {
            if let Some(ev) = self.inbox.pop_front() {
                break match ev {
                    Event::Msg(m) => Ok(m),
                    Event::Reset(p) => Err(Error::Reset(p)),
                    Event::Sock(_) => continue,
                };
            }
            match self.poll_rings() {
                Ok(n) if n > 0 => continue,
                Ok(_) => {}
                Err(e) => break Err(e),
            }
            if self.inbox.is_empty() {
                if let Err(e) = self.wait(deadline) {
                    break Err(e);
                }
            }
        };
        self.mode = saved;
        r
    }

    /// Receives the next message, waiting per the stack's mode. A peer that
    /// died or left is reported once as [`Error::Reset`] after the messages
    /// it sent before.
    pub fn recv(&mut self) -> Result<Message, Error> {
        self.next_event(None, None)
    }

    /// Receives without waiting ([`Error::WouldBlock`] when nothing is ready).
    pub fn try_recv(&mut self) -> Result<Message, Error> {
        self.next_event(None, Some(WaitMode::NonBlocking))
    }

    /// Receives, waiting at most `timeout` ([`Error::TimedOut`]). Waits
    /// even in non-blocking mode (adaptively then), since a timeout asks to.
    /// A timeout too large for a deadline (`Duration::MAX`) waits
    /// without one.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Result<Message, Error> {
        let mode = (self.mode == WaitMode::NonBlocking).then_some(WaitMode::Adaptive);
        // A timeout past what an `Instant` holds (`Duration::MAX`, as one
        // writes "forever") is no deadline, not an overflow panic.
        self.next_event(Instant::now().checked_add(timeout), mode)
    }

    /// Receives up to `max` ready messages into `out` after waiting for the
    /// first; returns how many. An error met once messages are in hand
    /// (the manager found gone, say) is returned by the next receive, so
    /// an `Err` never comes with messages in `out`. With `max` 0 it
    /// returns 0 at once.
    pub fn recv_burst(&mut self, out: &mut Vec<Message>, max: usize) -> Result<usize, Error> {
        self.check_not_forked()?;
        if max == 0 {
            return Ok(0); // room for none: nothing to wait for
        }
        let first = self.recv()?;
        out.push(first);
        let mut n = 1;
        while n < max {
            match self.inbox.front() {
                Some(Event::Msg(_)) => {
                    if let Some(Event::Msg(m)) = self.inbox.pop_front() {
                        out.push(m);
                        n += 1;
                    }
                }
                Some(Event::Reset(_)) => break,
                Some(Event::Sock(_)) => {
                    self.inbox.pop_front();
                }
                None => match self.poll_rings() {
                    Ok(0) => break,
                    Ok(_) => {}
                    Err(e) => {
                        // The messages in hand first; the error next time.
                        self.deferred = Some(e);
                        break;
                    }
                },
            }
        }
        Ok(n)
    }

    /// A writable buffer of at least `len` bytes. When the pool is
    /// exhausted this waits (per the mode) for buffers to come back;
    /// it never fails for lack of buffers except in non-blocking mode.
    pub fn alloc(&self, len: usize) -> Result<BufMut, Error> {
        let mut backoff = 0u32;
        loop {
            match self.pool.alloc(len, self.mode != WaitMode::NonBlocking) {
                Ok(raw) => return Ok(BufMut::new(self.pool_ref(), raw, len)),
                Err(AllocError::TooLarge(n)) => return Err(Error::TooLarge(n)),
                Err(AllocError::Forked) => return Err(Error::Forked),
                Err(AllocError::ManagerGone) => return Err(Error::ManagerGone),
                Err(AllocError::Exhausted) => {
                    if self.mode == WaitMode::NonBlocking {
                        return Err(Error::WouldBlock);
                    }
                    backoff_wait(&mut backoff, self.mode);
                }
            }
        }
    }

    /// Allocates `n` buffers of `len` bytes into `out` with one pass over
    /// the private cache: the burst path of [`Stack::alloc`]. While it
    /// waits for buffers it holds none of them (a burst that kept what it
    /// had waited for ever on anyone who needed one more before freeing
    /// theirs, another such burst say), so it gets all `n` at once or
    /// waits. `n` beyond what the class holds could never be met: it fails
    /// at once with [`Error::BurstTooLarge`] (`InvalidInput`). On an error
    /// `out` is as it was.
    pub fn alloc_burst(&self, len: usize, n: usize, out: &mut Vec<BufMut>) -> Result<(), Error> {
        // Checked once per call, not per buffer: the class table is read
        // only (a `len` past every class fails below as `TooLarge`).
        if let Some(class) = self
            .seg
            .classes()
            .iter()
            .position(|c| c.buf_size as usize >= len)
        {
            let count = self.pool.class_count(&self.seg, class);
            if n > count {
                return Err(Error::BurstTooLarge { n, len, count });
            }
        }
        let mut raws = [crate::pool::RawBuf { class: 0, index: 0 }; BURST];
        let start = out.len();
        let mut done = 0;
        let mut backoff = 0u32;
        while done < n {
            let want = (n - done).min(BURST);
            let got = match self.pool.alloc_many(len, &mut raws[..want]) {
                Ok(g) => g,
                Err(
                    e @ (AllocError::TooLarge(_) | AllocError::Forked | AllocError::ManagerGone),
                ) => {
                    out.truncate(start);
                    return Err(match e {
                        AllocError::TooLarge(l) => Error::TooLarge(l),
                        AllocError::Forked => Error::Forked,
                        _ => Error::ManagerGone,
                    });
                }
                Err(AllocError::Exhausted) => 0,
            };
            for &raw in &raws[..got] {
                out.push(BufMut::new(self.pool_ref(), raw, len));
            }
            done += got;
            if got == 0 {
                // Give back what this call took before waiting.
                out.truncate(start);
                done = 0;
                if self.mode == WaitMode::NonBlocking {
                    return Err(Error::WouldBlock);
                }
                backoff_wait(&mut backoff, self.mode);
            }
        }
        Ok(())
    }

    /// Receives up to `max` messages and shows each to `f` as
    /// `(sender, tag, payload)`; the buffers return to the pool together
    /// right after. Waits for the first message per the mode. The burst
    /// path for consumers that look at each payload and are done with it:
    /// no `Buf` per message, one pass over the private cache per burst.
    /// A peer's reset is reported as [`Error::Reset`] once its earlier
    /// messages were shown. With `max` 0 it returns 0 at once.
    pub fn recv_burst_with(
        &mut self,
        max: usize,
        mut f: impl FnMut(PeerId, u32, &[u8]),
    ) -> Result<usize, Error> {
        self.check_not_forked()?;
        if max == 0 {
            // Nothing may be shown: waiting for a first message would
            // never end (it could not be taken).
            return Ok(0);
        }
        loop {
            // Messages already queued as `Buf`s (after a reset, say) first.
            if let Some(ev) = self.inbox.pop_front() {
                return match ev {
                    Event::Msg(m) => {
                        f(m.from, m.tag, &m.buf);
                        Ok(1)
                    }
                    Event::Reset(p) => Err(Error::Reset(p)),
                    Event::Sock(_) => continue,
                };
            }
            if let Some(e) = self.deferred.take() {
                return Err(e);
            }
            self.poll_ctrl_if_bumped()?;
            if !self.inbox.is_empty() {
                continue;
            }
            let mut shown = 0;
            let mut done = [crate::pool::RawBuf { class: 0, index: 0 }; BURST];
            let n_ch = self.channels.len();
            for k in 0..n_ch {
                if shown >= max {
                    break;
                }
                let i = (self.rr + k) % n_ch;
                let want = (max - shown).min(BURST);
                let Ok(n) = self.channels[i].rx.pop_burst(&mut self.scratch[..want]) else {
                    if shown > 0 {
                        // What was shown is this call's result; the next
                        // call meets the broken ring again.
                        break;
                    }
                    // A broken ring: the general path reports and closes it.
                    return self.recv().map(|m| {
                        f(m.from, m.tag, &m.buf);
                        1
                    });
                };
                let peer = self.channels[i].peer;
                self.prefetch_scratch(n, false);
                // Buffers taken (to free below), and messages shown. The
                // guard sees to them if `f` panics.
                let mut g = Shown {
                    stack: &mut *self,
                    done: &mut done,
                    taken: 0,
                    next: 0,
                    n,
                    peer,
                    unwinding: true,
                };
                let mut k_shown = 0;
                for j in 0..n {
                    g.next = j + 1;
                    let d = g.stack.scratch[j];
                    if !kind::carries_buffer(d.kind) && kind::is_known(d.kind) {
                        // The socket layer's control kinds are no messages
                        // (`recv` drops them too), and not corrupt.
                        continue;
                    }
                    if let Some(raw) = g.stack.take_descriptor(peer, &d) {
                        // Counted before `f` sees it: freed if `f` panics.
                        g.done[g.taken] = raw;
                        g.taken += 1;
                        // A socket-layer buffer (stream bytes, a SYN) is
                        // no message either: it only goes back.
                        if d.kind == kind::DATA {
                            let (ptr, _) = g.stack.pool.data(raw);
                            // SAFETY: `take_descriptor` checked the buffer
                            // is ours (HELD) and `d.len` fits it; it stays
                            // ours until `free_many` below (or the guard's).
                            let payload =
                                unsafe { std::slice::from_raw_parts(ptr, d.len as usize) };
                            f(PeerId(peer), d.conn, payload);
                            k_shown += 1;
                        }
                    }
                }
                g.unwinding = false;
                let k_ok = g.taken;
                drop(g);
                self.pool.free_many(&done[..k_ok]);
                shown += k_shown;
            }
            self.rr = self.rr.wrapping_add(1);
            if shown > 0 {
                return Ok(shown);
            }
            self.wait(None)?;
        }
    }

    /// Sends `n` messages of `len` bytes to `peer`, letting `fill(i, payload)`
    /// write each straight into its pool buffer: the burst path for
    /// producers, with no `BufMut` per message and one pass over the private
    /// cache per burst. Waits (per the mode) for buffers and ring space.
    pub fn send_burst_with(
        &mut self,
        peer: PeerId,
        n: usize,
        len: usize,
        mut fill: impl FnMut(usize, &mut [u8]),
    ) -> Result<(), Error> {
        let Some(&ci) = self.by_peer.get(&peer.0) else {
            return Err(self.no_channel(peer));
        };
        let mut ci = ci;
        let mut raws = [crate::pool::RawBuf { class: 0, index: 0 }; BURST];
        let mut descs = [Descriptor::default(); BURST];
        let mut sent = 0;
        let mut backoff = 0u32;
        while sent < n {
            self.check_open(ci, peer)?;
            let free = match self.channels[ci].tx_space((n - sent).min(BURST)) {
                Ok(f) => f,
                Err(()) => {
                    self.close_channel(peer.0, None);
                    return Err(Error::Reset(peer));
                }
            };
            if free == 0 {
                Self::notify(&self.seg, &self.channels[ci]);
                if self.mode == WaitMode::NonBlocking {
                    return Err(Error::WouldBlock);
                }
                backoff_wait(&mut backoff, self.mode);
                if self.reap_while_sending() {
                    // Channels may have closed (and moved).
                    ci = *self.by_peer.get(&peer.0).ok_or(Error::Reset(peer))?;
                }
                continue;
            }
            let want = free.min(BURST).min(n - sent);
            let got = match self.pool.alloc_many(len, &mut raws[..want]) {
                Ok(g) => g,
                Err(AllocError::TooLarge(l)) => return Err(Error::TooLarge(l)),
                Err(AllocError::Forked) => return Err(Error::Forked),
                Err(AllocError::ManagerGone) => return Err(Error::ManagerGone),
                Err(AllocError::Exhausted) => {
                    Self::notify(&self.seg, &self.channels[ci]);
                    if self.mode == WaitMode::NonBlocking {
                        return Err(Error::WouldBlock);
                    }
                    backoff_wait(&mut backoff, self.mode);
                    continue;
                }
            };
            // The guard sees to the buffers if `fill` panics.
            let mut g = Filling {
                chan: &mut self.channels[ci],
                seg: &self.seg,
                pool: &self.pool,
                raws: &raws[..got],
                descs: &mut descs,
                stamped: 0,
                unwinding: true,
            };
            for k in 0..got {
                let raw = g.raws[k];
                let (ptr, _) = g.pool.data(raw);
                // SAFETY: freshly allocated to us (ALLOCATED), `len` fits
                // the class; nobody else touches it until it is sent.
                let payload = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                fill(sent + k, payload);
                g.descs[k] = g.pool.prepare_send(raw, len as u32, peer.0, 0, kind::DATA);
                g.stamped = k + 1;
            }
            g.unwinding = false;
            let pushed = g.chan.tx.push_burst(&g.descs[..got]).unwrap_or(0);
            debug_assert_eq!(pushed, got, "we are the only producer and saw room");
            drop(g);
            sent += got;
        }
        Self::notify(&self.seg, &self.channels[ci]);
        Ok(())
    }

    /// A writable buffer, or [`Error::WouldBlock`] if the pool is exhausted
    /// ([`Error::ManagerGone`] if what it needs is behind a free list the
    /// manager died holding closed: no wait would end that).
    pub fn try_alloc(&self, len: usize) -> Result<BufMut, Error> {
        match self.pool.alloc(len, false) {
            Ok(raw) => Ok(BufMut::new(self.pool_ref(), raw, len)),
            Err(AllocError::TooLarge(n)) => Err(Error::TooLarge(n)),
            Err(AllocError::Exhausted) => Err(Error::WouldBlock),
            Err(AllocError::Forked) => Err(Error::Forked),
            Err(AllocError::ManagerGone) => Err(Error::ManagerGone),
        }
    }

    /// Sends `buf` to `peer` (zero-copy: the buffer itself moves).
    /// Waits while the ring is full; [`Error::Reset`] if the peer is gone.
    pub fn send(&mut self, peer: PeerId, buf: BufMut) -> Result<(), Error> {
        self.send_tagged(peer, 0, buf)
    }

    /// Sends with a tag the receiver sees in [`Message::tag`].
    pub fn send_tagged(&mut self, peer: PeerId, tag: u32, buf: BufMut) -> Result<(), Error> {
        let mut one = Some(buf);
        self.send_from(peer, tag, &mut one, self.mode)
    }

    /// [`Stack::send_tagged`] that hands the buffer back when it fails
    /// (a reset peer, or a full ring in non-blocking mode), so a caller
    /// that must lose nothing (the C ABI) keeps it.
    pub fn send_or_return(
        &mut self,
        peer: PeerId,
        tag: u32,
        buf: BufMut,
    ) -> Result<(), (Error, Option<BufMut>)> {
        let mut one = Some(buf);
        match self.send_from(peer, tag, &mut one, self.mode) {
            Ok(()) => Ok(()),
            Err(e) => Err((e, one)),
        }
    }

    /// Sends without waiting: a full ring hands the buffer back in
    /// `Err((Error::WouldBlock, buf))`.
    pub fn try_send(&mut self, peer: PeerId, buf: BufMut) -> Result<(), (Error, Option<BufMut>)> {
        let mut one = Some(buf);
        match self.send_from(peer, 0, &mut one, WaitMode::NonBlocking) {
            Ok(()) => Ok(()),
            Err(e) => Err((e, one)),
        }
    }

    /// Sends every buffer in `bufs` (in order) with one doorbell check at
    /// the end: the burst path for one-way streams. A buffer of another
    /// pool fails the call with [`Error::ForeignBuffer`] before anything
    /// is sent. Waits (per the mode) for ring space; in non-blocking mode
    /// a full ring fails with [`Error::WouldBlock`]. On any error the
    /// buffers not sent stay in `bufs`.
    pub fn send_burst(&mut self, peer: PeerId, bufs: &mut Vec<BufMut>) -> Result<(), Error> {
        let Some(&ci) = self.by_peer.get(&peer.0) else {
            return Err(self.no_channel(peer));
        };
        let mut ci = ci;
        for b in bufs.iter() {
            self.check_ours(b)?;
        }
        let mut descs = [Descriptor::default(); BURST];
        let mut sent = 0;
        let total = bufs.len();
        let mut backoff = 0u32;
        while sent < total {
            self.check_open(ci, peer)?;
            let ch = &mut self.channels[ci];
            let free = match ch.tx_space((total - sent).min(BURST)) {
                Ok(f) => f,
                Err(()) => {
                    self.close_channel(peer.0, None);
                    return Err(Error::Reset(peer));
                }
            };
            if free == 0 {
                Self::notify(&self.seg, ch);
                if self.mode == WaitMode::NonBlocking {
                    // What was not sent stays in `bufs`.
                    return Err(Error::WouldBlock);
                }
                backoff_wait(&mut backoff, self.mode);
                if self.reap_while_sending() {
                    // Channels may have closed (and moved).
                    ci = *self.by_peer.get(&peer.0).ok_or(Error::Reset(peer))?;
                }
                continue;
            }
            let n = free.min(BURST).min(total - sent);
            // Release our references first (locked decrements), then stamp
            // the headers (stores to lines the receiver will read, which
            // must not be held up by a locked instruction after them).
            let mut raws = [(crate::pool::RawBuf { class: 0, index: 0 }, 0usize); BURST];
            for (r, b) in raws.iter_mut().zip(bufs.drain(..n)) {
                *r = take_for_send(self.refs.get_mut(), &self.pool, b);
            }
            for (k, &(raw, len)) in raws[..n].iter().enumerate() {
                descs[k] = self
                    .pool
                    .prepare_send(raw, len as u32, peer.0, 0, kind::DATA);
            }
            let pushed = ch.tx.push_burst(&descs[..n]).unwrap_or(0);
            debug_assert_eq!(pushed, n, "we are the only producer and saw room");
            sent += n;
        }
        Self::notify(&self.seg, &self.channels[ci]);
        Ok(())
    }

    /// Refuses a buffer of another pool. Its (class, index) would name a
    /// buffer of ours: sending it would hand a peer a buffer someone else
    /// may hold, and leave the real one allocated in its own pool.
    pub(crate) fn check_ours(&self, b: &BufMut) -> Result<(), Error> {
        // Almost always our own stack's buffer: one pointer comparison.
        if b.pool_addr() == self.pool.addr() || b.pool_id() == self.pool.pool_id() {
            Ok(())
        } else {
            Err(Error::ForeignBuffer)
        }
    }

    /// The error of a send to `peer`, which has no channel here: `Reset`
    /// while its departure is still to be reported (a receive closed the
    /// channel and queued the reset behind the peer's last messages, which
    /// the caller may be answering), as when a send finds the channel
    /// closing; `NotConnected` otherwise.
    fn no_channel(&self, peer: PeerId) -> Error {
        let reset_queued = self
            .inbox
            .iter()
            .any(|e| matches!(e, Event::Reset(p) if *p == peer));
        if reset_queued {
            Error::Reset(peer)
        } else {
            Error::NotConnected(peer)
        }
    }

    fn check_open(&mut self, ci: usize, peer: PeerId) -> Result<(), Error> {
        self.check_not_forked()?;
        let id = self.channels[ci].id;
        if self.seg.channel(id).state.load(Ordering::Acquire) != chan_state::ACTIVE {
            self.close_channel(peer.0, None);
            return Err(Error::Reset(peer));
        }
        Ok(())
    }

    fn send_from(
        &mut self,
        peer: PeerId,
        tag: u32,
        slot: &mut Option<BufMut>,
        mode: WaitMode,
    ) -> Result<(), Error> {
        if let Some(b) = slot {
            self.check_ours(b)?;
        }
        let mut backoff = 0u32;
        // Whether the control socket was read while waiting for room: a
        // channel missing after that was closed by the news it held.
        let mut polled = false;
        loop {
            let Some(&ci) = self.by_peer.get(&peer.0) else {
                return Err(if polled {
                    Error::Reset(peer)
                } else {
                    self.no_channel(peer)
                });
            };
            self.check_open(ci, peer)?;
            let ch = &mut self.channels[ci];
            match ch.tx_space(1) {
                Ok(0) => {
                    if mode == WaitMode::NonBlocking {
                        return Err(Error::WouldBlock);
                    }
                    // Full: make sure the consumer is awake, then wait for it
                    // to make room. Also watch for the peer's death.
                    Self::notify(&self.seg, ch);
                    backoff_wait(&mut backoff, mode);
                    if self.slot().ctrl_seq.load(Ordering::Acquire) != self.ctrl_seen {
                        polled = true;
                        self.poll_rings()?;
                    }
                    polled |= self.reap_while_sending();
                }
                Ok(_) => {
                    let buf = slot.take().expect("buffer present until sent");
                    let (raw, len) = take_for_send(self.refs.get_mut(), &self.pool, buf);
                    let d = self
                        .pool
                        .prepare_send(raw, len as u32, peer.0, tag, kind::DATA);
                    let pushed = ch.tx.push_one(d.to_words()).unwrap_or(false);
                    debug_assert!(pushed, "we are the only producer and saw room");
                    Self::notify(&self.seg, ch);
                    return Ok(());
                }
                Err(()) => {
                    self.close_channel(peer.0, None);
                    return Err(Error::Reset(peer));
                }
            }
        }
    }

    /// Wakes the peer if it is asleep (the producer half of the Dekker
    /// handshake in `wait`): a futex wake, or the doorbell for a peer that
    /// waits in a reactor.
    #[inline]
    fn notify(seg: &Segment, ch: &Chan) {
        fence(Ordering::SeqCst);
        let s = seg.stack_slot(ch.peer);
        if s.sleeping.load(Ordering::Relaxed) != 0 {
            match s.sleeping.swap(0, Ordering::AcqRel) {
                SLEEP_FUTEX => {
                    s.rung_at.store(now_ns(), Ordering::Relaxed);
                    futex_wake(&s.sleeping);
                }
                SLEEP_EVENTFD => {
                    s.rung_at.store(now_ns(), Ordering::Relaxed);
                    let _ = ch.peer_bell.ring();
                }
                _ => {}
            }
        }
    }

    /// Peers this stack has a channel to.
    pub fn peers(&self) -> Vec<PeerId> {
        self.channels.iter().map(|c| PeerId(c.peer)).collect()
    }

    /// Test hook: pushes a raw descriptor to `peer` as if it were a buffer,
    /// to check that receivers reject forgeries. Not for applications.
    /// Returns whether it fit in the ring.
    #[doc(hidden)]
    pub fn __push_raw(&mut self, peer: PeerId, d: Descriptor) -> Result<bool, Error> {
        self.raw_push(peer, |tx| Ok(tx.push_burst(&[d])? == 1))
    }

    /// Test hook: publishes a ring slot toward `peer` that claims `count`
    /// descriptors, as a broken or hostile stack could. `Ok(false)` when
    /// the ring is full or its slots carry no count (DPDK). Not for
    /// applications.
    #[doc(hidden)]
    pub fn __push_slot_count(&mut self, peer: PeerId, count: u32) -> Result<bool, Error> {
        self.raw_push(peer, |tx| tx.__publish_count(count))
    }

    /// The test hooks' way into the ring toward `peer`: `push`, then the
    /// doorbell.
    fn raw_push(
        &mut self,
        peer: PeerId,
        push: impl FnOnce(&mut dyn DescProducer) -> Result<bool, crate::ring::RingError>,
    ) -> Result<bool, Error> {
        let ci = *self.by_peer.get(&peer.0).ok_or(Error::NotConnected(peer))?;
        let ch = &mut self.channels[ci];
        let ok = push(&mut *ch.tx).map_err(|e| Error::Protocol(e.to_string()))?;
        Self::notify(&self.seg, ch);
        Ok(ok)
    }

    /// Test hook: stores `value` into 32-bit word `word` of the shared
    /// ring memory of the channel to `peer` that this stack's side writes,
    /// as a broken or hostile stack could: a word of the ring it produces
    /// into (taken modulo the ring's size, sixteen words a slot: the
    /// descriptors, then the sequence number at 12 and the count at 13),
    /// or, for `word == u32::MAX`, the index at which it consumes the
    /// peer's ring. `Ok(false)` on DPDK, whose rings are not in the
    /// segment. Not for applications.
    #[doc(hidden)]
    pub fn __scribble_ring(&mut self, peer: PeerId, word: u32, value: u32) -> Result<bool, Error> {
        if !matches!(self.pool, PoolRef::Shm(_)) {
            return Ok(false);
        }
        let ci = *self.by_peer.get(&peer.0).ok_or(Error::NotConnected(peer))?;
        let ch = &self.channels[ci];
        const WORDS: u32 = (core::mem::size_of::<crate::layout::RingSlot>() / 4) as u32;
        let target = if word == u32::MAX {
            let (h, _) = self.seg.ring_ptrs(ch.id, 1 - ch.dir as usize);
            // SAFETY: `ring_ptrs` points into the mapping, which `self.seg`
            // keeps alive; the header is atomics only.
            let hdr: &crate::layout::RingHeader = unsafe { &*h };
            let head: &AtomicU32 = &hdr.head;
            head
        } else {
            let (_, slots) = self.seg.ring_ptrs(ch.id, ch.dir as usize);
            let w = word % (self.seg.ring_capacity() * WORDS);
            // SAFETY: `w` words lie inside the ring's slots (modulo its
            // size), which lie inside the mapping `self.seg` keeps alive;
            // slots are 64-byte aligned, so every word is aligned for an
            // `AtomicU32`, and the other side reads them only as
            // untrusted.
            unsafe { &*slots.add(w as usize * 4).cast::<AtomicU32>() }
        };
        target.store(value, Ordering::Release);
        Ok(true)
    }

    /// Test hook: sends a real buffer under any descriptor kind and
    /// connection id, as a hostile peer could. Hands the buffer back when
    /// the ring is full. Not for applications.
    #[doc(hidden)]
    pub fn __push_buf_raw(
        &mut self,
        peer: PeerId,
        kind: u8,
        conn: u32,
        buf: BufMut,
    ) -> Result<Option<BufMut>, Error> {
        self.push_buf(peer, kind, conn, buf, true)
            .map_err(|(e, _)| e)
    }

    /// How many buffers of the smallest class this stack may keep aside
    /// beyond its pool cache, at most `want`: a quarter of the class's
    /// share per admitted stack (the pool caches take at most half of
    /// it), so what every stack keeps cannot empty the class.
    pub(crate) fn keep_aside(&self, want: usize) -> usize {
        let stacks = self.seg.max_stacks().max(1) as usize;
        want.min(self.pool.class_count(&self.seg, 0) / (4 * stacks))
    }

    /// Test hook: the segment.
    #[doc(hidden)]
    pub fn __segment(&self) -> &Segment {
        &self.seg
    }

    /// Test hook: buffers of the pool stamped in flight to this stack and
    /// not received yet (in a ring, or stamped and never pushed), on
    /// either backend.
    #[doc(hidden)]
    pub fn __in_flight_to_me(&self) -> usize {
        match &self.pool {
            PoolRef::Shm(_) => {
                use crate::layout::bufword;
                let seg = &self.seg;
                let mut n = 0;
                for (class, c) in seg.classes().iter().enumerate() {
                    for i in 0..c.count {
                        let w = seg
                            .buf_header(class, i)
                            .map_or(0, |h| h.word.load(Ordering::Acquire));
                        if bufword::state(w) == bufword::INFLIGHT && bufword::owner(w) == self.id {
                            n += 1;
                        }
                    }
                }
                n
            }
            #[cfg(feature = "dpdk")]
            PoolRef::Dpdk(p) => p.in_flight_to(self.id),
        }
    }
}

impl Drop for Stack {
    /// Tells the manager this stack is gone by half-closing its control
    /// socket. The socket itself stays open as long as a buffer of the
    /// stack lives (the pool keeps it: the manager must not reclaim a
    /// buffer still in use), and the manager used to take the stack for
    /// alive until then: its peers sent into a ring nobody read, without
    /// a reset, and its addresses stayed bound. Reading the end of file,
    /// the manager now resets the peers and frees the addresses, and
    /// reclaims the buffers only once the socket closes.
    fn drop(&mut self) {
        if self.forked() {
            return; // the parent's socket (here an inert copy)
        }
        let _ = rustix::net::shutdown(self.ctrl_fd(), rustix::net::Shutdown::Write);
    }
}

/// `send_burst_with`'s buffers while the caller's `fill` runs. If `fill`
/// panics (and the application catches it), the messages filled and
/// stamped in flight to the peer go out, as whole messages, and the
/// buffers not filled go back to the pool. Without it they stayed
/// allocated to this stack, and stamped for the receiver with no
/// descriptor in its ring, as long as both lived.
struct Filling<'a> {
    chan: &'a mut Chan,
    seg: &'a Segment,
    pool: &'a PoolRef,
    raws: &'a [crate::pool::RawBuf],
    descs: &'a mut [Descriptor; BURST],
    /// Buffers filled and stamped in flight (`descs[..stamped]`).
    stamped: usize,
    /// Until the burst is pushed the normal way.
    unwinding: bool,
}

impl Drop for Filling<'_> {
    fn drop(&mut self) {
        if !self.unwinding {
            return;
        }
        // There was room for all of them (seen before allocating).
        let _ = self.chan.tx.push_burst(&self.descs[..self.stamped]);
        Stack::notify(self.seg, self.chan);
        self.pool.free_many(&self.raws[self.stamped..]);
    }
}

/// `recv_burst_with`'s burst while the caller's `f` runs. If `f` panics
/// (and the application catches it), the buffers taken go back to the
/// pool, and the messages of the burst after the one `f` was shown are
/// kept for the next receive. Without it the buffers stayed held by this
/// stack with no handle, and the rest of the burst, off the ring and
/// never taken, were lost and their buffers with them, as long as the
/// stack lived.
struct Shown<'a> {
    stack: &'a mut Stack,
    done: &'a mut [crate::pool::RawBuf; BURST],
    /// Buffers taken (`done[..taken]`).
    taken: usize,
    /// The first descriptor of `stack.scratch[..n]` not looked at.
    next: usize,
    n: usize,
    peer: u16,
    /// Until the burst is handled the normal way.
    unwinding: bool,
}

impl Drop for Shown<'_> {
    fn drop(&mut self) {
        if !self.unwinding {
            return;
        }
        self.stack.pool.free_many(&self.done[..self.taken]);
        let rest = self.n - self.next;
        self.stack.scratch.copy_within(self.next..self.n, 0);
        self.stack.deliver_burst(self.peer, rest);
    }
}

impl Chan {
    /// Descriptors one push can take, for `want`: reads the consumer's
    /// index only when the cached one shows room for fewer (reading it on
    /// every send cost a cross-core miss per message: the consumer writes
    /// it on every pop). Pushes one at a time take a slot each, so only
    /// "more than zero" holds for them.
    fn tx_space(&mut self, want: usize) -> Result<usize, ()> {
        Ok(self
            .tx
            .room(want.min(u32::MAX as usize) as u32)
            .map_err(|_| ())? as usize)
    }
}

/// What arrived, for the socket layer (see [`Stack::poll_events`]).
pub(crate) enum Incoming {
    /// A validated buffer of a buffer-carrying kind.
    Buf {
        from: PeerId,
        kind: u8,
        conn: u32,
        buf: Buf,
    },
    /// A control descriptor (no buffer): only its fields (`arg` is the
    /// descriptor's `index`, `arg2` its `len`).
    Control {
        from: PeerId,
        kind: u8,
        conn: u32,
        arg: u32,
        arg2: u32,
    },
    /// A message of the zero-copy interface (the socket layer drops it).
    Message(Message),
    /// The peer died or left; everything it sent came before.
    PeerGone(PeerId),
}

/// How a wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Woken {
    /// Something looked ready (seen while spinning or before sleeping), or
    /// a peer rang.
    Ready,
    /// The liveness tick: nobody rang; look at the control socket.
    Tick,
}

/// What a waiter looks at while it waits.
trait WaitView {
    /// Whether anything could be ready (shared loads only).
    fn ready(&mut self) -> bool;
    /// Whether spinning can pay: some peer awake on another CPU.
    fn worth_spinning(&self, my_cpu: u32) -> bool;
}

fn peers_worth_spinning(seg: &Segment, peers: impl Iterator<Item = u16>, my_cpu: u32) -> bool {
    peers.into_iter().any(|p| {
        let s = seg.stack_slot(p);
        s.sleeping.load(Ordering::Relaxed) == 0 && s.cpu.load(Ordering::Relaxed) != my_cpu
    })
}

struct StackView<'a> {
    inbox: bool,
    seg: &'a Segment,
    ctrl_seen: u32,
    id: u16,
    channels: &'a mut [Chan],
}

impl WaitView for StackView<'_> {
    fn ready(&mut self) -> bool {
        self.inbox
            || self
                .seg
                .stack_slot(self.id)
                .ctrl_seq
                .load(Ordering::Acquire)
                != self.ctrl_seen
            || self.channels.iter_mut().any(|c| c.rx.has_data())
    }
    fn worth_spinning(&self, my_cpu: u32) -> bool {
        peers_worth_spinning(self.seg, self.channels.iter().map(|c| c.peer), my_cpu)
    }
}

/// A stack's rings seen from a driver thread that waits without holding
/// the stack: the socket layer's sockets share one stack behind a lock,
/// and its driver must not hold that lock while it spins or sleeps, or no
/// other thread could send. Watches every ring, the control sequence and
/// the channel set (a channel added meanwhile ends the wait, since its
/// ring is not watched).
pub(crate) struct Probe {
    seg: Segment,
    id: u16,
    ctrl_seen: u32,
    watches: Vec<(u16, Box<dyn RingWatch>)>,
    epoch: Arc<AtomicU64>,
    epoch_seen: u64,
    mode: WaitMode,
    spin: AdaptiveSpin,
    /// The attaching process's fork generation (see [`crate::fork`]).
    born: crate::fork::Birth,
    /// See [`Stack`]'s field: do not wait on the manager's liveness word.
    manager_here: bool,
}

impl WaitView for Probe {
    fn ready(&mut self) -> bool {
        self.seg
            .stack_slot(self.id)
            .ctrl_seq
            .load(Ordering::Acquire)
            != self.ctrl_seen
            || self.epoch.load(Ordering::Relaxed) != self.epoch_seen
            || self.watches.iter().any(|(_, w)| w.has_data())
    }
    fn worth_spinning(&self, my_cpu: u32) -> bool {
        peers_worth_spinning(&self.seg, self.watches.iter().map(|(p, _)| *p), my_cpu)
    }
}

impl Probe {
    /// Whether anything may be ready now (shared loads only, no waiting).
    pub(crate) fn ready_now(&mut self) -> bool {
        self.ready()
    }

    /// Waits per the mode until something may be ready or `deadline`
    /// ([`Error::TimedOut`]). True if the wait ended on the liveness tick.
    /// An adaptive wait spins only while `may_spin` says so (asked before
    /// and during the spin): the socket layer's driver must not spin while
    /// threads it woke wait for a CPU, maybe this one.
    pub(crate) fn wait(
        &mut self,
        deadline: Option<Instant>,
        may_spin: &dyn Fn() -> bool,
    ) -> Result<bool, Error> {
        if self.born.forked() {
            return Err(Error::Forked); // the slot and rings are the parent's
        }
        let slot: *const StackSlot = self.seg.stack_slot(self.id);
        // SAFETY: the slot lies in the segment's mapping, which `self.seg`
        // keeps mapped for the whole call (a `Segment` holds the mapping's
        // `Arc`, and nothing here drops it); it is shared memory reached only
        // through atomics, so a shared reference is sound. The raw pointer
        // only detaches the borrow from `self`, which `wait_on` needs as the
        // view (cloning the segment instead copied ~340 bytes per wait).
        let slot = unsafe { &*slot };
        let alive: *const AtomicU32 = self.seg.manager_alive();
        // SAFETY: as for `slot`: the segment's header word, kept mapped by
        // `self.seg` for the whole call, reached only atomically.
        let alive = unsafe { &*alive };
        let mut spin = std::mem::take(&mut self.spin);
        let watch = !self.manager_here;
        let r = wait_on(
            slot, alive, watch, self.mode, &mut spin, self, deadline, may_spin,
        );
        self.spin = spin;
        Ok(r? == Woken::Tick)
    }
}

/// The waiting policy (see [`crate::wait`]) over any [`WaitView`].
/// `alive`: the manager's liveness word (see [`crate::liveness`]), waited
/// on unless the manager runs in this process (`watch` false).
#[allow(clippy::too_many_arguments)]
fn wait_on(
    slot: &StackSlot,
    alive: &AtomicU32,
    watch: bool,
    mode: WaitMode,
    spin: &mut AdaptiveSpin,
    view: &mut impl WaitView,
    deadline: Option<Instant>,
    may_spin: &dyn Fn() -> bool,
) -> Result<Woken, Error> {
    let check_deadline = || match deadline {
        Some(d) if Instant::now() >= d => Err(Error::TimedOut),
        _ => Ok(Woken::Ready),
    };
    match mode {
        WaitMode::NonBlocking => return Err(Error::WouldBlock),
        WaitMode::BusyPoll => {
            for _ in 0..64 {
                if view.ready() {
                    return Ok(Woken::Ready);
                }
                spin_hint();
            }
            return check_deadline();
        }
        WaitMode::Adaptive | WaitMode::Blocking => {}
    }
    let my_cpu = rustix::thread::sched_getcpu() as u32 + 1;
    if slot.cpu.load(Ordering::Relaxed) != my_cpu {
        slot.cpu.store(my_cpu, Ordering::Relaxed);
    }
    // The clock feeds only the adaptive policy; blocking mode skips it
    // (three clock reads a sleep, on the critical path of each hop).
    let adaptive = mode == WaitMode::Adaptive;
    let clock = || if adaptive { now_ns() } else { 0 };
    let start = clock();
    if adaptive {
        let budget = spin.spin_for(may_spin() && view.worth_spinning(my_cpu));
        if budget > 0 {
            spin.on_spin_start();
            let mut i = 0u32;
            loop {
                if view.ready() {
                    spin.on_spin_hit();
                    return Ok(Woken::Ready);
                }
                spin_hint();
                i = i.wrapping_add(1);
                if i % 256 == 0 {
                    let now = now_ns();
                    if now - start >= budget || !may_spin() || !view.worth_spinning(my_cpu) {
                        break;
                    }
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(Error::TimedOut);
                    }
                }
            }
        }
    }
    // Sleep. Dekker with `notify`: we store `sleeping` then load the
    // rings; a producer stores its slot then loads `sleeping`. The
    // SeqCst fences on both sides make at least one see the other.
    slot.sleeping.store(SLEEP_FUTEX, Ordering::SeqCst);
    fence(Ordering::SeqCst);
    if view.ready() {
        slot.sleeping.store(0, Ordering::Relaxed);
        return Ok(Woken::Ready);
    }
    let timeout = match deadline {
        Some(d) => {
            let now = Instant::now();
            if now >= d {
                slot.sleeping.store(0, Ordering::Relaxed);
                return Err(Error::TimedOut);
            }
            Some(d - now)
        }
        None => None,
    };
    let slept_from = clock();
    // Only this stack writes its counter: no locked instruction needed.
    slot.sleeps
        .store(slot.sleeps.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
    // One system call to sleep and one (the waker's) to wake, as with a
    // socket. The futex returns at once if a producer already swapped
    // the word back to 0. The manager wakes us the same way after
    // queueing a control message (and bumping `ctrl_seq`). A dead
    // manager ends the sleep through its liveness word, with no timer
    // armed (see `crate::liveness`; where that cannot work, a one-second
    // tick): then, as when nobody rang, we look at the control socket.
    let manager_woke = crate::liveness::sleep(&slot.sleeping, SLEEP_FUTEX, alive, watch, timeout);
    let rung = slot.sleeping.swap(0, Ordering::AcqRel) == 0 && !manager_woke;
    if adaptive {
        let woke = now_ns();
        let rung_at = slot.rung_at.load(Ordering::Relaxed);
        let wake = (rung && rung_at >= slept_from).then(|| woke.saturating_sub(rung_at));
        spin.on_sleep(slept_from - start, woke - slept_from, wake);
    }
    Ok(if rung { Woken::Ready } else { Woken::Tick })
}

/// Waits a little longer each time: spin, then yield, then short sleeps.
/// Used where no doorbell exists (a full ring, an exhausted pool).
fn backoff_wait(step: &mut u32, mode: WaitMode) {
    *step = step.saturating_add(1);
    match mode {
        WaitMode::BusyPoll => spin_hint(),
        _ if *step < 64 => spin_hint(),
        _ if *step < 128 => std::thread::yield_now(),
        _ => std::thread::sleep(Duration::from_micros(20)),
    }
}

impl AsFd for Stack {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.bell.fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `main() -> Result<(), Box<dyn Error>>` prints for a missing
    /// manager (`Debug`, through `io::Error`) says what to do.
    #[test]
    fn a_missing_managers_debug_output_says_how_to_start_one() {
        let e = io::Error::from(Error::NoManager {
            prefix: "xio".into(),
            path: "/tmp/xio-0/xio.sock".into(),
            err: io::ErrorKind::NotFound.into(),
        });
        let shown = format!("{e:?}");
        assert!(
            shown.contains("start one with `xio-manager --prefix xio`"),
            "{shown}"
        );
        assert!(shown.contains("XIO_PREFIX"), "{shown}");
    }
}

//! Sockets over shared memory: [`XioListener`] and [`XioStream`], shaped
//! like `std::net::TcpListener` and `TcpStream` so code ports by changing
//! the type names (the paper's POSIX-like layer, §III-D).
//!
//! ```no_run
//! use std::io::{Read, Write};
//! use xio_core::net::{XioListener, XioStream};
//!
//! let listener = XioListener::bind("10.0.0.1:80")?;   // pool from $XIO_PREFIX
//! std::thread::spawn(move || {
//!     for conn in listener.incoming() {
//!         let mut s = conn.unwrap();
//!         let mut buf = [0u8; 5];
//!         s.read_exact(&mut buf).unwrap();
//!         s.write_all(&buf).unwrap();
//!     }
//! });
//! let mut s = XioStream::connect("10.0.0.1:80")?;
//! s.write_all(b"hello")?;
//! let mut back = [0u8; 5];
//! s.read_exact(&mut back)?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! # How it works
//! A process's sockets share one [`Stack`] (one per [`Net`]); connections
//! multiplex over the channel between two stacks, demultiplexed by the
//! receiving stack's connection table ([`crate::conn::Table`], which has no
//! I/O of its own). Streams are byte streams: reads return what is there,
//! in order, however it was written; a write larger than a pool buffer is
//! split; `write_vectored` packs its slices into one buffer when they fit.
//!
//! **Waiting.** A thread that must wait becomes the *driver* if nobody is:
//! it waits on the stack's rings with the stack's waiting policy (adaptive
//! by default: spin while a peer is awake on another core, then sleep on
//! the futex), without holding the lock, so other threads keep sending.
//! When something arrives it drains every ring into the table and wakes
//! every thread whose connection became ready in one pass (the paper's
//! batch wake-up). Other waiters sleep until woken; none spins, and the
//! driver does not spin either while threads it woke have yet to run
//! (they may need its CPU). When the driver has what it waited for, it
//! hands the role to another waiter.
//! An event loop ([`Net::poll`]) and an async adapter's driver ([`Net::drive`])
//! drain in batches themselves; once a net is polled, its non-blocking
//! reads and writes that find nothing to do say `WouldBlock` without
//! looking at the rings, and tasks' `poll_*` calls leave the rings to the
//! adapter's driver.
//!
//! **Flow control.** Each connection may have a window of buffer capacity
//! unread at the receiver ([`NetBuilder::window`], 2 MiB by default); the
//! reader credits it back as it consumes. A writer without credit waits
//! (or gets `WouldBlock`); nothing is dropped. An exhausted pool is a
//! wait too, and a write falls back to smaller buffers before it waits.
//!
//! **Closing and errors, as Linux TCP.** Dropping a stream sends a FIN
//! (a RST if received data was left unread). Data that arrives for a
//! stream already closed here is answered with a RST, so a peer that
//! keeps writing fails instead of waiting for credit that never comes. A
//! reset (a RST, or the peer process died) is reported once, to the next
//! read or write: `ConnectionReset`, or, if the peer had already finished
//! sending, a write's `BrokenPipe` (Linux's `EPIPE` in close-wait; reads
//! then see end of stream, as Linux's do after a FIN); after that reads
//! return end of stream and writes `BrokenPipe`. A refused connect stays
//! `ConnectionRefused`.
//!
//! **Exiting.** A process that exits (returning from `main`, or
//! `std::process::exit`, or C's `exit`) with connections still open closes
//! them as a socket's would be closed at exit: a FIN each (a RST where
//! received data was left unread), so its peers read end of stream after
//! its last bytes, not a reset. This runs last at exit (after the
//! program's `atexit` handlers and destructors, which still find their
//! streams open) and is best effort (a net whose lock another thread keeps
//! for 50 ms is left to the manager; other threads still running then see
//! their streams closed). A process killed by a signal runs no handler:
//! its peers get a reset (the manager announces the death) after what it
//! sent.

use std::collections::VecDeque;

use crate::signal::ReadSignal;
use crate::sync::FxHashMap as HashMap;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::net::{Shutdown, SocketAddr, ToSocketAddrs};
use std::sync::atomic::{
    AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering as AtomicOrdering,
};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{ready, Context, Poll, Waker};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::buf::{Buf, BufMut};
use crate::conn::{Action, ConnError, ConnId, Table};
use crate::layout::kind;
use crate::stack::{Error, Incoming as StackInput, Kept, PeerId, Probe, Stack};
use crate::wait::WaitMode;

/// Connections a listener holds before it is accepted from, unless
/// [`Net::listen_with_backlog`] says otherwise: Linux's default
/// `SOMAXCONN`.
pub const DEFAULT_BACKLOG: usize = 4096;

/// Sends queued for a peer whose ring is full beyond which resets to it
/// are dropped (see `Core::send_or_queue`).
const RST_QUEUE_MAX: usize = 4096;

/// Most descriptors one drain takes with batch wake-up on: enough to wake
/// many connections per pass, few enough that the first of them is served
/// (and its reply on its way) before the rest are even looked at.
const DRAIN_BATCH: usize = 32;
/// Most emptied waiter lists a net keeps for reuse.
const SPARE_LISTS: usize = 1024;

/// How often a connect refused as this net's own address looks again
/// while a bind of that address is still being answered (`Net::connect_one`).
const BIND_SETTLE: Duration = Duration::from_micros(50);
/// Longest a driver waits before retrying sends that did not fit a full
/// ring (nothing wakes it when the peer makes room).
const RETRY_FULL: Duration = Duration::from_micros(50);
/// Longest pause of [`Net::poll_fd`]'s retry timer: while a peer makes no
/// room (it is stopped, say) or a pool no buffer, the pause doubles from
/// [`RETRY_FULL`] up to this: a loop asleep on the fd wakes about once a
/// millisecond meanwhile.
const RETRY_FULL_MAX: Duration = Duration::from_millis(1);
/// No data for this long means the traffic stopped: an adapter's empty
/// watches then shrink the spin budget to nothing. Longer than any gap the
/// adaptive policy spins through (its ceiling is 200 µs).
const IDLE_AFTER_NS: u64 = 1_000_000;
/// A learned spin budget below this means traffic is sparse (see
/// [`Drive::sparse`]): a watch that short saves nothing a yield to the
/// runtime would not cost.
const SPARSE_BUDGET_NS: u64 = 5_000;

/// Options for [`Net`].
#[derive(Clone, Debug)]
pub struct NetBuilder {
    prefix: String,
    mode: WaitMode,
    window: Option<usize>,
    batch: bool,
    ctrl_timeout: Option<Duration>,
    strict: Option<bool>,
}

/// The strict-addresses default: `$XIO_STRICT_ADDRESSES` (`1` on, `0` or
/// unset off). Another value is an error, not ignored.
fn default_strict() -> io::Result<bool> {
    const VAR: &str = "XIO_STRICT_ADDRESSES";
    match std::env::var_os(VAR) {
        None => Ok(false),
        Some(v) if v == "1" => Ok(true),
        Some(v) if v == "0" || v.is_empty() => Ok(false),
        Some(v) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "${VAR} is {:?}: expected 1 (strict) or 0",
                v.to_string_lossy()
            ),
        )),
    }
}

impl NetBuilder {
    /// Strict addresses: a listener may bind only addresses of this node
    /// (loopback, unspecified, or an interface's), and binding another
    /// fails with `AddrNotAvailable`, as a TCP bind does. Off by default:
    /// X-IO addresses are service names, so a service may be reached at
    /// `10.0.0.2:80` on any node. On for code that relies on the check;
    /// `$XIO_STRICT_ADDRESSES=1` turns it on for nets built without this
    /// call (the process-wide one among them).
    pub fn strict_addresses(mut self, on: bool) -> Self {
        self.strict = Some(on);
        self
    }

    /// How blocking calls wait ([`WaitMode::Adaptive`] by default;
    /// [`WaitMode::BusyPoll`] for latency-critical users with a core to
    /// spare). Per-socket non-blocking mode is
    /// [`XioStream::set_nonblocking`].
    pub fn wait_mode(mut self, mode: WaitMode) -> Self {
        self.mode = mode;
        self
    }

    /// Bytes of buffer capacity a connection may have unread at the
    /// receiver (at least twice the largest buffer class; 2 MiB by
    /// default, or more with larger classes).
    pub fn window(mut self, bytes: usize) -> Self {
        self.window = Some(bytes);
        self
    }

    /// Batch wake-up (on by default): one drain of the rings wakes every
    /// connection that became ready. Off, a drain takes one descriptor at a
    /// time (for comparison, as the paper's X-IO-no-batch).
    pub fn batch_wakeup(mut self, on: bool) -> Self {
        self.batch = on;
        self
    }

    /// How long attaching, binding and connecting to an address not
    /// resolved yet wait for the manager's answer before failing with
    /// `TimedOut` (see [`crate::stack::StackBuilder::control_timeout`];
    /// 5 s by default, or `$XIO_CONTROL_TIMEOUT_MS`). The net's other
    /// users wait while one of its calls waits for the manager.
    pub fn control_timeout(mut self, timeout: Duration) -> Self {
        self.ctrl_timeout = Some(timeout);
        self
    }

    /// Attaches to the pool's manager.
    pub fn attach(self) -> io::Result<Net> {
        let strict = match self.strict {
            Some(on) => on,
            None => default_strict()?,
        };
        let mut b = Stack::builder(&self.prefix).wait_mode(self.mode);
        if let Some(t) = self.ctrl_timeout {
            b = b.control_timeout(t);
        }
        let stack = b.attach().map_err(io::Error::from)?;
        let classes: Vec<usize> = stack
            .__segment()
            .classes()
            .iter()
            .map(|c| c.buf_size as usize)
            .collect();
        let max_buf = classes.last().copied().unwrap_or(0);
        if max_buf < SYN_LEN {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the pool's buffers are too small for the socket layer",
            ));
        }
        // Every net of the pool has at least this window (its peers
        // may choose larger ones: see `Table::set_window_floor`).
        let floor = (2 * max_buf).min(u32::MAX as usize / 2);
        let window = self
            .window
            .unwrap_or(2 << 20)
            .max(floor)
            .min(u32::MAX as usize / 2);
        let waking = Arc::new(AtomicUsize::new(0));
        let batch_owner = Arc::new(AtomicUsize::new(0));
        let seg = stack.__segment().clone();
        let spare_max = stack.keep_aside(SPARE_MAX);
        let net = Net {
            shared: Arc::new(Shared {
                core: Mutex::new(Core {
                    waking: waking.clone(),
                    batch_owner: batch_owner.clone(),
                    threads_woken: 0,
                    stack,
                    table: {
                        let mut t = Table::new(window);
                        t.set_window_floor(floor);
                        t
                    },
                    driving: false,
                    probe: None,
                    waiters: HashMap::default(),
                    entries: 0,
                    signals: Vec::new(),
                    spare_lists: Vec::new(),
                    parked: 0,
                    pending: HashMap::default(),
                    force_ctrl: false,
                    batch: self.batch,
                    ready: Vec::new(),
                    track_ready: false,
                    ready_conn: Vec::new(),
                    ready_seen: Vec::new(),
                    user_tokens: Vec::new(),
                    binding: Vec::new(),
                    node_ips: Vec::new(),
                    syn_buf: None,
                    spare: Vec::with_capacity(SPARE_MAX),
                    spare_max,
                    spare_size: classes[0],
                    unrung: Vec::new(),
                    held: Vec::new(),
                    held_run: Vec::new(),
                    held_rest: Vec::new(),
                    refused_peers: Vec::new(),
                    rst_dropped: 0,
                    retry_waiters: Vec::new(),
                    missed: None,
                    retry_writes: Vec::new(),
                    retries_reported: 0,
                    last_liveness: 0,
                    manager_watch: None,
                    loop_fd: None,
                    retry_timer: None,
                    retry_armed: None,
                    #[cfg(test)]
                    fail_drive: false,
                    poll_error: None,
                    told_gone: false,
                    bell_out: false,
                    draining: false,
                    data_drains: 0,
                    data_seen: (0, 0),
                }),
                classes,
                strict,
                waking,
                seg,
                batch_owner,
                born: crate::fork::Birth::now(),
            }),
        };
        close_at_exit_register(&net);
        Ok(net)
    }
}

/// How long the exit handler tries for a net's lock, and to push what
/// waits for ring space, before leaving that net's connections to the
/// manager (another thread may be stopped for good while it holds it).
const EXIT_LOCK_WAIT: Duration = Duration::from_millis(50);

/// Every net this process attached, for [`close_at_exit`]. Per process:
/// a forked child starts with none (its inherited nets are the parent's)
/// and with a lock no thread of the parent can still hold.
static LIVE: crate::fork::PerProcess<Mutex<Vec<WeakNet>>> =
    crate::fork::PerProcess::new(|| Mutex::new(Vec::new()));

/// Notes `net` for the exit handler.
fn close_at_exit_register(net: &Net) {
    let mut live = LIVE.get().lock().unwrap_or_else(|e| e.into_inner());
    live.retain(|w| w.0.strong_count() > 0);
    live.push(net.downgrade());
}

/// [`close_at_exit`] as a `.fini_array` entry: `exit` runs those after
/// every `atexit` handler and C++ destructor of the program (glibc's
/// `_dl_fini`), so the program's own cleanup at exit still finds its
/// connections open, as it would find its sockets. (An `atexit` handler
/// registered at the first attach ran before the handlers registered
/// earlier.)
#[used]
#[link_section = ".fini_array"]
static CLOSE_AT_EXIT: extern "C" fn() = close_at_exit;

/// At exit, closes every connection still open, as the kernel closes a
/// process's sockets: peers then read end of stream, not a reset. Other
/// threads still run while `exit` calls this (their calls on the closed
/// streams fail from then on), so it only tries each lock for a while;
/// nothing here may unwind into C.
extern "C" fn close_at_exit() {
    let _ = std::panic::catch_unwind(|| {
        let deadline = Instant::now() + EXIT_LOCK_WAIT;
        let Some(live) = lock_until(LIVE.get(), deadline) else {
            return;
        };
        let nets = live_nets(&live);
        drop(live);
        for n in nets {
            n.close_all(deadline.max(Instant::now() + EXIT_LOCK_WAIT));
        }
    });
}

/// `m` locked, trying until `deadline` (poisoned counts as locked: at
/// exit, what a panicked thread left is still worth closing).
fn lock_until<T>(m: &Mutex<T>, deadline: Instant) -> Option<MutexGuard<'_, T>> {
    loop {
        match m.try_lock() {
            Ok(g) => return Some(g),
            Err(std::sync::TryLockError::Poisoned(e)) => return Some(e.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) if Instant::now() < deadline => {
                std::thread::yield_now();
            }
            Err(std::sync::TryLockError::WouldBlock) => return None,
        }
    }
}

/// Test hook: locks this process's registries of nets (the exit
/// handler's and [`Net::global`]'s) until the returned guard drops, as
/// another thread may hold them when the process forks. Not for
/// applications.
#[doc(hidden)]
pub fn __hold_process_locks() -> Box<dyn std::any::Any> {
    let live = LIVE.get().lock().unwrap_or_else(|e| e.into_inner());
    let global = GLOBAL.get().lock().unwrap_or_else(|e| e.into_inner());
    Box::new((live, global))
}

/// The nets of [`LIVE`] still alive.
fn live_nets(live: &[WeakNet]) -> Vec<Net> {
    live.iter().filter_map(WeakNet::upgrade).collect()
}

/// A process's attachment for sockets: one stack shared by all the
/// listeners and streams made from it. Cheap to clone.
#[derive(Clone)]
pub struct Net {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Net {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Net").finish_non_exhaustive()
    }
}

/// A [`Net`] that does not keep it alive (see [`Net::downgrade`]).
#[derive(Clone, Debug)]
pub struct WeakNet(std::sync::Weak<Shared>);

impl WeakNet {
    /// The net, if some handle still keeps it.
    pub fn upgrade(&self) -> Option<Net> {
        self.0.upgrade().map(|shared| Net { shared })
    }
}

struct Shared {
    core: Mutex<Core>,
    classes: Vec<usize>,
    /// Listeners bind only this node's addresses (see
    /// [`NetBuilder::strict_addresses`]).
    strict: bool,
    /// Threads woken from a blocking call that have not yet taken the
    /// lock again: they want a CPU (see `Net::block`). Also in `Core`.
    waking: Arc<AtomicUsize>,
    /// The stack's segment, for its manager's liveness word (read without
    /// the lock).
    seg: crate::segment::Segment,
    /// The thread ([`thread_key`]) whose stream writes a [`WriteBatch`]
    /// holds, 0 for none. Also in `Core`.
    batch_owner: Arc<AtomicUsize>,
    /// The process that attached: in a forked child the net is the
    /// parent's (see [`Net::lock`]).
    born: crate::fork::Birth,
}

/// What waits for a key: a blocked thread, or a task's waker.
///
/// Tasks wait as tokio's tasks wait on a socket: a `poll_*` method keeps
/// the waker of the task that called it last ([`Waiter::Slot`], one per
/// key, as tokio keeps one per direction of a socket), and a future that
/// owns a [`WaitEntry`] keeps its own place until it is woken or dropped
/// ([`Waiter::Entry`], as tokio's `readable()` and `accept()` futures sit
/// in a socket's waiter list). Both bound the list without ever waking a
/// task before what it waits for happens: a slot by replacing, an entry
/// by leaving when its future goes.
#[derive(Debug)]
pub(crate) enum Waiter {
    /// A thread parked in a blocking call.
    Thread(Thread),
    /// The task that called a `poll_*` method for the key last.
    Slot(Waker),
    /// A future's place, by its [`WaitEntry`]'s id.
    Entry(u64, Waker),
    /// A waker leaving its list without a wake-up (replaced, or its
    /// future dropped): dropped outside the lock with the wake-ups, since
    /// dropping a task's last waker can run its code.
    Dropped(#[allow(dead_code)] Waker),
}

impl Waiter {
    fn wake(self) {
        match self {
            Waiter::Thread(t) => t.unpark(),
            Waiter::Slot(w) | Waiter::Entry(_, w) => w.wake(),
            Waiter::Dropped(_) => {}
        }
    }

    fn is_task(&self) -> bool {
        matches!(self, Waiter::Slot(_) | Waiter::Entry(..))
    }
}

/// The waiters of one key.
#[derive(Debug, Default)]
struct Waiters {
    list: Vec<Waiter>,
}

/// A future's place in the waiter list of what it waits for (the adapter
/// interface's `*_entry` methods): kept until that becomes ready, and
/// left when the future that owns it is dropped, so every waiting future
/// is woken once, when it should be, however many wait on one stream or
/// listener. (The plain `poll_*` methods keep only the last task's waker,
/// as `tokio::net::TcpStream::poll_read_ready` does.)
#[derive(Debug, Default)]
pub struct WaitEntry {
    /// The key and the entry's id, while it is (or may be) in a list.
    at: Option<(Key, u64)>,
    /// The net whose list that is.
    net: Option<WeakNet>,
}

impl WaitEntry {
    /// Leaves the list of a net other than `net` (a listener that followed
    /// a restarted manager waits on a new net), before `net`'s lock is
    /// taken: one thread never holds two nets' locks.
    fn leave_unless(&mut self, net: &Net) {
        let other = self
            .net
            .as_ref()
            .is_some_and(|w| !std::sync::Weak::ptr_eq(&w.0, &Arc::downgrade(&net.shared)));
        if other {
            self.leave();
        }
    }

    /// Leaves the list it is in, if any.
    fn leave(&mut self) {
        let (Some((key, id)), Some(net)) = (self.at.take(), self.net.take()) else {
            return;
        };
        let Some(net) = net.upgrade() else { return };
        if net.inherited() {
            return; // the parent's net: its lists are the parent's
        }
        let mut gone = Vec::new();
        net.lock().remove_entry(key, id, &mut gone);
        drop(gone);
    }
}

impl Drop for WaitEntry {
    fn drop(&mut self) {
        self.leave();
    }
}

/// What a waiter waits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Key {
    Read(ConnId),
    Write(ConnId),
    Connect(ConnId),
    Accept(SocketAddr),
    Poll,
}

/// A send that did not fit the ring, kept in order per peer.
enum Pending {
    Ctrl { kind: u8, to: u32, args: [u32; 2] },
    Buf { kind: u8, to: u32, buf: BufMut },
}

/// Readiness reported by [`Net::poll`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// A stream (see [`XioStream::token`]) may be readable and/or writable.
    Stream {
        /// The stream's token.
        token: u64,
        /// A read may make progress (data, end of stream or an error).
        readable: bool,
        /// A write may make progress (credit came back, or an error).
        writable: bool,
    },
    /// A connection waits to be accepted on this address.
    Accept(SocketAddr),
}

struct Core {
    /// [`Shared::waking`].
    waking: Arc<AtomicUsize>,
    /// Threads woken from blocking calls, ever (a test hook's figure).
    threads_woken: u64,
    stack: Stack,
    table: Table<Buf>,
    driving: bool,
    probe: Option<Box<Probe>>,
    waiters: HashMap<Key, Waiters>,
    /// The last [`WaitEntry`] id given out.
    entries: u64,
    /// The read signal of each stream that recorded a registered waker or
    /// an empty read, by connection index (see [`ReadSignal`]).
    signals: Vec<Option<Arc<ReadSignal>>>,
    /// Emptied waiter lists kept for reuse (see `Core::recycle`).
    spare_lists: Vec<Vec<Waiter>>,
    parked: usize,
    pending: HashMap<u16, VecDeque<Pending>>,
    /// [`Shared::batch_owner`]: set and cleared by a [`WriteBatch`]
    /// (cleared with the lock held, after the held writes left).
    batch_owner: Arc<AtomicUsize>,
    /// Stream writes held by a write batch: peer, kind, receiver's
    /// connection, buffer; in the order they were made.
    held: Vec<(PeerId, u8, u32, BufMut)>,
    /// Scratch of `release_held`, kept so a batch allocates nothing: one
    /// peer's share of `held`, and the other peers' for the next round.
    held_run: Vec<(u8, u32, BufMut)>,
    held_rest: Vec<(PeerId, u8, u32, BufMut)>,
    force_ctrl: bool,
    batch: bool,
    ready: Vec<Event>,
    /// The connection of each entry of `ready` (none for accepts).
    ready_conn: Vec<Option<u32>>,
    track_ready: bool,
    /// By connection index: the connection and its entry's index in
    /// `ready` when last listed; current only if `ready_conn` there still
    /// names it (dedup without a map, and without clearing per poll).
    ready_seen: Vec<(u32, u32)>,
    /// Tokens chosen with [`XioStream::set_token`], by connection index,
    /// with the connection they were chosen for.
    user_tokens: Vec<Option<(u32, u64)>>,
    /// Addresses whose bind is awaited (see `Net::listen_one`).
    binding: Vec<SocketAddr>,
    /// Addresses of this node that peers' SYNs named (see
    /// [`this_node`]): each looked up once, not at every SYN.
    node_ips: Vec<std::net::IpAddr>,
    /// The buffer the next IPv6 SYN travels in (allocated before taking
    /// the lock; an IPv4 SYN needs none).
    syn_buf: Option<BufMut>,
    /// Buffers of the smallest class that reads emptied, kept writable
    /// for the next writes (see `Core::keep_spare`).
    spare: Vec<BufMut>,
    /// Most spares kept: [`SPARE_MAX`], fewer in a pool whose smallest
    /// class is small (see [`Stack::keep_aside`]).
    spare_max: usize,
    /// The smallest class's buffer size.
    spare_size: usize,
    /// Peers sent to without a wake-up yet (see `Core::push`).
    unrung: Vec<PeerId>,
    /// Peers a SYN-ACK or data could not reach (their channel is gone).
    refused_peers: Vec<PeerId>,
    /// Resets dropped for peers that do not drain their rings.
    rst_dropped: u64,
    /// Tasks waiting on something nothing signals (a full ring, an empty
    /// pool): an adapter's driver wakes them after a short pause.
    retry_waiters: Vec<Waker>,
    /// A spin before parking that found nothing: (ns spun, when it ended).
    missed: Option<(u64, u64)>,
    /// Non-blocking writes that returned `WouldBlock` for a full ring or an
    /// empty pool (which no peer signals): [`Net::poll`] reports them
    /// writable after [`RETRY_FULL`], with when each was noted.
    retry_writes: Vec<(ConnId, Instant)>,
    /// Writes of `retry_writes` reported writable since
    /// [`Net::poll_nowait`] last set its timer: the loop tries them again,
    /// and may find them blocked again (see `Core::set_retry_timer`).
    retries_reported: usize,
    /// When [`Net::poll_nowait`] last read the control socket.
    last_liveness: u64,
    /// The epoll instance behind [`Net::manager_watch`], kept to be
    /// emptied when the manager is found gone.
    manager_watch: Option<std::os::fd::OwnedFd>,
    /// The epoll instance behind [`Net::poll_fd`] (the doorbell and
    /// `retry_timer`), made on first ask.
    loop_fd: Option<std::os::fd::OwnedFd>,
    /// A timerfd in `loop_fd`: set while the net's own sends wait for a
    /// peer's full ring, or `retry_writes` for a ring or a buffer (which
    /// no peer signals), so a loop asleep on the fd retries them after a
    /// pause (see `Core::set_retry_timer`, `Core::note_retry_write`).
    retry_timer: Option<std::os::fd::OwnedFd>,
    /// `retry_timer` is set: the pause it was set for, and how many sends
    /// waited then (fewer later: the peer makes room, retry soon again).
    retry_armed: Option<(Duration, usize)>,
    /// Tests: the next [`Net::drive`] fails as a drain can (a control
    /// message the stack could not act on, say).
    #[cfg(test)]
    fail_drive: bool,
    /// An error [`Net::poll_nowait`] met after it had collected events:
    /// those went to the caller, this comes with its next call.
    poll_error: Option<io::Error>,
    /// The drain has acted on the manager's end (see `drain`).
    told_gone: bool,
    /// [`Net::doorbell`] was handed out: a reactor (xio-tokio's driver, an
    /// event loop) may sleep on it, relying on the doorbell staying armed.
    bell_out: bool,
    /// The drain is acting on what the rings brought, which the peers
    /// rang the doorbell for (see `run_actions`).
    draining: bool,
    /// Drains that found something (no clock read on the data path)...
    data_drains: u64,
    /// ...as of the last watch end, and when that count last moved (ns).
    data_seen: (u64, u64),
}

/// A batch of stream writes (see [`Net::batch_writes`]): what this thread
/// wrote while it lives leaves together when it drops. Bound to the thread
/// that took it.
#[must_use = "writes are held only while the guard lives"]
pub struct WriteBatch<'a> {
    net: &'a Net,
    /// Whether this guard counts in the batch (false when another thread
    /// held one when it was taken).
    owned: bool,
    /// Not `Send`: the batch belongs to the thread that took it.
    _thread: std::marker::PhantomData<*const ()>,
}

impl std::fmt::Debug for WriteBatch<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WriteBatch")
            .field("owned", &self.owned)
            .finish_non_exhaustive()
    }
}

impl Drop for WriteBatch<'_> {
    fn drop(&mut self) {
        if self.owned {
            self.net.end_write_batch();
        }
    }
}

/// Most stream writes a write batch holds before it sends them anyway.
const HELD_MAX: usize = 256;

/// This thread, as a number (the address of a thread-local: unique among
/// live threads, and cheap to read on every write).
fn thread_key() -> usize {
    thread_local!(static KEY: u8 = const { 0 });
    KEY.with(|k| k as *const u8 as usize)
}

/// Most emptied buffers a net keeps for its next writes.
const SPARE_MAX: usize = 8;

/// Keeps `b`, a buffer a read has emptied, as a writable spare if it is of
/// the smallest class (`size`) and fewer than `max` are kept; otherwise it
/// returns to the pool. In request-response traffic each
/// request's buffer then carries the response: no trip through the pool's
/// cache (a lock each way) and no pool reference count changes. The spares
/// stay ours in the segment (`ALLOCATED`, owner us), so a crash returns
/// them like any held buffer. `max` is a small share of the class: a
/// reader that never writes keeps its spares for good, and with
/// [`SPARE_MAX`] each in a class of few buffers, its writer waited for a
/// buffer for ever.
fn keep_spare(spare: &mut Vec<BufMut>, size: usize, max: usize, b: Buf) {
    if spare.len() < max && b.capacity() == size {
        spare.push(b.into_mut());
    }
}

/// Bytes of a SYN's payload: version, then target and source addresses.
const SYN_LEN: usize = 1 + 2 * ADDR_LEN;
const ADDR_LEN: usize = 1 + 16 + 2;

fn put_addr(out: &mut [u8], a: &SocketAddr) {
    match a {
        SocketAddr::V4(v) => {
            out[0] = 4;
            out[1..5].copy_from_slice(&v.ip().octets());
            out[5..17].fill(0);
        }
        SocketAddr::V6(v) => {
            out[0] = 6;
            out[1..17].copy_from_slice(&v.ip().octets());
        }
    }
    out[17..19].copy_from_slice(&a.port().to_le_bytes());
}

fn get_addr(b: &[u8]) -> Option<SocketAddr> {
    let port = u16::from_le_bytes([b[17], b[18]]);
    match b[0] {
        4 => {
            let ip: [u8; 4] = b[1..5].try_into().ok()?;
            Some(SocketAddr::from((ip, port)))
        }
        6 => {
            let ip: [u8; 16] = b[1..17].try_into().ok()?;
            Some(SocketAddr::from((ip, port)))
        }
        _ => None,
    }
}

fn encode_syn(buf: &mut BufMut, target: &SocketAddr, source: &SocketAddr) {
    buf.set_len(SYN_LEN);
    buf[0] = 1;
    put_addr(&mut buf[1..1 + ADDR_LEN], target);
    put_addr(&mut buf[1 + ADDR_LEN..], source);
}

fn decode_syn(b: &[u8]) -> Option<(SocketAddr, SocketAddr)> {
    if b.len() != SYN_LEN || b[0] != 1 {
        return None;
    }
    Some((
        get_addr(&b[1..1 + ADDR_LEN])?,
        get_addr(&b[1 + ADDR_LEN..])?,
    ))
}

/// The address a connecting stream gets: X-IO clients do not bind, so it
/// is made from the stack and connection ids, unique on the machine
/// among live connections (`127.88.<stack>:<port>`; a process's
/// connections past the first 64,512 ports go on in 127.89 to 127.104,
/// so the 2^20 a table holds never share one). Of `target`'s family, as
/// a TCP connection's two ends are: to an IPv6 address, the same address
/// IPv4-mapped (`[::ffff:127.88.<stack>]:<port>`). Both ends make it
/// from the ids and the target, so they agree.
fn client_addr(stack: PeerId, c: ConnId, target: &SocketAddr) -> SocketAddr {
    const PORTS: u32 = 65536 - 1024;
    let [hi, lo] = stack.0.to_be_bytes();
    let index = c.index() as u32;
    let block = (index / PORTS) as u8;
    let port = 1024 + index % PORTS;
    let ip = std::net::Ipv4Addr::new(127, 88 + block, hi, lo);
    match target {
        SocketAddr::V4(_) => SocketAddr::from((ip, port as u16)),
        SocketAddr::V6(_) => SocketAddr::from((ip.to_ipv6_mapped(), port as u16)),
    }
}

fn stack_err(e: Error) -> io::Error {
    io::Error::from(e)
}

impl Core {
    /// Sends request `msg` to the manager for a caller that waits for
    /// the answer without holding the net ([`Net::wait_answer`]).
    fn ask(&mut self, msg: &crate::proto::Msg) -> Result<Asked, Error> {
        let n = self.stack.begin_request(msg)?;
        match self.stack.ctrl_fd_owned() {
            Ok(fd) => {
                let timeout = self.stack.control_timeout();
                Ok(Asked {
                    n,
                    fd,
                    timeout,
                    limit: Instant::now().checked_add(timeout),
                    what: msg.clone(),
                })
            }
            Err(e) => {
                self.stack.give_up(n);
                Err(Error::Io(e))
            }
        }
    }

    fn me(&self) -> PeerId {
        self.stack.id()
    }

    /// Sends (or queues, behind earlier sends to the same peer) one
    /// descriptor. A peer whose channel is gone is reset by the drain that
    /// follows; what was queued for it is dropped (buffers back to the pool).
    fn send_or_queue(&mut self, peer: PeerId, p: Pending) {
        // What a write batch holds goes first (pushed, or queued ahead):
        // a FIN or reset must not overtake a connection's data.
        self.release_held();
        let q = self.pending.entry(peer.0).or_default();
        if !q.is_empty() {
            if q.len() >= RST_QUEUE_MAX
                && matches!(
                    p,
                    Pending::Ctrl {
                        kind: kind::RST,
                        args: [0, _],
                        ..
                    }
                )
            {
                // A peer that keeps sending but never drains its ring
                // would otherwise grow this queue by one reset for every
                // forged SYN or SYN-ACK, without bound. Such a reset
                // answers something that names no live connection here;
                // dropping it loses that peer nothing it could not learn
                // by reading (as TCP rate-limits its resets). A reset
                // that ends a connection ([`kind::RST_ENDS`]) always
                // goes: there are at most as many as connections.
                self.rst_dropped += 1;
                tracing::debug!(peer = peer.0, "reset to a peer that does not drain dropped");
                return;
            }
            q.push_back(p);
            return;
        }
        match self.push(peer, p) {
            Ok(None) => {}
            Ok(Some(p)) => {
                // The first send left waiting for ring space rings our own
                // doorbell, as the first retrier does (`add_retry`): an
                // adapter's driver asleep on it would otherwise never see
                // `retry`, and a FIN queued behind a full ring by a task
                // that then only reads stayed queued for good.
                if !self.has_pending() {
                    let _ = self.stack.ring_self();
                }
                self.pending.entry(peer.0).or_default().push_back(p);
            }
            Err(_) => self.refused_peers.push(peer),
        }
    }

    /// One push: `Ok(Some)` hands it back when the ring is full. The peer
    /// is not woken yet: it is noted, and [`Core::ring_unrung`] wakes each
    /// noted peer once, so the SYN-ACKs, FINs and credits one drain
    /// produces cost one doorbell check per peer, not one each.
    fn push(&mut self, peer: PeerId, p: Pending) -> Result<Option<Pending>, Error> {
        if !self.unrung.contains(&peer) {
            self.unrung.push(peer);
        }
        match p {
            Pending::Ctrl { kind, to, args } => {
                if self.stack.push_control(peer, kind, to, args, false)? {
                    Ok(None)
                } else {
                    Ok(Some(Pending::Ctrl { kind, to, args }))
                }
            }
            Pending::Buf { kind, to, buf } => Ok(self
                .stack
                .push_buf(peer, kind, to, buf, false)
                .map_err(|(e, _)| e)?
                .map(|buf| Pending::Buf { kind, to, buf })),
        }
    }

    /// Whether this thread's stream writes are held by a write batch.
    fn holds_writes(&self) -> bool {
        let owner = self.batch_owner.load(AtomicOrdering::Relaxed);
        owner != 0 && owner == thread_key()
    }

    /// Sends what a write batch held, in order: each peer's share in one
    /// run of ring stores (see [`Stack::push_bufs`]); what its ring has no
    /// room for waits in `pending`, behind anything already there, as any
    /// send does. A peer whose channel is gone gets nothing (its
    /// connections are reset by the drain, as for a direct write).
    fn release_held(&mut self) {
        if self.held.is_empty() {
            return;
        }
        let mut held = std::mem::take(&mut self.held);
        let mut rest = std::mem::take(&mut self.held_rest);
        let mut run = std::mem::take(&mut self.held_run);
        while !held.is_empty() {
            // The first peer's writes, in order; the others' wait for the
            // next round (between connections of different peers order
            // does not matter; within one it is kept).
            let peer = held[0].0;
            for (p, kind, to, b) in held.drain(..) {
                if p == peer {
                    run.push((kind, to, b));
                } else {
                    rest.push((p, kind, to, b));
                }
            }
            std::mem::swap(&mut held, &mut rest);
            if !self.pending_for(peer) && self.stack.push_bufs(peer, &mut run).is_err() {
                run.clear();
                self.refused_peers.push(peer);
                continue;
            }
            if !run.is_empty() {
                self.pending.entry(peer.0).or_default().extend(
                    run.drain(..)
                        .map(|(kind, to, buf)| Pending::Buf { kind, to, buf }),
                );
            }
            // Pushed, queued or both: ring it (a reader must drain for a
            // queue's room to come).
            if !self.unrung.contains(&peer) {
                self.unrung.push(peer);
            }
        }
        // Keep the allocations for the next batch (all three are empty).
        self.held = held;
        self.held_rest = rest;
        self.held_run = run;
    }

    /// Wakes (if asleep) every peer [`Core::push`] sent to since the last
    /// call.
    fn ring_unrung(&mut self) {
        for p in self.unrung.drain(..) {
            self.stack.wake_peer(p);
        }
    }

    /// Pushes queued sends in order; true if nothing is left queued.
    fn flush_pending(&mut self) -> bool {
        // Held writes join their peers' queues first, in order (taking a
        // queue out below and putting it back must not lose them).
        self.release_held();
        if self.pending.values().all(VecDeque::is_empty) {
            return true;
        }
        let peers: Vec<u16> = self.pending.keys().copied().collect();
        for p in peers {
            let mut q = self.pending.remove(&p).unwrap_or_default();
            while let Some(item) = q.pop_front() {
                match self.push(PeerId(p), item) {
                    Ok(None) => {}
                    Ok(Some(item)) => {
                        q.push_front(item);
                        break;
                    }
                    Err(_) => {
                        q.clear();
                        self.refused_peers.push(PeerId(p));
                    }
                }
            }
            if !q.is_empty() {
                self.pending.insert(p, q);
            }
        }
        self.ring_unrung();
        self.pending.values().all(VecDeque::is_empty)
    }

    /// [`Core::flush_pending`] until nothing is left queued or `deadline`,
    /// pausing between tries for peers to make room; true if all went.
    fn flush_pending_until(&mut self, deadline: Instant) -> bool {
        while !self.flush_pending() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        true
    }

    fn has_pending(&self) -> bool {
        self.pending.values().any(|q| !q.is_empty())
    }

    /// How many sends wait for ring space.
    fn pending_len(&self) -> usize {
        self.pending.values().map(VecDeque::len).sum()
    }

    /// For [`Net::poll_nowait`]: while sends wait for ring space, or
    /// non-blocking writes for a full ring or an empty pool (noted in
    /// `retry_writes`, or reported writable by this poll to be tried
    /// again), sets the retry timer of [`Net::poll_fd`] (a short pause,
    /// doubling up to [`RETRY_FULL_MAX`] while no fewer wait), and stops
    /// it once none wait. Without a timer (the loop sleeps on the bare
    /// [`Net::doorbell`]) rings the doorbell instead, for the net's own
    /// sends: that loop comes straight back, as it does if the timer
    /// cannot be set. True if the doorbell has to ring.
    fn set_retry_timer(&mut self) -> bool {
        let own = self.pending_len();
        let reported = std::mem::take(&mut self.retries_reported);
        if self.retry_timer.is_none() {
            return own > 0;
        }
        let waiting = own + self.retry_writes.len() + reported;
        let pause = match (waiting, self.retry_armed) {
            (0, None) => return false,
            (0, Some(_)) => None,
            // Room made since the last try, or the first wait: soon.
            (n, Some((p, before))) if n >= before => Some((p * 2).min(RETRY_FULL_MAX)),
            _ => Some(RETRY_FULL),
        };
        // Unset, the loop is brought straight back instead.
        !self.arm_retry_timer(pause, waiting) && waiting > 0
    }

    /// Sets [`Net::poll_fd`]'s retry timer to fire once after `pause`
    /// (stops it on `None`), for `waiting` sends and writes; false if it
    /// could not be set (`retry_armed` is then left as it was).
    fn arm_retry_timer(&mut self, pause: Option<Duration>, waiting: usize) -> bool {
        use rustix::time::{timerfd_settime, Itimerspec, TimerfdTimerFlags, Timespec};
        let Some(timer) = &self.retry_timer else {
            return false;
        };
        let value = pause.map_or(
            Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            },
            |p| Timespec {
                tv_sec: 0,
                tv_nsec: p.subsec_nanos().into(),
            },
        );
        let zero = Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // Setting the time (or stopping it) also clears an expiry not read
        // yet, so a timer that fired goes quiet here without a read.
        let set = timerfd_settime(
            timer,
            TimerfdTimerFlags::empty(),
            &Itimerspec {
                it_interval: zero,
                it_value: value,
            },
        );
        if set.is_err() {
            // (The next `set_retry_timer` tries again.)
            return false;
        }
        self.retry_armed = pause.map(|p| (p, waiting));
        true
    }

    /// A non-blocking write on `c` said `WouldBlock` for a full ring or an
    /// empty pool, which no peer signals the end of: [`Net::poll`] reports
    /// it writable after [`RETRY_FULL`], and a loop asleep on
    /// [`Net::poll_fd`] is woken for that by the retry timer, set here if
    /// it is not already (so the loop needs no poll of its own meanwhile).
    /// Only the `WouldBlock` path comes here.
    fn note_retry_write(&mut self, c: ConnId) {
        if !self.track_ready || self.retry_writes.iter().any(|(r, _)| *r == c) {
            return;
        }
        self.retry_writes.push((c, Instant::now()));
        if self.retry_armed.is_none() {
            let waiting = self.pending_len() + self.retry_writes.len();
            // Unset (it cannot be), the loop's next poll tries again.
            let _ = self.arm_retry_timer(Some(RETRY_FULL), waiting);
        }
    }

    fn pending_for(&self, peer: PeerId) -> bool {
        self.pending.get(&peer.0).is_some_and(|q| !q.is_empty())
    }

    /// One attempt at a read of `c` into `out`, for `block` and `poll_op`.
    fn read_step(
        &mut self,
        wake: &mut Vec<Waiter>,
        c: ConnId,
        out: &mut [std::mem::MaybeUninit<u8>],
    ) -> Try<usize> {
        let (spare, size, max) = (&mut self.spare, self.spare_size, self.spare_max);
        let r = self
            .table
            .read_uninit_with(c, out, |b| keep_spare(spare, size, max, b));
        self.settle_read(wake, r)
    }

    /// [`Core::read_step`] into several buffers, in order (`readv`).
    fn read_vectored_step(
        &mut self,
        wake: &mut Vec<Waiter>,
        c: ConnId,
        outs: &mut [IoSliceMut<'_>],
    ) -> Try<usize> {
        let (spare, size, max) = (&mut self.spare, self.spare_size, self.spare_max);
        let outs = outs.iter_mut().map(|o| crate::conn::as_uninit(o));
        let r = self
            .table
            .read_vectored_uninit_with(c, outs, |b| keep_spare(spare, size, max, b));
        self.settle_read(wake, r)
    }

    /// A writable buffer of the smallest class from the ones reads
    /// emptied, if there is one and `len` fits it.
    fn take_spare(&mut self, len: usize) -> Option<BufMut> {
        if len > self.spare_size {
            return None;
        }
        self.spare.pop()
    }

    /// One attempt at copying `c`'s received bytes without consuming them.
    /// `report`: a reset seen is reported once, as a read reports it
    /// (`MSG_PEEK`); else it is left for the next read (readiness).
    fn peek_step(
        &mut self,
        wake: &mut Vec<Waiter>,
        c: ConnId,
        out: &mut [u8],
        report: bool,
    ) -> Try<usize> {
        let r = if report {
            self.table.peek_reporting(c, out)
        } else {
            self.table.peek(c, out)
        };
        self.settle_read(wake, r)
    }

    /// One attempt at taking `c`'s next received buffer (`None`: end).
    fn chunk_step(&mut self, wake: &mut Vec<Waiter>, c: ConnId) -> Try<Option<Buf>> {
        let r = self.table.take_chunk(c).map(|o| {
            o.map(|(mut b, off)| {
                b.advance(off);
                b
            })
        });
        self.settle_read(wake, r)
    }

    /// What a read attempt amounts to: done (sending the credit it freed),
    /// or wait for more.
    fn settle_read<T>(&mut self, wake: &mut Vec<Waiter>, r: Result<T, ConnError>) -> Try<T> {
        match r {
            Ok(v) => {
                self.run_actions(wake);
                Try::Done(Ok(v))
            }
            Err(ConnError::WouldBlock) => Try::Wait,
            Err(e) => Try::Done(Err(e.into())),
        }
    }

    /// Whether `c`'s SYN was answered (or refused).
    fn connect_step(&self, c: ConnId) -> Try<()> {
        match self.table.connect_result(c) {
            Err(ConnError::WouldBlock) => Try::Wait,
            // Answered, then reset (one drain may bring both): connected.
            // The reset is for the reads to report, after what arrived
            // before it (a first read failing here lost that, and reported
            // the reset twice).
            Err(ConnError::Reset) => Try::Done(Ok(())),
            r => Try::Done(r.map_err(io::Error::from)),
        }
    }

    /// Moves what the rings hold into the table and runs what follows.
    fn drain(&mut self, wake: &mut Vec<Waiter>) -> io::Result<usize> {
        self.flush_pending();
        let max = if self.batch { DRAIN_BATCH } else { 1 };
        let force = std::mem::take(&mut self.force_ctrl);
        let me = self.me();
        let table = &mut self.table;
        let node_ips = &mut self.node_ips;
        let mut gone = Vec::new();
        let r = self.stack.poll_events(max, force, &mut |ev| match ev {
            StackInput::Buf {
                from,
                kind: kind::STREAM,
                conn,
                buf,
            } => table.on_data(from, ConnId(conn), buf),
            StackInput::Buf {
                from,
                kind: k,
                conn,
                buf,
            } if k == kind::STREAM | kind::EARLY => {
                if let Some(c) = table.early_conn(from, conn) {
                    table.on_data(from, c, buf);
                }
            }
            StackInput::Buf {
                from,
                kind: kind::SYN,
                conn,
                buf,
            } => match decode_syn(&buf) {
                // The source the buffer names is the peer's word: a stack
                // could claim another's client address, or any host's.
                // The ring says who sent it, and that makes the address
                // (as for a SYN4).
                Some((target, _)) => {
                    let source = client_addr(from, ConnId(conn), &target);
                    table.on_syn_from(from, conn, target, source, |ip| this_node(node_ips, ip))
                }
                None => {
                    tracing::warn!(peer = from.0, "malformed SYN refused");
                }
            },
            StackInput::Buf { from, kind, .. } => {
                tracing::debug!(peer = from.0, kind, "dropped a non-stream buffer");
            }
            StackInput::Control {
                from,
                kind: kind::SYN4,
                conn,
                arg,
                arg2,
            } => match u16::try_from(arg2) {
                Ok(port) => {
                    let target = SocketAddr::from((std::net::Ipv4Addr::from(arg), port));
                    let source = client_addr(from, ConnId(conn), &target);
                    table.on_syn_from(from, conn, target, source, |ip| this_node(node_ips, ip));
                }
                Err(_) => tracing::warn!(peer = from.0, arg2, "malformed SYN refused"),
            },
            StackInput::Control {
                from,
                kind,
                conn,
                arg,
                ..
            } => dispatch_control(table, from, kind, conn, arg),
            StackInput::Message(m) => {
                tracing::debug!(peer = m.from.0, "dropped a zero-copy message");
            }
            StackInput::PeerGone(p) => {
                table.on_peer_gone(p);
                gone.push(p);
            }
        });
        let _ = me;
        for p in gone {
            self.pending.remove(&p.0);
        }
        let n = match r {
            Ok(n) => n,
            Err(Error::ManagerGone) => {
                tracing::warn!("the X-IO manager went away; open connections keep working");
                0
            }
            Err(e) => return Err(stack_err(e)),
        };
        // However the stack found its manager gone (here, or a request's
        // failed send), its socket stays readable (end of file): quiet the
        // watch for good, in every copy handed out.
        if self.stack.manager_gone() && !self.told_gone {
            self.told_gone = true;
            if let Some(w) = self.manager_watch.take() {
                let _ = rustix::event::epoll::delete(&w, self.stack.ctrl_fd());
            }
            // Waiting accepts look again: a listener that follows the
            // process-wide net (xio-tokio's) then binds on the new one.
            let keys: Vec<Key> = self
                .waiters
                .keys()
                .filter(|k| matches!(k, Key::Accept(_)))
                .copied()
                .collect();
            for k in keys {
                self.wake_key(k, wake);
            }
        }
        self.draining = true;
        self.run_actions(wake);
        self.draining = false;
        if n > 0 {
            self.data_drains = self.data_drains.wrapping_add(1);
            if let Some((spun, at)) = self.missed.take() {
                // A worker's spin before parking missed this traffic: tell
                // the policy how long the gap really was.
                let gap = crate::wait::now_ns().saturating_sub(at);
                self.stack.spin_mut().on_sleep(spun, gap, None);
            }
        }
        Ok(n)
    }

    /// Carries out what the table asked for: sends, and wake-ups.
    fn run_actions(&mut self, wake: &mut Vec<Waiter>) {
        let me = self.me();
        let mut kick = false;
        // Whether readiness was noted (for an event loop's `poll`).
        let mut ready = false;
        loop {
            let Some(a) = self.table.poll_action() else {
                // Peers whose channel vanished under a send: what they sent
                // before (a FIN, say) is still to be read, and the stack
                // queued their reset behind it, which the next drain
                // delivers in order. Resetting their connections here
                // instead would turn a clean close into a reset.
                for p in std::mem::take(&mut self.refused_peers) {
                    self.pending.remove(&p.0);
                }
                self.ring_unrung();
                break;
            };
            let key = match a {
                Action::SendSyn {
                    peer,
                    conn,
                    target,
                    source,
                } => {
                    if peer == me {
                        let source = self.table.addrs(conn).map_or(source, |a| a.0);
                        self.table.on_syn(me, conn.0, target, source);
                    } else if let SocketAddr::V4(t) = target {
                        // No buffer: the address fits the descriptor, and
                        // the listener derives our address from our ids.
                        debug_assert_eq!(
                            self.table.addrs(conn).map(|a| a.0).ok(),
                            Some(client_addr(me, conn, &target))
                        );
                        self.send_or_queue(
                            peer,
                            Pending::Ctrl {
                                kind: kind::SYN4,
                                to: conn.0,
                                args: [u32::from(*t.ip()), u32::from(t.port())],
                            },
                        );
                    } else if let Some(mut buf) = self.syn_buf.take() {
                        let source = self.table.addrs(conn).map_or(source, |a| a.0);
                        encode_syn(&mut buf, &target, &source);
                        self.send_or_queue(
                            peer,
                            Pending::Buf {
                                kind: kind::SYN,
                                to: conn.0,
                                buf,
                            },
                        );
                    } else {
                        // Only `connect` makes SYNs, and it provides the buffer.
                        self.table.on_rst(peer, conn);
                    }
                    continue;
                }
                Action::Control {
                    peer,
                    kind,
                    to,
                    arg,
                } => {
                    if peer == me {
                        dispatch_control(&mut self.table, me, kind, to, arg);
                    } else {
                        self.send_or_queue(
                            peer,
                            Pending::Ctrl {
                                kind,
                                to,
                                args: [arg, 0],
                            },
                        );
                    }
                    continue;
                }
                Action::Readable(c) => {
                    self.note_ready(c, true, false);
                    self.wake_poller(wake);
                    ready = true;
                    Key::Read(c)
                }
                Action::Writable(c) => {
                    self.note_ready(c, false, true);
                    self.wake_poller(wake);
                    ready = true;
                    Key::Write(c)
                }
                Action::Connected(c) => {
                    if self.table.connect_result(c) == Err(ConnError::Refused) {
                        // A refusal that came after `connect` returned
                        // (it does not wait for the answer): the route it
                        // used may be stale, the address handed over to
                        // another process. The next connect asks again.
                        if let (Some(peer), Ok((_, addr))) =
                            (self.table.peer_of(c), self.table.addrs(c))
                        {
                            self.stack.forget_resolution_to(&addr, peer);
                        }
                    }
                    self.note_ready(c, true, true);
                    self.wake_poller(wake);
                    ready = true;
                    Key::Connect(c)
                }
                Action::Acceptable(addr) => {
                    if self.track_ready && !self.ready.contains(&Event::Accept(addr)) {
                        self.ready.push(Event::Accept(addr));
                        self.ready_conn.push(None);
                        kick |= self.wake_key(Key::Poll, wake);
                        ready = true;
                    }
                    Key::Accept(addr)
                }
            };
            kick |= self.wake_key(key, wake);
        }
        // A driver waiting on the rings (another thread) cannot see what a
        // local operation made ready (a connection to this same process,
        // say): wake it so it looks.
        if kick && self.driving {
            self.stack.kick();
        }
        // Nor can an event loop asleep on the doorbell's fd: the peers
        // ring it for what they send, but what an operation of this net
        // made ready (another thread's write on a connection within the
        // net, the window a read of one gave back to its writer, a dial
        // to the net's own listener) came from no ring. What a drain
        // found, the poll that drains collects, or the peers rang for.
        if ready && self.track_ready && !self.draining {
            self.ring_reactor();
        }
    }

    /// Whether the adaptive policy has learned that traffic is sparse
    /// (see [`Drive::sparse`]).
    fn sparse(&mut self) -> bool {
        self.stack.spin_mut().budget() < Duration::from_nanos(SPARSE_BUDGET_NS)
    }

    /// Moves the waiters of `key` to `wake`; true if nobody was parked on
    /// it (the driver may be the one waiting for it).
    fn wake_key(&mut self, key: Key, wake: &mut Vec<Waiter>) -> bool {
        if let Key::Read(c) = key {
            if let Some(Some(s)) = self.signals.get(c.index()) {
                s.bump();
            }
        }
        // An event loop (`poll`) parks nobody on its streams: skip the
        // lookup that every readiness would pay.
        if self.waiters.is_empty() {
            return true;
        }
        match self.waiters.remove(&key) {
            Some(Waiters { list: mut ws, .. }) => {
                let threads = ws.iter().filter(|w| matches!(w, Waiter::Thread(_))).count();
                self.parked -= threads;
                self.threads_woken += threads as u64;
                self.waking.fetch_add(threads, AtomicOrdering::Relaxed);
                wake.append(&mut ws);
                self.recycle(ws);
                false
            }
            None => true,
        }
    }

    /// Moves every task's waker (not the parked threads) to `wake`, with
    /// the retriers' (see [`Net::wake_tasks`]).
    fn take_wakers(&mut self, wake: &mut Vec<Waiter>) {
        let keys: Vec<Key> = self
            .waiters
            .iter()
            .filter(|(_, ws)| ws.list.iter().any(Waiter::is_task))
            .map(|(k, _)| *k)
            .collect();
        for key in keys {
            if let Key::Read(c) = key {
                // A reader whose waker leaves the list must not take the
                // lock-free `Pending` of `ReadSignal` on its next poll.
                if let Some(Some(s)) = self.signals.get(c.index()) {
                    s.bump();
                }
            }
            let Some(ws) = self.waiters.get_mut(&key) else {
                continue;
            };
            // Threads stay, in their order (`parked` counts only them).
            let mut i = 0;
            while i < ws.list.len() {
                if ws.list[i].is_task() {
                    wake.push(ws.list.remove(i));
                } else {
                    i += 1;
                }
            }
            if ws.list.is_empty() {
                if let Some(ws) = self.waiters.remove(&key) {
                    self.recycle(ws.list);
                }
            }
        }
        wake.extend(self.retry_waiters.drain(..).map(Waiter::Slot));
    }

    /// Keeps an emptied waiter list's allocation for the next key that
    /// gets a waiter: a read or write that waits registers one, and its
    /// wake-up removes it, so without this every wait cost a `malloc` and
    /// a `free`.
    fn recycle(&mut self, ws: Vec<Waiter>) {
        if ws.capacity() > 0 && self.spare_lists.len() < SPARE_LISTS {
            self.spare_lists.push(ws);
        }
    }

    /// The waiter list of `key`, created from a spare allocation if new.
    fn waiters_of(&mut self, key: Key) -> &mut Waiters {
        let spare = &mut self.spare_lists;
        self.waiters.entry(key).or_insert_with(|| Waiters {
            list: spare.pop().unwrap_or_default(),
        })
    }

    /// Takes the next connection waiting on `addr`. The next `poll`
    /// reports it writable, and readable if something arrived on it
    /// before, as epoll reports a socket when it is added (a loop that
    /// waits to be told it may write, to greet, say, is told): a thread
    /// asleep in `poll` is woken, and the doorbell rung for a loop that
    /// sleeps on its fd. With it, the peer's address, from the table
    /// entry: a connection reset while queued (its client died) is still
    /// handed over, as Linux's accept does, and reports the reset to its
    /// first read (`peer_addr` would refuse it, as getpeername does).
    fn accept_on(
        &mut self,
        addr: SocketAddr,
        wake: &mut Vec<Waiter>,
    ) -> Result<(ConnId, SocketAddr), ConnError> {
        let c = self.table.accept(addr)?;
        let peer = self.table.addrs(c)?.1;
        if self.track_ready {
            let readable = self.table.is_readable(c);
            self.note_ready(c, readable, true);
            if self.wake_key(Key::Poll, wake) && self.driving {
                self.stack.kick();
            }
            if readable {
                let _ = self.stack.ring_self();
            } else {
                self.ring_reactor();
            }
        }
        Ok((c, peer))
    }

    /// Rings the doorbell if a reactor may sleep on it ([`Net::doorbell`]
    /// was handed out): for news it would not hear otherwise.
    fn ring_reactor(&mut self) {
        if self.bell_out {
            let _ = self.stack.ring_self();
        }
    }

    /// The token `poll` reports `c` under: the one chosen with
    /// [`XioStream::set_token`], else the connection's id.
    fn token_of(&self, c: ConnId) -> u64 {
        match self.user_tokens.get(c.index()) {
            Some(&Some((id, token))) if id == c.0 => token,
            _ => u64::from(c.0),
        }
    }

    /// Where `c` is listed in `ready`, if it is.
    fn ready_index(&self, c: ConnId) -> Option<usize> {
        let &(id, i) = self.ready_seen.get(c.index())?;
        (id == c.0 && self.ready_conn.get(i as usize) == Some(&Some(c.0))).then_some(i as usize)
    }

    /// Lists the remaining entries of `ready` afresh in `ready_seen`
    /// after the first ones were taken.
    fn reindex_ready(&mut self) {
        for (i, id) in self.ready_conn.iter().enumerate() {
            if let &Some(id) = id {
                self.ready_seen[ConnId(id).index()] = (id, i as u32);
            }
        }
    }

    /// Takes `c`'s event out of `ready`, if it is there.
    fn forget_ready(&mut self, c: ConnId) {
        if let Some(i) = self.ready_index(c) {
            self.forget_ready_at(i);
        }
    }

    /// Takes entry `i` out of `ready` (and its index).
    fn forget_ready_at(&mut self, i: usize) {
        self.ready.remove(i);
        self.ready_conn.remove(i);
        self.reindex_ready();
    }

    fn note_ready(&mut self, c: ConnId, r: bool, w: bool) {
        // Not yet accepted: reported when it is (see `accept_on`), under
        // the token the program gives it then.
        if !self.track_ready || self.table.is_unaccepted(c) {
            return;
        }
        match self.ready_index(c) {
            Some(i) => {
                if let Event::Stream {
                    readable, writable, ..
                } = &mut self.ready[i]
                {
                    *readable |= r;
                    *writable |= w;
                }
            }
            None => {
                let i = c.index();
                if self.ready_seen.len() <= i {
                    self.ready_seen.resize(i + 1, (0, u32::MAX));
                }
                self.ready_seen[i] = (c.0, self.ready.len() as u32);
                self.ready_conn.push(Some(c.0));
                self.ready.push(Event::Stream {
                    token: self.token_of(c),
                    readable: r,
                    writable: w,
                });
            }
        }
    }

    /// Wakes a thread waiting in [`Net::poll`] while another thread
    /// drives (a blocking call on another stream): the readiness just
    /// noted is what it waits for, and nothing else would wake it until
    /// the driver's own call ends.
    fn wake_poller(&mut self, wake: &mut Vec<Waiter>) {
        if self.track_ready && !self.waiters.is_empty() && self.waiters.contains_key(&Key::Poll) {
            self.wake_key(Key::Poll, wake);
        }
    }

    /// Reports as writable the non-blocking writes that waited
    /// [`RETRY_FULL`] on a full ring or an empty pool: time to try again.
    fn ripe_retries(&mut self) {
        if self.retry_writes.is_empty() {
            return;
        }
        let now = Instant::now();
        let mut i = 0;
        while i < self.retry_writes.len() {
            let (c, since) = self.retry_writes[i];
            if now.duration_since(since) >= RETRY_FULL {
                self.retry_writes.swap_remove(i);
                self.retries_reported = self.retries_reported.saturating_add(1);
                self.note_ready(c, false, true);
            } else {
                i += 1;
            }
        }
    }

    fn add_waiter(&mut self, key: Key, w: Waiter) {
        self.waiters_of(key).list.push(w);
        self.parked += 1;
    }

    /// Takes a thread back from its key's waiters after it woke: if it was
    /// no longer there, someone woke it on purpose (and counted it in
    /// `waking`); if it still was, its park ended on its own (a timeout).
    fn remove_thread(&mut self, key: Key, t: &Thread) {
        let mut found = false;
        if let Some(ws) = self.waiters.get_mut(&key) {
            let ws = &mut ws.list;
            let before = ws.len();
            ws.retain(|w| !matches!(w, Waiter::Thread(x) if x.id() == t.id()));
            found = ws.len() < before;
            self.parked -= before - ws.len();
            if ws.is_empty() {
                if let Some(ws) = self.waiters.remove(&key) {
                    self.recycle(ws.list);
                }
            }
        }
        if !found {
            // Saturating: a count that erred low only lets a driver spin.
            let _ =
                self.waking
                    .fetch_update(AtomicOrdering::Relaxed, AtomicOrdering::Relaxed, |n| {
                        n.checked_sub(1)
                    });
        }
    }

    /// Any one parked thread, to take over driving.
    fn take_any_waiter(&mut self) -> Option<Waiter> {
        let key = *self
            .waiters
            .iter()
            .find(|(_, ws)| ws.list.iter().any(|w| matches!(w, Waiter::Thread(_))))?
            .0;
        let ws = &mut self.waiters.get_mut(&key)?.list;
        let i = ws.iter().position(|w| matches!(w, Waiter::Thread(_)))?;
        let w = ws.swap_remove(i);
        if ws.is_empty() {
            if let Some(ws) = self.waiters.remove(&key) {
                self.recycle(ws.list);
            }
        }
        self.parked -= 1;
        self.threads_woken += 1;
        self.waking.fetch_add(1, AtomicOrdering::Relaxed);
        Some(w)
    }

    /// Registers a task's waker as `key`'s slot (see [`Waiter::Slot`]):
    /// it replaces the waker of the task that polled before, which goes
    /// to `wake` to be dropped outside the lock, unwoken.
    fn add_waker(&mut self, key: Key, w: &Waker, wake: &mut Vec<Waiter>) {
        let ws = &mut self.waiters_of(key).list;
        for x in ws.iter_mut() {
            if let Waiter::Slot(y) = x {
                if !y.will_wake(w) {
                    wake.push(Waiter::Dropped(std::mem::replace(y, w.clone())));
                }
                return;
            }
        }
        ws.push(Waiter::Slot(w.clone()));
    }

    /// Registers a future's waker for `key` in its own place (see
    /// [`WaitEntry`]): the place it holds already (its waker brought up
    /// to date), or a new one. Its place for another key is left first.
    fn add_entry(
        &mut self,
        net: &Net,
        key: Key,
        w: &Waker,
        e: &mut WaitEntry,
        wake: &mut Vec<Waiter>,
    ) {
        let id = match e.at {
            Some((k, id)) if k == key => id,
            at => {
                if let Some((k, id)) = at {
                    self.remove_entry(k, id, wake);
                }
                self.entries += 1;
                e.at = Some((key, self.entries));
                if e.net.is_none() {
                    e.net = Some(net.downgrade());
                }
                self.entries
            }
        };
        let ws = &mut self.waiters_of(key).list;
        for x in ws.iter_mut() {
            if let Waiter::Entry(i, y) = x {
                if *i == id {
                    if !y.will_wake(w) {
                        wake.push(Waiter::Dropped(std::mem::replace(y, w.clone())));
                    }
                    return;
                }
            }
        }
        // Not there: new, or woken since it was added (a wake-up takes
        // the list), and waiting again.
        ws.push(Waiter::Entry(id, w.clone()));
    }

    /// Takes entry `id` out of `key`'s list (its future is dropped, or
    /// waits for another key now); its waker goes to `wake`, unwoken.
    fn remove_entry(&mut self, key: Key, id: u64, wake: &mut Vec<Waiter>) {
        let Some(ws) = self.waiters.get_mut(&key) else {
            return;
        };
        if let Some(i) = ws
            .list
            .iter()
            .position(|x| matches!(x, Waiter::Entry(j, _) if *j == id))
        {
            if let Waiter::Entry(_, w) = ws.list.remove(i) {
                wake.push(Waiter::Dropped(w));
            }
        }
        if ws.list.is_empty() {
            if let Some(ws) = self.waiters.remove(&key) {
                self.recycle(ws.list);
            }
        }
    }

    /// Records that `w` waits for `c`'s reads (registered just now), so
    /// its next polls may skip the lock (see [`ReadSignal`]).
    fn park_reader(&mut self, c: ConnId, sig: &Arc<ReadSignal>, w: &Waker) {
        self.signal_reads(c, sig);
        sig.park(w);
    }

    /// Has the driver bump `sig`'s epoch when it wakes `c`'s readers.
    fn signal_reads(&mut self, c: ConnId, sig: &Arc<ReadSignal>) {
        let i = c.index();
        if self.signals.len() <= i {
            self.signals.resize(i + 1, None);
        }
        let slot = &mut self.signals[i];
        if !slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, sig)) {
            *slot = Some(sig.clone());
        }
    }

    /// After an event loop's non-blocking read attempt on `c` (`found`):
    /// if it left nothing to read, records that for the next read, which
    /// can then say `WouldBlock` without the lock. Only in an event loop:
    /// there `Net::poll` drains the rings and bumps the epoch; elsewhere a
    /// non-blocking read that finds nothing drains them itself.
    fn note_read<R>(&mut self, c: ConnId, sig: &Arc<ReadSignal>, found: &Try<R>) {
        if self.track_ready
            && matches!(found, Try::Wait | Try::Done(Ok(_)))
            && !self.table.is_readable(c)
        {
            self.signal_reads(c, sig);
            sig.note_empty();
        }
    }

    fn add_retry(&mut self, w: &Waker) {
        if self.retry_waiters.iter().any(|y| y.will_wake(w)) {
            return;
        }
        // The first retrier rings the doorbell: the adapter's driver may be
        // asleep on it with no timer, and only a `Drive` it makes sees
        // `retry` (and then retries every `RETRY`). Without the ring, tasks
        // that met a full ring waited for traffic that might never come.
        if self.retry_waiters.is_empty() {
            let _ = self.stack.ring_self();
        }
        self.retry_waiters.push(w.clone());
    }
}

impl Drop for Core {
    /// Sends what still waits for ring space (a FIN behind a full ring, say)
    /// before the stack detaches, waiting a little for peers to make room:
    /// otherwise a peer would see a reset where it should read end of
    /// stream. Bounded: a peer that never drains is reset by its manager.
    fn drop(&mut self) {
        if self.stack.forked() {
            return; // the parent's connections: nothing here to send
        }
        if !self.flush_pending_until(Instant::now() + Duration::from_secs(1)) {
            tracing::warn!("closing with sends a peer never made room for");
        }
        // An adapter's driver task asleep on a duplicate of the doorbell
        // (xio-tokio's) holds only a weak reference to the net: woken, it
        // finds the net gone and ends, with its fds. Nothing else would
        // ever wake it.
        let _ = self.stack.ring_self();
    }
}

fn dispatch_control(table: &mut Table<Buf>, from: PeerId, k: u8, conn: u32, arg: u32) {
    let c = if k & kind::EARLY != 0 {
        match table.early_conn(from, conn) {
            Some(c) => c,
            None => return,
        }
    } else {
        ConnId(conn)
    };
    match kind::base(k) {
        kind::SYN_ACK => table.on_syn_ack(from, c, arg),
        kind::FIN => table.on_fin(from, c),
        kind::RST => table.on_rst(from, c),
        kind::CREDIT => table.on_credit(from, c, arg),
        _ => tracing::warn!(peer = from.0, k, "unexpected control descriptor ignored"),
    }
}

fn wake_all(wake: &mut Vec<Waiter>) {
    for w in wake.drain(..) {
        w.wake();
    }
}

/// What one attempt of a blocking operation found.
enum Try<R> {
    Done(io::Result<R>),
    /// Not yet: wait for `Key`.
    Wait,
    /// Not yet, and nothing will signal it (a full ring, an exhausted
    /// pool): retry after a short pause.
    Retry,
}

impl Net {
    /// Options for attaching to pool `prefix`.
    pub fn builder(prefix: &str) -> NetBuilder {
        NetBuilder {
            prefix: prefix.to_owned(),
            mode: WaitMode::default(),
            window: None,
            batch: true,
            ctrl_timeout: None,
            strict: None,
        }
    }

    /// Attaches to pool `prefix` with default options.
    pub fn attach(prefix: &str) -> io::Result<Net> {
        Self::builder(prefix).attach()
    }

    /// The process-wide default: pool `$XIO_PREFIX` (or `xio`), attached
    /// on first use. What [`XioListener::bind`] and [`XioStream::connect`]
    /// use. A process forked from one that used it attaches its own on
    /// first use (the parent's stays the parent's; see [`crate::fork`]).
    ///
    /// When its manager is gone (it was restarted, say: the manager's
    /// liveness word says so at once, with no call to it), the next call
    /// attaches to the running one; until one runs, it keeps returning the
    /// old net, whose channels still reach the peers it had. Streams and
    /// listeners made before keep their net. [`XioStream::connect`] and
    /// [`XioListener::bind`] retry once on a fresh net when theirs finds
    /// the manager gone. A service that has not yet bound on the new
    /// manager is refused, as a TCP server that is restarting.
    pub fn global() -> io::Result<Net> {
        let mut g = GLOBAL.get().lock().unwrap_or_else(|e| e.into_inner());
        if let Some((born, n)) = g.as_ref() {
            if !born.forked() {
                if !n.manager_gone() {
                    return Ok(n.clone());
                }
                return match Net::attach(&crate::paths::default_prefix()) {
                    Ok(fresh) => {
                        tracing::info!("the pool's manager was restarted: attached again");
                        *g = Some((crate::fork::Birth::now(), fresh.clone()));
                        Ok(fresh)
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "manager gone and none to attach to");
                        Ok(n.clone())
                    }
                };
            }
        }
        let n = Net::attach(&crate::paths::default_prefix())?;
        // (A forked child has its own `GLOBAL`, empty at first: the
        // parent's net is not its to use.)
        *g = Some((crate::fork::Birth::now(), n.clone()));
        Ok(n)
    }

    /// [`Net::global`] if this process has attached it already and its
    /// manager runs: never attaches, so never waits on a manager. `None`
    /// too while another thread holds the global net's slot (it may be
    /// attaching, which waits on the manager).
    pub fn global_if_attached() -> Option<Net> {
        let g = match GLOBAL.get().try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => return None,
        };
        match g.as_ref() {
            Some((born, n)) if !born.forked() && !n.manager_gone() => Some(n.clone()),
            _ => None,
        }
    }

    /// Runs `f` on [`Net::global`]; if that fails because the net's
    /// manager is gone, once more on the net `global` attaches afresh (when
    /// a manager runs again).
    pub fn with_global<R>(mut f: impl FnMut(&Net) -> io::Result<R>) -> io::Result<R> {
        let n = Net::global()?;
        match f(&n) {
            Err(e) if n.manager_gone() => match Net::global() {
                Ok(fresh) if fresh.id() != n.id() => f(&fresh),
                _ => Err(e),
            },
            r => r,
        }
    }

    /// Closes every connection of this net as dropping its stream would
    /// (a FIN, or a RST where data was left unread): what the exit handler
    /// does. Gives up if the lock stays taken until `deadline`, and stops
    /// pushing what waits for ring space then.
    fn close_all(&self, deadline: Instant) {
        let Some(mut g) = lock_until(&self.shared.core, deadline) else {
            return;
        };
        if g.stack.forked() {
            return;
        }
        // What arrived and was not read is unread data too (a RST), as it
        // would be in a socket's kernel buffer.
        let mut wake = Vec::new();
        let _ = g.drain(&mut wake);
        for c in g.table.open_ids() {
            g.table.close(c);
        }
        g.run_actions(&mut wake);
        // FINs behind a full ring: give the peer a little time to make
        // room, or it gets a reset (and loses what was queued before).
        g.flush_pending_until(deadline);
        drop(g);
        wake_all(&mut wake);
    }

    /// Whether the manager's liveness word says it is gone (one load; the
    /// stack itself learns it at its next look at the control socket).
    fn manager_died_now(&self) -> bool {
        crate::liveness::died(self.shared.seg.manager_alive())
    }

    /// Whether this net's manager is gone: its liveness word says so, or
    /// the stack found it out when it last talked to it. Connections
    /// already made keep working; new ones need a net attached to a
    /// running manager ([`Net::global`] attaches again by itself).
    ///
    /// When the liveness word says so before the stack found it, the stack
    /// is made to look now (unless another thread drives the net, which
    /// will): it reads what the manager queued before it went, and the fd
    /// of [`Net::manager_watch`] goes quiet in the same step, so a `true`
    /// here never leaves that fd to wake its loop once more.
    pub fn manager_gone(&self) -> bool {
        if !self.manager_died_now() {
            return self.lock().stack.manager_gone();
        }
        let mut wake = Vec::new();
        let mut g = self.lock();
        if !g.stack.manager_gone() && !g.driving {
            g.force_ctrl = true;
            if let Err(e) = g.drain(&mut wake) {
                tracing::debug!(error = %e, "drain on finding the manager gone");
            }
        }
        drop(g);
        wake_all(&mut wake);
        true
    }

    /// Runs `f` on the core, then what it asked the table for (sends, and
    /// waking the waiters it made ready, after the lock is released).
    fn update<R>(&self, f: impl FnOnce(&mut Core) -> R) -> R {
        let mut wake = Vec::new();
        let mut g = self.lock();
        let r = f(&mut g);
        g.run_actions(&mut wake);
        drop(g);
        wake_all(&mut wake);
        r
    }

    /// An identity for this net (equal for clones), for adapters' tables.
    pub fn id(&self) -> usize {
        Arc::as_ptr(&self.shared) as usize
    }

    /// A handle that does not keep the net (its stack) alive.
    pub fn downgrade(&self) -> WeakNet {
        WeakNet(Arc::downgrade(&self.shared))
    }

    fn lock(&self) -> MutexGuard<'_, Core> {
        if self.shared.born.forked() {
            return self.lock_inherited();
        }
        self.shared.core.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// [`Net::lock`] in a process forked from the one that attached. The
    /// net's calls then fail with `Forked` (its stack is the parent's),
    /// but they take the lock first, and a lock another thread of the
    /// parent held at the fork stays taken here for good: rather than
    /// wait for ever, say what happened.
    #[cold]
    fn lock_inherited(&self) -> MutexGuard<'_, Core> {
        match self.shared.core.try_lock() {
            Ok(g) => g,
            Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => panic!(
                "an X-IO net inherited across fork() was in use by another thread of the \
                 parent at the fork, and its lock stays taken in this process: attach a \
                 new Net in the child instead (see xio_core::fork)"
            ),
        }
    }

    /// Whether this process is a fork of the one that attached the net.
    fn inherited(&self) -> bool {
        self.shared.born.forked()
    }

    /// Test hook: holds the net's lock until the returned guard drops,
    /// as another thread may when the process forks. Not for
    /// applications.
    #[doc(hidden)]
    pub fn __hold_lock(&self) -> impl Drop + '_ {
        self.lock()
    }

    /// This net's stack id in the pool.
    pub fn stack_id(&self) -> PeerId {
        self.lock().me()
    }

    /// Connections open (in any state), and ones closed here whose peer
    /// has not finished yet (its FIN still to come). Takes what the rings
    /// hold first.
    pub fn connections(&self) -> usize {
        let mut wake = Vec::new();
        let n = {
            let mut g = self.lock();
            if !g.driving {
                let _ = g.drain(&mut wake);
            }
            g.table.len()
        };
        wake_all(&mut wake);
        n
    }

    /// The per-connection flow-control window in bytes.
    pub fn window(&self) -> usize {
        self.lock().table.window()
    }

    /// Runs one operation until it completes: the blocking driver. See the
    /// module docs for who waits how.
    fn block<R>(
        &self,
        key: Key,
        nonblocking: bool,
        deadline: Option<Instant>,
        mut f: impl FnMut(&mut Core, &mut Vec<Waiter>) -> Try<R>,
    ) -> io::Result<R> {
        let mut wake = Vec::new();
        let mut g = self.lock();
        let mut backoff = 0u32;
        // First try with what the table holds: a read whose data is
        // queued, or a write with credit, needs no look at the rings.
        // After a wait, drain first.
        let mut waited = false;
        // An event loop (a net that has been polled) learns readiness from
        // `poll`, which drains the rings in batches: a non-blocking read or
        // write that finds nothing to do says WouldBlock without draining,
        // as a socket would. Draining there pulled in other connections'
        // messages in the middle of the loop's pass over its events, and
        // the loop ran 15-20% slower batched than one descriptor per drain.
        let drain_first =
            !(nonblocking && g.track_ready && matches!(key, Key::Read(_) | Key::Write(_)));
        let r = loop {
            if waited && !g.driving {
                if let Err(e) = g.drain(&mut wake) {
                    break Err(e);
                }
            }
            let mut attempt = f(&mut g, &mut wake);
            if !waited && !matches!(attempt, Try::Done(_)) && !g.driving && drain_first {
                if let Err(e) = g.drain(&mut wake) {
                    break Err(e);
                }
                attempt = f(&mut g, &mut wake);
            }
            waited = true;
            let retry = match attempt {
                Try::Done(r) => break r,
                Try::Wait => false,
                Try::Retry => true,
            };
            // What the attempt asked of the table before it stopped (one
            // that finished ran it already): a write on a connection
            // within this net delivered to its reader (and wakes it)
            // before it ran out of credit, and a reader driving the net
            // sees nothing else; left queued, the two would wait for each
            // other.
            g.run_actions(&mut wake);
            if nonblocking {
                if let (true, Key::Write(c)) = (retry, key) {
                    g.note_retry_write(c);
                }
                break Err(io::ErrorKind::WouldBlock.into());
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break Err(io::ErrorKind::TimedOut.into());
            }
            // About to wait: what a write batch holds must not wait with
            // us (it may be what the peer needs to answer).
            g.release_held();
            g.ring_unrung();
            if retry {
                // Nothing will ring for a full ring or an empty pool; drain
                // (our own rings may be what the peer waits on) and pause.
                drop(g);
                wake_all(&mut wake);
                backoff = backoff.saturating_add(1);
                match backoff {
                    0..64 => std::hint::spin_loop(),
                    64..128 => std::thread::yield_now(),
                    _ => std::thread::sleep(Duration::from_micros(20)),
                }
                g = self.lock();
                continue;
            }
            if !g.driving {
                g.driving = true;
                let reuse = g.probe.take();
                let mut probe = g.stack.probe(reuse);
                let until = if g.has_pending() || !g.retry_writes.is_empty() {
                    let r = Instant::now() + RETRY_FULL;
                    Some(deadline.map_or(r, |d| d.min(r)))
                } else {
                    deadline
                };
                drop(g);
                wake_all(&mut wake);
                // Threads woken and not yet back need a CPU, maybe this
                // one: a driver spinning here would keep them off it until
                // the scheduler preempts it, milliseconds later. So it
                // spins only while none is on its way.
                let waking = &*self.shared.waking;
                let res = probe.wait(until, &|| waking.load(AtomicOrdering::Relaxed) == 0);
                g = self.lock();
                g.stack.end_probe(&mut probe);
                g.probe = Some(probe);
                g.driving = false;
                // A reactor asleep on the doorbell left the rings to us
                // (`Net::drive`), and our wait disarmed its doorbell: the
                // futex sleep took the slot's word over, or a peer's ring
                // during our spin cleared it. Ring it, so it drives again
                // (draining what we leave, arming again) and hears the
                // peers once we are gone; else its tasks waited for good.
                g.ring_reactor();
                match res {
                    Ok(true) => g.force_ctrl = true,
                    Ok(false) | Err(Error::TimedOut) => {}
                    Err(e) => break Err(stack_err(e)),
                }
            } else {
                let me = std::thread::current();
                g.add_waiter(key, Waiter::Thread(me.clone()));
                // A poll reports writes that met a full ring or an empty
                // pool after a pause (nothing signals them): it looks
                // again then, as a driving poll does.
                let deadline = if key == Key::Poll && !g.retry_writes.is_empty() {
                    let r = Instant::now() + RETRY_FULL;
                    Some(deadline.map_or(r, |d| d.min(r)))
                } else {
                    deadline
                };
                drop(g);
                wake_all(&mut wake);
                match deadline {
                    Some(d) => {
                        std::thread::park_timeout(d.saturating_duration_since(Instant::now()))
                    }
                    None => std::thread::park(),
                }
                g = self.lock();
                g.remove_thread(key, &me);
            }
        };
        // Someone else still waits: hand over the driver's role.
        if !g.driving && g.parked > 0 {
            if let Some(w) = g.take_any_waiter() {
                wake.push(w);
            }
        }
        drop(g);
        wake_all(&mut wake);
        r
    }

    /// Test hook: threads woken from blocking calls that have not taken
    /// the lock back yet, and threads woken in all. Not for applications.
    #[doc(hidden)]
    pub fn __waking(&self) -> (usize, u64) {
        let g = self.lock();
        (
            self.shared.waking.load(AtomicOrdering::Relaxed),
            g.threads_woken,
        )
    }

    /// Test hook: descriptors queued behind full rings (all peers), and
    /// resets dropped for peers that do not drain. Not for applications.
    #[doc(hidden)]
    pub fn __send_queue(&self) -> (usize, u64) {
        let g = self.lock();
        (g.pending.values().map(VecDeque::len).sum(), g.rst_dropped)
    }

    /// Listens on `addr` (port 0 picks a free port). The address is bound
    /// in the pool's manager, so other processes' `connect` reaches it.
    /// Up to [`DEFAULT_BACKLOG`] connections wait to be accepted; see
    /// [`Net::listen_with_backlog`].
    pub fn listen(&self, addr: impl ToSocketAddrs) -> io::Result<XioListener> {
        self.listen_with_backlog(addr, DEFAULT_BACKLOG)
    }

    /// [`Net::listen`] holding at most `backlog` (at least one)
    /// connections not yet accepted, as `listen(2)`'s argument. A connect
    /// beyond them is refused: its stream's first read fails with
    /// `ConnectionRefused` (where TCP would drop the SYN and let the
    /// client retry). So a client flooding a server that does not accept
    /// cannot grow its memory, or the pool buffers its unaccepted
    /// connections may fill, without bound.
    pub fn listen_with_backlog(
        &self,
        addr: impl ToSocketAddrs,
        backlog: usize,
    ) -> io::Result<XioListener> {
        let mut last = None;
        for a in addr.to_socket_addrs()? {
            match self.listen_one(a, backlog) {
                Ok(l) => return Ok(l),
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .unwrap_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no address to bind")))
    }

    fn listen_one(&self, addr: SocketAddr, backlog: usize) -> io::Result<XioListener> {
        let mut a = addr;
        let mut tries = 0;
        loop {
            if a.port() == 0 || tries > 0 {
                a.set_port(49152 + (fastrand(tries) % 16384) as u16);
            }
            // The table's look and the request in one step, so a listener
            // of this net closing (its unbind) and this bind reach the
            // manager in the order the table saw them; `binding` holds the
            // address while the answer is awaited.
            let asked = {
                let mut g = self.lock();
                if self.shared.strict && !this_node(&mut g.node_ips, a.ip()) {
                    return Err(io::Error::new(
                        io::ErrorKind::AddrNotAvailable,
                        format!(
                            "{} is not an address of this node (strict addresses: \
                             see NetBuilder::strict_addresses)",
                            a.ip()
                        ),
                    ));
                }
                if g.table.is_listening(&a) || g.binding.contains(&a) {
                    if addr.port() != 0 {
                        return Err(io::Error::new(
                            io::ErrorKind::AddrInUse,
                            format!("{a} is already listened on by this net"),
                        ));
                    }
                    None
                } else {
                    let asked = g
                        .ask(&crate::proto::Msg::Bind { addr: a })
                        .map_err(stack_err)?;
                    g.binding.push(a);
                    Some(asked)
                }
            };
            if let Some(asked) = asked {
                let bound = self.wait_answer(asked, None).and_then(kept_ok);
                let mut g = self.lock();
                g.binding.retain(|b| *b != a);
                match bound {
                    Ok(()) => {
                        g.table.listen(a, backlog).map_err(io::Error::from)?;
                        break;
                    }
                    Err(e) => {
                        let e = stack_err(e);
                        if addr.port() != 0 || e.kind() != io::ErrorKind::AddrInUse || tries > 64 {
                            return Err(e);
                        }
                    }
                }
            }
            tries += 1;
        }
        Ok(XioListener {
            inner: Arc::new(ListenerInner {
                net: Mutex::new(self.clone()),
                addr: a,
                nonblocking: AtomicBool::new(false),
                ttl: Ttl::new(DEFAULT_TTL),
                follow: None,
            }),
        })
    }

    /// Waits for the answer to `asked` (see [`Core::ask`]) until
    /// `deadline` or the control timeout, without holding the net: a
    /// stopped or slow manager stops this call only, not every stream of
    /// the process. Whoever reads the control socket meanwhile keeps the
    /// answer for it; the wait wakes when the socket has news, or every
    /// millisecond to look for an answer another thread read.
    fn wait_answer(&self, asked: Asked, deadline: Option<Instant>) -> Result<Kept, Error> {
        use rustix::event::{poll, PollFd, PollFlags, Timespec};
        let Asked {
            n,
            fd,
            timeout,
            limit,
            what,
        } = asked;
        let until = match (deadline, limit) {
            (Some(d), Some(l)) => Some(d.min(l)),
            (d, l) => d.or(l),
        };
        loop {
            {
                let mut g = self.lock();
                // A call to the manager: what a write batch of this thread
                // holds leaves first, as before any wait, and is out when
                // the call returns, however soon the answer came.
                g.release_held();
                g.ring_unrung();
                if let Some(kept) = g.stack.take_answer(n)? {
                    return Ok(kept);
                }
                if until.is_some_and(|u| Instant::now() >= u) {
                    g.stack.give_up(n);
                    tracing::warn!(request = ?what, "the manager did not answer in time");
                    return Err(if until == limit {
                        Error::ManagerUnresponsive(timeout)
                    } else {
                        Error::TimedOut
                    });
                }
            }
            let slice = until.map_or(ASK_SLICE, |u| {
                u.saturating_duration_since(Instant::now()).min(ASK_SLICE)
            });
            let ts = Timespec {
                tv_sec: 0,
                tv_nsec: slice.as_nanos() as _,
            };
            let mut p = [PollFd::new(&fd, PollFlags::IN)];
            match poll(&mut p, Some(&ts)) {
                Ok(_) | Err(rustix::io::Errno::INTR) => {}
                Err(e) => {
                    self.lock().stack.give_up(n);
                    return Err(Error::Io(e.into()));
                }
            }
        }
    }

    /// Test hook: how many requests of this net wait for the manager's
    /// answer outside its lock. Not for applications.
    #[doc(hidden)]
    pub fn __requests_awaited(&self) -> usize {
        self.lock().stack.awaited()
    }

    /// Changes how long this net's calls wait for the manager's answer
    /// (see [`NetBuilder::control_timeout`]).
    pub fn set_control_timeout(&self, timeout: Duration) {
        self.lock().stack.set_control_timeout(timeout);
    }

    /// Connects to `addr`, which some process (this one included) listens
    /// on. Fails with `ConnectionRefused` if nobody does, or if the address
    /// needs the manager to resolve and it is gone (the source error says
    /// so: [`Error::ManagerGone`]). The unspecified address (`0.0.0.0`,
    /// `[::]`) means this host's loopback, as for a TCP connect on Linux.
    ///
    /// Unlike a blocking TCP connect, one to an address this net has
    /// connected to before (the route is known) returns without waiting
    /// for the listener's answer, as a non-blocking connect does: if the
    /// listener has gone since, the stream's first read or write fails
    /// with `ConnectionRefused` instead of the connect.
    pub fn connect(&self, addr: impl ToSocketAddrs) -> io::Result<XioStream> {
        let mut last = None;
        for a in addr.to_socket_addrs()? {
            match self.connect_one(a, None, true) {
                Ok(Some(s)) => return Ok(s),
                Ok(None) => unreachable!("a connect that may ask always answers"),
                Err(e) => last = Some(no_manager_refuses(e)),
            }
        }
        Err(last.unwrap_or_else(|| {
            io::Error::new(io::ErrorKind::InvalidInput, "no address to connect to")
        }))
    }

    /// Connects, waiting at most `timeout` (a zero one is `InvalidInput`,
    /// as with `TcpStream::connect_timeout`).
    pub fn connect_timeout(&self, addr: &SocketAddr, timeout: Duration) -> io::Result<XioStream> {
        if timeout.is_zero() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot set a 0 duration timeout",
            ));
        }
        // A timeout past what an `Instant` holds (`Duration::MAX`) is no
        // deadline, not an overflow panic.
        self.connect_one(*addr, Instant::now().checked_add(timeout), true)
            .map(|s| s.expect("a connect that may ask always answers"))
            .map_err(no_manager_refuses)
    }

    /// Connects to `addr` if that needs no wait: the address is one of
    /// this net's listeners, or one this net has connected to before
    /// (resolved already, to a process still attached). `Ok(None)`
    /// otherwise (the manager would have to resolve it, or an IPv6 SYN's
    /// buffer is not to be had at once), and nothing was sent: then
    /// [`Net::connect`], where blocking is fine (an async adapter calls it
    /// on a blocking thread).
    pub fn connect_known(&self, addr: SocketAddr) -> io::Result<Option<XioStream>> {
        self.connect_one(addr, None, false)
    }

    /// `may_ask`: whether to ask the manager for a route this net does
    /// not know and wait for a SYN's buffer; without it, such a connect
    /// returns `Ok(None)` having done nothing.
    fn connect_one(
        &self,
        addr: SocketAddr,
        deadline: Option<Instant>,
        may_ask: bool,
    ) -> io::Result<Option<XioStream>> {
        // The unspecified address is this host's loopback, as Linux's TCP
        // connect takes it (`connect("0.0.0.0:3000")` dials the address a
        // server bound and reaches it on 127.0.0.1).
        let mut addr = addr;
        if addr.ip().is_unspecified() {
            addr.set_ip(match addr {
                SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
            });
        }
        // An IPv6 SYN's buffer, taken before the lock (it may have to
        // wait). An IPv4 SYN needs none (see `kind::SYN4`).
        let syn = match addr {
            SocketAddr::V6(_) if may_ask => Some(self.alloc_wait(SYN_LEN, deadline)?),
            SocketAddr::V6(_) => match self.lock().stack.try_alloc(SYN_LEN) {
                Ok(b) => Some(b),
                Err(Error::WouldBlock) => return Ok(None),
                Err(e) => return Err(stack_err(e)),
            },
            SocketAddr::V4(_) => None,
        };
        // An address this net has no route for is asked of the manager
        // without holding the net (see `Net::wait_answer`).
        let mut g = self.lock();
        let me = g.me();
        let resolved = if g.table.is_listening(&addr) {
            Ok(me) // our own listener
        } else if let Some(p) = g.stack.resolve_known(addr).map_err(stack_err)? {
            Ok(p)
        } else if !may_ask {
            return Ok(None);
        } else {
            let asked = g
                .ask(&crate::proto::Msg::Connect { addr })
                .map_err(stack_err)?;
            drop(g);
            let answer = self.wait_answer(asked, deadline);
            g = self.lock();
            // The manager refuses an address it resolves to us (below). A
            // bind of ours covering `addr` may have reached it before this
            // connect while the binding thread has not put the listener in
            // the table yet: wait for that bind to settle, then look again.
            let refused = matches!(
                answer,
                Ok(Kept::Reply(Ok((
                    crate::proto::Msg::Error {
                        code: crate::proto::ErrorCode::ConnectionRefused,
                        ..
                    },
                    _,
                ))))
            );
            if refused && crate::addr::is_this_node(addr.ip()) {
                while g.table.listener_for(&addr).is_none()
                    && crate::addr::bindings_for(addr).any(|a| g.binding.contains(&a))
                    && deadline.is_none_or(|d| Instant::now() < d)
                {
                    drop(g);
                    std::thread::sleep(BIND_SETTLE);
                    g = self.lock();
                }
            }
            match answer {
                // Listening on it ourselves since.
                _ if g.table.is_listening(&addr) => Ok(me),
                // Acted on when it was read (see `Kept::Route`); the
                // peer may have died since, its death read by another
                // thread: its reset found no connection to reset yet,
                // so refuse here rather than send a SYN nowhere.
                Ok(Kept::Route(Ok(p))) if !g.stack.peer_alive(p) => Err(Error::Refused {
                    code: crate::proto::ErrorCode::ConnectionRefused,
                    message: format!("the process bound to {addr} exited"),
                }),
                Ok(Kept::Route(r)) => r,
                // The manager refuses an address nobody binds, at once.
                // It also refuses one it resolves to us: then it found a
                // wildcard listener of ours (see `crate::addr`), as no
                // other stack binds the address exactly. Only its own
                // refusal means that: one made here (the channel to the
                // stack it named closed while connecting, or that stack
                // exited) is about another stack, which binds the
                // address exactly, and must not reach our wildcard; so is
                // the manager's `Busy` (that stack does not read its
                // control socket), which is why it is not this code.
                Ok(Kept::Reply(Ok((
                    crate::proto::Msg::Error {
                        code: crate::proto::ErrorCode::ConnectionRefused,
                        ..
                    },
                    _,
                )))) if g.table.listener_for(&addr).is_some()
                    && crate::addr::is_this_node(addr.ip()) =>
                {
                    Ok(me)
                }
                Ok(Kept::Reply(Ok((crate::proto::Msg::Error { code, message }, _)))) => {
                    Err(Error::Refused { code, message })
                }
                Ok(Kept::Reply(Ok((m, _)))) => {
                    Err(Error::Protocol(format!("unexpected reply {m:?}")))
                }
                Ok(Kept::Reply(Err(e))) | Err(e) => Err(e),
            }
        };
        let (c, local, drained) = {
            let peer = resolved.map_err(stack_err)?;
            let local = peer == me;
            // The source address depends on the id: reserve it, then fix.
            let c = g
                .table
                .connect(peer, addr, client_addr(me, ConnId(0), &addr))
                .map_err(io::Error::from)?;
            g.table.set_local_addr(c, client_addr(me, c, &addr));
            g.syn_buf = syn;
            let mut wake = Vec::new();
            g.run_actions(&mut wake);
            g.syn_buf = None;
            // A client that only connects, writes and closes never waits,
            // so nothing else would take the listeners' SYN-ACKs off its
            // rings: each of its closed connections would stay in the
            // table until the next wait, and the answers pile up at the
            // listener. Unless a driver thread drains for us, do it here
            // when something is there (one look at the rings otherwise).
            let drained = if !g.driving && g.stack.has_input() {
                g.drain(&mut wake).map(drop)
            } else {
                Ok(())
            };
            drop(g);
            wake_all(&mut wake);
            (c, local, drained)
        };
        let s = XioStream::new(self.clone(), c);
        // A failed drain fails the connect; dropping `s` closes the
        // connection it had already opened.
        drained?;
        if local {
            // Answered already, by our own table.
            self.ensure_connected(c, deadline)?;
        }
        // Otherwise the stream is usable at once: writes go out behind the
        // SYN (addressed by our id until the SYN-ACK tells us the
        // listener's), and the first read waits for the answer.
        Ok(Some(s))
    }

    /// Waits until `c`'s SYN is answered (at once if it was). A refusal is
    /// `ConnectionRefused`, and the address is resolved afresh next time.
    fn ensure_connected(&self, c: ConnId, deadline: Option<Instant>) -> io::Result<()> {
        let Some((peer, addr)) = self.syn_target(c)? else {
            return Ok(());
        };
        let r = self.await_syn_ack(c, peer, addr, deadline);
        if let Err(e) = &r {
            if e.kind() == io::ErrorKind::ConnectionRefused {
                // Perhaps a stale resolution: the next connect asks again.
                self.lock().stack.forget_resolution(&addr);
            }
        }
        r
    }

    /// The peer and address of `c`'s SYN if it is not answered yet.
    fn syn_target(&self, c: ConnId) -> io::Result<Option<(PeerId, SocketAddr)>> {
        let g = self.lock();
        if !g.table.is_connecting(c) {
            return Ok(None);
        }
        let peer = g.table.peer_of(c).ok_or(ConnError::NotConnected)?;
        let addr = g.table.addrs(c).map_err(io::Error::from)?.1;
        Ok(Some((peer, addr)))
    }

    /// Waits for the answer to a SYN. The answer needs the listening
    /// process to look at its rings, which it does whenever one of its
    /// threads waits in X-IO (an accept loop always does). A process that
    /// stopped listening and does nothing with X-IO any more would leave the
    /// SYN unanswered, so after a little while we ask the manager whether
    /// the address still belongs to that process (`check_syn_route`).
    fn await_syn_ack(
        &self,
        c: ConnId,
        peer: PeerId,
        addr: SocketAddr,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        let mut check = Duration::from_millis(2);
        loop {
            let until = Instant::now() + check;
            let until = deadline.map_or(until, |d| d.min(until));
            let r = self.block(Key::Connect(c), false, Some(until), |core, _| {
                core.connect_step(c)
            });
            match r {
                Err(e)
                    if e.kind() == io::ErrorKind::TimedOut
                        && deadline.is_none_or(|d| Instant::now() < d) =>
                {
                    self.check_syn_route(c, peer, addr, deadline)?;
                    check = (check * 2).min(Duration::from_millis(100));
                }
                r => return r,
            }
        }
    }

    /// For a connection `c` whose SYN to `peer` (for `addr`) is not
    /// answered yet: asks the manager whether `addr` still belongs to
    /// `peer`, and if not refuses the connection here
    /// (`ConnectionRefused`; the caller retries with a fresh resolution).
    /// Waits for the manager at most [`ROUTE_CHECK_WAIT`] (or `deadline`),
    /// holding the net.
    fn check_syn_route(
        &self,
        c: ConnId,
        peer: PeerId,
        addr: SocketAddr,
        deadline: Option<Instant>,
    ) -> io::Result<()> {
        let mut g = self.lock();
        if !g.table.is_connecting(c) {
            return Ok(()); // answered meanwhile
        }
        g.stack.forget_resolution(&addr);
        // A question, not the connect itself: a manager that does not
        // answer at once is not waited for (holding the lock), and its late
        // answer is settled later. Asked already with no answer yet: not
        // again (each ask holds the lock while it waits).
        let ask = Instant::now() + ROUTE_CHECK_WAIT;
        let ask = deadline.map_or(ask, |d| d.min(ask));
        let answer = if g.stack.asking(addr) {
            Err(Error::ManagerUnresponsive(ROUTE_CHECK_WAIT))
        } else {
            g.stack.connect_until(addr, Some(ask))
        };
        let still = match answer {
            Ok(p) => p == peer,
            Err(Error::Refused { .. }) => false,
            // Nobody to ask, or nobody answering: wait on while the process
            // lives (it answers when it next looks at its rings), and keep
            // the route.
            Err(Error::ManagerGone | Error::ManagerUnresponsive(_) | Error::TimedOut) => {
                let alive = g.stack.peer_alive(peer);
                if alive {
                    g.stack.remember_resolution(addr, peer);
                }
                alive
            }
            Err(e) => return Err(stack_err(e)),
        };
        // Answered while the manager was asked: the answer stands.
        if !still && g.table.is_connecting(c) {
            // Nobody will answer: refuse it here.
            g.table.on_rst(peer, c);
            let mut wake = Vec::new();
            g.run_actions(&mut wake);
            drop(g);
            wake_all(&mut wake);
            return Err(ConnError::Refused.into());
        }
        Ok(())
    }

    /// A writable pool buffer of `len` bytes, waiting while the pool is
    /// exhausted.
    fn alloc_wait(&self, len: usize, deadline: Option<Instant>) -> io::Result<BufMut> {
        let mut backoff = 0u32;
        loop {
            let r = {
                let mut g = self.lock();
                let r = g.stack.try_alloc(len);
                if matches!(r, Err(Error::WouldBlock)) {
                    // About to wait: what a write batch holds must not
                    // wait with us (its buffers may be the ones missing,
                    // back once the reader has them).
                    g.release_held();
                    g.ring_unrung();
                }
                r
            };
            match r {
                Ok(b) => return Ok(b),
                Err(Error::WouldBlock) => {
                    if deadline.is_some_and(|d| Instant::now() >= d) {
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                    backoff += 1;
                    if backoff < 64 {
                        std::thread::yield_now();
                    } else {
                        std::thread::sleep(Duration::from_micros(20));
                    }
                }
                Err(e) => return Err(stack_err(e)),
            }
        }
    }

    /// Holds this thread's stream writes on this net's streams until the
    /// returned guard drops, then sends them together: for an event loop,
    /// around its handling of one [`Net::poll`]'s events when there are
    /// several.
    ///
    /// Each write still copies its bytes and counts against the
    /// connection's window at once, and returns as usual; what waits is
    /// the descriptor. Sent together, the descriptors' ring stores overlap
    /// their trips to the reader's core, where one write at a time waits
    /// for each (a locked instruction after a store to a line the reader
    /// holds waits for that line). In the section-c benchmark (one thread
    /// per side, 64 B requests) that was 10–38% more requests a second at
    /// 64 connections and 11–19% at 256; with a single event per poll
    /// there is nothing to batch, and the guard only costs its lock.
    ///
    /// ```no_run
    /// # fn main() -> std::io::Result<()> {
    /// # let net = xio_core::net::Net::attach("xio")?;
    /// let mut events = Vec::new();
    /// loop {
    ///     events.clear();
    ///     net.poll(&mut events, None)?;
    ///     let _batch = (events.len() > 1).then(|| net.batch_writes());
    ///     for ev in &events {
    ///         // read requests, write replies: the replies leave together
    ///         // when `_batch` drops, at the end of this pass
    ///     }
    /// }
    /// # }
    /// ```
    ///
    /// Held writes also leave, in order, at the next `poll`, before this
    /// thread waits in any call of this net, before anything else is sent
    /// (a FIN, a reset, a zero-copy `send_buf`, another thread's write:
    /// the bytes of one connection never change order), and when 256 are
    /// held. What the reader's ring has no room for then waits in the
    /// net's queue, as any write's descriptors that find the ring full,
    /// and leaves at the net's next call (a later write on that
    /// connection says `WouldBlock` until it has, as a full socket
    /// buffer would). Do not hold a guard across work that does not come
    /// back to the net soon: the bytes wait for it, as with `TCP_CORK`.
    /// Writes of other threads are not held; a guard taken while another
    /// thread's is alive holds nothing. Guards nest.
    pub fn batch_writes(&self) -> WriteBatch<'_> {
        WriteBatch {
            net: self,
            // An inner guard of the same thread finds its batch begun and
            // leaves the ending to the outer one.
            owned: self.start_batch() == Some(true),
            _thread: std::marker::PhantomData,
        }
    }

    /// [`Net::batch_writes`] without a guard, for callers that cannot keep
    /// one (the C ABI): holds this thread's stream writes until
    /// [`Net::end_write_batch`]. True when they are held (now, or already
    /// by an earlier call); false when another thread's batch is under way
    /// (this thread's writes then go out as usual). Calls do not nest: the
    /// first `end_write_batch` ends the batch.
    pub fn begin_write_batch(&self) -> bool {
        self.start_batch().is_some()
    }

    /// Ends this thread's write batch (see [`Net::begin_write_batch`]):
    /// sends what it holds, together. Nothing happens if this thread has
    /// none.
    pub fn end_write_batch(&self) {
        let mut wake = Vec::new();
        let mut g = self.lock();
        // Under the lock: none of our writes is between its check and its
        // hold (this thread's cannot be, and other threads' do not hold).
        if self
            .shared
            .batch_owner
            .compare_exchange(
                thread_key(),
                0,
                AtomicOrdering::Relaxed,
                AtomicOrdering::Relaxed,
            )
            .is_err()
        {
            return;
        }
        g.release_held();
        // Rings the peers sent to, and settles peers found gone.
        g.run_actions(&mut wake);
        drop(g);
        wake_all(&mut wake);
    }

    /// Starts holding this thread's writes: `Some(true)` if this call
    /// began the batch, `Some(false)` if this thread's was under way,
    /// `None` if another thread's is. Only this thread's writes look for
    /// its key, so no lock is needed.
    fn start_batch(&self) -> Option<bool> {
        let me = thread_key();
        match self.shared.batch_owner.compare_exchange(
            0,
            me,
            AtomicOrdering::Relaxed,
            AtomicOrdering::Relaxed,
        ) {
            Ok(_) => Some(true),
            Err(o) if o == me => Some(false),
            Err(_) => None,
        }
    }

    /// Waits for readiness events of streams in non-blocking mode (an
    /// `epoll_wait` for X-IO sockets): appends to `events` what became
    /// readable, writable or acceptable since the last call, waiting up to
    /// `timeout` (per the net's waiting mode) when nothing is. With batch
    /// wake-up on, one drain of the rings reports every ready connection;
    /// off, one descriptor at a time. Events are edge-like hints: after
    /// one, read or write until `WouldBlock`.
    ///
    /// Once a net has been polled, `poll` is where its rings are drained:
    /// a non-blocking read or write that finds nothing to do returns
    /// `WouldBlock` at once, and what arrives later is reported by the
    /// next `poll` (as with a socket and `epoll`). Blocking calls still
    /// drain and wait as usual.
    pub fn poll(&self, events: &mut Vec<Event>, timeout: Option<Duration>) -> io::Result<usize> {
        self.poll_capped(events, usize::MAX, timeout)
    }

    /// [`Net::poll`] appending at most `cap` events (at least one); the
    /// rest stay for the next call, where [`XioStream::set_token`] still
    /// changes their tokens (as `epoll_wait`'s `maxevents`).
    pub fn poll_capped(
        &self,
        events: &mut Vec<Event>,
        cap: usize,
        timeout: Option<Duration>,
    ) -> io::Result<usize> {
        let cap = cap.max(1);
        let start = events.len();
        let mut collect = |core: &mut Core, _: &mut Vec<Waiter>| {
            // A poll ends any write batch's run (see `Net::batch_writes`).
            core.release_held();
            core.ring_unrung();
            if !core.track_ready {
                // From now on readiness is recorded; what is ready already
                // is reported first.
                core.track_ready = true;
                let (conns, accepts) = core.table.ready_now();
                for (c, r, w) in conns {
                    core.note_ready(c, r, w);
                }
                for a in accepts {
                    core.ready.push(Event::Accept(a));
                    core.ready_conn.push(None);
                }
            }
            core.ripe_retries();
            if core.ready.is_empty() {
                return Try::Wait;
            }
            if core.ready.len() <= cap {
                core.ready_conn.clear();
                events.append(&mut core.ready);
            } else {
                events.extend(core.ready.drain(..cap));
                core.ready_conn.drain(..cap);
                core.reindex_ready();
                // Bring a loop that sleeps on the doorbell's fd back for
                // the rest.
                let _ = core.stack.ring_self();
            }
            Try::Done(Ok(()))
        };
        // Under load something is ready at once: look (and drain) before
        // reading the clock for a deadline.
        let r = match self.block(Key::Poll, true, None, &mut collect) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock && timeout != Some(Duration::ZERO) => {
                // (`Duration::MAX` and the like: no deadline.)
                let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
                self.block(Key::Poll, false, deadline, &mut collect)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            r => r,
        };
        match r {
            Ok(()) => Ok(events.len() - start),
            Err(e) if e.kind() == io::ErrorKind::TimedOut => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// [`Net::poll`] for event loops that wait on [`Net::poll_fd`]
    /// themselves (an `epoll` loop in C): collects what is ready without
    /// waiting, then arms the doorbell, so the fd becomes readable when
    /// more arrives. Call it whenever the fd is readable.
    ///
    /// A non-blocking write (or a stream's `alloc`) that said
    /// `WouldBlock` for a full ring or an empty pool, which no peer
    /// signals the end of, is reported writable again after 50 µs: on
    /// [`Net::poll_fd`] the retry timer below makes the fd readable for
    /// that, so a loop asleep on it alone needs nothing more. A loop
    /// asleep on the bare [`Net::doorbell`] has no timer: it calls this at
    /// least every millisecond while such a write waits.
    ///
    /// What the net sends by itself (a close's FIN, the window a read
    /// gives back) and finds a peer's ring full for is retried when the
    /// fd's timer fires: after 50 µs, the pause doubling up to 1 ms while
    /// the peer makes no room (a stopped peer costs the loop a wake-up a
    /// millisecond, not a core). The same timer, with the same back-off,
    /// brings the loop back for the writes above. A loop asleep on the bare
    /// [`Net::doorbell`] has no timer: for it the doorbell is left
    /// readable while such sends wait, and it comes straight back.
    ///
    /// An error met after events were collected (a failed drain) comes
    /// with the next call, the fd left readable for it: the events are
    /// returned, not dropped with it.
    pub fn poll_nowait(&self, events: &mut Vec<Event>) -> io::Result<usize> {
        self.poll_nowait_capped(events, usize::MAX)
    }

    /// [`Net::poll_nowait`] appending at most `cap` events (at least one);
    /// when more are ready the doorbell is left readable so the caller
    /// comes back for them (and while sends of the net's own wait for a
    /// peer's ring to have room, its timer is set: see
    /// [`Net::poll_nowait`]).
    pub fn poll_nowait_capped(&self, events: &mut Vec<Event>, cap: usize) -> io::Result<usize> {
        let cap = cap.max(1);
        let start = events.len();
        if let Some(e) = self.lock().poll_error.take() {
            return Err(e);
        }
        self.poll_capped(events, cap, Some(Duration::ZERO))?;
        // Read the control socket once the manager's liveness word says it
        // died (one load); where no manager registered the word, about
        // once a second.
        let alive = self.shared.seg.manager_alive();
        let liveness = if crate::liveness::watched(alive) {
            crate::liveness::died(alive)
        } else {
            let mut g = self.lock();
            let now = crate::wait::now_ns();
            let due = now.saturating_sub(g.last_liveness) > 1_000_000_000;
            if due {
                g.last_liveness = now;
            }
            due
        };
        // Consume the doorbell, drain what came meanwhile (recorded as
        // readiness) and arm the doorbell; when something keeps arriving
        // as we arm, leave the fd readable so the caller comes back.
        let mut armed = false;
        // A failure from here on must not take the events collected
        // above with it (the C ABI returns an error code alone): they go
        // to the caller, the error with the next call.
        let mut failed = None;
        for _ in 0..4 {
            let d = match self.drive(true, liveness) {
                Ok(d) => d,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            };
            if d.retry {
                self.wake_retriers();
            }
            if d.armed {
                armed = true;
                break;
            }
        }
        let room = cap - (events.len() - start);
        if failed.is_none() && room > 0 && !self.lock().ready.is_empty() {
            if let Err(e) = self.poll_capped(events, room, Some(Duration::ZERO)) {
                failed = Some(e);
            }
        }
        // Sends queued behind a full ring (a FIN, a credit) go out only
        // when a drain retries them, and the room a peer makes rings
        // nobody: the caller has to come back for them (as `Drive::retry`
        // asks a driver to), rather than sleep with them queued while the
        // peer waits for them. A loop on `poll_fd` comes back when its
        // timer fires: after a pause, not at once, so a peer that does
        // not run (stopped) costs it no core meanwhile. One on the bare
        // doorbell finds it readable again at once.
        let again = {
            let mut g = self.lock();
            let retry = g.set_retry_timer();
            !g.ready.is_empty() || retry
        };
        // After a failure the doorbell may be unarmed with the rings
        // holding more: ring it, so the caller comes back (for the
        // error, and to drain again) instead of sleeping on them.
        let rung = if !armed || again || failed.is_some() {
            self.ring_doorbell()
        } else {
            Ok(())
        };
        let n = events.len() - start;
        match failed.or(rung.err()) {
            Some(e) if n == 0 => Err(e),
            Some(e) => {
                self.lock().poll_error = Some(e);
                Ok(n)
            }
            None => Ok(n),
        }
    }

    /// Makes [`Net::doorbell`] readable, so an external loop waiting on it
    /// comes back (for example while it holds events it has not handed
    /// out yet).
    pub fn ring_doorbell(&self) -> io::Result<()> {
        self.lock().stack.ring_self()
    }

    fn class_for(&self, n: usize) -> usize {
        let c = &self.shared.classes;
        c.iter()
            .copied()
            .find(|&s| s >= n)
            .unwrap_or_else(|| *c.last().expect("at least one class"))
    }

    /// Writes from `bufs` (as one byte sequence) on `c`: splits into pool
    /// buffers, packs several slices into one buffer when they fit. Returns
    /// the bytes written; blocking, writes everything unless an error
    /// comes after some bytes were written.
    fn write_on(
        &self,
        c: ConnId,
        bufs: &[IoSlice<'_>],
        nonblocking: bool,
        deadline: Option<Instant>,
    ) -> io::Result<usize> {
        let total: usize = bufs.iter().map(|b| b.len()).sum();
        if total == 0 {
            return self
                .lock()
                .table
                .send_target(c)
                .map(|_| 0)
                .map_err(io::Error::from);
        }
        let max_buf = *self.shared.classes.last().expect("a class");
        let mut cursor = (0usize, 0usize); // (slice, offset)
        let mut written = 0usize;
        let mut peer_used = None;
        let r = self.block(Key::Write(c), nonblocking, deadline, |core, wake| {
            // Not held: what a write batch holds goes first (the pending
            // check below then keeps the order if it had to queue).
            let hold = core.holds_writes();
            if !hold {
                core.release_held();
            }
            while written < total {
                let (peer, to, flag) = match core.table.send_target(c) {
                    Ok(t) => t,
                    Err(e) => return Try::Done(Err(e.into())),
                };
                peer_used = Some(peer);
                if core.pending_for(peer) && !core.flush_pending() && core.pending_for(peer) {
                    return park(core, &mut peer_used, Try::Retry);
                }
                core.stack.prefetch_tx(peer);
                let mut want = (total - written).min(max_buf);
                // One buffer for the whole write when a class holds it
                // without wasting most of it; otherwise fill buffers of the
                // class below (65 KiB goes as 64 KiB + 2 KiB, not in a
                // 1 MiB buffer: the large classes are few, and a buffer's
                // whole capacity counts against the window).
                let fit = self.class_for(want);
                if fit >= 4 * want {
                    if let Some(&below) = self.shared.classes.iter().rev().find(|&&s| s < want) {
                        want = below;
                    }
                }
                let credit = core.table.credit_left(c);
                if credit < self.class_for(want) {
                    // Use what credit there is, in a smaller buffer.
                    match self.shared.classes.iter().rev().find(|&&s| s <= credit) {
                        Some(&s) if s > 0 => want = want.min(s),
                        _ => return park(core, &mut peer_used, Try::Wait),
                    }
                }
                // The best buffer; a smaller one if that class is exhausted.
                let mut len = want;
                let mut buf = None;
                while buf.is_none() {
                    // A spare (emptied by a read, or kept by
                    // `poll_write_ready`) once the classes tried come down
                    // to its size.
                    if let Some(b) = core.take_spare(len) {
                        buf = Some(b);
                        break;
                    }
                    match core.stack.try_alloc(len) {
                        Ok(b) => {
                            buf = Some(b);
                            break;
                        }
                        Err(Error::WouldBlock) => {
                            let cap = self.class_for(len);
                            match self.shared.classes.iter().rev().find(|&&s| s < cap) {
                                Some(&s) => len = s,
                                None => break,
                            }
                        }
                        Err(e) => return Try::Done(Err(stack_err(e))),
                    }
                }
                if buf.is_none() {
                    // Every class from the wanted one down is empty:
                    // readers that do not read may hold them for good. A
                    // larger buffer, as credit allows, rather than a wait
                    // on them (a small class must not be a way for one
                    // stalled service to stop every other's writes).
                    let credit = core.table.credit_left(c);
                    let above = self.class_for(want);
                    for &s in self.shared.classes.iter() {
                        if s <= above || s > credit {
                            continue;
                        }
                        match core.stack.try_alloc(s) {
                            Ok(b) => {
                                // Fill it: one scarce large buffer, not
                                // one per small piece.
                                buf = Some(b);
                                len = (total - written).min(s);
                                break;
                            }
                            Err(Error::WouldBlock) => {}
                            Err(e) => return Try::Done(Err(stack_err(e))),
                        }
                    }
                }
                let Some(mut buf) = buf else {
                    return park(core, &mut peer_used, Try::Retry);
                };
                let cap = buf.capacity();
                if core.table.take_credit(c, cap).is_err() {
                    return park(core, &mut peer_used, Try::Wait);
                }
                // Gather `len` bytes from the slices.
                buf.set_len(len);
                let mut k = 0;
                while k < len {
                    let s = &bufs[cursor.0][cursor.1..];
                    let n = s.len().min(len - k);
                    buf[k..k + n].copy_from_slice(&s[..n]);
                    k += n;
                    cursor.1 += n;
                    if cursor.1 == bufs[cursor.0].len() {
                        cursor = (cursor.0 + 1, 0);
                    }
                }
                let me = core.me();
                if peer == me {
                    core.table.on_data(me, ConnId(to), buf.freeze());
                    written += len;
                    continue;
                }
                if hold {
                    // A write batch: sent when it ends (nothing to ring now).
                    core.held.push((peer, kind::STREAM | flag, to, buf));
                    written += len;
                    peer_used = None;
                    if core.held.len() >= HELD_MAX {
                        core.release_held();
                    }
                    continue;
                }
                match core
                    .stack
                    .push_buf(peer, kind::STREAM | flag, to, buf, false)
                {
                    Ok(None) => written += len,
                    Ok(Some(back)) => {
                        // Ring full: undo, wait for room.
                        drop(back);
                        core.table.return_credit(c, cap);
                        rewind(&mut cursor, bufs, len);
                        core.stack.wake_peer(peer);
                        return if written > 0 && nonblocking {
                            Try::Done(Ok(written))
                        } else {
                            Try::Retry
                        };
                    }
                    Err((e, _)) => {
                        core.refused_peers.push(peer);
                        return Try::Done(Err(stack_err(e)));
                    }
                }
            }
            if let Some(p) = peer_used.take() {
                core.stack.wake_peer(p);
            }
            core.run_actions(wake);
            Try::Done(Ok(written))
        });
        if let Some(p) = peer_used {
            // Ended early (an error, or non-blocking): the peer may sleep.
            self.update(|g| g.stack.wake_peer(p));
        }
        match r {
            Err(e) if written > 0 && e.kind() != io::ErrorKind::WouldBlock => {
                tracing::debug!(error = %e, written, "write ended early");
                // The caller hears of the partial write now and of a reset
                // at its next call (as a socket keeps its pending error).
                self.update(|g| g.table.unreport_reset(c));
                Ok(written)
            }
            Err(e) if written > 0 && e.kind() == io::ErrorKind::WouldBlock => Ok(written),
            r => r,
        }
    }
}

/// Before a write waits (for credit, room or a buffer): rings the peer its
/// buffers went to without a doorbell, or a reader asleep would never take
/// them, and the credit the write waits for would never come.
fn park<R>(core: &mut Core, peer: &mut Option<PeerId>, t: Try<R>) -> Try<R> {
    if let Some(p) = peer.take() {
        core.stack.wake_peer(p);
    }
    t
}

/// Moves a gather cursor back by `n` bytes.
fn rewind(cursor: &mut (usize, usize), bufs: &[IoSlice<'_>], mut n: usize) {
    while n > 0 {
        if cursor.1 == 0 {
            cursor.0 -= 1;
            cursor.1 = bufs[cursor.0].len();
        }
        let k = n.min(cursor.1);
        cursor.1 -= k;
        n -= k;
    }
}

/// A small deterministic-enough spread for picking ports.
fn fastrand(i: u32) -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut x = t ^ i.wrapping_mul(0x9E37_79B9) ^ std::process::id();
    x ^= x << 13;
    x ^= x >> 17;
    x ^= x << 5;
    x
}

/// A listening socket. Like `std::net::TcpListener`.
///
/// One bound with [`XioListener::bind`] (on the process-wide
/// [`Net::global`]) follows its manager across a restart: once its net
/// finds the manager gone, `accept` binds the same address on a net
/// attached to the new manager (looking again every 200 ms while none
/// runs, and meanwhile still accepting on the old net) and goes on
/// accepting there. So a server that only accepts stays reachable.
/// Connections accepted before keep working on the old net; ones that had
/// arrived but were not yet accepted are reset. A listener made with
/// [`Net::listen`] stays on its net.
///
/// Differences from `TcpListener` on Linux (see also [`XioStream`]'s): a
/// connect beyond the backlog is refused rather than left to retry (see
/// [`Net::listen_with_backlog`]); any address can be bound, not only
/// this host's (X-IO addresses are names, not routes: where std says
/// `AddrNotAvailable`, the bind succeeds and connects naming the address
/// reach it, unless the net has [`NetBuilder::strict_addresses`]); the
/// TTL is kept and reported only; no file descriptor (an event loop uses
/// [`Net::poll`]).
pub struct XioListener {
    /// Shared by [`XioListener::try_clone`]s; the address is unbound when
    /// the last one goes.
    inner: Arc<ListenerInner>,
}

struct ListenerInner {
    /// The net it listens on (another one after following a restart).
    net: Mutex<Net>,
    addr: SocketAddr,
    nonblocking: AtomicBool,
    /// `IP_TTL` as set, which accepted streams start with (as Linux's
    /// accepted sockets inherit the listener's).
    ttl: Ttl,
    /// For a listener on the process-wide net: when it may next try to
    /// bind on a restarted manager.
    follow: Option<Mutex<Instant>>,
}

/// How long a connect waiting for its SYN's answer waits for the manager
/// to say whether the address still belongs to the peer asked.
const ROUTE_CHECK_WAIT: Duration = Duration::from_millis(100);

/// How long a listener following its manager waits between attempts to
/// bind on a restarted one (a failed attempt is one `connect` to a socket
/// path that is not there).
const FOLLOW_RETRY: Duration = Duration::from_millis(200);

/// The process-wide net ([`Net::global`]); per process, as [`LIVE`].
static GLOBAL: crate::fork::PerProcess<Mutex<Option<(crate::fork::Birth, Net)>>> =
    crate::fork::PerProcess::new(|| Mutex::new(None));

impl std::fmt::Debug for XioListener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XioListener")
            .field("addr", &self.inner.addr)
            .finish()
    }
}

impl XioListener {
    /// Binds `addr` on the process-wide [`Net::global`]. The listener
    /// follows the pool's manager across restarts (see [`XioListener`]).
    pub fn bind(addr: impl ToSocketAddrs) -> io::Result<XioListener> {
        let mut l = Net::with_global(|n| n.listen(&addr))?;
        Arc::get_mut(&mut l.inner).expect("not shared yet").follow =
            Some(Mutex::new(Instant::now()));
        Ok(l)
    }

    /// The address this listener is bound to.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.inner.addr)
    }

    /// The net this listener accepts on (for one made by
    /// [`XioListener::bind`], a new one after it followed a restarted
    /// manager).
    pub fn net(&self) -> Net {
        self.inner
            .net
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Waits for a connection (or `WouldBlock` in non-blocking mode).
    pub fn accept(&self) -> io::Result<(XioStream, SocketAddr)> {
        let nb = self.inner.nonblocking.load(AtomicOrdering::Relaxed);
        let addr = self.inner.addr;
        loop {
            let net = self.net();
            // A listener that follows its manager and finds it gone binds
            // on a restarted one, or (none runs yet) waits on the old net
            // at most until the next attempt.
            let (gone, deadline) = match &self.inner.follow {
                Some(next) if net.manager_gone() => {
                    if self.try_follow(&net, next) {
                        continue;
                    }
                    (true, Some(*next.lock().unwrap_or_else(|e| e.into_inner())))
                }
                _ => (false, None),
            };
            let follows = self.inner.follow.is_some();
            // The peer's address under the same lock (one lock less per
            // connection on the accepting side).
            let r = net.block(Key::Accept(addr), nb, deadline, |core, wake| {
                if follows && !gone && core.stack.manager_gone() {
                    return Try::Done(Ok(None)); // went away while we waited
                }
                match core.accept_on(addr, wake) {
                    Ok(accepted) => Try::Done(Ok(Some(accepted))),
                    Err(ConnError::WouldBlock) => Try::Wait,
                    Err(e) => Try::Done(Err(e.into())),
                }
            });
            match r {
                Ok(Some((c, peer))) => return Ok((XioStream::accepted(net, c, &self.inner), peer)),
                Ok(None) => continue,
                Err(e) if gone && e.kind() == io::ErrorKind::TimedOut => continue,
                // Another thread (a clone) followed the restart meanwhile
                // and unlistened the old net: accept on the new one.
                Err(e)
                    if follows
                        && e.kind() == io::ErrorKind::NotConnected
                        && self.net().id() != net.id() =>
                {
                    continue
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Whether this listener follows its manager across a restart (one
    /// from [`XioListener::bind`]; see [`XioListener::follow`]).
    pub fn follows(&self) -> bool {
        self.inner.follow.is_some()
    }

    /// For a listener that follows its manager (one from
    /// [`XioListener::bind`]) whose manager is gone: binds the address on
    /// a net attached to a running one if an attempt is due, and says
    /// whether the listener now accepts on a new net (`Ok`), or when to try
    /// again (`Err`: no manager runs yet). `None` otherwise. `accept` does
    /// this itself; an async adapter calls it before `poll_accept` and
    /// wakes its task at the time given (the core has no timers).
    pub fn follow(&self) -> Option<Result<(), Instant>> {
        let next = self.inner.follow.as_ref()?;
        let net = self.net();
        if !net.manager_gone() {
            return None;
        }
        if self.try_follow(&net, next) {
            Some(Ok(()))
        } else {
            Some(Err(*next.lock().unwrap_or_else(|e| e.into_inner())))
        }
    }

    /// Binds this listener's address on a net attached to a running
    /// manager, if the time for an attempt has come. Returns whether the
    /// listener now accepts there.
    fn try_follow(&self, old: &Net, next: &Mutex<Instant>) -> bool {
        let mut next = next.lock().unwrap_or_else(|e| e.into_inner());
        if self.net().id() != old.id() {
            return true; // another thread followed already
        }
        if Instant::now() < *next {
            return false;
        }
        *next = Instant::now() + FOLLOW_RETRY;
        // `global` attaches afresh once a manager runs again; until then
        // it returns the old net.
        let fresh = match Net::global() {
            Ok(n) if n.id() != old.id() => n,
            Ok(_) => {
                tracing::debug!(addr = %self.inner.addr, "manager gone, none runs yet");
                return false;
            }
            Err(e) => {
                tracing::debug!(addr = %self.inner.addr, error = %e, "manager gone, none runs yet");
                return false;
            }
        };
        match fresh.listen(self.inner.addr) {
            Ok(l) => {
                // Swap nets: dropping `l` then unlistens on the old one
                // (resetting what was not accepted there).
                std::mem::swap(
                    &mut *self.inner.net.lock().unwrap_or_else(|e| e.into_inner()),
                    &mut *l.inner.net.lock().unwrap_or_else(|e| e.into_inner()),
                );
                drop(l);
                tracing::info!(addr = %self.inner.addr, "listening again, on the restarted manager");
                true
            }
            Err(e) => {
                tracing::warn!(addr = %self.inner.addr, error = %e, "could not bind again on the restarted manager; trying again");
                false
            }
        }
    }

    /// An endless iterator of accepted streams.
    pub fn incoming(&self) -> Incoming<'_> {
        Incoming { listener: self }
    }

    /// Always `None`: errors are reported by the calls they concern.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        Ok(None)
    }

    /// Another handle on the same listener, as `TcpListener::try_clone`:
    /// either may accept, non-blocking mode is shared, and the address
    /// stays bound until both are dropped.
    pub fn try_clone(&self) -> io::Result<XioListener> {
        Ok(XioListener {
            inner: self.inner.clone(),
        })
    }

    /// Sets `IP_TTL` (1 to 255), which streams accepted from now on start
    /// with, as a TCP listener's accepted sockets do; nothing routes these
    /// bytes, so it changes nothing else.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.inner.ttl.set(ttl)
    }

    /// `IP_TTL` as set (Linux's default of 64 until then).
    pub fn ttl(&self) -> io::Result<u32> {
        Ok(self.inner.ttl.get())
    }

    /// Non-blocking `accept`.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.inner
            .nonblocking
            .store(nonblocking, AtomicOrdering::Relaxed);
        Ok(())
    }
}

/// The iterator [`XioListener::incoming`] returns, as
/// `std::net::Incoming`: `accept` forever.
#[derive(Debug)]
pub struct Incoming<'a> {
    listener: &'a XioListener,
}

impl Iterator for Incoming<'_> {
    type Item = io::Result<XioStream>;
    fn next(&mut self) -> Option<io::Result<XioStream>> {
        Some(self.listener.accept().map(|(s, _)| s))
    }
}

/// Longest sleep of a thread waiting for the manager's answer outside the
/// net (see `Net::wait_answer`) before it looks whether another thread
/// read it.
const ASK_SLICE: Duration = Duration::from_millis(1);

/// The manager's answer to a bind or unbind as a result.
fn kept_ok(k: Kept) -> Result<(), Error> {
    match k {
        Kept::Reply(Ok((crate::proto::Msg::Ok, _))) => Ok(()),
        Kept::Reply(Ok((crate::proto::Msg::Error { code, message }, _))) => {
            Err(Error::Refused { code, message })
        }
        Kept::Reply(Err(e)) => Err(e),
        other => Err(Error::Protocol(format!("unexpected reply {other:?}"))),
    }
}

/// A request sent to the manager whose answer is awaited outside the net
/// (see [`Net::wait_answer`]).
struct Asked {
    n: u64,
    /// The control socket, duplicated, to wait on.
    fd: std::os::fd::OwnedFd,
    timeout: Duration,
    /// When the control timeout ends for it.
    limit: Option<Instant>,
    what: crate::proto::Msg,
}

/// Whether `ip`, the target of a peer's SYN that found only a wildcard
/// listener, is one of this node's ([`crate::addr::is_this_node`]), with
/// the interface addresses found before kept in `known`: a service bound
/// to `0.0.0.0` and reached at an interface's address would otherwise
/// take the process-wide listing's lock at every connection (and list
/// the interfaces again when it is old). (An address removed from its
/// interface since stays known: it was this node's when a peer was sent
/// to it.)
fn this_node(known: &mut Vec<std::net::IpAddr>, ip: std::net::IpAddr) -> bool {
    let ip = ip.to_canonical();
    if ip.is_loopback() || ip.is_unspecified() || known.contains(&ip) {
        return true;
    }
    let ours = crate::addr::is_this_node(ip);
    if ours {
        known.push(ip);
    }
    ours
}

/// How long a closing listener waits for the manager to confirm its
/// unbind (it answers in microseconds when it runs).
const UNBIND_WAIT: Duration = Duration::from_millis(100);

impl Drop for ListenerInner {
    fn drop(&mut self) {
        if self
            .net
            .get_mut()
            .unwrap_or_else(|e| e.into_inner())
            .inherited()
        {
            return; // the parent's listener: nothing of it to undo here
        }
        let addr = self.addr;
        let net = self.net.get_mut().unwrap_or_else(|e| e.into_inner());
        // Waiters still registered for the address (an async accept
        // cancelled while it waited leaves its task's waker; a thread of a
        // listener that followed a restart may wait on this old net): woken
        // after the lock is released, so the wakers leave the net instead
        // of holding their tasks for its lifetime, and a thread looks again.
        let mut waiting = Vec::new();
        // The table and the request in one step (see `Net::listen_one`).
        let asked = net.update(|g| {
            g.table.unlisten(addr);
            // As for a closed stream (see `Core::forget_ready`): no accept
            // event of a closed listener.
            if let Some(i) = g.ready.iter().position(|e| *e == Event::Accept(addr)) {
                g.forget_ready_at(i);
            }
            g.wake_key(Key::Accept(addr), &mut waiting);
            let asked = g.ask(&crate::proto::Msg::Unbind { addr });
            // Not sent: the control socket is full (or holds messages
            // that go first). Queued, not dropped: else the manager kept
            // the address bound to this process for good.
            if let Err(Error::ManagerUnresponsive(_)) = asked {
                g.stack.unbind_later(addr);
            }
            asked
        });
        wake_all(&mut waiting);
        // Not the whole control timeout: a drop should not wait long. A
        // later answer is settled when it comes.
        let unbound = asked.and_then(|a| {
            net.wait_answer(a, Instant::now().checked_add(UNBIND_WAIT))
                .and_then(kept_ok)
        });
        if let Err(e) = unbound {
            tracing::debug!(addr = %addr, error = %e, "unbind failed");
        }
    }
}

struct StreamInner {
    net: Net,
    id: ConnId,
    /// See [`ReadSignal`].
    sig: Arc<ReadSignal>,
    nonblocking: AtomicBool,
    /// Nanoseconds; 0 is none.
    read_timeout: AtomicU64,
    write_timeout: AtomicU64,
    /// What `set_nodelay` was given (nothing is ever delayed either way).
    nodelay: AtomicBool,
    /// `SO_LINGER` in nanoseconds, [`NO_LINGER`] for none.
    linger: AtomicU64,
    /// `IP_TTL` as set.
    ttl: Ttl,
}

/// [`StreamInner::linger`] when none is set.
const NO_LINGER: u64 = u64::MAX;
/// Linux's `IP_TTL` until one is set (`net.ipv4.ip_default_ttl`).
const DEFAULT_TTL: u32 = 64;

/// `IP_TTL` as a stream or listener keeps it: set and reported, as a
/// socket's, though nothing routes these bytes.
struct Ttl(AtomicU32);

impl Ttl {
    fn new(ttl: u32) -> Self {
        Ttl(AtomicU32::new(ttl))
    }

    /// Takes what Linux takes: 1 to 255 (0 and more are `EINVAL`).
    fn set(&self, ttl: u32) -> io::Result<()> {
        if !(1..=255).contains(&ttl) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("a TTL is 1 to 255, not {ttl}"),
            ));
        }
        self.0.store(ttl, AtomicOrdering::Relaxed);
        Ok(())
    }

    fn get(&self) -> u32 {
        self.0.load(AtomicOrdering::Relaxed)
    }
}

impl Drop for StreamInner {
    fn drop(&mut self) {
        if self.net.inherited() {
            return; // the parent's stream: nothing of it to undo here
        }
        let c = self.id;
        // Wakers still registered for the stream (a read's, say) are
        // dropped after the lock is released: nothing will wake them.
        let mut orphans = Vec::new();
        let mut wake = Vec::new();
        let queued_for = self.net.update(|g| {
            let peer = g.table.peer_of(c);
            // Bytes the peer sent that are still in the rings were
            // received, as a socket's kernel has them: take them in first,
            // so that leaving them unread resets the peer (as TCP's close
            // does) instead of a FIN telling it all it sent was read.
            // (Not needed once the peer's FIN is in: all it sent is here.)
            if peer.is_some_and(|p| p != g.me()) && !g.driving && !g.table.input_ended(c) {
                for _ in 0..DROP_DRAIN_MAX {
                    if !g.stack.has_input() || g.drain(&mut wake).is_err() {
                        break;
                    }
                }
            }
            if self.linger.load(AtomicOrdering::Relaxed) == 0 {
                g.table.abort(c);
            } else {
                g.table.close(c);
            }
            if let Some(t) = g.user_tokens.get_mut(c.index()) {
                *t = None;
            }
            // A write's retry is no event of a closed stream (it would
            // come under the id, the program's token forgotten).
            g.retry_writes.retain(|&(r, _)| r != c);
            if let Some(slot) = g.signals.get_mut(c.index()) {
                if slot.as_ref().is_some_and(|s| Arc::ptr_eq(s, &self.sig)) {
                    *slot = None;
                }
            }
            for key in [Key::Read(c), Key::Write(c), Key::Connect(c)] {
                if let Some(Waiters { list: mut ws, .. }) = g.waiters.remove(&key) {
                    // A blocked thread holds the stream: none is here.
                    debug_assert!(ws.iter().all(Waiter::is_task));
                    orphans.append(&mut ws);
                    g.recycle(ws);
                }
            }
            // The FIN (or RST) goes now, or waits behind a full ring.
            g.run_actions(&mut wake);
            // Readiness not yet returned by `poll` (the drain above may
            // have just noted some) is no event of a closed stream, as
            // `epoll_wait` reports none for a closed fd: its token may
            // name what the program freed with the stream.
            g.forget_ready(c);
            peer.filter(|&p| g.pending_for(p))
        });
        wake_all(&mut wake);
        drop(orphans);
        if let Some(peer) = queued_for {
            // Queued behind a full ring, it would leave at this process's
            // next X-IO call, which may never come (a client that
            // connects, writes, closes and then waits on other things):
            // its peer would wait for the end of stream for good. A
            // socket's FIN leaves with the kernel; give the peer a moment
            // to make room. Bounded: one that does not drain keeps it
            // queued, as before.
            let wait = match self.linger.load(AtomicOrdering::Relaxed) {
                NO_LINGER => DROP_FLUSH_WAIT,
                n => Duration::from_nanos(n).max(DROP_FLUSH_WAIT),
            };
            let deadline = Instant::now()
                .checked_add(wait)
                .unwrap_or_else(Instant::now);
            while self.net.update(|g| {
                g.flush_pending();
                g.pending_for(peer)
            }) && Instant::now() < deadline
            {
                std::thread::yield_now();
            }
        }
    }
}

/// How long dropping a stream waits for ring space for its FIN.
const DROP_FLUSH_WAIT: Duration = Duration::from_micros(500);
/// Most drains a dropped stream makes to take in what its peer sent.
const DROP_DRAIN_MAX: usize = 64;

/// A connected stream. Like `std::net::TcpStream`: `Read`, `Write`
/// (also on `&XioStream`), shutdown, timeouts, non-blocking mode; plus
/// zero-copy [`XioStream::recv_buf`] and [`XioStream::send_buf`].
/// Dropping the last handle closes it (a FIN, or a RST if received data
/// was left unread).
///
/// # Differences from `TcpStream` on Linux
/// Ported code sees the same data, error kinds and byte counts (but for
/// how much a write takes before a full window stops it, which buffer
/// sizes decide on both) — the `std_parity` test suite runs the same
/// scenarios against both — except:
/// - `local_addr` of a connecting stream is an address made from the
///   process's stack id, not the listener's IP (X-IO clients do not bind);
///   IPv4-mapped to connect to an IPv6 address. An IPv4 client of a
///   listener on `[::]` is accepted with IPv4 addresses (Linux's
///   dual-stack socket maps them into IPv6).
/// - A connect over a route the net knows returns before the listener
///   answers: a refusal is the first read's or write's (see
///   [`Net::connect`]).
/// - `shutdown(Read)` discards what is queued and what still arrives, as
///   on the BSDs (see [`XioStream::shutdown`]).
/// - A read into an empty buffer returns `Ok(0)` without waiting (Linux's
///   waits for data or the timeout, or in non-blocking mode says
///   `WouldBlock`).
/// - Timeouts read back exactly as set (a socket's are rounded to the
///   kernel's clock tick).
/// - `set_nodelay`, `set_ttl` and `set_linger` are kept and reported as
///   a socket reports them, but only a zero linger changes anything (a
///   close with a reset): no write is ever delayed, and nothing routes
///   these bytes.
/// - No file descriptor (`AsRawFd`): an event loop uses [`Net::poll`] or
///   [`Net::poll_fd`].
#[derive(Clone)]
pub struct XioStream {
    inner: Arc<StreamInner>,
}

impl std::fmt::Debug for XioStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XioStream")
            .field("conn", &self.inner.id)
            .finish()
    }
}

/// An [`XioStream`] that does not keep the connection open (see
/// [`XioStream::downgrade`]): for an adapter's helper that must not
/// outlive the stream's last handle.
#[derive(Clone, Debug)]
pub struct WeakXioStream(std::sync::Weak<StreamInner>);

impl WeakXioStream {
    /// The stream, while some handle still keeps it open.
    pub fn upgrade(&self) -> Option<XioStream> {
        self.0.upgrade().map(|inner| XioStream { inner })
    }
}

/// A connect that found no manager to resolve its address (none ran, or
/// it went away and none runs again): refused, as a TCP connect to a port
/// nobody listens on (the stack's error, which says what happened, stays
/// its source).
fn no_manager_refuses(e: io::Error) -> io::Error {
    let no_manager = e
        .get_ref()
        .and_then(|i| i.downcast_ref::<Error>())
        .is_some_and(|s| matches!(s, Error::NoManager { .. } | Error::ManagerGone));
    if !no_manager {
        return e;
    }
    match e.into_inner() {
        Some(inner) => io::Error::new(io::ErrorKind::ConnectionRefused, inner),
        None => io::ErrorKind::ConnectionRefused.into(),
    }
}

/// The error inside the `WouldBlock` that a stream's read or write timeout
/// gives, as `std::net::TcpStream` on Linux does (a timed-out call fails
/// with `EAGAIN` there, and ported code checks for `WouldBlock`). It tells
/// a timeout from non-blocking mode's `WouldBlock`:
/// `e.get_ref().is_some_and(|i| i.is::<TimeoutElapsed>())`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("timed out (the stream's read or write timeout)")]
pub struct TimeoutElapsed;

/// A stream operation bounded by the stream's own timeout: its `TimedOut`
/// becomes `WouldBlock` ([`TimeoutElapsed`]).
fn stream_timeout<T>(r: io::Result<T>) -> io::Result<T> {
    r.map_err(|e| {
        if e.kind() == io::ErrorKind::TimedOut {
            io::Error::new(io::ErrorKind::WouldBlock, TimeoutElapsed)
        } else {
            e
        }
    })
}

fn timeout_of(a: &AtomicU64) -> Option<Instant> {
    match a.load(AtomicOrdering::Relaxed) {
        0 => None,
        n => Some(Instant::now() + Duration::from_nanos(n)),
    }
}

fn store_timeout(a: &AtomicU64, t: Option<Duration>) -> io::Result<()> {
    match t {
        Some(d) if d.is_zero() => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "cannot set a 0 duration timeout",
        )),
        Some(d) => {
            a.store(
                d.as_nanos().clamp(1, u64::MAX as u128) as u64,
                AtomicOrdering::Relaxed,
            );
            Ok(())
        }
        None => {
            a.store(0, AtomicOrdering::Relaxed);
            Ok(())
        }
    }
}

impl XioStream {
    fn new(net: Net, id: ConnId) -> Self {
        Self {
            inner: Arc::new(StreamInner {
                net,
                id,
                sig: Arc::default(),
                nonblocking: AtomicBool::new(false),
                read_timeout: AtomicU64::new(0),
                write_timeout: AtomicU64::new(0),
                nodelay: AtomicBool::new(false),
                linger: AtomicU64::new(NO_LINGER),
                ttl: Ttl::new(DEFAULT_TTL),
            }),
        }
    }

    /// A stream accepted on `l`, with the options it inherits.
    fn accepted(net: Net, id: ConnId, l: &ListenerInner) -> Self {
        let s = Self::new(net, id);
        s.inner.ttl.0.store(l.ttl.get(), AtomicOrdering::Relaxed);
        s
    }

    /// Connects to `addr` on the process-wide [`Net::global`]. With no
    /// manager running, as with nobody listening: `ConnectionRefused`
    /// (code that waits for its server to come up retries on it), whose
    /// message says how to start one. Otherwise as [`Net::connect`].
    pub fn connect(addr: impl ToSocketAddrs) -> io::Result<XioStream> {
        Net::with_global(|n| n.connect(&addr)).map_err(no_manager_refuses)
    }

    /// Connects on [`Net::global`], waiting at most `timeout`.
    pub fn connect_timeout(addr: &SocketAddr, timeout: Duration) -> io::Result<XioStream> {
        Net::with_global(|n| n.connect_timeout(addr, timeout)).map_err(no_manager_refuses)
    }

    /// The token [`Net::poll`] reports this stream's readiness under: one
    /// X-IO chose, unique among the net's open streams, until
    /// [`XioStream::set_token`] chooses another.
    pub fn token(&self) -> u64 {
        self.inner.net.lock().token_of(self.inner.id)
    }

    /// Chooses the token [`Net::poll`] reports this stream's readiness
    /// under, as `epoll_ctl`'s data or mio's `Token` do: an event loop can
    /// then index its own table with it (a slab index, say) instead of
    /// looking X-IO's tokens up. Events not yet returned by `poll` carry
    /// the new token too. Keeping tokens unique is the caller's business.
    pub fn set_token(&self, token: u64) {
        let c = self.inner.id;
        self.inner.net.update(|g| {
            let i = c.index();
            if g.user_tokens.len() <= i {
                g.user_tokens.resize(i + 1, None);
            }
            g.user_tokens[i] = Some((c.0, token));
            if let Some(i) = g.ready_index(c) {
                if let Event::Stream { token: t, .. } = &mut g.ready[i] {
                    *t = token;
                }
            }
        });
    }

    /// The net this stream belongs to.
    pub fn net(&self) -> &Net {
        &self.inner.net
    }

    /// This end's address (for a connecting stream, a per-connection
    /// address made from the process's stack id: X-IO clients do not bind).
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        let g = self.inner.net.lock();
        g.table
            .addrs(self.inner.id)
            .map(|a| a.0)
            .map_err(io::Error::from)
    }

    /// The other end's address; `NotConnected` once the connection was
    /// reset (or refused), as `TcpStream::peer_addr` on Linux.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        let g = self.inner.net.lock();
        g.table.peer_addr(self.inner.id).map_err(io::Error::from)
    }

    /// Another handle to the same stream (the stream closes when the last
    /// one is dropped).
    pub fn try_clone(&self) -> io::Result<XioStream> {
        Ok(self.clone())
    }

    /// A handle that does not keep the connection open.
    pub fn downgrade(&self) -> WeakXioStream {
        WeakXioStream(Arc::downgrade(&self.inner))
    }

    /// Non-blocking mode: reads and writes return `WouldBlock` instead of
    /// waiting.
    pub fn set_nonblocking(&self, nonblocking: bool) -> io::Result<()> {
        self.inner
            .nonblocking
            .store(nonblocking, AtomicOrdering::Relaxed);
        Ok(())
    }

    /// Read timeout; `None` waits forever. A read that waits longer fails
    /// with `WouldBlock`, as a `TcpStream`'s does on Linux (its source is
    /// [`TimeoutElapsed`]).
    pub fn set_read_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        store_timeout(&self.inner.read_timeout, t)
    }

    /// Write timeout (for waits on credit, ring space or buffers); as the
    /// read timeout, it ends a wait with `WouldBlock` ([`TimeoutElapsed`]).
    pub fn set_write_timeout(&self, t: Option<Duration>) -> io::Result<()> {
        store_timeout(&self.inner.write_timeout, t)
    }

    /// The read timeout.
    pub fn read_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(
            match self.inner.read_timeout.load(AtomicOrdering::Relaxed) {
                0 => None,
                n => Some(Duration::from_nanos(n)),
            },
        )
    }

    /// The write timeout.
    pub fn write_timeout(&self) -> io::Result<Option<Duration>> {
        Ok(
            match self.inner.write_timeout.load(AtomicOrdering::Relaxed) {
                0 => None,
                n => Some(Duration::from_nanos(n)),
            },
        )
    }

    /// Sets `TCP_NODELAY` as a TCP socket takes it, for [`XioStream::nodelay`]
    /// to report. Both values behave the same: X-IO has no Nagle
    /// algorithm, and every write leaves at once, as with `TCP_NODELAY` on.
    pub fn set_nodelay(&self, nodelay: bool) -> io::Result<()> {
        self.inner.nodelay.store(nodelay, AtomicOrdering::Relaxed);
        Ok(())
    }

    /// What [`XioStream::set_nodelay`] was given last (false on a new
    /// stream, as on a TCP socket).
    pub fn nodelay(&self) -> io::Result<bool> {
        Ok(self.inner.nodelay.load(AtomicOrdering::Relaxed))
    }

    /// Sets `SO_LINGER`, as a TCP socket takes it. A zero duration closes
    /// with a reset when the last handle is dropped (an abortive close:
    /// the peer's reads see `ConnectionReset` instead of end of stream,
    /// and what it had not read is dropped). Another duration lets the
    /// drop wait up to that long for what still waits behind a full ring
    /// to the peer (as a lingering close waits for unsent data); without
    /// one it waits a moment only. Written bytes are in the peer's memory
    /// already: there is no unacknowledged data to wait for.
    pub fn set_linger(&self, linger: Option<Duration>) -> io::Result<()> {
        let v = linger.map_or(NO_LINGER, |d| {
            u64::try_from(d.as_nanos()).unwrap_or(NO_LINGER - 1)
        });
        self.inner.linger.store(v, AtomicOrdering::Relaxed);
        Ok(())
    }

    /// `SO_LINGER` as set ([`XioStream::set_linger`]; `None` on a new
    /// stream).
    pub fn linger(&self) -> io::Result<Option<Duration>> {
        Ok(match self.inner.linger.load(AtomicOrdering::Relaxed) {
            NO_LINGER => None,
            n => Some(Duration::from_nanos(n)),
        })
    }

    /// Sets `IP_TTL` (1 to 255, as Linux takes it), for
    /// [`XioStream::ttl`] to report: nothing routes these bytes, so it
    /// changes nothing else.
    pub fn set_ttl(&self, ttl: u32) -> io::Result<()> {
        self.inner.ttl.set(ttl)
    }

    /// `IP_TTL` as set: Linux's default of 64 on a new stream, or the
    /// listener's on an accepted one.
    pub fn ttl(&self) -> io::Result<u32> {
        Ok(self.inner.ttl.get())
    }

    /// The refusal or reset that ended the stream, if no read or write
    /// reported it yet, once (as `SO_ERROR`, which those calls clear): an
    /// event loop told a non-blocking connect is ready asks it whether the
    /// connect failed. What the net has taken in counts (a `poll`, a read
    /// or write that waited), as a socket's is what its kernel processed.
    pub fn take_error(&self) -> io::Result<Option<io::Error>> {
        let c = self.inner.id;
        Ok(self
            .inner
            .net
            .lock()
            .table
            .take_error(c)
            .map(io::Error::from))
    }

    /// Reads without taking the bytes off the stream (`MSG_PEEK`): the
    /// next read returns them again. Waits as `read` does. A reset is
    /// reported once, as by a read: then peeks and reads see end of
    /// stream (as Linux's, whose peek clears the socket's error).
    pub fn peek(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_op(|core, wake, c| core.peek_step(wake, c, buf, true))
    }

    /// Shuts down reading, writing or both. Writing: the peer reads end of
    /// stream after the data already written. Reading: reads return end of
    /// stream at once; what was queued and what still arrives is
    /// discarded and credited back, so the peer's writes go on, neither
    /// blocked nor reset, and a later close is a FIN. (As on the BSDs;
    /// Linux's TCP keeps those bytes readable instead.) A reset (or
    /// refused) stream is `NotConnected`, as a TCP socket's `shutdown`
    /// after a RST on Linux.
    pub fn shutdown(&self, how: Shutdown) -> io::Result<()> {
        let c = self.inner.id;
        self.inner.net.update(|g| {
            if matches!(how, Shutdown::Write | Shutdown::Both) {
                g.table.shutdown_write(c)?;
            }
            if matches!(how, Shutdown::Read | Shutdown::Both) {
                g.table.shutdown_read(c)?;
            }
            Ok::<_, ConnError>(())
        })?;
        Ok(())
    }

    /// Whether the stream is in non-blocking mode.
    pub fn is_nonblocking(&self) -> bool {
        self.nb()
    }

    fn nb(&self) -> bool {
        self.inner.nonblocking.load(AtomicOrdering::Relaxed)
    }

    fn read_on(&self, out: &mut [u8]) -> io::Result<usize> {
        self.read_uninit(crate::conn::as_uninit(out))
    }

    /// [`Read::read`] into memory that may be uninitialised (a `BytesMut`'s
    /// or a `Vec`'s spare capacity, which need not be zeroed first): waits
    /// as `read` does (or says `WouldBlock` when non-blocking), then
    /// writes the first `n` bytes of `out` and returns `n`. It never reads
    /// `out` and leaves the rest as it was.
    pub fn read_uninit(&self, out: &mut [std::mem::MaybeUninit<u8>]) -> io::Result<usize> {
        self.read_op(|core, wake, c| core.read_step(wake, c, out))
    }

    /// `readv`: waits as `read` does until a byte is there, then fills
    /// `outs` in order with as much as has arrived.
    fn read_vectored_on(&self, outs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.read_op(|core, wake, c| core.read_vectored_step(wake, c, outs))
    }

    /// Receives the next chunk as the pool buffer itself, without copying
    /// (FABLE's getreadbuf): `Ok(None)` is end of stream. Bytes already
    /// taken by `read` are skipped. Mixes freely with `read`.
    pub fn recv_buf(&self) -> io::Result<Option<Buf>> {
        self.read_op(|core, wake, c| core.chunk_step(wake, c))
    }

    /// A read through the blocking driver (or `WouldBlock` when
    /// non-blocking): waits for the connection, then tries `step`. An event
    /// loop's read that would find nothing returns without the lock (see
    /// [`ReadSignal`]). A timeout is `WouldBlock` ([`TimeoutElapsed`]), as
    /// `std::net::TcpStream`'s on Linux.
    fn read_op<R>(
        &self,
        step: impl FnMut(&mut Core, &mut Vec<Waiter>, ConnId) -> Try<R>,
    ) -> io::Result<R> {
        stream_timeout(self.read_op_until(step))
    }

    fn read_op_until<R>(
        &self,
        mut step: impl FnMut(&mut Core, &mut Vec<Waiter>, ConnId) -> Try<R>,
    ) -> io::Result<R> {
        let c = self.inner.id;
        let deadline = timeout_of(&self.inner.read_timeout);
        let nb = self.nb();
        if !nb {
            self.inner.net.ensure_connected(c, deadline)?;
        } else if self.inner.sig.still_empty() {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let sig = &self.inner.sig;
        self.inner
            .net
            .block(Key::Read(c), nb, deadline, |core, wake| {
                let r = step(core, wake, c);
                if nb {
                    core.note_read(c, sig, &r);
                }
                r
            })
    }

    /// A writable pool buffer of `len` bytes to fill and [`send_buf`]
    /// (waits while the pool is exhausted; `InvalidInput` above the largest
    /// class).
    ///
    /// [`send_buf`]: XioStream::send_buf
    pub fn alloc(&self, len: usize) -> io::Result<BufMut> {
        let deadline = timeout_of(&self.inner.write_timeout);
        if self.nb() {
            let mut g = self.inner.net.lock();
            let r = g.stack.try_alloc(len);
            if let Err(Error::WouldBlock) = r {
                // An empty pool: an event loop hears when to try again.
                g.note_retry_write(self.inner.id);
            }
            return r.map_err(stack_err);
        }
        stream_timeout(self.inner.net.alloc_wait(len, deadline))
    }

    /// Sends a pool buffer as the next bytes of the stream, without copying
    /// (FABLE's commit). An error hands the buffer back when it was not
    /// sent (`WouldBlock` in non-blocking mode, a reset connection,
    /// `InvalidInput` for a buffer of another pool). An empty buffer is
    /// no bytes of the stream: the peer's `recv_buf` never returns it.
    pub fn send_buf(&self, buf: BufMut) -> Result<(), (io::Error, Option<BufMut>)> {
        self.send_buf_with(buf, self.nb())
    }

    fn send_buf_with(
        &self,
        buf: BufMut,
        nonblocking: bool,
    ) -> Result<(), (io::Error, Option<BufMut>)> {
        let c = self.inner.id;
        let deadline = timeout_of(&self.inner.write_timeout);
        let mut slot = Some(buf);
        let mut peer_used = None;
        let r = self
            .inner
            .net
            .block(Key::Write(c), nonblocking, deadline, |core, _| {
                if let Err(e) = core.stack.check_ours(slot.as_ref().expect("until sent")) {
                    return Try::Done(Err(e.into()));
                }
                // After what a write batch holds (it may hold this
                // connection's earlier bytes; queued, the check below
                // keeps the order).
                core.release_held();
                let (peer, to, flag) = match core.table.send_target(c) {
                    Ok(t) => t,
                    Err(e) => return Try::Done(Err(e.into())),
                };
                if core.pending_for(peer) && !core.flush_pending() && core.pending_for(peer) {
                    return Try::Retry;
                }
                let cap = slot.as_ref().expect("until sent").capacity();
                if core.table.take_credit(c, cap).is_err() {
                    return Try::Wait;
                }
                let buf = slot.take().expect("until sent");
                let me = core.me();
                if peer == me {
                    core.table.on_data(me, ConnId(to), buf.freeze());
                    return Try::Done(Ok(()));
                }
                peer_used = Some(peer);
                match core
                    .stack
                    .push_buf(peer, kind::STREAM | flag, to, buf, true)
                {
                    Ok(None) => Try::Done(Ok(())),
                    Ok(Some(back)) => {
                        slot = Some(back);
                        core.table.return_credit(c, cap);
                        Try::Retry
                    }
                    Err((e, back)) => {
                        slot = Some(back);
                        core.table.return_credit(c, cap);
                        core.refused_peers.push(peer);
                        Try::Done(Err(stack_err(e)))
                    }
                }
            });
        self.inner.net.update(|_| ());
        let _ = peer_used;
        stream_timeout(r).map_err(|e| (e, slot))
    }
}

impl Read for XioStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_on(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.read_vectored_on(bufs)
    }
}

impl Read for &XioStream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.read_on(buf)
    }

    fn read_vectored(&mut self, bufs: &mut [IoSliceMut<'_>]) -> io::Result<usize> {
        self.read_vectored_on(bufs)
    }
}

impl Write for &XioStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.write_vectored(&[IoSlice::new(buf)])
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        let deadline = timeout_of(&self.inner.write_timeout);
        stream_timeout(
            self.inner
                .net
                .write_on(self.inner.id, bufs, self.nb(), deadline),
        )
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Write for XioStream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        (&*self).write(buf)
    }

    fn write_vectored(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        (&*self).write_vectored(bufs)
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A driver's look at the rings that takes no lock (see
/// [`Net::watch_begin`]).
pub struct Watcher {
    probe: Box<Probe>,
}

impl std::fmt::Debug for Watcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Watcher").finish_non_exhaustive()
    }
}

impl Watcher {
    /// Whether something waits to be drained (shared loads only).
    pub fn has_input(&mut self) -> bool {
        self.probe.ready_now()
    }
}

/// What [`Net::drive`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Drive {
    /// The doorbell is armed: peers will ring it when they send, so the
    /// caller may wait for it to become readable. When false, something
    /// arrived meanwhile: call `drive` again (after yielding).
    pub armed: bool,
    /// Some task waits on something no peer signals (a full ring, an empty
    /// pool): call [`Net::wake_retriers`] after a short pause (about 50 µs).
    pub retry: bool,
    /// The drain woke tasks. Let them run before deciding how to wait:
    /// what they send decides whether a peer is about to answer (see
    /// [`Net::spin_budget`]).
    pub woke: bool,
    /// The adaptive policy has learned that traffic is sparse: its budget
    /// is a token spin (a few µs at most). Yielding to the runtime to let
    /// woken tasks run first, or between looks of a watch, then buys
    /// nothing, and on a multi-thread runtime each yield also wakes an
    /// idle worker. Watch that briefly without yielding, then sleep.
    pub sparse: bool,
}

/// The adapter interface: readiness through wakers, for runtimes (the
/// tokio adapter) and event loops in other languages (the C ABI). An
/// adapter runs one *driver* per net: it waits for [`Net::doorbell`] to
/// become readable, then calls [`Net::drive`], which drains the rings and
/// wakes every task whose connection became ready (batch wake-up), and
/// arms the doorbell again. The `poll_*` methods of the streams and
/// listeners never wait and never spin: they register the task's waker.
impl Net {
    /// A duplicate of the doorbell eventfd: readable when a peer rang
    /// because this net's doorbell was armed ([`Net::drive`]).
    pub fn doorbell(&self) -> io::Result<std::os::fd::OwnedFd> {
        let mut g = self.lock();
        g.bell_out = true;
        Ok(rustix::io::fcntl_dupfd_cloexec(g.stack.doorbell_fd(), 3)?)
    }

    /// The fd an event loop that calls [`Net::poll_nowait`] sleeps on: an
    /// epoll instance (poll it for readability, never read it) that is
    /// readable when the doorbell rang ([`Net::doorbell`]) or when the
    /// net's retry timer fired: sends of the net's own that wait for a
    /// peer's full ring are then retried by the next `poll_nowait`, and
    /// non-blocking writes that met a full ring or an empty pool are
    /// reported writable by it, without the loop spinning while the peer
    /// makes no room. Every call returns a copy of the same instance.
    pub fn poll_fd(&self) -> io::Result<std::os::fd::OwnedFd> {
        use rustix::event::epoll;
        use rustix::time::{timerfd_create, TimerfdClockId, TimerfdFlags};
        let mut g = self.lock();
        if g.loop_fd.is_none() {
            let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
            let timer = timerfd_create(
                TimerfdClockId::Monotonic,
                TimerfdFlags::CLOEXEC | TimerfdFlags::NONBLOCK,
            )?;
            // Level-triggered: readable while the doorbell's count or the
            // timer's expiry is unread (`poll_nowait` clears both).
            epoll::add(
                &ep,
                g.stack.doorbell_fd(),
                epoll::EventData::new_u64(0),
                epoll::EventFlags::IN,
            )?;
            epoll::add(
                &ep,
                &timer,
                epoll::EventData::new_u64(1),
                epoll::EventFlags::IN,
            )?;
            g.loop_fd = Some(ep);
            g.retry_timer = Some(timer);
            g.retry_armed = None;
        }
        g.bell_out = true;
        let ep = g.loop_fd.as_ref().expect("just made");
        Ok(rustix::io::fcntl_dupfd_cloexec(ep, 3)?)
    }

    /// A pollable fd for the manager's side of this net: readable while
    /// the manager has queued control messages or is gone. (An epoll
    /// instance watching the control socket, so nothing can read the
    /// socket through it.) A driver sleeping on [`Net::doorbell`] polls
    /// this one too and, when it is readable, calls [`Net::drive`] with
    /// `liveness`: a dead manager is then noticed at once, where a driver
    /// without it has to look about once a second. Once the net has
    /// found the manager gone ([`Net::manager_gone`]), the fd stops
    /// watching and is never readable again.
    pub fn manager_watch(&self) -> io::Result<std::os::fd::OwnedFd> {
        use rustix::event::epoll;
        let mut g = self.lock();
        if g.manager_watch.is_none() && !g.stack.manager_gone() {
            let ep = epoll::create(epoll::CreateFlags::CLOEXEC)?;
            epoll::add(
                &ep,
                g.stack.ctrl_fd(),
                epoll::EventData::new_u64(0),
                epoll::EventFlags::IN | epoll::EventFlags::RDHUP,
            )?;
            g.manager_watch = Some(ep);
        }
        match &g.manager_watch {
            // Every copy is the same epoll instance: `drain` empties it.
            Some(w) => Ok(rustix::io::fcntl_dupfd_cloexec(w, 3)?),
            // Gone already: an empty instance, never readable.
            None => Ok(epoll::create(epoll::CreateFlags::CLOEXEC)?),
        }
    }

    /// Drains the rings, wakes the tasks that became ready, and arms the
    /// doorbell. `rung`: the doorbell fd was readable (its ring is
    /// consumed here). With `liveness`, also reads the control socket (call
    /// it about once a second, so a dead manager is noticed).
    pub fn drive(&self, rung: bool, liveness: bool) -> io::Result<Drive> {
        let mut wake = Vec::new();
        let mut g = self.lock();
        if rung {
            g.stack.clear_doorbell();
        }
        if liveness {
            g.force_ctrl = true;
        }
        let mut r = Ok(());
        if !g.driving {
            if let Err(e) = g.drain(&mut wake) {
                r = Err(e);
            }
        }
        #[cfg(test)]
        if std::mem::take(&mut g.fail_drive) {
            r = Err(io::Error::other("a drain failed (injected)"));
        }
        let retry = !g.retry_waiters.is_empty() || g.has_pending();
        // A blocking driver thread watches the rings itself: leave the
        // doorbell to it (it wakes our tasks' wakers as it drains).
        let armed = g.driving || g.stack.arm_doorbell();
        let sparse = g.sparse();
        drop(g);
        let woke = !wake.is_empty();
        wake_all(&mut wake);
        r.map(|()| Drive {
            armed,
            retry,
            woke,
            sparse,
        })
    }

    /// Sends what waits behind full rings (data, and control messages such
    /// as a closed stream's FIN), as far as the rings take it now; true
    /// once nothing waits. For an adapter whose last driver ended (its
    /// runtime shut down): nobody else retries those sends until the net
    /// is used again, and the peers would wait for them meanwhile.
    pub fn flush_queued(&self) -> bool {
        self.lock().flush_pending()
    }

    /// Wakes the tasks waiting on a full ring or an empty pool (see
    /// [`Drive::retry`]), and retries queued control sends.
    pub fn wake_retriers(&self) {
        let mut g = self.lock();
        g.flush_pending();
        let ws = std::mem::take(&mut g.retry_waiters);
        drop(g);
        for w in ws {
            w.wake();
        }
    }

    /// Wakes every task waiting on this net: the registered wakers of
    /// every stream and listener, and the tasks waiting for a retry.
    /// Threads in blocking calls are left asleep. For an adapter whose
    /// driver went away (its runtime shut down): the woken tasks poll
    /// again and find, or start, another driver. Costs the woken tasks a
    /// spurious poll each; nothing is lost. Also rings the doorbell: the
    /// driver that went away may have been watching the rings with the
    /// doorbell switched off, and another reactor asleep on it (a driver
    /// of another runtime) would not hear the peers until it is armed
    /// again.
    pub fn wake_tasks(&self) {
        let mut wake = Vec::new();
        let mut g = self.lock();
        g.take_wakers(&mut wake);
        g.ring_reactor();
        drop(g);
        wake_all(&mut wake);
    }

    /// How long a driver task should keep watching the rings (yielding to
    /// other tasks between looks) before it sleeps on the doorbell: the
    /// adaptive policy's budget, zero unless a peer is awake on another
    /// core. Call [`Net::watch_begin`] first and [`Net::watch_end`] after.
    pub fn spin_budget(&self) -> Duration {
        Duration::from_nanos(self.lock().stack.spin_budget_now())
    }

    /// Whether the rings hold something to drain (a few shared loads).
    pub fn has_input(&self) -> bool {
        self.lock().stack.has_input()
    }

    /// Starts watching the rings instead of the doorbell: peers stop
    /// ringing it (a system call each) while we look, and the returned
    /// [`Watcher`] looks without taking the net's lock.
    pub fn watch_begin(&self) -> Watcher {
        let mut g = self.lock();
        g.stack.disarm_doorbell();
        let reuse = g.probe.take();
        Watcher {
            probe: g.stack.probe(reuse),
        }
    }

    /// Within a watch, when [`Watcher::has_input`] says so: drains the
    /// rings and wakes the tasks that became ready, and keeps watching
    /// (the doorbell stays disarmed, the watcher is brought up to date).
    /// Cheaper than [`Net::watch_end`] + [`Net::drive`] +
    /// [`Net::watch_begin`] per arrival under steady traffic. When the
    /// result says `retry`, end the watch and drive.
    pub fn watch_drain(&self, w: &mut Watcher) -> io::Result<Drive> {
        let mut wake = Vec::new();
        let mut g = self.lock();
        let r = if g.driving {
            Ok(())
        } else {
            g.drain(&mut wake).map(drop)
        };
        g.stack.refresh_probe(&mut w.probe);
        let retry = !g.retry_waiters.is_empty() || g.has_pending();
        let sparse = g.sparse();
        drop(g);
        let woke = !wake.is_empty();
        wake_all(&mut wake);
        r.map(|()| Drive {
            armed: false,
            retry,
            woke,
            sparse,
        })
    }

    /// Within a watch, for an event loop (the C ABI's, the Go package's
    /// dispatcher): drains the rings and appends at most `cap` readiness
    /// events, as [`Net::poll_nowait_capped`] does, but leaves the doorbell
    /// off (peers do not ring it while the loop watches) and brings the
    /// watcher up to date. End the watch with [`Net::watch_end`], then
    /// [`Net::poll_nowait`] (which arms the doorbell) before sleeping on
    /// [`Net::poll_fd`].
    pub fn poll_in_watch(
        &self,
        w: &mut Watcher,
        events: &mut Vec<Event>,
        cap: usize,
    ) -> io::Result<usize> {
        let n = self.poll_capped(events, cap, Some(Duration::ZERO))?;
        self.lock().stack.refresh_probe(&mut w.probe);
        Ok(n)
    }

    /// Ends a watch: `hit` if something arrived within it, after `spun`.
    /// Teaches the adaptive policy; the caller then drives (a hit) or arms
    /// the doorbell again through [`Net::drive`].
    pub fn watch_end(&self, w: Watcher, hit: bool, spun: Duration) {
        let mut g = self.lock();
        let mut probe = w.probe;
        g.stack.end_probe(&mut probe);
        g.probe = Some(probe);
        let now = crate::wait::now_ns();
        if g.data_seen.0 != g.data_drains {
            g.data_seen = (g.data_drains, now);
        }
        let quiet = now.saturating_sub(g.data_seen.1) > IDLE_AFTER_NS;
        let spin = g.stack.spin_mut();
        spin.on_spin_start();
        if hit {
            spin.on_spin_hit();
        } else {
            if quiet {
                // Nothing for longer than any gap worth spinning through:
                // the traffic stopped. Two idle drivers would otherwise keep
                // each other looking awake (worth spinning for) and watch
                // forever.
                spin.on_idle_watch();
            }
            g.missed = Some((spun.as_nanos() as u64, now));
        }
    }

    /// One attempt of an operation for an adapter, with what the table
    /// holds; if it cannot complete, the task's waker is registered
    /// instead of waiting.
    /// With `entry`, the task waits in the entry's own place (see
    /// [`WaitEntry`]), which it leaves when it completes; without, in the
    /// key's slot.
    fn poll_op<R>(
        &self,
        key: Key,
        cx: &Context<'_>,
        mut entry: Option<&mut WaitEntry>,
        mut f: impl FnMut(&mut Core, &mut Vec<Waiter>) -> Try<R>,
    ) -> Poll<io::Result<R>> {
        if let Some(e) = entry.as_deref_mut() {
            e.leave_unless(self);
        }
        let mut wake = Vec::new();
        let mut g = self.lock();
        // No drain here: the adapter's driver drains (it watches the rings
        // or is rung), and it runs under the same lock, so a task either
        // finds what the driver delivered or has its waker registered
        // before the driver looks. Draining from every task that found
        // nothing pulled other connections' messages in piecemeal: hyper
        // at 16 and 256 connections ran ~20% faster without it.
        let attempt = f(&mut g, &mut wake);
        let r = match attempt {
            Try::Done(r) => {
                // Done: out of the list now, under this lock hold, so the
                // entry's drop has nothing left to do.
                if let Some((k, id)) = entry.and_then(|e| e.at.take()) {
                    g.remove_entry(k, id, &mut wake);
                }
                Poll::Ready(r)
            }
            Try::Wait => {
                match entry {
                    Some(e) => g.add_entry(self, key, cx.waker(), e, &mut wake),
                    None => g.add_waker(key, cx.waker(), &mut wake),
                }
                Poll::Pending
            }
            Try::Retry => {
                g.add_retry(cx.waker());
                Poll::Pending
            }
        };
        drop(g);
        wake_all(&mut wake);
        r
    }
}

impl XioListener {
    /// Accepts a connection if one waits, else registers the task
    /// (adapter interface, see [`Net::drive`]): only the task that called
    /// it last is woken, as `tokio::net::TcpListener::poll_accept` has it.
    pub fn poll_accept(&self, cx: &mut Context<'_>) -> Poll<io::Result<(XioStream, SocketAddr)>> {
        self.poll_accept_in(cx, None)
    }

    /// [`XioListener::poll_accept`] for a future that owns `entry`: every
    /// such future waiting is woken when a connection comes (see
    /// [`WaitEntry`]), as tokio's `accept()` futures are.
    pub fn poll_accept_entry(
        &self,
        cx: &mut Context<'_>,
        entry: &mut WaitEntry,
    ) -> Poll<io::Result<(XioStream, SocketAddr)>> {
        self.poll_accept_in(cx, Some(entry))
    }

    fn poll_accept_in(
        &self,
        cx: &mut Context<'_>,
        entry: Option<&mut WaitEntry>,
    ) -> Poll<io::Result<(XioStream, SocketAddr)>> {
        let addr = self.inner.addr;
        let net = self.net();
        // The peer's address under the same lock, as `accept` takes it
        // (see `accept_on`: a connection reset while queued is handed over).
        let (c, peer) = ready!(net.poll_op(Key::Accept(addr), cx, entry, |core, wake| {
            match core.accept_on(addr, wake) {
                Ok(accepted) => Try::Done(Ok(accepted)),
                Err(ConnError::WouldBlock) => Try::Wait,
                Err(e) => Try::Done(Err(e.into())),
            }
        }))?;
        Poll::Ready(Ok((XioStream::accepted(net, c, &self.inner), peer)))
    }
}

impl XioStream {
    /// Reads if bytes (or end of stream, or an error) are there, else
    /// registers the task (adapter interface, see [`Net::drive`]).
    pub fn poll_read(&self, cx: &mut Context<'_>, out: &mut [u8]) -> Poll<io::Result<usize>> {
        self.poll_read_uninit(cx, crate::conn::as_uninit(out))
    }

    /// [`XioStream::poll_read`] into memory that may be uninitialised (a
    /// runtime's read buffer, which need not be zeroed first): the first
    /// `n` bytes are written, nothing else.
    pub fn poll_read_uninit(
        &self,
        cx: &mut Context<'_>,
        out: &mut [std::mem::MaybeUninit<u8>],
    ) -> Poll<io::Result<usize>> {
        self.poll_read_op(cx, None, |core, wake, c| core.read_step(wake, c, out))
    }

    /// Peeks if bytes (or end of stream, or an error) are there, else
    /// registers the task: [`XioStream::peek`] for adapters. What it
    /// copies stays to be read; a reset it reports is reported once, as
    /// [`XioStream::peek`]'s.
    pub fn poll_peek(&self, cx: &mut Context<'_>, out: &mut [u8]) -> Poll<io::Result<usize>> {
        self.poll_read_op(cx, None, |core, wake, c| core.peek_step(wake, c, out, true))
    }

    /// [`XioStream::poll_peek`] for a future that owns `entry` (see
    /// [`WaitEntry`]).
    pub fn poll_peek_entry(
        &self,
        cx: &mut Context<'_>,
        entry: &mut WaitEntry,
        out: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_read_op(cx, Some(entry), |core, wake, c| {
            core.peek_step(wake, c, out, true)
        })
    }

    /// [`XioStream::poll_peek`] for readiness (an adapter's
    /// `poll_read_ready`): an error it sees (a reset) is left for the next
    /// read or peek to report.
    pub fn poll_peek_ready(&self, cx: &mut Context<'_>, out: &mut [u8]) -> Poll<io::Result<usize>> {
        self.poll_read_op(cx, None, |core, wake, c| {
            core.peek_step(wake, c, out, false)
        })
    }

    /// [`XioStream::poll_peek_ready`] for a future that owns `entry` (an
    /// adapter's `readable()`; see [`WaitEntry`]).
    pub fn poll_peek_ready_entry(
        &self,
        cx: &mut Context<'_>,
        entry: &mut WaitEntry,
        out: &mut [u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_read_op(cx, Some(entry), |core, wake, c| {
            core.peek_step(wake, c, out, false)
        })
    }

    /// [`Net::poll_op`] for a read, returning `Pending` without the lock
    /// when the task's waker is still the key's slot (see [`ReadSignal`]).
    /// A future's entry takes the lock each time: the signal records the
    /// slot's waker only.
    fn poll_read_op<R>(
        &self,
        cx: &Context<'_>,
        entry: Option<&mut WaitEntry>,
        mut f: impl FnMut(&mut Core, &mut Vec<Waiter>, ConnId) -> Try<R>,
    ) -> Poll<io::Result<R>> {
        let s = &self.inner;
        let slot = entry.is_none();
        if slot && s.sig.still_parked(cx.waker()) {
            return Poll::Pending;
        }
        let c = s.id;
        let w = cx.waker();
        s.net.poll_op(Key::Read(c), cx, entry, |core, wake| {
            s.sig.forget();
            let r = f(core, wake, c);
            if !slot {
                return r;
            }
            match &r {
                // `poll_op` registers the waker.
                Try::Wait => core.park_reader(c, &s.sig, w),
                // A read that took everything is followed at once by
                // another that finds nothing (hyper's is): register the
                // task now, in this lock hold, so that poll takes the
                // lock-free way. At worst the task is woken once without
                // reading, which futures allow.
                Try::Done(Ok(_)) if !core.table.is_readable(c) => {
                    core.add_waker(Key::Read(c), w, wake);
                    core.park_reader(c, &s.sig, w);
                }
                _ => {}
            }
            r
        })
    }

    /// Takes the next received pool buffer if there is one (`None`: end of
    /// stream), else registers the task.
    pub fn poll_recv_buf(&self, cx: &mut Context<'_>) -> Poll<io::Result<Option<Buf>>> {
        self.poll_read_op(cx, None, |core, wake, c| core.chunk_step(wake, c))
    }

    /// Writes what fits now (credit, ring space, buffers), else registers
    /// the task. Several slices are packed into one buffer when they fit.
    pub fn poll_write_vectored(
        &self,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let c = self.inner.id;
        let net = &self.inner.net;
        match net.write_on(c, bufs, true, None) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            r => return Poll::Ready(r),
        }
        // Register, then try once more: what freed the way between the two
        // calls would otherwise wake nobody.
        let mut wake = Vec::new();
        {
            let mut g = net.lock();
            let smallest = net.shared.classes[0];
            if g.table.credit_left(c) < smallest {
                g.add_waker(Key::Write(c), cx.waker(), &mut wake);
            } else {
                g.add_retry(cx.waker());
            }
        }
        wake_all(&mut wake);
        match net.write_on(c, bufs, true, None) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Poll::Pending,
            r => Poll::Ready(r),
        }
    }

    /// Ready when a write would not wait: it would take at least one byte
    /// (the window has room for a buffer of the smallest class, the pool
    /// has one, and the ring to the peer has room with nothing queued
    /// behind it),
    /// or it would fail (the connection is closed or reset; the write
    /// reports the error). Otherwise registers the task where a write
    /// would wait. The smallest buffer is taken here and kept for the
    /// write, so pool exhaustion cannot make this ready and the write
    /// then block; in a pool whose smallest class is too small for spares
    /// (the net keeps none from reads) it is only looked for, and the
    /// write may then find the pool empty (`WouldBlock`, a readiness
    /// hint's usual caveat).
    pub fn poll_write_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.poll_write_ready_in(cx, None)
    }

    /// [`XioStream::poll_write_ready`] for a future that owns `entry` (an
    /// adapter's `writable()`; see [`WaitEntry`]). A wait for room in a
    /// ring or a buffer of the pool, which no peer signals, is the
    /// retry's, as with `poll_write_ready`.
    pub fn poll_write_ready_entry(
        &self,
        cx: &mut Context<'_>,
        entry: &mut WaitEntry,
    ) -> Poll<io::Result<()>> {
        self.poll_write_ready_in(cx, Some(entry))
    }

    fn poll_write_ready_in(
        &self,
        cx: &mut Context<'_>,
        mut entry: Option<&mut WaitEntry>,
    ) -> Poll<io::Result<()>> {
        let net = &self.inner.net;
        let smallest = net.shared.classes[0];
        if let Some(e) = entry.as_deref_mut() {
            e.leave_unless(net);
        }
        let mut wake = Vec::new();
        let mut g = net.lock();
        let r = self.write_ready_step(&mut g, cx, &mut entry, smallest, &mut wake);
        if r.is_ready() {
            if let Some((k, id)) = entry.and_then(|e| e.at.take()) {
                g.remove_entry(k, id, &mut wake);
            }
        }
        drop(g);
        wake_all(&mut wake);
        r
    }

    fn write_ready_step(
        &self,
        g: &mut Core,
        cx: &mut Context<'_>,
        entry: &mut Option<&mut WaitEntry>,
        smallest: usize,
        wake: &mut Vec<Waiter>,
    ) -> Poll<io::Result<()>> {
        let c = self.inner.id;
        let net = &self.inner.net;
        // Not `send_target`: that takes a reset as reported, and the next
        // read would then see end of stream instead of the reset.
        let Some(peer) = g.table.send_peer(c) else {
            return Poll::Ready(Ok(()));
        };
        if g.table.credit_left(c) < smallest {
            match entry.as_deref_mut() {
                Some(e) => g.add_entry(net, Key::Write(c), cx.waker(), e, wake),
                None => g.add_waker(Key::Write(c), cx.waker(), wake),
            }
            return Poll::Pending;
        }
        if g.pending_for(peer) && !g.flush_pending() && g.pending_for(peer) {
            g.add_retry(cx.waker());
            return Poll::Pending;
        }
        if !g.stack.tx_room(peer) {
            // Full: the peer drains it when it runs (woken if asleep), and
            // the retry looks again.
            g.stack.wake_peer(peer);
            g.add_retry(cx.waker());
            return Poll::Pending;
        }
        if g.spare.is_empty() {
            match g.stack.try_alloc(smallest) {
                // Kept only where spares are allowed: a task that polls
                // and never writes would keep it for good, and in a class
                // too small for spares that can starve the peer's writer.
                // Not kept, readiness is a hint, as documented above.
                Ok(b) if g.spare_max > 0 => g.spare.push(b),
                Ok(b) => drop(b),
                Err(Error::WouldBlock) => {
                    g.add_retry(cx.waker());
                    return Poll::Pending;
                }
                Err(e) => return Poll::Ready(Err(stack_err(e))),
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Sends a pool buffer if there is credit and room, else registers the
    /// task and leaves the buffer in `slot`.
    pub fn poll_send_buf(
        &self,
        cx: &mut Context<'_>,
        slot: &mut Option<BufMut>,
    ) -> Poll<io::Result<()>> {
        let Some(buf) = slot.take() else {
            return Poll::Ready(Ok(()));
        };
        match self.send_buf_with(buf, true) {
            Ok(()) => Poll::Ready(Ok(())),
            Err((e, back)) if e.kind() == io::ErrorKind::WouldBlock => {
                *slot = back;
                let net = &self.inner.net;
                let mut wake = Vec::new();
                {
                    let mut g = net.lock();
                    let need = slot.as_ref().map_or(0, BufMut::capacity);
                    if g.table.credit_left(self.inner.id) < need {
                        g.add_waker(Key::Write(self.inner.id), cx.waker(), &mut wake);
                    } else {
                        g.add_retry(cx.waker());
                    }
                }
                wake_all(&mut wake);
                // Once more after registering (see `poll_write_vectored`).
                let buf = slot.take().expect("handed back");
                match self.send_buf_with(buf, true) {
                    Ok(()) => Poll::Ready(Ok(())),
                    Err((e, back)) if e.kind() == io::ErrorKind::WouldBlock => {
                        *slot = back;
                        Poll::Pending
                    }
                    Err((e, back)) => {
                        *slot = back;
                        Poll::Ready(Err(e))
                    }
                }
            }
            Err((e, back)) => {
                *slot = back;
                Poll::Ready(Err(e))
            }
        }
    }

    /// Waits (as a task) until the SYN is answered: `Ok` once connected,
    /// `ConnectionRefused` if the listener refused. A task that keeps
    /// waiting calls [`XioStream::check_connect_route`] now and then, as a
    /// blocking connect does on its own.
    pub fn poll_connected(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let c = self.inner.id;
        self.inner
            .net
            .poll_op(Key::Connect(c), cx, None, |core, _| core.connect_step(c))
    }

    /// [`XioStream::poll_connected`] for a future that owns `entry` (see
    /// [`WaitEntry`]).
    pub fn poll_connected_entry(
        &self,
        cx: &mut Context<'_>,
        entry: &mut WaitEntry,
    ) -> Poll<io::Result<()>> {
        let c = self.inner.id;
        self.inner
            .net
            .poll_op(Key::Connect(c), cx, Some(entry), |core, _| {
                core.connect_step(c)
            })
    }

    /// Whether the SYN was answered or refused (what
    /// [`XioStream::poll_connected`] would report), without registering
    /// anything.
    pub fn connect_settled(&self) -> bool {
        let c = self.inner.id;
        !matches!(self.inner.net.lock().connect_step(c), Try::Wait)
    }

    /// For an adapter whose task has waited a while for the SYN's answer
    /// ([`XioStream::poll_connected`]): asks the manager whether the
    /// address still belongs to the process the SYN went to, and if not
    /// refuses the connection (`ConnectionRefused`, also to the waiting
    /// task). A process that stopped listening there and makes no X-IO
    /// call any more would never answer: without this, the task waits for
    /// good where TCP's connect is refused. `Ok` if the SYN was answered
    /// or may still be. Waits at most 100 ms for the manager, holding the
    /// net: call it off the runtime's threads.
    pub fn check_connect_route(&self) -> io::Result<()> {
        let c = self.inner.id;
        let net = &self.inner.net;
        match net.syn_target(c)? {
            Some((peer, addr)) => net.check_syn_route(c, peer, addr, None),
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every connection slot of a table gets its own client address, the
    /// 2^20 of them, not only the first 64,512 (found in review: they
    /// repeated every 64,512 slots).
    #[test]
    fn client_addresses_are_unique_over_a_whole_table() {
        let v4: SocketAddr = "10.1.2.3:80".parse().unwrap();
        let mut seen = std::collections::HashSet::new();
        for i in 0..crate::conn::MAX_CONNS as u32 {
            // A generation in the high bits changes nothing.
            let c = ConnId(7 << 20 | i);
            assert!(seen.insert(client_addr(PeerId(300), c, &v4)), "slot {i}");
        }
        assert_eq!(
            client_addr(PeerId(300), ConnId(0), &v4).to_string(),
            "127.88.1.44:1024"
        );
        let v6: SocketAddr = "[::1]:80".parse().unwrap();
        assert_eq!(
            client_addr(PeerId(300), ConnId(0), &v6).to_string(),
            "[::ffff:127.88.1.44]:1024"
        );
    }

    #[test]
    fn syn_encoding_round_trips_and_rejects_garbage() {
        let t: SocketAddr = "10.1.2.3:80".parse().unwrap();
        let s: SocketAddr = "[fe80::1]:4242".parse().unwrap();
        let mut b = vec![0u8; SYN_LEN];
        b[0] = 1;
        put_addr(&mut b[1..1 + ADDR_LEN], &t);
        put_addr(&mut b[1 + ADDR_LEN..], &s);
        assert_eq!(decode_syn(&b), Some((t, s)));
        assert_eq!(decode_syn(&b[..SYN_LEN - 1]), None);
        b[1] = 9;
        assert_eq!(decode_syn(&b), None);
        b[1] = 4;
        b[0] = 2;
        assert_eq!(decode_syn(&b), None);
    }

    /// A manager of this test process's own (prefix `unit-<name>-<pid>`),
    /// a server net listening at `addr`, and a client net.
    fn two_nets(
        name: &str,
        addr: SocketAddr,
    ) -> (crate::manager::ManagerHandle, Net, Net, XioListener) {
        crate::paths::use_test_run_dir();
        let p = format!("unit-{name}-{}", std::process::id());
        let m = crate::Manager::builder(&p).spawn().unwrap();
        let server = Net::attach(&p).unwrap();
        let client = Net::attach(&p).unwrap();
        let l = server.listen(addr).unwrap();
        (m, server, client, l)
    }

    /// A drain that fails inside [`Net::poll_nowait`] after it collected
    /// events (a control message the stack could not act on, say) lost
    /// them: they were returned with the error, which the C ABI's
    /// `xio_net_poll` turns into an error code alone, and taken out of
    /// the net. And the doorbell, not armed when the rings held more,
    /// was not rung either, so a loop asleep on the fd slept on it. Now
    /// the events are returned, the error comes with the next call, and
    /// the fd is readable to bring the loop back for it.
    #[test]
    fn a_drain_failing_in_poll_nowait_loses_no_event() {
        use std::io::Write;
        let addr: SocketAddr = "10.9.9.1:80".parse().unwrap();
        let (_m, server, client, l) = two_nets("drive-fails", addr);
        let mut c = client.connect(addr).unwrap();
        let (s, _) = l.accept().unwrap();
        s.set_nonblocking(true).unwrap();
        s.set_token(7);
        let fd = server.poll_fd().unwrap();
        let readable = || {
            let mut p = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::IN,
            )];
            let now = rustix::time::Timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            rustix::event::poll(&mut p, Some(&now)).unwrap() == 1
        };
        let mut events = Vec::new();
        // Quiet: nothing left to report, the fd not readable.
        for _ in 0..10_000 {
            events.clear();
            server.poll_nowait(&mut events).unwrap();
            if !readable() {
                break;
            }
        }
        assert!(!readable(), "the fd never went quiet");
        c.write_all(b"x").unwrap();
        server.lock().fail_drive = true;
        let mut got = Vec::new();
        let r = server.poll_nowait(&mut got);
        assert!(
            matches!(r, Ok(n) if n == got.len())
                && got.iter().any(|e| matches!(
                    e,
                    Event::Stream {
                        token: 7,
                        readable: true,
                        ..
                    }
                )),
            "{r:?} {got:?}"
        );
        assert!(readable(), "the loop is not brought back for the error");
        let e = server.poll_nowait(&mut got).unwrap_err();
        assert!(e.to_string().contains("injected"), "{e}");
        // Then the net goes on as before.
        got.clear();
        server.poll_nowait(&mut got).unwrap();
    }

    /// A waker that counts its wake-ups.
    #[derive(Default)]
    struct Count(std::sync::atomic::AtomicUsize);

    impl std::task::Wake for Count {
        fn wake(self: Arc<Self>) {
            self.wake_by_ref();
        }
        fn wake_by_ref(self: &Arc<Self>) {
            self.0.fetch_add(1, AtomicOrdering::Relaxed);
        }
    }

    fn wakes(c: &Count) -> usize {
        c.0.load(AtomicOrdering::Relaxed)
    }

    /// A stream polled from ever new tasks while nothing arrives (a
    /// `readable()` raced against a timeout in a loop, each round a new
    /// task) once kept every task's waker until data came: the list grew
    /// by one per task, without bound. A `poll_*` method keeps the last
    /// task's waker only, and a future's entry leaves with the future, so
    /// the list holds what waits; and every future still waiting, however
    /// many, is woken once when data comes, never before.
    #[test]
    fn wakers_of_tasks_gone_do_not_pile_up() {
        use std::io::Write;
        use std::task::{Context, Waker};
        let addr: SocketAddr = "10.9.9.2:80".parse().unwrap();
        let (_m, server, client, l) = two_nets("wakers-pile", addr);
        let pair = || {
            let c = client.connect(addr).unwrap();
            (c, l.accept().unwrap().0)
        };
        let cx_of = |w: &Arc<Count>| Waker::from(w.clone());
        let tasks_on = |s: &XioStream| {
            server
                .lock()
                .waiters
                .get(&Key::Read(s.inner.id))
                .map_or(0, |ws| ws.list.len())
        };

        // Ever new tasks through the slot: one waker kept, the last.
        let (_c, s) = pair();
        let mut last = Arc::default();
        for _ in 0..1000 {
            last = Arc::default();
            let w = cx_of(&last);
            assert!(s
                .poll_read(&mut Context::from_waker(&w), &mut [0u8; 8])
                .is_pending());
        }
        assert_eq!(tasks_on(&s), 1);

        // Ever new futures, each dropped: nothing kept.
        for _ in 0..1000 {
            let mut e = WaitEntry::default();
            let w = cx_of(&Arc::default());
            assert!(s
                .poll_peek_ready_entry(&mut Context::from_waker(&w), &mut e, &mut [0u8; 1])
                .is_pending());
        }
        assert_eq!(tasks_on(&s), 1);

        // Many futures that keep waiting (polled once each, never again):
        // none is woken before data comes, and all are woken when it does.
        let (mut c, s) = pair();
        let live: Vec<Arc<Count>> = (0..500).map(|_| Arc::default()).collect();
        let mut entries: Vec<WaitEntry> = live.iter().map(|_| WaitEntry::default()).collect();
        for (w, e) in live.iter().zip(&mut entries) {
            let w = cx_of(w);
            assert!(s
                .poll_peek_ready_entry(&mut Context::from_waker(&w), e, &mut [0u8; 1])
                .is_pending());
        }
        assert_eq!(tasks_on(&s), live.len());
        assert!(live.iter().all(|w| wakes(w) == 0), "woken before any data");
        c.write_all(b"x").unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        while live.iter().any(|w| wakes(w) == 0) {
            assert!(Instant::now() < deadline, "a waiting future was not woken");
            server.drive(false, false).unwrap();
            std::thread::yield_now();
        }
        assert!(live.iter().all(|w| wakes(w) == 1));
        drop(entries);
        assert_eq!(tasks_on(&s), 0);
        let _ = last;
    }

    #[test]
    fn rewind_crosses_slices() {
        let a = [1u8; 3];
        let b = [2u8; 4];
        let bufs = [IoSlice::new(&a), IoSlice::new(&b)];
        let mut cur = (1, 2);
        rewind(&mut cur, &bufs, 4);
        assert_eq!(cur, (0, 1));
    }
}

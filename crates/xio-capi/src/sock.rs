//! The socket interface: listeners and byte streams with TCP semantics,
//! blocking or non-blocking, and readiness for event loops (`xio_net_poll`,
//! or `xio_net_fd` inside an existing `epoll` loop).

use std::cell::RefCell;
use std::ffi::{c_char, c_void};
use std::hash::{Hash, Hasher};
use std::io::{IoSlice, Read, Write};
use std::net::{Shutdown, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use xio_core::net::{Event, Net, WeakNet, XioListener as Listener, XioStream as Stream};

use crate::error::*;
use crate::handle::*;
use crate::zc::{buf_out, close_buf, sendable, BufState};
use crate::XioBuf;

/// `xio_event.events`: a read may make progress (data, end of stream, or
/// an error to report).
pub const XIO_EVENT_READABLE: u32 = 1;
/// `xio_event.events`: a write may make progress.
pub const XIO_EVENT_WRITABLE: u32 = 2;
/// `xio_event.events`: a connection waits on this listener.
pub const XIO_EVENT_ACCEPT: u32 = 4;

/// `xio_shutdown`: no more reads.
pub const XIO_SHUT_RD: i32 = 0;
/// `xio_shutdown`: no more writes (the peer reads end of stream).
pub const XIO_SHUT_WR: i32 = 1;
/// `xio_shutdown`: both.
pub const XIO_SHUT_RDWR: i32 = 2;

/// Readiness from `xio_net_poll`: which stream or listener (its token, see
/// `xio_stream_token` and `xio_listener_token`) and what it is ready for.
/// Events are edge-like hints: after one, read, write or accept until
/// `XIO_ERR_WOULD_BLOCK`. Once a net has been polled, new data is seen
/// through `xio_net_poll` only (as with `epoll`): a non-blocking read that
/// says `XIO_ERR_WOULD_BLOCK` does not look for more by itself.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct XioEvent {
    /// The stream's or listener's token.
    pub token: u64,
    /// `XIO_EVENT_` flags.
    pub events: u32,
}

/// One slice of a gather write (`xio_writev`).
#[repr(C)]
pub struct XioIovec {
    /// Start of the bytes.
    pub base: *const c_void,
    /// How many.
    pub len: usize,
}

pub(crate) struct NetInner {
    net: Net,
    /// The pollable fd (`Net::poll_fd`), made on first ask.
    fd: Mutex<Option<OwnedFd>>,
    /// The manager's watch (`Net::manager_watch`), made on first ask.
    manager_fd: Mutex<Option<OwnedFd>>,
    /// This handle is the one that polls its net (see [`claim_polling`]).
    polls: AtomicBool,
    /// The watch under way (`xio_net_watch_begin`).
    watch: Mutex<Option<xio_core::net::Watcher>>,
    /// `xio_net_poll`'s event list, kept: a loop polls at every arrival,
    /// and an allocation each time showed in its profile.
    events: Mutex<Vec<Event>>,
    /// Names this handle in [`POLLERS`] (its address moves when closed).
    key: usize,
}

/// The next [`NetInner::key`].
static NEXT_KEY: AtomicUsize = AtomicUsize::new(0);

/// For each net polled through a handle: `(Net::id, that handle)`. A net
/// has one readiness queue, and two NULL attaches are one net: a second
/// event loop polling it would take the first one's events.
static POLLERS: xio_core::fork::PerProcess<Mutex<Vec<(usize, usize)>>> =
    xio_core::fork::PerProcess::new(|| Mutex::new(Vec::new()));

/// Makes `n` the handle that polls its net (`xio_net_poll`, `xio_net_fd`),
/// or refuses if another live handle of the same net is. One load once
/// claimed.
fn claim_polling(n: &NetInner) -> Result<(), Fail> {
    if n.polls.load(Ordering::Relaxed) {
        return Ok(());
    }
    let me = n.key;
    let mut p = POLLERS.get().lock().unwrap_or_else(|e| e.into_inner());
    if p.iter().any(|&(net, h)| net == n.net.id() && h != me) {
        return Err(Fail::new(
            XIO_ERR_INVALID_ARGUMENT,
            "another handle of this net polls it (two xio_net_attach(NULL) are one \
             net, with one readiness queue): attach with a prefix for a net of its own",
        ));
    }
    p.push((n.net.id(), me));
    n.polls.store(true, Ordering::Relaxed);
    Ok(())
}

impl Drop for NetInner {
    fn drop(&mut self) {
        if self.polls.load(Ordering::Relaxed) {
            let mut p = POLLERS.get().lock().unwrap_or_else(|e| e.into_inner());
            p.retain(|&(_, h)| h != self.key);
        }
    }
}

impl Opaque for XioNet {
    type Inner = NetInner;
    const MAGIC: u64 = 0x7869_6f5f_6e65_7431; // "xio_net1"
    const NAME: &'static str = "net";
    const FORKED_REFUSED: bool = true;
}

pub(crate) struct ListenerInner {
    l: Listener,
    token: u64,
}

impl Opaque for crate::XioListener {
    type Inner = ListenerInner;
    const MAGIC: u64 = 0x7869_6f5f_6c73_6e31; // "xio_lsn1"
    const NAME: &'static str = "listener";
    const FORKED_REFUSED: bool = true;
}

impl Opaque for crate::XioStream {
    type Inner = Stream;
    const MAGIC: u64 = 0x7869_6f5f_7374_6d31; // "xio_stm1"
    const NAME: &'static str = "stream";
    const FORKED_REFUSED: bool = true;
}

/// A listener's token: the top bit set (stream tokens are below 2^32),
/// derived from its address so an accept event maps back to it.
fn listener_token(a: &SocketAddr) -> u64 {
    let low = match a {
        SocketAddr::V4(v) => (u64::from(u32::from(*v.ip())) << 16) | u64::from(v.port()),
        SocketAddr::V6(_) => {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            a.hash(&mut h);
            h.finish()
        }
    };
    (1 << 63) | (low & !(1 << 63))
}

fn event_of(e: &Event) -> XioEvent {
    match *e {
        Event::Stream {
            token,
            readable,
            writable,
        } => XioEvent {
            token,
            events: (u32::from(readable) * XIO_EVENT_READABLE)
                | (u32::from(writable) * XIO_EVENT_WRITABLE),
        },
        Event::Accept(a) => XioEvent {
            token: listener_token(&a),
            events: XIO_EVENT_ACCEPT,
        },
    }
}

/// Attaches to the pool `prefix` for the socket interface (the manager
/// must run). NULL uses the process-wide attachment to `$XIO_PREFIX`
/// (default "xio"), shared with every other NULL attach. Close with
/// `xio_net_close` (streams and listeners keep the attachment alive).
///
/// A net has one readiness queue, so only one handle may poll it
/// (`xio_net_poll`, `xio_net_fd`): with two NULL handles, the second to
/// poll gets `XIO_ERR_INVALID_ARGUMENT` until the first is closed (it
/// would take the first one's events). Each attach with a prefix is a
/// net of its own: give each event loop of a process its own that way.
/// Streams made through any handle of a net report to its poller.
///
/// Thread-safe; a net and its listeners and streams may be used from any
/// number of threads at once.
///
/// # Safety
/// `prefix` is NULL or a NUL-terminated string; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_net_attach(prefix: *const c_char, out: *mut *mut XioNet) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        let net = if prefix.is_null() {
            Net::global()?
        } else {
            // SAFETY: per this function's contract.
            Net::attach(unsafe { str_arg(prefix, "prefix") }?)?
        };
        let h = into_handle::<XioNet>(NetInner {
            net,
            fd: Mutex::new(None),
            manager_fd: Mutex::new(None),
            polls: AtomicBool::new(false),
            watch: Mutex::new(None),
            events: Mutex::new(Vec::new()),
            key: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
        });
        // SAFETY: checked non-NULL.
        unsafe { put(out, h) };
        Ok(())
    })
}

/// Releases the handle (NULL is a no-op). The attachment ends when its
/// last listener and stream are closed too.
///
/// # Safety
/// `net` is NULL or a net handle no other thread uses, not used after.
#[no_mangle]
pub unsafe extern "C" fn xio_net_close(net: *mut XioNet) -> XioResult {
    // SAFETY: per this function's contract.
    guard(|| unsafe { take(net) }.map(drop))
}

/// The fd in `slot`, made by `make` on first ask; the net keeps it.
fn lazy_fd(
    slot: &Mutex<Option<OwnedFd>>,
    make: impl FnOnce() -> std::io::Result<OwnedFd>,
) -> std::io::Result<i32> {
    let mut fd = slot.lock().unwrap_or_else(|e| e.into_inner());
    if fd.is_none() {
        *fd = Some(make()?);
    }
    Ok(fd.as_ref().expect("just set").as_raw_fd())
}

/// An fd for an existing `epoll`/`poll`/`select` loop: it becomes readable
/// when `xio_net_poll` may have events. Use it like this: call
/// `xio_net_poll(net, ..., 0, ...)` once before the first wait and every
/// time the fd is readable, and handle what it returns; nothing more is
/// needed. A non-blocking write, `xio_stream_send_buf` or
/// `xio_stream_alloc` that said `XIO_ERR_WOULD_BLOCK` for a peer's full
/// ring or an empty pool (which nothing signals the end of) is reported
/// `XIO_EVENT_WRITABLE` again after a pause, and what the net sends by
/// itself (a close's end of stream, the window a read gives back) and
/// finds a peer's ring full for is retried by the next `xio_net_poll`:
/// the fd becomes readable for both after 50 us, the pause doubling up
/// to 1 ms while nothing changes, so a loop does not spin while a peer
/// is stopped. The fd is an epoll instance:
/// wait for it to be readable, do not read it. It belongs to the net: do
/// not close it.
///
/// # Safety
/// `net` is a live net handle or NULL; `fd_out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_net_fd(net: *mut XioNet, fd_out: *mut i32) -> XioResult {
    guard(|| {
        need_out(fd_out, "fd_out")?;
        // SAFETY: per this function's contract.
        let n = unsafe { borrow(net) }?;
        claim_polling(n)?;
        let raw = lazy_fd(&n.fd, || n.net.poll_fd())?;
        // SAFETY: checked non-NULL.
        unsafe { put(fd_out, raw) };
        Ok(())
    })
}

/// A second fd for the same loop as `xio_net_fd`: it becomes readable
/// when the manager has queued a control message or is gone (killed
/// included). Call `xio_net_poll(net, ..., 0, ...)` when it is readable,
/// as for `xio_net_fd`. The call that finds the manager gone makes
/// `xio_net_manager_gone` say so and quiets this fd for good (streams
/// already connected keep working). Without it, an idle loop learns of
/// the manager's end at its next `xio_net_poll`. The fd belongs to the
/// net: do not close it.
///
/// # Safety
/// `net` is a live net handle or NULL; `fd_out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_net_manager_fd(net: *mut XioNet, fd_out: *mut i32) -> XioResult {
    guard(|| {
        need_out(fd_out, "fd_out")?;
        // SAFETY: per this function's contract.
        let n = unsafe { borrow(net) }?;
        let raw = lazy_fd(&n.manager_fd, || n.net.manager_watch())?;
        // SAFETY: checked non-NULL.
        unsafe { put(fd_out, raw) };
        Ok(())
    })
}

/// Writes 1 to `gone_out` if this net has found its manager gone (after
/// which connections already made keep working, and new listens and dials
/// fail with `XIO_ERR_MANAGER_GONE`), else 0.
///
/// # Safety
/// `net` is a live net handle or NULL; `gone_out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_net_manager_gone(net: *mut XioNet, gone_out: *mut i32) -> XioResult {
    guard(|| {
        need_out(gone_out, "gone_out")?;
        // SAFETY: per this function's contract.
        let n = unsafe { borrow(net) }?;
        // SAFETY: checked non-NULL.
        unsafe { put(gone_out, i32::from(n.net.manager_gone())) };
        Ok(())
    })
}

/// Waits for readiness of this net's streams and listeners (an
/// `epoll_wait` for X-IO; blocking ones are reported too, though a loop
/// usually makes them non-blocking): writes up to `cap` events to `events`
/// (`cap` 0 is `XIO_ERR_INVALID_ARGUMENT`) and their number to `n_out`.
/// `timeout_ms` < 0 waits until something is ready, 0 does not wait (and
/// re-arms `xio_net_fd`), > 0 waits at most that long (`*n_out` = 0 when
/// nothing came). The wait follows the adaptive policy: it spins briefly
/// when a peer is active, then sleeps.
/// With timeout 0, an error met after events were collected is returned
/// by the next call (the fd is left readable for it): this call reports
/// the events, which are not lost.
/// `XIO_ERR_INVALID_ARGUMENT` when another handle of the same net polls
/// it (two NULL attaches: see `xio_net_attach`), as for `xio_net_fd`.
/// Within a watch (`xio_net_watch_begin`) only a timeout of 0 is taken,
/// and it leaves `xio_net_fd` quiet: `xio_net_watch_end` first to wait.
///
/// Thread-safe, though one thread polling a net is the usual design.
///
/// # Safety
/// `net` is a live net handle or NULL; `events` valid for `cap` writes;
/// `n_out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_net_poll(
    net: *mut XioNet,
    events: *mut XioEvent,
    cap: usize,
    timeout_ms: i32,
    n_out: *mut usize,
) -> XioResult {
    guard(|| {
        need_out(n_out, "n_out")?;
        need_out(events, "events")?;
        if cap == 0 {
            return Err(Fail::new(XIO_ERR_INVALID_ARGUMENT, "cap is 0"));
        }
        // SAFETY: per this function's contract.
        let n = unsafe { borrow(net) }?;
        claim_polling(n)?;
        // At most `cap`: the rest stay in the net, where a token chosen
        // before the next call still applies to them.
        let mut got = n.events.lock().unwrap_or_else(|e| e.into_inner());
        got.clear();
        let mut watch = n.watch.lock().unwrap_or_else(|e| e.into_inner());
        match (watch.as_mut(), timeout_arg(timeout_ms)) {
            (Some(w), Timeout::NoWait) => n.net.poll_in_watch(w, &mut got, cap)?,
            (Some(_), _) => {
                return Err(Fail::new(
                    XIO_ERR_INVALID_ARGUMENT,
                    "within a watch only a poll with timeout 0 (end the watch to wait)",
                ))
            }
            (None, Timeout::NoWait) => n.net.poll_nowait_capped(&mut got, cap)?,
            (None, Timeout::Forever) => n.net.poll_capped(&mut got, cap, None)?,
            (None, Timeout::Ms(d)) => n.net.poll_capped(&mut got, cap, Some(d))?,
        };
        drop(watch);
        debug_assert!(got.len() <= cap);
        for (i, e) in got.iter().take(cap).enumerate() {
            // SAFETY: i < cap, and `events` holds `cap` per the contract.
            unsafe { events.add(i).write(event_of(e)) };
        }
        // SAFETY: checked non-NULL.
        unsafe { put(n_out, got.len().min(cap)) };
        Ok(())
    })
}

/// Starts a watch of the net's rings, for an event loop that drives the
/// net itself and parks on `xio_net_fd` (the Go package's dispatcher):
/// rather than sleep at once, it keeps looking for arrivals for
/// `*budget_ns_out` nanoseconds, the net's adaptive budget. That is 0
/// unless a peer is awake on another core (then a reply often comes
/// within the budget, and a wake-up from the fd would cost far more;
/// sharing a core, the peer could not run while the loop looked); with 0
/// no watch begins, and the loop sleeps on the fd as it would have. While
/// a watch lasts peers do not ring the fd: look with
/// `xio_net_watch_look`, collect with `xio_net_poll(net, ..., 0, ...)`
/// (which then leaves the fd quiet), and end it with `xio_net_watch_end`,
/// then poll once more (which arms the fd) before sleeping.
/// `XIO_ERR_BUSY` if a watch is under way.
///
/// # Safety
/// `net` is a live net handle or NULL; `budget_ns_out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_net_watch_begin(
    net: *mut XioNet,
    budget_ns_out: *mut u64,
) -> XioResult {
    guard(|| {
        need_out(budget_ns_out, "budget_ns_out")?;
        // SAFETY: per this function's contract.
        let n = unsafe { borrow(net) }?;
        claim_polling(n)?;
        let mut w = n.watch.lock().unwrap_or_else(|e| e.into_inner());
        if w.is_some() {
            return Err(Fail::new(XIO_ERR_BUSY, "a watch of this net is under way"));
        }
        let budget = n.net.spin_budget();
        if !budget.is_zero() {
            *w = Some(n.net.watch_begin());
        }
        let ns = u64::try_from(budget.as_nanos()).unwrap_or(u64::MAX);
        // SAFETY: checked non-NULL.
        unsafe { put(budget_ns_out, ns) };
        Ok(())
    })
}

/// Within a watch (`xio_net_watch_begin`): writes 1 to `input_out` if
/// something arrived to collect with `xio_net_poll`, else 0. Takes no
/// lock and makes no system call: a few loads of the rings' indices.
/// `XIO_ERR_INVALID_ARGUMENT` outside a watch.
///
/// # Safety
/// `net` is a live net handle or NULL; `input_out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_net_watch_look(net: *mut XioNet, input_out: *mut i32) -> XioResult {
    guard(|| {
        need_out(input_out, "input_out")?;
        // SAFETY: per this function's contract.
        let n = unsafe { borrow(net) }?;
        let mut w = n.watch.lock().unwrap_or_else(|e| e.into_inner());
        let w = w
            .as_mut()
            .ok_or_else(|| Fail::new(XIO_ERR_INVALID_ARGUMENT, "no watch of this net"))?;
        // SAFETY: checked non-NULL.
        unsafe { put(input_out, i32::from(w.has_input())) };
        Ok(())
    })
}

/// Ends the watch (a no-op without one): `hit` != 0 if something arrived
/// within it, `spun_ns` how long it looked since the last arrival (or
/// since it began). Teaches the adaptive policy. Then call
/// `xio_net_poll(net, ..., 0, ...)`, which arms the fd again, before
/// sleeping on it.
///
/// # Safety
/// `net` is a live net handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_net_watch_end(net: *mut XioNet, hit: i32, spun_ns: u64) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let n = unsafe { borrow(net) }?;
        let w = n.watch.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = w {
            n.net
                .watch_end(w, hit != 0, std::time::Duration::from_nanos(spun_ns));
        }
        Ok(())
    })
}

/// The nets on which this thread began a write batch and has not ended
/// it, each with the fork generation it was begun in and its [`Net::id`]
/// (not reused while the weak handle keeps its allocation): ended when
/// the thread exits, as a thread's exit gives up the stacks it owns.
/// Without it a thread that exits inside a batch (an error path,
/// `pthread_exit`) leaves its writes held and every other thread's batch
/// refused.
struct OpenBatches(Vec<(u32, usize, WeakNet)>);

impl Drop for OpenBatches {
    fn drop(&mut self) {
        for (born, _, weak) in self.0.drain(..) {
            // A forked child's entries are the parent's nets, behind a
            // lock a thread of the parent may have held at the fork.
            if born != xio_core::fork::generation() {
                continue;
            }
            if let Some(net) = weak.upgrade() {
                // No unwinding out of a thread-local destructor.
                let _ = catch_unwind(AssertUnwindSafe(|| net.end_write_batch()));
            }
        }
    }
}

thread_local! {
    static OPEN_BATCHES: RefCell<OpenBatches> = const { RefCell::new(OpenBatches(Vec::new())) };
}

/// Notes (`open`) or forgets this thread's write batch on `net`. False
/// while the thread exits (the list already gone): nothing would end a
/// batch begun then.
fn note_batch(net: &Net, open: bool) -> bool {
    let id = net.id();
    OPEN_BATCHES
        .try_with(|b| {
            let mut b = b.borrow_mut();
            let now = xio_core::fork::generation();
            // Also forgets nets gone since, and a forked child's inherited ones.
            b.0.retain(|(born, i, w)| *born == now && *i != id && w.upgrade().is_some());
            if open {
                b.0.push((now, id, net.downgrade()));
            }
        })
        .is_ok()
}

/// Holds the stream writes this thread makes on `net`'s streams until
/// [`xio_net_batch_end`], which sends them together: for an event loop,
/// around its handling of one `xio_net_poll`'s events when there are
/// several: sent together, the descriptors' ring stores overlap their trips
/// to the reader's core instead of waiting for one another (the gain is
/// the "batched writes" column of BENCHMARKS.md's stream sockets). Each
/// write still copies its bytes, takes its
/// window and returns as usual; only the descriptors wait.
///
/// Held writes also leave at the next `xio_net_poll`, before this thread
/// waits in any call on `net`, before anything else is sent (a close,
/// a zero-copy send, another thread's write: a stream's bytes never
/// change order), and when 256 are held. Do not keep a batch open across
/// work that does not return to `net` soon: the bytes wait for it, as
/// with `TCP_CORK`. Calls do not nest (the first `xio_net_batch_end`
/// ends the batch); a thread that exits ends its batch too. Streams to
/// the same process are never held.
///
/// `XIO_ERR_BUSY` if another thread's batch is under way on `net` (this
/// thread's writes then go out as usual).
///
/// # Safety
/// `net` is a live net handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_net_batch_begin(net: *mut XioNet) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let n = unsafe { borrow(net) }?;
        if n.net.begin_write_batch() {
            if !note_batch(&n.net, true) {
                // Begun while the thread exits (from a thread-specific
                // data destructor): it would outlive the thread, so the
                // writes go out as usual instead.
                n.net.end_write_batch();
            }
            Ok(())
        } else {
            Err(Fail::new(
                XIO_ERR_BUSY,
                "another thread's write batch is under way on this net",
            ))
        }
    })
}

/// Ends this thread's write batch on `net` (see [`xio_net_batch_begin`]):
/// sends what it holds, together. A no-op without one.
///
/// # Safety
/// `net` is a live net handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_net_batch_end(net: *mut XioNet) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let n = unsafe { borrow(net) }?;
        n.net.end_write_batch();
        note_batch(&n.net, false);
        Ok(())
    })
}

/// Listens on `"ip:port"` (`XIO_ERR_ADDR_IN_USE` if another service has it),
/// holding up to 4096 connections not yet accepted (see
/// [`xio_listen_backlog`]).
///
/// # Safety
/// `net` is a live net handle or NULL; `addr` a NUL-terminated string;
/// `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_listen(
    net: *mut XioNet,
    addr: *const c_char,
    out: *mut *mut crate::XioListener,
) -> XioResult {
    // SAFETY: the same contract.
    unsafe { xio_listen_backlog(net, addr, xio_core::net::DEFAULT_BACKLOG, out) }
}

/// [`xio_listen`] holding at most `backlog` (0 counts as 1) connections not
/// yet accepted, as `listen(2)`'s argument: a connect beyond them is
/// refused (`xio_dial` reports `XIO_ERR_CONNECTION_REFUSED`, or the
/// client's first read does when the dial returned before the answer).
///
/// # Safety
/// As for [`xio_listen`].
#[no_mangle]
pub unsafe extern "C" fn xio_listen_backlog(
    net: *mut XioNet,
    addr: *const c_char,
    backlog: usize,
    out: *mut *mut crate::XioListener,
) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let a = unsafe { addr_arg(addr) }?;
        // SAFETY: per this function's contract.
        let n = unsafe { borrow(net) }?;
        let l = n.net.listen_with_backlog(a, backlog)?;
        let token = listener_token(&l.local_addr()?);
        // SAFETY: checked non-NULL.
        unsafe {
            put(
                out,
                into_handle::<crate::XioListener>(ListenerInner { l, token }),
            )
        };
        Ok(())
    })
}

/// Stops listening and frees the handle (NULL is a no-op). Connections
/// not yet accepted are reset; accepted ones are unaffected.
/// `xio_net_poll` reports nothing for the listener after this.
///
/// # Safety
/// `listener` is NULL or a listener handle no other thread uses, not
/// used after.
#[no_mangle]
pub unsafe extern "C" fn xio_listener_close(listener: *mut crate::XioListener) -> XioResult {
    // SAFETY: per this function's contract.
    guard(|| unsafe { take(listener) }.map(drop))
}

/// Accepts the next connection: waits for one, or `XIO_ERR_WOULD_BLOCK`
/// in non-blocking mode.
///
/// Thread-safe.
///
/// # Safety
/// `listener` is a live listener handle or NULL; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_accept(
    listener: *mut crate::XioListener,
    out: *mut *mut crate::XioStream,
) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let l = unsafe { borrow(listener) }?;
        let (s, _) = l.l.accept()?;
        // SAFETY: checked non-NULL.
        unsafe { put(out, into_handle::<crate::XioStream>(s)) };
        Ok(())
    })
}

/// Puts the listener in non-blocking mode (`on` != 0) or back.
///
/// # Safety
/// `listener` is a live listener handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_listener_set_nonblocking(
    listener: *mut crate::XioListener,
    on: i32,
) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        unsafe { borrow(listener) }?.l.set_nonblocking(on != 0)?;
        Ok(())
    })
}

/// The listened address as `"ip:port"`, NUL-terminated, into `buf` of
/// `cap` bytes (64 is always enough; `XIO_ERR_INVALID_ARGUMENT` if too
/// small): with the port the library chose when `xio_listen` was given
/// port 0.
///
/// # Safety
/// `listener` is a live listener handle or NULL; `buf` valid for `cap`
/// bytes.
#[no_mangle]
pub unsafe extern "C" fn xio_listener_local_addr(
    listener: *mut crate::XioListener,
    buf: *mut c_char,
    cap: usize,
) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let l = unsafe { borrow(listener) }?;
        let a = l.l.local_addr()?;
        // SAFETY: per this function's contract.
        unsafe { put_str(buf, cap, &a.to_string()) }
    })
}

/// The token `xio_net_poll` reports accept events with.
///
/// # Safety
/// `listener` is a live listener handle or NULL; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_listener_token(
    listener: *mut crate::XioListener,
    out: *mut u64,
) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let t = unsafe { borrow(listener) }?.token;
        // SAFETY: checked non-NULL.
        unsafe { put(out, t) };
        Ok(())
    })
}

/// Connects to the listener on `"ip:port"`. Returns once the connection
/// request is on its way; `XIO_ERR_CONNECTION_REFUSED` at once when
/// nobody listens there (or on the first read, if the listener left
/// meanwhile); `XIO_ERR_PEER_BUSY` when the process listening there does
/// not read its control socket (it is there: no reason to dial TCP).
///
/// # Safety
/// `net` is a live net handle or NULL; `addr` a NUL-terminated string;
/// `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_dial(
    net: *mut XioNet,
    addr: *const c_char,
    out: *mut *mut crate::XioStream,
) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let a = unsafe { addr_arg(addr) }?;
        // SAFETY: per this function's contract.
        let s = unsafe { borrow(net) }?.net.connect(a)?;
        // SAFETY: checked non-NULL.
        unsafe { put(out, into_handle::<crate::XioStream>(s)) };
        Ok(())
    })
}

/// Whether the listener answered the connection request of a stream from
/// `xio_dial` (which returns before the answer): `*done_out` 1 once it
/// accepted (also for an accepted stream), 0 while the answer is still to
/// come; `XIO_ERR_CONNECTION_REFUSED` if it refused (its backlog was full,
/// or it closed meanwhile). Never waits: an event loop calls it when
/// `xio_net_poll` reports the stream, and now and then
/// `xio_stream_check_connect` while it waits.
///
/// Thread-safe.
///
/// # Safety
/// `stream` is a live stream handle or NULL; `done_out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_stream_connected(
    stream: *mut crate::XioStream,
    done_out: *mut i32,
) -> XioResult {
    guard(|| {
        need_out(done_out, "done_out")?;
        // SAFETY: per this function's contract.
        let s = unsafe { borrow(stream) }?;
        if !s.connect_settled() {
            // SAFETY: checked non-NULL.
            unsafe { put(done_out, 0) };
            return Ok(());
        }
        if let Some(e) = s.take_error()? {
            return Err(e.into());
        }
        // SAFETY: checked non-NULL.
        unsafe { put(done_out, 1) };
        Ok(())
    })
}

/// For a loop whose dial has waited a while for its answer (2 ms, then
/// doubling up to 100 ms, as a blocking connect does): asks the manager
/// whether the address still belongs to the process the request went to.
/// A process that stopped listening there and makes no X-IO call any more
/// would never answer; if so the stream is refused
/// (`XIO_ERR_CONNECTION_REFUSED`, and `xio_net_poll` reports it).
/// Waits up to 100 ms for the manager: call it off a loop that others
/// wait on.
///
/// Thread-safe.
///
/// # Safety
/// `stream` is a live stream handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_stream_check_connect(stream: *mut crate::XioStream) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { borrow(stream) }?;
        Ok(s.check_connect_route()?)
    })
}

/// Closes the stream and frees the handle (NULL is a no-op): the peer
/// reads end of stream after the data already written (or a reset, if
/// data sent to us was left unread). A process that calls `exit()` (or
/// returns from `main`) with streams open has them closed this way, after
/// its own `atexit` handlers ran; one killed by a signal resets them.
/// As with `close` on an fd in an `epoll` set, `xio_net_poll` reports
/// nothing for the stream after this, not even readiness it had before.
///
/// # Safety
/// `stream` is NULL or a stream handle no other thread uses, not used after.
#[no_mangle]
pub unsafe extern "C" fn xio_stream_close(stream: *mut crate::XioStream) -> XioResult {
    // SAFETY: per this function's contract.
    guard(|| unsafe { take(stream) }.map(drop))
}

/// Reads up to `len` bytes into `buf`; `*n_out` = 0 means end of stream
/// (or `len` was 0: `buf` may then be NULL, and the call returns at once
/// with 0 whatever the stream's state, as read(2) on a socket does).
/// Waits for data (or the read timeout), or `XIO_ERR_WOULD_BLOCK` in
/// non-blocking mode.
///
/// Thread-safe (concurrent readers share the byte stream).
///
/// # Safety
/// `stream` is a live stream handle or NULL; `buf` valid for `len` bytes
/// of writes; `n_out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_read(
    stream: *mut crate::XioStream,
    buf: *mut c_void,
    len: usize,
    n_out: *mut usize,
) -> XioResult {
    guard(|| {
        need_out(n_out, "n_out")?;
        // NULL with no bytes to read is allowed, as `read(fd, NULL, 0)`
        // and `xio_write` allow it.
        if len > 0 {
            need_out(buf, "buf")?;
        }
        // SAFETY: per this function's contract.
        let s = unsafe { borrow(stream) }?;
        if len == 0 {
            // As Linux's read(2) on a socket: 0 at once, whatever the
            // stream's state (no wait, no error).
            // SAFETY: checked non-NULL.
            unsafe { put(n_out, 0) };
            return Ok(());
        }
        // SAFETY: buf is non-NULL and valid for len bytes (contract); we
        // only write it.
        let out = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len) };
        let mut r = s;
        let n = r.read(out)?;
        // SAFETY: checked non-NULL.
        unsafe { put(n_out, n) };
        Ok(())
    })
}

/// Writes `len` bytes from `buf`: a blocking stream writes them all
/// (waiting for the reader's window), a non-blocking one what fits now
/// (`XIO_ERR_WOULD_BLOCK` if nothing does); the count goes to `n_out`.
/// A blocking stream's write timeout (`xio_stream_set_timeouts`) that
/// passes after some of the bytes went ends the call with success and
/// their count in `n_out`, as `send` with `SO_SNDTIMEO` does (write the
/// rest again); `XIO_ERR_TIMED_OUT` means that nothing went. So does a
/// reset or shutdown that cuts the write short after some bytes went:
/// the next call reports it.
///
/// Thread-safe.
///
/// # Safety
/// `stream` is a live stream handle or NULL; `buf` valid for `len` bytes;
/// `n_out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_write(
    stream: *mut crate::XioStream,
    buf: *const c_void,
    len: usize,
    n_out: *mut usize,
) -> XioResult {
    let iov = XioIovec { base: buf, len };
    // SAFETY: forwarded contract; one slice.
    unsafe { xio_writev(stream, &iov, 1, n_out) }
}

/// Writes the slices in order as one byte sequence (header + body leave
/// in one pool buffer when they fit), as `xio_write` does.
///
/// # Safety
/// `stream` is a live stream handle or NULL; `iov` holds `iovcnt` slices,
/// each valid for its `len` bytes; `n_out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_writev(
    stream: *mut crate::XioStream,
    iov: *const XioIovec,
    iovcnt: usize,
    n_out: *mut usize,
) -> XioResult {
    guard(|| {
        need_out(n_out, "n_out")?;
        if iov.is_null() && iovcnt > 0 {
            return Err(Fail::null("iov"));
        }
        // SAFETY: per this function's contract.
        let s = unsafe { borrow(stream) }?;
        let mut slices = Vec::with_capacity(iovcnt);
        for i in 0..iovcnt {
            // SAFETY: i < iovcnt slices (contract).
            let v = unsafe { &*iov.add(i) };
            if v.base.is_null() && v.len > 0 {
                return Err(Fail::null("a slice's base"));
            }
            if v.len > 0 {
                // SAFETY: valid for len bytes (contract), read only.
                slices.push(IoSlice::new(unsafe {
                    std::slice::from_raw_parts(v.base.cast::<u8>(), v.len)
                }));
            }
        }
        let want: usize = slices.iter().map(|s| s.len()).sum();
        let mut done = 0;
        let mut w = s;
        if want == 0 {
            // A write of nothing still reports the stream's state (a
            // shut-down or reset stream fails), as `send` does: the
            // stream checks it (the loop below would not ask it at all).
            let _none: usize = w.write_vectored(&[])?;
        }
        let mut rest: &mut [IoSlice<'_>] = &mut slices;
        // A blocking stream writes everything (write_vectored may stop
        // between pool buffers); a non-blocking one reports what it took.
        while done < want {
            let n = match w.write_vectored(rest) {
                Ok(n) => n,
                // After some bytes went, a wait that ends (non-blocking
                // mode, or a blocking stream's write timeout, also
                // `WouldBlock` here) reports what went, as `send` does
                // with `SO_SNDTIMEO`: failing would hide from the caller
                // which bytes the peer will read. The next write reports
                // the wait.
                Err(e) if done > 0 && e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(e) => return Err(e.into()),
            };
            let whole = n == want - done;
            done += n;
            IoSlice::advance_slices(&mut rest, n);
            // A blocking write stops short only when something ended it
            // (the write timeout, or a reset after some bytes went, which
            // the next call reports, as a socket keeps its pending error):
            // report what went now, as `send` does.
            if s.is_nonblocking() || !whole {
                break;
            }
        }
        // SAFETY: checked non-NULL.
        unsafe { put(n_out, done) };
        Ok(())
    })
}

/// Shuts down reading (`XIO_SHUT_RD`), writing (`XIO_SHUT_WR`: the peer
/// reads end of stream) or both (`XIO_SHUT_RDWR`).
///
/// # Safety
/// `stream` is a live stream handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_shutdown(stream: *mut crate::XioStream, how: i32) -> XioResult {
    guard(|| {
        let how = match how {
            XIO_SHUT_RD => Shutdown::Read,
            XIO_SHUT_WR => Shutdown::Write,
            XIO_SHUT_RDWR => Shutdown::Both,
            _ => {
                return Err(Fail::new(
                    XIO_ERR_INVALID_ARGUMENT,
                    format!("{how} is not an XIO_SHUT_ value"),
                ))
            }
        };
        // SAFETY: per this function's contract.
        unsafe { borrow(stream) }?.shutdown(how)?;
        Ok(())
    })
}

/// Puts the stream in non-blocking mode (`on` != 0) or back.
///
/// # Safety
/// `stream` is a live stream handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_stream_set_nonblocking(
    stream: *mut crate::XioStream,
    on: i32,
) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        unsafe { borrow(stream) }?.set_nonblocking(on != 0)?;
        Ok(())
    })
}

/// Sets the read and write timeouts in milliseconds (<= 0: none). A
/// blocking read or write that waits longer fails with
/// `XIO_ERR_TIMED_OUT`, except a write that wrote some bytes first: it
/// succeeds with their count (see `xio_write`).
///
/// # Safety
/// `stream` is a live stream handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_stream_set_timeouts(
    stream: *mut crate::XioStream,
    read_ms: i32,
    write_ms: i32,
) -> XioResult {
    guard(|| {
        let d = |ms: i32| (ms > 0).then(|| std::time::Duration::from_millis(ms as u64));
        // SAFETY: per this function's contract.
        let s = unsafe { borrow(stream) }?;
        s.set_read_timeout(d(read_ms))?;
        s.set_write_timeout(d(write_ms))?;
        Ok(())
    })
}

/// The token `xio_net_poll` reports this stream's events with.
///
/// # Safety
/// `stream` is a live stream handle or NULL; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_stream_token(
    stream: *mut crate::XioStream,
    out: *mut u64,
) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let t = unsafe { borrow(stream) }?.token();
        // SAFETY: checked non-NULL.
        unsafe { put(out, t) };
        Ok(())
    })
}

/// Chooses the token `xio_net_poll` reports this stream's events with (as
/// `epoll_ctl`'s data does), for example an index into the caller's own
/// table. Events not yet returned carry the new token too. Keeping tokens
/// unique among the net's streams and listeners is the caller's business.
///
/// # Safety
/// `stream` is a live stream handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_stream_set_token(
    stream: *mut crate::XioStream,
    token: u64,
) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        unsafe { borrow(stream) }?.set_token(token);
        Ok(())
    })
}

/// The peer's address as `"ip:port"`, NUL-terminated, into `buf` of `cap`
/// bytes (64 is always enough; `XIO_ERR_INVALID_ARGUMENT` if too small).
/// `XIO_ERR_NOT_CONNECTED` once the connection was reset or refused, as
/// `getpeername` on a reset TCP socket.
///
/// # Safety
/// `stream` is a live stream handle or NULL; `buf` valid for `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn xio_stream_peer_addr(
    stream: *mut crate::XioStream,
    buf: *mut c_char,
    cap: usize,
) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let a = unsafe { borrow(stream) }?.peer_addr()?;
        // SAFETY: per this function's contract.
        unsafe { put_str(buf, cap, &a.to_string()) }
    })
}

/// This end's address as `"ip:port"` (a client's is made up by X-IO:
/// `127.88.x.y:port`, or `[::ffff:127.88.x.y]:port` when it dialled an
/// IPv6 address), as `xio_stream_peer_addr`.
///
/// # Safety
/// `stream` is a live stream handle or NULL; `buf` valid for `cap` bytes.
#[no_mangle]
pub unsafe extern "C" fn xio_stream_local_addr(
    stream: *mut crate::XioStream,
    buf: *mut c_char,
    cap: usize,
) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let a = unsafe { borrow(stream) }?.local_addr()?;
        // SAFETY: per this function's contract.
        unsafe { put_str(buf, cap, &a.to_string()) }
    })
}

/// A writable pool buffer of `len` bytes to fill and `xio_stream_send_buf`
/// (zero-copy writes). Waits while the pool is exhausted, up to the write
/// timeout (`XIO_ERR_TIMED_OUT`); a non-blocking stream says
/// `XIO_ERR_WOULD_BLOCK` instead. `XIO_ERR_TOO_LARGE` above the largest
/// class.
///
/// # Safety
/// `stream` is a live stream handle or NULL; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_stream_alloc(
    stream: *mut crate::XioStream,
    len: usize,
    out: *mut *mut XioBuf,
) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let b = unsafe { borrow(stream) }?.alloc(len)?;
        // SAFETY: checked non-NULL.
        unsafe { put(out, buf_out(BufState::Mut(b))) };
        Ok(())
    })
}

/// Sends a writable buffer as the next bytes of the stream, without
/// copying. On success the handle is gone; on failure (for example
/// `XIO_ERR_WOULD_BLOCK`) the buffer is still yours.
///
/// # Safety
/// `stream` and `buf` are live handles or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_stream_send_buf(
    stream: *mut crate::XioStream,
    buf: *mut XioBuf,
) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let s = unsafe { borrow(stream) }?;
        // SAFETY: per this function's contract.
        let state = unsafe { sendable(buf) }?;
        let b = state.take_mut("the buffer")?;
        match s.send_buf(b) {
            Ok(()) => {
                // SAFETY: the handle is live (checked) and now empty.
                unsafe { close_buf(buf) }?;
                Ok(())
            }
            Err((e, Some(back))) => {
                *state = BufState::Mut(back);
                Err(e.into())
            }
            Err((e, None)) => {
                // Not handed back: it is gone; so is the handle.
                // SAFETY: the handle is live (checked) and now empty.
                unsafe { close_buf(buf) }?;
                Err(e.into())
            }
        }
    })
}

/// Receives the next chunk of the stream as the pool buffer itself
/// (read-only, zero-copy): `*out` = NULL at end of stream. Mixes freely
/// with `xio_read`.
///
/// # Safety
/// `stream` is a live stream handle or NULL; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_stream_recv_buf(
    stream: *mut crate::XioStream,
    out: *mut *mut XioBuf,
) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let b = unsafe { borrow(stream) }?.recv_buf()?;
        let h = b.map_or(std::ptr::null_mut(), |b| buf_out(BufState::Ro(b)));
        // SAFETY: checked non-NULL.
        unsafe { put(out, h) };
        Ok(())
    })
}

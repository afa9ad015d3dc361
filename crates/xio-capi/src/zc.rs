//! The zero-copy interface (the paper's xio_malloc / xio_tx / xio_rx):
//! a stack per thread, pool buffers that move between processes without
//! copies, and received buffers that turn writable to forward in place.

use std::ffi::c_char;
use std::sync::atomic::{AtomicUsize, Ordering};

use xio_core::buf::{Buf, BufMut};
use xio_core::stack::{Error as StackError, PeerId, Stack};
use xio_core::wait::WaitMode;

use crate::error::*;
use crate::handle::*;

/// Another stack, as a stack sees it (from `xio_stack_connect`, or the
/// sender of a received buffer).
pub type XioPeer = u16;

/// Waiting mode: spin while spinning pays, then sleep (the default).
pub const XIO_WAIT_ADAPTIVE: i32 = 0;
/// Waiting mode: spin and never sleep (for a dedicated core).
pub const XIO_WAIT_BUSY_POLL: i32 = 1;
/// Waiting mode: sleep at once.
pub const XIO_WAIT_BLOCKING: i32 = 2;

pub(crate) struct StackInner {
    /// The thread using the stack ([`thread_mark`]), 0 when none: a stack
    /// is used by one thread at a time (see `claim`).
    owner: std::sync::Arc<AtomicUsize>,
    stack: std::cell::UnsafeCell<Stack>,
    /// A one-time notice (a peer's reset, the manager's end) that a burst
    /// met after its first buffers: the stack gave it to that burst, which
    /// returned its buffers instead, so the next receive call reports it
    /// (see `xio_recv_burst`). Used like `stack`, by its owner only.
    deferred: std::cell::UnsafeCell<Option<StackError>>,
}

/// Spare buffer handles a thread keeps at most.
const SPARE: usize = 64;

/// Closed handles' allocations, each reused as is (the boxes are the point).
#[allow(clippy::vec_box)]
type Spare = Vec<Box<Handle<BufState>>>;

thread_local! {
    /// The allocations of buffer handles closed on this thread (sent, or
    /// freed with `xio_buf_free`), reused for the next handles it hands
    /// out: a handle per message would otherwise cost a `malloc` and a
    /// `free` on a path whose whole round trip is a few hundred
    /// nanoseconds. Per thread, not per
    /// stack, so a program that only receives and frees reuses them too.
    static SPARE_BUFS: std::cell::RefCell<Spare> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Opaque for XioStack {
    type Inner = StackInner;
    const MAGIC: u64 = 0x7869_6f5f_7374_6b31; // "xio_stk1"
    const NAME: &'static str = "stack";
}

pub(crate) enum BufState {
    Mut(BufMut),
    Ro(Buf),
    /// Only while a call moves the buffer out and back.
    Moving,
}

impl BufState {
    /// Moves the writable buffer out (the state is `Moving` until the
    /// caller puts it back or closes the handle); a received one is
    /// refused and left as it was. `what` names it in the error.
    pub(crate) fn take_mut(&mut self, what: &str) -> Res<BufMut> {
        match std::mem::replace(self, BufState::Moving) {
            BufState::Mut(b) => Ok(b),
            other => {
                *self = other;
                Err(Fail::new(
                    XIO_ERR_READ_ONLY,
                    format!("{what} is a received buffer: xio_buf_make_writable it first"),
                ))
            }
        }
    }
}

impl Opaque for XioBuf {
    type Inner = BufState;
    const MAGIC: u64 = 0x7869_6f5f_6275_6631; // "xio_buf1"
    const NAME: &'static str = "buf";
}

/// The buffer behind `p`, to be sent: refused with `XIO_ERR_FORKED` when
/// the handle was inherited across `fork()`. The parent still holds that
/// buffer (and frees or sends it); a new stack of the child, of the same
/// pool, would pass the pool check and hand a peer the parent's buffer.
///
/// # Safety
/// As [`borrow_mut`].
pub(crate) unsafe fn sendable<'a>(p: *mut XioBuf) -> Res<&'a mut BufState> {
    // SAFETY: forwarded contract.
    let state = unsafe { borrow_mut(p) }?;
    // SAFETY: a live buffer handle (borrowed above).
    if unsafe { made_before_fork(p) } {
        return Err(StackError::Forked.into());
    }
    Ok(state)
}

/// A new handle for a buffer handed to C, in a spare allocation if this
/// thread has one.
fn new_buf(state: BufState) -> *mut XioBuf {
    match SPARE_BUFS.try_with(|s| s.borrow_mut().pop()).ok().flatten() {
        Some(b) => reuse_handle::<XioBuf>(b, state),
        None => into_handle::<XioBuf>(state),
    }
}

/// Closes a buffer handle (its buffer, if any, goes back to the pool) and
/// keeps its allocation for the next handle.
///
/// # Safety
/// `buf` is NULL or a buffer handle no other thread uses, not used after.
pub(crate) unsafe fn close_buf(buf: *mut XioBuf) -> Res<()> {
    if buf.is_null() {
        return Ok(()); // like free(NULL)
    }
    // SAFETY: per the caller, and not NULL.
    let mut b = unsafe { take_box(buf) }?;
    // Drops the buffer before the spare list is borrowed.
    b.inner = BufState::Moving;
    // At thread exit (list already gone) the box is simply freed.
    let _ = SPARE_BUFS.try_with(|s| {
        let mut s = s.borrow_mut();
        if s.len() < SPARE {
            s.push(b);
        }
    });
    Ok(())
}

/// The stack, for the length of one call.
struct Using<'a> {
    inner: &'a StackInner,
    /// Give the stack back when the call ends (a setup call that found it
    /// unowned); data-path calls keep it (see `claim`).
    release: bool,
}

thread_local! {
    /// Its address identifies the thread (no allocation, no destructor).
    static MARK: u8 = const { 0 };
}

/// A number unique to the calling thread among running threads.
fn thread_mark() -> usize {
    MARK.with(|m| m as *const u8 as usize)
}

/// The stacks a thread has claimed: released when the thread exits, so a
/// thread that ends without `xio_stack_release` does not leave its
/// stacks owned by nobody alive.
struct Claims {
    me: usize,
    owners: Vec<std::sync::Arc<AtomicUsize>>,
}

impl Drop for Claims {
    fn drop(&mut self) {
        for o in &self.owners {
            // Release: this thread's writes to the stack happen before the
            // next owner's claim. Fails (leaving it) if it changed hands.
            let _ = o.compare_exchange(self.me, 0, Ordering::Release, Ordering::Relaxed);
        }
    }
}

thread_local! {
    static CLAIMS: std::cell::RefCell<Claims> = std::cell::RefCell::new(Claims {
        me: thread_mark(),
        owners: Vec::new(),
    });
}

/// Records that this thread owns `owner` until it releases it or exits.
/// False while the thread exits (its list already gone): nothing would
/// release the claim then, so the caller must not keep it.
fn remember_claim(owner: &std::sync::Arc<AtomicUsize>) -> bool {
    CLAIMS
        .try_with(|c| {
            let mut c = c.borrow_mut();
            // Forget stacks that were closed since.
            c.owners.retain(|o| std::sync::Arc::strong_count(o) > 1);
            // A stack claimed again after `xio_stack_release` is listed once
            // (a list growing per claim would also make each claim slower).
            if !c.owners.iter().any(|o| std::sync::Arc::ptr_eq(o, owner)) {
                c.owners.push(owner.clone());
            }
        })
        .is_ok()
}

impl Using<'_> {
    fn stack(&mut self) -> &mut Stack {
        // SAFETY: `owner` is this thread (checked or claimed in `using`),
        // so no other thread touches the stack until it is released.
        unsafe { &mut *self.inner.stack.get() }
    }

    /// The notice a burst left for the next receive call, taken; none in
    /// a process `forked` from the stack's (the notice is the parent's,
    /// and the stack itself reports the fork).
    fn take_deferred(&mut self, forked: bool) -> Option<StackError> {
        if forked {
            return None;
        }
        // SAFETY: as in `stack`: only the owning thread touches it.
        unsafe { &mut *self.inner.deferred.get() }.take()
    }

    /// Leaves `e` for the next receive call.
    fn defer(&mut self, e: StackError) {
        // SAFETY: as in `stack`: only the owning thread touches it.
        unsafe { *self.inner.deferred.get() = Some(e) };
    }
}

impl Drop for Using<'_> {
    fn drop(&mut self) {
        if self.release {
            self.inner.owner.store(0, Ordering::Release);
        }
    }
}

/// The stack for one call by this thread: its owner's calls go straight
/// through (a thread-local address compare, no atomic read-modify-write on
/// the data path); a stack nobody owns is claimed, for this call only
/// (`sticky` false: setup calls) or until `xio_stack_release` (`sticky`:
/// alloc, send and receive, so the thread that moves the data owns the
/// stack). Another thread's call fails with `XIO_ERR_BUSY`.
///
/// # Safety
/// `p` is NULL or a stack handle not closed meanwhile.
unsafe fn using<'a>(p: *mut XioStack, sticky: bool) -> Res<Using<'a>> {
    // SAFETY: forwarded contract.
    let inner = unsafe { borrow(p) }?;
    let me = thread_mark();
    let owner = inner.owner.load(Ordering::Relaxed);
    if owner == me {
        return Ok(Using {
            inner,
            release: false,
        });
    }
    // Acquire: pairs with the Release that gave the stack up, so the
    // previous owner's writes to it are visible to us.
    if owner == 0
        && inner
            .owner
            .compare_exchange(0, me, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    {
        // A claim made while the thread exits (from a thread-specific data
        // destructor that runs after its list of claims is gone) lasts
        // for this call only: kept, it would outlive the thread.
        let keep = sticky && remember_claim(&inner.owner);
        return Ok(Using {
            inner,
            release: !keep,
        });
    }
    // SAFETY: a live stack handle (borrowed above).
    if unsafe { made_before_fork(p) } {
        // Owned by a thread of the parent, which the child does not have.
        return Err(StackError::Forked.into());
    }
    Err(Fail::new(
        XIO_ERR_BUSY,
        "the stack is in use by another thread: a stack is used by one thread at a time \
         (the thread that sends and receives on it owns it until it calls xio_stack_release)",
    ))
}

/// Gives up this thread's ownership of the stack, so another thread can
/// use it (a thread owns a stack from its first alloc, send or receive
/// until it calls this or exits).
/// `XIO_ERR_BUSY` if another thread owns it; a no-op if nobody does.
///
/// # Safety
/// `stack` is a live stack handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_stack_release(stack: *mut XioStack) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let inner = unsafe { borrow(stack) }?;
        let me = thread_mark();
        match inner.owner.load(Ordering::Relaxed) {
            0 => Ok(()),
            o if o == me => {
                // Release: our writes to the stack happen before the next
                // owner's claim.
                inner.owner.store(0, Ordering::Release);
                Ok(())
            }
            // SAFETY: a live stack handle (borrowed above).
            _ if unsafe { made_before_fork(stack) } => Err(StackError::Forked.into()),
            _ => Err(Fail::new(
                XIO_ERR_BUSY,
                "another thread owns the stack; only it can release it",
            )),
        }
    })
}

/// Attaches a new stack to the pool `prefix` (the manager must run:
/// `xio-manager --prefix <prefix>`). Close it with `xio_stack_close`.
///
/// Thread-safe. The stack itself is used by one thread at a time: the
/// first thread to alloc, send or receive on it owns it (until it calls
/// `xio_stack_release` or exits), and calls from other threads fail with
/// `XIO_ERR_BUSY` instead of racing. Setup calls (bind, connect, wait
/// mode, id) work from any thread while nobody owns it.
///
/// # Safety
/// `prefix` is a NUL-terminated string; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_stack_attach(
    prefix: *const c_char,
    out: *mut *mut XioStack,
) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let prefix = unsafe { str_arg(prefix, "prefix") }?;
        let stack = Stack::attach(prefix)?;
        let h = into_handle::<XioStack>(StackInner {
            owner: std::sync::Arc::new(AtomicUsize::new(0)),
            stack: std::cell::UnsafeCell::new(stack),
            deferred: std::cell::UnsafeCell::new(None),
        });
        // SAFETY: checked non-NULL above.
        unsafe { put(out, h) };
        Ok(())
    })
}

/// Detaches and frees the stack (NULL is a no-op). Buffers it allocated or
/// received stay valid until freed. Peers see their connections reset.
///
/// Not thread-safe: no other call may use the stack meanwhile or after.
///
/// # Safety
/// `stack` is NULL or a stack handle, not used after this call.
#[no_mangle]
pub unsafe extern "C" fn xio_stack_close(stack: *mut XioStack) -> XioResult {
    // SAFETY: per this function's contract.
    guard(|| unsafe { take(stack) }.map(drop))
}

/// This stack's id (what peers see as its `xio_peer`).
///
/// # Safety
/// `stack` is a live stack handle (or NULL); `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_stack_id(stack: *mut XioStack, out: *mut XioPeer) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let mut s = unsafe { using(stack, false) }?;
        let id = s.stack().id().slot();
        // SAFETY: checked non-NULL.
        unsafe { put(out, id) };
        Ok(())
    })
}

/// Sets how `xio_recv` (and sends into a full ring, and allocations from
/// an empty pool) wait: `XIO_WAIT_ADAPTIVE` (default), `XIO_WAIT_BUSY_POLL`
/// or `XIO_WAIT_BLOCKING`.
///
/// # Safety
/// `stack` is a live stack handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_stack_set_wait_mode(stack: *mut XioStack, mode: i32) -> XioResult {
    guard(|| {
        let m = match mode {
            XIO_WAIT_ADAPTIVE => WaitMode::Adaptive,
            XIO_WAIT_BUSY_POLL => WaitMode::BusyPoll,
            XIO_WAIT_BLOCKING => WaitMode::Blocking,
            _ => {
                return Err(Fail::new(
                    XIO_ERR_INVALID_ARGUMENT,
                    format!("{mode} is not an XIO_WAIT_ mode"),
                ))
            }
        };
        // SAFETY: per this function's contract.
        unsafe { using(stack, false) }?.stack().set_wait_mode(m);
        Ok(())
    })
}

/// Copy on receive (FABLE's safe mode), on when `on` is non-zero: each
/// message `xio_recv` and its kin return from now on is a copy in this
/// process's memory, and its pool buffer goes back at once, so nothing
/// its sender (or any process that can write the pool) does after sending
/// changes what the receiver reads. Off by default (zero-copy). Buffers
/// received before keep the mode they came in. A copy made writable and
/// sent on is copied into a pool buffer first.
///
/// # Safety
/// `stack` is a live stack handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_stack_set_copy_on_receive(stack: *mut XioStack, on: i32) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        unsafe { using(stack, false) }?
            .stack()
            .set_copy_on_receive(on != 0);
        Ok(())
    })
}

/// Binds the address `"ip:port"` to this stack: peers that
/// `xio_stack_connect` to it reach this stack.
///
/// # Safety
/// `stack` is a live stack handle or NULL; `addr` a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn xio_stack_bind(stack: *mut XioStack, addr: *const c_char) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let a = unsafe { addr_arg(addr) }?;
        // SAFETY: per this function's contract.
        unsafe { using(stack, false) }?.stack().bind(a)?;
        Ok(())
    })
}

/// Opens a channel to the stack bound to `"ip:port"` (through the
/// manager, once per peer) and gives its peer id.
/// `XIO_ERR_CONNECTION_REFUSED` when no stack binds it,
/// `XIO_ERR_PEER_BUSY` when one does but does not read its control
/// socket.
///
/// # Safety
/// `stack` is a live stack handle or NULL; `addr` a NUL-terminated string;
/// `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_stack_connect(
    stack: *mut XioStack,
    addr: *const c_char,
    out: *mut XioPeer,
) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let a = unsafe { addr_arg(addr) }?;
        // SAFETY: per this function's contract.
        let peer = unsafe { using(stack, false) }?.stack().connect(a)?;
        // SAFETY: checked non-NULL.
        unsafe { put(out, peer.slot()) };
        Ok(())
    })
}

/// A writable pool buffer of `len` bytes (the smallest class that fits).
/// Waits while the pool is exhausted (per the wait mode);
/// `XIO_ERR_TOO_LARGE` above the largest class.
///
/// # Safety
/// `stack` is a live stack handle or NULL; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_alloc(
    stack: *mut XioStack,
    len: usize,
    out: *mut *mut XioBuf,
) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let mut s = unsafe { using(stack, true) }?;
        let b = s.stack().alloc(len)?;
        let h = new_buf(BufState::Mut(b));
        // SAFETY: checked non-NULL.
        unsafe { put(out, h) };
        Ok(())
    })
}

/// Sends `buf` to `peer` without copying it: on success the buffer belongs
/// to the peer and the handle is gone (do not free it). On failure
/// nothing changed and the buffer is still yours. Waits while the ring is
/// full (per the wait mode); `XIO_ERR_CONNECTION_RESET` if the peer died.
/// Only writable buffers can be sent (`XIO_ERR_READ_ONLY`); a buffer goes
/// out through a stack of the pool that allocated or received it (one of
/// another pool, another prefix, fails with `XIO_ERR_INVALID_ARGUMENT`).
///
/// # Safety
/// `stack` and `buf` are live handles (or NULL).
#[no_mangle]
pub unsafe extern "C" fn xio_send(
    stack: *mut XioStack,
    peer: XioPeer,
    buf: *mut XioBuf,
) -> XioResult {
    // SAFETY: forwarded contract.
    unsafe { xio_send_tagged(stack, peer, 0, buf) }
}

/// `xio_send` with a tag the receiver gets from `xio_recv_tagged`.
///
/// # Safety
/// As `xio_send`.
#[no_mangle]
pub unsafe extern "C" fn xio_send_tagged(
    stack: *mut XioStack,
    peer: XioPeer,
    tag: u32,
    buf: *mut XioBuf,
) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let mut s = unsafe { using(stack, true) }?;
        // SAFETY: per this function's contract.
        let state = unsafe { sendable(buf) }?;
        let b = state.take_mut("the buffer")?;
        match s.stack().send_or_return(PeerId::new(peer, 0), tag, b) {
            Ok(()) => {
                // SAFETY: the handle is live (checked) and now empty.
                let _ = unsafe { close_buf(buf) };
                Ok(())
            }
            Err((e, back)) => {
                *state =
                    BufState::Mut(back.expect("send_or_return hands back what it did not send"));
                Err(e.into())
            }
        }
    })
}

/// Receives the next buffer sent to this stack (from any peer), read-only,
/// with its sender. `timeout_ms` < 0 waits as long as it takes (per the
/// wait mode), 0 does not wait (`XIO_ERR_WOULD_BLOCK`), > 0 waits at most
/// that long (`XIO_ERR_TIMED_OUT`). A peer that died is reported once as
/// `XIO_ERR_CONNECTION_RESET`, after the buffers it sent before. A manager
/// that went away is reported once as `XIO_ERR_MANAGER_GONE` (by this or
/// whichever call of the stack learns it first): not fatal, channels
/// already made keep working, so a service may carry on receiving (see
/// `XIO_ERR_MANAGER_GONE`).
///
/// # Safety
/// `stack` is a live stack handle or NULL; `buf_out` and `from_out` are
/// valid for writes (`from_out` may be NULL).
#[no_mangle]
pub unsafe extern "C" fn xio_recv(
    stack: *mut XioStack,
    timeout_ms: i32,
    buf_out: *mut *mut XioBuf,
    from_out: *mut XioPeer,
) -> XioResult {
    // SAFETY: forwarded contract; no tag wanted.
    unsafe { xio_recv_tagged(stack, timeout_ms, buf_out, from_out, std::ptr::null_mut()) }
}

/// `xio_recv` that also gives the sender's tag (`tag_out` may be NULL).
///
/// # Safety
/// As `xio_recv`; `tag_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_recv_tagged(
    stack: *mut XioStack,
    timeout_ms: i32,
    buf_out: *mut *mut XioBuf,
    from_out: *mut XioPeer,
    tag_out: *mut u32,
) -> XioResult {
    guard(|| {
        need_out(buf_out, "buf_out")?;
        // SAFETY: per this function's contract.
        let mut s = unsafe { using(stack, true) }?;
        // SAFETY: a live stack handle (borrowed by `using`).
        if let Some(e) = s.take_deferred(unsafe { made_before_fork(stack) }) {
            return Err(e.into());
        }
        let st = s.stack();
        let m = match timeout_arg(timeout_ms) {
            Timeout::Forever => st.recv(),
            Timeout::NoWait => st.try_recv(),
            Timeout::Ms(d) => st.recv_timeout(d),
        }?;
        // SAFETY: checked non-NULL; the optional ones are checked here.
        unsafe {
            if !from_out.is_null() {
                put(from_out, m.from.slot());
            }
            if !tag_out.is_null() {
                put(tag_out, m.tag);
            }
            put(buf_out, new_buf(BufState::Ro(m.buf)));
        }
        Ok(())
    })
}

/// Receives up to `cap` buffers at once (the burst path of network
/// functions): waits for the first as `xio_recv` does with `timeout_ms`,
/// then takes what is ready without waiting. Writes the buffers to
/// `bufs[0..n]`, their senders to `froms[0..n]` (`froms` may be NULL) and
/// `n` to `n_out`. A dead peer's reset, and the manager's end, are
/// reported as `xio_recv` does, when they come first; after some buffers
/// they end the burst and are reported by the next receive call on the
/// stack (`xio_recv`, `xio_recv_tagged` or `xio_recv_burst`), at once.
/// `cap` 0 is `XIO_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `stack` is a live stack handle or NULL; `bufs` (and `froms`, unless
/// NULL) hold `cap` entries; `n_out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_recv_burst(
    stack: *mut XioStack,
    timeout_ms: i32,
    bufs: *mut *mut XioBuf,
    froms: *mut XioPeer,
    cap: usize,
    n_out: *mut usize,
) -> XioResult {
    guard(|| {
        need_out(bufs, "bufs")?;
        need_out(n_out, "n_out")?;
        if cap == 0 {
            return Err(Fail::new(XIO_ERR_INVALID_ARGUMENT, "cap is 0"));
        }
        // SAFETY: per this function's contract.
        let mut s = unsafe { using(stack, true) }?;
        // SAFETY: a live stack handle (borrowed by `using`).
        if let Some(e) = s.take_deferred(unsafe { made_before_fork(stack) }) {
            return Err(e.into());
        }
        let st = s.stack();
        let first = match timeout_arg(timeout_ms) {
            Timeout::Forever => st.recv(),
            Timeout::NoWait => st.try_recv(),
            Timeout::Ms(d) => st.recv_timeout(d),
        }?;
        let mut got = vec![first];
        while got.len() < cap {
            match s.stack().try_recv() {
                Ok(m) => got.push(m),
                Err(StackError::WouldBlock) => break,
                // The stack reports a reset or the manager's end once, and
                // just did: keep it for the next call (the stack cannot
                // take it back), which reports it before anything that
                // came after it.
                Err(e) => {
                    s.defer(e);
                    break;
                }
            }
        }
        let n = got.len();
        for (i, m) in got.into_iter().enumerate() {
            // SAFETY: i < n <= cap entries (contract).
            unsafe {
                if !froms.is_null() {
                    froms.add(i).write(m.from.slot());
                }
                bufs.add(i).write(new_buf(BufState::Ro(m.buf)));
            }
        }
        // SAFETY: checked non-NULL.
        unsafe { put(n_out, n) };
        Ok(())
    })
}

/// Sends `n` writable buffers to `peer`, in order, with one check of the
/// peer's doorbell at the end (the burst path). Waits while the ring is
/// full, per the wait mode. Each buffer sent is consumed and its entry in
/// `bufs` set to NULL. On failure the buffers from the first unsent one
/// on are untouched and still yours, and — the one exception to "nothing
/// written on failure" — `sent_out` (if not NULL) says how many went.
/// A read-only buffer or one of another pool anywhere fails the call
/// before anything is sent.
///
/// # Safety
/// `stack` is a live stack handle or NULL; `bufs` holds `n` live buffer
/// handles; `sent_out` is NULL or valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_send_burst(
    stack: *mut XioStack,
    peer: XioPeer,
    bufs: *mut *mut XioBuf,
    n: usize,
    sent_out: *mut usize,
) -> XioResult {
    let mut sent = 0usize;
    let r = guard(|| {
        if n == 0 {
            // Nothing to send, but the handle is checked all the same.
            // SAFETY: per this function's contract.
            unsafe { borrow(stack) }?;
            return Ok(());
        }
        need_out(bufs, "bufs")?;
        // SAFETY: per this function's contract.
        let mut s = unsafe { using(stack, true) }?;
        // Check every handle first: a failure here changes nothing. The
        // same handle twice would be two owners of one buffer.
        // SAFETY: `bufs` holds `n` entries (contract).
        let mut ptrs: Vec<*mut XioBuf> = unsafe { std::slice::from_raw_parts(bufs, n) }.to_vec();
        ptrs.sort_unstable();
        if ptrs.windows(2).any(|w| w[0] == w[1]) {
            return Err(Fail::new(
                XIO_ERR_INVALID_ARGUMENT,
                "the same buffer appears twice in bufs",
            ));
        }
        let mut states = Vec::with_capacity(n);
        for i in 0..n {
            // SAFETY: i < n entries (contract).
            let h = unsafe { *bufs.add(i) };
            // SAFETY: a live buffer handle per the contract (checked).
            let st = unsafe { sendable(h) }?;
            if !matches!(st, BufState::Mut(_)) {
                return Err(Fail::new(
                    XIO_ERR_READ_ONLY,
                    format!("bufs[{i}] is a received buffer: xio_buf_make_writable it first"),
                ));
            }
            states.push(st);
        }
        let mut out: Vec<BufMut> = states
            .iter_mut()
            .map(|st| st.take_mut("a buffer").expect("checked above"))
            .collect();
        let r = s.stack().send_burst(PeerId::new(peer, 0), &mut out);
        // `send_burst` drains what it sent from the front.
        sent = n - out.len();
        for (st, b) in states.iter_mut().skip(sent).zip(out) {
            **st = BufState::Mut(b);
        }
        for i in 0..sent {
            // SAFETY: i < n entries; the handle is live and now empty.
            unsafe {
                let _ = close_buf(*bufs.add(i));
                bufs.add(i).write(std::ptr::null_mut());
            }
        }
        r.map_err(Fail::from)
    });
    if !sent_out.is_null() {
        // SAFETY: non-NULL, valid for a write per the contract.
        unsafe { sent_out.write(sent) };
    }
    r
}

/// The buffer's payload: its address and length (read-only or writable).
/// The pointer stays valid until the buffer is sent or freed.
///
/// Not thread-safe per buffer (a buffer is used by one thread at a time).
///
/// # Safety
/// `buf` is a live buffer handle or NULL; the out-pointers valid for writes.
#[no_mangle]
pub unsafe extern "C" fn xio_buf_data(
    buf: *mut XioBuf,
    data_out: *mut *const u8,
    len_out: *mut usize,
) -> XioResult {
    guard(|| {
        need_out(data_out, "data_out")?;
        need_out(len_out, "len_out")?;
        // SAFETY: per this function's contract.
        let (p, n) = match unsafe { borrow_mut(buf) }? {
            BufState::Mut(b) => (b.as_ptr(), b.len()),
            BufState::Ro(b) => (b.as_ptr(), b.len()),
            BufState::Moving => unreachable!("only inside a call"),
        };
        // SAFETY: checked non-NULL.
        unsafe {
            put(data_out, p);
            put(len_out, n);
        }
        Ok(())
    })
}

/// A writable buffer's memory: its address and capacity (its class, at
/// least the length asked for). Write the payload, then
/// `xio_buf_set_len`. `XIO_ERR_READ_ONLY` for a received buffer;
/// `XIO_ERR_FORKED` for one inherited across `fork()` (its memory is the
/// parent's buffer, shared, not copied).
///
/// # Safety
/// `buf` is a live buffer handle or NULL; the out-pointers valid for writes.
#[no_mangle]
pub unsafe extern "C" fn xio_buf_mut(
    buf: *mut XioBuf,
    data_out: *mut *mut u8,
    capacity_out: *mut usize,
) -> XioResult {
    guard(|| {
        need_out(data_out, "data_out")?;
        need_out(capacity_out, "capacity_out")?;
        // SAFETY: per this function's contract.
        let BufState::Mut(b) = unsafe { borrow_mut(buf) }? else {
            return Err(Fail::new(
                XIO_ERR_READ_ONLY,
                "a received buffer is read-only",
            ));
        };
        // SAFETY: a live buffer handle (borrowed above).
        if unsafe { made_before_fork(buf) } {
            return Err(StackError::Forked.into());
        }
        let full = b.as_full_mut();
        // SAFETY: checked non-NULL.
        unsafe {
            put(data_out, full.as_mut_ptr());
            put(capacity_out, full.len());
        }
        Ok(())
    })
}

/// Sets a writable buffer's payload length (at most its capacity).
///
/// # Safety
/// `buf` is a live buffer handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_buf_set_len(buf: *mut XioBuf, len: usize) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let BufState::Mut(b) = unsafe { borrow_mut(buf) }? else {
            return Err(Fail::new(
                XIO_ERR_READ_ONLY,
                "a received buffer is read-only",
            ));
        };
        if len > b.capacity() {
            return Err(Fail::new(
                XIO_ERR_INVALID_ARGUMENT,
                format!("length {len} beyond the buffer's capacity {}", b.capacity()),
            ));
        }
        b.set_len(len);
        Ok(())
    })
}

/// Turns a received buffer into a writable one in place, without a new
/// allocation or a copy (the L2-forwarder pattern: receive, rewrite a
/// header, send on). A no-op for a buffer that is already writable. (A
/// stream chunk from `xio_stream_recv_buf` that `xio_read` had taken bytes
/// from first has the rest moved to the front of its memory.)
/// `XIO_ERR_FORKED` for a received buffer inherited across `fork()` (its
/// memory is the parent's buffer, shared, not copied).
///
/// # Safety
/// `buf` is a live buffer handle or NULL.
#[no_mangle]
pub unsafe extern "C" fn xio_buf_make_writable(buf: *mut XioBuf) -> XioResult {
    guard(|| {
        // SAFETY: per this function's contract.
        let state = unsafe { borrow_mut(buf) }?;
        if matches!(state, BufState::Ro(_)) {
            // The move to the front would rewrite the parent's bytes.
            // SAFETY: a live buffer handle (borrowed above).
            if unsafe { made_before_fork(buf) } {
                return Err(StackError::Forked.into());
            }
            if let BufState::Ro(b) = std::mem::replace(state, BufState::Moving) {
                *state = BufState::Mut(b.into_mut());
            }
        }
        Ok(())
    })
}

/// Returns the buffer to the pool (NULL is a no-op).
///
/// # Safety
/// `buf` is NULL or a buffer handle, not used after this call.
#[no_mangle]
pub unsafe extern "C" fn xio_buf_free(buf: *mut XioBuf) -> XioResult {
    // SAFETY: per this function's contract.
    guard(|| unsafe { close_buf(buf) })
}

pub(crate) fn buf_out(state: BufState) -> *mut XioBuf {
    new_buf(state)
}

#[cfg(test)]
#[path = "../../xio-core/tests/common/process_dir.rs"]
mod process_dir;

#[cfg(test)]
mod tests {
    use super::*;

    /// How many stacks this thread's claim list holds.
    fn claims_held() -> usize {
        CLAIMS.with(|c| c.borrow().owners.len())
    }

    /// A thread that takes a stack, gives it back and takes it again
    /// (handing it between threads, one request at a time) keeps one
    /// entry for it, not one per claim.
    #[test]
    fn claiming_a_stack_again_keeps_one_claim() {
        let dir = process_dir::process_dir("xio-capi-unit");
        std::env::set_var("XIO_RUN_DIR", &dir);
        let prefix = format!("unit-claims-{}", std::process::id());
        let _m = xio_core::Manager::builder(&prefix).spawn().unwrap();
        let p = std::ffi::CString::new(prefix).unwrap();
        let mut s = std::ptr::null_mut();
        // SAFETY: valid arguments; `s` is used by this thread only and
        // closed at the end; each buffer is freed once.
        unsafe {
            assert_eq!(xio_stack_attach(p.as_ptr(), &mut s), XIO_OK);
            for _ in 0..100 {
                let mut b = std::ptr::null_mut();
                assert_eq!(xio_alloc(s, 8, &mut b), XIO_OK);
                assert_eq!(xio_buf_free(b), XIO_OK);
                assert_eq!(xio_stack_release(s), XIO_OK);
            }
            assert_eq!(claims_held(), 1, "one stack, claimed 100 times");
            assert_eq!(xio_stack_close(s), XIO_OK);
        }
    }
}

//! Opaque handles: what C holds is a pointer to a boxed [`Handle`] whose
//! first field is a per-type magic number, so NULL, a handle of another
//! type, or (while its memory is not reused) a closed handle is an error
//! code instead of undefined behaviour.

use std::ffi::{c_char, CStr};
use std::net::SocketAddr;

use crate::error::{Fail, Res, XIO_ERR_FORKED, XIO_ERR_INVALID_ARGUMENT, XIO_ERR_INVALID_HANDLE};

/// A stack attached to a pool: the zero-copy interface.
pub struct XioStack {
    _opaque: [u8; 0],
}

/// A pool buffer: writable (allocated, or made writable) or read-only
/// (received).
pub struct XioBuf {
    _opaque: [u8; 0],
}

/// A socket-interface attachment to a pool (listeners and streams).
pub struct XioNet {
    _opaque: [u8; 0],
}

/// A listening address.
pub struct XioListener {
    _opaque: [u8; 0],
}

/// A byte stream (a connection).
pub struct XioStream {
    _opaque: [u8; 0],
}

/// A manager running on a thread of this process (`xio_manager_spawn`).
pub struct XioManager {
    _opaque: [u8; 0],
}

/// What a handle pointer points to. `repr(C)` puts the magic first, so
/// checking it reads only the first 8 bytes of whatever C passed.
#[repr(C)]
pub(crate) struct Handle<T> {
    magic: u64,
    /// The fork generation of the process that made the handle
    /// (`xio_core::fork::generation`), for [`Opaque::FORKED_REFUSED`].
    born: u32,
    pub(crate) inner: T,
}

/// Written over the magic when a handle is closed.
const DEAD: u64 = 0xdead_dead_dead_dead;

/// An opaque C type and what its handle holds.
pub(crate) trait Opaque: Sized {
    type Inner;
    const MAGIC: u64;
    const NAME: &'static str;
    /// In a forked child, calls on an inherited handle of this type fail
    /// with `XIO_ERR_FORKED` before they reach its inner value, and
    /// closing it forgets that value instead of dropping it: a net (and
    /// its listeners and streams) is behind a lock that another thread of
    /// the parent may have held at the fork, which the child's copy then
    /// keeps taken for ever. (Stacks and buffers report a fork
    /// themselves, and take no such lock.)
    const FORKED_REFUSED: bool = false;
}

/// Boxes `inner` into a new handle for C.
pub(crate) fn into_handle<O: Opaque>(inner: O::Inner) -> *mut O {
    Box::into_raw(Box::new(Handle {
        magic: O::MAGIC,
        born: xio_core::fork::generation(),
        inner,
    }))
    .cast()
}

/// Whether the handle `h` (checked live) was inherited across `fork()`
/// and is of a type refused then.
///
/// # Safety
/// `h` is a live handle of type `O`.
unsafe fn inherited<O: Opaque>(h: *mut Handle<O::Inner>) -> bool {
    // SAFETY: per the caller.
    O::FORKED_REFUSED && unsafe { (*h).born } != xio_core::fork::generation()
}

/// Whether the live handle `p` was made before this process was forked
/// from its maker (whatever its type).
///
/// # Safety
/// `p` is a live handle of type `O` (checked by a borrow).
pub(crate) unsafe fn made_before_fork<O: Opaque>(p: *mut O) -> bool {
    // SAFETY: per the caller.
    unsafe { (*p.cast::<Handle<O::Inner>>()).born != xio_core::fork::generation() }
}

fn check<O: Opaque>(p: *mut O) -> Res<*mut Handle<O::Inner>> {
    let h = check_magic(p)?;
    // SAFETY: a live handle of type O (its magic says so).
    if unsafe { inherited::<O>(h) } {
        return Err(Fail::new(
            XIO_ERR_FORKED,
            format!(
                "this xio_{} was inherited across fork(): attach anew in the child",
                O::NAME
            ),
        ));
    }
    Ok(h)
}

fn check_magic<O: Opaque>(p: *mut O) -> Res<*mut Handle<O::Inner>> {
    if p.is_null() {
        return Err(Fail::null(O::NAME));
    }
    let h = p.cast::<Handle<O::Inner>>();
    // SAFETY: the caller promised `p` came from `into_handle` for some
    // handle type; every handle starts with the u64 magic (repr(C)), so
    // reading it stays inside the allocation whatever type it really is.
    let magic = unsafe { std::ptr::addr_of!((*h).magic).read() };
    if magic != O::MAGIC {
        return Err(Fail::new(
            XIO_ERR_INVALID_HANDLE,
            format!("not a live xio_{} handle", O::NAME),
        ));
    }
    Ok(h)
}

/// The handle behind `p`, shared.
///
/// # Safety
/// `p` is NULL or a pointer returned by this library; the handle is not
/// closed while the reference lives.
pub(crate) unsafe fn borrow<'a, O: Opaque>(p: *mut O) -> Res<&'a O::Inner> {
    let h = check(p)?;
    // SAFETY: checked live handle of type O (per the caller's contract).
    Ok(unsafe { &(*h).inner })
}

/// The handle behind `p`, exclusive.
///
/// # Safety
/// As [`borrow`], and no other thread uses the handle meanwhile (the
/// documented contract of the handle types borrowed this way).
pub(crate) unsafe fn borrow_mut<'a, O: Opaque>(p: *mut O) -> Res<&'a mut O::Inner> {
    let h = check(p)?;
    // SAFETY: checked live handle, used by this thread alone.
    Ok(unsafe { &mut (*h).inner })
}

/// Closes the handle behind `p` (NULL is a no-op) and returns what it held.
///
/// # Safety
/// As [`borrow_mut`]; `p` is not used again.
pub(crate) unsafe fn take<O: Opaque>(p: *mut O) -> Res<Option<O::Inner>> {
    if p.is_null() {
        return Ok(None);
    }
    let h = check_magic(p)?;
    // SAFETY: a live handle from `into_handle` (a Box), used by us alone;
    // marking it dead first lets a later double close be caught while the
    // memory is not reused.
    unsafe {
        (*h).magic = DEAD;
        let inherited = inherited::<O>(h);
        let inner = Box::from_raw(h).inner;
        if inherited {
            // The parent's: dropping it could wait for ever on its lock.
            std::mem::forget(inner);
            return Ok(None);
        }
        Ok(Some(inner))
    }
}

/// Closes the handle behind `p` like [`take`] but keeps its allocation,
/// to be reused by [`reuse_handle`] (a buffer handle per message would
/// otherwise cost a `malloc` and a `free`).
///
/// # Safety
/// As [`take`]; `p` is not NULL.
pub(crate) unsafe fn take_box<O: Opaque>(p: *mut O) -> Res<Box<Handle<O::Inner>>> {
    let h = check_magic(p)?;
    // SAFETY: as in `take`.
    unsafe {
        (*h).magic = DEAD;
        Ok(Box::from_raw(h))
    }
}

/// A handle for C made from a closed handle's allocation.
pub(crate) fn reuse_handle<O: Opaque>(mut b: Box<Handle<O::Inner>>, inner: O::Inner) -> *mut O {
    b.magic = O::MAGIC;
    b.born = xio_core::fork::generation();
    b.inner = inner;
    Box::into_raw(b).cast()
}

/// Stores `v` through an out-parameter that must not be NULL.
///
/// # Safety
/// `out` is NULL or valid for a write of `T`.
pub(crate) unsafe fn put<T>(out: *mut T, v: T) {
    debug_assert!(!out.is_null());
    // SAFETY: per the caller; checked non-NULL by `need_out` before any work.
    unsafe { out.write(v) }
}

/// Fails unless the out-parameter `out` is non-NULL (checked before any
/// work, so a failure changes nothing).
pub(crate) fn need_out<T>(out: *mut T, what: &str) -> Res<()> {
    if out.is_null() {
        Err(Fail::null(what))
    } else {
        Ok(())
    }
}

/// A NUL-terminated UTF-8 string argument.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
pub(crate) unsafe fn str_arg<'a>(p: *const c_char, what: &str) -> Res<&'a str> {
    if p.is_null() {
        return Err(Fail::null(what));
    }
    // SAFETY: non-NULL and NUL-terminated per the caller.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map_err(|_| Fail::new(XIO_ERR_INVALID_ARGUMENT, format!("{what} is not UTF-8")))
}

/// An `"ip:port"` argument (`"10.0.0.1:80"`, `"[::1]:80"`).
///
/// # Safety
/// As [`str_arg`].
pub(crate) unsafe fn addr_arg(p: *const c_char) -> Res<SocketAddr> {
    // SAFETY: forwarded contract.
    let s = unsafe { str_arg(p, "address") }?;
    s.parse().map_err(|_| {
        Fail::new(
            XIO_ERR_INVALID_ARGUMENT,
            format!("{s:?} is not an ip:port address"),
        )
    })
}

/// Writes `s` NUL-terminated into `buf` of `cap` bytes; fails (writing
/// nothing) when it does not fit.
///
/// # Safety
/// `buf` is NULL or valid for `cap` bytes.
pub(crate) unsafe fn put_str(buf: *mut c_char, cap: usize, s: &str) -> Res<()> {
    if buf.is_null() {
        return Err(Fail::null("buffer"));
    }
    if s.len() + 1 > cap {
        return Err(Fail::new(
            XIO_ERR_INVALID_ARGUMENT,
            format!("{} bytes needed for {s:?}", s.len() + 1),
        ));
    }
    // SAFETY: buf has room for s.len() + 1 bytes (checked), and `s` cannot
    // overlap memory the caller handed us for writing.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), buf.cast::<u8>(), s.len());
        buf.add(s.len()).write(0);
    }
    Ok(())
}

/// A timeout argument in milliseconds: negative waits forever (None),
/// 0 does not wait, positive waits up to that long.
pub(crate) enum Timeout {
    Forever,
    NoWait,
    Ms(std::time::Duration),
}

pub(crate) fn timeout_arg(ms: i32) -> Timeout {
    match ms {
        ..0 => Timeout::Forever,
        0 => Timeout::NoWait,
        _ => Timeout::Ms(std::time::Duration::from_millis(ms as u64)),
    }
}

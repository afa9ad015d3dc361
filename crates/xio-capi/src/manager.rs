//! The embedded manager: a pool's manager on a thread of the calling
//! process, for tests, examples and single-binary services (the same code
//! as the `xio-manager` binary).

use std::ffi::c_char;

use xio_core::manager::{Manager, ManagerHandle};

use crate::error::*;
use crate::handle::*;
use crate::XioManager;

impl Opaque for XioManager {
    type Inner = ManagerHandle;
    const MAGIC: u64 = 0x7869_6f5f_6d67_7231; // "xio_mgr1"
    const NAME: &'static str = "manager";
}

/// What a manager holds and has done (`xio_manager_get_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct XioManagerStats {
    /// Stacks attached (a net is one, a zero-copy stack one).
    pub stacks: u64,
    /// Channels between pairs of stacks.
    pub channels: u64,
    /// Buffers in the pool, all classes.
    pub buffers_total: u64,
    /// Buffers free now: `buffers_total` when nobody holds one.
    pub buffers_free: u64,
    /// Processes that died or left, counted once their buffers are back.
    pub deaths: u64,
    /// Buffers taken back from them.
    pub reclaimed: u64,
}

/// Starts the manager of pool `prefix` on a thread of this process, with
/// the default buffer classes (what `xio-manager --prefix P` runs).
/// `XIO_ERR_MANAGER_RUNNING` if another manager has that prefix. Stop it
/// with `xio_manager_stop` (its pool goes with it: its services see it
/// gone).
///
/// Thread-safe.
///
/// # Safety
/// `prefix` is a NUL-terminated string; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_manager_spawn(
    prefix: *const c_char,
    out: *mut *mut XioManager,
) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let prefix = unsafe { str_arg(prefix, "prefix") }?;
        let m = Manager::builder(prefix).spawn()?;
        // SAFETY: checked non-NULL.
        unsafe { put(out, into_handle::<XioManager>(m)) };
        Ok(())
    })
}

/// Stops the manager, waits for its thread, and frees the handle (NULL is
/// a no-op).
///
/// # Safety
/// `manager` is NULL or a manager handle no other thread uses, not used
/// after.
#[no_mangle]
pub unsafe extern "C" fn xio_manager_stop(manager: *mut XioManager) -> XioResult {
    // SAFETY: per this function's contract.
    guard(|| unsafe { take(manager) }.map(|m| m.map(ManagerHandle::stop).unwrap_or(())))
}

/// What the manager holds now (see `xio_manager_stats`).
///
/// Thread-safe.
///
/// # Safety
/// `manager` is a live manager handle or NULL; `out` valid for a write.
#[no_mangle]
pub unsafe extern "C" fn xio_manager_get_stats(
    manager: *mut XioManager,
    out: *mut XioManagerStats,
) -> XioResult {
    guard(|| {
        need_out(out, "out")?;
        // SAFETY: per this function's contract.
        let m = unsafe { borrow(manager) }?;
        let snap = m.snapshot();
        let mut st = XioManagerStats {
            stacks: snap.stacks.len() as u64,
            channels: snap.channels.len() as u64,
            deaths: snap.deaths,
            reclaimed: snap.reclaimed,
            ..XioManagerStats::default()
        };
        for u in m.usage() {
            st.buffers_total += u.total as u64;
            st.buffers_free += u.free as u64;
        }
        // SAFETY: checked non-NULL.
        unsafe { put(out, st) };
        Ok(())
    })
}

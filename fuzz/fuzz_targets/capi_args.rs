//! Any strings a C caller passes as an address or a pool prefix: a clear
//! error code (never a caught panic, `XIO_ERR_INTERNAL`), and the message
//! `xio_last_error` gives is a valid C string.
#![no_main]

use std::ffi::{c_char, CStr, CString};

use libfuzzer_sys::fuzz_target;
use xio::*;

fuzz_target!(|data: &[u8]| {
    // No manager is found here: a prefix that passes goes as far as
    // looking for its socket.
    static RUN_DIR: std::sync::Once = std::sync::Once::new();
    RUN_DIR.call_once(|| std::env::set_var("XIO_RUN_DIR", "/nonexistent/xio-fuzz"));
    let mut parts = data.splitn(2, |&b| b == 0);
    let addr = CString::new(parts.next().unwrap_or_default()).unwrap();
    let prefix = CString::new(
        parts
            .next()
            .unwrap_or_default()
            .split(|&b| b == 0)
            .next()
            .unwrap_or_default(),
    )
    .unwrap();
    let last = || {
        // SAFETY: xio_last_error returns a NUL-terminated string valid
        // until this thread's next call.
        unsafe { CStr::from_ptr(xio_last_error()) }.to_bytes().len()
    };
    let mut out = std::ptr::null_mut();
    // SAFETY: valid C strings and out-pointers; a NULL net handle.
    let r = unsafe { xio_listen(std::ptr::null_mut(), addr.as_ptr(), &mut out) };
    assert!(
        r == XIO_ERR_INVALID_ARGUMENT || r == XIO_ERR_INVALID_HANDLE,
        "{r}"
    );
    let _ = last();
    let mut net = std::ptr::null_mut();
    // SAFETY: as above.
    let r = unsafe { xio_net_attach(prefix.as_ptr() as *const c_char, &mut net) };
    assert!(
        r == XIO_ERR_INVALID_ARGUMENT || r == XIO_ERR_NO_MANAGER || r == XIO_ERR_IO,
        "{r}: {:?}",
        // SAFETY: as above.
        unsafe { CStr::from_ptr(xio_last_error()) }
    );
    let _ = last();
});

//! X-IO's C ABI.
//!
//! This crate will build `libxio` (cdylib and staticlib) and the
//! cbindgen-generated `include/xio.h`, so C network functions and other
//! languages use the zero-copy and socket interfaces. It is filled by the
//! xio-capi issue; today it re-exports the core.
//!
//! ```
//! use xio_capi::core::layout::PoolConfig;
//! assert!(PoolConfig::default().geometry().is_ok());
//! ```

pub use xio_core as core;

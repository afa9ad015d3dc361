//! X-IO for tokio services.
//!
//! This crate will hold `XioListener` and `XioStream` implementing tokio's
//! `AsyncRead`/`AsyncWrite` over the X-IO socket layer, with the stack's
//! doorbell registered in the runtime's reactor, so an async service moves
//! from TCP to shared memory by swapping two type names. It is filled by
//! the xio-tokio issue; today it re-exports the core so the dependency
//! graph is in place.
//!
//! ```
//! use xio_tokio::core::layout::PoolConfig;
//! assert!(PoolConfig::default().geometry().is_ok());
//! ```

pub use xio_core as core;

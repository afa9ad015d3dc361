//! X-IO for hyper, axum and tonic.
//!
//! This crate will hold a hyper-util connector (client side), an accept-loop
//! helper and axum `Listener` (server side), and tonic glue, so an HTTP
//! service keeps its code and swaps one connector or listener. It is filled
//! by the xio-hyper issue; today it re-exports the core.
//!
//! ```
//! use xio_hyper::core::layout::PoolConfig;
//! assert!(PoolConfig::default().geometry().is_ok());
//! ```

pub use xio_core as core;

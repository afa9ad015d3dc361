//! The table's errors: [`ConnError`], and the `io::ErrorKind` each is for
//! the drivers.

/// Errors of table operations, mapped to `io::ErrorKind` by the drivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ConnError {
    /// Nothing to read yet (or nothing to accept, or no send credit).
    #[error("operation would block")]
    WouldBlock,
    /// The peer reset the connection or died.
    #[error("connection reset by peer")]
    Reset,
    /// Nobody listens at the address.
    #[error("connection refused")]
    Refused,
    /// The id is not (or no longer) a connection of this table.
    #[error("not connected")]
    NotConnected,
    /// The address already has a listener here.
    #[error("address in use")]
    AddrInUse,
    /// The table is full.
    #[error("too many connections")]
    TooMany,
    /// Writing after `shutdown` or `close`.
    #[error("broken pipe")]
    BrokenPipe,
}

impl From<ConnError> for std::io::Error {
    fn from(e: ConnError) -> Self {
        use std::io::ErrorKind as K;
        let k = match e {
            ConnError::WouldBlock => K::WouldBlock,
            ConnError::Reset => K::ConnectionReset,
            ConnError::Refused => K::ConnectionRefused,
            ConnError::NotConnected => K::NotConnected,
            ConnError::AddrInUse => K::AddrInUse,
            ConnError::TooMany => K::OutOfMemory,
            ConnError::BrokenPipe => K::BrokenPipe,
        };
        std::io::Error::new(k, e)
    }
}

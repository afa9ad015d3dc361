//! Unit tests of the stack that need no manager.

use std::io;

use super::*;

/// What `main() -> Result<(), Box<dyn Error>>` prints for a missing
/// manager (`Debug`, through `io::Error`) says what to do.
#[test]
fn a_missing_managers_debug_output_says_how_to_start_one() {
    let e = io::Error::from(Error::NoManager {
        prefix: "xio".into(),
        path: "/tmp/xio-0/xio.sock".into(),
        err: io::ErrorKind::NotFound.into(),
    });
    let shown = format!("{e:?}");
    assert!(
        shown.contains("start one with `xio-manager --prefix xio`"),
        "{shown}"
    );
    assert!(shown.contains("XIO_PREFIX"), "{shown}");
}

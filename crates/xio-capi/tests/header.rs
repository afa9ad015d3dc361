//! `include/xio.h` is what cbindgen generates from this crate today: a
//! change to the ABI that was not regenerated fails here (and so in CI).
//! `XIO_BLESS=1 cargo test -p xio-capi --test header` rewrites it.

use std::path::Path;

#[test]
fn header_is_up_to_date() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let config = cbindgen::Config::from_file(dir.join("cbindgen.toml")).expect("cbindgen.toml");
    let bindings = cbindgen::Builder::new()
        .with_crate(dir)
        .with_config(config)
        .generate()
        .expect("cbindgen generates the header");
    let mut fresh = Vec::new();
    bindings.write(&mut fresh);
    let path = dir.join("include/xio.h");
    if std::env::var_os("XIO_BLESS").is_some() {
        std::fs::write(&path, &fresh).unwrap();
        return;
    }
    let committed = std::fs::read(&path).unwrap_or_default();
    assert!(
        committed == fresh,
        "include/xio.h is stale: run `XIO_BLESS=1 cargo test -p xio-capi --test header` and commit it"
    );
}

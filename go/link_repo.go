//go:build !xio_pkgconfig

package xio

// Linked against the libxio.a that `cargo build --release -p xio-capi`
// leaves in this repository's target/release, so a Go binary needs no
// shared library at run time. With libxio installed elsewhere (see
// scripts/capi.sh --install), build with -tags xio_pkgconfig instead.

// #cgo CFLAGS: -I${SRCDIR}/../crates/xio-capi/include
// #cgo LDFLAGS: ${SRCDIR}/../target/release/libxio.a -lgcc_s -lutil -lrt -lpthread -lm -ldl
import "C"

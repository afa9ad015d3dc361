//go:build xio_pkgconfig

package xio

// Linked through pkg-config's xio-static (scripts/capi.sh writes it; point
// PKG_CONFIG_PATH at it).

// #cgo pkg-config: xio-static
import "C"

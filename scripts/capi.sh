#!/usr/bin/env bash
# Builds libxio (X-IO's C ABI) and writes its pkg-config files (xio.pc
# for the shared library, xio-static.pc for libxio.a).
#
#   ./scripts/capi.sh                  # build in place: target/release/pkgconfig/xio.pc
#   ./scripts/capi.sh --install /usr/local   # copy lib, header and xio.pc there
#
# Then: cc app.c $(pkg-config --cflags --libs xio)
# or, linked statically (no libxio.so needed at run time):
#       cc app.c $(pkg-config --cflags --libs xio-static)
# (in place: PKG_CONFIG_PATH=$PWD/target/release/pkgconfig, or under
# $CARGO_TARGET_DIR when that is set)
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
out=${CARGO_TARGET_DIR:-target}/release
[[ "$out" = /* ]] || out=$root/$out

cargo build --release -p xio-capi -p xio-manager
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)

fill() { # prefix libdir includedir pkgconfig-dir
    for pc in xio xio-static; do
        sed -e "s|@PREFIX@|$1|" -e "s|@LIBDIR@|$2|" -e "s|@INCLUDEDIR@|$3|" \
            -e "s|@VERSION@|$version|" "crates/xio-capi/$pc.pc.in" >"$4/$pc.pc"
    done
}

if [[ "${1:-}" == "--install" ]]; then
    prefix=${2:?usage: $0 --install PREFIX}
    install -d "$prefix/lib/pkgconfig" "$prefix/include" "$prefix/bin"
    install -m 0755 "$out/libxio.so" "$prefix/lib/"
    install -m 0644 "$out/libxio.a" "$prefix/lib/"
    install -m 0644 crates/xio-capi/include/xio.h "$prefix/include/"
    install -m 0755 "$out/xio-manager" "$prefix/bin/"
    fill "$prefix" "$prefix/lib" "$prefix/include" "$prefix/lib/pkgconfig"
    echo "installed into $prefix (pkg-config: $prefix/lib/pkgconfig)"
else
    mkdir -p "$out/pkgconfig"
    fill "$root" "$out" "$root/crates/xio-capi/include" "$out/pkgconfig"
    echo "export PKG_CONFIG_PATH=$out/pkgconfig"
fi

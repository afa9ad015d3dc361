#!/usr/bin/env bash
# The test suite: unit, integration (real processes, a real manager), doc
# tests, then the loom models of the lock-free structures.
set -euo pipefail
cd "$(dirname "$0")/.."
# A manager answers in microseconds, but on a loaded 2-core machine its
# thread can be kept off the CPU for seconds: tests wait longer than the
# 5 s default before calling it unresponsive (tests of the timeout itself
# set theirs).
export XIO_CONTROL_TIMEOUT_MS="${XIO_CONTROL_TIMEOUT_MS:-60000}"
# The preload library's tests run programs under the cdylib, which
# `cargo test` does not build.
cargo build -p xio-preload
cargo test --workspace
# Loom builds xio-core with loom's atomics (a separate target dir keeps the
# normal build cached); release mode keeps model checking fast.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}/loom" \
    cargo test -p xio-core --lib --release loom_

#!/usr/bin/env bash
# The test suite: unit, integration (real processes, a real manager), doc
# tests, then the loom models of the lock-free structures.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
# Loom builds xio-core with loom's atomics (a separate target dir keeps the
# normal build cached); release mode keeps model checking fast.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR=target/loom \
    cargo test -p xio-core --lib --release loom_

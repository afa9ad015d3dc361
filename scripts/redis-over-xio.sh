#!/usr/bin/env bash
# redis-benchmark against redis-server over X-IO (both unmodified, under
# LD_PRELOAD=libxio_preload.so) next to the same pair over TCP loopback,
# in one run: server on CPU 1, benchmark on CPU 0; SET and GET, 1 and 50
# clients, with and without -P 16. Needs Debian's redis-server and
# redis-tools. Prints requests/s.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p xio-preload -p xio-manager
target=${CARGO_TARGET_DIR:-target}/release
lib=$(realpath "$target/libxio_preload.so")
run_dir=$(mktemp -d)
export XIO_PREFIX=redis-bench-$$ XIO_RUN_DIR=$run_dir
"$target/xio-manager" --prefix "$XIO_PREFIX" >/dev/null 2>&1 &
mgr=$!
trap 'kill $mgr 2>/dev/null; rm -rf "$run_dir"' EXIT
# A listener opened before the manager answers stays with the kernel.
until "$target/xio-manager" --prefix "$XIO_PREFIX" status >/dev/null 2>&1; do sleep 0.1; done
bench() { # label, LD_PRELOAD value (empty: none), port
    LD_PRELOAD=$2 taskset -c 1 redis-server --port "$3" --bind 127.0.0.1 \
        --save "" --appendonly no >/dev/null 2>&1 &
    local srv=$!
    until LD_PRELOAD=$2 redis-cli -p "$3" ping >/dev/null 2>&1; do sleep 0.1; done
    for args in "-c 1 -n 50000" "-c 50 -n 200000" "-c 1 -n 200000 -P 16" "-c 50 -n 500000 -P 16"; do
        # shellcheck disable=SC2086 # the options split on purpose
        printf '| %s | %s |%s\n' "$1" "$args" "$(LD_PRELOAD=$2 taskset -c 0 \
            redis-benchmark -p "$3" -t set,get $args -q 2>/dev/null | tr '\r' '\n' |
            awk '/per second/ {printf " %.0f |", $2}')"
    done
    kill "$srv"
    wait "$srv" 2>/dev/null || true
}
echo "| transport | redis-benchmark | SET requests/s | GET requests/s |"
echo "|---|---|---:|---:|"
bench X-IO "$lib" 7401
bench TCP "" 7402

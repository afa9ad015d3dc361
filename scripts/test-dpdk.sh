#!/usr/bin/env bash
# The DPDK backend's tests: the dpdk-specific suite, then the control-plane,
# cross-process, socket and std-parity suites run against a DPDK manager
# (XIO_TEST_BACKEND=dpdk).
# Needs the system DPDK (libdpdk-dev, libclang-dev), hugepages and root:
# .ci/run sets them up. A process can be the DPDK primary of one prefix
# only, so each test runs in its own process; DPDK's hugepage files and
# runtime directories of the test prefixes are removed after each.
set -euo pipefail
cd "$(dirname "$0")/.."
# A manager answers in microseconds, but on a loaded 2-core machine its
# thread can be kept off the CPU for seconds: tests wait longer than the
# 5 s default before calling it unresponsive (tests of the timeout itself
# set theirs).
export XIO_CONTROL_TIMEOUT_MS="${XIO_CONTROL_TIMEOUT_MS:-60000}"

cleanup() {
    rm -f /dev/hugepages/t-* /dev/hugepages/xt* 2>/dev/null || true
    rm -rf /var/run/dpdk/t-* /var/run/dpdk/xt* 2>/dev/null || true
}
# A failing test ends the script (set -e): its files go too, or they keep
# their hugepages taken until a manager of the same prefix starts again.
trap cleanup EXIT

cargo test -p xio-core --features dpdk --lib dpdk::
cargo test -p xio-core --features dpdk --test dpdk
cleanup

export XIO_TEST_BACKEND=dpdk
for suite in control_plane cross_process sockets_manager sockets_data sockets_poll sockets_connect std_parity; do
    tests=$(cargo test -q -p xio-core --features dpdk --test "$suite" -- --list 2>/dev/null |
        sed -n 's/: test$//p' | grep -v '^child_main$')
    for t in $tests; do
        echo "== dpdk: $suite::$t"
        cargo test -q -p xio-core --features dpdk --test "$suite" -- --exact "$t"
        cleanup
    done
done

#!/usr/bin/env bash
# Runs every cargo-fuzz target for a while each (default 20 s; CI's run):
#   ./scripts/fuzz.sh            # 20 s per target
#   ./scripts/fuzz.sh 3600       # an hour per target
#   ./scripts/fuzz.sh 600 segment_state   # one target
# Under AddressSanitizer, from the corpora in fuzz/corpus/ (what a run
# finds that covers more is added there: commit it). A crash stops the
# run and leaves its input in fuzz/artifacts/<target>/: make it a
# regression test, fix it, and add the input to the corpus.
#
# On the stable toolchain: RUSTC_BOOTSTRAP=1 lets it take the -Z flags
# cargo-fuzz passes (the sanitizer), so no nightly toolchain is needed
# (CI reaches the package registries only). Needs cargo-fuzz
# (`cargo install --locked cargo-fuzz`) and a C++ compiler for libFuzzer.
set -euo pipefail
cd "$(dirname "$0")/../fuzz"
secs="${1:-20}"
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
    targets=(control_decode descriptor segment_state capi_args)
fi
export RUSTC_BOOTSTRAP=1
cargo fuzz build --sanitizer address
for t in "${targets[@]}"; do
    echo "== fuzz $t for ${secs} s"
    mkdir -p "corpus/$t"
    log="target/fuzz-$t.log"
    mkdir -p target
    if ! cargo fuzz run --sanitizer address "$t" -- -max_total_time="$secs" \
        -print_final_stats=1 >"$log" 2>&1; then
        tail -40 "$log"
        echo "fuzz $t failed: its input is in fuzz/artifacts/$t/"
        exit 1
    fi
    grep -E '^(Done|stat::number_of_executed_units)' "$log"
done

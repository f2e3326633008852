#!/usr/bin/env bash
# The unsafe SIMD code under memory checkers, over the oracle test suite (property tests,
# semantics, bad input, seed shapes):
#   1. AddressSanitizer (nightly Rust), every CPU path this CPU has (AMX, AVX-512 BF16,
#      AVX-512, AVX2, scalar): out-of-bounds reads and writes, use after free.
#   2. valgrind memcheck on the same tests: uninitialised reads too. Valgrind emulates no
#      AVX-512, so under it the CPU dispatch takes the AVX2 and scalar paths.
# Usage: fuzz/sanitize.sh  (from anywhere; exits non-zero on the first finding)
set -euo pipefail
cd "$(dirname "$0")/.."
target=$(rustc -vV | sed -n 's/^host: //p')

echo "=== AddressSanitizer ($target)"
RUSTFLAGS="-Zsanitizer=address" RUSTDOCFLAGS="-Zsanitizer=address" ASAN_OPTIONS=detect_leaks=1 \
    cargo +nightly test --release --target "$target" --target-dir target/asan \
    --test agreement --test semantics --test bad_input --test seed_shapes

echo "=== valgrind memcheck"
cargo test --release --no-run --test agreement --test semantics --test bad_input 2>&1 | tail -1
for name in agreement semantics bad_input; do
    binary=$(ls -t target/release/deps/${name}-* | grep -v '\.d$' | head -1)
    echo "--- $binary"
    valgrind --error-exitcode=99 --quiet "$binary" --test-threads 2
done
echo "=== clean"

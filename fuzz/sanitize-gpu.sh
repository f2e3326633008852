#!/usr/bin/env bash
# The GPU test suite (tests/gpu.rs) under compute-sanitizer's four tools: memcheck (out-of-bounds
# and misaligned accesses; no leak check: the default device and its caches live as long as the
# process, by design), racecheck (shared-memory races), synccheck (barrier misuse) and
# initcheck (reads of uninitialised device memory). Needs an NVIDIA GPU.
#
#   fuzz/sanitize-gpu.sh [test binary] [tool ...]
#
# The binary defaults to a fresh `cargo test --release --features gpu --test gpu` build; from a
# machine without a GPU, `tools/gpu-bundle.sh test --test gpu` builds it into .gpu-bin/
# and this script runs there with that binary. Property suites run VARLEN_ATTN_GPU_CASES cases
# each (default 3: every kernel runs tens of times slower under the tools), the other tests
# whole, except the one that allocates tensors past 2^31 elements.
#
# The tools run at once, one process each (each sees only its own process's accesses), which
# overlaps them well: on an H100 host with 16 cores, synccheck, racecheck and initcheck at once
# took 193 s; alone, memcheck took 112 s and synccheck and racecheck each more than 140 s.
# SANITIZE_LOGS (default a fresh temporary folder) keeps each tool's whole log;
# SANITIZE_TIMEOUT (seconds, default none) caps each tool's run (exit 124 past it).
set -euo pipefail
sanitizer=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
binary=${1:-}
if [ -z "$binary" ]; then
    binary=$(cargo test --release --features gpu --test gpu --no-run --message-format=json 2>/dev/null |
        sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | tail -1)
fi
shift || true
tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(memcheck racecheck synccheck initcheck)
export VARLEN_ATTN_GPU_CASES=${VARLEN_ATTN_GPU_CASES:-3}
logs=${SANITIZE_LOGS:-$(mktemp -d)}
mkdir -p "$logs"
for tool in "${tools[@]}"; do
    (
        SECONDS=0
        set +e
        ${SANITIZE_TIMEOUT:+timeout "$SANITIZE_TIMEOUT"} "$sanitizer" --tool "$tool" --error-exitcode 99 "$binary" --test-threads 1 >"$logs/$tool.txt" 2>&1
        echo "exit $? after $SECONDS s" >>"$logs/$tool.txt"
    ) &
done
wait
status=0
for tool in "${tools[@]}"; do
    echo "== compute-sanitizer --tool $tool"
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|test result|FAILED|panicked|^exit" "$logs/$tool.txt" | head -40 || true
    tail -1 "$logs/$tool.txt" | grep -q '^exit 0 ' || status=1
done
exit $status

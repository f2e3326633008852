#!/usr/bin/env bash
# The GPU test suite (tests/gpu.rs) under compute-sanitizer's four tools: memcheck (out-of-bounds
# and misaligned accesses; no leak check: the default device and its caches live as long as the
# process, by design), racecheck (shared-memory races), synccheck (barrier misuse) and
# initcheck (reads of uninitialised device memory). Needs an NVIDIA GPU.
#
#   fuzz/sanitize-gpu.sh [test binary] [tool ...]
#
# The binary defaults to a fresh `cargo test --release --features gpu --test gpu` build; from a
# machine without a GPU, `../shared/tools/gpu-bundle test --test gpu` builds it into .gpu-bin/
# and this script runs there with that binary. Property suites run VARLEN_ATTN_GPU_CASES cases
# each (default 3: every kernel runs tens of times slower under the tools), the other tests
# whole, except the one that allocates tensors past 2^31 elements.
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
status=0
for tool in "${tools[@]}"; do
    echo "== compute-sanitizer --tool $tool"
    log=$(mktemp)
    set +e
    "$sanitizer" --tool "$tool" --error-exitcode 99 "$binary" --test-threads 1 >"$log" 2>&1
    rc=$?
    set -e
    grep -E "ERROR SUMMARY|test result|FAILED|panicked|=========" "$log" | head -40 || true
    echo "== $tool: exit $rc"
    [ "$rc" = 0 ] || status=1
done
exit $status

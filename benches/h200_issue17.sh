#!/usr/bin/env bash
# Issue 17's measurements in one H200 lease, side by side in one run: our bench binary and
# PyTorch's FA2 varlen on the realistic batches, ours and PyTorch's FA2 varlen and cuDNN on the
# seed shapes (back-to-back CUDA events), the small shapes' kernel times under Nsight Compute,
# and, with an argument, the same bench again with a tuning switch set (an A/B in one run).
# With the suite's binary beside the bench's, the GPU suite runs first (the build must pass it
# before its numbers count).
#
# From this machine (the test bundle replaces .gpu-bin, so the bench binary is built first and
# copied back in):
#   ../shared/tools/gpu-bundle bench --bench gpu && mv .gpu-bin/gpu-* /tmp/bench-gpu
#   ../shared/tools/gpu-bundle test --test gpu && mv /tmp/bench-gpu .gpu-bin/bench-gpu
#   strip --strip-debug .gpu-bin/gpu-* .gpu-bin/bench-gpu   # both then travel well under 64 MiB
# then on the GPU machine (the device tool, carrying .gpu-bin):
#   bash benches/h200_issue17.sh [VARLEN_ATTN_GPU_SWITCH=value]
# Everything lands in $OUT (./h200-out without it), one file per table, written as it goes, so
# a lease cut short still returns what ran. DEADLINE (seconds, default 560) skips the steps
# that would not finish before it; SUITE_CASES (default 24) caps the suite's random cases.
set -uo pipefail
deadline=560
source "$(dirname "$0")/h200_common.sh"
bench=$PWD/.gpu-bin/bench-gpu

suite=$(ls .gpu-bin/gpu-* 2>/dev/null | head -1)
[ -z "$suite" ] || run_suite "$suite" 180

step "batches: ours, then PyTorch FA2 varlen"
room 60 && timeout 60 "$bench" --batches | grep '^|' | tee "$out/batches.txt"
room 40 && timeout 40 python3 benches/torch_gpu_batches.py | tee "$out/torch_batches.jsonl"
if [ $# -gt 0 ]; then
    step "batches with $*"
    room 60 && env "$@" timeout 60 "$bench" --batches | grep '^|' | tee "$out/batches-switch.txt"
fi

step "seed shapes: ours, then PyTorch FA2 varlen and cuDNN"
room 150 && timeout 150 "$bench" 0-20 | grep '^|' | tee "$out/shapes.txt"
room 200 && timeout 200 python3 benches/torch_gpu.py 0-20 | tee "$out/torch_shapes.jsonl"
if [ $# -gt 0 ]; then
    step "seed shapes with $*"
    room 150 && env "$@" timeout 150 "$bench" 0-20 | grep '^|' | tee "$out/shapes-switch.txt"
fi

step "small shapes' kernel times (Nsight Compute)"
room 150 && timeout 150 python3 benches/kernel_times.py "$bench" 0-3,11-15,20 | tee "$out/kernel_times.txt"
step "done"

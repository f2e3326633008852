#!/usr/bin/env bash
# Issue 17's measurements in one H200 lease, side by side in one run: our bench binary and
# PyTorch's FA2 varlen on the realistic batches, ours and PyTorch's FA2 varlen and cuDNN on the
# seed shapes (back-to-back CUDA events), the small shapes' kernel times under Nsight Compute,
# and, with an argument, the same bench again with a tuning switch set (an A/B in one run).
#
# From this machine:
#   ../shared/tools/gpu-bundle bench --bench gpu && mv .gpu-bin/gpu-* .gpu-bin/bench-gpu
# then on the GPU machine (the device tool, carrying .gpu-bin):
#   bash benches/h200_issue17.sh [VARLEN_ATTN_GPU_SWITCH=value]
# Everything lands in $OUT (./h200-out without it), one file per table.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-h200-out}
mkdir -p "$out"
bench=$PWD/.gpu-bin/bench-gpu
export PATH=/usr/local/cuda/bin:$PATH
step() { printf '== %s (%s)\n' "$1" "$(date +%T)"; }

step "batches: ours, then PyTorch FA2 varlen"
timeout 120 "$bench" --batches | grep '^|' | tee "$out/batches.txt"
timeout 120 python3 benches/torch_gpu_batches.py | tee "$out/torch_batches.jsonl"
if [ $# -gt 0 ]; then
    step "batches with $*"
    env "$@" timeout 120 "$bench" --batches | grep '^|' | tee "$out/batches-switch.txt"
fi

step "seed shapes: ours, then PyTorch FA2 varlen and cuDNN"
timeout 240 "$bench" 0-20 | grep '^|' | tee "$out/shapes.txt"
timeout 240 python3 benches/torch_gpu.py 0-20 | tee "$out/torch_shapes.jsonl"
if [ $# -gt 0 ]; then
    step "seed shapes with $*"
    env "$@" timeout 240 "$bench" 0-20 | grep '^|' | tee "$out/shapes-switch.txt"
fi

step "small shapes' kernel times (Nsight Compute)"
timeout 240 python3 benches/kernel_times.py "$bench" 0-3,11-15,20 | tee "$out/kernel_times.txt"
step "done"

#!/usr/bin/env bash
# The proofs a build owes before its numbers count (issue 17), in one lease: the GPU suite
# under compute-sanitizer's tools (`fuzz/sanitize-gpu.sh`, in the background) while the plain
# suite, the sm_80 kernel's suite on Hopper (`VARLEN_ATTN_GPU_KERNEL=mma`) and the test of
# tensors past 2^31 elements run beside them (correctness only: nothing here is timed while
# they share the GPU); then, where time is left, the realistic batches against PyTorch's FA2
# varlen and the small shapes' kernel times, timed alone.
#
# From this machine: `bash benches/build_candidates.sh` (gives .gpu-bin/bench-main and
# gpu-main); on the GPU machine (the device tool, carrying .gpu-bin):
#   bash benches/h200_proofs.sh .gpu-bin/gpu-main .gpu-bin/bench-main [tool ...]
# The tools default to all four. Everything lands in $OUT (./h200-out without it); DEADLINE
# (seconds, default 580) skips the timed steps that would not finish before it.
set -uo pipefail
deadline=580
source "$(dirname "$0")/h200_common.sh"
suite=$(realpath "$1")
bench=$(realpath "$2")
shift 2
tools=("$@")
[ ${#tools[@]} -gt 0 ] || tools=(memcheck racecheck synccheck initcheck)

step "compute-sanitizer ${tools[*]} on the suite (background)"
SANITIZE_LOGS="$out/sanitize" SANITIZE_TIMEOUT=$((deadline - 200)) bash fuzz/sanitize-gpu.sh "$suite" "${tools[@]}" \
    >"$out/sanitize.txt" 2>&1 &
sanitizer=$!

SUITE_CASES=${SUITE_CASES:-8} run_suite "$suite" 150
VARLEN_ATTN_GPU_KERNEL=mma SUITE_CASES=${SUITE_CASES:-8} run_suite "$suite" 150 mma # the sm_80 kernel on Hopper
step "tensors past 2^31 elements"
timeout 120 "$suite" tensors_past_two_to_the_31_elements --exact >"$out/huge.txt" 2>&1
echo "exit status $?" >>"$out/huge.txt"
grep -E "test result|FAILED|panicked|exit status" "$out/huge.txt"

step "waiting for compute-sanitizer"
wait "$sanitizer"
echo "sanitizer script exit status $?"
cat "$out/sanitize.txt"

step "batches: ours, then PyTorch FA2 varlen"
room 60 && timeout 60 "$bench" --batches | grep '^|' | tee "$out/batches.txt"
room 40 && timeout 40 python3 benches/torch_gpu_batches.py | tee "$out/torch_batches.jsonl"
step "small shapes' kernel times (Nsight Compute)"
room 100 && timeout 100 python3 benches/kernel_times.py "$bench" 0-3,11-15,20 | tee "$out/kernel_times.txt"
step "done"

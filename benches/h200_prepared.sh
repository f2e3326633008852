#!/usr/bin/env bash
# A candidate whose suite has passed, proved and measured in one short lease: its suite under
# memcheck, synccheck and racecheck at once, with the sm_80 kernel's suite on Hopper beside them
# (NVIDIA's two kernels share the write and the in-kernel combination of key splits); then the
# kernel times of main's build and its own on PROBLEMS (`benches/kernel_times.py --ours`: seed
# shapes and the bench's custom `HxDxL[xN]` shapes); then, if room, an A/B of main, the
# candidate and any further bench binaries (wrappers under a tuning switch) on AB_PROBLEMS, with
# AB_SHAPES as `VARLEN_ATTN_BENCH_SHAPES`.
#
#   PROBLEMS=11,2,16,16x72x300 AB_PROBLEMS=11,16 AB_SHAPES=16x72x420 \
#       bash benches/h200_prepared.sh .gpu-bin/bench-main .gpu-bin/bench-new .gpu-bin/gpu-new [bench ...]
#
# Logs in $OUT; DEADLINE (seconds, default 540) skips what would not finish. On an H100 the
# three tools at once take 215-240 s on the suite (3 random cases per property test).
# SANITIZERS (default "memcheck synccheck racecheck") picks the tools; empty, the candidate's
# Hopper suite runs plain beside the sm_80 one instead (~2 minutes: for a lease too short for
# the tools, or a machine taken back before long calls finish).
set -uo pipefail
deadline=540
source "$(dirname "$0")/h200_common.sh"
if [ $# -lt 3 ]; then
    echo "usage: $0 <main's bench binary> <candidate's bench binary> <candidate's test binary> [bench ...]" >&2
    exit 2
fi
main_bench=$1 new_bench=$2 suite=$3
shift 3
nvidia-smi --query-gpu=name,clocks.max.sm,power.limit --format=csv,noheader
read -ra tools <<<"${SANITIZERS-memcheck synccheck racecheck}"
if [ ${#tools[@]} -eq 0 ] || room 120 "sanitizers"; then
    (VARLEN_ATTN_GPU_KERNEL=mma SUITE_CASES=2 run_suite "$suite" 200 mma >"$out/mma-verdict.txt" 2>&1) &
    if [ ${#tools[@]} -eq 0 ]; then
        step "the Hopper suite, the sm_80 suite beside it, no sanitizer ($(basename "$suite"))"
        SUITE_CASES=4 run_suite "$suite" 200
    else
        step "${tools[*]} at once, the sm_80 suite beside them ($(basename "$suite"))"
        left=$((deadline - SECONDS - 60))
        SANITIZE_LOGS=$out/sanitize SANITIZE_TIMEOUT=$((left < 300 ? left : 300)) bash fuzz/sanitize-gpu.sh "$suite" "${tools[@]}" 2>&1
    fi
    wait
    cat "$out/mma-verdict.txt"
fi
if [ -n "${PROBLEMS:-}" ] && room 80 "kernel times"; then
    step "kernel times"
    python3 benches/kernel_times.py --ours "$main_bench,$new_bench" "$PROBLEMS" 2>&1 | tee "$out/kernel-times.txt"
fi
if [ -n "${AB_PROBLEMS:-}" ] && room 100 "A/B"; then
    step "A/B"
    VARLEN_ATTN_BENCH_SHAPES=${AB_SHAPES:-} ROUNDS=${ROUNDS:-2} DEADLINE=$((deadline - SECONDS)) \
        bash benches/h200_ab.sh "$AB_PROBLEMS" "$main_bench" "$new_bench" "$@" | grep -v '^== round'
fi
step done

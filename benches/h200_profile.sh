#!/usr/bin/env bash
# Nsight Compute's full report of our attention kernel on the problems furthest from issue 17's
# bars, as text: seed shapes 0 and 11 (small: kernel time against cuDNN's) and the 64 images x
# 256 batch (the first problem of `bench-gpu --batches`). One launch each, after two warm-ups;
# ncu locks the clocks (base clock), so durations here are for comparing sections, not speed.
#
#   bash benches/h200_profile.sh [bench binary ...]      (default: .gpu-bin/bench-gpu)
#
# Several binaries (e.g. main's and a branch's, both bundled and stripped) are profiled one
# after another into $OUT/<binary name>-<problem>.txt. DEADLINE (seconds, default 540).
set -uo pipefail
deadline=540
source "$(dirname "$0")/h200_common.sh"
[ $# -gt 0 ] || set -- .gpu-bin/bench-gpu
for binary in "$@"; do
    for problem in 11 0 --batches; do
        room 90 "$binary $problem" || continue
        name="$(basename "$binary")-${problem#--}"
        step "$name"
        VARLEN_ATTN_BENCH_REPEATS=3 timeout 90 ncu --set full --import-source no -k regex:va_attention_forward \
            -s 2 -c 1 "$binary" "$problem" >"$out/$name.txt" 2>&1
        grep -E "Duration|Registers Per|Compute \(SM\) Throughput|Memory Throughput|Issue Slots Busy|Achieved Occupancy|No Eligible" \
            "$out/$name.txt" | sed 's/  */ /g'
    done
done
step done

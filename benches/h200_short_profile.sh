#!/usr/bin/env bash
# Where the problems still short of issue 17's bars spend their time, for the next change to aim
# at (the 64 images x 256 batch on both cu_seqlens paths, shape 16):
#  1. each kernel's duration in the 64 x 256 batch's calls, cu_seqlens on the host against on
#     the device (Nsight Compute, one metric: benches/kernel_durations.py);
#  2. launch and per-SM activity on shapes 16 and 17 (grid, registers, the busiest and the
#     least busy multiprocessor's active cycles against the average: the tail);
#  3. the 64 x 256 batch's attention kernel in full, with its SASS-level stall samples as CSV
#     (the third launch: cu_seqlens on the host). The GPU machine has no Nsight Systems.
# Bundle as for benches/h200_issue17.sh (only .gpu-bin/bench-gpu is needed); ~50 s. Output in
# $OUT (./h200-out without it).
set -uo pipefail
deadline=540
source "$(dirname "$0")/h200_common.sh"
bench=$PWD/.gpu-bin/bench-gpu

step "64 x 256: kernel durations, cu_seqlens on the host and on the device"
room 150 && timeout 150 python3 benches/kernel_durations.py "$bench" | tee "$out/durations.txt"

metrics=gpu__time_duration.sum,launch__grid_size,launch__block_size,launch__registers_per_thread
metrics=$metrics,sm__cycles_active.avg,sm__cycles_active.max,sm__cycles_active.min,sm__cycles_elapsed.max
for shape in 16 17; do
    step "shape $shape: launch and per-SM activity"
    room 90 && VARLEN_ATTN_BENCH_REPEATS=3 timeout 90 ncu --csv --page raw -k regex:va_attention_forward -s 2 -c 1 \
        --metrics "$metrics" "$bench" "$shape" >"$out/shape$shape.csv" 2>&1
done

step "64 x 256: full report and SASS stall samples"
if room 150; then
    timeout 120 ncu --set full --import-source no -k regex:va_attention_forward -s 2 -c 1 -o "$out/b64" -f \
        "$bench" --batches >"$out/b64-run.txt" 2>&1
    timeout 60 ncu -i "$out/b64.ncu-rep" --page source --csv --print-source sass >"$out/b64-sass.csv" 2>&1
    timeout 30 ncu -i "$out/b64.ncu-rep" >"$out/b64-details.txt" 2>&1
    grep -E "Duration|Issue Slots Busy|No Eligible|Achieved Occupancy" "$out/b64-details.txt" | sed 's/  */ /g'
fi
step done

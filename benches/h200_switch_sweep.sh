#!/usr/bin/env bash
# Every Hopper tuning switch (src/gpu/tuning.rs) over the problems issue 17 still finds short:
# the small seed shapes and shape 16, and the batches; back-to-back ms from the bench binary,
# one process per switch, one line per problem list. Also samples the SM clock, power and the
# clock-limit reasons while shapes 9 and 10 run (the question of shape 10's lower rate).
#
# Bundle as for benches/h200_issue17.sh (only .gpu-bin/bench-gpu is needed), then on the H200:
#   bash benches/h200_switch_sweep.sh
# Output in $OUT (./h200-out without it); DEADLINE (seconds, default 540) skips what would not fit.
set -uo pipefail
deadline=540
source "$(dirname "$0")/h200_common.sh"
bench=$PWD/.gpu-bin/bench-gpu

step "clocks during shapes 9 and 10"
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active \
    --format=csv -lms 100 >"$out/clocks.csv" 2>&1 &
sampler=$!
sleep 1
timeout 90 "$bench" 9,10 | grep '^|' | tee "$out/shapes-9-10.txt"
sleep 1
kill "$sampler"

for switch in default BLOCK_M=64 BLOCK_N=64 BLOCK_N=192 SPLITS=1 STAGES=2 PERSISTENT=0 BLOCK_M=128 Q_BUFFERS=1; do
    room 60 "$switch" || continue
    env=()
    [ "$switch" = default ] || env=("VARLEN_ATTN_GPU_$switch")
    name=${switch/=/-} # file names without '='
    step "$switch"
    env "${env[@]}" timeout 40 "$bench" 0-3,11-16 | grep '^|' >"$out/small-$name.txt"
    env "${env[@]}" timeout 45 "$bench" --batches | grep '^|' >"$out/batches-$name.txt"
    # "problem: back-to-back ms" for each row
    awk -F'|' 'NR > 2 { printf "%s:%s ", $2, $7 }' "$out/small-$name.txt"; echo
    awk -F'|' 'NR > 2 { printf "%s:%s ", $2, $6 }' "$out/batches-$name.txt"; echo
done
step done

#!/usr/bin/env bash
# A/B of CPU builds on a shared, noisy machine: runs each build's `profile_shape` example in
# turn, round after round, and prints per build the best, the median and the mean of the three
# best of its rounds' fastest calls (GFLOP/s). Interference only slows calls down, so the best
# readings are the ones to compare.
#
#   cargo build --release --example profile_shape && cp target/release/examples/profile_shape /tmp/a
#   (change the code, rebuild, copy to /tmp/b)
#   tools/ab_cpu.sh SHAPE ROUNDS /tmp/a /tmp/b     # THREADS=1 CALLS=6 by default
set -euo pipefail
shape=$1 rounds=$2
shift 2
for _ in $(seq "$rounds"); do
    line=""
    for build in "$@"; do
        line="$line $(RAYON_NUM_THREADS=${THREADS:-1} "$build" "$shape" "${CALLS:-6}" | awk '{print $(NF-1)}')"
    done
    echo "$line"
done | python3 -c '
import statistics, sys
rounds = [list(map(float, line.split())) for line in sys.stdin]
for i, name in enumerate(sys.argv[1:]):
    c = sorted(r[i] for r in rounds)
    print("%-40s best %.1f  median %.1f  top-3 mean %.1f GFLOP/s" % (name, c[-1], statistics.median(c), statistics.mean(c[-3:])))
' "$@"

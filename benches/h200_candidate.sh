#!/usr/bin/env bash
# A kernel change's check before it merges, in one H200 lease: the candidate build's GPU suite,
# an A/B of its bench binary against main's (benches/h200_ab.sh: the realistic batches and the
# small and mid-sized seed shapes, 3 rounds), then compute-sanitizer's synccheck and racecheck
# on its suite (fuzz/sanitize-gpu.sh; the barriers and shared memory are what kernel changes
# break). Each binary bundled and stripped as in benches/h200_issue17.sh's header, renamed apart:
#
#   bash benches/h200_candidate.sh .gpu-bin/bench-main .gpu-bin/bench-new .gpu-bin/gpu-new
#
# Logs in $OUT; DEADLINE (seconds, default 555) skips what would not finish; SUITE_CASES
# (default 24) caps the suite's random cases.
set -uo pipefail
deadline=555
source "$(dirname "$0")/h200_common.sh"
[ $# -eq 3 ] || { echo "usage: $0 <main's bench binary> <candidate's bench binary> <candidate's test binary>" >&2; exit 2; }
main_bench=$1 candidate_bench=$2 suite=$3

run_suite "$suite" 150
# The A/B leaves the sanitizer runs ~260 s (each ~110-120 s on the whole suite).
step "A/B: batches"
DEADLINE=$((deadline - SECONDS - 300)) bash benches/h200_ab.sh --batches "$main_bench" "$candidate_bench" | grep -v '^== round'
step "A/B: seed shapes 0-3, 11-19"
DEADLINE=$((deadline - SECONDS - 260)) bash benches/h200_ab.sh 0-3,11-19 "$main_bench" "$candidate_bench" | grep -v '^== round'
for tool in synccheck racecheck; do
    room 100 "$tool" || continue
    step "$tool"
    left=$((deadline - SECONDS))
    timeout $((left < 140 ? left : 140)) bash fuzz/sanitize-gpu.sh "$suite" "$tool" 2>&1 | tail -4
done
step done

#!/usr/bin/env bash
# Kernel changes' checks before they merge, in one H200 lease: each candidate build's GPU suite,
# one A/B of all their bench binaries against main's (benches/h200_ab.sh: the realistic batches
# and the small and mid-sized seed shapes, 3 rounds, binaries in turn), then compute-sanitizer's
# synccheck and racecheck at once on the first candidate's suite (fuzz/sanitize-gpu.sh; the barriers
# and shared memory are what kernel changes break; a second candidate gets them in a later
# lease if it wins). Each binary bundled and stripped as in benches/h200_issue17.sh's header,
# renamed apart:
#
#   bash benches/h200_candidate.sh .gpu-bin/bench-main .gpu-bin/bench-new .gpu-bin/gpu-new \
#       [.gpu-bin/bench-other .gpu-bin/gpu-other ...]
#
# Logs in $OUT; DEADLINE (seconds, default 555) skips what would not finish; SUITE_CASES
# (default 24) caps the suites' random cases. One candidate takes ~480 s (on an H100, 17
# tests: suite ~75 s, A/B ~200 s, the two tools ~190 s); two ~450 s, with the tools left for a
# later lease.
set -uo pipefail
deadline=555
source "$(dirname "$0")/h200_common.sh"
if [ $# -lt 3 ] || [ $(($# % 2)) -ne 1 ]; then
    echo "usage: $0 <main's bench binary> (<candidate's bench binary> <candidate's test binary>)..." >&2
    exit 2
fi
main_bench=$1
shift
benches=() suites=()
while [ $# -gt 0 ]; do
    benches+=("$1") suites+=("$2")
    shift 2
done

for suite in "${suites[@]}"; do run_suite "$suite" 150; done
# With one candidate the A/B leaves the sanitizers ~260 s (synccheck and racecheck at once take
# ~190 s on the whole suite); with more, the A/B comes first (each binary adds ~70 s to it) and
# the sanitizers get what is left.
reserve=0
[ ${#suites[@]} -eq 1 ] && reserve=260
step "A/B: batches"
DEADLINE=$((deadline - SECONDS - reserve - 40 * ${#suites[@]})) bash benches/h200_ab.sh --batches "$main_bench" "${benches[@]}" | grep -v '^== round'
step "A/B: seed shapes 0-3, 11-19"
DEADLINE=$((deadline - SECONDS - reserve)) bash benches/h200_ab.sh 0-3,11-19 "$main_bench" "${benches[@]}" | grep -v '^== round'
if room 150 "synccheck and racecheck"; then
    step "synccheck and racecheck at once ($(basename "${suites[0]}"))"
    left=$((deadline - SECONDS))
    SANITIZE_TIMEOUT=$((left < 280 ? left : 280)) bash fuzz/sanitize-gpu.sh "${suites[0]}" synccheck racecheck 2>&1
fi
step done

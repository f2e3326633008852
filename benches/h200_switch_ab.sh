#!/usr/bin/env bash
# Prepared kernel changes that sit behind tuning switches (src/gpu/tuning.rs), checked and
# measured in one H200 lease: the GPU suite under each setting (the kernel compiled with it must
# match the oracle), then an A/B of the default against every setting on the given seed shapes
# and on the batches. Each setting is a two-line wrapper around the same bench binary, so that
# benches/h200_ab.sh runs them in turn; its columns are named after the settings.
#
# Bundle as for benches/h200_issue17.sh (.gpu-bin/bench-gpu and one .gpu-bin/gpu-* test binary):
#   bash benches/h200_switch_ab.sh 4,16-18 STAGES=2 BLOCK_N=192
# (each NAME=VALUE is VARLEN_ATTN_GPU_NAME=VALUE). ROUNDS (default 2), SUITE_CASES (default 8)
# and DEADLINE (seconds, default 560); logs in $OUT. Each setting's suite takes ~60-70 s and
# each binary ~20-25 s per round and problem list, so four settings need two calls (the
# deadline skips what would not fit, and says so).
set -uo pipefail
deadline=560
source "$(dirname "$0")/h200_common.sh"
[ $# -ge 2 ] || { echo "usage: $0 <seed shapes> NAME=VALUE..." >&2; exit 2; }
problems=$1
shift
bench=$PWD/.gpu-bin/bench-gpu
suite=$(ls .gpu-bin/gpu-* 2>/dev/null | head -1)
wrappers=$(mktemp -d)
settings=("$bench")
for setting in "$@"; do
    name=$(printf '%s' "$setting" | tr 'A-Z=' 'a-z-')
    printf '#!/bin/sh\nexport VARLEN_ATTN_GPU_%s\nexec "%s" "$@"\n' "$setting" "$bench" >"$wrappers/$name"
    chmod +x "$wrappers/$name"
    settings+=("$wrappers/$name")
    if [ -n "$suite" ]; then
        ln -s "$PWD/$suite" "$wrappers/gpu-$name" # its log: $OUT/suite-gpu-<setting>.txt
        step "suite with VARLEN_ATTN_GPU_$setting"
        room 120 && (export "VARLEN_ATTN_GPU_$setting" && SUITE_CASES=${SUITE_CASES:-8} run_suite "$wrappers/gpu-$name" 120)
    fi
done
export ROUNDS=${ROUNDS:-2}
step "A/B: seed shapes $problems"
DEADLINE=$((deadline - SECONDS - 90)) bash benches/h200_ab.sh "$problems" "${settings[@]}" | grep -v '^== round'
step "A/B: batches"
DEADLINE=$((deadline - SECONDS)) bash benches/h200_ab.sh --batches "${settings[@]}" | grep -v '^== round'
step done

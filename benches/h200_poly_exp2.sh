#!/usr/bin/env bash
# The polynomial-exponential switch on the H200 in one lease (`VARLEN_ATTN_GPU_POLY_EXP2=k`:
# every k-th 8-key chunk's exponentials on the FMA pipes, src/gpu/kernel/portability.h's
# va_exp2_fma): first the GPU suite with k = 4 compiled in (it must match the oracle, masked
# keys and non-finite inputs included), then an A/B of k = 8, 4 and 2 against the default on
# the head_dim-72 seed shapes that issue 17 asks 1.5x cuDNN of and the batches. Each setting is
# a two-line wrapper around the same bench binary, so benches/h200_ab.sh runs them in turn.
#
# Bundle as for benches/h200_issue17.sh (.gpu-bin/bench-gpu and one .gpu-bin/gpu-* test binary):
#   bash benches/h200_poly_exp2.sh
# PROBLEMS (default 4,16-18), ROUNDS (default 2), SUITE_CASES (default 8) and DEADLINE (seconds,
# default 560); logs in $OUT.
set -uo pipefail
deadline=560
source "$(dirname "$0")/h200_common.sh"
bench=$PWD/.gpu-bin/bench-gpu

suite=$(ls .gpu-bin/gpu-* 2>/dev/null | head -1)
if [ -n "$suite" ]; then
    export VARLEN_ATTN_GPU_POLY_EXP2=4
    SUITE_CASES=${SUITE_CASES:-8} run_suite "$suite" 150
    unset VARLEN_ATTN_GPU_POLY_EXP2
fi

wrappers=$(mktemp -d)
settings=("$bench")
for k in 8 4 2; do
    printf '#!/bin/sh\nVARLEN_ATTN_GPU_POLY_EXP2=%s exec "%s" "$@"\n' "$k" "$bench" >"$wrappers/poly-$k"
    chmod +x "$wrappers/poly-$k"
    settings+=("$wrappers/poly-$k")
done
step "A/B: seed shapes ${PROBLEMS:-4,16-18}"
DEADLINE=$((deadline - SECONDS - 100)) bash benches/h200_ab.sh "${PROBLEMS:-4,16-18}" "${settings[@]}" | grep -v '^== round'
step "A/B: batches"
DEADLINE=$((deadline - SECONDS)) bash benches/h200_ab.sh --batches "${settings[@]}" | grep -v '^== round'
step done

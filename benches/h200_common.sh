# Sourced by the H200 scripts (benches/h200_*.sh): moves to the repository root, puts the CUDA
# tools on the PATH, makes $out ($OUT, else ./h200-out), and defines `step` (a progress line),
# `room` (whether more seconds fit before the script's deadline: $DEADLINE, else the default
# the script set in `deadline` before sourcing this, else 560) and `run_suite`.
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-h200-out}
mkdir -p "$out"
deadline=${DEADLINE:-${deadline:-560}}
export PATH=/usr/local/cuda/bin:$PATH

step() { printf '== %s (%s, %s s)\n' "$1" "$(date +%T)" "$SECONDS"; }

# `room need [what]`: whether `need` more seconds fit before the deadline; else says what it
# skips.
room() {
    local need=$1
    shift
    if [ $((SECONDS + need)) -le "$deadline" ]; then return 0; fi
    echo "skipped${*:+ $*}: needs $need s, $((deadline - SECONDS)) s left"
    return 1
}

# `run_suite binary seconds [name]`: the GPU suite (tests/gpu.rs) with its random cases capped
# at SUITE_CASES (default 24), under a time cap, its log in $out/suite-<name>.txt (name: the
# binary's, unless given: the same binary run under another switch); prints its verdict.
run_suite() {
    local name=${3:-$(basename "$1")} log
    log="$out/suite-$name.txt"
    step "GPU suite ($name, random cases capped at ${SUITE_CASES:-24})"
    room "$2" || return 0
    VARLEN_ATTN_GPU_CASES=${SUITE_CASES:-24} timeout "$2" "$1" >"$log" 2>&1
    echo "exit status $?" >>"$log"
    grep -E "test result|FAILED|panicked|exit status" "$log"
}

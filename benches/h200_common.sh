# Sourced by the H200 scripts (benches/h200_*.sh): moves to the repository root, puts the CUDA
# tools on the PATH, makes $out ($OUT, else ./h200-out), and defines `step` (a progress line)
# and `room` (whether more seconds fit before the script's deadline: $DEADLINE, else the
# default the script set in `deadline` before sourcing this, else 560).
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

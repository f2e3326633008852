#!/usr/bin/env bash
# How much of a small shape's time goes to threading and set-up rather than to the attention
# work itself: `perf` samples of examples/profile_shape (many calls of one seed shape), split
# into the kernels (packing, the two products, the softmax, the blocked loop) and everything
# else (rayon's scheduling and idling, the OS, validation, workspace, the output copy). The
# inputs' generation is left out. Needs `perf` (Debian's linux-perf).
#   bash tools/overhead.sh 11 12 13 14 0 1 2
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --example profile_shape >/dev/null 2>&1
kernel='softmax|AmxKernel|Bf16DotKernel|FmaKernel|pack_bf16|transpose_key_strip|interleave_value_pair|amx::rescale|driver::attend|V4::vectorize|value_tile|score_tile|rows_update'
inputs='sincos|to_vec_mapped|NormalRng|random_inputs|__ieee754|log1p|__log|__sin|__cos'
printf '| shape | calls | kernel %% | overhead %% |\n|---|---|---|---|\n'
for shape in "$@"; do
    calls=$(python3 -c "import sys; l=[720,1200,2116,3844,8136,0,0,0,0,0,0,276,600,1012,2024][int(sys.argv[1])]; print(max(20, int(4e8 / (l * l))))" "$shape")
    perf record -q -o /tmp/overhead.data ./target/release/examples/profile_shape "$shape" "$calls" >/dev/null 2>&1
    perf report -i /tmp/overhead.data --no-children --sort sym --stdio 2>/dev/null | grep -E '^ +[0-9.]+%' > /tmp/overhead.txt
    total=$(grep -vE "$inputs" /tmp/overhead.txt | awk '{s += $1} END {print s}')
    work=$(grep -vE "$inputs" /tmp/overhead.txt | grep -E "$kernel" | awk '{s += $1} END {print s}')
    python3 -c "import sys; t, w = float(sys.argv[1]), float(sys.argv[2]); print(f'| {sys.argv[3]} | {sys.argv[4]} | {100 * w / t:.1f} | {100 * (t - w) / t:.1f} |')" "$total" "$work" "$shape" "$calls"
done

#!/usr/bin/env bash
# Builds the GPU bench and test binaries of main and of each prepared kernel patch
# (docs/prepared/) into .gpu-bin/, named apart and stripped, ready to carry to the GPU machine
# for benches/h200_candidate.sh:
#
#   bash benches/build_candidates.sh ps=/tmp/predicated-stores.patch pw=/tmp/pair-walk.patch
#
# (the eleventh session's, from `git show e139140:docs/prepared/<name>.patch`) gives
# .gpu-bin/bench-main, gpu-main, bench-ps, gpu-ps, bench-pw and gpu-pw (stripped, ~1.6 MB
# per bench binary and ~3.4 MB per test binary: well under the device tool's 64 MiB), in ~70 s.
# A candidate may name several patches, comma-separated (both=a.patch,b.patch). Each is applied
# to the working tree for its build and reverted after it; src/ and tests/ must have no other
# changes.
set -euo pipefail
cd "$(dirname "$0")/.."
bundle=../shared/tools/gpu-bundle
if ! git diff --quiet -- src tests; then
    echo "src/ or tests/ has uncommitted changes: commit or stash them first" >&2
    exit 2
fi
store=$(mktemp -d)
build() {
    local log="$store/build-$1.log"
    if ! { "$bundle" bench --bench gpu && mv .gpu-bin/gpu-* "$store/bench-$1" &&
        "$bundle" test --test gpu && mv .gpu-bin/gpu-* "$store/gpu-$1"; } >"$log" 2>&1; then
        tail -20 "$log" >&2
        echo "building $1 failed; its whole log: $log" >&2
        return 1
    fi
    rm "$log"
}
build main
for candidate in "$@"; do
    name=${candidate%%=*}
    IFS=, read -ra patches <<<"${candidate#*=}"
    git apply "${patches[@]}"
    trap 'git apply -R "${patches[@]}"' EXIT
    build "$name"
    git apply -R "${patches[@]}"
    trap - EXIT
done
rm -rf .gpu-bin && mkdir .gpu-bin && mv "$store"/* .gpu-bin/ && rmdir "$store"
strip --strip-debug .gpu-bin/*
ls -la .gpu-bin && du -sh .gpu-bin

#!/usr/bin/env bash
# An A/B of several bench binaries (main's and prepared branches', each bundled and stripped as
# in benches/h200_issue17.sh's header, renamed apart) in one lease: ROUNDS rounds, each running
# every binary in turn on the same problems, so that the machine's drift (clocks, power, other
# tenants) falls on all of them alike. Then each problem's median over the rounds of the
# back-to-back ms (the host-cu_seqlens column for batches), per binary, and its ratio to the
# first binary's (below 1: faster). Any row the bench found out of tolerance is named.
#
#   bash benches/h200_ab.sh "<bench-gpu's arguments: 0-3,11-19 or --batches>" bench-a bench-b ...
#
# Raw rows go to $OUT/ab-<problems>.txt. ROUNDS (default 3), DEADLINE (seconds, default 540).
set -uo pipefail
deadline=540
source "$(dirname "$0")/h200_common.sh"
problems=$1
shift
raw="$out/ab-$(printf '%s' "$problems" | tr -c '0-9a-z' '_').txt"
: >"$raw"
for round in $(seq "${ROUNDS:-3}"); do
    for binary in "$@"; do
        room 60 "round $round of $binary" || continue
        step "round $round: $(basename "$binary") $problems"
        # shellcheck disable=SC2086 # the problems are bench-gpu's arguments, split on purpose
        timeout 60 "$binary" $problems | grep '^|' | sed "s/^/$(basename "$binary") $round /" >>"$raw"
    done
done
python3 - "$raw" "$@" <<'SUMMARY'
import statistics, sys, os
raw, binaries = sys.argv[1], [os.path.basename(b) for b in sys.argv[2:]]
times, bad, order = {}, set(), []
for line in open(raw):
    binary, _round, row = line.split(" ", 2)
    cells = [c.strip() for c in row.strip().strip("|").split("|")]
    if cells[0] in ("#", "batch") or cells[0].startswith("-"):
        continue
    key = cells[0]
    ms = float(cells[5] if key.isdigit() else cells[4])  # back to back; batches: host cu_seqlens
    if key not in order:
        order.append(key)
    times.setdefault((key, binary), []).append(ms)
    if "OUT OF TOLERANCE" in row:
        bad.add((key, binary))
print("| problem | " + " | ".join(binaries) + " |")
print("|---" * (len(binaries) + 1) + "|")
for key in order:
    base = statistics.median(times.get((key, binaries[0]), [float("nan")]))
    cells = []
    for b in binaries:
        got = times.get((key, b))
        if not got:
            cells.append("-")
            continue
        m = statistics.median(got)
        mark = " OUT OF TOLERANCE" if (key, b) in bad else ""
        cells.append(f"{m:.4f}" + ("" if b == binaries[0] else f" ({m / base:.3f})") + f" [{len(got)}]{mark}")
    print(f"| {key} | " + " | ".join(cells) + " |")
SUMMARY
step done

#!/usr/bin/env python3
"""Reads Nsight Compute's SASS source page (`ncu -i report --page source --csv --print-source
sass`, as benches/h200_short_profile.sh writes it) and prints where the warps stalled: the
samples per execution count (the computing warps run the per-tile code once per tile each, the
copying warps theirs per key tile, so equal counts mostly mean one kind of code), then the
hottest instructions with their offset in the kernel and their two main stall reasons.

    python3 benches/sass_stalls.py b64-sass.csv [instructions, default 40]
"""
import csv
import sys

REASONS = ["barrier", "branch_resolving", "dispatch", "drain", "imc", "lg", "long_sb", "math", "membar", "mio",
           "misc", "no_inst", "not_selected", "selected", "short_sb", "sleep", "tex", "wait"]


def main():
    rows = list(csv.reader(open(sys.argv[1])))
    header = next(r for r in rows if "Address" in r)
    data = [r for r in rows[rows.index(header) + 1:] if len(r) == len(header)]
    col = {name: header.index(name) for name in header}
    samples = col["Warp Stall Sampling (All Samples)"]
    executed = col["Instructions Executed"]
    base = int(data[0][col["Address"]], 16)
    number = lambda cell: float(cell.replace(",", "") or 0)  # noqa: E731
    total = sum(number(r[samples]) for r in data)
    print(f"{len(data)} instructions, {total:.0f} samples")

    by_count = {}
    for r in data:
        by_count[r[executed]] = by_count.get(r[executed], 0) + number(r[samples])
    print("\n| executed | samples | share |\n|---|---|---|")
    for count, s in sorted(by_count.items(), key=lambda kv: -kv[1])[:8]:
        print(f"| {count} | {s:.0f} | {100 * s / total:.1f}% |")

    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    print("\n| offset | samples | executed | instruction | main reasons |\n|---|---|---|---|---|")
    for r in sorted(data, key=lambda r: -number(r[samples]))[:top]:
        reasons = sorted(((number(r[col["stall_" + k]]), k) for k in REASONS if "stall_" + k in col), reverse=True)[:2]
        why = ", ".join(f"{k} {v:.0f}" for v, k in reasons if v > 0)
        offset = int(r[col["Address"]], 16) - base
        print(f"| {offset:#x} | {number(r[samples]):.0f} | {r[executed]} | `{r[col['Source']].strip()}` | {why} |")


main()

#!/usr/bin/env python3
"""Merges the GPU bench output (benches/gpu.rs, a markdown table) and the PyTorch timings
(benches/peers/torch_gpu.py, JSON lines) of one run into BENCHMARKS.md's comparison table.

    python3 benches/peers/gpu_table.py ours.md torch.jsonl [mma-sync.md]

The optional third file, a second bench table of the same run (the other kernel), adds a column.
"""
import json
import sys


def bench_table(path):
    rows = {}
    for line in open(path):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[0].isdigit():
            rows[int(cells[0])] = {"H": cells[1], "D": cells[2], "L": cells[3], "call": float(cells[4]), "b2b": float(cells[5]),
                                   "tflops": float(cells[6]), "limit": float(cells[7]), "host": float(cells[8]), "error": cells[9]}
    return rows


ours = bench_table(sys.argv[1])
other = bench_table(sys.argv[3]) if len(sys.argv) > 3 else {}
torch = {}
for line in open(sys.argv[2]):
    if line.startswith("{"):
        r = json.loads(line)
        torch[r["shape"]] = r

extra = " mma.sync ms |" if other else ""
print(f"| # | H | D | L | ours ms |{extra} FA2 varlen ms | cuDNN ms | vs FA2 | vs cuDNN | ours TFLOP/s | % of limit | max error |")
print("|---|---|---|---|---|" + ("---|" if other else "") + "---|---|---|---|---|---|---|")
for i in sorted(ours):
    o, t = ours[i], torch.get(i, {})
    fa2, cudnn = t.get("fa2_b2b_ms"), t.get("cudnn_b2b_ms")
    ratio = lambda x: f"{x / o['b2b']:.2f}x" if x else "-"  # noqa: E731
    second = f" {other[i]['b2b']:.4f} |" if i in other else (" - |" if other else "")
    print(f"| {i} | {o['H']} | {o['D']} | {o['L']} | {o['b2b']:.4f} |{second} {fa2 and f'{fa2:.4f}' or '-'} | "
          f"{cudnn and f'{cudnn:.4f}' or 'no kernel'} | {ratio(fa2)} | {ratio(cudnn)} | {o['tflops']:.0f} | {o['limit']:.1f} | "
          f"{o['error']} |")

#!/usr/bin/env python3
"""Log-log plot of CPU time against L from `cargo bench --bench scaling` output (CSV on stdin or
a file), with the L² reference line through the largest point. Needs matplotlib.

    cargo bench --bench scaling | grep -E '^[0-9L]' > scaling.csv
    python3 tools/plot_scaling.py scaling.csv docs/cpu-scaling.png
"""
import csv
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

rows = list(csv.DictReader(open(sys.argv[1])))
lengths = [float(r["L"]) for r in rows]
ms = [float(r["milliseconds"]) for r in rows]
reference = [ms[-1] * (l / lengths[-1]) ** 2 for l in lengths]
plt.figure(figsize=(7, 5))
plt.loglog(lengths, ms, "o-", label="varlen-attn, CPU (2 threads)")
plt.loglog(lengths, reference, "--", color="gray", label="L² through the largest point")
plt.xlabel("sequence length L (H = 16, D = 72, bf16)")
plt.ylabel("time per call (ms)")
plt.title("CPU attention forward: time against L")
plt.grid(True, which="both", alpha=0.3)
plt.legend()
plt.savefig(sys.argv[2], dpi=110, bbox_inches="tight")
print("wrote", sys.argv[2])

#!/usr/bin/env python3
"""PyTorch's CPU scaled_dot_product_attention on the seed shapes, for side-by-side ratios.

Not run in CI (PyTorch comes from PyPI: `pip install torch numpy`). Prints one JSON object per
shape: the median time over the repeats, after one warm-up call, bf16 inputs drawn from randn,
laid out [1, heads, L, head_dim] as SDPA wants them (the seed's loop transposes the same way).

    python3 benches/peers/torch_sdpa.py --threads 2 --shapes 0,1,2,11-14
"""
import argparse
import json
import time

import torch
import torch.nn.functional as F

SHAPES = [(16, 72, 720), (16, 72, 1200), (16, 72, 2116), (16, 72, 3844), (16, 72, 8136), (16, 72, 17296),
          (16, 72, 24368), (16, 72, 49596), (16, 72, 65556), (32, 128, 16742), (32, 128, 30793), (4, 72, 276),
          (4, 72, 600), (4, 72, 1012), (4, 72, 2024), (4, 72, 4100), (4, 72, 8184), (4, 72, 15476),
          (4, 72, 24952), (4, 72, 40560), (8, 128, 1)]


def parse(selection):
    chosen = []
    for part in selection.split(","):
        if "-" in part:
            a, b = part.split("-")
            chosen += range(int(a), int(b) + 1)
        else:
            chosen.append(int(part))
    return chosen


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default="0-6,11-20")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-flop", type=float, default=1e13)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    for index in parse(args.shapes):
        heads, dim, length = SHAPES[index]
        flop = 4.0 * length * length * dim * heads
        if flop > args.max_flop:
            continue
        g = torch.Generator().manual_seed(index)
        q, k, v = (torch.randn(1, heads, length, dim, generator=g).to(torch.bfloat16) for _ in range(3))
        F.scaled_dot_product_attention(q, k, v)
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            F.scaled_dot_product_attention(q, k, v)
            times.append(time.perf_counter() - start)
        times.sort()
        median = times[len(times) // 2]
        print(json.dumps({"shape": index, "median_ms": median * 1e3, "gflops": flop / median / 1e9,
                          "torch": torch.__version__, "threads": args.threads}), flush=True)


if __name__ == "__main__":
    main()

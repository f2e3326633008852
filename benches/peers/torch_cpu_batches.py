#!/usr/bin/env python3
"""PyTorch's CPU SDPA on batches of equal-sized images (16 heads x 72, bf16), the fastest of six
calls, as `examples/cpu_batch.rs` times ours. Equal sizes let PyTorch run one dense batched
call, its best case (a batch of different sizes would need padding or a loop).

    ATEN_CPU_CAPABILITY=avx2 python3 benches/peers/torch_cpu_batches.py --threads 2
"""
import sys
import time

import torch

threads = int(sys.argv[sys.argv.index("--threads") + 1]) if "--threads" in sys.argv else 2
torch.set_num_threads(threads)
for n, length in [(64, 256), (16, 1024), (256, 64), (4, 4096)]:
    q, k, v = (torch.randn(n, 16, length, 72, dtype=torch.bfloat16) for _ in range(3))
    flops = 4.0 * n * length * length * 72 * 16
    best = float("inf")
    for _ in range(6):
        start = time.perf_counter()
        torch.nn.functional.scaled_dot_product_attention(q, k, v)
        best = min(best, time.perf_counter() - start)
    print(f"torch {n} x {length}: {best * 1e3:.2f} ms, {flops / best / 1e9:.1f} GFLOP/s", flush=True)

#!/usr/bin/env python3
"""PyTorch's FlashAttention-2 varlen kernel and cuDNN SDPA on the seed's shapes, timed like
benches/gpu.rs (CUDA events around single calls, median), on the same GPU in the same run.

    python3 benches/peers/torch_gpu.py 0-20

Prints one JSON object per shape. Needs PyTorch with CUDA (the H200 machine has 2.11).
"""
import json
import os
import sys
import warnings

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(__file__))
from torch_sdpa import SHAPES, parse  # noqa: E402


def median_ms(fn, repeats):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    times.sort()
    return times[len(times) // 2]


def back_to_back_ms(fn, repeats):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(repeats):
        fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / repeats


def main():
    warnings.filterwarnings("ignore")
    for index in parse(sys.argv[1] if len(sys.argv) > 1 else "0-20"):
        heads, dim, length = SHAPES[index]
        flop = 4.0 * length * length * dim * heads
        repeats = 5 if flop > 1e12 else (20 if flop > 1e10 else 100)
        q, k, v = (torch.randn(length, heads, dim, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        cu = torch.tensor([0, length], dtype=torch.int32, device="cuda")
        result = {"shape": index}
        try:
            fa2 = lambda: torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, length, length, 0.0, False, False)
            result["fa2_ms"] = median_ms(fa2, repeats)
            result["fa2_b2b_ms"] = back_to_back_ms(fa2, repeats)
        except Exception as e:  # noqa: BLE001
            result["fa2_error"] = str(e)[:200]
        qt, kt, vt = (x.transpose(0, 1).unsqueeze(0) for x in (q, k, v))
        try:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                cudnn = lambda: F.scaled_dot_product_attention(qt, kt, vt)  # noqa: E731
                result["cudnn_ms"] = median_ms(cudnn, repeats)
                result["cudnn_b2b_ms"] = back_to_back_ms(cudnn, repeats)
        except Exception as e:  # noqa: BLE001
            result["cudnn_error"] = str(e)[:200]
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

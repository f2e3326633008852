#!/usr/bin/env python3
"""PyTorch's FlashAttention-2 varlen kernel on the batches of `benches/gpu.rs --batches` (many
images of different sizes in one call; GQA; head dims 80 and 64), timed back to back between
two CUDA events, as that bench does, on the same GPU in the same run.

    python3 benches/peers/torch_gpu_batches.py

Prints one JSON object per batch. Needs PyTorch with CUDA (the H200 machine has 2.11).
"""
import json
import os
import sys
import warnings

import torch

sys.path.insert(0, os.path.dirname(__file__))
from torch_gpu import back_to_back_ms  # noqa: E402

MIXED = [720, 1200, 276, 3844, 64, 1, 2116, 1012, 600]
BATCHES = [
    ("64 images x 256", 16, 16, 72, [256] * 64),
    ("16 images x 1024", 16, 16, 72, [1024] * 16),
    ("mixed 9 images", 16, 16, 72, MIXED),
    ("GQA 32/8 x 128", 32, 8, 128, [16742, 500, 3000, 1]),
    ("mixed, head_dim 80", 16, 16, 80, MIXED),
    ("mixed, head_dim 64", 16, 16, 64, MIXED),
    ("256 images x 64", 16, 16, 72, [64] * 256),
    ("64 images x 1024", 16, 16, 72, [1024] * 64),
    ("256 images x 1024", 16, 16, 72, [1024] * 256),
    ("1024 images x 1024", 16, 16, 72, [1024] * 1024),
    ("2200 images x 1024", 16, 16, 72, [1024] * 2200),
]


def main():
    warnings.filterwarnings("ignore")
    for label, heads, kv_heads, dim, lengths in BATCHES:
        tokens = sum(lengths)
        flop = 4.0 * sum(n * n for n in lengths) * heads * dim
        repeats = 10 if flop > 1e12 else 100
        q = torch.randn(tokens, heads, dim, dtype=torch.bfloat16, device="cuda")
        k, v = (torch.randn(tokens, kv_heads, dim, dtype=torch.bfloat16, device="cuda") for _ in range(2))
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32, device="cuda")
        longest = max(lengths)
        result = {"batch": label, "tflop": flop / 1e12}
        try:
            fa2 = lambda: torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, longest, longest, 0.0, False, False)  # noqa: E731
            result["fa2_b2b_ms"] = back_to_back_ms(fa2, repeats)
        except Exception as e:  # noqa: BLE001
            result["fa2_error"] = str(e)[:200]
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""varlen_attn.flash_attn_varlen_func against the per-sequence SDPA loop vLLM runs on a CPU
(one torch.nn.functional.scaled_dot_product_attention call per image, bf16), Python overhead
included, in one process on the same threads. Also the binding's per-call overhead on a
one-token call.

    python3 benches/peers/python_binding.py --threads 2   (with the package installed: pip install ./python)

Prints the machine, then one markdown row per workload: the best of several calls each.
"""
import argparse
import os
import platform
import time

import torch

import varlen_attn

# The seed shapes (16 or 4 heads x 72; one sequence of L tokens) and batches of images.
SHAPES = [
    ("0: 16x72, L 720", 16, 72, [720]),
    ("1: 16x72, L 1200", 16, 72, [1200]),
    ("2: 16x72, L 2116", 16, 72, [2116]),
    ("3: 16x72, L 3844", 16, 72, [3844]),
    ("4: 16x72, L 8136", 16, 72, [8136]),
    ("11: 4x72, L 276", 4, 72, [276]),
    ("12: 4x72, L 600", 4, 72, [600]),
    ("13: 4x72, L 1012", 4, 72, [1012]),
    ("14: 4x72, L 2024", 4, 72, [2024]),
    ("15: 4x72, L 4100", 4, 72, [4100]),
    ("16: 4x72, L 8184", 4, 72, [8184]),
    ("mixed 9 images, 16x72", 16, 72, [720, 1200, 276, 3844, 64, 1, 2116, 1012, 600]),
    ("64 images x 256, 16x72", 16, 72, [256] * 64),
    ("16 images x 1024, 16x72", 16, 72, [1024] * 16),
]


def best_ms(fn, calls):
    fn()
    best = float("inf")
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    # Our thread pool (rayon) takes its size from this variable, read once at the first call.
    os.environ.setdefault("RAYON_NUM_THREADS", str(args.threads))
    print(f"{cpu_name()}, {args.threads} threads, torch {torch.__version__} "
          f"(ATEN_CPU_CAPABILITY={os.environ.get('ATEN_CPU_CAPABILITY', 'default')}), varlen_attn on {varlen_attn.cpu_isa()}\n")
    print("| workload | SDPA loop ms | varlen_attn ms | speed-up | GFLOP/s (ours) |")
    print("|---|---|---|---|---|")
    g = torch.Generator().manual_seed(0)
    for label, heads, d, lengths in SHAPES:
        tokens = sum(lengths)
        q, k, v = (torch.randn(tokens, heads, d, generator=g).to(torch.bfloat16) for _ in range(3))
        cu = torch.tensor([0] + list(torch.tensor(lengths).cumsum(0).tolist()), dtype=torch.int32)
        longest = max(lengths)
        bounds = cu.tolist()

        def sdpa_loop():
            out = torch.empty_like(q)
            for b in range(len(lengths)):
                s, e = bounds[b], bounds[b + 1]
                # [L, H, D] -> [1, H, L, D] and back, as vLLM's vision encoders do per image.
                x = [t[s:e].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
                out[s:e] = torch.nn.functional.scaled_dot_product_attention(*x).squeeze(0).transpose(0, 1)
            return out

        def ours():
            return varlen_attn.flash_attn_varlen_func(q, k, v, cu, cu, longest, longest)

        flops = 4.0 * sum(n * n for n in lengths) * heads * d
        calls = 3 if flops > 2e11 else 10
        theirs_ms, ours_ms = best_ms(sdpa_loop, calls), best_ms(ours, calls)
        print(f"| {label} | {theirs_ms:.2f} | {ours_ms:.2f} | {theirs_ms / ours_ms:.2f}x | {flops / ours_ms / 1e6:.0f} |", flush=True)

    # Seed shape 20: one token, 8 heads x 128: the binding's overhead over the Rust call
    # (measured by the Rust bench as a few microseconds).
    q = torch.randn(1, 8, 128).to(torch.bfloat16)
    cu = torch.tensor([0, 1], dtype=torch.int32)
    out = torch.empty_like(q)
    per_call = best_ms(lambda: [varlen_attn.flash_attn_varlen_func(q, q, q, cu, cu, 1, 1, out=out) for _ in range(1000)], 5)
    sdpa = best_ms(lambda: [torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), q.transpose(0, 1), q.transpose(0, 1)) for _ in range(1000)], 5)
    print(f"\nshape 20 (one token, 8x128): varlen_attn {per_call:.1f} us per call, SDPA {sdpa:.1f} us per call")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""Side-by-side CPU comparison: varlen-attn (its `bench` command) and PyTorch's
scaled_dot_product_attention, alternating shape by shape in one run, same thread count, same
element type, same instruction set.

    cargo build --release -p varlen-attn-cli
    python3 benches/peers/compare_cpu.py --threads 2 --shapes 0-6,11-20 --repeats 5 [--dtype f32] [--isa avx2]

`--isa avx2` forces our AVX2 path (`--isa avx2`) and PyTorch's (ATEN_CPU_CAPABILITY=avx2,
MKL_ENABLE_INSTRUCTIONS=AVX2, ONEDNN_MAX_CPU_ISA=AVX2, set before torch is imported), so that
the AVX2 path can be measured on any x86; the table's header names what PyTorch reports.

Prints a markdown table (BENCHMARKS.md keeps it). PyTorch comes from PyPI (`pip install torch`);
not part of CI.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import time

# PyTorch reads its instruction-set caps when it is imported: parse --isa first.
ISA_ENV = {
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    "avx512": {"ATEN_CPU_CAPABILITY": "avx512", "MKL_ENABLE_INSTRUCTIONS": "AVX512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE"},
}
_early = argparse.ArgumentParser(add_help=False)
_early.add_argument("--isa", default="auto")
os.environ.update(ISA_ENV.get(_early.parse_known_args()[0].isa, {}))

sys.path.insert(0, os.path.dirname(__file__))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch_sdpa import SHAPES, parse  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}


def torch_median(index, repeats, dtype):
    heads, dim, length = SHAPES[index]
    g = torch.Generator().manual_seed(index)
    q, k, v = (torch.randn(1, heads, length, dim, generator=g).to(DTYPES[dtype]) for _ in range(3))
    warm_up = time.perf_counter()
    F.scaled_dot_product_attention(q, k, v)
    while time.perf_counter() - warm_up < 0.3:  # as the CLI: 0.3 s of warm-up calls
        F.scaled_dot_product_attention(q, k, v)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        F.scaled_dot_product_attention(q, k, v)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def ours(binary, index, repeats, threads, dtype, isa):
    with tempfile.NamedTemporaryFile(suffix=".json") as f:
        env = dict(os.environ, RAYON_NUM_THREADS=str(threads))
        subprocess.run([binary, "bench", "--shapes", str(index), "--repeats", str(repeats), "--quiet",
                        "--check-rows", "4", "--max-flop", "1e15", "--json", f.name, "--dtype", dtype, "--isa", isa],
                       check=True, env=env, stdout=subprocess.DEVNULL)
        report = json.load(open(f.name))
    return report, report["results"][0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shapes", default="0-6,11-20")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--binary", default="target/release/varlen-attn")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--isa", default="auto", help="auto, or a path to force on both sides (avx2, avx512)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    rows = []
    report = None
    for index in parse(args.shapes):
        report, r = ours(args.binary, index, args.repeats, args.threads, args.dtype, args.isa)
        t = torch_median(index, args.repeats, args.dtype)
        rows.append((report, r, t))
        print(f"shape {index}: ours {r['median_ms']:.3f} ms, torch {t * 1e3:.3f} ms, x{t * 1e3 / r['median_ms']:.2f}",
              file=sys.stderr, flush=True)
    # Each `bench` call measures the peak for 0.3 s; on a shared machine single readings dip, so
    # the highest reading of the run is the peak every row is a fraction of.
    peak = max((rep["peak_gflops"] or 0) for rep, _, _ in rows)
    print(f"CPU path `{report['cpu_isa']}`, {args.threads} threads, {args.dtype}; torch {torch.__version__} "
          f"(CPU capability {torch.backends.cpu.get_cpu_capability()}); "
          f"peak {peak:.0f} GFLOP/s ({report['peak_unit']}, the highest of the run's readings)\n")
    print("| # | H | D | L | ours ms | PyTorch ms | speed-up | ours GFLOP/s | % of peak | max error |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (_, r, t), index in zip(rows, parse(args.shapes)):
        heads, dim, length = SHAPES[index]
        print(f"| {index} | {heads} | {dim} | {length} | {r['median_ms']:.3f} | {t * 1e3:.3f} | "
              f"{t * 1e3 / r['median_ms']:.2f}x | {r['gflops']:.0f} | {100 * r['gflops'] / peak if peak else 0:.1f} | "
              f"{r['max_abs_error']:.1e} |")


if __name__ == "__main__":
    main()

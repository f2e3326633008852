#!/usr/bin/env python3
"""Kernel time per call on the seed's small shapes, ours beside PyTorch's FA2 varlen and cuDNN,
all measured the same way: Nsight Compute's `gpu__time_duration` of every kernel a call
launches (ours: the attention kernel, plus the merge where the keys are split; cuDNN: its
kernel plus its memset), no clock locking, no cache flushing, in one run on one GPU.

Back-to-back event timings hide launch gaps but not host time: PyTorch's Python dispatch
(25-40 µs) bounds its small-shape timings, so there only kernel time compares kernels.

    python3 benches/peers/kernel_times.py .gpu-bin/bench-gpu 0-3,11-15,20

The first argument is the bench binary of `tools/gpu-bundle.sh bench --bench gpu`.
Prints a markdown table, then one JSON object per shape. Problems are seed shapes' indices or
custom shapes (`HxDxL[xN]`: N sequences of L tokens, H heads of D columns): FA2 varlen runs
them packed, cuDNN as one dense [N, H, L, D] batch (the same work for equal lengths).

    python3 benches/peers/kernel_times.py --ours .gpu-bin/bench-main,.gpu-bin/bench-new 11,2,16x72x300,4x72x190x8

compares builds only (no PyTorch kernels): each one's kernel time on seed shapes and on the bench's
custom shapes (`HxDxL[xN]`, as `VARLEN_ATTN_BENCH_SHAPES` takes them), builds in turn per problem.
"""
import csv
import io
import json
import os
import statistics
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_sdpa import SHAPES, parse  # noqa: E402

CALLS = 5
NCU = ["ncu", "--csv", "--page", "raw", "--metrics", "gpu__time_duration.sum", "--clock-control", "none",
       "--cache-control", "none"]


def kernels(command, extra=(), env=None):
    """(name, microseconds) of each kernel `command` launches under Nsight Compute, and the
    command's other output lines."""
    run = subprocess.run(NCU + list(extra) + command, capture_output=True, text=True, env=env)
    rows = [line for line in run.stdout.splitlines() if line.startswith('"')]
    other = [line for line in run.stdout.splitlines() if not line.startswith('"')]
    if not rows:
        sys.exit(f"ncu found no kernels in {command}:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}")
    table = list(csv.DictReader(io.StringIO("\n".join(rows))))
    units = table[0]["gpu__time_duration.sum"]
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}[units]
    return [(r["Kernel Name"], float(r["gpu__time_duration.sum"].replace(",", "")) * scale) for r in table[1:]], other


def ours(binary, problem):
    """Our kernel time per call: the median attention kernel plus the median merge, if any.
    `problem` is a seed shape's index, or one of the bench's custom shapes (`HxDxL[xN]`)."""
    env = dict(os.environ, VARLEN_ATTN_BENCH_REPEATS=str(CALLS))
    if isinstance(problem, int):
        command = [binary, str(problem)]
    else:  # custom shapes run alone where no seed shape is named
        env["VARLEN_ATTN_BENCH_SHAPES"] = problem
        command = [binary, "--custom"]
    found, _ = kernels(command, ["-k", "regex:va_attention"], env)
    attention = [us for name, us in found if "forward" in name]
    merge = [us for name, us in found if "merge" in name]
    return statistics.median(attention) + (statistics.median(merge) if merge else 0.0), len(merge) > 0


def compare_builds(binaries, problems):
    """Prints each build's kernel time per problem (a seed shape's index or a custom shape)."""
    names = [os.path.basename(b) for b in binaries]
    print("| problem | " + " | ".join(f"{n} µs" for n in names) + " |")
    print("|---" * (len(names) + 1) + "|")
    for problem in problems:
        cells = []
        for binary in binaries:
            us, split = ours(binary, int(problem) if problem.isdigit() else problem)
            cells.append(f"{us:.1f}{' (split)' if split else ''}")
        print(f"| {problem} | " + " | ".join(cells) + " |", flush=True)


def problem_shape(problem):
    """(heads, dim, length, sequences) of a seed shape's index or a custom `HxDxL[xN]`."""
    if problem.isdigit():
        return (*SHAPES[int(problem)], 1)
    parts = [int(x) for x in problem.split("x")]
    return (*parts, 1) if len(parts) == 3 else tuple(parts)


def parse_problems(selection):
    """Seed shapes (`0-3,11`) and custom shapes (`16x72x256x64`), comma-separated."""
    problems = []
    for part in selection.split(","):
        problems += [part] if "x" in part else [str(i) for i in parse(part)]
    return problems


def torch_worker(problems):
    """Runs under ncu: CALLS calls per backend and problem inside profiler ranges."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for problem in problems:
        heads, dim, length, sequences = problem_shape(problem)
        q, k, v = (torch.randn(sequences * length, heads, dim, dtype=torch.bfloat16, device="cuda") for _ in range(3))
        cu = torch.arange(0, sequences * length + 1, length, dtype=torch.int32, device="cuda")
        qt, kt, vt = (x.view(sequences, length, heads, dim).transpose(1, 2) for x in (q, k, v))

        def fa2():
            torch.ops.aten._flash_attention_forward(q, k, v, cu, cu, length, length, 0.0, False, False)

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qt, kt, vt)

        for backend, call in (("fa2", fa2), ("cudnn", cudnn)):
            try:
                for _ in range(3):
                    call()
            except RuntimeError:
                print(f"no-kernel {backend} {problem}", flush=True)
                continue
            torch.cuda.synchronize()
            torch.cuda.profiler.start()
            for _ in range(CALLS):
                call()
            torch.cuda.synchronize()
            torch.cuda.profiler.stop()


def torch_times(problems):
    """{problem: (FA2 µs, cuDNN µs or None)} per call: the profiled ranges hold CALLS FA2 calls
    (kernels named flash) then CALLS cuDNN calls (every other kernel) per problem, in order,
    but for backends that have no kernel for a problem."""
    found, other = kernels([sys.executable, os.path.abspath(__file__), "--torch-worker", ",".join(problems)],
                    ["--profile-from-start", "off"])
    runs = []  # runs of consecutive kernels of one backend
    for name, us in found:
        backend = "fa2" if "flash_fwd" in name else "cudnn"  # FA2's kernels are flash_fwd_*
        if runs and runs[-1][0] == backend:
            runs[-1][1].append(us)
        else:
            runs.append((backend, [us]))
    print("kernels:", sorted({name[:120] for name, _ in found}), file=sys.stderr)
    missing = {tuple(line.split()[1:]) for line in other if line.startswith("no-kernel")}
    expected = [(b, i) for i in problems for b in ("fa2", "cudnn") if (b, i) not in missing]
    # Where a backend has no kernel for a problem, the other's runs of consecutive problems
    # merge: split such a run evenly among the problems it holds.
    groups, at = [], 0
    for backend, times in runs:
        n = 1
        while at + n < len(expected) and expected[at + n][0] == backend:
            n += 1
        size = len(times) // n if len(times) % n == 0 else len(times)
        groups += [(backend, times[j:j + size]) for j in range(0, len(times), size)]
        at += n
    if [g[0] for g in groups] != [b for b, _ in expected]:
        sys.exit(f"unexpected kernel sequence: {[(g[0], len(g[1])) for g in groups]}, expected {expected}")
    times = {(b, i): sum(g[1]) / CALLS for (b, i), g in zip(expected, groups)}
    return {i: (times.get(("fa2", i)), times.get(("cudnn", i))) for i in problems}


def main():
    if sys.argv[1] == "--torch-worker":
        torch_worker(sys.argv[2].split(","))
        return
    if sys.argv[1] == "--ours":
        compare_builds(sys.argv[2].split(","), parse_problems(sys.argv[3]))
        return
    binary, problems = sys.argv[1], parse_problems(sys.argv[2] if len(sys.argv) > 2 else "0-3,11-15,20")
    theirs = torch_times(problems)
    print("| problem | H | D | L | N | ours µs | FA2 varlen µs | cuDNN µs | vs FA2 | vs cuDNN |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    records = []
    for problem in problems:
        heads, dim, length, sequences = problem_shape(problem)
        mine, split = ours(binary, int(problem) if problem.isdigit() else problem)
        fa2, cudnn = theirs[problem]
        time = lambda us: "no kernel" if us is None else f"{us:.1f}"  # noqa: E731
        ratio = lambda us: "-" if us is None else f"{us / mine:.2f}x"  # noqa: E731
        print(f"| {problem} | {heads} | {dim} | {length} | {sequences} | {mine:.1f}{' (split)' if split else ''} | {time(fa2)} | "
              f"{time(cudnn)} | {ratio(fa2)} | {ratio(cudnn)} |", flush=True)
        records.append({"problem": problem, "ours_us": mine, "split": split, "fa2_us": fa2, "cudnn_us": cudnn})
    for record in records:
        print(json.dumps(record))


if __name__ == "__main__":
    main()

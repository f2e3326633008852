#!/usr/bin/env python3
"""Each kernel's duration in the first batch of `bench-gpu --batches` (64 images x 256 tokens),
cu_seqlens on the host (the attention kernel alone) against cu_seqlens on the device
(`va_plan_tiles`, then the attention kernel): medians over the calls Nsight Compute saw, in µs,
measured as benches/kernel_times.py measures (each kernel alone, so the gaps between kernels
are not in it; clocks and caches as they are).

    python3 benches/kernel_durations.py .gpu-bin/bench-gpu

The bench makes 103 host-cu_seqlens calls of the first batch (3 warm-ups, 100 timed), then the
same with cu_seqlens on the device; the first 230 kernels cover the first and about 60 of the
second.
"""
import os
import statistics
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from kernel_times import kernels  # noqa: E402

HOST_CALLS = 103
PROFILED_KERNELS = 230


def main():
    found, _ = kernels([sys.argv[1], "--batches"], ["-k", "regex:va_", "-c", str(PROFILED_KERNELS)])
    host, device = found[:HOST_CALLS], found[HOST_CALLS:]

    def median(part, prefix):
        times = [us for name, us in part if name.startswith(prefix)]
        return f"{statistics.median(times):.1f} ({len(times)})" if times else "-"

    print("| cu_seqlens | va_plan_tiles µs (kernels) | attention kernel µs (kernels) |")
    print("|---|---|---|")
    print(f"| host | {median(host, 'va_plan')} | {median(host, 'va_attention_forward')} |")
    print(f"| device | {median(device, 'va_plan')} | {median(device, 'va_attention_forward')} |")


main()

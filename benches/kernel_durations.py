#!/usr/bin/env python3
"""Each kernel's duration in the first batch of `bench-gpu --batches` (64 images x 256 tokens),
cu_seqlens on the host (the attention kernel alone) against cu_seqlens on the device
(`va_plan_tiles`, then the attention kernel): medians over the calls Nsight Compute saw, in µs.
Nsight Compute runs each kernel alone (the gaps between kernels are not in it).

    ncu --csv --page raw --metrics gpu__time_duration.sum -k regex:va_ -c 230 \\
        --clock-control none --cache-control none bench-gpu --batches > durations.csv
    python3 benches/kernel_durations.py durations.csv

The bench makes 103 host-cu_seqlens calls of the first batch (3 warm-ups, 100 timed), then the
same with cu_seqlens on the device; 230 kernels cover the first and about 60 of the second.
"""
import csv
import io
import statistics
import sys

HOST_CALLS = 103


def main():
    lines = [line for line in open(sys.argv[1]) if line.startswith('"')]
    table = list(csv.DictReader(io.StringIO("".join(lines))))
    scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
    unit = scale[table[0]["gpu__time_duration.sum"]]
    kernels = [(r["Kernel Name"], float(r["gpu__time_duration.sum"].replace(",", "")) * unit) for r in table[1:]]
    host, device = kernels[:HOST_CALLS], kernels[HOST_CALLS:]

    def median(part, prefix):
        times = [us for name, us in part if name.startswith(prefix)]
        return f"{statistics.median(times):.1f} ({len(times)})" if times else "-"

    print("| cu_seqlens | va_plan_tiles µs (kernels) | attention kernel µs (kernels) |")
    print("|---|---|---|")
    print(f"| host | {median(host, 'va_plan')} | {median(host, 'va_attention_forward')} |")
    print(f"| device | {median(device, 'va_plan')} | {median(device, 'va_attention_forward')} |")


main()

#!/usr/bin/env python3
"""The bus and PyTorch's end-to-end call on host tensors, on the shapes of `benches/gpu.rs
--host` (seed shapes 4 and 9, 1,024 images x 1,024 tokens, bf16), on the same GPU in the same
run: the page-locked host-to-device and device-to-host bandwidth (1 GiB copies), and
`q.cuda()`, `k.cuda()`, `v.cuda()`, FA2 varlen, `out.cpu()` from pageable and from
page-locked tensors (median of five after one warm-up, wall clock).

    python3 benches/peers/torch_host_path.py

Prints one JSON object per line. Needs PyTorch with CUDA.
"""
import json
import time
import warnings

import torch

SHAPES = [("16 x 72 x 8136", 16, 72, [8136]), ("32 x 128 x 16742", 32, 128, [16742]),
          ("16 x 72 x 1024 x 1024", 16, 72, [1024] * 1024)]


def median_wall_ms(fn, repeats=5):
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    times.sort()
    return times[len(times) // 2]


def bandwidth():
    host = torch.empty(1 << 30, dtype=torch.uint8, pin_memory=True)
    device = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    h2d = median_wall_ms(lambda: device.copy_(host, non_blocking=True))
    d2h = median_wall_ms(lambda: host.copy_(device, non_blocking=True))
    return {"pinned_h2d_gb_s": (1 << 30) / h2d / 1e6, "pinned_d2h_gb_s": (1 << 30) / d2h / 1e6}


def main():
    warnings.filterwarnings("ignore")
    print(json.dumps(bandwidth()), flush=True)
    for label, heads, dim, lengths in SHAPES:
        tokens = sum(lengths)
        cu_host = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int32)
        longest = max(lengths)
        result = {"shape": label, "mb_moved": 4 * tokens * heads * dim * 2 / 1e6}
        for pinned in (False, True):
            q, k, v = (torch.rand(tokens, heads, dim, dtype=torch.bfloat16).pin_memory() if pinned
                       else torch.rand(tokens, heads, dim, dtype=torch.bfloat16) for _ in range(3))

            def call():
                qd, kd, vd = (x.cuda(non_blocking=pinned) for x in (q, k, v))
                cu = cu_host.cuda()
                out = torch.ops.aten._flash_attention_forward(qd, kd, vd, cu, cu, longest, longest, 0.0, False, False)[0]
                return out.cpu()

            result["pinned_ms" if pinned else "pageable_ms"] = median_wall_ms(call)
            del q, k, v
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()

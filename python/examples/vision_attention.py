#!/usr/bin/env python3
"""A vision encoder's attention layer (Qwen2-VL style): the patches of several images packed
along one axis, cu_seqlens from each image's grid (frames x rows x columns of patches). The
per-image loop of scaled_dot_product_attention that vLLM runs on a CPU becomes one call.

    pip install ./python && python3 python/examples/vision_attention.py
"""
import time

import torch
import torch.nn.functional as F

from varlen_attn import flash_attn_varlen_func


class VisionAttention(torch.nn.Module):
    def __init__(self, dim=1280, num_heads=16, use_varlen_attn=True):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = torch.nn.Linear(dim, 3 * dim)
        self.proj = torch.nn.Linear(dim, dim)
        self.use_varlen_attn = use_varlen_attn

    def forward(self, x, cu_seqlens):
        tokens = x.shape[0]
        q, k, v = self.qkv(x).reshape(tokens, 3, self.num_heads, -1).unbind(1)
        if self.use_varlen_attn:
            # One call for every image; q, k and v are read in place (strided views of qkv).
            longest = int((cu_seqlens[1:] - cu_seqlens[:-1]).max())
            out = flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, longest, longest)
        else:
            # The per-image loop.
            out = torch.empty_like(q)
            bounds = cu_seqlens.tolist()
            for start, end in zip(bounds, bounds[1:]):
                image = [t[start:end].transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
                out[start:end] = F.scaled_dot_product_attention(*image).squeeze(0).transpose(0, 1)
        return self.proj(out.reshape(tokens, -1))


def cu_seqlens_from_grid(grid_thw):
    """One sequence per frame: t frames of h x w patches each (Qwen2-VL's rule)."""
    per_frame = torch.repeat_interleave(grid_thw[:, 1] * grid_thw[:, 2], grid_thw[:, 0])
    return F.pad(per_frame.cumsum(0, dtype=torch.int32), (1, 0))


def main():
    torch.manual_seed(0)
    # Four images of different sizes (patch grids after 14-pixel patching), one of two frames.
    grid_thw = torch.tensor([[1, 36, 52], [1, 24, 24], [2, 16, 28], [1, 8, 8]])
    cu_seqlens = cu_seqlens_from_grid(grid_thw)
    x = torch.randn(int(cu_seqlens[-1]), 1280, dtype=torch.bfloat16)
    layer = VisionAttention().to(torch.bfloat16).eval()
    with torch.no_grad():
        times = {}
        outputs = {}
        for use in (False, True):
            layer.use_varlen_attn = use
            layer(x, cu_seqlens)
            start = time.perf_counter()
            outputs[use] = layer(x, cu_seqlens)
            times[use] = (time.perf_counter() - start) * 1e3
    difference = (outputs[True].float() - outputs[False].float()).abs().max().item()
    scale = outputs[False].float().abs().max().item()
    print(f"{len(cu_seqlens) - 1} sequences, {int(cu_seqlens[-1])} patches")
    print(f"per-image SDPA loop: {times[False]:.1f} ms; one varlen_attn call: {times[True]:.1f} ms (the layer, projections included)")
    print(f"largest difference {difference:.3g} (outputs up to {scale:.3g}; bf16 rounding)")
    assert difference <= 2e-2 * max(1.0, scale), "the two layers disagree"


if __name__ == "__main__":
    main()

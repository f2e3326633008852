#!/usr/bin/env python3
"""Writes the hand-made seeds of the `safetensors` fuzz target (fuzz/seeds/safetensors): small valid attention inputs in
bf16, f16 and f32 (as `safetensors.torch.save_file` would), plus near-misses. Needs numpy and
safetensors from PyPI; the corpus is committed, so this only reruns when the format changes."""
import os
import struct

import numpy as np
from safetensors.numpy import save

root = os.path.join(os.path.dirname(__file__), "seeds", "safetensors")
os.makedirs(root, exist_ok=True)
rng = np.random.default_rng(0)


def bf16_bytes(a):
    """bfloat16 bits of a float32 array (round to nearest even)."""
    bits = a.astype(np.float32).view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return rounded.tobytes()


def write_raw(name, tensors):
    """A safetensors file from (name, dtype, shape, bytes) entries, written by hand for bf16."""
    header, offset, blobs = {}, 0, []
    for tname, dtype, shape, blob in tensors:
        header[tname] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(blob)]}
        offset += len(blob)
        blobs.append(blob)
    import json
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(os.path.join(root, name), "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


for i, (lq, lk, heads, kv, d, dv) in enumerate([(5, 7, 2, 1, 8, 8), (1, 1, 1, 1, 1, 1), (9, 4, 4, 2, 16, 12), (0, 3, 2, 2, 4, 4)]):
    q = rng.standard_normal((lq, heads, d)).astype(np.float32)
    k = rng.standard_normal((lk, kv, d)).astype(np.float32)
    v = rng.standard_normal((lk, kv, dv)).astype(np.float32)
    cu_q = np.array([0, lq], dtype=np.int32)
    cu_k = np.array([0, lk], dtype=np.int32)
    for dtype in (np.float32, np.float16):
        blob = save({"q": q.astype(dtype), "k": k.astype(dtype), "v": v.astype(dtype), "cu_seqlens_q": cu_q, "cu_seqlens_k": cu_k})
        with open(os.path.join(root, f"valid-{i}-{np.dtype(dtype).name}.safetensors"), "wb") as f:
            f.write(blob)
    write_raw(f"valid-{i}-bf16.safetensors", [
        ("q", "BF16", q.shape, bf16_bytes(q)), ("k", "BF16", k.shape, bf16_bytes(k)), ("v", "BF16", v.shape, bf16_bytes(v)),
        ("cu_seqlens_q", "I32", cu_q.shape, cu_q.tobytes()), ("cu_seqlens_k", "I32", cu_k.shape, cu_k.tobytes())])

# Near-misses: a decreasing cu_seqlens, a missing tensor, a truncated file.
q = rng.standard_normal((4, 2, 8)).astype(np.float32)
bad = save({"q": q, "k": q, "v": q, "cu_seqlens_q": np.array([0, 3, 2, 4], np.int32), "cu_seqlens_k": np.array([0, 1, 2, 4], np.int32)})
open(os.path.join(root, "decreasing.safetensors"), "wb").write(bad)
open(os.path.join(root, "missing-v.safetensors"), "wb").write(save({"q": q, "k": q, "cu_seqlens_q": np.array([0, 4], np.int32), "cu_seqlens_k": np.array([0, 4], np.int32)}))
open(os.path.join(root, "truncated.safetensors"), "wb").write(bad[:-10])
print(len(os.listdir(root)), "files in", root)

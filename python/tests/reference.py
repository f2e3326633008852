"""The attention formula in float64 with numpy, written here from FlashAttention-2's
definitions (not the crate's oracle), and the test inputs' builders."""

import numpy as np


def attention(q, k, v, cu_q, cu_k, scale=None, causal=False, window=(-1, -1), softcap=0.0, alibi=None, sinks=None):
    """out [total_q, H, Dv] and lse [H, total_q] in float64. Masks align bottom-right: row i
    of a sequence with Lq queries and Lk keys has its diagonal at key i + Lk - Lq."""
    q, k, v = (np.asarray(x, dtype=np.float64) for x in (q, k, v))
    total_q, heads, d = q.shape
    group = heads // k.shape[1]
    scale = 1.0 / np.sqrt(d) if scale is None else scale
    left, right = window
    if causal:
        right = 0
    out = np.zeros((total_q, heads, v.shape[2]))
    lse = np.full((heads, total_q), -np.inf)
    for b in range(len(cu_q) - 1):
        q0, q1, k0, k1 = int(cu_q[b]), int(cu_q[b + 1]), int(cu_k[b]), int(cu_k[b + 1])
        lq, lk = q1 - q0, k1 - k0
        if lq == 0:
            continue
        i = np.arange(lq)[:, None]
        j = np.arange(lk)[None, :]
        diagonal = i + lk - lq
        visible = np.ones((lq, lk), dtype=bool)
        if left >= 0:
            visible &= j >= diagonal - left
        if right >= 0:
            visible &= j <= diagonal + right
        for h in range(heads):
            s = scale * q[q0:q1, h] @ k[k0:k1, h // group].T
            if softcap:
                s = softcap * np.tanh(s / softcap)
            if alibi is not None:
                a = np.asarray(alibi, dtype=np.float64)
                slope = a[h] if a.ndim == 1 else a[b, h]
                s = s - slope * np.abs(diagonal - j)
            s = np.where(visible, s, -np.inf)
            m = s.max(axis=1, initial=-np.inf)
            if sinks is not None:
                m = np.maximum(m, float(sinks[h]))
            shift = np.where(np.isfinite(m), m, 0.0)
            p = np.exp(s - shift[:, None])
            denominator = p.sum(axis=1)
            if sinks is not None:
                denominator = denominator + np.exp(float(sinks[h]) - shift)
            seen = denominator > 0
            out[q0:q1, h] = np.where(seen[:, None], (p @ v[k0:k1, h // group]) / np.where(seen, denominator, 1.0)[:, None], 0.0)
            lse[h, q0:q1] = np.where(seen, shift + np.log(np.where(seen, denominator, 1.0)), -np.inf)
    return out, lse


def cu_seqlens(lengths):
    return np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)


def paged(k, v, cu_k, block_size, rng, share_first=0):
    """k and v laid out in a paged cache with shuffled blocks (sequence 1's first
    `share_first` blocks those of sequence 0, its keys made equal there); slots no sequence
    reads hold NaN. Returns (k, v, k_cache, v_cache, block_table)."""
    k, v = k.copy(), v.copy()
    batch = len(cu_k) - 1
    lengths = [int(cu_k[b + 1] - cu_k[b]) for b in range(batch)]
    blocks_of = [-(-n // block_size) for n in lengths]
    shared = min(share_first, lengths[0] // block_size, lengths[1] // block_size) if batch >= 2 else 0
    for j in range(shared * block_size):
        k[cu_k[1] + j] = k[cu_k[0] + j]
        v[cu_k[1] + j] = v[cu_k[0] + j]
    total = sum(blocks_of) - shared + 1
    pool = list(rng.permutation(total))
    table = np.full((batch, max(blocks_of, default=0) + 1), -1, dtype=np.int32)
    for b in range(batch):
        for e in range(blocks_of[b]):
            table[b, e] = table[0, e] if b == 1 and e < shared else pool.pop()
    k_cache = np.full((total, block_size) + k.shape[1:], np.nan, dtype=k.dtype)
    v_cache = np.full((total, block_size) + v.shape[1:], np.nan, dtype=v.dtype)
    for b in range(batch):
        for j in range(lengths[b]):
            k_cache[table[b, j // block_size], j % block_size] = k[cu_k[b] + j]
            v_cache[table[b, j // block_size], j % block_size] = v[cu_k[b] + j]
    return k, v, k_cache, v_cache, table


TOLERANCE = {"float32": 2e-5, "float16": 2e-3, "bfloat16": 2e-2}


def assert_close(got, expected, dtype_name, v_max, what=""):
    """Within the element type's rounding, relative to the largest |v|."""
    got = np.asarray(got, dtype=np.float64)
    bound = TOLERANCE[dtype_name] * max(1.0, v_max)
    error = np.nanmax(np.abs(got - expected), initial=0.0)
    assert np.isfinite(got).all(), f"{what}: non-finite output"
    assert error <= bound, f"{what}: max error {error} > {bound}"

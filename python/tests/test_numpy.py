"""flash_attn_varlen_func on numpy arrays (float16, float32) against the float64 formula of
reference.py: seed-like shapes, mixed batches, GQA, Lq != Lk, masks, soft-cap, ALiBi, sinks,
paged caches, strided views, the LSE."""

import numpy as np
import pytest

from reference import assert_close, attention, cu_seqlens, paged
from varlen_attn import flash_attn_varlen_func


def inputs(rng, lengths_q, lengths_k, heads, kv_heads, d, dv, dtype):
    cu_q, cu_k = cu_seqlens(lengths_q), cu_seqlens(lengths_k)
    q = rng.standard_normal((cu_q[-1], heads, d)).astype(dtype)
    k = rng.standard_normal((cu_k[-1], kv_heads, d)).astype(dtype)
    v = rng.standard_normal((cu_k[-1], kv_heads, dv)).astype(dtype)
    return q, k, v, cu_q, cu_k


def check(q, k, v, cu_q, cu_k, what="", **kwargs):
    out, lse, none = flash_attn_varlen_func(
        q, k, v, cu_q, cu_k, int(np.diff(cu_q).max()), int(np.diff(cu_k).max()), return_attn_probs=True, **kwargs
    )
    assert none is None and out.dtype == q.dtype and lse.dtype == np.float32
    translated = {
        "scale": kwargs.get("softmax_scale"),
        "causal": kwargs.get("causal", False),
        "window": kwargs.get("window_size", (-1, -1)),
        "softcap": kwargs.get("softcap", 0.0),
        "alibi": kwargs.get("alibi_slopes"),
        "sinks": kwargs.get("sinks"),
    }
    expected, expected_lse = attention(q, k, v, cu_q, cu_k, **translated)
    v_max = float(np.abs(v.astype(np.float64)).max(initial=0.0))
    assert_close(out, expected, q.dtype.name, v_max, what)
    finite = np.isfinite(expected_lse)
    assert (np.isfinite(lse) == finite).all(), f"{what}: LSE -inf rows differ"
    assert np.abs(lse[finite] - expected_lse[finite]).max(initial=0.0) <= 1e-3 * (1 + np.abs(expected_lse[finite]).max(initial=0.0)), what
    return out


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
@pytest.mark.parametrize(
    "heads,kv_heads,d,lengths",
    [
        (16, 16, 72, [256]),  # seed-like: 16 x 72, one image
        (4, 4, 72, [1000]),
        (32, 32, 128, [300]),
        (16, 16, 72, [720, 276, 64, 1, 600]),  # a batch of images of different sizes
    ],
)
def test_shapes(dtype, heads, kv_heads, d, lengths):
    rng = np.random.default_rng(1)
    check(*inputs(rng, lengths, lengths, heads, kv_heads, d, d, dtype), what=f"{heads}x{d} {lengths}")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"causal": True},
        {"window_size": (7, 3)},
        {"window_size": (20, -1), "causal": True},
        {"softcap": 5.0, "softmax_scale": 0.3},
        {"alibi_slopes": np.array([0.5, 0.25, 0.125, 0.0625], dtype=np.float32), "causal": True},
        {"alibi_slopes": np.linspace(0, 0.3, 16, dtype=np.float32).reshape(4, 4)},
        {"sinks": np.array([1.0, -2.0, 0.0, 3.0], dtype=np.float32)},
        {"sinks": [0.5, 0.5, 0.5, 0.5], "alibi_slopes": [0.1, 0.2, 0.3, 0.4], "window_size": (30, 0)},
    ],
    ids=["causal", "window", "causal-window", "softcap", "alibi", "alibi-per-sequence", "sinks", "lists"],
)
def test_features_with_gqa_and_lq_ne_lk(kwargs):
    rng = np.random.default_rng(2)
    # Lq != Lk, an empty query sequence, a sequence without keys; 4 query heads on 2 kv heads.
    q, k, v, cu_q, cu_k = inputs(rng, [9, 64, 0, 3], [40, 64, 5, 0], 4, 2, 40, 24, np.float32)
    check(q, k, v, cu_q, cu_k, what=str(kwargs), **kwargs)


@pytest.mark.parametrize("block_size", [1, 16, 32, 256])
def test_paged_kv_cache(block_size):
    rng = np.random.default_rng(3)
    q, k, v, cu_q, cu_k = inputs(rng, [1, 30, 5], [700, 300, 5], 8, 2, 64, 64, np.float32)
    k, v, k_cache, v_cache, table = paged(k, v, cu_k, block_size, rng, share_first=2)
    args = (cu_q, cu_k, 30, 700)
    got = flash_attn_varlen_func(q, k_cache, v_cache, *args, causal=True, block_table=table)
    expected, _ = attention(q, k, v, cu_q, cu_k, causal=True)
    assert_close(got, expected, "float32", float(np.abs(v).max()), f"block {block_size}")
    # Equal, bit for bit, to the same keys packed.
    packed = flash_attn_varlen_func(q, k, v, *args, causal=True)
    assert (got.view(np.uint32) == packed.view(np.uint32)).all()


def test_strided_views_of_one_packed_qkv():
    rng = np.random.default_rng(4)
    lengths = [33, 70]
    cu = cu_seqlens(lengths)
    qkv = rng.standard_normal((cu[-1], 3, 4, 32)).astype(np.float32)
    q, k, v = qkv[:, 0], qkv[:, 1], qkv[:, 2]
    assert not q.flags.c_contiguous
    out = check(q, k, v, cu, cu, what="qkv views", causal=True)
    # The same values, copied contiguous, give the same bits.
    again = flash_attn_varlen_func(*(np.ascontiguousarray(x) for x in (q, k, v)), cu, cu, 70, 70, causal=True)
    assert (out.view(np.uint32) == again.view(np.uint32)).all()


def test_reversed_and_transposed_views():
    rng = np.random.default_rng(5)
    cu = cu_seqlens([20, 12])
    base = rng.standard_normal((32, 2, 16)).astype(np.float32)
    q = base[:, :, ::-1]
    k = np.ascontiguousarray(base.transpose(1, 0, 2)).transpose(1, 0, 2)
    check(q, k, base, cu, cu, what="negative and permuted strides")


def test_out_is_written_in_place():
    rng = np.random.default_rng(6)
    q, k, v, cu_q, cu_k = inputs(rng, [5, 7], [5, 7], 2, 2, 8, 8, np.float32)
    storage = np.full((12, 2, 16), np.nan, dtype=np.float32)
    out = storage[:, :, ::2]
    returned = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 7, out=out)
    assert returned is out
    expected = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 7)
    assert (out == expected).all() and np.isnan(storage[:, :, 1::2]).all()


def test_max_seqlen_may_be_an_upper_bound():
    rng = np.random.default_rng(7)
    q, k, v, cu_q, cu_k = inputs(rng, [5, 7], [5, 7], 2, 2, 8, 8, np.float32)
    a = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 7, 7)
    b = flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4096, 4096)
    assert (a == b).all()

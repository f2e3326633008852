"""Bad input raises ValueError or TypeError naming the argument, and never crashes the
interpreter: hand-picked cases, then a fuzz of malformed arguments."""

import numpy as np
import pytest

from varlen_attn import flash_attn_varlen_func

X = np.zeros((6, 2, 8), dtype=np.float32)
CU = np.array([0, 2, 6], dtype=np.int32)


def call(q=X, k=X, v=X, cu_q=CU, cu_k=CU, max_q=4, max_k=4, **kwargs):
    return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max_q, max_k, **kwargs)


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"q": X.astype(np.float64)}, TypeError, "q must be bfloat16, float16 or float32"),
        ({"k": X.astype(np.float16)}, TypeError, "k is float16 but q is float32"),
        ({"q": X[0]}, ValueError, "q must have 3 dimensions"),
        ({"k": X[None]}, ValueError, "k must have 3 dimensions"),
        ({"cu_q": CU.astype(np.int64)}, TypeError, "cu_seqlens_q must be int32"),
        ({"cu_q": np.array([0, 4, 6], dtype=np.int32), "cu_k": np.array([0, 1, 6], dtype=np.int32), "max_k": 5}, None, None),
        ({"cu_q": np.array([0, -2, 6], dtype=np.int32)}, ValueError, r"cu_seqlens_q\[1\] = -2"),
        ({"cu_k": np.array([0, 5, 4], dtype=np.int32), "max_k": 5}, ValueError, "cu_seqlens_k"),
        ({"cu_q": np.array([0, 6], dtype=np.int32), "max_q": 6}, ValueError, "cu_seqlens_q has 2 entries but cu_seqlens_k has 3"),
        ({"cu_q": np.zeros(0, dtype=np.int32)}, ValueError, "cu_seqlens_q has 0 entries"),
        ({"cu_q": [0, 2, 6]}, TypeError, "cu_seqlens_q must be an int32 tensor"),
        ({"max_q": 3}, ValueError, "max_seqlen_q = 3 is shorter"),
        ({"dropout_p": 0.1}, ValueError, "dropout_p"),
        ({"window_size": (-2, 0)}, ValueError, "window_size"),
        ({"window_size": 5}, ValueError, "window_size"),
        ({"softmax_scale": -1.0}, ValueError, "softmax_scale"),
        ({"softcap": float("nan")}, ValueError, "softcap"),
        ({"alibi_slopes": np.zeros(3, dtype=np.float32)}, ValueError, "alibi_slopes"),
        ({"alibi_slopes": np.zeros(2, dtype=np.float64)}, TypeError, "alibi_slopes must be float32"),
        ({"sinks": [1.0]}, ValueError, "sinks"),
        ({"sinks": [float("inf"), 0.0]}, ValueError, "sinks"),
        ({"sinks": "ab"}, TypeError, "sinks"),
        ({"q": [[[0.0]]]}, TypeError, "q must be a torch tensor or a numpy array"),
        ({"out": np.zeros((6, 2, 8), dtype=np.float16)}, TypeError, "out is float16"),
        ({"out": np.zeros((6, 2, 7), dtype=np.float32)}, ValueError, "out has 7 on axis 2"),
        ({"out": X}, ValueError, "out shares memory with q"),
        ({"out": np.broadcast_to(np.zeros((1, 2, 8), np.float32), (6, 2, 8))}, Exception, "readonly|share memory|read-only"),
        ({"q": np.zeros((0, 2, 8), np.float32), "cu_q": np.array([0, 0, 0], dtype=np.int32), "max_q": 0}, None, None),
        ({"k": np.zeros((0, 2, 8), np.float32), "v": np.zeros((0, 2, 8), np.float32), "cu_k": np.array([0, 0, 0], dtype=np.int32), "max_k": 0}, None, None),
    ],
)
def test_bad_input(kwargs, error, match):
    if error is None:
        call(**kwargs)  # legal: no exception
        return
    with pytest.raises(error, match=match):
        call(**kwargs)


def test_bad_block_tables():
    cache = np.zeros((4, 8, 2, 8), dtype=np.float32)
    q = np.zeros((2, 2, 8), dtype=np.float32)
    cu_q = np.array([0, 1, 2], dtype=np.int32)
    cu_k = np.array([0, 16, 32], dtype=np.int32)

    def paged(table, cu_k=cu_k, k=cache, v=cache):
        return flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1, 16, block_table=table)

    paged(np.array([[0, 1], [2, 3]], dtype=np.int32))
    with pytest.raises(ValueError, match=r"block_table\[1, 1\] = 4"):
        paged(np.array([[0, 1], [2, 4]], dtype=np.int32))
    with pytest.raises(ValueError, match=r"block_table\[0, 0\] = -1"):
        paged(np.array([[-1, 1], [2, 3]], dtype=np.int32))
    with pytest.raises(ValueError, match="sequence 1 has 16 keys, which need 2 blocks of 8, but block_table has 1 columns"):
        paged(np.array([[0], [2]], dtype=np.int32), cu_k=np.array([0, 8, 24], dtype=np.int32))
    with pytest.raises(TypeError, match="block_table must be int32"):
        paged(np.array([[0, 1], [2, 3]], dtype=np.int64))
    with pytest.raises(ValueError, match="block_table must have 2 dimensions"):
        paged(np.array([0, 1, 2, 3], dtype=np.int32))
    with pytest.raises(ValueError, match="k must have 4 dimensions"):
        paged(np.array([[0, 1], [2, 3]], dtype=np.int32), k=cache[0])
    # The table's transposed view is read in place.
    paged(np.ascontiguousarray(np.array([[0, 2], [1, 3]], dtype=np.int32)).T)


def test_fuzz_malformed_arguments_never_crash():
    """Random shapes, dtypes, strides and cu_seqlens: every call returns or raises ValueError
    or TypeError."""
    rng = np.random.default_rng(0)
    dtypes = [np.float32, np.float16, np.int32, np.float64, np.int8]
    for _ in range(400):
        def tensor():
            rank = int(rng.choice([1, 2, 3, 3, 3, 4]))
            shape = tuple(int(rng.integers(0, 5)) for _ in range(rank))
            x = rng.standard_normal(shape).astype(rng.choice(dtypes))
            if rank >= 2 and rng.random() < 0.3:
                x = np.swapaxes(x, 0, 1)
            if rank >= 1 and rng.random() < 0.2:
                x = x[::-1]
            return x

        def cu():
            n = int(rng.integers(0, 5))
            c = rng.integers(-3, 12, size=n).astype(rng.choice([np.int32, np.int32, np.int64]))
            if rng.random() < 0.5:
                c = np.sort(c)
            if rng.random() < 0.2:
                c = np.repeat(c, 2)[::2]
            return c

        kwargs = {}
        if rng.random() < 0.2:
            kwargs["block_table"] = rng.integers(-2, 6, size=(int(rng.integers(0, 4)), int(rng.integers(0, 4)))).astype(np.int32)
        if rng.random() < 0.2:
            kwargs["alibi_slopes"] = rng.standard_normal(int(rng.integers(0, 6))).astype(np.float32)
        if rng.random() < 0.2:
            kwargs["sinks"] = rng.standard_normal(int(rng.integers(0, 6))).astype(np.float32)
        try:
            flash_attn_varlen_func(tensor(), tensor(), tensor(), cu(), cu(), 64, 64, causal=bool(rng.random() < 0.5), **kwargs)
        except (ValueError, TypeError):
            pass

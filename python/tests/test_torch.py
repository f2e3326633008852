"""flash_attn_varlen_func on torch CPU tensors: bfloat16 (which numpy lacks), strided views
of one packed qkv tensor, tensors that require grad, out=, paged caches, and calls from
several threads at once. Skipped where torch is not installed."""

import threading

import numpy as np
import pytest

from reference import assert_close, attention, cu_seqlens, paged

torch = pytest.importorskip("torch")
from varlen_attn import flash_attn_varlen_func  # noqa: E402

DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def f64(x):
    return x.detach().to(torch.float64).numpy()


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(
    "heads,kv_heads,d,lengths",
    [(16, 16, 72, [256, 1024]), (4, 4, 72, [1500]), (32, 8, 128, [300, 1, 77]), (16, 16, 80, [720, 276, 64, 1, 600])],
)
def test_shapes_every_dtype(dtype, heads, kv_heads, d, lengths):
    g = torch.Generator().manual_seed(1)
    cu = torch.tensor(cu_seqlens(lengths))
    q = torch.randn(int(cu[-1]), heads, d, generator=g).to(dtype)
    k = torch.randn(int(cu[-1]), kv_heads, d, generator=g).to(dtype)
    v = torch.randn(int(cu[-1]), kv_heads, d, generator=g).to(dtype)
    out, lse, _ = flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths), causal=True, return_attn_probs=True)
    assert out.dtype == dtype and lse.dtype == torch.float32 and lse.shape == (heads, int(cu[-1]))
    expected, expected_lse = attention(f64(q), f64(k), f64(v), cu.numpy(), cu.numpy(), causal=True)
    assert_close(out.to(torch.float64).numpy(), expected, DTYPES[dtype], float(v.abs().max()), f"{dtype} {lengths}")
    assert np.abs(lse.numpy() - expected_lse).max() < 1e-3


def test_qkv_views_and_requires_grad():
    g = torch.Generator().manual_seed(2)
    lengths = [100, 37]
    cu = torch.tensor(cu_seqlens(lengths))
    qkv = torch.randn(int(cu[-1]), 3, 8, 64, generator=g, dtype=torch.bfloat16, requires_grad=True)
    q, k, v = qkv.unbind(1)
    out = flash_attn_varlen_func(q, k, v, cu, cu, 100, 100, window_size=(16, 16), softcap=30.0)
    expected, _ = attention(f64(q), f64(k), f64(v), cu.numpy(), cu.numpy(), window=(16, 16), softcap=30.0)
    assert_close(out.float().numpy(), expected, "bfloat16", float(v.detach().abs().max()), "qkv views")
    contiguous = flash_attn_varlen_func(
        q.detach().contiguous(), k.detach().contiguous(), v.detach().contiguous(), cu, cu, 100, 100, window_size=(16, 16), softcap=30.0
    )
    assert torch.equal(out, contiguous)


def test_alibi_sinks_paged_bf16():
    g = torch.Generator().manual_seed(3)
    rng = np.random.default_rng(3)
    lq, lk = [1, 1, 16], [513, 40, 200]
    cu_q, cu_k = cu_seqlens(lq), cu_seqlens(lk)
    q = torch.randn(int(cu_q[-1]), 8, 64, generator=g).to(torch.bfloat16)
    k = torch.randn(int(cu_k[-1]), 2, 64, generator=g).to(torch.bfloat16)
    v = torch.randn(int(cu_k[-1]), 2, 64, generator=g).to(torch.bfloat16)
    k_np, v_np, k_cache, v_cache, table = paged(f64(k), f64(v), cu_k, 16, rng, share_first=1)
    to_bf16 = lambda a: torch.from_numpy(a).to(torch.bfloat16)  # noqa: E731
    slopes = torch.tensor([2.0 ** -(i + 1) for i in range(8)])
    sinks = torch.linspace(-1, 1, 8)
    out = flash_attn_varlen_func(
        q, to_bf16(k_cache), to_bf16(v_cache), torch.tensor(cu_q), torch.tensor(cu_k), 16, 513,
        causal=True, alibi_slopes=slopes, block_table=torch.from_numpy(table), sinks=sinks,
    )
    expected, _ = attention(f64(q), k_np, v_np, cu_q, cu_k, causal=True, alibi=slopes.numpy(), sinks=sinks.numpy())
    assert_close(out.float().numpy(), expected, "bfloat16", float(np.abs(v_np).max()), "paged alibi sinks")


def test_out_argument_and_threads():
    g = torch.Generator().manual_seed(4)
    cu = torch.tensor(cu_seqlens([300, 200, 500]))
    q, k, v = (torch.randn(1000, 4, 64, generator=g).to(torch.bfloat16) for _ in range(3))
    expected = flash_attn_varlen_func(q, k, v, cu, cu, 500, 500, causal=True)
    results = [None] * 8

    def work(i):
        out = torch.empty(1000, 4, 64, dtype=torch.bfloat16)
        for _ in range(5):
            flash_attn_varlen_func(q, k, v, cu, cu, 500, 500, causal=True, out=out)
        results[i] = out

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(results))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(torch.equal(r, expected) for r in results)


def test_cuda_tensors_get_a_clear_error():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    x = torch.zeros(4, 1, 8, dtype=torch.bfloat16, device="cuda")
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(ValueError, match="CUDA"):
        flash_attn_varlen_func(x, x, x, cu, cu, 4, 4)


def test_empty_tensors_are_read_as_empty():
    """Producers may lend empty tensors with any data pointer (null included): an empty
    cu_seqlens is an error, empty q, k and v a valid empty call."""
    q = torch.zeros(0, 2, 8)
    cu = torch.zeros(0, dtype=torch.int32)
    with pytest.raises(ValueError, match="cu_seqlens_q has 0 entries"):
        flash_attn_varlen_func(q, q, q, cu, cu, 0, 0)
    zero = torch.zeros(2, dtype=torch.int32)
    out = flash_attn_varlen_func(q, q, q, zero, zero, 0, 0)
    assert out.shape == (0, 2, 8)


def test_fuzz_malformed_torch_arguments_never_crash():
    """Random ranks, shapes (empty ones included), dtypes, strides, cu_seqlens, block tables and
    outputs, torch and numpy mixed: every call returns or raises."""
    rng = np.random.default_rng(5)
    ran = 0
    for _ in range(1500):
        def tensor():
            rank = int(rng.choice([1, 2, 3, 3, 3, 4]))
            shape = tuple(int(rng.integers(0, 5)) for _ in range(rank))
            kind = rng.choice(["f32", "f16", "bf16", "i32", "f64"])
            x = torch.randn(shape)
            x = {"f32": x, "f16": x.half(), "bf16": x.bfloat16(), "i32": x.int(), "f64": x.double()}[kind]
            if rank >= 2 and rng.random() < 0.3:
                x = x.transpose(0, 1)
            if kind != "bf16" and rng.random() < 0.3:
                x = x.numpy()
            return x

        def cu():
            c = torch.from_numpy(np.sort(rng.integers(-3, 12, size=int(rng.integers(0, 5)))).astype(np.int32))
            return c[::2] if rng.random() < 0.2 else c

        kwargs = {}
        if rng.random() < 0.2:
            shape = (int(rng.integers(0, 4)), int(rng.integers(0, 4)))
            kwargs["block_table"] = torch.from_numpy(rng.integers(-2, 6, size=shape).astype(np.int32))
        if rng.random() < 0.1:
            kwargs["out"] = tensor()
        try:
            flash_attn_varlen_func(
                tensor(), tensor(), tensor(), cu(), cu(), 64, 64,
                causal=bool(rng.random() < 0.5), return_attn_probs=bool(rng.random() < 0.3), **kwargs,
            )
            ran += 1
        except (ValueError, TypeError, BufferError):
            pass
    assert ran < 1500  # most draws are malformed: the errors were exercised

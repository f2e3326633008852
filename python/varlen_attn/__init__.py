"""Variable-length ("packed", cu_seqlens) attention forward on the CPU.

``flash_attn_varlen_func`` takes FlashAttention-2's arguments and returns what it returns, for
torch tensors (bfloat16, float16, float32) and numpy arrays (float16, float32) in CPU memory.
q, k and v are read in place through DLPack, any strides; the output is a new tensor of the
inputs' kind (or ``out=``). The work runs in Rust with the GIL released.

>>> import numpy as np
>>> from varlen_attn import flash_attn_varlen_func
>>> q = np.ones((5, 2, 8), dtype=np.float32)
>>> cu = np.array([0, 2, 5], dtype=np.int32)
>>> out = flash_attn_varlen_func(q, q, q, cu, cu, 3, 3, causal=True)
>>> out.shape
(5, 2, 8)
"""

from . import _native

__all__ = ["flash_attn_varlen_func", "cpu_isa"]


def cpu_isa():
    """The CPU instruction set bf16 calls run on here (``"amx"``, ``"avx512-bf16"``, ...)."""
    return _native.cpu_isa()


def _is_torch(x):
    return type(x).__module__.startswith("torch")


def _empty_like_kind(reference, shape, dtype):
    """A new tensor of ``reference``'s kind (torch or numpy) on the CPU."""
    if _is_torch(reference):
        return reference.new_empty(shape, dtype=dtype) if dtype is not None else reference.new_empty(shape)
    import numpy as np

    return np.empty(shape, dtype=dtype if dtype is not None else reference.dtype)


def _float32(reference):
    if _is_torch(reference):
        import torch

        return torch.float32
    import numpy as np

    return np.float32


_to_dlpack = None


def _lend(x):
    """What the extension reads ``x`` through: torch tensors as a DLPack capsule made by
    ``torch.utils.dlpack.to_dlpack`` (a tenth of the time of ``Tensor.__dlpack__``, which the
    one-token call would otherwise spend most of its time in); tensors that require grad by
    their values (this is a forward pass); anything else as it is."""
    global _to_dlpack
    if x is None or not type(x).__module__.startswith("torch"):
        return x
    if _to_dlpack is None:
        from torch.utils.dlpack import to_dlpack as _to_dlpack
    return _to_dlpack(x.detach() if x.requires_grad else x)


def _longest(cu_seqlens):
    """The longest sequence a cu_seqlens tensor describes, or None where it is no valid
    prefix sum (the call itself then says what is wrong with it)."""
    values = cu_seqlens.tolist()
    if not isinstance(values, list) or not values or any(not isinstance(c, int) for c in values) or values[0] != 0:
        return None
    lengths = [b - a for a, b in zip(values, values[1:])]
    if any(n < 0 for n in lengths):
        return None
    return max(lengths, default=0)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
    *,
    sinks=None,
    out=None,
):
    """FlashAttention-2's ``flash_attn_varlen_func``, forward only, on the CPU.

    - ``q``: ``[total_q, num_heads, head_dim]``; ``k``: ``[total_k, num_kv_heads, head_dim]``,
      ``v``: ``[total_k, num_kv_heads, head_dim_v]``; or, with ``block_table``
      (``[batch, max_blocks]``, int32), paged caches ``[num_blocks, block_size, num_kv_heads,
      head_dim]`` whose sequences' key counts come from ``cu_seqlens_k``.
    - ``cu_seqlens_q``, ``cu_seqlens_k``: int32 prefix sums, ``batch + 1`` entries.
    - ``max_seqlen_q``, ``max_seqlen_k``: checked against the longest sequences (an upper
      bound is accepted, a shorter one raises); the kernel does not need them.
    - ``softmax_scale`` (default ``1/sqrt(head_dim)``), ``causal``, ``window_size=(left,
      right)`` (-1: unbounded), ``softcap`` (0: none), ``alibi_slopes`` (float32 ``[num_heads]``
      or ``[batch, num_heads]``): FlashAttention-2's semantics, masks aligned bottom-right.
    - ``sinks``: float32 ``[num_heads]``, a logit per head that joins every row's softmax
      denominator (gpt-oss's attention sinks).
    - ``dropout_p`` must be 0 (inference only); ``deterministic`` is accepted (every call is).
    - ``out``: an output to write instead of a new one, ``[total_q, num_heads, head_dim_v]``.

    Returns ``out``, or with ``return_attn_probs=True`` ``(out, softmax_lse, None)`` with the
    log-sum-exp ``[num_heads, total_q]`` in float32.

    Raises ``ValueError`` (or ``TypeError`` for wrong types) for any bad argument, naming it.
    """
    if dropout_p != 0.0:
        raise ValueError(f"dropout_p = {dropout_p}: varlen_attn computes the forward pass for inference only (dropout_p must be 0)")
    if window_size == (-1, -1):
        left = right = -1
    else:
        try:
            left, right = (int(w) for w in window_size)
        except (TypeError, ValueError):
            raise ValueError(f"window_size must be a pair of ints (-1: unbounded), got {window_size!r}") from None
        if left < -1 or right < -1:
            raise ValueError(f"window_size entries must be -1 (unbounded) or non-negative, got {window_size!r}")
    if causal:
        right = -1  # FlashAttention-2 sets the right window to 0 under causal: the mask itself
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not hasattr(cu, "__dlpack__"):
            raise TypeError(f"{name} must be an int32 tensor or array, got {type(cu).__name__}")
    for name, given, cu in (("max_seqlen_q", max_seqlen_q, cu_seqlens_q), ("max_seqlen_k", max_seqlen_k, cu_seqlens_k)):
        longest = _longest(cu)
        if longest is not None and int(given) < longest:
            raise ValueError(f"{name} = {given} is shorter than the longest sequence ({longest}) in {name.replace('max_seqlen', 'cu_seqlens')}")
    for name, x in (("q", q), ("v", v)):
        if not hasattr(x, "__dlpack__") or not hasattr(x, "shape"):
            raise TypeError(f"{name} must be a torch tensor or a numpy array, got {type(x).__name__}")
    q_shape, v_shape = tuple(q.shape), tuple(v.shape)
    if len(q_shape) != 3:
        raise ValueError(f"q must have 3 dimensions [total_q, num_heads, head_dim], got shape {q_shape}")
    if len(v_shape) not in (3, 4):
        raise ValueError(f"v must have 3 dimensions (4 with block_table), got shape {v_shape}")
    shape = (q_shape[0], q_shape[1], v_shape[-1])
    if out is None:
        out = _empty_like_kind(q, shape, None)
    lse = _empty_like_kind(q, (q_shape[1], q_shape[0]), _float32(q)) if return_attn_probs else None
    _native.forward(
        _lend(q),
        _lend(k),
        _lend(v),
        _lend(cu_seqlens_q),
        _lend(cu_seqlens_k),
        _lend(out),
        _lend(lse),
        softmax_scale=None if softmax_scale is None else float(softmax_scale),
        causal=bool(causal),
        window_left=None if left == -1 else left,
        window_right=None if right == -1 else right,
        softcap=None if not softcap else float(softcap),
        alibi_slopes=_lend(alibi_slopes),
        sinks=_lend(sinks),
        block_table=_lend(block_table),
    )
    if return_attn_probs:
        return out, lse, None
    return out

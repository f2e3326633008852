#!/usr/bin/env python3
"""The coefficients of `va_exp2_fma` (src/gpu/kernel/portability.h): 2^f on [-1/2, 1/2] by a
degree-5 polynomial with p(0) = 1, fitted for the least maximum relative error (iteratively
reweighted least squares, close to minimax), then the kernel's whole sequence checked in float32
arithmetic (round x to an integer j by adding 1.5 * 2^23, f = x - j, Horner in fused
multiply-adds, times 2^j built from the rounding's bits) against 2^x over [-127.5, 0], where
the softmax's exponents lie. Prints the coefficients as the kernel spells them and the largest
error in relative units and in float32 ulps (ex2.approx.f32, which it stands in for, is within
2 ulp). Needs numpy.

    python3 benches/exp2_polynomial.py [degree]
"""
import sys

import numpy as np

DEGREE = int(sys.argv[1]) if len(sys.argv) > 1 else 5


def fit(degree):
    """p(f) = 1 + f·q(f), q's coefficients for the least maximum of |p(f) / 2^f - 1|."""
    f = np.linspace(-0.5, 0.5, 20001)
    y = np.exp2(f)
    a = np.stack([f ** (k + 1) / y for k in range(degree)], 1)
    b = (y - 1) / y
    w = np.ones_like(f)
    for _ in range(200):
        c, *_ = np.linalg.lstsq(a * np.sqrt(w)[:, None], b * np.sqrt(w), rcond=None)
        err = np.abs(a @ c - b)
        w = w * np.sqrt(err / err.max()) + 1e-12
        w /= w.mean()
    return np.concatenate([[1.0], c]).astype(np.float32)


def kernel_exp2(x, coef):
    """The kernel's sequence in float32 (an FMA's product is exact in float64, its sum rounded
    once more to float32: a double rounding that real FMAs avoid, so errors here are, if
    anything, larger than on the GPU)."""
    x = np.maximum(x, np.float32(-127.0))
    shifter = np.float32(12582912.0)
    r = (x + shifter).astype(np.float32)
    j = (r - shifter).astype(np.float32)
    f = (x - j).astype(np.float32)
    p = np.full_like(f, coef[-1])
    for k in range(len(coef) - 2, -1, -1):
        p = (p.astype(np.float64) * f + np.float64(coef[k])).astype(np.float32)
    scale = ((r.view(np.int32).astype(np.int64) + 127) << 23).astype(np.uint64) & 0xFFFFFFFF
    return (p * scale.astype(np.uint32).view(np.float32)).astype(np.float32)


coef = fit(DEGREE)
print("coefficients, constant term first:", ", ".join(f"{c:.8e}f" for c in coef))
rng = np.random.default_rng(0)
x = np.concatenate([np.linspace(-126.0, 0.0, 4_000_001), -3.0 * rng.random(2_000_000)]).astype(np.float32)
got = kernel_exp2(x, coef).astype(np.float64)
want = np.exp2(x.astype(np.float64))
rel = np.abs(got / want - 1.0).max()
ulp = (np.abs(got - want) / np.spacing(want.astype(np.float32)).astype(np.float64)).max()
print(f"on [-126, 0]: largest relative error {rel:.3g}, {ulp:.3g} ulp")
edges = kernel_exp2(np.array([-np.inf, -127.25, -126.75, np.nan], dtype=np.float32), coef)
print("at -inf, -127.25, -126.75 (0: below 2^-126, as ex2.approx.ftz flushes them) and NaN (NaN):", edges)
print("at 0:", kernel_exp2(np.zeros(1, dtype=np.float32), coef)[0], "(exactly 1: each row's largest score)")

"""Derived error bounds, one function per kernel family; the only place tolerances come from.

Softmax family (fp32 arithmetic inside), with u = 2^-24 (fp32 unit roundoff), d_i = x_i - max,
p_i the exact softmax and E = sum_i p_i |d_i|:

  s_i = fl(x_i - m)              |s_i - d_i| <= u |d_i|
  t_i = fl(s_i * fl(log2 e))     exponent off by <= 3u |d_i| log2 e, so exp2(t_i) is off by a
                                 relative 3u |d_i|; ex2.approx adds <= 2 ulp = 4u
  S   = sum of the terms         each term off by (3|d_j| + 4)u, weighted by p_j: (3E + 4)u;
                                 the rounding chain of the sum adds D u, D = the kernel's
                                 rounding depth (per-thread sequential length + tree levels,
                                 plus one step per chunk rescale or merge)
  y_i = e_i / S                  div.full.f32: <= 2 ulp = 4u

  relative error e_i <= (3|d_i| + 3E + D + 16) u     (4u of slack covers second-order terms)

For fp32 output the computed value is the output: |y^ - r_i| <= e_i|y_i| + ulp/2, so the ULP
distance to the correctly rounded r_i is at most floor(e_i |y_i| / ulp + 1/2). For fp16/bf16
output the fp32 value is rounded once more, giving floor(e_i |y_i| / ulp + 1): as e_i is below
2^-15 wherever an fp16 (|d| < 18) or bf16 (|d| < 93) output is nonzero, that is 1 ULP, the
faithful-rounding contract of NUMERICS.md section 3. `ulp` is taken at |y_i|(1 - e_i), the
smaller side, so a binade boundary never shrinks the allowance below the truth, and the
exact value is taken as |r_i| + ulp/2. Results below fp32's normals carry an absolute error of
at most 2^-149 on top (gradual underflow in exp2 and in the division).

Flush to zero: a correctly rounded output below the smallest normal fp32 may come out as a zero
of the same sign (GPU `ftz` arithmetic); `ftz_allowed` marks those, the report counts them.
"""
from __future__ import annotations

import numpy as np

from .formats import FP32, Format, ulp_of

U32 = 2.0**-24
SLACK = 16.0  # 4u exp2 + 4u terms + 4u division + 4u second-order
# Below fp32's normals errors are absolute, not relative: the exp2 term and the quotient can
# each lose half of 2^-149; dividing by S >= 1 does not grow the first.
FP32_UNDERFLOW = 2.0**-149


def softmax_relative_error(x: np.ndarray, *, depth: int) -> np.ndarray:
    """Per-element bound on the relative error of an fp32 softmax before its final rounding."""
    x = np.atleast_2d(np.asarray(x, dtype=np.float64))
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        m = np.max(np.where(np.isnan(x), -np.inf, x), axis=1, keepdims=True)
        d = np.abs(x - m)
        d = np.where(np.isfinite(d), d, 0.0)  # -inf entries are exact zeros; NaN rows are exact NaN
        w = np.exp(-d) * (np.isfinite(x))
        expected_d = (w * d).sum(axis=1, keepdims=True) / np.maximum(w.sum(axis=1, keepdims=True), 1e-300)
    return (3.0 * d + 3.0 * expected_d + depth + SLACK) * U32


def softmax_ulp_bound(x: np.ndarray, oracle: np.ndarray, fmt: Format, *, depth: int) -> np.ndarray:
    """Allowed ULP distance per element between a softmax kernel's output and the oracle."""
    e = softmax_relative_error(x, depth=depth)
    r = np.abs(np.asarray(oracle, dtype=np.float64))
    r = np.where(np.isfinite(r), r, 0.0)
    half = ulp_of(r, fmt) / 2
    y_hi = r + half  # the exact value lies within half an ULP of the rounded oracle
    ulp_lo = ulp_of(np.maximum(r * (1.0 - 2.0 * e) - 2.0 * half, 0.0), fmt)
    final_rounding = 0.5 if fmt == FP32 else 1.0
    return np.floor((e * y_hi + FP32_UNDERFLOW) / ulp_lo + final_rounding)


def ftz_allowed(actual: np.ndarray, oracle: np.ndarray) -> np.ndarray:
    """Outputs flushed to a zero of the right sign where the exact result is below fp32's normals."""
    a, r = np.asarray(actual, dtype=np.float64), np.asarray(oracle, dtype=np.float64)
    return (a == 0) & (r != 0) & (np.abs(r) < FP32.min_normal) & (np.signbit(a) == np.signbit(r))


def softmax_sum_bound(x: np.ndarray, oracle: np.ndarray, fmt: Format, *, depth: int) -> np.ndarray:
    """Bound on |sum_i y^_i - 1| per row, from the per-element bound.

    |y^_i - y_i| <= (b_i + 1/2) ulp_i (b_i ULPs from the rounded oracle, which is within half an
    ULP of exact), flushed outputs lose at most their own value, and the float64 check sum adds
    at most N * 2^-52."""
    b = softmax_ulp_bound(x, oracle, fmt, depth=depth)
    r = np.abs(np.asarray(oracle, dtype=np.float64))
    per = (b + 0.5) * ulp_of(r, fmt) + np.where(r < FP32.min_normal, r, 0.0)
    n = np.atleast_2d(x).shape[1]
    return per.sum(axis=1) + n * 2.0**-52


# ---- attention ------------------------------------------------------------------------------
# (attention bounds are added below by the attention family)

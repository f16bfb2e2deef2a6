"""Error bounds of fp32-computing row kernels: log-softmax, softmax backward and log-softmax backward
(docs/NUMERICS.md 9.6). Each takes the kernel's inputs, the output format and the kernel's summation
depth, and returns the allowed |kernel - r| per element, r the correctly rounded oracle of
`oracles/log_softmax.py`; 0 where r is not finite (special values must match exactly).

Model (u = 2^-24, the kernel's inputs exact in fp32): a row sum whose terms pass through at most
`depth` roundings (None: n, recursive summation, the worst case; a tree or chunked kernel declares
its own, `KernelSpec.depth`); exponentials as exp2(fl(t log2 e)) with ex2.approx (4u), online over
chunks with at most `depth` rescales a term (each an exp2 and a product); a GPU may flush fp32
subnormal results to 0 (each such flush is at most 2^-126 absolute). Every other operation rounds
once. First order, with 1% and a few u of slack for the second order.

The same model bounds the cross-entropy kernels (`oracles/cross_entropy_bound.py`, which imports
`row_stats`, `lse_error` and `finish` from here).
"""
from __future__ import annotations

import math

import numpy as np
import torch

from .formats import FP32, Format, format_of, ulp_of
from .log_softmax import as_rows, log_softmax_oracle, log_softmax_backward_oracle, softmax_backward_oracle

__all__ = ["log_softmax_bound", "softmax_backward_bound", "log_softmax_backward_bound", "row_sum_bound",
           "gamma", "row_stats", "lse_error", "finish"]

U = 2.0**-24
#: the largest fp32 value a GPU's flush-to-zero may turn into 0 (the smallest normal)
FTZ = 2.0**-126
#: lg2.approx's absolute error in log2 units, as natural log
LG2_ERR = 2.0**-22 * math.log(2.0)

FormatLike = Format | str | torch.dtype


def gamma(k: int | np.ndarray) -> np.ndarray | float:
    """The relative error of k roundings in a row (k u, 1% for the second order)."""
    return 1.01 * np.asarray(k, dtype=np.float64) * U


def row_stats(x: np.ndarray) -> tuple[np.ndarray, ...]:
    """Float64 p (softmax), d = m - x, L = log S, E = sum p d and m per row, the first-order inputs of
    the bounds. -inf entries get d = 0 and p = 0; rows without a finite entry m = 0 (their results are
    special, bound 0)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        xf = np.where(np.isnan(x), -np.inf, x)
        xf = np.where(xf == np.inf, -np.inf, xf)
        m = xf.max(axis=1, keepdims=True)
        m = np.where(np.isfinite(m), m, 0.0)
        fin = np.isfinite(xf)
        d = np.where(fin, m - xf, 0.0)
        e = np.where(fin, np.exp(-d), 0.0)
        S = np.maximum(e.sum(axis=1, keepdims=True), 1.0)
        p = e / S
        return p, d, np.log(S)[:, 0], (p * d).sum(axis=1), m[:, 0]


def lse_error(x: np.ndarray, depth: int) -> tuple[np.ndarray, ...]:
    """(Delta, p, d, L, m): Delta bounds the kernel's |lse^ - lse| per row.

    A term exp(x_j - m) is off by theta_j <= u (6 d_j + 5 depth + 4): the subtraction (u d_j), the
    product by log2 e (2u d_j), the rescales' exponents (telescoping, <= 3u d_j), ex2.approx 4u for the
    term and each of at most `depth` rescales plus their products (5u each). The sum l^ = S (1 + sigma),
    |sigma| <= sum_j p_j theta_j + depth u + n 2^-126 (flushed terms; S >= 1). Then log: 1.01 |sigma|,
    lg2.approx, and the roundings of m + ln2 lg2(l): 3u (|m| + L)."""
    p, d, L, E, m = row_stats(x)
    n = x.shape[1]
    sigma = U * (6 * E + 6 * depth + 4) + n * FTZ
    delta = 1.01 * sigma + LG2_ERR + 3 * U * (np.abs(m) + L)
    return delta, p, d, L, m


def finish(pre: np.ndarray, oracle: np.ndarray, fmt: Format) -> np.ndarray:
    """The allowed |kernel - r|: the arithmetic error `pre` plus the last rounding (fp32 output: the
    oracle's own half ulp; a 16-bit output rounds the fp32 value once more: one ulp); 0 where r is
    not finite (a special value is matched exactly)."""
    r = np.asarray(oracle, dtype=np.float64)
    fin = np.isfinite(r)
    pre = np.where(fin, pre, 0.0)
    rr = np.where(fin, np.abs(r), 0.0)
    last = ulp_of(rr + pre, fmt) * (0.5 if fmt == FP32 else 1.0)
    return np.where(fin, pre + last, 0.0)


def _depth(depth: int | None, n: int) -> int:
    return max(1, int(depth if depth is not None else n))


def log_softmax_bound(x: np.ndarray | torch.Tensor, fmt: FormatLike, *, depth: int | None = None,
                      oracle: np.ndarray | None = None) -> np.ndarray:
    """Allowed |kernel - r| per element of log_softmax(x) (rows over the last dim).

    out_j = (x_j - m) - log l^ (or x_j - lse^): the lse's Delta, the subtraction x_j - m (u d_j) and the
    final rounding (u |out_j| = u (d_j + L)), plus 4u of slack."""
    fmt = format_of(fmt)
    rows, shape = as_rows(x)
    if oracle is None:
        oracle = log_softmax_oracle(rows, fmt)
    r = np.asarray(oracle, dtype=np.float64).reshape(rows.shape)
    delta, p, d, L, m = lse_error(rows, _depth(depth, rows.shape[1]))
    pre = delta[:, None] + U * d + U * (d + L[:, None]) + 4 * U
    return finish(pre, r, fmt).reshape(shape)


def softmax_backward_bound(y: np.ndarray | torch.Tensor, dy: np.ndarray | torch.Tensor, fmt: FormatLike, *,
                           depth: int | None = None, oracle: np.ndarray | None = None) -> np.ndarray:
    """Allowed |kernel - r| per element of y (dy - sum_j y_j dy_j).

    s^ = sum fl(y_j dy_j): |s^ - s| <= e_s = (depth + 1) u P + n 2^-126, P = sum |y_j dy_j| (a product
    and the sum's roundings; flushed products); t = fl(dy_i - s^) and fl(y_i t) round once each:
    |dx^_i - dx_i| <= |y_i| (1.01 e_s + 2.01 u |dy_i - s|) + 2 2^-126 (a flushed or halved result)."""
    fmt = format_of(fmt)
    yr, shape = as_rows(y)
    dr, _ = as_rows(dy)
    if oracle is None:
        oracle = softmax_backward_oracle(yr, dr, fmt)
    r = np.asarray(oracle, dtype=np.float64).reshape(yr.shape)
    n = yr.shape[1]
    with np.errstate(invalid="ignore", over="ignore"):
        prod = yr * dr
        s = prod.sum(axis=1, keepdims=True)
        es = gamma(_depth(depth, n) + 1) * np.abs(prod).sum(axis=1, keepdims=True) + n * FTZ
        pre = np.abs(yr) * (1.01 * es + 2.01 * U * np.abs(dr - s)) + 2 * FTZ
    return finish(np.where(np.isfinite(pre), pre, 0.0), r, fmt).reshape(shape)


def log_softmax_backward_bound(logp: np.ndarray | torch.Tensor, dy: np.ndarray | torch.Tensor, fmt: FormatLike, *,
                               depth: int | None = None, oracle: np.ndarray | None = None) -> np.ndarray:
    """Allowed |kernel - r| per element of dy - exp(logp) sum_j dy_j.

    s^ = sum dy: |s^ - s| <= e_s = depth u A + n 2^-126, A = sum |dy_j| (exact power-of-two scalings
    change nothing); p^ = exp2(fl(logp log2 e)): relative rho = u (2 |logp| + 6) (the product, log2 e's
    own rounding, ex2.approx) or flushed below 2^-126; fl(p^ s^) and the subtraction round once each:
    |dx^ - dx| <= 1.01 p (e_s + |s| rho + u |s|) + u |dx| + 2^-126 (1 + |s|)."""
    fmt = format_of(fmt)
    lr, shape = as_rows(logp)
    dr, _ = as_rows(dy)
    if oracle is None:
        oracle = log_softmax_backward_oracle(lr, dr, fmt)
    r = np.asarray(oracle, dtype=np.float64).reshape(lr.shape)
    n = lr.shape[1]
    with np.errstate(invalid="ignore", over="ignore"):
        s = dr.sum(axis=1, keepdims=True)
        es = gamma(_depth(depth, n)) * np.abs(dr).sum(axis=1, keepdims=True) + n * FTZ
        fin = np.isfinite(lr)
        p = np.where(fin, np.exp(np.where(fin, lr, 0.0)), 0.0)
        rho = U * (2 * np.abs(np.where(fin, lr, 0.0)) + 6)
        pre = 1.01 * p * (es + np.abs(s) * rho + U * np.abs(s)) + U * np.abs(dr - p * s) + FTZ * (1 + np.abs(s))
    return finish(np.where(np.isfinite(pre), pre, 0.0), r, fmt).reshape(shape)


def row_sum_bound(bound: np.ndarray, oracle: np.ndarray, fmt: FormatLike, *, known: np.ndarray,
                  got: np.ndarray) -> np.ndarray:
    """Allowed |sum_j out_j - exact sum| per row, for outputs each within `bound` of the correctly
    rounded `oracle`: sum_j (bound_j + the oracle's own half ulp), plus how well the exact sum is
    `known` (its float64 evaluation's error bound, per row) and 4 float64 units of the kernel's sum
    (`got`, a correctly rounded fsum of its outputs)."""
    fmt = format_of(fmt)
    r = np.asarray(oracle, dtype=np.float64)
    half = 0.5 * ulp_of(np.where(np.isfinite(r), r, 0.0), fmt)
    total = np.where(np.isfinite(r), bound + half, 0.0).sum(axis=-1)
    return total + known + 4 * 2.0**-53 * np.abs(got)

"""Certified, correctly rounded softmax and log-sum-exp oracles.

Semantics (NUMERICS.md section 2, as torch): a row with a NaN or a +inf gives NaN everywhere, a
row of -inf only gives NaN everywhere, -inf entries give exact zeros, N = 1 finite gives 1.
Log-sum-exp follows `torch.logsumexp`: NaN -> NaN, else +inf -> +inf, all -inf -> -inf.

Two paths compute the same function:

* the **mpmath path** (`exact=True`, the ground truth): exact differences d_i = x_i - m of the
  dyadic inputs, exp / sum / divide (or log) at a working precision with a rigorous error bound,
  certified with `round_certified` (Ziv). Softmax of a row whose finite entries all equal the max
  is exactly 1/k (k of them), handed over as a `Fraction` since a dyadic 1/k can be a rounding
  boundary Ziv's loop would never decide.
* the **fast path** (default): float64 NumPy with a proven per-element error bound; an element is
  decided when both ends of its error interval round to the same value. Rows with any undecided
  element go to the mpmath path (only for the undecided elements). See `_softmax_fast`.

mpmath state: the mpmath path calls `mpmath.libmp` functions that take the precision as an
argument, so the global `mpmath.mp` context is neither read nor changed.
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import partial

import mpmath
import numpy as np
import torch
from mpmath import libmp

from .formats import Format, format_of, round_float64
from .rounding import round_certified, round_fraction

__all__ = ["softmax_oracle", "logsumexp_oracle"]

_LN2 = math.log(2.0)
_RN = libmp.round_nearest
_RC = libmp.round_ceiling
_MAKE = mpmath.mp.make_mpf  # wraps a raw tuple without rounding it to mp.prec

# ---- float64 error model (fast path) ---------------------------------------------------------
U64 = 2.0**-53  # float64 unit roundoff
# np.exp / np.log1p: assumed at most 4 ulp (relative 4 * 2^-52 = 2^-50) for normal results.
# NumPy's AVX512F float64 exp is Tang's table method (proved < 0.77 ulp, numpy PR #15648); without
# AVX512 it calls libm (glibc: < 1 ulp); float64 log1p comes from SVML or libm (<= 4 ulp in
# NumPy's own accuracy tables). tests/test_oracles.py measures both against mpmath.
FUNC_REL = 2.0**-50
# Results below 2^-900 are treated as absolute errors: a true value below 2^-899 rounds to +0 in
# every target format (fp32's smallest subnormal is 2^-149).
TINY = 2.0**-900
TINY_ABS = 2.0**-899
_SAFETY = 1.02  # covers second-order terms (every relative error here is below 2^-20)


def _as_rows(x: np.ndarray | torch.Tensor) -> tuple[np.ndarray, tuple[int, ...]]:
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim == 0:
        raise ValueError("softmax needs at least one dimension")
    rows = int(np.prod(a.shape[:-1], dtype=np.int64))
    return np.ascontiguousarray(a.reshape(rows, a.shape[-1])), a.shape


def _row_classes(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: has a NaN, has a +inf (and no NaN), has no finite entry and only -inf."""
    has_nan = np.isnan(x).any(axis=1)
    has_pinf = (x == np.inf).any(axis=1) & ~has_nan
    all_ninf = (x == -np.inf).all(axis=1)
    return has_nan, has_pinf, all_ninf


def _tree_sum(a: np.ndarray) -> tuple[np.ndarray, int]:
    """Sum the last axis by pairwise halving; returns the sums and the tree depth.

    Each term passes through at most depth = ceil(log2 N) roundings, so for nonnegative terms
    |computed - exact| <= gamma(depth) * exact, gamma(h) = h u / (1 - h u) (Higham, Thm 4.1).
    An explicit tree, not np.sum, so the depth does not depend on NumPy's internal blocking."""
    depth = 0
    while a.shape[-1] > 1:
        n = a.shape[-1]
        h = n // 2
        s = a[..., :h] + a[..., h : 2 * h]
        a = np.concatenate([s, a[..., 2 * h :]], axis=-1) if n % 2 else s
        depth += 1
    return a[..., 0], depth


def _gamma(h: int) -> float:
    return h * U64 / (1.0 - h * U64)


def _decide(lo: np.ndarray, hi: np.ndarray, fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """Round both ends of each interval; decided where they agree in value and sign."""
    rl, rh = round_float64(lo, fmt), round_float64(hi, fmt)
    same = (rl == rh) & (np.signbit(rl) == np.signbit(rh)) & ~np.isnan(rl)
    return rl, same


def _exp_terms(x: np.ndarray, m: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """exp(x - m) in float64 per entry, each term's relative error bound, and the tiny terms.

    d = fl(x - m) has |d - (x - m)| <= u |d| (one correctly rounded subtraction, exact for fp16
    inputs), so exp(d) is off from exp(x - m) by a factor exp(+-u|d|), at most 1 + 1.01 u |d| for
    |d| <= 745; np.exp adds FUNC_REL. -inf entries give exact zeros with no error. Terms whose
    float64 value is below 2^-900 ("tiny", subnormal results included) are only known to be
    below 2^-899: they get an absolute error instead of a relative one."""
    d = x - m[:, None]
    e = np.exp(d)
    finite = np.isfinite(x)  # not isfinite(d): keep a (float64-only) overflowing d as tiny
    big = e >= TINY
    r = np.where(big, 1.01 * U64 * np.abs(np.where(big, d, 0.0)) + FUNC_REL, 0.0)
    tiny = finite & ~big
    return e, r, tiny


def _softmax_fast(x: np.ndarray, fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """Softmax of rows without NaN/+inf and with a finite entry, plus the mask of decided elements.

    Error bound. With e_j = exp(x_j - m) (exact), e^_j = np.exp(d_j) and r_j from `_exp_terms`:
      |e^_j - e_j| <= r_j e^_j (1 + 2^-40)       for e^_j >= 2^-900 (normal results)
      e_j < 2^-899                              for e^_j <  2^-900 (n_tiny of them)
    S^ = tree sum of the e^_j (depth h):
      |S^ - S| <= 1.01 sum_j r_j e^_j + 1.01 gamma(h) S^ + n_tiny 2^-899 =: errS,   S >= 1.
    y^_i = fl(e^_i / S^) = y_i (1 + theta_i),
      |theta_i| <= 1.02 (r_i + errS / S^ + u)    (the 2% covers products of the small terms).
    Then y_i lies in [y^_i (1 - eps_i), y^_i (1 + eps_i)] with eps_i = |theta_i| + 2^-52, the
    extra 2^-52 covering the rounding of the two products that form the interval ends.
    Elements with y^_i < 2^-900, or a tiny e^_i, have y_i < 2^-899 and round to +0 in every
    format.
    """
    e, r, tiny = _exp_terms(x, x.max(axis=1))
    s, depth = _tree_sum(e)
    weighted = (r * e).sum(axis=1)  # a bound term: 1.01 covers its own rounding
    err_s = 1.01 * weighted + 1.01 * _gamma(depth) * s + tiny.sum(axis=1) * TINY_ABS
    s, rel_s = s[:, None], (err_s / s)[:, None]
    y_hat = e / s
    eps = _SAFETY * (r + rel_s + U64) + 2.0**-52
    zero = (y_hat < TINY) | tiny  # y_i <= e_i < 2^-899 for tiny terms, as S >= 1
    rounded, decided = _decide(y_hat * (1.0 - eps), y_hat * (1.0 + eps), fmt)
    decided = (decided & (eps < 2.0**-20)) | zero
    return np.where(zero, 0.0, rounded), decided


def _logsumexp_fast(x: np.ndarray, fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """Log-sum-exp of rows without NaN/+inf and with a finite entry, plus the decided mask.

    lse = m + log1p(T), T = sum of exp(x_j - m) over every entry but one maximum (so a row whose
    other entries are tiny keeps its relative accuracy: log(S) of S = 1 + T would not).
      |T^ - T| <= errT, as errS in `_softmax_fast` (the excluded maximum has no error);
      log1p is increasing with slope 1/(1+t) <= 1/(1 + max(T^ - errT, 0)) between T and T^;
      np.log1p adds 2^-50 L^ (4 ulp) for normal L^, 2^-1000 absolute below;
      s^ = fl(m + L^) adds u |s^|; the interval ends add another u |s^| each.
    Since T >= 0, lse >= m exactly: the low end is raised to m (as +0 where m is a zero), which
    decides rows like [0, -1e4] where lse is a positive value far below any subnormal.
    """
    m = x.max(axis=1)
    e, r, tiny = _exp_terms(x, m)
    first = np.argmax(x, axis=1)
    rows = np.arange(x.shape[0])
    e[rows, first], r[rows, first], tiny[rows, first] = 0.0, 0.0, False
    t, depth = _tree_sum(e)
    err_t = 1.01 * (r * e).sum(axis=1) + 1.01 * _gamma(depth) * t + tiny.sum(axis=1) * TINY_ABS
    lg = np.log1p(t)
    err_l = err_t / (1.0 + np.maximum(t - err_t, 0.0)) + FUNC_REL * lg + 2.0**-1000
    s = m + lg
    err = _SAFETY * err_l + 2.0**-52 * np.abs(s)
    lo = np.maximum(s - err, m + 0.0)
    rounded, decided = _decide(lo, s + err, fmt)
    return rounded, decided & (err_l <= 2.0**-20 * np.maximum(lg, 1.0))


# ---- mpmath path -----------------------------------------------------------------------------
# Working-precision error model (eta = 2^-prec, round to nearest):
#   libmp.mpf_exp / mpf_log at precision p: relative error <= 4 eta (2 ulp). They evaluate with
#   14 / 20 guard bits and round once (mpf_log adds the bits lost to cancellation near 1), so
#   the true error is about half an ulp; 4 eta is the margin we rely on.
#   Sums of the rounded exponentials are exact (libmp with prec = 0): the terms kept span a few
#   hundred bits at most, because terms below the drop threshold are left out (see below).
#   mpf_div, mpf_add at precision p: relative error <= eta.


def _drop_threshold(prec: int, n: int) -> float:
    """t with exp(-t) * n <= 2^-(prec + 2): terms below exp(-t) times the largest are dropped.

    Their sum is below 2^-(prec+2) = eta/4 relative to the largest term. +1 absorbs the rounding
    of this float expression."""
    return (prec + 2 + n.bit_length()) * _LN2 + 1.0


def _zero_threshold(fmt: Format) -> float:
    """t with exp(-t) < 2^(emin - precision), half of fmt's smallest subnormal.

    A softmax output y_i <= exp(d_i) (the sum is >= 1) with d_i < -t rounds to +0."""
    return (fmt.precision - fmt.emin + 1) * _LN2 + 1.0


class _ExactRow:
    """One row without NaN/+inf with a finite entry: exact d_i = x_i - m, exponentials by prec."""

    def __init__(self, x: np.ndarray):
        self.x = x
        finite = np.isfinite(x)
        self.n = int(x.shape[0])
        self.m = float(x[finite].max())
        self.m_mpf = libmp.from_float(self.m)
        self.is_max = x == self.m
        self.k = int(self.is_max.sum())
        self.others = np.flatnonzero(finite & ~self.is_max)  # the finite entries below the max
        # fl(x - m), within u |d| of d: only used against thresholds with a margin of 1 or more.
        self.d_float = x - self.m
        self._d: dict[int, tuple] = {}
        self._exp: dict[tuple[int, int], tuple] = {}
        self._kept: dict[tuple[int, tuple], list[int]] = {}

    def d(self, i: int) -> tuple:
        t = self._d.get(i)
        if t is None:  # prec = 0: the exact difference of two dyadic values
            t = self._d[i] = libmp.mpf_sub(libmp.from_float(float(self.x[i])), self.m_mpf, 0)
        return t

    def exp(self, i: int, prec: int) -> tuple:
        """exp(d_i) within 4 eta relative (exactly 1 at a maximum)."""
        key = (i, prec)
        t = self._exp.get(key)
        if t is None:
            t = libmp.fone if self.is_max[i] else libmp.mpf_exp(self.d(i), prec, _RN)
            self._exp[key] = t
        return t

    def kept_others(self, prec: int, top: tuple) -> list[int]:
        """Non-max entries with d_j >= top - t(prec): the rest sum to < eta/4 * exp(top)."""
        key = (prec, top)
        kept = self._kept.get(key)
        if kept is None:
            # exact comparison: d can reach 1e39 in magnitude, where fl(d) is off by far more
            # than the threshold
            bound = libmp.mpf_sub(top, libmp.from_float(_drop_threshold(prec, self.n)), 0)
            kept = [int(j) for j in self.others if not libmp.mpf_lt(self.d(int(j)), bound)]
            self._kept[key] = kept
        return kept

    def exp_sum(self, prec: int, top: tuple, start: int) -> tuple:
        """start + sum of the kept exp(d_j), j not a maximum: exact sum of rounded terms."""
        total = libmp.from_int(start)
        for j in self.kept_others(prec, top):
            total = libmp.mpf_add(total, self.exp(j, prec), 0)
        return total


class _SoftmaxRow(_ExactRow):
    """y_i = exp(d_i) / S with S = k + sum over the others.

    At precision prec (eta = 2^-prec), with terms below exp(-t(prec)) dropped (S >= 1, so they
    change S by less than eta/4 relative):
      e^_i = e_i (1 + delta), |delta| <= 4 eta;  S^ = S (1 + sigma), |sigma| <= 4.25 eta + eta^2;
      y^_i = fl(e^_i / S^) = y_i (1 + delta)(1 + eps) / (1 + sigma), |eps| <= eta,
    so |y^_i - y_i| <= 9.4 eta y_i <= 10 eta y^_i; the bound handed to Ziv is 16 eta y^_i.
    """

    def __init__(self, x: np.ndarray):
        super().__init__(x)
        self._sum: dict[int, tuple] = {}

    def total(self, prec: int) -> tuple:
        s = self._sum.get(prec)
        if s is None:
            s = self._sum[prec] = self.exp_sum(prec, libmp.fzero, self.k)
        return s

    def element(self, i: int, prec: int) -> tuple[mpmath.mpf, mpmath.mpf]:
        y = libmp.mpf_div(self.exp(i, prec), self.total(prec), prec, _RN)
        return _MAKE(y), _MAKE(libmp.mpf_shift(y, 4 - prec))


def _start_prec(n: int) -> int:
    return 64 + n.bit_length()


def _softmax_row_exact(x: np.ndarray, fmt: Format, cols: np.ndarray | None = None) -> np.ndarray:
    """Certified softmax of one row (special rows excluded) at columns `cols` (default all)."""
    cols = np.arange(x.shape[0]) if cols is None else cols
    out = np.zeros(cols.shape[0])
    finite = np.isfinite(x)
    m = x[finite].max()
    k = int((x == m).sum())
    if k == int(finite.sum()):
        # every finite entry is the max: exactly 1/k there, exactly 0 at the -inf entries
        out[finite[cols]] = round_fraction(Fraction(1, k), fmt)
        return out
    row = _SoftmaxRow(x)
    zero_below = -(_zero_threshold(fmt) + 1.0)  # +1: margin for |fl(d) - d| <= u |d|
    for c, i in enumerate(cols):
        if not finite[i] or row.d_float[i] < zero_below:
            continue  # an exact 0 (-inf entry), or y_i < exp(d_i) below half the least subnormal
        out[c] = round_certified(partial(row.element, int(i)), fmt, start_prec=_start_prec(row.n))
    return out


class _LogSumExpRow(_ExactRow):
    """lse = m + L, L = log(1 + T), T = k - 1 + sum of exp(d_j) over the non-max entries.

    Terms are dropped relative to the largest term of T (exp(top), top = 0 when k >= 2, else the
    largest non-max d), so T^ = T (1 + tau) with |tau| <= 4.25 eta + eta^2 even when T is tiny.
    With S = 1 + T and S^ = 1 + T^ = S (1 + sigma), sigma = tau T / (1 + T):
      k = 1: |log(S^) - log(S)| <= 1.01 |sigma| <= 1.01 |tau| log1p(T)   (log1p(T) >= T / (1 + T))
      k >= 2: L >= log 2, so the same difference is <= 1.46 |tau| L.
    L^ = mpf_log(S^) adds 4 eta L (S^ = 1 + T^ is formed exactly). When k = 1 and T^ < 2^-(prec+4),
    L^ = T^ instead (log1p(t) in [t - t^2/2, t]: relative error <= 2^-(prec+5)), which keeps
    rows like [0, -1e30] cheap. Altogether |L^ - L| <= 11 eta L^ (second order included); lse^ =
    fl(m + L^) adds eta |lse^|. The bound handed to Ziv is 16 eta L^ + 2 eta |lse^|.
    """

    def __init__(self, x: np.ndarray):
        super().__init__(x)
        if self.k > 1 or self.others.size == 0:
            self.top = libmp.fzero
        else:  # d is increasing in x, and the x are exact
            self.top = self.d(int(self.others[np.argmax(x[self.others])]))

    def value(self, prec: int) -> tuple[mpmath.mpf, mpmath.mpf]:
        t = self.exp_sum(prec, self.top, self.k - 1)
        if self.k == 1 and t[1] and t[2] + t[3] < -(prec + 4):
            lg = t  # log1p(t) = t to within 2^-(prec+5) relative
        else:
            lg = libmp.mpf_log(libmp.mpf_add(libmp.fone, t, 0), prec, _RN)  # S = 1 + T, exact
        lse = libmp.mpf_add(self.m_mpf, lg, prec, _RN)
        err = libmp.mpf_add(
            libmp.mpf_shift(lg, 4 - prec), libmp.mpf_shift(libmp.mpf_abs(lse), 1 - prec), prec, _RC
        )
        return _MAKE(lse), _MAKE(err)


def _logsumexp_row_exact(x: np.ndarray, fmt: Format) -> float:
    """Certified log-sum-exp of one row (special rows excluded)."""
    row = _LogSumExpRow(x)
    if row.k == 1 and row.others.size == 0:
        # a single finite entry: lse = m exactly (from_float maps -0.0 to +0, as -0 + log 1 = +0)
        return round_certified(lambda prec: (_MAKE(row.m_mpf), _MAKE(libmp.fzero)), fmt)
    return round_certified(row.value, fmt, start_prec=_start_prec(row.n))


# ---- public API ------------------------------------------------------------------------------


FormatLike = Format | str | torch.dtype


def softmax_oracle(
    x: np.ndarray | torch.Tensor, fmt: FormatLike, *, exact: bool = False
) -> np.ndarray:
    """Correctly rounded softmax over the last axis, as float64 values representable in `fmt`.

    `x` holds exact values (fp16/bf16/fp32 inputs widened to float64; any float64 is dyadic, so
    any float64 input is handled exactly). `exact=True` runs the mpmath path on every row; the
    default decides what it can in float64 and sends the rest to the mpmath path, with the same
    result (tests/test_oracles.py checks them bit for bit).
    """
    fmt = format_of(fmt)
    rows, shape = _as_rows(x)
    out = np.zeros_like(rows)
    if rows.shape[1] == 0:
        return out.reshape(shape)
    has_nan, has_pinf, all_ninf = _row_classes(rows)
    special = has_nan | has_pinf | all_ninf
    out[special] = np.nan
    idx = np.flatnonzero(~special)
    if exact:
        for i in idx:
            out[i] = _softmax_row_exact(rows[i], fmt)
        return out.reshape(shape)
    if idx.size:
        y, decided = _softmax_fast(rows[idx], fmt)
        out[idx] = y
        for j in np.flatnonzero(~decided.all(axis=1)):
            cols = np.flatnonzero(~decided[j])
            out[idx[j], cols] = _softmax_row_exact(rows[idx[j]], fmt, cols)
    return out.reshape(shape)


def logsumexp_oracle(
    x: np.ndarray | torch.Tensor, fmt: FormatLike, *, exact: bool = False
) -> np.ndarray:
    """Correctly rounded log(sum(exp(x))) over the last axis, shape x.shape[:-1].

    Special rows as torch.logsumexp: any NaN -> NaN, else any +inf -> +inf, only -inf (or an empty
    row) -> -inf. Paths as in `softmax_oracle`."""
    fmt = format_of(fmt)
    rows, shape = _as_rows(x)
    out = np.full(rows.shape[0], -np.inf)
    if rows.shape[1] == 0:
        return out.reshape(shape[:-1])
    has_nan, has_pinf, all_ninf = _row_classes(rows)
    out[has_nan] = np.nan
    out[has_pinf] = np.inf
    idx = np.flatnonzero(~(has_nan | has_pinf | all_ninf))
    if exact:
        for i in idx:
            out[i] = _logsumexp_row_exact(rows[i], fmt)
        return out.reshape(shape[:-1])
    if idx.size:
        v, decided = _logsumexp_fast(rows[idx], fmt)
        out[idx] = v
        for j in np.flatnonzero(~decided):
            out[idx[j]] = _logsumexp_row_exact(rows[idx[j]], fmt)
    return out.reshape(shape[:-1])

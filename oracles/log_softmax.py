"""Certified, correctly rounded log-softmax, softmax backward and log-softmax backward oracles.

Every function takes the kernel's actual input bits (torch tensors of fp16/bf16/fp32/fp64 with
any strides, or float64 NumPy arrays holding exact values) and returns a float64 NumPy array of
values representable in the output format `fmt`: the exact result rounded once, to nearest, ties
to even (gradual underflow, overflow to inf). docs/NUMERICS.md section 9 is the contract.

* `log_softmax_oracle(x, fmt)`: x_i - logsumexp(x), written as -((m - x_i) + log1p(T)) with
  m = max x, T = sum of exp(x_j - m) over every entry but one maximum: two non-negative terms,
  so no cancellation, and relative accuracy survives next to 0 (x_i the max, the rest tiny).
* `softmax_backward_oracle(y, dy, fmt)`: y_i (dy_i - sum_j y_j dy_j) from the given y (not
  recomputed): a polynomial in dyadic inputs, computed exactly (mpmath at precision 0) and
  rounded once.
* `log_softmax_backward_oracle(logp, dy, fmt)`: dy_i - exp(logp_i) sum_j dy_j (torch's formula on
  the output logp): the sum exact, the rest a ball certified by Ziv's loop.

Rows (`_LseRow`) are shared with `oracles/cross_entropy.py`, including the logit softcap.
Certification: `oracles/ball.py` (midpoint-radius arithmetic) + `rounding.round_certified`.
"""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import torch
from mpmath import libmp

from .ball import ONE, ZERO, Ball
from .formats import Format, format_of, round_float64, ulp_of
from .rounding import UndecidedRounding, round_certified, round_fraction, round_mpf

__all__ = ["log_softmax_oracle", "softmax_backward_oracle", "log_softmax_backward_oracle"]

_MAKE = mpmath.mp.make_mpf
FormatLike = Format | str | torch.dtype


def exact_values(x: np.ndarray | torch.Tensor) -> np.ndarray:
    """The exact values of a tensor (any strides, fp16/bf16/fp32/fp64) as a float64 array."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu")
        if x.dtype == torch.bfloat16:  # widen through the bit pattern (exact, no thread pool)
            bits = x.contiguous().view(torch.int16).numpy().astype(np.int32) << 16
            return bits.view(np.float32).astype(np.float64)
        return x.to(torch.float64).numpy().copy()
    return np.array(x, dtype=np.float64)


def as_rows(x: np.ndarray | torch.Tensor) -> tuple[np.ndarray, tuple[int, ...]]:
    a = exact_values(x)
    if a.ndim == 0:
        raise ValueError("need at least one dimension (rows are over the last)")
    rows = int(np.prod(a.shape[:-1], dtype=np.int64))
    return np.ascontiguousarray(a.reshape(rows, a.shape[-1])), a.shape


def start_prec(n: int) -> int:
    """Ziv's first precision: each row sum of n balls adds n eta of its value."""
    return 64 + 2 * max(n, 1).bit_length()


class _LseRow:
    """One row of logits x (exact values), optionally softcapped: x'_j = c tanh(x_j / c).

    Requires a row that is not special: without softcap no NaN, no +inf, a finite entry; with
    softcap no NaN (+-inf map to +-c). Per working precision (cached) it gives balls of
      d_j  = x'_j - x'_m <= 0     (exact without softcap; -inf entries are not in `fin`)
      e_j  = exp(d_j), T = sum of e_j over `fin` but one maximum i0, S = 1 + T,
      L    = log1p(T) = log(S), lse = x'_m + L, p_j = e_j / S,
      rest_t = sum of e_j over `fin` but t (= S - e_t, without cancellation),
      chain_j = d x'_j / d x_j = sech^2(x_j / c) (1 without softcap; 0 at +-inf).
    With softcap, d_j is formed without cancellation (a_j = x_j / c):
      both finite:           c sinh((x_j - x_m) / c) / (cosh a_j cosh a_m)
      x_j = -inf, x_m finite: -c e^{a_m} / cosh a_m          (c (-1 - tanh a_m))
      x_j finite, x_m = +inf: -c e^{-a_j} / cosh a_j         (c (tanh a_j - 1))
      x_j = -inf, x_m = +inf: -2c;  x_j = x_m: 0.
    """

    def __init__(self, x: np.ndarray, softcap: float | None = None):
        self.x = x
        self.n = int(x.shape[0])
        self.c = softcap
        self.fin = np.ones(self.n, bool) if softcap is not None else np.isfinite(x)
        self.m = float(x[self.fin].max())
        self.is_max = x == self.m
        self.i0 = int(np.flatnonzero(self.is_max)[0])
        self.k = int(self.is_max.sum())
        self.tie = self.k == int(self.fin.sum())  # every kept entry is the max: p = 1/k exactly
        self.prec0 = start_prec(self.n)
        self._cache: dict[int, dict] = {}
        self._d_exact: dict[int, Ball] = {}

    # exact pieces ---------------------------------------------------------------------------
    def xprime_exact(self, j: int) -> Fraction | None:
        """x'_j when it is rational (no softcap, or x_j = 0), else None."""
        if self.c is None:
            return Fraction(float(self.x[j]))
        return Fraction(0) if self.x[j] == 0 else None

    def chain_exact(self, j: int) -> Fraction | None:
        if self.c is None or self.x[j] == 0:
            return Fraction(1)
        if math.isinf(self.x[j]):
            return Fraction(0)
        return None

    def p_exact(self, j: int) -> Fraction | None:
        if not self.fin[j]:
            return Fraction(0)
        if self.tie:
            return Fraction(1, self.k)
        return None

    def lse_exact(self) -> Fraction | None:
        """lse when rational: a single kept entry (S = 1), rational itself."""
        if self.tie and self.k == 1:
            return self.xprime_exact(self.i0)
        return None

    # balls per precision --------------------------------------------------------------------
    def _state(self, prec: int) -> dict:
        st = self._cache.get(prec)
        if st is not None:
            return st
        st = {}
        if self.c is None:
            d = {}
            m = libmp.from_float(self.m)
            for j in np.flatnonzero(self.fin):
                j = int(j)
                b = self._d_exact.get(j)
                if b is None:
                    b = self._d_exact[j] = Ball(libmp.mpf_sub(libmp.from_float(float(self.x[j])), m, 0))
                d[j] = b
            st["xm"] = Ball(m)
            st["chain"] = {}
        else:
            d, st["xm"], st["chain"] = self._softcap(prec)
        e = {j: (Ball(ONE) if self.is_max[j] else b.exp(prec)) for j, b in d.items()}
        st["d"], st["e"] = d, e
        t = Ball(ZERO)
        for j, b in e.items():
            if j != self.i0:
                t = t.add(b, prec + 8)
        st["T"] = t
        st["S"] = Ball(ONE).add(t, prec + 8)
        st["L"] = t.log1p(prec)
        st["lse"] = st["xm"].add(st["L"], prec)
        st["rest"] = {}
        self._cache[prec] = st
        return st

    def _softcap(self, prec: int) -> tuple[dict, Ball, dict]:
        c = Ball.exact(self.c)
        x = self.x
        a, ch, sh = {}, {}, {}
        for j in range(self.n):
            if np.isfinite(x[j]):
                a[j] = Ball.exact(float(x[j])).div(c, prec)
                ch[j], sh[j] = a[j].cosh_sinh(prec)
        chain = {j: Ball(ONE).div(ch[j].mul(ch[j], prec), prec) for j in a}
        xm = self.m
        if math.isinf(xm):
            xprime_m = Ball.exact(math.copysign(self.c, xm))
        else:
            im = self.i0
            xprime_m = c.mul(sh[im].div(ch[im], prec), prec)
        d = {}
        for j in range(self.n):
            xj = x[j]
            if xj == xm:
                d[j] = Ball(ZERO)
            elif math.isfinite(xj) and math.isfinite(xm):
                delta = Ball(libmp.mpf_sub(libmp.from_float(float(xj)), libmp.from_float(xm), 0)).div(c, prec)
                _, s = delta.cosh_sinh(prec)
                d[j] = c.mul(s, prec).div(ch[j].mul(ch[self.i0], prec), prec)
            elif math.isfinite(xm):  # x_j = -inf
                im = self.i0
                d[j] = -(c.mul(a[im].exp(prec), prec).div(ch[im], prec))
            elif math.isfinite(xj):  # x_m = +inf
                d[j] = -(c.mul((-a[j]).exp(prec), prec).div(ch[j], prec))
            else:
                d[j] = Ball.exact(-2.0 * self.c)
        return d, xprime_m, chain

    def balls(self, prec: int) -> dict:
        return self._state(prec)

    def p(self, j: int, prec: int) -> Ball:
        st = self._state(prec)
        if not self.fin[j]:
            return Ball(ZERO)
        return st["e"][j].div(st["S"], prec)

    def one_minus_p(self, j: int, prec: int) -> Ball:
        """1 - p_j = rest_j / S, rest_j the sum of the other kept terms (no cancellation)."""
        st = self._state(prec)
        rest = st["rest"].get(j)
        if rest is None:
            rest = Ball(ZERO)
            for i, b in st["e"].items():
                if i != j:
                    rest = rest.add(b, prec + 8)
            st["rest"][j] = rest
        return rest.div(st["S"], prec)

    def chain(self, j: int, prec: int) -> Ball:
        if self.c is None:
            return Ball(ONE)
        if math.isinf(self.x[j]):
            return Ball(ZERO)
        return self._state(prec)["chain"][j]

    def log_softmax(self, j: int, prec: int) -> Ball:
        """d_j - L: both terms <= 0 after the sign, so the sum has no cancellation."""
        st = self._state(prec)
        return st["d"][j].sub(st["L"], prec)


def _special_rows(x: np.ndarray) -> np.ndarray:
    """torch.log_softmax / torch.softmax: NaN, +inf, or no finite entry (all -inf) -> NaN row."""
    return np.isnan(x).any(axis=1) | (x == np.inf).any(axis=1) | ~(np.isfinite(x).any(axis=1))


def log_softmax_oracle(x: np.ndarray | torch.Tensor, fmt: FormatLike) -> np.ndarray:
    """Correctly rounded log_softmax over the last dimension.

    Special rows as torch.log_softmax (CPU, float64): any NaN, any +inf, or every entry -inf
    -> the whole row NaN; -inf entries of other rows -> -inf; a single finite entry -> +0."""
    fmt = format_of(fmt)
    rows, shape = as_rows(x)
    out = np.full(rows.shape, np.nan)
    if rows.shape[1] == 0:
        return out.reshape(shape)
    special = _special_rows(rows)
    for i in np.flatnonzero(~special):
        row = _LseRow(rows[i])
        for j in range(row.n):
            if not row.fin[j]:
                out[i, j] = -np.inf
            elif row.tie and row.k == 1:
                out[i, j] = 0.0  # x_j = lse exactly
            else:
                try:
                    out[i, j] = round_certified(lambda prec, j=j: row.log_softmax(j, prec).pair(), fmt,
                                                start_prec=row.prec0)
                except UndecidedRounding:
                    out[i, j] = _below_midpoint(row, j, fmt)
    return out.reshape(shape)


def _below_midpoint(row: _LseRow, j: int, fmt: Format) -> float:
    """log p_j = d_j - L when Ziv's loop cannot decide it: d_j = x_j - x_m exactly a midpoint of
    `fmt` and L = log1p(T) > 0 below every precision tried (the other terms underflow past
    exp(-1e16)). Then d_j - L lies strictly below the midpoint, within delta (far less than an ulp)
    of it, so it rounds to the lower neighbour; anything else undecided is re-raised."""
    undecided = UndecidedRounding(f"log_softmax entry {j}: rounding to {fmt.name} not decided")
    if row.c is not None or row.tie:
        raise undecided
    d = Fraction(float(row.x[j])) - Fraction(row.m)
    delta = Fraction(ulp_of(abs(float(d)), fmt) if d else fmt.min_subnormal) / 2**20
    below, above = round_fraction(d - delta, fmt), round_fraction(d + delta, fmt)
    L = row.balls(256)["L"]
    positive = libmp.mpf_gt(L.lower(), libmp.fzero)
    small = libmp.mpf_lt(L.upper(), libmp.from_rational(delta.numerator, delta.denominator, 64, libmp.round_down))
    if below == above or (Fraction(below) + Fraction(above)) / 2 != d or not (positive and small):
        raise undecided
    return below


def _pair_rows(a, b, what: str) -> tuple[np.ndarray, np.ndarray, tuple[int, ...]]:
    ra, shape = as_rows(a)
    rb, shape_b = as_rows(b)
    if tuple(shape) != tuple(shape_b):
        raise ValueError(f"{what}: shapes differ, {tuple(shape)} and {tuple(shape_b)}")
    return ra, rb, shape


def _mpf(v: float) -> tuple:
    return libmp.from_float(float(v))


def softmax_backward_oracle(y: np.ndarray | torch.Tensor, dy: np.ndarray | torch.Tensor,
                            fmt: FormatLike) -> np.ndarray:
    """Correctly rounded dx = y * (dy - sum(y * dy)) over the last dimension, y as given.

    Exact: every product and sum of dyadic inputs is formed at mpmath precision 0 (no
    rounding), so the one rounding is the final one. Rows with a non-finite y or dy take the
    float64 formula, as torch's `_softmax_backward_data`: their sum is then inf or NaN, so every
    output of such a row is inf or NaN, fixed by IEEE rules alone (order-independent)."""
    fmt = format_of(fmt)
    yr, dr, shape = _pair_rows(y, dy, "softmax_backward_oracle")
    out = np.zeros(yr.shape)
    for i in range(yr.shape[0]):
        yy, dd = yr[i], dr[i]
        if not (np.isfinite(yy).all() and np.isfinite(dd).all()):
            with np.errstate(invalid="ignore", over="ignore"):
                out[i] = round_float64(yy * (dd - (yy * dd).sum()), fmt)
            continue
        ym = [_mpf(v) for v in yy]
        dm = [_mpf(v) for v in dd]
        s = ZERO
        for a, b in zip(ym, dm):
            s = libmp.mpf_add(s, libmp.mpf_mul(a, b, 0), 0)
        for j in range(yy.shape[0]):
            out[i, j] = round_mpf(_MAKE(libmp.mpf_mul(ym[j], libmp.mpf_sub(dm[j], s, 0), 0)), fmt)
    return out.reshape(shape)


def log_softmax_backward_oracle(logp: np.ndarray | torch.Tensor, dy: np.ndarray | torch.Tensor,
                                fmt: FormatLike) -> np.ndarray:
    """Correctly rounded dx = dy - exp(logp) * sum(dy) over the last dimension (torch's
    `_log_softmax_backward_data`, which takes the forward's output logp).

    sum(dy) is exact. Per element: logp_i = 0 or sum = 0 gives an exact dyadic value; otherwise
    exp(logp_i) is transcendental, so the result is neither 0 nor a rounding midpoint and Ziv's
    loop decides it. Non-finite inputs follow the float64 formula: a non-finite dy makes the sum
    inf or NaN and every output of the row inf or NaN; a non-finite logp_i touches element i only
    (-inf: exp = 0, dx_i = dy_i exactly; NaN: NaN; +inf: +-inf, or NaN when the sum is 0)."""
    fmt = format_of(fmt)
    lr, dr, shape = _pair_rows(logp, dy, "log_softmax_backward_oracle")
    out = np.zeros(lr.shape)
    n = lr.shape[1]
    for i in range(lr.shape[0]):
        lp, dd = lr[i], dr[i]
        if not np.isfinite(dd).all():
            with np.errstate(invalid="ignore", over="ignore"):
                out[i] = round_float64(dd - np.exp(lp) * dd.sum(), fmt)
            continue
        s = ZERO
        for v in dd:
            s = libmp.mpf_add(s, _mpf(v), 0)
        s_float = libmp.to_float(s)  # sign and zero-ness are exact; only used for specials
        sball = Ball(s)
        for j in range(n):
            if not np.isfinite(lp[j]):
                with np.errstate(invalid="ignore", over="ignore"):
                    out[i, j] = round_float64(dd[j] - np.exp(lp[j]) * s_float, fmt)
            elif lp[j] == 0 or s == ZERO:
                t = s if lp[j] == 0 else ZERO
                out[i, j] = round_mpf(_MAKE(libmp.mpf_sub(_mpf(dd[j]), t, 0)), fmt)
            else:
                lpb, db = Ball(_mpf(lp[j])), Ball(_mpf(dd[j]))
                out[i, j] = round_certified(lambda prec, lpb=lpb, db=db: db.sub(lpb.exp(prec).mul(sball, prec),
                                                                                  prec).pair(),
                                            fmt, start_prec=start_prec(n))
    return out.reshape(shape)


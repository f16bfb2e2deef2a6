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

The second half of the file holds the error bounds of our fp32 kernels of these functions
(`log_softmax_bound`, `softmax_backward_bound`, `log_softmax_backward_bound`: NUMERICS.md 9.6).

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
from .formats import FP32, Format, format_of, round_float64, ulp_of
from .rounding import round_certified, round_fraction, round_mpf

__all__ = ["log_softmax_oracle", "softmax_backward_oracle", "log_softmax_backward_oracle", "log_softmax_bound",
           "softmax_backward_bound", "log_softmax_backward_bound"]

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


#: Past this gap below the max (every other kept entry), L = log1p(T) < n e^-8192 < 2^-11800: next to an
#: exact dyadic (a difference of logits) no working precision Ziv's loop reaches (2^16 bits) resolves it,
#: and at a rounding midpoint it never would. `nudged` rounds such values instead.
NEGLIGIBLE_GAP = 8192.0


def nudged(q: Fraction, sign: int, fmt: Format) -> float:
    """The correct rounding of q + tau for any tau of sign `sign` with |tau| < 2^-(160 + bits of q's
    denominator): every rounding boundary of fp16/bf16/fp32 (and the overflow threshold) is a
    multiple of 2^-150, and a rational a/b off that grid is at least 2^-150 / b from it, so no
    boundary lies strictly between q and q + tau: q + sign 2^-(161 + bits) rounds as q + tau does."""
    return round_fraction(q + sign * Fraction(1, 2 ** (161 + q.denominator.bit_length())), fmt)


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

    def negligible_L(self) -> bool:
        """L > 0 but past any working precision beside an exact value: no softcap, and every kept
        entry but one maximum more than NEGLIGIBLE_GAP below it (L < n e^-8192)."""
        if self.c is not None or self.tie:
            return False
        others = self.x[self.fin & (np.arange(self.n) != self.i0)]
        return others.size > 0 and float(others.max()) - self.m < -NEGLIGIBLE_GAP

    # exact pieces ---------------------------------------------------------------------------
    def xprime_exact(self, j: int) -> Fraction | None:
        """x'_j when it is rational (no softcap, or x_j = 0), else None."""
        if self.c is None:
            return Fraction(float(self.x[j])) if math.isfinite(self.x[j]) else None
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
            elif row.negligible_L():  # (x_j - m) - L with L > 0 below any precision: rounds as a nudge down
                out[i, j] = nudged(Fraction(float(rows[i, j])) - Fraction(row.m), -1, fmt)
            else:
                out[i, j] = round_certified(lambda prec, j=j: row.log_softmax(j, prec).pair(), fmt,
                                            start_prec=row.prec0)
    return out.reshape(shape)


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



# =================================================================================================
# Error bounds of the fp32 kernels of kernels/log_softmax.py and kernels/softmax_backward.py
# (tolerances, not oracles: docs/NUMERICS.md 9.6). u = 2^-24; `depth` D is the longest chain of
# fp32 roundings in a row's sum (kernels/softmax_depth.py for the forward, backward_depth for the
# backwards). Each returns the allowed |kernel - oracle| per element: the kernel's own error `pre`
# plus the output's rounding, half an ulp of fmt for fp32 output (the oracle's own) and one ulp for
# fp16/bf16 (the fp32 value is rounded once more). Elements whose oracle value is not finite must
# match exactly: 0. First-order terms carry a factor (1 + 2^-20) for the second-order ones.
# =================================================================================================

_U = 2.0**-24
_FTZ = 2.0**-126  # an fp32 result below the normals may be flushed (GPU): at most this, absolute
_SECOND = 1.0 + 2.0**-20


def finish_bound(pre: np.ndarray, oracle: np.ndarray, fmt: Format, final: float | None = None) -> np.ndarray:
    """pre + the output's rounding (`final` ulps of fmt: 0.5 for fp32, 1 for 16-bit unless given), 0
    where the oracle is not finite. The ulp is taken at |r| + pre, the larger side."""
    r = np.asarray(oracle, dtype=np.float64)
    fin = np.isfinite(r)
    rr = np.where(fin, np.abs(r), 0.0)
    pre = np.where(fin, pre, 0.0)
    last = ulp_of(rr + pre, fmt) * (final if final is not None else (0.5 if fmt == FP32 else 1.0))
    return np.where(fin, pre + last, 0.0)


def _gamma(k: float) -> float:
    return k * _U / (1.0 - k * _U)


def lse_rows(x: np.ndarray) -> tuple[np.ndarray, ...]:
    """Float64 row statistics of finite-max rows for first-order bounds: m, d = m - x (inf at -inf),
    S = sum exp(-d) >= 1, L = log S, p, E = sum p d (non-finite rows: m = 0, harmless, their bound is 0)."""
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        xf = np.where(np.isnan(x), -np.inf, x)
        m = xf.max(axis=1, keepdims=True) if x.shape[1] else np.zeros((x.shape[0], 1))
        m = np.where(np.isfinite(m), m, 0.0)
        d = np.where(np.isfinite(xf), m - xf, np.inf)
        e = np.exp(-d)
        S = np.maximum(e.sum(axis=1, keepdims=True), 1.0)
        p = e / S
        E = np.where(p > 0, p * np.where(np.isfinite(d), d, 0.0), 0.0).sum(axis=1, keepdims=True)
    return m, d, S, np.log(S), p, E


def log_softmax_bound(x, fmt: FormatLike, depth: int, *, oracle: np.ndarray | None = None) -> np.ndarray:
    """Allowed |y^_i - r_i| for y_i = (x_i - m) - L, L = fl(ln 2) log2(s), s the softmax kernels' sum
    (NUMERICS.md 9.6): s^ = s (1 + sigma), |sigma| <= u (3E + 4 + D) + N 2^-126 (oracles/bounds.py's
    model of that sum); |L^ - L| <= 1.01 sigma + 2^-22 ln 2 (lg2.approx) + 3u L (log2's rounding on the
    CPU, fl(ln 2), the product); then fl(x_i - m) adds u d_i and the subtraction u |y_i|."""
    fmt = format_of(fmt)
    rows, shape = as_rows(x)
    if oracle is None:
        oracle = log_softmax_oracle(rows, fmt)
    r = np.asarray(oracle, dtype=np.float64).reshape(rows.shape)
    _, d, _, L, _, E = lse_rows(rows)
    sigma = _U * (3 * E + 4 + depth) + rows.shape[1] * _FTZ
    lam = 1.01 * sigma + 2.0**-22 * math.log(2) + 3 * _U * L
    with np.errstate(invalid="ignore"):
        pre = (_U * np.where(np.isfinite(d), d, 0.0) + lam + _U * np.abs(np.where(np.isfinite(r), r, 0.0))) * _SECOND
    return finish_bound(pre, r, fmt).reshape(shape)


def _bound_inputs(a, dy, fmt: FormatLike, oracle, oracle_fn) -> tuple:
    """(fmt, a rows, dy rows, shape, oracle rows) of a backward bound; the oracle computed if not given."""
    fmt = format_of(fmt)
    ar, dr, shape = _pair_rows(a, dy, oracle_fn.__name__.replace("oracle", "bound"))
    r = oracle_fn(ar, dr, fmt) if oracle is None else oracle
    return fmt, ar, dr, shape, np.asarray(r, dtype=np.float64).reshape(ar.shape)


def softmax_backward_bound(y, dy, fmt: FormatLike, depth: int, *, oracle: np.ndarray | None = None) -> np.ndarray:
    """Allowed |dx^_i - r_i| for the kernel's s = sum fl(y_j dy_j) (a chain of D roundings after the
    product: |s^ - s| <= gamma_{D+1} A + N 2^-126, A = sum |y_j dy_j|), t = fl(dy_i / 2 - s^ / 2)
    (u |t|; the halvings exact but for a flushed 2^-126), dx = 2 fl(y_i t) (u |dx|):
    pre_i = |y_i| ((1 + 2u) (gamma_{D+1} A + N 2^-126) + 2u |dy_i - s|) + 4 2^-126."""
    fmt, yr, dr, shape, r = _bound_inputs(y, dy, fmt, oracle, softmax_backward_oracle)
    with np.errstate(invalid="ignore", over="ignore"):
        prod = yr * dr
        A = np.abs(prod).sum(axis=1, keepdims=True)
        s = prod.sum(axis=1, keepdims=True)
        n = yr.shape[1]
        ds = (1 + 2 * _U) * (_gamma(depth + 1) * A + n * _FTZ)
        pre = (np.abs(yr) * (ds + 2 * _U * np.abs(dr - s)) + 4 * _FTZ) * _SECOND
    return finish_bound(pre, r, fmt).reshape(shape)


def log_softmax_backward_bound(logp, dy, fmt: FormatLike, depth: int, *,
                               oracle: np.ndarray | None = None) -> np.ndarray:
    """Allowed |dx^_i - r_i| for dx = (dy_i 2^-k - e^_i S^') 2^k (kernels/softmax_backward.py, log mode):
    S^ = sum dy (|S^ - S| <= gamma_D B + N 2^-126 2^k, B = sum |dy|, the 2^-k scalings exact but for
    flushes; k > 0 only when max |dy| >= 2^64), e^_i = exp2(fl(logp_i fl(log2 e))) within a relative
    eps_i = expm1(2.0001 u |logp_i| + 4.0001 u) of exp(logp_i) (two roundings of the exponent, ex2.approx
    4u), the product u, the difference u |dx|:
    pre_i = e_i (1 + eps_i)(1 + u) dS + e_i |S| (eps_i + u (1 + eps_i)) + u |dx_i| + 2^-125 2^k."""
    fmt, lr, dr, shape, r = _bound_inputs(logp, dy, fmt, oracle, log_softmax_backward_oracle)
    with np.errstate(invalid="ignore", over="ignore"):
        amax = np.abs(dr).max(axis=1, keepdims=True) if dr.shape[1] else np.zeros((dr.shape[0], 1))
        scale = np.where(np.isfinite(amax) & (amax >= 2.0**64), 2.0 * amax / 2.0**64, 1.0)  # >= 2^k
        S = dr.sum(axis=1, keepdims=True)
        B = np.abs(dr).sum(axis=1, keepdims=True)
        e = np.exp(lr)
        lpa = np.where(np.isfinite(lr), np.abs(lr), 0.0)
        eps = np.expm1(2.0001 * _U * lpa + 4.0001 * _U)
        dS = _gamma(depth) * B + dr.shape[1] * _FTZ * scale
        pre = (e * (1 + eps) * (1 + _U) * dS + e * np.abs(S) * (eps + _U * (1 + eps))
               + _U * np.abs(np.where(np.isfinite(r), r, 0.0)) + 2 * _FTZ * scale) * _SECOND
    return finish_bound(np.where(np.isfinite(pre), pre, 0.0), r, fmt).reshape(shape)

"""Ball arithmetic on mpmath's raw values: a midpoint and a radius that bounds the exact value.

The cross-entropy and log-softmax oracles combine many transcendental pieces (exponentials,
log1p, sinh/cosh for a softcap, rational weights); deriving one error bound per formula, as
`oracles/softmax.py` does for softmax, would be one derivation per option combination. A ball
carries its own bound instead: every operation at working precision `prec` (eta = 2^-prec) returns
a midpoint rounded to nearest and a radius, computed with upward rounding, that covers the
input radii (propagated through the operation's slope) plus the operation's own error. The final
ball goes to `rounding.round_certified` (Ziv): if both ends round alike the result is certified,
otherwise the caller recomputes at twice the precision.

Error model of the primitives (eta = 2^-prec, as oracles/softmax.py assumes):
  mpf_add / mpf_mul / mpf_div with round-to-nearest: relative error <= eta of the result.
  mpf_exp, mpf_log, mpf_cosh_sinh: relative error <= 4 eta (mpmath evaluates with 14 or more
  guard bits, adding the bits lost to cancellation near 0 / near 1, and rounds once; 4 eta is
  the margin we rely on). mpf_log is used on 1 + t formed exactly.
A radius of zero means the midpoint is exact; exact zeros stay exact through products, so a zero
coefficient gives an exact zero, never an interval straddling zero.
"""
from __future__ import annotations

from fractions import Fraction

import mpmath
from mpmath import libmp

_RN, _RC, _RF = libmp.round_nearest, libmp.round_ceiling, libmp.round_floor
_RP = 40  # precision of radius arithmetic (always rounded up, so any precision is rigorous)
ZERO, ONE, INF = libmp.fzero, libmp.fone, libmp.finf
_MAKE = mpmath.mp.make_mpf

__all__ = ["Ball"]


def _up_add(a: tuple, b: tuple) -> tuple:
    return libmp.mpf_add(a, b, _RP, _RC)


def _up_mul(a: tuple, b: tuple) -> tuple:
    return libmp.mpf_mul(a, b, _RP, _RC)


def _rel(mid: tuple, prec: int, k: int = 0) -> tuple:
    """|mid| * 2^(k - prec): k = 0 one rounding, k = 3 the 8 eta of a transcendental."""
    return libmp.mpf_shift(libmp.mpf_abs(mid), k - prec)


class Ball:
    """[m - r, m + r] with m, r raw mpf tuples (r >= 0, r = +inf when nothing is known)."""

    __slots__ = ("m", "r")

    def __init__(self, m: tuple, r: tuple = ZERO):
        self.m, self.r = m, r

    # ---- construction --------------------------------------------------------------------
    @staticmethod
    def exact(v: float | int | tuple) -> "Ball":
        if isinstance(v, tuple):
            return Ball(v)
        if isinstance(v, int):
            return Ball(libmp.from_int(v))
        return Ball(libmp.from_float(float(v)))

    @staticmethod
    def fraction(q: Fraction, prec: int) -> "Ball":
        """An exact rational: exact when dyadic, else rounded at prec (radius eta |m|)."""
        q = Fraction(q)
        den = q.denominator
        if den & (den - 1) == 0:
            return Ball(libmp.from_man_exp(q.numerator, -(den.bit_length() - 1)))
        m = libmp.from_rational(q.numerator, den, prec, _RN)
        return Ball(m, _rel(m, prec))

    @property
    def is_exact(self) -> bool:
        return self.r == ZERO

    @property
    def is_zero(self) -> bool:
        return self.r == ZERO and self.m == ZERO

    def pair(self) -> tuple[mpmath.mpf, mpmath.mpf]:
        """(approx, err) for `round_certified`."""
        return _MAKE(self.m), _MAKE(self.r)

    def lower(self) -> tuple:
        return libmp.mpf_sub(self.m, self.r, _RP, _RF)

    def upper(self) -> tuple:
        return libmp.mpf_add(self.m, self.r, _RP, _RC)

    # ---- arithmetic ------------------------------------------------------------------------
    def __neg__(self) -> "Ball":
        return Ball(libmp.mpf_neg(self.m), self.r)

    def add(self, o: "Ball", prec: int) -> "Ball":
        exact = self.r == ZERO and o.r == ZERO
        if exact and self.m == ZERO:
            return o
        if exact and o.m == ZERO:
            return self
        m = libmp.mpf_add(self.m, o.m, prec, _RN)
        return Ball(m, _up_add(_up_add(self.r, o.r), _rel(m, prec)))

    def sub(self, o: "Ball", prec: int) -> "Ball":
        return self.add(-o, prec)

    def mul(self, o: "Ball", prec: int) -> "Ball":
        if self.is_zero or o.is_zero:
            return Ball(ZERO)
        m = libmp.mpf_mul(self.m, o.m, prec, _RN)
        r = _up_add(_up_mul(libmp.mpf_abs(self.m), o.r), _up_mul(libmp.mpf_abs(o.m), self.r))
        r = _up_add(_up_add(r, _up_mul(self.r, o.r)), _rel(m, prec))
        return Ball(m, r)

    def div(self, o: "Ball", prec: int) -> "Ball":
        """|a/b - am/bm| <= (ra |bm| + |am| rb) / (|bm| (|bm| - rb)); infinite unless |bm| > rb."""
        bm = libmp.mpf_abs(o.m)
        if not libmp.mpf_gt(bm, o.r):
            return Ball(libmp.mpf_div(self.m, o.m, prec, _RN) if o.m != ZERO else ZERO, INF)
        if self.is_zero:
            return Ball(ZERO)
        m = libmp.mpf_div(self.m, o.m, prec, _RN)
        num = _up_add(_up_mul(self.r, bm), _up_mul(libmp.mpf_abs(self.m), o.r))
        den = libmp.mpf_mul(bm, libmp.mpf_sub(bm, o.r, _RP, _RF), _RP, _RF)
        return Ball(m, _up_add(libmp.mpf_div(num, den, _RP, _RC), _rel(m, prec)))

    def exp(self, prec: int) -> "Ball":
        """|exp(a) - mid| <= exp(am)(4 eta + expm1(ra)) <= |mid| (8 eta + 2 ra) for ra <= 1/2."""
        if self.is_exact and self.m == ZERO:
            return Ball(ONE)
        m = libmp.mpf_exp(self.m, prec, _RN)
        if libmp.mpf_gt(self.r, libmp.mpf_shift(ONE, -1)):
            return Ball(m, INF)
        return Ball(m, _up_add(_rel(m, prec, 3), _up_mul(libmp.mpf_abs(m), libmp.mpf_shift(self.r, 1))))

    def log1p(self, prec: int) -> "Ball":
        """log(1 + t) for a ball t >= 0 (the caller's guarantee).

        Slope 1 / (1 + t) <= 1 / (1 + max(tm - rt, 0)) carries the radius. For tm < 2^-(prec+4),
        log1p(tm) in [tm - tm^2/2, tm], so tm itself is within tm 2^-(prec+5)."""
        if self.is_zero:
            return Ball(ZERO)
        slope_r = libmp.mpf_div(self.r, libmp.mpf_add(ONE, _nonneg(self.lower()), _RP, _RF), _RP, _RC)
        tm = self.m
        if tm[1] and tm[2] + tm[3] < -(prec + 4):
            return Ball(tm, _up_add(slope_r, _rel(tm, prec + 4)))
        m = libmp.mpf_log(libmp.mpf_add(ONE, tm, 0), prec, _RN)  # 1 + t exact
        return Ball(m, _up_add(_rel(m, prec, 3), slope_r))

    def cosh_sinh(self, prec: int) -> tuple["Ball", "Ball"]:
        """cosh and sinh; |sinh(a) - sinh(am)|, |cosh(a) - cosh(am)| <= cosh(|am| + ra) ra
        <= cosh(am) e^ra ra <= 2 cosh(am) ra for ra <= 1/2."""
        c, s = libmp.mpf_cosh_sinh(self.m, prec, _RN)
        if libmp.mpf_gt(self.r, libmp.mpf_shift(ONE, -1)):
            return Ball(c, INF), Ball(s, INF)
        prop = _up_mul(_up_mul(c, libmp.mpf_shift(self.r, 1)), libmp.from_float(1.0 + 2.0**-20))
        return Ball(c, _up_add(_rel(c, prec, 3), prop)), Ball(s, _up_add(_rel(s, prec, 3), prop))


def _nonneg(t: tuple) -> tuple:
    return t if t[0] == 0 or t == ZERO else ZERO


def ball_sum(terms: list[Ball], prec: int) -> Ball:
    """Sum of balls, each addition rounded at prec."""
    total = Ball(ZERO)
    for t in terms:
        total = total.add(t, prec)
    return total

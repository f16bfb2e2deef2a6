"""Correct rounding of exact binary values, and certified (Ziv) rounding of approximations.

An mpmath `mpf` is exactly `(-1)^sign * man * 2^exp` with an odd integer `man` of `bc` bits, so
rounding it to a binary format is integer arithmetic: find the quantum (spacing) of the target at
the value's magnitude, split `man` into the kept part and the remainder, and compare the remainder
with half a quantum. No float arithmetic touches the value, so no double rounding can happen.

Certified rounding (Ziv's strategy): a transcendental result is only ever known as an
approximation `a` with an error bound `err`. Rounding is monotonic, so if `a - err` and `a + err`
round to the same value (and sign), every point between them does, the exact value included.
Otherwise the precision is doubled and the computation repeated. This terminates whenever the exact
value is not itself a rounding boundary (a midpoint between two neighbours, or the overflow
threshold); callers must detect those exact cases themselves and hand them over with `err == 0`.
"""
from __future__ import annotations

import math
from fractions import Fraction
from typing import Callable

import mpmath
from mpmath import libmp

from .formats import Format

__all__ = ["UndecidedRounding", "round_mpf", "round_fraction", "round_certified"]

# mpmath's raw value tuples (sign, man, exp, bc) for the special values; zeros have man == 0.
_FZERO, _FNZERO = libmp.fzero, libmp.fnzero
_FINF, _FNINF = libmp.finf, libmp.fninf

DEFAULT_START_PREC = 64
DEFAULT_MAX_PREC = 1 << 16


class UndecidedRounding(ArithmeticError):
    """Ziv's loop reached its precision limit without deciding the rounding."""


def _round_magnitude(man: int, exp: int, bc: int, fmt: Format) -> float:
    """Round the positive value man * 2^exp (man of bc bits) to `fmt`, ties to even."""
    e = exp + bc - 1  # floor(log2(value)): man lies in [2^(bc-1), 2^bc)
    if e > fmt.emax:
        return math.inf  # at least 2^(emax+1), beyond the overflow threshold max + ulp/2
    qe = max(e, fmt.emin) - fmt.precision + 1  # exponent of the quantum at this magnitude
    if e < qe - 1:
        # value < 2^(e+1) <= 2^(qe-1), below half the smallest quantum. Checked before shifting
        # so that values like exp(-1e39) (exponents of 1e39 bits) cost nothing.
        return 0.0
    shift = qe - exp
    if shift <= 0:
        n = man << -shift  # already a multiple of the quantum: exact
    else:
        n = man >> shift
        rem = man - (n << shift)
        half = 1 << (shift - 1)
        if rem > half or (rem == half and n & 1):
            n += 1
    # n <= 2^precision fits a float64 exactly, and ldexp by a power of two is exact.
    r = math.ldexp(int(n), qe)
    # Rounding up may carry into the next binade; beyond max_finite it is an overflow.
    return math.inf if r > fmt.max_finite else r


def _round_tuple(t: tuple, fmt: Format) -> float:
    sign, man, exp, bc = t
    if not man:
        if t == _FZERO:
            return 0.0
        if t == _FNZERO:
            return -0.0
        if t == _FINF:
            return math.inf
        if t == _FNINF:
            return -math.inf
        return math.nan
    mag = _round_magnitude(man, exp, bc, fmt)
    return -mag if sign else mag


def round_mpf(value: mpmath.mpf, fmt: Format) -> float:
    """Correctly round the exact value of an mpf to `fmt` (nearest, ties to even).

    Gradual underflow, overflow to +-inf and signed zeros as IEEE 754; NaN and infinities pass
    through. The result is a float64 holding a value representable in `fmt`.
    """
    return _round_tuple(value._mpf_, fmt)


def round_fraction(value: Fraction | int, fmt: Format) -> float:
    """Correctly round an exact rational to `fmt` (nearest, ties to even).

    Used for results that are exact rationals but not dyadic, or dyadic midpoints that Ziv's loop
    could never decide (softmax of a constant row is exactly 1/k)."""
    q = Fraction(value)
    num, den = q.numerator, q.denominator
    if num == 0:
        return 0.0
    a = abs(num)
    # e = floor(log2(a / den)): the bit-length difference is right or one too large.
    e = a.bit_length() - den.bit_length()
    if (a << max(-e, 0)) < (den << max(e, 0)):
        e -= 1
    if e > fmt.emax:
        mag = math.inf
    else:
        qe = max(e, fmt.emin) - fmt.precision + 1
        top, bottom = (a, den << qe) if qe >= 0 else (a << -qe, den)
        n, rem = divmod(top, bottom)
        if 2 * rem > bottom or (2 * rem == bottom and n & 1):
            n += 1
        mag = math.ldexp(n, qe)
        if mag > fmt.max_finite:
            mag = math.inf
    return -mag if num < 0 else mag


def _same_rounding(a: float, b: float) -> bool:
    # Compare bit patterns, not values: -0.0 == 0.0 in float, but a straddled zero is undecided.
    if math.isnan(a) or math.isnan(b):
        return False
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


def round_certified(
    compute: Callable[[int], tuple[mpmath.mpf, mpmath.mpf]],
    fmt: Format,
    *,
    start_prec: int = DEFAULT_START_PREC,
    max_prec: int = DEFAULT_MAX_PREC,
) -> float:
    """Correctly round a value known through approximations of growing precision (Ziv).

    `compute(prec)` returns `(approx, err)` with |exact - approx| <= err, computed at working
    precision `prec` inside its own scope (`mpmath.workprec(prec)`, a private `MPContext`, or
    mpmath.libmp functions that take the precision as an argument): the global `mpmath.mp`
    precision must be left as it was, which is checked. `err == 0` declares `approx` exact.

    The interval ends are computed with outward (floor/ceiling) rounding at a precision above
    `prec`, so the test never claims more than the bound allows. Raises `UndecidedRounding`
    when `max_prec` is exceeded (the value is a rounding boundary or the bound never tightens).
    """
    prec = max(int(start_prec), 2)
    global_prec = mpmath.mp.prec
    while prec <= max_prec:
        approx, err = compute(prec)
        if mpmath.mp.prec != global_prec:
            raise RuntimeError("compute() changed mpmath.mp.prec; use a scoped context")
        a = approx._mpf_
        e = libmp.mpf_abs(err._mpf_)
        if e == _FZERO or a in (_FINF, _FNINF, libmp.fnan):
            return _round_tuple(a, fmt)
        if e not in (_FINF, libmp.fnan):
            lo = libmp.mpf_sub(a, e, prec + 8, libmp.round_floor)
            hi = libmp.mpf_add(a, e, prec + 8, libmp.round_ceiling)
            r_lo, r_hi = _round_tuple(lo, fmt), _round_tuple(hi, fmt)
            if _same_rounding(r_lo, r_hi):
                return r_lo
        prec *= 2
    raise UndecidedRounding(f"rounding to {fmt.name} not decided at {max_prec} bits")

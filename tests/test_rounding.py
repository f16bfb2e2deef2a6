"""The rounding layer under the oracles: round_float64 / round_mpf / round_fraction on every fp16
and bf16 bit pattern and fp32 spot checks, certified rounding, the ULP metric.

No kernel is involved. Everything is deterministic (fixed NumPy seeds)."""
from __future__ import annotations

import math
from fractions import Fraction

import mpmath
import numpy as np
import pytest
import torch
from mpmath import libmp

from flashcheck.oracles import (
    BF16,
    FP16,
    FP32,
    Format,
    UndecidedRounding,
    round_certified,
    round_float64,
    round_fraction,
    round_mpf,
    ulp_distance,
    ulp_of,
)

from .test_oracles import FMTS, IDS, INF, NAN, MPF, same_bits  # noqa: F401


# ---- rounding: every fp16 / bf16 bit pattern -------------------------------------------------


def _all_values(fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """All non-negative finite values of a 16-bit format in order, plus +inf as the last entry,
    and their bit patterns (consecutive integers, so the even neighbour has an even pattern)."""
    bits = np.arange(0, 0x7C01 if fmt == FP16 else 0x7F81, dtype=np.int32)
    t = torch.from_numpy(bits.astype(np.int16)).view(fmt.torch_dtype)
    v = t.to(torch.float64).numpy()
    assert np.all(np.diff(v) > 0) and v[-1] == INF and v[-2] == fmt.max_finite
    return v, bits


def _midpoints(fmt: Format) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Midpoints between neighbours (exact in float64), the lower and upper neighbour, and the
    neighbour with the even bit pattern.
    Above the largest finite value the 'neighbour' is 2^(emax+1): that midpoint is the
    overflow threshold and ties to the even pattern, which is +inf."""
    v, bits = _all_values(fmt)
    lo, hi = v[:-1], v[1:].copy()
    hi[-1] = 2.0 ** (fmt.emax + 1)
    mid = (lo + hi) / 2
    even = np.where(bits[:-1] % 2 == 0, lo, v[1:])
    return mid, lo, np.where(np.isinf(v[1:]), INF, v[1:]), even


@pytest.mark.parametrize("fmt", [FP16, BF16], ids=["fp16", "bf16"])
def test_round_float64_every_bit_pattern(fmt: Format) -> None:
    v, _ = _all_values(fmt)
    finite = v[:-1]
    for sign in (1.0, -1.0):
        assert same_bits(round_float64(sign * finite, fmt), sign * finite)
        mid, lo, up, even = _midpoints(fmt)
        assert same_bits(round_float64(sign * mid, fmt), sign * even)
        above = np.nextafter(mid, INF) * sign
        below = np.nextafter(mid, 0.0) * sign
        assert same_bits(round_float64(above, fmt), sign * up)
        assert same_bits(round_float64(below, fmt), sign * lo)
    assert round_float64(np.array([2.0 ** (fmt.emax + 1), 1e300]), fmt).tolist() == [INF, INF]


def _mpf_tuple(man: int, exp: int) -> tuple:
    return libmp.from_man_exp(man, exp)


@pytest.mark.parametrize("fmt", [FP16, BF16], ids=["fp16", "bf16"])
def test_round_mpf_every_bit_pattern(fmt: Format) -> None:
    """Each value, each midpoint exactly, and each midpoint moved by 2^-200 of itself (far below
    float64's resolution, so this checks the integer logic, not a float shortcut)."""
    v, _ = _all_values(fmt)
    mid, lo, up, even = _midpoints(fmt)
    bad = []
    for sign in (0, 1):
        s = -1.0 if sign else 1.0
        for x in v[:-1]:
            t = libmp.from_float(float(x))
            t = (sign, t[1], t[2], t[3]) if t[1] else (libmp.fnzero if sign else libmp.fzero)
            if not same_bits(round_mpf(MPF(t), fmt), s * x):
                bad.append(("value", s * x))
        for m_, l_, u_, e_ in zip(mid.tolist(), lo.tolist(), up.tolist(), even.tolist()):
            _, man, exp, _ = libmp.from_float(m_)  # exact
            man, exp = int(man) << 200, exp - 200
            for delta, want in ((0, e_), (1, u_), (-1, l_)):
                t = _mpf_tuple(man + delta, exp)
                t = (sign, t[1], t[2], t[3])
                if round_mpf(MPF(t), fmt) != s * want:
                    bad.append((delta, s * m_))
    assert not bad, bad[:10]


def test_round_fp32_spot_checks() -> None:
    tiny, minn, mx = 2.0**-149, 2.0**-126, FP32.max_finite
    cases = [
        (2.0**-150, 0.0),  # half the least subnormal: tie to even 0
        (np.nextafter(2.0**-150, 1.0), tiny),
        (3 * 2.0**-150, 2 * tiny),  # tie between 1 and 2 subnormal steps: even is 2
        (5 * 2.0**-150, 2 * tiny),
        (minn - tiny / 2, minn),  # max subnormal (odd) / min normal (even) tie
        (minn - tiny, minn - tiny),
        (mx + 2.0**103, INF),  # overflow threshold max + ulp/2 ties to +inf
        (np.nextafter(mx + 2.0**103, 0.0), mx),
        (2.0**127 * (1 + 2.0**-24), 2.0**127),  # ties in the top binade
        (2.0**127 * (1 + 3 * 2.0**-24), 2.0**127 * (1 + 2.0**-22)),
        (-0.0, -0.0),
        (-(2.0**-151), -0.0),
        (-(2.0**-150), -0.0),
        (-(3 * 2.0**-150), -2 * tiny),
        (1.0 + 2.0**-24, 1.0),
        (1.0 + 3 * 2.0**-24, 1.0 + 2.0**-22),
    ]
    x = np.array([c[0] for c in cases])
    want = np.array([c[1] for c in cases])
    assert same_bits(round_float64(x, FP32), want)
    got = np.array([round_mpf(MPF(libmp.from_float(float(c))), FP32) for c in x])
    # from_float(-0.0) is mpmath's +0; every other sign survives, and -0 is checked below
    z = x == 0
    assert same_bits(got[~z], want[~z]) and (got[z] == 0).all()
    assert same_bits(round_mpf(MPF(libmp.fnzero), FP32), -0.0)
    assert same_bits(round_mpf(MPF(libmp.from_man_exp(-1, -151)), FP32), -0.0)
    assert math.isnan(round_mpf(mpmath.mpf("nan"), FP32))
    assert round_mpf(mpmath.mpf("-inf"), FP16) == -INF
    # far out of range: exponents of 1e39 bits cost nothing
    assert round_mpf(MPF(libmp.from_man_exp(3, -10**39)), FP32) == 0.0
    assert round_mpf(MPF(libmp.from_man_exp(3, 10**39)), FP32) == INF
    # torch agrees on random fp32 casts from float64 (torch's cast is correctly rounded)
    rng = np.random.default_rng(5)
    r = rng.standard_normal(20000) * np.exp2(rng.integers(-160, 130, 20000))
    assert same_bits(round_float64(r, FP32), torch.from_numpy(r).float().double().numpy())



def test_bf16_bit_patterns_round_as_round_float64() -> None:
    """The bf16 codec (oracles.formats: the interpreter's and the strategies'): the fp32 bit trick
    rounds as round_float64 does (through f64_to_bf16_bits), on every bf16 rounding decision, a
    stride through every fp32 pattern and NaNs; the decoding inverts the encoding."""
    from flashcheck.oracles.formats import QNAN_BF16, bf16_bits_to_f32, f32_to_bf16_bits, f64_to_bf16_bits

    from .bits import f32_rounding_cases

    stride = np.arange(0, 1 << 32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32)
    x = np.concatenate([f32_rounding_cases().numpy(), stride])
    got = f32_to_bf16_bits(x)
    assert np.array_equal(got, f64_to_bf16_bits(x.astype(np.float64)))
    nan = np.isnan(x)
    assert (got[nan] == QNAN_BF16).all()
    want = round_float64(x[~nan].astype(np.float64), BF16)
    assert same_bits(bf16_bits_to_f32(got[~nan]).astype(np.float64), want)
    every = np.arange(1 << 16, dtype=np.uint16)
    v = bf16_bits_to_f32(every)
    assert np.array_equal(f32_to_bf16_bits(v)[~np.isnan(v)], every[~np.isnan(v)])


def _is_correctly_rounded(q: Fraction, r: float, fmt: Format) -> bool:
    """r is the representable value nearest q, ties to the even pattern (checked exactly)."""
    t = torch.tensor([r], dtype=torch.float64).to(fmt.torch_dtype)
    view = torch.int16 if fmt.bits == 16 else torch.int32
    b = int(t.view(view).item())
    up = torch.tensor([b + 1], dtype=view).view(fmt.torch_dtype).double().item()
    down = torch.tensor([b - 1], dtype=view).view(fmt.torch_dtype).double().item() if b else -r
    dist = abs(q - Fraction(r))

    def beats(other: float) -> bool:
        if math.isinf(other):
            return True
        d = abs(q - Fraction(other))
        return dist < d or (dist == d and b % 2 == 0)

    return beats(up) and beats(down)


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_round_fraction(fmt: Format) -> None:
    for k in range(1, 400):
        assert _is_correctly_rounded(Fraction(1, k), round_fraction(Fraction(1, k), fmt), fmt), k
        assert round_fraction(Fraction(-1, k), fmt) == -round_fraction(Fraction(1, k), fmt)
    assert round_fraction(Fraction(2) ** (fmt.emax + 1), fmt) == INF
    assert round_fraction(Fraction(1, 2 ** (fmt.precision - fmt.emin + 1)), fmt) == 0.0


# ---- certified rounding ----------------------------------------------------------------------


def test_round_certified_exp1() -> None:
    def compute(prec: int) -> tuple[mpmath.mpf, mpmath.mpf]:
        with mpmath.workprec(prec):
            v = mpmath.exp(1)
            return v, v * mpmath.mpf(2) ** (2 - prec)

    for fmt in FMTS:
        with mpmath.workprec(300):
            want = round_mpf(+mpmath.e, fmt)
        assert round_certified(compute, fmt) == want


def test_round_certified_refuses_a_midpoint_and_a_leaked_precision() -> None:
    half_way = MPF(libmp.from_man_exp(2049, -11))  # 1 + 2^-11: an fp16 midpoint

    def near_midpoint(prec: int) -> tuple[mpmath.mpf, mpmath.mpf]:
        return half_way, MPF(libmp.from_man_exp(1, -prec))

    with pytest.raises(UndecidedRounding):
        round_certified(near_midpoint, FP16, max_prec=512)
    # the same value declared exact (err = 0) rounds to even
    assert round_certified(lambda p: (half_way, MPF(libmp.fzero)), FP16) == 1.0

    def leaky(prec: int) -> tuple[mpmath.mpf, mpmath.mpf]:
        mpmath.mp.prec = prec  # the bug round_certified must catch
        return mpmath.mpf(1), mpmath.mpf(0)

    saved = mpmath.mp.prec
    try:
        with pytest.raises(RuntimeError):
            round_certified(leaky, FP32)
    finally:
        mpmath.mp.prec = saved


# ---- ULP distance ----------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_ulp_distance(fmt: Format) -> None:
    tiny, minn = fmt.min_subnormal, fmt.min_normal
    assert ulp_distance(np.array([0.0]), np.array([-0.0]), fmt)[0] == 0
    assert ulp_distance(np.array([NAN]), np.array([NAN]), fmt)[0] == 0
    assert np.isinf(ulp_distance(np.array([NAN, 1.0]), np.array([1.0, NAN]), fmt)).all()
    assert ulp_distance(np.array([tiny]), np.array([-tiny]), fmt)[0] == 2  # across zero
    assert ulp_distance(np.array([tiny]), np.array([0.0]), fmt)[0] == 1
    assert ulp_distance(np.array([-tiny]), np.array([-0.0]), fmt)[0] == 1
    assert ulp_distance(np.array([minn]), np.array([minn - tiny]), fmt)[0] == 1  # subnormal/normal
    below_one = 1.0 - 2.0**-fmt.precision
    assert ulp_distance(np.array([1.0]), np.array([below_one]), fmt)[0] == 1  # across a binade
    above_one = 1.0 + 2.0 ** (1 - fmt.precision)
    assert ulp_distance(np.array([above_one]), np.array([below_one]), fmt)[0] == 2
    assert ulp_distance(np.array([fmt.max_finite]), np.array([INF]), fmt)[0] == 1
    assert ulp_distance(np.array([-INF]), np.array([INF]), fmt)[0] > 1000


@pytest.mark.parametrize("fmt", FMTS, ids=IDS)
def test_ulp_of_is_the_spacing_at_each_value(fmt: Format) -> None:
    tiny, minn = fmt.min_subnormal, fmt.min_normal
    values = np.array([0.0, -0.0, tiny, minn - tiny, minn, 1.0, -1.0, 1.5, fmt.max_finite])
    # Zero lies in the subnormal range: its spacing is the smallest subnormal, not 2^-p.
    expected = np.array([tiny, tiny, tiny, tiny, tiny, 2.0 ** (1 - fmt.precision), 2.0 ** (1 - fmt.precision),
                         2.0 ** (1 - fmt.precision), 2.0 ** (fmt.emax + 1 - fmt.precision)])
    np.testing.assert_array_equal(ulp_of(values, fmt), expected)

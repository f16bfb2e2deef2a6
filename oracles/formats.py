"""Floating-point formats, exact conversion, correct rounding of float64 values, ULP distance.

Every fp16, bf16 and fp32 value is exactly a float64, so float64 arrays carry exact inputs and
correctly rounded oracle outputs without loss. Rounding here is round-to-nearest, ties-to-even,
with gradual underflow, overflow to infinity and signed zeros, as IEEE 754 specifies.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class Format:
    name: str
    torch_dtype: torch.dtype
    precision: int  # significand bits, the implicit one included
    emin: int  # exponent of the smallest normal
    emax: int  # exponent of the largest finite

    @property
    def max_finite(self) -> float:
        return float((2 - 2.0 ** (1 - self.precision)) * 2.0**self.emax)

    @property
    def min_normal(self) -> float:
        return float(2.0**self.emin)

    @property
    def min_subnormal(self) -> float:
        return float(2.0 ** (self.emin - self.precision + 1))

    @property
    def unit_roundoff(self) -> float:
        return float(2.0**-self.precision)

    @property
    def bits(self) -> int:
        return 16 if self.torch_dtype in (torch.float16, torch.bfloat16) else 32


FP16 = Format("fp16", torch.float16, 11, -14, 15)
BF16 = Format("bf16", torch.bfloat16, 8, -126, 127)
FP32 = Format("fp32", torch.float32, 24, -126, 127)
FORMATS: dict[torch.dtype, Format] = {f.torch_dtype: f for f in (FP16, BF16, FP32)}
BY_NAME: dict[str, Format] = {f.name: f for f in (FP16, BF16, FP32)}
#: The float dtypes flashcheck checks, narrowest first: read this, never a literal list (kernels/ keeps
#: its own copies, `_common.FLOAT_DTYPES` and `registry.ALL_DTYPES`: it may not import the oracles' torch
#: types table without changing the digest the GPU lane's record is tied to).
FLOAT_DTYPES: tuple[torch.dtype, ...] = tuple(FORMATS)


def format_of(dtype: torch.dtype | str | Format) -> Format:
    if isinstance(dtype, Format):
        return dtype
    if isinstance(dtype, str):
        try:
            return BY_NAME[dtype]
        except KeyError:
            raise ValueError(f"unknown format {dtype!r}; expected one of {sorted(BY_NAME)}") from None
    try:
        return FORMATS[dtype]
    except KeyError:
        raise ValueError(f"unsupported dtype {dtype}; expected fp16, bf16 or fp32") from None


def to_float64(t: torch.Tensor) -> np.ndarray:
    """The exact values of a tensor as float64 (a widening, so never a rounding).

    Widened in NumPy (bf16 through its bit pattern: the top half of an fp32), not with torch's
    `.to(float64)`, which on a busy machine spends tens of milliseconds in its thread pool."""
    c = t.detach().cpu()
    if c.dtype == torch.bfloat16:
        bits = c.contiguous().view(torch.int16).numpy().astype(np.int32) << 16
        return bits.view(np.float32).astype(np.float64)
    if c.dtype in (torch.float16, torch.float32, torch.float64):
        return c.numpy().astype(np.float64)
    return c.to(torch.float64).numpy()


def round_float64(values: np.ndarray | float, fmt: Format) -> np.ndarray:
    """Correctly round exact float64 values to `fmt`; the result holds representable values."""
    v = np.asarray(values, dtype=np.float64)
    out = v.copy()
    finite = np.isfinite(v) & (v != 0)
    a = np.abs(v[finite])
    # The quantum (spacing) at each value: 2^(e - p + 1), with e clamped to emin below.
    _, e2 = np.frexp(a)  # a = m * 2^e2, m in [0.5, 1)
    e = np.maximum(e2 - 1, fmt.emin)
    q = np.ldexp(1.0, e - fmt.precision + 1)
    r = np.round(a / q) * q  # a / q is exact (power-of-two scaling); np.round is ties-to-even
    r = np.where(r > fmt.max_finite, np.inf, r)
    out[finite] = np.copysign(r, v[finite])
    return out


def _ordered(values: np.ndarray, fmt: Format) -> np.ndarray:
    """Map representable values to integers in their order: consecutive values differ by 1."""
    t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float64)).to(fmt.torch_dtype)
    if fmt.bits == 16:
        bits = t.view(torch.int16).numpy().astype(np.int64) & 0xFFFF
        sign, mag = bits >> 15, bits & 0x7FFF
    else:
        bits = t.view(torch.int32).numpy().astype(np.int64) & 0xFFFFFFFF
        sign, mag = bits >> 31, bits & 0x7FFFFFFF
    return np.where(sign == 1, -mag, mag)


def ulp_distance(actual: np.ndarray | torch.Tensor, expected: np.ndarray, fmt: Format) -> np.ndarray:
    """Steps of `fmt` between two arrays of representable values.

    +0 and -0 are 0 apart; NaN is 0 from NaN and infinitely far from anything else.
    """
    if isinstance(actual, torch.Tensor):
        actual = to_float64(actual)
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    a, b = np.broadcast_arrays(a, b)
    na, nb = np.isnan(a), np.isnan(b)
    a_, b_ = np.where(na, 0.0, a), np.where(nb, 0.0, b)
    if not (np.array_equal(round_float64(a_, fmt), a_) and np.array_equal(round_float64(b_, fmt), b_)):
        raise ValueError(f"ulp_distance needs values representable in {fmt.name}")
    d = np.abs(_ordered(a_, fmt) - _ordered(b_, fmt)).astype(np.float64)
    d = np.where(na | nb, np.where(na & nb, 0.0, np.inf), d)
    return d


def ulp_of(values: np.ndarray, fmt: Format) -> np.ndarray:
    """The spacing of `fmt` at each value's magnitude (the gap to the next value away from 0)."""
    a = np.abs(np.asarray(values, dtype=np.float64))
    _, e2 = np.frexp(np.where(np.isfinite(a), a, fmt.max_finite))
    # frexp(0) reports exponent 0; zero sits in the subnormal range, whose spacing is emin's.
    e = np.where(a == 0, fmt.emin, np.maximum(e2 - 1, fmt.emin))
    return np.ldexp(1.0, e - fmt.precision + 1)

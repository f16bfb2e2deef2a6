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
#: types table without changing the digest the GPU lane's record is tied to; tests/test_families.py
#: holds them equal).
FLOAT_DTYPES: tuple[torch.dtype, ...] = tuple(FORMATS)
#: Their names ("fp16", "bf16", "fp32"), in the same order.
FLOAT_NAMES: tuple[str, ...] = tuple(BY_NAME)


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
        return bf16_bits_to_f32(bit_patterns(c).numpy()).astype(np.float64)
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
    bits = bit_patterns(t).numpy().astype(np.int64) & ((1 << fmt.bits) - 1)
    sign, mag = bits >> (fmt.bits - 1), bits & ((1 << (fmt.bits - 1)) - 1)
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


# ---- bit patterns ---------------------------------------------------------------------------------
# The one home of two facts the engine used to keep in several copies: how a float tensor's bits are
# read and compared (properties, the mutation probe, the suite), and how bf16 is encoded and rounded
# as bit patterns (the interpreter's exact bf16, `flashcheck.interpreter.exact`; the strategies'
# bf16 draws). kernels/ keeps its own Triton versions (device code, and frozen: its digest ties the
# GPU lane's record).

#: The signed integer of each float width: the view that exposes a float tensor's bits.
_BIT_VIEWS: dict[int, torch.dtype] = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def bit_patterns(t: torch.Tensor) -> torch.Tensor:
    """A float tensor's bit patterns as signed integers of its width, every bit kept (NaN payloads,
    the sign of zero): detached, contiguous, on the tensor's own device (`.cpu()` is the caller's)."""
    c = t.detach().contiguous()
    return c.view(_BIT_VIEWS[c.element_size()])


def same_bits(a: torch.Tensor, b: torch.Tensor, *, nan_payloads: bool = False) -> torch.Tensor:
    """Elementwise (as `==` broadcasts): a and b hold identical bit patterns, so +0 differs from -0.
    NaN: any NaN equals any NaN (payloads are not in a kernel's contract: torch, NumPy and GPUs
    disagree on them) unless `nan_payloads`, when a NaN equals only the very same bits (sign and
    payload: a determinism or sentinel check). Computed where a and b live (one device); shapes
    and dtypes are the caller's to check."""
    eq = bit_patterns(a) == bit_patterns(b)
    return eq if nan_payloads else eq | (torch.isnan(a) & torch.isnan(b))


QNAN_BF16 = 0x7FC0  # torch's bf16 NaN; the hardware's canonical NaN differs, payloads are not compared


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bf16 bit patterns (16-bit integers, either sign) -> the fp32 values they encode, exactly (NaN
    payloads kept): bf16 is the top half of an fp32."""
    b = np.asarray(bits)
    return (b.astype(np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def f32_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """fp32 values -> bf16 bit patterns, rounded to nearest even as the hardware does: subnormals
    kept, overflow to inf, NaN to a quiet NaN.

    The same rounding as `f64_to_bf16_bits` (fp32 widens to fp64 exactly), done on the fp32 bits
    (add half a bf16 ulp less one, plus the kept part's last bit, and truncate): the interpreter
    rounds every bf16 result this way, three to six times faster than through `round_float64`.
    tests/test_rounding.py holds the two equal."""
    v = np.array(values, dtype=np.float32, copy=True)
    b = v.view(np.uint32)
    nan = np.isnan(v)
    b = np.where(nan, np.uint32(0), b)  # keeps the carry below out of the sign bit
    r = ((b + np.uint32(0x7FFF) + ((b >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype(np.uint16)
    return np.where(nan, np.uint16(QNAN_BF16), r)


def f64_to_bf16_bits(values: np.ndarray) -> np.ndarray:
    """fp64 values -> bf16 bit patterns, rounded once to nearest even (`round_float64` to BF16, whose
    results fp32 holds exactly, then their top half); NaN to a quiet NaN."""
    x = np.array(values, dtype=np.float64, copy=True)
    bits = (round_float64(x, BF16).astype(np.float32).view(np.uint32) >> np.uint32(16)).astype(np.uint16)
    return np.where(np.isnan(x), np.uint16(QNAN_BF16), bits)

"""Bit-pattern helpers of the self-tests that hold conversions to torch's bit for bit
(`test_interpreter.py`: the interpreter's casts; `test_bf16_bits.py`: the kernels' bf16 emulation)."""
from __future__ import annotations

import numpy as np
import torch

ALL16 = torch.arange(-(1 << 15), 1 << 15, dtype=torch.int32).to(torch.int16)  # every 16-bit pattern


def bits_of(t: torch.Tensor) -> np.ndarray:
    """Unsigned bit patterns of a 16- or 32-bit tensor."""
    ints = {2: (torch.int16, np.uint16), 4: (torch.int32, np.uint32)}[t.element_size()]
    return t.contiguous().view(ints[0]).numpy().view(ints[1])


def f32_rounding_cases(bits16: int = 16) -> torch.Tensor:
    """fp32 values that decide a rounding to a 16-bit format with the same exponent as fp32 (bf16):
    every bf16 value, the midpoint to its upper neighbour, and one fp32 ulp below and above it, plus
    fp32 subnormals, the overflow boundary and NaN payloads."""
    p = np.arange(1 << 16, dtype=np.uint32) << np.uint32(32 - bits16)
    half = np.uint32(1 << (31 - bits16))
    cases = [p, p + half, p + half - np.uint32(1), p + half + np.uint32(1), p + np.uint32(1)]
    special = np.array([
        0x00000001, 0x80000001, 0x00007FFF, 0x00008000, 0x00008001, 0x00018000, 0x007FFFFF, 0x00800000,
        0x7F7F7FFF, 0x7F7F8000, 0x7F7FFFFF, 0xFF7F8000, 0x7F800000, 0xFF800000, 0x00000000, 0x80000000,
        0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FFFFFFF, 0xFF800001, 0xFFC12345,  # NaNs, signalling and quiet
    ], dtype=np.uint32)
    return torch.from_numpy(np.concatenate(cases + [special]).view(np.float32).copy())


def assert_same_bits(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    """Bit for bit, except NaN payloads (torch, NumPy and GPUs disagree on them): a NaN must give
    a NaN, and a conversion to a narrower format must give a quiet one."""
    g, w = bits_of(got), bits_of(want)
    nan_w, nan_g = torch.isnan(want).numpy(), torch.isnan(got).numpy()
    bad = (g != w) & ~(nan_w & nan_g)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} differ; first at {i}: "
                             f"got 0x{int(g[i]):x}, want 0x{int(w[i]):x}")


def assert_quiet_nans(got: torch.Tensor, what: str) -> None:
    quiet = {torch.bfloat16: 1 << 6, torch.float16: 1 << 9}[got.dtype]
    g = bits_of(got)[torch.isnan(got).numpy()]
    assert g.size and ((g & quiet) != 0).all(), f"{what}: signalling NaN out: {[hex(int(v)) for v in g[(g & quiet) == 0][:4]]}"

"""Helpers shared by the Triton kernels: exact 16-bit float I/O and input validation."""
from __future__ import annotations

import torch

from ._runtime import DEVICE, INTERPRET, check_device, tl, triton

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
LOG2E = 1.4426950408889634


def bf16_as_bits(dtype: torch.dtype) -> bool:
    """True when bf16 data must move as raw bits: the interpreter's bf16 casts are wrong
    (fp32 -> bf16 truncates; subnormals are mangled), NUMERICS.md section 6."""
    return INTERPRET and dtype == torch.bfloat16


def kernel_view(t: torch.Tensor) -> torch.Tensor:
    """The tensor a kernel is handed: bf16 as int16 bits under the interpreter, else itself."""
    return t.view(torch.int16) if bf16_as_bits(t.dtype) else t


@triton.jit
def load_f32(ptrs, mask, BF16_BITS: tl.constexpr):
    """Load as fp32; padding lanes read -inf. BF16_BITS: ptrs hold bf16 as int16 bits."""
    if BF16_BITS:
        u = tl.load(ptrs, mask=mask, other=-128)  # 0xFF80, bf16 -inf
        return (u.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptrs, mask=mask, other=float("-inf")).to(tl.float32)


@triton.jit
def load_f32_zero(ptrs, mask, BF16_BITS: tl.constexpr):
    """Load as fp32; padding lanes read +0."""
    if BF16_BITS:
        u = tl.load(ptrs, mask=mask, other=0)
        return (u.to(tl.int32) << 16).to(tl.float32, bitcast=True)
    else:
        return tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)


@triton.jit
def store_f32(ptrs, y, mask, BF16_BITS: tl.constexpr):
    """Store fp32 values rounded to nearest-even in the pointee dtype.

    BF16_BITS: ptrs are int16 holding bf16; round by adding 0x7FFF plus the lowest kept bit,
    as the hardware does, and keep NaN quiet."""
    if BF16_BITS:
        b = y.to(tl.uint32, bitcast=True)
        r = (b + 0x7FFF + ((b >> 16) & 1)) >> 16
        r = tl.where(y != y, (b >> 16) | 0x40, r)
        tl.store(ptrs, r.to(tl.int16), mask=mask)
    else:
        tl.store(ptrs, y.to(ptrs.dtype.element_ty), mask=mask)


def check_float(name: str, t: torch.Tensor) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; supported: float16, bfloat16, float32")
    check_device(name, t)


def check_out(out: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, *inputs: torch.Tensor) -> None:
    """`out` must have the right shape, dtype, device and must not overlap any input."""
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"out has dtype {out.dtype}, expected {dtype}")
    check_device("out", out)
    for t in inputs:
        if out.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
            raise ValueError("out shares storage with an input; inputs are never modified")


__all__ = [
    "DEVICE", "INTERPRET", "LOG2E", "FLOAT_DTYPES", "bf16_as_bits", "kernel_view",
    "load_f32", "load_f32_zero", "store_f32", "check_float", "check_out", "tl", "triton",
]

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


def by16(*values: int) -> tuple[list[int], int]:
    """Sizes and strides for a kernel that takes them unspecialised (`do_not_specialize`) with a
    constexpr multiplier MUL: `(values // 16, 16)` when every value is a multiple of 16 that fits
    int32, else `(values, 1)`. The kernel multiplies back (`v * MUL`), so Triton's alignment
    analysis still sees the factor 16 that 16-byte loads need, while every other shape and layout
    shares one compiled binary instead of one per divisibility pattern."""
    mul = 16 if all(v % 16 == 0 and abs(v) < 2**31 for v in values) else 1
    return [v // mul for v in values], mul


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


def check_tensor(name: str, t: object) -> None:
    """A plain dense tensor with data, where the kernels run, that needs no gradient: anything
    else would be read as raw memory (sparse, quantized), has no data (meta) or would silently
    lose its autograd graph (backward is not implemented)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, not {type(t).__name__}")
    if t.layout != torch.strided:
        raise ValueError(f"{name} has layout {t.layout}; only dense (strided) tensors are supported")
    if t.is_quantized:
        raise TypeError(f"{name} is a quantized tensor ({t.dtype}); supported: float16, bfloat16, float32")
    if t.is_meta:
        raise ValueError(f"{name} is a meta tensor (no data)")
    check_device(name, t)
    if t.requires_grad and torch.is_grad_enabled():
        raise ValueError(f"{name} requires grad, but backward is not implemented "
                         "(detach it, or call under torch.no_grad())")


def check_float(name: str, t: torch.Tensor) -> None:
    check_tensor(name, t)
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{name} has dtype {t.dtype}; supported: float16, bfloat16, float32")


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """[start, end) of the memory behind t's whole storage: views of one buffer through two
    storage objects (from_numpy twice, frombuffer, set_) overlap here, not by identity."""
    start = t.untyped_storage().data_ptr()
    return start, start + t.untyped_storage().nbytes()


def has_internal_overlap(t: torch.Tensor) -> bool:
    """Whether two elements of t may share memory: a stride 0, or strides too small for the
    sizes below them (dims sorted by stride; each must clear everything under it)."""
    reach = 0
    for stride, size in sorted((st, n) for st, n in zip(t.stride(), t.shape) if n > 1):
        if stride <= reach:
            return True
        reach += stride * (size - 1)
    return False


def check_out(out: torch.Tensor, shape: tuple[int, ...], dtype: torch.dtype, *inputs: torch.Tensor) -> None:
    """`out` must be a dense tensor of the right shape, dtype and device whose elements are
    distinct (gaps allowed: a strided view) and share no memory with any input."""
    check_tensor("out", out)
    if tuple(out.shape) != tuple(shape):
        raise ValueError(f"out has shape {tuple(out.shape)}, expected {tuple(shape)}")
    if out.dtype != dtype:
        raise TypeError(f"out has dtype {out.dtype}, expected {dtype}")
    if has_internal_overlap(out):
        raise ValueError(f"out has overlapping elements (stride {out.stride()} for shape {tuple(out.shape)})")
    o0, o1 = _byte_span(out)
    for t in inputs:
        i0, i1 = _byte_span(t)
        if o0 < i1 and i0 < o1:
            raise ValueError("out shares memory with an input; inputs are never modified")


def check_knob(name: str, v: object, *, lo: int = 1, pow2: bool = False) -> None:
    """A launch knob: None (the default) or an int >= lo, a power of two where the kernel's
    block shapes need one."""
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int or None, not {type(v).__name__}")
    if v < lo or (pow2 and v & (v - 1)):
        raise ValueError(f"{name} must be {'a power of two ' if pow2 else 'an int '}>= {lo}, got {v}")


__all__ = [
    "DEVICE", "INTERPRET", "LOG2E", "FLOAT_DTYPES", "bf16_as_bits", "kernel_view",
    "load_f32", "load_f32_zero", "store_f32", "check_tensor", "check_float", "check_out", "check_knob",
    "has_internal_overlap", "tl", "triton",
]

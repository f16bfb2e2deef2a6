"""Softmax over the last dim of a 2-D tensor, in Triton.

Semantics (NUMERICS.md section 2) come from the plain formula evaluated in fp32 with padding
lanes read as -inf: a NaN or +inf anywhere makes the row's sum NaN, so every output is NaN; an
all -inf row gives -inf - -inf = NaN everywhere, as torch does; -inf entries give exp(-inf) = 0.
The max is taken without NaN propagation (tl.max), which is fine because the sum propagates it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._common import (
    DEVICE, LOG2E, bf16_as_bits, check_float, check_out, kernel_view, load_f32, store_f32, tl, triton,
)

# --------------------------------------------------------------------------------------------
# Row variant: each program holds ROWS whole rows in registers.
# --------------------------------------------------------------------------------------------

ROW_MAX_N = 32768


@triton.jit
def _softmax_row_kernel(
    x_ptr, y_ptr, M, N, sxm, sxn, sym, syn,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, X_BITS: tl.constexpr, Y_BITS: tl.constexpr,
):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    cols64 = cols.to(tl.int64)[None, :]
    x = load_f32(x_ptr + rows64 * sxm + cols64 * sxn, mask, X_BITS)
    m = tl.max(x, axis=1)
    e = tl.exp2((x - m[:, None]) * LOG2E)
    y = e / tl.sum(e, axis=1)[:, None]
    store_f32(y_ptr + rows64 * sym + cols64 * syn, y, mask, Y_BITS)


@dataclass(frozen=True)
class RowConfig:
    block_n: int
    rows: int
    num_warps: int


def row_config(m: int, n: int, *, rows_per_program: int | None = None, num_warps: int | None = None,
               block_n: int | None = None) -> RowConfig:
    """Block sizes for the row kernel: short rows share a program so each moves about 4K elements.

    block_n is a minimum (a power of two); wider blocks only add masked lanes."""
    bn = max(triton.next_power_of_2(n), triton.next_power_of_2(block_n or 1))
    rows = rows_per_program or max(1, min(16, 4096 // bn, triton.next_power_of_2(m)))
    warps = num_warps or max(1, min(16, bn * rows // 512))
    return RowConfig(bn, rows, warps)


def _check_softmax_input(x: torch.Tensor, out_dtype: torch.dtype | None) -> torch.dtype:
    check_float("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, N), got {x.dim()}-D with shape {tuple(x.shape)}")
    od = x.dtype if out_dtype is None else out_dtype
    if od not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"out_dtype {od} is not supported; use float16, bfloat16 or float32")
    return od


def _prepare(x: torch.Tensor, out_dtype: torch.dtype | None, out: torch.Tensor | None) -> torch.Tensor:
    od = _check_softmax_input(x, out_dtype)
    if out is None:
        return torch.empty(x.shape, dtype=od, device=x.device)
    check_out(out, tuple(x.shape), od, x)
    return out


def softmax_row(
    x: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    rows_per_program: int | None = None,
    num_warps: int | None = None,
    block_n: int | None = None,
) -> torch.Tensor:
    """Softmax of each row held whole in registers; N up to ROW_MAX_N."""
    y = _prepare(x, out_dtype, out)
    m, n = x.shape
    if n > ROW_MAX_N:
        raise ValueError(f"N={n} is too long for the row kernel (at most {ROW_MAX_N}); use softmax()")
    if x.numel() == 0:
        return y
    cfg = row_config(m, n, rows_per_program=rows_per_program, num_warps=num_warps, block_n=block_n)
    xk, yk = kernel_view(x), kernel_view(y)
    _softmax_row_kernel[(triton.cdiv(m, cfg.rows),)](
        xk, yk, m, n, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
        BLOCK_N=cfg.block_n, ROWS=cfg.rows, X_BITS=bf16_as_bits(x.dtype), Y_BITS=bf16_as_bits(y.dtype),
        num_warps=cfg.num_warps,
    )
    return y


def softmax(x: torch.Tensor, *, out_dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dim of a 2-D fp16/bf16/fp32 tensor (any strides), fp32 inside."""
    return softmax_row(x, out_dtype=out_dtype, out=out)


__all__ = ["softmax", "softmax_row", "ROW_MAX_N", "DEVICE"]

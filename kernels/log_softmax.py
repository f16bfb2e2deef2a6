"""Log-softmax over the last dim of a 2-D tensor, in Triton, and its backward (issue 52).

Forward y_i = (x_i - m) - L, L = fl(ln 2) log2(s), s = sum_j exp2((x_j - m) log2 e), fp32 inside and one
rounding on the store. (x_i - m) - L rather than x_i - (m + L): the difference x_i - m is exact near
the max, and no rounding of m + L (3u |m| absolute, a thousand fp32 ulps of a row of [1000, 1000.5])
enters (docs/NUMERICS.md 9.6). The sum is softmax's, bit for bit in the same blocking: the row form
holds whole rows (`tl.sum`), the online form folds chunks with softmax's per-lane (max, sum) and its
fixed trees (kernels/softmax.py), so the rounding depths are kernels/softmax_depth.py's.

Special rows follow the formula: a NaN or +inf makes the sum NaN, hence the row; an all -inf row gives
-inf - -inf = NaN; a -inf entry of another row gives -inf; a row with one finite entry gives +0 there.

Backward dx = dy - exp(logp) sum_j dy_j (torch's formula on the forward's output) runs on the kernels of
kernels/softmax_backward.py in log mode. Both are differentiable through autograd when x requires grad.
"""
from __future__ import annotations

import sys

import torch

from ._autograd import differentiable
from ._runtime import cdiv, launch, on_input_device, settle_cache_keys
from ._common import bf16_as_bits, by16, check_float, check_knob, kernel_view, load_f32, store_f32, tl, triton
from .softmax import (
    DISPATCH_ROW_MAX_N, DISPATCH_ROW_MAX_N_16BIT, _group_fold, _lanes_total, dispatch_row_max_n, group_meta,
    online_config, row_config, row_max_n,
)
from .softmax_backward import backward_chunked, backward_depth, backward_dispatch, backward_row, backward_split
from .softmax_depth import online_depth, row_depth

_LOG2E = tl.constexpr(1.4426950408889634)
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit(do_not_specialize=["M", "N", "sxm"], do_not_specialize_on_alignment=["sxn"])
def _log_softmax_row_kernel(x_ptr, y_ptr, M, N, sxm, sxn, BLOCK_N: tl.constexpr, ROWS: tl.constexpr,
                            X_BITS: tl.constexpr, MUL: tl.constexpr, RELOAD: tl.constexpr):
    N, sxm = N * MUL, sxm * MUL
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    c64 = cols.to(tl.int64)[None, :]
    x = load_f32(x_ptr + r64 * sxm + c64 * sxn, mask, X_BITS)
    m = tl.max(x, axis=1)[:, None]
    s = tl.sum(tl.exp2((x - m) * _LOG2E), axis=1)[:, None]
    if RELOAD:  # softmax_row's second read for 16-bit rows too wide to hold: the same bits
        tl.debug_barrier()
        x = load_f32(x_ptr + r64 * sxm + c64 * sxn, mask, X_BITS)
    store_f32(y_ptr + r64 * N + c64, (x - m) - tl.log2(s) * _LN2, mask, X_BITS)


@triton.jit(do_not_specialize=["N", "sxm"], do_not_specialize_on_alignment=["sxn"])
def _log_softmax_online_kernel(x_ptr, y_ptr, N, sxm, sxn, BLOCK: tl.constexpr, X_BITS: tl.constexpr,
                               MUL: tl.constexpr, G: tl.constexpr, LOG2G: tl.constexpr, LOG2L: tl.constexpr):
    N, sxm = N * MUL, sxm * MUL
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * sxm
    offs = (tl.arange(0, BLOCK // G)[:, None] * G + tl.arange(0, G)[None, :]).to(tl.int64)
    m = tl.full([BLOCK // G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK // G], dtype=tl.float32)
    n_chunks = tl.cdiv(N, BLOCK)
    x_next = load_f32(x_row + offs * sxn, offs < N, X_BITS)
    for k in range(0, n_chunks):  # softmax_online's first pass: the same (max, sum), the same bits
        x = x_next
        cols = tl.cast(k + 1, tl.int64) * BLOCK + offs
        x_next = load_f32(x_row + cols * sxn, cols < N, X_BITS)
        m, l = _group_fold(m, l, x, BLOCK // G, G, LOG2G)
    mx, s = _lanes_total(m, l, BLOCK // G, LOG2L)
    lse_part = tl.log2(s) * _LN2
    lanes = tl.arange(0, BLOCK)
    for k in range(0, n_chunks):  # last chunk first: the likeliest to be in L2
        cols = tl.cast(n_chunks - 1 - k, tl.int64) * BLOCK + lanes
        mask = cols < N
        x = load_f32(x_row + cols * sxn, mask, X_BITS)
        store_f32(y_ptr + row * N + cols, (x - mx) - lse_part, mask, X_BITS)


def _check_x(x: torch.Tensor) -> None:
    check_float("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, N), got {x.dim()}-D with shape {tuple(x.shape)}")


def _differentiable(fn):
    return differentiable(fn, lambda: log_softmax_backward)


@_differentiable
@on_input_device
def log_softmax_row(x: torch.Tensor, *, rows_per_program: int | None = None, num_warps: int | None = None,
                    block_n: int | None = None) -> torch.Tensor:
    """Log-softmax of rows held whole in registers; N up to row_max_n(dtype)."""
    check_knob("rows_per_program", rows_per_program, pow2=True)
    check_knob("num_warps", num_warps, pow2=True)
    check_knob("block_n", block_n)
    _check_x(x)
    m, n = x.shape
    if n > row_max_n(x.dtype):
        raise ValueError(f"N={n} is too long for the row kernel with {x.dtype} input (at most "
                         f"{row_max_n(x.dtype)}); use log_softmax()")
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    cfg = row_config(m, n, rows_per_program=rows_per_program, num_warps=num_warps, block_n=block_n)
    (n_, sxm), mul = by16(n, x.stride(0))
    launch(_log_softmax_row_kernel, (cdiv(m, cfg.rows),), (kernel_view(x), kernel_view(y), m, n_, sxm, x.stride(1)),
           dict(BLOCK_N=cfg.block_n, ROWS=cfg.rows, X_BITS=bf16_as_bits(x.dtype), MUL=mul, RELOAD=cfg.reload,
                num_warps=cfg.num_warps))
    return y


@_differentiable
@on_input_device
def log_softmax_online(x: torch.Tensor, *, block_n: int | None = None, num_warps: int | None = None) -> torch.Tensor:
    """Streaming log-softmax: one program a row folds chunks of block_n into an online (max, sum)
    (softmax_online's), then writes (x - max) - log(sum) in a second pass. Any N."""
    check_knob("block_n", block_n, lo=2, pow2=True)
    check_knob("num_warps", num_warps, pow2=True)
    _check_x(x)
    m, n = x.shape
    cfg = online_config(n, x.dtype, block_n=block_n, num_warps=num_warps)
    y = torch.empty((m, n), dtype=x.dtype, device=x.device)
    if y.numel() == 0:
        return y
    (n_, sxm), mul = by16(n, x.stride(0))
    # softmax_online's compile options: no multiply-add contraction, so the bits are its own.
    launch(_log_softmax_online_kernel, (m,), (kernel_view(x), kernel_view(y), n_, sxm, x.stride(1)),
           dict(BLOCK=cfg.block, X_BITS=bf16_as_bits(x.dtype), MUL=mul, **group_meta(cfg.block, cfg.group),
                num_warps=cfg.num_warps, enable_fp_fusion=False))
    return y


def choose_log_softmax_variant(m: int, n: int, dtype: torch.dtype) -> str:
    """'row' for rows the forward's dispatcher holds in registers, else 'online'."""
    return "row" if n <= dispatch_row_max_n(dtype) else "online"


@_differentiable
def log_softmax(x: torch.Tensor) -> torch.Tensor:
    """Log-softmax over the last dim of a 2-D fp16/bf16/fp32 tensor (any strides), fp32 inside, output
    contiguous in x's dtype; differentiable when x requires grad. The row form for rows the forward
    softmax holds in registers, else the online form."""
    _check_x(x)
    m, n = x.shape
    return {"row": log_softmax_row, "online": log_softmax_online}[choose_log_softmax_variant(m, n, x.dtype)](x)


def log_softmax_depth(n: int, variant: str | None = None, **knobs) -> int:
    """The rounding depth D of the forward's sum (softmax's: kernels/softmax_depth.py), for the
    dispatcher's worst variant when `variant` is None."""
    if variant == "row":
        return row_depth(n, **knobs)
    if variant == "online":
        return online_depth(n, **knobs)
    d = row_depth(n) if n <= max(DISPATCH_ROW_MAX_N, DISPATCH_ROW_MAX_N_16BIT) else 1
    return max(d, online_depth(n)) if n > min(DISPATCH_ROW_MAX_N, DISPATCH_ROW_MAX_N_16BIT) else d


# ---- backward ------------------------------------------------------------------------------

@on_input_device
def log_softmax_backward_row(logp: torch.Tensor, dy: torch.Tensor, *, rows_per_program: int | None = None,
                             num_warps: int | None = None, block_n: int | None = None) -> torch.Tensor:
    """dx = dy - exp(logp) sum dy, whole rows in registers; N up to the forward's row_max_n(dtype)."""
    return backward_row(logp, dy, log=True, name="logp", rows_per_program=rows_per_program,
                        num_warps=num_warps, block_n=block_n)


@on_input_device
def log_softmax_backward_chunked(logp: torch.Tensor, dy: torch.Tensor, *, block_n: int | None = None,
                                 num_warps: int | None = None) -> torch.Tensor:
    """One program a row: sum dy in chunks of block_n, then a second pass writes dx. Any N."""
    return backward_chunked(logp, dy, log=True, name="logp", block_n=block_n, num_warps=num_warps)


@on_input_device
def log_softmax_backward_split(logp: torch.Tensor, dy: torch.Tensor, *, block_n: int | None = None,
                               chunks_per_block: int | None = None, merge_block: int | None = None,
                               num_warps: int | None = None) -> torch.Tensor:
    """Many programs a row: partial sums of spans, then each program merges its row's and writes."""
    return backward_split(logp, dy, log=True, name="logp", block_n=block_n, chunks_per_block=chunks_per_block,
                          merge_block=merge_block, num_warps=num_warps)


@on_input_device
def log_softmax_backward(logp: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """Gradient of log_softmax from its output logp and the output's gradient dy: dx = dy - exp(logp)
    sum_j dy_j. 2-D, one shape and float dtype, any strides; dx contiguous in that dtype."""
    return backward_dispatch(logp, dy, log=True, name="logp")


def log_softmax_backward_depth(n: int, variant: str | None = None, **knobs) -> int:
    """The rounding depth of the backward's sum of dy (NUMERICS.md 9.6)."""
    return backward_depth(n, variant, **knobs)


__all__ = ["log_softmax", "log_softmax_row", "log_softmax_online", "log_softmax_backward",
           "log_softmax_backward_row", "log_softmax_backward_chunked", "log_softmax_backward_split",
           "choose_log_softmax_variant", "log_softmax_depth", "log_softmax_backward_depth"]

settle_cache_keys(sys.modules[__name__])  # as kernels/softmax_backward.py

"""Softmax backward in Triton: dx = y (dy - sum_j y_j dy_j) over the last dim of 2-D tensors, and the
kernels log-softmax backward shares (`LOG=True`: dx = dy - exp(logp) sum_j dy_j, kernels/log_softmax.py).

Three forms, as the forward's (kernels/softmax.py), chosen by `choose_backward_variant`:

* row: ROWS whole rows a program, one `tl.sum`; rows up to the forward's ROW_MAX_N. Past
  ROW_HOLD_N columns the inputs are read a second time for the output instead of being held;
* chunked: one program a row, per-lane fp32 accumulators over chunks of BLOCK, a fixed pairwise tree
  (`softmax._tree_sum`), then a second pass writes dx (last chunk first: the likeliest in L2);
* split: spans of ITERS chunks each give a partial sum (two launches: sums, then every program merges
  its row's partials and writes its span), for few long rows.

Arithmetic (fp32; docs/NUMERICS.md 9.6 bounds it): softmax mode sums fl(y_j dy_j) and writes
fl(y fl(dy/2 - s/2)) * 2 (the halving keeps |dy - s| <= 2 max|dy| from overflowing fp32 when dy is near
the format's max; by powers of two it is exact, and dy - s stays exact by Sterbenz when dy ~ s). Log mode
sums dy 2^-k, k > 0 only when max|dy| >= 2^64 (k makes the scaled row max < 2^65, so < 2^31 values cannot
overflow; bf16/fp32 dy near their max would), raising k online by exact powers of two, and writes
(dy 2^-k - exp2(logp log2 e) s) 2^k. Non-finite inputs give what the formula gives in IEEE arithmetic.

Inputs are read with their own strides (no copies); dx is a new contiguous tensor of the inputs' dtype.
"""
from __future__ import annotations

import sys
from dataclasses import replace

import torch

from ._runtime import cdiv, launch, on_input_device, settle_cache_keys
from ._common import (
    INTERPRET, bf16_as_bits, by16, check_float, check_knob, kernel_view, load_f32_zero, store_f32, tl, triton,
)
from .softmax import (
    DISPATCH_ROW_MAX_N, DISPATCH_ROW_MAX_N_16BIT, RowConfig, _tree_sum, chunk_warps, dispatch_row_max_n,
    online_config, row_config, row_max_n, sm_count, split_config,
)
from .softmax_depth import _log2c, row_depth

_LOG2E = tl.constexpr(1.4426950408889634)
# Biased fp32 exponent at and above which log mode scales dy down: max|dy| >= 2^(191 - 127) = 2^64.
_SAFE_EXP = tl.constexpr(191)


@triton.jit
def _pow2(k):
    """2^k as fp32 for int32 k in [-126, 127]: built from the exponent bits, exact."""
    return ((k + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _shift(top):
    """The scale exponent for values whose largest magnitude is `top` (>= 0, inf or NaN)."""
    return tl.maximum((top.to(tl.int32, bitcast=True) >> 23) - _SAFE_EXP, 0)


@triton.jit
def _out(a, dy, s, sh, LOG: tl.constexpr):
    """dx from a (y or logp), dy and the row's sum s (scaled by 2^-sh in log mode)."""
    if LOG:
        return (dy * _pow2(-sh) - tl.exp2(a * _LOG2E) * s) * _pow2(sh)
    else:
        return (a * (dy * 0.5 - s * 0.5)) * 2.0


@triton.jit(do_not_specialize=["M", "N", "sam", "sdm"], do_not_specialize_on_alignment=["san", "sdn"])
def _bwd_row_kernel(a_ptr, dy_ptr, dx_ptr, M, N, sam, san, sdm, sdn,
                    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, X_BITS: tl.constexpr, MUL: tl.constexpr,
                    RELOAD: tl.constexpr, LOG: tl.constexpr):
    N, sam, sdm = N * MUL, sam * MUL, sdm * MUL
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    r64 = rows.to(tl.int64)[:, None]
    c64 = cols.to(tl.int64)[None, :]
    a = load_f32_zero(a_ptr + r64 * sam + c64 * san, mask, X_BITS)
    dy = load_f32_zero(dy_ptr + r64 * sdm + c64 * sdn, mask, X_BITS)
    if LOG:
        sh = _shift(tl.max(tl.abs(dy), axis=1))[:, None]
        s = tl.sum(dy * _pow2(-sh), axis=1)[:, None]
    else:
        sh = tl.zeros([ROWS, 1], tl.int32)
        s = tl.sum(a * dy, axis=1)[:, None]
    if RELOAD:  # too wide to hold both inputs through the sum: read them again (L1/L2), as softmax_row
        tl.debug_barrier()
        a = load_f32_zero(a_ptr + r64 * sam + c64 * san, mask, X_BITS)
        dy = load_f32_zero(dy_ptr + r64 * sdm + c64 * sdn, mask, X_BITS)
    store_f32(dx_ptr + r64 * N + c64, _out(a, dy, s, sh, LOG), mask, X_BITS)


@triton.jit
def _span_sum(a_row, d_row, base, iters, N, san, sdn, BLOCK: tl.constexpr, X_BITS: tl.constexpr, LOG: tl.constexpr):
    """Per-lane sums over `iters` chunks from column `base`, and the scale exponent (log mode).
    The next chunk's loads are issued before the current chunk is added (two in flight)."""
    lanes = tl.arange(0, BLOCK).to(tl.int64)
    acc = tl.zeros([BLOCK], tl.float32)
    sh = tl.zeros([], tl.int32)
    cols = base + lanes
    d_next = load_f32_zero(d_row + cols * sdn, (cols < N) & (iters > 0), X_BITS)
    if not LOG:
        a_next = load_f32_zero(a_row + cols * san, (cols < N) & (iters > 0), X_BITS)
    for i in range(iters):
        dy = d_next
        cols = base + (i + 1) * BLOCK + lanes
        nxt = (cols < N) & (i + 1 < iters)
        d_next = load_f32_zero(d_row + cols * sdn, nxt, X_BITS)
        if LOG:
            new = tl.maximum(sh, _shift(tl.max(tl.abs(dy), axis=0)))
            acc = acc * _pow2(sh - new) + dy * _pow2(-new)  # exact rescale: the factor is a power of two
            sh = new
        else:
            a = a_next
            a_next = load_f32_zero(a_row + cols * san, nxt, X_BITS)
            acc += a * dy
    return acc, sh


@triton.jit
def _write_chunk(a_row, d_row, x_row, start, N, san, sdn, s, sh, BLOCK: tl.constexpr, X_BITS: tl.constexpr,
                 LOG: tl.constexpr):
    cols = start + tl.arange(0, BLOCK).to(tl.int64)
    mask = cols < N
    a = load_f32_zero(a_row + cols * san, mask, X_BITS)
    dy = load_f32_zero(d_row + cols * sdn, mask, X_BITS)
    store_f32(x_row + cols, _out(a, dy, s, sh, LOG), mask, X_BITS)


@triton.jit(do_not_specialize=["N", "sam", "sdm"], do_not_specialize_on_alignment=["san", "sdn"])
def _bwd_chunked_kernel(a_ptr, dy_ptr, dx_ptr, N, sam, san, sdm, sdn,
                        BLOCK: tl.constexpr, LOG2B: tl.constexpr, X_BITS: tl.constexpr, MUL: tl.constexpr,
                        LOG: tl.constexpr):
    N, sam, sdm = N * MUL, sam * MUL, sdm * MUL
    row = tl.program_id(0).to(tl.int64)
    a_row, d_row, x_row = a_ptr + row * sam, dy_ptr + row * sdm, dx_ptr + row * N
    n_chunks = tl.cdiv(N, BLOCK)
    acc, sh = _span_sum(a_row, d_row, tl.zeros([], tl.int64), n_chunks, N, san, sdn, BLOCK, X_BITS, LOG)
    s = _tree_sum(acc, BLOCK, LOG2B)
    for k in range(n_chunks):
        _write_chunk(a_row, d_row, x_row, tl.cast(n_chunks - 1 - k, tl.int64) * BLOCK, N, san, sdn, s, sh,
                     BLOCK, X_BITS, LOG)


@triton.jit(do_not_specialize=["N", "NB", "sam", "sdm"], do_not_specialize_on_alignment=["san", "sdn"])
def _bwd_split_sum_kernel(a_ptr, dy_ptr, ws, N, NB, sam, san, sdm, sdn,
                          BLOCK: tl.constexpr, LOG2B: tl.constexpr, ITERS: tl.constexpr, X_BITS: tl.constexpr,
                          MUL: tl.constexpr, LOG: tl.constexpr):
    N, sam, sdm = N * MUL, sam * MUL, sdm * MUL
    pid = tl.program_id(0).to(tl.int64)
    row = pid // NB
    acc, sh = _span_sum(a_ptr + row * sam, dy_ptr + row * sdm, (pid % NB) * (BLOCK * ITERS), ITERS, N, san, sdn,
                        BLOCK, X_BITS, LOG)
    tl.store(ws + pid, _tree_sum(acc, BLOCK, LOG2B))
    if LOG:
        tl.store(ws + tl.num_programs(0) + pid, sh.to(tl.float32))


@triton.jit
def _row_total(ws_s, ws_k, NB, MB: tl.constexpr, LOG2MB: tl.constexpr, LOG: tl.constexpr):
    """The row's sum from its NB partials (a loop MB lanes wide, then the tree), and in log mode the
    largest scale exponent, onto which every partial is brought (exactly: powers of two)."""
    lanes = tl.arange(0, MB)
    top = tl.zeros([], tl.int32)
    if LOG:
        kmax = tl.zeros([MB], tl.int32)
        for start in range(0, NB, MB):
            kmax = tl.maximum(kmax, tl.load(ws_k + start + lanes, mask=start + lanes < NB, other=0.0).to(tl.int32))
        top = tl.max(kmax, axis=0)
    acc = tl.zeros([MB], tl.float32)
    for start in range(0, NB, MB):
        mask = start + lanes < NB
        v = tl.load(ws_s + start + lanes, mask=mask, other=0.0)
        if LOG:
            v = v * _pow2(tl.load(ws_k + start + lanes, mask=mask, other=0.0).to(tl.int32) - top)
        acc += v
    return _tree_sum(acc, MB, LOG2MB), top


@triton.jit(do_not_specialize=["N", "NB", "sam", "sdm"], do_not_specialize_on_alignment=["san", "sdn"])
def _bwd_split_write_kernel(a_ptr, dy_ptr, dx_ptr, ws, N, NB, sam, san, sdm, sdn,
                            BLOCK: tl.constexpr, ITERS: tl.constexpr, MB: tl.constexpr, LOG2MB: tl.constexpr,
                            X_BITS: tl.constexpr, MUL: tl.constexpr, LOG: tl.constexpr):
    N, sam, sdm = N * MUL, sam * MUL, sdm * MUL
    # Last span first: the spans the sum pass read last are the likeliest to be in L2.
    pid = (tl.num_programs(0) - 1 - tl.program_id(0)).to(tl.int64)
    row = pid // NB
    base = (pid % NB) * (BLOCK * ITERS)
    s, sh = _row_total(ws + row * NB, ws + tl.num_programs(0) + row * NB, NB, MB, LOG2MB, LOG)
    for i in range(ITERS):
        _write_chunk(a_ptr + row * sam, dy_ptr + row * sdm, dx_ptr + row * N, base + (ITERS - 1 - i) * BLOCK, N,
                     san, sdn, s, sh, BLOCK, X_BITS, LOG)


# --------------------------------------------------------------------------------------------
# Launchers (shared by softmax_backward and log_softmax_backward: `log` picks the formula)
# --------------------------------------------------------------------------------------------

def check_pair(name: str, a: torch.Tensor, dy: torch.Tensor) -> None:
    """Both float tensors where the kernels run, 2-D, of one shape, dtype and device; one line each."""
    check_float(name, a)
    check_float("dy", dy)
    if a.dim() != 2:
        raise ValueError(f"{name} must be 2-D (M, N), got {a.dim()}-D with shape {tuple(a.shape)}")
    if tuple(dy.shape) != tuple(a.shape):
        raise ValueError(f"dy has shape {tuple(dy.shape)}, expected {name}'s {tuple(a.shape)}")
    if dy.dtype != a.dtype:
        raise TypeError(f"dy has dtype {dy.dtype}, expected {name}'s {a.dtype}")
    if dy.device != a.device:
        raise ValueError(f"dy is on {dy.device}, {name} on {a.device}")


def _args(a: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor) -> tuple[tuple, int]:
    (n, sam, sdm), mul = by16(a.shape[1], a.stride(0), dy.stride(0))
    return (kernel_view(a), kernel_view(dy), kernel_view(dx), n, sam, a.stride(1), sdm, dy.stride(1)), mul


# Two inputs held through the sum: compiled for sm_90 (reports/bench/kernel_resources.py's way, no GPU),
# 16 warps held 16384 columns of both in 82-91 registers and spilled at 32768 (128, the cap at 16 warps);
# read twice with 32 warps, 32768 took 36-58 registers and 65536 spilled 136-304 bytes. So the row form
# holds up to HOLD_N, reads twice up to DISPATCH_N, and the dispatcher sends longer rows to the chunked
# form. The interpreter reads twice past 256 columns, as the forward, so CPU tests take that path too.
HOLD_N = 256 if INTERPRET else 16384
DISPATCH_N = 512 if INTERPRET else 32768


def backward_row_config(m: int, n: int, *, rows_per_program=None, num_warps=None, block_n=None) -> RowConfig:
    """The forward's row blocking (kernels/softmax.py:row_config), reading twice past HOLD_N."""
    cfg = row_config(m, n, rows_per_program=rows_per_program, num_warps=num_warps, block_n=block_n)
    if cfg.block_n <= HOLD_N:
        return cfg
    return replace(cfg, reload=True, num_warps=num_warps or (cfg.num_warps if INTERPRET else 32))


def backward_row(a, dy, *, log: bool, name: str, rows_per_program=None, num_warps=None, block_n=None):
    check_knob("rows_per_program", rows_per_program, pow2=True)
    check_knob("num_warps", num_warps, pow2=True)
    check_knob("block_n", block_n)
    check_pair(name, a, dy)
    m, n = a.shape
    if n > row_max_n(a.dtype):
        raise ValueError(f"N={n} is too long for the row kernel with {a.dtype} input (at most "
                         f"{row_max_n(a.dtype)}); use the dispatcher")
    dx = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if dx.numel() == 0:
        return dx
    cfg = backward_row_config(m, n, rows_per_program=rows_per_program, num_warps=num_warps, block_n=block_n)
    (ak, dk, xk, n_, sam, san, sdm, sdn), mul = _args(a, dy, dx)
    launch(_bwd_row_kernel, (cdiv(m, cfg.rows),), (ak, dk, xk, m, n_, sam, san, sdm, sdn),
           dict(BLOCK_N=cfg.block_n, ROWS=cfg.rows, X_BITS=bf16_as_bits(a.dtype), MUL=mul, RELOAD=cfg.reload,
                LOG=log, num_warps=cfg.num_warps))
    return dx


def backward_chunked(a, dy, *, log: bool, name: str, block_n=None, num_warps=None):
    check_knob("block_n", block_n, lo=2, pow2=True)
    check_knob("num_warps", num_warps, pow2=True)
    check_pair(name, a, dy)
    m, n = a.shape
    block = online_config(n, a.dtype, block_n=block_n).block
    dx = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if dx.numel() == 0:
        return dx
    args, mul = _args(a, dy, dx)
    launch(_bwd_chunked_kernel, (m,), args,
           dict(BLOCK=block, LOG2B=block.bit_length() - 1, X_BITS=bf16_as_bits(a.dtype), MUL=mul, LOG=log,
                num_warps=num_warps or chunk_warps(block)))
    return dx


def backward_split(a, dy, *, log: bool, name: str, block_n=None, chunks_per_block=None, merge_block=None,
                   num_warps=None):
    for knob, v, lo, pow2 in (("block_n", block_n, 2, True), ("chunks_per_block", chunks_per_block, 1, False),
                              ("merge_block", merge_block, 2, True), ("num_warps", num_warps, 1, True)):
        check_knob(knob, v, lo=lo, pow2=pow2)
    check_pair(name, a, dy)
    m, n = a.shape
    cfg = split_config(n, a.dtype, block_n=block_n, chunks_per_block=chunks_per_block, merge_block=merge_block,
                       num_warps=num_warps)
    dx = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if dx.numel() == 0:
        return dx
    nb = cfg.n_blocks(n)
    ws = torch.empty(2 * m * nb, dtype=torch.float32, device=a.device)
    (ak, dk, xk, n_, sam, san, sdm, sdn), mul = _args(a, dy, dx)
    common = dict(BLOCK=cfg.block, ITERS=cfg.iters, X_BITS=bf16_as_bits(a.dtype), MUL=mul, LOG=log,
                  num_warps=cfg.num_warps)
    launch(_bwd_split_sum_kernel, (m * nb,), (ak, dk, ws, n_, nb, sam, san, sdm, sdn),
           dict(LOG2B=cfg.block.bit_length() - 1, **common))
    launch(_bwd_split_write_kernel, (m * nb,), (ak, dk, xk, ws, n_, nb, sam, san, sdm, sdn),
           dict(MB=cfg.merge_block, LOG2MB=cfg.merge_block.bit_length() - 1, **common))
    return dx


def choose_backward_variant(m: int, n: int, dtype: torch.dtype, sms: int) -> str:
    """'row' | 'chunked' | 'split': the forward dispatcher's thresholds (kernels/softmax.py), rows
    at most DISPATCH_N long for the row form."""
    if n <= min(dispatch_row_max_n(dtype), DISPATCH_N):
        return "row"
    if m < 2 * sms and n > split_config(n, dtype).span:
        return "split"
    return "chunked"


_VARIANTS = {"row": backward_row, "chunked": backward_chunked, "split": backward_split}


def backward_dispatch(a, dy, *, log: bool, name: str):
    check_pair(name, a, dy)
    m, n = a.shape
    return _VARIANTS[choose_backward_variant(m, n, a.dtype, sm_count(a.device))](a, dy, log=log, name=name)


def backward_depth(n: int, variant: str | None = None, **knobs) -> int:
    """The longest chain of fp32 roundings in a row's sum (the D of the bounds in NUMERICS.md 9.6): the
    dispatcher's worst variant for n when `variant` is None, else that variant at its knobs."""
    if variant is None:
        d = backward_depth(n, "row") if n <= min(max(DISPATCH_ROW_MAX_N, DISPATCH_ROW_MAX_N_16BIT), DISPATCH_N) else 1
        if n > min(DISPATCH_ROW_MAX_N, DISPATCH_ROW_MAX_N_16BIT, DISPATCH_N):
            d = max(d, backward_depth(n, "chunked"), backward_depth(n, "split"))
        return d
    if variant == "row":
        warps = backward_row_config(1, n, **knobs).num_warps
        return max(row_depth(n, **{**knobs, "num_warps": warps}), row_depth(n, **knobs))
    worst = 1
    for dt in (torch.float16, torch.float32):
        if variant == "chunked":
            b = online_config(n, dt, block_n=knobs.get("block_n")).block
            worst = max(worst, cdiv(max(n, 1), b) + _log2c(b))
        else:
            c = split_config(n, dt, **{k: v for k, v in knobs.items() if k != "num_warps"})
            worst = max(worst, min(c.iters, cdiv(max(n, 1), c.block)) + _log2c(c.block)
                        + cdiv(c.n_blocks(n), c.merge_block) + _log2c(c.merge_block))
    return worst


# --------------------------------------------------------------------------------------------
# Softmax backward
# --------------------------------------------------------------------------------------------

@on_input_device
def softmax_backward_row(y: torch.Tensor, dy: torch.Tensor, *, rows_per_program: int | None = None,
                         num_warps: int | None = None, block_n: int | None = None) -> torch.Tensor:
    """dx = y (dy - sum y dy), whole rows in registers; N up to the forward's row_max_n(dtype)."""
    return backward_row(y, dy, log=False, name="y", rows_per_program=rows_per_program, num_warps=num_warps,
                        block_n=block_n)


@on_input_device
def softmax_backward_chunked(y: torch.Tensor, dy: torch.Tensor, *, block_n: int | None = None,
                             num_warps: int | None = None) -> torch.Tensor:
    """One program a row: the dot in chunks of block_n, then a second pass writes dx. Any N."""
    return backward_chunked(y, dy, log=False, name="y", block_n=block_n, num_warps=num_warps)


@on_input_device
def softmax_backward_split(y: torch.Tensor, dy: torch.Tensor, *, block_n: int | None = None,
                           chunks_per_block: int | None = None, merge_block: int | None = None,
                           num_warps: int | None = None) -> torch.Tensor:
    """Many programs a row: partial dots of block_n * chunks_per_block columns, then each program
    merges its row's partials (merge_block lanes) and writes its span. Two launches."""
    return backward_split(y, dy, log=False, name="y", block_n=block_n, chunks_per_block=chunks_per_block,
                          merge_block=merge_block, num_warps=num_warps)


@on_input_device
def softmax_backward(y: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """Gradient of softmax over the last dim from its output y and the output's gradient dy: dx =
    y (dy - sum_j y_j dy_j). y, dy: 2-D, one shape and float dtype (fp16/bf16/fp32), any strides;
    dx is contiguous in that dtype. Picks the row, chunked or split form as the forward does."""
    return backward_dispatch(y, dy, log=False, name="y")


__all__ = ["softmax_backward", "softmax_backward_row", "softmax_backward_chunked", "softmax_backward_split",
           "choose_backward_variant", "backward_depth"]

# Cache keys settled at import, helpers first (kernels/_runtime.py:settle_cache_keys): this module is
# imported after the package has settled the softmax helpers it calls.
settle_cache_keys(sys.modules[__name__])

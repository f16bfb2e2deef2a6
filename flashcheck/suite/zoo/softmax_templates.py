"""The templates of the known-bad softmax kernels (softmax_bugs.py): small Triton kernels in the
style real softmax kernels use, each with a `BUG` constexpr that switches exactly one defect on
(BUG = 0 is the correct kernel, the "fixed twin"), and their launchers.

* `_row_kernel`: one program per row, the row in registers (BLOCK_N = next power of two >= 256).
* `_online_kernel`: one program per row, a running (max, sum) over chunks of BLOCK (256, 512).
* `_split_*_kernel`: split-row, a (max, sum) per span of 256, a merge per row, a normalize pass.
* `_chunked_sum_kernel`: results that depend on the launch configuration; `_out_view`: an `out=`
  view whose strides may be ignored.
"""
from __future__ import annotations

import torch

from flashcheck import kernels  # noqa: F401  (the interpreter switch, before triton)
from flashcheck.kernels._common import LOG2E, bf16_as_bits, check_float, check_out, kernel_view, load_f32, store_f32, tl, triton
from flashcheck.kernels.attention import _round_bf16_in_f32

_LOG2E = tl.constexpr(LOG2E)

# Bug switches (constexpr values).
NONE, STRIDES, ZERO_PAD, SENTINEL, NAN_SWALLOW, NO_MAX, INT32_OFFSETS, FAST_EXP = 0, 1, 2, 3, 4, 5, 6, 7
EXP_CLAMP, EXP_CLAMP_NAN = 8, 9
RESCALE_NAN, STICKY, NO_RESCALE, FP16_SUM, TAIL = 11, 12, 13, 14, 15
READ_PAST, WRITE_PAST, ROUND_EXP = 16, 17, 18
MERGE_NAN, LAST_SPAN_MERGES = 21, 22

# Sizes and row strides are not specialised (do_not_specialize): on a GPU the suite run against one
# zoo kernel draws hundreds of lengths, and a binary per length (a second each) made a single
# catch take longer than the 15-minute run limit. The bugs do not depend on specialisation.


def _validate(x: torch.Tensor) -> None:
    check_float("x", x)
    if x.dim() != 2:
        raise ValueError(f"x must be 2-D (M, N), got shape {tuple(x.shape)}")


def _output(x: torch.Tensor) -> torch.Tensor:
    """A validated `x`'s dense output buffer."""
    _validate(x)
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# --------------------------------------------------------------------------------------------
# Row kernel
# --------------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["N", "sxm", "sym"])
def _row_kernel(x_ptr, y_ptr, N, sxm, sxn, sym, syn,
                BLOCK_N: tl.constexpr, X_BITS: tl.constexpr, Y_BITS: tl.constexpr, BUG: tl.constexpr,
                P16: tl.constexpr = 0):
    row = tl.program_id(0).to(tl.int64)
    x_off = row * sxm
    y_off = row * sym
    if BUG == 6:  # INT32_OFFSETS: the row offsets wrap at 2^31 elements (kept non-negative, so the
        # wrapped access reads and writes a wrong row in bounds instead of faulting)
        x_off = x_off % 2147483648
        y_off = y_off % 2147483648
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    ld_mask = mask
    if BUG == 16:  # READ_PAST: the load mask off by one (cols <= N): one element past each row
        ld_mask = cols <= N
    if BUG == 1:  # STRIDES: offsets as if x were contiguous
        x = load_f32(x_ptr + row * N + cols, mask, X_BITS)
    else:
        x = load_f32(x_ptr + x_off + cols * sxn, ld_mask, X_BITS)
    if BUG == 2:  # ZERO_PAD: padding lanes hold 0 instead of -inf
        x = tl.where(mask, x, 0.0)
    if BUG == 3:  # SENTINEL: -inf (inputs and padding) replaced by a finite -5e4
        x = tl.where(x == float("-inf"), -5.0e4, x)
    if BUG == 4:  # NAN_SWALLOW: a NaN-dropping max and a where that masks NaN out
        x = tl.where(x != x, float("-inf"), x)
    if BUG == 5:  # NO_MAX: exp(x) / sum exp(x)
        e = tl.exp2(x * _LOG2E)
    elif BUG == 7:  # FAST_EXP: the hardware's half-precision ex2.approx.f16, for every dtype and argument
        t = ((x - tl.max(x, axis=0)) * _LOG2E).to(tl.float16)
        e = tl.inline_asm_elementwise("ex2.approx.f16 $0, $1;", "=h,h", [t], dtype=tl.float16, is_pure=True,
                                      pack=1).to(tl.float32)
    elif BUG == 8:  # EXP_CLAMP: the exponent clamped with a NaN-dropping max (the GPU's maxnum)
        e = tl.exp2(tl.maximum((x - tl.max(x, axis=0)) * _LOG2E, -200.0))
    elif BUG == 9:  # the same clamp, NaN propagated (the fixed twin)
        e = tl.exp2(tl.maximum((x - tl.max(x, axis=0)) * _LOG2E, -200.0, propagate_nan=tl.PropagateNan.ALL))
    else:
        m = tl.max(x, axis=0)
        e = tl.exp2((x - m) * _LOG2E)
    if BUG == 18:  # ROUND_EXP: each exponential rounded to the 16-bit input format (P16: 1 fp16, 2 bf16)
        if P16 == 1:
            e = e.to(tl.float16).to(tl.float32)
        elif P16 == 2:  # exact round-to-nearest-even (the interpreter's bf16 cast truncates)
            e = _round_bf16_in_f32(e)
    y = e / tl.sum(e, axis=0)
    if BUG == 17:  # WRITE_PAST: the store mask off by one: lane N (a padding lane, y = 0) is written too
        mask = cols <= N
    store_f32(y_ptr + y_off + cols * syn, y, mask, Y_BITS)


_P16 = {torch.float16: 1, torch.bfloat16: 2}


def _row(x: torch.Tensor, bug: int) -> torch.Tensor:
    m, n = x.shape
    y = _output(x)
    if x.numel() == 0:
        return y
    _row_kernel[(m,)](kernel_view(x), kernel_view(y), n, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
                      BLOCK_N=max(256, triton.next_power_of_2(n)), X_BITS=bf16_as_bits(x.dtype),
                      Y_BITS=bf16_as_bits(y.dtype), BUG=bug, P16=_P16.get(x.dtype, 0))
    return y


# --------------------------------------------------------------------------------------------
# Online (streaming) kernel
# --------------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["N", "sxm", "sym"])
def _online_kernel(x_ptr, y_ptr, N, sxm, sxn, sym, syn,
                   BLOCK: tl.constexpr, X_BITS: tl.constexpr, Y_BITS: tl.constexpr, BUG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * sxm
    y_row = y_ptr + row * sym
    lanes = tl.arange(0, BLOCK)
    m = tl.max(tl.full([BLOCK], float("-inf"), tl.float32), axis=0)
    l = tl.sum(tl.zeros([BLOCK], tl.float32), axis=0)
    if BUG == 15:  # TAIL: only the full tiles
        n_iter = N // BLOCK
    else:
        n_iter = tl.cdiv(N, BLOCK)
    for k in range(0, n_iter):
        cols = k * BLOCK + lanes
        x = load_f32(x_row + cols * sxn, cols < N, X_BITS)
        m_new = tl.maximum(m, tl.max(x, axis=0))
        if BUG == 12:  # STICKY: "avoid -inf - -inf": a -inf max becomes 0, and stays
            m_new = tl.where(m_new == float("-inf"), 0.0, m_new)
        if BUG == 11:  # RESCALE_NAN: no guard, exp(-inf - -inf) = NaN on a masked block
            ref = m_new
        else:
            ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2((m - ref) * _LOG2E)
        psum = tl.sum(tl.exp2((x - ref) * _LOG2E), axis=0)
        if BUG == 13:  # NO_RESCALE: the old sum is not rescaled when the max grows
            l = l + psum
        else:
            l = l * alpha + psum
        if BUG == 14:  # FP16_SUM: the denominator accumulates in fp16
            l = l.to(tl.float16).to(tl.float32)
        m = m_new
    for k in range(0, n_iter):
        cols = k * BLOCK + lanes
        mask = cols < N
        x = load_f32(x_row + cols * sxn, mask, X_BITS)
        store_f32(y_row + cols * syn, tl.exp2((x - m) * _LOG2E) / l, mask, Y_BITS)


def _online(x: torch.Tensor, bug: int, block: int = 256) -> torch.Tensor:
    _validate(x)
    m, n = x.shape
    # zeros, not empty: what a dropped tail leaves behind stays the same from run to run
    y = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    if x.numel() == 0:
        return y
    _online_kernel[(m,)](kernel_view(x), kernel_view(y), n, x.stride(0), x.stride(1), y.stride(0), y.stride(1),
                         BLOCK=block, X_BITS=bf16_as_bits(x.dtype), Y_BITS=bf16_as_bits(y.dtype), BUG=bug)
    return y


# --------------------------------------------------------------------------------------------
# Split-row kernel
# --------------------------------------------------------------------------------------------

@triton.jit
def _span_stats(x_ptr, ws_m, ws_l, pid, N, NB, sxm, sxn, SPAN: tl.constexpr, X_BITS: tl.constexpr):
    """Store the (max, sum) of program pid's span (row pid // NB, span pid % NB)."""
    row = pid // NB
    cols = (pid % NB) * SPAN + tl.arange(0, SPAN)
    x = load_f32(x_ptr + row * sxm + cols * sxn, cols < N, X_BITS)
    mx = tl.max(x, axis=0)
    ref = tl.where(mx == float("-inf"), 0.0, mx)
    tl.store(ws_m + pid, mx)
    tl.store(ws_l + pid, tl.sum(tl.exp2((x - ref) * _LOG2E), axis=0))


@triton.jit(do_not_specialize=["N", "NB", "sxm"])
def _split_stats_kernel(x_ptr, ws_m, ws_l, N, NB, sxm, sxn, SPAN: tl.constexpr, X_BITS: tl.constexpr):
    _span_stats(x_ptr, ws_m, ws_l, tl.program_id(0).to(tl.int64), N, NB, sxm, sxn, SPAN, X_BITS)


@triton.jit
def _merge_row(ws_m, ws_l, row, NB, BUG: tl.constexpr):
    """The row's (max, sum) from its NB span partials (volatile loads: in the one-launch variant
    other programs wrote them)."""
    m = tl.max(tl.full([2], float("-inf"), tl.float32), axis=0)  # the empty state (-inf, 0)
    l = tl.sum(tl.zeros([2], tl.float32), axis=0)
    for j in range(0, NB):
        mi = tl.load(ws_m + row * NB + j, volatile=True)
        li = tl.load(ws_l + row * NB + j, volatile=True)
        m_new = tl.maximum(m, mi)
        if BUG == 21:  # MERGE_NAN: two empty states give exp(-inf - -inf) = NaN
            ref = m_new
        else:
            ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        l = l * tl.exp2((m - ref) * _LOG2E) + li * tl.exp2((mi - ref) * _LOG2E)
        m = m_new
    return m, l


@triton.jit(do_not_specialize=["NB"])
def _split_merge_kernel(ws_m, ws_l, row_m, row_l, NB, BUG: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    m, l = _merge_row(ws_m, ws_l, row, NB, BUG)
    tl.store(row_m + row, m)
    tl.store(row_l + row, l)


@triton.jit(do_not_specialize=["N", "NB", "sxm", "sym"])
def _split_normalize_kernel(x_ptr, y_ptr, row_m, row_l, N, NB, sxm, sxn, sym, syn,
                            SPAN: tl.constexpr, X_BITS: tl.constexpr, Y_BITS: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)
    row = pid // NB
    cols = (pid % NB) * SPAN + tl.arange(0, SPAN)
    mask = cols < N
    x = load_f32(x_ptr + row * sxm + cols * sxn, mask, X_BITS)
    y = tl.exp2((x - tl.load(row_m + row)) * _LOG2E) / tl.load(row_l + row)
    store_f32(y_ptr + row * sym + cols * syn, y, mask, Y_BITS)


@triton.jit(do_not_specialize=["N", "NB", "sxm"])
def _split_ticket_kernel(x_ptr, ws_m, ws_l, tickets, row_m, row_l, N, NB, sxm, sxn,
                         SPAN: tl.constexpr, X_BITS: tl.constexpr, BUG: tl.constexpr):
    """One launch for the stats and the merge: every program stores its span's (max, sum) and
    takes a ticket from its row's counter; the holder of the last ticket merges the row."""
    pid = tl.program_id(0).to(tl.int64)
    row = pid // NB
    _span_stats(x_ptr, ws_m, ws_l, pid, N, NB, sxm, sxn, SPAN, X_BITS)
    if BUG == 22:  # LAST_SPAN_MERGES: no ticket; the row's last span merges, as if programs ran in order
        last = (pid % NB) == NB - 1
    else:  # acq_rel (the default): the stores above are visible to the last ticket's holder
        last = tl.atomic_add(tickets + row, 1) == NB - 1
    if last:
        m, l = _merge_row(ws_m, ws_l, row, NB, 0)
        tl.store(row_m + row, m)
        tl.store(row_l + row, l)


def _split(x: torch.Tensor, bug: int, span: int = 256, *, one_launch: bool = False) -> torch.Tensor:
    """Split-row softmax: stats and merge in two launches, or in one (`_split_ticket_kernel`)."""
    m, n = x.shape
    y = _output(x)
    if x.numel() == 0:
        return y
    nb = triton.cdiv(n, span)
    ws = torch.empty((2, m * nb), dtype=torch.float32, device=x.device)
    st = torch.empty((2, m), dtype=torch.float32, device=x.device)
    xk, yk, xb, yb = kernel_view(x), kernel_view(y), bf16_as_bits(x.dtype), bf16_as_bits(y.dtype)
    if one_launch:
        tickets = torch.zeros(m, dtype=torch.int32, device=x.device)
        _split_ticket_kernel[(m * nb,)](xk, ws[0], ws[1], tickets, st[0], st[1], n, nb, x.stride(0), x.stride(1),
                                        SPAN=span, X_BITS=xb, BUG=bug)
    else:
        _split_stats_kernel[(m * nb,)](xk, ws[0], ws[1], n, nb, x.stride(0), x.stride(1), SPAN=span, X_BITS=xb)
        _split_merge_kernel[(m,)](ws[0], ws[1], st[0], st[1], nb, BUG=bug)
    _split_normalize_kernel[(m * nb,)](xk, yk, st[0], st[1], n, nb, x.stride(0), x.stride(1), y.stride(0),
                                       y.stride(1), SPAN=span, X_BITS=xb, Y_BITS=yb)
    return y


# --------------------------------------------------------------------------------------------
# Launch-configuration dependence, and an `out=` whose strides are ignored
# --------------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["N", "sxm", "sym"])
def _chunked_sum_kernel(x_ptr, y_ptr, N, sxm, sxn, sym, syn,
                        CHUNK: tl.constexpr, X_BITS: tl.constexpr, Y_BITS: tl.constexpr):
    """Three passes: the max, the sum in CHUNK per-lane accumulators (lane j adds columns j,
    j + CHUNK, j + 2 CHUNK, ... in sequence, then one tree over the lanes: which values meet in
    which rounding depends on CHUNK), the normalize. Every CHUNK is within the error bound."""
    row = tl.program_id(0).to(tl.int64)
    lanes = tl.arange(0, CHUNK)
    m = tl.max(tl.full([CHUNK], float("-inf"), tl.float32), axis=0)
    for k in range(0, tl.cdiv(N, CHUNK)):
        cols = k * CHUNK + lanes
        m = tl.maximum(m, tl.max(load_f32(x_ptr + row * sxm + cols * sxn, cols < N, X_BITS), axis=0))
    acc = tl.zeros([CHUNK], tl.float32)
    for k in range(0, tl.cdiv(N, CHUNK)):
        cols = k * CHUNK + lanes
        x = load_f32(x_ptr + row * sxm + cols * sxn, cols < N, X_BITS)
        acc = acc + tl.exp2((x - m) * _LOG2E)
    s = tl.sum(acc, axis=0)
    for k in range(0, tl.cdiv(N, CHUNK)):
        cols = k * CHUNK + lanes
        mask = cols < N
        x = load_f32(x_ptr + row * sxm + cols * sxn, mask, X_BITS)
        store_f32(y_ptr + row * sym + cols * syn, tl.exp2((x - m) * _LOG2E) / s, mask, Y_BITS)


def _chunked(x: torch.Tensor, chunk: int) -> torch.Tensor:
    m, n = x.shape
    y = _output(x)
    if x.numel() == 0:
        return y
    _chunked_sum_kernel[(m,)](kernel_view(x), kernel_view(y), n, x.stride(0), x.stride(1), y.stride(0),
                              y.stride(1), CHUNK=chunk, X_BITS=bf16_as_bits(x.dtype), Y_BITS=bf16_as_bits(y.dtype))
    return y


def _out_view(x: torch.Tensor, out: torch.Tensor | None, bug: bool, kernel_bug: int = NONE) -> torch.Tensor:
    _validate(x)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    else:
        check_out(out, tuple(x.shape), x.dtype, x)
    m, n = x.shape
    if x.numel() == 0:
        return out
    # the bug: the launcher hands the kernel the strides of a contiguous output, whatever `out` is
    sym, syn = (n, 1) if bug else (out.stride(0), out.stride(1))
    _row_kernel[(m,)](kernel_view(x), kernel_view(out), n, x.stride(0), x.stride(1), sym, syn,
                      BLOCK_N=max(256, triton.next_power_of_2(n)), X_BITS=bf16_as_bits(x.dtype),
                      Y_BITS=bf16_as_bits(out.dtype), BUG=kernel_bug)
    return out

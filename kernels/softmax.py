"""Softmax over the last dim of a 2-D tensor, in Triton.

Semantics (NUMERICS.md section 2) come from the plain formula evaluated in fp32 with padding
lanes read as -inf: a NaN or +inf anywhere makes the row's sum NaN, so every output is NaN; an
all -inf row gives -inf - -inf = NaN everywhere, as torch does; -inf entries give exp(-inf) = 0.
The max is taken without NaN propagation (tl.max), which is fine because the sum propagates it.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._runtime import cdiv, launch, on_input_device
from ._common import (
    DEVICE, INTERPRET, LOG2E, bf16_as_bits, by16, check_float, check_knob, check_out, kernel_view, load_f32, store_f32, tl,
    triton,
)

# --------------------------------------------------------------------------------------------
# Row variant: each program holds ROWS whole rows in registers.
# --------------------------------------------------------------------------------------------

ROW_MAX_N = 32768
# 16-bit rows up to twice as wide: past ROW_HOLD_N the row kernel reads x a second time instead
# of holding its fp32 exponentials (65536 of them a row are the whole register file of an SM). On
# an H200 (1024 x 65536, one run, U1) that ran at 0.70 (fp16) and 0.67 (bf16) of copy against the
# online kernel's 0.54 and 0.59; held whole, the row spilled and ran at 0.56 and 0.58. Under the
# interpreter the second read starts at 256 columns, so CPU tests take that path too.
ROW_MAX_N_16BIT = 65536
ROW_HOLD_N = 256 if INTERPRET else 32768
# A plain float global cannot be read inside @triton.jit on the GPU (only the interpreter
# allows it); a constexpr can.
_LOG2E = tl.constexpr(LOG2E)


# One binary per block configuration, not one per shape: N and the row strides are passed through
# `by16` (MUL = 16 when all are multiples of 16: what 16-byte loads need, seen by Triton through
# the multiplication; else 1), column strides keep only their == 1 specialisation, row and block
# counts none (the same for every kernel below).
@triton.jit(do_not_specialize=["M", "N", "sxm", "sym"], do_not_specialize_on_alignment=["sxn", "syn"])
def _softmax_row_kernel(
    x_ptr, y_ptr, M, N, sxm, sxn, sym, syn,
    BLOCK_N: tl.constexpr, ROWS: tl.constexpr, X_BITS: tl.constexpr, Y_BITS: tl.constexpr, MUL: tl.constexpr,
    RELOAD: tl.constexpr,
):
    N, sxm, sym = N * MUL, sxm * MUL, sym * MUL
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows < M)[:, None] & (cols < N)[None, :]
    rows64 = rows.to(tl.int64)[:, None]
    cols64 = cols.to(tl.int64)[None, :]
    x = load_f32(x_ptr + rows64 * sxm + cols64 * sxn, mask, X_BITS)
    m = tl.max(x, axis=1)
    e = tl.exp2((x - m[:, None]) * _LOG2E)
    s = tl.sum(e, axis=1)
    if RELOAD:
        # A 16-bit row too wide to keep its exponentials in registers: read x again (from L1/L2;
        # the barrier keeps the compiler from merging the two loads) and recompute the same
        # exponentials, so y has the same bits as the formula below.
        tl.debug_barrier()
        x = load_f32(x_ptr + rows64 * sxm + cols64 * sxn, mask, X_BITS)
        e = tl.exp2((x - m[:, None]) * _LOG2E)
    y = e / s[:, None]
    store_f32(y_ptr + rows64 * sym + cols64 * syn, y, mask, Y_BITS)


@dataclass(frozen=True)
class RowConfig:
    block_n: int
    rows: int
    num_warps: int
    reload: bool = False  # read x twice (rows wider than ROW_HOLD_N): the same bits, fewer registers


def row_config(m: int, n: int, *, rows_per_program: int | None = None, num_warps: int | None = None,
               block_n: int | None = None) -> RowConfig:
    """Block sizes for the row kernel: short rows share a program so each moves about 4K elements.

    block_n is a minimum (a power of two); wider blocks only add masked lanes. Past ROW_HOLD_N
    columns (16-bit rows only: fp32 stops at ROW_MAX_N) a program of 32 warps takes one row and
    reads it twice."""
    bn = max(triton.next_power_of_2(n), triton.next_power_of_2(block_n or 1))
    rows = rows_per_program or max(1, min(16, 4096 // bn, triton.next_power_of_2(m)))
    reload = bn > ROW_HOLD_N
    cap = 32 if reload and not INTERPRET else 16
    warps = num_warps or max(1, min(cap, bn * rows // 512))
    return RowConfig(bn, rows, warps, reload)


def row_max_n(dtype: torch.dtype) -> int:
    """The widest row softmax_row takes for this input dtype."""
    return ROW_MAX_N if dtype == torch.float32 else ROW_MAX_N_16BIT


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


@on_input_device
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
    check_knob("rows_per_program", rows_per_program, pow2=True)  # ROWS is a block dim
    check_knob("num_warps", num_warps, pow2=True)
    check_knob("block_n", block_n)  # a minimum, rounded up to a power of two
    dest = _prepare(x, out_dtype, out)
    m, n = x.shape
    if n > row_max_n(x.dtype):
        raise ValueError(f"N={n} is too long for the row kernel with {x.dtype} input (at most "
                         f"{row_max_n(x.dtype)}); use softmax()")
    if x.numel() == 0:
        return dest
    # tl.sum adds in the order of the layout Triton gives the row, which follows the output's
    # alignment and strides too: an out= view unlike the default output (contiguous, 16-byte
    # aligned) would get other bits (an H200 showed it), so it gets the default's through a copy.
    aligned = dest.is_contiguous() and dest.data_ptr() % 16 == 0
    y = dest if aligned else torch.empty(dest.shape, dtype=dest.dtype, device=dest.device)
    cfg = row_config(m, n, rows_per_program=rows_per_program, num_warps=num_warps, block_n=block_n)
    xk, yk = kernel_view(x), kernel_view(y)
    (n_, sxm, sym), mul = by16(n, x.stride(0), y.stride(0))
    launch(
        _softmax_row_kernel, (cdiv(m, cfg.rows),), (xk, yk, m, n_, sxm, x.stride(1), sym, y.stride(1)),
        dict(BLOCK_N=cfg.block_n, ROWS=cfg.rows, X_BITS=bf16_as_bits(x.dtype), Y_BITS=bf16_as_bits(y.dtype),
             MUL=mul, RELOAD=cfg.reload, num_warps=cfg.num_warps),
    )  # one line per line of the Triton call it replaced: mutants_triage.json keys the kernels' lines
    if y is not dest:
        dest.copy_(y)
    return dest


# --------------------------------------------------------------------------------------------
# Building blocks of the chunked variants: a per-lane online (max, sum), a fixed-shape tree.
#
# Each of BLOCK lanes carries its own running max m and running sum l (relative to m) over
# the elements it sees (lane j sees j, j + BLOCK, j + 2 BLOCK, ...). Folding a value x into a
# lane needs one exp2: with e = exp(-|x - m|), either x > m (the old sum is rescaled by e and x
# contributes exactly 1) or not (x contributes e). At the end the lanes are put on the common
# max and summed by a fixed pairwise tree built from reshapes, so the result is a function of
# the values and BLOCK only: the same bits for any num_warps, on the GPU and in the interpreter.
#
# -inf and NaN: a value of -inf contributes 0 (the guard is on x itself, so a NaN can never be
# swallowed by it); two empty states (-inf, 0) merge into (-inf, 0) without computing
# exp(-inf - -inf). NaN reaches the sum through exp2(NaN) whatever tl.maximum does with it
# (the GPU's max ignores NaN, the interpreter's propagates it; either way l becomes NaN and
# multiplying by a guard's 0 keeps it NaN). +inf makes its lane (inf, 1) and the final
# rescale exp2(inf - inf) = NaN. An all -inf row ends as (-inf, 0), and the normalize pass
# computes exp2(-inf - -inf) / 0 = NaN, as torch does. The max is never replaced by a finite
# stand-in (no "sticky" 0 max).
# --------------------------------------------------------------------------------------------


@triton.jit
def _group_fold(m, l, x, LANES: tl.constexpr, G: tl.constexpr, LOG2G: tl.constexpr):
    """Fold x ([LANES, G]: each lane's G contiguous values, 16 bytes of input) into the lanes'
    running (max, sum): one rescale a lane, then an exp2 and a fixed pairwise tree over the group.
    Against a fold per value this halves the instructions a value (the 16-bit first pass was
    bound by instruction issue on an H200: reports/softmax_bench.md, twelfth section)."""
    mn = tl.maximum(m, tl.max(x, axis=1))
    ms = tl.where(mn == float("-inf"), 0.0, mn)  # an empty lane stays (-inf, 0): no -inf - -inf
    sc = tl.exp2((m - ms) * _LOG2E)  # m = -inf: 0; m = mn: exactly 1
    p = tl.exp2((x - ms[:, None]) * _LOG2E)  # the difference first: exact near the max, as the bound assumes
    for i in tl.static_range(LOG2G):  # neighbours pairwise: a lane's 16 bytes sit in one thread's registers
        a, b = tl.split(tl.reshape(p, (LANES, G >> (i + 1), 2)))
        p = a + b
    return mn, l * sc + tl.sum(p, axis=1)  # the last sum is of one value: no rounding


@triton.jit
def _lane_merge(m, l, mi, li):
    """Merge the (max, sum) pairs (mi, li) into the lanes' (m, l); (-inf, 0) is the empty state."""
    e = tl.exp2(-tl.abs(mi - m) * _LOG2E)
    e = tl.where(mi == float("-inf"), 0.0, e)
    l = tl.where(mi > m, l * e + li, l + li * e)
    m = tl.maximum(m, mi)
    return m, l


@triton.jit
def _tree_sum(v, B: tl.constexpr, LOG2B: tl.constexpr):
    """Sum of B = 2^LOG2B values by a fixed pairwise tree: each level adds the second half to
    the first, v[j] + v[j + h] (h = B/2, B/4, ...).

    Each level is one addition per pair (a reduction over an axis of 2: commutative, so exact
    whatever the layout), hence the same bits for every num_warps; LOG2B rounding levels."""
    for i in tl.static_range(LOG2B):
        v = tl.sum(tl.reshape(v, (2, B >> (i + 1))), axis=0)
    return tl.sum(v, axis=0)  # a single element: no rounding


@triton.jit
def _lanes_total(m, l, B: tl.constexpr, LOG2B: tl.constexpr):
    """The lanes' common (max, sum): one rescale per lane (guarded for empty lanes), then the tree."""
    mx = tl.max(m, axis=0)  # exact: order never matters for a max
    f = tl.exp2((m - mx) * _LOG2E)
    f = tl.where(m == float("-inf"), 0.0, f)  # empty lane: 0 (a NaN sum stays NaN: NaN * 0)
    return mx, _tree_sum(l * f, B, LOG2B)


@triton.jit
def _normalize_span(x_row, y_row, start, N, sxn, syn, mx, s, lanes,
                    BLOCK: tl.constexpr, X_BITS: tl.constexpr, Y_BITS: tl.constexpr):
    """y = exp(x - max) / sum over the columns start + lanes (the row kernel's formula)."""
    cols = (start + lanes).to(tl.int64)
    mask = cols < N
    x = load_f32(x_row + cols * sxn, mask, X_BITS)
    y = tl.exp2((x - mx) * _LOG2E) / s
    store_f32(y_row + cols * syn, y, mask, Y_BITS)


# --------------------------------------------------------------------------------------------
# Online variant: one program per row, two passes over the row in chunks of BLOCK.
# --------------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["N", "sxm", "sym"], do_not_specialize_on_alignment=["sxn", "syn"])
def _softmax_online_kernel(
    x_ptr, y_ptr, N, sxm, sxn, sym, syn,
    BLOCK: tl.constexpr, X_BITS: tl.constexpr, Y_BITS: tl.constexpr, MUL: tl.constexpr,
    G: tl.constexpr, LOG2G: tl.constexpr, LOG2L: tl.constexpr,
):
    N, sxm, sym = N * MUL, sxm * MUL, sym * MUL
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * sxm
    y_row = y_ptr + row * sym
    lanes = tl.arange(0, BLOCK)
    offs = (tl.arange(0, BLOCK // G)[:, None] * G + tl.arange(0, G)[None, :]).to(tl.int64)
    m = tl.full([BLOCK // G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK // G], dtype=tl.float32)
    n_chunks = tl.cdiv(N, BLOCK)
    # Each iteration issues the next chunk's load before folding the current one (two chunks
    # in flight per thread); the last prefetch is fully masked.
    x_next = load_f32(x_row + offs * sxn, offs < N, X_BITS)
    for k in range(0, n_chunks):
        x = x_next
        cols = tl.cast(k + 1, tl.int64) * BLOCK + offs
        x_next = load_f32(x_row + cols * sxn, cols < N, X_BITS)
        m, l = _group_fold(m, l, x, BLOCK // G, G, LOG2G)
    mx, s = _lanes_total(m, l, BLOCK // G, LOG2L)
    # Second pass backwards: the chunks read last are the likeliest to be still in L2.
    for k in range(0, n_chunks):
        _normalize_span(x_row, y_row, tl.cast(n_chunks - 1 - k, tl.int64) * BLOCK, N, sxn, syn, mx, s, lanes,
                        BLOCK, X_BITS, Y_BITS)


@dataclass(frozen=True)
class OnlineConfig:
    block: int
    num_warps: int
    group: int = 1  # contiguous values a lane folds at once (decides the bits with block)


def chunk_warps(block: int) -> int:
    """The chunked kernels' default num_warps: 256 lanes a warp (8 per thread), at most 16.
    The H200 sweep (`reports/bench_softmax.py --tune`, seventeenth session) put 16 warps at
    block 4096 ahead of 8 in one run: split fp32 1x2^26 0.617 -> 0.633 of copy, online fp32
    1024x65536 0.642 -> 0.660 and fp16 0.631 -> 0.666; split fp16 level (0.593, 0.591). The
    bits do not change: fixed trees, per-lane state, no fused multiply-add (UNFUSED)."""
    return 1 if INTERPRET else max(1, min(16, block // 256))


def online_config(n: int = 0, dtype: torch.dtype = torch.float16, *, block_n: int | None = None,
                  num_warps: int | None = None) -> OnlineConfig:
    """The chunk (= lane count) decides the bits; num_warps does not (fixed tree, per-lane state)."""
    if block_n is not None:
        if block_n < 2 or block_n & (block_n - 1):
            raise ValueError(f"block_n must be a power of two >= 2, got {block_n}")
        block = block_n
    elif INTERPRET:
        block = 128  # CPU rows of hundreds to thousands take several chunks (cost: per operation)
    else:  # from the H200 sweep in reports/bench_softmax.py --tune
        block = 4096
    warps = num_warps or chunk_warps(block)
    return OnlineConfig(block, warps, group_size(block, dtype))


@on_input_device
def softmax_online(
    x: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Streaming softmax: one program per row carries a running (max, sum) per lane over
    chunks of block_n, then writes exp(x - max) / sum in a second pass. Any N >= 1."""
    check_knob("block_n", block_n, lo=2, pow2=True)
    check_knob("num_warps", num_warps, pow2=True)
    y = _prepare(x, out_dtype, out)
    m, n = x.shape
    cfg = online_config(n, x.dtype, block_n=block_n, num_warps=num_warps)
    if x.numel() == 0:
        return y
    xk, yk = kernel_view(x), kernel_view(y)
    (n_, sxm, sym), mul = by16(n, x.stride(0), y.stride(0))
    launch(
        _softmax_online_kernel, (m,), (xk, yk, n_, sxm, x.stride(1), sym, y.stride(1)),
        dict(BLOCK=cfg.block, X_BITS=bf16_as_bits(x.dtype), Y_BITS=bf16_as_bits(y.dtype), MUL=mul,
             **group_meta(cfg.block, cfg.group), num_warps=cfg.num_warps, **UNFUSED),
    )
    return y


# --------------------------------------------------------------------------------------------
# Split-row variant: many programs per row, each a span of ITERS chunks of BLOCK; their
# (max, sum) pairs go to a workspace (the maxima, then the sums: one allocation of 2 x the grid),
# and a normalize pass writes the output. Each normalize program merges its row's pairs itself
# (a loop over the pairs, MB lanes wide, then the fixed tree): every program of a row computes the
# same bits, and two launches instead of three halve the host's time per call, which in 16-bit
# rivals the GPU's (reports/softmax_bench.md, eleventh section).
# --------------------------------------------------------------------------------------------

@triton.jit(do_not_specialize=["N", "NB", "sxm"], do_not_specialize_on_alignment=["sxn"])
def _split_stats_kernel(
    x_ptr, ws, N, NB, sxm, sxn,
    BLOCK: tl.constexpr, ITERS: tl.constexpr, X_BITS: tl.constexpr, MUL: tl.constexpr,
    G: tl.constexpr, LOG2G: tl.constexpr, LOG2L: tl.constexpr,
):
    N, sxm = N * MUL, sxm * MUL
    pid = tl.program_id(0).to(tl.int64)
    row = pid // NB
    base = (pid % NB) * (BLOCK * ITERS)
    x_row = x_ptr + row * sxm
    offs = tl.arange(0, BLOCK // G)[:, None] * G + tl.arange(0, G)[None, :]
    m = tl.full([BLOCK // G], float("-inf"), tl.float32)
    l = tl.zeros([BLOCK // G], dtype=tl.float32)
    cols = base + offs
    x_next = load_f32(x_row + cols * sxn, cols < N, X_BITS)
    for i in range(ITERS):  # prefetch as in the online kernel
        x = x_next
        cols = base + (i + 1) * BLOCK + offs
        x_next = load_f32(x_row + cols * sxn, (cols < N) & (i + 1 < ITERS), X_BITS)
        m, l = _group_fold(m, l, x, BLOCK // G, G, LOG2G)
    mx, s = _lanes_total(m, l, BLOCK // G, LOG2L)
    tl.store(ws + pid, mx)
    tl.store(ws + tl.num_programs(0) + pid, s)


@triton.jit
def _split_row_stats(ws_m, ws_l, NB, MB: tl.constexpr, LOG2MB: tl.constexpr):
    """The row's (max, sum) from its NB pairs at ws_m[:NB], ws_l[:NB]."""
    lanes = tl.arange(0, MB)
    m = tl.full([MB], float("-inf"), tl.float32)
    l = tl.zeros([MB], dtype=tl.float32)
    for start in range(0, NB, MB):
        idx = start + lanes
        mask = idx < NB
        mi = tl.load(ws_m + idx, mask=mask, other=float("-inf"))
        li = tl.load(ws_l + idx, mask=mask, other=0.0)
        m, l = _lane_merge(m, l, mi, li)
    return _lanes_total(m, l, MB, LOG2MB)


@triton.jit(do_not_specialize=["N", "NB", "sxm", "sym"], do_not_specialize_on_alignment=["sxn", "syn"])
def _split_normalize_kernel(
    x_ptr, y_ptr, ws, N, NB, sxm, sxn, sym, syn,
    BLOCK: tl.constexpr, ITERS: tl.constexpr, X_BITS: tl.constexpr, Y_BITS: tl.constexpr, MUL: tl.constexpr,
    MB: tl.constexpr, LOG2MB: tl.constexpr,
):
    N, sxm, sym = N * MUL, sxm * MUL, sym * MUL
    # Last span first: the spans the stats pass read last are the likeliest to be in L2.
    pid = (tl.num_programs(0) - 1 - tl.program_id(0)).to(tl.int64)
    row = pid // NB
    base = (pid % NB) * (BLOCK * ITERS)
    mx, s = _split_row_stats(ws + row * NB, ws + tl.num_programs(0) + row * NB, NB, MB, LOG2MB)
    lanes = tl.arange(0, BLOCK)
    for i in range(ITERS):
        _normalize_span(x_ptr + row * sxm, y_ptr + row * sym, base + (ITERS - 1 - i) * BLOCK, N,
                        sxn, syn, mx, s, lanes, BLOCK, X_BITS, Y_BITS)


@dataclass(frozen=True)
class SplitConfig:
    block: int  # lanes of a stats program (decides the bits)
    iters: int  # chunks per span (decides the bits)
    merge_block: int  # lanes of the merge (decides the bits)
    num_warps: int  # stats and normalize programs (does not change the bits)
    group: int = 1  # contiguous values a stats lane folds at once (decides the bits)

    @property
    def span(self) -> int:
        return self.block * self.iters

    def n_blocks(self, n: int) -> int:
        return max(1, -(-n // self.span))


def group_size(block: int, dtype: torch.dtype) -> int:
    """Values a lane of the first pass folds at once: 16 bytes of input (one vector load), at most
    the chunk. With the chunk it decides the bits, on the GPU and in the interpreter alike."""
    return min(block, 16 // dtype.itemsize)


def group_meta(block: int, group: int) -> dict[str, int]:
    """The first pass's group constexprs (G, LOG2G, LOG2L: lanes = block / G), as the online and
    split-stats launchers pass them."""
    return dict(G=group, LOG2G=group.bit_length() - 1, LOG2L=(block // group).bit_length() - 1)


# The chunked kernels' compile option: no multiply-add contraction. Whether the compiler fuses a
# product into the addition after it (l * sc + sum, the tree's l * f) depends on whether both sit
# in one thread, which the layout, hence num_warps, decides: fused at 4 warps and not at 16, the
# same row gave other bits (H200, thirteenth session: 4 of 196605 values of a 3 x 65535 fp16 input
# one ulp apart). Unfused, every rounding is the source's, as in the interpreter; the depth bounds
# count each operation as a rounding either way.
UNFUSED = {"enable_fp_fusion": False}


def _pow2(name: str, v: int, lo: int = 2) -> int:
    if v < lo or v & (v - 1):
        raise ValueError(f"{name} must be a power of two >= {lo}, got {v}")
    return v


def split_config(n: int = 0, dtype: torch.dtype = torch.float16, *, block_n: int | None = None,
                 chunks_per_block: int | None = None, merge_block: int | None = None,
                 num_warps: int | None = None) -> SplitConfig:
    if INTERPRET:  # several spans and several merge steps on CPU-sized rows
        # The interpreter's cost is per operation and per program, not per element: a 5 x 2048
        # fp16 call took 5.8 s at 64 lanes (16 spans a row) and 2.6 s at 128 (8 spans, still two
        # merge steps of 4 pairs); these tests were the largest part of CI's time (fourteenth
        # session). 128 is a tile the strategies align -inf blocks to (strategies/softmax.py).
        block, iters, mb = 128, 2, 4
    else:  # from the H200 sweep in reports/bench_softmax.py --tune
        block, iters, mb = 4096, 8, 1024
    block = _pow2("block_n", block_n) if block_n is not None else block
    iters = chunks_per_block or iters
    if iters < 1:
        raise ValueError(f"chunks_per_block must be >= 1, got {iters}")
    mb = _pow2("merge_block", merge_block) if merge_block is not None else mb
    warps = num_warps or chunk_warps(block)
    return SplitConfig(block, iters, mb, warps, group_size(block, dtype))


@on_input_device
def softmax_split(
    x: torch.Tensor,
    *,
    out_dtype: torch.dtype | None = None,
    out: torch.Tensor | None = None,
    block_n: int | None = None,
    chunks_per_block: int | None = None,
    merge_block: int | None = None,
    num_warps: int | None = None,
) -> torch.Tensor:
    """Split-row softmax for a few enormous rows: spans of block_n * chunks_per_block columns
    each give a (max, sum) pair, and a normalize pass merges the row's pairs (merge_block lanes
    wide) and writes the output. Two launches, three passes over memory (read, read, write)."""
    for name, v, lo, pow2 in (("block_n", block_n, 2, True), ("chunks_per_block", chunks_per_block, 1, False),
                              ("merge_block", merge_block, 2, True), ("num_warps", num_warps, 1, True)):
        check_knob(name, v, lo=lo, pow2=pow2)
    y = _prepare(x, out_dtype, out)
    m, n = x.shape
    cfg = split_config(n, x.dtype, block_n=block_n, chunks_per_block=chunks_per_block,
                       merge_block=merge_block, num_warps=num_warps)
    if x.numel() == 0:
        return y
    nb = cfg.n_blocks(n)
    ws = torch.empty(2 * m * nb, dtype=torch.float32, device=x.device)
    xk, yk = kernel_view(x), kernel_view(y)
    xb, yb = bf16_as_bits(x.dtype), bf16_as_bits(y.dtype)
    (n_, sxm, sym), mul = by16(n, x.stride(0), y.stride(0))
    launch(_split_stats_kernel, (m * nb,), (xk, ws, n_, nb, sxm, x.stride(1)),
           dict(BLOCK=cfg.block, ITERS=cfg.iters, X_BITS=xb, MUL=mul, **group_meta(cfg.block, cfg.group),
                num_warps=cfg.num_warps, **UNFUSED))
    launch(_split_normalize_kernel, (m * nb,), (xk, yk, ws, n_, nb, sxm, x.stride(1), sym, y.stride(1)),
           dict(BLOCK=cfg.block, ITERS=cfg.iters, X_BITS=xb, Y_BITS=yb, MUL=mul, MB=cfg.merge_block,
                LOG2MB=cfg.merge_block.bit_length() - 1, num_warps=cfg.num_warps, **UNFUSED))
    return y


# --------------------------------------------------------------------------------------------
# Dispatcher
# --------------------------------------------------------------------------------------------

# Rows up to this length go to the row kernel (whole row in registers, one read + one write). At
# 32768 columns it ran at 0.76 (fp16), 0.77 (bf16) and 0.95 (fp32) of copy on an H200 against the
# online kernel's 0.59, 0.63, 0.69 (one run); at 65536 fp32 cannot be held (256 KB a row, the
# register file of an SM) and 16-bit rows take the row kernel's second read (ROW_HOLD_N).
DISPATCH_ROW_MAX_N = 512 if INTERPRET else ROW_MAX_N
DISPATCH_ROW_MAX_N_16BIT = 512 if INTERPRET else ROW_MAX_N_16BIT


def dispatch_row_max_n(dtype: torch.dtype) -> int:
    """The widest row the dispatcher gives the row kernel, for this input dtype."""
    return DISPATCH_ROW_MAX_N if dtype == torch.float32 else DISPATCH_ROW_MAX_N_16BIT


_SM_COUNT: dict[int, int] = {}


def sm_count(device: torch.device) -> int:
    """Multiprocessors of the GPU (2 under the interpreter, so CPU tests reach every path)."""
    if INTERPRET or device.type != "cuda":
        return 2
    idx = device.index if device.index is not None else torch.cuda.current_device()
    if idx not in _SM_COUNT:
        _SM_COUNT[idx] = torch.cuda.get_device_properties(idx).multi_processor_count
    return _SM_COUNT[idx]


def choose_variant(m: int, n: int, dtype: torch.dtype, sms: int) -> str:
    """'row' | 'online' | 'split' for an (m, n) problem on a GPU with `sms` multiprocessors."""
    if n <= dispatch_row_max_n(dtype):
        return "row"
    # Too few rows to fill the GPU with one program per row, and rows long enough to split.
    if m < 2 * sms and n > split_config(n, dtype).span:
        return "split"
    return "online"


def softmax(x: torch.Tensor, *, out_dtype: torch.dtype | None = None, out: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax over the last dim of a 2-D fp16/bf16/fp32 tensor (any strides), fp32 inside.

    Picks the row kernel for rows that fit in registers, the split-row kernel when there are
    too few rows to fill the GPU, else the online kernel."""
    _check_softmax_input(x, out_dtype)
    m, n = x.shape
    variant = choose_variant(m, n, x.dtype, sm_count(x.device))
    fn = {"row": softmax_row, "online": softmax_online, "split": softmax_split}[variant]
    return fn(x, out_dtype=out_dtype, out=out)


__all__ = ["softmax", "softmax_row", "softmax_online", "softmax_split", "choose_variant", "ROW_MAX_N",
           "ROW_MAX_N_16BIT", "row_max_n", "dispatch_row_max_n", "DEVICE"]

# Autograd (issue 52): each launcher records a graph when x requires grad under grad mode, with
# softmax_backward (kernels/softmax_backward.py) as its backward; otherwise it is the launcher above,
# unchanged. Rebound here, after everything, so that no line above moves (mutants are keyed by line).
from ._autograd import differentiable  # noqa: E402


def _softmax_backward():
    from .softmax_backward import softmax_backward as bwd
    return bwd


softmax_row, softmax_online, softmax_split, softmax = (
    differentiable(f, _softmax_backward) for f in (softmax_row, softmax_online, softmax_split, softmax))

"""Rounding depths (the D of oracles/bounds.py) of each softmax variant for a row of n: the longest
chain of fp32 roundings an output's sum goes through, at the launch configuration the kernels in
kernels/softmax.py choose (or a tuning's own knobs)."""
from __future__ import annotations

import torch

from .softmax import DISPATCH_ROW_MAX_N, DISPATCH_ROW_MAX_N_16BIT, online_config, row_config, split_config


def _log2c(v: int) -> int:
    return max(0, (max(1, v) - 1).bit_length())


def _numpy_sum_depth(n: int) -> int:
    """Depth of NumPy's pairwise float32 sum (the interpreter's tl.sum): 8 accumulators over
    blocks of <= 128, their 3-level tree, halving above 128."""
    if n < 8:
        return n
    if n <= 128:
        return n // 8 - 1 + 3 + n % 8
    n2 = (n // 2) - (n // 2) % 8
    return 1 + max(_numpy_sum_depth(n2), _numpy_sum_depth(n - n2))


def _gpu_sum_depth(block: int, warps: int, rows: int) -> int:
    """Upper bound on a GPU tl.sum's depth over a row of `block` lanes: each thread adds its
    elements in sequence, then a shuffle/shared-memory tree over the threads. The layout puts
    v in {1, 2, 4, 8} contiguous lanes per thread and at least min(32, block / v) threads on a
    row (32 * warps when the program has one row)."""
    worst = 0
    for v in (1, 2, 4, 8):
        t_hi = min(32 * warps, -(-block // v))
        t_lo = t_hi if rows == 1 else min(32, t_hi)
        worst = max(worst, -(-block // t_lo) - 1 + _log2c(t_hi))
    return worst


def row_depth(n: int, *, rows_per_program: int | None = None, num_warps: int | None = None,
              block_n: int | None = None) -> int:
    """Row kernel: one tl.sum over the padded row, for any M (rows per program) and dtype; the
    knobs as the launcher takes them (a tuning's depth is its own)."""
    d = 1
    for m in (1, 1 << 20):
        cfg = row_config(m, n, rows_per_program=rows_per_program, num_warps=num_warps, block_n=block_n)
        d = max(d, _gpu_sum_depth(cfg.block_n, cfg.num_warps, cfg.rows), _numpy_sum_depth(cfg.block_n))
    return d


# Per fold or merge step a lane's sum is multiplied by a rescale factor (1 rounding, plus
# ex2.approx's 2 ulp = 4u for the factor) and added to (1 rounding): 6u. The factors' argument
# errors telescope into the bound's 3|d_i| term because the running max only grows. The
# final rescale onto the common max costs 5u, the fixed tree one rounding per level.
# The first pass folds a group of G values a lane (kernels/softmax.py:_group_fold): a value enters
# through its exp2 (4u), the group's tree (log2 G) and the add (1), then 6u per later step, the
# final rescale and the lanes' tree (log2(block / G)): 10 + 6 (steps after its own) + log2 block,
# within 6 steps + 5 + log2 block for every step it can enter at. So the formulas below hold.
_STEP, _RESCALE = 6, 5


def online_depth(n: int, *, block_n: int | None = None, num_warps: int | None = None) -> int:
    worst = 1
    for dt in (torch.float16, torch.float32):
        b = online_config(n, dt, block_n=block_n).block
        worst = max(worst, _STEP * -(-n // b) + _RESCALE + _log2c(b))
    return worst


def split_depth(n: int, *, block_n: int | None = None, chunks_per_block: int | None = None,
                merge_block: int | None = None, num_warps: int | None = None) -> int:
    worst = 1
    for dt in (torch.float16, torch.float32):
        c = split_config(n, dt, block_n=block_n, chunks_per_block=chunks_per_block, merge_block=merge_block)
        chain = _STEP * min(c.iters, -(-n // c.block)) + _RESCALE + _log2c(c.block)
        merge = _STEP * -(-c.n_blocks(n) // c.merge_block) + _RESCALE + _log2c(c.merge_block)
        worst = max(worst, chain + merge)
    return worst


def softmax_depth(n: int) -> int:
    """The dispatcher may pick any variant allowed for n (the choice also depends on M and dtype)."""
    d = row_depth(n) if n <= max(DISPATCH_ROW_MAX_N, DISPATCH_ROW_MAX_N_16BIT) else 1
    if n > min(DISPATCH_ROW_MAX_N, DISPATCH_ROW_MAX_N_16BIT):
        d = max(d, online_depth(n), split_depth(n))
    return d

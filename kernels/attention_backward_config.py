"""Block sizes of the attention backward (kernels/attention_backward_kernels.py) per (dtype,
padded head dim), and the interpreter's own."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._common import INTERPRET, triton


@dataclass(frozen=True)
class BwdConfig:
    block_m: int  # dK/dV: query rows per step; the bound's block_m (dk, dv accumulate over these)
    block_n: int  # dK/dV: keys per program
    num_warps: int
    num_stages: int
    dq_block_m: int  # dQ: query rows per program
    dq_block_n: int  # dQ: keys per step; the bound's block_n (dq accumulates over these)
    dq_num_warps: int
    dq_num_stages: int
    block_d: int  # q/k and v head dims, padded to one power of two (the forward's reason)
    delta_rows: int  # rows per program of D = rowsum(dO * O)

    @property
    def bound_blocks(self) -> tuple[int, int]:
        """(block_m, block_n) for oracles.attention_backward_bound."""
        return self.block_m, self.dq_block_n


# GPU table: (dtype, padded head dim) -> ((dK/dV: BLOCK_M, BLOCK_N, warps, stages),
# (dQ: BLOCK_M, BLOCK_N, warps, stages)). Chosen offline for sm_90 with Triton 3.6 (ptxas'
# registers, spills and shared memory: see `python -m flashcheck.kernels.attention_backward_config`);
# no H200 has timed them. A dK/dV program holds its K and V tiles and two fp32 accumulators of
# BLOCK_N x head dim, so it takes many keys and few rows per step; dQ the mirror image.
_GPU_TABLE = {
    torch.float16: {16: ((64, 128, 8, 3), (128, 64, 8, 3)), 32: ((64, 128, 8, 3), (128, 64, 8, 3)),
                    64: ((64, 128, 8, 3), (128, 64, 8, 3)), 128: ((64, 128, 8, 2), (128, 64, 8, 2)),
                    256: ((32, 64, 8, 2), (64, 32, 8, 2))},
    torch.bfloat16: {16: ((64, 128, 8, 3), (128, 64, 8, 3)), 32: ((64, 128, 8, 3), (128, 64, 8, 3)),
                     64: ((64, 128, 8, 3), (128, 64, 8, 3)), 128: ((64, 128, 8, 2), (128, 64, 8, 2)),
                     256: ((32, 64, 8, 2), (64, 32, 8, 2))},
    # fp32 ieee dots run on the CUDA cores (no tensor cores): small tiles, as the forward's
    torch.float32: {16: ((32, 64, 4, 2), (64, 32, 4, 2)), 32: ((32, 64, 4, 2), (64, 32, 4, 2)),
                    64: ((32, 64, 4, 2), (64, 32, 4, 2)), 128: ((16, 32, 4, 2), (32, 16, 4, 2)),
                    256: ((16, 32, 8, 1), (32, 16, 8, 1))},
}
# The interpreter's cost is per operation, but CPU-sized cases (M, N of a few dozen) should still
# cross block edges: 16, the smallest tile tl.dot takes.
_INTERPRET_BLOCK = 16
_DELTA_ELEMENTS = 8192  # D's tile: rows x padded Dv, fp32 o and dO in registers


def bwd_config(d: int, dtype: torch.dtype, *, dv: int | None = None, block_m: int | None = None,
               block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None) -> BwdConfig:
    """Blocks for head dims d (q, k) and dv (v, default d). Overrides (powers of two >= 16): block_m
    sets both kernels' query blocks, block_n both kernels' key blocks, num_warps / num_stages both."""
    bd = max(16, triton.next_power_of_2(max(d, dv if dv is not None else d)))
    if INTERPRET:
        kv = qs = (_INTERPRET_BLOCK, _INTERPRET_BLOCK, 4, 1)
    else:
        kv, qs = _GPU_TABLE[dtype][bd]
    return BwdConfig(block_m or kv[0], block_n or kv[1], num_warps or kv[2], num_stages or kv[3],
                     block_m or qs[0], block_n or qs[1], num_warps or qs[2], num_stages or qs[3], bd,
                     _INTERPRET_BLOCK if INTERPRET else max(16, min(128, _DELTA_ELEMENTS // bd)))

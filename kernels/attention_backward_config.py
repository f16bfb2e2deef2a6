"""Block sizes of the attention backward (kernels/attention_backward_kernels.py) per (dtype,
padded head dim), and the interpreter's own."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._common import INTERPRET, triton
from .attention_args import normalize_window


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


# GPU tables: (dtype, padded head dim) -> ((dK/dV: BLOCK_M, BLOCK_N, warps, stages),
# (dQ: BLOCK_M, BLOCK_N, warps, stages)). Chosen offline for sm_90 with Triton 3.6's ptxas (no H200
# has timed them): registers, spills and shared memory of each kernel compiled for each feature
# variant (plain, causal, kv_lens, varlen, softcap; window, boolean mask, float mask with softcap
# and window), M = 1000, N = 777 so the tail loops exist. Every tile fits one H200 CTA's 227 KB of
# shared memory (the largest, fp16 D128 dQ: 120 KB). A dK/dV program keeps K and V in shared memory
# and two fp32 accumulators of BLOCK_N x head dim in registers, so it takes many keys and few rows
# per step (dQ the mirror image); the per-row loads are unit-stride (`_attn_bwd_delta_kernel`).
# fp16 and bf16 compile alike. Base tiles: at most 40 bytes of spill in any base variant (fp16 D64
# dK/dV 215-252 registers, D128 255); D256 needs 32-key tiles (two 256-wide fp32 accumulators).
# A head dim off a power of two pays for its masked loads (fp16 D100/Dv40: 88-328 bytes).
_TILES_16 = {16: ((32, 128, 8, 3), (128, 64, 8, 3)), 32: ((32, 128, 8, 3), (128, 64, 8, 3)),
             64: ((32, 128, 8, 3), (128, 64, 8, 3)), 128: ((16, 128, 8, 3), (128, 32, 8, 3)),
             256: ((32, 32, 8, 2), (32, 32, 8, 2))}
# fp32 ieee dots run on the CUDA cores: small tiles, as the forward's. ptxas is erratic there (as
# for the forward, kernels/attention_config.py): fp32 D128 dQ at (32, 32) spilled 872 bytes in the
# plain variant and none with a window; D256 dK/dV at (32, 64) got 32 registers and 16 KB of spill.
_TILES_32 = {16: ((32, 32, 4, 2), (32, 32, 4, 2)), 32: ((32, 32, 4, 2), (32, 32, 4, 2)),
             64: ((32, 32, 4, 2), (32, 32, 4, 2)), 128: ((16, 32, 4, 2), (32, 16, 4, 2)),
             256: ((16, 16, 8, 2), (32, 16, 8, 1))}
_GPU_TABLE = {torch.float16: _TILES_16, torch.bfloat16: _TILES_16, torch.float32: _TILES_32}
# Edged launches (a mask or a finite window: masked loops, row guards, mask tiles) take smaller dK/dV
# tiles: the base fp16 D64 tile spilled 80-560 bytes there, (16, 128) 0-32; D128 136-904 bytes at
# (32, 128), 24-272 at (16, 64) (smaller tiles spill less but halve K/V reuse); D256 none at (16, 32).
_EDGED_16 = {16: ((16, 128, 8, 3), (128, 64, 8, 3)), 32: ((16, 128, 8, 3), (128, 64, 8, 3)),
             64: ((16, 128, 8, 3), (128, 64, 8, 3)), 128: ((16, 64, 8, 2), (64, 32, 8, 2)),
             256: ((16, 32, 8, 2), (32, 32, 8, 2))}
_GPU_EDGED = {torch.float16: _EDGED_16, torch.bfloat16: _EDGED_16, torch.float32: _TILES_32}
# The interpreter's cost is per operation, but CPU-sized cases (M, N of a few dozen) should still
# cross block edges: 16, the smallest tile tl.dot takes.
_INTERPRET_BLOCK = 16
_DELTA_ELEMENTS = 4096  # D's tile: rows x padded Dv, fp32 o and dO in registers (4096: 32 each per thread)


def edged_launch(window, attn_mask) -> bool:
    """Whether a launch takes the edged tiles: a mask or a finite window edge compiles masked loops
    whose registers the plain tiles do not leave room for."""
    return attn_mask is not None or normalize_window(window) != (-1, -1)


def bwd_config(d: int, dtype: torch.dtype, *, dv: int | None = None, edged: bool = False, block_m: int | None = None,
               block_n: int | None = None, num_warps: int | None = None, num_stages: int | None = None) -> BwdConfig:
    """Blocks for head dims d (q, k) and dv (v, default d); edged: `edged_launch(window, attn_mask)`.
    Overrides (powers of two >= 16): block_m sets both kernels' query blocks, block_n both kernels'
    key blocks, num_warps / num_stages both."""
    bd = max(16, triton.next_power_of_2(max(d, dv if dv is not None else d)))
    if INTERPRET:
        kv = qs = (_INTERPRET_BLOCK, _INTERPRET_BLOCK, 4, 1)
    else:
        kv, qs = (_GPU_EDGED if edged else _GPU_TABLE)[dtype][bd]
    return BwdConfig(block_m or kv[0], block_n or kv[1], num_warps or kv[2], num_stages or kv[3],
                     block_m or qs[0], block_n or qs[1], num_warps or qs[2], num_stages or qs[3], bd,
                     _INTERPRET_BLOCK if INTERPRET else max(16, min(128, _DELTA_ELEMENTS // bd)))


def bound_blocks(d: int, dtype: torch.dtype, *, dv: int | None = None, window=None, attn_mask=None,
                 **_options) -> tuple[int, int]:
    """(block_m, block_n) of the default launch for a call's options: what
    oracles.attention_backward_bound needs (the forward's `_attention_blocking` counterpart)."""
    return bwd_config(d, dtype, dv=dv, edged=edged_launch(window, attn_mask)).bound_blocks

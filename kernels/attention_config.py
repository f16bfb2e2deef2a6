"""Launch configuration of the fused attention kernel (`kernels/attention.py`): block sizes per
(dtype, padded head dim) from a small table, the interpreter's own blocks, and how many key splits
a decode-shaped problem gets."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ._common import DEVICE, INTERPRET, triton


@dataclass(frozen=True)
class AttnConfig:
    block_m: int
    block_n: int
    block_d: int
    num_warps: int
    num_stages: int
    block_dv: int = 0  # 0: the same as block_d
    rowsum_dot: bool = False  # l from the rounded P on the tensor cores (P @ ones), not tl.sum


# GPU table keyed on (dtype, padded head dim): (BLOCK_M, BLOCK_N, num_warps, num_stages), from
# sweeps on an H200 (reports/bench_attention.py --sweep, S = 4096; TFLOP/s non-causal/causal):
# fp16 D64 (128, 64, 8, 3) 356/318; fp16 D128 (128, 128, 8, 3) 432/376; bf16 D64 (64, 64, 4, 3)
# 321/277 (the (128, 64, 8, 3) tile: 299/255); bf16 D128 (128, 128, 8, 3) 378/333. D <= 32 was
# not swept. With Dv != D the larger of the two picks the row.
# D = 256, on an H100 (B2 H16, non-causal; ptxas spills in 4-byte words): fp16 (128, 64, 8, 2)
# 1.64 ms, 290 spills, against (64, 64, 4, 2) 2.79 ms, 674; bf16 1.72 against 2.83 ms. fp32
# (32, 16, 8, 1) 5.8 ms, no spills, against (32, 16, 4, 1) 20.6 ms: ptxas gave that tile 32
# registers and 2046 spilled words, about 1.7 GB of local memory reserved per launching process,
# enough for a dozen processes side by side to run the GPU out of memory at launch.
_GPU_TABLE = {
    torch.float16: {16: (128, 64, 8, 3), 32: (128, 64, 8, 3), 64: (128, 64, 8, 3), 128: (128, 128, 8, 3),
                    256: (128, 64, 8, 2)},
    torch.bfloat16: {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (64, 64, 4, 3), 128: (128, 128, 8, 3),
                     256: (128, 64, 8, 2)},
    # fp32 ieee dots run on the CUDA cores: small tiles
    torch.float32: {16: (64, 32, 4, 2), 32: (64, 32, 4, 2), 64: (64, 32, 4, 2), 128: (32, 32, 4, 2),
                    256: (32, 16, 8, 1)},
}
# Kernels that compile an edge loop (causal, a window, a boolean mask: kernels/attention.py) carry
# a second copy of the block's code and its registers: fp16 D64 causal ran at 310 TFLOP/s with
# (64, 64, 4, 3) against 241 with the table's (128, 64, 8, 3) (H200, B4 H16 S4096; one run).
# bf16 D128 with an edge loop: (128, 64) with the tensor-core row sum below; on an H100, base and
# this alternated twice in one process: causal B4 H16 S4096 335-339 -> 397-399 TFLOP/s, S16384
# 403-408 -> 439-469, GQA 32/8 +18%, softcap +20%, windows and a boolean mask -1% to +4%. fp16 D128
# lost 3-9% with the same change, so it keeps the table's tile (reports/attention_bench.md).
_GPU_EDGED = {(torch.float16, 64): (64, 64, 4, 3), (torch.bfloat16, 128): (128, 64, 8, 3)}
# Where the row sum l of the rounded P goes through the tensor cores (P @ ones beside P @ V)
# instead of tl.sum over P widened back to fp32: V of all ones stays exactly 1 either way (the
# same products summed by the same instruction as P @ V), and the bound is unchanged (docs/
# NUMERICS.md section 3.5, part 3). The widening costs bf16 a convert per weight: on an H200
# (B4 H16 S4096, one run) bf16 D64 went 321 -> 375 TFLOP/s (causal 285 -> 316), D128 400 -> 449;
# fp16 gained nothing (387 -> 387), and D128 with an edge loop lost (fp16 370 -> 319, bf16 333
# -> 318): its third dot in two loops costs registers; with the edge loops unpipelined and the
# (128, 64) tile above it fits (222-224 registers, no spill) and bf16 D128 edged gains (above).
# Keyed (dtype, padded head dim, edged).
_ROWSUM_DOT = {(torch.bfloat16, 64, False), (torch.bfloat16, 64, True), (torch.bfloat16, 128, False),
               (torch.bfloat16, 128, True)}
_INTERPRET_BLOCK = 32  # the interpreter's cost is per operation: few, large blocks
_INTERPRET_LONG = (1024, 128)  # from this many keys on, 128-key blocks (the long-row cases stay cheap)
# Decode tiles (packed GQA rows, few of them): a short M tile, keys in wide blocks.
_DECODE_BLOCK_M = 16


def attn_config(d: int, dtype: torch.dtype, *, dv: int | None = None, n: int = 0, edged: bool = False,
                block_m: int | None = None, block_n: int | None = None, num_warps: int | None = None,
                num_stages: int | None = None) -> AttnConfig:
    """Block sizes for head dims d (q, k) and dv (v, default d), key length n, dtype and whether
    the kernel compiles an edge loop (edged); keyword overrides win (powers of two >= 16). The
    row-sum method follows (dtype, head dim, edged) alone, never a tile override, so the launch
    knobs keep the bits (KernelSpec.configs); the interpreter takes the GPU's method."""
    # One width for the Q/K and the V tiles (the wider of the two, the narrower head masked): on
    # Hopper, Triton 3.6 miscompiles the P @ V dot of a bf16 (64, 64) tile with a V tile narrower
    # than K's (D 40 -> 64, Dv 24 -> 32): compute-sanitizer reports an out-of-bounds shared-memory
    # read in the wgmma and the launch faults (illegal memory access; reports/memcheck_sweep.py).
    bd = bdv = max(16, triton.next_power_of_2(max(d, dv if dv is not None else d)))
    if INTERPRET:
        bn = _INTERPRET_LONG[1] if n >= _INTERPRET_LONG[0] else _INTERPRET_BLOCK
        bm, w, st = _INTERPRET_BLOCK, 4, 1
    else:
        tile = _GPU_EDGED.get((dtype, bd)) if edged else None
        bm, bn, w, st = tile or _GPU_TABLE[dtype][bd]
    dot = (dtype, bd, edged) in _ROWSUM_DOT
    cfg = AttnConfig(block_m or bm, block_n or bn, bd, num_warps or w, num_stages or st, bdv, dot)
    for name in ("block_m", "block_n"):
        val = getattr(cfg, name)
        if val < 16 or val & (val - 1):
            raise ValueError(f"{name}={val} must be a power of two >= 16")
    return cfg


def _sm_count() -> int:
    return torch.cuda.get_device_properties(DEVICE).multi_processor_count


def auto_splits(programs: int, n: int, block_n: int) -> int:
    """Split-KV for decode-shaped problems on the GPU (FlashAttention's num_splits=0): enough
    splits for one wave, at most one program per SM, each split at least 2 key blocks. 1 under
    the interpreter (no SMs to fill). A wave and a bit is the worst case: on an H200 (132 SMs;
    decode, 64K-128K keys, groups 4 and 8, so 32 and 16 programs) 5 and 9 splits ran at 0.56-0.71
    of copy, 4 and 8 splits at 0.89-1.01 (reports/attention_bench.md); two per SM (9 and 17) at
    0.63-0.80. Two blocks, not four, since the merge runs in the same launch: at 1024 keys (groups
    4 and 8, fp16 and bf16, a CUDA graph on an H200) 4 splits of 2 blocks took 8.3-8.8 us against
    10.0-10.5 us for 2 splits of 4."""
    if INTERPRET or programs <= 0:
        return 1
    want = _sm_count() // programs
    return max(1, min(want, n // (2 * block_n), 128))

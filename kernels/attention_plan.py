"""The fused attention kernel's launch plan (`kernels/attention.py`): every launch argument that
is not a data pointer (grid, blocks, strides, scales, window edges, variant flags), computed from
the call's shapes, strides, dtypes and options and cached on them.

A decode call's kernel runs for tens of microseconds on an H200, and deriving these values in
Python on every call took several times that on the host (reports/attention_bench.md, launch
section). The plan is a pure function of hashable arguments, so a repeated call looks it up."""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
import torch

from ._common import INTERPRET, LOG2E, bf16_as_bits, by16, triton
from ._runtime import spec_key
from .attention_args import effective_scale, effective_softcap
from .attention_config import _DECODE_BLOCK_M, AttnConfig, attn_config, auto_splits

_GRID_YZ_MAX = 65535


@dataclass(frozen=True, eq=False)
class LaunchPlan:
    cfg: AttnConfig
    grid: tuple[int, int, int]
    splits: int
    mask_kind: int  # 0 none, 1 bool, 2 additive float
    args: tuple  # the kernel's arguments after its 11 pointers, in its order
    meta: dict  # constexprs and num_warps
    stage_key: tuple  # the variant, for the pipelining depth that fits (`_with_stages_that_fit`)
    replay_key: tuple  # `spec_key(args, meta)`, once per plan (`kernels/_runtime.py:launch`)
    workspace: tuple[int, int]  # split-KV: (arrival counters, fp32 state values); (0, 0) unsplit


def _wide(cfg: AttnConfig, *strides: tuple[int, ...]) -> bool:
    """Whether in-tile offsets ((BLOCK - 1) * |stride| summed over the tile's two dims) could
    exceed int32; then the kernel computes them in int64."""
    span = max(cfg.block_m, cfg.block_n, cfg.block_d, cfg.block_dv)
    return any(span * (abs(st[2]) + abs(st[3])) >= 2**31 for st in strides)


def _lead_strides(*strides: tuple[int, ...]) -> tuple[list[int], int]:
    """The kernel's stride arguments for 4-D q, k, v and o and STRIDE_MUL: batch, head and row
    strides through `by16` together, head-dim strides as they are."""
    lead, mul = by16(*(s for st in strides for s in st[:3]))
    return [x for i, st in enumerate(strides) for x in (*lead[3 * i:3 * i + 3], st[3])], mul


def edged_tile(causal: bool, window: tuple[int, int], bool_mask: bool) -> bool:
    """Whether a launch takes the edged tiles (`attn_config(edged=True)`): the kernel compiles an
    edge loop for a finite left edge and one for a right edge (causal: the right edge at the
    diagonal); a boolean mask masks the main loop's blocks, whose register cost is an edge loop's.
    The error bound's key blocking asks the same (kernels/specs.py:_attention_blocking)."""
    return window[0] >= 0 or window[1] >= 0 or causal or bool_mask


@functools.lru_cache(maxsize=1024)
def launch_plan(dtype: torch.dtype, q_shape, q_stride, k_shape, k_stride, v_shape, v_stride, o_shape, o_stride,
                mask: tuple | None, lse_stride: tuple | None, *, batch: int, m_max: int, n_max: int, varlen: bool,
                causal: bool, scale, has_kv_lens: bool, window: tuple[int, int], softcap, causal_align: str,
                return_lse: bool, num_splits: int, pack_gqa, block_m, block_n, num_warps, num_stages,
                rowsum_fp32: bool) -> LaunchPlan:
    """The plan for 4-D (B, H, seq, D) views of these shapes and strides (varlen: B = 1, seq the
    packed length); mask = (dtype, strides) of the (B, Hq, M, N) mask view or None, lse_stride
    the (B, Hq, M) lse's strides or None. Raises ValueError past the GPU's grid limits."""
    Hq, D = q_shape[1], q_shape[3]
    Hkv, Dv = k_shape[1], v_shape[3]
    group = Hq // Hkv
    left, right = window
    if causal:  # causal is the window's right edge at the diagonal
        right = 0
    short = m_max < _DECODE_BLOCK_M * 2  # decode-shaped: a few query rows per head
    pack = (group > 1 and short) if pack_gqa is None else bool(pack_gqa) and group > 1
    rows = m_max * group if pack else m_max
    # Short rows take the decode tile with or without packing: a 128-row tile for one query row
    # spends 128x the tensor-core and exp2 work on padding, which made an ungrouped decode
    # (Hq = Hkv) compute-bound on an H200 (0.67-0.77 of copy; 0.96-1.04 with the 16-row tile).
    decode_tile = (pack or short) and not INTERPRET
    mask_kind = 0 if mask is None else (1 if mask[0] == torch.bool else 2)
    left_edge, right_edge = left >= 0, right >= 0
    edged = edged_tile(causal, window, mask_kind == 1)
    cfg = attn_config(D, dtype, dv=Dv, n=n_max, edged=edged, block_m=block_m or (_DECODE_BLOCK_M if decode_tile else None),
                      block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    m_tiles = triton.cdiv(rows, cfg.block_m)
    heads = Hkv if pack else Hq
    if num_splits == 0:
        num_splits = auto_splits(m_tiles * batch * heads, n_max, cfg.block_n)
    n_blocks = max(1, triton.cdiv(n_max, cfg.block_n))
    splits = max(1, num_splits)
    # Whole key blocks per split; more splits than blocks leave the last ones empty (-inf states).
    keys_per_split = triton.cdiv(n_blocks, splits) * cfg.block_n
    sc = effective_scale(scale, D)
    cap = effective_softcap(softcap)
    mask_dtype, mask_stride = mask if mask is not None else (None, (0, 0, 0, 0))
    unit = 1.0 if mask_kind == 2 else LOG2E  # a float mask: natural units (kernels/attention.py)
    qk_scale = float(np.float32(sc * unit))
    cap_in = float(np.float32(sc / cap)) if cap > 0 else 1.0
    cap_out = float(np.float32(cap * unit)) if cap > 0 else 1.0
    ls = lse_stride if lse_stride is not None else (0, 0, 0)
    grid = (m_tiles, batch * heads, splits)
    if splits > 1:  # split s's partial state sits at s * PART_O (acc) and s * PART_L (m, l, l32)
        # PART_O rounded up to 16 elements and passed as PART_O / 16 (as STRIDE_MUL does for
        # strides): the kernel then knows the split's base keeps o's 16-byte alignment and stores
        # the partial acc in vectors. Offline (sm_90, fp16 D128 decode tile, 4 splits): 128
        # registers, against 186 with PART_O a runtime value (116 unsplit).
        numel = int(np.prod(o_shape))
        part_o = -(-numel // 16) * 16
        ps, part_l = tuple(s // Dv for s in o_stride[:3]), numel // Dv
        workspace = (grid[0] * grid[1], splits * (part_o + 3 * part_l))
    else:
        ps, part_o, part_l, workspace = (0, 0, 0), 0, 0, (0, 0)
    if batch * heads > _GRID_YZ_MAX or splits > _GRID_YZ_MAX:
        raise ValueError(f"batch * heads = {batch * heads} and num_splits = {splits} must be at most "
                         f"{_GRID_YZ_MAX} (the GPU's grid limit on its second and third axes)")
    strides, mul = _lead_strides(q_stride, k_stride, v_stride, o_stride)
    no_edge = m_max + n_max  # past every key (see the kernel's window arithmetic)
    meta = dict(
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d, BLOCK_DV=cfg.block_dv, STRIDE_MUL=mul,
        VARLEN=varlen, SOFTCAP=cap > 0, MASK_KIND=mask_kind,
        MASK_BF16_BITS=mask_kind == 2 and bf16_as_bits(mask_dtype), RETURN_LSE=return_lse,
        SPLIT=splits > 1, PACK_GQA=pack, BF16_BITS=bf16_as_bits(dtype), IS_FP32=dtype == torch.float32,
        EVEN_D=cfg.block_d == D, EVEN_DV=cfg.block_dv == Dv,
        WIDE=_wide(cfg, q_stride, k_stride, v_stride, o_stride, *((mask_stride,) if mask is not None else ())),
        ROWSUM_P32=rowsum_fp32, LEFT_EDGE=left_edge, RIGHT_EDGE=right_edge,
        KEY_TAIL=has_kv_lens or varlen or n_max % cfg.block_n != 0,
        ROWSUM_DOT=cfg.rowsum_dot and not rowsum_fp32, num_warps=cfg.num_warps,
        EDGE_STAGES=None if dtype == torch.float32 else 1,  # the kernel's edge-loop comment says why
    )
    args = (*strides, *mask_stride, *ls, *ps,
            Hq, Hkv, group, m_max, n_max, D, Dv, qk_scale, cap_in, cap_out,
            left if left >= 0 else no_edge, right if right >= 0 else no_edge,
            int(causal_align == "bottom_right"), int(has_kv_lens),
            int(right >= 0 and not pack and splits == 1), keys_per_split, part_o // 16, part_l)
    mk_dtype = torch.uint8 if mask_kind == 1 else (mask_dtype if mask_kind == 2 else dtype)
    return LaunchPlan(cfg, grid, splits, mask_kind, args, meta,
                      (dtype, cfg, mk_dtype, tuple(meta.items())), spec_key(args, meta), workspace)

"""Fused attention forward in Triton: O = softmax(scale * Q K^T + mask) V.

Semantics (NUMERICS.md sections 1-2):
- q (B, H, M, D), k and v (B, H, N, D), any strides (BHSD, BSHD views, slices, offsets);
  fp16, bf16 or fp32; the output has q's dtype and a fresh contiguous BHSD layout.
- causal: query i sees keys j <= i (top-left aligned, as SDPA's is_causal=True), also for M != N.
- kv_lens (B,) integer: keys j >= kv_lens[b] do not exist for batch b. Their K and V lanes are
  loaded as 0 (masked loads) and their scores forced to -inf with `tl.where`, so NaN or garbage
  stored there never reaches the output (no 0 * NaN).
- A query row that sees no key (kv_lens[b] == 0, or N == 0) gives an output row of exact zeros.
- NaN in a visible key gives NaN in every row that sees it; NaN in a visible value gives NaN in
  its column of every row that sees it. Under causal masking a NaN stored in V[j] of a key that
  exists (j < kv_len) can also reach rows i < j of the same key block (0 * NaN in P @ V): the key
  is there, only hidden from that row, and every flash-style kernel (and SDPA's math path) does
  the same. Infinite Q/K inputs are not supported (rows whose every visible score is -inf give 0).

Arithmetic (the error model of `oracles.bounds.attention_error_bound`):
- scale: the value used is fl32(scale) (default fl32(1/sqrt(D))); log2(e) is folded in once,
  qk_scale = fl32(fl32(scale) * log2 e), and the online softmax works in base 2 (exp2).
- scores: one tl.dot per (query block, key block) over the whole head dim (D padded to a power
  of two with masked zero lanes: scores are never recomputed per output-column tile), fp32
  accumulation. fp16/bf16 products are exact in fp32. fp32 inputs use input_precision="ieee"
  (no tf32: the bound would have to be 2^-11 relative on the scores).
- online softmax: running max m, running sum l, fp32 accumulator; the rescale is -inf safe:
  while a row has seen only masked keys its max is -inf and the exponent reference is 0, so
  exp2(-inf - -inf) never happens.
- P is rounded to the 16-bit input dtype before P @ V for fp16/bf16 (P fp32 for fp32 inputs), and
  the row sum l is accumulated from that rounded P: the output is then an exact convex
  combination of V rows with the rounded weights, up to fp32 accumulation (V of all ones gives
  exactly 1 in fp16/bf16), and the P rounding error is u16 * sum_j p_j |v_j - o|.
- o = acc / l, rounded once to the output dtype.

Interpreter (CPU): `tl.dot` on bf16 is broken there (triton #11584) and the interpreter's bf16
casts are wrong, so bf16 data moves as int16 bits (`kernels._common` helpers), is widened to fp32
exactly, P is rounded to bf16 with an exact round-to-nearest-even bit trick, and the dots run on
fp32 operands. That is exact: bf16 x bf16 products have 16 significant bits and fp32 holds them,
so the fp32 dot of the widened operands equals the bf16 dot with fp32 accumulation. Only under
the interpreter; on the GPU bf16 goes to the tensor cores as bf16.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from ._runtime import on_input_device
from ._common import (
    DEVICE, INTERPRET, LOG2E, bf16_as_bits, check_float, kernel_view, load_f32_zero, store_f32, tl, triton,
)

MAX_HEAD_DIM = 256


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------

@triton.jit
def _round_bf16_in_f32(x):
    """x rounded to the nearest bf16 (ties to even), as an fp32 value. Exact bit arithmetic, used
    under the interpreter whose fp32 -> bf16 cast truncates. x >= 0 or NaN here (P values)."""
    b = x.to(tl.uint32, bitcast=True)
    r = (b + 0x7FFF + ((b >> 16) & 1)) & 0xFFFF0000
    r = tl.where(x != x, b | 0x00400000, r)
    return r.to(tl.float32, bitcast=True)


@triton.jit
def _load_tile(ptrs, mask, HAS_MASK: tl.constexpr, BF16_BITS: tl.constexpr):
    """Load a Q/K/V tile; masked lanes read +0. Under the interpreter bf16 arrives as int16 bits
    and is widened to fp32 exactly; otherwise the tile keeps its dtype (tensor cores)."""
    if BF16_BITS:
        return load_f32_zero(ptrs, mask, True)
    elif HAS_MASK:
        return tl.load(ptrs, mask=mask, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _attn_block(
    acc, l_i, m_i, q, k_ptrs, v_ptrs, start_n, skn, svn, offs_m, offs_n, n_valid, d_mask,
    qk_scale,
    MASKED: tl.constexpr, CAUSAL: tl.constexpr, EVEN_D: tl.constexpr,
    BF16_BITS: tl.constexpr, IS_FP32: tl.constexpr, ROWSUM_P32: tl.constexpr,
):
    """One key block of the online softmax. MASKED: the block holds keys past kv_len/N or keys
    hidden by the causal mask (the diagonal); unmasked blocks skip the key masks entirely."""
    cols = start_n + offs_n
    if MASKED:
        key_ok = cols < n_valid
        kmask = key_ok[None, :] & d_mask[:, None]
        vmask = key_ok[:, None] & d_mask[None, :]
    else:
        kmask = d_mask[:, None]
        vmask = d_mask[None, :]
    # K^T tile (BLOCK_D, BLOCK_N): hidden key lanes read 0, never the stored (maybe NaN) data.
    kt = _load_tile(k_ptrs + tl.cast(start_n, tl.int64) * skn, kmask, MASKED or not EVEN_D, BF16_BITS)
    if IS_FP32:
        s = tl.dot(q, kt, input_precision="ieee")
    else:
        s = tl.dot(q, kt)
    s = s * qk_scale  # log2 units
    if MASKED:
        vis = (cols < n_valid)[None, :]
        if CAUSAL:
            vis = vis & (cols[None, :] <= offs_m[:, None])
        s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # -inf safe: a row that has seen only masked keys keeps m = -inf; use 0 as its reference so
    # that exp2(-inf - 0) = 0 instead of exp2(-inf - -inf) = NaN.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_ref)
    p = tl.math.exp2(s - m_ref[:, None])
    v = _load_tile(v_ptrs + tl.cast(start_n, tl.int64) * svn, vmask, MASKED or not EVEN_D, BF16_BITS)
    if IS_FP32:
        pv_in = p
        p_sum = p
    elif BF16_BITS:
        # interpreter bf16: round P to bf16 exactly, keep it in fp32 for the (exact) fp32 dot
        pv_in = _round_bf16_in_f32(p)
        p_sum = pv_in
    else:
        pv_in = p.to(v.dtype)  # P rounded to the 16-bit input dtype: part of the error model
        p_sum = pv_in.to(tl.float32)
    if ROWSUM_P32:  # FlashAttention's convention: the row sum of the unrounded P (benchmarks only)
        p_sum = p
    l_i = l_i * alpha + tl.sum(p_sum, 1)
    acc = acc * alpha[:, None]
    if IS_FP32:
        acc = tl.dot(pv_in, v, acc, input_precision="ieee")
    else:
        acc = tl.dot(pv_in, v, acc)
    return acc, l_i, m_new


@triton.jit
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, kvlen_ptr,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
    H, M, N, D, qk_scale,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    CAUSAL: tl.constexpr, HAS_KVLEN: tl.constexpr, BF16_BITS: tl.constexpr, IS_FP32: tl.constexpr,
    EVEN_D: tl.constexpr, REVERSE_M: tl.constexpr, WIDE: tl.constexpr, ROWSUM_P32: tl.constexpr,
):
    pid_m = tl.program_id(0)
    if REVERSE_M:  # causal: the longest rows first, the cheap ones fill the tail
        pid_m = tl.num_programs(0) - 1 - pid_m
    pid_bh = tl.program_id(1)
    b = (pid_bh // H).to(tl.int64)
    h = (pid_bh % H).to(tl.int64)
    start_m = pid_m * BLOCK_M

    n_valid = N
    if HAS_KVLEN:
        n_valid = tl.minimum(tl.maximum(tl.load(kvlen_ptr + b).to(tl.int32), 0), N)

    offs_m = start_m + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < D

    # 64-bit offsets: the scalar bases (batch, head, first row of the block, first key of a
    # block) are int64; in-tile offsets are int32 unless a stride is so large that (BLOCK - 1) *
    # stride could pass 2^31 (WIDE, decided by the launcher). Pointers are formed once; the key
    # loop only adds a scalar.
    rm = tl.arange(0, BLOCK_M)
    rn = offs_n
    rd = offs_d
    if WIDE:
        rm = rm.to(tl.int64)
        rn = rn.to(tl.int64)
        rd = rd.to(tl.int64)
    row0 = start_m.to(tl.int64)
    q_ptrs = q_ptr + (b * sqb + h * sqh + row0 * sqm) + (rm[:, None] * sqm + rd[None, :] * sqd)
    k_ptrs = k_ptr + (b * skb + h * skh) + (rn[None, :] * skn + rd[:, None] * skd)
    v_ptrs = v_ptr + (b * svb + h * svh) + (rn[:, None] * svn + rd[None, :] * svd)
    q_mask = (offs_m < M)[:, None] & d_mask[None, :]
    q = _load_tile(q_ptrs, q_mask, True, BF16_BITS)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float32)

    # Key range: [0, hi). Blocks wholly below `full_end` need no key mask at all.
    hi = n_valid
    full_lim = n_valid
    if CAUSAL:
        row_end = tl.minimum(start_m + BLOCK_M, M)  # last row of the block + 1
        hi = tl.minimum(n_valid, row_end)
        full_lim = tl.minimum(n_valid, start_m + 1)  # keys every row of the block sees
    full_end = (full_lim // BLOCK_N) * BLOCK_N
    for start_n in range(0, full_end, BLOCK_N):
        acc, l_i, m_i = _attn_block(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, start_n, skn, svn, offs_m, offs_n, n_valid, d_mask, qk_scale,
            False, CAUSAL, EVEN_D, BF16_BITS, IS_FP32, ROWSUM_P32)
    for start_n in range(full_end, hi, BLOCK_N):
        acc, l_i, m_i = _attn_block(
            acc, l_i, m_i, q, k_ptrs, v_ptrs, start_n, skn, svn, offs_m, offs_n, n_valid, d_mask, qk_scale,
            True, CAUSAL, EVEN_D, BF16_BITS, IS_FP32, ROWSUM_P32)

    # Rows that saw no key have l == 0 and acc == 0: exact zeros. NaN rows keep NaN (NaN != 0).
    l_safe = tl.where(l_i == 0.0, 1.0, l_i)
    o = acc / l_safe[:, None]
    o_ptrs = o_ptr + (b * sob + h * soh + row0 * som) + (rm[:, None] * som + rd[None, :] * sod)
    store_f32(o_ptrs, o, q_mask, BF16_BITS)


# --------------------------------------------------------------------------------------------
# Launch configuration
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AttnConfig:
    block_m: int
    block_n: int
    block_d: int
    num_warps: int
    num_stages: int


# GPU table keyed on (dtype, padded head dim): (BLOCK_M, BLOCK_N, num_warps, num_stages), from
# sweeps on an H200 (reports/bench_attention.py --sweep, S = 4096; TFLOP/s non-causal/causal):
# fp16 D64 (128, 64, 8, 3) 356/318; fp16 D128 (128, 128, 8, 3) 432/376; bf16 D64 (64, 64, 4, 3)
# 321/277 (the (128, 64, 8, 3) tile: 299/255); bf16 D128 (128, 128, 8, 3) 378/333. D <= 32 and
# D = 256 were not swept.
_GPU_TABLE = {
    torch.float16: {16: (128, 64, 8, 3), 32: (128, 64, 8, 3), 64: (128, 64, 8, 3), 128: (128, 128, 8, 3),
                    256: (64, 64, 4, 2)},
    torch.bfloat16: {16: (64, 64, 4, 3), 32: (64, 64, 4, 3), 64: (64, 64, 4, 3), 128: (128, 128, 8, 3),
                     256: (64, 64, 4, 2)},
    # fp32 ieee dots run on the CUDA cores: small tiles
    torch.float32: {16: (64, 32, 4, 2), 32: (64, 32, 4, 2), 64: (64, 32, 4, 2), 128: (32, 32, 4, 2),
                    256: (32, 16, 4, 1)},
}
_INTERPRET_BLOCK = 32  # the interpreter's cost is per operation: few, large blocks


def attn_config(d: int, dtype: torch.dtype, *, block_m: int | None = None, block_n: int | None = None,
                num_warps: int | None = None, num_stages: int | None = None) -> AttnConfig:
    """Block sizes for head dim d and dtype; keyword overrides win (powers of two >= 16)."""
    bd = max(16, triton.next_power_of_2(d))
    if INTERPRET:
        bm, bn, w, st = _INTERPRET_BLOCK, _INTERPRET_BLOCK, 4, 1
    else:
        bm, bn, w, st = _GPU_TABLE[dtype][bd]
    cfg = AttnConfig(block_m or bm, block_n or bn, bd, num_warps or w, num_stages or st)
    for name in ("block_m", "block_n"):
        val = getattr(cfg, name)
        if val < 16 or val & (val - 1):
            raise ValueError(f"{name}={val} must be a power of two >= 16")
    return cfg


# --------------------------------------------------------------------------------------------
# Validation and the public function
# --------------------------------------------------------------------------------------------

def effective_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale the kernel multiplies scores by: fl32(scale), default fl32(1/sqrt(D)).
    The oracle computes with exactly this value (NUMERICS.md section 3)."""
    s = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    return float(np.float32(s))


def _check_inputs(q, k, v, causal, scale, kv_lens) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(name, t)
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (B, H, seq, D), got {t.dim()}-D with shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")
    B, H, M, D = q.shape
    if tuple(k.shape) != tuple(v.shape):
        raise ValueError(f"k and v must have the same shape (B, H, N, D), got {tuple(k.shape)} and {tuple(v.shape)}")
    if k.shape[0] != B or k.shape[1] != H:
        raise ValueError(f"batch/heads differ: q {tuple(q.shape)}, k {tuple(k.shape)} (no broadcasting, no GQA)")
    if k.shape[3] != D:
        raise ValueError(f"head dims differ: q has D={D}, k/v have D={k.shape[3]}")
    if not 1 <= D <= MAX_HEAD_DIM:
        raise ValueError(f"head dim D={D} is not supported; 1 <= D <= {MAX_HEAD_DIM}")
    if max(M, k.shape[2]) >= 2**31 or B * H >= 2**31:
        raise ValueError("sequence lengths and B*H must be below 2^31")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, not {type(causal).__name__}")
    if scale is not None:
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.floating, np.integer)):
            raise TypeError(f"scale must be a real number or None, not {type(scale).__name__}")
        if not math.isfinite(float(scale)):
            raise ValueError(f"scale must be finite, got {scale}")
        if not math.isfinite(float(np.float32(float(scale)))):
            raise ValueError(f"scale {scale} overflows fp32")
    if kv_lens is not None:
        if not isinstance(kv_lens, torch.Tensor):
            raise TypeError(f"kv_lens must be an integer torch.Tensor of shape (B,), not {type(kv_lens).__name__}")
        if kv_lens.dtype.is_floating_point or kv_lens.dtype.is_complex or kv_lens.dtype == torch.bool:
            raise TypeError(f"kv_lens must have an integer dtype, got {kv_lens.dtype}")
        if tuple(kv_lens.shape) != (B,):
            raise ValueError(f"kv_lens must have shape (B,) = ({B},), got {tuple(kv_lens.shape)}")
        if kv_lens.device != q.device:
            raise ValueError(f"kv_lens is on {kv_lens.device}, q on {q.device}")
        if B:
            # Validating values needs their contents: one small device-to-host copy (a sync).
            lo, hi = int(kv_lens.min()), int(kv_lens.max())
            n = k.shape[2]
            if lo < 0 or hi > n:
                raise ValueError(f"kv_lens values must lie in [0, N] = [0, {n}], got min {lo}, max {hi}")


def _wide(cfg: AttnConfig, *ts: torch.Tensor) -> bool:
    """Whether in-tile offsets ((BLOCK - 1) * |stride| summed over the tile's two dims) could
    exceed int32; then the kernel computes them in int64."""
    span = max(cfg.block_m, cfg.block_n, cfg.block_d)
    return any(span * (abs(t.stride(2)) + abs(t.stride(3))) >= 2**31 for t in ts)


@on_input_device
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    kv_lens: torch.Tensor | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    _rowsum_fp32: bool = False,
) -> torch.Tensor:
    """softmax(scale * q k^T + mask) v for q (B, H, M, D), k and v (B, H, N, D).

    causal: query i sees keys j <= i (top-left, as SDPA is_causal=True); kv_lens (B,) integer
    tensor: keys j >= kv_lens[b] are absent; rows with no visible key give zeros. The launch
    knobs (block_m, block_n, num_warps, num_stages) override the table; block_m, num_warps and
    num_stages change no arithmetic (see KernelSpec.configs), block_n does (the online-softmax
    blocking). `_rowsum_fp32` (benchmarks only, outside the contract): sum the unrounded P into
    l as FlashAttention does, instead of the rounded P that makes V of all ones give exactly 1.
    Returns a new contiguous (B, H, M, D) tensor of q's dtype.
    """
    _check_inputs(q, k, v, causal, scale, kv_lens)
    B, H, M, D = q.shape
    N = k.shape[2]
    o = torch.empty((B, H, M, D), dtype=q.dtype, device=q.device)
    if o.numel() == 0:
        return o
    cfg = attn_config(D, q.dtype, block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    sc = effective_scale(scale, D)
    qk_scale = float(np.float32(sc * LOG2E))
    bits = bf16_as_bits(q.dtype)
    qk_, kk_, vk_, ok_ = kernel_view(q), kernel_view(k), kernel_view(v), kernel_view(o)
    kvl = kv_lens.contiguous() if kv_lens is not None else o  # o: any pointer, unused without HAS_KVLEN
    grid = (triton.cdiv(M, cfg.block_m), B * H)
    _attn_fwd_kernel[grid](
        qk_, kk_, vk_, ok_, kvl,
        *q.stride(), *k.stride(), *v.stride(), *o.stride(),
        H, M, N, D, qk_scale,
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d,
        CAUSAL=bool(causal), HAS_KVLEN=kv_lens is not None, BF16_BITS=bits,
        IS_FP32=q.dtype == torch.float32, EVEN_D=cfg.block_d == D, REVERSE_M=bool(causal),
        WIDE=_wide(cfg, q, k, v, o), ROWSUM_P32=bool(_rowsum_fp32),
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return o


__all__ = ["attention", "attn_config", "effective_scale", "AttnConfig", "MAX_HEAD_DIM", "DEVICE"]

"""Fused attention forward in Triton: O = softmax(scale * Q K^T + mask) V.

Semantics (NUMERICS.md sections 1-2):
- q (B, Hq, M, D), k (B, Hkv, N, D), v (B, Hkv, N, Dv), any strides (BHSD, BSHD views, slices,
  offsets); fp16, bf16 or fp32; the output has q's dtype and a fresh contiguous (B, Hq, M, Dv)
  layout. GQA/MQA: Hq % Hkv == 0, query head h reads key/value head h // (Hq // Hkv).
  `attention_varlen` takes packed sequences (cu_seqlens, int32) through the same kernel: each
  program reads its sequence's offsets, nothing crosses a boundary.
- Visibility: key j of row i exists when j < n (n = kv_lens[b] or N; the sequence's length in
  varlen) and is seen when i + off - left <= j <= i + off + right, off = 0 (top-left) or n - M
  (bottom-right), left/right = -1 unlimited, causal = right 0; attn_mask (bool: True takes part;
  float: an additive bias, -inf hides) on top. Absent keys' K and V lanes are loaded as 0
  (masked loads) and every hidden score is forced to -inf with `tl.where`, so NaN or garbage
  stored past n, past N or in another sequence never reaches the output (no 0 * NaN).
- A query row that sees no key gives an output row of exact zeros and lse = -inf.
- NaN in a visible key gives NaN in every row that sees it; NaN in a visible value gives NaN in
  its column of every row that sees it. A NaN stored in V[j] of a key that exists but is hidden
  from some rows (causal, window, attn_mask) can also reach those rows when they share its key
  block (0 * NaN in P @ V): every flash-style kernel (and SDPA's math path) does the same.
  Infinite Q/K inputs are not supported (rows whose every visible score is -inf give 0).

Arithmetic (the error model of `oracles.bounds.attention_error_bound`):
- scale: the value used is fl32(scale) (default fl32(1/sqrt(D))); log2(e) is folded in once,
  qk_scale = fl32(fl32(scale) * log2 e), and the online softmax works in base 2 (exp2).
- softcap c: t = tanh(s * fl32(sc / c)) * fl32(c log2 e), tanh from exp2 (`_tanh`, <= 12u
  relative).
- a float attn_mask: scores stay in natural units (t = fl(fl(s sc) + bias), softcap's factor c
  instead of fl32(c log2 e)) and log2 e is applied to each difference, exp2(fl(t - m) * log2 e),
  so a finite bias of any size works: a row masked whole by `finfo(float32).min` would overflow
  to -inf in base 2 (|b| log2 e > 3.4e38) and come out empty; in natural units it is the
  softmax of its scores (the bias cancels), with lse = m + ln l.
- scores: one tl.dot per (query block, key block) over the whole head dim (D padded to a power
  of two with masked zero lanes: scores are never recomputed per output-column tile), fp32
  accumulation. fp16/bf16 products are exact in fp32. fp32 inputs use input_precision="ieee"
  (no tf32: the bound would have to be 2^-11 relative on the scores).
- online softmax: running max m, running sum l, fp32 accumulator; the rescale is -inf safe:
  while a row has seen only masked keys its max is -inf and the exponent reference is 0, so
  exp2(-inf - -inf) never happens. Only key blocks some row of the tile can see are visited
  (windows and causal skip the rest); blocks every row sees entirely skip the masks.
- P is rounded to the 16-bit input dtype before P @ V for fp16/bf16 (P fp32 for fp32 inputs), and
  the row sum l is accumulated from that rounded P (by tl.sum, or where attention_config's
  _ROWSUM_DOT says so by P @ ones on the tensor cores): the output is then an exact convex
  combination of V rows with the rounded weights, up to fp32 accumulation (V of all ones gives
  exactly 1 in fp16/bf16), and the P rounding error is u16 * sum_j p_j |v_j - o|. The lse uses a
  second row sum of the unrounded P (only when asked): lse = (m + log2 l32) ln 2.
- split-KV: split s covers whole key blocks [s K, (s + 1) K) and writes its unnormalised state
  (acc, m, l) in fp32; the tile's last split to finish (an arrival counter) combines them, in
  split order, exactly as the online softmax combines blocks (one more rescale per split), -inf
  safe for empty splits: one launch (kernels/attention_merge.py). The key blocking is the same
  as without splits, so the bound only grows by the extra rescales.
- GQA packing (decode): with a short M, one program takes every query head of a group (rows =
  (head, query) pairs), so K and V are read once per group; the tile may straddle heads.
- o = acc / l, rounded once to the output dtype.

Interpreter (CPU): `tl.dot` on bf16 is broken there (triton #11584) and the interpreter's bf16
casts are wrong, so bf16 data moves as int16 bits (`kernels._common` helpers), is widened to fp32
exactly, P is rounded to bf16 with an exact round-to-nearest-even bit trick, and the dots run on
fp32 operands. That is exact: bf16 x bf16 products have 16 significant bits and fp32 holds them,
so the fp32 dot of the widened operands equals the bf16 dot with fp32 accumulation. Only under
the interpreter; on the GPU bf16 goes to the tensor cores as bf16.
"""
from __future__ import annotations

import torch

from ._runtime import launch, on_input_device
from ._common import (
    DEVICE, LOG2E, kernel_view, load_f32_zero, store_f32, tl, triton,
)
from .attention_args import (
    MAX_HEAD_DIM, _check_inputs, _check_launch, _check_options, _check_packed, _check_sequences,
    _mask_view, effective_scale, effective_softcap, normalize_window,
)
from .attention_config import AttnConfig, attn_config, auto_splits
from .attention_merge import _arrive, _merge_splits_tile, _split_states, split_workspace
from .attention_plan import launch_plan
from triton.runtime.errors import OutOfResources  # noqa: E402  (after _runtime: it sets TRITON_INTERPRET)


# --------------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------------

# Cephes tanhf: odd polynomial for |x| < 0.625 (relative error ~2.2 ulp), 1 - 2 / (e^2x + 1) above
# (no cancellation there: tanh >= 0.55). libdevice.tanh would do on the GPU but the interpreter
# has none; this one serves both and its error (<= 12u relative) is in the bound.
_TANH_SPLIT = tl.constexpr(0.625)
_TWO_LOG2E = tl.constexpr(2.0 * LOG2E)


@triton.jit
def _tanh(x):
    ax = tl.abs(x)
    z = ax * ax
    small = ((((-5.70498872745e-3 * z + 2.06390887954e-2) * z - 5.37397155531e-2) * z
              + 1.33314422036e-1) * z - 3.33332819422e-1) * z * ax + ax
    big = 1.0 - 2.0 / (tl.math.exp2(ax * _TWO_LOG2E) + 1.0)
    t = tl.where(ax < _TANH_SPLIT, small, big)
    return tl.where(x < 0, -t, t)  # NaN stays NaN


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
    acc, l_i, l32, m_i, q, k_ptrs, v_ptrs, mask_ptrs, start_n, skn, svn, smn,
    pos_m, row_ok, offs_n, n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out, ones,
    EDGE: tl.constexpr, TAIL: tl.constexpr, SOFTCAP: tl.constexpr,
    MASK_KIND: tl.constexpr, MASK_BF16_BITS: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    BF16_BITS: tl.constexpr, IS_FP32: tl.constexpr, ROWSUM_P32: tl.constexpr, RETURN_LSE: tl.constexpr,
    ROWSUM_DOT: tl.constexpr,
):
    """One key block of the online softmax. TAIL: the block may hold keys past kv_len/N (their
    loads are masked); EDGE: some row of the tile may not see some of its keys (window/causal
    edges, attn_mask), so scores are masked; a block with neither skips every key mask. Row i
    sees key j iff j < n_valid, pos_i + lo_off <= j <= pos_i + hi_off (an absent window edge is
    an offset past every key) and attn_mask allows it. A causal diagonal block inside n_valid is
    EDGE only: its loads stay unmasked (full vector width)."""
    MASKED: tl.constexpr = EDGE or TAIL
    cols = start_n + offs_n
    # With EVEN_D/EVEN_DV every head-dim lane exists: leave d_mask out of the load masks. D is a
    # runtime value, so a mask built from it has no known constancy along the contiguous head
    # dim and the masked loads lose their vector width: ptxas then gave the D64 fp16 kernel 199
    # registers instead of 128 (one CTA per SM instead of two).
    if TAIL:
        key_ok = cols < n_valid
        if EVEN_D:
            kmask = key_ok[None, :]
        else:
            kmask = key_ok[None, :] & d_mask[:, None]
        if EVEN_DV:
            vmask = key_ok[:, None]
        else:
            vmask = key_ok[:, None] & dv_mask[None, :]
    else:
        kmask = d_mask[:, None]
        vmask = dv_mask[None, :]
    # K^T tile (BLOCK_D, BLOCK_N): hidden key lanes read 0, never the stored (maybe NaN) data.
    kt = _load_tile(k_ptrs + tl.cast(start_n, tl.int64) * skn, kmask, TAIL or not EVEN_D, BF16_BITS)
    if IS_FP32:
        s = tl.dot(q, kt, input_precision="ieee")
    else:
        s = tl.dot(q, kt)
    if SOFTCAP:  # c tanh(sc s / c), in log2 units: tanh(s * fl(sc/c)) * fl(c log2 e)
        s = _tanh(s * cap_in) * cap_out
    else:
        s = s * qk_scale  # log2 units (natural with a float mask: the launcher's qk_scale)
    if MASK_KIND == 2:  # additive bias, after scale and softcap, in natural units (module doc)
        if TAIL:
            bmask = row_ok[:, None] & key_ok[None, :]
        else:
            bmask = row_ok[:, None]
        bias = load_f32_zero(mask_ptrs + tl.cast(start_n, tl.int64) * smn, bmask, MASK_BF16_BITS)
        s = s + bias
    if MASKED:
        vis = (cols[None, :] >= pos_m[:, None] + lo_off) & (cols[None, :] <= pos_m[:, None] + hi_off)
        if TAIL:
            vis = vis & key_ok[None, :]
            keep_ok = row_ok[:, None] & key_ok[None, :]
        else:
            keep_ok = row_ok[:, None]
        if MASK_KIND == 1:
            keep = tl.load(mask_ptrs + tl.cast(start_n, tl.int64) * smn, mask=keep_ok, other=0)
            vis = vis & (keep != 0)
        s = tl.where(vis, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    # -inf safe: a row that has seen only masked keys keeps m = -inf; use 0 as its reference so
    # that exp2(-inf - 0) = 0 instead of exp2(-inf - -inf) = NaN.
    m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    if MASK_KIND == 2:  # natural units: the difference first, then log2 e (never overflows)
        alpha = tl.math.exp2((m_i - m_ref) * 1.4426950408889634)
        p = tl.math.exp2((s - m_ref[:, None]) * 1.4426950408889634)
    else:
        alpha = tl.math.exp2(m_i - m_ref)
        p = tl.math.exp2(s - m_ref[:, None])
    v = _load_tile(v_ptrs + tl.cast(start_n, tl.int64) * svn, vmask, TAIL or not EVEN_DV, BF16_BITS)
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
    if ROWSUM_DOT:
        l_i = tl.dot(pv_in, ones, l_i * alpha[:, None])
    else:
        l_i = l_i * alpha + tl.sum(p_sum, 1)
    if RETURN_LSE:  # the log-sum-exp wants the unrounded weights
        l32 = l32 * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    if IS_FP32:
        acc = tl.dot(pv_in, v, acc, input_precision="ieee")
    else:
        acc = tl.dot(pv_in, v, acc)
    return acc, l_i, l32, m_new


# Compiled once per feature set, not once per shape: sizes, window edges, the key-length, causal
# alignment and tile-order switches, and the batch/head/row strides are runtime values, so one
# binary serves every length and layout of a feature set (a first GPU run compiles tens of
# variants, not hundreds). What the 16-byte loads need survives as one constexpr: STRIDE_MUL is 16
# when every batch/head/row stride of q, k, v and o is a multiple of 16 (the launcher passes
# stride // 16, the kernel multiplies back, and Triton's alignment analysis sees the factor), else
# 1. Head-dim and mask-key strides keep their == 1 specialisation (contiguous rows); the other
# strides of masks and fp32 side outputs are runtime values (no vector width rides on them);
# EVEN_D/EVEN_DV and the blocking are constexprs; unmasked key blocks carry no key mask.
@triton.jit(do_not_specialize=["sqb", "sqh", "sqm", "skb", "skh", "skn", "svb", "svh", "svn", "sob", "soh", "som",
                               "HQ", "HKV", "GROUP", "M", "N", "D", "DV", "LEFT", "RIGHT", "BOTTOM_RIGHT",
                               "HAS_KVLEN", "REVERSE_M", "KEYS_PER_SPLIT", "PART_O16", "PART_L",
                               "smb", "smh", "smm", "slb", "slh", "slm", "spb", "sph", "spm"],
            do_not_specialize_on_alignment=["sqd", "skd", "svd", "sod", "smn"])
def _attn_fwd_kernel(
    q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, kvlen_ptr, cuq_ptr, cuk_ptr, mask_ptr, ws_ptr, counter_ptr,
    sqb, sqh, sqm, sqd, skb, skh, skn, skd, svb, svh, svn, svd, sob, soh, som, sod,
    smb, smh, smm, smn, slb, slh, slm, spb, sph, spm,
    HQ, HKV, GROUP, M, N, D, DV, qk_scale, cap_in, cap_out, LEFT, RIGHT, BOTTOM_RIGHT, HAS_KVLEN, REVERSE_M,
    KEYS_PER_SPLIT, PART_O16, PART_L,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    STRIDE_MUL: tl.constexpr, VARLEN: tl.constexpr, SOFTCAP: tl.constexpr, MASK_KIND: tl.constexpr,
    MASK_BF16_BITS: tl.constexpr, RETURN_LSE: tl.constexpr, SPLIT: tl.constexpr, PACK_GQA: tl.constexpr,
    BF16_BITS: tl.constexpr, IS_FP32: tl.constexpr, EVEN_D: tl.constexpr, EVEN_DV: tl.constexpr,
    WIDE: tl.constexpr, ROWSUM_P32: tl.constexpr, LEFT_EDGE: tl.constexpr, RIGHT_EDGE: tl.constexpr,
    KEY_TAIL: tl.constexpr, ROWSUM_DOT: tl.constexpr, EDGE_STAGES: tl.constexpr,
):
    sqb, sqh, sqm = sqb * STRIDE_MUL, sqh * STRIDE_MUL, sqm * STRIDE_MUL
    skb, skh, skn = skb * STRIDE_MUL, skh * STRIDE_MUL, skn * STRIDE_MUL
    svb, svh, svn = svb * STRIDE_MUL, svh * STRIDE_MUL, svn * STRIDE_MUL
    sob, soh, som = sob * STRIDE_MUL, soh * STRIDE_MUL, som * STRIDE_MUL
    pid_m = tl.program_id(0)
    # REVERSE_M (causal): the longest rows first, the cheap ones fill the tail
    pid_m = pid_m + REVERSE_M * (tl.num_programs(0) - 1 - 2 * pid_m)
    pid_bh = tl.program_id(1)
    split = tl.program_id(2)
    if PACK_GQA:  # one program per (batch, kv head): the tile's rows run over (group head, query)
        b = (pid_bh // HKV).to(tl.int64)
        hkv = (pid_bh % HKV).to(tl.int64)
        h = hkv * GROUP
    else:
        b = (pid_bh // HQ).to(tl.int64)
        h = (pid_bh % HQ).to(tl.int64)
        hkv = h // GROUP

    # This sequence: queries [q0, q0 + m_len), keys [k0, k0 + n_len) of the packed tensors.
    q0 = tl.zeros((), tl.int64)
    k0 = tl.zeros((), tl.int64)
    m_len = M
    n_len = N
    if VARLEN:
        q0 = tl.load(cuq_ptr + b).to(tl.int64)
        k0 = tl.load(cuk_ptr + b).to(tl.int64)
        m_len = (tl.load(cuq_ptr + b + 1) - tl.load(cuq_ptr + b)).to(tl.int32)
        n_len = (tl.load(cuk_ptr + b + 1) - tl.load(cuk_ptr + b)).to(tl.int32)
        b = b * 0  # packed tensors have no batch dimension
    # kv_lens[b], or the launcher's one-element stand-in (index 0) when there is none
    kv_len = tl.load(kvlen_ptr + b * HAS_KVLEN).to(tl.int32)
    n_valid = tl.where(HAS_KVLEN != 0, tl.minimum(tl.maximum(kv_len, 0), n_len), n_len)
    rows_total = m_len
    if PACK_GQA:
        rows_total = m_len * GROUP
    start_m = pid_m * BLOCK_M
    if start_m >= rows_total:  # varlen: a short sequence in a grid sized for the longest
        return

    r = start_m + tl.arange(0, BLOCK_M)
    row_ok = r < rows_total
    offs_n = tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    d_mask = offs_d < D
    dv_mask = offs_dv < DV

    # 64-bit offsets: the scalar bases (batch, head, first row of the block, first key of a
    # block) are int64; in-tile offsets are int32 unless a stride is so large that (BLOCK - 1) *
    # stride could pass 2^31 (WIDE, decided by the launcher). Pointers are formed once; the key
    # loop only adds a scalar.
    rn = offs_n
    rd = offs_d
    rdv = offs_dv
    if WIDE:
        rn = rn.to(tl.int64)
        rd = rd.to(tl.int64)
        rdv = rdv.to(tl.int64)
    if PACK_GQA:
        head_r = h + (r // m_len).to(tl.int64)
        pos_m = tl.where(row_ok, r % m_len, 0)
        q_rows = head_r * sqh + (q0 + pos_m.to(tl.int64)) * sqm
        o_rows = head_r * soh + (q0 + pos_m.to(tl.int64)) * som
        r0 = tl.min(tl.where(row_ok, pos_m, m_len), 0)
        r1 = tl.max(tl.where(row_ok, pos_m, -1), 0)
    else:
        head_r = h + tl.zeros((BLOCK_M,), tl.int64)
        pos_m = r
        rm = tl.arange(0, BLOCK_M)
        if WIDE:
            rm = rm.to(tl.int64)
        row0 = (q0 + start_m).to(tl.int64)
        q_rows = h * sqh + row0 * sqm + rm * sqm
        o_rows = h * soh + row0 * som + rm * som
        r0 = start_m
        r1 = tl.minimum(start_m + BLOCK_M, m_len) - 1
    q_ptrs = q_ptr + b * sqb + (q_rows[:, None] + rd[None, :] * sqd)
    k_ptrs = k_ptr + (b * skb + hkv * skh + k0 * skn) + (rn[None, :] * skn + rd[:, None] * skd)
    v_ptrs = v_ptr + (b * svb + hkv * svh + k0 * svn) + (rn[:, None] * svn + rdv[None, :] * svd)
    mask_ptrs = mask_ptr
    if MASK_KIND != 0:
        mask_ptrs = mask_ptr + b * smb + (head_r * smh + pos_m.to(tl.int64) * smm)[:, None] + rn[None, :] * smn
    if EVEN_D:
        q = _load_tile(q_ptrs, row_ok[:, None], True, BF16_BITS)
    else:
        q = _load_tile(q_ptrs, row_ok[:, None] & d_mask[None, :], True, BF16_BITS)

    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    # ROWSUM_DOT: l as (BLOCK_M, 16) equal columns of P @ ones, summed by the instruction that
    # sums P @ V (so V of all ones gives exactly 1); column 0 is taken after the loops.
    if ROWSUM_DOT:
        ones = tl.full((BLOCK_N, 16), 1.0, q.dtype)
        l_i = tl.zeros((BLOCK_M, 16), tl.float32)
    else:
        ones = 0.0  # unused
        l_i = tl.zeros((BLOCK_M,), tl.float32)
    l32 = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, BLOCK_DV), tl.float32)

    # Keys of the tile: [lo, hi); every row of the tile sees [full_lo, full_hi) (no key masks).
    # BOTTOM_RIGHT: the diagonal ends at the last key (query i is aligned with key i + n - m). An
    # absent window edge comes as M + N, past every key, so the same arithmetic gives [0, n_valid).
    off = (n_valid - m_len) * BOTTOM_RIGHT
    lo_off = off - LEFT
    hi_off = off + RIGHT
    lo = tl.maximum(r0 + lo_off, 0)
    full_lo = tl.maximum(r1 + lo_off, 0)
    hi = tl.maximum(tl.minimum(n_valid, r1 + hi_off + 1), 0)
    full_hi = tl.maximum(tl.minimum(n_valid, r0 + hi_off + 1), 0)
    if SPLIT:  # this program's share of the keys: whole blocks, so the blocking is unchanged
        s_lo = split * KEYS_PER_SPLIT
        lo = tl.maximum(lo, s_lo)
        hi = tl.minimum(hi, s_lo + KEYS_PER_SPLIT)
        full_lo = tl.maximum(full_lo, s_lo)
        full_hi = tl.minimum(full_hi, s_lo + KEYS_PER_SPLIT)
    lo_b = (lo // BLOCK_N) * BLOCK_N
    e1 = tl.minimum(tl.maximum(((full_lo + BLOCK_N - 1) // BLOCK_N) * BLOCK_N, lo_b), hi)
    f2 = tl.maximum((full_hi // BLOCK_N) * BLOCK_N, e1)
    # Edge blocks past the full range: those below the last whole block inside n_valid need no
    # load masks (a causal diagonal), the rest do. Loops the launcher knows to be empty are
    # compiled out (LEFT_EDGE: a finite left window edge; RIGHT_EDGE: causal or a finite right
    # edge; KEY_TAIL: kv_lens, varlen or N not a multiple of BLOCK_N): each loop's code costs
    # registers (the D64 fp16 kernel: 111 with the full loop alone, 199 with a masked one beside
    # it), and past 128 a 256-thread CTA no longer shares its SM. An edge loop runs a few blocks
    # (a window edge is BLOCK_M keys wide, the key tail one block), so for 16-bit inputs it is not
    # software-pipelined (EDGE_STAGES = 1): the pipeline's prologue, epilogue and buffers bought
    # nothing there and cost the main loop registers; on an H200 causal went 317 -> 351 TFLOP/s
    # (fp16 D64), 371 -> 406 (fp16 D128), 439 -> 470 (fp16 D128 S16384), bf16 3-9% (B4 H16 S4096,
    # one run, same bits). fp32 keeps the kernel's depth (EDGE_STAGES = None): unpipelined, ptxas
    # gave its D128 causal kernel 32 registers and a 5888-byte spill stack (reports/kernel_resources.py).
    # A boolean mask may hide any key, so it makes the main loop an edge loop (MAIN_EDGE: every
    # block masked, pipelined as before).
    MAIN_EDGE: tl.constexpr = MASK_KIND == 1
    f3 = tl.minimum(tl.maximum((n_valid // BLOCK_N) * BLOCK_N, f2), hi)
    if LEFT_EDGE:
        for start_n in tl.range(lo_b, e1, BLOCK_N, num_stages=EDGE_STAGES):
            acc, l_i, l32, m_i = _attn_block(
                acc, l_i, l32, m_i, q, k_ptrs, v_ptrs, mask_ptrs, start_n, skn, svn, smn, pos_m, row_ok, offs_n,
                n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out, ones,
                True, KEY_TAIL, SOFTCAP, MASK_KIND, MASK_BF16_BITS, EVEN_D, EVEN_DV,
                BF16_BITS, IS_FP32, ROWSUM_P32, RETURN_LSE, ROWSUM_DOT)
    for start_n in range(e1, f2, BLOCK_N):
        acc, l_i, l32, m_i = _attn_block(
            acc, l_i, l32, m_i, q, k_ptrs, v_ptrs, mask_ptrs, start_n, skn, svn, smn, pos_m, row_ok, offs_n,
            n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out, ones,
            MAIN_EDGE, False, SOFTCAP, MASK_KIND, MASK_BF16_BITS, EVEN_D, EVEN_DV,
            BF16_BITS, IS_FP32, ROWSUM_P32, RETURN_LSE, ROWSUM_DOT)
    if RIGHT_EDGE:
        for start_n in tl.range(f2, f3, BLOCK_N, num_stages=EDGE_STAGES):
            acc, l_i, l32, m_i = _attn_block(
                acc, l_i, l32, m_i, q, k_ptrs, v_ptrs, mask_ptrs, start_n, skn, svn, smn, pos_m, row_ok, offs_n,
                n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out, ones,
                True, False, SOFTCAP, MASK_KIND, MASK_BF16_BITS, EVEN_D, EVEN_DV,
                BF16_BITS, IS_FP32, ROWSUM_P32, RETURN_LSE, ROWSUM_DOT)
    if KEY_TAIL:
        for start_n in tl.range(f3, hi, BLOCK_N, num_stages=EDGE_STAGES):
            acc, l_i, l32, m_i = _attn_block(
                acc, l_i, l32, m_i, q, k_ptrs, v_ptrs, mask_ptrs, start_n, skn, svn, smn, pos_m, row_ok, offs_n,
                n_valid, lo_off, hi_off, d_mask, dv_mask, qk_scale, cap_in, cap_out, ones,
                True, True, SOFTCAP, MASK_KIND, MASK_BF16_BITS, EVEN_D, EVEN_DV,
                BF16_BITS, IS_FP32, ROWSUM_P32, RETURN_LSE, ROWSUM_DOT)

    if ROWSUM_DOT:
        l_i = tl.sum(tl.where(tl.arange(0, 16)[None, :] == 0, l_i, 0.0), 1)
    if EVEN_DV:
        o_mask = row_ok[:, None]
    else:
        o_mask = row_ok[:, None] & dv_mask[None, :]
    lse_rows = b * slb + head_r * slh + (q0 + pos_m.to(tl.int64)) * slm
    o_offs = b * sob + (o_rows[:, None] + rdv[None, :] * sod)
    finish = True
    if SPLIT:
        # The partial state (acc, m, l) of this split, unnormalised, fp32, in o's layout at
        # split * PART_O16 * 16 (acc) and o's row order at split * PART_L (m, l, l32); the last
        # split of the tile merges them (kernels/attention_merge.py), then ends as if unsplit.
        part_o = PART_O16.to(tl.int64) * 16  # written as a multiple of 16: the compiler sees the alignment
        acc_part, m_part, l_part, l32_part = _split_states(ws_ptr, part_o, PART_L)
        part_rows = b * spb + head_r * sph + (q0 + pos_m.to(tl.int64)) * spm
        split_l = split.to(tl.int64) * PART_L
        tl.store(m_part + split_l + part_rows, m_i, mask=row_ok)
        tl.store(l_part + split_l + part_rows, l_i, mask=row_ok)
        if RETURN_LSE:
            tl.store(l32_part + split_l + part_rows, l32, mask=row_ok)
        tl.store(acc_part + split.to(tl.int64) * part_o + o_offs, acc, mask=o_mask)
        finish = _arrive(counter_ptr + (pid_bh * tl.num_programs(0) + tl.program_id(0)))
        if finish:
            acc, l_i, l32, m_i = _merge_splits_tile(
                acc_part, m_part, l_part, l32_part, part_rows, o_offs, row_ok, o_mask, part_o,
                PART_L, BLOCK_M, BLOCK_DV, RETURN_LSE, MASK_KIND == 2)
    if finish:
        # Rows that saw no key have l == 0 and acc == 0: exact zeros. NaN rows keep NaN (NaN != 0).
        l_safe = tl.where(l_i == 0.0, 1.0, l_i)
        o = acc / l_safe[:, None]
        store_f32(o_ptr + o_offs, o, o_mask, BF16_BITS)
        if RETURN_LSE:
            if MASK_KIND == 2:  # m in natural units
                lse = m_i + tl.math.log2(l32) * 0.6931471805599453
            else:
                lse = (m_i + tl.math.log2(l32)) * 0.6931471805599453
            tl.store(lse_ptr + lse_rows, tl.where(l32 == 0.0, float("-inf"), lse), mask=row_ok)


# Pipelining depth that compiled within shared memory, per kernel variant: a mask tile adds a
# buffer per stage, so the table's depth can pass the 227 KB of an H100/H200 (D 128 with a mask:
# 256 KB at 3 stages). Fewer stages change no arithmetic.
_STAGES_THAT_FIT: dict[tuple, int] = {}


def _with_stages_that_fit(run, key: tuple, stages: int, *, fixed: bool) -> None:
    known = _STAGES_THAT_FIT.get(key)
    stages = known or stages
    while True:
        try:
            run(stages)
        except OutOfResources:
            if fixed or stages <= 1:  # the caller asked for this depth, or nothing smaller exists
                raise
            stages -= 1
            continue
        if stages != known:
            _STAGES_THAT_FIT[key] = stages
        return


_NONE_I32: dict[torch.device, torch.Tensor] = {}


def _none_i32(device: torch.device) -> torch.Tensor:
    """A one-element int32 stand-in per device, made once: a fresh `torch.zeros` per call cost a
    fill kernel and an allocation on every launch (decode calls are launch-bound). Never written."""
    t = _NONE_I32.get(device)
    if t is None:
        t = _NONE_I32[device] = torch.zeros(1, dtype=torch.int32, device=device)
    return t


def _launch(q4, k4, v4, o4, lse3, *, batch: int, m_max: int, n_max: int, cu_q, cu_k, causal, scale, kv_lens,
            window, softcap, causal_align, mask4, return_lse, num_splits, pack_gqa, block_m, block_n,
            num_warps, num_stages, rowsum_fp32) -> None:
    """Run the forward on 4-D views (B, H, seq, D) (varlen: B = 1, seq = the packed length, and
    cu_q/cu_k give the sequences); writes o4 (and lse3). Everything but the data pointers comes
    from `launch_plan`, cached on the call's shapes, strides and options."""
    plan = launch_plan(
        q4.dtype, q4.shape, q4.stride(), k4.shape, k4.stride(), v4.shape, v4.stride(), o4.shape, o4.stride(),
        None if mask4 is None else (mask4.dtype, mask4.stride()), None if lse3 is None else lse3.stride(),
        batch=batch, m_max=m_max, n_max=n_max, varlen=cu_q is not None, causal=causal, scale=scale,
        has_kv_lens=kv_lens is not None, window=normalize_window(window), softcap=softcap,
        causal_align=causal_align, return_lse=bool(return_lse), num_splits=num_splits, pack_gqa=pack_gqa,
        block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
        rowsum_fp32=bool(rowsum_fp32))
    if plan.mask_kind == 1:
        mk = mask4.view(torch.uint8)
    elif plan.mask_kind == 2:
        mk = kernel_view(mask4)
    else:
        mk = o4
    lse_t = lse3 if lse3 is not None else o4
    # int32 index tensors, one-element stand-ins when absent: the kernel's pointer types (and so
    # its compiled variant) do not depend on them
    none_i32 = _none_i32(o4.device)
    kvl = kv_lens.to(torch.int32).contiguous() if kv_lens is not None else none_i32
    cq = cu_q if cu_q is not None else none_i32
    ck = cu_k if cu_k is not None else none_i32
    if plan.splits > 1:  # the splits' states and the tiles' arrival counters (kernels/attention_merge.py)
        counters, ws = split_workspace(*plan.workspace, o4.device)
    else:
        ws = counters = o4

    def run(stages: int) -> None:
        launch(_attn_fwd_kernel, plan.grid,
               (kernel_view(q4), kernel_view(k4), kernel_view(v4), kernel_view(o4), lse_t, kvl, cq, ck, mk,
                ws, counters, *plan.args), {**plan.meta, "num_stages": stages}, key=(plan.replay_key, stages))

    _with_stages_that_fit(run, plan.stage_key, plan.cfg.num_stages, fixed=num_stages is not None)


def _needs_grad(q, k, v) -> bool:
    """Whether a call must be differentiable: the autograd path (kernels/attention_backward.py)."""
    return torch.is_grad_enabled() and (getattr(q, "requires_grad", False) or getattr(k, "requires_grad", False)
                                        or getattr(v, "requires_grad", False))


@on_input_device
def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    scale: float | None = None,
    kv_lens: torch.Tensor | None = None,
    window: tuple[int, int] | None = None,
    softcap: float = 0.0,
    causal_align: str = "top_left",
    attn_mask: torch.Tensor | None = None,
    return_lse: bool = False,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
    _rowsum_fp32: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """softmax(scale * q k^T + mask) v for q (B, Hq, M, D), k (B, Hkv, N, D), v (B, Hkv, N, Dv).

    Hq % Hkv == 0: query head h reads key/value head h // (Hq // Hkv). causal: query i sees keys
    j <= i + offset, offset 0 for causal_align="top_left" (SDPA) and n - M for "bottom_right"
    (FlashAttention >= 2.1; n = kv_lens[b] when given, else N). window=(left, right): query i sees
    keys i + offset - left <= j <= i + offset + right (-1: unlimited; causal sets right = 0).
    kv_lens (B,) integer tensor: keys j >= kv_lens[b] are absent. softcap c > 0: scores become
    c tanh(scores / c) after the scale. attn_mask broadcastable to (B, Hq, M, N): bool (True = the
    key takes part) or an additive float bias (after scale and softcap; -inf hides a key).
    Rows with no visible key give zeros (and lse -inf). return_lse: also the fp32 natural-log
    log-sum-exp (B, Hq, M) of the scores the row sees. num_splits > 1: split-KV (flash-decoding),
    each split a partial state, merged by the tile's last split in the same launch; 0: automatic
    (on the GPU for decode shapes, 1 under the interpreter). Launch knobs: pack_gqa (pack a
    group's query heads into one tile; None: when M is short), block_m and num_stages change no
    arithmetic; num_warps changes none under the interpreter, but on a GPU the fp32 row sum
    (tl.sum) follows the layout it sets (an H200 put an fp32 case 2.4e-7 apart at num_warps=1),
    within the bound; block_n and num_splits change the online-softmax blocking (tunings).
    `_rowsum_fp32` (benchmarks only, outside the contract): sum the unrounded P into l as
    FlashAttention does, instead of the rounded P that makes V of all ones give exactly 1.
    Returns a new contiguous (B, Hq, M, Dv) tensor of q's dtype (and lse when asked).
    Differentiable: with grad enabled and q, k or v requiring it, the call runs through the
    autograd Function of kernels/attention_backward.py (lse is then returned, not differentiable;
    an attn_mask that requires grad is refused); otherwise nothing of it is involved.
    """
    if _needs_grad(q, k, v):
        from .attention_backward import attention_autograd  # here: that module imports this one
        return attention_autograd(q, k, v, kv_lens=kv_lens, attn_mask=attn_mask, return_lse=return_lse, causal=causal,
                                  scale=scale, window=window, softcap=softcap, causal_align=causal_align,
                                  num_splits=num_splits, pack_gqa=pack_gqa, block_m=block_m, block_n=block_n,
                                  num_warps=num_warps, num_stages=num_stages, _rowsum_fp32=_rowsum_fp32)
    _check_inputs(q, k, v, causal, scale, kv_lens, window=window, softcap=softcap, causal_align=causal_align,
                  attn_mask=attn_mask, return_lse=return_lse, num_splits=num_splits)
    _check_launch(pack_gqa, block_m, block_n, num_warps, num_stages)
    B, Hq, M, D = q.shape
    N, Dv = k.shape[2], v.shape[3]
    o = torch.empty((B, Hq, M, Dv), dtype=q.dtype, device=q.device)
    lse = torch.full((B, Hq, M), float("-inf"), dtype=torch.float32, device=q.device) if return_lse else None
    if o.numel():
        mask4 = _mask_view(attn_mask, (B, Hq, M, N), q) if attn_mask is not None else None
        _launch(q, k, v, o, lse, batch=B, m_max=M, n_max=N, cu_q=None, cu_k=None, causal=causal, scale=scale,
                kv_lens=kv_lens, window=window, softcap=softcap, causal_align=causal_align, mask4=mask4,
                return_lse=return_lse, num_splits=num_splits, pack_gqa=pack_gqa, block_m=block_m,
                block_n=block_n, num_warps=num_warps, num_stages=num_stages, rowsum_fp32=_rowsum_fp32)
    return (o, lse) if return_lse else o


@on_input_device
def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    *,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool = False,
    scale: float | None = None,
    kv_lens: torch.Tensor | None = None,
    window: tuple[int, int] | None = None,
    softcap: float = 0.0,
    causal_align: str = "top_left",
    attn_mask: torch.Tensor | None = None,
    return_lse: bool = False,
    num_splits: int = 1,
    pack_gqa: bool | None = None,
    block_m: int | None = None,
    block_n: int | None = None,
    num_warps: int | None = None,
    num_stages: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`attention` on packed variable-length sequences: q (total_q, Hq, D), k (total_k, Hkv, D),
    v (total_k, Hkv, Dv), sequence b = rows cu_seqlens_q[b]:cu_seqlens_q[b+1] of q against rows
    cu_seqlens_k[b]:cu_seqlens_k[b+1] of k and v (int32, from 0, non-decreasing; empty sequences
    allowed). Each sequence is its own problem (bottom-right alignment per sequence); nothing
    crosses a boundary. Returns o (total_q, Hq, Dv) and, with return_lse, lse (Hq, total_q).
    kv_lens and attn_mask are not taken here (the sequence lengths are the key lengths; pass a
    dense batch for masks). Differentiable as `attention` is."""
    if _needs_grad(q, k, v):
        from .attention_backward import attention_autograd
        return attention_autograd(q, k, v, cu_seqlens_q, cu_seqlens_k, kv_lens=kv_lens, attn_mask=attn_mask,
                                  return_lse=return_lse, max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k,
                                  causal=causal, scale=scale, window=window, softcap=softcap,
                                  causal_align=causal_align, num_splits=num_splits, pack_gqa=pack_gqa,
                                  block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    _check_packed(q, k, v)
    _check_options(causal, scale, window, softcap, causal_align, return_lse, num_splits)
    _check_launch(pack_gqa, block_m, block_n, num_warps, num_stages)
    cq, _ = _check_sequences("attention_varlen", q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                             kv_lens, attn_mask)
    total_q, Hq, D = q.shape
    Dv = v.shape[2]
    o = torch.empty((total_q, Hq, Dv), dtype=q.dtype, device=q.device)
    lse = torch.full((Hq, total_q), float("-inf"), dtype=torch.float32, device=q.device) if return_lse else None
    batch = len(cq) - 1
    if o.numel() and batch and max_seqlen_q:
        as4 = lambda t: t.unsqueeze(0).transpose(1, 2)  # (1, H, total, D) view, no copy  # noqa: E731
        _launch(as4(q), as4(k), as4(v), as4(o), lse.unsqueeze(0) if lse is not None else None, batch=batch,
                m_max=int(max_seqlen_q), n_max=int(max_seqlen_k), cu_q=cu_seqlens_q, cu_k=cu_seqlens_k,
                causal=causal, scale=scale, kv_lens=None, window=window, softcap=softcap,
                causal_align=causal_align, mask4=None, return_lse=return_lse, num_splits=num_splits,
                pack_gqa=pack_gqa, block_m=block_m, block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                rowsum_fp32=False)
    return (o, lse) if return_lse else o


__all__ = ["attention", "attention_varlen", "attn_config", "auto_splits", "effective_scale", "effective_softcap",
           "normalize_window", "AttnConfig", "MAX_HEAD_DIM", "DEVICE"]

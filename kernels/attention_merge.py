"""Split-KV's merge for the fused attention kernel (`kernels/attention.py`): each split of a row's
keys leaves its unnormalised state (acc, m, l) in fp32; one more online-softmax step per split
combines them and writes o (and lse)."""
from __future__ import annotations

import torch

from ._common import bf16_as_bits, kernel_view, store_f32, tl, triton
from ._runtime import cdiv, launch


# Sizes and strides vary per call and feed no vector width: one binary per (BLOCK_DV, dtype, lse).
@triton.jit(do_not_specialize=["ROWS", "DV", "SPLITS", "PART_O", "PART_L", "LSE_H", "sl_t", "sl_h"])
def _attn_merge_kernel(
    acc_part, m_part, l_part, l32_part, o_ptr, lse_ptr, ROWS, DV, SPLITS, PART_O, PART_L, LSE_H, sl_t, sl_h,
    BLOCK_R: tl.constexpr, BLOCK_DV: tl.constexpr, RETURN_LSE: tl.constexpr, BF16_BITS: tl.constexpr,
    NATURAL: tl.constexpr,
):
    """Combine the splits' (acc, m, l) of each output row: the online softmax's rescale, one more
    step per split, -inf safe (a split whose keys are all masked has m = -inf, l = 0, acc = 0
    and contributes nothing; a row whose every split is empty gives zeros and lse = -inf).
    Rows are o's rows (o contiguous, DV innermost); row r's lse lives at
    (r // LSE_H) * sl_t + (r % LSE_H) * sl_h. NATURAL: the splits' m are in natural units (a
    float attn_mask), else base 2."""
    pid = tl.program_id(0)
    rr = pid.to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rr < ROWS
    cols = tl.arange(0, BLOCK_DV)
    o_mask = row_ok[:, None] & (cols < DV)[None, :]
    m_run = tl.full((BLOCK_R,), float("-inf"), tl.float32)
    l_run = tl.zeros((BLOCK_R,), tl.float32)
    l32_run = tl.zeros((BLOCK_R,), tl.float32)
    acc = tl.zeros((BLOCK_R, BLOCK_DV), tl.float32)
    for s in range(0, SPLITS):
        si = tl.cast(s, tl.int64)
        m_s = tl.load(m_part + si * PART_L + rr, mask=row_ok, other=float("-inf"))
        m_new = tl.maximum(m_run, m_s)
        m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        if NATURAL:
            alpha = tl.math.exp2((m_run - m_ref) * 1.4426950408889634)
            beta = tl.math.exp2((m_s - m_ref) * 1.4426950408889634)
        else:
            alpha = tl.math.exp2(m_run - m_ref)
            beta = tl.math.exp2(m_s - m_ref)
        l_run = l_run * alpha + tl.load(l_part + si * PART_L + rr, mask=row_ok, other=0.0) * beta
        if RETURN_LSE:
            l32_run = l32_run * alpha + tl.load(l32_part + si * PART_L + rr, mask=row_ok, other=0.0) * beta
        a_s = tl.load(acc_part + si * PART_O + rr[:, None] * DV + cols[None, :], mask=o_mask, other=0.0)
        acc = acc * alpha[:, None] + a_s * beta[:, None]
        m_run = m_new
    l_safe = tl.where(l_run == 0.0, 1.0, l_run)
    store_f32(o_ptr + rr[:, None] * DV + cols[None, :], acc / l_safe[:, None], o_mask, BF16_BITS)
    if RETURN_LSE:
        if NATURAL:
            lse = m_run + tl.math.log2(l32_run) * 0.6931471805599453
        else:
            lse = (m_run + tl.math.log2(l32_run)) * 0.6931471805599453
        lse = tl.where(l32_run == 0.0, float("-inf"), lse)
        tl.store(lse_ptr + (rr // LSE_H) * sl_t + (rr % LSE_H) * sl_h, lse, mask=row_ok)


def merge_splits(acc_p: torch.Tensor, m_p: torch.Tensor, l_p: torch.Tensor, l32_p: torch.Tensor, o4: torch.Tensor,
                 lse3: torch.Tensor | None, *, varlen: bool, block_dv: int, natural: bool) -> None:
    """Write o4 (B, Hq, seq, Dv) (and lse3) from the splits' states: acc_p (splits, *o4.shape) in o4's strides, m_p,
    l_p, l32_p (splits, rows) in o4's row order. natural: m in natural units (a float mask)."""
    splits, hq, dv = acc_p.shape[0], o4.shape[1], o4.shape[-1]
    rows_o = o4.numel() // dv
    block_r = 16
    if lse3 is None:
        lse_h, sl_t, sl_h = 1, 0, 0
    elif varlen:  # o (total, Hq, Dv): row t * Hq + h; lse (Hq, total)
        lse_h, sl_t, sl_h = hq, lse3.stride(2), lse3.stride(1)
    else:  # o (B, Hq, M, Dv) and lse (B, Hq, M), both contiguous: the same row order
        lse_h, sl_t, sl_h = 1, 1, 0
    launch(_attn_merge_kernel, (cdiv(rows_o, block_r),),
           (acc_p, m_p, l_p, l32_p, kernel_view(o4), lse3 if lse3 is not None else o4, rows_o, dv, splits,
            o4.numel(), rows_o, lse_h, sl_t, sl_h),
           dict(BLOCK_R=block_r, BLOCK_DV=block_dv, RETURN_LSE=lse3 is not None, BF16_BITS=bf16_as_bits(o4.dtype),
                NATURAL=natural, num_warps=4))

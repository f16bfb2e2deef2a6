"""Attention backward: dq, dk, dv of `kernels.attention.attention` and `attention_varlen`, and the
autograd Function that makes both differentiable.

Semantics (docs/NUMERICS.md section 10): the gradients of O = softmax(scale q k^T + mask) v for
the given output gradient dO, with every forward feature (causal in both alignments, kv_lens,
GQA/MQA, Dv != D, varlen, sliding window, softcap, boolean and float attn_mask, custom scale,
head dims to 256, fp16/bf16/fp32, any strides). The forward's stored o and fp32 lse are inputs:
P is recomputed from lse, D = rowsum(dO * o). GQA/MQA: dk, dv of a kv head sum over its query
heads. The mask gets no gradient. Rows that see no key give dq = 0 and add nothing to dk, dv;
keys no row sees (padded, outside the band, masked) get dk = dv = 0 exactly, never NaN.

Arithmetic and launches: kernels/attention_backward_kernels.py (three launches, no atomics: the
same bits on every run); blocks: kernels/attention_backward_config.py. Outputs are fresh
contiguous tensors of the inputs' dtype and shapes; inputs are never written.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.autograd.function import once_differentiable

from ._common import LOG2E, bf16_as_bits, check_float, check_tensor, kernel_view
from ._runtime import cdiv, launch, on_input_device
from .attention import _none_i32, _with_stages_that_fit, attention, attention_varlen
from .attention_args import (
    _check_inputs, _check_launch, _check_options, _check_packed, _check_sequences, _mask_view, effective_scale,
    effective_softcap, normalize_window,
)
from .attention_backward_config import BwdConfig, bwd_config, edged_launch
from .attention_backward_kernels import _attn_bwd_delta_kernel, _attn_bwd_dkdv_kernel, _attn_bwd_dq_kernel
from .attention_plan import _lead_strides

_GRID_YZ_MAX = 65535


def _wide(span: int, *strides: tuple[int, ...]) -> bool:
    """Whether in-tile offsets ((span - 1) * |stride| over a tile's row and column dims) could pass
    int32; then the kernels compute them in int64 (the bases always are)."""
    return any(span * (abs(st[2]) + abs(st[3])) >= 2**31 for st in strides)


def _launch(q4, k4, v4, o4, lse3, do4, dq4, dk4, dv4, *, batch: int, m_max: int, n_max: int, cu_q, cu_k, kv_lens,
            mask4, causal, scale, window, softcap, causal_align, cfg: BwdConfig, fixed_stages: bool,
            need_dq: bool = True, need_dkdv: bool = True) -> None:
    """Run the backward on 4-D views (B, H, seq, D) (varlen: B = 1, seq the packed length, cu_q and
    cu_k the sequences); writes dq4, dk4, dv4. All checks are the callers'."""
    Hq, D = q4.shape[1], q4.shape[3]
    Hkv, Dv = k4.shape[1], v4.shape[3]
    group = Hq // Hkv
    if batch * Hq > _GRID_YZ_MAX:
        raise ValueError(f"batch * heads = {batch * Hq} must be at most {_GRID_YZ_MAX} (the GPU's grid limit)")
    left, right = normalize_window(window)
    if causal:  # causal is the window's right edge at the diagonal
        right = 0
    bottom = causal_align == "bottom_right"
    mask_kind = 0 if mask4 is None else (1 if mask4.dtype == torch.bool else 2)
    sc = effective_scale(scale, D)
    cap = effective_softcap(softcap or 0.0)
    unit = 1.0 if mask_kind == 2 else LOG2E  # a float mask: natural units, as the forward
    qk_scale = float(np.float32(sc * unit))
    cap_in = float(np.float32(sc / cap)) if cap > 0 else 1.0
    cap_out = float(np.float32(cap * unit)) if cap > 0 else 1.0
    none_i32 = _none_i32(q4.device)
    kvl = kv_lens.to(torch.int32).contiguous() if kv_lens is not None else none_i32
    cq = cu_q if cu_q is not None else none_i32
    ck = cu_k if cu_k is not None else none_i32
    varlen = cu_q is not None
    if mask_kind == 1:
        mk, mstride = mask4.view(torch.uint8), mask4.stride()
    elif mask_kind == 2:
        mk, mstride = kernel_view(mask4), mask4.stride()
    else:
        mk, mstride = kernel_view(q4), (0, 0, 0, 0)
    delta = torch.empty(lse3.shape, dtype=torch.float32, device=q4.device)
    ref = torch.empty(lse3.shape, dtype=torch.float32, device=q4.device)  # the exponent reference per row
    sdb, sdh = delta.stride()[:2]
    bd = cfg.block_d
    bf16 = bf16_as_bits(q4.dtype)
    no_edge = m_max + n_max  # past every key (the forward's window arithmetic)
    # Rows that can see no key (kv_lens, empty varlen sequences, masks, a finite left edge, a right
    # edge aligned bottom-right): only then do the kernels guard q, dO and D of such rows.
    row_guard = kv_lens is not None or varlen or mask_kind != 0 or left >= 0 or (right >= 0 and bottom)
    feats = dict(BLOCK_D=bd, BLOCK_DV=bd, VARLEN=varlen, SOFTCAP=cap > 0, MASK_KIND=mask_kind,
                 MASK_BF16_BITS=mask_kind == 2 and bf16_as_bits(mask4.dtype), BF16_BITS=bf16,
                 IS_FP32=q4.dtype == torch.float32, EVEN_D=bd == D, EVEN_DV=bd == Dv, LEFT_EDGE=left >= 0,
                 RIGHT_EDGE=right >= 0, ROW_GUARD=row_guard,
                 EDGE_STAGES=None if q4.dtype == torch.float32 else 1)  # kernels/attention.py's edge loops
    common = (*mstride, sdb, sdh)
    sizes = (group, m_max, n_max, D, Dv, qk_scale, cap_in, cap_out, sc,
             left if left >= 0 else no_edge, right if right >= 0 else no_edge, int(bottom), int(kv_lens is not None))
    ptr_tail = (ref, delta, kvl, cq, ck, mk)
    qkv = (kernel_view(q4), kernel_view(k4), kernel_view(v4), kernel_view(do4))

    lead, mul = _lead_strides(o4.stride(), do4.stride())
    launch(_attn_bwd_delta_kernel, (cdiv(m_max, cfg.delta_rows), batch * Hq),
           (kernel_view(o4), kernel_view(do4), lse3, delta, ref, cq, *lead, *lse3.stride(), sdb, sdh, Hq, m_max, Dv),
           dict(BLOCK_M=cfg.delta_rows, BLOCK_DV=bd, STRIDE_MUL=mul, VARLEN=varlen, NATURAL=mask_kind == 2,
                BF16_BITS=bf16, WIDE=_wide(max(cfg.delta_rows, bd), o4.stride(), do4.stride()), num_warps=4,
                num_stages=1))

    def run(fn, grid, ptrs, strides4, tail, meta, warps, stages_default, name):
        lead, mul = _lead_strides(*strides4)
        args = (*ptrs, *ptr_tail, *lead, *common, tail[0], *sizes, tail[1])
        full = {**feats, **meta, "STRIDE_MUL": mul, "num_warps": warps}
        key = (name, q4.dtype, cfg, mask_kind, tuple(sorted((k, v) for k, v in full.items() if k != "num_warps")))
        _with_stages_that_fit(lambda st: launch(fn, grid, args, {**full, "num_stages": st}), key, stages_default,
                              fixed=fixed_stages)

    if need_dkdv:
        wide = _wide(max(cfg.block_m, cfg.block_n, bd), q4.stride(), k4.stride(), v4.stride(), do4.stride(),
                     dk4.stride(), dv4.stride(), mstride)
        run(_attn_bwd_dkdv_kernel, (cdiv(n_max, cfg.block_n), batch * Hkv), (*qkv, kernel_view(dk4), kernel_view(dv4)),
            (q4.stride(), k4.stride(), v4.stride(), do4.stride(), dk4.stride(), dv4.stride()), (Hkv, 0),
            dict(BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, WIDE=wide, ROW_TAIL=varlen or m_max % cfg.block_m != 0),
            cfg.num_warps, cfg.num_stages, "dkdv")
    if need_dq:
        wide = _wide(max(cfg.dq_block_m, cfg.dq_block_n, bd), q4.stride(), k4.stride(), v4.stride(), do4.stride(),
                     dq4.stride(), mstride)
        key_tail = kv_lens is not None or varlen or n_max % cfg.dq_block_n != 0
        run(_attn_bwd_dq_kernel, (cdiv(m_max, cfg.dq_block_m), batch * Hq), (*qkv, kernel_view(dq4)),
            (q4.stride(), k4.stride(), v4.stride(), do4.stride(), dq4.stride()), (Hq, int(right >= 0)),
            dict(BLOCK_M=cfg.dq_block_m, BLOCK_N=cfg.dq_block_n, WIDE=wide, KEY_TAIL=key_tail),
            cfg.dq_num_warps, cfg.dq_num_stages, "dq")


def _detached(t):
    """The backward is not differentiable itself: tensors that require grad are read as they are."""
    return t.detach() if isinstance(t, torch.Tensor) else t


def _check_mask_grad(attn_mask) -> None:
    if isinstance(attn_mask, torch.Tensor) and attn_mask.requires_grad:
        raise ValueError("attn_mask requires grad, but the backward gives a mask no gradient: detach it")


def _check_saved(q, o, lse, do, o_shape: tuple, lse_shape: tuple) -> None:
    """The forward's o and lse and the output gradient do, against q (already checked)."""
    for name, t in (("o", o), ("do", do)):
        check_float(name, t)
        if tuple(t.shape) != o_shape:
            raise ValueError(f"{name} must have shape {o_shape}, got {tuple(t.shape)}")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype}; it must be q's ({q.dtype})")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device}, q on {q.device}")
    check_tensor("lse", lse)
    if lse.dtype != torch.float32 or tuple(lse.shape) != lse_shape:
        raise ValueError(f"lse must be the forward's float32 log-sum-exp of shape {lse_shape}, "
                         f"got {lse.dtype} {tuple(lse.shape)}")
    if lse.device != q.device:
        raise ValueError(f"lse is on {lse.device}, q on {q.device}")


def _grads(q, k, v, *, zero_q: bool, zero_kv: bool):
    """Fresh contiguous dq, dk, dv; zeroed where the kernels may leave rows unwritten (varlen's
    packed rows past the last sequence)."""
    make = lambda t, z: (torch.zeros if z else torch.empty)(t.shape, dtype=t.dtype, device=t.device)  # noqa: E731
    return make(q, zero_q), make(k, zero_kv), make(v, zero_kv)


def _dense(q, k, v, o, lse, do, *, kv_lens, attn_mask, causal, scale, window, softcap, causal_align, cfg,
           fixed_stages, need_dq=True, need_dkdv=True):
    B, Hq, M, _ = q.shape
    N = k.shape[2]
    empty = M == 0 or N == 0 or B == 0
    dq, dk, dv = _grads(q, k, v, zero_q=empty, zero_kv=empty)
    if not empty:
        mask4 = _mask_view(attn_mask, (B, Hq, M, N), q) if attn_mask is not None else None
        _launch(q, k, v, o, lse, do, dq, dk, dv, batch=B, m_max=M, n_max=N, cu_q=None, cu_k=None, kv_lens=kv_lens,
                mask4=mask4, causal=causal, scale=scale, window=window, softcap=softcap, causal_align=causal_align,
                cfg=cfg, fixed_stages=fixed_stages, need_dq=need_dq, need_dkdv=need_dkdv)
    return dq, dk, dv


def _packed(q, k, v, o, lse, do, cu_q, cu_k, cq: list[int], ck: list[int], *, max_seqlen_q, max_seqlen_k, causal,
            scale, window, softcap, causal_align, cfg, fixed_stages, need_dq=True, need_dkdv=True):
    batch = len(cq) - 1
    empty = batch == 0 or max_seqlen_q == 0 or max_seqlen_k == 0
    dq, dk, dv = _grads(q, k, v, zero_q=empty or cq[-1] < q.shape[0], zero_kv=empty or ck[-1] < k.shape[0])
    if not empty:
        as4 = lambda t: t.unsqueeze(0).transpose(1, 2)  # (1, H, total, D) views, no copy  # noqa: E731
        _launch(as4(q), as4(k), as4(v), as4(o), lse.unsqueeze(0), as4(do), as4(dq), as4(dk), as4(dv), batch=batch,
                m_max=int(max_seqlen_q), n_max=int(max_seqlen_k), cu_q=cu_q, cu_k=cu_k, kv_lens=None, mask4=None,
                causal=causal, scale=scale, window=window, softcap=softcap, causal_align=causal_align, cfg=cfg,
                fixed_stages=fixed_stages, need_dq=need_dq, need_dkdv=need_dkdv)
    return dq, dk, dv


@on_input_device
def attention_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor, *,
    causal: bool = False, scale: float | None = None, kv_lens: torch.Tensor | None = None,
    window: tuple[int, int] | None = None, softcap: float | None = None, causal_align: str = "top_left",
    attn_mask: torch.Tensor | None = None, block_m: int | None = None, block_n: int | None = None,
    num_warps: int | None = None, num_stages: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv) of `attention(q, k, v, **options)` for the output gradient do (B, Hq, M, Dv),
    given that call's output o and its `return_lse=True` lse (B, Hq, M, fp32). The options are the
    forward's keywords with the same meaning (softcap None or 0: no cap); the forward's launch
    knobs (num_splits, pack_gqa, its blocks) do not matter here. block_m / block_n set the query /
    key blocks of both kernels (kernels/attention_backward_config.py; they change the fp32
    summation order, within the bound), num_warps and num_stages both kernels' launches.
    Returns fresh contiguous tensors of q's, k's and v's shapes and dtype, carrying no autograd
    history (the backward is not differentiable itself)."""
    q, k, v, o, lse, do = (_detached(t) for t in (q, k, v, o, lse, do))
    _check_mask_grad(attn_mask)
    softcap = 0.0 if softcap is None else softcap
    _check_inputs(q, k, v, causal, scale, kv_lens, window=window, softcap=softcap, causal_align=causal_align,
                  attn_mask=attn_mask)
    _check_launch(None, block_m, block_n, num_warps, num_stages)
    B, Hq, M, D = q.shape
    _check_saved(q, o, lse, do, (B, Hq, M, v.shape[3]), (B, Hq, M))
    cfg = bwd_config(D, q.dtype, dv=v.shape[3], edged=edged_launch(window, attn_mask), block_m=block_m,
                     block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    return _dense(q, k, v, o, lse, do, kv_lens=kv_lens, attn_mask=attn_mask, causal=causal, scale=scale,
                  window=window, softcap=softcap, causal_align=causal_align, cfg=cfg,
                  fixed_stages=num_stages is not None)


@on_input_device
def attention_varlen_backward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, do: torch.Tensor,
    cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *, max_seqlen_q: int, max_seqlen_k: int,
    causal: bool = False, scale: float | None = None, kv_lens: torch.Tensor | None = None,
    window: tuple[int, int] | None = None, softcap: float | None = None, causal_align: str = "top_left",
    attn_mask: torch.Tensor | None = None, block_m: int | None = None, block_n: int | None = None,
    num_warps: int | None = None, num_stages: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """`attention_backward` of `attention_varlen`: packed q (total_q, Hq, D), k (total_k, Hkv, D),
    v (total_k, Hkv, Dv), o and do (total_q, Hq, Dv), lse (Hq, total_q) as the forward returns it.
    Each sequence is its own problem; packed rows past the last sequence get zero gradients.
    kv_lens and attn_mask are not taken (as the forward)."""
    q, k, v, o, lse, do = (_detached(t) for t in (q, k, v, o, lse, do))
    softcap = 0.0 if softcap is None else softcap
    _check_packed(q, k, v)
    _check_options(causal, scale, window, softcap, causal_align, False, 1)
    _check_launch(None, block_m, block_n, num_warps, num_stages)
    cq, ck = _check_sequences("attention_varlen_backward", q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q,
                              max_seqlen_k, kv_lens, attn_mask)
    total_q, Hq, D = q.shape
    _check_saved(q, o, lse, do, (total_q, Hq, v.shape[2]), (Hq, total_q))
    cfg = bwd_config(D, q.dtype, dv=v.shape[2], edged=edged_launch(window, None), block_m=block_m,
                     block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    return _packed(q, k, v, o, lse, do, cu_seqlens_q, cu_seqlens_k, cq, ck, max_seqlen_q=max_seqlen_q,
                   max_seqlen_k=max_seqlen_k, causal=causal, scale=scale, window=window, softcap=softcap,
                   causal_align=causal_align, cfg=cfg, fixed_stages=num_stages is not None)


_BACKWARD_OPTIONS = ("causal", "scale", "window", "softcap", "causal_align")


class _Attention(torch.autograd.Function):
    """attention / attention_varlen with q, k or v requiring grad: the forward runs with
    return_lse and keeps (q, k, v, o, lse); lse is returned but not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, kv_lens, attn_mask, cu_q, cu_k, options):
        if cu_q is None:
            o, lse = attention(q, k, v, kv_lens=kv_lens, attn_mask=attn_mask, return_lse=True, **options)
        else:
            o, lse = attention_varlen(q, k, v, cu_q, cu_k, kv_lens=kv_lens, attn_mask=attn_mask, return_lse=True,
                                      **options)
        ctx.save_for_backward(q, k, v, o, lse, kv_lens, attn_mask, cu_q, cu_k)
        ctx.options = options
        ctx.mark_non_differentiable(lse)
        return o, lse

    @staticmethod
    @once_differentiable
    def backward(ctx, do, _dlse):
        q, k, v, o, lse, kv_lens, attn_mask, cu_q, cu_k = ctx.saved_tensors
        opts = {name: ctx.options[name] for name in _BACKWARD_OPTIONS}
        cfg = bwd_config(q.shape[-1], q.dtype, dv=v.shape[-1], edged=edged_launch(opts["window"], attn_mask))
        need = dict(need_dq=ctx.needs_input_grad[0], need_dkdv=ctx.needs_input_grad[1] or ctx.needs_input_grad[2],
                    cfg=cfg, fixed_stages=False)
        if cu_q is None:
            grads = _dense(q, k, v, o, lse, do, kv_lens=kv_lens, attn_mask=attn_mask, **opts, **need)
        else:
            cq, ck = cu_q.tolist(), cu_k.tolist()  # checked by the forward
            grads = _packed(q, k, v, o, lse, do, cu_q, cu_k, cq, ck, max_seqlen_q=ctx.options["max_seqlen_q"],
                            max_seqlen_k=ctx.options["max_seqlen_k"], **opts, **need)
        return (*(g if want else None for g, want in zip(grads, ctx.needs_input_grad[:3])), None, None, None, None,
                None)


def attention_autograd(q, k, v, cu_seqlens_q=None, cu_seqlens_k=None, *, kv_lens=None, attn_mask=None,
                       return_lse=False, **options):
    """The differentiable call behind `attention` (cu_seqlens None) and `attention_varlen` when
    grad is enabled and q, k or v requires it; options are theirs (including max_seqlen_q/k)."""
    _check_mask_grad(attn_mask)
    o, lse = _Attention.apply(q, k, v, kv_lens, attn_mask, cu_seqlens_q, cu_seqlens_k, options)
    return (o, lse) if return_lse else o


__all__ = ["attention_backward", "attention_varlen_backward", "attention_autograd", "bwd_config", "BwdConfig"]

"""The attention entry points' arguments (`kernels/attention.py`): every bad input is one clear
TypeError or ValueError naming it, raised before anything is launched; and the values the kernel
computes with (the scale and softcap as fp32, the window's edges), which the oracle shares."""
from __future__ import annotations

import math

import numpy as np
import torch

from ._common import check_device, check_float, check_knob, check_tensor
from .attention_spec import CAUSAL_ALIGNS

MAX_HEAD_DIM = 256


def effective_scale(scale: float | None, head_dim: int) -> float:
    """The softmax scale the kernel multiplies scores by: fl32(scale), default fl32(1/sqrt(D)).
    The oracle computes with exactly this value (NUMERICS.md section 3)."""
    s = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    return float(np.float32(s))


def effective_softcap(softcap: float) -> float:
    """The cap the kernel uses: fl32(softcap) (0: no cap)."""
    return float(np.float32(float(softcap)))


def _is_real(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, (int, float, np.floating, np.integer))


def _is_int(x) -> bool:
    return not isinstance(x, (bool, np.bool_)) and isinstance(x, (int, np.integer))


def normalize_window(window) -> tuple[int, int]:
    """window=(left, right) as two ints >= -1 (-1: unlimited); None is (-1, -1)."""
    if window is None:
        return -1, -1
    if not isinstance(window, (tuple, list)) or len(window) != 2 or not all(_is_int(w) for w in window):
        raise TypeError(f"window must be None or a pair of ints (left, right), got {window!r}")
    left, right = int(window[0]), int(window[1])
    if left < -1 or right < -1:
        raise ValueError(f"window values must be >= -1 (-1: unlimited), got {(left, right)}")
    return left, right


def _check_options(causal, scale, window, softcap, causal_align, return_lse, num_splits) -> None:
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, not {type(causal).__name__}")
    if scale is not None:
        if not _is_real(scale):
            raise TypeError(f"scale must be a real number or None, not {type(scale).__name__}")
        if not math.isfinite(float(scale)):
            raise ValueError(f"scale must be finite, got {scale}")
        if not math.isfinite(float(np.float32(float(scale)))):
            raise ValueError(f"scale {scale} overflows fp32")
    normalize_window(window)
    if not _is_real(softcap):
        raise TypeError(f"softcap must be a real number, not {type(softcap).__name__}")
    c = float(softcap)
    if not c >= 0 or not math.isfinite(c):
        raise ValueError(f"softcap must be finite and >= 0 (0: no cap), got {softcap}")
    if c > 0 and not (0 < effective_softcap(c) < math.inf):
        raise ValueError(f"softcap {softcap} is not representable in fp32 (it would be 0 or inf)")
    if causal_align not in CAUSAL_ALIGNS:
        raise ValueError(f"causal_align must be one of {CAUSAL_ALIGNS}, got {causal_align!r}")
    if not isinstance(return_lse, (bool, np.bool_)):
        raise TypeError(f"return_lse must be a bool, not {type(return_lse).__name__}")
    if not _is_int(num_splits):
        raise TypeError(f"num_splits must be an int (0: automatic), not {type(num_splits).__name__}")
    if num_splits < 0:
        raise ValueError(f"num_splits must be >= 0 (0: automatic), got {num_splits}")


def _check_launch(pack_gqa, block_m, block_n, num_warps, num_stages) -> None:
    """Launch knobs: None (the tuned default) or a usable value; 0 is not a default."""
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise TypeError(f"pack_gqa must be a bool or None, not {type(pack_gqa).__name__}")
    check_knob("block_m", block_m, lo=16, pow2=True)
    check_knob("block_n", block_n, lo=16, pow2=True)
    check_knob("num_warps", num_warps, pow2=True)
    check_knob("num_stages", num_stages)


def _check_qkv(q, k, v, rank: int, layout: str) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_float(name, t)
        if t.dim() != rank:
            raise ValueError(f"{name} must be {rank}-D {layout}, got {t.dim()}-D with shape {tuple(t.shape)}")
    if not (q.dtype == k.dtype == v.dtype):
        raise TypeError(f"q, k, v must share one dtype, got {q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v must be on one device, got {q.device}, {k.device}, {v.device}")


def _check_heads(hq: int, hkv: int, hv: int, d: int, dk: int, dv: int) -> None:
    if hkv != hv:
        raise ValueError(f"k and v must have the same number of heads, got {hkv} and {hv}")
    if hkv == 0 or hq % hkv:
        raise ValueError(f"the query heads ({hq}) must be a multiple of the key/value heads ({hkv}) (GQA/MQA)")
    if dk != d:
        raise ValueError(f"head dims differ: q has D={d}, k has D={dk}")
    for name, x in (("D", d), ("Dv", dv)):
        if not 1 <= x <= MAX_HEAD_DIM:
            raise ValueError(f"head dim {name}={x} is not supported; 1 <= {name} <= {MAX_HEAD_DIM}")


def _check_inputs(q, k, v, causal, scale, kv_lens, *, window=None, softcap=0.0, causal_align="top_left",
                  attn_mask=None, return_lse=False, num_splits=1) -> None:
    """Every check of `attention`'s inputs (shared with kernels that reuse its validation)."""
    _check_qkv(q, k, v, 4, "(B, H, seq, D)")
    B, Hq, M, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch sizes differ: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if k.shape[2] != v.shape[2]:
        raise ValueError(f"k and v must have the same length, got {tuple(k.shape)} and {tuple(v.shape)}")
    _check_heads(Hq, k.shape[1], v.shape[1], D, k.shape[3], v.shape[3])
    N = k.shape[2]
    if max(M, N) >= 2**31 or B * Hq >= 2**31:
        raise ValueError("sequence lengths and B*H must be below 2^31")
    _check_options(causal, scale, window, softcap, causal_align, return_lse, num_splits)
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
            if lo < 0 or hi > N:
                raise ValueError(f"kv_lens values must lie in [0, N] = [0, {N}], got min {lo}, max {hi}")
    if attn_mask is not None:
        _mask_view(attn_mask, (B, Hq, M, N), q)


def _mask_view(mask, shape: tuple[int, int, int, int], q: torch.Tensor) -> torch.Tensor:
    """attn_mask validated and expanded (a view with 0 strides) to (B, Hq, M, N)."""
    if not isinstance(mask, torch.Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, not {type(mask).__name__}")
    check_tensor("attn_mask", mask)
    if mask.dtype != torch.bool and mask.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise TypeError(f"attn_mask must be bool (True = the key takes part) or a float bias "
                        f"(float16/bfloat16/float32), got {mask.dtype}")
    if mask.device != q.device:
        raise ValueError(f"attn_mask is on {mask.device}, q on {q.device}")
    if mask.dim() > 4:
        raise ValueError(f"attn_mask must have at most 4 dims, got shape {tuple(mask.shape)}")
    try:
        if torch.broadcast_shapes(tuple(mask.shape), shape) != torch.Size(shape):
            raise RuntimeError
    except RuntimeError:
        raise ValueError(f"attn_mask of shape {tuple(mask.shape)} does not broadcast to (B, Hq, M, N) = {shape}")\
            from None
    return mask.expand(shape)


def _check_cu(name: str, cu, batch: int | None, total: int, max_seqlen, max_name: str) -> list[int]:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be an int32 torch.Tensor, not {type(cu).__name__}")
    if cu.dtype != torch.int32:
        raise TypeError(f"{name} must have dtype int32, got {cu.dtype}")
    if cu.dim() != 1 or cu.numel() < 1:
        raise ValueError(f"{name} must be 1-D with B + 1 >= 1 entries, got shape {tuple(cu.shape)}")
    check_device(name, cu)
    if batch is not None and cu.numel() != batch + 1:
        raise ValueError(f"cu_seqlens_q and cu_seqlens_k must have the same length, got {batch + 1} and {cu.numel()}")
    vals = cu.tolist()  # one small device-to-host copy
    if vals[0] != 0:
        raise ValueError(f"{name} must start at 0, got {vals[0]}")
    steps = np.diff(np.asarray(vals, dtype=np.int64))
    if (steps < 0).any():
        i = int(np.argmax(steps < 0))
        raise ValueError(f"{name} must be non-decreasing, but {name}[{i + 1}] = {vals[i + 1]} < {vals[i]}")
    if vals[-1] > total:
        raise ValueError(f"{name}[-1] = {vals[-1]} exceeds the packed length {total}")
    if not _is_int(max_seqlen) or max_seqlen < 0:
        raise TypeError(f"{max_name} must be an int >= 0, got {max_seqlen!r}")
    longest = int(steps.max()) if steps.size else 0
    # FlashAttention's contract: at least the longest sequence (the launch covers it). It sizes the
    # grid, so past the packed length it only launches idle programs: 2^31 - 1 on 10 tokens hung.
    if max_seqlen < longest:
        raise ValueError(f"{max_name}={max_seqlen} is below the longest sequence ({longest})")
    if max_seqlen > total:
        raise ValueError(f"{max_name}={max_seqlen} exceeds the packed length {total}: no sequence can be that long")
    return vals


def _check_packed(q, k, v) -> None:
    """Varlen's packed q (total_q, Hq, D), k (total_k, Hkv, D), v (total_k, Hkv, Dv)."""
    _check_qkv(q, k, v, 3, "(total, H, D)")
    if k.shape[0] != v.shape[0]:
        raise ValueError(f"k and v must have the same packed length, got {tuple(k.shape)} and {tuple(v.shape)}")
    _check_heads(q.shape[1], k.shape[1], v.shape[1], q.shape[2], k.shape[2], v.shape[2])


def _check_sequences(fn: str, q, k, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, kv_lens,
                     attn_mask) -> tuple[list[int], list[int]]:
    """Varlen's sequence arguments (fn names the entry point); returns the cu_seqlens' values."""
    if kv_lens is not None:
        raise ValueError(f"{fn} takes no kv_lens: cu_seqlens_k gives each sequence's keys")
    if attn_mask is not None:
        raise ValueError(f"{fn} takes no attn_mask (no packed mask layout); use attention on a dense batch")
    cq = _check_cu("cu_seqlens_q", cu_seqlens_q, None, q.shape[0], max_seqlen_q, "max_seqlen_q")
    ck = _check_cu("cu_seqlens_k", cu_seqlens_k, len(cq) - 1, k.shape[0], max_seqlen_k, "max_seqlen_k")
    if max(q.shape[0], k.shape[0]) >= 2**31:
        raise ValueError("packed lengths must be below 2^31")
    return cq, ck

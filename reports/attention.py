"""Stability measurements of attention-family kernels: error against the oracle per class, and
the ratio of our error to torch SDPA's error (same precision, same device), both against the
correctly rounded oracle (the FlashAttention test-suite criterion; reported, never asserted)."""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.attention import AttentionOracle, attention_oracle, compare_attention
from flashcheck.oracles.formats import format_of, to_float64
from flashcheck.strategies.attention import CLASSES, case_inputs
from flashcheck.strategies.sample import draw_examples

from ._stats import Accumulator


def blocking(spec: KernelSpec, head_dim: int, n: int, dtype: torch.dtype,
             kw: dict | None = None) -> tuple[int, int]:
    """(block_n, n_blocks) the bound needs: the kernel's own when its spec says, else the worst
    case of one dot over every key and one rescale per key; split-KV (kw's num_splits) adds one
    rescale per split."""
    fn = spec.extra.get("blocking")
    bn, nb = (max(n, 1), max(n, 1)) if fn is None else fn(head_dim, n, dtype)
    splits = int((kw or {}).get("num_splits", 1) or 1)
    return bn, nb + (splits if splits > 1 else 0)


def sdpa_output(q, k, v, *, causal=False, scale=None, kv_lens=None) -> torch.Tensor:
    """torch SDPA on the same tensors, device and dtype, with the same scale value and masks."""
    from flashcheck.oracles.attention import effective_scale

    B, H, M, D = q.shape
    N = k.shape[2]
    sc = effective_scale(scale, D)
    mask = None
    if kv_lens is not None or (causal and M != N):
        j = torch.arange(N, device=q.device)
        lens = kv_lens.to(q.device).long() if kv_lens is not None else torch.full((B,), N, device=q.device)
        mask = (j[None, :] < lens[:, None])[:, None, None, :].expand(B, 1, M, N)
        if causal:
            mask = mask & (j[None, :] <= torch.arange(M, device=q.device)[:, None])[None, None]
        causal = False
    # Fresh contiguous copies (same values, new aligned storage): on the H200 an fp32 SDPA call on
    # views with odd storage offsets died with "misaligned address" (mem-efficient backend, as far
    # as we can tell), which poisons the CUDA context for the rest of the process.
    q, k, v = (t.clone(memory_format=torch.contiguous_format) for t in (q, k, v))
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bool(causal),
                                                            scale=sc)


def sdpa_error_ratio(out: torch.Tensor, sdpa: torch.Tensor, oracle: AttentionOracle) -> float | None:
    """max |ours - oracle| / max |sdpa - oracle| over elements where the oracle is an ordinary
    value and both outputs are finite (SDPA leaks NaN from masked values: those elements are
    skipped). None when SDPA's error is 0 and ours too; inf when only SDPA's is 0."""
    y, s, r = to_float64(out), to_float64(sdpa), oracle.out
    ok = ~oracle.special & np.isfinite(r) & np.isfinite(y) & np.isfinite(s)
    if not ok.any():
        return None
    ours, theirs = float(np.abs(y - r)[ok].max()), float(np.abs(s - r)[ok].max())
    if theirs == 0.0:
        return None if ours == 0.0 else math.inf
    return ours / theirs


def stability_rows(spec: KernelSpec, dtype: torch.dtype, *, examples: int) -> list[dict[str, Any]]:
    """One row per adversarial class: examples drawn deterministically, errors in ULPs and as a
    ratio to the derived bound, flushes to zero, and the SDPA error ratio (max over examples)."""
    fmt = format_of(dtype)
    rows = []
    for cls, strategy in CLASSES.items():
        if cls == "varlen_batches":  # packed inputs: judged per sequence by the property tests
            continue
        acc = Accumulator()
        ratios: list[float] = []
        for case in draw_examples(strategy(dtype=dtype, max_head_dim=spec.max_head_dim
                                           if cls != "odd_head_dims" else None), examples):
            q, k, v, kw = case_inputs(case)
            out = spec.fn(q, k, v, **kw)
            orc = attention_oracle(q, k, v, **kw)
            bn, nb = blocking(spec, q.shape[-1], k.shape[2], dtype, kw)
            acc.add(compare_attention(out, orc, block_n=bn, n_blocks=nb))
            r = None
            if set(kw) <= {"causal", "scale", "kv_lens"} and q.shape[1] == k.shape[1]:  # what sdpa_output maps
                try:
                    r = sdpa_error_ratio(out, sdpa_output(q, k, v, **kw), orc)
                except RuntimeError:  # a backend that refuses this input
                    r = None
            if r is not None:
                ratios.append(r)
        rows.append({"kernel": spec.name, "family": spec.family, "dtype": fmt.name, "strategy": cls,
                     "examples": examples, **acc.summary(), "sdpa_ratio": max(ratios) if ratios else None})
    return rows


__all__ = ["stability_rows", "sdpa_output", "sdpa_error_ratio", "blocking"]

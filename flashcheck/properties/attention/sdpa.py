"""torch SDPA as the attention family's baseline: its output on a case's own tensors, the backends
worth running on this device, and the error ratio of a kernel to SDPA against the oracle.

The engine's measuring helpers, shared by the suite (test_sdpa_error_ratio_reported) and the
attention report (`reports/stability/attention.py`, which adds SDPA's backends as baseline kernels): the
suite may not import the report layer (tests/test_layers.py), so the helpers live below it.
"""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import torch

from flashcheck.oracles.attention import AttentionOracle, effective_scale
from flashcheck.oracles.formats import to_float64


def sdpa_output(q, k, v, *, causal=False, scale=None, kv_lens=None, backend=None) -> torch.Tensor:
    """torch SDPA on the same tensors, device and dtype, with the same scale value and masks;
    `backend` (a torch.nn.attention.SDPBackend) forces one backend, which may refuse the case."""
    B, _, M, D = q.shape
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

    def run() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bool(causal),
                                                                scale=sc)
    if backend is None:
        return run()
    from torch.nn.attention import sdpa_kernel

    # A forced backend that refuses the case warns each reason (head_dim, dtype, "runtime disabled")
    # before raising: the caller reports it as not applicable, so the warnings only bury the output
    # (650 lines in a stability report's run on an H200).
    with sdpa_kernel([backend]), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return run()


def sdpa_backends() -> list[tuple[str, Any]]:
    """The SDPA backends worth comparing on this device: math on CPU; on a GPU every backend
    (each takes the cases it accepts: the others are reported as not applicable)."""
    from torch.nn.attention import SDPBackend

    if not torch.cuda.is_available():
        return [("math", SDPBackend.MATH)]
    names = [("math", "MATH"), ("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"),
             ("cudnn", "CUDNN_ATTENTION")]
    return [(n, getattr(SDPBackend, a)) for n, a in names if hasattr(SDPBackend, a)]


def sdpa_error_ratio(out: torch.Tensor, sdpa: torch.Tensor, oracle: AttentionOracle) -> float | None:
    """max |ours - oracle| / max |sdpa - oracle| over elements where the oracle is an ordinary
    value and both outputs are finite. None when both errors are 0; inf when only SDPA's is."""
    y, s, r = to_float64(out), to_float64(sdpa), oracle.out
    ok = ~oracle.special & np.isfinite(r) & np.isfinite(y) & np.isfinite(s)
    if not ok.any():
        return None
    ours, theirs = float(np.abs(y - r)[ok].max()), float(np.abs(s - r)[ok].max())
    if theirs == 0.0:
        return None if ours == 0.0 else float("inf")
    return ours / theirs

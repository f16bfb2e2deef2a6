"""Stability measurements of attention-family kernels: one case's oracle, any kernel's output
against it, and torch SDPA's backends on the same inputs as baselines (the FlashAttention
test-suite criterion: our error beside SDPA's, both against the correctly rounded oracle;
reported, never asserted).

Attention outputs cancel: an output near 0 made of large terms has a huge error in its own ULPs
that says nothing about the kernel. Errors are therefore shown in units of the bound's scale: the
derived bound with the worst-case blocking (one dot over every key, a rescale per key), the same
for every kernel and baseline on an input, so their errors compare; and as a ratio to each
kernel's own bound for the verdict.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

import numpy as np
import torch

from flashcheck.kernels.registry import KernelSpec
from flashcheck.properties_attention import blocking, fp32_dot
from flashcheck.oracles.attention import AttentionOracle, attention_oracle, compare_attention, effective_scale
from flashcheck.oracles.formats import Format, to_float64, ulp_of
from flashcheck.strategies.attention import CLASSES, case_inputs, is_varlen, varlen_inputs, varlen_sequences
from flashcheck.strategies.case import Case

from ._stats import Measurement
from .softmax import mismatch_of

FAMILY = "attention"
FEATURES = {"n": "visible keys per query", "cond": "score range max_j (t_max - t_j)"}
UNITS = "x worst-case bound"


def strategies(specs: list[KernelSpec], fmt: Format) -> dict[str, Any]:
    """One strategy per class shared by every kernel of the run; head dims as large as the
    largest any kernel takes (a kernel skips the cases it does not take)."""
    max_d = max(s.max_head_dim for s in specs)
    return {cls: st(dtype=fmt.torch_dtype, max_head_dim=None if cls == "odd_head_dims" else max_d)
            for cls, st in CLASSES.items()}


def class_names() -> list[str]:
    return list(CLASSES)


@dataclass
class Prepared:
    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kw: dict[str, Any]
    fmt: Format
    oracle: AttentionOracle | None
    scale: np.ndarray | None  # the worst-case-blocking bound per element (NaN where it is 0: exact specials)
    keys: int = 0  # key length the kernel's blocking is sized for (a varlen launch: the longest sequence)
    # A packed varlen case: (args, kwargs) of the one varlen call, then one dense part per sequence
    # (q, k, v of shape (1, H, len, D), oracle, bound) with the slices of the packed output it owns.
    varlen: tuple[tuple, dict] | None = None
    parts: list[tuple[slice, "Prepared"]] = field(default_factory=list)


def _dense(q, k, v, kw, fmt: Format, keys: int = 0) -> Prepared:
    from flashcheck.oracles.bounds import attention_error_bound

    orc = attention_oracle(q, k, v, **kw)
    n = max(k.shape[2], 1)
    worst = attention_error_bound(orc, block_n=n, n_blocks=n)
    return Prepared(q, k, v, kw, fmt, orc, np.where(worst > 0, worst, np.nan), keys or k.shape[2])


def prepare(case: Case, fmt: Format) -> Prepared:
    if not is_varlen(case):
        q, k, v, kw = case_inputs(case)
        return _dense(q, k, v, kw, fmt)
    # Judged sequence by sequence, as the suite does: each sequence's own oracle, the launch's
    # blocking (sized for max_seqlen_k).
    args, kw = varlen_inputs(case)
    dense_kw, seqs = varlen_sequences(case)
    parts = [(sq, _dense(qb, kb, vb, dense_kw, fmt, keys=keys)) for sq, qb, kb, vb, keys in seqs]
    return Prepared(*args[:3], kw, fmt, None, None, varlen=(args, kw), parts=parts)


def supports(spec: KernelSpec, p: Prepared) -> bool:
    """Only what the kernel declares it takes (undeclared means taken: a refusal then fails)."""
    if p.varlen is not None:  # one call for every sequence: each must be one the kernel takes
        return spec.varlen_fn is not None and spec.has("varlen") and all(supports(spec, d) for _, d in p.parts)
    M, N, D = p.q.shape[2], p.k.shape[2], p.q.shape[3]
    if p.keys != N:  # a varlen sequence: sized by the launch (an empty one is part of the batch)
        N = max(N, 1)
    return (spec.supports(p.q.dtype, N) and spec.supports_head_dim(D)
            and (spec.causal or not p.kw.get("causal")) and (spec.kv_lens or p.kw.get("kv_lens") is None)
            and (spec.custom_scale or p.kw.get("scale") is None) and (not spec.square_only or M == N))


def call(spec: KernelSpec, p: Prepared) -> torch.Tensor:
    if p.varlen is not None:
        args, kw = p.varlen
        out, want = spec.varlen_fn(*args, **kw), p.q.shape[:2] + p.v.shape[2:]
    else:
        q, k, v = ((t.contiguous() for t in (p.q, p.k, p.v)) if spec.contiguous_only else (p.q, p.k, p.v))
        out, want = spec.fn(q, k, v, **p.kw), p.q.shape[:3] + p.v.shape[3:]
    if not isinstance(out, torch.Tensor) or out.shape != want or out.dtype != p.q.dtype:
        raise TypeError(f"returned {type(out).__name__} {getattr(out, 'dtype', '')} "
                        f"{tuple(getattr(out, 'shape', ()))}, expected {p.q.dtype} {tuple(want)}")
    return out


def measure(spec: KernelSpec, p: Prepared, out: torch.Tensor) -> Measurement:
    if p.varlen is not None:
        ms = [measure(spec, d, out[sq].transpose(0, 1)[None]) for sq, d in p.parts]
        return Measurement(**{f.name: np.concatenate([getattr(m, f.name) for m in ms]) for f in fields(Measurement)
                              if f.name != "features"},
                           features={n: np.concatenate([m.features[n] for m in ms]) for n in FEATURES})
    orc = p.oracle
    bn, nb = blocking(spec, p.q.shape[-1], p.keys, p.q.dtype, p.kw)
    c = compare_attention(out, orc, block_n=bn, n_blocks=nb, fp32_dot=fp32_dot(spec))  # the suite's bound
    y, r = c.actual, c.oracle
    mism = mismatch_of(y, r)
    ratio = np.where(mism, np.inf, c.bound_ratio())
    unit = p.scale
    plain = ~mism & ~c.ftz & ~orc.special & np.isfinite(y) & np.isfinite(r)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        dev = y - orc.approx
        signed_ulp = np.where(plain, dev / unit, np.nan)
        signed_rel = np.where(plain & (orc.pv >= p.fmt.min_normal), dev / orc.pv, np.nan)
        yy = np.where(mism, np.inf, np.where(np.isnan(unit), np.where(c.err == 0, 0.0, np.inf), c.err / unit))
    vis = orc.visible
    n = vis.sum(axis=-1, keepdims=True).astype(np.float64)
    cond = np.where(vis, orc.d, 0.0).max(axis=-1, keepdims=True) if vis.shape[-1] else np.zeros_like(n)
    return Measurement(dist=c.dist, ratio=ratio, violation=c.violations | mism, mismatch=mism, ftz=c.ftz,
                       wide=c.bound > ulp_of(r, p.fmt), signed_ulp=signed_ulp, signed_rel=signed_rel,
                       y=yy, ybound=c.bound / unit,
                       features={"n": np.broadcast_to(n, y.shape), "cond": np.broadcast_to(cond, y.shape)})


def sdpa_output(q, k, v, *, causal=False, scale=None, kv_lens=None, backend=None) -> torch.Tensor:
    """torch SDPA on the same tensors, device and dtype, with the same scale value and masks;
    `backend` (a torch.nn.attention.SDPBackend) forces one backend, which may refuse the case."""
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

    def run() -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=bool(causal),
                                                                scale=sc)
    if backend is None:
        return run()
    from torch.nn.attention import sdpa_kernel

    with sdpa_kernel([backend]):
        return run()


def _sdpa_fn(backend):
    def fn(q, k, v, **kw):
        return sdpa_output(q, k, v, backend=backend, **kw)
    return fn


def sdpa_backends() -> list[tuple[str, Any]]:
    """The SDPA backends worth comparing on this device: math on CPU; on a GPU every backend
    (each takes the cases it accepts: the others are reported as not applicable)."""
    from torch.nn.attention import SDPBackend

    if not torch.cuda.is_available():
        return [("math", SDPBackend.MATH)]
    names = [("math", "MATH"), ("flash", "FLASH_ATTENTION"), ("efficient", "EFFICIENT_ATTENTION"),
             ("cudnn", "CUDNN_ATTENTION")]
    return [(n, getattr(SDPBackend, a)) for n, a in names if hasattr(SDPBackend, a)]


def baselines() -> list[KernelSpec]:
    """SDPA's backends on the same inputs; their bound takes the worst-case blocking."""
    return [KernelSpec(name=f"sdpa.{name}", family=FAMILY, fn=_sdpa_fn(b), external=True,
                       description=f"torch scaled_dot_product_attention, {name} backend (baseline, not judged)",
                       extra={"baseline": True}) for name, b in sdpa_backends()]


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


__all__ = ["FAMILY", "FEATURES", "UNITS", "class_names", "strategies", "prepare", "supports", "call", "measure", "baselines",
           "sdpa_output", "sdpa_error_ratio", "sdpa_backends", "blocking"]

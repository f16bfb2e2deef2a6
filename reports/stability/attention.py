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
from flashcheck.oracles.attention import AttentionOracle, attention_oracle, compare_attention
from flashcheck.oracles.formats import Format, ulp_of
from flashcheck.properties.attention import blocking, fit_to_declarations, fp32_dot
from flashcheck.properties.attention.sdpa import sdpa_backends, sdpa_error_ratio, sdpa_output
from flashcheck.strategies.attention import (
    CLASSES, KEYWORD_TENSORS, case_inputs, is_varlen, varlen_inputs, varlen_sequences,
)
from flashcheck.strategies.case import Case

from ._stats import Measurement
from .softmax import mismatch_of, returned

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
    """Only what the kernel declares it takes (undeclared means taken: a refusal then fails): the
    suite's own check (`fit_to_declarations`), on each sequence of a varlen batch (an empty one is
    part of the batch, whatever the kernel's shortest key count)."""
    if p.varlen is not None:  # one call for every sequence: each must be one the kernel takes
        return spec.varlen_fn is not None and spec.has("varlen") and all(
            d.k.shape[2] == 0 or supports(spec, d) for _, d in p.parts)
    tensors = {"q": p.q, "k": p.k, "v": p.v, **{n: p.kw[n] for n in KEYWORD_TENSORS if p.kw.get(n) is not None}}
    case = Case(tensors=tensors, kwargs={n: x for n, x in p.kw.items() if n not in KEYWORD_TENSORS})
    return fit_to_declarations(spec, case) is not None


def call(spec: KernelSpec, p: Prepared) -> torch.Tensor:
    if p.varlen is not None:
        args, kw = p.varlen
        out, want = spec.varlen_fn(*args, **kw), p.q.shape[:2] + p.v.shape[2:]
    else:
        q, k, v = ((t.contiguous() for t in (p.q, p.k, p.v)) if spec.contiguous_only else (p.q, p.k, p.v))
        out, want = spec.fn(q, k, v, **p.kw), p.q.shape[:3] + p.v.shape[3:]
    return returned(out, want, p.q.dtype)


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


def _sdpa_fn(backend):
    def fn(q, k, v, **kw):
        return sdpa_output(q, k, v, backend=backend, **kw)
    return fn


def baselines() -> list[KernelSpec]:
    """SDPA's backends on the same inputs; their bound takes the worst-case blocking."""
    return [KernelSpec(name=f"sdpa.{name}", family=FAMILY, fn=_sdpa_fn(b), external=True,
                       description=f"torch scaled_dot_product_attention, {name} backend (baseline, not judged)",
                       extra={"baseline": True}) for name, b in sdpa_backends()]


__all__ = ["FAMILY", "FEATURES", "UNITS", "class_names", "strategies", "prepare", "supports", "call", "measure", "baselines",
           "sdpa_output", "sdpa_error_ratio", "sdpa_backends", "blocking"]

"""The attention properties' shared ground: one kernel call per case (`outcome`, `Outcome`: dense
cases call `spec.fn(q, k, v, **kwargs)`, with return_lse=True when the kernel declares lse; varlen
cases call `spec.varlen_fn` once and are judged sequence by sequence, `Outcome.parts`), the key
blocking the error bound needs (`blocking`), failure messages (`describe`) and what the inputs say
about special values (`visible`, `specials`). The properties are in `core.py`,
`metamorphic.py` and `inputs.py`; `__init__.py` is the family's properties module.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import torch

from flashcheck.fixtures.store import storage_snapshot
from flashcheck.strategies.case import Case
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.attention import (
    AttentionComparison, AttentionOracle, attention_oracle, compare_attention, visibility,
)
from flashcheck.oracles.formats import Format, format_of, to_float64
from flashcheck.strategies.attention import (
    DENSE_ARGS, KEYWORD_TENSORS, VARLEN_ARGS, case_inputs, is_varlen, varlen_inputs, varlen_sequences,
)


FAMILY = "attention"
ORACLE_KEYS = ("causal", "scale", "kv_lens", "window", "softcap", "causal_align", "attn_mask")


def blocking(spec: KernelSpec, head_dim: int, n: int, dtype: torch.dtype,
             kw: dict | None = None) -> tuple[int, int]:
    """(block_n, n_blocks) the bound needs for this call: the spec's key blocking
    (`KernelSpec.key_blocking` for kw's options), and one rescale more per split of split-KV (kw's
    num_splits). num_splits=0 asks the kernel to choose (FlashAttention's and ours): the count is
    not the caller's to know, so the bound takes the most such a choice makes, a split per key
    block; a tuning of 0 declared with a block_n was held to no split's rescale before."""
    bn, nb = spec.key_blocking(head_dim, n, dtype, kw or {})
    asked = (kw or {}).get("num_splits", 1)
    splits = nb if asked == 0 else int(asked or 1)
    return bn, nb + (splits if splits > 1 else 0)


@dataclass
class Outcome:
    """One dense attention problem, the kernel's answer to it, and (lazily) the oracle."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    kw: dict  # the kernel's keywords (dense form)
    out: torch.Tensor
    lse: torch.Tensor | None
    fmt: Format
    block_n: int
    n_blocks: int
    lse_empty: float = -math.inf
    fp32_dot: str = "ieee"  # how the kernel's matmuls read fp32 operands (capability fp32_dot)
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    parts: list = field(default_factory=list)  # varlen: one dense Outcome per sequence
    _oracle: AttentionOracle | None = None
    _cmp: AttentionComparison | None = None

    @property
    def oracle_kw(self) -> dict:
        return {k: v for k, v in self.kw.items() if k in ORACLE_KEYS}

    @property
    def oracle(self) -> AttentionOracle:
        if self._oracle is None:
            self._oracle = attention_oracle(self.q, self.k, self.v, **self.oracle_kw)
        return self._oracle

    @property
    def cmp(self) -> AttentionComparison:
        if self._cmp is None:
            self._cmp = compare_attention(self.out, self.oracle, block_n=self.block_n, n_blocks=self.n_blocks,
                                          fp32_dot=self.fp32_dot)
        return self._cmp

    @property
    def out64(self) -> np.ndarray:
        return to_float64(self.out)

    def dense(self) -> list["Outcome"]:
        return self.parts if self.parts else [self]


_last: tuple[str, Case, Outcome] | None = None


def _split(res, want_lse: bool):
    if want_lse:
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise AssertionError(f"return_lse=True must give (out, lse), got {type(res).__name__}")
        return res[0], res[1]
    return res, None


def _varlen_parts(spec: KernelSpec, case: Case, out: torch.Tensor, lse: torch.Tensor | None) -> list[Outcome]:
    kw, seqs = varlen_sequences(case)
    fmt = format_of(case.tensors["q"].dtype)
    parts = []
    for sl_q, q, k, v, keys in seqs:
        o = out[sl_q].transpose(0, 1)[None]
        lb = lse[:, sl_q][None] if lse is not None else None
        # the launch is sized for the longest sequence: its blocking (conservative for this one)
        bn, nb = blocking(spec, q.shape[-1], keys, q.dtype, kw)
        parts.append(Outcome(q, k, v, kw, o, lb, fmt, bn, nb, spec.lse_empty, fp32_dot(spec)))
    return parts


def fp32_dot(spec: KernelSpec) -> str:
    """How the kernel's matmuls read fp32 operands: its declared `fp32_dot`, else "ieee"."""
    return spec.fp32_dot


def outcome(spec: KernelSpec, case: Case) -> Outcome:
    global _last
    if _last is not None and _last[0] == spec.name and _last[1] is case:
        return _last[2]
    want_lse = spec.has("lse")
    before = {n: storage_snapshot(t) for n, t in case.tensors.items()}
    if is_varlen(case):
        args, kw = varlen_inputs(case)
        out, lse = _split(spec.varlen_fn(*args, **kw, **({"return_lse": True} if want_lse else {})), want_lse)
        q, k, v = args[:3]
        o = Outcome(q, k, v, kw, out, lse, format_of(q.dtype), 0, 0, spec.lse_empty, fp32_dot(spec))
        o.parts = _varlen_parts(spec, case, out, lse)
    else:
        q, k, v, kw = case_inputs(case)
        out, lse = _split(spec.fn(q, k, v, **kw, **({"return_lse": True} if want_lse else {})), want_lse)
        bn, nb = blocking(spec, q.shape[-1], k.shape[2], q.dtype, kw)
        o = Outcome(q, k, v, kw, out, lse, format_of(q.dtype), bn, nb, spec.lse_empty, fp32_dot(spec))
    o.before = before
    o.after = {n: storage_snapshot(t) for n, t in case.tensors.items()}
    _last = (spec.name, case, o)
    return o


def kernel_call(spec: KernelSpec, tensors: list[str]) -> tuple[str, list[str], list[str], dict]:
    """How `outcome` calls the kernel on a case with these tensors, for a repro snippet:
    (entry point, positional tensors, keyword tensors, constant keywords)."""
    extra = {"return_lse": True} if spec.has("lse") else {}
    if "cu_seqlens_q" in tensors:
        return "varlen_fn", list(VARLEN_ARGS), [], extra
    return "fn", list(DENSE_ARGS), [n for n in KEYWORD_TENSORS if n in tensors], extra


def _call(spec: KernelSpec, q, k, v, kw, **extra) -> torch.Tensor:
    """The kernel's output alone (dense), whatever it returns with lse."""
    res = spec.fn(q, k, v, **{**kw, **extra})
    return res[0] if isinstance(res, (tuple, list)) else res


# ---- failure messages --------------------------------------------------------------------------

def _shapes(o: Outcome) -> str:
    parts = [f"{n} {tuple(t.shape)} stride={t.stride()} offset={t.storage_offset()}"
             for n, t in (("q", o.q), ("k", o.k), ("v", o.v))]
    extra = []
    for key, val in o.kw.items():
        if isinstance(val, torch.Tensor):
            val = val.tolist() if val.numel() <= 8 else f"tensor{tuple(val.shape)} {val.dtype}"
        extra.append(f"{key}={val}")
    return "; ".join(parts) + "; " + " ".join(extra)


def describe(spec: KernelSpec, case: Case, o: Outcome, bad: np.ndarray, what: str,
             expected: np.ndarray | None = None, err: np.ndarray | None = None,
             bound: np.ndarray | None = None, ulps: np.ndarray | None = None, actual: np.ndarray | None = None) -> str:
    score = np.where(bad, np.nan_to_num(err, nan=np.inf) if err is not None else 1.0, -1.0)
    idx = np.unravel_index(int(np.argmax(score)), score.shape)
    y = o.out64 if actual is None else actual
    lines = [f"{spec.name} [{o.fmt.name}] {what}: {int(bad.sum())} of {bad.size} elements ({case.label})",
             f"  {_shapes(o)}",
             f"  worst at {list(map(int, idx))}: kernel={float(y[idx])!r}"
             + (f" expected={float(expected[idx])!r}" if expected is not None else "")
             + (f" |err|={float(err[idx]):.4g} bound={float(bound[idx]):.4g}" if err is not None else "")
             + (f" ulps={float(ulps[idx]):g}" if ulps is not None else "")]
    return "\n".join(lines)


# ---- what the inputs say about special values ----------------------------------------------------

@dataclass
class Specials:
    zero_rows: np.ndarray  # (B, Hq, M): rows that see no key
    nan: np.ndarray  # (B, Hq, M, Dv): must be NaN
    may_nan: np.ndarray  # (B, Hq, M, Dv): may be NaN (a NaN value of an existing key hidden by a mask)


def _lens(o: Outcome) -> list[int]:
    kv = o.kw.get("kv_lens")
    return kv.tolist() if kv is not None else [o.k.shape[2]] * o.q.shape[0]


def visible(o: Outcome) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(seen (B, Hq, M, N), existing (B, Hq, M, N), bias or None) from the inputs alone."""
    B, Hq, M, _ = o.q.shape
    N = o.k.shape[2]
    lens = _lens(o)
    kw = o.kw
    seen = np.zeros((B, Hq, M, N), dtype=bool)
    exist = np.zeros((B, Hq, M, N), dtype=bool)
    for b in range(B):
        seen[b] = visibility(M, N, lens[b], bool(kw.get("causal")), kw.get("window"), kw.get("causal_align", "top_left"))
        exist[b] = visibility(M, N, lens[b])
    bias = None
    mask = kw.get("attn_mask")
    if mask is not None:
        m = mask.expand(B, Hq, M, N)
        if m.dtype == torch.bool:
            seen &= m.cpu().numpy()
        else:
            bias = to_float64(m)
            seen &= bias != -np.inf
    return seen, exist, bias


def specials(o: Outcome) -> Specials:
    q, k, v = to_float64(o.q), to_float64(o.k), to_float64(o.v)
    g = q.shape[1] // max(k.shape[1], 1)
    k, v = np.repeat(k, g, axis=1), np.repeat(v, g, axis=1)
    vis, exist, bias = visible(o)
    any_vis = vis.any(-1)
    bad_key = vis & ~np.isfinite(k).all(-1)[:, :, None, :]
    if bias is not None:
        bad_key |= vis & ~np.isfinite(bias)
    row_nan = any_vis & (~np.isfinite(q).all(-1) | bad_key.any(-1))
    v_bad = (~np.isfinite(v)).astype(np.float64)
    col_nan = (vis.astype(np.float64) @ v_bad) > 0
    nan = row_nan[..., None] | col_nan
    may = nan | ((((exist & ~vis).astype(np.float64) @ v_bad) > 0) & any_vis[..., None])
    return Specials(~any_vis, nan, may)

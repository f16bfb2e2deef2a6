"""Adversarial inputs for the attention family: one named strategy per class of NUMERICS.md s. 4
item 13, and `attention_cases`, their union.

Every strategy draws structure (shapes, masks, layout, magnitudes) and a numpy seed, then builds
q (B, H, M, D), k and v (B, H, N, D) from the seed: drawing thousands of floats one by one would
dominate the run, and Hypothesis still shrinks the structure. Values are rounded to the format
(`representable`), so the oracle sees exactly what the kernel sees. Each tensor is a view inside a
larger buffer whose other elements are NaN (`place`): a kernel that reads outside its view
poisons its output. The result is a `Case` with tensors q, k, v (and kv_lens when drawn, an
int32 tensor of shape (B,)) on `kernels.DEVICE`, kwargs causal and scale, and the class as label.

Sizes: small under the interpreter (B*H <= 2, M, N <= 64, D <= 64 except the head-dim class),
larger on a GPU; every strategy takes keyword limits to override that.
"""
from __future__ import annotations

import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from .attention_build import (  # noqa: F401  (the public import path re-exports these)
    BLOCKS, LAYOUTS, ODD_HEAD_DIMS, Caps, Limits, Shapes, _caps, default_limits, in_geometry, place,
)
from .attention_dense import (
    benign_attention, causal_rectangular, fp16_overflowing_scores, fully_masked_rows, kv_lens_edges,
    nan_in_hidden_kv, nan_in_visible_kv, odd_head_dims, ragged_lengths, strided_layouts, tied_scores,
    wide_logit_spread,
)
from .attention_options import (  # noqa: F401
    MASK_SHAPES, VARLEN_LENGTHS, WINDOW_EDGES, attn_masks, gqa_groups, large_values_many_keys,
    long_near_equal_scores, softcap_extremes, split_kv, varlen_batches, window_edges,
)
from .case import Case
from .records import StrategyClass, by_name


# The classes as records (strategies/records.py), in the order the union draws them (keep it:
# Hypothesis's draws depend on it). `needs`: the kernel features a class draws (KernelSpec.has);
# `caps_aware`: it takes the kernel's capabilities; not `in_union`: packed tensors or rows too long
# for the metamorphic tests; `shape_by_design`: M != N, odd head dims, one query row against
# thousands of keys, packed varlen batches (a square, pow2-head kernel never takes those).
_C = StrategyClass
CLASS_RECORDS: tuple[StrategyClass, ...] = (
    _C("benign", benign_attention),
    _C("wide_logit_spread", wide_logit_spread),
    _C("fp16_overflowing_scores", fp16_overflowing_scores),
    _C("odd_head_dims", odd_head_dims, shape_by_design=True),
    _C("ragged_lengths", ragged_lengths, shape_by_design=True),
    _C("kv_lens_edges", kv_lens_edges),
    _C("causal_rectangular", causal_rectangular, shape_by_design=True),
    _C("fully_masked_rows", fully_masked_rows),
    _C("nan_in_hidden_kv", nan_in_hidden_kv),
    _C("nan_in_visible_kv", nan_in_visible_kv),
    _C("strided_layouts", strided_layouts),
    _C("tied_scores", tied_scores),
    _C("gqa_groups", gqa_groups, frozenset({"gqa"}), caps_aware=True),
    _C("window_edges", window_edges, frozenset({"window"}), caps_aware=True),
    _C("softcap_extremes", softcap_extremes, frozenset({"softcap"}), caps_aware=True),
    _C("attn_masks", attn_masks, frozenset({"attn_mask"}), caps_aware=True),
    _C("split_kv", split_kv, frozenset({"splits"}), caps_aware=True),
    _C("large_values_many_keys", large_values_many_keys, caps_aware=True),
    _C("long_near_equal_scores", long_near_equal_scores, caps_aware=True, in_union=False, shape_by_design=True),
    _C("varlen_batches", varlen_batches, frozenset({"varlen"}), caps_aware=True, in_union=False, shape_by_design=True),
)
# Views of the records, for the callers that read them by name.
CLASSES = by_name(CLASS_RECORDS)
CLASS_FEATURES: dict[str, frozenset] = {r.name: r.needs for r in CLASS_RECORDS if r.needs}
FEATURE_AWARE = frozenset(r.name for r in CLASS_RECORDS if r.caps_aware)
NOT_IN_UNION = frozenset(r.name for r in CLASS_RECORDS if not r.in_union)
SHAPE_BY_DESIGN = frozenset(r.name for r in CLASS_RECORDS if r.shape_by_design)


def classes_for(caps: Caps) -> tuple[str, ...]:
    """The classes a kernel with these capabilities can be given."""
    return tuple(c for c in CLASSES if CLASS_FEATURES.get(c, frozenset()) <= caps.features)


def class_strategy(cls: str, *, dtype, caps: Caps | None = None, **limits) -> SearchStrategy[Case]:
    """One class's strategy; the feature classes get the kernel's capabilities (every class takes
    `shapes=`, the declared head dims and square_only, among the limits)."""
    if cls in FEATURE_AWARE:
        return in_geometry(CLASSES[cls](dtype=dtype, caps=caps, **limits))
    return in_geometry(CLASSES[cls](dtype=dtype, **limits))


def attention_cases(*, dtype, max_head_dim: int | None = None, max_m: int | None = None,
                    max_n: int | None = None, max_bh: int | None = None, strided: bool = True,
                    classes: tuple[str, ...] | None = None, caps: Caps | None = None,
                    shapes: Shapes | None = None) -> SearchStrategy[Case]:
    """Any adversarial dense attention input: the union of every class the capabilities allow
    (or of `classes`), varlen and the long-row class left out."""
    names = classes or tuple(c for c in classes_for(_caps(caps)) if c not in NOT_IN_UNION)
    return st.one_of([class_strategy(c, dtype=dtype, caps=caps, max_m=max_m, max_n=max_n,
                                     max_head_dim=max_head_dim, max_bh=max_bh, strided=strided, shapes=shapes)
                      for c in names])


def is_varlen(case: Case) -> bool:
    return "cu_seqlens_q" in case.tensors


#: How a case's tensors reach the kernel: dense fn(q, k, v, kv_lens=, attn_mask=, **kwargs);
#: varlen fn(q, k, v, cu_seqlens_q, cu_seqlens_k, **kwargs).
DENSE_ARGS = ("q", "k", "v")
KEYWORD_TENSORS = ("kv_lens", "attn_mask")
VARLEN_ARGS = ("q", "k", "v", "cu_seqlens_q", "cu_seqlens_k")


def case_inputs(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """(q, k, v, kwargs) to call an attention kernel on a dense case: fn(q, k, v, **kwargs)
    (varlen cases: kwargs start with cu_seqlens_q/k, see `varlen_inputs`)."""
    kw = dict(case.kwargs)
    for name in KEYWORD_TENSORS:
        if name in case.tensors:
            kw[name] = case.tensors[name]
    return case.tensors["q"], case.tensors["k"], case.tensors["v"], kw


def varlen_inputs(case: Case) -> tuple[tuple[torch.Tensor, ...], dict]:
    """(args, kwargs) for a varlen entry point: fn(q, k, v, cu_q, cu_k, **kwargs)."""
    return tuple(case.tensors[n] for n in VARLEN_ARGS), dict(case.kwargs)


def varlen_sequences(case: Case) -> tuple[dict, list[tuple[slice, torch.Tensor, torch.Tensor, torch.Tensor, int]]]:
    """A packed varlen case as one dense problem per sequence: the kwargs of a dense call (no
    max_seqlen_*), and per sequence its rows of the packed output, its q, k, v as (1, H, len, D)
    views, and the key length the one varlen launch is sized for (its blocking: max_seqlen_k)."""
    t = case.tensors
    cq, ck = t["cu_seqlens_q"].tolist(), t["cu_seqlens_k"].tolist()
    kw = {n: x for n, x in case.kwargs.items() if n not in ("max_seqlen_q", "max_seqlen_k")}
    seqs = []
    for b in range(len(cq) - 1):
        sq, sk = slice(cq[b], cq[b + 1]), slice(ck[b], ck[b + 1])
        q, k, v = (x.transpose(0, 1)[None] for x in (t["q"][sq], t["k"][sk], t["v"][sk]))
        seqs.append((sq, q, k, v, max(int(case.kwargs["max_seqlen_k"]), k.shape[2])))
    return kw, seqs


__all__ = ["CLASSES", "CLASS_FEATURES", "LAYOUTS", "ODD_HEAD_DIMS", "Caps", "Limits", "default_limits",
           "attention_cases", "case_inputs", "varlen_inputs", "varlen_sequences", "is_varlen", "classes_for", "class_strategy",
           "place", *[f.__name__ for f in CLASSES.values()]]
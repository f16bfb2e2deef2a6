"""Adversarial inputs for an attention backward pass (issue 51 item 3; the oracle and the bound:
docs/NUMERICS.md section 10, the classes 10.5).

A case is a forward case (`strategies/attention.py`: q, k, v, kv_lens / attn_mask / cu_seqlens, the
kwargs) plus "do", the output gradient dO, shaped as the forward's output ((B, Hq, M, Dv) dense,
(total_q, Hq, Dv) varlen), in a NaN-guarded buffer of its own layout (`attention_backward_build`).
The classes draw through the forward's builders (sizes, `_Parts`, `_finish`, `place`) or are the
forward's feature classes themselves with dO added (windows, varlen). `backward_calls` turns a case
into the calls of `oracles.attention_backward.attention_backward_oracle` it stands for.

`BACKWARD_CLASS_RECORDS` / `BACKWARD_CLASSES` in the house style (records.py): `needs` are the
attention features (kernels.attention_spec.ATTENTION_FEATURES) a class cannot do without, as the
forward's `CLASS_FEATURES`; every class takes the kernel's `caps` and draws causal, kv_lens and
Dv != D only where they are declared. Mode lists shrink to their first, simplest entry; dO values
shrink to a constant (`floats.backgrounds`). Sizes stay where the CPU oracle takes well under a
second per case (`backward_limits`; the per-class caps below say where they are tighter).
"""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy, composite

from flashcheck.kernels._runtime import INTERPRET
from flashcheck.oracles.attention import effective_scale
from flashcheck.oracles.formats import FP16, FP32, to_float64

from .attention import case_inputs, is_varlen, varlen_sequences
from .attention_backward_build import (
    ABOUT_ONE, DO_LAYOUTS, backward_limits, cheap, dims, do_shape, do_values, fold, grads64, kv_lens, options,
    peaked_qk, plain_parts, setup as _setup, visible, with_do,
)
from .attention_backward_options import (
    BIG_KINDS, BOOL_MASK_SHAPES, INT32_LIMIT, MASKED_KINDS, SOFTCAP_KINDS, backward_big_offsets, backward_gqa_groups,
    backward_masked_rows, backward_masked_rows_bool, backward_softcap_saturated, backward_varlen_batches,
    backward_window_edges, big_offset_layouts,
)
from .attention_build import (
    LAYOUTS, Caps, _bh, _caps, _finish, _head_dim, _lengths, _normal, _Parts, _seed, _value_dim, in_geometry, place,
)
from .case import Case
from .floats import representable
from .records import StrategyClass, by_name


def _align(parts: _Parts) -> str:
    return (parts.options or {}).get("causal_align", "top_left")


def _rounded(parts: _Parts, fmt) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(representable(a, fmt) for a in (parts.q, parts.k, parts.v))  # type: ignore[return-value]


def _ref(parts: _Parts, do: np.ndarray, fmt) -> dict[str, np.ndarray]:
    """`grads64` of the parts as the kernel will see them (rounded), dO as given."""
    q, k, v = _rounded(parts, fmt)
    b, _, m, d = q.shape
    vis = visible(b, m, k.shape[2], parts.kv_lens, parts.causal, _align(parts))
    return grads64(q, k, v, do, vis, effective_scale(parts.scale, d))


# ---- the classes -------------------------------------------------------------------------------

@composite
def backward_benign(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                    strided: bool = True, caps: Caps | None = None) -> Case:
    """N(0, sigma) q, k, N(0, 1) v and dO of any shape (REAL_BUGS attention 1: causal and not)."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    rng = np.random.default_rng(draw(_seed()))
    parts = plain_parts(draw, rng, lim, caps, sigma=draw(st.sampled_from([1.0, 0.25, 3.0])))
    return with_do(draw, _finish(draw, parts, fmt, "benign", strided=strided), fmt, strided=strided)


#: P's window per mode: about 0.99; rounding to 1 in fp16 and bf16 (1 - P ~ 1e-5, below half their
#: ulp under 1) but not in fp32; rounding to 1 in fp32 too. The closer P is to 1, the more of dS the
#: float64 path cannot decide, hence the caps (the exact path evaluates every row of a head).
CONFIDENT = {"p99": (0.99, 0.999), "rounds_to_one": (1 - 2.0**-15, 1 - 2.0**-19),
             "fp32_one": (1 - 2.0**-26, 1 - 2.0**-30)}
CONFIDENT_CAPS = {"p99": {}, "rounds_to_one": dict(m=32, n=32, d=32), "fp32_one": dict(m=8, n=8, d=8)}
CONFIDENT_CAPS_FP32 = {"p99": {}, "rounds_to_one": dict(m=16, n=16, d=16), "fp32_one": dict(m=8, n=8, d=8)}


@composite
def backward_confident(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                       strided: bool = True, caps: Caps | None = None) -> Case:
    """Every row that sees a key puts P >= 0.99 on one key (`peaked_qk`): D_i ~ dP_ij*, so
    dS_ij* = P (dP_ij* - D_i) cancels and the other dS are tiny (REAL_BUGS attention 2: dq wrong on
    real, peaked activations only). dO about 1, never 0 (the cancellation is real)."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    kind = draw(st.sampled_from(list(CONFIDENT)))
    b, h, m, n, d = fold(draw(dims(lim, min_n=2)), (CONFIDENT_CAPS_FP32 if fmt == FP32 else CONFIDENT_CAPS)[kind],
                         lo={"n": 2})
    causal, align, opts = options(draw, caps, True)
    rng = np.random.default_rng(draw(_seed()))
    q, k = peaked_qk(rng, fmt, (b, h, m, n, d), visible(b, m, n, None, causal, align), effective_scale(None, d),
                     ties=1, window=CONFIDENT[kind], front=causal)
    parts = _Parts(q, k, _normal(rng, (b, h, n, _value_dim(draw, caps, d, lim))), causal=causal, options=opts)
    return with_do(draw, _finish(draw, parts, fmt, f"confident/{kind}", strided=strided), fmt, strided=strided,
                   **ABOUT_ONE)


TIE_KINDS = ("pair", "many", "constant")


@composite
def backward_tied_maxima(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                         strided: bool = True, caps: Caps | None = None) -> Case:
    """Every row's maximum score reached by k >= 2 identical keys: a pair or 3-8 of them holding
    P ~ 0.99 together, or a constant row (q = 0 or every key equal: P = 1/N exactly). No causal
    mask or kv_lens: each row sees its whole tie. Constant rows make dq (equal keys) or dk (q = 0)
    cancel exactly, every element on the oracle's exact path: M, N, D <= 16 there."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    kind = draw(st.sampled_from(TIE_KINDS))
    b, h, m, n, d = fold(draw(dims(lim, min_n=2)), dict(m=16, n=16, d=16) if kind == "constant" else {}, lo={"n": 2})
    n = max(n, 3) if kind == "many" else n
    rng = np.random.default_rng(draw(_seed()))
    if kind == "constant":
        q, k = _normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d))
        if draw(st.booleans()):
            q[:] = 0.0
        else:
            k[:] = k[:, :, :1]
    else:
        ties = 2 if kind == "pair" else draw(st.integers(3, min(n, 8)))
        q, k = peaked_qk(rng, fmt, (b, h, m, n, d), np.ones((1, 1, m, n), bool), effective_scale(None, d),
                         ties=ties, window=CONFIDENT["p99"], front=False)
    parts = _Parts(q, k, _normal(rng, (b, h, n, _value_dim(draw, caps, d, lim))))
    return with_do(draw, _finish(draw, parts, fmt, f"tied_maxima/{kind}", strided=strided), fmt, strided=strided)


@composite
def backward_single_key(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                        strided: bool = True, caps: Caps | None = None) -> Case:
    """seqlen_k = 1: P = 1 exactly, so dS = 0, dq = dk = 0 and dv = sum_i dO_i exactly (the case
    FlashAttention's own test holds to a bound of 0, flash-attention #1253); kv_lens 0 or 1 and
    bottom-right causal (only the last row sees the key) where declared. Every dq element takes
    the oracle's exact path: M <= 32."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    lim = cheap(lim, m=32)
    b, h = draw(_bh(lim))
    m, d = draw(_lengths(lim.max_m)), draw(_head_dim(lim))
    causal, _, opts = options(draw, caps, True)
    lens = [draw(st.integers(0, 1)) for _ in range(b)] if "kv_lens" in caps and draw(st.booleans()) else None
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, 1, d)),
                   _normal(rng, (b, h, 1, _value_dim(draw, caps, d, lim))), causal=causal, kv_lens=lens, options=opts)
    return with_do(draw, _finish(draw, parts, fmt, "single_key", strided=strided), fmt, strided=strided)


LARGE_KINDS = ("moderate", "near_max", "past_fp16")


@composite
def backward_large_do(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                      strided: bool = True, caps: Caps | None = None) -> Case:
    """|dO| scaled by a power of two (exact) as far as the gradients and every intermediate (dP of
    every pair, masked ones too, since a kernel computes a whole block's; D, dS; float64 estimates)
    stay below max/8 of the format: 2^13 at most ("moderate"), as far as
    that goes ("near_max"), or where |dS| passes fp16's 65504 (bf16, fp32: a dS cast to fp16
    whatever the input, Triton tutorial 06, overflows; fp16 draws near_max)."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    kind = draw(st.sampled_from(LARGE_KINDS))
    kind = "near_max" if kind == "past_fp16" and fmt == FP16 else kind
    rng = np.random.default_rng(draw(_seed()))
    parts = plain_parts(draw, rng, lim, caps)
    do = representable(draw(do_values((*parts.q.shape[:3], parts.v.shape[-1]), **ABOUT_ONE)), fmt)
    ref = _ref(parts, do, fmt)
    size = max([float(np.abs(do).max(initial=0.0))] + [float(np.abs(ref[x]).max(initial=0.0))
                                                        for x in ("dp", "D", "ds", "dq", "dk", "dv")])
    top = math.floor(math.log2(fmt.max_finite / 8.0 / max(size, 1e-30)))
    e = {"moderate": min(13, top), "near_max": top}.get(kind)
    if e is None:  # past_fp16: |dS| to 2-4 x 65504, if the format has room (else the label says near_max)
        ds = float(np.abs(ref["ds"]).max(initial=0.0))
        e = min(top, math.ceil(math.log2(2.0 * FP16.max_finite / ds))) if ds > 0 else top
        kind = kind if ds * 2.0**e > 1.01 * FP16.max_finite else "near_max"
    case = _finish(draw, parts, fmt, f"large_do/{kind}", strided=strided)
    return with_do(draw, case, fmt, do * 2.0**e, strided=strided)


DO_ZERO_KINDS = ("rows", "scattered", "at_peak", "columns", "all")


@composite
def backward_do_zeros(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                      strided: bool = True, caps: Caps | None = None) -> Case:
    """dO with exact zeros (+0, or -0 sometimes) amid values about 1: whole rows (dq_i = 0 exactly),
    scattered, at each row's largest |O_id| (the largest term of D_i = dO_i . O_i), whole columns
    (dv[..., d] = 0 exactly), everywhere."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    kind = draw(st.sampled_from(DO_ZERO_KINDS))
    rng = np.random.default_rng(draw(_seed()))
    parts = plain_parts(draw, rng, lim, caps)
    do = representable(draw(do_values((*parts.q.shape[:3], parts.v.shape[-1]), **ABOUT_ONE)), fmt)
    neg = draw(st.booleans())
    zero = -0.0 if neg else 0.0
    # which rows, columns, entries: from the seed, so that every mode makes the same draws and the
    # shrinker prefers the first
    pick = lambda n: np.flatnonzero((rng.random(n) < 0.5) | (np.arange(n) == rng.integers(n)))  # noqa: E731
    if kind == "rows":
        do[:, :, pick(do.shape[2]), :] = zero
    elif kind == "scattered":
        hit = rng.random(do.shape) < 0.5
        hit.flat[rng.integers(hit.size)] = True  # one zero at least, even in a single element
        do[hit] = zero
    elif kind == "at_peak":
        peak = np.argmax(np.abs(_ref(parts, do, fmt)["o"]), axis=-1)
        np.put_along_axis(do, peak[..., None], zero, axis=-1)
    elif kind == "columns":
        do[..., pick(do.shape[3])] = zero
    else:
        do[:] = zero
    case = _finish(draw, parts, fmt, f"do_zeros/{kind}" + ("/neg" if neg else ""), strided=strided)
    return with_do(draw, case, fmt, do, strided=strided)


DP_KINDS = ("near_equal_values", "parallel", "exact")
#: v_j = c (1 + 2^-s N(0, 1)): dP_ij - D_i ~ 2^-s |dP_ij|. s stays 2 bits inside the format's
#: precision: past it the values round to c itself, which is the exact mode at full size (every dS
#: on the oracle's exact path).
SPREADS = (10, 6, 14)
#: M, N, D caps of the modes whose dS the float64 path cannot decide: exact (all of them), and fp32's
#: near modes (its ulp is near the float64 path's relative error on dS ~ 2^-s dP)
DP_CAPS = {"exact": dict(m=24, n=24, d=16), "fp32": dict(m=16, n=16, d=16)}


@composite
def backward_dp_near_d(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                       strided: bool = True, caps: Caps | None = None) -> Case:
    """dP_ij close to D_i for every key, so dP - D cancels in every dS (to ~2^-s of dP's terms
    sum_d |dO_id v_jd|): values v_j = c (1 + 2^-s noise) about one row c, with dO about 1 or nearly
    parallel to the row's o (dO_i = a o_i (1 + 2^-8 noise)); or exactly ("exact": v varies only in
    columns where dO is 0, so dP_ij = D_i and dS = dq = dk = 0 exactly, which the oracle reaches on
    its exact path: M, N <= 24, D <= 16)."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    kind = draw(st.sampled_from(DP_KINDS))
    rng = np.random.default_rng(draw(_seed()))
    parts = plain_parts(draw, rng, lim, caps, fold_to=DP_CAPS.get(kind, DP_CAPS["fp32"] if fmt == FP32 else None))
    b, h, n, dv = parts.v.shape
    c = _normal(rng, (b, h, 1, dv))
    do = representable(draw(do_values((*parts.q.shape[:3], dv), **ABOUT_ONE)), fmt)
    spread = min(draw(st.sampled_from(SPREADS)), fmt.precision - 2)  # drawn in every mode (shrinking)
    if kind == "exact":
        cols = np.flatnonzero(rng.random(dv) < 0.5)[:dv - 1]  # never all: dO keeps a nonzero column
        parts.v = np.broadcast_to(c, (b, h, n, dv)).copy()
        parts.v[..., cols] = _normal(rng, (b, h, n, len(cols)))
        do[..., cols] = 0.0
    else:
        parts.v = c * (1.0 + 2.0**-spread * _normal(rng, (b, h, n, dv)))
        if kind == "parallel":
            o = _ref(parts, do, fmt)["o"]
            a = np.array(draw(st.sampled_from([1.0, -3.0, 0.5])))
            do = representable(a * o * (1.0 + 2.0**-8 * _normal(rng, o.shape)), fmt)
    case = _finish(draw, parts, fmt, f"dp_near_d/{kind}", strided=strided)
    return with_do(draw, case, fmt, do, strided=strided)


@composite
def backward_strided_do(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                        strided: bool = True, caps: Caps | None = None) -> Case:
    """Contiguous q, k, v and a non-contiguous dO, laid out as an output is handed back (BSHD, a
    padded slice, a stepped head dim, a transposed (M, Dv)) at an offset of 0-5 elements (mostly not
    16-byte aligned), Dv != D where declared: a kernel reading dO (or the O it pairs it with for D) with q's strides or
    head dim is wrong. `strided` is ignored: the layout is the point."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    two = lim.max_bh >= 2  # BSHD with one head would be contiguous
    rng = np.random.default_rng(draw(_seed()))
    parts = plain_parts(draw, rng, lim, caps, min_m=2, min_d=2, bh=(1, 2) if two else (1, 1))
    one_col = parts.v.shape[-1] == 1  # a transposed (M, 1) is contiguous
    layout = draw(st.sampled_from([x for x in DO_LAYOUTS if x != "bhsd" and (two or x != "bshd")
                                   and not (one_col and x == "transposed")]))
    case = _finish(draw, parts, fmt, "strided_do", layout="bhsd")
    return with_do(draw, case, fmt, layout=layout, unaligned=True)


@composite
def backward_strided_views(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                           strided: bool = True, caps: Caps | None = None) -> Case:
    """q, k, v and dO each in a different layout (a permutation of the forward's four; dO may take
    the transposed one instead), each at its own offset 0-5 (mostly not 16-byte aligned): a kernel
    that shares one tensor's strides or offset with another reads NaN guards. `strided` is ignored."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    rng = np.random.default_rng(draw(_seed()))
    parts = plain_parts(draw, rng, lim, caps, min_m=2, min_n=2, min_d=2, bh=(1, 2) if lim.max_bh >= 2 else (1, 1))
    lq, lk, lv, ldo = draw(st.permutations(LAYOUTS))
    ldo = draw(st.sampled_from([ldo, "transposed"])) if parts.v.shape[-1] > 1 else ldo
    case = _finish(draw, parts, fmt, "strided_views", layout=lq, unaligned=True)
    for name, layout in (("k", lk), ("v", lv)):
        x = to_float64(case.tensors[name])
        case.tensors[name] = place(x, fmt, layout, pad=draw(st.integers(1, 9)), offset=draw(st.integers(0, 5)))
    return with_do(draw, case, fmt, layout=ldo, unaligned=True, label=f"strided_views/{lq}-{lk}-{lv}")


OFF_BLOCK = (1, 15, 17, 63, 65, 129)


@composite
def backward_off_block_sizes(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                             strided: bool = True, caps: Caps | None = None) -> Case:
    """M and N one off a block size (1, 15, 17, 63, 65, 129), drawn apart (M != N: K/V swapped or
    transposed twice passes square shapes, REAL_BUGS attention 10), two heads (dv wrong for heads
    1.. on the first (64 - S % 64) % 64 rows, REAL_BUGS 6). Up to 129 even on the CPU (its own
    default); fp32 keeps M N <= 65 x 17 (the oracle's exact path is per head of M N exps)."""
    caps, fmt, lim = _setup(dtype, caps, max_m or 129, max_n or 129, max_head_dim, max_bh, shapes)
    m = draw(st.sampled_from([x for x in OFF_BLOCK if x <= lim.max_m] or [1]))
    n = draw(st.sampled_from([x for x in OFF_BLOCK if x <= lim.max_n] or [1]))
    budget = 65 * 17 if fmt == FP32 else 129 * 129  # after the draw: the same draws for every M (shrinking)
    n = n if m * n <= budget else max(x for x in OFF_BLOCK if m * x <= budget)
    d = draw(_head_dim(cheap(lim, d=16 if n == 1 else 64)))  # N = 1: every dq element on the exact path
    causal, _, opts = options(draw, caps, True)
    b, h = 1, min(2, lim.max_bh)
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)),
                   _normal(rng, (b, h, n, _value_dim(draw, caps, d, lim))), causal=causal,
                   kv_lens=kv_lens(draw, caps, b, n), options=opts)
    return with_do(draw, _finish(draw, parts, fmt, f"off_block_sizes/M{m}N{n}", strided=strided), fmt,
                   strided=strided)


# ---- the table ---------------------------------------------------------------------------------

# In the order a union draws them (keep it: Hypothesis's draws depend on it). Every class takes the
# kernel's caps; `needs` as the forward's CLASS_FEATURES; not in the union: packed varlen tensors
# (another entry point) and the GPU-only storages of more than 2^31 elements.
_C = StrategyClass
BACKWARD_CLASS_RECORDS: tuple[StrategyClass, ...] = (
    _C("benign", backward_benign, caps_aware=True),
    _C("confident", backward_confident, caps_aware=True),
    _C("tied_maxima", backward_tied_maxima, caps_aware=True),
    _C("single_key", backward_single_key, caps_aware=True, shape_by_design=True),
    _C("large_do", backward_large_do, caps_aware=True),
    _C("do_zeros", backward_do_zeros, caps_aware=True),
    _C("dp_near_d", backward_dp_near_d, caps_aware=True),
    _C("strided_do", backward_strided_do, caps_aware=True),
    _C("strided_views", backward_strided_views, caps_aware=True),
    _C("off_block_sizes", backward_off_block_sizes, caps_aware=True, shape_by_design=True),
    _C("masked_rows", backward_masked_rows, frozenset({"kv_lens"}), caps_aware=True),
    _C("masked_rows_bool", backward_masked_rows_bool, frozenset({"attn_mask"}), caps_aware=True),
    _C("gqa_groups", backward_gqa_groups, frozenset({"gqa"}), caps_aware=True),
    _C("window_edges", backward_window_edges, frozenset({"window"}), caps_aware=True),
    _C("softcap_saturated", backward_softcap_saturated, frozenset({"softcap"}), caps_aware=True),
    _C("varlen_batches", backward_varlen_batches, frozenset({"varlen"}), caps_aware=True, in_union=False,
       shape_by_design=True),
    _C("big_offsets", backward_big_offsets, caps_aware=True, in_union=False, shape_by_design=True),
)
BACKWARD_CLASSES = by_name(BACKWARD_CLASS_RECORDS)
BACKWARD_CLASS_FEATURES: dict[str, frozenset] = {r.name: r.needs for r in BACKWARD_CLASS_RECORDS if r.needs}
NOT_IN_UNION = frozenset(r.name for r in BACKWARD_CLASS_RECORDS if not r.in_union)
GPU_ONLY = frozenset({"big_offsets"})


def backward_classes_for(caps: Caps | None = None) -> tuple[str, ...]:
    """The classes a kernel with these capabilities can be given (here: the GPU-only ones left out
    under the interpreter)."""
    caps = _caps(caps)
    return tuple(c for c in BACKWARD_CLASSES if BACKWARD_CLASS_FEATURES.get(c, frozenset()) <= caps.features
                 and not (INTERPRET and c in GPU_ONLY))


def backward_class_strategy(cls: str, *, dtype, caps: Caps | None = None, **limits) -> SearchStrategy[Case]:
    """One class's strategy, inside a compile-aware geometry on a GPU (as the forward's)."""
    return in_geometry(BACKWARD_CLASSES[cls](dtype=dtype, caps=caps, **limits))


def attention_backward_cases(*, dtype, caps: Caps | None = None, classes: tuple[str, ...] | None = None,
                             **limits) -> SearchStrategy[Case]:
    """Any dense backward input the capabilities allow: the union of the classes in it (or `classes`)."""
    names = classes or tuple(c for c in backward_classes_for(caps) if c not in NOT_IN_UNION)
    return st.one_of([backward_class_strategy(c, dtype=dtype, caps=caps, **limits) for c in names])


Call = tuple[slice | None, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, dict]


def backward_calls(case: Case) -> list[Call]:
    """The oracle calls a case stands for, as (rows, q, k, v, do, kwargs) for
    `attention_backward_oracle(q, k, v, do, **kwargs)`: one for a dense case (rows None), one per
    sequence of a varlen case (rows: its slice of the packed dq and dO; q, k, v, do (1, H, len, D))."""
    if not is_varlen(case):
        q, k, v, kw = case_inputs(case)
        return [(None, q, k, v, case.tensors["do"], kw)]
    kw, seqs = varlen_sequences(case)
    do = case.tensors["do"]
    return [(rows, q, k, v, do[rows].transpose(0, 1)[None], kw) for rows, q, k, v, _ in seqs]


__all__ = ["BACKWARD_CLASS_RECORDS", "BACKWARD_CLASSES", "BACKWARD_CLASS_FEATURES", "GPU_ONLY", "NOT_IN_UNION",
           "BIG_KINDS", "DO_LAYOUTS", "INT32_LIMIT", "OFF_BLOCK", "CONFIDENT", "TIE_KINDS", "LARGE_KINDS",
           "DO_ZERO_KINDS", "DP_KINDS", "MASKED_KINDS", "BOOL_MASK_SHAPES", "SOFTCAP_KINDS",
           "attention_backward_cases", "backward_calls", "backward_class_strategy", "backward_classes_for",
           "backward_limits", "big_offset_layouts", "do_shape", *[r.strategy.__name__ for r in BACKWARD_CLASS_RECORDS]]

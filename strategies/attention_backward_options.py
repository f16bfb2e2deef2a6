"""The attention backward classes about masks and declared features (kv_lens, boolean masks, GQA,
windows, softcap, varlen) and the GPU-only `big_offsets`. Re-exported by
`strategies/attention_backward.py`, whose `BACKWARD_CLASS_RECORDS` is the order a union draws in.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import composite

from flashcheck.kernels._runtime import DEVICE, INTERPRET
from flashcheck.oracles.attention import effective_scale
from flashcheck.oracles.formats import FP32

from .attention_backward_build import cheap, dims, do_values, fold, kv_lens, options, setup as _setup, visible, with_do
from .attention_build import (
    Caps, _caps, _finish, _fmt, _head_dim, _key_len, _lengths, _normal, _Parts, _seed, _value_dim,
)
from .attention_options import _diagonal_across_edge, varlen_batches, window_edges
from .case import Case
from .floats import representable


POISONS = ("zero", "nan", "inf", "huge")


def _poison_empty_rows(do: np.ndarray, vis: np.ndarray, poison: str, fmt) -> np.ndarray:
    """dO of the rows that see no key set to the poison: their gradients are still exactly 0 and
    they add nothing (NUMERICS.md 10.2), where a kernel's P . dO = 0 . NaN is NaN (REAL_BUGS
    attention 13)."""
    if poison == "zero":
        return do
    out = do.copy()
    out[np.broadcast_to(~vis.any(-1), do.shape[:3])] = {"nan": np.nan, "inf": np.inf, "huge": fmt.max_finite}[poison]
    return out


MASKED_KINDS = ("empty_batch", "padded_keys", "empty_rows_causal")


@composite
def backward_masked_rows(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                         strided: bool = True, caps: Caps | None = None) -> Case:
    """Rows that see no key and keys no row sees, through kv_lens: a batch with kv_lens 0, keys
    padded past an off-block kv_len, bottom-right causal rows above the diagonal (where declared;
    else an empty batch); hidden K/V and the empty rows' dO hold 0, NaN, inf or the format's max
    (REAL_BUGS attention 13; FlashAttention's varlen tests zero such positions before comparing)."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    kind = draw(st.sampled_from(MASKED_KINDS))
    if kind == "empty_rows_causal" and ("causal" not in caps or "bottom_right" not in caps.aligns):
        kind = "empty_batch"
    b = max(1, min(2, lim.max_bh))
    # kv_len 1 puts every dq element of a row on the oracle's exact path: D <= 32
    _, h, m, n, d = draw(dims(cheap(lim, d=32), min_m=2 if kind == "empty_rows_causal" else 1, min_n=2, bh=(b, 1)))
    if kind == "empty_batch":
        lens = [0] + [draw(st.integers(0, n)) for _ in range(b - 1)]
    elif kind == "padded_keys":
        lens = [draw(st.sampled_from(sorted({x for x in (1, 15, 17, 31, 33, n - 1) if 0 < x < n}))) for _ in range(b)]
    else:  # kv_len < M: bottom-right's first M - kv_len rows see nothing
        lens = [draw(st.integers(0, min(n, m - 1))) for _ in range(b)]
    causal = kind == "empty_rows_causal" or ("causal" in caps and draw(st.booleans()))
    align = ("bottom_right" if kind == "empty_rows_causal" else draw(st.sampled_from(caps.aligns)) if causal
             else "top_left")
    poison = draw(st.sampled_from(POISONS))
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)), causal=causal,
                   kv_lens=lens, options={"causal_align": align} if causal and len(caps.aligns) > 1 else {})
    do = _poison_empty_rows(representable(draw(do_values((b, h, m, d))), fmt),
                            visible(b, m, n, lens, causal, align), poison, fmt)
    case = _finish(draw, parts, fmt, f"masked_rows/{kind}/{poison}", strided=strided, hidden=poison)
    return with_do(draw, case, fmt, do, strided=strided)


BOOL_MASK_SHAPES = ("full", "2d", "heads_broadcast")


@composite
def backward_masked_rows_bool(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                              strided: bool = True, caps: Caps | None = None) -> Case:
    """A boolean attn_mask with whole rows False (dq exactly 0, no share of dk, dv) and often whole
    key columns False (dk = dv = 0 exactly), broadcast or full; the empty rows' dO poisoned as in
    `backward_masked_rows` (a custom mask's NaN k/v gradients, REAL_BUGS attention 8)."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    b, h, m, n, d = draw(dims(lim, min_n=2))
    kind = draw(st.sampled_from(BOOL_MASK_SHAPES))
    shape = {"full": (b, h, m, n), "2d": (m, n), "heads_broadcast": (b, 1, m, n)}[kind]
    rng = np.random.default_rng(draw(_seed()))
    mask = rng.random(shape) < draw(st.sampled_from([0.5, 0.9, 0.2]))
    mask[..., sorted(draw(st.sets(st.integers(0, m - 1), min_size=1))), :] = False
    if draw(st.booleans()):
        mask[..., sorted(draw(st.sets(st.integers(0, n - 1), min_size=1, max_size=n - 1)))] = False
    causal, align, opts = options(draw, caps, True)
    lens = kv_lens(draw, caps, b, n)
    poison = draw(st.sampled_from(POISONS))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)), causal=causal,
                   kv_lens=lens, options=opts, mask=mask)
    vis = visible(b, m, n, lens, causal, align) & np.broadcast_to(mask, (b, h, m, n))
    do = _poison_empty_rows(representable(draw(do_values((b, h, m, d))), fmt), vis, poison, fmt)
    case = _finish(draw, parts, fmt, f"masked_rows_bool/{kind}/{poison}", strided=strided)
    return with_do(draw, case, fmt, do, strided=strided)


#: (Hkv, G): 4 query heads on 2, MQA with 8 on 1 first; then groups not a power of two.
GROUPS = ((2, 2), (1, 8), (1, 3), (2, 3), (1, 4))


@composite
def backward_gqa_groups(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                        strided: bool = True, caps: Caps | None = None) -> Case:
    """Grouped heads: dk, dv sum over the G query heads of a key/value head (a head index split by
    the wrong count reads other heads or uninitialised memory, REAL_BUGS attention 5); short query
    lengths off every tile (a packed tile holds a group boundary) and causal diagonals across a
    key-block edge (the forward's `_diagonal_across_edge`); Dv != D where declared. fp32 keeps
    G M N <= 2048 (one undecided dk evaluates the group's G M rows)."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    hkv, g = draw(st.sampled_from(GROUPS))
    m = min(draw(st.sampled_from([1, 3, 5, 7, 13, 17, 33])) if draw(st.booleans()) else draw(_lengths(lim.max_m)),
            lim.max_m)
    if fmt == FP32:
        lim = cheap(lim, n=max(1, 2048 // (g * m)))
    causal, align, opts = options(draw, caps, True)
    n = _diagonal_across_edge(draw, lim, m, align) if causal else None
    label = "/diagonal_across_edge" if n is not None else ""
    n = n if n is not None else draw(_key_len(lim, m))
    d = draw(_head_dim(lim))
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (1, hkv * g, m, d)), _normal(rng, (1, hkv, n, d)),
                   _normal(rng, (1, hkv, n, _value_dim(draw, caps, d, lim))), causal=causal,
                   kv_lens=kv_lens(draw, caps, 1, n), options=opts)
    case = _finish(draw, parts, fmt, f"gqa_groups/{hkv * g}:{hkv}{label}", strided=strided)
    return with_do(draw, case, fmt, strided=strided)


def _forward_limits(lim) -> dict:
    return dict(max_m=lim.max_m, max_n=lim.max_n, max_head_dim=lim.max_head_dim, max_bh=lim.max_bh, shapes=lim.shapes)


@composite
def backward_window_edges(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                          strided: bool = True, caps: Caps | None = None) -> Case:
    """The forward's `window_edges` (left/right 0, 1, unlimited, wider than N, both alignments,
    rows emptied under bottom-right, the last row's left edge one key past a block edge) with dO: a
    backward run without the window (REAL_BUGS attention 7), or banding its key blocks otherwise
    than the forward, is wrong in dk, dv of the edge keys."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    case = draw(window_edges(dtype=dtype, caps=caps, strided=strided, **_forward_limits(lim)))
    return with_do(draw, case, fmt, strided=strided)


@composite
def backward_varlen_batches(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                            strided: bool = True, caps: Caps | None = None) -> Case:
    """The forward's `varlen_batches` (sequences of length 0 and 1 beside ones of 17-40, totals off
    block multiples, GQA, Dv != D, causal, windows as declared) with a packed dO (total_q, Hq, Dv)
    in its own layout: every sequence's gradients as if alone (REAL_BUGS attention 5, 13)."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    case = draw(varlen_batches(dtype=dtype, caps=caps, strided=strided, **_forward_limits(lim)))
    return with_do(draw, case, fmt, strided=strided)


SOFTCAP_KINDS = ("mixed", "all_saturated")
SOFTCAPS = (5.0, 1.0, 30.0, 50.0)
Z_MAX = 300.0  # |y / c| at most: sech^2 stays a float64 normal (past 355 the oracle's fast path loses the sign)


@composite
def backward_softcap_saturated(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                               strided: bool = True, caps: Caps | None = None) -> Case:
    """A softcap c with scores past saturation, |y / c| > 88: the factor 1 - tanh^2 = sech^2 is
    below 1e-76 (0 in fp32; a tanh from exp(2 y / c) is inf / inf = NaN there) and dS with it.
    "mixed": N(0, 1) q, k scaled so the largest visible |y / c| is 120-300 (many past 88, some near
    the bend); "all_saturated": every visible score past 88 c (|q|, |k| entries >= 4, keys of both
    signs). Causal and kv_lens where declared: the factor taken after masking (mask_value^2
    overflows, REAL_BUGS attention 9)."""
    caps, fmt, lim = _setup(dtype, caps, max_m, max_n, max_head_dim, max_bh, shapes)
    kind = draw(st.sampled_from(SOFTCAP_KINDS))
    # All saturated: dq, dk ~ e^-2z (z >= 89) go to the oracle's exact path for their sign, and the
    # positive keys tie up to e^-2z (P ~ 1/n: a dv near a midpoint takes its balls to hundreds of
    # bits over every row): M, N, D <= 16
    b, h, m, n, d = fold(draw(dims(lim)), dict(m=16, n=16, d=16) if kind == "all_saturated" else {})
    cap = draw(st.sampled_from(SOFTCAPS))
    causal, align, opts = options(draw, caps, True)
    lens = kv_lens(draw, caps, b, n)
    rng = np.random.default_rng(draw(_seed()))
    # mixed: the largest visible |y / c|; all_saturated: the smallest (both modes draw alike: shrinking)
    target = draw(st.sampled_from([200.0, 120.0, Z_MAX] if kind == "mixed" else [89.5, 100.0, 120.0]))
    if kind == "mixed":
        q, k = _normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d))
    else:
        q = 0.5 * np.abs(_normal(rng, (b, h, m, d))) + 4.0
        k = (0.5 * np.abs(_normal(rng, (b, h, n, d))) + 4.0) * np.where(rng.random((b, h, n, 1)) < 0.5, -1.0, 1.0)
    seen = np.broadcast_to(visible(b, m, n, lens, causal, align), (b, h, m, n))
    raw = np.abs(np.einsum("bhmd,bhnd->bhmn", q, k))[seen]
    if raw.size and raw.max() > 0:
        f = target * cap / (effective_scale(None, d) * (raw.max() if kind == "mixed" else raw.min()))
        # q and k each grow by sqrt(f): q alone passed fp16's max where a row's keys were all small
        room = fmt.max_finite / 4.0 / max(float(np.abs(q).max()), float(np.abs(k).max()), 1e-30)
        q, k = (x * min(math.sqrt(f), room) for x in (q, k))
    parts = _Parts(q, k, _normal(rng, (b, h, n, _value_dim(draw, caps, d, lim))), causal=causal, kv_lens=lens,
                   options={"softcap": cap, **opts})
    return with_do(draw, _finish(draw, parts, fmt, f"softcap_saturated/{kind}", strided=strided), fmt,
                   strided=strided)


# ---- element offsets past 2^31 (GPU only) -------------------------------------------------------
#
# As flashcheck/suite/test_attention_gpu.py does for the forward: small problems whose views sit in
# storages of more than 2^31 elements, with strides under 2^31 (they reach a kernel as int32) times
# an index that carries one kind of offset past 2^31; NaN between the view's elements.

INT32_LIMIT = 2**31
BIG = 2**30 + 64  # index 2 lands at 2^31 + 128 (a multiple of 16: 16-byte loads stay aligned)
ROW = 2**25  # row 64 (a block's start) lands at 2^31
BIG_KINDS = ("key_rows", "query_rows", "do_rows", "batches", "heads")
BIG_HEAD_DIM = 16


def big_offset_layouts(kind: str, d: int = BIG_HEAD_DIM) -> dict[str, tuple[tuple[int, ...], tuple[int, ...]]]:
    """{tensor: (shape, strides)} of a `big_offsets` case: key rows 64.. of k and v, query rows of
    q and dO, dO's rows alone (q's are contiguous: a kernel reading dO with q's strides or in int32
    is wrong there), batch 2 of all four, or query heads 4-5 and key/value head 2 (GQA 6:3)."""
    def dense(shape):
        return shape, tuple(int(np.prod(shape[i + 1:])) for i in range(len(shape)))

    rows = ((1, 1, 80, d), (0, 0, ROW, 1))
    if kind == "key_rows":
        return {"q": dense((1, 1, 16, d)), "k": rows, "v": rows, "do": dense((1, 1, 16, d))}
    if kind == "query_rows":
        return {"q": rows, "k": dense((1, 1, 16, d)), "v": dense((1, 1, 16, d)), "do": rows}
    if kind == "do_rows":
        return {"q": dense((1, 1, 80, d)), "k": dense((1, 1, 16, d)), "v": dense((1, 1, 16, d)), "do": rows}
    if kind == "batches":
        return {n: ((3, 1, 16, d), (BIG, 16 * d, d, 1)) for n in ("q", "k", "v", "do")}
    if kind == "heads":
        qh, kh = ((1, 6, 16, d), (0, 2**29 + 64, d, 1)), ((1, 3, 16, d), (0, BIG, d, 1))
        return {"q": qh, "k": kh, "v": kh, "do": qh}
    raise ValueError(f"unknown big-offset kind {kind!r}; known: {BIG_KINDS}")


def _big_view(shape, strides, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """N(0, 1) values in a view of `shape`, `strides` of a NaN-filled device storage just large enough."""
    size = 1 + sum((s - 1) * st_ for s, st_ in zip(shape, strides))
    buf = torch.full((size,), float("nan"), dtype=dtype, device=DEVICE)
    view = buf.as_strided(shape, strides)
    view.copy_(torch.randn(shape, device=DEVICE, generator=torch.Generator(DEVICE).manual_seed(seed)))
    return view


@composite
def backward_big_offsets(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                         strided: bool = True, caps: Caps | None = None) -> Case:
    """GPU only, not in the union: `big_offset_layouts` built on the device (4-11 GB a tensor; the
    heads kind where GQA is declared). Never drawn under the interpreter (`backward_classes_for`
    leaves it out; a draw there raises). The size limits do not apply."""
    if INTERPRET:
        raise RuntimeError("big_offsets is GPU only (storages of more than 2^31 elements): never drawn "
                           "under the interpreter")
    caps, fmt = _caps(caps), _fmt(dtype)
    kind = draw(st.sampled_from([k for k in BIG_KINDS if k != "heads" or "gqa" in caps]))
    seed = draw(_seed())
    tensors = {name: _big_view(shape, strides, fmt.torch_dtype, seed + i)
               for i, (name, (shape, strides)) in enumerate(big_offset_layouts(kind).items())}
    return Case(tensors=tensors, kwargs={"causal": False, "scale": None}, label=f"big_offsets/{kind}")

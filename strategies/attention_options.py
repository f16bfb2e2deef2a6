"""The attention classes that need a declared feature (NUMERICS.md s. 4 item 14: GQA, windows,
softcap, attn_mask, split-KV, packed varlen) and the 16-bit accumulator cases of item 13 (large
values over many keys, long rows of near-equal scores). Each takes the kernel's `Caps` and draws
nothing it lacks. Re-exported by `flashcheck.strategies.attention`.
"""
from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import composite

from flashcheck.kernels._runtime import DEVICE
from flashcheck.oracles.formats import FP16

from .attention_build import (
    BLOCKS, Caps, _align, _bh, _causal, _caps, _declared_dims, _finish, _fmt, _head_dim, _key_len, _lengths, _lim,
    _maybe_kv_lens, _normal, _Parts, _seed, _value_dim, place,
)
from .case import Case
from .floats import representable

# ---- features (NUMERICS.md s. 4 item 14) and the 16-bit accumulator cases (item 13) -----------

@composite
def gqa_groups(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None, strided: bool = True,
               caps: Caps | None = None) -> Case:
    """Grouped-query attention: groups of 1, 2, 3 (Hq / Hkv not a power of two) and MQA (one kv
    head for all), with short query lengths not a multiple of any tile, so a tile that packs a
    group's heads (decode) holds a group boundary (HipKittens PR #22, fla #1029)."""
    caps, fmt, lim = _caps(caps), _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b = draw(st.integers(1, 2))
    # Hq / Hkv = 3 first (not a power of two: the mapping bugs show there), then MQA and pairs; the
    # first (simplest) draw, which every run makes, is MQA with a group of 3, so a run of a few
    # examples reaches both whatever else its draws do
    hkv, g = draw(st.sampled_from([(1, 3), (2, 3), (1, 4), (1, 2), (2, 2), (1, 1), (2, 1)]))
    hq = hkv * g
    m = draw(st.sampled_from([1, 3, 5, 7, 13, 17, 33])) if draw(st.booleans()) else draw(_lengths(lim.max_m))
    m = min(m, lim.max_m)
    causal = _causal(draw, caps)
    align = _align(draw, caps) if causal else None
    n = _diagonal_across_edge(draw, lim, m, align) if causal else None
    label = "/diagonal_across_edge" if n is not None else ""
    n, d = (n if n is not None else draw(_key_len(lim, m))), draw(_head_dim(lim))
    dv = _value_dim(draw, caps, d, lim)
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, hq, m, d)), _normal(rng, (b, hkv, n, d)), _normal(rng, (b, hkv, n, dv)),
                   causal=causal, kv_lens=_maybe_kv_lens(draw, b, n) if "kv_lens" in caps else None)
    if causal and len(caps.aligns) > 1:
        parts.options = {"causal_align": align}
    return _finish(draw, parts, fmt, f"gqa_groups/G{g}/Hkv{hkv}" + ("/dv" if dv != d else "") + label, strided=strided)


def _diagonal_across_edge(draw, lim, m: int, align: str) -> int | None:
    """Half the time, a key length N whose causal diagonal crosses a key-block edge (a multiple of
    16) inside the M query rows: the first row sees keys up to below the edge, the last past it.
    A tile that packs a group's heads holds all M positions, so which key blocks every row of it
    sees fully must come from its first position, not its last; with the edge elsewhere every
    block is either below all rows' diagonals or masked anyway, and such a slip is invisible.
    None: no such N fits (or the coin said no)."""
    if m < 2 or (lim.shapes is not None and lim.shapes.square) or not draw(st.booleans()):
        return None
    if align == "bottom_right":  # row i sees keys <= i + off, off = N - M: ends in [off, off + M - 1]
        # row 0 stops below edge e (off <= e - 2), row M - 1 reaches it (off + M - 1 >= e - 1)
        spans = [(max(0, e - m), min(e - 2, lim.max_n - m)) for e in range(16, lim.max_n + 1, 16)]
        spans = [(lo, hi) for lo, hi in spans if lo <= hi]
        if not spans:
            return None
        lo, hi = draw(st.sampled_from(spans))
        # often row 0 one key short of the edge (it sees e - 1 keys): a tile whose fully seen
        # blocks are counted one key too far then shows that key to row 0
        return m + draw(st.one_of(st.just(hi), st.integers(lo, hi)))
    # top-left: row i sees keys <= i, ends in [0, M - 1]: across the edge 16 once M >= 16
    return draw(st.integers(16, lim.max_n)) if m >= 16 and lim.max_n >= 16 else None


WINDOW_EDGES = ("zero", "one", "unlimited", "wider_than_n", "any")
WINDOW_AIMS = ("rows_past_keys", "edges", "wider_than_n", "empties_rows", "block_edge")
# N = 1 (mod 16, so mod every key-block width <= 16 too; N = 1 for any width): the keys end one past a block edge
KEYS_ONE_PAST_A_BLOCK_EDGE = (1, 17, 33)


@composite
def window_edges(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None, strided: bool = True,
                 caps: Caps | None = None) -> Case:
    """Sliding windows at their edges: left or right 0 and 1, unlimited (-1), wider than N, with
    both alignments, M > N and M < N; under bottom-right alignment with M > n (and causal or a
    right edge), the first query rows see no key at all (transformers #39408, FlashAttention #895)."""
    caps, fmt, lim = _caps(caps), _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b, h = draw(_bh(lim))
    m = draw(_lengths(lim.max_m))
    n = draw(_key_len(lim, m))
    d = draw(_head_dim(lim))
    square = lim.shapes is not None and lim.shapes.square
    # Each aim is one defining input of the class, drawn outright (so every limit set, CPU or GPU,
    # reaches all of them, and each shrinks to its simplest form): top-left rows all past the last
    # key (first: the simplest draw of every run reaches it); the edges as drawn; an edge wider than
    # N; bottom-right rows that see no key; the last row's left edge one key past a block edge.
    aim = draw(st.sampled_from(WINDOW_AIMS))
    if aim == "block_edge":  # the last row's diagonal past key 17: a block edge to stand one key past
        m, n = (max(x, min(cap, 18 + draw(st.integers(0, 14)))) for x, cap in ((m, lim.max_m), (n, lim.max_n)))
        # keys a whole block past edge 0 at every width (BLOCKS): that block is then a full one
        n = max(n, min(lim.max_n, max(BLOCKS) + 1 + draw(st.integers(0, 14))))
    bottom_right = "bottom_right" in caps.aligns and not square
    if bottom_right and (aim == "empties_rows" or (len(caps.aligns) > 1 and draw(st.booleans()))):
        m, n = max(m, n), min(m, n)  # M > N: bottom-right alignment empties the first rows
        if m == n and m > 1:
            n = m - 1 - draw(st.integers(0, m - 2))
    # Top-left rows all past the last key, which stands one past a block edge: a tile's partial
    # blocks then end at N itself, and a loop bound one short drops the block holding key N - 1.
    past_ns = [x for x in KEYS_ONE_PAST_A_BLOCK_EDGE if x < lim.max_m and x <= lim.max_n]
    past_keys = aim == "rows_past_keys" and "top_left" in caps.aligns and not square and bool(past_ns)
    if past_keys:
        n = draw(st.sampled_from(past_ns))
        m = draw(st.integers(n + 1, lim.max_m))

    def wider() -> int:
        return n + draw(st.integers(0, 5))

    def edge():
        kind = draw(st.sampled_from(WINDOW_EDGES))
        return {"zero": 0, "one": 1, "unlimited": -1, "wider_than_n": wider(),
                "any": draw(st.integers(0, max(n, 1)))}[kind]

    align = ("bottom_right" if aim == "empties_rows" and bottom_right and m > n
             else "top_left" if past_keys else _align(draw, caps))
    left, right = edge(), edge()
    if past_keys:  # the last row's left edge past the keys too
        left = draw(st.integers(0, m - 1 - n))
    if aim == "wider_than_n":
        wide = wider()
        left, right = (wide, right) if draw(st.booleans()) else (left, wide)
    elif aim == "block_edge":  # the tile's first row sees the block past the edge whole
        right = -1 if draw(st.booleans()) else wider()
    elif aim == "empties_rows" and right < 0:
        right = draw(st.sampled_from([0, 1]))
    # The last query row's left edge one key past a 16-key block edge (rows before it see the
    # block whole): a tile that rounds that edge to blocks one key short shows the key to it.
    # Edge 0 is a block edge at every width (the GPU's 64 and 128 too, which a short M never
    # reaches otherwise): the last row then misses key 0 alone.
    last = m - 1 + (n - m if align == "bottom_right" else 0)  # the last row's diagonal key
    edges = [e for e in range(0, n, 16) if e + 1 <= last]
    if aim == "block_edge" and edges:
        left = last - (draw(st.sampled_from(edges)) + 1)
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=aim != "block_edge" and _causal(draw, caps),
                   kv_lens=_maybe_kv_lens(draw, b, n) if "kv_lens" in caps and aim != "block_edge" else None)
    parts.options = {"window": [left, right], "causal_align": align}
    return _finish(draw, parts, fmt, f"window_edges/{align}", strided=strided)


@composite
def softcap_extremes(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None, strided: bool = True,
                     caps: Caps | None = None) -> Case:
    """softcap far below the logits (tanh saturates: every large score becomes about +-c, a cap
    that is not applied shows at once) and far above them (tanh ~ identity: the cap must not
    cost accuracy) (sgl-kernel-xpu PR #491, unsloth-zoo PR #593)."""
    caps, fmt, lim = _caps(caps), _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b, h = draw(_bh(lim))
    m = draw(_lengths(lim.max_m))
    n = draw(_key_len(lim, m, min_len=2))
    d = draw(_head_dim(lim))
    rng = np.random.default_rng(draw(_seed()))
    where = draw(st.sampled_from(["below", "above", "near"]))
    if where == "below":  # scaled logits ~ 30-100, cap 0.05 - 5
        sig, cap = math.sqrt(draw(st.sampled_from([30.0, 100.0]))), draw(st.sampled_from([0.05, 0.5, 5.0]))
    elif where == "above":
        sig, cap = 1.0, draw(st.sampled_from([500.0, 5000.0, 30000.0]))
    else:  # the cap where tanh bends
        sig, cap = 2.0, draw(st.sampled_from([1.0, 3.0, 10.0]))
    parts = _Parts(_normal(rng, (b, h, m, d), sig), _normal(rng, (b, h, n, d), sig), _normal(rng, (b, h, n, d)),
                   causal=_causal(draw, caps), kv_lens=_maybe_kv_lens(draw, b, n) if "kv_lens" in caps else None)
    parts.options = {"softcap": cap}
    return _finish(draw, parts, fmt, f"softcap_extremes/{where}", strided=strided)


MASK_SHAPES = ("full", "heads_broadcast", "keys_only", "2d", "1d")


@composite
def attn_masks(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None, strided: bool = True,
               caps: Caps | None = None) -> Case:
    """SDPA-style attn_mask: boolean (True takes part; one row entirely False gives zeros; an
    inverted mask shows at once) or an additive float bias (ALiBi slopes, -inf entries), in the
    shapes that broadcast to (B, Hq, M, N)."""
    caps, fmt, lim = _caps(caps), _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b, h = draw(_bh(lim))
    m = draw(_lengths(lim.max_m))
    n = draw(_key_len(lim, m))
    d = draw(_head_dim(lim))
    shape_kind = draw(st.sampled_from(MASK_SHAPES))
    shape = {"full": (b, h, m, n), "heads_broadcast": (b, 1, m, n), "keys_only": (b, 1, 1, n), "2d": (m, n),
             "1d": (n,)}[shape_kind]
    rng = np.random.default_rng(draw(_seed()))
    kind = draw(st.sampled_from(["bool", "bias"]))
    if kind == "bool":
        mask = rng.random(shape) < draw(st.sampled_from([0.2, 0.6, 0.95]))
        if len(shape) >= 2 and draw(st.booleans()):
            mask[..., draw(st.integers(0, shape[-2] - 1)), :] = False  # a row that sees nothing
        mdt = None
    else:
        i, j = np.arange(m)[:, None], np.arange(n)[None, :]
        slope = draw(st.sampled_from([0.0625, 0.5, 4.0]))
        # ALiBi, or a ramp rising along the keys: every row's running max then rises at every key
        # block, so the rescale of the sums kept so far (in natural units under a float bias) runs
        # on every row, not only where ALiBi's diagonal crosses a block (a mutant doubling its log2 e
        # survived the ALiBi draws)
        ramp = draw(st.booleans())
        full = np.broadcast_to(slope * j if ramp else -slope * np.abs(i - j), (m, n)).astype(np.float64)
        mask = np.broadcast_to(full[tuple(slice(0, s) for s in shape[-2:])] if len(shape) >= 2
                               else full[0, :shape[-1]], shape).copy()
        # (the other rows keep their plain ALiBi biases)
        hide = draw(st.sampled_from(["neg_inf", "finite_row", "neg_inf+finite_row"]))
        if "neg_inf" in hide:
            mask[rng.random(shape) < 0.3] = -np.inf
        dtype_min = None
        if "finite_row" in hide:
            # A row masked whole by a finite stand-in for -inf, as real code does (BERT's -10000,
            # -1e9, Hugging Face's torch.finfo(dtype).min of the mask's dtype: -65504 in fp16,
            # about -3.4e38 in bf16 and fp32, where a kernel scaling the bias by log2 e in fp32
            # overflows to -inf and empties the row): its softmax is softmax(scores), and a
            # running max started at a finite "-inf" loses it.
            sentinel = draw(st.sampled_from([-1.0e4, -1.0e9, float(torch.finfo(torch.float16).min), "dtype_min"]))
            rows = (..., draw(st.integers(0, shape[-2] - 1)), slice(None)) if len(shape) >= 2 else (slice(None),)
            if sentinel == "dtype_min":
                dtype_min = rows
            else:
                mask[rows] = sentinel
        mdt = draw(st.sampled_from([None, torch.float32]))
        if dtype_min is not None:
            mask[dtype_min] = float(torch.finfo(mdt or fmt.torch_dtype).min)
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=_causal(draw, caps), kv_lens=_maybe_kv_lens(draw, b, n) if "kv_lens" in caps else None,
                   mask=mask, mask_dtype=mdt)
    return _finish(draw, parts, fmt, f"attn_masks/{kind}/{shape_kind}", strided=strided)


@composite
def split_kv(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None, strided: bool = True,
             caps: Caps | None = None) -> Case:
    """Split-KV (flash-decoding): 2 to 7 splits, more splits than key blocks, and splits whose
    keys are all masked (kv_lens or a causal diagonal ending before them): their -inf states must
    merge into nothing (FlashInfer #4051). Where the kernel takes an attn_mask, a query row masked
    whole by a finite bias far below -1e4 (-3e4, the mask dtype's finfo.min): every split's
    running max is that bias, and a merge whose max starts at a finite stand-in for -inf drops
    them all and empties the row."""
    caps, fmt, lim = _caps(caps), _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b = max(1, min(2, lim.max_bh))
    h = 1
    m = draw(st.sampled_from([1, 2, 5])) if draw(st.booleans()) else draw(_lengths(lim.max_m))
    n, d = draw(_key_len(lim, m, min_len=2)), draw(_head_dim(lim))
    splits = draw(st.sampled_from([2, 3, 7, 16]))
    lens = None
    if "kv_lens" in caps and draw(st.booleans()):
        lens = [draw(st.integers(0, max(1, n // 3))), draw(st.integers(0, n))][:b]
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=_causal(draw, caps), kv_lens=lens)
    parts.options = {"num_splits": splits}
    label = f"split_kv/{splits}"
    if "attn_mask" in caps and draw(st.booleans()):
        parts.mask = np.zeros((m, n))
        floor = draw(st.sampled_from([-3.0e4, float(torch.finfo(fmt.torch_dtype).min)]))
        parts.mask[draw(st.integers(0, m - 1)), :] = floor
        label += "/finite_min_row"
    return _finish(draw, parts, fmt, label, strided=strided)


@composite
def large_values_many_keys(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                           strided: bool = True, caps: Caps | None = None) -> Case:
    """Values near fp16's maximum (3e4 - 6.5e4) over many keys of similar weight: a 16-bit
    accumulator of P @ V overflows (ik_llama.cpp PR #1196). For bf16 and fp32 the values stay
    at the fp16 scale: near their own maximum the unnormalised fp32 accumulator of every
    flash-style kernel overflows (N * 3e38), which is the algorithm, not a bug."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    square = lim.shapes is not None and lim.shapes.square
    n = draw(st.sampled_from([x for x in (64, 200, 256) if not square or x <= lim.max_m] or [64]))
    m = n if square else draw(st.integers(1, min(4, lim.max_m)))
    d = draw(st.sampled_from(_declared_dims(lim, hi=16) or _declared_dims(lim)[:1] or [4, 8, 16]))
    rng = np.random.default_rng(draw(_seed()))
    top = min(fmt.max_finite, FP16.max_finite)
    v = top * (0.5 + 0.5 * rng.random((1, 1, n, d))) * np.where(rng.random((1, 1, n, d)) < 0.1, -1, 1)
    parts = _Parts(_normal(rng, (1, 1, m, d), 0.1), _normal(rng, (1, 1, n, d), 0.1), np.minimum(v, top))
    return _finish(draw, parts, fmt, "large_values_many_keys", strided=strided)


@composite
def long_near_equal_scores(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                           strided: bool = True, caps: Caps | None = None) -> Case:
    """One or two query rows against 1024 - 4096 keys of near-equal scores: a 16-bit row sum
    stalls at 2048 (fp16: 2048 + 1 = 2048), the output drifts. N >= 1024 even under the
    interpreter: one row, a narrow head, so it stays cheap."""
    fmt = _fmt(dtype)
    m = draw(st.integers(1, 2))
    n = draw(st.sampled_from([1024, 2049, 4096]))
    d = draw(st.sampled_from([2, 4, 8]))
    rng = np.random.default_rng(draw(_seed()))
    q = _normal(rng, (1, 1, m, d), draw(st.sampled_from([0.0, 0.01, 0.1])))
    parts = _Parts(q, _normal(rng, (1, 1, n, d)), _normal(rng, (1, 1, n, d)) + 1.0)
    return _finish(draw, parts, fmt, f"long_near_equal_scores/N{n}", strided=strided)


VARLEN_LENGTHS = (0, 1, 2, 5, 17, 31, 33, 40)


@composite
def varlen_batches(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None, strided: bool = True,
                   caps: Caps | None = None) -> Case:
    """Packed variable-length batches: empty and length-1 sequences beside long ones, totals off
    any block multiple, GQA, causal with either alignment, windows; each sequence must come out
    as if alone (FlashInfer #4347, vLLM PR #27547). Tensors q (total_q, Hq, D), k, v
    (total_k, Hkv, D|Dv), cu_seqlens_q/k int32; kwargs max_seqlen_q/k and the options."""
    caps, fmt, lim = _caps(caps), _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    nseq = draw(st.integers(1, 4))
    lq = [min(draw(st.sampled_from(VARLEN_LENGTHS)), lim.max_m) for _ in range(nseq)]
    lk = [min(x if draw(st.booleans()) else draw(st.sampled_from(VARLEN_LENGTHS)), lim.max_n) for x in lq]
    hkv, g = draw(st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 3)])) if "gqa" in caps else (draw(st.integers(1, 2)), 1)
    hq = hkv * g
    d = draw(_head_dim(lim))
    dv = _value_dim(draw, caps, d, lim)
    rng = np.random.default_rng(draw(_seed()))
    tq, tk = sum(lq), sum(lk)
    q, k, v = _normal(rng, (1, hq, tq, d)), _normal(rng, (1, hkv, tk, d)), _normal(rng, (1, hkv, tk, dv))
    q, k, v = (representable(a, fmt) for a in (q, k, v))
    layout = draw(st.sampled_from(["bshd", "padded"])) if strided else "bshd"
    pad, off = draw(st.integers(1, 9)), draw(st.integers(0, 5))
    tensors = {name: place(a, fmt, layout, pad=pad, offset=off)[0].transpose(0, 1)
               for name, a in (("q", q), ("k", k), ("v", v))}
    cum = lambda ls: torch.tensor(np.concatenate([[0], np.cumsum(ls)]), dtype=torch.int32, device=DEVICE)  # noqa: E731
    tensors["cu_seqlens_q"], tensors["cu_seqlens_k"] = cum(lq), cum(lk)
    kwargs = {"max_seqlen_q": max(lq), "max_seqlen_k": max(lk), "causal": _causal(draw, caps), "scale": None}
    if len(caps.aligns) > 1:
        kwargs["causal_align"] = _align(draw, caps)
    if "window" in caps and draw(st.booleans()):
        kwargs["window"] = [draw(st.sampled_from([-1, 0, 3])), draw(st.sampled_from([-1, 0, 2]))]
    return Case(tensors=tensors, kwargs=kwargs, label=f"varlen_batches/{nseq}seq/{layout}")

"""The attention classes every kernel takes (NUMERICS.md s. 4 item 13): standard inputs, wide and
overflowing scores, odd head dims, ragged and masked lengths, NaN in hidden and visible keys,
strided layouts, ties. Re-exported by `flashcheck.strategies.attention`, whose `CLASS_RECORDS` is
the order the union draws them in.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import composite

from flashcheck.kernels._runtime import INTERPRET

from .attention_build import (
    BLOCKS, LAYOUTS, ODD_HEAD_DIMS, _bh, _declared_dims, _finish, _fmt, _head_dim, _key_len, _lengths, _lim,
    _maybe_kv_lens, _normal, _Parts, _seed,
)
from .case import Case

# ---- the classes -------------------------------------------------------------------------------

@composite
def benign_attention(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                     strided: bool = True) -> Case:
    """Standard-normal q, k, v, any shape, with or without causal masking and kv_lens."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b, h = draw(_bh(lim))
    m = draw(_lengths(lim.max_m))
    n = draw(_key_len(lim, m))
    d = draw(_head_dim(lim))
    rng = np.random.default_rng(draw(_seed()))
    sig = draw(st.sampled_from([1.0, 0.25, 3.0]))
    parts = _Parts(_normal(rng, (b, h, m, d), sig), _normal(rng, (b, h, n, d), sig), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()), kv_lens=_maybe_kv_lens(draw, b, n))
    return _finish(draw, parts, fmt, "benign", strided=strided)


@composite
def wide_logit_spread(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                      strided: bool = True) -> Case:
    """Scaled logits spreading far beyond 88 (exp underflows for most keys), by large q/k or by
    a large explicit scale; sometimes all logits shifted far from 0 ([1000, 1001]-style)."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b, h = draw(_bh(lim))
    m = draw(_lengths(lim.max_m))
    n = draw(_key_len(lim, m, min_len=2))
    d = draw(_head_dim(lim))
    rng = np.random.default_rng(draw(_seed()))
    how = draw(st.sampled_from(["big_qk", "big_scale", "offset"]))
    scale = None
    if how == "big_qk":
        sig = math.sqrt(draw(st.sampled_from([60.0, 200.0, 1000.0])))  # scaled-score std ~ sig^2
        q, k = _normal(rng, (b, h, m, d), sig), _normal(rng, (b, h, n, d), sig)
    elif how == "big_scale":
        q, k = _normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d))
        scale = draw(st.sampled_from([16.0, 64.0, 300.0])) / math.sqrt(d)
    else:  # every score about +c with spread ~ 100: a missing max subtraction overflows
        q = np.abs(_normal(rng, (b, h, m, d))) + 4.0
        k = np.abs(_normal(rng, (b, h, n, d))) * draw(st.sampled_from([3.0, 10.0])) + 4.0
    parts = _Parts(q, k, _normal(rng, (b, h, n, d)), causal=draw(st.booleans()), scale=scale,
                   kv_lens=_maybe_kv_lens(draw, b, n))
    return _finish(draw, parts, fmt, f"wide_logit_spread/{how}", strided=strided)


@composite
def fp16_overflowing_scores(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                            strided: bool = True) -> Case:
    """Raw scores q.k beyond fp16's 65504 (a dot kept in fp16 overflows to inf), from entries in
    the hundreds; sometimes with a tiny scale so the scaled logits stay moderate."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b, h = draw(_bh(lim))
    m = draw(_lengths(lim.max_m))
    n = draw(_key_len(lim, m))
    declared = _declared_dims(lim, lo=4)
    d = draw(st.sampled_from(declared) if declared else st.integers(min(4, lim.max_head_dim), lim.max_head_dim))
    rng = np.random.default_rng(draw(_seed()))
    mag = math.sqrt(2.0 * 65504.0 / d) * draw(st.sampled_from([1.0, 2.0, 8.0]))
    mag = min(mag, 60000.0)
    # aligned signs make |q.k| ~ d mag^2 > 65504 for most pairs
    sign_q = np.where(rng.random((b, h, 1, d)) < 0.5, -1.0, 1.0)
    q = sign_q * mag * (0.75 + 0.25 * rng.random((b, h, m, d)))
    k = sign_q * mag * (0.75 + 0.25 * rng.random((b, h, n, d))) * np.where(rng.random((b, h, n, 1)) < 0.3, -1, 1)
    tiny_scale = draw(st.booleans())
    scale = (1.0 / (d * mag * mag)) * draw(st.sampled_from([4.0, 40.0])) if tiny_scale else None
    parts = _Parts(q, k, _normal(rng, (b, h, n, d)), causal=draw(st.booleans()), scale=scale,
                   kv_lens=_maybe_kv_lens(draw, b, n))
    return _finish(draw, parts, fmt, "fp16_overflowing_scores" + ("/tiny_scale" if tiny_scale else ""),
                   strided=strided)


@composite
def odd_head_dims(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                  strided: bool = True) -> Case:
    """Head dims that are not powers of two (40, 59, 72, 80, 96, 111, 160, 192, ...): a head dim
    cut to the block width (Triton #621) or padding lanes read as garbage show here."""
    lim = _lim(max_m, max_n, max_head_dim or (80 if INTERPRET else 256), max_bh, shapes)
    fmt = _fmt(dtype)
    dims = [d for d in ODD_HEAD_DIMS if d <= lim.max_head_dim]
    wide = [d for d in dims if d > 64]  # past a 64-wide block: half the draws (Triton #621)
    narrow = [d for d in dims if d <= 64] or dims  # the first (simplest) draw is narrow
    d = draw(st.sampled_from(wide)) if wide and draw(st.booleans()) else draw(st.sampled_from(narrow))
    b, h = 1, 1
    m = draw(_lengths(min(lim.max_m, 33 if INTERPRET else lim.max_m)))
    n = draw(_lengths(min(lim.max_n, 40 if INTERPRET else lim.max_n), dim="n"))
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()), kv_lens=_maybe_kv_lens(draw, b, n))
    return _finish(draw, parts, fmt, f"odd_head_dims/D{d}", strided=strided)


@composite
def ragged_lengths(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                   strided: bool = True) -> Case:
    """M != N, lengths at, just below and just above block widths, and 1."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b, h = draw(_bh(lim))
    m = draw(_lengths(lim.max_m))
    n = draw(_lengths(lim.max_n, dim="n").filter(lambda x: x != m))
    d = draw(_head_dim(lim))
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()))
    return _finish(draw, parts, fmt, "ragged_lengths", strided=strided)


@composite
def kv_lens_edges(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                  strided: bool = True) -> Case:
    """kv_lens of 0, 1, N, N - 1 and non-multiples of the block width, per batch."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b = max(1, min(2, lim.max_bh))
    h = 1
    m = draw(_lengths(lim.max_m))
    n = draw(_key_len(lim, m, min_len=2))
    d = draw(_head_dim(lim))
    off_block = sorted({x for blk in BLOCKS for x in (blk - 1, blk + 1, blk // 2 + 1) if 1 < x < n} or {n - 1})
    edges = {"zero": st.just(0), "one": st.just(1), "full": st.just(n), "n_minus_1": st.just(n - 1),
             "off_block": st.sampled_from(off_block), "any": st.integers(0, n)}
    # Pairs of edges, so that a handful of examples already meets 0, 1, N and a ragged length.
    pair = draw(st.sampled_from([("zero", "full"), ("one", "n_minus_1"), ("off_block", "full"),
                                 ("one", "zero"), ("any", "any")]))
    lens = [draw(edges[pair[i % 2]]) for i in range(b)]
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()), kv_lens=lens)
    return _finish(draw, parts, fmt, "kv_lens_edges", strided=strided)


@composite
def causal_rectangular(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                       strided: bool = True) -> Case:
    """Causal masking with M > N (rows past N see every key) and M < N (keys past M unseen)."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b, h = draw(_bh(lim))
    wider = draw(st.booleans())
    big, small = max(lim.max_m, lim.max_n), 1
    m = draw(_lengths(lim.max_m, min_len=2))
    if wider:  # M < N
        n = draw(st.integers(min(m + 1, lim.max_n), lim.max_n)) if m < lim.max_n else lim.max_n
    else:  # M > N
        n = draw(st.integers(small, max(small, m - 1)))
    del big
    d = draw(_head_dim(lim))
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=True, kv_lens=_maybe_kv_lens(draw, b, n))
    return _finish(draw, parts, fmt, "causal_rectangular/" + ("M<N" if m < n else "M>N" if m > n else "M=N"),
                   strided=strided)


@composite
def fully_masked_rows(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                      strided: bool = True) -> Case:
    """Query rows that see no key (kv_lens 0 for a batch, with or without causal): exact zeros."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b = max(1, min(2, lim.max_bh))
    h = 1
    m = draw(_lengths(lim.max_m))
    n = draw(_key_len(lim, m))
    d = draw(_head_dim(lim))
    lens = [draw(st.integers(0, n)) for _ in range(b)]
    lens[draw(st.integers(0, b - 1))] = 0
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()), kv_lens=lens)
    return _finish(draw, parts, fmt, "fully_masked_rows", strided=strided,
                   hidden=draw(st.sampled_from(["zero", "nan"])))


@composite
def nan_in_hidden_kv(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                     strided: bool = True) -> Case:
    """NaN, inf or huge values stored in K/V rows past kv_lens (and NaN guards past N around every
    view): none of it may reach the output (FlashAttention #1395, vLLM #30887, PyTorch #101967)."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b = max(1, min(2, lim.max_bh))
    h = 1
    m = draw(_lengths(lim.max_m))
    n = draw(_key_len(lim, m, min_len=2))
    d = draw(_head_dim(lim))
    lens = [draw(st.integers(0, n - 1)) for _ in range(b)]
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()), kv_lens=lens)
    hidden = draw(st.sampled_from(["nan", "inf", "huge"]))
    return _finish(draw, parts, fmt, f"nan_in_hidden_kv/{hidden}", strided=strided, hidden=hidden)


@composite
def nan_in_visible_kv(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                      strided: bool = True) -> Case:
    """A NaN in a visible key (its rows become NaN) or value (its column of those rows becomes
    NaN); the other rows and columns stay exact. Not causal: under causal masking a NaN value of an
    existing key may also reach rows of its block that do not see it (kernels/attention.py)."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b, h = draw(_bh(lim))
    m = draw(_lengths(lim.max_m))
    n = draw(_key_len(lim, m))
    d = draw(_head_dim(lim))
    rng = np.random.default_rng(draw(_seed()))
    q, k, v = _normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d))
    where = draw(st.sampled_from(["k", "v", "q"]))
    bi, hi = draw(st.integers(0, b - 1)), draw(st.integers(0, h - 1))
    target = {"k": k, "v": v, "q": q}[where]
    target[bi, hi, draw(st.integers(0, target.shape[2] - 1)), draw(st.integers(0, d - 1))] = np.nan
    return _finish(draw, _Parts(q, k, v), fmt, f"nan_in_visible_kv/{where}", strided=strided)


@composite
def strided_layouts(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                    strided: bool = True) -> Case:
    """BSHD views (a (B, S, H, D) buffer transposed), padded rows/heads, head-dim stride 2 and
    storage offsets (the one class with offsets that are not 16-byte aligned, as are the varlen
    batches'), all inside NaN-guarded buffers: ignored strides show at once."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b, h = draw(_bh(lim))
    if lim.max_bh >= 2 and h < 2:  # BSHD with H = 1 would be contiguous
        b, h = max(1, min(b, lim.max_bh // 2)), 2
    m = draw(_lengths(lim.max_m, min_len=2))
    n = draw(_key_len(lim, m, min_len=2))
    d = max(2, draw(_head_dim(lim)))
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()), kv_lens=_maybe_kv_lens(draw, b, n))
    layout = draw(st.sampled_from(LAYOUTS[1:])) if strided else "bhsd"
    return _finish(draw, parts, fmt, "strided_layouts", layout=layout, unaligned=True)


@composite
def tied_scores(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None,
                strided: bool = True) -> Case:
    """Equal scores (q = 0 rows, or every key equal): the output is an exact mean of V rows, often
    a rounding midpoint; the oracle must decide it exactly and the kernel get within its bound."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b, h = draw(_bh(lim))
    m = draw(_lengths(lim.max_m))
    n = draw(_key_len(lim, m))
    d = draw(_head_dim(lim))
    rng = np.random.default_rng(draw(_seed()))
    q, k = _normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d))
    if draw(st.booleans()):
        q[:] = 0.0
    else:
        k[:] = k[:, :, :1, :]
    bits = draw(st.integers(0, fmt.precision - 1))
    v = np.round(_normal(rng, (b, h, n, d)) * 2.0**bits) / 2.0**bits + 1.0  # few bits: exact means
    parts = _Parts(q, k, v, causal=draw(st.booleans()), kv_lens=_maybe_kv_lens(draw, b, n))
    return _finish(draw, parts, fmt, "tied_scores", strided=strided)

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

import math
from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy, composite

from flashcheck.kernels._runtime import DEVICE, INTERPRET
from flashcheck.kernels.registry import ATTENTION_FEATURES, CAUSAL_ALIGNS
from flashcheck.oracles.formats import FP16, Format, format_of

from .case import Case
from .floats import representable
from .records import StrategyClass, by_name

LAYOUTS = ("bhsd", "bshd", "padded", "dstep")
ODD_HEAD_DIMS = (1, 2, 3, 5, 7, 13, 40, 59, 72, 80, 96, 111, 160, 192, 255, 256)
BLOCKS = (16, 32, 64, 128)  # key-block widths real kernels use


@dataclass(frozen=True)
class Limits:
    max_bh: int
    max_m: int
    max_n: int
    max_head_dim: int
    shapes: Shapes | None = None


@dataclass(frozen=True)
class Shapes:
    """The shapes a kernel declares it takes (`head_dims`, `square_only`): draws aim at them, so a
    kernel that narrows its inputs is still checked on the ones it allows, not skipped."""

    head_dims: tuple[int, ...] | None = None
    square: bool = False

    @classmethod
    def of(cls, spec) -> Shapes:
        dims = None if spec.head_dims is None else tuple(
            d for d in range(1, spec.max_head_dim + 1) if spec.supports_head_dim(d))
        return cls(dims, bool(spec.square_only))


def default_limits() -> Limits:
    if INTERPRET:
        return Limits(max_bh=2, max_m=64, max_n=64, max_head_dim=64)
    return Limits(max_bh=2, max_m=64, max_n=512, max_head_dim=256)  # the CPU oracle bounds the size


def _lim(max_m, max_n, max_head_dim, max_bh, shapes: Shapes | None = None) -> Limits:
    d = default_limits()
    return Limits(max_bh or d.max_bh, max_m or d.max_m, max_n or d.max_n, max_head_dim or d.max_head_dim, shapes)


def _fmt(dtype) -> Format:
    return format_of(dtype)


# ---- layouts -----------------------------------------------------------------------------------

def _layout_geometry(layout: str, shape: tuple[int, int, int, int], rng_pad: int, offset: int):
    """(strides, storage offset, storage size) of a (B, H, S, D) view in the named layout."""
    B, H, S, D = shape
    if layout == "bhsd":
        strides = (H * S * D, S * D, D, 1)
    elif layout == "bshd":  # a (B, S, H, D) buffer seen through .transpose(1, 2)
        strides = (S * H * D, D, H * D, 1)
    elif layout == "padded":  # rows and heads padded, as a slice of a bigger tensor
        row = D + rng_pad
        head = S * row + 3
        strides = (H * head + 5, head, row, 1)
    elif layout == "dstep":  # head dim with stride 2 (every other element)
        strides = (H * S * 2 * D, S * 2 * D, 2 * D, 2)
    else:
        raise ValueError(f"unknown layout {layout!r}")
    span = sum((n - 1) * s for n, s in zip(shape, strides)) + 1 if all(shape) else 0
    return strides, offset, offset + span + 7  # 7 guard elements after the view


def place(x: np.ndarray, fmt: Format, layout: str, *, pad: int = 3, offset: int = 1,
          device: torch.device = DEVICE) -> torch.Tensor:
    """A (B, H, S, D) view of the exact values `x` in `layout`, inside a NaN-filled buffer."""
    strides, off, size = _layout_geometry(layout, x.shape, pad, offset)
    buf = torch.full((max(size, 1),), float("nan"), dtype=torch.float64).to(fmt.torch_dtype)
    view = buf.as_strided(x.shape, strides, off)
    view.copy_(torch.from_numpy(np.ascontiguousarray(x)).to(fmt.torch_dtype))
    return buf.to(device).as_strided(x.shape, strides, off)


# ---- building blocks ---------------------------------------------------------------------------

def _seed() -> SearchStrategy[int]:
    return st.integers(0, 2**32 - 1)


def _lengths(max_len: int, *, min_len: int = 1) -> SearchStrategy[int]:
    """Sequence lengths: 1, just below/at/above block widths, anything."""
    near = sorted({v for b in BLOCKS for v in (b - 1, b, b + 1, b // 2 + 1) if min_len <= v <= max_len})
    opts = [st.integers(min_len, max_len)]
    if near:
        opts.append(st.sampled_from(near))
    return st.one_of(opts)


@composite
def _bh(draw, lim: Limits) -> tuple[int, int]:
    b = draw(st.integers(1, max(1, min(2, lim.max_bh))))
    h = draw(st.integers(1, max(1, lim.max_bh // b)))
    return b, h


def _declared_dims(lim: Limits, lo: int = 1, hi: int | None = None) -> list[int]:
    """The declared head dims within [lo, hi] (hi: the limit); [] when none are declared there."""
    dims = (lim.shapes.head_dims or ()) if lim.shapes is not None else ()
    return [d for d in dims if lo <= d <= min(hi or lim.max_head_dim, lim.max_head_dim)]


@composite
def _head_dim(draw, lim: Limits) -> int:
    declared = _declared_dims(lim)
    if declared:
        return draw(st.sampled_from(declared))
    small = [d for d in (1, 3, 8, 16, 24, 32, 40, 59, 64) if d <= lim.max_head_dim]
    return draw(st.one_of(st.sampled_from(small), st.integers(1, lim.max_head_dim)))


@composite
def _key_len(draw, lim: Limits, m: int, *, min_len: int = 1) -> int:
    """N for a drawn M: M itself for a kernel that declares square_only, else any length."""
    if lim.shapes is not None and lim.shapes.square and min_len <= m <= lim.max_n:
        return m
    return draw(_lengths(lim.max_n, min_len=min_len))


@dataclass
class _Parts:
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    causal: bool = False
    scale: float | None = None
    kv_lens: list[int] | None = None
    options: dict | None = None  # further kernel keywords (window, softcap, causal_align, num_splits)
    mask: np.ndarray | None = None  # attn_mask: bool or float values (float64), any broadcastable shape
    mask_dtype: torch.dtype | None = None  # the bias's dtype (None: q's)


@dataclass(frozen=True)
class Caps:
    """What the kernel under test declares (kernels.registry.KernelSpec's attention fields): the
    feature strategies draw nothing else."""

    features: frozenset = frozenset(ATTENTION_FEATURES)
    aligns: tuple = CAUSAL_ALIGNS

    @classmethod
    def of(cls, spec) -> "Caps":
        return cls(spec.features(), tuple(spec.causal_align))

    def __contains__(self, feature: str) -> bool:
        return feature in self.features


def _finish(draw, parts: _Parts, fmt: Format, label: str, *, strided: bool = True,
            layout: str | None = None, hidden: str = "zero") -> Case:
    """Round to the format, store hidden K/V rows (past kv_lens) as `hidden` ("zero", "nan",
    "inf", "huge"), lay out, package."""
    q, k, v = (representable(a, fmt) for a in (parts.q, parts.k, parts.v))
    if parts.kv_lens is not None and hidden != "zero":
        fill = {"nan": np.nan, "inf": np.inf, "huge": fmt.max_finite}[hidden]
        for b, n_valid in enumerate(parts.kv_lens):
            k[b, :, n_valid:, :] = fill
            v[b, :, n_valid:, :] = -fill if hidden == "huge" else fill
    if layout is None:
        layout = draw(st.sampled_from(LAYOUTS)) if strided else "bhsd"
    pad, off = draw(st.integers(1, 9)), draw(st.integers(0, 5))
    tensors = {name: place(a, fmt, layout, pad=pad, offset=off) for name, a in (("q", q), ("k", k), ("v", v))}
    if parts.kv_lens is not None:
        tensors["kv_lens"] = torch.tensor(parts.kv_lens, dtype=torch.int32, device=DEVICE)
    if parts.mask is not None:
        if parts.mask.dtype == bool:
            tensors["attn_mask"] = torch.from_numpy(parts.mask.copy()).to(DEVICE)
        else:
            mfmt = format_of(parts.mask_dtype or fmt.torch_dtype)
            tensors["attn_mask"] = torch.from_numpy(representable(parts.mask, mfmt)).to(mfmt.torch_dtype).to(DEVICE)
    kwargs = {"causal": bool(parts.causal), "scale": parts.scale, **(parts.options or {})}
    return Case(tensors=tensors, kwargs=kwargs, label=f"{label}/{layout}")


def _normal(rng, shape, sigma=1.0):
    return rng.standard_normal(shape) * sigma


def _maybe_kv_lens(draw, b: int, n: int) -> list[int] | None:
    if not draw(st.booleans()):
        return None
    return [draw(st.integers(0, n)) for _ in range(b)]


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
    n = draw(_lengths(min(lim.max_n, 40 if INTERPRET else lim.max_n)))
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
    n = draw(_lengths(lim.max_n).filter(lambda x: x != m))
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
    storage offsets, all inside NaN-guarded buffers: ignored strides show at once."""
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
    return _finish(draw, parts, fmt, "strided_layouts", layout=layout)


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


# ---- features (NUMERICS.md s. 4 item 14) and the 16-bit accumulator cases (item 13) -----------

def _caps(caps: Caps | None) -> Caps:
    return caps if caps is not None else Caps()


def _align(draw, caps: Caps) -> str:
    return draw(st.sampled_from(caps.aligns))


def _value_dim(draw, caps: Caps, d: int, lim: Limits) -> int:
    """Dv: usually D, another head dim when the kernel takes Dv != D."""
    if "dv" in caps and draw(st.booleans()):
        return draw(st.sampled_from([x for x in (1, 8, 20, 33, 64) if x <= lim.max_head_dim] or [d]))
    return d


def _causal(draw, caps: Caps) -> bool:
    return "causal" in caps and draw(st.booleans())


@composite
def gqa_groups(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None, strided: bool = True,
               caps: Caps | None = None) -> Case:
    """Grouped-query attention: groups of 1, 2, 3 (Hq / Hkv not a power of two) and MQA (one kv
    head for all), with short query lengths not a multiple of any tile, so a tile that packs a
    group's heads (decode) holds a group boundary (HipKittens PR #22, fla #1029)."""
    caps, fmt, lim = _caps(caps), _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh, shapes)
    b = draw(st.integers(1, 2))
    # Hq / Hkv = 3 first (not a power of two: the mapping bugs show there), then MQA and pairs
    hkv, g = draw(st.sampled_from([(2, 3), (1, 4), (1, 2), (2, 2), (1, 3), (1, 1), (2, 1)]))
    hq = hkv * g
    m = draw(st.sampled_from([1, 3, 5, 7, 13, 17, 33])) if draw(st.booleans()) else draw(_lengths(lim.max_m))
    m = min(m, lim.max_m)
    n, d = draw(_key_len(lim, m)), draw(_head_dim(lim))
    dv = _value_dim(draw, caps, d, lim)
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, hq, m, d)), _normal(rng, (b, hkv, n, d)), _normal(rng, (b, hkv, n, dv)),
                   causal=_causal(draw, caps), kv_lens=_maybe_kv_lens(draw, b, n) if "kv_lens" in caps else None)
    if parts.causal and len(caps.aligns) > 1:
        parts.options = {"causal_align": _align(draw, caps)}
    return _finish(draw, parts, fmt, f"gqa_groups/G{g}/Hkv{hkv}" + ("/dv" if dv != d else ""), strided=strided)


WINDOW_EDGES = ("zero", "one", "unlimited", "wider_than_n", "any")


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
    if len(caps.aligns) > 1 and not square and draw(st.booleans()):  # M > N: rows bottom-right alignment empties
        m, n = max(m, n), min(m, n)
        if m == n and m > 1:
            n = m - 1 - draw(st.integers(0, m - 2))

    def edge():
        kind = draw(st.sampled_from(WINDOW_EDGES))
        return {"zero": 0, "one": 1, "unlimited": -1, "wider_than_n": n + draw(st.integers(0, 5)),
                "any": draw(st.integers(0, max(n, 1)))}[kind]

    left, right = edge(), edge()
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=_causal(draw, caps), kv_lens=_maybe_kv_lens(draw, b, n) if "kv_lens" in caps else None)
    align = _align(draw, caps)
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
        full = np.broadcast_to(-slope * np.abs(i - j), (m, n)).astype(np.float64)
        mask = np.broadcast_to(full[tuple(slice(0, s) for s in shape[-2:])] if len(shape) >= 2
                               else full[0, :shape[-1]], shape).copy()
        if draw(st.booleans()):
            mask[rng.random(shape) < 0.3] = -np.inf
        mdt = draw(st.sampled_from([None, torch.float32]))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=_causal(draw, caps), kv_lens=_maybe_kv_lens(draw, b, n) if "kv_lens" in caps else None,
                   mask=mask, mask_dtype=mdt)
    return _finish(draw, parts, fmt, f"attn_masks/{kind}/{shape_kind}", strided=strided)


@composite
def split_kv(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None, shapes=None, strided: bool = True,
             caps: Caps | None = None) -> Case:
    """Split-KV (flash-decoding): 2 to 7 splits, more splits than key blocks, and splits whose
    keys are all masked (kv_lens or a causal diagonal ending before them): their -inf states must
    merge into nothing (FlashInfer #4051)."""
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
    return _finish(draw, parts, fmt, f"split_kv/{splits}", strided=strided)


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
        return CLASSES[cls](dtype=dtype, caps=caps, **limits)
    return CLASSES[cls](dtype=dtype, **limits)


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


def case_inputs(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """(q, k, v, kwargs) to call an attention kernel on a dense case: fn(q, k, v, **kwargs)
    (varlen cases: kwargs start with cu_seqlens_q/k, see `varlen_inputs`)."""
    kw = dict(case.kwargs)
    for name in ("kv_lens", "attn_mask"):
        if name in case.tensors:
            kw[name] = case.tensors[name]
    return case.tensors["q"], case.tensors["k"], case.tensors["v"], kw


def varlen_inputs(case: Case) -> tuple[tuple[torch.Tensor, ...], dict]:
    """(args, kwargs) for a varlen entry point: fn(q, k, v, cu_q, cu_k, **kwargs)."""
    t = case.tensors
    return (t["q"], t["k"], t["v"], t["cu_seqlens_q"], t["cu_seqlens_k"]), dict(case.kwargs)


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

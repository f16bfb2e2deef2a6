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
from flashcheck.oracles.formats import FP16, Format, format_of

from .case import Case
from .floats import representable

LAYOUTS = ("bhsd", "bshd", "padded", "dstep")
ODD_HEAD_DIMS = (1, 2, 3, 5, 7, 13, 40, 59, 72, 80, 96, 111, 160, 192, 255, 256)
BLOCKS = (16, 32, 64, 128)  # key-block widths real kernels use


@dataclass(frozen=True)
class Limits:
    max_bh: int
    max_m: int
    max_n: int
    max_head_dim: int


def default_limits() -> Limits:
    if INTERPRET:
        return Limits(max_bh=2, max_m=64, max_n=64, max_head_dim=64)
    return Limits(max_bh=2, max_m=64, max_n=512, max_head_dim=256)  # the CPU oracle bounds the size


def _lim(max_m, max_n, max_head_dim, max_bh) -> Limits:
    d = default_limits()
    return Limits(max_bh or d.max_bh, max_m or d.max_m, max_n or d.max_n, max_head_dim or d.max_head_dim)


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


@composite
def _head_dim(draw, lim: Limits) -> int:
    small = [d for d in (1, 3, 8, 16, 24, 32, 40, 59, 64) if d <= lim.max_head_dim]
    return draw(st.one_of(st.sampled_from(small), st.integers(1, lim.max_head_dim)))


@dataclass
class _Parts:
    q: np.ndarray
    k: np.ndarray
    v: np.ndarray
    causal: bool = False
    scale: float | None = None
    kv_lens: list[int] | None = None


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
    return Case(tensors=tensors, kwargs={"causal": bool(parts.causal), "scale": parts.scale},
                label=f"{label}/{layout}")


def _normal(rng, shape, sigma=1.0):
    return rng.standard_normal(shape) * sigma


def _maybe_kv_lens(draw, b: int, n: int) -> list[int] | None:
    if not draw(st.booleans()):
        return None
    return [draw(st.integers(0, n)) for _ in range(b)]


# ---- the classes -------------------------------------------------------------------------------

@composite
def benign_attention(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None,
                     strided: bool = True) -> Case:
    """Standard-normal q, k, v, any shape, with or without causal masking and kv_lens."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh)
    b, h = draw(_bh(lim))
    m, n, d = draw(_lengths(lim.max_m)), draw(_lengths(lim.max_n)), draw(_head_dim(lim))
    rng = np.random.default_rng(draw(_seed()))
    sig = draw(st.sampled_from([1.0, 0.25, 3.0]))
    parts = _Parts(_normal(rng, (b, h, m, d), sig), _normal(rng, (b, h, n, d), sig), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()), kv_lens=_maybe_kv_lens(draw, b, n))
    return _finish(draw, parts, fmt, "benign", strided=strided)


@composite
def wide_logit_spread(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None,
                      strided: bool = True) -> Case:
    """Scaled logits spreading far beyond 88 (exp underflows for most keys), by large q/k or by
    a large explicit scale; sometimes all logits shifted far from 0 ([1000, 1001]-style)."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh)
    b, h = draw(_bh(lim))
    m, n, d = draw(_lengths(lim.max_m)), draw(_lengths(lim.max_n, min_len=2)), draw(_head_dim(lim))
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
def fp16_overflowing_scores(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None,
                            strided: bool = True) -> Case:
    """Raw scores q.k beyond fp16's 65504 (a dot kept in fp16 overflows to inf), from entries in
    the hundreds; sometimes with a tiny scale so the scaled logits stay moderate."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh)
    b, h = draw(_bh(lim))
    m, n = draw(_lengths(lim.max_m)), draw(_lengths(lim.max_n))
    d = draw(st.integers(min(4, lim.max_head_dim), lim.max_head_dim))
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
def odd_head_dims(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None,
                  strided: bool = True) -> Case:
    """Head dims that are not powers of two (40, 59, 72, 80, 96, 111, 160, 192, ...): a head dim
    cut to the block width (Triton #621) or padding lanes read as garbage show here."""
    lim = _lim(max_m, max_n, max_head_dim or (80 if INTERPRET else 256), max_bh)
    fmt = _fmt(dtype)
    dims = [d for d in ODD_HEAD_DIMS if d <= lim.max_head_dim]
    d = draw(st.sampled_from(dims))
    b, h = 1, 1
    m = draw(_lengths(min(lim.max_m, 33 if INTERPRET else lim.max_m)))
    n = draw(_lengths(min(lim.max_n, 40 if INTERPRET else lim.max_n)))
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()), kv_lens=_maybe_kv_lens(draw, b, n))
    return _finish(draw, parts, fmt, f"odd_head_dims/D{d}", strided=strided)


@composite
def ragged_lengths(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None,
                   strided: bool = True) -> Case:
    """M != N, lengths at, just below and just above block widths, and 1."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh)
    b, h = draw(_bh(lim))
    m = draw(_lengths(lim.max_m))
    n = draw(_lengths(lim.max_n).filter(lambda x: x != m))
    d = draw(_head_dim(lim))
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()))
    return _finish(draw, parts, fmt, "ragged_lengths", strided=strided)


@composite
def kv_lens_edges(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None,
                  strided: bool = True) -> Case:
    """kv_lens of 0, 1, N, N - 1 and non-multiples of the block width, per batch."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh)
    b = max(1, min(2, lim.max_bh))
    h = 1
    m, n, d = draw(_lengths(lim.max_m)), draw(_lengths(lim.max_n, min_len=2)), draw(_head_dim(lim))
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
def causal_rectangular(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None,
                       strided: bool = True) -> Case:
    """Causal masking with M > N (rows past N see every key) and M < N (keys past M unseen)."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh)
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
def fully_masked_rows(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None,
                      strided: bool = True) -> Case:
    """Query rows that see no key (kv_lens 0 for a batch, with or without causal): exact zeros."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh)
    b = max(1, min(2, lim.max_bh))
    h = 1
    m, n, d = draw(_lengths(lim.max_m)), draw(_lengths(lim.max_n)), draw(_head_dim(lim))
    lens = [draw(st.integers(0, n)) for _ in range(b)]
    lens[draw(st.integers(0, b - 1))] = 0
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()), kv_lens=lens)
    return _finish(draw, parts, fmt, "fully_masked_rows", strided=strided,
                   hidden=draw(st.sampled_from(["zero", "nan"])))


@composite
def nan_in_hidden_kv(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None,
                     strided: bool = True) -> Case:
    """NaN, inf or huge values stored in K/V rows past kv_lens (and NaN guards past N around every
    view): none of it may reach the output (FlashAttention #1395, vLLM #30887, PyTorch #101967)."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh)
    b = max(1, min(2, lim.max_bh))
    h = 1
    m, n, d = draw(_lengths(lim.max_m)), draw(_lengths(lim.max_n, min_len=2)), draw(_head_dim(lim))
    lens = [draw(st.integers(0, n - 1)) for _ in range(b)]
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()), kv_lens=lens)
    hidden = draw(st.sampled_from(["nan", "inf", "huge"]))
    return _finish(draw, parts, fmt, f"nan_in_hidden_kv/{hidden}", strided=strided, hidden=hidden)


@composite
def nan_in_visible_kv(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None,
                      strided: bool = True) -> Case:
    """A NaN in a visible key (its rows become NaN) or value (its column of those rows becomes
    NaN); the other rows and columns stay exact. Not causal: under causal masking a NaN value of an
    existing key may also reach rows of its block that do not see it (kernels/attention.py)."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh)
    b, h = draw(_bh(lim))
    m, n, d = draw(_lengths(lim.max_m)), draw(_lengths(lim.max_n)), draw(_head_dim(lim))
    rng = np.random.default_rng(draw(_seed()))
    q, k, v = _normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d))
    where = draw(st.sampled_from(["k", "v", "q"]))
    bi, hi = draw(st.integers(0, b - 1)), draw(st.integers(0, h - 1))
    target = {"k": k, "v": v, "q": q}[where]
    target[bi, hi, draw(st.integers(0, target.shape[2] - 1)), draw(st.integers(0, d - 1))] = np.nan
    return _finish(draw, _Parts(q, k, v), fmt, f"nan_in_visible_kv/{where}", strided=strided)


@composite
def strided_layouts(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None,
                    strided: bool = True) -> Case:
    """BSHD views (a (B, S, H, D) buffer transposed), padded rows/heads, head-dim stride 2 and
    storage offsets, all inside NaN-guarded buffers: ignored strides show at once."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh)
    b, h = draw(_bh(lim))
    if lim.max_bh >= 2 and h < 2:  # BSHD with H = 1 would be contiguous
        b, h = max(1, min(b, lim.max_bh // 2)), 2
    m, n = draw(_lengths(lim.max_m, min_len=2)), draw(_lengths(lim.max_n, min_len=2))
    d = max(2, draw(_head_dim(lim)))
    rng = np.random.default_rng(draw(_seed()))
    parts = _Parts(_normal(rng, (b, h, m, d)), _normal(rng, (b, h, n, d)), _normal(rng, (b, h, n, d)),
                   causal=draw(st.booleans()), kv_lens=_maybe_kv_lens(draw, b, n))
    layout = draw(st.sampled_from(LAYOUTS[1:])) if strided else "bhsd"
    return _finish(draw, parts, fmt, "strided_layouts", layout=layout)


@composite
def tied_scores(draw, *, dtype, max_m=None, max_n=None, max_head_dim=None, max_bh=None,
                strided: bool = True) -> Case:
    """Equal scores (q = 0 rows, or every key equal): the output is an exact mean of V rows, often
    a rounding midpoint; the oracle must decide it exactly and the kernel get within its bound."""
    fmt, lim = _fmt(dtype), _lim(max_m, max_n, max_head_dim, max_bh)
    b, h = draw(_bh(lim))
    m, n, d = draw(_lengths(lim.max_m)), draw(_lengths(lim.max_n)), draw(_head_dim(lim))
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


CLASSES = {
    "benign": benign_attention,
    "wide_logit_spread": wide_logit_spread,
    "fp16_overflowing_scores": fp16_overflowing_scores,
    "odd_head_dims": odd_head_dims,
    "ragged_lengths": ragged_lengths,
    "kv_lens_edges": kv_lens_edges,
    "causal_rectangular": causal_rectangular,
    "fully_masked_rows": fully_masked_rows,
    "nan_in_hidden_kv": nan_in_hidden_kv,
    "nan_in_visible_kv": nan_in_visible_kv,
    "strided_layouts": strided_layouts,
    "tied_scores": tied_scores,
}


def attention_cases(*, dtype, max_head_dim: int | None = None, max_m: int | None = None,
                    max_n: int | None = None, max_bh: int | None = None, strided: bool = True,
                    classes: tuple[str, ...] | None = None) -> SearchStrategy[Case]:
    """Any adversarial attention input: the union of every class (or of `classes`)."""
    names = classes or tuple(CLASSES)
    return st.one_of([CLASSES[c](dtype=dtype, max_m=max_m, max_n=max_n, max_head_dim=max_head_dim,
                                 max_bh=max_bh, strided=strided) for c in names])


def case_inputs(case: Case) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, dict]:
    """(q, k, v, kwargs) to call an attention kernel on a case: fn(q, k, v, **kwargs)."""
    kw = dict(case.kwargs)
    if "kv_lens" in case.tensors:
        kw["kv_lens"] = case.tensors["kv_lens"]
    return case.tensors["q"], case.tensors["k"], case.tensors["v"], kw


__all__ = ["CLASSES", "LAYOUTS", "ODD_HEAD_DIMS", "Limits", "default_limits", "attention_cases", "case_inputs",
           "place", *[f.__name__ for f in CLASSES.values()]]

"""The attention strategies' building blocks: size limits and declared shapes, the kernel's
capabilities (`Caps`), the memory layouts and NaN-guarded buffers (`place`), the shared draws
(lengths, batch-heads, head dims) and `_finish`, which rounds, lays out and packages a case. The
classes themselves are in `attention_dense.py` and `attention_options.py`; `attention.py` is the
public face (records, union, call helpers).

Changing a draw here changes every class's examples (and the Hypothesis seeds in fixtures).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy, composite

import contextvars
import os

from flashcheck.kernels._runtime import DEVICE, INTERPRET
from flashcheck.kernels.attention_spec import ATTENTION_FEATURES, CAUSAL_ALIGNS
from flashcheck.oracles.formats import Format, format_of

from .case import Case
from .floats import representable

LAYOUTS = ("bhsd", "bshd", "padded", "dstep")
ODD_HEAD_DIMS = (1, 2, 3, 5, 7, 13, 40, 59, 72, 80, 96, 111, 160, 192, 255, 256)
BLOCKS = (16, 32, 64, 128)  # key-block widths real kernels use

#: Compile-aware geometry (on by default on a GPU; FLASHCHECK_COMPILE_AWARE=0/1 overrides). Triton
#: compiles a binary per specialisation of a kernel's integer arguments (each is 1, a multiple of 16
#: or neither) and a stride is a product of sizes: sizes and layouts drawn independently gave an
#: author's plain attention kernel 2174 binaries in one gpu-profile verdict (one H200), and
#: compiling them was most of its time. On a GPU each case is drawn inside one `Geometry` of
#: `GEOMETRIES` (`in_geometry`): its layout and, for query length, key length and head dims, the
#: class every drawn size is moved into (`_snap`): a multiple of 16, or odd. Odd sizes keep their
#: tails at every block width and multiples of 16 their alignment; a stride's class then follows
#: from the geometry, so cases of one geometry share binaries. Sizes of 1 stay 1 (decode, one key).
#: The CPU draws every size and layout: there nothing is compiled.
COMPILE_AWARE = os.environ.get("FLASHCHECK_COMPILE_AWARE", "0" if INTERPRET else "1") == "1"


@dataclass(frozen=True)
class Geometry:
    """A layout and the class ("16" or "odd") of each drawn size: m, n and the head dims d (dv too)."""

    layout: str
    m: str
    n: str
    d: str


#: Each layout once with aligned head dims, the ragged combinations real kernels meet (odd query
#: rows against aligned keys and the reverse), and odd head dims contiguous and padded.
GEOMETRIES = (
    Geometry("bhsd", "16", "16", "16"),
    Geometry("bhsd", "odd", "odd", "odd"),
    Geometry("bhsd", "odd", "16", "16"),
    Geometry("bshd", "16", "odd", "16"),
    Geometry("padded", "odd", "odd", "odd"),
    Geometry("dstep", "odd", "odd", "16"),
)
_GEOMETRY: contextvars.ContextVar[Geometry | None] = contextvars.ContextVar("geometry", default=None)


def in_geometry(strategy: SearchStrategy) -> SearchStrategy:
    """`strategy` drawn inside one of `GEOMETRIES` on a GPU; itself on the CPU."""
    if not COMPILE_AWARE:
        return strategy

    @composite
    def drawn(draw):
        token = _GEOMETRY.set(draw(st.sampled_from(GEOMETRIES)))
        try:
            return draw(strategy)
        finally:
            _GEOMETRY.reset(token)

    return drawn()


def _snap(v: int, lo: int, hi: int, dim: str) -> int:
    """v moved into the current geometry's class for `dim` ("m", "n", "d") inside [lo, hi], the
    nearest such value; 1 stays 1, and v stays v outside a geometry or where no value fits."""
    g = _GEOMETRY.get()
    if g is None or v == 1:
        return v
    if getattr(g, dim) == "16":
        options = [x for x in (v - v % 16, v - v % 16 + 16) if lo <= x <= hi and x > 0]
    else:
        options = [x for x in (v, v - 1, v + 1) if x % 2 and lo <= x <= hi]
    return min(options, key=lambda x: abs(x - v)) if options else v


def geometry_layout() -> str | None:
    """The current geometry's layout (None outside one)."""
    g = _GEOMETRY.get()
    return None if g is None else g.layout


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
    # The CPU oracle bounds the size; M past 128 (the widest GPU query tile) puts several tiles in a
    # launch, and causal ones in reverse order (REVERSE_M), as on the CPU with its 32-row tiles.
    return Limits(max_bh=2, max_m=192, max_n=512, max_head_dim=256)


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
        # Odd pitches under COMPILE_AWARE: never a multiple of 16 by coincidence. Each pitch is made
        # odd before the next is sized from it: bumping them after let a head start inside the last
        # row of the head before (an aliased view; the GPU's varlen isolation check poisoned one
        # sequence's key through another's).
        odd = (lambda x: x | 1) if COMPILE_AWARE else (lambda x: x)
        row = odd(D + rng_pad)
        head = odd(S * row + 3)
        batch = odd(H * head + 5)
        strides = (batch, head, row, 1)
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


def _lengths(max_len: int, *, min_len: int = 1, dim: str = "m") -> SearchStrategy[int]:
    """Sequence lengths: 1, just below/at/above block widths, anything (in the geometry's class
    for `dim`, "m" or "n")."""
    near = sorted({v for b in BLOCKS for v in (b - 1, b, b + 1, b // 2 + 1) if min_len <= v <= max_len})
    opts = [st.integers(min_len, max_len)]
    if near:
        opts.append(st.sampled_from(near))
    return st.one_of(opts).map(lambda v: _snap(v, min_len, max_len, dim))


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
    return _snap(draw(st.one_of(st.sampled_from(small), st.integers(1, lim.max_head_dim))), 1, lim.max_head_dim, "d")


@composite
def _key_len(draw, lim: Limits, m: int, *, min_len: int = 1) -> int:
    """N for a drawn M: M itself for a kernel that declares square_only, else any length."""
    if lim.shapes is not None and lim.shapes.square and min_len <= m <= lim.max_n:
        return m
    return draw(_lengths(lim.max_n, min_len=min_len, dim="n"))


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


def _storage_offset(draw, fmt: Format, *, unaligned: bool) -> int:
    """Where each tensor starts in its buffer, in elements. Any of 0..5 (most of them not 16-byte
    aligned) where the class is about layouts; elsewhere 0, 1 or 2 times 16 bytes. On a GPU, Triton
    compiles one binary per pointer alignment (16 bytes or not) of each of q, k, v: unaligned
    offsets in every class multiplied the suite's compiled variants (distinct attention keys in the
    ci profile, `flashcheck.plugin.compile_keys`: 418 with them, 326 without) without reaching any other
    arithmetic. Aligned offsets
    other than 0 still catch a kernel that ignores the storage offset."""
    if unaligned:
        return draw(st.integers(0, 5))
    return draw(st.integers(0, 2)) * (16 // fmt.torch_dtype.itemsize)


def _finish(draw, parts: _Parts, fmt: Format, label: str, *, strided: bool = True,
            layout: str | None = None, hidden: str = "zero", unaligned: bool = False) -> Case:
    """Round to the format, store hidden K/V rows (past kv_lens) as `hidden` ("zero", "nan",
    "inf", "huge"), lay out (storage offsets: `_storage_offset`), package."""
    q, k, v = (representable(a, fmt) for a in (parts.q, parts.k, parts.v))
    if parts.kv_lens is not None and hidden != "zero":
        fill = {"nan": np.nan, "inf": np.inf, "huge": fmt.max_finite}[hidden]
        for b, n_valid in enumerate(parts.kv_lens):
            k[b, :, n_valid:, :] = fill
            v[b, :, n_valid:, :] = -fill if hidden == "huge" else fill
    if layout is None:
        layout = (geometry_layout() or draw(st.sampled_from(LAYOUTS))) if strided else "bhsd"
    pad, off = draw(st.integers(1, 9)), _storage_offset(draw, fmt, unaligned=unaligned)
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


# ---- capability draws (the feature classes') --------------------------------------------------

def _caps(caps: Caps | None) -> Caps:
    return caps if caps is not None else Caps()


def _align(draw, caps: Caps) -> str:
    return draw(st.sampled_from(caps.aligns))


def _value_dim(draw, caps: Caps, d: int, lim: Limits) -> int:
    """Dv: usually D, another head dim when the kernel takes Dv != D."""
    if "dv" in caps and draw(st.booleans()):
        return _snap(draw(st.sampled_from([x for x in (1, 8, 20, 33, 64) if x <= lim.max_head_dim] or [d])),
                     1, lim.max_head_dim, "d")
    return d


def _causal(draw, caps: Caps) -> bool:
    return "causal" in caps and draw(st.booleans())

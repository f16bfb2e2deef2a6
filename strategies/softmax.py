"""Adversarial inputs for the softmax family, one named strategy per class of NUMERICS.md s. 4.

Each strategy returns a `Case` whose tensor `x` is an (M, N) view inside a NaN-guarded buffer
(see `floats.materialize`). Long rows are drawn as a seed plus structure (where the -inf runs
go, which value peaks) rather than element by element: Hypothesis then shrinks the structure,
and drawing thousands of floats one at a time would dominate the run.
"""
from __future__ import annotations

import math

import numpy as np
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy, composite

from kernels import DEVICE
from oracles.formats import BF16, FP16, Format
from .case import Case

from .floats import Layout, exact_floats, layouts, materialize, representable

BLOCKS = (64, 128, 256, 512, 1024, 2048, 4096)  # tile widths real kernels use
NEG_INF = -np.inf


def row_lengths(*, max_n: int, min_n: int = 1) -> SearchStrategy[int]:
    """N = 1, just below/at/above powers of two, BLOCK/2 mod BLOCK, primes, anything."""
    pow2 = [1 << k for k in range(0, 31) if (1 << k) <= max_n + 1]
    near = sorted({v for p in pow2 for v in (p - 1, p, p + 1) if min_n <= v <= max_n})
    half = sorted({k * b + b // 2 for b in BLOCKS for k in range(3) if min_n <= k * b + b // 2 <= max_n})
    primes = [p for p in (2, 3, 5, 7, 13, 31, 61, 127, 251, 509, 1021, 2039, 4093, 8191, 16381, 65521)
              if min_n <= p <= max_n]
    options = [st.integers(min_n, max_n), st.sampled_from(near)]
    options += [st.sampled_from(half)] if half else []
    options += [st.sampled_from(primes)] if primes else []
    return st.one_of(options)


def _seed() -> SearchStrategy[int]:
    return st.integers(0, 2**32 - 1)


@composite
def _shape(draw, *, max_n: int, max_m: int, min_n: int = 1) -> tuple[int, int]:
    return draw(st.integers(1, max_m)), draw(row_lengths(max_n=max_n, min_n=min_n))


def _finish(draw, values: np.ndarray, fmt: Format, label: str, strided: bool) -> Case:
    layout = draw(layouts(strided=strided))
    x = materialize(representable(values, fmt), fmt, layout, DEVICE)
    return Case(tensors={"x": x}, label=label)


# ---- the classes ---------------------------------------------------------------------------------

@composite
def benign_rows(draw, *, fmt: Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """Standard-normal logits times a drawn scale: the baseline every kernel must get right."""
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    scale = draw(st.sampled_from([1.0, 0.1, 4.0, 16.0]))
    v = np.random.default_rng(draw(_seed())).standard_normal((m, n)) * scale
    return _finish(draw, v, fmt, "benign", strided)


@composite
def elementwise_rows(draw, *, fmt: Format, max_n: int = 24, max_m: int = 3, strided: bool = True) -> Case:
    """Short rows drawn value by value from all of `fmt`: zeros, subnormals, extremes, inf, NaN."""
    m = draw(st.integers(1, max_m))
    n = draw(st.integers(1, max_n))
    elems = exact_floats(fmt)
    v = np.array(draw(st.lists(st.lists(elems, min_size=n, max_size=n), min_size=m, max_size=m)))
    return _finish(draw, v.reshape(m, n), fmt, "elementwise", strided)


@composite
def huge_magnitude_rows(draw, *, fmt: Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """Values near the format's max, [1000, 1001]-style offsets (no max subtraction overflows),
    and spreads far above 88 so most exponentials underflow."""
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    rng = np.random.default_rng(draw(_seed()))
    kind = draw(st.sampled_from(["offset", "near_max", "spread"]))
    u = rng.random((m, n))
    if kind == "offset":
        base = draw(st.sampled_from([1000.0, 1.0e4, 3.0e4] + ([] if fmt == FP16 else [1.0e6, 1.0e30])))
        v = base + u * draw(st.sampled_from([1.0, 8.0, 60.0]))
    elif kind == "near_max":
        v = fmt.max_finite * (1.0 - u * 2.0 ** -draw(st.integers(1, 6)))
        v *= np.where(rng.random((m, n)) < draw(st.sampled_from([0.0, 0.5])), -1.0, 1.0)
    else:
        spread = draw(st.sampled_from([100.0, 1000.0, 6.0e4] + ([] if fmt == FP16 else [1e10, 1e38])))
        v = -u * spread + draw(st.sampled_from([0.0, 100.0]))
    return _finish(draw, v, fmt, f"huge_magnitude/{kind}", strided)


@composite
def very_negative_rows(draw, *, fmt: Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """Every value below -1e5 (below -1e4 in fp16, whose range ends at 65504): a finite
    sentinel such as -1e4, -5e4 or finfo.min + x standing in for -inf shows at once."""
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    rng = np.random.default_rng(draw(_seed()))
    top = -1.1e4 if fmt == FP16 else -1.0e5
    floor = -fmt.max_finite if draw(st.booleans()) else top * 10
    v = top + (floor - top) * rng.random((m, n)) ** draw(st.sampled_from([1.0, 8.0]))
    return _finish(draw, v, fmt, "very_negative", strided)


def _inf_runs(draw, n: int, rng: np.random.Generator) -> tuple[np.ndarray, str]:
    """A mask of -inf runs: prefix, suffix, interior, whole aligned blocks, or the first block."""
    mask = np.zeros(n, dtype=bool)
    kind = draw(st.sampled_from(["prefix", "suffix", "interior", "aligned_blocks", "first_block"]))
    if kind in ("prefix", "suffix", "interior"):
        length = draw(st.integers(1, max(1, n - 1)))
        start = {"prefix": 0, "suffix": n - length}.get(kind) or draw(st.integers(0, n - length))
        mask[start:start + length] = True
    else:
        block = draw(st.sampled_from([b for b in BLOCKS if b < n] or [max(1, n // 2)]))
        nblocks = math.ceil(n / block)
        chosen = [0] if kind == "first_block" else [i for i in range(nblocks) if rng.random() < 0.5]
        for i in chosen:
            mask[i * block:(i + 1) * block] = True
    if mask.all() and n > 1:  # keep one visible logit: fully masked rows are their own class
        mask[draw(st.integers(0, n - 1))] = False
    return mask, kind


@composite
def neg_inf_padded_rows(draw, *, fmt: Format, max_n: int, max_m: int = 3, strided: bool = True) -> Case:
    """-inf runs anywhere, including whole power-of-two blocks and the first block; optionally
    every visible logit below -90, which catches a guard that swaps a -inf max for 0."""
    m, n = draw(_shape(max_n=max_n, max_m=max_m, min_n=2))
    rng = np.random.default_rng(draw(_seed()))
    below_90 = draw(st.booleans())
    v = rng.standard_normal((m, n)) * 3.0
    if below_90:
        v = v - 95.0 - (0.0 if fmt == FP16 else 30.0 * rng.random((m, 1)))
    kinds = []
    for i in range(m):
        mask, kind = _inf_runs(draw, n, rng)
        v[i, mask] = NEG_INF
        kinds.append(kind)
    return _finish(draw, v, fmt, f"neg_inf_padding/{kinds[0]}{'/below-90' if below_90 else ''}", strided)


@composite
def fully_masked_rows(draw, *, fmt: Format, max_n: int, max_m: int = 5, strided: bool = True) -> Case:
    """Rows that are entirely -inf at the start, middle and end of a batch (torch: all NaN)."""
    m = draw(st.integers(1, max(1, max_m)))
    n = draw(row_lengths(max_n=max_n))
    v = np.random.default_rng(draw(_seed())).standard_normal((m, n))
    where = draw(st.sets(st.sampled_from(["first", "middle", "last"]), min_size=1))
    for w in where:
        v[{"first": 0, "middle": m // 2, "last": m - 1}[w], :] = NEG_INF
    return _finish(draw, v, fmt, "fully_masked", strided)


@composite
def nan_and_inf_rows(draw, *, fmt: Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """NaN and +inf alone and mixed with -inf, in some rows; the others must stay clean."""
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    rng = np.random.default_rng(draw(_seed()))
    v = rng.standard_normal((m, n))
    for i in sorted(draw(st.sets(st.integers(0, m - 1), min_size=1))):
        specials = draw(st.lists(st.sampled_from([np.nan, np.inf, NEG_INF]), min_size=1, max_size=4))
        for s in specials:
            v[i, draw(st.integers(0, n - 1))] = s
    return _finish(draw, v, fmt, "nan_inf", strided)


@composite
def peaked_rows(draw, *, fmt: Format, max_n: int, max_m: int = 3, strided: bool = True) -> Case:
    """One value +20, the rest about 0: padding lanes that add exp(0) show at once."""
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    rng = np.random.default_rng(draw(_seed()))
    v = rng.standard_normal((m, n)) * 0.01
    tail = draw(st.booleans())  # the peak in the tail, past the last full block
    for i in range(m):
        v[i, n - 1 if tail else draw(st.integers(0, n - 1))] = 20.0
    return _finish(draw, v, fmt, "peaked", strided)


@composite
def tied_rows(draw, *, fmt: Format, max_n: int, max_m: int = 3, strided: bool = True) -> Case:
    """Constant rows and k equal maxima among -inf: exact results (1/2^k) must come out exact."""
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    c = draw(exact_floats(fmt, allow_nan=False, allow_infinity=False))
    kind = draw(st.sampled_from(["constant", "k_maxima"]))
    v = np.full((m, n), c)
    if kind == "k_maxima":
        rng = np.random.default_rng(draw(_seed()))
        k = min(n, 1 << draw(st.integers(0, 6)))
        v[:] = NEG_INF
        for i in range(m):
            v[i, rng.choice(n, size=k, replace=False)] = c
    return _finish(draw, v, fmt, f"ties/{kind}", strided)


@composite
def subnormal_rows(draw, *, fmt: Format, max_n: int, max_m: int = 3, strided: bool = True) -> Case:
    """Subnormal inputs, and spreads whose outputs land in the subnormal range of `fmt`."""
    m, n = draw(_shape(max_n=max_n, max_m=max_m, min_n=2))
    rng = np.random.default_rng(draw(_seed()))
    if draw(st.booleans()):
        k = rng.integers(0, fmt.precision - 1, (m, n))
        v = np.ldexp(rng.choice([-1.0, 1.0], (m, n)), fmt.emin - 1 - k)
        label = "subnormal/inputs"
    else:
        lo, hi = -math.log(fmt.min_normal) - 1, -math.log(fmt.min_subnormal) + 1
        v = -(lo + (hi - lo) * rng.random((m, n)))
        v[:, draw(st.integers(0, n - 1))] = 0.0
        label = "subnormal/outputs"
    return _finish(draw, v, fmt, label, strided)


@composite
def long_uniform_rows(draw, *, fmt: Format, max_n: int, max_m: int = 2, strided: bool = False) -> Case:
    """Long rows of (nearly) equal values: an fp16 accumulator of the denominator stalls at 2048."""
    m = draw(st.integers(1, max_m))
    n = draw(st.integers(max(1, max_n // 2), max_n))
    noise = draw(st.sampled_from([0.0, 1e-3]))
    v = np.random.default_rng(draw(_seed())).standard_normal((m, n)) * noise
    return _finish(draw, v, fmt, "long_uniform", strided)


@composite
def increasing_rows(draw, *, fmt: Format, max_n: int, max_m: int = 2, strided: bool = True) -> Case:
    """Rows increasing across block boundaries: the running max changes in every chunk, so a
    missing rescale of the accumulated sum shows."""
    m, n = draw(_shape(max_n=max_n, max_m=max_m, min_n=2))
    rng = np.random.default_rng(draw(_seed()))
    slope = draw(st.sampled_from([1e-3, 0.05, 1.0, 30.0]))
    v = np.cumsum(rng.random((m, n)) * slope, axis=1)
    v -= v[:, -1:]
    return _finish(draw, v, fmt, "increasing", strided)


CLASSES = {
    "benign": benign_rows,
    "elementwise": elementwise_rows,
    "huge_magnitude": huge_magnitude_rows,
    "very_negative": very_negative_rows,
    "neg_inf_padding": neg_inf_padded_rows,
    "fully_masked": fully_masked_rows,
    "nan_inf": nan_and_inf_rows,
    "peaked": peaked_rows,
    "ties": tied_rows,
    "subnormal": subnormal_rows,
    "long_uniform": long_uniform_rows,
    "increasing": increasing_rows,
}


def softmax_cases(*, fmt: Format, max_n: int, strided: bool = True) -> SearchStrategy[Case]:
    """Any adversarial softmax input: the union of every class."""
    return st.one_of([s(fmt=fmt, max_n=max_n, strided=strided) if name != "elementwise"
                      else s(fmt=fmt, strided=strided) for name, s in CLASSES.items()])


__all__ = ["CLASSES", "BLOCKS", "row_lengths", "softmax_cases", "Layout", *[f.__name__ for f in CLASSES.values()]]

"""Adversarial inputs for the softmax family, one named strategy per class of NUMERICS.md s. 4.

Each strategy returns a `Case` whose tensor `x` is an (M, N) view inside a NaN-guarded buffer
(see `floats.materialize`). Long rows are drawn as structure (where the -inf runs go, which
value peaks) over a cheap background (`floats.backgrounds`: seeded noise, a few values, or a
constant) plus a few exact overrides (`floats.with_overrides`) rather than element by element:
drawing thousands of floats one at a time would dominate the run, and Hypothesis still shrinks a
counterexample to a constant row plus the elements that matter.
"""
from __future__ import annotations

import functools
import math
from typing import Sequence

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy, composite

from flashcheck.kernels import DEVICE
from flashcheck.oracles import bounds
from flashcheck.oracles.formats import BF16, FP16, Format, format_of
from .case import Case
from .records import StrategyClass, by_name

from .floats import Layout, backgrounds, exact_floats, layouts, materialize, representable, with_overrides

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


def _finite(fmt: Format, bound: float) -> SearchStrategy[float]:
    """Exact finite values of `fmt` in [-b, b], b the power of two >= bound (exact in every format):
    what overrides of a clean row may hold."""
    b = 2.0 ** math.ceil(math.log2(bound))
    return exact_floats(fmt, min_value=-b, max_value=b, allow_nan=False, allow_infinity=False)


def _finish(draw, values: np.ndarray, fmt: Format, label: str, strided: bool,
            layout_strategy: SearchStrategy[Layout] | None = None) -> Case:
    layout = draw(layout_strategy if strided and layout_strategy is not None else layouts(strided=strided))
    x = materialize(representable(values, fmt), fmt, layout, DEVICE)
    return Case(tensors={"x": x}, label=label)


# ---- modes: one kind per case, or every kind at once ---------------------------------------------
#
# A class has several kinds (where the -inf runs go, which special value, where the peak is). A
# case either uses one kind for all its rows (that branch comes first, so failures shrink to a
# single simple kind) or, with about even odds, stacks one row per kind ("all"), with lengths
# long enough for every kind to show. The ci profile runs only 12 examples per class test; the
# "all" cases make every kind of the class near certain to be drawn in them
# (tests/test_strategies.py proves it for the draws CI really makes).

ALL = "all"


def _mode(kinds: Sequence[str]) -> SearchStrategy[str]:
    """One of `kinds` for the whole case (shrinks to the first), or ALL: one row per kind."""
    return st.one_of(st.sampled_from(list(kinds)), st.just(ALL))


def _long_lengths(*, max_n: int, min_n: int = 2, at_least: int = 1025) -> SearchStrategy[int]:
    """Row lengths for the every-kind cases: past a 1024 block when max_n allows, any of them."""
    lo = min(max_n, max(min_n, at_least))
    fixed = sorted({v for v in (lo, 1025, 1537, 2047, 2048, 4097, max_n) if lo <= v <= max_n})
    return st.one_of(st.integers(lo, max_n), st.sampled_from(fixed))


def _largest_block_below(n: int) -> int:
    """The widest tile of BLOCKS that a row of n fills and still spills past."""
    fits = [b for b in BLOCKS if b < n]
    return fits[-1] if fits else max(1, n // 2)


# ---- the classes ---------------------------------------------------------------------------------

@composite
def benign_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """Standard-normal logits times a drawn scale: the baseline every kernel must get right."""
    fmt = format_of(dtype)
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    scale = draw(st.sampled_from([1.0, 0.1, 4.0, 16.0]))
    v = draw(backgrounds((m, n), scale=scale))
    v = draw(with_overrides(v, _finite(fmt, 4.0 * scale)))
    return _finish(draw, v, fmt, "benign", strided)


@composite
def elementwise_rows(draw, *, dtype: torch.dtype | Format, max_n: int = 24, max_m: int = 3, strided: bool = True) -> Case:
    """Short rows drawn value by value from all of `fmt`: zeros, subnormals, extremes, inf, NaN."""
    fmt = format_of(dtype)
    m = draw(st.integers(1, max_m))
    n = draw(st.integers(1, max_n))
    elems = exact_floats(fmt)
    v = np.array(draw(st.lists(st.lists(elems, min_size=n, max_size=n), min_size=m, max_size=m)))
    return _finish(draw, v.reshape(m, n), fmt, "elementwise", strided)


HUGE_KINDS = ("offset", "near_max", "spread")


def _huge_row(draw, kind: str, n: int, rng: np.random.Generator, fmt: Format) -> np.ndarray:
    u = rng.random(n)
    if kind == "offset":
        base = draw(st.sampled_from([1000.0, 1.0e4, 3.0e4] + ([] if fmt == FP16 else [1.0e6, 1.0e30])))
        return base + u * draw(st.sampled_from([1.0, 8.0, 60.0]))
    if kind == "near_max":
        v = fmt.max_finite * (1.0 - u * 2.0 ** -draw(st.integers(1, 6)))
        return v * np.where(rng.random(n) < draw(st.sampled_from([0.0, 0.5])), -1.0, 1.0)
    spread = draw(st.sampled_from([100.0, 1000.0, 6.0e4] + ([] if fmt == FP16 else [1e10, 1e38])))
    return -u * spread + draw(st.sampled_from([0.0, 100.0]))


@composite
def huge_magnitude_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """Values near the format's max, [1000, 1001]-style offsets (no max subtraction overflows),
    and spreads far above 88 so most exponentials underflow."""
    fmt = format_of(dtype)
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    rng = np.random.default_rng(draw(_seed()))
    mode = draw(_mode(HUGE_KINDS))
    kinds = list(HUGE_KINDS) if mode == ALL else [mode] * m
    v = np.stack([_huge_row(draw, k, n, rng, fmt) for k in kinds])
    return _finish(draw, v, fmt, f"huge_magnitude/{mode}", strided)


@composite
def very_negative_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """Every value below -1e5 (below -1.1e4 in fp16, whose range ends at 65504; or below -5e4
    there): a finite sentinel such as -1e4, -5e4 or finfo.min + x standing in for -inf shows."""
    fmt = format_of(dtype)
    m, n = draw(_shape(max_n=max_n, max_m=max_m))
    rng = np.random.default_rng(draw(_seed()))
    top = draw(st.sampled_from([-1.2e4, -5.1e4] if fmt == FP16 else [-1.01e5, -1.0e7]))
    floor = -fmt.max_finite if draw(st.booleans()) else max(top * 10, -fmt.max_finite)
    v = top + (floor - top) * rng.random((m, n)) ** draw(st.sampled_from([1.0, 8.0]))
    # A row masked entirely with a finite sentinel (HF's -1e4, -1e9, the dtype's min): the softmax
    # is uniform, and a kernel comparing against such a value as if it were -inf gets it wrong.
    sentinel = draw(st.one_of(st.none(), st.sampled_from(_sentinels(fmt))))
    if sentinel is not None:
        v[draw(st.integers(0, m - 1))] = sentinel
    return _finish(draw, v, fmt, "very_negative" + ("/sentinel_row" if sentinel is not None else ""), strided)


def _sentinels(fmt: Format) -> list[float]:
    """Finite stand-ins for -inf that real masking code writes: -1e4 (BERT-style additive masks),
    -1e9, and the dtype's most negative value (masked_fill with finfo.min)."""
    return [v for v in (-1.0e4, -1.0e9, -fmt.max_finite) if v >= -fmt.max_finite]


INF_RUN_KINDS = ("prefix", "suffix", "interior", "aligned_blocks", "first_block", "lead_block_low")


def _inf_runs(draw, n: int, rng: np.random.Generator, kind: str) -> np.ndarray:
    """A mask of -inf runs: prefix, suffix, interior, whole aligned blocks (at least one past the
    first when there are two), the first block, or the widest block the row spills past."""
    mask = np.zeros(n, dtype=bool)
    if kind in ("prefix", "suffix", "interior"):
        length = draw(st.integers(1, max(1, n - 1)))
        start = {"prefix": 0, "suffix": n - length}.get(kind) or draw(st.integers(0, n - length))
        mask[start:start + length] = True
    elif kind == "lead_block_low":
        mask[:_largest_block_below(n)] = True
    else:
        block = draw(st.sampled_from([b for b in BLOCKS if b < n] or [max(1, n // 2)]))
        nblocks = math.ceil(n / block)
        if kind == "first_block":
            chosen = [0]
        else:
            chosen = [i for i in range(nblocks) if rng.random() < 0.5]
            if nblocks > 1 and not any(i > 0 for i in chosen):
                chosen.append(int(rng.integers(1, nblocks)))
        for i in chosen:
            mask[i * block:(i + 1) * block] = True
    if mask.all() and n > 1:  # keep one visible logit: fully masked rows are their own class
        keep = n - 1 if kind == "lead_block_low" else draw(st.integers(0, n - 1))
        mask[keep] = False
    return mask


@composite
def neg_inf_padded_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 3, strided: bool = True) -> Case:
    """-inf runs anywhere, including whole power-of-two blocks and the first block; optionally
    every visible logit below -90. `lead_block_low` rows mask the widest block the row spills
    past (1024 for rows of 1025..2048) and put every visible logit below -90: a guard that swaps
    a -inf running max for 0 then underflows them all. Every-kind cases have rows past 1024."""
    fmt = format_of(dtype)
    mode = draw(_mode(INF_RUN_KINDS))
    if mode == ALL:
        kinds = list(INF_RUN_KINDS)
        n = draw(_long_lengths(max_n=max_n))
    else:
        m, n = draw(_shape(max_n=max_n, max_m=max_m, min_n=2))
        kinds = [mode] * m
    rng = np.random.default_rng(draw(_seed()))
    below_90 = draw(st.booleans())
    v = draw(backgrounds((len(kinds), n), scale=3.0))
    if below_90:
        v = v - 95.0 - (0.0 if fmt == FP16 else 30.0 * rng.random((len(kinds), 1)))
    for i, kind in enumerate(kinds):
        if kind == "lead_block_low":
            v[i] = -95.0 - 30.0 * rng.random(n)
        v[i, _inf_runs(draw, n, rng, kind)] = NEG_INF
    return _finish(draw, v, fmt, f"neg_inf_padding/{mode}{'/below-90' if below_90 else ''}", strided)


@composite
def fully_masked_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 5, strided: bool = True) -> Case:
    """Rows that are entirely -inf at the start, middle and end of a batch (torch: all NaN).
    Every-position cases have at least 5 rows, so clean rows sit between the masked ones."""
    fmt = format_of(dtype)
    positions = ("first", "middle", "last")
    where = draw(st.one_of(st.sets(st.sampled_from(positions), min_size=1), st.just(frozenset(positions))))
    lo = 5 if len(where) == 3 else 1
    m = draw(st.integers(lo, max(lo, max_m)))
    n = draw(row_lengths(max_n=max_n))
    v = draw(backgrounds((m, n)))
    for w in where:
        v[{"first": 0, "middle": m // 2, "last": m - 1}[w], :] = NEG_INF
    return _finish(draw, v, fmt, "fully_masked", strided)


NAN_KINDS = ("random", "nan", "pos_inf", "nan_neg_inf", "pos_inf_neg_inf")
_NAN_SPECIALS = {"nan": [np.nan], "pos_inf": [np.inf], "nan_neg_inf": [np.nan, NEG_INF],
                 "pos_inf_neg_inf": [np.inf, NEG_INF]}


@composite
def nan_and_inf_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 4, strided: bool = True) -> Case:
    """NaN and +inf alone and mixed with -inf, in some rows; the others must stay clean (with a
    strided layout, the NaN guard data between rows is NaN that must stay invisible)."""
    fmt = format_of(dtype)
    mode = draw(_mode(NAN_KINDS))
    if mode == ALL:
        kinds = [*NAN_KINDS, "clean"]
        m, n = len(kinds), draw(row_lengths(max_n=max_n, min_n=2))
    else:
        m, n = draw(_shape(max_n=max_n, max_m=max_m))
        chosen = draw(st.sets(st.integers(0, m - 1), min_size=1))
        kinds = [mode if i in chosen else "clean" for i in range(m)]
    rng = np.random.default_rng(draw(_seed()))
    v = draw(backgrounds((m, n)))
    for i, kind in enumerate(kinds):
        if kind == "random":
            for s in draw(st.lists(st.sampled_from([np.nan, np.inf, NEG_INF]), min_size=1, max_size=4)):
                v[i, draw(st.integers(0, n - 1))] = s
        elif kind != "clean":
            specials = _NAN_SPECIALS[kind]
            count = min(n, len(specials) + int(rng.integers(0, 3)))
            for j, pos in enumerate(rng.choice(n, size=count, replace=False)):
                v[i, pos] = specials[min(j, len(specials) - 1)]
    # Every-kind cases keep NaN guard data between the rows (row stride > N): a clean row next to
    # NaN padding that must stay invisible.
    gaps = st.builds(Layout, col_step=st.sampled_from([1, 2, 3]), row_pad=st.sampled_from([1, 7, 64]),
                     offset=st.integers(0, 9), tail=st.integers(0, 8))
    return _finish(draw, v, fmt, f"nan_inf/{mode}", strided, gaps if mode == ALL else None)


PEAK_KINDS = ("anywhere", "tail", "head")


@composite
def peaked_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 3, strided: bool = True) -> Case:
    """One value +20, the rest about 0: padding lanes that add exp(0) show at once. Every-kind
    cases have N = 2^k + 1, so the tail peak sits alone past the last full block."""
    fmt = format_of(dtype)
    mode = draw(_mode(PEAK_KINDS))
    if mode == ALL:
        kinds = list(PEAK_KINDS)
        tails = [(1 << k) + 1 for k in range(6, 31) if (1 << k) + 1 <= max_n] or [max_n]
        m, n = len(kinds), draw(st.sampled_from(tails))
    else:
        m, n = draw(_shape(max_n=max_n, max_m=max_m))
        kinds = [mode] * m
    rng = np.random.default_rng(draw(_seed()))
    v = draw(backgrounds((m, n), scale=0.01))
    for i, kind in enumerate(kinds):
        v[i, {"tail": n - 1, "head": 0}.get(kind, None) or draw(st.integers(0, n - 1))] = 20.0
    return _finish(draw, v, fmt, f"peaked/{mode}", strided)


@composite
def tied_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 3, strided: bool = True) -> Case:
    """Constant rows and k equal maxima among -inf: exact results (1/2^k) must come out exact.
    Every-kind cases have N = 2^j (a constant row gives exactly 2^-j) and k = 2^i < N maxima."""
    fmt = format_of(dtype)
    c = draw(exact_floats(fmt, allow_nan=False, allow_infinity=False))
    mode = draw(_mode(("constant", "k_maxima")))
    rng = np.random.default_rng(draw(_seed()))
    if mode == ALL:
        j = draw(st.integers(1, max(1, max_n.bit_length() - 1)))
        n = 1 << j
        kinds = ["constant", "k_maxima"]
        ks = [1, 1 << draw(st.integers(min(1, j - 1), max(0, j - 1)))]
    else:
        m, n = draw(_shape(max_n=max_n, max_m=max_m))
        kinds = [mode] * m
        ks = [min(n, 1 << draw(st.integers(0, 6)))] * m
    v = np.full((len(kinds), n), c)
    for i, (kind, k) in enumerate(zip(kinds, ks)):
        if kind == "k_maxima":
            v[i] = NEG_INF
            v[i, rng.choice(n, size=k, replace=False)] = c
    return _finish(draw, v, fmt, f"ties/{mode}", strided)


@composite
def subnormal_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 3, strided: bool = True) -> Case:
    """Subnormal inputs, and spreads whose outputs land in the subnormal range of `fmt`."""
    fmt = format_of(dtype)
    m, n = draw(_shape(max_n=max_n, max_m=max_m, min_n=2))
    rng = np.random.default_rng(draw(_seed()))
    mode = draw(_mode(("inputs", "outputs")))
    kinds = ["inputs", "outputs"] if mode == ALL else [mode] * m
    v = np.empty((len(kinds), n))
    for i, kind in enumerate(kinds):
        if kind == "inputs":
            k = rng.integers(0, fmt.precision - 1, n)
            v[i] = np.ldexp(rng.choice([-1.0, 1.0], n), fmt.emin - 1 - k)
        else:
            lo, hi = -math.log(fmt.min_normal) - 1, -math.log(fmt.min_subnormal) + 1
            v[i] = -(lo + (hi - lo) * rng.random(n))
            v[i, draw(st.integers(0, n - 1))] = 0.0
    return _finish(draw, v, fmt, f"subnormal/{mode}", strided)


UNIFORM_KINDS = ("exact", "noisy", "halfway")


@functools.lru_cache(maxsize=None)
def _halfway_logits(fmt: Format) -> tuple[np.ndarray, np.ndarray]:
    """Logits d of `fmt` in [-4, -2^-6] whose exponential exp(d) lies within an eighth of an ULP of
    a rounding midpoint of `fmt` (fp32 rows: of fp16), near the bottom of its binade, so rounding it
    to that format moves it by at least 3/4 of the unit roundoff: (those rounding down, those
    rounding up). An fp32 exp is within a few 2^-24 of exact (ex2.approx too), far inside that margin,
    so a kernel computing in fp32 sees the same sides."""
    half = fmt if fmt.bits == 16 else FP16
    d = np.unique(representable(np.linspace(-4.0, -2.0**-6, 1 << 17), half))
    e = np.exp(d)
    rel = (representable(e, half) - e) / e
    u = half.unit_roundoff
    return d[rel <= -0.75 * u], d[rel >= 0.75 * u]


def _halfway_row(n: int, rng: np.random.Generator, fmt: Format) -> np.ndarray:
    """A max of 0, a background of one logit whose exponential rounds down by nearly half a 16-bit
    ULP, and 1-32 probes whose exponentials round up as much. Rounding every term to 16 bits (the
    FP16-P shortcut of attention kernels, wrong in a softmax) shifts the sum of N equal terms by
    nearly a relative unit roundoff, never averaging out, and the probes the other way: about 1.5
    ULP in their outputs, past the 1 ULP contract. A correct fp32 kernel is unaffected."""
    down, up = _halfway_logits(fmt)
    row = np.full(n, rng.choice(down))
    k = int(rng.integers(1, min(32, n - 1) + 1)) if n > 2 else 0
    cols = rng.permutation(n)
    row[cols[0]] = 0.0
    row[cols[1:k + 1]] = rng.choice(up, size=k)
    return row


@functools.lru_cache(maxsize=None)
def halfway_max_n(fmt: Format) -> int:
    """The longest halfway row (a power of two) on which a kernel of unknown summation depth is
    still held to 1 ULP. A kernel that declares no `depth` is bounded at depth n (recursive
    summation, oracles/bounds.py), so its relative allowance e = (3|d| + 3E + n + SLACK) u grows
    with the row; with |d|, E <= 4 on a halfway row and y/ulp(y) < 2^p, the ULP allowance
    floor(e y/ulp + 1) stays 1 while (n + 24 + SLACK) u 2^p < 1. Past that (fp16: 8152, bf16:
    65496) the 1.5 ULP of 16-bit terms fits inside the bound, so on a GPU's 2^17 rows they would
    never show."""
    half = fmt if fmt.bits == 16 else FP16
    limit = 1.0 / (bounds.U32 * 2.0**half.precision) - 24 - bounds.SLACK
    return 1 << (int(limit).bit_length() - 1)


@composite
def long_uniform_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 2, strided: bool = False) -> Case:
    """Long rows of (nearly) equal values: an fp16 accumulator of the denominator stalls at 2048;
    "halfway" rows (`_halfway_row`) make terms rounded to 16 bits drift the sum past the bound.
    Cases with halfway rows are folded into `halfway_max_n` (the same draw below it)."""
    fmt = format_of(dtype)
    m = draw(st.integers(1, max_m))
    n = draw(st.integers(max(1, max_n // 2), max_n))
    mode = draw(_mode(UNIFORM_KINDS))
    cap = halfway_max_n(fmt)
    if mode in ("halfway", ALL) and n > cap:
        n = cap // 2 + n % (cap // 2 + 1)
    kinds = list(UNIFORM_KINDS) if mode == ALL else [mode] * m
    rng = np.random.default_rng(draw(_seed()))
    noise = {"exact": 0.0, "noisy": 1e-3}
    v = np.stack([_halfway_row(n, rng, fmt) if k == "halfway" else rng.standard_normal(n) * noise[k]
                  for k in kinds])
    return _finish(draw, v, fmt, f"long_uniform/{mode}", strided)


SLOPES = (1e-3, 0.05, 1.0, 30.0)


@composite
def increasing_rows(draw, *, dtype: torch.dtype | Format, max_n: int, max_m: int = 2, strided: bool = True) -> Case:
    """Rows increasing across block boundaries: the running max changes in every chunk, so a
    missing rescale of the accumulated sum shows. Every-slope cases span 3+ blocks of 256."""
    fmt = format_of(dtype)
    mode = draw(_mode([str(s) for s in SLOPES]))
    if mode == ALL:
        slopes = list(SLOPES)
        n = draw(_long_lengths(max_n=max_n, at_least=3 * 256 + 1))
    else:
        m, n = draw(_shape(max_n=max_n, max_m=max_m, min_n=2))
        slopes = [float(mode)] * m
    rng = np.random.default_rng(draw(_seed()))
    v = np.cumsum(rng.random((len(slopes), n)) * np.array(slopes)[:, None], axis=1)
    v -= v[:, -1:]
    return _finish(draw, v, fmt, f"increasing/{mode}", strided)


# The classes as records (strategies/records.py), in the order the union draws them (keep it:
# Hypothesis's draws depend on it). No softmax class needs a kernel feature.
CLASS_RECORDS: tuple[StrategyClass, ...] = tuple(StrategyClass(n, f) for n, f in (
    ("benign", benign_rows),
    ("elementwise", elementwise_rows),
    ("huge_magnitude", huge_magnitude_rows),
    ("very_negative", very_negative_rows),
    ("neg_inf_padding", neg_inf_padded_rows),
    ("fully_masked", fully_masked_rows),
    ("nan_inf", nan_and_inf_rows),
    ("peaked", peaked_rows),
    ("ties", tied_rows),
    ("subnormal", subnormal_rows),
    ("long_uniform", long_uniform_rows),
    ("increasing", increasing_rows),
))
CLASSES = by_name(CLASS_RECORDS)


def softmax_cases(*, dtype: torch.dtype | Format, max_n: int, strided: bool = True) -> SearchStrategy[Case]:
    """Any adversarial softmax input: the union of every class."""
    return st.one_of([s(dtype=dtype, max_n=max_n, strided=strided) if name != "elementwise"
                      else s(dtype=dtype, strided=strided) for name, s in CLASSES.items()])


__all__ = ["CLASSES", "BLOCKS", "row_lengths", "softmax_cases", "Layout", *[f.__name__ for f in CLASSES.values()]]


@composite
def declared_size_rows(draw, *, dtype: torch.dtype | Format, sizes: Sequence[int], min_n: int = 1, max_n: int,
                       strided: bool = True) -> Case:
    """Rows just below, at and above the sizes a kernel declares (its tiles and dispatch
    thresholds), whatever the run's usual length cap: a row that crosses the kernel's own block
    boundary with a -inf first block, a peak in the tail, or a rising max in every chunk."""
    fmt = format_of(dtype)
    lengths = sorted({v for s in sizes for v in (s - 1, s, s + 1) if min_n <= v <= max_n})
    if not lengths:
        raise ValueError(f"declared_size_rows: no declared size {list(sizes)} lies in [{min_n}, {max_n}]")
    n = draw(st.sampled_from(lengths))
    m = draw(st.integers(1, 2))
    kind = draw(st.sampled_from(["benign", "peaked_tail", "neg_inf_first_block", "increasing"]))
    rng = np.random.default_rng(draw(_seed()))
    v = rng.standard_normal((m, n))
    if kind == "peaked_tail":
        v[:, -1] = 20.0
    elif kind == "neg_inf_first_block" and n > 1:
        v[:, :_largest_block_below(n)] = NEG_INF
        v[:, _largest_block_below(n):] -= 100.0
    elif kind == "increasing":
        v = np.broadcast_to(np.linspace(-30.0, 30.0, n), (m, n)).copy()
    return _finish(draw, v, fmt, f"declared_sizes/{kind}", strided)

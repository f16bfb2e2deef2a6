"""Exact floating-point values of fp16, bf16 and fp32, and the tensor layouts they live in.

Values travel as float64 (exact for all three formats). bf16 has no Hypothesis width, so it is
built from bit patterns; zeros, subnormals, extremes, infinities and NaN are all reachable.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy, composite

from flashcheck.oracles.formats import BF16, Format, bf16_bits_to_f32, round_float64


def _bf16_from_bits(bits: int) -> float:
    return float(bf16_bits_to_f32(np.array([bits]))[0])


def exact_floats(
    fmt: Format,
    *,
    min_value: float | None = None,
    max_value: float | None = None,
    allow_nan: bool = True,
    allow_infinity: bool = True,
    allow_subnormal: bool = True,
) -> SearchStrategy[float]:
    """Any value of `fmt` (as a Python float, which holds it exactly) within the limits."""
    if fmt != BF16:
        return st.floats(min_value=min_value, max_value=max_value, allow_nan=allow_nan,
                         allow_infinity=allow_infinity, allow_subnormal=allow_subnormal,
                         width=fmt.bits)

    def ok(v: float) -> bool:
        if np.isnan(v):
            return allow_nan
        if np.isinf(v) and not allow_infinity:
            return False
        if v != 0 and abs(v) < fmt.min_normal and not allow_subnormal:
            return False
        return (min_value is None or v >= min_value) and (max_value is None or v <= max_value)

    specials = [0.0, -0.0, 1.0, -1.0, fmt.max_finite, -fmt.max_finite, fmt.min_normal, fmt.min_subnormal,
                float("inf"), float("-inf"), float("nan")]
    return st.one_of(
        st.sampled_from([v for v in specials if ok(v)]),
        st.integers(0, 0xFFFF).map(_bf16_from_bits).filter(ok),
    )


# ---- values that shrink: a cheap background plus a few exact overrides -------------------------------
#
# Long rows cannot be drawn element by element (thousands of draws per example), and values made
# from a drawn NumPy seed cannot shrink: a counterexample stays a wall of random numbers. So rows
# are a background, chosen by one integer that shrinks to 0 (a constant), and a short list of
# (index, exact value) overrides that shrinks to nothing (Hypothesis's `arrays(fill=...)` idea).
# A shrunk counterexample is then a constant row plus the handful of elements that matter.

_FEW = (-2.0, -1.0, -0.5, 0.5, 1.0, 2.0)


@composite
def backgrounds(draw, shape: tuple[int, int], *, scale: float = 1.0, loc: float = 0.0) -> np.ndarray:
    """`loc + scale * noise` of `shape`: mostly seeded N(0, 1) noise, sometimes a few values
    cycled, sometimes the constant `loc` (what it shrinks to)."""
    m, n = shape
    if m < 0 or n < 0:
        raise ValueError(f"shape must be non-negative, got {shape}")
    kind = draw(st.integers(0, 7))
    if kind == 0:
        return np.full(shape, float(loc))
    if kind == 1:
        few = np.array(draw(st.lists(st.sampled_from(_FEW), min_size=2, max_size=4)))
        return loc + scale * np.resize(few, m * n).reshape(shape)
    return loc + scale * np.random.default_rng(draw(st.integers(0, 2**32 - 1))).standard_normal(shape)


@composite
def with_overrides(draw, values: np.ndarray, elements: SearchStrategy[float], *, max_size: int = 4) -> np.ndarray:
    """A copy of `values` with up to `max_size` elements replaced by draws of `elements`."""
    if max_size < 0:
        raise ValueError(f"max_size must be >= 0, got {max_size}")
    out = np.array(values, dtype=np.float64)
    if out.size == 0 or max_size == 0:
        return out
    flat = out.reshape(-1)
    pairs = draw(st.lists(st.tuples(st.integers(0, flat.size - 1), elements), max_size=max_size,
                          unique_by=lambda t: t[0]))
    for i, v in pairs:
        flat[i] = v
    return out


def non_background(values: np.ndarray) -> int:
    """Elements that differ from their row's most common value (NaN counts as a value): how big a
    counterexample really is."""
    total = 0
    for row in np.atleast_2d(values):
        if row.size:
            _, counts = np.unique(row, return_counts=True, equal_nan=True)
            total += row.size - int(counts.max())
    return total


def representable(values: np.ndarray, fmt: Format) -> np.ndarray:
    """Round arbitrary float64 data to `fmt` so every entry is an exact value of it."""
    with np.errstate(over="ignore", invalid="ignore"):
        return round_float64(values, fmt)


# ---- layouts ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """Where an (M, N) view sits in its storage: strides, offset, and guard elements around it."""

    transposed: bool = False  # columns contiguous (a .t() view) instead of rows
    col_step: int = 1  # stride of the fast dim, >1 means a slice with a step
    row_pad: int = 0  # extra elements between consecutive slow-dim lines
    offset: int = 0  # storage offset (unaligned start); also the leading guard
    tail: int = 0  # guard elements after the view's last element

    @property
    def name(self) -> str:
        if self == Layout():
            return "contiguous"
        parts = ["T" if self.transposed else "", f"step{self.col_step}" if self.col_step > 1 else "",
                 f"pad{self.row_pad}" if self.row_pad else "", f"off{self.offset}" if self.offset else ""]
        return "-".join(p for p in parts if p) or "guarded"

    def strides(self, m: int, n: int) -> tuple[int, int]:
        fast_len = m if self.transposed else n
        slow = fast_len * self.col_step + self.row_pad
        return (self.col_step, slow) if self.transposed else (slow, self.col_step)

    def storage_size(self, m: int, n: int) -> int:
        sm, sn = self.strides(m, n)
        return self.offset + (m - 1) * sm + (n - 1) * sn + 1 + self.tail


def layouts(*, strided: bool = True) -> SearchStrategy[Layout]:
    """Contiguous first (it shrinks there), then row stride > N, column stride > 1, transposed
    views, storage offsets: every layout kernels have been seen to get wrong."""
    if not strided:
        return st.just(Layout())
    return st.builds(
        Layout,
        transposed=st.booleans(),
        col_step=st.sampled_from([1, 2, 3]),
        row_pad=st.sampled_from([0, 1, 7, 64]),
        offset=st.integers(0, 9),
        tail=st.integers(0, 8),
    )


GUARD_NAN = float("nan")


def materialize(values: np.ndarray, fmt: Format, layout: Layout, device: torch.device,
                *, guard: float = GUARD_NAN) -> torch.Tensor:
    """An (M, N) view of `values` laid out as `layout` in a storage whose other elements hold
    `guard` (NaN by default, so any read outside the view poisons the result)."""
    m, n = values.shape
    size = max(layout.storage_size(m, n), 1) if m and n else 1
    buf = torch.full((size,), guard, dtype=torch.float64).to(fmt.torch_dtype)
    view = buf.as_strided((m, n), layout.strides(m, n), layout.offset)
    view.copy_(torch.from_numpy(np.ascontiguousarray(values)).to(fmt.torch_dtype))
    out = buf.to(device).as_strided((m, n), layout.strides(m, n), layout.offset)
    return out

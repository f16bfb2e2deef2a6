"""Exact floating-point values of fp16, bf16 and fp32, and the tensor layouts they live in.

Values travel as float64 (exact for all three formats). bf16 has no Hypothesis width, so it is
built from bit patterns; zeros, subnormals, extremes, infinities and NaN are all reachable.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from hypothesis import strategies as st
from hypothesis.strategies import SearchStrategy

from flashcheck.oracles.formats import BF16, Format, round_float64


def _bf16_from_bits(bits: int) -> float:
    return float(np.array([bits << 16], dtype=np.uint32).view(np.float32)[0])


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

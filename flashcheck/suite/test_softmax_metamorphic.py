"""Metamorphic and memory properties of every registered softmax kernel (NUMERICS.md section 4):
the tests that draw cases for them. The properties themselves (shift invariance, permutation
equivariance, configs and tunings, determinism, guard bands, NaN guard data) are package code,
documented in `flashcheck.properties.softmax`."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st
from hypothesis.strategies import composite

from flashcheck.plugin.launches import Launch
from flashcheck.properties.runner import check
from flashcheck.kernels import DEVICE, INTERPRET
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.formats import BF16, FP16, Format, format_of
from flashcheck.properties.softmax import FAMILY, SENTINEL_BITS, accepts_out  # noqa: F401  (FAMILY: the suite this module is)
from flashcheck.strategies.case import Case
from flashcheck.strategies.floats import Layout, layouts, materialize
from flashcheck.strategies.softmax import declared_size_rows, row_lengths, softmax_cases
from .test_softmax import long_enough, max_n_for

# Each example calls the kernel several times: rows up to 640 on the CPU (past the dispatcher's
# row-kernel limit and past two 256-wide chunks), the core suite's lengths on a GPU.
META_MAX_N = 640 if INTERPRET else None


def meta_max_n(spec: KernelSpec) -> int:
    return max_n_for(spec, META_MAX_N) if META_MAX_N else max_n_for(spec)



# ---- strategies ------------------------------------------------------------------------------

def shift_limits(fmt: Format) -> tuple[float, int, int]:
    """(quantum q, max |k_x|, max |k_c|): x = k_x q and c = k_c q with |k_x| + |k_c| < 2^p (p the
    format's precision), so x + c is exact in the format; x - max is exact in fp32 (2 k_x < 2^24)."""
    if fmt == FP16:
        return 1.0, 1024, 1023  # fp16 integers are exact up to 2048
    if fmt == BF16:
        return 1.0, 128, 127  # bf16 integers up to 256
    return 2.0**-6, 1 << 22, (1 << 22) - 1


@composite
def shift_cases(draw, *, dtype: torch.dtype, max_n: int, strided: bool = True) -> Case:
    """Rows of multiples of q (some -inf, a NaN or +inf now and then), a shift c that keeps every
    x_i + c exact; shifts past 88 make a kernel without max subtraction overflow."""
    fmt = format_of(dtype)
    q, kx, kc = shift_limits(fmt)
    m = draw(st.integers(1, 4))
    n = draw(row_lengths(max_n=max_n))
    rng = np.random.default_rng(draw(st.integers(0, 2**32 - 1)))
    span = draw(st.sampled_from([8, 64, kx]))
    v = rng.integers(-span, span + 1, (m, n)).astype(np.float64) * q
    if draw(st.booleans()):
        v[rng.random((m, n)) < draw(st.sampled_from([0.1, 0.5, 0.99]))] = -np.inf
    special = draw(st.sampled_from([None, None, None, np.nan, np.inf]))
    if special is not None:
        v[draw(st.integers(0, m - 1)), draw(st.integers(0, n - 1))] = special
    c = draw(st.one_of(st.integers(-kc, kc), st.sampled_from([kc, -kc, 1, -1]))) * q
    x = materialize(v, fmt, draw(layouts(strided=strided)), DEVICE)
    return Case(tensors={"x": x, "shift": torch.tensor(float(c), dtype=torch.float64)},
                label=f"shift/c={c:g}")


@composite
def permuted_cases(draw, *, dtype: torch.dtype, max_n: int, strided: bool = True) -> Case:
    case = draw(softmax_cases(dtype=dtype, max_n=max_n, strided=strided))
    n = case.tensors["x"].shape[1]
    kind = draw(st.sampled_from(["random", "reverse", "rotate"]))
    if kind == "random":
        perm = np.random.default_rng(draw(st.integers(0, 2**32 - 1))).permutation(n)
    elif kind == "reverse":
        perm = np.arange(n)[::-1].copy()
    else:
        perm = np.roll(np.arange(n), draw(st.integers(0, max(0, n - 1))))
    case.tensors["perm"] = torch.from_numpy(perm.astype(np.int64))
    case.label += f"/perm-{kind}"
    return case


def out_layouts() -> st.SearchStrategy[Layout]:
    """Output views that are never the plain contiguous tensor: a guard on some side always."""
    return st.builds(Layout, transposed=st.booleans(), col_step=st.sampled_from([1, 2, 3]),
                     row_pad=st.sampled_from([0, 1, 7, 64]), offset=st.integers(1, 9), tail=st.integers(1, 8))


def _sentinel_view(shape: tuple[int, int], dtype: torch.dtype, layout: Layout) -> torch.Tensor:
    m, n = shape
    size = max(layout.storage_size(m, n), 1) if m and n else 1
    words = torch.full((size,), SENTINEL_BITS[dtype], dtype=torch.int32 if dtype == torch.float32 else torch.int16)
    buf = words.view(dtype).to(DEVICE)
    return buf.as_strided((m, n), layout.strides(m, n), layout.offset)


@composite
def out_view_cases(draw, *, dtype: torch.dtype, max_n: int, strided: bool = True) -> Case:
    case = draw(softmax_cases(dtype=dtype, max_n=max_n, strided=strided))
    x = case.tensors["x"]
    layout = draw(out_layouts())
    case.tensors["out"] = _sentinel_view(tuple(x.shape), x.dtype, layout)
    case.label += f"/out-{layout.name}"
    return case


# ---- tests -----------------------------------------------------------------------------------

@given(data=st.data())
def test_shift_invariance(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    case = data.draw(shift_cases(dtype=dtype, max_n=meta_max_n(spec), strided=not spec.contiguous_only), label="case")
    check(spec, "shift_invariant", long_enough(spec, case))


@given(data=st.data())
def test_permutation_equivariance(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    case = data.draw(permuted_cases(dtype=dtype, max_n=meta_max_n(spec), strided=not spec.contiguous_only), label="case")
    check(spec, "permutation_equivariant", long_enough(spec, case))


# One item per launch variant (flashcheck.plugin.launches), so their compilations spread over xdist's workers.
@given(data=st.data())
def test_configs_and_determinism(spec: KernelSpec, dtype: torch.dtype, launch: Launch, data: st.DataObject) -> None:
    # Launch knobs (tiles, chunk sizes) only matter on rows that span several tiles: the first
    # (simplest) draws are rows at the run's longest length, the rest any adversarial case.
    fmt, max_n, strided = format_of(dtype), meta_max_n(spec), not spec.contiguous_only
    long_rows = declared_size_rows(dtype=dtype, sizes=(max_n,), min_n=spec.min_n, max_n=max_n, strided=strided)
    case = data.draw(st.one_of(long_rows, softmax_cases(dtype=dtype, max_n=max_n, strided=strided)), label="case")
    check(launch.spec_for(spec), launch.relation, long_enough(spec, case))


@given(data=st.data())
def test_guard_bands(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    if not accepts_out(spec):
        pytest.skip(f"{spec.name} takes no out= argument (an external kernel declares it by accepting "
                    f"`out` or **kwargs), so there is no output view to guard")
    case = data.draw(out_view_cases(dtype=dtype, max_n=meta_max_n(spec), strided=not spec.contiguous_only), label="case")
    check(spec, "guard_bands", long_enough(spec, case))


@given(data=st.data())
def test_nan_guard_invisible(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    case = data.draw(softmax_cases(dtype=dtype, max_n=meta_max_n(spec), strided=not spec.contiguous_only), label="case")
    check(spec, "nan_guard_invisible", long_enough(spec, case))

"""Property tests for every registered softmax-family kernel, for every dtype it supports.

Each adversarial class of NUMERICS.md section 4 gets its own Hypothesis test; every example is
checked against the certified oracle within the kernel's derived bound and for the structural
properties (sums to one, range, order, input untouched). One kernel call serves all of them.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, strategies as st

from flashcheck.targets.external import declared_as
from flashcheck.fixtures.store import MAX_VIEW_BYTES
from flashcheck.properties.runner import check_all
from flashcheck.strategies.case import Case
from flashcheck.properties.fit import fitted
from flashcheck.kernels import DEVICE, INTERPRET
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.formats import format_of
from flashcheck.properties.softmax import CORE_PROPERTIES, FAMILY, fit_to_declarations  # noqa: F401  (FAMILY: the suite this module is)
from flashcheck.strategies.softmax import CLASSES, declared_size_rows

# Longest rows drawn: the interpreter runs kernels in NumPy, the GPU in microseconds.
MAX_N = 2048 if INTERPRET else 1 << 17


# ---- tests ---------------------------------------------------------------------------------

def max_n_for(spec: KernelSpec, cap: int = MAX_N) -> int:
    """The longest row a test drawing up to `cap` gives `spec`; the test is skipped, naming the
    declaration, when the kernel's declared shortest row is longer (nothing to draw)."""
    max_n = min(cap, spec.max_n or cap)
    if spec.min_n > max_n:
        pytest.skip(f"nothing to check: {declared_as(spec, 'min_n')} is above the longest row this test draws "
                    f"({max_n}{' under the interpreter' if INTERPRET else ''})")
    return max_n


def long_enough(spec: KernelSpec, case: Case) -> Case:
    """The case, if its rows are as long as the kernel declares it needs (else Hypothesis rejects
    it, and a test that draws nothing the kernel takes is skipped saying so: flashcheck.properties.fit)."""
    return fitted(spec, case, fit_to_declarations)


@pytest.mark.parametrize("cls", sorted(CLASSES))
@given(data=st.data())
def test_adversarial_class(spec: KernelSpec, dtype: torch.dtype, cls: str, data: st.DataObject) -> None:
    strategy = CLASSES[cls]
    strided = not spec.contiguous_only
    case = data.draw(strategy(dtype=dtype, max_n=max_n_for(spec, 24), strided=strided) if cls == "elementwise"
                     else strategy(dtype=dtype, max_n=max_n_for(spec), strided=strided), label="case")
    check_all(spec, CORE_PROPERTIES, long_enough(spec, case))


# The declared sizes are drawn even past the run's usual cap (the interpreter's 2048), up to this.
SIZES_CAP = 1 << 16 if INTERPRET else 1 << 22


@given(data=st.data())
def test_declared_sizes(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    """Lengths just below, at and above the sizes the kernel declares (tiles, thresholds)."""
    if not spec.sizes:
        pytest.skip(f"{spec.name} declares no sizes that matter to it (capability sizes)")
    max_n = max_n_for(spec, SIZES_CAP)
    if not any(spec.min_n <= v <= max_n for s in spec.sizes for v in (s - 1, s, s + 1)):
        pytest.skip(f"nothing to check: no length next to the declared {declared_as(spec, 'sizes')} lies in "
                    f"[{spec.min_n}, {max_n}]")
    case = data.draw(declared_size_rows(dtype=dtype, sizes=spec.sizes, min_n=spec.min_n, max_n=max_n,
                                        strided=not spec.contiguous_only), label="case")
    check_all(spec, CORE_PROPERTIES, case)


SPECIAL_ROWS = {
    # NUMERICS.md section 2, row by row.
    "some_neg_inf": [1.0, float("-inf"), 2.0, float("-inf")],
    "all_neg_inf": [float("-inf")] * 5,
    "one_nan": [1.0, float("nan"), 2.0],
    "nan_and_neg_inf": [float("-inf"), float("nan"), float("-inf")],
    "pos_inf": [1.0, float("inf"), 2.0],
    "pos_and_neg_inf": [float("-inf"), float("inf")],
    "n_is_one": [3.0],
    "n_is_one_huge": [-60000.0],
    "two_equal": [7.0, 7.0],
}


@pytest.mark.parametrize("row", sorted(SPECIAL_ROWS))
def test_special_values(spec: KernelSpec, dtype: torch.dtype, row: str) -> None:
    values = np.array([SPECIAL_ROWS[row]] * 3)
    values[1] = np.linspace(-1, 1, values.shape[1])  # a clean row between: must stay clean
    n = values.shape[1]
    if not spec.supports(dtype, n):
        pytest.skip(f"nothing to check: rows of {n} are outside {declared_as(spec, 'min_n')}, "
                    f"{declared_as(spec, 'max_n')}")
    x = torch.from_numpy(values).to(dtype).to(DEVICE)
    case = Case(tensors={"x": x}, label=f"special/{row}")
    check_all(spec, CORE_PROPERTIES, case)


def _bad_inputs() -> dict[str, tuple[type[Exception], torch.Tensor]]:
    return {
        "int_dtype": (TypeError, torch.ones(2, 3, dtype=torch.int32, device=DEVICE)),
        "float64": (TypeError, torch.ones(2, 3, dtype=torch.float64, device=DEVICE)),
        "rank_1": (ValueError, torch.ones(3, device=DEVICE)),
        "rank_3": (ValueError, torch.ones(2, 3, 4, device=DEVICE)),
        "wrong_device": (ValueError, torch.ones(2, 3, device="meta")),
    }


def _expected(spec: KernelSpec, exc: type[Exception]) -> type[Exception]:
    """The exception a kernel promises: its documented type ("typed"), or any exception."""
    if not spec.validates_input:
        pytest.skip(f"{spec.name} does not declare input validation (capability validates_input)")
    return exc if spec.validates_input == "typed" else Exception


@pytest.mark.parametrize("problem", sorted(_bad_inputs()))
def test_bad_input_raises(spec: KernelSpec, problem: str) -> None:
    exc, x = _bad_inputs()[problem]
    with pytest.raises(_expected(spec, exc)):
        spec.fn(x)


def test_row_too_long_raises(spec: KernelSpec) -> None:
    if spec.max_n is None:
        pytest.skip(f"{spec.name} takes rows of any length")
    if (spec.max_n + 1) * 4 > MAX_VIEW_BYTES:  # a declared max_n of 2^40 once allocated its row here
        pytest.skip(f"a row past {declared_as(spec, 'max_n')} is over {MAX_VIEW_BYTES >> 20} MiB: not allocated "
                    "to check that it is refused")
    exc = _expected(spec, ValueError)
    x = torch.zeros(1, spec.max_n + 1, device=DEVICE)
    with pytest.raises(exc, match="N=" if exc is ValueError else None):
        spec.fn(x)

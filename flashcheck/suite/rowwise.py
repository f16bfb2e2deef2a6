"""The tests the row-wise training families' suites share (softmax backward, log-softmax, log-softmax
backward): each suite module binds them to its family (`row_tests`), so pytest collects them there,
parametrized over the family's kernels and dtypes (the module's FAMILY), with the seeds of that module's
own test ids (flashcheck.suite.seed_key)."""
from __future__ import annotations

from types import ModuleType
from typing import Any, Callable

import pytest
import torch
from hypothesis import given, strategies as st

from flashcheck.kernels import DEVICE, INTERPRET
from flashcheck.kernels.registry import KernelSpec
from flashcheck.plugin.profiles import share_of_examples
from flashcheck.properties.fit import fitted
from flashcheck.properties.rowwise import bad_inputs
from flashcheck.properties.runner import check_all
from .test_softmax import _expected, max_n_for

# The oracles are certified per element and the interpreter runs kernels in NumPy: rows up to 96 on
# the CPU (past a 64-wide tile, odd lengths and powers of two around it), the softmax suite's on a GPU.
MAX_N = 96 if INTERPRET else 1 << 14
# Half the tier's examples per test (6 to 12 classes x 3 dtypes each: the ci tier's CPU budget).
EXAMPLES = share_of_examples(0.5)


def draw_case(classes: dict[str, Callable[..., Any]], cls: str, spec: KernelSpec, dtype: torch.dtype,
              data: st.DataObject, max_n: int = MAX_N) -> Any:
    strided = not spec.contiguous_only
    if cls == "elementwise":  # the softmax table's element-by-element class: short rows by design
        return data.draw(classes[cls](dtype=dtype, strided=strided), label="case")
    return data.draw(classes[cls](dtype=dtype, max_n=max_n_for(spec, max_n), strided=strided), label="case")


def row_tests(props: ModuleType, classes: dict[str, Callable[..., Any]],
              meta_cases: Callable[..., Any] | None = None) -> tuple[Callable, ...]:
    """(test_adversarial_class, test_metamorphic, test_bad_input_raises) for the family of `props`
    (its CORE_PROPERTIES per class, its META_PROPERTIES on the union of the classes or on
    `meta_cases(dtype=, max_n=, strided=)`, its INPUTS)."""

    @pytest.mark.parametrize("cls", sorted(classes))
    @EXAMPLES
    @given(data=st.data())
    def test_adversarial_class(spec: KernelSpec, dtype: torch.dtype, cls: str, data: st.DataObject) -> None:
        case = draw_case(classes, cls, spec, dtype, data)
        check_all(spec, props.CORE_PROPERTIES, fitted(spec, case, props.fit_to_declarations))

    @EXAMPLES
    @given(data=st.data())
    def test_metamorphic(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
        if meta_cases is not None:
            case = data.draw(meta_cases(dtype=dtype, max_n=max_n_for(spec, MAX_N), strided=not spec.contiguous_only),
                             label="case")
        else:
            case = draw_case(classes, data.draw(st.sampled_from(list(classes)), label="class"), spec, dtype, data)
        check_all(spec, props.META_PROPERTIES, fitted(spec, case, props.fit_to_declarations))

    @pytest.mark.parametrize("problem", sorted(bad_inputs(props.INPUTS, DEVICE)))
    def test_bad_input_raises(spec: KernelSpec, problem: str) -> None:
        exc, args = bad_inputs(props.INPUTS, DEVICE)[problem]
        with pytest.raises(_expected(spec, exc)):
            spec.fn(*args)

    return test_adversarial_class, test_metamorphic, test_bad_input_raises

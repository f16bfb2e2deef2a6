"""Property tests for every registered cross-entropy kernel and every dtype it supports: each
adversarial class of docs/NUMERICS.md 9.5 (the classes whose features the kernel declares) against
the certified loss and gradient oracles within the derived bounds, the gradient's row sums, a
non-negative loss and untouched inputs (`CORE_PROPERTIES`: one plain and one gradient call serve
them); shift invariance on exactly shiftable logits; the reductions, log-softmax, NaN guard and
in-place relations on the union of the classes; the special rows of NUMERICS.md 9.2; bad inputs."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st
from hypothesis.strategies import composite

from flashcheck.kernels import DEVICE, INTERPRET
from flashcheck.kernels.registry import KernelSpec
from flashcheck.plugin.profiles import share_of_examples
from flashcheck.properties.cross_entropy import (  # noqa: F401  (FAMILY: the suite this module is)
    CORE_PROPERTIES, FAMILY, UNION_PROPERTIES, bad_inputs, fit_to_declarations,
)
from flashcheck.properties.fit import fitted
from flashcheck.properties.runner import check, check_all
from flashcheck.strategies.case import Case
from flashcheck.strategies.cross_entropy import CE_CLASS_FEATURES, CLASSES, IGNORE_INDEX, REDUCTIONS, cross_entropy_cases, labels
from .test_softmax import _expected, max_n_for
from .test_softmax_metamorphic import shift_cases

# Vocabularies up to 160 on the CPU: past the interpreter's 128-wide chunk of our kernel (the
# long_vocab class lives at 80-160), short enough for the certified gradient oracle (about 1 ms an
# element); real vocabulary sizes on a GPU.
MAX_N = 160 if INTERPRET else 1 << 16
# A third of the tier's examples per test: 13 classes x 3 dtypes, each example a certified loss and
# gradient and two kernel calls (the ci tier's CPU budget, docs/NUMERICS.md 9.7).
EXAMPLES = share_of_examples(1 / 3)


def _declared(spec: KernelSpec, cls: str) -> None:
    lacking = sorted(f for f in CE_CLASS_FEATURES.get(cls, ()) if not spec.has(f))
    if lacking:
        pytest.skip(f"{spec.name} does not declare {', '.join(lacking)}: the class {cls} is not drawn")


@pytest.mark.parametrize("cls", sorted(CLASSES))
@EXAMPLES
@given(data=st.data())
def test_adversarial_class(spec: KernelSpec, dtype: torch.dtype, cls: str, data: st.DataObject) -> None:
    _declared(spec, cls)
    case = data.draw(CLASSES[cls](dtype=dtype, max_n=max_n_for(spec, MAX_N), strided=not spec.contiguous_only),
                     label="case")
    check_all(spec, CORE_PROPERTIES, fitted(spec, case, fit_to_declarations))


@composite
def shift_ce_cases(draw, *, dtype: torch.dtype, max_n: int, strided: bool = True) -> Case:
    """Logits of exact multiples with a shift keeping every x + c exact (the softmax suite's
    shift_cases), random targets, any reduction; shifts past 88 overflow an exp without the max."""
    case = draw(shift_cases(dtype=dtype, max_n=max_n, strided=strided))
    x = case.tensors["x"]
    targets = draw(st.lists(st.integers(0, x.shape[1] - 1), min_size=x.shape[0], max_size=x.shape[0]))
    return Case(tensors={"logits": x, "target": labels(targets, guard=IGNORE_INDEX), "shift": case.tensors["shift"]},
                kwargs={"ignore_index": IGNORE_INDEX, "label_smoothing": 0.0,
                        "reduction": draw(st.sampled_from(REDUCTIONS))}, label=case.label)


@EXAMPLES
@given(data=st.data())
def test_shift_invariance(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    case = data.draw(shift_ce_cases(dtype=dtype, max_n=max_n_for(spec, MAX_N), strided=not spec.contiguous_only),
                     label="case")
    check(spec, "shift_invariant", fitted(spec, case, fit_to_declarations))


@EXAMPLES
@given(data=st.data())
def test_relations(spec: KernelSpec, dtype: torch.dtype, data: st.DataObject) -> None:
    case = data.draw(cross_entropy_cases(dtype=dtype, max_n=max_n_for(spec, MAX_N), strided=not spec.contiguous_only,
                                         features=spec.features()), label="case")
    check_all(spec, UNION_PROPERTIES, fitted(spec, case, fit_to_declarations))


NEG_INF, NAN = float("-inf"), float("nan")
SPECIAL = {
    # NUMERICS.md 9.2, row by row: (logits, targets, options)
    "all_ignored_mean": ([[1.0, 2.0, 3.0], [0.5, NAN, 1.0]], [IGNORE_INDEX, IGNORE_INDEX], {}),
    "target_neg_inf": ([[NEG_INF, 1.0, 2.0], [0.0, 1.0, 2.0]], [0, 2], {"reduction": "none"}),
    "row_all_neg_inf": ([[NEG_INF] * 3, [0.0, 1.0, 2.0]], [1, 0], {"reduction": "none"}),
    "row_nan": ([[1.0, NAN, 2.0], [0.0, 1.0, 2.0]], [0, 1], {"reduction": "sum"}),
    "single_class": ([[3.0], [-2.0]], [0, 0], {}),
    "target_weight_zero": ([[1.0, 2.0], [3.0, 0.5]], [1, 1], {"weight": [1.0, 0.0]}),
    "smoothing_neg_inf": ([[NEG_INF, 1.0, 2.0], [0.0, 1.0, 2.0]], [1, 2], {"label_smoothing": 0.1,
                                                                          "reduction": "none"}),
    "grad_output_zero": ([[1.0, 2.0, 3.0], [0.0, 1.0, 2.0]], [0, 1], {"reduction": "none", "grad_output": [0.0, 2.0]}),
}


@pytest.mark.parametrize("name", sorted(SPECIAL))
def test_special_rows(spec: KernelSpec, dtype: torch.dtype, name: str) -> None:
    values, targets, extra = SPECIAL[name]
    extra = dict(extra)
    tensors = {"logits": torch.tensor(values, dtype=dtype, device=DEVICE), "target": labels(targets, guard=IGNORE_INDEX)}
    for key in ("weight", "grad_output"):
        if key in extra:
            tensors[key] = torch.tensor(extra.pop(key), dtype=dtype, device=DEVICE)
    case = Case(tensors=tensors, kwargs={"ignore_index": IGNORE_INDEX, "label_smoothing": 0.0, "reduction": "mean",
                                         **extra}, label=f"special/{name}")
    fit = fit_to_declarations(spec, case)
    if fit is None:
        pytest.skip(f"nothing to check: {spec.name} does not declare what special/{name} needs ({case!r})")
    check_all(spec, CORE_PROPERTIES + ("mean_is_sum_over_weights",), fit)


@pytest.mark.parametrize("problem", sorted(bad_inputs(DEVICE)))
def test_bad_input_raises(spec: KernelSpec, problem: str) -> None:
    exc, args, kwargs = bad_inputs(DEVICE)[problem]
    with pytest.raises(_expected(spec, exc)):
        spec.fn(*args, **kwargs)

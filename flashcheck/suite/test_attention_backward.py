"""The attention backward (NUMERICS.md section 10) for every registered attention kernel that has one,
for every dtype it supports: dq, dk, dv on each adversarial backward class (strategies/attention_backward.py)
against the certified oracle within the derived bound, and the kernel's backward against itself.

A forward-only kernel (no autograd graph on its output, no declared backward_fn) is skipped with one
line saying so (flashcheck.properties.attention.backward). The properties live there; this module
only parametrizes and drives them.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, strategies as st

from flashcheck.kernels import INTERPRET
from flashcheck.kernels.registry import KernelSpec
from flashcheck.plugin.profiles import share_of_examples
from flashcheck.properties.attention import fit_to_declarations
from flashcheck.properties.attention.backward import BACKWARD_PROPERTIES
from flashcheck.properties.fit import fitted
from flashcheck.properties.runner import check, check_all
from flashcheck.strategies.attention import Caps, Shapes
from flashcheck.strategies.attention_backward import (
    BACKWARD_CLASS_FEATURES, BACKWARD_CLASSES, attention_backward_cases, backward_class_strategy, backward_classes_for,
)
from flashcheck.strategies.case import Case

FAMILY = "attention"
ORACLE_PROPERTIES = ("backward_contract", "backward_matches_oracle")
SELF_PROPERTIES = tuple(p for p in BACKWARD_PROPERTIES if p not in ORACLE_PROPERTIES)
# The relations run the backward two or three times: the CPU's shapes stay small.
SELF_LIMITS = dict(max_m=24, max_n=24, max_head_dim=16) if INTERPRET else {}
# Under the interpreter a backward costs three kernels' emulation and a forward's: a quarter of the
# profile's examples per test (ci: 3 of 12, over 16 classes and 3 dtypes), which kept this file
# 54 s on one shared CPU core (198 s at 12); a GPU runs the profile's examples in full.
_examples = share_of_examples(1 / 4) if INTERPRET else (lambda test: test)


def _fit(spec: KernelSpec, case: Case) -> Case:
    """The case as the kernel's declarations allow, or rejected: a fitted case whose shapes changed
    no longer matches its drawn dO."""
    def keep_do(spec: KernelSpec, c: Case) -> Case | None:
        out = fit_to_declarations(spec, c)
        if out is None or any(out.tensors[n].shape != c.tensors[n].shape for n in ("q", "k", "v")):
            return None
        return out

    return fitted(spec, case, keep_do, hint="backward draws follow the kernel's declared features")


def _skip_unavailable(spec: KernelSpec, cls: str) -> None:
    lacking = sorted(f for f in BACKWARD_CLASS_FEATURES.get(cls, ()) if not spec.has(f))
    if lacking:
        pytest.skip(f"{spec.name} does not declare {lacking}")
    if cls not in backward_classes_for(Caps.of(spec)):
        pytest.skip(f"backward class {cls} is GPU only")


@pytest.mark.parametrize("cls", sorted(BACKWARD_CLASSES))
@_examples
@given(data=st.data())
def test_backward_class(spec: KernelSpec, dtype: torch.dtype, cls: str, data: st.DataObject) -> None:
    _skip_unavailable(spec, cls)
    case = _fit(spec, data.draw(backward_class_strategy(cls, dtype=dtype, caps=Caps.of(spec), shapes=Shapes.of(spec)),
                                label="case"))
    check_all(spec, ORACLE_PROPERTIES, case)


@pytest.mark.parametrize("relation", SELF_PROPERTIES)
@_examples
@given(data=st.data())
def test_backward_relations(spec: KernelSpec, dtype: torch.dtype, relation: str, data: st.DataObject) -> None:
    case = _fit(spec, data.draw(attention_backward_cases(dtype=dtype, caps=Caps.of(spec), shapes=Shapes.of(spec),
                                                         **SELF_LIMITS), label="case"))
    check(spec, relation, case)

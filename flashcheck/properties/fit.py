"""Fitting drawn cases to what the kernel under test declares, the same way in every family's suite.

A family's properties module defines `fit_to_declarations(spec, case) -> Case | None`: the case as
the kernel's declarations allow it, or None when it needs something the kernel does not declare
(a declared-unsupported call is never made). A suite test passes each draw through `fitted`: a
case that does not fit is rejected (`hypothesis.assume`), and a test that has rejected GIVE_UP
draws in a row with nothing kept is skipped naming the declarations, never failed. That is before
Hypothesis's own give-up point, which would end the test `Unsatisfiable` (and, for a kernel under
test, the plugin's `checked` tally would turn that into the same skip, after many more draws).

The per-test counts live here, keyed by the running test (PYTEST_CURRENT_TEST), so no suite module
keeps state of its own.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Callable, Optional

import pytest

if TYPE_CHECKING:  # kept light: the plugin's `checked` tally imports this module at pytest start
    from flashcheck.strategies.case import Case

# Rejections in a row, with nothing kept, after which a test stops drawing.
GIVE_UP = 150
# Per running test: [cases kept, cases rejected by the kernel's declarations].
_COUNTS: dict[str, list[int]] = {}

Fit = Callable[[Any, "Case"], Optional["Case"]]


def nothing_to_draw(spec: Any) -> str:
    """Why a test of `spec` drew nothing: the declarations that narrowed it."""
    from flashcheck.targets.external import narrowing

    named = narrowing(spec)
    what = ", ".join(named) if named else "its declared limits"
    return f"nothing to check: {spec.name}'s declarations ({what}) exclude every input this test draws"


def fitted(spec: Any, case: Case, fit: Fit, *, hint: str = "") -> Case:
    """`fit(spec, case)`, the family's fit_to_declarations; a case it rejects is rejected from the
    Hypothesis test, and after GIVE_UP rejections with nothing kept the test is skipped saying so
    (`hint`: what the draws aim at, added to the message)."""
    from hypothesis import assume

    out = fit(spec, case)
    counts = _COUNTS.setdefault(os.environ.get("PYTEST_CURRENT_TEST", ""), [0, 0])
    if out is None:
        counts[1] += 1
        if counts[0] == 0 and counts[1] >= GIVE_UP:
            pytest.skip(f"{nothing_to_draw(spec)} ({counts[1]} tries{'; ' + hint if hint else ''})")
        assume(False)
    counts[0] += 1
    return out

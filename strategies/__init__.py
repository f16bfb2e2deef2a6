"""Hypothesis strategies producing adversarial inputs, one named strategy per class.

`register_class` adds a kernel author's own class to a family without editing flashcheck: the
family's property tests, reachability checks and the stability report iterate the same table.
"""
from __future__ import annotations

from typing import Callable

from hypothesis.strategies import SearchStrategy

from .attention import CLASSES as ATTENTION_CLASSES, attention_cases, case_inputs
from .case import Case
from .floats import Layout, exact_floats, layouts, materialize, representable
from .softmax import CLASSES as SOFTMAX_CLASSES, row_lengths, softmax_cases

from .cross_entropy import CE_CLASSES, LOG_SOFTMAX_BACKWARD_CLASSES, SOFTMAX_BACKWARD_CLASSES  # noqa: E402

# log_softmax draws the softmax table itself: a class registered for one is the other's too.
_TABLES = {"softmax": SOFTMAX_CLASSES, "attention": ATTENTION_CLASSES, "softmax_backward": SOFTMAX_BACKWARD_CLASSES,
           "log_softmax": SOFTMAX_CLASSES, "log_softmax_backward": LOG_SOFTMAX_BACKWARD_CLASSES,
           "cross_entropy": CE_CLASSES}


def register_class(family: str, name: str, factory: Callable[..., SearchStrategy[Case]], *,
                   replace: bool = False) -> Callable[..., SearchStrategy[Case]]:
    """Add an adversarial class to a family's table (usable as a decorator via functools.partial).

    Every family's classes take the same first keyword, the dtype: softmax `factory(*, dtype, max_n,
    strided) -> SearchStrategy[Case]` whose cases hold `x` (M, N); attention `factory(*, dtype,
    **limits)` like the built-in classes; the training families' as theirs (strategies/cross_entropy.py:
    "y"/"logp" and "dy"; "logits", "target" and the options as kwargs). A softmax factory written for the older `fmt=` keyword (a
    `Format`) is adapted.
    Register before pytest collects (in the kernel's module, or a conftest): the class then runs
    for every kernel of the family and appears in the report.
    """
    if family not in _TABLES:
        raise ValueError(f"register_class: family {family!r} is not one of {', '.join(_TABLES)}")
    if not name or not name.replace("_", "").isalnum():
        raise ValueError(f"register_class: class name {name!r} must be letters, digits and underscores")
    if not callable(factory):
        raise TypeError(f"register_class: factory for {name!r} is {type(factory).__name__}, not callable")
    factory = _dtype_keyword(factory)
    table = _TABLES[family]
    old = table.get(name)
    # The same function again (a kernel module executed twice, e.g. by `flashcheck check` and
    # then by pytest) is no clash.
    same = old is not None and (old is factory or (getattr(old, "__module__", None), getattr(old, "__qualname__", None))
                                == (getattr(factory, "__module__", None), getattr(factory, "__qualname__", None)))
    if old is not None and not same and not replace:
        raise ValueError(f"register_class: {family} class {name!r} exists (replace=True to override)")
    table[name] = factory
    return factory


def _dtype_keyword(factory: Callable[..., SearchStrategy[Case]]) -> Callable[..., SearchStrategy[Case]]:
    """`factory` called with `dtype=`: one taking `fmt` (and no dtype) gets the dtype's Format."""
    import functools
    import inspect

    from flashcheck.oracles.formats import format_of

    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):
        return factory
    if "fmt" not in params or "dtype" in params:
        return factory

    @functools.wraps(factory)
    def adapted(*, dtype, **kw):
        return factory(fmt=format_of(dtype), **kw)

    return adapted


__all__ = ["ATTENTION_CLASSES", "attention_cases", "case_inputs", "Case", "Layout", "exact_floats", "layouts",
           "materialize", "register_class", "representable", "SOFTMAX_CLASSES", "row_lengths", "softmax_cases"]

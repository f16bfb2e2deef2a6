"""Strategy classes as records: one row per adversarial class of a family, holding every fact the
engine, the suites and the reachability self-tests need about it, instead of parallel tables.

`StrategyClass`: a class's name, its Hypothesis strategy, the kernel features it draws (a kernel
lacking one is never given it), whether it takes the kernel's capabilities, whether it joins the
union the metamorphic tests draw from, and whether its point is a shape a square, power-of-two-head
kernel never takes (its draws are not expected to aim at declared shapes).

`Feature`: an input property a class's draws must reach (NUMERICS.md section 4): the reachability
tests (tests/test_strategies.py, the suite's test_strategy_reaches_its_class) read these tables.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

from flashcheck.oracles.formats import FLOAT_NAMES

from .case import Case


@dataclass(frozen=True)
class StrategyClass:
    name: str
    strategy: Callable[..., Any]
    needs: frozenset[str] = frozenset()  # kernel features (KernelSpec.has) the class draws
    caps_aware: bool = False  # takes `caps=` (the kernel's capabilities)
    in_union: bool = True  # drawn by the family's any-class union (metamorphic tests)
    shape_by_design: bool = False  # its point is a shape a square, pow2-head-dim kernel never takes


@dataclass(frozen=True)
class Feature:
    cls: str | None  # the class that must draw it (None: any class of the kernel and dtype)
    name: str
    pred: Callable[[Case, Any], bool]  # (case, its oracles.formats.Format) -> reached
    dtypes: tuple[str, ...] = FLOAT_NAMES
    needs_n: int = 1  # only required when the test draws rows this long


def by_name(records: Iterable[StrategyClass]) -> dict[str, Callable[..., Any]]:
    """{name: strategy} in the records' order (the order a union draws in: keep it stable)."""
    return {r.name: r.strategy for r in records}


def pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0

"""Deterministic draws from a strategy outside a test, for reports and benchmarks."""
from __future__ import annotations

from typing import TypeVar

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.strategies import SearchStrategy

T = TypeVar("T")


def draw_examples(strategy: SearchStrategy[T], n: int) -> list[T]:
    """`n` examples, the same on every run (derandomized, generation phase only, no database)."""
    out: list[T] = []

    @settings(max_examples=n, derandomize=True, database=None, deadline=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(example: T) -> None:
        out.append(example)

    collect()
    return out

"""How much this process checked: distinct cases run through the properties (the runner counts,
the refusal and "checked nothing" reports read)."""
from __future__ import annotations

from typing import Any

#: Distinct cases checked in this process ([count, the last case]): how much a test checked.
EXAMPLES: list[Any] = [0, None]


def _count_example(case: Any) -> None:
    if EXAMPLES[1] is not case:  # several properties of one case are one example
        EXAMPLES[0] += 1
        EXAMPLES[1] = case


#: One-line notes for the end of the run (a kernel's gradient not checked), each once, in order.
NOTES: list[str] = []


def note(line: str) -> None:
    if line not in NOTES:
        NOTES.append(line)

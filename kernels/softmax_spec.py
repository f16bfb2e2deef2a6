"""The softmax family's spec type: what a softmax kernel declares beyond every family's fields."""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable

from .registry import KernelSpec, family_spec


@family_spec("softmax")
@dataclass(frozen=True, repr=False)
class SoftmaxSpec(KernelSpec):
    """fn(x) -> y: x 2-D, y its softmax over the last dim, same dtype.

    depth(n): the summation depth this kernel's reduction has for a row of n, fed to the bound
        (`oracles.bounds`); None: the worst case, recursive summation.
    takes_out: it accepts out= (None: decided from fn's signature).
    shift_exact: exact shifts of a row give identical bits.
    """

    depth: Callable[[int], int] | None = None
    takes_out: bool | None = None
    shift_exact: bool = True

    def summation_depth(self, n: int, **launch: Any) -> int:
        """Depth of the sum's rounding chain for a row of n (n, recursive summation, if unknown),
        at the default launch or at `launch` (one of `tunings`: chunk sizes change the depth)."""
        if self.depth is None:
            return n
        return self.depth(n, **launch) if launch and _takes(self.depth, launch) else self.depth(n)


def _takes(fn: Callable, kwargs: dict[str, Any]) -> bool:
    """Whether fn accepts these keywords (an author's depth callable may take n alone)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return any(p.kind == p.VAR_KEYWORD for p in params) or set(kwargs) <= names

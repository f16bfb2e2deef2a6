"""Spec types of the row-wise training families (softmax backward, log-softmax, log-softmax
backward): what such a kernel declares beyond every family's fields."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .registry import KernelSpec, family_spec
from .softmax_spec import _takes


@dataclass(frozen=True, repr=False)
class RowSpec(KernelSpec):
    """fn(a[, b]) -> out: 2-D inputs, rows over the last dim, out their shape and dtype.

    depth(n): the summation depth of its row sum for a row of n, fed to the bound
        (`oracles.log_softmax_bound`); None: the worst case, recursive summation.
    """

    depth: Callable[[int], int] | None = None

    def summation_depth(self, n: int, **launch: Any) -> int:
        """Depth of the row sum's rounding chain for a row of n (n if unknown), at the default launch
        or at `launch` (one of `tunings`)."""
        if self.depth is None:
            return n
        return self.depth(n, **launch) if launch and _takes(self.depth, launch) else self.depth(n)


@family_spec("softmax_backward")
@dataclass(frozen=True, repr=False)
class SoftmaxBackwardSpec(RowSpec):
    """fn(y, dy) -> dx = y (dy - sum_j y_j dy_j), y the forward's output."""


@family_spec("log_softmax")
@dataclass(frozen=True, repr=False)
class LogSoftmaxSpec(RowSpec):
    """fn(x) -> log_softmax(x) over the last dim. shift_exact: exact shifts of a row give identical bits."""

    shift_exact: bool = True


@family_spec("log_softmax_backward")
@dataclass(frozen=True, repr=False)
class LogSoftmaxBackwardSpec(RowSpec):
    """fn(logp, dy) -> dx = dy - exp(logp) sum_j dy_j, logp the forward's output."""

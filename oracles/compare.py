"""Kernel output against the oracle: ULP distances, the derived bound, flushes, violations.

Shared by the property tests and the stability report so both judge a kernel the same way."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .bounds import ftz_allowed, softmax_ulp_bound
from .formats import Format, ulp_distance


@dataclass(frozen=True)
class Comparison:
    oracle: np.ndarray  # correctly rounded exact result
    dist: np.ndarray  # ULP distance of the kernel's output from it (inf for a NaN mismatch)
    bound: np.ndarray  # allowed ULP distance
    ftz: np.ndarray  # flushed to zero where that is allowed

    @property
    def violations(self) -> np.ndarray:
        return (self.dist > self.bound) & ~self.ftz

    def bound_ratio(self) -> np.ndarray:
        """Measured error over its bound, per element (0/0 counts as 0; flushes excluded)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            r = np.where(self.dist == 0, 0.0, self.dist / self.bound)
        return np.where(self.ftz, 0.0, r)


def compare_softmax(x: np.ndarray, y: np.ndarray, fmt: Format, *, depth: int,
                    oracle: np.ndarray | None = None) -> Comparison:
    from .softmax import softmax_oracle

    r = softmax_oracle(x, fmt) if oracle is None else oracle
    return Comparison(r, ulp_distance(y, r, fmt), softmax_ulp_bound(x, r, fmt, depth=depth), ftz_allowed(y, r))

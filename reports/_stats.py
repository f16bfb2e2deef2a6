"""Summaries of Comparison objects shared by the family report modules."""
from __future__ import annotations

from typing import Any

import numpy as np

from flashcheck.oracles.compare import Comparison


class Accumulator:
    """Running max/mean ULP, error/bound ratios, violations and flushes over many comparisons;
    keeps (condition, ulp, bound) samples for the plots."""

    def __init__(self, keep: int = 4000) -> None:
        self.n = 0
        self.sum_ulp = 0.0
        self.max_ulp = 0.0
        self.sum_ratio = 0.0
        self.max_ratio = 0.0
        self.violations = 0
        self.ftz = 0
        self.nan_mismatch = 0
        self.keep = keep
        self.samples: list[np.ndarray] = []

    def add(self, c: Comparison, scatter_x: np.ndarray | None = None) -> None:
        finite = np.isfinite(c.dist) & ~c.ftz
        both_nan = np.isnan(c.oracle) & (c.dist == 0)
        judged = finite & ~both_nan
        self.nan_mismatch += int(np.isinf(c.dist).sum())
        self.violations += int(c.violations.sum())
        self.ftz += int(c.ftz.sum())
        if judged.any():
            d, r = c.dist[judged], c.bound_ratio()[judged]
            self.n += int(judged.sum())
            self.sum_ulp += float(d.sum())
            self.max_ulp = max(self.max_ulp, float(d.max()))
            self.sum_ratio += float(r.sum())
            self.max_ratio = max(self.max_ratio, float(r.max()))
            if scatter_x is not None and sum(len(s) for s in self.samples) < self.keep:
                sx = np.broadcast_to(scatter_x, c.dist.shape)[judged]
                self.samples.append(np.stack([sx, d, c.bound[judged]], axis=1)[: self.keep])

    def summary(self) -> dict[str, Any]:
        return {
            "elements": self.n,
            "max_ulp": self.max_ulp,
            "mean_ulp": self.sum_ulp / self.n if self.n else 0.0,
            "max_bound_ratio": self.max_ratio,
            "mean_bound_ratio": self.sum_ratio / self.n if self.n else 0.0,
            "violations": self.violations,
            "nan_mismatch": self.nan_mismatch,
            "ftz": self.ftz,
            "_samples": np.concatenate(self.samples) if self.samples else np.zeros((0, 3)),
        }

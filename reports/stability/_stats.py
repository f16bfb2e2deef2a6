"""Per-element measurements of one kernel call and their running summary per kernel, dtype, class.

A `Measurement` is what a family module (reports/stability/softmax.py, reports/stability/attention.py) extracts from
one comparison with the oracle; an `Accumulator` folds many of them into the figures the report
prints. Everything that can fail counts: a NaN or infinity where the oracle has a number (or the
reverse) is a violation with an infinite error/bound ratio, never left out of a maximum.

Signed error. Errors of one row are correlated (they share the row's max and denominator), so
the confidence interval of the mean signed error treats rows as the independent units: a
cluster-robust (ratio-estimator) standard error over rows and a Student t quantile with
rows - 1 degrees of freedom. A CI that excludes 0 means the kernel rounds one way more often
than the other: a bias, which sums up over long reductions and training steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

#: Bins (log2 edges) of the error profiles against a feature (row length, |x_i - max|).
PROFILE_EDGES: dict[str, np.ndarray] = {
    "n": 2.0 ** np.arange(0, 19),  # 1 .. 2^18 elements or keys
    "cond": np.concatenate([[0.0], 2.0 ** np.arange(-8, 18)]),  # |x_i - max| 0, 2^-8 .. 2^17
}


@dataclass
class Measurement:
    """Per-element results of one kernel call, each array of shape (rows, elements per row).

    dist: ULP distance from the correctly rounded oracle (inf for a NaN mismatch).
    ratio: measured error over its derived bound (inf for a NaN/inf mismatch, 0 where flushed).
    violation: over the bound (flushes to zero excluded, NaN/inf mismatches included).
    mismatch: NaN or infinity on one side only, or infinities of different sign.
    ftz: flushed to zero where allowed. wide: the bound allows more than 1 ULP here.
    signed_ulp, signed_rel: signed error in ULPs and relative to the exact value (NaN where it
        does not apply: specials, flushes, mismatches, exact zeros for the relative one).
    y, ybound: the error and its bound in the units the profile plots use.
    features: per-element values of the profile features (keys of PROFILE_EDGES).
    """

    dist: np.ndarray
    ratio: np.ndarray
    violation: np.ndarray
    mismatch: np.ndarray
    ftz: np.ndarray
    wide: np.ndarray
    signed_ulp: np.ndarray
    signed_rel: np.ndarray
    y: np.ndarray
    ybound: np.ndarray
    features: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # One row per leading index: the last axis holds a row (softmax) or a head dim (attention).
        full = np.shape(self.dist)
        for name in ("dist", "ratio", "violation", "mismatch", "ftz", "wide", "signed_ulp", "signed_rel",
                     "y", "ybound"):
            a = np.asarray(getattr(self, name))
            setattr(self, name, a.reshape(-1, a.shape[-1]) if a.ndim else a.reshape(1, 1))
        shape = self.dist.shape
        self.features = {k: np.broadcast_to(np.asarray(v, dtype=np.float64), full).reshape(shape)
                         for k, v in self.features.items()}


def t_quantile(df: int, p: float = 0.975) -> float:
    """Student t quantile (Cornish-Fisher expansion around the normal; within 1% for df >= 3)."""
    z = 1.959963984540054 if p == 0.975 else _normal_quantile(p)
    if df <= 0:
        return math.inf
    if df == 1:
        return math.tan(math.pi * (p - 0.5))
    if df == 2:
        a = 4 * p * (1 - p)
        return (2 * p - 1) * math.sqrt(2 / a)
    g1 = (z**3 + z) / 4
    g2 = (5 * z**5 + 16 * z**3 + 3 * z) / 96
    g3 = (3 * z**7 + 19 * z**5 + 17 * z**3 - 15 * z) / 384
    return z + g1 / df + g2 / df**2 + g3 / df**3


def _normal_quantile(p: float) -> float:
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


class SignedMean:
    """Mean of a signed error over elements, with a cluster-robust 95% CI over rows."""

    def __init__(self) -> None:
        self.sums: list[float] = []  # per row: sum of the signed errors
        self.counts: list[int] = []  # per row: how many

    def add(self, values: np.ndarray) -> None:
        ok = np.isfinite(values)
        n = ok.sum(axis=1)
        s = np.where(ok, values, 0.0).sum(axis=1)
        keep = n > 0
        self.sums.extend(s[keep].tolist())
        self.counts.extend(n[keep].tolist())

    def summary(self) -> dict[str, Any]:
        n = np.asarray(self.counts, dtype=np.float64)
        s = np.asarray(self.sums, dtype=np.float64)
        total = n.sum()
        if total == 0:
            return {"mean": None, "lo": None, "hi": None, "rows": 0, "n": 0}
        mean = float(s.sum() / total)
        c = len(n)
        if c < 2:
            return {"mean": mean, "lo": None, "hi": None, "rows": c, "n": int(total)}
        resid = s - mean * n
        se = math.sqrt(c / (c - 1) * float((resid**2).sum())) / total
        half = t_quantile(c - 1) * se
        return {"mean": mean, "lo": float(mean - half), "hi": float(mean + half), "rows": c, "n": int(total)}


def biased(s: dict[str, Any]) -> bool:
    """The CI of a signed mean excludes 0."""
    return s["lo"] is not None and (s["lo"] > 0 or s["hi"] < 0)


class Profile:
    """Error against a feature in log2 bins: count, mean and max error, max bound, violations."""

    def __init__(self, edges: np.ndarray) -> None:
        self.edges = edges
        k = len(edges) + 1
        self.count = np.zeros(k)
        self.sum = np.zeros(k)
        self.max = np.zeros(k)
        self.bound = np.zeros(k)
        self.fail = np.zeros(k)

    def add(self, x: np.ndarray, y: np.ndarray, bound: np.ndarray, fail: np.ndarray) -> None:
        ok = np.isfinite(x)
        b = np.searchsorted(self.edges, x[ok], side="right")
        yy = np.where(np.isfinite(y[ok]), y[ok], np.nan)
        np.add.at(self.count, b, 1)
        np.add.at(self.sum, b, np.nan_to_num(yy, nan=0.0))
        np.maximum.at(self.max, b, np.where(np.isnan(yy), np.inf, yy))
        np.maximum.at(self.bound, b, np.nan_to_num(bound[ok], nan=0.0, posinf=0.0))
        np.add.at(self.fail, b, fail[ok])

    def summary(self) -> dict[str, list]:
        used = np.flatnonzero(self.count)
        # bin b holds edges[b-1] <= x < edges[b]: its centre for plotting is the left edge's,
        # or the first edge's half for bin 0.
        left = np.concatenate([[self.edges[0] / 2], self.edges])
        return {"x": left[used].tolist(), "count": self.count[used].astype(int).tolist(),
                "mean": (self.sum[used] / self.count[used]).tolist(), "max": self.max[used].tolist(),
                "bound": self.bound[used].tolist(), "fail": self.fail[used].astype(int).tolist()}


class Accumulator:
    """Running summary of Measurements for one kernel, dtype and class."""

    def __init__(self) -> None:
        self.outputs = 0
        self.exact = 0
        self.one_ulp = 0
        self.violations = 0
        self.mismatch = 0
        self.ftz = 0
        self.max_ulp = 0.0
        self.max_err = 0.0  # in the family's display units (Measurement.y)
        self.max_ratio = 0.0
        self.max_ratio_wide: float | None = None
        self.sum_ratio = 0.0
        self.judged = 0
        self.errors: list[str] = []  # exceptions the kernel raised (each call counts as a failure)
        self.calls = 0
        self.signed_ulp = SignedMean()
        self.signed_rel = SignedMean()
        self.profiles = {k: Profile(e) for k, e in PROFILE_EDGES.items()}

    def add(self, m: Measurement) -> None:
        self.calls += 1
        finite = np.isfinite(m.dist)
        self.outputs += int(m.dist.size)
        self.exact += int((m.dist == 0).sum())
        self.one_ulp += int(((m.dist == 1) & ~m.violation).sum())
        self.violations += int(m.violation.sum())
        self.mismatch += int(m.mismatch.sum())
        self.ftz += int(m.ftz.sum())
        if m.dist.size:
            self.max_ulp = max(self.max_ulp, float(np.where(finite, m.dist, np.inf).max()))
            self.max_err = max(self.max_err, float(np.where(np.isnan(m.y), np.inf, m.y).max()))
            judged = ~m.ftz
            if judged.any():
                r = m.ratio[judged]
                self.max_ratio = max(self.max_ratio, float(r.max()))
                self.sum_ratio += float(np.where(np.isfinite(r), r, 0.0).sum())
                self.judged += int(judged.sum())
            w = m.wide & ~m.ftz
            if w.any():
                self.max_ratio_wide = max(self.max_ratio_wide or 0.0, float(m.ratio[w].max()))
        self.signed_ulp.add(m.signed_ulp)
        self.signed_rel.add(m.signed_rel)
        # Allowed flushes stay out of the profiles as they stay out of err/bound (the tables count
        # them): a flushed tiny output is far in ULPs of its subnormal value, and plotted against a
        # bound that does not carry the flush allowance it would read as a failure.
        keep = ~m.ftz.ravel()
        for k, x in m.features.items():
            self.profiles[k].add(x.ravel()[keep], m.y.ravel()[keep], m.ybound.ravel()[keep],
                                 m.violation.ravel()[keep])

    def add_error(self, e: BaseException) -> None:
        self.calls += 1
        msg = f"{type(e).__name__}: {e}".splitlines()[0][:200]
        if msg not in self.errors:
            self.errors.append(msg)

    def summary(self) -> dict[str, Any]:
        n = self.outputs
        failed = self.violations > 0 or bool(self.errors)
        return {
            "outputs": n,
            "calls": self.calls,
            "exact_share": self.exact / n if n else None,
            "one_ulp_share": self.one_ulp / n if n else None,
            "beyond_share": self.violations / n if n else None,
            "violations": self.violations,
            "mismatch": self.mismatch,
            "ftz": self.ftz,
            "errors": self.errors,
            "max_ulp": self.max_ulp,
            "max_err": self.max_err,
            "max_bound_ratio": math.inf if self.errors else self.max_ratio,
            "mean_bound_ratio": self.sum_ratio / self.judged if self.judged else 0.0,
            "max_bound_ratio_wide": self.max_ratio_wide,
            "signed_ulp": self.signed_ulp.summary(),
            "signed_rel": self.signed_rel.summary(),
            "profiles": {k: p.summary() for k, p in self.profiles.items()},
            "status": "FAIL" if failed else "PASS",
        }

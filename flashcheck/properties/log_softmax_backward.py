"""The log_softmax_backward family's properties: fn(logp, dy) -> dx = dy - exp(logp) sum_j dy_j, logp
the forward's output as given (torch's formula, docs/NUMERICS.md 9.1). Shared machinery:
`flashcheck.properties.rowwise`.

* input_untouched, matches_oracle (within `oracles.log_softmax.log_softmax_backward_bound` (NUMERICS 9.6)),
  nan_guard_invisible: as the softmax backward's.
* rows_sum: sum_j dx_j = (sum dy)(1 - sum exp(logp)) (0 for a logp whose exponentials sum to 1),
  within the sum of the elements' bounds.
"""
from __future__ import annotations

import math

import numpy as np

from flashcheck.properties.rowwise import Rows

FAMILY = "log_softmax_backward"
INPUTS = ("logp", "dy")
CORE_PROPERTIES = ("input_untouched", "matches_oracle", "rows_sum")
META_PROPERTIES = ("nan_guard_invisible",)


def exact_row_sums(inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """(sum dy)(1 - sum exp(logp)) per row and its float64 error: sum dy and 1 - sum e_j correctly
    rounded (fsum) from NumPy's exponentials, each within 2^-52 relative, so the second sum is off by
    (n + 2) 2^-52 absolute at most (sum e_j ~ 1), times |sum dy|."""
    out, err = [], []
    for lp, dy in zip(inputs["logp"], inputs["dy"]):
        if not np.isfinite(dy).all() or np.isnan(lp).any() or (lp == np.inf).any():
            out.append(math.nan)
            err.append(0.0)
            continue
        e = np.exp(lp)
        s = math.fsum(dy)
        out.append(s * math.fsum([1.0, *(-e)]))
        err.append(abs(s) * (len(lp) + 2) * 2.0**-52 * max(1.0, float(e.sum())) + 3 * 2.0**-53 * abs(out[-1]))
    return np.array(out), np.array(err)


ROWS = Rows(FAMILY, INPUTS, row_sum=exact_row_sums)


ROWS.register(CORE_PROPERTIES + META_PROPERTIES)


#: What the engine asks a family (flashcheck.families.HOOKS).
fit_to_declarations, refusable = ROWS.fit, ROWS.refusable

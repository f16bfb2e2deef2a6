"""The softmax_backward family's properties: fn(y, dy) -> dx = y (dy - sum_j y_j dy_j), y the forward's
output as given (docs/NUMERICS.md 9.1). Shared machinery: `flashcheck.properties.rowwise`.

* input_untouched: y's and dy's whole storages (guards included) are unchanged (Apex-style backward
  kernels write dx into dy's buffer).
* matches_oracle: within `oracles.log_softmax.softmax_backward_bound` (NUMERICS 9.6) of the correctly rounded
  oracle, special values exactly.
* rows_sum: sum_j dx_j = s (1 - sum_j y_j) exactly (0 for a y summing to 1), within the sum of the
  elements' bounds: a backward using the log-softmax formula (dy - sum dy) misses it by s.
* nan_guard_invisible: the same views in zero guard data give the same bits.
"""
from __future__ import annotations

import math

import numpy as np

from flashcheck.properties.rowwise import Rows

FAMILY = "softmax_backward"
INPUTS = ("y", "dy")
CORE_PROPERTIES = ("input_untouched", "matches_oracle", "rows_sum")
META_PROPERTIES = ("nan_guard_invisible",)


def exact_row_sums(inputs: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """s (1 - sum y) per row and its float64 error: fsum of exact products (fp32 x fp32 fits float64)
    and of 1 - y_j, each correctly rounded, then one product: 3 units of 2^-53."""
    out = []
    for y, dy in zip(inputs["y"], inputs["dy"]):
        with np.errstate(invalid="ignore", over="ignore"):
            s = math.fsum(y * dy) if np.isfinite(y * dy).all() else math.inf
        out.append(s * math.fsum([1.0, *(-y)]) if math.isfinite(s) else math.nan)
    value = np.array(out)
    return value, 3 * 2.0**-53 * np.abs(np.nan_to_num(value))


ROWS = Rows(FAMILY, INPUTS, row_sum=exact_row_sums)


ROWS.register(CORE_PROPERTIES + META_PROPERTIES)


#: What the engine asks a family (flashcheck.families.HOOKS).
fit_to_declarations, refusable = ROWS.fit, ROWS.refusable

"""The log_softmax family's properties: fn(x) -> x - logsumexp(x) over the last dim (docs/NUMERICS.md
9.1), on a softmax's inputs (the softmax classes). Shared machinery: `flashcheck.properties.rowwise`.

* input_untouched: x's whole storage (guards included) is unchanged.
* matches_oracle: within `oracles.log_softmax.log_softmax_bound` (NUMERICS 9.6) of the correctly rounded
  oracle, special values exactly (NaN rows, -inf entries): log(softmax) underflowing to -inf and an
  exp without the max subtraction (hb-pytorch #61: -inf at x = 88.72) both fail it.
* shift_invariant: log_softmax(x + c) = log_softmax(x) when every x_i + c is exact (the case's
  "shift"): bit for bit, or within both bounds of the same correctly rounded value for a kernel
  declaring shift_exact=False.
* nan_guard_invisible: the same view in zero guard data gives the same bits.
"""
from __future__ import annotations

import numpy as np

from flashcheck.families import get as family_record
from flashcheck.families import prop
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.formats import format_of, to_float64
from flashcheck.properties.rowwise import Rows, excess, first_diff, shifted, violations, where
from flashcheck.strategies.case import Case

FAMILY = "log_softmax"
INPUTS = ("x",)
CORE_PROPERTIES = ("input_untouched", "matches_oracle")
META_PROPERTIES = ("shift_invariant", "nan_guard_invisible")

ROWS = Rows(FAMILY, INPUTS)


ROWS.register(("input_untouched", "matches_oracle", "nan_guard_invisible"))


@prop(FAMILY, "shift_invariant")
def shift_invariant(spec: KernelSpec, case: Case) -> None:
    x, c = case.tensors["x"], float(case.tensors["shift"])
    x64 = to_float64(x)
    xs = shifted(x, c, case.label)
    y, ys = ROWS.run(spec, {"x": x}), ROWS.run(spec, {"x": xs})
    if spec.shift_exact:
        diff = first_diff(y, ys)
        if diff:
            raise AssertionError(f"{spec.name}: log_softmax(x + {c!r}) != log_softmax(x) bit for bit: {diff}\n"
                                 f"  {where(case)}")
        return
    fmt = format_of(y.dtype)
    record = family_record(FAMILY)
    r = record.function("oracle")(x64, fmt)  # the same exact result for x and x + c: one rounding
    depth = spec.summation_depth(x.shape[-1])
    b = record.function("bound")(x64, fmt, depth=depth, oracle=r)
    bs = record.function("bound")(x64 + c, fmt, depth=depth, oracle=r)
    got, got_s = to_float64(y), to_float64(ys)
    bad = violations(got_s, got, b + bs) & np.isfinite(r) | (~np.isfinite(r) & violations(got_s, r, bs))
    if bad.any():
        i, j = np.unravel_index(int(np.argmax(np.where(bad, excess(got_s, got, b + bs), -1))), bad.shape)
        raise AssertionError(f"{spec.name}: log_softmax(x + {c!r}) differs from log_softmax(x) by more than both "
                             f"bounds in {int(bad.sum())} of {bad.size} elements; worst at [{i}, {j}]: x={x64[i, j]!r} "
                             f"shifted={got_s[i, j]!r} unshifted={got[i, j]!r} oracle={r[i, j]!r} "
                             f"bound={b[i, j] + bs[i, j]:.3g}\n  {where(case)}")


#: What the engine asks a family (flashcheck.families.HOOKS).
fit_to_declarations, refusable = ROWS.fit, ROWS.refusable

"""What the row-wise training families share (softmax backward, log-softmax, log-softmax backward):
one kernel call per case, the comparison with the correctly rounded oracle within the family's
derived bound (the `bound` of its record in flashcheck/families.py: one place per family), failure
messages in the style of torch.testing.assert_close (worst element, its index, both values, the
bound), the untouched inputs, NaN guard data, and the bad inputs a validating kernel refuses.

A family module builds one `Rows` and registers its properties with `flashcheck.families.prop`,
each a line calling into it; the shrunk failure of any of them is saved and replayed by the runner
(`flashcheck.properties.runner`), whose note ends the message with the replay command.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from flashcheck.families import get as family_record
from flashcheck.fixtures.store import storage_snapshot
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.formats import Format, format_of, to_float64
from flashcheck.oracles.bounds import row_sum_bound
from flashcheck.properties.limits import within_declared_numel
from flashcheck.properties.softmax import _first_diff as first_diff, same_layout
from flashcheck.strategies.case import Case


@dataclass
class Outcome:
    """One kernel call on a case: inputs as exact values, the output, and (lazily) the oracle and
    the bound, each computed once for the properties checked on the same case."""

    inputs: dict[str, np.ndarray]
    out: torch.Tensor
    out64: np.ndarray
    fmt: Format
    depth: int
    before: dict[str, torch.Tensor]
    after: dict[str, torch.Tensor]
    cache: dict[str, Any] = field(default_factory=dict)


def compact(row: np.ndarray, focus: int, width: int = 5) -> str:
    """A row with runs of one non-finite value collapsed and the neighbourhood of `focus` shown."""
    n = len(row)
    keep = set(range(min(width, n))) | set(range(max(0, focus - 2), min(n, focus + 3))) | set(range(max(0, n - 2), n))
    out, i = [], 0
    while i < n:
        if i in keep:
            v = float(row[i])
            out.append(("*" if i == focus else "") + (f"{v:.6g}" if math.isfinite(v) else str(v)))
            i += 1
        else:
            j = i
            while j < n and j not in keep:
                j += 1
            out.append(f"...{j - i}...")
            i = j
    return "[" + ", ".join(out) + "]"


def where(case: Case) -> str:
    """The case's tensors as a line: shape, dtype, strides, offset (its layout is often the bug)."""
    return "; ".join(f"{k} {tuple(t.shape)} {str(t.dtype).removeprefix('torch.')} stride={t.stride()} "
                     f"offset={t.storage_offset()}" for k, t in case.tensors.items()) + f" ({case.label})"


def shifted(x: torch.Tensor, c: float, label: str) -> torch.Tensor:
    """x + c in x's own layout (a fresh storage shaped like x's), checked exact in x's dtype: the
    shift cases promise it, and the shift properties rest on it."""
    x64 = to_float64(x)
    values = torch.from_numpy(x64 + c).to(x.dtype)
    if not np.array_equal(to_float64(values), x64 + c, equal_nan=True):
        raise ValueError(f"case bug: x + {c} is not exact in {x.dtype} ({label})")
    return same_layout(x, values.to(x.device))


class Rows:
    """A row-wise family: its kernels take `inputs` (2-D, rows over the last dim) and return their
    shape and dtype; `oracle(*inputs, fmt)` and `bound(*inputs, fmt, depth=, oracle=)` as in
    oracles/log_softmax.py (their record's `oracle` and `bound`)."""

    def __init__(self, family: str, inputs: tuple[str, ...], *,
                 row_sum: Callable[[dict[str, np.ndarray]], tuple[np.ndarray, np.ndarray]] | None = None) -> None:
        self.family, self.inputs, self.row_sum = family, inputs, row_sum
        self._last: tuple[str, Case, Outcome] | None = None

    def register(self, names: tuple[str, ...]) -> None:
        """Register these properties (methods of the same names) under the family, and the oracle's
        margin (hypothesis.target climbs the worst err/bound)."""
        from flashcheck.families import margin, prop

        for name in names:
            method = getattr(self, name)
            prop(self.family, name)(lambda spec, case, _m=method: _m(spec, case))
        margin(self.family, "matches_oracle")(self.margin)

    def fit(self, spec: KernelSpec, case: Case) -> Case | None:
        """The family's `fit_to_declarations` (flashcheck.families.HOOKS)."""
        return fit_inputs(spec, case, self.inputs)

    def refusable(self, case: Case) -> dict[str, str]:
        """The family's `refusable` (flashcheck.families.HOOKS)."""
        return refusable(case, self.inputs[0])

    # ---- the call ---------------------------------------------------------------------------
    def run(self, spec: KernelSpec, tensors: dict[str, torch.Tensor]) -> torch.Tensor:
        ins = [tensors[n] for n in self.inputs]
        out = spec.fn(*ins)
        if not isinstance(out, torch.Tensor):
            raise AssertionError(f"{spec.name} returned {type(out).__name__}, not a tensor")
        if tuple(out.shape) != tuple(ins[0].shape) or out.dtype != ins[0].dtype:
            raise AssertionError(f"{spec.name} returned {tuple(out.shape)} {out.dtype}, expected "
                                 f"{tuple(ins[0].shape)} {ins[0].dtype} (its input's shape and dtype)")
        return out

    def outcome(self, spec: KernelSpec, case: Case) -> Outcome:
        if self._last is not None and self._last[0] == spec.name and self._last[1] is case:
            return self._last[2]
        before = {n: storage_snapshot(case.tensors[n]) for n in self.inputs}
        out = self.run(spec, case.tensors)
        first = case.tensors[self.inputs[0]]
        o = Outcome({n: to_float64(case.tensors[n]) for n in self.inputs}, out, to_float64(out),
                    format_of(out.dtype), spec.summation_depth(first.shape[-1]), before,
                    {n: storage_snapshot(case.tensors[n]) for n in self.inputs})
        self._last = (spec.name, case, o)
        return o

    def oracle(self, o: Outcome) -> np.ndarray:
        if "oracle" not in o.cache:
            fn = family_record(self.family).function("oracle")
            o.cache["oracle"] = fn(*(o.inputs[n] for n in self.inputs), o.fmt)
        return o.cache["oracle"]

    def bound(self, o: Outcome) -> np.ndarray:
        if "bound" not in o.cache:
            fn = family_record(self.family).function("bound")
            o.cache["bound"] = fn(*(o.inputs[n] for n in self.inputs), o.fmt, depth=o.depth, oracle=self.oracle(o))
        return o.cache["bound"]

    # ---- messages ----------------------------------------------------------------------------
    def describe(self, spec: KernelSpec, case: Case, o: Outcome, bad: np.ndarray, what: str,
                 score: np.ndarray | None = None, extra: str = "") -> str:
        s = np.where(bad, np.nan_to_num(score, nan=np.inf, posinf=np.inf) if score is not None else 1.0, -np.inf)
        r, c = np.unravel_index(int(np.argmax(s)), s.shape)
        lines = [f"{spec.name} [{o.fmt.name}] {what}: {int(bad.sum())} of {bad.size} elements",
                 f"  {where(case)}"]
        if "oracle" in o.cache:
            r_ = float(self.oracle(o)[r, c])
            got = float(o.out64[r, c])
            line = f"  worst at [{r}, {c}]: kernel={got!r} oracle={r_!r}"
            if "bound" in o.cache:
                b = float(self.bound(o)[r, c])
                diff = abs(got - r_) if math.isfinite(got - r_) else math.inf
                line += f" |diff|={diff:.3g} bound={b:.3g}" + (f" ({diff / b:.3g}x)" if b > 0 and math.isfinite(diff) else
                                                               " (exact: a special value)" if b == 0 else "")
            lines.append(line)
        else:
            lines.append(f"  worst at [{r}, {c}]: kernel={float(o.out64[r, c])!r}")
        if extra:
            lines.append(f"  {extra}")
        for n in self.inputs:
            lines.append(f"  {n} row {r}: {compact(o.inputs[n][r], c)}")
        lines.append(f"  out row {r}: {compact(o.out64[r], c)}")
        return "\n".join(lines)

    # ---- properties -------------------------------------------------------------------------
    def input_untouched(self, spec: KernelSpec, case: Case) -> None:
        o = self.outcome(spec, case)
        for n in self.inputs:
            if not torch.equal(o.before[n], o.after[n]):
                changed = int((o.before[n] != o.after[n]).sum())
                raise AssertionError(f"{spec.name} modified its input {n}'s storage ({changed} bytes changed)\n"
                                     f"  {where(case)}")

    def matches_oracle(self, spec: KernelSpec, case: Case) -> None:
        o = self.outcome(spec, case)
        r, b = self.oracle(o), self.bound(o)
        bad = violations(o.out64, r, b)
        if bad.any():
            raise AssertionError(self.describe(spec, case, o, bad, "exceed the derived error bound",
                                               score=excess(o.out64, r, b)))

    def margin(self, spec: KernelSpec, case: Case) -> float:
        o = self.outcome(spec, case)
        r, b = self.oracle(o), self.bound(o)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = np.where(np.isfinite(r) & (b > 0), np.abs(o.out64 - r) / np.where(b > 0, b, 1.0), 0.0)
        return float(np.nanmax(ratio)) if ratio.size else 0.0

    def rows_sum(self, spec: KernelSpec, case: Case) -> None:
        """Each clean row of the output sums to its exact value (`row_sum`: (float64 value, its error)
        per row, 0 up to the inputs' own rounding) within the sum of its elements' bounds and the
        oracle's roundings."""
        o = self.outcome(spec, case)
        r, b = self.oracle(o), self.bound(o)
        clean = np.isfinite(r).all(axis=1)
        exact, known = self.row_sum(o.inputs)
        got = np.array([math.fsum(row) if np.isfinite(row).all() else np.inf for row in o.out64])
        allowed = row_sum_bound(b, r, o.fmt, known=known, got=np.where(np.isfinite(got), got, 0.0))
        bad_rows = clean & ~(np.abs(got - exact) <= allowed)
        if bad_rows.any():
            i = int(np.argmax(bad_rows))
            bad = np.zeros(o.out64.shape, dtype=bool)
            bad[i] = True
            raise AssertionError(self.describe(
                spec, case, o, bad, f"row {i} sums to {got[i]!r}, not {exact[i]!r} (|diff| "
                f"{abs(got[i] - exact[i]):.3g} > bound {allowed[i]:.3g}, the sum of its elements' bounds)",
                score=np.abs(o.out64 - r)))

    def nan_guard_invisible(self, spec: KernelSpec, case: Case) -> None:
        """The same views inside zero guard data give the same bits as inside the drawn NaN guards
        (a kernel reading outside its views, or masking a load by multiplying it by 0, differs)."""
        zero = {n: same_layout(case.tensors[n], case.tensors[n], guard=0.0) for n in self.inputs}
        diff = first_diff(self.run(spec, case.tensors), self.run(spec, {**case.tensors, **zero}))
        if diff:
            raise AssertionError(f"{spec.name}: the NaN guard data around the input views changes the output "
                                 f"(the same views in zero guard data): {diff}\n  {where(case)}")


def violations(got: np.ndarray, r: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Elements off the oracle by more than the bound; a non-finite oracle value is matched exactly
    (NaN for NaN, the same infinity)."""
    fin = np.isfinite(r)
    with np.errstate(invalid="ignore"):
        near = np.abs(got - r) <= b
    same_special = (got == r) | (np.isnan(got) & np.isnan(r))
    return np.where(fin, ~near, ~same_special)


def excess(got: np.ndarray, r: np.ndarray, b: np.ndarray) -> np.ndarray:
    """|kernel - oracle| over the bound (inf for a missed special value): the worst is named first."""
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        d = np.abs(got - r)
        return np.where(np.isfinite(r), np.where(b > 0, d / np.where(b > 0, b, 1.0), np.where(d > 0, np.inf, 0.0)),
                        np.inf)


def fit_inputs(spec: KernelSpec, case: Case, names: tuple[str, ...]) -> Case | None:
    """The case, if its rows are within the kernel's declared lengths, dtypes and max_numel; with
    contiguous_only, contiguous copies of its inputs (same values); None otherwise."""
    first = case.tensors[names[0]]
    if not spec.supports(first.dtype, first.shape[-1]) or not within_declared_numel(spec, case.tensors):
        return None
    if not spec.contiguous_only:
        return case
    return Case(tensors={n: (t.contiguous() if n in names else t) for n, t in case.tensors.items()},
                kwargs=dict(case.kwargs), label=case.label + "/contiguous")


def refusable(case: Case, name: str) -> dict[str, str]:
    """Rows past a plain length are the optional feature `max_n` (flashcheck.properties.refusals)."""
    from flashcheck.properties.refusals import LONG

    n = case.tensors[name].shape[-1]
    return {"max_n": f"rows of {n}"} if n > LONG else {}


def bad_inputs(names: tuple[str, ...], device: Any) -> dict[str, tuple[type[Exception], list[torch.Tensor]]]:
    """Inputs a validating kernel refuses: (the exception a "typed" kernel raises, the arguments)."""
    ok = lambda: torch.ones(2, 3, device=device)  # noqa: E731
    k = len(names)
    out: dict[str, tuple[type[Exception], list[torch.Tensor]]] = {
        "int_dtype": (TypeError, [torch.ones(2, 3, dtype=torch.int32, device=device)] * k),
        "float64": (TypeError, [torch.ones(2, 3, dtype=torch.float64, device=device)] * k),
        "rank_1": (ValueError, [torch.ones(3, device=device)] * k),
        "rank_3": (ValueError, [torch.ones(2, 3, 4, device=device)] * k),
        "wrong_device": (ValueError, [torch.ones(2, 3, device="meta")] * k),
    }
    if k > 1:
        out["shapes_differ"] = (ValueError, [ok(), torch.ones(2, 4, device=device)])
        out["dtypes_differ"] = (TypeError, [ok(), torch.ones(2, 3, dtype=torch.float16, device=device)])
    return out

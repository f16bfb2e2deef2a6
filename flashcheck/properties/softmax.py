"""The softmax family's properties: what a softmax kernel must satisfy on one case.

Each property is `prop(spec, case)`, registered under a stable name with `flashcheck.families.prop`
(fixtures name the property that failed, and replay it forever); it raises AssertionError with a
message naming the worst element, both values and the bound. The tests in `flashcheck/suite/test_softmax*.py`
and the stability report draw cases and call these through `flashcheck.properties.runner.check`.

Core properties (checked on every case of every adversarial class): input untouched, matches
the certified oracle within the kernel's derived bound, rows sum to one within a derived bound,
outputs in [0, 1], order preserved. One kernel call serves all of them.

Metamorphic and memory properties (no oracle needed for the verdict):

They need no oracle for their verdict (the permutation test uses the derived bound as its
tolerance), and each is registered with `@prop` and run through `properties.check`, so a shrunk
failure is saved as an exact-bit fixture like any other:

* shift_invariant: softmax(x + c) has the same bits as softmax(x) when every x_i + c is exact.
  The strategy draws multiples of a quantum q with |x_i| + |c| small enough that x_i + c and
  x_i - max are exact in the input format and in fp32; a kernel that subtracts the max before
  any other rounding then computes bit-identical values ((x_i + c) - (m + c) = x_i - m). A kernel
  that rounds before subtracting (e.g. x * log2(e) - m * log2(e)) is still right but not
  shift-exact: it declares `shift_exact=False` (a `flashcheck` dict key for external
  kernels) and is then held to the derived bound instead.
* permutation_equivariant: softmax(x P) = softmax(x) P within the derived bound, not bitwise:
  permuting the columns reorders the fp32 sum (and moves values between chunks), so its last bits
  may change. Each output is within its bound b of the same correctly rounded value, so the two
  outputs are within 2b ULPs of each other (the ULP distance is a metric); exact specials (NaN,
  the zeros of -inf entries, bound 0) must match exactly.
* configs_identical: every launch configuration of `spec.configs` gives the default's bits.
* tunings_within_bound: every configuration of `spec.tunings` (knobs that may reassociate the
  sum) meets the oracle bound, as the default must.
* deterministic: two runs give the same bits.
* guard_bands: with `out=` a strided view inside a buffer of sentinel bits, the view holds the
  default output's bits and no other byte of the buffer (or of the input) changes. Only kernels
  whose signature takes `out` (the production kernels do); others are skipped with the reason.
* nan_guard_invisible: the output on a view inside NaN guard data equals the output on the same
  view inside zero guard data (a kernel that reads outside its view, or multiplies a masked
  load by 0 instead of selecting, sees the difference).
* input untouched is the core property `input_untouched` (flashcheck/suite/test_softmax.py), checked on
  every case of every class there; guard_bands also checks the input when `out=` is given.

"Same bits" counts any NaN as equal to any NaN (payloads are not part of the contract).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from flashcheck.fixtures.store import storage_of, storage_snapshot
from flashcheck.families import margin, prop
from flashcheck.strategies.case import Case
from flashcheck.kernels.registry import KernelSpec
from flashcheck.properties.limits import within_declared_numel
from flashcheck.oracles.bounds import ftz_allowed, softmax_sum_bound, softmax_ulp_bound
from flashcheck.oracles.compare import Comparison, compare_softmax
from flashcheck.oracles.formats import Format, bit_patterns, format_of, same_bits, to_float64, ulp_distance
from flashcheck.oracles.softmax import softmax_oracle

FAMILY = "softmax"
CORE_PROPERTIES = ("input_untouched", "matches_oracle", "sums_to_one", "in_unit_interval", "order_preserved")
META_PROPERTIES = ("shift_invariant", "permutation_equivariant", "configs_identical", "tunings_within_bound",
                   "deterministic", "guard_bands", "nan_guard_invisible")

# ---- one kernel call per case --------------------------------------------------------------

@dataclass
class Outcome:
    x64: np.ndarray
    y: torch.Tensor
    y64: np.ndarray
    fmt: Format
    storage_before: torch.Tensor
    storage_after: torch.Tensor
    depth: int
    _cmp: Comparison | None = None

    @property
    def cmp(self) -> Comparison:
        if self._cmp is None:
            self._cmp = compare_softmax(self.x64, self.y64, self.fmt, depth=self.depth)
        return self._cmp

    @property
    def oracle(self) -> np.ndarray:
        return self.cmp.oracle


_last: tuple[str, Case, Outcome] | None = None


def outcome(spec: KernelSpec, case: Case) -> Outcome:
    """Run the kernel once on a case; the properties checked on the same case share the call."""
    global _last
    if _last is not None and _last[0] == spec.name and _last[1] is case:
        return _last[2]
    x = case.tensors["x"]
    before = storage_snapshot(x)
    y = spec.fn(x, **case.kwargs)
    if not isinstance(y, torch.Tensor):
        raise AssertionError(f"{spec.name} returned {type(y).__name__}, not a tensor")
    expected_dtype = case.kwargs.get("out_dtype") or x.dtype
    if tuple(y.shape) != tuple(x.shape) or y.dtype != expected_dtype:
        raise AssertionError(f"{spec.name} returned {tuple(y.shape)} {y.dtype}, "
                             f"expected {tuple(x.shape)} {expected_dtype}")
    out = Outcome(to_float64(x), y, to_float64(y), format_of(y.dtype), before, storage_snapshot(x),
                  spec.summation_depth(x.shape[1]))
    _last = (spec.name, case, out)
    return out


# ---- failure messages ----------------------------------------------------------------------

def _compact(row: np.ndarray, focus: int, width: int = 6) -> str:
    """A row with runs of -inf/NaN/+inf collapsed and the neighbourhood of `focus` shown."""
    out, i, n = [], 0, len(row)
    keep = set(range(width)) | set(range(max(0, focus - width // 2), min(n, focus + width // 2 + 1))) \
        | set(range(max(0, n - 2), n))
    while i < n:
        v = row[i]
        if not np.isfinite(v):
            j = i
            while j < n and (row[j] == v or (np.isnan(v) and np.isnan(row[j]))):
                j += 1
            out.append(f"{v} x{j - i}" if j - i > 1 else str(v))
            i = j
        elif i in keep:
            out.append(("*" if i == focus else "") + f"{v:.6g}")
            i += 1
        else:
            j = i
            while j < n and j not in keep and np.isfinite(row[j]):
                j += 1
            out.append(f"...{j - i}...")
            i = j
    return "[" + ", ".join(out) + "]"


def describe(spec: KernelSpec, case: Case, o: Outcome, bad: np.ndarray, what: str,
             dist: np.ndarray | None = None, bound: np.ndarray | None = None) -> str:
    x = case.tensors["x"]
    score = np.where(bad, dist if dist is not None else 1.0, -1.0)
    r, c = np.unravel_index(int(np.argmax(score)), score.shape)
    lines = [f"{spec.name} [{o.fmt.name}] {what}: {int(bad.sum())} of {bad.size} elements",
             f"  x {tuple(x.shape)} {x.dtype} stride={x.stride()} offset={x.storage_offset()} ({case.label})",
             f"  worst at [{r}, {c}]: x={float(o.x64[r, c])!r} kernel={float(o.y64[r, c])!r} "
             f"oracle={float(o.oracle[r, c])!r}"
             + (f" ulps={dist[r, c]:g} bound={bound[r, c]:g}" if dist is not None else ""),
             f"  x row {r}: {_compact(o.x64[r], c)}",
             f"  y row {r}: {_compact(o.y64[r], c)}"]
    return "\n".join(lines)


def _clean_rows(o: Outcome) -> np.ndarray:
    return ~np.isnan(o.oracle).any(axis=1)


# ---- properties ----------------------------------------------------------------------------

@prop(FAMILY, "input_untouched")
def input_untouched(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    if not torch.equal(o.storage_before, o.storage_after):
        changed = int((o.storage_before != o.storage_after).sum())
        raise AssertionError(f"{spec.name} modified its input storage ({changed} bytes changed; {case!r})")


@prop(FAMILY, "matches_oracle")
def matches_oracle(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    c = o.cmp
    bad = c.violations
    if bad.any():
        raise AssertionError(describe(spec, case, o, bad, "exceed the error bound", c.dist, c.bound))


@margin(FAMILY, "matches_oracle")
def oracle_margin(spec: KernelSpec, case: Case) -> float:
    """The worst err/bound of the case (hypothesis.target climbs it); the comparison is cached."""
    r = outcome(spec, case).cmp.bound_ratio()
    return float(np.max(r)) if r.size else 0.0


@prop(FAMILY, "sums_to_one")
def sums_to_one(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    rows = _clean_rows(o)
    err = np.abs(np.sum(o.y64, axis=1) - 1.0)
    bound = softmax_sum_bound(o.x64, o.oracle, o.fmt, depth=o.depth)
    bad_rows = rows & ~(err <= bound)
    if bad_rows.any():
        r = int(np.argmax(bad_rows))
        bad = np.zeros_like(o.y64, dtype=bool)
        bad[r] = True
        raise AssertionError(describe(spec, case, o, bad, f"row {r} sums to 1{err[r]:+.3g}, "
                                      f"bound {bound[r]:.3g}"))


@prop(FAMILY, "in_unit_interval")
def in_unit_interval(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    bad = _clean_rows(o)[:, None] & ~((o.y64 >= 0) & (o.y64 <= 1))
    if bad.any():
        raise AssertionError(describe(spec, case, o, bad, "lie outside [0, 1]"))


@prop(FAMILY, "order_preserved")
def order_preserved(spec: KernelSpec, case: Case) -> None:
    """x_i < x_j implies y_i <= y_j and x_i == x_j implies y_i == y_j (every step is monotone)."""
    o = outcome(spec, case)
    for r in np.nonzero(_clean_rows(o))[0]:
        order = np.argsort(o.x64[r], kind="stable")
        xs, ys = o.x64[r, order], o.y64[r, order]
        drop = ys[1:] < ys[:-1]
        split = (xs[1:] == xs[:-1]) & (ys[1:] != ys[:-1])
        if (drop | split).any():
            k = int(np.argmax(drop | split))
            bad = np.zeros_like(o.y64, dtype=bool)
            bad[r, order[k + 1]] = True
            raise AssertionError(describe(spec, case, o, bad, f"break the order of x "
                                          f"(x {float(xs[k])!r} -> y {float(ys[k])!r}, "
                                          f"x {float(xs[k + 1])!r} -> y {float(ys[k + 1])!r})"))


# ---- helpers ---------------------------------------------------------------------------------

def _first_diff(a: torch.Tensor, b: torch.Tensor) -> str:
    eq = same_bits(a.detach().cpu(), b.detach().cpu())  # any NaN for any NaN
    if eq.all():
        return ""
    idx = tuple(int(i) for i in torch.nonzero(~eq)[0])
    return (f"{int((~eq).sum())} of {eq.numel()} elements differ; first at {list(idx)}: "
            f"{float(a[idx])!r} vs {float(b[idx])!r}")


def same_layout(x: torch.Tensor, values: torch.Tensor, *, guard: float | None = None) -> torch.Tensor:
    """A fresh storage shaped like x's (same size, strides, offset) holding `values` in the view;
    the rest copies x's storage, or holds `guard`."""
    base = storage_of(x).clone()
    if guard is not None:
        base.fill_(guard)
    view = base.as_strided(x.shape, x.stride(), x.storage_offset())
    view.copy_(values.to(x.dtype))
    return view


def accepts_out(spec: KernelSpec) -> bool:
    if spec.takes_out is not None:
        return spec.takes_out
    try:
        params = inspect.signature(spec.fn).parameters
    except (TypeError, ValueError):
        return False
    return "out" in params or any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())


def kernel_call(spec: KernelSpec, tensors: list[str]) -> tuple[str, list[str], list[str], dict]:
    """How the properties call the kernel on a case with these tensors, for a repro snippet:
    (entry point, positional tensors, keyword tensors, constant keywords). `shift` and `perm` are
    the metamorphic properties' own (they call it on x and on x transformed); `out` goes as out=."""
    return "fn", ["x"], [n for n in ("out",) if n in tensors], {}


def _run(spec: KernelSpec, x: torch.Tensor, **kw) -> torch.Tensor:
    y = spec.fn(x, **kw)
    if not isinstance(y, torch.Tensor) or tuple(y.shape) != tuple(x.shape):
        raise AssertionError(f"{spec.name} returned {type(y).__name__} "
                             f"{tuple(getattr(y, 'shape', ()))}, expected {tuple(x.shape)}")
    return y


def _where(case: Case) -> str:
    x = case.tensors["x"]
    return (f"x {tuple(x.shape)} {x.dtype} stride={x.stride()} offset={x.storage_offset()} "
            f"({case.label})")


# ---- properties ------------------------------------------------------------------------------

@prop(FAMILY, "shift_invariant")
def shift_invariant(spec: KernelSpec, case: Case) -> None:
    x, c = case.tensors["x"], float(case.tensors["shift"])
    x64 = to_float64(x)
    shifted = x64 + c
    xs_t = torch.from_numpy(shifted).to(x.dtype)
    if not np.array_equal(to_float64(xs_t), shifted, equal_nan=True):
        raise ValueError(f"case bug: x + {c} is not exact in {x.dtype} ({case.label})")
    xs = same_layout(x, xs_t.to(x.device))
    y, ys = _run(spec, x), _run(spec, xs)
    if spec.shift_exact:
        diff = _first_diff(y, ys)
        if diff:
            raise AssertionError(f"{spec.name}: softmax(x + {c!r}) != softmax(x) bit for bit: {diff}\n"
                                 f"  {_where(case)}")
    else:
        fmt = format_of(y.dtype)
        r = softmax_oracle(x64, fmt)
        bound = softmax_ulp_bound(x64, r, fmt, depth=spec.summation_depth(x.shape[1]))
        dist = ulp_distance(to_float64(ys), to_float64(y), fmt)
        bad = (dist > 2 * bound) & ~ftz_allowed(to_float64(y), r) & ~ftz_allowed(to_float64(ys), r)
        if bad.any():
            raise AssertionError(f"{spec.name}: softmax(x + {c!r}) differs from softmax(x) by "
                                 f"{dist[bad].max():g} ULPs (2 x bound {2 * bound[bad].min():g})\n  {_where(case)}")


@prop(FAMILY, "permutation_equivariant")
def permutation_equivariant(spec: KernelSpec, case: Case) -> None:
    x, perm = case.tensors["x"], case.tensors["perm"].cpu().long()
    xp = same_layout(x, x[:, perm.to(x.device)])
    y, yp = _run(spec, x), _run(spec, xp)
    fmt = format_of(y.dtype)
    x64p = to_float64(x)[:, perm.numpy()]
    want = to_float64(y)[:, perm.numpy()]
    got = to_float64(yp)
    r = softmax_oracle(x64p, fmt)
    bound = softmax_ulp_bound(x64p, r, fmt, depth=spec.summation_depth(x.shape[1]))
    dist = ulp_distance(got, want, fmt)
    flushed = ftz_allowed(got, r) | ftz_allowed(want, r)
    bad = (dist > 2 * bound) & ~flushed
    if bad.any():
        i, j = (int(v) for v in np.argwhere(bad)[0])
        raise AssertionError(
            f"{spec.name}: softmax(x P) != softmax(x) P: {int(bad.sum())} elements differ by more than twice "
            f"the bound; at [{i}, {j}] (permuted) x={x64p[i, j]!r}: {got[i, j]!r} vs {want[i, j]!r}, "
            f"{dist[i, j]:g} ULPs > 2 x {bound[i, j]:g}\n  {_where(case)}")


_DEFAULT: dict[str, tuple[KernelSpec, torch.Tensor, torch.Tensor]] = {}


def _default_output(spec: KernelSpec, x: torch.Tensor) -> torch.Tensor:
    """The default launch's output, shared by the properties checked on the same case."""
    hit = _DEFAULT.get("last")
    if hit is not None and hit[0] is spec and hit[1] is x:
        return hit[2]
    y = _run(spec, x)
    _DEFAULT["last"] = (spec, x, y)
    return y


@prop(FAMILY, "configs_identical")
def configs_identical(spec: KernelSpec, case: Case) -> None:
    x = case.tensors["x"]
    if not spec.configs:
        return
    y = _default_output(spec, x)
    for cfg in spec.configs:
        diff = _first_diff(y, _run(spec, x, **cfg))
        if diff:
            raise AssertionError(f"{spec.name}: launch configuration {cfg} changes the bits: {diff}\n  {_where(case)}")


@prop(FAMILY, "tunings_within_bound")
def tunings_within_bound(spec: KernelSpec, case: Case) -> None:
    x = case.tensors["x"]
    x64 = to_float64(x)
    for cfg in spec.tunings:
        y = _run(spec, x, **cfg)
        c = compare_softmax(x64, to_float64(y), format_of(y.dtype), depth=spec.summation_depth(x.shape[1], **cfg))
        if c.violations.any():
            r, k = np.unravel_index(int(np.argmax(np.where(c.violations, c.dist, -1))), c.dist.shape)
            raise AssertionError(f"{spec.name}: launch configuration {cfg} exceeds the bound at [{r}, {k}]: "
                                 f"kernel {float(to_float64(y)[r, k])!r}, oracle {float(c.oracle[r, k])!r}, "
                                 f"{c.dist[r, k]:g} ULPs > {c.bound[r, k]:g}\n  {_where(case)}")


@prop(FAMILY, "deterministic")
def deterministic(spec: KernelSpec, case: Case) -> None:
    x = case.tensors["x"]
    diff = _first_diff(_default_output(spec, x), _run(spec, x))
    if diff:
        raise AssertionError(f"{spec.name}: two runs on the same input differ: {diff}\n  {_where(case)}")


SENTINEL_BITS = {torch.float16: 0x7E55, torch.bfloat16: 0x7FD5, torch.float32: 0x7FD55555}  # NaN payloads


@prop(FAMILY, "guard_bands")
def guard_bands(spec: KernelSpec, case: Case) -> None:
    """`out=` a strided view inside sentinel bits: same bits as the default, guard bytes intact."""
    if not accepts_out(spec):
        raise AssertionError(f"{spec.name} takes no out= argument")
    x = case.tensors["x"]
    out0 = case.tensors["out"]
    # work on a copy: the case (a fixture if this fails) keeps the pristine buffer
    out = storage_of(out0).clone().as_strided(out0.shape, out0.stride(), out0.storage_offset())
    before = bit_patterns(storage_of(out)).cpu().clone()  # the sentinels' NaN payloads included
    x_before = bit_patterns(storage_of(x)).cpu().clone()
    want = _run(spec, x)
    got = spec.fn(x, out=out)
    after = bit_patterns(storage_of(out)).cpu()
    inside = torch.zeros(after.numel(), dtype=torch.bool)
    idx = torch.arange(after.numel()).as_strided(out.shape, out.stride(), out.storage_offset())
    inside[idx.reshape(-1)] = True
    clobbered = (after != before) & ~inside
    if clobbered.any():
        k = int(torch.nonzero(clobbered)[0])
        raise AssertionError(f"{spec.name} wrote {int(clobbered.sum())} guard elements outside the out= view "
                             f"(first at storage index {k}; view stride={out.stride()} "
                             f"offset={out.storage_offset()} of {after.numel()})\n  {_where(case)}")
    if isinstance(got, torch.Tensor) and got.data_ptr() != out.data_ptr():
        raise AssertionError(f"{spec.name}(x, out=view) returned a tensor that is not the view\n  {_where(case)}")
    diff = _first_diff(want, out)
    if diff:
        raise AssertionError(f"{spec.name}: output written into a strided out= view differs from the default "
                             f"output: {diff}\n  {_where(case)}; out stride={out.stride()}")
    if not torch.equal(x_before, bit_patterns(storage_of(x)).cpu()):
        raise AssertionError(f"{spec.name} modified its input storage when given out=\n  {_where(case)}")


@prop(FAMILY, "nan_guard_invisible")
def nan_guard_invisible(spec: KernelSpec, case: Case) -> None:
    x = case.tensors["x"]
    zero_guarded = same_layout(x, x, guard=0.0)
    diff = _first_diff(_run(spec, x), _run(spec, zero_guarded))
    if diff:
        raise AssertionError(f"{spec.name}: the NaN guard data around the view changes the output "
                             f"(vs the same view in zero guard data): {diff}\n  {_where(case)}")


def fit_to_declarations(spec: KernelSpec, case: Case) -> Case | None:
    """The case, if its rows are as long as the kernel declares it needs (min_n) and within its
    declared max_numel; else None (the suite rejects it: flashcheck.properties.fit.fitted)."""
    ok = case.tensors["x"].shape[-1] >= spec.min_n and within_declared_numel(spec, case.tensors)
    return case if ok else None


def refusable(case: Case) -> dict[str, str]:
    """The optional features a case uses, by the capability key that declares each (a clean refusal
    of one the kernel left undeclared is a skip: flashcheck.properties.refusals): rows past a plain length."""
    from flashcheck.properties.refusals import LONG

    n = case.tensors["x"].shape[-1]
    return {"max_n": f"rows of {n}"} if n > LONG else {}


# ---- what the engine asks a family (limits, declarations, the run's header) ----------------------

def feature_hint(spec: KernelSpec, tensors: dict[str, torch.Tensor], size: dict[str, int], flag: Any) -> str | None:
    """For a row that raised: its length, as Hypothesis shrinks it to the shortest that raises."""
    n = size.get("n", 0)
    if n < 2 or (spec.max_n is not None and n > spec.max_n):
        return None
    return (f"it raised on a row of n={n}; if it does not take rows that long, declare `max_n={n - 1}` "
            f"({flag('max_n', n - 1)})")

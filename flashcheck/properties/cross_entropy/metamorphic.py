"""Cross-entropy properties that make their own calls (`META_PROPERTIES`; no oracle needed for the
relation itself, the bounds for its tolerance: each side within its own derived bound of the same
exact value, so the two within both bounds and both oracles' half-ulp roundings).

* shift_invariant: loss and gradient of x + c equal those of x (no z-loss, no softcap), c keeping every
  x_i + c exact (the case's "shift"), within the bounds of x and of x + c.
* mean_is_sum_over_weights: "mean" = "sum" / sum of w_t over the counted rows (NaN when that is 0), and
  "sum" = the sum of "none", for the reductions the kernel takes.
* matches_log_softmax: loss_i = -w_t log_softmax(x)_t (no smoothing, z-loss or softcap), the
  registered log-softmax kernel's output within both families' bounds.
* nan_guard_invisible: the same views in zero guard data give the same loss and gradient bits.
* inplace_backward: with inplace_backward=True the gradient (written into the logits' storage) meets
  the gradient's bound and no element of that storage outside the logits' view changes.
"""
from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import torch

from flashcheck.families import prop
from flashcheck.fixtures.store import storage_of
from flashcheck.kernels.registry import PRODUCTION, KernelSpec
from flashcheck.oracles.formats import bit_patterns, format_of, to_float64, ulp_of
from flashcheck.oracles.log_softmax import log_softmax_bound, log_softmax_oracle
from flashcheck.properties.rowwise import first_diff, same_layout, shifted
from flashcheck.strategies.case import Case
from .outcome import FAMILY, Outcome, call_kwargs, describe, grad_call, off, options, unit_grad_output, value_line, \
    worst


def _half(r: np.ndarray, fmt) -> np.ndarray:
    """The oracle's own rounding: half an ulp of each correctly rounded value."""
    return 0.5 * ulp_of(np.where(np.isfinite(r), r, 0.0), fmt)


def _plain(spec: KernelSpec, case: Case, **override) -> torch.Tensor:
    loss = spec.fn(case.tensors["logits"], case.tensors["target"], **call_kwargs(spec, case, **override))
    if not isinstance(loss, torch.Tensor):
        raise AssertionError(f"{spec.name} returned {type(loss).__name__} as the loss, not a tensor")
    return loss


def _grad_output(case: Case, loss: torch.Tensor) -> torch.Tensor:
    go = case.tensors.get("grad_output")
    return unit_grad_output(loss) if go is None else go


def _light(spec: KernelSpec, case: Case, loss: torch.Tensor, grad, via, go) -> Outcome:
    """An Outcome of calls made here, for its oracles, bounds and messages."""
    return Outcome(spec, case, options(case), format_of(case.tensors["logits"].dtype), loss, loss, grad, via, go, {}, {})


@prop(FAMILY, "shift_invariant")
def shift_invariant(spec: KernelSpec, case: Case) -> None:
    x, c = case.tensors["logits"], float(case.tensors["shift"])
    x64 = to_float64(x)
    xs = shifted(x, c, case.label)
    loss0 = _plain(spec, case)
    go = _grad_output(case, loss0)
    l0, g0, via = grad_call(spec, case, x, go)
    l1, g1, _ = grad_call(spec, case, xs, go)
    o = _light(spec, case, l0, g0, via, go)
    r = o.loss_oracle()  # x and x + c have the same exact loss and gradient: one correctly rounded value
    b = o.loss_bound() + o.loss_bound(logits=x64 + c)
    got0, got1 = to_float64(l0).reshape(r.shape), to_float64(l1).reshape(r.shape)
    bad = np.where(np.isfinite(r), off(got1, got0, b), off(got1, r, b))
    if bad.any():
        idx = worst(got1, got0, b, bad)
        raise AssertionError(describe(o, f"loss(logits + {c!r}) differs from loss(logits) by more than both bounds",
                                      int(bad.sum()), bad.size,
                                      [value_line("shifted", idx, float(got1[idx]), float(got0[idx]), float(b[idx])),
                                       f"  (oracle {float(r[idx])!r}; 'oracle' above is the unshifted kernel's loss)"],
                                      row=idx[0] if idx else None))
    if g0 is None:
        return
    rg = o.grad_oracle()
    bg = o.grad_bound() + o.grad_bound(logits=x64 + c)
    a0, a1 = to_float64(g0), to_float64(g1)
    bad = np.where(np.isfinite(rg), off(a1, a0, bg), off(a1, rg, bg))
    if bad.any():
        i, j = worst(a1, a0, bg, bad)
        raise AssertionError(describe(o, f"gradient of logits + {c!r} differs from that of the logits by more than "
                                      f"both bounds", int(bad.sum()), bad.size,
                                      [value_line("shifted", (i, j), float(a1[i, j]), float(a0[i, j]), float(bg[i, j]))],
                                      row=i, col=j))


def _weight_sum(case: Case) -> Fraction:
    """sum of w_t over the rows not ignored, exactly."""
    target = case.tensors["target"].cpu().numpy()
    opts = options(case)
    w = to_float64(opts["weight"]) if opts["weight"] is not None else None
    return sum((Fraction(float(w[t])) if w is not None else Fraction(1) for t in target if t != opts["ignore_index"]),
               Fraction(0))


@prop(FAMILY, "mean_is_sum_over_weights")
def mean_is_sum_over_weights(spec: KernelSpec, case: Case) -> None:
    reds = spec.reductions
    if "sum" not in reds or not ({"mean", "none"} & set(reds)):
        return
    s = _plain(spec, case, reduction="sum")
    o = _light(spec, case, s, None, None, unit_grad_output(s))
    fmt = o.loss_fmt
    rs, bs = o.loss_oracle("sum"), o.loss_bound("sum")
    got_s = float(to_float64(s))
    checks = []
    if "mean" in reds:
        wt = _weight_sum(case)
        m = float(to_float64(_plain(spec, case, reduction="mean")))
        if wt == 0:
            if not math.isnan(m):
                raise AssertionError(describe(o, f"'mean' over rows whose weights sum to 0 (every target ignored or "
                                                 f"weighted 0) is {m!r}, not NaN (0/0, torch)", 1, 1, []))
        else:
            rm, bm = o.loss_oracle("mean"), o.loss_bound("mean")
            want = got_s / float(wt)
            tol = float(bm + _half(rm, fmt)) + float(bs + _half(rs, fmt)) / float(wt) + 2.0**-52 * abs(want)
            checks.append(("'mean'", m, want, tol, (math.isfinite(float(rm)), math.isfinite(float(rs))),
                           f"'sum' / sum of w_t = {got_s!r} / {float(wt)!r}"))
    if "none" in reds:
        per = to_float64(_plain(spec, case, reduction="none")).reshape(-1)
        rn, bn = o.loss_oracle("none"), o.loss_bound("none")
        want = math.fsum(per) if np.isfinite(per).all() else float(np.sum(per))
        tol = float(bs + _half(rs, fmt)) + float(np.sum(bn + _half(rn, fmt))) + 2.0**-52 * abs(want)
        checks.append(("'sum'", got_s, want, tol, (math.isfinite(float(rs)), bool(np.isfinite(rn).all())),
                       "the sum of 'none'"))
    for label, got, want, tol, (finite, parts_finite), what in checks:
        if finite != parts_finite:
            continue  # one side overflows the loss's format where the other does not (rows of 3e4 in fp16)
        ok = abs(got - want) <= tol if finite else (got == want or (math.isnan(got) and math.isnan(want)))
        if not ok:
            raise AssertionError(describe(o, f"{label} is not {what}", 1, 1,
                                          [f"  {label}={got!r} expected={want!r} |diff|={abs(got - want):.3g} "
                                           f"bound={tol:.3g} (both reductions' bounds)"]))


def log_softmax_kernel() -> KernelSpec | None:
    """The registered log-softmax kernel the relation is checked against (the production one)."""
    return next((s for s in PRODUCTION if s.family == "log_softmax"), None)


@prop(FAMILY, "matches_log_softmax")
def matches_log_softmax(spec: KernelSpec, case: Case) -> None:
    opts = options(case)
    ls = log_softmax_kernel()
    if ls is None or opts["label_smoothing"] or opts["z_loss"] or opts["softcap"] is not None:
        return
    red = next(r for r in ("none", "sum", "mean") if r in spec.reductions)
    logits, target = case.tensors["logits"], case.tensors["target"]
    if not ls.supports(logits.dtype, logits.shape[-1]):
        return
    loss = _plain(spec, case, reduction=red)
    o = _light(spec, case, loss, None, None, unit_grad_output(loss))
    y = ls.fn(logits)
    x64, y64, t = to_float64(logits), to_float64(y), target.cpu().numpy()
    yfmt = format_of(y.dtype)
    r_ls = log_softmax_oracle(x64, yfmt)
    b_ls = log_softmax_bound(x64, yfmt, depth=ls.summation_depth(x64.shape[1]), oracle=r_ls) + _half(r_ls, yfmt)
    w = to_float64(opts["weight"]) if opts["weight"] is not None else np.ones(x64.shape[1])
    counted = np.flatnonzero(t != opts["ignore_index"])
    rows = np.arange(len(t))
    tt = np.where(t != opts["ignore_index"], t, 0)
    want_rows = np.where(t != opts["ignore_index"], -w[tt] * y64[rows, tt], 0.0)
    tol_rows = np.where(t != opts["ignore_index"], w[tt] * b_ls[rows, tt], 0.0)
    fine = np.isfinite(r_ls[rows, tt]) | (t == opts["ignore_index"])
    r, b = o.loss_oracle(red), o.loss_bound(red)
    got = to_float64(loss).reshape(r.shape)
    tol_ce = b + _half(r, o.loss_fmt)
    if red == "none":
        check = fine & np.isfinite(r)
        bad = check & ~(np.abs(got - want_rows) <= tol_ce + tol_rows + 2.0**-52 * np.abs(want_rows))
        if bad.any():
            i = int(np.argmax(bad))
            raise AssertionError(describe(o, f"loss differs from -w_t log_softmax(logits)_t ({ls.name}) by more than "
                                             f"both bounds", int(bad.sum()), int(check.sum()),
                                          [f"  worst row {i}: loss={got[i]!r} -w_t log_softmax={want_rows[i]!r} "
                                           f"|diff|={abs(got[i] - want_rows[i]):.3g} bound={tol_ce[i] + tol_rows[i]:.3g}"],
                                          row=i))
        return
    if not (fine.all() and np.isfinite(r)):
        return
    div = float(_weight_sum(case)) if red == "mean" else 1.0
    if div == 0 or counted.size == 0:
        return
    want = math.fsum(want_rows) / div
    tol = float(tol_ce) + float(tol_rows.sum()) / div + 2.0**-50 * abs(want)
    if not abs(float(got) - want) <= tol:
        raise AssertionError(describe(o, f"'{red}' loss differs from the {red} of -w_t log_softmax(logits)_t "
                                         f"({ls.name}) by more than both bounds", 1, 1,
                                      [f"  loss={float(got)!r} expected={want!r} |diff|={abs(float(got) - want):.3g} "
                                       f"bound={tol:.3g}"]))


@prop(FAMILY, "nan_guard_invisible")
def nan_guard_invisible(spec: KernelSpec, case: Case) -> None:
    zero = {n: same_layout(t, t, guard=0.0) for n, t in case.tensors.items() if t.is_floating_point()}
    other = Case(tensors={**case.tensors, **zero}, kwargs=case.kwargs, label=case.label)
    loss = _plain(spec, case)
    go = _grad_output(case, loss)
    l0, g0, via = grad_call(spec, case, case.tensors["logits"], go)
    l1, g1, _ = grad_call(spec, other, other.tensors["logits"], zero.get("grad_output", go))
    diffs = [("loss", first_diff(l0, l1))] + ([("gradient", first_diff(g0, g1))] if g0 is not None else [])
    for what, diff in diffs:
        if diff:
            raise AssertionError(describe(_light(spec, case, l0, g0, via, go),
                                          f"the NaN guard data around the views changes the {what} (the same views "
                                          f"in zero guard data)", 1, 1, [f"  {diff}"]))


@prop(FAMILY, "inplace_backward")
def inplace_backward(spec: KernelSpec, case: Case) -> None:
    if not spec.inplace_backward:
        return
    logits = case.tensors["logits"]
    buf = storage_of(logits).clone()
    view = buf.as_strided(logits.shape, logits.stride(), logits.storage_offset())
    before = bit_patterns(buf).cpu().clone()
    loss = _plain(spec, case)
    go = _grad_output(case, loss)
    l1, g1, via = grad_call(spec, case, view, go, inplace_backward=True)
    if g1 is None:
        return
    after = bit_patterns(buf).cpu()
    inside = torch.zeros(after.numel(), dtype=torch.bool)
    idx = torch.arange(after.numel()).as_strided(view.shape, view.stride(), view.storage_offset())
    inside[idx.reshape(-1)] = True
    o = _light(spec, case, l1, g1, via, go)
    clobbered = (after != before) & ~inside
    if clobbered.any():
        k = int(torch.nonzero(clobbered)[0])
        raise AssertionError(describe(o, "with inplace_backward=True wrote guard elements outside the logits' view",
                                      int(clobbered.sum()), after.numel(),
                                      [f"  first at storage index {k} (view stride={view.stride()} "
                                       f"offset={view.storage_offset()})"]))
    r, b = o.grad_oracle(), o.grad_bound()
    got = to_float64(g1)
    bad = off(got, r, b)
    if bad.any():
        i, j = worst(got, r, b, bad)
        raise AssertionError(describe(o, f"gradient with inplace_backward=True ({via}) exceeds the derived error bound",
                                      int(bad.sum()), bad.size,
                                      [value_line("kernel", (i, j), float(got[i, j]), float(r[i, j]), float(b[i, j]))],
                                      row=i, col=j))

"""The cross-entropy properties checked on every case of every class (`CORE_PROPERTIES`): one plain
call and one gradient call (`outcome`) serve them all.

* input_untouched: the logits', targets', weights' and grad_output's whole storages are unchanged
  (a gradient written into the logits without inplace_backward is caught here).
* loss_matches_oracle: both calls' losses within `cross_entropy_loss_error` of the correctly rounded
  loss (special values exactly).
* grad_matches_oracle: the gradient within `cross_entropy_grad_error` of the correctly rounded one.
* grad_rows_sum: without a softcap each counted row's gradient sums to g 2 z lse exactly (0 without a
  z-loss, with weights and smoothing too), within the sum of its elements' bounds.
* loss_nonnegative: no loss below 0 (every term of the function is >= 0) where the oracle's is a number.
"""
from __future__ import annotations

import math

import numpy as np
import torch

from flashcheck.families import margin, prop
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.formats import to_float64
from flashcheck.oracles.bounds import row_sum_bound
from flashcheck.oracles.log_softmax import lse_rows
from flashcheck.strategies.case import Case
from .outcome import FAMILY, describe, off, outcome, value_line, worst


@prop(FAMILY, "input_untouched")
def input_untouched(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    for name in o.before:
        if not torch.equal(o.before[name], o.after[name]):
            changed = int((o.before[name] != o.after[name]).sum())
            raise AssertionError(describe(o, f"modified its input {name}'s storage (inplace_backward not asked)",
                                          changed, o.before[name].numel(), ["  (bytes changed, of its storage)"]))


def _loss_check(o, loss: torch.Tensor, label: str) -> None:
    r, b = o.loss_oracle(), o.loss_bound()
    got = to_float64(loss).reshape(r.shape)
    bad = off(got, r, b)
    if bad.any():
        idx = worst(got, r, b, bad)
        row = idx[0] if idx else None
        raise AssertionError(describe(o, f"loss ({label}) exceeds the derived error bound", int(bad.sum()), bad.size,
                                      [value_line("kernel", idx, float(got[idx]), float(r[idx]), float(b[idx]))],
                                      row=row))


@prop(FAMILY, "loss_matches_oracle")
def loss_matches_oracle(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    _loss_check(o, o.loss, "plain call")
    if o.grad_loss is not None:
        _loss_check(o, o.grad_loss, f"{o.via or 'the call'} with logits requiring grad")


@margin(FAMILY, "loss_matches_oracle")
def loss_margin(spec: KernelSpec, case: Case) -> float:
    o = outcome(spec, case)
    r, b = o.loss_oracle(), o.loss_bound()
    got = to_float64(o.loss).reshape(r.shape)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(np.isfinite(r) & (b > 0), np.abs(got - r) / np.where(b > 0, b, 1.0), 0.0)
    return float(np.nanmax(ratio, initial=0.0))


@prop(FAMILY, "grad_matches_oracle")
def grad_matches_oracle(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    if o.grad is None:
        return  # told once at the end of the run (outcome.no_gradient_note)
    r, b = o.grad_oracle(), o.grad_bound()
    got = to_float64(o.grad)
    bad = off(got, r, b)
    if bad.any():
        i, j = worst(got, r, b, bad)
        raise AssertionError(describe(o, f"gradient ({o.via}) exceeds the derived error bound", int(bad.sum()), bad.size,
                                      [value_line("kernel", (i, j), float(got[i, j]), float(r[i, j]), float(b[i, j])),
                                       f"  grad_output {o.grad_output.tolist() if o.grad_output.numel() <= 8 else '...'}"],
                                      row=i, col=j))


@prop(FAMILY, "grad_rows_sum")
def grad_rows_sum(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    if o.grad is None or o.opts["softcap"] is not None:
        return  # a softcap's chain factors weight each element differently: no row identity
    r, b = o.grad_oracle(), o.grad_bound()
    got = to_float64(o.grad)
    x = to_float64(case.tensors["logits"])
    target = case.tensors["target"].cpu().numpy()
    z, red = o.opts["z_loss"], o.opts["reduction"]
    go = to_float64(o.grad_output).reshape(-1)
    counted = (target != o.opts["ignore_index"]) & np.isfinite(r).all(axis=1)
    m, _, _, L, _, _ = lse_rows(x)
    m, L = m[:, 0], L[:, 0]
    lse = m + L  # float64: L from a sum of n exponentials, off by (n + 4) 2^-53 (|m| + L + 1) at most
    if red == "mean":
        w = to_float64(o.opts["weight"]) if o.opts["weight"] is not None else np.ones(x.shape[1])
        wt = math.fsum(w[t] for t in target[target != o.opts["ignore_index"]])
        g = np.full(x.shape[0], go[0] / wt if wt else np.nan)
    else:
        g = go if red == "none" else np.full(x.shape[0], go[0])
    exact = g * 2 * z * lse
    known = np.abs(exact) * 8 * 2.0**-53 + np.abs(g) * 2 * z * (x.shape[1] + 4) * 2.0**-53 * (np.abs(m) + L + 1)
    sums = np.array([math.fsum(row) if np.isfinite(row).all() else np.nan for row in got])
    allowed = row_sum_bound(b, r, o.fmt, known=known, got=np.nan_to_num(sums))
    bad_rows = counted & ~(np.abs(sums - exact) <= allowed)
    if bad_rows.any():
        i = int(np.argmax(bad_rows))
        raise AssertionError(describe(o, f"gradient ({o.via}) rows do not sum to g 2 z lse", int(bad_rows.sum()),
                                      int(counted.sum()),
                                      [f"  worst row {i}: sum={sums[i]!r} exact={exact[i]!r} |diff|="
                                       f"{abs(sums[i] - exact[i]):.3g} bound={allowed[i]:.3g} (the sum of its "
                                       f"elements' bounds)"], row=i, col=int(np.argmax(np.abs(got[i] - r[i]))
                                                                            if np.isfinite(got[i]).all() else 0)))


@prop(FAMILY, "loss_nonnegative")
def loss_nonnegative(spec: KernelSpec, case: Case) -> None:
    o = outcome(spec, case)
    r = o.loss_oracle()
    for loss, label in ((o.loss, "plain call"), (o.grad_loss, o.via or "the gradient's call")):
        if loss is None:
            continue
        got = to_float64(loss).reshape(r.shape)
        bad = ~np.isnan(r) & ~(got >= 0)
        if bad.any():
            idx = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.ndim else ()
            raise AssertionError(describe(o, f"loss ({label}) below 0", int(bad.sum()), bad.size,
                                          [f"  at {list(idx)}: kernel={float(got[idx])!r} oracle={float(r[idx])!r} "
                                           f"(every term of the loss is >= 0)"], row=idx[0] if idx else None))

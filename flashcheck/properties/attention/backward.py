"""The attention backward's properties (BACKWARD_PROPERTIES, NUMERICS.md section 10): dq, dk, dv
of a kernel that has a backward, against the certified oracle within the derived bound, and against
themselves.

A kernel's gradients come from autograd when its output carries a graph (`AttentionSpec.autograd`;
None: found out on the first call), else from its declared `backward_fn(q, k, v, o, lse, do, **kw)`
given the forward's own o and lse. A forward-only kernel is not failed for lacking a backward: the
test is skipped with one line saying so. One backward per case serves every property (`gradients`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from flashcheck.families import prop
from flashcheck.fixtures.store import storage_snapshot
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.attention_backward import AttentionBackward, attention_backward_quantities
from flashcheck.oracles.attention_backward_bound import attention_backward_bound
from flashcheck.oracles.formats import Format, format_of, same_bits, to_float64
from flashcheck.strategies.attention import case_inputs
from flashcheck.strategies.case import Case
from flashcheck.properties.attention.outcome import FAMILY, ORACLE_KEYS

NAMES = ("dq", "dk", "dv")
#: What a case's dO is called among its tensors (strategies/attention_backward.py).
DO = "do"


class NoBackward(Exception):
    """The kernel has no backward to check (a forward-only kernel): a skip, not a failure."""


@dataclass
class Gradients:
    """One dense attention problem's gradients from the kernel, and (lazily) the oracle's."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    kw: dict
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    fmt: Format
    block_m: int
    block_n: int
    how: str  # "autograd" or "backward_fn"
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)
    _bwd: AttentionBackward | None = None
    _bound: tuple | None = None

    @property
    def oracle(self) -> AttentionBackward:
        if self._bwd is None:
            self._bwd = attention_backward_quantities(self.q, self.k, self.v, self.do,
                                                      **{k: v for k, v in self.kw.items() if k in ORACLE_KEYS})
        return self._bwd

    @property
    def bound(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._bound is None:
            self._bound = attention_backward_bound(self.oracle, block_m=self.block_m, block_n=self.block_n)
        return self._bound


def _forward(spec: KernelSpec, q, k, v, kw: dict, want_lse: bool):
    res = spec.fn(q, k, v, **kw, **({"return_lse": True} if want_lse else {}))
    if want_lse:
        if not isinstance(res, (tuple, list)) or len(res) != 2:
            raise AssertionError(f"return_lse=True must give (out, lse), got {type(res).__name__}")
        return res[0], res[1]
    return (res[0] if isinstance(res, (tuple, list)) else res), None


def run_backward(spec: KernelSpec, q, k, v, do, kw: dict) -> tuple[tuple[torch.Tensor, ...], str]:
    """(dq, dk, dv) of the kernel for these inputs and output gradient, and how they were had."""
    if spec.autograd is not False:
        # detach() keeps each input's storage, strides and offset: the backward sees the drawn layout
        leaves = [t.detach().requires_grad_(True) for t in (q, k, v)]
        with torch.enable_grad():
            out, _ = _forward(spec, *leaves, kw, False)
            if isinstance(out, torch.Tensor) and out.grad_fn is not None:
                grads = torch.autograd.grad(out, leaves, do, allow_unused=True)
                return tuple(torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)), "autograd"
        if spec.autograd:
            raise AssertionError(f"{spec.name} declares autograd=True but its output carries no autograd graph")
    if spec.backward_fn is not None:
        out, lse = _forward(spec, q, k, v, kw, True)
        grads = spec.backward_fn(q, k, v, out, lse, do, **kw)
        if not isinstance(grads, (tuple, list)) or len(grads) != 3:
            raise AssertionError(f"{spec.name}'s backward_fn must return (dq, dk, dv), got {type(grads).__name__}")
        return tuple(grads), "backward_fn"
    raise NoBackward(f"{spec.name} is forward-only (its output carries no autograd graph and it declares no "
                     f"backward_fn): its backward is not checked")


_last: tuple[str, Case, Gradients] | None = None


def gradients(spec: KernelSpec, case: Case) -> Gradients:
    global _last
    if _last is not None and _last[0] == spec.name and _last[1] is case:
        return _last[2]
    q, k, v, kw = case_inputs(case)
    do = case.tensors[DO]
    before = {n: storage_snapshot(t) for n, t in case.tensors.items()}
    try:
        grads, how = run_backward(spec, q, k, v, do, kw)
    except NoBackward as e:
        pytest.skip(str(e))
    bm, bn = spec.backward_blocks(q.shape[-1], q.shape[2], k.shape[2], q.dtype, kw)
    g = Gradients(q, k, v, do, kw, grads, format_of(q.dtype), bm, bn, how, before)
    g.after = {n: storage_snapshot(t) for n, t in case.tensors.items()}
    _last = (spec.name, case, g)
    return g


def _describe(spec: KernelSpec, case: Case, g: Gradients, name: str, bad: np.ndarray, what: str,
              actual: np.ndarray, expected: np.ndarray | None = None, err: np.ndarray | None = None,
              bound: np.ndarray | None = None) -> str:
    score = np.where(bad, np.nan_to_num(err, nan=np.inf) if err is not None else 1.0, -1.0)
    idx = tuple(map(int, np.unravel_index(int(np.argmax(score)), score.shape)))
    shapes = "; ".join(f"{n} {tuple(t.shape)} stride={t.stride()}" for n, t in
                       (("q", g.q), ("k", g.k), ("v", g.v), ("do", g.do)))
    opts = " ".join(f"{k}={v.tolist() if isinstance(v, torch.Tensor) and v.numel() <= 8 else v}"
                    for k, v in g.kw.items())
    return "\n".join([
        f"{spec.name} [{g.fmt.name}] {name} ({g.how}) {what}: {int(bad.sum())} of {bad.size} elements ({case.label})",
        f"  {shapes}; {opts}; backward blocks {g.block_m}x{g.block_n}",
        f"  worst at {list(idx)}: kernel={float(actual[idx])!r}"
        + (f" expected={float(expected[idx])!r}" if expected is not None else "")
        + (f" |err|={float(err[idx]):.4g} bound={float(bound[idx]):.4g}" if err is not None else "")])


# ---- properties --------------------------------------------------------------------------------

@prop(FAMILY, "backward_contract")
def backward_contract(spec: KernelSpec, case: Case) -> None:
    """dq, dk, dv have their input's shape, dtype and device; the inputs and dO are left untouched."""
    g = gradients(spec, case)
    for name, grad, like in zip(NAMES, g.grads, (g.q, g.k, g.v)):
        if not isinstance(grad, torch.Tensor) or grad.shape != like.shape or grad.dtype != like.dtype \
                or grad.device.type != like.device.type:
            got = f"{tuple(grad.shape)} {grad.dtype}" if isinstance(grad, torch.Tensor) else type(grad).__name__
            raise AssertionError(f"{spec.name} gave {name} {got}, expected {tuple(like.shape)} {like.dtype} "
                                 f"({case.label})")
    for name, b in g.before.items():
        if not torch.equal(b, g.after[name]):
            raise AssertionError(f"{spec.name}'s backward modified the storage of {name} "
                                 f"({int((b != g.after[name]).sum())} bytes; {case.label})")


@prop(FAMILY, "backward_matches_oracle")
def backward_matches_oracle(spec: KernelSpec, case: Case) -> None:
    """Every element of dq, dk, dv within the derived bound of the correctly rounded gradient;
    exact specials (NaN where the exact gradient is NaN, the exact zeros of padded, masked and
    invisible keys and of fully masked rows) exactly."""
    g = gradients(spec, case)
    oracle = g.oracle
    for name, grad, want, bound in zip(NAMES, g.grads, oracle.grads, g.bound):
        if grad.numel() == 0:
            continue
        got = to_float64(grad)
        err = np.abs(got - want)
        ok = (np.isnan(got) & np.isnan(want)) | (got == want) | (err <= bound)
        if not ok.all():
            raise AssertionError(_describe(spec, case, g, name, ~ok, "exceeds the backward bound", got,
                                           expected=want, err=np.where(np.isnan(err), np.inf, err), bound=bound))


@prop(FAMILY, "backward_deterministic")
def backward_deterministic(spec: KernelSpec, case: Case) -> None:
    """A kernel that declares deterministic_backward gives the same bits on a second backward."""
    if not spec.deterministic_backward:
        return
    g = gradients(spec, case)
    again, _ = run_backward(spec, g.q, g.k, g.v, g.do, g.kw)
    for name, a, b in zip(NAMES, g.grads, again):
        same = same_bits(a, b, nan_payloads=True)
        if not bool(same.all()):
            raise AssertionError(_describe(spec, case, g, name, ~same.cpu().numpy(),
                                           "differs between two identical backward runs", to_float64(a),
                                           expected=to_float64(b)))


@prop(FAMILY, "backward_linear_in_do")
def backward_linear_in_do(spec: KernelSpec, case: Case) -> None:
    """dv = P^T dO is linear in dO, and doubling dO is exact in every format: dv(2 dO) has exactly
    twice dv(dO)'s bits wherever both are normal and finite (a subnormal halves its precision)."""
    g = gradients(spec, case)
    do2 = g.do * 2
    if not torch.isfinite(do2[torch.isfinite(g.do)]).all():
        return  # doubling overflowed dO itself: nothing linear to check
    again, _ = run_backward(spec, g.q, g.k, g.v, do2, g.kw)
    one, two = to_float64(g.grads[2]), to_float64(again[2])
    fmt = g.fmt
    normal = (np.abs(one) >= fmt.min_normal) & np.isfinite(one) & np.isfinite(two) & (np.abs(two) <= fmt.max_finite / 2)
    bad = normal & (two != 2 * one)
    if bad.any():
        raise AssertionError(_describe(spec, case, g, "dv", bad, "is not exactly doubled by doubling dO", two,
                                       expected=2 * one))


BACKWARD_PROPERTIES = ("backward_contract", "backward_matches_oracle", "backward_deterministic",
                       "backward_linear_in_do")

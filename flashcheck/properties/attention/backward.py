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
from flashcheck.strategies.attention import case_inputs, is_varlen, varlen_inputs, varlen_sequences
from flashcheck.strategies.case import Case
from flashcheck.properties.attention.outcome import FAMILY, ORACLE_KEYS, _split, blocking

NAMES = ("dq", "dk", "dv")
#: What a case's dO is called among its tensors (strategies/attention_backward.py).
DO = "do"


class NoBackward(Exception):
    """The kernel has no backward to check (a forward-only kernel): a skip, not a failure."""


@dataclass
class Part:
    """One dense problem of a case (the case itself, or one sequence of a varlen batch): its inputs,
    the kernel's gradients for it, and (lazily) the oracle and the bound."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    do: torch.Tensor
    kw: dict
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    fmt: Format
    block_m: int
    block_n: int
    forward_blocks: tuple[int, int]  # (block_n, n_blocks) of the forward that saved o and lse
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
            self._bound = attention_backward_bound(self.oracle, block_m=self.block_m, block_n=self.block_n,
                                                   forward_blocks=self.forward_blocks)
        return self._bound


@dataclass
class Gradients:
    """A case's gradients from the kernel (dense, or packed as its varlen inputs) and its dense parts."""

    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    do: torch.Tensor
    grads: tuple[torch.Tensor, torch.Tensor, torch.Tensor]
    how: str  # "autograd" or "backward_fn"
    fmt: Format
    parts: list[Part] = field(default_factory=list)
    before: dict = field(default_factory=dict)
    after: dict = field(default_factory=dict)


def _forward(fn, args, kw: dict, want_lse: bool):
    res = fn(*args, **kw, **({"return_lse": True} if want_lse else {}))
    if want_lse:
        return _split(res, True)
    return (res[0] if isinstance(res, (tuple, list)) else res), None


def _entry(spec: KernelSpec, case: Case) -> tuple:
    """(forward entry point, its positional tensors, keywords) of a case, dense or varlen."""
    if is_varlen(case):
        args, kw = varlen_inputs(case)
        return spec.varlen_fn, args, kw
    q, k, v, kw = case_inputs(case)
    return spec.fn, (q, k, v), kw


def run_backward(spec: KernelSpec, case: Case, do: torch.Tensor | None = None) -> tuple[tuple[torch.Tensor, ...], str]:
    """(dq, dk, dv) of the kernel on a case for the output gradient do (the case's own by default),
    and how they were had."""
    fn, args, kw = _entry(spec, case)
    do = case.tensors[DO] if do is None else do
    refused = ""
    if spec.autograd is not False:
        # detach() keeps each input's storage, strides and offset: the backward sees the drawn layout
        leaves = [t.detach().requires_grad_(True) for t in args[:3]]
        with torch.enable_grad():
            try:
                out, _ = _forward(fn, (*leaves, *args[3:]), kw, False)
            except Exception as e:
                if spec.autograd:
                    raise
                # a forward-only kernel may refuse inputs that require grad (ours did): if it takes
                # the same inputs without, it has no backward to check, which is not a failure
                _forward(fn, args, kw, False)
                out, refused = None, f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
            else:
                refused = ""
            if isinstance(out, torch.Tensor) and out.grad_fn is not None:
                grads = torch.autograd.grad(out, leaves, do, allow_unused=True)
                return tuple(torch.zeros_like(t) if g is None else g for t, g in zip(leaves, grads)), "autograd"
        if spec.autograd:
            raise AssertionError(f"{spec.name} declares autograd=True but its output carries no autograd graph")
    if spec.backward_fn is not None:
        if is_varlen(case):
            raise NoBackward(f"{spec.name}'s backward_fn is dense only: varlen backward not checked")
        out, lse = _forward(fn, args, kw, True)
        grads = spec.backward_fn(*args, out, lse, do, **kw)
        if not isinstance(grads, (tuple, list)) or len(grads) != 3:
            raise AssertionError(f"{spec.name}'s backward_fn must return (dq, dk, dv), got {type(grads).__name__}")
        return tuple(grads), "backward_fn"
    why = f"refuses inputs that require grad ({refused})" if spec.autograd is not False and refused \
        else "its output carries no autograd graph"
    raise NoBackward(f"{spec.name} is forward-only ({why}; no backward_fn declared): its backward is not checked")


def _parts(spec: KernelSpec, case: Case, grads: tuple, fmt: Format) -> list[Part]:
    """The dense problems a case stands for, each with its slice of the kernel's gradients."""
    if not is_varlen(case):
        q, k, v, kw = case_inputs(case)
        bm, bn = spec.backward_blocks(q.shape[-1], v.shape[-1], q.shape[2], k.shape[2], q.dtype, kw)
        fwd = blocking(spec, q.shape[-1], k.shape[2], q.dtype, kw)
        return [Part(q, k, v, case.tensors[DO], kw, grads, fmt, bm, bn, fwd)]
    kw, seqs = varlen_sequences(case)
    ck = case.tensors["cu_seqlens_k"].tolist()
    dense = lambda x: x.transpose(0, 1)[None]  # noqa: E731  (packed (len, H, D) -> (1, H, len, D))
    out = []
    for b, (rows, q, k, v, _) in enumerate(seqs):
        keys = slice(ck[b], ck[b + 1])
        # one launch is sized for the longest sequences: their blocking (conservative for this one)
        bm, bn = spec.backward_blocks(q.shape[-1], v.shape[-1], int(case.kwargs["max_seqlen_q"]),
                                      int(case.kwargs["max_seqlen_k"]), q.dtype, kw)
        fwd = blocking(spec, q.shape[-1], int(case.kwargs["max_seqlen_k"]), q.dtype, kw)
        out.append(Part(q, k, v, dense(case.tensors[DO][rows]), kw,
                        (dense(grads[0][rows]), dense(grads[1][keys]), dense(grads[2][keys])), fmt, bm, bn, fwd))
    return out


_last: tuple[str, Case, Gradients] | None = None


def gradients(spec: KernelSpec, case: Case) -> Gradients:
    global _last
    if _last is not None and _last[0] == spec.name and _last[1] is case:
        return _last[2]
    before = {n: storage_snapshot(t) for n, t in case.tensors.items()}
    try:
        grads, how = run_backward(spec, case)
    except NoBackward as e:
        pytest.skip(str(e))
    _, args, _ = _entry(spec, case)
    fmt = format_of(args[0].dtype)
    g = Gradients(tuple(args[:3]), case.tensors[DO], grads, how, fmt, before=before)
    g.after = {n: storage_snapshot(t) for n, t in case.tensors.items()}
    if all(isinstance(x, torch.Tensor) and x.shape == t.shape for x, t in zip(grads, g.inputs)):
        g.parts = _parts(spec, case, grads, fmt)
    _last = (spec.name, case, g)
    return g


def _describe(spec: KernelSpec, case: Case, g: Gradients, name: str, bad: np.ndarray, what: str,
              actual: np.ndarray, expected: np.ndarray | None = None, err: np.ndarray | None = None,
              bound: np.ndarray | None = None, part: Part | None = None) -> str:
    score = np.where(bad, np.nan_to_num(err, nan=np.inf) if err is not None else 1.0, -1.0)
    idx = tuple(map(int, np.unravel_index(int(np.argmax(score)), score.shape)))
    shapes = "; ".join(f"{n} {tuple(t.shape)} stride={t.stride()}" for n, t in
                       zip(("q", "k", "v", "do"), (*g.inputs, g.do)))
    opts = " ".join(f"{k}={v.tolist() if isinstance(v, torch.Tensor) and v.numel() <= 8 else v}"
                    for k, v in case.kwargs.items())
    where = ""
    if part is not None:
        where = f"; backward blocks {part.block_m}x{part.block_n}"
        if len(g.parts) > 1:
            where += f"; sequence {g.parts.index(part)} of {len(g.parts)} (its own indices)"
    return "\n".join([
        f"{spec.name} [{g.fmt.name}] {name} ({g.how}) {what}: {int(bad.sum())} of {bad.size} elements ({case.label})",
        f"  {shapes}; {opts}{where}",
        f"  worst at {list(idx)}: kernel={float(actual[idx])!r}"
        + (f" expected={float(expected[idx])!r}" if expected is not None else "")
        + (f" |err|={float(err[idx]):.4g} bound={float(bound[idx]):.4g}" if err is not None else "")])


# ---- properties --------------------------------------------------------------------------------

@prop(FAMILY, "backward_contract")
def backward_contract(spec: KernelSpec, case: Case) -> None:
    """dq, dk, dv have their input's shape, dtype and device; the inputs and dO are left untouched."""
    g = gradients(spec, case)
    for name, grad, like in zip(NAMES, g.grads, g.inputs):
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
    for part in g.parts:
        for name, grad, want, bound in zip(NAMES, part.grads, part.oracle.grads, part.bound):
            if grad.numel() == 0:
                continue
            got = to_float64(grad)
            err = np.abs(got - want)
            ok = (np.isnan(got) & np.isnan(want)) | (got == want) | (err <= bound)
            if not ok.all():
                raise AssertionError(_describe(spec, case, g, name, ~ok, "exceeds the backward bound", got,
                                               expected=want, err=np.where(np.isnan(err), np.inf, err), bound=bound,
                                               part=part))


@prop(FAMILY, "backward_deterministic")
def backward_deterministic(spec: KernelSpec, case: Case) -> None:
    """A kernel that declares deterministic_backward gives the same bits on a second backward."""
    g = gradients(spec, case)  # first: a forward-only kernel is skipped as such
    if not spec.deterministic_backward:
        pytest.skip(f"{spec.name} does not declare deterministic_backward: run-to-run bits not compared")
    again, _ = run_backward(spec, case)
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
    again, _ = run_backward(spec, case, do2)
    one, two = to_float64(g.grads[2]), to_float64(again[2])
    fmt = g.fmt
    normal = (np.abs(one) >= fmt.min_normal) & np.isfinite(one) & np.isfinite(two) & (np.abs(two) <= fmt.max_finite / 2)
    bad = normal & (two != 2 * one)
    if bad.any():
        raise AssertionError(_describe(spec, case, g, "dv", bad, "is not exactly doubled by doubling dO", two,
                                       expected=2 * one))


BACKWARD_PROPERTIES = ("backward_contract", "backward_matches_oracle", "backward_deterministic",
                       "backward_linear_in_do")

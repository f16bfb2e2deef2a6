"""One cross-entropy kernel on one case: the calls the core properties share, the oracles and bounds
(each computed once), and failure messages in the style of torch.testing.assert_close.

The calls: the loss from a plain call (logits not requiring grad: a kernel returning 0 there, Liger
#507, is caught), and the loss and gradient from a second call, through autograd when its loss carries
a grad_fn (backward with the case's grad_output, ones when it has none), else through the declared
`with_grad(logits, target, grad_output, **options)`. A kernel with neither has no gradient checked:
one line says so at the end of the run (`flashcheck.properties.tally.note`), and no property fails
for it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from flashcheck.families import get as family_record
from flashcheck.fixtures.store import storage_snapshot
from flashcheck.kernels.registry import KernelSpec
from flashcheck.oracles.cross_entropy import cross_entropy_grad_oracle
from flashcheck.oracles.cross_entropy_bound import cross_entropy_full_grad_bound
from flashcheck.oracles.formats import FORMATS, Format, format_of, to_float64
from flashcheck.properties.rowwise import compact, where
from flashcheck.properties.tally import note
from flashcheck.strategies.case import Case

FAMILY = "cross_entropy"
IGNORE_INDEX = -100
#: What an option asks for nothing at (torch's defaults): passed to a kernel only when it asks for
#: something or the kernel declares the option (so a KernelSpec without the keyword is called without it).
DEFAULTS: dict[str, Any] = {"ignore_index": IGNORE_INDEX, "label_smoothing": 0.0, "reduction": "mean",
                            "z_loss": 0.0, "softcap": None}
FIELD = {"ignore_index": "ignore_index", "label_smoothing": "label_smoothing", "z_loss": "z_loss",
         "softcap": "softcap"}


def options(case: Case) -> dict[str, Any]:
    """The case's options as the oracles take them (weight from its tensor, when drawn)."""
    out = {k: case.kwargs.get(k, v) for k, v in DEFAULTS.items()}
    out["weight"] = case.tensors.get("weight")
    return out


def call_kwargs(spec: KernelSpec, case: Case, **override: Any) -> dict[str, Any]:
    """The keywords the kernel gets: each option that asks for something, or that it declares."""
    opts = {**options(case), **override}
    kw: dict[str, Any] = {}
    for key, default in DEFAULTS.items():
        value = opts[key]
        declared = len(spec.reductions) > 1 or spec.reductions != ("mean",) if key == "reduction" else \
            bool(getattr(spec, FIELD[key]))
        if value != default or (declared and value is not None):
            kw[key] = value
    if opts["weight"] is not None:
        kw["weight"] = opts["weight"]
    if opts.get("inplace_backward"):
        kw["inplace_backward"] = True
    return kw


def unit_grad_output(loss: torch.Tensor) -> torch.Tensor:
    return torch.ones(loss.shape, dtype=loss.dtype, device=loss.device)


@dataclass
class Outcome:
    spec: KernelSpec
    case: Case
    opts: dict[str, Any]
    fmt: Format  # the logits' (the gradient's)
    loss: torch.Tensor  # from the plain call
    grad_loss: torch.Tensor | None  # from the gradient's call
    grad: torch.Tensor | None
    via: str | None  # "autograd", "with_grad", or None (not checked)
    grad_output: torch.Tensor
    before: dict[str, torch.Tensor]
    after: dict[str, torch.Tensor]
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def loss_fmt(self) -> Format:
        return format_of(self.loss.dtype)

    def model(self) -> dict[str, Any]:
        """The bound's model of the kernel: its blocking and arithmetic (CrossEntropySpec)."""
        n_chunks, block = self.spec.blocking(self.case.tensors["logits"].shape[-1])
        return {"n_chunks": n_chunks, "block": block, "natural": self.spec.arithmetic == "natural"}

    def loss_oracle(self, reduction: str | None = None) -> np.ndarray:
        key = f"loss:{reduction or self.opts['reduction']}"
        if key not in self.cache:
            opts = {**self.opts, **({"reduction": reduction} if reduction else {})}
            self.cache[key] = np.asarray(family_record(FAMILY).function("oracle")(
                self.case.tensors["logits"], self.case.tensors["target"], self.loss_fmt, **opts), dtype=np.float64)
        return self.cache[key]

    def loss_bound(self, reduction: str | None = None, logits: Any = None) -> np.ndarray:
        opts = {**self.opts, **({"reduction": reduction} if reduction else {})}
        return np.asarray(family_record(FAMILY).function("bound")(
            self.case.tensors["logits"] if logits is None else logits, self.case.tensors["target"], self.loss_fmt,
            oracle=self.loss_oracle(reduction), **self.model(), **opts), dtype=np.float64)

    def grad_oracle(self) -> np.ndarray:
        if "grad" not in self.cache:
            self.cache["grad"] = cross_entropy_grad_oracle(self.case.tensors["logits"], self.case.tensors["target"],
                                                           self.fmt, self.grad_output, **self.opts)
        return self.cache["grad"]

    def grad_bound(self, logits: Any = None) -> np.ndarray:
        # through autograd the fused kernels store the unit-scale gradient and scale it after (rescaled)
        return cross_entropy_full_grad_bound(self.case.tensors["logits"] if logits is None else logits,
                                             self.case.tensors["target"], self.fmt, grad_output=to_float64(self.grad_output),
                                             rescaled=self.via == "autograd", oracle=self.grad_oracle(),
                                             **self.model(), **self.opts)


def _check_loss(spec: KernelSpec, case: Case, loss: Any, what: str) -> torch.Tensor:
    n = case.tensors["logits"].shape[0]
    want = (n,) if case.kwargs.get("reduction", "mean") == "none" else ()
    if not isinstance(loss, torch.Tensor):
        raise AssertionError(f"{spec.name} returned {type(loss).__name__} as the loss ({what}), not a tensor")
    if tuple(loss.shape) != want or loss.dtype not in FORMATS:
        raise AssertionError(f"{spec.name} returned a loss of {tuple(loss.shape)} {loss.dtype} ({what}), expected "
                             f"{want} in a float dtype (the logits': torch's semantics)")
    return loss


def grad_call(spec: KernelSpec, case: Case, logits: torch.Tensor, grad_output: torch.Tensor,
              **override: Any) -> tuple[torch.Tensor, torch.Tensor | None, str | None]:
    """(loss, gradient, how): autograd when the loss carries a grad_fn, else `with_grad`, else no gradient."""
    kw = call_kwargs(spec, case, **override)
    leaf = logits.detach().requires_grad_(True)
    with torch.enable_grad():
        loss = _check_loss(spec, case, spec.fn(leaf, case.tensors["target"], **kw), "logits requiring grad")
        if loss.grad_fn is not None:
            loss.backward(grad_output.to(loss.dtype))
            if leaf.grad is None:
                raise AssertionError(f"{spec.name}'s loss carries a grad_fn, but no gradient reaches the logits")
            return loss.detach(), leaf.grad, "autograd"
    if spec.with_grad is None:
        return loss.detach(), None, None
    out = spec.with_grad(logits, case.tensors["target"], grad_output, **kw)
    if not (isinstance(out, (tuple, list)) and len(out) == 2):
        raise AssertionError(f"{spec.name}'s with_grad returned {type(out).__name__}, not (loss, grad)")
    loss, grad = _check_loss(spec, case, out[0], "with_grad"), out[1]
    if not isinstance(grad, torch.Tensor) or tuple(grad.shape) != tuple(logits.shape) or grad.dtype != logits.dtype:
        raise AssertionError(f"{spec.name}'s with_grad returned a gradient of {tuple(getattr(grad, 'shape', ()))} "
                             f"{getattr(grad, 'dtype', type(grad).__name__)}, expected the logits' "
                             f"{tuple(logits.shape)} {logits.dtype}")
    return loss, grad, "with_grad"


def no_gradient_note(spec: KernelSpec) -> str:
    return (f"flashcheck: {spec.name}: its gradient was not checked: the loss it returns carries no grad_fn and it "
            f"declares no with_grad (fn(logits, target, grad_output, **options) -> (loss, grad))")


_last: tuple[str, Case, Outcome] | None = None


def outcome(spec: KernelSpec, case: Case) -> Outcome:
    """The calls on a case, once for every core property checked on it."""
    global _last
    if _last is not None and _last[0] == spec.name and _last[1] is case:
        return _last[2]
    logits, target = case.tensors["logits"], case.tensors["target"]
    before = {n: storage_snapshot(t) for n, t in case.tensors.items()}
    loss = _check_loss(spec, case, spec.fn(logits, target, **call_kwargs(spec, case)), "plain call")
    go = case.tensors.get("grad_output")
    go = unit_grad_output(loss) if go is None else go
    grad_loss, grad, via = grad_call(spec, case, logits, go)
    if via is None:
        note(no_gradient_note(spec))
    o = Outcome(spec, case, options(case), format_of(logits.dtype), loss, grad_loss, grad, via, go, before,
                {n: storage_snapshot(t) for n, t in case.tensors.items()})
    _last = (spec.name, case, o)
    return o


# ---- comparisons and messages ------------------------------------------------------------------

def off(got: np.ndarray, r: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Where the kernel is off the oracle by more than the bound; a non-finite oracle value is matched
    exactly (NaN for NaN, the same infinity)."""
    from flashcheck.properties.rowwise import violations

    return violations(np.asarray(got, dtype=np.float64), r, b)


def worst(got: np.ndarray, r: np.ndarray, b: np.ndarray, bad: np.ndarray) -> tuple[int, ...]:
    from flashcheck.properties.rowwise import excess

    score = np.where(bad, excess(np.asarray(got, dtype=np.float64), r, b), -np.inf)
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(score)), score.shape)) if score.ndim else ()


def value_line(label: str, idx: tuple[int, ...], got: float, r: float, b: float) -> str:
    diff = abs(got - r) if math.isfinite(got - r) else math.inf
    ratio = f" ({diff / b:.3g}x)" if b > 0 and math.isfinite(diff) else " (exact: a special value)" if b == 0 else ""
    at = f" at {list(idx)}" if idx else ""
    return f"  worst{at}: {label}={got!r} oracle={r!r} |diff|={diff:.3g} bound={b:.3g}{ratio}"


def describe(o: Outcome, what: str, count: int, of: int, lines: list[str], row: int | None = None,
             col: int | None = None) -> str:
    """The failure: the kernel, dtype, what, the case's tensors and options, the worst element's line(s),
    and the row it sits in."""
    spec, case = o.spec, o.case
    opts = {k: v for k, v in case.kwargs.items()}
    out = [f"{spec.name} [{o.fmt.name}] {what}: {count} of {of}", f"  {where(case)}", f"  options {opts}", *lines]
    if row is not None:
        x = to_float64(case.tensors["logits"])
        t = int(case.tensors["target"][row])
        out.append(f"  logits row {row} (target {t}): {compact(x[row], col if col is not None else max(t, 0))}")
        if o.grad is not None and col is not None:
            out.append(f"  grad row {row}: {compact(to_float64(o.grad)[row], col)}")
            out.append(f"  oracle row {row}: {compact(o.grad_oracle()[row], col)}")
    return "\n".join(out)

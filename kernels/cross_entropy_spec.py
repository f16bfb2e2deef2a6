"""The cross-entropy family's spec type: the options a cross-entropy kernel declares."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .registry import KernelSpec, _hooked, family_spec
from .softmax_spec import _takes

#: What a kernel takes as reduction=, torch's default first.
REDUCTIONS = ("mean", "sum", "none")
#: Optional features a kernel may lack; field names match an external kernel's `flashcheck` dict, and the
#: strategies' `needs` (strategies/cross_entropy.py) name these.
CE_FEATURES = ("weight", "label_smoothing", "z_loss", "softcap", "ignore_index", "inplace_backward")


@family_spec("cross_entropy")
@dataclass(frozen=True, repr=False)
class CrossEntropySpec(KernelSpec):
    """fn(logits, target, *, ignore_index=-100, label_smoothing=0.0, reduction="mean", weight=None,
    z_loss=0.0, softcap=None) -> loss, torch's semantics (docs/NUMERICS.md 9.1); its gradient through
    autograd when the loss carries a grad_fn, else through `with_grad`. The defaults claim every
    feature, so an undeclared limit fails instead of hiding.

    ignore_index: it takes ignore_index= (without it, targets of -100, torch's default, are still
        ignored). inplace_backward: it takes inplace_backward=True and then writes the gradient into
        the logits' storage. with_grad: fn(logits, target, grad_output, **options) -> (loss, grad).
    depth(n): the summation depth of its row sums over a vocabulary of n (None: n).
    """

    weight: bool = True
    label_smoothing: bool = True
    z_loss: bool = True
    softcap: bool = True
    ignore_index: bool = True
    inplace_backward: bool = True
    reductions: tuple[str, ...] = REDUCTIONS
    with_grad: Callable[..., Any] | None = None
    depth: Callable[[int], int] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "with_grad", _hooked(self.with_grad, f"{self.name} (with_grad)"))
        reductions = (self.reductions,) if isinstance(self.reductions, str) else tuple(self.reductions)
        if not reductions or any(r not in REDUCTIONS for r in reductions):
            raise ValueError(f"reductions must name some of {REDUCTIONS}, got {self.reductions!r}")
        object.__setattr__(self, "reductions", reductions)

    def has(self, feature: str) -> bool:
        """Whether this kernel declares `feature` (one of CE_FEATURES)."""
        if feature not in CE_FEATURES:
            raise KeyError(f"unknown cross-entropy feature {feature!r}; known: {CE_FEATURES}")
        return bool(getattr(self, feature))

    def features(self) -> frozenset[str]:
        return frozenset(f for f in CE_FEATURES if self.has(f))

    def summation_depth(self, n: int, **launch: Any) -> int:
        if self.depth is None:
            return n
        return self.depth(n, **launch) if launch and _takes(self.depth, launch) else self.depth(n)

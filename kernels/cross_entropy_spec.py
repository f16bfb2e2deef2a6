"""The cross-entropy family's spec type: the options a cross-entropy kernel declares."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from .registry import KernelSpec, _hooked, family_spec

#: What a kernel takes as reduction=, torch's default first.
REDUCTIONS = ("mean", "sum", "none")
#: Optional features a kernel may lack; field names match an external kernel's `flashcheck` dict, and the
#: strategies' `needs` (strategies/cross_entropy.py) name these.
CE_FEATURES = ("weight", "label_smoothing", "z_loss", "softcap", "ignore_index", "inplace_backward")
ARITHMETIC = ("natural", "fused")


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
    block_v: its vocabulary chunk, the bound's blocking (ceil(V / block_v) chunks); None: the worst
        case, one column a chunk. arithmetic: "natural" (lse formed in fp32, NUMERICS 9.4's kernel) or
        "fused" (m - x_t exact, the exponent from x - m, float64 rows and reductions: 9.7's); the bound
        (oracles/cross_entropy_bound.py) follows it.
    """

    weight: bool = True
    label_smoothing: bool = True
    z_loss: bool = True
    softcap: bool = True
    ignore_index: bool = True
    inplace_backward: bool = True
    reductions: tuple[str, ...] = REDUCTIONS
    with_grad: Callable[..., Any] | None = None
    block_v: int | None = None
    arithmetic: str = "natural"

    def __post_init__(self) -> None:
        super().__post_init__()
        object.__setattr__(self, "with_grad", _hooked(self.with_grad, f"{self.name} (with_grad)"))
        reductions = (self.reductions,) if isinstance(self.reductions, str) else tuple(self.reductions)
        if not reductions or any(r not in REDUCTIONS for r in reductions):
            raise ValueError(f"reductions must name some of {REDUCTIONS}, got {self.reductions!r}")
        object.__setattr__(self, "reductions", reductions)
        if self.arithmetic not in ARITHMETIC:
            raise ValueError(f"arithmetic must be one of {ARITHMETIC}, got {self.arithmetic!r}")

    def has(self, feature: str) -> bool:
        """Whether this kernel declares `feature` (one of CE_FEATURES)."""
        if feature not in CE_FEATURES:
            raise KeyError(f"unknown cross-entropy feature {feature!r}; known: {CE_FEATURES}")
        return bool(getattr(self, feature))

    def features(self) -> frozenset[str]:
        return frozenset(f for f in CE_FEATURES if self.has(f))

    def blocking(self, v: int) -> tuple[int, int]:
        """(chunks, columns a chunk) of a row of v classes: the bound's model of its sums."""
        if self.block_v is None:
            return max(v, 1), 1
        return max(1, -(-v // self.block_v)), self.block_v

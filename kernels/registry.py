"""One spec object per kernel, one registry; tests and reports parametrize over it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

FAMILIES = ("softmax", "attention")
ALL_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class KernelSpec:
    """What the suite needs to know about a kernel under test.

    fn: softmax family `fn(x) -> y` (x 2-D, y its softmax over the last dim, same dtype);
        attention family `fn(q, k, v, *, causal=False, scale=None, kv_lens=None) -> o`.
    error_bound: the family's bound function, `oracles.bounds`; `depth(n)` feeds it the
        summation depth this kernel's reduction has for a row of n (None: the worst case).
    configs: launch configurations (kwargs for `fn`) that must all give identical bits.
    tunings: launch configurations that may reassociate the sum (so change the last bits):
        each must still meet the oracle bound.

    Declared capabilities (what an external kernel says it supports; the defaults claim
    everything, so an undeclared limit fails instead of hiding). They only narrow what the
    strategies draw and which tests run; `flashcheck.external.CAPABILITIES` documents each.
    """

    name: str
    family: str
    fn: Callable[..., torch.Tensor]
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES
    max_n: int | None = None
    min_n: int = 1
    depth: Callable[[int], int] | None = None
    configs: tuple[dict[str, Any], ...] = ()
    tunings: tuple[dict[str, Any], ...] = ()
    max_head_dim: int = 256
    sizes: tuple[int, ...] = ()
    validates_input: bool | str = "typed"  # "typed": TypeError/ValueError as ours; True: any exception
    contiguous_only: bool = False
    takes_out: bool | None = None  # None: decided from fn's signature
    shift_exact: bool = True
    # attention
    head_dims: Callable[[int], bool] | None = None
    square_only: bool = False
    causal: bool = True
    causal_align: tuple[str, ...] = ("top_left",)
    kv_lens: bool = True
    custom_scale: bool = True
    row_sum: str = "rounded_p"
    empty_row_lse: float = float("-inf")
    block_n: int | None = None
    external: bool = False
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, not {self.family!r}")

    def supports(self, dtype: torch.dtype, n: int | None = None) -> bool:
        if dtype not in self.dtypes:
            return False
        if n is None:
            return True
        return n >= self.min_n and (self.max_n is None or n <= self.max_n)

    def supports_head_dim(self, d: int) -> bool:
        return d <= self.max_head_dim and (self.head_dims is None or bool(self.head_dims(d)))

    def summation_depth(self, n: int) -> int:
        """Depth of the sum's rounding chain for a row of n (n, recursive summation, if unknown)."""
        return n if self.depth is None else self.depth(n)

    def __repr__(self) -> str:  # short ids in pytest output
        return f"KernelSpec({self.name})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # Hypothesis's falsifying-example printer
        p.text(repr(self))


REGISTRY: list[KernelSpec] = []
#: Every production kernel ever registered; REGISTRY is what this run checks (an external
#: kernel replaces it).
PRODUCTION: list[KernelSpec] = []


def register(spec: KernelSpec) -> KernelSpec:
    if any(s.name == spec.name for s in REGISTRY):
        raise ValueError(f"a kernel named {spec.name!r} is already registered")
    REGISTRY.append(spec)
    if not spec.external:
        PRODUCTION.append(spec)
    return spec


def kernels(family: str | None = None) -> list[KernelSpec]:
    return [s for s in REGISTRY if family is None or s.family == family]


def get(name: str) -> KernelSpec:
    for s in REGISTRY:
        if s.name == name:
            return s
    raise KeyError(f"no kernel named {name!r}; registered: {[s.name for s in REGISTRY]}")

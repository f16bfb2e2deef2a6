"""One spec object per kernel, one registry; tests and reports parametrize over it."""
from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

FAMILIES = ("softmax", "attention")
# Attention features a kernel may lack (NUMERICS.md section 1); strategies never draw an
# undeclared one. Field names match an external kernel's `flashcheck` capability dict.
ATTENTION_FEATURES = ("gqa", "dv", "window", "softcap", "varlen", "lse", "attn_mask", "splits", "causal", "kv_lens")
CAUSAL_ALIGNS = ("top_left", "bottom_right")
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
    head_dims: Callable[[int], bool] | None = None  # head dims it takes (None: 1 .. max_head_dim)
    square_only: bool = False  # M = N only
    custom_scale: bool = True  # scale=
    row_sum: str = "rounded_p"  # "rounded_p": V of ones exact; "fp32_p": within 1 ulp
    block_n: int | None = None  # its key block (the bound's blocking), when declared
    # (keys per block, key blocks a row goes through) of its launch for (head_dim, n, dtype) and
    # the call's keyword options, when it knows its own (the production kernel's table); see
    # key_blocking
    blocking: Callable[[int, int, torch.dtype, Mapping[str, Any]], tuple[int, int]] | None = None
    bitwise_invariant: bool = True  # same bits for any layout / query order (not in the contract)
    external: bool = False
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # ---- attention capabilities (ignored by the softmax family); defaults: everything ----
    gqa: bool = True  # Hq a multiple of Hkv, head h reads kv head h // (Hq // Hkv)
    dv: bool = True  # v's head dim may differ from q/k's
    window: bool = True  # window=(left, right)
    softcap: bool = True  # softcap=c
    varlen: bool = True  # a packed entry point: `varlen_fn` (below)
    lse: bool = True  # return_lse=True gives (o, lse)
    attn_mask: bool = True  # attn_mask= bool or float bias, broadcastable to (B, Hq, M, N)
    splits: bool = True  # num_splits=
    causal: bool = True  # causal=
    kv_lens: bool = True  # kv_lens=
    causal_align: tuple[str, ...] = CAUSAL_ALIGNS  # alignments accepted as causal_align=
    lse_empty: float = float("-inf")  # lse of a row with no visible key (FlashAttention 2: +inf)
    varlen_fn: Callable[..., Any] | None = None  # fn(q, k, v, cu_q, cu_k, *, max_seqlen_q, max_seqlen_k, ...)

    def __post_init__(self) -> None:
        # Every call of the kernel, whoever makes it, goes through the engine's call hook.
        object.__setattr__(self, "fn", _hooked(self.fn, self.name))
        object.__setattr__(self, "varlen_fn", _hooked(self.varlen_fn, f"{self.name} (varlen)"))
        if self.family not in FAMILIES:
            raise ValueError(f"family must be one of {FAMILIES}, not {self.family!r}")
        aligns = (self.causal_align,) if isinstance(self.causal_align, str) else tuple(self.causal_align)
        if not aligns or any(a not in CAUSAL_ALIGNS for a in aligns):
            raise ValueError(f"causal_align must name some of {CAUSAL_ALIGNS}, got {self.causal_align!r}")
        object.__setattr__(self, "causal_align", aligns)
        lse_empty = float(self.lse_empty)
        if lse_empty not in (float("inf"), float("-inf")):
            raise ValueError(f"lse_empty must be -inf or +inf, got {self.lse_empty!r}")
        object.__setattr__(self, "lse_empty", lse_empty)

    def has(self, feature: str) -> bool:
        """Whether this attention kernel declares `feature` (one of ATTENTION_FEATURES)."""
        if feature not in ATTENTION_FEATURES:
            raise KeyError(f"unknown attention feature {feature!r}; known: {ATTENTION_FEATURES}")
        if feature == "varlen":
            return self.varlen and self.varlen_fn is not None
        return bool(getattr(self, feature))

    def features(self) -> frozenset[str]:
        return frozenset(f for f in ATTENTION_FEATURES if self.has(f))

    def supports(self, dtype: torch.dtype, n: int | None = None) -> bool:
        if dtype not in self.dtypes:
            return False
        if n is None:
            return True
        return n >= self.min_n and (self.max_n is None or n <= self.max_n)

    def supports_head_dim(self, d: int) -> bool:
        return d <= self.max_head_dim and (self.head_dims is None or bool(self.head_dims(d)))

    def key_blocking(self, head_dim: int, n: int, dtype: torch.dtype,
                     options: Mapping[str, Any] | None = None) -> tuple[int, int]:
        """(keys per block, key blocks) the attention bound needs for n keys and the call's keyword
        options (causal, window, attn_mask, ...): the kernel's own (`blocking`), else its declared
        `block_n`, else the worst case: one dot over every key and a rescale per key."""
        if self.blocking is not None:
            return self.blocking(head_dim, n, dtype, options or {})
        if self.block_n:
            return self.block_n, max(1, -(-n // self.block_n))
        return max(n, 1), max(n, 1)

    def summation_depth(self, n: int, **launch: Any) -> int:
        """Depth of the sum's rounding chain for a row of n (n, recursive summation, if unknown),
        at the default launch or at `launch` (one of `tunings`: chunk sizes change the depth)."""
        if self.depth is None:
            return n
        return self.depth(n, **launch) if launch and _takes(self.depth, launch) else self.depth(n)

    def __repr__(self) -> str:  # short ids in pytest output
        return f"KernelSpec({self.name})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # Hypothesis's falsifying-example printer
        p.text(repr(self))


def _takes(fn: Callable, kwargs: dict[str, Any]) -> bool:
    """Whether fn accepts these keywords (an author's depth callable may take n alone)."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    names = {p.name for p in params if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}
    return any(p.kind == p.VAR_KEYWORD for p in params) or set(kwargs) <= names


#: (fn, name, args, kwargs) -> fn's result: what every call of a spec's kernel goes through. The
#: engine sets it (`flashcheck.kernel_hooks.attach`: the GPU-fault guard) so kernels never import
#: the engine; unset, a call is a plain call.
_CALL_HOOK: list[Callable[..., Any]] = []


def set_call_hook(hook: Callable[..., Any]) -> None:
    """Route every spec's kernel call, registered before or after, through hook(fn, name, args, kwargs)."""
    _CALL_HOOK[:] = [hook]


def _hooked(fn: Callable[..., Any] | None, name: str) -> Callable[..., Any] | None:
    if fn is None or getattr(fn, "_flashcheck_hooked", False):
        return fn

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        if _CALL_HOOK:
            return _CALL_HOOK[0](fn, name, args, kwargs)
        return fn(*args, **kwargs)

    call._flashcheck_hooked = True  # type: ignore[attr-defined]
    return call


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

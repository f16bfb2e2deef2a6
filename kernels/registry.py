"""One spec object per kernel, one registry; tests and reports parametrize over it.

The base spec and the registry live here; a family's spec type lives beside its kernels
(`softmax_spec.py`, `attention_spec.py`) and registers itself with `family_spec`."""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

ALL_DTYPES: tuple[torch.dtype, ...] = (torch.float16, torch.bfloat16, torch.float32)

#: family name -> the spec type of its kernels (`family_spec`): KernelSpec for a family that declares
#: nothing of its own, a subclass adding the family's capabilities as fields (softmax_spec.py,
#: attention_spec.py). A spec's family must be one of these.
SPEC_TYPES: dict[str, type[KernelSpec]] = {}


def family_spec(family: str) -> Callable[[type], type]:
    """Register `cls` as the spec type of `family`'s kernels (a class decorator)."""

    def deco(cls: type) -> type:
        if family in SPEC_TYPES and SPEC_TYPES[family] is not cls:
            raise ValueError(f"family {family!r} already has spec type {SPEC_TYPES[family].__name__}")
        SPEC_TYPES[family] = cls
        return cls

    return deco


def families() -> tuple[str, ...]:
    return tuple(SPEC_TYPES)


@dataclass(frozen=True)
class KernelSpec:
    """What the suite needs to know about a kernel under test: the fields every family has.

    A family's own capabilities are fields of its spec type (`SPEC_TYPES`): `KernelSpec(family=F, ...)`
    builds F's type, so a spec names only fields its family has (an attention field on a softmax
    kernel is a TypeError naming it).

    fn: the kernel; what it takes and returns is the family's (`flashcheck.families`).
    configs: launch configurations (kwargs for `fn`) that must all give identical bits.
    tunings: launch configurations that may reassociate sums (so change the last bits): each must
        still meet the oracle bound.

    Declared capabilities (what an external kernel says it supports; the defaults claim
    everything, so an undeclared limit fails instead of hiding). They only narrow what the
    strategies draw and which tests run; `flashcheck.targets.external.CAPABILITIES` documents each.
    """

    name: str
    family: str
    fn: Callable[..., Any]
    dtypes: tuple[torch.dtype, ...] = ALL_DTYPES
    max_n: int | None = None
    min_n: int = 1
    configs: tuple[dict[str, Any], ...] = ()
    tunings: tuple[dict[str, Any], ...] = ()
    sizes: tuple[int, ...] = ()
    validates_input: bool | str = "typed"  # "typed": TypeError/ValueError as ours; True: any exception
    contiguous_only: bool = False
    bitwise_invariant: bool = True  # same bits for any layout / query order (not in the contract)
    external: bool = False
    description: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def __new__(cls, *args: Any, **kwargs: Any) -> KernelSpec:
        # KernelSpec(family=F, ...) is F's spec type: an author's file exporting a KernelSpec need
        # not know the subclasses; dataclasses.replace and copies call the subclass itself.
        if cls is KernelSpec:
            cls = SPEC_TYPES.get(kwargs.get("family", args[1] if len(args) > 1 else None), KernelSpec)
        return object.__new__(cls)

    def __post_init__(self) -> None:
        # Every call of the kernel, whoever makes it, goes through the engine's call hook.
        object.__setattr__(self, "fn", _hooked(self.fn, self.name))
        if self.family not in SPEC_TYPES:
            raise ValueError(f"family must be one of {families()}, not {self.family!r}")
        if not isinstance(self, SPEC_TYPES[self.family]):
            raise TypeError(f"a {self.family} kernel's spec is a {SPEC_TYPES[self.family].__name__}, "
                            f"not a {type(self).__name__}")

    def supports(self, dtype: torch.dtype, n: int | None = None) -> bool:
        if dtype not in self.dtypes:
            return False
        if n is None:
            return True
        return n >= self.min_n and (self.max_n is None or n <= self.max_n)

    def __repr__(self) -> str:  # short ids in pytest output
        return f"KernelSpec({self.name})"

    def _repr_pretty_(self, p: Any, cycle: bool) -> None:  # Hypothesis's falsifying-example printer
        p.text(repr(self))


#: (fn, name, args, kwargs) -> fn's result: what every call of a spec's kernel goes through. The
#: engine sets it (`flashcheck.isolation.hooks`: the GPU-fault guard) so kernels never import
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

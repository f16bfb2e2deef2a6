"""One declarative record per kernel family, and the one registry of them (issue 22 item 4).

A `Family` names where each of its parts lives; the engine, the plugin, the command line and the
reports read these records instead of keeping their own family lists or if/else chains over
family names. Adding a family is one more line in `FAMILY_RECORDS` (README "Adding a family").

The record holds module names, not modules: this file imports nothing heavy (no torch), so the
command line and `flashcheck/__init__.py` can read the family names cheaply, and a record may name
a module of a higher layer (its report) without the engine importing it: only `reports/` resolves
`report` (tests/test_layers.py keeps the engine off reports/).

What the kernel layer keeps (it may not import the engine, and this file is the engine's): each
family's spec type (`kernels.registry.SPEC_TYPES`, registered by `family_spec` beside the family's
kernels), against which `KernelSpec.family` is validated; tests/test_families.py checks that the
two lists of names agree.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, Callable

from flashcheck import SUITE

if TYPE_CHECKING:
    from flashcheck.kernels.registry import KernelSpec
    from flashcheck.strategies.case import Case


@dataclass(frozen=True)
class Family:
    name: str
    #: strategies module: `CLASS_RECORDS` (strategies/records.py StrategyClass rows) and `CLASSES`
    strategies: str
    #: properties module: registers the family's properties (`flashcheck.families.prop`) on import
    properties: str
    #: names of the property-name tuples in `properties` (the sets the suite checks together)
    property_sets: tuple[str, ...]
    #: "module:function" of the correctly rounded reference, and of the bound the kernel must meet
    oracle: str
    bound: str
    #: the input tensor whose length a size limit names ("x" or "k"), and the axis of that length
    length_input: str
    length_axis: int = -1
    #: the family's stability-report module (reports/stability/), resolved by the report layer only; None:
    #: no report (`flashcheck report` does not offer the family)
    report: str | None = None
    #: the folder holding its suite modules (`test_<name>*.py`); None: flashcheck/suite/
    suite_dir: str | None = None

    def module(self, part: str) -> ModuleType:
        """Import one of the record's modules: "strategies", "properties" or "report"."""
        name = getattr(self, part)
        if name is None:
            raise KeyError(f"family {self.name} has no {part} module")
        return importlib.import_module(name)

    def hook(self, name: str) -> Callable[..., Any]:
        """What the engine asks a family, from its properties module, or the default when the family
        has nothing of its own to say (`HOOKS`: every name and its default)."""
        return getattr(self.module("properties"), name, None) or HOOKS[name]

    def function(self, part: str) -> Callable[..., Any]:
        """Resolve "oracle" or "bound" ("module:function") to the function."""
        mod, _, fn = getattr(self, part).partition(":")
        return getattr(importlib.import_module(mod), fn)

    def strategy_classes(self) -> tuple[Any, ...]:
        return tuple(self.module("strategies").CLASS_RECORDS)

    def property_names(self) -> tuple[str, ...]:
        """Every property in the family's sets, in order, once each."""
        mod = self.module("properties")
        return tuple(dict.fromkeys(n for s in self.property_sets for n in getattr(mod, s)))

    def suite_files(self) -> list[str]:
        """Its suite modules, `test_<name>.py` and `test_<name>_*.py`, less those of a family whose
        longer name they start with (test_softmax_backward.py is softmax_backward's, not softmax's)."""
        folder = Path(self.suite_dir) if self.suite_dir else SUITE
        longer = [f"test_{n}" for n in FAMILY_RECORDS if n != self.name and n.startswith(self.name)]
        return sorted(str(p) for p in folder.glob(f"test_{self.name}*.py")
                      if not any(p.stem == n or p.stem.startswith(n + "_") for n in longer))


#: What the engine asks a family's properties module besides its properties, each with the default
#: a family without one gets:
#: - `kernel_call(spec, tensors) -> (entry point, positional, keyword tensors, constant keywords)`: how
#:   its properties call the kernel, for a fixture's replay and repro (default: `fn` on every tensor,
#:   in order);
#: - `fit_to_declarations(spec, case) -> case | None`: the case as the kernel's declarations allow it
#:   (default: every case);
#: - `refusable(case) -> {capability key: what}`: the optional features a case uses, so a clean
#:   refusal of an undeclared one is a skip (default: none);
#: - `limit_sizes(tensors)`: sizes a limit message names besides n and the element count;
#:   `resource_declaration(size, resource, declare)`: the declaration that skips an input past a
#:   resource limit; `feature_hint(spec, tensors, size, flag)`: the features an input that raised
#:   used; `capability_notes(spec) -> (declared limits, tests not run)`: the run header's notes.
HOOKS: dict[str, Callable[..., Any]] = {
    "kernel_call": lambda spec, tensors: ("fn", list(tensors), [], {}),
    "fit_to_declarations": lambda spec, case: case,
    "refusable": lambda case: {},
    "limit_sizes": lambda tensors: {},
    "resource_declaration": lambda size, resource, declare: None,
    "feature_hint": lambda spec, tensors, size, flag: None,
    "capability_notes": lambda spec: ([], []),
}


FAMILY_RECORDS: dict[str, Family] = {f.name: f for f in (
    Family("softmax", strategies="flashcheck.strategies.softmax", properties="flashcheck.properties.softmax",
           property_sets=("CORE_PROPERTIES", "META_PROPERTIES"), report="flashcheck.reports.stability.softmax",
           oracle="flashcheck.oracles.softmax:softmax_oracle", bound="flashcheck.oracles.bounds:softmax_ulp_bound",
           length_input="x", length_axis=-1),
    Family("attention", strategies="flashcheck.strategies.attention", properties="flashcheck.properties.attention",
           property_sets=("CORE_PROPERTIES", "METAMORPHIC_PROPERTIES", "VARLEN_PROPERTIES", "BACKWARD_PROPERTIES"),
           report="flashcheck.reports.stability.attention", oracle="flashcheck.oracles.attention:attention_oracle",
           bound="flashcheck.oracles.bounds:attention_error_bound", length_input="k", length_axis=-2),
    Family("softmax_backward", strategies="flashcheck.strategies.softmax_backward",
           properties="flashcheck.properties.softmax_backward", property_sets=("CORE_PROPERTIES", "META_PROPERTIES"),
           oracle="flashcheck.oracles.log_softmax:softmax_backward_oracle",
           bound="flashcheck.oracles.log_softmax:softmax_backward_bound", length_input="y"),
    Family("log_softmax", strategies="flashcheck.strategies.log_softmax", properties="flashcheck.properties.log_softmax",
           property_sets=("CORE_PROPERTIES", "META_PROPERTIES"), oracle="flashcheck.oracles.log_softmax:log_softmax_oracle",
           bound="flashcheck.oracles.log_softmax:log_softmax_bound", length_input="x"),
    Family("log_softmax_backward", strategies="flashcheck.strategies.log_softmax_backward",
           properties="flashcheck.properties.log_softmax_backward", property_sets=("CORE_PROPERTIES", "META_PROPERTIES"),
           oracle="flashcheck.oracles.log_softmax:log_softmax_backward_oracle",
           bound="flashcheck.oracles.log_softmax:log_softmax_backward_bound", length_input="logp"),
    Family("cross_entropy", strategies="flashcheck.strategies.cross_entropy",
           properties="flashcheck.properties.cross_entropy", property_sets=("CORE_PROPERTIES", "META_PROPERTIES"),
           oracle="flashcheck.oracles.cross_entropy:cross_entropy_oracle",
           bound="flashcheck.oracles.cross_entropy_bound:cross_entropy_full_loss_bound", length_input="logits"),
)}


def names() -> tuple[str, ...]:
    """The registered families' names, in registry order (read at call time: a family registered
    after import, as tests/test_families.py does, is seen)."""
    return tuple(FAMILY_RECORDS)


def get(name: str) -> Family:
    try:
        return FAMILY_RECORDS[name]
    except KeyError:
        raise KeyError(f"no family {name!r}; registered: {', '.join(FAMILY_RECORDS)}") from None


def suite_paths(family: str | None = None) -> list[str]:
    """The suite's test files for a family (every family when None), replays included."""
    records = [get(family)] if family else list(FAMILY_RECORDS.values())
    files = sorted({p for f in records for p in f.suite_files()})
    return files + [str(SUITE / "test_regressions.py")]


# ---- the properties each family registers ---------------------------------------------------------
# Here, below everything that reads them (fixtures name a property; the runner runs it): a property
# module registers itself on import (`load_properties`).

Property = Callable[["KernelSpec", "Case"], None]
PROPERTIES: dict[tuple[str, str], Property] = {}


def prop(family: str, name: str) -> Callable[[Property], Property]:
    """Register a property of a family under a stable name (fixtures refer to it)."""

    def deco(fn: Property) -> Property:
        key = (family, name)
        if key in PROPERTIES and PROPERTIES[key] is not fn:
            raise ValueError(f"property {family}/{name} registered twice")
        PROPERTIES[key] = fn
        return fn

    return deco


Margin = Callable[["KernelSpec", "Case"], float]
# (family, property) -> the worst measured error over its bound on a case (after the property ran)
MARGINS: dict[tuple[str, str], Margin] = {}


def margin(family: str, name: str) -> Callable[[Margin], Margin]:
    """Register how to read the worst err/bound of property `name` on a case: `check` feeds it to
    `hypothesis.target`, so a search (the soak profile) climbs towards the edge of the bound."""

    def deco(fn: Margin) -> Margin:
        MARGINS[(family, name)] = fn
        return fn

    return deco




def load_properties() -> None:
    """Import every family's properties (they register themselves with `prop`)."""
    import importlib

    for module in (f.properties for f in FAMILY_RECORDS.values()):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise

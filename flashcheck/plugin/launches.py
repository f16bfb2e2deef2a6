"""Launch relations, one test item per launch variant.

`deterministic`, `configs_identical` (each of `spec.configs` gives the default launch's bits) and
`tunings_within_bound` (each of `spec.tunings` meets the oracle's bound) are relations between
launches of one kernel. On a GPU every launch variant is a compilation per drawn shape, so one test
checking every variant compiled them all in one xdist worker (`softmax_row`'s three tunings: 371 s
for fp32 on an H100, and fp16/bf16 past a device call's 10 minutes). The plugin parametrizes a test
that takes the `launch` fixture with one `Launch` per variant, so the compilations spread over the
workers; each item still draws the profile's examples. A kernel with no configs (or tunings) gets
no such item, rather than one that passes without checking anything.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from flashcheck.kernels.registry import KernelSpec

#: relation -> the KernelSpec field listing its launch variants
LAUNCH_FIELDS = {"configs_identical": "configs", "tunings_within_bound": "tunings"}
RELATIONS = ("deterministic", *LAUNCH_FIELDS)


@dataclass(frozen=True)
class Launch:
    relation: str
    index: int | None = None  # into the spec's field; None: the relation has no variants
    cfg: tuple[tuple[str, Any], ...] = ()

    @property
    def id(self) -> str:
        return self.relation if self.index is None else self.relation + "-" + ",".join(f"{k}={v}" for k, v in self.cfg)

    def spec_for(self, spec: KernelSpec) -> KernelSpec:
        """`spec` with its field narrowed to this one variant (the relation checks every listed one)."""
        if self.index is None:
            return spec
        field = LAUNCH_FIELDS[self.relation]
        return dataclasses.replace(spec, **{field: (getattr(spec, field)[self.index],)})


def launches(spec: KernelSpec) -> list[Launch]:
    out = [Launch("deterministic")]
    for relation, field in LAUNCH_FIELDS.items():
        out += [Launch(relation, i, tuple(sorted(cfg.items()))) for i, cfg in enumerate(getattr(spec, field))]
    return out

"""One known-bad kernel of the zoo: the broken function, its fixed twin, its bug class and trigger."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class ZooKernel:
    name: str
    family: str  # a family's name (flashcheck/families.py)
    bug_class: str  # the row of NUMERICS.md section 6 (9.7 for the training families)
    references: str
    broken: Callable[..., torch.Tensor]
    fixed: Callable[..., torch.Tensor]
    # an input the bug gets wrong: kwargs for the kernel (softmax, attention), or a Case whose
    # `property_hint` properties fail on the broken kernel and pass on the fixed one (training families)
    trigger: Callable[[], Any]
    caps: dict[str, Any] = field(default_factory=dict)  # the `flashcheck` capabilities
    property_hint: str = ""  # which property is expected to see it (training families: checked on the trigger)
    gpu_only: str = ""  # why only a GPU can show the bug (empty: the interpreter can)
    # Tests (node-id prefixes) written to catch a GPU-only entry, run alone before the whole suite
    # where the tracked (CPU) kill matrix records no catching test.
    targets: tuple[str, ...] = ()
    module: str = ""  # the zoo module (flashcheck/suite/zoo/MODULE.py); empty: <family>_bugs
    backward: bool = False  # the forward is correct, the backward is not (its trigger carries "do")

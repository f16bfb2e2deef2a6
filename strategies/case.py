"""The unit the strategies produce and the fixtures store: one input to one kernel."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class Case:
    """Named tensors (views, any strides), JSON-able kwargs for the kernel, and a label naming
    the adversarial class that produced it."""

    tensors: dict[str, torch.Tensor]
    kwargs: dict[str, Any] = field(default_factory=dict)
    label: str = ""

    def __repr__(self) -> str:
        parts = [f"{k}: {tuple(t.shape)} {t.dtype} stride={t.stride()} offset={t.storage_offset()}"
                 for k, t in self.tensors.items()]
        return f"Case({self.label}; {'; '.join(parts)}; kwargs={self.kwargs})"

"""The log_softmax_backward family's adversarial classes: cases with "logp" (a correctly rounded
log-softmax) and "dy", the table of `strategies/cross_entropy.py` (docs/NUMERICS.md 9.5)."""
from __future__ import annotations

from .cross_entropy import (
    LOG_SOFTMAX_BACKWARD_CLASS_RECORDS as CLASS_RECORDS, LOG_SOFTMAX_BACKWARD_CLASSES as CLASSES,
)

__all__ = ["CLASS_RECORDS", "CLASSES"]

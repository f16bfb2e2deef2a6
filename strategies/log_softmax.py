"""The log_softmax family's adversarial classes: a softmax's inputs (tensor "x"), the softmax
tables themselves (`strategies/softmax.py`, docs/NUMERICS.md 4.1 and 9.5)."""
from __future__ import annotations

from .cross_entropy import LOG_SOFTMAX_CLASS_RECORDS as CLASS_RECORDS, LOG_SOFTMAX_CLASSES as CLASSES

__all__ = ["CLASS_RECORDS", "CLASSES"]

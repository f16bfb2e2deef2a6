"""Hypothesis strategies producing adversarial inputs, one named strategy per class."""
from .case import Case
from .floats import Layout, exact_floats, layouts, materialize, representable
from .softmax import CLASSES as SOFTMAX_CLASSES, row_lengths, softmax_cases

__all__ = ["Case", "Layout", "exact_floats", "layouts", "materialize", "representable", "SOFTMAX_CLASSES",
           "row_lengths", "softmax_cases"]

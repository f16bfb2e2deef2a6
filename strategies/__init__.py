"""Hypothesis strategies producing adversarial inputs, one named strategy per class."""
from .attention import CLASSES as ATTENTION_CLASSES, attention_cases, case_inputs
from .case import Case
from .floats import Layout, exact_floats, layouts, materialize, representable
from .softmax import CLASSES as SOFTMAX_CLASSES, row_lengths, softmax_cases

__all__ = ["ATTENTION_CLASSES", "attention_cases", "case_inputs", "Case", "Layout", "exact_floats", "layouts", "materialize", "representable", "SOFTMAX_CLASSES",
           "row_lengths", "softmax_cases"]

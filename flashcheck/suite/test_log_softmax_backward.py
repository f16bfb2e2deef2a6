"""Property tests for every registered log-softmax backward kernel, fn(logp, dy) -> dx, for every dtype
it supports (flashcheck/suite/rowwise.py): each adversarial class of docs/NUMERICS.md 9.5 against the
certified oracle within the derived bound, the row sums and the untouched inputs (one kernel call
serves them); NaN guard data on the union of the classes; the bad inputs a validating kernel refuses."""
from __future__ import annotations

from flashcheck.properties import log_softmax_backward as props
from flashcheck.properties.log_softmax_backward import FAMILY  # noqa: F401  (the suite this module is)
from flashcheck.strategies.log_softmax_backward import CLASSES
from .rowwise import row_tests

test_adversarial_class, test_metamorphic, test_bad_input_raises = row_tests(props, CLASSES)

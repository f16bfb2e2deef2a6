"""Property tests for every registered log-softmax kernel, fn(x) -> log_softmax(x), for every dtype it
supports (flashcheck/suite/rowwise.py): each softmax adversarial class (docs/NUMERICS.md 4.1) against
the certified oracle within the derived bound and the untouched input; shift invariance and NaN guard
data on rows of exact multiples shifted exactly (the softmax suite's `shift_cases`); the bad inputs a
validating kernel refuses."""
from __future__ import annotations

from flashcheck.properties import log_softmax as props
from flashcheck.properties.log_softmax import FAMILY  # noqa: F401  (the suite this module is)
from flashcheck.strategies.log_softmax import CLASSES
from .rowwise import row_tests
from .test_softmax_metamorphic import shift_cases

test_adversarial_class, test_metamorphic, test_bad_input_raises = row_tests(props, CLASSES, meta_cases=shift_cases)

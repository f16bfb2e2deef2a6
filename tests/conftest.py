"""The self-tests run under the shipped suite's setup (Hypothesis profiles, the flashcheck plugins,
the interpreter's warning filters): `flashcheck/suite/conftest.py`, so a run of `tests/` alone has it."""
from flashcheck.suite.conftest import pytest_configure, pytest_plugins  # noqa: F401

